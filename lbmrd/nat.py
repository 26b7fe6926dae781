"""lbmrd's NAT engine (sans-IO, no XML): domains of IPv4 networks, rewrite
rules per (source domain, destination domain), and the look-ups the relay
makes per datagram.

Addresses are 4 raw bytes in network order, as in a TIR; ports are ints.
:class:`NatTable` answers ``domain_of`` with one dict probe per prefix
length in use (whatever the number of networks) and ``rewrite`` with the
first matching rule of the pair.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from lbmr_runtime.values import DIGITS_RE, dotted, parse_host

__all__ = ["Domain", "NatRule", "Transform", "NatTable", "parse_rule_port"]


def parse_rule_port(text: str) -> int | None:
    text = text.strip()
    if text == "*":
        return None
    if not DIGITS_RE.fullmatch(text) or len(text) > 5 or int(text) > 65535:
        raise ValueError(f'"{text}" is not a port: give a number 0..65535 or "*"')
    return int(text)


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
        return cls(parse_host(match_address), parse_rule_port(match_port),
                   parse_host(replace_address), parse_rule_port(replace_port), line)

    @property
    def match_address(self) -> str:
        return dotted(self.match_ip)

    @property
    def replace_address(self) -> str:
        return dotted(self.replace_ip)

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


class NatTable:
    """Domains and transforms, indexed for the relay.

    ``domain_of`` gives the first domain (document order) whose network
    contains an address; ``rules_for``/``rewrite`` give and apply the rules
    of every transform of a (source, destination) pair, in document order.
    """

    def __init__(self, domains: tuple[Domain, ...] = (), transforms: tuple[Transform, ...] = ()) -> None:
        self.domains = domains
        self.transforms = transforms
        # per prefix length in use: network -> (document position, domain name)
        by_len: dict[int, dict[int, tuple[int, str]]] = {}
        pos = 0
        for d in domains:
            for n in d.networks:
                table = by_len.setdefault(n.prefixlen, {})
                table.setdefault(int(n.network_address), (pos, d.name))
                pos += 1
        self._nets = tuple(((0xFFFFFFFF << (32 - plen)) & 0xFFFFFFFF, table)
                           for plen, table in sorted(by_len.items(), reverse=True))
        rules: dict[tuple[str, str], list[NatRule]] = {}
        for t in transforms:
            rules.setdefault((t.source, t.destination), []).extend(t.rules)
        self._rules = {k: tuple(v) for k, v in rules.items()}
        self._cache: dict[bytes, str | None] = {}

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
