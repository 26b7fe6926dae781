"""tshark judges what lbmr-sim sends for UM's request/response, late join and
OTR: a real capture (dumpcap on the loopback of a network namespace of our
own) of a run through lbmrd, dissected by Wireshark 4.0's lbttcp and lbmc,
must show every TCP segment as LBMC, the requests, responses, late-join and
OTR requests and answers with their fields, and no expert information above
TCP (whose notes on connection setup and teardown, resets and the kernel's
retransmissions on a busy host are not about our bytes)."""

from __future__ import annotations

import json
import subprocess
import time

from lbmr_tools.sim.dataplane import RESPONSE_SIZE
from tests import netns
from tests.helpers import LBMRD, SIM
from tests.tshark_judge import flatten, tshark_frames

netns_factory = netns.netns_factory  # the fixture

TCP_RETRANSMITTED = ("tcp.analysis.rto", "tcp.analysis.retransmission", "tcp.analysis.spurious_retransmission",
                     "tcp.analysis.fast_retransmission")


#: the layers below the LBT-TCP dissector: their notes (connection setup and teardown, a reset,
#: the kernel's retransmissions on a busy host) are TCP's, not about our bytes
BELOW = ("frame", "eth", "sll", "ip", "tcp")


def _experts(node) -> list[str]:
    """The expert messages anywhere in ``node`` (a tshark JSON tree)."""
    if isinstance(node, list):
        return [e for x in node for e in _experts(x)]
    if not isinstance(node, dict):
        return []
    out = [node["_ws.expert.message"]] if "_ws.expert.message" in node else []
    return out + [e for k, v in node.items() if k != "_ws.expert.message" for e in _experts(v)]


def _layers(layers: dict, name: str) -> list[dict]:
    got = layers.get(name)
    return [] if got is None else got if isinstance(got, list) else [got]


def test_requests_late_join_and_otr_decode_in_tshark_without_expert_info(netns_factory, tmp_path):
    ns = netns_factory()
    pcap = tmp_path / "uim.pcapng"
    cap = ns.popen(["dumpcap", "-q", "-i", "lo", "-f", "tcp", "-w", str(pcap)],
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ns.popen(LBMRD + ["-i", "127.0.0.1", "-p", "15380"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)  # lbmrd and dumpcap up
    r = ns.run(SIM + ["--daemon", "127.0.0.1:15380", "--contexts", "2", "--topics", "1", "--bind-base",
                      "127.0.1.1", "--data-bytes", "100K", "--data-message-size", "100", "--verify-data",
                      "--requests", "5", "--request-interval", "50", "--retention", "2000", "--late-join",
                      "--otr", "--data-drop-every", "30", "--data-rate", "2000", "--duration", "20", "--json"],
               timeout=60)
    time.sleep(0.5)  # the last segments reach dumpcap
    cap.terminate()
    cap.wait(10)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads(r.stdout)
    (ds,) = doc["data_sources"]
    (src_port,) = [p for p in doc["request_ports"] if p["requests"]]
    qidx = {int(q) for q in src_port["requests"][0]["responses"]}
    responses = sum(src_port["requests"][0]["responses"].values())
    assert len(ds["requests_sent"]) == 5 and len(qidx) == 5 and responses >= 5
    assert all(x["data"]["detail"]["recovered"] >= 1 for x in doc["receivers"])

    frames = list(tshark_frames(pcap, "tcp.port==14371-14400,lbttcp"))
    counts = dict.fromkeys(("segments", "lbmc", "pieces", "requests", "responses", "lji_req", "lj_info", "rxreq",
                            "retrans", "retrans_requests"), 0)
    unexpected = []
    for number, layers, _experts_all, malformed in frames:
        assert not malformed, number
        tcp = layers["tcp"]
        unexpected += [(number, name, e) for name, layer in layers.items() if name not in BELOW
                       for e in _experts(layer)]
        if int(tcp["tcp.len"]) == 0:
            continue
        counts["segments"] += 1
        msgs = [flatten(m) for m in _layers(layers, "lbmc")]
        if not msgs:  # a piece of a message shown, reassembled, in a later frame, or bytes sent again
            seen = flatten(tcp)
            assert "tcp.reassembled_in" in seen or any(f in seen for f in TCP_RETRANSMITTED), (
                f"frame {number}: a TCP segment that is not LBMC")
            counts["pieces"] += 1
            continue
        counts["lbmc"] += 1
        to_request_port = int(tcp["tcp.dstport"]) in (14391, 14392)
        for m in msgs:
            kind = int(m["lbmc.type"][0])
            if "lbmc.tcp_request.qidx" in m:
                counts["retrans_requests" if kind == 10 else "requests"] += 1
                assert int(m["lbmc.tcp_request.port"][0]) == 14391 and m["lbmc.tcp_request.ipaddr"] == ["127.0.1.1"]
                assert int(m["lbmc.tcp_request.qidx"][0]) in qidx
            elif kind == 0 and to_request_port:  # a response: the request index as topic index
                counts["responses"] += 1
                assert int(m["lbmc.tidx"][0]) in qidx and int(m["data.len"][0]) == RESPONSE_SIZE
            if "lbmc.lji_req.req_port" in m:
                counts["lji_req"] += 1  # a UIM to the source's request port, naming the receiver's
                assert to_request_port and int(m["lbmc.lji_req.req_port"][0]) in (14391, 14392)
            if "lbmc.ume_lj_info.qidx" in m:
                counts["lj_info"] += 1
                assert int(m["lbmc.ume_lj_info.low_seqnum"][0]) <= int(m["lbmc.ume_lj_info.high_seqnum"][0])
            if "lbmc.ume_rxreq.rx_port" in m:
                counts["rxreq"] += 1
                assert to_request_port and int(m["lbmc.ume_rxreq.rx_port"][0]) in (14391, 14392)
            if kind == 10:
                counts["retrans"] += 1
    assert not unexpected, unexpected[:10]
    assert counts["segments"] == counts["lbmc"] + counts["pieces"] and counts["lbmc"] > counts["pieces"]
    # 5 requests to the receivers there, each answered (retained ones too); late join for each receiver
    assert counts["requests"] == sum(ds["requests_sent"]) and counts["responses"] == responses, counts
    assert counts["lji_req"] == counts["lj_info"] == 2, counts
    assert counts["rxreq"] >= 2 and counts["retrans"] >= counts["rxreq"], counts
