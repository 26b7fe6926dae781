"""The topology map (router/core/topology.py), sans-IO: lowest total portal cost,
ties by router id, links counted only when both ends announce them,
max-hop-count, routers forgotten after the timeout."""

from __future__ import annotations

import pytest

from router.core.topology import NodeInfo, TopologyMap


def mesh(me: str, links: dict[tuple[str, str], int], domains: dict[str, dict[int, int]], **kw):
    """A map from ``me`` where every router announces ``domains[r]`` and each
    link (a, b) with that cost on both of its portals."""
    peers: dict[str, dict[str, int]] = {r: {} for r in domains}
    for (a, b), c in links.items():
        peers[a][b] = c
        peers[b][a] = c
    m = TopologyMap(NodeInfo(me, 1, domains[me], peers[me]), **kw)
    for r in domains:
        if r != me:
            m.update(NodeInfo(r, 1, domains[r], peers[r]), 1, 0.0)
    return m


def test_chain_a_b_c():
    m = mesh("A", {("A", "B"): 1, ("B", "C"): 1}, {"A": {1: 1}, "B": {2: 1}, "C": {3: 1}})
    r = m.route(3)
    assert r.path == ("A", "B", "C") and r.next_hop == "B" and r.hops == 2
    assert r.cost == 1 + 1 + 1 + 1 + 1  # both portals of each link, then C's endpoint
    own = m.route(1)
    assert own.next_hop is None and own.cost == 1


def test_lowest_total_cost_wins_then_router_id():
    links = {("A", "B"): 1, ("A", "C"): 1, ("B", "D"): 1, ("C", "D"): 1}
    doms = {"A": {1: 1}, "B": {}, "C": {}, "D": {4: 1}}
    assert mesh("A", links, doms).route(4).path == ("A", "B", "D")  # equal cost: B < C
    links[("A", "B")] = 5
    assert mesh("A", links, doms).route(4).path == ("A", "C", "D")


def test_a_domain_reached_by_two_routers_takes_the_cheaper_endpoint():
    m = mesh("A", {("A", "B"): 1, ("A", "C"): 1}, {"A": {}, "B": {7: 10}, "C": {7: 2}})
    assert m.route(7).path == ("A", "C") and m.route(7).cost == 4


def test_a_link_announced_by_one_side_only_is_not_used():
    m = TopologyMap(NodeInfo("A", 1, {1: 1}, {"B": 1}))
    m.update(NodeInfo("B", 1, {2: 1}, {}), 1, 0.0)
    assert m.route(2) is None
    assert m.update(NodeInfo("B", 2, {2: 1}, {"A": 1}), 1, 0.1)
    assert m.route(2).path == ("A", "B")


def test_max_hop_count():
    links = {("A", "B"): 1, ("B", "C"): 1, ("C", "D"): 1}
    doms = {"A": {1: 1}, "B": {2: 1}, "C": {3: 1}, "D": {4: 1}}
    m = mesh("A", links, doms, max_hop_count=2)
    assert m.route(3).hops == 2 and m.route(4) is None
    assert not m.update(NodeInfo("E", 1, {5: 1}, {}), 3, 0.0)  # came from too far
    with pytest.raises(ValueError):
        TopologyMap(NodeInfo("A", 1), max_hop_count=0)


def test_old_announcements_are_ignored_and_silent_routers_forgotten():
    m = mesh("A", {("A", "B"): 1, ("A", "C"): 3, ("B", "C"): 1},
             {"A": {1: 1}, "B": {2: 1}, "C": {3: 1}}, timeout=4.0)
    assert m.route(3).path == ("A", "B", "C")
    assert not m.update(NodeInfo("B", 0, {}, {}), 1, 1.0)  # older seq: a stale copy
    assert m.route(2) is not None
    m.update(NodeInfo("C", 1, {3: 1}, {"A": 3, "B": 1}), 1, 3.0)  # C heard again (a repeat)
    assert m.next_deadline() == 4.0
    assert m.expire(4.0) == ["B"]  # B went silent: the loop's other side takes over
    assert m.route(3).path == ("A", "C") and m.route(2) is None
