"""lbmr-sim: the sans-IO context model (timing, batching, replies) and the trio
shell end to end against our lbmrd on loopback."""

from __future__ import annotations

import json
import math
import random
import socket
import subprocess
import sys
import time

import click
import pytest
import trio
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import lbmr_proto as L
from lbmr_proto.capture import read_udp
from lbmr_tools import sim
from lbmr_tools.sim import Context, SimConfig, Timing, parse_args, render, run_sim
from lbmrd.server import Daemon, Settings

from .helpers import drive

D0 = ("127.0.0.1", 15380)
D1 = ("127.0.0.1", 15381)
EXT = ("127.0.0.1", 40000)  # another context's TR socket (not a daemon)




def tirs_of(d: bytes) -> list[L.TIR]:
    return L.decode(d).tirs


def tqrs_of(d: bytes) -> list[str]:
    return [q.topic for q in L.decode(d).tqrs]


def tir_datagram(topic: str, ip: str, port: int, src_id: bytes = b"\x99" * 8) -> bytes:
    return L.encode(L.Packet(0, 1, tirs=[L.TIR(topic, L.TcpTransport(ip, port))],
                             options=[L.SourceIdOption(0x8000, src_id)]))


def tqr_datagram(topic: str, src_id: bytes = b"\x99" * 8) -> bytes:
    return L.encode(L.Packet(0, 1, tqrs=[L.TQR(topic)], options=[L.SourceIdOption(0x8000, src_id)]))


def approx_list(xs):
    return pytest.approx(xs, abs=1e-6)


# Literal UM default schedules (seconds after creation).
AD_TIMES = ([0, 0.01, 0.03, 0.07, 0.15, 0.31, 0.63] + [1.13 + 0.5 * k for k in range(9)]
            + [6.13 + k for k in range(59)])
QUERY_TIMES = ([0, 0.02, 0.06, 0.14, 0.30] + [0.50 + 0.2 * k for k in range(24)]
               + [6.10 + k for k in range(59)])


# ------------------------------------------------------------------ timing


def test_literal_schedules_are_what_the_brief_describes():
    gaps = [b - a for a, b in zip(AD_TIMES, AD_TIMES[1:], strict=False)]
    assert gaps[:7] == approx_list([0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.5])
    assert AD_TIMES[14] == pytest.approx(4.63) and AD_TIMES[15] == pytest.approx(5.13)
    assert AD_TIMES[-1] == pytest.approx(64.13)
    assert QUERY_TIMES[28] == pytest.approx(5.10) and QUERY_TIMES[-1] == pytest.approx(64.10)


def test_advertisements_double_to_500ms_then_every_second_then_stop():
    ctx = Context([D0], start=100.0)
    ctx.add_source("md.0", L.TcpTransport("0.0.0.0", 14371))
    sent = drive(ctx, 200.0)
    ads = [t - 100.0 for t, d in sent if d.kind == "tr"]
    assert all(len(tirs_of(d)) == 1 for _, d in sent if d.kind == "tr")
    assert ads == approx_list(AD_TIMES)
    assert ctx.sources[0].schedule.next == math.inf


def test_queries_double_to_200ms_then_every_second():
    ctx = Context([D0])
    ctx.add_receiver("md.nobody")
    sent = drive(ctx, 100.0)
    qs = [t for t, d in sent if d.kind == "tr"]
    assert all(tqrs_of(d) == ["md.nobody"] for _, d in sent if d.kind == "tr")
    assert qs == approx_list(QUERY_TIMES)
    assert not ctx.receivers[0].resolved


def test_timing_is_configurable():
    tm = Timing(ad_initial_min=0.1, ad_initial_max=0.4, ad_initial_duration=1.0,
                ad_sustain_interval=2.0, ad_sustain_duration=4.0)
    ctx = Context([D0], timing=tm)
    ctx.add_source("t", L.TcpTransport("0.0.0.0", 1))
    ads = [t for t, d in drive(ctx, 50) if d.kind == "tr"]
    assert ads == approx_list([0, 0.1, 0.3, 0.7, 1.1, 3.1])
    with pytest.raises(ValueError):
        Timing(keepalive_interval=0)
    with pytest.raises(ValueError):
        Timing(query_initial_min=0.5, query_initial_max=0.2)


