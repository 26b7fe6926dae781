"""lbmr_tools.sim.dataplane.tcp: the live LBT-TCP source (one LBMC stream for
all receivers, on a clock, never replayed) and its verifying receiver, on
loopback; tshark judges a receiver's capture of the stream.

Transfers run on the real clock (bounded); the source's clock with no
receiver runs on trio's virtual clock."""

from __future__ import annotations

import socket

import trio

from lbmr_proto import lbmc, lbmc_stream
from lbmr_tools.sim.dataplane import TcpDataReceiver, TcpDataSource, data_message, message_payload
from tests.helpers import tcp_proxy

from .tshark_judge import compare_lbmc, run_tshark_lbmc, segments, write_lbttcp_pcap

LO = "127.0.0.1"
KiB = 1024


async def _relay(proxy, upstream, task_status, **kw) -> None:
    """Run a test proxy; the receiver hanging up on the (endless) live stream ends it."""
    try:
        await proxy(upstream, task_status=task_status, **kw)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


def test_message_layout():
    m = lbmc.decode(data_message(7, 0x1234, 5, 100))
    assert (m.kind, m.tidx, m.sqn, m.headers) == (lbmc.MESSAGE, 0x1234, 5, ())
    assert m.payload == message_payload(7, 5, 100) and m.payload[:8] == (5 * 65536).to_bytes(8, "big")
    assert lbmc.decode(data_message(7, 1, 2**32 + 3, 10)).sqn == 3  # wraps like the wire field


async def test_receivers_joining_at_different_times_share_one_live_stream():
    async with trio.open_nursery() as nursery:
        src = TcpDataSource(LO, 0, seed=3, tidx=77, rate=4000, message_size=4 * KiB)
        ip, port = await nursery.start(src.serve)
        early = TcpDataReceiver(ip, port, 400 * 4 * KiB, 3, tidx=77)
        late = TcpDataReceiver(ip, port, 100 * 4 * KiB, 3, tidx=77)

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
    assert (e.messages, lt.messages) == (400, 100)
    assert e.last_sqn - e.first_sqn == 399 and lt.last_sqn - lt.first_sqn == 99
    # never replayed from 0: the late receiver starts where the stream is
    assert lt.first_sqn > e.first_sqn and lt.first_sqn >= 100
    assert lt.first_sqn <= e.last_sqn  # and both got the same messages meanwhile
    assert [c.first_sqn for c in src.connections] == [e.first_sqn, lt.first_sqn]


async def test_with_no_receiver_the_clock_stops(autojump_clock):
    async with trio.open_nursery() as nursery:
        src = TcpDataSource(LO, 0, seed=1, rate=1000, message_size=100)
        ip, port = await nursery.start(src.serve)
        await trio.sleep(2.0)
        assert src.dropped == 0 and src.next_sqn == 0  # a source without receivers costs nothing
        r = await TcpDataReceiver(ip, port, 1000, 1).run()
        nursery.cancel_scope.cancel()
    assert r.ok and r.first_sqn == 0 and r.messages == 10
    assert src.connections[0].first_sqn == r.first_sqn


async def test_a_session_id_comes_first_as_a_control_message():
    async with trio.open_nursery() as nursery:
        src = TcpDataSource(LO, 0, seed=2, session_id=0xC0FFEE, rate=5000, message_size=500)
        ip, port = await nursery.start(src.serve)
        r = await TcpDataReceiver(ip, port, 5000, 2).run()
        nursery.cancel_scope.cancel()
    assert r.ok and r.session_id == 0xC0FFEE and r.control_messages == 1 and r.messages == 10


async def test_a_flipped_byte_and_a_cut_are_reported():
    async with trio.open_nursery() as nursery:
        src = TcpDataSource(LO, 0, seed=4, rate=20000, message_size=1000)
        upstream = await nursery.start(src.serve)
        flip = await nursery.start(lambda task_status: _relay(tcp_proxy, upstream, task_status,
                                                              flip_at=5 * 1012 + 100))
        flipped = await TcpDataReceiver(*flip, 50_000, 4).run()
        cut = await nursery.start(lambda task_status: _relay(tcp_proxy, upstream, task_status,
                                                             cut_at=3 * 1012 + 500))
        cutr = await TcpDataReceiver(*cut, 50_000, 4).run()
        nursery.cancel_scope.cancel()
    assert not flipped.ok and flipped.messages == 5
    assert flipped.error == f"payload of sequence {flipped.first_sqn + 5} (1000 bytes) is not the stream's"
    assert not cutr.ok and cutr.eof and cutr.messages == 3
    assert cutr.error == "truncated: the stream ended after 3000 of 50000 payload bytes"


async def _one_connection(upstream, task_status) -> tuple[trio.SocketStream, trio.SocketStream]:
    """Listen, report the address, accept one client and connect it upstream: (client, server)."""
    (listener,) = await trio.open_tcp_listeners(0, host=LO)
    async with listener:
        task_status.started(listener.socket.getsockname()[:2])
        client = await listener.accept()
    return client, await trio.open_tcp_stream(*upstream)


