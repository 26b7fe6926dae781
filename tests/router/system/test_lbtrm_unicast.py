"""An LBT-RM source re-published as LBT-RU in a TRD without multicast, in
network namespaces the test creates: TRD1 (an lbmrd) on the loopback of
namespace A, with multicast; TRD2 (an lbmrd) on the loopback of namespace B,
whose lo has *no* multicast (nothing there could join or send to a group).
Only the routers' peer link crosses, over a veth pair. Router B's endpoint
has ``<lbt-rm transport="lbt-ru"/>``: its proxy of the LBT-RM source is an
LBT-RU source speaking UM's LBT-RU (lbmr_proto.lbtru). Two receivers in TRD2
(lbmr-sim --lbtru-wire um) connect to it, each discards every 20th datagram
on purpose and recovers it by NAK from router B's window, and what router B
never saw (the session began before it joined) is NAKed through both
routers to the source. Every byte is verified. Namespaces are removed even
when the test fails."""

from __future__ import annotations

import json
import subprocess
import time

from tests import netns
from tests.helpers import SIM, acceptor_xml, initiator_xml, ns_status, pair_xml, start_pair

netns_factory = netns.netns_factory  # the fixture

COUNT = 3000
RELAY = {"relay": (24371, 24390), "metrics": True}


def test_lbtrm_source_reaches_a_trd_without_multicast_as_lbtru(netns_factory, tmp_path):
    a, b = netns_factory(), netns_factory(multicast=False)
    netns.veth(a, "198.18.0.1/24", b, "198.18.0.2/24")
    cfg_a = tmp_path / "a.xml"
    cfg_a.write_text(pair_xml("router-a", 1, "127.0.1.1", "198.18.0.1", initiator_xml("198.18.0.2", 26123), **RELAY))
    cfg_b = tmp_path / "b.xml"
    cfg_b.write_text(pair_xml("router-b", 2, "127.0.2.1", "198.18.0.2", acceptor_xml(26123), **RELAY,
                              extra='<lbt-rm transport="lbt-ru" max-clients="8"/>'))
    logs = {k: open(tmp_path / f"{k}.log", "w") for k in ("la", "lb", "ra", "rb", "src", "rcv")}
    common = ["--topics", "1", "--topic-prefix", "md.rm.", "--transport", "lbtrm",
              "--data-datagrams", str(COUNT), "--json"]
    try:
        _, rb = start_pair(a, b, cfg_a, cfg_b, logs)
        time.sleep(0.5)
        # the source first: its session is under way before router B's proxy exists
        a.popen(SIM + ["--daemon", "127.0.1.1:15380", "--bind-base", "127.0.1.10", "--source-ip", "bind",
                       "--contexts", "1", "--receivers-per-context", "0", "--data-rate", "1000",
                       "--duration", "60", "--keep-running"] + common,
                stdout=logs["src"], stderr=logs["src"])
        time.sleep(1.0)
        rcv = b.popen(SIM + ["--daemon", "127.0.2.1:15380", "--bind-base", "127.0.2.10", "--contexts", "2",
                             "--sources-per-topic", "0", "--receivers-per-context", "1", "--verify-data",
                             "--lbtru-wire", "um", "--data-drop-every", "20", "--duration", "40"] + common,
                      stdout=subprocess.PIPE, stderr=logs["rcv"], text=True)
        out, _ = rcv.communicate(timeout=60)
        st_b = ns_status(b, "127.0.2.1")
        st_a = ns_status(a, "127.0.1.1")
        for f in logs.values():
            f.flush()
        detail = "\n".join(f"--- {k}\n" + (tmp_path / f"{k}.log").read_text()[-2000:] for k in logs)
        assert rcv.returncode == 0, f"receiver sim failed:\n{out}\n{detail}"
        receivers = json.loads(out)["receivers"]
        assert len(receivers) == 2
        for r in receivers:
            # router B's proxy: an LBT-RU source at its relay address, with a session id
            assert r["transport"].startswith("LBTRU 127.0.2.1:243"), r
            d = r["data"]
            assert d["kind"] == "lbtru" and d["ok"], (d, detail)
            assert d["datagrams"] == COUNT and d["bytes"] == COUNT * (1400 - 20), d
            det = d["detail"]
            assert det["dropped_on_purpose"] >= COUNT // 20 and det["recovered"] >= COUNT // 20, det
            assert det["corrupt"] == 0 and det["client_id"] is not None and det["acks_sent"] >= 1, det
        cb, ca = st_b["counters"], st_a["counters"]
        assert cb["lbtru_clients_connected"] == 2 and cb["lbtru_clients_confirmed"] == 2, cb
        assert cb["lbtru_datagrams_sent"] >= COUNT and cb["lbtru_retransmissions"] >= 2 * (COUNT // 20), cb
        # the start of the session (before router B joined) came from the source, through both routers
        assert cb["lbtru_naks_up"] >= 1 and ca["lbtrm_naks_to_source"] >= 1, (ca, cb)
        assert cb.get("lbtrm_datagrams_emitted", 0) == 0  # nothing multicast in TRD2
        assert rb.poll() is None
    finally:
        for f in logs.values():
            f.close()
