"""lbmr-sim's UM request/response, late join and OTR on TCP sources
(lbmr_tools.sim.dataplane.uim and .umtcp), from the sans-IO repair core to
whole runs through lbmrd."""

from __future__ import annotations

import json

import pytest
import trio

from lbmr_proto import LateJoinOption, lbmc
from lbmr_tools import sim
from lbmr_tools.sim import SimConfig, parse_args, render, run_sim
from lbmr_tools.sim.dataplane import (
    Repair,
    RequestPort,
    UmTcpReceiver,
    UmTcpReceiveResult,
    UmTcpSource,
    message_payload,
    response_message,
)
from lbmr_tools.sim.dataplane.live import StreamMismatch
from lbmrd.server import Daemon, Settings

LO = "127.0.0.1"


def _msg(sqn: int, seed: int = 1, tidx: int = 5, kind: int = lbmc.MESSAGE, size: int = 20) -> lbmc.Message:
    return lbmc.Message(kind, tidx, sqn, bytes(message_payload(seed, sqn, size)))


# ------------------------------------------------------------------ Repair (sans-IO)


def test_repair_finds_gaps_and_fills_them_from_retransmissions():
    r = UmTcpReceiveResult()
    rep = Repair(r, seed=1)
    assert rep.live(_msg(10)) == [] and r.first_live_sqn == 10
    assert rep.live(_msg(13)) == [11, 12]
    assert rep.live(_msg(14), discard=True) == [14] and r.dropped_on_purpose == 1
    assert rep.missing == {11, 12, 14} and r.unrecovered == 3
    assert rep.retrans(_msg(12, kind=lbmc.RETRANS)) and not rep.retrans(_msg(12, kind=lbmc.RETRANS))
    assert rep.retrans(_msg(11, kind=lbmc.RETRANS)) and rep.retrans(_msg(14, kind=lbmc.RETRANS))
    assert not rep.missing and (r.recovered, r.duplicates, r.messages) == (3, 1, 5)
    assert (r.first_sqn, r.last_sqn) == (10, 14)


def test_repair_late_join_wants_the_retained_messages_before_the_first_live_one():
    r = UmTcpReceiveResult()
    rep = Repair(r, seed=1)
    rep.live(_msg(100))
    rep.live(_msg(101))
    assert rep.late_join(40, 101) == 60 and rep.pending == 60 and (r.lj_low, r.lj_high) == (40, 101)
    for q in range(40, 102):  # the source sends its whole retained range: the live ones are duplicates
        rep.retrans(_msg(q, kind=lbmc.RETRANS))
    assert not rep.missing and r.messages == 62 and (r.first_sqn, r.last_sqn) == (40, 101)
    assert r.duplicates == 2


def test_repair_late_join_takes_its_messages_in_order_however_many():
    r = UmTcpReceiveResult()
    rep = Repair(r, seed=1, max_missing=10)
    rep.live(_msg(100_000))
    assert rep.late_join(0, 100_000) == 100_000 and r.unrecovered == 100_000  # a range, not a set
    assert rep.retrans(_msg(0, kind=lbmc.RETRANS)) and not rep.retrans(_msg(2, kind=lbmc.RETRANS))
    assert rep.pending == 99_999 and r.duplicates == 1  # out of order: not taken


def test_repair_rejects_a_wrong_payload_a_wrong_topic_and_too_many_missing():
    rep = Repair(UmTcpReceiveResult(), seed=1)
    rep.live(_msg(0))
    with pytest.raises(StreamMismatch, match="payload of sequence 1"):
        rep.live(lbmc.Message(lbmc.MESSAGE, 5, 1, b"x" * 20))
    with pytest.raises(StreamMismatch, match="topic index 6"):
        rep.live(_msg(1, tidx=6))
    small = Repair(UmTcpReceiveResult(), seed=1, max_missing=10)
    small.live(_msg(0))
    with pytest.raises(StreamMismatch, match="11 messages missing at once"):
        small.live(_msg(12))


# ------------------------------------------------------------------ endpoints


