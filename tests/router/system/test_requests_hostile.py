"""Requests and responses across a router pair, hostile and failing cases
(router.relays.responses): 10,000 distinct requesters at once, a requester
gone before its responses, a RESPONSE stream naming a requester the origin's
router never saw, and a peer that does not relay responses. Bounded, counted,
and the session's data keeps flowing."""

from __future__ import annotations

import socket

import trio

from lbmr_proto import lbmc, lbmc_stream
from router import peerlink as P
from router.core.request_maps import DEFAULT_MAX_LISTENERS, DEFAULT_SPARE_LISTENERS
from router.link import StreamState
from router.relays import responses as RS
from tests.router.helpers import (
    REQ_TOPIC,
    Responders,
    resolve,
    start_forwarded_pair,
    start_requester,
    udp,
)


async def ticks_after(proxy, n=20, timeout=10.0) -> list[int]:
    """The sqns of ``n`` plain messages a new receiver of the session at ``proxy`` gets."""
    framer = lbmc_stream.StreamFramer()
    sqns: list[int] = []
    with trio.fail_after(timeout):
        async with await trio.open_tcp_stream(*proxy) as s:
            while len(sqns) < n:
                data = await s.receive_some(65536)
                assert data
                sqns += [lbmc.decode(m).sqn for m in framer.feed(data) if m[1] == lbmc.NHDR_DATA]
    return sqns


async def test_ten_thousand_requesters_are_bounded_and_counted_and_data_flows():
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        req, scope = await start_requester(n, trd1, count=10_000, interval=0.002, spread=True, burst=10)
        tir = await resolve(udp("127.0.2.9"), trd2, topic=REQ_TOPIC)
        proxy = (tir.transport.ip, tir.transport.port)
        rsp = Responders(proxy, per_request=0)  # reads them all, answers none
        await rsp.run(until=10_000, timeout=60)
        assert [h.qidx for h in rsp.requests] == list(range(100, 10_100))  # every request delivered, in order
        c = rb.counters
        requests = rb.relay.requests
        assert len(requests.map) == DEFAULT_MAX_LISTENERS  # bounded ...
        assert len(requests.map.spares()) <= DEFAULT_SPARE_LISTENERS
        assert c["request_listeners_opened"] == DEFAULT_MAX_LISTENERS
        # ... and every request counted: mapped, or passed as it was (no listener ready at once, or full)
        assert c["requests_rewritten"] + c["requests_unmapped_waiting"] + c["requests_unmapped_full"] == 10_000
        assert c["requests_unmapped_full"] >= 10_000 - DEFAULT_MAX_LISTENERS - c["requests_unmapped_waiting"] > 0
        mapped = {(h.ipaddr, h.port) for h in rsp.requests if h.ipaddr == "127.0.2.1"}
        assert len(mapped) == DEFAULT_MAX_LISTENERS
        # the origin's router records a bounded number of requesters per session
        assert len(rb.relay.responses.requesters) == 0 and 0 < len(ra.relay.responses.requesters) <= 64
        # the session goes on: a new receiver gets whole, consecutive messages
        sqns = await ticks_after(proxy)
        assert sqns == list(range(sqns[0], sqns[0] + len(sqns))) and sqns[0] >= 10_000
        n.cancel_scope.cancel()


def free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


async def test_a_requester_gone_is_counted_and_stalls_nothing():
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        gone = free_port("127.0.1.5")  # nobody listens there: the requester went away
        req, scope = await start_requester(n, trd1, count=20, request_port=gone)
        tir = await resolve(udp("127.0.2.9"), trd2, topic=REQ_TOPIC)
        proxy = (tir.transport.ip, tir.transport.port)
        rsp = Responders(proxy)
        await rsp.run(until=20)
        with trio.fail_after(10):
            while ra.counters["responses_requester_gone"] < 20 or rb.counters["response_streams_refused"] < 20:
                await trio.sleep(0.02)
        assert ra.counters["responses_delivered"] == 0 and not req.responses
        with trio.fail_after(5):  # every responder connection let go at B
            while rb.relay.requests.map.responders:
                await trio.sleep(0.02)
        sqns = await ticks_after(proxy)
        assert sqns == list(range(sqns[0], sqns[0] + len(sqns)))
        n.cancel_scope.cancel()


