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
from lbmr_proto.um import synthesize_otid
from lbmr_tools.sim.dataplane import RequestPort, TcpDataReceiver, UmTcpReceiver, UmTcpSource
from router.config.model import RequestListener
from tests.router.helpers import ROUTED_TOPIC, resolve, start_forwarded_pair, udp

SRC = "127.0.1.5"  # the source's context (data and request port)
RCV = "127.0.2.9"  # the receivers' context
SEED, TIDX = 41, 9
RETAINED = 10_000
LISTENER = RequestListener(port=15390)  # each router's <request-tcp> (on 127.0.1.1 and 127.0.2.1)


def source_tir(ip: str, port: int, request_port: int) -> bytes:
    body = L.TcpTransport(ip, port)
    otid = synthesize_otid(body, TIDX)
    return L.encode(L.Packet(0, 1, tirs=[L.TIR(ROUTED_TOPIC, body, 60, TIDX, [
        L.OtidOption(0x8000, otid), L.LateJoinOption(0, request_port, 0, ip, 1, 0, 0),
        L.ExFuncOption(0x8000, request_port, 0, ip, 0x1)])]))


async def start_source(n, trd1, **kw) -> tuple[UmTcpSource, RequestPort]:
    """The retaining source at SRC, transport index 1 of its context, advertised in TRD1."""
    port = RequestPort(SRC)
    await n.start(port.serve)
    src = UmTcpSource(SRC, 0, seed=SEED, tidx=TIDX, message_size=100, retention=RETAINED, **kw)
    ip, p = await n.start(src.serve)
    n.start_soon(src.take_requests, port.serve_source(1))

    async def advertise():
        sock, data = udp(SRC), source_tir(ip, p, port.address[1])
        while True:
            await sock.sendto(data, trd1)
            await trio.sleep(0.5)

    n.start_soon(advertise)
    return src, port


def late_join_option(tir) -> L.LateJoinOption:
    (lj,) = [o for o in tir.options if isinstance(o, L.LateJoinOption)]
    return lj


async def test_a_late_joiner_across_a_pair_gets_10000_retained_messages_then_the_live_stream():
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n, request_listener=LISTENER)
        src, sport = await start_source(n, trd1, rate=20_000, max_burst=256)
        tir = await resolve(udp(RCV), trd2)
        lj = late_join_option(tir)
        assert (lj.src_ip_addr, lj.src_tcp_port) == ("127.0.2.1", LISTENER.port)
        rport = RequestPort(RCV)
        await n.start(rport.serve)
        # a first receiver runs the stream past the retention
        first = TcpDataReceiver(tir.transport.ip, tir.transport.port, None, SEED, tidx=TIDX, bind_ip="127.0.2.20",
                                timeout=60, max_bytes=100 * (RETAINED + 3000) * 4)
        n.start_soon(first.run)
        with trio.fail_after(30):
            while src.next_sqn < RETAINED + 2000:
                await trio.sleep(0.02)
        late = UmTcpReceiver(tir.transport.ip, tir.transport.port, 100 * 2000, SEED, request_port=rport,
                             source_request=(lj.src_ip_addr, lj.src_tcp_port, lj.transport_idx), late_join=True,
                             bind_ip=RCV, timeout=60, idle_timeout=20)
        r = await late.run()
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
        src, sport = await start_source(n, trd1, rate=5000)
        tir = await resolve(udp(RCV), trd2)
        lj = late_join_option(tir)
        rport = RequestPort(RCV)
        await n.start(rport.serve)
        rx = UmTcpReceiver(tir.transport.ip, tir.transport.port, 100 * 3000, SEED, request_port=rport,
                           source_request=(lj.src_ip_addr, lj.src_tcp_port, lj.transport_idx), otr=True,
                           drop_every=17, bind_ip=RCV, timeout=60, idle_timeout=20)
        r = await rx.run()
        n.cancel_scope.cancel()
    assert r.ok, r
    assert r.dropped_on_purpose >= 3000 // 17 - 1 and r.recovered == r.dropped_on_purpose == r.otr_requests
    assert r.unrecovered == 0 and r.messages == r.last_sqn - r.first_sqn + 1
    assert src.counters["rx_answered"] == r.recovered and src.counters["rx_requests"] == r.otr_requests
    assert rb.uim.counters["recovery_requests"] == r.otr_requests
    assert rb.uim.counters["recovery_streams_opened"] == 1  # one stream for the receiver's requests
    assert ra.counters["recovery_requests_delivered"] == r.otr_requests
