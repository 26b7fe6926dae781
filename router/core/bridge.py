"""The router's bridge, sans-IO: one endpoint portal joined to one peer link.

A :class:`Bridge` owns the portal's topic resolution (:class:`router.core.tr.PortalTR`)
and the tables that tie it to the peer: the advertisement ids it gives the
sources of its TRD that the peer wants (far side), and the proxies it runs for
the sources the peer advertises (near side). It translates portal TR events
into peer-link frames and peer frames into portal calls. Like the portal it
owns no socket, no clock and no task; every input takes ``now``.

Inputs (method calls, made serially):

* from the TRD: :meth:`Bridge.on_datagram`, and :meth:`Bridge.tick` at
  :meth:`Bridge.next_deadline` (returns the TR datagrams to send);
* from the peer link: :meth:`Bridge.link_up` (the handshake completed),
  :meth:`Bridge.peer_frame` (an INTEREST or ADVERTISEMENT frame),
  :meth:`Bridge.link_down`;
* from the I/O shell: :meth:`Bridge.proxy_listening` (a proxy's listener is
  bound at its relay address), and :meth:`Bridge.drain_portal` when the
  portal is an endpoint's shared one (:class:`router.core.endpoint_portal.PortalView`)
  and something other than this bridge gave it work: the TRD's datagrams and
  timers are then the endpoint's (:class:`router.core.endpoint_portal.EndpointPortal`),
  not the bridge's.

Outputs accumulate in order and :meth:`Bridge.outputs` drains them:
:class:`SendFrame` (a frame for the peer; produced only while the link is up),
:class:`StartProxy` (bind a listener at the relay address for an advertised
source, then report it with ``proxy_listening``), :class:`StopProxy` (close
that listener and its streams) and :class:`Notice` (something for the event
log).

Rules (unchanged from the router's first version):

* **Interest.** Local interest (the portal's :class:`LocalInterest` /
  :class:`LocalInterestGone`) goes to the peer as INTEREST ADD / CANCEL; all
  live local interests are sent again when the link comes up, and refreshed
  (INTEREST REFRESH) at the portal's :class:`LocalInterestRefresh` pace. A
  REFRESH from the peer keeps its interest alive (re-adds it if the portal
  dropped it) and re-sends the adverts of its known sources; an interest the portal drops for want of refresh
  (:class:`RemoteInterestExpired`) withdraws what was advertised for it. INTEREST frames
  from the peer add or cancel remote interest in the portal (a topic the
  portal cannot query, or one beyond its ``max_remote_interests``, is counted
  as ``bad_interest`` and refused, with an ``interest_refused`` notice at the
  1st, 2nd, 4th, 8th ... refusal).
* **Far side: advertisements.** A source the peer wants (:class:`SourceSeen`)
  gets an advert id, stable for its (topic, OTID) while the link lasts, and an
  ADVERTISEMENT; :class:`SourceGone` sends the withdrawal, and so does an
  INTEREST CANCEL that leaves the source's topic wanted by no interest of the
  peer (``adverts_withdrawn_uninterested``). Only TCP, LBT-RU and
  LBT-RM sources are advertised (``unrelayable_transport`` otherwise).
* **Near side: proxies.** The peer's advertisements are served by one proxy
  per transport session (:mod:`router.core.sessions`: those with the same
  transport and ``session`` share it). An ADVERTISEMENT of a new session
  starts a proxy (:class:`StartProxy`); one of a session whose listener is
  bound is advertised at once. Refused: an advertisement already proxied (a
  re-send), one naming our own domain (``adverts_own_domain``: loop
  prevention, one hop only), a transport the relay cannot carry, a topic no
  receiver of our TRD wants (``adverts_unwanted``, with ``require_interest``:
  the peer only advertises what we asked for), a new session when
  ``max_proxies`` listeners run or any advertisement when
  ``max_proxy_topics`` are served (``proxies_full``): a peer's advertisements
  never bind more listeners than that. Once its listener is bound the portal
  advertises every topic of the session at the relay address (each with its
  own topic index); a withdrawal removes that topic (:class:`ProxyDown`), and
  the last one of a session stops the proxy (:class:`StopProxy`); the portal
  sends the final advertisements.
* **Link down.** Every proxy is stopped, the advert ids are forgotten, the
  remote interests are cancelled and the portal's proxies removed.
* **ACLs** (:mod:`router.core.acl`): ``acl`` is the endpoint portal's, ``link_acl``
  the peer portal's (OPEN for a link between two endpoints of one router:
  the far endpoint's bridge applies its own). Local interest goes to the
  link only if the endpoint's outbound and the link's inbound lists can
  accept the topic, the link's interest reaches the portal only if the
  link's outbound and the endpoint's inbound lists can; a source of the TRD
  is advertised only if the endpoint's inbound (topic and transport
  session) and the link's outbound lists accept it, an ADVERTISEMENT is
  proxied only if the link's inbound list does, and advertised in our TRD
  only if the endpoint's outbound list does too (a topic that list rejects
  may still be proxied for another link that wants it, unadvertised here).
  Each refusal counts ``acl_rejected`` (and :attr:`Bridge.acl_rejected` by
  portal), with an ``acl_rejected`` notice at the 1st, 2nd, 4th ... of a
  portal.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from .. import peerlink as P
from .acl import OPEN, PortalAcl, Session
from .endpoint_portal import PortalView
from .recovery import SourceRequestPort, request_port_of
from .sessions import ProxySession, ProxySessions, SourceAdverts
from .tr import (
    LocalInterest,
    LocalInterestGone,
    LocalInterestRefresh,
    Outgoing,
    PortalTR,
    ProxySource,
    RemoteInterestExpired,
    SourceGone,
    SourceSeen,
    relay_transport,
)

__all__ = ["Bridge", "SendFrame", "StartProxy", "StopProxy", "ProxyUp", "ProxyDown", "Notice",
           "RELAYED_TRANSPORTS", "MAX_PROXY_TOPICS"]

log = logging.getLogger("lbmr-router")

Addr = tuple[str, int]
RELAYED_TRANSPORTS = (P.StreamKind.TCP, P.StreamKind.LBTRU, P.StreamKind.LBTRM)  # TIR transport codes relayed
# the peer's advertisements proxied at once (all sessions): each is a proxy TIR our
# TRD hears, and a few hundred bytes here
MAX_PROXY_TOPICS = 100_000


# --------------------------------------------------------------------------- outputs


@dataclass(frozen=True, slots=True)
class SendFrame:
    """Send ``frame`` to the peer."""

    frame: P.Frame


@dataclass(frozen=True, slots=True)
class StartProxy:
    """Bind a listener at the relay address for ``advert`` (a source behind the
    peer), then call :meth:`Bridge.proxy_listening` with its address."""

    advert: P.Advertisement


@dataclass(frozen=True, slots=True)
class StopProxy:
    """Close the listener of proxy ``proxy_id`` (the advert id it was started for)
    and its streams: no advertisement of its session is served any more."""

    proxy_id: int


@dataclass(frozen=True, slots=True)
class ProxyUp:
    """The peer's ``advert`` is advertised in our TRD with transport ``body`` (a
    proxy's relay address): for multi-hop routing, which passes it on."""

    advert: P.Advertisement
    body: object


