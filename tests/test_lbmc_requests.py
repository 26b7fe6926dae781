"""The LBMC of UM's request/response, late join and OTR as lbmr-sim writes
it: the UME_LJ_INFO header round-trips, and tshark (Wireshark 4.0's lbttcp
and lbmc) shows every field of each message the simulator builds -- a
request, a response, a request retransmitted, LJI_REQ, UME_LJ_INFO,
UME_RXREQ -- exactly as we meant it, with no expert information."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbmr_proto import lbmc as C
from lbmr_tools.sim.dataplane import request_header, response_message, retrans_message

from .tshark_judge import compare_lbmc, run_tshark_lbmc, write_lbttcp_pcap

u32 = st.integers(0, 0xFFFFFFFF)
REQUEST_PORT = 14391  # the dissector's default request ports are 14391..14395


@given(st.integers(0, 0xFFFF), u32, u32, u32)
def test_late_join_info_round_trips(flags, low, high, qidx):
    h = C.UmeLateJoinInfoHeader(flags, low, high, qidx)
    m = C.Message(C.CONTROL, headers=(h,))
    raw = C.encode(m)
    assert len(raw) == 4 + 16 and raw[1] == 0x1E and raw[4:6] == bytes((C.NHDR_NONE, 16))
    assert C.decode(raw) == m and C.decode(raw).header(C.UmeLateJoinInfoHeader) == h


def test_late_join_info_layout_is_big_endian():
    raw = C.encode(C.Message(C.CONTROL, headers=(C.UmeLateJoinInfoHeader(0x8000, 1, 0x0203, 0x04050607),)))
    assert raw[4:] == bytes.fromhex("ff10 8000 00000001 00000203 04050607")


def test_a_truncated_late_join_info_is_rejected_with_its_offset():
    raw = bytearray(C.encode(C.Message(C.CONTROL, headers=(C.UmeLateJoinInfoHeader(0, 1, 2, 3),))))
    raw[5] = 12  # hdr_len shorter than the header
    with pytest.raises(C.LbmcDecodeError):
        C.decode(bytes(raw))


def _judge(tmp_path, chunks_msgs, port):
    """Write (from_source, [messages]) chunks, one segment each; compare every lbmc layer."""
    pcap = tmp_path / "uim.pcap"
    n = write_lbttcp_pcap(pcap, [(fs, b"".join(C.encode(m) for m in msgs)) for fs, msgs in chunks_msgs],
                          source=("127.0.1.1", port), receiver=("127.0.1.2", 40500))
    frames = run_tshark_lbmc(pcap, port=port)
    assert len(frames) == n
    layers = [layer for f in frames for layer in f.lbmc]
    msgs = [m for _, ms in chunks_msgs for m in ms]
    assert len(layers) == len(msgs)
    problems = [f"{m!r}: {p}" for layer, m in zip(layers, msgs, strict=True) for p in compare_lbmc(layer, m)]
    assert not problems, problems
    assert not [(f.number, f.experts) for f in frames if f.flagged]


def test_the_data_connection_carries_requests(tmp_path):
    req = request_header(7, "127.0.1.1", REQUEST_PORT)
    request = C.decode(C.data_message(3, 100, b"p" * 40, req))
    _judge(tmp_path, [(True, [C.Message(C.MESSAGE, 3, 99, b"q" * 40), request])], port=14371)


def test_the_sources_request_port_takes_the_receivers_late_join_and_otr_requests(tmp_path):
    # UIMs from a receiver's connection to the source's request port (its late-join option's)
    lji = C.Message(C.CONTROL, headers=(C.LateJoinRequestHeader(0, 65536, 1, 3, "127.0.1.2", 14392),))
    rxreq = C.Message(C.CONTROL, headers=(C.UmeRxReqHeader(0, 65537, 1, 3, 99, 14392, 0, "127.0.1.2"),))
    _judge(tmp_path, [(False, [lji]), (False, [rxreq])], port=REQUEST_PORT)


def test_the_request_port_takes_responses_and_the_sources_answers(tmp_path):
    # from the responder: a response; from a source: UME_LJ_INFO then RETRANS (a request among them)
    response = C.decode(response_message(5, 7))
    assert (response.kind, response.tidx, response.sqn, len(response.payload)) == (C.MESSAGE, 7, 0, 64)
    info = C.Message(C.CONTROL, headers=(C.UmeLateJoinInfoHeader(0, 90, 99, 65536),))
    rx = C.decode(retrans_message(5, 3, 90, 40))
    rx_req = C.decode(retrans_message(5, 3, 100, 40, request_header(7, "127.0.1.1", REQUEST_PORT)))
    assert rx.kind == rx_req.kind == C.RETRANS and rx_req.header(C.RequestHeader).qidx == 7
    # the TCP "source" of the capture is the request port; the connecting side sends
    _judge(tmp_path, [(False, [response]), (False, [info, rx]), (False, [rx_req])], port=REQUEST_PORT)
