"""lbmr-router configuration: shipped files, DTD, values, errors with file and line, warnings."""

from __future__ import annotations

import dataclasses
import io
import os
import re
from importlib import resources
from pathlib import Path

import pytest
from lxml import etree

from lbmrd.config import ConfigError as LbmrdConfigError
from router.config import (
    DEFAULT_KEEPALIVE_INTERVAL_MS,
    DEFAULT_KEEPALIVE_TIMEOUT_MS,
    DEFAULT_LBMRD_PORT,
    DEFAULT_MAX_QUEUE,
    DEFAULT_MULTICAST_GROUP,
    DEFAULT_MULTICAST_PORT,
    DEFAULT_RECONNECT_INTERVAL_MS,
    DEFAULT_RELAY_PORTS,
    DEFAULT_TR_PORTS,
    DTD_TEXT,
    AcceptorConfig,
    ConfigError,
    EndpointConfig,
    InitiatorConfig,
    InterestPacing,
    KeepaliveConfig,
    LbmrdAddress,
    LogConfig,
    MulticastResolver,
    PeerConfig,
    PortRange,
    RelayConfig,
    TlsConfig,
    UseQuery,
    load_config,
    parse_config,
    validate,
)
from tests.helpers import line_of, write
from tests.router.helpers import (
    ACCEPTOR,
    CONFIGS,
    DAEMON,
    INITIATOR,
    TR_LBMRD,
    TR_MULTICAST,
    doc,
    endpoint,
    expect_error,
    expect_ok,
    peer,
)

RELAY = '      <relay port-low="15000" port-high="15009"/>\n'


# --------------------------------------------------------------------------- shipped files


def test_router_a_nat_inside_initiator():
    cfg = load_config(CONFIGS / "router-a.xml")
    assert cfg.warnings == ()
    assert cfg.name == "router-a"
    assert cfg.log == LogConfig("console", None, "disable", 0)
    assert cfg.metrics == ("127.0.0.1", 9390)
    assert cfg.stats_interval_ms == 60000
    assert len(cfg.endpoints) == 1 and len(cfg.peers) == 1
    ep = cfg.endpoint
    assert (ep.name, ep.domain_id) == ("A-TRD1", 1)
    assert cfg.domain_ids == (1,)
    tr = ep.topic_resolution
    assert tr.kind == "unicast" and tr.multicast is None
    assert tr.lbmrds == (LbmrdAddress("127.0.1.1", 15380),)
    assert tr.interface == "127.0.1.1"
    assert tr.port_range == PortRange(14402, 14406) == DEFAULT_TR_PORTS
    assert ep.relay == RelayConfig("127.0.1.1", PortRange(24000, 24999))
    assert len(ep.relay.ports) == 1000  # sized for real use (an 11th topic failed with 10)
    pe = cfg.peer
    assert pe.name == "A-to-B"
    assert pe.role == "initiator" and pe.acceptor is None
    assert pe.initiator == InitiatorConfig("127.0.2.1", 26123, 5000)
    assert pe.interface == "127.0.1.1"
    assert pe.tls is None
    assert pe.keepalive == KeepaliveConfig(True, 5000, 15000)
    assert pe.max_queue == 8 * 1024 * 1024 == DEFAULT_MAX_QUEUE
    # the shipped pair sets <nodelay/>: interest and advertisements are small frames
    assert (pe.receive_buffer, pe.send_buffer, pe.tcp_keepalive, pe.nodelay) == (0, 0, False, True)


def test_router_b_nat_outside_acceptor():
    cfg = validate(CONFIGS / "router-b.xml")
    assert cfg.warnings == ()
    assert cfg.name == "router-b"
    assert cfg.metrics == ("127.0.0.1", 9391)
    ep = cfg.endpoint
    assert (ep.name, ep.domain_id) == ("B-TRD2", 2)
    assert ep.topic_resolution.lbmrds == (LbmrdAddress("127.0.2.1", 15380),)
    assert ep.topic_resolution.interface == "127.0.2.1"
    assert ep.relay == RelayConfig("127.0.2.1", PortRange(25000, 25999))
    pe = cfg.peer
    assert pe.name == "B-from-A"
    assert pe.role == "acceptor" and pe.initiator is None
    assert pe.acceptor == AcceptorConfig(26123)
    assert pe.interface == "127.0.2.1"
    assert pe.keepalive == KeepaliveConfig(True, 5000, 15000)


def test_shipped_pair_fits_together():
    a = load_config(CONFIGS / "router-a.xml")
    b = load_config(CONFIGS / "router-b.xml")
    # A connects to where B listens
    assert (a.peer.initiator.address, a.peer.initiator.port) == (b.peer.interface,
                                                                 b.peer.acceptor.listen_port)
    # the peer link refuses equal names and shared domain ids
    assert a.name != b.name
    assert not set(a.domain_ids) & set(b.domain_ids)
    assert not set(a.endpoint.relay.ports) & set(b.endpoint.relay.ports)
    assert a.metrics != b.metrics


