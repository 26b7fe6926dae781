"""lbmr-router's settings: the immutable dataclasses that
:func:`router.config.load_config` returns and the running router reads (the
one settings type of the daemon: :class:`router.shell.router.MultiRouter` takes a
:class:`RouterConfig`, each portal link its :class:`EndpointConfig` and
:class:`PeerConfig`), and the defaults.

Fields hold times in milliseconds and sizes in bytes, as in the DRO's file;
the read-only properties the runtime uses give the same values in seconds
(``source_deletion_delay``, ``reconnect_interval`` ...) and interfaces as the
address to bind (``tr_ip``, ``relay_ip``, ``listen_ip``).

Embedding the router (and the tests) build settings without a file with
:func:`lbmrd_endpoint`, :func:`multicast_endpoint`, :func:`initiator_peer`,
:func:`acceptor_peer` and :func:`router_config`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from lbmr_runtime.netif import resolve_interface

from ..core.acl import OPEN, PortalAcl
from ..core.fanout import DEFAULT_MAX_QUEUE as DEFAULT_FANOUT_MAX_QUEUE
from ..core.fanout import DEFAULT_STALL_TIMEOUT as _FANOUT_STALL_S

DEFAULT_STATS_INTERVAL_MS = 60000
DEFAULT_MULTICAST_GROUP = "224.9.10.11"  # UM resolver_multicast_address
DEFAULT_MULTICAST_PORT = 12965  # UM resolver_multicast_port
DEFAULT_LBMRD_PORT = 15380  # lbmrd -p default
DEFAULT_SOURCE_DELETION_DELAY_MS = 1000
DEFAULT_RECONNECT_INTERVAL_MS = 5000
DEFAULT_KEEPALIVE_INTERVAL_MS = 5000
DEFAULT_KEEPALIVE_TIMEOUT_MS = 15000
DEFAULT_MAX_QUEUE = 8 << 20  # router/peerlink.py OutQueue(max_data_bytes)
MIN_MAX_QUEUE = 64 << 10  # below this the largest datagram (64 KiB) never fits
DEFAULT_MULTICAST_TTL = 16  # UM resolver_multicast_ttl
# Portal limits and timers not (yet) in the file: the values the router has always used.
DEFAULT_SOURCE_TIMEOUT_MS = 16000  # a proxied source with no TIR for this long is withdrawn
DEFAULT_REQUERY_INTERVAL_MS = 5000  # the portal queries its remote interest again this often
DEFAULT_RU_IDLE_TIMEOUT_MS = 10000  # an LBT-RU stream ends after this long without a datagram
DEFAULT_RU_MAX_STREAMS = 1024  # LBT-RU streams per link and side (the rest is for TCP)
DEFAULT_MAX_PROXIES = 4096  # proxies (one per source transport session) at once (also bounded by the fd limit)


@functools.lru_cache(maxsize=256)
def bind_address(spec: str | None, default: str) -> str:
    """The address to bind for an interface spec of the file (address, CIDR or
    device name; None = ``default``). Resolved once per process (cached):
    :exc:`lbmr_runtime.netif.InterfaceError` when no local interface matches."""
    return default if not spec else resolve_interface(spec)


# --------------------------------------------------------------------------- model


@dataclass(frozen=True, slots=True)
class PortRange:
    """An inclusive range of ports, ``low <= high``."""

    low: int
    high: int

    def __len__(self) -> int:
        return self.high - self.low + 1

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.low <= port <= self.high

    def __iter__(self):
        return iter(range(self.low, self.high + 1))

    def __str__(self) -> str:
        return f"{self.low}-{self.high}"


#: UM resolver_unicast_port_low/high: local ports of the unicast TR socket.
DEFAULT_TR_PORTS = PortRange(14402, 14406)
#: UM transport_tcp_port_low/high: ports of the relay (proxy source) listeners.
DEFAULT_RELAY_PORTS = PortRange(14371, 14390)
#: UM transport_lbtrm_multicast_address_low/high and transport_lbtrm_destination_port:
#: the groups and port of LBT-RM proxy sources
DEFAULT_LBTRM_GROUPS = ("224.10.10.10", "224.10.10.14")
DEFAULT_LBTRM_DEST_PORT = 14400


@dataclass(frozen=True, slots=True)
class LogConfig:
    """``<log>``: ``type`` is console, file or syslog; ``file`` only for type file.

    ``frequency`` (disable, daily, hourly) and ``size_mb`` (0 = no limit) roll
    the file, as in the DRO.
    """

    type: str = "console"
    file: str | None = None
    frequency: str = "disable"
    size_mb: int = 0


@dataclass(frozen=True, slots=True)
class MulticastResolver:
    """``<multicast>``: multicast topic resolution group and UDP port."""

    group: str = DEFAULT_MULTICAST_GROUP
    port: int = DEFAULT_MULTICAST_PORT
    line: int = field(default=0, compare=False)
    ttl: int = DEFAULT_MULTICAST_TTL  # hops of the TR datagrams the portal sends


@dataclass(frozen=True, slots=True)
class LbmrdAddress:
    """``<lbmrd>``: one unicast topic resolution daemon."""

    address: str
    port: int = DEFAULT_LBMRD_PORT
    line: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class InitialRequest:
    """``<initial-request>``: TR request burst at start (note: duration in seconds)."""

    periodic_interval_ms: int = 1000
    duration_s: int = 10


@dataclass(frozen=True, slots=True)
class RateLimit:
    """``<rate-limit>`` of a timing element, in the DRO's units: at most ``bps``
    *bits* a second and ``objects_per_second`` messages (use queries, interest
    refreshes) a second; 0 = no limit of that kind."""

    bps: int
    objects_per_second: int


#: The DRO's defaults: use queries 500,000 bits and 500 queries a second, interest
#: messages 500,000 bits a second (any number of them), domain route messages 50 a second.
USE_QUERY_RATE_LIMIT = RateLimit(500_000, 500)
INTEREST_RATE_LIMIT = RateLimit(500_000, 0)
DOMAIN_ROUTE_RATE_LIMIT = RateLimit(0, 50)


@dataclass(frozen=True, slots=True)
class UseQuery:
    """``<topic-use-query>`` / ``<pattern-use-query>`` (and its ``<rate-limit>``)."""

    timeout_ms: int = 3000
    max: int = 5
    periodic_interval_ms: int = 300000
    rate_limit: RateLimit = USE_QUERY_RATE_LIMIT


@dataclass(frozen=True, slots=True)
class InterestPacing:
    """``<remote-topic-interest>`` / ``<remote-pattern-interest>`` (and its ``<rate-limit>``)."""

    min_interval_ms: int = 1000
    max_interval_ms: int = 60000
    rate_limit: RateLimit = INTEREST_RATE_LIMIT


@dataclass(frozen=True, slots=True)
class DomainRoute:
    """``<domain-route>``: the timing of the remote domain route records the
    portal sends (with a ``<request-tcp>`` listener only): each reachable domain at
    gaps of ``min_interval_ms`` doubling up to ``max_interval_ms``, within
    ``rate_limit`` (domains a second)."""

    min_interval_ms: int = 100
    max_interval_ms: int = 1000
    rate_limit: RateLimit = DOMAIN_ROUTE_RATE_LIMIT
    line: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class RemoteInterest:
    """``<remote-topic>`` / ``<remote-pattern>`` (``max`` is max-topics / max-patterns)."""

    check_interval_ms: int = 90000
    max: int = 100
    timeout_ms: int = 300000


@dataclass(frozen=True, slots=True)
class TopicResolution:
    """``<topic-resolution>`` of an endpoint: multicast xor one or more lbmrds.

    ``interface`` is the interface of the portal's TR socket (``<interface>``
    for unicast, ``<multicast interface=..>`` for multicast; None = default).
    ``port_range`` is the local UDP port range for unicast TR (None for
    multicast).
    """

    multicast: MulticastResolver | None = None
    lbmrds: tuple[LbmrdAddress, ...] = ()
    interface: str | None = None
    port_range: PortRange | None = None
    initial_request: InitialRequest = InitialRequest()
    topic_use_query: UseQuery = UseQuery()
    pattern_use_query: UseQuery = UseQuery()
    remote_topic_interest: InterestPacing = InterestPacing()
    remote_pattern_interest: InterestPacing = InterestPacing()
    line: int = field(default=0, compare=False)
    domain_route: DomainRoute | None = None  # as given in the file, else None (the DRO's defaults)

    @property
    def kind(self) -> str:
        """``"multicast"`` or ``"unicast"``."""
        return "multicast" if self.multicast is not None else "unicast"


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """``<relay>``: interface (None = any) and ports of the proxy source listeners
    (``ports`` None = any free port: not in the file, for embedding and tests)."""

    interface: str | None = None
    ports: PortRange | None = DEFAULT_RELAY_PORTS
    line: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class LbtrmConfig:
    """``<lbt-rm>``: the multicast groups ``group_low`` .. ``group_high`` and the
    destination port of the LBT-RM proxy sources this portal creates in its TRD
    (:mod:`router.core.lbtrm`); ``same_group``: the origin source's own group and
    port instead, whenever its OTID tells them (the TRDs are separate networks).
    ``transport`` "lbt-ru": the proxy sources are LBT-RU sources instead, sending
    unicast to each receiver that connects (a TRD without multicast;
    :mod:`router.core.lbtru_fanout`), at most ``max_clients`` receivers each."""

    group_low: str = DEFAULT_LBTRM_GROUPS[0]
    group_high: str = DEFAULT_LBTRM_GROUPS[1]
    destination_port: int = DEFAULT_LBTRM_DEST_PORT
    same_group: bool = False
    line: int = field(default=0, compare=False)
    transport: str = "lbt-rm"
    max_clients: int = 256


#: UM's request_tcp_port_low: the default port of an endpoint's request listener
DEFAULT_REQUEST_PORT = 14391


@dataclass(frozen=True, slots=True)
class RequestListener:
    """``<request-tcp>``: the router's request listener in the endpoint's TRD, as UM's
    request_tcp_interface / request_tcp_port name a context's: the one TCP address
    (:attr:`EndpointConfig.request_address`) that the portal's remote domain route
    records advertise as the UIM listener of every domain the router reaches, and
    that its proxies advertise as their late-join and retransmission (OTR) request
    address. ``interface`` None: the ``<topic-resolution>`` interface."""

    interface: str | None = None
    port: int = DEFAULT_REQUEST_PORT
    line: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    """An ``<endpoint>`` portal: attaches the router to one TRD.

    The ``*_ms`` limits and timers after ``remote_pattern`` are not in the file
    (their defaults are what the router uses); embedding code may set them.
    """

    name: str
    domain_id: int
    topic_resolution: TopicResolution
    relay: RelayConfig = RelayConfig()
    source_deletion_delay_ms: int = DEFAULT_SOURCE_DELETION_DELAY_MS
    remote_topic: RemoteInterest = RemoteInterest()
    remote_pattern: RemoteInterest = RemoteInterest()
    line: int = field(default=0, compare=False)
    source_timeout_ms: int = DEFAULT_SOURCE_TIMEOUT_MS
    requery_interval_ms: int = DEFAULT_REQUERY_INTERVAL_MS
    ru_idle_timeout_ms: int = DEFAULT_RU_IDLE_TIMEOUT_MS
    ru_max_streams: int = DEFAULT_RU_MAX_STREAMS
    max_proxies: int = DEFAULT_MAX_PROXIES
    acl: PortalAcl = OPEN  # <acl>: inbound/outbound lists (router.core.acl)
    lbtrm: LbtrmConfig = LbtrmConfig()
    cost: int = 1  # <cost>: what routes through this portal cost (positive)
    # <relay fanout max-queue>: TCP sessions fanned out (one source connection per
    # router, one copy per link) or relayed per receiver connection; bytes a fanned-out
    # receiver (or link stream) may have queued; seconds, as ms, a receiver may hold
    # queued bytes without taking any before it is disconnected (not in the file)
    fanout: bool = True
    fanout_max_queue: int = DEFAULT_FANOUT_MAX_QUEUE
    fanout_stall_timeout_ms: int = round(_FANOUT_STALL_S * 1000)
    # <request-tcp>: the request listener (None: no domain route records, no late-join options)
    request_listener: RequestListener | None = None

    # ------------------------------------------------ what the runtime reads

    @property
    def request_address(self) -> tuple[str, int] | None:
        """(IPv4 address, TCP port) of the router's request listener in this TRD
        (``<request-tcp>``; None: none): the UIM listener the domain route records
        advertise and the late-join / OTR request address of the proxies. The
        interface is the ``<request-tcp>``'s, else the ``<topic-resolution>``'s,
        resolved once per process."""
        rl = self.request_listener
        if rl is None:
            return None
        return bind_address(rl.interface or self.topic_resolution.interface, "0.0.0.0"), rl.port

    @property
    def domain_route(self) -> DomainRoute:
        """The ``<domain-route>`` timing (the DRO's defaults when not given)."""
        return self.topic_resolution.domain_route or DomainRoute()

    @property
    def mode(self) -> str:
        """``"multicast"`` or ``"lbmrd"`` (unicast topic resolution)."""
        return "multicast" if self.topic_resolution.multicast is not None else "lbmrd"

    @property
    def daemons(self) -> list[tuple[str, int]]:
        """The lbmrds as ``(address, port)`` (none for multicast)."""
        return [(d.address, d.port) for d in self.topic_resolution.lbmrds]

    @property
    def multicast(self) -> tuple[str, int] | None:
        """The multicast TR ``(group, port)``, or None."""
        mc = self.topic_resolution.multicast
        return None if mc is None else (mc.group, mc.port)

    @property
    def multicast_ttl(self) -> int:
        mc = self.topic_resolution.multicast
        return DEFAULT_MULTICAST_TTL if mc is None else mc.ttl

    @property
    def tr_ip(self) -> str:
        """The address of the portal's TR socket (default: any for unicast,
        loopback for multicast)."""
        default = "127.0.0.1" if self.mode == "multicast" else "0.0.0.0"
        return bind_address(self.topic_resolution.interface, default)

    @property
    def tr_port_low(self) -> int:
        """First port of the TR socket's range (0 = any free port)."""
        pr = self.topic_resolution.port_range
        return pr.low if pr is not None else 0

    @property
    def tr_port_high(self) -> int:
        pr = self.topic_resolution.port_range
        return pr.high if pr is not None else 0

    @property
    def relay_ip(self) -> str:
        """The address of the proxy listeners (default: any)."""
        return bind_address(self.relay.interface, "0.0.0.0")

    @property
    def relay_port_low(self) -> int:
        """First port of the proxy listeners' range (0 = any free port)."""
        return self.relay.ports.low if self.relay.ports is not None else 0

    @property
    def relay_port_high(self) -> int:
        return self.relay.ports.high if self.relay.ports is not None else 0

    @property
    def lbtrm_group_low(self) -> str:
        """First multicast group of the LBT-RM proxy sources."""
        return self.lbtrm.group_low

    @property
    def lbtrm_group_high(self) -> str:
        return self.lbtrm.group_high

    @property
    def lbtrm_dest_port(self) -> int:
        return self.lbtrm.destination_port

    @property
    def lbtrm_same_group(self) -> bool:
        return self.lbtrm.same_group

    @property
    def lbtrm_proxy_transport(self) -> str:
        """"lbt-rm" (multicast proxies) or "lbt-ru" (unicast to each receiver)."""
        return self.lbtrm.transport

    @property
    def lbtrm_max_clients(self) -> int:
        """Receivers of one LBT-RU proxy of an LBT-RM origin."""
        return self.lbtrm.max_clients

    @property
    def source_deletion_delay(self) -> float:
        """Seconds."""
        return self.source_deletion_delay_ms / 1000.0

    @property
    def source_timeout(self) -> float:
        """Seconds."""
        return self.source_timeout_ms / 1000.0

    @property
    def requery_interval(self) -> float:
        """Seconds."""
        return self.requery_interval_ms / 1000.0

    @property
    def ru_idle_timeout(self) -> float:
        """Seconds."""
        return self.ru_idle_timeout_ms / 1000.0


@dataclass(frozen=True, slots=True)
class InitiatorConfig:
    """``<initiator>``: connect to ``address:port``, retry every reconnect interval."""

    address: str
    port: int
    reconnect_interval_ms: int = DEFAULT_RECONNECT_INTERVAL_MS
    line: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class AcceptorConfig:
    """``<acceptor>``: listen on ``listen_port`` (on the peer's interface)."""

    listen_port: int
    line: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class KeepaliveConfig:
    """``<gateway-keepalive>``: ``interval_ms``/``timeout_ms`` 0 = off."""

    idle: bool = True
    interval_ms: int = DEFAULT_KEEPALIVE_INTERVAL_MS
    timeout_ms: int = DEFAULT_KEEPALIVE_TIMEOUT_MS
    line: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """``<tls>``: absolute paths of PEM files (checked to exist and be readable).

    ``trusted_certificates=None`` means the system CA store.
    """

    certificate: str
    certificate_key: str
    certificate_key_password: str | None = field(default=None, repr=False)
    trusted_certificates: str | None = None
    cipher_suites: str | None = None
    line: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class PeerConfig:
    """A ``<peer>`` portal: one TCP link to another router.

    Exactly one of ``initiator`` / ``acceptor`` is set.  ``tcp_keepalive`` and
    ``nodelay`` are the ``<keepalive/>`` and ``<nodelay/>`` socket options
    (SO_KEEPALIVE, TCP_NODELAY), applied to the link's socket on both sides;
    ``nodelay`` False means Nagle's algorithm is on, as in the DRO (the file's
    default; the embedding helpers :func:`initiator_peer` and
    :func:`acceptor_peer` default to True). ``keepalive`` is the application
    keepalive (``<gateway-keepalive>``). Buffers (SO_RCVBUF, SO_SNDBUF, set
    before connecting or listening) of 0 leave the OS default (autotuning).
    ``interface`` is the address the acceptor listens on and the initiator
    binds before it connects.
    """

    name: str
    initiator: InitiatorConfig | None = None
    acceptor: AcceptorConfig | None = None
    interface: str | None = None
    receive_buffer: int = 0
    send_buffer: int = 0
    tcp_keepalive: bool = False
    nodelay: bool = False
    tls: TlsConfig | None = None
    keepalive: KeepaliveConfig = KeepaliveConfig()
    max_queue: int = DEFAULT_MAX_QUEUE
    line: int = field(default=0, compare=False)
    acl: PortalAcl = OPEN  # <acl>: inbound/outbound lists (router.core.acl)
    cost: int = 1  # <cost>: what routes through this portal cost (positive)

    @property
    def role(self) -> str:
        """``"initiator"`` or ``"acceptor"``."""
        return "initiator" if self.initiator is not None else "acceptor"

    # ------------------------------------------------ what the runtime reads

    @property
    def address(self) -> str:
        """The initiator's peer address ("" for an acceptor)."""
        return self.initiator.address if self.initiator is not None else ""

    @property
    def port(self) -> int:
        """The initiator's peer port, or the acceptor's listen port (0 = any)."""
        return self.initiator.port if self.initiator is not None else self.acceptor.listen_port

    @property
    def listen_ip(self) -> str:
        """The acceptor's listen address (default: any)."""
        return bind_address(self.interface, "0.0.0.0")

    @property
    def local_ip(self) -> str | None:
        """The initiator's local address, bound before it connects (None: the
        OS chooses, as without ``<interface>``)."""
        return None if not self.interface else bind_address(self.interface, "0.0.0.0")

    @property
    def reconnect_interval(self) -> float:
        """Seconds between the initiator's connection attempts."""
        ms = self.initiator.reconnect_interval_ms if self.initiator is not None \
            else DEFAULT_RECONNECT_INTERVAL_MS
        return ms / 1000.0

    @property
    def keepalive_interval(self) -> float:
        """Seconds between keepalives (0 = none): on an idle link only
        (``keepalive.idle``, the default) or always."""
        return self.keepalive.interval_ms / 1000.0

    @property
    def dead_after(self) -> float:
        """Seconds without a frame after which the link is declared dead."""
        return self.keepalive.timeout_ms / 1000.0


@dataclass(frozen=True, slots=True)
class RouteInfoConfig:
    """``<route-info>``: route info sent every ``propagation_interval_ms``, a
    router not heard of for ``timeout_ms`` is gone, route info that crossed
    more than ``max_hop_count`` peer links is dropped (the DRO's defaults)."""

    propagation_interval_ms: int = 1000
    timeout_ms: int = 4000
    max_hop_count: int = 100
    line: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class MonitorAccessConfig:
    """Who may read the HTTP endpoint (``<metrics token-file>``, ``<metrics-tls>``):
    ``token_file`` (absolute path; None = no token asked) and ``tls`` (None =
    plain HTTP)."""

    token_file: str | None = None
    tls: TlsConfig | None = None


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """A checked configuration file.

    ``name`` is ``<daemon><name>``; ``metrics`` is ``(address, port)`` or None,
    ``monitor`` its token and TLS.
    :attr:`endpoint` and :attr:`peer` are the first of each (the only ones
    of a router with one endpoint and one peer).
    """

    path: str
    name: str
    endpoints: tuple[EndpointConfig, ...]
    peers: tuple[PeerConfig, ...]
    log: LogConfig = LogConfig()
    metrics: tuple[str, int] | None = None
    monitor: MonitorAccessConfig = MonitorAccessConfig()
    stats_interval_ms: int = DEFAULT_STATS_INTERVAL_MS
    warnings: tuple[tuple[int, str], ...] = field(default=(), compare=False)
    route_info: RouteInfoConfig = RouteInfoConfig()

    @property
    def endpoint(self) -> EndpointConfig:
        return self.endpoints[0]

    @property
    def peer(self) -> PeerConfig:
        return self.peers[0]

    @property
    def domain_ids(self) -> tuple[int, ...]:
        """Domain ids of the endpoint portals (what the peer link announces)."""
        return tuple(e.domain_id for e in self.endpoints)


# --------------------------------------------------------------- without a file


def lbmrd_endpoint(name: str, domain_id: int, daemons, *, interface: str | None = None,
                   tr_ports: PortRange | None = None, relay_interface: str | None = None,
                   relay_ports: PortRange | None = None, **more) -> EndpointConfig:
    """An endpoint portal on lbmrd (unicast) topic resolution: ``daemons`` are
    ``(address, port)`` pairs; ``interface`` the TR socket's, ``relay_interface``
    the proxies' (default: ``interface``); ports None = any free port. ``more``:
    other :class:`EndpointConfig` fields (``source_deletion_delay_ms`` ...)."""
    tr = TopicResolution(lbmrds=tuple(LbmrdAddress(a, p) for a, p in daemons),
                         interface=interface, port_range=tr_ports)
    relay = RelayConfig(relay_interface if relay_interface is not None else interface, relay_ports)
    return EndpointConfig(name, domain_id, tr, relay, **more)


def multicast_endpoint(name: str, domain_id: int, group: str = DEFAULT_MULTICAST_GROUP,
                       port: int = DEFAULT_MULTICAST_PORT, *, interface: str | None = None,
                       ttl: int = DEFAULT_MULTICAST_TTL, relay_interface: str | None = None,
                       relay_ports: PortRange | None = None, **more) -> EndpointConfig:
    """An endpoint portal on multicast topic resolution (see :func:`lbmrd_endpoint`)."""
    tr = TopicResolution(multicast=MulticastResolver(group, port, ttl=ttl), interface=interface)
    relay = RelayConfig(relay_interface if relay_interface is not None else interface, relay_ports)
    return EndpointConfig(name, domain_id, tr, relay, **more)


def _keepalive(interval_ms: int | None, timeout_ms: int | None) -> KeepaliveConfig:
    return KeepaliveConfig(True, DEFAULT_KEEPALIVE_INTERVAL_MS if interval_ms is None else interval_ms,
                           DEFAULT_KEEPALIVE_TIMEOUT_MS if timeout_ms is None else timeout_ms)


def initiator_peer(name: str, address: str, port: int, *,
                   reconnect_interval_ms: int = DEFAULT_RECONNECT_INTERVAL_MS,
                   keepalive_interval_ms: int | None = None, keepalive_timeout_ms: int | None = None,
                   **more) -> PeerConfig:
    """A peer portal that connects to ``address:port``. ``more``: other
    :class:`PeerConfig` fields (``tls``, ``max_queue`` ...; ``nodelay`` defaults
    to True here: an embedded link keeps trio's TCP_NODELAY)."""
    more.setdefault("nodelay", True)
    return PeerConfig(name, initiator=InitiatorConfig(address, port, reconnect_interval_ms),
                      keepalive=_keepalive(keepalive_interval_ms, keepalive_timeout_ms), **more)


def acceptor_peer(name: str, port: int = 0, *, interface: str | None = None,
                  keepalive_interval_ms: int | None = None, keepalive_timeout_ms: int | None = None,
                  **more) -> PeerConfig:
    """A peer portal that listens on ``interface:port`` (0 = any free port)."""
    more.setdefault("nodelay", True)
    return PeerConfig(name, acceptor=AcceptorConfig(port), interface=interface,
                      keepalive=_keepalive(keepalive_interval_ms, keepalive_timeout_ms), **more)


def router_config(name: str, endpoints, peers=(), *, metrics: tuple[str, int] | None = None,
                  path: str = "<embedded>", route_info: RouteInfoConfig = RouteInfoConfig()) -> RouterConfig:
    """A router's settings without a file."""
    return RouterConfig(path, name, tuple(endpoints), tuple(peers), metrics=metrics, route_info=route_info)
