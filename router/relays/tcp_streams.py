"""One peer-link stream per TCP connection, on trio (the TCP relay of an
endpoint with ``fanout="off"``; fanned-out TCP is :mod:`router.relays.tcp_fanout`).

Near side: every receiver that connects to a proxy's listener opens a stream
of the proxy on the current link. Far side: a stream the peer opens connects
to the real source of our advertisement (a source that cannot be reached
refuses the stream). Both sides move bytes with the pumps here: socket to
peer link within the stream's credit and the link queue's space, peer link to
socket returning consumed bytes as credit; with zero copy (:mod:`router.link.splice`)
through pipes, a frame at a time.
"""

from __future__ import annotations

import socket
from collections import deque

import trio

from .. import peerlink as P
from ..link import CONNECT_TIMEOUT, READ_SIZE, HeldChunk, Link, PipeSeg, StreamState, return_credit
from ..link.splice import splice
from ..peerlink import streams as S
from .interface import TransportRelay, accept_stream, refuse_stream

# Zero copy, sending: frames (pipes) of one stream queued for the writer at once (the pump
# fills the next while the writer writes one).
TX_DEPTH = 2


class TcpStreamRelay(TransportRelay):
    """TCP connections relayed one stream each, for one endpoint on one link
    (:class:`router.relays.interface.TransportRelay`)."""

    SOCKET_TYPE = socket.SOCK_STREAM
    STREAM_KIND = P.StreamKind.TCP

    async def serve_proxy(self, advert: P.Advertisement, sock, task_status) -> None:
        """Near side: accept receivers on ``sock`` (listening from now) for the
        proxy of ``advert``, each relayed on a stream of its own, until cancelled."""
        sock.listen(64)
        task_status.started(sock.getsockname())
        listener = trio.SocketListener(sock)
        proxy_id = advert.advert_id
        async with trio.open_nursery() as n:
            while True:
                conn = await listener.accept()
                n.start_soon(self._near, proxy_id, conn)

    async def _near(self, proxy_id: int, conn) -> None:
        link = self.site.link
        aid = self.site.proxy_advert(proxy_id)
        if link is None or aid is None:
            await conn.aclose()
            return
        sid = link.streams.open(aid, P.StreamKind.TCP)
        st = link.state[sid] = StreamState(sid, P.StreamKind.TCP)
        st.sock = conn
        link.flush_streams()
        self.counters["streams_opened"] += 1
        try:
            await pump(link, st)
        finally:
            await trio.aclose_forcefully(conn)

    def open_far(self, link: Link, ev: S.StreamOpened, origin) -> None:
        """Far side: the peer opened stream ``ev`` for the TCP source ``origin``
        (its ip and port): connect to it and relay."""
        st = link.state[ev.stream_id] = StreamState(ev.stream_id, ev.kind)
        st.advert_id = ev.advert_id
        link.nursery.start_soon(self._far, link, st, origin)

    async def _far(self, link: Link, st: StreamState, body) -> None:
        try:
            try:
                with trio.fail_after(CONNECT_TIMEOUT):
                    conn = await trio.open_tcp_stream(body.ip, body.port)
            except (OSError, trio.TooSlowError) as e:
                refuse_stream(link, st, f"cannot connect to the source {body.ip}:{body.port}: {e}",
                              self.counters, self.event)
                if isinstance(e, ConnectionRefusedError):
                    self.site.session_ended(st.advert_id)
                return
            st.sock = conn
            if not accept_stream(link, st, self.counters):
                await trio.aclose_forcefully(conn)
                return
            try:
                await pump(link, st)
            finally:
                await trio.aclose_forcefully(conn)
            if st.source_ended:
                self.site.session_ended(st.advert_id)
        finally:
            link.state.pop(st.sid, None)


# ------------------------------------------------------- byte pumping


async def pump(link: Link, st: StreamState) -> None:
    """Both directions of a TCP stream; returns when either side ends.
    The stream is closed towards the peer however it ends (even cancelled)."""
    link.pipes.stream_started()
    try:
        async with trio.open_nursery() as n:
            n.start_soon(pump_up, link, st, n.cancel_scope)
            n.start_soon(pump_down, link, st, n.cancel_scope)
    finally:
        link.close_stream(st)
        link.pipes.stream_ended()


