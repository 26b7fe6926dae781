"""The router topology map, sans-IO (used by :mod:`router.core.routing`).

Each router announces a :class:`NodeInfo`: its id, a sequence number, the
domain ids of its endpoint portals with their ``<cost>``, and its peer
portals (the id of the router at the other end, with the portal's
``<cost>``). A :class:`TopologyMap` keeps the newest announcement of every
router it has heard of, forgets a router not heard of for ``timeout``
seconds, and computes from its own router the lowest-cost path to every
domain, following the DRO's conventions (``../shared/spec/dro-behaviour.md``
section 4):

* a path's cost is the sum of the ``<cost>`` of every portal it uses: at
  each peer link the portals of both ends, and at the end the destination
  router's endpoint portal (a domain of our own costs its endpoint's cost);
* a peer link counts only when both routers announce it (a link seen from
  one side only is not up yet, or already down);
* ties are broken by router id: of two paths of equal cost, the one whose
  sequence of router ids is smaller (compared id by id) wins, so every router
  computes the same choice;
* a path of more than ``max_hop_count`` peer links is not used, and an
  announcement that travelled more hops is ignored.

Bounds (route info comes from peers, which may lie): at most ``max_routers``
routers (:data:`MAX_ROUTERS`) and, summed over them, ``max_entries``
(:data:`MAX_MAP_ENTRIES`) announced peers and as many domains; an
announcement that would take the map past them is refused (counted in
:attr:`TopologyMap.refused`). A route computation costs about a microsecond
per announced peer entry, once for our own tree and once per root whose tree
is asked for (each origin router of interest passed on): at most
``max_routers`` x ``max_entries`` steps; :attr:`TopologyMap.work` counts
them (heap pushes) so :mod:`router.core.routing` can pace recomputation.

Times are seconds on any monotonic clock; nothing here reads one.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

__all__ = ["NodeInfo", "Route", "TopologyMap", "MAX_ROUTERS", "MAX_MAP_ENTRIES"]

MAX_ROUTERS = 128  # routers in the map, this one included
MAX_MAP_ENTRIES = 2048  # announced peers (and, separately, domains) summed over the map


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What one router announces: ``domains`` maps the domain id of each of its
    endpoint portals to the portal's cost, ``peers`` the id of each router it
    has a peer portal to (connected) to that portal's cost. ``seq`` grows with
    every change; an older or equal ``seq`` is a repeat."""

    router_id: str
    seq: int
    domains: dict[int, int] = field(default_factory=dict)
    peers: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Route:
    """The chosen path from this router to ``domain``: ``path`` is the routers
    it goes through, this router first and the one with the endpoint last;
    ``next_hop`` the router to send to (None: the domain is ours)."""

    domain: int
    path: tuple[str, ...]
    cost: int

    @property
    def next_hop(self) -> str | None:
        return self.path[1] if len(self.path) > 1 else None

    @property
    def hops(self) -> int:
        """Peer links on the path."""
        return len(self.path) - 1


