"""Access control lists of lbmr-router's portals (the DRO's ``<acl>``): the
evaluator (router/core/acl.py), the ``<acl>`` parser (router/config/acl.py), the
configuration loader's file:line errors, and the bridge's enforcement."""

from __future__ import annotations

import contextlib
import re
import signal
import socket
from pathlib import Path

import pytest
import trio
from lxml import etree

from lbmr_proto import Packet, SourceIdOption, WcTQR, encode
from lbmr_proto.constants import PacketType, Transport
from lbmr_proto.records import LbtipcTransport, LbtrmTransport, LbtruTransport, TcpTransport
from router import peerlink as P
from router.config import ConfigError, load_config
from router.config.acl import parse_acl
from router.core.acl import (
    CACHE_TOPICS,
    MAX_ACL_STATES,
    MAX_TOPIC_CHARS,
    OPEN,
    Ace,
    Acl,
    AclError,
    Action,
    Comparison,
    Direction,
    FieldCompare,
    PortalAcl,
    Session,
    SessionField,
    TopicIs,
    TopicPattern,
    TransportIs,
)
from router.core.bridge import Bridge
from router.core.bridge_outputs import Notice, SendFrame, StartProxy
from router.core.tr import PortalTR, PortalTRSettings
from router.shell.router import MultiRouter
from tests.helpers import free_port, write
from tests.router.helpers import (
    APP,
    GROUP,
    IPS,
    OTID,
    ROUTE_INFO,
    advert,
    advertise_forever,
    converged,
    dgram,
    doc,
    endpoint,
    expect_error,
    expect_ok,
    fetch,
    pattern,
    peer,
    resolve,
    source_tir,
    start_lbmrd,
    tcp_source,
    udp,
)

ACCEPT, REJECT = Action.ACCEPT, Action.REJECT


def acl(*entries: Ace, direction: Direction = Direction.INBOUND) -> Acl:
    return Acl(list(entries), direction)


def accept(*conds, **kw) -> Ace:
    return _ace(ACCEPT, conds, **kw)


def reject(*conds, **kw) -> Ace:
    return _ace(REJECT, conds, **kw)


def _ace(action, conds, **kw) -> Ace:
    topics = tuple(c for c in conds if isinstance(c, TopicIs | TopicPattern))
    session = tuple(c for c in conds if not isinstance(c, TopicIs | TopicPattern))
    return Ace(action, topics, session, **kw)


TCP = Session.of("tcp", source_ip="10.1.1.5", tcp_source_port=14371)
RU = Session.of("lbt-ru", source_ip="10.1.1.6", udp_source_port=14380)
RM = Session.of("lbtrm", source_ip="10.1.1.7", multicast_group="239.1.1.1",
                udp_source_port=14390, udp_destination_port=14400)


# --------------------------------------------------------------------------- the evaluator


def test_accept_reject_and_unmatched_rejected():
    a = acl(accept(TopicIs("ABC")), reject(TopicIs("DEF")))
    assert a.allows("ABC")
    assert not a.allows("DEF")
    d = a.decide("GHI")
    assert (d.accepted, d.entry) == (False, None)  # implicit reject-all at the end
    assert a.decide("ABC").entry == 0 and a.decide("DEF").entry == 1


def test_first_match_wins_specific_before_general():
    # the DRO's USER.user1 example: specific accept, general reject, catch-all accept
    a = acl(accept(TopicIs("USER.user1")), reject(TopicPattern(r"^USER\..*")),
            accept(TopicPattern(".*")))
    assert a.allows("USER.user1")
    assert not a.allows("USER.user2")
    assert a.allows("prices.EUR")
    # in the other order the general rule shadows the specific one
    b = acl(reject(TopicPattern(r"^USER\..*")), accept(TopicIs("USER.user1")))
    assert not b.allows("USER.user1")


def test_topic_is_exact_and_pattern_searches():
    assert acl(accept(TopicIs("A.B"))).allows("A.B")
    assert not acl(accept(TopicIs("A.B"))).allows("AxB")  # not a pattern
    assert not acl(accept(TopicIs("A.B"))).allows("A.B.C")
    p = acl(accept(TopicPattern("^A[AB]A$")), direction=Direction.OUTBOUND)
    assert [p.allows(t) for t in ("AAA", "ABA", "ACA", "AAAA")] == [True, True, False, False]
    assert acl(accept(TopicPattern("price/us/"))).allows("global/price/us/IBM")  # unanchored search


def test_topic_conditions_of_one_entry_are_alternatives():
    a = acl(accept(TopicPattern("^global/"), TopicPattern("^price/us/"), TopicIs("health_check")))
    assert a.allows("global/x") and a.allows("price/us/IBM") and a.allows("health_check")
    assert not a.allows("price/eu/SAP")


def test_transport_condition_inbound():
    a = acl(accept(TopicIs("DEF"), TransportIs(Transport.LBTRM)), accept(TopicIs("ABC")))
    assert a.allows("DEF", RM)
    assert not a.allows("DEF", TCP)
    assert a.allows("ABC", TCP)
    ne = acl(reject(TransportIs(Transport.TCP, equal=False)), accept(TopicPattern(".*")))
    assert ne.allows("x", TCP) and not ne.allows("x", RU)


def test_source_ip_equal_and_range():
    a = acl(accept(FieldCompare(SessionField.SOURCE_IP, Comparison.EQ, 0x0A010105)))
    assert a.allows("t", TCP)
    assert not a.allows("t", RU)  # 10.1.1.6
    lo = int.from_bytes(bytes([10, 1, 1, 6]), "big")
    hi = int.from_bytes(bytes([10, 1, 1, 7]), "big")
    r = acl(accept(TopicPattern("^t"), FieldCompare(SessionField.SOURCE_IP, Comparison.GE, lo),
                   FieldCompare(SessionField.SOURCE_IP, Comparison.LE, hi)))
    assert [r.allows("t", s) for s in (TCP, RU, RM)] == [False, True, True]
    assert not r.allows("x", RU)  # the topic condition still applies


