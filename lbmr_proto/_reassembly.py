"""IPv4 fragment reassembly with bounded memory, for the capture readers.

:class:`Reassembler` takes one fragment at a time (its byte offset in the
datagram, the MF flag and its data) and returns the whole IP payload once every
byte of it has arrived.  Offsets and sizes are in bytes.  The number of pending
datagrams, their size and their age (seconds of capture time, not of the wall
clock) are all bounded, whatever the capture holds.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

#: Most IPv4 datagrams being reassembled at once; the oldest is evicted beyond this.
MAX_REASSEMBLY_BUFFERS = 1024
#: Largest reassembled IPv4 payload (bytes); fragments reaching past it are dropped.
MAX_DATAGRAM_SIZE = 65535
#: Incomplete fragment sets older than this (seconds of capture time) are dropped.
REASSEMBLY_TIMEOUT = 30.0


class Reassembler:
    """IPv4 fragment reassembly with bounded memory.

    At most ``max_buffers`` datagrams are pending (the oldest is evicted to make room),
    none grows past :data:`MAX_DATAGRAM_SIZE` bytes, and a datagram whose first
    fragment is more than ``timeout`` seconds (capture time) older than the newest
    fragment is dropped.  Fragments may arrive in any order; overlapping or duplicate
    data simply overwrites earlier data.
    """

    __slots__ = ("max_buffers", "timeout", "_pending")

    def __init__(self, max_buffers: int = MAX_REASSEMBLY_BUFFERS,
                 timeout: float = REASSEMBLY_TIMEOUT) -> None:
        self.max_buffers = max_buffers
        self.timeout = timeout
        # key -> [first ts, bytearray data, bytearray coverage mask, covered bytes, total or -1]
        self._pending: OrderedDict[Any, list] = OrderedDict()

    def __len__(self) -> int:
        """Number of incomplete datagrams currently buffered."""
        return len(self._pending)

    def clear(self) -> None:
        self._pending.clear()

    def feed(self, ts: float, key: Any, offset: int, more: bool, data: bytes) -> bytes | None:
        """Add one fragment; return the whole IP payload once it is complete.

        ``offset`` is the fragment offset in bytes (the header field times 8), ``more``
        the MF flag, ``key`` identifies the datagram (e.g. src, dst, id, protocol).
        Work per fragment is proportional to its length (a byte mask tracks coverage).
        """
        pending = self._pending
        while pending:
            first = next(iter(pending.values()))
            if ts - first[0] <= self.timeout:
                break
            pending.popitem(last=False)
        end = offset + len(data)
        entry = pending.get(key)
        if end > MAX_DATAGRAM_SIZE:
            if entry is not None:
                del pending[key]
            return None
        if entry is None:
            while pending and len(pending) >= self.max_buffers:
                pending.popitem(last=False)
            entry = pending[key] = [ts, bytearray(), bytearray(), 0, -1]
        buf = entry[1]
        mask = entry[2]
        if len(buf) < end:
            grow = end - len(buf)
            buf.extend(bytes(grow))
            mask.extend(bytes(grow))
        buf[offset:end] = data
        entry[3] += mask.count(0, offset, end)  # bytes covered for the first time
        mask[offset:end] = b"\x01" * (end - offset)
        if not more:
            entry[4] = end
        total = entry[4]
        if total >= 0 and len(buf) == total and entry[3] == total:
            del pending[key]
            return bytes(buf)
        return None
