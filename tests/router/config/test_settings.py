"""Every setting the router's file accepts takes effect (issue 11 item 6):
peer-link socket options, multicast TTL, topic resolution timing, interest
lifetime, logging and the statistics line. Each test fails if its setting is
not applied."""

from __future__ import annotations

import socket

import pytest
import trio

from router.config import ConfigError, load_config
from router.config.model import acceptor_peer, initiator_peer, lbmrd_endpoint, multicast_endpoint
from router.shell.single import Router
from tests.helpers import free_port, write
from tests.router.helpers import (
    ACCEPTOR,
    APP,
    GROUP,
    doc,
    endpoint,
    peer,
    portal,
    run_until,
    start_lbmrd,
    use_queries,
)


async def wait_connected(*routers, timeout=10.0):
    with trio.fail_after(timeout):
        while not all(r.link is not None and r.link.connected for r in routers):
            await trio.sleep(0.02)


def sockopt(router, level, opt):
    return router.link.stream.socket.getsockopt(level, opt)


async def _linked(nursery, a_peer_opts, b_peer_opts, *, a_interface=None):
    _, trd1 = await start_lbmrd(nursery, "127.0.1.1")
    _, trd2 = await start_lbmrd(nursery, "127.0.2.1")
    rb = Router("routerB", lbmrd_endpoint("B-TRD2", 2, [trd2], interface="127.0.2.1"),
                acceptor_peer("B-to-A", 0, interface="127.0.0.1", **b_peer_opts))
    b = await nursery.start(rb.run)
    ra = Router("routerA", lbmrd_endpoint("A-TRD1", 1, [trd1], interface="127.0.1.1"),
                initiator_peer("A-to-B", "127.0.0.1", b["peer"][1], reconnect_interval_ms=200,
                               interface=a_interface, **a_peer_opts))
    await nursery.start(ra.run)
    await wait_connected(ra, rb)
    return ra, rb


