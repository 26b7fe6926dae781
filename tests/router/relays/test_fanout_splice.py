"""TCP fan-out to a lone receiver, zero copy (router.relays.tcp_fanout): router A
sends each run of whole messages without extension headers as one STREAM_DATA
frame flagged whole (capability WHOLE_MESSAGES), and router B splices such
frames from the link straight into its proxy's only receiver while that
receiver's queue is empty. Receivers that join and leave switch the session
between the spliced path and the queues with every receiver's stream whole and
consecutive from its join point; an older peer gets no flagged frame; requests
in the session are still rewritten at router B."""

from __future__ import annotations

import socket

import trio

from lbmr_proto import lbmc, lbmc_stream
from router import peerlink as P
from router.config.model import acceptor_peer, initiator_peer, lbmrd_endpoint
from router.peerlink import Capability
from router.shell import router as R
from router.shell.single import Router
from tests.router.helpers import (
    OTID,
    ROUTED_TOPIC,
    SRC_IP,
    TCP_SID,
    advertise_forever,
    connect_as_peer,
    resolve,
    start_forwarded_pair,
    start_lbmrd,
    tcp_live_source,
    tcp_receiver,
    udp,
)


async def spliced_then_stuck(n):
    """A pair, the live source at full rate, and a lone receiver that read 20 MB (spliced
    to) and reads no more, its receive buffer small (what is spliced for it then waits in
    router B's pipes, whatever the host's load): (rb, tir, its connection)."""
    ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
    await tcp_live_source(n, trd1, rate=1e6, message_size=4000, max_burst=256)
    tir = await resolve(udp("127.0.2.9"), trd2)
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    await sock.connect((tir.transport.ip, tir.transport.port))
    stuck = trio.SocketStream(sock)
    got = 0
    with trio.fail_after(10):
        while got < 20_000_000:
            got += len(await stuck.receive_some(1 << 20))
    return rb, tir, stuck


async def wait_done(*receivers, timeout: float = 30) -> None:
    with trio.fail_after(timeout):
        while not all(rx.result.done for rx in receivers):
            await trio.sleep(0.05)


async def test_a_lone_receiver_gets_the_session_spliced_from_the_link():
    """One receiver at full rate: nearly all of its bytes are spliced at router B
    (only its first bytes, the TCP_SID and any run not whole, are framed there),
    every message whole and consecutive, none dropped."""
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        src, _ = await tcp_live_source(n, trd1, rate=1e6, message_size=4000, max_burst=256)
        tir = await resolve(udp("127.0.2.9"), trd2)
        result = await tcp_receiver(tir, 0, max_bytes=30_000_000).run()
        assert result.error is None and result.messages > 7000, result
        assert result.session_id == TCP_SID
        with trio.fail_after(10):  # (counted as the proxy sees the receiver go)
            while rb.counters["fanout_spliced_bytes"] < 0.5 * result.stream_bytes:
                await trio.sleep(0.05)
        print(f"spliced {rb.counters['fanout_spliced_bytes']} of {result.stream_bytes} bytes")
        assert rb.counters["fanout_dropped_messages"] == 0 and ra.counters["fanout_link_dropped_messages"] == 0
        n.cancel_scope.cancel()


async def test_receivers_that_join_and_leave_a_spliced_session_each_get_a_whole_consecutive_stream():
    """The first receiver is spliced to; a second joins (both through the queues
    from then on: the second from the next message after what was spliced), then
    the first leaves; the second, alone now, is spliced to in its turn. Every
    stream is whole and consecutive (the receivers check sequence numbers and
    payloads)."""
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        await tcp_live_source(n, trd1, rate=1e6, message_size=4000, max_burst=256)
        tir = await resolve(udp("127.0.2.9"), trd2)
        first = tcp_receiver(tir, 0, max_bytes=400_000_000)
        n.start_soon(first.run)
        with trio.fail_after(10):
            while first.result.stream_bytes < 20_000_000:
                await trio.sleep(0.01)
        second = tcp_receiver(tir, 1, max_bytes=600_000_000)
        n.start_soon(second.run)
        await wait_done(first)
        r1 = first.result
        assert r1.error is None and r1.messages > 10_000, r1
        spliced = rb.counters["fanout_spliced_bytes"]
        await wait_done(second)
        r2 = second.result
        assert r2.error is None and r2.messages > 20_000, r2
        assert r2.session_id == TCP_SID and r2.control_messages == 1  # TCP_SID first, once
        assert r1.first_sqn < r2.first_sqn <= r1.last_sqn, (r1, r2)
        with trio.fail_after(5):  # alone, spliced to (counted within a second)
            while rb.counters["fanout_spliced_bytes"] < spliced + 50_000_000:
                await trio.sleep(0.05)
        assert rb.counters["fanout_dropped_messages"] == 0
        n.cancel_scope.cancel()


