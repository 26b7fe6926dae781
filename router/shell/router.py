"""A router on trio: any number of endpoint portals (each one UM context in
its TRD) and peer links, with the router's control plane in one sans-IO core
(:class:`router.core.router_core.RouterCore`). One nursery per router.

Tasks: one per endpoint's TR socket (:class:`router.shell.portal_task.PortalTask`),
one per link (:class:`router.shell.link_task.LinkTask`: each ``<peer>``, and each
side of a pair of endpoints, whose control is joined in the core and whose
relayed sessions cross in memory, :class:`router.shell.pair_link.PairLink`), one per proxy listener and relayed stream
(:class:`router.relays.endpoint_relay.Relay`, one per link and endpoint, sharing the
endpoint's relay ports), one per endpoint's request listener and per
connection and destination of unicast immediate messages by domain
(:class:`router.relays.uim.UimRelay`), the HTTP endpoint, the signals, and the core task:
it runs the core's timers at its deadline and, whenever another task gave
the core input (and set the :class:`router.shell.wake.Wake`), carries out its
outputs (TR datagrams, frames, proxies to start and stop, events).

A *unit* (:class:`Unit`) is one endpoint on one link: its bridge in the core,
its relay, its counters and events; ``/status`` lists them as ``links``.
Both ends of a peer link refuse, at the handshake, a router that another
link of the same endpoints already reaches (same name, or a domain id in
common): its TRDs would be bridged twice (:meth:`RouterCore.accept_peer`).
"""

from __future__ import annotations

import json
import logging
import signal
import time
from collections import Counter
from functools import partial

import trio

from lbmr_runtime.eventlog import LimitedLog
from lbmr_runtime.events import EventRing
from lbmr_runtime.http import PrometheusText, serve_http
from lbmr_runtime.loglimit import LogLimiter
from lbmr_runtime.monitor import page_routes

from .. import peerlink as P
from ..config.model import EndpointConfig, PeerConfig, RouterConfig, acceptor_peer, initiator_peer
from ..core.router_core import (
    EndpointRules,
    LinkSpec,
    Notice,
    RouterCore,
    SendFrame,
    SendTR,
    StartProxy,
    StopProxy,
)
from ..core.routing import Routing
from ..core.uim import UimPath
from ..relays.endpoint_relay import PortPool, Relay
from ..relays.interface import RelaySettings
from ..relays.uim import UimRelay
from .link_task import LinkTask
from .monitor import monitor_access, router_page, sessions_page
from .pair_link import PairLink, pair_links
from .portal_task import IO_BATCH, PortalTask, new_portal
from .relay_site import RelaySite
from .wake import Wake

__all__ = ["MultiRouter", "Unit", "serve_signals", "proxy_bound", "PEER_CAPABILITIES",
           "LOG_LINES_PER_WINDOW", "LOG_WINDOW"]

log = logging.getLogger("lbmr-router")

#: what a peer link announces besides the protocol's DEFAULT_CAPABILITIES (and ROUTING): the
#: stream kinds of its own this router's data plane relays, and whole-message frames of the
#: TCP fan-out (spliced to a lone receiver), frames of up to 4 MiB (LARGE_FRAMES)
PEER_CAPABILITIES = (P.Capability.UIM_ROUTING | P.Capability.RECOVERY | P.Capability.WHOLE_MESSAGES
                     | P.Capability.LARGE_FRAMES)

ADVERTISE_CHUNK = 500  # topics of one session advertised at its new proxy before the loop runs again

LOG_LINES_PER_WINDOW = 20  # log lines per event kind per LOG_WINDOW; the rest is one summary line
LOG_WINDOW = 10.0  # seconds


