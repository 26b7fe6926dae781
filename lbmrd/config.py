"""Configuration layer of lbmrd: parse and check the XML configuration file.

Sans-IO: this module reads a file (``load_config``) or bytes (``parse_config``)
and returns an immutable :class:`Config`; it opens no sockets.

Pipeline, every failure raising :class:`ConfigError` (``path:line: message``):

1. XML parse with lxml (no entity expansion, no network, no XInclude, no DTD
   from the document itself).
2. Root checks: the root is ``<lbmrd>`` and carries ``version="1.0"``.
3. Validation against our own DTD (:data:`DTD_TEXT`, the grammar of UM's
   lbmrd); libxml2 messages are rewritten into lbmrd terms.
4. A semantic pass for what a DTD cannot say: numbers and their ranges, IPv4
   hosts and networks, rule ports, domain references.

Relaxed mode (the default): a file whose only grammar problem is a missing or
empty ``<domains>`` and/or ``<transformations>`` is accepted, with a warning,
as a file without NAT.  Strict mode (``validate(path, strict=True)``) keeps
UM's grammar, which requires both.

``<ttl>`` units: UM's command line gives the client time-to-live in seconds
(default 60), UM's XML reference in milliseconds.  We read ``<ttl>`` as
seconds, like the command line, except that a value of 1000 or more is taken
as milliseconds and reported in :attr:`Config.warnings`.
"""

from __future__ import annotations

import copy
import io
import ipaddress
import os
import re
import stat
import threading
from dataclasses import dataclass, field
from importlib import resources

from lxml import etree

__all__ = [
    "DTD_TEXT",
    "DEFAULT_INTERFACE",
    "DEFAULT_PORT",
    "DEFAULT_ACTIVITY_MS",
    "DEFAULT_TTL_S",
    "DEFAULT_SOCKET_BUFFER",
    "DEFAULTS",
    "ConfigError",
    "DaemonSettings",
    "Domain",
    "NatRule",
    "Transform",
    "Config",
    "load_config",
    "parse_config",
    "validate",
    "read_config_file",
    "check_declarations",
    "MAX_CONFIG_BYTES",
]

#: The DTD printed by ``lbmrd -d`` (package data ``lbmrd/lbmrd.dtd``).
DTD_TEXT: str = resources.files(__package__ or "lbmrd").joinpath("lbmrd.dtd").read_text(encoding="utf-8")
_DTD = etree.DTD(io.StringIO(DTD_TEXT))
_DTD_LOCK = threading.Lock()  # DTD.error_log belongs to the DTD object, not to one call

DEFAULT_INTERFACE = "0.0.0.0"
DEFAULT_PORT = 15380
DEFAULT_ACTIVITY_MS = 60000
DEFAULT_TTL_S = 60.0
DEFAULT_SOCKET_BUFFER = 1048576

_INT_MAX = 2**31 - 1  # socket options and timers are C ints in UM
#: Largest configuration file read, bytes (a file with 50,000 networks is about 2 MB).
MAX_CONFIG_BYTES = 16 * 1024 * 1024
#: DTD validation errors reported per file; the rest are counted.
MAX_ERRORS = 100
_XINCLUDE_NS = "http://www.w3.org/2001/XInclude"
_PLACEHOLDER = "_lbmrd_relaxed_placeholder_"


# --------------------------------------------------------------------------- errors


class ConfigError(ValueError):
    """An invalid configuration file.

    ``str(err)`` is ``"{path}:{line}: {message}"`` for the first error (by line);
    ``err.errors`` lists every ``(line, message)`` found in the same stage.  Line 0
    means "no particular line" (e.g. the file cannot be read).
    """

    def __init__(self, path: str, line: int, message: str,
                 errors: list[tuple[int, str]] | None = None) -> None:
        super().__init__(path, line, message)
        self.path = str(path)
        self.line = int(line or 0)
        self.message = message
        self.errors: list[tuple[int, str]] = list(errors) if errors else [(self.line, message)]

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"

    def format_all(self) -> str:
        """Every error, one ``path:line: message`` line each."""
        return "\n".join(f"{self.path}:{ln}: {msg}" for ln, msg in self.errors)


def _raise(path: str, errors: list[tuple[int, str]]) -> None:
    errors = sorted(errors, key=lambda e: e[0])
    line, msg = errors[0]
    raise ConfigError(path, line, msg, errors)


# --------------------------------------------------------------------------- model


@dataclass(frozen=True, slots=True)
class DaemonSettings:
    """``<daemon>`` settings; ``None`` = not set in the file.

    Units: ``activity_ms`` milliseconds, ``ttl_s`` seconds, buffers bytes.
    """

    interface: str | None = None
    port: int | None = None
    activity_ms: int | None = None
    ttl_s: float | None = None
    log: str | None = None
    rcv_buf: int | None = None
    snd_buf: int | None = None

    def overlay(self, other: DaemonSettings) -> DaemonSettings:
        """These settings with every value that ``other`` sets replacing ours.

        ``DEFAULTS.overlay(config.daemon).overlay(cli)`` gives the effective
        settings with the command line winning over the file.
        """
        return DaemonSettings(*(
            theirs if theirs is not None else ours
            for ours, theirs in zip(_astuple(self), _astuple(other), strict=True)
        ))


def _astuple(s: DaemonSettings) -> tuple:
    return (s.interface, s.port, s.activity_ms, s.ttl_s, s.log, s.rcv_buf, s.snd_buf)


#: UM's documented defaults (``log=None`` = console).
DEFAULTS = DaemonSettings(
    interface=DEFAULT_INTERFACE,
    port=DEFAULT_PORT,
    activity_ms=DEFAULT_ACTIVITY_MS,
    ttl_s=DEFAULT_TTL_S,
    log=None,
    rcv_buf=DEFAULT_SOCKET_BUFFER,
    snd_buf=DEFAULT_SOCKET_BUFFER,
)


