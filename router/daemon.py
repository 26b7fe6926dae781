"""The router's I/O shell on trio: one endpoint portal's link (a *portal
link*): the link, the bridge between it and the endpoint's topic resolution,
and the data relay. :mod:`router.multi` runs a router with several portals
as several of these; a lone one runs its endpoint's portal task itself. One
nursery per portal link.

Tasks: the endpoint's portal (:class:`router.portal_task.PortalTask`: its TR
socket and timers, shared by every link of the endpoint), the peer link
(connect or accept, handshake, reader, writer, timers; reconnect every
``reconnect_interval``), one proxy listener per advertised proxy source and
one task per relayed stream (:mod:`router.relay`). The protocol logic is
sans-IO: :class:`router.core.bridge.Bridge` (the link's view of the endpoint's
topic resolution, :class:`router.core.endpoint_portal.PortalView`, joined to the
peer: advert ids, proxies, interest), :class:`router.peerlink.PeerConnection`
(the link) and :class:`router.peerlink.streams.StreamTable` (streams and
credit). The tasks call the bridge directly (its methods never wait) and
carry out what it asks for (:meth:`Router._apply`); the portal task, which
alone ticks the portal, is woken (:meth:`PortalTask.wake`) whenever another
task gave the bridge something to do, and has every link act on its events
(:meth:`Router.portal_changed`).

Times are seconds (trio's clock).
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import ssl
from collections import Counter
from collections.abc import Iterator
from functools import partial

import trio

from lbmr_runtime.events import EventRing
from lbmr_runtime.http import PrometheusText, serve_http

from . import peerlink as P
from .config_model import EndpointConfig, PeerConfig
from .core.bridge import Bridge, Notice, ProxyDown, ProxyUp, SendFrame, StartProxy, StopProxy
from .core.endpoint_portal import PortalView
from .core.tr import RemoteCheck, UseQuery
from .link import CONNECT_TIMEOUT, RAW_LIMIT, Link
from .peerlink import streams as S
from .portal_task import PortalTask
from .relay import PortPool, Relay

log = logging.getLogger("lbmr-router")

_LINK_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
ADVERTISE_CHUNK = 500  # topics of one session advertised at its new proxy before the loop runs again
MAX_HANDSHAKES = 4  # incoming connections in their handshake at once (the oldest is dropped)


def tls_context(tls, server_side: bool) -> ssl.SSLContext:
    """A peer link's TLS context from its :class:`router.config_model.TlsConfig`:
    mutual authentication, our certificate, and the peer's must chain to the CA;
    TLS 1.2 or later, exactly 1.2 when ``cipher_suites`` restricts the suites."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls.certificate, tls.certificate_key, password=tls.certificate_key_password)
    if tls.trusted_certificates:
        ctx.load_verify_locations(tls.trusted_certificates)
    else:
        ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH if server_side else ssl.Purpose.SERVER_AUTH)
    ctx.check_hostname = False  # peers are identified by their certificate chain, not a host name
    ctx.verify_mode = ssl.CERT_REQUIRED
    if tls.cipher_suites:
        # an OpenSSL cipher list chooses among TLS 1.2 suites only (TLS 1.3 has its
        # own fixed set): with one given, the link is TLS 1.2, so the list decides
        ctx.set_ciphers(tls.cipher_suites)
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def set_peer_socket_options(sock, peer: PeerConfig, *, connected: bool) -> None:
    """``<single-tcp>``'s socket options on a peer link's TCP socket (``sock``:
    a stdlib or trio socket): the buffers (0 = the OS default; set before
    connecting or listening, so that the TCP window scale is chosen for them),
    SO_KEEPALIVE and, once ``connected`` (trio's SocketStream turns
    TCP_NODELAY on), TCP_NODELAY as ``<nodelay/>`` says: absent means Nagle's
    algorithm stays on, as in the DRO. Sockets that are not TCP (an
    in-process link's socket pair) are left alone."""
    if sock.family != socket.AF_INET or sock.type != socket.SOCK_STREAM:
        return
    if not connected:
        if peer.receive_buffer:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, peer.receive_buffer)
        if peer.send_buffer:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, peer.send_buffer)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1 if peer.tcp_keepalive else 0)
    if connected:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1 if peer.nodelay else 0)


