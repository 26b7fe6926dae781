"""Unicast immediate messages routed by domain, on trio (``lbmr-router(8)``,
"Unicast immediate messages by domain"; the decisions are
:class:`router.core.uim.UimPath`'s, this module only moves bytes).

* **Request listeners** (:meth:`UimRelay.serve_listener`, a task per endpoint
  with ``<request-tcp>``, a task per accepted connection): the connection is
  consecutive LBMC messages framed by ``msglen``, read in chunks of
  :data:`READ_CHUNK` bytes and cut without copying
  (:class:`lbmr_proto.lbmc.StreamFramer`); each whole message goes to
  :meth:`UimPath.message` and what it decides is done at once, never
  waiting: a message is queued for its target or dropped, counted.
* **Targets** (a task each): a destination in one of our TRDs (one TCP
  connection to ``ip:port``, from the endpoint's address, reused for every
  message to it), or a destination behind a peer link (one UIM_ROUTED
  stream on the link towards the router the route names, reused). Each has
  a bounded queue (:data:`TARGET_QUEUE` bytes; :data:`QUEUED_TOTAL` over
  all): a target that is slow, stalled (nothing written for
  :data:`STALL_TIMEOUT`), refusing or unreachable loses its own messages,
  counted, and nobody else's; after a failure it drops what comes for
  :data:`RETRY_AFTER` seconds, then tries again. A target idle for
  :data:`TARGET_IDLE` seconds closes; when all :data:`MAX_TARGETS` are taken,
  the least recently used one with nothing queued makes room.
* **Late-join and OTR requests** (:class:`router.core.uim.RecoverMessage`):
  a target per (link, advertisement, receiver address): one RECOVERY stream
  on the link the proxy's advertisement came from, the requests (unchanged)
  one way; the source's answers the other way are written, unchanged, to one
  TCP connection to the receiver's address (from the endpoint's address),
  bounded like a delivery (:data:`STALL_TIMEOUT`); a receiver that cannot be
  reached, or takes nothing, ends the stream (counted). The router behind
  the advertisement serves the other end (:mod:`router.relays.recovery`).
* **UIM_ROUTED streams the peer opens** (:meth:`UimRelay.open_far`):
  refused at once when :meth:`UimPath.open_stream` says so, else accepted;
  their bytes are framed and each message decided like a listener's.

Bounds per input (all counted in :attr:`UimRelay.counters`): connections per
listener (:data:`MAX_CONNECTIONS`) and in all (:data:`MAX_CONNECTIONS_TOTAL`);
bytes held per connection (one incomplete message, < 64 KiB, plus one
read); a message not completed within :data:`MESSAGE_TIMEOUT` seconds; a
connection silent for :data:`IDLE_TIMEOUT`; targets (:data:`MAX_TARGETS`).
"""

from __future__ import annotations

import socket
from collections import OrderedDict, deque
from collections.abc import Callable

import trio

from .. import peerlink as P
from ..core.uim import (
    DeliverMessage,
    DropMessage,
    ForwardMessage,
    RecoverMessage,
    UimAction,
    UimPath,
    UimStream,
)
from ..link import CONNECT_TIMEOUT, Link, StreamState
from ..peerlink import streams as S
from .tcp_fanout import accept_stream
from .unicast import READ_CHUNK, UimFramer, connect_from, send_on_stream, watch_until_closed

__all__ = ["UimRelay", "MAX_CONNECTIONS", "MAX_CONNECTIONS_TOTAL", "IDLE_TIMEOUT",
           "MESSAGE_TIMEOUT", "TARGET_QUEUE", "QUEUED_TOTAL", "MAX_TARGETS", "STALL_TIMEOUT",
           "RETRY_AFTER", "TARGET_IDLE", "LISTEN_BACKLOG", "MAX_FAR_STREAMS",
           "MAX_RECOVERY_TARGETS"]

