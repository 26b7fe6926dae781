"""The destinations of unicast immediate messages, on trio (``lbmr-router(8)``,
"Unicast immediate messages by domain"): what :class:`router.relays.uim.UimRelay`
does with each message :class:`router.core.uim.UimPath` decided to pass on.

* **Targets** (a task each): a destination in one of our TRDs (one TCP
  connection to ``ip:port``, from the endpoint's address, reused for every
  message to it), or a destination behind a peer link (one UIM_ROUTED
  stream on the link towards the router the route names, reused). Each has
  a bounded queue (:data:`TARGET_QUEUE` bytes; :data:`QUEUED_TOTAL` over
  all): a target that is slow, stalled (nothing written for
  :data:`router.relays.unicast.STALL_TIMEOUT`), refusing or unreachable loses
  its own messages, counted, and nobody else's; after a failure it drops what
  comes for :data:`RETRY_AFTER` seconds, then tries again. A target idle for
  :data:`TARGET_IDLE` seconds closes; when all :data:`MAX_TARGETS` are taken,
  the least recently used one with nothing queued makes room.
* **Late-join and OTR requests** (:class:`router.core.uim.RecoverMessage`):
  a target per (link, advertisement, receiver address): one RECOVERY stream
  on the link the proxy's advertisement came from, the requests (unchanged)
  one way; the source's answers the other way are written, unchanged, to one
  TCP connection to the receiver's address (from the endpoint's address),
  bounded like a delivery (``STALL_TIMEOUT``); a receiver that cannot be
  reached, or takes nothing, ends the stream (counted); at most
  :data:`MAX_RECOVERY_TARGETS` at once. The router behind the advertisement
  serves the other end (:mod:`router.relays.recovery`).

:meth:`UimTargets.take` never waits: a message is queued for its target or
dropped, counted.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable

import trio

from .. import peerlink as P
from ..core.uim import DeliverMessage, DropMessage, ForwardMessage, RecoverMessage, UimAction
from ..link import CONNECT_TIMEOUT, Link, StreamState, return_credit
from .unicast import (
    STALL_TIMEOUT,
    StreamNotOpened,
    StreamRefused,
    connect_from,
    open_accepted_stream,
    send_on_stream,
    watch_until_closed,
)

__all__ = ["UimTargets", "TARGET_QUEUE", "QUEUED_TOTAL", "MAX_TARGETS", "MAX_RECOVERY_TARGETS",
           "RETRY_AFTER", "TARGET_IDLE"]

TARGET_QUEUE = 1 << 20  # bytes queued for one target (the DRO's max-queue)
QUEUED_TOTAL = 64 << 20  # bytes queued for all targets
MAX_TARGETS = 1024  # destinations (connections and streams) at once
#: late-join/OTR destinations at once: each holds a RECOVERY stream that is never evicted
#: while open (answers may come), so they may take only part of MAX_TARGETS
MAX_RECOVERY_TARGETS = MAX_TARGETS // 4
RETRY_AFTER = 1.0  # seconds a failed target drops its messages before it is tried again
TARGET_IDLE = 30.0  # seconds without a message before a target closes
WRITE_BATCH = 256 << 10  # bytes of queued messages written at once
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


class UimTargets:
    """The UIM destinations of one router, a task each in ``nursery`` (the router's).
    ``bind_ips``: endpoint name -> the address its deliveries connect from
    ("0.0.0.0": the system's choice); ``links``: link name -> the link task of each
    peer link (its ``link``: the connection up now, or None); ``routing``: whose
    ``links()`` names the router at the other end of each connected link;
    ``counters``: the UIM data path's; ``event(kind, detail)``: the router's log."""

    def __init__(self, bind_ips: dict[str, str], links: dict, routing, counters: Counter[str],
                 event: Callable[[str, str], None]) -> None:
        self.bind_ips = bind_ips
        self.links = links
        self.routing = routing
        self.counters = counters
        self.event = event
        self.nursery: trio.Nursery | None = None
        self.queued = 0  # bytes queued for all targets
        self._targets: OrderedDict[tuple, _Target] = OrderedDict()  # least recently used first
        self.recovering = 0  # late-join/OTR destinations (RecoverMessage targets) now

    def __len__(self) -> int:
        """Destinations with a connection or stream (or waiting for one) now."""
        return len(self._targets)

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
                        st = await open_accepted_stream(
                            link, 0, P.StreamKind.UIM_ROUTED, P.RoutedUimTarget(domain, ip, port, hops),
                            counters=self.counters, opened="uim_streams_opened",
                            refused="uim_streams_refused_by_peer")
                    except StreamNotOpened as e:
                        self._failed(t, "uim_forward_failed", f"{router}: {e}")
                        continue
                    except StreamRefused as e:
                        self._failed(t, "uim_forward_refused", f"{router} refused {domain}:{ip}:{port}: {e}")
                        continue
                data, n = self._batch(t)
                t.busy = True
                sent = await send_on_stream(link, st, data, STALL_TIMEOUT)
                t.busy = False
                if not sent:
                    self.counters["uim_forward_failed"] += n
                    self._failed(t, "uim_forward_failed", f"{router}: stream stalled or closed")
                    continue
                self.counters["uim_forwarded"] += n
        finally:
            if st is not None and link is not None:
                link.close_stream(st)

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
                            st = await open_accepted_stream(
                                link, advert_id, P.StreamKind.RECOVERY, P.ResponseTarget(ip, port),
                                counters=self.counters, opened="recovery_streams_opened",
                                refused="recovery_streams_refused_by_peer")
                        except StreamNotOpened as e:
                            self._failed(t, "recovery_failed", f"{lid}: {e}")
                            continue
                        except StreamRefused as e:
                            self._failed(t, "recovery_refused", f"{lid} refused advert {advert_id} for {ip}:{port}: {e}")
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
                    return_credit(link, st, len(data))
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
