"""Route info between routers, sans-IO: this router's announcements, the
flooding of every router's announcements over the peer links, and the
:class:`router.topology.TopologyMap` they build.

A :class:`Routing` belongs to one router (:class:`router.multi.MultiRouter`).
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
far side takes to notice.

Inputs take ``now`` (seconds, any monotonic clock); outputs are
:class:`SendTopology` items (a frame for one link) returned by each call.
:attr:`Routing.version` grows whenever the routes may have changed.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import peerlink as P
from .topology import NodeInfo, TopologyMap

__all__ = ["Routing", "SendTopology"]

DEFAULT_PROPAGATION_INTERVAL = 1.0  # seconds (DRO <route-info propagation-interval="1000">)
DEFAULT_ROUTE_TIMEOUT = 4.0  # seconds (DRO <route-info timeout="4000">)
DEFAULT_MAX_HOP_COUNT = 100  # DRO <route-info max-hop-count="100">


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
                 max_hop_count: int = DEFAULT_MAX_HOP_COUNT) -> None:
        self.me = me
        self.domains = dict(domains)
        self.propagation_interval = propagation_interval
        self.max_hop_count = max_hop_count
        self._seq = seq_base
        self._links: dict[str, tuple[str, int]] = {}  # link name -> (peer router id, portal cost)
        self.map = TopologyMap(self._own(), max_hop_count=max_hop_count, timeout=timeout)
        self._frames: dict[str, P.Topology] = {}  # newest announcement of each other router
        self._next_announce = now + propagation_interval
        self.version = 0  # grows whenever the routes (of any router) may have changed
        self._children: dict[int, list[str]] = {}  # children_links cache, by domain
        self._children_at: tuple[int, int] = (-1, -1)  # (map changes, links changes) it was made at
        self._link_changes = 0

    # ------------------------------------------------------------------ inputs

    def link_up(self, link: str, peer_id: str, cost: int, now: float) -> list[SendTopology]:
        """Peer link ``link`` is connected to router ``peer_id``; ``cost``: the
        link portal's cost. Announces us everywhere and tells the new link
        everything we know."""
        self._links[link] = (peer_id, cost)
        self._link_changes += 1
        out = [SendTopology(link, f) for f in self._frames.values()
               if f.router_id != peer_id and f.hops + 2 <= self.max_hop_count]
        out = [SendTopology(s.link, _hop(s.frame)) for s in out]
        return self._announce(now) + out

    def link_down(self, link: str, now: float) -> list[SendTopology]:
        if self._links.pop(link, None) is None:
            return []
        self._link_changes += 1
        return self._announce(now)

    def on_topology(self, link: str, frame: P.Topology, now: float) -> list[SendTopology]:
        """A TOPOLOGY frame from ``link``: update the map; pass it on if newer."""
        if frame.router_id == self.me or link not in self._links:
            return []
        crossed = frame.hops + 1  # peer links the announcement has crossed to reach us
        if crossed > self.max_hop_count:
            return []
        old = self._frames.get(frame.router_id)
        if old is not None and frame.seq <= old.seq:
            if frame.seq == old.seq:
                self.map.update(_info(frame), crossed, now)  # a repeat: heard again
            return []
        self._frames[frame.router_id] = frame
        self.map.update(_info(frame), crossed, now)
        self._recheck()
        if crossed + 1 > self.max_hop_count:
            return []
        fwd = _hop(frame)
        return [SendTopology(other, fwd) for other in self._links if other != link]

    def tick(self, now: float) -> list[SendTopology]:
        """Forget silent routers; announce again when the interval is up."""
        for gone in self.map.expire(now):
            self._frames.pop(gone, None)
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
        return min(self._next_announce, self.map.next_deadline())

    # ------------------------------------------------------------------ views

    def peer_of(self, link: str) -> str | None:
        """The router at the other end of connected link ``link``."""
        got = self._links.get(link)
        return None if got is None else got[0]

    def links(self) -> dict[str, str]:
        """Connected peer links: name -> the router id at the other end."""
        return {name: peer for name, (peer, _) in self._links.items()}

    def origin_router(self, domain: int) -> str | None:
        """The router that brings ``domain``'s interest into the network: us
        if it is one of our domains, else the first router (by id) with an
        endpoint portal in it."""
        if domain in self.domains:
            return self.me
        routers = self.map.routers_of(domain)
        return routers[0] if routers else None

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
