"""Router end to end on loopback: TRD1 (lbmrd on 127.0.1.1) and TRD2 (lbmrd on
127.0.2.1) joined by two routers over a TCP peer link; a source in TRD1, a
receiver in TRD2 that resolves the proxy and gets the data through it."""

from __future__ import annotations

import hashlib

import trio

import lbmr_proto as L
from lbmrd.server import Daemon, Settings
from router.config_model import acceptor_peer, initiator_peer, lbmrd_endpoint
from router.core.tr import synthesize_otid
from router.daemon import Router

TOPIC = "md.routed.1"


async def start_lbmrd(nursery, ip):
    d = Daemon(Settings(bind_ip=ip, port=0, stats_interval=0))
    return d, await nursery.start(d.run)


async def start_routers(nursery, trd1, trd2, *, reconnect=1.0, **endpoint):
    """Router B (acceptor, TRD2) and router A (initiator, TRD1); ``endpoint``:
    more EndpointConfig fields for both. The TCP sources of these tests send
    byte patterns, not LBMC: the routers relay each connection on its own
    (``fanout=False``) unless told otherwise (fan-out: tests/router/relays/test_fanout_relay.py)."""
    endpoint.setdefault("fanout", False)
    rb = Router("routerB", lbmrd_endpoint("B-TRD2", 2, [trd2], interface="127.0.2.1", **endpoint),
                acceptor_peer("B-to-A", 0, interface="127.0.0.1"))
    b_addr = await nursery.start(rb.run)
    ra = Router("routerA", lbmrd_endpoint("A-TRD1", 1, [trd1], interface="127.0.1.1", **endpoint),
                initiator_peer("A-to-B", "127.0.0.1", b_addr["peer"][1],
                               reconnect_interval_ms=round(reconnect * 1000)))
    await nursery.start(ra.run)
    return ra, rb


