"""One link of the router on trio: a peer link (connect or accept, TLS,
handshake, reader, writer and timers; reconnect every ``reconnect_interval``)
or one side of a pair of endpoints (:class:`router.shell.pair_link.PairLink`: the
stream frames of the pair's relayed sessions, in memory).

The link's control frames and events go to the router's core
(:class:`router.core.router_core.RouterCore`: link up, frames, link down),
followed by a wake-up of the task that acts on its outputs; its stream frames
go to the data relay of the endpoint they are for (:class:`router.relays.endpoint_relay.Relay`).
Times are seconds (trio's clock).
"""

from __future__ import annotations

import logging
import socket
import ssl
from functools import partial

import trio

from .. import peerlink as P
from ..config.model import PeerConfig
from ..core.router_core import LinkSpec, RouterCore
from ..link import CONNECT_TIMEOUT, RAW_LIMIT, Link
from ..peerlink import streams as S
from .pair_link import PairLink
from .wake import Wake

__all__ = ["LinkTask", "tls_context", "set_peer_socket_options", "open_peer_stream", "MAX_HANDSHAKES"]

log = logging.getLogger("lbmr-router")

_LINK_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
MAX_HANDSHAKES = 4  # incoming connections in their handshake at once (the oldest is dropped)


def tls_context(tls, server_side: bool) -> ssl.SSLContext:
    """A peer link's TLS context from its :class:`router.config.model.TlsConfig`:
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
    algorithm stays on, as in the DRO. Sockets that are not TCP are left alone."""
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


class LinkTask:
    """``await nursery.start(task.run)`` reports the acceptor's bound address (or
    None). ``spec``: the link (:class:`LinkSpec`); ``peer``: its peer portal's
    settings; ``identity``: what the handshake tells the peer; ``core`` and
    ``wake``: where its frames go; ``relays``: endpoint name -> that endpoint's
    :class:`router.relays.endpoint_relay.Relay` on this link; ``counters`` and ``event(kind,
    detail)``: the link's counters and event log; ``pair``: this side of an
    endpoint pair (None for a peer link); ``uim``: the router's UIM data path
    (:class:`router.relays.uim.UimRelay`), where the UIM_ROUTED streams the
    peer opens go (None: they are refused as an unsupported kind)."""

    def __init__(self, spec: LinkSpec, peer: PeerConfig, identity: P.RouterIdentity, core: RouterCore,
                 wake: Wake, relays: dict, counters, event, *, pair: PairLink | None = None,
                 uim=None) -> None:
        self.spec, self.peer, self.identity = spec, peer, identity
        self.core, self.wake, self.relays = core, wake, relays
        self.counters, self.event = counters, event
        self.pair = pair
        self.uim = uim
        self.tls = None if peer.tls is None else tls_context(peer.tls, server_side=(peer.role == "acceptor"))
        self.link: Link | PairLink | None = None
        self._handshakes: dict[trio.CancelScope, Link | None] = {}  # incoming links not yet connected

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        p = self.peer
        if self.pair is not None:  # a side of an endpoint pair: runs once, for the router's life
            task_status.started(None)
            await self._run_pair(self.pair)
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
        conn = P.PeerConnection(role, self.identity, accept=partial(self.core.accept_peer, self.spec.id),
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

    async def _run_pair(self, link: PairLink) -> None:
        """The other side's stream frames to this side's stream table and relays."""
        self.link = link
        try:
            async with trio.open_nursery() as n:
                link.nursery = n
                while not link.ended:
                    self._link_events(link, await link.receive())
        finally:
            link.down()

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
        core, lid = self.core, self.spec.id
        if items and link is self.link:
            core.link_heard(lid, trio.current_time())
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
                link.negotiated(it.capabilities)  # (stream kinds, frame size)
                core.link_up(lid, it.peer, it.capabilities, trio.current_time())
                self.wake.set()
            elif isinstance(it, P.Terminated):
                self.event("peer_down", f"{self.peer.name}: {type(it).__name__} {it}")
                return True
            elif isinstance(it, P.DisconnectRequested):
                link.put(P.DisconnectResponse())
            elif isinstance(it, P.Interest | P.Advertisement | P.Topology):
                core.link_frame(lid, it, trio.current_time())
                self.wake.set()
            elif isinstance(it, S.STREAM_FRAMES):
                for sev in link.streams.receive(it):
                    if isinstance(sev, S.StreamOpened) and sev.kind == P.StreamKind.UIM_ROUTED \
                            and self.uim is not None:
                        self.uim.open_far(link, sev, core.routing.peer_of(self.spec.name))
                        continue
                    self._relay_for(sev).stream_event(link, sev)
                link.flush_streams()
        return False

    def _link_down(self, link: Link) -> None:
        link.down()
        if self.link is not link:
            return  # an incoming connection that never became the link
        self.link = None
        self.core.link_down(self.spec.id, trio.current_time())
        self.wake.set()

    def _relay_for(self, ev):
        """The relay of the endpoint whose advertisement a stream the peer opens
        is for; the link's first endpoint's for every other event (they only
        touch the link's stream states)."""
        if isinstance(ev, S.StreamOpened):
            return self.relays[self.core.advert_endpoint(self.spec.id, ev.advert_id)]
        return self.relays[self.spec.endpoints[0]]

    async def disconnect(self, reason: str, timeout: float = 2.0) -> None:
        """Graceful disconnect of the link (request, response, ok), bounded in time;
        a side of an endpoint pair ends with the router."""
        link = self.link
        if self.pair is not None or link is None or link.conn.state is not P.State.CONNECTED:
            return
        link.put(P.DisconnectRequest(reason))
        with trio.move_on_after(timeout):
            while self.link is link:
                await trio.sleep(0.02)

    def status(self) -> dict:
        """The link's state (the ``peer`` part of a portal link's status)."""
        if self.pair is not None:
            return self.pair.status()
        link = self.link
        return {"name": self.peer.name, "state": link.conn.state.value if link else "down",
                "peer": link.conn.peer.name if link and link.conn.peer else None,
                "rtt_last": link.conn.rtt.last if link else None,
                "queued_frames": len(link.outq) if link else 0,
                "dropped_datagrams": link.outq.dropped_datagrams if link else 0}
