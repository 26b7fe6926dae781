"""Requests and responses across the peer links, on trio (``lbmr-router(8)``,
"Requests and responses"; the sans-IO maps are :mod:`router.core.request_maps`,
the rewrite is the message path's, :mod:`router.core.message_path`).

Receivers' side (:class:`RequestListeners`, one per endpoint relay on one
link): each request of a proxied session names, after the message path, a
request listener of this router in the receivers' TRD
(:class:`router.core.message_path.MapRequests`: one listener per original
requester, so the request index needs no change). Listeners bind at the
endpoint's address (``request_ip`` of the settings: the relay interface,
else the ``<uim>`` one, else the TR one) on a port the system chooses (not
the relay port range: that is the proxies'; a firewall between responders
and the router must let those ephemeral ports through). The path maps
requests synchronously as the session's bytes are framed, so a few sockets
are bound in advance (spares, not listening: nobody can queue a connection
on one before a request names it; :class:`router.core.request_maps.RequestMap`);
after each run, before its bytes go to the receivers, the relay calls
:meth:`RequestListeners.settle`: the listeners just assigned listen and are
served, the expired ones close, spares are bound again. A responder that connects to a listener becomes one RESPONSE stream
(kind 0x82) on the link the session came from, naming the proxy's live
advertisement and the original requester; its bytes are relayed both ways
with the per-connection TCP relay's pumps (:func:`router.relays.tcp_streams.pump`):
the link's credit and the writer's bounded queue, unchanged.

Origin side (:class:`ResponseRelay`): a RESPONSE stream the peer opens for
one of our advertisements is accepted only for a requester a request of
that advertisement's source session named recently
(:class:`router.core.request_maps.RequesterTable`, fed by
:class:`router.core.message_path.RecordRequesters` where the origin's
messages are framed: the fan-out upstream), at an address the router may
connect to on another TRD's word (:func:`router.core.message_addresses.deliverable_address`);
the router connects to the requester and accepts once connected, else
refuses (code 1). In a chain, the middle router's origin side connects to its
own request listener: its receivers' side takes it on towards the origin.
"""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Callable, Hashable

import trio

from .. import peerlink as P
from ..core.message_addresses import deliverable_address
from ..core.message_path import CountRequests, MapRequests, MessagePath, RecordRequesters
from ..core.request_maps import (
    DEFAULT_MAX_RESPONDERS,
    DEFAULT_MAX_RESPONDERS_TOTAL,
    RequesterTable,
    RequestMap,
    RequestSlot,
)
from ..link import CONNECT_TIMEOUT, Link, StreamState
from ..peerlink import streams as S
from .interface import accept_stream, refuse_stream
from .tcp_streams import pump
from .unicast import connect_from

__all__ = ["RequestListeners", "ResponseRelay", "REQUEST_BACKLOG", "origin_key", "MAX_RESPONSES_PER_REQUESTER",
           "MAX_RESPONSES"]

#: connections waiting to be accepted on one request listener
REQUEST_BACKLOG = 64
#: RESPONSE streams (each a connection to the requester) open at once on one link for one
#: requester address, and for all of them (the receivers' side takes at most as many
#: responders: :data:`router.core.request_maps.DEFAULT_MAX_RESPONDERS`, ``_TOTAL``)
MAX_RESPONSES_PER_REQUESTER = DEFAULT_MAX_RESPONDERS
MAX_RESPONSES = DEFAULT_MAX_RESPONDERS_TOTAL


def origin_key(origin) -> tuple:
    """What names an origin session (an LBMR transport body) at its router: (ip, port,
    session id or None), the key of its fan-out upstream too (LBT-RM: the source's
    unicast port, and its group and destination port after the session id)."""
    if getattr(origin, "NAME", None) == "LBTRM":
        return origin.ip, origin.src_ucast_port, origin.session_id, origin.mcast_group, origin.dest_port
    return origin.ip, origin.port, getattr(origin, "session_id", None)


