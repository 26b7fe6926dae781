"""encode/decode round trips and the strictness of the decoder."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lbmr_proto as L
from lbmr_proto.fast import scan

from . import strategies as S

SPEC_EXAMPLES = {
    # shared/spec/lbmr-wire-format.md section 12
    "rcv_alive": "02000000",
    "src_alive": "03000000",
    "resolver_keepalive": "00000000",
    "tqr": "00010000414200",
    "tir_lbtrm": "0000000141420010100000000000010a000001ef0102031234567838403836",
    "tir_domain_opt": "0000000141420090100000000000010004000c0d080000000000050a000001ef0102031234567838403836",
    "tqr_trailer": "08010000414200810c0000010203040506070880040010",
    "trreq": "07040007",
    "route": "170600020a0000053a98000000000018000000010000002",
}


@pytest.mark.parametrize("name", sorted(SPEC_EXAMPLES))
def test_spec_examples_round_trip(name):
    hx = SPEC_EXAMPLES[name]
    if len(hx) % 2:
        hx += "0"  # the route example's last domain id is 2
    b = bytes.fromhex(hx)
    p = L.decode(b)
    assert L.encode(p) == b
    assert scan(b).type == p.type


def test_spec_example_values():
    p = L.decode(bytes.fromhex(SPEC_EXAMPLES["tir_domain_opt"]))
    (tir,) = p.tirs
    assert tir.topic == "AB" and tir.index == 1
    assert tir.transport == L.LbtrmTransport("10.0.0.1", "239.1.2.3", 0x12345678, 14400, 14390)
    assert tir.options == [L.DomainIdOption(0, 5)]
    p = L.decode(bytes.fromhex(SPEC_EXAMPLES["tqr_trailer"]))
    assert p.tqrs == [L.TQR("AB")]
    assert p.options == [L.SourceIdOption(0, bytes(range(1, 9)))]


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(S.packet)
def test_round_trip_every_kind(pkt):
    b = L.encode(pkt)
    q = L.decode(b)
    assert L.encode(q) == b
    assert q.type == pkt.type
    # decoded objects equal the built ones up to fields the codec derives
    assert len(q.tirs) == len(pkt.tirs) and len(q.tqrs) == len(pkt.tqrs)
    for a, c in zip(pkt.tirs, q.tirs, strict=True):
        assert a == c
    assert q.options == pkt.options


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(S.packet)
def test_scan_agrees_with_decode_on_valid(pkt):
    b = L.encode(pkt)
    r = scan(b)
    q = L.decode(b)
    assert r.type == q.type and r.version == q.version
    if q.type in (0, 1):
        assert r.tirs_count == len(q.tirs)
        assert len(r.tirs) == len(q.tirs)
        for f, t in zip(r.tirs, q.tirs, strict=True):
            assert b[f.topic:f.topic_end].decode() == t.topic
            assert f.transport == t.transport.TYPE
            ip = getattr(t.transport, "ip", None)
            if ip is not None and t.transport.NAME != "UNKNOWN":
                assert ".".join(str(x) for x in b[f.addr:f.addr + 4]) == ip
            else:
                assert f.addr == -1
            port = getattr(t.transport, "port", getattr(t.transport, "src_ucast_port", None))
            if f.port >= 0:
                assert int.from_bytes(b[f.port:f.port + 2], "big") == port
            want = []
            for o in t.options or ():
                if isinstance(o, L.UmeOption):
                    want += [(o.src_tcp_addr, o.src_tcp_port), (o.store_tcp_addr, o.store_tcp_port)]
                elif isinstance(o, L.UmeStoreOption):
                    want.append((o.store_ip_addr, o.store_tcp_port))
                elif isinstance(o, (L.LateJoinOption, L.ExFuncOption, L.UlbOption)):
                    want.append((o.src_ip_addr, o.src_tcp_port))
            got = [(".".join(str(x) for x in b[a:a + 4]), int.from_bytes(b[q:q + 2], "big"))
                   for a, q in f.opt_pairs]
            assert got == want


def _outcome(fn, b):
    try:
        fn(b)
        return "ok"
    except L.LBMRDecodeError:
        return "error"


@st.composite
def mutated(draw):
    b = bytearray(L.encode(draw(S.packet)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.integers(0, 3))
        if op == 0 and b:
            i = draw(st.integers(0, len(b) - 1))
            b[i] = draw(S.u8)
        elif op == 1 and b:
            del b[draw(st.integers(0, len(b) - 1)):]
        elif op == 2:
            b[draw(st.integers(0, len(b))):0] = draw(st.binary(min_size=1, max_size=6))
        elif b:
            b[draw(st.integers(0, len(b) - 1))] ^= 1 << draw(st.integers(0, 7))
    return bytes(b)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.one_of(mutated(), st.binary(max_size=64)))
def test_only_decode_error_escapes_and_scan_agrees(b):
    got = _outcome(L.decode, b)  # anything but LBMRDecodeError fails the test
    assert _outcome(scan, b) == got
    if got == "ok":
        assert L.encode(L.decode(b)) == b


BAD = {
    "short": ("0001", 0),
    "version 2": ("20000000", 0),
    "type 5": ("05000000", 0),
    "tqr unterminated": ("000100004142", 4),
    "tir wrong tlen": ("00000001414200" "0008000000000001" + "00" * 8, 8),
    "stray bytes": ("0001000041420099", 7),
    "keepalive counts": ("02010000", 1),
    "trailer missing": ("0801000041420000000000", 7),
    # topic "AB", transport 0x80|TCP, tlen 6, ttl 0, index 0, then the options chunk at 15
    "tir opt not length first": ("00000001" "414200" "8006000000000000" "0d08000000000005" "0a0000010001", 15),
    "tir opt zero len": ("00000001" "414200" "8006000000000000" "0004000c" "0d00000000000005" "0a0000010001", 19),
    "name too long": ("00010000" + "41" * 256 + "00", 4),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_rejects_malformed_with_offset(case):
    hx, off = BAD[case]
    with pytest.raises(L.LBMRDecodeError) as ei:
        L.decode(bytes.fromhex(hx))
    assert ei.value.offset == off, ei.value
    with pytest.raises(L.LBMRDecodeError):
        scan(bytes.fromhex(hx))


def test_encode_rejects_bad_objects():
    with pytest.raises(L.LBMREncodeError):
        L.encode(L.Packet(0, tqrs=[L.TQR("x" * 256)]))
    with pytest.raises(L.LBMREncodeError):
        L.encode(L.Packet(0, tirs=[L.TIR("t", L.TcpTransport("300.0.0.1", 1))]))
    with pytest.raises(L.LBMREncodeError):
        L.encode(L.Packet(0, tirs=[L.TIR("t", L.TcpTransport("1.2.3.4", 70000))]))
    with pytest.raises(L.LBMREncodeError):
        L.encode(L.Packet(0, tqrs=[L.TQR("a\0b")]))


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.one_of(S.normal(), S.wc(), S.keepalive()))
def test_memoised_decode_returns_fresh_equal_records(pkt):
    b = L.encode(pkt)
    first = L.decode(b)
    second = L.decode(b)  # served from the whole-datagram memo
    assert second == first and L.encode(second) == b
    # mutating what one decode returned never leaks into the next
    first.tqrs.append(L.TQR("extra"))
    for t in first.tirs:
        t.topic = "changed"
        if t.options is not None:
            t.options.append(L.DomainIdOption(0, 1))
    if first.options is not None:
        first.options.clear()
    third = L.decode(b)
    assert third == second and L.encode(third) == b
    assert third.tirs is not second.tirs and all(x is not y for x, y in zip(third.tirs, second.tirs, strict=True))
