"""The peer link's RESPONSE and UIM_ROUTED streams (router/PEERLINK.md §5.8, §5.13):
their STREAM_OPEN fields, byte for byte and as hypothesis round trips, malformed
payloads refused, and the capabilities RESPONSES and UIM_ROUTING negotiated so that a
connection never opens such a stream towards a peer that did not announce it, and a
peer that does not serve the kind refuses the stream (UNSUPPORTED_KIND) with the link
up."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.peerlink import (
    DEFAULT_CAPABILITIES,
    KIND_CAPABILITY,
    KIND_TARGET,
    Capability,
    FrameDecodeError,
    FrameEncodeError,
    FrameType,
    LocalProtocolError,
    PeerConnection,
    ProtocolError,
    RefuseCode,
    ResponseTarget,
    RoutedUimTarget,
    RouterIdentity,
    State,
    StreamData,
    StreamKind,
    StreamOpen,
    StreamRefuse,
    decode,
    encode,
    encode_raw,
    stream_kinds,
)
from router.peerlink.streams import (
    INITIAL_WINDOW,
    DataReceived,
    LocalStreamError,
    StreamAccepted,
    StreamError,
    StreamOpened,
    StreamRefused,
    StreamTable,
)

NEW = int(Capability.RESPONSES | Capability.UIM_ROUTING)
OLD = DEFAULT_CAPABILITIES & ~NEW  # a router of the versions before RESPONSE streams
u8, u16, u32 = (st.integers(0, 2**n - 1) for n in (8, 16, 32))
ipv4 = st.tuples(u8, u8, u8, u8).map(lambda t: ".".join(map(str, t)))
port = st.integers(1, 0xFFFF)
response_target = st.builds(ResponseTarget, ipv4, port)
uim_target = st.builds(RoutedUimTarget, st.integers(1, 2**32 - 1), ipv4, port, u16)
response_open = st.builds(StreamOpen, u32, u32, st.just(StreamKind.RESPONSE), u32, response_target)
uim_open = st.builds(StreamOpen, u32, u32, st.just(StreamKind.UIM_ROUTED), u32, uim_target)


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


@given(st.one_of(response_open, uim_open))
@settings(max_examples=300)
def test_round_trip(frame):
    data = encode(frame)
    assert len(data) == 12 + 13 + frame.target.SIZE == frame.wire_size()
    assert decode(data) == frame and encode(decode(data)) == data


def test_exact_layouts():
    """The bytes PEERLINK.md §5.8 shows."""
    resp = StreamOpen(3, 7, StreamKind.RESPONSE, 262144, ResponseTarget("10.29.4.121", 14391))
    assert encode(resp) == bytes.fromhex(
        "4c425250 01 20 00 00 00000013"  # header: STREAM_OPEN, 19 bytes
        "00000003 00000007 00040000 82"  # stream 3, advert 7, credit 256 KiB, RESPONSE
        "0a1d0479 3837")  # requester 10.29.4.121, port 14391
    uim = StreamOpen(5, 0, StreamKind.UIM_ROUTED, 262144, RoutedUimTarget(7, "192.168.1.20", 15001, 1))
    assert encode(uim) == bytes.fromhex(
        "4c425250 01 20 00 00 00000019"  # header: STREAM_OPEN, 25 bytes
        "00000005 00000000 00040000 83"  # stream 5, advert 0, credit 256 KiB, UIM_ROUTED
        "00000007 c0a80114 3a99 0001")  # domain 7, 192.168.1.20, port 15001, 1 hop


def test_the_spec_shows_the_same_bytes():
    """The two example STREAM_OPEN frames of PEERLINK.md §5.8 are what the encoder writes."""
    spec = (Path(__file__).resolve().parents[3] / "router" / "PEERLINK.md").read_text()
    section = spec[spec.index("### 5.8 STREAM_OPEN"):spec.index("### 5.9")]
    frames, cur = [], None
    for line in section.splitlines():
        m = re.match(r"    (opener    -> |\s{13})((?:[0-9a-f]{2} )+)", line + " ")
        if not m:
            continue
        if m.group(1).startswith("opener"):
            cur = bytearray()
            frames.append(cur)
        cur += bytes.fromhex(m.group(2))
    assert [bytes(f) for f in frames] == [
        encode(StreamOpen(3, 7, StreamKind.RESPONSE, 262144, ResponseTarget("10.29.4.121", 14391))),
        encode(StreamOpen(5, 0, StreamKind.UIM_ROUTED, 262144, RoutedUimTarget(7, "192.168.1.20", 15001, 1)))]


@pytest.mark.parametrize("bad", [
    StreamOpen(1, 1, StreamKind.RESPONSE),  # no target
    StreamOpen(1, 1, StreamKind.UIM_ROUTED, 0, ResponseTarget("1.2.3.4", 5)),  # the wrong one
    StreamOpen(1, 1, StreamKind.TCP, 0, ResponseTarget("1.2.3.4", 5)),  # a kind without one
    StreamOpen(1, 1, 0x99, 0, ResponseTarget("1.2.3.4", 5)),
    StreamOpen(1, 1, StreamKind.RESPONSE, 0, ResponseTarget("1.2.3.4", 0)),
    StreamOpen(1, 1, StreamKind.RESPONSE, 0, ResponseTarget("1.2.3.4", 65536)),
    StreamOpen(1, 1, StreamKind.RESPONSE, 0, ResponseTarget("1.2.3", 5)),
    StreamOpen(1, 1, StreamKind.RESPONSE, 0, ResponseTarget("::1", 5)),
    StreamOpen(1, 1, StreamKind.UIM_ROUTED, 0, RoutedUimTarget(0, "1.2.3.4", 5)),
    StreamOpen(1, 1, StreamKind.UIM_ROUTED, 0, RoutedUimTarget(2**32, "1.2.3.4", 5)),
    StreamOpen(1, 1, StreamKind.UIM_ROUTED, 0, RoutedUimTarget(1, "1.2.3.4", 5, 65536)),
])
def test_encode_errors(bad):
    with pytest.raises(FrameEncodeError):
        encode(bad)


HEAD = bytes.fromhex("00000001 00000002 00001000")


@pytest.mark.parametrize("payload, words", [
    (HEAD + b"\x82", "truncated"),
    (HEAD + b"\x82" + bytes.fromhex("0a000001 00"), "truncated"),
    (HEAD + b"\x82" + bytes.fromhex("0a000001 0050 00"), "trailing"),
    (HEAD + b"\x82" + bytes.fromhex("0a000001 0000"), "port 0"),
    (HEAD + b"\x83" + bytes.fromhex("00000000 0a000001 0050 0000"), "0 is invalid"),
    (HEAD + b"\x83" + bytes.fromhex("00000001 0a000001 0000 0000"), "0 is invalid"),
    (HEAD + b"\x83" + bytes.fromhex("00000001 0a000001 0050"), "truncated"),
    (HEAD + b"\x00" + b"\x00", "trailing"),  # TCP has no fields after the kind
])
def test_malformed_payloads_are_refused(payload, words):
    with pytest.raises(FrameDecodeError, match=words):
        decode(encode_raw(FrameType.STREAM_OPEN, payload))
    a, b = connected(DEFAULT_CAPABILITIES | NEW, DEFAULT_CAPABILITIES | NEW)
    evs = b.receive_data(encode_raw(FrameType.STREAM_OPEN, payload), 1.0)
    assert len(evs) == 1 and isinstance(evs[0], ProtocolError) and b.state is State.CLOSED


def test_an_unknown_kind_decodes_with_its_fields_ignored_and_is_refused():
    """A later kind's fields do not close the link of a router that does not know it."""
    f = decode(encode_raw(FrameType.STREAM_OPEN, HEAD + b"\x99" + b"later fields"))
    assert f == StreamOpen(1, 2, 0x99, 0x1000)
    t = StreamTable("acceptor", kinds=stream_kinds(-1))
    assert t.receive(f) == [StreamError(1, "stream kind 153 not supported")]
    assert t.frames_to_send() == [StreamRefuse(1, RefuseCode.UNSUPPORTED_KIND, "stream kind 153 not supported")]


