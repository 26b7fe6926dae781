"""The tools of lbmr-router's value pass (after DTD validation): the
:class:`Checker` that the per-element checkers of :mod:`router.config.endpoint`,
:mod:`router.config.peer` and :mod:`router.config.cross_checks` (and the
``<daemon>`` checker of :mod:`router.config`) report to, and the value parsers
they share.

The parsers (:func:`parse_number`, :func:`parse_ipv4`, :func:`parse_unicast`,
:func:`parse_interface`) take text and return a normalised value or raise
``ValueError`` with a reason; the caller names the element or attribute.
:class:`Checker` collects errors and warnings as ``(line, message)`` pairs and
reads element text and attributes (numbers, ports, milliseconds, interfaces,
port ranges), a portal's ``<acl>`` and TLS files; on a bad value it records
the error and returns the default, so one pass reports every problem.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path

from lxml import etree

from lbmr_runtime.values import DIGITS_RE, octets, parse_int, parse_network
from lbmr_runtime.xmlconfig import element_text

from ..core.acl import OPEN, PortalAcl
from .acl import parse_acl
from .model import PortRange

INT_MAX = 2**31 - 1  # timers and buffer sizes, as C ints in UM
_NAME_MAX = 255  # characters in router and portal names
_PEM_MAX = 1 << 20  # bytes read from a TLS file

_IFNAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.:@-]{0,14}")  # Linux IFNAMSIZ - 1
_NUMERIC_RE = re.compile(r"[0-9./]+")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def parse_number(text: str, what: str, lo: int, hi: int) -> int:
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


def parse_ipv4(text: str, what: str) -> str:
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


def parse_unicast(text: str, what: str) -> str:
    """An IPv4 address that packets can be sent to."""
    addr = parse_ipv4(text, what)
    ip = ipaddress.IPv4Address(addr)
    if ip.is_unspecified:
        raise ValueError(f'"{addr}" means "any address" and cannot be sent to: give {what}')
    if ip.is_multicast or addr == "255.255.255.255":
        raise ValueError(f'"{addr}" is a multicast or broadcast address: give {what}')
    return addr


def parse_interface(text: str) -> str:
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
        return parse_ipv4(text, "the address of a local interface")
    if _IFNAME_RE.fullmatch(text.strip('"')):
        return text.strip('"')
    raise ValueError(f'"{text}" is not an interface: give an IPv4 address, a CIDR network '
                     "such as 10.0.0.0/8, or a device name such as eth0")


class Checker:
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
            return parse_interface(element_text(el))
        except ValueError as e:
            self.error(el, f"<interface> {e}")
            return None

    # ---- attributes

    def attr_int(self, el: etree._Element | None, attr: str, default: int, what: str,
                 lo: int, hi: int) -> int:
        if el is None or el.get(attr) is None:
            return default
        try:
            return parse_number(el.get(attr, ""), what, lo, hi)
        except ValueError as e:
            self.error(el, f"<{el.tag}> {attr} {e}")
            return default

    def attr_port(self, el: etree._Element | None, attr: str, default: int, proto: str) -> int:
        return self.attr_int(el, attr, default, f"a {proto} port 1..65535", 1, 65535)

    def attr_ms(self, el: etree._Element | None, attr: str, default: int, lo: int = 1) -> int:
        return self.attr_int(el, attr, default, f"milliseconds {lo}..{INT_MAX}", lo, INT_MAX)

    def attr_interface(self, el: etree._Element, attr: str) -> str | None:
        if el.get(attr) is None:
            return None
        try:
            return parse_interface(el.get(attr, ""))
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

    # ---- portals

    def portal_acl(self, portal: etree._Element, name: str) -> PortalAcl:
        """The portal's ``<acl>`` (:mod:`router.config.acl`), OPEN without one."""
        el = portal.find("acl")
        return OPEN if el is None else parse_acl(el, name, self.error, self.warn)

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