def pattern(n: int) -> bytes:
    block = hashlib.sha256(b"lbmr").digest() * 2048  # 64 KiB
    return (block * (n // len(block) + 1))[:n]


async def tcp_source(nursery, ip, total):
    """A TCP 'source': serves `total` bytes of a known pattern to each connection
    (a connection the other side resets just ends)."""
    data = pattern(total)

    async def handler(stream):
        try:
            await stream.send_all(data)
        except trio.BrokenResourceError:
            pass
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host=ip)
    nursery.start_soon(trio.serve_listeners, handler, listeners)
    return listeners[0].socket.getsockname()


async def endless_source(nursery, trd, ip="127.0.1.5", topic=TOPIC) -> trio.CancelScope:
    """A TCP source at ``ip`` that sends to every connection until it dies, and
    advertises itself in ``trd``; cancelling the returned scope kills it (its
    sockets close, it advertises no more)."""
    scope = trio.CancelScope()

    async def handler(stream):
        async with stream:
            try:
                while True:
                    await stream.send_all(b"x" * 1000)
                    await trio.sleep(0.01)
            except trio.BrokenResourceError:
                pass  # that receiver (the router) went away: the source serves the others

    listeners = await trio.open_tcp_listeners(0, host=ip)
    addr = listeners[0].socket.getsockname()

    async def run():
        with scope:
            async with trio.open_nursery() as sn:
                sn.start_soon(trio.serve_listeners, handler, listeners)
                sn.start_soon(advertise_forever, udp(ip), trd, *addr, topic)

    nursery.start_soon(run)
    return scope


def tir_packet(ip, port, topic=TOPIC):
    otid = synthesize_otid(L.TcpTransport(ip, port), 7)
    return L.encode(L.Packet(0, 1, tirs=[L.TIR(topic, L.TcpTransport(ip, port), 60, 7,
                                               [L.OtidOption(0x8000, otid)])]))


def tirs_in(data: bytes) -> list:
    """The TIRs of a TR datagram (none if it does not decode)."""
    try:
        return L.decode(data).tirs
    except L.LBMRDecodeError:
        return []


async def resolve(sock, daemon, timeout=10.0, topic=TOPIC):
    """Act as a UM receiver in a TRD: query ``topic`` until a TIR for it arrives."""
    tqr = L.encode(L.Packet(0, 1, tqrs=[L.TQR(topic)]))
    with trio.fail_after(timeout):
        while True:
            await sock.sendto(tqr, daemon)
            with trio.move_on_after(0.2):
                while True:
                    data, _ = await sock.recvfrom(65535)
                    for t in tirs_in(data):
                        final = any(isinstance(o, L.CostOption) and o.cost == -1 for o in t.options or ())
                        if t.topic == topic and not final:  # a final advertisement withdraws
                            return t


async def advertise_forever(sock, daemon, ip, port, topic=TOPIC):
    data = tir_packet(ip, port, topic)
    while True:
        await sock.sendto(data, daemon)
        await trio.sleep(0.5)


async def rm_source(nursery, trd, topic, *, count, rate, size=1400, ip="127.0.1.5", ctx_ip="127.0.1.6",
                    group=("239.192.9.9", 15009), session_id=0x5151, seed=11):
    """An LBT-RM source (lbmr-sim's RmDataSource: ``count`` datagrams of ``size``
    bytes at ``rate`` a second to ``group``) at ``ip``, advertised for ``topic``
    in the lbmrd ``trd`` from ``ctx_ip`` every 0.5 s; returns the source."""
    from lbmr_tools.sim.dataplane import RmDataSource

    src = RmDataSource(ip, 0, group=group[0], dest_port=group[1], session_id=session_id, count=count,
                       seed=seed, rate=rate, datagram_size=size)
    sip, sport = await nursery.start(src.serve)
    tir = L.encode(L.Packet(0, 1, tirs=[L.TIR(topic, L.LbtrmTransport(sip, group[0], session_id, group[1], sport),
                                              60, 3)]))
    ctx = udp(ctx_ip)

    async def advertise():
        while True:
            await ctx.sendto(tir, trd)
            await trio.sleep(0.5)

    nursery.start_soon(advertise)
    return src


def udp(ip):
    s = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    s._sock.bind((ip, 0))
    return s


async def test_tcp_source_in_trd1_reaches_receiver_in_trd2():
    total = 100 * 1024 * 1024  # the issue: 100 MB byte-exact
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        ra, rb = await start_routers(n, trd1, trd2)
        src_addr = await tcp_source(n, "127.0.1.5", total)
        src_ctx = udp("127.0.1.5")
        n.start_soon(advertise_forever, src_ctx, trd1, *src_addr)
        rcv_ctx = udp("127.0.2.9")
        tir = await resolve(rcv_ctx, trd2)
        # the proxy: router B's relay address in TRD2, same transport, domain id of TRD1
        assert tir.transport.NAME == "TCP" and tir.transport.ip == "127.0.2.1"
        assert any(isinstance(o, L.DomainIdOption) and o.domain_id == 1 for o in tir.options)
        stream = await trio.open_tcp_stream(tir.transport.ip, tir.transport.port)
        got = bytearray()
        with trio.fail_after(60):
            while chunk := await stream.receive_some(1 << 16):
                got += chunk
        assert len(got) == total and bytes(got) == pattern(total)
        st = rb.status()
        assert st["peer"]["state"] == "CONNECTED" and TOPIC in st["portal"]["local_interest"]
        assert ra.status()["counters"]["adverts_sent"] >= 1
        n.cancel_scope.cancel()


async def test_lbtru_source_in_trd1_reaches_receiver_in_trd2():
    """LBT-RU through the routers: numbered datagrams (our LBT-RU-like data
    protocol, lbmr_tools.sim.dataplane) from a source in TRD1 to a receiver in TRD2
    that only knows the proxy; the receiver's HELLO/STATUS datagrams go the
    other way. 100 MB of 1400-byte datagrams, every one verified."""
    from lbmr_tools.sim.dataplane import RuDataReceiver, RuDataSource

    count = 75_000  # x 1383 payload bytes ~ 100 MB
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        ra, rb = await start_routers(n, trd1, trd2)
        src = RuDataSource("127.0.1.5", count=count, seed=9, rate=60_000.0, snd_buf=8 << 20)
        sip, sport = await n.start(src.serve)
        otid = synthesize_otid(L.LbtruTransport(sip, sport), 7)
        tir = L.encode(L.Packet(0, 1, tirs=[L.TIR(TOPIC, L.LbtruTransport(sip, sport), 60, 7,
                                                  [L.OtidOption(0x8000, otid)])]))
        ctx = udp("127.0.1.6")

        async def adv():
            while True:
                await ctx.sendto(tir, trd1)
                await trio.sleep(0.5)

        n.start_soon(adv)
        t = await resolve(udp("127.0.2.9"), trd2)
        assert t.transport.NAME == "LBTRU" and t.transport.ip == "127.0.2.1"
        res = await RuDataReceiver(t.transport.ip, t.transport.port, seed=9, expect_count=count,
                                   bind_ip="127.0.2.10", idle_timeout=5.0, timeout=120.0).run()
        print(f"LBT-RU through routers: {res.received}/{count} datagrams, {res.bytes_received} bytes, "
              f"{res.missing} missing, {res.data_elapsed:.1f} s")
        assert res.error is None and res.corrupt == 0, res
        # UDP may drop under load: nearly everything must arrive, every byte verified
        assert res.received >= 0.98 * count and res.bytes_received >= 0.98 * 100e6, res
        assert res.end_count == count
        assert any(s for s in src.sessions.values())  # the source heard the receiver (reverse path)
        n.cancel_scope.cancel()


async def test_short_streams_are_delivered_before_the_close():
    """A source that sends a few bytes and closes at once: data and STREAM_CLOSE
    reach the near router together; the bytes must still reach the receiver."""
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        await start_routers(n, trd1, trd2)
        src = await tcp_source(n, "127.0.1.5", 100)
        n.start_soon(advertise_forever, udp("127.0.1.5"), trd1, *src)
        tir = await resolve(udp("127.0.2.9"), trd2)
        for _ in range(30):
            stream = await trio.open_tcp_stream(tir.transport.ip, tir.transport.port)
            got = b""
            with trio.fail_after(10):
                while chunk := await stream.receive_some(1 << 16):
                    got += chunk
            await stream.aclose()
            assert got == pattern(100)
        n.cancel_scope.cancel()


async def test_the_topics_of_one_source_session_share_one_proxy_and_one_stream():
    """UM puts many topics on one transport session, and a receiver context
    connects to a session once. The router serves the topics of a session with
    one proxy: their proxy TIRs name one relay address (each with its topic's
    index), and one receiver connection is one connection to the source."""
    total = 4 * 1024 * 1024
    topics = [f"md.session.{i}" for i in range(3)]
    connections = []
    data = pattern(total)

    async def handler(stream):
        connections.append(stream)
        try:
            await stream.send_all(data)
        except trio.BrokenResourceError:
            pass
        await stream.aclose()

    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        ra, rb = await start_routers(n, trd1, trd2)
        listeners = await trio.open_tcp_listeners(0, host="127.0.1.5")
        n.start_soon(trio.serve_listeners, handler, listeners)
        ip, port = listeners[0].socket.getsockname()
        body = L.TcpTransport(ip, port)
        tirs = [L.TIR(t, body, 60, 10 + i, [L.OtidOption(0x8000, synthesize_otid(body, 10 + i))])
                for i, t in enumerate(topics)]
        packet = L.encode(L.Packet(0, 1, tirs=tirs))

        async def advertise(sock):
            while True:
                await sock.sendto(packet, trd1)
                await trio.sleep(0.5)

        n.start_soon(advertise, udp(ip))
        rcv_ctx = udp("127.0.2.9")
        got_tirs = [await resolve(rcv_ctx, trd2, topic=t) for t in topics]
        relay = {(t.transport.ip, t.transport.port) for t in got_tirs}
        assert len(relay) == 1 and next(iter(relay))[0] == "127.0.2.1"
        assert [t.index for t in got_tirs] == [10, 11, 12]
        assert rb.bridge.proxy_listeners() == 1 and len(rb.bridge.proxies()) == 3
        stream = await trio.open_tcp_stream(*next(iter(relay)))
        got = bytearray()
        with trio.fail_after(60):
            while chunk := await stream.receive_some(1 << 16):
                got += chunk
        assert bytes(got) == data and len(connections) == 1
        n.cancel_scope.cancel()


async def test_the_proxy_advertises_the_origin_session_id():
    """A TCP source advertised "with session id": the proxy in the other TRD
    advertises the same session id at its relay address (its receivers get the
    origin's session in the stream), on both relays."""
    for fanout in (True, False):
        async with trio.open_nursery() as n:
            _, trd1 = await start_lbmrd(n, "127.0.1.1")
            _, trd2 = await start_lbmrd(n, "127.0.2.1")
            await start_routers(n, trd1, trd2, fanout=fanout)
            body = L.TcpSessionTransport("127.0.1.5", 0x5E55_1D01, 14371)
            tir = L.TIR(TOPIC, body, 60, 7, [L.OtidOption(0x8000, synthesize_otid(body, 7))])
            src = udp("127.0.1.5")

            n.start_soon(advertise_tir, src, trd1, tir)
            got = await resolve(udp("127.0.2.9"), trd2)
            assert isinstance(got.transport, L.TcpSessionTransport), got.transport
            assert (got.transport.ip, got.transport.session_id) == ("127.0.2.1", 0x5E55_1D01)
            n.cancel_scope.cancel()


async def advertise_tir(sock, daemon, tir):
    data = L.encode(L.Packet(0, 1, tirs=[tir]))
    while True:
        await sock.sendto(data, daemon)
        await trio.sleep(0.5)
