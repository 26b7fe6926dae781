"""A capture file as the readers see it: where its bytes come from, how its
format is recognised, what reading it yields and how damage is reported.

:class:`CaptureSource` memory-maps a file given by path (or, if it cannot be
mapped, reads it in ``CHUNK_SIZE`` pieces), reads a binary file object in
``CHUNK_SIZE`` pieces, or serves an in-memory buffer; its :meth:`head
<CaptureSource.head>` checks the magic number (pcap, either byte order, micro-
or nanoseconds; pcapng).  :func:`refill` carries a partial record or block over
into the next chunk.  :class:`UdpDatagram` and :class:`RawFrame` are what the
readers yield; :class:`CaptureError` is a truncated or corrupt file, with the
byte offset of the bad record.

Timestamps are ``float`` seconds since the Unix epoch; offsets and sizes are in
bytes.  The byte order of the file's own headers is whatever its magic number
declares.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from typing import Any, NamedTuple

#: Records or blocks longer than this (bytes) are treated as file corruption.
MAX_RECORD_SIZE = 1 << 24
#: How much of the file is read at a time (bytes).
CHUNK_SIZE = 1 << 22


class CaptureError(ValueError):
    """The capture file is truncated or corrupt.

    ``path`` names the file (or ``'<bytes>'`` / ``'<stream>'``), ``offset`` is the
    byte offset in the file of the bad record, block or header, ``reason`` says why.
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(path, offset, reason)
        self.path, self.offset, self.reason = path, offset, reason

    def __str__(self) -> str:
        return f"{self.path}: byte offset {self.offset}: {self.reason}"


class UdpDatagram(NamedTuple):
    """One UDP datagram from a capture.

    ``ts`` is seconds since the epoch; ``frame`` the 1-based number (as Wireshark
    numbers them) of the frame that completed the datagram (the last fragment, for a
    reassembled one) and ``offset`` the byte offset of that frame's record (pcap) or
    block (pcapng) in the file.
    """

    ts: float
    src: str
    sport: int
    dst: str
    dport: int
    payload: bytes
    frame: int
    offset: int


class RawFrame(NamedTuple):
    """A captured link-layer frame: ``ts`` in seconds since the epoch, the file's or
    interface's link type, and the captured bytes."""

    ts: float
    linktype: int
    data: bytes


PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"
PCAP_MAGICS = {   # magic bytes as stored -> (struct byte order, ticks per second)
    b"\xd4\xc3\xb2\xa1": ("<", 1_000_000), b"\xa1\xb2\xc3\xd4": (">", 1_000_000),
    b"\x4d\x3c\xb2\xa1": ("<", 1_000_000_000), b"\xa1\xb2\x3c\x4d": (">", 1_000_000_000),
}


class CaptureSource:
    """Where the capture bytes come from: a memory-mapped file (or, if it cannot be
    mapped, the file read in chunks), a binary file object read in ``CHUNK_SIZE``
    pieces, or an in-memory buffer.  ``read(n)`` returns a bytes-like object, empty
    at the end of the data."""

    __slots__ = ("name", "read", "_closers")

    def __init__(self, source) -> None:
        self._closers: list[Callable[[], Any]] = []
        if isinstance(source, (bytes, bytearray, memoryview)):
            self.name = "<bytes>"
            self._once(bytes(source))
        elif isinstance(source, (str, os.PathLike)):
            self.name = os.fsdecode(source)
            f = open(source, "rb", buffering=0)
            self._closers.append(f.close)
            try:
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):       # empty file, pipe, ...
                self.read = f.read
            else:
                self._closers.insert(0, m.close)
                self._once(m)
        else:
            name = getattr(source, "name", None)
            self.name = name if isinstance(name, str) else "<stream>"
            self.read = source.read

    def _once(self, data) -> None:
        chunks = [data]
        self.read = lambda n: chunks.pop() if chunks else b""

    def close(self) -> None:
        for close in self._closers:
            close()

    def head(self):
        """At least 24 bytes (or the whole file), checked for a known magic number."""
        buf = self.read(CHUNK_SIZE)
        while len(buf) < 24:
            chunk = self.read(CHUNK_SIZE)
            if not chunk:
                break
            buf = bytes(buf) + chunk
        magic = buf[:4]
        if magic == PCAPNG_MAGIC:
            return buf
        if magic in PCAP_MAGICS:
            if len(buf) < 24:
                raise CaptureError(self.name, 0, "truncated pcap file header")
            return buf
        if not buf:
            raise CaptureError(self.name, 0, "empty file (no capture header)")
        if magic[:2] == b"\x1f\x8b":
            raise CaptureError(self.name, 0, "gzip-compressed capture; decompress it first")
        raise CaptureError(self.name, 0, f"unknown file magic 0x{magic.hex()} (not pcap or pcapng)")


def refill(src: CaptureSource, buf: bytes, pos: int, need: int, what: str, base: int) -> bytes | None:
    """``buf[pos:]`` plus more file data, or None at a clean end of file."""
    chunk = src.read(max(CHUNK_SIZE, need))
    if chunk:
        return buf[pos:] + chunk
    if pos < len(buf):
        raise CaptureError(src.name, base + pos,
                           f"truncated {what}: {len(buf) - pos} of {need} bytes present")
    return None
