"""Late join and OTR across routers, the data path, on loopback: lbmr-sim's retaining
TCP source in TRD1 (its TIR's late-join option names its context's request port),
receivers in TRD2 behind router B. A receiver sends its LJI_REQ / UME_RXREQ as a UIM
to the request listener the proxy's TIR names (router B's <request-tcp>); B carries it
on a RECOVERY stream to router A, which delivers it to the source's request port with
the source's transport index and a listener of its own as answer address; the
source's answers (UME_LJ_INFO, RETRANS) come back to the receiver's request port.
A late joiner gets 10,000 retained messages then the live stream, consecutive; an
OTR receiver that throws messages away gets every one back."""

from __future__ import annotations

import trio

import lbmr_proto as L
from lbmr_proto import lbmc
from lbmr_tools.sim.dataplane import RequestPort, TcpDataReceiver
from router.config.model import RequestListener, lbmrd_endpoint, router_config
from router.shell.router import MultiRouter
from tests.router.helpers import (
    IPS,
    LJ_SEED,
    LJ_TIDX,
    ROUTE_INFO,
    ROUTED_TOPIC,
    acceptor_link,
    converged,
    initiator_link,
    recovering_receiver,
    resolve,
    retaining_source,
    start_forwarded_pair,
    start_lbmrd,
    udp,
)

RCV = "127.0.2.9"  # the receivers' context
RETAINED = 10_000
LISTENER = RequestListener(port=15390)  # each router's <request-tcp> (on 127.0.1.1 and 127.0.2.1)


async def test_a_late_joiner_across_a_pair_gets_10000_retained_messages_then_the_live_stream():
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n, request_listener=LISTENER)
        src, sport = await retaining_source(n, trd1, retention=RETAINED, rate=20_000, max_burst=256)
        tir = await resolve(udp(RCV), trd2)
        (lj,) = [o for o in tir.options if isinstance(o, L.LateJoinOption)]
        assert (lj.src_ip_addr, lj.src_tcp_port) == ("127.0.2.1", LISTENER.port)
        rport = RequestPort(RCV)
        await n.start(rport.serve)
        # a first receiver runs the stream past the retention
        first = TcpDataReceiver(tir.transport.ip, tir.transport.port, None, LJ_SEED, tidx=LJ_TIDX, bind_ip="127.0.2.20",
                                timeout=60, max_bytes=100 * (RETAINED + 3000) * 4)
        n.start_soon(first.run)
        with trio.fail_after(30):
            while src.next_sqn < RETAINED + 2000:
                await trio.sleep(0.02)
        r = await recovering_receiver(tir, rport, 100 * 2000, late_join=True).run()
        n.cancel_scope.cancel()
    assert r.ok, r
    # 10,000 retained messages, then the live stream from the first live one: one consecutive stream
    assert r.lj_high - r.lj_low + 1 == RETAINED and r.first_sqn == r.lj_low
    assert r.first_live_sqn == r.lj_high + 1 or r.first_live_sqn <= r.lj_high
    assert r.recovered == r.first_live_sqn - r.lj_low and r.messages == r.last_sqn - r.first_sqn + 1
    # the source got the request from router A (its own transport index, A's listener), no other
    assert src.counters["lj_requests"] == src.counters["lj_answered"] == 1
    assert src.counters["wrong_topic"] == src.counters["answers_refused"] == 0
    assert sport.stats.recovery_requests == 1 and sport.stats.unknown_transport == 0
    ub, ca = rb.uim.counters, ra.counters
    assert ub["recovery_requests"] == 1 and ub["recovery_streams_opened"] == 1
    assert ub["recovery_receiver_connections"] == 1 and ub["recovery_receiver_gone"] == 0
    assert ca["recovery_streams_accepted"] == 1 and ca["recovery_requests_delivered"] == 1
    assert ca["recovery_answer_messages"] == RETAINED + 1  # UME_LJ_INFO and the RETRANS messages
    assert rport.stats.unclaimed == 0 and rport.stats.retransmissions == RETAINED


async def test_an_otr_receiver_recovers_what_it_threw_away_through_the_routers():
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n, request_listener=LISTENER)
        src, sport = await retaining_source(n, trd1, rate=5000)
        tir = await resolve(udp(RCV), trd2)
        rport = RequestPort(RCV)
        await n.start(rport.serve)
        r = await recovering_receiver(tir, rport, 100 * 3000, otr=True, drop_every=17).run()
        n.cancel_scope.cancel()
    assert r.ok, r
    assert r.dropped_on_purpose >= 3000 // 17 - 1 and r.recovered == r.dropped_on_purpose == r.otr_requests
    assert r.unrecovered == 0 and r.messages == r.last_sqn - r.first_sqn + 1
    assert src.counters["rx_answered"] == r.recovered and src.counters["rx_requests"] == r.otr_requests
    assert rb.uim.counters["recovery_requests"] == r.otr_requests
    assert rb.uim.counters["recovery_streams_opened"] == 1  # one stream for the receiver's requests
    assert ra.counters["recovery_requests_delivered"] == r.otr_requests


