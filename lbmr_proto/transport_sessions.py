"""UM transport sessions in captures, sans-IO: LBT-RM, LBT-RU and LBT-TCP
datagrams and streams decoded into typed records, and joined per session with
the session's topics, source context and receivers.

Calling contract
    :class:`TransportDecoder` takes, in capture order, the LBMR packets of the
    capture (:meth:`~TransportDecoder.lbmr`: its TIRs and TQRs) and every UDP
    datagram, TCP segment and ICMP error (:meth:`~TransportDecoder.packet`,
    the items of :func:`lbmr_proto.capture.read_packets`); ``packet`` returns
    the records the item decodes to (an empty list for traffic that is not a
    UM transport). :meth:`~TransportDecoder.feed` does both: a UDP datagram on
    an LBMR port is decoded as LBMR and learned, anything else goes to
    ``packet``. :attr:`TransportDecoder.state` is the per-session state so
    far: a :class:`SessionsState`, bounded, and mergeable with
    :meth:`SessionsState.merge` (partitions of one capture, merged in time
    order: counts add, sets unite, and a NAK still open at the end of one part
    is answered by the first retransmission of it in the next, as in one
    pass; an LBT-TCP stream cut by a partition resynchronises on the next
    message boundary). :func:`session_rows`, :func:`receiver_rows` and
    :func:`topic_rows` turn a state into the three tables.

Finding sessions (no "Decode As")
    * from the TIRs seen so far: LBT-RM (source ip, NAK port, session id,
      group, destination port), LBT-RU and LBT-TCP (ip, port, session id);
    * where no TIR was captured, from the protocols' own headers, accepted only
      when every byte is accounted for: an LBT-RM DATA, SM or NCF to a multicast
      group (version 0, no option headers, a DATA's payload whole LBMC
      messages, an SM or NCF exactly its length), an LBT-RM NAK whose header
      names the UDP port it is sent to, an LBT-RU datagram with a session-id
      option and exact length, a TCP stream opened by a SYN whose first bytes
      are whole LBMC messages with a TCP_SID header.
    Once a session is known its addresses classify later traffic, and traffic
    to or from them that does not decode is counted by reason
    (:attr:`SessionsState.errors`) and reported as a record with ``error`` set,
    never raised. With partitions, feed every partition's decoder the
    capture's TIRs first (:meth:`TransportDecoder.lbmr`) so that all classify
    alike.

Bad input (the keys of ``SessionsState.errors``)
    ``lbtrm_truncated``, ``lbtrm_nak_list`` (a NAK or NCF list shorter than
    announced), ``lbtrm_malformed``, ``lbtrm_bad_header`` (not version 0, on a
    known session's address), the same four for ``lbtru_``; ``lbmc_malformed``
    (a DATA payload that is not whole LBMC messages, or a message that does not
    decode); ``nak_duplicate_sqns`` (a NAK naming a sequence number twice; the
    NAK still counts); ``tcp_not_lbmc`` (bytes on an LBT-TCP connection that
    are not a message start), ``tcp_no_boundary`` (bytes dropped hunting for a
    message boundary), ``tcp_hole`` (a TCP hole skipped), ``tcp_sid_mismatch``
    (a TCP_SID header naming another session); ``lbmr_undecodable``. A
    datagram quoted in an ICMP error is counted as the session's
    ``icmp_errors``, never as a NAK, DATA or NCF of it.

Session names
    UM's source strings, session ids in lowercase hex (8 digits):
    ``LBTRM:ip:nakport:sessionid:group:dport``, ``LBTRU:ip:port:sessionid``,
    ``TCP:ip:port:sessionid``. The records' ``session`` field is the stable key
    (:func:`session_key`, the source string without LBT-RM's group and port,
    which are not in NAKs); the tables give both.

Record schema (stable; the Spark pipeline makes rows of it)
    :class:`TransportRecord`, one per datagram (TCP: per segment) and
    :class:`MessageRecord`, one per LBMC message inside one. Their fields,
    units and byte order are documented on the classes; ``-1`` stands for a
    field the packet kind has not (never None, so that columns keep one type).

Bounds
    Sessions (``MAX_SESSIONS``), receivers per session (``MAX_RECEIVERS``),
    topic indexes per session (``MAX_TOPICS``), distinct NAKed sequence numbers
    per session and receiver and outstanding NAKs per receiver
    (``MAX_SQNS``), retransmission times kept for merging (``MAX_SQNS``), TCP
    directions followed (``MAX_TCP_FLOWS``; only those are reassembled) and
    their held bytes (:mod:`lbmr_proto.tcpstream`): beyond a bound, new
    entries are not kept (TCP directions: the oldest is dropped) and
    ``SessionsState.overflow`` counts them.

Time is ``float`` seconds since the Unix epoch (capture time); byte counts are
UDP payload bytes (TCP: segment payload bytes); sequence numbers are the
protocols' u32 values (all protocol fields big-endian on the wire).
"""

from __future__ import annotations

import math
import struct
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from . import lbmc as C
from . import lbtrm as RM
from . import lbtru as RU
from ._capfile import UdpDatagram
from ._ippackets import IcmpError, TcpSegment
from .constants import LBMR_MC_PORT, LBMRD_PORT
from .errors import LBMRDecodeError
from .packet import decode as decode_lbmr
from .tcpstream import TcpStreams

__all__ = [
    "TransportRecord", "MessageRecord", "TransportDecoder", "SessionsState", "SessionState",
    "ReceiverState", "SessionRow", "ReceiverRow", "TopicRow", "session_rows", "receiver_rows",
    "topic_rows", "session_key", "source_string", "LBTRM", "LBTRU", "LBTTCP", "NCF_REASONS",
    "MAX_SESSIONS", "MAX_RECEIVERS", "MAX_TOPICS", "MAX_SQNS", "MAX_TCP_FLOWS",
]

LBTRM, LBTRU, LBTTCP = "LBTRM", "LBTRU", "TCP"
NCF_REASONS = {0: "no_retry", 1: "ignored", 2: "rx_delay", 3: "shed"}
MAX_SESSIONS = 4096
MAX_RECEIVERS = 256
MAX_TOPICS = 4096
MAX_SQNS = 65536
#: TCP connection directions followed at once (LBT-TCP ones, and new ones until their first bytes)
MAX_TCP_FLOWS = 4096
#: bytes of an LBT-TCP stream held while hunting for a message boundary (a hole, a mid-stream start)
RESYNC_WINDOW = 65536
_RU_NAMES = RU.TYPE_NAMES
_RM_DATA = struct.Struct("!BBHIIIB").unpack_from  # LBT-RM header + DATA's sqn, trail_sqn, flags_fec
_LBMC_DATA = C.DATA_HEADER.unpack_from
_PLAIN_DATA_KINDS = {k: C.KIND_NAMES[k] for k in C.DATA_KINDS}  # ver_type (version 0) -> kind name
_NO_FRAGMENT = (-1, -1, -1)
_RM_NAMES = RM.TYPE_NAMES
_TCP_SYN, _TCP_FIN, _TCP_RST = 0x02, 0x01, 0x04


# ------------------------------------------------------------------ records


