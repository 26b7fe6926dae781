"""Remote domain route records (LBMR extended type 0x06) of an endpoint
portal (router/core/tr/domain_routes.py): the domains the router reaches,
through the router's request listener in the TRD (the portal's
``request_address``, its UIM listener), on the DRO's ``<domain-route>`` timing
(min 100 ms doubling to max 1000 ms), within its rate limit (50 domains a
second), announced again at once when the set changes, and in answer to TR
requests; the router's core feeds them from its routes; tshark decodes them.
Times are the portal's ``now`` arguments."""

from __future__ import annotations

import itertools

import pytest

import lbmr_proto as L
from lbmr_proto.capture import PcapWriter
from lbmr_proto.constants import (
    TRREQ_GATEWAY_META,
    TRREQ_QUERY,
    TRREQ_WILDCARD_QUERY,
    PacketType,
    SourceType,
)
from router import peerlink as P
from router.core.acl import OPEN
from router.core.router_core import EndpointRules, LinkSpec, RouterCore, SendFrame, SendTR
from router.core.routing import Routing
from router.core.tr import DomainRoutes, PortalTR, PortalTRSettings
from router.core.tr.domain_routes import MAX_DOMAIN_ROUTES
from tests.router.helpers import GROUP, run_until
from tests.tshark_judge import compare, expected_fields, flatten, run_tshark

LISTENER = ("10.1.0.9", 14391)  # the router's request listener in TRD 1
APP = ("10.1.0.5", 12965)


def routes_portal(**dr) -> PortalTR:
    """A multicast portal of domain 1 at time 0 that announces routes through LISTENER."""
    return PortalTR(PortalTRSettings("A", 1, src_id=b"AAAAAAAA", mode="multicast", multicast=GROUP,
                                     request_address=LISTENER, domain_routes=DomainRoutes(**dr)), now=0.0)


def records(out) -> list[L.RemoteDomainRoute]:
    """The remote domain route records in the datagrams ``out``."""
    got = []
    for o in out:
        pkt = L.decode(o.data)
        if pkt.type == PacketType.EXT and isinstance(pkt.ext, L.RemoteDomainRoute):
            got.append(pkt.ext)
    return got


def sent(log) -> list[tuple[float, list[int]]]:
    """(time, domain ids) of every route record of a run_until log."""
    return [(t, r.domains) for t, out, _ in log for r in records(out)]


def times_of(log, domain: int) -> list[float]:
    return [round(t, 6) for t, doms in sent(log) if domain in doms]


def tr_request(flags: int, src_id: bytes = b"APPCTX01") -> bytes:
    return L.Packet(PacketType.EXT, 1, ext=L.TopicResRequest(flags),
                    options=[L.SourceIdOption(0x8000, src_id)]).encode()


# ------------------------------------------------------------------ what and when


def test_each_reachable_domain_is_announced_at_once_then_at_doubling_gaps_up_to_max():
    tr = routes_portal()
    tr.set_reachable_domains([1, 2, 3], 0.0)
    assert tr.reachable_domains() == [2, 3]  # our own TRD's id is never announced
    log = run_until(tr, 6.0)
    assert times_of(log, 2) == times_of(log, 3)
    times = times_of(log, 2)
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(times)]
    assert times[0] == 0.0
    assert gaps[:4] == [0.1, 0.2, 0.4, 0.8]  # min-interval, doubling ...
    assert set(gaps[4:]) == {1.0}  # ... up to max-interval, for ever
    assert all(doms == [2, 3] for _, doms in sent(log))
    for _, out, _ in log:
        for o in out:
            pkt = L.decode(o.data)
            if pkt.type != PacketType.EXT:
                continue
            assert (pkt.ext.ip, pkt.ext.port) == LISTENER and o.dest == GROUP
            opts = {type(op): op for op in pkt.options}
            assert opts[L.SourceTypeOption].src_type == SourceType.TNWGD
            assert opts[L.LocalDomainOption].local_domain_id == 1
            assert opts[L.SourceIdOption].src_id == b"AAAAAAAA"


