"""One endpoint portal, one UM context in its TRD, shared by its links
(router/core/endpoint_portal.py sans-IO; router/shell/portal_task.py and router/shell/router.py
on real sockets): remote interest per link, sources to the links that want
them, proxies of several links with the same advert ids, each link's share of
the interest limit, and one TR socket and one source id per endpoint."""

from __future__ import annotations

from functools import partial

import pytest
import trio

import lbmr_proto as L
from router import peerlink as P
from router.config.model import acceptor_peer, initiator_peer, router_config
from router.core.bridge import Bridge
from router.core.bridge_outputs import SendFrame
from router.core.endpoint_portal import EndpointPortal
from router.core.tr import (
    PortalTR,
    PortalTRSettings,
    ProxySource,
    RemoteCheck,
    RemoteInterestExpired,
    SourceGone,
    SourceSeen,
)
from router.shell.router import MultiRouter
from tests.router.helpers import (
    APP,
    GROUP,
    OTID,
    TOPIC,
    advert,
    dgram,
    ep,
    source_tir,
    start_lbmrd,
    udp,
)

RELAY = ("10.1.0.1", 24000)


def shared(**kw) -> EndpointPortal:
    return EndpointPortal(PortalTR(PortalTRSettings("A", 1, src_id=b"A" * 8, mode="multicast", multicast=GROUP,
                                                    source_timeout=3.0, requery_interval=1.0, **kw), now=0.0))


def queried(portal: EndpointPortal, now: float) -> list[str]:
    return [q.topic for o in portal.tick(now) for q in L.decode(o.data).tqrs]


def advertised(portal: EndpointPortal, now: float) -> list[L.TIR]:
    return [t for o in portal.tick(now) for t in L.decode(o.data).tirs]


def test_remote_interest_lasts_while_any_link_wants_it():
    portal = shared()
    a, b = portal.view("a"), portal.view("b")
    a.add_remote_interest(TOPIC, 0.0)
    b.add_remote_interest(TOPIC, 0.0)
    assert a.remote_interests() == b.remote_interests() == [(TOPIC, 0)]
    assert a.cancel_remote_interest(TOPIC, 0.1)
    assert not a.cancel_remote_interest(TOPIC, 0.1)  # a had it once
    assert a.remote_interests() == [] and not a.wants_source(TOPIC) and b.wants_source(TOPIC)
    assert portal.tr.remote_interests() == [(TOPIC, 0)]
    assert TOPIC in queried(portal, 0.2)  # still queried for b
    assert b.cancel_remote_interest(TOPIC, 0.3)
    assert portal.tr.remote_interests() == []


def test_a_source_goes_to_the_links_that_want_it():
    portal = shared()
    a, b, c = portal.view("a"), portal.view("b"), portal.view("c")
    a.add_remote_interest(TOPIC, 0.0)
    b.add_remote_interest("md\\..*", 0.0, pattern_type=1)
    c.add_remote_interest("other", 0.0)
    portal.on_datagram(dgram(tirs=[source_tir()]), APP, 0.1)
    for v in (a, b):
        (ev,) = v.events()
        assert isinstance(ev, SourceSeen) and ev.topic == TOPIC and ev.first
    assert c.events() == []
    # a link that adds its interest again gets the source again; the others do not
    a.add_remote_interest(TOPIC, 0.2)
    assert [type(e) for e in a.events()] == [SourceSeen] and b.events() == []
    # a source gone: every link hears it (each bridge withdraws what it advertised)
    portal.tick(10.0)
    assert [type(e) for e in a.events()] == [SourceGone]
    assert [type(e) for e in c.events()] == [SourceGone]


def test_two_links_proxies_with_the_same_advert_id_are_both_advertised():
    """Each peer numbers its own advertisements: link a's advert 1 and link
    b's advert 1 are two proxies in the TRD, removed one by one."""
    portal = shared()
    a, b = portal.view("a"), portal.view("b")
    a.add_proxy(ProxySource(1, "t.a", L.TcpTransport("10.1.0.1", 24000), 2, OTID), 0.0)
    b.add_proxy(ProxySource(1, "t.b", L.TcpTransport("10.1.0.1", 24001), 3, OTID), 0.0)
    assert sorted(t.topic for t in advertised(portal, 0.0)) == ["t.a", "t.b"]
    assert [p.topic for p in a.proxies()] == ["t.a"] and [p.advert_id for p in b.proxies()] == [1]
    assert not a.remove_proxy(2, 0.1)
    assert a.remove_proxy(1, 0.1)
    assert [p.topic for p in portal.tr.proxies()] == ["t.b"]


