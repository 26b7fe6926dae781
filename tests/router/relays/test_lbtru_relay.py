"""LBT-RU fan-out through a router pair (router.relays.lbtru_fanout): lbmr-sim's live
LBT-RU source in TRD1, its receivers in TRD2, routers A (TRD1) and B (TRD2)
joined through a counting TCP forwarder, all on 127.0.0.1. One upstream
LBT-RU client at the origin per session, one copy on the link, every
receiver whole and consecutive messages from its join point."""

from __future__ import annotations

import socket

import trio

from lbmr_proto import lbmc
from lbmr_proto import lbtru as RU
from lbmr_proto.capture import write_udp_pcap
from lbmr_tools.sim.dataplane import RuLiveReceiver
from router import peerlink as P
from tests.helpers import RU_CHAT, udp_forwarder
from tests.router.helpers import (
    RU_SEED,
    RU_SID,
    RU_SIZE,
    RU_TIDX,
    resolve,
    ru_live_source,
    ru_receiver,
    run_all,
    start_forwarded_chain,
    start_forwarded_pair,
    udp,
)
from tests.tshark_judge import compare_lbmc, tshark_frames


async def test_one_copy_on_the_link_and_one_origin_client_for_one_and_ten_receivers():
    for receivers in (1, 10):
        async with trio.open_nursery() as n:
            ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
            src, _ = await ru_live_source(n, trd1)
            tir = await resolve(udp("127.0.2.9"), trd2)
            assert tir.transport.NAME == "LBTRU" and tir.transport.session_id == RU_SID  # the origin's
            link0 = fwd.a_to_b
            results = await run_all([ru_receiver(tir, k, 2000) for k in range(receivers)])
            link = fwd.a_to_b - link0
            for r in results:
                assert r.ok and r.messages == 2000 and r.foreign == 0, r
            one = max(r.datagrams for r in results) * RU_SIZE
            print(f"{receivers} receivers: link {link} bytes, one receiver {one} bytes, ratio {link / one:.3f}")
            assert 0.9 * one <= link <= 1.1 * one
            assert len(src.clients) == 1  # one LBT-RU client at the origin: the router's upstream
            assert ra.counters["lbtru_upstreams"] == 1 and rb.counters["lbtru_proxy_streams_opened"] == 1
            assert rb.counters["lbtru_clients_confirmed"] == receivers and rb.counters["ru_streams_opened"] == 0
            n.cancel_scope.cancel()


async def test_a_late_joiner_starts_at_a_message_boundary():
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        src, _ = await ru_live_source(n, trd1)
        tir = await resolve(udp("127.0.2.9"), trd2)
        first = ru_receiver(tir, 0, 6000)
        n.start_soon(first.run)
        await trio.sleep(1.0)
        r2 = await ru_receiver(tir, 1, 1000).run()
        with trio.fail_after(10):
            while not first.result.done:
                await trio.sleep(0.1)
        r1 = first.result
        assert r1.ok and r2.ok, (r1, r2)
        assert r1.first_sqn < r2.first_sqn <= r1.last_sqn, (r1, r2)  # from the live lead, whole messages
        assert len(src.clients) == 1
        n.cancel_scope.cancel()


async def test_the_origin_ends_the_session_and_the_proxy_is_withdrawn_in_the_deletion_delay():
    """The source ends (an RST to the router's upstream client): every receiver
    gets an RST from the proxy after whole messages, and the proxy is withdrawn
    within source-deletion-delay (1 s) plus a margin; a receiver that left
    earlier did not end the session for the others."""
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        src, src_scope = await ru_live_source(n, trd1)
        tir = await resolve(udp("127.0.2.9"), trd2)
        rxs = [ru_receiver(tir, k, 1_000_000) for k in range(3)]
        for rx in rxs:
            await n.start(rx.run)
        assert (await ru_receiver(tir, 5, 300).run()).ok  # leaves after 300 messages
        with trio.fail_after(20):  # the session goes on for the others (however loaded the host)
            while not all(rx.result.messages > 1000 for rx in rxs):
                await trio.sleep(0.05)
        assert all(not rx.result.done for rx in rxs)
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
            r = rx.result
            assert r.reset and "ended the session" in r.error and r.messages > 1000, r
        assert len(src.clients) == 1 and ra.counters["sources_ended"] == 1
        assert ra.counters["lbtru_upstream_ended"] == 1 and rb.counters["lbtru_proxy_sessions_ended"] == 1
        n.cancel_scope.cancel()


