"""The portal's timers: one class per kind of thing with a due time (a proxy's
advertisements, a remote interest's queries, a source's expiry, a local
interest's use queries and refreshes, the remote-interest checks, the start's
TR requests, a reachable domain's route records), and :class:`TimerHeap`, the heap they wait in. Each timer holds
the state its kind needs; :class:`~router.core.tr.portal.PortalTR` runs a due
timer with the handler it keeps for the timer's class. Times are seconds on
the portal's clock (``math.inf``: never).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
from abc import ABC, abstractmethod

from lbmr_proto.um import Schedule

from .events import ProxySource
from .settings import RemoteCheck, UseQuery

__all__ = ["Timer", "TimerHeap", "ProxyTimer", "QueryTimer", "SourceTimer", "InterestTimer",
           "RemoteCheckTimer", "InitialRequestTimer", "DomainRouteTimer"]


class Timer(ABC):
    """Something with a due time in the portal's timer heap. ``heap_at`` is the
    time of its one valid heap entry (inf: none); entries at other times are stale."""

    __slots__ = ("heap_at", "alive")

    def __init__(self) -> None:
        self.heap_at = math.inf
        self.alive = True

    @abstractmethod
    def due(self) -> float:
        """When this timer next needs attention (seconds; inf: never)."""


class TimerHeap:
    """Timers by due time. A timer has at most one valid entry (at its
    ``heap_at``); re-arming it earlier leaves the old entry stale, and stale
    entries (or those of timers no longer alive) are skipped."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()

    def arm(self, tm: Timer) -> None:
        """Make sure ``tm`` is in the heap at its due time or earlier."""
        d = tm.due()
        if d < tm.heap_at and d < math.inf:
            tm.heap_at = d
            heapq.heappush(self._heap, (d, next(self._seq), tm))

    def pop(self, limit: float) -> Timer | None:
        """The next live timer whose entry is at ``limit`` or earlier, taken
        out of the heap (``heap_at`` inf: re-arm it to keep it), or None."""
        heap = self._heap
        while heap and heap[0][0] <= limit:
            t, _, tm = heapq.heappop(heap)
            if tm.alive and t == tm.heap_at:
                tm.heap_at = math.inf
                return tm
        return None

    def next_at(self) -> float:
        """When the earliest live timer is due (inf: none)."""
        heap = self._heap
        while heap and (not heap[0][2].alive or heap[0][0] != heap[0][2].heap_at):
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf


class ProxyTimer(Timer):
    """A proxy advertised here: its TIR (``record``; the final one once removed)
    on UM's advertisement schedule."""

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


class QueryTimer(Timer):
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


class SourceTimer(Timer):
    """A source seen in the TRD (one TIR identity: topic + OTID)."""

    __slots__ = ("topic", "otid", "body", "index", "last_seen", "announced", "timeout", "tir_options")

    def __init__(self, topic: str, otid: bytes, body, index: int, now: float, timeout: float,
                 tir_options: bytes = b"") -> None:
        super().__init__()
        self.topic = topic
        self.otid = otid
        self.body = body
        self.index = index
        self.tir_options = tir_options  # its latest TIR's options that cross (as on the wire)
        self.last_seen = now
        self.announced = False  # reported to the caller (SourceSeen) and not withdrawn since
        self.timeout = timeout

    def due(self) -> float:
        return self.last_seen + self.timeout


class InterestTimer(Timer):
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


class RemoteCheckTimer(Timer):
    """Checks remote interests of one kind (exact topics, or patterns) for expiry."""

    __slots__ = ("check", "next", "queue")

    def __init__(self, check: RemoteCheck, now: float) -> None:
        super().__init__()
        self.check = check
        self.next = now + check.check_interval
        self.queue: collections.deque = collections.deque()  # (key, QueryTimer), round robin

    def due(self) -> float:
        return self.next if self.queue else math.inf


class InitialRequestTimer(Timer):
    """The TR request burst at start (``<initial-request>``)."""

    __slots__ = ("next", "period", "end")

    def __init__(self, now: float, period: float, duration: float) -> None:
        super().__init__()
        self.next, self.period, self.end = now, period, now + duration

    def due(self) -> float:
        return self.next if self.next < self.end else math.inf


class DomainRouteTimer(Timer):
    """A domain the router reaches: its remote domain route records, on the
    ``<domain-route>`` schedule (``sched``); ``slot``: the time the rate limit
    reserved for its next record (None: not reserved); ``last_sent``: when its
    last record went (-inf: never)."""

    __slots__ = ("domain", "sched", "slot", "last_sent")

    def __init__(self, domain: int, sched: Schedule) -> None:
        super().__init__()
        self.domain = domain
        self.sched = sched
        self.slot: float | None = None
        self.last_sent = -math.inf

    def due(self) -> float:
        return self.sched.next