class TransportRecord(NamedTuple):
    """One transport datagram (LBT-RM, LBT-RU), one TCP segment of an LBT-TCP
    connection, or one ICMP error quoting a transport datagram.

    ``ts``: capture time, seconds since the epoch; ``frame``: 1-based frame
    number; ``transport``: ``LBTRM``, ``LBTRU`` or ``TCP``; ``session``: the
    session key (:func:`session_key`); ``kind``: the packet type (LBT-RM:
    DATA, SM, NAK, NCF; LBT-RU: also ACK, CREQ, RST; TCP: SEGMENT, SYN, FIN,
    RST; ERROR when it did not decode); ``src``/``sport``/``dst``/``dport``:
    the datagram's addresses (for ICMP, the quoted datagram's); ``session_id``:
    the u32 session id in the header or option (-1: none); ``sqn``: DATA's
    sequence number, SM's ``sm_sqn``, ACK's ``ack_sqn``, TCP's u32 sequence
    number (-1 otherwise); ``trail_sqn``, ``lead_sqn``: the source's window
    (DATA, SM, NCF; -1 otherwise); ``retransmission``: a DATA datagram's
    retransmission flag; ``flags``: the header's flags (LBT-RM: the high
    nibble of ``flags_fec``; LBT-RU: ``flags_or_res``, i.e. SYN, the CREQ
    request or the RST reason; TCP: the flag byte); ``sqns``: a NAK's or
    NCF's list of sequence numbers, in wire order; ``reason``: an NCF's reason
    (0 do not retry, 1 ignored, 2 retransmit delay, 3 shed; -1 otherwise);
    ``client_id``: LBT-RU's client id option (-1: none); ``length``: UDP (TCP)
    payload bytes; ``icmp``: the datagram was quoted in an ICMP
    port-unreachable error (sent by the quoted destination's host) rather than
    captured itself; ``error``: why it did not decode ("" when it did).
    """

    ts: float
    frame: int
    transport: str
    session: str
    kind: str
    src: str
    sport: int
    dst: str
    dport: int
    session_id: int
    sqn: int
    trail_sqn: int
    lead_sqn: int
    retransmission: bool
    flags: int
    sqns: tuple[int, ...]
    reason: int
    client_id: int
    length: int
    icmp: bool
    error: str


class MessageRecord(NamedTuple):
    """One LBMC message inside a DATA datagram or an LBT-TCP stream.

    ``ts``/``frame``: the carrying datagram's (TCP: the segment that
    completed the message); ``transport``/``session``: as in
    :class:`TransportRecord`; ``kind``: MESSAGE, PRORX, RETRANS, CONTROL,
    EOT; ``tidx``: the u32 topic index (the TIR's ``index``), ``sqn`` the
    topic's u32 message sequence number (both 0 for CONTROL and EOT);
    ``topic``: the topic the session's TIRs give that index ("" unknown so
    far); ``msglen``: the message's bytes, header included; ``payload_len``:
    the bytes after the header chain; ``headers``: the chain's header types,
    by name (the class name without ``Header``, or ``0xNN``); ``fragment``:
    ``(first_sqn, offset, length)`` of a FRAG header (-1 each without one);
    ``retransmission``: carried in a retransmitted datagram; ``error``: why it
    did not decode ("" when it did).
    """

    ts: float
    frame: int
    transport: str
    session: str
    kind: str
    tidx: int
    sqn: int
    topic: str
    msglen: int
    payload_len: int
    headers: tuple[str, ...]
    fragment: tuple[int, int, int]
    retransmission: bool
    error: str


def source_string(transport: str, ip: str, port: int, session_id: int, group: str = "", dport: int = 0) -> str:
    """UM's source string of a session (session id in 8-digit lowercase hex)."""
    s = f"{transport}:{ip}:{port}:{session_id & 0xFFFFFFFF:08x}"
    return f"{s}:{group}:{dport}" if transport == LBTRM and group else s


def session_key(transport: str, ip: str, port: int, session_id: int) -> str:
    """The stable key of a session: its source string without LBT-RM's group
    and destination port (``port``: LBT-RM's NAK port, else the source port)."""
    return f"{transport}:{ip}:{port}:{session_id & 0xFFFFFFFF:08x}"


# ------------------------------------------------------------------ state


class _Histogram:
    """Durations (seconds) in buckets 2 % wide from 1 microsecond: mergeable,
    a few hundred buckets at most."""

    __slots__ = ("buckets", "count", "max")
    _BASE = math.log(1.02)

    def __init__(self) -> None:
        self.buckets: Counter[int] = Counter()
        self.count = 0
        self.max = 0.0

    def add(self, seconds: float) -> None:
        self.buckets[self._bucket(seconds)] += 1
        self.count += 1
        self.max = max(self.max, seconds)

    def _bucket(self, seconds: float) -> int:
        return 0 if seconds <= 1e-6 else int(math.log(seconds / 1e-6) / self._BASE) + 1

    def remove(self, seconds: float) -> None:
        """Take back a sample added before (the max stays: a merge replaces it by a longer one)."""
        b = self._bucket(seconds)
        if self.buckets[b] > 0:
            self.buckets[b] -= 1
            self.count -= 1
            if not self.buckets[b]:
                del self.buckets[b]

    def merge(self, other: _Histogram) -> None:
        self.buckets.update(other.buckets)
        self.count += other.count
        self.max = max(self.max, other.max)

    def quantile(self, q: float) -> float:
        """The q-quantile, to 2 % (the bucket's upper bound, at most the max); 0.0 when empty."""
        if not self.count:
            return 0.0
        rank, seen = q * self.count, 0
        for b in sorted(self.buckets):
            seen += self.buckets[b]
            if seen >= rank:
                return min(self.max, 1e-6 * 1.02 ** b)
        return self.max


@dataclass
class ReceiverState:
    """One receiver of a session: ``kind`` ``nak`` (an LBT-RM NAK sender),
    ``lbtru`` (an LBT-RU client), ``tcp`` (an LBT-TCP connection). Times in
    seconds since the epoch. ``outstanding``: sequence number -> time of the
    first NAK not yet followed by a retransmission of it; ``first_recovery``:
    sequence number -> the recovery time (seconds) of its first recovery here
    whose NAK came before any retransmission of it here (what a merge with an
    earlier part, where the NAK was outstanding already, must replace)."""

    address: str
    kind: str
    first_ts: float = math.inf
    last_ts: float = -math.inf
    nak_packets: int = 0
    nak_entries: int = 0
    naked: set = field(default_factory=set)
    outstanding: dict = field(default_factory=dict)
    fresh: set = field(default_factory=set)  # outstanding sqns NAKed before any retransmission of them here
    first_recovery: dict = field(default_factory=dict)
    recovery: _Histogram = field(default_factory=_Histogram)
    packets: int = 0
    zero_windows: int = 0
    resets: int = 0

    def seen(self, ts: float) -> None:
        self.first_ts = min(self.first_ts, ts)
        self.last_ts = max(self.last_ts, ts)
        self.packets += 1

    def recovered(self, sqn: int, ts: float) -> None:
        """A retransmission of ``sqn`` at ``ts``."""
        t = self.outstanding.pop(sqn, None)
        if t is None:
            return
        self.recovery.add(ts - t)
        if sqn in self.fresh:
            self.fresh.discard(sqn)
            if sqn not in self.first_recovery and len(self.first_recovery) < MAX_SQNS:
                self.first_recovery[sqn] = ts - t

    def merge(self, later: ReceiverState | None, later_rx_first: dict, overflow: Counter) -> None:
        """Add the same receiver in a later part of the capture (``later``
        None: not seen there); ``later_rx_first``: that part's first
        retransmission time per sequence number."""
        for s, t in list(self.outstanding.items()):
            r = later_rx_first.get(s)
            if r is None:
                continue
            del self.outstanding[s]
            self.fresh.discard(s)
            self.recovery.add(r - t)
            if later is not None and s in later.first_recovery:  # there, the NAK opened what was open here
                later.recovery.remove(later.first_recovery.pop(s))
        if later is None:
            return
        self.first_ts = min(self.first_ts, later.first_ts)
        self.last_ts = max(self.last_ts, later.last_ts)
        for name in ("nak_packets", "nak_entries", "packets", "zero_windows", "resets"):
            setattr(self, name, getattr(self, name) + getattr(later, name))
        _union(self.naked, later.naked, overflow, "naked_sqns")
        for s, t in later.outstanding.items():
            if s not in self.outstanding:
                if len(self.outstanding) < MAX_SQNS:
                    self.outstanding[s] = t
                    if s in later.fresh:
                        self.fresh.add(s)
                else:
                    overflow["outstanding_sqns"] += 1
        for s, d in later.first_recovery.items():
            if s not in self.first_recovery and len(self.first_recovery) < MAX_SQNS:
                self.first_recovery[s] = d
        self.recovery.merge(later.recovery)


