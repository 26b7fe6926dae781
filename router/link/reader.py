"""The reader of one zero-copy peer link on trio (:class:`LinkReader`; a plain TCP
link, not TLS): large STREAM_DATA payloads never enter Python (see
:mod:`router.link.splice`).

The reader peeks at what the socket holds, hands whole frames to the connection
as usual and, when a STREAM_DATA frame of at least SPLICE_MIN data bytes is next,
consumes only its 16-byte head: the connection checks and counts that head
(:meth:`~router.peerlink.PeerConnection.receive_data_head`: the checks, liveness
and statistics of a STREAM_DATA), the stream table accounts the real size
(:meth:`~router.peerlink.streams.StreamTable.receive_held`) and the payload is
spliced from the socket into the stream's pipe, to be spliced on into its socket at
once as far as that socket takes it (:meth:`LinkReader.forward`), the rest by the
stream's pump (in the order of :mod:`router.link.stream`). When no pipe is free, or
the stream's pipe is full, bytes take the copy path: correct either way, and bounded
by the stream's credit. Runs of whole DATAGRAM frames go straight to their streams.
"""

from __future__ import annotations

import socket

import trio

from lbmr_runtime.buffers import BufferPool

from .. import peerlink as P
from ..peerlink import streams as S
from .splice import Pipe, PipePool, splice
from .stream import READ_SIZE, STREAM_WINDOW_MAX, SplicedBytes, StreamState
from .writer import LinkWriter, wait_link_socket

SPLICE_MIN = 16 << 10  # payloads from this many bytes on are spliced, smaller ones copied
PEEK_SIZE = 64 << 10  # bytes peeked: whole bursts of control frames and datagrams at a time ...
PEEK_AFTER_SPLICE = 16  # ... but after a spliced frame, likely followed by another: its head (read)
# The reader lets the other tasks run after each read that did not wait, except between
# large STREAM_DATA frames (spliced, or read whole for a fanned-out session): after RX_YIELD
# bytes of them (each such pause costs a round of the scheduler and an epoll_wait, a few
# percent of a router's CPU at one frame a pause; a fanned-out stream's task then takes the
# payloads held in one go).
RX_YIELD = 4 << 20
# buffers of whole payloads (a fanned-out session's, one per frame; MAX_PAYLOAD bytes each)
# kept for use again: as many as a stream at full speed holds, its window of frames and a
# few more for its queues (on a busy host a stream's window grows to STREAM_WINDOW_MAX, and
# every frame beyond the kept buffers cost a fresh MiB: page faults and zeroing, 5 % of
# router B's CPU with 16 kept); so at most 36 MiB a link, in use or not, held only once a
# stream needed them (beyond them, frames get buffers of their own). Frames larger than
# MAX_PAYLOAD (LARGE_FRAMES) take buffers of LARGE_PAYLOAD bytes: RX_LARGE_BUFFERS of them
# kept (as many bytes)
RX_BUFFERS = STREAM_WINDOW_MAX // P.MAX_PAYLOAD + 4
RX_LARGE_BUFFERS = RX_BUFFERS * P.MAX_PAYLOAD // P.LARGE_PAYLOAD
_DATA_HEAD = P.HEADER_SIZE + 4  # header and stream id of a STREAM_DATA frame
_LEN4 = (4).to_bytes(4, "big")
# capability bits as plain ints (``int & IntFlag`` goes through enum: microseconds a frame)
_WHOLE_MESSAGES = int(P.Capability.WHOLE_MESSAGES)
_DATAGRAMS = int(P.Capability.DATAGRAMS)


