"""The zero-copy STREAM_DATA heads of the sans-IO peer connection
(``PeerConnection.send_data_head`` / ``receive_data_head``): the same bytes, checks and
statistics as ``send`` / ``receive_data`` of the whole frame, and the same refusals."""

from __future__ import annotations

import dataclasses

import pytest

from router.peerlink import (
    Capability,
    DisconnectRequest,
    FrameEncodeError,
    Keepalive,
    LocalProtocolError,
    PeerConnection,
    ProtocolError,
    RouterIdentity,
    State,
    StreamData,
    encode,
)

A_ID = RouterIdentity("router-a", (1, 2))
B_ID = RouterIdentity("router-b", (3,))


def connected(a_id=A_ID, b_id=B_ID):
    a = PeerConnection("initiator", a_id, nonce=0xA)
    b = PeerConnection("acceptor", b_id, nonce=0xB)
    b.start(0.0)
    b.receive_data(a.start(0.0), 0.0)
    a.receive_data(b.data_to_send(), 0.0)
    b.receive_data(a.data_to_send(), 0.0)
    assert a.state is b.state is State.CONNECTED
    return a, b


def test_send_data_head_is_the_frame_head_counted_like_send():
    a, _ = connected()
    slow, _ = connected()
    payload = bytes(range(256)) * 300
    head = a.send_data_head(7, len(payload), 2.0)
    whole = slow.send(StreamData(7, payload), 2.0)
    assert head + payload == whole
    assert len(head) == 16
    # the connection counts the head; the caller adds the data bytes it writes itself
    a.stats.bytes_sent += len(payload)
    assert dataclasses.asdict(a.stats) == dataclasses.asdict(slow.stats)


def test_send_data_head_comes_after_the_pending_bytes():
    a, b = connected()
    b.receive_data(encode(Keepalive(1, 5)), 1.0)  # b owes a KEEPALIVE_ACK
    out = b.send_data_head(3, 20_000, 1.0)
    evs = a.receive_data(out + bytes(20_000), 1.0)
    assert evs == [StreamData(3, bytes(20_000))]
    assert a.stats.by_type_received["KEEPALIVE_ACK"] == 1  # the ack went first


def test_send_data_head_refuses_what_send_refuses():
    a, _ = connected(RouterIdentity("router-a", (1,), Capability.DATAGRAMS))
    with pytest.raises(LocalProtocolError, match="capability STREAMS"):
        a.send_data_head(1, 100, 1.0)
    a, _ = connected()
    with pytest.raises(FrameEncodeError):
        a.send_data_head(1, a.max_payload - 3, 1.0)
    assert a.send_data_head(1, a.max_payload - 4, 1.0)[8:12] == a.max_payload.to_bytes(4, "big")
    with pytest.raises(FrameEncodeError):
        a.send_data_head(1 << 32, 10, 1.0)
    fresh = PeerConnection("initiator", A_ID)
    with pytest.raises(LocalProtocolError):
        fresh.send_data_head(1, 10, 1.0)
    a.send(DisconnectRequest("bye"), 1.0)  # done sending: no more data
    with pytest.raises(LocalProtocolError):
        a.send_data_head(1, 10, 1.0)


def test_receive_data_head_accepts_counts_and_keeps_the_peer_alive():
    a, b = connected()
    slow_a, slow_b = connected()
    head = a.send_data_head(9, 50_000, 3.0)
    assert b.receive_data_head(head, 3.0) is None
    b.stats.bytes_received += 50_000  # the data bytes the caller moved itself
    evs = slow_b.receive_data(slow_a.send(StreamData(9, bytes(50_000)), 3.0), 3.0)
    assert evs == [StreamData(9, bytes(50_000))]
    assert dataclasses.asdict(b.stats) == dataclasses.asdict(slow_b.stats)
    # liveness: nothing else received until 17 s, yet the peer is not dead at 17 s
    _, events = b.tick(17.0)
    assert not events and b.state is State.CONNECTED


@pytest.mark.parametrize("mangle, words", [
    (lambda h: b"XXXX" + h[4:], "bad magic"),
    (lambda h: h[:4] + b"\x09" + h[5:], "header version"),
    (lambda h: h[:8] + (2 << 20).to_bytes(4, "big") + h[12:], "above the limit"),
])
def test_receive_data_head_refuses_a_bad_header_like_receive_data(mangle, words):
    a, b = connected()
    evs = b.receive_data_head(mangle(a.send_data_head(1, 40_000, 1.0)), 1.0)
    assert len(evs) == 1 and isinstance(evs[0], ProtocolError) and words in evs[0].reason
    assert b.state is State.CLOSED


def test_receive_data_head_without_streams_capability_is_a_protocol_error():
    a, _ = connected()
    _, b = connected(b_id=RouterIdentity("router-b", (3,), Capability.DATAGRAMS))
    evs = b.receive_data_head(a.send_data_head(1, 40_000, 1.0), 1.0)
    assert isinstance(evs[0], ProtocolError) and "STREAMS was not negotiated" in evs[0].reason


def test_receive_data_head_behind_a_partial_frame_takes_the_slow_path():
    """With part of a frame buffered the head is not at a frame boundary: the connection
    parses it as ``receive_data`` would (the link never does this, but the rule holds)."""
    a, b = connected()
    twin_a, twin_b = connected()
    ka = encode(Keepalive(1, 5))
    head = a.send_data_head(1, 40_000, 1.0)
    twin_a.send_data_head(1, 40_000, 1.0)
    assert b.receive_data(ka[:5], 1.0) == twin_b.receive_data(ka[:5], 1.0) == []
    got = b.receive_data_head(head, 1.0)
    assert got is not None
    assert got == twin_b.receive_data(head[:8] + (4).to_bytes(4, "big") + head[12:], 1.0)
    assert dataclasses.asdict(b.stats) == dataclasses.asdict(twin_b.stats)
