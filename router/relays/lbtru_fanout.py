"""LBT-RU sessions through the router, fanned out, on trio: one upstream LBT-RU
receiver per origin session (far side), one link stream per session per
link, and at the near router one LBT-RU proxy source that re-publishes the
session to every local receiver (the protocol logic is
:mod:`router.core.lbtru_upstream` and :mod:`router.core.lbtru_fanout`).

Near side (:class:`RuProxySource`, shared with the LBT-RM proxies that
re-publish as LBT-RU, :mod:`router.relays.lbtrm`): the proxy's socket, a
:class:`router.core.lbtru_fanout.RuFanout`, and one link stream that feeds
it. For an LBT-RU origin (stream kind LBTRU_SESSION) the stream is opened
when the first receiver connects and closed NEAR_LINGER seconds after the
last one left; when the far side ends it (the origin ended the session)
every receiver gets an RST. For an LBT-RM origin it runs while the proxy
lives (multicast receivers do not register).

Far side (:meth:`RuSessionRelay.open_far`): a LBTRU_SESSION stream joins the
session's :class:`RuUpstream` (one UDP socket and one LBT-RU connection to
the origin per session, shared by every link of the endpoint); it is
accepted once the origin confirmed the connection and then gets every DATA
and SM of the origin, and its proxy's NAKs go to the origin. The origin's
end (RST, silence, refused datagrams) closes every stream of the session;
the connection is dropped UPSTREAM_LINGER seconds after its last stream
left (the origin forgets it after its client activity timeout).

The payload of every DATA of the origin passes the message path
(:mod:`router.core.message_path`) at the far router, in the upstream core,
before it goes to the links (``downstream_rules``, and the requesters
recorded), and at the near router in the proxy's fan-out before it goes to
the receivers (requests pointed at the request listeners:
:mod:`router.relays.responses`).

Bounds: datagrams waiting for a proxy's stream at most ``queue_limit`` per
stream (more are dropped, ``lbtru_queue_full``); a socket read takes at most
64 datagrams at a time; the origin's datagrams are checked by the upstream
core (address, port, session id, size).
"""

from __future__ import annotations

import math
import secrets
import socket
from collections import Counter

import trio

from lbmr_proto import LbtruSessionTransport

from .. import peerlink as P
from ..core.lbtrm import DatagramQueue
from ..core.lbtru_fanout import RuFanout
from ..core.lbtru_origin import LbtruInput
from ..core.lbtru_upstream import EndReason, RuUpstream, UpstreamState
from ..core.lbtru_window import WindowBudget
from ..link import Link, StreamState
from ..peerlink import streams as S
from .interface import RelayContext, TransportRelay, Upstreams, accept_stream, refuse_stream
from .tcp_fanout import NEAR_LINGER
from .tcp_fanout_origin import UPSTREAM_LINGER

__all__ = ["RuProxySource", "RuSessionRelay", "ru_socket", "udp_raw", "receive", "drain", "QUEUE_LIMIT", "FANOUT_YIELD"]

QUEUE_LIMIT = 4096  # datagrams waiting per stream
BATCH = 64  # datagrams read from a socket at one wake-up
FANOUT_YIELD = 512  # datagrams a proxy sends to its receivers before it lets other tasks run
RETRY_INTERVAL = 1.0  # seconds before a proxy opens its stream again
MAX_CLIENTS = 1024  # receivers of one LBT-RU fan-out proxy (the per-receiver relay's streams per link)


# LBT-RU relay sockets: 4 MiB buffers (the loopback walk-through lost hundreds of
# datagrams per stream with the default ~200 KiB whenever the event loop paused).
RU_SOCKET_BUFFER = 4 << 20


def udp_raw() -> socket.socket:
    """A UDP socket with RU_SOCKET_BUFFER send and receive buffers (best effort)."""
    raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        try:
            raw.setsockopt(socket.SOL_SOCKET, opt, RU_SOCKET_BUFFER)
        except OSError:
            pass
    return raw