async def _deaf_client(proxy) -> trio.socket.SocketType:
    """A receiver that connects (CREQ, then one ACK after the SYN) and then
    neither reads nor ACKs (a 4 KiB receive buffer)."""
    s = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await s.bind(("127.0.2.40", 0))
    await s.sendto(RU.encode_creq(session_id=RU_SID), proxy)
    with trio.fail_after(5):
        while True:
            m = RU.decode((await s.recvfrom(65535))[0])
            if isinstance(m, RU.SessionMessage) and m.syn:
                break
    await s.sendto(RU.encode_ack(0, session_id=RU_SID, client_id=m.header.client_id), proxy)
    return s


async def test_a_receiver_that_stops_acking_and_reading_slows_nobody():
    """Three receivers read, one connects and then neither reads nor ACKs:
    over a 2.5 s window the readers get what the origin sends (but for the
    few in flight), and the origin keeps sending."""
    rate = 2000
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        src, _ = await ru_live_source(n, trd1, rate=rate)
        tir = await resolve(udp("127.0.2.9"), trd2)
        rxs = [ru_receiver(tir, k, 1_000_000) for k in range(3)]
        for rx in rxs:
            await n.start(rx.run)
        deaf = await _deaf_client((tir.transport.ip, tir.transport.port))
        await trio.sleep(1.0)  # its socket buffer is full
        up = next(iter(src.clients.values()))
        before = [rx.result.messages for rx in rxs], up.datagrams_sent
        t0 = trio.current_time()
        await trio.sleep(2.5)
        elapsed = trio.current_time() - t0
        after = [rx.result.messages for rx in rxs], up.datagrams_sent
        want = rate * elapsed
        sent = after[1] - before[1]
        got = [a - b for b, a in zip(before[0], after[0], strict=True)]
        # the readers keep up with what the origin sent (a few in flight at either end);
        # the origin shares this process with the routers and readers, so its own pace
        # follows the host's load: it must not stall (half its rate at least)
        assert all(g >= sent - 20 for g in got), (got, sent)
        assert sent >= 0.5 * want, (sent, want)
        assert all(rx.result.error is None for rx in rxs), [rx.result for rx in rxs]
        assert len(src.clients) == 1 and rb.counters["lbtru_clients_confirmed"] == 4
        deaf.close()
        n.cancel_scope.cancel()


async def test_tshark_decodes_the_proxys_datagrams_with_no_expert(tmp_path):
    log: list = []
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        await ru_live_source(n, trd1, rate=3000)
        tir = await resolve(udp("127.0.2.9"), trd2)
        proxy = (tir.transport.ip, tir.transport.port)
        front = await n.start(lambda task_status: udp_forwarder(proxy, log=log, task_status=task_status))
        r = await RuLiveReceiver(*front, expect_count=60, seed=RU_SEED, tidx=RU_TIDX, session_id=RU_SID,
                                 ack_interval=0.005).run()
        n.cancel_scope.cancel()
    assert r.ok, r
    rcv = ("127.0.2.20", 14360)
    dgs = [(i * 0.001, *(rcv if up else proxy), *(proxy if up else rcv), data) for i, (up, _, data) in enumerate(log)]
    pcap = tmp_path / "proxy-lbtru.pcap"
    write_udp_pcap(pcap, dgs)
    frames = list(tshark_frames(pcap, f"udp.port=={proxy[1]},lbtru"))
    assert len(frames) == len(log) and [(k, e, m) for k, _, e, m in frames if set(e) - RU_CHAT or m] == []
    types = [RU.decode(d) for _, _, d in log]
    data = [(layers, t) for (_, layers, _, _), t in zip(frames, types, strict=True) if isinstance(t, RU.Data)]
    assert len(data) >= 60 and all(t.header.session_id == RU_SID for _, t in data)
    for layers, t in data:
        assert compare_lbmc(layers["lbmc"], lbmc.decode(t.payload)) == []


async def test_fanout_off_relays_each_receiver_on_its_own():
    """<relay fanout="off">: one stream and one origin client per receiver."""
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n, fanout=False)
        src, _ = await ru_live_source(n, trd1)
        tir = await resolve(udp("127.0.2.9"), trd2)
        results = await run_all([ru_receiver(tir, k, 600) for k in range(3)])
        assert all(r.ok for r in results), results
        assert len(src.clients) == 3 and rb.counters["ru_streams_opened"] == 3
        assert ra.counters["lbtru_upstreams"] == 0
        n.cancel_scope.cancel()


async def test_a_peer_without_ru_sessions_gets_the_per_receiver_relay(monkeypatch):
    """Routers that do not both set capability RU_SESSIONS (an older version)
    relay LBT-RU per receiver, and it works."""
    monkeypatch.setattr(P, "DEFAULT_CAPABILITIES", P.DEFAULT_CAPABILITIES & ~P.Capability.RU_SESSIONS)
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        src, _ = await ru_live_source(n, trd1)
        tir = await resolve(udp("127.0.2.9"), trd2)
        results = await run_all([ru_receiver(tir, k, 600) for k in range(2)])
        assert all(r.ok for r in results), results
        assert len(src.clients) == 2 and rb.counters["ru_streams_opened"] == 2
        assert rb.counters["lbtru_proxy_streams_opened"] == 0
        n.cancel_scope.cancel()


