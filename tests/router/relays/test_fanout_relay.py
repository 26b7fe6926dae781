"""TCP fan-out through a router pair (router.relays.tcp_fanout): lbmr-sim's live TCP
source in TRD1, its receivers in TRD2, routers A (TRD1) and B (TRD2) joined
through a counting TCP forwarder, all on 127.0.0.1. One connection to the
source per session, one copy on the link, every receiver whole and
consecutive messages from its join point, a receiver that never reads
isolated by its queue."""

from __future__ import annotations

import socket

import pytest
import trio

from lbmr_proto import lbmc, lbmc_stream
from lbmr_tools.sim.dataplane import TcpDataReceiver
from router.config.model import acceptor_peer, initiator_peer, lbmrd_endpoint
from router.peerlink.wire import LARGE_PAYLOAD, MAX_PAYLOAD, STREAM_DATA_OVERHEAD
from router.relays.tcp_fanout import RECEIVER_UPSTREAM_BURST, RECEIVER_UPSTREAM_RATE, FanoutRelay
from router.relays.tcp_fanout_origin import link_backlog
from router.shell.single import Router
from tests.router.helpers import (
    SRC_IP,
    TCP_SEED,
    TCP_SID,
    TCP_TIDX,
    Forwarder,
    advertise_forever,
    resolve,
    start_forwarded_chain,
    start_forwarded_pair,
    start_lbmrd,
    tcp_live_source,
    tcp_receiver,
    udp,
)
from tests.tshark_judge import compare_lbmc, run_tshark_lbmc, segments, write_lbttcp_pcap


async def deaf_receiver(tir):
    """A connection to the proxy of ``tir`` that never reads (a 4 KiB receive buffer)."""
    deaf = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    deaf.bind(("127.0.2.40", 0))
    deaf.setblocking(False)
    deaf = trio.socket.from_stdlib_socket(deaf)
    await deaf.connect((tir.transport.ip, tir.transport.port))
    return deaf


@pytest.mark.parametrize("receivers", [1, 10])
async def test_one_copy_on_the_link_and_one_source_connection_for_any_number_of_receivers(receivers):
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        src, src_scope = await tcp_live_source(n, trd1, rate=2000, message_size=1000)
        tir = await resolve(udp("127.0.2.9"), trd2)
        link0 = fwd.a_to_b
        rxs = [tcp_receiver(tir, k) for k in range(receivers)]
        results = []

        async def run(rx, task_status):
            results.append(await rx.run(task_status=task_status))

        async with trio.open_nursery() as rn:
            for rx in rxs:
                await rn.start(run, rx)
            await trio.sleep(1.5)  # 3,000 messages of the live session
            src_scope.cancel()  # the origin ends the session: every receiver gets EOF
        link = fwd.a_to_b - link0
        for r in results:
            assert r.error is None and r.eof and r.messages > 1000, r
            assert r.session_id == TCP_SID  # the session's TCP_SID came first
        one = max(r.stream_bytes for r in results)
        print(f"{receivers} receivers: link {link} bytes, one receiver {one} bytes, "
              f"ratio {link / one:.3f}")
        assert 0.9 * one <= link <= 1.1 * one
        assert len(src.connections) == 1  # one connection to the origin for the router's session
        assert ra.counters["fanout_upstreams"] == 1 and rb.counters["fanout_streams_opened"] == 1
        n.cancel_scope.cancel()


async def test_a_receiver_that_never_reads_slows_nobody_and_its_drops_are_counted():
    """Three receivers read, one connects and never reads (a 4 KiB receive
    buffer): over a 2.5 s window the readers and the source keep the source's
    rate (within 10 %), the queue of the one that never reads drops whole
    messages (counted), and it is disconnected after the stall timeout."""
    rate, size = 2000, 1000
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n, fanout_max_queue=100_000, fanout_stall_timeout_ms=4000)
        src, _ = await tcp_live_source(n, trd1, rate=rate, message_size=size)
        tir = await resolve(udp("127.0.2.9"), trd2)
        rxs = [tcp_receiver(tir, k) for k in range(3)]
        for rx in rxs:
            n.start_soon(rx.run)
        deaf = await deaf_receiver(tir)
        await trio.sleep(1.0)  # every queue and socket buffer of the deaf receiver fills
        before = [rx.result.messages for rx in rxs], src.connections[0].messages_sent
        t0 = trio.current_time()
        await trio.sleep(2.5)
        elapsed = trio.current_time() - t0
        after = [rx.result.messages for rx in rxs], src.connections[0].messages_sent
        want = rate * elapsed
        for b, a in zip(before[0], after[0], strict=True):
            assert a - b >= 0.9 * want, (a - b, want)
        assert after[1] - before[1] >= 0.9 * want  # the origin was not paced by the deaf receiver
        assert all(rx.result.error is None for rx in rxs), [rx.result for rx in rxs]
        dropped = rb.counters["fanout_dropped_messages"]
        assert dropped > 0 and rb.counters["fanout_dropped_bytes"] == dropped * (size + 12)
        assert ra.counters["fanout_link_dropped_messages"] == 0
        with trio.fail_after(5):  # took nothing for 4 s: disconnected
            while rb.counters["fanout_receivers_stalled"] != 1:
                await trio.sleep(0.1)
        assert all(rx.result.error is None for rx in rxs) and len(src.connections) == 1
        deaf.close()
        n.cancel_scope.cancel()


