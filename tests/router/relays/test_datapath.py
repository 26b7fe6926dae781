"""The routed TCP data path: zero copy (os.splice through pipes) over plain TCP
peer links, the copy path over TLS; byte-exact transfers, a stalled consumer
among flowing streams, a link cut in the middle of a stream, descriptors
released; and the link's reader against a raw peer that fragments frames
arbitrarily or breaks the credit rules (real sockets on loopback)."""

from __future__ import annotations

import os
import random
import socket
from collections import Counter

import trio

from router import peerlink as P
from router.config.model import TlsConfig, acceptor_peer, initiator_peer, lbmrd_endpoint
from router.link import SPLICE_MIN, Link, StreamState
from router.link.splice import PIPE_POOL
from router.peerlink import streams as S
from router.relays.endpoint_relay import Relay
from router.relays.interface import RelaySettings
from router.relays.tcp_streams import pump_down, pump_up
from router.shell.single import Router
from tests.helpers import LoneSite
from tests.router.helpers import (
    advertise_forever,
    make_ca,
    make_certs,
    pattern,
    resolve,
    start_lbmrd,
    start_routers,
    udp,
)


def fd_kinds() -> Counter[str]:
    """This process's open descriptors by kind (pipe, socket, other)."""
    out: Counter[str] = Counter()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        out["pipe" if target.startswith("pipe:") else "socket" if target.startswith("socket:") else "other"] += 1
    return out


async def read_all(stream, limit: float = 60) -> bytes:
    got = bytearray()
    with trio.fail_after(limit):
        while chunk := await stream.receive_some(1 << 20):
            got += chunk
    await stream.aclose()
    return bytes(got)


async def fetch(ip, port) -> bytes:
    return await read_all(await trio.open_tcp_stream(ip, port))


async def routed_source(n, total, **router_kw):
    """lbmrds, routers, a TCP source of ``total`` pattern bytes in TRD1 and its proxy's
    address in TRD2: (router A, router B, (ip, port))."""
    _, trd1 = await start_lbmrd(n, "127.0.1.1")
    _, trd2 = await start_lbmrd(n, "127.0.2.1")
    if router_kw:
        rb = Router("routerB", lbmrd_endpoint("B-TRD2", 2, [trd2], interface="127.0.2.1", fanout=False),
                    acceptor_peer("B-to-A", 0, interface="127.0.0.1", **router_kw))
        b_addr = await n.start(rb.run)
        ra = Router("routerA", lbmrd_endpoint("A-TRD1", 1, [trd1], interface="127.0.1.1", fanout=False),
                    initiator_peer("A-to-B", "127.0.0.1", b_addr["peer"][1], reconnect_interval_ms=200,
                                   **router_kw))
        await n.start(ra.run)
    else:
        ra, rb = await start_routers(n, trd1, trd2, reconnect=0.2)
    src = await tcp_source(n, "127.0.1.5", total)
    n.start_soon(advertise_forever, udp("127.0.1.5"), trd1, *src)
    tir = await resolve(udp("127.0.2.9"), trd2)
    return ra, rb, (tir.transport.ip, tir.transport.port), trd2


async def tcp_source(nursery, ip, total):
    """A TCP source serving ``total`` pattern bytes to each connection (a receiver that
    leaves early just ends its connection)."""
    data = pattern(total)

    async def handler(stream):
        try:
            await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        await trio.aclose_forcefully(stream)

    listeners = await trio.open_tcp_listeners(0, host=ip)
    nursery.start_soon(trio.serve_listeners, handler, listeners)
    return listeners[0].socket.getsockname()


async def wait_pipes_back(limit: float = 10) -> None:
    with trio.fail_after(limit):
        while PIPE_POOL.in_use:
            await trio.sleep(0.02)


async def fds_settled(before: Counter[str]) -> Counter[str]:
    """Once every pipe is back (idle ones closed) and the sockets are down to
    ``before``'s count (at most 5 s): the descriptors by kind."""
    await wait_pipes_back()
    PIPE_POOL.close_idle()
    with trio.move_on_after(5):
        while fd_kinds()["socket"] > before["socket"]:
            await trio.sleep(0.05)
    return fd_kinds()


