"""The I/O side of one connected peer link on trio: the sans-IO connection
(:class:`router.peerlink.PeerConnection`), its stream table, its bounded
writer queue, the reader (:meth:`Link.receive`) and the writer task. The
state of each relayed stream on either end of the link is a
:class:`StreamState`.

Over 600 lines because the reader and the writer of the zero-copy path share
the link's pipes, queue and stream states; splitting them would spread one
ordering rule (no byte overtakes another of its stream) over two modules.

Zero copy (a plain TCP link; not TLS): large STREAM_DATA payloads never enter Python (see
:mod:`router.splice`). The reader peeks at what the socket holds, hands
whole frames to the connection as usual and, when a STREAM_DATA frame of at
least SPLICE_MIN data bytes is next, consumes only its 16-byte head: the
connection checks and counts that head
(:meth:`~router.peerlink.PeerConnection.receive_data_head`: the checks,
liveness and statistics of a STREAM_DATA), the stream table accounts the real size
(:meth:`~router.peerlink.streams.StreamTable.receive_held`) and the payload
is spliced from the socket into the stream's pipe, to be spliced on into its
socket at once as far as that socket takes it, the rest by the stream's pump
(``StreamState.incoming`` holds :class:`PipeSeg` items between the ``bytes``
of the copy path, in order). The writer
writes a :class:`~router.peerlink.streams.HeldData` frame's head from the
connection (:meth:`~router.peerlink.PeerConnection.send_data_head`), then
splices the pipe. When no pipe is free, or the stream's pipe is full, bytes take the copy
path: correct either way, and bounded by the stream's credit.

Writing on a zero-copy link never waits in the middle of Python: :meth:`Link._drain`
writes the frame in progress (``_tx``, then the held frame's pipe) and the queued frames
as far as the socket takes them, and remembers where it stopped. The stream pumps call it
right after queueing a frame (:meth:`Link.send_now`: no scheduler round trip to the
writer task per frame); the writer task calls it when woken and waits for the socket
when it is full, so a frame cut by a full socket is finished before anything else.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from collections import deque

import trio

from . import peerlink as P
from .peerlink import streams as S
from .splice import PIPE_POOL, Pipe, PipePool, splice, splice_supported

log = logging.getLogger("lbmr-router")

CONNECT_TIMEOUT = 5.0  # seconds to connect to a real source (far side) or to the peer
READ_SIZE = 256 << 10  # bytes per read from the link and from relayed TCP streams
# Control frames (interest, advertisements, route info ...) queued for a peer before the
# link is closed as hopelessly behind: room for the interest and advertisements of tens of
# thousands of topics at once (a link coming up with 10,000 topics queues that many of
# each), about 100 bytes each.
MAX_CONTROL_FRAMES = 250_000
RAW_LIMIT = 1 << 20  # bytes of the connection's own answers (keepalive acks, ...) held unsent
FLUSH_TIMEOUT = 1.0  # seconds to write a link's last frames (e.g. DISCONNECT_OK) before closing
# Per-stream flow control: how many bytes a peer may send on one stream before
# credit comes back (also the most a stream buffers here), and the largest
# STREAM_DATA frame. bench/router.py: 256 KiB/64 KiB gave ~350 MB/s through two
# routers on loopback, 4 MiB/256 KiB ~760 MB/s.
# A stream's window starts at STREAM_WINDOW (the credit in STREAM_OPEN/ACCEPT) and
# doubles, up to STREAM_WINDOW_MAX, while its consumer keeps up, within
# LINK_WINDOW_BUDGET bytes of growth over all the link's streams: a stream never holds
# more than STREAM_WINDOW_MAX here, a link never more than STREAM_WINDOW per stream plus
# LINK_WINDOW_BUDGET. (bench/router.py, zero copy, busy 2-core host: a 4 MiB window
# stalled the stream whenever a router waited for the CPU, about 0.6 of the splice relay;
# windows of 16 to 32 MiB about 0.7 to 0.75, with a third less CPU per byte.)
STREAM_WINDOW = 4 << 20
STREAM_WINDOW_MAX = 32 << 20
LINK_WINDOW_BUDGET = 128 << 20
# The initial windows of a link's open streams total at most LINK_INITIAL_BUDGET: past
# it a new stream starts at 64 KiB (and grows while its consumer keeps up). A TRD's
# receivers that open thousands of streams and never read hold at most this, plus 64 KiB
# a stream beyond it, plus LINK_WINDOW_BUDGET (4096 such streams: 16 GiB before).
LINK_INITIAL_BUDGET = 128 << 20
STREAM_FRAME = 256 << 10
# Zero-copy path (plain TCP links): frames of up to a pipe's worth (MAX_PAYLOAD less the
# stream id); payloads from SPLICE_MIN bytes on are spliced, smaller ones copied; the reader
# peeks PEEK_SIZE bytes at a time. LBMR_ROUTER_ZERO_COPY=0 in the environment turns it off
# (bench/router.py measures both paths).
SPLICE_FRAME = P.MAX_PAYLOAD - 4
SPLICE_MIN = 16 << 10
PEEK_SIZE = 64 << 10  # bytes peeked: whole bursts of control frames and datagrams at a time ...
PEEK_AFTER_SPLICE = 16  # ... but after a spliced frame, likely followed by another: its head (read)
# pipes one stream may be filling at once before its bytes take the copy path. Full pipes
# waiting for the stream's socket to drain them (rx_retired) are not counted: a stream holds
# at most its receive window in pipes (bytes the peer may send it), and a router at most its
# PipePool's limit (256 pipes of 1 MiB) in all; a stream whose window grew has a consumer
# that keeps up, so its pipes rarely wait long
RX_PIPES = 4
# The reader lets the other tasks run after each read that did not wait, except between
# spliced STREAM_DATA frames: after RX_YIELD bytes of them (each such pause costs a round of
# the scheduler and an epoll_wait, a few percent of a router's CPU at one frame a pause).
RX_YIELD = 4 << 20
ZERO_COPY = os.environ.get("LBMR_ROUTER_ZERO_COPY", "1") != "0"
# Zero-copy writer: encoded frames taken from the queue at a time (before one held frame),
# and bytes written by one drain before the writer lets other tasks run.
TX_BATCH = 256 << 10
DRAIN_BUDGET = 8 << 20
# STREAM_DATA frames of at least this many data bytes are written as their 16-byte head
# (PeerConnection.send_data_head) and their data, from memory, in one sendmsg: no copy
SEND_MEM_MIN = 4 << 10
_DONE, _BLOCKED, _MORE = "done", "blocked", "more"
_DATA_HEAD = P.HEADER_SIZE + 4  # header and stream id of a STREAM_DATA frame
_LEN4 = struct.pack(">I", 4)


class PipeSeg:
    """``nbytes`` of a stream's bytes from the peer, in order, at the head of ``pipe``."""

    __slots__ = ("pipe", "nbytes")

    def __init__(self, pipe: Pipe, nbytes: int) -> None:
        self.pipe = pipe
        self.nbytes = nbytes


