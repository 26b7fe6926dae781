"""The one interface of the router's transport relays (:class:`TransportRelay`),
their typed settings (:class:`RelaySettings`), what each is given
(:class:`RelayContext`), and how the table of relays chooses one
(:data:`router.relays.endpoint_relay.RELAYS`, :func:`near_relay`, :func:`far_table`).

Five relays move a TRD's transport sessions across a peer link: TCP fanned
out (:class:`router.relays.tcp_fanout.FanoutRelay`), TCP one stream per receiver
connection (:class:`router.relays.tcp_streams.TcpStreamRelay`), LBT-RU fanned out
(:class:`router.relays.lbtru_fanout.RuSessionRelay`), LBT-RU one stream per receiver
address (:class:`router.relays.lbtru_streams.RuStreamRelay`) and LBT-RM
(:class:`router.relays.lbtrm.RmRelay`). :class:`router.relays.endpoint_relay.Relay` holds one
of each for one endpoint on one link and, for a proxy or a stream, asks the
table which one serves it: keyed by (LBMR transport code, :class:`Mode`),
the mode being the endpoint's ``fanout`` setting. A fan-out relay that cannot
serve a link (LBT-RU sessions with a peer that does not know them,
:meth:`TransportRelay.serves`) gives way to the per-connection relay of its
transport; LBT-RM has one relay for both modes.

Lifecycle, and what each step may assume and must guarantee:

1. **construction**, once per endpoint and link: ``cls(context)``
   (:class:`RelayContext`: the settings, the router's counters and event log,
   the relay site, the endpoint's shared upstream tables). No I/O.
2. **bind** (by :class:`router.relays.endpoint_relay.Relay`): a socket of the relay's
   :attr:`TransportRelay.SOCKET_TYPE` (``SOCK_STREAM``: a trio socket not yet
   listening; ``SOCK_DGRAM``: a trio UDP socket with the underlying
   non-blocking ``raw`` socket), bound at the relay address on a port of the
   endpoint's range. The relay never binds a proxy's socket itself.
3. **serve_proxy(advert, sock, task_status)**: the near side of one proxy
   (proxy id: ``advert.advert_id``). It may assume ``sock`` is bound and
   that :class:`Relay` closes it after the call returns (however it
   returns). It must call ``task_status.started((ip, port))`` exactly once,
   as soon as receivers may use the socket and (when the relay advertises a
   transport of its own, :meth:`TransportRelay.advertised_transport`) that
   transport is known; then serve the proxy's receivers until cancelled. It
   opens its streams on the site's current link (``site.link``: None while
   the link is down) for the advertisement ``site.proxy_advert(proxy_id)``
   names (None: no live advertisement, nothing to open).
4. **open_far(link, event, origin)**: the far side. The peer opened stream
   ``event`` (:class:`router.peerlink.streams.StreamOpened`) on ``link`` for
   one of our advertisements whose source is ``origin`` (its LBMR transport
   body; :class:`Relay` has refused the stream already when there is none).
   Synchronous and never blocking: it either refuses the stream at once, or
   registers its :class:`router.link.StreamState` in ``link.state`` and
   starts a task in ``link.nursery`` that accepts or refuses it when the
   source is reached and, whatever happens, takes the state out of
   ``link.state`` when the stream ends. A source that is gone for good is
   reported with ``site.session_ended(advert_id)``.
5. **stream events**: the peer's acceptances, refusals, data, credit and
   closes of a stream update its :class:`StreamState` (one place for every
   relay, :meth:`Relay.stream_event`): the relay's tasks wait on its events
   (``accepted``, ``incoming_ready``, ``credit``) and look at ``closed``.
6. **close**: a proxy ends when its ``serve_proxy`` task is cancelled (its
   streams are closed towards the peer on the way out); a far stream ends
   with the peer's close, the source's end or the link (the link's nursery
   cancels its task). Every stream a relay opened or accepted is closed
   with ``link.close_stream`` however it ends.

Settings are read from the parsed endpoint once (:meth:`RelaySettings.of`);
the relays read nothing else of the endpoint.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, ClassVar

import trio

from .. import peerlink as P
from ..config.model import (
    DEFAULT_LBTRM_DEST_PORT,
    DEFAULT_LBTRM_GROUPS,
    DEFAULT_MULTICAST_TTL,
    DEFAULT_RU_IDLE_TIMEOUT_MS,
    DEFAULT_RU_MAX_STREAMS,
    EndpointConfig,
    LbtrmConfig,
)
from ..core.fanout import DEFAULT_MAX_QUEUE, DEFAULT_STALL_TIMEOUT
from ..core.lbtru_window import WindowBudget
from ..core.message_path import Rule
from ..peerlink import streams as S

if TYPE_CHECKING:
    from ..link import Link, StreamState
    from ..peerlink.streams import StreamOpened
    from ..shell.relay_site import RelaySite
    from .responses import RequestListeners, ResponseRelay

__all__ = ["TransportRelay", "RelaySettings", "RelayContext", "RelayTable", "Upstreams", "Mode", "near_relay",
           "far_table", "accept_stream", "refuse_stream", "PORT_QUARANTINE", "TCP", "LBTRU", "LBTRM"]

#: the LBMR transport codes of the relayed transports (the peer-link stream kinds of
#: the per-connection relays and of LBT-RM are the same numbers)
TCP, LBTRU, LBTRM = P.StreamKind.TCP, P.StreamKind.LBTRU, P.StreamKind.LBTRM

# A relay port given up by a proxy is not given to another proxy for this long
# (a TIR lives 60 s: receivers that resolved the old proxy may still connect),
# unless every other port of the range is taken.
PORT_QUARANTINE = 60.0
_LBTRM = LbtrmConfig()  # its defaults


class Mode(Enum):
    """How an endpoint relays a TCP or LBT-RU session (its ``fanout`` setting)."""

    FANOUT = "fanout"  # one source connection per router, one stream per proxy per link
    PER_CONNECTION = "per-connection"  # one stream per receiver connection (TCP) or address (LBT-RU)


@dataclass(frozen=True, slots=True)
class RelaySettings:
    """What the relays of one endpoint read of its configuration. Addresses
    are dotted quads, ports host integers, times seconds, sizes bytes.

    ``relay_ip``, ``relay_port_low``/``high``: where proxies bind (0, 0: any
    free port); ``port_quarantine``: how long a port given up stays out of
    the round robin; ``fanout``: TCP and LBT-RU sessions fanned out;
    ``fanout_max_queue``/``fanout_stall_timeout``: a fanned-out TCP sink's
    queue and how long it may take nothing; ``ru_idle_timeout`` and
    ``ru_max_streams``: a per-address LBT-RU stream's silence limit and how
    many run on a link (also the bound on LBT-RU upstream sessions);
    ``lbtrm_*``: the LBT-RM proxies' groups, destination port, queues and
    far streams, and whether they re-publish as LBT-RU (``lbtrm_proxy_transport``
    "lbt-ru", at most ``lbtrm_max_clients`` receivers each);
    ``request_ip``: where request listeners bind, the address rewritten requests
    name (the relay interface, else the ``<uim>`` one, else the TR one; "0.0.0.0":
    none known, requests pass unchanged);
    ``multicast_ttl``: of what LBT-RM proxies send; ``downstream_rules`` /
    ``upstream_rules``: the rewrites of the message path
    (:mod:`router.core.message_path`; none: messages pass as they are)."""

    relay_ip: str = "0.0.0.0"
    request_ip: str = "0.0.0.0"
    relay_port_low: int = 0
    relay_port_high: int = 0
    port_quarantine: float = PORT_QUARANTINE
    fanout: bool = True
    fanout_max_queue: int = DEFAULT_MAX_QUEUE
    fanout_stall_timeout: float = DEFAULT_STALL_TIMEOUT
    ru_idle_timeout: float = DEFAULT_RU_IDLE_TIMEOUT_MS / 1000
    ru_max_streams: int = DEFAULT_RU_MAX_STREAMS
    lbtrm_group_low: str = DEFAULT_LBTRM_GROUPS[0]
    lbtrm_group_high: str = DEFAULT_LBTRM_GROUPS[1]
    lbtrm_dest_port: int = DEFAULT_LBTRM_DEST_PORT
    lbtrm_same_group: bool = False
    lbtrm_proxy_transport: str = _LBTRM.transport
    lbtrm_max_clients: int = _LBTRM.max_clients
    lbtrm_queue_limit: int = 4096  # datagrams waiting per LBT-RM stream and direction
    lbtrm_max_streams: int = 256  # far side: LBT-RM streams (joined groups) per link
    multicast_ttl: int = DEFAULT_MULTICAST_TTL
    downstream_rules: tuple[Rule, ...] = ()
    upstream_rules: tuple[Rule, ...] = ()

    @property
    def mode(self) -> Mode:
        return Mode.FANOUT if self.fanout else Mode.PER_CONNECTION

    @classmethod
    def of(cls, e: EndpointConfig) -> RelaySettings:
        """The settings of the parsed endpoint ``e``."""
        request_ip = next((ip for ip in (e.relay_ip, (e.request_address or ("0.0.0.0",))[0], e.tr_ip)
                           if ip != "0.0.0.0"), "0.0.0.0")
        return cls(relay_ip=e.relay_ip, request_ip=request_ip, relay_port_low=e.relay_port_low, relay_port_high=e.relay_port_high,
                   fanout=e.fanout, fanout_max_queue=e.fanout_max_queue,
                   fanout_stall_timeout=e.fanout_stall_timeout_ms / 1000,
                   ru_idle_timeout=e.ru_idle_timeout, ru_max_streams=e.ru_max_streams,
                   lbtrm_group_low=e.lbtrm_group_low or DEFAULT_LBTRM_GROUPS[0],
                   lbtrm_group_high=e.lbtrm_group_high or DEFAULT_LBTRM_GROUPS[1],
                   lbtrm_dest_port=e.lbtrm_dest_port, lbtrm_same_group=e.lbtrm_same_group,
                   lbtrm_proxy_transport=e.lbtrm_proxy_transport, lbtrm_max_clients=e.lbtrm_max_clients,
                   multicast_ttl=e.multicast_ttl)


class Upstreams(dict):
    """The endpoint's upstream sessions of one transport (TCP:
    :mod:`router.relays.tcp_fanout`, LBT-RU: :mod:`router.relays.lbtru_fanout`), origin
    (ip, port, session id) -> its upstream, shared by the relays of all its
    links. ``nursery``: where their tasks run (the router's: a session
    outlives the link whose stream opened it, while streams of other links
    use it); None: the opening link's."""

    nursery: trio.Nursery | None = None


