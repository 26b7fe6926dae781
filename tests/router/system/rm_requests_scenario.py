"""Requests of an LBT-RM origin across a router pair, in one process: run by
tests/router/system/test_requests_lbtrm.py inside a network namespace whose
loopback does multicast (this host's does not). Prints one JSON object.

``pair`` (the argument): TRD1 and TRD2 (lbmrds on 127.0.1.1 and 127.0.2.1),
routers A and B joined through a counting forwarder
(tests.router.helpers.start_forwarded_pair); ``chain``: TRD1..3 and routers
r1 - r2 - r3 (tests.router.helpers.start_forwarded_chain), the receivers in
TRD3. A
UM-like LBT-RM source at 127.0.1.5 multicasting to 239.192.9.9:15009, whose
DATA carry one LBMC message each: ticks until a receiver in TRD2 hears the
session, then 20 requests naming the requester's request port (its
Requester), then ticks; the receiver joins the receivers' router's proxy group, answers
each request it gets with a responder connection to the address the request
names (tests.router.helpers.Responders), and the requester counts the
responses."""

from __future__ import annotations

import json
import socket
import sys

import trio

import lbmr_proto as L
from lbmr_proto import lbmc, lbmc_stream
from lbmr_proto import lbtrm as RM
from lbmr_runtime.netif import open_multicast_socket
from tests.router.helpers import (
    REQ_TIDX,
    REQ_TOPIC,
    Requester,
    Responders,
    resolve,
    start_forwarded_chain,
    start_forwarded_pair,
    udp,
)

GROUP, DPORT, SID = "239.192.9.9", 15009, 0x5151
SRC_IP = "127.0.1.5"


async def main(shape: str) -> dict:
    out: dict = {}
    with trio.fail_after(40):
        async with trio.open_nursery() as n:
            if shape == "chain":
                ra, middle, rb, _, _, trds, _ = await start_forwarded_chain(n)
                trd1, trd2, near = trds[1], trds[3], "127.0.3"
            else:
                ra, rb, _, trd1, trd2 = await start_forwarded_pair(n)
                middle, near = None, "127.0.2"
            req = Requester(count=20)
            await n.start(req.serve)
            raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            raw.bind((SRC_IP, 0))
            raw.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(SRC_IP))
            raw.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
            src = trio.socket.from_stdlib_socket(raw)
            sport = raw.getsockname()[1]
            tir = L.encode(L.Packet(0, 1, tirs=[L.TIR(REQ_TOPIC, L.LbtrmTransport(SRC_IP, GROUP, SID, DPORT, sport),
                                                      60, 3)]))
            heard = trio.Event()

            async def advertise():
                ctx = udp("127.0.1.6")
                while True:
                    await ctx.sendto(tir, trd1)
                    await trio.sleep(0.5)

            async def source():
                requests = req.messages()[1:]
                sqn = 0
                while True:
                    if heard.is_set() and requests:
                        msg = requests.pop(0)
                    else:
                        msg = lbmc.data_message(REQ_TIDX, sqn, b"tick")
                    await src.sendto(RM.encode_data(sport, SID, sqn, 0, msg, flags=RM.FLAG_UNICAST_NAKS),
                                     (GROUP, DPORT))
                    sqn += 1
                    await trio.sleep(0.01)

            n.start_soon(advertise)
            n.start_soon(source)
            proxy = (await resolve(udp(f"{near}.9"), trd2, topic=REQ_TOPIC, timeout=20)).transport
            out["proxy"] = [proxy.ip, proxy.mcast_group, proxy.dest_port]
            mc = trio.socket.from_stdlib_socket(open_multicast_socket(proxy.mcast_group, proxy.dest_port, 0,
                                                                      f"{near}.1", f"{near}.1", 1))
            got: list[bytes] = []
            while sum(m[1] == lbmc.RequestHeader.CODE for m in got) < 20:
                data, sender = await mc.recvfrom(65536)
                d = RM.decode(data)
                # as a UM receiver: its source's session only (in one namespace every router's
                # proxies share the default group range)
                if isinstance(d, RM.Data) and sender[0] == proxy.ip and d.header.session_id == proxy.session_id:
                    heard.set()
                    got += lbmc_stream.StreamFramer().feed(d.payload)
            rsp = Responders((proxy.ip, 0), bind_ip=f"{near}.30")
            await rsp.answer(got)
            while len(req.responses) < 20:
                await trio.sleep(0.02)
            await trio.sleep(0.2)  # nothing more comes
            out["requests"] = [[h.qidx, h.ipaddr, h.port] for h in rsp.requests]
            out["payloads_ok"] = rsp.payloads == [b"request %d: what is the price?" % q for q in range(100, 120)]
            out["request_port"] = req.request_port
            out["answers"] = sorted([q, p.hex()] for (q, p), k in req.answers().items() for _ in range(k))
            out["callers"] = [ip for ip, _ in req.callers]
            out["failed"] = rsp.failed
            keys = ("requests_rewritten", "request_listeners_opened", "response_streams_opened",
                    "responses_delivered", "requesters_recorded", "lbtrm_path_skipped")
            sa, sb = ra.portal_summary()[0]["counters"], rb.portal_summary()[0]["counters"]
            out["a"] = {k: sa.get(k, 0) for k in keys}
            out["b"] = {k: sb.get(k, 0) for k in keys}
            if middle is not None:
                sm = middle.portal_summary()[0]["counters"]
                out["middle"] = {k: sm.get(k, 0) for k in keys}
            n.cancel_scope.cancel()
    return out


if __name__ == "__main__":
    json.dump(trio.run(main, sys.argv[1]), sys.stdout)
