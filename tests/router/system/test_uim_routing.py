"""Unicast immediate messages by domain across routers, on loopback: TRD1
(lbmrd on 127.0.1.1) and TRD2 (127.0.2.1) joined by routers A and B, each
endpoint with a request listener (``<request-tcp>``). An application in TRD1
sends UIMs addressed ``TCP:2:ip:port`` to its router's listener (the address
the domain route records name); they arrive whole, ``hops_taken`` counting
the routers, at the context in TRD2, whose reply by domain (to the sender's
orig domain, ip and port, through its own router's listener) comes back."""

from __future__ import annotations

import trio

from router.config.model import RequestListener
from tests.router.helpers import start_lbmrd, start_routers
from tests.router.system.uim_apps import UimInbox, hops_of, send_uims, uim, with_hops

PORT = 14611


async def routed(*routers, timeout: float = 10.0) -> None:
    """Until each router has a route to the other's domain."""
    with trio.fail_after(timeout):
        while not all(r.routing is not None and len(r.routing.map.routes()) >= 2 for r in routers):
            await trio.sleep(0.05)


async def pair(n):
    _, trd1 = await start_lbmrd(n, "127.0.1.1")
    _, trd2 = await start_lbmrd(n, "127.0.2.1")
    ra, rb = await start_routers(n, trd1, trd2, request_listener=RequestListener(port=PORT))
    await routed(ra, rb)
    return ra, rb


async def test_ten_uims_by_domain_arrive_whole_and_a_reply_by_domain_comes_back():
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
