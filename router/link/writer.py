"""The writer of one peer link on trio (:class:`LinkWriter`): its bounded queue of
frames, the connection's own bytes (handshake, acks) and the task that writes them.

Frames leave in the order they were queued, each whole: the writer finishes the frame
it is in the middle of before it writes anything else.

Zero copy (a plain TCP link; not TLS, see :mod:`router.link.splice`): a queued
:class:`~router.peerlink.streams.HeldData` frame is written as its head, from the
connection (:meth:`~router.peerlink.PeerConnection.send_data_head`), then its payload
spliced from its pipe; a large STREAM_DATA frame as its head and its data from
memory, in one sendmsg. Writing never waits in the middle of Python:
:meth:`LinkWriter.send_now` (the stream pumps, right after queueing a frame: no
scheduler round trip to the writer task per frame) and the writer task both write the
frame in progress (``_tx``, then the held frame's pipe or the payload in memory) and the
queued frames as far as the socket takes them, and remember where they stopped; the
task waits for the socket when it is full, so a frame cut by a full socket is finished
before anything else.
"""

from __future__ import annotations

import logging
import os
import socket

import trio

from .. import peerlink as P
from ..peerlink import streams as S
from .splice import PipePool, splice
from .stream import HeldChunk, StreamState

log = logging.getLogger("lbmr-router")

# Control frames (interest, advertisements, route info ...) queued for a peer before the
# link is closed as hopelessly behind: room for the interest and advertisements of tens of
# thousands of topics at once (a link coming up with 10,000 topics queues that many of
# each), about 100 bytes each.
MAX_CONTROL_FRAMES = 250_000
FLUSH_TIMEOUT = 1.0  # seconds to write a link's last frames (e.g. DISCONNECT_OK) before closing
# Zero-copy writer: encoded frames taken from the queue at a time (before one held frame),
# and bytes written by one drain before the writer lets other tasks run.
TX_BATCH = 256 << 10
DRAIN_BUDGET = 8 << 20
# STREAM_DATA frames of at least this many data bytes are written as their 16-byte head
# (PeerConnection.send_data_head) and their data, from memory, in one sendmsg: no copy
SEND_MEM_MIN = 4 << 10
MEM_WRITES = 16  # sendmsg calls in a row for one such frame (a frame's worth: a few segments each)
_DONE, _BLOCKED, _MORE = "done", "blocked", "more"


async def wait_link_socket(stream: trio.SocketStream, waiter) -> None:
    """Wait until the link socket of ``stream`` is readable/writable (``waiter``:
    :func:`trio.lowlevel.wait_readable` or ``wait_writable``); ClosedResourceError if
    the link's stream was closed (e.g. cut from outside)."""
    sock = stream.socket
    if sock.fileno() < 0:
        raise trio.ClosedResourceError("the peer link's socket was closed")
    await waiter(sock)