class RequestListeners:
    """The request listeners of one endpoint's relay on one link (receivers'
    side; module doc). ``map``: the sans-IO :class:`RequestMap` (its counters
    the router's); ``site``: the relay's site (the link up now, the proxies'
    live advertisements); ``ip``: where the listeners bind (the settings'
    ``request_ip``). A listener is keyed in the map by (proxy id, requester
    ip, requester port). Nothing is bound before a session's requests are
    mapped (a path with :class:`MapRequests` was handed out)."""

    def __init__(self, ip: str, counters: Counter[str], event: Callable[[str, str], None], site) -> None:
        self.ip = ip
        self.mapping = False  # a path that maps requests was handed out: spares are kept
        self.counters = counters
        self.event = event
        self.site = site
        self.map = RequestMap(counters=counters)
        self._socks: dict[tuple[str, int], trio.socket.SocketType] = {}  # every listener open, by address
        self._scopes: dict[tuple[str, int], trio.CancelScope] = {}  # the served ones' tasks

    def path(self, proxy_id: Hashable, link) -> MessagePath:
        """The message path of the session of proxy ``proxy_id``, relayed over
        ``link``: its requests mapped to listeners, or passed unchanged and
        counted: ``requests_unmapped_peer`` (the peer does not relay RESPONSE
        streams), ``requests_unmapped_no_address`` (the endpoint has no address
        of its own to name: every interface setting is "any")."""
        if not link.capabilities & P.Capability.RESPONSES:
            return MessagePath((CountRequests(self.counters, "requests_unmapped_peer"),))
        if self.ip == "0.0.0.0":
            return MessagePath((CountRequests(self.counters, "requests_unmapped_no_address"),))
        self.mapping = True
        return MessagePath((MapRequests(self.map, proxy_id),))

    def settle(self, nursery: trio.Nursery) -> None:
        """After the path ran, before what it rewrote goes to the receivers:
        the listeners it assigned listen and are served (their tasks in
        ``nursery``, the proxy's), the expired ones close, spares are bound
        again. Spares are bound but do not listen until assigned: nobody can
        queue a connection on one before a request names it. Cheap when there
        is nothing to do (call it per datagram)."""
        if not self.mapping:
            return
        now = trio.current_time()
        for slot in self.map.take_expired() + self.map.expire(now):
            self._close(slot.listener)
        for slot in self.map.take_added():
            sock = self._socks.get(slot.listener)
            try:
                sock.listen(REQUEST_BACKLOG)  # from now: a spare takes no connection before it stands for a requester
            except (AttributeError, OSError) as e:
                self.event("request_listener_failed", f"{slot.listener}: {e}")
                continue
            scope = self._scopes[slot.listener] = trio.CancelScope()
            nursery.start_soon(self._serve, slot, scope)
        for _ in range(self.map.spares_wanted(now)):
            sock = self._bind()
            if sock is None:
                self.map.spare_failed(now)
                break
            addr = sock.getsockname()[:2]
            self._socks[addr] = sock
            self.map.add_spare(addr)

    def forget(self, proxy_id: Hashable) -> None:
        """Proxy ``proxy_id`` ended: its listeners and their responders close."""
        for slot in self.map.forget_origin(proxy_id):
            self._close(slot.listener)
        if not len(self.map):
            for addr in self.map.take_spares():
                self._close(addr)

    def _bind(self):
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            raw.bind((self.ip, 0))  # bound, not listening: connections to a spare are refused
        except OSError as e:
            raw.close()
            self.event("request_listener_failed", f"{self.ip}: {e}")
            return None
        return trio.socket.from_stdlib_socket(raw)

    def _close(self, addr: tuple[str, int]) -> None:
        scope = self._scopes.pop(addr, None)
        if scope is not None:
            scope.cancel()
        sock = self._socks.pop(addr, None)
        if sock is not None:
            sock.close()

    async def _serve(self, slot: RequestSlot, scope: trio.CancelScope) -> None:
        sock = self._socks.get(slot.listener)
        if sock is None:
            return
        listener = trio.SocketListener(sock)
        with scope:
            async with trio.open_nursery() as n:
                while True:
                    try:
                        conn = await listener.accept()
                    except (trio.ClosedResourceError, OSError):
                        return
                    n.start_soon(self._responder, slot, conn)

    async def _responder(self, slot: RequestSlot, conn: trio.SocketStream) -> None:
        """One responder's connection: a RESPONSE stream towards the requester."""
        try:
            if not self.map.responder_connected(slot, trio.current_time()):
                return
            try:
                link = self.site.link
                aid = self.site.proxy_advert(slot.key.origin)
                if link is None or aid is None:
                    self.counters["responses_no_session"] += 1
                    return
                if not link.capabilities & P.Capability.RESPONSES:
                    self.counters["responses_peer_unable"] += 1
                    return
                try:
                    target = P.ResponseTarget(slot.key.ip, slot.key.port)
                    target.encode()  # checked now, not when the writer sends it
                    sid = link.streams.open(aid, P.StreamKind.RESPONSE, target)
                except (S.LocalStreamError, ValueError, P.FrameEncodeError) as e:  # ids run out, a bad port
                    self.counters["responses_no_session"] += 1
                    self.event("response_refused", f"requester {slot.key.ip}:{slot.key.port}: {e}")
                    return
                st = link.state[sid] = StreamState(sid, P.StreamKind.RESPONSE)
                st.sock = conn
                link.flush_streams()
                self.counters["response_streams_opened"] += 1
                await pump(link, st)
                if st.refused is not None:
                    self.counters["response_streams_refused"] += 1
                    self.event("response_refused", f"requester {slot.key.ip}:{slot.key.port}: {st.refused}")
            finally:
                self.map.responder_closed(slot, trio.current_time())
        finally:
            await trio.aclose_forcefully(conn)