MAX_CONNECTIONS = 64  # senders' connections at once on one request listener
MAX_CONNECTIONS_TOTAL = 1024  # and on all of them
IDLE_TIMEOUT = 60.0  # seconds a sender's connection may stay silent
MESSAGE_TIMEOUT = 10.0  # seconds a started message has to complete
TARGET_QUEUE = 1 << 20  # bytes queued for one target (the DRO's max-queue)
QUEUED_TOTAL = 64 << 20  # bytes queued for all targets
MAX_TARGETS = 1024  # destinations (connections and streams) at once
#: late-join/OTR destinations at once: each holds a RECOVERY stream that is never evicted
#: while open (answers may come), so they may take only part of MAX_TARGETS
MAX_RECOVERY_TARGETS = MAX_TARGETS // 4
MAX_FAR_STREAMS = MAX_TARGETS  # UIM_ROUTED streams a peer has open to us at once on one link (its MAX_TARGETS)
STALL_TIMEOUT = 5.0  # seconds a target may take to take what is written to it
RETRY_AFTER = 1.0  # seconds a failed target drops its messages before it is tried again
TARGET_IDLE = 30.0  # seconds without a message before a target closes
LISTEN_BACKLOG = 64
WRITE_BATCH = 256 << 10  # bytes of queued messages written at once
DECIDE_BATCH = 1024  # messages decided before the other tasks run
EVICT_SCAN = 64  # least recently used destinations looked at for one to close when all are taken


class _Target:
    """One destination's queue (either kind)."""

    __slots__ = ("key", "queue", "held", "wake", "down_until", "last_used", "scope", "busy")

    def __init__(self, key: tuple, now: float) -> None:
        self.key = key
        self.queue: deque[bytes] = deque()
        self.held = 0
        self.wake = trio.Event()
        self.down_until = float("-inf")
        self.last_used = now
        self.scope = trio.CancelScope()
        self.busy = False  # writing messages taken from the queue