def test_conditions_that_do_not_apply_are_ignored_but_an_entry_needs_one():
    port = FieldCompare(SessionField.UDP_SOURCE_PORT, Comparison.EQ, 14380)
    # topic matches, the UDP port does not apply to TCP: ignored, the entry matches
    assert acl(accept(TopicIs("t"), port)).allows("t", TCP)
    # an entry with only inapplicable conditions never matches (default reject stays)
    assert not acl(accept(port)).allows("t", TCP)
    assert acl(accept(port)).allows("t", RU)
    group = FieldCompare(SessionField.MULTICAST_GROUP, Comparison.EQ, 0xEF010101)
    assert not acl(reject(group), accept(TopicPattern(".*"))).allows("t", RM)
    assert acl(reject(group), accept(TopicPattern(".*"))).allows("t", TCP)


def test_other_fields_from_transport_bodies():
    tcp = Session.from_transport(TcpTransport("10.1.1.5", 14371))
    assert (tcp.transport, tcp.source_ip, tcp.tcp_source_port, tcp.udp_source_port) == (
        Transport.TCP, 0x0A010105, 14371, None)
    ru = Session.from_transport(LbtruTransport("10.1.1.6", 14380))
    assert (ru.udp_source_port, ru.tcp_source_port) == (14380, None)
    rm = Session.from_transport(LbtrmTransport("10.1.1.7", "239.1.1.1", 7, 14400, 14390))
    assert (rm.multicast_group, rm.udp_destination_port, rm.udp_source_port) == (0xEF010101, 14400, 14390)
    ipc = Session.from_transport(LbtipcTransport(1, 2, 33))
    assert (ipc.xport_id, ipc.source_ip) == (33, None)
    dport = acl(accept(FieldCompare(SessionField.UDP_DESTINATION_PORT, Comparison.LT, 14401)))
    assert dport.allows("t", rm) and not dport.allows("t", tcp)
    xid = acl(accept(FieldCompare(SessionField.XPORT_ID, Comparison.NE, 33)))
    assert not xid.allows("t", ipc)
    tport = acl(accept(FieldCompare(SessionField.TCP_SOURCE_PORT, Comparison.GT, 14000)))
    assert tport.allows("t", tcp) and not tport.allows("t", ru)


def test_outbound_ignores_sessions():
    out = acl(accept(TopicIs("t"), TransportIs(Transport.LBTRM)), direction=Direction.OUTBOUND)
    assert out.allows("t", TCP)  # the transport condition means nothing outbound


def test_unknown_session_may_allow_for_interest():
    a = acl(reject(TopicIs("t"), TransportIs(Transport.TCP)),
            accept(TopicIs("t"), TransportIs(Transport.LBTRU)), reject(TopicPattern(".*")))
    assert a.may_allow("t")  # an LBT-RU source of t would be accepted
    assert not a.allows("t", TCP) and a.allows("t", RU)
    assert not a.may_allow("u")
    b = acl(reject(TopicIs("t"), TransportIs(Transport.TCP)), accept(TopicIs("t")))
    assert b.may_allow("t")
    c = acl(reject(TopicIs("t")), accept(TopicIs("t"), TransportIs(Transport.TCP)))
    assert not c.may_allow("t")
    d = acl(accept(TransportIs(Transport.TCP)))  # session conditions only
    assert d.may_allow("anything")


def test_portal_acl_directions_and_patterns():
    p = PortalAcl("ep", inbound=acl(accept(TopicIs("in"))),
                  outbound=acl(accept(TopicIs("out")), direction=Direction.OUTBOUND))
    assert p.configured and not OPEN.configured
    assert p.allows_source_in("in", TCP) and not p.allows_source_in("out", TCP)
    assert p.allows_source_out("out") and not p.allows_source_out("in")
    assert p.allows_interest_in("out") and not p.allows_interest_in("in")
    assert p.allows_interest_out("in") and not p.allows_interest_out("out")
    # wildcard patterns pass: their concrete topics are tested as sources
    assert p.allows_interest_in("^x.*", pattern_type=1) and p.allows_interest_out("^x", pattern_type=2)
    only_out = PortalAcl("ep", outbound=acl(accept(TopicIs("o")), direction=Direction.OUTBOUND))
    assert only_out.allows_source_in("anything", TCP) and only_out.allows_interest_out("anything")
    assert all(f("x") for f in (OPEN.allows_source_in, OPEN.allows_source_out,
                                OPEN.allows_interest_in, OPEN.allows_interest_out))


def test_regex_pattern_posix_classes():
    a = acl(accept(TopicPattern("^[[:upper:]]+[[:digit:]]$", "regex")))
    assert a.allows("ABC7") and not a.allows("abc7") and not a.allows("ABC")
    with pytest.raises(AclError, match="unknown POSIX character class"):
        TopicPattern("[[:bogus:]]", "regex")


# --------------------------------------------------------------------------- bounded time


