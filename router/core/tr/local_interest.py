"""Local interest of one portal's TRD: what its receivers want (their TQRs and
wildcard TQRs), how long that lasts (``interest_timeout``, or the DRO's use
queries) and the pacing of the INTEREST REFRESHes the peer gets for it
(:class:`LocalInterests`; the rules are in :mod:`router.core.tr`). Times are
seconds on the portal's clock.
"""

from __future__ import annotations

import math
from collections import Counter

from lbmr_proto.constants import (
    TMR_FLAG_RESPONSE,
    TMR_FLAG_WILDCARD_PCRE,
    TMR_FLAG_WILDCARD_REGEX,
    TMR_LEAVE,
    TMR_TOPIC_USE,
)
from lbmr_proto.um import EPS

from ..interest import InterestIndex, interest_of
from ..wildcard import PatternError
from .adverts import ProxyAdverts
from .datagrams import TROutbox, use_query_record
from .events import (
    PATTERN_PCRE,
    PATTERN_REGEX,
    PATTERN_TOPIC,
    LocalInterest,
    LocalInterestGone,
    LocalInterestRefresh,
)
from .pacing import RatePacer, interest_frame_size
from .settings import PortalTRSettings
from .timers import InterestTimer, TimerHeap

__all__ = ["LocalInterests"]

Key = tuple[int, str]  # (pattern type, topic or pattern)