class HeldChunk:
    """The pipe of one queued :class:`~router.peerlink.streams.HeldData` frame; ``done``
    once the writer wrote it (or the link threw it away)."""

    __slots__ = ("pipe", "done")

    def __init__(self, pipe: Pipe) -> None:
        self.pipe = pipe
        self.done = False


class StreamState:
    """The I/O side of one relayed stream (either end of the link)."""

    def __init__(self, sid: int, kind: int) -> None:
        self.sid = sid
        self.kind = kind
        self.accepted = trio.Event()
        self.refused: str | None = None
        self.credit = trio.Event()  # set when credit may have become available
        self.incoming: deque[bytes] = deque()  # data or datagrams from the peer
        self.incoming_ready = trio.Event()
        self.closed = False
        self.sock = None  # trio SocketStream (TCP) or UDP socket (far LBT-RU)
        self.ru_addr: tuple[str, int] | None = None  # near LBT-RU: the receiver
        # False when ``sock`` belongs to someone else (near LBT-RU: the proxy's socket,
        # shared by all its receivers and still read by the proxy after the link ends)
        self.owns_sock = True
        self.last_active = 0.0  # LBT-RU: when a datagram last crossed (either way)
        self.advert_id = 0  # far side: the advertisement the peer opened the stream for
        self.source_ended = False  # the local socket ended (far side: the source closed it)
        # zero copy: the pipe the link's reader splices the peer's bytes into, older ones
        # still holding bytes, how many the stream holds (the bytes are PipeSeg items of
        # ``incoming``); the reader is in the middle of a payload for this stream
        self.rx_pipe: Pipe | None = None
        self.rx_retired: set[Pipe] = set()
        self.rx_pipes = 0
        self.rx_splicing = False
        self.sink_broken = False  # splicing into ``sock`` failed: the pump ends the stream

    def wake(self) -> None:
        self.incoming_ready.set()
        self.credit.set()


def forget_stream(link, st: StreamState) -> None:
    """Close stream ``st`` towards ``link``'s other end (a :class:`Link` or a
    :class:`router.pair_link.PairLink`; unless the stream or the link is closed
    already) and forget its state."""
    if not link.closed:
        try:
            if link.streams.close(st.sid):
                link.flush_streams()
        except S.LocalStreamError:
            pass
    if link.state.get(st.sid) is st:
        del link.state[st.sid]


