"""The router's data relay on trio, for one endpoint on one link: the proxies'
relay ports, the proxy listeners on the near side, and the dispatch of the
streams the peer opens on the far side to the relay of their transport.

Near side: a proxy (:meth:`Relay.serve_proxy`) listens at the relay address
for one of the peer's advertisements; TCP receivers share one stream of the
proxy on the current link (fan-out, :mod:`router.fanout_relay`), LBT-RU
receivers one LBT-RU proxy source (:mod:`router.lbtru_relay`), LBT-RM has
its proxies and sources in :mod:`router.lbtrm_relay`, or, with
``fanout="off"``, every TCP connection opens a stream
(:mod:`router.relay_tcp`), as does every LBT-RU receiver address
(:mod:`router.relay_ru`). Far side: a stream the peer opens
(:meth:`Relay.stream_event`) joins the session's one connection to the real
source of our advertisement (fan-out) or connects to it; a source that cannot
be reached refuses the stream. Relay ports come from the endpoint's range,
round robin, with a quarantine shared by every link of the endpoint
(:class:`PortPool`).
"""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Callable, Iterator

import trio

from . import peerlink as P
from .core.tr import relay_transport
from .fanout_relay import FanoutRelay, Upstreams
from .lbtrm_relay import LBTRM, RmRelay
from .lbtru_relay import RuSessionRelay, ru_socket, udp_raw
from .link import Link
from .peerlink import streams as S
from .relay_ru import RU_BACKLOG, RU_BATCH, RU_IDLE_TIMEOUT, RU_MAX_STREAMS, RuStreamRelay, drain
from .relay_tcp import TX_DEPTH, TcpStreamRelay

__all__ = ["Relay", "PortPool", "PORT_QUARANTINE", "RU_BACKLOG", "RU_BATCH", "RU_IDLE_TIMEOUT",
           "RU_MAX_STREAMS", "TX_DEPTH", "drain"]

# A relay port given up by a proxy is not given to another proxy for this long
# (a TIR lives 60 s: receivers that resolved the old proxy may still connect),
# unless every other port of the range is taken.
PORT_QUARANTINE = 60.0


class PortPool:
    """Relay ports in use and in quarantine, shared by every link of one endpoint
    portal (their proxies bind in the same range: a port one gives up stays in
    quarantine for all of them); and the portal's upstream TCP and LBT-RU
    sessions (one connection to each origin session, whichever link's
    streams it feeds)."""

    def __init__(self) -> None:
        self.released: dict[int, float] = {}  # relay port -> when its proxy gave it up
        self.in_use: set[int] = set()  # relay ports our proxies hold
        self.upstreams = Upstreams()
        self.ru_upstreams = Upstreams()


