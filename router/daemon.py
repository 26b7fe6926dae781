"""The router's I/O shell on trio: one endpoint portal, one peer link, and
the data relay between them. One nursery per router.

Tasks: the portal (its TR socket and timers; it processes its events
serially and talks to the peer side through bounded memory channels), the
peer link (connect or accept, handshake, reader, writer, timers; reconnect
every ``reconnect_interval``), proxy listeners on the near side (one per
advertised proxy source) and one task per relayed stream. The protocol
logic is sans-IO: :class:`router.tr.PortalTR` (topic resolution),
:class:`router.peerlink.PeerConnection` (the link) and
:class:`router.peerlink.streams.StreamTable` (streams and credit).

Times are seconds (trio's clock).
"""

from __future__ import annotations

import json
import logging
import secrets
import signal
import socket
import ssl
from collections import Counter, deque
from dataclasses import dataclass, field

import trio

from . import peerlink as P
from .peerlink import streams as S
from .tr import (
    LocalInterest,
    LocalInterestGone,
    PortalTR,
    ProxySource,
    SourceGone,
    SourceSeen,
    relay_transport,
)

log = logging.getLogger("lbmr-router")

_LINK_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
CONNECT_TIMEOUT = 5.0  # seconds to connect to a real source (far side) or to the peer
FLUSH_TIMEOUT = 1.0  # seconds to write a link's last frames (e.g. DISCONNECT_OK) before closing
# Per-stream flow control: how many bytes a peer may send on one stream before
# credit comes back (also the most a stream buffers here), and the largest
# STREAM_DATA frame. bench/router.py: 256 KiB/64 KiB gave ~350 MB/s through two
# routers on loopback, 4 MiB/256 KiB ~760 MB/s.
STREAM_WINDOW = 4 << 20
STREAM_FRAME = 256 << 10
READ_SIZE = 256 << 10
PORTAL_QUEUE = 1000  # commands queued from the peer side to the portal
RU_BACKLOG = 64  # datagrams held per LBT-RU stream until the far side accepts


@dataclass
class EndpointSettings:
    """One endpoint portal: its TRD's topic resolution and where proxies listen."""

    name: str
    domain_id: int
    mode: str = "lbmrd"  # or "multicast"
    daemons: list[tuple[str, int]] = field(default_factory=list)
    multicast: tuple[str, int] | None = None
    multicast_ttl: int = 16  # UM's resolver_multicast_ttl default
    tr_ip: str = "127.0.0.1"  # the portal's own TR socket: this address ...
    tr_port_low: int = 0  # ... and the first free port of this range (0, 0 = any)
    tr_port_high: int = 0
    relay_ip: str = "127.0.0.1"  # proxy listeners: this address ...
    relay_port_low: int = 0  # ... and ports in this range (0, 0 = any free port)
    relay_port_high: int = 0
    source_timeout: float = 16.0
    requery_interval: float = 5.0


@dataclass
class PeerSettings:
    """The one peer link: ``role`` "initiator" (connects to address:port) or
    "acceptor" (listens on listen_ip:port)."""

    name: str
    role: str
    address: str = "127.0.0.1"
    port: int = 0
    listen_ip: str = "127.0.0.1"
    reconnect_interval: float = 5.0
    keepalive_interval: float = 5.0
    dead_after: float = 15.0
    tls: ssl.SSLContext | None = None
    max_queue: int = 8 << 20


@dataclass
class RouterSettings:
    name: str
    endpoint: EndpointSettings
    peer: PeerSettings
    metrics: tuple[str, int] | None = None
    handle_signals: bool = False  # SIGUSR1 dump, SIGTERM/SIGINT stop; the command line turns it on


# ------------------------------------------------------------------- relay streams


