"""Configuration layer of lbmr-router: parse and check the XML configuration file.

Sans-IO apart from reading files: ``load_config`` reads the configuration
(and checks that the TLS files it names exist and are readable);
``parse_config`` takes text.  Both return an immutable :class:`RouterConfig`
and open no sockets.

The grammar is modelled on the DRO's ``<tnw-gateway>`` file (element names,
order, defaults, milliseconds), with ``<lbmr-router version="1.0">`` as the
root and ``<topic-resolution>``/``<relay>`` instead of a UM configuration
file; :data:`DTD_TEXT` (``router/router.dtd``, printed by ``lbmr-router -d``)
documents every element.  Following the DRO, the peer link is written in
child-element style (``<initiator><address>..</address><port>..</port>``,
``<acceptor><listen-port>..</listen-port>``, ``<name>``, ``<domain-id>``),
settings of our own (topic resolution, relay) as attributes of empty elements.

Over 600 lines because it holds one checker function per element of the
grammar (the values are in :mod:`router.config_model`, the DTD and message
translation in :mod:`router.config_grammar`).

Pipeline, every failure raising :class:`ConfigError` (``path:line: message``,
the same class as lbmrd's):

1. XML parse with lxml (no entity expansion, no network, no XInclude, no DTD
   from the document itself).
2. Root checks: the root is ``<lbmr-router>`` and carries ``version="1.0"``.
3. Validation against our own DTD; libxml2 messages are rewritten into
   configuration terms (with hints for DRO elements we do not support).
4. Values: numbers and ranges, IPv4 addresses, port ranges, keepalive
   timing, TLS files; then unique portal names, domain ids and listen ports.
5. What this version supports: one or more ``<endpoint>``s with any number of
   ``<peer>``s, but at least two portals (a lone endpoint joins nothing).

Things accepted but suspicious are returned in :attr:`RouterConfig.warnings`
as ``(line, message)`` pairs.

The values are in :mod:`router.config_model`, the grammar and its messages in
:mod:`router.config_grammar`. This module (over 600 lines) is the value
checker: one function per element of the grammar, kept in one place because
the cross-checks (names, domain ids, ports, TLS) read across all of them.
"""

from __future__ import annotations

import ipaddress
import os
import re
import ssl
import stat
from pathlib import Path

from lxml import etree

from lbmr_runtime.values import DIGITS_RE, octets, parse_int, parse_network
from lbmr_runtime.xmlconfig import (
    ConfigError,
    element_text,
    parse_xml,
    raise_errors,
    read_config_file,
    refuse_entities_and_xinclude,
)

from .acl_config import parse_acl
from .config_grammar import DTD_TEXT, dtd_errors
from .config_model import (
    DEFAULT_KEEPALIVE_INTERVAL_MS,
    DEFAULT_KEEPALIVE_TIMEOUT_MS,
    DEFAULT_LBMRD_PORT,
    DEFAULT_MAX_PROXIES,
    DEFAULT_MAX_QUEUE,
    DEFAULT_MULTICAST_GROUP,
    DEFAULT_MULTICAST_PORT,
    DEFAULT_MULTICAST_TTL,
    DEFAULT_RECONNECT_INTERVAL_MS,
    DEFAULT_RELAY_PORTS,
    DEFAULT_SOURCE_DELETION_DELAY_MS,
    DEFAULT_STATS_INTERVAL_MS,
    DEFAULT_TR_PORTS,
    MIN_MAX_QUEUE,
    AcceptorConfig,
    DomainRoute,
    EndpointConfig,
    InitialRequest,
    InitiatorConfig,
    InterestPacing,
    KeepaliveConfig,
    LbmrdAddress,
    LbtrmConfig,
    LogConfig,
    MulticastResolver,
    PeerConfig,
    PortRange,
    RateLimit,
    RelayConfig,
    RemoteInterest,
    RouteInfoConfig,
    RouterConfig,
    TlsConfig,
    TopicResolution,
    UseQuery,
)
from .core.acl import OPEN, PortalAcl
from .core.fanout import DEFAULT_MAX_QUEUE as DEFAULT_FANOUT_MAX_QUEUE
from .core.fanout import MIN_MAX_QUEUE as MIN_FANOUT_QUEUE

__all__ = [
    "DTD_TEXT",
    "DEFAULT_STATS_INTERVAL_MS",
    "DEFAULT_MULTICAST_GROUP",
    "DEFAULT_MULTICAST_PORT",
    "DEFAULT_LBMRD_PORT",
    "DEFAULT_TR_PORTS",
    "DEFAULT_RELAY_PORTS",
    "DEFAULT_SOURCE_DELETION_DELAY_MS",
    "DEFAULT_RECONNECT_INTERVAL_MS",
    "DEFAULT_KEEPALIVE_INTERVAL_MS",
    "DEFAULT_KEEPALIVE_TIMEOUT_MS",
    "DEFAULT_MAX_QUEUE",
    "MIN_MAX_QUEUE",
    "ConfigError",
    "PortRange",
    "LogConfig",
    "MulticastResolver",
    "LbmrdAddress",
    "InitialRequest",
    "UseQuery",
    "InterestPacing",
    "RateLimit",
    "DomainRoute",
    "RemoteInterest",
    "TopicResolution",
    "RelayConfig",
    "LbtrmConfig",
    "EndpointConfig",
    "InitiatorConfig",
    "AcceptorConfig",
    "KeepaliveConfig",
    "TlsConfig",
    "PeerConfig",
    "RouterConfig",
    "load_config",
    "parse_config",
    "validate",
]