async def open_peer_stream(peer: PeerConfig) -> trio.SocketStream:
    """The initiator's connection: a TCP socket with the peer's options, bound to
    its ``<interface>`` if it has one, connected to ``address:port``."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        set_peer_socket_options(sock, peer, connected=False)
        if peer.local_ip is not None:
            await sock.bind((peer.local_ip, 0))
        await sock.connect((peer.address, peer.port))
    except BaseException:
        sock.close()
        raise
    stream = trio.SocketStream(sock)
    set_peer_socket_options(sock, peer, connected=True)
    return stream


def portal_timing(e: EndpointConfig) -> dict:
    """The endpoint's ``<topic-resolution>`` timing (with the ``<rate-limit>``s of
    its elements), ``<remote-topic>`` and ``<remote-pattern>`` as
    :class:`router.core.tr.PortalTR` arguments (seconds; rate limits as (bits a
    second, objects a second))."""
    tr = e.topic_resolution

    def uq(u) -> UseQuery:
        return UseQuery(u.timeout_ms / 1000.0, u.max, u.periodic_interval_ms / 1000.0)

    def rc(r) -> RemoteCheck:
        return RemoteCheck(r.check_interval_ms / 1000.0, r.max, r.timeout_ms / 1000.0)

    def rl(timing) -> tuple[float, float]:
        return float(timing.rate_limit.bps), float(timing.rate_limit.objects_per_second)

    ir = tr.initial_request
    return dict(
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


def proxy_bound(configured: int) -> int:
    """At most ``configured`` proxies, and at most a quarter of the descriptors
    the process may open (each proxy is a listener, each receiver a socket on
    both routers): a flood of advertisements cannot exhaust them."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, (soft - 64) // 4))


async def serve_signals(status, stop, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """SIGUSR1 logs ``status()`` as one JSON line ("dump ..."); SIGTERM and SIGINT
    ``await stop()`` (a graceful end of the links, then the router's nursery)."""
    with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGTERM, signal.SIGINT) as sigs:
        task_status.started()
        async for sig in sigs:
            if sig == signal.SIGUSR1:
                log.info("dump %s", json.dumps(status()))
            else:
                log.info("stopping (%s)", signal.Signals(sig).name)
                await stop()


