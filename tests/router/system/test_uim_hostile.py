"""Hostile UIM traffic at a router's request listener, on loopback (the pair of
test_uim_routing): a flood, an endless message, an unknown domain, a stalled
destination, too many connections, an older peer without UIM_ROUTING. Each is
bounded and counted, and UIMs to a good destination still arrive."""

from __future__ import annotations

import logging
import math

import trio

from lbmr_proto import lbmc
from router import peerlink as P
from router.config.model import RequestListener, acceptor_peer, initiator_peer, lbmrd_endpoint
from router.relays import uim as U
from router.relays import uim_targets as UT
from router.shell import router as R
from router.shell.single import Router
from tests.router.helpers import (
    advertise_forever,
    connect_as_peer,
    fetch_tcp,
    pattern,
    resolve,
    start_lbmrd,
    tcp_source,
    udp,
)
from tests.router.system.uim_apps import (
    PORT,
    UimInbox,
    pair,
    pair_and_trds,
    routed,
    send_uims,
    uim,
    with_hops,
)

LISTENER = ("127.0.1.1", PORT)


async def good_uims_arrive(app1, app2, count=10, seq=1000):
    sent = [uim(seq + i, (2, *app2.address), (1, *app1.address)) for i in range(count)]
    before = len(app2.messages)
    await send_uims(LISTENER, sent, bind_ip="127.0.1.9")
    got = await app2.wait_for(before + count)
    assert got[before:before + count] == [with_hops(m, 2) for m in sent]


async def apps(n):
    app1, app2 = UimInbox("127.0.1.9"), UimInbox("127.0.2.9")
    await n.start(app1.serve)
    await n.start(app2.serve)
    return app1, app2


async def test_a_flood_to_unknown_and_refusing_destinations_is_counted_and_others_still_arrive():
    async with trio.open_nursery() as n:
        ra, rb, trd1, trd2 = await pair_and_trds(n)
        app1, app2 = await apps(n)
        unknown = [uim(i, (77, "127.0.2.9", 1000 + i % 7), (1, *app1.address)) for i in range(5000)]
        nobody = [uim(i, (2, "127.0.2.9", 9), (1, *app1.address)) for i in range(5000)]  # port 9: refused
        bare = [lbmc.data_message(0, i, b"x" * 20) for i in range(5000)]
        flood = b"".join(unknown + nobody + bare)

        async def flooder():
            stream = await trio.open_tcp_stream(*LISTENER)
            async with stream:
                for _ in range(4):
                    await stream.send_all(flood)
        src = await tcp_source(n, "127.0.1.5", 2_000_000)  # a relayed TCP session, meanwhile
        n.start_soon(advertise_forever, udp("127.0.1.5"), trd1, *src)
        tir = await resolve(udp("127.0.2.9"), trd2)
        relayed = {}

        async def receiver():
            relayed["bytes"] = await fetch_tcp(tir, 2_000_000)
        async with trio.open_nursery() as fn:
            for _ in range(3):
                fn.start_soon(flooder)
            fn.start_soon(receiver)
            await good_uims_arrive(app1, app2)
        assert relayed["bytes"] == pattern(2_000_000)  # the data plane carried on
        c = ra.uim.counters
        with trio.fail_after(10):  # every one of them decided, once
            while c["uim_in"] < 3 * 4 * 15000 + 10:
                await trio.sleep(0.05)
        assert c["uim_unreachable"] == 3 * 4 * 5000
        assert c["uim_no_destination"] == 3 * 4 * 5000
        a, b = ra.uim.counters, rb.uim.counters
        total = 3 * 4 * 5000 + 10  # for domain 2: to a refused port, and the good ones

        def dropped_at_a():
            return sum(a[k] for k in ("uim_target_queue_full", "uim_queued_total_full", "uim_target_down",
                                      "uim_forward_failed", "uim_forward_refused"))

        def outcomes_at_b():
            return sum(b[k] for k in ("uim_delivered", "uim_deliver_unreachable", "uim_target_down",
                                      "uim_target_queue_full", "uim_deliver_failed"))
        with trio.fail_after(20):  # every message for domain 2 accounted for, once
            while not (a["uim_to_forward"] == total and dropped_at_a() + a["uim_forwarded"] == total
                       and b["uim_in"] == a["uim_forwarded"] and outcomes_at_b() == b["uim_in"]):
                await trio.sleep(0.05)
        assert rb.uim.counters["uim_delivered"] == 10
        assert ra.uim.queued == 0 or ra.uim.queued <= UT.QUEUED_TOTAL
        n.cancel_scope.cancel()