def ru_socket(raw: socket.socket | None = None):
    """A UDP socket for the LBT-RU relay, with big buffers (best effort). Its
    ``raw`` attribute is the underlying non-blocking socket, for reading what is
    already queued and sending without a scheduler round trip per datagram."""
    raw = raw if raw is not None else udp_raw()
    s = trio.socket.from_stdlib_socket(raw)
    s.raw = raw
    return s


def drain(raw, n: int = BATCH) -> list:
    """What the non-blocking socket ``raw`` holds now, as (data, address) pairs, at most ``n``."""
    out = []
    for _ in range(n):
        try:
            out.append(raw.recvfrom(65535))
        except (BlockingIOError, InterruptedError):
            break
        except OSError:  # an ICMP error queued on the socket: the next read goes on
            continue
    return out


async def receive(sock, counters: Counter[str], counter: str) -> list | None:
    """The datagrams ``sock`` has (waits for the first; at most BATCH) as
    (data, address) pairs; None when the socket was closed. An ICMP error is
    counted in ``counters[counter]``."""
    try:
        first = await sock.recvfrom(65535)
    except trio.ClosedResourceError:
        return None
    except OSError:
        counters[counter] += 1
        await trio.sleep(0.01)
        return []
    return [first, *drain(sock.raw, BATCH - 1)]


def send_datagram(link: Link, st: StreamState, data: bytes, counters: Counter[str], counter: str) -> bool:
    """One DATAGRAM on the stream (flush_streams to send); False (counted) if it is closed."""
    try:
        link.streams.send_datagram(st.sid, data)
    except S.LocalStreamError:
        counters[counter] += 1
        return False
    return True