async def test_requests_get_a_response_from_every_receiver_and_a_late_joiner_and_otr_repair():
    async with trio.open_nursery() as n:
        port = RequestPort(LO)
        await n.start(port.serve)
        st = port.add_requests("t", 7, 20)
        src = UmTcpSource(LO, 0, seed=7, rate=10_000, message_size=100, requests=20, request_interval=100,
                          request_port=port.address, first_qidx=st.first_qidx, retention=5000)
        ip, p = await n.start(src.serve)
        n.start_soon(src.take_requests, port.serve_source(1))  # its late-join option: port.address, index 1
        rport = RequestPort("127.0.0.2")
        await n.start(rport.serve)
        res = {}

        def receiver(name, **kw):
            async def run():
                res[name] = await UmTcpReceiver(ip, p, 100 * 2500, 7, request_port=rport,
                                                source_request=(*port.address, 1), bind_ip="127.0.0.2",
                                                timeout=20, **kw).run()
            return run

        async with trio.open_nursery() as m:
            m.start_soon(receiver("plain"))
            m.start_soon(receiver("otr", otr=True, drop_every=17))
            while src.next_sqn <= 2100:  # after the last request (message 2000)
                await trio.sleep(0.01)
            m.start_soon(receiver("late", late_join=True))
        n.cancel_scope.cancel()
    plain, otr, late = res["plain"], res["otr"], res["late"]
    assert plain.ok and otr.ok and late.ok, res
    assert (plain.requests_seen, plain.responses_sent) == (20, 20)
    # the OTR receiver threw every 17th message away, request 8 (message 900) among them, and got all back
    assert otr.dropped_on_purpose == otr.recovered == otr.otr_requests >= 2500 // 17 and otr.unrecovered == 0
    assert (otr.requests_seen, otr.responses_sent) == (20, 20)
    assert otr.messages == otr.last_sqn - otr.first_sqn + 1 >= 2500
    # the late joiner got messages 0.. (all retained) then the live stream, consecutive
    assert late.first_live_sqn > 2000 and late.lj_low == 0 and late.lj_high >= late.first_live_sqn - 1
    assert late.first_sqn == 0 and late.messages == late.last_sqn + 1 and late.recovered == late.first_live_sqn
    assert late.requests_seen == 20  # retransmitted requests are requests: it answered them too
    # every request: a right response from each of the three
    assert st.responses == {q: 3 for q in range(20)} and st.bad_payloads == 0
    assert src.requests_sent == [2] * 20  # the late joiner was not there yet
    assert src.counters["lj_answered"] == 1 and src.counters["rx_answered"] == otr.recovered
    assert port.stats.responses == 60 and rport.stats.unclaimed == 0
    # the requests came to the source's request port as UIMs, none on the data connections
    assert port.stats.recovery_requests == 1 + otr.otr_requests and port.stats.unknown_transport == 0
    assert src.counters["other_control"] == 0 and src.counters["wrong_topic"] == 0


async def test_the_request_port_counts_what_is_not_a_right_response_and_survives_garbage():
    async with trio.open_nursery() as n:
        port = RequestPort(LO, max_connections=2)
        await n.start(port.serve)
        st = port.add_requests("t", 9, 3)
        s = await trio.open_tcp_stream(*port.address)
        await s.send_all(response_message(9, 1) + response_message(8, 2) + response_message(9, 99)
                         + lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(lbmc.TcpSidHeader(0, 1),))))
        await s.send_all(b"\xff" * 40)  # not LBMC: the connection is closed
        assert await s.receive_some(10) == b""
        good = await trio.open_tcp_stream(*port.address)
        await good.send_all(response_message(9, 0))
        await good.aclose()
        await trio.sleep(0.2)
        n.cancel_scope.cancel()
    assert st.responses == {0: 1, 1: 1} and st.bad_payloads == 1
    assert port.stats.unknown_qidx == 1 and port.stats.other == 1 and port.stats.malformed == 1


# ------------------------------------------------------------------ lbmr-sim runs


async def _daemon(nursery):
    d = Daemon(Settings(bind_ip=LO, port=0, stats_interval=0))
    return await nursery.start(d.run)