@pytest.mark.parametrize("name", ["router-a.xml", "router-b.xml"])
def test_commented_tls_block_is_valid_when_uncommented(name, tmp_path):
    text = (CONFIGS / name).read_text(encoding="utf-8")
    block = re.search(r"\n( *<tls>.*?</tls>)\n", text, re.S)
    assert block is not None
    before = text[: block.start()]
    assert before.rfind("<!--") > before.rfind("-->"), "the shipped <tls> block is commented out"
    assert load_config(CONFIGS / name).peer.tls is None
    enabled = text.replace(block.group(0), "\n")
    # insert it before the real <initiator>/<acceptor> element (not the ones in comments)
    at = max(enabled.rfind("        <initiator "), enabled.rfind("        <acceptor>"))
    enabled = enabled[:at] + block.group(1) + "\n" + enabled[at:]
    cfg = parse_config(enabled, CONFIGS / name, check_files=False)
    tls = cfg.peer.tls
    router = name.removesuffix(".xml")
    assert tls == TlsConfig(f"/etc/lbmr-router/{router}.pem", f"/etc/lbmr-router/{router}.key",
                            None, "/etc/lbmr-router/ca.pem", None)
    # with the file checks on, the missing files are named
    with pytest.raises(ConfigError) as info:
        parse_config(enabled, CONFIGS / name)
    assert f'"/etc/lbmr-router/{router}.pem" does not exist' in info.value.message


def test_minimal_file_gets_every_default(tmp_path):
    cfg = expect_ok(tmp_path, "min.xml", doc())
    assert cfg.log == LogConfig() and cfg.metrics is None and cfg.stats_interval_ms == 60000
    ep = cfg.endpoint
    tr = ep.topic_resolution
    assert tr.lbmrds == (LbmrdAddress("10.1.1.50", DEFAULT_LBMRD_PORT),)
    assert tr.interface is None and tr.port_range == DEFAULT_TR_PORTS
    assert tr.initial_request.periodic_interval_ms == 1000 and tr.initial_request.duration_s == 10
    assert tr.topic_use_query == tr.pattern_use_query == UseQuery(3000, 5, 300000)
    assert tr.remote_topic_interest == tr.remote_pattern_interest == InterestPacing(1000, 60000)
    assert ep.relay == RelayConfig(None, DEFAULT_RELAY_PORTS) and len(ep.relay.ports) == 20
    assert ep.source_deletion_delay_ms == 1000
    assert (ep.remote_topic.check_interval_ms, ep.remote_topic.max, ep.remote_topic.timeout_ms) \
        == (90000, 100, 300000)
    pe = cfg.peer
    assert pe.initiator == InitiatorConfig("203.0.113.7", 26123, DEFAULT_RECONNECT_INTERVAL_MS)
    assert pe.interface is None and pe.tls is None
    assert pe.keepalive == KeepaliveConfig(True, DEFAULT_KEEPALIVE_INTERVAL_MS,
                                           DEFAULT_KEEPALIVE_TIMEOUT_MS)
    assert pe.max_queue == DEFAULT_MAX_QUEUE
    assert cfg.warnings == ()


def test_multicast_endpoint_variant(tmp_path):
    text = doc(portals=endpoint(TR_MULTICAST, domain="4294967295", extra=RELAY)
               + peer(ACCEPTOR))
    cfg = expect_ok(tmp_path, "mc.xml", text)
    tr = cfg.endpoint.topic_resolution
    assert tr.kind == "multicast"
    assert tr.multicast == MulticastResolver("239.192.0.1", 13000)
    assert tr.lbmrds == () and tr.port_range is None
    assert tr.interface == "10.2.0.0/16"
    # the relay listens on the TR interface unless told otherwise
    assert cfg.endpoint.relay == RelayConfig("10.2.0.0/16", PortRange(15000, 15009))
    assert cfg.endpoint.domain_id == 2**32 - 1
    assert cfg.peer.acceptor == AcceptorConfig(26123) and cfg.peer.role == "acceptor"
    # <multicast/> alone: UM's default group and port
    bare = doc(portals=endpoint("      <topic-resolution><multicast/></topic-resolution>\n")
               + peer())
    tr = expect_ok(tmp_path, "mc0.xml", bare).endpoint.topic_resolution
    assert tr.multicast == MulticastResolver(DEFAULT_MULTICAST_GROUP, DEFAULT_MULTICAST_PORT)
    assert tr.interface is None


