"""One peer-link stream per LBT-RU receiver address, on trio (the LBT-RU
relay of an endpoint with ``fanout="off"``, or of a link whose peer does not
know LBT-RU sessions; fanned-out LBT-RU is :mod:`router.relays.lbtru_fanout`).

Near side: the datagrams that arrive at a proxy's socket open one stream per
receiver address (at most ``ru_max_streams`` on the link), held until the far
side accepts; datagrams of the stream from the peer go back to the receiver
from the proxy's socket. Far side: a stream the peer opens gets a socket
connected to the real source. A stream ends after ``ru_idle_timeout`` seconds
with no datagram either way.
"""

from __future__ import annotations

import socket

import trio

from .. import peerlink as P
from ..link import Link, StreamState
from ..peerlink import streams as S
from .interface import RelayContext, RelaySettings, TransportRelay, accept_stream, refuse_stream
from .lbtru_fanout import ru_socket

RU_BACKLOG = 64  # datagrams held per LBT-RU stream until the far side accepts
# LBT-RU streams (one per receiver address) end after this long with no datagram
# either way (UM's transport_lbtru_client_activity_timeout: a source forgets a
# receiver that stayed silent this long), and at most RU_MAX_STREAMS of them run
# on a link: the rest of the peer's stream table stays free for TCP receivers
# (the endpoint's ru_idle_timeout and ru_max_streams; these are their defaults).
RU_IDLE_TIMEOUT = RelaySettings().ru_idle_timeout
RU_MAX_STREAMS = RelaySettings().ru_max_streams
RU_BATCH = 64  # datagrams read from a relay socket at one wake-up


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


class RuStreamRelay(TransportRelay):
    """LBT-RU receivers relayed one stream per address, for one endpoint on one
    link (:class:`router.relays.interface.TransportRelay`); of the settings,
    ``relay_ip``, ``ru_idle_timeout`` (seconds) and ``ru_max_streams``."""

    SOCKET_TYPE = socket.SOCK_DGRAM
    STREAM_KIND = P.StreamKind.LBTRU

    def __init__(self, context: RelayContext) -> None:
        super().__init__(context)
        self.ru_idle_timeout = self.settings.ru_idle_timeout
        self.ru_max_streams = self.settings.ru_max_streams

    # ------------------------------------------------- near side: receivers

    async def serve_proxy(self, advert: P.Advertisement, sock, task_status) -> None:
        """Near side: datagrams from receivers of the proxy of ``advert`` at
        its ``sock`` (until cancelled): one stream per receiver address
        (at most ``ru_max_streams`` on the link; each ends after ``ru_idle_timeout``
        of silence either way)."""
        task_status.started(sock.getsockname())
        proxy_id = advert.advert_id
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
                        n.start_soon(self._downstream, link, st, by_addr)
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

    async def _downstream(self, link: Link, st: StreamState, by_addr: dict) -> None:
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
            await self._deliver(link, st, lambda d: st.sock.raw.sendto(d, addr),
                                lambda d: st.sock.sendto(d, addr))
        finally:
            self._end(link, st)
            if by_addr.get(st.ru_addr) is st:
                del by_addr[st.ru_addr]

    async def _deliver(self, link: Link, st: StreamState, send_now, send) -> None:
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

    def _end(self, link: Link, st: StreamState) -> None:
        """An LBT-RU stream ends (idle, refused, closed by the peer or the link)."""
        st.closed = True
        if link.state.get(st.sid) is st and st.ru_addr is not None:
            link.ru_streams -= 1
        link.close_stream(st)

    # ------------------------------------------------- far side: sources

    def open_far(self, link: Link, ev: S.StreamOpened, origin) -> None:
        """Far side: the peer opened stream ``ev`` for the LBT-RU source ``origin``
        (its ip and port): refused when ``ru_max_streams`` LBT-RU streams are
        open on the link already, else a socket connected to the source relays it."""
        if ev.kind == P.StreamKind.LBTRU and link.ru_streams_far >= self.ru_max_streams:
            link.streams.refuse(ev.stream_id, P.RefuseCode.TOO_MANY_STREAMS,
                                f"{link.ru_streams_far} LBT-RU streams already open")
            self.counters["ru_streams_full"] += 1
            return
        st = link.state[ev.stream_id] = StreamState(ev.stream_id, ev.kind)
        st.advert_id = ev.advert_id
        link.nursery.start_soon(self._far, link, st, origin)

    async def _far(self, link: Link, st: StreamState, body) -> None:
        try:
            s = ru_socket()
            try:
                await s.bind((self.settings.relay_ip, 0))
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
                        n.start_soon(self._far_up, link, st)
                        await self._deliver(link, st, s.raw.send, s.send)
                        n.cancel_scope.cancel()
            finally:
                link.ru_streams_far -= 1
                self._end(link, st)
        finally:
            link.state.pop(st.sid, None)

    async def _far_up(self, link: Link, st: StreamState) -> None:
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
