"""Section 7 of bench/router.py: late join of RETAINED retained messages, through a
pair of routers against straight from the source, in the same run.

One trio loop in this process (as tests/router/system/test_late_join_otr.py sets it
up): two lbmrds (TRD1 on 127.0.1.1, TRD2 on 127.0.2.1), routers A and B
(``router.shell.single.Router``, fan-out, each with a <request-tcp> listener),
lbmr-sim's retaining TCP source on 127.0.1.5 (100-byte messages at RATE a
second, its last RETAINED kept; its TIR's late-join option names its context's
request port) and a receiver through B's proxy that keeps the stream running.
Each round, a late joiner (lbmr-sim's UmTcpReceiver) connects, sends its LJI_REQ
as a UIM to the source's request port ("direct": the source's own port;
"routed": the listener the proxy's late-join option names, router B's, whence it
crosses the peer link to router A and the source) and takes UME_LJ_INFO, the
RETAINED messages as RETRANS (each verified), then LIVE live messages. Its time
runs from its connect to its last message; the best of --lj-rounds rounds of
each, the order alternating, and routed / direct. Everything in one loop: the
routers, the source and the receivers share a CPU (the direct case too).
"""

from __future__ import annotations

import trio

import lbmr_proto as L
from lbmr_proto.um import synthesize_otid
from lbmr_tools.sim.dataplane import RequestPort, TcpDataReceiver, UmTcpReceiver, UmTcpSource
from lbmrd.server import Daemon, Settings
from router.config.model import RequestListener, acceptor_peer, initiator_peer, lbmrd_endpoint
from router.shell.single import Router

__all__ = ["run_latejoin", "RETAINED", "LIVE", "RATE"]

RETAINED = 10_000  # retained messages a late joiner gets
LIVE = 200  # live messages it takes after them
RATE = 20_000.0  # the source's messages a second
SIZE = 100  # payload bytes per message
TOPIC = "bench.latejoin"
SRC, RCV = "127.0.1.5", "127.0.2.9"
SEED, TIDX = 77, 5
LIMIT_S = 120.0


async def _lbmrd(n, ip):
    return await n.start(Daemon(Settings(bind_ip=ip, port=0, stats_interval=0)).run)


async def _resolve(daemon) -> L.TIR:
    sock = trio.socket.socket(type=trio.socket.SOCK_DGRAM)
    await sock.bind((RCV, 0))
    tqr = L.encode(L.Packet(0, 1, tqrs=[L.TQR(TOPIC)]))
    with trio.fail_after(20), sock:
        while True:
            await sock.sendto(tqr, daemon)
            with trio.move_on_after(0.2):
                while True:
                    data, _ = await sock.recvfrom(65535)
                    try:
                        tirs = L.decode(data).tirs
                    except L.LBMRDecodeError:
                        continue
                    for t in tirs:
                        if t.topic == TOPIC and any(isinstance(o, L.LateJoinOption) for o in t.options or ()):
                            return t


async def _measure(rounds: int) -> dict:
    async with trio.open_nursery() as n:
        n.cancel_scope.deadline = trio.current_time() + LIMIT_S
        trd1, trd2 = await _lbmrd(n, "127.0.1.1"), await _lbmrd(n, "127.0.2.1")
        rb = Router("routerB", lbmrd_endpoint("B-TRD2", 2, [trd2], interface="127.0.2.1",
                                             request_listener=RequestListener(port=15490)),
                    acceptor_peer("B-to-A", 0, interface="127.0.0.1"))
        b = await n.start(rb.run)
        ra = Router("routerA", lbmrd_endpoint("A-TRD1", 1, [trd1], interface="127.0.1.1",
                                             request_listener=RequestListener(port=15490)),
                    initiator_peer("A-to-B", "127.0.0.1", b["peer"][1], reconnect_interval_ms=500))
        await n.start(ra.run)
        sport = RequestPort(SRC)
        await n.start(sport.serve)
        src = UmTcpSource(SRC, 0, seed=SEED, tidx=TIDX, message_size=SIZE, retention=RETAINED, rate=RATE,
                          max_burst=256)
        ip, port = await n.start(src.serve)
        n.start_soon(src.take_requests, sport.serve_source(1))
        body = L.TcpTransport(ip, port)
        tir = L.encode(L.Packet(0, 1, tirs=[L.TIR(TOPIC, body, 60, TIDX, [
            L.OtidOption(0x8000, synthesize_otid(body, TIDX)),
            L.LateJoinOption(0, sport.address[1], 0, ip, 1, 0, 0),
            L.ExFuncOption(0x8000, sport.address[1], 0, ip, 0x1)])]))

        async def advertise():
            sock = trio.socket.socket(type=trio.socket.SOCK_DGRAM)
            await sock.bind((SRC, 0))
            while True:
                await sock.sendto(tir, trd1)
                await trio.sleep(0.5)

        n.start_soon(advertise)
        proxy = await _resolve(trd2)
        (lj,) = [o for o in proxy.options if isinstance(o, L.LateJoinOption)]
        keep = TcpDataReceiver(proxy.transport.ip, proxy.transport.port, None, SEED, tidx=TIDX,
                               bind_ip="127.0.2.20", timeout=LIMIT_S, max_bytes=1 << 40)
        n.start_soon(keep.run)  # the stream runs: the source has history to give
        while src.next_sqn < RETAINED + 2000:
            await trio.sleep(0.05)
        rport = RequestPort(RCV)
        await n.start(rport.serve)
        paths = {"direct": ((ip, port), (sport.address[0], sport.address[1], 1)),
                 "routed": ((proxy.transport.ip, proxy.transport.port), (lj.src_ip_addr, lj.src_tcp_port,
                                                                         lj.transport_idx))}
        times: dict[str, list[float]] = {k: [] for k in paths}
        errors: list[str] = []
        for r in range(rounds):
            for key in (("direct", "routed") if r % 2 == 0 else ("routed", "direct")):
                data, req = paths[key]
                rx = UmTcpReceiver(*data, SIZE * LIVE, SEED, request_port=rport, source_request=req,
                                   late_join=True, bind_ip=RCV, timeout=60, idle_timeout=20)
                res = await rx.run()
                got = None if res.lj_high is None else res.lj_high - res.lj_low + 1
                if not res.ok or got != RETAINED:  # (those before its join point fill its stream)
                    errors.append(f"{key}: {res.error or f'{got} retained'}")
                    continue
                times[key].append(res.elapsed)
        out = {"times": times, "errors": errors, "b": dict(rb.uim.counters), "a": dict(ra.counters)}
        n.cancel_scope.cancel()
    return out


def run_latejoin(rounds: int = 3) -> None:
    """Measure and print section 7."""
    print(f"\n7. Late join of {RETAINED:,} retained messages ({SIZE} B, source at {RATE:,.0f}/s) then {LIVE} live, "
          f"one trio loop in this process, best of {rounds} rounds")
    res = trio.run(_measure, rounds)
    best = {k: min(v) for k, v in res["times"].items() if v}
    for key, what in (("direct", "straight from the source (its request port)"),
                      ("routed", "through routers B and A (B's <request-tcp>, RECOVERY stream)")):
        t = best.get(key)
        print(f"    {what:62s} " + (f"{t * 1000:8.1f} ms  ({RETAINED / t:,.0f} messages/s)" if t else "failed"))
    if "direct" in best and "routed" in best:
        print(f"    ratio routed / direct (time)  {best['routed'] / best['direct']:6.3f}x")
    for e in res["errors"]:
        print(f"    error: {e}")