def test_every_optional_element(tmp_path):
    daemon = """\
  <daemon>
    <name>full</name>
    <log type="file" frequency="daily" size="100">logs/router.log</log>
    <metrics>127.0.0.2:9400</metrics>
    <stats-interval>0</stats-interval>
  </daemon>
"""
    tr = """\
      <topic-resolution>
        <interface>eth0</interface>
        <lbmrd address="10.1.1.50" port="12000"/>
        <lbmrd address="10.1.1.51" port="12000"/>
        <port-range low="15000" high="15001"/>
        <initial-request periodic-interval="500" duration="0"/>
        <topic-use-query timeout="1000" max="3" periodic-interval="60000"/>
        <pattern-use-query max="7"/>
        <remote-topic-interest min-interval="10" max-interval="20"/>
        <remote-pattern-interest max-interval="1000"/>
      </topic-resolution>
"""
    extra = ('      <relay interface="10.1.1.9" port-low="16000" port-high="16001"/>\n'
             '      <remote-topic check-interval="1000" max-topics="5" timeout="2000"/>\n'
             '      <remote-pattern max-patterns="6"/>\n')
    ep = endpoint(tr, extra=extra).replace(
        "</domain-id>\n", "</domain-id>\n      <source-deletion-delay>250</source-deletion-delay>\n")
    head = ("        <interface>10.1.1.9</interface>\n"
            "        <receive-buffer>4194304</receive-buffer>\n"
            "        <send-buffer>1048576</send-buffer>\n"
            "        <keepalive/>\n        <nodelay/>\n")
    after = ('      <max-queue>65536</max-queue>\n'
             '      <gateway-keepalive idle="no" interval="2000" timeout="6000"/>\n')
    link = INITIATOR.replace("<initiator>", '<initiator reconnect-interval="250">')
    cfg = expect_ok(tmp_path, "full.xml",
                    doc(daemon=daemon, portals=ep + peer(link, tcp_head=head, after=after)))
    assert cfg.warnings == ()
    assert cfg.log == LogConfig("file", str(tmp_path / "logs" / "router.log"), "daily", 100)
    assert cfg.metrics == ("127.0.0.2", 9400)
    assert cfg.stats_interval_ms == 0
    e = cfg.endpoint
    t = e.topic_resolution
    assert t.interface == "eth0"
    assert [(x.address, x.port) for x in t.lbmrds] == [("10.1.1.50", 12000), ("10.1.1.51", 12000)]
    assert t.port_range == PortRange(15000, 15001)
    assert (t.initial_request.periodic_interval_ms, t.initial_request.duration_s) == (500, 0)
    assert t.topic_use_query == UseQuery(1000, 3, 60000)
    assert t.pattern_use_query == UseQuery(3000, 7, 300000)
    assert t.remote_topic_interest == InterestPacing(10, 20)
    assert t.remote_pattern_interest == InterestPacing(1000, 1000)
    assert e.source_deletion_delay_ms == 250
    assert e.relay == RelayConfig("10.1.1.9", PortRange(16000, 16001))
    assert (e.remote_topic.check_interval_ms, e.remote_topic.max, e.remote_topic.timeout_ms) \
        == (1000, 5, 2000)
    assert e.remote_pattern.max == 6
    p = cfg.peer
    assert p.initiator.reconnect_interval_ms == 250
    assert (p.interface, p.receive_buffer, p.send_buffer) == ("10.1.1.9", 4194304, 1048576)
    assert p.tcp_keepalive and p.nodelay
    assert p.max_queue == 65536
    assert p.keepalive == KeepaliveConfig(False, 2000, 6000)


def test_metrics_on_all_interfaces_warns(tmp_path):
    daemon = DAEMON.replace("</name>", "</name>\n    <metrics>*:9400</metrics>")
    text = doc(daemon=daemon)
    cfg = expect_ok(tmp_path, "m.xml", text)
    assert cfg.metrics == ("0.0.0.0", 9400)
    assert cfg.warnings == ((line_of(text, "<metrics>"),
                             "<metrics> listens on 0.0.0.0, not on loopback: the endpoint has no "
                             "authentication, restrict access with a firewall"),)


# --------------------------------------------------------------------------- TLS


def pem(kind: str) -> str:
    return f"-----BEGIN {kind}-----\nTUlJQg==\n-----END {kind}-----\n"


def tls_files(tmp_path: Path) -> None:
    (tmp_path / "tls").mkdir()
    (tmp_path / "tls" / "router.pem").write_text(pem("CERTIFICATE"))
    key = tmp_path / "tls" / "router.key"
    key.write_text(pem("PRIVATE KEY"))
    key.chmod(0o600)
    (tmp_path / "ca.pem").write_text(pem("CERTIFICATE") + pem("CERTIFICATE"))


TLS = """\
        <tls>
          <certificate>tls/router.pem</certificate>
          <certificate-key>tls/router.key</certificate-key>
          <trusted-certificates>{ca}</trusted-certificates>
        </tls>
"""


def test_tls_variant_with_real_files(tmp_path):
    tls_files(tmp_path)
    ca = tmp_path / "ca.pem"  # absolute, the others relative to the file's directory
    sub = tmp_path / "etc"
    sub.mkdir()
    text = doc(portals=endpoint() + peer(tcp_head=TLS.format(ca=ca)))
    # relative names are relative to the configuration file, not to the current directory
    with pytest.raises(ConfigError):
        load_config(write(sub, "r.xml", text))
    cfg = expect_ok(tmp_path, "r.xml", text)
    assert cfg.warnings == ()
    assert cfg.peer.tls == TlsConfig(str(tmp_path / "tls" / "router.pem"),
                                     str(tmp_path / "tls" / "router.key"), None, str(ca), None)
    assert os.path.isabs(cfg.peer.tls.certificate)


def test_tls_key_password_and_ciphers(tmp_path):
    tls_files(tmp_path)
    (tmp_path / "tls" / "router.key").write_text(pem("ENCRYPTED PRIVATE KEY"))
    block = TLS.format(ca="ca.pem").replace(
        "</certificate-key>\n",
        "</certificate-key>\n          <certificate-key-password>s3cret</certificate-key-password>\n"
    ).replace("</trusted-certificates>\n",
              "</trusted-certificates>\n          <cipher-suites>DHE-RSA-AES256-GCM-SHA384,"
              "AES256-GCM-SHA384</cipher-suites>\n")
    cfg = expect_ok(tmp_path, "pw.xml", doc(portals=endpoint() + peer(ACCEPTOR, tcp_head=block)))
    tls = cfg.peer.tls
    assert tls.certificate_key_password == "s3cret"
    assert tls.cipher_suites == "DHE-RSA-AES256-GCM-SHA384,AES256-GCM-SHA384"
    assert "s3cret" not in repr(cfg)


@pytest.mark.parametrize("element, path, needle", [
    ("certificate", "tls/missing.pem", "missing.pem\" does not exist"),
    ("certificate-key", "tls/missing.key", "missing.key\" does not exist"),
    ("trusted-certificates", "missing-ca.pem", "missing-ca.pem\" does not exist"),
    ("certificate", "tls", "is a directory"),
])
def test_missing_tls_file_is_named(tmp_path, element, path, needle):
    tls_files(tmp_path)
    block = re.sub(f"<{element}>[^<]*</{element}>", f"<{element}>{path}</{element}>",
                   TLS.format(ca="ca.pem"))
    text = doc(portals=endpoint() + peer(tcp_head=block))
    err = expect_error(tmp_path, "tls.xml", text, f"<{element}>", f"<{element}>", needle)
    assert str(tmp_path / path) in err.message