async def test_zero_copy_transfer_is_byte_exact_and_spliced():
    total = 48 << 20
    async with trio.open_nursery() as n:
        ra, rb, proxy, _ = await routed_source(n, total)
        assert ra.link.zero_copy and rb.link.zero_copy
        out0, in0 = ra.link.spliced_out, rb.link.spliced_in
        assert await fetch(*proxy) == pattern(total)
        # most of the bytes never entered Python on either router
        assert ra.link.spliced_out - out0 > total // 2
        assert rb.link.spliced_in - in0 > total // 2
        assert ra.link.conn.stats.bytes_sent > total and rb.link.conn.stats.bytes_received > total
        await wait_pipes_back()
        n.cancel_scope.cancel()


async def test_tls_link_takes_the_copy_path_byte_exact(tmp_path):
    ca_key, ca = make_ca(tmp_path, "ca")
    a_crt, a_key = make_certs(tmp_path, "a", ca_key, ca)
    b_crt, b_key = make_certs(tmp_path, "b", ca_key, ca)
    total = 12 << 20
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        rb = Router("routerB", lbmrd_endpoint("B", 2, [trd2], interface="127.0.2.1", fanout=False),
                    acceptor_peer("B-to-A", 0, interface="127.0.0.1",
                                  tls=TlsConfig(b_crt, b_key, trusted_certificates=ca)))
        addr = await n.start(rb.run)
        ra = Router("routerA", lbmrd_endpoint("A", 1, [trd1], interface="127.0.1.1", fanout=False),
                    initiator_peer("A-to-B", "127.0.0.1", addr["peer"][1],
                                   tls=TlsConfig(a_crt, a_key, trusted_certificates=ca)))
        await n.start(ra.run)
        src = await tcp_source(n, "127.0.1.5", total)
        n.start_soon(advertise_forever, udp("127.0.1.5"), trd1, *src)
        tir = await resolve(udp("127.0.2.9"), trd2)
        assert not ra.link.zero_copy and not rb.link.zero_copy
        assert await fetch(tir.transport.ip, tir.transport.port) == pattern(total)
        assert ra.link.spliced_out == 0 and rb.link.spliced_in == 0
        n.cancel_scope.cancel()


async def test_stalled_consumer_does_not_stop_the_others():
    """One receiver connects and reads nothing while three others each get 16 MiB;
    then it reads its own 16 MiB, byte-exact (what its pipe could not hold took the
    copy path, in order)."""
    total = 16 << 20
    async with trio.open_nursery() as n:
        _, rb, proxy, _ = await routed_source(n, total)
        stalled = await trio.open_tcp_stream(*proxy)
        await trio.sleep(0.5)  # its window fills: pipe, socket buffers, copied bytes
        results = {}

        async def one(i):
            results[i] = await fetch(*proxy)

        async with trio.open_nursery() as m:
            for i in range(3):
                m.start_soon(one, i)
        assert all(results[i] == pattern(total) for i in range(3))
        assert await read_all(stalled) == pattern(total)
        await wait_pipes_back()
        n.cancel_scope.cancel()


async def test_link_cut_mid_stream_releases_pipes_and_routers_recover():
    total = 256 << 20
    async with trio.open_nursery() as n:
        ra, rb, proxy, trd2 = await routed_source(n, total)
        assert (await fetch_prefix(proxy, 1 << 20)) == pattern(1 << 20)
        await wait_pipes_back()
        PIPE_POOL.close_idle()
        before = fd_kinds()
        slow = await trio.open_tcp_stream(*proxy)
        got = bytearray()
        with trio.fail_after(20):
            while len(got) < 8 << 20:
                got += await slow.receive_some(1 << 16)
        assert PIPE_POOL.in_use > 0  # the stream is under way, its pipes in use
        await trio.aclose_forcefully(ra.link.stream)  # cut under the routers, mid-stream
        with trio.fail_after(20):  # the receiver's stream ends (its source is out of reach)
            while chunk := await slow.receive_some(1 << 20):
                got += chunk
        await slow.aclose()
        assert len(got) < total and bytes(got) == pattern(total)[:len(got)]
        with trio.fail_after(20):  # the link comes back and the topic works again
            while not (ra.link is not None and ra.link.connected and rb.status()["proxies"]):
                await trio.sleep(0.05)
        tir = await resolve(udp("127.0.2.9"), trd2)
        proxy = (tir.transport.ip, tir.transport.port)
        assert await fetch_prefix(proxy, 1 << 20) == pattern(1 << 20)
        after = await fds_settled(before)  # the routers notice the receivers that left
        assert after["pipe"] == before["pipe"]
        assert after["socket"] <= before["socket"], (before, after)
        assert ra.status()["counters"]["peer_connects"] >= 2
        n.cancel_scope.cancel()


