"""Sans-IO topic resolution (TR) of one endpoint portal of the TRD router.

A :class:`PortalTR` plays UM topic resolution inside one Topic Resolution
Domain (TRD) on behalf of the router: it learns which topics receivers of its
TRD want (their TQRs / wildcard TQRs), finds sources of the topics the *peer's*
receivers want (it queries its TRD like a UM receiver), and advertises proxy
sources for sources behind the peer (TIRs with the router's relay address,
like a UM source, answering TQRs at once). It owns no socket, no clock and no
task: every method takes ``now`` (seconds on any monotonic clock), inputs are
method calls, outputs are datagrams and events, in the style of
:mod:`router.peerlink`. One portal's calls must be made serially.

Over 600 lines because :class:`PortalTR` is one state machine (interest,
queries, proxies and sources of one TRD share its tables and its outgoing
buffer); its values, helpers and timers are small classes above it.

Driving it (the I/O shell)::

    tr = PortalTR("east", 1, src_id=ctx_id, mode="lbmrd", daemons=[(ip, 15380)], now=t0)
    loop:
        on a datagram:     tr.on_datagram(data, (ip, port), now)
        from the peer:     tr.add_remote_interest(topic, now) / tr.cancel_remote_interest(...)
                           tr.add_proxy(ProxySource(...), now) / tr.remove_proxy(advert_id, now)
        after any call and at tr.next_deadline():
                           for data, dest in tr.tick(now): sock.sendto(data, dest)
                           for ev in tr.events(): ...   # LocalInterest, SourceSeen, ...

Outgoing datagrams, the one rule: everything the portal produces -- scheduled
advertisements, queries, keepalives, and the immediate answers to TQRs that
:meth:`~PortalTR.on_datagram` makes -- is appended, in order, to one outgoing
buffer. :meth:`~PortalTR.tick` runs what is due at ``now``, then returns the
whole buffer and empties it; :meth:`~PortalTR.data_to_send` returns and empties
it without running timers. Items are :class:`Outgoing` ``(data, dest)`` named
tuples. Events accumulate the same way and :meth:`~PortalTR.events` drains them.

Wire behaviour (UM's, with :class:`lbmr_proto.um.Timing` defaults):

* every TR datagram is a version-1 LBMR packet (NORMAL: TQRs then TIRs;
  WC_TQR: wildcard queries) of at most ``max_datagram`` (1400) bytes, with a
  packet-options trailer: SourceIdOption(``src_id``), SourceTypeOption(1 =
  TNWGD, i.e. a router), VersionOption (UM 6.14) and LocalDomainOption
  (``domain_id``; UM contexts learn their TRD's domain id from DRO traffic).
  Records due at the same time are batched into as few datagrams as fit;
* ``mode="lbmrd"``: TR traffic goes to one current daemon, which changes
  round robin every ``timing.change_interval`` (0.2 s) counted from creation
  (daemon k mod n during the k-th interval, like :class:`lbmr_proto.um.Targets`);
  a daemon that has been sent nothing for ``timing.keepalive_interval``
  (0.5 s) gets a 4-byte keepalive (``02 00 00 00`` / ``03 00 00 00``
  alternately, no trailer, as UM sends them). The portal is always "alive":
  the first keepalives go out at creation so every lbmrd knows the portal
  before it has anything to say (it must hear the receivers' TQRs).
  Datagrams from an address that is not a configured daemon are ignored
  (UM's ``resolver_unicast_ignore_unknown_source``; ``ignore_unknown_source``);
* ``mode="multicast"``: everything goes to the (group, port); no keepalives;
  datagrams are accepted from anyone;
* proxy advertisements follow UM's source timing (10 ms doubling to 500 ms
  for 5 s, then every 1 s for 60 s, then quiescent -- answering TQRs only);
  the proxy TIR carries OtidOption(origin OTID) and DomainIdOption(origin
  domain), ttl 60, and the origin's topic index;
* queries for remote interest follow UM's receiver timing (20 ms doubling to
  200 ms for 5 s, then every 1 s for 60 s) until a source is seen.

Rules this module chose (the issue leaves them open):

* **What is ignored (loop prevention, single hop).** A datagram carrying our
  own ``src_id`` (our multicast loopback, an lbmrd echo) is dropped whole.
  From a datagram whose SourceTypeOption says TNWGD (another router) nothing
  is used: its TIRs are proxies, its TQRs are another router's proxy
  receivers -- this router bridges one hop only. A TIR with a DomainIdOption
  naming *another* domain is a proxy made elsewhere and is ignored; a
  DomainIdOption with *our* domain id is accepted (a UM source that learnt its
  TRD's id from us may stamp it). A TIR whose OTID is the OTID of one of our
  own proxies is ignored too (an echo that lost its trailer). Each case is
  counted in :meth:`~PortalTR.stats`.
* **Interest lifetime.** Local interest (a topic, or a PCRE/regex pattern)
  starts with the first TQR / WC-TQR (event :class:`LocalInterest`) and is
  refreshed by every later one. With the DRO's use queries (``use_query``,
  ``pattern_use_query``; the router always sets them from its file): an
  interest silent for ``periodic_interval`` gets a use query (TOPIC_MGMT,
  "topic use" record, PCRE/regex flag for patterns), repeated every
  ``timeout`` while unanswered; after ``max`` unanswered ones it ends
  (:class:`LocalInterestGone`), even while a proxy is advertised for it: this
  is how receivers that left while resolved (and so went quiet) are noticed.
  A use response ("in use", flag 0x80), a TQR or a WC-TQR answers; a
  leave-topic record makes the interest due for a use query at once. Use
  queries are paced (``use_query_limit``: the DRO's ``<rate-limit>``, 500 a
  second and 500,000 bits a second by default in the router) and batched. Without use queries (embedding default): it ends once
  ``interest_timeout`` seconds have passed with neither a TQR for it nor a
  proxy advertised here for it (while we advertise a proxy the interest is
  held; the countdown starts again when the last such proxy is removed).
  :meth:`~PortalTR.local_interests` lists the live interests; with
  ``refresh_pacing`` each yields :class:`LocalInterestRefresh` (for INTEREST
  REFRESH frames) after ``min`` seconds, then at doubling gaps up to ``max``.
* **Remote interest** (:meth:`~PortalTR.add_remote_interest`) is a set, not a
  count: adding it again is a refresh; it lasts until cancelled, or, with
  ``remote_topic`` / ``remote_pattern``, until a check (every
  ``check_interval``, at most ``max_checked`` interests each, round robin)
  finds it not refreshed for ``timeout`` (:class:`RemoteInterestExpired`).
  While it lasts the portal queries (UM burst while no source is known; afterwards one query every ``requery_interval``), and
  reports every matching source with :class:`SourceSeen`. Sources of the
  TRD's TIRs are remembered whether or not they are wanted, so a new interest
  in a topic whose source is known is answered at once (SourceSeen right away,
  plus one verifying query); their records are dropped silently after
  ``source_timeout`` without a TIR (at most ``max_sources`` unwanted ones).
* **SourceSeen means "(re)send the advertisement"**: it is emitted when a
  wanted source is first seen (``first=True``; also again after it was gone
  or after the interest was cancelled), when interest in a known source is
  added again (``first=False``), and when a known source's transport or topic
  index changes (``first=False``); never for plain refreshes.
  :class:`SourceGone` is emitted when a reported source sent no TIR for
  ``source_timeout`` while we kept re-querying; if that leaves an exact topic
  without sources, the UM query burst starts again.
* **OTID synthesis.** A TIR without OtidOption gets a deterministic OTID
  (:func:`lbmr_proto.um.synthesize_otid`): built from its transport identity
  and topic index in the layout of UM's ``lbmotid.c`` (TCP, LBT-RU, LBT-RM;
  context id and transport index zero); other transports get their type code,
  a BLAKE2b digest of the transport body and the topic index at offset 11.
  :func:`otid_topic_index` reads the
  topic index back, which is how a proxy gets the origin's topic index when
  the peer link did not carry it.
* **TR request burst.** With ``initial_request`` the portal sends a TR
  request (extended type 0x04, flags queries and wildcard queries) every
  ``period`` for ``duration`` seconds from its creation, so that receivers
  that are quiet (resolved, or past their query phase) query again and the
  router learns the TRD's interest at start (the DRO's ``<initial-request>``).
* **Final advertisements.** :meth:`~PortalTR.remove_proxy` stops the normal
  advertisements and the TQR answers at once, then sends ``final_adverts``
  (default 3; 0 = none) final TIRs at the initial advertisement gaps (0, 10,
  30 ms): the same TIR with CostOption(its hop count, cost -1), the "infinite cost =
  withdrawn" marker (the public TRsniffer reading; UM's own encoding of a
  final advertisement is not public). Receivers that do not read it just see
  one more TIR of a source that is about to disappear.

Why one module of about 900 lines: :class:`PortalTR` is one state machine
whose timers, tables and rules (above) depend on each other; the rules are
stated here, next to the code that applies them. UM's timing, destinations,
OTIDs and datagram packing are in :mod:`lbmr_proto.um`.

Pattern types are the LBMR/LBRP values: 0 exact topic, 1 PCRE, 2 POSIX regex
(:class:`router.peerlink.PatternType`). Patterns are matched with Python's
:mod:`re` (``search``), close enough to PCRE and POSIX ERE for topic names.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
import random
import socket
import struct
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from lbmr_proto import (
    TIR,
    TQR,
    CostOption,
    DomainIdOption,
    LBMRDecodeError,
    LBMREncodeError,
    LbtruSessionTransport,
    LbtruTransport,
    OtidOption,
    SourceIdOption,
    SourceTypeOption,
    TcpSessionTransport,
    TcpTransport,
    WcTQR,
    decode,
)
from lbmr_proto.constants import ExtType, PacketType, SourceType, Transport
from lbmr_proto.records import TMR
from lbmr_proto.um import (
    DEFAULT_MAX_DATAGRAM,
    EPS,
    OTID_SIZE,
    TIR_TTL,
    Schedule,
    Targets,
    Timing,
    otid_topic_index,
    pack_records,
    synthesize_otid,
    um_trailer,
)

from .wildcard import Matcher, PatternError

__all__ = [
    "Addr", "Outgoing", "ProxySource", "LocalInterest", "LocalInterestGone", "SourceSeen",
    "SourceGone", "LocalInterestRefresh", "RemoteInterestExpired", "UseQuery", "PortalTR", "Timing", "PATTERN_TOPIC", "PATTERN_PCRE", "PATTERN_REGEX",
    "synthesize_otid", "otid_topic_index", "relay_transport", "interest_frame_size",
    "INTEREST_FRAME_OVERHEAD",
]

Addr = tuple[str, int]

#: Seconds: a query held back by the query rates goes at the next multiple of this
#: (never earlier than its slot), with every other query of that step in one datagram.
QUERY_STEP = 0.02
PATTERN_TOPIC = 0  # an exact topic name (LBRP INTEREST pattern type 0)
PATTERN_PCRE = 1  # LBMR wildcard pattern types
PATTERN_REGEX = 2
TMR_LEAVE, TMR_TOPIC_USE = 0, 1  # topic management record types
TMR_RESPONSE, TMR_PCRE, TMR_REGEX = 0x80, 0x40, 0x20  # topic management record flags
_V1_OPTIONS = 0x18  # header byte 0: version 1, packet options present


# --------------------------------------------------------------------------- values


class Outgoing(NamedTuple):
    """One datagram to send: ``data`` to ``dest`` (ip, port)."""

    data: bytes
    dest: Addr


@dataclass(frozen=True, slots=True)
class ProxySource:
    """A source behind the peer, to advertise in this portal's TRD.

    ``transport_body`` is the lbmr_proto transport body the TRD's receivers
    should join: the router's relay address and port, same transport type as
    the origin (see :func:`relay_transport`). ``otid`` is the origin's 32-byte
    OTID, ``origin_domain`` its TRD's domain id. ``topic_index`` is the TIR's
    topic index; None takes it from the OTID (:func:`otid_topic_index`, 0 if
    the OTID does not say)."""

    advert_id: int
    topic: str
    transport_body: object
    origin_domain: int
    otid: bytes
    topic_index: int | None = None
    hop_count: int = 1  # peer links between the source's TRD and this one (1: one hop)
    cost: int = 0  # what the route from this TRD to the source's costs (sum of portal costs)


@dataclass(frozen=True, slots=True)
class LocalInterest:
    """Receivers in this TRD want ``topic`` (``pattern``: a wildcard pattern of
    ``pattern_type`` 1 PCRE or 2 regex; exact topics have pattern_type 0)."""

    topic: str
    pattern: bool = False
    pattern_type: int = PATTERN_TOPIC


@dataclass(frozen=True, slots=True)
class LocalInterestGone:
    """The local interest in ``topic`` (same key fields as LocalInterest) ended."""

    topic: str
    pattern: bool = False
    pattern_type: int = PATTERN_TOPIC


@dataclass(frozen=True, slots=True)
class SourceSeen:
    """A source of a topic the peer wants exists in this TRD: send (or resend) an
    ADVERTISEMENT. ``first``: not reported before (or reported, then gone or no
    longer wanted). ``transport_body`` is the TIR's transport (join it to get the
    data); ``topic_index`` the TIR's topic index."""

    topic: str
    otid: bytes
    transport_body: object
    first: bool
    topic_index: int = 0