@given(st.lists(st.one_of(response_open, uim_open, st.builds(StreamData, u32, st.binary(max_size=50))),
                min_size=1, max_size=8), st.data())
@settings(max_examples=100, deadline=None)
def test_random_chunkings_decode_identically(frames, data):
    wire = b"".join(encode(f) for f in frames)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(wire) - 1), max_size=10)) if len(wire) > 1 else []))
    a, b = connected(DEFAULT_CAPABILITIES | NEW, DEFAULT_CAPABILITIES | NEW)
    got = []
    for lo, hi in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        got += b.receive_data(wire[lo:hi], 1.0)
    assert got == frames and b.state is State.CONNECTED


# --------------------------------------------------------------------------- negotiation


def test_capability_bits_and_kinds():
    assert Capability.RESPONSES == 0x40 and Capability.UIM_ROUTING == 0x80
    assert StreamKind.RESPONSE == 0x82 and StreamKind.UIM_ROUTED == 0x83
    assert KIND_CAPABILITY[StreamKind.RESPONSE] is Capability.RESPONSES
    assert KIND_CAPABILITY[StreamKind.UIM_ROUTED] is Capability.UIM_ROUTING
    assert KIND_CAPABILITY[StreamKind.LBTRU_SESSION] is Capability.RU_SESSIONS
    assert set(KIND_TARGET) == {StreamKind.RESPONSE, StreamKind.UIM_ROUTED, StreamKind.RECOVERY}
    assert Capability.RECOVERY == 0x200 and StreamKind.RECOVERY == 0x84
    assert KIND_CAPABILITY[StreamKind.RECOVERY] is Capability.RECOVERY
    # announced by default once the data plane relays them: RESPONSE yes, UIM_ROUTED not yet
    assert DEFAULT_CAPABILITIES & NEW == Capability.RESPONSES
    base = {StreamKind.TCP, StreamKind.LBTRU, StreamKind.LBTRM}
    assert set(stream_kinds(0)) == base
    assert set(stream_kinds(OLD)) == base | {StreamKind.LBTRU_SESSION}
    assert set(stream_kinds(DEFAULT_CAPABILITIES)) == base | {StreamKind.LBTRU_SESSION, StreamKind.RESPONSE}
    assert set(stream_kinds(Capability.UIM_ROUTING)) == base | {StreamKind.UIM_ROUTED}
    assert set(stream_kinds(Capability.RECOVERY)) == base | {StreamKind.RECOVERY}


