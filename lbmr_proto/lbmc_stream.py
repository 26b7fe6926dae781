"""LBMC message streams cut into whole messages, sans-IO: :class:`MessageRun`
(whole messages back to back, and where each ends) and :class:`StreamFramer`
(the bytes of a TCP stream of LBMC messages, as they come, to runs of whole
messages without copying them). Lengths and offsets in bytes; the message
length is big-endian (network order), as in :mod:`lbmr_proto.lbmc`, which
exports both names too."""

from __future__ import annotations

import bisect
import struct
from itertools import accumulate

from .lbmc import (
    CONTROL_HEADER,
    DATA_HEADER,
    DATA_KINDS,
    KIND_NAMES,
    VERSION,
    LbmcDecodeError,
    check_start,
)

__all__ = ["MessageRun", "StreamFramer", "UNIFORM_MIN"]


class MessageRun:
    """Whole LBMC messages back to back in ``data`` (``bytes``, or a
    ``memoryview`` of bytes that never change); ``ends``: the offset just past
    each message, ascending (the last is ``len(data)``), a list, or a
    ``range`` (size, ..., size) when the messages are all of one size (as
    :meth:`StreamFramer.cut` gives a run of them: no list built). Read it as a
    sequence; never change it."""

    __slots__ = ("data", "ends")

    def __init__(self, data: bytes | memoryview, ends: list[int] | range) -> None:
        self.data = data
        self.ends = ends

    @classmethod
    def of(cls, messages: list[bytes]) -> MessageRun:
        return cls(b"".join(messages), list(accumulate(map(len, messages))))

    @property
    def count(self) -> int:
        return len(self.ends)

    def fitting(self, room: int) -> int:
        """How many leading messages take at most ``room`` bytes."""
        return bisect.bisect_right(self.ends, room)

    def messages(self) -> list[bytes]:
        """Each message, copied."""
        data, start = self.data, 0
        out = []
        for end in self.ends:
            out.append(bytes(data[start:end]))
            start = end
        return out


_START = struct.Struct("!BxH")  # ver_type, msglen
# messages alike in kind and length that StreamFramer.cut checks together (at least)
UNIFORM_MIN = 8
# header size by ver_type (0: not a version-0 message of a known kind)
_HLEN = bytes(0 if vt >> 4 != VERSION or vt & 0x0F not in KIND_NAMES
              else DATA_HEADER.size if vt & 0x0F in DATA_KINDS else CONTROL_HEADER.size for vt in range(256))