class LinkWriter:
    """The writer of one peer link: ``conn`` (its sans-IO connection), ``stream`` (its
    trio stream), ``sock`` (a descriptor of our own on the link socket: a zero-copy
    link; else None), ``streams`` and ``state`` (the link's stream table and stream
    states, by stream id), ``pipes`` (where held frames' pipes go back). ``max_queue``
    is the queue's bound on data bytes, ``peer_name`` the peer's name (for logs)."""

    def __init__(self, conn: P.PeerConnection, stream, sock: socket.socket | None,
                 streams: S.StreamTable, state: dict[int, StreamState], pipes: PipePool, *,
                 peer_name: str, max_queue: int) -> None:
        self.conn = conn
        self._stream = stream
        self._sock = sock
        self._streams = streams
        self._state = state
        self._pipes = pipes
        self._peer_name = peer_name
        self.outq = P.OutQueue(max_control=MAX_CONTROL_FRAMES, max_data_bytes=max_queue)
        self.raw = bytearray()  # bytes the connection produced (handshake, acks)
        self.raw_taken = trio.Event()  # set (and replaced) whenever the writer takes ``raw``
        self.wake = trio.Event()
        self.closed = False  # the link is closed: nothing more is written
        self.closing = False  # finished: the writer flushes what the connection produced, then stops
        self.done = trio.Event()
        # zero copy: bytes taken from the queue and not yet written, then the held
        # frame whose payload follows them (``_tx_left`` bytes of it still in its pipe)
        self._tx: memoryview | None = None
        self._tx_held: S.HeldData | None = None
        self._tx_left = 0
        # ... or the payload of a STREAM_DATA frame, written from memory after ``_tx``
        self._tx_mem: memoryview | None = None
        self._draining = False
        self._tx_full = False  # a pump's drain found the socket full: the writer waits first
        self.tx_blocked = 0  # times the zero-copy writer found the socket full mid-frame
        self.spliced_out = 0  # payload bytes spliced into the link

    @property
    def _tx_pending(self) -> bool:
        """The zero-copy writer is in the middle of a frame: bytes taken from the queue
        (``_tx``), a held frame's pipe or a frame's payload in memory still to write."""
        return self._tx is not None or self._tx_held is not None or self._tx_mem is not None

    # ------------------------------------------------------------- queueing

    def put(self, frame: P.Frame, wake: bool = True) -> bool:
        """Queue ``frame``; False (and the link closed) when the queue overflows."""
        try:
            ok = self.outq.put(frame)
        except P.OutQueueOverflow as e:
            log.error("peer %s: %s; closing the link", self._peer_name, e)
            self.closed = True
            ok = False
        if wake:
            self.wake.set()
        return ok

    def flush_streams(self, direct: bool = False) -> None:
        """Queue the stream table's frames. ``direct`` (the data pumps, after queueing a
        frame of their own): on a zero-copy link whose writer is not in the middle of a
        frame, write what the socket takes now, from this task (no scheduler round trip
        to the writer per frame); the writer task does the rest."""
        frames = self._streams.frames_to_send()
        if not frames:
            return  # (what is queued already is the writer's, woken when it was queued)
        if not direct or self._sock is None:
            for f in frames:
                self.put(f)
            return
        for f in frames:
            self.put(f, wake=False)
        self.send_now()

    def send_now(self) -> None:
        """Write what is queued, as far as the socket takes it at once (zero-copy links; the
        writer task otherwise). Never waits, never raises: a failing socket is the writer's
        to find."""
        if self._sock is None or self._tx_pending or self.closed or self._draining:
            self.wake.set()
            return
        try:
            got = self._drain(trio.current_time())
        except OSError:
            got = None
        if got is not _DONE:
            self._tx_full = got is _BLOCKED
            self.wake.set()

    def push_raw(self, data: bytes) -> None:
        """Queue bytes the connection produced, ahead of the queued frames."""
        if data:
            self.raw += data
            self.wake.set()

    def _take_raw(self) -> bytes:
        out = bytes(self.raw)
        self.raw.clear()
        self.raw_taken.set()
        self.raw_taken = trio.Event()
        return out

    async def finish(self) -> None:
        """Write the connection's last bytes, then stop (within FLUSH_TIMEOUT seconds)."""
        self.closing = True
        self.wake.set()
        with trio.move_on_after(FLUSH_TIMEOUT):
            await self.done.wait()

    def close(self) -> None:
        """The link has ended: write nothing more, give back the queued frames' pipes."""
        self.closed = True
        self._drop_frame_in_progress()
        for f in self.outq.take_all():
            if isinstance(f, S.HeldData):
                self._drop_held(f)

    def _drop_frame_in_progress(self) -> None:
        held, self._tx_held = self._tx_held, None
        self._tx = self._tx_mem = None
        if held is not None:
            self._drop_held(held)

    def _drop_held(self, f: S.HeldData) -> None:
        """The frame is written (or thrown away): its pipe goes back, its pump wakes."""
        chunk = f.holder
        if isinstance(chunk, HeldChunk) and not chunk.done:
            chunk.done = True
            self._pipes.release(chunk.pipe)
        st = self._state.get(f.stream_id)
        if st is not None:
            st.credit.set()

    def _credit_all(self) -> None:
        for st in self._state.values():
            st.credit.set()  # queue space freed: writers may retry

    # ------------------------------------------------------------- the task

    async def run(self) -> None:
        """The writer task, until the link is closed or finished."""
        if self._sock is not None:
            await self._run_zero_copy()
            return
        popped: list = []  # taken from the queue, not yet written (their pipes, on the way out)
        i = 0
        try:
            while not self.closed:
                if self.closing and not self.raw:
                    self.done.set()
                    return
                await self.wake.wait()
                self.wake = trio.Event()
                now = trio.current_time()
                parts = [self._take_raw()]
                if self.conn.state is P.State.CONNECTED or self.conn.state is P.State.DISCONNECTING:
                    popped, i = self.outq.pop_batch(1 << 20), 0
                    while i < len(popped):
                        f = popped[i]
                        i += 1
                        if type(f) is S.HeldData:
                            await self._write_held(f, parts, now)
                            parts = []
                        elif type(f) is S.DatagramBatch:
                            self._encode_datagrams(f, parts)
                        elif self.conn.can_send(f):
                            parts.append(self.conn.send(f, now))
                    if self.outq:
                        self.wake.set()
                out = b"".join(parts)
                if out:
                    await self._stream.send_all(out)
                    self._credit_all()
        finally:
            for f in popped[i:]:
                if type(f) is S.HeldData:
                    self._drop_held(f)

    def _encode_datagrams(self, f: S.DatagramBatch, parts: list) -> int:
        """Append a batch of DATAGRAM frames (after the connection's own pending
        bytes) to ``parts``, counted in the connection's stats; their size (0 if
        the connection may not send DATAGRAM now)."""
        if not self.conn.can_send(P.Datagram(f.stream_id, b"")):
            return 0
        data = f.encode()
        parts.append(self.conn.data_to_send())  # anything before it
        parts.append(data)
        self.conn.stats.frames_sent += len(f.datagrams)
        self.conn.stats.bytes_sent += len(data)
        return len(data)

    async def _write_held(self, f: S.HeldData, parts: list, now: float) -> None:
        """One HeldData frame on a link without zero copy (not normally used): everything
        before it and its header, then its pipe, read."""
        try:
            try:
                parts.append(self.conn.send_data_head(f.stream_id, f.nbytes, now))
            except P.LocalProtocolError:
                return
            self.conn.stats.bytes_sent += f.nbytes
            await self._stream.send_all(b"".join(parts))
            pipe = f.holder.pipe
            left = f.nbytes
            while left:
                data = os.read(pipe.r, left)
                pipe.held -= len(data)
                left -= len(data)
                await self._stream.send_all(data)
        finally:
            self._drop_held(f)

    # --------------------------------------------- writing, zero-copy links

    async def _run_zero_copy(self) -> None:
        """The writer of a zero-copy link: :meth:`_drain` (also called by the data pumps
        through :meth:`send_now`) writes without waiting; this task waits for the socket
        when it is full, and for work when everything is written."""
        try:
            while not self.closed:
                if self.closing and not self.raw and not self._tx_pending:
                    self.done.set()
                    return
                if self._tx_full:  # no write to find out again
                    self._tx_full = False
                    await wait_link_socket(self._stream, trio.lowlevel.wait_writable)
                    continue
                self.wake = trio.Event()  # work queued from here on wakes us
                got = self._drain(trio.current_time())
                if got is _BLOCKED:
                    await wait_link_socket(self._stream, trio.lowlevel.wait_writable)
                elif got is _MORE:
                    await trio.lowlevel.checkpoint()
                elif not self.closing:  # (closing: everything is written, the top ends it)
                    await self.wake.wait()
        finally:
            self._drop_frame_in_progress()

    def _drain(self, now: float) -> object:
        """Write the frame in progress, then the connection's own bytes and the queued frames,
        until everything is written (``_DONE``), the socket is full (``_BLOCKED``) or
        DRAIN_BUDGET bytes went (``_MORE``: the rest after a checkpoint)."""
        budget = DRAIN_BUDGET
        self._draining = True
        try:
            while True:
                if self._tx_pending:
                    sent = self._write_tx()
                    if sent < 0:
                        self.tx_blocked += 1
                        return _BLOCKED
                    budget -= sent
                if budget <= 0:
                    return _MORE if (self.raw or self.outq) else _DONE
                if not self._next_tx(now):
                    return _DONE
        finally:
            self._draining = False

    def _write_tx(self) -> int:
        """Write ``_tx`` (with MSG_MORE when a held frame's payload follows) and then that
        payload from its pipe, or ``_tx`` and ``_tx_mem`` in one sendmsg: the bytes
        written, or -1 when the socket is full first."""
        if self._tx_mem is not None:
            return self._write_mem()
        sock = self._sock
        sent = 0
        tx = self._tx
        held = self._tx_held
        while tx is not None:
            try:
                k = sock.send(tx, socket.MSG_MORE if held is not None else 0)
            except (BlockingIOError, InterruptedError):
                self._tx = tx
                return -1
            sent += k
            tx = tx[k:] if k < len(tx) else None
        self._tx = None
        if held is None:
            return sent
        pipe = held.holder.pipe
        fd = sock.fileno()
        left = self._tx_left
        while left:
            try:
                k = splice(pipe.r, fd, left)
            except (BlockingIOError, InterruptedError):
                self._tx_left = left
                return -1
            if k == 0:
                raise OSError(f"pipe of stream {held.stream_id} ran dry with {left} bytes to go")
            pipe.held -= k
            sent += k
            if k < left:  # the socket took less: it is full (no splice to find out)
                self._tx_left = left - k
                return -1
            left = 0
        self._tx_left = 0
        self._tx_held = None
        self.spliced_out += held.nbytes
        self._drop_held(held)
        return sent

    def _write_mem(self) -> int:
        """``_tx`` then ``_tx_mem`` (the payload of a STREAM_DATA frame) with sendmsg: the
        bytes written, or -1 when the socket refuses more first. A short write is followed
        by another at once: it does not say the socket is full (on loopback the kernel
        takes a few segments a call while the peer keeps up; a wait for writability would
        cost a scheduler round for nothing), at most MEM_WRITES times (a peer that
        frees its window a few bytes at a time holds nobody up)."""
        sock = self._sock
        sent = 0
        for _ in range(MEM_WRITES):
            tx, mem = self._tx, self._tx_mem
            try:
                k = sock.sendmsg([tx, mem] if tx is not None else [mem])
            except (BlockingIOError, InterruptedError):
                return -1
            if not k:
                return -1
            sent += k
            if tx is not None:
                if k < len(tx):
                    self._tx = tx[k:]
                    continue
                k -= len(tx)
                self._tx = None
            if k < len(mem):
                self._tx_mem = mem[k:]
                continue
            self._tx_mem = None
            return sent
        return -1  # (the writer task goes on once the socket is writable)

    def _next_tx(self, now: float) -> bool:
        """Take the next bytes to write: the connection's own bytes, then queued frames
        (encoded, up to TX_BATCH bytes) up to and including one HeldData frame, whose
        payload is then spliced from its pipe. False when there is nothing to write."""
        parts: list = []
        if self.raw:
            parts.append(self._take_raw())
        freed = False
        state = self.conn.state
        if state is P.State.CONNECTED or state is P.State.DISCONNECTING:
            outq = self.outq
            size = 0
            while outq and size < TX_BATCH:
                f = outq.pop()
                if type(f) is S.HeldData:
                    freed = True
                    try:
                        parts.append(self.conn.send_data_head(f.stream_id, f.nbytes, now))
                    except P.LocalProtocolError:
                        self._drop_held(f)
                        continue
                    self.conn.stats.bytes_sent += f.nbytes
                    self._tx_held = f
                    self._tx_left = f.nbytes
                    break
                if type(f) is P.StreamData and len(f.data) >= SEND_MEM_MIN:
                    freed = True
                    try:
                        parts.append(self.conn.send_data_head(f.stream_id, len(f.data), now, f.whole))
                    except P.LocalProtocolError:
                        continue
                    self.conn.stats.bytes_sent += len(f.data)
                    self._tx_mem = memoryview(f.data)
                    break
                if type(f) is S.DatagramBatch:
                    freed = True
                    size += self._encode_datagrams(f, parts)
                elif self.conn.can_send(f):
                    data = self.conn.send(f, now)
                    parts.append(data)
                    size += len(data)
                    freed = freed or type(f) is P.StreamData
        if freed:
            self._credit_all()
        if not parts:
            return self._tx_held is not None or self._tx_mem is not None
        out = b"".join(parts)
        self._tx = memoryview(out) if out else None
        return self._tx_pending