@contextlib.contextmanager
def watchdog(seconds: int):
    """Raise in the test instead of hanging if the block runs for ``seconds``."""
    def expired(signum, frame):
        raise AssertionError(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_catastrophic_patterns_are_linear_or_refused():
    a = acl(accept(TopicPattern("^(a+)+$")))
    hostile = "a" * (MAX_TOPIC_CHARS - 1) + "!"
    assert re.fullmatch("^(a+)+$", "aaaa")  # the pattern is the classic catastrophic one
    with watchdog(10):  # a backtracking engine would run for years: fail instead of hanging
        assert not a.allows(hostile)
        assert a.allows("a" * MAX_TOPIC_CHARS)
    with pytest.raises(AclError, match="states"):
        TopicPattern("(a{100}){100}")  # too large for the matcher
    with pytest.raises(AclError):
        TopicPattern(r"(a)\1")  # back-references are refused
    with pytest.raises(AclError, match=f"at most {MAX_ACL_STATES}"):
        acl(*(accept(TopicPattern("x" * 300)) for _ in range(4)))  # 4 x 301 states in one list


def test_long_topics_are_rejected_without_matching():
    a = acl(accept(TopicPattern(".*")))
    assert a.allows("x" * MAX_TOPIC_CHARS)
    assert not a.allows("x" * (MAX_TOPIC_CHARS + 1))
    assert not a.may_allow("x" * 100_000)


def test_cache_is_bounded():
    a = acl(accept(TopicPattern("^keep")))
    for i in range(CACHE_TOPICS + 500):
        a.allows(f"t{i}")
    assert a.topics_cached == CACHE_TOPICS
    assert a.allows("keep.1") and not a.allows("t1")


def test_entries_need_a_condition_and_lists_an_entry():
    with pytest.raises(AclError):
        Ace(ACCEPT)
    with pytest.raises(AclError):
        Acl([], Direction.OUTBOUND)


# --------------------------------------------------------------------------- the <acl> parser


def parse(xml: str):
    el = etree.fromstring(xml.encode())
    errors: list[tuple[int, str]] = []
    warnings: list[tuple[int, str]] = []
    result = parse_acl(el, "ep", lambda ln, m: errors.append((ln, m)), lambda ln, m: warnings.append((ln, m)))
    return result, errors, warnings


def test_parse_good_acl():
    p, errors, warnings = parse("""<acl>
  <inbound>
    <ace match="accept"><topic>USER.user1</topic></ace>
    <ace match="reject"><pcre-pattern>^USER\\..*</pcre-pattern></ace>
    <ace match="accept">
      <topic>DEF</topic>
      <transport value="lbt-rm" comparison="eq"/>
      <source-ip value="10.1.1.7" comparison="equal"/>
      <multicast-group value="239.1.1.1" comparison="eq"/>
      <udp-source-port value="14390" comparison="ge"/>
      <udp-destination-port value="14400" comparison="lessthanequal"/>
      <tcp-source-port value="1" comparison="greaterthan"/>
      <xport-id value="5" comparison="notequal"/>
    </ace>
    <ace match="accept"><pcre-pattern xml:space="preserve"> </pcre-pattern></ace>
  </inbound>
  <outbound>
    <ace match="accept"><topic xml:space="preserve">ABC </topic><regex-pattern>^A[[:digit:]]</regex-pattern></ace>
  </outbound>
</acl>""")
    assert errors == []
    assert [ln for ln, _ in warnings] == [18]  # regex-pattern is deprecated
    assert p.portal == "ep" and p.line == 1
    assert [a.line for a in p.inbound.entries] == [3, 4, 5, 15]
    assert p.allows_source_in("USER.user1", TCP) and not p.allows_source_in("USER.user2", TCP)
    assert p.allows_source_in("DEF", RM) and not p.allows_source_in("DEF", TCP)
    assert p.allows_source_in("with space", TCP) and not p.allows_source_in("nospace", TCP)
    assert p.allows_source_out("ABC ") and not p.allows_source_out("ABC")
    assert p.allows_source_out("A1") and not p.allows_source_out("B1")
    ace = p.inbound.entries[2]
    assert TransportIs(Transport.LBTRM, True) in ace.session
    assert FieldCompare(SessionField.XPORT_ID, Comparison.NE, 5) in ace.session


@pytest.mark.parametrize(("body", "line", "words"), [
    ('<inbound><ace match="maybe"><topic>a</topic></ace></inbound>', 2, 'match="accept" or match="reject", not "maybe"'),
    ('<inbound><ace><topic>a</topic></ace></inbound>', 2, 'match="accept"'),
    ('<inbound><ace match="accept"></ace></inbound>', 2, "has no condition"),
    ('<inbound><ace match="accept"><topic> </topic></ace></inbound>', 2, "<topic> is empty"),
    ('<inbound><ace match="accept"><pcre-pattern>(a</pcre-pattern></ace></inbound>', 2, "refused"),
    ('<inbound><ace match="accept"><pcre-pattern>(?=a)b</pcre-pattern></ace></inbound>', 2, "refused"),
    ('<inbound><ace match="accept"><pcre-pattern>(a{100}){100}</pcre-pattern></ace></inbound>', 2, "too large"),
    ('<inbound>\n<ace match="accept">\n<transport value="pgm" comparison="eq"/></ace></inbound>', 4,
     '<transport> value "pgm" is not a transport'),
    ('<inbound><ace match="accept"><transport value="tcp" comparison="lt"/></ace></inbound>', 2,
     'comparison "lt" is not one of eq, equal, ne, notequal'),
    ('<inbound><ace match="accept"><source-ip value="10.1.1" comparison="eq"/></ace></inbound>', 2,
     "not a full IPv4 address"),
    ('<inbound><ace match="accept"><source-ip value="host.example" comparison="eq"/></ace></inbound>', 2,
     "DNS names"),
    ('<inbound><ace match="accept"><source-ip value="10.1.1.1"/></ace></inbound>', 2, 'needs comparison="eq"'),
    ('<inbound><ace match="accept"><source-ip comparison="eq"/></ace></inbound>', 2, 'needs a value'),
    ('<inbound><ace match="accept"><multicast-group value="10.1.1.1" comparison="eq"/></ace></inbound>', 2,
     "not a multicast address"),
    ('<inbound><ace match="accept"><udp-source-port value="70000" comparison="eq"/></ace></inbound>', 2,
     "not a port 0..65535"),
    ('<inbound><ace match="accept"><xport-id value="-1" comparison="eq"/></ace></inbound>', 2,
     "not a transport id"),
    ('<outbound>\n\n<ace match="accept"><topic>a</topic><transport value="tcp" comparison="eq"/></ace></outbound>', 4,
     "only works in <inbound>"),
    ('<inbound><ace match="accept"><queue>a</queue></ace></inbound>', 2, "<queue> is not an ACL condition"),
    ('<inbound></inbound>', 2, "<inbound> has no <ace>"),
    ('<inbound><topic>a</topic></inbound>', 2, "<topic> is not allowed in <inbound>"),
    ('<sideways/>', 2, "<sideways> is not allowed in <acl>"),
    ('<inbound><ace match="accept"><topic>a</topic></ace></inbound>\n<inbound><ace match="accept"><topic>b</topic></ace></inbound>',
     3, "more than one <inbound>"),
    (f'<inbound><ace match="accept"><topic>{"x" * 300}</topic></ace></inbound>', 2, "300 characters long"),
])
def test_parse_bad_acl(body, line, words):
    p, errors, _ = parse(f"<acl>\n{body}\n</acl>")
    assert errors, "no error reported"
    assert errors[0][0] == line, errors
    assert words in errors[0][1], errors


def test_parse_reports_every_error():
    _, errors, _ = parse("""<acl>
<inbound>
<ace match="accept"><pcre-pattern>(</pcre-pattern></ace>
<ace match="reject"><tcp-source-port value="x" comparison="eq"/></ace>
</inbound>
</acl>""")
    assert [ln for ln, _ in errors] == [3, 4]


def test_parse_empty_acl_warns():
    p, errors, warnings = parse("<acl/>")
    assert errors == [] and not p.configured and "changes nothing" in warnings[0][1]


# --------------------------------------------------------------------------- the bridge



def out_list(*topics: str, direction=Direction.OUTBOUND, action=ACCEPT) -> Acl:
    return acl(_ace(action, tuple(TopicIs(t) for t in topics)), direction=direction)


def acl_bridge(acl_: PortalAcl = OPEN, link_acl: PortalAcl = OPEN, domain: int = 1, **kw) -> Bridge:
    tr = PortalTR(PortalTRSettings("A", domain, src_id=b"A" * 8, mode="multicast", multicast=GROUP,
                                   source_timeout=3.0, requery_interval=1.0), now=0.0)
    b = Bridge(tr, acl=acl_, link_acl=link_acl, **kw)
    b.link_up(0.0)
    return b


def sent(b: Bridge) -> list:
    return [o.frame for o in b.outputs() if isinstance(o, SendFrame)]


def test_bridge_local_interest_needs_endpoint_outbound_and_link_inbound():
    ep = PortalAcl("ep", outbound=out_list("md.public", "md.peerless"))
    link = PortalAcl("to-B", inbound=out_list("md.public", direction=Direction.INBOUND))
    b = acl_bridge(ep, link)
    b.on_datagram(dgram(tqrs=["md.public", "md.secret", "md.peerless"]), APP, 0.1)
    out = b.outputs()
    assert [o.frame.topic for o in out if isinstance(o, SendFrame)] == ["md.public"]
    assert b.acl_rejected == {"ep": 1, "to-B": 1} and b.counters["acl_rejected"] == 2
    assert [o.kind for o in out if isinstance(o, Notice)] == ["acl_rejected", "acl_rejected"]
    # the link comes up again: the refused interest is not sent, nor counted again
    b.link_down(0.5)
    b.outputs()
    b.link_up(1.0)
    assert [f.topic for f in sent(b)] == ["md.public"] and b.counters["acl_rejected"] == 2


def test_bridge_peer_interest_needs_link_outbound_and_endpoint_inbound():
    ep = PortalAcl("ep", inbound=acl(accept(TopicPattern("^md\\."), TransportIs(Transport.LBTRU)),
                                      reject(TopicPattern(".*"))))
    link = PortalAcl("to-B", outbound=out_list("md.a", "x.b"))
    b = acl_bridge(ep, link)
    for topic in ("md.a", "md.z", "x.b"):
        b.peer_frame(P.Interest(P.InterestAction.ADD, topic, 2), 0.1)
    # md.a: an LBT-RU source of it could come in; md.z: the link may not send it back;
    # x.b: the endpoint accepts no source of it
    assert b.portal.remote_interests() == [("md.a", 0)]
    assert b.acl_rejected == {"to-B": 1, "ep": 1}
    b.peer_frame(P.Interest(P.InterestAction.CANCEL, "md.z", 2), 0.2)  # cancels are not counted
    assert b.counters["acl_rejected"] == 2


def test_bridge_source_needs_endpoint_inbound_session_and_link_outbound():
    ru_only = acl(accept(TopicIs("md.a"), TransportIs(Transport.LBTRU)),
                  accept(TopicIs("md.b"), FieldCompare(SessionField.SOURCE_IP, Comparison.EQ, 0x0A010005)))
    b = acl_bridge(PortalAcl("ep", inbound=ru_only), PortalAcl("to-B", outbound=out_list("md.a", "md.b")))
    for topic in ("md.a", "md.b"):
        b.peer_frame(P.Interest(P.InterestAction.ADD, topic, 2), 0.0)
    b.outputs()
    # md.a has a TCP source: rejected (once, though its TIRs repeat); md.b from 10.1.0.5: accepted
    for now in (0.1, 0.6, 1.1):
        b.on_datagram(dgram(tirs=[source_tir("md.a"), source_tir("md.b", otid=OTID[:-1] + b"\x02")]),
                      APP, now)
    adverts = [f for f in sent(b) if isinstance(f, P.Advertisement)]
    assert [a.topic for a in adverts] == ["md.b"]
    assert b.acl_rejected == {"ep": 1}


def test_bridge_source_whose_transport_changes_to_a_rejected_one_is_withdrawn():
    tcp_only = acl(accept(TopicIs("md.a"), TransportIs(Transport.TCP)))
    b = acl_bridge(PortalAcl("ep", inbound=tcp_only))
    b.peer_frame(P.Interest(P.InterestAction.ADD, "md.a", 2), 0.0)
    b.on_datagram(dgram(tirs=[source_tir("md.a")]), APP, 0.1)
    (adv,) = [f for f in sent(b) if isinstance(f, P.Advertisement)]
    moved = source_tir("md.a")
    moved.transport = LbtruTransport("10.1.0.5", 14380)
    b.on_datagram(dgram(tirs=[moved]), APP, 0.2)
    (gone,) = [f for f in sent(b) if isinstance(f, P.Advertisement)]
    assert gone.withdraw and gone.advert_id == adv.advert_id and b.advert_sources() == {}


def test_bridge_advertisement_needs_link_inbound_and_endpoint_outbound():
    link = PortalAcl("to-B", inbound=acl(accept(TransportIs(Transport.TCP))))
    b = acl_bridge(PortalAcl("ep", outbound=out_list("md.quotes", "md.ru")), link)
    b.peer_frame(advert(aid=1, topic="md.quotes"), 0.0)
    b.peer_frame(advert(aid=2, topic="md.secret"), 0.0)
    b.peer_frame(advert(aid=3, topic="md.ru", transport=P.StreamKind.LBTRU), 0.0)
    starts = [o.advert.topic for o in b.outputs() if isinstance(o, StartProxy)]
    assert starts == ["md.quotes"]
    assert b.acl_rejected == {"ep": 1, "to-B": 1}


def test_bridge_link_acl_counted_once_per_router():
    link = PortalAcl("to-B", inbound=out_list("md.ok", direction=Direction.INBOUND))
    owner, attached = acl_bridge(link_acl=link), acl_bridge(link_acl=link, domain=3, count_link_acl=False)
    for b in (owner, attached):
        b.peer_frame(advert(aid=1, topic="md.no"), 0.0)
    assert owner.acl_rejected == {"to-B": 1} and attached.acl_rejected == {}
    assert not any(isinstance(o, StartProxy) for b in (owner, attached) for o in b.outputs())


def test_bridge_wildcard_interest_passes_and_its_topics_are_filtered():
    ep_out = PortalAcl("ep", outbound=out_list("md.a"))
    recv = acl_bridge(ep_out)
    pkt = Packet(type=PacketType.WC_TQR, version=1, wc_tqrs=[WcTQR("^md\\.", 1)],
                 options=[SourceIdOption(0x8000, b"APPCTX01")])
    recv.on_datagram(encode(pkt), APP, 0.1)
    (interest,) = sent(recv)
    assert interest.pattern_type == P.PatternType.PCRE and interest.topic == "^md\\."
    # the sources the pattern brings back: only md.a may be advertised here
    recv.peer_frame(advert(aid=1, topic="md.a"), 0.2)
    recv.peer_frame(advert(aid=2, topic="md.b"), 0.2)
    assert [o.advert.topic for o in recv.outputs() if isinstance(o, StartProxy)] == ["md.a"]
    assert recv.acl_rejected == {"ep": 1}


def test_bridges_back_to_back_acl_rejects_a_topic():
    """Router A's endpoint (receivers) and router B's endpoint (sources of
    md.public and md.secret); B's inbound ACL rejects md.secret: only md.public
    is advertised to A and proxied there."""
    a = acl_bridge(domain=1)
    inbound = acl(reject(TopicIs("md.secret")), accept(TopicPattern(".*")))
    b = acl_bridge(PortalAcl("B-ep", inbound=inbound), domain=2)
    starts = []

    def carry(src: Bridge, dst: Bridge, now: float) -> None:
        for o in src.outputs():
            if isinstance(o, SendFrame):
                dst.peer_frame(o.frame, now)
            elif isinstance(o, StartProxy):
                starts.append(o.advert.topic)

    a.on_datagram(dgram(tqrs=["md.public", "md.secret"]), APP, 0.0)
    carry(a, b, 0.0)
    assert sorted(t for t, _ in b.portal.remote_interests()) == ["md.public"]  # may_allow spares a query
    # a source of md.secret in B's TRD is not advertised even if interest came some other way
    b.portal.add_remote_interest("md.secret", 0.05)
    b.on_datagram(dgram(tirs=[source_tir("md.public"), source_tir("md.secret", otid=OTID[:-1] + b"\x03")]),
                  ("10.2.0.5", 12965), 0.1)
    carry(b, a, 0.1)
    carry(a, b, 0.1)
    assert starts == ["md.public"]
    assert b.acl_rejected == {"B-ep": 2}


@pytest.mark.parametrize("pattern", [
    r"^md\.test\.", r"^md\.(eq|fx)\.[A-Z]+\.x$", "internal", ".*", r"\Aabc", "^abc$", "(?i)^ABC",
    "a|b", "^", "$", "x(y)?z", r"^a\.b$", r"ab*c", r"^(a+)+$", r"\bmd\b", r"^[^.]+\.snapshot$",
])
def test_pattern_prefilter_agrees_with_re(pattern):
    import random

    rng = random.Random(pattern)
    p = TopicPattern(pattern)
    alphabet = "abcxyzAB.md\\ntesqlfMD_"
    samples = ["", "abc", "ABC", "md.test.1", "md.eq.IBM.x", "md.eq.IBM.xy", "a.b", "xz", "xyz", "ac", "abbbc",
               "aaaa", "aaaa!", "md", "x md y", "ref.snapshot", "internal", "b"]
    samples += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 14))) for _ in range(400)]
    for topic in samples:
        assert p.matches(topic) == (re.search(pattern, topic) is not None), (pattern, topic)


