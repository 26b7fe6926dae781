"""The far router's LBT-RU proxy receiver (router.core.lbtru_upstream), sans-IO,
and the LBT-RU origin input of the proxy source (router.core.lbtru_origin.LbtruInput)."""

from __future__ import annotations

from lbmr_proto import lbtru as RU
from router.core.lbtru_fanout import RuFanout
from router.core.lbtru_origin import LbtruInput
from router.core.lbtru_upstream import MAX_GAP, EndReason, RuUpstream, UpstreamState

ORIGIN = ("127.0.1.5", 14380)
SID = 0x5E55


def connected(**kw) -> RuUpstream:
    u = RuUpstream(ORIGIN, SID, **kw)
    (creq,), _ = u.tick(0.0)
    assert isinstance(RU.decode(creq), RU.Creq) and RU.decode(creq).header.session_id == SID
    out = u.from_origin(RU.encode_sm(0, 9, 1, syn=True, session_id=SID, client_id=7), ORIGIN, 0.01)
    (ack,) = out.to_origin
    m = RU.decode(ack)
    assert isinstance(m, RU.Ack) and (m.header.session_id, m.header.client_id) == (SID, 7)
    (sm,) = out.to_links  # the SYN's lead and trail, for the near proxy's window
    assert RU.decode(sm).lead_sqn == 9 and u.state is UpstreamState.CONNECTED
    return u


def test_connects_with_creqs_and_gives_up_after_the_attempts():
    u = RuUpstream(ORIGIN, SID, connect_interval=0.1, connect_attempts=3)
    sent = []
    for t in (0.0, 0.05, 0.1, 0.2, 0.4):
        out, due = u.tick(t)
        sent += out
    assert len(sent) == 3 and u.state is UpstreamState.ENDED and u.ended is EndReason.NO_ANSWER
    assert u.next_due() == float("inf")
    connected()


def test_data_and_session_messages_go_to_the_links_as_they_came_and_a_gap_is_naked():
    u = connected()
    d10 = RU.encode_data(10, 1, b"ten", session_id=SID)
    out = u.from_origin(d10, ORIGIN, 0.1)
    assert out.to_links == [d10] and out.to_origin == []
    d13 = RU.encode_data(13, 1, b"thirteen", session_id=SID)
    out = u.from_origin(d13, ORIGIN, 0.2)
    assert out.to_links == [d13]
    (nak,) = out.to_origin
    m = RU.decode(nak)
    assert m.sqns == (11, 12) and m.header.client_id == 7
    rx = RU.encode_data(11, 1, b"eleven", session_id=SID, retransmission=True)
    assert u.from_origin(rx, ORIGIN, 0.3).to_links == [rx]
    sm = RU.encode_sm(3, 13, 1, session_id=SID)
    assert u.from_origin(sm, ORIGIN, 0.3).to_links == [sm]
    ncf = RU.encode_ncf(1, [11], session_id=SID)
    assert u.from_origin(ncf, ORIGIN, 0.3).to_links == [] and u.counters["lbtru_upstream_ncfs"] == 1


def test_a_huge_gap_naks_only_the_newest_sequences():
    u = connected()
    u.from_origin(RU.encode_data(0, 0, b"x", session_id=SID), ORIGIN, 0.1)
    out = u.from_origin(RU.encode_data(10_000, 0, b"y", session_id=SID), ORIGIN, 0.2)
    sqns = [q for nak in out.to_origin for q in RU.decode(nak).sqns]
    assert sqns == list(range(10_000 - MAX_GAP, 10_000))


def test_naks_from_the_links_reach_the_origin_once_per_nak_ignore():
    u = connected(nak_ignore=0.2)
    u.from_origin(RU.encode_data(20, 1, b"x", session_id=SID), ORIGIN, 0.1)
    (nak,) = u.from_link(RU.encode_nak([15, 16]), 0.1)
    assert RU.decode(nak).sqns == (15, 16) and RU.decode(nak).header.client_id == 7
    assert u.from_link(RU.encode_nak([16, 15]), 0.2) == []  # a second link asks the same: once
    (nak,) = u.from_link(RU.encode_nak([16, 17]), 0.25)
    assert RU.decode(nak).sqns == (17,)
    assert len(u.from_link(RU.encode_nak([15]), 0.31)) == 1  # nak_ignore later: again
    (nak,) = u.from_link(RU.encode_nak([19, 21, 22]), 0.4)  # 21 and 22 not sent yet
    assert RU.decode(nak).sqns == (19,) and u.counters["lbtru_upstream_link_naks_out_of_range"] == 1
    assert u.from_link(b"junk", 0.4) == [] and u.from_link(RU.encode_ack(1), 0.4) == []
    c = u.counters
    assert (c["lbtru_upstream_link_malformed"], c["lbtru_upstream_link_not_nak"]) == (1, 1)