async def test_five_readers_keep_their_rate_and_every_message_beside_500_that_never_read():
    """Five receivers read, 500 connect and never read: once the 500 have held
    the session back for the lag timeout, the source keeps its rate and the
    five keep it (at least 90 % of the messages it sent in the same window)
    and lose no message (each verifies consecutive sequence numbers); only the
    500 drop (their own messages, counted at router B); router A drops
    nothing; router B's queues hold at most its budget."""
    rate, size = 2000, 1000
    async with trio.open_nursery() as n:
        # queues of the default 1,000,000 bytes: 500 of them are twice the budget
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n, fanout_stall_timeout_ms=120_000)
        src, _ = await tcp_live_source(n, trd1, rate=rate, message_size=size)
        tir = await resolve(udp("127.0.2.9"), trd2)
        rxs = [tcp_receiver(tir, k) for k in range(5)]
        for rx in rxs:
            n.start_soon(rx.run)
        deaf = [await deaf_receiver(tir) for _ in range(500)]
        with trio.fail_after(20):
            while rb.counters["fanout_receivers"] < 505:
                await trio.sleep(0.1)
        await trio.sleep(2.0)  # the deaf receivers fill their buffers; the session stops waiting for them
        before = [rx.result.messages for rx in rxs], src.connections[0].messages_sent
        t0 = trio.current_time()
        await trio.sleep(3.0)
        elapsed = trio.current_time() - t0
        after = [rx.result.messages for rx in rxs], src.connections[0].messages_sent
        sent = after[1] - before[1]
        # the source was not paced by the deaf receivers (the five getting what it sent, below,
        # is the proof: paced by the 500, nobody would get anything); it shares this process with
        # the routers and readers, so its own pace follows the host's load: 70 % of its rate
        assert sent >= 0.7 * rate * elapsed, (sent, rate * elapsed)
        for b, a in zip(before[0], after[0], strict=True):
            assert a - b >= 0.9 * sent, (a - b, sent)
        assert all(rx.result.error is None for rx in rxs), [rx.result for rx in rxs]
        assert rb.counters["fanout_dropped_messages"] > 0  # the deaf ones' own
        assert rb.counters["fanout_receivers_behind"] == 500
        assert ra.counters["fanout_link_dropped_messages"] == 0
        relay = next(r for r in rb.relay.relays.values() if isinstance(r, FanoutRelay))
        assert relay.budget.held <= relay.budget.limit and relay.budget.sinks == 505
        assert rb.counters["fanout_receivers_stalled"] == 0
        for d in deaf:
            d.close()
        n.cancel_scope.cancel()


async def test_one_source_and_one_receiver_at_full_rate_drop_nothing():
    """A source far faster than the routers and one receiver that reads as
    fast as it can: the origin is paced by the path (router A reads it only
    as far as the link takes it, router B the link only as far as the
    receiver takes it); no message is dropped anywhere, the receiver gets
    every one, consecutive and whole."""
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n, fanout_max_queue=200_000)
        src, _ = await tcp_live_source(n, trd1, rate=1e6, message_size=4000, max_burst=256)
        tir = await resolve(udp("127.0.2.9"), trd2)
        result = await tcp_receiver(tir, 0, max_bytes=40_000_000).run()
        assert result.error is None and result.messages > 9000, result
        assert ra.counters["fanout_link_dropped_messages"] == 0
        assert rb.counters["fanout_dropped_messages"] == 0
        assert len(src.connections) == 1
        n.cancel_scope.cancel()