async def test_single_tcp_options_are_set_on_both_ends_of_the_link():
    opts = dict(receive_buffer=50_000, send_buffer=40_000, tcp_keepalive=True, nodelay=True)
    async with trio.open_nursery() as n:
        ra, rb = await _linked(n, opts, opts, a_interface="127.0.3.1")
        for r in (ra, rb):
            assert sockopt(r, socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1, r.name
            assert sockopt(r, socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1, r.name
            # Linux reports twice the value set (its bookkeeping overhead)
            assert sockopt(r, socket.SOL_SOCKET, socket.SO_RCVBUF) == 2 * 50_000, r.name
            assert sockopt(r, socket.SOL_SOCKET, socket.SO_SNDBUF) == 2 * 40_000, r.name
        # the initiator bound its <interface> before connecting
        assert ra.link.stream.socket.getsockname()[0] == "127.0.3.1"
        assert rb.link.stream.socket.getpeername()[0] == "127.0.3.1"
        n.cancel_scope.cancel()


async def test_without_keepalive_and_nodelay_the_link_keeps_nagle_and_no_tcp_keepalive():
    """The file's defaults (the DRO's): no SO_KEEPALIVE, TCP_NODELAY off (trio
    turns it on for every stream; the router turns it off again)."""
    opts = dict(tcp_keepalive=False, nodelay=False)
    async with trio.open_nursery() as n:
        ra, rb = await _linked(n, opts, opts)
        for r in (ra, rb):
            assert sockopt(r, socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0, r.name
            assert sockopt(r, socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0, r.name
        assert ra.link.stream.socket.getsockname()[0] == "127.0.0.1"  # no <interface>: the OS's choice
        n.cancel_scope.cancel()


def test_multicast_ttl_is_read_from_the_file(tmp_path):
    tr = ('      <topic-resolution>\n        <multicast group="239.192.0.1" port="13000" ttl="3"/>\n'
          '      </topic-resolution>\n')
    cfg = load_config(write(tmp_path, "ttl.xml", doc(portals=endpoint(tr) + peer(ACCEPTOR))))
    assert cfg.endpoint.multicast_ttl == 3
    bare = doc(portals=endpoint("      <topic-resolution><multicast/></topic-resolution>\n") + peer())
    assert load_config(write(tmp_path, "ttl0.xml", bare)).endpoint.multicast_ttl == 16  # UM's default
    bad = tr.replace('ttl="3"', 'ttl="256"')
    with pytest.raises(ConfigError, match="ttl"):
        load_config(write(tmp_path, "ttl1.xml", doc(portals=endpoint(bad) + peer(ACCEPTOR))))


async def test_multicast_ttl_is_set_on_the_portals_tr_socket():
    ep = multicast_endpoint("M", 1, "239.192.7.1", free_port(), interface="127.0.0.1", ttl=3)
    r = Router("routerM", ep, acceptor_peer("M-peer", 0, interface="127.0.0.1"))
    async with trio.open_nursery() as n:
        await n.start(r.run)
        assert r.tr_sock.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL) == 3
        n.cancel_scope.cancel()


# ------------------------------------------------ a cancelled interest withdraws its adverts


def test_cancelled_interest_withdraws_the_adverts_sent_for_it():
    from router import peerlink as P
    from tests.router.helpers import OTID, TOPIC, bridge, dgram, frames, source_tir

    b = bridge()
    b.link_up(0.0)
    b.peer_frame(P.Interest(P.InterestAction.ADD, TOPIC, 2), 0.0)
    b.peer_frame(P.Interest(P.InterestAction.ADD, "md.other", 2), 0.0)
    b.on_datagram(dgram(tirs=[source_tir(), source_tir("md.other", 14372, OTID[:-1] + b"\x02")]),
                  ("10.1.0.5", 12965), 0.05)
    assert [f.withdraw for f in frames(b)] == [False, False]
    b.peer_frame(P.Interest(P.InterestAction.CANCEL, TOPIC, 2), 0.1)
    assert frames(b) == [P.Advertisement(TOPIC, 1, OTID, P.StreamKind.TCP, 1, True)]
    assert b.advert_source(1) is None and b.advert_source(2) is not None  # md.other still wanted
    assert b.counters["adverts_withdrawn_uninterested"] == 1
    # interest again: advertised again (first=True in the portal) under a new id
    b.peer_frame(P.Interest(P.InterestAction.ADD, TOPIC, 2), 0.2)
    (adv,) = frames(b)
    assert (adv.topic, adv.withdraw) == (TOPIC, False)


def test_a_pattern_cancel_keeps_adverts_another_interest_still_covers():
    from router import peerlink as P
    from tests.router.helpers import TOPIC, bridge, dgram, frames, source_tir

    b = bridge()
    b.link_up(0.0)
    b.peer_frame(P.Interest(P.InterestAction.ADD, "^md\\.", 2, P.PatternType.PCRE), 0.0)
    b.peer_frame(P.Interest(P.InterestAction.ADD, TOPIC, 2), 0.0)
    b.on_datagram(dgram(tirs=[source_tir()]), ("10.1.0.5", 12965), 0.05)
    assert [f.withdraw for f in frames(b)] == [False]
    b.peer_frame(P.Interest(P.InterestAction.CANCEL, "^md\\.", 2, P.PatternType.PCRE), 0.1)
    assert frames(b) == []  # the exact topic still wants it
    b.peer_frame(P.Interest(P.InterestAction.CANCEL, TOPIC, 2), 0.2)
    assert [f.withdraw for f in frames(b)] == [True]


# ------------------------------------------------ topic resolution timing (PortalTR, sans-IO)


def tmb(*tmrs, src_id=b"APPCTX01") -> bytes:
    """A TOPIC_MGMT datagram of (name, type, flags) records, as a UM context sends it."""
    import struct

    from lbmr_proto import SourceIdOption
    from lbmr_proto.records import TMR
    from lbmr_proto.um import um_trailer

    body = b"".join(TMR(n, t, f).encode() for n, t, f in tmrs)
    trailer = um_trailer(src_id, 0, 0)
    assert SourceIdOption  # the trailer's first option carries src_id
    return bytes((0x1C, 0, 0, 0)) + struct.pack("!HH", 4 + len(body), len(tmrs)) + body + trailer


def test_use_queries_drop_a_silent_interest_after_max_unanswered():
    from router.core.tr import LocalInterest, LocalInterestGone, UseQuery
    from tests.router.helpers import dgram

    tr = portal(use_query=UseQuery(timeout=3.0, max=5, periodic_interval=300.0))
    tr.on_datagram(dgram(tqrs=["md.a"]), APP, 0.0)
    assert tr.events() == [LocalInterest("md.a")]
    log = run_until(tr, 400.0)
    sent = [(t, q) for t, out, _ in log for q in use_queries(out)]
    assert [t for t, _ in sent] == pytest.approx([300.0, 303.0, 306.0, 309.0, 312.0])
    assert {q for _, q in sent} == {("md.a", 0)}
    gone = [(t, e) for t, _, evs in log for e in evs if isinstance(e, LocalInterestGone)]
    assert gone == [(pytest.approx(315.0), LocalInterestGone("md.a"))]
    assert tr.stats()["local_interest_unanswered"] == 1 and tr.local_interests() == []


def test_a_use_response_or_a_query_keeps_the_interest_even_with_a_proxy():
    from router.core.tr import LocalInterestGone, ProxySource, UseQuery, relay_transport
    from tests.router.helpers import OTID, dgram

    tr = portal(use_query=UseQuery(timeout=2.0, max=2, periodic_interval=100.0))
    tr.on_datagram(dgram(tqrs=["md.a"]), APP, 0.0)
    # a proxy holds the interest: without use queries it would never end
    tr.add_proxy(ProxySource(1, "md.a", relay_transport(0, "10.1.0.1", 24000), 2, OTID), 0.0)
    run_until(tr, 100.5)
    tr.on_datagram(tmb(("md.a", 1, 0x80)), APP, 101.0)  # "still in use"
    log = run_until(tr, 250.0)
    assert [t for t, out, _ in log for _ in use_queries(out)] == pytest.approx([201.0, 203.0])
    tr.on_datagram(dgram(tqrs=["md.a"]), APP, 203.5)  # a TQR answers too
    log = run_until(tr, 307.0)
    assert [t for t, out, _ in log for _ in use_queries(out)] == pytest.approx([303.5, 305.5])
    assert not any(isinstance(e, LocalInterestGone) for _, _, evs in log for e in evs)
    # nobody answers any more: gone, although the proxy is still advertised
    log = run_until(tr, 320.0)
    assert [(t, e) for t, _, evs in log for e in evs if isinstance(e, LocalInterestGone)] == [
        (pytest.approx(307.5), LocalInterestGone("md.a"))]
    assert len(tr.proxies()) == 1


def test_an_answer_in_the_same_instant_as_the_use_query_counts():
    from router.core.tr import UseQuery
    from tests.router.helpers import dgram

    tr = portal(use_query=UseQuery(timeout=1.0, max=1, periodic_interval=10.0))
    tr.on_datagram(dgram(tqrs=["md.a"]), APP, 0.0)
    for k in range(1, 6):  # answered at once, every time: never dropped
        assert use_queries(tr.tick(10.0 * k)) == [("md.a", 0)]
        tr.on_datagram(tmb(("md.a", 1, 0x80)), APP, 10.0 * k)
        assert tr.tick(10.0 * k + 1.0) == [] and len(tr.local_interests()) == 1


def test_pattern_use_queries_have_their_own_timing_and_flags():
    from router.core.tr import LocalInterestGone, UseQuery

    tr = portal(use_query=UseQuery(1.0, 1, 1000.0), pattern_use_query=UseQuery(1.0, 1, 10.0))
    from lbmr_proto import Packet, SourceIdOption, WcTQR, encode

    wc = encode(Packet(type=1, version=1, wc_tqrs=[WcTQR("^md\\.", 1)],
                       options=[SourceIdOption(0x8000, b"APPCTX01")]))
    tr.on_datagram(wc, APP, 0.0)
    tr.events()
    log = run_until(tr, 20.0)
    assert [(t, q) for t, out, _ in log for q in use_queries(out)] == [(pytest.approx(10.0), ("^md\\.", 0x40))]
    assert [e for _, _, evs in log for e in evs] == [LocalInterestGone("^md\\.", True, 1)]


def test_a_leave_notice_asks_at_once_whether_others_still_use_the_topic():
    from router.core.tr import UseQuery
    from tests.router.helpers import dgram

    tr = portal(use_query=UseQuery(3.0, 5, 300.0))
    tr.on_datagram(dgram(tqrs=["md.a"]), APP, 0.0)
    run_until(tr, 50.0)
    tr.on_datagram(tmb(("md.a", 0, 0)), APP, 50.0)  # one receiver left
    log = run_until(tr, 51.0)
    assert [(t, q) for t, out, _ in log for q in use_queries(out)] == [(pytest.approx(50.0), ("md.a", 0))]


def test_use_queries_are_rate_limited_and_batched():
    from router.core.tr import UseQuery
    from tests.router.helpers import dgram

    tr = portal(use_query=UseQuery(30.0, 5, 100.0), use_query_rate=100.0)
    for i in range(300):
        tr.on_datagram(dgram(tqrs=[f"md.{i}"]), APP, 0.0)
    log = run_until(tr, 110.0)
    times = [t for t, out, _ in log for _ in use_queries(out)]
    assert len(times) == 300
    # bursts of 50, then 100 a second: the last of 300 goes out 2.5 s after the first
    assert times[0] == pytest.approx(100.0) and times[-1] == pytest.approx(102.5, abs=0.02)
    assert max(len(o.data) for _, out, _ in log for o in out) <= 1400
    assert tr.stats()["use_queries_deferred"] == 249  # a burst of 50 after the first


def test_without_use_queries_an_interest_held_by_a_proxy_never_ends():
    """The embedding default (use_query None) keeps the first version's rule."""
    from router.core.tr import ProxySource, relay_transport
    from tests.router.helpers import OTID, dgram

    tr = portal(interest_timeout=10.0)
    tr.on_datagram(dgram(tqrs=["md.a"]), APP, 0.0)
    tr.add_proxy(ProxySource(1, "md.a", relay_transport(0, "10.1.0.1", 24000), 2, OTID), 0.0)
    log = run_until(tr, 1000.0)
    assert not use_queries(o for _, out, _ in log for o in out)
    assert len(tr.local_interests()) == 1


def test_interest_refreshes_are_paced_from_min_doubling_to_max():
    from router.core.tr import LocalInterestRefresh
    from tests.router.helpers import dgram

    tr = portal(refresh_pacing=(1.0, 8.0))
    tr.on_datagram(dgram(tqrs=["md.a"]), APP, 0.0)
    log = run_until(tr, 40.0)
    times = [t for t, _, evs in log for e in evs if isinstance(e, LocalInterestRefresh)]
    assert times == pytest.approx([1.0, 3.0, 7.0, 15.0, 23.0, 31.0, 39.0])


def test_remote_interest_not_refreshed_expires_checked_a_few_at_a_time():
    from router.core.tr import RemoteCheck, RemoteInterestExpired

    tr = portal(remote_topic=RemoteCheck(check_interval=10.0, max_checked=2, timeout=25.0))
    for t in ("a", "b", "c"):
        tr.add_remote_interest(t, 0.0)
    tr.add_remote_interest("a", 20.0)  # refreshed (ADD or REFRESH from the peer)
    log = run_until(tr, 70.0)
    expired = [(t, e.topic) for t, _, evs in log for e in evs if isinstance(e, RemoteInterestExpired)]
    # checks at 10 (a, b), 20 (c, a), 30 (b: expired, c: expired), 40 (a), 50 (a: expired)
    assert expired == [(pytest.approx(30.0), "b"), (pytest.approx(30.0), "c"), (pytest.approx(50.0), "a")]
    assert tr.remote_interests() == []


def test_max_topics_bounds_each_check_not_the_interests():
    """<remote-topic max-topics> (DRO default 100) is how many interests one
    check looks at, not a limit on interests: 10,000 topics stay wanted."""
    from router.core.tr import RemoteCheck

    tr = portal(remote_topic=RemoteCheck(90.0, 100, 300.0))
    for i in range(10_000):
        tr.add_remote_interest(f"t.{i}", 0.0)
    assert len(tr.remote_interests()) == 10_000


def test_initial_request_burst():
    from lbmr_proto import decode

    tr = portal(initial_request=(1.0, 10.0))
    log = run_until(tr, 30.0)
    reqs = [t for t, out, _ in log for o in out if decode(o.data).type == 7]
    assert reqs == pytest.approx([float(i) for i in range(10)])
    pkt = next(decode(o.data) for _, out, _ in log for o in out if decode(o.data).type == 7)
    assert pkt.ext.flags == 0x0003  # queries and wildcard queries


def test_an_interest_refresh_travels_hop_by_hop_where_the_interest_went():
    """Each hop's portal drops interest that is not refreshed (<remote-topic>):
    a transit router passes the receivers' REFRESH on, once per link."""
    from router import peerlink as P
    from tests.router.helpers import Net

    n = Net("ABC")
    n.link("A", "B")
    n.link("B", "C")
    n.want("C", "t.one")
    n.got.clear()
    refresh = P.Interest(P.InterestAction.REFRESH, "t.one", 3, P.PatternType.TOPIC)
    n.deliver("C", [_send_on("C-B", refresh)])
    assert [(to, f.action) for to, _, f in n.got] == [("B", P.InterestAction.REFRESH),
                                                      ("A", P.InterestAction.REFRESH)]
    # a refresh of an interest B does not hold (lost, or expired) adds it again
    n.got.clear()
    n.deliver("C", [_send_on("C-B", P.Interest(P.InterestAction.REFRESH, "t.two", 3))])
    assert [(to, f.action) for to, _, f in n.got] == [("B", P.InterestAction.REFRESH),
                                                      ("A", P.InterestAction.ADD)]


def _send_on(link, frame):
    from router.core.transit import SendOnLink

    return SendOnLink(link, frame)


def test_lbmr_sim_receivers_answer_use_queries():
    """lbmr-sim plays UM contexts: a context with receivers of a topic answers a
    router's use query for it ("in use"), and only for topics it receives."""
    from lbmr_proto import decode
    from lbmr_tools.sim.context import Context

    ctx = Context(multicast=GROUP, start=0.0)
    ctx.add_receiver("md.a", now=0.0)
    names = [f"md.{'a' if i == 150 else i}" for i in range(300)]
    out = ctx.receive(tmb(*[(n, 1, 0) for n in names], src_id=b"ROUTER01"), 1.0, GROUP)
    (d,) = out  # a Datagram is the bytes, with .dest
    pkt = decode(d)
    assert pkt.type == 4 and [(m.name, m.type, m.flags) for m in pkt.tmb.tmrs] == [("md.a", 1, 0x80)]
    assert ctx.receive(tmb(("md.b", 1, 0)), 2.0, GROUP) == []
    assert ctx.receive(tmb(("md.a", 1, 0x80)), 2.0, GROUP) == []  # a response is not a query


# ------------------------------------------------ bridge: refreshes out, expiry withdraws


def test_bridge_refreshes_the_interest_it_sent_and_an_unrefreshed_one_withdraws():
    from router import peerlink as P
    from router.core.bridge import Bridge
    from router.core.tr import PortalTR, PortalTRSettings, RemoteCheck
    from tests.router.helpers import OTID, TOPIC, dgram, frames, source_tir

    tr = PortalTR(PortalTRSettings("A", 1, src_id=b"AAAAAAAA", mode="multicast", multicast=GROUP,
                                   source_timeout=300.0, requery_interval=100.0,
                                   refresh_pacing=(1.0, 4.0), remote_topic=RemoteCheck(5.0, 100, 12.0)),
                  now=0.0)
    b = Bridge(tr)
    b.link_up(0.0)
    b.on_datagram(dgram(tqrs=["md.local"]), APP, 0.0)
    assert [f.action for f in frames(b)] == [P.InterestAction.ADD]
    b.peer_frame(P.Interest(P.InterestAction.ADD, TOPIC, 2), 0.0)
    b.on_datagram(dgram(tirs=[source_tir()]), APP, 0.05)
    assert [(f.withdraw, f.advert_id) for f in frames(b)] == [(False, 1)]
    seen = []
    t = 0.05
    while t < 30.0:
        t = b.next_deadline()
        b.tick(t)
        seen += [(t, f) for f in frames(b)]
        if t < 8.0:
            b.peer_frame(P.Interest(P.InterestAction.REFRESH, TOPIC, 2), t)  # the peer refreshes until 8 s
            frames(b)  # (re-sent adverts)
    refreshes = [t for t, f in seen if isinstance(f, P.Interest) and f.action == P.InterestAction.REFRESH]
    assert refreshes[:4] == pytest.approx([1.0, 3.0, 7.0, 11.0])
    assert all(f.topic == "md.local" for _, f in seen if isinstance(f, P.Interest))
    # the peer's last refresh came before 8 s: at the check at 20 s, 12 s later, it is dropped
    (when, w), = [(t, f) for t, f in seen if isinstance(f, P.Advertisement)]
    assert w == P.Advertisement(TOPIC, 1, OTID, P.StreamKind.TCP, 1, True)
    assert when == pytest.approx(20.0)
    assert b.counters["remote_interest_expired"] == 1 and tr.remote_interests() == []


# ------------------------------------------------ <log> and <stats-interval>


def _record(msg: str, created: float):
    import logging

    r = logging.LogRecord("lbmr-router", logging.INFO, __file__, 1, msg, None, None)
    r.created = created
    return r


def test_log_file_rolls_daily_and_keeps_every_rolled_file(tmp_path):
    import calendar

    from router.logs import RollingFileHandler

    day = calendar.timegm((2026, 11, 23, 0, 0, 0))
    path = tmp_path / "router.log"
    h = RollingFileHandler(str(path), "daily", start=day + 10)  # as if started on the 23rd
    h.emit(_record("first", day + 10))
    h.emit(_record("second", day + 86399))
    h.emit(_record("third", day + 86400 + 5))  # the 24th: the 23rd's file is rolled
    h.emit(_record("fourth", day + 2 * 86400 + 5))
    h.close()
    assert path.read_text() == "fourth\n"
    assert (tmp_path / "router.log.2026-11-23.1").read_text() == "first\nsecond\n"
    assert (tmp_path / "router.log.2026-11-24.1").read_text() == "third\n"


def test_log_file_rolls_hourly_and_by_size_with_sequence_numbers(tmp_path):
    import calendar

    from router.logs import RollingFileHandler

    hour = calendar.timegm((2026, 11, 23, 7, 0, 0))
    path = tmp_path / "r.log"
    h = RollingFileHandler(str(path), "hourly", max_bytes=100, start=hour)
    line = "x" * 39  # 40 bytes with the newline: two fit in 100, the third rolls
    for i in range(5):
        h.emit(_record(line, hour + i))
    h.emit(_record("next hour", hour + 3600))
    h.close()
    assert (tmp_path / "r.log.2026-11-23T07.1").read_text() == f"{line}\n" * 2
    assert (tmp_path / "r.log.2026-11-23T07.2").read_text() == f"{line}\n" * 2
    assert (tmp_path / "r.log.2026-11-23T07.3").read_text() == f"{line}\n"
    assert path.read_text() == "next hour\n"
    # appended, never truncated: a new handler on the same file continues it
    h = RollingFileHandler(str(path))
    h.emit(_record("again", hour + 3601))
    h.close()
    assert path.read_text() == "next hour\nagain\n"


def test_log_type_syslog_sends_to_the_syslog_socket(tmp_path):
    import logging

    from router.config.model import LogConfig
    from router.logs import log_handler

    addr = str(tmp_path / "log.sock")
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sink.bind(addr)
    sink.settimeout(5)
    h = log_handler(LogConfig("syslog"), syslog_address=addr)
    h.setFormatter(logging.Formatter("%(message)s"))
    h.emit(_record("peer_up A <-> B", 0.0))
    got = sink.recv(4096).decode()
    h.close()
    sink.close()
    # <PRI> with facility daemon (3) and severity info (6): 3 * 8 + 6 = 30
    assert got.startswith("<30>lbmr-router: peer_up A <-> B"), got
    assert log_handler(LogConfig("console")) is None


async def test_stats_line_every_stats_interval(autojump_clock):
    import logging

    from router.cli import run_router
    from router.config.model import router_config
    from router.shell.router import MultiRouter

    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append((trio.current_time(), record.getMessage()))

    logger = logging.getLogger("lbmr-router")
    keep = Keep()
    logger.addHandler(keep)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        ep = multicast_endpoint("M", 1, "239.192.7.2", free_port(), interface="127.0.0.1")
        router = MultiRouter(router_config("r", [ep], [acceptor_peer("p", 0, interface="127.0.0.1")]))
        async with trio.open_nursery() as n:
            await n.start(run_router, router, 10.0)
            t0 = trio.current_time()
            await trio.sleep(35.0)
            n.cancel_scope.cancel()
        stats = [(t - t0, m) for t, m in lines if m.startswith("stats ")]
        assert [round(t) for t, _ in stats] == [10, 20, 30]
        assert stats[0][1].startswith("stats links=0/1 proxies=0 adverts=0 local_interest=0")
        lines.clear()
        async with trio.open_nursery() as n:
            await n.start(run_router, MultiRouter(router_config("r0", [ep])), 0.0)  # 0 = never
            await trio.sleep(100.0)
            n.cancel_scope.cancel()
        assert not [m for _, m in lines if m.startswith("stats ")]
    finally:
        logger.removeHandler(keep)
        logger.setLevel(level)


def _router_file(tmp_path, log: str, stats_ms: int) -> str:
    port = free_port()
    return f"""<?xml version="1.0" encoding="UTF-8" ?>
<lbmr-router version="1.0">
  <daemon>
    <name>logger</name>
    {log}
    <stats-interval>{stats_ms}</stats-interval>
  </daemon>
  <portals>
    <endpoint>
      <name>M</name>
      <domain-id>1</domain-id>
      <topic-resolution><multicast group="239.192.7.3" port="{port}" interface="127.0.0.1"/></topic-resolution>
      <relay interface="127.0.0.1" port-low="{port}" port-high="{port}"/>
    </endpoint>
    <peer>
      <name>P</name>
      <single-tcp><interface>127.0.0.1</interface><acceptor><listen-port>{free_port(socket.SOCK_STREAM)}</listen-port></acceptor></single-tcp>
    </peer>
  </portals>
</lbmr-router>
"""


def _run_router_process(args, until, timeout=20.0, stdout_file=None):
    """Run lbmr-router with ``args`` until ``until()``, then SIGTERM it; its standard
    output (written to ``stdout_file`` as it runs, when given)."""
    import signal
    import subprocess
    import time

    from tests.helpers import ROUTER

    out_to = open(stdout_file, "wb") if stdout_file else subprocess.PIPE
    p = subprocess.Popen(ROUTER + args, stdout=out_to, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout
        while not until():
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "the router did not log as expected"
            time.sleep(0.05)
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=10)
        if stdout_file:
            out_to.close()
            out = stdout_file.read_bytes()
    assert p.returncode == 0, err
    return out.decode()


def test_the_router_logs_to_its_log_file_with_stats_lines_and_L_wins(tmp_path):
    cfg = write(tmp_path, "r.xml", _router_file(tmp_path, '<log type="file">r.log</log>', 200))
    log = tmp_path / "r.log"

    def stats_lines(p):
        return [x for x in p.read_text().splitlines() if "] lbmr-router: stats links=0/1" in x] \
            if p.exists() else []

    out = _run_router_process([str(cfg)], lambda: len(stats_lines(log)) >= 3)
    assert out == ""  # nothing on standard output: it all went to the file
    text = log.read_text()
    assert "lbmr-router logger starting" in text and "final stats links=" in text
    # -L on the command line wins over the file's <log>
    other = tmp_path / "other.log"
    size = log.stat().st_size
    _run_router_process(["-L", str(other), str(cfg)], lambda: len(stats_lines(other)) >= 1)
    assert log.stat().st_size == size


def test_console_log_without_stats_lines(tmp_path):
    cfg = write(tmp_path, "c.xml", _router_file(tmp_path, '<log type="console"/>', 0))
    import time

    console = tmp_path / "stdout"
    started: list[float] = []

    def a_while_after_start() -> bool:  # the router runs 1.5 s once it logged its start (a loaded host starts late)
        if not started and console.exists() and b"lbmr-router logger starting" in console.read_bytes():
            started.append(time.monotonic())
        return bool(started) and time.monotonic() > started[0] + 1.5

    out = _run_router_process([str(cfg)], a_while_after_start, stdout_file=console)
    assert "lbmr-router logger starting" in out
    assert "] lbmr-router: stats " not in out and "final stats" in out


# ------------------------------------------------ <gateway-keepalive idle="no">


def test_gateway_keepalive_idle_no_sends_keepalives_whatever_else_is_sent():
    from router.peerlink import Interest, InterestAction, Keepalive, decode
    from tests.router.helpers import connected_peers, deliver_and_answer

    for idle, expected in ((True, []), (False, [5, 10, 15, 20])):
        a, b = connected_peers(a_keepalive_idle=idle, a_dead_after=0)
        sent = []
        for t in range(1, 21):  # a sends a frame every second: never idle
            data = a.send(Interest(InterestAction.REFRESH, "md.x", 1), float(t))
            out, evs = a.tick(float(t))
            assert evs == []
            if out:
                assert isinstance(decode(out), Keepalive)
                sent.append(t)
                data += out
            deliver_and_answer(a, b, data, float(t))
        assert sent == expected, idle
    assert a.rtt.count == 4  # answered


def test_the_router_passes_idle_no_to_its_link():
    from router.config.model import KeepaliveConfig, PeerConfig

    p = initiator_peer("p", "127.0.0.1", 1)
    assert p.keepalive.idle and p.keepalive_interval == 5.0
    q = PeerConfig("q", initiator=p.initiator, keepalive=KeepaliveConfig(False, 2000, 6000))
    assert q.keepalive_interval == 2.0 and not q.keepalive.idle  # not "0 = none" any more


async def test_interfaces_given_as_device_or_network_are_bound():
    """<interface> as a device name or a CIDR network works when the router
    starts, for the TR socket, the relay and the peer link (not only literal
    addresses)."""
    async with trio.open_nursery() as n:
        _, trd = await start_lbmrd(n, "127.0.0.1")
        r = Router("routerI", lbmrd_endpoint("I", 1, [trd], interface="lo"),
                   acceptor_peer("I-peer", 0, interface="127.0.0.0/8"))
        got = await n.start(r.run)
        assert got["tr"][0] == "127.0.0.1"  # not 0.0.0.0, the default without <interface>
        assert got["peer"][0] == "127.0.0.1"
        assert r.endpoint.relay_ip == "127.0.0.1"
        n.cancel_scope.cancel()


# ------------------------------------------------ end to end: use queries notice a receiver that left


async def test_receiver_that_left_is_noticed_by_use_queries_and_its_proxy_withdrawn(autojump_clock):
    import dataclasses

    from lbmr_proto import decode
    from router.config.model import UseQuery as UseQueryConfig
    from tests.router.helpers import ROUTED_TOPIC, advertise_forever, resolve, udp

    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        eb = lbmrd_endpoint("B-TRD2", 2, [trd2], interface="127.0.2.1")
        eb = dataclasses.replace(eb, topic_resolution=dataclasses.replace(
            eb.topic_resolution, topic_use_query=UseQueryConfig(300, 2, 1000)))
        rb = Router("routerB", eb, acceptor_peer("B-to-A", 0, interface="127.0.0.1"))
        b = await n.start(rb.run)
        ra = Router("routerA", lbmrd_endpoint("A-TRD1", 1, [trd1], interface="127.0.1.1"),
                    initiator_peer("A-to-B", "127.0.0.1", b["peer"][1], reconnect_interval_ms=200))
        await n.start(ra.run)
        await wait_connected(ra, rb)
        src = udp("127.0.1.1")
        n.start_soon(advertise_forever, src, trd1, "127.0.1.1", 14999)
        rcv = udp("127.0.2.1")
        await resolve(rcv, trd2, timeout=10.0)
        assert ra.bridge.advert_sources() and rb.bridge.proxy_addresses()
        # the receiver answers use queries for a while: the proxy stays
        answered = 0
        finals = 0
        with trio.move_on_after(5.0):
            while True:
                data, _ = await rcv.recvfrom(65535)
                pkt = decode(data)
                if pkt.type == 4 and any(m.name == ROUTED_TOPIC and not m.flags & 0x80 for m in pkt.tmb.tmrs):
                    await rcv.sendto(tmb((ROUTED_TOPIC, 1, 0x80)), trd2)
                    answered += 1
        assert answered >= 3
        assert rb.tr.stats()["use_responses_received"] >= 3
        assert ra.bridge.advert_sources() and rb.bridge.proxy_addresses()
        # it leaves without a word (resolved receivers are quiet): noticed after
        # 2 unanswered use queries, the interest is cancelled, the advert withdrawn,
        # the proxy stopped with its final advertisements
        with trio.fail_after(5.0):
            while ra.bridge.advert_sources() or rb.bridge.proxies():
                with trio.move_on_after(0.05):
                    data, _ = await rcv.recvfrom(65535)
                    for t in decode(data).tirs:
                        finals += any(getattr(o, "cost", None) == -1 for o in t.options or ())
        assert rb.tr.stats()["local_interest_unanswered"] == 1
        assert ra.counters["adverts_withdrawn_uninterested"] == 1
        assert rb.tr.local_interests() == [] and ra.tr.remote_interests() == []
        with trio.move_on_after(1.0):
            while True:
                data, _ = await rcv.recvfrom(65535)
                for t in decode(data).tirs:
                    finals += any(getattr(o, "cost", None) == -1 for o in t.options or ())
        assert finals >= 1
        n.cancel_scope.cancel()


def test_a_peer_adding_and_cancelling_in_a_loop_keeps_the_check_queue_bounded():
    from router.core.tr import RemoteCheck, RemoteInterestExpired

    tr = portal(remote_topic=RemoteCheck(90.0, 100, 300.0))
    tr.add_remote_interest("kept", 0.0)
    for i in range(50_000):
        tr.add_remote_interest("churn", float(i))
        tr.cancel_remote_interest("churn", float(i))
    assert tr.stats()["remote_checks_queued"] <= 2 * 1 + 1024 + 1
    # "kept" is still queued: a later check finds it stale and expires it
    tr.events()
    expired = []
    for k in range(1, 21):
        tr.tick(50_000.0 + 90.0 * k)
        expired += [ev.topic for ev in tr.events() if isinstance(ev, RemoteInterestExpired)]
    assert expired == ["kept"]


# ------------------------------------------------ <source-deletion-delay>


async def test_source_deletion_delay_is_the_configured_one(autojump_clock):
    """A source whose session ended is withdrawn <source-deletion-delay> later:
    5 s configured, so not at the default 1 s, and well before the 16 s
    source timeout."""
    from tests.router.helpers import endless_source, resolve, start_routers, udp

    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        ra, rb = await start_routers(n, trd1, trd2, source_deletion_delay_ms=5000)
        source = await endless_source(n, trd1)
        t = await resolve(udp("127.0.2.9"), trd2)
        rcv = await trio.open_tcp_stream(t.transport.ip, t.transport.port)
        with trio.fail_after(5):
            await rcv.receive_some(1000)
        source.cancel()
        died = trio.current_time()
        with trio.fail_after(10):
            while rb.status()["proxies"]:
                await trio.sleep(0.05)
        waited = trio.current_time() - died
        assert 5.0 <= waited < 6.0, waited
        assert ra.counters["sources_ended"] == 1
        n.cancel_scope.cancel()


# ------------------------------------------------ <tls><cipher-suites>


async def test_cipher_suites_decide_the_links_cipher(tmp_path):
    from router.config.model import TlsConfig
    from tests.router.helpers import make_ca, make_certs

    ca_key, ca = make_ca(tmp_path, "ca")
    a_crt, a_key = make_certs(tmp_path, "a", ca_key, ca)
    b_crt, b_key = make_certs(tmp_path, "b", ca_key, ca)
    suite, other = "ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384"

    async def link(a_suites, b_suites):
        async with trio.open_nursery() as n:
            _, trd1 = await start_lbmrd(n, "127.0.1.1")
            _, trd2 = await start_lbmrd(n, "127.0.2.1")
            rb = Router("routerB", lbmrd_endpoint("B", 2, [trd2], interface="127.0.2.1"),
                        acceptor_peer("B-to-A", 0, interface="127.0.0.1",
                                      tls=TlsConfig(b_crt, b_key, trusted_certificates=ca,
                                                    cipher_suites=b_suites)))
            addr = await n.start(rb.run)
            ra = Router("routerA", lbmrd_endpoint("A", 1, [trd1], interface="127.0.1.1"),
                        initiator_peer("A-to-B", "127.0.0.1", addr["peer"][1], reconnect_interval_ms=200,
                                       tls=TlsConfig(a_crt, a_key, trusted_certificates=ca,
                                                     cipher_suites=a_suites)))
            await n.start(ra.run)
            with trio.fail_after(10):
                while not (rb.link is not None and rb.link.connected) and not rb.counters["tls_failed"]:
                    await trio.sleep(0.05)
            got = rb.link.stream.cipher() if rb.link is not None and rb.link.connected else None
            n.cancel_scope.cancel()
            return got, rb.counters["tls_failed"]

    (name, version, _), failed = await link(suite, f"{other}:{suite}")
    assert (name, version, failed) == (suite, "TLSv1.2", 0)
    (name, version, _), _ = await link(None, None)  # no list: TLS 1.3 and its own suites
    assert version == "TLSv1.3"
    assert await link(suite, other) == (None, 1)  # nothing in common: refused


# ------------------------------------------------ <port-range>, <max-queue>


async def test_tr_socket_binds_the_first_free_port_of_its_range_and_max_queue_bounds_the_link():
    from router.config.model import PortRange

    base = free_port(ip="127.0.2.1")
    busy = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    busy.bind(("127.0.2.1", base))
    try:
        async with trio.open_nursery() as n:
            _, trd1 = await start_lbmrd(n, "127.0.1.1")
            _, trd2 = await start_lbmrd(n, "127.0.2.1")
            rb = Router("routerB", lbmrd_endpoint("B", 2, [trd2], interface="127.0.2.1",
                                                  tr_ports=PortRange(base, base + 3)),
                        acceptor_peer("B-to-A", 0, interface="127.0.0.1", max_queue=100_000))
            b = await n.start(rb.run)
            assert base < b["tr"][1] <= base + 3  # the first port was taken
            ra = Router("routerA", lbmrd_endpoint("A", 1, [trd1], interface="127.0.1.1"),
                        initiator_peer("A-to-B", "127.0.0.1", b["peer"][1], max_queue=70_000))
            await n.start(ra.run)
            await wait_connected(ra, rb)
            assert rb.link.outq.max_data_bytes == 100_000 and ra.link.outq.max_data_bytes == 70_000
            n.cancel_scope.cancel()
    finally:
        busy.close()