@dataclass(frozen=True, slots=True)
class SourceGone:
    """A reported source sent no TIR for ``source_timeout`` seconds: withdraw it."""

    topic: str
    otid: bytes


@dataclass(frozen=True, slots=True)
class LocalInterestRefresh:
    """Local interest in ``topic`` is still alive: time to send the peer an
    INTEREST REFRESH (paced per interest, ``refresh_pacing``)."""

    topic: str
    pattern: bool = False
    pattern_type: int = PATTERN_TOPIC


@dataclass(frozen=True, slots=True)
class RemoteInterestExpired:
    """The peer's interest in ``topic`` (pattern) was not refreshed for the
    ``remote_topic`` / ``remote_pattern`` timeout and is dropped: withdraw what
    was advertised for it."""

    topic: str
    pattern_type: int = PATTERN_TOPIC


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


# --------------------------------------------------------------------------- helpers


def relay_transport(code: int, ip: str, port: int, session_id: int | None = None):
    """The transport body of a proxy source relayed at ``ip``:``port``, for the
    LBMR transport ``code`` of the origin (as carried by an LBRP ADVERTISEMENT):
    TCP or LBT-RU, with a session id if one is given. ValueError otherwise."""
    if code == Transport.TCP:
        return TcpTransport(ip, port) if session_id is None else TcpSessionTransport(ip, session_id, port)
    if code == Transport.LBTRU:
        return LbtruTransport(ip, port) if session_id is None else LbtruSessionTransport(ip, session_id, port)
    raise ValueError(f"transport code 0x{code:02x} cannot be relayed (TCP and LBT-RU only)")


def _query_step(at: float) -> float:
    """When a query whose paced slot is ``at`` goes: the next multiple of
    ``QUERY_STEP`` seconds (with the other queries of that step)."""
    return math.ceil(at / QUERY_STEP - EPS) * QUERY_STEP


def _echo_key(otid: bytes, body) -> tuple[bytes, str, int]:
    return bytes(otid), getattr(body, "ip", None), getattr(body, "port", None)


def _check_ip(ip: str, what: str) -> str:
    try:
        socket.inet_aton(ip)
    except (OSError, TypeError):
        raise ValueError(f"{what}: {ip!r} is not an IPv4 address") from None
    return ip


# --------------------------------------------------------------------------- timers


class _Timer(ABC):
    """Something with a due time in the portal's timer heap. ``heap_at`` is the
    time of its one valid heap entry (inf: none); entries at other times are stale."""

    __slots__ = ("heap_at", "alive")

    def __init__(self) -> None:
        self.heap_at = math.inf
        self.alive = True

    @abstractmethod
    def due(self) -> float:
        """When this timer next needs attention (seconds; inf: never)."""


