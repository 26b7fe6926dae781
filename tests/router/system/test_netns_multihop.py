"""Multi-hop routing across network namespaces the tests create: every TRD
(an lbmrd on the loopback of its own namespace, 127.0.N.1) lives in namespace
N with its router, and the only paths between namespaces are veth pairs that
carry the routers' peer links. A receiver in one TRD can reach a source in
another only through the routers, hop by hop. Sources and receivers are
lbmr-sim processes; receivers verify every byte and datagram. Namespaces are
removed even when a test fails."""

from __future__ import annotations

import json
import sys
import time

from tests import netns
from tests.helpers import (
    LBMRD,
    ROUTER,
    SIM,
    acceptor_xml,
    endpoint_xml,
    initiator_xml,
    peer_xml,
    router_xml,
)

netns_factory = netns.netns_factory  # the fixture

PY = sys.executable
METRICS_PORT = 9392
PEER_PORT = 26200


def site_router_xml(d: int, peers: list[str]) -> str:
    """Router ``d`` of TRD ``d`` (domain id d, lbmrd at 127.0.d.1:15380), with
    ``peers`` (``<peer>`` elements) and its /status on 127.0.0.1:METRICS_PORT.
    Route info every 200 ms, routers forgotten after 1.5 s."""
    return router_xml(f"r{d}", [endpoint_xml(f"trd{d}", d, f"127.0.{d}.1", relay=(14371, 14470))], peers,
                      daemon=f"<metrics>127.0.0.1:{METRICS_PORT}</metrics>\n"
                             '    <route-info propagation-interval="200" timeout="1500"/>')


def peer(name: str, link_ip: str, role: str, cost: int = 1) -> str:
    """A peer portal: keepalives every 250 ms, the link given up after 1 s of silence."""
    return peer_xml(name, link_ip, role, cost=cost, keepalive=(250, 1000))


def initiator(address: str) -> str:
    return initiator_xml(address, PEER_PORT, reconnect_ms=300)


def acceptor() -> str:
    return acceptor_xml(PEER_PORT)


class Sites:
    """Namespaces 1..n, each with an lbmrd and (once configured) a router."""

    def __init__(self, factory, tmp_path, n: int) -> None:
        self.ns = {d: factory() for d in range(1, n + 1)}
        self.tmp = tmp_path
        self.logs: dict[str, object] = {}

    def log(self, key: str):
        f = self.logs[key] = open(self.tmp / f"{key}.log", "w")
        return f

    def start(self, peers: dict[int, list[str]]) -> None:
        for d, ns in self.ns.items():
            f = self.log(f"lbmrd{d}")
            ns.popen(LBMRD + ["-i", f"127.0.{d}.1", "--stats-interval", "0"], stdout=f, stderr=f)
        for d, ns in self.ns.items():
            cfg = self.tmp / f"r{d}.xml"
            cfg.write_text(site_router_xml(d, peers[d]))
            f = self.log(f"r{d}")
            ns.popen(ROUTER + [str(cfg)], stdout=f, stderr=f)

    def status(self, d: int) -> dict:
        code = ("import json, urllib.request; print(urllib.request.urlopen("
                f"'http://127.0.0.1:{METRICS_PORT}/status', timeout=2).read().decode())")
        r = self.ns[d].run([PY, "-c", code], timeout=10)
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def wait_routes(self, d: int, want: dict[int, list[str]], limit: float = 20.0) -> dict:
        """Until router ``d``'s routes to the domains of ``want`` take the paths
        given (router names); its topology status."""
        deadline = time.monotonic() + limit
        routes = {}
        while time.monotonic() < deadline:
            routes = {int(dom): r for dom, r in self.status(d).get("topology", {}).get("routes", {}).items()}
            if all(routes.get(dom, {}).get("path") == path for dom, path in want.items()):
                return routes
            time.sleep(0.2)
        raise AssertionError(f"router r{d}: routes {routes} not {want}\n{self.detail()}")

    def source(self, d: int, prefix: str, transport: str, extra: list[str]) -> None:
        f = self.log(f"src-{prefix}")
        self.ns[d].popen(SIM + ["--daemon", f"127.0.{d}.1:15380", "--bind-base", f"127.0.{d}.10",
                                "--contexts", "1", "--receivers-per-context", "0", "--topics", "1",
                                "--topic-prefix", prefix, "--transport", transport, "--duration", "90",
                                "--keep-running", "--json"] + extra, stdout=f, stderr=f)

    def receive(self, d: int, prefix: str, transport: str, extra: list[str], *, base: int = 10,
                duration: float = 40) -> dict:
        """A receiver context in TRD ``d`` (lbmr-sim, --verify-data); its report."""
        r = self.ns[d].run(SIM + ["--daemon", f"127.0.{d}.1:15380", "--bind-base", f"127.0.{d}.{base}",
                                  "--contexts", "1", "--sources-per-topic", "0", "--receivers-per-context",
                                  "1", "--topics", "1", "--topic-prefix", prefix, "--transport", transport,
                                  "--verify-data", "--duration", str(duration), "--json"] + extra,
                           timeout=duration + 30)
        assert r.returncode == 0, f"receiver sim failed:\n{r.stdout}\n{r.stderr}\n{self.detail()}"
        (rcv,) = json.loads(r.stdout)["receivers"]
        return rcv

    def detail(self) -> str:
        for f in self.logs.values():
            f.flush()
        return "\n".join(f"--- {k}\n" + (self.tmp / f"{k}.log").read_text()[-1500:] for k in self.logs)

    def close(self) -> None:
        for f in self.logs.values():
            f.close()