def test_queries_stop_once_resolved():
    ctx = Context([D0])
    r = ctx.add_receiver("md.1")
    sent = drive(ctx, 0.061)
    assert [t for t, d in sent if d.kind == "tr"] == approx_list([0, 0.02, 0.06])
    assert ctx.receive(tir_datagram("md.1", "127.0.1.9", 14372), 0.07, D0) == []
    assert r.resolved and r.time_to_resolve == pytest.approx(0.07)
    assert sim.transport_text(r.transport) == "TCP 127.0.1.9:14372"
    later = drive(ctx, 30.0)
    assert later and all(d.kind == "keepalive" for _, d in later)
    # a second source is noted but does not change the resolution
    ctx.receive(tir_datagram("md.1", "127.0.1.8", 14373), 31.0, D0)
    assert r.time_to_resolve == pytest.approx(0.07) and len(r.sources) == 2


def test_keepalive_only_after_500ms_of_idleness():
    ctx = Context([D0])
    ctx.add_source("md.0", L.TcpTransport("0.0.0.0", 14371))
    sent = drive(ctx, 70.0)
    kas = [(t, bytes(d)) for t, d in sent if d.kind == "keepalive"]
    # the initial phase never leaves the daemon idle for 500 ms (gaps <= 500 ms)
    assert kas[0][0] == pytest.approx(5.63)
    sustain = [t for t, _ in kas if t < 64.5]
    assert sustain == approx_list([5.63 + k for k in range(59)])
    tail = [t for t, _ in kas if t > 64.5]
    assert tail == approx_list([64.63 + 0.5 * k for k in range(len(tail))]) and len(tail) == 11
    assert [b for _, b in kas[:4]] == [b"\x02\x00\x00\x00", b"\x03\x00\x00\x00"] * 2
    assert all(d.dest == D0 for _, d in sent)
    # general invariant: a keepalive never follows another datagram to that daemon within 500 ms
    last = -math.inf
    for t, d in sent:
        if d.kind == "keepalive":
            assert t - last >= 0.5 - 1e-9
        last = t


def test_receiver_only_context_keeps_alive_every_500ms_after_resolving():
    ctx = Context([D0])
    ctx.add_receiver("md.1")
    drive(ctx, 0.0)
    ctx.receive(tir_datagram("md.1", "127.0.0.5", 1), 0.001, D0)
    kas = [t for t, d in drive(ctx, 3.0) if d.kind == "keepalive"]
    assert kas == approx_list([0.5, 1.0, 1.5, 2.0, 2.5, 3.0])


def test_idle_context_sends_nothing_unless_force_alive():
    assert Context([D0]).next_deadline() == math.inf
    assert Context([D0]).tick(10.0) == []
    forced = Context([D0], force_alive=True)
    assert [bytes(d) for _, d in drive(forced, 1.0)] == [b"\x02\x00\x00\x00", b"\x03\x00\x00\x00"]


def test_tqr_for_a_sourced_topic_gets_an_immediate_tir():
    ctx = Context([D0, D1], rng=random.Random(1))
    ctx.add_source("md.0", L.TcpTransport("0.0.0.0", 14371))
    ctx.add_source("md.0", L.TcpTransport("0.0.0.0", 14372))
    ctx.add_source("md.5", L.TcpTransport("0.0.0.0", 14373))
    for now in (30.25, 100.0):  # sustaining phase, and quiescent (no more adverts)
        out = ctx.receive(tqr_datagram("md.0"), now, D1)
        assert len(out) == 1 and out[0].kind == "response"
        assert out[0].dest == ctx.daemons[ctx.current_daemon(now)]
        tirs = tirs_of(out[0])
        assert [t.topic for t in tirs] == ["md.0", "md.0"]
        assert [t.transport.port for t in tirs] == [14371, 14372]
    assert ctx.receive(tqr_datagram("md.unknown"), 1.0, D0) == []
    assert ctx.receive(tqr_datagram("md.0", ctx.src_id), 1.0, D0) == []  # our own query
    assert ctx.receive(tqr_datagram("md.0"), 1.0, EXT) == []  # not from a daemon
    assert ctx.receive(b"\x05garbage", 1.0, D0) == []
    assert ctx.stats["ignored_own"] == 1 and ctx.stats["ignored_unknown_source"] == 1
    assert ctx.stats["malformed"] == 1 and ctx.stats["responses"] == 4