# ------------------------------------------------------------------ hostile


async def test_unknown_transport_indexes_floods_and_a_receiver_gone_are_bounded_and_counted():
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n, request_listener=LISTENER)
        src, sport = await retaining_source(n, trd1, rate=1000)
        tir = await resolve(udp(RCV), trd2)
        (lj,) = [o for o in tir.options if isinstance(o, L.LateJoinOption)]
        first = TcpDataReceiver(tir.transport.ip, tir.transport.port, None, LJ_SEED, tidx=LJ_TIDX,
                                bind_ip="127.0.2.20", timeout=60, max_bytes=100 * 1_000_000)
        n.start_soon(first.run)  # the stream runs
        with trio.fail_after(10):
            while src.next_sqn < 500:
                await trio.sleep(0.02)
        ub = rb.uim.counters
        uim = await trio.open_tcp_stream("127.0.2.1", LISTENER.port)
        # 1. an LJI_REQ for a transport index no proxy has: dropped at B, nothing crosses
        await uim.send_all(control(lbmc.LateJoinRequestHeader(0, 1, lj.transport_idx + 100, LJ_TIDX, RCV, 14392)))
        await settled(lambda: ub["recovery_unknown_proxy"] == 1)
        # 2. a receiver gone: its request crosses, the source answers to A's listener, B cannot
        # reach the receiver: counted, the stream ends (A's listener with it)
        await uim.send_all(control(lbmc.LateJoinRequestHeader(0, 2, lj.transport_idx, LJ_TIDX, RCV, 9)))
        await settled(lambda: ub["recovery_receiver_gone"] == 1)
        await settled(lambda: len(ra.relay.recovery.map) == 0)
        assert src.counters["lj_answered"] == 1 and ra.counters["recovery_streams_accepted"] == 1
        # 3. a flood: 50,000 OTR requests from one connection, as fast as it can send them,
        # for a receiver address nobody listens at either: B queues at most its bound and
        # counts the rest; the router stays up and a late joiner is still served
        flood = control(*[lbmc.UmeRxReqHeader(0, k, lj.transport_idx, LJ_TIDX, k, 10, 0, RCV)
                          for k in range(1)]) * 50_000
        with trio.fail_after(30):
            await uim.send_all(flood)
        await settled(lambda: ub["uim_in"] >= 50_002, timeout=30)
        assert ub["recovery_requests"] == 50_001  # every one decided: one stream's queue, bounded
        assert rb.uim.queued <= 64 << 20 and rb.uim.target_count <= 2
        # (all of them delivered to the source, which refuses what it cannot queue; the
        # routers, the source and this test share one thread: let the flood pass first)
        await settled(lambda: rb.uim.queued == 0, timeout=30)
        await quiet(lambda: ra.counters["recovery_requests_delivered"])
        assert ra.counters["recovery_requests_delivered"] <= ub["recovery_requests_sent"]
        dropped = ub["uim_target_queue_full"] + ub["recovery_requests_failed"] + ub["uim_target_closed"]
        assert ub["recovery_requests_sent"] + dropped == 50_001, dict(ub)
        rport = RequestPort(RCV)
        await n.start(rport.serve)
        r = await recovering_receiver(tir, rport, 100 * 500, late_join=True).run()
        await uim.aclose()
        n.cancel_scope.cancel()
    assert r.ok and r.recovered >= 1, r
    assert ra.counters["recovery_streams_accepted"] >= 3  # the gone receiver's, the flood's, the joiner's


