"""lbmr-sim in multicast mode: the sans-IO context with a group instead of daemons, the
command line, and real runs inside network namespaces (tests/netns.py) whose loopback
has multicast on. No multicast datagram is ever sent from the caller's namespace."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import lbmr_proto as L
from lbmr_proto.capture import read_udp
from lbmr_proto.popts import encode_packet_options
from lbmr_tools import sim
from lbmr_tools.sim import Context, SimConfig, parse_args
from tests import netns
from tests.netns import NetNS, veth

from .helpers import drive

ROOT = Path(__file__).resolve().parents[1]
GROUP = ("224.9.10.11", 12965)
OTHER = ("127.0.1.9", 12965)  # another context on the group
netns_factory = netns.netns_factory  # the fixture, for the tests below
SIM = [sys.executable, "-m", "lbmr_tools.sim"]
MC_PORT_HEX = f":{GROUP[1]:04X} "


def tir_datagram(topic: str, ip: str, port: int, src_id: bytes = b"\x99" * 8) -> bytes:
    return L.encode(L.Packet(0, 1, tirs=[L.TIR(topic, L.TcpTransport(ip, port))],
                             options=[L.SourceIdOption(0x8000, src_id)]))


def tqr_datagram(topic: str, src_id: bytes = b"\x99" * 8) -> bytes:
    return L.encode(L.Packet(0, 1, tqrs=[L.TQR(topic)], options=[L.SourceIdOption(0x8000, src_id)]))




def trailer(src_id: bytes) -> bytes:
    """The packet-options trailer lbmr-sim puts on every datagram of a context."""
    return encode_packet_options([L.SourceIdOption(0x8000, src_id), L.SourceTypeOption(0x80, 0),
                                  L.VersionOption(sim.VERSION_FLAGS, sim.UM_VERSION),
                                  L.LocalDomainOption(0x8000, 0)])


# ------------------------------------------------------------- sans-IO core


def test_multicast_context_sends_everything_to_the_group_and_never_keeps_alive():
    ctx = Context(multicast=GROUP)
    assert ctx.daemons == [] and ctx.destination(0.0) == GROUP
    ctx.add_source("md.0", L.TcpTransport("127.0.0.1", 14371))
    ctx.add_receiver("md.nobody")
    sent = drive(ctx, 200.0)
    assert len(sent) > 100
    assert {d.dest for _, d in sent} == {GROUP} and {d.kind for _, d in sent} == {"tr"}
    assert ctx.stats["keepalives_sent"] == 0
    assert ctx.next_deadline() == float("inf")  # both streams ended, nothing else is due
    with pytest.raises(ValueError):
        ctx.current_daemon(0.0)


def test_multicast_context_hears_anyone_but_itself_and_answers_on_the_group():
    ctx = Context(multicast=GROUP, src_id=b"\x01" * 8)
    ctx.add_source("md.0", L.TcpTransport("127.0.1.1", 14371))
    r = ctx.add_receiver("md.1")
    # not a daemon, yet accepted: there is no unknown-source filter on a group
    assert ctx.receive(tir_datagram("md.1", "127.0.1.9", 14372), 0.5, OTHER) == []
    assert r.resolved and r.transport == L.TcpTransport("127.0.1.9", 14372)
    (resp,) = ctx.receive(tqr_datagram("md.0"), 0.6, OTHER)
    assert resp.dest == GROUP and resp.kind == "response"
    assert [t.topic for t in L.decode(resp).tirs] == ["md.0"]
    # its own datagrams come back through the group: dropped by source id
    own = ctx.tick(ctx.next_deadline())
    assert own and all(ctx.receive(d, 1.0, OTHER) == [] for d in own)
    assert ctx.stats["ignored_own"] == len(own) and ctx.stats["ignored_unknown_source"] == 0


def test_context_takes_daemons_or_a_group_not_both():
    with pytest.raises(ValueError, match="not both"):
        Context([("127.0.0.1", 15380)], multicast=GROUP)
    with pytest.raises(ValueError):
        Context([])
    assert Context().daemons == [("127.0.0.1", 15380)] and Context().multicast is None


def test_multicast_topology_defaults():
    cfg = SimConfig(multicast=GROUP, contexts=2, topics=2)
    sim.check_config(cfg)
    assert sim.daemon_list(cfg) == [] and sim.source_ip_of(cfg) == "bind"
    assert sim.bind_addresses(cfg) == ["127.0.0.1", "127.0.0.1"]
    assert sim.source_ip_of(SimConfig()) == "0.0.0.0" and sim.daemon_list(SimConfig()) == [sim.DEFAULT_DAEMON]
    nonlo = SimConfig(multicast=GROUP, mc_interface="198.18.0.1", contexts=3)
    assert sim.bind_addresses(nonlo) == ["198.18.0.1"] * 3
    with pytest.raises(ValueError, match="do not apply"):
        sim.bind_addresses(SimConfig(multicast=GROUP, mc_interface="198.18.0.1", bind_base="127.0.1.1"))


# ----------------------------------------------------------------------- CLI


def test_parse_multicast_arguments():
    cfg, as_json = parse_args(["--multicast", "224.9.10.11:12965", "--json", "--bind-base", "127.0.1.1"])
    assert as_json and cfg.multicast == GROUP and cfg.daemons == []
    assert cfg.mc_interface == "127.0.0.1" and cfg.mc_ttl == 0 and cfg.source_ip == "bind"
    cfg, _ = parse_args(["--multicast", "--contexts", "2"])  # alone: UM's default group
    assert cfg.multicast == GROUP and cfg.contexts == 2
    cfg, _ = parse_args(["--multicast", "239.1.2.3", "--mc-interface", "198.18.0.1", "--mc-ttl", "1",
                         "--source-ip", "0.0.0.0"])
    assert cfg.multicast == ("239.1.2.3", 12965) and cfg.mc_interface == "198.18.0.1"
    assert cfg.mc_ttl == 1 and cfg.source_ip == "0.0.0.0"


@pytest.mark.parametrize("argv", [
    ["--multicast", "127.0.0.1:12965"],                               # not a group
    ["--multicast", "224.9.10.11:0"],
    ["--multicast", "224.9.10.11:x"],
    ["--multicast", "224.9.10.11", "--daemon", "127.0.0.1:15380"],    # exclusive
    ["--mc-ttl", "1"],                                                 # needs --multicast
    ["--mc-interface", "127.0.0.1"],
    ["--multicast", "--mc-ttl", "2"],
    ["--multicast", "--mc-interface", "nowhere"],
    ["--multicast", "--mc-interface", "198.18.0.1", "--bind-base", "127.0.1.1"],
    ["--multicast", "--bind", "10.0.0.1"],
])
def test_bad_multicast_arguments_are_usage_errors(argv):
    # parse only: nothing here may reach run_sim in the caller's namespace
    with pytest.raises(click.UsageError):
        parse_args(argv)


def test_daemon_and_multicast_together_exit_2():
    r = CliRunner().invoke(sim.main, ["--multicast", "--daemon", "127.0.0.1:15380"])
    assert r.exit_code == 2 and "mutually exclusive" in r.output


def test_help_lists_the_multicast_options():
    r = CliRunner().invoke(sim.main, ["--help"])
    assert r.exit_code == 0
    for opt in ("--multicast", "--mc-interface", "--mc-ttl"):
        assert opt in r.output


# ------------------------------------------------------------ in namespaces


def _sim(ns: NetNS, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
    return ns.run([*SIM, *args], timeout=timeout, cwd=ROOT)


def _doc(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def _wait_bound(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Until ``proc`` (started with ip netns exec, which execs) has a UDP socket on
    the group's port: /proc/PID/net/udp shows the namespace of PID."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            if MC_PORT_HEX in Path(f"/proc/{proc.pid}/net/udp").read_text():
                return
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError("the source-only sim never bound its socket")


def test_four_contexts_resolve_over_the_group(netns_factory, tmp_path):
    ns = netns_factory()
    pcap = tmp_path / "mc.pcap"
    doc = _doc(_sim(ns, "--multicast", "224.9.10.11:12965", "--contexts", "4", "--topics", "4",
                    "--bind-base", "127.0.1.1", "--json", "--pcap", str(pcap), "--duration", "10",
                    "--seed", "5"))
    assert doc["multicast"] == "224.9.10.11:12965" and doc["daemons"] == []
    s = doc["summary"]
    assert s["resolved"] == s["total"] == 4 and s["send_errors"] == s["recv_errors"] == 0
    assert s["max_ms"] < 1000 and s["elapsed_s"] < 5
    for r in doc["receivers"]:
        # context i receives md.(i+1), sourced by context i+1 from 127.0.1.(2+i) on 14371+(i+1)
        j = (r["context"] + 1) % 4
        assert r["client"] == f"127.0.1.{1 + r['context']}:12965"
        assert r["topic"] == f"md.{j}" and r["resolved"] and not r["local"]
        assert r["transport"] == f"TCP 127.0.1.{1 + j}:{14371 + j}"
    for c in doc["contexts"]:
        st = c["stats"]
        assert "keepalives_sent" not in st and st["ignored_own"] >= 1
        assert "ignored_unknown_source" not in st

    src_ids = {c["client"].split(":")[0]: bytes.fromhex(c["src_id"]) for c in doc["contexts"]}
    got = list(read_udp(str(pcap)))
    assert len(got) >= 4
    topics = set()
    for g in got:
        assert (g.dst, g.dport) == GROUP and g.sport == 12965 and g.src in src_ids
        p = L.decode(g.payload)
        assert not p.is_keepalive and p.version == 1 and p.type == 0
        assert g.payload.endswith(trailer(src_ids[g.src]))
        (sid,) = [o for o in p.options if isinstance(o, L.SourceIdOption)]
        assert sid.src_id == src_ids[g.src]
        topics |= {t.topic for t in p.tirs}
    assert topics == {f"md.{j}" for j in range(4)}


def test_source_and_receiver_processes_resolve_each_other(netns_factory):
    """Two sims in one namespace: sources only (one advertisement each, then only
    query answers), started first; then receivers only, which can resolve only
    from answers to their queries."""
    ns = netns_factory()
    src = ns.popen([*SIM, "--multicast", "--contexts", "2", "--topics", "4",
                    "--receivers-per-context", "0", "--bind-base", "127.0.1.1",
                    "--timing", "ad_initial_duration=0", "--timing", "ad_sustain_duration=0",
                    "--keep-running", "--duration", "3", "--json", "--seed", "1"],
                   cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_bound(src)  # its single round of advertisements went out before anyone listened
    rcv = _doc(_sim(ns, "--multicast", "--contexts", "2", "--topics", "4", "--sources-per-topic", "0",
                    "--receivers-per-context", "4", "--bind-base", "127.0.2.1", "--duration", "3",
                    "--json", "--seed", "2"))
    out, err = src.communicate(timeout=20)
    assert src.returncode == 0, out + err
    sdoc = json.loads(out)

    assert rcv["summary"]["resolved"] == rcv["summary"]["total"] == 8
    for r in rcv["receivers"]:
        j = int(r["topic"].removeprefix("md."))
        assert r["transport"] == f"TCP 127.0.1.{1 + j % 2}:{14371 + j}"
        assert r["client"].startswith("127.0.2.")
    st = [c["stats"] for c in sdoc["contexts"]]
    assert sum(s.get("advertisements", 0) for s in st) == 4  # one per source, at creation
    assert all(s.get("tqrs_received", 0) > 0 and s.get("responses", 0) > 0 for s in st)
    assert sdoc["summary"]["total"] == 0 and sdoc["summary"]["elapsed_s"] == pytest.approx(3, abs=0.5)
    assert {c["src_id"] for c in sdoc["contexts"]}.isdisjoint(c["src_id"] for c in rcv["contexts"])


def test_refused_without_multicast_on_lo(netns_factory, tmp_path):
    ns = netns_factory(multicast=False)
    pcap = tmp_path / "never.pcap"
    r = _sim(ns, "--multicast", "--pcap", str(pcap), "--duration", "1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert ("multicast is not enabled on the interface lo (127.0.0.1); run inside a network "
            "namespace with multicast on lo") in r.stderr
    assert not pcap.exists() and r.stdout == ""
    ns.ip("link", "set", "lo", "down")
    r = _sim(ns, "--multicast", "--pcap", str(pcap), "--duration", "1")
    assert r.returncode == 1 and "the interface lo (127.0.0.1) is down" in r.stderr
    assert not pcap.exists()


def test_groups_cross_a_veth_only_with_ttl_1(netns_factory):
    a, b = netns_factory(), netns_factory()
    names = veth(a, "198.18.0.1/24", b, "198.18.0.2/24")
    assert names[0] in a.ip("-o", "link") and names[1] in b.ip("-o", "link")
    assert "198.18.0.2/24" in b.ip("-o", "addr", "show", "dev", names[1])

    # the interface check: fine in a namespace, refused for a non-loopback interface
    # in the initial namespace (simulated here; nothing is sent either way)
    probe = ("import sys; from lbmr_runtime import netif as sim; print(sim.in_initial_netns(), "
             "sim.multicast_interface(sys.argv[1]).name); sim.in_initial_netns = lambda: True\n"
             "try:\n sim.multicast_interface(sys.argv[1])\nexcept sim.MulticastUnavailable as e:\n print(e)")
    r = a.run([sys.executable, "-c", probe, "198.18.0.1"], cwd=ROOT)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()
    assert first == f"False {names[0]}"
    assert second.startswith(f"refusing multicast on the non-loopback interface {names[0]}")

    def sources(ttl: str, duration: str) -> subprocess.Popen:
        return a.popen([*SIM, "--multicast", "--mc-interface", "198.18.0.1", "--mc-ttl", ttl,
                        "--contexts", "1", "--topics", "2", "--receivers-per-context", "0",
                        "--keep-running", "--duration", duration, "--json"],
                       cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def receivers(duration: str) -> subprocess.CompletedProcess:
        return _sim(b, "--multicast", "--mc-interface", "198.18.0.2", "--mc-ttl", "1",
                    "--contexts", "1", "--topics", "2", "--sources-per-topic", "0",
                    "--receivers-per-context", "2", "--duration", duration, "--json")

    # TTL 0: the sources' datagrams never leave their namespace
    s0 = sources("0", "1.5")
    _wait_bound(s0)
    r0 = receivers("1")
    assert r0.returncode == 1 and json.loads(r0.stdout)["summary"]["resolved"] == 0
    out, err = s0.communicate(timeout=20)
    assert s0.returncode == 0, err
    assert json.loads(out)["contexts"][0]["stats"].get("tqrs_received", 0) > 0  # queries did arrive

    # TTL 1: across the link; sources advertise the interface address
    s1 = sources("1", "3")
    _wait_bound(s1)
    doc = _doc(receivers("3"))
    assert [r["transport"] for r in doc["receivers"]] == ["TCP 198.18.0.1:14372", "TCP 198.18.0.1:14371"]
    assert all(r["client"] == "198.18.0.2:12965" for r in doc["receivers"])
    out, err = s1.communicate(timeout=20)
    assert s1.returncode == 0, err


def test_netns_helper_cleans_up(netns_factory):
    ns = netns_factory()
    p = ns.popen(["sleep", "60"])
    # `ip netns exec` enters the namespace after the fork: give it a moment on a busy host
    deadline = time.monotonic() + 10
    while p.pid not in ns.pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ns.name in NetNS.list_names() and p.pid in ns.pids()
    assert "MULTICAST" in ns.ip("link", "show", "lo") and "224.0.0.0/4" in ns.ip("route")
    ns.close()
    assert p.poll() is not None and ns.name not in NetNS.list_names()
    ns.close()  # idempotent
    with NetNS() as tmp:
        name = tmp.name
        assert tmp.run(["ip", "-o", "link"]).stdout.count("\n") == 1  # only lo
    assert name not in NetNS.list_names()