def proxy_bound(configured: int) -> int:
    """At most ``configured`` proxies, and at most a quarter of the descriptors
    the process may open (each proxy is a listener, each receiver a socket on
    both routers): a flood of advertisements cannot exhaust them."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, (soft - 64) // 4))


async def serve_signals(status, stop, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """SIGUSR1 logs ``status()`` as one JSON line ("dump ..."); SIGTERM and SIGINT
    ``await stop()`` (a graceful end of the links, then the router's nursery)."""
    with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGTERM, signal.SIGINT) as sigs:
        task_status.started()
        async for sig in sigs:
            if sig == signal.SIGUSR1:
                log.info("dump %s", json.dumps(status()))
            else:
                log.info("stopping (%s)", signal.Signals(sig).name)
                await stop()


# batches of IO_BATCH datagrams a TR socket may give the core's task before the core's
# timers run (at most 1,024 datagrams; the portal's own task reads the rest)
READ_BEFORE_TIMERS = 16


class Unit:
    """One endpoint on one link (what ``/status`` lists as a link): ``name``
    (the router's, or ``router/endpoint`` on an endpoint pair's link),
    ``endpoint`` and ``peer`` (the link's peer portal) settings, its
    ``events`` and ``relay``; its bridge, portal view and counters are the
    core's. Every event goes to ``events``; its log line goes through
    ``event_log`` (the router's limit, shared by its units)."""

    def __init__(self, name: str, endpoint: EndpointConfig, peer: PeerConfig, link_id: str,
                 event_log: LimitedLog) -> None:
        self.name, self.endpoint, self.peer, self.link_id = name, endpoint, peer, link_id
        self.event_log = event_log
        self.events = EventRing(1000)
        self.core: RouterCore | None = None
        self.task: LinkTask | None = None
        self.relay: Relay | None = None
        self.proxy_scopes: dict[int, trio.CancelScope] = {}  # proxy listeners, by proxy id

    def event(self, kind: str, detail: str) -> None:
        now = trio.current_time()
        self.events.add(now, kind, detail)
        self.event_log.line(now, kind, "%s %s", kind, detail)

    @property
    def counters(self) -> Counter[str]:
        """What the unit counted: its bridge, its relay and (the link's first
        endpoint) its link (the core's counters of the unit)."""
        return self.core.counters(self.link_id, self.endpoint.name) if self.core is not None else Counter()

    @property
    def link(self):
        """The link's current connection (:class:`router.link.Link`), or None."""
        return self.task.link if self.task is not None else None

    @property
    def bridge(self):
        return self.core.bridge(self.link_id, self.endpoint.name) if self.core is not None else None

    @property
    def tr(self):
        """The unit's view of its endpoint's topic resolution."""
        return self.bridge.portal if self.core is not None else None

    def status(self) -> dict:
        link = self.link
        now = trio.current_time()
        bridge = self.bridge
        proxy_addr = bridge.proxy_addresses() if bridge else {}
        adverts = bridge.advert_sources() if bridge else {}
        tr = self.tr
        return {
            "name": self.name,
            "portal": {"name": self.endpoint.name, "domain_id": self.endpoint.domain_id,
                       "stats": tr.stats() if tr else {},
                       "local_interest": [li.topic for li in tr.local_interests()] if tr else [],
                       "remote_interest": [t for t, _ in tr.remote_interests()] if tr else []},
            "peer": self.task.status() if self.task is not None else {"name": self.peer.name, "state": "down"},
            "proxies": {str(a): f"{ip}:{port}" for a, (ip, port) in proxy_addr.items()},
            "adverts": {str(a): f"{getattr(b, 'ip', '?')}:{getattr(b, 'port', '?')}"
                        for a, b in adverts.items()},
            "streams": len(link.state) if link else 0,
            "counters": dict(self.counters),
            "events": self.events.dump(now),
        }


