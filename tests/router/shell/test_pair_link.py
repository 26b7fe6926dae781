"""Two endpoint portals of one router (an endpoint pair): the sessions relayed
between them cross in memory (router.shell.pair_link), not over a socket. One
router, TRD1 and TRD2 on 127.0.0.1 addresses; lbmr-sim's live TCP source in
TRD1, its receivers in TRD2."""

from __future__ import annotations

import os
import stat

import pytest
import trio

from router.config.model import acceptor_peer, initiator_peer, lbmrd_endpoint, router_config
from router.link import StreamState
from router.peerlink import streams as S
from router.shell.pair_link import pair_links
from router.shell.router import MultiRouter
from tests.router.helpers import TCP_SID, resolve, start_lbmrd, tcp_live_source, tcp_receiver, udp


def _sockets() -> set[int]:
    """The socket inodes this process has open."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            st = os.stat(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if stat.S_ISSOCK(st.st_mode):
            out.add(st.st_ino)
    return out


def _unix_inodes() -> set[int]:
    with open("/proc/net/unix") as f:
        next(f)
        return {int(line.split()[6]) for line in f if len(line.split()) > 6}


async def start_router(n, **endpoint) -> tuple[MultiRouter, tuple, tuple]:
    _, trd1 = await start_lbmrd(n, "127.0.1.1")
    _, trd2 = await start_lbmrd(n, "127.0.2.1")
    r = MultiRouter(router_config("pair", [lbmrd_endpoint("T1", 1, [trd1], interface="127.0.1.1", **endpoint),
                                           lbmrd_endpoint("T2", 2, [trd2], interface="127.0.2.1", **endpoint)]))
    await n.start(r.run)
    return r, trd1, trd2


@pytest.mark.parametrize("fanout", [True, False])
async def test_sessions_cross_an_endpoint_pair_in_memory(fanout):
    """Ten receivers in TRD2 of a source in TRD1, through one router: every
    receiver gets whole consecutive messages from its join point and the
    session's TCP_SID first; with fan-out the router holds one connection to
    the origin (with fanout="off", one per receiver); the pair's sides passed
    the frames, and the router opened no Unix socket (no socket pair)."""
    async with trio.open_nursery() as n:
        before = _sockets()
        r, trd1, trd2 = await start_router(n, fanout=fanout)
        unix = _sockets() - before & _unix_inodes()
        assert not unix, f"the router opened Unix sockets {unix}"
        src, src_scope = await tcp_live_source(n, trd1, rate=2000, message_size=1000)
        tir = await resolve(udp("127.0.2.9"), trd2)
        results = []

        async def run(rx, task_status):
            results.append(await rx.run(task_status=task_status))

        async with trio.open_nursery() as rn:
            for k in range(10):
                await rn.start(run, tcp_receiver(tir, k))
            await trio.sleep(2)
            src_scope.cancel()
        assert len(results) == 10
        for res in results:
            assert res.error is None and res.eof and res.messages > 500, res
            assert res.session_id == TCP_SID
        assert len(src.connections) == (1 if fanout else 10)
        t1, t2 = r.status()["portals"]
        pair = next(lk for lk in t2["links"] if lk["name"] == "T1<->T2")
        assert pair["state"] == "CONNECTED"
        n.cancel_scope.cancel()


async def start_three_trds(n) -> tuple[MultiRouter, trio.CancelScope, dict[int, tuple]]:
    """Router 1 with endpoints in TRD1 and TRD2 and a peer link to router 3
    (TRD3), whose scope, cancelled, takes router 3 away. (r1, r3's scope,
    domain -> lbmrd address)."""
    trds = {d: (await start_lbmrd(n, f"127.0.{d}.1"))[1] for d in (1, 2, 3)}
    r3 = MultiRouter(router_config("r3", [lbmrd_endpoint("T3", 3, [trds[3]], interface="127.0.3.1")],
                                   [acceptor_peer("3-1", 0, interface="127.0.0.1")]))
    r3_scope = trio.CancelScope()

    async def run_r3(task_status):
        with r3_scope:
            await r3.run(task_status=task_status)

    p31 = (await n.start(run_r3))["links"][0]["peer"]
    r1 = MultiRouter(router_config("r1", [lbmrd_endpoint("T1", 1, [trds[1]], interface="127.0.1.1"),
                                          lbmrd_endpoint("T2", 2, [trds[2]], interface="127.0.2.1")],
                                   [initiator_peer("1-3", *p31)]))
    await n.start(r1.run)
    return r1, r3_scope, trds


async def test_a_pair_and_a_peer_link_share_the_origin_connection():
    """Router 1 joins TRD1 and TRD2 and peers with router 3 (TRD3): receivers in
    TRD2 (through the pair) and TRD3 (through the peer link) of one source in
    TRD1 get whole messages, and router 1 holds one connection to the origin."""
    async with trio.open_nursery() as n:
        _, _, trds = await start_three_trds(n)
        src, _ = await tcp_live_source(n, trds[1], rate=2000, message_size=1000)
        tirs = [await resolve(udp("127.0.2.9"), trds[2]), await resolve(udp("127.0.3.9"), trds[3])]
        res = []

        async def run(rx, task_status):
            res.append(await rx.run(task_status=task_status))

        async with trio.open_nursery() as rn:
            for k in range(4):
                await rn.start(run, tcp_receiver(tirs[k % 2], k, max_bytes=300_000))
        assert [x.error for x in res] == [None] * 4 and all(x.messages >= 250 for x in res), res
        assert len(src.connections) == 1
        n.cancel_scope.cancel()


async def test_a_session_outlives_the_link_whose_stream_opened_it():
    """A receiver in TRD3 (through the peer link to router 3) makes router 1
    connect to the origin; a receiver in TRD2 (through the pair) joins that
    session; router 3 then goes away: the TRD2 receiver's session goes on."""
    async with trio.open_nursery() as n:
        _, r3_scope, trds = await start_three_trds(n)
        trd1, trd2, trd3 = trds[1], trds[2], trds[3]
        src, _ = await tcp_live_source(n, trd1, rate=500, message_size=1000)
        tir3 = await resolve(udp("127.0.3.9"), trd3)
        tir2 = await resolve(udp("127.0.2.9"), trd2)
        res = {}

        async def run(name, rx, task_status):
            res[name] = await rx.run(task_status=task_status)

        async with trio.open_nursery() as rn:
            await rn.start(run, "trd3", tcp_receiver(tir3, 0))
            with trio.fail_after(5):
                while not src.connections:
                    await trio.sleep(0.05)
            await trio.sleep(0.3)
            await rn.start(run, "trd2", tcp_receiver(tir2, 1, max_bytes=1_000_000))
            await trio.sleep(0.3)
            r3_scope.cancel()
        assert res["trd2"].error is None and res["trd2"].stream_bytes >= 1_000_000, res["trd2"]
        assert len(src.connections) == 1
        n.cancel_scope.cancel()


