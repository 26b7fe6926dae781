"""An LBT-RM source across one hop, in network namespaces the test creates:
TRD1 (an lbmrd) on the loopback of namespace A, TRD2 (an lbmrd) on the
loopback of namespace B; only the routers' peer link crosses, over a veth
pair. The source in TRD1 (lbmr-sim) multicasts real LBT-RM datagrams and
answers NAKs; the receiver in TRD2 (lbmr-sim) resolves router B's LBT-RM
proxy (a group of router B's configured range), joins it, discards every 20th datagram on purpose and recovers
it by NAK through both routers (and whatever it missed before the routers
joined), verifying every byte. The routers' /status shows the NAKs crossing
both ways; when router A dies, router B ends the stream and removes the
proxy, and lives on. Namespaces are removed even when the test fails."""

from __future__ import annotations

import json
import subprocess
import time

from tests import netns
from tests.helpers import SIM, acceptor_xml, initiator_xml, ns_status, pair_xml, start_pair

netns_factory = netns.netns_factory  # the fixture

COUNT = 3000
RELAY = {"relay": (24371, 24390), "metrics": True}


def test_lbtrm_source_across_one_hop_with_naks_through_the_routers(netns_factory, tmp_path):
    a, b = netns_factory(), netns_factory()
    netns.veth(a, "198.18.0.1/24", b, "198.18.0.2/24")
    cfg_a = tmp_path / "a.xml"
    cfg_a.write_text(pair_xml("router-a", 1, "127.0.1.1", "198.18.0.1", initiator_xml("198.18.0.2", 26123), **RELAY))
    cfg_b = tmp_path / "b.xml"
    cfg_b.write_text(pair_xml(
        "router-b", 2, "127.0.2.1", "198.18.0.2", acceptor_xml(26123), **RELAY,
        extra='<lbt-rm group-low="239.192.5.1" group-high="239.192.5.2" destination-port="15400"/>'))
    logs = {k: open(tmp_path / f"{k}.log", "w") for k in ("la", "lb", "ra", "rb", "src", "rcv")}
    common = ["--topics", "1", "--topic-prefix", "md.rm.", "--transport", "lbtrm",
              "--data-datagrams", str(COUNT), "--json"]
    try:
        ra, rb = start_pair(a, b, cfg_a, cfg_b, logs)
        time.sleep(0.5)
        rcv = b.popen(SIM + ["--daemon", "127.0.2.1:15380", "--bind-base", "127.0.2.10", "--contexts", "1",
                             "--sources-per-topic", "0", "--receivers-per-context", "1", "--verify-data",
                             "--data-drop-every", "20", "--duration", "40"] + common,
                      stdout=subprocess.PIPE, stderr=logs["rcv"], text=True)
        time.sleep(0.5)
        a.popen(SIM + ["--daemon", "127.0.1.1:15380", "--bind-base", "127.0.1.10", "--source-ip", "bind",
                       "--contexts", "1", "--receivers-per-context", "0", "--data-rate", "1000",
                       "--duration", "60", "--keep-running"] + common,
                stdout=logs["src"], stderr=logs["src"])
        out, _ = rcv.communicate(timeout=60)
        st_a, st_b = ns_status(a, "127.0.1.1"), ns_status(b, "127.0.2.1")
        for f in logs.values():
            f.flush()
        detail = "\n".join(f"--- {k}\n" + (tmp_path / f"{k}.log").read_text()[-2000:] for k in logs)
        assert rcv.returncode == 0, f"receiver sim failed:\n{out}\n{detail}"
        (r,) = json.loads(out)["receivers"]
        # router B's proxy: its relay address as source and NAK address, a group of its range
        assert r["transport"].startswith("LBTRM 127.0.2.1:243"), r
        assert r["transport"].endswith("grp 239.192.5.1:15400"), r
        d = r["data"]
        assert d["ok"] and d["datagrams"] == COUNT and d["bytes"] == COUNT * (1400 - 20), d
        assert d["detail"]["dropped_on_purpose"] == COUNT // 20 and d["detail"]["recovered"] >= COUNT // 20, d
        assert d["detail"]["corrupt"] == 0 and d["detail"]["naks_sent"] >= 1, d
        ca, cb = st_a["counters"], st_b["counters"]
        assert cb["lbtrm_naks_from_receivers"] >= 1 and ca["lbtrm_naks_to_source"] >= 1, (ca, cb)
        assert ca["lbtrm_datagrams_relayed"] >= COUNT and cb["lbtrm_datagrams_emitted"] >= COUNT, (ca, cb)
        assert ca["lbtrm_streams_accepted"] == 1 and cb["lbtrm_streams_opened"] == 1, (ca, cb)
        # the link is cut while the session runs (the source keeps sending): router B
        # lives on, ends the stream and removes the proxy
        ra.kill()
        deadline = time.monotonic() + 20
        while True:
            st_b = ns_status(b, "127.0.2.1")
            if st_b["peer"]["state"] != "CONNECTED" and not st_b["proxies"]:
                break
            assert time.monotonic() < deadline, st_b
            time.sleep(0.2)
        assert rb.poll() is None and st_b["counters"]["lbtrm_streams_ended"] == 1, st_b["counters"]
    finally:
        for f in logs.values():
            f.close()
