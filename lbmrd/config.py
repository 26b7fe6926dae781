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
import ipaddress
import os
from dataclasses import dataclass, field
from importlib import resources

from lxml import etree

from lbmr_runtime.values import parse_host, parse_int, parse_network
from lbmr_runtime.xmlconfig import (
    MAX_CONFIG_BYTES,
    RE_ID_DUP,
    RE_IDREF,
    RE_SYNTAX,
    ConfigError,
    Grammar,
    check_declarations,
    element_text,
    elements_at,
    parse_xml,
    raise_errors,
    read_config_file,
    refuse_entities_and_xinclude,
    tree_index,
)

from .nat import Domain, NatRule, NatTable, Transform, parse_rule_port
from .settings import (
    DEFAULT_ACTIVITY_MS,
    DEFAULT_INTERFACE,
    DEFAULT_PORT,
    DEFAULT_SOCKET_BUFFER,
    DEFAULT_TTL_S,
    DEFAULTS,
    Settings,
)

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


_INT_MAX = 2**31 - 1  # socket options and timers are C ints in UM
_PLACEHOLDER = "_lbmrd_relaxed_placeholder_"


# --------------------------------------------------------------------------- errors


# --------------------------------------------------------------------------- model


#: The file's ``<daemon>`` settings: the one settings type of lbmrd
#: (:class:`lbmrd.settings.Settings`), under the name this module has always used.
DaemonSettings = Settings


@dataclass(frozen=True)
class Config:
    """A checked configuration file: the ``<daemon>`` settings, and the NAT
    domains and transforms (``nat``: the :class:`~lbmrd.nat.NatTable` the
    relay uses).

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
    nat: NatTable = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nat", NatTable(self.domains, self.transforms))

    @classmethod
    def empty(cls, path: str = "<defaults>") -> Config:
        """No file: nothing set, no domains, no NAT."""
        return cls(path, DaemonSettings())

    def domain_of(self, ip: bytes | str) -> str | None:
        """See :meth:`NatTable.domain_of`."""
        return self.nat.domain_of(ip)

    def rules_for(self, src_domain: str | None, dst_domain: str | None) -> tuple[NatRule, ...]:
        """See :meth:`NatTable.rules_for`."""
        return self.nat.rules_for(src_domain, dst_domain)

    def rewrite(self, src_domain: str | None, dst_domain: str | None,
                ip: bytes, port: int) -> tuple[bytes, int] | None:
        """See :meth:`NatTable.rewrite`."""
        return self.nat.rewrite(src_domain, dst_domain, ip, port)


# --------------------------------------------------------------------------- DTD messages

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
    "lbmrd": ["version"],
    "domain": ["name"],
    "transform": ["source", "destination"],
    "match": ["address", "port"],
    "replace": ["address", "port"],
}
_ATTR_HINT = {
    ("lbmrd", "version"): ' (write <lbmrd version="1.0">)',
    ("domain", "name"): " (a unique name for the domain)",
    ("transform", "source"): " (the name of a <domain>)",
    ("transform", "destination"): " (the name of a <domain>)",
    ("match", "address"): ' (a host address, e.g. address="10.1.1.50")',
    ("replace", "address"): ' (a host address, e.g. address="192.168.1.1")',
}

class _LbmrdGrammar(Grammar):
    """lbmrd's wording: libxml2's "got" lists, domain names as XML IDs."""

    def empty_example(self, name: str) -> str:
        return f'<{name} address="..." port="..."/>'

    def special(self, msg: str, line: int, tree: etree._ElementTree):
        if m := RE_SYNTAX.match(msg):
            attr, name = m.group(1), m.group(2)
            values = [e.get(attr, "") for e in elements_at(tree, name, line)]
            value = values[0] if values else ""
            if name == "domain":
                return (f'domain name "{value}" is not valid: it must start with a letter or "_" '
                        'and contain only letters, digits, ".", "-" and "_" (an XML ID)')
            if name == "transform":
                return (f'<transform> {attr}="{value}" does not name a domain '
                        f"(domains: {_domain_names(tree)})")
            return f'invalid value "{value}" for attribute "{attr}" of <{name}>'
        if m := RE_ID_DUP.match(msg):
            value = m.group(1)
            first_line = tree_index(tree).first_lines("domain", "name").get(value)
            first = f" (first defined at line {first_line})" if first_line and first_line != line else ""
            return f'duplicate domain name "{value}"{first}: every <domain> needs a unique name'
        if m := RE_IDREF.match(msg):
            attr, value = m.group(1), m.group(2)
            return (f'<transform> {attr}="{value}" does not name a domain '
                    f"(domains: {_domain_names(tree)})")
        return super().special(msg, line, tree)


def _domain_names(tree: etree._ElementTree, most: int = 20) -> str:
    names = [n for n in tree_index(tree).first_lines("domain", "name") if n != _PLACEHOLDER]
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more or "none"


GRAMMAR = _LbmrdGrammar("lbmrd", DTD_TEXT, content=_CONTENT, attrs=_ATTRS, attr_hints=_ATTR_HINT)


def _dtd_errors(tree: etree._ElementTree) -> list[tuple[int, str]]:
    return GRAMMAR.errors(tree)


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
    root = parse_xml(data, path, "lbmrd")
    tree = root.getroottree()
    warnings: list[tuple[int, str]] = []

    _check_root(path, root)

    errors = _dtd_errors(tree)
    strict_valid = not errors
    if errors:
        missing = _missing_sections(root)
        if not missing:
            raise_errors(path, errors)
        patched_errors = _dtd_errors(_patched(tree, missing))
        if patched_errors:
            if not relaxed:
                raise_errors(path, errors)
            # placeholders must not show up in the root's "found ..." list
            root_msg = "<lbmrd> must contain"
            raise_errors(path, [e for e in patched_errors if not e[1].startswith(root_msg)]
                   + [e for e in errors if e[1].startswith(root_msg)
                      and any(p[1].startswith(root_msg) for p in patched_errors)])
        if not relaxed:
            what = " and ".join(f"<{name}>" for _, name, _ in missing)
            state = "missing" if all(absent for _, _, absent in missing) else "missing or empty"
            raise_errors(path, [(missing[0][0],
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
    refuse_entities_and_xinclude(path, root, "lbmrd")


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
        tag, line, text = el.tag, el.sourceline or 0, element_text(el)
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
            value = parse_int(tag, text, what, lo, hi)
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
        raise_errors(path, errors)
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
            line, text = n.sourceline or 0, element_text(n)
            try:
                net, host_bits = parse_network(text)
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
                    parsed.append(parse_host(el.get("address", "")))
                except ValueError as e:
                    errors.append((line, f"<{el.tag}> address {e}"))
                    bad = True
                try:
                    parsed.append(parse_rule_port(el.get("port", "*")))
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
        raise_errors(path, errors)
    return tuple(domains), tuple(transforms)
