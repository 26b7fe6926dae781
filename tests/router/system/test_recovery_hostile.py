"""Hostile late-join and OTR traffic across routers: a source whose TIR names a
request port the router must not connect to (router A's own loopback while its
endpoint is not on loopback; tests/router/system/recovery_source_scenario.py in a
network namespace the test creates, where TRD1 and TRD2 are local, non-loopback
networks; the namespace is removed even when the test fails), and more RECOVERY
streams than router A serves at once (on loopback)."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import trio

import lbmr_proto as L
from lbmr_proto import lbmc
from router.config.model import RequestListener
from router.core.request_maps import RequestMap
from router.relays import recovery as RV
from tests import netns
from tests.router.helpers import LJ_TIDX, resolve, retaining_source, start_forwarded_pair, udp
from tests.router.system.recovery_source_scenario import TRD_NETS

netns_factory = netns.netns_factory  # the fixture

ROOT = Path(__file__).resolve().parents[3]


def test_a_tir_naming_the_routers_own_loopback_as_request_port_makes_no_connection(netns_factory):
    ns = netns_factory()
    for net in TRD_NETS:
        ns.ip("route", "add", "local", net, "dev", "lo")
    r = ns.run([sys.executable, "-m", "tests.router.system.recovery_source_scenario"], cwd=ROOT, timeout=40)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["b"]["recovery_requests"] == 1 and out["b"]["recovery_streams_opened"] == 1, out
    assert out["accepted"] == [], out  # router A connected nowhere on the TIR's word
    assert out["a"] == {"recovery_refused_source_address": 1, "recovery_streams_accepted": 0,
                        "recovery_source_unreachable": 0}, out
    assert out["b"]["recovery_streams_refused_by_peer"] == 1, out


# ------------------------------------------------------------------ on loopback

RCV = "127.0.2.9"
LISTENER = RequestListener(port=15393)  # each router's <request-tcp>


async def settled(cond, timeout=10.0):
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.02)


async def test_recovery_streams_beyond_the_bound_are_refused_however_long_the_others_live(monkeypatch):
    """Router A serves at most MAX_STREAMS RECOVERY streams per endpoint and link (a
    listener and a connection to the source each). A stream whose slot sat without an
    answer connection past the request map's idle timeout is still open: it keeps its
    place (its listener still takes the source's answers), and a new one is refused."""
    monkeypatch.setattr(RV, "MAX_STREAMS", 2, raising=False)
    # (a map that would expire idle slots after 0.5 s, were the relay to let it)
    monkeypatch.setattr(RV, "RequestMap", functools.partial(RequestMap, max_listeners=2, idle_timeout=0.5))
    async with trio.open_nursery() as n:
        ra, rb, fwd, trd1, trd2 = await start_forwarded_pair(n, request_listener=LISTENER)
        await retaining_source(n, trd1, rate=200)
        tir = await resolve(udp(RCV), trd2)
        (lj,) = [o for o in tir.options if isinstance(o, L.LateJoinOption)]
        sinks = [trio.socket.socket() for _ in range(3)]
        for s in sinks:  # the receivers' request ports: they take (and drop) what comes
            await s.bind((RCV, 0))
            s.listen(4)
        ca = ra.counters
        uim = await trio.open_tcp_stream(lj.src_ip_addr, lj.src_tcp_port)
        for k, s in enumerate(sinks[:2]):
            await uim.send_all(control(lbmc.UmeRxReqHeader(0, k, lj.transport_idx, LJ_TIDX, 10**9, s.getsockname()[1], 0,
                                                          RCV)))
        await settled(lambda: ca["recovery_streams_accepted"] == 2)
        await trio.sleep(1.5)  # past the idle timeout such a map would expire them at
        await uim.send_all(control(lbmc.UmeRxReqHeader(0, 2, lj.transport_idx, LJ_TIDX, 10**9, sinks[2].getsockname()[1],
                                                      0, RCV)))
        await settled(lambda: ca["recovery_refused_busy"] == 1)
        assert ca["recovery_streams_accepted"] == 2 and len(ra.relay.recovery.map) == 2
        # router B counts the refusal when it reaches it across the link: wait for it
        await settled(lambda: rb.uim.counters["recovery_streams_refused_by_peer"] == 1)
        await uim.aclose()
        for s in sinks:
            s.close()
        n.cancel_scope.cancel()


def control(*headers) -> bytes:
    return lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=headers))
