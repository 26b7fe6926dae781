"""lbmr_tools.sim.dataplane: the numbered data pattern, the TCP and LBT-RU-like
data endpoints on loopback (through test proxies that corrupt, cut, drop,
duplicate and reorder), and lbmr-sim serving and verifying data against a
real lbmrd.

Bulk data runs on the real clock; only tests where no transfer timing
matters use autojump_clock."""

from __future__ import annotations

import hashlib
import json
import random
import socket
import time
from collections import Counter

import click
import pytest
import trio

from lbmr_tools import sim
from lbmr_tools.sim import SimConfig, parse_args, render, run_sim
from lbmr_tools.sim import dataplane as dp
from lbmr_tools.sim.dataplane import (
    Pattern,
    RuDataReceiver,
    RuDataSource,
    TcpByteReceiver,
    TcpByteSource,
    pattern,
    topic_seed,
)
from lbmrd.server import Daemon, Settings
from tests.helpers import LO, tcp_proxy

MiB = 1 << 20


def reference_byte(seed: int, o: int, _cache={}) -> int:  # noqa: B006 - a deliberate memo
    """The module docstring's definition, byte by byte."""
    if seed not in _cache:
        _cache[seed] = hashlib.shake_128(b"lbmr-dataplane/1" + seed.to_bytes(8, "big")).digest(1048573)
    if o % 4096 < 8:
        return (o - o % 4096).to_bytes(8, "big")[o % 4096]
    return _cache[seed][o % 1048573]


# ------------------------------------------------------------------ pattern


def test_pattern_is_the_documented_definition():
    rng = random.Random(1)
    p = Pattern(42)
    for _ in range(200):
        off = rng.choice([0, 4093, rng.randrange(1 << 40), rng.randrange(3 * 1048573)])
        n = rng.choice([0, 1, 7, 8, 9, 4095, 4097, 65536, 1048573 + 5, 2 * 1048573 + 9])
        got = p.bytes_at(off, n)
        assert len(got) == n
        idx = set(range(min(n, 20))) | set(range(max(0, n - 20), n))
        idx |= {rng.randrange(n) for _ in range(40)} if n else set()
        first = off - off % 4096
        idx |= {b - off + k for b in range(first, min(off + n, first + 40_000), 4096) for k in range(8)
                if 0 <= b - off + k < n}
        for i in idx:
            assert got[i] == reference_byte(42, off + i), (off, n, i)
    # every 4 KiB block starts with its own offset
    assert p.bytes_at(0, 8) == bytes(8)
    assert p.bytes_at(4096 * 7, 8) == (4096 * 7).to_bytes(8, "big")
    assert p.bytes_at(8, 100) != Pattern(43).bytes_at(8, 100)


def test_pattern_windows_agree_wherever_they_are_cut():
    p = pattern(7)
    whole = p.bytes_at(10_000, 300_000)
    rng = random.Random(2)
    for _ in range(100):
        a = rng.randrange(300_000)
        n = rng.randrange(300_000 - a + 1)
        assert p.bytes_at(10_000 + a, n) == whole[a:a + n]


def test_pattern_generation_is_fast():
    p = pattern(3)
    t = time.perf_counter()
    off = 0
    while off < 256 * MiB:
        p.bytes_at(off, 65536)
        off += 65536
    gen = off / (time.perf_counter() - t)
    t = time.perf_counter()
    off = 0
    block = bytes(p.bytes_at(0, 262144))
    while off < 128 * MiB:
        assert p.check(0, block) is None  # generate + compare, as a receiver does
        off += len(block)
    check = off / (time.perf_counter() - t)
    print(f"pattern generation {gen / 1e6:.0f} MB/s, generate+verify {check / 1e6:.0f} MB/s")
    assert gen > 500e6 and check > 500e6


def test_check_finds_the_first_difference():
    p = pattern(9)
    data = p.bytes_at(5000, 100_000)
    assert p.check(5000, data) is None
    for i in (0, 1, 63, 64, 65, 4095, 50_000, 99_999):
        bad = bytearray(data)
        bad[i] ^= 0x40
        bad[-1] ^= 0x01  # a later difference does not matter
        assert p.check(5000, bad) == i
    assert dp.first_difference(b"abc", b"abcd") == 3