@dataclass(frozen=True, slots=True)
class Domain:
    """A named set of IPv4 networks (``<domain name=..>``)."""

    name: str
    networks: tuple[ipaddress.IPv4Network, ...]
    line: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class NatRule:
    """One ``<rule>``: rewrite ``match_ip:match_port`` to ``replace_ip:replace_port``.

    Addresses are 4 raw bytes (network order, as in a TIR).  ``match_port=None``
    is ``*`` (any port); ``replace_port=None`` is ``*`` (keep the port).
    """

    match_ip: bytes
    match_port: int | None
    replace_ip: bytes
    replace_port: int | None
    line: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        for ip in (self.match_ip, self.replace_ip):
            if type(ip) is not bytes or len(ip) != 4:
                raise ValueError(f"NatRule addresses must be 4 bytes, got {ip!r}")
        for port in (self.match_port, self.replace_port):
            if port is not None and not 0 <= port <= 65535:
                raise ValueError(f"NatRule port out of range: {port}")

    def apply(self, ip: bytes, port: int) -> tuple[bytes, int] | None:
        """The rewritten ``(ip, port)``, or ``None`` when this rule does not match."""
        if ip != self.match_ip:
            return None
        mp = self.match_port
        if mp is not None and port != mp:
            return None
        rp = self.replace_port
        return self.replace_ip, (port if rp is None else rp)

    @classmethod
    def parse(cls, match_address: str, match_port: str = "*", replace_address: str = "0.0.0.0",
              replace_port: str = "*", line: int = 0) -> NatRule:
        """Build a rule from attribute text; ``ValueError`` with a readable reason."""
        return cls(_parse_host(match_address), _parse_rule_port(match_port),
                   _parse_host(replace_address), _parse_rule_port(replace_port), line)

    @property
    def match_address(self) -> str:
        return _dotted(self.match_ip)

    @property
    def replace_address(self) -> str:
        return _dotted(self.replace_ip)

    def __str__(self) -> str:
        def port(p: int | None) -> str:
            return "*" if p is None else str(p)

        return (f"{self.match_address}:{port(self.match_port)} -> "
                f"{self.replace_address}:{port(self.replace_port)}")


@dataclass(frozen=True, slots=True)
class Transform:
    """One ``<transform>``: rules for TIRs from ``source`` delivered into ``destination``."""

    source: str
    destination: str
    rules: tuple[NatRule, ...]
    line: int = field(default=0, compare=False)


_MISS = object()
_CACHE_MAX = 65536


@dataclass(frozen=True)
class Config:
    """A checked configuration file.

    ``warnings`` holds ``(line, message)`` pairs for things accepted but
    suspicious.  ``strict_valid`` is False when the file was accepted only in
    relaxed mode.
    """

    path: str
    daemon: DaemonSettings
    domains: tuple[Domain, ...] = ()
    transforms: tuple[Transform, ...] = ()
    warnings: list[tuple[int, str]] = field(default_factory=list, compare=False)
    strict_valid: bool = True
    _nets: tuple[tuple[int, dict[int, tuple[int, str]]], ...] = field(init=False, repr=False, compare=False)
    _rules: dict[tuple[str, str], tuple[NatRule, ...]] = field(init=False, repr=False, compare=False)
    _cache: dict[bytes, str | None] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # per prefix length in use: network -> (document position, domain name);
        # a lookup is one dict probe per length, whatever the number of networks
        by_len: dict[int, dict[int, tuple[int, str]]] = {}
        pos = 0
        for d in self.domains:
            for n in d.networks:
                table = by_len.setdefault(n.prefixlen, {})
                table.setdefault(int(n.network_address), (pos, d.name))
                pos += 1
        nets = tuple(((0xFFFFFFFF << (32 - plen)) & 0xFFFFFFFF, table)
                     for plen, table in sorted(by_len.items(), reverse=True))
        rules: dict[tuple[str, str], list[NatRule]] = {}
        for t in self.transforms:
            rules.setdefault((t.source, t.destination), []).extend(t.rules)
        object.__setattr__(self, "_nets", nets)
        object.__setattr__(self, "_rules", {k: tuple(v) for k, v in rules.items()})
        object.__setattr__(self, "_cache", {})

    @classmethod
    def empty(cls, path: str = "<defaults>") -> Config:
        """No file: nothing set, no domains, no NAT."""
        return cls(path, DaemonSettings())

    def domain_of(self, ip: bytes | str) -> str | None:
        """Name of the first domain (document order) containing ``ip``, else None.

        ``ip`` is 4 raw bytes or a dotted-quad string; anything else raises
        ``ValueError``.
        """
        if isinstance(ip, str):
            return self._lookup(int(ipaddress.IPv4Address(ip)))
        key = ip if type(ip) is bytes else bytes(ip)
        hit = self._cache.get(key, _MISS)
        if hit is not _MISS:
            return hit  # type: ignore[return-value]
        if len(key) != 4:
            raise ValueError(f"an IPv4 address is 4 bytes, got {len(key)}")
        name = self._lookup(int.from_bytes(key, "big"))
        cache = self._cache
        if len(cache) >= _CACHE_MAX:
            cache.clear()
        cache[key] = name
        return name

    def _lookup(self, n: int) -> str | None:
        best = None
        for mask, table in self._nets:
            hit = table.get(n & mask)
            if hit is not None and (best is None or hit[0] < best[0]):
                best = hit
        return None if best is None else best[1]

    def rules_for(self, src_domain: str | None, dst_domain: str | None) -> tuple[NatRule, ...]:
        """All rules of every transform ``src_domain -> dst_domain``, in document order."""
        return self._rules.get((src_domain, dst_domain), ())  # type: ignore[arg-type]

    def rewrite(self, src_domain: str | None, dst_domain: str | None,
                ip: bytes, port: int) -> tuple[bytes, int] | None:
        """Apply the first matching rule for the pair; None when no rule matches."""
        for rule in self._rules.get((src_domain, dst_domain), ()):  # type: ignore[arg-type]
            out = rule.apply(ip, port)
            if out is not None:
                return out
        return None


# --------------------------------------------------------------------------- value parsers

_OCTET_RE = re.compile(r"0|[1-9][0-9]{0,2}")
_DIGITS_RE = re.compile(r"[0-9]+")


def _dotted(ip: bytes) -> str:
    return ".".join(str(b) for b in ip)


