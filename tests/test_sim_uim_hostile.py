"""The request port, the retaining source and the responding receiver of
lbmr-sim against hostile peers: bounded connections and queues, no answer
sent to a third party, a huge late join streamed, not built in memory."""

from __future__ import annotations

import trio

from lbmr_proto import lbmc
from lbmr_tools.sim.dataplane import RequestPort, UmTcpReceiver, UmTcpSource, message_payload

LO = "127.0.0.1"


def _control(*headers) -> bytes:
    return lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=headers))


async def test_the_request_port_bounds_connections_and_closes_idle_ones(autojump_clock):
    async with trio.open_nursery() as n:
        port = RequestPort(LO, max_connections=2, idle_timeout=5.0)
        await n.start(port.serve)
        a = await trio.open_tcp_stream(*port.address)
        b = await trio.open_tcp_stream(*port.address)
        await trio.sleep(0.1)
        c = await trio.open_tcp_stream(*port.address)  # the third: closed at once
        assert await c.receive_some(10) == b""
        await trio.sleep(6)  # a and b said nothing: closed
        assert await a.receive_some(10) == b"" and await b.receive_some(10) == b""
        n.cancel_scope.cancel()
    assert (port.stats.connections, port.stats.refused, port.stats.idle_closed) == (2, 1, 2)


async def test_a_source_answers_only_the_address_a_request_came_from():
    async with trio.open_nursery() as n:
        port = RequestPort(LO)
        await n.start(port.serve)
        src = UmTcpSource(LO, 0, seed=3, rate=1000, message_size=100, retention=1_000_000, tidx=7)
        ip, p = await n.start(src.serve)
        n.start_soon(src.take_requests, port.serve_source(1))
        s = await trio.open_tcp_stream(ip, p)
        await s.receive_some(1000)  # the stream runs
        # upstream on the data connection: not where UM sends requests (counted, ignored)
        await s.send_all(_control(lbmc.LateJoinRequestHeader(0, 1, 1, 7, LO, 14391)))
        u = await trio.open_tcp_stream(*port.address)  # UIMs to the source's request port
        # a late-join and an OTR request naming somebody else: refused, nothing sent there
        await u.send_all(_control(lbmc.LateJoinRequestHeader(0, 1, 1, 7, "10.1.2.3", 14391))
                         + _control(lbmc.UmeRxReqHeader(0, 2, 1, 7, 1, 14391, 0, "192.0.2.1")))
        # another transport index (no such source) and another topic index: counted, dropped
        await u.send_all(_control(lbmc.LateJoinRequestHeader(0, 1, 9, 7, LO, 14391))
                         + _control(lbmc.UmeRxReqHeader(0, 2, 1, 8, 1, 14391, 0, LO)))
        # one for message 0 (we have seen it: retained), naming our own address and a port where
        # nobody listens: tried, failed, counted
        await u.send_all(_control(lbmc.UmeRxReqHeader(0, 3, 1, 7, 0, 9, 0, "127.0.0.1")))
        with trio.move_on_after(10):
            while src.counters["answer_failures"] + src.counters["answers_refused"] < 3:
                await trio.sleep(0.01)
        await s.aclose()
        await u.aclose()
        n.cancel_scope.cancel()
    c = src.counters
    assert (c["lj_requests"], c["rx_requests"], c["answers_refused"], c["wrong_topic"]) == (1, 3, 2, 1)
    assert c["answer_failures"] == 1 and c["lj_answered"] == 0 and c["other_control"] == 1, sorted(c.items())
    assert (port.stats.recovery_requests, port.stats.unknown_transport) == (4, 1)


async def test_a_receiver_never_responds_to_a_third_party():
    async with trio.open_nursery() as n:
        src = UmTcpSource(LO, 0, seed=4, rate=2000, message_size=100, requests=5, request_interval=10,
                          request_port=("198.51.100.7", 14391))
        ip, p = await n.start(src.serve)
        r = await UmTcpReceiver(ip, p, 100 * 100, 4, timeout=10).run()
        n.cancel_scope.cancel()
    assert r.ok and r.requests_seen == 5 and (r.responses_sent, r.responses_refused) == (0, 5)


async def test_a_late_join_of_a_big_retention_is_streamed_in_pieces():
    async with trio.open_nursery() as n:
        port = RequestPort("127.0.0.2")
        await n.start(port.serve)
        src_port = RequestPort(LO)
        await n.start(src_port.serve)
        src = UmTcpSource(LO, 0, seed=5, rate=200_000, message_size=16, retention=30_000, max_burst=256)
        ip, p = await n.start(src.serve)
        n.start_soon(src.take_requests, src_port.serve_source(1))
        first = await trio.open_tcp_stream(ip, p)  # runs the clock past the retention
        while src.next_sqn < 40_000:
            await first.receive_some(1 << 16)
        late = UmTcpReceiver(ip, p, 16 * 100, 5, request_port=port, source_request=(*src_port.address, 1),
                             late_join=True, bind_ip="127.0.0.2",
                             timeout=30)
        async with trio.open_nursery() as m:
            async def drain():
                while await first.receive_some(1 << 16):
                    pass
            m.start_soon(drain)
            r = await late.run()
            m.cancel_scope.cancel()
        n.cancel_scope.cancel()
    assert r.ok, r
    assert r.lj_high - r.lj_low + 1 == 30_000 and r.first_sqn == r.lj_low >= 10_000
    assert r.messages == r.last_sqn - r.first_sqn + 1 and r.recovered == r.first_live_sqn - r.lj_low
    assert message_payload(5, r.first_sqn, 16)  # (the payloads were each checked on the way)


async def test_receiver_index_blocks_are_bounded_and_given_back():
    port = RequestPort(LO)
    firsts = []
    for _ in range(3):
        first, _recv = port.register(LO, 1)
        firsts.append(first)
    assert firsts == [1 << 31, (1 << 31) + (1 << 16), (1 << 31) + (2 << 16)]
    port.unregister(firsts[1])
    again, _ = port.register(LO, 1)
    assert again == firsts[1]  # reused: a churn of receivers never runs out of u32 indexes
    st = port.add_requests("t", 1, 10)
    assert st.first_qidx == 0  # sources' indexes are below the receivers'
    # an answer for an index nobody holds is counted, not delivered
    port.take(lbmc.Message(lbmc.CONTROL, headers=(lbmc.UmeLateJoinInfoHeader(0, 1, 2, (1 << 31) + (9 << 16)),)),
              LO)
    assert port.stats.unknown_qidx == 1