class Relay:
    """The data relay of one endpoint on one link. ``endpoint``: its settings
    (``relay_ip``, ``relay_port_low``/``high``); ``counters`` and ``event(kind,
    detail)``: the router's counters and event log; ``site``: the router
    around it (:class:`router.relay_site.RelaySite`: the link up now, the
    sources behind our advertisements, our proxies' live advertisements, and
    where a session's end is reported)."""

    def __init__(self, endpoint, counters: Counter[str], event: Callable[[str, str], None], site) -> None:
        self.endpoint = endpoint
        self.site = site
        self.counters = counters
        self.event = event
        self.port_quarantine = getattr(endpoint, "relay_port_quarantine", PORT_QUARANTINE)
        self._released: dict[int, float] = {}  # relay port -> when its proxy gave it up
        self._next_port = 0  # where the round robin over the range goes on
        self._in_use: set[int] = set()  # relay ports our proxies hold
        self.tcp = TcpStreamRelay(counters, event, site)  # TCP, one stream per connection
        self.ru = RuStreamRelay(endpoint, counters, event, site)  # LBT-RU, one stream per receiver
        self.lbtrm = RmRelay(endpoint, counters, event, site)  # LBT-RM proxies and sources
        # TCP sessions: fanned out (one source connection per router, one stream per
        # proxy per link) unless the endpoint says fanout="off"
        self.fanout = FanoutRelay(endpoint, counters, event, site, Upstreams()) \
            if getattr(endpoint, "fanout", True) else None
        # LBT-RU sessions: fanned out likewise (one upstream receiver per router, one proxy
        # source per proxy) unless fanout="off" or the peer does not know LBTRU_SESSION
        self.rufan = RuSessionRelay(endpoint, counters, event, site, Upstreams(),
                                    self.lbtrm.window_budget)

    def share_ports(self, pool: PortPool) -> None:
        """Use ``pool``'s in-use and quarantine tables and upstream sessions
        (shared with other relays)."""
        self._released = pool.released
        self._in_use = pool.in_use
        if self.fanout is not None:
            self.fanout.upstreams = pool.upstreams
        self.rufan.upstreams = pool.ru_upstreams

    def relay_ports(self) -> Iterator[int]:
        """The relay ports to try, in order: round robin over the range from the
        one after the last taken, ports out of quarantine first, then the
        quarantined ones, longest released first. Lazy, and the quarantine is
        kept in release order, so taking a port costs about the ports skipped,
        not the size of the range (thousands of proxies bind one after the other)."""
        e = self.endpoint
        if e.relay_port_low == 0:
            yield 0
            return
        cutoff = trio.current_time() - self.port_quarantine
        released = self._released
        while released:  # oldest first: end of quarantine
            port, t = next(iter(released.items()))
            if t > cutoff:
                break
            del released[port]
        ports = range(e.relay_port_low, e.relay_port_high + 1)
        k = self._next_port % len(ports)
        for i in range(len(ports)):
            p = ports[(k + i) % len(ports)]
            if p not in released and p not in self._in_use:
                yield p
        yield from [p for p in released if p in ports]

    async def serve_proxy(self, f: P.Advertisement, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """A proxy source (proxy id: the advert id of ``f``): a listener at the
        relay address for the peer's advertisement ``f`` (and the other topics
        of its transport session). Reports its (ip, port) through
        ``task_status`` once bound (None when no relay port is free; it then
        returns), then relays every receiver that connects (TCP) or registers
        (LBT-RU). A new stream names the advert id the site gives for the
        proxy (a live advertisement of the session; None: the receiver is
        refused)."""
        e = self.endpoint
        tcp = f.transport == 0x00
        sock = self._bind_relay(tcp)
        if sock is None:
            self.counters["relay_ports_exhausted"] += 1
            self.event("relay_ports_exhausted", f"no free relay port for {f.topic}")
            task_status.started(None)
            return
        bound = sock.getsockname()[1]
        try:
            await self._serve_proxy_socket(f, sock, tcp, task_status)
        finally:
            self._in_use.discard(bound)
            if e.relay_port_low:
                self._released.pop(bound, None)  # to the end: the dict is in release order
                self._released[bound] = trio.current_time()

    def _bind_relay(self, tcp: bool):
        """A listener (TCP) or socket (LBT-RU) bound at the relay address on the
        first port of :meth:`relay_ports` that is free, or None. Synchronous:
        proxies started together never race for the same port (the bind storm
        of a thousand proxies on one port after the other took 30 s)."""
        e = self.endpoint
        for port in self.relay_ports():
            if port in self._in_use:
                continue
            raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM) if tcp else udp_raw()
            try:
                if tcp:
                    raw.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                raw.bind((e.relay_ip, port))
            except OSError:
                raw.close()
                continue
            bound = raw.getsockname()[1]
            self._in_use.add(bound)
            if e.relay_port_low:
                if self._released.pop(bound, None) is not None:
                    self.counters["relay_port_quarantine_cut"] += 1
                self._next_port = bound - e.relay_port_low + 1
            return trio.socket.from_stdlib_socket(raw) if tcp else ru_socket(raw)
        return None

    def proxy_transport(self, f: P.Advertisement, address):
        """The transport a proxy for ``f`` bound at ``address`` advertises: the
        relay address (with the origin's session id when the peer said it: the
        proxy's receivers get the origin's session), and for LBT-RM the proxy's
        group, port and session id."""
        body = self.lbtrm.proxy_body(f.advert_id) if f.transport == LBTRM else self.rufan.bodies.get(f.advert_id)
        if body is not None:
            return body
        return relay_transport(f.transport, address[0], address[1], f.origin_session_id or None)

    async def _serve_proxy_socket(self, f: P.Advertisement, sock, tcp: bool, task_status) -> None:
        pid = f.advert_id
        if f.transport == LBTRM:
            with sock:
                await self.lbtrm.serve_proxy(f, sock, task_status)
            return
        if not tcp and self.fanout is not None and self.rufan.wants(self.site.link):
            with sock:
                await self.rufan.serve_proxy(f, sock, task_status)
            return
        with sock:
            if tcp:
                sock.listen(64)
            task_status.started(sock.getsockname())
            if tcp and self.fanout is not None:
                await self.fanout.serve_tcp(sock, pid)
            elif tcp:
                await self.tcp.serve_proxy(pid, sock)
            else:
                await self.ru.serve_proxy(pid, sock)

    # ------------------------------------------------- far side: sources

    def stream_event(self, link: Link, ev) -> None:
        """A stream event of the peer on ``link``: a stream opened for one of our
        advertisements goes to the relay of its transport (refused when the
        advertisement is unknown or withdrawn); the other events update the
        state of the stream they are for."""
        st = link.state.get(ev.stream_id)
        if isinstance(ev, S.StreamOpened):
            body = self.site.advert_source(ev.advert_id)
            if body is None:
                link.streams.refuse(ev.stream_id, P.RefuseCode.REFUSED, "unknown or withdrawn advertisement")
                self.counters["streams_refused"] += 1
                return
            if ev.kind == LBTRM:
                self.lbtrm.open_far(link, ev, body)
                return
            if ev.kind == P.StreamKind.TCP and self.fanout is not None:
                self.fanout.open_far(link, ev, body)
                return
            if ev.kind == P.StreamKind.LBTRU_SESSION:
                self.rufan.open_far(link, ev, body)
                return
            if ev.kind == P.StreamKind.TCP:
                self.tcp.open_far(link, ev, body)
            else:
                self.ru.open_far(link, ev, body)
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
