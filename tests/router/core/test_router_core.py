"""The router's control plane as one sans-IO core (router/core/router_core.py):
its calling contract (TR datagrams, link up / frames / down, proxies
listening, sessions ended, ticks in; typed outputs out), two routers' cores
wired back to back in memory, session ends on explicit times, and the
handshake's policy."""

from __future__ import annotations

import lbmr_proto as L
from router import peerlink as P
from router.core.acl import OPEN
from router.core.router_core import (
    EndpointRules,
    LinkSpec,
    Notice,
    RouterCore,
    SendFrame,
    SendTR,
    StartProxy,
)
from router.core.routing import Routing
from router.core.tr import PortalTR, PortalTRSettings
from tests.router.helpers import APP, GROUP, OTID, TOPIC, dgram, source_tir

RELAY = ("10.2.0.1", 24000)
CAPS = int(P.DEFAULT_CAPABILITIES | P.Capability.ROUTING)


def core(name: str, endpoints: dict[str, int], peers: tuple[str, ...] = ("peer",), *,
         deletion_delay: float = 1.0) -> RouterCore:
    portals = {e: PortalTR(PortalTRSettings(e, d, src_id=e.encode().ljust(8, b"_")[:8], mode="multicast",
                                            multicast=GROUP, source_timeout=3.0, requery_interval=1.0), now=0.0)
               for e, d in endpoints.items()}
    rules = {e: EndpointRules(d, OPEN, deletion_delay, 100) for e, d in endpoints.items()}
    links = [LinkSpec(p, p, tuple(endpoints), 1, OPEN, True) for p in peers]
    return RouterCore(name, portals, rules, links, Routing(name, {d: 1 for d in endpoints.values()}, now=0.0),
                      now=0.0)


def peer_info(name: str, *domains: int) -> P.PeerInfo:
    return P.PeerInfo(name, domains, 1, CAPS, (1, 0))


def frames(outs, link: str = "peer") -> list:
    return [o.frame for o in outs if isinstance(o, SendFrame) and o.link == link]


def control(fs) -> list:
    return [f for f in fs if isinstance(f, P.Interest | P.Advertisement)]


def test_the_trds_interest_goes_out_on_the_link_as_typed_outputs():
    """A peer without route info is one hop away: the TRD's interest goes to it."""
    c = core("A", {"T1": 1})
    c.link_up("peer", peer_info("B", 2), int(P.DEFAULT_CAPABILITIES), 0.0)
    assert c.routing_counters["peers_without_routing"] == 1
    c.outputs()
    c.tr_datagram("T1", dgram(tqrs=[TOPIC]), APP, 0.1)
    out = c.outputs()
    assert all(isinstance(o, SendTR | SendFrame | Notice) for o in out)
    assert control(frames(out)) == [P.Interest(P.InterestAction.ADD, TOPIC, 1, P.PatternType.TOPIC)]
    c.link_frame("peer", P.Interest(P.InterestAction.ADD, "md.other", 2, P.PatternType.TOPIC), 0.15)
    c.tick(0.2)  # the peer's interest: the portal queries its TRD
    queries = [q.topic for o in c.outputs() if isinstance(o, SendTR) and o.endpoint == "T1"
               for q in L.decode(o.data).tqrs]
    assert queries == ["md.other"]


def pump(a: RouterCore, b: RouterCore, now: float, rounds: int = 5) -> list:
    """Carry each core's frames to the other (link "peer" on both); the outputs
    that are not frames, in order."""
    rest = []
    for _ in range(rounds):
        for src, dst in ((a, b), (b, a)):
            for o in src.outputs():
                if isinstance(o, SendFrame):
                    if isinstance(o.frame, P.Interest | P.Advertisement | P.Topology):
                        dst.link_frame("peer", o.frame, now)
                else:
                    rest.append((src, o))
    return rest


def test_two_cores_back_to_back_proxy_a_source_where_a_receiver_wants_it():
    """A receiver's query in B's TRD, a source in A's: B starts a proxy for A's
    advertisement and, once its listener is bound, advertises it in its TRD."""
    a, b = core("A", {"T1": 1}), core("B", {"T2": 2})
    a.link_up("peer", peer_info("B", 2), CAPS, 0.0)
    b.link_up("peer", peer_info("A", 1), CAPS, 0.0)
    pump(a, b, 0.0)
    b.tr_datagram("T2", dgram(tqrs=[TOPIC]), APP, 0.1)
    pump(a, b, 0.1)
    a.tr_datagram("T1", dgram(tirs=[source_tir()]), APP, 0.2)
    rest = pump(a, b, 0.2)
    (start,) = [o for src, o in rest if isinstance(o, StartProxy)]
    assert (start.link, start.endpoint, start.advert.topic, start.advert.otid) == ("peer", "T2", TOPIC, OTID)
    assert b.proxy_listening("peer", "T2", start.advert.advert_id, RELAY, 0.3)
    b.tick(0.3)
    tirs = [t for o in b.outputs() if isinstance(o, SendTR) for t in L.decode(o.data).tirs]
    assert [(t.topic, t.transport.ip, t.transport.port) for t in tirs] == [(TOPIC, *RELAY)]
    assert b.proxy_advert("peer", "T2", start.advert.advert_id) == start.advert.advert_id
    assert a.advert_source("peer", "T1", start.advert.advert_id) == source_tir().transport