_INT_MAX = 2**31 - 1  # timers and buffer sizes, as C ints in UM
_BPS_MAX = 10**12  # <rate-limit bps>: a terabit a second is more than any link
_DOMAIN_ID_MAX = 2**32 - 1  # u32 on the peer link, 0 invalid
_NAME_MAX = 255  # characters in router and portal names
_PEM_MAX = 1 << 20  # bytes read from a TLS file


# --------------------------------------------------------------------------- values

_IFNAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.:@-]{0,14}")  # Linux IFNAMSIZ - 1
_NUMERIC_RE = re.compile(r"[0-9./]+")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_PEM_CERT = b"-----BEGIN CERTIFICATE-----"
_PEM_KEY_RE = re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )?PRIVATE KEY-----")
_PEM_ENCRYPTED = (b"-----BEGIN ENCRYPTED PRIVATE KEY-----", b"Proc-Type: 4,ENCRYPTED")


def _number(text: str, what: str, lo: int, hi: int) -> int:
    """An attribute number; ValueError with a reason (the caller names the attribute)."""
    text = text.strip()
    if not text:
        raise ValueError(f"is empty: expected {what}")
    if not DIGITS_RE.fullmatch(text):
        raise ValueError(f'"{text}" is not a number: expected {what}')
    value = int(text) if len(text) <= 20 else hi + 1  # no giant int() conversions
    if not lo <= value <= hi:
        raise ValueError(f'"{text}" is out of range: expected {what}')
    return value


def _ipv4(text: str, what: str) -> str:
    """A dotted-quad IPv4 address, normalised."""
    text = text.strip()
    if not text:
        raise ValueError(f"is empty: give {what} such as 10.1.1.50")
    if "/" in text:
        raise ValueError(f'"{text}" is a network: give a single address ({what})')
    values = octets(text, "address")
    if len(values) != 4:
        raise ValueError(f'"{text}" is not a full IPv4 address: give all four octets (a.b.c.d)')
    return ".".join(str(v) for v in values)


def _unicast(text: str, what: str) -> str:
    """An IPv4 address that packets can be sent to."""
    addr = _ipv4(text, what)
    ip = ipaddress.IPv4Address(addr)
    if ip.is_unspecified:
        raise ValueError(f'"{addr}" means "any address" and cannot be sent to: give {what}')
    if ip.is_multicast or addr == "255.255.255.255":
        raise ValueError(f'"{addr}" is a multicast or broadcast address: give {what}')
    return addr


def _interface(text: str) -> str:
    """An interface spec: IPv4 address, CIDR network, or device name (resolved at start)."""
    text = text.strip()
    if not text:
        raise ValueError("is empty: give an IPv4 address, a CIDR network such as 10.0.0.0/8, "
                         "or a device name such as eth0")
    if text == "*":
        return "0.0.0.0"
    if _NUMERIC_RE.fullmatch(text):
        if "/" in text:
            net, _ = parse_network(text)
            return str(net)
        return _ipv4(text, "the address of a local interface")
    if _IFNAME_RE.fullmatch(text.strip('"')):
        return text.strip('"')
    raise ValueError(f'"{text}" is not an interface: give an IPv4 address, a CIDR network '
                     "such as 10.0.0.0/8, or a device name such as eth0")


class _Checker:
    """Collects errors and warnings of the semantic pass."""

    def __init__(self, path: str, base_dir: Path, check_files: bool) -> None:
        self.path = path
        self.base_dir = base_dir
        self.check_files = check_files
        self.errors: list[tuple[int, str]] = []
        self.warnings: list[tuple[int, str]] = []

    def error(self, el: etree._Element | int, message: str) -> None:
        self.errors.append((el if isinstance(el, int) else el.sourceline or 0, message))

    def warn(self, el: etree._Element | int, message: str) -> None:
        self.warnings.append((el if isinstance(el, int) else el.sourceline or 0, message))

    # ---- element text

    def text_int(self, el: etree._Element | None, default: int, what: str, lo: int, hi: int) -> int:
        if el is None:
            return default
        try:
            return parse_int(el.tag, element_text(el), what, lo, hi)
        except ValueError as e:
            self.error(el, str(e))
            return default

    def name(self, el: etree._Element, what: str) -> str:
        text = element_text(el)
        if not text:
            self.error(el, f"<name> is empty: give {what}")
        elif _CONTROL_RE.search(text):
            self.error(el, f"<name> {text!r} contains control characters")
        elif len(text) > _NAME_MAX:
            self.error(el, f"<name> is {len(text)} characters long: at most {_NAME_MAX}")
        return text

    def interface(self, el: etree._Element | None) -> str | None:
        if el is None:
            return None
        try:
            return _interface(element_text(el))
        except ValueError as e:
            self.error(el, f"<interface> {e}")
            return None

    # ---- attributes

    def attr_int(self, el: etree._Element | None, attr: str, default: int, what: str,
                 lo: int, hi: int) -> int:
        if el is None or el.get(attr) is None:
            return default
        try:
            return _number(el.get(attr, ""), what, lo, hi)
        except ValueError as e:
            self.error(el, f"<{el.tag}> {attr} {e}")
            return default

    def attr_port(self, el: etree._Element | None, attr: str, default: int, proto: str) -> int:
        return self.attr_int(el, attr, default, f"a {proto} port 1..65535", 1, 65535)

    def attr_ms(self, el: etree._Element | None, attr: str, default: int, lo: int = 1) -> int:
        return self.attr_int(el, attr, default, f"milliseconds {lo}..{_INT_MAX}", lo, _INT_MAX)

    def attr_interface(self, el: etree._Element, attr: str) -> str | None:
        if el.get(attr) is None:
            return None
        try:
            return _interface(el.get(attr, ""))
        except ValueError as e:
            self.error(el, f"<{el.tag}> {attr} {e}")
            return None

    def port_range(self, el: etree._Element, lo_attr: str, hi_attr: str, default: PortRange,
                   proto: str) -> PortRange:
        low = self.attr_port(el, lo_attr, default.low, proto)
        high = self.attr_port(el, hi_attr, default.high, proto)
        if high < low:
            given = " ".join(f'{a}="{el.get(a)}"' if el.get(a) is not None
                             else f"{a}={d} (default)"
                             for a, d in ((lo_attr, default.low), (hi_attr, default.high)))
            self.error(el, f"<{el.tag}> {given}: the range is reversed, {hi_attr} must be at "
                           f"least {lo_attr}")
            return default
        return PortRange(low, high)

    # ---- files

    def file_path(self, el: etree._Element) -> str | None:
        text = element_text(el)
        if not text:
            self.error(el, f"<{el.tag}> is empty: give a file name")
            return None
        p = Path(text).expanduser()
        if not p.is_absolute():
            p = self.base_dir / p
        return os.path.normpath(p)

    def read_pem(self, el: etree._Element, path: str, what: str) -> bytes | None:
        """The start of the PEM file at ``path``, or None after an error."""
        try:
            with open(path, "rb") as f:
                return f.read(_PEM_MAX)
        except FileNotFoundError:
            self.error(el, f'<{el.tag}> file "{path}" does not exist ({what})')
        except IsADirectoryError:
            self.error(el, f'<{el.tag}> "{path}" is a directory, not a file ({what})')
        except PermissionError:
            self.error(el, f'<{el.tag}> file "{path}" cannot be read: permission denied '
                           f"(the router must be able to read {what})")
        except OSError as e:
            self.error(el, f'<{el.tag}> file "{path}" cannot be read: {e.strerror or e}')
        return None


