"""Receive buffers used again (:class:`BufferPool`), sans-IO.

A relay that reads a stream into a new buffer for each read, and hands out
read-only views of it (queued, framed, written later), pays for every byte
twice over before the read: the allocator gives large buffers fresh pages
(a page fault each) and ``bytearray(n)`` fills them with zeros. A pool
keeps a few buffers of one size and gives one out again once no view of it
is alive any more: a ``bytearray`` whose buffer is exported (any
``memoryview`` of it, or of such a view, still exists) cannot be resized
(``BufferError``), which is how the pool tells. Nothing else need be
counted: whoever holds a view holds the buffer, and a buffer nobody views is
free to be written again.
"""

from __future__ import annotations

__all__ = ["BufferPool"]


def _unviewed(buf: bytearray) -> bool:
    """No view of ``buf`` is alive (it can be resized: grown by a byte and back)."""
    try:
        buf.append(0)
    except BufferError:
        return False
    del buf[-1]
    return True


class BufferPool:
    """Up to ``keep`` buffers of ``size`` bytes, each given out again by
    :meth:`take` once no view of it is alive. Memory: at most ``keep`` times
    ``size`` bytes kept, in use or not (a request the kept buffers cannot meet
    gets a new buffer of its own, not kept)."""

    __slots__ = ("size", "keep", "_kept", "_next", "reused")

    def __init__(self, size: int, keep: int = 8) -> None:
        if size <= 0 or keep < 0:
            raise ValueError("a pool of buffers of at least 1 byte, keeping at least none")
        self.size = size
        self.keep = keep
        self._kept: list[bytearray] = []
        self._next = 0  # where the next search starts (buffers tend to come free in turn)
        self.reused = 0  # buffers given out again

    def take(self, nbytes: int) -> bytearray:
        """A buffer of at least ``nbytes`` bytes to read into (its old bytes
        are left: write before viewing). A kept one (``size`` bytes) when
        ``nbytes`` is from a quarter of ``size`` up to ``size`` and one is
        free, looked for from the one given out longest ago through all kept
        ones (they do not come free in the order they went out: with only the
        two oldest looked at, router A's pool of 8 buffers of 4 MiB gave out a
        fresh one for every read while 2 of its 8 were free, each a page fault
        per 4 KiB and 4 MiB of zeros); else a new one (of the pool's size, kept while
        fewer than ``keep`` are; of exactly ``nbytes`` outside that range).
        The taker holds it by its views: it views it at once, and the pool
        gives it out again once none is alive."""
        size = self.size
        if not size >> 2 <= nbytes <= size:
            return bytearray(nbytes)
        kept = self._kept
        n = len(kept)
        # views go in about the order the buffers were given out: the one given out
        # longest ago is looked at first (a look: a byte appended and taken off)
        for k in range(n):
            i = (self._next + k) % n
            buf = kept[i]
            if _unviewed(buf):
                self._next = (i + 1) % n
                self.reused += 1
                return buf
        buf = bytearray(size)
        if n < self.keep:
            kept.insert(self._next, buf)  # (given out last: looked at last)
            self._next = (self._next + 1) % (n + 1)
        return buf