def test_chain_of_three_sites_carries_tcp_and_lbtru_byte_exact(netns_factory, tmp_path):
    """Chain r1 - r2 - r3: a receiver in TRD3 gets a TCP and an LBT-RU source of
    TRD1 through r3's proxies (two hops), every byte and datagram verified; TRD1
    and TRD3 share no link at all."""
    s = Sites(netns_factory, tmp_path, 3)
    n1, n2, n3 = s.ns[1], s.ns[2], s.ns[3]
    netns.veth(n1, "198.18.1.1/24", n2, "198.18.1.2/24")
    netns.veth(n2, "198.18.2.2/24", n3, "198.18.2.3/24")
    assert "unreachable" in n3.run(["ip", "route", "get", "198.18.1.1"]).stderr  # no way from 3 to 1
    try:
        s.start({1: [peer("1-2", "198.18.1.1", initiator("198.18.1.2"))],
                 2: [peer("2-1", "198.18.1.2", acceptor()), peer("2-3", "198.18.2.2", acceptor())],
                 3: [peer("3-2", "198.18.2.3", initiator("198.18.2.2"))]})
        s.wait_routes(3, {1: ["r3", "r2", "r1"], 2: ["r3", "r2"]})
        s.source(1, "md.chain.tcp.", "tcp", ["--data-bytes", "4M"])
        s.source(1, "md.chain.ru.", "lbtru", ["--data-datagrams", "3000"])
        # LBT-RU first: lbmr-sim's LBT-RU receiver does not NAK, so a datagram dropped at a full
        # link queue is a gap to it; the TCP session, lingering 1-2 s after its receiver left,
        # filled the links' queues now and then (a gap, 1 run in 12); TCP frames wait instead
        ru = s.receive(3, "md.chain.ru.", "lbtru", ["--data-datagrams", "3000"], base=20)
        assert ru["transport"].startswith("LBTRU 127.0.3.1:"), ru
        assert ru["data"]["ok"] and ru["data"]["datagrams"] == 3000, ru["data"]
        tcp = s.receive(3, "md.chain.tcp.", "tcp", ["--data-bytes", "4M"])
        assert tcp["resolved"] and tcp["transport"].startswith("TCP 127.0.3.1:"), tcp  # r3's proxy
        assert tcp["data"]["ok"] and tcp["data"]["bytes"] == 4 * 1024 * 1024, tcp["data"]
        # r2 carried both on: its own proxies in TRD2 were advertised onward to r3
        st2 = s.status(2)
        assert st2["topology"]["transit"]["adverts"] >= 2, st2["topology"]["transit"]
    finally:
        s.close()