def _union(into: set, other: set, overflow: Counter, what: str) -> None:
    for x in other:
        if x not in into:
            if len(into) < MAX_SQNS:
                into.add(x)
            else:
                overflow[what] += 1


@dataclass
class SessionState:
    """Counters of one transport session (see :func:`session_rows` for their
    meaning). ``topics``: topic index -> topic name, from the TIRs;
    ``messages``/``rx_messages``: topic index -> LBMC messages carried in
    original / retransmitted datagrams; ``ncf_packets``/``ncf_entries``: NCF
    reason -> count; ``rx_first``: sequence number -> time of its first
    retransmission (for merging recovery times)."""

    transport: str
    ip: str
    port: int
    session_id: int
    group: str = ""
    dport: int = 0
    from_tir: bool = False
    first_ts: float = math.inf
    last_ts: float = -math.inf
    last_original_ts: float = -math.inf
    originals: int = 0
    original_bytes: int = 0
    retransmissions: int = 0
    retransmission_bytes: int = 0
    lead_sqn: int = -1
    nak_packets: int = 0
    nak_entries: int = 0
    naked: set = field(default_factory=set)
    ncf_packets: Counter = field(default_factory=Counter)
    ncf_entries: Counter = field(default_factory=Counter)
    session_messages: int = 0
    control: Counter = field(default_factory=Counter)  # CREQ, ACK, RST, SYN (LBT-RU); SYN, FIN, RST (TCP)
    icmp_errors: int = 0
    topics: dict = field(default_factory=dict)
    messages: Counter = field(default_factory=Counter)
    rx_messages: Counter = field(default_factory=Counter)
    source_contexts: set = field(default_factory=set)
    receivers: dict = field(default_factory=dict)
    rx_first: dict = field(default_factory=dict)

    key: str = ""  # session_key(...), set on creation

    def __post_init__(self) -> None:
        self.key = session_key(self.transport, self.ip, self.port, self.session_id)

    @property
    def source(self) -> str:
        return source_string(self.transport, self.ip, self.port, self.session_id, self.group, self.dport)

    def receiver(self, address: str, kind: str, overflow: Counter) -> ReceiverState | None:
        r = self.receivers.get(address)
        if r is None:
            if len(self.receivers) >= MAX_RECEIVERS:
                overflow["receivers"] += 1
                return None
            r = self.receivers[address] = ReceiverState(address, kind)
        return r

    def merge(self, later: SessionState, overflow: Counter) -> None:
        """Add ``later`` (the same session, in a later part of the capture)."""
        self.group = self.group or later.group
        self.dport = self.dport or later.dport
        self.from_tir = self.from_tir or later.from_tir
        self.first_ts = min(self.first_ts, later.first_ts)
        self.last_ts = max(self.last_ts, later.last_ts)
        self.last_original_ts = max(self.last_original_ts, later.last_original_ts)
        self.lead_sqn = max(self.lead_sqn, later.lead_sqn)
        for name in ("originals", "original_bytes", "retransmissions", "retransmission_bytes",
                     "nak_packets", "nak_entries", "session_messages", "icmp_errors"):
            setattr(self, name, getattr(self, name) + getattr(later, name))
        _union(self.naked, later.naked, overflow, "naked_sqns")
        for name in ("ncf_packets", "ncf_entries", "control", "messages", "rx_messages"):
            getattr(self, name).update(getattr(later, name))
        for tidx, topic in later.topics.items():
            self.topics.setdefault(tidx, topic)
        self.source_contexts |= later.source_contexts
        for addr, mine in self.receivers.items():  # NAKs here answered by retransmissions there
            mine.merge(later.receivers.get(addr), later.rx_first, overflow)
        for addr, r in later.receivers.items():
            if addr in self.receivers:
                continue
            if len(self.receivers) < MAX_RECEIVERS:
                self.receivers[addr] = r
            else:
                overflow["receivers"] += 1
        for s, t in later.rx_first.items():
            if s not in self.rx_first and len(self.rx_first) < MAX_SQNS:
                self.rx_first[s] = t


@dataclass
class SessionsState:
    """Every session found so far, by :func:`session_key`; the TQRs' topic ->
    querying contexts (``ip:port`` of the LBMR sender); bad input by reason
    (``errors``) and what a bound kept out (``overflow``)."""

    sessions: dict = field(default_factory=dict)
    queries: dict = field(default_factory=dict)
    errors: Counter = field(default_factory=Counter)
    overflow: Counter = field(default_factory=Counter)

    def session(self, transport: str, ip: str, port: int, session_id: int) -> SessionState | None:
        key = session_key(transport, ip, port, session_id)
        s = self.sessions.get(key)
        if s is None:
            if len(self.sessions) >= MAX_SESSIONS:
                self.overflow["sessions"] += 1
                return None
            s = self.sessions[key] = SessionState(transport, ip, port, session_id & 0xFFFFFFFF)
        return s

    def merge(self, later: SessionsState) -> SessionsState:
        """Add ``later`` (a later part of the same capture) into this state; returns self."""
        for key, s in later.sessions.items():
            mine = self.sessions.get(key)
            if mine is not None:
                mine.merge(s, self.overflow)
            elif len(self.sessions) < MAX_SESSIONS:
                self.sessions[key] = s
            else:
                self.overflow["sessions"] += 1
        for topic, ctxs in later.queries.items():
            self.queries.setdefault(topic, set()).update(ctxs)
        self.errors.update(later.errors)
        self.overflow.update(later.overflow)
        return self


# ------------------------------------------------------------------ decoding helpers


def _multicast(ip: str) -> bool:
    head = ip.split(".", 1)[0]
    return head.isdigit() and 224 <= int(head) <= 239


def _lbmc_messages(payload: bytes) -> list[tuple[int, int]] | None:
    """(start, msglen) of each LBMC message if ``payload`` is whole messages back to back, else None."""
    out, pos, n = [], 0, len(payload)
    while pos < n:
        if n - pos < 4:
            return None
        try:
            _, msglen = C.check_start(payload, pos)
        except (C.LbmcDecodeError, IndexError):
            return None
        if pos + msglen > n:
            return None
        out.append((pos, msglen))
        pos += msglen
    return out