def test_a_dead_sessions_sources_are_withdrawn_after_the_deletion_delay():
    """The relay says the source ended its session: its topics are queried at
    once, and those not heard are queried again halfway through the
    endpoint's deletion delay (one lost query or answer withdraws no live
    source); no TIR within the delay withdraws them, a TIR in time, to either
    query, keeps them (times are the caller's: no clock in the core)."""
    for heard_at in (None, 0.8, 1.2):
        a, b = core("A", {"T1": 1}, deletion_delay=1.0), core("B", {"T2": 2})
        a.link_up("peer", peer_info("B", 2), CAPS, 0.0)
        b.link_up("peer", peer_info("A", 1), CAPS, 0.0)
        b.tr_datagram("T2", dgram(tqrs=[TOPIC]), APP, 0.1)
        pump(a, b, 0.1)
        a.tr_datagram("T1", dgram(tirs=[source_tir()]), APP, 0.2)
        (start,) = [o for _, o in pump(a, b, 0.2) if isinstance(o, StartProxy)]
        a.outputs()
        a.session_ended("peer", "T1", start.advert.advert_id, 0.5)
        a.session_ended("peer", "T1", start.advert.advert_id, 0.6)  # once per session
        assert a.counters("peer", "T1")["sessions_ended"] == 1
        queries = []
        for now in (0.5, 0.8, 1.0, 1.2, 1.5):
            if now == heard_at:
                a.tr_datagram("T1", dgram(tirs=[source_tir()]), APP, now)
            assert a.next_deadline() <= 1.5
            a.tick(now)
            outs = a.outputs()
            if now < 1.5:  # (a source withdrawn is looked for again)
                queries += [(now, q.topic) for o in outs if isinstance(o, SendTR) for q in L.decode(o.data).tqrs]
            withdrawn = [f for f in frames(outs) if isinstance(f, P.Advertisement) and f.withdraw]
            assert len(withdrawn) == (1 if heard_at is None and now == 1.5 else 0)
        # asked at the end of session, and again at 1.0 unless answered
        assert queries == [(0.5, TOPIC)] + ([(1.0, TOPIC)] if heard_at != 0.8 else [])
        assert a.counters("peer", "T1")["sources_ended"] == (1 if heard_at is None else 0)
        assert a.counters("peer", "T1")["session_end_queries_again"] == (0 if heard_at == 0.8 else 1)


def test_a_second_link_to_the_same_router_is_refused_at_the_handshake():
    c = core("A", {"T1": 1}, peers=("p1", "p2"))
    assert c.accept_peer("p1", peer_info("B", 2)) == (True, "")
    c.link_up("p1", peer_info("B", 2), CAPS, 0.0)
    ok, why = c.accept_peer("p2", peer_info("B", 3))
    assert not ok and "already reaches that router" in why
    ok, why = c.accept_peer("p2", peer_info("C", 2))
    assert not ok and "domains [2]" in why
    assert c.accept_peer("p2", peer_info("C", 3)) == (True, "")
    c.link_down("p1", 0.1)
    assert c.accept_peer("p2", peer_info("B", 2)) == (True, "")


def test_every_endpoint_on_a_link_hears_the_peers_advertisements_and_only_the_first_counts_acl():
    """A peer link serves every endpoint: each endpoint's bridge gets the
    peer's frames (and proxies what its TRD wants)."""
    c = core("A", {"T1": 1, "T3": 3})
    c.link_up("peer", peer_info("B", 2), CAPS, 0.0)
    c.tr_datagram("T3", dgram(tqrs=[TOPIC]), APP, 0.1)
    c.outputs()
    c.link_frame("peer", P.Advertisement(TOPIC, 2, OTID, P.StreamKind.TCP, 7, False), 0.2)
    starts = [o for o in c.outputs() if isinstance(o, StartProxy)]
    assert [(o.endpoint, o.advert.advert_id) for o in starts] == [("T3", 7)]
    assert c.counters("peer", "T1")["adverts_unwanted"] == 1  # T1's receivers did not ask


def test_two_endpoints_of_one_router_are_joined_inside_the_core():
    """A pair of endpoints needs no link to come up: a query in T2 and a source
    in T1 give T2's side a proxy at once, and no frame leaves the core."""
    portals = {e: PortalTR(PortalTRSettings(e, d, src_id=e.encode().ljust(8, b"_")[:8], mode="multicast",
                                            multicast=GROUP, source_timeout=3.0, requery_interval=1.0), now=0.0)
               for e, d in (("T1", 1), ("T2", 2))}
    rules = {e: EndpointRules(d, OPEN, 1.0, 100) for e, d in (("T1", 1), ("T2", 2))}
    links = [LinkSpec("T1<->T2@T1", "T1<->T2", ("T1",), 1, OPEN, False, pair="T1<->T2@T2"),
             LinkSpec("T1<->T2@T2", "T1<->T2", ("T2",), 1, OPEN, False, pair="T1<->T2@T1")]
    c = RouterCore("R", portals, rules, links, Routing("R", {1: 1, 2: 1}, now=0.0), now=0.0)
    assert c.is_up("T1<->T2@T1") and c.is_up("T1<->T2@T2")
    c.tr_datagram("T2", dgram(tqrs=[TOPIC]), APP, 0.1)
    c.tr_datagram("T1", dgram(tirs=[source_tir()]), APP, 0.2)
    out = c.outputs()
    assert not [o for o in out if isinstance(o, SendFrame)]
    (start,) = [o for o in out if isinstance(o, StartProxy)]
    assert (start.link, start.endpoint, start.advert.topic) == ("T1<->T2@T2", "T2", TOPIC)
    # the data path: a stream the T2 side opens for it reaches T1's source
    assert c.advert_source("T1<->T2@T1", "T1", start.advert.advert_id) == source_tir().transport
    # the shell's in-process data link coming and going changes nothing
    c.link_down("T1<->T2@T1", 0.3)
    assert c.is_up("T1<->T2@T1") and c.proxy_advert("T1<->T2@T2", "T2", start.advert.advert_id) is not None