def _octets(text: str, what: str) -> list[int]:
    """Decimal octets of a dotted address; ValueError with a reason."""
    if ":" in text:
        raise ValueError(f'"{text}" is not an IPv4 {what}: IPv6 is not supported '
                         "(UM topic resolution is IPv4 only)")
    parts = text.split(".")
    if any(c.isalpha() for c in text):
        raise ValueError(f'"{text}" is not an IPv4 {what}: DNS names are not allowed, '
                         "give the address in dotted decimal")
    if not 1 <= len(parts) <= 4 or not all(_OCTET_RE.fullmatch(p) for p in parts):
        if any(len(p) > 1 and p.startswith("0") and p.isdigit() for p in parts):
            raise ValueError(f'"{text}" is not an IPv4 {what}: octets with leading zeros '
                             "are ambiguous (octal in some parsers)")
        raise ValueError(f'"{text}" is not an IPv4 {what} in dotted decimal')
    values = [int(p) for p in parts]
    if any(v > 255 for v in values):
        raise ValueError(f'"{text}" is not an IPv4 {what}: an octet is greater than 255')
    return values


def _parse_host(text: str) -> bytes:
    """A dotted-quad IPv4 host address as 4 bytes."""
    text = text.strip()
    if not text:
        raise ValueError("is empty: give an IPv4 host address such as 10.1.1.50")
    if "/" in text:
        raise ValueError(f'"{text}" is a network: a rule matches and replaces a single '
                         "host, give a dotted-quad address such as 10.1.1.50")
    values = _octets(text, "host address")
    if len(values) != 4:
        raise ValueError(f'"{text}" is not a full IPv4 address: give all four octets '
                         "(a.b.c.d)")
    return bytes(values)


def _parse_rule_port(text: str) -> int | None:
    text = text.strip()
    if text == "*":
        return None
    if not _DIGITS_RE.fullmatch(text) or len(text) > 5 or int(text) > 65535:
        raise ValueError(f'"{text}" is not a port: give a number 0..65535 or "*"')
    return int(text)


_QUAD_RE = re.compile(r"(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})\."
                      r"(0|[1-9][0-9]{0,2})(?:/([0-9]|[12][0-9]|3[0-2]))?")


def _parse_network(text: str) -> tuple[ipaddress.IPv4Network, bool]:
    """An IPv4 host or CIDR network; short forms (``192.168.1/24``) are padded.

    Returns the network and whether host bits had to be cleared.
    """
    text = text.strip()
    m = _QUAD_RE.fullmatch(text)
    if m:  # the common a.b.c.d[/n]: no error to explain
        a, b, c, d, plen = m.groups()
        if int(a) <= 255 and int(b) <= 255 and int(c) <= 255 and int(d) <= 255:
            value = (int(a) << 24) | (int(b) << 16) | (int(c) << 8) | int(d)
            prefix = 32 if plen is None else int(plen)
            net = ipaddress.IPv4Network((value, prefix), strict=False)
            return net, int(net.network_address) != value
    if not text:
        raise ValueError("is empty: give an IPv4 host or network such as 10.1.0.0/16")
    addr, slash, prefix_text = text.partition("/")
    values = _octets(addr, "host or network")
    if slash:
        if not _DIGITS_RE.fullmatch(prefix_text) or len(prefix_text) > 2 or int(prefix_text) > 32:
            raise ValueError(f'"{text}": the prefix length after "/" must be a number 0..32')
        prefix = int(prefix_text)
    else:
        if len(values) != 4:
            raise ValueError(f'"{text}" is not a full IPv4 address: give all four octets, '
                             f"or a prefix length for a short form (e.g. {addr}/{8 * len(values)})")
        prefix = 32
    values += [0] * (4 - len(values))
    net = ipaddress.IPv4Network((bytes(values), prefix), strict=False)
    return net, int(net.network_address) != int.from_bytes(bytes(values), "big")


def _parse_int(tag: str, text: str, what: str, lo: int, hi: int) -> int:
    if not text:
        raise ValueError(f"<{tag}> is empty: expected {what}")
    if not _DIGITS_RE.fullmatch(text):
        raise ValueError(f'<{tag}> "{text}" is not a number: expected {what}')
    value = int(text) if len(text) <= 20 else hi + 1  # no giant int() conversions
    if not lo <= value <= hi:
        raise ValueError(f"<{tag}> {text} is out of range: expected {what}")
    return value


# --------------------------------------------------------------------------- DTD messages

_KNOWN = frozenset({
    "lbmrd", "daemon", "activity", "interface", "port", "ttl", "log",
    "resolver_unicast_receiver_socket_buffer", "resolver_unicast_send_socket_buffer",
    "domains", "domain", "network", "transformations", "transform", "rule", "match", "replace",
})
_DAEMON_CHILDREN = ("activity", "interface", "port", "ttl", "log",
                    "resolver_unicast_receiver_socket_buffer",
                    "resolver_unicast_send_socket_buffer")
_CONTENT = {
    "lbmrd": "an optional <daemon>, then <domains>, then <transformations>, in this order",
    "daemon": "only " + ", ".join(f"<{n}>" for n in _DAEMON_CHILDREN),
    "domains": "one or more <domain> elements",
    "domain": "one or more <network> elements",
    "transformations": "one or more <transform> elements",
    "transform": "one or more <rule> elements",
    "rule": "exactly one <match> followed by exactly one <replace>",
}
_ATTRS = {
    "lbmrd": "version",
    "domain": "name",
    "transform": "source, destination",
    "match": "address, port",
    "replace": "address, port",
}
_ATTR_HINT = {
    ("lbmrd", "version"): ' (write <lbmrd version="1.0">)',
    ("domain", "name"): " (a unique name for the domain)",
    ("transform", "source"): " (the name of a <domain>)",
    ("transform", "destination"): " (the name of a <domain>)",
    ("match", "address"): ' (a host address, e.g. address="10.1.1.50")',
    ("replace", "address"): ' (a host address, e.g. address="192.168.1.1")',
}