# --------------------------------------------------------------------------- sections


def _route_info(c: _Checker, el: etree._Element | None) -> RouteInfoConfig:
    d = RouteInfoConfig()
    if el is None:
        return d
    interval = c.attr_ms(el, "propagation-interval", d.propagation_interval_ms)
    timeout = c.attr_ms(el, "timeout", d.timeout_ms)
    hops = c.attr_int(el, "max-hop-count", d.max_hop_count, "a hop count 1..255", 1, 255)
    if timeout <= interval:
        c.error(el, f"<route-info> timeout {timeout} ms must be greater than the propagation-interval "
                    f"{interval} ms: every router would time out between two announcements "
                    "(about 4 x the interval is advised)")
    return RouteInfoConfig(interval, timeout, hops, el.sourceline or 0)


def _daemon(c: _Checker, daemon: etree._Element) -> tuple[str, LogConfig, tuple[str, int] | None, int]:
    name = c.name(daemon.find("name"), "this router's name, unique among your routers")
    log = LogConfig()
    log_el = daemon.find("log")
    if log_el is not None:
        kind = log_el.get("type", "console")
        frequency = log_el.get("frequency", "disable")
        size = c.attr_int(log_el, "size", 0, "a size in MB 0..4000 (0 = no limit)", 0, 4000)
        text = element_text(log_el)
        file = None
        if kind == "file":
            if not text:
                c.error(log_el, '<log type="file"> needs the file name as its text, e.g. '
                                '<log type="file">/var/log/lbmr-router.log</log>')
            else:
                file = c.file_path(log_el)
        else:
            if text:
                c.warn(log_el, f'<log type="{kind}"> ignores its text "{text}": write '
                               'type="file" to log to a file')
            if log_el.get("frequency") is not None or log_el.get("size") is not None:
                c.warn(log_el, f'frequency and size roll a log file: they do nothing with type="{kind}"')
        log = LogConfig(kind, file, frequency, size)
    metrics = None
    m_el = daemon.find("metrics")
    if m_el is not None:
        text = element_text(m_el)
        host, colon, port_text = text.rpartition(":")
        try:
            if not colon:
                raise ValueError(f'"{text}" has no port: write ADDR:PORT, e.g. 127.0.0.1:9390')
            addr = "0.0.0.0" if host.strip() == "*" else _ipv4(host, "a local IPv4 address")
            port = _number(port_text, "a TCP port 1..65535", 1, 65535)
        except ValueError as e:
            c.error(m_el, f"<metrics> {e}")
        else:
            metrics = (addr, port)
            if not ipaddress.IPv4Address(addr).is_loopback:
                c.warn(m_el, f"<metrics> listens on {addr}, not on loopback: the endpoint has "
                             "no authentication, restrict access with a firewall")
    stats = c.text_int(daemon.find("stats-interval"), DEFAULT_STATS_INTERVAL_MS,
                       f"milliseconds 0..{_INT_MAX} (0 = no statistics in the log)", 0, _INT_MAX)
    return name, log, metrics, stats