async def test_a_receiver_that_floods_control_messages_is_read_at_a_bounded_rate():
    """A receiver that sends 4-byte LBMC control messages as fast as it can:
    router B reads it at most RECEIVER_UPSTREAM_RATE bytes a second (with a
    burst), so it costs CPU in proportion to those bytes; the others are
    served meanwhile."""
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        await tcp_live_source(n, trd1, rate=2000, message_size=500)
        tir = await resolve(udp("127.0.2.9"), trd2)
        good = tcp_receiver(tir, 0, max_bytes=2_000_000)
        n.start_soon(good.run)
        flood = await trio.open_tcp_stream(tir.transport.ip, tir.transport.port)
        tiny = lbmc.encode(lbmc.Message(lbmc.CONTROL))
        assert len(tiny) == 4
        chunk = tiny * (1 << 14)
        t0 = trio.current_time()
        with trio.move_on_after(2.0):
            while True:
                await flood.send_all(chunk)
        elapsed = trio.current_time() - t0
        read = rb.counters["fanout_receiver_bytes"]
        assert rb.counters["fanout_receiver_paced"] > 0
        assert read <= RECEIVER_UPSTREAM_BURST + RECEIVER_UPSTREAM_RATE * (elapsed + 0.5) + (64 << 10)
        assert rb.counters["fanout_receiver_messages"] * 4 <= read
        with trio.fail_after(20):
            while not good.result.done:
                await trio.sleep(0.1)
        assert good.result.error is None and good.result.messages > 100
        await flood.aclose()
        n.cancel_scope.cancel()


async def test_an_idle_upstream_session_holds_no_receive_buffer():
    """A session whose origin sends nothing: router A's proxy receiver waits
    for the origin's socket to be readable before it takes a buffer to read
    into, so an idle session holds none (and nothing of it is in the budget)."""
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        src, _ = await tcp_live_source(n, trd1, rate=0.01, message_size=500)  # one message a 100 s
        tir = await resolve(udp("127.0.2.9"), trd2)
        conn = await trio.open_tcp_stream(tir.transport.ip, tir.transport.port)
        with trio.fail_after(5):
            while not ra.counters["fanout_upstreams"]:
                await trio.sleep(0.05)
        await trio.sleep(0.5)
        relay = next(r for r in ra.relay.relays.values() if isinstance(r, FanoutRelay))
        (up,) = relay.upstreams.values()
        assert up.core.framer.reserved == 0 and up.core.framer.buffered == 0
        assert relay.budget.held <= 64  # (at most the session's TCP_SID message, queued for the link)
        await conn.aclose()
        n.cancel_scope.cancel()


async def test_a_late_joiner_starts_at_a_message_boundary_after_the_session_id():
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        src, _ = await tcp_live_source(n, trd1, rate=3000, message_size=3001)
        tir = await resolve(udp("127.0.2.9"), trd2)
        first, late = tcp_receiver(tir, 0, max_bytes=30_000_000), tcp_receiver(tir, 1, max_bytes=3_000_000)
        n.start_soon(first.run)
        await trio.sleep(1.0)
        r2 = await late.run()
        assert r2.error is None and r2.messages > 100, r2
        assert r2.session_id == TCP_SID and r2.control_messages == 1  # TCP_SID first, once
        with trio.fail_after(20):
            while not first.result.done:
                await trio.sleep(0.1)
        r1 = first.result
        assert r1.error is None and r1.first_sqn < r2.first_sqn <= r1.last_sqn, (r1, r2)
        assert len(src.connections) == 1
        n.cancel_scope.cancel()


async def test_the_origin_ends_the_session_and_the_proxy_is_withdrawn_in_the_deletion_delay():
    """The source ends: every receiver gets EOF after whole messages, and the
    proxy is withdrawn within source-deletion-delay (1 s) plus a margin; one
    receiver leaving earlier did not end the session for the others."""
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        src, src_scope = await tcp_live_source(n, trd1, rate=2000, message_size=500)
        tir = await resolve(udp("127.0.2.9"), trd2)
        rxs = [tcp_receiver(tir, k) for k in range(3)]
        for rx in rxs:
            await n.start(rx.run)
        leaver = tcp_receiver(tir, 5, max_bytes=100_000)
        assert (await leaver.run()).error is None  # leaves after 100 kB
        await trio.sleep(0.5)
        assert all(not rx.result.done for rx in rxs)  # the session goes on for the others
        src_scope.cancel()
        ended = trio.current_time()
        with trio.fail_after(2.5):
            while rb.status()["proxies"]:
                await trio.sleep(0.05)
        print(f"withdrawn {trio.current_time() - ended:.2f} s after the origin ended")
        with trio.fail_after(5):
            while not all(rx.result.done for rx in rxs):
                await trio.sleep(0.05)
        for rx in rxs:
            assert rx.result.eof and rx.result.error is None and rx.result.messages > 100, rx.result
        assert len(src.connections) == 1 and ra.counters["sources_ended"] == 1
        n.cancel_scope.cancel()


