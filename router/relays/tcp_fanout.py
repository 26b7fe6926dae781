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
router, as it is framed (``upstream_rules``).
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
from ..link import SPLICED_ITEMS, Link, PipeSeg, SplicedBytes, StreamState
from ..peerlink import streams as S
from .interface import RelayContext, TransportRelay, Upstreams
from .tcp_fanout_origin import OriginFanout

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
_WHOLE_MESSAGES = int(P.Capability.WHOLE_MESSAGES)  # (a plain int: ``int & IntFlag`` goes through enum)
IOV_MAX = 64  # chunks per writev to a receiver
SPLICED_COUNT_INTERVAL = 1.0  # seconds between counts of the bytes spliced to a lone receiver (at most)
PUSH_WRITES = 16  # writevs to a receiver in a row (a queue's worth or more: a few segments each)
# receiver connections of one endpoint's proxies at once (as many as the link streams
# of the per-connection relay); their queues share a QueueBudget of 256 MiB
FANOUT_MAX_RECEIVERS = 4096


class _Receiver:
    __slots__ = ("conn", "fd", "queue", "peer", "blocked", "broken", "wake", "proxy")

    def __init__(self, conn: trio.SocketStream, queue: SinkQueue, peer: str, proxy: _Proxy) -> None:
        self.conn, self.queue, self.peer, self.proxy = conn, queue, peer, proxy
        self.fd = conn.socket.fileno()  # written only while the receiver is in its proxy's table
        self.blocked = False  # its socket was full: the writer waits for it
        self.broken = False  # writing failed: it went away
        self.wake = trio.Event()