_RE_CONTENT = re.compile(r"Element (\S+) content does not follow the DTD, expecting .*, got ?(.*)$")
_RE_PCDATA = re.compile(r"Element (\S+) was declared #PCDATA but contains non text nodes")
_RE_EMPTY = re.compile(r"Element (\S+) was declared EMPTY this one has content")
_RE_NO_ELEM = re.compile(r"No declaration for element (\S+)")
_RE_NO_ATTR = re.compile(r"No declaration for attribute (\S+) of element (\S+)")
_RE_MISSING_ATTR = re.compile(r"Element (\S+) does not carry attribute (\S+)")
_RE_SYNTAX = re.compile(r"Syntax of value for attribute (\S+) of (\S+) is not valid")
_RE_ID_DUP = re.compile(r"ID (\S+) already defined")
_RE_IDREF = re.compile(r'IDREF attribute (\S+) references an unknown ID "(.*)"')
_RE_ENUM = re.compile(r'Value "(.*)" for attribute (\S+) of (\S+) is not among the enumerated set')


def _local(el: etree._Element) -> str:
    return etree.QName(el).localname


class TreeIndex:
    """Look-ups a message translator makes many times, built once per tree:
    the elements starting on each line and the domains (name -> first line).
    Keeps the cost of N validation errors linear in the file's size."""

    def __init__(self, tree: etree._ElementTree) -> None:
        self.tree = tree
        self.by_line: dict[int, list[etree._Element]] = {}
        self.domains: dict[str, int] = {}
        for el in tree.iter(etree.Element):
            self.by_line.setdefault(el.sourceline, []).append(el)
            if el.tag == "domain":
                name = el.get("name")
                if name and name != _PLACEHOLDER:
                    self.domains.setdefault(name, el.sourceline or 0)


_SHAPES: dict[int, tuple[etree.DTD, DtdShape]] = {}  # per DTD object (two exist)
_INDEX = threading.local()  # the last tree indexed by this thread (reloads run in a worker)


def tree_index(tree: etree._ElementTree) -> TreeIndex:
    """The :class:`TreeIndex` of ``tree`` (one cached per thread)."""
    idx = getattr(_INDEX, "value", None)
    if idx is None or idx.tree is not tree:
        idx = _INDEX.value = TreeIndex(tree)
    return idx


def _at(tree: etree._ElementTree, name: str, line: int) -> list[etree._Element]:
    """Elements named ``name`` (local name or prefix:name) starting on ``line``."""
    return [el for el in tree_index(tree).by_line.get(line, ())
            if _local(el) == name or el.prefix and f"{el.prefix}:{_local(el)}" == name]


def _unknown_child(el: etree._Element) -> bool:
    return any(
        isinstance(c.tag, str) and (c.tag not in _KNOWN) for c in el
    )


def _domain_names(tree: etree._ElementTree, most: int = 20) -> str:
    names = list(tree_index(tree).domains)
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more or "none"


def _got(text: str) -> str:
    items = text.strip().strip("()").split()
    if not items:
        return "nothing"
    return ", ".join("text" if i in ("CDATA", "#PCDATA") else f"<{i}>" for i in items)


def _translate(msg: str, line: int, tree: etree._ElementTree) -> str | None:
    """lbmrd wording for one libxml2 DTD message; None = covered by another message."""
    msg = msg.strip()
    if m := _RE_CONTENT.match(msg):
        name = m.group(1)
        if any(_unknown_child(e) for e in _at(tree, name, line)):
            return None
        want = _CONTENT.get(name, "other content")
        return f"<{name}> must contain {want}; found {_got(m.group(2))}"
    if m := _RE_PCDATA.match(msg):
        name = m.group(1)
        if any(_unknown_child(e) for e in _at(tree, name, line)):
            return None
        return f"<{name}> must contain only text, not elements"
    if m := _RE_EMPTY.match(msg):
        name = m.group(1)
        if any(_unknown_child(e) for e in _at(tree, name, line)):
            return None
        return f'<{name}> must be empty: write <{name} address="..." port="..."/>'
    if m := _RE_NO_ELEM.match(msg):
        name = m.group(1)
        els = _at(tree, name, line)
        parent = els[0].getparent() if els else None
        shown = f"{els[0].prefix}:{name}" if els and els[0].prefix else name
        text = f"unknown element <{shown}>"
        if parent is not None:
            p = _local(parent)
            if p in _CONTENT:
                text += f" in <{p}>, which may contain {_CONTENT[p]}"
            elif p in ("match", "replace"):
                text += f" in <{p}>, which must be empty"
            elif p in _KNOWN:
                text += f" in <{p}>, which takes only text"
            else:
                text += f" in <{p}>"
        return text
    if m := _RE_NO_ATTR.match(msg):
        attr, name = m.group(1), m.group(2)
        if attr == "xmlns" or attr.startswith("xmlns:"):
            return f"XML namespace declaration {attr} on <{name}>: lbmrd files use no namespaces"
        allowed = _ATTRS.get(name)
        where = f"allowed: {allowed}" if allowed else "it takes no attributes"
        return f'unknown attribute "{attr}" on <{name}> ({where})'
    if m := _RE_MISSING_ATTR.match(msg):
        name, attr = m.group(1), m.group(2)
        return f'<{name}> needs the "{attr}" attribute{_ATTR_HINT.get((name, attr), "")}'
    if m := _RE_SYNTAX.match(msg):
        attr, name = m.group(1), m.group(2)
        values = [e.get(attr, "") for e in _at(tree, name, line)]
        value = values[0] if values else ""
        if name == "domain":
            return (f'domain name "{value}" is not valid: it must start with a letter or "_" '
                    'and contain only letters, digits, ".", "-" and "_" (an XML ID)')
        if name == "transform":
            return (f'<transform> {attr}="{value}" does not name a domain '
                    f"(domains: {_domain_names(tree)})")
        return f'invalid value "{value}" for attribute "{attr}" of <{name}>'
    if m := _RE_ID_DUP.match(msg):
        value = m.group(1)
        first_line = tree_index(tree).domains.get(value)
        first = f" (first defined at line {first_line})" if first_line and first_line != line else ""
        return f'duplicate domain name "{value}"{first}: every <domain> needs a unique name'
    if m := _RE_IDREF.match(msg):
        attr, value = m.group(1), m.group(2)
        return (f'<transform> {attr}="{value}" does not name a domain '
                f"(domains: {_domain_names(tree)})")
    if m := _RE_ENUM.match(msg):
        value, attr, name = m.group(1), m.group(2), m.group(3)
        return f'invalid {attr}="{value}" on <{name}>'
    return f"{msg} (DTD validation)"


