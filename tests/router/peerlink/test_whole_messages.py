"""Frames of whole messages (capability WHOLE_MESSAGES, STREAM_DATA header flag
FLAG_WHOLE_MESSAGES): encoded and decoded with the flag, sent only to a peer that
announced the capability and taken only from one, and framed all or nothing by
``StreamTable.send_whole`` within the stream's credit."""

from __future__ import annotations

import pytest

from router.peerlink import (
    DEFAULT_CAPABILITIES,
    FLAG_WHOLE_MESSAGES,
    HEADER,
    Capability,
    RouterIdentity,
    StreamData,
    decode,
    encode,
)
from router.peerlink.streams import STREAM_DATA_OVERHEAD, StreamAccepted, StreamTable
from tests.router.helpers import connected_peers

WHOLE = DEFAULT_CAPABILITIES | Capability.WHOLE_MESSAGES


def connected(caps_a: int, caps_b: int):
    return connected_peers(a_id=RouterIdentity("router-a", (1,), caps_a),
                           b_id=RouterIdentity("router-b", (2,), caps_b))


def flags_of(wire: bytes) -> int:
    return HEADER.unpack_from(wire)[3]


def test_a_whole_frame_carries_the_flag_and_decodes_with_it():
    wire = encode(StreamData(5, b"\x00" * 40, whole=True))
    assert flags_of(wire) == FLAG_WHOLE_MESSAGES
    assert decode(wire) == StreamData(5, b"\x00" * 40, whole=True)
    plain = encode(StreamData(5, b"\x00" * 40))
    assert flags_of(plain) == 0 and decode(plain) == StreamData(5, b"\x00" * 40)


def test_the_flag_crosses_only_when_both_ends_have_the_capability():
    a, b = connected(WHOLE, WHOLE)
    assert a.capabilities & Capability.WHOLE_MESSAGES
    out = a.send(StreamData(3, b"x" * 100, whole=True), 1.0)
    assert flags_of(out) == FLAG_WHOLE_MESSAGES
    assert b.receive_data(out, 1.0) == [StreamData(3, b"x" * 100, whole=True)]
    head = a.send_data_head(3, 70_000, 1.0, whole=True)
    assert flags_of(head) == FLAG_WHOLE_MESSAGES

    old_a, old_b = connected(WHOLE, DEFAULT_CAPABILITIES)  # b is an older router
    assert not old_a.capabilities & Capability.WHOLE_MESSAGES
    out = old_a.send(StreamData(3, b"x" * 100, whole=True), 1.0)
    assert flags_of(out) == 0  # not sent to a peer that would not know it
    assert flags_of(old_a.send_data_head(3, 70_000, 1.0, whole=True)) == 0
    # ... and not taken from a peer that should not have sent it
    assert old_b.receive_data(encode(StreamData(3, b"y" * 10, whole=True)), 1.0) == [StreamData(3, b"y" * 10)]


def open_stream(window: int = 1 << 20, max_frame: int = 256 << 10):
    ta = StreamTable("initiator", max_frame=max_frame)
    tb = StreamTable("acceptor", initial_window=window)
    sid = tb.open(advert_id=1)  # the near side opens, the far side sends (as the fan-out does)
    for f in tb.frames_to_send():
        ta.receive(f)
    ta.accept(sid)
    for f in ta.frames_to_send():
        assert isinstance(tb.receive(f)[0], StreamAccepted)
    assert ta.get(sid).send_credit == window
    return ta, tb, sid


def test_send_whole_is_one_flagged_frame_or_nothing():
    ta, tb, sid = open_stream(window=400_000, max_frame=256 << 10)
    run = bytes(150_000)
    assert ta.whole_fits(sid, len(run))
    assert ta.send_whole(sid, run) and ta.send_whole(sid, run)
    frames = ta.frames_to_send()
    assert frames == [StreamData(sid, run, whole=True)] * 2
    assert ta.get(sid).send_credit == 100_000
    # not enough credit: nothing framed, nothing taken (it fits once credit comes back)
    assert not ta.send_whole(sid, run) and ta.frames_to_send() == []
    assert ta.get(sid).send_credit == 100_000 and ta.whole_fits(sid, len(run))
    # the link's queue has no room for it: nothing framed
    assert not ta.send_whole(sid, bytes(50_000), limit=50_000 + STREAM_DATA_OVERHEAD - 1)
    assert ta.send_whole(sid, bytes(50_000), limit=50_000 + STREAM_DATA_OVERHEAD)
    assert len(ta.frames_to_send()) == 1


@pytest.mark.parametrize("size, fits", [(256 << 10, True), ((256 << 10) + 1, False), (0, False)])
def test_whole_fits_a_frame_and_half_the_peers_window(size, fits):
    ta, _, sid = open_stream(window=1 << 20, max_frame=256 << 10)
    assert ta.whole_fits(sid, size) is fits
    small, _, sid2 = open_stream(window=64 << 10, max_frame=256 << 10)
    assert not small.whole_fits(sid2, 40 << 10)  # more than half the peer's window: it could never come
    assert small.whole_fits(sid2, 32 << 10)
    assert not small.send_whole(sid2, bytes(100 << 10))


def test_a_frame_of_more_than_half_the_window_could_wait_for_credit_forever():
    """The peer grants credit once it consumed half its window: after a frame of
    just under half, consumed whole, no credit comes back and the sender holds
    just over half the window. A whole frame larger than half the window is
    therefore never attempted (it would wait for that credit for ever)."""
    window = 4 << 20
    ta, tb, sid = open_stream(window=window, max_frame=window)
    first = window // 2 - 1
    assert ta.send_whole(sid, bytes(first))
    for f in ta.frames_to_send():
        tb.receive(f)
    tb.consumed(sid, first)
    assert tb.frames_to_send() == []  # below half the window: no grant
    assert ta.get(sid).send_credit == window - first < window // 2 + 2
    assert not ta.whole_fits(sid, window // 2 + 2)  # (sent as it could go instead: StreamTable.send)
    assert ta.whole_fits(sid, window // 2)  # never more than the credit that is sure to come


def test_the_senders_bound_grows_with_the_peers_window():
    """A grant that grows the peer's window (its consumer keeps up) raises what
    the sender knows of that window (``peer_window``: the most credit it held),
    and with it the largest whole frame."""
    ta = StreamTable("initiator", max_frame=8 << 20)
    tb = StreamTable("acceptor", initial_window=4 << 20, max_window=32 << 20, window_budget=128 << 20)
    sid = tb.open(advert_id=1)
    for f in tb.frames_to_send():
        ta.receive(f)
    ta.accept(sid)
    for f in ta.frames_to_send():
        tb.receive(f)
    assert ta.get(sid).peer_window == 4 << 20 and not ta.whole_fits(sid, 4 << 20)
    for _ in range(2):  # two frames of 2 MiB, each consumed at once: a grant that doubles the window
        assert ta.send_whole(sid, bytes(2 << 20))
        for f in ta.frames_to_send():
            tb.receive(f)
        tb.consumed(sid, 2 << 20)
        for f in tb.frames_to_send():
            ta.receive(f)
    assert ta.get(sid).peer_window >= 8 << 20
    assert ta.whole_fits(sid, 4 << 20)