class _StreamState:
    """The I/O side of one relayed stream (either end of the link)."""

    def __init__(self, sid: int, kind: int) -> None:
        self.sid = sid
        self.kind = kind
        self.accepted = trio.Event()
        self.refused: str | None = None
        self.credit = trio.Event()  # set when credit may have become available
        self.incoming: deque[bytes] = deque()  # data or datagrams from the peer
        self.incoming_ready = trio.Event()
        self.closed = False
        self.sock = None  # trio SocketStream (TCP) or UDP socket (far LBT-RU)
        self.ru_addr: tuple[str, int] | None = None  # near LBT-RU: the receiver

    def wake(self) -> None:
        self.incoming_ready.set()
        self.credit.set()


class Link:
    """One connected peer link: the connection, its streams and its writer."""

    def __init__(self, router: Router, conn: P.PeerConnection, stream) -> None:
        self.router = router
        self.conn = conn
        self.stream = stream
        self.streams = S.StreamTable(conn.role, initial_window=STREAM_WINDOW, max_frame=STREAM_FRAME)
        self.outq = P.OutQueue(max_data_bytes=router.s.peer.max_queue)
        self.raw = bytearray()  # bytes the connection produced (handshake, acks)
        self.wake_writer = trio.Event()
        self.state: dict[int, _StreamState] = {}
        self.up = trio.Event()
        self.closed = False
        self.closing = False  # finished: the writer flushes what the connection produced, then stops
        self.writer_done = trio.Event()
        self.nursery: trio.Nursery | None = None  # stream tasks of this link die with it

    def put(self, frame: P.Frame) -> bool:
        try:
            ok = self.outq.put(frame)
        except P.OutQueueOverflow as e:
            log.error("peer %s: %s; closing the link", self.router.s.peer.name, e)
            self.closed = True
            ok = False
        self.wake_writer.set()
        return ok

    def flush_streams(self) -> None:
        for f in self.streams.frames_to_send():
            self.put(f)

    def push_raw(self, data: bytes) -> None:
        if data:
            self.raw += data
            self.wake_writer.set()

    async def finish(self, scope: trio.CancelScope) -> None:
        """End the link: let the writer flush the connection's last bytes, then cancel."""
        self.closing = True
        self.wake_writer.set()
        with trio.move_on_after(FLUSH_TIMEOUT):
            await self.writer_done.wait()
        scope.cancel()

    async def writer(self) -> None:
        while not self.closed:
            if self.closing and not self.raw:
                self.writer_done.set()
                return
            await self.wake_writer.wait()
            self.wake_writer = trio.Event()
            now = trio.current_time()
            out = bytes(self.raw)
            self.raw.clear()
            if self.conn.state is P.State.CONNECTED or self.conn.state is P.State.DISCONNECTING:
                parts = [out]
                for f in self.outq.pop_batch(1 << 20):
                    if self.conn.can_send(f):
                        parts.append(self.conn.send(f, now))
                out = b"".join(parts)
                if self.outq:
                    self.wake_writer.set()
            if out:
                await self.stream.send_all(out)
                for st in self.state.values():
                    st.credit.set()  # queue space freed: writers may retry