async def test_a_receiver_that_leaves_while_spliced_bytes_wait_for_it_loses_only_those():
    """A lone receiver that stops reading (its socket full, spliced bytes held in
    pipes for it) and then disconnects: what was held for it is thrown away
    and its credit returned, and the next receiver gets the session whole."""
    async with trio.open_nursery() as n:
        rb, tir, stuck = await spliced_then_stuck(n)
        await trio.sleep(1.0)  # the bytes for it wait in pipes
        assert rb.counters["fanout_receivers_stalled"] == 0
        await stuck.aclose()
        await trio.sleep(0.2)
        result = await tcp_receiver(tir, 1, max_bytes=20_000_000).run()
        assert result.error is None and result.messages > 4000, result
        assert rb.counters["fanout_spliced_dropped_bytes"] > 0
        n.cancel_scope.cancel()


async def test_an_older_peer_gets_no_whole_frames_and_the_session_still_crosses(monkeypatch):
    """Routers without capability WHOLE_MESSAGES: no frame is flagged, nothing
    is spliced at router B, the receiver's stream is whole and consecutive."""
    monkeypatch.setattr(R, "PEER_CAPABILITIES", R.PEER_CAPABILITIES & ~Capability.WHOLE_MESSAGES)
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        await tcp_live_source(n, trd1, rate=3000, message_size=3001)
        tir = await resolve(udp("127.0.2.9"), trd2)
        result = await tcp_receiver(tir, 0, max_bytes=5_000_000).run()
        assert result.error is None and result.messages > 1000, result
        assert rb.counters["fanout_spliced_bytes"] == 0
        n.cancel_scope.cancel()


async def test_a_lone_receiver_that_stops_reading_when_another_joins_is_cut_off_after_the_lag_timeout():
    """Spliced bytes wait for a lone receiver that stopped reading when a second
    receiver joins (from the next message after them): they cannot be cut at a
    message boundary, so after the lag timeout that receiver is disconnected
    (counted) and the second gets the session whole."""
    async with trio.open_nursery() as n:
        rb, tir, stuck = await spliced_then_stuck(n)
        await trio.sleep(0.5)
        second = tcp_receiver(tir, 1, max_bytes=20_000_000)
        n.start_soon(second.run)
        await wait_done(second, timeout=20)
        seen = {k: v for k, v in rb.counters.items() if k.startswith("fanout")}
        assert second.result.error is None and second.result.messages > 4000, (second.result, seen)
        assert rb.counters["fanout_receivers_behind"] >= 1, seen
        assert rb.counters["fanout_spliced_dropped_bytes"] > 0, seen
        with trio.fail_after(5):  # the stuck one was disconnected: it reads to EOF
            while await stuck.receive_some(1 << 20):
                pass
        n.cancel_scope.cancel()