def _rate_limit(c: _Checker, parent: etree._Element, default: RateLimit, what: str) -> RateLimit:
    """The ``<rate-limit>`` child of a timing element (DRO units: bits a second,
    objects a second; an attribute left out keeps the DRO's default for
    ``parent``; 0 = no limit of that kind)."""
    el = parent.find("rate-limit")
    if el is None:
        return default
    limit = RateLimit(
        c.attr_int(el, "bps", default.bps,
                   f"bits a second 0..{_BPS_MAX} (0 = no limit by bits)", 0, _BPS_MAX),
        c.attr_int(el, "objects-per-second", default.objects_per_second,
                   f"{what} a second 0..{_INT_MAX} (0 = no limit by count)", 0, _INT_MAX))
    if limit == RateLimit(0, 0) and parent.tag != "domain-route":
        c.warn(el, f"<rate-limit> of <{parent.tag}> has bps 0 and objects-per-second 0: "
                   f"{what} are not paced at all (a burst of them goes out at once)")
    return limit


def _use_query(c: _Checker, el: etree._Element | None) -> UseQuery:
    d = UseQuery()
    if el is None:
        return d
    return UseQuery(c.attr_ms(el, "timeout", d.timeout_ms),
                    c.attr_int(el, "max", d.max, f"a count 1..{_INT_MAX}", 1, _INT_MAX),
                    c.attr_ms(el, "periodic-interval", d.periodic_interval_ms),
                    _rate_limit(c, el, d.rate_limit, "use queries"))


def _interval_pair(c: _Checker, el: etree._Element, lo_default: int,
                   hi_default: int) -> tuple[int, int] | None:
    lo = c.attr_ms(el, "min-interval", lo_default)
    hi = c.attr_ms(el, "max-interval", hi_default)
    if hi < lo:
        c.error(el, f"<{el.tag}> min-interval {lo} is greater than max-interval {hi}")
        return None
    return lo, hi


def _pacing(c: _Checker, el: etree._Element | None) -> InterestPacing:
    d = InterestPacing()
    if el is None:
        return d
    pair = _interval_pair(c, el, d.min_interval_ms, d.max_interval_ms)
    limit = _rate_limit(c, el, d.rate_limit, "interest refreshes")
    return d if pair is None else InterestPacing(*pair, limit)


def _domain_route(c: _Checker, el: etree._Element | None) -> DomainRoute | None:
    """``<domain-route>``: values checked, then ignored with a warning."""
    if el is None:
        return None
    d = DomainRoute()
    pair = _interval_pair(c, el, d.min_interval_ms, d.max_interval_ms)
    limit = _rate_limit(c, el, d.rate_limit, "domain route messages")
    c.warn(el, "<domain-route> is ignored: lbmr-router sends no domain route messages (the "
               "DRO's records that tell UM contexts which domains a router reaches, for "
               "request/response and unicast immediate messages across domains)")
    lo, hi = pair if pair is not None else (d.min_interval_ms, d.max_interval_ms)
    return DomainRoute(lo, hi, limit, line=el.sourceline or 0)


def _remote(c: _Checker, el: etree._Element | None, max_attr: str) -> RemoteInterest:
    d = RemoteInterest()
    if el is None:
        return d
    return RemoteInterest(c.attr_ms(el, "check-interval", d.check_interval_ms),
                          c.attr_int(el, max_attr, d.max, f"a count 1..{_INT_MAX}", 1, _INT_MAX),
                          c.attr_ms(el, "timeout", d.timeout_ms))


def _topic_resolution(c: _Checker, tr: etree._Element) -> TopicResolution:
    multicast = None
    lbmrds: list[LbmrdAddress] = []
    interface = None
    port_range = None
    mc = tr.find("multicast")
    if mc is not None:
        group = DEFAULT_MULTICAST_GROUP
        if mc.get("group") is not None:
            try:
                group = _ipv4(mc.get("group", ""), "a multicast group such as 224.9.10.11")
                if not ipaddress.IPv4Address(group).is_multicast:
                    raise ValueError(f'"{group}" is not a multicast address '
                                     "(224.0.0.0 to 239.255.255.255)")
            except ValueError as e:
                c.error(mc, f"<multicast> group {e}")
        port = c.attr_port(mc, "port", DEFAULT_MULTICAST_PORT, "UDP")
        interface = c.attr_interface(mc, "interface")
        ttl = c.attr_int(mc, "ttl", DEFAULT_MULTICAST_TTL, "a TTL 0..255 (hops)", 0, 255)
        multicast = MulticastResolver(group, port, line=mc.sourceline or 0, ttl=ttl)
    else:
        interface = c.interface(tr.find("interface"))
        seen: dict[tuple[str, int], int] = {}
        for el in tr.iterchildren("lbmrd"):
            try:
                addr = _unicast(el.get("address", ""), "the IPv4 address of the lbmrd")
            except ValueError as e:
                c.error(el, f"<lbmrd> address {e}")
                continue
            port = c.attr_port(el, "port", DEFAULT_LBMRD_PORT, "UDP")
            line = el.sourceline or 0
            if (addr, port) in seen:
                c.warn(el, f"lbmrd {addr}:{port} is listed twice (also at line {seen[addr, port]})")
                continue
            seen[addr, port] = line
            lbmrds.append(LbmrdAddress(addr, port, line))
        pr = tr.find("port-range")
        port_range = DEFAULT_TR_PORTS if pr is None else c.port_range(
            pr, "low", "high", DEFAULT_TR_PORTS, "UDP")
    ir = tr.find("initial-request")
    initial = InitialRequest()
    if ir is not None:
        initial = InitialRequest(
            c.attr_ms(ir, "periodic-interval", initial.periodic_interval_ms),
            c.attr_int(ir, "duration", initial.duration_s,
                       f"seconds 0..{_INT_MAX} (0 = no burst)", 0, _INT_MAX))
    return TopicResolution(
        multicast=multicast, lbmrds=tuple(lbmrds), interface=interface, port_range=port_range,
        initial_request=initial,
        topic_use_query=_use_query(c, tr.find("topic-use-query")),
        pattern_use_query=_use_query(c, tr.find("pattern-use-query")),
        remote_topic_interest=_pacing(c, tr.find("remote-topic-interest")),
        remote_pattern_interest=_pacing(c, tr.find("remote-pattern-interest")),
        line=tr.sourceline or 0,
        domain_route=_domain_route(c, tr.find("domain-route")),
    )


