"""Router faults and the LBT-RU relay, in process on loopback."""

from __future__ import annotations

import trio

import lbmr_proto as L
from router.config.model import TlsConfig, acceptor_peer, initiator_peer, lbmrd_endpoint
from router.shell.single import Router
from tests.router.helpers import (
    ROUTED_TOPIC,
    advertise_forever,
    fetch,
    make_ca,
    make_certs,
    pattern,
    resolve,
    start_lbmrd,
    start_routers,
    tcp_source,
    udp,
)


async def test_peer_link_cut_and_restored_repeatedly():
    total = 1 << 20
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        ra, rb = await start_routers(n, trd1, trd2, reconnect=0.2)
        src = await tcp_source(n, "127.0.1.5", total)
        n.start_soon(advertise_forever, udp("127.0.1.5"), trd1, *src)
        rcv = udp("127.0.2.9")
        for round_ in range(3):
            with trio.fail_after(20):
                while True:  # a receiver re-resolves until it reaches a live proxy
                    tir = await resolve(rcv, trd2)
                    try:
                        data = await fetch(tir.transport.ip, tir.transport.port)
                        break
                    except OSError:
                        await trio.sleep(0.1)
            assert data == pattern(total), round_
            assert rb.status()["proxies"]
            await trio.aclose_forcefully(ra.link.stream)  # cut the link under the routers
            with trio.fail_after(5):
                while rb.status()["proxies"]:  # no stuck proxies once the link is down
                    await trio.sleep(0.01)
        assert ra.status()["counters"]["peer_connects"] >= 3
        n.cancel_scope.cancel()


async def test_far_source_dies_and_proxy_is_withdrawn(autojump_clock):
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        ra, rb = await start_routers(n, trd1, trd2)
        src = await tcp_source(n, "127.0.1.5", 10)
        source_alive = trio.CancelScope()
        n.start_soon(_advertise_until, source_alive, udp("127.0.1.5"), trd1, src)
        await resolve(udp("127.0.2.9"), trd2)
        assert rb.status()["proxies"]
        source_alive.cancel()  # the source stops advertising and answering queries
        with trio.fail_after(60):
            while rb.status()["proxies"]:
                await trio.sleep(0.5)
        assert ra.status()["counters"]["adverts_withdrawn"] >= 1
        assert rb.status()["counters"]["withdrawals_received"] >= 1
        n.cancel_scope.cancel()


async def _advertise_until(scope, sock, daemon, addr):
    with scope:
        await advertise_forever(sock, daemon, *addr)


async def test_slow_receiver_does_not_stall_others():
    total = 8 << 20
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        ra, rb = await start_routers(n, trd1, trd2)
        src = await tcp_source(n, "127.0.1.5", total)
        n.start_soon(advertise_forever, udp("127.0.1.5"), trd1, *src)
        tir = await resolve(udp("127.0.2.9"), trd2)
        stalled = await trio.open_tcp_stream(tir.transport.ip, tir.transport.port)  # never reads
        await trio.sleep(0.5)
        assert await fetch(tir.transport.ip, tir.transport.port) == pattern(total)
        await stalled.aclose()
        n.cancel_scope.cancel()


async def test_garbage_on_the_peer_port_is_refused_and_the_router_lives():
    async with trio.open_nursery() as n:
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        rb = Router("routerB", lbmrd_endpoint("B", 2, [trd2], interface="127.0.2.1"),
                    acceptor_peer("B-to-A", 0, interface="127.0.0.1"))
        addr = await n.start(rb.run)
        for junk in (b"GET / HTTP/1.0\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40),
                     bytes(range(256))):
            s = await trio.open_tcp_stream(*addr["peer"])
            await s.send_all(junk)
            with trio.fail_after(5):
                while await s.receive_some(4096):
                    pass  # the router closes the connection
            await s.aclose()
        assert "peer_down" in [e["event"] for e in rb.status()["events"]]
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        ra = Router("routerA", lbmrd_endpoint("A", 1, [trd1], interface="127.0.1.1"),
                    initiator_peer("A-to-B", "127.0.0.1", addr["peer"][1]))
        await n.start(ra.run)
        with trio.fail_after(5):
            while rb.status()["peer"]["state"] != "CONNECTED":
                await trio.sleep(0.01)
        n.cancel_scope.cancel()