class Router:
    """One router: ``await router.run(task_status=...)`` in a nursery; reports
    {"tr": (ip, port), "peer": (ip, port) or None} through ``task_status``."""

    def __init__(self, settings: RouterSettings) -> None:
        self.s = settings
        e = settings.endpoint
        self.src_id = secrets.token_bytes(8)
        self.tr: PortalTR | None = None
        self.link: Link | None = None
        self.counters: Counter[str] = Counter()
        self.events: deque[tuple[float, str, str]] = deque(maxlen=1000)
        # far side: advertisements we sent -> the real source
        self._next_advert = 1
        self._adverts: dict[tuple[str, bytes], int] = {}  # (topic, otid) -> advert id
        self._advert_source: dict[int, object] = {}  # advert id -> transport body
        # near side: proxies we advertise -> their listeners
        self._proxies: dict[int, trio.CancelScope] = {}
        self._proxy_addr: dict[int, tuple[str, int]] = {}
        self.identity = P.RouterIdentity(settings.name, (e.domain_id,))
        self._to_portal_send, self._to_portal_recv = trio.open_memory_channel(PORTAL_QUEUE)
        self._portal_wake = trio.Event()
        self._nursery: trio.Nursery | None = None

    def event(self, kind: str, detail: str) -> None:
        self.events.append((trio.current_time(), kind, detail))
        log.info("%s %s", kind, detail)

    # ------------------------------------------------------------------ run

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        e = self.s.endpoint
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
        if e.mode == "multicast":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            group, port = e.multicast
            await sock.bind(("", port))
            mreq = socket.inet_aton(group) + socket.inet_aton(e.tr_ip)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(e.tr_ip))
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, e.multicast_ttl)
        else:
            ports = range(e.tr_port_low, e.tr_port_high + 1) if e.tr_port_low else [0]
            for i, port in enumerate(ports):
                try:
                    await sock.bind((e.tr_ip, port))
                    break
                except OSError:
                    if i == len(ports) - 1:
                        sock.close()
                        raise
        self.tr_sock = sock
        now = trio.current_time()
        self.tr = PortalTR(e.name, e.domain_id, src_id=self.src_id, mode=e.mode,
                           daemons=e.daemons if e.mode == "lbmrd" else (),
                           multicast=e.multicast if e.mode == "multicast" else None,
                           source_timeout=e.source_timeout, requery_interval=e.requery_interval, now=now)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._portal_rx)
                nursery.start_soon(self._portal_loop)
                peer_addr = await nursery.start(self._peer_loop)
                metrics_addr = None
                if self.s.metrics is not None:
                    from lbmrd.metrics import serve_http

                    routes = {"/metrics": ("text/plain; version=0.0.4", self.prometheus_text),
                              "/status": ("application/json", lambda: json.dumps(self.status()))}
                    metrics_addr = await nursery.start(serve_http, routes, self.s.metrics)
                if self.s.handle_signals:
                    await nursery.start(self._signal_loop)
                task_status.started({"tr": sock.getsockname(), "peer": peer_addr, "metrics": metrics_addr})
        finally:
            sock.close()

    # --------------------------------------------------------------- portal

    async def _portal_rx(self) -> None:
        """TR datagrams from the TRD (or lbmrd) into the portal's queue."""
        while True:
            data, src = await self.tr_sock.recvfrom(65535)
            try:
                self._to_portal_send.send_nowait(("dgram", data, src))
            except trio.WouldBlock:
                self.counters["portal_queue_full"] += 1

    async def _portal_loop(self) -> None:
        """The portal: all its TR events, serially."""
        tr = self.tr
        recv = self._to_portal_recv
        while True:
            now = trio.current_time()
            for data, dest in tr.tick(now):
                try:
                    await self.tr_sock.sendto(data, dest)
                except OSError as e:
                    self.counters["tr_send_error"] += 1
                    log.debug("TR send to %s failed: %s", dest, e)
            self._portal_events(tr.events())
            with trio.move_on_at(tr.next_deadline()):
                cmd = await recv.receive()
                self._portal_command(cmd, trio.current_time())

    def _portal_command(self, cmd: tuple, now: float) -> None:
        tr = self.tr
        kind = cmd[0]
        if kind == "dgram":
            tr.on_datagram(cmd[1], cmd[2], now)
        elif kind == "interest":
            f: P.Interest = cmd[1]
            try:
                if f.action == P.InterestAction.CANCEL:
                    tr.cancel_remote_interest(f.topic, now, pattern_type=int(f.pattern_type))
                else:
                    tr.add_remote_interest(f.topic, now, pattern_type=int(f.pattern_type))
            except ValueError as e:
                self.counters["bad_interest"] += 1
                log.warning("interest %r from the peer ignored: %s", f.topic, e)
        elif kind == "proxy":
            tr.add_proxy(cmd[1], now)
        elif kind == "unproxy":
            tr.remove_proxy(cmd[1], now)
        elif kind == "link_up":
            for li in tr.local_interests():
                self._send_interest(li, P.InterestAction.ADD)
        elif kind == "link_down":
            for topic, ptype in tr.remote_interests():
                tr.cancel_remote_interest(topic, now, pattern_type=ptype)
            for p in tr.proxies():
                tr.remove_proxy(p.advert_id, now)

    def _send_interest(self, li, action) -> None:
        link = self.link
        if link is None or link.conn.state is not P.State.CONNECTED:
            return
        link.put(P.Interest(action, li.topic, self.s.endpoint.domain_id, P.PatternType(li.pattern_type)))

    def _portal_events(self, events: list) -> None:
        for ev in events:
            if isinstance(ev, LocalInterest):
                self.counters["local_interest"] += 1
                self._send_interest(ev, P.InterestAction.ADD)
            elif isinstance(ev, LocalInterestGone):
                self._send_interest(ev, P.InterestAction.CANCEL)
            elif isinstance(ev, SourceSeen):
                key = (ev.topic, bytes(ev.otid))
                aid = self._adverts.get(key)
                if aid is None:
                    aid = self._adverts[key] = self._next_advert
                    self._next_advert += 1
                self._advert_source[aid] = ev.transport_body
                self._advertise(aid, ev.topic, ev.otid, ev.transport_body.TYPE, withdraw=False)
            elif isinstance(ev, SourceGone):
                aid = self._adverts.pop((ev.topic, bytes(ev.otid)), None)
                if aid is not None:
                    body = self._advert_source.pop(aid, None)
                    self._advertise(aid, ev.topic, ev.otid, body.TYPE if body is not None else 0, withdraw=True)
                    self.event("source_gone", f"{ev.topic} advert {aid}")

    def _advertise(self, aid: int, topic: str, otid: bytes, transport: int, *, withdraw: bool) -> None:
        link = self.link
        if link is None or link.conn.state is not P.State.CONNECTED:
            return
        if transport not in (0x00, 0x01):  # TCP, LBT-RU: what the relay carries
            self.counters["unrelayable_transport"] += 1
            return
        link.put(P.Advertisement(topic, self.s.endpoint.domain_id, bytes(otid), transport, aid, withdraw))
        self.counters["adverts_withdrawn" if withdraw else "adverts_sent"] += 1

    def _command(self, *cmd) -> None:
        try:
            self._to_portal_send.send_nowait(cmd)
        except trio.WouldBlock:
            self.counters["portal_queue_full"] += 1

    # ---------------------------------------------------------------- peer

    async def _peer_loop(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        p = self.s.peer
        if p.role == "acceptor":
            listeners = await trio.open_tcp_listeners(p.port, host=p.listen_ip)
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
                        stream = await trio.open_tcp_stream(p.address, p.port)
                except (OSError, trio.TooSlowError) as e:
                    self.counters["peer_connect_failed"] += 1
                    log.info("peer %s: connect to %s:%d failed: %s", p.name, p.address, p.port, e)
                else:
                    await self._run_link(stream, "initiator")
                await trio.sleep(p.reconnect_interval)

    async def _accepted(self, stream) -> None:
        if self.link is not None and not self.link.closed:
            self.counters["peer_refused_busy"] += 1
            await stream.aclose()
            return
        await self._run_link(stream, "acceptor")

    async def _run_link(self, stream, role: str) -> None:
        p = self.s.peer
        if p.tls is not None:
            stream = trio.SSLStream(stream, p.tls, server_side=(role == "acceptor"))
            try:
                with trio.fail_after(CONNECT_TIMEOUT):
                    await stream.do_handshake()
            except (trio.BrokenResourceError, trio.TooSlowError, ssl.SSLError, OSError) as e:
                self.counters["tls_failed"] += 1
                cause = e.__cause__ or e.__context__ or e
                self.event("tls_failed", f"peer {p.name}: {type(cause).__name__}: {cause}")
                await trio.aclose_forcefully(stream)
                return
        conn = P.PeerConnection(role, self.identity, keepalive_interval=p.keepalive_interval,
                                dead_after=p.dead_after)
        link = Link(self, conn, stream)
        self.link = link
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
            data = await link.stream.receive_some(READ_SIZE)
            items = link.conn.receive_data(data, trio.current_time())
            link.push_raw(link.conn.data_to_send())
            if self._link_events(link, items) or not data or link.closed:
                await link.finish(scope)
                return

    def _link_events(self, link: Link, items: list) -> bool:
        """Handle connection events and frames; True when the link is finished."""
        for it in items:
            if isinstance(it, P.Connected):
                self.event("peer_up", f"{self.s.peer.name} <-> {it.peer.name} domains {it.peer.domains}")
                self.counters["peer_connects"] += 1
                link.up.set()
                link.wake_writer.set()
                self._command("link_up")
            elif isinstance(it, P.Terminated):
                self.event("peer_down", f"{self.s.peer.name}: {type(it).__name__} {it}")
                return True
            elif isinstance(it, P.DisconnectRequested):
                link.put(P.DisconnectResponse())
            elif isinstance(it, P.Interest):
                self._command("interest", it)
            elif isinstance(it, P.Advertisement):
                self._on_advertisement(it)
            elif isinstance(it, S.STREAM_FRAMES):
                for sev in link.streams.receive(it):
                    self._stream_event(link, sev)
                link.flush_streams()
        return False

    def _link_down(self, link: Link) -> None:
        link.closed = True
        if self.link is link:
            self.link = None
        for st in link.state.values():
            st.closed = True
            st.wake()
            if st.sock is not None and hasattr(st.sock, "close"):
                st.sock.close()
        for aid in list(self._proxies):
            self._drop_proxy(aid)
        self._adverts.clear()
        self._advert_source.clear()
        self._command("link_down")

    # -------------------------------------------------- near side: proxies

    def _on_advertisement(self, f: P.Advertisement) -> None:
        if f.withdraw:
            self.counters["withdrawals_received"] += 1
            self._drop_proxy(f.advert_id)
            return
        if f.advert_id in self._proxies:
            return  # already proxied (a re-send)
        if f.origin_domain == self.s.endpoint.domain_id:
            self.counters["adverts_own_domain"] += 1
            return
        if f.transport not in (0x00, 0x01):
            self.counters["unrelayable_transport"] += 1
            return
        scope = trio.CancelScope()
        self._proxies[f.advert_id] = scope
        self._nursery.start_soon(self._proxy, f, scope)

    def _drop_proxy(self, aid: int) -> None:
        scope = self._proxies.pop(aid, None)
        if scope is not None:
            scope.cancel()
            self._proxy_addr.pop(aid, None)
            self._command("unproxy", aid)

    def _relay_ports(self):
        e = self.s.endpoint
        if e.relay_port_low == 0:
            return [0]
        return range(e.relay_port_low, e.relay_port_high + 1)

    async def _proxy(self, f: P.Advertisement, scope: trio.CancelScope) -> None:
        """A proxy source: a listener at the relay address, advertised in our TRD."""
        e = self.s.endpoint
        tcp = f.transport == 0x00
        with scope:
            sock = None
            for port in self._relay_ports():
                s = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM if tcp else trio.socket.SOCK_DGRAM)
                try:
                    if tcp:
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    await s.bind((e.relay_ip, port))
                    sock = s
                    break
                except OSError:
                    s.close()
            if sock is None:
                self.counters["relay_ports_exhausted"] += 1
                self.event("relay_ports_exhausted", f"no free relay port for {f.topic}")
                return
            with sock:
                addr = sock.getsockname()
                self._proxy_addr[f.advert_id] = addr
                body = relay_transport(f.transport, addr[0], addr[1])
                self._command("proxy", ProxySource(f.advert_id, f.topic, body, f.origin_domain, f.otid))
                self.event("proxy_added", f"{f.topic} advert {f.advert_id} at {addr[0]}:{addr[1]}")
                if tcp:
                    sock.listen(64)
                    listener = trio.SocketListener(sock)
                    async with trio.open_nursery() as n:
                        while True:
                            conn = await listener.accept()
                            n.start_soon(self._near_tcp, f.advert_id, conn)
                else:
                    await self._near_ru(f.advert_id, sock)

    async def _near_tcp(self, aid: int, conn) -> None:
        link = self.link
        if link is None:
            await conn.aclose()
            return
        sid = link.streams.open(aid, P.StreamKind.TCP)
        st = link.state[sid] = _StreamState(sid, P.StreamKind.TCP)
        st.sock = conn
        link.flush_streams()
        self.counters["streams_opened"] += 1
        try:
            await self._pump(link, st)
        finally:
            await trio.aclose_forcefully(conn)

    async def _near_ru(self, aid: int, sock) -> None:
        """Datagrams from receivers of this proxy: one stream per receiver address."""
        by_addr: dict[tuple[str, int], _StreamState] = {}
        async with trio.open_nursery() as n:
            while True:
                data, addr = await sock.recvfrom(65535)
                link = self.link
                if link is None:
                    continue
                st = by_addr.get(addr)
                if st is None or st.closed:
                    sid = link.streams.open(aid, P.StreamKind.LBTRU)
                    st = link.state[sid] = _StreamState(sid, P.StreamKind.LBTRU)
                    st.ru_addr = addr
                    st.sock = sock
                    by_addr[addr] = st
                    link.flush_streams()
                    n.start_soon(self._ru_downstream, link, st)
                if st.accepted.is_set():
                    self._send_datagram(link, st, data)
                elif len(st.incoming) < RU_BACKLOG:
                    st.incoming.append(data)  # held until accepted (then sent in order)

    def _send_datagram(self, link: Link, st: _StreamState, data: bytes) -> None:
        try:
            link.streams.send_datagram(st.sid, data)
        except S.LocalStreamError:
            self.counters["ru_send_closed"] += 1
            return
        link.flush_streams()

    async def _ru_downstream(self, link: Link, st: _StreamState) -> None:
        """Near LBT-RU: when accepted flush the backlog; then datagrams from the
        far source go to the receiver from the proxy socket."""
        await st.accepted.wait()
        if st.refused is not None or st.closed:
            return
        held = list(st.incoming)
        st.incoming.clear()
        for d in held:
            self._send_datagram(link, st, d)
        while not st.closed:
            await st.incoming_ready.wait()
            st.incoming_ready = trio.Event()
            while st.incoming:
                try:
                    await st.sock.sendto(st.incoming.popleft(), st.ru_addr)
                except OSError:
                    self.counters["ru_send_error"] += 1

    # ------------------------------------------------- far side: sources

    def _stream_event(self, link: Link, ev) -> None:
        st = link.state.get(ev.stream_id)
        if isinstance(ev, S.StreamOpened):
            body = self._advert_source.get(ev.advert_id)
            if body is None:
                link.streams.refuse(ev.stream_id, P.RefuseCode.REFUSED, "unknown or withdrawn advertisement")
                self.counters["streams_refused"] += 1
                return
            st = link.state[ev.stream_id] = _StreamState(ev.stream_id, ev.kind)
            link.nursery.start_soon(self._far, link, st, body)
        elif st is None:
            return
        elif isinstance(ev, S.StreamAccepted):
            st.accepted.set()
            st.credit.set()
        elif isinstance(ev, S.StreamRefused):
            st.refused = ev.reason or "refused"
            st.closed = True
            st.accepted.set()
            st.wake()
        elif isinstance(ev, S.DataReceived | S.DatagramReceived):
            st.incoming.append(ev.data)
            st.incoming_ready.set()
        elif isinstance(ev, S.CreditAvailable):
            st.credit.set()
        elif isinstance(ev, S.StreamClosed):
            st.closed = True
            st.wake()

    async def _far(self, link: Link, st: _StreamState, body) -> None:
        try:
            if st.kind == P.StreamKind.TCP:
                try:
                    with trio.fail_after(CONNECT_TIMEOUT):
                        conn = await trio.open_tcp_stream(body.ip, body.port)
                except (OSError, trio.TooSlowError) as e:
                    self._refuse(link, st, f"cannot connect to the source {body.ip}:{body.port}: {e}")
                    return
                st.sock = conn
                link.streams.accept(st.sid)
                link.flush_streams()
                st.accepted.set()
                self.counters["streams_accepted"] += 1
                try:
                    await self._pump(link, st)
                finally:
                    await trio.aclose_forcefully(conn)
            else:
                s = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
                try:
                    await s.bind((self.s.endpoint.relay_ip, 0))
                    await s.connect((body.ip, body.port))
                except OSError as e:
                    s.close()
                    self._refuse(link, st, f"cannot reach the source {body.ip}:{body.port}: {e}")
                    return
                with s:
                    st.sock = s
                    link.streams.accept(st.sid)
                    link.flush_streams()
                    st.accepted.set()
                    self.counters["streams_accepted"] += 1
                    async with trio.open_nursery() as n:
                        n.start_soon(self._far_ru_up, link, st, n.cancel_scope)
                        while not st.closed:
                            await st.incoming_ready.wait()
                            st.incoming_ready = trio.Event()
                            while st.incoming:
                                try:
                                    await s.send(st.incoming.popleft())
                                except OSError:
                                    self.counters["ru_send_error"] += 1
                        n.cancel_scope.cancel()
        finally:
            link.state.pop(st.sid, None)

    def _refuse(self, link: Link, st: _StreamState, reason: str) -> None:
        self.counters["streams_refused"] += 1
        self.event("stream_refused", reason)
        try:
            link.streams.refuse(st.sid, P.RefuseCode.REFUSED, reason)
        except S.LocalStreamError:
            pass
        link.flush_streams()

    async def _far_ru_up(self, link: Link, st: _StreamState, scope) -> None:
        while True:
            data = await st.sock.recv(65535)
            self._send_datagram(link, st, data)

    # ------------------------------------------------------- byte pumping

    async def _pump(self, link: Link, st: _StreamState) -> None:
        """Both directions of a TCP stream; returns when either side ends.
        The stream is closed towards the peer however it ends (even cancelled)."""
        try:
            async with trio.open_nursery() as n:
                n.start_soon(self._pump_up, link, st, n.cancel_scope)
                n.start_soon(self._pump_down, link, st, n.cancel_scope)
        finally:
            if not link.closed:
                try:
                    if link.streams.close(st.sid):
                        link.flush_streams()
                except S.LocalStreamError:
                    pass
            link.state.pop(st.sid, None)

    async def _pump_up(self, link: Link, st: _StreamState, scope) -> None:
        """Socket -> peer link, within the stream's credit and the queue's space."""
        await st.accepted.wait()
        if st.refused is not None:
            scope.cancel()
            return
        pending = b""
        while True:
            if st.closed or link.closed:
                return  # the peer ended the stream: _pump_down delivers what is left, then ends it
            if not pending:
                try:
                    pending = await st.sock.receive_some(READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pending = b""
                if not pending:
                    break  # EOF from the local side
            st.credit = trio.Event()  # before trying: a grant arriving after it wakes us
            try:
                rest = link.streams.send(st.sid, pending, limit=link.outq.data_space())
            except S.LocalStreamError:
                return  # closed meanwhile: _pump_down finishes the stream
            link.flush_streams()
            if len(rest) == len(pending):
                await st.credit.wait()
            pending = bytes(rest)
        scope.cancel()

    async def _pump_down(self, link: Link, st: _StreamState, scope) -> None:
        """Peer link -> socket; consumed bytes are returned to the peer as credit."""
        while True:
            while st.incoming:
                data = st.incoming.popleft()
                try:
                    await st.sock.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    scope.cancel()
                    return
                try:
                    link.streams.consumed(st.sid, len(data))
                except S.LocalStreamError:
                    pass
                link.flush_streams()
            if st.closed or link.closed:
                scope.cancel()
                return
            await st.incoming_ready.wait()
            st.incoming_ready = trio.Event()

    # --------------------------------------------------------------- status

    async def _signal_loop(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGTERM, signal.SIGINT) as sigs:
            task_status.started()
            async for sig in sigs:
                if sig == signal.SIGUSR1:
                    log.info("dump %s", json.dumps(self.status()))
                else:
                    log.info("stopping (%s)", signal.Signals(sig).name)
                    await self.disconnect("shutting down")
                    self._nursery.cancel_scope.cancel()

    async def disconnect(self, reason: str, timeout: float = 2.0) -> None:
        """Graceful disconnect of the peer link (request, response, ok), bounded in time."""
        link = self.link
        if link is None or link.conn.state is not P.State.CONNECTED:
            return
        link.put(P.DisconnectRequest(reason))
        with trio.move_on_after(timeout):
            while self.link is link:
                await trio.sleep(0.02)

    def prometheus_text(self) -> str:
        link = self.link
        up = 1 if link is not None and link.conn.state is P.State.CONNECTED else 0
        out = ["# HELP lbmr_router_peer_up 1 while the peer link is connected.",
               "# TYPE lbmr_router_peer_up gauge", f"lbmr_router_peer_up {up}",
               "# TYPE lbmr_router_proxies gauge", f"lbmr_router_proxies {len(self._proxy_addr)}",
               "# TYPE lbmr_router_adverts gauge", f"lbmr_router_adverts {len(self._advert_source)}",
               "# TYPE lbmr_router_streams gauge", f"lbmr_router_streams {len(link.state) if link else 0}",
               "# HELP lbmr_router_events_total Router events, by kind.",
               "# TYPE lbmr_router_events_total counter"]
        out += [f'lbmr_router_events_total{{kind="{k}"}} {v}' for k, v in sorted(self.counters.items())]
        if self.tr is not None:
            out += ["# TYPE lbmr_router_portal_total counter"]
            out += [f'lbmr_router_portal_total{{what="{k}"}} {v}' for k, v in sorted(self.tr.stats().items())]
        if link is not None:
            out += ["# TYPE lbmr_router_peer_dropped_datagrams_total counter",
                    f"lbmr_router_peer_dropped_datagrams_total {link.outq.dropped_datagrams}"]
        return "\n".join(out) + "\n"

    def status(self) -> dict:
        link = self.link
        now = trio.current_time()
        return {
            "name": self.s.name,
            "portal": {"name": self.s.endpoint.name, "domain_id": self.s.endpoint.domain_id,
                       "stats": self.tr.stats() if self.tr else {},
                       "local_interest": [li.topic for li in self.tr.local_interests()] if self.tr else [],
                       "remote_interest": [t for t, _ in self.tr.remote_interests()] if self.tr else []},
            "peer": {"name": self.s.peer.name, "state": link.conn.state.value if link else "down",
                     "peer": link.conn.peer.name if link and link.conn.peer else None,
                     "rtt_last": link.conn.rtt.last if link else None,
                     "queued_frames": len(link.outq) if link else 0,
                     "dropped_datagrams": link.outq.dropped_datagrams if link else 0},
            "proxies": {str(a): f"{ip}:{port}" for a, (ip, port) in self._proxy_addr.items()},
            "adverts": {str(a): f"{getattr(b, 'ip', '?')}:{getattr(b, 'port', '?')}"
                        for a, b in self._advert_source.items()},
            "streams": len(link.state) if link else 0,
            "counters": dict(self.counters),
            "events": [{"age_s": round(now - t, 3), "event": k, "detail": d} for t, k, d in self.events],
        }