def _fanout(c: _Checker, el: etree._Element | None) -> tuple[bool, int]:
    """``<relay fanout max-queue>``: (fan-out on, queue bytes per receiver)."""
    queue = c.attr_int(el, "max-queue", DEFAULT_FANOUT_MAX_QUEUE,
                       f"bytes {MIN_FANOUT_QUEUE}..{_INT_MAX} (at least one 65535-byte message)",
                       MIN_FANOUT_QUEUE, _INT_MAX)
    if el is None:
        return True, queue
    word = el.get("fanout", "on").strip().lower()
    if word not in ("on", "off"):
        c.error(el, f'<relay> fanout "{el.get("fanout")}": write "on" (one copy per session per '
                    'link, the default) or "off" (one stream per receiver connection)')
    return word != "off", queue


def _endpoint(c: _Checker, ep: etree._Element) -> EndpointConfig:
    name = c.name(ep.find("name"), "a name for this endpoint portal")
    dom_el = ep.find("domain-id")
    domain_id = 0
    if element_text(dom_el) == "0":
        c.error(dom_el, "<domain-id> 0 is not a valid domain id: give the id of this TRD, "
                        f"1..{_DOMAIN_ID_MAX} (UM treats 0 as invalid in route messages)")
    else:
        domain_id = c.text_int(dom_el, 0, f"the id of this TRD, 1..{_DOMAIN_ID_MAX}",
                               1, _DOMAIN_ID_MAX)
    cost = c.text_int(ep.find("cost"), 1, f"a positive cost 1..{_INT_MAX}", 1, _INT_MAX)
    delay = c.text_int(ep.find("source-deletion-delay"), DEFAULT_SOURCE_DELETION_DELAY_MS,
                       f"milliseconds 0..{_INT_MAX}", 0, _INT_MAX)
    tr = _topic_resolution(c, ep.find("topic-resolution"))
    relay_el = ep.find("relay")
    relay = RelayConfig(tr.interface, DEFAULT_RELAY_PORTS)
    max_proxies = c.attr_int(relay_el, "max-proxies", DEFAULT_MAX_PROXIES,
                             "a number of proxies 1..1000000", 1, 1_000_000)
    if relay_el is not None:
        iface = c.attr_interface(relay_el, "interface")
        ports = c.port_range(relay_el, "port-low", "port-high", DEFAULT_RELAY_PORTS, "TCP")
        relay = RelayConfig(iface if iface is not None else tr.interface, ports,
                            relay_el.sourceline or 0)
        if len(ports) < 2:
            c.warn(relay_el, f"<relay> has a single port ({ports.low}): the portal can relay "
                             "only one transport session into its TRD at a time; give a "
                             "range of at least 2 ports")
    fanout, fanout_queue = _fanout(c, relay_el)
    rm_el = ep.find("lbt-rm")
    lbtrm = LbtrmConfig() if rm_el is None else _lbtrm(c, rm_el)
    return EndpointConfig(
        name=name, domain_id=domain_id, topic_resolution=tr, relay=relay, lbtrm=lbtrm,
        fanout=fanout, fanout_max_queue=fanout_queue,
        source_deletion_delay_ms=delay, cost=cost, max_proxies=max_proxies,
        remote_topic=_remote(c, ep.find("remote-topic"), "max-topics"),
        remote_pattern=_remote(c, ep.find("remote-pattern"), "max-patterns"),
        line=ep.sourceline or 0, acl=_acl(c, ep, name),
    )


def _lbtrm(c: _Checker, el: etree._Element) -> LbtrmConfig:
    """``<lbt-rm group-low group-high destination-port same-group/>``."""
    d = LbtrmConfig()
    groups = []
    for attr, default in (("group-low", d.group_low), ("group-high", d.group_high)):
        text = el.get(attr)
        if text is None:
            groups.append(default)
            continue
        try:
            ip = _ipv4(text, "a multicast group")
            if not ipaddress.IPv4Address(ip).is_multicast:
                raise ValueError(f'"{text}" is not a multicast address (224.0.0.0/4)')
            groups.append(ip)
        except ValueError as e:
            c.error(el, f"<lbt-rm> {attr} {e}")
            groups.append(default)
    low, high = (int(ipaddress.IPv4Address(g)) for g in groups)
    if high < low:
        c.error(el, f"<lbt-rm> group-low {groups[0]} is above group-high {groups[1]}: the range is reversed")
        groups = [d.group_low, d.group_high]
    elif high - low >= 1 << 16:
        c.error(el, f"<lbt-rm> {groups[0]}..{groups[1]} is {high - low + 1} groups: at most 65536")
        groups = [d.group_low, d.group_high]
    port = c.attr_port(el, "destination-port", d.destination_port, "UDP")
    same = el.get("same-group", "no").strip()
    if same not in ("yes", "no"):
        c.error(el, f'<lbt-rm> same-group "{same}": write "yes" or "no"')
    transport = el.get("transport", "lbt-rm").strip().lower()
    transport = {"lbtrm": "lbt-rm", "lbtru": "lbt-ru"}.get(transport, transport)
    if transport not in ("lbt-rm", "lbt-ru"):
        c.error(el, f'<lbt-rm> transport "{el.get("transport")}": write "lbt-rm" (multicast) or "lbt-ru" '
                    "(unicast to each receiver)")
        transport = "lbt-rm"
    if transport == "lbt-ru":
        given = [a for a in ("group-low", "group-high", "destination-port", "same-group") if el.get(a) is not None]
        if given:
            c.warn(el, f'<lbt-rm transport="lbt-ru"> ignores {", ".join(given)}: its proxies are unicast')
    max_clients = c.attr_int(el, "max-clients", d.max_clients, "a number of receivers 1..4096", 1, 4096)
    return LbtrmConfig(groups[0], groups[1], port, same == "yes", el.sourceline or 0, transport, max_clients)