def test_bridge_flood_of_rejected_interest_is_counted_and_logged_sparingly():
    """20,000 distinct TQRs from the TRD for topics the endpoint's outbound list
    rejects: nothing goes to the peer, each refusal is counted, the notices
    come at the 1st, 2nd, 4th ... refusal, and the list's cache stays bounded."""
    out = acl(reject(TopicPattern(r"^flood\.")), accept(TopicPattern(".*")), direction=Direction.OUTBOUND)
    b = acl_bridge(PortalAcl("ep", outbound=out))
    topics = [f"flood.{i}" for i in range(20_000)]
    for i in range(0, len(topics), 100):
        b.on_datagram(dgram(tqrs=topics[i:i + 100]), APP, 0.1)
    outs = b.outputs()
    assert not [o for o in outs if isinstance(o, SendFrame)]
    assert b.acl_rejected == {"ep": 20_000}
    assert len([o for o in outs if isinstance(o, Notice) and o.kind == "acl_rejected"]) == 15  # 1 .. 16384
    assert out.topics_cached <= CACHE_TOPICS


def test_portal_acl_is_a_value():
    a = PortalAcl("x", inbound=acl(accept(TopicPattern("^a"))))
    b = PortalAcl("x", inbound=acl(accept(TopicPattern("^a"))))
    assert a == b and hash(a) == hash(b) and a != OPEN
    assert a.named("y").portal == "y" and a.named("y").inbound is a.inbound and a.named("x") is a
    assert a.summary() == {"inbound": 1, "outbound": 0} and OPEN.summary() == {"inbound": 0, "outbound": 0}