class Link:
    """One connected peer link: the connection, its streams and its writer.
    ``peer_name`` is the configured peer's name (for logs); ``max_queue`` the
    writer queue's bound on data bytes."""

    def __init__(self, conn: P.PeerConnection, stream, *, peer_name: str, max_queue: int,
                 zero_copy: bool | None = None, pipes: PipePool | None = None) -> None:
        self.peer_name = peer_name
        self.conn = conn
        self.stream = stream
        self.pipes = PIPE_POOL if pipes is None else pipes
        # zero copy: a descriptor of our own on the link socket (MSG_PEEK, splice, MSG_MORE),
        # for a plain TCP link only
        self._sock: socket.socket | None = None
        want = ZERO_COPY if zero_copy is None else zero_copy
        if (want and splice_supported() and isinstance(stream, trio.SocketStream)
                and stream.socket.family in (socket.AF_INET, socket.AF_INET6)):
            self._sock = socket.socket(fileno=os.dup(stream.socket.fileno()))
            self._sock.setblocking(False)
        self.zero_copy = self._sock is not None
        self.streams = S.StreamTable(conn.role, initial_window=STREAM_WINDOW, max_window=STREAM_WINDOW_MAX,
                                     initial_budget=LINK_INITIAL_BUDGET,
                                     window_budget=LINK_WINDOW_BUDGET,
                                     max_frame=SPLICE_FRAME if self.zero_copy else STREAM_FRAME)
        self._head = b""  # consumed from the socket, not yet given to the connection (< 16 bytes)
        self._frame_left = 0  # bytes of a frame being passed to the connection piecewise
        self._peek_size = PEEK_SIZE
        self._rx_waited = False  # the reader waited for the socket since receive() last began
        self._rx_unyielded = 0  # spliced bytes received since the reader last let others run
        self._rx_charge = RX_YIELD  # what the last receive() adds to it
        self._left = 0  # payload bytes still to come of the frame being spliced
        self._waited = False  # the last move waited for the socket instead of probing it
        self._pipe_full = False  # the last move most likely filled the stream's pipe
        self._scratch: bytearray | None = None
        self.spliced_in = 0  # payload bytes spliced from the link / into it
        self.spliced_out = 0
        # zero-copy writer: bytes taken from the queue and not yet written, then the held
        # frame whose payload follows them (``_tx_left`` bytes of it still in its pipe)
        self._tx: memoryview | None = None
        self._tx_held: S.HeldData | None = None
        self._tx_left = 0
        # ... or the payload of a STREAM_DATA frame, written from memory after ``_tx``
        self._tx_mem: memoryview | None = None
        self._draining = False
        self._tx_full = False  # a pump's drain found the socket full: the writer waits first
        self.tx_blocked = 0  # times the zero-copy writer found the socket full mid-frame
        self.outq = P.OutQueue(max_control=MAX_CONTROL_FRAMES, max_data_bytes=max_queue)
        self.raw = bytearray()  # bytes the connection produced (handshake, acks)
        self.raw_taken = trio.Event()  # set (and replaced) whenever the writer takes ``raw``
        self.handshake: trio.CancelScope | None = None  # an incoming link until its handshake completes
        self.wake_writer = trio.Event()
        self.state: dict[int, StreamState] = {}
        self.up = trio.Event()
        self.closed = False
        self.closing = False  # finished: the writer flushes what the connection produced, then stops
        self.writer_done = trio.Event()
        self.nursery: trio.Nursery | None = None  # stream tasks of this link die with it
        self.ru_streams = 0  # LBT-RU streams we opened (near side) ...
        self.ru_streams_far = 0  # ... and the peer opened (far side)

    @property
    def connected(self) -> bool:
        return self.conn.state is P.State.CONNECTED

    @property
    def _tx_pending(self) -> bool:
        """The zero-copy writer is in the middle of a frame: bytes taken from the queue
        (``_tx``), a held frame's pipe or a frame's payload in memory still to write."""
        return self._tx is not None or self._tx_held is not None or self._tx_mem is not None

    @property
    def capabilities(self) -> int:
        """The capabilities both ends set (:class:`router.peerlink.Capability` bits)."""
        return self.conn.capabilities

    @property
    def state_name(self) -> str:
        """The connection's state, as ``/status`` shows it."""
        return self.conn.state.value

    def put(self, frame: P.Frame, wake: bool = True) -> bool:
        try:
            ok = self.outq.put(frame)
        except P.OutQueueOverflow as e:
            log.error("peer %s: %s; closing the link", self.peer_name, e)
            self.closed = True
            ok = False
        if wake:
            self.wake_writer.set()
        return ok

    def flush_streams(self, direct: bool = False) -> None:
        """Queue the stream table's frames for the writer. ``direct`` (the data pumps, after
        queueing a frame of their own): on a zero-copy link whose writer is not in the middle
        of a frame, write what the socket takes now, from this task (no scheduler round trip
        to the writer per frame); the writer task does the rest."""
        frames = self.streams.frames_to_send()
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
            self.wake_writer.set()
            return
        try:
            got = self._drain(trio.current_time())
        except OSError:
            got = None
        if got is not _DONE:
            self._tx_full = got is _BLOCKED
            self.wake_writer.set()

    def push_raw(self, data: bytes) -> None:
        if data:
            self.raw += data
            self.wake_writer.set()

    async def finish(self, scope: trio.CancelScope) -> None:
        """End the link: let the writer flush the connection's last bytes, then cancel."""
        self.closing = True
        self.wake_writer.set()
        with trio.move_on_after(FLUSH_TIMEOUT):
            await self.writer_done.wait()
        scope.cancel()

    async def writer(self) -> None:
        if self._sock is not None:
            await self._writer_zero_copy()
            return
        popped: list = []  # taken from the queue, not yet written (their pipes, on the way out)
        i = 0
        try:
            while not self.closed:
                if self.closing and not self.raw:
                    self.writer_done.set()
                    return
                await self.wake_writer.wait()
                self.wake_writer = trio.Event()
                now = trio.current_time()
                out = bytes(self.raw)
                self.raw.clear()
                self.raw_taken.set()
                self.raw_taken = trio.Event()
                parts = [out]
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
                        self.wake_writer.set()
                out = b"".join(parts)
                if out:
                    await self._send(out)
                    for st in self.state.values():
                        st.credit.set()  # queue space freed: writers may retry
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

    # --------------------------------------------- writing, zero-copy links

    async def _writer_zero_copy(self) -> None:
        """The writer of a zero-copy link: :meth:`_drain` (also called by the data pumps
        through :meth:`send_now`) writes without waiting; this task waits for the socket
        when it is full, and for work when everything is written."""
        try:
            while not self.closed:
                if self.closing and not self.raw and not self._tx_pending:
                    self.writer_done.set()
                    return
                if self._tx_full:  # no write to find out again
                    self._tx_full = False
                    await self._wait(trio.lowlevel.wait_writable)
                    continue
                self.wake_writer = trio.Event()  # work queued from here on wakes us
                got = self._drain(trio.current_time())
                if got is _BLOCKED:
                    await self._wait(trio.lowlevel.wait_writable)
                elif got is _MORE:
                    await trio.lowlevel.checkpoint()
                elif not self.closing:  # (closing: everything is written, the top ends it)
                    await self.wake_writer.wait()
        finally:
            held, self._tx_held = self._tx_held, None
            self._tx = self._tx_mem = None
            if held is not None:
                self._drop_held(held)

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
        bytes written, or -1 when the socket is full first (a short write says so)."""
        tx, mem = self._tx, self._tx_mem
        try:
            k = self._sock.sendmsg([tx, mem] if tx is not None else [mem])
        except (BlockingIOError, InterruptedError):
            return -1
        sent = k
        if tx is not None:
            if k < len(tx):
                self._tx = tx[k:]
                return -1
            k -= len(tx)
            self._tx = None
        if k < len(mem):
            self._tx_mem = mem[k:]
            return -1
        self._tx_mem = None
        return sent

    def _next_tx(self, now: float) -> bool:
        """Take the next bytes to write: the connection's own bytes, then queued frames
        (encoded, up to TX_BATCH bytes) up to and including one HeldData frame, whose
        payload is then spliced from its pipe. False when there is nothing to write."""
        parts: list = []
        if self.raw:
            parts.append(bytes(self.raw))
            self.raw.clear()
            self.raw_taken.set()
            self.raw_taken = trio.Event()
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
                        parts.append(self.conn.send_data_head(f.stream_id, len(f.data), now))
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
            for st in self.state.values():
                st.credit.set()  # queue space freed: writers may retry
        if not parts:
            return self._tx_held is not None or self._tx_mem is not None
        out = b"".join(parts)
        self._tx = memoryview(out) if out else None
        return self._tx_pending

    async def _send(self, data: bytes, more: bool = False) -> None:
        if self._sock is None:
            await self.stream.send_all(data)
            return
        mv = memoryview(data)
        flags = socket.MSG_MORE if more else 0
        while mv:
            try:
                k = self._sock.send(mv, flags)
            except (BlockingIOError, InterruptedError):
                await self._wait(trio.lowlevel.wait_writable)
                continue
            mv = mv[k:]

    async def _wait(self, waiter) -> None:
        """Wait until the link socket is readable/writable; ClosedResourceError if the
        link's stream was closed (e.g. cut from outside)."""
        sock = self.stream.socket
        if sock.fileno() < 0:
            raise trio.ClosedResourceError("the peer link's socket was closed")
        if waiter is trio.lowlevel.wait_readable:
            self._rx_waited = True  # the reader let the others run (no checkpoint needed)
        await waiter(sock)

    def _drop_held(self, f: S.HeldData) -> None:
        """The frame is written (or thrown away): its pipe goes back, its pump wakes."""
        chunk = f.holder
        if isinstance(chunk, HeldChunk) and not chunk.done:
            chunk.done = True
            self.pipes.release(chunk.pipe)
        st = self.state.get(f.stream_id)
        if st is not None:
            st.credit.set()

    async def _write_held(self, f: S.HeldData, parts: list, now: float) -> None:
        """One HeldData frame: everything before it and its header, then its pipe."""
        chunk = f.holder
        try:
            try:
                parts.append(self.conn.send_data_head(f.stream_id, f.nbytes, now))
            except P.LocalProtocolError:
                return
            self.conn.stats.bytes_sent += f.nbytes
            out = b"".join(parts)
            pipe = chunk.pipe
            if self._sock is None:  # not a zero-copy link: read the pipe (not normally used)
                await self._send(out)
                left = f.nbytes
                while left:
                    data = os.read(pipe.r, left)
                    pipe.held -= len(data)
                    left -= len(data)
                    await self._send(data)
                return
            await self._send(out, more=True)
            left = f.nbytes
            while left:
                try:
                    k = splice(pipe.r, self._sock.fileno(), left)
                except (BlockingIOError, InterruptedError):
                    await self._wait(trio.lowlevel.wait_writable)
                    continue
                if k == 0:
                    raise OSError(f"pipe of stream {f.stream_id} ran dry with {left} bytes to go")
                left -= k
                pipe.held -= k
            self.spliced_out += f.nbytes
        finally:
            self._drop_held(f)

    # ------------------------------------------------------------- reading

    async def receive(self) -> tuple[list, bool]:
        """Read from the link: the connection's frames and events for what arrived, and
        True when the peer closed the connection. On a zero-copy link the payloads of large
        STREAM_DATA frames are spliced to their streams before this returns."""
        if self._sock is None:
            data = await self.stream.receive_some(READ_SIZE)
            return self.conn.receive_data(data, trio.current_time()), not data
        # fairness: a busy link never starves the pumps; it lets them run after every call
        # that did not wait, except in a run of spliced data frames: after RX_YIELD bytes
        unyielded = 0 if self._rx_waited else self._rx_unyielded + self._rx_charge
        if unyielded >= RX_YIELD:
            unyielded = 0
            await trio.lowlevel.checkpoint()
        self._rx_unyielded = unyielded
        self._rx_charge = RX_YIELD  # (a spliced frame charges its size instead)
        self._rx_waited = False
        while True:
            if self.stream.socket.fileno() < 0:
                raise trio.ClosedResourceError("the peer link's socket was closed")
            if self._frame_left:
                data = await self._recv(min(self._frame_left, READ_SIZE))
                if not data:
                    return self._eof()
                self._frame_left -= len(data)
                return self._feed(data), False
            after_splice = self._peek_size == PEEK_AFTER_SPLICE and len(self._head) < _DATA_HEAD
            try:
                if after_splice:  # most likely the head of the next data frame: read it outright
                    peek = self._sock.recv(_DATA_HEAD - len(self._head))
                else:
                    peek = self._sock.recv(self._peek_size, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                await self._wait(trio.lowlevel.wait_readable)
                continue
            if not peek:
                return self._eof()
            if after_splice:  # consumed: it is part of the head now (_cut takes from there)
                self._head += peek
                peek = b""
            view = self._head + peek if self._head else peek
            got = await self._cut(view)
            if got is not None:
                return got, False

    def _eof(self) -> tuple[list, bool]:
        head, self._head = self._head, b""
        items = self.conn.receive_data(head, trio.current_time()) if head else []
        return items + self.conn.receive_data(b"", trio.current_time()), True

    def _feed(self, data: bytes) -> list:
        return self.conn.receive_data(data, trio.current_time())

    def _take(self, nbytes: int) -> bytes:
        """``nbytes`` of ``_head`` + the peeked bytes, now consumed from the socket."""
        head = self._head
        self._head = b""
        k = nbytes - len(head)
        if k <= 0:
            self._head = head[nbytes:]
            return head[:nbytes]
        data = self._sock.recv(k)  # peeked already: there at once, in full
        if len(data) != k:
            raise OSError(f"peer link: {len(data)} of {k} peeked bytes read")
        return head + data

    def _may_splice(self) -> bool:
        return self.conn.state is P.State.CONNECTED and self.conn.has_streams

    async def _cut(self, view: bytes) -> list | None:
        """Consume the whole frames at the start of ``view`` (the head and the bytes
        peeked), or the head of a STREAM_DATA frame to splice; the connection's items,
        or None when more bytes must arrive first."""
        n = len(view)
        pos = 0
        max_payload = self.conn.max_payload
        while pos + P.HEADER_SIZE <= n:
            magic, ver, ftype, _, _, length = P.HEADER.unpack_from(view, pos)
            if magic != P.MAGIC or ver != P.WIRE_VERSION or length > max_payload:
                return self._feed(self._take(n))  # the connection refuses it
            if (ftype == P.FrameType.DATAGRAM and 4 <= length and pos + P.HEADER_SIZE + length <= n
                    and self._may_datagram()):
                if pos:
                    break
                return self._receive_datagrams(view)
            if (ftype == P.FrameType.STREAM_DATA and length - 4 >= SPLICE_MIN
                    and self._may_splice()):
                if pos:
                    break
                if n < _DATA_HEAD:
                    return self._need(n)
                self._peek_size = PEEK_AFTER_SPLICE
                return await self._receive_held(self._take(_DATA_HEAD), length - 4)
            self._peek_size = PEEK_SIZE
            total = P.HEADER_SIZE + length
            if pos + total > n:
                if pos:
                    break
                self._frame_left = total - n  # a frame larger than what is here: piecewise
                return self._feed(self._take(n))
            pos += total
        if pos:
            return self._feed(self._take(pos))
        return self._need(n)

    def _need(self, n: int) -> None:
        """Fewer bytes than a frame header (or a data frame's head) are here: keep them
        (consumed, so that the next wake-up means new bytes) and wait for more."""
        self._head = self._take(n)
        return None

    def _may_datagram(self) -> bool:
        return (self.conn.state is P.State.CONNECTED
                and bool(self.conn.capabilities & P.Capability.DATAGRAMS))

    def _receive_datagrams(self, view: bytes) -> list | None:
        """The run of whole DATAGRAM frames at the start of ``view``, straight to their
        streams (no frame objects, no events): the connection sees the first one's head,
        as an empty DATAGRAM, for its checks and liveness; the stream table checks each."""
        n = len(view)
        pos = count = 0
        while pos + P.HEADER_SIZE <= n:
            magic, ver, ftype, _, _, length = P.HEADER.unpack_from(view, pos)
            if (ftype != P.FrameType.DATAGRAM or magic != P.MAGIC or ver != P.WIRE_VERSION
                    or not 4 <= length <= self.conn.max_payload or pos + P.HEADER_SIZE + length > n):
                break
            pos += P.HEADER_SIZE + length
            count += 1
        data = self._take(pos)  # at least one (checked by the caller)
        items = self._feed(data[:8] + _LEN4 + data[12:16])
        last = items[-1] if items else None
        if not (isinstance(last, P.Datagram) and not last.data and self.conn.state is P.State.CONNECTED):
            return items  # refused by the connection: the link ends
        items.pop()
        stats = self.conn.stats
        stats.frames_received += count - 1
        stats.bytes_received += pos - _DATA_HEAD
        table, states = self.streams, self.state
        woken: set[StreamState] = set()
        mv = memoryview(data)
        pos = 0
        while pos < len(data):
            length = int.from_bytes(mv[pos + 8:pos + 12], "big")
            sid = int.from_bytes(mv[pos + 12:pos + 16], "big")
            end = pos + P.HEADER_SIZE + length
            if table.receive_datagram(sid, length - 4) is not None:
                st = states.get(sid)
                if st is not None:
                    st.incoming.append(bytes(mv[pos + 16:end]))
                    woken.add(st)
            pos = end
        for st in woken:
            st.incoming_ready.set()
        return items

    async def _recv(self, nbytes: int) -> bytes:
        while True:
            try:
                return self._sock.recv(nbytes)
            except (BlockingIOError, InterruptedError):
                await self._wait(trio.lowlevel.wait_readable)

    async def _receive_held(self, head: bytes, nbytes: int) -> list:
        """A STREAM_DATA frame of ``nbytes`` data bytes whose 16-byte head was consumed."""
        sid = int.from_bytes(head[12:16], "big")
        items = self.conn.receive_data_head(head, trio.current_time())
        if items is None:
            items = []  # accepted (the connection's fast path)
        else:
            last = items[-1] if items else None
            if not (isinstance(last, P.StreamData) and last.stream_id == sid and not last.data
                    and self.conn.state is P.State.CONNECTED):
                return items  # refused by the connection: the link ends, the payload stays unread
            items.pop()
        self.conn.stats.bytes_received += nbytes
        self._rx_charge = nbytes
        events = self.streams.receive_held(sid, nbytes)
        st = self.state.get(sid)
        if not (events and isinstance(events[0], S.DataArriving)) or st is None or st.closed:
            self.flush_streams()  # e.g. STREAM_CLOSE after a credit violation
            await self._discard(nbytes)
            return items
        st.rx_splicing = True
        try:
            await self._splice_payload(st, nbytes)
        finally:
            st.rx_splicing = False
            if st.rx_pipe is not None and (st.rx_pipe.held == 0 or self.state.get(sid) is not st):
                self._retire(st)  # drained meanwhile, or the stream is gone
            if self.state.get(sid) is not st:
                self.release_stream(st)
        return items

    async def _splice_payload(self, st: StreamState, nbytes: int) -> None:
        """Move ``nbytes`` of payload from the link to ``st``: into its pipes (up to
        RX_PIPES of them) while there is room, else copied into ``st.incoming``; what the
        stream's socket takes at once goes on at once (:meth:`forward`). A stream without
        a socket to splice into (e.g. a fanned-out session's) gets the payload whole."""
        self._left = nbytes
        self._waited = False
        self._pipe_full = False
        if not (st.kind == P.StreamKind.TCP and isinstance(st.sock, trio.SocketStream)):
            self._rx_charge = RX_YIELD  # (its consumer runs before the next frame)
            await self._receive_whole(st, nbytes)
            return
        while self._left:
            await self._splice_step(st)

    async def _receive_whole(self, st: StreamState, nbytes: int) -> None:
        """Read ``nbytes`` of payload into a buffer of their own, then hand it to ``st``
        at once (a read-only view, never written again): one item and one wake-up of
        the stream per frame, whatever the pieces the link's socket gives."""
        buf = memoryview(bytearray(nbytes))
        while self._left:
            try:
                k = self._sock.recv_into(buf[nbytes - self._left:])
            except (BlockingIOError, InterruptedError):
                await self._wait_payload(st)  # (the stream ended: the rest is dropped)
                continue
            if not k:
                raise trio.BrokenResourceError("the peer closed the link in the middle of a frame")
            self._left -= k
        if self.state.get(st.sid) is st and not st.closed:
            st.incoming.append(buf.toreadonly())
            st.incoming_ready.set()

    def _fill_pipe(self, st: StreamState, full: bool) -> Pipe | None:
        """The pipe to splice the stream's bytes into: the current one, or (none yet, or
        ``full``) a new one if the stream holds fewer than RX_PIPES and the pool has one."""
        pipe = st.rx_pipe
        if pipe is not None and not full:
            return pipe
        if st.rx_pipes >= RX_PIPES:
            return None
        new = self.pipes.acquire()
        if new is None:
            return None
        if pipe is not None and pipe.held == 0:
            self.pipes.release(pipe)
        elif pipe is not None:
            st.rx_pipes -= 1  # stays in use until its segments are delivered, then released
            st.rx_retired.add(pipe)
        st.rx_pipe = new
        st.rx_pipes += 1
        return new

    async def _splice_step(self, st: StreamState) -> None:
        """One move of :meth:`_splice_payload` (``self._left`` is what is still to come).
        (No SO_RCVLOWAT to wake less often: a low-water mark above what the receive
        window lets in would stall the link.)"""
        left = self._left
        pipe = self._fill_pipe(st, self._pipe_full)
        self._pipe_full = False
        if pipe is not None:
            try:
                k = splice(self._sock.fileno(), pipe.w, left)
            except (BlockingIOError, InterruptedError):
                k = -1  # the socket is empty or the pipe full
            if k == 0:
                raise trio.BrokenResourceError("the peer closed the link in the middle of a frame")
            if k > 0:
                self._waited = False
                self._left = left - k
                self._pipe_in(st, pipe, k)
                # Short, and the pipe holds half its size: most likely full (a pipe slot
                # holds at most a page, so a pipe of payload spliced from TCP fills at about
                # 60 %): the next move takes a new pipe without a splice to find out.
                self._pipe_full = k < left and pipe.held >= pipe.capacity // 2
                return
            if pipe.held >= pipe.capacity // 2 or self._waited:  # full, or nothing to be had
                if self._fill_pipe(st, True) is not None:
                    self._waited = False
                    return  # splice into the new pipe
            else:
                # the pipe has room, so the socket is empty: wait (no recv to find out)
                await self._wait_payload(st)
                self._waited = True  # if splice still cannot move anything, recv decides
                return
        self._waited = False
        try:
            data = self._sock.recv(min(left, READ_SIZE))
        except (BlockingIOError, InterruptedError):
            await self._wait_payload(st)
            return
        if not data:
            raise trio.BrokenResourceError("the peer closed the link in the middle of a frame")
        self._left = left - len(data)
        st.incoming.append(data)
        st.incoming_ready.set()

    def _pipe_in(self, st: StreamState, pipe: Pipe, k: int) -> None:
        """``k`` bytes were spliced into ``pipe`` for ``st``: count them at the tail of
        ``st.incoming`` and pass on at once what the socket takes."""
        pipe.held += k
        self.spliced_in += k
        inc = st.incoming
        if inc and type(inc[-1]) is PipeSeg and inc[-1].pipe is pipe:
            inc[-1].nbytes += k
        else:
            inc.append(PipeSeg(pipe, k))
        if len(inc) == 1 and not self.forward(st):
            st.incoming_ready.set()  # the rest: the stream's pump, when the socket takes it

    async def _wait_payload(self, st: StreamState) -> None:
        """Wait for more of a payload; if its stream ended meanwhile, drop the rest."""
        await self._wait(trio.lowlevel.wait_readable)
        if self.state.get(st.sid) is not st or st.closed:
            left, self._left = self._left, 0
            await self._discard(left)

    def forward(self, st: StreamState) -> bool:
        """Splice the pipe segments at the head of ``st.incoming`` into the stream's socket
        as far as it takes them now (never waits). True when the head is no longer a pipe
        segment (all went, or bytes are next), False when bytes are left in the pipe (the
        socket is full, or failed: the pump, which waits for the socket, finds out).
        Credit is returned for what went."""
        inc = st.incoming
        fd = st.sock.socket.fileno()
        moved = 0
        try:
            while inc and type(inc[0]) is PipeSeg:
                seg = inc[0]
                try:
                    k = splice(seg.pipe.r, fd, seg.nbytes)
                except (BlockingIOError, InterruptedError):
                    return False
                except OSError:
                    st.sink_broken = True  # the receiver went away (or the link took the pipe)
                    return False
                if k <= 0:
                    st.sink_broken = True
                    return False
                moved += k
                self.pipe_out(st, seg, k)
            return True
        finally:
            if moved:
                self._consumed(st, moved)
                self.flush_streams(direct=True)

    def _consumed(self, st: StreamState, nbytes: int) -> None:
        try:
            self.streams.consumed(st.sid, nbytes)
        except S.LocalStreamError:
            pass

    def pipe_out(self, st: StreamState, seg: PipeSeg, k: int) -> None:
        """``k`` bytes of the head segment ``seg`` went to the stream's socket: account
        them (the caller returns their credit), drop the segment when done, give back
        drained pipes."""
        seg.nbytes -= k
        pipe = seg.pipe
        pipe.held -= k
        if seg.nbytes:
            return
        st.incoming.popleft()
        if pipe.held == 0:
            if pipe in st.rx_retired:
                st.rx_retired.discard(pipe)
                self.pipes.release(pipe)
            elif pipe is st.rx_pipe and not st.rx_splicing:
                self._retire(st)

    def _retire(self, st: StreamState) -> None:
        """Give back the stream's fill pipe (empty, or the stream is gone)."""
        if st.rx_pipe is not None:
            self.pipes.release(st.rx_pipe)
            st.rx_pipe = None
            st.rx_pipes -= 1

    async def _discard(self, nbytes: int) -> None:
        """Read and drop ``nbytes`` of payload (refused or for a stream that is gone)."""
        if self._scratch is None:
            self._scratch = bytearray(64 << 10)
        mv = memoryview(self._scratch)
        while nbytes:
            try:
                k = self._sock.recv_into(mv[:min(nbytes, len(mv))])
            except (BlockingIOError, InterruptedError):
                await self._wait(trio.lowlevel.wait_readable)
                continue
            if not k:
                raise trio.BrokenResourceError("the peer closed the link in the middle of a frame")
            nbytes -= k

    # ------------------------------------------------------------- streams

    def close_stream(self, st: StreamState) -> None:
        """Close stream ``st`` towards the peer (unless it is closed already), forget it
        and give back its pipes."""
        forget_stream(self, st)
        self.release_stream(st)

    def release_stream(self, st: StreamState) -> None:
        """A stream is over: give back its pipes (closed if they still hold bytes)."""
        if st.rx_splicing:
            return  # the reader gives them back when it is done with the payload
        self._retire(st)
        for pipe in st.rx_retired:
            self.pipes.release(pipe)
        st.rx_retired.clear()

    def down(self) -> None:
        """The link has ended: close every stream's state and socket, release every pipe."""
        self.closed = True
        held, self._tx_held = self._tx_held, None
        self._tx = self._tx_mem = None
        if held is not None:
            self._drop_held(held)
        for f in self.outq.take_all():
            if isinstance(f, S.HeldData):
                self._drop_held(f)
        for st in self.state.values():
            st.closed = True
            st.accepted.set()  # nobody waits for an answer that cannot come
            st.wake()
            st.rx_splicing = False
            self.release_stream(st)
            if st.sock is not None and st.owns_sock and hasattr(st.sock, "close"):
                st.sock.close()
        if self._sock is not None:
            self._sock.close()