def _acl(c: _Checker, portal: etree._Element, name: str) -> PortalAcl:
    """The portal's ``<acl>`` (:mod:`router.acl_config`), OPEN without one."""
    el = portal.find("acl")
    return OPEN if el is None else parse_acl(el, name, c.error, c.warn)


def _tls(c: _Checker, el: etree._Element) -> TlsConfig | None:
    cert_el, key_el = el.find("certificate"), el.find("certificate-key")
    pw_el, ca_el = el.find("certificate-key-password"), el.find("trusted-certificates")
    ciphers_el = el.find("cipher-suites")
    cert, key = c.file_path(cert_el), c.file_path(key_el)
    ca = c.file_path(ca_el) if ca_el is not None else None
    password = element_text(pw_el) if pw_el is not None else None
    ciphers = element_text(ciphers_el) if ciphers_el is not None else None
    if ciphers is not None:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).set_ciphers(ciphers)
        except ssl.SSLError:
            c.error(ciphers_el, f'<cipher-suites> "{ciphers}" selects no cipher suite known to '
                                "this OpenSSL: give OpenSSL cipher names separated by commas "
                                "or colons")
    if ca_el is None:
        c.warn(el, "<tls> has no <trusted-certificates>: the peer's certificate is checked "
                   "against the system CA store; give your own CA bundle for mutual "
                   "authentication between your routers")
    if c.check_files:
        if cert is not None:
            data = c.read_pem(cert_el, cert, "this router's certificate")
            if data is not None and _PEM_CERT not in data:
                c.error(cert_el, f'<certificate> file "{cert}" holds no PEM certificate '
                                 f'("{_PEM_CERT.decode()}")')
        if key is not None:
            data = c.read_pem(key_el, key, "the private key of the certificate")
            if data is not None:
                if not _PEM_KEY_RE.search(data):
                    c.error(key_el, f'<certificate-key> file "{key}" holds no PEM private key '
                                    '("-----BEGIN PRIVATE KEY-----")')
                elif any(mark in data for mark in _PEM_ENCRYPTED) and not password:
                    c.error(key_el, f'<certificate-key> file "{key}" is encrypted: give its '
                                    "password in <certificate-key-password>")
                elif password and not any(mark in data for mark in _PEM_ENCRYPTED):
                    c.warn(pw_el, f'<certificate-key-password> is not needed: "{key}" is '
                                  "not encrypted")
                try:
                    mode = os.stat(key).st_mode
                except OSError:
                    mode = 0
                if os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
                    c.warn(key_el, f'private key file "{key}" is accessible to other users '
                                   f"(mode {stat.S_IMODE(mode):04o}): chmod 600 it")
        if ca is not None:
            data = c.read_pem(ca_el, ca, "the CA bundle that the peer's certificate must chain to")
            if data is not None and _PEM_CERT not in data:
                c.error(ca_el, f'<trusted-certificates> file "{ca}" holds no PEM certificate '
                               f'("{_PEM_CERT.decode()}")')
    if cert is None or key is None:
        return None
    return TlsConfig(cert, key, password, ca, ciphers, el.sourceline or 0)