def _header_name(h) -> str:
    if isinstance(h, C.UnknownHeader):
        return f"0x{h.code:02x}"
    return type(h).__name__.removesuffix("Header")


# header size by the first byte of a message (0: not a version-0 message of a known kind)
_START_HLEN = bytes(0 if vt >> 4 else C.DATA_HEADER.size if vt in C.DATA_KINDS else C.CONTROL_HEADER.size
                    if vt in C.KIND_NAMES else 0 for vt in range(256))
_U16 = struct.Struct("!H").unpack_from


def _starts(data, off: int, n: int) -> int:
    """The msglen of a plausible message start at ``off`` (0: none there)."""
    hl = _START_HLEN[data[off]]
    if not hl or off + 4 > n:
        return 0
    ml = _U16(data, off + 2)[0]
    return ml if ml >= hl else 0


class _TcpFlow:
    """One direction of an LBT-TCP connection cut into LBMC messages. Holds at
    most one incomplete message (< 64 KiB) or, while hunting for a message
    boundary (a mid-stream start, a hole, bytes that are not LBMC), at most
    ``RESYNC_WINDOW`` + 4 bytes.

    Hunting: every offset of the held bytes is looked at once; a plausible
    message start (version 0, a known kind, ``msglen`` at least its header)
    is a candidate until the bytes at its end arrive. The first candidate
    followed by another plausible start, or whose message ends exactly where
    the bytes received end, is the boundary; a candidate followed by anything
    else is dropped. If the window fills without a boundary, its bytes are
    dropped (counted) and the hunt starts over."""

    __slots__ = ("session", "from_source", "receiver", "hunting", "buf", "_scanned", "_cands")

    def __init__(self, session: str, from_source: bool, receiver: str, hunting: bool) -> None:
        self.session = session
        self.from_source = from_source
        self.receiver = receiver
        self.hunting = hunting
        self.buf = b""
        self._scanned = 0  # hunting: offsets of buf below this were looked at
        self._cands: list[tuple[int, int]] = []  # hunting: (offset, end of its message), undecided

    def resync(self) -> None:
        """The next bytes do not continue the stream (a hole): drop what is held, hunt."""
        self.buf, self.hunting, self._scanned, self._cands = b"", True, 0, []

    def _hunt(self, buf) -> int:
        """The boundary's offset in ``buf`` (hunting ends), or -1 (keep hunting)."""
        n = len(buf)
        for off in range(self._scanned, max(n - 3, self._scanned)):
            ml = _starts(buf, off, n)
            if ml:
                self._cands.append((off, off + ml))
        self._scanned = max(n - 3, self._scanned)
        keep = []
        for off, end in self._cands:
            if end == n or (end + 4 <= n and _starts(buf, end, n)):
                self.hunting, self._scanned, self._cands = False, 0, []
                return off
            if end + 4 > n:
                keep.append((off, end))
        self._cands = keep
        return -1

    def feed(self, data: bytes) -> tuple[list[bytes], int, int]:
        """(whole messages, bad message starts met, times bytes were dropped hunting for a boundary)."""
        buf = self.buf + data if self.buf else data
        msgs: list[bytes] = []
        bad = lost = 0
        pos = 0
        while True:
            if self.hunting:
                off = self._hunt(buf)
                if off < 0:
                    full = len(buf) > RESYNC_WINDOW + 4
                    if full or not self._cands:
                        keep = max(len(buf) - 3, 0)  # (a start may straddle into the next bytes)
                        lost += keep > 0
                        self.buf, self._scanned, self._cands = bytes(buf[keep:]), 0, []
                    else:
                        self.buf = bytes(buf)
                    return msgs, bad, lost
                pos = off
            n = len(buf)
            while n - pos >= 4:
                ml = _starts(buf, pos, n)
                if not ml or pos + ml > n:
                    break
                msgs.append(bytes(buf[pos:pos + ml]))
                pos += ml
            if n - pos < 4 or _starts(buf, pos, n):
                self.buf = bytes(buf[pos:])
                return msgs, bad, lost
            bad += 1  # not a message start: hunt in what follows
            buf = buf[pos + 1:]
            pos = 0
            self.hunting, self._scanned, self._cands = True, 0, []


# ------------------------------------------------------------------ the decoder