class LinkReader:
    """The reader of one zero-copy peer link: ``sock`` (a non-blocking descriptor of
    our own on the socket of ``stream``, the link's trio stream), ``conn`` (its
    sans-IO connection), ``streams`` and ``state`` (the link's stream table and
    stream states, by stream id), ``pipes`` (where the streams' pipes come from) and
    ``writer`` (the link's, which sends the credit and stream frames it produces)."""

    def __init__(self, sock: socket.socket, stream: trio.SocketStream, conn: P.PeerConnection,
                 streams: S.StreamTable, state: dict[int, StreamState], pipes: PipePool,
                 writer: LinkWriter) -> None:
        self._sock = sock
        self._stream = stream
        self._conn = conn
        self._streams = streams
        self._state = state
        self._pipes = pipes
        self._writer = writer
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
        self._buffers = BufferPool(P.MAX_PAYLOAD, RX_BUFFERS)  # whole payloads (_receive_whole) ...
        self._large_buffers: BufferPool | None = None  # ... larger than MAX_PAYLOAD (made on first use)
        self.spliced_in = 0  # payload bytes spliced from the link

    async def receive(self) -> tuple[list, bool]:
        """Read from the link: the connection's frames and events for what arrived, and
        True when the peer closed the connection. The payloads of large STREAM_DATA
        frames are spliced to their streams before this returns."""
        # fairness: a busy link never starves the pumps; it lets them run after every call
        # that did not wait, except in a run of large data frames: after RX_YIELD bytes
        unyielded = 0 if self._rx_waited else self._rx_unyielded + self._rx_charge
        if unyielded >= RX_YIELD:
            unyielded = 0
            await trio.lowlevel.checkpoint()
        self._rx_unyielded = unyielded
        self._rx_charge = RX_YIELD  # (a frame whose payload the reader took charges its size instead)
        self._rx_waited = False
        while True:
            if self._stream.socket.fileno() < 0:
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
                await self._wait_readable()
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

    async def _wait_readable(self) -> None:
        self._rx_waited = True  # the reader let the others run (no checkpoint needed)
        await wait_link_socket(self._stream, trio.lowlevel.wait_readable)

    def _eof(self) -> tuple[list, bool]:
        head, self._head = self._head, b""
        items = self._conn.receive_data(head, trio.current_time()) if head else []
        return items + self._conn.receive_data(b"", trio.current_time()), True

    def _feed(self, data: bytes) -> list:
        return self._conn.receive_data(data, trio.current_time())

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
        return self._conn.state is P.State.CONNECTED and self._conn.has_streams

    async def _cut(self, view: bytes) -> list | None:
        """Consume the whole frames at the start of ``view`` (the head and the bytes
        peeked), or the head of a STREAM_DATA frame to splice; the connection's items,
        or None when more bytes must arrive first."""
        n = len(view)
        pos = 0
        max_payload = self._conn.max_payload
        while pos + P.HEADER_SIZE <= n:
            magic, ver, ftype, flags, _, length = P.HEADER.unpack_from(view, pos)
            if magic != P.MAGIC or ver != P.WIRE_VERSION or length > max_payload:
                if pos:  # (the frames before it first: the handshake's last may raise the limit)
                    break
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
                whole = bool(flags & P.FLAG_WHOLE_MESSAGES and self._conn.capabilities & _WHOLE_MESSAGES)
                return await self._receive_held(self._take(_DATA_HEAD), length - 4, whole)
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
        return (self._conn.state is P.State.CONNECTED
                and bool(self._conn.capabilities & _DATAGRAMS))

    def _receive_datagrams(self, view: bytes) -> list | None:
        """The run of whole DATAGRAM frames at the start of ``view``, straight to their
        streams (no frame objects, no events): the connection sees the first one's head,
        as an empty DATAGRAM, for its checks and liveness; the stream table checks each."""
        n = len(view)
        pos = count = 0
        while pos + P.HEADER_SIZE <= n:
            magic, ver, ftype, _, _, length = P.HEADER.unpack_from(view, pos)
            if (ftype != P.FrameType.DATAGRAM or magic != P.MAGIC or ver != P.WIRE_VERSION
                    or not 4 <= length <= self._conn.max_payload or pos + P.HEADER_SIZE + length > n):
                break
            pos += P.HEADER_SIZE + length
            count += 1
        data = self._take(pos)  # at least one (checked by the caller)
        items = self._feed(data[:8] + _LEN4 + data[12:16])
        last = items[-1] if items else None
        if not (isinstance(last, P.Datagram) and not last.data and self._conn.state is P.State.CONNECTED):
            return items  # refused by the connection: the link ends
        items.pop()
        stats = self._conn.stats
        stats.frames_received += count - 1
        stats.bytes_received += pos - _DATA_HEAD
        table, states = self._streams, self._state
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
                await self._wait_readable()

    # ------------------------------------------------------------- spliced payloads

    async def _receive_held(self, head: bytes, nbytes: int, whole: bool) -> list:
        """A STREAM_DATA frame of ``nbytes`` data bytes whose 16-byte head was consumed
        (``whole``: flagged FLAG_WHOLE_MESSAGES)."""
        sid = int.from_bytes(head[12:16], "big")
        items = self._conn.receive_data_head(head, trio.current_time())
        if items is None:
            items = []  # accepted (the connection's fast path)
        else:
            last = items[-1] if items else None
            if not (isinstance(last, P.StreamData) and last.stream_id == sid and not last.data
                    and self._conn.state is P.State.CONNECTED):
                return items  # refused by the connection: the link ends, the payload stays unread
            items.pop()
        self._conn.stats.bytes_received += nbytes
        self._rx_charge = nbytes
        events = self._streams.receive_held(sid, nbytes)
        st = self._state.get(sid)
        if not (events and isinstance(events[0], S.DataArriving)) or st is None or st.closed:
            self._writer.flush_streams()  # e.g. STREAM_CLOSE after a credit violation
            await self._discard(nbytes)
            return items
        st.rx_splicing = True
        try:
            await self._splice_payload(st, nbytes, whole)
        finally:
            st.rx_splicing = False
            if st.rx_pipe is not None and (st.rx_pipe.held == 0 or self._state.get(sid) is not st):
                st.retire_pipe(self._pipes)  # drained meanwhile, or the stream is gone
            if self._state.get(sid) is not st:
                st.release_pipes(self._pipes)
        return items

    async def _splice_payload(self, st: StreamState, nbytes: int, whole: bool) -> None:
        """Move ``nbytes`` of payload from the link to ``st``: into its pipes (up to
        RX_PIPES of them) while there is room, else copied into ``st.incoming``; what the
        stream's socket takes at once goes on at once (:meth:`forward`). A stream without
        a socket to splice into gets the payload whole; so does a fanned-out session's
        (``st.whole_only``) but for a frame of ``whole`` messages while its proxy lets
        them go to its lone receiver (``st.splice_whole``) and only pipe segments are
        held before it."""
        self._left = nbytes
        self._waited = False
        self._pipe_full = False
        if not (st.kind == P.StreamKind.TCP and isinstance(st.sock, trio.SocketStream)) or (
                st.whole_only and not (whole and st.splice_whole)):
            # (charged its size too: its consumer runs once RX_YIELD bytes came, or the reader
            # waited, and takes every payload held then in one go; no pipe of the stream is filled)
            st.rx_splicing = False
            await self._receive_whole(st, nbytes)
            return
        while self._left:
            await self._splice_step(st)

    async def _receive_whole(self, st: StreamState, nbytes: int) -> None:
        """Read ``nbytes`` of payload into a buffer of their own (from the reader's
        pool: written again only once no view of it is alive), then hand it to ``st``
        at once (a read-only view): one item and one wake-up of the stream per frame,
        whatever the pieces the link's socket gives."""
        pool = self._buffers
        if nbytes > pool.size:
            if self._large_buffers is None:
                self._large_buffers = BufferPool(P.LARGE_PAYLOAD, RX_LARGE_BUFFERS)
            pool = self._large_buffers
        buf = memoryview(pool.take(nbytes))[:nbytes]
        while self._left:
            try:
                k = self._sock.recv_into(buf[nbytes - self._left:])
            except (BlockingIOError, InterruptedError):
                await self._wait_payload(st)  # (the stream ended: the rest is dropped)
                continue
            if not k:
                raise trio.BrokenResourceError("the peer closed the link in the middle of a frame")
            self._left -= k
        if self._state.get(st.sid) is st and not st.closed:
            st.incoming.append(buf.toreadonly())
            st.incoming_ready.set()

    async def _splice_step(self, st: StreamState) -> None:
        """One move of :meth:`_splice_payload` (``self._left`` is what is still to come).
        (No SO_RCVLOWAT to wake less often: a low-water mark above what the receive
        window lets in would stall the link.)"""
        left = self._left
        pipe = st.fill_pipe(self._pipes, self._pipe_full)
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
                self.pipe_in(st, pipe, k)
                # Short, and the pipe holds half its size: most likely full (a pipe slot
                # holds at most a page, so a pipe of payload spliced from TCP fills at about
                # 60 %): the next move takes a new pipe without a splice to find out.
                self._pipe_full = k < left and pipe.held >= pipe.capacity // 2
                return
            if pipe.held >= pipe.capacity // 2 or self._waited:  # full, or nothing to be had
                if st.fill_pipe(self._pipes, True) is not None:
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
        st.incoming.append(SplicedBytes(data) if st.whole_only else data)  # (in order, never framed)
        st.incoming_ready.set()

    def pipe_in(self, st: StreamState, pipe: Pipe, k: int) -> None:
        """``k`` bytes were spliced into ``pipe`` for ``st``: count them at the tail of
        ``st.incoming`` and, if nothing of the stream is ahead of them, pass on at once
        what the socket takes."""
        self.spliced_in += k
        if st.pipe_in(pipe, k) and not (st.sink_idle and self.forward(st)):
            st.incoming_ready.set()  # the rest: the stream's pump, when the socket takes it

    def forward(self, st: StreamState) -> bool:
        """Splice the pipe segments at the head of ``st.incoming`` into the stream's socket
        as far as it takes them now (never waits; :meth:`StreamState.splice_out`) and
        return credit for what went. True when the head is no longer a pipe segment."""
        moved, done = st.splice_out(self._pipes)
        if moved:
            try:
                self._streams.consumed(st.sid, moved)
            except S.LocalStreamError:
                pass
            self._writer.flush_streams(direct=True)
        return done

    async def _wait_payload(self, st: StreamState) -> None:
        """Wait for more of a payload; if its stream ended meanwhile, drop the rest."""
        await self._wait_readable()
        if self._state.get(st.sid) is not st or st.closed:
            left, self._left = self._left, 0
            await self._discard(left)

    async def _discard(self, nbytes: int) -> None:
        """Read and drop ``nbytes`` of payload (refused or for a stream that is gone)."""
        if self._scratch is None:
            self._scratch = bytearray(64 << 10)
        mv = memoryview(self._scratch)
        while nbytes:
            try:
                k = self._sock.recv_into(mv[:min(nbytes, len(mv))])
            except (BlockingIOError, InterruptedError):
                await self._wait_readable()
                continue
            if not k:
                raise trio.BrokenResourceError("the peer closed the link in the middle of a frame")
            nbytes -= k
