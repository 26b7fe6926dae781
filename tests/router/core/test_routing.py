"""Route info and transit, sans-IO (router/core/routing.py, router/core/transit.py):
routers wired together in memory, frames delivered by hand. Chain, loop,
mesh: every interest reaches every router once, adverts go back the way the
interest came, a cut link reroutes, silent routers are forgotten."""

from __future__ import annotations

import itertools

from router import peerlink as P
from router.core.routing import Routing
from tests.router.helpers import Net

OTID = bytes(range(32))


def _send(link, frame):
    from router.core.transit import SendOnLink

    return SendOnLink(link, frame)


def test_chain_builds_the_map_and_interest_travels_to_the_far_end():
    n = Net("ABC")
    n.link("A", "B")
    n.link("B", "C")
    assert n.r["A"].map.route(3).path == ("A", "B", "C")
    assert n.r["C"].map.route(1).path == ("C", "B", "A")
    n.want("C", "t.one")
    assert n.adds("t.one") == {"B": 1, "A": 1}  # B passed it on to A, once
    st = n.r["B"].status()
    assert set(st["nodes"]) == {"A", "B", "C"} and st["routes"]["1"]["next_hop"] == "A"


def test_loop_interest_once_per_router_and_reroute_on_cut():
    n = Net("ABC")
    n.link("A", "B")
    n.link("B", "C")
    n.link("A", "C", cost=5)  # the expensive side of the loop
    n.want("A", "t")
    assert n.adds("t") == {"B": 1, "C": 1}
    assert [lk for to, lk, f in n.got if to == "C"] == ["C-B"]  # via B: the cheaper path
    n.got.clear()
    n.cut("B", "C")
    # C is now A's child directly: A sends it, nobody else does
    assert n.adds("t") == {"C": 1}
    assert [lk for to, lk, f in n.got if to == "C" and isinstance(f, P.Interest)] == ["C-A"]
    assert n.r["C"].map.route(1).path == ("C", "A")


def test_mesh_of_four_every_interest_reaches_every_router_once():
    n = Net("ABCD")
    for a, b in itertools.combinations("ABCD", 2):
        n.link(a, b)
    for who in "ABCD":
        n.want(who, f"t.{who}")
    for who in "ABCD":
        assert n.adds(f"t.{who}") == {x: 1 for x in "ABCD" if x != who}


def test_adverts_go_back_the_way_the_interest_came_and_are_withdrawn():
    n = Net("ABC")
    n.link("A", "B")
    n.link("B", "C")
    n.want("C", "t")
    # A's source reached B (A's bridge advertised it on A-B; B's owner bridge proxies it)
    advert = P.Advertisement("t", 1, OTID, P.StreamKind.TCP, 7, False, 0)
    assert n.t["B"].wants("B-A", "t", 1)  # the interest came from C: B proxies it for C
    body = object()
    out = n.t["B"].on_proxy("B-A", advert, body)
    assert [(o.link, o.frame.topic, o.frame.hop_count, o.frame.origin_domain) for o in out] == [("B-C", "t", 1, 1)]
    aid = out[0].frame.advert_id
    assert n.t["B"].advert_source("B-C", aid) is body  # a stream from C connects to B's proxy
    assert n.t["B"].on_proxy("B-A", advert, body) == []  # at most once per link
    gone = n.t["B"].on_proxy_gone("B-A", 7)
    assert [(o.link, o.frame.advert_id, o.frame.withdraw) for o in gone] == [("B-C", aid, True)]
    assert n.t["B"].advert_source("B-C", aid) is None


def test_a_cancelled_interest_withdraws_the_transit_advert():
    n = Net("ABC")
    n.link("A", "B")
    n.link("B", "C")
    n.want("C", "t")
    out = n.t["B"].on_proxy("B-A", P.Advertisement("t", 1, OTID, 0, 7), object())
    aid = out[0].frame.advert_id
    back = n.t["B"].on_interest("B-C", P.Interest(P.InterestAction.CANCEL, "t", 3))
    kinds = {(o.link, type(o.frame).__name__, getattr(o.frame, "withdraw", None)) for o in back}
    assert ("B-A", "Interest", None) in kinds  # the cancel goes on toward A
    assert ("B-C", "Advertisement", True) in kinds
    assert not n.t["B"].wants("B-A", "t", 1)
    assert n.t["B"].advert_source("B-C", aid) is None


def test_wildcard_interest_matches_transit_adverts():
    n = Net("ABC")
    n.link("A", "B")
    n.link("B", "C")
    n.want("C", "^md\\.", P.PatternType.PCRE)
    assert n.adds("^md\\.") == {"B": 1, "A": 1}
    out = n.t["B"].on_proxy("B-A", P.Advertisement("md.x", 1, OTID, 0, 9), object())
    assert [o.link for o in out] == ["B-C"]
    assert n.t["B"].on_proxy("B-A", P.Advertisement("other", 1, bytes(32), 0, 10), object()) == []


def test_interest_of_our_own_domain_coming_back_is_not_passed_on():
    n = Net("AB")
    n.link("A", "B")
    out = n.t["A"].on_interest("A-B", P.Interest(P.InterestAction.ADD, "t", 1))
    assert out == [] and n.t["A"].counters["transit_interest_own_domain"] == 1