async def pump_up(link: Link, st: StreamState, scope) -> None:
    """Socket -> peer link, within the stream's credit and the queue's space."""
    await st.accepted.wait()
    if st.refused is not None:
        scope.cancel()
        return
    if link.zero_copy and isinstance(st.sock, trio.SocketStream):
        if await _pump_up_spliced(link, st):
            scope.cancel()
        return
    pending = b""
    while True:
        if st.closed or link.closed:
            return  # the peer ended the stream: pump_down delivers what is left, then ends it
        if not pending:
            try:
                pending = await st.sock.receive_some(READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pending = b""
            if not pending:
                st.source_ended = True  # EOF from the local side (the far side: the source)
                break
        st.credit = trio.Event()  # before trying: a grant arriving after it wakes us
        try:
            rest = link.streams.send(st.sid, pending, limit=link.outq.data_space())
        except S.LocalStreamError:
            return  # closed meanwhile: pump_down finishes the stream
        link.flush_streams()
        if len(rest) == len(pending):
            await st.credit.wait()
        pending = bytes(rest)
    scope.cancel()


async def _pump_up_spliced(link: Link, st: StreamState) -> bool:
    """Zero copy, socket -> peer link: splice what the socket holds (up to the credit,
    the queue's space and a frame) into a pipe, queue it as one HeldData frame, wait
    until the writer has written it, again. True at end of file from the socket, False
    when the stream or the link was closed."""
    sock = st.sock.socket
    inflight: deque[HeldChunk] = deque()  # queued, not yet written by the writer
    while True:
        if st.closed or link.closed:
            return False
        st.credit = trio.Event()  # before looking: a wake-up after it is not lost
        while inflight and inflight[0].done:
            inflight.popleft()
        if len(inflight) >= TX_DEPTH:
            await st.credit.wait()  # the writer has not written them yet
            continue
        room = min(link.streams.send_credit(st.sid), link.streams.max_frame,
                   link.outq.data_space() - S.STREAM_DATA_OVERHEAD)
        if room <= 0:
            await st.credit.wait()
            continue
        pipe = link.pipes.acquire()
        if pipe is None:  # no pipe free: one read on the copy path
            try:
                data = await st.sock.receive_some(min(room, READ_SIZE))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            if not data:
                st.source_ended = True
                return True
            try:
                link.streams.send(st.sid, data, limit=link.outq.data_space())
            except S.LocalStreamError:
                return False
            link.flush_streams()
            continue
        try:
            k = splice(sock.fileno(), pipe.w, min(room, pipe.capacity))
        except (BlockingIOError, InterruptedError):
            link.pipes.release(pipe)
            try:
                await trio.lowlevel.wait_readable(sock)
            except (trio.ClosedResourceError, OSError):
                return True
            continue
        except OSError:  # reset by the source or receiver: as end of file
            k = 0
        if k == 0:
            link.pipes.release(pipe)
            st.source_ended = True
            return True
        pipe.held = k
        chunk = HeldChunk(pipe)
        inflight.append(chunk)
        try:
            link.streams.send_held(st.sid, k, chunk)
        except S.LocalStreamError:
            chunk.done = True
            link.pipes.release(pipe)
            return False
        link.flush_streams(direct=True)


async def pump_down(link: Link, st: StreamState, scope) -> None:
    """Peer link -> socket; consumed bytes are returned to the peer as credit. The
    items of ``st.incoming`` are bytes or read-only views of them (copy path) or
    :class:`PipeSeg` (zero copy),
    in order; an item stays at the head until all its bytes went (the link's reader
    passes pipe bytes on itself when the socket takes them, :meth:`Link.forward`)."""
    while True:
        while st.incoming:
            if type(st.incoming[0]) is PipeSeg:
                if not await _splice_down(link, st):
                    scope.cancel()
                    return
                continue
            data = st.incoming[0]
            try:
                await st.sock.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                scope.cancel()
                return
            st.incoming.popleft()
            return_credit(link, st, len(data))
        if st.closed or link.closed:
            scope.cancel()
            return
        await st.incoming_ready.wait()
        st.incoming_ready = trio.Event()


async def _splice_down(link: Link, st: StreamState) -> bool:
    """The pipe segments at the head of ``st.incoming`` into the stream's socket,
    waiting for it as needed; False if that cannot be done (the receiver went away,
    the link is gone and took the pipes)."""
    sock = st.sock.socket
    while st.incoming and type(st.incoming[0]) is PipeSeg:
        if link.forward(st):
            return True
        if st.sink_broken:
            return False
        try:
            await trio.lowlevel.wait_writable(sock)
        except (trio.ClosedResourceError, OSError):
            return False
    return True