class _Proxy:
    """The near side of one proxy: the link stream (if open), the receivers and
    the nursery of its tasks (its request listeners' too)."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.core: SessionFanout | None = None
        self.link: Link | None = None
        self.st: StreamState | None = None
        self.receivers: dict[int, _Receiver] = {}
        # the receiver the stream's pipe segments are for (its socket is the stream's ``sock``):
        # the lone one when whole-message frames began to be spliced to it
        self.spliced: _Receiver | None = None
        self.spliced_counted = 0  # of the stream's spliced bytes (StreamState.spliced_out) counted
        self.spliced_seen = 0  # ... seen (progress of its receiver, whoever passed them on)
        self.copied_out = 0  # bytes of spliced frames written from memory (no pipe was free), less those dropped
        self.segments_wait = math.inf  # since when pipe segments wait for it while others wait too


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
        self._proxies: dict[int, _Proxy] = {}  # the near side of each proxy serving, by proxy id

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
                proxy = self._proxies[proxy_id] = _Proxy(n)
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

    def _open_stream(self, proxy: _Proxy, link: Link, aid: int, proxy_id: int, nursery) -> None:
        sid = link.streams.open(aid, P.StreamKind.TCP)
        st = link.state[sid] = StreamState(sid, P.StreamKind.TCP)
        st.whole_only = True  # (spliced to a lone receiver: _splice_check)
        # the session's requests name our request listeners (router.relays.responses)
        proxy.core = SessionFanout(self.max_queue, self.budget, self.context.requests.path(proxy_id, link))
        self.context.requests.settle(proxy.nursery)  # spare listeners ready before the first request
        proxy.link, proxy.st = link, st
        link.flush_streams()
        self.counters["streams_opened"] += 1
        self.counters["fanout_streams_opened"] += 1
        nursery.start_soon(self._near_stream, proxy, link, st)

    async def _receiver(self, proxy: _Proxy, conn: trio.SocketStream, proxy_id: int, nursery) -> None:
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
            # it joins at the next message after the bytes held back (and after those spliced for
            # the lone receiver before it, which the session's framer never sees)
            held_back = sum(len(d) for d in proxy.st.incoming if type(d) not in SPLICED_ITEMS)
            rx = _Receiver(conn, core.add(key, trio.current_time(), held_back), _peer(conn), proxy)
            proxy.receivers[key] = rx
            self.receivers += 1
            self.counters["fanout_receivers"] += 1
            self._splice_check(proxy)
            if proxy.st.incoming:
                proxy.st.incoming_ready.set()  # (bytes spliced for another may hold it back: _segments_held)
            try:
                async with trio.open_nursery() as n:
                    n.start_soon(self._receiver_reads, rx, n.cancel_scope)
                    await self._receiver_writes(rx)
                    n.cancel_scope.cancel()
            finally:
                del proxy.receivers[key]
                self.receivers -= 1
                core.remove(key)
                if proxy.st is not None:
                    self._count_spliced(proxy, proxy.st)
                    if proxy.spliced is rx:
                        rx.broken = True
                        self._drop_segments(proxy)
                    self._splice_check(proxy)
                    proxy.st.incoming_ready.set()  # the stream task looks at its receivers
                self._receiver_ended(rx)
        finally:
            await trio.aclose_forcefully(conn)

    def _receiver_ended(self, rx: _Receiver) -> None:
        q = rx.queue
        if q.dropped_messages:
            self.event("fanout_receiver_dropped",
                       f"{rx.peer}: {q.dropped_messages} messages ({q.dropped_bytes} bytes) dropped "
                       f"of {q.messages + q.dropped_messages}")

    async def _receiver_reads(self, rx: _Receiver, scope: trio.CancelScope) -> None:
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

    def _push(self, rx: _Receiver) -> None:
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
            if self._holds_segments(rx):
                if not self._forward(proxy):
                    return  # its socket is full (the writer task waits for it)
                if st.incoming:
                    st.incoming_ready.set()  # the stream's bytes behind them may go on
        elif not st.splice_whole:
            self._splice_check(proxy)  # (an empty queue: its lone receiver may be spliced to)

    def _write_queue(self, rx: _Receiver, q: SinkQueue, proxy: _Proxy) -> bool:
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

    async def _receiver_writes(self, rx: _Receiver) -> None:
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
                if q.stalled(trio.current_time(), self.stall_timeout) or self._segments_stalled(rx):
                    self.counters["fanout_receivers_stalled"] += 1
                    self.event("fanout_receiver_stalled",
                               f"{rx.peer}: took nothing for {self.stall_timeout:g} s; disconnected")
                    return
                self._push(rx)
            elif q.held or self._holds_segments(rx):
                self._push(rx)
            elif q.closing:
                return
            else:
                rx.wake = trio.Event()
                await rx.wake.wait()

    async def _near_stream(self, proxy: _Proxy, link: Link, st: StreamState) -> None:
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
                    self._count_spliced(proxy, st)
                    recheck = min(recheck, now + SPLICED_COUNT_INTERVAL)
                deadline = min(idle_since + NEAR_LINGER, recheck, proxy.segments_wait + core.lag_timeout)
                if deadline == math.inf:  # (the usual case: receivers, nothing held back)
                    await st.incoming_ready.wait()
                else:
                    with trio.move_on_at(deadline):
                        await st.incoming_ready.wait()
        except lbmc.LbmcDecodeError as e:
            self.counters["fanout_stream_malformed"] += 1
            self.event("fanout_stream_malformed", f"peer {link.peer_name}: {e}")
        finally:
            self._count_spliced(proxy, st)
            if proxy.st is st:
                proxy.st = proxy.link = proxy.core = proxy.spliced = None
                proxy.spliced_counted = proxy.spliced_seen = proxy.copied_out = 0
                proxy.segments_wait = math.inf
            core.end()
            for rx in proxy.receivers.values():
                rx.wake.set()
            link.close_stream(st)
            link.pipes.stream_ended()

    def _near_feed(self, proxy: _Proxy, link: Link, st: StreamState) -> None:
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
                    self._segments_held(proxy, now)
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
            try:
                link.streams.consumed(st.sid, nbytes)
            except S.LocalStreamError:
                pass
            link.flush_streams()
        self._count_spliced(proxy, st)
        self._splice_check(proxy)  # (and whether the lone receiver's queue is empty now: sink_idle)

    # ------------------------------------- near side: spliced to a lone receiver

    def _splice_check(self, proxy: _Proxy) -> None:
        """Let the link's reader splice frames of whole messages without extension
        headers (FLAG_WHOLE_MESSAGES: the far router's message path passed them, ours
        has nothing to do; each begins and ends at a message boundary) straight
        into the socket of the proxy's receiver while it is the only one; stop it
        otherwise. What is spliced waits in the stream's bytes, in order with the
        bytes framed for the queues (:data:`router.link.SPLICED_ITEMS`), and goes to
        its receiver once what was queued for it before has gone
        (``st.sink_idle``). It goes to the receiver it was spliced for
        (``proxy.spliced``), which changes only once none of it is left."""
        st = proxy.st
        if st is None:
            return
        link = proxy.link
        old = proxy.spliced
        if old is not None and (old.broken or len(proxy.receivers) != 1) and not st.rx_splicing \
                and not any(type(d) in SPLICED_ITEMS for d in st.incoming):
            proxy.spliced = st.sock = None  # (its receiver went or is not alone; nothing left for it)
        ok = False
        if len(proxy.receivers) == 1 and link.zero_copy and link.capabilities & _WHOLE_MESSAGES:
            rx = next(iter(proxy.receivers.values()))
            if proxy.spliced is None and not rx.broken and not st.rx_splicing:
                proxy.spliced, st.sock, st.owns_sock, st.sink_broken = rx, rx.conn, False, False
                proxy.spliced_counted = proxy.spliced_seen = st.spliced_out + proxy.copied_out
            ok = proxy.spliced is rx and not rx.broken
        st.splice_whole = ok
        rx = proxy.spliced
        st.sink_idle = rx is not None and not rx.broken and not rx.queue.held

    def _holds_segments(self, rx: _Receiver) -> bool:
        """Whether bytes spliced for ``rx`` are at the head of its proxy's stream."""
        st = rx.proxy.st
        return rx.proxy.spliced is rx and st is not None and bool(st.incoming) \
            and type(st.incoming[0]) in SPLICED_ITEMS

    def _segments_stalled(self, rx: _Receiver) -> bool:
        """``rx`` holds spliced bytes and took none of them for the stall timeout."""
        return (self._holds_segments(rx)
                and trio.current_time() - rx.queue.last_progress >= self.stall_timeout)

    def _forward(self, proxy: _Proxy) -> bool:
        """The spliced bytes at the head of the stream into the socket of the receiver
        they are for, once its queue is empty, as far as the socket takes them now
        (their credit goes back); thrown away if it is gone. True when none is left
        at the head."""
        st, rx = proxy.st, proxy.spliced
        inc = st.incoming
        if not inc or type(inc[0]) not in SPLICED_ITEMS:
            return True
        if rx is None or rx.broken or st.sink_broken:
            self._drop_segments(proxy)
            return True
        if rx.queue.held:
            st.sink_idle = False
            return False  # (what was queued for it goes first: _push forwards them after it)
        link = proxy.link
        done = True
        while inc and type(inc[0]) in SPLICED_ITEMS:
            if type(inc[0]) is PipeSeg:
                if not link.forward(st):
                    done = False
                    break
                continue
            data = inc[0]  # (SplicedBytes: its frame took the copy path)
            try:
                k = os.write(rx.fd, data)
            except (BlockingIOError, InterruptedError):
                done = False
                break
            except OSError:
                st.sink_broken = True
                break
            proxy.copied_out += k
            try:
                link.streams.consumed(st.sid, k)
            except S.LocalStreamError:
                pass
            link.flush_streams()
            if k < len(data):
                inc[0] = SplicedBytes(data[k:])
                done = False
                break
            inc.popleft()
        if st.sink_broken:  # it went away
            rx.broken = True
            rx.wake.set()
            self._drop_segments(proxy)
            return True
        out = st.spliced_out + proxy.copied_out
        if out != proxy.spliced_seen:  # it took bytes (here, or from the link's reader)
            proxy.spliced_seen = out
            rx.queue.last_progress = trio.current_time()
            proxy.segments_wait = math.inf
        if not done and not rx.blocked:
            rx.blocked = True  # its writer task goes on once its socket is writable
            rx.wake.set()
        return done

    def _segments_held(self, proxy: _Proxy, now: float) -> None:
        """Spliced bytes wait for their receiver: when other receivers wait behind them
        (they joined after) for the lag timeout, it is disconnected (its spliced bytes
        cannot be cut at a message boundary) and they go on."""
        if len(proxy.receivers) < 2:
            proxy.segments_wait = math.inf
        elif proxy.segments_wait == math.inf:
            proxy.segments_wait = now
        elif now >= proxy.segments_wait + proxy.core.lag_timeout:
            rx = proxy.spliced
            proxy.segments_wait = math.inf
            self.counters["fanout_receivers_behind"] += 1
            if rx is not None:
                self.event("fanout_receiver_behind",
                           f"{rx.peer}: took none of its spliced bytes for {proxy.core.lag_timeout:g} s "
                           f"while other receivers waited; disconnected")
                rx.broken = True
                rx.wake.set()
            self._drop_segments(proxy)
            proxy.st.incoming_ready.set()

    def _drop_segments(self, proxy: _Proxy) -> None:
        """Throw away what the stream holds spliced for a receiver that is gone, and
        return its credit; once the reader finished its last spliced frame the
        stream is spliced to nobody (:meth:`_splice_check`)."""
        st, link = proxy.st, proxy.link
        self._count_spliced(proxy, st)
        dropped = st.drop_spliced(link.pipes)
        if dropped:
            self.counters["fanout_spliced_dropped_bytes"] += dropped
            try:
                link.streams.consumed(st.sid, dropped)
            except S.LocalStreamError:
                pass
            link.flush_streams()
        st.splice_whole = st.sink_idle = False
        if not st.rx_splicing:
            st.sink_broken = False
            st.sock = proxy.spliced = None
        proxy.spliced_counted = proxy.spliced_seen = st.spliced_out + proxy.copied_out

    def _count_spliced(self, proxy: _Proxy, st: StreamState) -> None:
        """Add the bytes passed on to the lone receiver since the last count to the counters."""
        out = st.spliced_out + proxy.copied_out
        n = out - proxy.spliced_counted
        if n > 0:
            self.counters["fanout_spliced_bytes"] += n
            proxy.spliced_counted = out

    def _count_drops(self, drops) -> None:
        for d in drops:
            self.counters["fanout_dropped_messages"] += d.messages
            self.counters["fanout_dropped_bytes"] += d.nbytes

    # -------------------------------------------------------- far side

    def open_far(self, link: Link, ev: S.StreamOpened, origin) -> None:
        """The peer opened a stream for an advertisement of the TCP session ``origin``
        (:meth:`router.relays.tcp_fanout_origin.OriginFanout.open_far`)."""
        self.origins.open_far(link, ev, origin)
