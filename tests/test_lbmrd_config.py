"""lbmrd configuration layer: shipped files, DTD, error messages with lines, warnings."""

from __future__ import annotations

import io
import ipaddress
import socket
from importlib import resources
from pathlib import Path

import pytest
from lxml import etree

from lbmrd.config import (
    DEFAULTS,
    DTD_TEXT,
    Config,
    ConfigError,
    DaemonSettings,
    Domain,
    NatRule,
    Transform,
    load_config,
    parse_config,
    validate,
)

from .helpers import expect_config_error, line_of

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def ip(text: str) -> bytes:
    return socket.inet_aton(text)


def expect_error(tmp_path: Path, name: str, text: str, marker: str, *needles: str,
                 strict: bool = False, offset: int = 0) -> ConfigError:
    """The file fails at the line of ``marker`` (+ offset); the message has every needle."""
    return expect_config_error(lambda p: validate(p, strict=strict), ConfigError, tmp_path, name,
                               text, marker, *needles, offset=offset)


HEAD = '<?xml version="1.0" encoding="UTF-8" ?>\n'
DAEMON = """\
  <daemon>
    <interface>10.1.1.50</interface>
    <port>12000</port>
  </daemon>
"""
DOMAINS = """\
  <domains>
    <domain name="inside">
      <network>10.1.0.0/16</network>
    </domain>
    <domain name="outside">
      <network>192.168.1/24</network>
    </domain>
  </domains>
"""
TRANSFORMS = """\
  <transformations>
    <transform source="inside" destination="outside">
      <rule>
        <match address="10.1.1.50" port="*"/>
        <replace address="192.168.1.1" port="*"/>
      </rule>
    </transform>
  </transformations>
"""


def doc(daemon: str = DAEMON, domains: str = DOMAINS, transforms: str = TRANSFORMS,
        root: str = '<lbmrd version="1.0">') -> str:
    return f"{HEAD}{root}\n{daemon}{domains}{transforms}</lbmrd>\n"


# --------------------------------------------------------------------------- shipped files


def test_default_config_is_strictly_valid_with_every_default():
    cfg = validate(CONFIGS / "lbmrd.xml", strict=True)
    assert cfg.strict_valid and cfg.warnings == []
    assert cfg.path == str(CONFIGS / "lbmrd.xml")
    assert cfg.daemon == DaemonSettings(
        interface="127.0.0.1", port=15380, activity_ms=60000, ttl_s=60.0, log=None,
        rcv_buf=1048576, snd_buf=1048576,
    )
    # every value equals UM's default except the explicit loopback bind
    assert DEFAULTS.overlay(cfg.daemon) == DaemonSettings(
        "127.0.0.1", DEFAULTS.port, DEFAULTS.activity_ms, DEFAULTS.ttl_s, None,
        DEFAULTS.rcv_buf, DEFAULTS.snd_buf,
    )
    # the dummy domain holds no real client
    assert cfg.domain_of("127.0.0.1") is None
    assert [d.name for d in cfg.domains] == ["dummy"]
    text = (CONFIGS / "lbmrd.xml").read_text()
    for element in ("interface", "port", "activity", "ttl", "log",
                    "resolver_unicast_receiver_socket_buffer",
                    "resolver_unicast_send_socket_buffer"):
        assert f"<{element}>" in text, element


def test_dummy_file_loads_unchanged():
    text = (CONFIGS / "lbmrd-dummy.xml").read_text()
    assert text.startswith('<?xml version="1.0" encoding="UTF-8" ?>\n<lbmrd version="1.0">')
    assert "<network>0.0.0.0/32</network>" in text
    cfg = validate(CONFIGS / "lbmrd-dummy.xml", strict=True)
    assert cfg.strict_valid and cfg.warnings == []
    assert cfg.daemon == DaemonSettings(interface="10.29.3.0/24", port=12001)
    assert cfg.domains == (Domain("dummy", (ipaddress.IPv4Network("0.0.0.0/32"),)),)
    (rule,) = cfg.rules_for("dummy", "dummy")
    assert rule == NatRule(ip("0.0.0.0"), 0, ip("0.0.0.0"), 0)
    assert cfg.transforms == (Transform("dummy", "dummy", (rule,)),)
    assert cfg.domain_of("10.29.3.7") is None
    assert cfg.domain_of(ip("0.0.0.0")) == "dummy"
    assert rule.apply(ip("10.29.3.7"), 0) is None
    assert rule.apply(ip("0.0.0.0"), 14402) is None