async def test_lbtru_datagrams_both_directions():
    """An LBT-RU-like source in TRD1 answers each receiver datagram with numbered
    datagrams; the receiver in TRD2 talks to the proxy only."""
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        ra, rb = await start_routers(n, trd1, trd2)
        src = udp("127.0.1.5")
        sport = src.getsockname()[1]
        heard = []

        async def ru_source():
            while True:
                data, addr = await src.recvfrom(65535)
                heard.append((data, addr))
                for i in range(50):
                    await src.sendto(b"RU%06d" % i + data, addr)

        n.start_soon(ru_source)
        otid = bytes([1]) + bytes(31)
        tir = L.encode(L.Packet(0, 1, tirs=[L.TIR(ROUTED_TOPIC, L.LbtruTransport("127.0.1.5", sport), 60, 7,
                                                  [L.OtidOption(0x8000, otid)])]))
        ctx = udp("127.0.1.6")

        async def adv():
            while True:
                await ctx.sendto(tir, trd1)
                await trio.sleep(0.5)

        n.start_soon(adv)
        t = await resolve(udp("127.0.2.9"), trd2)
        assert t.transport.NAME == "LBTRU" and t.transport.ip == "127.0.2.1"
        rcv = udp("127.0.2.10")
        await rcv.sendto(b"hello", (t.transport.ip, t.transport.port))
        got = []
        with trio.fail_after(10):
            while len(got) < 50:
                got.append((await rcv.recvfrom(65535))[0])
        assert sorted(got) == [b"RU%06dhello" % i for i in range(50)]
        assert heard[0][0] == b"hello" and heard[0][1][0] == "127.0.1.1"  # via router A's relay address
        n.cancel_scope.cancel()


async def test_tls_mutual_auth_and_wrong_certificate(tmp_path):


    ca_key, ca = make_ca(tmp_path, "ca")
    rogue_key, rogue_ca = make_ca(tmp_path, "rogue")
    a_crt, a_key = make_certs(tmp_path, "a", ca_key, ca)
    b_crt, b_key = make_certs(tmp_path, "b", ca_key, ca)
    x_crt, x_key = make_certs(tmp_path, "x", rogue_key, rogue_ca)

    def tls(crt, key):
        return TlsConfig(crt, key, trusted_certificates=ca)

    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        rb = Router("routerB", lbmrd_endpoint("B", 2, [trd2], interface="127.0.2.1"),
                    acceptor_peer("B-to-A", 0, interface="127.0.0.1", tls=tls(b_crt, b_key)))
        addr = await n.start(rb.run)
        bad = Router("rogue", lbmrd_endpoint("X", 1, [trd1], interface="127.0.1.1"),
                     initiator_peer("X-to-B", "127.0.0.1", addr["peer"][1], reconnect_interval_ms=200,
                                    tls=tls(x_crt, x_key)))
        rogue = trio.CancelScope()
        n.start_soon(_run_in, rogue, bad)
        with trio.fail_after(10):
            while rb.status()["counters"].get("tls_failed", 0) < 1:
                await trio.sleep(0.05)
        rogue.cancel()
        assert rb.status()["peer"]["state"] == "down"
        assert any(e["event"] == "tls_failed" for e in rb.status()["events"])
        ra = Router("routerA", lbmrd_endpoint("A", 1, [trd1], interface="127.0.1.1"),
                    initiator_peer("A-to-B", "127.0.0.1", addr["peer"][1], tls=tls(a_crt, a_key)))
        await n.start(ra.run)
        with trio.fail_after(10):
            while rb.status()["peer"]["state"] != "CONNECTED":
                await trio.sleep(0.05)
        n.cancel_scope.cancel()


async def _run_in(scope, router):
    with scope:
        await router.run()


async def test_graceful_disconnect_then_reconnect():
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        ra, rb = await start_routers(n, trd1, trd2, reconnect=0.2)
        with trio.fail_after(5):
            while rb.status()["peer"]["state"] != "CONNECTED":
                await trio.sleep(0.01)
        await rb.disconnect("maintenance")
        downs = [e["detail"] for e in ra.status()["events"] if e["event"] == "peer_down"]
        assert downs and "Closed" in downs[-1]  # the handshake, not a lost connection
        with trio.fail_after(5):  # the initiator comes back
            while rb.status()["peer"]["state"] != "CONNECTED":
                await trio.sleep(0.01)
        n.cancel_scope.cancel()