RESP = StreamOpen(1, 7, StreamKind.RESPONSE, 1000, ResponseTarget("10.0.0.1", 14391))
UIM = StreamOpen(3, 0, StreamKind.UIM_ROUTED, 1000, RoutedUimTarget(9, "10.0.0.2", 15000, 0))


@pytest.mark.parametrize("a_caps, b_caps, sendable", [
    (DEFAULT_CAPABILITIES | NEW, DEFAULT_CAPABILITIES | NEW, {RESP, UIM}),
    (DEFAULT_CAPABILITIES | NEW, OLD, set()),  # an older peer
    (OLD, DEFAULT_CAPABILITIES | NEW, set()),  # we do not serve them
    (OLD | Capability.RESPONSES, OLD | NEW, {RESP}),
    (OLD | NEW, OLD | Capability.UIM_ROUTING, {UIM}),
])
def test_a_connection_never_opens_a_kind_the_peer_did_not_announce(a_caps, b_caps, sendable):
    a, b = connected(a_caps, b_caps)
    for frame in (RESP, UIM):
        assert a.can_send(frame) is (frame in sendable)
        if frame in sendable:
            assert b.receive_data(a.send(frame, 1.0), 1.0) == [frame]
        else:
            with pytest.raises(LocalProtocolError, match=f"capability {KIND_CAPABILITY[frame.kind].name} "
                                                         "was not negotiated"):
                a.send(frame, 1.0)
    assert a.state is b.state is State.CONNECTED and not a.data_to_send()