def test_tls_file_contents(tmp_path):
    tls_files(tmp_path)
    text = doc(portals=endpoint() + peer(tcp_head=TLS.format(ca="ca.pem")))
    (tmp_path / "tls" / "router.pem").write_text("not a certificate\n")
    expect_error(tmp_path, "c.xml", text, "<certificate>", "holds no PEM certificate", "router.pem")
    (tmp_path / "tls" / "router.pem").write_text(pem("CERTIFICATE"))
    (tmp_path / "tls" / "router.key").write_text(pem("CERTIFICATE"))
    expect_error(tmp_path, "k.xml", text, "<certificate-key>", "holds no PEM private key")
    (tmp_path / "tls" / "router.key").write_text(pem("RSA PRIVATE KEY").replace(
        "\nTUlJ", "\nProc-Type: 4,ENCRYPTED\n\nTUlJ"))
    expect_error(tmp_path, "e.xml", text, "<certificate-key>", "is encrypted",
                 "<certificate-key-password>")
    # unusable files are not checked when asked not to
    cfg = load_config(tmp_path / "e.xml", check_files=False)
    assert cfg.peer.tls.certificate_key == str(tmp_path / "tls" / "router.key")


def test_tls_warnings(tmp_path):
    tls_files(tmp_path)
    key = tmp_path / "tls" / "router.key"
    key.chmod(0o644)
    block = TLS.format(ca="ca.pem").replace(
        "          <trusted-certificates>ca.pem</trusted-certificates>\n", "")
    text = doc(portals=endpoint() + peer(tcp_head=block))
    cfg = expect_ok(tmp_path, "w.xml", text)
    assert cfg.warnings == (
        (line_of(text, "<tls>"), "<tls> has no <trusted-certificates>: the peer's certificate "
                                 "is checked against the system CA store; give your own CA "
                                 "bundle for mutual authentication between your routers"),
        (line_of(text, "<certificate-key>"), f'private key file "{key}" is accessible to other '
                                             "users (mode 0644): chmod 600 it"),
    )


def test_bad_cipher_suites(tmp_path):
    tls_files(tmp_path)
    block = TLS.format(ca="ca.pem").replace(
        "        </tls>", "          <cipher-suites>NO-SUCH-CIPHER</cipher-suites>\n        </tls>")
    text = doc(portals=endpoint() + peer(tcp_head=block))
    expect_error(tmp_path, "cs.xml", text, "<cipher-suites>", '"NO-SUCH-CIPHER" selects no cipher')


# --------------------------------------------------------------------------- DTD


def test_dtd_text_is_package_data_and_parses():
    assert DTD_TEXT == resources.files("router.config").joinpath("router.dtd").read_text(encoding="utf-8")
    dtd = etree.DTD(io.StringIO(DTD_TEXT))
    elements = {e.name: e for e in dtd.iterelements()}
    for name in ("lbmr-router", "daemon", "portals", "endpoint", "topic-resolution", "multicast",
                 "lbmrd", "port-range", "relay", "peer", "single-tcp", "initiator", "acceptor",
                 "address", "port", "listen-port", "gateway-keepalive", "tls", "certificate",
                 "certificate-key", "trusted-certificates", "max-queue", "domain-id", "name"):
        assert name in elements, name
    attrs = {(e.name, a.name): a for e in dtd.iterelements() for a in e.iterattributes()}
    assert attrs["lbmr-router", "version"].values() == ["1.0"]
    assert attrs["lbmr-router", "version"].default == "required"
    assert attrs["lbmrd", "address"].default == "required"
    assert attrs["gateway-keepalive", "idle"].values() == ["yes", "no"]
    # the defaults printed by -d are the ones applied
    defaults = {
        ("multicast", "group"): DEFAULT_MULTICAST_GROUP,
        ("multicast", "port"): DEFAULT_MULTICAST_PORT,
        ("lbmrd", "port"): DEFAULT_LBMRD_PORT,
        ("port-range", "low"): DEFAULT_TR_PORTS.low,
        ("port-range", "high"): DEFAULT_TR_PORTS.high,
        ("relay", "port-low"): DEFAULT_RELAY_PORTS.low,
        ("relay", "port-high"): DEFAULT_RELAY_PORTS.high,
        ("initiator", "reconnect-interval"): DEFAULT_RECONNECT_INTERVAL_MS,
        ("gateway-keepalive", "interval"): DEFAULT_KEEPALIVE_INTERVAL_MS,
        ("gateway-keepalive", "timeout"): DEFAULT_KEEPALIVE_TIMEOUT_MS,
        ("gateway-keepalive", "idle"): "yes",
        ("topic-use-query", "timeout"): UseQuery().timeout_ms,
        ("topic-use-query", "max"): UseQuery().max,
        ("topic-use-query", "periodic-interval"): UseQuery().periodic_interval_ms,
        ("remote-topic-interest", "min-interval"): InterestPacing().min_interval_ms,
        ("remote-topic-interest", "max-interval"): InterestPacing().max_interval_ms,
    }
    for (el, attr), value in defaults.items():
        assert attrs[el, attr].default_value == str(value), (el, attr)
    assert "8388608" in DTD_TEXT and "60000" in DTD_TEXT
    # lxml alone (not our code) accepts the shipped files and refuses two link roles
    for name in ("router-a.xml", "router-b.xml"):
        assert dtd.validate(etree.parse(str(CONFIGS / name))), name
    both = doc(portals=endpoint() + peer(INITIATOR + ACCEPTOR))
    assert not dtd.validate(etree.fromstring(both.encode()))