class _Proxy(_Timer):
    __slots__ = ("spec", "record", "final_record", "sched", "removed", "finals_left")

    def __init__(self, spec: ProxySource, record: bytes, final_record: bytes, sched: Schedule) -> None:
        super().__init__()
        self.spec = spec
        self.record = record
        self.final_record = final_record
        self.sched = sched
        self.removed = False
        self.finals_left = 0

    def due(self) -> float:
        return self.sched.next


#: Bytes of an LBRP INTEREST frame besides its topic's UTF-8 bytes: the 12-byte
#: frame header, action, pattern type, domain id (4) and the topic's 2-byte length
#: (:class:`router.peerlink.Interest`; a test checks the two agree).
INTEREST_FRAME_OVERHEAD = 20


_TMB_HEADER = 8  # a TOPIC_MGMT datagram: packet header (4), TMB header (4), records, trailer


def interest_frame_size(topic: str) -> int:
    """Bytes of the INTEREST frame for ``topic`` (what a refresh costs on the link)."""
    return INTEREST_FRAME_OVERHEAD + len(topic.encode("utf-8", "surrogateescape"))


class _RatePacer:
    """The DRO's ``<rate-limit>``: at most ``per_second`` objects and ``bps`` bits
    a second (0: no limit of that kind).

    One virtual clock per limit (the generic cell rate algorithm): an object
    advances it by its cost (``1/per_second`` seconds, or its bits / ``bps``);
    an object may go once every clock has reached now; a clock never lags now
    by more than its slack, which bounds a burst to ``burst`` objects and to a
    tenth of a second's bits (at least ``burst_bytes``, one datagram)."""

    __slots__ = ("gap", "obj_slack", "obj_next", "bit_time", "bit_slack", "bit_next")

    def __init__(self, limit: tuple[float, float], burst: int, burst_bytes: int) -> None:
        bps, per_second = limit
        if not (0 <= bps < math.inf and 0 <= per_second < math.inf):
            raise ValueError(f"rate limit (bps, per second) must be >= 0 and finite, not {limit!r}")
        self.gap = 1.0 / per_second if per_second else 0.0
        self.obj_slack = burst * self.gap
        self.obj_next = -math.inf
        self.bit_time = 1.0 / bps if bps else 0.0  # seconds a bit
        self.bit_slack = max(0.1, 8 * burst_bytes * self.bit_time) if bps else 0.0
        self.bit_next = -math.inf

    def reserve(self, now: float, nbytes: int, deferred_extra: int = 0) -> float:
        """Charge one object of ``nbytes`` bytes (``deferred_extra`` more if it
        must wait: it will go alone, in a datagram of its own) and return when
        it may go (``<= now + EPS``: at once; later: the slot now reserved for it)."""
        at = -math.inf
        if self.gap:
            at = max(self.obj_next, now - self.obj_slack)
        if self.bit_time:
            at = max(at, self.bit_next, now - self.bit_slack)
        t = max(at, now)
        if self.gap:
            self.obj_next = max(self.obj_next, t - self.obj_slack) + self.gap
        if self.bit_time:
            if at > now + EPS:
                nbytes += deferred_extra
            self.bit_next = max(self.bit_next, t - self.bit_slack) + 8 * nbytes * self.bit_time
        return at

    def charge(self, now: float, nbytes: int) -> None:
        """Charge ``nbytes`` more bytes sent at ``now`` (bits only: datagram headers)."""
        if self.bit_time:
            self.bit_next = max(self.bit_next, now - self.bit_slack) + 8 * nbytes * self.bit_time


class _Pacer:
    """At most ``rate`` events a second, in bursts of at most ``burst``."""

    __slots__ = ("gap", "slack", "next")

    def __init__(self, rate: float, burst: int) -> None:
        self.gap = 1.0 / rate
        self.slack = burst * self.gap
        self.next = -math.inf

    def free_at(self, now: float) -> float:
        """When the next event may happen (``<= now``: at once)."""
        return max(self.next, now - self.slack)



class _Query(_Timer):
    """Remote interest: the queries made for it."""

    __slots__ = ("key", "record", "sched", "next_requery", "slot", "refreshed")

    def __init__(self, key: tuple[int, str], record: bytes, now: float = 0.0) -> None:
        super().__init__()
        self.key = key
        self.record = record
        self.refreshed = now  # last ADD or REFRESH from the peer
        self.sched: Schedule | None = None  # the UM query burst, while running
        self.next_requery = math.inf
        self.slot: float | None = None  # the paced time reserved for its next query

    def due(self) -> float:
        return self.sched.next if self.sched is not None else self.next_requery


class _Src(_Timer):
    """A source seen in the TRD (one TIR identity: topic + OTID)."""

    __slots__ = ("topic", "otid", "body", "index", "last_seen", "announced", "timeout")

    def __init__(self, topic: str, otid: bytes, body, index: int, now: float, timeout: float) -> None:
        super().__init__()
        self.topic = topic
        self.otid = otid
        self.body = body
        self.index = index
        self.last_seen = now
        self.announced = False  # reported to the caller (SourceSeen) and not withdrawn since
        self.timeout = timeout

    def due(self) -> float:
        return self.last_seen + self.timeout


class _Interest(_Timer):
    """Local interest (TQRs seen in the TRD): its expiry (``timeout``, or the use
    queries ``uq``) and the pacing of its INTEREST REFRESHes."""

    __slots__ = ("key", "refreshed", "timeout", "uq", "unanswered", "last_query", "slot",
                 "next_refresh", "refresh_gap", "refresh_slot")

    def __init__(self, key: tuple[int, str], now: float, timeout: float, uq: UseQuery | None,
                 refresh_gap: float) -> None:
        super().__init__()
        self.key = key
        self.refreshed = now
        self.timeout = timeout
        self.uq = uq
        self.unanswered = 0  # use queries sent since the last answer
        self.last_query = -math.inf
        self.slot: float | None = None  # paced time reserved for the next use query
        self.refresh_gap = refresh_gap
        self.next_refresh = now + refresh_gap
        self.refresh_slot = False  # next_refresh is a slot reserved by the refresh rate limit

    def expiry_due(self) -> float:
        uq = self.uq
        if uq is None:
            return self.refreshed + self.timeout
        if self.slot is not None:
            return self.slot
        if self.unanswered == 0 or self.refreshed >= self.last_query:
            return max(self.refreshed, self.last_query) + uq.periodic_interval
        return self.last_query + uq.timeout

    def due(self) -> float:
        return min(self.expiry_due(), self.next_refresh)


class _RemoteChecker(_Timer):
    """Checks remote interests of one kind (exact topics, or patterns) for expiry."""

    __slots__ = ("check", "next", "queue")

    def __init__(self, check: RemoteCheck, now: float) -> None:
        super().__init__()
        self.check = check
        self.next = now + check.check_interval
        self.queue: collections.deque = collections.deque()  # (key, _Query), round robin

    def due(self) -> float:
        return self.next if self.queue else math.inf


class _InitialRequest(_Timer):
    """The TR request burst at start (``<initial-request>``)."""

    __slots__ = ("next", "period", "end")

    def __init__(self, now: float, period: float, duration: float) -> None:
        super().__init__()
        self.next, self.period, self.end = now, period, now + duration

    def due(self) -> float:
        return self.next if self.next < self.end else math.inf


# --------------------------------------------------------------------------- the portal


