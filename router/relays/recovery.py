"""Late join and OTR across routers, on trio: the side of the router behind the
advertisement (``lbmr-router(8)``, "Late join and OTR"; the sans-IO rewrite is
:mod:`router.core.recovery`, the receivers' side is :mod:`router.relays.uim_targets`).

A RECOVERY stream the peer opens for one of our advertisements carries one
receiver's late-join and OTR requests (LJI_REQ, UME_RXREQ UIMs) towards the
source behind it, and the source's answers back. :class:`RecoveryRelay`:

* refuses it when the source offers no request port (its TIR had no late-join,
  UME or extended-functionality option; ``recovery_refused_no_source``), when
  the port's address is not one to connect to on a TIR's word
  (:func:`router.core.message_addresses.deliverable_address`: not 0.0.0.0, multicast,
  broadcast, reserved, nor loopback unless the endpoint is;
  ``recovery_refused_source_address``), when
  no listener can be had (``recovery_refused_busy``), or when the source's
  request port cannot be reached (``recovery_source_unreachable``);
* else opens a listener of its own for the stream (one per stream, at the
  endpoint's request address, a port the system chooses; the
  :class:`router.core.request_maps.RequestMap` of the endpoint's relay bounds
  them: at most 256, and 64 answer connections each), connects to the
  source's request port (from the endpoint's address) and accepts;
* writes each request to the source with the source's transport index and
  that listener as answer address (:func:`router.core.recovery.to_source`);
  anything that is not such a request is dropped (``recovery_not_request``):
  a peer never makes us send a source anything else;
* takes the source's connections to the listener (its answers: UME_LJ_INFO,
  then RETRANS; a connection from another host is refused,
  ``recovery_answers_refused_stranger``), and sends their bytes, whole LBMC messages, on the stream,
  with the stream's credit; the receivers' router writes them to the
  receiver unchanged.

The end of the stream closes the listener, the source's connections and the
connection to the source.
"""

from __future__ import annotations

import math
import socket
from collections import Counter
from collections.abc import Callable

import trio

from lbmr_proto import lbmc, lbmc_stream

from .. import peerlink as P
from ..core.message_addresses import deliverable_address
from ..core.recovery import SourceRequestPort, answer_from_source, to_source
from ..core.request_maps import PassUnchanged, RequesterKey, RequestMap, RequestSlot
from ..link import CONNECT_TIMEOUT, Link, StreamState, return_credit
from ..peerlink import streams as S
from .interface import accept_stream, refuse_stream
from .unicast import STALL_TIMEOUT, connect_from, send_on_stream

__all__ = ["RecoveryRelay", "ANSWER_READ", "MAX_STREAMS"]

ANSWER_READ = 64 << 10  # bytes per read from the source's answer connection
MAX_STREAMS = 256  # RECOVERY streams served at once per endpoint and link (a listener and a connection each)
LISTEN_BACKLOG = 16


