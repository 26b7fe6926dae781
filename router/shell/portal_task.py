"""One endpoint portal's TR socket on trio: what it receives goes to the
router's core (:meth:`router.core.router_core.RouterCore.tr_datagram`), what
the core has for it (:class:`router.core.router_core.SendTR`) it sends.

The portal's topic resolution is the core's (one
:class:`router.core.endpoint_portal.EndpointPortal` per endpoint: one UM
context in its TRD, whatever the number of links it serves); its timers run
when the router's core runs (:class:`router.shell.router.MultiRouter`). Times are
seconds (trio's clock).
"""

from __future__ import annotations

import logging
import secrets
import socket
from collections import Counter, deque

import trio

from lbmr_runtime.netif import open_multicast_socket

from ..config.model import EndpointConfig
from ..core.tr import DomainRoutes, PortalTR, PortalTRSettings, RemoteCheck, UseQuery

__all__ = ["PortalTask", "portal_timing", "new_portal", "TR_SOCKET_BUFFER"]

log = logging.getLogger("lbmr-router")

TR_SOCKET_BUFFER = 4 << 20  # the portal's TR socket: receive and send buffers
IO_BATCH = 64  # datagrams received (or sent) between two checkpoints of the loop


def portal_timing(e: EndpointConfig) -> dict:
    """The endpoint's ``<topic-resolution>`` timing (with the ``<rate-limit>``s of
    its elements), ``<remote-topic>``, ``<remote-pattern>``, the request listener
    (``<request-tcp>``: the address the domain route records and the proxies' late-join
    options name) and the domain route records (``<domain-route>``, with a listener only) as
    :class:`router.core.tr.PortalTRSettings` fields (seconds; rate limits as (bits a
    second, objects a second))."""
    tr = e.topic_resolution

    def uq(u) -> UseQuery:
        return UseQuery(u.timeout_ms / 1000.0, u.max, u.periodic_interval_ms / 1000.0)

    def rc(r) -> RemoteCheck:
        return RemoteCheck(r.check_interval_ms / 1000.0, r.max, r.timeout_ms / 1000.0)

    def rl(timing) -> tuple[float, float]:
        return float(timing.rate_limit.bps), float(timing.rate_limit.objects_per_second)

    ir = tr.initial_request
    dr = e.domain_route
    listener = e.request_address
    routes = None if listener is None else DomainRoutes(
        dr.min_interval_ms / 1000.0, dr.max_interval_ms / 1000.0, rl(dr))
    return dict(
        request_address=listener, domain_routes=routes,
        initial_request=(ir.periodic_interval_ms / 1000.0, float(ir.duration_s)),
        use_query=uq(tr.topic_use_query), pattern_use_query=uq(tr.pattern_use_query),
        use_query_limit=rl(tr.topic_use_query), pattern_use_query_limit=rl(tr.pattern_use_query),
        refresh_limit=rl(tr.remote_topic_interest),
        pattern_refresh_limit=rl(tr.remote_pattern_interest),
        refresh_pacing=(tr.remote_topic_interest.min_interval_ms / 1000.0,
                        tr.remote_topic_interest.max_interval_ms / 1000.0),
        pattern_refresh_pacing=(tr.remote_pattern_interest.min_interval_ms / 1000.0,
                                tr.remote_pattern_interest.max_interval_ms / 1000.0),
        remote_topic=rc(e.remote_topic), remote_pattern=rc(e.remote_pattern))


def new_portal(e: EndpointConfig, src_id: bytes, now: float) -> PortalTR:
    """The endpoint's topic resolution (source id ``src_id``, created at ``now``)."""
    return PortalTR(PortalTRSettings(
        e.name, e.domain_id, src_id=src_id, mode=e.mode,
        daemons=e.daemons if e.mode == "lbmrd" else (),
        multicast=e.multicast if e.mode == "multicast" else None,
        source_timeout=e.source_timeout, requery_interval=e.requery_interval,
        requery_jitter=0.2, **portal_timing(e)), now=now)