async def fetch_prefix(proxy, nbytes) -> bytes:
    stream = await trio.open_tcp_stream(*proxy)
    got = bytearray()
    with trio.fail_after(20):
        while len(got) < nbytes:
            chunk = await stream.receive_some(nbytes - len(got))
            if not chunk:
                break
            got += chunk
    await trio.aclose_forcefully(stream)
    return bytes(got)


async def test_no_descriptor_leak_after_streams_end():
    total = 3 << 20
    async with trio.open_nursery() as n:
        _, _, proxy, _ = await routed_source(n, total)
        assert await fetch(*proxy) == pattern(total)
        await wait_pipes_back()
        await trio.sleep(0.2)
        PIPE_POOL.close_idle()
        before = fd_kinds()
        for _ in range(10):
            assert await fetch(*proxy) == pattern(total)
        results = []

        async def one():
            results.append(await fetch(*proxy) == pattern(total))

        async with trio.open_nursery() as m:
            for _ in range(6):
                m.start_soon(one)
        for _ in range(5):  # receivers that leave early
            await fetch_prefix(proxy, 100_000)
        assert results == [True] * 6
        after = await fds_settled(before)  # the far side notices the closed receivers
        assert after["pipe"] == before["pipe"] and after["socket"] == before["socket"], (before, after)
        n.cancel_scope.cancel()


# --------------------------------------------------------------- the reader, raw peer


class RawPeer:
    """The initiator end of a link, sans-IO over a plain socket: writes whatever bytes it
    is given, in fragments of random sizes."""

    def __init__(self, stream, rng: random.Random, read_pause: float = 0.0,
                 window: int = S.INITIAL_WINDOW) -> None:
        self.stream = stream
        self.read_pause = read_pause  # probability of a 2 ms pause after each read
        self.conn = P.PeerConnection("initiator", P.RouterIdentity("raw", (2,)), keepalive_interval=0,
                                     dead_after=0)
        self.table = S.StreamTable("initiator", initial_window=window, max_frame=P.MAX_PAYLOAD - 4)
        self.rng = rng
        self.frames: list = []

    async def write(self, data: bytes, max_piece: int) -> None:
        """``data`` in pieces of 1 .. ``max_piece`` bytes (the first 64 bytes of every 64 KiB
        in pieces of 1 .. 7: frame heads split everywhere), sometimes pausing."""
        mv = memoryview(data)
        pos = 0
        while pos < len(mv):
            k = self.rng.randint(1, 7 if pos % 65536 < 64 else max_piece)
            await self.stream.send_all(mv[pos:pos + k])
            pos += k
            if self.rng.random() < 0.02:
                await trio.sleep(0.001)

    async def read_loop(self) -> None:
        while data := await self.stream.receive_some(1 << 16):
            for item in self.conn.receive_data(data, trio.current_time()):
                self.frames.append(item)
                if isinstance(item, S.STREAM_FRAMES):
                    self.table.receive(item)
            if self.read_pause and self.rng.random() < self.read_pause:
                await trio.sleep(0.002)  # a slow peer: the link's socket fills up

    def encode(self, frames) -> bytes:
        now = trio.current_time()
        return b"".join(P.encode(f) if isinstance(f, P.Keepalive) else self.conn.send(f, now)
                        for f in frames)

    def acks(self) -> int:
        """KEEPALIVE_ACKs received (they answer keepalives this peer wrote raw, so its
        connection counts them as unmatched)."""
        return self.conn.stats.unmatched_acks