def test_silent_router_is_forgotten_after_the_route_timeout():
    n = Net("ABC", timeout=4.0, propagation_interval=1.0)
    n.link("A", "B")
    n.link("B", "C")
    assert n.r["A"].map.route(3) is not None
    n.up -= {("B", "C"), ("C", "B")}  # C falls silent without a link-down at B
    for t in (1.0, 2.0, 3.0, 4.0, 5.0):
        n.now = t
        for who in "AB":
            n.deliver(who, n.r[who].tick(t))
    assert n.r["A"].map.route(3) is None and "C" not in n.r["A"].map.nodes()


def test_route_info_beyond_max_hop_count_is_dropped():
    n = Net("ABCD", max_hop_count=2)
    n.link("A", "B")
    n.link("B", "C")
    n.link("C", "D")
    # C's route info crossed 2 links to reach A, D's would cross 3
    assert "C" in n.r["A"].map.nodes() and "D" not in n.r["A"].map.nodes()


def test_hostile_topology_frames_are_bounded():
    import pytest

    r = Routing("A", {1: 1}, now=0.0)
    r.link_up("A-B", "B", 1, 0.0)
    # an old seq, our own id, an unknown link: ignored
    assert r.on_topology("A-B", P.Topology("A", 10**9, 0, ((1, 1),), ()), 0.0) == []
    assert r.on_topology("A-X", P.Topology("B", 5, 0, ((2, 1),), ()), 0.0) == []
    r.on_topology("A-B", P.Topology("B", 5, 0, ((2, 1),), (("A", 1),)), 0.0)
    assert r.on_topology("A-B", P.Topology("B", 4, 0, ((9, 1),), ()), 0.0) == []
    assert r.map.route(2) is not None and r.map.route(9) is None
    with pytest.raises(P.FrameEncodeError):
        P.Topology("B", 1, 0, tuple((i, 1) for i in range(5000))).payload()
    big = P.encode(P.Topology("B", 1, 0, ((2, 1),)))
    # a frame claiming 65535 domains is refused before anything is allocated for them
    forged = big[:12 + 9] + b"\xff\xff" + big[12 + 11:]
    with pytest.raises(P.FrameDecodeError):
        P.decode(forged)


def test_triangle_a_router_off_the_path_does_not_carry_an_advert_on():
    """In a triangle of equal links every router asks both others (each is a
    child of the asker), but a source of B's domain comes to A from B only:
    C, which also proxies B's source for its own TRD, does not pass it to A."""
    n = Net("ABC")
    n.link("A", "B")
    n.link("B", "C")
    n.link("A", "C")
    n.want("A", "t")
    n.want("C", "t")
    assert n.t["C"].on_proxy("C-B", P.Advertisement("t", 2, OTID, 0, 5), object()) == []
    assert not n.t["C"].wants("C-B", "t", 2)


def test_a_peer_cannot_make_every_advert_cost_more_than_the_pattern_bound():
    from router.core.transit import MAX_TRANSIT_PATTERN_STATES, MAX_TRANSIT_PATTERNS
    from router.core.wildcard import Matcher

    n = Net("ABC")
    n.link("A", "B")
    n.link("B", "C")
    t = n.t["B"]
    sizes = [Matcher(f"^p{i}\\.").size for i in range(MAX_TRANSIT_PATTERNS + 50)]
    for i in range(MAX_TRANSIT_PATTERNS + 50):
        t.on_interest("B-C", P.Interest(P.InterestAction.ADD, f"^p{i}\\.", 3, P.PatternType.PCRE))
    # bounded by count and by NFA states summed (each search costs up to its states per character)
    fit = next(k for k in range(len(sizes) + 1) if k == len(sizes) or sum(sizes[:k + 1]) > MAX_TRANSIT_PATTERN_STATES)
    fit = min(fit, MAX_TRANSIT_PATTERNS)
    assert t.counters["transit_interest_full"] == MAX_TRANSIT_PATTERNS + 50 - fit
    assert t.link_patterns("B-C") == (fit, sum(sizes[:fit])) and sum(sizes[:fit]) <= MAX_TRANSIT_PATTERN_STATES
    # exact topics still pass while patterns are full
    t.on_interest("B-C", P.Interest(P.InterestAction.ADD, "exact", 3))
    assert t.wants("B-A", "exact", 1)


def test_a_trd_with_two_routers_sends_its_interest_along_one_tree():
    """Hostile trial: routers C and Z both serve TRD 3 (chain C - A - B - Z). Each
    rooted its own domain's interest at itself, so B got TRD 3's interest twice
    and its source was proxied into TRD 3 twice. Now every router roots a
    domain's interest at the first router (by id) of that domain: B gets it once."""
    n = Net("CABZ", domains={"C": {3: 1}, "A": {1: 1}, "B": {2: 1}, "Z": {3: 1}})
    n.link("C", "A")
    n.link("A", "B")
    n.link("B", "Z")
    n.want("C", "t")
    n.want("Z", "t")
    assert n.adds("t")["B"] == 1, n.adds("t")
