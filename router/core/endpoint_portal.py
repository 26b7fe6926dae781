"""One endpoint portal's topic resolution shared by all the links it serves, sans-IO.

An endpoint portal is one UM context in its TRD, as the DRO's is: one TR
socket, one source id (SourceIdOption), one :class:`router.core.tr.PortalTR`,
however many links (peer links, other endpoints of the router) it serves.
:class:`EndpointPortal` owns that PortalTR; each link's
:class:`router.core.bridge.Bridge` gets a :class:`PortalView` of it, with the
calls and answers of a PortalTR of its own:

* **Local interest** (the TRD's TQRs) is the portal's: its events
  (:class:`LocalInterest`, :class:`LocalInterestGone`,
  :class:`LocalInterestRefresh`) go to every view.
* **Remote interest** is each link's own: a view adds and cancels only its
  link's, and the PortalTR queries while any link wants a topic (the topic
  is cancelled there when the last link cancels it). :meth:`PortalView.
  remote_interests` and :meth:`PortalView.wants_source` answer for the link.
  Each link may hold ``max_remote_interests`` (the PortalTR's limit at
  creation) of its own, and patterns of at most ``max_remote_pattern_states``
  NFA states summed (the PortalTR's at creation:
  :data:`router.core.interest.MAX_HELD_STATES` by default; a pattern beyond
  it is refused and counted, ``remote_pattern_states_refused``): one link
  cannot take another's share, nor make every new topic cost more than its
  share of matcher steps. A remote
  interest that no link refreshes expires for every link that held it
  (:class:`RemoteInterestExpired` to each of them).
* **Sources.** :class:`SourceSeen` goes to the views whose interest covers
  the topic (one that a view's own call re-reports goes to that view only:
  another link is not sent the same advertisement again); :class:`SourceGone`
  to every view (a bridge ignores a source it did not advertise).
* **Proxies** are added and removed through the view of the link whose
  advertisement they serve, by that link's advert ids (each peer numbers its
  own: two links may both name an advert 1); the portal keys them by a
  number of its own. :meth:`PortalView.proxies` lists the link's.

The TRD's input and the timers are the portal's: :meth:`EndpointPortal.
on_datagram`, :meth:`EndpointPortal.tick` at :meth:`EndpointPortal.
next_deadline`; after any call (the portal's or a view's) every view may
hold events, which its bridge drains with :meth:`PortalView.events`. Times
are seconds on any monotonic clock, as in PortalTR.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from .interest import InterestIndex, Pattern, interest_of
from .tr import (
    PATTERN_TOPIC,
    LocalInterest,
    Outgoing,
    PortalTR,
    ProxySource,
    RemoteInterestExpired,
    SourceGone,
    SourceSeen,
)
from .wildcard import PatternError

__all__ = ["EndpointPortal", "PortalView"]

Key = tuple[int, str]  # (pattern type, topic or pattern), as PortalTR keys its interest


class PortalView:
    """A link's view of its endpoint's shared portal (module doc). Made by
    :meth:`EndpointPortal.view`; ``name`` says which link it is for."""

    def __init__(self, portal: EndpointPortal, name: str) -> None:
        self._portal = portal
        self.name = name
        self.domain_id = portal.tr.domain_id
        self._interest: set[Key] = set()
        # _interest, to match (the patterns that compile), its states bounded
        self._matching: InterestIndex[Key] = InterestIndex(max_states=portal.max_states_per_link)
        self._proxies: dict[int, int] = {}  # the link's advert id -> the portal's proxy id
        self._adverts: dict[int, int] = {}  # the portal's proxy id -> the link's advert id
        self._events: list = []

    # ------------------------------------------------------------------ the link's calls

    def add_remote_interest(self, topic: str, now: float, *, pattern_type: int = PATTERN_TOPIC) -> None:
        """As :meth:`PortalTR.add_remote_interest`, for this link (ValueError
        beyond the link's own share of interests or of pattern states)."""
        key = (pattern_type, topic)
        new = key not in self._interest
        interest: str | Pattern | None = None
        if new:
            if len(self._interest) >= self._portal.max_per_link:
                self._portal.tr.count("remote_interest_refused")
                raise ValueError(f"{len(self._interest)} remote interests already on this link "
                                 f"(limit {self._portal.max_per_link})")
            try:
                interest = interest_of(pattern_type, topic)
            except PatternError:
                pass  # held (the portal queries it), matches nothing (the portal counts it)
            if interest is not None and not self._matching.fits(interest):
                self._portal.tr.count("remote_pattern_states_refused")
                raise ValueError(f"pattern {topic[:80]!r} ({interest.size} states) would take this link's "
                                 f"patterns past {self._portal.max_states_per_link} states")
        self._portal.tr.add_remote_interest(topic, now, pattern_type=pattern_type)
        if new:
            self._interest.add(key)
            if interest is not None:
                self._matching.add(key, interest)
            self._portal.holders.setdefault(key, set()).add(self)
        self._portal.dispatch(caller=self)

    def cancel_remote_interest(self, topic: str, now: float, *, pattern_type: int = PATTERN_TOPIC) -> bool:
        """This link no longer wants ``topic`` (or pattern); the portal stops
        querying when no link does. False if this link had no such interest."""
        key = (pattern_type, topic)
        if key not in self._interest:
            return False
        self.forget_interest(key)
        holders = self._portal.holders.get(key)
        if holders is not None:
            holders.discard(self)
            if not holders:
                del self._portal.holders[key]
                self._portal.tr.cancel_remote_interest(topic, now, pattern_type=pattern_type)
        self._portal.dispatch(caller=self)
        return True

    def add_proxy(self, proxy: ProxySource, now: float) -> None:
        """As :meth:`PortalTR.add_proxy`; ``proxy.advert_id`` is the link's."""
        pid = self._proxies.get(proxy.advert_id)
        if pid is None:
            pid = next(self._portal.proxy_ids)
        self._portal.tr.add_proxy(replace(proxy, advert_id=pid), now)
        self._proxies[proxy.advert_id] = pid
        self._adverts[pid] = proxy.advert_id
        self._portal.dispatch(caller=self)

    def remove_proxy(self, advert_id: int, now: float) -> bool:
        pid = self._proxies.pop(advert_id, None)
        if pid is None:
            return False
        self._adverts.pop(pid, None)
        done = self._portal.tr.remove_proxy(pid, now)
        self._portal.dispatch(caller=self)
        return done

    def proxy_id(self, advert_id: int) -> int | None:
        """The portal's id of the proxy of the link's advertisement ``advert_id`` (what
        its TIR names as transport index), or None."""
        return self._proxies.get(advert_id)

    def advert_of(self, proxy_id: int) -> int | None:
        """The link's advert id the portal's proxy ``proxy_id`` stands for, or None."""
        return self._adverts.get(proxy_id)

    def requery(self, topic: str, now: float) -> float | None:
        return self._portal.tr.requery(topic, now)

    def heard_since(self, topic: str, otid: bytes, since: float) -> bool:
        return self._portal.tr.heard_since(topic, otid, since)

    def drop_source(self, topic: str, otid: bytes, now: float, *, silent_since: float = math.inf) -> bool:
        done = self._portal.tr.drop_source(topic, otid, now, silent_since=silent_since)
        self._portal.dispatch(caller=self)
        return done

    # ------------------------------------------------------------------ answers

    def events(self) -> list:
        """This link's events since the last call, in order; empties the list."""
        ev, self._events = self._events, []
        return ev

    def local_interests(self) -> list[LocalInterest]:
        return self._portal.tr.local_interests()

    def wants_proxy(self, topic: str) -> bool:
        return self._portal.tr.wants_proxy(topic)

    def wants_source(self, topic: str) -> bool:
        """Does this link's remote interest (the topic, or a pattern covering it)
        want sources of ``topic``?"""
        return self._matching.wants(topic)

    def remote_interests(self) -> list[tuple[str, int]]:
        return [(t, pt) for pt, t in self._interest]

    def proxies(self) -> list[ProxySource]:
        """The link's proxies (with the link's advert ids)."""
        advert_of = {pid: aid for aid, pid in self._proxies.items()}
        return [replace(p, advert_id=advert_of[p.advert_id]) for p in self._portal.tr.proxies()
                if p.advert_id in advert_of]

    def known_sources(self, topic: str) -> list[SourceSeen]:
        return self._portal.tr.known_sources(topic)

    def stats(self) -> dict[str, int]:
        """The shared portal's counters (one TR context for all the links)."""
        return self._portal.tr.stats()

    # ------------------------------------------------------------------ from the portal

    def deliver(self, event) -> None:
        """The portal hands this link an event (:meth:`EndpointPortal.dispatch`)."""
        self._events.append(event)

    def forget_interest(self, key: Key) -> None:
        """The link's interest ``key`` is gone (cancelled, or expired at the portal)."""
        self._interest.discard(key)
        self._matching.remove(key)


class EndpointPortal:
    """The shared topic resolution of one endpoint portal (module doc):
    ``tr`` is its :class:`router.core.tr.PortalTR` (its ``max_remote_interests``
    and ``max_remote_pattern_states`` are each link's share)."""

    def __init__(self, tr: PortalTR) -> None:
        self.tr = tr
        self.max_per_link = tr.max_remote_interests
        self.max_states_per_link = tr.max_remote_pattern_states
        self.views: list[PortalView] = []
        self.holders: dict[Key, set[PortalView]] = {}  # remote interest -> the links holding it
        self.proxy_ids = itertools.count(1)  # the portal's own numbering of the links' proxies

    def view(self, name: str) -> PortalView:
        """A new link's view (its share of remote interest added to the portal's limit)."""
        v = PortalView(self, name)
        self.views.append(v)
        self.tr.max_remote_interests = self.max_per_link * len(self.views)
        self.tr.max_remote_pattern_states = self.max_states_per_link * len(self.views)
        return v

    # ------------------------------------------------------------------ the TRD

    def on_datagram(self, data: bytes, src: tuple[str, int], now: float) -> None:
        self.tr.on_datagram(data, src, now)
        self.dispatch()

    def tick(self, now: float) -> list[Outgoing]:
        """Run the portal's timers; the TR datagrams to send (events go to the views)."""
        out = self.tr.tick(now)
        self.dispatch()
        return out

    def next_deadline(self) -> float:
        return self.tr.next_deadline()

    def set_reachable_domains(self, domains, now: float) -> None:
        """The domains the router reaches (its routes): the portal's remote
        domain route records announce them (:meth:`PortalTR.set_reachable_domains`)."""
        self.tr.set_reachable_domains(domains, now)

    def stats(self) -> dict[str, int]:
        return self.tr.stats()

    # ------------------------------------------------------------------ events

    def dispatch(self, caller: PortalView | None = None) -> None:
        """Hand the PortalTR's new events to the views they concern (module doc);
        ``caller``: the view whose call produced them."""
        for ev in self.tr.events():
            if isinstance(ev, SourceSeen):
                if caller is not None and not ev.first:
                    if caller.wants_source(ev.topic):
                        caller.deliver(ev)
                    continue
                for v in self.views:
                    if v.wants_source(ev.topic):
                        v.deliver(ev)
            elif isinstance(ev, RemoteInterestExpired):
                key = (ev.pattern_type, ev.topic)
                for v in self.holders.pop(key, ()):
                    v.forget_interest(key)
                    v.deliver(ev)
            elif isinstance(ev, SourceGone):
                for v in self.views:
                    v.deliver(ev)
            else:  # the TRD's local interest
                for v in self.views:
                    v.deliver(ev)
