"""The near side of a bridge, sans-IO: the peer's advertisements proxied in our
TRD (:class:`router.core.bridge.Bridge` runs one :class:`PeerProxies`).

The peer's advertisements are served by one proxy per transport session
(:mod:`router.core.sessions`: those with the same transport and ``session``
share it). An ADVERTISEMENT of a new session starts a proxy
(:class:`~router.core.bridge_outputs.StartProxy`); one of a session whose
listener is bound is advertised at once. Refused: an advertisement already
proxied (a re-send), one naming our own domain (``adverts_own_domain``: loop
prevention, one hop only), a transport the relay cannot carry, a topic no
receiver of our TRD wants (``adverts_unwanted``, with ``require_interest``: the
peer only advertises what we asked for), a new session when ``max_proxies``
listeners run or any advertisement when ``max_proxy_topics`` are served
(``proxies_full``): a peer's advertisements never bind more listeners than
that. Once its listener is bound the portal advertises every topic of the
session at the relay address (each with its own topic index); a withdrawal
removes that topic (:class:`~router.core.bridge_outputs.ProxyDown`), and the
last one of a session stops the proxy
(:class:`~router.core.bridge_outputs.StopProxy`); the portal sends the final
advertisements.

Calling contract: the bridge calls :meth:`PeerProxies.advertisement`,
:meth:`~PeerProxies.listening`, :meth:`~PeerProxies.advertise_pending` and
:meth:`~PeerProxies.drop_all`, then drains :meth:`~PeerProxies.outputs` (in
order) into its own; the portal's events they cause are the bridge's to drain.
"""

from __future__ import annotations

from collections import Counter

from .. import peerlink as P
from .acl import Session
from .bridge_acl import BridgeAcl
from .bridge_outputs import Addr, BridgeOutput, Notice, ProxyDown, ProxyUp, StartProxy, StopProxy
from .endpoint_portal import PortalView
from .sessions import ProxySession, ProxySessions
from .tr import PortalTR, ProxySource, relay_transport

__all__ = ["PeerProxies", "RELAYED_TRANSPORTS", "MAX_PROXY_TOPICS"]

RELAYED_TRANSPORTS = (P.StreamKind.TCP, P.StreamKind.LBTRU, P.StreamKind.LBTRM)  # TIR transport codes relayed
# the peer's advertisements proxied at once (all sessions): each is a proxy TIR our
# TRD hears, and a few hundred bytes here
MAX_PROXY_TOPICS = 100_000