class RuProxySource:
    """The near side of one LBT-RU proxy source (proxy ``proxy_id`` of
    ``site``, a :class:`router.shell.relay_site.RelaySite`): ``fan`` on the socket
    ``sock`` (a bound UDP socket with ``raw``), fed by a stream of ``kind``
    on the site's link for the advertisement the site names for the proxy
    when the stream opens (a live one of the session; None: not now).
    ``on_demand``: the stream runs only while the proxy has receivers
    (LBT-RU origins), else while the proxy lives (LBT-RM origins)."""

    def __init__(self, fan: RuFanout, sock, counters: Counter[str], site, proxy_id: int, kind: int, *,
                 on_demand: bool, queue_limit: int = QUEUE_LIMIT, retry_interval: float = RETRY_INTERVAL,
                 requests=None) -> None:
        self.fan, self.sock, self.counters = fan, sock, counters
        self.requests = requests  # the relay's request listeners (router.relays.responses), or None
        self.nursery: trio.Nursery | None = None
        self.site, self.proxy_id, self.kind = site, proxy_id, kind
        self.on_demand, self.queue_limit, self.retry_interval = on_demand, queue_limit, retry_interval
        self.up: tuple[Link, StreamState] | None = None  # where NAKs for the origin go meanwhile
        self.timer = trio.CancelScope()  # the timer task's current wait
        self.wanted = trio.Event()  # (on demand) the proxy has receivers

    async def run(self) -> None:
        """Serve receivers and run the stream until cancelled; then reset every receiver."""
        try:
            async with trio.open_nursery() as n:
                self.nursery = n
                n.start_soon(self._clients)
                n.start_soon(self._timer)
                while True:
                    if self.on_demand:
                        await self.wanted.wait()
                    link = self.site.link
                    if self._usable(link):
                        await self._stream(link)
                    await trio.sleep(self.retry_interval)
        finally:
            self._send_now(self.fan.close())
            if self.requests is not None:
                self.requests.forget(self.proxy_id)

    def _usable(self, link: Link | None) -> bool:
        if link is None or not link.connected or link.closed:
            return False
        if self.kind == P.StreamKind.LBTRU_SESSION and not link.capabilities & P.Capability.RU_SESSIONS:
            self.counters["lbtru_session_unsupported"] += 1  # an older peer: the next proxy relays per receiver
            return False
        return True

    def _send_now(self, out) -> None:
        """Datagrams to receivers, without waiting: a full socket buffer drops
        (counted; LBT-RU receivers NAK what they miss)."""
        raw = self.sock.raw
        for data, addr in out:
            try:
                raw.sendto(data, addr)
            except BlockingIOError:
                self.counters["lbtru_send_dropped"] += 1
            except OSError:
                self.counters["lbtru_send_error"] += 1

    def _rearm(self) -> None:
        """Bring the timer's wake-up forward if the fan-out now has something due earlier."""
        due = self.fan.next_due()
        if due < self.timer.deadline:
            self.timer.deadline = due

    async def _timer(self) -> None:
        """Session messages and client expiry, when due."""
        while True:
            out, due = self.fan.tick(trio.current_time())
            self._send_now(out)
            if not self.fan.clients and self.wanted.is_set():
                self.wanted = trio.Event()
            self.timer = trio.CancelScope(deadline=due)
            with self.timer:
                await trio.sleep_forever()

    async def _clients(self) -> None:
        """Datagrams from receivers: connections, ACKs, NAKs."""
        fan = self.fan
        while True:
            batch = await receive(self.sock, self.counters, "lbtru_recv_error")
            if batch is None:
                return
            now = trio.current_time()
            sends = 0
            for data, addr in batch:
                out = fan.from_client(data, addr[:2], now)
                self._send_now(out)
                sends += len(out)
                if sends >= FANOUT_YIELD:  # NAKs answered from the window: let the other tasks run
                    sends = 0
                    await trio.sleep(0)
                    now = trio.current_time()
            if fan.clients:
                self.wanted.set()
            self._naks_up(fan.take_naks_up())
            self._rearm()

    def _naks_up(self, naks: list[bytes]) -> None:
        if not naks:
            return
        cur = self.up
        if cur is None or cur[1].closed or cur[0].closed:
            self.counters["lbtru_naks_no_link"] += len(naks)
            return
        sent = False
        for nak in naks:
            sent = send_datagram(cur[0], cur[1], nak, self.counters, "lbtru_send_closed") or sent
        if sent:
            cur[0].flush_streams()

    async def _stream(self, link: Link) -> None:
        """Open a stream on ``link`` and, once the peer accepts it, pass its
        datagrams to the receivers until it ends."""
        aid = self.site.proxy_advert(self.proxy_id)
        if aid is None:
            return
        try:
            sid = link.streams.open(aid, self.kind)
        except S.LocalStreamError:
            return
        st = link.state[sid] = StreamState(sid, self.kind)
        st.incoming = DatagramQueue(self.queue_limit, self.counters, "lbtru_queue_full")
        st.owns_sock = False  # the proxy's socket
        link.flush_streams()
        self.counters["lbtru_proxy_streams_opened"] += 1
        if self.requests is not None:  # the session's requests name our request listeners
            self.fan.path = self.requests.path(self.proxy_id, link)
            self.requests.settle(self.nursery)
        try:
            await st.accepted.wait()
            if st.refused is not None:
                self.counters["lbtru_proxy_streams_refused"] += 1
            if st.refused is not None or st.closed:
                return
            lingered = await self._feed(link, st)
            if self.on_demand and not lingered and not link.closed:
                # the far side ended the stream: the origin ended the session (an LBT-RM
                # proxy's stream is opened again, its receivers kept)
                self.counters["lbtru_proxy_sessions_ended"] += 1
                self._send_now(self.fan.reset())
                if self.wanted.is_set():
                    self.wanted = trio.Event()
        finally:
            st.closed = True
            link.close_stream(st)

    async def _feed(self, link: Link, st: StreamState) -> bool:
        """The stream's datagrams to the receivers until the stream or link
        ends (False) or, on demand, NEAR_LINGER after the last receiver left
        (True)."""
        fan = self.fan
        self.up = (link, st)
        idle_since = math.inf
        try:
            while not (st.closed or link.closed):
                if not self.on_demand or fan.clients:
                    idle_since = math.inf
                elif idle_since == math.inf:
                    idle_since = trio.current_time()
                elif trio.current_time() >= idle_since + NEAR_LINGER:
                    return True
                with trio.move_on_at(idle_since + NEAR_LINGER):
                    await st.incoming_ready.wait()
                st.incoming_ready = trio.Event()
                now = trio.current_time()
                sends = 0
                while st.incoming:
                    out = fan.from_peer(st.incoming.popleft(), now)
                    if self.requests is not None:
                        self.requests.settle(self.nursery)  # listeners its requests name listen before it goes
                    self._send_now(out)
                    sends += len(out)
                    if sends >= FANOUT_YIELD:  # many receivers: let the other tasks run
                        sends = 0
                        await trio.sleep(0)
                        now = trio.current_time()
                self._rearm()
            return False
        finally:
            self.up = None


