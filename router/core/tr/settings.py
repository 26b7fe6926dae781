"""The settings of one portal's topic resolution: :class:`PortalTRSettings`
(what :class:`~router.core.tr.portal.PortalTR` is built from) and the DRO's
endpoint timing records it holds, :class:`UseQuery`, :class:`RemoteCheck` and
:class:`DomainRoutes`.
Frozen values, checked (and normalised) when made: a bad value is a
ValueError naming the field. Times are seconds, rates per second.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass

from lbmr_proto.constants import SourceType
from lbmr_proto.um import DEFAULT_MAX_DATAGRAM, Timing, um_trailer

from ..interest import MAX_HELD_STATES
from .events import Addr

__all__ = ["PortalTRSettings", "UseQuery", "RemoteCheck", "DomainRoutes"]


@dataclass(frozen=True, slots=True)
class UseQuery:
    """The DRO's ``<topic-use-query>`` / ``<pattern-use-query>``, in seconds: a
    local interest silent for ``periodic_interval`` gets a use query, again
    every ``timeout`` while unanswered; after ``max`` unanswered ones it is
    dropped."""

    timeout: float = 3.0
    max: int = 5
    periodic_interval: float = 300.0


@dataclass(frozen=True, slots=True)
class RemoteCheck:
    """The DRO's ``<remote-topic>`` / ``<remote-pattern>``, in seconds: every
    ``check_interval`` at most ``max_checked`` remote interests are checked
    (round robin); those not refreshed for ``timeout`` are dropped."""

    check_interval: float = 90.0
    max_checked: int = 100
    timeout: float = 300.0


@dataclass(frozen=True, slots=True)
class DomainRoutes:
    """The DRO's ``<domain-route>``: the timing of the remote domain route records
    (LBMR extended type 0x06) a portal sends into its TRD, naming the portal's
    ``request_address`` (:class:`PortalTRSettings`) as the UIM listener through
    which every domain the router reaches is reachable. Each reachable domain is
    announced first at once, then at gaps of ``min_interval`` seconds doubling up
    to ``max_interval`` (then every ``max_interval``), within ``limit`` (bits a
    second, domains a second; 0 = no limit of that kind; the DRO's default: 50
    domains a second)."""

    min_interval: float = 0.1
    max_interval: float = 1.0
    limit: tuple[float, float] = (0.0, 50.0)

    def __post_init__(self) -> None:
        if not 0 < self.min_interval <= self.max_interval < math.inf:
            raise ValueError(f"domain routes: 0 < min_interval <= max_interval, not "
                             f"{self.min_interval!r}, {self.max_interval!r}")
        if not all(0 <= v < math.inf for v in self.limit):
            raise ValueError(f"domain routes: limit (bps, per second) must be >= 0 and finite, not {self.limit!r}")


@dataclass(frozen=True, slots=True)
class PortalTRSettings:
    """How one portal plays topic resolution in its TRD (rules: :mod:`router.core.tr`).

    Identity and where TR traffic goes: ``name`` (for logs); ``domain_id``,
    this TRD's domain id (1..2**32-1); ``src_id``, the portal's 8-byte context
    instance (SourceIdOption of every TR datagram; datagrams carrying it are
    our own and are ignored); ``mode`` ``"lbmrd"`` (``daemons``: (ip, port)
    of each lbmrd) or ``"multicast"`` (``multicast``: (group, port)).

    Everything else has UM's or the DRO's default; the comment of each field
    gives its unit. The DRO's endpoint timing (``use_query`` ..
    ``initial_request``) is off when None; then ``interest_timeout`` rules the
    lifetime of local interest. Rate limits ``(bps, per_second)`` are the
    DRO's ``<rate-limit>``: at most ``bps`` bits a second (of the datagrams or
    frames, headers included) and ``per_second`` objects a second, 0 = no
    limit of that kind; bursts of at most 50 objects and a tenth of a
    second's bits (at least one datagram).
    """

    name: str
    domain_id: int
    _: KW_ONLY
    src_id: bytes
    mode: str
    daemons: Sequence[Addr] = ()  # mode "lbmrd": the lbmrds, (IPv4 address, UDP port)
    multicast: Addr | None = None  # mode "multicast": (group, UDP port)
    timing: Timing | None = None  # UM's TR cadence (lbmr_proto.um.Timing); None: UM's defaults
    #: seconds a local interest lives without TQRs (and without a proxy held
    #: for it) when use queries are off
    interest_timeout: float = 300.0
    #: seconds without a TIR after which a source is gone (must exceed
    #: requery_interval; the default tolerates two lost answers)
    source_timeout: float = 16.0
    #: seconds between queries of a remote interest once a source is known (or the UM burst ended)
    requery_interval: float = 5.0
    final_adverts: int = 3  # final TIRs sent when a proxy is removed (0: none)
    max_datagram: int = DEFAULT_MAX_DATAGRAM  # bytes of UDP payload at most per TR datagram
    #: lbmrd mode: ignore datagrams from addresses that are not a configured daemon
    ignore_unknown_source: bool = True
    max_sources: int = 100_000  # sources of the TRD kept that no remote interest wants
    requery_rate: float = 500.0  # periodic re-queries a second at most (bursts of 50)
    #: each re-query comes requery_interval times 1 +- this fraction after the
    #: last (0 <= jitter < 1; the router uses 0.2)
    requery_jitter: float = 0.0
    query_rate: float = 5000.0  # queries (the UM bursts too) a second at most (bursts of 500)
    max_remote_interests: int = 20_000  # more are refused (ValueError)
    #: NFA states of the remote interest's distinct patterns, summed
    #: (:data:`router.core.interest.MAX_HELD_STATES`: one new topic costs at
    #: most this many matcher steps per character against them); a pattern
    #: beyond it is refused (ValueError, ``remote_pattern_states_refused``)
    max_remote_pattern_states: int = MAX_HELD_STATES
    #: use queries of local interest in topics / patterns (they replace interest_timeout)
    use_query: UseQuery | None = None
    pattern_use_query: UseQuery | None = None
    use_query_rate: float = 500.0  # use queries a second when no use_query_limit is given
    #: (bps, per_second) of the use queries of topics / patterns (None: (0, use_query_rate))
    use_query_limit: tuple[float, float] | None = None
    pattern_use_query_limit: tuple[float, float] | None = None
    #: (min, max) seconds: each live local interest yields LocalInterestRefresh
    #: after min, then at doubling gaps up to max (None: never)
    refresh_pacing: tuple[float, float] | None = None
    pattern_refresh_pacing: tuple[float, float] | None = None
    #: (bps, per_second) of the INTEREST REFRESH frames (interest_frame_size
    #: bytes each); a refresh over the limit waits for its slot (None: no limit)
    refresh_limit: tuple[float, float] | None = None
    pattern_refresh_limit: tuple[float, float] | None = None
    #: remote interest not refreshed for its timeout is dropped (RemoteInterestExpired)
    remote_topic: RemoteCheck | None = None
    remote_pattern: RemoteCheck | None = None
    #: (period, duration) seconds: a TR request (queries and wildcard queries)
    #: every period for duration from creation, so that quiet receivers query again
    initial_request: tuple[float, float] | None = None
    #: (IPv4 address, TCP port) of the router's request listener in this TRD (UM's
    #: request_tcp_interface / request_tcp_port): the UIM listener the domain route
    #: records name, and what proxies advertise as the source's late-join and
    #: retransmission request address; None: none (no domain route records; the
    #: origin's late-join, UME and extended-functionality options are not advertised)
    request_address: Addr | None = None
    #: the timing of the remote domain route records sent into the TRD, which name
    #: request_address (None: none; they are also none while the router reaches no
    #: other domain)
    domain_routes: DomainRoutes | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__  # normalising a frozen value while it is made
        src_id, domain_id, mode = self.src_id, self.domain_id, self.mode
        if not isinstance(src_id, bytes | bytearray) or len(src_id) != 8:
            raise ValueError("src_id must be 8 bytes")
        put(self, "src_id", bytes(src_id))
        if not isinstance(domain_id, int) or not 0 < domain_id <= 0xFFFFFFFF:
            raise ValueError(f"domain_id must be 1..4294967295, not {domain_id!r}")
        if mode == "lbmrd":
            if self.multicast is not None or not self.daemons:
                raise ValueError('mode "lbmrd" needs daemons and no multicast group')
            put(self, "daemons", tuple((_check_ip(str(ip), "daemon"), int(port)) for ip, port in self.daemons))
        elif mode == "multicast":
            if self.multicast is None or self.daemons:
                raise ValueError('mode "multicast" needs multicast=(group, port) and no daemons')
            put(self, "daemons", ())
            put(self, "multicast", (_check_ip(str(self.multicast[0]), "multicast group"),
                                    int(self.multicast[1])))
        else:
            raise ValueError(f'mode must be "lbmrd" or "multicast", not {mode!r}')
        for what in ("interest_timeout", "source_timeout", "requery_interval"):
            v = getattr(self, what)
            if not isinstance(v, int | float) or not 0 < v < math.inf:
                raise ValueError(f"{what} must be a positive number of seconds, not {v!r}")
            put(self, what, float(v))
        if self.source_timeout <= self.requery_interval:
            raise ValueError("source_timeout must exceed requery_interval (sources answer re-queries)")
        if self.final_adverts < 0:
            raise ValueError("final_adverts must be >= 0")
        for what in ("use_query", "pattern_use_query"):
            uq = getattr(self, what)
            if uq is not None and not (uq.timeout > 0 and uq.max >= 1 and uq.periodic_interval > 0):
                raise ValueError(f"{what}: timeout and periodic_interval must be positive, max >= 1")
        for what in ("refresh_pacing", "pattern_refresh_pacing"):
            pace = getattr(self, what)
            if pace is not None and not 0 < pace[0] <= pace[1]:
                raise ValueError(f"{what}: 0 < min <= max, not {pace!r}")
        for what in ("remote_topic", "remote_pattern"):
            rc = getattr(self, what)
            if rc is not None and not (rc.check_interval > 0 and rc.max_checked >= 1 and rc.timeout > 0):
                raise ValueError(f"{what}: check_interval and timeout must be positive, max_checked >= 1")
        if self.max_remote_interests < 0 or self.max_remote_pattern_states < 0:
            raise ValueError("max_remote_interests and max_remote_pattern_states must be >= 0")
        if self.use_query_rate <= 0:
            raise ValueError("use_query_rate must be positive")
        if not (self.requery_rate > 0 and self.query_rate > 0) or not 0 <= self.requery_jitter < 1:
            raise ValueError("requery_rate and query_rate must be positive, requery_jitter 0..1")
        put(self, "requery_rate", float(self.requery_rate))
        put(self, "requery_jitter", float(self.requery_jitter))
        if self.timing is None:
            put(self, "timing", Timing())
        if self.max_datagram < 4 + len(um_trailer(self.src_id, SourceType.TNWGD, domain_id)) + 512:
            raise ValueError(f"max_datagram {self.max_datagram} cannot hold the largest record")
        ir = self.initial_request
        if ir is not None and ir[1] > 0 and not ir[0] > 0:
            raise ValueError("initial_request period must be positive")
        ra = self.request_address
        if ra is not None:
            if not isinstance(ra[1], int) or not 0 < ra[1] <= 0xFFFF:
                raise ValueError(f"request_address port must be 1..65535, not {ra[1]!r}")
            put(self, "request_address", (_check_ip(str(ra[0]), "request_address"), ra[1]))
        if self.domain_routes is not None and (ra is None or self.request_address[0] == "0.0.0.0"):
            raise ValueError(f"domain_routes name request_address as the UIM listener: it must be an "
                             f"address UM contexts can connect to, not {ra!r}")


def _check_ip(ip: str, what: str) -> str:
    try:
        socket.inet_aton(ip)
    except (OSError, TypeError):
        raise ValueError(f"{what}: {ip!r} is not an IPv4 address") from None
    return ip