class TransportDecoder:
    """Capture items in, transport records out; per-session state in
    :attr:`state` (see the module doc). ``lbmr_ports``: UDP ports carrying
    LBMR, never classified as transport traffic."""

    def __init__(self, *, lbmr_ports=frozenset({LBMR_MC_PORT, LBMRD_PORT})) -> None:
        self.state = SessionsState()
        self.lbmr_ports = frozenset(lbmr_ports)
        self._rm_groups: dict[tuple[str, int], set[str]] = {}  # (group, dport) -> session keys
        self._rm_naks: set[tuple[str, int]] = set()  # (source ip, NAK port)
        self._ru: dict[tuple[str, int], set[int]] = {}  # (source ip, port) -> session ids
        self._tcp: dict[tuple[str, int], set[int]] = {}  # (source ip, port) -> session ids
        self._streams = TcpStreams()
        self._flows: dict[tuple, _TcpFlow] = {}
        self._rm_sources: dict[tuple[str, int, int], SessionState] = {}  # (src, NAK port, id): a cache

    @property
    def tcp_directions(self) -> int:
        """TCP connection directions followed now (at most ``MAX_TCP_FLOWS``)."""
        return len(self._flows)

    # ---- topic resolution

    def lbmr(self, d: UdpDatagram, pkt) -> None:
        """Learn a decoded LBMR packet's TIRs (sessions, topics, source context)
        and TQRs (which contexts want which topics); ``d`` carried it."""
        ctx = f"{d.src}:{d.sport}"
        st = self.state
        for t in pkt.tirs:
            tr = t.transport
            name = getattr(tr, "NAME", "")
            if name == "LBTRM":
                s = st.session(LBTRM, tr.ip, tr.src_ucast_port, tr.session_id)
                if s is None:
                    continue
                s.group, s.dport = tr.mcast_group, tr.dest_port
                self._rm_groups.setdefault((tr.mcast_group, tr.dest_port), set()).add(s.key)
                self._rm_naks.add((tr.ip, tr.src_ucast_port))
            elif name == "LBTRU" or name == "TCP":
                s = st.session(LBTRU if name == "LBTRU" else LBTTCP, tr.ip, tr.port,
                               getattr(tr, "session_id", 0))
                if s is None:
                    continue
                (self._ru if name == "LBTRU" else self._tcp).setdefault((tr.ip, tr.port), set()).add(s.session_id)
            else:
                continue
            s.from_tir = True
            if t.index not in s.topics:
                if len(s.topics) < MAX_TOPICS:
                    s.topics[t.index] = t.topic
                else:
                    st.overflow["topics"] += 1
            if len(s.source_contexts) < MAX_RECEIVERS:
                s.source_contexts.add(ctx)
        for q in pkt.tqrs:
            ctxs = st.queries.get(q.topic)
            if ctxs is None:
                if len(st.queries) >= MAX_SESSIONS * 4:
                    st.overflow["queried_topics"] += 1
                    continue
                ctxs = st.queries[q.topic] = set()
            if len(ctxs) < MAX_RECEIVERS:
                ctxs.add(ctx)

    # ---- capture items

    def feed(self, p) -> list:
        """:meth:`packet`, and for a UDP datagram on an LBMR port, its LBMR packet
        decoded and learned (:meth:`lbmr`; an undecodable one is counted as
        ``errors['lbmr_undecodable']``)."""
        if isinstance(p, UdpDatagram) and (p.sport in self.lbmr_ports or p.dport in self.lbmr_ports):
            try:
                pkt = decode_lbmr(p.payload)
            except LBMRDecodeError:
                self.state.errors["lbmr_undecodable"] += 1
            else:
                self.lbmr(p, pkt)
            return []
        return self.packet(p)

    def packet(self, p) -> list:
        """The records of one item of :func:`~lbmr_proto.capture.read_packets`."""
        if isinstance(p, UdpDatagram):
            if p.sport in self.lbmr_ports or p.dport in self.lbmr_ports:
                return []
            return self._udp(p.ts, p.frame, p.src, p.sport, p.dst, p.dport, p.payload, False)
        if isinstance(p, TcpSegment):
            return self._tcp_segment(p)
        if isinstance(p, IcmpError):
            return self._icmp(p)
        return []

    def _record(self, ts, frame, transport, key, kind, src, sport, dst, dport, payload_len, *, sid=-1,
                sqn=-1, trail=-1, lead=-1, rx=False, flags=0, sqns=(), reason=-1, cid=-1, icmp=False,
                error="") -> TransportRecord:
        return TransportRecord(ts, frame, transport, key, kind, src, sport, dst, dport, sid, sqn, trail, lead,
                               rx, flags, tuple(sqns), reason, cid, payload_len, icmp, error)

    def _error(self, ts, frame, transport, key, src, sport, dst, dport, n, reason, icmp) -> list:
        self.state.errors[reason] += 1
        return [self._record(ts, frame, transport, key, "ERROR", src, sport, dst, dport, n, icmp=icmp,
                             error=reason)]

    def _udp(self, ts, frame, src, sport, dst, dport, payload, icmp) -> list:
        if not payload or payload[0] >> 4:
            if (dst, dport) in self._rm_groups or (dst, dport) in self._rm_naks:
                return self._error(ts, frame, LBTRM, "", src, sport, dst, dport, len(payload),
                                   "lbtrm_bad_header", icmp)
            if (src, sport) in self._ru or (dst, dport) in self._ru:
                return self._error(ts, frame, LBTRU, "", src, sport, dst, dport, len(payload),
                                   "lbtru_bad_header", icmp)
            return []
        known_rm = (dst, dport) in self._rm_groups or (dst, dport) in self._rm_naks
        if known_rm or (not ((src, sport) in self._ru or (dst, dport) in self._ru) and self._rm_shape(
                src, dst, dport, payload, icmp)):
            return self._lbtrm(ts, frame, src, sport, dst, dport, payload, icmp)
        if (src, sport) in self._ru or (dst, dport) in self._ru or self._ru_shape(payload, icmp):
            return self._lbtru(ts, frame, src, sport, dst, dport, payload, icmp)
        return []

    # ---- LBT-RM

    @staticmethod
    def _rm_shape(src, dst, dport, payload, icmp) -> bool:
        """Does an unknown datagram look like LBT-RM down to its last byte?"""
        n = len(payload)
        if n < 8 or payload[1] != 0:
            return False
        t = payload[0] & 0x0F
        if t == RM.NAK:
            if n < 12 or int.from_bytes(payload[2:4], "big") != dport or _multicast(dst):
                return False
            k = int.from_bytes(payload[8:10], "big")
            return k > 0 and (n == 12 + 4 * k or icmp)
        if not _multicast(dst):
            return False
        if t == RM.SM:
            return n == 24
        if t == RM.NCF:
            return n >= 16 and n == 16 + 4 * int.from_bytes(payload[12:14], "big")
        if t == RM.DATA:
            return n > 20 and _lbmc_messages(payload[20:]) is not None
        return False

    def _lbtrm(self, ts, frame, src, sport, dst, dport, payload, icmp) -> list:
        n = len(payload)
        if n >= 20 and not payload[0] and not payload[1] and not icmp:  # DATA, version 0, no options: inline
            _, _, port, sid, sqn, trail, fl = _RM_DATA(payload)
            s = self._rm_sources.get((src, port, sid))
            if s is None:
                s = self._rm_source(src, port, sid, dst, dport)
            key = s.key if s is not None else session_key(LBTRM, src, port, sid)
            rx = bool(fl & RM.FLAG_RETRANSMISSION)
            out = [TransportRecord(ts, frame, LBTRM, key, "DATA", src, sport, dst, dport, sid, sqn, trail, -1, rx,
                                   fl & 0xF0, (), -1, -1, n, False, "")]
            if s is not None:
                self._data(s, ts, sqn, n, rx)
            out += self._messages(s, ts, frame, LBTRM, key, payload[20:], rx)
            return out
        try:
            m = RM.decode(payload)
        except RM.LbtrmDecodeError as e:
            reason = "lbtrm_truncated" if "shorter" in str(e) else (
                "lbtrm_nak_list" if "announces" in str(e) else "lbtrm_malformed")
            key = ""
            if n >= 8 and not payload[0] >> 4:
                h = RM.HEADER.unpack_from(payload)
                ip = dst if (payload[0] & 0x0F) == RM.NAK else src
                key = session_key(LBTRM, ip, h[2], h[3])
            if icmp and n >= 8 and key:  # the quote may be cut short: the header names the session
                return self._rm_icmp(ts, frame, src, sport, dst, dport, payload, key)
            return self._error(ts, frame, LBTRM, key, src, sport, dst, dport, n, reason, icmp)
        h = m.header
        st = self.state
        if isinstance(m, RM.Nak):
            ip = dst
            if _multicast(dst):  # a multicast NAK: the source is the one of that group with this port and id
                want = session_key(LBTRM, "", h.ucast_port, h.session_id).split(":", 2)[2]
                for k in self._rm_groups.get((dst, dport), ()):
                    if k.endswith(":" + want):
                        ip = k.split(":")[1]
            s = st.session(LBTRM, ip, h.ucast_port, h.session_id)
        else:
            s = self._rm_source(src, h.ucast_port, h.session_id, dst, dport)
        key = session_key(LBTRM, ip if isinstance(m, RM.Nak) else src, h.ucast_port, h.session_id)
        if icmp:
            return self._rm_icmp(ts, frame, src, sport, dst, dport, payload, key, m)
        rec = self._record
        if isinstance(m, RM.Data):
            out = [rec(ts, frame, LBTRM, key, "DATA", src, sport, dst, dport, n, sid=h.session_id, sqn=m.sqn,
                       trail=m.trail_sqn, rx=m.retransmission, flags=m.flags)]
            if s is not None:
                self._data(s, ts, m.sqn, n, m.retransmission)
            out += self._messages(s, ts, frame, LBTRM, key, m.payload, m.retransmission)
            return out
        if s is not None:
            s.first_ts = min(s.first_ts, ts)
            s.last_ts = max(s.last_ts, ts)
        if isinstance(m, RM.SessionMessage):
            if s is not None:
                s.session_messages += 1
                s.lead_sqn = max(s.lead_sqn, m.lead_sqn)
            return [rec(ts, frame, LBTRM, key, "SM", src, sport, dst, dport, n, sid=h.session_id, sqn=m.sm_sqn,
                        trail=m.trail_sqn, lead=m.lead_sqn, flags=m.flags)]
        if isinstance(m, RM.Ncf):
            if s is not None:
                s.ncf_packets[m.reason] += 1
                s.ncf_entries[m.reason] += len(m.sqns)
            return [rec(ts, frame, LBTRM, key, "NCF", src, sport, dst, dport, n, sid=h.session_id,
                        trail=m.trail_sqn, sqns=m.sqns, reason=m.reason)]
        if s is not None:
            self._nak(s, f"{src}:{sport}", "nak", ts, m.sqns)
        return [rec(ts, frame, LBTRM, key, "NAK", src, sport, dst, dport, n, sid=h.session_id, sqns=m.sqns)]

    def _rm_source(self, src, port, sid, dst, dport) -> SessionState | None:
        """The session of a datagram its source sent (DATA, SM, NCF) to (dst, dport)."""
        s = self.state.session(LBTRM, src, port, sid)
        if s is None:
            return None
        if not s.group:
            s.group, s.dport = dst, dport
            self._rm_groups.setdefault((dst, dport), set()).add(s.key)
            self._rm_naks.add((src, port))
        if len(self._rm_sources) >= MAX_SESSIONS:
            self._rm_sources.clear()
        self._rm_sources[(src, port, sid)] = s
        return s

    def _rm_icmp(self, ts, frame, src, sport, dst, dport, payload, key, m=None) -> list:
        s = self.state.sessions.get(key)
        if s is not None:
            s.icmp_errors += 1
        h = RM.HEADER.unpack_from(payload)
        kind = _RM_NAMES.get(h[0] & 0x0F, "ERROR")
        return [self._record(ts, frame, LBTRM, key, kind, src, sport, dst, dport, len(payload), sid=h[3],
                             sqns=getattr(m, "sqns", ()), icmp=True)]

    def _data(self, s: SessionState, ts: float, sqn: int, n: int, rx: bool) -> None:
        if ts < s.first_ts:
            s.first_ts = ts
        if ts > s.last_ts:
            s.last_ts = ts
        if rx:
            s.retransmissions += 1
            s.retransmission_bytes += n
            if sqn not in s.rx_first:
                if len(s.rx_first) < MAX_SQNS:
                    s.rx_first[sqn] = ts
                else:
                    self.state.overflow["rx_first"] += 1
            for r in s.receivers.values():
                r.recovered(sqn, ts)
        else:
            s.originals += 1
            s.original_bytes += n
            if ts > s.last_original_ts:
                s.last_original_ts = ts
            if sqn > s.lead_sqn:
                s.lead_sqn = sqn

    def _nak(self, s: SessionState, receiver: str, kind: str, ts: float, sqns) -> None:
        s.nak_packets += 1
        s.nak_entries += len(sqns)
        s.first_ts = min(s.first_ts, ts)
        ov = self.state.overflow
        r = s.receiver(receiver, kind, ov)
        if len(set(sqns)) != len(sqns):
            self.state.errors["nak_duplicate_sqns"] += 1
        for q in sqns:
            if q not in s.naked:
                if len(s.naked) < MAX_SQNS:
                    s.naked.add(q)
                else:
                    ov["naked_sqns"] += 1
        if r is None:
            return
        r.seen(ts)
        r.nak_packets += 1
        r.nak_entries += len(sqns)
        for q in sqns:
            if q not in r.naked:
                if len(r.naked) < MAX_SQNS:
                    r.naked.add(q)
                else:
                    ov["naked_sqns"] += 1
            if q not in r.outstanding:
                if len(r.outstanding) < MAX_SQNS:
                    r.outstanding[q] = ts
                    if q not in s.rx_first:
                        r.fresh.add(q)
                else:
                    ov["outstanding_sqns"] += 1

    def _messages(self, s: SessionState | None, ts, frame, transport, key, payload, rx) -> list:
        spans = _lbmc_messages(payload)
        if spans is None:
            self.state.errors["lbmc_malformed"] += 1
            return [MessageRecord(ts, frame, transport, key, "ERROR", -1, -1, "", len(payload), 0, (),
                                  (-1, -1, -1), rx, "lbmc_malformed")]
        return [self._message(s, ts, frame, transport, key, payload[a:a + n], rx) for a, n in spans]

    def _message(self, s, ts, frame, transport, key, data, rx) -> MessageRecord:
        if not data[1] and data[0] in _PLAIN_DATA_KINDS:  # a data message without headers: inline
            _, _, msglen, tidx, sqn = _LBMC_DATA(data)
            topic = ""
            if s is not None:
                counter = s.rx_messages if rx else s.messages
                if tidx in counter or len(counter) < MAX_TOPICS:
                    counter[tidx] += 1
                else:
                    self.state.overflow["topics"] += 1
                topic = s.topics.get(tidx, "")
            return MessageRecord(ts, frame, transport, key, _PLAIN_DATA_KINDS[data[0]], tidx, sqn, topic, msglen,
                                 msglen - 12, (), _NO_FRAGMENT, rx, "")
        try:
            m = C.decode(data)
        except C.LbmcDecodeError:
            self.state.errors["lbmc_malformed"] += 1
            return MessageRecord(ts, frame, transport, key, "ERROR", -1, -1, "", len(data), 0, (),
                                 (-1, -1, -1), rx, "lbmc_malformed")
        frag = m.header(C.FragmentHeader)
        topic = ""
        if s is not None:
            if m.kind in C.DATA_KINDS:
                counter = s.rx_messages if rx else s.messages
                if m.tidx in counter or len(counter) < MAX_TOPICS:
                    counter[m.tidx] += 1
                else:
                    self.state.overflow["topics"] += 1
            topic = s.topics.get(m.tidx, "") if m.kind in C.DATA_KINDS else ""
            sid_h = m.header(C.TcpSidHeader)
            if sid_h is not None and transport == LBTTCP and s.session_id != sid_h.session_id:
                self.state.errors["tcp_sid_mismatch"] += 1
        return MessageRecord(ts, frame, transport, key, C.KIND_NAMES[m.kind], m.tidx, m.sqn, topic, len(data),
                             len(m.payload), tuple(_header_name(h) for h in m.headers),
                             (frag.first_sqn, frag.offset, frag.length) if frag else (-1, -1, -1), rx, "")

    # ---- LBT-RU

    @staticmethod
    def _ru_shape(payload, icmp) -> bool:
        if len(payload) < 4 or payload[1] != RU.OPT_SID:  # without a TIR: the session id option first
            return False
        try:
            m = RU.decode(payload)
        except RU.LbtruDecodeError:
            return False
        if m.header.session_id is None:
            return False
        if isinstance(m, RU.Data):
            return bool(m.payload) and _lbmc_messages(m.payload) is not None
        return True

    def _lbtru(self, ts, frame, src, sport, dst, dport, payload, icmp) -> list:
        n = len(payload)
        try:
            m = RU.decode(payload)
        except RU.LbtruDecodeError as e:
            known = self._ru.get((dst, dport)) or self._ru.get((src, sport))
            if icmp and n >= 4 and known:  # a quote cut short: the address names the session
                sip, sp = (dst, dport) if (dst, dport) in self._ru else (src, sport)
                key = session_key(LBTRU, sip, sp, next(iter(known)) if len(known) == 1 else 0)
                s = self.state.sessions.get(key)
                if s is not None:
                    s.icmp_errors += 1
                return [self._record(ts, frame, LBTRU, key, _RU_NAMES.get(payload[0] & 0x0F, "ERROR"), src,
                                     sport, dst, dport, n, flags=int.from_bytes(payload[2:4], "big"), icmp=True)]
            reason = "lbtru_truncated" if "shorter" in str(e) else (
                "lbtru_nak_list" if "announces" in str(e) else "lbtru_malformed")
            return self._error(ts, frame, LBTRU, "", src, sport, dst, dport, n, reason, icmp)
        h = m.header
        to_source = isinstance(m, (RU.Creq, RU.Ack, RU.Nak))
        sip, sp = (dst, dport) if to_source else (src, sport)
        rcv = f"{src}:{sport}" if to_source else f"{dst}:{dport}"
        sid = h.session_id
        if sid is None:
            known = self._ru.get((sip, sp), ())
            sid = next(iter(known)) if len(known) == 1 else 0
        s = self.state.session(LBTRU, sip, sp, sid)
        if s is not None and (sip, sp) not in self._ru:
            self._ru.setdefault((sip, sp), set()).add(s.session_id)
        key = session_key(LBTRU, sip, sp, sid)
        kind = _RU_NAMES[h.type]
        rec = dict(sid=-1 if h.session_id is None else h.session_id, flags=h.flags,
                   cid=-1 if h.client_id is None else h.client_id, icmp=icmp)
        if icmp:
            if s is not None:
                s.icmp_errors += 1
            return [self._record(ts, frame, LBTRU, key, kind, src, sport, dst, dport, n,
                                 sqns=getattr(m, "sqns", ()), **rec)]
        r = None if s is None else s.receiver(rcv, "lbtru", self.state.overflow)
        if r is not None and not isinstance(m, RU.Nak):
            r.seen(ts)
        if s is not None:
            s.first_ts = min(s.first_ts, ts)
            s.last_ts = max(s.last_ts, ts)
        out = []
        if isinstance(m, RU.Data):
            out.append(self._record(ts, frame, LBTRU, key, kind, src, sport, dst, dport, n, sqn=m.sqn,
                                    trail=m.trail_sqn, rx=m.retransmission, **rec))
            if s is not None:
                self._data(s, ts, m.sqn, n, m.retransmission)
            return out + self._messages(s, ts, frame, LBTRU, key, m.payload, m.retransmission)
        if isinstance(m, RU.SessionMessage):
            if s is not None:
                s.session_messages += 1
                s.lead_sqn = max(s.lead_sqn, m.lead_sqn)
                if m.syn:
                    s.control["SYN"] += 1
            return [self._record(ts, frame, LBTRU, key, kind, src, sport, dst, dport, n, sqn=m.sm_sqn,
                                 trail=m.trail_sqn, lead=m.lead_sqn, **rec)]
        if isinstance(m, RU.Ncf):
            if s is not None:
                s.ncf_packets[m.reason] += 1
                s.ncf_entries[m.reason] += len(m.sqns)
            return [self._record(ts, frame, LBTRU, key, kind, src, sport, dst, dport, n, trail=m.trail_sqn,
                                 sqns=m.sqns, reason=m.reason, **rec)]
        if isinstance(m, RU.Nak):
            if s is not None:
                self._nak(s, rcv, "lbtru", ts, m.sqns)
            return [self._record(ts, frame, LBTRU, key, kind, src, sport, dst, dport, n, sqns=m.sqns, **rec)]
        if s is not None:
            s.control[kind] += 1
            if isinstance(m, RU.Rst) and r is not None:
                r.resets += 1
        sqn = m.ack_sqn if isinstance(m, RU.Ack) else -1
        return [self._record(ts, frame, LBTRU, key, kind, src, sport, dst, dport, n, sqn=sqn, **rec)]

    # ---- ICMP

    def _icmp(self, e: IcmpError) -> list:
        if e.type != 3 or e.code != 3 or len(e.payload) < 4:
            return []
        if e.sport in self.lbmr_ports or e.dport in self.lbmr_ports:
            return []
        return self._udp(e.ts, e.frame, e.src, e.sport, e.dst, e.dport, e.payload, True)

    # ---- LBT-TCP

    def _tcp_session(self, seg: TcpSegment) -> tuple[str, int, int, bool] | None:
        """(source ip, port, session id, segment from the source) of a segment of a known TCP session."""
        for ip, port, from_source in ((seg.src, seg.sport, True), (seg.dst, seg.dport, False)):
            sids = self._tcp.get((ip, port))
            if sids:
                return ip, port, next(iter(sids)) if len(sids) == 1 else 0, from_source
        return None

    def _tcp_segment(self, seg: TcpSegment) -> list:
        known = self._tcp_session(seg)
        direction = (seg.src, seg.sport, seg.dst, seg.dport)
        if known is None and seg.flags & _TCP_SYN and not seg.flags & 0x10:
            # a connection opening: follow it until its first bytes say whether it is LBT-TCP
            self._add_flow(direction, _TcpFlow("", False, f"{seg.src}:{seg.sport}", False))
            self._add_flow((seg.dst, seg.dport, seg.src, seg.sport),
                           _TcpFlow("", True, f"{seg.src}:{seg.sport}", False))
        if known is None and direction not in self._flows:
            return []
        out: list = []
        if known is not None:
            ip, port, sid, from_source = known
            key = session_key(LBTTCP, ip, port, sid)
            s = self.state.session(LBTTCP, ip, port, sid)
            rcv = f"{seg.dst}:{seg.dport}" if from_source else f"{seg.src}:{seg.sport}"
            flags = seg.flags
            kind = ("RST" if flags & _TCP_RST else "SYN" if flags & _TCP_SYN else "FIN" if flags & _TCP_FIN
                    else "SEGMENT")
            if s is not None:
                s.first_ts = min(s.first_ts, seg.ts)
                s.last_ts = max(s.last_ts, seg.ts)
                r = s.receiver(rcv, "tcp", self.state.overflow)
                if r is not None:
                    r.seen(seg.ts)
                    if not from_source and seg.window == 0 and not flags & (_TCP_RST | _TCP_SYN | _TCP_FIN):
                        r.zero_windows += 1
                    if flags & _TCP_RST:
                        r.resets += 1
                if kind != "SEGMENT" and not (kind == "SYN" and flags & 0x10):
                    s.control[kind] += 1
                if from_source and seg.payload:
                    s.originals += 1
                    s.original_bytes += len(seg.payload)
                    s.last_original_ts = max(s.last_original_ts, seg.ts)
            if kind != "SEGMENT" or seg.payload:
                out.append(self._record(seg.ts, seg.frame, LBTTCP, key, kind, seg.src, seg.sport, seg.dst,
                                        seg.dport, len(seg.payload), sid=sid, sqn=seg.seq, flags=flags))
            flow = self._flows.get(direction)
            if flow is None or flow.session != key:
                self._flows.pop(direction, None)
                self._add_flow(direction, _TcpFlow(key, from_source, rcv, not seg.flags & _TCP_SYN))
        if direction not in self._flows:  # (only the connections followed are reassembled)
            return out
        for chunk in self._streams.feed(seg):
            flow = self._flows.get(chunk.direction)
            if flow is not None:
                out += self._tcp_bytes(flow, chunk)
        if seg.flags & (_TCP_FIN | _TCP_RST):
            self._flows.pop(direction, None)
            if seg.flags & _TCP_RST:
                self._flows.pop((seg.dst, seg.dport, seg.src, seg.sport), None)
        return out

    def _add_flow(self, direction: tuple, flow: _TcpFlow) -> None:
        """Follow a TCP direction; beyond MAX_TCP_FLOWS the oldest followed is dropped."""
        if direction in self._flows:
            return
        while len(self._flows) >= MAX_TCP_FLOWS:
            self._flows.pop(next(iter(self._flows)))
            self.state.overflow["tcp_flows"] += 1
        self._flows[direction] = flow

    def _tcp_bytes(self, flow: _TcpFlow, chunk) -> list:
        if chunk.resync and flow.session:
            flow.resync()
            if chunk.skipped:
                self.state.errors["tcp_hole"] += 1
        msgs, bad, lost = flow.feed(chunk.data)
        if not flow.session:  # a new connection: LBT-TCP only if its first bytes are messages
            if bad or lost:
                self._flows.pop(chunk.direction, None)
                return []
            return self._tcp_learn(flow, chunk, msgs) if msgs else []
        if bad:
            self.state.errors["tcp_not_lbmc"] += bad
        if lost:
            self.state.errors["tcp_no_boundary"] += lost
        s = self.state.sessions.get(flow.session)
        return [self._message(s, chunk.ts, chunk.frame, LBTTCP, flow.session, m, False) for m in msgs]

    def _tcp_learn(self, flow: _TcpFlow, chunk, msgs: list[bytes]) -> list:
        """A connection with no TIR: LBT-TCP if its first message carries a TCP_SID header."""
        try:
            first = C.decode(msgs[0])
        except C.LbmcDecodeError:
            first = None
        sid_h = None if first is None else first.header(C.TcpSidHeader)
        src, sport, dst, dport = chunk.direction
        if sid_h is None:
            self._flows.pop(chunk.direction, None)
            self._flows.pop((dst, dport, src, sport), None)
            return []
        ip, port = (src, sport) if flow.from_source else (dst, dport)
        s = self.state.session(LBTTCP, ip, port, sid_h.session_id)
        if s is None:
            return []
        self._tcp.setdefault((ip, port), set()).add(s.session_id)
        for d in (chunk.direction, (dst, dport, src, sport)):
            f = self._flows.get(d)
            if f is not None:
                f.session = s.key
        s.first_ts = min(s.first_ts, chunk.ts)
        s.last_ts = max(s.last_ts, chunk.ts)
        return [self._message(s, chunk.ts, chunk.frame, LBTTCP, s.key, m, False) for m in msgs]


