"""An LBT-RM source across two hops (chain r1 - r2 - r3), run inside one
network namespace the test creates (its loopback carries the multicast):
TRD1, TRD2 and TRD3 are in-process lbmrds on 127.0.d.1, each router's LBT-RM
proxies use groups of their own range. r2 proxies the source into TRD2 and
r3's link joins that proxy's group; a receiver in TRD3 discards every 25th
datagram and recovers it by NAK through both hops, byte-exact.

With r2's endpoint re-publishing LBT-RM as LBT-RU (``transport="lbt-ru"``)
the session goes on from r2 as LBT-RU: r3's link is one LBT-RU client of
r2's proxy (LBT-RU fan-out), r3's proxy an LBT-RU source of its own, and a
UM LBT-RU receiver in TRD3 connects to it and recovers its losses from it."""

from __future__ import annotations

import json
import sys

from tests import netns

netns_factory = netns.netns_factory

SCRIPT = r'''
import json, trio
import sys
from lbmr_tools.sim.dataplane import RmDataReceiver, UmRuDataReceiver
from router.config.model import LbtrmConfig, RouteInfoConfig, acceptor_peer, initiator_peer, lbmrd_endpoint, router_config
from router.shell.router import MultiRouter
from tests.router.helpers import resolve, rm_source, start_lbmrd, udp

IPS = {d: f"127.0.{d}.1" for d in (1, 2, 3)}
RI = RouteInfoConfig(propagation_interval_ms=500, timeout_ms=2000)
COUNT, TOPIC = 2000, "chain.rm"

R2_TRANSPORT = sys.argv[1]  # what r2 re-publishes LBT-RM sources as

def router(name, d, trd, peers):
    ep = lbmrd_endpoint(f"T{d}", d, [trd], interface=IPS[d],
                        lbtrm=LbtrmConfig(f"239.192.{d}.1", f"239.192.{d}.2", 15000 + d,
                                          transport=R2_TRANSPORT if d == 2 else "lbt-rm"))
    return MultiRouter(router_config(name, [ep], peers, route_info=RI))

async def main():
    out = {}
    async with trio.open_nursery() as n:
        trds = {d: (await start_lbmrd(n, IPS[d]))[1] for d in (1, 2, 3)}
        r2 = router("r2", 2, trds[2], [acceptor_peer("2-1", 0, interface="127.0.0.1"),
                                       acceptor_peer("2-3", 0, interface="127.0.0.1")])
        p21, p23 = (lk["peer"] for lk in (await n.start(r2.run))["links"])
        r1 = router("r1", 1, trds[1], [initiator_peer("1-2", p21[0], p21[1], reconnect_interval_ms=200)])
        r3 = router("r3", 3, trds[3], [initiator_peer("3-2", p23[0], p23[1], reconnect_interval_ms=200)])
        await n.start(r1.run)
        await n.start(r3.run)
        await rm_source(n, trds[1], TOPIC, count=COUNT, rate=1000)
        t = await resolve(udp("127.0.3.9"), trds[3], timeout=20, topic=TOPIC)
        b = t.transport
        out["transport"] = [b.NAME, b.ip, getattr(b, "mcast_group", None), getattr(b, "dest_port", None)]
        if b.NAME == "LBTRM":
            rx = RmDataReceiver(b.ip, b.src_ucast_port, b.session_id, b.mcast_group, b.dest_port,
                                iface_ip="127.0.3.9", seed=11, expect_count=COUNT, drop_every=25, timeout=40)
        else:
            rx = UmRuDataReceiver(b.ip, b.port, getattr(b, "session_id", None), bind_ip="127.0.3.9", seed=11,
                                  expect_count=COUNT, drop_every=25, timeout=40)
        out["rx"] = (await rx.run()).as_dict()
        for name, r in (("r2", r2), ("r3", r3)):
            out[name] = {}
            for link in r.status()["links"]:  # summed over the router's links
                for k, v in link["counters"].items():
                    if k.startswith(("lbtrm", "lbtru", "ru_")):
                        out[name][k] = out[name].get(k, 0) + v
        n.cancel_scope.cancel()
    print(json.dumps(out))

trio.run(main)
'''


def test_lbtrm_source_across_two_hops(netns_factory):
    ns = netns_factory()
    r = ns.run([sys.executable, "-c", SCRIPT, "lbt-rm"], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["transport"] == ["LBTRM", "127.0.3.1", "239.192.3.1", 15003], out  # r3's proxy, r3's range
    rx = out["rx"]
    assert rx["ok"] and rx["received"] == 2000 and rx["dropped_on_purpose"] == 80, rx
    assert rx["recovered"] >= 80, rx
    # r2 in between: its proxy in TRD2 re-emitted the session and took r3's NAKs (the link
    # to r3 joined the proxy's group and passed the NAKs to it)
    c = out["r2"]
    assert c["lbtrm_datagrams_emitted"] >= 2000 and c["lbtrm_datagrams_relayed"] >= 2000, c
    # counted in NAK packets: a receiver that finds two gaps at once NAKs both sqns in one
    # packet, so the 80 repairs above (the only way to them is through r2) may take fewer
    assert c["lbtrm_naks_from_receivers"] >= 1 and c["lbtrm_naks_to_source"] >= 1, c


def test_lbtrm_source_republished_as_lbtru_in_the_middle_goes_on_as_lbtru(netns_factory):
    ns = netns_factory()
    r = ns.run([sys.executable, "-c", SCRIPT, "lbt-ru"], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["transport"] == ["LBTRU", "127.0.3.1", None, None], out  # r3's proxy: an LBT-RU relay
    rx = out["rx"]
    assert rx["ok"] and rx["received"] == 2000 and rx["dropped_on_purpose"] == 80, rx
    assert rx["recovered"] >= 80 and rx["client_id"] is not None, rx
    c = out["r2"]
    # r2's LBT-RU proxy served its own upstream receiver (r3's stream) as its one client, and
    # re-emitted nothing by multicast; r3's proxy answered the receiver's NAKs from its window
    assert c["lbtru_clients_connected"] == 1 and c["lbtru_datagrams_sent"] + c["lbtru_retransmissions"] >= 2000, c
    assert c["lbtru_upstreams"] == 1, c
    c3 = out["r3"]
    assert c3["lbtru_proxy_streams_opened"] == 1 and c3["lbtru_clients_confirmed"] == 1, c3
    assert c3["lbtru_retransmissions"] >= 80 and c3.get("ru_streams_opened", 0) == 0, c3
    assert c.get("lbtrm_datagrams_emitted", 0) == 0, c