def test_loop_of_three_sites_reroutes_when_the_cheapest_link_is_cut(netns_factory, tmp_path):
    """Loop r1 - r2 - r3 - r1, the r3 - r1 link dear (cost 5 at each end): TRD3's
    receivers reach TRD1 through r2. The r1 - r2 link is cut (its veth goes down:
    no FIN, no RST) while a stream runs; a new receiver resolves r3's new proxy
    over the direct link and gets all its data within the peer timeout plus the
    route timeout plus 1 s, and the old proxy is withdrawn."""
    s = Sites(netns_factory, tmp_path, 3)
    n1, n2, n3 = s.ns[1], s.ns[2], s.ns[3]
    cut, _ = netns.veth(n1, "198.18.1.1/24", n2, "198.18.1.2/24")
    netns.veth(n2, "198.18.2.2/24", n3, "198.18.2.3/24")
    netns.veth(n3, "198.18.3.3/24", n1, "198.18.3.1/24")
    try:
        s.start({1: [peer("1-2", "198.18.1.1", initiator("198.18.1.2")),
                     peer("1-3", "198.18.3.1", acceptor(), cost=5)],
                 2: [peer("2-1", "198.18.1.2", acceptor()), peer("2-3", "198.18.2.2", acceptor())],
                 3: [peer("3-2", "198.18.2.3", initiator("198.18.2.2")),
                     peer("3-1", "198.18.3.3", initiator("198.18.3.1"), cost=5)]})
        cheap = s.wait_routes(3, {1: ["r3", "r2", "r1"]})[1]["cost"]
        s.source(1, "md.loop.", "tcp", ["--data-bytes", "2M"])
        before = s.receive(3, "md.loop.", "tcp", ["--data-bytes", "2M"])
        assert before["transport"].startswith("TCP 127.0.3.1:") and before["data"]["ok"], before
        # a long stream runs through r2 while the link is cut
        f = s.log("long")
        long_rcv = n3.popen(SIM + ["--daemon", "127.0.3.1:15380", "--bind-base", "127.0.3.30",
                                   "--contexts", "1", "--sources-per-topic", "0", "--receivers-per-context",
                                   "1", "--topics", "1", "--topic-prefix", "md.loop.", "--verify-data",
                                   "--data-bytes", "2M", "--duration", "20", "--json"], stdout=f, stderr=f)
        time.sleep(0.3)
        n1.ip("link", "set", "dev", cut, "down")
        t_cut = time.monotonic()
        routes = s.wait_routes(3, {1: ["r3", "r1"]})
        assert routes[1]["cost"] > cheap, routes
        after = s.receive(3, "md.loop.", "tcp", ["--data-bytes", "2M"], base=40, duration=20)
        took = time.monotonic() - t_cut
        assert after["transport"].startswith("TCP 127.0.3.1:") and after["data"]["ok"], after
        assert after["transport"] != before["transport"], (before, after)  # a new proxy
        assert took < 1.0 + 1.5 + 1.0 + 3.0, took  # peer timeout + route timeout + 1 s (+ the sim's start)
        # r3 advertises only the new proxy in TRD3; r2's old one is gone
        st3 = s.status(3)
        proxies = [p for link in st3["links"] for p in link["proxies"].values()]
        assert proxies == [after["transport"].split()[1]], st3["links"]
        long_rcv.wait(30)
    finally:
        s.close()


def test_mesh_of_four_sites_resolves_each_topic_once_per_trd(netns_factory, tmp_path):
    """Full mesh of four sites (six links, equal costs): a source in TRD1, a
    receiver in each other TRD. Each receiver gets its data over the direct
    link, and each TRD hears one proxy of the topic: no router advertises it
    twice, though interest and advertisements could travel round the mesh."""
    s = Sites(netns_factory, tmp_path, 4)
    peers: dict[int, list[str]] = {d: [] for d in range(1, 5)}
    for i in range(1, 5):
        for j in range(i + 1, 5):
            net = f"198.18.{i}{j}"
            netns.veth(s.ns[i], f"{net}.{i}/24", s.ns[j], f"{net}.{j}/24")
            peers[i].append(peer(f"{i}-{j}", f"{net}.{i}", acceptor()))  # the lower one accepts
            peers[j].append(peer(f"{j}-{i}", f"{net}.{j}", initiator(f"{net}.{i}")))
    try:
        s.start(peers)
        for d in (2, 3, 4):
            s.wait_routes(d, {1: [f"r{d}", "r1"]})
        s.source(1, "md.mesh.", "tcp", ["--data-bytes", "1M"])
        for d in (2, 3, 4):
            rcv = s.receive(d, "md.mesh.", "tcp", ["--data-bytes", "1M"])
            assert rcv["transport"].startswith(f"TCP 127.0.{d}.1:") and rcv["data"]["ok"], rcv
        time.sleep(1.0)  # anything that went round the mesh would have arrived by now
        for d in (2, 3, 4):
            st = s.status(d)
            proxies = [p for link in st["links"] for p in link["proxies"].values()]
            assert len(proxies) == 1, (d, st["links"])
            transit = st["topology"]["transit"]
            assert transit["adverts"] == 0, (d, transit)  # nobody carries TRD1's source on
    finally:
        s.close()
