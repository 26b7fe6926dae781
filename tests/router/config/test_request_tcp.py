"""An endpoint's ``<request-tcp interface port/>``: the router's request listener in
the TRD (UM's request_tcp_interface / request_tcp_port), one address advertised as
the UIM listener of the portal's remote domain route records and as the late-join
and retransmission request address of its proxies. Read from the file with UM's
and the DRO's defaults (the ``<domain-route>`` timing it brings into play), bad
values named by file, line and problem, and the portal built with it."""

from __future__ import annotations

import io

from lxml import etree

import lbmr_proto as L
from lbmr_proto import LateJoinOption, OtidOption, TcpTransport
from lbmr_proto.constants import PacketType
from router.config import DTD_TEXT
from router.config.model import DomainRoute, RateLimit, RequestListener, lbmrd_endpoint
from router.core.tr import DomainRoutes, ProxySource
from router.shell.portal_task import new_portal, portal_timing
from tests.router.helpers import ACCEPTOR, doc, endpoint, expect_error, expect_ok, peer

TR_IFACE = """\
      <topic-resolution>
        <interface>127.0.0.1</interface>
        <lbmrd address="10.1.1.50"/>
        <domain-route min-interval="200" max-interval="2000">
          <rate-limit objects-per-second="20"/>
        </domain-route>
      </topic-resolution>
"""
TR_BARE = """\
      <topic-resolution>
        <lbmrd address="10.1.1.50"/>
      </topic-resolution>
"""
TOPIC = "md.late"
OTID = bytes([0]) + bytes(range(1, 31)) + b"\x07"
LATE_JOIN = LateJoinOption(0, 14391, 0, "10.1.0.5", 3, 1200, 1000)


def with_listener(listener: str, tr: str = TR_IFACE, more: str = "") -> str:
    return doc(portals=endpoint(tr, extra=listener) + more + peer())


def test_a_request_listener_is_read_and_the_portal_announces_routes_through_it(tmp_path):
    cfg = expect_ok(tmp_path, "rt.xml", with_listener('      <request-tcp port="15001"/>\n'))
    e = cfg.endpoint
    assert e.request_listener == RequestListener(None, 15001)
    assert e.request_address == ("127.0.0.1", 15001)  # the topic-resolution interface
    assert e.domain_route == DomainRoute(200, 2000, RateLimit(0, 20))
    assert cfg.warnings == ()
    kw = portal_timing(e)
    assert kw["request_address"] == ("127.0.0.1", 15001)
    assert kw["domain_routes"] == DomainRoutes(0.2, 2.0, (0.0, 20.0))


def test_the_defaults_are_the_dros_and_ums(tmp_path):
    cfg = expect_ok(tmp_path, "d.xml", with_listener('      <request-tcp interface="127.0.0.0/8"/>\n', TR_BARE))
    e = cfg.endpoint
    assert e.request_listener == RequestListener("127.0.0.0/8", 14391)  # UM's request_tcp_port_low
    assert e.request_address == ("127.0.0.1", 14391)  # the local address of that network
    assert e.domain_route == DomainRoute()
    assert portal_timing(e)["domain_routes"] == DomainRoutes(0.1, 1.0, (0.0, 50.0))


def test_port_and_interface_of_two_endpoints(tmp_path):
    tr2 = TR_IFACE.replace("10.1.1.50", "10.1.1.51").replace("127.0.0.1", "127.0.0.3")
    text = doc(portals=endpoint(TR_IFACE, extra='      <request-tcp interface="127.0.0.2" port="15391"/>\n')
               + endpoint(tr2, name="ep2", domain="2", extra='      <request-tcp port="15391"/>\n'))
    a, b = expect_ok(tmp_path, "two.xml", text).endpoints
    assert a.request_listener == RequestListener("127.0.0.2", 15391)
    assert a.request_address == ("127.0.0.2", 15391)
    assert b.request_address == ("127.0.0.3", 15391)  # the same port on another interface


def test_one_address_names_the_uim_listener_and_the_late_join_request_address(tmp_path):
    cfg = expect_ok(tmp_path, "rt.xml", with_listener('      <request-tcp port="15001"/>\n'))
    tr = new_portal(cfg.endpoint, b"PORTAL01", 0.0)
    assert tr.settings.request_address == ("127.0.0.1", 15001)
    tr.add_proxy(ProxySource(5, TOPIC, TcpTransport("127.0.0.1", 14380), 2, OTID,
                             tir_options=LATE_JOIN.encode()), 0.0)
    tr.set_reachable_domains([2], 0.0)
    packets = [L.decode(o.data) for o in tr.tick(0.0)]
    routes = [p.ext for p in packets if p.type == PacketType.EXT and isinstance(p.ext, L.RemoteDomainRoute)]
    assert [(r.ip, r.port, r.domains) for r in routes] == [("127.0.0.1", 15001, [2])]
    tirs = [t for p in packets for t in p.tirs if t.topic == TOPIC]
    assert tirs and all(o.otid == OTID for o in tirs[0].options if isinstance(o, OtidOption))
    assert [o for o in tirs[0].options if isinstance(o, LateJoinOption)] == [
        LateJoinOption(0, 15001, 0, "127.0.0.1", 5, 1200, 1000)]  # the proxy's id (5), not the origin's index (3)
    assert tr.stats()["tir_options_substituted"] == 1


