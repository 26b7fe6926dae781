"""Values in configuration files, parsed with readable reasons: IPv4 hosts
and networks in dotted decimal (no DNS names, no octal, no IPv6), and
bounded integers. Every parser raises ``ValueError`` with a message meant
for the person who wrote the file."""

from __future__ import annotations

import ipaddress
import re

__all__ = ["DIGITS_RE", "dotted", "octets", "parse_host", "parse_network", "parse_int"]

OCTET_RE = re.compile(r"0|[1-9][0-9]{0,2}")
DIGITS_RE = re.compile(r"[0-9]+")


def dotted(ip: bytes) -> str:
    return ".".join(str(b) for b in ip)


def octets(text: str, what: str) -> list[int]:
    """Decimal octets of a dotted address; ValueError with a reason."""
    if ":" in text:
        raise ValueError(f'"{text}" is not an IPv4 {what}: IPv6 is not supported '
                         "(UM topic resolution is IPv4 only)")
    parts = text.split(".")
    if any(c.isalpha() for c in text):
        raise ValueError(f'"{text}" is not an IPv4 {what}: DNS names are not allowed, '
                         "give the address in dotted decimal")
    if not 1 <= len(parts) <= 4 or not all(OCTET_RE.fullmatch(p) for p in parts):
        if any(len(p) > 1 and p.startswith("0") and p.isdigit() for p in parts):
            raise ValueError(f'"{text}" is not an IPv4 {what}: octets with leading zeros '
                             "are ambiguous (octal in some parsers)")
        raise ValueError(f'"{text}" is not an IPv4 {what} in dotted decimal')
    values = [int(p) for p in parts]
    if any(v > 255 for v in values):
        raise ValueError(f'"{text}" is not an IPv4 {what}: an octet is greater than 255')
    return values


def parse_host(text: str) -> bytes:
    """A dotted-quad IPv4 host address as 4 bytes."""
    text = text.strip()
    if not text:
        raise ValueError("is empty: give an IPv4 host address such as 10.1.1.50")
    if "/" in text:
        raise ValueError(f'"{text}" is a network: a rule matches and replaces a single '
                         "host, give a dotted-quad address such as 10.1.1.50")
    values = octets(text, "host address")
    if len(values) != 4:
        raise ValueError(f'"{text}" is not a full IPv4 address: give all four octets '
                         "(a.b.c.d)")
    return bytes(values)


QUAD_RE = re.compile(r"(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})\."
                      r"(0|[1-9][0-9]{0,2})(?:/([0-9]|[12][0-9]|3[0-2]))?")


def parse_network(text: str) -> tuple[ipaddress.IPv4Network, bool]:
    """An IPv4 host or CIDR network; short forms (``192.168.1/24``) are padded.

    Returns the network and whether host bits had to be cleared.
    """
    text = text.strip()
    m = QUAD_RE.fullmatch(text)
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
    values = octets(addr, "host or network")
    if slash:
        if not DIGITS_RE.fullmatch(prefix_text) or len(prefix_text) > 2 or int(prefix_text) > 32:
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


def parse_int(tag: str, text: str, what: str, lo: int, hi: int) -> int:
    if not text:
        raise ValueError(f"<{tag}> is empty: expected {what}")
    if not DIGITS_RE.fullmatch(text):
        raise ValueError(f'<{tag}> "{text}" is not a number: expected {what}')
    value = int(text) if len(text) <= 20 else hi + 1  # no giant int() conversions
    if not lo <= value <= hi:
        raise ValueError(f"<{tag}> {text} is out of range: expected {what}")
    return value