async def test_hostile_datagrams_at_the_proxy_and_the_upstream_socket_are_counted_and_dropped():
    """Garbage, huge datagrams, another session's CREQ and a NAK flood at the
    proxy, and datagrams from a stranger to the router's upstream socket:
    counted (or dropped by the kernel: the upstream socket is connected to
    the origin), and the receiver gets its messages."""
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        src, _ = await ru_live_source(n, trd1)
        tir = await resolve(udp("127.0.2.9"), trd2)
        proxy = (tir.transport.ip, tir.transport.port)
        good = ru_receiver(tir, 0, 4000)
        await n.start(good.run)
        await trio.sleep(0.3)
        (up_peer,) = [c.peer for c in src.clients.values()]
        ip, port = up_peer.rsplit(":", 1)
        bad = udp("127.0.2.41")
        for _ in range(50):
            await bad.sendto(b"\xff" * 16, proxy)
            await bad.sendto(b"\xff" * 60000, proxy)
            await bad.sendto(RU.encode_creq(session_id=RU_SID + 1), proxy)
            await bad.sendto(RU.encode_nak(list(range(300)), session_id=RU_SID), proxy)
            await bad.sendto(RU.encode_rst(), (ip, int(port)))
            await bad.sendto(RU.encode_data(1, 0, b"\x01" * 100, session_id=RU_SID), (ip, int(port)))
        with trio.fail_after(10):
            while not good.result.done:
                await trio.sleep(0.1)
        assert good.result.ok, good.result
        c = rb.counters
        assert c["lbtru_malformed"] == 100 and c["lbtru_other_session"] == 50 and c["lbtru_unknown_client"] == 50
        assert ra.counters["lbtru_upstream_ended"] == 0 and len(src.clients) == 1
        n.cancel_scope.cancel()


async def test_one_copy_on_each_link_of_a_chain_of_three_for_ten_receivers():
    """Routers r1 (TRD1, the source) - r2 (TRD2) - r3 (TRD3, ten receivers),
    each link through a counting forwarder: each link carries one copy of the
    session (r2's upstream client is a receiver of its own proxy), the origin
    has one client, and every receiver gets whole, consecutive messages."""
    async with trio.open_nursery() as n:
        r1, r2, r3, f12, f32, trds, ips = await start_forwarded_chain(n)
        src, _ = await ru_live_source(n, trds[1])
        tir = await resolve(udp("127.0.3.9"), trds[3], timeout=20)
        assert tir.transport.ip == ips[3] and tir.transport.session_id == RU_SID
        l12, l23 = f12.a_to_b, f32.b_to_a
        rxs = [RuLiveReceiver(tir.transport.ip, tir.transport.port, expect_count=2000, seed=RU_SEED, tidx=RU_TIDX,
                              session_id=RU_SID, bind_ip=f"127.0.3.{20 + k}", timeout=30) for k in range(10)]
        results = await run_all(rxs)
        l12, l23 = f12.a_to_b - l12, f32.b_to_a - l23
        for r in results:
            assert r.ok, r
        one = max(r.datagrams for r in results) * RU_SIZE
        print(f"chain, 10 receivers: links {l12} and {l23} bytes, one receiver {one}")
        assert 0.9 * one <= l12 <= 1.1 * one and 0.9 * one <= l23 <= 1.1 * one
        assert len(src.clients) == 1
        n.cancel_scope.cancel()


async def test_the_upstream_sessions_of_an_endpoint_are_bounded():
    """ru-max-streams 1 at the sources' router: a second origin session is
    refused (counted) while the first runs, and its proxy gets no data."""
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n, a={"ru_max_streams": 1})
        src1, _ = await ru_live_source(n, trd1)
        src2, _ = await ru_live_source(n, trd1, topic="md.routed.2")
        tir1 = await resolve(udp("127.0.2.9"), trd2)
        tir2 = await resolve(udp("127.0.2.9"), trd2, topic="md.routed.2")
        first = ru_receiver(tir1, 0, 4000)
        await n.start(first.run)
        await trio.sleep(0.3)
        r2 = await ru_receiver(tir2, 1, 10, idle_timeout=2.0).run()
        assert r2.messages == 0 and "stalled" in r2.error, r2
        assert ra.counters["lbtru_upstreams_full"] >= 1 and len(src2.clients) == 0
        with trio.fail_after(10):
            while not first.result.done:
                await trio.sleep(0.1)
        assert first.result.ok and len(src1.clients) == 1, first.result
        n.cancel_scope.cancel()