def test_nat_example_from_um_documentation():
    text = (CONFIGS / "lbmrd-nat-example.xml").read_text()
    assert "<network>192.168.1/24</network>" in text  # UM's short form, kept as written
    cfg = load_config(CONFIGS / "lbmrd-nat-example.xml")
    assert cfg.strict_valid and cfg.warnings == []
    assert cfg.daemon == DaemonSettings(interface="10.1.1.50", port=12000)
    assert [(d.name, d.networks) for d in cfg.domains] == [
        ("Net-NYC", (ipaddress.IPv4Network("10.1.0.0/16"),)),
        ("Net-NJC", (ipaddress.IPv4Network("192.168.1.0/24"),)),
    ]
    assert cfg.domain_of("192.168.1.7") == "Net-NJC"
    assert cfg.domain_of(ip("10.1.1.50")) == "Net-NYC"
    assert cfg.domain_of("172.16.0.1") is None
    (rule,) = cfg.rules_for("Net-NYC", "Net-NJC")
    assert (rule.match_port, rule.replace_port) == (None, None)  # "*" both sides
    assert str(rule) == "10.1.1.50:* -> 192.168.1.1:*"
    assert rule.apply(ip("10.1.1.50"), 12001) == (ip("192.168.1.1"), 12001)
    assert rule.apply(ip("10.1.1.50"), 14371) == (ip("192.168.1.1"), 14371)
    assert rule.apply(ip("10.1.1.51"), 12001) is None
    assert cfg.rewrite("Net-NYC", "Net-NJC", ip("10.1.1.50"), 12001) == (ip("192.168.1.1"), 12001)
    # no reverse transform, and no rules inside one domain
    assert cfg.rules_for("Net-NJC", "Net-NYC") == ()
    assert cfg.rules_for("Net-NYC", "Net-NYC") == ()
    assert cfg.rewrite("Net-NJC", "Net-NYC", ip("10.1.1.50"), 12001) is None


def test_rules_with_explicit_ports_first_match_across_transforms():
    transforms = """\
  <transformations>
    <transform source="inside" destination="outside">
      <rule>
        <match address="10.1.1.50" port="12001"/>
        <replace address="192.168.1.1" port="12100"/>
      </rule>
    </transform>
    <transform source="outside" destination="inside">
      <rule>
        <match address="192.168.1.9"/>
        <replace address="10.1.1.9" port="7"/>
      </rule>
    </transform>
    <transform source="inside" destination="outside">
      <rule>
        <match address="10.1.1.50"/>
        <replace address="192.168.1.2"/>
      </rule>
    </transform>
  </transformations>
"""
    cfg = parse_config(doc(transforms=transforms), "ports.xml")
    first, second = cfg.rules_for("inside", "outside")
    assert (first.match_port, first.replace_port) == (12001, 12100)
    assert (second.match_port, second.replace_port) == (None, None)  # port defaults to "*"
    assert first.apply(ip("10.1.1.50"), 12001) == (ip("192.168.1.1"), 12100)
    assert first.apply(ip("10.1.1.50"), 12002) is None
    # document order across transforms of the same pair: the explicit-port rule wins
    assert cfg.rewrite("inside", "outside", ip("10.1.1.50"), 12001) == (ip("192.168.1.1"), 12100)
    assert cfg.rewrite("inside", "outside", ip("10.1.1.50"), 12002) == (ip("192.168.1.2"), 12002)
    (back,) = cfg.rules_for("outside", "inside")
    assert back.apply(ip("192.168.1.9"), 5000) == (ip("10.1.1.9"), 7)
    assert [t.line for t in cfg.transforms] == [
        line_of(doc(transforms=transforms), '<transform source="inside" destination="outside">\n      <rule>\n        <match address="10.1.1.50" port="12001"/>'),
        line_of(doc(transforms=transforms), '<transform source="outside"'),
        line_of(doc(transforms=transforms), '<match address="10.1.1.50"/>') - 2,
    ]