async def test_a_chain_of_three_serves_a_late_joiner_hop_by_hop():
    async with trio.open_nursery() as n:
        r1, r2, r3, trds = await late_join_chain(n)
        src, sport = await retaining_source(n, trds[1], retention=2000, rate=10_000)
        tir = await resolve(udp("127.0.3.9"), trds[3], timeout=20)
        (lj,) = [o for o in tir.options if isinstance(o, L.LateJoinOption)]
        assert (lj.src_ip_addr, lj.src_tcp_port) == ("127.0.3.1", 15393)
        first = TcpDataReceiver(tir.transport.ip, tir.transport.port, None, LJ_SEED, tidx=LJ_TIDX,
                                bind_ip="127.0.3.20", timeout=60, max_bytes=100 * 1_000_000)
        n.start_soon(first.run)
        with trio.fail_after(20):
            while src.next_sqn < 3000:
                await trio.sleep(0.02)
        rport = RequestPort("127.0.3.9")
        await n.start(rport.serve)
        r = await recovering_receiver(tir, rport, 100 * 1000, late_join=True).run()
        n.cancel_scope.cancel()
    assert r.ok, r
    assert r.lj_high - r.lj_low + 1 == 2000 and r.first_sqn == r.lj_low
    assert r.messages == r.last_sqn - r.first_sqn + 1
    assert src.counters["lj_answered"] == 1 and src.counters["wrong_topic"] == 0
    # r3 took the request; r2 served r3's stream through its own listener and took it on to r1
    assert r3.uim.counters["recovery_requests"] == 1 and r2.uim.counters["recovery_requests"] == 1
    (middle,) = [s["counters"] for s in r2.portal_summary()]
    assert middle["recovery_requests_delivered"] == 1


async def late_join_chain(n):
    """TRD1..3 and routers r1 - r2 - r3, each endpoint with a request listener
    (127.0.d.1:15390 + d), fanned out: (r1, r2, r3, trds)."""
    trds = {d: (await start_lbmrd(n, IPS[d]))[1] for d in (1, 2, 3)}

    def router(name, d, peers):
        ep = lbmrd_endpoint(f"T{d}", d, [trds[d]], interface=IPS[d],
                            request_listener=RequestListener(port=15390 + d))
        return MultiRouter(router_config(name, [ep], peers, route_info=ROUTE_INFO))

    r2 = router("r2", 2, [acceptor_link("2-1"), acceptor_link("2-3")])
    p21, p23 = (lk["peer"] for lk in (await n.start(r2.run))["links"])
    r1 = router("r1", 1, [initiator_link("1-2", p21)])
    r3 = router("r3", 3, [initiator_link("3-2", p23)])
    await n.start(r1.run)
    await n.start(r3.run)
    await converged((r1, r2, r3), (1, 2, 3))
    # a receiver in TRD2 too: r2 advertises its proxy there (a proxy only passed on, not
    # advertised in r2's TRD, takes no late join: r2's listener would not know it)
    n.start_soon(keep_querying, udp("127.0.2.9"), trds[2])
    return r1, r2, r3, trds


async def keep_querying(sock, trd):
    tqr = L.encode(L.Packet(0, 1, tqrs=[L.TQR(ROUTED_TOPIC)]))
    while True:
        await sock.sendto(tqr, trd)
        await trio.sleep(0.5)


def control(*headers) -> bytes:
    return lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=headers))


async def quiet(value, interval=1.0, timeout=30.0):
    """Until ``value()`` stays the same for ``interval`` seconds."""
    with trio.fail_after(timeout):
        last = value()
        while True:
            await trio.sleep(interval)
            if value() == last:
                return
            last = value()


async def settled(cond, timeout=10.0):
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.02)


async def test_one_router_joining_two_trds_serves_a_late_joiner():
    """A router with an endpoint in each TRD (no peer link): the request crosses between
    its endpoints in memory, as the session does."""
    async with trio.open_nursery() as n:
        trds = {d: (await start_lbmrd(n, IPS[d]))[1] for d in (1, 2)}
        eps = [lbmrd_endpoint(f"TRD{d}", d, [trds[d]], interface=IPS[d], request_listener=LISTENER) for d in (1, 2)]
        router = MultiRouter(router_config("direct", eps))
        await n.start(router.run)
        src, sport = await retaining_source(n, trds[1], retention=2000, rate=10_000)
        tir = await resolve(udp(RCV), trds[2])
        first = TcpDataReceiver(tir.transport.ip, tir.transport.port, None, LJ_SEED, tidx=LJ_TIDX,
                                bind_ip="127.0.2.20", timeout=60, max_bytes=100 * 1_000_000)
        n.start_soon(first.run)
        with trio.fail_after(20):
            while src.next_sqn < 3000:
                await trio.sleep(0.02)
        rport = RequestPort(RCV)
        await n.start(rport.serve)
        r = await recovering_receiver(tir, rport, 100 * 500, late_join=True).run()
        n.cancel_scope.cancel()
    assert r.ok, r
    assert r.lj_high - r.lj_low + 1 == 2000 and r.first_sqn == r.lj_low and r.messages == r.last_sqn - r.first_sqn + 1
    assert router.uim.counters["recovery_requests"] == 1 and router.uim.counters["recovery_streams_opened"] == 1