async def test_tshark_decodes_a_capture_of_the_proxys_stream_with_no_expert(tmp_path):
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        await tcp_live_source(n, trd1, rate=3000, message_size=700)
        tir = await resolve(udp("127.0.2.9"), trd2)
        stream = await trio.open_tcp_stream(tir.transport.ip, tir.transport.port)
        framer = lbmc_stream.StreamFramer()
        msgs: list[bytes] = []
        async with stream:
            with trio.fail_after(10):
                while len(msgs) < 60:
                    msgs += framer.feed(await stream.receive_some(65536))
        n.cancel_scope.cancel()
    msgs = msgs[:60]
    pcap = tmp_path / "proxy.pcap"
    write_lbttcp_pcap(pcap, [(True, s) for s in segments(msgs)], source=(tir.transport.ip, tir.transport.port))
    frames = run_tshark_lbmc(pcap, port=tir.transport.port)
    layers = [layer for f in frames for layer in f.lbmc]
    assert len(layers) == 60 and not any(f.flagged for f in frames)
    assert [compare_lbmc(layer, lbmc.decode(m)) for layer, m in zip(layers, msgs, strict=True)] == [[]] * 60
    assert lbmc.decode(msgs[0]).header(lbmc.TcpSidHeader).session_id == TCP_SID


async def test_receiver_control_is_counted_at_the_proxy_and_bad_bytes_close_only_that_receiver():
    """What receivers send (TCP_SID, SSF_INIT) is framed and counted by the
    proxy, not passed to the origin; a receiver that sends bytes that are not
    LBMC is disconnected, the others go on."""
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        src, _ = await tcp_live_source(n, trd1, rate=2000, message_size=500)
        tir = await resolve(udp("127.0.2.9"), trd2)
        good = tcp_receiver(tir, 0, max_bytes=3_000_000)
        n.start_soon(good.run)
        talker = await trio.open_tcp_stream(tir.transport.ip, tir.transport.port)
        ctl = lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(lbmc.TcpSidHeader(0, 7),)))
        ssf = lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(lbmc.SsfInitHeader(0, 0, TCP_TIDX, 1, 14391),)))
        await talker.send_all(ctl + ssf)
        bad = await trio.open_tcp_stream(tir.transport.ip, tir.transport.port)
        await bad.send_all(b"\xff" * 16)
        with trio.fail_after(5):
            while await bad.receive_some(65536):
                pass  # closed by the proxy
        with trio.fail_after(5):
            while rb.counters["fanout_receiver_messages"] < 2:
                await trio.sleep(0.05)
        assert rb.counters["fanout_receiver_malformed"] == 1
        assert await talker.receive_some(65536)  # still served
        with trio.fail_after(20):
            while not good.result.done:
                await trio.sleep(0.1)
        assert good.result.error is None and good.result.messages > 100
        assert src.connections[0].control_received == 0 and len(src.connections) == 1
        await talker.aclose()
        n.cancel_scope.cancel()


async def test_fanout_off_relays_each_receiver_connection_on_its_own():
    """<relay fanout="off">: one stream and one source connection per receiver."""
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n, fanout=False)
        src, _ = await tcp_live_source(n, trd1, rate=2000, message_size=500)
        tir = await resolve(udp("127.0.2.9"), trd2)
        results = [await tcp_receiver(tir, k, max_bytes=200_000).run() for k in range(3)]
        assert all(r.error is None and r.messages > 100 for r in results), results
        assert len(src.connections) == 3 and rb.counters["fanout_streams_opened"] == 0
        n.cancel_scope.cancel()


