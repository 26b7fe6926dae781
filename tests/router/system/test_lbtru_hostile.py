"""The LBT-RU proxy of an LBT-RM source (``<lbt-rm transport="lbt-ru"/>``)
under hostile receivers, end to end inside one network namespace the test
creates (routers, lbmrds, source and receivers in one process, as in
tests/router/system/test_lbtrm_chain.py): r1 in TRD1 relays a multicast source to
r2, whose proxy in TRD2 is an LBT-RU source any host there can reach."""

from __future__ import annotations

import json
import sys

from lbmr_proto import lbtru as RU
from router.core.lbtru_fanout import RX_BURST, RX_TOTAL_BURST
from tests import netns

netns_factory = netns.netns_factory

PRELUDE = r'''
import json, socket, trio
from lbmr_proto import lbtru as RU
from lbmr_tools.sim.dataplane import UmRuDataReceiver
from router.relays import lbtru_fanout
from router.config.model import LbtrmConfig, RouteInfoConfig, acceptor_peer, initiator_peer, lbmrd_endpoint, router_config
from router.shell.router import MultiRouter
from tests.router.helpers import resolve, rm_source, start_lbmrd, udp

IPS = {1: "127.0.1.1", 2: "127.0.2.1"}
RI = RouteInfoConfig(propagation_interval_ms=500, timeout_ms=2000)
TOPIC = "hostile.rm"


async def setup(n, count, *, rate=5000, size=200, max_clients=256):
    """Both routers, the source; the proxy's LBT-RU transport as resolved in TRD2, and r2."""
    trds = {d: (await start_lbmrd(n, IPS[d]))[1] for d in (1, 2)}
    ep2 = lbmrd_endpoint("T2", 2, [trds[2]], interface=IPS[2],
                         lbtrm=LbtrmConfig("239.192.2.1", "239.192.2.2", 15002, transport="lbt-ru",
                                           max_clients=max_clients))
    r2 = MultiRouter(router_config("r2", [ep2], [acceptor_peer("2-1", 0, interface="127.0.0.1")], route_info=RI))
    p21 = (await n.start(r2.run))["links"][0]["peer"]
    ep1 = lbmrd_endpoint("T1", 1, [trds[1]], interface=IPS[1], lbtrm=LbtrmConfig("239.192.1.1", "239.192.1.2", 15001))
    r1 = MultiRouter(router_config("r1", [ep1], [initiator_peer("1-2", p21[0], p21[1], reconnect_interval_ms=200)],
                                   route_info=RI))
    await n.start(r1.run)
    await rm_source(n, trds[1], TOPIC, count=count, rate=rate, size=size)
    return (await resolve(udp("127.0.2.9"), trds[2], timeout=20, topic=TOPIC)).transport, r2


def receiver(b, n_ip, count):
    return UmRuDataReceiver(b.ip, b.port, b.session_id, bind_ip=f"127.0.2.{n_ip}", seed=11, expect_count=count,
                            timeout=40)


def counters(r2):
    c = {}
    for link in r2.status()["links"]:
        for k, v in link["counters"].items():
            if k.startswith(("lbtrm", "lbtru")):
                c[k] = c.get(k, 0) + v
    return c


def clients(n_socks, b, ip="127.0.2.77"):
    """Plain sockets, each a confirmed client of the proxy (CREQ, then an ACK)."""
    socks = []
    for _ in range(n_socks):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        s.bind((ip, 0))
        s.setblocking(False)
        socks.append(s)
    return socks


def drain(socks):
    n = 0
    for s in socks:
        while True:
            try:
                s.recv(65536)
            except OSError:
                break
            n += 1
    return n
'''

NAK_BATCH = PRELUDE + r'''
COUNT = 2000
most = [0, 0]  # datagrams the proxy sent to receivers in one task step: now, at most


class Steps(trio.abc.Instrument):
    def before_task_step(self, task):
        most[0] = 0

    def after_task_step(self, task):
        most[1] = max(most[1], most[0])


send_now = lbtru_fanout.RuProxySource._send_now


def counted(self, out):
    most[0] += len(out)
    return send_now(self, out)


lbtru_fanout.RuProxySource._send_now = counted


async def main():
    out = {}
    async with trio.open_nursery() as n:
        b, r2 = await setup(n, COUNT)
        out["before"] = (await receiver(b, 10, COUNT).run()).as_dict()  # the whole session is in the window now
        socks = clients(64, b)
        for s in socks:
            s.sendto(RU.encode_creq(session_id=b.session_id), (b.ip, b.port))
        # (longer than the proxy's NAKER_WINDOW of 1 s: receiver 10's NAKs no longer count among the batch's)
        await trio.sleep(0.9)
        for s in socks:
            s.sendto(RU.encode_ack(0, session_id=b.session_id), (b.ip, b.port))
        await trio.sleep(0.3)
        drain(socks)
        trio.lowlevel.add_instrument(Steps())
        out["r2_before_batch"] = c0 = counters(r2)
        most[0] = 0  # (this step began before the instrument)
        # 64 NAKs of 361 buffered sequences each, queued before the router reads any: one batch
        nak = RU.encode_nak(range(1000, 1000 + RU.MAX_NAKS), session_id=b.session_id)
        for s in socks:
            s.sendto(nak, (b.ip, b.port))
        with trio.fail_after(20):  # every NAK of the batch taken (and answered: one synchronous call each)
            while counters(r2).get("lbtru_naks_from_clients", 0) - c0.get("lbtru_naks_from_clients", 0) < 64:
                await trio.sleep(0.01)
        out["r2_batch"] = counters(r2)
        out["most_in_one_step"] = most[1]
        out["answered"] = drain(socks)
        out["after"] = (await receiver(b, 11, COUNT).run()).as_dict()
        n.cancel_scope.cancel()
    print(json.dumps(out))

trio.run(main)
'''


def run(ns, script):
    r = ns.run([sys.executable, "-c", script], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    return json.loads(r.stdout)


def test_a_batch_of_naks_from_many_clients_does_not_hold_the_event_loop(netns_factory):
    out = run(netns_factory(), NAK_BATCH)
    assert out["before"]["ok"] and out["before"]["received"] == 2000, out["before"]
    c0, c1 = out["r2_before_batch"], out["r2_batch"]
    c = {k: c1.get(k, 0) - c0.get(k, 0) for k in c1}
    # every NAK answered, sequence by sequence: a retransmission within the client's share of the proxy's
    # burst (RX_BURST each, RX_TOTAL_BURST shared out among the k clients NAKing when the k-th NAKs; its
    # first NAK, so its tokens are the full share whatever the refill since it connected), else an NCF "shed"
    shares = sum(min(RU.MAX_NAKS, int(min(RX_BURST, RX_TOTAL_BURST / k))) for k in range(1, 65))
    assert c["lbtru_naks_from_clients"] == 64, c
    assert c["lbtru_retransmissions"] == shares, (shares, c)
    assert c["lbtru_retransmissions_limited"] == 64 * RU.MAX_NAKS - shares, (shares, c)
    assert out["answered"] >= 0.9 * shares, (out["answered"], shares)
    # ... but the proxy lets other tasks run every 512 datagrams (plus one NAK's answer)
    assert out["most_in_one_step"] <= 512 + 361 + 3, out["most_in_one_step"]
    assert out["after"]["ok"] and out["after"]["received"] == 2000, out["after"]