def test_response_counts_as_traffic_for_keepalives():
    ctx = Context([D0])
    ctx.add_source("md.0", L.TcpTransport("0.0.0.0", 14371))
    drive(ctx, 66.0)  # quiescent
    t0 = ctx.next_deadline()
    ctx.receive(tqr_datagram("md.0"), t0 - 0.1, D0)
    assert ctx.next_deadline() == pytest.approx(t0 - 0.1 + 0.5)


def test_datagrams_look_like_um6():
    ctx = Context([D0], src_id=b"ABCDEFGH", request_port=14391)
    ctx.add_source("md.0", L.LbtrmTransport("0.0.0.0", "224.10.10.10", 7, 14400, 14390))
    ctx.add_receiver("md.1")
    (d,) = ctx.tick(0.0)
    p = L.decode(d)
    assert p.version == 1 and p.type == 0 and d[0] == 0x18
    assert [q.topic for q in p.tqrs] == ["md.1"] and [t.topic for t in p.tirs] == ["md.0"]
    assert p.options == [L.SourceIdOption(0x8000, b"ABCDEFGH"), L.SourceTypeOption(0x80, 0),
                         L.VersionOption(0x8001, 0x060E0000), L.LocalDomainOption(0x8000, 0)]
    otid, exfunc = p.tirs[0].options
    assert isinstance(otid, L.OtidOption) and isinstance(exfunc, L.ExFuncOption)
    assert otid.otid[0] == 0x10 and otid.otid[31] == 1 and len(otid.otid) == 32
    assert exfunc.src_tcp_port == 14391 and exfunc.src_ip_addr == "0.0.0.0"
    assert L.encode(p) == d


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet="abcdefghij.", min_size=1, max_size=120), min_size=1, max_size=60),
       st.integers(0, 300), st.integers(600, 1500))
def test_batching_bounds_datagrams_and_keeps_every_record(topics, nq, limit):
    ctx = Context([D0], max_datagram=limit)
    for i, t in enumerate(topics):
        ctx.add_source(t, L.TcpTransport("0.0.0.0", 1 + i))
    for i in range(nq):
        ctx.add_receiver(f"q{i}")
    out = ctx.tick(0.0)
    assert all(len(d) <= limit for d in out)
    assert all(len(L.decode(d).tqrs) <= 255 for d in out)
    assert sorted(t.topic for d in out for t in tirs_of(d)) == sorted(topics)
    assert sorted(q for d in out for q in tqrs_of(d)) == sorted(f"q{i}" for i in range(nq))
    assert len(out) <= 1 + sum(len(d) for d in out) // (limit // 2)  # greedy packing, not one per record


def test_normal_traffic_rotates_and_keepalives_reach_every_daemon():
    ctx = Context([D0, D1], timing=Timing(change_interval=0.2))
    ctx.add_source("md.0", L.TcpTransport("0.0.0.0", 14371))
    sent = drive(ctx, 20.0)
    for t, d in sent:
        if d.kind == "tr":
            assert d.dest == [D0, D1][int(t / 0.2 + 1e-9) % 2]
    for dest in (D0, D1):
        mine = [(t, d) for t, d in sent if d.dest == dest]
        assert any(d.kind == "keepalive" for _, d in mine)
        gaps = [b[0] - a[0] for a, b in zip(mine, mine[1:], strict=False)]
        assert max(gaps) <= 0.5 + 1e-9  # every daemon hears from us at least every 500 ms


def test_receiver_for_own_topic_resolves_locally():
    ctx = Context([D0], local_ip="127.0.1.7")
    ctx.add_source("md.0", L.TcpTransport("0.0.0.0", 14371))
    r = ctx.add_receiver("md.0", now=2.0)
    assert r.local and r.time_to_resolve == 0 and sim.transport_text(r.transport) == "TCP 127.0.1.7:14371"


def test_topology():
    cfg = SimConfig(contexts=3, topics=6, sources_per_topic=2, receivers_per_context=2)
    ctxs = sim.build_contexts(cfg, [("127.0.0.1", 1000 + i) for i in range(3)], 0.0, random.Random(0))
    placed = sorted((c.index, s.topic, s.transport.port) for c in ctxs for s in c.sources)
    assert len(placed) == 12 and placed[0] == (0, "md.0", 14371)
    for c in ctxs:
        mine = {s.topic for s in c.sources}
        assert len(c.receivers) == 2 and not mine & {r.topic for r in c.receivers}
    assert len({c.src_id for c in ctxs}) == 3


