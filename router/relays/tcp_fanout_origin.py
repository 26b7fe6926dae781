"""The origin's side of the TCP fan-out (:mod:`router.relays.tcp_fanout`): at
the far router, one connection to each origin TCP session (the proxy receiver),
shared by every link stream any link of the portal opens for an advertisement
of it; what the origin sends is read only as far as the slowest link stream
that keeps up takes it, framed once (:class:`router.core.fanout.SessionFanout`,
through the origin's message path: ``downstream_rules`` and the requesters
recorded), and written to each stream within its credit. Sizes in bytes, times
in seconds (trio's clock)."""

from __future__ import annotations

import math
import os
import socket

import trio

from lbmr_proto import lbmc
from lbmr_runtime.buffers import BufferPool

from .. import peerlink as P
from ..core.fanout import QueueBudget, SessionFanout, SinkQueue
from ..link import CONNECT_TIMEOUT, SPLICE_FRAME, Link, StreamState, flush_stream, return_credit
from ..peerlink import streams as S
from .interface import RelayContext, Upstreams, accept_stream, refuse_stream

__all__ = ["LINK_BACKLOG", "LINK_BACKLOG_MAX", "OriginFanout", "Upstream", "UPSTREAM_LINGER", "link_backlog"]

# seconds a session's upstream connection stays open after its last stream left (a
# stream that comes back at once finds the session running)
UPSTREAM_LINGER = 1.0
# bytes per read of an origin (at most; and at most what the room lets in): one frame on a
# zero-copy link, UPSTREAM_READ, or as much as a whole frame of one of the session's
# streams may be if that is more (a link that negotiated LARGE_FRAMES, a stream whose
# peer's window is 8 MiB or more: StreamTable.whole_limit; at most LARGE_READ; the frames
# of the streams that take less are cut to their size, not flagged whole). After a read
# that filled its buffer the next one is tried at once (the bytes are most likely there:
# no wait for the socket, no scheduler round per read), the task letting the others run
# after UPSTREAM_YIELD bytes
UPSTREAM_READ = SPLICE_FRAME
LARGE_READ = P.LARGE_PAYLOAD - 4
UPSTREAM_YIELD = 4 << 20
# While every stream of a session still holds bytes that its link writer has not taken
# (what is read now would go out only after them), the origin's socket wakes its reader
# only once UPSTREAM_LOWAT bytes are there (SO_RCVLOWAT; at most the room), or as soon as
# a stream has nothing left ahead: no byte leaves later than if it had been read at once,
# and a session that streams is not read a segment at a time. bench/router.py, fan-out to
# one receiver: router A's CPU seconds per GB about a tenth less (fewer, larger reads).
UPSTREAM_LOWAT = 256 << 10
# read buffers kept for use again (lbmr_runtime.buffers): as many as a session has in flight
# at full speed (its link queue, 8 MiB, its own queue, and what the link's writer holds, in
# reads that often fill a buffer only in part: with 12 kept one read in 40 still took a
# fresh MiB, with 20 one in 45, with 32 none once all were made), an endpoint's sessions
# sharing them; as many bytes of LARGE_READ buffers for sessions that read so much
UPSTREAM_BUFFERS = 32
UPSTREAM_BUFFER_BYTES = UPSTREAM_BUFFERS * (UPSTREAM_READ + lbmc.MAX_MSGLEN)
# frames' worth (the link's largest) of a session's stream in the link's queue at most, as
# the per-connection relay's TX_DEPTH: the link's socket buffer keeps the link busy, and the
# rest waits in the session's queue, not read yet, so that the bytes between a read and their
# write stay few (still in the CPU's cache when written). bench/router.py, fan-out to one
# receiver: router A's system time per GB a tenth less than with the link's whole queue.
# At most LINK_BACKLOG_MAX bytes, but one frame always: one 4 MiB frame (LARGE_FRAMES)
LINK_BACKLOG = 2
LINK_BACKLOG_MAX = P.LARGE_PAYLOAD + P.HEADER_SIZE
_WHOLE_MESSAGES = int(P.Capability.WHOLE_MESSAGES)  # (a plain int: ``int & IntFlag`` goes through enum)


def link_backlog(max_frame: int) -> int:
    """Bytes of one session's frames that router A keeps in the queue of a link whose
    frames carry at most ``max_frame`` data bytes (LINK_BACKLOG, LINK_BACKLOG_MAX)."""
    frame = max_frame + S.STREAM_DATA_OVERHEAD
    return max(min(LINK_BACKLOG * frame, LINK_BACKLOG_MAX), frame)


