"""The router's bridge (router/core/bridge.py), sans-IO: interest in, advertisements
out, proxies in, withdrawal, link loss and loop prevention, with no socket and
no clock (times are explicit)."""

from __future__ import annotations

import math

import pytest

from lbmr_proto import (
    TIR,
    CostOption,
    DomainIdOption,
    OtidOption,
    TcpTransport,
    decode,
)
from router import peerlink as P
from router.core.bridge import Bridge
from router.core.bridge_outputs import Notice, ProxyDown, ProxyUp, SendFrame, StartProxy, StopProxy
from router.core.sessions import session_key
from router.core.tr import PortalTR, PortalTRSettings
from tests.router.helpers import APP, GROUP, OTID, TOPIC, advert, bridge, dgram, frames, source_tir

RELAY = ("10.1.0.1", 24000)


def sent_tirs(b: Bridge, now: float) -> list[TIR]:
    return [t for o in b.tick(now) for t in decode(o.data).tirs]


def sent_tqrs(b: Bridge, now: float) -> list[str]:
    return [q.topic for o in b.tick(now) for q in decode(o.data).tqrs]


def test_local_interest_goes_to_the_peer_once_the_link_is_up():
    b = bridge()
    b.on_datagram(dgram(tqrs=[TOPIC]), APP, 0.1)
    assert frames(b) == []  # no link yet
    b.link_up(0.2)
    assert frames(b) == [P.Interest(P.InterestAction.ADD, TOPIC, 1, P.PatternType.TOPIC)]
    b.on_datagram(dgram(tqrs=["md.other"]), APP, 0.3)
    assert frames(b) == [P.Interest(P.InterestAction.ADD, "md.other", 1, P.PatternType.TOPIC)]
    b.on_datagram(dgram(tqrs=[TOPIC]), APP, 0.4)  # a refresh: nothing new for the peer
    assert frames(b) == [] and b.counters["local_interest"] == 2


def test_peer_interest_queries_the_trd_and_advertises_what_it_finds():
    b = bridge()
    b.link_up(0.0)
    b.peer_frame(P.Interest(P.InterestAction.ADD, TOPIC, 2), 0.0)
    assert frames(b) == [] and TOPIC in sent_tqrs(b, 0.0)  # the portal queries at once
    b.on_datagram(dgram(tirs=[source_tir()]), APP, 0.05)
    (adv,) = frames(b)
    assert adv == P.Advertisement(TOPIC, 1, OTID, P.StreamKind.TCP, 1, False,
                                  session=session_key(source_tir().transport))
    assert b.advert_source(1) == TcpTransport("10.1.0.5", 14371)
    assert b.counters["adverts_sent"] == 1
    # the same source again is no news; a second interest re-advertises under the same id
    b.on_datagram(dgram(tirs=[source_tir()]), APP, 0.5)
    assert frames(b) == []
    b.peer_frame(P.Interest(P.InterestAction.REFRESH, TOPIC, 2), 0.6)
    assert frames(b) == [adv]
    # the source goes silent: withdrawn, and its advert id is forgotten
    for t in (1.0, 2.0, 3.0, 4.0, 5.0):
        b.tick(t)
    out = b.outputs()
    assert [o.frame for o in out if isinstance(o, SendFrame)] == [
        P.Advertisement(TOPIC, 1, OTID, P.StreamKind.TCP, 1, True)]
    assert Notice("source_gone", f"{TOPIC} advert 1") in out
    assert b.advert_source(1) is None and b.counters["adverts_withdrawn"] == 1


def test_peer_interest_that_cannot_be_queried_is_counted_and_ignored():
    b = bridge()
    b.peer_frame(P.Interest(P.InterestAction.ADD, "x" * 300, 2), 0.0)
    assert b.counters["bad_interest"] == 1 and b.portal.remote_interests() == []
    b.peer_frame(P.Interest(P.InterestAction.ADD, TOPIC, 2), 0.0)
    b.peer_frame(P.Interest(P.InterestAction.CANCEL, TOPIC, 2), 0.1)
    assert b.portal.remote_interests() == []