def test_domain_of_is_first_domain_in_document_order():
    domains = """\
  <domains>
    <domain name="host">
      <network>10.1.1.50</network>
    </domain>
    <domain name="net">
      <network>10.1.0.0/16</network>
      <network>172.16/12</network>
    </domain>
  </domains>
"""
    text = doc(domains=domains, transforms="  <transformations>\n    <transform source=\"host\" destination=\"net\">\n      <rule>\n        <match address=\"1.2.3.4\"/>\n        <replace address=\"5.6.7.8\"/>\n      </rule>\n    </transform>\n  </transformations>\n")
    cfg = parse_config(text, "order.xml")
    assert cfg.domain_of("10.1.1.50") == "host"
    assert cfg.domain_of(ip("10.1.1.50")) == "host"  # cached path gives the same answer
    assert cfg.domain_of(ip("10.1.1.50")) == "host"
    assert cfg.domain_of("10.1.1.51") == "net"
    assert cfg.domain_of("172.31.255.255") == "net"
    assert cfg.domain_of("172.32.0.0") is None
    assert (line_of(text, "<network>10.1.0.0/16"), ) == tuple(
        ln for ln, msg in cfg.warnings if "overlaps" in msg and '"host"' in msg)
    with pytest.raises(ValueError):
        cfg.domain_of(b"\x01\x02\x03")
    with pytest.raises(ValueError):
        cfg.domain_of("host.example")


def test_natrule_values_and_parse():
    r = NatRule.parse("10.0.0.1", "*", "10.0.0.2", "99")
    assert r == NatRule(ip("10.0.0.1"), None, ip("10.0.0.2"), 99)
    assert r.match_address == "10.0.0.1" and r.replace_address == "10.0.0.2"
    assert r.apply(ip("10.0.0.1"), 1) == (ip("10.0.0.2"), 99)
    with pytest.raises(ValueError, match="network"):
        NatRule.parse("10.0.0.0/8")
    with pytest.raises(ValueError, match="0..65535"):
        NatRule.parse("10.0.0.1", "65536")
    with pytest.raises(ValueError):
        NatRule(b"\x01\x02\x03", None, ip("1.1.1.1"), None)


def test_empty_config_and_overlay():
    cfg = Config.empty()
    assert cfg.domain_of("10.0.0.1") is None and cfg.rules_for("a", "b") == ()
    cli = DaemonSettings(port=1234, ttl_s=5.0)
    eff = DEFAULTS.overlay(DaemonSettings(port=12000, interface="10.0.0.1")).overlay(cli)
    assert eff == DaemonSettings("10.0.0.1", 1234, 60000, 5.0, None, 1048576, 1048576)


# --------------------------------------------------------------------------- DTD