class ResponseRelay:
    """The origin side of RESPONSE streams for one endpoint's relay on one
    link (module doc). ``requesters``: the endpoint's
    :class:`RequesterTable` (shared by its links, fed by its upstream
    sessions' message paths); ``endpoint_ip``: the endpoint's interface
    (whether a loopback requester may be connected to)."""

    STREAM_KIND = P.StreamKind.RESPONSE

    def __init__(self, requesters: RequesterTable, endpoint_ip: str, counters: Counter[str],
                 event: Callable[[str, str], None]) -> None:
        self.requesters = requesters
        self.endpoint_ip = endpoint_ip
        self.counters = counters
        self.event = event
        self._open: Counter[tuple[str, int]] = Counter()  # RESPONSE streams open, by requester address
        self._open_total = 0

    def upstream_path(self, rules, origin) -> MessagePath:
        """The message path of the upstream session of ``origin`` (its key,
        :func:`origin_key`): ``rules`` and the recording of its requesters."""
        return MessagePath((*rules, RecordRequesters(self.requesters, origin)))

    def open_far(self, link: Link, ev: S.StreamOpened, origin) -> None:
        """The peer opened RESPONSE stream ``ev`` for our advertisement of ``origin``."""
        target = ev.target
        now = trio.current_time()
        if not self.requesters.allows(origin_key(origin), target.ip, target.port, now):
            self._refuse(link, ev.stream_id, "requester not seen", "responses_refused_unseen")
            return
        if not deliverable_address(target.ip, self.endpoint_ip):
            self._refuse(link, ev.stream_id, "requester address not deliverable", "responses_refused_address")
            return
        requester = (target.ip, target.port)
        if self._open[requester] >= MAX_RESPONSES_PER_REQUESTER or self._open_total >= MAX_RESPONSES:
            self._refuse(link, ev.stream_id, "too many responses open", "responses_refused_busy")
            return
        self._open[requester] += 1
        self._open_total += 1
        st = link.state[ev.stream_id] = StreamState(ev.stream_id, ev.kind)
        st.advert_id = ev.advert_id
        link.nursery.start_soon(self._deliver, link, st, target)

    def _refuse(self, link: Link, sid: int, reason: str, counter: str) -> None:
        self.counters[counter] += 1
        self.event("response_refused", reason)
        link.streams.refuse(sid, P.RefuseCode.REFUSED, reason)
        link.flush_streams()

    async def _deliver(self, link: Link, st: StreamState, target: P.ResponseTarget) -> None:
        try:
            try:
                with trio.fail_after(CONNECT_TIMEOUT):
                    conn = await connect_from(self.endpoint_ip, (target.ip, target.port))  # from the TRD's side
            except (OSError, trio.TooSlowError) as e:
                self.counters["responses_requester_gone"] += 1
                refuse_stream(link, st, f"cannot connect to the requester {target.ip}:{target.port}: {e}",
                              self.counters, self.event)
                return
            st.sock = conn
            if not accept_stream(link, st, self.counters):
                await trio.aclose_forcefully(conn)
                return
            self.counters["responses_delivered"] += 1
            try:
                await pump(link, st)
            finally:
                await trio.aclose_forcefully(conn)
        finally:
            requester = (target.ip, target.port)
            self._open[requester] -= 1
            self._open_total -= 1
            if not self._open[requester]:
                del self._open[requester]
            link.state.pop(st.sid, None)