async def _skipping_proxy(upstream, skip: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Relay one connection, dropping the first ``skip`` bytes downstream."""
    client, server = await _one_connection(upstream, task_status)
    async with client, server:
        while data := await server.receive_some(65536):
            cut = min(skip, len(data))
            skip -= cut
            if data[cut:]:
                await client.send_all(data[cut:])


async def test_a_stream_joined_inside_a_message_is_refused():
    async with trio.open_nursery() as nursery:
        src = TcpDataSource(LO, 0, seed=5, rate=20000, message_size=1000)
        upstream = await nursery.start(src.serve)
        proxy = await nursery.start(lambda task_status: _relay(_skipping_proxy, upstream, task_status, skip=30))
        r = await TcpDataReceiver(*proxy, 10_000, 5).run()
        nursery.cancel_scope.cancel()
    assert not r.ok and r.messages == 0 and r.error.startswith("not an LBMC stream: offset 0:")


async def test_a_gap_is_reported():
    """A relay that loses one whole message: the sequence numbers say so."""
    async with trio.open_nursery() as nursery:
        src = TcpDataSource(LO, 0, seed=6, rate=20000, message_size=988)
        upstream = await nursery.start(src.serve)
        proxy = await nursery.start(lambda task_status: _relay(_dropping_proxy, upstream, task_status, nth=3))
        r = await TcpDataReceiver(*proxy, 20_000, 6).run()
        nursery.cancel_scope.cancel()
    assert not r.ok and r.messages == 3
    assert r.error == f"sequence {r.first_sqn + 4} after {r.first_sqn + 2}: a gap"


async def _dropping_proxy(upstream, nth: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Relay one connection message by message, dropping the ``nth`` (0-based)."""
    client, server = await _one_connection(upstream, task_status)
    framer, i = lbmc_stream.StreamFramer(), 0
    async with client, server:
        while data := await server.receive_some(65536):
            for m in framer.feed(data):
                if i != nth:
                    await client.send_all(m)
                i += 1


async def test_a_receiver_that_never_reads_is_cut_off_and_the_others_go_on():
    async with trio.open_nursery() as nursery:
        src = TcpDataSource(LO, 0, seed=7, rate=2000, message_size=16 * KiB, stall_timeout=0.5)
        ip, port = await nursery.start(src.serve)
        with socket.create_connection((ip, port)) as stuck:
            stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            r = await TcpDataReceiver(ip, port, 2000 * 16 * KiB, 7, timeout=20).run()
        nursery.cancel_scope.cancel()
    assert r.ok and r.messages == 2000
    stuck_stats = src.connections[0]
    assert stuck_stats.error == "stalled: a batch not taken in 0.5 s"


async def test_control_from_a_receiver_is_counted_and_garbage_closes_it():
    async with trio.open_nursery() as nursery:
        src = TcpDataSource(LO, 0, seed=8, rate=100, message_size=10)
        ip, port = await nursery.start(src.serve)
        ssf = lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(lbmc.SsfInitHeader(0x40, 0, 1, 2, 3, 0, LO),)))
        good = await trio.open_tcp_stream(ip, port)
        bad = await trio.open_tcp_stream(ip, port)
        async with good, bad:
            await good.send_all(ssf * 3)
            await bad.send_all(b"\xf0\xff\x00\x04")  # version 15
            for _ in range(200):
                if src.connections[0].control_received == 3 and src.connections[1].error:
                    break
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()  # before closing "good": the source must not see it go
    assert src.connections[0].control_received == 3 and src.connections[0].error is None
    assert src.connections[1].error.startswith("malformed message from the receiver: offset 0: LBMC version 15")


async def test_the_source_ends_after_max_messages():
    async with trio.open_nursery() as nursery:
        src = TcpDataSource(LO, 0, seed=9, rate=1000, message_size=10, max_messages=50)
        ip, port = await nursery.start(src.serve)
        r = await TcpDataReceiver(ip, port, None, 9).run()
    assert r.eof and r.ok and r.last_sqn == 49 and r.messages == 50 - r.first_sqn
    assert src.next_sqn == 50


async def test_tshark_decodes_a_receivers_capture_with_no_expert(tmp_path):
    """The bytes one receiver got, cut into segments at message boundaries
    (the dissector's need, see tests/tshark_judge.py), decode message by
    message as lbmr_proto does, with no expert info."""
    async with trio.open_nursery() as nursery:
        src = TcpDataSource(LO, 0, seed=10, tidx=5, session_id=99, rate=5000, message_size=700)
        ip, port = await nursery.start(src.serve)
        stream = await trio.open_tcp_stream(ip, port)
        got = bytearray()
        framer = lbmc_stream.StreamFramer()
        msgs: list[bytes] = []
        async with stream:
            while len(msgs) < 40:
                data = await stream.receive_some(65536)
                got += data
                msgs += framer.feed(data)
        nursery.cancel_scope.cancel()
    msgs = msgs[:40]
    pcap = tmp_path / "sim-tcp.pcap"
    write_lbttcp_pcap(pcap, [(True, s) for s in segments(msgs)], source=(ip, port))
    frames = run_tshark_lbmc(pcap, port=port)
    layers = [layer for f in frames for layer in f.lbmc]
    assert len(layers) == 40 and not any(f.flagged for f in frames)
    assert [compare_lbmc(layer, lbmc.decode(m)) for layer, m in zip(layers, msgs, strict=True)] == [[]] * 40
    assert lbmc.decode(msgs[0]).header(lbmc.TcpSidHeader).session_id == 99