# ---------------------------------------------------------- end to end


async def _daemons(nursery, n: int = 1) -> list[tuple[Daemon, tuple[str, int]]]:
    out = []
    for _ in range(n):
        d = Daemon(Settings(bind_ip="127.0.0.1", port=0, stats_interval=0))
        out.append((d, await nursery.start(d.run)))
    return out


async def test_four_contexts_resolve_through_lbmrd_fill_in(autojump_clock):
    async with trio.open_nursery() as nursery:
        ((daemon, addr),) = await _daemons(nursery)
        cfg = SimConfig(daemons=[addr], contexts=4, topics=4, duration=30.0, seed=7)
        res = await run_sim(cfg)
        nursery.cancel_scope.cancel()
    assert res.all_resolved and len(res.receivers) == 4
    assert len({port for _, port in res.clients}) == 4
    for c, r in zip(res.contexts, res.receivers, strict=True):
        (recv,) = c.receivers
        # context i receives md.(i+1), sourced by context i+1 on port 14371 + (i+1)
        j = (c.index + 1) % 4
        assert recv.topic == f"md.{j}" and not recv.local
        assert recv.transport == L.TcpTransport(res.clients[j][0], 14371 + j)
        exfunc = recv.tir.options[1]
        assert exfunc.src_ip_addr == res.clients[j][0]  # lbmrd filled the option too
        assert recv.time_to_resolve < 0.1
        assert r.transport == f"TCP 127.0.0.1:{14371 + j}" and r.time_ms < 100
    assert len(daemon.core.table) == 4
    assert daemon.core.counters.fillins > 0
    assert res.elapsed < 0.1  # stopped as soon as everything resolved


async def test_bind_base_spreads_contexts_and_fill_in_uses_each_address(autojump_clock):
    async with trio.open_nursery() as nursery:
        ((daemon, addr),) = await _daemons(nursery)
        cfg = SimConfig(daemons=[addr], contexts=5, topics=10, receivers_per_context=3,
                        bind_base="127.0.1.1", transport="lbtru", duration=30.0)
        res = await run_sim(cfg)
        nursery.cancel_scope.cancel()
    assert [ip for ip, _ in res.clients] == [f"127.0.1.{1 + i}" for i in range(5)]
    assert res.all_resolved and len(res.receivers) == 15
    owner = {s.topic: (c.index, s.transport.port) for c in res.contexts for s in c.sources}
    for r in res.receivers:
        ci, port = owner[r.topic]
        assert r.transport == f"LBTRU 127.0.1.{1 + ci}:{port}"
    assert {c.addr[0] for c in daemon.core.table} == {f"127.0.1.{1 + i}" for i in range(5)}


async def test_two_daemons_both_learn_every_context_from_keepalives(autojump_clock):
    async with trio.open_nursery() as nursery:
        (d0, a0), (d1, a1) = await _daemons(nursery, 2)
        cfg = SimConfig(daemons=[a0, a1], contexts=4, topics=4, duration=3.0, keep_running=True,
                        record_sent=True)
        res = await run_sim(cfg)
        nursery.cancel_scope.cancel()
    assert res.all_resolved and res.elapsed == pytest.approx(3.0)
    clients = set(res.clients)
    for daemon, addr in ((d0, a0), (d1, a1)):
        assert {c.addr for c in daemon.core.table} == clients
        assert daemon.core.counters.rx["RCV_ALIVE"] + daemon.core.counters.rx["SRC_ALIVE"] > 0
        for ip, port in clients:
            kas = [s for s in res.sent if (s.src, s.sport) == (ip, port) and (s.dst, s.dport) == addr
                   and s.payload in (b"\x02\x00\x00\x00", b"\x03\x00\x00\x00")]
            assert kas, f"no keepalive from {ip}:{port} to {addr}"
    # the daemons answered the keepalives with the 4-byte NORMAL header
    assert all(c.stats["keepalive_replies"] > 0 for c in res.contexts)
    assert not any(c.stats["ignored_unknown_source"] for c in res.contexts)