# --------------------------------------------------------------------------- errors


def test_error_class_is_shared_with_lbmrd():
    assert ConfigError is LbmrdConfigError
    err = ConfigError("r.xml", 7, "boom")
    assert isinstance(err, ValueError) and str(err) == "r.xml:7: boom"


def test_unreadable_file(tmp_path):
    p = tmp_path / "absent.xml"
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert str(info.value).startswith(f"{p}:0: cannot read the configuration file")


def test_xml_syntax_error(tmp_path):
    text = doc().replace("</daemon>", "</deamon>")
    expect_error(tmp_path, "syntax.xml", text, "</deamon>", "XML syntax error", "deamon")


def test_missing_version(tmp_path):
    text = doc(root="<lbmr-router>")
    expect_error(tmp_path, "nover.xml", text, "<lbmr-router>", "missing version attribute",
                 '<lbmr-router version="1.0">')


def test_wrong_version(tmp_path):
    text = doc(root='<lbmr-router version="2.0">')
    expect_error(tmp_path, "v2.xml", text, "<lbmr-router", 'unsupported version "2.0"')


def test_dro_file_gets_a_porting_hint(tmp_path):
    text = doc().replace("lbmr-router", "tnw-gateway")
    expect_error(tmp_path, "dro.xml", text, "<tnw-gateway", "the root element is <tnw-gateway>",
                 "DRO", '<lbmr-router version="1.0">', "<topic-resolution>")


def test_unknown_element(tmp_path):
    text = doc(portals=endpoint() + peer(after="      <max-queeu>1</max-queeu>\n"))
    expect_error(tmp_path, "unk.xml", text, "<max-queeu>", "unknown element <max-queeu> in <peer>",
                 "did you mean <max-queue>?")


def test_unknown_dro_element_explains(tmp_path):
    text = doc(portals=endpoint(extra="      <lbm-config>trd1.cfg</lbm-config>\n") + peer())
    expect_error(tmp_path, "lbmcfg.xml", text, "<lbm-config>",
                 "unknown element <lbm-config> in <endpoint>",
                 "does not read UM configuration files", "<topic-resolution>")


def test_unknown_element_lists_allowed_content(tmp_path):
    text = doc(portals=endpoint() + peer(after="      <flux/>\n"))
    expect_error(tmp_path, "flux.xml", text, "<flux/>", "unknown element <flux> in <peer>",
                 "which may contain <name>, <single-tcp>")


def test_attribute_style_initiator_points_to_child_elements(tmp_path):
    link = '        <initiator address="203.0.113.7" port="26123"/>\n'
    text = doc(portals=endpoint() + peer(link))
    expect_error(tmp_path, "attr.xml", text, "<initiator", 'unknown attribute "address" on <initiator>',
                 "<address> and <port> as child elements")


def test_unknown_attribute(tmp_path):
    text = doc(portals=endpoint() + peer(after='      <gateway-keepalive intervall="10"/>\n'))
    expect_error(tmp_path, "ua.xml", text, "<gateway-keepalive", 'unknown attribute "intervall"',
                 "allowed: idle, interval, timeout", 'did you mean "interval"?')


def test_enumerated_attribute(tmp_path):
    text = doc(portals=endpoint() + peer(after='      <gateway-keepalive idle="true"/>\n'))
    expect_error(tmp_path, "en.xml", text, "<gateway-keepalive", 'invalid idle="true"',
                 '"yes", "no"')


def test_both_initiator_and_acceptor(tmp_path):
    text = doc(portals=endpoint() + peer(INITIATOR + ACCEPTOR))
    err = expect_error(tmp_path, "both.xml", text, "<single-tcp>",
                       "<single-tcp> has both <initiator>", "<acceptor>", "keep one")
    assert f"(line {line_of(text, '<initiator>')})" in err.message
    assert f"(line {line_of(text, '<acceptor>')})" in err.message


def test_neither_initiator_nor_acceptor(tmp_path):
    text = doc(portals=endpoint() + peer("        <nodelay/>\n"))
    expect_error(tmp_path, "neither.xml", text, "<single-tcp>",
                 "<single-tcp> has neither <initiator> nor <acceptor>", "<listen-port>")


def test_multicast_and_lbmrd_together(tmp_path):
    tr = ("      <topic-resolution>\n        <multicast/>\n        <lbmrd address=\"10.1.1.50\"/>\n"
          "      </topic-resolution>\n")
    text = doc(portals=endpoint(tr) + peer())
    expect_error(tmp_path, "mcu.xml", text, "<topic-resolution>", "has both <multicast>",
                 "either multicast or unicast")


def test_missing_required_child(tmp_path):
    text = doc(portals=endpoint().replace("      <domain-id>1</domain-id>\n", "") + peer())
    expect_error(tmp_path, "nodom.xml", text, "<endpoint>", "<endpoint> has no <domain-id>",
                 "in this order")


def test_elements_out_of_order(tmp_path):
    ep = endpoint().replace("      <name>ep</name>\n      <domain-id>1</domain-id>\n",
                            "      <domain-id>1</domain-id>\n      <name>ep</name>\n")
    text = doc(portals=ep + peer())
    expect_error(tmp_path, "order.xml", text, "<endpoint>", "<endpoint> must contain <name>, <domain-id>",
                 "found <domain-id>, <name>, <topic-resolution>")