def test_an_advertisement_becomes_a_proxy_at_the_relay_address():
    b = bridge()
    b.link_up(0.0)
    b.peer_frame(advert(), 0.0)
    assert b.outputs() == [StartProxy(advert())]
    assert sent_tirs(b, 0.0) == []  # nothing advertised before the listener is bound
    assert b.proxy_listening(11, RELAY, 0.01)
    assert b.outputs() == [ProxyUp(advert(), TcpTransport(*RELAY))]
    (tir,) = sent_tirs(b, 0.01)
    assert (tir.topic, tir.transport) == (TOPIC, TcpTransport(*RELAY))
    assert OtidOption(0x8000, OTID) in tir.options and DomainIdOption(0x8000, 2) in tir.options
    assert b.proxy_addresses() == {11: RELAY}
    # a TQR for the topic is answered at once; a re-sent advertisement changes nothing
    b.on_datagram(dgram(tqrs=[TOPIC]), APP, 0.015)  # the next advertisement is due at 0.02
    assert [t.topic for t in sent_tirs(b, 0.015)] == [TOPIC]
    b.peer_frame(advert(), 0.03)
    assert b.outputs() == [SendFrame(P.Interest(P.InterestAction.ADD, TOPIC, 1))]  # from the TQR
    assert b.proxies() == {11: advert()}


def test_withdrawal_stops_the_proxy_and_sends_final_advertisements():
    b = bridge()
    b.peer_frame(advert(), 0.0)
    b.proxy_listening(11, RELAY, 0.0)
    b.tick(0.0)
    b.outputs()
    b.peer_frame(advert(withdraw=True), 1.0)
    assert b.outputs() == [ProxyDown(11), StopProxy(11)]
    assert b.proxies() == {} and b.proxy_addresses() == {} and b.counters["withdrawals_received"] == 1
    finals = [t for now in (1.0, 1.01, 1.03, 2.0) for t in sent_tirs(b, now)]
    assert len(finals) == 3 and all(CostOption(0x80, 1, -1) in t.options for t in finals)
    b.on_datagram(dgram(tqrs=[TOPIC]), APP, 3.0)  # no longer answered
    assert sent_tirs(b, 3.0) == []
    # a listener bound after the withdrawal is not advertised
    b.peer_frame(advert(aid=12), 4.0)
    b.peer_frame(advert(aid=12, withdraw=True), 4.0)
    assert not b.proxy_listening(12, RELAY, 4.1) and b.portal.proxies() == []


def test_loop_prevention():
    b = bridge(domain=1)
    b.link_up(0.0)
    # an advertisement of our own domain's source is not proxied back into it
    b.peer_frame(advert(domain=1), 0.0)
    assert b.outputs() == [] and b.counters["adverts_own_domain"] == 1
    # a transport the relay cannot carry is not proxied either
    b.peer_frame(advert(aid=12, transport=0x02), 0.0)
    assert b.outputs() == [] and b.counters["unrelayable_transport"] == 1
    # the peer wants the topic; the only TIR for it comes from another router (TNWGD),
    # or carries another domain's id: nothing is advertised to the peer
    b.peer_frame(P.Interest(P.InterestAction.ADD, TOPIC, 2), 0.0)
    b.on_datagram(dgram(tirs=[source_tir()], src_id=b"ROUTER02", src_type=1), APP, 0.1)
    elsewhere = TIR(TOPIC, TcpTransport("10.1.0.6", 1), 60, 1, [DomainIdOption(0x8000, 9)])
    b.on_datagram(dgram(tirs=[elsewhere]), APP, 0.2)
    assert frames(b) == []
    # our own proxy's TIR, echoed back into the TRD, is not a source either: it names
    # the origin's domain, and without that option its OTID is one of our proxies'
    b.peer_frame(advert(aid=13), 0.3)
    b.proxy_listening(13, RELAY, 0.3)
    (own,) = sent_tirs(b, 0.3)
    b.outputs()
    b.on_datagram(dgram(tirs=[own], src_id=b"OTHERAPP"), APP, 0.4)
    own.options = [o for o in own.options if not isinstance(o, DomainIdOption)]
    b.on_datagram(dgram(tirs=[own], src_id=b"OTHERAPP"), APP, 0.4)
    assert frames(b) == []
    assert b.portal.stats()["tirs_ignored_domain"] == 2
    assert b.portal.stats()["tirs_ignored_proxy_echo"] == 1


