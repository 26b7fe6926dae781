"""Multi-hop routing end to end (issue 11, items 2 and 3): routers exchange
route info over their peer links, interest travels hop by hop toward the
sources, proxies come back along the lowest-cost path, data is relayed hop by
hop. TRDs are in-process lbmrds on 127.0.d.1; peer links on 127.0.0.1."""

from __future__ import annotations

import trio

import lbmr_proto as L
from tests.router.helpers import (
    IPS,
    Cuttable,
    acceptor_link,
    advertise_forever,
    converged,
    every_trd_gets_the_others,
    fetch_tcp,
    initiator_link,
    multihop_router,
    pattern,
    resolve,
    ru_through,
    start_lbmrd,
    start_loop,
    tcp_source,
    udp,
)


async def start_chain(n):
    """r1 (TRD1) - r2 (TRD2) - r3 (TRD3)."""
    trds = {d: (await start_lbmrd(n, IPS[d]))[1] for d in (1, 2, 3)}
    r2 = multihop_router("r2", 2, trds[2], [acceptor_link("2-1"), acceptor_link("2-3")])
    p21, p23 = (lk["peer"] for lk in (await n.start(r2.run))["links"])
    r1 = multihop_router("r1", 1, trds[1], [initiator_link("1-2", p21)])
    r3 = multihop_router("r3", 3, trds[3], [initiator_link("3-2", p23)])
    await n.start(r1.run)
    await n.start(r3.run)
    return (r1, r2, r3), trds


async def test_chain_tcp_from_trd1_reaches_trd3_through_two_hops():
    async with trio.open_nursery() as n:
        (r1, r2, r3), trds = await start_chain(n)
        await converged((r1, r2, r3), (1, 2, 3))
        assert r3.status()["topology"]["routes"]["1"]["path"] == ["r3", "r2", "r1"]
        sip, sport = await tcp_source(n, "127.0.1.5", 3_000_000)
        n.start_soon(advertise_forever, udp("127.0.1.5"), trds[1], sip, sport, "chain.tcp")
        tir = await resolve(udp("127.0.3.9"), trds[3], topic="chain.tcp")
        assert tir.transport.ip == IPS[3]  # r3's proxy
        # its TIRs say how far the source is: two hops, at the cost of r3's route to TRD1
        (cost,) = [o for o in tir.options if isinstance(o, L.CostOption)]
        assert (cost.hop_count, cost.cost) == (2, r3.status()["topology"]["routes"]["1"]["cost"]) == (2, 5)
        assert await fetch_tcp(tir, 3_000_000) == pattern(3_000_000)
        # r2 carried it: a proxy of its own (advertised in TRD2 too) and a transit advert to r3
        assert r2.status()["topology"]["transit"]["adverts"] == 1
        text = r3.prometheus_text()
        assert "lbmr_router_topology_routers 3" in text
        assert 'lbmr_router_route_hops{domain="1"} 2' in text
        assert 'lbmr_router_route_cost{domain="1",next_hop="r2"} 5' in text  # 2 links of 1+1, endpoint 1
        n.cancel_scope.cancel()


async def test_chain_lbtru_from_trd1_reaches_trd3_through_two_hops():
    async with trio.open_nursery() as n:
        (r1, r2, r3), trds = await start_chain(n)
        await converged((r1, r2, r3), (1, 2, 3))
        await ru_through(n, "127.0.1.5", trds[1], trds[3], "127.0.3.9", IPS[3], "chain.ru", count=3000)
        n.cancel_scope.cancel()


async def test_chain_wildcard_receiver_two_hops_away():
    import lbmr_proto as L

    async with trio.open_nursery() as n:
        (r1, r2, r3), trds = await start_chain(n)
        await converged((r1, r2, r3), (1, 2, 3))
        sip, sport = await tcp_source(n, "127.0.1.5", 100_000)
        n.start_soon(advertise_forever, udp("127.0.1.5"), trds[1], sip, sport, "md.eq.IBM")
        rcv = udp("127.0.3.9")
        wc = L.encode(L.Packet(L.PacketType.WC_TQR, 0, wc_tqrs=[L.WcTQR("^md\\.eq\\.", 1)]))
        with trio.fail_after(15):
            while True:
                await rcv.sendto(wc, trds[3])
                with trio.move_on_after(0.3):
                    data, _ = await rcv.recvfrom(65536)
                    tirs = [t for t in L.decode(data).tirs if t.topic == "md.eq.IBM"]
                    if tirs and tirs[0].transport.ip == IPS[3]:
                        break
        assert await fetch_tcp(tirs[0], 100_000) == pattern(100_000)
        n.cancel_scope.cancel()


async def test_mesh_of_four_every_topic_once_per_trd():
    """Four routers, each linked to the three others: every TRD's receiver gets
    every other TRD's source byte-exact, and each topic is advertised exactly
    once into each TRD (no router carries a source on off its path)."""
    async with trio.open_nursery() as n:
        trds = {d: (await start_lbmrd(n, IPS[d]))[1] for d in IPS}
        r4 = multihop_router("r4", 4, trds[4], [acceptor_link("4-1"), acceptor_link("4-2"), acceptor_link("4-3")])
        p41, p42, p43 = (lk["peer"] for lk in (await n.start(r4.run))["links"])
        r3 = multihop_router("r3", 3, trds[3], [acceptor_link("3-1"), acceptor_link("3-2"), initiator_link("3-4", p43)])
        p31, p32 = (lk["peer"] for lk in (await n.start(r3.run))["links"][:2])
        r2 = multihop_router("r2", 2, trds[2], [acceptor_link("2-1"), initiator_link("2-3", p32), initiator_link("2-4", p42)])
        p21 = (await n.start(r2.run))["links"][0]["peer"]
        r1 = multihop_router("r1", 1, trds[1], [initiator_link("1-2", p21), initiator_link("1-3", p31), initiator_link("1-4", p41)])
        await n.start(r1.run)
        routers = (r1, r2, r3, r4)
        await converged(routers, IPS)
        await every_trd_gets_the_others(n, IPS, trds)
        for r in routers:
            assert r.status()["topology"]["transit"]["adverts"] == 0  # all direct: nothing carried on
        n.cancel_scope.cancel()


