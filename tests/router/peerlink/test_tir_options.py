"""The ADVERTISEMENT's TIR options field and capability TIR_OPTIONS (router/PEERLINK.md
§5.7, §5.13): the bytes the spec shows, hypothesis round trips with the session fields,
every hostile variant refused (other option kinds, oversize, duplicates, wrong lengths,
truncation, with a withdrawal), and the capability negotiated so that an older peer never
receives the field and one that sends it without the capability is a protocol error."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbmr_proto import (
    CostOption,
    DomainIdOption,
    ExFuncOption,
    LateJoinOption,
    OtidOption,
    UmeOption,
    UmeStoreOption,
)
from router.peerlink import (
    ADVERT_TIR_OPTIONS_MAX,
    DEFAULT_CAPABILITIES,
    Advertisement,
    Capability,
    FrameDecodeError,
    FrameEncodeError,
    FrameType,
    PeerConnection,
    ProtocolError,
    RouterIdentity,
    State,
    check_tir_options,
    decode,
    encode,
    encode_raw,
)

OTID = bytes(range(32))
LATE_JOIN = LateJoinOption(0, 14391, 0, "10.29.4.121", 1, 0, 0)
EXFUNC = ExFuncOption(0x8000, 14391, 0, "10.29.4.121", 1)
UME = UmeOption(0x4000 | 0x2000, 14567, 14391, "10.29.4.200", "10.29.4.121", 9, 1, 100, 1)
SPEC_OPTIONS = LATE_JOIN.encode() + EXFUNC.encode()


def connected(a_caps: int, b_caps: int):
    a = PeerConnection("initiator", RouterIdentity("a", (1,), a_caps), nonce=1)
    b = PeerConnection("acceptor", RouterIdentity("b", (2,), b_caps), nonce=2)
    b.start(0.0)
    b.receive_data(a.start(0.0), 0.0)
    a.receive_data(b.data_to_send(), 0.0)
    b.receive_data(a.data_to_send(), 0.0)
    assert a.state is b.state is State.CONNECTED
    return a, b


# --------------------------------------------------------------------------- codec


def test_the_spec_shows_the_bytes_the_encoder_writes():
    spec = (Path(__file__).resolve().parents[3] / "router" / "PEERLINK.md").read_text()
    section = spec[spec.index("### 5.7 ADVERTISEMENT"):spec.index("### 5.7a")]
    data = bytearray()
    for line in section.splitlines():
        m = re.match(r"    (sender    -> |\s{13})((?:[0-9a-f]{2} )+)", line + " ")
        if m:
            data += bytes.fromhex(m.group(2))
    f = Advertisement("md.x", 1, OTID, 0, 7, tir_options=SPEC_OPTIONS)
    assert bytes(data) == encode(f)
    assert decode(bytes(data)) == f


def test_the_field_sits_after_the_topic_and_before_the_session_fields():
    f = Advertisement("md.x", 1, OTID, 0, 7, session=5, origin_session_id=9, tir_options=SPEC_OPTIONS)
    plain = Advertisement("md.x", 1, OTID, 0, 7, session=5, origin_session_id=9)
    p, q = f.payload(), plain.payload()
    assert p[9] == 0x02 and q[9] == 0
    assert p[:9] == q[:9] and p[10:50] == q[10:50]  # up to the topic's end
    assert p[50:52] == struct.pack(">H", 40) and p[52:92] == SPEC_OPTIONS
    assert p[92:] == q[50:]  # session, origin session id: as before
    assert decode(encode(f)) == f


options_field = st.lists(st.sampled_from([UME, LATE_JOIN, EXFUNC]), min_size=1, max_size=3,
                         unique_by=lambda o: o.CODE).map(lambda os: b"".join(o.encode() for o in os))


@given(options_field, st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1), st.integers(0, 0xFFFF))
@settings(max_examples=200)
def test_round_trip(opts, session, sid, hops):
    f = Advertisement("t", 3, OTID, 1, 11, False, hops, session, sid if session else 0, opts)
    data = encode(f)
    assert decode(data) == f and encode(decode(data)) == data
    assert len(opts) <= ADVERT_TIR_OPTIONS_MAX


@given(st.binary(min_size=0, max_size=120))
@settings(max_examples=500)
def test_arbitrary_option_bytes_are_accepted_only_when_valid(raw):
    """Any bytes after the flag: either a valid field (then it round-trips) or a clean
    FrameDecodeError, never anything else."""
    head = Advertisement("t", 3, OTID, 1, 11).payload()
    payload = head[:9] + b"\x02" + head[10:] + struct.pack(">H", len(raw)) + raw
    try:
        f = decode(encode_raw(FrameType.ADVERTISEMENT, payload))
    except FrameDecodeError:
        return
    assert f.tir_options == raw and check_tir_options(raw) == raw


def _field(raw: bytes, n: int | None = None) -> bytes:
    head = Advertisement("t", 3, OTID, 1, 11).payload()
    n = len(raw) if n is None else n
    return encode_raw(FrameType.ADVERTISEMENT, head[:9] + b"\x02" + head[10:] + struct.pack(">H", n) + raw)


@pytest.mark.parametrize("raw, n, words", [
    (UmeStoreOption(0, 0, 14567, 0, "10.0.0.1", 1).encode(), None, "not carried"),
    (CostOption(0, 1, 1).encode(), None, "not carried"),
    (OtidOption(0, OTID).encode(), None, "not carried"),
    (DomainIdOption(0, 7).encode(), None, "not carried"),
    (b"\x00\x04\x00\x04", None, "not carried"),  # a length option
    (LATE_JOIN.encode() + LATE_JOIN.encode(), None, "twice"),
    (LATE_JOIN.encode()[:20], None, "expected"),  # truncated option
    (b"\x04\x10" + bytes(14), None, "expected"),  # late join of 16 bytes
    (b"\x04", None, "truncated"),
    (b"", None, "1..72"),  # the flag with n = 0
    (UME.encode() + LATE_JOIN.encode() + EXFUNC.encode() + b"\x0e", None, "1..72"),  # 73 bytes
    (bytes(300), None, "1..72"),
    (SPEC_OPTIONS, 41, "truncated"),  # n past the payload
    (SPEC_OPTIONS, 39, "expected"),  # n short of the last option
])
def test_hostile_fields_are_refused(raw, n, words):
    with pytest.raises(FrameDecodeError, match=words):
        decode(_field(raw, n))


def test_a_withdrawal_carries_no_options():
    with pytest.raises(FrameEncodeError, match="withdrawal"):
        encode(Advertisement("t", 3, OTID, 1, 11, True, tir_options=SPEC_OPTIONS))
    head = Advertisement("t", 3, OTID, 1, 11, True).payload()
    payload = head[:9] + b"\x03" + head[10:] + struct.pack(">H", 40) + SPEC_OPTIONS
    with pytest.raises(FrameDecodeError, match="withdrawal"):
        decode(encode_raw(FrameType.ADVERTISEMENT, payload))


@pytest.mark.parametrize("raw", [
    DomainIdOption(0, 7).encode(), LATE_JOIN.encode() * 2, b"\x04\x18", bytes(80)])
def test_the_encoder_refuses_what_the_decoder_would(raw):
    with pytest.raises(FrameEncodeError):
        encode(Advertisement("t", 3, OTID, 1, 11, tir_options=raw))


# --------------------------------------------------------------------------- capability


def test_the_capability_is_the_next_free_bit_and_announced():
    assert Capability.TIR_OPTIONS == 0x100
    assert Capability.TIR_OPTIONS > max(c for c in Capability if c < Capability.TIR_OPTIONS)
    assert DEFAULT_CAPABILITIES & Capability.TIR_OPTIONS


def test_negotiated_the_options_cross():
    f = Advertisement("md.x", 1, OTID, 0, 7, session=5, tir_options=SPEC_OPTIONS)
    a, b = connected(DEFAULT_CAPABILITIES, DEFAULT_CAPABILITIES)
    assert b.receive_data(a.send(f, 1.0), 1.0) == [f]


@pytest.mark.parametrize("old_side", ["sender", "receiver"])
def test_an_older_peer_never_receives_the_field(old_side):
    """Towards (or from) a router without TIR_OPTIONS the field is left out: the bytes on
    the wire are those of a router before the capability, the rest of the frame intact."""
    old = DEFAULT_CAPABILITIES & ~Capability.TIR_OPTIONS
    f = Advertisement("md.x", 1, OTID, 0, 7, session=5, origin_session_id=9, tir_options=SPEC_OPTIONS)
    plain = Advertisement("md.x", 1, OTID, 0, 7, session=5, origin_session_id=9)
    a, b = connected(old, DEFAULT_CAPABILITIES) if old_side == "sender" else connected(DEFAULT_CAPABILITIES, old)
    assert not a.capabilities & Capability.TIR_OPTIONS
    wire = a.send(f, 1.0)
    assert wire == encode(plain)
    assert b.receive_data(wire, 1.0) == [plain]


def test_options_from_a_peer_without_the_capability_are_a_protocol_error():
    old = DEFAULT_CAPABILITIES & ~Capability.TIR_OPTIONS
    a, b = connected(DEFAULT_CAPABILITIES, old)
    evs = a.receive_data(encode(Advertisement("md.x", 2, OTID, 0, 7, tir_options=SPEC_OPTIONS)), 1.0)
    assert isinstance(evs[0], ProtocolError) and "TIR_OPTIONS was not negotiated" in evs[0].reason
    assert a.state is State.CLOSED


def test_a_hostile_field_closes_the_link_with_a_protocol_error():
    a, b = connected(DEFAULT_CAPABILITIES, DEFAULT_CAPABILITIES)
    evs = a.receive_data(_field(CostOption(0, 1, 1).encode()), 1.0)
    assert isinstance(evs[0], ProtocolError) and "not carried" in evs[0].reason
