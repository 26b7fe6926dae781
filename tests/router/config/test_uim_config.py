"""An endpoint's ``<uim interface port/>`` (its UIM listener, advertised in the
portal's remote domain route records) and the ``<domain-route>`` timing it
brings into play: read from the file with the DRO's defaults, bad values
named by file, line and problem, and the portal built with them."""

from __future__ import annotations

import io

from lxml import etree

from router.config import DTD_TEXT
from router.config.model import DomainRoute, RateLimit, UimListener, lbmrd_endpoint
from router.core.tr import DomainRoutes
from router.shell.portal_task import portal_timing
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


def with_uim(uim: str, tr: str = TR_IFACE, more: str = "") -> str:
    return doc(portals=endpoint(tr, extra=uim) + more + peer())


def test_a_uim_listener_is_read_and_the_portal_announces_routes_through_it(tmp_path):
    cfg = expect_ok(tmp_path, "uim.xml", with_uim('      <uim port="15001"/>\n'))
    e = cfg.endpoint
    assert e.uim == UimListener(None, 15001)
    assert e.uim_address == ("127.0.0.1", 15001)  # the topic-resolution interface
    assert e.domain_route == DomainRoute(200, 2000, RateLimit(0, 20))
    assert cfg.warnings == ()
    assert portal_timing(e)["domain_routes"] == DomainRoutes(("127.0.0.1", 15001), 0.2, 2.0, (0.0, 20.0))


def test_the_defaults_are_the_dros_and_ums(tmp_path):
    cfg = expect_ok(tmp_path, "d.xml", with_uim('      <uim interface="127.0.0.0/8"/>\n', TR_BARE))
    e = cfg.endpoint
    assert e.uim == UimListener("127.0.0.0/8", 14391)  # UM's request_tcp_port_low
    assert e.uim_address == ("127.0.0.1", 14391)  # the local address of that network
    assert e.domain_route == DomainRoute()
    assert portal_timing(e)["domain_routes"] == DomainRoutes(("127.0.0.1", 14391), 0.1, 1.0, (0.0, 50.0))


def test_no_uim_no_domain_route_records(tmp_path):
    cfg = expect_ok(tmp_path, "none.xml", with_uim(""))
    assert cfg.endpoint.uim is None and portal_timing(cfg.endpoint)["domain_routes"] is None
    text = with_uim("")
    line = text.splitlines().index('        <domain-route min-interval="200" max-interval="2000">') + 1
    assert [(w[0], "no effect without a <uim> listener" in w[1]) for w in cfg.warnings] == [(line, True)]
    embedded = lbmrd_endpoint("ep", 1, [("127.0.0.1", 15380)], interface="127.0.1.1",
                              uim=UimListener(port=14500))
    assert portal_timing(embedded)["domain_routes"].address == ("127.0.1.1", 14500)


def test_an_address_applications_cannot_connect_to_is_an_error(tmp_path):
    expect_error(tmp_path, "noif.xml", with_uim('      <uim port="15001"/>\n', TR_BARE), "<uim",
                 "<uim> has no interface", "must be able to connect to it")
    expect_error(tmp_path, "any.xml", with_uim('      <uim interface="*"/>\n'), "<uim",
                 '<uim> interface "*" (any address) cannot be advertised')
    expect_error(tmp_path, "bad.xml", with_uim('      <uim interface="10.1.1"/>\n'), "<uim",
                 "<uim> interface", "not a full IPv4 address")


def test_bad_ports_name_the_line_and_the_problem(tmp_path):
    expect_error(tmp_path, "p0.xml", with_uim('      <uim port="0"/>\n'), "<uim", "<uim> port", "1..65535")
    expect_error(tmp_path, "px.xml", with_uim('      <uim port="http"/>\n'), "<uim", "<uim> port")
    expect_error(tmp_path, "relay.xml", with_uim('      <uim port="14380"/>\n'), "<uim",
                 "<uim> port 14380 is inside the <relay> port range 14371-14390")
    ok = with_uim('      <relay interface="10.1.1.8"/>\n      <uim port="14380"/>\n')
    assert expect_ok(tmp_path, "other.xml", ok).endpoint.uim == UimListener(None, 14380)


def test_two_listeners_on_one_port_of_one_interface_are_an_error(tmp_path):
    second = endpoint(TR_IFACE.replace("10.1.1.50", "10.2.1.50"), name="ep2", domain="2",
                      extra='      <uim port="15001" />\n')
    expect_error(tmp_path, "twice.xml", with_uim('      <uim port="15001"/>\n', more=second),
                 '<uim port="15001" />', '<uim> port 15001 of endpoint "ep2"', '<uim> port of endpoint "ep"')
    acceptor = doc(portals=endpoint(TR_IFACE, extra='      <uim port="26123"/>\n') + peer(ACCEPTOR))
    expect_error(tmp_path, "peer.xml", acceptor, "<uim", "<uim> port 26123", 'listen-port of peer "pe"')


def test_the_dtd_places_uim_after_lbt_rm_with_the_ums_default_port(tmp_path):
    dtd = etree.DTD(io.StringIO(DTD_TEXT))
    uim = next(e for e in dtd.iterelements() if e.name == "uim")
    assert {a.name: a.default_value for a in uim.iterattributes()} == {"interface": None, "port": "14391"}
    assert "lbt-rm?, uim?, acl?" in DTD_TEXT
    misplaced = doc(portals=endpoint(TR_IFACE.replace("      </topic-resolution>\n",
                                                      "      </topic-resolution>\n      <uim/>\n"),
                                     extra='      <relay/>\n') + peer())
    expect_error(tmp_path, "order.xml", misplaced, "<endpoint", "<relay/>, <lbt-rm/>, <uim/>, <acl>")