def test_the_dro_timing_is_configurable():
    tr = routes_portal(min_interval=0.25, max_interval=0.5)
    tr.set_reachable_domains([7], 0.0)
    times = times_of(run_until(tr, 3.0), 7)
    assert [round(b - a, 6) for a, b in itertools.pairwise(times)][:4] == [0.25, 0.5, 0.5, 0.5]


def test_no_records_without_settings_or_without_another_domain():
    plain = PortalTR(PortalTRSettings("A", 1, src_id=b"AAAAAAAA", mode="multicast", multicast=GROUP), now=0.0)
    plain.set_reachable_domains([2, 3], 0.0)
    assert plain.reachable_domains() == [] and not sent(run_until(plain, 3.0))
    tr = routes_portal()
    tr.set_reachable_domains([1], 0.0)  # only our own
    assert not sent(run_until(tr, 3.0))
    assert tr.stats()["domain_routes"] == 0


def test_a_change_of_reachable_domains_is_announced_at_once_and_a_lost_one_no_more():
    tr = routes_portal()
    tr.set_reachable_domains([2, 3], 0.0)
    run_until(tr, 5.2)
    tr.set_reachable_domains([2, 4], 5.2)  # 3 lost, 4 new
    log = run_until(tr, 8.0)
    assert times_of(log, 4)[:3] == [5.2, 5.3, 5.5]  # at once, then the doubling again
    assert times_of(log, 3) == []
    assert [round(b - a, 6) for a, b in itertools.pairwise(times_of(log, 2))] == [1.0, 1.0]  # unchanged
    st = tr.stats()
    assert (st["domain_routes_added"], st["domain_routes_removed"], st["domain_routes"]) == (3, 1, 2)


def test_domains_due_together_share_datagrams_up_to_max_datagram():
    tr = routes_portal(limit=(0.0, 0.0))
    tr.set_reachable_domains(range(2, 1002), 0.0)
    out = tr.tick(0.0)
    recs = records(out)
    assert sorted(d for r in recs for d in r.domains) == list(range(2, 1002))
    assert all(len(o.data) <= 1400 for o in out)
    assert len(recs) == 3  # (1400 - 16 - trailer) // 4 ids a datagram


def test_domains_beyond_the_bound_are_refused_and_counted():
    tr = routes_portal(limit=(0.0, 0.0))
    tr.set_reachable_domains(range(2, MAX_DOMAIN_ROUTES + 12), 0.0)
    assert len(tr.reachable_domains()) == MAX_DOMAIN_ROUTES
    assert tr.stats()["domain_routes_refused"] == 10


# ------------------------------------------------------------------ rate limit


def test_records_keep_to_the_rate_limit_and_held_back_domains_share_datagrams():
    tr = routes_portal()  # the DRO's default: 50 domains a second
    tr.set_reachable_domains(range(2, 302), 0.0)
    log = run_until(tr, 12.0)
    stamps = sorted(t for t, doms in sent(log) for _ in doms)
    for start in (0.0, 1.0, 2.5, 5.0, 10.0):  # any window: at most the burst plus 50 a second
        n = sum(1 for t in stamps if start <= t < start + 1.0)
        assert n <= 50 + 50, (start, n)
    assert sum(1 for t in stamps if t < 10.0) <= 50 * 10 + 50
    first = {}
    for t, doms in sent(log):
        for d in doms:
            first.setdefault(d, t)
    assert sorted(first) == list(range(2, 302))  # every domain gets its turn
    assert max(first.values()) < 6.5  # 300 domains at 50 a second, after a burst of 50
    st = tr.stats()
    assert st["domain_routes_deferred"] > 0
    assert st["route_datagrams_sent"] < st["domain_routes_sent"] / 3  # batched in 100 ms steps


def test_the_bits_limit_holds_too():
    tr = routes_portal(limit=(8000.0, 0.0))  # 1000 bytes a second
    tr.set_reachable_domains(range(2, 202), 0.0)
    log = run_until(tr, 10.0)
    nbytes = sum(len(o.data) for t, out, _ in log if 2.0 <= t < 10.0 for o in out if records([o]))
    assert nbytes <= 1000 * 8 + 1400