async def test_requests_among_spliced_runs_are_still_rewritten_at_the_near_router():
    """A TCP origin that sends 8 MB runs of plain messages with a request after
    each: the plain runs are spliced to the lone receiver, each request (a
    message with a REQUEST header) goes framed through router B's message path
    and names B's request listener; every message arrives, in order."""
    per_run, runs = 1000, 6
    body = bytes(8000)

    async def serve(task_status):
        ls = trio.socket.socket()
        await ls.bind((SRC_IP, 0))
        ls.listen(4)
        task_status.started(ls.getsockname())
        sock, _ = await ls.accept()
        async with trio.SocketStream(sock) as conn:
            await conn.send_all(lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(lbmc.TcpSidHeader(0, TCP_SID),))))
            sqn = 0
            for r in range(runs):
                await conn.send_all(b"".join(lbmc.data_message(3, sqn + k, body) for k in range(per_run)))
                sqn += per_run
                h = lbmc.RequestHeader(transport=0, qidx=r, port=14391, ipaddr=SRC_IP)
                await conn.send_all(lbmc.data_message(3, sqn, b"request", h))
                sqn += 1
            await trio.sleep(30)

    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        ip, port = await n.start(serve)
        n.start_soon(advertise_forever, udp(SRC_IP), trd1, ip, port)
        tir = await resolve(udp("127.0.2.9"), trd2)
        conn = await trio.open_tcp_stream(tir.transport.ip, tir.transport.port)
        framer = lbmc_stream.StreamFramer()
        sqns, requests = [], []
        with trio.fail_after(20):
            while len(requests) < runs:
                for m in framer.feed(await conn.receive_some(1 << 20)):
                    d = lbmc.decode(m)
                    if d.kind == lbmc.CONTROL:
                        continue
                    sqns.append(d.sqn)
                    h = d.header(lbmc.RequestHeader)
                    if h is not None:
                        requests.append(h)
                    else:
                        assert d.payload == body
        assert sqns == list(range(len(sqns)))  # the first to the last, none missing or twice
        assert [h.qidx for h in requests] == list(range(runs))
        assert {h.ipaddr for h in requests} == {"127.0.2.1"} and 14391 not in {h.port for h in requests}
        assert rb.counters["requests_rewritten"] == runs
        with trio.fail_after(5):
            while rb.counters["fanout_spliced_bytes"] < 10_000_000:
                await trio.sleep(0.05)
        await conn.aclose()
        n.cancel_scope.cancel()


async def test_a_lone_receiver_that_keeps_reading_is_never_taken_for_stalled():
    """A lone receiver that reads at a limited rate (its socket often full, the
    spliced bytes waiting for it) for several stall timeouts: what the link's
    reader passes on by itself counts as progress, so it is never disconnected."""
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n, fanout_stall_timeout_ms=300)
        await tcp_live_source(n, trd1, rate=1e6, message_size=4000, max_burst=256)
        tir = await resolve(udp("127.0.2.9"), trd2)
        rx = tcp_receiver(tir, 0, max_bytes=60_000_000, rate_limit_bps=30e6)  # 2 s
        result = await rx.run()
        assert result.error is None and result.messages > 14_000, result
        assert rb.counters["fanout_receivers_stalled"] == 0
        assert rb.counters["fanout_spliced_bytes"] > 0
        n.cancel_scope.cancel()


async def test_a_peer_that_flags_bytes_that_are_not_messages_garbles_only_that_receivers_stream():
    """A peer of our own plays the sources' router: it advertises a TCP session,
    accepts the stream router B opens for its lone receiver and sends 64 KiB that
    are not LBMC, flagged whole messages. Router B passes them on as they are (it
    trusts the flag as it trusts the bytes of fanout="off"); the next unflagged
    bytes, framed, are not LBMC either: the stream is closed (counted), the
    receiver's connection ends, and the link stays up."""
    async with trio.open_nursery() as n:
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        rb = Router("routerB", lbmrd_endpoint("B-TRD2", 2, [trd2], interface="127.0.2.1"),
                    acceptor_peer("B-to-A", 0, interface="127.0.0.1"))
        addr = await n.start(rb.run)
        stream, conn = await connect_as_peer(addr["peer"], capabilities=P.DEFAULT_CAPABILITIES | R.PEER_CAPABILITIES)
        assert conn.capabilities & Capability.WHOLE_MESSAGES
        now = trio.current_time
        tir = None
        for _ in range(20):  # (advertised again until TRD2 wants the topic: router B binds no unwanted proxy)
            await stream.send_all(conn.send(P.Advertisement(ROUTED_TOPIC, 1, OTID, P.StreamKind.TCP, 7), now()))
            try:
                tir = await resolve(udp("127.0.2.9"), trd2, timeout=0.5)
                break
            except trio.TooSlowError:
                with trio.move_on_after(0.1):  # (whatever B said meanwhile)
                    conn.receive_data(await stream.receive_some(65536), now())
                await stream.send_all(conn.data_to_send())
        assert tir is not None
        rx = await trio.open_tcp_stream(tir.transport.ip, tir.transport.port)
        sid = None
        with trio.fail_after(10):
            while sid is None:
                for ev in conn.receive_data(await stream.receive_some(65536), now()):
                    if isinstance(ev, P.StreamOpen) and ev.advert_id == 7:
                        sid = ev.stream_id
                await stream.send_all(conn.data_to_send())
        garbage = bytes(range(256)) * 256  # 64 KiB, not LBMC
        await stream.send_all(conn.send(P.StreamAccept(sid, 1 << 20), now())
                              + conn.send(P.StreamData(sid, garbage, whole=True), now()))
        got = b""
        with trio.fail_after(10):
            while len(got) < len(garbage):
                got += await rx.receive_some(1 << 20)
        assert got == garbage
        await stream.send_all(conn.send(P.StreamData(sid, b"\x7f" * 64), now()))
        with trio.fail_after(10):
            assert await rx.receive_some(1 << 20) == b""  # the proxy's stream ended
        assert rb.counters["fanout_stream_malformed"] == 1
        assert rb.status()["peer"]["state"] == "CONNECTED"
        n.cancel_scope.cancel()