async def test_an_endless_message_and_a_silent_connection_are_closed_and_counted(monkeypatch):
    monkeypatch.setattr(U, "MESSAGE_TIMEOUT", 0.5)
    monkeypatch.setattr(U, "IDLE_TIMEOUT", 1.0)
    async with trio.open_nursery() as n:
        ra, _ = await pair(n)
        app1, app2 = await apps(n)
        endless = await trio.open_tcp_stream(*LISTENER)
        head = uim(1, (2, *app2.address), (1, *app1.address), size=60000)
        await endless.send_all(head[:100])  # a message of ~60 kB that never completes
        silent = await trio.open_tcp_stream(*LISTENER)

        async def trickle():  # a byte at a time: still never completes in time
            for b in head[100:200]:
                try:
                    await endless.send_all(bytes([b]))
                except trio.BrokenResourceError:
                    return
                await trio.sleep(0.05)
        n.start_soon(trickle)
        await good_uims_arrive(app1, app2)
        with trio.fail_after(5):
            assert await endless.receive_some(10) == b""  # the router closed it
            assert await silent.receive_some(10) == b""
        c = ra.uim.counters
        assert c["uim_message_timeout"] == 1 and c["uim_connections_idle"] >= 1
        with trio.fail_after(5):
            while ra.uim.connections:  # (the good sender's ends as it closes)
                await trio.sleep(0.05)
        n.cancel_scope.cancel()


async def test_garbage_closes_the_connection_and_is_counted():
    async with trio.open_nursery() as n:
        ra, _ = await pair(n)
        app1, app2 = await apps(n)
        bad = await trio.open_tcp_stream(*LISTENER)
        await bad.send_all(b"GET / HTTP/1.1\r\n\r\n")
        with trio.fail_after(5):
            assert await bad.receive_some(10) == b""
        assert ra.uim.counters["uim_malformed"] == 1
        await good_uims_arrive(app1, app2)
        n.cancel_scope.cancel()


async def test_garbage_connections_are_all_counted_and_their_log_lines_bounded(monkeypatch, caplog):
    monkeypatch.setattr(R, "LOG_WINDOW", 2.0)  # a short window, so the summary comes soon
    caplog.set_level(logging.INFO, logger="lbmr-router")
    garbage = 300
    async with trio.open_nursery() as n:
        ra, _ = await pair(n)
        t0 = trio.current_time()
        for _ in range(garbage):
            bad = await trio.open_tcp_stream(*LISTENER)
            await bad.send_all(b"GET / HTTP/1.1\r\n\r\n")
            with trio.fail_after(5):
                assert await bad.receive_some(10) == b""
            await bad.aclose()
        assert ra.uim.counters["uim_malformed"] == garbage
        assert sum(1 for e in ra.uim_events if e[1] == "uim_malformed") == garbage
        with trio.fail_after(10):
            while ra.event_log.limit.next_due() is not None:
                await trio.sleep(0.1)
        elapsed = trio.current_time() - t0
        n.cancel_scope.cancel()
    msgs = [r.getMessage() for r in caplog.records]
    lines = [m for m in msgs if m.startswith("uim_malformed ")]
    summaries = [m for m in msgs if m.endswith("uim_malformed events suppressed in the last 2 s")]
    assert summaries, msgs[-5:]
    suppressed = sum(int(m.split()[0]) for m in summaries)
    assert len(lines) + suppressed == garbage
    windows = math.ceil(elapsed / 2.0) + 1
    assert len(lines) <= R.LOG_LINES_PER_WINDOW * windows and len(summaries) <= windows