def test_link_down_stops_every_proxy_and_forgets_the_peer():
    b = bridge()
    b.link_up(0.0)
    b.peer_frame(P.Interest(P.InterestAction.ADD, TOPIC, 2), 0.0)
    b.on_datagram(dgram(tirs=[source_tir()]), APP, 0.0)
    b.peer_frame(advert(aid=11, topic="md.far"), 0.0)
    b.peer_frame(advert(aid=12, topic="md.far2"), 0.0)
    b.proxy_listening(11, RELAY, 0.0)
    b.outputs()
    b.link_down(1.0)
    out = b.outputs()
    assert sorted(o.proxy_id for o in out if isinstance(o, StopProxy)) == [11, 12]
    assert [o.advert_id for o in out if isinstance(o, ProxyDown)] == [11]  # 12 was never advertised
    assert b.proxies() == {} and b.advert_sources() == {} and b.portal.proxies() == []
    assert b.portal.remote_interests() == []
    b.on_datagram(dgram(tqrs=["md.new"]), APP, 1.1)
    assert frames(b) == []  # the link is down: nothing for the peer


def test_two_bridges_back_to_back():
    """A receiver in TRD 1 and a source in TRD 2: the interest crosses, the source is
    advertised back, and TRD 1 ends up with a proxy TIR at router A's relay address."""
    a, b = bridge(1, "A"), bridge(2, "B")
    a.link_up(0.0)
    b.link_up(0.0)
    proxies = []

    def carry(src: Bridge, dst: Bridge, now: float) -> None:
        for o in src.outputs():
            if isinstance(o, SendFrame):
                dst.peer_frame(o.frame, now)
            elif isinstance(o, StartProxy):
                proxies.append((src, o.advert.advert_id))

    a.on_datagram(dgram(tqrs=[TOPIC]), APP, 0.0)
    carry(a, b, 0.0)
    assert b.portal.remote_interests() == [(TOPIC, 0)]
    b.on_datagram(dgram(tirs=[source_tir()]), ("10.2.0.5", 12965), 0.1)
    carry(b, a, 0.1)
    carry(a, b, 0.1)
    assert proxies == [(a, 1)]
    a.proxy_listening(1, RELAY, 0.2)
    (tir,) = sent_tirs(a, 0.2)
    assert tir.transport == TcpTransport(*RELAY) and DomainIdOption(0x8000, 2) in tir.options
    assert math.isfinite(a.next_deadline())


def test_bridge_rejects_other_frames():
    with pytest.raises(TypeError):
        bridge().peer_frame(P.Keepalive(1, 2), 0.0)


def test_unwanted_and_excess_advertisements_bind_nothing():
    """Defect (hostile peer): every ADVERTISEMENT bound a proxy listener at once,
    so 20,000 of them exhausted the file descriptors. Adverts for topics no
    receiver here wants start nothing, and at most max_proxies run."""
    tr = PortalTR(PortalTRSettings("A", 1, src_id=b"A" * 8, mode="multicast", multicast=GROUP), now=0.0)
    b = Bridge(tr, max_proxies=100, require_interest=True)
    b.link_up(0.0)
    for i in range(20_000):
        b.peer_frame(advert(aid=i + 1, topic=f"md.flood.{i}"), 0.0)
    assert b.outputs() == [] and b.counters["adverts_unwanted"] == 20_000
    wanted = [f"md.want.{i}" for i in range(300)]
    for i in range(0, 300, 100):
        b.on_datagram(dgram(tqrs=wanted[i:i + 100]), APP, 0.1)
    b.outputs()
    for i, topic in enumerate(wanted):
        b.peer_frame(advert(aid=30_000 + i, topic=topic), 0.2)
    out = b.outputs()
    assert sum(isinstance(o, StartProxy) for o in out) == 100 and len(b.proxies()) == 100
    assert b.counters["proxies_full"] == 200
    assert [o.kind for o in out if isinstance(o, Notice)] == ["proxies_full"]  # said once


