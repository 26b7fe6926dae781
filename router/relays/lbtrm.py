"""LBT-RM sources across the peer link: the trio shell around
:mod:`router.core.lbtrm` (what is kept and rewritten is decided there).

Near side (:meth:`RmRelay.serve_proxy`): a proxy of the peer's LBT-RM
advertisement is one UDP socket at the relay address (bound by
:class:`router.relays.endpoint_relay.Relay` in the relay port range). It opens one stream
(kind LBT-RM) on the current link for the advertisement as soon as it is
bound -- multicast receivers do not register, so the session is relayed
while the proxy exists -- multicasts what the peer sends on it to its group
and sends the receivers' NAKs back on it. A refused or ended stream is
opened again ``retry_interval`` later while the proxy lives.

Far side (:meth:`RmRelay.open_far`): a stream the peer opens for an LBT-RM
advertisement joins the source's group and port on the relay address's
interface, relays the session's datagrams and sends the NAKs that come
back to the source. At most one such stream per advertisement and
``max_streams`` per link are accepted (each joins a group: one socket
each); the others are refused.

Bounds: every queue of datagrams waiting for a socket or the link holds at
most ``queue_limit`` datagrams (more are dropped and counted:
``lbtrm_queue_full``); the link's writer queue drops DATAGRAM frames when
full (as for LBT-RU); a socket read takes at most 64 datagrams at a time.
"""

from __future__ import annotations

import secrets
import socket
from collections import Counter
from functools import partial

import trio

from lbmr_proto import LbtruSessionTransport
from lbmr_runtime.netif import open_multicast_socket

from .. import peerlink as P
from ..core.lbtrm import DatagramQueue, GroupPool, RmOrigin, RmProxy
from ..core.lbtru_fanout import RuFanout
from ..core.lbtru_origin import LbtrmInput
from ..core.lbtru_window import WindowBudget
from ..link import Link, StreamState
from ..peerlink import streams as S
from .interface import RelayContext, RelaySettings, TransportRelay
from .lbtru_fanout import RuProxySource, receive
from .responses import origin_key

__all__ = ["RmRelay", "LBTRM", "QUEUE_LIMIT", "MAX_STREAMS"]

LBTRM = 0x10  # the LBMR transport code of LBT-RM, also the peer-link stream kind
QUEUE_LIMIT = RelaySettings().lbtrm_queue_limit  # datagrams waiting per stream and direction (default)
MAX_STREAMS = RelaySettings().lbtrm_max_streams  # far side: LBT-RM streams (joined groups) per link (default)
RETRY_INTERVAL = 1.0  # seconds before a proxy opens its stream again
SOCKET_BUFFER = 4 << 20


async def _send(sock, data: bytes, dest, counters: Counter[str]) -> None:
    try:
        sock.raw.sendto(data, dest)
    except BlockingIOError:
        try:
            await sock.sendto(data, dest)
        except OSError:
            counters["lbtrm_send_error"] += 1
    except OSError:
        counters["lbtrm_send_error"] += 1


def _wrap(raw: socket.socket):
    s = trio.socket.from_stdlib_socket(raw)
    s.raw = raw
    return s