@dataclass(frozen=True, slots=True)
class RelayContext:
    """What every transport relay of one endpoint on one link is given:
    ``settings``; ``counters`` and ``event(kind, detail)``, the router's
    counters and event log; ``site``, the router around it
    (:class:`router.shell.relay_site.RelaySite`); ``upstreams`` and
    ``ru_upstreams``, the endpoint's TCP and LBT-RU upstream sessions
    (shared by its links); ``window_budget``, the retransmission windows of
    the LBT-RU proxies of the relay (LBT-RU and LBT-RM origins together);
    ``requests``, the request listeners of the relay's proxies (receivers'
    side), and ``responses``, the relay's origin side of RESPONSE streams
    (:mod:`router.relays.responses`)."""

    settings: RelaySettings
    counters: Counter[str]
    event: Callable[[str, str], None]
    site: RelaySite
    upstreams: Upstreams
    ru_upstreams: Upstreams
    window_budget: WindowBudget
    requests: RequestListeners
    responses: ResponseRelay


class TransportRelay(ABC):
    """One transport's relay for one endpoint on one link (module doc: the
    lifecycle). ``SOCKET_TYPE``: the socket a proxy is bound on;
    ``STREAM_KIND``: the peer-link stream kind its near side opens and its far
    side accepts."""

    SOCKET_TYPE: ClassVar[int]
    STREAM_KIND: ClassVar[int]

    def __init__(self, context: RelayContext) -> None:
        self.context = context
        self.settings = context.settings
        self.counters = context.counters
        self.event = context.event
        self.site = context.site

    def serves(self, link: Link | None) -> bool:
        """Whether a new proxy of this relay can run over ``link`` (the link
        up now, or None): else the per-connection relay of the transport
        serves it."""
        return True

    @abstractmethod
    async def serve_proxy(self, advert: P.Advertisement, sock, task_status) -> None:
        """The near side of the proxy of ``advert`` on ``sock`` (module doc, step 3)."""

    @abstractmethod
    def open_far(self, link: Link, ev: StreamOpened, origin) -> None:
        """The far side of the peer's stream ``ev`` for the source ``origin`` (module doc, step 4)."""

    def advertised_transport(self, advert_id: int):
        """The transport body the proxy of ``advert_id`` advertises when the
        relay chose one (its own session id, group, ...); None: the relay
        address (:func:`router.core.tr.relay_transport`)."""
        return None

    def receivers_of(self, advert_id: int) -> list[dict]:
        """The receivers of the proxy of ``advert_id`` as the operators' page
        shows them (``peer``, ``queued_bytes``, ``dropped_messages``,
        ``dropped_bytes``); empty where the relay keeps no such view."""
        return []


