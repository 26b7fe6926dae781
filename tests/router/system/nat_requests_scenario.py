"""One site of tests/router/system/test_requests_nat.py, run inside that site's
network namespace; the sites' TRDs use the same private addresses (TRD_NET on
the loopback of each). Prints one JSON object.

``origin`` PEER_HOST (site A, TRD1): an lbmrd at TRD_IP, router A (the peer
link's initiator, to PEER_HOST:PEER_PORT: site B's public address, reached
through the NAT) and a UM-like requester at REQUESTER_IP advertised for
REQ_TOPIC (tests.router.helpers.Requester: 20 requests naming its request
port), until the 20 responses came.

``receivers`` (site B, TRD2): an lbmrd at TRD_IP, router B (the acceptor, on
PEER_HOST:PEER_PORT) and a receiver of REQ_TOPIC that answers each request
(tests.router.helpers.Responders, from RESPONDER_IP), until it answered the
20 requests.

Either side, its work done, takes its report, prints a line "done", waits (at
most 60 s) for its standard input to close (the test looks at the link
meanwhile, still up), then prints the report and ends."""

from __future__ import annotations

import json
import os
import sys

import trio

from router.config.model import acceptor_peer, initiator_peer, lbmrd_endpoint
from router.shell.single import Router
from tests.router.helpers import REQ_TOPIC, Responders, resolve, start_lbmrd, start_requester, udp

TRD_NET = "10.1.0.0/24"  # both sites
TRD_IP = "10.1.0.1"  # lbmrd and router, both sites
REQUESTER_IP = "10.1.0.5"  # site A
RESPONDER_IP = "10.1.0.30"  # site B
PEER_PORT = 26300
LIMIT = 25.0  # seconds, for either side's work
KEYS = ("requests_rewritten", "request_listeners_opened", "response_streams_opened", "responses_delivered",
        "requesters_recorded", "responses_refused_unseen", "responses_refused_address",
        "responses_requester_gone", "requests_unmapped_no_address", "requests_unmapped_peer")


def counters(router: Router) -> dict:
    return {k: router.counters.get(k, 0) for k in KEYS}


async def done() -> None:
    """Say so, and wait for the test to close our standard input."""
    print("done", flush=True)
    with trio.fail_after(60):
        stdin = trio.lowlevel.FdStream(os.dup(0))
        while await stdin.receive_some(4096):
            pass


async def origin(peer_host: str) -> dict:
    async with trio.open_nursery() as n:
        with trio.fail_after(LIMIT):
            _, trd1 = await start_lbmrd(n, TRD_IP)
            ra = Router("routerA", lbmrd_endpoint("A-TRD1", 1, [trd1], interface=TRD_IP),
                        initiator_peer("A-to-B", peer_host, PEER_PORT, reconnect_interval_ms=300))
            await n.start(ra.run)
            req, _ = await start_requester(n, trd1, ip=REQUESTER_IP, count=20)
            while len(req.responses) < 20:
                await trio.sleep(0.02)
            await trio.sleep(0.3)  # nothing more comes
        out = {"request_port": req.request_port, "callers": [ip for ip, _ in req.callers],
               "answers": sorted([q, p.hex()] for (q, p), k in req.answers().items() for _ in range(k)),
               "connections": req.connections, "peer": ra.status()["peer"]["state"], "a": counters(ra)}
        await done()
        n.cancel_scope.cancel()
    return out


async def receivers(peer_host: str) -> dict:
    async with trio.open_nursery() as n:
        with trio.fail_after(LIMIT):
            _, trd2 = await start_lbmrd(n, TRD_IP)
            rb = Router("routerB", lbmrd_endpoint("B-TRD2", 2, [trd2], interface=TRD_IP),
                        acceptor_peer("B-to-A", PEER_PORT, interface=peer_host))
            await n.start(rb.run)
            tir = await resolve(udp("10.1.0.9"), trd2, topic=REQ_TOPIC, timeout=LIMIT)
            rsp = Responders((tir.transport.ip, tir.transport.port), bind_ip=RESPONDER_IP)
            await rsp.run(until=20, timeout=LIMIT)
        out = {"proxy": [tir.transport.ip, tir.transport.port],
               "requests": [[h.qidx, h.ipaddr, h.port] for h in rsp.requests],
               "payloads": [p.hex() for p in rsp.payloads], "failed": rsp.failed, "answered": rsp.answered,
               "listeners": [list(s.listener) for s in rb.relay.requests.map.slots()],
               "peer": rb.status()["peer"]["state"], "b": counters(rb)}
        await done()
        n.cancel_scope.cancel()
    return out


if __name__ == "__main__":
    role, host = sys.argv[1:3]
    print(json.dumps(trio.run({"origin": origin, "receivers": receivers}[role], host)), flush=True)
