"""Unicast immediate messages routed by domain, on trio (``lbmr-router(8)``,
"Unicast immediate messages by domain"; the decisions are
:class:`router.core.uim.UimPath`'s, this module only moves bytes).

* **Request listeners** (:meth:`UimRelay.serve_listener`, a task per endpoint
  with ``<request-tcp>``, a task per accepted connection): the connection is
  consecutive LBMC messages framed by ``msglen``, read in chunks of
  :data:`READ_CHUNK` bytes and cut without copying
  (:class:`lbmr_proto.lbmc_stream.StreamFramer`); each whole message goes to
  :meth:`UimPath.message` and what it decides is done at once, never
  waiting: a message is queued for its target or dropped, counted.
* **Targets** (:class:`router.relays.uim_targets.UimTargets`, a task each):
  a destination in one of our TRDs (one TCP connection), one behind a peer
  link (one UIM_ROUTED stream), or the source of a proxy for late-join and
  OTR requests (one RECOVERY stream, the answers back to the receiver), each
  with a bounded queue.
* **UIM_ROUTED streams the peer opens** (:meth:`UimRelay.open_far`):
  refused at once when :meth:`UimPath.open_stream` says so, else accepted;
  their bytes are framed and each message decided like a listener's.

Bounds per input (all counted in :attr:`UimRelay.counters`): connections per
listener (:data:`MAX_CONNECTIONS`) and in all (:data:`MAX_CONNECTIONS_TOTAL`);
bytes held per connection (one incomplete message, < 64 KiB, plus one
read); a message not completed within :data:`MESSAGE_TIMEOUT` seconds; a
connection silent for :data:`IDLE_TIMEOUT`; UIM_ROUTED streams the peer has
open on a link (:data:`MAX_FAR_STREAMS`); targets
(:data:`router.relays.uim_targets.MAX_TARGETS`).
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import trio

from .. import peerlink as P
from ..core.uim import UimAction, UimPath, UimStream
from ..link import Link, StreamState, return_credit
from ..peerlink import streams as S
from .interface import accept_stream
from .uim_targets import MAX_TARGETS, UimTargets
from .unicast import READ_CHUNK, UimFramer

__all__ = ["UimRelay", "MAX_CONNECTIONS", "MAX_CONNECTIONS_TOTAL", "IDLE_TIMEOUT",
           "MESSAGE_TIMEOUT", "LISTEN_BACKLOG", "MAX_FAR_STREAMS"]

MAX_CONNECTIONS = 64  # senders' connections at once on one request listener
MAX_CONNECTIONS_TOTAL = 1024  # and on all of them
IDLE_TIMEOUT = 60.0  # seconds a sender's connection may stay silent
MESSAGE_TIMEOUT = 10.0  # seconds a started message has to complete
MAX_FAR_STREAMS = MAX_TARGETS  # UIM_ROUTED streams a peer has open to us at once on one link (its MAX_TARGETS)
LISTEN_BACKLOG = 64
DECIDE_BATCH = 1024  # messages decided before the other tasks run


class UimRelay:
    """The UIM data path of one router. ``path``: the decisions; ``bind_ips``:
    endpoint name -> the address its deliveries connect from ("0.0.0.0": the
    system's choice); ``links``: link name -> the link task of each peer link
    (its ``link``: the connection up now, or None); ``routing``: whose
    ``links()`` names the router at the other end of each connected link.
    ``event(kind, detail)``: the router's log. What the path decides to pass on
    goes to its targets (:class:`router.relays.uim_targets.UimTargets`)."""

    def __init__(self, path: UimPath, bind_ips: dict[str, str], links: dict, routing,
                 event: Callable[[str, str], None]) -> None:
        self.path = path
        self.counters = path.counters
        self.event = event
        self.targets = UimTargets(bind_ips, links, routing, self.counters, event)
        self.connections = 0  # senders' connections open on all listeners
        self._far_streams: dict[int, int] = {}  # id(link) -> UIM_ROUTED streams the peer has open on it

    @property
    def nursery(self) -> trio.Nursery | None:
        """The router's nursery, where the targets run (None: no target is started)."""
        return self.targets.nursery

    @nursery.setter
    def nursery(self, nursery: trio.Nursery | None) -> None:
        self.targets.nursery = nursery

    @property
    def target_count(self) -> int:
        """Destinations with a connection or stream (or waiting for one) now."""
        return len(self.targets)

    @property
    def queued(self) -> int:
        """Bytes queued for all targets."""
        return self.targets.queued

    @property
    def recovering(self) -> int:
        """Late-join/OTR destinations (RecoverMessage targets) now."""
        return self.targets.recovering

    def take(self, action: UimAction) -> None:
        """Do what the path decided, at once (:meth:`UimTargets.take`): never waits."""
        self.targets.take(action)

    # ------------------------------------------------------------ listeners

    async def serve_listener(self, endpoint: str, address: tuple[str, int], *,
                             task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Endpoint ``endpoint``'s request listener at ``address``: reports the bound
        address, then takes senders until cancelled."""
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            raw.bind(address)
            raw.listen(LISTEN_BACKLOG)
        except OSError:
            raw.close()
            raise
        sock = trio.socket.from_stdlib_socket(raw)
        listener = trio.SocketListener(sock)
        live = 0
        task_status.started(raw.getsockname()[:2])
        async with listener, trio.open_nursery() as n:
            while True:
                try:
                    conn = await listener.accept()
                except OSError as e:  # descriptors run out: keep the others going
                    self.counters["uim_accept_failed"] += 1
                    self.event("uim_accept_failed", f"{endpoint}: {e}")
                    await trio.sleep(0.1)
                    continue
                if live >= MAX_CONNECTIONS or self.connections >= MAX_CONNECTIONS_TOTAL:
                    self.counters["uim_connections_refused"] += 1
                    await trio.aclose_forcefully(conn)
                    continue
                live += 1
                self.connections += 1
                self.counters["uim_connections"] += 1

                async def one(conn=conn):
                    nonlocal live
                    try:
                        await self.serve_connection(conn, endpoint)
                    finally:
                        live -= 1
                        self.connections -= 1

                n.start_soon(one)

    async def serve_connection(self, conn: trio.abc.Stream, endpoint: str) -> None:
        """One sender's connection ``conn`` to endpoint ``endpoint``'s listener, until it
        ends: whole messages decided one by one; a malformed stream, a message not
        completed MESSAGE_TIMEOUT seconds after its first byte, or IDLE_TIMEOUT seconds
        of silence close it (counted)."""
        framer = UimFramer()
        started = None  # when the message held incomplete began
        try:
            while True:
                now = trio.current_time()
                until = now + IDLE_TIMEOUT
                if started is not None:
                    until = min(until, started + MESSAGE_TIMEOUT)
                timeout = "uim_connections_idle" if started is None or until < started + MESSAGE_TIMEOUT \
                    else "uim_message_timeout"
                with trio.move_on_at(until) as cs:
                    data = await conn.receive_some(READ_CHUNK)
                if cs.cancelled_caught:
                    self.counters[timeout] += 1
                    return
                if not data:
                    if framer.buffered:
                        self.counters["uim_truncated"] += 1
                    return
                runs, error = framer.cut(data)
                await self._runs(runs, None, endpoint)
                if error is not None:
                    self.counters["uim_malformed"] += 1
                    self.event("uim_malformed", f"stream offset {error.offset}: {error.reason}")
                    return
                if not framer.buffered:
                    started = None
                elif runs or started is None:
                    started = trio.current_time()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await trio.aclose_forcefully(conn)

    async def _runs(self, runs: list, stream: UimStream | None, endpoint: str | None) -> None:
        """Decide and do each message of ``runs``, letting the other tasks run every
        DECIDE_BATCH messages (a chunk of tiny messages holds the loop no longer)."""
        message, take = self.path.message, self.targets.take
        k = 0
        for run in runs:
            data, start = run.data, 0
            for end in run.ends:
                take(message(data[start:end], stream, endpoint=endpoint))
                start = end
                k += 1
                if k % DECIDE_BATCH == 0:
                    await trio.lowlevel.checkpoint()

    # ------------------------------------------------------------ streams the peer opens

    def open_far(self, link: Link, ev: S.StreamOpened, came_from: str | None) -> None:
        """The peer on ``link`` (router ``came_from``) opened UIM_ROUTED stream ``ev``:
        refused beyond MAX_FAR_STREAMS open on the link (counted ``uim_streams_refused_busy``)."""
        tgt = ev.target
        if self._far_streams.get(id(link), 0) >= MAX_FAR_STREAMS:
            self.counters["uim_streams_refused_busy"] += 1
            link.streams.refuse(ev.stream_id, P.RefuseCode.REFUSED, f"{MAX_FAR_STREAMS} UIM_ROUTED streams open")
            link.flush_streams()
            return
        target = UimStream(tgt.domain_id, tgt.ip, tgt.port, tgt.hops, came_from)
        refusal = self.path.open_stream(target)
        if refusal is not None:
            self.counters[refusal.reason.counter] += 1
            self.event("uim_stream_refused", f"{tgt.domain_id}:{tgt.ip}:{tgt.port} from {came_from}: {refusal.detail}")
            link.streams.refuse(ev.stream_id, P.RefuseCode.REFUSED, refusal.detail)
            link.flush_streams()
            return
        st = link.state[ev.stream_id] = StreamState(ev.stream_id, ev.kind)
        if not accept_stream(link, st, self.counters):
            link.state.pop(ev.stream_id, None)
            return
        self._far_streams[id(link)] = self._far_streams.get(id(link), 0) + 1
        link.nursery.start_soon(self._far, link, st, target)

    async def _far(self, link: Link, st: StreamState, target: UimStream) -> None:
        """A UIM_ROUTED stream the peer opened, until it ends: whole messages decided
        one by one; a malformed stream, a message not completed MESSAGE_TIMEOUT seconds
        after its first byte, or IDLE_TIMEOUT seconds of silence close it (counted),
        as a sender's connection to a listener."""
        framer = UimFramer()
        started = None  # when the message held incomplete began
        try:
            while True:
                while st.incoming:
                    data = st.incoming.popleft()
                    runs, error = framer.cut(data)
                    await self._runs(runs, target, None)
                    if error is not None:
                        self.counters["uim_malformed"] += 1
                        self.event("uim_malformed", f"UIM_ROUTED stream {st.sid}: offset {error.offset}: "
                                                    f"{error.reason}")
                        return
                    if not framer.buffered:
                        started = None
                    elif runs or started is None:
                        started = trio.current_time()
                    return_credit(link, st, len(data))
                    await trio.lowlevel.checkpoint()
                if st.closed or link.closed:
                    return
                st.incoming_ready = trio.Event()
                until = trio.current_time() + IDLE_TIMEOUT
                if started is not None:
                    until = min(until, started + MESSAGE_TIMEOUT)
                with trio.move_on_at(until) as cs:
                    await st.incoming_ready.wait()
                if cs.cancelled_caught:
                    self.counters["uim_message_timeout" if started is not None else "uim_streams_idle"] += 1
                    return
        finally:
            n = self._far_streams.get(id(link), 0) - 1
            if n > 0:
                self._far_streams[id(link)] = n
            else:
                self._far_streams.pop(id(link), None)
            link.close_stream(st)
