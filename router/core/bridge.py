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

Outputs accumulate in order and :meth:`Bridge.outputs` drains them
(:mod:`router.core.bridge_outputs`): :class:`~router.core.bridge_outputs.SendFrame`
(a frame for the peer; produced only while the link is up),
:class:`~router.core.bridge_outputs.StartProxy` (bind a listener at the relay
address for an advertised source, then report it with ``proxy_listening``),
:class:`~router.core.bridge_outputs.StopProxy` (close that listener and its
streams), ``ProxyUp`` / ``ProxyDown`` (a proxy advertised in our TRD, or no
longer) and :class:`~router.core.bridge_outputs.Notice` (something for the
event log).

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
* **Far side: advertisements.** A source the peer wants gets an advert id and
  an ADVERTISEMENT, withdrawn when the source goes or no interest of the
  peer wants it any more (:class:`router.core.bridge_adverts.SourceAdvertiser`).
* **Near side: proxies.** The peer's advertisements are served by one proxy
  per transport session, within ``max_proxies`` listeners and
  ``max_proxy_topics`` advertisements (:class:`router.core.bridge_proxies.PeerProxies`
  says what is refused and when a proxy starts and stops).
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
  portal (:class:`router.core.bridge_acl.BridgeAcl`).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator

from .. import peerlink as P
from .acl import OPEN, PortalAcl
from .bridge_acl import BridgeAcl
from .bridge_adverts import SourceAdvertiser
from .bridge_outputs import Addr, BridgeOutput, Notice, SendFrame
from .bridge_proxies import MAX_PROXY_TOPICS, PeerProxies
from .endpoint_portal import PortalView
from .recovery import SourceRequestPort
from .tr import (
    LocalInterest,
    LocalInterestGone,
    LocalInterestRefresh,
    Outgoing,
    PortalTR,
    RemoteInterestExpired,
    SourceGone,
    SourceSeen,
)

