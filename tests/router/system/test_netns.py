"""The router across network namespaces the test creates: TRD1 lives on the
loopback of namespace A, TRD2 on the loopback of namespace B, so TRD1's hosts
cannot route to TRD2's at all. The only path between them is a veth pair that
carries the routers' peer link. A TCP source in TRD1 (lbmr-sim) serves
numbered data; a receiver in TRD2 (lbmr-sim) resolves the proxy and verifies
every byte. Namespaces are removed even when the test fails."""

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
    pair_xml,
    router_xml,
)

netns_factory = netns.netns_factory  # the fixture

PY = sys.executable

MC_TR = """<topic-resolution>
        <multicast group="224.9.10.11" port="12965" interface="127.0.1.1"/>
      </topic-resolution>"""


def test_router_pair_across_namespaces(netns_factory, tmp_path):
    a, b = netns_factory(), netns_factory()
    netns.veth(a, "198.18.0.1/24", b, "198.18.0.2/24")
    # no route from A to TRD2 (127.0.2.1 is B's loopback) and vice versa
    assert a.run(["ip", "route", "get", "127.0.2.1"]).stdout.count("dev lo") == 1  # stays in A
    cfg_a = tmp_path / "a.xml"
    cfg_a.write_text(pair_xml("router-a", 1, "127.0.1.1", "198.18.0.1", initiator_xml("198.18.0.2", 26123)))
    cfg_b = tmp_path / "b.xml"
    cfg_b.write_text(pair_xml("router-b", 2, "127.0.2.1", "198.18.0.2", acceptor_xml(26123)))
    logs = {k: open(tmp_path / f"{k}.log", "w") for k in ("la", "lb", "ra", "rb", "src")}
    try:
        a.popen(LBMRD + ["-i", "127.0.1.1", "--stats-interval", "0"], stdout=logs["la"], stderr=logs["la"])
        b.popen(LBMRD + ["-i", "127.0.2.1", "--stats-interval", "0"], stdout=logs["lb"], stderr=logs["lb"])
        b.popen(ROUTER + [str(cfg_b)], stdout=logs["rb"], stderr=logs["rb"])
        a.popen(ROUTER + [str(cfg_a)], stdout=logs["ra"], stderr=logs["ra"])
        common = ["--topics", "1", "--topic-prefix", "md.ns.", "--data-bytes", "5M", "--json"]
        a.popen(SIM + ["--daemon", "127.0.1.1:15380", "--bind-base", "127.0.1.10", "--contexts", "1",
                       "--receivers-per-context", "0", "--duration", "60", "--keep-running"] + common,
                stdout=logs["src"], stderr=logs["src"])
        time.sleep(0.5)
        r = b.run(SIM + ["--daemon", "127.0.2.1:15380", "--bind-base", "127.0.2.10", "--contexts", "1",
                         "--sources-per-topic", "0", "--receivers-per-context", "1", "--verify-data",
                         "--duration", "40"] + common, timeout=60)
        for f in logs.values():
            f.flush()
        detail = "\n".join(f"--- {k}\n" + (tmp_path / f"{k}.log").read_text()[-2000:] for k in logs)
        assert r.returncode == 0, f"receiver sim failed:\n{r.stdout}\n{r.stderr}\n{detail}"
        report = json.loads(r.stdout)
        (rcv,) = report["receivers"]
        assert rcv["resolved"] and rcv["transport"].startswith("TCP 127.0.2.1:"), rcv  # router B's proxy
        assert rcv["data"]["ok"] and rcv["data"]["bytes"] == 5 * 1024 * 1024, rcv["data"]
    finally:
        for f in logs.values():
            f.close()


