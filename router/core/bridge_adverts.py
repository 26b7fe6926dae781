"""The far side of a bridge, sans-IO: the sources of our TRD advertised to the
peer (:class:`router.core.bridge.Bridge` runs one :class:`SourceAdvertiser`).

A source the peer wants (the portal's :class:`router.core.tr.SourceSeen`) gets an
advert id, stable for its (topic, OTID) while the link lasts, and an
ADVERTISEMENT; :class:`router.core.tr.SourceGone` sends the withdrawal, and so
does an INTEREST CANCEL that leaves the source's topic wanted by no interest of
the peer (``adverts_withdrawn_uninterested``). Only TCP, LBT-RU and LBT-RM
sources are advertised (``unrelayable_transport`` otherwise). A source that
moves to another transport session gets a new advert id.

When a relayed session ends (the source ended or refused it), the topics of its
transport session are queried in the portal (:meth:`SourceAdvertiser.session_ended`,
:meth:`~SourceAdvertiser.ask_again`), and those not heard since are forgotten
(:meth:`~SourceAdvertiser.source_ended`), which withdraws their advertisements.

Calling contract: the bridge calls the methods (made serially, each taking
``now`` where time matters), then drains :meth:`SourceAdvertiser.outputs` (in
order) into its own; the portal's events they cause are the bridge's to drain.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from .. import peerlink as P
from .acl import Session
from .bridge_acl import BridgeAcl
from .bridge_outputs import BridgeOutput, Notice, SendFrame
from .bridge_proxies import RELAYED_TRANSPORTS
from .endpoint_portal import PortalView
from .recovery import SourceRequestPort, request_port_of
from .sessions import SourceAdverts
from .tr import PortalTR, SourceSeen

__all__ = ["SourceAdvertiser"]


class SourceAdvertiser:
    """Our TRD's sources advertised on one peer link. ``portal``: the bridge's portal;
    ``counters``: the router's; ``acl``: the bridge's ACLs; ``advert_ids``: where advert
    ids come from (shared by the bridges of one router that share a link: unique on it).
    Advertisements go out only between :meth:`link_up` and :meth:`link_down`."""

    def __init__(self, portal: PortalTR | PortalView, counters: Counter[str], acl: BridgeAcl,
                 advert_ids: Iterator[int]) -> None:
        self.portal = portal
        self.counters = counters
        self.acl = acl
        self.domain_id = portal.domain_id
        self.is_link_up = False
        self._out: list[BridgeOutput] = []
        self._advert_ids = advert_ids
        self._adverts = SourceAdverts()  # (topic, otid) <-> advert id -> transport body, session
        self._ending: set[tuple[int, int]] = set()  # sessions whose end is being checked

    def outputs(self) -> list[BridgeOutput]:
        """Everything produced since the last call, in order; empties the list."""
        out, self._out = self._out, []
        return out

    # ------------------------------------------------------------------ the link

    def link_up(self) -> None:
        self.is_link_up = True

    def link_down(self) -> None:
        """The link is gone: the advert ids are forgotten."""
        self.is_link_up = False
        self._adverts.clear()
        self._ending.clear()

    # ------------------------------------------------------------------ the portal's sources

    def seen(self, ev: SourceSeen) -> None:
        """A source the peer wants: advertise it (again, if its transport changed)."""
        key = (ev.topic, bytes(ev.otid))
        acl = self.acl
        if not acl.allows(ev.topic, "source", ev.first,
                          (acl.acl, acl.acl.allows_source_in(ev.topic, Session.from_transport(ev.transport_body))),
                          (acl.link_acl, acl.link_acl.allows_source_out(ev.topic)), notices=self._out):
            if key in self._adverts:  # advertised before (its transport changed): withdraw
                self.gone(ev.topic, ev.otid)
            return
        aid = self._adverts.get(key)
        if aid is not None and self._adverts.body(aid) != ev.transport_body:
            # the source moved to another transport session: a new advert id, so
            # that no stream for the old one reaches the new session (the peer's
            # proxy of the old session would relay it to that session's receivers)
            self.gone(ev.topic, ev.otid)
            aid = None
        if aid is None:
            aid = next(self._advert_ids)
        session = self._adverts.set(key, aid, ev.transport_body, ev.tir_options)
        self._advertise(aid, ev.topic, ev.otid, ev.transport_body.TYPE, withdraw=False,
                        session=session,
                        origin_session_id=getattr(ev.transport_body, "session_id", 0) or 0,
                        tir_options=ev.tir_options)

    def gone(self, topic: str, otid: bytes) -> None:
        """The source (``topic``, ``otid``) is gone, or no longer to be advertised:
        withdraw its advertisement, if it has one."""
        got = self._adverts.pop((topic, bytes(otid)))
        if got is not None:
            aid, body = got
            self._advertise(aid, topic, otid, body.TYPE if body is not None else 0, withdraw=True)
            self._out.append(Notice("source_gone", f"{topic} advert {aid}"))

    def withdraw_unwanted(self, topic: str, pattern_type: int) -> None:
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
            self.gone(topic, otid)

    # ------------------------------------------------------------------ a relayed session's end

    def session_ended(self, advert_id: int, now: float) -> tuple[tuple[int, int], float] | None:
        """As :meth:`router.core.bridge.Bridge.session_ended`."""
        name = self._adverts.session_name(advert_id)
        if name is None or name in self._ending:
            return None
        self._ending.add(name)
        return name, self._query([self._adverts.key(aid)[0] for aid in self._adverts.adverts_named(name)], now)

    def ask_again(self, name: tuple[int, int], since: float, now: float) -> float | None:
        """As :meth:`router.core.bridge.Bridge.ask_again`."""
        keys = [self._adverts.key(aid) for aid in self._adverts.adverts_named(name)]
        unheard = [topic for topic, otid in keys if not self.portal.heard_since(topic, otid, since)]
        if not unheard:
            self._ending.discard(name)
            return None
        return self._query(unheard, now)

    def source_ended(self, name: tuple[int, int], since: float, now: float) -> bool:
        """As :meth:`router.core.bridge.Bridge.source_ended` (the portal's events
        are the caller's to drain)."""
        self._ending.discard(name)
        dropped = False
        for aid in self._adverts.adverts_named(name):
            key = self._adverts.key(aid)
            if self.portal.drop_source(key[0], key[1], now, silent_since=since):
                dropped = True
        return dropped

    # ------------------------------------------------------------------ views

    def body(self, advert_id: int):
        """The transport body of the source behind our advertisement ``advert_id``, or None."""
        return self._adverts.body(advert_id)

    def request_port(self, advert_id: int) -> SourceRequestPort | None:
        """Where the source behind ``advert_id`` takes late-join and OTR requests
        (:func:`router.core.recovery.request_port_of`), or None."""
        return request_port_of(self._adverts.tir_options(advert_id))

    def bodies(self) -> dict[int, object]:
        return self._adverts.bodies()

    # ------------------------------------------------------------------ internals

    def _query(self, topics: list[str], now: float) -> float:
        """Query ``topics`` in the portal: when the last query goes (``now`` if none)."""
        asked = now
        for topic in topics:
            at = self.portal.requery(topic, now)
            if at is not None:
                asked = max(asked, at)
        return asked

    def _advertise(self, aid: int, topic: str, otid: bytes, transport: int, *, withdraw: bool,
                   session: int = 0, origin_session_id: int = 0, tir_options: bytes = b"") -> None:
        if not self.is_link_up:
            return
        if transport not in RELAYED_TRANSPORTS:
            self.counters["unrelayable_transport"] += 1
            return
        self._out.append(SendFrame(P.Advertisement(
            topic, self.domain_id, bytes(otid), transport, aid, withdraw, session=session,
            origin_session_id=origin_session_id if session else 0, tir_options=b"" if withdraw else tir_options)))
        self.counters["adverts_withdrawn" if withdraw else "adverts_sent"] += 1