def test_interest_flood_is_bounded_logged_and_queried_at_a_paced_rate():
    """Defect: 100,000 INTEREST frames from the peer: most were dropped with
    only a counter to show it, and the portal queried everything at once.
    Remote interest is bounded (refusals logged at the 1st, 2nd, 4th ...),
    and queries go out at most query_rate a second."""
    tr = PortalTR(PortalTRSettings("A", 1, src_id=b"A" * 8, mode="multicast", multicast=GROUP,
                                   max_remote_interests=20_000), now=0.0)
    b = Bridge(tr)
    b.link_up(0.0)
    for i in range(100_000):
        b.peer_frame(P.Interest(P.InterestAction.ADD, f"md.flood.{i}", 2), 0.0)
    assert len(tr.remote_interests()) == 20_000 and b.counters["bad_interest"] == 80_000
    notes = [o for o in b.outputs() if isinstance(o, Notice)]
    assert [n.kind for n in notes] == ["interest_refused"] * 17  # 1, 2, 4 ... 65536
    assert "80000" not in notes[-1].detail and "65536 interest(s)" in notes[-1].detail
    sent, now = 0, 0.0
    while now < 1.0:
        sent += sum(len(decode(o.data).tqrs) for o in b.tick(now))
        now = b.next_deadline()
    assert 5_000 <= sent <= 5_500 + 500  # query_rate 5,000 a second, a burst of 500


def test_peer_interest_lasts_while_any_of_its_domains_wants_it():
    """A peer router with two endpoint portals (domains 2 and 3) sends interest
    in one topic from each: cancelled by one, it stays; by both, it ends."""
    b = bridge()
    b.link_up(0.0)
    for dom in (2, 3):
        b.peer_frame(P.Interest(P.InterestAction.ADD, TOPIC, dom), 0.1)
    assert b.portal.remote_interests() == [(TOPIC, 0)]
    b.peer_frame(P.Interest(P.InterestAction.CANCEL, TOPIC, 2), 0.2)
    assert b.portal.remote_interests() == [(TOPIC, 0)]
    b.peer_frame(P.Interest(P.InterestAction.CANCEL, TOPIC, 3), 0.3)
    assert b.portal.remote_interests() == []


def test_bridges_sharing_a_link_number_their_adverts_together():
    import itertools

    ids = itertools.count(1)
    b1, b2 = (Bridge(PortalTR(PortalTRSettings(n, d, src_id=n.encode() * 8, mode="multicast", multicast=GROUP),
                              now=0.0),
                     advert_ids=ids) for n, d in (("A", 1), ("B", 2)))
    for b in (b1, b2):
        b.link_up(0.0)
        b.peer_frame(P.Interest(P.InterestAction.ADD, TOPIC, 5), 0.1)
        b.on_datagram(dgram(tirs=[source_tir()]), APP, 0.2)
    aids = [f.advert_id for b in (b1, b2) for f in frames(b) if isinstance(f, P.Advertisement)]
    assert len(aids) == 2 and len(set(aids)) == 2


def session_advert(aid, topic, session, index, transport=P.StreamKind.TCP, withdraw=False):
    otid = bytes([0]) + bytes(range(1, 7)) + index.to_bytes(4, "big") + bytes(21)  # topic index at 7
    return P.Advertisement(topic, 2, otid, transport, aid, withdraw, 0, session)