# ------------------------------------------------------------------ tables


class SessionRow(NamedTuple):
    """One transport session. Times: seconds since the epoch; ``lead_sqn``: the
    newest data sequence number sent (original DATA or an SM's lead; -1 none);
    ``rate_bps``:
    original datagram bytes per second between the first and last original
    datagram (0.0 with fewer than two); bytes: UDP (TCP) payload bytes;
    ``ncf_*``: NCFs by reason (packets); ``lbmc_messages``: LBMC data messages
    (MESSAGE, PRORX, RETRANS; not CONTROL or EOT) carried; ``receivers``: ``ip:port`` of NAK
    senders, LBT-RU clients and TCP connections, then ``ctx:ip:port`` of the
    contexts whose TQRs asked for one of the session's topics."""

    session: str
    source: str
    transport: str
    source_ip: str
    port: int
    group: str
    dport: int
    session_id: int
    from_tir: bool
    topics: tuple[str, ...]
    source_contexts: tuple[str, ...]
    originals: int
    original_bytes: int
    retransmissions: int
    retransmission_bytes: int
    first_ts: float
    last_ts: float
    last_original_ts: float
    lead_sqn: int
    rate_bps: float
    nak_packets: int
    nak_entries: int
    naked_sqns: int
    ncf_no_retry: int
    ncf_ignored: int
    ncf_rx_delay: int
    ncf_shed: int
    session_messages: int
    control: tuple[tuple[str, int], ...]
    icmp_errors: int
    lbmc_messages: int
    receivers: tuple[str, ...]


