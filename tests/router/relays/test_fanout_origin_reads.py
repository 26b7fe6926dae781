"""Router A's reads of an origin TCP session (router.relays.tcp_fanout_origin):
while every stream of the session still holds bytes its link writer has not
taken, the origin's socket wakes the reader only at UPSTREAM_LOWAT bytes
(SO_RCVLOWAT), and the wait ends as soon as a stream has nothing ahead, so a
burst's last small message is never held back."""

from __future__ import annotations

import trio

from lbmr_proto import lbmc, lbmc_stream
from router.relays import tcp_fanout_origin
from tests.router.helpers import (
    ROUTED_TOPIC,
    SRC_IP,
    advertise_forever,
    resolve,
    start_forwarded_pair,
    udp,
)

TIDX = 7
BURST = 3_000_000  # bytes of 8 KB messages: more than one frame while the peer window is small
TAIL = b"tail"


async def bursty_source(n, trd1, bursts: int, go: trio.MemoryReceiveChannel):
    """A TCP source at SRC_IP advertising ROUTED_TOPIC in ``trd1``: to its one
    connection, per burst (each started by a value on ``go``): BURST bytes of
    data messages at once, a pause, then one small message (sequence numbers
    consecutive from 0)."""
    body = bytes(8000)

    async def handler(stream):
        sqn = 0
        async with stream:
            for _ in range(bursts):
                await go.receive()
                run = []
                for _ in range(BURST // 8000):
                    run.append(lbmc.data_message(TIDX, sqn, body))
                    sqn += 1
                await stream.send_all(b"".join(run))
                await trio.sleep(0.05)  # (router A has read the burst and waits for more)
                await stream.send_all(lbmc.data_message(TIDX, sqn, TAIL))
                sqn += 1
            await trio.sleep_forever()

    listeners = await trio.open_tcp_listeners(0, host=SRC_IP)
    n.start_soon(trio.serve_listeners, handler, listeners)
    ip, port = listeners[0].socket.getsockname()[:2]
    n.start_soon(advertise_forever, udp(SRC_IP), trd1, ip, port, ROUTED_TOPIC)


async def test_a_bursts_last_message_is_read_as_soon_as_the_link_has_taken_the_rest(monkeypatch):
    """The link is paced (10 MB/s), so router A's streams hold each 3 MB burst
    (more than one frame) for a while after it was read: the reader waits for
    the low-water mark (counted) when the small last message comes, 50 ms
    later. The linger after which every wait ends is made a minute: the last
    message of each of 3 bursts still arrives within seconds, once the link's
    writer has taken the burst's frames, and every message is whole and
    consecutive. (Without the end of the wait, it fails.)"""
    monkeypatch.setattr(tcp_fanout_origin, "UPSTREAM_LINGER", 60.0)
    lowats = []

    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n, pace=10e6)
        go_send, go = trio.open_memory_channel(3)
        await bursty_source(n, trd1, 3, go)
        tir = await resolve(udp("127.0.2.9"), trd2)
        rx = trio.socket.socket()
        await rx.bind(("127.0.2.21", 0))
        await rx.connect((tir.transport.ip, tir.transport.port))
        framer = lbmc_stream.StreamFramer()
        expect = 0
        for burst in range(3):
            await go_send.send(burst)
            with trio.fail_after(20):
                while True:
                    data = await rx.recv(1 << 20)
                    assert data, "router B closed the receiver's connection"
                    done = False
                    for m in framer.feed(data):
                        msg = lbmc.decode(m)
                        if msg.tidx != TIDX:
                            continue  # (the router's own control messages)
                        assert msg.sqn == expect, (msg.sqn, expect)
                        expect += 1
                        done = msg.payload == TAIL
                    if done:
                        break
            lowats.append(ra.counters["fanout_upstream_coalesced"])
        assert expect == 3 * (BURST // 8000 + 1)
        assert lowats[-1] > 0, lowats  # the reader did wait for the low-water mark
        assert ra.counters["fanout_link_dropped_messages"] == 0
        rx.close()
        n.cancel_scope.cancel()