async def test_connections_beyond_the_bound_are_refused_and_counted(monkeypatch):
    monkeypatch.setattr(U, "MAX_CONNECTIONS", 3)
    async with trio.open_nursery() as n:
        ra, _ = await pair(n)
        app1, app2 = await apps(n)
        held = [await trio.open_tcp_stream(*LISTENER) for _ in range(3)]
        await trio.sleep(0.2)
        extra = await trio.open_tcp_stream(*LISTENER)
        with trio.fail_after(5):
            assert await extra.receive_some(10) == b""
        assert ra.uim.counters["uim_connections_refused"] >= 1
        for s in held:
            await s.aclose()
        await trio.sleep(0.2)
        await good_uims_arrive(app1, app2)
        n.cancel_scope.cancel()


async def test_a_stalled_destination_loses_only_its_own_messages(monkeypatch):
    monkeypatch.setattr(UT, "STALL_TIMEOUT", 1.0)
    async with trio.open_nursery() as n:
        ra, rb = await pair(n)
        app1, app2 = await apps(n)
        stalled_listener = (await trio.open_tcp_listeners(0, host="127.0.2.8"))[0]
        stalled = stalled_listener.socket.getsockname()[:2]
        conns = []

        async def never_read():
            while True:
                conns.append(await stalled_listener.accept())  # accepted, never read
        n.start_soon(never_read)
        big = [uim(i, (2, *stalled), (1, *app1.address), size=60000) for i in range(200)]  # 12 MB
        n.start_soon(send_uims, LISTENER, big, "127.0.1.9")
        await trio.sleep(0.5)
        await good_uims_arrive(app1, app2)
        c = rb.uim.counters
        with trio.fail_after(10):
            while c["uim_delivered"] + c["uim_deliver_failed"] + c["uim_target_queue_full"] \
                    + c["uim_target_down"] + c["uim_deliver_unreachable"] < 200 + 10:
                await trio.sleep(0.1)
        assert c["uim_deliver_failed"] + c["uim_target_queue_full"] + c["uim_target_down"] > 0
        assert len(conns) >= 1
        await good_uims_arrive(app1, app2, seq=2000)  # and still after the stall
        n.cancel_scope.cancel()


async def test_a_peer_without_uim_routing_gets_no_streams_and_it_is_counted(monkeypatch):
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        listener = RequestListener(port=PORT)
        monkeypatch.setattr(R, "PEER_CAPABILITIES", 0)  # router B: an older version
        rb = Router("routerB", lbmrd_endpoint("B-TRD2", 2, [trd2], interface="127.0.2.1", fanout=False,
                                              request_listener=listener),
                    acceptor_peer("B-to-A", 0, interface="127.0.0.1"))
        b_addr = await n.start(rb.run)
        monkeypatch.undo()
        ra = Router("routerA", lbmrd_endpoint("A-TRD1", 1, [trd1], interface="127.0.1.1", fanout=False,
                                              request_listener=listener),
                    initiator_peer("A-to-B", "127.0.0.1", b_addr["peer"][1], reconnect_interval_ms=1000))
        await n.start(ra.run)
        await routed(ra, rb)
        assert not ra.link.capabilities & P.Capability.UIM_ROUTING
        app1, app2 = await apps(n)
        await send_uims(LISTENER, [uim(i, (2, *app2.address), (1, *app1.address)) for i in range(10)],
                        bind_ip="127.0.1.9")
        with trio.fail_after(5):
            while ra.uim.counters["uim_forward_peer_unable"] + ra.uim.counters["uim_target_down"] < 10:
                await trio.sleep(0.05)
        assert ra.uim.counters["uim_streams_opened"] == 0 and app2.messages == []
        assert ra.link.connected  # the link stays up
        n.cancel_scope.cancel()


