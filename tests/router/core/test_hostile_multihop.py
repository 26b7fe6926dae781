"""Multi-hop routing against lying, flapping and busy peers, sans-IO
(router/core/routing.py, router/core/topology.py, router/core/transit.py): route info that
outlives a restart, a peer speaking for a router it is not, a map blown up
with made-up routers, a peer that changes its announcement on every frame,
one link's interest starving the others. Work is counted in route
computation steps (TopologyMap.work), never timed."""

from __future__ import annotations

import itertools

from lbmr_proto import Packet, SourceIdOption, SourceTypeOption, WcTQR, encode
from router import peerlink as P
from router.core.bridge import Bridge
from router.core.bridge_outputs import StartProxy
from router.core.routing import RECALC_BURST, RECALC_RATE, Routing
from router.core.topology import MAX_MAP_ENTRIES, MAX_ROUTERS
from router.core.tr import PortalTR, PortalTRSettings
from router.core.transit import MAX_TRANSIT_PATTERNS, Transit


def _pair(**kw):
    """Router A with links to B and C (B and C announce a link back to A)."""
    a = Routing("A", {1: 1}, now=0.0, seq_base=1000, **kw)
    a.link_up("A-B", "B", 1, 0.0)
    a.link_up("A-C", "C", 1, 0.0)
    a.on_topology("A-B", P.Topology("B", 5000, 0, ((2, 1),), (("A", 1),)), 0.0)
    a.on_topology("A-C", P.Topology("C", 7000, 0, ((3, 1),), (("A", 1),)), 0.0)
    return a


def test_a_peer_restarted_with_a_smaller_sequence_number_is_heard():
    """B restarts with its clock set back: its sequence numbers are smaller than
    the ones A holds. A kept B's old announcement alive (the link answers) and
    ignored the new ones for ever: B's new domain was never routed."""
    a = _pair()
    assert a.map.route(2).path == ("A", "B")
    a.link_down("A-B", 0.5)
    a.link_up("A-B", "B", 1, 1.0)
    for t in range(1, 10):
        a.heard_from("A-B", float(t))
        a.heard_from("A-C", float(t))
        a.on_topology("A-B", P.Topology("B", 100 + t, 0, ((7, 1),), (("A", 1),)), float(t))
        a.on_topology("A-C", P.Topology("C", 7000 + t, 0, ((3, 1),), (("A", 1),)), float(t))
        a.tick(float(t))
    assert a.map.route(7) is not None and a.map.route(7).path == ("A", "B")
    assert a.map.route(2) is None
    # an old announcement of B still held elsewhere does not bring the old B back
    assert a.on_topology("A-C", P.Topology("B", 5000, 1, ((2, 1),), (("A", 1),)), 9.5) == []
    assert a.map.route(2) is None


def test_a_peer_cannot_speak_for_a_router_we_are_linked_to():
    """C passes on an announcement of B (A's neighbour) with a huge sequence
    number and made-up contents: A hears B first hand and ignores it (before:
    B's own announcements were ignored from then on, B's routes were lost)."""
    a = _pair()
    lie = P.Topology("B", 2**64 - 1, 1, ((9, 1),), ())
    assert a.on_topology("A-C", lie, 1.0) == []
    assert a.map.route(9) is None and a.map.route(2).path == ("A", "B")
    a.on_topology("A-B", P.Topology("B", 5001, 0, ((2, 1), (4, 1)), (("A", 1),)), 1.5)
    assert a.map.route(4).path == ("A", "B")
    assert a.status()["route_info"]["topology_peer_relayed"] == 1


def test_another_router_with_our_name_is_counted():
    a = _pair()
    a.on_topology("A-B", P.Topology("A", 10**12, 1, ((5, 1),), ()), 1.0)
    assert a.status()["route_info"]["topology_own_id"] == 1
    assert a.map.route(5) is None