class PortalTR:
    """Topic resolution of one endpoint portal (see the module doc for the rules).

    ``name``: for logs; ``domain_id``: this TRD's domain id (1..2**32-1);
    ``src_id``: the portal's 8-byte context instance (SourceIdOption of every TR
    datagram; datagrams carrying it are our own and are ignored). ``mode`` is
    ``"lbmrd"`` (``daemons``: list of (ip, port)) or ``"multicast"``
    (``multicast``: (group, port)). ``timing``: UM cadence
    (:class:`lbmr_proto.um.Timing`). ``interest_timeout``: local interest
    lifetime without TQRs (and without a proxy); ``requery_interval``: query
    period for remote interest once a source is known (or the UM burst ended);
    ``source_timeout``: a source silent this long is gone (must exceed
    ``requery_interval``; the default tolerates two lost answers).
    ``final_adverts``: final TIRs sent by :meth:`remove_proxy`.
    ``requery_rate``: periodic re-queries sent per second at most (bursts of
    50; the DRO rate-limits its use queries, 500 a second by default);
    ``query_rate``: all queries (the UM bursts too) per second at most (bursts
    of 500); ``max_remote_interests``: more are refused (ValueError);
    ``requery_jitter``: each re-query comes ``requery_interval`` times 1 +- this
    fraction after the last (the router uses 0.2).

    The DRO's endpoint timing (all None = off, the behaviour above):
    ``use_query`` / ``pattern_use_query`` (:class:`UseQuery`) replace
    ``interest_timeout`` for local interest in topics / patterns: a silent
    interest gets use queries (TOPIC_MGMT "topic use" records), whether or not
    a proxy holds it, and is dropped after ``max`` unanswered ones; a use
    response, a TQR (WC-TQR) or a leave-topic notice followed by an answer
    keeps it; at most ``use_query_rate`` use queries a second (bursts of 50).
    ``use_query_limit`` / ``pattern_use_query_limit``: the DRO's
    ``<rate-limit>`` of the use queries of topics / patterns, ``(bps,
    per_second)``: at most ``bps`` bits a second (of the TOPIC_MGMT datagrams,
    headers included) and ``per_second`` use queries a second, 0 = no limit of
    that kind (None: ``(0, use_query_rate)``).
    ``refresh_pacing`` / ``pattern_refresh_pacing``: ``(min, max)`` seconds:
    each live local interest yields :class:`LocalInterestRefresh` after
    ``min``, then at doubling gaps up to ``max``; ``refresh_limit`` /
    ``pattern_refresh_limit`` (``(bps, per_second)`` as above, None = none)
    bound them: at most ``bps`` bits a second of INTEREST REFRESH frames
    (:func:`interest_frame_size`) and ``per_second`` refreshes a second, a
    refresh over the limit waits for the next free slot. Bursts: at most 50
    objects and a tenth of a second's bits (at least one datagram). ``remote_topic`` /
    ``remote_pattern`` (:class:`RemoteCheck`): remote interest not refreshed
    for ``timeout`` is dropped (:class:`RemoteInterestExpired`).
    ``initial_request``: ``(period, duration)`` seconds: a TR request
    (queries and wildcard queries) every ``period`` for ``duration`` from
    creation, so that quiet receivers of the TRD query again.
    """

    def __init__(self, name: str, domain_id: int, *, src_id: bytes, mode: str,
                 daemons: Sequence[Addr] = (), multicast: Addr | None = None,
                 timing: Timing | None = None, interest_timeout: float = 300.0,
                 source_timeout: float = 16.0, requery_interval: float = 5.0,
                 final_adverts: int = 3, max_datagram: int = DEFAULT_MAX_DATAGRAM,
                 ignore_unknown_source: bool = True, max_sources: int = 100_000,
                 requery_rate: float = 500.0, requery_jitter: float = 0.0,
                 query_rate: float = 5000.0, max_remote_interests: int = 20_000,
                 use_query: UseQuery | None = None, pattern_use_query: UseQuery | None = None,
                 use_query_rate: float = 500.0,
                 use_query_limit: tuple[float, float] | None = None,
                 pattern_use_query_limit: tuple[float, float] | None = None,
                 refresh_pacing: tuple[float, float] | None = None,
                 pattern_refresh_pacing: tuple[float, float] | None = None,
                 refresh_limit: tuple[float, float] | None = None,
                 pattern_refresh_limit: tuple[float, float] | None = None,
                 remote_topic: RemoteCheck | None = None, remote_pattern: RemoteCheck | None = None,
                 initial_request: tuple[float, float] | None = None,
                 now: float) -> None:
        if not isinstance(src_id, bytes | bytearray) or len(src_id) != 8:
            raise ValueError("src_id must be 8 bytes")
        if not isinstance(domain_id, int) or not 0 < domain_id <= 0xFFFFFFFF:
            raise ValueError(f"domain_id must be 1..4294967295, not {domain_id!r}")
        if mode == "lbmrd":
            if multicast is not None or not daemons:
                raise ValueError('mode "lbmrd" needs daemons and no multicast group')
            self.daemons: list[Addr] = [(_check_ip(str(ip), "daemon"), int(port)) for ip, port in daemons]
            self.multicast: Addr | None = None
        elif mode == "multicast":
            if multicast is None or daemons:
                raise ValueError('mode "multicast" needs multicast=(group, port) and no daemons')
            self.daemons = []
            self.multicast = (_check_ip(str(multicast[0]), "multicast group"), int(multicast[1]))
        else:
            raise ValueError(f'mode must be "lbmrd" or "multicast", not {mode!r}')
        for what, v in (("interest_timeout", interest_timeout), ("source_timeout", source_timeout),
                        ("requery_interval", requery_interval)):
            if not isinstance(v, int | float) or not 0 < v < math.inf:
                raise ValueError(f"{what} must be a positive number of seconds, not {v!r}")
        if source_timeout <= requery_interval:
            raise ValueError("source_timeout must exceed requery_interval (sources answer re-queries)")
        if final_adverts < 0:
            raise ValueError("final_adverts must be >= 0")
        for what, uq in (("use_query", use_query), ("pattern_use_query", pattern_use_query)):
            if uq is not None and not (uq.timeout > 0 and uq.max >= 1 and uq.periodic_interval > 0):
                raise ValueError(f"{what}: timeout and periodic_interval must be positive, max >= 1")
        for what, pace in (("refresh_pacing", refresh_pacing),
                           ("pattern_refresh_pacing", pattern_refresh_pacing)):
            if pace is not None and not 0 < pace[0] <= pace[1]:
                raise ValueError(f"{what}: 0 < min <= max, not {pace!r}")
        for what, rc in (("remote_topic", remote_topic), ("remote_pattern", remote_pattern)):
            if rc is not None and not (rc.check_interval > 0 and rc.max_checked >= 1 and rc.timeout > 0):
                raise ValueError(f"{what}: check_interval and timeout must be positive, max_checked >= 1")
        if use_query_rate <= 0:
            raise ValueError("use_query_rate must be positive")
        self.name = name
        self.domain_id = domain_id
        self.src_id = bytes(src_id)
        self.mode = mode
        self.timing = timing if timing is not None else Timing()
        self.interest_timeout = float(interest_timeout)
        self.source_timeout = float(source_timeout)
        self.requery_interval = float(requery_interval)
        self.final_adverts = final_adverts
        self.max_datagram = max_datagram
        self.ignore_unknown_source = ignore_unknown_source
        self.max_sources = max_sources
        # periodic re-queries: at most requery_rate a second (bursts of 50), each
        # requery_interval +- requery_jitter (a fraction) after the last
        if not (requery_rate > 0 and query_rate > 0) or not 0 <= requery_jitter < 1:
            raise ValueError("requery_rate and query_rate must be positive, requery_jitter 0..1")
        self.requery_rate = float(requery_rate)
        self.requery_jitter = float(requery_jitter)
        self._requery_pacer = _Pacer(requery_rate, 50)
        self._query_pacer = _Pacer(query_rate, 500)
        self.max_remote_interests = max_remote_interests
        self.use_query, self.pattern_use_query = use_query, pattern_use_query
        # the DRO's <rate-limit>s: use queries of topics / patterns, INTEREST REFRESHes
        use_default = (0.0, float(use_query_rate))
        self._use_pacers = (
            _RatePacer(use_query_limit or use_default, 50, max_datagram),
            _RatePacer(pattern_use_query_limit or use_default, 50, max_datagram))
        self._refresh_pacers = tuple(
            None if lim is None or not any(lim) else _RatePacer(lim, 50, max_datagram)
            for lim in (refresh_limit, pattern_refresh_limit))
        self.refresh_pacing, self.pattern_refresh_pacing = refresh_pacing, pattern_refresh_pacing
        self._checkers = {PATTERN_TOPIC: _RemoteChecker(remote_topic, now) if remote_topic else None,
                          PATTERN_PCRE: _RemoteChecker(remote_pattern, now) if remote_pattern else None}
        self._rnd = random.Random(self.src_id)
        self.start = now
        self.trailer = um_trailer(self.src_id, SourceType.TNWGD, domain_id)
        if max_datagram < 4 + len(self.trailer) + 512:
            raise ValueError(f"max_datagram {max_datagram} cannot hold the largest record")
        self._daemon_set = set(self.daemons)
        # first keepalives at creation
        self._targets = Targets(self.daemons, self.multicast, self.timing, now,
                                last_tx=now - self.timing.keepalive_interval)
        self._out: list[Outgoing] = []
        # use queries due (encoded TMRs, and the pacer that pays the headers of the
        # datagram each opens: None = paid already), sent at the end of tick
        self._tmrs: list[tuple[bytes, _RatePacer | None]] = []
        self._events: list = []
        self._st: Counter[str] = Counter()
        self._heap: list[tuple[float, int, _Timer]] = []
        self._seq = itertools.count()
        self._regexes: dict[tuple[int, str], Matcher | None] = {}
        # proxies (advertised here), by advert id; those sending final adverts
        self._proxies: dict[int, _Proxy] = {}
        self._finals: dict[int, _Proxy] = {}
        self._proxy_topics: dict[str, dict[int, _Proxy]] = {}
        # our proxies' (OTID, relay ip, relay port): a TIR with all three is our own echo
        self._proxy_echoes: Counter[tuple[bytes, str, int]] = Counter()
        # remote interest (queries) and local interest (TQRs), keyed (pattern type, topic)
        self._rint: dict[tuple[int, str], _Query] = {}
        self._rint_patterns: set[tuple[int, str]] = set()
        self._lint: dict[tuple[int, str], _Interest] = {}
        self._lint_patterns: set[tuple[int, str]] = set()
        # sources seen in the TRD
        self._sources: dict[tuple[str, bytes], _Src] = {}
        self._src_by_topic: dict[str, dict[bytes, _Src]] = {}
        if initial_request is not None and initial_request[1] > 0:
            if not initial_request[0] > 0:
                raise ValueError("initial_request period must be positive")
            self._arm(_InitialRequest(now, *initial_request))

    def __repr__(self) -> str:
        where = self.multicast if self.multicast is not None else self.daemons
        return f"<PortalTR {self.name!r} domain {self.domain_id} {self.mode} {where}>"

    # ------------------------------------------------------------------ outputs

    def data_to_send(self) -> list[Outgoing]:
        """Everything queued for sending, in order; empties the buffer."""
        out, self._out = self._out, []
        return out

    def events(self) -> list:
        """Events since the last call, in order; empties the list."""
        ev, self._events = self._events, []
        return ev

    def tick(self, now: float) -> list[Outgoing]:
        """Run everything due at ``now`` (advertisements, queries, expiries,
        keepalives), then return the whole outgoing buffer (:meth:`data_to_send`)."""
        tqrs: list[bytes] = []
        wcs: list[bytes] = []
        tirs: list[bytes] = []
        heap = self._heap
        limit = now + EPS
        while heap and heap[0][0] <= limit:
            t, _, tm = heapq.heappop(heap)
            if not tm.alive or t != tm.heap_at:
                continue  # stale entry
            tm.heap_at = math.inf
            if tm.due() <= limit:
                self._fire(tm, now, tqrs, wcs, tirs)
            if tm.alive:
                self._arm(tm)
        self._send_tr(tqrs, wcs, tirs, now, "tr")
        if self._tmrs:
            self._send_use_queries(now)
        st = self._st
        for ka, dest in self._targets.keepalives(now):
            self._out.append(Outgoing(ka, dest))
            st["keepalives_sent"] += 1
            st["datagrams_sent"] += 1
            st["bytes_sent"] += len(ka)
        return self.data_to_send()

    def next_deadline(self) -> float:
        """When :meth:`tick` next has something to do (``inf``: never by itself)."""
        heap = self._heap
        while heap and (not heap[0][2].alive or heap[0][0] != heap[0][2].heap_at):
            heapq.heappop(heap)
        d = heap[0][0] if heap else math.inf
        return min(d, self._targets.keepalive_deadline())

    def current_daemon(self, now: float) -> int:
        """Index of the daemon that gets TR traffic at ``now`` (lbmrd mode)."""
        return self._targets.current_daemon(now)

    def destination(self, now: float) -> Addr:
        """Where TR datagrams sent at ``now`` go: the group or the current daemon."""
        return self._targets.destination(now)

    # ------------------------------------------------------------------ inputs

    def on_datagram(self, data: bytes, src: Addr, now: float) -> None:
        """One datagram received on the portal's TR socket from ``src``. TQR
        answers go to the outgoing buffer; events to :meth:`events`."""
        st = self._st
        st["datagrams_received"] += 1
        if (self.multicast is None and self.ignore_unknown_source
                and (src[0], src[1]) not in self._daemon_set):
            st["ignored_unknown_source"] += 1
            return
        try:
            pkt = decode(data)
        except LBMRDecodeError:
            st["undecodable"] += 1
            return
        src_type = 0
        for o in pkt.options or ():
            if isinstance(o, SourceIdOption):
                if o.src_id == self.src_id:
                    st["ignored_own"] += 1
                    return
            elif isinstance(o, SourceTypeOption):
                src_type = o.src_type
        if pkt.is_keepalive:
            st["keepalives_received"] += 1
            return
        from_router = src_type == SourceType.TNWGD
        if pkt.type == PacketType.TOPIC_MGMT and pkt.tmb is not None and not from_router:
            self._on_topic_mgmt(pkt.tmb.tmrs, now)
            return
        if pkt.type not in (PacketType.NORMAL, PacketType.WC_TQR):
            st["other_packets"] += 1
            return
        for tir in pkt.tirs:
            self._on_tir(tir, src, from_router, now)
        if from_router:
            n = len(pkt.tqrs) + len(pkt.wc_tqrs)
            if n:
                st["tqrs_ignored_router"] += n
            return
        answers: dict[int, bytes] = {}
        for q in pkt.tqrs:
            st["tqrs_received"] += 1
            self._local_interest((PATTERN_TOPIC, q.topic), now)
            for aid, p in self._proxy_topics.get(q.topic, {}).items():
                answers[aid] = p.record
        for w in pkt.wc_tqrs:
            st["wc_tqrs_received"] += 1
            if w.pattern_type not in (PATTERN_PCRE, PATTERN_REGEX):
                st["wc_tqrs_bad_type"] += 1
                continue
            key = (w.pattern_type, w.pattern)
            self._local_interest(key, now)
            rx = self._regex(key)
            if rx is not None:
                for topic, ps in self._proxy_topics.items():
                    if rx.search(topic):
                        for aid, p in ps.items():
                            answers[aid] = p.record
        if answers:
            st["tirs_answered"] += len(answers)
            self._send_tr([], [], list(answers.values()), now, "answer")

    def _on_topic_mgmt(self, tmrs, now: float) -> None:
        """Topic management records from a context: a use response keeps the
        interest it names; a leave-topic notice (one receiver of the topic is
        gone) makes its interest due for a use query at once (others may remain)."""
        st = self._st
        for m in tmrs:
            pt = PATTERN_PCRE if m.flags & TMR_PCRE else PATTERN_REGEX if m.flags & TMR_REGEX else PATTERN_TOPIC
            li = self._lint.get((pt, m.name))
            if m.type == TMR_TOPIC_USE and m.flags & TMR_RESPONSE:
                st["use_responses_received"] += 1
                if li is not None:
                    li.refreshed = max(li.refreshed, now)
            elif m.type == TMR_LEAVE:
                st["leaves_received"] += 1
                if li is not None and li.uq is not None and li.slot is None and not li.unanswered:
                    li.refreshed = min(li.refreshed, now - li.uq.periodic_interval)
                    li.last_query = -math.inf
                    self._arm(li)
            else:
                st["tmrs_ignored"] += 1

    def add_remote_interest(self, topic: str, now: float, *, pattern_type: int = PATTERN_TOPIC) -> None:
        """The peer's receivers want ``topic`` (or pattern): query this TRD and
        report its sources. Known sources are reported at once (SourceSeen).
        Adding an existing interest is a refresh (known sources re-reported with
        first=False) and keeps it alive (``remote_topic``). ValueError if the
        topic cannot be an LBMR name."""
        if pattern_type not in (PATTERN_TOPIC, PATTERN_PCRE, PATTERN_REGEX):
            raise ValueError(f"unknown pattern type {pattern_type}")
        key = (pattern_type, topic)
        q = self._rint.get(key)
        known = self._matching_sources(key)
        if q is None:
            if len(self._rint) >= self.max_remote_interests:
                self._st["remote_interest_refused"] += 1
                raise ValueError(f"{len(self._rint)} remote interests already (limit "
                                 f"{self.max_remote_interests})")
            try:
                record = (TQR(topic) if pattern_type == PATTERN_TOPIC else WcTQR(topic, pattern_type)).encode()
            except LBMREncodeError as e:
                raise ValueError(f"cannot query {topic!r}: {e}") from None
            q = _Query(key, record, now)
            self._rint[key] = q
            ck = self._checkers[PATTERN_TOPIC if pattern_type == PATTERN_TOPIC else PATTERN_PCRE]
            if ck is not None:
                if not ck.queue:
                    ck.next = max(ck.next, now + ck.check.check_interval)
                elif len(ck.queue) > 2 * len(self._rint) + 1024:
                    # cancelled interests leave stale entries: a peer that adds and
                    # cancels in a loop must not grow the queue without bound
                    ck.queue = collections.deque(e for e in ck.queue if self._rint.get(e[0]) is e[1])
                ck.queue.append((key, q))
                self._arm(ck)
            if pattern_type != PATTERN_TOPIC:
                self._rint_patterns.add(key)
                if self._regex(key) is None:
                    self._st["bad_patterns"] += 1
            if known and pattern_type == PATTERN_TOPIC:
                q.next_requery = now  # one query at once to verify, then the requery period
            else:
                q.sched = Schedule(now, self.timing.query_phase())
            self._arm(q)
            self._st["remote_interest_added"] += 1
        else:
            q.refreshed = max(q.refreshed, now)
            self._st["remote_interest_refreshed"] += 1
        for s in known:
            first = not s.announced
            s.announced = True
            self._events.append(SourceSeen(s.topic, s.otid, s.body, first, s.index))

    def cancel_remote_interest(self, topic: str, now: float, *, pattern_type: int = PATTERN_TOPIC) -> bool:
        """The peer no longer wants ``topic`` (or pattern): stop querying. Sources
        no longer wanted are not reported any more (no SourceGone: the caller
        withdraws what it advertised). Returns False if there was no such interest."""
        key = (pattern_type, topic)
        q = self._rint.pop(key, None)
        if q is None:
            return False
        q.alive = False
        self._rint_patterns.discard(key)
        for s in self._matching_sources(key):
            if not self._wanted(s.topic):
                s.announced = False
        self._st["remote_interest_cancelled"] += 1
        return True

    def add_proxy(self, proxy: ProxySource, now: float) -> None:
        """Advertise ``proxy`` in this TRD from ``now`` (UM advertisement timing)
        and answer TQRs for its topic. The same advert id again with the same
        values changes nothing; with other values it replaces the proxy (its
        advertisements start over). ValueError for an unusable proxy."""
        if not isinstance(proxy.otid, bytes | bytearray) or len(proxy.otid) != OTID_SIZE:
            raise ValueError("proxy OTID must be 32 bytes")
        if proxy.origin_domain == self.domain_id:
            raise ValueError(f"proxy {proxy.topic!r} comes from this portal's own domain "
                             f"{self.domain_id} (a routing loop)")
        if not 0 < proxy.origin_domain <= 0xFFFFFFFF:
            raise ValueError(f"bad origin domain {proxy.origin_domain}")
        old = self._proxies.get(proxy.advert_id)
        if old is not None and old.spec == proxy:
            self._st["proxies_unchanged"] += 1
            return
        fin = self._finals.pop(proxy.advert_id, None)
        if fin is not None:
            fin.alive = False
        index = proxy.topic_index
        if index is None:
            index = otid_topic_index(proxy.otid) or 0
        opts = [OtidOption(0x8000, bytes(proxy.otid)), DomainIdOption(0x8000, proxy.origin_domain)]
        hops = max(1, min(255, proxy.hop_count))
        cost = max(0, min(2**31 - 1, proxy.cost))
        try:
            record = TIR(proxy.topic, proxy.transport_body, TIR_TTL, index,
                         opts + [CostOption(0, hops, cost)]).encode()
            final = TIR(proxy.topic, proxy.transport_body, TIR_TTL, index,
                        opts + [CostOption(0x80, hops, -1)]).encode()
        except (LBMREncodeError, AttributeError, struct.error) as e:
            raise ValueError(f"cannot advertise proxy {proxy!r}: {e}") from None
        if old is not None:
            self._unregister_proxy(old)
            old.alive = False
        p = _Proxy(proxy, record, final, Schedule(now, self.timing.ad_phase()))
        self._proxies[proxy.advert_id] = p
        self._proxy_topics.setdefault(proxy.topic, {})[proxy.advert_id] = p
        self._proxy_echoes[_echo_key(proxy.otid, proxy.transport_body)] += 1
        self._arm(p)
        self._st["proxies_added"] += 1

    def remove_proxy(self, advert_id: int, now: float) -> bool:
        """Stop advertising proxy ``advert_id`` and answering for it; send the final
        advertisements (module doc). Returns False if there was no such proxy."""
        p = self._proxies.pop(advert_id, None)
        if p is None:
            return False
        self._unregister_proxy(p)
        self._st["proxies_removed"] += 1
        # local interest held by this proxy starts counting down now
        topic = p.spec.topic
        for key in [(PATTERN_TOPIC, topic), *self._lint_patterns]:
            li = self._lint.get(key)
            if li is not None and self._covers(key, topic) and not self._pinned(key):
                li.refreshed = max(li.refreshed, now)
        if self.final_adverts:
            p.removed = True
            p.record = p.final_record
            p.finals_left = self.final_adverts
            p.sched = Schedule(now, self.timing.ad_phase())
            self._finals[advert_id] = p
            self._arm(p)
        else:
            p.alive = False
        return True

    def requery(self, topic: str, now: float) -> float | None:
        """Query remote interest ``topic`` as soon as ``query_rate`` lets it
        (e.g. to check that a source whose session ended is alive): it is not
        a periodic re-query, so ``requery_rate`` does not hold it back. Returns
        when the query goes: at the first multiple of ``QUERY_STEP`` seconds
        from its paced slot (``now`` or later), so that the queries of sessions
        that end within one step share datagrams (a thousand ends spread over
        a few scheduler turns are a few datagrams, not a thousand); the next
        query of a burst that runs; or None without such an interest (no
        query)."""
        q = self._rint.get((PATTERN_TOPIC, topic))
        if q is None:
            return None
        if q.sched is not None:
            return max(now, q.sched.next)
        pacer = self._query_pacer
        free = pacer.free_at(now)
        pacer.next = free + pacer.gap
        at = _query_step(max(free, now))
        q.slot = at  # reserved: sent at ``at`` without further pacing
        q.next_requery = at
        self._arm(q)
        return at

    def heard_since(self, topic: str, otid: bytes, since: float) -> bool:
        """Was source (``topic``, ``otid``) heard (a TIR) after ``since``
        (seconds, the portal's clock)? False if it is not known."""
        s = self._sources.get((topic, bytes(otid)))
        return s is not None and s.last_seen > since

    def drop_source(self, topic: str, otid: bytes, now: float, *, silent_since: float = math.inf) -> bool:
        """Source (``topic``, ``otid``) is gone (its session ended and nothing
        was heard of it after ``silent_since``): forget it now
        (:class:`SourceGone` if it was reported), without waiting for
        ``source_timeout``. False if it is not known or was heard since."""
        s = self._sources.get((topic, bytes(otid)))
        if s is None or s.last_seen > silent_since:
            return False
        self._drop_source(s, now)
        return True

    # ------------------------------------------------------------------ views

    def local_interests(self) -> list[LocalInterest]:
        """The live local interests (e.g. to send INTEREST REFRESH frames)."""
        return [LocalInterest(t, pt != PATTERN_TOPIC, pt) for pt, t in self._lint]

    def wants_proxy(self, topic: str) -> bool:
        """Does local interest (a TQR for ``topic``, or a pattern covering it) want
        a proxy of ``topic`` here?"""
        if (PATTERN_TOPIC, topic) in self._lint:
            return True
        return any(self._covers(k, topic) for k in self._lint_patterns)

    def wants_source(self, topic: str) -> bool:
        """Does remote interest (the topic, or a pattern covering it) want
        sources of ``topic``?"""
        return self._wanted(topic)

    def covers(self, key: tuple[int, str], topic: str) -> bool:
        """Does interest ``key`` ((pattern type, topic or pattern)) cover
        ``topic``? Patterns run on the portal's bounded, cached matchers."""
        return self._covers(key, topic)

    def count(self, what: str) -> None:
        """Count ``what`` in :meth:`stats` (for those sharing this portal)."""
        self._st[what] += 1

    def remote_interests(self) -> list[tuple[str, int]]:
        """The remote interests as (topic or pattern, pattern type)."""
        return [(t, pt) for pt, t in self._rint]

    def proxies(self) -> list[ProxySource]:
        return [p.spec for p in self._proxies.values()]

    def known_sources(self, topic: str) -> list[SourceSeen]:
        """The sources of ``topic`` currently known in this TRD (``first`` = not yet reported)."""
        return [SourceSeen(s.topic, s.otid, s.body, not s.announced, s.index)
                for s in self._src_by_topic.get(topic, {}).values()]

    def stats(self) -> dict[str, int]:
        """Counters (only those that happened) and current sizes."""
        d = dict(self._st)
        d.update(proxies=len(self._proxies), remote_interests=len(self._rint),
                 local_interests=len(self._lint), sources=len(self._sources),
                 events_pending=len(self._events), datagrams_pending=len(self._out))
        return d

    # ------------------------------------------------------------------ internals

    def _arm(self, tm: _Timer) -> None:
        d = tm.due()
        if d < tm.heap_at and d < math.inf:
            tm.heap_at = d
            heapq.heappush(self._heap, (d, next(self._seq), tm))

    def _fire(self, tm: _Timer, now: float, tqrs: list, wcs: list, tirs: list) -> None:
        st = self._st
        if isinstance(tm, _Proxy):
            tirs.append(tm.record)
            if tm.removed:
                st["final_adverts_sent"] += 1
                tm.finals_left -= 1
                if tm.finals_left <= 0:
                    tm.alive = False
                    if self._finals.get(tm.spec.advert_id) is tm:
                        del self._finals[tm.spec.advert_id]
                    return
            else:
                st["adverts_sent"] += 1
            tm.sched.advance(now)
        elif isinstance(tm, _Query):
            # every query within query_rate, periodic re-queries also within requery_rate:
            # a query over the rate gets the next free slot (reserved) and waits for it
            if tm.slot is None:
                pacers = (self._query_pacer,) if tm.sched is not None else (
                    self._query_pacer, self._requery_pacer)
                at = max(p.free_at(now) for p in pacers)
                for p in pacers:
                    p.next = at + p.gap
                if at > now + EPS:
                    tm.slot = at = _query_step(at)
                    if tm.sched is None:
                        tm.next_requery = at
                        st["requeries_deferred"] += 1
                    else:
                        tm.sched.next = at
                        st["queries_deferred"] += 1
                    return
            tm.slot = None
            if tm.key[0] == PATTERN_TOPIC:
                tqrs.append(tm.record)
                st["queries_sent"] += 1
            else:
                wcs.append(tm.record)
                st["wc_queries_sent"] += 1
            if tm.sched is not None:
                tm.sched.advance(now)
                if tm.sched.next == math.inf:  # the burst ended without a source
                    tm.sched = None
                    tm.next_requery = self._requery_at(now)
            else:
                tm.next_requery = self._requery_at(now)
        elif isinstance(tm, _Src):
            self._drop_source(tm, now)
        elif isinstance(tm, _Interest):
            self._fire_interest(tm, now)
        elif isinstance(tm, _RemoteChecker):
            self._check_remote(tm, now)
        elif isinstance(tm, _InitialRequest):
            # TR request: queries and wildcard queries (ext 0x04 flags 0x0002 | 0x0001)
            data = bytes((_V1_OPTIONS | PacketType.EXT, ExtType.TOPIC_RES_REQUEST)) \
                + struct.pack("!H", 0x0003) + self.trailer
            self._out.append(Outgoing(data, self._targets.send_tr(now)))
            st["tr_requests_sent"] += 1
            st["datagrams_sent"] += 1
            st["bytes_sent"] += len(data)
            tm.next = now + tm.period

    def _fire_interest(self, li: _Interest, now: float) -> None:
        """Expiry and use queries first, then (if the interest lives on) its refresh."""
        limit = now + EPS
        if li.expiry_due() <= limit:
            self._expire_or_use_query(li, now)
            if not li.alive:
                return  # no refresh for an interest that ends at this instant
        if li.next_refresh > limit:
            return
        pt, topic = li.key
        pacer = self._refresh_pacers[pt != PATTERN_TOPIC]
        at = -math.inf
        if pacer is not None and not li.refresh_slot:
            at = pacer.reserve(now, interest_frame_size(topic))
        if at > limit:  # over the rate limit: wait for the slot reserved
            li.next_refresh = at
            li.refresh_slot = True
            self._st["interest_refreshes_deferred"] += 1
            return
        li.refresh_slot = False
        self._events.append(LocalInterestRefresh(topic, pt != PATTERN_TOPIC, pt))
        pace = self.refresh_pacing if pt == PATTERN_TOPIC else self.pattern_refresh_pacing
        li.refresh_gap = min(li.refresh_gap * 2.0, pace[1])
        li.next_refresh = now + li.refresh_gap

    def _expire_or_use_query(self, li: _Interest, now: float) -> None:
        st = self._st
        pt, topic = li.key
        limit = now + EPS
        uq = li.uq
        if uq is None:  # no use queries: held by a proxy, else gone after interest_timeout
            if self._pinned(li.key):
                li.refreshed = now
                return
            self._drop_interest(li, "local_interest_expired")
            return
        flags = 0 if pt == PATTERN_TOPIC else (TMR_PCRE if pt == PATTERN_PCRE else TMR_REGEX)
        record = TMR(topic, TMR_TOPIC_USE, flags).encode()
        pacer = self._use_pacers[pt != PATTERN_TOPIC]
        if li.slot is None:
            if li.refreshed >= li.last_query:
                li.unanswered = 0  # answered (or heard from) since the last use query
            if li.unanswered >= uq.max:
                self._drop_interest(li, "local_interest_unanswered")
                return
            # one that waits goes in a datagram of its own: its headers are paid now
            at = pacer.reserve(now, len(record), _TMB_HEADER + len(self.trailer))
            if at > limit:
                li.slot = at
                st["use_queries_deferred"] += 1
                return
            self._tmrs.append((record, pacer))  # headers paid by the datagram it opens
        else:
            li.slot = None
            self._tmrs.append((record, None))  # paid in full when its slot was reserved
        li.unanswered += 1
        li.last_query = now
        st["use_queries_sent"] += 1

    def _drop_interest(self, li: _Interest, why: str) -> None:
        li.alive = False
        del self._lint[li.key]
        self._lint_patterns.discard(li.key)
        pt, topic = li.key
        self._events.append(LocalInterestGone(topic, pt != PATTERN_TOPIC, pt))
        self._st[why] += 1

    def _check_remote(self, ck: _RemoteChecker, now: float) -> None:
        """Check the next ``max_checked`` remote interests of ``ck``'s kind."""
        ck.next = now + ck.check.check_interval
        q = ck.queue
        for _ in range(min(len(q), ck.check.max_checked)):
            key, rq = q.popleft()
            if self._rint.get(key) is not rq:
                continue  # cancelled (or cancelled and added again: queued anew)
            if rq.refreshed + ck.check.timeout <= now + EPS:
                self.cancel_remote_interest(key[1], now, pattern_type=key[0])
                self._events.append(RemoteInterestExpired(key[1], key[0]))
                self._st["remote_interest_expired"] += 1
            else:
                q.append((key, rq))

    def _send_use_queries(self, now: float) -> None:
        """The use queries due, batched: TOPIC_MGMT datagrams of at most ``max_datagram``."""
        tmrs, self._tmrs = self._tmrs, []
        dest = self._targets.send_tr(now)
        room = self.max_datagram - 8 - len(self.trailer)
        batch: list[bytes] = []
        size = 0
        st = self._st
        opener = None  # the pacer of a datagram's first record pays its headers
        for i, (rec, pacer) in enumerate(tmrs + [(b"", None)]):
            if batch and (i == len(tmrs) or size + len(rec) > room):
                body = b"".join(batch)
                data = (bytes((_V1_OPTIONS | PacketType.TOPIC_MGMT, 0, 0, 0))
                        + struct.pack("!HH", 4 + len(body), len(batch)) + body + self.trailer)
                self._out.append(Outgoing(data, dest))
                if opener is not None:
                    opener.charge(now, len(data) - len(body))
                st["datagrams_sent"] += 1
                st["bytes_sent"] += len(data)
                st["use_query_datagrams_sent"] += 1
                batch, size = [], 0
            if not batch:
                opener = pacer
            batch.append(rec)
            size += len(rec)

    def _send_tr(self, tqrs: list[bytes], wcs: list[bytes], tirs: list[bytes], now: float,
                 kind: str) -> None:
        if not (tqrs or wcs or tirs):
            return
        dest = self._targets.send_tr(now)
        st = self._st
        pack = dict(trailer=self.trailer, max_datagram=self.max_datagram)
        for data in (pack_records(tqrs, tirs, **pack)
                     + pack_records(wcs, [], ptype=PacketType.WC_TQR, **pack)):
            self._out.append(Outgoing(data, dest))
            st["datagrams_sent"] += 1
            st["bytes_sent"] += len(data)
            st[f"{kind}_datagrams_sent"] += 1

    def _regex(self, key: tuple[int, str]) -> Matcher | None:
        try:
            return self._regexes[key]
        except KeyError:
            pass
        try:
            rx = Matcher(key[1])  # from the wire: never backtracks (router.core.wildcard)
        except PatternError:
            rx = None
        if len(self._regexes) >= 4096:
            self._regexes.clear()
        self._regexes[key] = rx
        return rx

    def _covers(self, key: tuple[int, str], topic: str) -> bool:
        """Does interest ``key`` (exact topic or pattern) cover ``topic``?"""
        if key[0] == PATTERN_TOPIC:
            return key[1] == topic
        rx = self._regex(key)
        return rx is not None and rx.search(topic)

    def _wanted(self, topic: str) -> bool:
        """Does the peer want sources of ``topic``?"""
        if (PATTERN_TOPIC, topic) in self._rint:
            return True
        return any(self._covers(k, topic) for k in self._rint_patterns)

    def _matching_sources(self, key: tuple[int, str]) -> list[_Src]:
        if key[0] == PATTERN_TOPIC:
            return list(self._src_by_topic.get(key[1], {}).values())
        return [s for t, ss in self._src_by_topic.items() if self._covers(key, t) for s in ss.values()]

    def _pinned(self, key: tuple[int, str]) -> bool:
        """Is local interest ``key`` held by a proxy we advertise?"""
        if key[0] == PATTERN_TOPIC:
            return bool(self._proxy_topics.get(key[1]))
        return any(self._covers(key, t) for t in self._proxy_topics)

    def _local_interest(self, key: tuple[int, str], now: float) -> None:
        li = self._lint.get(key)
        if li is not None:
            li.refreshed = max(li.refreshed, now)
            return
        topic_kind = key[0] == PATTERN_TOPIC
        pace = self.refresh_pacing if topic_kind else self.pattern_refresh_pacing
        li = _Interest(key, now, self.interest_timeout,
                       self.use_query if topic_kind else self.pattern_use_query,
                       pace[0] if pace is not None else math.inf)
        self._lint[key] = li
        if key[0] != PATTERN_TOPIC:
            self._lint_patterns.add(key)
        self._arm(li)
        self._events.append(LocalInterest(key[1], key[0] != PATTERN_TOPIC, key[0]))
        self._st["local_interest_added"] += 1

    def _is_echo(self, otid: bytes, *bodies) -> bool:
        port = getattr(bodies[0], "port", None)
        return any(k in self._proxy_echoes
                   for k in [(bytes(otid), getattr(b, "ip", None), port) for b in bodies]
                   + [(bytes(otid), "0.0.0.0", port)])

    def _requery_at(self, now: float) -> float:
        """When to query a remote interest again: ``requery_interval`` later,
        spread by ``requery_jitter`` (so that topics found together are not
        all re-queried in one burst)."""
        j = self.requery_jitter
        return now + self.requery_interval * (1.0 + j * (2.0 * self._rnd.random() - 1.0) if j else 1.0)

    def _unregister_proxy(self, p: _Proxy) -> None:
        ps = self._proxy_topics.get(p.spec.topic)
        if ps is not None:
            ps.pop(p.spec.advert_id, None)
            if not ps:
                del self._proxy_topics[p.spec.topic]
        key = _echo_key(p.spec.otid, p.spec.transport_body)
        self._proxy_echoes[key] -= 1
        if self._proxy_echoes[key] <= 0:
            del self._proxy_echoes[key]

    def _on_tir(self, tir: TIR, src: Addr, from_router: bool, now: float) -> None:
        st = self._st
        st["tirs_received"] += 1
        if from_router:
            st["tirs_ignored_router"] += 1
            return
        otid = None
        for o in tir.options or ():
            if isinstance(o, OtidOption):
                otid = o.otid
            elif isinstance(o, DomainIdOption) and o.domain_id != self.domain_id:
                st["tirs_ignored_domain"] += 1
                return
        body = tir.transport
        if self.multicast is not None and getattr(body, "ip", None) == "0.0.0.0":
            body = replace(body, ip=src[0])  # INADDR_ANY: the sender's address (no lbmrd fills it in)
        if otid is None:
            otid = synthesize_otid(body, tir.index)
            st["otids_synthesised"] += 1
        if self._proxy_echoes and self._is_echo(otid, tir.transport, body):
            # our own proxy's TIR (same OTID *and* our relay address): a source of the
            # TRD that merely has an equal OTID (e.g. synthesised from an identical
            # private address in both TRDs) is still a source
            st["tirs_ignored_proxy_echo"] += 1
            return
        topic = tir.topic
        s = self._sources.get((topic, otid))
        wanted = self._wanted(topic)
        if s is None:
            if len(self._sources) >= self.max_sources and not wanted:
                st["sources_not_kept"] += 1
                return
            s = _Src(topic, otid, body, tir.index, now, self.source_timeout)
            self._sources[(topic, otid)] = s
            self._src_by_topic.setdefault(topic, {})[otid] = s
            self._arm(s)
            st["sources_added"] += 1
            changed = False
        else:
            s.last_seen = max(s.last_seen, now)
            changed = s.body != body or s.index != tir.index
            if changed:
                s.body, s.index = body, tir.index
                st["sources_changed"] += 1
        if not wanted:
            return
        if not s.announced:
            s.announced = True
            self._events.append(SourceSeen(topic, otid, body, True, tir.index))
        elif changed:
            self._events.append(SourceSeen(topic, otid, body, False, tir.index))
        q = self._rint.get((PATTERN_TOPIC, topic))
        if q is not None and q.sched is not None:  # resolved: stop the burst, re-query later
            q.sched = None
            q.next_requery = self._requery_at(now)
            # the heap entry of the burst is now early; tick re-arms it at next_requery

    def _drop_source(self, s: _Src, now: float) -> None:
        s.alive = False
        del self._sources[(s.topic, s.otid)]
        ss = self._src_by_topic[s.topic]
        del ss[s.otid]
        if not ss:
            del self._src_by_topic[s.topic]
        if not (s.announced and self._wanted(s.topic)):
            self._st["sources_purged"] += 1
            return
        self._events.append(SourceGone(s.topic, s.otid))
        self._st["sources_gone"] += 1
        q = self._rint.get((PATTERN_TOPIC, s.topic))
        if q is not None and s.topic not in self._src_by_topic:
            q.sched = Schedule(now, self.timing.query_phase())  # look for another source
            self._arm(q)
