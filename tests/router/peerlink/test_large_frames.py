"""Frames of up to 4 MiB (capability LARGE_FRAMES): the payload limit is
MAX_PAYLOAD (1 MiB) until the handshake completes, and after it unless both
sides announced the capability; then LARGE_PAYLOAD both ways, from the frame
after the handshake's last, even when that frame comes in the same read."""

from __future__ import annotations

import pytest

from router.peerlink import (
    DEFAULT_CAPABILITIES,
    LARGE_PAYLOAD,
    MAX_PAYLOAD,
    Capability,
    PeerConnection,
    ProtocolError,
    RouterIdentity,
    StreamData,
    encode,
)
from tests.router.helpers import connected_peers

LARGE = DEFAULT_CAPABILITIES | Capability.LARGE_FRAMES
BIG = LARGE_PAYLOAD - 4  # data bytes of the largest STREAM_DATA frame


def connected(caps_a: int, caps_b: int):
    return connected_peers(a_id=RouterIdentity("router-a", (1,), caps_a),
                           b_id=RouterIdentity("router-b", (2,), caps_b))


def test_both_sides_with_the_capability_take_frames_of_4_mib_both_ways():
    a, b = connected(LARGE, LARGE)
    assert a.capabilities & Capability.LARGE_FRAMES
    assert a.max_payload == b.max_payload == LARGE_PAYLOAD
    data = bytes(range(256)) * (BIG // 256)
    for x, y in ((a, b), (b, a)):
        wire = x.send(StreamData(7, data), 1.0)
        assert len(wire) == 16 + len(data)
        assert y.receive_data(wire, 1.0) == [StreamData(7, data)]
        head = x.send_data_head(7, BIG, 1.0)  # the zero-copy writer's head of such a frame
        assert y.receive_data_head(head, 1.0) is None  # accepted: the payload is the caller's
    with pytest.raises(Exception, match="limit"):
        a.send(StreamData(7, b"\x00" * (BIG + 1)), 1.0)


def test_with_an_older_peer_the_limit_stays_1_mib_and_a_larger_frame_ends_the_link():
    a, b = connected(LARGE, DEFAULT_CAPABILITIES)  # b is an older router
    assert not a.capabilities & Capability.LARGE_FRAMES
    assert a.max_payload == b.max_payload == MAX_PAYLOAD
    with pytest.raises(Exception, match="limit"):
        a.send(StreamData(7, b"\x00" * MAX_PAYLOAD), 1.0)  # (payload = stream id + data)
    # a (hostile or broken) peer that sends one anyway: refused at the header, the link ends
    evs = a.receive_data(encode(StreamData(7, b"\x00" * MAX_PAYLOAD), max_payload=LARGE_PAYLOAD)[:64], 1.0)
    assert any(isinstance(e, ProtocolError) for e in evs), evs


def test_before_the_handshake_completes_a_large_frame_is_refused():
    """An unauthenticated peer cannot make a router hold 4 MiB: the acceptor's
    limit is 1 MiB until CONNECT_OK, whatever it announced."""
    b = PeerConnection("acceptor", RouterIdentity("router-b", (2,), LARGE), nonce=0xB)
    b.start(0.0)
    evs = b.receive_data(encode(StreamData(1, b"\x00" * MAX_PAYLOAD), max_payload=LARGE_PAYLOAD)[:64], 0.0)
    assert any(isinstance(e, ProtocolError) for e in evs), evs


def test_a_large_frame_right_behind_connect_ok_in_one_read_is_taken():
    """The initiator may send a large frame at once after CONNECT_OK: the acceptor
    raises its limit on CONNECT_OK, before it looks at the next frame's header."""
    a = PeerConnection("initiator", RouterIdentity("router-a", (1,), LARGE), nonce=0xA)
    b = PeerConnection("acceptor", RouterIdentity("router-b", (2,), LARGE), nonce=0xB)
    b.start(0.0)
    b.receive_data(a.start(0.0), 0.0)
    a.receive_data(b.data_to_send(), 0.0)
    ok = a.data_to_send()
    data = b"\x5a" * BIG
    evs = b.receive_data(ok + a.send(StreamData(3, data), 0.0), 0.0)
    assert [type(e).__name__ for e in evs] == ["Connected", "StreamData"], evs
    assert evs[1] == StreamData(3, data)


def test_large_payload_below_max_payload_is_refused():
    with pytest.raises(ValueError):
        PeerConnection("initiator", RouterIdentity("router-a", (1,), LARGE), max_payload=2 << 20,
                       large_payload=1 << 20)
