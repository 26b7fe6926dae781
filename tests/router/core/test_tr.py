"""router.core.tr: sans-IO topic resolution of one endpoint portal.

No sockets: explicit ``now`` values, an in-test "TRD" that delivers datagrams
between simulated UM contexts (lbmr_tools.sim.Context) and portals, and test
glue standing in for the peer link (INTEREST / ADVERTISEMENT as plain calls).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from lbmr_proto import (
    TIR,
    TQR,
    CostOption,
    DomainIdOption,
    LbtipcTransport,
    LbtruSessionTransport,
    LocalDomainOption,
    OtidOption,
    Packet,
    SourceIdOption,
    SourceTypeOption,
    TcpTransport,
    WcTQR,
    decode,
    encode,
)
from lbmr_proto.um import otid_topic_index, synthesize_otid
from lbmr_tools.sim import RCV_ALIVE, SRC_ALIVE, Context, Timing
from router.core.tr import (
    LocalInterest,
    LocalInterestGone,
    Outgoing,
    PortalTR,
    PortalTRSettings,
    ProxySource,
    SourceGone,
    SourceSeen,
    relay_transport,
)

Addr = tuple[str, int]
TOPIC = "md.quotes"
GROUP1 = ("239.192.1.1", 12965)
DAEMON2 = ("10.2.0.100", 15380)
RELAY2 = ("10.2.0.1", 24000)
APP_ID = b"APPCTX01"


def approx(x):
    return pytest.approx(x, abs=1e-6)


def gaps(times):
    return [round(b - a, 6) for a, b in itertools.pairwise(times)]


def dgram(*, tqrs=(), tirs=(), wcs=(), src_id=APP_ID, src_type=0, trailer=True) -> bytes:
    """A TR datagram as a UM application (or, src_type 1, a router) sends it."""
    opts = [SourceIdOption(0x8000, src_id), SourceTypeOption(0x80, src_type)] if trailer else None
    if wcs:
        return encode(Packet(type=1, version=1, wc_tqrs=list(wcs), options=opts))
    return encode(Packet(type=0, version=1, tqrs=[TQR(t) for t in tqrs], tirs=list(tirs), options=opts))


def app_tir(topic, transport, otid=None, index=5, extra=()):
    opts = [] if otid is None else [OtidOption(0x8000, otid)]
    opts += list(extra)
    return TIR(topic, transport, 60, index, opts or None)


def otid_n(n: int) -> bytes:
    return bytes([0]) + n.to_bytes(4, "big") + bytes(26) + b"\x01"


# ------------------------------------------------------------------ harness


def run_portal(p: PortalTR, until: float, actions=(), start=0.0):
    """Tick ``p`` at each of its deadlines and run ``actions`` ((time, fn(now)))
    at their times, until ``until``. Returns ([(t, Outgoing)], [(t, event)])."""
    acts = sorted(actions, key=lambda a: a[0])
    sent, events = [], []
    now, i = start, 0
    for _ in range(200_000):
        t = min(p.next_deadline(), acts[i][0] if i < len(acts) else math.inf)
        if t > until:
            return sent, events
        now = max(now, t)
        while i < len(acts) and acts[i][0] <= now:
            acts[i][1](now)
            i += 1
        sent += [(now, o) for o in p.tick(now)]
        events += [(now, e) for e in p.events()]
    raise AssertionError("no progress")


@dataclass(eq=False)
class Member:
    name: str
    addr: Addr
    obj: object

    def deadline(self) -> float:
        return self.obj.next_deadline()

    def tick(self, now):
        if isinstance(self.obj, PortalTR):
            return [(o.data, o.dest) for o in self.obj.tick(now)]
        return [(bytes(d), d.dest) for d in self.obj.tick(now)]

    def receive(self, data, src, now):
        if isinstance(self.obj, PortalTR):
            self.obj.on_datagram(data, src, now)
            return [(o.data, o.dest) for o in self.obj.data_to_send()]
        return [(bytes(d), d.dest) for d in self.obj.receive(data, now, src)]


@dataclass(eq=False)
class TRD:
    """A multicast group, or one lbmrd that forwards every non-keepalive datagram
    to all its other clients (with itself as the source address)."""

    group: Addr | None = None
    daemon: Addr | None = None
    members: list[Member] = field(default_factory=list)
    log: list = field(default_factory=list)  # (time, sender name, dest, data)

    def add(self, name, addr, obj) -> Member:
        m = Member(name, addr, obj)
        self.members.append(m)
        return m

    def deliver(self, sender: Member, data: bytes, dest: Addr, now: float, depth=0) -> None:
        assert depth < 4
        self.log.append((now, sender.name, dest, data))
        if self.group is not None:
            assert dest == self.group
            targets, src = self.members, sender.addr
        else:
            assert dest == self.daemon
            if len(data) == 4:  # keepalive: lbmrd consumes it
                return
            targets, src = [m for m in self.members if m is not sender], self.daemon
        for m in targets:
            for d2, dest2 in m.receive(data, src, now):
                self.deliver(m, d2, dest2, now, depth + 1)

    def sent_by(self, name):
        return [(t, decode(d)) for t, n, _, d in self.log if n == name and len(d) > 4]


class World:
    def __init__(self, trds, glue):
        self.trds, self.glue, self.now = trds, glue, 0.0
        self.actions: list = []

    def at(self, t, fn):
        self.actions.append((t, fn))
        self.actions.sort(key=lambda a: a[0])

    def run(self, until):
        for _ in range(200_000):
            ds = [m.deadline() for trd in self.trds for m in trd.members]
            t = min(ds + [a[0] for a in self.actions[:1]])
            if t > until:
                self.now = until
                return
            self.now = now = max(self.now, t)
            while self.actions and self.actions[0][0] <= now:
                self.actions.pop(0)[1](now)
            for trd in self.trds:
                for m in trd.members:
                    for data, dest in m.tick(now):
                        trd.deliver(m, data, dest, now)
            self.glue(now)
        raise AssertionError("no progress")


class PeerGlue:
    """Stands in for the peer link between R1 (TRD1) and R2 (TRD2): interest from
    R2 to R1, advertisements from R1 to R2 (only the directions the test uses)."""

    def __init__(self, r1: PortalTR, r2: PortalTR, relay: Addr = RELAY2):
        self.r1, self.r2, self.relay = r1, r2, relay
        self.ids = itertools.count(1)
        self.adverts: dict[tuple[str, bytes], int] = {}
        self.r1_events: list = []
        self.r2_events: list = []

    def __call__(self, now):
        for ev in self.r2.events():
            self.r2_events.append((now, ev))
            if isinstance(ev, LocalInterest):
                self.r1.add_remote_interest(ev.topic, now, pattern_type=ev.pattern_type)
            elif isinstance(ev, LocalInterestGone):
                self.r1.cancel_remote_interest(ev.topic, now, pattern_type=ev.pattern_type)
        for ev in self.r1.events():
            self.r1_events.append((now, ev))
            if isinstance(ev, SourceSeen):
                aid = self.adverts.setdefault((ev.topic, ev.otid), next(self.ids))
                body = relay_transport(ev.transport_body.TYPE, *self.relay)
                self.r2.add_proxy(ProxySource(aid, ev.topic, body, self.r1.domain_id, ev.otid), now)
            elif isinstance(ev, SourceGone):
                self.r2.remove_proxy(self.adverts.pop((ev.topic, ev.otid)), now)


def opt(pkt_or_tir, cls):
    found = [o for o in (pkt_or_tir.options or ()) if isinstance(o, cls)]
    return found[0] if found else None


# ------------------------------------------------------------------ the whole flow


def test_interest_to_proxy_across_two_trds():
    r1 = PortalTR(PortalTRSettings("r1", 1, src_id=b"R1PORTAL", mode="multicast", multicast=GROUP1), now=0.0)
    r2 = PortalTR(PortalTRSettings("r2", 2, src_id=b"R2PORTAL", mode="lbmrd", daemons=[DAEMON2]), now=0.0)
    trd1 = TRD(group=GROUP1)
    trd2 = TRD(daemon=DAEMON2)
    trd1.add("R1", ("10.1.0.1", 12965), r1)
    source_ctx = Context(multicast=GROUP1, src_id=b"SRCCTX01", rng=random.Random(1))
    trd1.add("S", ("10.1.0.5", 12965), source_ctx)
    trd2.add("R2", ("10.2.0.1", 14402), r2)
    rcv_ctx = Context([DAEMON2], src_id=b"RCVCTX01", rng=random.Random(2))
    rcv = rcv_ctx.add_receiver(TOPIC, now=0.0)
    trd2.add("RCV", ("10.2.0.7", 14402), rcv_ctx)
    late_ctx = Context([DAEMON2], src_id=b"RCVCTX02", rng=random.Random(3))
    trd2.add("RCV2", ("10.2.0.8", 14402), late_ctx)
    glue = PeerGlue(r1, r2)
    world = World([trd1, trd2], glue)
    src = {}
    world.at(1.0, lambda now: src.setdefault(
        "s", source_ctx.add_source(TOPIC, TcpTransport("10.1.0.5", 14371), now=now)))
    late = {}
    world.at(20.0, lambda now: late.setdefault("r", late_ctx.add_receiver(TOPIC, now=now)))
    world.run(25.0)
    s = src["s"]

    # receiver's TQR in TRD2 -> LocalInterest at R2 at once
    assert glue.r2_events[0] == (0.0, LocalInterest(TOPIC, False, 0))
    # R1 queries TRD1 with UM receiver timing until the source's TIR arrives
    q_times = [t for t, p in trd1.sent_by("R1") if any(q.topic == TOPIC for q in p.tqrs)]
    assert gaps(q_times[:8]) == approx([0.02, 0.04, 0.08, 0.16, 0.2, 0.2, 0.2])
    assert q_times[0] == 0.0 and q_times[7] == approx(0.9)
    # resolved at 1.0: then one re-query every requery_interval (5 s)
    assert q_times[8:] == approx([6.0, 11.0, 16.0, 21.0])
    assert all(not p.tirs for _, p in trd1.sent_by("R1"))  # R1 advertises nothing in TRD1
    # the source's TIR -> SourceSeen at R1
    seen = [(t, e) for t, e in glue.r1_events if isinstance(e, SourceSeen)]
    # (with the source's extended-functionality option, which crosses for late join)
    exfunc = [o for o in s.tir.options if o.CODE == 0x0E]
    assert seen == [(approx(1.0), SourceSeen(TOPIC, s.otid, TcpTransport("10.1.0.5", 14371), True, s.index,
                                             exfunc[0].encode()))]

    # R2 advertises the proxy TIR in TRD2 with UM advertisement timing
    ads = [(t, p) for t, p in trd2.sent_by("R2") if p.tirs]
    ad_times = [t for t, _ in ads]
    assert ad_times[0] == approx(1.0)
    assert gaps(ad_times[:9]) == approx([0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.5, 0.5])
    t0, pkt = ads[0]
    assert pkt.version == 1 and pkt.type == 0 and not pkt.tqrs
    assert opt(pkt, SourceIdOption).src_id == b"R2PORTAL"
    assert opt(pkt, SourceTypeOption).src_type == 1
    assert opt(pkt, LocalDomainOption).local_domain_id == 2
    (tir,) = pkt.tirs
    assert tir.topic == TOPIC
    assert tir.transport == TcpTransport(*RELAY2)  # relay address, TCP like the origin
    assert tir.transport.TYPE == s.transport.TYPE
    assert opt(tir, OtidOption).otid == s.otid  # OTID preserved
    assert opt(tir, DomainIdOption).domain_id == 1  # origin domain
    assert tir.index == s.index  # from the OTID
    # the receiver joined the proxy
    assert rcv.resolved_at == approx(1.0)
    assert rcv.transport == TcpTransport(*RELAY2)

    # a later receiver's first TQR is answered immediately (no advert due at 20.0)
    r_late = late["r"]
    assert [t for t in ad_times if 19.5 < t < 20.5] == [20.0, approx(20.13)]  # answer, then advert
    assert r_late.resolved_at == 20.0
    assert r_late.transport == TcpTransport(*RELAY2)
    assert r2.stats()["answer_datagrams_sent"] == 1 and r2.stats()["tirs_answered"] == 1

    # loop prevention: R2 never takes its own proxy TIRs (or another router's) for sources
    r2.add_remote_interest(TOPIC, 25.0)  # as if TRD1 had receivers too
    r2.tick(25.0)
    r2.events()
    raw = next(d for t, n, _, d in trd2.log if n == "R2" and len(d) > 4 and decode(d).tirs)
    before = r2.stats()
    r2.on_datagram(raw, DAEMON2, 25.1)  # our own (lbmrd echo)
    other = decode(raw)
    other.options = [SourceIdOption(0x8000, b"OTHERRTR"), SourceTypeOption(0x80, 1)]
    r2.on_datagram(encode(other), DAEMON2, 25.1)  # another router's proxy
    other.options = None
    r2.on_datagram(encode(other), DAEMON2, 25.1)  # no trailer: DomainIdOption(1) is foreign
    other.tirs[0].options = [o for o in other.tirs[0].options if not isinstance(o, DomainIdOption)]
    r2.on_datagram(encode(other), DAEMON2, 25.1)  # no domain either: same OTID as our proxy
    st = r2.stats()
    assert st["ignored_own"] == before.get("ignored_own", 0) + 1
    assert st["tirs_ignored_router"] == before.get("tirs_ignored_router", 0) + 1
    assert st["tirs_ignored_domain"] == before.get("tirs_ignored_domain", 0) + 1
    assert st["tirs_ignored_proxy_echo"] == before.get("tirs_ignored_proxy_echo", 0) + 1
    assert r2.events() == [] and r2.known_sources(TOPIC) == []
    assert r2.data_to_send() == []
    r2.cancel_remote_interest(TOPIC, 25.1)

    # remove_proxy: three final advertisements (cost -1), then silence and no answers
    (aid,) = glue.adverts.values()
    n_before = len(trd2.log)
    world.at(30.0, lambda now: r2.remove_proxy(aid, now))
    world.run(45.0)
    later = [(t, p) for t, n, _, d in trd2.log[n_before:] if n == "R2" and len(d) > 4
             for p in [decode(d)] if p.tirs]
    assert [t for t, _ in later if t >= 30.0] == approx([30.0, 30.01, 30.03])
    for _, p in later[-3:]:
        assert opt(p.tirs[0], CostOption).cost == -1
        assert opt(p.tirs[0], OtidOption).otid == s.otid
    r2.on_datagram(dgram(tqrs=[TOPIC]), DAEMON2, 45.0)
    assert r2.data_to_send() == []
    assert r2.proxies() == []
    # R2 kept the local interest while it advertised the proxy (no TQRs since 20 s)
    assert not any(isinstance(e, LocalInterestGone) for _, e in glue.r2_events)
    assert [i.topic for i in r2.local_interests()] == [TOPIC]


# ------------------------------------------------------------------ remote interest, sources


def mc_portal(**kw) -> PortalTR:
    now = kw.pop("now", 0.0)
    return PortalTR(PortalTRSettings("p", 1, src_id=b"PORTAL01", mode="multicast", multicast=GROUP1, **kw),
                    now=now)


SRC_ADDR = ("10.1.0.5", 12965)


def test_source_gone_after_timeout_while_requerying():
    p = mc_portal(requery_interval=2.0, source_timeout=5.0)
    otid = otid_n(1)
    body = TcpTransport("10.1.0.5", 14371)

    def tir_at(now):
        p.on_datagram(dgram(tirs=[app_tir(TOPIC, body, otid)]), SRC_ADDR, now)

    sent, events = run_portal(p, 14.0, [
        (0.0, lambda now: p.add_remote_interest(TOPIC, now)), (0.1, tir_at), (3.0, tir_at)])
    assert events[0] == (approx(0.1), SourceSeen(TOPIC, otid, body, True, 5))
    assert [e for _, e in events[1:]] == [SourceGone(TOPIC, otid)]
    assert events[1][0] == approx(8.0)  # last TIR at 3.0 + source_timeout
    q_times = [t for t, o in sent if decode(o.data).tqrs]
    # burst until the TIR at 0.1, re-queries every 2 s, the burst again after the source is gone
    assert q_times[:6] == approx([0.0, 0.02, 0.06, 2.1, 4.1, 6.1])
    assert gaps(q_times[6:11]) == approx([0.02, 0.04, 0.08, 0.16])
    assert q_times[6] == approx(8.0)
    assert all(o.dest == GROUP1 for _, o in sent)
    assert p.stats()["sources_gone"] == 1


def test_known_source_answered_at_once_and_first_flag():
    p = mc_portal()
    otid = otid_n(2)
    body = TcpTransport("10.1.0.5", 14371)
    p.on_datagram(dgram(tirs=[app_tir(TOPIC, body, otid)]), SRC_ADDR, 0.0)
    assert p.events() == []  # nobody wants it yet; remembered anyway
    p.add_remote_interest(TOPIC, 1.0)
    assert p.events() == [SourceSeen(TOPIC, otid, body, True, 5)]
    out = p.tick(1.0)  # one verifying query at once, no burst
    assert [decode(o.data).tqrs for o in out] == [[TQR(TOPIC)]]
    assert p.next_deadline() == approx(6.0)
    p.add_remote_interest(TOPIC, 2.0)  # refresh (e.g. the peer re-sent its interest)
    assert p.events() == [SourceSeen(TOPIC, otid, body, False, 5)]
    assert p.cancel_remote_interest(TOPIC, 3.0)
    assert not p.cancel_remote_interest(TOPIC, 3.0)
    p.add_remote_interest(TOPIC, 4.0)
    assert p.events() == [SourceSeen(TOPIC, otid, body, True, 5)]
    # refreshes are silent; a changed transport is reported again
    p.on_datagram(dgram(tirs=[app_tir(TOPIC, body, otid)]), SRC_ADDR, 4.5)
    assert p.events() == []
    moved = TcpTransport("10.1.0.6", 14371)
    p.on_datagram(dgram(tirs=[app_tir(TOPIC, moved, otid)]), SRC_ADDR, 4.6)
    assert p.events() == [SourceSeen(TOPIC, otid, moved, False, 5)]


def test_unwanted_sources_are_purged_silently():
    p = mc_portal(source_timeout=6.0)
    p.on_datagram(dgram(tirs=[app_tir("md.other", TcpTransport("10.1.0.5", 1), otid_n(3))]), SRC_ADDR, 0.0)
    assert p.stats()["sources"] == 1
    run_portal(p, 7.0)
    assert p.stats()["sources"] == 0 and p.stats()["sources_purged"] == 1
    assert p.events() == []


def test_otid_synthesised_deterministically():
    p = mc_portal()
    p.add_remote_interest(TOPIC, 0.0)
    a = TcpTransport("10.1.0.5", 14371)
    b = TcpTransport("10.1.0.5", 14372)
    for body in (a, a, b):
        p.on_datagram(dgram(tirs=[app_tir(TOPIC, body, None, index=77)]), SRC_ADDR, 0.1)
    seen = p.events()
    assert [e.transport_body for e in seen] == [a, b]  # the repeat is the same source
    assert seen[0].otid == synthesize_otid(a, 77) != seen[1].otid
    assert len(seen[0].otid) == 32 and seen[0].otid[0] == 0
    assert otid_topic_index(seen[0].otid) == 77
    ipc = synthesize_otid(LbtipcTransport(1, 2, 3), 99)
    assert len(ipc) == 32 and ipc[0] == 0x40 and otid_topic_index(ipc) == 99
    ru = synthesize_otid(LbtruSessionTransport("10.1.0.5", 7, 14380), 12)
    assert ru[0] == 1 and otid_topic_index(ru) == 12
    # a multicast TIR advertising INADDR_ANY gets the sender's address
    p.on_datagram(dgram(tirs=[app_tir(TOPIC, TcpTransport("0.0.0.0", 9), otid_n(4))]), SRC_ADDR, 0.2)
    assert p.events()[0].transport_body == TcpTransport("10.1.0.5", 9)
    assert p.stats()["otids_synthesised"] == 3


def test_domain_id_option_of_our_own_domain_is_a_real_source():
    p = mc_portal()
    p.add_remote_interest(TOPIC, 0.0)
    mine = app_tir(TOPIC, TcpTransport("10.1.0.5", 1), otid_n(5), extra=[DomainIdOption(0x8000, 1)])
    foreign = app_tir(TOPIC, TcpTransport("10.1.0.5", 2), otid_n(6), extra=[DomainIdOption(0x8000, 9)])
    p.on_datagram(dgram(tirs=[mine, foreign]), SRC_ADDR, 0.1)
    assert [e.otid for e in p.events()] == [otid_n(5)]


# ------------------------------------------------------------------ proxies, local interest


def proxy(aid=1, topic=TOPIC, otid=None, domain=2, **kw):
    return ProxySource(aid, topic, TcpTransport(*RELAY2), domain, otid or otid_n(100 + aid), **kw)


def test_proxy_answers_tqrs_and_batches_records():
    p = mc_portal()
    for aid in (1, 2, 3):
        p.add_proxy(proxy(aid, topic=f"md.t{aid}"), 0.0)
    out = p.tick(0.0)
    (first,) = out  # three adverts due together: one datagram
    assert [t.topic for t in decode(first.data).tirs] == ["md.t1", "md.t2", "md.t3"]
    p.on_datagram(dgram(tqrs=["md.t2", "md.none", "md.t2"]), SRC_ADDR, 0.005)
    (ans,) = p.data_to_send()
    assert ans.dest == GROUP1 and [t.topic for t in decode(ans.data).tirs] == ["md.t2"]
    assert p.events() == [LocalInterest("md.t2"), LocalInterest("md.none")]
    # many long topics due at once: several datagrams, none above 1400 bytes
    q = mc_portal()
    topics = [f"md.{i:03d}." + "x" * 200 for i in range(30)]
    for i, t in enumerate(topics):
        q.add_proxy(proxy(i + 1, topic=t), 0.0)
    out = q.tick(0.0)
    assert len(out) > 1 and all(len(o.data) <= 1400 for o in out)
    assert [t.topic for o in out for t in decode(o.data).tirs] == topics
    assert all(decode(o.data).version == 1 for o in out)


def test_proxy_topic_index_and_validation():
    p = mc_portal()
    otid = synthesize_otid(TcpTransport("10.9.9.9", 5), 4242)
    p.add_proxy(proxy(1, otid=otid), 0.0)
    p.add_proxy(proxy(2, otid=otid_n(9), topic_index=17), 0.0)
    tirs = decode(p.tick(0.0)[0].data).tirs
    assert [t.index for t in tirs] == [4242, 17]
    with pytest.raises(ValueError):
        p.add_proxy(proxy(3, domain=1), 0.0)  # from our own domain: a loop
    with pytest.raises(ValueError):
        p.add_proxy(ProxySource(4, TOPIC, TcpTransport(*RELAY2), 2, b"short"), 0.0)
    with pytest.raises(ValueError):
        relay_transport(0x10, *RELAY2)  # LBT-RM is not relayed


def test_proxy_timing_quiescence_and_final_adverts():
    p = mc_portal(final_adverts=2)
    p.add_proxy(proxy(1), 0.0)
    sent, _ = run_portal(p, 80.0)
    times = [t for t, _ in sent]
    assert gaps(times[:8]) == approx([0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.5])
    assert gaps(times[-3:]) == approx([1.0, 1.0])  # sustaining phase
    assert times[-1] < 66.0  # then quiescent: answers only
    assert p.next_deadline() == math.inf
    p.on_datagram(dgram(tqrs=[TOPIC]), SRC_ADDR, 80.0)
    assert len(p.data_to_send()) == 1
    p.add_proxy(proxy(1), 80.0)  # same values: no restart
    assert p.stats()["proxies_unchanged"] == 1
    assert p.next_deadline() == approx(380.0)  # only the TQR's local-interest timer
    assert p.remove_proxy(1, 90.0) and not p.remove_proxy(1, 90.0)
    sent, _ = run_portal(p, 100.0, start=90.0)
    assert [t for t, _ in sent] == approx([90.0, 90.01])
    assert all(decode(o.data).tirs[0].options[-1] == CostOption(0x80, 1, -1) for _, o in sent)
    p.on_datagram(dgram(tqrs=[TOPIC]), SRC_ADDR, 100.0)
    assert p.data_to_send() == []
    # no final adverts at all
    q = mc_portal(final_adverts=0)
    q.add_proxy(proxy(1), 0.0)
    q.tick(0.0)
    q.remove_proxy(1, 0.005)
    assert q.tick(0.01) == [] and q.next_deadline() == math.inf


def test_local_interest_lifetime():
    p = mc_portal(interest_timeout=300.0)
    acts = [
        (0.0, lambda now: p.on_datagram(dgram(tqrs=["md.a", "md.b"]), SRC_ADDR, now)),
        (100.0, lambda now: p.on_datagram(dgram(tqrs=["md.a"]), SRC_ADDR, now)),  # refresh
        (1.0, lambda now: p.add_proxy(proxy(1, topic="md.b"), now)),  # holds md.b
        (500.0, lambda now: p.remove_proxy(1, now)),
    ]
    _, events = run_portal(p, 1000.0, acts)
    assert events == [
        (0.0, LocalInterest("md.a")), (0.0, LocalInterest("md.b")),
        (approx(400.0), LocalInterestGone("md.a")),
        (approx(800.0), LocalInterestGone("md.b")),  # 300 s after the proxy went
    ]
    assert p.local_interests() == []


def test_wildcard_interest_both_ways():
    p = mc_portal()
    p.add_proxy(proxy(1, topic="md.x1"), 0.0)
    p.add_proxy(proxy(2, topic="fx.y"), 0.0)
    p.tick(0.0)
    p.on_datagram(dgram(wcs=[WcTQR(r"^md\.", 1)]), SRC_ADDR, 0.001)
    assert p.events() == [LocalInterest(r"^md\.", True, 1)]
    (ans,) = p.data_to_send()
    assert [t.topic for t in decode(ans.data).tirs] == ["md.x1"]
    p.on_datagram(dgram(wcs=[WcTQR("x", 9)]), SRC_ADDR, 0.002)  # unknown pattern type
    assert p.events() == [] and p.stats()["wc_tqrs_bad_type"] == 1
    # remote pattern interest: WC-TQRs into the TRD, matching sources reported
    q = mc_portal()
    q.add_remote_interest(r"^md\.", 0.0, pattern_type=2)
    (wq,) = q.tick(0.0)
    pkt = decode(wq.data)
    assert pkt.type == 1 and pkt.wc_tqrs == [WcTQR(r"^md\.", 2)]
    q.on_datagram(dgram(tirs=[app_tir("md.z", TcpTransport("10.1.0.5", 1), otid_n(7)),
                              app_tir("fx.z", TcpTransport("10.1.0.5", 2), otid_n(8))]), SRC_ADDR, 0.01)
    assert [e.topic for e in q.events()] == ["md.z"]
    assert q.remote_interests() == [(r"^md\.", 2)]


def test_hostile_wildcard_patterns_cannot_freeze_the_portal():
    """Defect: ``^(a+)+$`` (from a TRD's WC-TQR or the peer's INTEREST) against
    a topic of a's and a '!' backtracked exponentially in ``re`` and froze the
    router. Patterns from the wire run on a matcher that cannot backtrack."""
    import time

    evil, topic = r"^(a+)+$", "a" * 24 + "!"  # re: ~2**24 steps a match
    t0 = time.perf_counter()
    p = mc_portal()  # a TRD's wildcard query against our proxies
    p.add_proxy(proxy(1, topic=topic), 0.0)
    p.add_proxy(proxy(2, topic="a" * 24), 0.0)
    p.tick(0.0)
    p.on_datagram(dgram(wcs=[WcTQR(evil, 1)]), SRC_ADDR, 0.001)
    (ans,) = p.data_to_send()
    assert [t.topic for t in decode(ans.data).tirs] == ["a" * 24]
    q = mc_portal()  # the peer's pattern interest against the TRD's sources
    q.on_datagram(dgram(tirs=[app_tir(topic, TcpTransport("10.1.0.5", 1), otid_n(7))]), SRC_ADDR, 0.0)
    q.add_remote_interest(evil, 0.01, pattern_type=1)
    q.on_datagram(dgram(tirs=[app_tir(topic, TcpTransport("10.1.0.5", 1), otid_n(7))]), SRC_ADDR, 0.02)
    assert q.events() == []
    assert time.perf_counter() - t0 < 1.0
    # constructs that need backtracking are refused: counted, matching nothing
    q.add_remote_interest(r"(a)\1", 0.03, pattern_type=1)
    assert q.stats()["bad_patterns"] == 1


def test_a_flood_of_heavy_remote_patterns_is_refused_past_the_state_bound(monkeypatch):
    """Defect: a portal bounded how many remote interests it held but not
    their patterns' states: a peer's thousands of 2000-state patterns made
    every new topic of the TRD cost a search of each (~75 ms apiece). The
    remote patterns' distinct states, summed, are bounded
    (``max_remote_pattern_states``, MAX_HELD_STATES by default): a pattern
    beyond it is refused (ValueError) and counted; a new topic's TIR then
    costs at most that many matcher steps per character."""
    from router.core.interest import MAX_HELD_STATES
    from router.core.wildcard import Matcher

    searched: list[int] = []  # the states of each matcher searched
    real = Matcher.search
    monkeypatch.setattr(Matcher, "search", lambda self, text: searched.append(self.size) or real(self, text))
    p = mc_portal()
    assert p.max_remote_pattern_states == MAX_HELD_STATES
    refused = 0
    for k in range(100):
        try:
            p.add_remote_interest(f"(.?){{990}}x{k}", 0.0, pattern_type=1)
        except ValueError:
            refused += 1
    held = 100 - refused
    st = p.stats()
    assert 1 <= held < 5 and st["remote_pattern_states_refused"] == refused
    assert st["remote_interests"] == held and st["remote_pattern_states"] <= MAX_HELD_STATES
    # refused: not queried either
    assert len([w for o in p.tick(0.0) for w in decode(o.data).wc_tqrs]) == held
    # exact topics and patterns already held still pass
    p.add_remote_interest("exact", 0.1)
    p.add_remote_interest("(.?){990}x0", 0.1, pattern_type=1)
    p.add_remote_interest("(.?){990}x0", 0.1, pattern_type=2)  # the same text: no new states
    # a new topic's TIR: each pattern held searched once, their states summed within the bound
    searched.clear()
    topic = "a" * 254 + "!"
    for i in range(3):
        p.on_datagram(dgram(tirs=[app_tir(topic, TcpTransport("10.1.0.5", 1 + i), otid_n(70 + i))]),
                      SRC_ADDR, 0.2 + i / 100)
    assert len(searched) == held and sum(searched) <= MAX_HELD_STATES
    # cancelling gives the states back
    p.cancel_remote_interest("(.?){990}x0", 0.5, pattern_type=1)
    p.cancel_remote_interest("(.?){990}x0", 0.5, pattern_type=2)
    assert p.stats()["remote_pattern_states"] < st["remote_pattern_states"]
    p.add_remote_interest("(.?){990}x999", 0.6, pattern_type=1)
    # many cheap patterns fit
    q = mc_portal()
    for k in range(100):
        q.add_remote_interest(f"^md\\.{k}\\.", 0.0, pattern_type=1)
    assert q.stats()["remote_interests"] == 100 and "remote_pattern_states_refused" not in q.stats()
    with pytest.raises(ValueError):
        mc_portal(max_remote_pattern_states=-1)


def test_equal_otid_in_both_trds_is_not_taken_for_our_echo():
    """Defect: a source of this TRD with the same OTID as one of our proxies
    (e.g. synthesised from an identical private address in both TRDs) was
    taken for our own proxy's echo, so its topic was never bridged. An echo
    has our OTID *and* our relay address."""
    same = TcpTransport("10.1.0.5", 14371)  # the far TRD's source has this address too
    otid = synthesize_otid(same, 5)
    p = mc_portal()
    p.add_proxy(proxy(1, topic=TOPIC, otid=otid), 0.0)  # the far source, proxied here
    p.add_remote_interest(TOPIC, 0.0)
    p.events()
    p.on_datagram(dgram(tirs=[app_tir(TOPIC, same, None, index=5)]), SRC_ADDR, 0.1)  # ours, no OTID
    assert [(type(e).__name__, e.topic) for e in p.events()] == [("SourceSeen", TOPIC)]
    echo = app_tir(TOPIC, TcpTransport(*RELAY2), otid, index=5)  # our proxy's TIR, echoed
    p.on_datagram(dgram(tirs=[echo]), SRC_ADDR, 0.2)
    assert p.events() == [] and p.stats()["tirs_ignored_proxy_echo"] == 1


# ------------------------------------------------------------------ lbmrd / multicast wire behaviour


def test_lbmrd_keepalives_and_round_robin():
    d0, d1 = ("10.0.0.1", 15380), ("10.0.0.2", 15380)
    p = PortalTR(PortalTRSettings("p", 1, src_id=b"PORTAL01", mode="lbmrd", daemons=[d0, d1]), now=0.0)
    sent, _ = run_portal(p, 2.0)
    # idle: a keepalive to every daemon at creation and every 500 ms, 02/03 alternating
    assert [(t, o.dest) for t, o in sent] == [(approx(t), d) for t in (0, .5, 1, 1.5, 2) for d in (d0, d1)]
    assert [o.data for _, o in sent if o.dest == d0] == [RCV_ALIVE, SRC_ALIVE] * 2 + [RCV_ALIVE]
    # busy: TR traffic to the current daemon (changing every 200 ms), keepalives only when idle
    more, _ = run_portal(p, 8.0, [(3.0, lambda now: p.add_proxy(proxy(1), now))], start=2.0)
    tr = [(t, o) for t, o in more if len(o.data) > 4]
    assert {o.dest for _, o in tr} == {d0, d1}
    for t, o in tr:
        assert o.dest == (d0, d1)[int(math.floor(t / 0.2 + 1e-9)) % 2]
        assert p.current_daemon(t) == (0 if o.dest == d0 else 1)
    for d in (d0, d1):
        times = [t for t, o in sent + more if o.dest == d]
        assert max(gaps(times)) <= 0.5 + 1e-6
        for t, o in more:
            if o.dest == d and len(o.data) == 4:
                assert round(t - max(u for u in times if u < t - 1e-9), 6) == approx(0.5)
    assert p.stats()["keepalives_sent"] == sum(1 for _, o in sent + more if len(o.data) == 4)
    # datagrams from an address that is no daemon are ignored; the lbmrd's 0/0 reply is a keepalive
    p.on_datagram(dgram(tqrs=[TOPIC]), ("10.9.9.9", 15380), 8.0)
    p.on_datagram(bytes(4), d1, 8.0)
    st = p.stats()
    assert st["ignored_unknown_source"] == 1 and st["keepalives_received"] == 1
    assert p.events() == []


def test_multicast_sends_to_group_without_keepalives():
    p = mc_portal()
    sent, _ = run_portal(p, 3.0, [(0.5, lambda now: p.add_remote_interest(TOPIC, now)),
                                  (0.5, lambda now: p.add_proxy(proxy(1, topic="md.p"), now))])
    assert sent and all(o.dest == GROUP1 and len(o.data) > 4 for _, o in sent)
    first = decode(sent[0][1].data)
    assert first.tqrs == [TQR(TOPIC)] and [t.topic for t in first.tirs] == ["md.p"]  # one datagram
    # our own datagrams come back on the group: ignored
    p.on_datagram(sent[0][1].data, ("10.1.0.1", 12965), 3.0)
    assert p.stats()["ignored_own"] == 1 and p.events() == []


def test_undecodable_and_other_input_counted():
    p = mc_portal()
    for junk in (b"", b"\x01", b"\xff\x00\x00\x00garbage", b"\x00\x05\x00\x00"):
        p.on_datagram(junk, SRC_ADDR, 0.0)
    st = p.stats()
    assert st["undecodable"] == 4 and st["datagrams_received"] == 4
    assert p.events() == [] and p.data_to_send() == []
    p.on_datagram(dgram(tqrs=[TOPIC], src_type=1, src_id=b"OTHERRTR"), SRC_ADDR, 0.0)
    assert p.events() == [] and p.stats()["tqrs_ignored_router"] == 1


def test_constructor_checks():
    with pytest.raises(ValueError):
        PortalTR(PortalTRSettings("p", 1, src_id=b"short", mode="multicast", multicast=GROUP1), now=0.0)
    with pytest.raises(ValueError):
        PortalTR(PortalTRSettings("p", 0, src_id=b"PORTAL01", mode="multicast", multicast=GROUP1), now=0.0)
    with pytest.raises(ValueError):
        PortalTR(PortalTRSettings("p", 1, src_id=b"PORTAL01", mode="lbmrd"), now=0.0)
    with pytest.raises(ValueError):
        PortalTR(PortalTRSettings("p", 1, src_id=b"PORTAL01", mode="multicast", multicast=GROUP1,
                                  daemons=[DAEMON2]), now=0.0)
    with pytest.raises(ValueError):
        PortalTR(PortalTRSettings("p", 1, src_id=b"PORTAL01", mode="udp"), now=0.0)
    with pytest.raises(ValueError):
        mc_portal(source_timeout=1.0, requery_interval=2.0)
    with pytest.raises(ValueError):
        mc_portal().add_remote_interest("x" * 300, 0.0)
    assert isinstance(Outgoing(b"", GROUP1), tuple) and Timing().keepalive_interval == 0.5


def test_requeries_are_paced_and_spread():
    """Defect: every remote interest was re-queried in one burst every 5 s, with
    no rate limit or jitter (the DRO rate-limits its use queries)."""
    p = mc_portal(requery_rate=500.0, requery_jitter=0.2)
    topics = [f"md.t{i}" for i in range(2000)]
    for t in topics:
        p.add_remote_interest(t, 0.0)
    for i in range(0, 2000, 100):  # every topic resolved at 0.5
        tirs = [app_tir(t, TcpTransport("10.1.0.5", 14371), otid_n(j + 1))
                for j, t in enumerate(topics[i:i + 100], start=i)]
        p.on_datagram(dgram(tirs=tirs), SRC_ADDR, 0.5)
    times = []
    datagrams = 0
    now = 0.5
    while now < 9.0:
        now = min(p.next_deadline(), 9.0)
        counts = [len(decode(o.data).tqrs) for o in p.tick(now)]
        times += [now] * sum(counts)
        datagrams += sum(1 for c in counts if c)
    assert 2000 <= len(times) <= 2100  # each topic re-queried (from 4.5 s), the first again after 8.5
    assert datagrams <= len(times) / 5  # those held back go together, 20 ms steps (not one a datagram)
    per_second = Counter(int(t * 10) for t in times)  # per 100 ms
    assert max(per_second.values()) <= 50 + 50  # a burst of 50, then 500 a second
    assert max(times) - min(times) > 1.5  # spread by the jitter (and the pacing)


def test_end_of_session_queries_go_at_the_query_rate_and_say_when():
    """Defect (scale): 1,000 relayed sessions ended at once and their topics'
    queries waited for the periodic re-query rate (500 a second, bursts of
    50): the last went 2 s later, after the source deletion delay (1 s) that
    counted from the end of session. They go at the query rate (bursts of
    500, then 5,000 a second) and requery says when each goes."""
    p = mc_portal(requery_rate=500.0)
    topics = [f"md.t{i}" for i in range(1000)]
    for t in topics:
        p.add_remote_interest(t, 0.0)
    for i in range(0, 1000, 100):  # every topic resolved at 0.5: the bursts stop
        tirs = [app_tir(t, TcpTransport("10.1.0.5", 14371), otid_n(j + 1))
                for j, t in enumerate(topics[i:i + 100], start=i)]
        p.on_datagram(dgram(tirs=tirs), SRC_ADDR, 0.5)
    p.tick(0.5)
    slots = [p.requery(t, 1.0) for t in topics]
    assert slots[:501] == [1.0] * 501 and slots[-1] == approx(1.0 + 0.1)  # the 20 ms step after 1.0998
    assert p.requery("md.unknown", 1.0) is None  # no interest, no query
    sent = []
    now = 1.0
    while now < 1.2:
        now = min(p.next_deadline(), 1.2)
        sent += [(now, t.topic) for o in p.tick(now) for t in decode(o.data).tqrs]
    assert sorted(t for _, t in sent) == sorted(topics)  # each queried once, in 0.1 s
    assert len({t for t, _ in sent}) <= 6  # at once, then in 20 ms steps: a few datagrams
    assert all(t <= slots[topics.index(topic)] + 1e-6 for t, topic in sent)


def test_queries_of_sessions_ending_within_a_step_share_a_datagram():
    """Defect (scale): 1,000 sessions ended over 70 ms, a few at each turn of
    the router's loop, and each end's query went at once in a datagram of its
    own: 4,800 TR datagrams through the lbmrd, and as many answers. An end of
    session's query now waits for the next 20 ms step (``QUERY_STEP``), with
    every other query of that step."""
    p = mc_portal()
    topics = [f"md.t{i}" for i in range(60)]
    for t in topics:
        p.add_remote_interest(t, 0.0)
    tirs = [app_tir(t, TcpTransport("10.1.0.5", 14371), otid_n(j + 1)) for j, t in enumerate(topics)]
    p.on_datagram(dgram(tirs=tirs), SRC_ADDR, 0.5)
    p.tick(0.5)
    ended = [1.001 + 0.0003 * i for i in range(len(topics))]  # one end every 0.3 ms, from 1.001
    slots = []
    datagrams = []
    for t, now in zip(topics, ended, strict=True):
        slots.append(p.requery(t, now))
        datagrams += [o for o in p.tick(now) if decode(o.data).tqrs]
    assert datagrams == []  # none before the step
    assert slots == [approx(1.02)] * len(topics)
    datagrams = [o for o in p.tick(1.02) if decode(o.data).tqrs]
    assert len(datagrams) == 1 and len(decode(datagrams[0].data).tqrs) == len(topics)


def test_tr_request_and_use_query_datagrams_keep_their_bytes():
    """The TR request and the use queries are built as lbmr_proto packets; their
    bytes are those written out here by hand (header byte 0: version 1, options
    present, packet type; then the extended type and its flags, or the TMB
    header and the TMRs; then the portal's trailer). Big-endian."""
    import struct

    from lbmr_proto.um import um_trailer
    from router.core.tr import UseQuery

    uq = UseQuery(1.0, 3, 5.0)
    p = PortalTR(PortalTRSettings("p", 7, src_id=b"PORTAL01", mode="multicast", multicast=GROUP1,
                                  initial_request=(1.0, 0.5), use_query=uq, pattern_use_query=uq), now=0.0)
    trailer = um_trailer(b"PORTAL01", 1, 7)  # source id, source type TNWGD, version, domain 7
    request = bytes((0x1F, 0x04)) + struct.pack("!H", 0x0003) + trailer  # EXT 0x04: queries, wildcard queries
    assert p.tick(0.0) == [Outgoing(request, GROUP1)]
    p.on_datagram(dgram(tqrs=["md.a"]), SRC_ADDR, 0.0)
    p.on_datagram(dgram(wcs=[WcTQR("^md\\.", 1)]), SRC_ADDR, 0.0)

    def tmr(name: str, flags: int) -> bytes:  # length, type 1 (topic use), flags, name NUL-terminated
        return struct.pack("!HBB", 4 + len(name) + 1, 1, flags) + name.encode() + b"\0"

    body = tmr("md.a", 0) + tmr("^md\\.", 0x40)
    use_queries = bytes((0x1C, 0, 0, 0)) + struct.pack("!HH", 4 + len(body), 2) + body + trailer
    assert p.tick(5.0) == [Outgoing(use_queries, GROUP1)]