def test_the_topics_of_one_peer_session_share_one_proxy():
    """One listener per transport session of the peer (not per topic): every topic
    of the session is advertised at its relay address with its own topic index;
    the listener goes when the session's last topic goes, and a new stream names a
    live topic of the session."""
    b = bridge()
    b.link_up(0.0)
    b.peer_frame(session_advert(11, "md.s.a", 77, 1), 0.0)
    b.peer_frame(session_advert(12, "md.s.b", 77, 2), 0.0)
    out = b.outputs()
    assert out == [StartProxy(session_advert(11, "md.s.a", 77, 1))]  # one listener for both
    assert b.proxy_listeners() == 1 and sorted(b.proxies()) == [11, 12]
    assert b.proxy_listening(11, RELAY, 0.01)
    ups = b.outputs()
    assert [(o.advert.advert_id, o.body) for o in ups] == [(11, TcpTransport(*RELAY)), (12, TcpTransport(*RELAY))]
    tirs = sorted(sent_tirs(b, 0.01), key=lambda t: t.topic)
    assert [(t.topic, t.transport, t.index) for t in tirs] == [
        ("md.s.a", TcpTransport(*RELAY), 1), ("md.s.b", TcpTransport(*RELAY), 2)]
    # a later topic of the session is advertised at once, at the same address
    b.peer_frame(session_advert(13, "md.s.c", 77, 3), 0.1)
    assert b.outputs() == [ProxyUp(session_advert(13, "md.s.c", 77, 3), TcpTransport(*RELAY))]
    assert b.proxy_addresses() == {11: RELAY, 12: RELAY, 13: RELAY}
    # another session, or the same number with another transport: a proxy of its own
    b.peer_frame(session_advert(14, "md.t.a", 78, 1), 0.1)
    b.peer_frame(session_advert(15, "md.u.a", 77, 1, transport=P.StreamKind.LBTRU), 0.1)
    assert [o.advert.advert_id for o in b.outputs() if isinstance(o, StartProxy)] == [14, 15]
    assert b.proxy_listeners() == 3
    # the topic the listener was started for goes: the listener stays, streams name another
    assert b.proxy_advert(11) == 11
    b.peer_frame(session_advert(11, "md.s.a", 77, 1, withdraw=True), 0.2)
    assert b.outputs() == [ProxyDown(11)] and b.proxy_advert(11) == 12
    b.peer_frame(session_advert(12, "md.s.b", 77, 2, withdraw=True), 0.2)
    b.peer_frame(session_advert(13, "md.s.c", 77, 3, withdraw=True), 0.2)
    assert b.outputs() == [ProxyDown(12), ProxyDown(13), StopProxy(11)] and b.proxy_advert(11) is None
    # a peer that re-uses advert id 14 (its proxy still runs) for another session: refused
    b.peer_frame(session_advert(16, "md.t.b", 78, 2), 0.3)
    b.peer_frame(session_advert(14, "md.t.a", 78, 1, withdraw=True), 0.3)
    b.outputs()
    b.peer_frame(session_advert(14, "md.v.a", 79, 1), 0.3)
    assert b.outputs() == [] and b.counters["bad_advert"] == 1


def test_proxies_are_bounded_by_sessions_and_by_topics():
    tr = PortalTR(PortalTRSettings("A", 1, src_id=b"A" * 8, mode="multicast", multicast=GROUP), now=0.0)
    b = Bridge(tr, max_proxies=2, max_proxy_topics=5)
    b.link_up(0.0)
    for i in range(4):  # session 1: four topics, one listener
        b.peer_frame(session_advert(1 + i, f"md.a.{i}", 1, i), 0.0)
    b.peer_frame(session_advert(10, "md.b.0", 2, 0), 0.0)
    b.peer_frame(session_advert(20, "md.c.0", 3, 0), 0.0)  # a third session: over max_proxies
    b.peer_frame(session_advert(11, "md.b.1", 2, 1), 0.0)  # a sixth topic: over max_proxy_topics
    assert [o.advert.advert_id for o in b.outputs() if isinstance(o, StartProxy)] == [1, 10]
    assert b.proxy_listeners() == 2 and len(b.proxies()) == 5 and b.counters["proxies_full"] == 2