async def link_pair(n, rng, read_sink: bool = True, sink_read: int = 1 << 20, sink_pause: float = 0.2,
                    peer_pause: float = 0.0, peer_window: int = S.INITIAL_WINDOW):
    """A zero-copy Link (acceptor, running its reader and writer like the router does)
    and a RawPeer connected to it over loopback TCP; a TCP stream accepted on the link
    whose bytes go to a sink socket (read unless ``read_sink`` is false, ``sink_read``
    bytes at a time, pausing 2 ms after a read with probability ``sink_pause``; the peer
    pauses after a read of the link with probability ``peer_pause`` and grants streams
    ``peer_window`` bytes of credit). Returns
    (link, peer, sid, sink bytearray, items)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    client = await trio.open_tcp_stream("127.0.0.1", listeners[0].socket.getsockname()[1])
    server = await listeners[0].accept()
    link = Link(P.PeerConnection("acceptor", P.RouterIdentity("x", (1,)), keepalive_interval=0, dead_after=0),
                server, peer_name="raw", max_queue=8 << 20, zero_copy=True)
    assert link.zero_copy
    peer = RawPeer(client, rng, peer_pause, peer_window)
    items: list = []
    relay = Relay(RelaySettings(relay_ip="127.0.0.1"), Counter(),
                  lambda kind, detail: None, LoneSite(link))
    sink_l = await trio.open_tcp_listeners(0, host="127.0.0.1")
    sink_out = await trio.open_tcp_stream("127.0.0.1", sink_l[0].socket.getsockname()[1])
    sink_in = await sink_l[0].accept()
    sink = bytearray()

    async def sink_reader():
        while chunk := await sink_in.receive_some(sink_read):
            sink.extend(chunk)
            if rng.random() < sink_pause:
                await trio.sleep(0.002)  # a consumer that is sometimes slow: pipe full, copy path

    async def reader():
        while True:
            got, eof = await link.receive()
            link.push_raw(link.conn.data_to_send())
            for it in got:
                items.append(it)
                if isinstance(it, S.STREAM_FRAMES):
                    for ev in link.streams.receive(it):
                        if isinstance(ev, S.StreamOpened):
                            link.streams.accept(ev.stream_id)
                            st = link.state[ev.stream_id] = StreamState(ev.stream_id, ev.kind)
                            if ev.kind == P.StreamKind.TCP:
                                st.sock = sink_out
                                n.start_soon(pump_down, link, st, trio.CancelScope())
                        else:
                            relay.stream_event(link, ev)
                    link.flush_streams()
            if eof:
                return

    n.start_soon(link.writer)
    n.start_soon(reader)
    n.start_soon(peer.read_loop)
    if read_sink:
        n.start_soon(sink_reader)
    await peer.stream.send_all(peer.conn.start(trio.current_time()))
    with trio.fail_after(5):
        while peer.conn.state is not P.State.CONNECTED:
            await trio.sleep(0.01)
    await peer.stream.send_all(peer.conn.data_to_send())  # CONNECT_OK
    sid = peer.table.open(7, P.StreamKind.TCP)
    await peer.stream.send_all(peer.encode(peer.table.frames_to_send()))
    with trio.fail_after(5):
        while peer.table.send_credit(sid) == 0:
            await trio.sleep(0.01)
    return link, peer, sid, sink, items


async def test_reader_splices_frames_arriving_in_arbitrary_fragments():
    """Data frames of every size around the splice threshold, keepalives between them,
    the byte stream cut into random pieces (a few bytes to 100 KB): the sink gets every
    byte in order, each keepalive is answered, credit flows back."""
    rng = random.Random(11)
    total = 16 << 20
    data = random.Random(5).randbytes(total)
    async with trio.open_nursery() as n:
        # a consumer often slower than the link: its socket fills, bytes wait in pipes and
        # in the copy path, the reader passes some on itself: the order must hold throughout
        link, peer, sid, sink, items = await link_pair(n, rng, sink_read=64 << 10, sink_pause=0.5)
        pos = keepalives = 0
        while pos < total:
            credit = peer.table.send_credit(sid)
            if credit == 0:
                await trio.sleep(0.001)
                continue
            size = rng.choice([1, 100, SPLICE_MIN - 1, SPLICE_MIN, SPLICE_MIN + 1, 200_000, P.MAX_PAYLOAD - 4])
            size = min(size, credit, total - pos)
            rest = peer.table.send(sid, data[pos:pos + size])
            pos += size - len(rest)
            frames = peer.table.frames_to_send()
            if rng.random() < 0.3:
                keepalives += 1
                frames.insert(rng.randrange(len(frames) + 1), P.Keepalive(keepalives, keepalives))
            await peer.write(peer.encode(frames) if frames else b"", rng.choice([1000, 65536, 1 << 20]))
        with trio.fail_after(30):
            while len(sink) < total:
                await trio.sleep(0.01)
        assert bytes(sink) == data
        assert link.spliced_in > total // 4  # the big frames were spliced
        with trio.fail_after(5):
            while peer.acks() < keepalives:
                await trio.sleep(0.01)
        assert link.conn.state is P.State.CONNECTED
        n.cancel_scope.cancel()


async def test_datagram_bursts_reach_their_stream_in_order():
    """Bursts of DATAGRAM frames (taken by the reader as runs, no frame objects) of every
    size from empty to 60 KB, mixed with keepalives and with data on a TCP stream, cut
    into random pieces: every datagram reaches its stream, whole and in order; one for
    a stream that is not open is counted and dropped."""
    rng = random.Random(21)
    async with trio.open_nursery() as n:
        link, peer, sid, sink, _ = await link_pair(n, rng)
        ru = peer.table.open(8, P.StreamKind.LBTRU)
        await peer.stream.send_all(peer.encode(peer.table.frames_to_send()))
        with trio.fail_after(5):
            while peer.table.get(ru).state is not S.StreamState.OPEN:
                await trio.sleep(0.01)
        sent, tcp = [], bytearray()
        refused0 = link.streams.refused_frames
        for burst in range(30):
            frames = []
            for _ in range(rng.randint(1, 80)):
                d = rng.randbytes(rng.choice([0, 1, 17, 1400, 1400, 1400, 9000, 60_000]))
                sent.append(d)
                peer.table.send_datagram(ru, d)
            frames += peer.table.frames_to_send()
            if burst % 7 == 0:
                frames.insert(rng.randrange(len(frames)), P.Keepalive(burst + 1, 0))
                chunk = rng.randbytes(rng.choice([10, SPLICE_MIN + 5]))
                if not peer.table.send(sid, chunk):
                    tcp += chunk
                frames.insert(rng.randrange(len(frames)), peer.table.frames_to_send()[0])
            if burst == 20:
                frames.insert(rng.randrange(len(frames)), P.Datagram(ru + 1000, b"nobody"))
            await peer.write(peer.encode(frames), rng.choice([4096, 70_000]))
        st = link.state[ru]
        with trio.fail_after(20):
            while len(st.incoming) < len(sent) or len(sink) < len(tcp):
                await trio.sleep(0.01)
        assert list(st.incoming) == sent
        assert bytes(sink) == bytes(tcp)
        assert link.streams.get(ru).datagrams_received == len(sent)
        assert link.streams.refused_frames == refused0 + 1
        with trio.fail_after(5):
            while peer.acks() < 5:  # bursts 0, 7, 14, 21, 28
                await trio.sleep(0.01)
        assert link.conn.state is P.State.CONNECTED
        n.cancel_scope.cancel()


async def test_reader_refuses_data_beyond_credit_and_for_unknown_streams():
    """A peer ignoring the credit: the stream is closed (flow-control violation), the
    spliced-size payloads are read and dropped, and the link carries on: data for an
    unknown stream is dropped too, a keepalive after all that is answered."""
    rng = random.Random(3)
    async with trio.open_nursery() as n:
        link, peer, sid, sink, _ = await link_pair(n, rng, read_sink=False)  # no credit comes back
        blob = bytes(P.MAX_PAYLOAD - 4)
        frames = [P.StreamData(sid, blob) for _ in range(8)]  # 8 MiB against a 4 MiB window
        frames += [P.StreamData(999, blob), P.Keepalive(1, 1)]
        await peer.write(b"".join(P.encode(f) for f in frames), 1 << 20)
        def closes():
            return [f for f in peer.frames if isinstance(f, P.StreamClose) and f.stream_id == sid]

        with trio.fail_after(10):
            while peer.acks() < 1 or not closes():
                await trio.sleep(0.01)
        assert closes()[0].code == P.CloseCode.FLOW_CONTROL
        assert link.streams.refused_frames >= 2  # the excess and the unknown stream
        assert link.conn.state is P.State.CONNECTED
        assert link.streams.get(sid).bytes_received <= 4 << 20  # never more than the credit
        n.cancel_scope.cancel()


# --------------------------------------------------------------- sans-IO: held data


def test_held_data_is_accounted_like_stream_data():
    a, b = S.StreamTable("initiator"), S.StreamTable("acceptor")
    sid = a.open(1)
    for f in a.frames_to_send():
        b.receive(f)
    b.accept(sid)
    for f in b.frames_to_send():
        a.receive(f)
    window = a.send_credit(sid)
    assert window == S.INITIAL_WINDOW
    held = a.send_held(sid, 1000, holder="pipe")
    assert a.frames_to_send() == [held] and held.wire_size() == S.STREAM_DATA_OVERHEAD + 1000
    assert a.send_credit(sid) == window - 1000
    try:
        a.send_held(sid, window, holder="pipe")  # beyond the credit (and the frame size)
    except S.LocalStreamError:
        pass
    else:
        raise AssertionError("send_held beyond the credit")
    # the receiving table sees only the size: same accounting as a StreamData of 1000 bytes
    assert b.receive_held(sid, 1000) == [S.DataArriving(sid, 1000)]
    assert b.get(sid).unconsumed == 1000 and b.get(sid).recv_window == window - 1000
    b.consumed(sid, 1000)
    # beyond the window: the stream is closed for a flow-control violation
    evs = b.receive_held(sid, window)
    assert isinstance(evs[0], S.StreamError)
    assert [f.code for f in b.frames_to_send() if isinstance(f, P.StreamClose)] == [P.CloseCode.FLOW_CONTROL]
    assert isinstance(b.receive_held(sid, 10)[0], S.DataRefused)  # closing: refused
    assert isinstance(b.receive_held(12345, 10)[0], S.DataRefused)  # unknown stream


def test_outqueue_counts_held_data_and_hands_it_back():
    q = P.OutQueue(max_data_bytes=100_000)
    h = S.HeldData(1, 60_000, holder="p1")
    assert q.put(h) and q.data_space() == 100_000 - h.wire_size()
    assert not q.put(S.HeldData(1, 60_000, holder="p2"))  # does not fit: refused, kept by the caller
    assert q.put(P.Keepalive(1, 1))
    assert q.take_all() == [h, P.Keepalive(1, 1)]
    assert len(q) == 0 and q.data_space() == 100_000


def test_pipe_pool_keeps_empty_pipes_only_while_streams_run_and_within_its_limit():
    from router.link.splice import PipePool

    pool = PipePool(limit=3, idle=2)
    a = pool.acquire()
    pool.release(a)
    assert a.closed and pool.idle == 0  # no stream runs: closed at once
    pool.stream_started()
    pipes = [pool.acquire() for _ in range(3)]
    assert pool.acquire() is None and pool.exhausted == 1  # the limit
    for p in pipes:
        pool.release(p)
    assert pool.idle == 2 and [p.closed for p in pipes] == [False, False, True]  # at most idle
    again = [pool.acquire(), pool.acquire()]
    assert {id(p) for p in again} == {id(pipes[0]), id(pipes[1])} and pool.created == 4  # reused
    extra = pool.acquire()
    assert pool.acquire() is None  # kept pipes count against the limit: 3 open in all
    for p in again:
        pool.release(p)
    assert pool.idle == 2
    full = pool.acquire()
    assert pool.idle == 1
    os.write(full.w, b"x")
    full.held = 1
    pool.release(full)
    assert full.closed and pool.closed_full == 1  # a pipe with bytes in it is never kept
    pool.stream_started()
    pool.stream_ended()
    assert pool.idle == 1  # another stream still runs
    pool.release(extra)
    pool.stream_ended()  # the last one: the kept pipes close
    assert pool.idle == 0 and pool.in_use == 0 and extra.closed


async def test_pipe_bytes_never_overtake_copied_bytes_being_sent():
    """The stream's pump is in the middle of sending copied bytes to a full socket; the
    receiver makes room and more bytes of the stream arrive in its pipe at that moment:
    the reader must not pass them on ahead of the rest of the copied bytes."""
    rng = random.Random(4)
    async with trio.open_nursery() as n:
        link, _, _, _, _ = await link_pair(n, rng)
        sink_l = await trio.open_tcp_listeners(0, host="127.0.0.1")
        out = await trio.open_tcp_stream("127.0.0.1", sink_l[0].socket.getsockname()[1])
        inn = await sink_l[0].accept()
        st = link.state[999] = StreamState(999, P.StreamKind.TCP)
        st.sock = out
        copied = random.Random(1).randbytes(16 << 20)
        st.incoming.append(copied)
        n.start_soon(pump_down, link, st, trio.CancelScope())
        await trio.sleep(0.2)  # the pump has filled the socket and waits in the middle of the bytes
        got = bytearray()
        raw = socket.socket(fileno=os.dup(inn.socket.fileno()))
        raw.setblocking(False)
        with raw:  # the receiver makes room (no checkpoint: the pump does not run) ...
            while len(got) < 1 << 20:
                try:
                    got += raw.recv(1 << 20)
                except BlockingIOError:
                    break
        assert got
        pipe = link.pipes.acquire()
        assert pipe is not None
        os.write(pipe.w, b"P" * 1000)  # ... and the next bytes arrive in the stream's pipe
        st.rx_pipe, st.rx_pipes = pipe, 1
        link.rx.pipe_in(st, pipe, 1000)
        with trio.fail_after(20):
            while len(got) < len(copied) + 1000:
                got += await inn.receive_some(1 << 20)
        assert bytes(got) == copied + b"P" * 1000
        n.cancel_scope.cancel()


async def test_writer_resumes_frames_cut_by_a_full_socket_in_order():
    """Zero copy, sending: the stream's pump writes its frames itself while the link's
    socket takes them and leaves the rest to the writer when it is full (a slow peer);
    control frames queued meanwhile follow whole frames. The peer gets every byte in
    order, every control frame, and the writer found the socket full on the way."""
    rng = random.Random(8)
    total = 24 << 20
    data = random.Random(9).randbytes(total)
    async with trio.open_nursery() as n:
        link, peer, sid, _, _ = await link_pair(n, rng, peer_pause=0.3, peer_window=8 << 20)
        src_l = await trio.open_tcp_listeners(0, host="127.0.0.1")
        src_out = await trio.open_tcp_stream("127.0.0.1", src_l[0].socket.getsockname()[1])
        src_in = await src_l[0].accept()
        st = link.state[sid]
        st.sock = src_in  # what is written to src_out goes to the peer on the stream
        st.accepted.set()
        n.start_soon(pump_up, link, st, trio.CancelScope())
        got = bytearray()

        async def credit_back():
            seen = 0
            while len(got) < total:
                for f in peer.frames[seen:]:
                    if isinstance(f, P.StreamData) and f.stream_id == sid:
                        got.extend(f.data)
                        peer.table.consumed(sid, len(f.data))
                seen = len(peer.frames)
                out = peer.table.frames_to_send()
                if out:
                    await peer.stream.send_all(peer.encode(out))
                await trio.sleep(0.001)

        async def control():
            for i in range(2000):
                link.put(P.Interest(P.InterestAction.ADD, f"topic.{i}", 1))
                if i % 10 == 9:
                    await trio.sleep(0.001)

        blocked0, spliced0 = link.tx_blocked, link.spliced_out
        with trio.fail_after(20):
            async with trio.open_nursery() as m:
                m.start_soon(credit_back)
                m.start_soon(control)
                await src_out.send_all(data)
        assert bytes(got) == data
        topics = [f.topic for f in peer.frames if isinstance(f, P.Interest)]
        assert topics == [f"topic.{i}" for i in range(2000)]
        assert link.tx_blocked > blocked0  # the socket was full in the middle of frames
        assert link.spliced_out - spliced0 > total // 2  # and the frames were spliced
        n.cancel_scope.cancel()


def test_a_streams_writer_backlog_is_its_frames_the_writer_has_not_taken():
    """The frames a stream noted as queued (:meth:`StreamState.queued`) leave its
    backlog once the writer's queue took them off; another stream's frames
    between them count for nobody."""
    q = P.OutQueue()
    st = StreamState(1, 0)
    q.put(P.StreamData(1, bytes(84)))  # 100 wire bytes
    st.queued(q, 100)
    q.put(P.Datagram(3, bytes(34)))  # another stream's 50
    q.put(P.StreamData(1, bytes(184)))
    st.queued(q, 200)
    assert st.writer_backlog(q) == 300
    q.pop()
    assert st.writer_backlog(q) == 200
    q.pop()
    assert st.writer_backlog(q) == 200  # its second frame is still queued
    q.pop()
    assert st.writer_backlog(q) == 0
    q.put(P.StreamData(1, bytes(84)))
    st.queued(q, 100)
    q.clear()  # the link went down
    assert st.writer_backlog(q) == 0