async def test_unresolvable_receivers_are_reported(autojump_clock):
    async with trio.open_nursery() as nursery:
        ((_, addr),) = await _daemons(nursery)
        res = await run_sim(SimConfig(daemons=[addr], contexts=2, topics=2, sources_per_topic=0,
                                      duration=2.0))
        nursery.cancel_scope.cancel()
    assert res.resolved == 0 and sim.exit_status(res) == 1
    assert res.elapsed == pytest.approx(2.0)
    text = render(res)
    assert text.count(" unresolved\n") == 2
    assert "summary: 0/2 receivers resolved; no time to resolve" in text


async def test_pcap_holds_exactly_what_was_sent(autojump_clock, tmp_path):
    path = tmp_path / "sim.pcap"
    async with trio.open_nursery() as nursery:
        (_, a0), (_, a1) = await _daemons(nursery, 2)
        cfg = SimConfig(daemons=[a0, a1], contexts=3, topics=6, receivers_per_context=2,
                        duration=1.5, keep_running=True, pcap=str(path), record_sent=True,
                        bind_base="127.0.2.1")
        t0 = time.time()
        res = await run_sim(cfg)
        nursery.cancel_scope.cancel()
    got = list(read_udp(str(path)))
    assert len(got) == len(res.sent) > 10
    assert all(a.ts <= b.ts for a, b in zip(got, got[1:], strict=False))
    for g, s in zip(got, res.sent, strict=True):
        assert (g.src, g.sport, g.dst, g.dport, g.payload) == (s.src, s.sport, s.dst, s.dport, s.payload)
        assert g.ts == pytest.approx(s.ts, abs=1e-6) and t0 - 1 <= g.ts <= t0 + 10
        assert (g.src, g.sport) in res.clients and (g.dst, g.dport) in (a0, a1)
        p = L.decode(g.payload)
        assert p.is_keepalive or p.version == 1
    kinds = {L.decode(g.payload).type for g in got}
    assert kinds == {0, 2, 3}
    assert sum(len(L.decode(g.payload).tirs) for g in got) >= 6


# ------------------------------------------------------------------- CLI


def test_parse_args_builds_the_config():
    cfg, as_json = parse_args(["--daemon", "127.0.0.1:15380", "--daemon", "127.0.0.2:15381",
                               "--contexts", "6", "--topics", "12", "--sources-per-topic", "2",
                               "--receivers-per-context", "3", "--transport", "LBTRM",
                               "--source-ip", "bind", "--bind-base", "127.0.1.1", "--duration", "2.5",
                               "--pcap", "x.pcap", "--json", "--seed", "3",
                               "--timing", "keepalive_interval=0.25", "--timing", "change-interval=1"])
    assert as_json
    assert cfg.daemons == [("127.0.0.1", 15380), ("127.0.0.2", 15381)]
    assert (cfg.contexts, cfg.topics, cfg.sources_per_topic, cfg.receivers_per_context) == (6, 12, 2, 3)
    assert cfg.transport == "lbtrm" and cfg.source_ip == "bind" and cfg.bind_base == "127.0.1.1"
    assert cfg.duration == 2.5 and cfg.pcap == "x.pcap" and cfg.seed == 3
    assert cfg.timing == Timing(keepalive_interval=0.25, change_interval=1.0)
    assert sim.bind_addresses(cfg)[-1] == "127.0.1.6"
    lossy, _ = parse_args(["--transport", "lbtrm", "--data-drop-copies", "2", "--data-ignore-interval", "0.3",
                           "--data-nak-backoff", "0.05", "--data-source-linger", "0"])
    assert (lossy.data_drop_copies, lossy.data_ignore_interval, lossy.data_nak_backoff,
            lossy.data_source_linger) == (2, 0.3, 0.05, 0.0)
    default, as_json = parse_args([])
    assert (default.data_drop_copies, default.data_source_linger) == (1, None)
    assert default.daemons == [("127.0.0.1", 15380)] and not as_json and default.source_ip == "0.0.0.0"