def test_the_far_side_names_sessions_and_an_ended_session_concerns_all_its_topics():
    b = bridge()
    b.link_up(0.0)
    topics = ["md.x", "md.y", "md.z"]
    for t in topics:
        b.peer_frame(P.Interest(P.InterestAction.ADD, t, 2), 0.0)
    b.outputs()
    otid = [bytes([0]) + bytes(6) + i.to_bytes(4, "big") + bytes(21) for i in range(3)]
    tirs = [source_tir("md.x", 14371, otid[0]), source_tir("md.y", 14371, otid[1]),
            source_tir("md.z", 14372, otid[2])]  # x and y: one session; z: another port
    b.on_datagram(dgram(tirs=tirs), APP, 0.1)
    adverts = {f.topic: f for f in frames(b)}
    assert adverts["md.x"].session == adverts["md.y"].session != adverts["md.z"].session != 0
    assert adverts["md.x"].session == session_key(TcpTransport("10.1.0.5", 14371))
    # the session of md.x ended: both of its topics are queried, and withdrawn if silent
    name, asked = b.session_ended(adverts["md.x"].advert_id, 1.0)
    assert sorted(sent_tqrs(b, 1.0)) == ["md.x", "md.y"] and asked == 1.0  # queried at once
    # the streams of the session end together: its topics are queried once, not once a stream
    assert b.session_ended(adverts["md.y"].advert_id, 1.0) is None and sent_tqrs(b, 1.0) == []
    assert b.source_ended(name, 1.0, 5.0)
    gone = sorted(f.topic for f in frames(b) if f.withdraw)
    assert gone == ["md.x", "md.y"] and b.advert_source(adverts["md.z"].advert_id) is not None


def test_session_names_are_distinct_per_session_and_zero_for_lbtrm():
    from lbmr_proto import LbtrmTransport, LbtruTransport, TcpSessionTransport
    names = {session_key(TcpTransport("10.0.0.1", p)) for p in range(1000)}
    names |= {session_key(LbtruTransport("10.0.0.1", p)) for p in range(1000)}
    names |= {session_key(TcpSessionTransport("10.0.0.1", s, 5)) for s in range(1000)}
    assert len(names) == 3000 and 0 not in names
    assert session_key(TcpTransport("10.0.0.1", 7)) == session_key(TcpTransport("10.0.0.1", 7))
    assert session_key(LbtrmTransport()) == 0


def test_an_ended_session_of_many_topics_costs_its_topics_once():
    """Hostile trial: a peer opened one stream per advert id of a session whose
    source refuses; each end of session queried, and later checked, every topic
    of the session: N streams, N x N portal calls (90,000 for 300 topics)."""
    from collections import Counter

    n = 300
    b = bridge()
    b.link_up(0.0)
    tirs = []
    for i in range(n):
        otid = bytes([0]) + bytes(range(1, 7)) + i.to_bytes(4, "big") + bytes(21)
        b.peer_frame(P.Interest(P.InterestAction.ADD, f"t.{i}", 2), 0.0)
        tirs.append(TIR(f"t.{i}", TcpTransport("10.1.0.5", 14371), 60, i, [OtidOption(0x8000, otid)]))
    for k in range(0, n, 50):
        b.on_datagram(dgram(tirs=tirs[k:k + 50]), APP, 0.05)
    adverts = [f for f in frames(b) if isinstance(f, P.Advertisement)]
    assert len(adverts) == n and len({f.session for f in adverts}) == 1
    calls: Counter[str] = Counter()
    requery, drop = b.portal.requery, b.portal.drop_source
    b.portal.requery = lambda *a, **kw: (calls.update(["requery"]), requery(*a, **kw))[1]
    b.portal.drop_source = lambda *a, **kw: (calls.update(["drop"]), drop(*a, **kw))[1]
    names = [b.session_ended(f.advert_id, 1.0) for f in adverts]
    ((name, _),) = [x for x in names if x is not None]
    assert b.source_ended(name, 1.0, 2.0)
    assert calls == {"requery": n, "drop": n}
    assert sum(f.withdraw for f in frames(b)) == n  # all withdrawn, each once


