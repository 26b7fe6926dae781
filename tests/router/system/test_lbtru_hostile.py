"""The LBT-RU proxy of an LBT-RM source (``<lbt-rm transport="lbt-ru"/>``)
under hostile receivers, end to end inside one network namespace the test
creates (routers, lbmrds, source and receivers in one process, as in
tests/router/system/test_lbtrm_chain.py): r1 in TRD1 relays a multicast source to
r2, whose proxy in TRD2 is an LBT-RU source any host there can reach."""

from __future__ import annotations

import json
import sys

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
        await trio.sleep(0.3)
        for s in socks:
            s.sendto(RU.encode_ack(0, session_id=b.session_id), (b.ip, b.port))
        await trio.sleep(0.3)
        drain(socks)
        trio.lowlevel.add_instrument(Steps())
        most[0] = 0  # (this step began before the instrument)
        # 64 NAKs of 361 buffered sequences each, queued before the router reads any: one batch
        nak = RU.encode_nak(range(1000, 1000 + RU.MAX_NAKS), session_id=b.session_id)
        for s in socks:
            s.sendto(nak, (b.ip, b.port))
        await trio.sleep(1.0)
        out["most_in_one_step"] = most[1]
        out["answered"] = drain(socks)
        out["after"] = (await receiver(b, 11, COUNT).run()).as_dict()
        out["r2"] = counters(r2)
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
    c = out["r2"]
    # every NAK answered: retransmissions up to each client's share of the proxy's burst of 5000
    # among the (at most 65) clients NAKing, the rest an NCF "shed"
    assert c["lbtru_naks_from_clients"] >= 64 and c["lbtru_retransmissions"] >= 64 * 76, c
    assert c["lbtru_retransmissions_limited"] >= 64 * (361 - 76 - 50), c
    assert out["answered"] >= 64 * 76 * 0.9, out["answered"]
    # ... but the proxy lets other tasks run every 512 datagrams (plus one NAK's answer)
    assert out["most_in_one_step"] <= 512 + 361 + 3, out["most_in_one_step"]
    assert out["after"]["ok"] and out["after"]["received"] == 2000, out["after"]
