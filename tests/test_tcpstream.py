"""Bounded TCP reassembly (lbmr_proto.tcpstream): in-order delivery, duplicates
once, holes skipped past the bound, sequence wrap-around, directions bounded."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lbmr_proto.capture import TcpSegment
from lbmr_proto.tcpstream import TcpStreams

A, B = ("10.0.0.1", 1000), ("10.0.0.2", 2000)


def seg(seq: int, data: bytes = b"", flags: int = 0x18, src=A, dst=B, frame: int = 0) -> TcpSegment:
    return TcpSegment(0.0, src[0], src[1], dst[0], dst[1], seq & 0xFFFFFFFF, 0, flags, 1000, data, frame, 0)


def feed_all(streams: TcpStreams, segments) -> list:
    out = []
    for s in segments:
        out += streams.feed(s)
    return out


def test_in_order_after_syn_no_resync():
    s = TcpStreams()
    out = feed_all(s, [seg(99, flags=0x02), seg(100, b"abc"), seg(103, b"de")])
    assert [(c.data, c.resync) for c in out] == [(b"abc", False), (b"de", False)]
    assert out[0].direction == (*A, *B)


def test_mid_stream_start_is_a_resync():
    out = feed_all(TcpStreams(), [seg(5000, b"xyz"), seg(5003, b"w")])
    assert [(c.data, c.resync, c.skipped) for c in out] == [(b"xyz", True, 0), (b"w", False, 0)]


def test_out_of_order_retransmitted_and_overlapping():
    s = TcpStreams()
    out = feed_all(s, [seg(0, flags=0x02), seg(5, b"efgh"), seg(1, b"abc"), seg(1, b"abc"), seg(3, b"cdefghij")])
    assert b"".join(c.data for c in out) == b"abcdefghij"
    assert not any(c.resync for c in out) and s.duplicate_bytes == 3 + 1 + 4
    assert s.pending_bytes == 0


def test_a_hole_is_skipped_past_the_bound():
    s = TcpStreams(max_pending=10)
    out = feed_all(s, [seg(0, flags=0x02), seg(1, b"ab"), seg(10, b"123456"), seg(16, b"789"), seg(19, b"XY")])
    assert [(c.data, c.resync, c.skipped) for c in out] == [(b"ab", False, 0), (b"123456", True, 7),
                                                             (b"789", False, 0), (b"XY", False, 0)]
    assert s.skipped_bytes == 7 and s.pending_bytes == 0


def test_sequence_numbers_wrap():
    start = 0xFFFFFFFE
    out = feed_all(TcpStreams(), [seg(start - 1, flags=0x02), seg(start + 4, b"3456"), seg(start, b"0123")])
    assert b"".join(c.data for c in out) == b"01233456"[:4] + b"3456"


def test_fin_and_rst_forget_directions_and_directions_are_bounded():
    s = TcpStreams(max_directions=3)
    feed_all(s, [seg(0, b"a", src=(f"10.1.0.{k}", 5)) for k in range(10)])
    assert len(s) == 3 and s.evicted == 7
    s = TcpStreams()
    feed_all(s, [seg(0, b"a"), seg(0, b"b", src=B, dst=A)])
    assert len(s) == 2
    s.feed(seg(1, b"", flags=0x14))
    assert len(s) == 0


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(1, 12)), max_size=40), st.integers(0, 2**32 - 1))
def test_any_order_delivers_a_prefix_once(cuts, isn):
    """Whatever segments of a 72-byte stream arrive, in whatever order, what is
    delivered without a resync is the stream itself, each byte once."""
    stream = bytes(range(72))
    s = TcpStreams(max_pending=1 << 20)
    out = feed_all(s, [seg(isn, flags=0x02)] + [seg(isn + 1 + a, stream[a:a + n]) for a, n in cuts])
    data = b"".join(c.data for c in out)
    assert not any(c.resync for c in out)
    assert stream.startswith(data)
    assert s.pending_bytes <= sum(n for _, n in cuts)