def _fakes(a, n, per, link="A-B", seq=10):
    """n made-up routers behind B, each linked to B and to ``per`` of the
    others (links announced by both ends, so they count), each with a domain."""
    names = [f"f{i:05d}" for i in range(n)]
    frames = [P.Topology("B", 6000 + seq, 0, ((2, 1),), tuple([("A", 1)] + [(x, 1) for x in names]))]
    for i, x in enumerate(names):
        peers = [("B", 1)] + [(names[(i + j) % n], 1) for j in range(-(per // 2), per // 2 + 1) if j]
        frames.append(P.Topology(x, seq, 1, ((1000 + i, 1),), tuple(peers)))
    for f in frames:
        a.on_topology(link, f, 0.1)
    return frames


def test_made_up_routers_cannot_grow_the_map_without_bound():
    """A peer announcing thousands of routers with thousands of links each
    (before: all kept, a million-entry map and seconds per route computation)."""
    a = _pair()
    _fakes(a, 600, 40)
    nodes = a.map.nodes()
    assert len(nodes) <= MAX_ROUTERS
    assert sum(len(n.peers) for n in nodes.values()) <= MAX_MAP_ENTRIES
    assert a.status()["route_info"]["refused"] > 0 and a.status()["route_info"]["topology_refused"] > 0
    # the real routers are still routed, and one route computation is bounded
    before = a.map.work
    assert a.map.route(3).path == ("A", "C")
    assert a.map.work - before <= MAX_MAP_ENTRIES


def test_a_flapping_peer_cannot_make_every_frame_recompute_everything():
    """B keeps changing the announcement of a made-up router of a large map
    while A passes on interest of every made-up domain (a tree per root).
    Before: every frame recomputed every tree (hundreds of thousands of steps
    per frame). Now the work within one moment stays within the budget plus
    one recomputation, and what was held is applied once it has refilled."""
    a = _pair(timeout=1000.0)
    t = Transit(a, itertools.count(1))
    frames = _fakes(a, MAX_ROUTERS - 3, 14)
    for i in range(MAX_ROUTERS - 3):
        t.on_interest("A-C", P.Interest(P.InterestAction.ADD, f"t{i}", 1000 + i))
    a.tick(10.0)  # budget refilled
    t.resync()
    start = a.map.work
    victim = frames[5]
    one = None
    for s in range(201):
        peers = victim.peers[:-1] if s % 2 == 0 else victim.peers
        a.on_topology("A-B", P.Topology(victim.router_id, 100 + s, 1, victim.domains, peers), 10.0)
        t.resync()
        if one is None:
            one = a.map.work - start  # one full recomputation
    assert one > 1000  # a real cost: a tree for each root
    assert a.map.work - start <= RECALC_BURST + 2 * one
    assert a.status()["route_info"]["held"] == 1
    # the last announcement is applied once the budget allows
    a.tick(10.0 + (RECALC_BURST + 2 * one) / RECALC_RATE)
    got = a.map.node(victim.router_id)
    assert got.seq == 300 and got.peers == dict(victim.peers[:-1])
    assert a.status()["route_info"]["held"] == 0


def test_route_changes_elsewhere_do_not_resync_every_interest():
    """100,000 interests held for C; B toggles a made-up peer in its own
    announcement on every frame. Before: each frame looked at every interest
    again (600 ms a frame). Now only domains whose tree changed are looked at."""
    a = _pair()
    t = Transit(a, itertools.count(1))
    n = 20_000
    for i in range(n):
        t.on_interest("A-C", P.Interest(P.InterestAction.ADD, f"topic.{i}", 3))
    t.resync()
    charged: list[int] = []
    a.charge = charged.append  # what transit reports of its work
    for s in range(50):
        extra = (("Z", 1),) if s % 2 else ()
        a.heard_from("A-C", 1.0 + s)  # C stays (its link answers)
        a.on_topology("A-B", P.Topology("B", 6000 + s, 0, ((2, 1),), (("A", 1),) + extra), 1.0 + s)
        a.tick(1.0 + s)
        out = t.resync()
        assert out == []
    assert len(charged) == 50 and sum(charged) < 50 * 100


def test_one_links_interest_cannot_starve_another():
    """B fills the transit interest bound (topics and patterns); C's interest
    still passes (before: the bound was shared, C's was refused)."""
    a = _pair()
    a.link_up("A-D", "D", 1, 0.0)
    a.on_topology("A-D", P.Topology("D", 9000, 0, ((4, 1),), (("A", 1),)), 0.0)
    t = Transit(a, itertools.count(1), max_interests=500)
    for i in range(600):
        t.on_interest("A-B", P.Interest(P.InterestAction.ADD, f"junk.{i}", 2))
    for i in range(MAX_TRANSIT_PATTERNS + 10):
        t.on_interest("A-B", P.Interest(P.InterestAction.ADD, f"^junk{i}", 2, P.PatternType.PCRE))
    assert t.counters["transit_interest_full"] == 100 + MAX_TRANSIT_PATTERNS + 10
    out = t.on_interest("A-C", P.Interest(P.InterestAction.ADD, "md.x", 3))
    out += t.on_interest("A-C", P.Interest(P.InterestAction.ADD, "^md\\.", 3, P.PatternType.PCRE))
    assert {(o.link, o.frame.topic) for o in out} >= {("A-D", "md.x"), ("A-D", "^md\\.")}
    # B's link goes down: its interest is cancelled where it went, C's stays
    gone = t.link_down("A-B")
    cancels = {o.frame.topic for o in gone if isinstance(o.frame, P.Interest)
               and o.frame.action == P.InterestAction.CANCEL}
    assert "junk.0" in cancels and "md.x" not in cancels
    assert t.status()["interest_held"] == 2


def test_a_topic_no_tir_can_carry_is_refused_not_a_crash():
    """A wildcard receiver in our TRD (WC-TQR ``^md\\.``) wants what the peer
    advertises; the peer advertises topics no TIR can carry (over 255 bytes, a
    NUL byte). Before: proxied, then advertising the bound proxy raised
    ValueError out of the proxy task (the router exited). Now refused and
    counted; transit interest in such a topic is not passed on either."""
    tr = PortalTR(PortalTRSettings("A", 1, src_id=b"A" * 8, mode="multicast", multicast=("239.192.1.1", 12965),
                                   source_timeout=3.0, requery_interval=1.0), now=0.0)
    b = Bridge(tr, require_interest=True)
    b.link_up(0.0)
    opts = [SourceIdOption(0x8000, b"APPCTX01"), SourceTypeOption(0x80, 0)]
    b.on_datagram(encode(Packet(type=1, version=1, wc_tqrs=[WcTQR(r"^md\.", 1)], options=opts)),
                  ("10.1.0.5", 12965), 0.0)
    b.outputs()
    for aid, topic in ((11, "md." + "x" * 300), (12, "md.a\x00b")):
        b.peer_frame(P.Advertisement(topic, 2, bytes(32), P.StreamKind.TCP, aid, False), 0.1)
        started = [o for o in b.outputs() if isinstance(o, StartProxy)]
        for o in started:
            b.proxy_listening(o.advert.advert_id, ("10.1.0.1", 24000), 0.2)
        assert started == []
    assert b.counters["bad_advert"] == 2 and b.proxy_listeners() == 0
    # a good one still goes
    b.peer_frame(P.Advertisement("md.ok", 2, bytes(32), P.StreamKind.TCP, 13, False), 0.3)
    assert [o.advert.topic for o in b.outputs() if isinstance(o, StartProxy)] == ["md.ok"]
    a = _pair()
    t = Transit(a, itertools.count(1))
    assert t.on_interest("A-C", P.Interest(P.InterestAction.ADD, "x" * 300, 3)) == []
    assert t.counters["transit_interest_bad"] == 1 and t.status()["interest_held"] == 0


def test_hostile_patterns_cost_at_most_the_state_bound_and_never_their_own_adverts(monkeypatch):
    """C holds patterns built to keep every NFA state alive ((.?){990}x: about
    2000 states, a tenth of a second per 255-byte topic); each advertisement
    passing through was searched against all of them, several times over
    (before: 2.4 s per advertisement for ten, four minutes for the 1000
    allowed). Now a link's patterns are bounded by their states summed, each
    (pattern, topic) is searched once, and a link's own advertisements are
    never searched against its own patterns."""
    from router.core.transit import MAX_TRANSIT_PATTERN_STATES
    from router.core.wildcard import Matcher

    searches: list[int] = []
    real = Matcher.search
    monkeypatch.setattr(Matcher, "search", lambda self, text: searches.append(self.size) or real(self, text))
    a = _pair()
    t = Transit(a, itertools.count(100))
    for k in range(10):
        t.on_interest("A-C", P.Interest(P.InterestAction.ADD, f"(.?){{990}}x{k}", 3, P.PatternType.PCRE))
    assert t.counters["transit_interest_full"] == 9
    assert t.link_patterns("A-C")[1] <= MAX_TRANSIT_PATTERN_STATES
    # a pattern we cannot match is not held (it would cost and never match)
    t.on_interest("A-C", P.Interest(P.InterestAction.ADD, "(a)\\1", 3, P.PatternType.PCRE))
    assert t.counters["transit_interest_bad"] == 1
    # C's own advertisements: its patterns are not searched
    for i in range(50):
        assert not t.wants("A-C", f"c.{i}", 3)
        t.on_proxy("A-C", P.Advertisement(f"c.{i}", 3, bytes(32), 0, 1000 + i), object())
    assert searches == []
    # B's: one search per (pattern, topic), however often it is asked
    topic = "a" * 254 + "!"
    for _ in range(3):
        t.wants("A-B", topic, 2)
    t.on_proxy("A-B", P.Advertisement(topic, 2, bytes(32), 0, 7), object())
    assert len(searches) == 1 and sum(searches) <= MAX_TRANSIT_PATTERN_STATES


def test_a_pattern_is_searched_only_against_topics_it_could_match(monkeypatch):
    """A pattern interest arriving is searched against every proxy we run for
    transit (before: each search up to the pattern's states per character:
    ``(.?){990}y`` over 5000 topics took 31 s). An anchored pattern's literal
    prefix is tested first (a string comparison); the link's own proxies are
    not searched."""
    import re

    from router.core.interest import literal_hints
    from router.core.wildcard import Matcher

    def literal_prefix(pattern: str) -> str:
        return literal_hints(pattern).prefix

    def literal_run(pattern: str) -> str:
        return literal_hints(pattern).run

    for pat, topic in [(r"^md\.quotes\..*", "md.quotes.x"), (r"^ab*c", "ac"), (r"^ab+", "ab"),
                       (r"^md\\x", "md\\x1"), (r"^a{2}", "aa"), (r"^x|y", "y"), (r"(?i)^MD", "md"),
                       (r"^md\$", "md$"), (r"^a\d", "a1"), (r"quotes", "x.quotes")]:
        assert re.search(pat, topic) and topic.startswith(literal_prefix(pat)), pat
        assert literal_run(pat) in topic, pat
    for pat, topic in [(r"q\.\d+\.x$", "md.q.12.x"), ("ab*c", "xac"), ("ab+", "ab"), ("a|b", "b"),
                       (r"zz1\.x", "a.zz1.x"), ("(.?){3}y", "y")]:
        assert re.search(pat, topic) and literal_run(pat) in topic, pat
    assert literal_prefix(r"^md\.q\.0000") == "md.q.0000" and literal_prefix("q.x") == ""
    assert literal_run(r"zz1\.x") == "zz1.x" and literal_run(r"q\.\d+") == "q."

    searches: list[str] = []
    real = Matcher.search
    monkeypatch.setattr(Matcher, "search", lambda self, text: searches.append(text) or real(self, text))
    a = _pair()
    a.link_up("A-D", "D", 1, 0.0)
    a.on_topology("A-D", P.Topology("D", 9000, 0, ((4, 1),), (("A", 1),)), 0.0)
    t = Transit(a, itertools.count(10**6))
    t.on_interest("A-D", P.Interest(P.InterestAction.ADD, "^md\\.", 4, P.PatternType.PCRE))
    n = 2000
    for i in range(n):
        t.on_proxy("A-B", P.Advertisement(f"md.q.{i:06d}.x", 2, i.to_bytes(32, "big"), 0, i + 1), object())
    searches.clear()
    out = t.on_interest("A-C", P.Interest(P.InterestAction.ADD, r"^md\.q\.0000", 3, P.PatternType.PCRE))
    assert len([o for o in out if isinstance(o.frame, P.Advertisement)]) == 100
    assert len(searches) == 100  # only the topics with its prefix
    searches.clear()
    # B's own proxies are not searched for B's pattern
    t.on_interest("A-B", P.Interest(P.InterestAction.ADD, "q", 2, P.PatternType.PCRE))
    assert searches == []
    # a pattern whose search over every transit topic could cost more than the
    # scan bound is refused (before: (.?){990}y over 5000 topics froze 31 s)
    from router.core.transit import MAX_PATTERN_SCAN_STEPS

    searches.clear()
    t.on_interest("A-C", P.Interest(P.InterestAction.ADD, "(.?){990}y", 3, P.PatternType.PCRE))
    assert t.counters["transit_pattern_costly"] == 1 and searches == []
    assert Matcher("(.?){990}y").size * sum(len(f"md.q.{i:06d}.x") + 1 for i in range(n)) > MAX_PATTERN_SCAN_STEPS
    # a cheap unanchored one over the same topics is not
    t.on_interest("A-C", P.Interest(P.InterestAction.ADD, r"q\.\d+\.x$", 3, P.PatternType.PCRE))
    assert t.counters["transit_pattern_costly"] == 1 and len(searches) == n
    # the bookkeeping of the topics' characters follows the proxies
    for i in range(n):
        t.on_proxy_gone("A-B", i + 1)
    from router.core.interest import Pattern

    assert t.status()["proxies"] == 0 and t.scan_cost(Pattern("x")) == 0 == t.scan_cost(Pattern("(.?){990}y"))


def test_a_peer_flapping_a_small_announcement_is_paced():
    """B's announcement toggles a made-up peer on every frame: a tiny map, but
    each change makes every bridge bring its TRD's interest in line (1.5 us a
    local interest: 150 ms a change with 100,000). Before: every frame was a
    route change. Now at most RECALC_BURST / RECALC_APPLY changes apply at
    once, the rest are held and applied together."""
    from router.core.routing import RECALC_APPLY

    a = _pair()
    a.tick(50.0)
    a.heard_from("A-B", 50.0)
    a.heard_from("A-C", 50.0)
    start = a.version
    for s in range(1000):
        extra = (("Z", 1),) if s % 2 == 0 else ()
        a.on_topology("A-B", P.Topology("B", 6000 + s, 0, ((2, 1),), (("A", 1),) + extra), 50.0)
    assert 1 <= a.version - start <= RECALC_BURST // RECALC_APPLY + 1
    assert a.status()["route_info"]["held"] == 1
    a.tick(50.0 + 2 * RECALC_BURST / RECALC_RATE)
    assert a.status()["route_info"]["held"] == 0 and "Z" not in a.map.node("B").peers