def test_a_source_that_moves_to_another_session_gets_a_new_advert_id():
    """Hostile trial: a source whose TIR changed transport session kept its advert
    id; the peer, which had proxied that id with its old session's topics,
    ignored the re-sent advertisement, and a stream for it on the old session's
    proxy reached the new session. Now the old id is withdrawn and a new one
    advertised with the new session."""
    b = bridge()
    b.link_up(0.0)
    b.peer_frame(P.Interest(P.InterestAction.ADD, TOPIC, 2), 0.0)
    b.on_datagram(dgram(tirs=[source_tir(port=14371)]), APP, 0.1)
    (first,) = frames(b)
    b.on_datagram(dgram(tirs=[source_tir(port=14371)]), APP, 0.5)  # the same again: nothing new
    assert [f for f in frames(b) if not f.withdraw and f.advert_id != first.advert_id] == []
    b.on_datagram(dgram(tirs=[source_tir(port=14999)]), APP, 1.0)
    gone, new = frames(b)
    assert gone.withdraw and gone.advert_id == first.advert_id
    assert not new.withdraw and new.advert_id != first.advert_id
    assert new.session == session_key(TcpTransport("10.1.0.5", 14999)) != first.session
    assert b.advert_source(first.advert_id) is None
    assert b.advert_source(new.advert_id) == TcpTransport("10.1.0.5", 14999)


def test_a_route_change_that_leaves_the_link_as_it_was_costs_no_walk_over_the_interest():
    """Hostile trial: every route change walked all local interests of every
    bridge (30 ms a change with 20,000 of them). Only a change of what the link
    should carry (set_routes' answer) walks them now."""
    b = bridge()
    b.link_up(0.0)
    b.on_datagram(dgram(tqrs=[f"md.{i}" for i in range(100)]), APP, 0.1)
    frames(b)
    walks = []
    real = b.portal.local_interests
    b.portal.local_interests = lambda: (walks.append(1), real())[1]
    b.resync_interest(0.2)  # the first since the link came up: checks
    b.resync_interest(0.3)
    b.resync_interest(0.4)
    assert len(walks) == 1 and frames(b) == []
    b.set_routes(False, None)  # the peer is no longer our child: everything is cancelled
    b.resync_interest(0.5)
    assert len(walks) == 2 and len(frames(b)) == 100
    b.set_routes(True, None)
    b.resync_interest(0.6)
    assert len(walks) == 3 and len([f for f in frames(b) if f.action == P.InterestAction.ADD]) == 100


def test_a_session_of_many_topics_is_advertised_a_chunk_at_a_time():
    """Hostile trial: the listener of a session of 20,000 topics advertised them
    all in one go (0.5 s without the event loop). They go a chunk at a time,
    oldest first; a topic that joins meanwhile waits its turn, and one withdrawn
    meanwhile is never advertised."""
    b = bridge()
    b.link_up(0.0)
    for i in range(5):
        b.peer_frame(session_advert(11 + i, f"md.c.{i}", 5, i), 0.0)
    b.outputs()
    assert b.proxy_listening(11, RELAY, 0.1, limit=2)
    assert [o.advert.advert_id for o in b.outputs() if isinstance(o, ProxyUp)] == [11, 12]
    b.peer_frame(session_advert(20, "md.c.late", 5, 9), 0.1)  # joins behind the three waiting
    b.peer_frame(session_advert(14, "md.c.3", 5, 3, withdraw=True), 0.1)  # goes before its turn
    assert [o for o in b.outputs() if isinstance(o, ProxyUp)] == []
    assert b.advertise_pending(11, 0.2, limit=2) == 1
    assert b.advertise_pending(11, 0.3, limit=2) == 0
    assert [o.advert.advert_id for o in b.outputs() if isinstance(o, ProxyUp)] == [13, 15, 20]
    assert sorted(t.topic for t in sent_tirs(b, 0.3)) == ["md.c.0", "md.c.1", "md.c.2", "md.c.4", "md.c.late"]