def test_dtd_text_is_package_data_and_parses():
    assert DTD_TEXT == resources.files("lbmrd").joinpath("lbmrd.dtd").read_text(encoding="utf-8")
    dtd = etree.DTD(io.StringIO(DTD_TEXT))
    elements = {e.name: e for e in dtd.iterelements()}
    assert set(elements) == {
        "lbmrd", "daemon", "activity", "interface", "port", "ttl", "log",
        "resolver_unicast_receiver_socket_buffer", "resolver_unicast_send_socket_buffer",
        "domains", "domain", "network", "transformations", "transform", "rule", "match",
        "replace",
    }
    assert elements["match"].type == "empty" and elements["replace"].type == "empty"
    assert elements["network"].type == "mixed"
    attrs = {(e.name, a.name): a for e in dtd.iterelements() for a in e.iterattributes()}
    assert set(attrs) == {
        ("lbmrd", "version"), ("domain", "name"), ("transform", "source"),
        ("transform", "destination"), ("match", "address"), ("match", "port"),
        ("replace", "address"), ("replace", "port"),
    }
    assert attrs["lbmrd", "version"].type == "enumeration"
    assert attrs["lbmrd", "version"].values() == ["1.0"]
    assert attrs["lbmrd", "version"].default == "required"
    assert attrs["domain", "name"].type == "id"
    assert attrs["transform", "source"].type == "idref"
    assert attrs["transform", "destination"].type == "idref"
    for el in ("match", "replace"):
        assert attrs[el, "address"].default == "required"
        assert attrs[el, "port"].default_value == "*"
    # lxml alone (not our code) accepts UM's dummy file and rejects the relaxed form
    good = etree.parse(str(CONFIGS / "lbmrd-dummy.xml"))
    assert dtd.validate(good)
    bad = etree.fromstring(b'<lbmrd version="1.0"><daemon/></lbmrd>')
    assert not dtd.validate(bad)


# --------------------------------------------------------------------------- errors


def test_error_is_value_error_with_path_line_message():
    err = ConfigError("x.xml", 7, "boom")
    assert isinstance(err, ValueError)
    assert str(err) == "x.xml:7: boom"
    assert err.errors == [(7, "boom")]


def test_unreadable_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.xml")
    assert str(info.value).startswith(f"{tmp_path / 'missing.xml'}:0: cannot read")


def test_xml_syntax_error(tmp_path):
    text = doc(daemon="  <daemon>\n    <port>12000</prot>\n  </daemon>\n")
    expect_error(tmp_path, "syntax.xml", text, "</prot>", "XML syntax error", "port")


def test_missing_version(tmp_path):
    text = doc(root="<lbmrd>")
    expect_error(tmp_path, "nover.xml", text, "<lbmrd>", "missing version", 'version="1.0"')


def test_wrong_version(tmp_path):
    text = doc(root='<lbmrd version="2.0">')
    expect_error(tmp_path, "v2.xml", text, "<lbmrd ", '"2.0"', '"1.0"')


def test_unknown_element(tmp_path):
    text = doc(daemon="  <daemon>\n    <port>12000</port>\n    <keepalive>5</keepalive>\n  </daemon>\n")
    expect_error(tmp_path, "unknown.xml", text, "<keepalive>", "unknown element <keepalive>",
                 "<daemon>", "<activity>")


def test_missing_domains_strict_but_relaxed_accepts(tmp_path):
    text = doc(domains="", transforms="")
    err = expect_error(tmp_path, "nodomains.xml", text, "<lbmrd ", "<domains>",
                       "<transformations>", "dummy", strict=True)
    assert "missing" in err.message
    cfg = load_config(tmp_path / "nodomains.xml")  # relaxed by default
    assert not cfg.strict_valid
    assert cfg.daemon == DaemonSettings(interface="10.1.1.50", port=12000)
    assert cfg.domains == () and cfg.transforms == ()
    assert [ln for ln, _ in cfg.warnings] == [line_of(text, "<lbmrd ")] * 2
    assert "relaxed" in cfg.warnings[0][1]
    assert validate(tmp_path / "nodomains.xml").warnings == cfg.warnings