def test_topic_seed_is_stable_and_distinct():
    assert topic_seed("md.0") == topic_seed(b"md.0") == topic_seed("md.0", 0)
    assert topic_seed("md.0") != topic_seed("md.1") != topic_seed("md.1", 1)
    assert 0 <= topic_seed("x", (1 << 64) - 1) < 1 << 64
    with pytest.raises(ValueError):
        topic_seed("x", -1)
    with pytest.raises(ValueError):
        Pattern(1 << 64)


def test_ru_datagram_layouts():
    p = pattern(5)
    assert dp.encode_hello(5) == b"RU-HELLO" + (5).to_bytes(8, "big")
    d = dp.encode_data(p, 3, 100)
    assert len(d) == 100 and d[:7] == b"RU-DATA" and d[7:15] == (3).to_bytes(8, "big")
    assert d[15:17] == (83).to_bytes(2, "big") and d[17:25] == (3 * 65536).to_bytes(8, "big")
    assert dp.encode_end(9) == b"RU-END" + (9).to_bytes(8, "big")
    st = dp.encode_status(None, 0, True)
    assert len(st) == 26 and st[9:17] == b"\xff" * 8 and st[-1] == 1
    assert dp.parse_datagram(d)[:3] == ("data", 3, 83)
    assert dp.parse_datagram(dp.encode_status(4, 5, False)) == ("status", 4, 5, 0)
    assert dp.parse_datagram(dp.encode_end(9)) == ("end", 9)
    assert dp.parse_datagram(dp.encode_hello(1)) == ("hello", 1)
    for junk in (b"", b"RU-DA", b"RU-HELLO", b"RU-END" + bytes(9), b"hello"):
        assert dp.parse_datagram(junk) == ("malformed",)


# --------------------------------------------------------------- test proxies


class UdpProxy:
    """A two-way UDP relay for one receiver: ``front`` faces the receiver,
    ``back`` the source. ``down(data)`` maps each source datagram to the
    list sent on (drop, duplicate, corrupt, hold back), ``up(data)`` decides
    whether a receiver datagram goes on."""

    def __init__(self, upstream, down=None, up=None) -> None:
        self.upstream = upstream
        self.down = down or (lambda d: [d])
        self.up = up or (lambda d: True)
        self.client = None
        self.counts = {"up": 0, "up_dropped": 0, "down_in": 0, "down_out": 0}

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        front = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        back = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with front, back:
            await front.bind((LO, 0))
            await back.bind((LO, 0))
            for s in (front, back):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MiB)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._up, front, back)
                nursery.start_soon(self._down, front, back)
                task_status.started(front.getsockname()[:2])

    async def _up(self, front, back) -> None:
        while True:
            data, src = await front.recvfrom(65536)
            self.client = src
            if self.up(data):
                self.counts["up"] += 1
                await back.sendto(data, self.upstream)
            else:
                self.counts["up_dropped"] += 1

    async def _down(self, front, back) -> None:
        while True:
            data, _ = await back.recvfrom(65536)
            self.counts["down_in"] += 1
            for d in self.down(data):
                self.counts["down_out"] += 1
                await front.sendto(d, self.client)


def seq_of(data: bytes) -> int | None:
    m = dp.parse_datagram(data)
    return m[1] if m[0] == "data" else None


# ---------------------------------------------------------------------- TCP, raw bytes
# (the byte-offset endpoints of .tcpbytes; the live LBMC stream: tests/test_dataplane_tcp.py)


async def test_tcp_100_mib_arrive_byte_exact():
    total = 100 * MiB
    async with trio.open_nursery() as nursery:
        src = TcpByteSource(LO, 0, total_bytes=total, seed=11, max_connections=1)
        ip, port = await nursery.start(src.serve)
        t = time.perf_counter()
        r = await TcpByteReceiver(ip, port, total, 11).run()
        wall = time.perf_counter() - t
    print(f"TCP 100 MiB in {wall:.3f} s: {r.bytes_per_s / 1e6:.0f} MB/s")
    assert r.ok and r.exact and r.eof and r.error is None and r.first_mismatch is None
    assert r.bytes_received == total
    (conn,) = src.connections
    assert conn.complete and conn.bytes_sent == total and conn.error is None
    assert wall < 5.0