async def test_a_hostile_peer_streams_are_refused_checked_and_closed_and_the_link_stays():
    """A peer of our own opens UIM_ROUTED streams at router B: one for an unknown domain
    (refused), one whose messages name another destination too (those dropped), one of
    garbage (closed); the good messages arrive, the link stays up."""
    async with trio.open_nursery() as n:
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        rb = Router("routerB", lbmrd_endpoint("B-TRD2", 2, [trd2], interface="127.0.2.1", fanout=False,
                                              request_listener=RequestListener(port=PORT)),
                    acceptor_peer("B-to-A", 0, interface="127.0.0.1"))
        addr = await n.start(rb.run)
        app1, app2 = await apps(n)
        stream, conn = await connect_as_peer(addr["peer"], capabilities=P.DEFAULT_CAPABILITIES | R.PEER_CAPABILITIES)
        assert conn.capabilities & P.Capability.UIM_ROUTING
        now = trio.current_time
        dest = (2, *app2.address)

        def open_stream(sid, domain, ip, port):
            return conn.send(P.StreamOpen(sid, 0, P.StreamKind.UIM_ROUTED, 1 << 20,
                                          P.RoutedUimTarget(domain, ip, port, 0)), now())
        good = [uim(i, dest, (1, *app1.address), hops=1) for i in range(3)]
        other = uim(9, (2, app2.address[0], app2.address[1] + 1), (1, *app1.address), hops=1)
        await stream.send_all(open_stream(1, *dest) + open_stream(3, 9, "127.0.9.9", 5000)
                              + open_stream(5, *dest))
        answers = {}
        closed = set()

        async def read_until(pred):
            with trio.fail_after(10):
                while not pred():
                    for ev in conn.receive_data(await stream.receive_some(65536), now()):
                        if isinstance(ev, P.StreamAccept | P.StreamRefuse):
                            answers[ev.stream_id] = ev
                        elif isinstance(ev, P.StreamClose):
                            closed.add(ev.stream_id)
                    await stream.send_all(conn.data_to_send())
        await read_until(lambda: len(answers) == 3)
        assert isinstance(answers[1], P.StreamAccept) and isinstance(answers[5], P.StreamAccept)
        assert isinstance(answers[3], P.StreamRefuse) and "no route" in answers[3].reason
        await stream.send_all(conn.send(P.StreamData(1, b"".join(good[:2] + [other] + good[2:])), now())
                              + conn.send(P.StreamData(5, b"\x7f" * 64), now()))
        await read_until(lambda: 5 in closed)
        got = await app2.wait_for(3)
        assert got == [with_hops(m, 2) for m in good]
        c = rb.uim.counters
        assert c["uim_stream_mismatch"] == 1 and c["uim_malformed"] == 1 and c["uim_unreachable"] == 1
        assert rb.link is not None and rb.link.connected
        n.cancel_scope.cancel()


async def test_a_uim_to_the_routers_own_listener_is_dropped_not_looped():
    async with trio.open_nursery() as n:
        ra, rb = await pair(n)
        app1, app2 = await apps(n)
        await send_uims(LISTENER, [uim(1, (2, "127.0.2.1", PORT), (1, *app1.address))], bind_ip="127.0.1.9")
        with trio.fail_after(5):
            while not rb.uim.counters["uim_to_own_listener"]:
                await trio.sleep(0.05)
        await trio.sleep(0.3)
        assert rb.uim.counters["uim_to_own_listener"] == 1 and rb.uim.counters["uim_connections"] == 0
        await good_uims_arrive(app1, app2)
        n.cancel_scope.cancel()


