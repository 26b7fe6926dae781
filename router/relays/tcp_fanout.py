"""TCP sessions through the router as live LBMC message streams, on trio: one
upstream connection per origin session (far side), one link stream per
session per link, and at the near router one proxy that re-publishes the
session to every local receiver (the queue and boundary logic is
:mod:`router.core.fanout`).

Far side (:meth:`FanoutRelay.open_far`): a stream the peer opens for an
advertisement of a TCP session joins the session's :class:`Upstream` (one
connection to the origin per session, shared by every link whose relay shares
the endpoint's :class:`Upstreams`); it gets whole messages from the next
boundary, within its credit, through a queue of ``max_queue`` bytes. The
origin is read only as far as the slowest stream that keeps up takes it
(:meth:`router.core.fanout.SessionFanout.room`): when every link is full the
origin is not read and TCP paces it; a stream that holds the others back for
the lag timeout drops its own messages (counted). The origin's EOF ends
every stream of the session; the connection closes UPSTREAM_LINGER seconds
after its last stream left.

Near side (:meth:`FanoutRelay.serve_proxy`): the first receiver that connects to
a proxy opens the one link stream of the proxy; every receiver gets whole
messages from the next boundary through its own queue of ``max_queue`` bytes,
written with non-blocking ``writev``. The stream's bytes are taken (and their
credit returned) only as far as the slowest receiver that keeps up takes
them: when every receiver is full the credit runs out and the far router
stops reading the origin; a receiver that holds the others back for the lag
timeout drops its own messages (counted); one that holds bytes and takes
none for ``stall_timeout`` seconds is disconnected. The stream ends with the
origin, or NEAR_LINGER seconds after the last receiver left. What receivers
send (UM control messages: TCP session id, source-side filtering) is framed,
counted and not passed on, read at most RECEIVER_UPSTREAM_RATE bytes a
second; a receiver whose bytes are not LBMC is disconnected.

Every message passes the relay's message path once per router
(:mod:`router.core.message_path`): the origin's, at the far router, in the
upstream session before the link streams' queues (``downstream_rules``,
and the requesters recorded), and at the near router in the proxy's
session before the receivers' queues (requests pointed at the request
listeners: :mod:`router.relays.responses`); a receiver's, at the near
router, as it is framed (``upstream_rules``). Runs of messages without
extension headers, which the far router sends as frames flagged whole
messages, have nothing in them for the near router's path: to a lone
receiver they are spliced from the link, never framed
(:mod:`router.relays.tcp_fanout_proxy`).
"""

from __future__ import annotations

import math
import os
import socket
from itertools import count

import trio

from lbmr_proto import lbmc, lbmc_stream

from .. import peerlink as P
from ..core.fanout import (
    QueueBudget,
    SessionFanout,
    SinkQueue,
)
from ..core.message_path import MessagePath
from ..core.tr.pacing import RatePacer
from ..link import SPLICED_ITEMS, Link, StreamState, return_credit
from ..peerlink import streams as S
from .interface import RelayContext, TransportRelay, Upstreams
from .tcp_fanout_origin import OriginFanout
from .tcp_fanout_proxy import Proxy, Receiver

__all__ = ["FanoutRelay", "NEAR_LINGER", "FANOUT_MAX_RECEIVERS"]

# seconds a proxy's link stream stays open after its last receiver left (a receiver that
# reconnects at once finds the session running; the origin's side: UPSTREAM_LINGER)
NEAR_LINGER = 1.0
RECEIVER_READ = 64 << 10  # bytes per read of what a receiver sends (at most)
# bytes a second of what one receiver sends that its proxy reads (bursts of at most
# RECEIVER_UPSTREAM_BURST): beyond, the receiver is not read and TCP paces it, so that
# its upstream costs the router CPU in proportion to its bytes, bounded per receiver
# (UM receivers send a few control messages per session)
RECEIVER_UPSTREAM_RATE = 256 << 10
RECEIVER_UPSTREAM_BURST = 64 << 10
IOV_MAX = 64  # chunks per writev to a receiver
SPLICED_COUNT_INTERVAL = 1.0  # seconds between counts of the bytes spliced to a lone receiver (at most)
PUSH_WRITES = 16  # writevs to a receiver in a row (a queue's worth or more: a few segments each)
# receiver connections of one endpoint's proxies at once (as many as the link streams
# of the per-connection relay); their queues share a QueueBudget of 256 MiB
FANOUT_MAX_RECEIVERS = 4096


