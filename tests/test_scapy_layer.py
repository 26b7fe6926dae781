"""The scapy layer lbmr_proto.scapy.LBMR: crafting, dissection, port binding,
the real UM 6.14 capture, malformed payloads and header overrides."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, UDP
from scapy.packet import Raw
from scapy.utils import rdpcap

import lbmr_proto as L
from lbmr_proto.scapy import LBMR

CAPTURE = Path(__file__).resolve().parents[1].parent / "shared" / "captures" / "um614-multicast-tr.pcap"

LBTRM = L.LbtrmTransport("10.0.0.1", "239.1.2.3", 0x12345678, 14400, 14390)


def _normal() -> L.Packet:
    return L.Packet(
        type=0, version=1,
        tqrs=[L.TQR("quotes.AAPL"), L.TQR("")],
        tirs=[
            L.TIR("AB", LBTRM, ttl=3, index=1),
            L.TIR("AB", LBTRM, index=2, options=[
                L.OtidOption(otid=bytes(range(32))),
                L.ExFuncOption(src_tcp_port=14371, src_ip_addr="10.0.0.2", functionality_flags=6),
                L.DomainIdOption(domain_id=5),
            ]),
            L.TIR("tcp.topic", L.TcpTransport("10.1.1.1", 14371), index=3, options=[]),
            L.TIR("tcp.sess", L.TcpSessionTransport("10.1.1.2", 0xABCDEF01, 14372), index=4),
            L.TIR("ru", L.LbtruSessionTransport("10.2.2.2", 7, 14380), index=5),
            L.TIR("ipc", L.LbtipcTransport(0xC0A80001, 99, 4), index=6),
            L.TIR("smx", L.LbtsmxTransport(1, 2, 3), index=7),
            L.TIR("rdma", L.LbtrdmaTransport("10.3.3.3", 8, 14390), index=8),
            L.TIR("pgm", L.UnknownTransport(0x11, b"\x01\x02\x03"), index=9,
                  options=[L.UnknownTirOption(0x7E, 0, b"xyz")]),
        ],
        options=[L.SourceIdOption(src_id=b"12345678"), L.VersionOption(version=2)],
    )


PACKETS = {
    "normal": _normal(),
    "wc_tqr": L.Packet(type=1, wc_tqrs=[L.WcTQR("^quotes\\..*", 1), L.WcTQR("a.b", 2)],
                       tirs=[L.TIR("AB", LBTRM, index=1)]),
    "resolver_keepalive": L.Packet(type=0),
    "rcv_alive": L.Packet(type=2),
    "src_alive": L.Packet(type=3, version=1, options=[L.LocalDomainOption(local_domain_id=9)]),
    "topic_mgmt": L.Packet(type=4, tmb=L.TopicMgmtBlock([L.TMR("t1", 1, 0x80), L.TMR("t2", 0)])),
    "queue_res": L.Packet(type=6, qqrs=[L.QQR("q1")], qirs=[L.QIR(
        "q1", "topic", 5, 2, 1, groups=[L.QirGroup(0, 1)], queues=[L.QirQueue("10.0.0.9", 1500, 0, 0)])]),
    "ext_trreq": L.Packet(type=7, ext=L.TopicResRequest(7)),
    "ext_route": L.Packet(type=7, version=1, ext=L.RemoteDomainRoute([1, 2], "10.0.0.5", 15000),
                          options=[]),
    "ext_pser": L.Packet(type=7, ext=L.Pser("topic", source_ip="10.0.0.1", store_ip="10.0.0.2",
                                            source_port=1, store_port=2)),
}


def _frame(pkt: LBMR, sport: int = 14402, dport: int = 15380) -> bytes:
    return bytes(IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=sport, dport=dport) / pkt)


@pytest.mark.parametrize("name", sorted(PACKETS))
def test_build_dissect_round_trip(name):
    p = PACKETS[name]
    wire = L.encode(p)
    assert L.encode(L.decode(wire)) == wire  # the fixture itself is well-formed
    layer = LBMR(packet=copy.deepcopy(p))
    assert bytes(layer) == wire
    got = IP(_frame(layer))
    assert LBMR in got and Raw not in got
    lb = got[LBMR]
    assert L.encode(lb.packet) == wire  # compare via encode: None lengths become values
    assert lb.packet == L.decode(wire)
    assert bytes(lb) == wire and lb.decode_error is None
    assert lb.type == p.type and lb.version == p.version
    assert lb.opts == (p.options is not None)
    assert lb.original == wire


def test_header_fields_are_the_wire_header():
    p = PACKETS["normal"]
    lb = IP(_frame(LBMR(packet=p)))[LBMR]
    assert (lb.version, lb.opts, lb.type, lb.count1, lb.count2) == (1, 1, 0, 2, 9)
    crafted = LBMR(packet=p)
    assert "count1" not in crafted.fields and crafted.count1 == 2  # derived, not explicit
    ext = LBMR(packet=PACKETS["ext_trreq"])
    assert (ext.type, ext.count1, ext.count2) == (7, L.ExtType.TOPIC_RES_REQUEST, 7)


def test_keyword_construction_matches_encode():
    tir = L.TIR("AB", LBTRM, index=1)
    assert bytes(LBMR(tqrs=["a", "b"])) == L.encode(L.Packet(tqrs=[L.TQR("a"), L.TQR("b")]))
    assert bytes(LBMR(tirs=[tir])) == L.encode(L.Packet(tirs=[tir]))
    assert bytes(LBMR(tqrs=[L.TQR("a")], tirs=[tir], options=[L.SourceIdOption()])) == L.encode(
        L.Packet(tqrs=[L.TQR("a")], tirs=[tir], options=[L.SourceIdOption()]))
    assert bytes(LBMR(wc_tqrs=["^a"])) == L.encode(L.Packet(type=1, wc_tqrs=[L.WcTQR("^a")]))
    assert bytes(LBMR(qqrs=["q"])) == L.encode(L.Packet(type=6, qqrs=[L.QQR("q")]))
    assert bytes(LBMR(ext=L.TopicResRequest(2))) == b"\x07\x04\x00\x02"
    assert bytes(LBMR(type="RCV_ALIVE")) == b"\x02\x00\x00\x00"
    assert bytes(LBMR(type=3, version=1)) == b"\x13\x00\x00\x00"
    assert bytes(LBMR()) == b"\x00\x00\x00\x00"
    assert LBMR(tqrs=["a"]).packet.tqrs == [L.TQR("a")]
    with pytest.raises(TypeError):
        LBMR(packet=L.Packet(), tqrs=["a"])


@settings(max_examples=40, deadline=None)
@given(tqrs=st.lists(st.text(alphabet="abcxyz./_-0123456789", max_size=20), max_size=5),
       indexes=st.lists(st.integers(0, 2**32 - 1), max_size=4), version=st.integers(0, 1),
       with_opts=st.booleans())
def test_random_normal_packets(tqrs, indexes, version, with_opts):
    p = L.Packet(version=version, tqrs=[L.TQR(t) for t in tqrs],
                 tirs=[L.TIR(f"t{i}", LBTRM, index=i) for i in indexes],
                 options=[L.SourceIdOption()] if with_opts else None)
    wire = L.encode(p)
    assert bytes(LBMR(packet=p)) == wire
    assert IP(_frame(LBMR(packet=p), 12965, 12965))[LBMR].packet == p


def test_accessors_and_summary():
    p = PACKETS["normal"]
    lb = IP(_frame(LBMR(packet=p)))[LBMR]
    assert lb.tqrs == p.tqrs and lb.tirs == p.tirs and lb.options == p.options
    assert lb.wc_tqrs == [] and lb.ext is None
    assert lb.mysummary() == "LBMR NORMAL tqrs=2 tirs=9"
    assert LBMR(wc_tqrs=["x"]).mysummary() == "LBMR WC_TQR wc_tqrs=1 tirs=0"
    assert LBMR(type=2).mysummary() == "LBMR RCV_ALIVE"
    text = lb.show(dump=True)
    assert "type      = NORMAL" in text
    assert "TQR 'quotes.AAPL'" in text
    assert "TIR 'AB' LBTRM 10.0.0.1:14390 -> 239.1.2.3:14400" in text
    assert "opts=[Otid, ExFunc, DomainId]" in text
    assert "\n" not in repr(lb)


def test_editing_the_packet_rebuilds_a_consistent_header():
    got = IP(_frame(LBMR(tqrs=["a"])))
    lb = got[LBMR]
    lb.packet.tqrs.append(L.TQR("b"))  # in-place edit must invalidate scapy's cache
    assert bytes(lb) == L.encode(L.Packet(tqrs=[L.TQR("a"), L.TQR("b")]))
    lb.packet = L.Packet(type=3)
    assert bytes(lb) == b"\x03\x00\x00\x00"
    clone = got.copy()
    clone[LBMR].packet.tqrs.append(L.TQR("c"))
    assert lb.packet == L.Packet(type=3)


@pytest.mark.parametrize(("sport", "dport", "is_lbmr"), [
    (14402, 12965, True), (12965, 40000, True), (40000, 15380, True), (15380, 14402, True),
    (12965, 12965, True), (40000, 40001, False), (14402, 15381, False),
])
def test_port_binding(sport, dport, is_lbmr):
    got = IP(_frame(LBMR(tqrs=["a"]), sport, dport))
    assert (LBMR in got) is is_lbmr
    if not is_lbmr:
        assert got[Raw].load == b"\x00\x01\x00\x00a\x00"


def test_default_ports_when_crafting():
    frame = IP() / UDP() / LBMR(tqrs=["a"])
    assert (frame[UDP].sport, frame[UDP].dport) == (12965, 12965)
    assert LBMR in IP(bytes(frame))
    assert IP(bytes(IP() / UDP(dport=15380) / LBMR(type=2)))[UDP].dport == 15380


@pytest.fixture(scope="module")
def capture():
    assert CAPTURE.is_file(), CAPTURE
    return rdpcap(str(CAPTURE))


def test_real_capture(capture):
    assert len(capture) == 12058
    frames = [f for f in capture if UDP in f and f[UDP].dport == 12965]
    assert len(frames) == 179
    types: dict[int, int] = {}
    tirs = 0
    for f in frames:
        u = f[UDP]
        payload = u.original[8:u.len]
        assert LBMR in f, f.summary()
        lb = f[LBMR]
        assert lb.decode_error is None and Raw not in f
        expected = L.decode(payload)
        assert lb.packet == expected and L.encode(lb.packet) == payload
        assert bytes(lb) == payload
        assert (lb.version, lb.opts) == (1, 1)
        types[lb.packet.type] = types.get(lb.packet.type, 0) + 1
        tirs += len(lb.tirs)
    assert types == {0: 161, 1: 18}
    assert tirs == 141
    other = [f for f in capture if UDP in f and 12965 not in (f[UDP].sport, f[UDP].dport)
             and 15380 not in (f[UDP].sport, f[UDP].dport)]
    assert other and not any(LBMR in f for f in other)


@pytest.mark.parametrize("payload", [
    b"\x00\x05\x00\x00abc",  # 5 TQRs announced, one unterminated name
    b"\x05\x00\x00\x00",  # type 5 is undefined
    b"\x20\x00\x00\x00",  # version 2
    b"\x02\x01\x00\x00",  # keepalive with a count
    b"\x00\x00\x00\x01AB\x00\x10\x10",  # TIR header truncated
    b"\x01",  # shorter than the header
])
def test_malformed_payload_dissects(payload):
    got = IP(_frame(Raw(payload)))  # UDP(dport=15380) -> LBMR
    assert LBMR in got
    lb = got[LBMR]
    assert lb.packet is None
    with pytest.raises(L.LBMRDecodeError) as exc:
        L.decode(payload)
    assert lb.decode_error == str(exc.value)
    assert bytes(lb) == payload
    assert lb.tirs == [] and lb.mysummary() == "LBMR (undecodable)"
    lb.show(dump=True)
    repr(got)
    if len(payload) >= 4:
        assert (lb.count1, lb.count2) == (payload[1], int.from_bytes(payload[2:4], "big"))
        assert lb.type == payload[0] & 7
    if len(payload) < 4:  # not even a header: everything is Raw
        assert lb[Raw].load == payload
    elif len(payload) > 4:  # the bytes after the header are Raw
        assert lb[Raw].load == payload[4:]
    else:
        assert Raw not in lb
    assert lb.copy().decode_error == lb.decode_error


def test_empty_udp_payload_has_no_lbmr_layer():
    assert LBMR not in IP(_frame(Raw(b"")))


def test_standalone_malformed_layer():
    lb = LBMR(b"\x00\x05\x00\x00abc")
    assert lb.decode_error and "not NUL-terminated" in lb.decode_error
    assert (lb.version, lb.opts, lb.type, lb.count1, lb.count2) == (0, 0, 0, 5, 0)
    assert lb[Raw].load == b"abc" and bytes(lb) == b"\x00\x05\x00\x00abc"


def test_explicit_header_override():
    p = L.Packet(tqrs=[L.TQR("x")], tirs=[L.TIR("AB", LBTRM, index=1)])
    wire = L.encode(p)
    lb = LBMR(packet=p, count2=7)
    raw = bytes(lb)
    assert raw[2:4] == b"\x00\x07" and raw[:2] == wire[:2] and raw[4:] == wire[4:]
    assert bytes(LBMR(packet=p, count1=0))[1] == 0
    assert bytes(LBMR(packet=p, version=2, opts=1, type=5))[0] == 0x2D
    assert bytes(LBMR(packet=p, type="WC_TQR"))[0] == 0x01
    assert bytes(LBMR(type=5)) == b"\x05\x00\x00\x00"  # not a packet type: raw header value
    got = IP(_frame(LBMR(packet=p, count2=7)))[LBMR]
    assert got.packet is None and got.count2 == 7 and got.decode_error


def test_encode_errors_surface_when_building():
    lb = LBMR(tqrs=["x" * 300])
    with pytest.raises(L.LBMREncodeError):
        bytes(lb)