class UimRelay:
    """The UIM data path of one router. ``path``: the decisions; ``bind_ips``:
    endpoint name -> the address its deliveries connect from ("0.0.0.0": the
    system's choice); ``links``: link name -> the link task of each peer link
    (its ``link``: the connection up now, or None); ``routing``: whose
    ``links()`` names the router at the other end of each connected link.
    ``event(kind, detail)``: the router's log."""

    def __init__(self, path: UimPath, bind_ips: dict[str, str], links: dict, routing,
                 event: Callable[[str, str], None]) -> None:
        self.path = path
        self.counters = path.counters
        self.bind_ips = bind_ips
        self.links = links
        self.routing = routing
        self.event = event
        self.nursery: trio.Nursery | None = None  # the router's: targets and far streams
        self.connections = 0  # senders' connections open on all listeners
        self.queued = 0  # bytes queued for all targets
        self._targets: OrderedDict[tuple, _Target] = OrderedDict()  # least recently used first
        self.recovering = 0  # late-join/OTR destinations (RecoverMessage targets) now
        self._far_streams: dict[int, int] = {}  # id(link) -> UIM_ROUTED streams the peer has open on it

    @property
    def target_count(self) -> int:
        """Destinations with a connection or stream (or waiting for one) now."""
        return len(self._targets)

    # ------------------------------------------------------------ listeners

    async def serve_listener(self, endpoint: str, address: tuple[str, int], *,
                             task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Endpoint ``endpoint``'s request listener at ``address``: reports the bound
        address, then takes senders until cancelled."""
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            raw.bind(address)
            raw.listen(LISTEN_BACKLOG)
        except OSError:
            raw.close()
            raise
        sock = trio.socket.from_stdlib_socket(raw)
        listener = trio.SocketListener(sock)
        live = 0
        task_status.started(raw.getsockname()[:2])
        async with listener, trio.open_nursery() as n:
            while True:
                try:
                    conn = await listener.accept()
                except OSError as e:  # descriptors run out: keep the others going
                    self.counters["uim_accept_failed"] += 1
                    self.event("uim_accept_failed", f"{endpoint}: {e}")
                    await trio.sleep(0.1)
                    continue
                if live >= MAX_CONNECTIONS or self.connections >= MAX_CONNECTIONS_TOTAL:
                    self.counters["uim_connections_refused"] += 1
                    await trio.aclose_forcefully(conn)
                    continue
                live += 1
                self.connections += 1
                self.counters["uim_connections"] += 1

                async def one(conn=conn):
                    nonlocal live
                    try:
                        await self.serve_connection(conn, endpoint)
                    finally:
                        live -= 1
                        self.connections -= 1

                n.start_soon(one)

    async def serve_connection(self, conn: trio.abc.Stream, endpoint: str) -> None:
        """One sender's connection ``conn`` to endpoint ``endpoint``'s listener, until it
        ends: whole messages decided one by one; a malformed stream, a message not
        completed MESSAGE_TIMEOUT seconds after its first byte, or IDLE_TIMEOUT seconds
        of silence close it (counted)."""
        framer = UimFramer()
        started = None  # when the message held incomplete began
        try:
            while True:
                now = trio.current_time()
                until = now + IDLE_TIMEOUT
                if started is not None:
                    until = min(until, started + MESSAGE_TIMEOUT)
                timeout = "uim_connections_idle" if started is None or until < started + MESSAGE_TIMEOUT \
                    else "uim_message_timeout"
                with trio.move_on_at(until) as cs:
                    data = await conn.receive_some(READ_CHUNK)
                if cs.cancelled_caught:
                    self.counters[timeout] += 1
                    return
                if not data:
                    if framer.buffered:
                        self.counters["uim_truncated"] += 1
                    return
                runs, error = framer.cut(data)
                await self._runs(runs, None, endpoint)
                if error is not None:
                    self.counters["uim_malformed"] += 1
                    self.event("uim_malformed", f"stream offset {error.offset}: {error.reason}")
                    return
                if not framer.buffered:
                    started = None
                elif runs or started is None:
                    started = trio.current_time()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await trio.aclose_forcefully(conn)

    async def _runs(self, runs: list, stream: UimStream | None, endpoint: str | None) -> None:
        """Decide and do each message of ``runs``, letting the other tasks run every
        DECIDE_BATCH messages (a chunk of tiny messages holds the loop no longer)."""
        message = self.path.message
        k = 0
        for run in runs:
            data, start = run.data, 0
            for end in run.ends:
                self.take(message(data[start:end], stream, endpoint=endpoint))
                start = end
                k += 1
                if k % DECIDE_BATCH == 0:
                    await trio.lowlevel.checkpoint()

    # ------------------------------------------------------------ decisions done

    def take(self, action: UimAction) -> None:
        """Do what the path decided, at once: queue the message for its target or
        (dropped) nothing more; never waits."""
        if isinstance(action, DropMessage):
            return  # (counted by the path)
        if isinstance(action, DeliverMessage):
            key = ("deliver", action.endpoint, action.ip, action.port)
        elif isinstance(action, RecoverMessage):
            key = ("recover", action.endpoint, action.link, action.advert_id, action.requester_ip,
                   action.requester_port)
        else:
            assert isinstance(action, ForwardMessage)
            key = ("forward", action.next_router, action.domain_id, action.ip, action.port, action.hops)
        now = trio.current_time()
        t = self._targets.get(key)
        if t is None:
            if key[0] == "recover" and self.recovering >= MAX_RECOVERY_TARGETS:
                self.counters["recovery_targets_full"] += 1
                return
            if self.nursery is None or (len(self._targets) >= MAX_TARGETS and not self._evict()):
                self.counters["uim_targets_full"] += 1
                return
            t = self._targets[key] = _Target(key, now)
            if key[0] == "recover":
                self.recovering += 1
            self.nursery.start_soon(self._target, t)
        else:
            self._targets.move_to_end(key)
        t.last_used = now
        size = len(action.message)
        if now < t.down_until:
            self.counters["uim_target_down"] += 1
            return
        if t.held + size > TARGET_QUEUE:
            self.counters["uim_target_queue_full"] += 1
            return
        if self.queued + size > QUEUED_TOTAL:
            self.counters["uim_queued_total_full"] += 1
            return
        t.queue.append(action.message)
        t.held += size
        self.queued += size
        t.wake.set()

    def _evict(self) -> bool:
        """Make room for a new destination: close the least recently used one with
        nothing queued (among the EVICT_SCAN oldest); False if there is none."""
        for k, (key, t) in enumerate(self._targets.items()):
            if k >= EVICT_SCAN:
                break
            if not t.queue and not t.busy:
                del self._targets[key]
                t.scope.cancel()
                self.counters["uim_targets_evicted"] += 1
                return True
        return False

    def _drop_queue(self, t: _Target, counter: str) -> None:
        n = len(t.queue)
        if n:
            self.counters[counter] += n
        t.queue.clear()
        self.queued -= t.held
        t.held = 0

    def _batch(self, t: _Target) -> tuple[bytes, int]:
        """Messages from the head of ``t``'s queue, whole, up to WRITE_BATCH bytes
        (at least one): their bytes and how many."""
        parts, size = [], 0
        while t.queue and (not parts or size + len(t.queue[0]) <= WRITE_BATCH):
            m = t.queue.popleft()
            parts.append(m)
            size += len(m)
        t.held -= size
        self.queued -= size
        return b"".join(parts), len(parts)

    async def _wait(self, t: _Target) -> bool:
        """Until ``t`` has messages (True) or was idle TARGET_IDLE seconds (False)."""
        while not t.queue:
            t.wake = trio.Event()
            with trio.move_on_at(t.last_used + TARGET_IDLE):
                await t.wake.wait()
            if not t.queue and trio.current_time() >= t.last_used + TARGET_IDLE:
                return False
        return True

    async def _target(self, t: _Target) -> None:
        try:
            with t.scope:
                if t.key[0] == "deliver":
                    await self._deliver(t)
                elif t.key[0] == "recover":
                    await self._recover(t)
                else:
                    await self._forward(t)
        finally:
            if t.key[0] == "recover":
                self.recovering -= 1
            self._drop_queue(t, "uim_target_closed")
            if self._targets.get(t.key) is t:
                del self._targets[t.key]

    def _failed(self, t: _Target, counter: str, detail: str) -> None:
        self._drop_queue(t, counter)
        t.down_until = trio.current_time() + RETRY_AFTER
        self.event("uim_target_failed", detail)

    # ------------------------------------------------------------ delivery in our TRD

    async def _deliver(self, t: _Target) -> None:
        """One destination in our TRD: one connection, made at the first message and
        again after the destination closed it (watched: it never says anything)."""
        _, endpoint, ip, port = t.key
        conn = None
        gone = trio.Event()  # the destination closed the connection
        async with trio.open_nursery() as watchers:
            try:
                while await self._wait(t):
                    if conn is not None and gone.is_set():
                        self.counters["uim_deliver_reconnects"] += 1
                        await trio.aclose_forcefully(conn)
                        conn = None
                    if conn is None:
                        try:
                            with trio.fail_after(CONNECT_TIMEOUT):
                                conn = await connect_from(self.bind_ips.get(endpoint, "0.0.0.0"), (ip, port))
                        except (OSError, trio.TooSlowError) as e:
                            self._failed(t, "uim_deliver_unreachable", f"{ip}:{port}: {e}")
                            continue
                        self.counters["uim_deliver_connections"] += 1
                        gone = trio.Event()
                        watchers.start_soon(watch_until_closed, conn, gone)
                    data, n = self._batch(t)
                    ok = False
                    t.busy = True
                    with trio.move_on_after(STALL_TIMEOUT):
                        try:
                            await conn.send_all(data)
                            ok = True
                        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                            pass
                    t.busy = False
                    if ok:
                        self.counters["uim_delivered"] += n
                        continue
                    self.counters["uim_deliver_failed"] += n
                    await trio.aclose_forcefully(conn)
                    conn = None
                    self._failed(t, "uim_deliver_failed", f"{ip}:{port}: stalled or closed")
            finally:
                watchers.cancel_scope.cancel()
                if conn is not None:
                    await trio.aclose_forcefully(conn)

    # ------------------------------------------------------------ towards a peer

    def _link_to(self, router: str) -> Link | None:
        for name, peer in self.routing.links().items():
            if peer == router:
                task = self.links.get(name)
                return task.link if task is not None else None
        return None

    async def _forward(self, t: _Target) -> None:
        _, router, domain, ip, port, hops = t.key
        link: Link | None = None
        st: StreamState | None = None
        try:
            while await self._wait(t):
                if st is None or st.closed or link.closed:
                    if st is not None and link is not None:
                        link.close_stream(st)
                    st = None
                    link = self._link_to(router)
                    if link is None or not link.connected:
                        self._failed(t, "uim_forward_no_link", f"no link to {router}")
                        continue
                    if not link.capabilities & P.Capability.UIM_ROUTING:
                        self._drop_queue(t, "uim_forward_peer_unable")
                        t.down_until = trio.current_time() + RETRY_AFTER
                        continue
                    try:
                        sid = link.streams.open(0, P.StreamKind.UIM_ROUTED, P.RoutedUimTarget(domain, ip, port, hops))
                    except (S.LocalStreamError, P.FrameEncodeError) as e:
                        self._failed(t, "uim_forward_failed", f"{router}: {e}")
                        continue
                    st = link.state[sid] = StreamState(sid, P.StreamKind.UIM_ROUTED)
                    link.flush_streams()
                    self.counters["uim_streams_opened"] += 1
                    with trio.move_on_after(CONNECT_TIMEOUT):
                        await st.accepted.wait()
                    if st.refused is not None or not st.accepted.is_set() or st.closed:
                        self.counters["uim_streams_refused_by_peer"] += 1
                        self._failed(t, "uim_forward_refused", f"{router} refused {domain}:{ip}:{port}: "
                                                              f"{st.refused or 'no answer'}")
                        continue
                data, n = self._batch(t)
                t.busy = True
                sent = await self._send(link, st, data)
                t.busy = False
                if not sent:
                    self.counters["uim_forward_failed"] += n
                    self._failed(t, "uim_forward_failed", f"{router}: stream stalled or closed")
                    continue
                self.counters["uim_forwarded"] += n
        finally:
            if st is not None and link is not None:
                link.close_stream(st)

    async def _send(self, link: Link, st: StreamState, data: bytes) -> bool:
        return await send_on_stream(link, st, data, STALL_TIMEOUT)

    # ------------------------------------------------------------ late join and OTR

    async def _recover(self, t: _Target) -> None:
        """A receiver's late-join and OTR requests for one proxied advertisement:
        one RECOVERY stream, the answers back to the receiver."""
        _, endpoint, lid, advert_id, ip, port = t.key
        task = self.links.get(lid)
        link: Link | None = task.link if task is not None else None
        st: StreamState | None = None
        try:
            async with trio.open_nursery() as n:
                while await self._wait(t):
                    if st is None or st.closed or link.closed:
                        if st is not None:
                            n.cancel_scope.cancel()  # the stream ended: the target with it
                            return
                        link = task.link if task is not None else None
                        if link is None or not link.connected:
                            self._failed(t, "recovery_no_link", f"no link {lid}")
                            continue
                        if not link.capabilities & P.Capability.RECOVERY:
                            self._drop_queue(t, "recovery_peer_unable")
                            t.down_until = trio.current_time() + RETRY_AFTER
                            continue
                        try:
                            sid = link.streams.open(advert_id, P.StreamKind.RECOVERY, P.ResponseTarget(ip, port))
                        except (S.LocalStreamError, P.FrameEncodeError) as e:
                            self._failed(t, "recovery_failed", f"{lid}: {e}")
                            continue
                        st = link.state[sid] = StreamState(sid, P.StreamKind.RECOVERY)
                        link.flush_streams()
                        self.counters["recovery_streams_opened"] += 1
                        with trio.move_on_after(CONNECT_TIMEOUT):
                            await st.accepted.wait()
                        if st.refused is not None or not st.accepted.is_set() or st.closed:
                            self.counters["recovery_streams_refused_by_peer"] += 1
                            self._failed(t, "recovery_refused", f"{lid} refused advert {advert_id} for "
                                                                f"{ip}:{port}: {st.refused or 'no answer'}")
                            link.close_stream(st)
                            st = None
                            continue
                        t.busy = True  # answers may flow at any time: never evicted while open
                        n.start_soon(self._answers, link, st, t, endpoint, (ip, port))
                    data, k = self._batch(t)
                    if not await send_on_stream(link, st, data, STALL_TIMEOUT):
                        self.counters["recovery_requests_failed"] += k
                        self._failed(t, "recovery_failed", f"{lid}: stream stalled or closed")
                        continue
                    self.counters["recovery_requests_sent"] += k
                n.cancel_scope.cancel()
        finally:
            t.busy = False
            if st is not None and link is not None:
                link.close_stream(st)

    async def _answers(self, link: Link, st: StreamState, t: _Target, endpoint: str,
                       receiver: tuple[str, int]) -> None:
        """The source's answers on RECOVERY stream ``st``, written to the receiver (one
        connection, opened at the first answer); the stream ends when the receiver
        cannot be reached or takes nothing for STALL_TIMEOUT."""
        conn = None
        try:
            while True:
                while st.incoming:
                    data = st.incoming.popleft()
                    t.last_used = trio.current_time()  # answers flowing keep the target
                    ok = False
                    with trio.move_on_after(STALL_TIMEOUT if conn is not None else CONNECT_TIMEOUT):
                        try:
                            if conn is None:
                                conn = await connect_from(self.bind_ips.get(endpoint, "0.0.0.0"), receiver)
                                self.counters["recovery_receiver_connections"] += 1
                            await conn.send_all(data)
                            ok = True
                        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                            pass
                    if not ok:
                        self.counters["recovery_receiver_gone"] += 1
                        self.event("recovery_receiver_gone", f"{receiver[0]}:{receiver[1]}")
                        return
                    self.counters["recovery_answer_bytes"] += len(data)
                    try:
                        link.streams.consumed(st.sid, len(data))
                    except S.LocalStreamError:
                        pass
                    link.flush_streams()
                if st.closed or link.closed:
                    return
                st.incoming_ready = trio.Event()
                await st.incoming_ready.wait()
        finally:
            st.closed = True
            link.close_stream(st)
            t.wake.set()  # the target sees the stream end
            if conn is not None:
                await trio.aclose_forcefully(conn)

    # ------------------------------------------------------------ streams the peer opens

    def open_far(self, link: Link, ev: S.StreamOpened, came_from: str | None) -> None:
        """The peer on ``link`` (router ``came_from``) opened UIM_ROUTED stream ``ev``:
        refused beyond MAX_FAR_STREAMS open on the link (counted ``uim_streams_refused_busy``)."""
        tgt = ev.target
        if self._far_streams.get(id(link), 0) >= MAX_FAR_STREAMS:
            self.counters["uim_streams_refused_busy"] += 1
            link.streams.refuse(ev.stream_id, P.RefuseCode.REFUSED, f"{MAX_FAR_STREAMS} UIM_ROUTED streams open")
            link.flush_streams()
            return
        target = UimStream(tgt.domain_id, tgt.ip, tgt.port, tgt.hops, came_from)
        refusal = self.path.open_stream(target)
        if refusal is not None:
            self.counters[refusal.reason.counter] += 1
            self.event("uim_stream_refused", f"{tgt.domain_id}:{tgt.ip}:{tgt.port} from {came_from}: {refusal.detail}")
            link.streams.refuse(ev.stream_id, P.RefuseCode.REFUSED, refusal.detail)
            link.flush_streams()
            return
        st = link.state[ev.stream_id] = StreamState(ev.stream_id, ev.kind)
        if not accept_stream(link, st, self.counters):
            link.state.pop(ev.stream_id, None)
            return
        self._far_streams[id(link)] = self._far_streams.get(id(link), 0) + 1
        link.nursery.start_soon(self._far, link, st, target)

    async def _far(self, link: Link, st: StreamState, target: UimStream) -> None:
        """A UIM_ROUTED stream the peer opened, until it ends: whole messages decided
        one by one; a malformed stream, a message not completed MESSAGE_TIMEOUT seconds
        after its first byte, or IDLE_TIMEOUT seconds of silence close it (counted),
        as a sender's connection to a listener."""
        framer = UimFramer()
        started = None  # when the message held incomplete began
        try:
            while True:
                while st.incoming:
                    data = st.incoming.popleft()
                    runs, error = framer.cut(data)
                    await self._runs(runs, target, None)
                    if error is not None:
                        self.counters["uim_malformed"] += 1
                        self.event("uim_malformed", f"UIM_ROUTED stream {st.sid}: offset {error.offset}: "
                                                    f"{error.reason}")
                        return
                    if not framer.buffered:
                        started = None
                    elif runs or started is None:
                        started = trio.current_time()
                    try:
                        link.streams.consumed(st.sid, len(data))
                    except S.LocalStreamError:
                        pass
                    link.flush_streams()
                    await trio.lowlevel.checkpoint()
                if st.closed or link.closed:
                    return
                st.incoming_ready = trio.Event()
                until = trio.current_time() + IDLE_TIMEOUT
                if started is not None:
                    until = min(until, started + MESSAGE_TIMEOUT)
                with trio.move_on_at(until) as cs:
                    await st.incoming_ready.wait()
                if cs.cancelled_caught:
                    self.counters["uim_message_timeout" if started is not None else "uim_streams_idle"] += 1
                    return
        finally:
            n = self._far_streams.get(id(link), 0) - 1
            if n > 0:
                self._far_streams[id(link)] = n
            else:
                self._far_streams.pop(id(link), None)
            link.close_stream(st)