@pytest.mark.parametrize("argv", [
    ["--daemon", "10.0.0.1:15380"],        # not loopback
    ["--daemon", "127.0.0.1"],             # no port
    ["--daemon", "127.0.0.1:70000"],
    ["--daemon", "127.0.0.1:1", "--daemon", "127.0.0.1:1"],
    ["--bind", "192.168.1.1"],
    ["--bind-base", "127.255.255.250", "--contexts", "10"],
    ["--topics", "2", "--receivers-per-context", "3"],
    ["--source-ip", "nowhere"],
    ["--timing", "bogus=1"],
    ["--timing", "keepalive_interval=-1"],
    ["--transport", "pgm"],
    ["--duration", "0"],
    ["--topics", "70000"],                 # source ports would pass 65535
    ["--data-ignore-interval", "0.3"],     # LBT-RM options with TCP sources
    ["--transport", "lbtru", "--data-nak-backoff", "0.1"],
    ["--data-source-linger", "0"],
    ["--data-drop-copies", "2"],
    ["--transport", "lbtrm", "--data-drop-copies", "0"],
    ["--transport", "lbtrm", "--data-nak-backoff", "0"],
    ["--transport", "lbtrm", "--data-ignore-interval", "-1"],
    ["--transport", "lbtrm", "--data-source-linger", "-1"],
])
def test_bad_arguments_are_usage_errors(argv):
    with pytest.raises(click.UsageError):
        parse_args(argv)
    r = CliRunner().invoke(sim.main, argv)
    assert r.exit_code == 2, r.output


def test_help_lists_every_option():
    r = CliRunner().invoke(sim.main, ["--help"])
    assert r.exit_code == 0
    for opt in ("--daemon", "--contexts", "--topics", "--sources-per-topic", "--receivers-per-context",
                "--transport", "--source-ip", "--source-port-base", "--bind", "--bind-base",
                "--duration", "--keep-running", "--pcap", "--json", "--seed", "--topic-prefix",
                "--max-datagram", "--timing"):
        assert opt in r.output


async def test_cli_arguments_run_through_the_trio_entry(autojump_clock):
    async with trio.open_nursery() as nursery:
        ((_, (ip, port)),) = await _daemons(nursery)
        cfg, as_json = parse_args(["--daemon", f"{ip}:{port}", "--contexts", "3", "--topics", "3",
                                   "--json", "--duration", "5"])
        res = await run_sim(cfg)
        nursery.cancel_scope.cancel()
    doc = json.loads(render(res, as_json))
    assert doc["summary"]["resolved"] == doc["summary"]["total"] == 3 and sim.exit_status(res) == 0
    assert doc["summary"]["max_ms"] < 100
    assert all(r["transport"].startswith("TCP 127.0.0.1:1437") for r in doc["receivers"])
    assert doc["daemons"] == [f"{ip}:{port}"] and len(doc["contexts"]) == 3
    text = render(res)
    assert text.count(" resolved in ") == 3 and "summary: 3/3 receivers resolved" in text


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_lbmrd(port: int, proc: subprocess.Popen) -> None:
    """Probe with a keepalive until the daemon answers (at most ~10 s)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(0.1)
        for _ in range(100):
            assert proc.poll() is None, proc.communicate()[0]
            s.sendto(b"\x02\x00\x00\x00", ("127.0.0.1", port))
            try:
                if s.recvfrom(64)[0] == b"\x00\x00\x00\x00":
                    return
            except TimeoutError:
                continue
    raise AssertionError("lbmrd did not answer")


def test_lbmr_sim_command_against_lbmrd_subprocess():
    port = _free_udp_port()
    daemon = subprocess.Popen(
        [sys.executable, "-c", "import sys; from lbmrd.cli import main; sys.exit(main(sys.argv[1:]))",
         "-i", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_lbmrd(port, daemon)
        r = subprocess.run([sys.executable, "-m", "lbmr_tools.sim", "--daemon", f"127.0.0.1:{port}",
                            "--contexts", "3", "--topics", "6", "--receivers-per-context", "2",
                            "--bind-base", "127.0.3.1", "--duration", "10"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        assert len(lines) == 7 and lines[-1].startswith("summary: 6/6 receivers resolved")
        assert all(" resolved in " in ln and ": TCP 127.0.3." in ln for ln in lines[:-1])
    finally:
        daemon.terminate()
        try:
            out = daemon.communicate(timeout=10)[0]
        except subprocess.TimeoutExpired:
            daemon.kill()
            out = daemon.communicate()[0]
    assert daemon.returncode == 0, out
    assert "stopping (SIGTERM)" in out