async def test_pair_link_frames_and_datagrams_cross_by_reference():
    """The sans-IO view of a pair: a stream opened on one side is an event on
    the other, its data and datagrams arrive as the very objects sent (no
    copy), and the queue's space is back once the other side took them."""
    a, b = pair_links("x", "x", 1 << 20, 1 << 20)
    sid = a.streams.open(7, S.StreamKind.LBTRU)
    a.flush_streams()
    (opened,) = await b.receive()
    (ev,) = b.streams.receive(opened)
    assert isinstance(ev, S.StreamOpened) and ev.advert_id == 7
    b.streams.accept(sid)
    b.flush_streams()
    for f in await a.receive():
        a.streams.receive(f)
    st = b.state[sid] = StreamState(sid, S.StreamKind.LBTRU)
    payload = b"x" * 1000
    a.streams.send_datagrams(sid, [payload, payload])
    a.flush_streams()
    assert a.outq.data_space() < 1 << 20
    assert await b.receive() == []
    assert list(st.incoming) == [payload, payload] and st.incoming[0] is payload
    assert a.outq.data_space() == 1 << 20


async def test_an_overflowing_pair_ends_with_a_log_not_a_crash(caplog):
    """Both sides end: the other side's reader returns instead of waiting forever."""
    a, b = pair_links("x", "x", 1 << 20, 1 << 20)
    a.outq.max_control = 3
    for k in range(4):
        a.streams.open(k + 1)
    a.flush_streams()
    assert a.closed and "relays no more sessions" in caplog.text
    assert b.ended
    with trio.fail_after(1):
        got = await b.receive()  # what a queued before it overflowed, then nothing more
        a.down()
        assert await b.receive() == [] and await a.receive() == []
    assert len(got) == 3


async def test_an_lbtru_session_crosses_an_endpoint_pair_once():
    """lbmr-sim's live LBT-RU source in TRD1, ten receivers in TRD2 of one
    router: every receiver gets whole consecutive messages, the origin has one
    client (the router's upstream receiver), and the session crossed the pair
    as one stream whose datagrams the pair's side passed."""
    from tests.router.helpers import ru_live_source as ru_source
    from tests.router.helpers import ru_receiver, run_all

    async with trio.open_nursery() as n:
        r, trd1, trd2 = await start_router(n)
        src, _ = await ru_source(n, trd1)
        tir = await resolve(udp("127.0.2.9"), trd2)
        assert tir.transport.NAME == "LBTRU"
        side = next(u for u in r.links if u.link_id == "T1<->T2@T1").link
        sent0 = side.datagrams_sent
        results = await run_all([ru_receiver(tir, k, 2000) for k in range(10)])
        sent = side.datagrams_sent - sent0
        one = max(res.datagrams for res in results)
        print(f"pair: {sent} datagrams across, one receiver {one}")
        assert one <= sent < 2 * one  # once for ten receivers
        for res in results:
            assert res.ok and res.messages == 2000 and res.foreign == 0, res
        assert len(src.clients) == 1
        n.cancel_scope.cancel()
