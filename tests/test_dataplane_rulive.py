"""lbmr_tools.sim.dataplane.rulive: the live UM LBT-RU source (one session of
LBMC messages for all receivers, on a clock, never replayed) and its
verifying receiver, on loopback; tshark judges a capture of a session.

Transfers run on the real clock (bounded); the source's clock with no
receiver, and a silent receiver's expiry, on trio's virtual clock."""

from __future__ import annotations

import socket

import trio

from lbmr_proto import lbmc
from lbmr_proto import lbtru as RU
from lbmr_proto.capture import write_udp_pcap
from lbmr_tools.sim.dataplane import RuLiveReceiver, RuLiveSource, live_ru_payload, message_payload
from tests.helpers import LO, RU_CHAT, udp_forwarder

from .tshark_judge import compare_lbmc, tshark_frames


def _udp() -> trio.socket.SocketType:
    return trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)


async def _connect(sock, addr) -> RU.SessionMessage:
    """CREQ from ``sock`` until the SM with SYN answers."""
    while True:
        await sock.sendto(RU.encode_creq(), addr)
        with trio.move_on_after(0.2):
            while True:
                msg = RU.decode((await sock.recvfrom(65536))[0])
                if isinstance(msg, RU.SessionMessage) and msg.syn:
                    return msg


def test_datagram_layout():
    src = RuLiveSource(seed=7, tidx=0x1234, session_id=0xABCD, datagram_size=200)
    d = RU.decode(src._datagram(5))
    assert len(src._datagram(5)) == 200 and (d.sqn, d.header.session_id) == (5, 0xABCD)
    m = lbmc.decode(d.payload)
    assert (m.kind, m.tidx, m.sqn) == (lbmc.MESSAGE, 0x1234, 5)
    assert m.payload == message_payload(7, 5, live_ru_payload(200)) == message_payload(7, 5, 200 - 32)


async def test_receivers_joining_at_different_times_share_one_live_session():
    async with trio.open_nursery() as nursery:
        src = RuLiveSource(LO, 0, seed=3, tidx=77, session_id=9, rate=4000, datagram_size=600)
        ip, port = await nursery.start(src.serve)
        early = RuLiveReceiver(ip, port, expect_count=400, seed=3, tidx=77, session_id=9)
        late = RuLiveReceiver(ip, port, expect_count=100, seed=3, tidx=77)

        async def join_late():
            while src.next_sqn < 150:  # the clock starts with the early receiver
                await trio.sleep(0.01)
            await late.run()

        async with trio.open_nursery() as rx:
            rx.start_soon(early.run)
            rx.start_soon(join_late)
        nursery.cancel_scope.cancel()
    e, lt = early.result, late.result
    assert e.ok and lt.ok, (e, lt)
    assert (e.messages, lt.messages) == (400, 100) and e.bytes_received == 400 * (600 - 32)
    assert e.last_sqn - e.first_sqn == 399 and lt.last_sqn - lt.first_sqn == 99
    # never replayed from 0: the late receiver starts where the session is
    assert lt.first_sqn > e.first_sqn and lt.first_sqn >= 100 and lt.first_sqn <= e.last_sqn
    assert [c.first_sqn for c in src.clients.values()] == [e.first_sqn, lt.first_sqn]
    assert [c.client_id for c in src.clients.values()] == [e.client_id, lt.client_id] == [1, 2]
    assert e.acks_sent >= 1 and src.counters["acks"] >= 1


async def test_with_no_receiver_the_clock_stops(autojump_clock):
    async with trio.open_nursery() as nursery:
        src = RuLiveSource(LO, 0, seed=1, rate=1000, datagram_size=100)
        ip, port = await nursery.start(src.serve)
        await trio.sleep(2.0)
        assert src.dropped == 0 and src.next_sqn == 0  # a source without receivers costs nothing
        r = await RuLiveReceiver(ip, port, expect_count=10, seed=1).run()
        nursery.cancel_scope.cancel()
    assert r.ok and r.first_sqn == 0 and r.messages == 10
    assert next(iter(src.clients.values())).first_sqn == r.first_sqn


async def test_the_session_ends_with_the_source_and_receivers_are_told():
    async with trio.open_nursery() as nursery:
        src = RuLiveSource(LO, 0, seed=2, rate=2000, datagram_size=100, max_messages=300)
        ip, port = await nursery.start(src.serve)
        r = await RuLiveReceiver(ip, port, expect_count=10_000, seed=2).run()
        nursery.cancel_scope.cancel()
    assert r.reset and not r.ok and r.messages == 300  # the clock waited for the receiver
    assert r.error == f"the source ended the session after {r.messages} of 10000 messages"
    assert src.counters["rsts"] == 1 and r.last_sqn == 299


async def test_a_lost_datagram_is_a_gap():
    async with trio.open_nursery() as nursery:
        src = RuLiveSource(LO, 0, seed=4, rate=3000, datagram_size=300)
        addr = await nursery.start(src.serve)
        seen = []

        def drop(data: bytes) -> bool:
            msg = RU.decode(data)
            seen.append(msg)
            return isinstance(msg, RU.Data) and sum(isinstance(m, RU.Data) for m in seen) == 20

        front = await nursery.start(lambda task_status: udp_forwarder(addr, drop=drop, task_status=task_status))
        r = await RuLiveReceiver(*front, expect_count=100, seed=4).run()
        nursery.cancel_scope.cancel()
    assert not r.ok and r.messages == 19
    assert r.error == f"sequence {r.first_sqn + 20} after {r.first_sqn + 18}: a gap"


