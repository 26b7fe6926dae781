"""Route info between routers, sans-IO: this router's announcements, the
flooding of every router's announcements over the peer links, and the
:class:`router.core.topology.TopologyMap` they build.

A :class:`Routing` belongs to one router (:class:`router.shell.router.MultiRouter`).
It announces a :class:`~router.peerlink.Topology` frame -- our router id (the
router's name), a sequence number, the domain ids of our endpoint portals with
their ``<cost>``, the routers our connected peer links reach with the link
portal's ``<cost>`` -- on every peer link: at once when a link comes up or goes
down, and again every ``propagation_interval`` seconds (with the next sequence
number, so it is passed on and refreshes every map). An announcement heard on
one link that is newer than what we hold for its router is passed on to every
other link with its hop count plus one, unless that exceeds ``max_hop_count``
(the DRO's ``<route-info>``: propagation 1 s, timeout 4 s, max-hop-count 100).
A router not heard of for ``timeout`` seconds is forgotten.

Unlike the DRO we recompute routes at once on every change instead of after
a ``route-recalculation`` back-off of 5 s: the map is small and the
computation cached, and a link cut then moves traffic within the time the
far side takes to notice. Peers may lie or flap, so the map is bounded
(:mod:`router.core.topology`) and its recomputation paced: the steps it takes
(:attr:`TopologyMap.work`), the work of the routes' users (:meth:`charge`)
and :data:`RECALC_APPLY` for each change applied draw on a budget of
:data:`RECALC_BURST` steps refilled at :data:`RECALC_RATE` a second; while
the budget is spent, changed announcements are held (still passed on at
once) and applied together at the first :meth:`tick` after it has refilled. A small network never waits; a peer that keeps changing a
large map costs at most about a seventh of a core.

A router's own announcement, heard on the link to it, is what counts for it:
the first one after the link comes up is taken whatever its sequence number
(the router may have restarted with a smaller one, its clock set back), and
copies of a connected peer's announcement passed on by other routers are
ignored (we hear it first hand, and nobody else can speak for it here).

Inputs take ``now`` (seconds, any monotonic clock); outputs are
:class:`SendTopology` items (a frame for one link) returned by each call.
:attr:`Routing.version` grows whenever the routes may have changed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .. import peerlink as P
from .topology import NodeInfo, TopologyMap

__all__ = ["Routing", "SendTopology", "RECALC_BURST", "RECALC_RATE", "RECALC_APPLY"]

DEFAULT_PROPAGATION_INTERVAL = 1.0  # seconds (DRO <route-info propagation-interval="1000">)
DEFAULT_ROUTE_TIMEOUT = 4.0  # seconds (DRO <route-info timeout="4000">)
DEFAULT_MAX_HOP_COUNT = 100  # DRO <route-info max-hop-count="100">
# route computation budget, in steps (TopologyMap.work, about 1.4 us each on a 2-core
# host): a burst, then a rate (14% of a core)
RECALC_BURST = 300_000
RECALC_RATE = 100_000.0  # steps per second
# charged for every change applied to the map: what the routes' users do then that
# the map does not count (each bridge brings its TRD's interest in line: ~1.5 us per
# local interest): at most 15 changes at once, then 5 a second
RECALC_APPLY = 20_000


@dataclass(frozen=True, slots=True)
class SendTopology:
    """Send ``frame`` on peer link ``link`` (its name)."""

    link: str
    frame: P.Topology


class Routing:
    """Route info of router ``me`` (see the module doc). ``domains``: our
    endpoint portals' domain ids and costs; ``seq_base``: the first sequence
    number (take it from the wall clock, so a restarted router's announcements
    are newer than the ones the others still hold)."""

    def __init__(self, me: str, domains: dict[int, int], *, now: float, seq_base: int = 1,
                 propagation_interval: float = DEFAULT_PROPAGATION_INTERVAL,
                 timeout: float = DEFAULT_ROUTE_TIMEOUT,
                 max_hop_count: int = DEFAULT_MAX_HOP_COUNT, **bounds) -> None:
        self.me = me
        self.domains = dict(domains)
        self.propagation_interval = propagation_interval
        self.max_hop_count = max_hop_count
        self._seq = seq_base
        self._links: dict[str, tuple[str, int]] = {}  # link name -> (peer router id, portal cost)
        self.map = TopologyMap(self._own(), max_hop_count=max_hop_count, timeout=timeout, **bounds)
        self._frames: dict[str, P.Topology] = {}  # newest announcement of each other router
        self.counters: Counter[str] = Counter()
        self._fresh: set[str] = set()  # peers whose link came up: their next own announcement counts
        # changed announcements not applied yet (the budget is spent): router -> (frame, hops crossed)
        self._held: dict[str, tuple[P.Topology, int]] = {}
        self._budget = float(RECALC_BURST)
        self._budget_at = now
        self._work_seen = 0
        self._charged = 0  # steps of work the routes' users reported (charge)
        self._next_announce = now + propagation_interval
        self.version = 0  # grows whenever the routes (of any router) may have changed
        self._children: dict[int, list[str]] = {}  # children_links cache, by domain
        self._children_at: tuple[int, int] = (-1, -1)  # (map changes, links changes) it was made at
        self._link_changes = 0
        self._origins: dict[int, str | None] = {}  # origin_router cache, by domain
        self._origins_at = -1  # the map changes it was made at

    # ------------------------------------------------------------------ inputs

    def link_up(self, link: str, peer_id: str, cost: int, now: float) -> list[SendTopology]:
        """Peer link ``link`` is connected to router ``peer_id``; ``cost``: the
        link portal's cost. Announces us everywhere and tells the new link
        everything we know."""
        self._links[link] = (peer_id, cost)
        self._fresh.add(peer_id)
        self._link_changes += 1
        out = [SendTopology(link, f) for f in self._frames.values()
               if f.router_id != peer_id and f.hops + 2 <= self.max_hop_count]
        out = [SendTopology(s.link, _hop(s.frame)) for s in out]
        return self._announce(now) + out

    def link_down(self, link: str, now: float) -> list[SendTopology]:
        got = self._links.pop(link, None)
        if got is None:
            return []
        self._fresh.discard(got[0])
        self._link_changes += 1
        return self._announce(now)

    def on_topology(self, link: str, frame: P.Topology, now: float) -> list[SendTopology]:
        """A TOPOLOGY frame from ``link``: update the map; pass it on if newer."""
        got = self._links.get(link)
        if got is None:
            return []
        rid = frame.router_id
        if rid == self.me:
            if (dict(frame.domains), dict(frame.peers)) != (self.domains, self._own().peers):
                self.counters["topology_own_id"] += 1  # another router has our name
            return []
        direct = rid == got[0]
        if not direct and any(rid == peer for peer, _ in self._links.values()):
            self.counters["topology_peer_relayed"] += 1  # we hear it first hand
            return []
        crossed = frame.hops + 1  # peer links the announcement has crossed to reach us
        if crossed > self.max_hop_count:
            return []
        old = self._frames.get(rid)
        fresh = direct and rid in self._fresh
        if old is not None and frame.seq <= old.seq and not fresh:
            if frame.seq == old.seq and rid not in self._held:
                self.map.update(_info(frame), crossed, now)  # a repeat: heard again
            return []
        info = _info(frame)
        if not self._fits(info):
            self.map.refused += 1
            self.counters["topology_refused"] += 1
            return []
        self._fresh.discard(rid)
        self._frames[rid] = frame
        known = self.map.node(rid)
        if known is not None and (known.domains, known.peers) == (info.domains, info.peers):
            self._held.pop(rid, None)  # back to what the map holds: a held change is void
            self.map.update(info, crossed, now, replace=fresh)  # nothing to recompute
        elif rid in self._held or not self._can_recompute(now):
            self._held[rid] = (frame, crossed)
            self.map.touch(rid, now)
            self.counters["topology_held"] += 1
        else:
            self.map.update(info, crossed, now, replace=fresh)
            self._charged += RECALC_APPLY
        self._recheck()
        if crossed + 1 > self.max_hop_count:
            return []
        fwd = _hop(frame)
        return [SendTopology(other, fwd) for other in self._links if other != link]

    def tick(self, now: float) -> list[SendTopology]:
        """Apply held announcements once the budget allows; forget silent
        routers; announce again when the interval is up."""
        if self._held and self._can_recompute(now):
            held, self._held = self._held, {}
            for frame, crossed in held.values():
                self.map.update(_info(frame), crossed, now, replace=True)
            self._charged += RECALC_APPLY  # one change for them all
        for gone in self.map.expire(now):
            self._frames.pop(gone, None)
            self._held.pop(gone, None)
        self._recheck()
        if now >= self._next_announce:
            return self._announce(now)
        return []

    def heard_from(self, link: str, now: float) -> None:
        """Frames arrived on ``link``: the router at its other end is alive,
        however late its route info (it may wait behind a burst of interest or
        advertisements on the link). A link that stays silent lets it time out."""
        got = self._links.get(link)
        if got is not None:
            self.map.touch(got[0], now)

    def next_deadline(self) -> float:
        held = self._budget_at + max(0.0, -self._spend(self._budget_at)) / RECALC_RATE if self._held else float("inf")
        return min(self._next_announce, self.map.next_deadline(), held)

    def _spend(self, now: float) -> float:
        """The recomputation budget left at ``now`` (negative: overdrawn)."""
        self._budget = min(float(RECALC_BURST), self._budget + (now - self._budget_at) * RECALC_RATE)
        work = self.map.work + self._charged
        self._budget -= work - self._work_seen
        self._work_seen = work
        self._budget_at = max(self._budget_at, now)
        return self._budget

    def _fits(self, info: NodeInfo) -> bool:
        """Would the map stay within its bounds with ``info`` and the held
        announcements applied? (What is held counts: it is applied later.)"""
        held = [_info(f) for r, (f, _) in self._held.items() if r != info.router_id] + [info]
        m = self.map
        new = sum(1 for h in held if m.node(h.router_id) is None)
        dp = dd = 0
        for h in held:
            old = m.node(h.router_id)
            dp += len(h.peers) - (len(old.peers) if old else 0)
            dd += len(h.domains) - (len(old.domains) if old else 0)
        return (m.routers + new <= m.max_routers and m.peer_entries + dp <= m.max_entries
                and m.domain_entries + dd <= m.max_entries)

    def charge(self, steps: int) -> None:
        """Work done because the routes changed (e.g. transit interest brought
        in line), in route computation steps: it draws on the same budget."""
        self._charged += steps

    def _can_recompute(self, now: float) -> bool:
        return self._spend(now) >= 0

    # ------------------------------------------------------------------ views

    def peer_of(self, link: str) -> str | None:
        """The router at the other end of connected link ``link``."""
        got = self._links.get(link)
        return None if got is None else got[0]

    def links(self) -> dict[str, str]:
        """Connected peer links: name -> the router id at the other end."""
        return {name: peer for name, (peer, _) in self._links.items()}

    def origin_router(self, domain: int) -> str | None:
        """The router that brings ``domain``'s interest into the network: the
        first router (by id) we can reach with an endpoint portal in it, us
        included. Every router of a connected network names the same one, also
        for a TRD with several routers: its interest then travels along one tree
        and reaches each router once (each router of the TRD passes on what its
        own receivers want along that tree). A lying peer that claims our domain
        under a smaller id can draw that interest (route info is not
        authenticated: it can as well claim any other domain)."""
        if self._origins_at != self.map.changes:
            self._origins.clear()
            self._origins_at = self.map.changes
        if domain not in self._origins:
            if len(self._origins) >= 65536:
                self._origins.clear()
            mine = domain in self.domains
            routers = [r for r in self.map.routers_of(domain)
                       if r == self.me or self.map.path(self.me, r) is not None]
            if mine and self.me not in routers:
                routers.append(self.me)
            self._origins[domain] = min(routers) if routers else None
        return self._origins[domain]

    def children_links(self, domain: int) -> list[str]:
        """Our connected links to the routers that get ``domain``'s interest
        from us: our children in the lowest-cost tree of the domain's router."""
        at = (self.map.changes, self._link_changes)
        if at != self._children_at:
            self._children.clear()
            self._children_at = at
        got = self._children.get(domain)
        if got is None:
            root = self.origin_router(domain)
            kids = set(self.map.children(root, self.me)) if root is not None else set()
            got = self._children[domain] = sorted(name for name, (peer, _) in self._links.items()
                                                  if peer in kids)
        return list(got)

    def status(self) -> dict:
        """The map and our routes, for ``/status``."""
        return {
            "router_id": self.me,
            "seq": self._seq,
            "nodes": {r: {"seq": n.seq, "domains": {str(d): c for d, c in n.domains.items()},
                          "peers": dict(n.peers)} for r, n in sorted(self.map.nodes().items())},
            "routes": {str(d): {"path": list(r.path), "cost": r.cost, "hops": r.hops,
                                "next_hop": r.next_hop} for d, r in sorted(self.map.routes().items())},
            "route_info": {"held": len(self._held), "refused": self.map.refused,
                           "route_steps": self.map.work + self._charged, **self.counters},
        }

    # ------------------------------------------------------------------ internals

    def _own(self) -> NodeInfo:
        peers: dict[str, int] = {}
        for peer, cost in self._links.values():
            peers[peer] = min(cost, peers.get(peer, cost))
        return NodeInfo(self.me, self._seq, dict(self.domains), peers)

    def _announce(self, now: float) -> list[SendTopology]:
        self._seq += 1
        info = self._own()
        self.map.set_own(info)
        self._recheck()
        self._next_announce = now + self.propagation_interval
        frame = P.Topology(self.me, info.seq, 0, tuple(sorted(info.domains.items())),
                           tuple(sorted(info.peers.items())))
        return [SendTopology(link, frame) for link in self._links]

    def _recheck(self) -> None:
        self.version = self.map.changes


def _info(f: P.Topology) -> NodeInfo:
    return NodeInfo(f.router_id, f.seq, dict(f.domains), dict(f.peers))


def _hop(f: P.Topology) -> P.Topology:
    return P.Topology(f.router_id, f.seq, f.hops + 1, f.domains, f.peers)