def test_without_one_no_domain_route_records_and_no_late_join_options(tmp_path):
    cfg = expect_ok(tmp_path, "none.xml", with_listener(""))
    e = cfg.endpoint
    assert e.request_listener is None and e.request_address is None
    kw = portal_timing(e)
    assert kw["request_address"] is None and kw["domain_routes"] is None
    text = with_listener("")
    line = text.splitlines().index('        <domain-route min-interval="200" max-interval="2000">') + 1
    assert [(w[0], "no effect without a <request-tcp> listener" in w[1]) for w in cfg.warnings] == [(line, True)]
    tr = new_portal(e, b"PORTAL01", 0.0)
    assert tr.settings.request_address is None and tr.settings.domain_routes is None
    tr.add_proxy(ProxySource(5, TOPIC, TcpTransport("127.0.0.1", 14380), 2, OTID,
                             tir_options=LATE_JOIN.encode()), 0.0)
    tr.set_reachable_domains([2], 0.0)
    packets = [L.decode(o.data) for o in tr.tick(0.0)]
    assert not [p for p in packets if isinstance(p.ext, L.RemoteDomainRoute)]
    tirs = [t for p in packets for t in p.tirs if t.topic == TOPIC]
    assert tirs and not [o for o in tirs[0].options if isinstance(o, LateJoinOption)]
    assert tr.stats()["tir_options_dropped_no_listener"] == 1 and tr.reachable_domains() == []
    embedded = lbmrd_endpoint("ep", 1, [("127.0.0.1", 15380)], interface="127.0.1.1",
                              request_listener=RequestListener(port=14500))
    assert portal_timing(embedded)["request_address"] == ("127.0.1.1", 14500)


def test_an_address_applications_cannot_connect_to_is_an_error(tmp_path):
    expect_error(tmp_path, "noif.xml", with_listener('      <request-tcp port="15001"/>\n', TR_BARE),
                 "<request-tcp", "<request-tcp> has no interface", "must be able to connect to it")
    # the default is the topic-resolution interface, not the relay's
    relay = '      <relay interface="127.0.0.1"/>\n      <request-tcp port="15001"/>\n'
    expect_error(tmp_path, "relayif.xml", with_listener(relay, TR_BARE), "<request-tcp",
                 "<request-tcp> has no interface")
    expect_error(tmp_path, "any.xml", with_listener('      <request-tcp interface="*"/>\n'), "<request-tcp",
                 '<request-tcp> interface "*" (any address) cannot be advertised')
    expect_error(tmp_path, "bad.xml", with_listener('      <request-tcp interface="10.1.1"/>\n'), "<request-tcp",
                 "<request-tcp> interface", "not a full IPv4 address")
    expect_error(tmp_path, "big.xml", with_listener('      <request-tcp interface="10.0.0.300"/>\n'),
                 "<request-tcp", "<request-tcp> interface")


def test_bad_ports_name_the_line_and_the_problem(tmp_path):
    expect_error(tmp_path, "p0.xml", with_listener('      <request-tcp port="0"/>\n'), "<request-tcp",
                 "<request-tcp> port", "1..65535")
    expect_error(tmp_path, "pbig.xml", with_listener('      <request-tcp port="70000"/>\n'), "<request-tcp",
                 "<request-tcp> port", "1..65535")
    expect_error(tmp_path, "px.xml", with_listener('      <request-tcp port="http"/>\n'), "<request-tcp",
                 "<request-tcp> port")
    expect_error(tmp_path, "relay.xml", with_listener('      <request-tcp port="14380"/>\n'), "<request-tcp",
                 "<request-tcp> port 14380 is inside the <relay> port range 14371-14390")
    ok = with_listener('      <relay interface="10.1.1.8"/>\n      <request-tcp port="14380"/>\n')
    assert expect_ok(tmp_path, "other.xml", ok).endpoint.request_listener == RequestListener(None, 14380)


def test_two_listeners_on_one_port_of_one_interface_are_an_error(tmp_path):
    second = endpoint(TR_IFACE.replace("10.1.1.50", "10.2.1.50"), name="ep2", domain="2",
                      extra='      <request-tcp port="15001" />\n')
    expect_error(tmp_path, "twice.xml", with_listener('      <request-tcp port="15001"/>\n', more=second),
                 '<request-tcp port="15001" />', '<request-tcp> port 15001 of endpoint "ep2"',
                 '<request-tcp> port of endpoint "ep"')
    acceptor = doc(portals=endpoint(TR_IFACE, extra='      <request-tcp port="26123"/>\n') + peer(ACCEPTOR))
    expect_error(tmp_path, "peer.xml", acceptor, "<request-tcp", "<request-tcp> port 26123",
                 'listen-port of peer "pe"')


def test_the_dtd_places_request_tcp_after_lbt_rm_with_the_ums_default_port(tmp_path):
    dtd = etree.DTD(io.StringIO(DTD_TEXT))
    (el,) = [e for e in dtd.iterelements() if e.name == "request-tcp"]
    assert {a.name: a.default_value for a in el.iterattributes()} == {"interface": None, "port": "14391"}
    assert "lbt-rm?, request-tcp?, acl?" in DTD_TEXT
    assert not [e for e in dtd.iterelements() if e.name == "uim"]  # one listener, one element
    misplaced = doc(portals=endpoint(TR_IFACE.replace("      </topic-resolution>\n",
                                                      "      </topic-resolution>\n      <request-tcp/>\n"),
                                     extra='      <relay/>\n') + peer())
    expect_error(tmp_path, "order.xml", misplaced, "<endpoint", "<relay/>, <lbt-rm/>, <request-tcp/>, <acl>")
    after = with_listener('      <request-tcp/>\n      <lbt-rm/>\n')
    expect_error(tmp_path, "after.xml", after, "<endpoint", "<lbt-rm/>, <request-tcp/>, <acl>")
