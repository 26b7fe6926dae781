"""The router's data relay on trio: proxy listeners on the near side, connections
to the real sources on the far side, and the bytes and datagrams between them
and the peer link (per-stream credit from :mod:`router.peerlink.streams`).

Near side: a proxy (:meth:`Relay.serve_proxy`) listens at the relay address
for one of the peer's advertisements; TCP receivers share one stream of the
proxy on the current link (fan-out, :mod:`router.fanout_relay`), LBT-RU
receivers one LBT-RU proxy source (:mod:`router.lbtru_relay`), or, with
``fanout="off"``, every TCP connection opens a stream, as does every LBT-RU
receiver address. Far side: a stream the peer opens
(:meth:`Relay.stream_event`) joins the session's one connection to the real
source of our advertisement (fan-out) or connects to it; a source that cannot
be reached refuses the stream.

Over 600 lines because the near and far sides of TCP, LBT-RU and LBT-RM
relaying share the port pool, the stream states and the pumps.
"""

from __future__ import annotations

import socket
from collections import Counter, deque
from collections.abc import Callable, Iterator

import trio

from . import peerlink as P
from .core.tr import relay_transport
from .fanout_relay import FanoutRelay, Upstreams, accept_stream, refuse_stream
from .lbtrm_relay import LBTRM, RmRelay
from .lbtru_relay import RuSessionRelay, ru_socket, udp_raw
from .link import CONNECT_TIMEOUT, READ_SIZE, HeldChunk, Link, PipeSeg, StreamState
from .peerlink import streams as S
from .splice import splice

RU_BACKLOG = 64  # datagrams held per LBT-RU stream until the far side accepts
# LBT-RU streams (one per receiver address) end after this long with no datagram
# either way (UM's transport_lbtru_client_activity_timeout: a source forgets a
# receiver that stayed silent this long), and at most RU_MAX_STREAMS of them run
# on a link: the rest of the peer's stream table stays free for TCP receivers.
RU_IDLE_TIMEOUT = 10.0
RU_MAX_STREAMS = 1024
# A relay port given up by a proxy is not given to another proxy for this long
# (a TIR lives 60 s: receivers that resolved the old proxy may still connect),
# unless every other port of the range is taken.
PORT_QUARANTINE = 60.0


RU_BATCH = 64  # datagrams read from a relay socket at one wake-up
# Zero copy, sending: frames (pipes) of one stream queued for the writer at once (the pump
# fills the next while the writer writes one).
TX_DEPTH = 2


def drain(raw, receive) -> tuple[list, OSError | None]:
    """What ``receive()`` (a non-blocking read of ``raw``) returns at once, at
    most RU_BATCH times; and the error that stopped it, if any."""
    out = []
    for _ in range(RU_BATCH):
        try:
            out.append(receive(65535))
        except (BlockingIOError, InterruptedError):
            return out, None
        except OSError as e:
            return out, e
    return out, None


class PortPool:
    """Relay ports in use and in quarantine, shared by every link of one endpoint
    portal (their proxies bind in the same range: a port one gives up stays in
    quarantine for all of them); and the portal's upstream TCP and LBT-RU
    sessions (one connection to each origin session, whichever link's
    streams it feeds)."""

    def __init__(self) -> None:
        self.released: dict[int, float] = {}  # relay port -> when its proxy gave it up
        self.in_use: set[int] = set()  # relay ports our proxies hold
        self.upstreams = Upstreams()
        self.ru_upstreams = Upstreams()


