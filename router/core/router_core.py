"""The router's control plane, sans-IO: one :class:`RouterCore` per router.

It holds every endpoint portal's topic resolution (one
:class:`router.core.endpoint_portal.EndpointPortal` each: one UM context per
TRD), one :class:`router.core.bridge.Bridge` per endpoint and link it serves,
and, when the router has peer links, the route info protocol
(:class:`router.core.routing.Routing`) and the transit of interest and sources
between peer links (:class:`router.core.transit.Transit`). It owns no socket,
no task and no clock: every input takes ``now`` (seconds on one monotonic
clock).

Links (:class:`LinkSpec`): each ``<peer>`` is a link serving every endpoint of
the router (one connection, one link name), routed when both ends speak
ROUTING; each pair of endpoints of the router is joined inside the core: two
links, one per side (``A<->B@A`` serving A and ``A<->B@B`` serving B), never
routed, up from the start, whose frames go from one side's bridge to the
other's in the core itself (the shell never sees them). The sessions relayed
between the two endpoints cross in the shell's memory
(:class:`router.shell.pair_link.PairLink`).

Calling contract (calls are made serially, each returns at once):

* from a TRD: :meth:`tr_datagram`;
* from a link: :meth:`link_up` (the handshake completed), :meth:`link_frame`
  (INTEREST, ADVERTISEMENT, TOPOLOGY), :meth:`link_heard` (any frame arrived),
  :meth:`link_down`; :meth:`accept_peer` answers a handshake's policy check;
* from the data relay: :meth:`proxy_listening` and :meth:`advertise_pending`
  (a proxy's listener is bound), :meth:`session_ended` (a source ended or
  refused a relayed session);
* timers: :meth:`tick` at :meth:`next_deadline`;
* then :meth:`outputs`, in order: :class:`SendTR` (a TR datagram for an
  endpoint's socket), :class:`SendFrame` (a frame for a link), :class:`StartProxy`
  / :class:`StopProxy` (a proxy listener for a link's advertisement in an
  endpoint), :class:`Notice` (an event for the log of an endpoint's link).

Answers for the data relay and the status pages: :meth:`advert_source`,
:meth:`proxy_advert`, :meth:`bridge`, :meth:`portal`, :meth:`counters`.

Rules kept from the router's units: the TRD's interest goes on a routed link
only where the routes say (the peer is a child of our domain in our tree);
the peer's advertisements are proxied in every endpoint that wants them, and
the first endpoint's bridge of a routed link stands for the link in transit
(it proxies a source another link wants, and its proxies are passed on);
refusals by a peer portal's ACL of the peer's own frames are counted once,
by that first endpoint's bridge; a relayed session's end is checked once per
transport session: after ``source_deletion_delay`` without a TIR its sources
are withdrawn.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from .. import peerlink as P
from .bridge import Bridge
from .bridge_outputs import Notice as BridgeNotice
from .bridge_outputs import ProxyDown, ProxyUp
from .bridge_outputs import SendFrame as BridgeSendFrame
from .bridge_outputs import StartProxy as BridgeStartProxy
from .bridge_outputs import StopProxy as BridgeStopProxy
from .endpoint_portal import EndpointPortal
from .recovery import SourceRequestPort, proxy_transport_index
from .routing import Routing
from .tr import PortalTR
from .transit import Transit

__all__ = ["RouterCore", "LinkSpec", "SendTR", "SendFrame", "StartProxy", "StopProxy", "Notice"]

Addr = tuple[str, int]


# --------------------------------------------------------------------------- outputs


@dataclass(frozen=True, slots=True)
class SendTR:
    """Send ``data`` from endpoint ``endpoint``'s TR socket to ``dest``."""

    endpoint: str
    data: bytes
    dest: Addr


@dataclass(frozen=True, slots=True)
class SendFrame:
    """Send ``frame`` on link ``link`` (produced only while it is up)."""

    link: str
    frame: P.Frame


@dataclass(frozen=True, slots=True)
class StartProxy:
    """Bind a proxy listener in endpoint ``endpoint`` for link ``link``'s
    ``advert``, then report it with :meth:`RouterCore.proxy_listening`."""

    link: str
    endpoint: str
    advert: P.Advertisement


