"""lbmr-sim at scale: a source without receivers costs nothing, so a thousand
TCP sources advertise at once; the data defaults are what a routed pair carries."""

from __future__ import annotations

import socket

import trio

import lbmr_proto as L
from lbmr_tools.sim import (
    DEFAULT_DATA_MESSAGE_SIZE,
    DEFAULT_DATA_RATE,
    Context,
    SimConfig,
    parse_args,
    run_sim,
)
from lbmr_tools.sim.dataplane import TcpDataReceiver, TcpDataSource

LO = "127.0.0.1"


def _advertised(sent) -> dict[str, int]:
    """topic -> how many times it was advertised."""
    count: dict[str, int] = {}
    for d in sent:
        for t in L.decode(d.payload).tirs:
            count[t.topic] = count.get(t.topic, 0) + 1
    return count


async def test_a_thousand_tcp_sources_advertise_at_once():
    sink = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # stands in for lbmrd: just receives
    with sink:
        await sink.bind((LO, 0))
        cfg = SimConfig(daemons=[sink.getsockname()[:2]], contexts=10, topics=1000, receivers_per_context=0,
                        data_bytes=1 << 20, duration=3.0, keep_running=True, record_sent=True,
                        source_port_base=30000, seed=5)
        r = await run_sim(cfg)
    tr = [d for d in r.sent if len(d.payload) > 4]  # not keepalives
    count = _advertised(tr)
    # every source advertised, and again and again: its initial phase (10 ms doubling to 500 ms)
    # started within the run's first seconds (before this change the first TIR of a thousand
    # sources left after 37 s: each one's clock ran with nobody listening)
    assert len(count) == 1000 and min(count.values()) >= 3, sorted(count.values())[:5]
    # and no source made a message: nobody listened
    assert len(r.data_sources) == 1000
    assert all(d["messages"] == 0 and d["dropped"] == 0 and d["receivers"] == 0 for d in r.data_sources)


async def test_the_clock_stops_without_receivers_and_resumes_at_the_next_sequence(autojump_clock):
    async with trio.open_nursery() as nursery:
        src = TcpDataSource(LO, 0, seed=3, rate=1000, message_size=100)
        ip, port = await nursery.start(src.serve)
        await trio.sleep(5)
        assert src.next_sqn == 0
        a = await TcpDataReceiver(ip, port, 1000, 3).run()  # 10 messages, then it leaves
        await trio.sleep(0.5)  # the source notices when it next sends: one batch at most
        made = src.next_sqn
        await trio.sleep(5)
        assert src.next_sqn == made <= a.last_sqn + 1 + 8
        b = await TcpDataReceiver(ip, port, 1000, 3).run()
        nursery.cancel_scope.cancel()
    assert a.ok and b.ok and (a.first_sqn, a.messages) == (0, 10)
    assert b.first_sqn == made and src.dropped == 0


def test_data_defaults_are_about_a_megabyte_a_second_a_source():
    cfg, _ = parse_args(["--data-bytes", "1M"])
    assert (cfg.data_rate, cfg.data_message_size) == (DEFAULT_DATA_RATE, DEFAULT_DATA_MESSAGE_SIZE) == (1000, 1024)
    assert cfg.data_rate * cfg.data_message_size < 1.1e6


def test_a_source_advertises_only_once_its_data_port_is_bound():
    ctx = Context([("127.0.0.1", 15380)], start=0.0, local_ip="127.0.1.1")
    src = ctx.add_source("t", L.TcpTransport("0.0.0.0", 14371), ready=False)
    local = ctx.add_receiver("t")  # a receiver of the same context resolves at once
    assert local.resolved and local.transport.port == 14371
    assert not [d for d in ctx.tick(0.0) if L.decode(d).tirs]  # no TIR yet...
    tqr = L.encode(L.Packet(0, 1, tqrs=[L.TQR("t")], options=[L.SourceIdOption(0x8000, b"\x99" * 8)]))
    assert ctx.receive(tqr, 0.0, ("127.0.0.1", 15380)) == [] and ctx.stats["tqrs_received"] == 1  # nor answers
    # its port was taken: it serves on another one and says so from now on
    ctx.source_ready(src, 0.5, L.TcpTransport("0.0.0.0", 40001))
    tirs = [t for d in ctx.tick(0.5) for t in L.decode(d).tirs]
    assert [(t.topic, t.transport.port) for t in tirs] == [("t", 40001)]
    assert local.transport.port == 40001  # the local receiver follows