async def test_sim_twenty_requests_get_twenty_responses_from_each_receiver():
    async with trio.open_nursery() as nursery:
        addr = await _daemon(nursery)
        cfg = SimConfig(daemons=[addr], contexts=3, topics=1, receivers_per_context=1, bind_base="127.0.6.1",
                        data_bytes=100 * 10_500, verify_data=True, duration=30.0, requests=20,
                        request_interval=500, data_rate=5000, data_message_size=100)
        # the first request is 100 ms into the stream: the receivers resolving through lbmrd are in
        res = await run_sim(cfg)
        nursery.cancel_scope.cancel()
    assert res.all_resolved and res.all_data_verified and sim.exit_status(res) == 0
    (rp,) = [p for p in res.request_ports if p["requests"]]  # the source's context
    (req,) = rp["requests"]
    (ds,) = res.data_sources
    receivers = [r for r in res.receivers if not r.local]
    assert len(ds["requests_sent"]) == 20 and req["count"] == 20 and req["bad_payloads"] == 0
    # every request reached every receiver, and each one answered with the right index and payload
    assert ds["requests_sent"] == [len(res.receivers)] * 20
    assert req["responses"] == {str(q): len(res.receivers) for q in range(req["first_qidx"], 20)}
    assert receivers and all(r.data["detail"]["responses_sent"] == 20 for r in res.receivers)
    text = render(res)
    assert f"20/20 sent to {20 * len(res.receivers)} receivers in all; {20 * len(res.receivers)} responses" in text
    doc = json.loads(render(res, True))
    assert doc["request_ports"][rp["context"]]["requests"][0]["responses"] == req["responses"]
    # every context advertised the request port it listens on
    for c, p in zip(res.contexts, res.request_ports, strict=True):
        assert p["address"] == f"{c.local_ip}:{c.request_port}"


async def test_sim_late_join_and_otr_receivers_get_consecutive_streams():
    async with trio.open_nursery() as nursery:
        addr = await _daemon(nursery)
        cfg = SimConfig(daemons=[addr], contexts=2, topics=2, receivers_per_context=1, bind_base="127.0.6.11",
                        data_bytes=500 * 1024, verify_data=True, duration=30.0, retention=1000,
                        late_join=True, otr=True, data_drop_every=25, data_rate=2000)
        res = await run_sim(cfg)
        nursery.cancel_scope.cancel()
    assert res.all_resolved and res.all_data_verified, [r.data for r in res.receivers]
    for r in res.receivers:
        d = r.data["detail"]
        assert d["unrecovered"] == 0 and d["dropped_on_purpose"] >= 1 and d["recovered"] >= d["dropped_on_purpose"]
        assert d["lj_low"] == 0 and d["first_sqn"] == 0  # the clock started with this receiver: all retained
        assert d["messages"] == d["last_sqn"] - d["first_sqn"] + 1
    for ds in res.data_sources:
        c = ds["counters"]
        assert c["lj_answered"] == 1 and c["rx_answered"] >= 1
        assert c["other_control"] == c["wrong_topic"] == 0  # nothing upstream on the data connection
    # the requests went to the request ports the sources' late-join options name, as UIMs
    assert sum(p["stats"]["recovery_requests"] for p in res.request_ports) >= 2 + len(res.receivers)
    assert all(p["stats"]["unknown_transport"] == 0 for p in res.request_ports)
    for c in res.contexts:
        for i, s in enumerate(c.sources, 1):
            (lj,) = [o for o in s.tir.options if isinstance(o, LateJoinOption)]
            assert (lj.src_tcp_port, lj.transport_idx) == (c.request_port, i)


def test_sim_request_options_parse_and_are_checked():
    cfg, _ = parse_args(["--data-bytes", "1M", "--requests", "20", "--request-interval", "5",
                         "--retention", "100", "--late-join", "--otr", "--data-drop-every", "9"])
    assert (cfg.requests, cfg.request_interval, cfg.retention, cfg.late_join, cfg.otr,
            cfg.data_drop_every) == (20, 5, 100, True, True, 9)
    for argv, msg in ((["--requests", "2"], "TCP sources with --data-bytes"),
                      (["--transport", "lbtru", "--data-datagrams", "9", "--requests", "2"], "TCP sources"),
                      (["--data-bytes", "1M", "--late-join"], "retention buffer"),
                      (["--data-bytes", "1M", "--data-drop-every", "3"], "only with --otr")):
        with pytest.raises(Exception, match=msg):
            parse_args(argv)