@dataclass(frozen=True, slots=True)
class ProxyDown:
    """The peer's advertisement ``advert_id`` is no longer advertised in our TRD."""

    advert_id: int


@dataclass(frozen=True, slots=True)
class Notice:
    """An event for the router's event log: ``kind`` (e.g. ``source_gone``), ``detail``."""

    kind: str
    detail: str


# --------------------------------------------------------------------------- the bridge


class Bridge:
    """One portal and one peer link (see the module doc). ``counters`` is where
    the bridge counts what it does (the router's counters)."""

    def __init__(self, portal: PortalTR | PortalView, counters: Counter[str] | None = None, *,
                 max_proxies: int = 4096, max_proxy_topics: int = MAX_PROXY_TOPICS,
                 require_interest: bool = False,
                 advert_ids: Iterator[int] | None = None, acl: PortalAcl = OPEN,
                 link_acl: PortalAcl = OPEN, count_link_acl: bool = True) -> None:
        self.portal = portal
        # ACLs: the endpoint's and the link's (count_link_acl False: the link's refusals of
        # the link's frames are counted by another bridge that gets the same frames)
        self.acl, self.link_acl, self.count_link_acl = acl, link_acl, count_link_acl
        self.acl_rejected: Counter[str] = Counter()  # refusals by portal name
        self.max_proxies = max_proxies  # listeners (the peer's transport sessions)
        self.max_proxy_topics = max_proxy_topics  # advertisements served by them
        self.require_interest = require_interest
        self.domain_id = portal.domain_id
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self.is_link_up = False
        self._out: list[SendFrame | StartProxy | StopProxy | ProxyUp | ProxyDown | Notice] = []
        # far side: advertisements we sent -> the real source
        # advert ids: shared by the bridges of one router that share a link (unique on it)
        self._advert_ids = advert_ids if advert_ids is not None else itertools.count(1)
        # remote interest, by (topic, pattern type): the peer's domains that want it
        self._wanted_by: dict[tuple[str, int], set[int]] = {}
        self._adverts = SourceAdverts()  # (topic, otid) <-> advert id -> transport body, session
        self._ending: set[tuple[int, int]] = set()  # sessions whose end is being checked
        # near side: the peer's advertisements we proxy, grouped by transport session
        # (one listener each); those advertised in our TRD -> their listener's address
        self._sessions = ProxySessions()
        self._proxy_addr: dict[int, Addr] = {}
        # proxied for other links only: our TRD's outbound ACL rejects their topics
        self._transit_only: set[int] = set()
        # routing (set by a router with multi-hop routing through set_routes): may the
        # local interest of our domain go on this link (is the peer our child in our
        # tree)? and the cost of the route from our TRD to each domain (None: one hop)
        self.carries_interest = True
        self.route_costs: dict[int, int] | None = None
        self._sent_interest: set[tuple[str, int]] = set()  # (topic, pattern type) sent ADD
        # carries_interest at the last resync (None: none since the link came up)
        self._resynced_as: bool | None = None

    # ------------------------------------------------------------------ outputs

    def outputs(self) -> list[SendFrame | StartProxy | StopProxy | ProxyUp | ProxyDown | Notice]:
        """Everything produced since the last call, in order; empties the list."""
        out, self._out = self._out, []
        return out

    # ------------------------------------------------------------------ the TRD

    def on_datagram(self, data: bytes, src: Addr, now: float) -> None:
        """A datagram on the portal's TR socket."""
        self.portal.on_datagram(data, src, now)
        self.drain_portal()

    def tick(self, now: float) -> list[Outgoing]:
        """Run the portal's timers; the TR datagrams to send."""
        out = self.portal.tick(now)
        self.drain_portal()
        return out

    def next_deadline(self) -> float:
        return self.portal.next_deadline()

    # ------------------------------------------------------------------ the peer

    def link_up(self, now: float) -> None:
        """The peer link is connected: tell the peer every live local interest."""
        self.is_link_up = True
        self._sent_interest.clear()
        self._resynced_as = None
        for li in self.portal.local_interests():
            self._send_interest(li, P.InterestAction.ADD, count=False)

    def set_routes(self, carries_interest: bool, route_costs: dict[int, int] | None) -> None:
        """The routes (multi-hop routing): does this link carry our domain's
        interest (the peer is our child in our tree), and the cost of the
        route to each domain (the proxies' TIRs; None: one hop, the hop count)."""
        self.carries_interest, self.route_costs = carries_interest, route_costs

    def resync_interest(self, now: float) -> None:
        """The routes changed: send the local interest the link should now carry
        and cancel what it should no longer (see :meth:`set_routes`)."""
        if not self.is_link_up:
            return
        ok = self.carries_interest
        if ok == self._resynced_as:
            return  # what the link carries depends only on this: still in line
        self._resynced_as = ok
        live = {}
        for li in self.portal.local_interests():
            live[(li.topic, li.pattern_type)] = li
        for key, li in live.items():
            if ok and key not in self._sent_interest:
                self._send_interest(li, P.InterestAction.ADD, count=False)
        for key in list(self._sent_interest):
            if not ok or key not in live:
                self._send(P.Interest(P.InterestAction.CANCEL, key[0], self.domain_id, P.PatternType(key[1])))
                self._sent_interest.discard(key)

    def link_down(self, now: float) -> None:
        """The peer link is gone: stop every proxy, forget the advert ids, cancel
        the remote interests."""
        self.is_link_up = False
        for ps in self._sessions.sessions():
            for aid in list(ps.adverts):
                self._drop_proxy(aid, now)
        self._adverts.clear()
        self._ending.clear()
        tr = self.portal
        for topic, ptype in tr.remote_interests():
            tr.cancel_remote_interest(topic, now, pattern_type=ptype)
        self._wanted_by.clear()
        for p in tr.proxies():
            tr.remove_proxy(p.advert_id, now)
        self.drain_portal()

    def peer_frame(self, frame: P.Interest | P.Advertisement, now: float, *,
                   transit_wanted: bool = False) -> None:
        """An INTEREST or ADVERTISEMENT frame from the peer; ``transit_wanted``:
        another link wants the advertised topic through us (multi-hop routing:
        it is proxied here even if our TRD does not want it)."""
        if isinstance(frame, P.Interest):
            self._on_interest(frame, now)
        elif isinstance(frame, P.Advertisement):
            self._on_advertisement(frame, now, transit_wanted)
        else:
            raise TypeError(f"not a bridge frame: {frame!r}")
        self.drain_portal()

    def proxy_listening(self, proxy_id: int, address: Addr, now: float, transport_body=None, *,
                        limit: int | None = None) -> bool:
        """The listener of proxy ``proxy_id`` is bound at ``address``: advertise
        every topic of its session in the TRD (``transport_body``: what they
        advertise when the address alone does not say it, LBT-RM's group), at
        most ``limit`` of them now (the rest by :meth:`advertise_pending`).
        False if the proxy was stopped meanwhile (nothing done)."""
        ps = self._sessions.proxy(proxy_id)
        if ps is None:
            return False
        ps.address = address
        ps.body = transport_body or relay_transport(ps.transport, address[0], address[1])
        ps.pending = dict(ps.adverts)
        self.advertise_pending(proxy_id, now, limit)
        return True

    def advertise_pending(self, proxy_id: int, now: float, limit: int | None = None) -> int:
        """Advertise at most ``limit`` (None: all) more topics of proxy
        ``proxy_id``'s session at its bound listener; how many still wait."""
        ps = self._sessions.proxy(proxy_id)
        if ps is None or ps.address is None:
            return 0
        n = len(ps.pending) if limit is None else min(limit, len(ps.pending))
        for _ in range(n):
            f = ps.pending.pop(next(iter(ps.pending)))  # oldest first
            self._advertise_proxy(ps, f, now)
        self.drain_portal()
        return len(ps.pending)

    def _advertise_proxy(self, ps: ProxySession, f: P.Advertisement, now: float) -> None:
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

    def proxy_advert(self, proxy_id: int) -> int | None:
        """The advert id a new stream of proxy ``proxy_id`` names on the link (a live
        advertisement of its session), or None if it serves none any more."""
        return self._sessions.advert_of(proxy_id)

    def session_ended(self, advert_id: int, now: float) -> tuple[tuple[int, int], float] | None:
        """The source behind our advertisement ``advert_id`` ended (or refused) a
        relayed session: the portal queries the topics of its transport session
        as soon as its query rate lets it, to hear whether they are still there.
        Returns the session's name for :meth:`source_ended` and when the last
        of those queries goes (the sources have had no chance to answer before;
        ``now`` if none is sent), or None if that session's end is already being
        checked (many streams of one session end together: its topics are
        queried once, not once a stream) or the advertisement is unknown."""
        name = self._adverts.session_name(advert_id)
        if name is None or name in self._ending:
            return None
        self._ending.add(name)
        return name, self._query([self._adverts.key(aid)[0] for aid in self._adverts.adverts_named(name)], now)

    def ask_again(self, name: tuple[int, int], since: float, now: float) -> float | None:
        """Halfway through the check of the transport session ``name`` (from
        :meth:`session_ended`, which ended at ``since``): query again the topics
        of its sources not heard since (one lost query or answer does not
        withdraw a live source). Returns when the last of those queries goes,
        or None if every source was heard (the check is over: nothing will be
        withdrawn)."""
        keys = [self._adverts.key(aid) for aid in self._adverts.adverts_named(name)]
        unheard = [topic for topic, otid in keys if not self.portal.heard_since(topic, otid, since)]
        if not unheard:
            self._ending.discard(name)
            return None
        return self._query(unheard, now)

    def _query(self, topics: list[str], now: float) -> float:
        """Query ``topics`` in the portal: when the last query goes (``now`` if none)."""
        asked = now
        for topic in topics:
            at = self.portal.requery(topic, now)
            if at is not None:
                asked = max(asked, at)
        return asked

    def source_ended(self, name: tuple[int, int], since: float, now: float) -> bool:
        """No TIR of a source of the transport session ``name`` (from
        :meth:`session_ended`) arrived since its session ended at ``since``:
        forget those in the portal, which withdraws their advertisements. False
        if all were heard meanwhile (or are gone already)."""
        self._ending.discard(name)
        dropped = False
        for aid in self._adverts.adverts_named(name):
            key = self._adverts.key(aid)
            if self.portal.drop_source(key[0], key[1], now, silent_since=since):
                dropped = True
        if dropped:
            self.drain_portal()
        return dropped

    # ------------------------------------------------------------------ views

    def advert_source(self, advert_id: int):
        """The transport body of the source behind our advertisement ``advert_id``
        (where a stream the peer opens for it connects), or None."""
        return self._adverts.body(advert_id)

    def advert_request_port(self, advert_id: int) -> SourceRequestPort | None:
        """Where the source behind our advertisement ``advert_id`` takes late-join and
        OTR requests (its TIR's options, :func:`router.core.recovery.request_port_of`),
        or None."""
        return request_port_of(self._adverts.tir_options(advert_id))

    def proxied(self, advert_id: int) -> P.Advertisement | None:
        """The peer's advertisement ``advert_id``, if a proxy here serves it."""
        return self._sessions.advert(advert_id)

    def advert_sources(self) -> dict[int, object]:
        return self._adverts.bodies()

    def proxies(self) -> dict[int, P.Advertisement]:
        """The peer's advertisements proxied here, by advert id."""
        return {aid: f for ps in self._sessions.sessions() for aid, f in ps.adverts.items()}

    def proxy_listeners(self) -> int:
        """Proxy listeners running or starting (one per transport session of the peer)."""
        return len(self._sessions)

    def proxy_addresses(self) -> dict[int, Addr]:
        """The proxies whose listener is bound, by advert id: their relay address."""
        return dict(self._proxy_addr)

    # ------------------------------------------------------------------ internals

    def _send(self, frame: P.Frame) -> bool:
        if not self.is_link_up:
            return False
        self._out.append(SendFrame(frame))
        return True

    def _send_interest(self, li: LocalInterest | LocalInterestGone, action: P.InterestAction,
                       count: bool = False) -> None:
        key = (li.topic, li.pattern_type)
        if action == P.InterestAction.CANCEL:
            if key not in self._sent_interest:
                return
            self._sent_interest.discard(key)
        elif not self.carries_interest:
            return
        if not self._acl_ok(li.topic, "interest", count,
                            (self.acl, self.acl.allows_interest_in(li.topic, li.pattern_type)),
                            (self.link_acl, self.link_acl.allows_interest_out(li.topic, li.pattern_type))):
            return
        if self._send(P.Interest(action, li.topic, self.domain_id, P.PatternType(li.pattern_type))) \
                and action != P.InterestAction.CANCEL:
            self._sent_interest.add(key)

    def _acl_ok(self, topic: str, what: str, count: bool, *verdicts: tuple[PortalAcl, bool]) -> bool:
        """True if every (acl, allowed) verdict allows; else the refusal is
        counted (when ``count``) against the first ACL that refused."""
        for acl, allowed in verdicts:
            if allowed:
                continue
            if count and (acl is self.acl or self.count_link_acl):
                self.counters["acl_rejected"] += 1
                self.acl_rejected[acl.portal] += 1
                n = self.acl_rejected[acl.portal]
                if n & (n - 1) == 0:
                    self._out.append(Notice("acl_rejected", f"portal {acl.portal!r}: {what} {topic[:80]!r} "
                                            f"rejected by its ACL ({n} so far)"))
            return False
        return True

    def _advertise(self, aid: int, topic: str, otid: bytes, transport: int, *, withdraw: bool,
                   session: int = 0, origin_session_id: int = 0, tir_options: bytes = b"") -> None:
        if not self.is_link_up:
            return
        if transport not in RELAYED_TRANSPORTS:
            self.counters["unrelayable_transport"] += 1
            return
        self._send(P.Advertisement(topic, self.domain_id, bytes(otid), transport, aid, withdraw,
                                   session=session, origin_session_id=origin_session_id if session else 0,
                                   tir_options=b"" if withdraw else tir_options))
        self.counters["adverts_withdrawn" if withdraw else "adverts_sent"] += 1

    def drain_portal(self) -> None:
        """Act on the portal's events for this link (its calls drain them
        itself; a shared portal's other events wait until this is called)."""
        for ev in self.portal.events():
            if isinstance(ev, LocalInterest):
                self.counters["local_interest"] += 1
                self._send_interest(ev, P.InterestAction.ADD, count=True)
            elif isinstance(ev, LocalInterestGone):
                self._send_interest(ev, P.InterestAction.CANCEL)
            elif isinstance(ev, LocalInterestRefresh):
                if (ev.topic, ev.pattern_type) in self._sent_interest and self._send(
                        P.Interest(P.InterestAction.REFRESH, ev.topic, self.domain_id,
                                   P.PatternType(ev.pattern_type))):
                    self.counters["interest_refreshes_sent"] += 1
            elif isinstance(ev, RemoteInterestExpired):
                self._wanted_by.pop((ev.topic, ev.pattern_type), None)
                self.counters["remote_interest_expired"] += 1
                self._out.append(Notice("remote_interest_expired",
                                        f"{ev.topic[:80]!r}: not refreshed by the peer"))
                self._withdraw_unwanted(ev.topic, ev.pattern_type)
            elif isinstance(ev, SourceSeen):
                key = (ev.topic, bytes(ev.otid))
                if not self._acl_ok(ev.topic, "source", ev.first,
                                    (self.acl, self.acl.allows_source_in(
                                        ev.topic, Session.from_transport(ev.transport_body))),
                                    (self.link_acl, self.link_acl.allows_source_out(ev.topic))):
                    if key in self._adverts:  # advertised before (its transport changed): withdraw
                        self._portal_events_gone(ev.topic, ev.otid)
                    continue
                aid = self._adverts.get(key)
                if aid is not None and self._adverts.body(aid) != ev.transport_body:
                    # the source moved to another transport session: a new advert id, so
                    # that no stream for the old one reaches the new session (the peer's
                    # proxy of the old session would relay it to that session's receivers)
                    self._portal_events_gone(ev.topic, ev.otid)
                    aid = None
                if aid is None:
                    aid = next(self._advert_ids)
                session = self._adverts.set(key, aid, ev.transport_body, ev.tir_options)
                self._advertise(aid, ev.topic, ev.otid, ev.transport_body.TYPE, withdraw=False,
                                session=session,
                                origin_session_id=getattr(ev.transport_body, "session_id", 0) or 0,
                                tir_options=ev.tir_options)
            elif isinstance(ev, SourceGone):
                self._portal_events_gone(ev.topic, ev.otid)

    def _portal_events_gone(self, topic: str, otid: bytes) -> None:
        got = self._adverts.pop((topic, bytes(otid)))
        if got is not None:
            aid, body = got
            self._advertise(aid, topic, otid, body.TYPE if body is not None else 0, withdraw=True)
            self._out.append(Notice("source_gone", f"{topic} advert {aid}"))

    def _on_interest(self, f: P.Interest, now: float) -> None:
        tr = self.portal
        pt = int(f.pattern_type)
        if not self._acl_ok(f.topic, "interest", f.action != P.InterestAction.CANCEL,
                            (self.link_acl, self.link_acl.allows_interest_in(f.topic, pt)),
                            (self.acl, self.acl.allows_interest_out(f.topic, pt))):
            return
        try:
            key = (f.topic, int(f.pattern_type))
            if f.action == P.InterestAction.CANCEL:
                # the interest lasts while any of the peer's domains wants it
                domains = self._wanted_by.get(key)
                if domains is not None:
                    domains.discard(f.domain_id)
                    if domains:
                        return
                    del self._wanted_by[key]
                if tr.cancel_remote_interest(f.topic, now, pattern_type=int(f.pattern_type)):
                    self._withdraw_unwanted(f.topic, int(f.pattern_type))
            else:
                # ADD or REFRESH: keeps the interest alive and re-sends its adverts
                tr.add_remote_interest(f.topic, now, pattern_type=int(f.pattern_type))
                self._wanted_by.setdefault(key, set()).add(f.domain_id)
        except ValueError as e:
            self.counters["bad_interest"] += 1
            n = self.counters["bad_interest"]
            if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th ...: logged, never a flood
                self._out.append(Notice("interest_refused", f"{n} interest(s) from the peer refused so "
                                        f"far; latest {f.topic[:80]!r}: {e}"))

    def _withdraw_unwanted(self, topic: str, pattern_type: int) -> None:
        """The peer's interest in ``topic`` (a pattern unless ``pattern_type``
        is 0) is gone: withdraw the advertisements it no longer wants (no other
        interest of the peer covers their topic), so its proxies go at once
        instead of lingering until the link drops. An exact topic looks only at
        that topic's sources (thousands of topics cancelled one after the other
        must not cost the square of their number)."""
        if pattern_type == P.PatternType.TOPIC:
            keys = [(s.topic, bytes(s.otid)) for s in self.portal.known_sources(topic)]
            keys = [k for k in keys if k in self._adverts]
        else:
            keys = self._adverts.keys()
        for topic, otid in [k for k in keys if not self.portal.wants_source(k[0])]:
            self.counters["adverts_withdrawn_uninterested"] += 1
            self._portal_events_gone(topic, otid)

    def _on_advertisement(self, f: P.Advertisement, now: float, transit: bool) -> None:
        if f.withdraw:
            self.counters["withdrawals_received"] += 1
            self._drop_proxy(f.advert_id, now)
            return
        if f.advert_id in self._sessions:
            return  # already proxied (a re-send)
        if f.origin_domain == self.domain_id:
            self.counters["adverts_own_domain"] += 1
            return
        if f.transport not in RELAYED_TRANSPORTS:
            self.counters["unrelayable_transport"] += 1
            return
        if not self._acl_ok(f.topic, "advertisement", True,
                            (self.link_acl, self.link_acl.allows_source_in(f.topic, Session(f.transport)))):
            return
        # our TRD's outbound list keeps the topic out of our TRD only: another link may
        # still want it through us (a proxy then runs for it, unadvertised here)
        local = self._acl_ok(f.topic, "advertisement", True, (self.acl, self.acl.allows_source_out(f.topic)))
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
                self._advertise_proxy(ps, f, now)

    def _drop_proxy(self, aid: int, now: float) -> None:
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