def _peer(c: _Checker, peer: etree._Element) -> PeerConfig:
    name = c.name(peer.find("name"), "a name for this peer portal")
    cost = c.text_int(peer.find("cost"), 1, f"a positive cost 1..{_INT_MAX}", 1, _INT_MAX)
    st = peer.find("single-tcp")
    interface = c.interface(st.find("interface"))
    buf_what = f"bytes 0..{_INT_MAX} (0 = the OS default)"
    rcv = c.text_int(st.find("receive-buffer"), 0, buf_what, 0, _INT_MAX)
    snd = c.text_int(st.find("send-buffer"), 0, buf_what, 0, _INT_MAX)
    tls_el = st.find("tls")
    tls = _tls(c, tls_el) if tls_el is not None else None
    initiator = acceptor = None
    ini = st.find("initiator")
    acc = st.find("acceptor")
    if ini is not None:
        addr_el = ini.find("address")
        try:
            address = _unicast(element_text(addr_el), "the IPv4 address of the peer router (behind a "
                                               "NAT: the address the NAT forwards)")
        except ValueError as e:
            c.error(addr_el, f"<address> {e}")
            address = "0.0.0.0"
        port = c.text_int(ini.find("port"), 0, "a TCP port 1..65535", 1, 65535)
        reconnect = c.attr_ms(ini, "reconnect-interval", DEFAULT_RECONNECT_INTERVAL_MS)
        initiator = InitiatorConfig(address, port, reconnect, ini.sourceline or 0)
    elif acc is not None:
        port = c.text_int(acc.find("listen-port"), 0, "a TCP port 1..65535", 1, 65535)
        acceptor = AcceptorConfig(port, acc.sourceline or 0)
    max_queue = c.text_int(peer.find("max-queue"), DEFAULT_MAX_QUEUE,
                           f"bytes {MIN_MAX_QUEUE}..{_INT_MAX} (the largest datagram must fit)",
                           MIN_MAX_QUEUE, _INT_MAX)
    keepalive = KeepaliveConfig()
    ka = peer.find("gateway-keepalive")
    if ka is not None:
        interval = c.attr_ms(ka, "interval", DEFAULT_KEEPALIVE_INTERVAL_MS, lo=0)
        timeout = c.attr_ms(ka, "timeout", DEFAULT_KEEPALIVE_TIMEOUT_MS, lo=0)
        keepalive = KeepaliveConfig(ka.get("idle", "yes") == "yes", interval, timeout,
                                    ka.sourceline or 0)
        if interval and timeout and timeout <= interval:
            c.error(ka, f"<gateway-keepalive> timeout {timeout} ms must be greater than the "
                        f"interval {interval} ms: the link would be declared dead before a "
                        "keepalive can be answered (about 3 x the interval is advised)")
        elif interval and timeout and timeout < 3 * interval:
            c.warn(ka, f"<gateway-keepalive> timeout {timeout} ms is less than 3 x the interval "
                       f"{interval} ms: one late keepalive may close the link")
        elif not timeout:
            c.warn(ka, "<gateway-keepalive> timeout 0: a dead peer is only noticed when TCP "
                       "reports an error, which may take very long")
        if not interval and timeout:
            c.warn(ka, "<gateway-keepalive> interval 0: this router sends no keepalives, so "
                       "the peer's keepalive timeout may close an idle link")
    return PeerConfig(
        name=name, initiator=initiator, acceptor=acceptor, interface=interface,
        receive_buffer=rcv, send_buffer=snd,
        tcp_keepalive=st.find("keepalive") is not None, nodelay=st.find("nodelay") is not None,
        tls=tls, keepalive=keepalive, max_queue=max_queue, line=peer.sourceline or 0, cost=cost,
        acl=_acl(c, peer, name),
    )


def _cross_checks(c: _Checker, endpoints: list[EndpointConfig], peers: list[PeerConfig]) -> None:
    names: dict[str, int] = {}
    for portal in [*endpoints, *peers]:
        if not portal.name:
            continue
        if portal.name in names:
            c.error(portal.line, f'portal name "{portal.name}" is used twice (also at line '
                                 f"{names[portal.name]}): every portal needs its own name")
        else:
            names[portal.name] = portal.line
    same_trd = _same_trd_checks(c, endpoints)
    ids: dict[int, EndpointConfig] = {}
    for ep in endpoints:
        if not ep.domain_id:
            continue
        first = ids.get(ep.domain_id)
        if first is not None and ep.name not in same_trd:
            c.error(ep.line, f'domain-id {ep.domain_id} of endpoint "{ep.name}" is already used '
                             f'by endpoint "{first.name}" (line {first.line}): a router attaches '
                             "to a TRD once, and every TRD has its own domain id")
        elif first is None:
            ids[ep.domain_id] = ep
    targets: dict[tuple[str, int], PeerConfig] = {}
    for peer in peers:
        if peer.initiator is None or not peer.initiator.port:
            continue
        key = (peer.initiator.address, peer.initiator.port)
        first = targets.get(key)
        if first is not None:
            c.error(peer.initiator.line, f'peer "{peer.name}" connects to {key[0]}:{key[1]} like peer '
                                         f'"{first.name}" (line {first.initiator.line}): two peer links '
                                         "to the same router; one link per pair of routers")
        else:
            targets[key] = peer
    ports: dict[int, list[PeerConfig]] = {}
    for peer in peers:
        if peer.acceptor is None or not peer.acceptor.listen_port:
            continue
        port = peer.acceptor.listen_port
        # one port on two interfaces is fine; on the same one (or on any address) it is not
        clash = [o for o in ports.get(port, ()) if not o.interface or not peer.interface
                 or o.interface == peer.interface]
        if clash:
            c.error(peer.acceptor.line, f'listen-port {port} of peer "{peer.name}" is already '
                                        f'used by peer "{clash[0].name}" (line '
                                        f"{clash[0].line}) on the same interface")
        ports.setdefault(port, []).append(peer)
        for ep in endpoints:
            if port in ep.relay.ports:
                c.warn(peer.acceptor.line, f"listen-port {port} is inside the relay range "
                                           f'{ep.relay.ports} of endpoint "{ep.name}": one relay '
                                           "port fewer is available")


def _trd_key(ep: EndpointConfig) -> tuple:
    """What identifies an endpoint's TRD: its multicast group, port and interface,
    or its set of lbmrds."""
    tr = ep.topic_resolution
    if tr.multicast is not None:
        return ("multicast", tr.multicast.group, tr.multicast.port, tr.interface or "")
    return ("lbmrd", frozenset((d.address, d.port) for d in tr.lbmrds))