# --------------------------------------------------------------------------- the configuration file

ENDPOINT_ACL = """\
      <acl>
        <inbound>
          <ace match="accept"><topic>md.ru</topic><transport value="lbtru" comparison="equal"/></ace>
          <ace match="reject"><pcre-pattern>^md\\.test\\.</pcre-pattern></ace>
          <ace match="accept"><pcre-pattern>^md\\.</pcre-pattern><topic>health_check</topic></ace>
        </inbound>
        <outbound>
          <ace match="reject"><topic>md.internal</topic></ace>
          <ace match="accept"><pcre-pattern>.*</pcre-pattern></ace>
        </outbound>
      </acl>
"""
PEER_ACL = """\
      <acl>
        <inbound>
          <ace match="accept"><source-ip value="10.0.0.0" comparison="ge"/><transport value="tcp" comparison="eq"/></ace>
        </inbound>
      </acl>
"""


def test_config_acl_on_endpoint_and_peer(tmp_path):
    text = doc(portals=endpoint(extra=ENDPOINT_ACL) + peer(after=PEER_ACL))
    cfg = expect_ok(tmp_path, "acl.xml", text)
    ep, pe = cfg.endpoints[0].acl, cfg.peers[0].acl
    assert ep.portal == "ep" and pe.portal == "pe"
    assert ep.summary() == {"inbound": 3, "outbound": 2} and pe.summary() == {"inbound": 1, "outbound": 0}
    assert ep.allows_source_in("md.ru", RU) and ep.allows_source_in("md.ru", TCP)  # TCP: by ^md\\.
    assert not ep.allows_source_in("other", TCP)
    assert ep.allows_source_in("health_check", TCP) and not ep.allows_source_in("md.test.1", TCP)
    assert not ep.allows_source_out("md.internal") and ep.allows_source_out("x")
    assert pe.allows_source_in("x", Session.of("tcp")) and not pe.allows_source_in("x", Session.of("lbtru"))
    assert ep.line == text.splitlines().index("      <acl>") + 1
    assert cfg.warnings == ()