class MultiRouter:
    """``await MultiRouter(config).run(task_status=...)`` in a nursery; reports
    {"links": [{"tr", "peer", "metrics"} per peer link and per side of each
    endpoint pair], "metrics": (ip, port) or None, "tr" and "peer": the first
    link's}. ``handle_signals``:
    SIGUSR1 dump, SIGTERM/SIGINT stop (the command line turns it on)."""

    def __init__(self, config: RouterConfig, *, handle_signals: bool = False) -> None:
        if not config.endpoints:
            raise ValueError("a router needs an endpoint portal")
        self.config = config
        self.handle_signals = handle_signals
        self.pools = {e.name: PortPool() for e in config.endpoints}
        self.relay_settings = {e.name: RelaySettings.of(e) for e in config.endpoints}
        self.portals = {e.name: PortalTask(e) for e in config.endpoints}
        self.wake = Wake()
        self.core: RouterCore | None = None
        self.routing: Routing | None = None
        self.links: list[Unit] = []
        self._specs: list[tuple[LinkSpec, PeerConfig, PairLink | None]] = []
        self._tasks: dict[str, LinkTask] = {}
        self._units: dict[tuple[str, str], Unit] = {}  # (link id, endpoint name) -> its unit
        self._nursery: trio.Nursery | None = None
        self._advertising: set[tuple[str, str, int]] = set()  # (link, endpoint, proxy id): topics to go
        self.started: float | None = None  # when run() began (trio's clock, seconds)
        self.uim: UimRelay | None = None  # unicast immediate messages by domain (router.relays.uim)
        self.uim_events = EventRing(1000)
        self.event_log = LimitedLog(log, LogLimiter(LOG_LINES_PER_WINDOW, LOG_WINDOW))  # all units' events
        self.uim_listeners: dict[str, tuple[str, int]] = {}  # endpoint -> its request listener's address
        self._plan()

    def _plan(self) -> None:
        """The links and units: every ``<peer>`` serves every endpoint; every pair
        of endpoints gets a pair link (one side each, in memory)."""
        s = self.config
        names = tuple(e.name for e in s.endpoints)
        for p in s.peers:
            self._specs.append((LinkSpec(p.name, p.name, names, p.cost, p.acl, True), p, None))
            self.links += [Unit(s.name, e, p, p.name, self.event_log) for e in s.endpoints]
        for i, a in enumerate(s.endpoints):
            for b in s.endpoints[i + 1:]:
                name = f"{a.name}<->{b.name}"
                pa, pb = initiator_peer(name, "", 0), acceptor_peer(name)
                la, lb = pair_links(name, name, pa.max_queue, pb.max_queue)
                for e, other, peer, side in ((a, b, pa, la), (b, a, pb, lb)):
                    lid = f"{name}@{e.name}"
                    spec = LinkSpec(lid, name, (e.name,), peer.cost, peer.acl, False, pair=f"{name}@{other.name}")
                    self._specs.append((spec, peer, side))
                    self.links.append(Unit(f"{s.name}/{e.name}", e, peer, lid, self.event_log))

    def _build_core(self, now: float) -> RouterCore:
        s = self.config
        ri = s.route_info
        self.routing = Routing(s.name, {e.domain_id: e.cost for e in s.endpoints}, now=now,
                               seq_base=time.time_ns() // 1_000_000,
                               propagation_interval=ri.propagation_interval_ms / 1000.0,
                               timeout=ri.timeout_ms / 1000.0, max_hop_count=ri.max_hop_count)
        rules = {e.name: EndpointRules(e.domain_id, e.acl, e.source_deletion_delay, proxy_bound(e.max_proxies))
                 for e in s.endpoints}
        portals = {e.name: new_portal(e, self.portals[e.name].src_id, now) for e in s.endpoints}
        return RouterCore(s.name, portals, rules, [spec for spec, _, _ in self._specs], self.routing, now=now)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        s = self.config
        self.started = trio.current_time()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for pool in self.pools.values():
                pool.upstreams.nursery = pool.ru_upstreams.nursery = nursery  # sessions outlive the link that opened them
            for portal in self.portals.values():
                await portal.open()
            core = self.core = self._build_core(trio.current_time())
            domains = tuple(e.domain_id for e in s.endpoints)
            for unit in self.links:
                unit.core = core
            self.uim = self._build_uim(nursery)
            self._units = {(u.link_id, u.endpoint.name): u for u in self.links}
            for spec, peer, pair in self._specs:
                units = {u.endpoint.name: u for u in self.links if u.link_id == spec.id}
                first = units[spec.endpoints[0]]
                caps = P.DEFAULT_CAPABILITIES | (PEER_CAPABILITIES | P.Capability.ROUTING if spec.routed else 0)
                identity = P.RouterIdentity(s.name if spec.routed else first.name,
                                            domains if spec.routed else (first.endpoint.domain_id,),
                                            capabilities=int(caps))
                relays = {}
                task = LinkTask(spec, peer, identity, core, self.wake, relays, first.counters, first.event,
                                pair=pair, uim=self.uim if spec.routed else None)
                for name, u in units.items():
                    u.task = task
                    u.relay = relays[name] = self._relay(u, task)
                self._tasks[spec.id] = task
            for portal in self.portals.values():
                await nursery.start(portal.run, core, self.wake)
            for e in s.endpoints:
                if e.request_address is not None:
                    self.uim_listeners[e.name] = await nursery.start(self.uim.serve_listener, e.name,
                                                                     e.request_address)
            nursery.start_soon(self._core_loop)
            nursery.start_soon(self.event_log.serve)
            reports = []
            for spec, _, _ in self._specs:
                peer_addr = await nursery.start(self._tasks[spec.id].run)
                tr = self.portals[spec.endpoints[0]].sock.getsockname()
                reports.append({"tr": tr, "peer": peer_addr, "metrics": None})
            metrics_addr = None
            if s.metrics is not None:
                routes = {"/metrics": ("text/plain; version=0.0.4", lambda query: self.prometheus_text()),
                          "/status": ("application/json", lambda query: json.dumps(self.status())),
                          **page_routes("router", {"router": lambda query: router_page(self, query),
                                                   "sessions": partial(self._sessions_page, trio.Lock())})}
                metrics_addr = await nursery.start(partial(serve_http, logger=log, access=monitor_access(s.monitor)),
                                                   routes, s.metrics)
            if self.handle_signals:
                await nursery.start(partial(serve_signals, self.status, self._stop))
            first = reports[0] if reports else {"tr": self.portals[s.endpoints[0].name].sock.getsockname(),
                                                "peer": None}
            task_status.started({"tr": first["tr"], "peer": first["peer"], "links": reports,
                                 "metrics": metrics_addr})

    def _build_uim(self, nursery: trio.Nursery) -> UimRelay:
        """The UIM data path: delivery in each endpoint's TRD from its request
        address, forwarding on the peer links (their tasks are added as made)."""
        served = {e.name: (e.domain_id, self.relay_settings[e.name].request_ip) for e in self.config.endpoints}
        own = frozenset(e.request_address for e in self.config.endpoints if e.request_address is not None)
        path = UimPath(served, self.routing, max_hop_count=self.config.route_info.max_hop_count, own=own,
                       proxies=self.core)
        uim = UimRelay(path, {name: ip for name, (_, ip) in served.items()}, self._tasks, self.routing,
                       self._uim_event)
        uim.nursery = nursery
        return uim

    def _uim_event(self, kind: str, detail: str) -> None:
        now = trio.current_time()
        self.uim_events.add(now, kind, detail)
        self.event_log.line(now, kind, "%s %s", kind, detail)


    def _relay(self, unit: Unit, task: LinkTask) -> Relay:
        e = unit.endpoint
        return Relay(self.relay_settings[e.name], unit.counters, unit.event, RelaySite(self.core, self.wake, task, e.name),
                     self.pools[e.name])

    # --------------------------------------------------------------- the core's task

    async def _core_loop(self) -> None:
        """The core's timers at its deadline, and its outputs after any input;
        the topics of new proxies' sessions advertised a chunk a turn."""
        core = self.core
        while True:
            now = trio.current_time()
            if now >= core.next_deadline():  # timers due: what the TR sockets hold counts first
                for portal in self.portals.values():
                    for _ in range(READ_BEFORE_TIMERS):
                        if portal.receive_ready(core) < IO_BATCH:
                            break
            core.tick(now)
            for key in list(self._advertising):
                if not core.advertise_pending(*key, now, ADVERTISE_CHUNK):
                    self._advertising.discard(key)
            self._carry_out(core.outputs())
            await self.wake.wait_until(now if self._advertising else core.next_deadline())

    def _carry_out(self, outputs) -> None:
        units = self._units
        for out in outputs:
            if isinstance(out, SendTR):
                self.portals[out.endpoint].send(out.data, out.dest)
            elif isinstance(out, SendFrame):
                link = self._tasks[out.link].link
                if link is not None and link.connected:
                    link.put(out.frame)
            elif isinstance(out, StartProxy):
                unit = units[(out.link, out.endpoint)]
                scope = trio.CancelScope()
                unit.proxy_scopes[out.advert.advert_id] = scope
                self._nursery.start_soon(self._proxy, unit, out.advert, scope)
            elif isinstance(out, StopProxy):
                scope = units[(out.link, out.endpoint)].proxy_scopes.pop(out.proxy_id, None)
                if scope is not None:
                    scope.cancel()
            elif isinstance(out, Notice):
                units[(out.link, out.endpoint)].event(out.kind, out.detail)

    async def _proxy(self, unit: Unit, f: P.Advertisement, scope: trio.CancelScope) -> None:
        """A proxy for the transport session of the peer's advertisement ``f``
        (proxy id: ``f``'s advert id): its listener (:meth:`Relay.serve_proxy`,
        in this task) reports its address (:class:`_ProxyListening`), where the
        core then advertises every topic of the session in the unit's TRD. A
        stream of a receiver names a live advertisement of the session
        (:meth:`RouterCore.proxy_advert`, through the relay's site)."""
        listening = _ProxyListening(self.core, unit, f, self.wake, self._advertising)
        with scope:
            await unit.relay.serve_proxy(f, task_status=listening)

    # --------------------------------------------------------------- status

    async def _stop(self) -> None:
        """Graceful end of every link (bounded in time), then of the router."""
        with trio.move_on_after(3.0):
            async with trio.open_nursery() as n:
                for task in self._tasks.values():
                    n.start_soon(task.disconnect, "shutting down")
        self._nursery.cancel_scope.cancel()

    async def _sessions_page(self, scans: trio.Lock, query: dict[str, str]) -> dict:
        """The page's ``/api/sessions`` (``scans``: one filter or sort at a time)."""
        return await sessions_page(self, query, scans)

    def portal_summary(self) -> list[dict]:
        """Per endpoint portal: its links and its interest, proxy and advert counts
        and drops, summed over its links."""
        out = []
        for e in self.config.endpoints:
            units = [r for r in self.links if r.endpoint is e]
            local: set[str] = set()
            remote: set[str] = set()
            counters: Counter[str] = Counter(self.portals[e.name].counters)
            counters.update(self.pools[e.name].requesters.counters)  # requesters seen (router.relays.responses)
            tr_stats = self.core.portal(e.name).stats() if self.core is not None else {}
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
        total: Counter[str] = Counter(self.core.acl_rejected_in_transit if self.core is not None else ())
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
        status (:meth:`Unit.status`). ``peer``/``portal``/``proxies``/``streams``
        at the top are the first link's, as a single-link router reports them."""
        first = self.links[0].status() if self.links else {}
        routing = self.routing.status() if self.routing is not None else {}
        if self.core is not None:
            routing["transit"] = self.core.transit.status()
        routing["counters"] = dict(self.core.routing_counters) if self.core is not None else {}
        return {**first, "name": self.config.name, "portals": self.portal_summary(), "acl": self.acl_status(),
                "topology": routing, "links": [r.status() for r in self.links], "uim": self.uim_status()}

    def uim_status(self) -> dict:
        """The UIM data path: its listeners, counters, targets and events."""
        u = self.uim
        if u is None:
            return {}
        return {"listeners": {name: f"{ip}:{port}" for name, (ip, port) in self.uim_listeners.items()},
                "connections": u.connections, "targets": u.target_count, "queued_bytes": u.queued,
                "counters": dict(u.counters), "events": self.uim_events.dump(trio.current_time())}

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
        p.metric("lbmr_router_log_lines_suppressed_total", "counter", self.event_log.limit.suppressed_total,
                 "Event log lines left out by the per-kind limit (see the summary lines).")
        p.family("lbmr_router_portal_drops_total", "counter", "Drops and refusals, by portal and kind.")
        for s in summary:
            for k, v in sorted(s["drops"].items()):
                p.sample("lbmr_router_portal_drops_total", v, {"portal": s["name"], "kind": k})
        p.by_label("lbmr_router_portal_acl_rejected_total", "counter", "portal",
                   {name: v["rejected"] for name, v in self.acl_status().items()},
                   "Interest, sources and advertisements refused by each portal's ACL.")
        if self.uim is not None:
            p.by_label("lbmr_router_uim_total", "counter", "what", self.uim.counters,
                       "Unicast immediate messages by domain: taken, passed on, dropped, by kind.")
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
            t = self.core.transit.status()
            p.metric("lbmr_router_transit_interest", "gauge", t["interest_held"],
                     "Interest from peer links passed on (topics and patterns, by origin domain).")
            p.metric("lbmr_router_transit_adverts", "gauge", t["adverts"],
                     "Our proxies advertised on other peer links.")
            p.by_label("lbmr_router_routing_total", "counter", "what", self.core.routing_counters,
                       "Route info and transit, by kind.")
        return p.text()


