"""Routers with several portals, on loopback: one router joining two TRDs
directly (no peer link), and one router with two peer links (three routers,
three TRDs). TRDs are in-process lbmrds on 127.0.1.1, 127.0.2.1, 127.0.3.1."""

from __future__ import annotations

from functools import partial

import trio

import lbmr_proto as L
from router.config.model import (
    PortRange,
    acceptor_peer,
    initiator_peer,
    lbmrd_endpoint,
    router_config,
)
from router.shell.router import MultiRouter
from tests.router.helpers import (
    advertise_forever,
    ep,
    every_trd_gets_the_others,
    fetch_tcp,
    pattern,
    resolve,
    ru_through,
    start_lbmrd,
    tcp_source,
    udp,
)


async def start_direct(n):
    """Two in-process lbmrds (TRD1, TRD2) and a direct-link router between them."""
    _, trd1 = await start_lbmrd(n, "127.0.1.1")
    _, trd2 = await start_lbmrd(n, "127.0.2.1")
    r = MultiRouter(router_config("direct", [ep("TRD1", 1, trd1, "127.0.1.1"),
                                              ep("TRD2", 2, trd2, "127.0.2.1")]))
    await n.start(r.run)
    return r, trd1, trd2


async def test_direct_link_tcp_both_ways():
    """One router, endpoint portals in TRD1 and TRD2, no peer link: a receiver
    in each TRD resolves the other TRD's source through the router's relay
    address and gets its bytes exactly."""
    total = 8 << 20
    async with trio.open_nursery() as n:
        r, trd1, trd2 = await start_direct(n)
        s1 = await tcp_source(n, "127.0.1.5", total)
        s2 = await tcp_source(n, "127.0.2.5", total // 2)
        n.start_soon(advertise_forever, udp("127.0.1.5"), trd1, *s1, "t.one")
        n.start_soon(advertise_forever, udp("127.0.2.5"), trd2, *s2, "t.two")
        tir2 = await resolve(udp("127.0.2.9"), trd2, topic="t.one")
        tir1 = await resolve(udp("127.0.1.9"), trd1, topic="t.two")
        assert tir2.transport.ip == "127.0.2.1" and tir1.transport.ip == "127.0.1.1"
        assert any(isinstance(o, L.DomainIdOption) and o.domain_id == 1 for o in tir2.options)
        assert await fetch_tcp(tir2, total) == pattern(total)
        assert await fetch_tcp(tir1, total // 2) == pattern(total // 2)
        st = r.status()
        portals = {p["name"]: p for p in st["portals"]}
        assert portals["TRD1"]["proxies"] == 1 and portals["TRD2"]["proxies"] == 1
        assert "t.one" in portals["TRD2"]["local_interest"]
        assert all(lk["state"] == "CONNECTED" for p in st["portals"] for lk in p["links"])
        text = r.prometheus_text()
        assert 'lbmr_router_portal_proxies{portal="TRD1"} 1' in text
        assert 'lbmr_router_portal_total{portal="TRD2",what="tqrs_received"}' in text
        n.cancel_scope.cancel()


async def test_direct_link_drops_are_shown_per_portal():
    """TRD2's relay range has one port: the second topic from TRD1 finds no
    relay port; /status and /metrics count the drop for TRD2 only."""
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        probe = trio.socket.socket()
        await probe.bind(("127.0.2.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        e2 = lbmrd_endpoint("TRD2", 2, [trd2], interface="127.0.2.1", relay_ports=PortRange(port, port))
        r = MultiRouter(router_config("direct", [ep("TRD1", 1, trd1, "127.0.1.1"), e2]))
        await n.start(r.run)
        for topic in ("d.one", "d.two"):
            src = await tcp_source(n, "127.0.1.5", 10)
            n.start_soon(advertise_forever, udp("127.0.1.5"), trd1, *src, topic)
        tir = await resolve(udp("127.0.2.9"), trd2, topic="d.one")
        assert tir.transport.port == port
        rcv = udp("127.0.2.9")
        tqr = L.encode(L.Packet(0, 1, tqrs=[L.TQR("d.two")]))
        with trio.fail_after(10):
            while not r.status()["portals"][1]["drops"].get("relay_ports_exhausted"):
                await rcv.sendto(tqr, trd2)
                await trio.sleep(0.05)
        t1, t2 = r.status()["portals"]
        assert not t1["drops"] and t2["proxies"] == 1
        assert 'lbmr_router_portal_drops_total{portal="TRD2",kind="relay_ports_exhausted"}' in r.prometheus_text()
        n.cancel_scope.cancel()


async def test_direct_link_lbtru_both_ways():
    """LBT-RU through a direct-link router, each way: every datagram verified."""
    async with trio.open_nursery() as n:
        r, trd1, trd2 = await start_direct(n)
        await ru_through(n, "127.0.1.5", trd1, trd2, "127.0.2.9", "127.0.2.1", "ru.one")
        await ru_through(n, "127.0.2.5", trd2, trd1, "127.0.1.9", "127.0.1.1", "ru.two")
        n.cancel_scope.cancel()


async def test_second_endpoint_on_a_peer_link_relays_lbtru_both_ways():
    """Router 1 has endpoints in TRD1 and TRD2 and a peer link to router 3
    (TRD3): LBT-RU from TRD2 (the endpoint attached to the link, far side)
    reaches TRD3, and from TRD3 reaches TRD2 (its near side)."""
    async with trio.open_nursery() as n:
        trds = {d: (await start_lbmrd(n, f"127.0.{d}.1"))[1] for d in (1, 2, 3)}
        r3 = MultiRouter(router_config("r3", [ep("T3", 3, trds[3], "127.0.3.1")],
                                       [acceptor_peer("3-1", 0, interface="127.0.0.1")]))
        p31 = (await n.start(r3.run))["links"][0]["peer"]
        r1 = MultiRouter(router_config("r1", [ep("T1", 1, trds[1], "127.0.1.1"),
                                              ep("T2", 2, trds[2], "127.0.2.1")],
                                       [initiator_peer("1-3", p31[0], p31[1])]))
        await n.start(r1.run)
        await ru_through(n, "127.0.2.5", trds[2], trds[3], "127.0.3.9", "127.0.3.1", "ru.two")
        await ru_through(n, "127.0.3.5", trds[3], trds[2], "127.0.2.9", "127.0.2.1", "ru.three")
        n.cancel_scope.cancel()


async def test_second_link_to_the_same_router_is_refused():
    """Router 1 has two peer links that both reach router 2 (two of router 2's
    acceptor ports: the configuration cannot see it): the second handshake is
    refused, so TRD1 gets router 2's topic once, through one link."""
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        acc = partial(acceptor_peer, port=0, interface="127.0.0.1")
        r2 = MultiRouter(router_config("r2", [ep("T2", 2, trd2, "127.0.2.1")], [acc("a"), acc("b")]))
        pa, pb = (lk["peer"] for lk in (await n.start(r2.run))["links"])
        r1 = MultiRouter(router_config("r1", [ep("T1", 1, trd1, "127.0.1.1")], [
            initiator_peer("1-a", pa[0], pa[1], reconnect_interval_ms=200),
            initiator_peer("1-b", pb[0], pb[1], reconnect_interval_ms=200)]))
        await n.start(r1.run)
        src = await tcp_source(n, "127.0.2.5", 10)
        n.start_soon(advertise_forever, udp("127.0.2.5"), trd2, *src, "topic.2")
        await resolve(udp("127.0.1.9"), trd1, topic="topic.2")
        await trio.sleep(1.0)  # several reconnects of the refused link
        (p1,) = r1.status()["portals"]
        assert sorted(lk["state"] for lk in p1["links"]) == ["CONNECTED", "down"]
        assert p1["proxies"] == 1
        refused = p1["counters"].get("peer_refused_duplicate", 0) + \
            r2.status()["portals"][0]["counters"].get("peer_refused_duplicate", 0)
        assert refused >= 2
        n.cancel_scope.cancel()


async def test_three_routers_two_peer_links_each_topic_once_per_trd():
    """Three routers, three TRDs, each router with two peer links (a triangle:
    router 2 accepts both of its links, router 1 initiates both, router 3 one of
    each): every TRD's receiver gets the other two TRDs' sources, byte-exact, and
    each topic is advertised into each TRD exactly once (no router carries a
    proxy on: router 2's proxy of TRD1's source is never advertised into TRD3,
    which has router 1's own)."""
    ips = {1: "127.0.1.1", 2: "127.0.2.1", 3: "127.0.3.1"}
    acc = partial(acceptor_peer, port=0, interface="127.0.0.1")
    ini = partial(initiator_peer, reconnect_interval_ms=200)
    async with trio.open_nursery() as n:
        trds = {d: (await start_lbmrd(n, ip))[1] for d, ip in ips.items()}
        r2 = MultiRouter(router_config("r2", [ep("T2", 2, trds[2], ips[2])], [acc("2-1"), acc("2-3")]))
        rep2 = await n.start(r2.run)
        p21, p23 = (lk["peer"] for lk in rep2["links"])
        r3 = MultiRouter(router_config("r3", [ep("T3", 3, trds[3], ips[3])],
                                       [acc("3-1"), ini("3-2", address=p23[0], port=p23[1])]))
        p31 = (await n.start(r3.run))["links"][0]["peer"]
        r1 = MultiRouter(router_config("r1", [ep("T1", 1, trds[1], ips[1])],
                                       [ini("1-2", address=p21[0], port=p21[1]),
                                        ini("1-3", address=p31[0], port=p31[1])]))
        await n.start(r1.run)
        await every_trd_gets_the_others(n, ips, trds)
        for r in (r1, r2, r3):
            (portal,) = r.status()["portals"]
            assert [lk["state"] for lk in portal["links"]] == ["CONNECTED", "CONNECTED"]
            assert portal["proxies"] == 2 and portal["adverts"] == 2
        n.cancel_scope.cancel()


async def test_direct_link_three_trds_each_topic_once_per_trd():
    """One router with endpoint portals in three TRDs (every pair joined):
    each TRD's receiver gets the other two TRDs' sources byte-exact, each
    advertised once per TRD (a proxy the router advertised into TRD2 is never
    carried on to TRD3, which gets the source from TRD1 directly)."""
    ips = {1: "127.0.1.1", 2: "127.0.2.1", 3: "127.0.3.1"}
    async with trio.open_nursery() as n:
        trds = {d: (await start_lbmrd(n, ip))[1] for d, ip in ips.items()}
        r = MultiRouter(router_config("mesh", [ep(f"T{d}", d, trds[d], ip) for d, ip in ips.items()]))
        rep = await n.start(r.run)
        assert len(rep["links"]) == 6  # 3 pairs, one portal link on each side
        await every_trd_gets_the_others(n, ips, trds)
        for portal in r.status()["portals"]:
            assert portal["proxies"] == 2 and portal["adverts"] == 2 and len(portal["links"]) == 2
        n.cancel_scope.cancel()


async def test_two_endpoints_and_a_peer_three_trds_each_topic_once_per_trd():
    """Router 1 joins TRD1 and TRD2 directly and both to router 3 (TRD3) over
    one peer link: every TRD's receiver gets the other two TRDs' sources,
    byte-exact, each advertised once per TRD."""
    ips = {1: "127.0.1.1", 2: "127.0.2.1", 3: "127.0.3.1"}
    async with trio.open_nursery() as n:
        trds = {d: (await start_lbmrd(n, ip))[1] for d, ip in ips.items()}
        r3 = MultiRouter(router_config("r3", [ep("T3", 3, trds[3], ips[3])],
                                       [acceptor_peer("3-1", 0, interface="127.0.0.1")]))
        p31 = (await n.start(r3.run))["links"][0]["peer"]
        r1 = MultiRouter(router_config("r1", [ep("T1", 1, trds[1], ips[1]), ep("T2", 2, trds[2], ips[2])],
                                       [initiator_peer("1-3", p31[0], p31[1])]))
        await n.start(r1.run)
        await every_trd_gets_the_others(n, ips, trds)
        t1, t2 = r1.status()["portals"]
        assert [lk["name"] for lk in t1["links"]] == ["1-3", "T1<->T2"]
        assert all(lk["state"] == "CONNECTED" for p in (t1, t2) for lk in p["links"])
        assert t1["proxies"] == t2["proxies"] == 2
        (t3,) = r3.status()["portals"]
        assert t3["proxies"] == 2 and t3["adverts"] == 1  # TRD3's source, advertised once to router 1
        n.cancel_scope.cancel()
