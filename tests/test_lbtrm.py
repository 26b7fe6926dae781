"""LBT-RM datagrams (lbmr_proto.lbtrm): encode, decode, header rewriting,
malformed input; byte layouts checked against the offsets Wireshark's
packet-lbtrm.c reads."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbmr_proto import lbtrm as RM

u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)


def test_data_layout():
    d = RM.encode_data(14390, 0xDEADBEEF, 7, 3, b"hello", flags=RM.FLAG_UNICAST_NAKS | RM.FLAG_RETRANSMISSION)
    assert d[:8] == bytes([0x00, 0x00]) + struct.pack("!HI", 14390, 0xDEADBEEF)
    assert d[8:20] == struct.pack("!IIBBH", 7, 3, 0xA0, 0, 0)
    assert d[20:] == b"hello"
    m = RM.decode(d)
    assert isinstance(m, RM.Data) and m.sqn == 7 and m.trail_sqn == 3 and m.retransmission
    assert m.header == RM.Header(RM.DATA, 14390, 0xDEADBEEF) and m.payload == b"hello"


def test_sm_nak_ncf_layout():
    sm = RM.encode_sm(1, 2, 3, 4, 5)
    assert sm[0] == 0x02 and len(sm) == 24 and sm[8:20] == struct.pack("!III", 3, 4, 5)
    assert RM.decode(sm) == RM.SessionMessage(RM.Header(RM.SM, 1, 2), 3, 4, 5, RM.FLAG_UNICAST_NAKS)
    nak = RM.encode_nak(14390, 9, [5, 6, 9])
    assert nak[0] == 0x03 and nak[8:12] == struct.pack("!HH", 3, 0) and nak[12:] == struct.pack("!3I", 5, 6, 9)
    assert RM.decode(nak) == RM.Nak(RM.Header(RM.NAK, 14390, 9), (5, 6, 9))
    ncf = RM.encode_ncf(14390, 9, 1, [5], reason=RM.NCF_RX_DELAY)
    assert ncf[0] == 0x04 and ncf[8:16] == struct.pack("!IHBB", 1, 1, 0, 0x20)
    assert RM.decode(ncf) == RM.Ncf(RM.Header(RM.NCF, 14390, 9), 1, (5,), RM.NCF_RX_DELAY)


@given(u16, u32, u16, u32, u32, st.binary(max_size=64))
def test_rewrite_header_changes_only_port_and_session(p1, s1, p2, s2, sqn, payload):
    d = RM.encode_data(p1, s1, sqn, 0, payload)
    out = RM.rewrite_header(d, p2, s2)
    assert out[8:] == d[8:] and out[:2] == d[:2]
    h = RM.parse_header(out)
    assert (h.ucast_port, h.session_id, h.type) == (p2, s2, RM.DATA)
    assert RM.rewrite_header(out, p1, s1) == d


@pytest.mark.parametrize("data, why", [
    (b"", "shorter than the 8-byte"),
    (b"\x10\x00\x00\x01\x00\x00\x00\x01" + bytes(12), "version 1"),
    (b"\x00\x00\x00\x01\x00\x00\x00\x01" + bytes(11), "DATA shorter"),
    (b"\x02\x00\x00\x01\x00\x00\x00\x01" + bytes(15), "SM shorter"),
    (b"\x03\x00\x00\x01\x00\x00\x00\x01" + struct.pack("!HH", 3, 0) + bytes(8), "announces 3"),
    (b"\x04\x00\x00\x01\x00\x00\x00\x01" + bytes(7), "NCF shorter"),
    (b"\x07\x00\x00\x01\x00\x00\x00\x01", "unknown packet type 7"),
])
def test_malformed(data, why):
    with pytest.raises(RM.LbtrmDecodeError, match=why):
        RM.decode(data)


@given(st.binary(max_size=80))
def test_decode_never_raises_anything_else(data):
    try:
        RM.decode(data)
    except RM.LbtrmDecodeError:
        pass


def test_encode_bounds():
    with pytest.raises(ValueError):
        RM.encode_nak(1, 1, [])
    with pytest.raises(ValueError):
        RM.encode_nak(1, 1, range(RM.MAX_NAKS + 1))
    with pytest.raises(ValueError):
        RM.encode_data(70000, 1, 0, 0, b"")
    assert len(RM.encode_nak(1, 1, range(RM.MAX_NAKS))) <= 1500 - 28
