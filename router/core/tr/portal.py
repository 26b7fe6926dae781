"""The state machine of one portal's topic resolution: :class:`PortalTR`.

Interest, queries, proxies and sources of one TRD share its tables, its timer
heap and its outgoing buffer; the rules it applies are in :mod:`router.core.tr`,
its settings in :mod:`.settings`. It owns no socket, no clock and no task:
every method takes ``now`` (seconds on any monotonic clock).
"""

from __future__ import annotations

import collections
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from lbmr_proto import (
    TIR,
    TQR,
    DomainIdOption,
    LBMRDecodeError,
    LBMREncodeError,
    OtidOption,
    SourceIdOption,
    SourceTypeOption,
    TopicResRequest,
    WcTQR,
    decode,
)
from lbmr_proto.constants import (
    PacketType,
    SourceType,
)
from lbmr_proto.um import EPS, Schedule, synthesize_otid

from ..interest import InterestIndex, Pattern, interest_of
from ..wildcard import PatternError
from .adverts import ProxyAdverts, origin_request_options
from .datagrams import DueRecords, TROutbox
from .domain_routes import DomainRouteRecords
from .events import (
    PATTERN_PCRE,
    PATTERN_REGEX,
    PATTERN_TOPIC,
    Addr,
    LocalInterest,
    Outgoing,
    ProxySource,
    RemoteInterestExpired,
    SourceGone,
    SourceSeen,
)
from .local_interest import LocalInterests
from .pacing import Pacer, query_step
from .settings import PortalTRSettings
from .timers import (
    DomainRouteTimer,
    InitialRequestTimer,
    InterestTimer,
    ProxyTimer,
    QueryTimer,
    RemoteCheckTimer,
    SourceTimer,
    Timer,
    TimerHeap,
)

__all__ = ["PortalTR"]

Key = tuple[int, str]  # interest: (pattern type, topic or pattern)