class PeerProxies:
    """The proxies a bridge runs for the peer's advertisements, grouped by transport
    session (one listener each), and those advertised in our TRD with their listener's
    address. ``portal``: the bridge's portal (the proxies are advertised in it);
    ``counters``: the router's; ``acl``: the bridge's ACLs; ``domain_id``: our TRD's.
    ``route_costs``: the cost of the route from our TRD to each domain (None: one hop;
    set by the bridge's :meth:`router.core.bridge.Bridge.set_routes`)."""

    def __init__(self, portal: PortalTR | PortalView, counters: Counter[str], acl: BridgeAcl, *,
                 max_proxies: int, max_proxy_topics: int, require_interest: bool) -> None:
        self.portal = portal
        self.counters = counters
        self.acl = acl
        self.domain_id = portal.domain_id
        self.max_proxies = max_proxies  # listeners (the peer's transport sessions)
        self.max_proxy_topics = max_proxy_topics  # advertisements served by them
        self.require_interest = require_interest
        self.route_costs: dict[int, int] | None = None
        self._out: list[BridgeOutput] = []
        self._sessions = ProxySessions()
        self._proxy_addr: dict[int, Addr] = {}
        # proxied for other links only: our TRD's outbound ACL rejects their topics
        self._transit_only: set[int] = set()

    def outputs(self) -> list[BridgeOutput]:
        """Everything produced since the last call, in order; empties the list."""
        out, self._out = self._out, []
        return out

    # ------------------------------------------------------------------ inputs

    def advertisement(self, f: P.Advertisement, now: float, transit: bool) -> None:
        """An ADVERTISEMENT frame from the peer (a withdrawal too); ``transit``:
        another link wants the topic through us (proxied even if our TRD does not)."""
        if f.withdraw:
            self.counters["withdrawals_received"] += 1
            self._drop(f.advert_id, now)
            return
        if f.advert_id in self._sessions:
            return  # already proxied (a re-send)
        if f.origin_domain == self.domain_id:
            self.counters["adverts_own_domain"] += 1
            return
        if f.transport not in RELAYED_TRANSPORTS:
            self.counters["unrelayable_transport"] += 1
            return
        acl = self.acl
        if not acl.allows(f.topic, "advertisement", True,
                          (acl.link_acl, acl.link_acl.allows_source_in(f.topic, Session(f.transport))),
                          notices=self._out):
            return
        # our TRD's outbound list keeps the topic out of our TRD only: another link may
        # still want it through us (a proxy then runs for it, unadvertised here)
        local = acl.allows(f.topic, "advertisement", True, (acl.acl, acl.acl.allows_source_out(f.topic)),
                           notices=self._out)
        if not local and not transit:
            return
        if self.require_interest and not (local and self.portal.wants_proxy(f.topic)) and not transit:
            self.counters["adverts_unwanted"] += 1
            return
        ps = self._sessions.find(f)
        if ps is None and len(self._sessions) >= self.max_proxies \
                or self._sessions.adverts() >= self.max_proxy_topics:
            if not self.counters["proxies_full"]:
                self._out.append(Notice("proxies_full", f"{len(self._sessions)} proxies for "
                                        f"{self._sessions.adverts()} topics run: {f.topic} advert "
                                        f"{f.advert_id} not proxied"))
            self.counters["proxies_full"] += 1
            return
        got = self._sessions.add(f)
        if got is None:
            self.counters["bad_advert"] += 1
            return
        ps, new = got
        if not local:
            self._transit_only.add(f.advert_id)
        if new:
            self._out.append(StartProxy(f))
        elif ps.address is not None:  # its session's listener is bound: advertise it
            if ps.pending:
                ps.pending[f.advert_id] = f  # after those still waiting
            else:
                self._advertise(ps, f, now)

    def listening(self, proxy_id: int, address: Addr, transport_body=None) -> bool:
        """The listener of proxy ``proxy_id`` is bound at ``address``: every topic of its
        session waits to be advertised there (:meth:`advertise_pending`;
        ``transport_body``: what they advertise when the address alone does not say it,
        LBT-RM's group). False if the proxy was stopped meanwhile (nothing done)."""
        ps = self._sessions.proxy(proxy_id)
        if ps is None:
            return False
        ps.address = address
        ps.body = transport_body or relay_transport(ps.transport, address[0], address[1])
        ps.pending = dict(ps.adverts)
        return True

    def advertise_pending(self, proxy_id: int, now: float, limit: int | None = None) -> int | None:
        """Advertise at most ``limit`` (None: all) more topics of proxy ``proxy_id``'s
        session at its bound listener; how many still wait (None: no such proxy, or its
        listener is not bound: nothing done)."""
        ps = self._sessions.proxy(proxy_id)
        if ps is None or ps.address is None:
            return None
        n = len(ps.pending) if limit is None else min(limit, len(ps.pending))
        for _ in range(n):
            f = ps.pending.pop(next(iter(ps.pending)))  # oldest first
            self._advertise(ps, f, now)
        return len(ps.pending)

    def drop_all(self, now: float) -> None:
        """The peer link is gone: stop every proxy."""
        for ps in self._sessions.sessions():
            for aid in list(ps.adverts):
                self._drop(aid, now)

    # ------------------------------------------------------------------ views

    def advert_of(self, proxy_id: int) -> int | None:
        """The advert id a new stream of proxy ``proxy_id`` names on the link (a live
        advertisement of its session), or None if it serves none any more."""
        return self._sessions.advert_of(proxy_id)

    def proxied(self, advert_id: int) -> P.Advertisement | None:
        """The peer's advertisement ``advert_id``, if a proxy here serves it."""
        return self._sessions.advert(advert_id)

    def proxies(self) -> dict[int, P.Advertisement]:
        """The peer's advertisements proxied here, by advert id."""
        return {aid: f for ps in self._sessions.sessions() for aid, f in ps.adverts.items()}

    def listeners(self) -> int:
        """Proxy listeners running or starting (one per transport session of the peer)."""
        return len(self._sessions)

    def addresses(self) -> dict[int, Addr]:
        """The proxies whose listener is bound, by advert id: their relay address."""
        return dict(self._proxy_addr)

    # ------------------------------------------------------------------ internals

    def _advertise(self, ps: ProxySession, f: P.Advertisement, now: float) -> None:
        """Advertise the peer's ``f`` in our TRD at its proxy's relay address, with
        the DRO's hop count and cost (each proxy adds a hop; the cost is the
        route's, or the hop count where no route is known)."""
        self._proxy_addr[f.advert_id] = ps.address
        hops = f.hop_count + 1
        cost = self.route_costs.get(f.origin_domain) if self.route_costs is not None else None
        if f.advert_id not in self._transit_only:
            self.portal.add_proxy(ProxySource(f.advert_id, f.topic, ps.body, f.origin_domain, f.otid,
                                              hop_count=hops, cost=hops if cost is None else cost,
                                              tir_options=f.tir_options), now)
        self._out.append(ProxyUp(f, ps.body))

    def _drop(self, aid: int, now: float) -> None:
        got = self._sessions.remove(aid)
        if got is None:
            return
        ps, _, last = got
        self._transit_only.discard(aid)
        if self._proxy_addr.pop(aid, None) is not None:
            self._out.append(ProxyDown(aid))
        if last:
            self._out.append(StopProxy(ps.proxy_id))
        self.portal.remove_proxy(aid, now)