async def test_the_session_lingers_briefly_after_its_last_receiver_and_then_lets_go():
    """A receiver that comes back within the linger finds the session running
    (still one connection at the origin); once nobody comes back, the proxy's
    stream closes after NEAR_LINGER and the origin connection within twice
    UPSTREAM_LINGER after that."""
    from router.relays.tcp_fanout import NEAR_LINGER
    from router.relays.tcp_fanout_origin import UPSTREAM_LINGER

    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        src, _ = await tcp_live_source(n, trd1, rate=1000, message_size=500)
        tir = await resolve(udp("127.0.2.9"), trd2)
        assert (await tcp_receiver(tir, 0, max_bytes=50_000).run()).error is None
        assert (await tcp_receiver(tir, 1, max_bytes=50_000).run()).error is None  # at once: same session
        assert len(src.connections) == 1 and src.connections[0].finished is None
        left = trio.current_time()
        with trio.fail_after(NEAR_LINGER + 2 * UPSTREAM_LINGER + 2):
            while src.connections[0].finished is None:
                await trio.sleep(0.05)
        assert trio.current_time() - left >= NEAR_LINGER
        assert rb.status()["streams"] == 0 and ra.status()["streams"] == 0
        r = await tcp_receiver(tir, 2, max_bytes=50_000).run()  # a new session for a new receiver
        assert r.error is None and len(src.connections) == 2
        n.cancel_scope.cancel()


async def test_an_origin_that_sends_bytes_that_are_not_lbmc_ends_its_session():
    from tests.router.helpers import tcp_source

    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        addr = await tcp_source(n, SRC_IP, 1 << 20)  # a byte pattern
        n.start_soon(advertise_forever, udp(SRC_IP), trd1, *addr)
        tir = await resolve(udp("127.0.2.9"), trd2)
        stream = await trio.open_tcp_stream(tir.transport.ip, tir.transport.port)
        with trio.fail_after(5):
            assert await stream.receive_some(65536) == b""  # closed, nothing passed on
        assert ra.counters["fanout_upstream_malformed"] == 1
        n.cancel_scope.cancel()


async def test_a_peer_stream_that_is_not_lbmc_is_closed_at_the_proxy():
    """Router A relays per connection (fanout off: the origin's bytes as they
    are), router B fans out: bytes on the stream that are not LBMC close the
    proxy's stream (counted), and its receiver gets nothing of them."""
    from tests.router.helpers import tcp_source

    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n, a={"fanout": False})
        addr = await tcp_source(n, SRC_IP, 1 << 20)
        n.start_soon(advertise_forever, udp(SRC_IP), trd1, *addr)
        tir = await resolve(udp("127.0.2.9"), trd2)
        stream = await trio.open_tcp_stream(tir.transport.ip, tir.transport.port)
        with trio.fail_after(5):
            assert await stream.receive_some(65536) == b""
        assert rb.counters["fanout_stream_malformed"] == 1
        n.cancel_scope.cancel()


async def test_receivers_relayed_per_connection_share_a_fanned_out_session_at_the_far_router():
    """fanout="off" on the receivers' router only: a stream per receiver on the
    link, one connection to the origin, every receiver whole messages from its
    join point."""
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n, b={"fanout": False})
        src, _ = await tcp_live_source(n, trd1, rate=2000, message_size=500)
        tir = await resolve(udp("127.0.2.9"), trd2)
        rxs = [tcp_receiver(tir, k, max_bytes=300_000) for k in range(3)]
        async with trio.open_nursery() as rn:
            for rx in rxs:
                rn.start_soon(rx.run)
        assert all(rx.result.error is None and rx.result.messages > 100 for rx in rxs), [rx.result for rx in rxs]
        assert all(rx.result.session_id == TCP_SID for rx in rxs)
        assert len(src.connections) == 1 and ra.counters["fanout_upstreams"] == 1
        assert rb.counters["streams_opened"] == 3 and rb.counters["fanout_streams_opened"] == 0
        n.cancel_scope.cancel()


