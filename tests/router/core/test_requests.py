"""Requests across routers, sans-IO: answer addresses in LBMC messages (REQUEST,
LJI_REQ, UME_RXREQ) read and rewritten in place, DESTINATION read and its hop
count set (router/core/message_addresses.py), the routing decision of a UIM
(router/core/uim.py, route_uim), and the two bounded maps of requests across
routers (router/core/request_maps.py: the receivers' side's request
listeners, the origin side's requesters), on virtual times in seconds.
tshark's lbmc dissector judges the rewritten bytes."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from lbmr_proto import lbmc as C
from lbmr_proto import lbmc_stream
from router.core.message_addresses import (
    ANSWER_HEADERS,
    LATE_JOIN_REQUEST,
    REQUEST,
    RETRANSMIT_REQUEST,
    AnswerAddress,
    Destination,
    answer_address,
    deliverable_address,
    destination_of,
    find_header,
    rewrite_answer_address,
    with_hops_taken,
)
from router.core.request_maps import (
    NeedListener,
    PassUnchanged,
    RequesterKey,
    RequesterTable,
    RequestMap,
    RequestSlot,
    RewriteTo,
    Unmapped,
)
from router.core.uim import DeliverUim, ForwardUim, RefuseUim, UimRefusal, route_uim
from tests import strategies as S
from tests.tshark_judge import compare_lbmc, run_tshark_lbmc, segments, write_lbttcp_pcap

#: each answer header, its lbmr_proto class and the names of its (index, ip, port) fields
CLASSES = {
    REQUEST: (C.RequestHeader, "qidx", "ipaddr", "port"),
    LATE_JOIN_REQUEST: (C.LateJoinRequestHeader, "request_idx", "req_ip", "req_port"),
    RETRANSMIT_REQUEST: (C.UmeRxReqHeader, "request_idx", "rx_ip", "rx_port"),
}
TCP_SID = C.TcpSidHeader(0, 7)
DEST = C.DestinationHeader(0x8000, 7, "10.7.0.9", 15001, 2, 3, "10.3.0.4", 15002, 0)


def _header(which, index=0x01020304, ip="10.29.4.121", port=14391, **kw):
    cls, i, a, p = CLASSES[which]
    return cls(**{i: index, a: ip, p: port}, **kw)


def _swapped(h, which, ip, port):
    _, _, a, p = CLASSES[which]
    return dataclasses.replace(h, **{a: ip, p: port})


# --------------------------------------------------------------------------- headers


@pytest.mark.parametrize("which", ANSWER_HEADERS, ids=lambda h: h.name)
def test_the_layout_matches_lbmr_proto(which):
    cls = CLASSES[which][0]
    assert (which.code, which.size) == (cls.CODE, cls.SIZE)
    h = _header(which, index=0xA1B2C3D4, ip="1.2.3.4", port=0xBEEF)
    msg = C.encode(C.Message(C.CONTROL, headers=(TCP_SID, h)))
    assert answer_address(msg, which) == AnswerAddress(0xA1B2C3D4, "1.2.3.4", 0xBEEF)
    out = rewrite_answer_address(msg, which, "192.168.7.8", 40001)
    assert len(out) == len(msg)
    assert C.decode(out) == C.Message(C.CONTROL, headers=(TCP_SID, _swapped(h, which, "192.168.7.8", 40001)))
    assert answer_address(out, which) == AnswerAddress(0xA1B2C3D4, "192.168.7.8", 40001)


def test_a_request_in_a_data_message_keeps_everything_but_its_address():
    h = C.RequestHeader(0x80, 0, 5, 14391, 0x0102, "10.0.0.1")
    msg = C.encode(C.Message(C.MESSAGE, 3, 99, b"payload \x00\xff", (h, C.FragmentHeader(0, 1, 2, 3))))
    out = rewrite_answer_address(msg, REQUEST, "172.16.0.5", 33000)
    back = C.decode(out)
    assert back.headers == (_swapped(h, REQUEST, "172.16.0.5", 33000), C.FragmentHeader(0, 1, 2, 3))
    assert (back.kind, back.tidx, back.sqn, back.payload) == (C.MESSAGE, 3, 99, b"payload \x00\xff")
    diff = [i for i in range(len(msg)) if msg[i] != out[i]]
    assert diff and min(diff) >= 12 + 8 and max(diff) < 12 + 16  # only port (8..10) and ip (12..16)


def test_a_message_without_the_header_is_returned_as_is():
    plain = C.data_message(1, 2, b"x" * 1000)
    assert rewrite_answer_address(plain, REQUEST, "1.2.3.4", 5) is plain
    other = C.encode(C.Message(C.MESSAGE, 1, 2, b"x", (TCP_SID, _header(LATE_JOIN_REQUEST))))
    assert rewrite_answer_address(other, REQUEST, "1.2.3.4", 5) is other
    assert answer_address(other, REQUEST) is None and answer_address(plain, REQUEST) is None
    assert with_hops_taken(plain, 3) is plain and destination_of(plain) is None


def test_every_header_of_the_type_is_rewritten():
    a, b = _header(REQUEST, 1, "10.0.0.1", 1000), _header(REQUEST, 2, "10.0.0.2", 2000)
    msg = C.encode(C.Message(C.MESSAGE, 1, 1, b"", (a, TCP_SID, b)))
    assert find_header(msg, REQUEST.code, REQUEST.size) == (12, 12 + 16 + 8)
    assert answer_address(msg, REQUEST) == AnswerAddress(1, "10.0.0.1", 1000)  # the first
    out = C.decode(rewrite_answer_address(msg, REQUEST, "10.9.9.9", 9000))
    assert out.headers == (_swapped(a, REQUEST, "10.9.9.9", 9000), TCP_SID, _swapped(b, REQUEST, "10.9.9.9", 9000))


def test_destination_read_and_hops_taken_set():
    msg = C.encode(C.Message(C.MESSAGE, 5, 6, b"uim", (C.StreamHeader(0, 1, 2, bytes(8)), DEST)))
    assert destination_of(msg) == Destination(7, "10.7.0.9", 15001, 2, 3, "10.3.0.4", 15002)
    out = with_hops_taken(msg, 3)
    assert C.decode(out).headers[1] == dataclasses.replace(DEST, hops_taken=3) and len(out) == len(msg)
    with pytest.raises(ValueError):
        with_hops_taken(msg, 65536)


@pytest.mark.parametrize("data, where", [
    (b"", "shorter than"),
    (b"\x00\x04\x00", "shorter than"),
    (b"\x18\x04\x00\x04", "version"),  # version 1
    (b"\x07\x04\x00\x04", "unknown LBMC message type"),
    (b"\x00\x04\x00\x0c" + bytes(7), "msglen 12 but the message has 11"),
    (b"\x00\x04\x00\x08" + bytes(4), "shorter than the 12-byte"),
])
def test_malformed_starts_are_errors(data, where):
    with pytest.raises(C.LbmcDecodeError, match=where):
        find_header(data, REQUEST.code, REQUEST.size)


def test_the_walk_stops_at_the_end_of_the_chain():
    """Bytes after NONE (which lbmc.decode refuses, and tshark ignores) are not headers;
    an empty chain is not looked at further (the framer checked the start)."""
    assert find_header(b"\x08\xff\x00\x06\x04\x10", REQUEST.code, REQUEST.size) == ()
    tcp_sid = C.encode(C.Message(C.CONTROL, headers=(TCP_SID,)))
    assert find_header(tcp_sid[:4] + b"\xff\x04\x00\x00" + bytes(4), REQUEST.code, REQUEST.size) == ()
    assert find_header(b"\x18\xff\x00\x04", REQUEST.code, REQUEST.size) == ()


def _control(*chain: bytes, first: int) -> bytes:
    body = b"".join(chain)
    return bytes((C.CONTROL, first)) + (4 + len(body)).to_bytes(2, "big") + body


@pytest.mark.parametrize("msg, words", [
    (C.encode(C.Message(C.CONTROL, headers=(TCP_SID,)))[:-1] + b"", "msglen 12 but the message has 11"),
    (_control(b"\xff\x04\x00", first=0x6B), "runs|within msglen"),  # header past the end
    (_control(b"\xff\x03\x00\x00", first=0x6B), "hdr_len 3"),  # hdr_len below 4
    (_control(b"\xff\x08" + bytes(6), first=0x04), "hdr_len 8, expected 16"),  # REQUEST of 8 bytes
    (_control(b"\x04\x08" + bytes(6), first=0x6B), "announced but the message ends"),  # chain runs out
])
def test_malformed_chains_are_errors(msg, words):
    with pytest.raises(C.LbmcDecodeError, match=words):
        rewrite_answer_address(msg, REQUEST, "1.2.3.4", 5)


def test_bad_replacement_addresses_are_value_errors():
    msg = C.encode(C.Message(C.MESSAGE, 1, 1, b"", (_header(REQUEST),)))
    for ip, port in (("1.2.3", 5), ("::1", 5), ("1.2.3.4", 0), ("1.2.3.4", 65536)):
        with pytest.raises(ValueError):
            rewrite_answer_address(msg, REQUEST, ip, port)


@given(S.lbmc_message(), st.sampled_from(ANSWER_HEADERS), S.ipv4, st.integers(1, 0xFFFF))
@settings(max_examples=400)
def test_random_messages_rewritten_header_by_header(msg, which, ip, port):
    data = C.encode(msg)
    out = rewrite_answer_address(data, which, ip, port)
    cls = CLASSES[which][0]
    want = C.Message(msg.kind, msg.tidx, msg.sqn, msg.payload,
                     tuple(_swapped(h, which, ip, port) if isinstance(h, cls) else h for h in msg.headers), msg.end)
    assert C.decode(out) == want and len(out) == len(data)
    if not any(isinstance(h, cls) for h in msg.headers):
        assert out is data and answer_address(data, which) is None


@given(st.binary(max_size=80))
@settings(max_examples=500)
def test_arbitrary_bytes_give_an_answer_or_a_decode_error(data):
    for which in ANSWER_HEADERS:
        try:
            got = answer_address(data, which)
        except C.LbmcDecodeError:
            continue
        try:
            msg = C.decode(data)
        except C.LbmcDecodeError:
            continue  # (the walk is lenient about other headers and bytes after NONE)
        first = next((h for h in msg.headers if isinstance(h, CLASSES[which][0])), None)
        assert (got is None) == (first is None)


# --------------------------------------------------------------------------- tshark


def test_tshark_decodes_rewritten_messages_with_the_new_address_and_no_expert_info(tmp_path):
    originals = [
        C.Message(C.MESSAGE, 1, 1, b"first"),
        C.Message(C.MESSAGE, 1, 2, b"request", (C.RequestHeader(0, 0, 5, 14391, 0, "10.29.4.121"),)),
        C.Message(C.MESSAGE, 2, 9, b"big request" * 50,
                  (C.RequestHeader(0, 0, 77, 14392, 0, "10.29.4.122"), C.FragmentHeader(0, 9, 0, 550))),
        C.Message(C.CONTROL, headers=(C.LateJoinRequestHeader(0x1, 1, 2, 3, "10.29.4.123", 14393, 0, 6, 7, 8),)),
        C.Message(C.CONTROL, headers=(C.UmeRxReqHeader(0x4000, 1, 2, 3, 4, 14394, 0, "10.29.4.124"),)),
        C.Message(C.MESSAGE, 5, 6, b"uim", (C.StreamHeader(0, 1, 2, bytes(8)), DEST)),
    ]
    wire = []
    for m in originals:
        b = C.encode(m)
        for which in ANSWER_HEADERS:
            b = rewrite_answer_address(b, which, "192.168.50.2", 40123)
        wire.append(with_hops_taken(b, 3))
    rewritten = [C.decode(b) for b in wire]
    addresses = [answer_address(b, w) for b in wire for w in ANSWER_HEADERS]
    assert [a for a in addresses if a] == [AnswerAddress(5, "192.168.50.2", 40123), AnswerAddress(77, "192.168.50.2", 40123),
                                           AnswerAddress(1, "192.168.50.2", 40123), AnswerAddress(1, "192.168.50.2", 40123)]
    pcap = tmp_path / "rewritten.pcap"
    write_lbttcp_pcap(pcap, [(True, s) for s in segments(wire)])
    frames = run_tshark_lbmc(pcap)
    layers = [layer for f in frames for layer in f.lbmc]
    assert len(layers) == len(rewritten)
    assert [compare_lbmc(layer, m) for layer, m in zip(layers, rewritten, strict=True)] == [[]] * len(rewritten)
    assert not any(f.flagged for f in frames)
    shown = " ".join(str(layer) for layer in layers)
    assert shown.count("192.168.50.2") == 4 and "10.29.4.12" not in shown


# --------------------------------------------------------------------------- RequestMap

K1 = RequesterKey(("link-1", 7), "10.29.4.121", 14391)
K2 = RequesterKey(("link-2", 3), "10.29.4.121", 14391)  # same address, another origin


def _open(m: RequestMap, key: RequesterKey, now: float, port: int) -> RequestSlot:
    assert m.route(key, now) == NeedListener(key)
    return m.add(key, ("192.168.50.2", port), now)


def test_one_listener_per_requester_and_origin():
    m = RequestMap(max_listeners=4)
    _open(m, K1, 0.0, 40001)
    _open(m, K2, 0.0, 40002)
    r = m.route(K1, 1.0)
    assert isinstance(r, RewriteTo) and r.slot.listener == ("192.168.50.2", 40001) and r.slot.requests == 2
    assert m.route(K2, 1.0).slot.listener == ("192.168.50.2", 40002)
    assert m.counters == Counter(request_listeners_opened=2, requests_rewritten=4)
    with pytest.raises(ValueError):
        m.add(K1, ("192.168.50.2", 40003), 1.0)


def test_a_full_map_passes_requests_unchanged_until_a_listener_ages_out():
    m = RequestMap(max_listeners=2, idle_timeout=60.0)
    _open(m, K1, 0.0, 40001)
    _open(m, K2, 10.0, 40002)
    k3 = RequesterKey("o3", "10.0.0.3", 1)
    full = PassUnchanged(k3, Unmapped.FULL)
    assert m.route(k3, 20.0) == full and m.route(k3, 59.9) == full
    assert m.counters["requests_unmapped_full"] == 2
    with pytest.raises(ValueError):
        m.add(k3, ("x", 1), 20.0)
    assert m.next_expiry() == 60.0
    assert m.route(k3, 60.0) == NeedListener(k3)  # K1 idle for 60 s: gone
    assert m.get(K1) is None and m.counters["request_listeners_expired"] == 1


def test_a_failed_listener_is_not_retried_for_every_request():
    m = RequestMap(listener_retry=1.0)
    assert m.route(K1, 5.0) == NeedListener(K1)
    m.listener_failed(5.0)
    assert m.route(K1, 5.5) == PassUnchanged(K1, Unmapped.LISTENER_FAILED)
    assert m.route(K2, 5.9) == PassUnchanged(K2, Unmapped.LISTENER_FAILED)
    assert m.route(K1, 6.0) == NeedListener(K1)
    assert m.counters == Counter(request_listeners_failed=1, requests_unmapped_failed=3)


def test_requests_and_responders_keep_a_listener_alive():
    m = RequestMap(max_listeners=4, idle_timeout=60.0, max_responders=2)
    s = _open(m, K1, 0.0, 40001)
    m.route(K1, 50.0)
    assert m.expire(100.0) == [] and m.next_expiry() == 110.0
    assert m.responder_connected(s, 105.0) and s.responders == 1 == m.responders
    assert m.responder_connected(s, 105.0) and not m.responder_connected(s, 105.0)
    assert m.counters["responders_refused_busy"] == 1
    assert m.expire(1000.0) == [] and m.next_expiry() == float("inf")  # responders connected
    m.responder_closed(s, 1000.0)
    assert m.expire(1059.0) == []
    m.responder_closed(s, 1001.0)
    m.responder_closed(s, 1001.0)  # (one too many: ignored)
    assert m.responders == 0 and m.next_expiry() == 1061.0 and m.expire(1061.0) == [s] and len(m) == 0
    assert not m.responder_connected(s, 1062.0) and m.counters["responders_refused_unknown"] == 1


def test_responders_are_bounded_on_all_listeners_together():
    m = RequestMap(max_responders=10, max_responders_total=3)
    a, b = _open(m, K1, 0.0, 1), _open(m, K2, 0.0, 2)
    assert [m.responder_connected(x, 1.0) for x in (a, b, a, b)] == [True, True, True, False]
    m.responder_closed(a, 2.0)
    assert m.responder_connected(b, 2.0) and m.responders == 3


def test_forget_origin_removes_its_listeners_and_a_new_one_starts_clean():
    m = RequestMap()
    old = _open(m, K1, 0.0, 1)
    _open(m, K2, 0.0, 2)
    assert m.responder_connected(old, 1.0) and m.responders == 1
    assert m.forget_origin(K1.origin) == [old] and m.get(K2) and len(m) == 1 and m.responders == 0
    assert m.next_expiry() == 600.0
    new = _open(m, K1, 2.0, 3)
    m.responder_closed(old, 3.0)  # the old listener's responder leaving does not touch the new one
    assert m.responder_connected(new, 3.0) and new.responders == 1 and m.responders == 1
    assert not m.responder_connected(old, 3.0)


def test_ten_thousand_hostile_requesters_stay_bounded():
    m = RequestMap(max_listeners=256, idle_timeout=600.0)
    rng = random.Random(1)
    now = 0.0
    for i in range(10_000):
        key = RequesterKey("origin", f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", rng.randint(1, 65535))
        r = m.route(key, now)
        if isinstance(r, NeedListener):
            m.add(key, ("192.168.50.2", 30000 + len(m)), now)
        now += 0.01  # 100 s in all: nothing ages out
    assert len(m) == 256
    assert m.counters["request_listeners_opened"] == 256 and m.counters["requests_unmapped_full"] == 10_000 - 256
    assert len(m.expire(now + 600.0)) == 256 and len(m) == 0


@pytest.mark.parametrize("kw", [dict(max_listeners=0), dict(idle_timeout=0), dict(max_responders=0),
                                dict(max_responders_total=0), dict(listener_retry=-1)])
def test_request_map_bounds_are_checked(kw):
    with pytest.raises(ValueError):
        RequestMap(**kw)


# --------------------------------------------------------------------------- RequesterTable


def test_only_requesters_seen_in_that_origin_are_allowed():
    t = RequesterTable()
    assert t.saw("s1", "10.0.0.1", 14391, 0.0)
    assert t.allows("s1", "10.0.0.1", 14391, 1.0)
    assert not t.allows("s2", "10.0.0.1", 14391, 1.0)  # another origin session
    assert not t.allows("s1", "10.0.0.1", 14392, 1.0)
    assert not t.allows("s1", "127.0.0.1", 22, 1.0)
    assert t.counters == Counter(requesters_recorded=1, responses_allowed=1, responses_refused=3)


def test_requesters_age_out_and_a_new_request_refreshes():
    t = RequesterTable(idle_timeout=60.0)
    t.saw("s1", "10.0.0.1", 1, 0.0)
    t.saw("s1", "10.0.0.2", 2, 10.0)
    t.saw("s1", "10.0.0.1", 1, 30.0)  # seen again
    assert t.next_expiry() == 70.0
    assert not t.allows("s1", "10.0.0.2", 2, 70.0) and t.allows("s1", "10.0.0.1", 1, 70.0)
    assert t.expire(70.0) == 1 and len(t) == 1 and t.next_expiry() == 90.0
    assert not t.allows("s1", "10.0.0.1", 1, 90.0) and t.expire(90.0) == 1
    assert t.next_expiry() == float("inf") and t.counters["requesters_expired"] == 2


def test_requester_bounds_per_origin_and_in_all():
    t = RequesterTable(max_per_origin=2, max_requesters=3, idle_timeout=60.0)
    assert t.saw("a", "10.0.0.1", 1, 0.0) and t.saw("a", "10.0.0.2", 1, 0.0)
    assert not t.saw("a", "10.0.0.3", 1, 1.0)  # the origin has 2
    assert t.saw("b", "10.0.0.1", 1, 1.0)
    assert not t.saw("c", "10.0.0.1", 1, 2.0)  # 3 in all
    assert t.saw("a", "10.0.0.1", 1, 3.0)  # known: refreshed, not counted twice
    assert t.counters["requesters_unrecorded_full"] == 2 and len(t) == 3
    assert not t.allows("a", "10.0.0.3", 1, 3.0)
    assert t.saw("c", "10.0.0.1", 1, 60.0)  # ("a", 10.0.0.2) aged out: room again
    assert t.forget_origin("a") == 1 and t.saw("a", "10.0.0.9", 1, 61.0) and len(t) == 3


def test_ten_thousand_hostile_requesters_in_one_origin_stay_bounded():
    t = RequesterTable(max_per_origin=64, max_requesters=4096)
    for i in range(10_000):
        t.saw("s", f"10.0.{i >> 8 & 255}.{i & 255}", 1000 + i, i * 0.001)
    assert len(t) == 64 and t.counters["requesters_unrecorded_full"] == 10_000 - 64
    assert t.allows("s", "10.0.0.0", 1000, 20.0) and not t.allows("s", "10.0.39.15", 1000 + 9999, 20.0)


# --------------------------------------------------------------------------- destinations


@pytest.mark.parametrize("ip, endpoint, ok", [
    ("10.1.2.3", "10.0.0.1", True),
    ("192.168.1.20", "0.0.0.0", True),
    ("127.0.0.1", "10.0.0.1", False),  # the router's own host, on the word of another TRD
    ("127.0.0.1", "127.0.0.1", True),  # an endpoint on loopback: its TRD is loopback
    ("0.0.0.0", "127.0.0.1", False),
    ("239.1.2.3", "10.0.0.1", False),
    ("255.255.255.255", "10.0.0.1", False),
    ("240.0.0.1", "10.0.0.1", False),
    ("10.1.2", "10.0.0.1", False),
    ("::1", "::1", False),
])
def test_deliverable_addresses(ip, endpoint, ok):
    assert deliverable_address(ip, endpoint) is ok


@settings(max_examples=1, phases=[Phase.generate], deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(S.lbmc_message(header=st.one_of(*[S._fixed(c) for c in C.HEADER_TYPES.values()])),
                min_size=40, max_size=40), S.ipv4, st.integers(1, 0xFFFF))
def test_random_rewritten_messages_match_tshark(tmp_path, msgs, ip, port):
    """40 random messages (typed headers only), each answer header rewritten, one tshark run."""
    wire = [C.encode(C.Message(C.MESSAGE, 1, 1, b"first"))]
    for m in msgs:
        b = C.encode(m)
        for which in ANSWER_HEADERS:
            b = rewrite_answer_address(b, which, ip, port)
        wire.append(b)
    pcap = tmp_path / "random.pcap"
    write_lbttcp_pcap(pcap, [(True, s) for s in segments(wire)])
    frames = run_tshark_lbmc(pcap)
    layers = [layer for f in frames for layer in f.lbmc]
    assert [compare_lbmc(layer, C.decode(b)) for layer, b in zip(layers, wire, strict=True)] == [[]] * len(wire)


def _uim(domain=9, ip="10.9.0.5", hops=None, came_from=None, next_router="r2", max_hop_count=100):
    return route_uim(domain, ip, hops=hops, came_from=came_from, served=(1, 2), next_router=next_router,
                     endpoint_ip="10.1.0.1", max_hop_count=max_hop_count)


def test_uim_routing_decisions():
    assert _uim() == ForwardUim("r2", 0)  # entered here
    assert _uim(hops=0, came_from="r0") == ForwardUim("r2", 1)
    assert _uim(domain=2, ip="10.2.0.9", hops=4, came_from="r0") == DeliverUim()
    assert _uim(domain=2, ip="127.0.0.1", hops=4, came_from="r0") == RefuseUim(UimRefusal.NOT_DELIVERABLE)
    assert _uim(next_router=None) == RefuseUim(UimRefusal.UNREACHABLE)
    assert _uim(hops=3, came_from="r2") == RefuseUim(UimRefusal.BACK)


def test_uim_hop_limit_ends_loops():
    """A stream arriving with hops h has crossed h + 1 links; passed on, h + 2."""
    assert _uim(hops=98, came_from="r0") == ForwardUim("r2", 99)  # its 100th link
    assert _uim(hops=99, came_from="r0") == RefuseUim(UimRefusal.HOP_LIMIT)
    assert _uim(max_hop_count=1) == ForwardUim("r2", 0)
    assert _uim(hops=0, came_from="r0", max_hop_count=1) == RefuseUim(UimRefusal.HOP_LIMIT)
    # a routing loop r1 -> r2 -> r3 -> r1 ...: every router forwards, the hops grow, it ends
    hops, n = None, 0
    while isinstance(d := _uim(hops=hops, came_from=None if hops is None else "elsewhere"), ForwardUim):
        hops, n = d.hops, n + 1
    assert d == RefuseUim(UimRefusal.HOP_LIMIT) and n == 100


@given(st.lists(st.tuples(st.sampled_from(["route", "connect", "close", "expire", "forget", "fail"]),
                          st.integers(0, 7), st.floats(0, 30)), max_size=120))
@settings(max_examples=200)
def test_request_map_invariants_under_random_operations(ops):
    """Whatever happens, in whatever order: never more listeners or responders than the
    bounds, the counts add up, and nothing idle outlives idle_timeout past an expire."""
    m = RequestMap(max_listeners=3, idle_timeout=50.0, max_responders=2, max_responders_total=4,
                   listener_retry=5.0)
    keys = [RequesterKey(i % 3, f"10.0.0.{i}", 1000 + i) for i in range(8)]
    taken: list[RequestSlot] = []  # responder connections the map took
    now = 0.0
    for op, i, dt in ops:
        now += dt
        key = keys[i]
        if op == "route":
            r = m.route(key, now)
            if isinstance(r, NeedListener):
                m.add(key, ("192.168.0.1", 2000 + i), now)
        elif op == "connect" and m.get(key) is not None:
            s = m.get(key)
            if m.responder_connected(s, now):
                taken.append(s)
        elif op == "close":
            if taken:
                m.responder_closed(taken.pop(i % len(taken)), now)
        elif op == "expire":
            for s in m.expire(now):
                assert s.responders == 0 and s.last_used + 50.0 <= now
            assert all(s.responders or s.last_used + 50.0 > now for s in m.slots())
        elif op == "forget":
            m.forget_origin(i % 3)
        else:
            m.listener_failed(now)
        assert len(m) <= 3
        assert all(s.responders <= 2 for s in m.slots())
        assert m.responders == sum(s.responders for s in m.slots()) <= 4
        assert m.next_expiry() == min((s.last_used + 50.0 for s in m.slots() if not s.responders),
                                      default=float("inf"))


def _full(model: dict, origin: int) -> bool:
    return sum(k[0] == origin for k in model) >= 3 or len(model) >= 5


@given(st.lists(st.tuples(st.sampled_from(["saw", "allows", "expire", "forget"]), st.integers(0, 9),
                          st.floats(0, 30)), max_size=150))
@settings(max_examples=200)
def test_requester_table_invariants_under_random_operations(ops):
    """A model: allowed exactly when seen in that origin within idle_timeout and recorded."""
    t = RequesterTable(max_per_origin=3, max_requesters=5, idle_timeout=40.0)
    model: dict[tuple, float] = {}
    now = 0.0
    for op, i, dt in ops:
        now += dt
        origin, ip, port = i % 3, f"10.0.0.{i}", 1000 + i
        if op == "saw":
            key = (origin, ip, port)
            fits = key in model
            if not fits:
                if _full(model, origin):  # the table expires what it can before it refuses
                    model = {k: v for k, v in model.items() if v + 40.0 > now}
                fits = not _full(model, origin)
            assert t.saw(origin, ip, port, now) is fits
            if fits:
                model[key] = now
        elif op == "allows":
            want = (origin, ip, port) in model and model[(origin, ip, port)] + 40.0 > now
            assert t.allows(origin, ip, port, now) is want
        elif op == "expire":
            t.expire(now)
            model = {k: v for k, v in model.items() if v + 40.0 > now}
        else:
            t.forget_origin(origin)
            model = {k: v for k, v in model.items() if k[0] != origin}
        assert len(t) <= 5 and len(t) == len(model)


# --------------------------------------------------------------------------- spares, and the message path's rules


def test_spare_listeners_answer_new_requesters_at_once():
    m = RequestMap(max_listeners=3, spare_listeners=2, idle_timeout=60.0)
    assert m.spares_wanted(0.0) == 2
    assert m.map_request(K1, 0.0) == PassUnchanged(K1, Unmapped.NO_LISTENER_READY)  # none open yet
    m.add_spare(("192.168.50.2", 40001))
    m.add_spare(("192.168.50.2", 40002))
    assert m.spares_wanted(0.0) == 0
    r = m.map_request(K1, 1.0)
    assert isinstance(r, RewriteTo) and r.slot.listener == ("192.168.50.2", 40001)
    assert m.map_request(K1, 2.0).slot is r.slot and m.take_added() == [r.slot] and m.take_added() == []
    assert m.spares_wanted(2.0) == 1  # one spare left, room for two more listeners
    m.map_request(K2, 3.0)
    assert m.spares_wanted(3.0) == 1  # room for one more listener: one spare at most
    m.add_spare(("192.168.50.2", 40003))
    k3 = RequesterKey("o3", "10.0.0.3", 1)
    assert isinstance(m.map_request(k3, 4.0), RewriteTo) and len(m) == 3 and m.spares_wanted(4.0) == 0
    k4 = RequesterKey("o4", "10.0.0.4", 1)
    assert m.map_request(k4, 5.0) == PassUnchanged(k4, Unmapped.FULL)
    # full: route expires the oldest to make room and hands it back to be closed
    m.add_spare(("192.168.50.2", 40004))
    r = m.map_request(k4, 62.0)
    assert isinstance(r, RewriteTo) and r.slot.listener == ("192.168.50.2", 40004)
    assert [s.listener for s in m.take_expired()] == [("192.168.50.2", 40001)]
    assert m.counters["requests_unmapped_waiting"] == 1 and m.counters["requests_unmapped_full"] == 1
    m.spare_failed(70.0)
    assert m.spares_wanted(70.5) == 0 and m.counters["request_listeners_failed"] == 1
    assert m.take_spares() == [] and m.spares() == []
    k0 = RequesterKey("o5", "10.0.0.5", 0)
    assert m.map_request(k0, 71.0) == PassUnchanged(k0, Unmapped.NO_PORT)
    assert m.counters["requests_unmapped_no_port"] == 1


def test_the_message_path_maps_each_requester_and_records_them_at_the_origin():
    from router.core.message_path import CountRequests, MapRequests, MessagePath, RecordRequesters

    def req(q, ip, port):
        return C.data_message(1, q, b"?", C.RequestHeader(qidx=q, port=port, ipaddr=ip))

    run = lbmc_stream.MessageRun.of([req(1, "10.0.0.1", 1000), C.data_message(1, 2, b"x"), req(3, "10.0.0.2", 2000),
                           req(4, "10.0.0.1", 1000)])
    table = RequesterTable(idle_timeout=30.0)
    origin_side = MessagePath([RecordRequesters(table, "sess")])
    assert origin_side.run(run, 5.0) is run and len(table) == 2
    assert table.allows("sess", "10.0.0.2", 2000, 34.9) and not table.allows("sess", "10.0.0.3", 2000, 6.0)
    assert not table.allows("other", "10.0.0.2", 2000, 6.0) and not table.allows("sess", "10.0.0.2", 2000, 35.0)
    m = RequestMap(spare_listeners=4)
    for port in (40001, 40002):
        m.add_spare(("192.168.50.2", port))
    out = MessagePath([MapRequests(m, "proxy-7")]).run(run, 6.0).messages()
    got = [C.decode(b).header(C.RequestHeader) for b in out]
    assert [(h.qidx, h.ipaddr, h.port) for h in got if h] == [(1, "192.168.50.2", 40001), (3, "192.168.50.2", 40002),
                                                             (4, "192.168.50.2", 40001)]
    assert out[1] == run.messages()[1] and [len(b) for b in out] == [len(b) for b in run.messages()]
    assert {s.key for s in m.slots()} == {RequesterKey("proxy-7", "10.0.0.1", 1000),
                                          RequesterKey("proxy-7", "10.0.0.2", 2000)}
    counted = Counter()
    assert MessagePath([CountRequests(counted, "requests_unmapped_peer")]).run(run) is run
    assert counted == Counter(requests_unmapped_peer=3)