__all__ = ["Bridge"]

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
        self.domain_id = portal.domain_id
        self.counters: Counter[str] = counters if counters is not None else Counter()
        # ACLs: the endpoint's and the link's (count_link_acl False: the link's refusals of
        # the link's frames are counted by another bridge that gets the same frames)
        self.acl, self.link_acl = acl, link_acl
        self._acl = BridgeAcl(acl, link_acl, count_link_acl, self.counters)
        self.acl_rejected: Counter[str] = self._acl.rejected  # refusals by portal name
        self.is_link_up = False
        self._out: list[BridgeOutput] = []
        # far side: our TRD's sources advertised to the peer (advert ids: shared by the
        # bridges of one router that share a link, unique on it)
        self._adverts = SourceAdvertiser(portal, self.counters, self._acl,
                                         advert_ids if advert_ids is not None else itertools.count(1))
        # remote interest, by (topic, pattern type): the peer's domains that want it
        self._wanted_by: dict[tuple[str, int], set[int]] = {}
        # near side: the peer's advertisements we proxy
        self._proxies = PeerProxies(portal, self.counters, self._acl, max_proxies=max_proxies,
                                    max_proxy_topics=max_proxy_topics, require_interest=require_interest)
        # routing (set by a router with multi-hop routing through set_routes): may the
        # local interest of our domain go on this link (is the peer our child in our
        # tree)? (the cost of the route to each domain is the proxies')
        self.carries_interest = True
        self._sent_interest: set[tuple[str, int]] = set()  # (topic, pattern type) sent ADD
        # carries_interest at the last resync (None: none since the link came up)
        self._resynced_as: bool | None = None

    # ------------------------------------------------------------------ outputs

    def outputs(self) -> list[BridgeOutput]:
        """Everything produced since the last call, in order; empties the list."""
        out, self._out = self._out, []
        return out

    def _take(self, side: SourceAdvertiser | PeerProxies) -> None:
        """The outputs of a call into one side, after the bridge's own (in order)."""
        self._out += side.outputs()

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
        self._adverts.link_up()
        self._sent_interest.clear()
        self._resynced_as = None
        for li in self.portal.local_interests():
            self._send_interest(li, P.InterestAction.ADD, count=False)

    def set_routes(self, carries_interest: bool, route_costs: dict[int, int] | None) -> None:
        """The routes (multi-hop routing): does this link carry our domain's
        interest (the peer is our child in our tree), and the cost of the
        route to each domain (the proxies' TIRs; None: one hop, the hop count)."""
        self.carries_interest = carries_interest
        self._proxies.route_costs = route_costs

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
        self._adverts.link_down()
        self._proxies.drop_all(now)
        self._take(self._proxies)
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
            self._proxies.advertisement(frame, now, transit_wanted)
            self._take(self._proxies)
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
        if not self._proxies.listening(proxy_id, address, transport_body):
            return False
        self.advertise_pending(proxy_id, now, limit)
        return True

    def advertise_pending(self, proxy_id: int, now: float, limit: int | None = None) -> int:
        """Advertise at most ``limit`` (None: all) more topics of proxy
        ``proxy_id``'s session at its bound listener; how many still wait."""
        left = self._proxies.advertise_pending(proxy_id, now, limit)
        self._take(self._proxies)
        if left is None:
            return 0
        self.drain_portal()
        return left

    def proxy_advert(self, proxy_id: int) -> int | None:
        """The advert id a new stream of proxy ``proxy_id`` names on the link (a live
        advertisement of its session), or None if it serves none any more."""
        return self._proxies.advert_of(proxy_id)

    def session_ended(self, advert_id: int, now: float) -> tuple[tuple[int, int], float] | None:
        """The source behind our advertisement ``advert_id`` ended (or refused) a
        relayed session: the portal queries the topics of its transport session
        as soon as its query rate lets it, to hear whether they are still there.
        Returns the session's name for :meth:`source_ended` and when the last
        of those queries goes (the sources have had no chance to answer before;
        ``now`` if none is sent), or None if that session's end is already being
        checked (many streams of one session end together: its topics are
        queried once, not once a stream) or the advertisement is unknown."""
        return self._adverts.session_ended(advert_id, now)

    def ask_again(self, name: tuple[int, int], since: float, now: float) -> float | None:
        """Halfway through the check of the transport session ``name`` (from
        :meth:`session_ended`, which ended at ``since``): query again the topics
        of its sources not heard since (one lost query or answer does not
        withdraw a live source). Returns when the last of those queries goes,
        or None if every source was heard (the check is over: nothing will be
        withdrawn)."""
        return self._adverts.ask_again(name, since, now)

    def source_ended(self, name: tuple[int, int], since: float, now: float) -> bool:
        """No TIR of a source of the transport session ``name`` (from
        :meth:`session_ended`) arrived since its session ended at ``since``:
        forget those in the portal, which withdraws their advertisements. False
        if all were heard meanwhile (or are gone already)."""
        dropped = self._adverts.source_ended(name, since, now)
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
        return self._adverts.request_port(advert_id)

    def proxied(self, advert_id: int) -> P.Advertisement | None:
        """The peer's advertisement ``advert_id``, if a proxy here serves it."""
        return self._proxies.proxied(advert_id)

    def advert_sources(self) -> dict[int, object]:
        return self._adverts.bodies()

    def proxies(self) -> dict[int, P.Advertisement]:
        """The peer's advertisements proxied here, by advert id."""
        return self._proxies.proxies()

    def proxy_listeners(self) -> int:
        """Proxy listeners running or starting (one per transport session of the peer)."""
        return self._proxies.listeners()

    def proxy_addresses(self) -> dict[int, Addr]:
        """The proxies whose listener is bound, by advert id: their relay address."""
        return self._proxies.addresses()

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
        """True if every (acl, allowed) verdict allows (:meth:`BridgeAcl.allows`)."""
        return self._acl.allows(topic, what, count, *verdicts, notices=self._out)

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
                self._adverts.withdraw_unwanted(ev.topic, ev.pattern_type)
                self._take(self._adverts)
            elif isinstance(ev, SourceSeen):
                self._adverts.seen(ev)
                self._take(self._adverts)
            elif isinstance(ev, SourceGone):
                self._adverts.gone(ev.topic, ev.otid)
                self._take(self._adverts)

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
                    self._adverts.withdraw_unwanted(f.topic, int(f.pattern_type))
                    self._take(self._adverts)
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