def _peer(conn: trio.SocketStream) -> str:
    try:
        return "{}:{}".format(*conn.socket.getpeername()[:2])
    except OSError:
        return "?"


class FanoutRelay(TransportRelay):
    """The fan-out data plane of one endpoint's relay
    (:class:`router.relays.interface.TransportRelay`): ``upstreams`` shared
    with the relays of the endpoint's other links; ``max_queue`` (bytes) and
    ``stall_timeout`` (seconds) from the settings (``fanout_max_queue``,
    ``fanout_stall_timeout``); ``upstream``: the message path of the
    receivers' messages (the origin's: one per upstream session, and one per
    proxy at the near router: :mod:`router.relays.responses`)."""

    SOCKET_TYPE = socket.SOCK_STREAM
    STREAM_KIND = P.StreamKind.TCP

    def __init__(self, context: RelayContext) -> None:
        super().__init__(context)
        settings = self.settings
        self.max_queue = settings.fanout_max_queue
        self.stall_timeout = settings.fanout_stall_timeout
        self.upstream = MessagePath(settings.upstream_rules)
        self._keys = count()
        self.budget = QueueBudget()  # every queue of this relay's sessions
        self.origins = OriginFanout(context, self.budget)  # the far side: the origin sessions
        self.upstreams: Upstreams = self.origins.upstreams  # (the endpoint's, shared by its links' relays)
        self.receivers = 0  # receiver connections of all this relay's proxies
        self._proxies: dict[int, Proxy] = {}  # the near side of each proxy serving, by proxy id

    # ------------------------------------------------------- near side

    async def serve_proxy(self, advert: P.Advertisement, sock, task_status) -> None:
        """Accept receivers at the proxy of ``advert``'s socket ``sock``
        (listening from now) until cancelled."""
        sock.listen(64)
        task_status.started(sock.getsockname())
        listener = trio.SocketListener(sock)
        proxy_id = advert.advert_id
        proxy = None
        try:
            async with trio.open_nursery() as n:
                proxy = self._proxies[proxy_id] = Proxy(n)
                while True:
                    conn = await listener.accept()
                    n.start_soon(self._receiver, proxy, conn, proxy_id, n)
        finally:
            if self._proxies.get(proxy_id) is proxy:
                del self._proxies[proxy_id]
            self.context.requests.forget(proxy_id)  # its request listeners (requests: router.relays.responses)

    def receivers_of(self, proxy_id: int) -> list[dict]:
        """The receivers of proxy ``proxy_id`` (for the status page): address,
        bytes queued, messages and bytes dropped for want of room."""
        proxy = self._proxies.get(proxy_id)
        if proxy is None:
            return []
        return [{"peer": rx.peer, "queued_bytes": rx.queue.held, "dropped_messages": rx.queue.dropped_messages,
                 "dropped_bytes": rx.queue.dropped_bytes} for rx in proxy.receivers.values()]

    def _open_stream(self, proxy: Proxy, link: Link, aid: int, proxy_id: int, nursery) -> None:
        sid = link.streams.open(aid, P.StreamKind.TCP)
        st = link.state[sid] = StreamState(sid, P.StreamKind.TCP)
        # the session's requests name our request listeners (router.relays.responses)
        proxy.stream_opened(SessionFanout(self.max_queue, self.budget, self.context.requests.path(proxy_id, link)),
                            link, st)
        self.context.requests.settle(proxy.nursery)  # spare listeners ready before the first request
        link.flush_streams()
        self.counters["streams_opened"] += 1
        self.counters["fanout_streams_opened"] += 1
        nursery.start_soon(self._near_stream, proxy, link, st)

    async def _receiver(self, proxy: Proxy, conn: trio.SocketStream, proxy_id: int, nursery) -> None:
        try:
            if self.receivers >= FANOUT_MAX_RECEIVERS:
                self.counters["fanout_receivers_full"] += 1
                return
            if proxy.st is None:
                link, aid = self.site.link, self.site.proxy_advert(proxy_id)
                if link is None or aid is None:
                    return
                self._open_stream(proxy, link, aid, proxy_id, nursery)
            key, core = next(self._keys), proxy.core
            # it joins at the next message after the bytes held back
            rx = Receiver(conn, core.add(key, trio.current_time(), proxy.held_back()), _peer(conn), proxy)
            proxy.receivers[key] = rx
            self.receivers += 1
            self.counters["fanout_receivers"] += 1
            proxy.splice_check()
            if proxy.st.incoming:
                proxy.st.incoming_ready.set()  # (what is spliced for another may hold it back: _near_feed)
            try:
                async with trio.open_nursery() as n:
                    rx.scope = n.cancel_scope
                    n.start_soon(self._receiver_reads, rx, n.cancel_scope)
                    await self._receiver_writes(rx)
                    n.cancel_scope.cancel()
            finally:
                del proxy.receivers[key]
                self.receivers -= 1
                core.remove(key)
                if proxy.st is not None:
                    self._count_spliced(proxy)
                    if proxy.spliced is rx:
                        rx.broken = True
                        self._count_spliced_dropped(proxy.drop_spliced())
                    proxy.splice_check()
                    proxy.st.incoming_ready.set()  # the stream task looks at its receivers
                self._receiver_ended(rx)
        finally:
            await trio.aclose_forcefully(conn)

    def _receiver_ended(self, rx: Receiver) -> None:
        q = rx.queue
        if q.dropped_messages:
            self.event("fanout_receiver_dropped",
                       f"{rx.peer}: {q.dropped_messages} messages ({q.dropped_bytes} bytes) dropped "
                       f"of {q.messages + q.dropped_messages}")

    async def _receiver_reads(self, rx: Receiver, scope: trio.CancelScope) -> None:
        """What the receiver sends: framed, passed through the upstream message
        path and counted, not passed on, read at most RECEIVER_UPSTREAM_RATE
        bytes a second; ends the receiver at EOF, on an error, or on bytes that
        are not LBMC."""
        framer = lbmc_stream.StreamFramer()
        path = self.upstream
        pacer = RatePacer((8 * RECEIVER_UPSTREAM_RATE, 0), 0, RECEIVER_UPSTREAM_BURST)
        try:
            while True:
                data = await rx.conn.receive_some(RECEIVER_READ)
                if not data:
                    break
                self.counters["fanout_receiver_bytes"] += len(data)
                for run in framer.cut(data):
                    self.counters["fanout_receiver_messages"] += path.run(run).count
                now = trio.current_time()
                at = pacer.reserve(now, len(data))
                if at > now:
                    self.counters["fanout_receiver_paced"] += 1
                    await trio.sleep_until(at)
        except lbmc.LbmcDecodeError as e:
            self.counters["fanout_receiver_malformed"] += 1
            self.event("fanout_receiver_malformed", f"{rx.peer}: {e}")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        scope.cancel()

    def _push(self, rx: Receiver) -> None:
        """Write what the receiver's socket takes now (never waits): its queue, again
        after a short write, until the queue is empty or the socket refuses more (a
        short write does not mean a full socket: the kernel may take a few segments a
        call while the receiver keeps up), at most PUSH_WRITES times (then the
        receiver's task goes on once the socket is writable: a receiver that frees
        its window a few bytes at a time holds nobody up); then, its queue empty,
        what was spliced for it at the head of the stream (:meth:`_forward`)."""
        q = rx.queue
        if rx.blocked or rx.broken:
            return
        proxy = rx.proxy
        if q.held and not self._write_queue(rx, q, proxy):
            return
        st = proxy.st
        if st is None:
            return
        if proxy.spliced is rx:
            st.sink_idle = True
            if proxy.holds_spliced(rx):
                if not self._forward(proxy):
                    return  # its socket is full (the writer task waits for it)
                if st.incoming:
                    st.incoming_ready.set()  # the stream's bytes behind them may go on
        elif not st.splice_whole:
            proxy.splice_check()  # (an empty queue: its lone receiver may be spliced to)

    def _write_queue(self, rx: Receiver, q: SinkQueue, proxy: Proxy) -> bool:
        """:meth:`_push` of the queue: True when it is empty now."""
        fd = rx.fd
        wrote = 0
        now = trio.current_time()  # (the writes in a row take microseconds: one time for them)
        try:
            for _ in range(PUSH_WRITES):
                k = os.writev(fd, q.head(IOV_MAX))
                if not k:
                    break
                q.wrote(k, now)
                wrote += k
                if not q.held:
                    break
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            rx.broken = True
            rx.wake.set()
            return False
        if wrote:
            st = proxy.st
            # the stream's bytes held back may go on once the queue has room for a quarter of
            # its size (SessionFanout.opens: less would wake the stream task for nothing)
            if st is not None and st.incoming and proxy.core.opens(q):
                st.incoming_ready.set()
        if q.held:
            rx.blocked = True
            rx.wake.set()
            return False
        return True

    async def _receiver_writes(self, rx: Receiver) -> None:
        """The receiver's queue into its socket; returns when it went away, stalled
        (nothing taken for the stall timeout) or the session ended."""
        q = rx.queue
        while not rx.broken:
            if rx.blocked:
                with trio.move_on_at(q.last_progress + self.stall_timeout):
                    try:
                        await trio.lowlevel.wait_writable(rx.conn.socket)
                    except (trio.ClosedResourceError, OSError):
                        return
                rx.blocked = False
                now = trio.current_time()
                if q.stalled(now, self.stall_timeout) or rx.proxy.spliced_stalled(rx, now, self.stall_timeout):
                    self.counters["fanout_receivers_stalled"] += 1
                    self.event("fanout_receiver_stalled",
                               f"{rx.peer}: took nothing for {self.stall_timeout:g} s; disconnected")
                    return
                self._push(rx)
            elif q.held or rx.proxy.holds_spliced(rx):
                self._push(rx)
            elif q.closing:
                return
            else:
                rx.wake = trio.Event()
                await rx.wake.wait()

    async def _near_stream(self, proxy: Proxy, link: Link, st: StreamState) -> None:
        """The proxy's link stream: the session's bytes to every receiver; ends with
        the far side, the link, or NEAR_LINGER seconds after the last receiver left."""
        core = proxy.core
        link.pipes.stream_started()  # (its frames may be spliced: the pipes are kept for reuse meanwhile)
        try:
            await st.accepted.wait()
            if st.refused is not None:
                return
            idle_since = math.inf
            while True:
                if st.incoming:
                    self._near_feed(proxy, link, st)
                if st.closed or link.closed:
                    return
                now = trio.current_time()
                if proxy.receivers:
                    idle_since = math.inf
                elif idle_since == math.inf:
                    idle_since = now
                elif now >= idle_since + NEAR_LINGER:
                    return
                st.incoming_ready = trio.Event()
                recheck = core.recheck_at() if st.incoming else math.inf  # (bytes held back)
                if proxy.spliced is not None:  # (the reader passes its bytes on: count them now and then)
                    self._count_spliced(proxy)
                    recheck = min(recheck, now + SPLICED_COUNT_INTERVAL)
                deadline = min(idle_since + NEAR_LINGER, recheck, proxy.spliced_wait + core.lag_timeout)
                if deadline == math.inf:  # (the usual case: receivers, nothing held back)
                    await st.incoming_ready.wait()
                else:
                    with trio.move_on_at(deadline):
                        await st.incoming_ready.wait()
        except lbmc.LbmcDecodeError as e:
            self.counters["fanout_stream_malformed"] += 1
            self.event("fanout_stream_malformed", f"peer {link.peer_name}: {e}")
        finally:
            if proxy.st is st:
                self._count_spliced(proxy)
            proxy.stream_ended(st)
            core.end()
            for rx in proxy.receivers.values():
                rx.wake.set()
            link.close_stream(st)
            link.pipes.stream_ended()

    def _near_feed(self, proxy: Proxy, link: Link, st: StreamState) -> None:
        """The stream's bytes from the peer to the receivers' queues and sockets,
        as far as the slowest receiver that keeps up takes them
        (:meth:`SessionFanout.room`); their credit goes back as they are taken.
        When the receivers take no more, the bytes wait and so does the peer (its
        queue for the link fills, then it stops reading the origin); a receiver
        slower than the rest drops its own messages (counted)."""
        now = trio.current_time()
        core = proxy.core
        nbytes = 0
        incoming = st.incoming
        while incoming:
            if type(incoming[0]) in SPLICED_ITEMS:  # (spliced for the lone receiver: in order)
                if not self._forward(proxy):
                    self._spliced_held(proxy, now)
                    break
                continue
            behind = core.fell_behind
            room = core.room(now)
            if core.fell_behind != behind:
                self.counters["fanout_receivers_behind"] += core.fell_behind - behind
            if not room:
                self.counters["fanout_stream_paced"] += 1
                break
            data = incoming[0]
            if len(data) > room:
                view = memoryview(data)
                incoming[0], data = view[room:], view[:room]
            else:
                incoming.popleft()
            nbytes += len(data)
            self._count_drops(core.feed(data, now))
            self.context.requests.settle(proxy.nursery)  # the listeners the requests were given serve from now
            for rx in proxy.receivers.values():
                self._push(rx)
        if nbytes:
            return_credit(link, st, nbytes)
        self._count_spliced(proxy)
        proxy.splice_check()  # (and whether the lone receiver's queue is empty now: sink_idle)

    def _forward(self, proxy: Proxy) -> bool:
        """:meth:`Proxy.forward`, counted: True when nothing spliced is left at the head."""
        done, dropped = proxy.forward()
        self._count_spliced_dropped(dropped)
        return done

    def _spliced_held(self, proxy: Proxy, now: float) -> None:
        """:meth:`Proxy.spliced_held`, counted and told."""
        rx = proxy.spliced
        if proxy.spliced_held(now, proxy.core.lag_timeout):
            self.counters["fanout_receivers_behind"] += 1
            if rx is not None:
                self.event("fanout_receiver_behind",
                           f"{rx.peer}: took none of its spliced bytes for {proxy.core.lag_timeout:g} s "
                           f"while other receivers waited; disconnected")
                if rx.scope is not None:
                    rx.scope.cancel()  # (at once: its queue no longer holds the others back)
            self._count_spliced_dropped(proxy.drop_spliced())

    def _count_spliced(self, proxy: Proxy) -> None:
        n = proxy.spliced_count()
        if n:
            self.counters["fanout_spliced_bytes"] += n

    def _count_spliced_dropped(self, nbytes: int) -> None:
        if nbytes:
            self.counters["fanout_spliced_dropped_bytes"] += nbytes

    def _count_drops(self, drops) -> None:
        for d in drops:
            self.counters["fanout_dropped_messages"] += d.messages
            self.counters["fanout_dropped_bytes"] += d.nbytes

    # -------------------------------------------------------- far side

    def open_far(self, link: Link, ev: S.StreamOpened, origin) -> None:
        """The peer opened a stream for an advertisement of the TCP session ``origin``
        (:meth:`router.relays.tcp_fanout_origin.OriginFanout.open_far`)."""
        self.origins.open_far(link, ev, origin)