def test_config_without_acl_is_open(tmp_path):
    cfg = expect_ok(tmp_path, "open.xml", doc())
    assert cfg.endpoints[0].acl == OPEN and cfg.peers[0].acl == OPEN


def test_config_acl_in_the_wrong_place(tmp_path):
    # after <remote-topic>: the DRO's element order
    text = doc(portals=endpoint(extra='      <remote-topic/>\n' + ENDPOINT_ACL) + peer())
    expect_error(tmp_path, "order.xml", text, "<endpoint>", "<acl>, <remote-topic/>", "found",
                 "<remote-topic>, <acl>")


@pytest.mark.parametrize(("acl_text", "marker", "needles"), [
    ('<acl><inbound><ace match="accept"><pcre-pattern>(?&lt;=a)b</pcre-pattern></ace></inbound></acl>',
     "<acl>", ("<pcre-pattern>", "refused")),
    ('<acl><inbound><ace match="accept"><pcre-pattern>(a{100}){100}</pcre-pattern></ace></inbound></acl>',
     "<acl>", ("too large",)),
    ('<acl><outbound><ace match="accept"><topic>a</topic><source-ip value="1.2.3.4" comparison="eq"/></ace>'
     '</outbound></acl>', "<acl>", ("<source-ip>", "only works in <inbound>")),
    ('<acl><inbound><ace match="maybe"><topic>a</topic></ace></inbound></acl>', "<acl>", ("match",)),
    ('<acl><inbound><ace><topic>a</topic></ace></inbound></acl>', "<acl>", ("match",)),
    ('<acl><inbound><ace match="accept"><transport value="pgm" comparison="eq"/></ace></inbound></acl>',
     "<acl>", ("transport",)),
    ('<acl><inbound><ace match="accept"><tcp-source-port value="99999" comparison="eq"/></ace></inbound></acl>',
     "<acl>", ("not a port 0..65535",)),
    ('<acl><inbound><ace match="accept"><source-ip value="10.1" comparison="eq"/></ace></inbound></acl>',
     "<acl>", ("not a full IPv4 address",)),
    ('<acl><inbound/></acl>', "<acl>", ("<inbound>",)),
    ('<acl><inbound><ace match="accept"/></inbound></acl>', "<acl>", ("<ace>",)),
])
def test_config_bad_acl_names_file_and_line(tmp_path, acl_text, marker, needles):
    text = doc(portals=endpoint(extra=f"      {acl_text}\n") + peer())
    err = expect_error(tmp_path, "bad.xml", text, marker, *needles)
    assert isinstance(err, ConfigError) and str(err).startswith(str(tmp_path / "bad.xml") + ":")


