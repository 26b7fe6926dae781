"""lbmr-router's configuration as values: the immutable dataclasses that
:func:`router.config.load_config` returns, and the defaults (times in
milliseconds, sizes in bytes, as in the DRO's file)."""

from __future__ import annotations

from dataclasses import dataclass, field

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
class UseQuery:
    """``<topic-use-query>`` / ``<pattern-use-query>``."""

    timeout_ms: int = 3000
    max: int = 5
    periodic_interval_ms: int = 300000


@dataclass(frozen=True, slots=True)
class InterestPacing:
    """``<remote-topic-interest>`` / ``<remote-pattern-interest>``."""

    min_interval_ms: int = 1000
    max_interval_ms: int = 60000


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

    @property
    def kind(self) -> str:
        """``"multicast"`` or ``"unicast"``."""
        return "multicast" if self.multicast is not None else "unicast"


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """``<relay>``: interface (None = any) and ports of the proxy source listeners."""

    interface: str | None = None
    ports: PortRange = DEFAULT_RELAY_PORTS
    line: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    """An ``<endpoint>`` portal: attaches the router to one TRD."""

    name: str
    domain_id: int
    topic_resolution: TopicResolution
    relay: RelayConfig = RelayConfig()
    source_deletion_delay_ms: int = DEFAULT_SOURCE_DELETION_DELAY_MS
    remote_topic: RemoteInterest = RemoteInterest()
    remote_pattern: RemoteInterest = RemoteInterest()
    line: int = field(default=0, compare=False)


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
    ``nodelay`` are the ``<keepalive/>`` and ``<nodelay/>`` socket options;
    ``keepalive`` is the application keepalive (``<gateway-keepalive>``).
    Buffers of 0 leave the OS default.
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

    @property
    def role(self) -> str:
        """``"initiator"`` or ``"acceptor"``."""
        return "initiator" if self.initiator is not None else "acceptor"


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """A checked configuration file.

    ``name`` is ``<daemon><name>``; ``metrics`` is ``(address, port)`` or None.
    :attr:`endpoint` and :attr:`peer` are the first of each (the only ones
    of a router with one endpoint and one peer).
    """

    path: str
    name: str
    endpoints: tuple[EndpointConfig, ...]
    peers: tuple[PeerConfig, ...]
    log: LogConfig = LogConfig()
    metrics: tuple[str, int] | None = None
    stats_interval_ms: int = DEFAULT_STATS_INTERVAL_MS
    warnings: tuple[tuple[int, str], ...] = field(default=(), compare=False)

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