async def test_a_destination_that_closes_its_connection_gets_a_new_one():
    """A context that closes the connection after each message (as one may close an
    idle UIM connection): the next message comes on a new connection, none lost."""
    async with trio.open_nursery() as n:
        ra, rb = await pair(n)
        app1 = UimInbox("127.0.1.9")
        await n.start(app1.serve)
        got = []
        closer = (await trio.open_tcp_listeners(0, host="127.0.2.7"))[0]
        addr = closer.socket.getsockname()[:2]

        async def take_one_and_close(stream):
            async with stream:
                got.append(await stream.receive_some(65536))
        n.start_soon(trio.serve_listeners, take_one_and_close, [closer])
        for i in range(5):
            await send_uims(LISTENER, [uim(i, (2, *addr), (1, *app1.address))], bind_ip="127.0.1.9")
            with trio.fail_after(5):
                while len(got) <= i:
                    await trio.sleep(0.02)
            await trio.sleep(0.2)  # the close reaches the router
        assert got == [with_hops(uim(i, (2, *addr), (1, *app1.address)), 2) for i in range(5)]
        assert rb.uim.counters["uim_deliver_reconnects"] == 4
        n.cancel_scope.cancel()


async def test_a_peers_uim_routed_streams_are_bounded_in_number_and_in_time(monkeypatch):
    """A peer opens more UIM_ROUTED streams than MAX_FAR_STREAMS (refused, counted), holds a
    message incomplete on one (closed MESSAGE_TIMEOUT after its first byte) and says nothing
    on another (closed after IDLE_TIMEOUT): each stream holds up to a message's bytes, so
    neither their number nor their time is the peer's to choose."""
    monkeypatch.setattr(U, "MAX_FAR_STREAMS", 2, raising=False)
    monkeypatch.setattr(U, "MESSAGE_TIMEOUT", 0.5)
    monkeypatch.setattr(U, "IDLE_TIMEOUT", 1.5)
    async with trio.open_nursery() as n:
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        rb = Router("routerB", lbmrd_endpoint("B-TRD2", 2, [trd2], interface="127.0.2.1", fanout=False,
                                              request_listener=RequestListener(port=PORT)),
                    acceptor_peer("B-to-A", 0, interface="127.0.0.1"))
        addr = await n.start(rb.run)
        app1, app2 = await apps(n)
        stream, conn = await connect_as_peer(addr["peer"], capabilities=P.DEFAULT_CAPABILITIES | R.PEER_CAPABILITIES)
        now = trio.current_time
        dest = (2, *app2.address)

        def open_stream(sid):
            return conn.send(P.StreamOpen(sid, 0, P.StreamKind.UIM_ROUTED, 1 << 20, P.RoutedUimTarget(*dest, 0)), now())
        answers, closed = {}, {}

        async def read_until(pred, timeout=10):
            with trio.fail_after(timeout):
                while not pred():
                    for ev in conn.receive_data(await stream.receive_some(65536), now()):
                        if isinstance(ev, P.StreamAccept | P.StreamRefuse):
                            answers[ev.stream_id] = ev
                        elif isinstance(ev, P.StreamClose):
                            closed[ev.stream_id] = now()
                    await stream.send_all(conn.data_to_send())
        t0 = now()
        await stream.send_all(open_stream(1) + open_stream(3) + open_stream(5))
        await read_until(lambda: len(answers) == 3)
        assert isinstance(answers[1], P.StreamAccept) and isinstance(answers[3], P.StreamAccept)
        assert isinstance(answers[5], P.StreamRefuse)
        good = uim(1, dest, (1, *app1.address), hops=1)
        await stream.send_all(conn.send(P.StreamData(1, good + good[:40]), now()))  # one whole, one begun
        await read_until(lambda: 1 in closed and 3 in closed)
        assert closed[1] - t0 < 1.4 and closed[3] - t0 >= 1.5
        assert await app2.wait_for(1) == [with_hops(good, 2)]
        c = rb.uim.counters
        assert c["uim_streams_refused_busy"] == 1 and c["uim_message_timeout"] == 1 and c["uim_streams_idle"] == 1
        # their places are free again
        await stream.send_all(open_stream(7))
        await read_until(lambda: 7 in answers)
        assert isinstance(answers[7], P.StreamAccept)
        assert rb.link is not None and rb.link.connected
        n.cancel_scope.cancel()