def test_config_bad_acl_on_a_peer(tmp_path):
    bad = '      <acl><outbound><ace match="accept"><xport-id value="1" comparison="eq"/></ace></outbound></acl>\n'
    text = doc(portals=endpoint() + peer(after=bad))
    expect_error(tmp_path, "peer.xml", text, "<xport-id", "only works in <inbound>")


def test_shipped_acl_example(tmp_path):
    cfg = load_config(Path(__file__).resolve().parents[3] / "configs" / "router-acl.xml")
    assert cfg.warnings == ()
    trd1, trd2 = (e.acl for e in cfg.endpoints)
    assert trd1.allows_source_in("md.eq.IBM", TCP) and trd1.allows_source_in("health_check", TCP)
    assert not trd1.allows_source_in("md.test.1", TCP) and not trd1.allows_source_in("orders", TCP)
    assert not trd2.allows_source_out("md.internal.x") and trd2.allows_source_out("md.eq.IBM")
    back_office = Session.of("tcp", source_ip="127.0.2.7", tcp_source_port=14371)
    assert trd2.allows_source_in("anything", back_office)
    assert not trd2.allows_source_in("anything", Session.of("lbtru", source_ip="127.0.2.7"))
    assert not trd2.allows_source_in("anything", Session.of("tcp", source_ip="127.0.1.7"))


# --------------------------------------------------------------------------- end to end

ROUTER_A = """<?xml version="1.0"?>
<lbmr-router version="1.0">
  <daemon><name>acl-a</name></daemon>
  <portals>
    <endpoint>
      <name>A-TRD1</name>
      <domain-id>1</domain-id>
      <topic-resolution>
        <interface>127.0.1.1</interface>
        <lbmrd address="127.0.1.1" port="{trd1}"/>
        <port-range low="{tr_a}" high="{tr_a_hi}"/>
      </topic-resolution>
      <relay interface="127.0.1.1" port-low="{relay_a}" port-high="{relay_a_hi}" fanout="off"/>
      <acl>
        <inbound>
          <ace match="accept"><topic>md.ru</topic><transport value="lbt-ru" comparison="eq"/></ace>
          <ace match="reject"><topic>md.secret</topic><topic>md.ru</topic></ace>
          <ace match="accept"><pcre-pattern>.*</pcre-pattern></ace>
        </inbound>
      </acl>
    </endpoint>
    <peer>
      <name>A-to-B</name>
      <single-tcp>
        <interface>127.0.0.1</interface>
        <acceptor><listen-port>{peer}</listen-port></acceptor>
      </single-tcp>
      <acl>
        <outbound>
          <ace match="reject"><topic>md.internal</topic></ace>
          <ace match="accept"><pcre-pattern>.*</pcre-pattern></ace>
        </outbound>
      </acl>
    </peer>
  </portals>
</lbmr-router>
"""

ROUTER_B = """<?xml version="1.0"?>
<lbmr-router version="1.0">
  <daemon><name>acl-b</name></daemon>
  <portals>
    <endpoint>
      <name>B-TRD2</name>
      <domain-id>2</domain-id>
      <topic-resolution>
        <interface>127.0.2.1</interface>
        <lbmrd address="127.0.2.1" port="{trd2}"/>
        <port-range low="{tr_b}" high="{tr_b_hi}"/>
      </topic-resolution>
      <relay interface="127.0.2.1" port-low="{relay_b}" port-high="{relay_b_hi}" fanout="off"/>
    </endpoint>
    <peer>
      <name>B-to-A</name>
      <single-tcp>
        <initiator reconnect-interval="200"><address>127.0.0.1</address><port>{peer}</port></initiator>
      </single-tcp>
    </peer>
  </portals>
</lbmr-router>
"""


def _ports(kind, ip, n=5):
    low = free_port(kind, ip)
    return low, min(low + n - 1, 65535)


async def test_e2e_acl_rejects_a_topic(tmp_path):
    """Two routers loaded from files, lbmrds on 127.0.1.1 (TRD1, sources) and
    127.0.2.1 (TRD2, receiver). Router A's endpoint accepts md.ru only over
    LBT-RU and rejects md.secret; its peer portal does not send md.internal
    out. The receiver gets md.public byte-exact; the other three never
    resolve, and A counts each refusal against the portal that refused."""
    total = 1 << 20
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        tr_a, tr_a_hi = _ports(socket.SOCK_DGRAM, "127.0.1.1")
        tr_b, tr_b_hi = _ports(socket.SOCK_DGRAM, "127.0.2.1")
        relay_a, relay_a_hi = _ports(socket.SOCK_STREAM, "127.0.1.1")
        relay_b, relay_b_hi = _ports(socket.SOCK_STREAM, "127.0.2.1")
        peer = free_port(socket.SOCK_STREAM)
        cfg_a = load_config(write(tmp_path, "a.xml", ROUTER_A.format(**locals() | {"trd1": trd1[1]})))
        cfg_b = load_config(write(tmp_path, "b.xml", ROUTER_B.format(**locals() | {"trd2": trd2[1]})))
        assert cfg_a.endpoints[0].acl.inbound is not None and cfg_a.peers[0].acl.outbound is not None
        ra, rb = MultiRouter(cfg_a), MultiRouter(cfg_b)
        await n.start(ra.run)
        await n.start(rb.run)
        for topic in ("md.public", "md.secret", "md.internal", "md.ru"):
            src = await tcp_source(n, "127.0.1.5", total)
            n.start_soon(advertise_forever, udp("127.0.1.5"), trd1, *src, topic)
        rcv = udp("127.0.2.9")
        tir = await resolve(rcv, trd2, topic="md.public")
        assert tir.transport.ip == "127.0.2.1"
        assert await fetch(tir.transport.ip, tir.transport.port) == pattern(total)
        never = []

        async def never_resolves(topic):  # asked for 2 s by a receiver of its own
            try:
                await resolve(udp("127.0.2.9"), trd2, timeout=2.0, topic=topic)
            except trio.TooSlowError:
                never.append(topic)

        async with trio.open_nursery() as asks:  # the three side by side
            for topic in ("md.secret", "md.internal", "md.ru"):
                asks.start_soon(never_resolves, topic)
        assert sorted(never) == ["md.internal", "md.ru", "md.secret"], never
        acl_a = ra.status()["acl"]
        assert acl_a["A-TRD1"]["rejected"] >= 2  # md.secret's interest, md.ru's TCP source
        assert acl_a["A-to-B"]["rejected"] >= 1  # md.internal's interest
        assert (acl_a["A-TRD1"]["inbound"], acl_a["A-TRD1"]["outbound"]) == (3, 0)
        assert rb.status()["acl"] == {}
        text = ra.prometheus_text()
        assert 'lbmr_router_portal_acl_rejected_total{portal="A-to-B"}' in text
        assert [t for t, _ in ra.links[0].tr.remote_interests()].count("md.internal") == 0
        n.cancel_scope.cancel()