# ------------------------------------------------------------------ the table
# (the table itself, (transport, mode) -> relay class, is :data:`router.relays.endpoint_relay.RELAYS`:
# it names every relay, and the relays import this module)

RelayTable = dict[tuple[int, Mode], TransportRelay]


def near_relay(table: RelayTable, transport: int, mode: Mode, link: Link | None) -> TransportRelay:
    """The relay of ``table`` (instances keyed (LBMR transport code, mode))
    that serves a new proxy of ``transport`` under ``mode`` over ``link``:
    the table's, or the per-connection one of the transport when that is a
    fan-out relay that cannot serve the link. KeyError for a transport the
    router does not relay."""
    relay = table[transport, mode]
    if not relay.serves(link):
        relay = table[transport, Mode.PER_CONNECTION]
    return relay


def far_table(table: RelayTable, mode: Mode) -> dict[int, TransportRelay]:
    """Which relay of ``table`` accepts a stream the peer opens, by stream
    kind: the one whose near side opens that kind; where two do (TCP: fanned
    out or not, the near router's choice), the one of our endpoint's ``mode``."""
    far: dict[int, TransportRelay] = {}
    for (_, m), relay in table.items():
        if relay.STREAM_KIND not in far or m is mode:
            far[relay.STREAM_KIND] = relay
    return far


def accept_stream(link: Link, st: StreamState, counters: Counter[str]) -> bool:
    """Accept the peer's stream ``st`` now that its source is there; False if the
    peer closed it meanwhile (a STREAM_CLOSE right behind the STREAM_OPEN)."""
    if st.closed:
        counters["streams_closed_before_accept"] += 1
        return False
    try:
        link.streams.accept(st.sid)
    except S.LocalStreamError:
        counters["streams_closed_before_accept"] += 1
        return False
    link.flush_streams()
    st.accepted.set()
    counters["streams_accepted"] += 1
    return True


def refuse_stream(link: Link, st: StreamState, reason: str, counters: Counter[str],
                  event: Callable[[str, str], None]) -> None:
    """Refuse the peer's stream ``st`` (its source cannot be had), counted and logged."""
    counters["streams_refused"] += 1
    event("stream_refused", reason)
    try:
        link.streams.refuse(st.sid, P.RefuseCode.REFUSED, reason)
    except S.LocalStreamError:
        pass
    link.flush_streams()