def test_an_lbtru_session_stream_needs_ru_sessions_too():
    a, b = connected(DEFAULT_CAPABILITIES & ~Capability.RU_SESSIONS, DEFAULT_CAPABILITIES)
    with pytest.raises(LocalProtocolError, match="LBTRU_SESSION: capability RU_SESSIONS"):
        a.send(StreamOpen(1, 1, StreamKind.LBTRU_SESSION), 1.0)
    assert a.send(StreamOpen(1, 1, StreamKind.TCP), 1.0)


def test_a_peer_that_does_not_serve_the_kind_refuses_the_stream_and_the_link_stays_up():
    """A peer that announced the capability but builds its stream table without the kind
    (or a router of the version before these kinds) answers UNSUPPORTED_KIND."""
    a, b = connected(DEFAULT_CAPABILITIES | NEW, DEFAULT_CAPABILITIES | NEW)
    ta, tb = StreamTable("initiator"), StreamTable("acceptor")  # default kinds: neither new one
    sid = ta.open(7, StreamKind.RESPONSE, ResponseTarget("10.0.0.1", 14391))
    (frame,) = ta.frames_to_send()
    (got,) = b.receive_data(a.send(frame, 1.0), 1.0)
    assert tb.receive(got) == [StreamError(sid, "stream kind 130 not supported")]
    (refusal,) = tb.frames_to_send()
    (back,) = a.receive_data(b.send(refusal, 1.0), 1.0)
    assert ta.receive(back) == [StreamRefused(sid, RefuseCode.UNSUPPORTED_KIND, "stream kind 130 not supported")]
    assert sid not in ta and a.state is b.state is State.CONNECTED


@pytest.mark.parametrize("kind, target", [
    (StreamKind.RESPONSE, ResponseTarget("192.0.2.10", 14391)),
    (StreamKind.UIM_ROUTED, RoutedUimTarget(12, "198.51.100.7", 15002, 2)),
])
def test_a_stream_of_each_kind_opens_carries_data_and_tells_its_target(kind, target):
    a, b = connected(DEFAULT_CAPABILITIES | NEW, DEFAULT_CAPABILITIES | NEW)
    caps = a.capabilities
    ta, tb = StreamTable("initiator", kinds=stream_kinds(caps)), StreamTable("acceptor", kinds=stream_kinds(caps))
    advert = 7 if kind == StreamKind.RESPONSE else 0
    sid = ta.open(advert, kind, target)
    assert ta.get(sid).target == target

    def deliver(src, dst, table):
        return [e for f in table.frames_to_send() for g in dst.receive_data(src.send(f, 1.0), 1.0)
                for e in (tb if table is ta else ta).receive(g)]

    assert deliver(a, b, ta) == [StreamOpened(sid, advert, kind, target)]
    assert tb.get(sid).target == target
    tb.accept(sid)
    assert deliver(b, a, tb) == [StreamAccepted(sid, INITIAL_WINDOW)]
    assert not ta.send(sid, b"response bytes")
    assert deliver(a, b, ta) == [DataReceived(sid, b"response bytes")]


def test_the_table_checks_the_target_of_what_it_opens():
    t = StreamTable("initiator")
    for kind, target in ((StreamKind.RESPONSE, None), (StreamKind.TCP, ResponseTarget("1.2.3.4", 5)),
                         (StreamKind.UIM_ROUTED, ResponseTarget("1.2.3.4", 5))):
        with pytest.raises(LocalStreamError):
            t.open(1, kind, target)
    assert not t.streams and not t.frames_to_send()