class Router:
    """One router: ``await router.run(task_status=...)`` in a nursery; reports
    {"tr": (ip, port), "peer": (ip, port) or None} through ``task_status``.

    ``name``: the router's name; ``endpoint`` and ``peer``: the portals'
    settings (:class:`router.config_model.EndpointConfig`, ``PeerConfig``);
    ``stream``: for an in-process link, the connected stream it runs on (the
    peer's ``role`` then only picks the side of the handshake); ``metrics``:
    ``(address, port)`` of the HTTP endpoint or None; ``handle_signals``:
    SIGUSR1 dump, SIGTERM/SIGINT stop (the command line turns it on).
    """

    def __init__(self, name: str, endpoint: EndpointConfig, peer: PeerConfig, *,
                 stream: trio.abc.Stream | None = None, metrics: tuple[str, int] | None = None,
                 handle_signals: bool = False, port_pool: PortPool | None = None,
                 advert_ids: Iterator[int] | None = None, domains: tuple[int, ...] | None = None,
                 hub=None, portal: PortalTask | None = None) -> None:
        self.name, self.endpoint, self.peer = name, endpoint, peer
        self.stream, self.metrics, self.handle_signals = stream, metrics, handle_signals
        self.tls = None if peer.tls is None else tls_context(peer.tls, server_side=(peer.role == "acceptor"))
        e = endpoint
        # the endpoint portal's task (its TR socket and topic resolution), shared with
        # the endpoint's other links; None: this router runs one of its own
        self.portal = portal
        self._own_portal = portal is None
        self.tr: PortalView | None = None
        self.bridge: Bridge | None = None
        self.link: Link | None = None
        self.counters: Counter[str] = Counter()
        self.events = EventRing(1000)
        self._proxy_scopes: dict[int, trio.CancelScope] = {}  # proxy listeners, by proxy id
        self._handshakes: dict[trio.CancelScope, Link | None] = {}  # incoming links not yet connected
        # hub: the router's multi-hop routing (router.multi.MultiRouter) for a unit on a
        # peer link; None = one hop (a lone portal link, or a link between two endpoints)
        self.hub = hub
        caps = P.DEFAULT_CAPABILITIES | (P.Capability.ROUTING if hub is not None else 0)
        self.identity = P.RouterIdentity(name, domains or (e.domain_id,), capabilities=int(caps))
        self._advert_ids = advert_ids
        # several endpoints on one peer link: the link is run by one Router (the
        # owner), the others are attached to it and get its frames and link events
        self.owner: Router | None = None
        self.attached: list[Router] = []
        self.relay = Relay(e, self.counters, self.event, lambda: self.link, self._advert_source,
                           self._session_ended)
        if port_pool is not None:  # relay ports shared with the other links of this endpoint
            self.relay.share_ports(port_pool)
        self._nursery: trio.Nursery | None = None
        # the router's policy on a peer's handshake: PeerInfo -> (ok, reason), or None
        self.accept_peer = None

    def event(self, kind: str, detail: str) -> None:
        self.events.add(trio.current_time(), kind, detail)
        log.info("%s %s", kind, detail)

    def _session_ended(self, advert_id: int) -> None:
        """A source of ours ended a relayed session or refused one (UM's end of
        session). The portal queries the topics of its transport session at
        once (once for all the streams of the session); if no TIR of a source
        arrives within the source-deletion delay, it is withdrawn (the DRO
        deletes a proxy source that long after the end of session)."""
        if self._nursery is None:
            return
        now = trio.current_time()
        name = self.bridge.session_ended(advert_id, now)
        if name is None:
            return
        self.counters["sessions_ended"] += 1
        self._apply()
        self._nursery.start_soon(self._withdraw_if_silent, name, now)

    async def _withdraw_if_silent(self, name: tuple[int, int], since: float) -> None:
        await trio.sleep(self.endpoint.source_deletion_delay)
        if self.bridge.source_ended(name, since, trio.current_time()):
            self.counters["sources_ended"] += 1
            self._apply()

    def _advert_source(self, advert_id: int):
        """Where a stream the peer opens for our advert ``advert_id`` connects: a
        source of our TRD, or (multi-hop) one of our proxies."""
        body = self.bridge.advert_source(advert_id) if self.bridge is not None else None
        if body is None and self.hub is not None:
            body = self.hub.transit_source(self, advert_id)
        return body

    # ------------------------------------------------------------------ run

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        e = self.endpoint
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self._own_portal:
                self.portal = PortalTask(e, portal_timing(e), self.counters)
                await nursery.start(self.portal.run)
            self.tr_sock = self.portal.sock
            self.tr = self.portal.view(self.peer.name)
            self.bridge = Bridge(self.tr, self.counters, max_proxies=proxy_bound(e.max_proxies),
                                 require_interest=True, advert_ids=self._advert_ids,
                                 acl=e.acl.named(e.name), link_acl=self.peer.acl.named(self.peer.name),
                                 count_link_acl=self.owner is None)  # frames of a shared link: counted once
            if self.hub is not None:
                self.hub.attach_bridge(self)
            self.portal.serve(self)
            peer_addr = await nursery.start(self._peer_loop)
            metrics_addr = None
            if self.metrics is not None:
                routes = {"/metrics": ("text/plain; version=0.0.4", self.prometheus_text),
                          "/status": ("application/json", lambda: json.dumps(self.status()))}
                metrics_addr = await nursery.start(partial(serve_http, logger=log), routes, self.metrics)
            if self.handle_signals:
                await nursery.start(self._signal_loop)
            task_status.started({"tr": self.tr_sock.getsockname(), "peer": peer_addr, "metrics": metrics_addr})
            await trio.sleep_forever()  # proxies and streams start here while the router runs

    # ------------------------------------------------------------- the bridge

    def _apply(self, *, wake: bool = True) -> None:
        """Carry out what the bridge asked for, then (``wake``: from a task other
        than the portal's) wake the portal task: the bridge may have new timers
        or datagrams."""
        for out in self.bridge.outputs():
            if isinstance(out, SendFrame):
                link = self.link
                if link is not None and link.connected:
                    link.put(out.frame)
            elif isinstance(out, StartProxy):
                scope = trio.CancelScope()
                self._proxy_scopes[out.advert.advert_id] = scope
                self._nursery.start_soon(self._proxy, out.advert, scope)
            elif isinstance(out, StopProxy):
                scope = self._proxy_scopes.pop(out.proxy_id, None)
                if scope is not None:
                    scope.cancel()
            elif isinstance(out, ProxyUp):
                if self.hub is not None:
                    self.hub.proxy_up(self, out.advert, out.body)
            elif isinstance(out, ProxyDown):
                if self.hub is not None:
                    self.hub.proxy_down(self, out.advert_id)
            elif isinstance(out, Notice):
                self.event(out.kind, out.detail)
        if wake:
            self.portal.wake()

    def portal_changed(self) -> None:
        """The endpoint's portal ran (a datagram, its timers, another link's
        call): act on this link's events (:class:`router.portal_task.PortalTask`)."""
        if self.bridge is not None:
            self.bridge.drain_portal()
            self._apply(wake=False)

    # -------------------------------------------------- near side: proxies

    async def _proxy(self, f: P.Advertisement, scope: trio.CancelScope) -> None:
        """A proxy for the transport session of the peer's advertisement ``f``
        (proxy id: ``f``'s advert id): its listener (:meth:`Relay.serve_proxy`)
        reports its address, where the bridge then advertises every topic of
        the session in our TRD. A stream of a receiver names a live
        advertisement of the session (:meth:`Bridge.proxy_advert`)."""
        pid = f.advert_id
        with scope:
            async with trio.open_nursery() as n:
                addr = await n.start(self.relay.serve_proxy, f, partial(self.bridge.proxy_advert, pid))
                if addr is None:
                    return
                body = self.relay.proxy_transport(f, addr)
                if self.bridge.proxy_listening(pid, addr, trio.current_time(), body, limit=ADVERTISE_CHUNK):
                    self.event("proxy_added", f"{f.topic} advert {pid} at {addr[0]}:{addr[1]}")
                self._apply()
                # a session of many topics: a chunk at a time, the other tasks running between
                while self.bridge.advertise_pending(pid, trio.current_time(), ADVERTISE_CHUNK):
                    self._apply()
                    await trio.sleep(0)
                self._apply()

    # ---------------------------------------------------------------- peer

    async def _peer_loop(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        p = self.peer
        if self.owner is not None:  # the owner runs the link
            link = self.owner.link
            if self.link is None and link is not None and link.up.is_set() and not link.closed:
                # it came up before this unit started (its Connected found no bridge here)
                self.link = link
                self.bridge.link_up(trio.current_time())
                self._apply()
            task_status.started(None)
            return
        if self.stream is not None:  # an in-process link: runs once, for the router's life
            task_status.started(None)
            await self._run_link(self.stream, p.role)
            return
        if p.role == "acceptor":
            listeners = await trio.open_tcp_listeners(p.port, host=p.listen_ip)
            for lst in listeners:  # accepted sockets inherit the buffers
                set_peer_socket_options(lst.socket, p, connected=False)
            bound = listeners[0].socket.getsockname()
            task_status.started(bound)
            log.info("peer %s: accepting on %s:%d", p.name, *bound)
            async with trio.open_nursery() as n:
                await trio.serve_listeners(self._accepted, listeners, handler_nursery=n)
        else:
            task_status.started(None)
            while True:
                try:
                    with trio.fail_after(CONNECT_TIMEOUT):
                        stream = await open_peer_stream(p)
                except (OSError, trio.TooSlowError) as e:
                    self.counters["peer_connect_failed"] += 1
                    log.info("peer %s: connect to %s:%d failed: %s", p.name, p.address, p.port, e)
                else:
                    await self._run_link(stream, "initiator")
                await trio.sleep(p.reconnect_interval)

    async def _accepted(self, stream) -> None:
        """An incoming connection. Refused at once while a link is connected;
        otherwise it runs its handshake beside any others (an unauthenticated
        connection never holds the slot: the first to complete the handshake
        wins, and beyond MAX_HANDSHAKES the oldest attempt is dropped)."""
        if self.link is not None and not self.link.closed:
            self.counters["peer_refused_busy"] += 1
            await stream.aclose()
            return
        set_peer_socket_options(stream.socket, self.peer, connected=False)  # buffers, if not inherited
        set_peer_socket_options(stream.socket, self.peer, connected=True)
        if len(self._handshakes) >= MAX_HANDSHAKES:
            self.counters["handshakes_dropped"] += 1
            next(iter(self._handshakes)).cancel()
        scope = trio.CancelScope()
        self._handshakes[scope] = None
        try:
            with scope:
                await self._run_link(stream, "acceptor", scope)
        finally:
            self._handshakes.pop(scope, None)
            if scope.cancelled_caught:
                await trio.aclose_forcefully(stream)

    async def _run_link(self, stream, role: str, handshake: trio.CancelScope | None = None) -> None:
        p = self.peer
        if self.tls is not None:
            stream = trio.SSLStream(stream, self.tls, server_side=(role == "acceptor"))
            try:
                with trio.fail_after(CONNECT_TIMEOUT):
                    await stream.do_handshake()
            except (trio.BrokenResourceError, trio.TooSlowError, ssl.SSLError, OSError) as e:
                self.counters["tls_failed"] += 1
                cause = e.__cause__ or e.__context__ or e
                self.event("tls_failed", f"peer {p.name}: {type(cause).__name__}: {cause}")
                await trio.aclose_forcefully(stream)
                return
        conn = P.PeerConnection(role, self.identity, accept=self.accept_peer,
                                keepalive_interval=p.keepalive_interval, keepalive_idle=p.keepalive.idle,
                                dead_after=p.dead_after, handshake_timeout=CONNECT_TIMEOUT)
        link = Link(conn, stream, peer_name=p.name, max_queue=p.max_queue)
        link.handshake = handshake
        if handshake is None:
            self.link = link  # the initiator's one link
        try:
            async with trio.open_nursery() as n:
                link.nursery = n
                link.push_raw(conn.start(trio.current_time()))
                n.start_soon(link.writer)
                n.start_soon(self._link_timer, link, n.cancel_scope)
                await self._link_reader(link, n.cancel_scope)
        except BaseExceptionGroup as eg:  # trio groups the link tasks' errors
            _, rest = eg.split(_LINK_ERRORS)
            if rest is not None:
                raise rest from None
            self.event("peer_down", f"{p.name}: link lost: {eg.exceptions[0]}")
        except _LINK_ERRORS as e:
            self.event("peer_down", f"{p.name}: link lost: {e}")
        finally:
            self._link_down(link)
            await trio.aclose_forcefully(stream)

    async def _link_timer(self, link: Link, scope: trio.CancelScope) -> None:
        while True:
            await trio.sleep_until(link.conn.next_deadline())
            data, events = link.conn.tick(trio.current_time())
            link.push_raw(data)
            if self._link_events(link, events):
                await link.finish(scope)
                return

    async def _link_reader(self, link: Link, scope: trio.CancelScope) -> None:
        while True:
            if len(link.raw) > RAW_LIMIT:
                # what the connection answers (keepalive acks, ...) is not being written:
                # the peer sends but does not read. Read no more until it is; close the
                # link if that takes the keepalive timeout.
                with trio.move_on_after(self.peer.dead_after):
                    while len(link.raw) > RAW_LIMIT:
                        await link.raw_taken.wait()
                if len(link.raw) > RAW_LIMIT:
                    self.counters["peer_not_reading"] += 1
                    self.event("peer_down", f"{self.peer.name}: the peer does not read "
                               f"({len(link.raw)} bytes of answers unsent)")
                    link.closed = True
                    scope.cancel()
                    return
            items, eof = await link.receive()
            link.push_raw(link.conn.data_to_send())
            if self._link_events(link, items) or eof or link.closed:
                await link.finish(scope)
                return

    def _link_events(self, link: Link, items: list) -> bool:
        """Handle connection events and frames; True when the link is finished."""
        if items and self.hub is not None and link is self.link:
            self.hub.heard(self)
        for it in items:
            if isinstance(it, P.Connected):
                if link.handshake is not None:  # an incoming link: the first to get here wins
                    if self.link is not None and self.link is not link and not self.link.closed:
                        self.counters["peer_refused_busy"] += 1
                        return True
                    self._handshakes.pop(link.handshake, None)
                    link.handshake = None
                    self.link = link
                self.event("peer_up", f"{self.peer.name} <-> {it.peer.name} domains {it.peer.domains}")
                self.counters["peer_connects"] += 1
                link.up.set()
                link.wake_writer.set()
                if self.hub is not None:
                    self.hub.link_up(self, it.peer, it.capabilities)
                self.bridge.link_up(trio.current_time())
                self._apply()
                for u in self.attached:
                    if u.bridge is None:
                        continue  # not started yet: it joins the link when it starts
                    u.link = link
                    u.bridge.link_up(trio.current_time())
                    u._apply()
            elif isinstance(it, P.Terminated):
                self.event("peer_down", f"{self.peer.name}: {type(it).__name__} {it}")
                return True
            elif isinstance(it, P.DisconnectRequested):
                link.put(P.DisconnectResponse())
            elif isinstance(it, P.Interest | P.Advertisement):
                for u in (self, *self.attached):
                    if u.bridge is not None:
                        u.bridge.peer_frame(it, trio.current_time())
                        u._apply()
                if self.hub is not None and isinstance(it, P.Interest):
                    self.hub.interest(self, it)
            elif isinstance(it, P.Topology):
                if self.hub is not None:
                    self.hub.topology(self, it)
            elif isinstance(it, S.STREAM_FRAMES):
                for sev in link.streams.receive(it):
                    self._relay_for(sev).stream_event(link, sev)
                link.flush_streams()
        return False

    def _link_down(self, link: Link) -> None:
        link.down()
        if self.link is not link:
            return  # an incoming connection that never became the link
        for u in (self, *self.attached):
            u.link = None
            if u.bridge is not None:
                u.bridge.link_down(trio.current_time())
                u._apply()
        if self.hub is not None:
            self.hub.link_down(self)

    def _relay_for(self, ev):
        """The relay of the endpoint whose advertisement a stream the peer opens
        is for (several endpoints on one link); ours for every other event (they
        only touch the link's stream states)."""
        if isinstance(ev, S.StreamOpened):
            for u in self.attached:
                if u.bridge is not None and u.bridge.advert_source(ev.advert_id) is not None:
                    return u.relay
        return self.relay

    # --------------------------------------------------------------- status

    async def _signal_loop(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await serve_signals(self.status, self._stop, task_status=task_status)

    async def _stop(self) -> None:
        await self.disconnect("shutting down")
        self._nursery.cancel_scope.cancel()

    async def disconnect(self, reason: str, timeout: float = 2.0) -> None:
        """Graceful disconnect of the peer link (request, response, ok), bounded in time."""
        link = self.link
        if self.owner is not None or link is None or link.conn.state is not P.State.CONNECTED:
            return
        link.put(P.DisconnectRequest(reason))
        with trio.move_on_after(timeout):
            while self.link is link:
                await trio.sleep(0.02)

    def prometheus_text(self) -> str:
        link = self.link
        up = 1 if link is not None and link.conn.state is P.State.CONNECTED else 0
        p = PrometheusText()
        p.metric("lbmr_router_peer_up", "gauge", up, "1 while the peer link is connected.")
        p.metric("lbmr_router_proxies", "gauge", len(self.bridge.proxy_addresses()) if self.bridge else 0)
        p.metric("lbmr_router_proxy_listeners", "gauge", self.bridge.proxy_listeners() if self.bridge else 0,
                 "Proxy listeners (one per transport session of the peer's sources).")
        p.metric("lbmr_router_adverts", "gauge", len(self.bridge.advert_sources()) if self.bridge else 0)
        p.metric("lbmr_router_streams", "gauge", len(link.state) if link else 0)
        p.by_label("lbmr_router_events_total", "counter", "kind", self.counters, "Router events, by kind.")
        if self.tr is not None:
            p.by_label("lbmr_router_portal_total", "counter", "what", self.tr.stats())
        if link is not None:
            p.metric("lbmr_router_peer_dropped_datagrams_total", "counter", link.outq.dropped_datagrams)
        return p.text()

    def status(self) -> dict:
        link = self.link
        now = trio.current_time()
        proxy_addr = self.bridge.proxy_addresses() if self.bridge else {}
        adverts = self.bridge.advert_sources() if self.bridge else {}
        return {
            "name": self.name,
            "portal": {"name": self.endpoint.name, "domain_id": self.endpoint.domain_id,
                       "stats": self.tr.stats() if self.tr else {},
                       "local_interest": [li.topic for li in self.tr.local_interests()] if self.tr else [],
                       "remote_interest": [t for t, _ in self.tr.remote_interests()] if self.tr else []},
            "peer": {"name": self.peer.name, "state": link.conn.state.value if link else "down",
                     "peer": link.conn.peer.name if link and link.conn.peer else None,
                     "rtt_last": link.conn.rtt.last if link else None,
                     "queued_frames": len(link.outq) if link else 0,
                     "dropped_datagrams": link.outq.dropped_datagrams if link else 0},
            "proxies": {str(a): f"{ip}:{port}" for a, (ip, port) in proxy_addr.items()},
            "adverts": {str(a): f"{getattr(b, 'ip', '?')}:{getattr(b, 'port', '?')}"
                        for a, b in adverts.items()},
            "streams": len(link.state) if link else 0,
            "counters": dict(self.counters),
            "events": self.events.dump(now),
        }