def test_hostile_datagrams_are_counted_once_and_dropped():
    u = connected(max_datagram=2000)
    inputs = [
        (RU.encode_data(1, 0, b"x", session_id=SID), ("127.0.1.6", 14380)),  # another address
        (RU.encode_data(1, 0, b"x", session_id=SID), ("127.0.1.5", 14381)),  # another port
        (RU.encode_data(1, 0, b"x", session_id=SID + 1), ORIGIN),  # another session
        (RU.encode_rst(session_id=SID + 1), ORIGIN),  # a reset of another session
        (RU.encode_data(1, 0, b"x" * 3000, session_id=SID), ORIGIN),  # huge
        (b"\xff" * 40, ORIGIN),  # not LBT-RU
        (RU.encode_creq(session_id=SID), ORIGIN),  # not what an origin sends
    ]
    for data, src in inputs:
        out = u.from_origin(data, src, 0.5)
        assert out.to_links == [] and out.to_origin == []
    c = u.counters
    assert (c["lbtru_upstream_foreign"], c["lbtru_upstream_other_session"], c["lbtru_upstream_oversize"],
            c["lbtru_upstream_malformed"], c["lbtru_upstream_unexpected_type"]) == (2, 2, 1, 1, 1)
    assert u.state is UpstreamState.CONNECTED and u.next_sqn is None


def test_data_before_the_syn_is_dropped_and_a_session_id_is_learned_from_the_syn():
    u = RuUpstream(ORIGIN, None)
    u.tick(0.0)
    assert u.from_origin(RU.encode_data(1, 0, b"x", session_id=5), ORIGIN, 0.01).to_links == []
    assert u.counters["lbtru_upstream_before_connect"] == 1
    u.from_origin(RU.encode_sm(0, 0, 1, syn=True, session_id=5, client_id=1), ORIGIN, 0.02)
    assert u.session_id == 5 and u.from_origin(RU.encode_data(1, 0, b"x", session_id=6), ORIGIN, 0.03).to_links == []


def test_keepalive_acks_and_the_end_of_the_session():
    u = connected(ack_interval=0.5, activity_timeout=3.0)
    u.from_origin(RU.encode_data(41, 1, b"x", session_id=SID), ORIGIN, 0.2)
    out, due = u.tick(0.51)
    (ack,) = out
    assert RU.decode(ack).ack_sqn == 41 and due == 1.01
    out, _ = u.tick(3.2)  # nothing from the origin for 3 s
    assert out == [] and u.ended is EndReason.SILENT
    v = connected()
    v.from_origin(RU.encode_rst(), ORIGIN, 0.5)
    assert v.ended is EndReason.RESET and v.from_link(RU.encode_nak([1]), 0.6) == []
    w = connected()
    w.unreachable()
    assert w.ended is EndReason.UNREACHABLE and w.counters["lbtru_upstream_ended"] == 1


def test_the_proxy_source_reads_an_lbtru_origin_and_naks_up_in_lbtru():
    f = RuFanout(SID, origin=LbtruInput(), nak_ignore=0.2)
    a = ("127.0.2.20", 5000)
    f.from_peer(RU.encode_sm(0, 9, 1, session_id=SID), 0.0)
    (syn, _), = f.from_client(RU.encode_creq(session_id=SID), a, 0.0)
    assert RU.decode(syn).lead_sqn == 9
    f.from_client(RU.encode_ack(9, session_id=SID), a, 0.0)
    ((d, to),) = f.from_peer(RU.encode_data(10, 1, b"ten", session_id=SID), 0.1)
    m = RU.decode(d)
    assert to == a and (m.sqn, m.payload, m.header.session_id) == (10, b"ten", SID)
    f.from_peer(RU.encode_data(12, 1, b"twelve", session_id=SID), 0.1)
    f.from_client(RU.encode_nak([11], session_id=SID), a, 0.2)
    (nak,) = f.take_naks_up()
    assert RU.decode(nak).sqns == (11,)
    ((d, to),) = f.from_peer(RU.encode_data(11, 1, b"eleven", session_id=SID, retransmission=True), 0.3)
    assert RU.decode(d).retransmission and to == a
    assert f.from_peer(b"\xff", 0.3) == [] and f.from_peer(RU.encode_ncf(1, [3]), 0.3) == []
    assert (f.counters["lbtru_session_malformed"], f.counters["lbtru_session_not_data"]) == (1, 1)
    (rst, to), = f.reset()
    assert isinstance(RU.decode(rst), RU.Rst) and f.clients == {} and f.lead is None
