"""Resolve UM interface specs (``-i``/``<interface>``) to an IPv4 address.

Accepted forms, as UM documents them: a dotted address (must be one of this
host's addresses, or 0.0.0.0 for all), a CIDR network (``10.0.0.0/8``: the
first local address inside it), a device name (``eth0``, optionally in
double quotes), or a DNS host name optionally with ``/mask``.
"""

from __future__ import annotations

import ctypes
import ipaddress
import socket


class InterfaceError(ValueError):
    pass


class _Sockaddr(ctypes.Structure):
    _fields_ = [("sa_family", ctypes.c_ushort), ("sa_data", ctypes.c_ubyte * 14)]


class _Ifaddrs(ctypes.Structure):
    pass


_Ifaddrs._fields_ = [
    ("ifa_next", ctypes.POINTER(_Ifaddrs)), ("ifa_name", ctypes.c_char_p), ("ifa_flags", ctypes.c_uint),
    ("ifa_addr", ctypes.POINTER(_Sockaddr)), ("ifa_netmask", ctypes.POINTER(_Sockaddr)),
    ("ifa_ifu", ctypes.c_void_p), ("ifa_data", ctypes.c_void_p),
]


def local_addresses() -> list[tuple[str, str]]:
    """(device, IPv4 address) for every IPv4 address of this host, secondary
    addresses included, in the order getifaddrs(3) lists them."""
    libc = ctypes.CDLL(None, use_errno=True)
    head = ctypes.POINTER(_Ifaddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        raise OSError(ctypes.get_errno(), "getifaddrs failed")
    out = []
    try:
        p = head
        while p:
            ifa = p.contents
            if ifa.ifa_addr and ifa.ifa_addr.contents.sa_family == socket.AF_INET:
                raw = bytes(ifa.ifa_addr.contents.sa_data[2:6])
                out.append((ifa.ifa_name.decode(errors="replace"), socket.inet_ntoa(raw)))
            p = ifa.ifa_next
    finally:
        libc.freeifaddrs(head)
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