class PortalTR:
    """Topic resolution of one endpoint portal, made from its ``settings``
    (:class:`PortalTRSettings`) at ``now`` (rules: :mod:`router.core.tr`).

    ``max_remote_interests`` and ``max_remote_pattern_states`` start as the
    settings' and may be changed (the portal's limits when links share it:
    :mod:`router.core.endpoint_portal`).
    """

    def __init__(self, settings: PortalTRSettings, *, now: float) -> None:
        s = self.settings = settings
        self.name = s.name
        self.domain_id = s.domain_id
        self.src_id = s.src_id
        self.timing = s.timing
        self.max_remote_interests = s.max_remote_interests
        self.start = now
        # periodic re-queries: at most requery_rate a second (bursts of 50), each
        # requery_interval +- requery_jitter (a fraction) after the last
        self._requery_pacer = Pacer(s.requery_rate, 50)
        self._query_pacer = Pacer(s.query_rate, 500)
        self._checkers = {
            PATTERN_TOPIC: RemoteCheckTimer(s.remote_topic, now) if s.remote_topic else None,
            PATTERN_PCRE: RemoteCheckTimer(s.remote_pattern, now) if s.remote_pattern else None}
        self._rnd = random.Random(self.src_id)
        self._daemon_set = set(s.daemons)
        self._events: list = []
        self._st: Counter[str] = Counter()
        self._heap = TimerHeap()
        self._outbox = TROutbox(s, now, self._st)
        self.trailer = self._outbox.trailer
        # proxies (advertised here)
        self._adverts = ProxyAdverts(s, self._heap, self._st)
        # remote interest (queries) and local interest (TQRs), keyed (pattern type, topic)
        self._rint: dict[Key, QueryTimer] = {}
        # _rint's interest, to match (the patterns that compile), its states bounded
        self._remote: InterestIndex[Key] = InterestIndex(max_states=s.max_remote_pattern_states)
        # sources seen in the TRD
        self._sources: dict[tuple[str, bytes], SourceTimer] = {}
        self._src_by_topic: dict[str, dict[bytes, SourceTimer]] = {}
        self._local = LocalInterests(s, self._heap, self._st, self._events, self._outbox, self._adverts)
        # what runs a due timer, by the timer's class
        self._on_due: dict[type[Timer], Callable[[Any, float, DueRecords], None]] = {
            ProxyTimer: self._due_proxy, QueryTimer: self._due_query, SourceTimer: self._due_source,
            InterestTimer: self._due_interest, RemoteCheckTimer: self._due_remote_check,
            InitialRequestTimer: self._due_initial_request, DomainRouteTimer: self._due_domain_route}
        # remote domain route records (None: not sent)
        self._routes = (DomainRouteRecords(s.domain_routes, s.request_address, self._heap, self._st,
                                           self._outbox)
                        if s.domain_routes is not None and s.request_address is not None else None)
        ir = s.initial_request
        if ir is not None and ir[1] > 0:
            self._heap.arm(InitialRequestTimer(now, *ir))

    @property
    def max_remote_pattern_states(self) -> int:
        """The most NFA states the remote interest's distinct patterns may hold, summed."""
        return self._remote.max_states

    @max_remote_pattern_states.setter
    def max_remote_pattern_states(self, states: int) -> None:
        self._remote.max_states = states

    def __repr__(self) -> str:
        s = self.settings
        where = s.multicast if s.multicast is not None else list(s.daemons)
        return f"<PortalTR {self.name!r} domain {self.domain_id} {s.mode} {where}>"

    # ------------------------------------------------------------------ outputs

    def data_to_send(self) -> list[Outgoing]:
        """Everything queued for sending, in order; empties the buffer."""
        return self._outbox.drain()

    def events(self) -> list:
        """Events since the last call, in order; empties the list."""
        ev = self._events[:]  # the list is shared with the local interests
        self._events.clear()
        return ev

    def tick(self, now: float) -> list[Outgoing]:
        """Run everything due at ``now`` (advertisements, queries, expiries,
        keepalives), then return the whole outgoing buffer (:meth:`data_to_send`)."""
        due = DueRecords()
        heap = self._heap
        limit = now + EPS
        while (tm := heap.pop(limit)) is not None:
            if tm.due() <= limit:
                self._on_due[type(tm)](tm, now, due)
            if tm.alive:
                heap.arm(tm)
        out = self._outbox
        out.send_records(due, now, "tr")
        if self._routes is not None:
            self._routes.send(due, now)
        out.send_use_queries(now)
        out.send_keepalives(now)
        return out.drain()

    def next_deadline(self) -> float:
        """When :meth:`tick` next has something to do (``inf``: never by itself)."""
        return min(self._heap.next_at(), self._outbox.targets.keepalive_deadline())

    def current_daemon(self, now: float) -> int:
        """Index of the daemon that gets TR traffic at ``now`` (lbmrd mode)."""
        return self._outbox.targets.current_daemon(now)

    def destination(self, now: float) -> Addr:
        """Where TR datagrams sent at ``now`` go: the group or the current daemon."""
        return self._outbox.targets.destination(now)

    # ------------------------------------------------------------------ inputs

    def on_datagram(self, data: bytes, src: Addr, now: float) -> None:
        """One datagram received on the portal's TR socket from ``src``. TQR
        answers go to the outgoing buffer; events to :meth:`events`."""
        st = self._st
        st["datagrams_received"] += 1
        if (self.settings.multicast is None and self.settings.ignore_unknown_source
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
            self._local.on_topic_mgmt(pkt.tmb.tmrs, now)
            return
        if pkt.type == PacketType.EXT and isinstance(pkt.ext, TopicResRequest):
            st["tr_requests_received"] += 1
            if self._routes is not None:
                self._routes.on_tr_request(pkt.ext.flags, now)
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
        proxy_topics = self._adverts.topics
        for q in pkt.tqrs:
            st["tqrs_received"] += 1
            self._local.heard((PATTERN_TOPIC, q.topic), now)
            for aid, p in proxy_topics.get(q.topic, {}).items():
                answers[aid] = p.record
        for w in pkt.wc_tqrs:
            st["wc_tqrs_received"] += 1
            if w.pattern_type not in (PATTERN_PCRE, PATTERN_REGEX):
                st["wc_tqrs_bad_type"] += 1
                continue
            key = (w.pattern_type, w.pattern)
            self._local.heard(key, now)
            for topic, ps in proxy_topics.items():
                if self._local.covers(key, topic):
                    for aid, p in ps.items():
                        answers[aid] = p.record
        if answers:
            st["tirs_answered"] += len(answers)
            self._outbox.send_records(DueRecords(tirs=list(answers.values())), now, "answer")

    def add_remote_interest(self, topic: str, now: float, *, pattern_type: int = PATTERN_TOPIC) -> None:
        """The peer's receivers want ``topic`` (or pattern): query this TRD and
        report its sources. Known sources are reported at once (SourceSeen).
        Adding an existing interest is a refresh (known sources re-reported with
        first=False) and keeps it alive (``remote_topic``). ValueError if the
        topic cannot be an LBMR name, beyond ``max_remote_interests``, or for
        a pattern that would take the patterns held past
        ``max_remote_pattern_states`` (counted: ``remote_interest_refused``,
        ``remote_pattern_states_refused``). A pattern that cannot be matched
        is queried but matches no source (``bad_patterns``)."""
        if pattern_type not in (PATTERN_TOPIC, PATTERN_PCRE, PATTERN_REGEX):
            raise ValueError(f"unknown pattern type {pattern_type}")
        key = (pattern_type, topic)
        q = self._rint.get(key)
        if q is None:
            if len(self._rint) >= self.max_remote_interests:
                self._st["remote_interest_refused"] += 1
                raise ValueError(f"{len(self._rint)} remote interests already (limit "
                                 f"{self.max_remote_interests})")
            try:
                interest: str | Pattern | None = interest_of(pattern_type, topic)
            except PatternError:
                interest = None
            if interest is not None and not self._remote.fits(interest):
                self._st["remote_pattern_states_refused"] += 1
                raise ValueError(f"pattern {topic[:80]!r} ({interest.size} states) would take the remote "
                                 f"patterns past {self.max_remote_pattern_states} states")
            try:
                record = (TQR(topic) if pattern_type == PATTERN_TOPIC else WcTQR(topic, pattern_type)).encode()
            except LBMREncodeError as e:
                raise ValueError(f"cannot query {topic!r}: {e}") from None
            q = QueryTimer(key, record, now)
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
                self._heap.arm(ck)
            if interest is None:
                self._st["bad_patterns"] += 1  # queried, matches nothing
            else:
                self._remote.add(key, interest)
            if pattern_type == PATTERN_TOPIC and topic in self._src_by_topic:
                q.next_requery = now  # one query at once to verify, then the requery period
            else:
                q.sched = Schedule(now, self.timing.query_phase())
            self._heap.arm(q)
            self._st["remote_interest_added"] += 1
        else:
            q.refreshed = max(q.refreshed, now)
            self._st["remote_interest_refreshed"] += 1
        for s in self._matching_sources(key):
            first = not s.announced
            s.announced = True
            self._events.append(SourceSeen(s.topic, s.otid, s.body, first, s.index, s.tir_options))

    def cancel_remote_interest(self, topic: str, now: float, *, pattern_type: int = PATTERN_TOPIC) -> bool:
        """The peer no longer wants ``topic`` (or pattern): stop querying. Sources
        no longer wanted are not reported any more (no SourceGone: the caller
        withdraws what it advertised). Returns False if there was no such interest."""
        key = (pattern_type, topic)
        q = self._rint.pop(key, None)
        if q is None:
            return False
        q.alive = False
        covered = self._matching_sources(key)  # asked while it is held: its answers are cached
        self._remote.remove(key)
        for s in covered:
            if not self._remote.wants(s.topic):
                s.announced = False
        self._st["remote_interest_cancelled"] += 1
        return True

    def add_proxy(self, proxy: ProxySource, now: float) -> None:
        """Advertise ``proxy`` in this TRD from ``now`` (UM advertisement timing)
        and answer TQRs for its topic. The same advert id again with the same
        values changes nothing; with other values it replaces the proxy (its
        advertisements start over). ValueError for an unusable proxy."""
        self._adverts.add(proxy, now)

    def remove_proxy(self, advert_id: int, now: float) -> bool:
        """Stop advertising proxy ``advert_id`` and answering for it; send the final
        advertisements (:mod:`router.core.tr`). Returns False if there was no such proxy."""
        spec = self._adverts.remove(advert_id, now)
        if spec is None:
            return False
        self._local.proxy_removed(spec.topic, now)
        return True

    def set_reachable_domains(self, domains, now: float) -> None:
        """The router now reaches ``domains`` (ids; this TRD's own is left out):
        the remote domain route records announce them from ``now`` (a domain
        new to the set at once; see :mod:`router.core.tr.domain_routes`).
        Nothing is sent without ``domain_routes`` and ``request_address`` settings."""
        if self._routes is not None:
            self._routes.set_domains((d for d in domains if 0 < d <= 0xFFFFFFFF and d != self.domain_id), now)

    def reachable_domains(self) -> list[int]:
        """The domains the route records announce, by id (none without ``domain_routes``)."""
        return self._routes.domains() if self._routes is not None else []

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
        at = query_step(max(free, now))
        q.slot = at  # reserved: sent at ``at`` without further pacing
        q.next_requery = at
        self._heap.arm(q)
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
        return self._local.interests()

    def wants_proxy(self, topic: str) -> bool:
        """Does local interest (a TQR for ``topic``, or a pattern covering it) want
        a proxy of ``topic`` here?"""
        return self._local.wants(topic)

    def wants_source(self, topic: str) -> bool:
        """Does remote interest (the topic, or a pattern covering it) want
        sources of ``topic``?"""
        return self._remote.wants(topic)

    def count(self, what: str) -> None:
        """Count ``what`` in :meth:`stats` (for those sharing this portal)."""
        self._st[what] += 1

    def remote_interests(self) -> list[tuple[str, int]]:
        """The remote interests as (topic or pattern, pattern type)."""
        return [(t, pt) for pt, t in self._rint]

    def proxies(self) -> list[ProxySource]:
        return self._adverts.specs()

    def known_sources(self, topic: str) -> list[SourceSeen]:
        """The sources of ``topic`` currently known in this TRD (``first`` = not yet reported)."""
        return [SourceSeen(s.topic, s.otid, s.body, not s.announced, s.index, s.tir_options)
                for s in self._src_by_topic.get(topic, {}).values()]

    def stats(self) -> dict[str, int]:
        """Counters (only those that happened) and current sizes
        (``remote_pattern_states``: the NFA states of the remote interest's
        distinct patterns, summed; ``remote_checks_queued``: the entries
        waiting for the expiry checks of remote interest, stale ones
        included)."""
        d = dict(self._st)
        d.update(proxies=len(self._adverts), remote_interests=len(self._rint),
                 remote_pattern_states=self._remote.states,
                 remote_checks_queued=sum(len(ck.queue) for ck in self._checkers.values() if ck is not None),
                 local_interests=len(self._local), sources=len(self._sources),
                 domain_routes=len(self._routes) if self._routes is not None else 0,
                 events_pending=len(self._events), datagrams_pending=len(self._outbox))
        return d

    # ------------------------------------------------------------------ due timers, by kind

    def _due_proxy(self, tm: ProxyTimer, now: float, due: DueRecords) -> None:
        due.tirs.append(self._adverts.fire(tm, now))

    def _due_query(self, tm: QueryTimer, now: float, due: DueRecords) -> None:
        # every query within query_rate, periodic re-queries also within requery_rate:
        # a query over the rate gets the next free slot (reserved) and waits for it
        st = self._st
        if tm.slot is None:
            pacers = (self._query_pacer,) if tm.sched is not None else (
                self._query_pacer, self._requery_pacer)
            at = max(p.free_at(now) for p in pacers)
            for p in pacers:
                p.next = at + p.gap
            if at > now + EPS:
                tm.slot = at = query_step(at)
                if tm.sched is None:
                    tm.next_requery = at
                    st["requeries_deferred"] += 1
                else:
                    tm.sched.next = at
                    st["queries_deferred"] += 1
                return
        tm.slot = None
        if tm.key[0] == PATTERN_TOPIC:
            due.tqrs.append(tm.record)
            st["queries_sent"] += 1
        else:
            due.wcs.append(tm.record)
            st["wc_queries_sent"] += 1
        if tm.sched is not None:
            tm.sched.advance(now)
            if tm.sched.next == math.inf:  # the burst ended without a source
                tm.sched = None
                tm.next_requery = self._requery_at(now)
        else:
            tm.next_requery = self._requery_at(now)

    def _due_initial_request(self, tm: InitialRequestTimer, now: float, due: DueRecords) -> None:
        self._outbox.send_tr_request(now)
        tm.next = now + tm.period

    def _due_domain_route(self, tm: DomainRouteTimer, now: float, due: DueRecords) -> None:
        self._routes.due(tm, now, due)

    def _due_interest(self, li: InterestTimer, now: float, due: DueRecords) -> None:
        self._local.due(li, now)

    def _due_source(self, s: SourceTimer, now: float, due: DueRecords) -> None:
        self._drop_source(s, now)  # silent for source_timeout

    def _due_remote_check(self, ck: RemoteCheckTimer, now: float, due: DueRecords) -> None:
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

    # ------------------------------------------------------------------ internals

    def _requery_at(self, now: float) -> float:
        """When to query a remote interest again: ``requery_interval`` later,
        spread by ``requery_jitter`` (so that topics found together are not
        all re-queried in one burst)."""
        j = self.settings.requery_jitter
        return now + self.settings.requery_interval * (1.0 + j * (2.0 * self._rnd.random() - 1.0) if j else 1.0)

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
        multicast = self.settings.multicast is not None
        if multicast and getattr(body, "ip", None) == "0.0.0.0":
            body = replace(body, ip=src[0])  # INADDR_ANY: the sender's address (no lbmrd fills it in)
        # what crosses for late join and OTR (the source's request address among it)
        options = origin_request_options(tir.options, src[0] if multicast else None)
        if otid is None:
            otid = synthesize_otid(body, tir.index)
            st["otids_synthesised"] += 1
        if self._adverts.is_echo(otid, tir.transport, body):
            # our own proxy's TIR (same OTID *and* our relay address): a source of the
            # TRD that merely has an equal OTID (e.g. synthesised from an identical
            # private address in both TRDs) is still a source
            st["tirs_ignored_proxy_echo"] += 1
            return
        topic = tir.topic
        s = self._sources.get((topic, otid))
        wanted = self._remote.wants(topic)
        if s is None:
            if len(self._sources) >= self.settings.max_sources and not wanted:
                st["sources_not_kept"] += 1
                return
            s = SourceTimer(topic, otid, body, tir.index, now, self.settings.source_timeout, options)
            self._sources[(topic, otid)] = s
            self._src_by_topic.setdefault(topic, {})[otid] = s
            self._heap.arm(s)
            st["sources_added"] += 1
            changed = False
        else:
            s.last_seen = max(s.last_seen, now)
            s.tir_options = options  # (a change alone is not re-advertised: no frame per TIR)
            changed = s.body != body or s.index != tir.index
            if changed:
                s.body, s.index = body, tir.index
                st["sources_changed"] += 1
        if not wanted:
            return
        if not s.announced:
            s.announced = True
            self._events.append(SourceSeen(topic, otid, body, True, tir.index, options))
        elif changed:
            self._events.append(SourceSeen(topic, otid, body, False, tir.index, options))
        q = self._rint.get((PATTERN_TOPIC, topic))
        if q is not None and q.sched is not None:  # resolved: stop the burst, re-query later
            q.sched = None
            q.next_requery = self._requery_at(now)
            # the heap entry of the burst is now early; tick re-arms it at next_requery

    def _drop_source(self, s: SourceTimer, now: float) -> None:
        """Forget source ``s`` (:class:`SourceGone` if it was reported and is still wanted)."""
        s.alive = False
        del self._sources[(s.topic, s.otid)]
        ss = self._src_by_topic[s.topic]
        del ss[s.otid]
        if not ss:
            del self._src_by_topic[s.topic]
        if not (s.announced and self._remote.wants(s.topic)):
            self._st["sources_purged"] += 1
            return
        self._events.append(SourceGone(s.topic, s.otid))
        self._st["sources_gone"] += 1
        q = self._rint.get((PATTERN_TOPIC, s.topic))
        if q is not None and s.topic not in self._src_by_topic:
            q.sched = Schedule(now, self.timing.query_phase())  # look for another source
            self._heap.arm(q)

    def _matching_sources(self, key: Key) -> list[SourceTimer]:
        """The TRD's sources whose topic remote interest ``key`` (held) covers."""
        if key[0] == PATTERN_TOPIC:
            return list(self._src_by_topic.get(key[1], {}).values())
        covers = self._remote.covers
        return [s for t, ss in self._src_by_topic.items() if covers(key, t) for s in ss.values()]
