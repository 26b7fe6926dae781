"""Resolve UM interface specs (``-i``/``<interface>``) to an IPv4 address.

Accepted forms, as UM documents them: a dotted address (must be one of this
host's addresses, or 0.0.0.0 for all), a CIDR network (``10.0.0.0/8``: the
first local address inside it), a device name (``eth0``, optionally in
double quotes), or a DNS host name optionally with ``/mask``.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

SIOCGIFADDR = 0x8915


class InterfaceError(ValueError):
    pass


def local_addresses() -> list[tuple[str, str]]:
    """(device, IPv4 address) for every interface that has one, in index order."""
    out = []
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            try:
                r = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            out.append((name, socket.inet_ntoa(r[20:24])))
    finally:
        s.close()
    return out


def _bindable(ip: str) -> bool:
    """Whether ``ip`` is an address of this host (can a UDP socket bind it?)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind((ip, 0))
        return True
    except OSError:
        return False
    finally:
        s.close()


def resolve_interface(spec: str) -> str:
    """Return the address to bind for ``spec`` (see module doc)."""
    spec = spec.strip()
    if spec in ("", "0.0.0.0", "*"):
        return "0.0.0.0"
    addrs = local_addresses()
    name = spec.strip('"')
    for dev, ip in addrs:
        if dev == name:
            return ip
    host, _, mask = spec.partition("/")
    try:
        ipaddress.IPv4Address(host)
        is_ip = True
    except ValueError:
        is_ip = False
    if not is_ip:
        try:
            host = socket.gethostbyname(host)
        except OSError as e:
            raise InterfaceError(f"Invalid interface [{spec}] specified: [{e}]") from None
    if not mask:
        if _bindable(host):
            return host
        raise InterfaceError(f"Invalid interface [{spec}] specified: [no local interface has address {host}]")
    try:
        net = ipaddress.IPv4Network(f"{host}/{mask}", strict=False)
    except ValueError as e:
        raise InterfaceError(f"Invalid interface [{spec}] specified: [{e}]") from None
    for _, ip in addrs:
        if ipaddress.IPv4Address(ip) in net:
            return ip
    raise InterfaceError(f"Invalid interface [{spec}] specified: [no local interface in {net}]")