class _ProxyListening:
    """Where a proxy's listener reports its bound address, through trio's
    task-status protocol (``started(address)``, as :meth:`trio.Nursery.start`
    takes it) but in the proxy's own task: no nursery and no task more per
    proxy (through ``start``, a thousand proxies took three turns of the loop
    that each ran all of them). The core advertises ``ADVERTISE_CHUNK`` topics of
    the session at once; the core's task the rest, a chunk a turn
    (``advertising``)."""

    def __init__(self, core: RouterCore, unit: Unit, f: P.Advertisement, wake: Wake,
                 advertising: set[tuple[str, str, int]]) -> None:
        self.core, self.unit, self.advert, self.wake, self.advertising = core, unit, f, wake, advertising

    def started(self, address: tuple[str, int] | None = None) -> None:
        """The listener is bound at ``address`` (None: no relay port was free)."""
        if address is None:
            return
        u, f = self.unit, self.advert
        lid, e, pid = u.link_id, u.endpoint.name, f.advert_id
        body = u.relay.proxy_transport(f, address)
        if self.core.proxy_listening(lid, e, pid, address, trio.current_time(), body, limit=ADVERTISE_CHUNK):
            u.event("proxy_added", f"{f.topic} advert {pid} at {address[0]}:{address[1]}")
            self.advertising.add((lid, e, pid))
        self.wake.set()


# counters that are something dropped or refused
_DROPS = frozenset({"peer_refused_duplicate", "bad_interest", "bad_advert", "adverts_unwanted", "adverts_own_domain", "proxies_full",
                    "unrelayable_transport", "relay_ports_exhausted", "streams_refused",
                    "ru_streams_full", "peer_refused_busy", "handshakes_dropped",
                    "tr_send_error", "ru_send_error", "peer_not_reading",
                    # requests and responses (router.relays.responses)
                    "requests_unmapped_full", "requests_unmapped_waiting", "requests_unmapped_failed",
                    "requests_unmapped_peer", "requests_unmapped_no_address", "responders_refused_busy",
                    "responders_refused_unknown", "responses_refused_unseen", "responses_refused_address",
                    "responses_requester_gone", "requesters_unrecorded_full", "requests_unmapped_no_port"})


def _state(r: Unit) -> str:
    link = r.link
    return link.state_name if link is not None else "down"
