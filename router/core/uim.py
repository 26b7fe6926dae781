"""Unicast immediate messages routed by domain, sans-IO: what the router does
with each UIM it takes (``lbmr-router(8)``, "Unicast immediate messages by
domain").

A UIM comes in either at an endpoint's request listener (``<request-tcp>``,
the address its remote domain route records name: an application in that
TRD sends ``TCP:domain:ip:port`` there) or on a UIM_ROUTED stream of a peer
link (capability UIM_ROUTING). :meth:`UimPath.message` looks at one whole
LBMC message and returns one typed decision:

* :class:`DeliverMessage`: this router serves the destination domain: write
  ``message`` to the destination (``ip``:``port``) in the TRD of endpoint
  ``endpoint``;
* :class:`ForwardMessage`: pass ``message`` on to router ``next_router``, on
  a UIM_ROUTED stream of ``hops`` (the peer links crossed before that one);
* :class:`RecoverMessage`: a late-join or retransmission request (LJI_REQ,
  UME_RXREQ; no DESTINATION) that came to an endpoint's listener for a proxy
  of ours (its transport index names the proxy,
  :func:`router.core.recovery.proxy_transport_index`): carry it on a RECOVERY
  stream on the link the proxy's advertisement came from, for the receiver's
  address it names (:mod:`router.core.recovery`);
* :class:`DropMessage`: drop it, for ``reason`` (a :class:`UimDrop`; the
  I/O counts it under ``reason.counter``).

A message passed on (delivered or forwarded) is the one that came in with
``hops_taken`` of its DESTINATION header one higher (the only byte that
changes); the sender's (orig) domain, address and port stay, so the
destination can answer by domain. A message without a DESTINATION header is
dropped (:data:`UimDrop.NO_DESTINATION`): one more decision for it fits in
:meth:`UimPath.message`, the one dispatch.

Loops cannot happen: a stream never goes back to the router it came from,
crosses at most ``max_hop_count`` peer links
(:func:`route_uim`), and ``hops_taken`` above
:data:`MAX_HOPS_TAKEN` is dropped. Decisions are cached per destination
until the routes change (:attr:`router.core.routing.Routing.version`),
at most :data:`MAX_CACHED` of them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum

from lbmr_proto import lbmc

from .message_addresses import Destination, deliverable_address, destination_of, with_hops_taken
from .recovery import recovery_request
from .routing import Routing

__all__ = ["UimRefusal", "DeliverUim", "ForwardUim", "RefuseUim", "UimDecision", "route_uim",
           "UimPath", "UimDrop", "DeliverMessage", "ForwardMessage", "RecoverMessage", "DropMessage", "UimAction",
           "UimStream", "MAX_HOPS_TAKEN", "MAX_CACHED"]


# ------------------------------------------------------------------ the route of one destination


class UimRefusal(Enum):
    """Why a router does not take a unicast immediate message (or a UIM_ROUTED stream)
    for a destination further."""

    UNREACHABLE = "no route to the destination domain"
    BACK = "the route to the destination domain leads back where it came from"
    HOP_LIMIT = "it would cross more than max-hop-count peer links"
    NOT_DELIVERABLE = "the destination address is not one to connect to on another TRD's word"


@dataclass(frozen=True, slots=True)
class DeliverUim:
    """This router serves the destination domain: connect to the destination, deliver."""


@dataclass(frozen=True, slots=True)
class ForwardUim:
    """Pass it on towards router ``next_router`` (on the link to it), in a UIM_ROUTED
    stream of ``hops`` (the peer links crossed before that one)."""

    next_router: str
    hops: int


@dataclass(frozen=True, slots=True)
class RefuseUim:
    """Refuse it (the UIM_ROUTED stream: STREAM_REFUSE code 1, ``reason.value`` as the
    reason; a UIM that entered here: drop it and count it)."""

    reason: UimRefusal


UimDecision = DeliverUim | ForwardUim | RefuseUim


def route_uim(domain_id: int, ip: str, *, hops: int | None, came_from: str | None,
              served: Collection[int], next_router: str | None, endpoint_ip: str,
              max_hop_count: int) -> UimDecision:
    """Where a UIM for ``domain_id`` (its DESTINATION address ``ip``) goes from this router.

    ``hops``: the hops of the UIM_ROUTED stream it came on (None: it entered here, at an
    endpoint's UIM listener); ``came_from``: the router that stream came from (None: it
    entered here); ``served``: the domains of this router's endpoint portals, and
    ``endpoint_ip`` the interface of the one serving ``domain_id``; ``next_router``: the
    next hop of this router's route to ``domain_id`` (None: no route); ``max_hop_count``:
    the most peer links a UIM may cross (``<route-info max-hop-count>``). Never back to
    the router it came from: a loop ends at the hop limit at the latest."""
    if domain_id in served:
        if deliverable_address(ip, endpoint_ip):
            return DeliverUim()
        return RefuseUim(UimRefusal.NOT_DELIVERABLE)
    if next_router is None:
        return RefuseUim(UimRefusal.UNREACHABLE)
    if next_router == came_from:
        return RefuseUim(UimRefusal.BACK)
    out = 0 if hops is None else hops + 1
    if out + 1 > max_hop_count:
        return RefuseUim(UimRefusal.HOP_LIMIT)
    return ForwardUim(next_router, out)


# ------------------------------------------------------------------ the path of one message

#: routers a UIM may have crossed (``hops_taken``); beyond, it is dropped (the DRO's
#: hard drop at 255 hops)
MAX_HOPS_TAKEN = 255
#: decisions cached per (domain, ip, where it came from, hops)
MAX_CACHED = 4096


class UimDrop(Enum):
    """Why a UIM is dropped; ``counter`` is what the router counts it under."""

    MALFORMED = "uim_malformed"
    NO_DESTINATION = "uim_no_destination"
    UNREACHABLE = "uim_unreachable"
    BACK = "uim_refused_back"
    HOP_LIMIT = "uim_hop_limit"
    NOT_DELIVERABLE = "uim_not_deliverable"
    OWN_LISTENER = "uim_to_own_listener"
    STREAM_MISMATCH = "uim_stream_mismatch"
    RECOVERY_UNKNOWN = "recovery_unknown_proxy"  # a request naming no proxy of the endpoint
    RECOVERY_REQUESTER = "recovery_requester_not_deliverable"  # the answer address is not one to connect to
    # (or is our own request listener)

    @property
    def counter(self) -> str:
        return self.value


_REFUSAL_DROP = {UimRefusal.UNREACHABLE: UimDrop.UNREACHABLE, UimRefusal.BACK: UimDrop.BACK,
                 UimRefusal.HOP_LIMIT: UimDrop.HOP_LIMIT, UimRefusal.NOT_DELIVERABLE: UimDrop.NOT_DELIVERABLE}


@dataclass(frozen=True, slots=True)
class DeliverMessage:
    """Write ``message`` to ``ip``:``port`` in the TRD of endpoint ``endpoint``."""

    endpoint: str
    ip: str
    port: int
    message: bytes
    destination: Destination


@dataclass(frozen=True, slots=True)
class ForwardMessage:
    """Send ``message`` to router ``next_router`` on a UIM_ROUTED stream for
    ``domain_id``, ``ip``:``port`` of ``hops`` (peer links crossed before)."""

    next_router: str
    hops: int
    domain_id: int
    ip: str
    port: int
    message: bytes
    destination: Destination


@dataclass(frozen=True, slots=True)
class RecoverMessage:
    """Send ``message`` (a late-join or retransmission request, unchanged) on the
    RECOVERY stream on link ``link`` for the peer's advertisement ``advert_id`` and
    the receiver at ``requester_ip``:``requester_port`` (where the answers go, in the
    TRD of endpoint ``endpoint``)."""

    endpoint: str
    link: str
    advert_id: int
    requester_ip: str
    requester_port: int
    message: bytes


@dataclass(frozen=True, slots=True)
class DropMessage:
    """Drop the message (count ``reason.counter``); ``detail`` for the log."""

    reason: UimDrop
    detail: str = ""


UimAction = DeliverMessage | ForwardMessage | RecoverMessage | DropMessage


@dataclass(frozen=True, slots=True)
class UimStream:
    """Where a UIM_ROUTED stream the peer opened goes: its destination
    (``domain_id``, ``ip``, ``port``), its ``hops`` and the router it came
    from (``came_from``)."""

    domain_id: int
    ip: str
    port: int
    hops: int
    came_from: str | None


class UimPath:
    """The UIM decisions of one router. ``served``: endpoint name -> (domain id,
    the endpoint's interface address: where a destination may be delivered,
    :func:`router.core.message_addresses.deliverable_address`); ``routing``: the
    router's route info (its map's next hop to each domain; None: this router
    has no peers that route); ``max_hop_count``: the most peer links a UIM
    crosses (``<route-info max-hop-count>``); ``own``: the (ip, port) of this router's
    request listeners, never a destination (a UIM delivered there would come back
    in, again and again until its hop limit); ``proxies``: the router's proxies
    (:meth:`router.core.router_core.RouterCore.proxied`; None: no late join or OTR
    request is taken). ``counters``: what is counted (``uim_in``,
    ``uim_delivered``/``uim_forwarded``/``recovery_requests`` decisions, and the
    drops by :class:`UimDrop`)."""

    def __init__(self, served: dict[str, tuple[int, str]], routing: Routing | None, *,
                 max_hop_count: int = 100, own: frozenset[tuple[str, int]] = frozenset(),
                 counters: Counter[str] | None = None, proxies=None) -> None:
        self.proxies = proxies
        self.by_domain = {dom: (name, ip) for name, (dom, ip) in served.items()}
        self.endpoint_ips = {name: ip for name, (_, ip) in served.items()}
        self.own = own
        self.routing = routing
        self.max_hop_count = max_hop_count
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self._cache: dict[tuple, UimDecision] = {}
        self._version = -1

    # ------------------------------------------------------------ decisions

    def route(self, domain_id: int, ip: str, *, hops: int | None = None,
              came_from: str | None = None) -> UimDecision:
        """Where a UIM for ``domain_id`` (destination address ``ip``) goes from
        here (:func:`route_uim`): ``hops`` and ``came_from``
        of the UIM_ROUTED stream it came on, None for one that entered here."""
        version = self.routing.version if self.routing is not None else 0
        if version != self._version or len(self._cache) >= MAX_CACHED:
            self._cache.clear()
            self._version = version
        key = (domain_id, ip, hops, came_from)
        got = self._cache.get(key)
        if got is None:
            name_ip = self.by_domain.get(domain_id)
            next_router = None
            if name_ip is None and self.routing is not None:
                r = self.routing.map.route(domain_id)
                next_router = r.next_hop if r is not None else None
            got = self._cache[key] = route_uim(
                domain_id, ip, hops=hops, came_from=came_from,
                served=(domain_id,) if name_ip is not None else (),
                next_router=next_router, endpoint_ip=name_ip[1] if name_ip else "0.0.0.0",
                max_hop_count=self.max_hop_count)
        return got

    def open_stream(self, target: UimStream) -> DropMessage | None:
        """A UIM_ROUTED stream the peer opened for ``target``: None to accept it, a
        :class:`DropMessage` to refuse it (its reason is the STREAM_REFUSE's)."""
        got = self.route(target.domain_id, target.ip, hops=target.hops, came_from=target.came_from)
        if isinstance(got, RefuseUim):
            self.counters["uim_streams_refused"] += 1
            return DropMessage(_REFUSAL_DROP[got.reason], got.reason.value)
        self.counters["uim_streams_accepted"] += 1
        return None

    def message(self, message: bytes | memoryview, stream: UimStream | None = None, *,
                endpoint: str | None = None) -> UimAction:
        """The one decision for one whole LBMC ``message``: taken at the request
        listener of endpoint ``endpoint`` (``stream`` None) or on a UIM_ROUTED
        stream the peer opened for ``stream`` (its messages must be for that
        destination; ``endpoint`` None). Every kind of message a listener takes is
        decided here (one more kind: one more branch and decision type)."""
        self.counters["uim_in"] += 1
        try:
            dest = destination_of(message)
            recovery = recovery_request(message) if dest is None and stream is None else None
        except lbmc.LbmcDecodeError as e:
            return self._drop(UimDrop.MALFORMED, str(e))
        if recovery is not None and endpoint is not None and self.proxies is not None:
            return self._recover(message, recovery, endpoint)
        if dest is None:
            return self._drop(UimDrop.NO_DESTINATION)
        if stream is not None and (dest.domain_id, dest.ip, dest.port) != (stream.domain_id, stream.ip, stream.port):
            return self._drop(UimDrop.STREAM_MISMATCH, f"{dest.domain_id}:{dest.ip}:{dest.port} on a stream for "
                                                       f"{stream.domain_id}:{stream.ip}:{stream.port}")
        if dest.hops_taken >= MAX_HOPS_TAKEN:
            return self._drop(UimDrop.HOP_LIMIT, f"hops_taken {dest.hops_taken}")
        if dest.port == 0 or dest.domain_id == 0:
            return self._drop(UimDrop.NOT_DELIVERABLE, f"domain {dest.domain_id} port {dest.port}")
        got = self.route(dest.domain_id, dest.ip, hops=None if stream is None else stream.hops,
                         came_from=None if stream is None else stream.came_from)
        if isinstance(got, RefuseUim):
            return self._drop(_REFUSAL_DROP[got.reason], f"domain {dest.domain_id}: {got.reason.value}")
        if isinstance(got, DeliverUim) and (dest.ip, dest.port) in self.own:
            return self._drop(UimDrop.OWN_LISTENER, f"{dest.ip}:{dest.port}")
        out = with_hops_taken(bytes(message), dest.hops_taken + 1)
        if isinstance(got, DeliverUim):
            self.counters["uim_to_deliver"] += 1
            return DeliverMessage(self.by_domain[dest.domain_id][0], dest.ip, dest.port, out, dest)
        assert isinstance(got, ForwardUim)
        self.counters["uim_to_forward"] += 1
        return ForwardMessage(got.next_router, got.hops, dest.domain_id, dest.ip, dest.port, out, dest)

    def _recover(self, message, req, endpoint: str) -> RecoverMessage | DropMessage:
        """A late-join or OTR request at ``endpoint``'s listener: to the proxy its
        transport index names, if the answer address is one to connect to."""
        got = self.proxies.proxied(endpoint, req.transport_idx)
        if got is None:
            return self._drop(UimDrop.RECOVERY_UNKNOWN, f"{req.header.name} transport index {req.transport_idx}")
        if not req.port or not deliverable_address(req.ip, self.endpoint_ips.get(endpoint, "0.0.0.0")) \
                or (req.ip, req.port) in self.own:  # answers written into our listener: taken as requests again
            return self._drop(UimDrop.RECOVERY_REQUESTER, f"{req.header.name} answer address {req.ip}:{req.port}")
        self.counters["recovery_requests"] += 1
        link, f = got
        return RecoverMessage(endpoint, link, f.advert_id, req.ip, req.port, bytes(message))

    def _drop(self, reason: UimDrop, detail: str = "") -> DropMessage:
        self.counters[reason.counter] += 1
        return DropMessage(reason, detail)
