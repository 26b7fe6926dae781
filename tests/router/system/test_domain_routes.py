"""Domain routes end to end on loopback: TRD1 (lbmrd on 127.0.1.1) and TRD2
(lbmrd on 127.0.2.1) joined by two routers, each endpoint with a request
listener (``<request-tcp>``). A UM-like context in each TRD hears, through its
lbmrd, the remote domain route records (LBMR extended type 0x06) of its router:
the other TRD's domain id through the router's request listener, again within the DRO's
``<domain-route>`` max-interval, and at once in answer to a TR request."""

from __future__ import annotations

import math

import trio

import lbmr_proto as L
from lbmr_proto.constants import TRREQ_GATEWAY_META, PacketType
from router.config.model import RequestListener
from tests.router.helpers import start_lbmrd, start_routers, udp

REQUEST_PORT = 14599
MAX_INTERVAL = 1.0  # the DRO's default <domain-route max-interval>
SLACK = 0.5  # seconds of scheduling delay tolerated on a loaded host


async def hear_routes(sock, daemon, until: float) -> list[tuple[float, L.RemoteDomainRoute]]:
    """A UM context in the TRD of ``daemon``: keeps itself known to its lbmrd and
    collects the route records it hears until trio's clock reaches ``until``."""
    heard = []
    keepalive = L.Packet(PacketType.NORMAL, 1, options=[L.SourceIdOption(0x8000, b"UMCTX001")]).encode()
    next_ka = -math.inf
    with trio.move_on_at(until):
        while True:
            if trio.current_time() >= next_ka:
                await sock.sendto(keepalive, daemon)
                next_ka = trio.current_time() + 0.3
            with trio.move_on_after(0.1):
                data, _ = await sock.recvfrom(65535)
                try:
                    pkt = L.decode(data)
                except L.LBMRDecodeError:
                    continue
                if pkt.type == PacketType.EXT and isinstance(pkt.ext, L.RemoteDomainRoute):
                    heard.append((trio.current_time(), pkt.ext))
    return heard


def check_heard(heard, domain: int, ip: str, start: float) -> None:
    """``domain`` heard through ``ip``:REQUEST_PORT soon after ``start``, then again
    within max-interval every time."""
    times = [t for t, r in heard if domain in r.domains and (r.ip, r.port) == (ip, REQUEST_PORT)]
    assert times, heard
    assert times[0] - start < 5.0
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert len(gaps) >= 3 and max(gaps) <= MAX_INTERVAL + SLACK, gaps
    assert all(r.domains == [domain] for _, r in heard)  # never its own domain, nothing else


async def test_each_trd_hears_the_other_domain_through_its_routers_request_listener():
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        ctx1, ctx2 = udp("127.0.1.9"), udp("127.0.2.9")
        start = trio.current_time()
        ra, rb = await start_routers(n, trd1, trd2, request_listener=RequestListener(port=REQUEST_PORT))
        until = start + 6.0
        heard: dict[int, list] = {}

        async def listen(k, sock, trd):
            heard[k] = await hear_routes(sock, trd, until)

        async with trio.open_nursery() as ln:
            ln.start_soon(listen, 1, ctx1, trd1)
            ln.start_soon(listen, 2, ctx2, trd2)
        check_heard(heard[1], 2, "127.0.1.1", start)  # router A's listener, in TRD1
        check_heard(heard[2], 1, "127.0.2.1", start)
        # a TR request asking for them is answered at once (not a max-interval later)
        ask = L.Packet(PacketType.EXT, 1, ext=L.TopicResRequest(TRREQ_GATEWAY_META),
                       options=[L.SourceIdOption(0x8000, b"UMCTX001")]).encode()
        last = heard[1][-1][0]
        await trio.sleep_until(last + 0.3)  # the next periodic record is 0.7 s away
        await ctx1.sendto(ask, trd1)
        asked = trio.current_time()
        answer = await hear_routes(ctx1, trd1, asked + 0.4)
        assert answer and answer[0][1].domains == [2], answer
        st = ra.status()["portal"]["stats"]
        assert st["domain_routes"] == 1 and st["route_requests_answered"] >= 1, st
        n.cancel_scope.cancel()