def test_duplicate_domain_id(tmp_path):
    second = endpoint(TR_MULTICAST, name="ep2", domain="1")
    text = doc(portals=endpoint() + second + peer())
    # reported on the second endpoint, naming the first; before the "one endpoint" limit
    err = expect_error(tmp_path, "dup.xml", text, "<name>ep2</name>",
                       'domain-id 1 of endpoint "ep2" is already used by endpoint "ep"', offset=-1)
    assert f"(line {line_of(text, '<name>ep</name>') - 1})" in err.message
    assert len(err.errors) == 1


def test_two_endpoints_and_a_peer(tmp_path):
    text = doc(portals=endpoint() + endpoint(TR_MULTICAST, name="ep2", domain="2") + peer())
    cfg = expect_ok(tmp_path, "two.xml", text)
    assert cfg.domain_ids == (1, 2) and len(cfg.peers) == 1


def test_missing_peer(tmp_path):
    text = doc(portals=endpoint())
    expect_error(tmp_path, "nopeer.xml", text, "<portals>", "<portals> has no <peer>")


def test_duplicate_portal_name(tmp_path):
    text = doc(portals=endpoint(name="same") + peer(name="same"))
    expect_error(tmp_path, "dupname.xml", text, "<peer>", 'portal name "same" is used twice')


@pytest.mark.parametrize("value, needle", [
    ("0", "<domain-id> 0 is not a valid domain id"),
    ("4294967296", "<domain-id> 4294967296 is out of range"),
    ("one", '<domain-id> "one" is not a number'),
    ("", "<domain-id> is empty"),
])
def test_bad_domain_id(tmp_path, value, needle):
    text = doc(portals=endpoint(domain=value) + peer())
    expect_error(tmp_path, "dom.xml", text, "<domain-id>", needle, "1..4294967295")


@pytest.mark.parametrize("value, needle", [
    ("10.1.1.300", "an octet is greater than 255"),
    ("router-b.example.com", "DNS names are not allowed"),
    ("10.1.1", "not a full IPv4 address"),
    ("010.1.1.1", "leading zeros"),
    ("10.1.1.0/24", "is a network"),
    ("0.0.0.0", 'means "any address"'),
    ("239.1.1.1", "multicast or broadcast"),
    ("fe80::1", "IPv6 is not supported"),
])
def test_bad_initiator_address(tmp_path, value, needle):
    link = INITIATOR.replace("203.0.113.7", value)
    text = doc(portals=endpoint() + peer(link))
    expect_error(tmp_path, "addr.xml", text, "<address>", f'<address> "{value}"', needle)


def test_bad_lbmrd_address(tmp_path):
    text = doc(portals=endpoint(TR_LBMRD.replace("10.1.1.50", "10.1.1.256")) + peer())
    expect_error(tmp_path, "lbmrd.xml", text, "<lbmrd", '<lbmrd> address "10.1.1.256"',
                 "greater than 255")


def test_multicast_group_must_be_multicast(tmp_path):
    text = doc(portals=endpoint(TR_MULTICAST.replace("239.192.0.1", "10.1.1.1")) + peer())
    expect_error(tmp_path, "grp.xml", text, "<multicast", '<multicast> group "10.1.1.1"',
                 "not a multicast address")


def test_bad_interface(tmp_path):
    text = doc(portals=endpoint() + peer(tcp_head="        <interface>10.0.0.0/33</interface>\n"))
    expect_error(tmp_path, "if.xml", text, "<interface>", "<interface>", "prefix length")
    text = doc(portals=endpoint() + peer(tcp_head="        <interface>not an iface</interface>\n"))
    expect_error(tmp_path, "if2.xml", text, "<interface>", '"not an iface" is not an interface')


def test_port_70000(tmp_path):
    text = doc(portals=endpoint() + peer(INITIATOR.replace("26123", "70000")))
    expect_error(tmp_path, "p1.xml", text, "<port>", "<port> 70000 is out of range",
                 "a TCP port 1..65535")
    text = doc(portals=endpoint() + peer(ACCEPTOR.replace("26123", "70000")))
    expect_error(tmp_path, "p2.xml", text, "<listen-port>", "<listen-port> 70000 is out of range")
    text = doc(portals=endpoint(TR_LBMRD.replace('"10.1.1.50"', '"10.1.1.50" port="70000"'))
               + peer())
    expect_error(tmp_path, "p3.xml", text, "<lbmrd", '<lbmrd> port "70000" is out of range',
                 "a UDP port 1..65535")
    text = doc(portals=endpoint(extra=RELAY.replace("15009", "70000")) + peer())
    expect_error(tmp_path, "p4.xml", text, "<relay", '<relay> port-high "70000" is out of range')


def test_port_range_reversed(tmp_path):
    tr = TR_LBMRD.replace("      </topic-resolution>",
                          '        <port-range low="14406" high="14402"/>\n      </topic-resolution>')
    text = doc(portals=endpoint(tr) + peer())
    expect_error(tmp_path, "pr.xml", text, "<port-range", 'low="14406" high="14402"',
                 "the range is reversed, high must be at least low")
    text = doc(portals=endpoint(extra='      <relay port-low="15009" port-high="15000"/>\n') + peer())
    expect_error(tmp_path, "rr.xml", text, "<relay", "<relay>", "port-high must be at least port-low")
    # a range reversed by a default is named as such
    text = doc(portals=endpoint(extra='      <relay port-low="20000"/>\n') + peer())
    expect_error(tmp_path, "rd.xml", text, "<relay", "port-high=14390 (default)")