class Upstream:
    """One origin TCP session at the far side: its connection, its fan-out, the
    link streams it feeds (``sinks``: (link, stream id) -> stream) and how
    many streams wait for the connection (``waiting``)."""

    def __init__(self, key, core: SessionFanout) -> None:
        self.key = key
        self.core = core
        self.sinks: dict[tuple[Link, int], StreamState] = {}
        self.waiting = 0
        self.connected = trio.Event()
        self.attached = trio.Event()  # every stream that waited for the connection has its queue
        self.failed: str | None = None  # why the origin could not be reached
        self.refused = False  # ... it refused the connection (it is gone)
        self.by_origin = False  # the origin ended the session (EOF)
        self.done = False
        self.room = trio.Event()  # set when a stream's queue took bytes: the reader may go on
        self.lowat = 1  # the origin socket's SO_RCVLOWAT
        # the reader's wait while every stream holds bytes ahead (cancelled once one has none)
        self.coalescing: trio.CancelScope | None = None


class OriginFanout:
    """The origin sessions of one endpoint's fan-out relay (its ``open_far``):
    ``upstreams`` shared with the relays of the endpoint's other links, their
    queues in ``budget`` (the relay's), read into ``read_buffers``."""

    def __init__(self, context: RelayContext, budget: QueueBudget) -> None:
        self.context = context
        self.settings = context.settings
        self.counters = context.counters
        self.event = context.event
        self.site = context.site
        self.upstreams: Upstreams = context.upstreams
        self.max_queue = self.settings.fanout_max_queue
        self.budget = budget
        # the upstream sessions' read buffers, used again once nothing views them, by read size
        self.read_buffers = {size: BufferPool(size + lbmc.MAX_MSGLEN,
                                              UPSTREAM_BUFFER_BYTES // (size + lbmc.MAX_MSGLEN))
                             for size in (UPSTREAM_READ, LARGE_READ)}


    def open_far(self, link: Link, ev: S.StreamOpened, origin) -> None:
        """The peer opened a stream for an advertisement of the TCP session ``origin``."""
        st = link.state[ev.stream_id] = StreamState(ev.stream_id, ev.kind)
        st.advert_id = ev.advert_id
        key = (origin.ip, origin.port, getattr(origin, "session_id", None))
        up = self.upstreams.get(key)
        if up is None or up.done or up.by_origin:
            path = self.context.responses.upstream_path(self.settings.downstream_rules, key)  # its requesters noted
            up = self.upstreams[key] = Upstream(key, SessionFanout(self.max_queue, self.budget, path,
                                                                   pool=self.read_buffers[UPSTREAM_READ]))
            (self.upstreams.nursery or link.nursery).start_soon(self._upstream, up)
        up.waiting += 1
        link.nursery.start_soon(self._far_stream, up, link, st)

    async def _upstream(self, up: Upstream) -> None:
        """Connect to the origin, then frame what it sends to the session's streams
        until it ends (EOF) or UPSTREAM_LINGER after the last stream left."""
        ip, port, _ = up.key
        conn = None
        try:
            try:
                with trio.fail_after(CONNECT_TIMEOUT):
                    conn = await trio.open_tcp_stream(ip, port)
            except (OSError, trio.TooSlowError) as e:
                up.failed = f"cannot connect to the source {ip}:{port}: {e}"
                up.refused = isinstance(e, ConnectionRefusedError)
                return
            self.counters["fanout_upstreams"] += 1
            up.connected.set()
            if up.waiting:  # the streams that asked for the session get its first message
                await up.attached.wait()
            await self._upstream_reads(up, conn)
        except lbmc.LbmcDecodeError as e:
            self.counters["fanout_upstream_malformed"] += 1
            self.event("fanout_upstream_malformed", f"source {ip}:{port}: {e}")
        finally:
            up.done = True
            up.connected.set()
            up.core.end()
            if self.upstreams.get(up.key) is up:
                del self.upstreams[up.key]
            for st in up.sinks.values():
                st.credit.set()
            if conn is not None:
                await trio.aclose_forcefully(conn)

    async def _upstream_reads(self, up: Upstream, conn: trio.SocketStream) -> None:
        """Read the origin into the session's receive buffer, only as far as the
        slowest link stream that keeps up takes it (:meth:`SessionFanout.room`):
        when the links take no more, the origin is not read and TCP paces it. The
        buffer is taken only once the socket is readable, or right after a read
        that filled its buffer or a wait for room (given back if the socket is
        empty: an idle session holds none), and is no larger than the room (nor
        UPSTREAM_READ). Each wait lasts at most UPSTREAM_LINGER, so that a
        session whose last stream left closes within twice that even when the
        origin is quiet."""
        idle_since = math.inf
        core, sock = up.core, conn.socket
        fd = sock.fileno()
        ready = False  # the last read filled its buffer (or room came): read at once, no wait
        unyielded = 0  # bytes read since the task last let the others run
        while True:
            now = trio.current_time()
            if up.sinks or up.waiting:
                idle_since = math.inf
            elif idle_since == math.inf:
                idle_since = now
            elif now >= idle_since + UPSTREAM_LINGER:
                return
            behind = core.fell_behind
            room = core.room(now)
            if core.fell_behind != behind:
                self.counters["fanout_link_streams_behind"] += core.fell_behind - behind
            if not room:
                self.counters["fanout_upstream_paced"] += 1
                up.room = trio.Event()
                with trio.move_on_at(min(now + UPSTREAM_LINGER, core.recheck_at())):
                    await up.room.wait()
                ready, unyielded = True, 0
                continue
            if ready and unyielded >= UPSTREAM_YIELD:
                unyielded = 0
                await trio.lowlevel.checkpoint()
            elif not ready:
                unyielded = 0
                coalesce = self._mark_reads(up, sock, room)
                with trio.move_on_after(UPSTREAM_LINGER) as waited:
                    with trio.CancelScope() as coalescing:
                        up.coalescing = coalescing if coalesce else None
                        try:
                            await trio.lowlevel.wait_readable(sock)
                        except (trio.ClosedResourceError, OSError):
                            pass  # (the read says why)
                        finally:
                            up.coalescing = None
                if waited.cancelled_caught:
                    continue
            # (a run of whole messages fits one frame: the incomplete one held and the read)
            want = min(self._read_size(up) - core.framer.buffered, room)
            try:
                k = os.readv(fd, [core.receive_buffer(want)])
            except (BlockingIOError, InterruptedError):
                core.drop_receive_buffer()  # (an idle session holds none)
                ready = False
                continue
            except OSError:
                k = 0
            if not k:
                up.by_origin = True
                return
            ready = k == want
            unyielded += k
            self._count_link_drops(core.received(k, trio.current_time()))
            for (link, sid), st in up.sinks.items():
                self._far_push(up, link, st, core.sinks[link, sid])

    def _mark_reads(self, up: Upstream, sock: socket.socket, room: int) -> bool:
        """Set the origin socket's low-water mark for the reader's next wait: UPSTREAM_LOWAT
        bytes (at most the room, and a quarter of the socket's receive buffer: the kernel
        would else grow the buffer and clamp the window to the mark, which the sender then
        might never fill) while every stream holds bytes ahead (:meth:`_held_ahead`), else
        1 byte. True when the mark is above 1 byte (counted: such a wait ends early once a
        stream has nothing ahead, :meth:`_wake_reader`)."""
        mark = 1
        if self._held_ahead(up):
            try:
                mark = max(1, min(UPSTREAM_LOWAT, room,
                                  sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4))
            except OSError:
                pass  # (the read says why)
        if mark != up.lowat:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, mark)
                up.lowat = mark
            except OSError:
                pass  # (the read says why)
        if up.lowat > 1:
            self.counters["fanout_upstream_coalesced"] += 1
        return up.lowat > 1

    @staticmethod
    def _held_ahead(up: Upstream) -> bool:
        """Every stream of the session holds bytes its link writer has not taken yet
        (in its queue, or framed in the link's queue): bytes read now would go out
        only after them. False with no stream."""
        queues = up.core.sinks  # (a stream's queue is there while it is in ``up.sinks``)
        for (link, sid), st in up.sinks.items():
            if not queues[link, sid].held and not st.writer_backlog(link.outq):
                return False
        return bool(up.sinks)

    def _wake_reader(self, up: Upstream) -> None:
        """End the reader's wait for UPSTREAM_LOWAT bytes once a stream has nothing
        ahead (the bytes there go now)."""
        if up.coalescing is not None and not self._held_ahead(up):
            up.coalescing.cancel()

    def _count_link_drops(self, drops) -> None:
        for d in drops:
            self.counters["fanout_link_dropped_messages"] += d.messages
            self.counters["fanout_link_dropped_bytes"] += d.nbytes

    @staticmethod
    def _far_push(up: Upstream, link: Link, st: StreamState, q: SinkQueue) -> None:
        """Frame what the stream's credit and the link's queue take of ``q`` now
        (the rest waits for credit: :meth:`_far_serve`; what went makes room:
        the session's reader may go on). Each chunk's frames are
        queued before the next chunk is sized by the queue's space (a frame the
        queue refused would be lost), and written at once as far as the link's
        socket takes them. To a peer with capability WHOLE_MESSAGES, a chunk that
        is a whole run of messages without extension headers goes as one frame
        flagged so (:meth:`SinkQueue.head_whole`; the near router may splice it to
        a lone receiver), waiting for the credit and room it needs if they can
        come (:meth:`~router.peerlink.streams.StreamTable.whole_fits`, and a
        quarter of the link's queue).

        The stream's frames in the link's queue stay within LINK_BACKLOG frames
        (:meth:`StreamState.writer_backlog`); the rest waits in ``q``, so what
        the session holds between its read and its write stays small."""
        if link.closed or st.closed:
            return
        sent = 0
        now = trio.current_time()  # (the frames queued in a row take microseconds: one time for them)
        streams, sid, outq = link.streams, st.sid, link.outq
        # (whole frames only where they can go: a quarter of the link's queue at most, or
        # half for a frame larger than MAX_PAYLOAD: LARGE_FRAMES)
        whole_max = max(outq.max_data_bytes // 4, min(outq.max_data_bytes // 2, streams.max_frame)) \
            if link.capabilities & _WHOLE_MESSAGES else 0
        backlog_max = link_backlog(streams.max_frame)
        try:
            while q.held:
                room = min(outq.data_space(), backlog_max - st.writer_backlog(outq))
                whole = q.head_whole() if whole_max else None
                if whole is not None and len(whole) <= whole_max and streams.whole_fits(sid, len(whole)):
                    if not streams.send_whole(sid, whole, limit=room):
                        break
                    sent += len(whole)
                    q.wrote(len(whole), now)
                    flush_stream(link, st)
                    continue
                chunk = q.head(1)[0]
                rest = streams.send(sid, chunk, limit=room)
                k = len(chunk) - len(rest)
                if k:
                    sent += k
                    q.wrote(k, now)
                flush_stream(link, st)
                if len(rest):
                    break
        except S.LocalStreamError:
            st.closed = True
        if sent:
            up.room.set()

    async def _far_stream(self, up: Upstream, link: Link, st: StreamState) -> None:
        """One link stream of an upstream session, from accept to end."""
        key = (link, st.sid)
        try:
            try:
                await up.connected.wait()
            finally:
                up.waiting -= 1
                if not up.waiting:
                    up.attached.set()  # (each waiting stream adds its queue before a checkpoint)
            if up.done or up.failed is not None:
                self._far_refused(link, st, up)
                return
            if not accept_stream(link, st, self.counters):
                return
            # (its queue takes one of the link's frames whole, beside an incomplete message:
            # the session's reads are that large)
            q = up.core.add(key, trio.current_time(), limit=link.streams.max_frame + lbmc.MAX_MSGLEN)
            up.sinks[key] = st
            up.room.set()
            await self._far_serve(up, link, st, q)
            if up.by_origin:
                self.site.session_ended(st.advert_id)
        finally:
            up.sinks.pop(key, None)
            up.core.remove(key)
            up.room.set()
            link.close_stream(st)
            link.state.pop(st.sid, None)

    async def _far_serve(self, up: Upstream, link: Link, st: StreamState, q: SinkQueue) -> None:
        """Push the queue as credit comes; ends with the stream, the link, or the
        session (once the queue went)."""
        while not (st.closed or link.closed or q.finished):
            st.credit = trio.Event()  # before trying: a grant after it wakes us
            if st.incoming:  # the near side sends nothing on a fan-out stream: dropped
                nbytes = sum(map(len, st.incoming))
                st.incoming.clear()
                self.counters["fanout_link_bytes_ignored"] += nbytes
                return_credit(link, st, nbytes)
            self._far_push(up, link, st, q)
            self._wake_reader(up)
            if q.finished:
                return
            await st.credit.wait()

    def _read_size(self, up: Upstream) -> int:
        """Bytes of the session's next read at most: UPSTREAM_READ, or the largest
        whole frame one of its streams takes now if that is more (LARGE_FRAMES),
        read into buffers of LARGE_READ then."""
        size = UPSTREAM_READ
        for link, sid in up.sinks:
            size = max(size, link.streams.whole_limit(sid))
        pool = self.read_buffers[UPSTREAM_READ if size == UPSTREAM_READ else LARGE_READ]
        if up.core.pool is not pool:
            up.core.pool = pool
        return size

    def _far_refused(self, link: Link, st: StreamState, up: Upstream) -> None:
        refuse_stream(link, st, up.failed or "the session ended", self.counters, self.event)
        if up.refused or up.by_origin:
            self.site.session_ended(st.advert_id)