class StreamFramer:
    """Cuts a byte stream of LBMC messages (LBT-TCP) into whole messages.

    :meth:`feed` takes the next bytes of the stream and returns the
    messages they complete, as bytes (not decoded: a relay forwards them
    as they are; :func:`decode` them to look inside). Each message's first
    4 bytes are checked as soon as they arrive (version, type, ``msglen``
    at least its header); a bad one raises :class:`LbmcDecodeError` with the
    stream offset, after which the stream cannot be framed any more (every
    later :meth:`feed` raises it again). At most one incomplete message is
    held between calls, so the buffer never exceeds 65535 bytes.
    :meth:`cut` does the same without copying the messages (runs of them,
    :class:`MessageRun`, as views of the bytes fed): for relays, whose cost
    per byte matters. A run of messages alike in kind and length (at least
    UNIFORM_MIN) is checked with strided slices, not one message at a time.
    """

    __slots__ = ("_buf", "_need", "offset", "messages", "_error", "_rx")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._rx: memoryview | None = None  # the buffer of receive_buffer(), the held bytes first
        self._need = 0  # msglen of the message being assembled (0: its 4-byte start is not known yet)
        self.offset = 0  # stream offset of the first byte not yet returned in a message
        self.messages = 0
        self._error: LbmcDecodeError | None = None

    @property
    def buffered(self) -> int:
        """Bytes of the incomplete message held (< 65536)."""
        return len(self._buf)

    @property
    def reserved(self) -> int:
        """Bytes of the buffer :meth:`receive_buffer` handed out and nothing was
        received into yet (0: none held)."""
        return 0 if self._rx is None else len(self._rx)

    def _start(self, data, off: int) -> int:
        try:
            return check_start(data, off)[1]
        except LbmcDecodeError as e:
            self._error = LbmcDecodeError(self.offset + e.offset - off, e.reason)
            raise self._error from None

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """The messages the next bytes of the stream complete, each copied."""
        return [m for run in self.cut(bytes(data)) for m in run.messages()]

    def receive_buffer(self, size: int, into: bytearray | None = None) -> memoryview:
        """Room for the stream's next ``size`` bytes at most, to read into (e.g.
        ``socket.recv_into``), then tell :meth:`received` how many came: in a new
        buffer (or ``into``, a buffer of at least :attr:`buffered` + ``size``
        bytes nobody else writes while a view of it is alive, e.g. from a pool),
        after a copy of the incomplete message held, so that the messages they
        complete are one run. The buffer stays viewed (reserved) until
        :meth:`received` or :meth:`drop_receive_buffer`."""
        held = len(self._buf)
        if into is not None:
            if len(into) < held + size:
                raise ValueError(f"a buffer of {len(into)} bytes for {held} held and {size} to receive")
            self._rx = memoryview(into)[:held + size]
        elif self._rx is None or len(self._rx) != held + size:  # (else: the last one, unused)
            self._rx = memoryview(bytearray(held + size))
        self._rx[:held] = self._buf
        return self._rx[held:]

    def drop_receive_buffer(self) -> None:
        """Let go of the buffer :meth:`receive_buffer` handed out, nothing received
        into it (:attr:`reserved` 0)."""
        self._rx = None

    def received(self, nbytes: int) -> list[MessageRun]:
        """:meth:`cut` for the ``nbytes`` read into the last :meth:`receive_buffer`:
        at most one run, a read-only view of that buffer (never written again)."""
        rx, self._rx = self._rx, None
        if rx is None:
            raise ValueError("received() without receive_buffer()")
        held = len(self._buf)
        self._buf = bytearray()  # (moved to the start of rx)
        self._need = 0
        return self.cut(rx.toreadonly()[:held + nbytes])

    def cut(self, data: bytes | memoryview) -> list[MessageRun]:
        """The messages the next bytes of the stream complete, without copying
        them: at most two runs, the held message completed (bytes of its own),
        then the whole messages within ``data`` (a view of it: ``data`` must
        never change, e.g. ``bytes``). The tail of an incomplete message is
        copied and held. (:meth:`receive_buffer` and :meth:`received` give one
        run instead.)"""
        if self._error is not None:
            raise self._error
        self._rx = None  # (a receive_buffer() not filled is void)
        out: list[MessageRun] = []
        mv = memoryview(data)
        pos, n = 0, len(mv)
        buf = self._buf
        if buf:  # complete the held message first
            if len(buf) < 4:
                k = min(4 - len(buf), n)
                buf += mv[:k]
                pos = k
                if len(buf) < 4:
                    return out
                self._need = self._start(buf, 0)
            k = min(self._need - len(buf), n - pos)
            buf += mv[pos:pos + k]
            pos += k
            if len(buf) < self._need:
                return out
            out.append(MessageRun(bytes(buf), [len(buf)]))
            self._done(len(buf), 1)
            buf.clear()
        base, lead = pos, range(0)
        if n - pos >= 4 * UNIFORM_MIN:
            lead = self._uniform(mv, pos)
            if lead:
                pos += lead[-1]
        ends = []  # (after the lead, one at a time)
        unpack, hlens = _START.unpack_from, _HLEN
        while n - pos >= 4:
            vt, msglen = unpack(mv, pos)
            if msglen < hlens[vt] or not hlens[vt]:
                self._done(pos - base, len(lead) + len(ends))
                self._start(mv, pos)  # raises
            if n - pos < msglen:
                break
            pos += msglen
            ends.append(pos - base)
        if lead or ends:
            out.append(MessageRun(mv[base:pos], lead if not ends else [*lead, *ends]))
            self._done(pos - base, len(lead) + len(ends))
        if pos < n:
            buf += mv[pos:]
            self._need = self._start(buf, 0) if len(buf) >= 4 else 0
        return out

    @staticmethod
    def _uniform(mv: memoryview, pos: int) -> range:
        """The ends (counted from ``pos``) of the leading messages of ``mv[pos:]``
        that are all alike in kind and length (a source of messages of one
        size), checked with strided slices at C level instead of one message at
        a time: ``range(size, k * size + 1, size)`` for ``k`` of them, empty
        when fewer than UNIFORM_MIN are alike (the caller frames the messages
        one by one, and finds any bad start there). Tried once per :meth:`cut`,
        so its cost stays linear whatever the stream."""
        none = range(0)
        vt, msglen = _START.unpack_from(mv, pos)
        hlen = _HLEN[vt]
        if not hlen or msglen < hlen:
            return none
        k = (len(mv) - pos) // msglen
        if k < UNIFORM_MIN:
            return none
        end = pos + k * msglen
        # each message's ver_type, msglen high and low bytes: how many lead alike
        for off, byte in ((0, vt), (2, msglen >> 8), (3, msglen & 0xFF)):
            column = mv[pos + off:end:msglen].tobytes()
            k = min(k, len(column) - len(column.lstrip(bytes((byte,)))))
        if k < UNIFORM_MIN:
            return none
        return range(msglen, k * msglen + 1, msglen)

    def _done(self, nbytes: int, messages: int) -> None:
        self.offset += nbytes
        self.messages += messages
