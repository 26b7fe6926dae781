"""The router's data relay on trio, for one endpoint on one link: the proxies'
relay ports, the proxy listeners on the near side, and the dispatch of
proxies and of the streams the peer opens to the relay of their transport,
by one table (:data:`RELAYS`, keyed (LBMR transport code, the endpoint's
mode); every relay implements :class:`router.relays.interface.TransportRelay`,
whose docstring states the lifecycle).

Near side: a proxy (:meth:`Relay.serve_proxy`) binds at the relay address
for one of the peer's advertisements and its relay serves it: TCP receivers
share one stream of the proxy on the current link (fan-out,
:mod:`router.relays.tcp_fanout`), LBT-RU receivers one LBT-RU proxy source
(:mod:`router.relays.lbtru_fanout`), LBT-RM has its proxies and sources in
:mod:`router.relays.lbtrm`, or, with ``fanout="off"``, every TCP connection
opens a stream (:mod:`router.relays.tcp_streams`), as does every LBT-RU receiver
address (:mod:`router.relays.lbtru_streams`; also when the peer does not know LBT-RU
sessions). Far side: a stream the peer opens (:meth:`Relay.stream_event`)
goes to the relay that takes its kind: it joins the session's one
connection to the real source of our advertisement (fan-out) or connects to
it; a source that cannot be reached refuses the stream. Relay ports come
from the endpoint's range, round robin, with a quarantine shared by every
link of the endpoint (:class:`PortPool`).
"""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Callable, Iterator

import trio

from .. import peerlink as P
from ..core.lbtru_window import WindowBudget
from ..core.request_maps import RequesterTable
from ..core.tr import relay_transport
from ..link import Link
from ..peerlink import streams as S
from .interface import (
    LBTRM,
    LBTRU,
    PORT_QUARANTINE,
    TCP,
    Mode,
    RelayContext,
    RelaySettings,
    RelayTable,
    TransportRelay,
    Upstreams,
    far_table,
    near_relay,
)
from .lbtrm import RmRelay
from .lbtru_fanout import RuSessionRelay, ru_socket, udp_raw
from .lbtru_streams import (
    RU_BACKLOG,
    RU_BATCH,
    RU_IDLE_TIMEOUT,
    RU_MAX_STREAMS,
    RuStreamRelay,
    drain,
)
from .recovery import RecoveryRelay
from .responses import RequestListeners, ResponseRelay
from .tcp_fanout import FanoutRelay
from .tcp_streams import TX_DEPTH, TcpStreamRelay

__all__ = ["Relay", "RELAYS", "PortPool", "PORT_QUARANTINE", "RU_BACKLOG", "RU_BATCH", "RU_IDLE_TIMEOUT",
           "RU_MAX_STREAMS", "TX_DEPTH", "drain"]

#: The relay of a proxy of an LBMR transport under the endpoint's mode
#: (:mod:`router.relays.interface`: the interface, and how a stream the peer opens
#: finds its relay). LBT-RM relays one way whatever the mode.
RELAYS: dict[tuple[int, Mode], type[TransportRelay]] = {
    (TCP, Mode.FANOUT): FanoutRelay,
    (TCP, Mode.PER_CONNECTION): TcpStreamRelay,
    (LBTRU, Mode.FANOUT): RuSessionRelay,
    (LBTRU, Mode.PER_CONNECTION): RuStreamRelay,
    (LBTRM, Mode.FANOUT): RmRelay,
    (LBTRM, Mode.PER_CONNECTION): RmRelay,
}


class PortPool:
    """Relay ports in use and in quarantine, shared by every link of one endpoint
    portal (their proxies bind in the same range: a port one gives up stays in
    quarantine for all of them); and the portal's upstream TCP and LBT-RU
    sessions (one connection to each origin session, whichever link's
    streams it feeds), and the requesters those sessions' requests named
    (``requesters``: where a RESPONSE stream of any link may go)."""

    __slots__ = ("released", "in_use", "upstreams", "ru_upstreams", "requesters")

    def __init__(self) -> None:
        self.released: dict[int, float] = {}  # relay port -> when its proxy gave it up
        self.in_use: set[int] = set()  # relay ports our proxies hold
        self.upstreams = Upstreams()
        self.ru_upstreams = Upstreams()
        self.requesters = RequesterTable()