async def test_frames_of_4_mib_reach_several_receivers_through_queues_of_1_mb_and_none_is_dropped():
    """Routers that negotiated LARGE_FRAMES carry a session at full rate in frames
    larger than 1 MiB; router B takes each into its receivers' queues of 1 MB
    (the DRO's max-queue) in parts, as room comes: three receivers, every
    stream whole and consecutive, nothing dropped on either router."""
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        assert ra.link.capabilities & Capability.LARGE_FRAMES
        assert ra.link.streams.max_frame == P.LARGE_PAYLOAD - 4
        await tcp_live_source(n, trd1, rate=1e6, message_size=4000, max_burst=256)
        tir = await resolve(udp("127.0.2.9"), trd2)
        largest = 0  # data bytes of the largest STREAM_DATA frame router A writes (a spy: it writes them all)
        send_head = ra.link.conn.send_data_head

        def spy(stream_id, nbytes, now, whole=False):
            nonlocal largest
            largest = max(largest, nbytes)
            return send_head(stream_id, nbytes, now, whole)

        ra.link.conn.send_data_head = spy
        receivers = [tcp_receiver(tir, i, max_bytes=60_000_000) for i in range(3)]
        for rx in receivers:
            n.start_soon(rx.run)
        await wait_done(*receivers)
        for rx in receivers:
            assert rx.result.error is None and rx.result.messages > 14_000, rx.result
            assert rx.result.session_id == TCP_SID
        print(f"largest frame {largest} bytes")
        assert P.MAX_PAYLOAD < largest <= P.LARGE_PAYLOAD - 4
        assert rb.counters["fanout_dropped_messages"] == 0 and ra.counters["fanout_link_dropped_messages"] == 0
        n.cancel_scope.cancel()


async def test_a_router_b_without_large_frames_gets_frames_of_1_mib_still_spliced(monkeypatch):
    """Router B of an older version (no LARGE_FRAMES): router A frames the session
    in frames of at most 1 MiB, still flagged whole, router B splices them to
    its lone receiver; the stream is whole and consecutive."""
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        monkeypatch.setattr(R, "PEER_CAPABILITIES", R.PEER_CAPABILITIES & ~Capability.LARGE_FRAMES)
        rb = Router("routerB", lbmrd_endpoint("B-TRD2", 2, [trd2], interface="127.0.2.1"),
                    acceptor_peer("B-to-A", 0, interface="127.0.0.1"))
        b_addr = await n.start(rb.run)
        monkeypatch.undo()
        ra = Router("routerA", lbmrd_endpoint("A-TRD1", 1, [trd1], interface="127.0.1.1"),
                    initiator_peer("A-to-B", *b_addr["peer"], reconnect_interval_ms=500))
        await n.start(ra.run)
        with trio.fail_after(5):
            while ra.link is None or not ra.link.connected:
                await trio.sleep(0.05)
        assert not ra.link.capabilities & Capability.LARGE_FRAMES
        assert ra.link.conn.max_payload == P.MAX_PAYLOAD and ra.link.streams.max_frame == P.MAX_PAYLOAD - 4
        await tcp_live_source(n, trd1, rate=1e6, message_size=4000, max_burst=256)
        tir = await resolve(udp("127.0.2.9"), trd2)
        result = await tcp_receiver(tir, 0, max_bytes=30_000_000).run()
        assert result.error is None and result.messages > 7000, result
        with trio.fail_after(10):
            while rb.counters["fanout_spliced_bytes"] < 0.5 * result.stream_bytes:
                await trio.sleep(0.05)
        assert rb.counters["fanout_dropped_messages"] == 0 and ra.counters["fanout_link_dropped_messages"] == 0
        n.cancel_scope.cancel()