def _same_trd_checks(c: _Checker, endpoints: list[EndpointConfig]) -> set[str]:
    """Two endpoints on one TRD (the same multicast group:port on the same
    interface, or lbmrd lists that share a daemon): an error on the second.
    Returns the names of the endpoints so reported."""
    flagged: set[str] = set()
    for i, ep in enumerate(endpoints):
        k = _trd_key(ep)
        for first in endpoints[:i]:
            f = _trd_key(first)
            if k[0] != f[0]:
                continue
            if k[0] == "multicast":
                if k != f:
                    continue
                what = f"multicast {k[1]}:{k[2]}" + (f" on {k[3]}" if k[3] else "")
            else:
                shared = sorted(k[1] & f[1])
                if not shared:
                    continue
                what = "lbmrd " + ", ".join(f"{a}:{p}" for a, p in shared)
            if ep.domain_id != first.domain_id:
                why = (f"one TRD cannot have two domain ids ({first.domain_id} and {ep.domain_id}); "
                       "a router attaches to a TRD once")
            else:
                why = "a router attaches to a TRD once (one endpoint portal per TRD)"
            c.error(ep.line, f'endpoint "{ep.name}" uses the TRD of endpoint "{first.name}" '
                             f"(line {first.line}): both use {what}: {why}")
            flagged.add(ep.name)
            break
    return flagged


def _supported(c: _Checker, root: etree._Element, endpoints: list[EndpointConfig],
               peers: list[PeerConfig]) -> None:
    """What this version runs: at least one endpoint, and a peer or a second
    endpoint; each link of an lbmrd endpoint needs a port of its TR port range."""
    portals = root.find("portals")
    if not endpoints:
        c.error(portals, "<portals> has no <endpoint>: a router needs at least one endpoint portal")
        return
    if len(endpoints) == 1 and not peers:
        c.error(portals, "<portals> has no <peer>: a router with one <endpoint> needs a <peer> "
                         "(or a second <endpoint>: a router joining two TRDs directly)")
    links = len(peers) + len(endpoints) - 1  # each endpoint: every peer, every other endpoint
    for ep in endpoints:
        pr = ep.topic_resolution.port_range
        if ep.topic_resolution.multicast is None and pr is not None and pr.low and len(pr) < links:
            c.error(ep.topic_resolution.line,
                    f'endpoint "{ep.name}" has {links} links (each with its own TR socket) but its '
                    f"<port-range> {pr} has {len(pr)} port(s): widen it to at least {links}")


# --------------------------------------------------------------------------- parsing


def load_config(path: str | os.PathLike[str], *, check_files: bool = True) -> RouterConfig:
    """Read and check the configuration file at ``path``; ``ConfigError`` if invalid.

    Relative file names in it are relative to the file's directory.
    ``check_files=False`` skips opening the TLS files (e.g. to check a file
    meant for another host).
    """
    p = os.fspath(path)
    data = read_config_file(p)
    return parse_config(data, p, base_dir=Path(p).resolve().parent, check_files=check_files)


def validate(path: str | os.PathLike[str], *, check_files: bool = True) -> RouterConfig:
    """``lbmr-router -v``: the checked config (see its ``warnings``), else ``ConfigError``."""
    return load_config(path, check_files=check_files)


def parse_config(text: bytes | str, path: str | os.PathLike[str] = "<string>", *,
                 base_dir: str | os.PathLike[str] | None = None,
                 check_files: bool = True) -> RouterConfig:
    """Check configuration text; ``path`` is used in messages and ``RouterConfig.path``.

    Relative file names are resolved against ``base_dir`` (default: the
    directory of ``path``, or the current directory when ``path`` is a
    pseudo-name such as ``"<string>"``).
    """
    path = os.fspath(path)
    if base_dir is None:
        base_dir = Path.cwd() if path.startswith("<") else Path(path).resolve().parent
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    root = parse_xml(data, path, "lbmr-router")

    _check_root(path, root)
    errors = dtd_errors(root.getroottree())
    if errors:
        raise_errors(path, errors)

    c = _Checker(path, Path(base_dir), check_files)
    name, log, metrics, stats = _daemon(c, root.find("daemon"))
    route_info = _route_info(c, root.find("daemon").find("route-info"))
    portals = root.find("portals")
    endpoints = [_endpoint(c, ep) for ep in portals.iterchildren("endpoint")]
    peers = [_peer(c, peer) for peer in portals.iterchildren("peer")]
    _cross_checks(c, endpoints, peers)
    if c.errors:
        raise_errors(path, c.errors)
    _supported(c, root, endpoints, peers)
    if c.errors:
        raise_errors(path, c.errors)
    return RouterConfig(
        path=path, name=name, endpoints=tuple(endpoints), peers=tuple(peers), log=log,
        metrics=metrics, stats_interval_ms=stats,
        warnings=tuple(sorted(c.warnings, key=lambda w: w[0])), route_info=route_info,
    )


def _check_root(path: str, root: etree._Element) -> None:
    line = root.sourceline or 0
    if etree.QName(root).namespace is not None:
        raise ConfigError(path, line, f"the root element <{etree.QName(root).localname}> is in "
                                      f'the XML namespace "{etree.QName(root).namespace}": '
                                      "lbmr-router files use no namespaces")
    if root.tag != "lbmr-router":
        if root.tag == "tnw-gateway":
            hint = ("this looks like a DRO (tnwgd) file: rename the root to "
                    '<lbmr-router version="1.0"> and describe each endpoint\'s TRD with '
                    "<topic-resolution> (see lbmr-router -d)")
        elif root.tag == "lbmrd":
            hint = "this is an lbmrd configuration file, not a router configuration"
        else:
            hint = 'an lbmr-router configuration file starts with <lbmr-router version="1.0">'
        raise ConfigError(path, line, f"the root element is <{root.tag}>: {hint}")
    version = root.get("version")
    if version is None:
        raise ConfigError(path, line, 'missing version attribute: write <lbmr-router version="1.0">')
    if version != "1.0":
        raise ConfigError(path, line, f'unsupported version "{version}": the only lbmr-router '
                                      'configuration version is "1.0"')
    refuse_entities_and_xinclude(path, root, "lbmr-router")