class Relay:
    """The data relay of one endpoint on one link. ``settings``: the
    endpoint's (:class:`router.relays.interface.RelaySettings`); ``counters``
    and ``event(kind, detail)``: the router's counters and event log;
    ``site``: the router around it (:class:`router.shell.relay_site.RelaySite`: the
    link up now, the sources behind our advertisements, our proxies' live
    advertisements, and where a session's end is reported); ``pool``: the
    relay ports and upstream sessions it shares with the endpoint's other
    links (default: its own). It holds one relay of each class of
    :data:`RELAYS` (``relays``, keyed as that table) and chooses among them."""

    def __init__(self, settings: RelaySettings, counters: Counter[str], event: Callable[[str, str], None], site,
                 pool: PortPool | None = None) -> None:
        pool = pool if pool is not None else PortPool()
        self.settings = settings
        self.site = site
        self.counters = counters
        self.event = event
        self._released = pool.released  # relay port -> when its proxy gave it up
        self._in_use = pool.in_use  # relay ports our proxies hold
        self._next_port = 0  # where the round robin over the range goes on
        self.requests = RequestListeners(settings.request_ip, counters, event, site)
        self.responses = ResponseRelay(pool.requesters, settings.request_ip, counters, event)
        self.recovery = RecoveryRelay(settings.request_ip, counters, event, site)
        context = RelayContext(settings, counters, event, site, pool.upstreams, pool.ru_upstreams, WindowBudget(),
                               self.requests, self.responses)
        instances = {cls: cls(context) for cls in dict.fromkeys(RELAYS.values())}
        self.relays: RelayTable = {key: instances[cls] for key, cls in RELAYS.items()}
        self._far = far_table(self.relays, settings.mode)  # stream kind -> the relay that accepts it
        self._far[P.StreamKind.RESPONSE] = self.responses
        self._far[P.StreamKind.RECOVERY] = self.recovery
        self._serving: dict[int, TransportRelay] = {}  # proxy id -> the relay of its proxy

    @property
    def lbtrm(self) -> RmRelay:
        """The LBT-RM relay."""
        return self.relays[LBTRM, self.settings.mode]

    def receivers_of(self, proxy_id: int) -> list[dict]:
        """The receivers of proxy ``proxy_id``, from the relay serving it
        (:meth:`router.relays.interface.TransportRelay.receivers_of`)."""
        relay = self._serving.get(proxy_id)
        return relay.receivers_of(proxy_id) if relay is not None else []

    def relay_ports(self) -> Iterator[int]:
        """The relay ports to try, in order: round robin over the range from the
        one after the last taken, ports out of quarantine first, then the
        quarantined ones, longest released first. Lazy, and the quarantine is
        kept in release order, so taking a port costs about the ports skipped,
        not the size of the range (thousands of proxies bind one after the other)."""
        e = self.settings
        if e.relay_port_low == 0:
            yield 0
            return
        cutoff = trio.current_time() - e.port_quarantine
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
        (LBT-RU), with the relay :data:`RELAYS` names for its transport and
        the endpoint's mode (:func:`router.relays.interface.near_relay`). A new
        stream names the advert id the site gives for the proxy (a live
        advertisement of the session; None: the receiver is refused)."""
        e = self.settings
        relay = near_relay(self.relays, f.transport, e.mode, self.site.link)
        sock = self._bind_relay(relay.SOCKET_TYPE)
        if sock is None:
            self.counters["relay_ports_exhausted"] += 1
            self.event("relay_ports_exhausted", f"no free relay port for {f.topic}")
            task_status.started(None)
            return
        bound = sock.getsockname()[1]
        self._serving[f.advert_id] = relay
        try:
            with sock:
                await relay.serve_proxy(f, sock, task_status)
        finally:
            if self._serving.get(f.advert_id) is relay:
                del self._serving[f.advert_id]
            self._in_use.discard(bound)
            if e.relay_port_low:
                self._released.pop(bound, None)  # to the end: the dict is in release order
                self._released[bound] = trio.current_time()

    def _bind_relay(self, socket_type: int):
        """A listener (``SOCK_STREAM``) or socket (``SOCK_DGRAM``) bound at the
        relay address on the first port of :meth:`relay_ports` that is free,
        or None. Synchronous: proxies started together never race for the
        same port (the bind storm of a thousand proxies on one port after the
        other took 30 s)."""
        e = self.settings
        tcp = socket_type == socket.SOCK_STREAM
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
        one its relay chose (LBT-RM: the proxy's group, port and session id;
        fanned-out LBT-RU: the proxy's session id), else the relay address
        (with the origin's session id when the peer said it: the proxy's
        receivers get the origin's session)."""
        relay = self._serving.get(f.advert_id)
        body = relay.advertised_transport(f.advert_id) if relay is not None else None
        if body is not None:
            return body
        return relay_transport(f.transport, address[0], address[1], f.origin_session_id or None)

    # ------------------------------------------------- far side: sources

    def stream_event(self, link: Link, ev) -> None:
        """A stream event of the peer on ``link``: a stream opened for one of our
        advertisements goes to the relay that takes its kind
        (:func:`router.relays.interface.far_table`; refused when the
        advertisement is unknown or withdrawn); the other events update the
        state of the stream they are for (the one stream lifecycle of every relay)."""
        st = link.state.get(ev.stream_id)
        if isinstance(ev, S.StreamOpened):
            body = self.site.advert_source(ev.advert_id)
            if body is None:
                link.streams.refuse(ev.stream_id, P.RefuseCode.REFUSED, "unknown or withdrawn advertisement")
                self.counters["streams_refused"] += 1
                return
            relay = self._far.get(ev.kind)
            if relay is None:
                link.streams.refuse(ev.stream_id, P.RefuseCode.UNSUPPORTED_KIND, f"stream kind {ev.kind:#04x}")
                self.counters["streams_refused"] += 1
                return
            relay.open_far(link, ev, body)
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
        elif isinstance(ev, S.DataReceived):
            st.take_data(ev.data, ev.whole)
        elif isinstance(ev, S.DatagramReceived):
            st.incoming.append(ev.data)
            st.incoming_ready.set()
        elif isinstance(ev, S.CreditAvailable):
            st.credit.set()
        elif isinstance(ev, S.StreamClosed):
            st.closed = True
            st.wake()
