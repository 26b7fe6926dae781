"""lbmr-router configuration with several portals: direct link (endpoints
only), several peers, and the errors (file:line) that keep one router to one
portal per TRD and one link per pair of routers."""

from __future__ import annotations

from tests.helpers import line_of
from tests.router.helpers import (
    ACCEPTOR,
    INITIATOR,
    TR_LBMRD,
    TR_MULTICAST,
    doc,
    endpoint,
    expect_error,
    expect_ok,
    peer,
)

TR_LBMRD2 = TR_LBMRD.replace("10.1.1.50", "10.9.9.50")
TR_TWO_LBMRDS = """\
      <topic-resolution>
        <lbmrd address="10.1.1.51"/>
        <lbmrd address="10.1.1.50"/>
      </topic-resolution>
"""
INITIATOR2 = INITIATOR.replace("26123", "26124")


def test_direct_link_two_endpoints_no_peer(tmp_path):
    cfg = expect_ok(tmp_path, "direct.xml", doc(portals=endpoint() + endpoint(TR_MULTICAST, name="ep2",
                                                                             domain="2")))
    assert [e.name for e in cfg.endpoints] == ["ep", "ep2"] and cfg.peers == ()
    assert cfg.domain_ids == (1, 2)


def test_one_endpoint_several_peers(tmp_path):
    text = doc(portals=endpoint() + peer(name="p1") + peer(INITIATOR2, name="p2")
               + peer(ACCEPTOR, name="p3"))
    cfg = expect_ok(tmp_path, "peers.xml", text)
    assert [p.role for p in cfg.peers] == ["initiator", "initiator", "acceptor"]


def test_two_endpoints_same_lbmrd_set(tmp_path):
    text = doc(portals=endpoint() + endpoint(TR_LBMRD, name="ep2", domain="1"))
    err = expect_error(tmp_path, "samelbmrd.xml", text, "<name>ep2</name>",
                       'endpoint "ep2" uses the TRD of endpoint "ep"', "lbmrd 10.1.1.50:15380",
                       "one endpoint portal per TRD", offset=-1)
    assert f"(line {line_of(text, '<name>ep</name>') - 1})" in err.message
    assert len(err.errors) == 1  # not also reported as a duplicate domain id


def test_two_endpoints_sharing_an_lbmrd(tmp_path):
    text = doc(portals=endpoint() + endpoint(TR_TWO_LBMRDS, name="ep2", domain="3"))
    expect_error(tmp_path, "share.xml", text, "<name>ep2</name>", "lbmrd 10.1.1.50:15380",
                 "one TRD cannot have two domain ids (1 and 3)", offset=-1)


def test_two_endpoints_same_multicast_group_and_interface(tmp_path):
    text = doc(portals=endpoint(TR_MULTICAST) + endpoint(TR_MULTICAST, name="ep2", domain="2"))
    expect_error(tmp_path, "samemc.xml", text, "<name>ep2</name>",
                 "multicast 239.192.0.1:13000 on 10.2.0.0/16", "two domain ids (1 and 2)", offset=-1)


def test_same_multicast_group_on_another_interface_is_another_trd(tmp_path):
    other = TR_MULTICAST.replace("10.2.0.0/16", "10.3.0.0/16")
    cfg = expect_ok(tmp_path, "mc2.xml", doc(portals=endpoint(TR_MULTICAST) + endpoint(other, name="ep2",
                                                                                      domain="2")))
    assert len(cfg.endpoints) == 2


def test_duplicate_domain_id_across_trds(tmp_path):
    text = doc(portals=endpoint() + endpoint(TR_LBMRD2, name="ep2", domain="1"))
    expect_error(tmp_path, "dupid.xml", text, "<name>ep2</name>",
                 'domain-id 1 of endpoint "ep2" is already used by endpoint "ep"', offset=-1)


def test_two_peer_links_to_the_same_router(tmp_path):
    text = doc(portals=endpoint() + peer(name="p1") + peer(name="p2"))
    lines = [i + 1 for i, ln in enumerate(text.splitlines()) if "<initiator>" in ln]
    err = expect_error(tmp_path, "twopeers.xml", text, "<name>p2</name>",
                       'peer "p2" connects to 203.0.113.7:26123 like peer "p1"',
                       "two peer links to the same router", offset=2)
    assert err.line == lines[1] and f"(line {lines[0]})" in err.message


def test_one_endpoint_without_peer(tmp_path):
    expect_error(tmp_path, "alone.xml", doc(portals=endpoint()), "<portals>", "<portals> has no <peer>",
                 "or a second <endpoint>")


def test_tr_port_range_counts_peers_and_other_endpoints(tmp_path):
    tr = TR_LBMRD.replace('<lbmrd address="10.1.1.50"/>',
                          '<lbmrd address="10.1.1.50"/>\n        <port-range low="14402" high="14403"/>')
    text = doc(portals=endpoint(tr) + endpoint(TR_MULTICAST, name="ep2", domain="2") + peer(name="p1")
               + peer(INITIATOR2, name="p2"))
    expect_error(tmp_path, "narrow3.xml", text, '<port-range low="14402" high="14403"/>',
                 'endpoint "ep" has 3 links', "widen it to at least 3", offset=-2)


def test_tr_port_range_too_small_for_the_links(tmp_path):
    tr = TR_LBMRD.replace('<lbmrd address="10.1.1.50"/>',
                          '<lbmrd address="10.1.1.50"/>\n        <port-range low="14402" high="14402"/>')
    text = doc(portals=endpoint(tr) + peer(name="p1") + peer(INITIATOR2, name="p2"))
    expect_error(tmp_path, "narrow.xml", text, "<topic-resolution>", 'endpoint "ep" has 2 links',
                 "widen it to at least 2")


def test_two_acceptors_on_one_port(tmp_path):
    """One listen port for two acceptors: an error on the same interface (or with
    one on any address); fine on two interfaces (a router in the middle of two
    sites, one link address each)."""
    text = doc(portals=endpoint() + peer(ACCEPTOR, name="p1") + peer(ACCEPTOR, name="p2"))
    lines = [i + 1 for i, ln in enumerate(text.splitlines()) if "<acceptor>" in ln]
    err = expect_error(tmp_path, "twoacc.xml", text, "<name>p2</name>",
                       'listen-port 26123 of peer "p2" is already used by peer "p1"', offset=2)
    assert err.line == lines[1] and f"(line {line_of(text, '<name>p1</name>') - 1})" in err.message
    head = "        <interface>{}</interface>\n"
    two = doc(portals=endpoint() + peer(ACCEPTOR, name="p1", tcp_head=head.format("127.0.0.1"))
              + peer(ACCEPTOR, name="p2", tcp_head=head.format("127.0.0.2")))
    assert [p.interface for p in expect_ok(tmp_path, "two.xml", two).peers] == ["127.0.0.1", "127.0.0.2"]
    one_any = doc(portals=endpoint() + peer(ACCEPTOR, name="p1", tcp_head=head.format("127.0.0.1"))
                  + peer(ACCEPTOR, name="p2"))
    expect_error(tmp_path, "oneany.xml", one_any, "<name>p2</name>", "already used", offset=2)