class RmRelay(TransportRelay):
    """The LBT-RM part of one endpoint's relay
    (:class:`router.relays.interface.TransportRelay`); of the settings,
    ``relay_ip``, ``multicast_ttl`` and the ``lbtrm_*`` ones."""

    SOCKET_TYPE = socket.SOCK_DGRAM
    STREAM_KIND = LBTRM

    def __init__(self, context: RelayContext) -> None:
        super().__init__(context)
        e = self.settings
        self.pool = GroupPool(e.lbtrm_group_low, e.lbtrm_group_high, dest_port=e.lbtrm_dest_port,
                              same=e.lbtrm_same_group)
        self.ttl = e.multicast_ttl
        self.queue_limit = e.lbtrm_queue_limit
        self.max_streams = e.lbtrm_max_streams
        self.retry_interval = RETRY_INTERVAL
        self.bodies: dict[int, object] = {}  # advert id -> the proxy's advertised transport
        self.window_budget: WindowBudget = context.window_budget  # the LBT-RU proxies' windows, together
        self._far: dict[int, dict[int, int]] = {}  # id(link) -> advert id -> far streams

    def advertised_transport(self, advert_id: int):
        return self.bodies.get(advert_id)

    # ------------------------------------------------------------ near side

    async def serve_proxy(self, advert: P.Advertisement, sock, task_status) -> None:
        """Run the proxy of advertisement ``advert`` on ``sock`` (a UDP socket bound
        at the relay address, with ``raw``); reports its address through
        ``task_status`` once its advertised transport is known."""
        e = self.settings
        if e.lbtrm_proxy_transport == "lbt-ru":
            await self._serve_fanout(advert, sock, task_status)
            return
        raw = sock.raw
        raw.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(e.relay_ip))
        raw.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        raw.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, self.ttl)
        ip, port = sock.getsockname()[:2]
        group, dport = self.pool.take(advert.otid)
        proxy = RmProxy(ip, port, group, dport, secrets.randbits(32), self.counters)
        self.bodies[advert.advert_id] = proxy.transport_body
        aid = advert.advert_id
        try:
            task_status.started((ip, port))
            async with trio.open_nursery() as n:  # the proxy's request listeners (router.relays.responses)
                while True:
                    link = self.site.link
                    if link is not None and link.connected and not link.closed:
                        await self._near_stream(link, aid, partial(self._multicast, link, proxy, sock, aid, n))
                    await trio.sleep(self.retry_interval)
        finally:
            self.context.requests.forget(aid)
            self.bodies.pop(advert.advert_id, None)
            self.pool.give(group)

    async def _near_stream(self, link: Link, aid: int, serve) -> None:
        """Open an LBT-RM stream on ``link`` for advert ``aid`` and, once the
        peer accepts it, run ``await serve(st)`` until the session ends."""
        try:
            sid = link.streams.open(aid, LBTRM)
        except S.LocalStreamError:
            return
        st = self._state(link, sid)
        link.flush_streams()
        self.counters["lbtrm_streams_opened"] += 1
        try:
            await st.accepted.wait()
            if st.refused is not None:
                self.counters["lbtrm_streams_refused"] += 1
            if st.refused is not None or st.closed:
                return
            await serve(st)
        finally:
            self.counters["lbtrm_streams_ended"] += 1
            self._close(link, st)

    async def _multicast(self, link: Link, proxy: RmProxy, sock, aid: int, listeners: trio.Nursery,
                         st: StreamState) -> None:
        """A multicast proxy's session: the peer's datagrams to the group (its
        requests pointed at our request listeners, whose tasks run in
        ``listeners``), receivers' NAKs to the peer."""
        proxy.path = self.context.requests.path(aid, link)
        self.context.requests.settle(listeners)
        async with trio.open_nursery() as n:
            n.start_soon(self._naks_up, link, st, proxy, sock, n.cancel_scope)
            await self._emit(link, st, proxy, sock, listeners)
            n.cancel_scope.cancel()

    async def _naks_up(self, link: Link, st: StreamState, proxy: RmProxy, sock, scope) -> None:
        """NAKs from receivers to the peer."""
        while not (st.closed or link.closed):
            batch = await receive(sock, self.counters, "lbtrm_recv_error")
            if batch is None:
                scope.cancel()
                return
            sent = False
            now = trio.current_time()
            for data, _ in batch:
                if proxy.from_receiver(data, now):
                    sent = self._datagram(link, st, data) or sent
            if sent:
                link.flush_streams()

    async def _emit(self, link: Link, st: StreamState, proxy: RmProxy, sock, listeners: trio.Nursery) -> None:
        """The peer's datagrams to the proxy's group, until the stream or link ends."""
        dest = (proxy.group, proxy.dest_port)
        while not (st.closed or link.closed):
            await st.incoming_ready.wait()
            st.incoming_ready = trio.Event()
            now = trio.current_time()
            while st.incoming:
                out = proxy.to_receivers(st.incoming.popleft(), now)
                self.context.requests.settle(listeners)  # listeners its requests name listen before it goes
                if out is not None:
                    await _send(sock, out, dest, self.counters)

    # ------------------------------------------- near side, unicast (LBT-RU)

    async def _serve_fanout(self, f: P.Advertisement, sock, task_status) -> None:
        """The proxy as an LBT-RU source (:class:`router.relays.lbtru_fanout.RuProxySource`):
        receivers connect to ``sock`` and get the session unicast. Its
        clients are served (connections, NAKs answered from the window) even
        while the link is down; the stream runs while the proxy lives, opened
        again ``retry_interval`` after it ended."""
        ip, port = sock.getsockname()[:2]
        fan = RuFanout(secrets.randbits(32), self.counters, origin=LbtrmInput(port, secrets.randbits(32)),
                       budget=self.window_budget,
                       max_clients=self.settings.lbtrm_max_clients)
        self.bodies[f.advert_id] = LbtruSessionTransport(ip, fan.session_id, port)
        try:
            task_status.started((ip, port))
            await RuProxySource(fan, sock, self.counters, self.site, f.advert_id, LBTRM, on_demand=False,
                                queue_limit=self.queue_limit, retry_interval=self.retry_interval,
                                requests=self.context.requests).run()
        finally:
            self.bodies.pop(f.advert_id, None)

    # ------------------------------------------------------------- far side

    def open_far(self, link: Link, ev: S.StreamOpened, origin) -> None:
        """The peer opened an LBT-RM stream for our advertisement of ``origin``
        (the source's transport): refuse it or start relaying."""
        per_link = self._far.setdefault(id(link), {})
        reason = None
        if getattr(origin, "NAME", None) != "LBTRM":
            reason = (P.RefuseCode.UNSUPPORTED_KIND, "the advertised source is not LBT-RM")
        elif per_link.get(ev.advert_id, 0) >= 1:
            reason = (P.RefuseCode.TOO_MANY_STREAMS, "an LBT-RM stream is open for this advertisement")
        elif sum(per_link.values()) >= self.max_streams:
            reason = (P.RefuseCode.TOO_MANY_STREAMS, f"{self.max_streams} LBT-RM streams already open")
        if reason is not None:
            self.counters["lbtrm_streams_refused"] += 1
            link.streams.refuse(ev.stream_id, *reason)
            link.flush_streams()
            return
        per_link[ev.advert_id] = per_link.get(ev.advert_id, 0) + 1
        st = self._state(link, ev.stream_id)
        st.advert_id = ev.advert_id
        rm = RmOrigin(origin, self.counters)
        rm.path = self.context.responses.upstream_path(self.settings.downstream_rules, origin_key(origin))
        link.nursery.start_soon(self._far_stream, link, st, rm, per_link)

    async def _far_stream(self, link: Link, st: StreamState, origin: RmOrigin, per_link: dict) -> None:
        mc = uc = None
        try:
            e = self.settings
            group, port = origin.group
            try:
                mc = _wrap(open_multicast_socket(group, port, 0, e.relay_ip, e.relay_ip, self.ttl,
                                                 buffer=SOCKET_BUFFER))
                uc = _wrap(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
                await uc.bind((e.relay_ip, 0))
            except OSError as err:
                self.counters["lbtrm_streams_refused"] += 1
                self.event("stream_refused", f"cannot join the LBT-RM group {group}:{port}: {err}")
                try:
                    link.streams.refuse(st.sid, P.RefuseCode.REFUSED, f"cannot join {group}:{port}: {err}")
                except S.LocalStreamError:
                    pass  # the peer closed it meanwhile
                link.flush_streams()
                return
            try:
                link.streams.accept(st.sid)
            except S.LocalStreamError:
                return  # the peer closed it before we could accept
            link.flush_streams()
            st.accepted.set()
            self.counters["lbtrm_streams_accepted"] += 1
            async with trio.open_nursery() as n:
                n.start_soon(self._group_up, link, st, origin, mc, n.cancel_scope)
                await self._naks_down(link, st, origin, uc)
                n.cancel_scope.cancel()
        finally:
            for s in (mc, uc):
                if s is not None:
                    s.close()
            self.counters["lbtrm_streams_ended"] += 1
            per_link[st.advert_id] -= 1
            if per_link[st.advert_id] <= 0:
                del per_link[st.advert_id]
            if not per_link:
                self._far.pop(id(link), None)
            if st.accepted.is_set():
                self._close(link, st)
            link.state.pop(st.sid, None)

    async def _group_up(self, link: Link, st: StreamState, origin: RmOrigin, mc, scope) -> None:
        """The source's session from its group to the peer."""
        while not (st.closed or link.closed):
            batch = await receive(mc, self.counters, "lbtrm_recv_error")
            if batch is None:
                scope.cancel()
                return
            sent = False
            now = trio.current_time()
            for data, src in batch:
                out = origin.from_group(data, src, now)
                if out is not None:
                    sent = self._datagram(link, st, out) or sent
            if sent:
                link.flush_streams()
        scope.cancel()

    async def _naks_down(self, link: Link, st: StreamState, origin: RmOrigin, uc) -> None:
        """NAKs from the peer to the source."""
        while not (st.closed or link.closed):
            await st.incoming_ready.wait()
            st.incoming_ready = trio.Event()
            while st.incoming:
                nak = origin.nak_to_source(st.incoming.popleft())
                if nak is None:
                    continue
                if origin.nak_address[0] == "0.0.0.0" or not origin.nak_address[1]:
                    self.counters["lbtrm_nak_no_address"] += 1  # a TIR without the source's address
                    continue
                await _send(uc, nak, origin.nak_address, self.counters)

    # --------------------------------------------------------------- common

    def _state(self, link: Link, sid: int) -> StreamState:
        st = link.state[sid] = StreamState(sid, LBTRM)
        st.incoming = DatagramQueue(self.queue_limit, self.counters, "lbtrm_queue_full")
        st.owns_sock = False  # the sockets are this module's
        return st

    def _datagram(self, link: Link, st: StreamState, data: bytes) -> bool:
        try:
            link.streams.send_datagram(st.sid, data)
        except S.LocalStreamError:
            self.counters["lbtrm_send_closed"] += 1
            return False
        return True

    @staticmethod
    def _close(link: Link, st: StreamState) -> None:
        st.closed = True
        link.close_stream(st)