class TopologyMap:
    """The map as seen from router ``me`` (see the module doc)."""

    def __init__(self, me: NodeInfo, *, max_hop_count: int = 100, timeout: float = 4.0,
                 max_routers: int = MAX_ROUTERS, max_entries: int = MAX_MAP_ENTRIES) -> None:
        if max_hop_count < 1:
            raise ValueError("max_hop_count must be at least 1")
        self.me = me.router_id
        self.max_hop_count = max_hop_count
        self.timeout = timeout
        self.max_routers, self.max_entries = max_routers, max_entries
        self.refused = 0  # announcements refused for the bounds
        self.work = 0  # route computation steps (heap pushes) so far
        self._peer_entries = len(me.peers)
        self._domain_entries = len(me.domains)
        self._nodes: dict[str, NodeInfo] = {me.router_id: me}
        self._heard: dict[str, float] = {}
        self._routes: dict[int, Route] | None = None
        self._trees: dict[str, dict[str, tuple[int, tuple[str, ...]]]] = {}  # by root
        self.changes = 0  # grows with every change of the map's contents

    # ------------------------------------------------------------------ inputs

    def set_own(self, info: NodeInfo) -> None:
        """Our own announcement changed (a portal came up or went down)."""
        if info.router_id != self.me:
            raise ValueError(f"not this router: {info.router_id!r}")
        old = self._nodes[self.me]
        self._nodes[self.me] = info
        self._peer_entries += len(info.peers) - len(old.peers)
        self._domain_entries += len(info.domains) - len(old.domains)
        if (old.domains, old.peers) != (info.domains, info.peers):
            self._changed()

    def update(self, info: NodeInfo, hops: int, now: float, *, replace: bool = False) -> bool:
        """An announcement that crossed ``hops`` peer links; True when the map
        changed (a new router, or a newer ``seq`` with other contents).
        ``replace``: take it even if its ``seq`` is not newer (what a router
        says of itself on a link to it that just came up: it may have
        restarted with a smaller one). Refused (False, :attr:`refused`) if it
        would take the map past its bounds."""
        if info.router_id == self.me or hops > self.max_hop_count:
            return False
        old = self._nodes.get(info.router_id)
        if old is not None and info.seq <= old.seq and not replace:
            if info.seq == old.seq:
                self._heard[info.router_id] = now
            return False
        if not self.fits(info):
            self.refused += 1
            return False
        self._heard[info.router_id] = now
        self._nodes[info.router_id] = info
        self._account(old, info)
        changed = old is None or (old.domains, old.peers) != (info.domains, info.peers)
        if changed:
            self._changed()
        return changed

    def fits(self, info: NodeInfo) -> bool:
        """Would ``info`` (replacing what we hold of its router) keep the map
        within its bounds?"""
        old = self._nodes.get(info.router_id)
        if old is None and len(self._nodes) >= self.max_routers:
            return False
        was_p, was_d = (0, 0) if old is None else (len(old.peers), len(old.domains))
        return (self._peer_entries - was_p + len(info.peers) <= self.max_entries
                and self._domain_entries - was_d + len(info.domains) <= self.max_entries)

    def _account(self, old: NodeInfo | None, new: NodeInfo | None) -> None:
        for n, sign in ((old, -1), (new, 1)):
            if n is not None:
                self._peer_entries += sign * len(n.peers)
                self._domain_entries += sign * len(n.domains)

    def touch(self, router_id: str, now: float) -> None:
        """``router_id`` is known to be alive at ``now`` (a connected link to it
        answers keepalives): not forgotten while its announcements queue up."""
        if router_id in self._heard:
            self._heard[router_id] = max(self._heard[router_id], now)

    def expire(self, now: float) -> list[str]:
        """Forget the routers not heard of for ``timeout``; their ids."""
        gone = [r for r, t in self._heard.items() if now - t >= self.timeout]
        for r in gone:
            del self._heard[r]
            self._account(self._nodes.pop(r), None)
        if gone:
            self._changed()
        return gone

    def _changed(self) -> None:
        self.changes += 1
        self._routes = None
        self._trees.clear()

    def next_deadline(self) -> float:
        """When :meth:`expire` may next forget a router."""
        return min(self._heard.values(), default=float("inf")) + self.timeout

    # ------------------------------------------------------------------ views

    def nodes(self) -> dict[str, NodeInfo]:
        return dict(self._nodes)

    def node(self, router_id: str) -> NodeInfo | None:
        return self._nodes.get(router_id)

    @property
    def routers(self) -> int:
        """Routers in the map, this one included."""
        return len(self._nodes)

    @property
    def peer_entries(self) -> int:
        """Announced peers summed over the map (bounded by ``max_entries``)."""
        return self._peer_entries

    @property
    def domain_entries(self) -> int:
        return self._domain_entries

    def routes(self) -> dict[int, Route]:
        """The lowest-cost route to every reachable domain, by domain id."""
        if self._routes is None:
            self._routes = self._compute()
        return dict(self._routes)

    def route(self, domain: int) -> Route | None:
        return self.routes().get(domain)

    def routers_of(self, domain: int) -> list[str]:
        """The routers with an endpoint portal in ``domain``, by router id."""
        return sorted(r for r, n in self._nodes.items() if domain in n.domains)

    def path(self, root: str, to: str) -> tuple[str, ...] | None:
        """The lowest-cost path from router ``root`` to router ``to`` (both
        included), as ``root`` computes it (same map, same ties: every router
        gets the same answer); None if unreachable."""
        got = self._tree(root).get(to)
        return None if got is None else got[1]

    def parent(self, root: str, router: str) -> str | None:
        """The router before ``router`` on ``root``'s path to it (None for
        ``root`` itself or an unreachable router): who passes on to ``router``
        what spreads from ``root`` along its lowest-cost tree."""
        p = self.path(root, router)
        return p[-2] if p is not None and len(p) > 1 else None

    def children(self, root: str, router: str) -> list[str]:
        """The routers whose parent in ``root``'s tree is ``router``, by id."""
        tree = self._tree(root)
        return sorted(r for r, (_, p) in tree.items() if len(p) > 1 and p[-2] == router)

    # ------------------------------------------------------------------ Dijkstra

    def _link_cost(self, a: str, b: str) -> int | None:
        na, nb = self._nodes.get(a), self._nodes.get(b)
        if na is None or nb is None or b not in na.peers or a not in nb.peers:
            return None  # announced by one side only
        return na.peers[b] + nb.peers[a]

    def _tree(self, root: str) -> dict[str, tuple[int, tuple[str, ...]]]:
        """Best (cost, path) from ``root`` to every router it reaches; the path
        tuple breaks ties by router id."""
        tree = self._trees.get(root)
        if tree is None:
            tree = self._trees[root] = self._dijkstra(root) if root in self._nodes else {}
        return tree

    def _dijkstra(self, root: str) -> dict[str, tuple[int, tuple[str, ...]]]:
        best: dict[str, tuple[int, tuple[str, ...]]] = {}
        heap: list[tuple[int, tuple[str, ...]]] = [(0, (root,))]
        while heap:
            cost, path = heapq.heappop(heap)
            here = path[-1]
            if here in best:
                continue
            best[here] = (cost, path)
            if len(path) - 1 >= self.max_hop_count:
                continue
            for nxt in self._nodes[here].peers:
                if nxt in best or nxt in path:
                    continue
                c = self._link_cost(here, nxt)
                if c is not None:
                    self.work += 1
                    heapq.heappush(heap, (cost + c, (*path, nxt)))
        return best

    def _compute(self) -> dict[int, Route]:
        routes: dict[int, Route] = {}
        for router, (cost, path) in self._tree(self.me).items():
            for domain, dcost in self._nodes[router].domains.items():
                cand = Route(domain, path, cost + dcost)
                cur = routes.get(domain)
                if cur is None or (cand.cost, cand.path) < (cur.cost, cur.path):
                    routes[domain] = cand
        return routes