async def test_one_copy_on_each_link_of_a_chain_of_three_for_ten_receivers():
    """Routers r1 (TRD1, the source) - r2 (TRD2) - r3 (TRD3, ten receivers),
    each link through a counting forwarder: each link carries one copy of the
    session (r2 passes it on through its own fan-out), the origin has one
    connection, and every receiver gets whole, consecutive messages."""
    async with trio.open_nursery() as n:
        r1, r2, r3, f12, f32, trds, ips = await start_forwarded_chain(n)
        src, src_scope = await tcp_live_source(n, trds[1], rate=2000, message_size=1000)
        tir = await resolve(udp("127.0.3.9"), trds[3], timeout=20)
        assert tir.transport.ip == ips[3]
        l12, l23 = f12.a_to_b, f32.b_to_a
        results = []

        async def run(rx, task_status):
            results.append(await rx.run(task_status=task_status))

        async with trio.open_nursery() as rn:
            for k in range(10):
                rx = TcpDataReceiver(tir.transport.ip, tir.transport.port, None, TCP_SEED, tidx=TCP_TIDX,
                                     bind_ip=f"127.0.3.{20 + k}", timeout=60)
                await rn.start(run, rx)
            await trio.sleep(1.5)  # 3,000 messages of the live session
            src_scope.cancel()
        one = max(r.stream_bytes for r in results)
        for r in results:
            assert r.error is None and r.eof and r.messages > 1000, r
        l12, l23 = f12.a_to_b - l12, f32.b_to_a - l23
        print(f"chain, 10 receivers: links {l12} and {l23} bytes, one receiver {one}")
        assert 0.9 * one <= l12 <= 1.1 * one and 0.9 * one <= l23 <= 1.1 * one
        assert len(src.connections) == 1
        n.cancel_scope.cancel()


async def test_a_link_slower_than_the_source_paces_the_origin_and_nothing_is_dropped():
    """Router A's link queue (peer max-queue) at its 64 KiB minimum and a link
    slower than the source: with every way out full, router A stops reading
    the origin (TCP paces it, as a UM TCP source is paced by its receivers)
    instead of reading it as fast as it can and dropping. The receiver at B
    gets every message, consecutive and whole; neither router drops one."""
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        rb = Router("routerB", lbmrd_endpoint("B-TRD2", 2, [trd2], interface="127.0.2.1"),
                    acceptor_peer("B-to-A", 0, interface="127.0.0.1"))
        b_addr = await n.start(rb.run)
        fwd = Forwarder(b_addr["peer"], pace=4e6)
        f_addr = await n.start(fwd.serve)
        ra = Router("routerA", lbmrd_endpoint("A-TRD1", 1, [trd1], interface="127.0.1.1"),
                    initiator_peer("A-to-B", *f_addr, reconnect_interval_ms=500, max_queue=64 << 10))
        await n.start(ra.run)
        src, _ = await tcp_live_source(n, trd1, rate=4000, message_size=3000, max_burst=64)
        tir = await resolve(udp("127.0.2.9"), trd2)
        rx = tcp_receiver(tir, 0, max_bytes=8_000_000)
        result = await rx.run()
        assert result.error is None and result.messages > 2000, result
        assert ra.counters["fanout_upstream_paced"] > 0  # the link was the bottleneck
        assert ra.counters["fanout_link_dropped_messages"] == 0
        assert rb.counters["fanout_dropped_messages"] == 0
        assert rb.counters["fanout_stream_malformed"] == 0
        assert len(src.connections) == 1  # the source kept the router's connection
        n.cancel_scope.cancel()


async def test_a_sessions_frames_in_the_link_queue_stay_within_the_link_backlog():
    """A link slower than the source, with room in its queue (8 MiB) and in the
    stream's credit: router A keeps at most LINK_BACKLOG frames of the session
    in the link's queue (one, of 4 MiB: the routers negotiated LARGE_FRAMES)
    and holds the rest in the session's queue, not read from the origin yet
    (what it holds between a read and its write stays small). The receiver
    gets every message, consecutive and whole."""
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n, pace=30e6)
        await tcp_live_source(n, trd1, rate=20_000, message_size=8000, max_burst=256)
        tir = await resolve(udp("127.0.2.9"), trd2)
        assert ra.link.streams.max_frame == LARGE_PAYLOAD - 4  # (LARGE_FRAMES)
        frame = ra.link.streams.max_frame + STREAM_DATA_OVERHEAD
        most = 0

        async def watch():
            nonlocal most
            while True:
                most = max(most, ra.link.outq.data_bytes)
                await trio.sleep(0.002)

        n.start_soon(watch)
        result = await tcp_receiver(tir, 0, max_bytes=30_000_000).run()
        assert result.error is None and result.messages > 3000, result
        assert ra.counters["fanout_upstream_paced"] > 0  # the link was the bottleneck
        # (frames larger than MAX_PAYLOAD queued: a read is a frame, of what the origin's socket holds)
        assert MAX_PAYLOAD < most <= link_backlog(ra.link.streams.max_frame) == frame, (most, frame)
        assert ra.counters["fanout_link_dropped_messages"] == 0
        assert rb.counters["fanout_dropped_messages"] == 0
        n.cancel_scope.cancel()
