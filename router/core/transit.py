"""Interest and advertisements passed on from one peer link to another, sans-IO:
what makes a router a hop on a multi-hop path.

Interest spreads from the router of the receivers' domain (its *origin
router*, :meth:`router.core.routing.Routing.origin_router`) along that router's
lowest-cost tree: a router passes an INTEREST whose origin is domain ``r`` to
its children in the tree of ``r``'s router
(:meth:`~router.core.routing.Routing.children_links`), so every router gets each
interest once, from its parent, and in a loop or a mesh nobody gets it twice.
The interest of our own endpoints' receivers takes the same way (the bridges
ask :meth:`Routing.children_links` before sending it); this module passes on
the interest that arrived on a peer link.

Advertisements come back the way the interest went: a source advertised to us
on link ``L`` is proxied here (the owner bridge of ``L`` runs the proxy
listener and advertises it in our first endpoint's TRD), and the proxy is
advertised, as a source of its own (:meth:`Transit.advert_source` is where a
stream for it connects: the proxy), on every other link that holds interest
matching its topic, with the hop count plus one. A router advertises a source
(topic, OTID) at most once per link, never back on the link it came from, and
never past ``max_hop_count`` hops: no advertisement can loop.

When the routes change (:meth:`Transit.resync`) the interest sent on each
link is brought in line with the new trees: ADD to new children, CANCEL to
former ones; a cancelled interest withdraws the advertisements it caused.

Inputs take ``now`` (seconds) where time matters; outputs are
:class:`SendOnLink` items returned by each call.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .. import peerlink as P
from .interest import MAX_HELD_STATES, InterestIndex, Pattern
from .routing import Routing
from .sessions import carried, session_key
from .wildcard import PatternError

__all__ = ["SendOnLink", "Transit", "MAX_TRANSIT_INTERESTS", "MAX_TRANSIT_PATTERNS",
           "MAX_TRANSIT_PATTERN_STATES"]

MAX_TRANSIT_INTERESTS = 100_000  # interests (topic or pattern, type, origin) held for each link
# patterns among them (per link): every advertisement from another link is matched against
# each, and a search costs up to the pattern's NFA states per character of the topic, so
# a link's patterns are bounded by count and by their distinct patterns' states summed
# (router.core.interest.MAX_HELD_STATES, the bound of a peer link's wire patterns)
MAX_TRANSIT_PATTERNS = 1000
MAX_TRANSIT_PATTERN_STATES = MAX_HELD_STATES
# a pattern newly held is searched against every topic we proxy for transit: refused if
# that could take more than this many matcher steps (its states times the characters of
# the topics its literal prefix lets through; about 0.23 us a step: at most ~5 s)
MAX_PATTERN_SCAN_STEPS = 20_000_000

Key = tuple[str, int, int]  # (topic or pattern, pattern type, origin domain)


@dataclass(frozen=True, slots=True)
class SendOnLink:
    """Send ``frame`` (INTEREST or ADVERTISEMENT) on peer link ``link``."""

    link: str
    frame: P.Interest | P.Advertisement


@dataclass(slots=True)
class _Upstream:
    """A proxy of ours for a source advertised to us on ``link``."""

    link: str
    advert: P.Advertisement
    body: object  # the proxy's transport body (where a stream for it connects)


class Transit:
    """See the module doc. ``advert_ids``: the router's advert id numbering
    (unique on every link)."""

    def __init__(self, routing: Routing, advert_ids: Iterator[int], counters: Counter[str] | None = None,
                 *, max_interests: int = MAX_TRANSIT_INTERESTS) -> None:
        self.routing = routing
        self._advert_ids = advert_ids
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self.max_interests = max_interests
        self._held: dict[Key, set[str]] = {}  # interest from peer links -> the links that sent it
        self._per_link: Counter[str] = Counter()  # interests each link holds (each has its bound)
        # the patterns each link holds (matched only for the sources of other links),
        # their states bounded
        self._link_patterns: dict[str, InterestIndex[Key]] = {}
        self._up_chars = 0  # characters (plus one each) of the topics of _up_by_topic
        self._by_domain: dict[int, set[Key]] = {}  # held keys by origin domain
        self._trees_seen: dict[int, tuple] = {}  # origin domain -> (root, children links) last synced
        self._by_topic: dict[str, set[Key]] = {}  # exact-topic keys of _held, by topic
        self._sent: dict[str, set[Key]] = {}  # interest we passed on, by link
        self._up: dict[tuple[str, int], _Upstream] = {}  # (link, their advert id) -> our proxy
        self._up_by_topic: dict[str, set[tuple[str, int]]] = {}  # the same, by topic
        # our transit adverts: (link, our advert id) -> upstream key; and (link, topic, otid) -> id
        self._down: dict[tuple[str, int], tuple[str, int]] = {}
        self._down_by_source: dict[tuple[str, str, bytes], int] = {}
        self._down_by_topic: dict[str, set[tuple[str, int]]] = {}

    # ------------------------------------------------------------------ interest

    def on_interest(self, link: str, f: P.Interest) -> list[SendOnLink]:
        """An INTEREST frame from peer link ``link``."""
        if f.domain_id in self.routing.domains:
            self.counters["transit_interest_own_domain"] += 1  # ours, come back: not passed on
            return []
        if f.pattern_type == P.PatternType.TOPIC and not carried(f.topic):
            self.counters["transit_interest_bad"] += 1  # no TRD can ask for it: not passed on
            return []
        key = (f.topic, int(f.pattern_type), f.domain_id)
        holders = self._held.get(key)
        if f.action == P.InterestAction.CANCEL:
            if holders is None or link not in holders:
                return []
            return self._sync_key(key, self._unhold(key, link))
        pattern: Pattern | None = None
        if holders is None or link not in holders:
            # each link has its own bound: a busy or hostile peer cannot starve the others
            if key[1] != P.PatternType.TOPIC:
                try:
                    pattern = Pattern(key[0])
                except PatternError:
                    self.counters["transit_interest_bad"] += 1  # we cannot match it: useless here
                    return []
            got = self._patterns_of(link) if pattern is not None else None
            if self._per_link[link] >= self.max_interests or got is not None and (
                    len(got) >= MAX_TRANSIT_PATTERNS or not got.fits(pattern)):
                self.counters["transit_interest_full"] += 1
                return []
            if pattern is not None and self.scan_cost(pattern) > MAX_PATTERN_SCAN_STEPS:
                self.counters["transit_pattern_costly"] += 1
                return []
        if holders is None:
            holders = self._held[key] = set()
            self._by_domain.setdefault(key[2], set()).add(key)
            if key[1] == P.PatternType.TOPIC:
                self._by_topic.setdefault(key[0], set()).add(key)
        if link in holders:
            if f.action != P.InterestAction.REFRESH:
                return []
            # a refresh travels on where the interest went (each hop's portal
            # drops interest that is not refreshed: <remote-topic timeout>)
            self.counters["transit_interest_refreshed"] += 1
            return [SendOnLink(lk, P.Interest(P.InterestAction.REFRESH, key[0], key[2], P.PatternType(key[1])))
                    for lk, sent in self._sent.items() if key in sent]
        holders.add(link)
        self._per_link[link] += 1
        if pattern is not None:
            self._patterns_of(link).add(key, pattern)
        out = self._sync_key(key)
        return out + self._advertise_to(link, key)

    def wants(self, link: str, topic: str, origin_domain: int) -> bool:
        """Does a link other than ``link`` want a source of ``topic`` in
        ``origin_domain`` from us? (Then that source, advertised on ``link``, is
        proxied here even if our TRD does not want it.)"""
        others = [lk for lk in self._link_patterns if lk != link]
        return any(self._on_path(k, origin_domain) for k in self._keys_for(topic, others)
                   if self._held[k] - {link})

    def _on_path(self, key: Key, source_domain: int) -> bool:
        """Are we on the path from the router of the interest's domain to the
        source's domain? (Only then does the source's advertisement come back
        through us: every router also gets interest to query its own TRDs.)"""
        r = self.routing
        root, to = r.origin_router(key[2]), r.origin_router(source_domain)
        if root is None or to is None:
            return False
        path = r.map.path(root, to)
        return path is not None and r.me in path

    def resync(self) -> list[SendOnLink]:
        """The routes changed: bring the interest sent on every link in line.
        Only the interest of domains whose tree changed here (its root, or our
        children in it) is looked at: a change elsewhere in the map costs a
        look per origin domain, not per interest (the work is charged to the
        routing's recomputation budget)."""
        out: list[SendOnLink] = []
        r = self.routing
        steps = len(self._by_domain)
        for domain in list(self._by_domain):
            root = r.origin_router(domain)
            tree = (root, tuple(r.children_links(domain)) if root is not None else ())
            if self._trees_seen.get(domain) == tree:
                continue
            self._trees_seen[domain] = tree
            keys = list(self._by_domain[domain])
            steps += 4 * len(keys)
            for key in keys:
                out += self._sync_key(key)
        for domain in [d for d in self._trees_seen if d not in self._by_domain]:
            del self._trees_seen[domain]
        r.charge(steps)
        return out

    def _sync_key(self, key: Key, covered: Sequence[str] = ()) -> list[SendOnLink]:
        """Send ADD / CANCEL of ``key`` where its holders' trees say; if nobody
        holds it any more, withdraw our adverts of the topics it ``covered``
        (:meth:`_unhold`) where they are no longer wanted."""
        holders = self._held.get(key, set())
        want = set()
        if holders and self.routing.origin_router(key[2]) is None:
            # the map does not know the interest's router (yet, or for a moment):
            # keep what was sent rather than cancel it and send it all again later
            return []
        if holders:
            links = self.routing.links()
            want = {lk for lk in self.routing.children_links(key[2]) if lk not in holders and lk in links}
        out = []
        for link in list(self._sent):
            sent = self._sent[link]
            if key in sent and link not in want:
                sent.discard(key)
                out.append(SendOnLink(link, P.Interest(P.InterestAction.CANCEL, key[0], key[2],
                                                       P.PatternType(key[1]))))
        for link in want:
            sent = self._sent.setdefault(link, set())
            if key not in sent:
                sent.add(key)
                out.append(SendOnLink(link, P.Interest(P.InterestAction.ADD, key[0], key[2],
                                                       P.PatternType(key[1]))))
        if not holders:
            out += self._withdraw_unwanted(covered)
        return out

    # ------------------------------------------------------------------ adverts

    def on_proxy(self, link: str, advert: P.Advertisement, body: object) -> list[SendOnLink]:
        """Our proxy for ``advert`` (advertised to us on ``link``) listens; its
        transport body is ``body``. Advertise it where interest wants it."""
        ukey = (link, advert.advert_id)
        old = self._up.get(ukey)
        if old is not None and old.advert.topic != advert.topic:
            self._untrack(old.advert.topic, ukey)
        if advert.topic not in self._up_by_topic:
            self._up_chars += len(advert.topic) + 1
        self._up_by_topic.setdefault(advert.topic, set()).add(ukey)
        self._up[ukey] = _Upstream(link, advert, body)
        out = []
        for other in self.routing.links():
            if other != link:
                out += self._advertise_one(other, (link, advert.advert_id))
        return out

    def on_proxy_gone(self, link: str, advert_id: int) -> list[SendOnLink]:
        """Our proxy for ``link``'s advert ``advert_id`` stopped: withdraw it everywhere."""
        if (link, advert_id) not in self._up:
            return []
        out = []
        for (dlink, aid), up in list(self._down.items()):
            if up == (link, advert_id):
                out.append(self._withdraw(dlink, aid))
        up = self._up.pop((link, advert_id))
        self._untrack(up.advert.topic, (link, advert_id))
        return out

    def _untrack(self, topic: str, ukey: tuple[str, int]) -> None:
        keys = self._up_by_topic.get(topic)
        if keys is not None:
            keys.discard(ukey)
            if not keys:
                del self._up_by_topic[topic]
                self._up_chars -= len(topic) + 1

    def advert_source(self, link: str, advert_id: int) -> object | None:
        """Where a stream the peer on ``link`` opens for our advert ``advert_id``
        connects (our proxy), or None if it is not one of our transit adverts."""
        up = self._down.get((link, advert_id))
        if up is None:
            return None
        got = self._up.get(up)
        return None if got is None else got.body

    def advert_upstream(self, link: str, advert_id: int) -> tuple[str, int] | None:
        """(the link, the advert id there) of the peer's advertisement our transit advert
        ``advert_id`` on ``link`` passes on (our proxy of it is that advert id), or None."""
        return self._down.get((link, advert_id))

    def link_down(self, link: str) -> list[SendOnLink]:
        """Peer link ``link`` is gone: its interest and our adverts on it are forgotten."""
        self._sent.pop(link, None)
        self._trees_seen.clear()  # what was sent on the link is forgotten: sync everything
        out: list[SendOnLink] = []
        for key in [k for k, h in self._held.items() if link in h]:
            covered = self._unhold(key, link)
            if key not in self._held:  # nobody else wants it: cancel it where it went
                out += self._sync_key(key, covered)
        self._per_link.pop(link, None)
        self._link_patterns.pop(link, None)
        for dkey in [d for d in self._down if d[0] == link]:
            ukey = self._down.pop(dkey)
            up = self._up.get(ukey)
            if up is not None:
                self._untopic(up.advert.topic, dkey)
        for skey in [s for s in self._down_by_source if s[0] == link]:
            del self._down_by_source[skey]
        return out + self.resync()

    def _advertise_to(self, link: str, key: Key) -> list[SendOnLink]:
        """``link`` now holds interest ``key``: our proxies it covers go to it."""
        if key[1] == P.PatternType.TOPIC:
            ukeys = list(self._up_by_topic.get(key[0], ()))
        else:
            # only the proxies that could go to the link are searched (not its own, and
            # only where we are on the path), cheapest tests first
            ukeys = []
            for t, us in self._up_by_topic.items():
                cands = [u for u in us if u[0] != link and self._on_path(key, self._up[u].advert.origin_domain)]
                if cands and self._link_patterns[link].covers(key, t):
                    ukeys += cands
        out = []
        for ukey in ukeys:
            if self._up[ukey].link != link:
                out += self._advertise_one(link, ukey)
        return out

    def _advertise_one(self, link: str, ukey: tuple[str, int]) -> list[SendOnLink]:
        up = self._up[ukey]
        f = up.advert
        skey = (link, f.topic, bytes(f.otid))
        if skey in self._down_by_source or not self._link_wants(link, f.topic, f.origin_domain):
            return []
        if f.hop_count + 1 > self.routing.max_hop_count:
            self.counters["transit_hops_exceeded"] += 1
            return []
        aid = next(self._advert_ids)
        self._down[(link, aid)] = ukey
        self._down_by_source[skey] = aid
        self._down_by_topic.setdefault(f.topic, set()).add((link, aid))
        self.counters["transit_adverts_sent"] += 1
        # the session: our proxy's (the topics of one session upstream share a proxy here)
        session = session_key(up.body)
        origin_sid = (getattr(up.body, "session_id", 0) or 0) if session else 0  # said with a session only
        return [SendOnLink(link, P.Advertisement(f.topic, f.origin_domain, f.otid, _proxy_transport(up),
                                                 aid, False, f.hop_count + 1, session, origin_sid,
                                                 f.tir_options))]

    def _withdraw(self, link: str, aid: int) -> SendOnLink:
        ukey = self._down.pop((link, aid))
        up = self._up.get(ukey)
        if up is not None:
            self._down_by_source.pop((link, up.advert.topic, bytes(up.advert.otid)), None)
            self._untopic(up.advert.topic, (link, aid))
        self.counters["transit_adverts_withdrawn"] += 1
        topic, origin, otid, transport = ("", 0, bytes(32), 0)  # the peer knows it by its id
        if up is not None:
            f = up.advert
            topic, origin, otid, transport = f.topic, f.origin_domain, f.otid, _proxy_transport(up)
        return SendOnLink(link, P.Advertisement(topic, origin, otid, transport, aid, True))

    def _untopic(self, topic: str, down: tuple[str, int]) -> None:
        got = self._down_by_topic.get(topic)
        if got is not None:
            got.discard(down)
            if not got:
                del self._down_by_topic[topic]

    def _withdraw_unwanted(self, topics: Sequence[str]) -> list[SendOnLink]:
        """An interest is gone: withdraw our transit adverts of the ``topics``
        it covered on the links that no longer want them."""
        downs = [d for t in topics for d in self._down_by_topic.get(t, ())]
        out = []
        for link, aid in downs:
            up = self._up.get(self._down[(link, aid)])
            if up is not None and not self._link_wants(link, up.advert.topic, up.advert.origin_domain):
                out.append(self._withdraw(link, aid))
        return out

    # ------------------------------------------------------------------ matching

    def _unhold(self, key: Key, link: str) -> list[str]:
        """``link`` no longer holds interest ``key``. If nobody does, it is
        forgotten, and the topics of our transit adverts it covered are
        returned (to withdraw where no longer wanted); else []."""
        holders = self._held[key]
        holders.discard(link)
        self._per_link[link] -= 1
        covered: list[str] = []
        got = self._link_patterns.get(link) if key[1] != P.PatternType.TOPIC else None
        if got is not None and key in got:
            if not holders:  # asked before it goes: what it matched is cached there
                covered = [t for t in self._down_by_topic if got.covers(key, t)]
            got.remove(key)
        elif not holders and key[0] in self._down_by_topic:
            covered = [key[0]]
        if not holders:
            self._forget(key)
        return covered

    def _forget(self, key: Key) -> None:
        del self._held[key]
        keys = self._by_domain.get(key[2])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_domain[key[2]]
        keys = self._by_topic.get(key[0])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_topic[key[0]]

    def _patterns_of(self, link: str) -> InterestIndex[Key]:
        """The index of the patterns ``link`` holds (made empty if it has none)."""
        got = self._link_patterns.get(link)
        if got is None:
            got = self._link_patterns[link] = InterestIndex(max_states=MAX_TRANSIT_PATTERN_STATES)
        return got

    def _keys_for(self, topic: str, links) -> set[Key]:
        """The held interests that ``topic`` satisfies: exact topics, and the
        patterns held by ``links`` (only those are searched: a link's own
        patterns never cost anything for what it advertises)."""
        keys = set(self._by_topic.get(topic, ()))
        for lk in links:
            got = self._link_patterns.get(lk)
            if got:
                keys |= got.matches(topic)
        return keys

    def _link_wants(self, link: str, topic: str, origin_domain: int) -> bool:
        return any(link in self._held[k] and self._on_path(k, origin_domain)
                   for k in self._keys_for(topic, (link,)))

    def scan_cost(self, pattern: Pattern) -> int:
        """At most how many matcher steps searching ``pattern`` against the
        topics we proxy would take (those its literal prefix lets through): a
        pattern interest costing more than :data:`MAX_PATTERN_SCAN_STEPS` is
        refused (``transit_pattern_costly``)."""
        if pattern.size * self._up_chars <= MAX_PATTERN_SCAN_STEPS:
            return pattern.size * self._up_chars  # cheap: no need to look closer
        prefix = pattern.hints.prefix
        return pattern.size * sum(len(t) + 1 for t in self._up_by_topic if t.startswith(prefix))

    # ------------------------------------------------------------------ views

    def link_patterns(self, link: str) -> tuple[int, int]:
        """The pattern interests peer link ``link`` holds here, and the NFA
        states of its distinct patterns summed (at most
        :data:`MAX_TRANSIT_PATTERNS` and :data:`MAX_TRANSIT_PATTERN_STATES`)."""
        got = self._link_patterns.get(link)
        return (0, 0) if got is None else (len(got), got.states)

    def status(self) -> dict:
        return {"interest_held": len(self._held),
                "interest_sent": {lk: len(s) for lk, s in sorted(self._sent.items())},
                "proxies": len(self._up), "adverts": len(self._down)}


def _proxy_transport(up: _Upstream) -> int:
    """The transport code advertised on for an upstream source: our proxy's,
    which a stream of the next router joins (an LBT-RM origin re-published
    here as LBT-RU goes on as LBT-RU), else the origin's."""
    return getattr(up.body, "TYPE", None) or up.advert.transport