async def test_tcp_flipped_byte_is_reported_at_its_offset():
    total, flip = 8 * MiB, 3_000_123
    async with trio.open_nursery() as nursery:
        src = TcpByteSource(LO, 0, total_bytes=total, seed=2)
        upstream = await nursery.start(src.serve)
        proxy = await nursery.start(lambda task_status: tcp_proxy(upstream, flip_at=flip,
                                                                 task_status=task_status))
        r = await TcpByteReceiver(*proxy, total, 2).run()
        nursery.cancel_scope.cancel()
    assert not r.ok and r.first_mismatch == flip
    want = pattern(2).bytes_at(flip, 1)[0]
    assert (r.expected_byte, r.got_byte) == (want, want ^ 0xFF)
    assert f"mismatch at offset {flip}" in r.error
    assert r.bytes_received == total and r.eof  # the rest was still read and counted


async def test_tcp_truncation_is_detected():
    total, cut = 4 * MiB, 1_234_567
    async with trio.open_nursery() as nursery:
        src = TcpByteSource(LO, 0, total_bytes=total, seed=3)
        upstream = await nursery.start(src.serve)
        proxy = await nursery.start(lambda task_status: tcp_proxy(upstream, cut_at=cut,
                                                                 task_status=task_status))
        r = await TcpByteReceiver(*proxy, total, 3).run()
        nursery.cancel_scope.cancel()
    assert r.eof and not r.exact and not r.ok and r.first_mismatch is None
    assert r.bytes_received == cut
    assert r.error == f"truncated: the stream ended at {cut} of {total} bytes"


async def test_tcp_overrun_and_short_source_are_errors():
    async with trio.open_nursery() as nursery:
        src = TcpByteSource(LO, 0, total_bytes=10_000, seed=4)
        ip, port = await nursery.start(src.serve)
        short = await TcpByteReceiver(ip, port, 20_000, 4).run()
        over = await TcpByteReceiver(ip, port, 9_999, 4).run()
        exact = await TcpByteReceiver(ip, port, 10_000, 4).run()
        nursery.cancel_scope.cancel()
    assert short.error.startswith("truncated") and short.bytes_received == 10_000
    assert over.error.startswith("overrun") and over.bytes_received == 10_000 and not over.ok
    assert exact.ok and len(src.connections) == 3


async def test_tcp_wrong_seed_fails_right_after_the_first_stamp():
    async with trio.open_nursery() as nursery:
        src = TcpByteSource(LO, 0, total_bytes=100_000, seed=5)
        ip, port = await nursery.start(src.serve)
        r = await TcpByteReceiver(ip, port, 100_000, 6).run()
        nursery.cancel_scope.cancel()
    want = dp.first_difference(pattern(5).bytes_at(0, 100_000), pattern(6).bytes_at(0, 100_000))
    assert want >= 8 and r.first_mismatch == want and not r.ok


async def test_tcp_slow_receiver_is_throttled():
    total, rate = 2 * MiB, 4e6
    async with trio.open_nursery() as nursery:
        src = TcpByteSource(LO, 0, total_bytes=total, seed=7)
        ip, port = await nursery.start(src.serve)
        t = time.perf_counter()
        r = await TcpByteReceiver(ip, port, total, 7, rate_limit_bps=rate).run()
        wall = time.perf_counter() - t
        nursery.cancel_scope.cancel()
    assert r.ok and r.exact
    assert wall >= 0.9 * total / rate  # 0.52 s at full speed would be ~10 ms
    assert r.bytes_per_s <= 1.1 * rate


async def test_tcp_source_serves_concurrent_receivers_and_stops_after_max_connections():
    async with trio.open_nursery() as nursery:
        src = TcpByteSource(LO, 0, total_bytes=3 * MiB, seed=8, max_connections=3, chunk=10_000)
        ip, port = await nursery.start(src.serve)
        results = []

        async def one():
            results.append(await TcpByteReceiver(ip, port, 3 * MiB, 8).run())

        async with trio.open_nursery() as rx:
            for _ in range(3):
                rx.start_soon(one)
    # serve() returned on its own once the three connections were served
    assert [r.ok for r in results] == [True] * 3
    assert [c.bytes_sent for c in src.connections] == [3 * MiB] * 3


async def test_tcp_endless_source_and_bounded_receiver():
    async with trio.open_nursery() as nursery:
        src = TcpByteSource(LO, 0, total_bytes=0, seed=9)
        ip, port = await nursery.start(src.serve)
        r = await TcpByteReceiver(ip, port, None, 9, max_bytes=5 * MiB).run()
        await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert r.ok and r.bytes_received == 5 * MiB and not r.eof
    (conn,) = src.connections
    assert conn.bytes_sent >= 5 * MiB and not conn.complete and conn.error