async def test_loop_of_three_survives_a_cut_of_the_cheapest_link():
    """r1 (source) - r2 - r3 (receiver) is the cheap way, r1 - r3 direct the dear
    one. The r1-r2 link is cut while a stream runs: r3's proxy on the old path
    is withdrawn, and a new stream flows over r1-r3 within the route timeout."""
    async with trio.open_nursery() as n:
        (r1, r2, r3), trds, fwd = await start_loop(n)
        assert r3.status()["topology"]["routes"]["1"]["path"] == ["r3", "r2", "r1"]
        total = 50_000_000
        sip, sport = await tcp_source(n, "127.0.1.5", total)
        n.start_soon(advertise_forever, udp("127.0.1.5"), trds[1], sip, sport, "loop.tcp")
        rcv = udp("127.0.3.9")
        old = await resolve(rcv, trds[3], topic="loop.tcp")
        stream = await trio.open_tcp_stream(old.transport.ip, old.transport.port)
        got = 0
        with trio.fail_after(10):
            while got < 1_000_000:
                got += len(await stream.receive_some(65536))
        fwd.cut()
        t0 = trio.current_time()
        with trio.fail_after(10):  # the stream over the cut path ends
            try:
                while await stream.receive_some(65536):
                    pass
            except trio.BrokenResourceError:
                pass
        await stream.aclose()
        with trio.fail_after(2.0 + 1.0 + 5.0):  # route timeout + 1 s, and some slack for a busy machine
            while True:
                t = await resolve(rcv, trds[3], topic="loop.tcp")
                if (t.transport.ip, t.transport.port) != (old.transport.ip, old.transport.port):
                    break
                await trio.sleep(0.1)
        rerouted = trio.current_time() - t0
        print(f"rerouted in {rerouted:.2f} s")
        assert r3.status()["topology"]["routes"]["1"]["path"] == ["r3", "r1"]
        s3 = r3.status()
        assert s3["portals"][0]["counters"].get("withdrawals_received", 0) >= 1  # the old proxy
        assert await fetch_tcp(t, total) == pattern(total)
        n.cancel_scope.cancel()


class Freezable(Cuttable):
    """A forwarder that can stop carrying bytes without closing anything (a
    link whose far side hangs)."""

    def __init__(self, target):
        super().__init__(target)
        self.frozen = False
        self.thawed = trio.Event()

    async def _handle(self, a):
        async with a, await trio.open_tcp_stream(*self.target) as b:
            async with trio.open_nursery() as n:
                n.start_soon(self._pump, a, b)
                n.start_soon(self._pump, b, a)

    async def _pump(self, src, dst):
        try:
            while data := await src.receive_some(65536):
                if self.frozen:
                    await self.thawed.wait()
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


async def test_a_silent_router_is_forgotten_after_the_route_timeout(autojump_clock):
    """r1 - r2 - r3 with the r1-r2 link frozen (bytes stop, nothing closes): r2
    and r3 forget r1 and its domain once route info from it has been missing
    for the route timeout (2 s here), long before the link's keepalive
    timeout (15 s) declares the link dead. On trio's virtual clock."""
    async with trio.open_nursery() as n:
        trds = {d: (await start_lbmrd(n, IPS[d]))[1] for d in (1, 2, 3)}
        r2 = multihop_router("r2", 2, trds[2], [acceptor_link("2-1"), acceptor_link("2-3")])
        p21, p23 = (lk["peer"] for lk in (await n.start(r2.run))["links"])
        fwd = Freezable(p21)
        via = await n.start(fwd.serve)
        r1 = multihop_router("r1", 1, trds[1], [initiator_link("1-2", via)])
        r3 = multihop_router("r3", 3, trds[3], [initiator_link("3-2", p23)])
        await n.start(r1.run)
        await n.start(r3.run)
        await converged((r1, r2, r3), (1, 2, 3))
        fwd.frozen = True
        t0 = trio.current_time()
        with trio.fail_after(10):
            while "1" in r3.status()["topology"]["routes"]:
                await trio.sleep(0.05)
        gone = trio.current_time() - t0
        assert 1.5 <= gone <= 2.0 + 0.5 + 0.5, gone  # the timeout, give or take an announcement
        assert "r1" not in r2.status()["topology"]["nodes"]
        link = next(lk for lk in r2.status()["links"] if lk["peer"]["name"] == "2-1")
        assert link["peer"]["state"] == "CONNECTED"  # the keepalive timeout has not run out
        fwd.thawed.set()
        fwd.frozen = False
        with trio.fail_after(10):  # r1's next announcement brings it back
            await converged((r1, r2, r3), (1, 2, 3))
        n.cancel_scope.cancel()