class Relay:
    """The data relay of one endpoint on one link. ``endpoint``: its settings
    (``relay_ip``, ``relay_port_low``/``high``); ``counters`` and ``event(kind,
    detail)``: the router's counters and event log; ``site``: the router
    around it (:class:`router.relay_site.RelaySite`: the link up now, the
    sources behind our advertisements, our proxies' live advertisements, and
    where a session's end is reported)."""

    def __init__(self, endpoint, counters: Counter[str], event: Callable[[str, str], None], site) -> None:
        self.endpoint = endpoint
        self.site = site
        self.counters = counters
        self.event = event
        self.ru_idle_timeout = getattr(endpoint, "ru_idle_timeout", RU_IDLE_TIMEOUT)
        self.ru_max_streams = getattr(endpoint, "ru_max_streams", RU_MAX_STREAMS)
        self.port_quarantine = getattr(endpoint, "relay_port_quarantine", PORT_QUARANTINE)
        self._released: dict[int, float] = {}  # relay port -> when its proxy gave it up
        self._next_port = 0  # where the round robin over the range goes on
        self._in_use: set[int] = set()  # relay ports our proxies hold
        self.lbtrm = RmRelay(endpoint, counters, event, site)  # LBT-RM proxies and sources
        # TCP sessions: fanned out (one source connection per router, one stream per
        # proxy per link) unless the endpoint says fanout="off"
        self.fanout = FanoutRelay(endpoint, counters, event, site, Upstreams()) \
            if getattr(endpoint, "fanout", True) else None
        # LBT-RU sessions: fanned out likewise (one upstream receiver per router, one proxy
        # source per proxy) unless fanout="off" or the peer does not know LBTRU_SESSION
        self.rufan = RuSessionRelay(endpoint, counters, event, site, Upstreams(),
                                    self.lbtrm.window_budget)

    def share_ports(self, pool: PortPool) -> None:
        """Use ``pool``'s in-use and quarantine tables and upstream sessions
        (shared with other relays)."""
        self._released = pool.released
        self._in_use = pool.in_use
        if self.fanout is not None:
            self.fanout.upstreams = pool.upstreams
        self.rufan.upstreams = pool.ru_upstreams

    def relay_ports(self) -> Iterator[int]:
        """The relay ports to try, in order: round robin over the range from the
        one after the last taken, ports out of quarantine first, then the
        quarantined ones, longest released first. Lazy, and the quarantine is
        kept in release order, so taking a port costs about the ports skipped,
        not the size of the range (thousands of proxies bind one after the other)."""
        e = self.endpoint
        if e.relay_port_low == 0:
            yield 0
            return
        cutoff = trio.current_time() - self.port_quarantine
        released = self._released
        while released:  # oldest first: end of quarantine
            port, t = next(iter(released.items()))
            if t > cutoff:
                break
            del released[port]
        ports = range(e.relay_port_low, e.relay_port_high + 1)
        k = self._next_port % len(ports)
        for i in range(len(ports)):
            p = ports[(k + i) % len(ports)]
            if p not in released and p not in self._in_use:
                yield p
        yield from [p for p in released if p in ports]

    async def serve_proxy(self, f: P.Advertisement, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """A proxy source (proxy id: the advert id of ``f``): a listener at the
        relay address for the peer's advertisement ``f`` (and the other topics
        of its transport session). Reports its (ip, port) through
        ``task_status`` once bound (None when no relay port is free; it then
        returns), then relays every receiver that connects (TCP) or registers
        (LBT-RU). A new stream names the advert id the site gives for the
        proxy (a live advertisement of the session; None: the receiver is
        refused)."""
        e = self.endpoint
        tcp = f.transport == 0x00
        sock = self._bind_relay(tcp)
        if sock is None:
            self.counters["relay_ports_exhausted"] += 1
            self.event("relay_ports_exhausted", f"no free relay port for {f.topic}")
            task_status.started(None)
            return
        bound = sock.getsockname()[1]
        try:
            await self._serve_proxy_socket(f, sock, tcp, task_status)
        finally:
            self._in_use.discard(bound)
            if e.relay_port_low:
                self._released.pop(bound, None)  # to the end: the dict is in release order
                self._released[bound] = trio.current_time()

    def _bind_relay(self, tcp: bool):
        """A listener (TCP) or socket (LBT-RU) bound at the relay address on the
        first port of :meth:`relay_ports` that is free, or None. Synchronous:
        proxies started together never race for the same port (the bind storm
        of a thousand proxies on one port after the other took 30 s)."""
        e = self.endpoint
        for port in self.relay_ports():
            if port in self._in_use:
                continue
            raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM) if tcp else udp_raw()
            try:
                if tcp:
                    raw.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                raw.bind((e.relay_ip, port))
            except OSError:
                raw.close()
                continue
            bound = raw.getsockname()[1]
            self._in_use.add(bound)
            if e.relay_port_low:
                if self._released.pop(bound, None) is not None:
                    self.counters["relay_port_quarantine_cut"] += 1
                self._next_port = bound - e.relay_port_low + 1
            return trio.socket.from_stdlib_socket(raw) if tcp else ru_socket(raw)
        return None

    def proxy_transport(self, f: P.Advertisement, address):
        """The transport a proxy for ``f`` bound at ``address`` advertises: the
        relay address (with the origin's session id when the peer said it: the
        proxy's receivers get the origin's session), and for LBT-RM the proxy's
        group, port and session id."""
        body = self.lbtrm.proxy_body(f.advert_id) if f.transport == LBTRM else self.rufan.bodies.get(f.advert_id)
        if body is not None:
            return body
        return relay_transport(f.transport, address[0], address[1], f.origin_session_id or None)

    async def _serve_proxy_socket(self, f: P.Advertisement, sock, tcp: bool, task_status) -> None:
        pid = f.advert_id
        if f.transport == LBTRM:
            with sock:
                await self.lbtrm.serve_proxy(f, sock, task_status)
            return
        if not tcp and self.fanout is not None and self.rufan.wants(self.site.link):
            with sock:
                await self.rufan.serve_proxy(f, sock, task_status)
            return
        with sock:
            if tcp:
                sock.listen(64)
            task_status.started(sock.getsockname())
            if tcp and self.fanout is not None:
                await self.fanout.serve_tcp(sock, pid)
            elif tcp:
                listener = trio.SocketListener(sock)
                async with trio.open_nursery() as n:
                    while True:
                        conn = await listener.accept()
                        n.start_soon(self._near_tcp, pid, conn)
            else:
                await self._near_ru(pid, sock)

    async def _near_tcp(self, proxy_id: int, conn) -> None:
        link = self.site.link
        aid = self.site.proxy_advert(proxy_id)
        if link is None or aid is None:
            await conn.aclose()
            return
        sid = link.streams.open(aid, P.StreamKind.TCP)
        st = link.state[sid] = StreamState(sid, P.StreamKind.TCP)
        st.sock = conn
        link.flush_streams()
        self.counters["streams_opened"] += 1
        try:
            await self._pump(link, st)
        finally:
            await trio.aclose_forcefully(conn)

    async def _near_ru(self, proxy_id: int, sock) -> None:
        """Datagrams from receivers of this proxy: one stream per receiver address
        (at most ``ru_max_streams`` on the link; each ends after ``ru_idle_timeout``
        of silence either way)."""
        by_addr: dict[tuple[str, int], StreamState] = {}
        async with trio.open_nursery() as n:
            while True:
                try:
                    first = await sock.recvfrom(65535)
                except OSError:  # an ICMP error from a receiver that went away
                    self.counters["ru_recv_error"] += 1
                    await trio.sleep(0.01)
                    continue
                more, _ = drain(sock.raw, sock.raw.recvfrom)
                link = self.site.link
                if link is None:
                    continue
                now = trio.current_time()
                batches: dict[StreamState, list[bytes]] = {}
                for data, addr in [first, *more]:
                    st = by_addr.get(addr)
                    if st is None or st.closed:
                        if link.ru_streams >= self.ru_max_streams:
                            self.counters["ru_streams_full"] += 1
                            continue
                        aid = self.site.proxy_advert(proxy_id)
                        if aid is None:
                            continue
                        sid = link.streams.open(aid, P.StreamKind.LBTRU)
                        st = link.state[sid] = StreamState(sid, P.StreamKind.LBTRU)
                        st.ru_addr = addr
                        st.sock = sock
                        st.owns_sock = False  # the proxy's: closing it would kill the proxy's reader
                        by_addr[addr] = st
                        link.ru_streams += 1
                        self.counters["ru_streams_opened"] += 1
                        n.start_soon(self._ru_downstream, link, st, by_addr)
                    st.last_active = now
                    if st.accepted.is_set():
                        batches.setdefault(st, []).append(data)
                    elif len(st.incoming) < RU_BACKLOG:
                        st.incoming.append(data)  # held until accepted (then sent in order)
                for st, batch in batches.items():
                    self._send_datagrams(link, st, batch)
                link.flush_streams()

    def _send_datagrams(self, link: Link, st: StreamState, batch: list[bytes]) -> None:
        """Datagrams of one stream to the peer as one queued batch (flush_streams to send)."""
        try:
            link.streams.send_datagrams(st.sid, batch)
        except S.LocalStreamError:
            self.counters["ru_send_closed"] += len(batch)

    async def _ru_downstream(self, link: Link, st: StreamState, by_addr: dict) -> None:
        """Near LBT-RU: when accepted flush the backlog; then datagrams from the
        far source go to the receiver from the proxy socket, until the stream
        ends or stays idle for ``ru_idle_timeout``."""
        try:
            await st.accepted.wait()
            if st.refused is not None or st.closed:
                return
            held = list(st.incoming)
            st.incoming.clear()
            if held:
                self._send_datagrams(link, st, held)
                link.flush_streams()
            addr = st.ru_addr
            await self._ru_deliver(link, st, lambda d: st.sock.raw.sendto(d, addr),
                                   lambda d: st.sock.sendto(d, addr))
        finally:
            self._end_ru(link, st)
            if by_addr.get(st.ru_addr) is st:
                del by_addr[st.ru_addr]

    async def _ru_deliver(self, link: Link, st: StreamState, send_now, send) -> None:
        """Pass an LBT-RU stream's datagrams from the peer on with
        ``send_now(data)`` (non-blocking; ``await send(data)`` when the socket's
        buffer is full) until the stream or the link ends, or no datagram
        crossed either way for ``ru_idle_timeout``."""
        while not st.closed and not link.closed:
            with trio.move_on_at(st.last_active + self.ru_idle_timeout):
                await st.incoming_ready.wait()
            if not st.incoming_ready.is_set():
                if trio.current_time() >= st.last_active + self.ru_idle_timeout:
                    self.counters["ru_streams_idle"] += 1
                    return
                continue  # the other direction was active meanwhile
            st.incoming_ready = trio.Event()
            if st.incoming:
                st.last_active = trio.current_time()
            while st.incoming:
                data = st.incoming.popleft()
                try:
                    send_now(data)
                except BlockingIOError:
                    try:
                        await send(data)
                    except OSError:
                        self.counters["ru_send_error"] += 1
                except OSError:
                    self.counters["ru_send_error"] += 1

    def _end_ru(self, link: Link, st: StreamState) -> None:
        """An LBT-RU stream ends (idle, refused, closed by the peer or the link)."""
        st.closed = True
        if link.state.get(st.sid) is st and st.ru_addr is not None:
            link.ru_streams -= 1
        link.close_stream(st)


    # ------------------------------------------------- far side: sources

    def stream_event(self, link: Link, ev) -> None:
        st = link.state.get(ev.stream_id)
        if isinstance(ev, S.StreamOpened):
            body = self.site.advert_source(ev.advert_id)
            if body is None:
                link.streams.refuse(ev.stream_id, P.RefuseCode.REFUSED, "unknown or withdrawn advertisement")
                self.counters["streams_refused"] += 1
                return
            if ev.kind == LBTRM:
                self.lbtrm.open_far(link, ev, body)
                return
            if ev.kind == P.StreamKind.TCP and self.fanout is not None:
                self.fanout.open_far(link, ev, body)
                return
            if ev.kind == P.StreamKind.LBTRU_SESSION:
                self.rufan.open_far(link, ev, body)
                return
            if ev.kind == P.StreamKind.LBTRU and link.ru_streams_far >= self.ru_max_streams:
                link.streams.refuse(ev.stream_id, P.RefuseCode.TOO_MANY_STREAMS,
                                    f"{link.ru_streams_far} LBT-RU streams already open")
                self.counters["ru_streams_full"] += 1
                return
            st = link.state[ev.stream_id] = StreamState(ev.stream_id, ev.kind)
            st.advert_id = ev.advert_id
            link.nursery.start_soon(self._far, link, st, body)
        elif st is None:
            return
        elif isinstance(ev, S.StreamAccepted):
            st.accepted.set()
            st.credit.set()
        elif isinstance(ev, S.StreamRefused):
            st.refused = ev.reason or "refused"
            st.closed = True
            st.accepted.set()
            st.wake()
        elif isinstance(ev, S.DataReceived | S.DatagramReceived):
            st.incoming.append(ev.data)
            st.incoming_ready.set()
        elif isinstance(ev, S.CreditAvailable):
            st.credit.set()
        elif isinstance(ev, S.StreamClosed):
            st.closed = True
            st.wake()

    async def _far(self, link: Link, st: StreamState, body) -> None:
        try:
            if st.kind == P.StreamKind.TCP:
                try:
                    with trio.fail_after(CONNECT_TIMEOUT):
                        conn = await trio.open_tcp_stream(body.ip, body.port)
                except (OSError, trio.TooSlowError) as e:
                    refuse_stream(link, st, f"cannot connect to the source {body.ip}:{body.port}: {e}",
                                  self.counters, self.event)
                    if isinstance(e, ConnectionRefusedError):
                        self.site.session_ended(st.advert_id)
                    return
                st.sock = conn
                if not accept_stream(link, st, self.counters):
                    await trio.aclose_forcefully(conn)
                    return
                try:
                    await self._pump(link, st)
                finally:
                    await trio.aclose_forcefully(conn)
                if st.source_ended:
                    self.site.session_ended(st.advert_id)
            else:
                s = ru_socket()
                try:
                    await s.bind((self.endpoint.relay_ip, 0))
                    await s.connect((body.ip, body.port))
                except OSError as e:
                    s.close()
                    refuse_stream(link, st, f"cannot reach the source {body.ip}:{body.port}: {e}",
                                  self.counters, self.event)
                    return
                link.ru_streams_far += 1
                try:
                    with s:
                        st.sock = s
                        if not accept_stream(link, st, self.counters):
                            return
                        st.last_active = trio.current_time()
                        async with trio.open_nursery() as n:
                            n.start_soon(self._far_ru_up, link, st)
                            await self._ru_deliver(link, st, s.raw.send, s.send)
                            n.cancel_scope.cancel()
                finally:
                    link.ru_streams_far -= 1
                    self._end_ru(link, st)
        finally:
            link.state.pop(st.sid, None)

    async def _far_ru_up(self, link: Link, st: StreamState) -> None:
        """Datagrams from the LBT-RU source to the peer, a batch at a time."""
        while True:
            try:
                batch = [await st.sock.recv(65535)]
                more, err = drain(st.sock.raw, st.sock.raw.recv)
                batch += more
            except OSError as e:
                batch, err = [], e
            if batch:
                st.last_active = trio.current_time()
                self._send_datagrams(link, st, batch)
                link.flush_streams()
            if err is not None:  # e.g. ICMP port unreachable from a source that went away
                self.counters["ru_recv_error"] += 1
                if isinstance(err, ConnectionRefusedError) and not st.source_ended:
                    st.source_ended = True
                    self.site.session_ended(st.advert_id)
                await trio.sleep(0.01)

    # ------------------------------------------------------- byte pumping

    async def _pump(self, link: Link, st: StreamState) -> None:
        """Both directions of a TCP stream; returns when either side ends.
        The stream is closed towards the peer however it ends (even cancelled)."""
        link.pipes.stream_started()
        try:
            async with trio.open_nursery() as n:
                n.start_soon(self._pump_up, link, st, n.cancel_scope)
                n.start_soon(self._pump_down, link, st, n.cancel_scope)
        finally:
            link.close_stream(st)
            link.pipes.stream_ended()

    async def _pump_up(self, link: Link, st: StreamState, scope) -> None:
        """Socket -> peer link, within the stream's credit and the queue's space."""
        await st.accepted.wait()
        if st.refused is not None:
            scope.cancel()
            return
        if link.zero_copy and isinstance(st.sock, trio.SocketStream):
            if await self._pump_up_spliced(link, st):
                scope.cancel()
            return
        pending = b""
        while True:
            if st.closed or link.closed:
                return  # the peer ended the stream: _pump_down delivers what is left, then ends it
            if not pending:
                try:
                    pending = await st.sock.receive_some(READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pending = b""
                if not pending:
                    st.source_ended = True  # EOF from the local side (the far side: the source)
                    break
            st.credit = trio.Event()  # before trying: a grant arriving after it wakes us
            try:
                rest = link.streams.send(st.sid, pending, limit=link.outq.data_space())
            except S.LocalStreamError:
                return  # closed meanwhile: _pump_down finishes the stream
            link.flush_streams()
            if len(rest) == len(pending):
                await st.credit.wait()
            pending = bytes(rest)
        scope.cancel()

    async def _pump_up_spliced(self, link: Link, st: StreamState) -> bool:
        """Zero copy, socket -> peer link: splice what the socket holds (up to the credit,
        the queue's space and a frame) into a pipe, queue it as one HeldData frame, wait
        until the writer has written it, again. True at end of file from the socket, False
        when the stream or the link was closed."""
        sock = st.sock.socket
        inflight: deque[HeldChunk] = deque()  # queued, not yet written by the writer
        while True:
            if st.closed or link.closed:
                return False
            st.credit = trio.Event()  # before looking: a wake-up after it is not lost
            while inflight and inflight[0].done:
                inflight.popleft()
            if len(inflight) >= TX_DEPTH:
                await st.credit.wait()  # the writer has not written them yet
                continue
            room = min(link.streams.send_credit(st.sid), link.streams.max_frame,
                       link.outq.data_space() - S.STREAM_DATA_OVERHEAD)
            if room <= 0:
                await st.credit.wait()
                continue
            pipe = link.pipes.acquire()
            if pipe is None:  # no pipe free: one read on the copy path
                try:
                    data = await st.sock.receive_some(min(room, READ_SIZE))
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    data = b""
                if not data:
                    st.source_ended = True
                    return True
                try:
                    link.streams.send(st.sid, data, limit=link.outq.data_space())
                except S.LocalStreamError:
                    return False
                link.flush_streams()
                continue
            try:
                k = splice(sock.fileno(), pipe.w, min(room, pipe.capacity))
            except (BlockingIOError, InterruptedError):
                link.pipes.release(pipe)
                try:
                    await trio.lowlevel.wait_readable(sock)
                except (trio.ClosedResourceError, OSError):
                    return True
                continue
            except OSError:  # reset by the source or receiver: as end of file
                k = 0
            if k == 0:
                link.pipes.release(pipe)
                st.source_ended = True
                return True
            pipe.held = k
            chunk = HeldChunk(pipe)
            inflight.append(chunk)
            try:
                link.streams.send_held(st.sid, k, chunk)
            except S.LocalStreamError:
                chunk.done = True
                link.pipes.release(pipe)
                return False
            link.flush_streams(direct=True)

    async def _pump_down(self, link: Link, st: StreamState, scope) -> None:
        """Peer link -> socket; consumed bytes are returned to the peer as credit. The
        items of ``st.incoming`` are bytes or read-only views of them (copy path) or
        :class:`PipeSeg` (zero copy),
        in order; an item stays at the head until all its bytes went (the link's reader
        passes pipe bytes on itself when the socket takes them, :meth:`Link.forward`)."""
        while True:
            while st.incoming:
                if type(st.incoming[0]) is PipeSeg:
                    if not await self._splice_down(link, st):
                        scope.cancel()
                        return
                    continue
                data = st.incoming[0]
                try:
                    await st.sock.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    scope.cancel()
                    return
                st.incoming.popleft()
                try:
                    link.streams.consumed(st.sid, len(data))
                except S.LocalStreamError:
                    pass
                link.flush_streams()
            if st.closed or link.closed:
                scope.cancel()
                return
            await st.incoming_ready.wait()
            st.incoming_ready = trio.Event()

    @staticmethod
    async def _splice_down(link: Link, st: StreamState) -> bool:
        """The pipe segments at the head of ``st.incoming`` into the stream's socket,
        waiting for it as needed; False if that cannot be done (the receiver went away,
        the link is gone and took the pipes)."""
        sock = st.sock.socket
        while st.incoming and type(st.incoming[0]) is PipeSeg:
            if link.forward(st):
                return True
            if st.sink_broken:
                return False
            try:
                await trio.lowlevel.wait_writable(sock)
            except (trio.ClosedResourceError, OSError):
                return False
        return True