def test_empty_sections_relaxed(tmp_path):
    text = doc(daemon="  <daemon>\n    <ttl>5000</ttl>\n  </daemon>\n",
               domains="  <domains>\n  </domains>\n", transforms="  <transformations/>\n")
    expect_error(tmp_path, "empty.xml", text, "<domains>", "<domains>", strict=True)
    cfg = load_config(tmp_path / "empty.xml")
    assert cfg.daemon.ttl_s == 5.0
    # warnings come in line order, whichever check found them
    assert [ln for ln, _ in cfg.warnings] == [line_of(text, "<ttl>"), line_of(text, "<domains>"),
                                             line_of(text, "<transformations/>")]
    assert "empty <domains>" in cfg.warnings[1][1]


def test_relaxed_mode_still_reports_other_errors(tmp_path):
    text = doc(daemon="  <daemon>\n    <prot>1</prot>\n  </daemon>\n", domains="", transforms="")
    expect_error(tmp_path, "relaxed-bad.xml", text, "<prot>", "unknown element <prot>")


def test_bad_port_out_of_range(tmp_path):
    text = doc(daemon="  <daemon>\n    <port>70000</port>\n  </daemon>\n")
    expect_error(tmp_path, "port.xml", text, "70000", "<port>", "70000", "1..65535")


def test_bad_port_not_a_number(tmp_path):
    text = doc(daemon="  <daemon>\n    <port>abc</port>\n  </daemon>\n")
    expect_error(tmp_path, "port.xml", text, "abc", "<port>", '"abc"', "not a number")


@pytest.mark.parametrize("tag", ["activity", "ttl", "resolver_unicast_receiver_socket_buffer",
                                 "resolver_unicast_send_socket_buffer"])
def test_positive_integers(tmp_path, tag):
    text = doc(daemon=f"  <daemon>\n    <port>1</port>\n    <{tag}>0</{tag}>\n  </daemon>\n")
    expect_error(tmp_path, f"{tag}.xml", text, f"<{tag}>", f"<{tag}>", "positive")


def test_network_dns_name(tmp_path):
    text = doc(domains=DOMAINS.replace("10.1.0.0/16", "example.com"))
    expect_error(tmp_path, "dns.xml", text, "example.com", "<network>", "example.com",
                 "DNS names are not allowed")


def test_network_short_form_needs_prefix(tmp_path):
    text = doc(domains=DOMAINS.replace("10.1.0.0/16", "10.1"))
    expect_error(tmp_path, "short.xml", text, "<network>10.1<", "10.1/16")


def test_match_address_with_cidr(tmp_path):
    text = doc(transforms=TRANSFORMS.replace('"10.1.1.50"', '"10.1.1.0/24"'))
    expect_error(tmp_path, "cidr.xml", text, "10.1.1.0/24", "<match> address", "single",
                 "host")


def test_transform_source_unknown_domain(tmp_path):
    text = doc(transforms=TRANSFORMS.replace('source="inside"', 'source="Net-NYC"'))
    expect_error(tmp_path, "idref.xml", text, 'source="Net-NYC"', 'source="Net-NYC"',
                 "does not name a domain", "inside, outside")


def test_rule_replace_before_match(tmp_path):
    rules = TRANSFORMS.replace(
        '        <match address="10.1.1.50" port="*"/>\n        <replace address="192.168.1.1" port="*"/>\n',
        '        <replace address="192.168.1.1" port="*"/>\n        <match address="10.1.1.50" port="*"/>\n',
    )
    assert rules != TRANSFORMS
    text = doc(transforms=rules)
    expect_error(tmp_path, "order.xml", text, "<rule>", "<rule>",
                 "<match> followed by exactly one <replace>", "found <replace>, <match>")


def test_rule_port_values(tmp_path):
    text = doc(transforms=TRANSFORMS.replace('<replace address="192.168.1.1" port="*"/>',
                                             '<replace address="192.168.1.1" port="http"/>'))
    expect_error(tmp_path, "rport.xml", text, 'port="http"', "<replace> port", "0..65535", '"*"')


