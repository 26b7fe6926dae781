"""Requests and responses across routers (router.relays.responses, the message
path's request mapping): a UM-like requester (a TCP source whose messages are
requests) in TRD1, responders in the receivers' TRD; the routers rewrite each
REQUEST header to a request listener of the receivers' router and carry every
responder's connection back to the requester as a RESPONSE stream, the request
index and the response bytes unchanged. Pair and chain of three on loopback."""

from __future__ import annotations

import trio

from lbmr_proto import lbmc
from tests.router.helpers import (
    REQ_TOPIC,
    Responders,
    RuMessages,
    RuRequester,
    request_payload,
    resolve,
    response_payload,
    start_forwarded_chain,
    start_forwarded_pair,
    start_requester,
    start_ru_requester,
    udp,
)
from tests.tshark_judge import compare_lbmc, run_tshark_lbmc, segments, write_lbttcp_pcap


async def settled(cond, timeout=10.0):
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.02)


def check_answers(req, qidxs, per_request):
    """Every request answered ``per_request`` times, with its qidx and payload, nothing else."""
    want = {(q, response_payload(q, k)): 1 for q in qidxs for k in range(per_request)}
    assert dict(req.answers()) == want


async def test_twenty_requests_across_a_pair_get_twenty_responses(tmp_path):
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        req, scope = await start_requester(n, trd1, count=20)
        tir = await resolve(udp("127.0.2.9"), trd2, topic=REQ_TOPIC)
        rsp = Responders((tir.transport.ip, tir.transport.port))
        await rsp.run(until=20)
        await settled(lambda: len(req.responses) >= 20)
        # each request reached the responder pointing at B's listener in TRD2, the index unchanged
        assert [h.qidx for h in rsp.requests] == list(range(100, 120))
        assert rsp.payloads == [request_payload(q) for q in range(100, 120)]
        ((ip, port),) = {(h.ipaddr, h.port) for h in rsp.requests}  # one listener for the one requester
        assert ip == "127.0.2.1" and port != req.request_port
        assert rsp.failed == 0
        check_answers(req, range(100, 120), 1)
        # the requester's listener saw router A's connections from its endpoint's address
        # in TRD1, never the responder's
        assert len(req.callers) == 20 and {ip for ip, _ in req.callers} == {"127.0.1.1"}
        cb, ca = rb.counters, ra.counters
        assert cb["request_listeners_opened"] == 1 and cb["requests_rewritten"] == 20
        assert cb["response_streams_opened"] == 20 and ca["responses_delivered"] == 20
        assert ca["responses_refused_unseen"] == 0
        scope.cancel()
        n.cancel_scope.cancel()
    # the rewritten requests, as the receiver got them, decode in Wireshark with no expert
    msgs = [m for m in rsp.first if m[1] == lbmc.RequestHeader.CODE]
    assert len(msgs) == 20
    pcap = tmp_path / "requests.pcap"
    write_lbttcp_pcap(pcap, [(True, s) for s in segments(msgs)], source=(tir.transport.ip, tir.transport.port))
    frames = run_tshark_lbmc(pcap, port=tir.transport.port)
    layers = [layer for f in frames for layer in f.lbmc]
    assert len(layers) == 20 and not any(f.flagged for f in frames)
    assert [compare_lbmc(layer, lbmc.decode(m)) for layer, m in zip(layers, msgs, strict=True)] == [[]] * 20


async def test_two_responders_per_request_give_forty_responses():
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        req, scope = await start_requester(n, trd1, count=20)
        tir = await resolve(udp("127.0.2.9"), trd2, topic=REQ_TOPIC)
        rsp = Responders((tir.transport.ip, tir.transport.port), per_request=2)
        await rsp.run(until=20)
        await settled(lambda: len(req.responses) >= 40)
        check_answers(req, range(100, 120), 2)
        assert rb.counters["response_streams_opened"] == 40
        n.cancel_scope.cancel()


async def test_a_chain_of_three():
    async with trio.open_nursery() as n:
        r1, r2, r3, f12, f32, trds, ips = await start_forwarded_chain(n)
        req, scope = await start_requester(n, trds[1], count=20)
        tir = await resolve(udp("127.0.3.9"), trds[3], timeout=20, topic=REQ_TOPIC)
        rsp = Responders((tir.transport.ip, tir.transport.port), bind_ip="127.0.3.30")
        await rsp.run(until=20)
        await settled(lambda: len(req.responses) >= 20)
        assert [h.qidx for h in rsp.requests] == list(range(100, 120))
        assert {h.ipaddr for h in rsp.requests} == {"127.0.3.1"}
        check_answers(req, range(100, 120), 1)
        assert all(ip != rsp.bind_ip for ip, _ in req.callers)
        # the middle router took each response from r3 to its own listener and on towards r1
        (middle,) = [s["counters"] for s in r2.portal_summary()]
        assert middle["responses_delivered"] == 20 and middle["response_streams_opened"] == 20
        assert middle["requesters_recorded"] == 1 and middle["request_listeners_opened"] == 1
        n.cancel_scope.cancel()


async def test_twenty_requests_of_an_lbtru_origin_across_a_pair():
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        req, src, scope = await start_ru_requester(n, trd1, count=20)
        tir = await resolve(udp("127.0.2.9"), trd2, topic=REQ_TOPIC)
        rx = RuMessages((tir.transport.ip, tir.transport.port), expect=20 + RuRequester.LEAD + 5, session_id=tir.transport.session_id)
        result = await rx.run()
        assert result.error is None, result.error
        rsp = Responders((tir.transport.ip, tir.transport.port))
        await rsp.answer(rx.messages)
        assert [h.qidx for h in rsp.requests] == list(range(100, 120))
        assert rsp.payloads == [request_payload(q) for q in range(100, 120)]
        assert {(h.ipaddr, h.port) for h in rsp.requests} == {rb.relay.requests.map.slots()[0].listener}
        await settled(lambda: len(req.responses) >= 20)
        check_answers(req, range(100, 120), 1)
        assert ra.counters["responses_delivered"] == 20 and rb.counters["requests_rewritten"] == 20
        n.cancel_scope.cancel()


async def test_an_lbtru_origin_across_a_chain_of_three():
    async with trio.open_nursery() as n:
        r1, r2, r3, f12, f32, trds, ips = await start_forwarded_chain(n)
        req, src, scope = await start_ru_requester(n, trds[1], count=20)
        tir = await resolve(udp("127.0.3.9"), trds[3], timeout=20, topic=REQ_TOPIC)
        rx = RuMessages((tir.transport.ip, tir.transport.port), expect=20 + RuRequester.LEAD + 5, bind_ip="127.0.3.31",
                        session_id=tir.transport.session_id)
        result = await rx.run()
        assert result.error is None, result.error
        rsp = Responders((tir.transport.ip, tir.transport.port), bind_ip="127.0.3.30")
        await rsp.answer(rx.messages)
        assert [h.qidx for h in rsp.requests] == list(range(100, 120))
        assert {h.ipaddr for h in rsp.requests} == {"127.0.3.1"}
        await settled(lambda: len(req.responses) >= 20)
        check_answers(req, range(100, 120), 1)
        n.cancel_scope.cancel()