async def test_a_response_stream_for_a_requester_never_seen_is_refused():
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        req, scope = await start_requester(n, trd1, count=5)
        tir = await resolve(udp("127.0.2.9"), trd2, topic=REQ_TOPIC)
        await Responders((tir.transport.ip, tir.transport.port), per_request=0).run(until=5)
        victim_hits = []
        victim = await trio.open_tcp_listeners(0, host="127.0.1.66")
        n.start_soon(trio.serve_listeners, lambda s: victim_hits.append(s), victim)
        # router B (a peer gone wrong) asks A to deliver to an address no request named
        link = rb.link
        (proxy_id,) = rb.relay.requests.map.slots()[0].key.origin,
        aid = rb.relay.site.proxy_advert(proxy_id)
        victim_addr = victim[0].socket.getsockname()
        wrong = [victim_addr, (req.request_ip, req.request_port + 1)]
        states = []
        for ip, port in wrong:
            sid = link.streams.open(aid, P.StreamKind.RESPONSE, P.ResponseTarget(ip, port))
            states.append(link.state.setdefault(sid, StreamState(sid, P.StreamKind.RESPONSE)))
        link.flush_streams()
        with trio.fail_after(5):
            for st in states:
                await st.accepted.wait()
        assert [st.refused for st in states] == ["requester not seen"] * 2
        assert ra.counters["responses_refused_unseen"] == 2 and not victim_hits
        for st in states:
            link.close_stream(st)
        n.cancel_scope.cancel()


async def test_a_peer_without_responses_gets_the_requests_unchanged(monkeypatch):
    async with trio.open_nursery() as n:
        monkeypatch.setattr(P, "DEFAULT_CAPABILITIES", P.DEFAULT_CAPABILITIES & ~P.Capability.RESPONSES)
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)  # (both read it: an older pair)
        assert not rb.link.capabilities & P.Capability.RESPONSES
        req, scope = await start_requester(n, trd1, count=10)
        tir = await resolve(udp("127.0.2.9"), trd2, topic=REQ_TOPIC)
        rsp = Responders((tir.transport.ip, tir.transport.port), per_request=0)
        await rsp.run(until=10)
        assert {(h.ipaddr, h.port) for h in rsp.requests} == {(req.request_ip, req.request_port)}
        assert rb.counters["requests_unmapped_peer"] == 10 and rb.counters["requests_rewritten"] == 0
        assert not len(rb.relay.requests.map)
        assert rb.relay.requests.map.spares() == []  # no listener bound where none can be used
        n.cancel_scope.cancel()



async def test_nobody_can_queue_a_connection_on_a_spare_listener():
    """A spare stands for no requester yet: it refuses connections (a connection queued
    there would later be taken for a responder of whoever the spare is given to)."""
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        req, scope = await start_requester(n, trd1, count=3)
        tir = await resolve(udp("127.0.2.9"), trd2, topic=REQ_TOPIC)
        await Responders((tir.transport.ip, tir.transport.port), per_request=0).run(until=3)
        spares = rb.relay.requests.map.spares()
        assert len(spares) == DEFAULT_SPARE_LISTENERS
        for addr in spares:
            with socket.socket() as s:
                assert s.connect_ex(addr) != 0
        (slot,) = rb.relay.requests.map.slots()
        with socket.socket() as s:  # the one standing for the requester takes them
            assert s.connect_ex(slot.listener) == 0
        n.cancel_scope.cancel()



async def test_response_streams_for_one_requester_are_bounded(monkeypatch):
    """A peer gone wrong opens many RESPONSE streams for one requester a request did name:
    router A connects to it at most MAX_RESPONSES_PER_REQUESTER times at once; the rest are
    refused, counted (one small message from a peer never makes a crowd of connections)."""
    monkeypatch.setattr(RS, "MAX_RESPONSES_PER_REQUESTER", 2, raising=False)
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n)
        req, scope = await start_requester(n, trd1, count=5)
        tir = await resolve(udp("127.0.2.9"), trd2, topic=REQ_TOPIC)
        await Responders((tir.transport.ip, tir.transport.port), per_request=0).run(until=5)
        link = rb.link
        (proxy_id,) = rb.relay.requests.map.slots()[0].key.origin,
        aid = rb.relay.site.proxy_advert(proxy_id)
        before = len(req.callers)
        states = []
        for _ in range(6):
            sid = link.streams.open(aid, P.StreamKind.RESPONSE, P.ResponseTarget(req.request_ip, req.request_port))
            states.append(link.state.setdefault(sid, StreamState(sid, P.StreamKind.RESPONSE)))
        link.flush_streams()
        with trio.fail_after(5):
            for st in states:
                await st.accepted.wait()
        assert sum(st.refused is None for st in states) == 2
        assert [st.refused for st in states if st.refused] == ["too many responses open"] * 4
        assert ra.counters["responses_refused_busy"] == 4 and ra.counters["responses_delivered"] == 2
        await trio.sleep(0.2)
        assert len(req.callers) - before == 2
        for st in states:
            link.close_stream(st)
        n.cancel_scope.cancel()
