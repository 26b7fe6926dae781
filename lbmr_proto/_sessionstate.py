"""The mergeable per-session state of the transport-session decoder: every
session found (:class:`SessionsState`), each session's counters
(:class:`SessionState`) and each receiver's (:class:`ReceiverState`), all
bounded; ``merge`` adds a later partition of the same capture. Private to
lbmr_proto; the public face is :mod:`lbmr_proto.transport_sessions`."""

from __future__ import annotations

import copy
import math
from collections import Counter
from dataclasses import dataclass, field

from ._sessionrecords import MAX_RECEIVERS, MAX_SESSIONS, MAX_SQNS, session_key, source_string


class Histogram:
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

    def merge(self, other: Histogram) -> None:
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
    recovery: Histogram = field(default_factory=Histogram)
    packets: int = 0
    zero_windows: int = 0
    resets: int = 0
    icmp_errors: int = 0  # ICMP port unreachable from the receiver's host quoting the source's datagrams to it

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
        for name in ("nak_packets", "nak_entries", "packets", "zero_windows", "resets", "icmp_errors"):
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
    retransmission (for merging recovery times). ``icmp_errors``: ICMP port
    unreachable errors quoting datagrams sent to the source (NAKs, ACKs,
    CREQs: the source is gone); ``receiver_icmp_errors``: those quoting the
    source's own datagrams (DATA, SM, NCF, RST: a receiver is gone).
    ``unnamed``: the session an LBT-RU TIR without session id advertises
    (session id 0); every session seen at its address takes its topics,
    source contexts and ``from_tir`` (and :meth:`SessionsState.joined` folds
    it into the one there)."""

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
    receiver_icmp_errors: int = 0
    unnamed: bool = False
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
        self.unnamed = self.unnamed or later.unnamed
        self.first_ts = min(self.first_ts, later.first_ts)
        self.last_ts = max(self.last_ts, later.last_ts)
        self.last_original_ts = max(self.last_original_ts, later.last_original_ts)
        self.lead_sqn = max(self.lead_sqn, later.lead_sqn)
        for name in ("originals", "original_bytes", "retransmissions", "retransmission_bytes",
                     "nak_packets", "nak_entries", "session_messages", "icmp_errors", "receiver_icmp_errors"):
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

    def joined(self) -> dict[str, SessionState]:
        """The sessions as the tables show them, by key: the session of an LBT-RU
        TIR without session id (``unnamed``, id 0; it holds the datagrams
        without session-id option sent before an id was seen at the address,
        e.g. a receiver's first CREQ) folded into the one session with an id
        seen at its address; with several there, it stays apart unless it saw
        nothing of its own. Copies where folded; the state is not changed."""
        named: dict[tuple[str, int], list[SessionState]] = {}
        for s in self.sessions.values():
            if s.transport == "LBTRU" and s.session_id:
                named.setdefault((s.ip, s.port), []).append(s)
        if not named:
            return self.sessions
        out = dict(self.sessions)
        for key, s in self.sessions.items():
            if not s.unnamed or s.session_id or s.transport != "LBTRU":
                continue
            there = named.get((s.ip, s.port), [])
            if len(there) == 1:
                one = there[0]
                folded = copy.deepcopy(s)
                folded.merge(copy.deepcopy(one), Counter())
                folded.session_id, folded.key = one.session_id, one.key
                out[one.key] = folded
                del out[key]
            elif there and not (math.isfinite(s.first_ts) or s.receivers or s.icmp_errors
                                or s.receiver_icmp_errors):
                del out[key]
        return out

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