async def start_chain(n, *, link23_acl=None, endpoint2_acl=None):
    """Chain r1 (TRD1) - r2 (TRD2) - r3 (TRD3) on loopback, converged: the lbmrds
    by domain and the routers; ``link23_acl``: r2's peer portal towards r3,
    ``endpoint2_acl``: r2's endpoint portal."""
    from router.config.model import acceptor_peer, initiator_peer, lbmrd_endpoint, router_config

    def router(name, d, trd, peers, **kw):
        return MultiRouter(router_config(name, [lbmrd_endpoint(f"T{d}", d, [trd], interface=IPS[d], fanout=False, **kw)],
                                         peers, route_info=ROUTE_INFO))

    trds = {d: (await start_lbmrd(n, IPS[d]))[1] for d in (1, 2, 3)}
    more = {"acl": endpoint2_acl} if endpoint2_acl is not None else {}
    link23 = {"acl": link23_acl} if link23_acl is not None else {}
    r2 = router("r2", 2, trds[2], [acceptor_peer("2-1", 0, interface="127.0.0.1"),
                                   acceptor_peer("2-3", 0, interface="127.0.0.1", **link23)], **more)
    p21, p23 = (lk["peer"] for lk in (await n.start(r2.run))["links"])
    r1 = router("r1", 1, trds[1], [initiator_peer("1-2", *p21, reconnect_interval_ms=200)])
    r3 = router("r3", 3, trds[3], [initiator_peer("3-2", *p23, reconnect_interval_ms=200)])
    await n.start(r1.run)
    await n.start(r3.run)
    await converged((r1, r2, r3), (1, 2, 3))
    return trds, (r1, r2, r3)


async def test_e2e_acl_on_a_transit_router():
    """Chain r1 (TRD1, sources) - r2 (TRD2) - r3 (TRD3, receiver): r2's peer
    portal towards r3 rejects chain.secret outbound. The receiver in TRD3 gets
    chain.ok through two hops; chain.secret never reaches TRD3 (r2 does not
    pass its interest on), though a receiver in TRD2 still gets it."""
    no_secret = PortalAcl("2-3", outbound=acl(reject(TopicIs("chain.secret")), accept(TopicPattern(".*")),
                                             direction=Direction.OUTBOUND))
    async with trio.open_nursery() as n:
        trds, (r1, r2, r3) = await start_chain(n, link23_acl=no_secret)
        for topic in ("chain.ok", "chain.secret"):
            src = await tcp_source(n, "127.0.1.5", 100_000)
            n.start_soon(advertise_forever, udp("127.0.1.5"), trds[1], *src, topic)
        tir = await resolve(udp("127.0.3.9"), trds[3], topic="chain.ok")
        assert tir.transport.ip == IPS[3]
        assert await fetch(tir.transport.ip, tir.transport.port) == pattern(100_000)
        mid = await resolve(udp("127.0.2.9"), trds[2], topic="chain.secret")  # TRD2 may have it
        assert mid.transport.ip == IPS[2]
        with pytest.raises(trio.TooSlowError):
            await resolve(udp("127.0.3.9"), trds[3], timeout=2.0, topic="chain.secret")
        assert r2.status()["acl"]["2-3"]["rejected"] >= 1
        assert r3.status()["acl"] == {}
        n.cancel_scope.cancel()


async def test_e2e_endpoint_acl_of_a_transit_router_does_not_stop_transit():
    """Chain r1 (TRD1, sources) - r2 (TRD2) - r3 (TRD3, receiver): r2's endpoint
    portal rejects chain.hidden outbound (TRD2 must not see it). The topic still
    passes through r2 to TRD3, by a proxy of r2 that is not advertised in TRD2;
    a receiver in TRD2 never resolves it."""
    hidden = PortalAcl("T2", outbound=acl(reject(TopicIs("chain.hidden")), accept(TopicPattern(".*")),
                                          direction=Direction.OUTBOUND))
    async with trio.open_nursery() as n:
        trds, (r1, r2, r3) = await start_chain(n, endpoint2_acl=hidden)
        src = await tcp_source(n, "127.0.1.5", 100_000)
        n.start_soon(advertise_forever, udp("127.0.1.5"), trds[1], *src, "chain.hidden")
        tir = await resolve(udp("127.0.3.9"), trds[3], topic="chain.hidden")
        assert tir.transport.ip == IPS[3]
        assert await fetch(tir.transport.ip, tir.transport.port) == pattern(100_000)
        with pytest.raises(trio.TooSlowError):
            await resolve(udp("127.0.2.9"), trds[2], timeout=2.0, topic="chain.hidden")
        assert r2.status()["acl"]["T2"]["rejected"] >= 1
        n.cancel_scope.cancel()