# ------------------------------------------------------------------ TR requests


def test_a_tr_request_for_gateway_meta_is_answered_at_once_without_restarting_the_doubling():
    tr = routes_portal()
    tr.set_reachable_domains([2, 3], 0.0)
    run_until(tr, 5.6)  # last record at 5.5, next at 6.5
    tr.on_datagram(tr_request(TRREQ_GATEWAY_META), APP, 5.7)
    assert [r.domains for r in records(tr.tick(5.7))] == [[2, 3]]
    log = run_until(tr, 8.0)
    assert times_of(log, 2) == [6.7, 7.7]  # max-interval from the answer on
    assert tr.stats()["route_requests_answered"] == 1


def test_an_answer_waits_min_interval_after_the_last_record():
    tr = routes_portal()
    tr.set_reachable_domains([2], 0.0)
    run_until(tr, 5.5)  # a record at 5.5
    tr.on_datagram(tr_request(TRREQ_GATEWAY_META), APP, 5.55)
    assert records(tr.tick(5.55)) == []
    assert times_of(run_until(tr, 5.7), 2) == [5.6]


def test_other_tr_requests_are_not_answered_with_routes():
    tr = routes_portal()
    tr.set_reachable_domains([2], 0.0)
    run_until(tr, 5.6)
    tr.on_datagram(tr_request(TRREQ_QUERY | TRREQ_WILDCARD_QUERY), APP, 5.7)
    assert records(tr.tick(5.7)) == []
    st = tr.stats()
    assert st["tr_requests_received"] == 1 and "route_requests_answered" not in st


def test_a_stream_of_tr_requests_costs_one_answer_per_min_interval():
    tr = routes_portal(limit=(0.0, 0.0))
    tr.set_reachable_domains(range(2, 12), 0.0)
    run_until(tr, 5.6)
    data = tr_request(TRREQ_GATEWAY_META)
    n = 0
    for i in range(10_000):  # 10,000 requests in one second
        now = 5.6 + i / 10_000
        tr.on_datagram(data, APP, now)
        if tr.next_deadline() <= now:
            n += len(records(tr.tick(now)))
    st = tr.stats()
    assert st["route_requests_answered"] <= 11  # one per 100 ms
    assert st["route_requests_ignored"] >= 10_000 - 11
    assert n <= 11 + 1


# ------------------------------------------------------------------ tshark


def test_tshark_decodes_the_records_with_no_expert(tmp_path):
    tr = routes_portal(limit=(0.0, 0.0))
    tr.set_reachable_domains([2, 0xFFFFFFFF, *range(100, 500)], 0.0)
    out = tr.tick(0.0)
    tr.set_reachable_domains([2, 9], 0.5)
    out += [o for o in tr.tick(0.5) if records([o])]
    path = tmp_path / "routes.pcap"
    with PcapWriter(path) as w:
        for i, o in enumerate(out):
            w.write_udp(1_700_000_000 + i / 1000, "10.1.0.1", 14402, *o.dest, o.data)
    frames = run_tshark(path, GROUP[1])
    assert len(frames) == len(out) >= 3
    for f, o in zip(frames, out, strict=True):
        assert f.lbmr is not None and not f.malformed and f.experts == [], (f, o.data.hex())
        assert compare(flatten(f.lbmr), expected_fields(L.decode(o.data))) == []


# ------------------------------------------------------------------ the router's core


def core(name: str, domain: int, listener: tuple[str, int]) -> RouterCore:
    tr = PortalTR(PortalTRSettings(name, domain, src_id=name.encode().ljust(8, b"_"), mode="multicast",
                                   multicast=GROUP, request_address=listener, domain_routes=DomainRoutes()),
                  now=0.0)
    return RouterCore(name, {name: tr}, {name: EndpointRules(domain, OPEN, 1.0, 100)},
                      [LinkSpec("peer", "peer", (name,), 1, OPEN, True)],
                      Routing(name, {domain: 1}, now=0.0), now=0.0)