def _may_be_empty(node) -> bool:
    """Whether a DTD content-model node accepts no child elements at all."""
    if node is None or node.occur in ("opt", "mult") or node.type == "pcdata":
        return True
    if node.type == "element":
        return False
    if node.type == "seq":
        return _may_be_empty(node.left) and _may_be_empty(node.right)
    return _may_be_empty(node.left) or _may_be_empty(node.right)  # "or"


def _model_names(node) -> set[str]:
    if node is None:
        return set()
    if node.type == "element":
        return {node.name}
    return _model_names(node.left) | _model_names(node.right)


class DtdShape:
    """What a DTD says in a form a linear pre-check can use: per element its
    allowed children, attributes, required attributes, and whether it must
    have a child element."""

    def __init__(self, dtd: etree.DTD) -> None:
        decls = {e.name: e for e in dtd.iterelements()}
        self.children = {n: _model_names(e.content) for n, e in decls.items()}
        self.attrs = {n: {a.name for a in e.iterattributes()} for n, e in decls.items()}
        self.required = {n: [a.name for a in e.iterattributes() if a.default == "required"]
                         for n, e in decls.items()}
        self.needs_child = {n for n, e in decls.items()
                            if e.type == "element" and not _may_be_empty(e.content)}


def mass_errors(tree: etree._ElementTree, shape: DtdShape, limit: int = MAX_ERRORS
                ) -> list[tuple[int, str]] | None:
    """Count, in one pass, the faults that each cost libxml2 a separate
    validation message (unknown or misplaced elements and attributes, missing
    required attributes, elements missing all their children). More than
    ``limit``: the first ``limit`` of them, worded for people, and a count
    of the rest -- the file is not worth a full DTD validation, whose
    per-message cost would make a crafted file take minutes. Otherwise None.
    """
    found: list[tuple[int, str]] = []
    count = 0
    children, attrs, required, needs = shape.children, shape.attrs, shape.required, shape.needs_child
    root = tree.getroot()
    if root.tag not in children:
        return None  # the root check reports this
    for el in tree.iter(etree.Element):
        tag = el.tag
        allowed = children.get(tag)
        if allowed is None:
            continue  # reported by its parent
        msgs = []
        has_child = False
        for c in el:
            ctag = c.tag
            if not isinstance(ctag, str):
                continue
            has_child = True
            if ctag not in children:
                msgs.append((c.sourceline or 0, f"unknown element <{ctag}> in <{tag}>"))
            elif ctag not in allowed:
                msgs.append((c.sourceline or 0, f"<{tag}> may not contain <{ctag}>"))
        if el.attrib or required[tag]:
            line = el.sourceline or 0
            known = attrs[tag]
            msgs += [(line, f'unknown attribute "{a}" on <{tag}>') for a in el.attrib if a not in known]
            msgs += [(line, f'<{tag}> needs the "{a}" attribute') for a in required[tag]
                     if a not in el.attrib]
        if not has_child and tag in needs:
            msgs.append((el.sourceline or 0, f"<{tag}> is empty: it must contain an element"))
        if msgs:
            count += len(msgs)
            if len(found) < limit:
                found += msgs
    if count <= limit:
        return None
    found = sorted(found, key=lambda e: e[0])[:limit]
    found.append((found[-1][0], f"... and {count - limit} more errors of this kind (the first "
                                f"{limit} are shown; the file was not validated further)"))
    return found


def dtd_errors(tree: etree._ElementTree, dtd: etree.DTD, lock: threading.Lock, translate,
               what: str) -> list[tuple[int, str]]:
    """Validate ``tree`` against ``dtd`` (serialised by ``lock``: the error log
    belongs to the DTD object) and return (line, message) pairs, libxml2's
    wording rewritten by ``translate(msg, line, tree)`` where it can.

    A tree with more faults than :data:`MAX_ERRORS` is reported by
    :func:`mass_errors` without running libxml2's validator."""
    shape = _SHAPES.get(id(dtd))
    if shape is None or shape[0] is not dtd:
        shape = _SHAPES[id(dtd)] = (dtd, DtdShape(dtd))
    mass = mass_errors(tree, shape[1])
    if mass is not None:
        return mass
    with lock:
        if dtd.validate(tree):
            return []
        raw = [(e.line, e.message) for e in dtd.error_log]
    raw.sort(key=lambda e: e[0])
    more = len(raw) - MAX_ERRORS
    raw = raw[:MAX_ERRORS]
    out = []
    for line, msg in raw:
        text = translate(msg, line, tree)
        if text is not None:
            out.append((line, text))
    if not out:  # never drop the only explanation
        out = [(line, f"{msg} (DTD validation)") for line, msg in raw]
    if not out:
        out = [(0, f"the file does not follow the {what} DTD")]
    out.sort(key=lambda e: e[0])
    if more > 0:
        out.append((out[-1][0], f"... and {more} more DTD validation errors (the first "
                                f"{MAX_ERRORS} are shown)"))
    return out


def _dtd_errors(tree: etree._ElementTree) -> list[tuple[int, str]]:
    return dtd_errors(tree, _DTD, _DTD_LOCK, _translate, "lbmrd")


# --------------------------------------------------------------------------- relaxed mode


def _missing_sections(root: etree._Element) -> list[tuple[int, str, bool]]:
    """``(line, section, absent)`` for each missing or element-less section."""
    out = []
    for name in ("domains", "transformations"):
        el = root.find(name)
        if el is None:
            out.append((root.sourceline or 0, name, True))
        elif not any(isinstance(c.tag, str) for c in el):
            out.append((el.sourceline or 0, name, False))
    return out


