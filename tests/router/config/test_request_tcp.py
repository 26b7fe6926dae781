"""``<request-tcp interface port/>`` of an endpoint: the router's request listener in
the TRD (UM's request_tcp_interface / request_tcp_port), which its proxies advertise as
the late-join and retransmission request address; checked values, the relay's interface
by default, in its place in the element order, and handed to the portal's settings."""

from __future__ import annotations

from router.config.model import RequestTcpConfig
from router.shell.portal_task import new_portal
from tests.router.helpers import doc, endpoint, expect_error, expect_ok

RELAY = '      <relay interface="127.0.0.1"/>\n'
TR2 = '      <topic-resolution>\n        <lbmrd address="10.1.1.51"/>\n      </topic-resolution>\n'


def test_absent_there_is_no_request_listener(tmp_path):
    cfg = expect_ok(tmp_path, "none.xml", doc())
    (ep,) = cfg.endpoints
    assert ep.request_tcp is None and ep.request_address is None


def test_port_and_interface(tmp_path):
    text = doc(portals=endpoint(extra=RELAY + '      <request-tcp interface="127.0.0.2" port="15391"/>\n')
               + endpoint(TR2, name="ep2", domain="2", extra=RELAY + '      <request-tcp port="15392"/>\n'))
    a, b = expect_ok(tmp_path, "rt.xml", text).endpoints
    assert a.request_tcp == RequestTcpConfig(15391, "127.0.0.2")
    assert a.request_address == ("127.0.0.2", 15391)
    assert b.request_address == ("127.0.0.1", 15392)  # the relay's interface
    tr = new_portal(a, b"PORTAL01", 0.0)
    assert tr.settings.request_address == ("127.0.0.2", 15391)
    assert new_portal(expect_ok(tmp_path, "none.xml", doc()).endpoints[0], b"PORTAL01", 0.0) \
        .settings.request_address is None


def test_a_bad_port_names_the_line(tmp_path):
    text = doc(portals=endpoint(extra='      <request-tcp port="0"/>\n') + endpoint(TR2, name="ep2", domain="2"))
    expect_error(tmp_path, "p0.xml", text, "<request-tcp", "<request-tcp> port", "1..65535")
    text = doc(portals=endpoint(extra='      <request-tcp port="70000"/>\n') + endpoint(TR2, name="ep2", domain="2"))
    expect_error(tmp_path, "pbig.xml", text, "<request-tcp", "<request-tcp> port")


def test_a_bad_interface_names_the_line(tmp_path):
    text = doc(portals=endpoint(extra='      <request-tcp interface="10.0.0.300" port="15391"/>\n')
               + endpoint(TR2, name="ep2", domain="2"))
    expect_error(tmp_path, "if.xml", text, "<request-tcp", "<request-tcp> interface")


def test_the_port_is_required(tmp_path):
    text = doc(portals=endpoint(extra='      <request-tcp interface="127.0.0.1"/>\n')
               + endpoint(TR2, name="ep2", domain="2"))
    expect_error(tmp_path, "noport.xml", text, "<request-tcp", "port")


def test_it_comes_after_lbt_rm_and_before_acl(tmp_path):
    text = doc(portals=endpoint(extra='      <request-tcp port="15391"/>\n      <lbt-rm/>\n')
               + endpoint(TR2, name="ep2", domain="2"))
    expect_error(tmp_path, "order.xml", text, "<name>ep</name>", "<request-tcp/>", offset=-1)
