"""Router end to end on loopback: TRD1 (lbmrd on 127.0.1.1) and TRD2 (lbmrd on
127.0.2.1) joined by two routers over a TCP peer link; a source in TRD1, a
receiver in TRD2 that resolves the proxy and gets the data through it."""

from __future__ import annotations

import trio

import lbmr_proto as L
from lbmr_proto.um import synthesize_otid
from tests.router.helpers import (
    ROUTED_TOPIC,
    advertise_forever,
    pattern,
    resolve,
    start_lbmrd,
    start_routers,
    tcp_source,
    udp,
)


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
        assert st["peer"]["state"] == "CONNECTED" and ROUTED_TOPIC in st["portal"]["local_interest"]
        assert ra.status()["counters"]["adverts_sent"] >= 1
        n.cancel_scope.cancel()


async def test_lbtru_source_in_trd1_reaches_receiver_in_trd2():
    """LBT-RU through the routers: numbered datagrams (our LBT-RU-like data
    protocol, lbmr_tools.sim.dataplane) from a source in TRD1 to a receiver in TRD2
    that only knows the proxy; the receiver's HELLO/STATUS datagrams go the
    other way. 20,000 datagrams of 1383 payload bytes (28 MB), every one verified."""
    from lbmr_tools.sim.dataplane import RuDataReceiver, RuDataSource

    count = 20_000  # x 1383 payload bytes ~ 28 MB
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        ra, rb = await start_routers(n, trd1, trd2)
        src = RuDataSource("127.0.1.5", count=count, seed=9, rate=60_000.0, snd_buf=8 << 20)
        sip, sport = await n.start(src.serve)
        otid = synthesize_otid(L.LbtruTransport(sip, sport), 7)
        tir = L.encode(L.Packet(0, 1, tirs=[L.TIR(ROUTED_TOPIC, L.LbtruTransport(sip, sport), 60, 7,
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
        assert res.received >= 0.98 * count and res.bytes_received >= 0.98 * count * 1383, res
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
            tir = L.TIR(ROUTED_TOPIC, body, 60, 7, [L.OtidOption(0x8000, synthesize_otid(body, 7))])
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