class RuUpstreamSession:
    """One origin LBT-RU session at the far side: its socket's task, its
    receiver core, the link streams it feeds (``sinks``: (link, stream id)
    -> stream) and how many streams wait for the connection (``waiting``)."""

    def __init__(self, key: tuple, core: RuUpstream) -> None:
        self.key = key
        self.core = core
        self.sinks: dict[tuple[Link, int], StreamState] = {}
        self.waiting = 0
        self.settled = trio.Event()  # connected, or ended before
        self.attached = trio.Event()  # every stream that waited for the connection is a sink
        self.wake = trio.Event()  # the streams changed, or the session ended
        self.sock = None  # the UDP socket to the origin, once bound
        self.done = False


class RuSessionRelay(TransportRelay):
    """LBT-RU fan-out for one endpoint's relay
    (:class:`router.relays.interface.TransportRelay`): ``upstreams`` shared
    with the relays of the endpoint's other links (at most ``ru_max_streams``
    of the settings at once); ``budget``: the retransmission windows of the
    endpoint's LBT-RU proxies."""

    SOCKET_TYPE = socket.SOCK_DGRAM
    STREAM_KIND = P.StreamKind.LBTRU_SESSION

    def __init__(self, context: RelayContext) -> None:
        super().__init__(context)
        self.upstreams: Upstreams = context.ru_upstreams
        self.budget: WindowBudget = context.window_budget
        self.bodies: dict[int, LbtruSessionTransport] = {}  # advert id -> the proxy's advertised transport
        # upstream sessions (one UDP socket each) of the endpoint at once, at most
        self.max_upstreams = self.settings.ru_max_streams

    def advertised_transport(self, advert_id: int):
        return self.bodies.get(advert_id)

    # ------------------------------------------------------- near side

    def serves(self, link: Link | None) -> bool:
        """Whether a new LBT-RU proxy is a fan-out source (the link, if any,
        knows LBTRU_SESSION streams) rather than a per-receiver relay."""
        return link is None or bool(link.capabilities & P.Capability.RU_SESSIONS)

    async def serve_proxy(self, advert: P.Advertisement, sock, task_status) -> None:
        """The proxy of ``advert`` (an LBT-RU session) as one LBT-RU source on
        ``sock``, with the origin's session id (the proxy's own when the peer
        did not say it)."""
        f = advert
        ip, port = sock.getsockname()[:2]
        sid = f.origin_session_id or secrets.randbits(32)
        fan = RuFanout(sid, self.counters, origin=LbtruInput(), budget=self.budget, max_clients=MAX_CLIENTS)
        self.bodies[f.advert_id] = LbtruSessionTransport(ip, fan.session_id, port)
        try:
            task_status.started((ip, port))
            await RuProxySource(fan, sock, self.counters, self.site, f.advert_id,
                                P.StreamKind.LBTRU_SESSION, on_demand=True, requests=self.context.requests).run()
        finally:
            self.bodies.pop(f.advert_id, None)

    # -------------------------------------------------------- far side

    def open_far(self, link: Link, ev: S.StreamOpened, origin) -> None:
        """The peer opened a LBTRU_SESSION stream for our advertisement of the LBT-RU session ``origin``."""
        if getattr(origin, "NAME", None) != "LBTRU":
            self._refuse(link, ev, P.RefuseCode.UNSUPPORTED_KIND, "the advertised source is not LBT-RU",
                         "streams_refused")
            return
        key = (origin.ip, origin.port, getattr(origin, "session_id", None))
        up = self.upstreams.get(key)
        if (up is None or up.done) and len(self.upstreams) >= self.max_upstreams:
            self._refuse(link, ev, P.RefuseCode.TOO_MANY_STREAMS,
                         f"{len(self.upstreams)} LBT-RU upstream sessions already open", "lbtru_upstreams_full")
            return
        if up is None or up.done:
            path = self.context.responses.upstream_path(self.settings.downstream_rules, key)  # its requesters noted
            core = RuUpstream(key[:2], key[2], self.counters, path=path)
            up = self.upstreams[key] = RuUpstreamSession(key, core)
            (self.upstreams.nursery or link.nursery).start_soon(self._upstream, up)
        st = link.state[ev.stream_id] = StreamState(ev.stream_id, ev.kind)
        st.advert_id = ev.advert_id
        st.incoming = DatagramQueue(QUEUE_LIMIT, self.counters, "lbtru_queue_full")
        up.waiting += 1
        link.nursery.start_soon(self._far_stream, up, link, st)

    def _refuse(self, link: Link, ev: S.StreamOpened, code: P.RefuseCode, reason: str, counter: str) -> None:
        self.counters[counter] += 1
        link.streams.refuse(ev.stream_id, code, reason)
        link.flush_streams()

    async def _upstream(self, up: RuUpstreamSession) -> None:
        """The session's socket: connect, then pass the origin's datagrams to
        the streams and theirs to the origin until it ends or UPSTREAM_LINGER
        after its last stream left."""
        core = up.core
        try:
            sock = ru_socket()
            with sock:
                try:
                    await sock.bind((self.settings.relay_ip, 0))
                    await sock.connect(core.origin)
                except OSError as e:
                    self.event("lbtru_upstream_failed", f"cannot reach {core.origin[0]}:{core.origin[1]}: {e}")
                    core.unreachable()
                    return
                self.counters["lbtru_upstreams"] += 1
                up.sock = sock
                async with trio.open_nursery() as n:
                    n.start_soon(self._upstream_reads, up, sock, n.cancel_scope)
                    await self._upstream_timer(up)
                    n.cancel_scope.cancel()
        finally:
            up.done = True
            up.settled.set()
            if self.upstreams.get(up.key) is up:
                del self.upstreams[up.key]
            for st in list(up.sinks.values()):
                st.closed = True
                st.wake()
            if core.ended is not None:
                self.event("lbtru_upstream_ended", f"{core.origin[0]}:{core.origin[1]}: {core.ended.value}")

    def _to_origin(self, up: RuUpstreamSession, out: list[bytes]) -> None:
        """Datagrams to the origin, without waiting (a full buffer drops: counted);
        a refused one (ICMP port unreachable) ends the session."""
        for data in out:
            try:
                up.sock.raw.send(data)
            except BlockingIOError:
                self.counters["lbtru_upstream_send_dropped"] += 1
            except ConnectionRefusedError:
                up.core.unreachable()
                up.wake.set()
                return
            except OSError:
                self.counters["lbtru_upstream_send_error"] += 1

    async def _upstream_timer(self, up: RuUpstreamSession) -> None:
        """CREQs, ACKs and the activity timeout; returns when the session ends
        or lingered UPSTREAM_LINGER without streams."""
        core = up.core
        idle_since = math.inf
        while core.state is not UpstreamState.ENDED:
            now = trio.current_time()
            out, due = core.tick(now)
            self._to_origin(up, out)
            if core.state is not UpstreamState.CONNECTING:
                up.settled.set()
            if up.sinks or up.waiting:
                idle_since = math.inf
            elif idle_since == math.inf:
                idle_since = now
            elif now >= idle_since + UPSTREAM_LINGER:
                return
            with trio.move_on_at(min(due, idle_since + UPSTREAM_LINGER, now + UPSTREAM_LINGER)):
                await up.wake.wait()
            up.wake = trio.Event()

    async def _upstream_reads(self, up: RuUpstreamSession, sock, scope: trio.CancelScope) -> None:
        """The origin's datagrams to every stream of the session; ends the session at its end."""
        core = up.core
        while core.state is not UpstreamState.ENDED:
            try:
                batch = [await sock.recvfrom(65535), *drain(sock.raw, BATCH - 1)]
            except ConnectionRefusedError:  # ICMP port unreachable: the origin is gone
                core.unreachable()
                break
            except OSError:
                self.counters["lbtru_upstream_recv_error"] += 1
                await trio.sleep(0.01)
                continue
            now = trio.current_time()
            to_links: list[bytes] = []
            for data, src in batch:
                connecting = core.state is UpstreamState.CONNECTING
                out = core.from_origin(data, src[:2], now)
                self._to_origin(up, out.to_origin)
                to_links += out.to_links
                if connecting and core.state is UpstreamState.CONNECTED and up.waiting:
                    up.settled.set()  # the streams that asked for the session get what follows the SYN
                    await up.attached.wait()
            if core.state is not UpstreamState.CONNECTING:
                up.settled.set()
            if to_links:
                self._to_streams(up, to_links)
        up.wake.set()
        scope.cancel()

    def _to_streams(self, up: RuUpstreamSession, datagrams: list[bytes]) -> None:
        links = set()
        for (link, _), st in up.sinks.items():
            if st.closed or link.closed:
                continue
            try:
                link.streams.send_datagrams(st.sid, datagrams)
            except S.LocalStreamError:
                self.counters["lbtru_upstream_send_closed"] += len(datagrams)
                continue
            links.add(link)
        for link in links:
            link.flush_streams()

    async def _far_stream(self, up: RuUpstreamSession, link: Link, st: StreamState) -> None:
        """One link stream of an upstream session, from accept to end."""
        key = (link, st.sid)
        waiting = True
        try:
            await up.settled.wait()
            core = up.core
            if up.done or core.state is not UpstreamState.CONNECTED:
                reason = core.ended.value if core.ended is not None else "the session ended"
                refuse_stream(link, st, reason, self.counters, self.event)
                if core.ended in (EndReason.NO_ANSWER, EndReason.UNREACHABLE, EndReason.RESET):
                    self.site.session_ended(st.advert_id)
                return
            if not accept_stream(link, st, self.counters):
                return
            up.sinks[key] = st
            waiting = self._attached(up)
            self.counters["lbtru_upstream_streams"] += 1
            while not (st.closed or link.closed or up.done):
                await st.incoming_ready.wait()
                st.incoming_ready = trio.Event()
                now = trio.current_time()
                while st.incoming and up.sock is not None:  # the proxy's NAKs
                    self._to_origin(up, core.from_link(st.incoming.popleft(), now))
            if up.done and up.core.state is UpstreamState.ENDED:
                self.site.session_ended(st.advert_id)
        finally:
            if waiting:
                self._attached(up)
            up.sinks.pop(key, None)
            up.wake.set()
            link.close_stream(st)
            link.state.pop(st.sid, None)

    @staticmethod
    def _attached(up: RuUpstreamSession) -> bool:
        """A stream that waited for the connection is a sink now (or gave up):
        when it was the last, the session's reader goes on. False (no longer waiting)."""
        up.waiting -= 1
        if not up.waiting:
            up.attached.set()
        return False