@dataclass(frozen=True, slots=True)
class StopProxy:
    """Close proxy ``proxy_id`` of link ``link`` in endpoint ``endpoint`` and its streams."""

    link: str
    endpoint: str
    proxy_id: int


@dataclass(frozen=True, slots=True)
class Notice:
    """An event (``kind``, ``detail``) for the log of ``endpoint``'s link ``link``."""

    link: str
    endpoint: str
    kind: str
    detail: str


Output = SendTR | SendFrame | StartProxy | StopProxy | Notice


# --------------------------------------------------------------------------- links


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A link of the router: ``id`` (unique in the router), ``name`` (the peer
    portal's name, or ``A<->B`` for a pair of endpoints), the ``endpoints`` it
    serves (names, the first stands for the link in transit), its peer
    portal's ``cost`` and ``acl`` (:class:`router.core.acl.PortalAcl`),
    ``routed``: a ``<peer>`` link (route info and transit), not a pair's; and
    ``pair``: for a side of an endpoint pair, the other side's link id."""

    id: str
    name: str
    endpoints: tuple[str, ...]
    cost: int
    acl: object
    routed: bool
    pair: str | None = None


class _SessionCheck(NamedTuple):
    """A relayed session's end being checked (a heap entry): at ``due``
    (seconds), its sources not heard since ``since`` (the end of session) are
    asked again (``ask_again``: half the endpoint's source deletion delay
    after the first query) or, at the last check, withdrawn."""

    due: float
    seq: int
    link: str
    endpoint: str
    name: tuple[int, int]
    since: float
    ask_again: bool


@dataclass(slots=True)
class _LinkState:
    spec: LinkSpec
    up: bool = False
    peer: P.PeerInfo | None = None
    bridges: dict[str, Bridge] = field(default_factory=dict)  # endpoint name -> its bridge


# --------------------------------------------------------------------------- the core


class RouterCore:
    """One router's control plane (module doc). ``name``: the router's;
    ``portals``: endpoint name -> its :class:`router.core.tr.PortalTR` (made by
    the caller, with the endpoint's settings and source id); ``domains``:
    endpoint name -> (domain id, portal cost, ACL, source deletion delay in
    seconds, max proxies); ``links``: the :class:`LinkSpec` s; ``routing``:
    the router's :class:`Routing` (run only when it has peer links); ``now``:
    when the pairs of endpoints are joined."""

    def __init__(self, name: str, portals: dict[str, PortalTR], endpoints: dict[str, EndpointRules],
                 links: list[LinkSpec], routing: Routing, *, now: float) -> None:
        self.name = name
        self.rules = endpoints
        self.portals = {e: EndpointPortal(tr) for e, tr in portals.items()}
        self.routing = routing
        self._advert_ids = itertools.count(1)  # one numbering for the router: unique on every link
        self.routing_counters: Counter[str] = Counter()  # route info and transit
        self.transit = Transit(routing, self._advert_ids, self.routing_counters)
        self._routed = any(spec.routed for spec in links)
        self.acl_rejected_in_transit: Counter[str] = Counter()
        self._links: dict[str, _LinkState] = {}
        self._counters: dict[tuple[str, str], Counter[str]] = {}
        self._out: list[Output] = []
        self._routes_seen = -1
        self._checks: list[_SessionCheck] = []  # a heap
        self._seq = itertools.count()
        for spec in links:
            st = _LinkState(spec)
            self._links[spec.id] = st
            for i, e in enumerate(spec.endpoints):
                r = endpoints[e]
                counters: Counter[str] = Counter()
                self._counters[(spec.id, e)] = counters
                st.bridges[e] = Bridge(
                    self.portals[e].view(spec.name), counters, max_proxies=r.max_proxies,
                    require_interest=True, advert_ids=self._advert_ids, acl=r.acl.named(e),
                    link_acl=spec.acl.named(spec.name), count_link_acl=(i == 0))
        self._pair_frames: list[tuple[str, P.Frame]] = []  # frames between the sides of a pair
        for st in self._links.values():
            if st.spec.pair is not None:
                other = self._links[st.spec.pair].spec
                st.up = True
                st.peer = P.PeerInfo(f"{name}/{other.endpoints[0]}", (endpoints[other.endpoints[0]].domain_id,),
                                     0, 0, (0, 0))
                for b in st.bridges.values():
                    b.link_up(now)
        self._settle(now)
        self._announce_domains(now)

    # ------------------------------------------------------------------ outputs and views

    def outputs(self) -> list[Output]:
        """Everything produced since the last call, in order; empties the list."""
        out, self._out = self._out, []
        return out

    def links(self) -> list[LinkSpec]:
        return [st.spec for st in self._links.values()]

    def bridge(self, link: str, endpoint: str) -> Bridge:
        return self._links[link].bridges[endpoint]

    def portal(self, endpoint: str) -> EndpointPortal:
        return self.portals[endpoint]

    def counters(self, link: str, endpoint: str) -> Counter[str]:
        """What ``endpoint``'s bridge on ``link`` counted (the shell counts its
        link's events in the link's first endpoint's)."""
        return self._counters[(link, endpoint)]

    def advert_source(self, link: str, endpoint: str, advert_id: int):
        """Where a stream the peer opens on ``link`` for our advert ``advert_id``
        connects: a source of ``endpoint``'s TRD, or (transit, the link's first
        endpoint) one of our proxies; None if neither."""
        st = self._links[link]
        body = st.bridges[endpoint].advert_source(advert_id)
        if body is None and st.spec.routed and endpoint == st.spec.endpoints[0]:
            body = self.transit.advert_source(st.spec.name, advert_id)
        return body

    def advert_endpoint(self, link: str, advert_id: int) -> str:
        """The endpoint whose relay serves a stream the peer opens on ``link`` for
        our ``advert_id``: the one that advertised it, else the link's first."""
        st = self._links[link]
        for e, b in st.bridges.items():
            if b.advert_source(advert_id) is not None:
                return e
        return st.spec.endpoints[0]

    def advert_request_port(self, link: str, endpoint: str, advert_id: int) -> SourceRequestPort | None:
        """Where the source behind our advertisement ``advert_id`` on ``link`` takes
        late-join and OTR requests (:mod:`router.core.recovery`): a source of
        ``endpoint``'s TRD, as its TIR's options say; or (transit) our proxy of the
        advertisement passed on, at ``endpoint``'s request listener under that proxy's
        transport index (the request takes the next hop there); None if neither."""
        st = self._links[link]
        got = st.bridges[endpoint].advert_request_port(advert_id)
        if got is None and st.spec.routed and endpoint == st.spec.endpoints[0]:
            up = self.transit.advert_upstream(st.spec.name, advert_id)
            listener = self.portals[endpoint].tr.settings.request_address
            if up is None or listener is None:
                return None
            for up_st in self._links.values():
                if up_st.spec.name == up[0] and endpoint in up_st.bridges:
                    pid = up_st.bridges[endpoint].portal.proxy_id(up[1])
                    if pid is not None:  # (a proxy only passed on, not advertised here: none)
                        got = SourceRequestPort(listener[0], listener[1], proxy_transport_index(pid))
        return got

    def proxied(self, endpoint: str, proxy_id: int) -> tuple[str, P.Advertisement] | None:
        """The peer's advertisement ``endpoint``'s proxy ``proxy_id`` serves, and the
        link it came on: (link id, the ADVERTISEMENT), or None (a request's transport
        index names the proxy: :func:`router.core.recovery.proxy_transport_index`)."""
        for lid, st in self._links.items():
            bridge = st.bridges.get(endpoint)
            aid = bridge.portal.advert_of(proxy_id) if bridge is not None else None
            f = bridge.proxied(aid) if aid is not None else None
            if f is not None:
                return lid, f
        return None

    def proxy_advert(self, link: str, endpoint: str, proxy_id: int) -> int | None:
        """The advert id a new stream of proxy ``proxy_id`` names on the link."""
        return self._links[link].bridges[endpoint].proxy_advert(proxy_id)

    def is_up(self, link: str) -> bool:
        return self._links[link].up

    # ------------------------------------------------------------------ the TRDs

    def tr_datagram(self, endpoint: str, data: bytes, src: Addr, now: float) -> None:
        """A datagram on ``endpoint``'s TR socket."""
        self.portals[endpoint].on_datagram(data, src, now)
        self._drain_endpoint(endpoint)
        self._settle(now)

    def tick(self, now: float) -> None:
        """Run what is due at ``now``: the portals' timers (their datagrams as
        :class:`SendTR`), route info, session-end checks."""
        if self._routed:
            self._send(self.routing.tick(now))
            self._routes_changed(now)
        while self._checks and self._checks[0].due <= now:
            check = heapq.heappop(self._checks)
            st = self._links.get(check.link)
            if st is None:
                continue
            bridge = st.bridges[check.endpoint]
            if check.ask_again:
                asked = bridge.ask_again(check.name, check.since, now)
                if asked is not None:  # not all heard: the last check, half a delay after this query at least
                    due = max(check.due, asked) + self.rules[check.endpoint].source_deletion_delay / 2
                    heapq.heappush(self._checks, check._replace(due=due, seq=next(self._seq), ask_again=False))
                    self._counters[(check.link, check.endpoint)]["session_end_queries_again"] += 1
                self._drain_bridge(st, check.endpoint)
            elif bridge.source_ended(check.name, check.since, now):
                self._counters[(check.link, check.endpoint)]["sources_ended"] += 1
                self._drain_bridge(st, check.endpoint)
        for e, portal in self.portals.items():
            for data, dest in portal.tick(now):
                self._out.append(SendTR(e, data, dest))
            self._drain_endpoint(e)
        self._settle(now)

    def next_deadline(self) -> float:
        t = min(p.next_deadline() for p in self.portals.values()) if self.portals else float("inf")
        if self._routed:
            t = min(t, self.routing.next_deadline())
        if self._checks:
            t = min(t, self._checks[0].due)
        return t

    # ------------------------------------------------------------------ links

    def accept_peer(self, link: str, peer: P.PeerInfo) -> tuple[bool, str]:
        """One link per router and per TRD: a peer is refused (both ends check,
        at the handshake) when another connected link serving one of this
        link's endpoints reaches a router of the same name or one of its domains
        (its TRDs would be bridged twice)."""
        st = self._links[link]
        for other_id, other in self._links.items():
            if other_id == link or not other.up or other.peer is None:
                continue
            if not set(other.spec.endpoints) & set(st.spec.endpoints):
                continue
            shared = sorted(set(other.peer.domains) & set(peer.domains))
            if other.peer.name == peer.name or shared:
                why = f"domains {shared}" if shared else "that router"
                self._counters[(link, st.spec.endpoints[0])]["peer_refused_duplicate"] += 1
                return False, (f"router {self.name!r} already reaches {why} through link "
                               f"{other.spec.name!r} (router {other.peer.name!r})")
        return True, ""

    def link_up(self, link: str, peer: P.PeerInfo, capabilities: int, now: float) -> None:
        """``link``'s handshake completed with ``peer``: route info (if both
        speak ROUTING), then every endpoint's live interest."""
        st = self._links[link]
        if st.spec.pair is not None:
            return  # joined in the core from the start
        st.up, st.peer = True, peer
        if st.spec.routed:
            if capabilities & P.Capability.ROUTING:
                self._send(self.routing.link_up(st.spec.name, peer.name, st.spec.cost, now))
                self._routes_changed(now)
            else:
                self.routing_counters["peers_without_routing"] += 1
        for e, b in st.bridges.items():
            b.link_up(now)
            self._drain_bridge(st, e)
        self._settle(now)

    def link_heard(self, link: str, now: float) -> None:
        """Frames arrived on ``link`` (see :meth:`Routing.heard_from`)."""
        st = self._links[link]
        if st.spec.routed:
            self.routing.heard_from(st.spec.name, now)

    def link_frame(self, link: str, frame, now: float) -> None:
        """An INTEREST, ADVERTISEMENT or TOPOLOGY frame from ``link``'s peer."""
        st = self._links[link]
        routed = st.spec.routed
        if isinstance(frame, P.Interest | P.Advertisement):
            for i, (e, b) in enumerate(st.bridges.items()):
                wanted = (routed and i == 0 and isinstance(frame, P.Advertisement)
                          and self.transit.wants(st.spec.name, frame.topic, frame.origin_domain))
                b.peer_frame(frame, now, transit_wanted=wanted)
                self._drain_bridge(st, e)
            if routed and isinstance(frame, P.Interest) \
                    and st.spec.acl.allows_interest_in(frame.topic, int(frame.pattern_type)):
                self._send(self.transit.on_interest(st.spec.name, frame))
        elif isinstance(frame, P.Topology):
            if routed:
                self._send(self.routing.on_topology(st.spec.name, frame, now))
                self._routes_changed(now)
        else:
            raise TypeError(f"not a control frame: {frame!r}")
        self._settle(now)

    def link_down(self, link: str, now: float) -> None:
        """``link`` is gone: its bridges forget it, and the routes move."""
        st = self._links[link]
        if not st.up or st.spec.pair is not None:
            return
        st.up, st.peer = False, None
        for e, b in st.bridges.items():
            b.link_down(now)
            self._drain_bridge(st, e)
        if st.spec.routed:
            self._send(self.routing.link_down(st.spec.name, now))
            self._send(self.transit.link_down(st.spec.name))
            self._routes_changed(now)
        self._settle(now)

    # ------------------------------------------------------------------ the data relay

    def proxy_listening(self, link: str, endpoint: str, proxy_id: int, address: Addr, now: float,
                        transport_body=None, *, limit: int | None = None) -> bool:
        """See :meth:`Bridge.proxy_listening`."""
        st = self._links[link]
        ok = st.bridges[endpoint].proxy_listening(proxy_id, address, now, transport_body, limit=limit)
        self._drain_bridge(st, endpoint)
        self._settle(now)
        return ok

    def advertise_pending(self, link: str, endpoint: str, proxy_id: int, now: float, limit: int) -> int:
        """See :meth:`Bridge.advertise_pending`."""
        st = self._links[link]
        left = st.bridges[endpoint].advertise_pending(proxy_id, now, limit)
        self._drain_bridge(st, endpoint)
        self._settle(now)
        return left

    def session_ended(self, link: str, endpoint: str, advert_id: int, now: float) -> None:
        """A source of ours ended or refused a relayed session (UM's end of
        session): its transport session's topics are queried (at once, or in
        the portal's query rate when many sessions end together), and if no TIR
        of a source arrives from the end of session until the endpoint's source
        deletion delay after its query went, it is withdrawn (the DRO deletes a
        proxy source that long after the end of session; a source can only
        answer a query once it is sent). Once per transport session, however
        many streams end."""
        st = self._links[link]
        got = st.bridges[endpoint].session_ended(advert_id, now)
        if got is None:
            return
        name, asked = got
        self._counters[(link, endpoint)]["sessions_ended"] += 1
        half = self.rules[endpoint].source_deletion_delay / 2
        heapq.heappush(self._checks, _SessionCheck(asked + half, next(self._seq), link, endpoint, name, now,
                                                   ask_again=True))
        self._drain_bridge(st, endpoint)
        self._settle(now)

    # ------------------------------------------------------------------ internals

    def _drain_endpoint(self, endpoint: str) -> None:
        """Every bridge of ``endpoint`` acts on its portal's events."""
        for st in self._links.values():
            if endpoint in st.bridges:
                st.bridges[endpoint].drain_portal()
                self._drain_bridge(st, endpoint)

    def _drain_bridge(self, st: _LinkState, endpoint: str) -> None:
        """A bridge's outputs as the core's (and its proxies into transit).
        Another endpoint's bridges may have portal events after its calls too:
        those are drained with that endpoint (:meth:`_drain_endpoint`)."""
        spec = st.spec
        transit = self.transit if spec.routed and endpoint == spec.endpoints[0] else None
        for out in st.bridges[endpoint].outputs():
            if isinstance(out, BridgeSendFrame):
                if spec.pair is not None:
                    self._pair_frames.append((spec.pair, out.frame))
                else:
                    self._out.append(SendFrame(spec.id, out.frame))
            elif isinstance(out, BridgeStartProxy):
                self._out.append(StartProxy(spec.id, endpoint, out.advert))
            elif isinstance(out, BridgeStopProxy):
                self._out.append(StopProxy(spec.id, endpoint, out.proxy_id))
            elif isinstance(out, ProxyUp):
                if transit is not None:
                    self._send(transit.on_proxy(spec.name, out.advert, out.body))
            elif isinstance(out, ProxyDown):
                if transit is not None:
                    self._send(transit.on_proxy_gone(spec.name, out.advert_id))
            elif isinstance(out, BridgeNotice):
                self._out.append(Notice(spec.id, endpoint, out.kind, out.detail))

    def _announce_domains(self, now: float) -> None:
        """Every endpoint portal announces, in its remote domain route records,
        the domains the routes reach (its own left out)."""
        reachable = list(self.routing.map.routes())
        for portal in self.portals.values():
            portal.set_reachable_domains(reachable, now)

    def _settle(self, now: float) -> None:
        """Hand the frames one side of an endpoint pair produced to the other
        side's bridge, until none are left (an answer never asks again, so this
        ends: interest brings advertisements, advertisements bring nothing)."""
        while self._pair_frames:
            frames, self._pair_frames = self._pair_frames, []
            for link, frame in frames:
                st = self._links[link]
                for e, b in st.bridges.items():
                    b.peer_frame(frame, now)
                    self._drain_bridge(st, e)

    def _send(self, outputs) -> None:
        """Route info and transit frames for peer links (by link name), through
        each link's ACL."""
        for o in outputs:
            st = self._by_name(o.link)
            if st is None or not st.up or not self._acl_lets_out(st, o.frame):
                continue
            self._out.append(SendFrame(st.spec.id, o.frame))
            self.routing_counters[f"sent_{o.frame.TYPE.name.lower()}"] += 1

    def _by_name(self, name: str) -> _LinkState | None:
        for st in self._links.values():
            if st.spec.routed and st.spec.name == name:
                return st
        return None

    def _acl_lets_out(self, st: _LinkState, frame) -> bool:
        """May transit send ``frame`` on this peer link (its outbound list, and
        for interest its inbound list: where the data would come back)?"""
        acl = st.spec.acl
        if not acl.configured:
            return True
        if isinstance(frame, P.Interest) and frame.action != P.InterestAction.CANCEL:
            ok = acl.allows_interest_out(frame.topic, int(frame.pattern_type))
        elif isinstance(frame, P.Advertisement) and not frame.withdraw:
            ok = acl.allows_source_out(frame.topic)
        else:
            return True
        if not ok and not (isinstance(frame, P.Interest) and frame.action == P.InterestAction.REFRESH):
            self.acl_rejected_in_transit[st.spec.name] += 1
        return ok

    def _routes_changed(self, now: float) -> None:
        """If the map changed: pass on interest by the new trees, and let every
        bridge of a routed link send (or cancel) its TRD's interest where the
        routes now say."""
        if self.routing.version == self._routes_seen:
            return
        self._routes_seen = self.routing.version
        self.routing_counters["route_recalculations"] += 1
        self._send(self.transit.resync())
        costs = {d: r.cost for d, r in self.routing.map.routes().items()}
        self._announce_domains(now)
        for st in self._links.values():
            if not st.spec.routed:
                continue
            name = st.spec.name
            one_hop = self.routing.peer_of(name) is None
            for e, b in st.bridges.items():
                b.set_routes(one_hop or name in self.routing.children_links(self.rules[e].domain_id), costs)
                b.resync_interest(now)
                self._drain_bridge(st, e)


@dataclass(frozen=True, slots=True)
class EndpointRules:
    """What the core needs of an endpoint's settings: its ``domain_id``, its
    ``acl`` (:class:`router.core.acl.PortalAcl`), ``source_deletion_delay``
    (seconds) and ``max_proxies`` (proxy listeners per link)."""

    domain_id: int
    acl: object
    source_deletion_delay: float
    max_proxies: int