def _patched(tree: etree._ElementTree, missing: list[tuple[int, str, bool]]) -> etree._ElementTree:
    """A copy with placeholders for the missing sections (for re-validation only)."""
    doc = copy.deepcopy(tree)
    root = doc.getroot()
    names = {name for _, name, _ in missing}
    domains = root.find("domains")
    if domains is None:
        daemon = root.find("daemon")
        domains = etree.Element("domains")
        root.insert(root.index(daemon) + 1 if daemon is not None else 0, domains)
    dom = etree.SubElement(domains, "domain", name=_PLACEHOLDER)
    etree.SubElement(dom, "network").text = "0.0.0.0/32"
    if "transformations" in names:
        trans = root.find("transformations")
        if trans is None:
            trans = etree.SubElement(root, "transformations")
        tr = etree.SubElement(trans, "transform", source=_PLACEHOLDER, destination=_PLACEHOLDER)
        rule = etree.SubElement(tr, "rule")
        etree.SubElement(rule, "match", address="0.0.0.0", port="0")
        etree.SubElement(rule, "replace", address="0.0.0.0", port="0")
    return doc


# --------------------------------------------------------------------------- parsing


def _parser() -> etree.XMLParser:
    return etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        attribute_defaults=False,
        huge_tree=False,
        collect_ids=False,
    )


def _text(el: etree._Element) -> str:
    if not len(el):
        return (el.text or "").strip()
    return "".join(el.itertext()).strip()