def carry(a: RouterCore, b: RouterCore, now: float) -> list[SendTR]:
    """Carry each core's frames to the other; their TR datagrams."""
    tr = []
    for _ in range(4):
        for src, dst in ((a, b), (b, a)):
            for o in src.outputs():
                if isinstance(o, SendFrame) and isinstance(o.frame, P.Topology | P.Interest | P.Advertisement):
                    dst.link_frame("peer", o.frame, now)
                elif isinstance(o, SendTR):
                    tr.append(o)
    return tr


def test_each_router_announces_the_domains_its_routes_reach_and_stops_when_the_link_goes():
    a, b = core("A", 1, ("10.1.0.9", 14391)), core("B", 2, ("10.2.0.9", 14391))
    assert a.portal("A").tr.reachable_domains() == []  # alone: nothing to announce
    caps = int(P.DEFAULT_CAPABILITIES | P.Capability.ROUTING)
    a.link_up("peer", P.PeerInfo("B", (2,), 1, caps, (1, 0)), caps, 0.0)
    b.link_up("peer", P.PeerInfo("A", (1,), 1, caps, (1, 0)), caps, 0.0)
    carry(a, b, 0.0)
    assert a.portal("A").tr.reachable_domains() == [2]
    assert b.portal("B").tr.reachable_domains() == [1]
    a.tick(0.0)
    b.tick(0.0)
    heard = {(o.endpoint, r.ip, tuple(r.domains)) for o in carry(a, b, 0.0) for r in records([o])}
    assert heard == {("A", "10.1.0.9", (2,)), ("B", "10.2.0.9", (1,))}
    a.link_down("peer", 0.5)
    assert a.portal("A").tr.reachable_domains() == []
    a.tick(2.0)
    assert not [r for o in a.outputs() if isinstance(o, SendTR) for r in records([o])]


def test_a_router_joining_two_trds_directly_announces_each_to_the_other():
    tr = {e: PortalTR(PortalTRSettings(e, d, src_id=e.encode().ljust(8, b"_"), mode="multicast", multicast=GROUP,
                                       request_address=(f"10.{d}.0.9", 14391), domain_routes=DomainRoutes()),
                      now=0.0)
          for e, d in (("E1", 1), ("E2", 2))}
    links = [LinkSpec("E1<->E2@E1", "E1<->E2", ("E1",), 1, OPEN, False, pair="E1<->E2@E2"),
             LinkSpec("E1<->E2@E2", "E1<->E2", ("E2",), 1, OPEN, False, pair="E1<->E2@E1")]
    c = RouterCore("R", tr, {"E1": EndpointRules(1, OPEN, 1.0, 100), "E2": EndpointRules(2, OPEN, 1.0, 100)},
                   links, Routing("R", {1: 1, 2: 1}, now=0.0), now=0.0)
    c.tick(0.0)
    heard = {(o.endpoint, r.ip, tuple(r.domains)) for o in c.outputs() if isinstance(o, SendTR)
             for r in records([o])}
    assert heard == {("E1", "10.1.0.9", (2,)), ("E2", "10.2.0.9", (1,))}


def test_settings_refuse_an_address_applications_cannot_use_and_bad_timing():
    for bad in (dict(min_interval=0.0), dict(min_interval=2.0, max_interval=1.0), dict(limit=(-1.0, 50.0))):
        with pytest.raises(ValueError):
            DomainRoutes(**bad)
    # the records name the request listener: there must be one, and one UM contexts can connect to
    for bad in (None, ("0.0.0.0", 14391), ("10.0.0.1", 0), ("10.0.0.1", 70000), ("10.0.0.300", 14391)):
        with pytest.raises(ValueError):
            PortalTRSettings("A", 1, src_id=b"AAAAAAAA", mode="multicast", multicast=GROUP,
                             request_address=bad, domain_routes=DomainRoutes())
    # without domain routes, no records (the listener still serves late join)
    tr = PortalTR(PortalTRSettings("A", 1, src_id=b"AAAAAAAA", mode="multicast", multicast=GROUP,
                                   request_address=LISTENER), now=0.0)
    tr.set_reachable_domains([2], 0.0)
    assert tr.reachable_domains() == [] and not records(tr.tick(0.0))