class LocalInterests:
    """The live local interests of one portal, keyed ``(pattern type, topic or
    pattern)``. Their timers wait in the portal's ``heap``; use queries go to
    its ``outbox``, events (:class:`LocalInterest`, :class:`LocalInterestGone`,
    :class:`LocalInterestRefresh`) to its ``events`` list, counters to its
    ``stats``. An interest is held while it covers one of the portal's
    ``adverts`` when use queries are off. Which interest covers which topic
    is answered by one :class:`~router.core.interest.InterestIndex` (a
    pattern that cannot be matched is held, and queried, but covers nothing).
    """

    __slots__ = ("_settings", "_heap", "_st", "_events", "_outbox", "_adverts", "_lint", "_index",
                 "_use_pacers", "_refresh_pacers")

    def __init__(self, settings: PortalTRSettings, heap: TimerHeap, stats: Counter[str], events: list,
                 outbox: TROutbox, adverts: ProxyAdverts) -> None:
        s = self._settings = settings
        self._heap = heap
        self._st = stats
        self._events = events
        self._outbox = outbox
        self._adverts = adverts
        self._lint: dict[Key, InterestTimer] = {}
        self._index: InterestIndex[Key] = InterestIndex()  # _lint's interest, to match
        # the DRO's <rate-limit>s: use queries of topics / patterns, INTEREST REFRESHes
        use_default = (0.0, float(s.use_query_rate))
        self._use_pacers = (
            RatePacer(s.use_query_limit or use_default, 50, s.max_datagram),
            RatePacer(s.pattern_use_query_limit or use_default, 50, s.max_datagram))
        self._refresh_pacers = tuple(
            None if lim is None or not any(lim) else RatePacer(lim, 50, s.max_datagram)
            for lim in (s.refresh_limit, s.pattern_refresh_limit))

    def __len__(self) -> int:
        return len(self._lint)

    def interests(self) -> list[LocalInterest]:
        """The live local interests."""
        return [LocalInterest(t, pt != PATTERN_TOPIC, pt) for pt, t in self._lint]

    def wants(self, topic: str) -> bool:
        """Does local interest (``topic``, or a pattern covering it) want ``topic``?"""
        return self._index.wants(topic)

    def covers(self, key: Key, topic: str) -> bool:
        """Does local interest ``key`` (live) cover ``topic``?"""
        return self._index.covers(key, topic)

    def heard(self, key: Key, now: float) -> None:
        """A TQR (WC-TQR) for ``key``: the interest starts, or is refreshed."""
        li = self._lint.get(key)
        if li is not None:
            li.refreshed = max(li.refreshed, now)
            return
        s = self._settings
        topic_kind = key[0] == PATTERN_TOPIC
        pace = s.refresh_pacing if topic_kind else s.pattern_refresh_pacing
        li = InterestTimer(key, now, s.interest_timeout,
                           s.use_query if topic_kind else s.pattern_use_query,
                           pace[0] if pace is not None else math.inf)
        self._lint[key] = li
        try:
            self._index.add(key, interest_of(*key))
        except PatternError:
            pass  # held (it is queried), covers nothing
        self._heap.arm(li)
        self._events.append(LocalInterest(key[1], key[0] != PATTERN_TOPIC, key[0]))
        self._st["local_interest_added"] += 1

    def on_topic_mgmt(self, tmrs, now: float) -> None:
        """Topic management records from a context: a use response keeps the
        interest it names; a leave-topic notice (one receiver of the topic is
        gone) makes its interest due for a use query at once (others may remain)."""
        st = self._st
        for m in tmrs:
            pt = (PATTERN_PCRE if m.flags & TMR_FLAG_WILDCARD_PCRE
                  else PATTERN_REGEX if m.flags & TMR_FLAG_WILDCARD_REGEX else PATTERN_TOPIC)
            li = self._lint.get((pt, m.name))
            if m.type == TMR_TOPIC_USE and m.flags & TMR_FLAG_RESPONSE:
                st["use_responses_received"] += 1
                if li is not None:
                    li.refreshed = max(li.refreshed, now)
            elif m.type == TMR_LEAVE:
                st["leaves_received"] += 1
                if li is not None and li.uq is not None and li.slot is None and not li.unanswered:
                    li.refreshed = min(li.refreshed, now - li.uq.periodic_interval)
                    li.last_query = -math.inf
                    self._heap.arm(li)
            else:
                st["tmrs_ignored"] += 1

    def proxy_removed(self, topic: str, now: float) -> None:
        """The proxy of ``topic`` is no longer advertised: local interest it held
        starts counting down now."""
        for key in self._index.matches(topic):
            if not self._pinned(key):
                li = self._lint[key]
                li.refreshed = max(li.refreshed, now)

    def due(self, li: InterestTimer, now: float) -> None:
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
        s = self._settings
        pace = s.refresh_pacing if pt == PATTERN_TOPIC else s.pattern_refresh_pacing
        li.refresh_gap = min(li.refresh_gap * 2.0, pace[1])
        li.next_refresh = now + li.refresh_gap

    def _expire_or_use_query(self, li: InterestTimer, now: float) -> None:
        st = self._st
        pt, topic = li.key
        limit = now + EPS
        uq = li.uq
        if uq is None:  # no use queries: held by a proxy, else gone after interest_timeout
            if self._pinned(li.key):
                li.refreshed = now
                return
            self._drop(li, "local_interest_expired")
            return
        tmr = use_query_record(topic, pt)
        size = len(tmr.encode())
        pacer = self._use_pacers[pt != PATTERN_TOPIC]
        if li.slot is None:
            if li.refreshed >= li.last_query:
                li.unanswered = 0  # answered (or heard from) since the last use query
            if li.unanswered >= uq.max:
                self._drop(li, "local_interest_unanswered")
                return
            # one that waits goes in a datagram of its own: its headers are paid now
            at = pacer.reserve(now, size, self._outbox.use_query_overhead)
            if at > limit:
                li.slot = at
                st["use_queries_deferred"] += 1
                return
            self._outbox.queue_use_query(tmr, size, pacer)  # headers paid by the datagram it opens
        else:
            li.slot = None
            self._outbox.queue_use_query(tmr, size, None)  # paid in full when its slot was reserved
        li.unanswered += 1
        li.last_query = now
        st["use_queries_sent"] += 1

    def _drop(self, li: InterestTimer, why: str) -> None:
        li.alive = False
        del self._lint[li.key]
        self._index.remove(li.key)
        pt, topic = li.key
        self._events.append(LocalInterestGone(topic, pt != PATTERN_TOPIC, pt))
        self._st[why] += 1

    def _pinned(self, key: Key) -> bool:
        """Is local interest ``key`` held by a proxy we advertise?"""
        proxy_topics = self._adverts.topics
        if key[0] == PATTERN_TOPIC:
            return bool(proxy_topics.get(key[1]))
        return any(self._index.covers(key, t) for t in proxy_topics)