def test_multicast_trd_bridged_to_an_lbmrd_trd(netns_factory, tmp_path):
    """TRD1 uses multicast topic resolution (224.9.10.11:12965 on namespace A's
    loopback); TRD2 an lbmrd in namespace B. The source in TRD1 is an lbmr-sim
    context in multicast mode; the receiver in TRD2 verifies the data."""
    a, b = netns_factory(), netns_factory()
    netns.veth(a, "198.18.0.1/24", b, "198.18.0.2/24")
    cfg_a = tmp_path / "a.xml"
    cfg_a.write_text(pair_xml("router-a", 1, "127.0.1.1", "198.18.0.1", initiator_xml("198.18.0.2", 26123),
                              tr=MC_TR))
    cfg_b = tmp_path / "b.xml"
    cfg_b.write_text(pair_xml("router-b", 2, "127.0.2.1", "198.18.0.2", acceptor_xml(26123)))
    logs = {k: open(tmp_path / f"{k}.log", "w") for k in ("lb", "ra", "rb", "src")}
    try:
        b.popen(LBMRD + ["-i", "127.0.2.1", "--stats-interval", "0"], stdout=logs["lb"], stderr=logs["lb"])
        b.popen(ROUTER + [str(cfg_b)], stdout=logs["rb"], stderr=logs["rb"])
        a.popen(ROUTER + [str(cfg_a)], stdout=logs["ra"], stderr=logs["ra"])
        common = ["--topics", "1", "--topic-prefix", "md.mc.", "--data-bytes", "5M", "--json"]
        a.popen(SIM + ["--multicast", "224.9.10.11:12965", "--mc-interface", "127.0.1.1", "--bind-base",
                       "127.0.1.10", "--contexts", "1", "--receivers-per-context", "0", "--duration", "60",
                       "--keep-running"] + common, stdout=logs["src"], stderr=logs["src"])
        time.sleep(0.5)
        r = b.run(SIM + ["--daemon", "127.0.2.1:15380", "--bind-base", "127.0.2.10", "--contexts", "1",
                         "--sources-per-topic", "0", "--receivers-per-context", "1", "--verify-data",
                         "--duration", "40"] + common, timeout=60)
        for f in logs.values():
            f.flush()
        detail = "\n".join(f"--- {k}\n" + (tmp_path / f"{k}.log").read_text()[-2000:] for k in logs)
        assert r.returncode == 0, f"receiver sim failed:\n{r.stdout}\n{r.stderr}\n{detail}"
        (rcv,) = json.loads(r.stdout)["receivers"]
        assert rcv["transport"].startswith("TCP 127.0.2.1:") and rcv["data"]["ok"], rcv
    finally:
        for f in logs.values():
            f.close()


DIRECT_XML = router_xml("direct", [endpoint_xml("mc-trd", 1, "127.0.1.1", tr=MC_TR),
                                    endpoint_xml("lbmrd-trd", 2, "127.0.2.1")])


def test_direct_link_router_between_a_multicast_and_an_lbmrd_trd(netns_factory, tmp_path):
    """One router process, no peer link: TRD1 multicast (224.9.10.11:12965 on the
    namespace's loopback at 127.0.1.1), TRD2 an lbmrd on 127.0.2.1. An lbmr-sim
    source in each TRD, an lbmr-sim receiver in the other verifies the data."""
    ns = netns_factory()
    cfg = tmp_path / "direct.xml"
    cfg.write_text(DIRECT_XML)
    logs = {k: open(tmp_path / f"{k}.log", "w") for k in ("lb", "r", "src1", "src2")}
    mc = ["--multicast", "224.9.10.11:12965", "--mc-interface", "127.0.1.1"]
    ud = ["--daemon", "127.0.2.1:15380"]
    try:
        ns.popen(LBMRD + ["-i", "127.0.2.1", "--stats-interval", "0"], stdout=logs["lb"], stderr=logs["lb"])
        ns.popen(ROUTER + [str(cfg)], stdout=logs["r"], stderr=logs["r"])
        for src, tr, base, prefix in (("src1", mc, "127.0.1.10", "md.d1."), ("src2", ud, "127.0.2.10", "md.d2.")):
            ns.popen(SIM + tr + ["--bind-base", base, "--contexts", "1", "--receivers-per-context", "0",
                                 "--duration", "60", "--keep-running", "--topics", "1", "--topic-prefix",
                                 prefix, "--data-bytes", "2M", "--json"], stdout=logs[src], stderr=logs[src])
        time.sleep(0.5)
        for tr, base, prefix, relay in ((ud, "127.0.2.20", "md.d1.", "127.0.2.1"),
                                        (mc, "127.0.1.20", "md.d2.", "127.0.1.1")):
            r = ns.run(SIM + tr + ["--bind-base", base, "--contexts", "1", "--sources-per-topic", "0",
                                   "--receivers-per-context", "1", "--verify-data", "--duration", "30",
                                   "--topics", "1", "--topic-prefix", prefix, "--data-bytes", "2M", "--json"],
                       timeout=45)
            for f in logs.values():
                f.flush()
            detail = "\n".join(f"--- {k}\n" + (tmp_path / f"{k}.log").read_text()[-2000:] for k in logs)
            assert r.returncode == 0, f"receiver sim failed:\n{r.stdout}\n{r.stderr}\n{detail}"
            (rcv,) = json.loads(r.stdout)["receivers"]
            assert rcv["transport"].startswith(f"TCP {relay}:") and rcv["data"]["ok"], rcv
            assert rcv["data"]["bytes"] == 2 * 1024 * 1024, rcv["data"]
    finally:
        for f in logs.values():
            f.close()
