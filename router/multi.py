"""A router with several portals, on trio: endpoint portals joined to each
other directly ("direct link": one router between two or more TRDs, no peer
link) and to any number of peer routers.

A :class:`MultiRouter` is built from *portal links*: each is one
:class:`router.daemon.Router` (one endpoint portal's topic resolution, one
link, the bridge and relay between them), the unit the router has always
been. For a peer portal the link is its TCP connection, run by the first
endpoint's portal link; the other endpoints' portal links are attached to
it (they get its frames and link events; advert ids are numbered for the
whole router, so they are unique on the link, and a stream the peer opens
goes to the relay of the endpoint that made its advertisement). For a pair of
endpoint portals of the same router the link is an in-process one: a
connected socket pair carrying the same peer-link protocol, so interest,
advertisements, flow control and the TCP and LBT-RU relay are those of a
peer link, tested once. Every pair of endpoint portals gets one such link
(a full mesh: each TRD's receivers see the sources of every other TRD
directly, one hop).

Each endpoint portal is one UM context in its TRD, as the DRO's is: one TR
socket, one source id and one topic resolution
(:class:`router.portal_task.PortalTask`, :mod:`router.core.endpoint_portal`),
shared by all the portal links of the endpoint, and one set of relay ports
(one quarantine). Loop prevention is the portal's single-hop rule
(:mod:`router.core.tr`): what a router advertises into a TRD (source type TNWGD,
another domain's id) is never bridged again, by any portal link of any
router, so a topic is advertised once per TRD for each TRD that has a
source of it.

Both ends of a peer link refuse, at the handshake, a router that another
link already reaches (same name, or a domain id in common): its TRDs would
be bridged twice.

Multi-hop: the router is the *hub* of its peer links' portal links. It runs
the route info protocol (:class:`router.core.routing.Routing`: TOPOLOGY frames,
the topology map, every router's lowest-cost tree) and passes interest and
advertisements between peer links (:class:`router.core.transit.Transit`); the
bridges send their TRD's interest only on the links the routes give it
(``interest_filter``) and proxy a source that another link wants
(``transit_wants``). Routes are recomputed on every change of the map (a link
up or down, a router heard of or timed out), and the interest on every link
is brought in line at once. A peer without the ROUTING capability is one hop
away and no further.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections import Counter
from functools import partial

import trio

from lbmr_runtime.http import PrometheusText, serve_http

from . import peerlink as P
from .config_model import EndpointConfig, PeerConfig, RouterConfig, acceptor_peer, initiator_peer
from .core.routing import Routing
from .core.transit import Transit
from .daemon import Router, portal_timing, serve_signals
from .portal_task import PortalTask
from .relay import PortPool

__all__ = ["MultiRouter"]

log = logging.getLogger("lbmr-router")


class MultiRouter:
    """``await MultiRouter(config).run(task_status=...)`` in a nursery; reports
    {"links": [each link's Router report], "metrics": (ip, port) or None}.
    ``handle_signals``: SIGUSR1 dump, SIGTERM/SIGINT stop (the command line
    turns it on)."""

    def __init__(self, config: RouterConfig, *, handle_signals: bool = False) -> None:
        if not config.endpoints:
            raise ValueError("a router needs an endpoint portal")
        self.config = config
        self.handle_signals = handle_signals
        self.pools = {e.name: PortPool() for e in config.endpoints}
        # one portal task per endpoint (one TR socket and context in its TRD), shared by its links
        self.portal_counters: dict[str, Counter[str]] = {e.name: Counter() for e in config.endpoints}
        self.portals = {e.name: PortalTask(e, portal_timing(e), self.portal_counters[e.name])
                        for e in config.endpoints}
        self.links: list[Router] = []
        self._advert_ids = itertools.count(1)  # one numbering for the router: unique on every link
        self._nursery: trio.Nursery | None = None
        self.counters: Counter[str] = Counter()  # routing and transit
        self._acl_rejected: Counter[str] = Counter()  # transit frames refused by a peer portal's ACL
        self.routing: Routing | None = None
        self.transit: Transit | None = None
        self._owners: dict[str, Router] = {}  # peer link name -> the unit that runs it
        self._routes_seen = -1

    def _unit(self, endpoint: EndpointConfig, peer: PeerConfig, name: str, **kw) -> Router:
        r = Router(name, endpoint, peer, port_pool=self.pools[endpoint.name],
                   advert_ids=self._advert_ids, portal=self.portals[endpoint.name], **kw)
        r.accept_peer = partial(self._accept, r)
        self.links.append(r)
        return r

    def _accept(self, unit: Router, peer: P.PeerInfo) -> tuple[bool, str]:
        """One link per router and per TRD: a peer is refused (both ends check,
        at the handshake) when another link of the same endpoint portal is
        connected to a router of the same name or serving one of its domains
        (its TRDs would be bridged twice, each topic advertised twice)."""
        for r in self.links:
            link = r.link
            if r is unit or r.endpoint is not unit.endpoint:
                continue
            if link is None or not link.connected or link.conn.peer is None:
                continue
            other = link.conn.peer
            shared = sorted(set(other.domains) & set(peer.domains))
            if other.name == peer.name or shared:
                why = f"domains {shared}" if shared else "that router"
                unit.counters["peer_refused_duplicate"] += 1
                return False, (f"router {self.config.name!r} already reaches {why} through link "
                               f"{r.peer.name!r} (router {other.name!r})")
        return True, ""

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        s = self.config
        eps = s.endpoints
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            reports = []
            domains = tuple(e.domain_id for e in eps)
            ri = s.route_info
            self.routing = Routing(s.name, {e.domain_id: e.cost for e in eps}, now=trio.current_time(),
                                   seq_base=time.time_ns() // 1_000_000,
                                   propagation_interval=ri.propagation_interval_ms / 1000.0,
                                   timeout=ri.timeout_ms / 1000.0, max_hop_count=ri.max_hop_count)
            self.transit = Transit(self.routing, self._advert_ids, self.counters)
            for portal in self.portals.values():
                await nursery.start(portal.run)
            if s.peers:
                nursery.start_soon(self._routing_loop)
            for p in s.peers:
                # one link per peer, run by the first endpoint's portal link; the
                # other endpoints' portal links are attached to it
                owner = self._unit(eps[0], p, s.name, domains=domains, hub=self)
                self._owners[p.name] = owner
                for e in eps[1:]:
                    u = self._unit(e, p, s.name, hub=self)
                    u.owner = owner
                    owner.attached.append(u)
                reports.append(await nursery.start(owner.run))
                for u in owner.attached:
                    await nursery.start(u.run)
            for i, a in enumerate(eps):
                for b in eps[i + 1:]:
                    sa, sb = trio.socket.socketpair()
                    link = f"{a.name}<->{b.name}"
                    ua = self._unit(a, initiator_peer(link, "", 0), f"{s.name}/{a.name}",
                                    stream=trio.SocketStream(sa))
                    ub = self._unit(b, acceptor_peer(link), f"{s.name}/{b.name}",
                                    stream=trio.SocketStream(sb))
                    reports.append(await nursery.start(ub.run))
                    reports.append(await nursery.start(ua.run))
            metrics_addr = None
            if s.metrics is not None:
                routes = {"/metrics": ("text/plain; version=0.0.4", self.prometheus_text),
                          "/status": ("application/json", lambda: json.dumps(self.status()))}
                metrics_addr = await nursery.start(partial(serve_http, logger=log), routes, s.metrics)
            if self.handle_signals:
                await nursery.start(partial(serve_signals, self.status, self._stop))
            task_status.started({"links": reports, "metrics": metrics_addr})

    # --------------------------------------------------------------- routing (the hub)

    async def _routing_loop(self) -> None:
        while True:
            await trio.sleep_until(self.routing.next_deadline())
            self._send(self.routing.tick(trio.current_time()))
            self._routes_changed()

    def _send(self, outputs) -> None:
        """Frames for peer links (route info, transit interest and adverts)."""
        for o in outputs:
            unit = self._owners.get(o.link)
            link = unit.link if unit is not None else None
            if unit is not None and not self._acl_lets_out(unit, o.frame):
                continue
            if link is not None and link.connected:
                link.put(o.frame)
                self.counters[f"sent_{o.frame.TYPE.name.lower()}"] += 1

    def _routes_changed(self) -> None:
        """If the map changed: pass on interest by the new trees, and let every
        bridge send (or cancel) its TRD's interest where the routes now say."""
        if self.routing.version == self._routes_seen:
            return
        self._routes_seen = self.routing.version
        self.counters["route_recalculations"] += 1
        self._send(self.transit.resync())
        now = trio.current_time()
        for u in self.links:
            if u.hub is not None and u.bridge is not None:
                u.bridge.resync_interest(now)
                u._apply()

    def _link_name(self, unit: Router) -> str:
        return unit.peer.name

    def attach_bridge(self, unit: Router) -> None:
        """A portal link's bridge exists: give it the routes' filter and, for the
        unit that runs the link, the transit interest."""
        name, domain = self._link_name(unit), unit.endpoint.domain_id
        unit.bridge.interest_filter = lambda: (self.routing.peer_of(name) is None  # one hop
                                               or name in self.routing.children_links(domain))
        if unit.owner is None:
            unit.bridge.transit_wants = lambda topic, origin: self.transit.wants(name, topic, origin)
        unit.bridge.route_cost = self._route_cost

    def _route_cost(self, domain: int) -> int | None:
        route = self.routing.map.route(domain)
        return None if route is None else route.cost

    def link_up(self, unit: Router, peer: P.PeerInfo, capabilities: int) -> None:
        if not capabilities & P.Capability.ROUTING:
            self.counters["peers_without_routing"] += 1
            return
        now = trio.current_time()
        self._send(self.routing.link_up(self._link_name(unit), peer.name, unit.peer.cost, now))
        self._routes_changed()

    def link_down(self, unit: Router) -> None:
        name = self._link_name(unit)
        self._send(self.routing.link_down(name, trio.current_time()))
        self._send(self.transit.link_down(name))
        self._routes_changed()

    def heard(self, unit: Router) -> None:
        """Frames arrived on ``unit``'s link (see :meth:`Routing.heard_from`)."""
        self.routing.heard_from(self._link_name(unit), trio.current_time())

    def topology(self, unit: Router, frame: P.Topology) -> None:
        self._send(self.routing.on_topology(self._link_name(unit), frame, trio.current_time()))
        self._routes_changed()

    def interest(self, unit: Router, frame: P.Interest) -> None:
        # the link's ACL (its refusals are counted by the link's own bridge)
        if not unit.peer.acl.allows_interest_in(frame.topic, int(frame.pattern_type)):
            return
        self._send(self.transit.on_interest(self._link_name(unit), frame))

    def _acl_lets_out(self, unit: Router, frame) -> bool:
        """May transit send ``frame`` on ``unit``'s peer link (its outbound list,
        and for interest its inbound list: where the data would come back)?"""
        acl = unit.peer.acl
        if not acl.configured:
            return True
        if isinstance(frame, P.Interest) and frame.action != P.InterestAction.CANCEL:
            ok = acl.allows_interest_out(frame.topic, int(frame.pattern_type))
        elif isinstance(frame, P.Advertisement) and not frame.withdraw:
            ok = acl.allows_source_out(frame.topic)
        else:
            return True
        if not ok and not (isinstance(frame, P.Interest) and frame.action == P.InterestAction.REFRESH):
            self._acl_rejected[unit.peer.name] += 1
        return ok

    def proxy_up(self, unit: Router, advert: P.Advertisement, body: object) -> None:
        if unit.owner is None:
            self._send(self.transit.on_proxy(self._link_name(unit), advert, body))

    def proxy_down(self, unit: Router, advert_id: int) -> None:
        if unit.owner is None:
            self._send(self.transit.on_proxy_gone(self._link_name(unit), advert_id))

    def transit_source(self, unit: Router, advert_id: int):
        return self.transit.advert_source(self._link_name(unit), advert_id)

    # --------------------------------------------------------------- status

    async def _stop(self) -> None:
        """Graceful end of every link (bounded in time), then of the router."""
        with trio.move_on_after(3.0):
            async with trio.open_nursery() as n:
                for r in self.links:
                    n.start_soon(r.disconnect, "shutting down")
        self._nursery.cancel_scope.cancel()

    def portal_summary(self) -> list[dict]:
        """Per endpoint portal: its links and its interest, proxy and advert counts
        and drops, summed over its links."""
        out = []
        for e in self.config.endpoints:
            units = [r for r in self.links if r.endpoint is e]
            local: set[str] = set()
            remote: set[str] = set()
            counters: Counter[str] = Counter(self.portal_counters[e.name])
            portal = self.portals[e.name].portal
            tr_stats = portal.stats() if portal is not None else {}
            proxies = adverts = listeners = 0
            for r in units:
                counters.update(r.counters)
                if r.tr is not None:
                    local.update(li.topic for li in r.tr.local_interests())
                    remote.update(t for t, _ in r.tr.remote_interests())
                if r.bridge is not None:
                    proxies += len(r.bridge.proxy_addresses())
                    listeners += r.bridge.proxy_listeners()
                    adverts += len(r.bridge.advert_sources())
            out.append({
                "name": e.name, "domain_id": e.domain_id, "mode": e.mode,
                "links": [{"name": r.peer.name, "state": _state(r)} for r in units],
                "local_interest": sorted(local), "remote_interest": sorted(remote),
                "proxies": proxies, "proxy_listeners": listeners, "adverts": adverts,
                "drops": {k: v for k, v in counters.items() if k in _DROPS and v},
                "counters": dict(counters), "tr": dict(tr_stats),
                "acl_rejected": self.acl_rejected().get(e.name, 0),
            })
        return out

    def acl_rejected(self) -> Counter[str]:
        """Refusals by each portal's ACL (endpoints and peers), over all links."""
        total: Counter[str] = Counter(self._acl_rejected)
        for r in self.links:
            if r.bridge is not None:
                total.update(r.bridge.acl_rejected)
        return total

    def acl_status(self) -> dict:
        """Per portal with an ACL or a refusal: its lists' entry counts and refusals."""
        rejected = self.acl_rejected()
        out = {}
        for portal in (*self.config.endpoints, *self.config.peers):
            if portal.acl.configured or rejected.get(portal.name):
                out[portal.name] = {**portal.acl.summary(), "rejected": rejected.get(portal.name, 0)}
        return out

    def status(self) -> dict:
        """The router: its portals (summed over their links) and each link's own
        status (:meth:`Router.status`). ``peer``/``portal``/``proxies``/``streams``
        at the top are the first link's, as a single-link router reports them."""
        first = self.links[0].status() if self.links else {}
        routing = self.routing.status() if self.routing is not None else {}
        if self.transit is not None:
            routing["transit"] = self.transit.status()
        routing["counters"] = dict(self.counters)
        return {**first, "name": self.config.name, "portals": self.portal_summary(), "acl": self.acl_status(),
                "topology": routing, "links": [r.status() for r in self.links]}

    def prometheus_text(self) -> str:
        p = PrometheusText()
        ups = {r.peer.name: 1 if _state(r) == P.State.CONNECTED.value else 0 for r in self.links}
        p.by_label("lbmr_router_link_up", "gauge", "link", ups, "1 while the link is connected.")
        p.metric("lbmr_router_peer_up", "gauge", min(ups.values(), default=0),
                 "1 while every link is connected.")
        summary = self.portal_summary()
        for what in ("proxies", "proxy_listeners", "adverts"):
            p.by_label(f"lbmr_router_portal_{what}", "gauge", "portal",
                       {s["name"]: s[what] for s in summary})
        p.by_label("lbmr_router_portal_local_interest", "gauge", "portal",
                   {s["name"]: len(s["local_interest"]) for s in summary})
        p.by_label("lbmr_router_portal_remote_interest", "gauge", "portal",
                   {s["name"]: len(s["remote_interest"]) for s in summary})
        total: Counter[str] = Counter()
        for s in summary:
            total.update(s["counters"])
        p.by_label("lbmr_router_events_total", "counter", "kind", total, "Router events, by kind.")
        p.family("lbmr_router_portal_drops_total", "counter", "Drops and refusals, by portal and kind.")
        for s in summary:
            for k, v in sorted(s["drops"].items()):
                p.sample("lbmr_router_portal_drops_total", v, {"portal": s["name"], "kind": k})
        p.by_label("lbmr_router_portal_acl_rejected_total", "counter", "portal",
                   {name: v["rejected"] for name, v in self.acl_status().items()},
                   "Interest, sources and advertisements refused by each portal's ACL.")
        p.metric("lbmr_router_proxies", "gauge", sum(x["proxies"] for x in summary))
        p.metric("lbmr_router_adverts", "gauge", sum(x["adverts"] for x in summary))
        p.metric("lbmr_router_streams", "gauge", sum(len(r.link.state) for r in self.links if r.link))
        p.family("lbmr_router_portal_total", "counter")
        for x in summary:
            for k, v in sorted(x["tr"].items()):
                p.sample("lbmr_router_portal_total", v, {"portal": x["name"], "what": k})
        p.metric("lbmr_router_peer_dropped_datagrams_total", "counter",
                 sum(r.link.outq.dropped_datagrams for r in self.links if r.link))
        if self.routing is not None:
            routes = self.routing.map.routes()
            p.metric("lbmr_router_topology_routers", "gauge", len(self.routing.map.nodes()),
                     "Routers in the topology map, this one included.")
            p.family("lbmr_router_route_cost", "gauge", "Cost of the route to each domain.")
            for d, r in sorted(routes.items()):
                p.sample("lbmr_router_route_cost", r.cost, {"domain": str(d), "next_hop": r.next_hop or ""})
            p.family("lbmr_router_route_hops", "gauge", "Peer links on the route to each domain.")
            for d, r in sorted(routes.items()):
                p.sample("lbmr_router_route_hops", r.hops, {"domain": str(d)})
            t = self.transit.status()
            p.metric("lbmr_router_transit_interest", "gauge", t["interest_held"],
                     "Interest from peer links passed on (topics and patterns, by origin domain).")
            p.metric("lbmr_router_transit_adverts", "gauge", t["adverts"],
                     "Our proxies advertised on other peer links.")
            p.by_label("lbmr_router_routing_total", "counter", "what", self.counters,
                       "Route info and transit, by kind.")
        return p.text()


# counters that are something dropped or refused
_DROPS = frozenset({"peer_refused_duplicate", "bad_interest", "bad_advert", "adverts_unwanted", "adverts_own_domain", "proxies_full",
                    "unrelayable_transport", "relay_ports_exhausted", "streams_refused",
                    "ru_streams_full", "peer_refused_busy", "handshakes_dropped", "portal_queue_full",
                    "tr_send_error", "ru_send_error", "peer_not_reading"})


def _state(r: Router) -> str:
    link = r.link
    return link.conn.state.value if link is not None else "down"