class RecoveryRelay:
    """The far side of RECOVERY streams for one endpoint's relay on one link
    (module doc). ``request_ip``: the endpoint's address (its listeners bind
    there, its connections to sources come from there); ``site``: the relay's
    site (where the source behind an advertisement takes requests)."""

    STREAM_KIND = P.StreamKind.RECOVERY

    def __init__(self, request_ip: str, counters: Counter[str], event: Callable[[str, str], None], site) -> None:
        self.request_ip = request_ip
        self.counters = counters
        self.event = event
        self.site = site
        # its own counters (listeners here are not requests'); a slot lives exactly as long as its
        # stream (forget_origin at its end), never expired to make room: its listener and
        # connection stay open until the stream ends, and so must its place in the bound
        self.map = RequestMap(max_listeners=MAX_STREAMS, idle_timeout=math.inf, counters=Counter())

    def open_far(self, link: Link, ev: S.StreamOpened, origin) -> None:
        """The peer opened RECOVERY stream ``ev`` for our advertisement ``ev.advert_id``."""
        st = link.state[ev.stream_id] = StreamState(ev.stream_id, ev.kind)
        st.advert_id = ev.advert_id
        source = self.site.advert_request_port(ev.advert_id)
        if source is None:
            self._refuse(link, st, "the source offers no late join", "recovery_refused_no_source")
            return
        if not deliverable_address(source.ip, self.request_ip):  # a TIR names it: a TRD's word only
            self._refuse(link, st, f"the source's request port {source.ip}:{source.port} is not an address "
                                   "to connect to", "recovery_refused_source_address")
            return
        if self.request_ip == "0.0.0.0":  # no address of ours to name as the answers' listener
            self._refuse(link, st, "no request address in this TRD", "recovery_refused_no_address")
            return
        now = trio.current_time()
        key = RequesterKey((id(link), ev.stream_id), ev.target.ip, ev.target.port)
        got = self.map.route(key, now)
        if isinstance(got, PassUnchanged):
            self._refuse(link, st, "no listener for the answers", "recovery_refused_busy")
            return
        sock = self._listen()
        if sock is None:
            self.map.listener_failed(now)
            self._refuse(link, st, "no listener for the answers", "recovery_refused_busy")
            return
        slot = self.map.add(key, sock.getsockname()[:2], now)
        link.nursery.start_soon(self._serve, link, st, source, slot, sock)

    def _refuse(self, link: Link, st: StreamState, reason: str, counter: str) -> None:
        self.counters[counter] += 1
        refuse_stream(link, st, reason, self.counters, self.event)
        link.state.pop(st.sid, None)

    def _listen(self):
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            raw.bind((self.request_ip, 0))
            raw.listen(LISTEN_BACKLOG)
        except OSError as e:
            raw.close()
            self.event("recovery_listener_failed", f"{self.request_ip}: {e}")
            return None
        return trio.socket.from_stdlib_socket(raw)

    async def _serve(self, link: Link, st: StreamState, source: SourceRequestPort, slot: RequestSlot,
                     sock) -> None:
        conn = None
        try:
            try:
                with trio.fail_after(CONNECT_TIMEOUT):
                    conn = await connect_from(self.request_ip, (source.ip, source.port))
            except (OSError, trio.TooSlowError) as e:
                self.counters["recovery_source_unreachable"] += 1
                refuse_stream(link, st, f"cannot connect to the source's request port {source.ip}:{source.port}: {e}",
                              self.counters, self.event)
                return
            if not accept_stream(link, st, self.counters):
                return
            self.counters["recovery_streams_accepted"] += 1
            async with trio.open_nursery() as n:
                n.start_soon(self._take_answers, link, st, source, slot, sock, n.cancel_scope)
                await self._requests(link, st, source, slot.listener, conn)
                n.cancel_scope.cancel()
        finally:
            sock.close()
            self.map.forget_origin(slot.key.origin)  # (its listener is ``sock``, closed above)
            link.close_stream(st)
            link.state.pop(st.sid, None)
            if conn is not None:
                await trio.aclose_forcefully(conn)

    async def _requests(self, link: Link, st: StreamState, source: SourceRequestPort,
                        listener: tuple[str, int], conn: trio.SocketStream) -> None:
        """The receiver's requests from the stream, rewritten, to the source; until
        the stream or the source's connection ends."""
        framer = lbmc_stream.StreamFramer()
        while True:
            while st.incoming:
                data = st.incoming.popleft()
                try:
                    raws = framer.feed(data)
                except lbmc.LbmcDecodeError as e:
                    self.counters["recovery_malformed"] += 1
                    self.event("recovery_malformed", f"RECOVERY stream {st.sid}: {e}")
                    return
                out = []
                for raw in raws:
                    try:
                        m = to_source(bytes(raw), source, listener)
                    except lbmc.LbmcDecodeError:
                        m = None
                    if m is None:
                        self.counters["recovery_not_request"] += 1
                    else:
                        out.append(m)
                if out:
                    with trio.move_on_after(STALL_TIMEOUT) as cs:
                        try:
                            await conn.send_all(b"".join(out))
                        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                            self.counters["recovery_source_gone"] += 1
                            return
                    if cs.cancelled_caught:
                        self.counters["recovery_source_stalled"] += 1
                        return
                    self.counters["recovery_requests_delivered"] += len(out)
                if not return_credit(link, st, len(data)):
                    return
            if st.closed or link.closed:
                return
            st.incoming_ready = trio.Event()
            await st.incoming_ready.wait()

    async def _take_answers(self, link: Link, st: StreamState, source: SourceRequestPort, slot: RequestSlot,
                            sock, scope: trio.CancelScope) -> None:
        """The source's connections to the stream's listener (from the source's host
        only): their messages, whole, on the stream (one at a time in each; several
        connections interleave whole messages). A stream that takes nothing for
        STALL_TIMEOUT ends."""
        listener = trio.SocketListener(sock)
        lock = trio.Lock()
        async with trio.open_nursery() as n:
            while True:
                try:
                    c = await listener.accept()
                except (trio.ClosedResourceError, OSError):
                    return
                if not answer_from_source(_peer_ip(c), source.ip):
                    self.counters["recovery_answers_refused_stranger"] += 1  # only the source answers
                    await trio.aclose_forcefully(c)
                    continue
                if not self.map.responder_connected(slot, trio.current_time()):
                    self.counters["recovery_answers_refused_busy"] += 1
                    await trio.aclose_forcefully(c)
                    continue
                n.start_soon(self._answer_connection, link, st, slot, c, lock, scope)

    async def _answer_connection(self, link: Link, st: StreamState, slot: RequestSlot, c: trio.SocketStream,
                                 lock: trio.Lock, scope: trio.CancelScope) -> None:
        framer = lbmc_stream.StreamFramer()
        try:
            while True:
                data = await c.receive_some(ANSWER_READ)
                if not data:
                    return
                try:
                    raws = framer.feed(data)
                except lbmc.LbmcDecodeError as e:
                    self.counters["recovery_malformed"] += 1
                    self.event("recovery_malformed", f"answer to RECOVERY stream {st.sid}: {e}")
                    return
                if not raws:
                    continue
                async with lock:
                    if not await send_on_stream(link, st, b"".join(bytes(r) for r in raws), STALL_TIMEOUT):
                        self.counters["recovery_answers_stalled"] += 1
                        scope.cancel()
                        return
                self.counters["recovery_answer_messages"] += len(raws)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.map.responder_closed(slot, trio.current_time())
            await trio.aclose_forcefully(c)


def _peer_ip(c: trio.SocketStream) -> str:
    try:
        return c.socket.getpeername()[0]
    except OSError:
        return ""
