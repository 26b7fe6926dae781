"""UM's topic-resolution model, sans-IO: what a UM context sends and when.

Shared by the simulator (:mod:`lbmr_tools.sim`) and the router's portal
(:mod:`router.tr`). No sockets, no clock, no trio: times are seconds on any
monotonic clock and are always passed in.

* :class:`Timing` (UM's resolver defaults) and :class:`Schedule` (the send
  times of one advertisement or query stream: initial phase doubling, then
  sustaining, then quiescent);
* :class:`Targets`: where TR datagrams go (a multicast group, or lbmrds round
  robin, :func:`round_robin`) and when a daemon is due a keepalive
  (:data:`RCV_ALIVE` / :data:`SRC_ALIVE`);
* OTIDs: :func:`make_otid` (UM's ``lbmotid.c`` layout),
  :func:`synthesize_otid` (a deterministic OTID for a TIR that carries none),
  :func:`otid_topic_index`;
* :func:`um_trailer` (the packet-options trailer UM 6.x sends) and
  :func:`pack_records` (encoded TQRs/WC-TQRs and TIRs batched into datagrams of
  at most N bytes, each with the trailer).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from ._wire import ip_bytes
from .constants import HDR_OPTIONS_FLAG, PacketType, Transport
from .popts import (
    LocalDomainOption,
    SourceIdOption,
    SourceTypeOption,
    VersionOption,
    encode_packet_options,
)

__all__ = [
    "EPS", "RCV_ALIVE", "SRC_ALIVE", "UM_VERSION", "VERSION_FLAGS", "TIR_TTL", "MAX_TQRS", "MAX_TIRS",
    "DEFAULT_MAX_DATAGRAM", "OTID_SIZE", "Timing", "TIMING_FIELDS", "Schedule", "round_robin",
    "Targets", "make_otid", "synthesize_otid", "otid_topic_index", "um_options", "um_trailer", "pack_records",
]

Addr = tuple[str, int]

EPS = 1e-9  # seconds; "due" tolerance for float schedules
RCV_ALIVE = b"\x02\x00\x00\x00"  # keepalive packet types 2 and 3, no trailer, as UM sends them
SRC_ALIVE = b"\x03\x00\x00\x00"
UM_VERSION = 0x060E0000  # 6.14, as in the packet-options trailer of a UM 6.14 capture
VERSION_FLAGS = 0x8001  # ignore | UME capable, as UM 6.14 sends it
TIR_TTL = 60  # the TIR ttl value UM 6.14 sends in steady state
MAX_TQRS = 255  # the header's first count (TQRs, WC-TQRs) is one byte
MAX_TIRS = 0xFFFF
DEFAULT_MAX_DATAGRAM = 1400
OTID_SIZE = 32
_HDR = struct.Struct("!BBH")
_V1 = 0x10  # header version 1 in the high nibble
# topic-index offset inside a UM OTID, by transport code (lbmotid.c layout)
_OTID_TOPIC_INDEX_AT = {
    Transport.TCP: 7, Transport.LBTRU: 11, Transport.LBTRM: 17,
    Transport.LBTIPC: 11, Transport.LBTSMX: 11, Transport.LBTRDMA: 11,
}


# ------------------------------------------------------------------ timing


@dataclass(frozen=True)
class Timing:
    """Topic-resolution cadence, in seconds (UM configuration option in brackets).

    Advertisements: the first at source creation, then gaps of
    ``ad_initial_min`` doubling up to ``ad_initial_max`` while the gap starts
    within ``ad_initial_duration`` of creation (initial phase), then gaps of
    ``ad_sustain_interval`` (sustaining phase); nothing is advertised from
    ``ad_initial_duration + ad_sustain_duration`` on (quiescent phase: the
    source still answers queries). Queries run the same way with the
    ``query_*`` values and stop as soon as the receiver has resolved.
    A keepalive goes to a daemon when nothing was sent to it for
    ``keepalive_interval``. With several daemons the one receiving normal TR
    traffic changes every ``change_interval``.
    """

    ad_initial_min: float = 0.010  # resolver_advertisement_minimum_initial_interval
    ad_initial_max: float = 0.500  # resolver_advertisement_maximum_initial_interval
    ad_initial_duration: float = 5.0  # resolver_advertisement_minimum_initial_duration
    ad_sustain_interval: float = 1.0  # resolver_advertisement_sustain_interval
    ad_sustain_duration: float = 60.0  # resolver_advertisement_minimum_sustain_duration
    query_initial_min: float = 0.020  # resolver_query_minimum_initial_interval
    query_initial_max: float = 0.200  # resolver_query_maximum_initial_interval
    query_initial_duration: float = 5.0  # resolver_query_minimum_initial_duration
    query_sustain_interval: float = 1.0  # resolver_query_sustain_interval
    query_sustain_duration: float = 60.0  # resolver_query_minimum_sustain_duration
    keepalive_interval: float = 0.5  # resolver_unicast_keepalive_interval
    change_interval: float = 0.2  # resolver_unicast_change_interval (not randomised here)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"timing {f.name} must be a finite number, not {v!r}")
            if f.name.endswith("_duration"):
                if v < 0:
                    raise ValueError(f"timing {f.name} must be >= 0, not {v}")
            elif v <= 0:
                raise ValueError(f"timing {f.name} must be > 0, not {v}")
        if self.ad_initial_max < self.ad_initial_min:
            raise ValueError("timing ad_initial_max is smaller than ad_initial_min")
        if self.query_initial_max < self.query_initial_min:
            raise ValueError("timing query_initial_max is smaller than query_initial_min")

    def ad_phase(self) -> tuple[float, float, float, float, float]:
        return (self.ad_initial_min, self.ad_initial_max, self.ad_initial_duration,
                self.ad_sustain_interval, self.ad_sustain_duration)

    def query_phase(self) -> tuple[float, float, float, float, float]:
        return (self.query_initial_min, self.query_initial_max, self.query_initial_duration,
                self.query_sustain_interval, self.query_sustain_duration)


TIMING_FIELDS = tuple(f.name for f in dataclasses.fields(Timing))


class Schedule:
    """The send times of one advertisement or query stream.

    ``phase`` is (initial min, initial max, initial duration, sustain
    interval, sustain duration). ``next`` is the next send time (``inf``
    when the stream has ended). Whether a gap belongs to the initial or the
    sustaining phase is decided by when the gap *starts*.
    """

    __slots__ = ("start", "next", "gap", "sent", "phase")

    def __init__(self, start: float, phase: tuple[float, float, float, float, float]) -> None:
        self.phase = phase
        self.start = start
        self.next = start
        self.gap = phase[0]
        self.sent = 0

    def due(self, now: float) -> bool:
        return self.next <= now + EPS

    def advance(self, now: float) -> None:
        """Record a send of the due item at ``now``; schedule the next one."""
        _, imax, idur, sustain, sdur = self.phase
        self.sent += 1
        base = self.next
        if base - self.start < idur - EPS:
            gap = self.gap
            self.gap = min(self.gap * 2, imax)
        else:
            gap = sustain
        nxt = base + gap
        if nxt <= now + EPS:  # we were late by more than a gap: re-anchor, never burst
            nxt = now + gap
        self.next = math.inf if nxt - self.start >= idur + sdur - EPS else nxt

    def stop(self) -> None:
        self.next = math.inf


# ------------------------------------------------------------- destinations


def round_robin(n: int, elapsed: float, change_interval: float) -> int:
    """UM-style rotation among ``n`` lbmrds: the index of the current one after
    ``elapsed`` seconds, changing every ``change_interval`` seconds."""
    if n == 0:
        raise ValueError("no daemons (multicast mode)")
    if n == 1:
        return 0
    return int(math.floor(elapsed / change_interval + EPS)) % n


class Targets:
    """Where one context's TR datagrams go, and its unicast keepalives.

    Unicast (``daemons``, ``multicast`` None): TR traffic goes to the current
    daemon, which changes round robin every ``timing.change_interval`` seconds
    counted from ``start`` (daemon ``k mod n`` during the k-th interval; UM
    randomises the period and skips inactive daemons, this model does
    neither). A daemon that has been sent nothing for
    ``timing.keepalive_interval`` gets a 4-byte keepalive, :data:`RCV_ALIVE`
    and :data:`SRC_ALIVE` alternately. ``last_tx`` is every daemon's initial
    "last sent" time (``-inf``: never).

    Multicast (``multicast`` = (group, port), no daemons): everything goes to
    the group; no keepalives.
    """

    __slots__ = ("daemons", "multicast", "timing", "start", "last_tx", "_ka_type")

    def __init__(self, daemons: Sequence[Addr], multicast: Addr | None, timing: Timing, start: float,
                 last_tx: float = -math.inf) -> None:
        self.daemons = list(daemons)
        self.multicast = multicast
        self.timing = timing
        self.start = start
        self.last_tx = [last_tx] * len(self.daemons)
        self._ka_type = [0] * len(self.daemons)

    def current_daemon(self, now: float) -> int:
        """Index of the daemon that gets TR traffic at ``now`` (ValueError in
        multicast mode)."""
        return round_robin(len(self.daemons), now - self.start, self.timing.change_interval)

    def destination(self, now: float) -> Addr:
        """Where TR datagrams sent at ``now`` go: the group or the current daemon."""
        if self.multicast is not None:
            return self.multicast
        return self.daemons[self.current_daemon(now)]

    def send_tr(self, now: float) -> Addr:
        """:meth:`destination`, recording that the daemon was sent something at ``now``."""
        if self.multicast is not None:
            return self.multicast
        k = self.current_daemon(now)
        self.last_tx[k] = now
        return self.daemons[k]

    def keepalive_deadline(self, since: float = -math.inf) -> float:
        """When the next keepalive is due (``inf``: never); ``since``: nothing
        is due before ``since`` plus the keepalive interval."""
        if not self.last_tx:
            return math.inf
        return max(min(self.last_tx), since) + self.timing.keepalive_interval

    def keepalives(self, now: float, since: float = -math.inf) -> list[tuple[bytes, Addr]]:
        """The keepalives due at ``now`` as (data, daemon), recorded as sent."""
        out = []
        iv = self.timing.keepalive_interval
        for k, dest in enumerate(self.daemons):
            if max(self.last_tx[k], since) + iv <= now + EPS:
                out.append((RCV_ALIVE if self._ka_type[k] == 0 else SRC_ALIVE, dest))
                self._ka_type[k] ^= 1
                self.last_tx[k] = now
        return out


# ------------------------------------------------------------------- OTIDs


def make_otid(t, topic_index: int, ctx_id: bytes, xport_idx: int, session_id: int) -> bytes:
    """A 32-byte originating transport id laid out as UM's (lbmotid.c): byte 0
    transport type, per-transport address/port/session/topic-index/context
    fields, byte 31 = 1 (OTID version: transport index present)."""
    ip = ip_bytes(t.ip)
    if t.NAME == "LBTRM":
        body = (ip + struct.pack("!H", t.src_ucast_port) + ip_bytes(t.mcast_group)
                + struct.pack("!HII", t.dest_port, t.session_id, topic_index) + ctx_id
                + struct.pack("!I", xport_idx))
    elif t.NAME == "LBTRU":
        body = ip + struct.pack("!HII", t.port, session_id, topic_index) + ctx_id + struct.pack("!I", xport_idx)
    else:
        body = ip + struct.pack("!HI", t.port, topic_index) + ctx_id + struct.pack("!II", xport_idx, session_id)
    raw = bytes((t.TYPE,)) + body
    return raw + bytes(31 - len(raw)) + b"\x01"


def synthesize_otid(transport, topic_index: int) -> bytes:
    """A deterministic 32-byte OTID for a TIR that carries none: for TCP,
    LBT-RU and LBT-RM the :func:`make_otid` layout built from the transport
    identity and the topic index (context id and transport index zero); for
    other transports their type code, a BLAKE2b digest of the transport body
    and the topic index at offset 11."""
    code = transport.TYPE
    if code in (Transport.TCP, Transport.LBTRU, Transport.LBTRM) and hasattr(transport, "ip"):
        session = getattr(transport, "session_id", 0)
        return make_otid(transport, topic_index & 0xFFFFFFFF, bytes(4), 0, session)
    digest = hashlib.blake2b(bytes((code,)) + transport.encode(), digest_size=26).digest()
    return (bytes((code & 0xFF,)) + digest[:10] + struct.pack("!I", topic_index & 0xFFFFFFFF)
            + digest[10:26] + b"\x00")


def otid_topic_index(otid: bytes) -> int | None:
    """The topic index inside a UM-layout OTID, None for an unknown transport code."""
    if len(otid) != OTID_SIZE:
        return None
    at = _OTID_TOPIC_INDEX_AT.get(otid[0])
    return None if at is None else struct.unpack_from("!I", otid, at)[0]


# ---------------------------------------------------------------- datagrams


def um_options(src_id: bytes, src_type: int = 0, domain_id: int = 0) -> list:
    """The packet options UM 6.x puts on every TR datagram, as a
    :attr:`lbmr_proto.Packet.options` list: source id ``src_id`` (8 bytes),
    source type (0 application, 1 TNWGD), version (UM 6.14) and local domain
    ``domain_id``."""
    return [SourceIdOption(0x8000, src_id), SourceTypeOption(0x80, src_type),
            VersionOption(VERSION_FLAGS, UM_VERSION), LocalDomainOption(0x8000, domain_id)]


def um_trailer(src_id: bytes, src_type: int = 0, domain_id: int = 0) -> bytes:
    """The packet-options trailer UM 6.x puts on every TR datagram
    (:func:`um_options`, encoded)."""
    return encode_packet_options(um_options(src_id, src_type, domain_id))


def pack_records(first: Sequence[bytes], tirs: Sequence[bytes], *, trailer: bytes,
                 max_datagram: int = DEFAULT_MAX_DATAGRAM,
                 ptype: int = PacketType.NORMAL) -> list[bytes]:
    """Batch encoded records into version-1 LBMR datagrams of packet type
    ``ptype`` of at most ``max_datagram`` bytes, each ending with ``trailer``
    (the encoded packet options): ``first`` are the records of the header's
    first count (TQRs, or WC-TQRs with ``ptype`` WC_TQR; at most 255 a
    datagram), ``tirs`` those of the second (TIRs; at most 65535), and the
    first kind precedes the second inside a datagram. Order is kept; a record
    larger than the room left starts a new datagram (one that does not fit
    even alone goes out alone). No records, no datagrams."""
    out: list[bytes] = []
    b0 = _V1 | HDR_OPTIONS_FLAG | ptype
    fixed = 4 + len(trailer)
    a: list[bytes] = []
    b: list[bytes] = []
    size = fixed

    def flush() -> None:
        nonlocal a, b, size
        if a or b:
            out.append(_HDR.pack(b0, len(a), len(b)) + b"".join(a) + b"".join(b) + trailer)
        a, b, size = [], [], fixed

    for rec in first:
        if size + len(rec) > max_datagram or len(a) >= MAX_TQRS:
            flush()
        a.append(rec)
        size += len(rec)
    for rec in tirs:
        if size + len(rec) > max_datagram or len(b) >= MAX_TIRS:
            flush()
        b.append(rec)
        size += len(rec)
    flush()
    return out
