"""The remote domain route records a portal sends into its TRD
(:class:`DomainRouteRecords`), the DRO's "domain route messages".

A record (LBMR extended type 0x06, :class:`lbmr_proto.RemoteDomainRoute`)
names the domain ids reachable through one address: here the router's request
listener in the TRD, the portal's ``request_address`` (UM's
``TCP:domain:ip:port`` addressing; a UM context logs "Route discovered to
Domain ID ..." and sends its UIMs for those domains there).

* **What.** The domains the router reaches other than the portal's own
  (:meth:`DomainRouteRecords.set_domains`, from the router's routes), at most
  :data:`MAX_DOMAIN_ROUTES` (the smallest ids; the rest counted,
  ``domain_routes_refused``).
* **When.** Each domain on its own schedule (the DRO's ``<domain-route>``):
  a record at once when it becomes reachable, then at gaps of
  ``min_interval`` doubling up to ``max_interval``, then every
  ``max_interval`` while it stays reachable. A domain that is no longer
  reachable is simply not announced any more (the record has no withdrawal).
  Domains due together share datagrams (as many ids as ``max_datagram``
  holds).
* **Rate limit** (``limit``, the DRO's ``<rate-limit>`` of ``<domain-route>``,
  50 domains a second by default): each domain id is an object of 4 bytes and
  each datagram's header and trailer are charged to the bits limit; a domain
  over the limit waits for its reserved slot, rounded up to the next multiple
  of :data:`ROUTE_STEP` (0.1 s) so that held-back domains share datagrams
  (five a datagram at 50 a second). Bursts of at most 50 domains.
* **Answers.** A TR request (extended type 0x04) with the "gateway meta" flag
  (0x08; which flag UM uses to ask for routes is not public: this is our
  reading) makes every domain due at once, or ``min_interval`` after its
  last record if that is later, without restarting its doubling; within the
  rate limit. Requests closer than ``min_interval`` to the last one answered
  are counted (``route_requests_ignored``) and change nothing: a stream of
  requests costs at most one pass over the domains per ``min_interval``.

Counters (the portal's :meth:`~router.core.tr.portal.PortalTR.stats`):
``domain_routes_added``, ``domain_routes_removed``, ``domain_routes_refused``,
``domain_routes_sent`` (domain ids sent), ``domain_routes_deferred``,
``route_datagrams_sent``, ``route_requests_answered``,
``route_requests_ignored``; sizes ``domain_routes`` (reachable domains
announced). Times are seconds on the portal's clock.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

from lbmr_proto.constants import TRREQ_GATEWAY_META
from lbmr_proto.um import EPS, Schedule

from .datagrams import DueRecords, TROutbox
from .events import Addr
from .pacing import RatePacer
from .settings import DomainRoutes
from .timers import DomainRouteTimer, TimerHeap

__all__ = ["DomainRouteRecords", "MAX_DOMAIN_ROUTES", "ROUTE_BURST", "ROUTE_STEP", "route_step"]

#: Domains announced at most (the route map holds at most 2048 domains).
MAX_DOMAIN_ROUTES = 4096
#: Domain ids a burst may hold beyond the rate limit's steady pace.
ROUTE_BURST = 50
#: Seconds: a domain held back by the rate limit goes at the next multiple of this
#: (never earlier than its slot), with the others of that step in one datagram.
ROUTE_STEP = 0.1


def route_step(at: float) -> float:
    """When a domain whose reserved slot is ``at`` goes (a multiple of ``ROUTE_STEP``)."""
    return math.ceil(at / ROUTE_STEP - EPS) * ROUTE_STEP


class DomainRouteRecords:
    """The route records of one portal (module doc), sharing the portal's
    timer heap, counters and outgoing buffer."""

    def __init__(self, settings: DomainRoutes, address: Addr, heap: TimerHeap, stats: Counter[str],
                 outbox: TROutbox) -> None:
        self.settings = settings
        self.address = address  # (IPv4 address, TCP port) the records name: the request listener
        self._heap = heap
        self._st = stats
        self._outbox = outbox
        self._timers: dict[int, DomainRouteTimer] = {}
        self._pacer = RatePacer(settings.limit, ROUTE_BURST, outbox.max_datagram)
        # (initial min, initial max, initial duration, sustain interval, sustain duration):
        # doubling from min to max for ever
        self._phase = (settings.min_interval, settings.max_interval, math.inf, settings.max_interval, 0.0)
        self._answered = -math.inf  # when the last TR request was answered

    def __len__(self) -> int:
        return len(self._timers)

    def domains(self) -> list[int]:
        """The domains announced, by id."""
        return sorted(self._timers)

    def set_domains(self, domains: Iterable[int], now: float) -> None:
        """The domains to announce from ``now`` on (ids 1..2**32-1)."""
        want = sorted(set(domains))
        if len(want) > MAX_DOMAIN_ROUTES:
            self._st["domain_routes_refused"] += len(want) - MAX_DOMAIN_ROUTES
            want = want[:MAX_DOMAIN_ROUTES]
        keep = set(want)
        for d in [d for d in self._timers if d not in keep]:
            self._timers.pop(d).alive = False
            self._st["domain_routes_removed"] += 1
        for d in want:
            if d not in self._timers:
                tm = self._timers[d] = DomainRouteTimer(d, Schedule(now, self._phase))
                self._heap.arm(tm)
                self._st["domain_routes_added"] += 1

    def on_tr_request(self, flags: int, now: float) -> None:
        """A TR request with ``flags`` (extended type 0x04) heard in the TRD."""
        if not flags & TRREQ_GATEWAY_META or not self._timers:
            return
        gap = self.settings.min_interval
        if now < self._answered + gap - EPS:
            self._st["route_requests_ignored"] += 1
            return
        self._answered = now
        self._st["route_requests_answered"] += 1
        for tm in self._timers.values():
            at = max(now, tm.last_sent + gap)
            if tm.slot is None and at < tm.sched.next:
                tm.sched.next = at
                self._heap.arm(tm)

    def due(self, tm: DomainRouteTimer, now: float, due: DueRecords) -> None:
        """Timer ``tm`` is due: its domain joins ``due.routes`` (or waits for
        the slot the rate limit reserves)."""
        if tm.slot is None:
            at = self._pacer.reserve(now, 4)
            if at > now + EPS:
                tm.slot = tm.sched.next = route_step(at)
                self._st["domain_routes_deferred"] += 1
                return
        tm.slot = None
        tm.last_sent = now
        tm.sched.advance(now)
        due.routes.append(tm.domain)

    def send(self, due: DueRecords, now: float) -> None:
        """The datagrams of the domains due at ``now``."""
        if not due.routes:
            return
        n = self._outbox.send_domain_routes(sorted(due.routes), self.address, now)
        self._pacer.charge(now, n * self._outbox.route_overhead())
        self._st["domain_routes_sent"] += len(due.routes)