class ReceiverRow(NamedTuple):
    """One (session, receiver). ``loss_estimate``: distinct sequence numbers
    the receiver NAKed / the session's original datagrams (0.0 with none);
    ``recovery_p50``/``recovery_max``: seconds from a sequence number's first
    NAK to the first retransmission of it after (p50 to 2 %); ``outstanding``:
    sequence numbers NAKed and never retransmitted after, ascending (at most
    100 listed; ``outstanding_count`` all), i.e. still missing when the source
    went silent (``silent_ts``: its last original datagram)."""

    session: str
    receiver: str
    kind: str
    first_ts: float
    last_ts: float
    packets: int
    nak_packets: int
    nak_entries: int
    naked_sqns: int
    loss_estimate: float
    recovered: int
    recovery_p50: float
    recovery_max: float
    outstanding_count: int
    outstanding: tuple[int, ...]
    silent_ts: float
    zero_windows: int
    resets: int


class TopicRow(NamedTuple):
    """One (session, topic index): LBMC data messages in original and in
    retransmitted datagrams; ``topic`` "" when no TIR named the index."""

    session: str
    tidx: int
    topic: str
    messages: int
    rx_messages: int


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def session_rows(state: SessionsState) -> list[SessionRow]:
    """The session table, ordered by session key."""
    out = []
    for key in sorted(state.sessions):
        s = state.sessions[key]
        topics = tuple(s.topics[i] for i in sorted(s.topics))
        wanted = set(s.topics.values())
        ctxs = sorted({c for t in wanted for c in state.queries.get(t, ())})
        span = s.last_original_ts - s.first_ts
        rate = s.original_bytes / span if s.originals > 1 and span > 0 else 0.0
        out.append(SessionRow(
            key, s.source, s.transport, s.ip, s.port, s.group, s.dport, s.session_id, s.from_tir, topics,
            tuple(sorted(s.source_contexts)), s.originals, s.original_bytes, s.retransmissions,
            s.retransmission_bytes, _finite(s.first_ts), _finite(s.last_ts), _finite(s.last_original_ts), s.lead_sqn, rate,
            s.nak_packets, s.nak_entries, len(s.naked), s.ncf_packets[0], s.ncf_packets[1], s.ncf_packets[2],
            s.ncf_packets[3], s.session_messages, tuple(sorted(s.control.items())), s.icmp_errors,
            sum(s.messages.values()) + sum(s.rx_messages.values()),
            tuple(sorted(s.receivers)) + tuple(f"ctx:{c}" for c in ctxs)))
    return out


def receiver_rows(state: SessionsState) -> list[ReceiverRow]:
    """The (session, receiver) table, ordered by session key and receiver."""
    out = []
    for key in sorted(state.sessions):
        s = state.sessions[key]
        for addr in sorted(s.receivers):
            r = s.receivers[addr]
            pending = sorted(r.outstanding)
            out.append(ReceiverRow(
                key, addr, r.kind, _finite(r.first_ts), _finite(r.last_ts), r.packets, r.nak_packets,
                r.nak_entries, len(r.naked), len(r.naked) / s.originals if s.originals else 0.0,
                r.recovery.count, r.recovery.quantile(0.5), r.recovery.max, len(pending), tuple(pending[:100]),
                _finite(s.last_original_ts), r.zero_windows, r.resets))
    return out


def topic_rows(state: SessionsState) -> list[TopicRow]:
    """The (session, topic index) table: every index carried or named by a TIR."""
    out = []
    for key in sorted(state.sessions):
        s = state.sessions[key]
        for tidx in sorted(set(s.messages) | set(s.rx_messages) | set(s.topics)):
            out.append(TopicRow(key, tidx, s.topics.get(tidx, ""), s.messages[tidx], s.rx_messages[tidx]))
    return out

