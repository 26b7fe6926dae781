"""Unicast immediate messages by domain across routers, on loopback: TRD1
(lbmrd on 127.0.1.1) and TRD2 (127.0.2.1) joined by routers A and B, each
endpoint with a request listener (``<request-tcp>``). An application in TRD1
sends UIMs addressed ``TCP:2:ip:port`` to its router's listener (the address
the domain route records name); they arrive whole, ``hops_taken`` counting
the routers, at the context in TRD2, whose reply by domain (to the sender's
orig domain, ip and port, through its own router's listener) comes back."""

from __future__ import annotations

import trio

from router.config.model import RequestListener, lbmrd_endpoint, router_config
from router.shell.router import MultiRouter
from tests.router.helpers import (
    IPS,
    ROUTE_INFO,
    acceptor_link,
    converged,
    initiator_link,
    start_lbmrd,
)
from tests.router.system.uim_apps import (
    PORT,
    UimInbox,
    hops_of,
    pair,
    send_uims,
    tshark_agrees,
    uim,
    with_hops,
)


async def test_ten_uims_by_domain_arrive_whole_and_a_reply_by_domain_comes_back(tmp_path):
    async with trio.open_nursery() as n:
        ra, rb = await pair(n)
        app2 = UimInbox("127.0.2.9")
        app1 = UimInbox("127.0.1.9")
        await n.start(app2.serve)
        await n.start(app1.serve)
        sent = [uim(i, (2, *app2.address), (1, *app1.address), size=50 + i * 100) for i in range(10)]
        await send_uims(("127.0.1.1", PORT), sent, bind_ip="127.0.1.9")
        got = await app2.wait_for(10)
        assert len(got) == 10, (ra.status()["uim"], rb.status()["uim"])
        assert got == [with_hops(m, 2) for m in sent]  # whole, unchanged but hops_taken (A and B)
        assert app2.connections == 1  # one connection per target, reused
        assert ra.uim.counters["uim_forwarded"] == 10 and rb.uim.counters["uim_delivered"] == 10
        # the reply: to the sender's orig domain, ip and port, through B's own listener
        reply = uim(100, (1, *app1.address), (2, *app2.address))
        await send_uims(("127.0.2.1", PORT), [reply], bind_ip="127.0.2.9")
        back = await app1.wait_for(1)
        assert back == [with_hops(reply, 2)]
        assert hops_of(back[0]) == 2
        n.cancel_scope.cancel()
    tshark_agrees(tmp_path, got + back, app2.address)


async def test_a_chain_of_three_routers_delivers_and_replies(tmp_path):
    """r1 (TRD1) - r2 (TRD2) - r3 (TRD3): a UIM from TRD1 to domain 3 crosses two peer
    links (hops_taken 3: three routers), the reply comes back the same way."""
    async with trio.open_nursery() as n:
        trds = {d: (await start_lbmrd(n, IPS[d]))[1] for d in (1, 2, 3)}

        def router(name, d, peers):
            ep = lbmrd_endpoint(f"T{d}", d, [trds[d]], interface=IPS[d], fanout=False,
                                request_listener=RequestListener(port=PORT))
            return MultiRouter(router_config(name, [ep], peers, route_info=ROUTE_INFO))
        r2 = router("r2", 2, [acceptor_link("2-1"), acceptor_link("2-3")])
        p21, p23 = (lk["peer"] for lk in (await n.start(r2.run))["links"])
        r1 = router("r1", 1, [initiator_link("1-2", p21)])
        r3 = router("r3", 3, [initiator_link("3-2", p23)])
        await n.start(r1.run)
        await n.start(r3.run)
        await converged((r1, r2, r3), (1, 2, 3))
        app1, app3 = UimInbox("127.0.1.9"), UimInbox("127.0.3.9")
        await n.start(app1.serve)
        await n.start(app3.serve)
        sent = [uim(i, (3, *app3.address), (1, *app1.address)) for i in range(10)]
        await send_uims((IPS[1], PORT), sent, bind_ip="127.0.1.9")
        got = await app3.wait_for(10)
        assert got == [with_hops(m, 3) for m in sent]
        assert r2.uim.counters["uim_forwarded"] == 10
        reply = uim(100, (1, *app1.address), (3, *app3.address))
        await send_uims((IPS[3], PORT), [reply], bind_ip="127.0.3.9")
        assert await app1.wait_for(1) == [with_hops(reply, 3)]
        n.cancel_scope.cancel()
    tshark_agrees(tmp_path, got, app3.address)


async def test_one_router_joining_two_trds_directly_delivers_both_ways():
    """A router with an endpoint in each TRD (no peer link): it serves both domains, so it
    delivers at once (hops_taken 1: one router)."""
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        eps = [lbmrd_endpoint(f"TRD{d}", d, [trd], interface=IPS[d], fanout=False,
                              request_listener=RequestListener(port=PORT)) for d, trd in ((1, trd1), (2, trd2))]
        r = MultiRouter(router_config("direct", eps))
        await n.start(r.run)
        app1, app2 = UimInbox("127.0.1.9"), UimInbox("127.0.2.9")
        await n.start(app1.serve)
        await n.start(app2.serve)
        sent = [uim(i, (2, *app2.address), (1, *app1.address)) for i in range(10)]
        await send_uims((IPS[1], PORT), sent, bind_ip="127.0.1.9")
        assert await app2.wait_for(10) == [with_hops(m, 1) for m in sent]
        reply = uim(100, (1, *app1.address), (2, *app2.address))
        await send_uims((IPS[2], PORT), [reply], bind_ip="127.0.2.9")
        assert await app1.wait_for(1) == [with_hops(reply, 1)]
        assert r.uim.counters["uim_delivered"] == 11 and r.uim.counters["uim_streams_opened"] == 0
        assert r.status()["uim"]["listeners"] == {"TRD1": f"{IPS[1]}:{PORT}", "TRD2": f"{IPS[2]}:{PORT}"}
        assert 'lbmr_router_uim_total{what="uim_delivered"} 11' in r.prometheus_text()
        n.cancel_scope.cancel()