def read_config_file(path: str | os.PathLike[str], limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of a configuration file: a regular file of at most ``limit``
    bytes. A FIFO, device or directory is refused without waiting on it (it
    is opened non-blocking and checked before anything is read)."""
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ConfigError(p, 0, f"cannot read the configuration file: {e.strerror or e}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode)
                    else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                    else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
            raise ConfigError(p, 0, f"the configuration file is {kind}: give a regular file")
        if st.st_size > limit:
            raise ConfigError(p, 0, f"the configuration file is {st.st_size} bytes, more than the "
                                    f"limit of {limit} bytes")
        chunks = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise ConfigError(p, 0, f"the configuration file is more than {limit} bytes (the limit)")
        return b"".join(chunks)
    except OSError as e:
        raise ConfigError(p, 0, f"cannot read the configuration file: {e.strerror or e}") from e
    finally:
        os.close(fd)


_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe\x00\x00", "utf-32-le"),
         (b"\x00\x00\xfe\xff", "utf-32-be"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))
_ASCII_ENCODINGS = frozenset({"utf-8", "utf8", "us-ascii", "ascii", "iso-8859-1", "latin1",
                              "latin-1", "iso-8859-15", "windows-1252", "cp1252"})
_ENCODING_DECL = re.compile(rb"""^<\?xml[^>]*?\sencoding\s*=\s*["']([A-Za-z0-9._-]+)["']""")
_DECLARATION = re.compile(r"<!(DOCTYPE|ENTITY|ELEMENT|ATTLIST|NOTATION)\b")


def check_declarations(data: bytes, path: str, what: str = "lbmrd") -> None:
    """Refuse markup declarations before the XML parser sees the file.

    A DOCTYPE (internal subset, external DTD) or an entity declaration can
    make a parser open local files or wait on a FIFO; our DTD is applied by
    us, never taken from the file. The text is searched in the encoding the
    parser would use: UTF-8, UTF-16/32 with a byte-order mark, or an
    ASCII-compatible encoding named in the XML declaration; any other
    encoding is refused.
    """
    text = None
    for bom, codec in _BOMS:
        if data.startswith(bom):
            try:
                text = data[len(bom):].decode(codec)
            except UnicodeDecodeError as e:
                raise ConfigError(path, 0, f"the file is not valid {codec.upper()}: {e.reason}") from None
            break
    if text is None:
        if b"\x00" in data[:4]:
            raise ConfigError(path, 1, "the file looks like UTF-16 or UTF-32 without a byte-order "
                                       "mark: write it in UTF-8")
        m = _ENCODING_DECL.match(data)
        if m and m.group(1).decode("ascii").lower() not in _ASCII_ENCODINGS:
            raise ConfigError(path, 1, f'unsupported encoding "{m.group(1).decode("ascii")}": '
                                       "write the file in UTF-8")
        text = data.decode("latin-1")  # the markup is ASCII in every accepted encoding
    m = _DECLARATION.search(text)
    if m:
        line = text.count("\n", 0, m.start()) + 1
        raise ConfigError(path, line, f"<!{m.group(1)} declarations are not allowed in {what} "
                                      "configuration files (the DTD is built in; a DOCTYPE or "
                                      "entity could make the parser read other files): remove it")


def load_config(path: str | os.PathLike[str], *, relaxed: bool = True) -> Config:
    """Read and check the configuration file at ``path``; ``ConfigError`` if invalid."""
    p = os.fspath(path)
    return parse_config(read_config_file(p), p, relaxed=relaxed)


def validate(path: str | os.PathLike[str], strict: bool = False) -> Config:
    """``lbmrd -v``: the checked :class:`Config` (see its ``warnings``), else ``ConfigError``.

    ``strict=True`` applies UM's grammar (``<domains>`` and ``<transformations>``
    required).
    """
    return load_config(path, relaxed=not strict)


def parse_config(text: bytes | str, path: str | os.PathLike[str] = "<string>", *,
                 relaxed: bool = True) -> Config:
    """Check configuration text; ``path`` is only used in messages and ``Config.path``."""
    path = os.fspath(path)
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(path, 0, f"the configuration is {len(data)} bytes, more than the limit "
                                   f"of {MAX_CONFIG_BYTES} bytes")
    check_declarations(data, path)
    parser = _parser()
    try:
        root = etree.fromstring(data, parser)
    except etree.XMLSyntaxError as e:
        entries = [(x.line, x.column, x.message.strip()) for x in parser.error_log]
        if not entries:
            entries = [(e.lineno or 0, (e.position or (0, 0))[1], e.msg)]
        errors = [(ln, f"XML syntax error: {msg} (column {col})") for ln, col, msg in entries]
        raise ConfigError(path, errors[0][0], errors[0][1], errors) from None
    tree = root.getroottree()
    warnings: list[tuple[int, str]] = []

    _check_root(path, root)

    errors = _dtd_errors(tree)
    strict_valid = not errors
    if errors:
        missing = _missing_sections(root)
        if not missing:
            _raise(path, errors)
        patched_errors = _dtd_errors(_patched(tree, missing))
        if patched_errors:
            if not relaxed:
                _raise(path, errors)
            # placeholders must not show up in the root's "found ..." list
            root_msg = "<lbmrd> must contain"
            _raise(path, [e for e in patched_errors if not e[1].startswith(root_msg)]
                   + [e for e in errors if e[1].startswith(root_msg)
                      and any(p[1].startswith(root_msg) for p in patched_errors)])
        if not relaxed:
            what = " and ".join(f"<{name}>" for _, name, _ in missing)
            state = "missing" if all(absent for _, _, absent in missing) else "missing or empty"
            _raise(path, [(missing[0][0],
                           f"{what} {state}: UM's grammar requires <domains> with at least one "
                           "<domain> and <transformations> with at least one <transform>, even "
                           "without NAT (add the dummy domain and transform of lbmrd.conf(5), "
                           "or use relaxed mode)")])
        for line, name, absent in missing:
            state = "no" if absent else "empty"
            warnings.append((line, f"{state} <{name}>: accepted in relaxed mode as a file "
                                   "without NAT (UM's lbmrd and strict validation reject it)"))

    daemon = _daemon_settings(root.find("daemon"), warnings, path)
    domains, transforms = _nat(tree, warnings, path)
    warnings.sort(key=lambda w: w[0])
    return Config(path, daemon, domains, transforms, warnings, strict_valid)


def _check_root(path: str, root: etree._Element) -> None:
    errors: list[tuple[int, str]] = []
    line = root.sourceline or 0
    if root.tag != "lbmrd":
        raise ConfigError(path, line, f"the root element is <{root.tag}>: an lbmrd configuration "
                                      'file starts with <lbmrd version="1.0">')
    version = root.get("version")
    if version is None:
        raise ConfigError(path, line, 'missing version attribute: write <lbmrd version="1.0"> '
                                      "(UM's lbmrd exits without a message on this)")
    if version != "1.0":
        raise ConfigError(path, line, f'unsupported version "{version}": the only lbmrd '
                                      'configuration version is "1.0"')
    for node in root.iter():
        if isinstance(node, etree._Entity):
            errors.append((node.sourceline or line,
                           f"entity reference {node.text} is not supported: lbmrd files may use "
                           "only the predefined XML entities and character references"))
        elif isinstance(node.tag, str) and etree.QName(node).namespace == _XINCLUDE_NS:
            errors.append((node.sourceline or line,
                           "XInclude is not supported in lbmrd configuration files"))
    if errors:
        _raise(path, errors)


_DAEMON_FIELDS = {
    "port": ("port", "a UDP port number 1..65535", 1, 65535),
    "activity": ("activity_ms", f"a positive number of milliseconds (at most {_INT_MAX})", 1, _INT_MAX),
    "ttl": ("ttl_s", "a positive number of seconds (or of milliseconds when 1000 or more)", 1, _INT_MAX),
    "resolver_unicast_receiver_socket_buffer":
        ("rcv_buf", f"a positive number of bytes (at most {_INT_MAX})", 1, _INT_MAX),
    "resolver_unicast_send_socket_buffer":
        ("snd_buf", f"a positive number of bytes (at most {_INT_MAX})", 1, _INT_MAX),
}


def _daemon_settings(daemon: etree._Element | None, warnings: list[tuple[int, str]],
                     path: str) -> DaemonSettings:
    if daemon is None:
        return DaemonSettings()
    values: dict[str, object] = {}
    lines: dict[str, int] = {}
    errors: list[tuple[int, str]] = []
    for el in daemon:
        if not isinstance(el.tag, str):
            continue
        tag, line, text = el.tag, el.sourceline or 0, _text(el)
        if tag in lines:
            warnings.append((line, f"<{tag}> is set again (also at line {lines[tag]}): "
                                   f"the last one wins ({text or 'empty'})"))
        lines[tag] = line
        try:
            if tag in ("interface", "log"):
                if not text:
                    what = "an interface (IP, CIDR network or device name)" if tag == "interface" \
                        else "a log file name"
                    raise ValueError(f"<{tag}> is empty: expected {what}")
                values[tag] = text
                continue
            name, what, lo, hi = _DAEMON_FIELDS[tag]
            value = _parse_int(tag, text, what, lo, hi)
            if tag == "ttl":
                if value >= 1000:
                    warnings.append((line, f"<ttl> {value} is taken as milliseconds ({value / 1000:g} s): "
                                           "lbmrd's command line gives the TTL in seconds, UM's XML "
                                           "reference in milliseconds; write a value below 1000 "
                                           "to mean seconds"))
                    values[name] = value / 1000
                else:
                    values[name] = float(value)
            else:
                values[name] = value
        except ValueError as e:
            errors.append((line, str(e)))
    if errors:
        _raise(path, errors)
    act, ttl = values.get("activity_ms"), values.get("ttl_s")
    if isinstance(act, int) and isinstance(ttl, float) and act > ttl * 1000:
        warnings.append((lines["activity"],
                         f"<activity> {act} ms is longer than the client TTL ({ttl:g} s): "
                         "dead clients are noticed late; keep activity at most TTL x 1000"))
    return DaemonSettings(
        interface=values.get("interface"),  # type: ignore[arg-type]
        port=values.get("port"),  # type: ignore[arg-type]
        activity_ms=values.get("activity_ms"),  # type: ignore[arg-type]
        ttl_s=values.get("ttl_s"),  # type: ignore[arg-type]
        log=values.get("log"),  # type: ignore[arg-type]
        rcv_buf=values.get("rcv_buf"),  # type: ignore[arg-type]
        snd_buf=values.get("snd_buf"),  # type: ignore[arg-type]
    )


def network_conflicts(nets: list[tuple[ipaddress.IPv4Network, str]]) -> list[tuple[int, int]]:
    """For each network (document order) that repeats or overlaps an earlier
    one, ``(its index, the index of the first such earlier network)``.

    A conflict is the same network listed again (in any domain) or an
    overlap with a network of another domain; a network inside another of
    the same domain is fine. CIDR networks overlap only by containment and a
    network has at most 32 strict supernets, so each network looks up its
    supernets by prefix and learns of its subnets from a summary kept per
    network: O(n x 33) instead of comparing every pair.
    """
    # per distinct network: the indices listed with it, in document order
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (net, _) in enumerate(nets):
        groups.setdefault((int(net.network_address), net.prefixlen), []).append(i)
    domain = [name for _, name in nets]

    def summary(indices) -> tuple[int, int]:
        """(first index, first index whose domain differs from the first's), -1 = none."""
        first = indices[0]
        other = next((k for k in indices if domain[k] != domain[first]), -1)
        return first, other

    def merge(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        if a[0] == -1:
            return b
        if b[0] == -1:
            return a
        first = min(a[0], b[0])
        cands = [k for k in (*a, *b) if k != -1 and domain[k] != domain[first]]
        return first, min(cands) if cands else -1

    def earliest_other(sm: tuple[int, int], i: int) -> int:
        """The first index of summary ``sm`` before ``i`` in another domain than i's, or -1."""
        first, other = sm
        if first == -1 or first >= i:
            return -1
        if domain[first] != domain[i]:
            return first
        return other if other != -1 and other < i else -1

    summaries = {key: summary(idx) for key, idx in groups.items()}
    lengths = sorted({plen for _, plen in groups})  # only the prefix lengths in use
    masks = {p: (0xFFFFFFFF << (32 - p)) & 0xFFFFFFFF for p in lengths}
    supernets: dict[tuple[int, int], list[tuple[int, int]]] = {}
    below: dict[tuple[int, int], tuple[int, int]] = {}  # summary of the strict subnets
    for key, sm in summaries.items():
        addr, plen = key
        sups = [sup for p in lengths if p < plen if (sup := (addr & masks[p], p)) in summaries]
        if sups:
            supernets[key] = sups
            for sup in sups:
                below[sup] = merge(below.get(sup, (-1, -1)), sm)
    out = []
    for key, idx in groups.items():
        sub = below.get(key, (-1, -1))
        sups = [summaries[sup] for sup in supernets.get(key, ())]
        if len(idx) == 1 and sub[0] == -1 and not sups:
            continue
        for n, i in enumerate(idx):
            cands = [idx[0]] if n else []  # the same network listed before
            cands += [k for k in (earliest_other(sub, i), *(earliest_other(sm, i) for sm in sups))
                      if k != -1]
            if cands:
                out.append((i, min(cands)))
    out.sort()
    return out


def _nat(tree: etree._ElementTree, warnings: list[tuple[int, str]],
         path: str) -> tuple[tuple[Domain, ...], tuple[Transform, ...]]:
    root = tree.getroot()
    errors: list[tuple[int, str]] = []
    domains: list[Domain] = []
    entries: list[tuple[ipaddress.IPv4Network, str, int]] = []  # document order
    domains_el = root.find("domains")
    for d in (domains_el.iterchildren("domain") if domains_el is not None else ()):
        name, dline = d.get("name", ""), d.sourceline or 0
        nets: list[ipaddress.IPv4Network] = []
        for n in d.iterchildren("network"):
            line, text = n.sourceline or 0, _text(n)
            try:
                net, host_bits = _parse_network(text)
            except ValueError as e:
                errors.append((line, f"<network> {e} (a domain network is an IPv4 host or "
                                     "CIDR network such as 10.1.0.0/16)"))
                continue
            if host_bits:
                warnings.append((line, f'<network> "{text}" has host bits set: using {net}'))
            entries.append((net, name, line))
            nets.append(net)
        domains.append(Domain(name, tuple(nets), dline))
    for i, j in network_conflicts([(n, name) for n, name, _ in entries]):
        net, name, line = entries[i]
        other, oname, oline = entries[j]
        if oname == name:
            warnings.append((line, f"network {net} is listed twice in domain "
                                   f'"{name}" (also at line {oline})'))
        else:
            warnings.append((line, f'network {net} of domain "{name}" overlaps {other} '
                                   f'of domain "{oname}" (line {oline}): addresses in '
                                   f'both belong to "{oname}", the first domain in '
                                   "document order"))

    names = {d.name for d in domains}
    known = ", ".join(d.name for d in domains[:20]) + (
        f" and {len(domains) - 20} more" if len(domains) > 20 else "") or "none"
    transforms: list[Transform] = []
    # the first rule per (pair, match address, match port or None=*): a later rule
    # with the same address and port, or any port after a "*", never applies
    first_rule: dict[tuple[str, str, bytes, int | None], NatRule] = {}
    trans_el = root.find("transformations")
    for t in (trans_el.iterchildren("transform") if trans_el is not None else ()):
        tline = t.sourceline or 0
        src, dst = t.get("source", ""), t.get("destination", "")
        for attr, value in (("source", src), ("destination", dst)):
            if value not in names:  # the DTD checks IDREFs too; keep the message ours
                errors.append((tline, f'<transform> {attr}="{value}" does not name a domain '
                                      f"(domains: {known})"))
        rules: list[NatRule] = []
        for r in t.iterchildren("rule"):
            parsed: list[object] = []
            bad = False
            for el in (r.find("match"), r.find("replace")):
                if el is None:  # excluded by the DTD
                    bad = True
                    continue
                line = el.sourceline or 0
                try:
                    parsed.append(_parse_host(el.get("address", "")))
                except ValueError as e:
                    errors.append((line, f"<{el.tag}> address {e}"))
                    bad = True
                try:
                    parsed.append(_parse_rule_port(el.get("port", "*")))
                except ValueError as e:
                    errors.append((line, f"<{el.tag}> port {e}"))
                    bad = True
            if bad:
                continue
            rule = NatRule(*parsed, r.sourceline or 0)  # type: ignore[arg-type]
            any_key = (src, dst, rule.match_ip, None)
            candidates = [r for r in (first_rule.get(any_key),
                                      first_rule.get((src, dst, rule.match_ip, rule.match_port)))
                          if r is not None]
            if candidates:
                earlier = min(candidates, key=lambda r: r.line)
                warnings.append((rule.line, f"rule {rule} never applies: the earlier rule "
                                            f"{earlier} (line {earlier.line}) for "
                                            f'"{src}" -> "{dst}" matches first'))
            first_rule.setdefault((src, dst, rule.match_ip, rule.match_port), rule)
            rules.append(rule)
        transforms.append(Transform(src, dst, tuple(rules), tline))
    if errors:
        _raise(path, errors)
    return tuple(domains), tuple(transforms)