def test_one_link_cannot_take_another_links_share_of_interest():
    """A hostile peer that sends the most interest it may fills its own
    link's share only: the other link still adds its own."""
    portal = shared(max_remote_interests=100)
    hostile, other = portal.view("hostile"), portal.view("other")
    for i in range(100):
        hostile.add_remote_interest(f"flood.{i}", 0.0)
    with pytest.raises(ValueError):
        hostile.add_remote_interest("flood.x", 0.0)
    hostile.add_remote_interest("flood.0", 0.1)  # a refresh is not a new interest
    for i in range(100):
        other.add_remote_interest(f"mine.{i}", 0.0)
    assert len(other.remote_interests()) == 100 and len(portal.tr.remote_interests()) == 200
    assert portal.tr.stats()["remote_interest_refused"] == 1


def test_one_links_heavy_patterns_cannot_take_another_links_share_of_states(monkeypatch):
    """Each link's patterns hold at most the portal's ``max_remote_pattern_states``
    (MAX_HELD_STATES) NFA states summed: a hostile peer's flood of worst-case
    patterns is refused past its share and counted, the other link still adds
    its own, and a new topic's TIR costs at most the links' shares in matcher
    steps per character (each pattern searched once)."""
    from router.core.interest import MAX_HELD_STATES
    from router.core.wildcard import Matcher

    searched: list[int] = []
    real = Matcher.search
    monkeypatch.setattr(Matcher, "search", lambda self, text: searched.append(self.size) or real(self, text))
    portal = shared()
    hostile, other = portal.view("hostile"), portal.view("other")
    assert portal.tr.max_remote_pattern_states == 2 * MAX_HELD_STATES
    refused = 0
    for k in range(50):
        try:
            hostile.add_remote_interest(f"(.?){{990}}x{k}", 0.0, pattern_type=1)
        except ValueError:
            refused += 1
    held = 50 - refused
    assert 1 <= held < 5 and portal.tr.stats()["remote_pattern_states_refused"] == refused
    assert len(hostile.remote_interests()) == held
    for k in range(held):
        other.add_remote_interest(f"(.?){{990}}y{k}", 0.0, pattern_type=1)
    with pytest.raises(ValueError):
        other.add_remote_interest("(.?){990}y999", 0.0, pattern_type=1)
    assert portal.tr.stats()["remote_pattern_states"] <= 2 * MAX_HELD_STATES
    searched.clear()
    portal.on_datagram(dgram(tirs=[source_tir(topic="a" * 254 + "!")]), APP, 0.1)
    assert len(searched) == 2 * held and sum(searched) <= 2 * MAX_HELD_STATES  # wanted by none


def test_interest_no_link_refreshes_expires_for_each_link_that_held_it():
    portal = shared(remote_topic=RemoteCheck(1.0, 100, 2.0))
    a, b = portal.view("a"), portal.view("b")
    a.add_remote_interest(TOPIC, 0.0)
    b.add_remote_interest(TOPIC, 0.0)
    a.add_remote_interest("kept", 0.0)
    for t in (1.5, 2.5, 3.5):
        a.add_remote_interest("kept", t)
        portal.tick(t)
    for v in (a, b):
        assert RemoteInterestExpired(TOPIC) in v.events()
        assert (TOPIC, 0) not in v.remote_interests()
    assert a.remote_interests() == [("kept", 0)]