def test_duplicate_domain_name(tmp_path):
    text = doc(domains=DOMAINS.replace('name="outside"', 'name="inside"'),
               transforms=TRANSFORMS.replace('destination="outside"', 'destination="inside"'))
    # reported on the second <domain>, the line above its <network>
    err = expect_error(tmp_path, "dup.xml", text, "192.168.1/24",
                       'duplicate domain name "inside"', offset=-1)
    assert f"first defined at line {line_of(text, '10.1.0.0/16') - 1}" in err.message


def test_entities_are_not_expanded(tmp_path):
    text = ('<?xml version="1.0"?>\n<!DOCTYPE lbmrd [<!ENTITY x SYSTEM "file:///etc/passwd">]>\n'
            '<lbmrd version="1.0">\n  <daemon>\n    <log>&x;</log>\n  </daemon>\n</lbmrd>\n')
    expect_error(tmp_path, "xxe.xml", text, "<!DOCTYPE", "<!DOCTYPE declarations are not allowed")
    # an undeclared entity reference is a syntax error
    text = '<?xml version="1.0"?>\n<lbmrd version="1.0">\n  <daemon>\n    <log>&x;</log>\n  </daemon>\n</lbmrd>\n'
    expect_error(tmp_path, "ent.xml", text, "&x;", "Entity 'x' not defined")


def test_xinclude_is_refused(tmp_path):
    text = doc(root='<lbmrd version="1.0" xmlns:xi="http://www.w3.org/2001/XInclude">',
               daemon='  <xi:include href="other.xml"/>\n')
    expect_error(tmp_path, "xi.xml", text, "<xi:include", "XInclude")


# --------------------------------------------------------------------------- warnings


def test_duplicate_daemon_setting_last_wins(tmp_path):
    daemon = "  <daemon>\n    <port>12000</port>\n    <interface>10.1.1.50</interface>\n    <port>12001</port>\n  </daemon>\n"
    text = doc(daemon=daemon)
    cfg = parse_config(text, "dup.xml")
    assert cfg.daemon.port == 12001
    assert cfg.warnings == [(line_of(text, "<port>12001"),
                             f"<port> is set again (also at line {line_of(text, '<port>12000')}): "
                             "the last one wins (12001)")]


def test_ttl_of_1000_or_more_is_milliseconds(tmp_path):
    text = doc(daemon="  <daemon>\n    <ttl>30000</ttl>\n  </daemon>\n")
    cfg = parse_config(text, "ttl.xml")
    assert cfg.daemon.ttl_s == 30.0
    ((line, msg),) = cfg.warnings
    assert line == line_of(text, "<ttl>")
    assert "milliseconds" in msg and "30 s" in msg
    cfg = parse_config(doc(daemon="  <daemon>\n    <ttl>999</ttl>\n  </daemon>\n"), "ttl.xml")
    assert cfg.daemon.ttl_s == 999.0 and cfg.warnings == []
    cfg = parse_config(doc(daemon="  <daemon>\n    <ttl>1000</ttl>\n  </daemon>\n"), "ttl.xml")
    assert cfg.daemon.ttl_s == 1.0 and len(cfg.warnings) == 1


def test_string_and_bytes_input_agree():
    text = doc()
    assert parse_config(text) == parse_config(text.encode())
    assert parse_config(text).path == "<string>"


def test_man_page_examples_are_the_shipped_files():
    page = (ROOT / "man" / "lbmrd.conf.5").read_text()
    blocks = [b.split("\n.EE")[0] for b in page.split(".EX\n")[1:]]
    xml_blocks = [b for b in blocks if b.startswith("<?xml")]
    assert len(xml_blocks) == 2
    dummy, nat = xml_blocks
    assert dummy + "\n" == (CONFIGS / "lbmrd-dummy.xml").read_text()
    for text, name in ((dummy, "lbmrd-dummy.xml"), (nat, "lbmrd-nat-example.xml")):
        got = parse_config(text, "man")
        want = load_config(CONFIGS / name)
        assert (got.daemon, got.domains, got.transforms) == (want.daemon, want.domains,
                                                              want.transforms)