@pytest.mark.parametrize("interval, timeout", [("5000", "5000"), ("5000", "4000")])
def test_keepalive_timeout_not_above_interval(tmp_path, interval, timeout):
    ka = f'      <gateway-keepalive interval="{interval}" timeout="{timeout}"/>\n'
    text = doc(portals=endpoint() + peer(after=ka))
    expect_error(tmp_path, "ka.xml", text, "<gateway-keepalive",
                 f"timeout {timeout} ms must be greater than the interval {interval} ms")


def test_keepalive_default_interval_counts(tmp_path):
    text = doc(portals=endpoint() + peer(after='      <gateway-keepalive timeout="3000"/>\n'))
    expect_error(tmp_path, "ka2.xml", text, "<gateway-keepalive", "interval 5000 ms")


def test_max_queue_too_small(tmp_path):
    text = doc(portals=endpoint() + peer(after="      <max-queue>1000</max-queue>\n"))
    expect_error(tmp_path, "mq.xml", text, "<max-queue>", "<max-queue> 1000 is out of range",
                 "65536")


def test_interest_pacing_min_above_max(tmp_path):
    tr = TR_LBMRD.replace(
        "      </topic-resolution>",
        '        <remote-topic-interest min-interval="5000" max-interval="100"/>\n'
        "      </topic-resolution>")
    text = doc(portals=endpoint(tr) + peer())
    expect_error(tmp_path, "pace.xml", text, "<remote-topic-interest",
                 "min-interval 5000 is greater than max-interval 100")


def test_empty_name(tmp_path):
    text = doc(daemon=DAEMON.replace("router-x", " "))
    expect_error(tmp_path, "noname.xml", text, "<name> </name>", "<name> is empty")


def test_missing_router_name(tmp_path):
    text = doc(daemon="  <daemon>\n    <stats-interval>1000</stats-interval>\n  </daemon>\n")
    expect_error(tmp_path, "nrn.xml", text, "<daemon>", "<daemon> has no <name>")


def test_log_file_needs_a_name(tmp_path):
    daemon = DAEMON.replace("</name>", '</name>\n    <log type="file"/>')
    expect_error(tmp_path, "log.xml", doc(daemon=daemon), "<log", '<log type="file"> needs the file name')


def test_bad_metrics(tmp_path):
    daemon = DAEMON.replace("</name>", "</name>\n    <metrics>localhost:9390</metrics>")
    expect_error(tmp_path, "met.xml", doc(daemon=daemon), "<metrics>", '"localhost"',
                 "DNS names are not allowed")
    daemon = DAEMON.replace("</name>", "</name>\n    <metrics>127.0.0.1</metrics>")
    expect_error(tmp_path, "met2.xml", doc(daemon=daemon), "<metrics>", "has no port")


def test_several_errors_are_all_reported(tmp_path):
    text = doc(portals=endpoint(domain="0") + peer(INITIATOR.replace("26123", "0")))
    p = write(tmp_path, "many.xml", text)
    with pytest.raises(ConfigError) as info:
        load_config(p)
    lines = [ln for ln, _ in info.value.errors]
    assert lines == [line_of(text, "<domain-id>"), line_of(text, "<port>")]
    assert info.value.format_all().count(str(p)) == 2


def test_entities_are_not_expanded(tmp_path):
    text = doc(daemon=DAEMON.replace("router-x", "&x;")).replace(
        "<lbmr-router version", '<!DOCTYPE lbmr-router [<!ENTITY x SYSTEM "file:///etc/passwd">]>\n'
                                "<lbmr-router version")
    expect_error(tmp_path, "xxe.xml", text, "<!DOCTYPE", "<!DOCTYPE declarations are not allowed")


def test_xinclude_is_refused(tmp_path):
    text = doc(root='<lbmr-router version="1.0" xmlns:xi="http://www.w3.org/2001/XInclude">',
               daemon=DAEMON + '  <xi:include href="other.xml"/>\n')
    expect_error(tmp_path, "xi.xml", text, "<xi:include", "XInclude")


# --------------------------------------------------------------------------- warnings


def test_keepalive_warnings(tmp_path):
    ka = '      <gateway-keepalive interval="5000" timeout="10000"/>\n'
    text = doc(portals=endpoint() + peer(after=ka))
    cfg = expect_ok(tmp_path, "kw.xml", text)
    assert cfg.peer.keepalive == KeepaliveConfig(True, 5000, 10000)
    line = line_of(text, "<gateway-keepalive")
    assert cfg.warnings == ((line, "<gateway-keepalive> timeout 10000 ms is less than 3 x the "
                                   "interval 5000 ms: one late keepalive may close the link"),)
    ka = '      <gateway-keepalive interval="0" timeout="0"/>\n'
    cfg = expect_ok(tmp_path, "k0.xml", doc(portals=endpoint() + peer(after=ka)))
    assert cfg.peer.keepalive == KeepaliveConfig(True, 0, 0)
    assert [m for _, m in cfg.warnings] == [
        "<gateway-keepalive> timeout 0: a dead peer is only noticed when TCP reports an error, "
        "which may take very long"]
    ka = '      <gateway-keepalive interval="0"/>\n'
    cfg = expect_ok(tmp_path, "k1.xml", doc(portals=endpoint() + peer(after=ka)))
    assert [m for _, m in cfg.warnings] == [
        "<gateway-keepalive> interval 0: this router sends no keepalives, so the peer's "
        "keepalive timeout may close an idle link"]