async def test_tcp_receiver_reports_a_refused_connection():
    with socket.socket() as s:
        s.bind((LO, 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        r = await TcpByteReceiver(LO, port, 10, 0).run()
    assert r.done and not r.connected and not r.ok and "failed" in r.error


# ------------------------------------------------------------------ LBT-RU


async def ru_through(proxy_down=None, proxy_up=None, *, count=2000, seed=21, rate=20000.0,
                     receiver_kw=None):
    """Source -> UdpProxy -> receiver; (receiver result, source, proxy)."""
    async with trio.open_nursery() as nursery:
        src = RuDataSource(LO, 0, count=count, seed=seed, rate=rate)
        upstream = await nursery.start(src.serve)
        proxy = UdpProxy(upstream, proxy_down, proxy_up)
        front = await nursery.start(proxy.run)
        r = await RuDataReceiver(*front, seed=seed, expect_count=count, **(receiver_kw or {})).run()
        await trio.sleep(0.05)  # let the last STATUS reach the source
        nursery.cancel_scope.cancel()
    return r, src, proxy


async def test_ru_all_datagrams_arrive_verified_and_both_directions_carry_traffic():
    n = 3000
    async with trio.open_nursery() as nursery:
        src = RuDataSource(LO, 0, count=n, seed=1, rate=20000, datagram_size=1000)
        ip, port = await nursery.start(src.serve)
        t = time.perf_counter()
        r = await RuDataReceiver(ip, port, seed=1, expect_count=n).run()
        wall = time.perf_counter() - t
        await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    print(f"LBT-RU-like {n} datagrams in {wall:.3f} s: {r.datagrams_per_s:.0f}/s")
    assert r.ok and r.received == n and r.end_count == n
    assert (r.missing, r.duplicates, r.corrupt, r.out_of_order) == (0, 0, 0, 0)
    assert r.bytes_received == n * (1000 - 17) and r.hellos_sent >= 1 and r.status_sent >= 2
    (st,) = src.sessions.values()
    assert st.datagrams_sent == n and st.complete and st.end_acked and st.ends_sent >= 1
    assert st.status_received >= 2 and st.reported_received == n and st.reported_highest == n - 1
    assert src.counters["hellos"] >= 1 and src.counters["malformed"] == 0
    assert wall < 5.0


async def test_ru_through_a_faithful_proxy():
    r, src, proxy = await ru_through()
    (st,) = src.sessions.values()
    assert r.ok and proxy.counts["up"] >= 3 and st.end_acked and st.reported_received == 2000
    assert st.peer != "{}:{}".format(*proxy.client)  # the source only ever saw the proxy


async def test_ru_loss_is_counted():
    def drop_every_tenth(d):
        q = seq_of(d)
        return [] if q is not None and q % 10 == 3 else [d]

    r, src, _ = await ru_through(drop_every_tenth, count=2000)
    assert not r.ok and r.missing == 200 and r.received == 1800
    assert r.corrupt == 0 and r.duplicates == 0 and r.end_count == 2000
    assert next(iter(src.sessions.values())).reported_received == 1800


async def test_ru_one_way_relay_is_noticed_by_the_source():
    # only the HELLO goes upstream: the data flows, but the source hears no STATUS
    r, src, proxy = await ru_through(proxy_up=lambda d: d.startswith(b"RU-HELLO"), count=500)
    (st,) = src.sessions.values()
    assert r.received == 500 and proxy.counts["up_dropped"] >= 2
    assert st.status_received == 0 and not st.end_acked and st.ends_sent == src.end_repeats


async def test_ru_corruption_duplication_and_reordering():
    held = []

    def mangle(d):
        q = seq_of(d)
        if q == 10:
            d = bytearray(d)
            d[100] ^= 1
            return [bytes(d)]
        if q == 20:
            return [d, d]
        if q == 30:  # hold 30 back, send it after 31
            held.append(d)
            return []
        if q == 31:
            return [d, held.pop()]
        return [d]

    r, _, _ = await ru_through(mangle, count=100)
    assert (r.corrupt, r.duplicates, r.missing, r.received) == (1, 1, 1, 99)
    assert r.out_of_order == 1 and not r.ok
    assert r.error == "corrupt datagram (sequence 10): payload byte 83 wrong"


async def test_ru_reordering_alone_is_fine():
    held = []

    def swap(d):  # 0 1 2 3 ... -> 1 0 3 2 ...
        q = seq_of(d)
        if q is not None and q % 2 == 0:
            held.append(d)
            return []
        out = [d]
        if held:
            out.append(held.pop())
        return out

    r, _, _ = await ru_through(swap, count=100)
    assert r.ok and r.out_of_order == 50


async def test_ru_hello_retries_are_bounded(autojump_clock):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((LO, 0))  # nobody answers here
        r = await RuDataReceiver(*s.getsockname(), seed=1, hello_interval=0.5, hello_attempts=4).run()
        hellos = 0
        s.setblocking(False)
        while True:
            try:
                hellos += s.recv(64) == dp.encode_hello(1)
            except BlockingIOError:
                break
    assert not r.ok and r.hellos_sent == hellos == 4 and r.error.startswith("no answer")
    assert r.elapsed == pytest.approx(2.0)


async def test_ru_source_rejects_a_wrong_seed_and_serves_each_address_once(autojump_clock):
    async with trio.open_nursery() as nursery:
        src = RuDataSource(LO, 0, count=5, seed=1)
        addr = await nursery.start(src.serve)
        bad = await RuDataReceiver(*addr, seed=2, hello_interval=0.1, hello_attempts=3).run()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((LO, 0))
            s.sendto(dp.encode_hello(1), addr)
            s.sendto(dp.encode_hello(1), addr)
            s.sendto(b"junk", addr)
            await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert not bad.ok and bad.received == 0
    c = src.counters
    assert (c["hellos"], c["hellos_rejected"], c["hellos_repeated"], c["malformed"]) == (5, 3, 1, 1)
    (st,) = src.sessions.values()
    assert st.datagrams_sent == 5 and st.ends_sent == src.end_repeats and not st.end_acked


async def test_ru_stalled_source_is_reported():
    # the proxy stops forwarding after sequence 50: the receiver gives up after idle_timeout
    r, _, _ = await ru_through(lambda d: [d] if (seq_of(d) or 0) <= 50 and not d.startswith(b"RU-END")
                               else [], count=200, receiver_kw={"idle_timeout": 0.3})
    assert not r.ok and r.received == 51 and r.end_count is None and r.missing == 0
    assert r.error.startswith("stalled")


# ------------------------------------------------------------ lbmr-sim data


async def _daemon(nursery):
    d = Daemon(Settings(bind_ip=LO, port=0, stats_interval=0))
    return d, await nursery.start(d.run)


async def test_sim_tcp_sources_serve_and_receivers_verify_through_lbmrd():
    async with trio.open_nursery() as nursery:
        _, addr = await _daemon(nursery)
        cfg = SimConfig(daemons=[addr], contexts=3, topics=3, receivers_per_context=2,
                        bind_base="127.0.5.1", data_bytes=4 * MiB, verify_data=True, duration=20.0,
                        data_rate=10000, data_message_size=8192)  # faster than the defaults
        t = time.perf_counter()
        res = await run_sim(cfg)
        wall = time.perf_counter() - t
        nursery.cancel_scope.cancel()
    assert res.all_resolved and res.all_data_verified and sim.exit_status(res) == 0
    for r in res.receivers:
        assert r.data["ok"] and r.data["kind"] == "tcp" and r.data["bytes"] == 4 * MiB
        assert r.data["error"] is None and r.data["bytes_per_s"] > 0
        d = r.data["detail"]  # 512 whole, consecutive 8 KiB messages of one topic from where it joined
        assert d["messages"] == 512 and d["last_sqn"] - d["first_sqn"] == 511 and d["tidx"] is not None
    # every source's data socket is where its TIR says, on its context's address
    for c in res.contexts:
        for s in c.sources:
            (ds,) = [d for d in res.data_sources if d["topic"] == s.topic]
            assert ds["address"] == f"127.0.5.{c.index + 1}:{s.transport.port}"
    assert sum(d["receivers"] for d in res.data_sources) == 6
    # live: each source sent every receiver at least what it verified, plus LBMC headers
    assert sum(d["bytes_sent"] for d in res.data_sources) >= 6 * (4 * MiB + 512 * 12)
    # the advertised topic index is the one on the wire
    tidx = {s.topic: s.index for c in res.contexts for s in c.sources}
    assert all(r.data["detail"]["tidx"] == tidx[r.topic] for r in res.receivers)
    text = render(res)
    assert text.count("; data OK: 4194304 bytes, ") == 6
    assert "data verified for 6/6 receivers" in text
    assert "data sources: 3 (tcp) served 6 receivers, " in text
    doc = json.loads(render(res, True))
    assert doc["summary"]["data_verified"] == 6 and len(doc["data_sources"]) == 3
    assert wall < 10


async def test_sim_lbtru_sources_serve_and_receivers_verify_through_lbmrd():
    """LBT-RU sources send one live session each (UM LBT-RU datagrams of LBMC
    messages with the advertised topic index); every receiver verifies 500
    consecutive messages from the first it gets."""
    async with trio.open_nursery() as nursery:
        _, addr = await _daemon(nursery)
        cfg = SimConfig(daemons=[addr], contexts=2, topics=2, transport="lbtru",
                        data_datagrams=500, data_datagram_size=600, data_rate=20000,
                        verify_data=True, duration=20.0)
        res = await run_sim(cfg)
        nursery.cancel_scope.cancel()
    assert res.all_resolved and res.all_data_verified and sim.exit_status(res) == 0
    tidx = {s.topic: s.index for c in res.contexts for s in c.sources}
    for r in res.receivers:
        assert r.transport.startswith("LBTRU 127.0.0.1:")
        assert r.data["kind"] == "lbtru" and r.data["datagrams"] == 500 and r.data["ok"]
        assert r.data["bytes"] == 500 * (600 - 32)  # LBT-RU header, session id option, LBMC header
        detail = r.data["detail"]
        assert detail["tidx"] == tidx[r.topic] and detail["last_sqn"] - detail["first_sqn"] == 499
    receivers = Counter(r.topic for r in res.receivers)
    for d in res.data_sources:
        assert d["receivers"] == receivers[d["topic"]] == d["complete"]
        assert d["datagrams_sent"] >= 500 * d["receivers"] and d["status_received"] >= d["receivers"]
    assert "data OK: 500/500 datagrams" in render(res)


@pytest.mark.parametrize("served, expected, seeds, ok", [
    (["--data-bytes", "2M"], ["--data-bytes", "2M"], ("0", "0"), True),
    (["--data-bytes", "1M"], ["--data-bytes", "2M"], ("0", "0"), True),  # live: no end to the stream
    (["--data-bytes", "2M"], ["--data-bytes", "2M"], ("1", "2"), False),  # other stream
    (["--data-datagrams", "300", "--transport", "lbtru"], ["--data-datagrams", "300"], ("0", "0"),
     True),
])
async def test_two_simulators_exchange_data_as_through_a_router(served, expected, seeds, ok):
    """One simulator only sources (and serves), the other only receives and
    verifies: the layout of a router end-to-end test, here through one lbmrd."""
    async with trio.open_nursery() as nursery:
        _, (ip, port) = await _daemon(nursery)
        d = ["--daemon", f"{ip}:{port}", "--contexts", "2", "--topics", "2"]
        src_cfg, _ = parse_args([*d, "--receivers-per-context", "0", "--keep-running",
                                 "--duration", "30", "--bind-base", "127.0.6.1",
                                 "--data-seed", seeds[0], *served])
        rcv_cfg, _ = parse_args([*d, "--sources-per-topic", "0", "--duration", "20",
                                 "--bind-base", "127.0.7.1", "--verify-data",
                                 "--data-seed", seeds[1], *expected])
        nursery.start_soon(run_sim, src_cfg)
        res = await run_sim(rcv_cfg)
        nursery.cancel_scope.cancel()
    assert res.all_resolved and not res.data_sources
    assert res.all_data_verified is ok and sim.exit_status(res) == (0 if ok else 1)
    text = render(res)
    assert all(r.transport.split()[1].startswith("127.0.6.") for r in res.receivers)
    if not ok:
        assert text.count("data FAILED: payload of sequence ") == 2


async def test_sim_data_port_taken_falls_back_to_a_kernel_port_and_advertises_it():
    with socket.socket() as busy:
        busy.bind((LO, 0))
        busy.listen()
        taken = busy.getsockname()[1]
        async with trio.open_nursery() as nursery:
            _, addr = await _daemon(nursery)
            cfg = SimConfig(daemons=[addr], contexts=2, topics=2, source_port_base=taken,
                            data_bytes=100_000, verify_data=True, duration=20.0)
            res = await run_sim(cfg)
            nursery.cancel_scope.cancel()
    assert res.all_data_verified
    ports = sorted(s.transport.port for c in res.contexts for s in c.sources)
    assert taken not in ports and taken + 1 in ports
    assert {r.transport for r in res.receivers} == {f"TCP {LO}:{p}" for p in ports}


async def test_sim_receiver_of_a_source_without_data_fails_cleanly():
    async with trio.open_nursery() as nursery:
        _, addr = await _daemon(nursery)
        # sources that serve nothing (another simulator without --data-bytes) ...
        nursery.start_soon(run_sim, SimConfig(daemons=[addr], contexts=1, topics=1,
                                              receivers_per_context=0, keep_running=True,
                                              duration=30.0, bind="127.0.8.1"))
        # ... and receivers that expect data: refused at once
        res = await run_sim(SimConfig(daemons=[addr], contexts=1, topics=1, sources_per_topic=0,
                                      data_bytes=1000, verify_data=True, duration=20.0,
                                      bind="127.0.8.2"))
        nursery.cancel_scope.cancel()
    (r,) = res.receivers
    assert r.resolved and not r.data_ok and "failed" in r.data["error"]
    assert sim.exit_status(res) == 1 and res.elapsed < 5


def test_sim_data_options_parse():
    cfg, _ = parse_args(["--data-bytes", "100M", "--verify-data", "--data-seed", "7",
                         "--data-rate-limit", "2M"])
    assert (cfg.data_bytes, cfg.verify_data, cfg.data_seed, cfg.data_rate_limit) == (100 * MiB, True, 7,
                                                                                     2 * MiB)
    assert cfg.data_message_size == 1024 and cfg.data_rate == 1000  # about 1 MB/s a source
    assert parse_args(["--data-bytes", "1M", "--data-message-size", "65523"])[0].data_message_size == 65523
    cfg, _ = parse_args(["--transport", "lbtru", "--data-datagrams", "1000", "--data-rate", "5000",
                         "--data-datagram-size", "512"])
    assert (cfg.data_datagrams, cfg.data_rate, cfg.data_datagram_size) == (1000, 5000.0, 512)
    assert sim.parse_size("4k") == 4096 and sim.parse_size("1GiB") == 1 << 30
    assert sim.parse_size("123") == 123


@pytest.mark.parametrize("argv", [
    ["--data-bytes", "1M", "--transport", "lbtru"],      # bytes are for TCP sources
    ["--data-datagrams", "10"],                         # datagrams are for LBT-RU sources
    ["--data-bytes", "1M", "--transport", "lbtrm"],
    ["--verify-data"],                                  # how much to expect?
    ["--data-bytes", "0"],
    ["--data-bytes", "lots"],
    ["--data-datagram-size", "1401"],
    ["--transport", "lbtru", "--data-datagrams", "10", "--data-datagram-size", "32"],  # no payload left
    ["--data-bytes", "1M", "--data-message-size", "65524"],  # more than an LBMC message holds
    ["--data-bytes", "1M", "--data-message-size", "0"],
    ["--data-rate", "0"],
    ["--data-seed", "-1"],
])
def test_sim_bad_data_options_are_usage_errors(argv):
    with pytest.raises(click.UsageError):
        parse_args(argv)


def test_sim_help_lists_the_data_options():
    from click.testing import CliRunner

    out = CliRunner().invoke(sim.main, ["--help"]).output
    for opt in ("--data-bytes", "--data-datagrams", "--verify-data", "--data-seed", "--data-rate",
                "--data-datagram-size", "--data-rate-limit", "--data-message-size"):
        assert opt in out


async def test_sim_duration_cuts_a_slow_transfer_and_says_so():
    async with trio.open_nursery() as nursery:
        _, addr = await _daemon(nursery)
        cfg = SimConfig(daemons=[addr], contexts=1, topics=1, data_bytes=4 * MiB,
                        data_rate_limit=2 * MiB, verify_data=True, duration=0.5,
                        data_rate=10000, data_message_size=8192)  # the reader is the limit
        res = await run_sim(cfg)
        nursery.cancel_scope.cancel()
    (r,) = res.receivers
    assert r.resolved and not r.data_ok and sim.exit_status(res) == 1
    assert r.data["error"].startswith("the run ended (--duration) before the data did")
    assert 0.5 * MiB < r.data["bytes"] < 2 * MiB and res.elapsed == pytest.approx(0.5, abs=0.2)
    assert "data verified for 0/1 receivers" in render(res)