def test_bridges_on_one_portal_each_advertise_to_their_own_peer():
    """Two links' bridges on one shared portal: the TRD's source goes to the
    link whose peer asked for it; the TRD's interest goes to both."""
    portal = shared()
    ba, bb = Bridge(portal.view("a")), Bridge(portal.view("b"))
    for b in (ba, bb):
        b.link_up(0.0)
        b.outputs()
    ba.peer_frame(P.Interest(P.InterestAction.ADD, TOPIC, 2, P.PatternType.TOPIC), 0.0)
    portal.on_datagram(dgram(tirs=[source_tir()], tqrs=["wanted.here"]), APP, 0.1)
    for b in (ba, bb):
        b.drain_portal()
    fa = [o.frame for o in ba.outputs() if isinstance(o, SendFrame)]
    fb = [o.frame for o in bb.outputs() if isinstance(o, SendFrame)]
    assert [type(f) for f in fa] == [P.Advertisement, P.Interest]
    assert [type(f) for f in fb] == [P.Interest] and fb[0].topic == "wanted.here"
    # the peer of b advertises with the advert id a's proxy uses: both are proxied
    ba.peer_frame(advert(aid=11, topic="t.from.a", domain=2), 0.2)
    bb.peer_frame(advert(aid=11, topic="t.from.b", domain=3), 0.2)
    assert all(b.proxy_listening(11, RELAY, 0.3) for b in (ba, bb))
    assert sorted(t.topic for t in advertised(portal, 0.3)) == ["t.from.a", "t.from.b"]


async def _router_contexts(trd, listen: float) -> set[bytes]:
    """The source ids of the routers' TR datagrams heard in a TRD for ``listen`` s."""
    s = udp("127.0.1.9")
    await s.sendto(L.encode(L.Packet(0, 1, tqrs=[L.TQR("any.topic")])), trd)  # joins the lbmrd
    ids: set[bytes] = set()
    with trio.move_on_after(listen):
        while True:
            data, _ = await s.recvfrom(65535)
            try:
                pkt = L.decode(data)
            except L.LBMRDecodeError:
                continue
            opts = {type(o): o for o in pkt.options}
            st = opts.get(L.SourceTypeOption)
            if st is not None and st.src_type == 1 and L.SourceIdOption in opts:
                ids.add(opts[L.SourceIdOption].src_id)
    s.close()
    return ids


async def test_an_endpoint_portal_is_one_context_in_its_trd():
    """A router with three endpoints and two peer links runs three TR sockets
    (each link of an endpoint reports the endpoint's), and its TRD hears one
    source id from it (before, each of the 4 links of an endpoint was a
    context of its own: 12 sockets, 12 source ids)."""
    ips = {1: "127.0.1.1", 2: "127.0.2.1", 3: "127.0.3.1", 4: "127.0.4.1", 5: "127.0.5.1"}
    acc = partial(acceptor_peer, port=0, interface="127.0.0.1")
    async with trio.open_nursery() as n:
        trds = {d: (await start_lbmrd(n, ip))[1] for d, ip in ips.items()}
        r4 = MultiRouter(router_config("r4", [ep("T4", 4, trds[4], ips[4])], [acc("4-1")]))
        r5 = MultiRouter(router_config("r5", [ep("T5", 5, trds[5], ips[5])], [acc("5-1")]))
        p4 = (await n.start(r4.run))["links"][0]["peer"]
        p5 = (await n.start(r5.run))["links"][0]["peer"]
        r1 = MultiRouter(router_config("r1", [ep(f"T{d}", d, trds[d], ips[d]) for d in (1, 2, 3)], [
            initiator_peer("1-4", address=p4[0], port=p4[1], reconnect_interval_ms=200),
            initiator_peer("1-5", address=p5[0], port=p5[1], reconnect_interval_ms=200)]))
        rep = await n.start(r1.run)
        links = rep["links"]
        assert len(links) == 2 + 3 * 2  # the two peer links, both ends of each endpoint pair
        tr_sockets = {lk["tr"] for lk in links}
        assert len(tr_sockets) == 3 and {ip for ip, _ in tr_sockets} == {ips[1], ips[2], ips[3]}
        assert len(r1.links) == 2 * 3 + 3 * 2  # every endpoint on every link it serves
        assert await _router_contexts(trds[1], 1.5) == {r1.portals["T1"].src_id}
        n.cancel_scope.cancel()