def test_single_relay_port_warns(tmp_path):
    text = doc(portals=endpoint(extra='      <relay port-low="15000" port-high="15000"/>\n')
               + peer())
    cfg = expect_ok(tmp_path, "r1.xml", text)
    assert cfg.endpoint.relay.ports == PortRange(15000, 15000)
    assert cfg.warnings == ((line_of(text, "<relay"),
                             "<relay> has a single port (15000): the portal can relay only one "
                             "transport session into its TRD at a time; give a range of at least "
                             "2 ports"),)


def test_duplicate_lbmrd_and_listen_port_in_relay_range_warn(tmp_path):
    tr = TR_LBMRD.replace("      </topic-resolution>",
                          '        <lbmrd address="10.1.1.50" port="15380"/>\n      </topic-resolution>')
    text = doc(portals=endpoint(tr, extra=RELAY) + peer(ACCEPTOR.replace("26123", "15005")))
    cfg = expect_ok(tmp_path, "dw.xml", text)
    assert cfg.endpoint.topic_resolution.lbmrds == (LbmrdAddress("10.1.1.50", 15380),)
    first = line_of(text, '<lbmrd address="10.1.1.50"/>')
    assert cfg.warnings == (
        (first + 1, f"lbmrd 10.1.1.50:15380 is listed twice (also at line {first})"),
        (line_of(text, "<acceptor>"), 'listen-port 15005 is inside the relay range 15000-15009 '
                                      'of endpoint "ep": one relay port fewer is available'),
    )


# --------------------------------------------------------------------------- API


def test_string_and_bytes_input_agree():
    text = (CONFIGS / "router-a.xml").read_text(encoding="utf-8")
    a = parse_config(text, CONFIGS / "router-a.xml")
    b = parse_config(text.encode(), str(CONFIGS / "router-a.xml"))
    c = load_config(CONFIGS / "router-a.xml")
    assert a == b == c
    assert a.path == str(CONFIGS / "router-a.xml")


def test_parse_config_pseudo_path_resolves_against_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    daemon = DAEMON.replace("</name>", '</name>\n    <log type="file">r.log</log>')
    cfg = parse_config(doc(daemon=daemon))
    assert cfg.path == "<string>"
    assert cfg.log.file == str(tmp_path / "r.log")
    cfg = parse_config(doc(daemon=daemon), base_dir="/var/log")
    assert cfg.log.file == "/var/log/r.log"


def test_model_is_frozen():
    cfg = load_config(CONFIGS / "router-b.xml")
    for obj, attr in ((cfg, "name"), (cfg.endpoint, "domain_id"), (cfg.peer, "max_queue"),
                      (cfg.peer.acceptor, "listen_port"), (cfg.endpoint.relay, "ports")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, attr, None)
    assert isinstance(cfg.endpoint, EndpointConfig) and isinstance(cfg.peer, PeerConfig)
    assert hash(cfg.endpoint) == hash(load_config(CONFIGS / "router-b.xml").endpoint)
    assert 25500 in cfg.endpoint.relay.ports and 24999 not in cfg.endpoint.relay.ports
    assert list(PortRange(1, 3)) == [1, 2, 3] and str(PortRange(1, 3)) == "1-3"


# --------------------------------------------------------------------------- routing


def test_costs_and_route_info(tmp_path):
    daemon = DAEMON.replace("  </daemon>", '    <route-info propagation-interval="500" timeout="2500" '
                                           'max-hop-count="8"/>\n  </daemon>')
    ep = endpoint().replace("<domain-id>1</domain-id>\n", "<domain-id>1</domain-id>\n      <cost>3</cost>\n")
    pe = peer().replace("<name>pe</name>\n", "<name>pe</name>\n      <cost>7</cost>\n")
    cfg = expect_ok(tmp_path, "cost.xml", doc(daemon=daemon, portals=ep + pe))
    assert cfg.endpoint.cost == 3 and cfg.peer.cost == 7
    ri = cfg.route_info
    assert (ri.propagation_interval_ms, ri.timeout_ms, ri.max_hop_count) == (500, 2500, 8)
    plain = expect_ok(tmp_path, "plain.xml", doc())
    assert plain.endpoint.cost == plain.peer.cost == 1
    assert (plain.route_info.propagation_interval_ms, plain.route_info.timeout_ms,
            plain.route_info.max_hop_count) == (1000, 4000, 100)


def test_bad_costs_and_route_info_name_the_line(tmp_path):
    ep = endpoint().replace("<domain-id>1</domain-id>\n", "<domain-id>1</domain-id>\n      <cost>0</cost>\n")
    expect_error(tmp_path, "cost0.xml", doc(portals=ep + peer()), "<cost>0", "cost", "1..")
    daemon = DAEMON.replace("  </daemon>", '    <route-info propagation-interval="1000" timeout="1000"/>\n'
                                           "  </daemon>")
    expect_error(tmp_path, "ri.xml", doc(daemon=daemon), "<route-info", "timeout 1000 ms must be greater")
    daemon = DAEMON.replace("  </daemon>", '    <route-info max-hop-count="300"/>\n  </daemon>')
    expect_error(tmp_path, "hops.xml", doc(daemon=daemon), "<route-info", "1..255")


def test_relay_max_proxies(tmp_path):
    ep = endpoint(extra='      <relay port-low="15000" port-high="25000" max-proxies="12000"/>\n')
    assert expect_ok(tmp_path, "mp.xml", doc(portals=ep + peer())).endpoint.max_proxies == 12000
    assert expect_ok(tmp_path, "d.xml", doc()).endpoint.max_proxies == 4096
    ep = endpoint(extra='      <relay max-proxies="0"/>\n')
    expect_error(tmp_path, "mp0.xml", doc(portals=ep + peer()), "<relay", "max-proxies", "1..1000000")