class PortalTask:
    """``await task.open()``, then ``await nursery.start(task.run, core, wake)``
    reports the TR socket's address. Every datagram received goes to
    ``core.tr_datagram`` (the router's :class:`router.core.router_core.RouterCore`),
    and ``wake.set()`` tells the router to act on the core's outputs; :meth:`send`
    queues the core's datagrams for the socket. ``counters``: sends that failed
    (``tr_send_error``)."""

    def __init__(self, endpoint: EndpointConfig) -> None:
        self.endpoint = endpoint
        self.src_id = secrets.token_bytes(8)  # the portal's context instance in its TRD
        self.counters: Counter[str] = Counter()
        self.sock = None
        self._raw: socket.socket | None = None  # the same socket, for calls in batches
        self._outbox: deque[tuple[bytes, tuple[str, int]]] = deque()
        self._ready = trio.Event()

    def send(self, data: bytes, dest: tuple[str, int]) -> None:
        """Queue a datagram of the core's (it produces them paced and bounded)."""
        self._outbox.append((data, dest))
        self._ready.set()

    async def open(self) -> None:
        """Bind the TR socket: joined to the group (multicast), or on the first
        free port of the TR port range (lbmrd)."""
        e = self.endpoint
        if e.mode == "multicast":
            group, port = e.multicast
            self._raw = open_multicast_socket(group, port, 0, e.tr_ip, e.tr_ip, e.multicast_ttl,
                                              buffer=TR_SOCKET_BUFFER)
            self.sock = trio.socket.from_stdlib_socket(self._raw)
            return
        raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock = trio.socket.from_stdlib_socket(raw)  # non-blocking from here on
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):  # bursts of TR traffic (best effort)
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, TR_SOCKET_BUFFER)
            except OSError:
                pass
        ports = range(e.tr_port_low, e.tr_port_high + 1) if e.tr_port_low else [0]
        for i, port in enumerate(ports):
            try:
                await sock.bind((e.tr_ip, port))
                break
            except OSError:
                if i == len(ports) - 1:
                    sock.close()
                    raise
        self.sock, self._raw = sock, raw

    async def run(self, core, wake, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Receive into the core and send the outbox until cancelled (the socket
        must be open)."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._receive, core, wake)
                nursery.start_soon(self._send_loop)
                task_status.started(self.sock.getsockname())
        finally:
            self.sock.close()

    async def _receive(self, core, wake) -> None:
        """Whatever the socket holds, up to ``IO_BATCH`` datagrams a turn, into
        the core (the loop's own cost is paid once a turn, not once a datagram)."""
        while True:
            await trio.lowlevel.wait_readable(self._raw)
            self.receive_ready(core)
            wake.set()

    def receive_ready(self, core) -> int:
        """Up to ``IO_BATCH`` datagrams the socket holds now into the core, without
        waiting; how many. The core's task calls it before the core's timers run,
        so that an answer that came in before a deadline counts before it (one
        that is still unread when a source's deletion delay ends would otherwise
        withdraw a live source whenever both are ready in the same turn)."""
        name, raw = self.endpoint.name, self._raw
        got = 0
        for _ in range(IO_BATCH):
            try:
                data, src = raw.recvfrom(65535)
            except BlockingIOError:
                break
            except OSError as e:  # an ICMP error reported on the socket
                self.counters["tr_recv_error"] += 1
                log.debug("TR receive failed: %s", e)
                continue
            core.tr_datagram(name, data, src, trio.current_time())
            got += 1
        return got

    async def _send_loop(self) -> None:
        """The outbox in order, ``IO_BATCH`` datagrams between checkpoints; a
        full send buffer is waited for (nothing is dropped)."""
        raw = self._raw
        while True:
            await self._ready.wait()
            self._ready = trio.Event()
            sent = 0
            while self._outbox:
                data, dest = self._outbox[0]
                try:
                    raw.sendto(data, dest)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(raw)
                    continue
                except OSError as e:
                    self.counters["tr_send_error"] += 1
                    log.debug("TR send to %s failed: %s", dest, e)
                self._outbox.popleft()
                sent += 1
                if sent % IO_BATCH == 0:
                    await trio.lowlevel.checkpoint()