async def test_naks_get_retransmissions_in_the_window_and_an_ncf_beyond():
    async with trio.open_nursery() as nursery:
        src = RuLiveSource(LO, 0, seed=5, session_id=3, rate=2000, datagram_size=100, retransmit_window=50)
        addr = await nursery.start(src.serve)
        with _udp() as s:
            await s.bind((LO, 0))
            sm = await _connect(s, addr)
            assert sm.header.client_id == 1 and sm.header.session_id == 3
            while src.next_sqn < 200:
                await trio.sleep(0.01)
            top = src.next_sqn
            await s.sendto(RU.encode_nak([top - 10, 5], session_id=3, client_id=1), addr)
            got = []
            with trio.fail_after(5):
                while len(got) < 2:
                    msg = RU.decode((await s.recvfrom(65536))[0])
                    if isinstance(msg, RU.Ncf) or (isinstance(msg, RU.Data) and msg.retransmission):
                        got.append(msg)
        nursery.cancel_scope.cancel()
    data, ncf = sorted(got, key=lambda m: isinstance(m, RU.Ncf))
    assert data.sqn == top - 10 and lbmc.decode(data.payload).payload == message_payload(5, top - 10, 68)
    assert ncf.sqns == (5,) and ncf.reason == RU.NCF_NO_RETRY and ncf.header.client_id == 1
    (c,) = src.clients.values()
    assert (c.naks, c.retransmitted, c.not_retransmitted) == (1, 1, 1)


async def test_hostile_datagrams_are_counted_and_a_silent_receiver_is_forgotten(autojump_clock):
    async with trio.open_nursery() as nursery:
        src = RuLiveSource(LO, 0, seed=6, rate=100, datagram_size=100, client_timeout=10.0, max_clients=1)
        addr = await nursery.start(src.serve)
        with _udp() as s, _udp() as other:
            await s.bind((LO, 0))
            await other.bind((LO, 0))
            await s.sendto(b"\x99junk", addr)  # version 9
            await s.sendto(b"", addr)
            await other.sendto(RU.encode_ack(3), addr)  # an ACK from no receiver
            await _connect(s, addr)
            await other.sendto(RU.encode_creq(), addr)  # one receiver too many
            await trio.sleep(1.0)
            assert src.counters["malformed"] == 2 and src.counters["unknown_client"] == 1
            assert src.refused >= 1 and len(src.clients) == 1
            await trio.sleep(10.0)  # silent: no ACK, NAK or CREQ
            assert not src._live and next(iter(src.clients.values())).finished is not None
            await _connect(other, addr)  # room again
        nursery.cancel_scope.cancel()
    assert len(src.clients) == 2


async def test_tshark_decodes_a_session_as_lbtru_with_lbmc_inside_and_no_expert(tmp_path):
    log: list = []
    async with trio.open_nursery() as nursery:
        src = RuLiveSource(LO, 0, seed=10, tidx=5, session_id=0x5E55, rate=3000, datagram_size=400)
        ip, port = await nursery.start(src.serve)
        front = await nursery.start(lambda task_status: udp_forwarder((ip, port), log=log, task_status=task_status))
        r = await RuLiveReceiver(*front, expect_count=40, seed=10, tidx=5, session_id=0x5E55,
                                 ack_interval=0.005).run()
        nursery.cancel_scope.cancel()
    assert r.ok, r
    rcv = (LO, 14360)  # the capture shows the receiver talking straight to the source
    dgs = [(i * 0.001, *(rcv if up else (ip, port)), *((ip, port) if up else rcv), data)
           for i, (up, _, data) in enumerate(log)]
    pcap = tmp_path / "sim-lbtru.pcap"
    write_udp_pcap(pcap, dgs)
    frames = list(tshark_frames(pcap, f"udp.port=={port},lbtru"))
    assert len(frames) == len(log) and [(n, e, m) for n, _, e, m in frames if set(e) - RU_CHAT or m] == []
    types = [RU.decode(d) for _, _, d in log]
    assert {type(t).__name__ for t in types} >= {"Creq", "SessionMessage", "Data", "Ack"}
    data = [(layers, t) for (_, layers, _, _), t in zip(frames, types, strict=True) if isinstance(t, RU.Data)]
    assert len(data) >= 40 and all("lbtru" in layers for layers, _ in data)
    for layers, t in data:
        assert compare_lbmc(layers["lbmc"], lbmc.decode(t.payload)) == []


async def test_a_churn_of_receivers_keeps_a_bounded_history(autojump_clock):
    """Receivers that connect and go silent, over and over: at most
    max_clients live, at most four times as many remembered."""
    async with trio.open_nursery() as nursery:
        src = RuLiveSource(LO, 0, seed=8, rate=10, datagram_size=100, client_timeout=1.0, max_clients=2)
        addr = await nursery.start(src.serve)
        for _ in range(10):
            socks = [_udp() for _ in range(2)]
            for s in socks:
                await s.bind((LO, 0))
                await _connect(s, addr)
            await trio.sleep(1.5)  # silent: both forgotten at the next tick
            for s in socks:
                s.close()
        nursery.cancel_scope.cancel()
    assert len(src.clients) <= 8 and not src.refused
    assert max(c.client_id for c in src.clients.values()) == 20
