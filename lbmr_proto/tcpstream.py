"""TCP stream reassembly with bounded memory, sans-IO: captured segments in,
in-order byte runs per connection direction out.

:class:`TcpStreams` takes :class:`~lbmr_proto.capture.TcpSegment` records in
capture order and returns :class:`StreamBytes`: the bytes each segment makes
available in stream order, per direction ``(src, sport, dst, dport)``.
Retransmitted and overlapping bytes are delivered once; segments ahead of a hole
wait, within ``max_pending`` bytes per direction, for the hole to fill. When the
bound is reached (a segment was lost, or not captured) the hole is skipped and
the next bytes come with ``resync`` set and ``skipped`` = the bytes missing. A
stream whose SYN was not captured starts at its first captured byte, with
``resync`` set (``skipped`` 0: unknown). At most ``max_directions`` directions
are tracked; the least recently used is forgotten beyond that. A FIN or RST
forgets its direction (RST: both), after the bytes it carries.

Sequence numbers are the TCP header's u32 values (compared modulo 2**32);
lengths and bounds are in bytes.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import NamedTuple

__all__ = ["StreamBytes", "TcpStreams", "MAX_PENDING", "MAX_DIRECTIONS"]

#: bytes held per direction ahead of a hole before the hole is skipped
MAX_PENDING = 256 * 1024
#: connection directions tracked at once (least recently used forgotten)
MAX_DIRECTIONS = 4096
_FIN, _SYN, _RST = 0x01, 0x02, 0x04
_MOD = 1 << 32


class StreamBytes(NamedTuple):
    """In-order bytes of one direction ``(src, sport, dst, dport)`` of a TCP
    connection. ``resync``: these bytes do not continue the bytes delivered
    before for this direction (the stream starts mid-way, or a hole was
    skipped); ``skipped``: the bytes known to be missing before them (0 when
    unknown). ``ts`` (seconds since the epoch) and ``frame`` are the segment's
    that made the bytes available."""

    direction: tuple[str, int, str, int]
    data: bytes
    resync: bool
    skipped: int
    ts: float
    frame: int


def _delta(a: int, b: int) -> int:
    """``a - b`` for u32 sequence numbers, in -2**31..2**31-1."""
    return (a - b + (1 << 31)) % _MOD - (1 << 31)


class _Direction:
    __slots__ = ("next_seq", "pending", "base", "pending_bytes", "fresh")

    def __init__(self) -> None:
        self.next_seq: int | None = None
        # segments ahead of a hole: a heap of (offset from ``base``, arrival order, seq, data)
        self.pending: list[tuple[int, int, int, bytes]] = []
        self.base = 0
        self.pending_bytes = 0
        self.fresh = True  # nothing delivered yet: the first bytes are a resync unless a SYN was seen


class TcpStreams:
    """Bounded per-connection reassembly (see the module doc)."""

    __slots__ = ("max_pending", "max_directions", "_dirs", "duplicate_bytes", "skipped_bytes", "evicted")

    def __init__(self, max_pending: int = MAX_PENDING, max_directions: int = MAX_DIRECTIONS) -> None:
        self.max_pending = max_pending
        self.max_directions = max_directions
        self._dirs: OrderedDict[tuple, _Direction] = OrderedDict()
        self.duplicate_bytes = 0  # bytes seen again (retransmissions, overlaps), dropped
        self.skipped_bytes = 0  # bytes of holes skipped (lost, or not captured)
        self.evicted = 0  # directions forgotten to stay within max_directions

    def __len__(self) -> int:
        """Directions tracked."""
        return len(self._dirs)

    @property
    def pending_bytes(self) -> int:
        return sum(d.pending_bytes for d in self._dirs.values())

    def _direction(self, key: tuple) -> _Direction:
        d = self._dirs.get(key)
        if d is None:
            while len(self._dirs) >= self.max_directions:
                self._dirs.popitem(last=False)
                self.evicted += 1
            d = self._dirs[key] = _Direction()
        else:
            self._dirs.move_to_end(key)
        return d

    def feed(self, seg) -> list[StreamBytes]:
        """The bytes segment ``seg`` (a :class:`~lbmr_proto.capture.TcpSegment`)
        makes available, in stream order (empty if none)."""
        key = (seg.src, seg.sport, seg.dst, seg.dport)
        flags = seg.flags
        out: list[StreamBytes] = []
        if flags & _SYN:
            d = self._direction(key)
            d.next_seq, d.pending, d.pending_bytes, d.fresh = (seg.seq + 1) % _MOD, [], 0, False
            seq = (seg.seq + 1) % _MOD
        else:
            d = self._direction(key)
            seq = seg.seq
        if seg.payload:
            self._data(key, d, seq, seg.payload, seg, out)
        if flags & (_FIN | _RST):
            self._dirs.pop(key, None)
            if flags & _RST:
                self._dirs.pop((seg.dst, seg.dport, seg.src, seg.sport), None)
        return out

    def _data(self, key, d: _Direction, seq: int, data: bytes, seg, out: list) -> None:
        if d.next_seq is None:
            d.next_seq = seq
        ahead = _delta(seq, d.next_seq)
        if ahead < 0:  # starts before the next byte expected: trim what was delivered already
            cut = min(-ahead, len(data))
            self.duplicate_bytes += cut
            data = data[cut:]
            if not data:
                return
            seq, ahead = d.next_seq, 0
        if ahead > 0:
            if not d.pending:
                d.base = d.next_seq
            heapq.heappush(d.pending, (_delta(seq, d.base), self.duplicate_bytes + d.pending_bytes, seq, data))
            d.pending_bytes += len(data)
            if d.pending_bytes <= self.max_pending:
                return
            # the hole is not filling: skip to the earliest byte held
            first = d.pending[0][2]
            skipped = _delta(first, d.next_seq)
            self.skipped_bytes += skipped
            d.next_seq = first
            self._drain(key, d, seg, out, resync=True, skipped=skipped)
            return
        out.append(StreamBytes(key, data, d.fresh, 0, seg.ts, seg.frame))
        d.fresh = False
        d.next_seq = (seq + len(data)) % _MOD
        self._drain(key, d, seg, out)

    def _drain(self, key, d: _Direction, seg, out: list, *, resync: bool = False, skipped: int = 0) -> None:
        """Deliver the held segments that now continue the stream."""
        while d.pending and _delta(d.pending[0][2], d.next_seq) <= 0:
            _, _, best, data = heapq.heappop(d.pending)
            d.pending_bytes -= len(data)
            cut = -_delta(best, d.next_seq)
            if cut >= len(data):
                self.duplicate_bytes += len(data)
                continue
            self.duplicate_bytes += cut
            out.append(StreamBytes(key, data[cut:], resync or d.fresh, skipped, seg.ts, seg.frame))
            resync, skipped, d.fresh = False, 0, False
            d.next_seq = (best + len(data)) % _MOD
