"""Network interfaces: this host's IPv4 addresses, UM interface specs, and
multicast interfaces and sockets.

Resolve UM interface specs (``-i``/``<interface>``) to an IPv4 address.

Accepted forms, as UM documents them: a dotted address (must be one of this
host's addresses, or 0.0.0.0 for all), a CIDR network (``10.0.0.0/8``: the
first local address inside it), a device name (``eth0``, optionally in
double quotes), or a DNS host name optionally with ``/mask``.
"""

from __future__ import annotations

import ctypes
import fcntl
import ipaddress
import os
import socket
import struct
from typing import NamedTuple


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


_LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")


# ------------------------------------------------------ multicast interface

SIOCGIFFLAGS = 0x8913
IFF_UP = 0x1
IFF_LOOPBACK = 0x8
IFF_MULTICAST = 0x1000
IP_MULTICAST_ALL = getattr(socket, "IP_MULTICAST_ALL", 49)  # Linux
PROC_NET_INIT_INO = 0xEFFFFFF9  # the initial network namespace's inode (linux/proc_ns.h)
_IFREQ_SIZE = 40 if struct.calcsize("P") == 8 else 32  # sizeof(struct ifreq)


class MulticastUnavailable(OSError):
    """Multicast mode cannot run on the requested interface."""


class Interface(NamedTuple):
    name: str
    index: int
    flags: int

    @property
    def loopback(self) -> bool:
        return bool(self.flags & IFF_LOOPBACK)


def _flags(sock: socket.socket, name: str) -> int:
    req = struct.pack("16sh", name.encode(), 0) + bytes(_IFREQ_SIZE - 18)
    return struct.unpack_from("h", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, req), 16)[0] & 0xFFFF


def in_initial_netns() -> bool:
    """Whether this process runs in the host's initial network namespace (the
    kernel gives it the fixed inode number PROC_NET_INIT_INO) or in the one
    of process 1 (a container's). True when that cannot be told."""
    try:
        mine = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return True
    if mine == PROC_NET_INIT_INO:
        return True
    try:
        return mine == os.stat("/proc/1/ns/net").st_ino
    except OSError:  # process 1 may be unreadable even for root
        return False


def multicast_interface(ip: str, *, option: str = "--mc-interface", who: str = "lbmr-sim") -> Interface:
    """The interface owning ``ip`` (any 127/8 address belongs to the
    loopback interface), checked for multicast mode: it must be up and have
    the MULTICAST flag, and a non-loopback interface is only accepted inside
    a network namespace other than the initial one. Raises
    :class:`MulticastUnavailable` with a readable message; sends nothing."""
    try:
        a = ipaddress.IPv4Address(ip)
    except ValueError:
        raise ValueError(f"multicast interface {ip!r} is not an IPv4 address") from None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        names = [n.partition(":")[0] for n, addr in local_addresses() if addr == ip]
        if not names and a in _LOOPBACK:  # 127/8 is the loopback interface's (even when down)
            names = [n for _, n in socket.if_nameindex() if _flags(s, n) & IFF_LOOPBACK]
        if not names:
            raise MulticastUnavailable(f"no interface has the address {ip} ({option})")
        name = names[0]
        iface = Interface(name, socket.if_nametoindex(name), _flags(s, name))
    if not iface.flags & IFF_UP:
        raise MulticastUnavailable(f"the interface {name} ({ip}) is down")
    if not iface.flags & IFF_MULTICAST:
        raise MulticastUnavailable(
            f"multicast is not enabled on the interface {name} ({ip}); run inside a network "
            "namespace with multicast on lo (ip link set lo up multicast on)")
    if not iface.loopback and in_initial_netns():
        raise MulticastUnavailable(
            f"refusing multicast on the non-loopback interface {name} ({ip}) in the initial network "
            f"namespace; {who} keeps multicast on loopback or inside a network namespace")
    return iface


def _mreqn(group: str, ip: str, index: int) -> bytes:
    """struct ip_mreqn."""
    return socket.inet_aton(group) + socket.inet_aton(ip) + struct.pack("@i", index)


def open_multicast_socket(group: str, port: int, iface_index: int, iface_ip: str, source_ip: str,
                          ttl: int, buffer: int | None = None) -> socket.socket:
    """A UDP socket for multicast topic resolution: bound to (group, port)
    with SO_REUSEADDR and SO_REUSEPORT (every context of every process on the
    host shares the port; the kernel gives each a copy of every datagram to
    the group), joined to the group on the interface ``iface_index`` (0: the
    one that has ``iface_ip``), sending to it through that interface from
    ``source_ip`` with loopback on and TTL ``ttl``; ``buffer``: socket buffer
    sizes in bytes, best effort."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF) if buffer else ():
            try:
                s.setsockopt(socket.SOL_SOCKET, opt, buffer)
            except OSError:
                pass
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((group, port))
        s.setsockopt(socket.IPPROTO_IP, IP_MULTICAST_ALL, 0)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, _mreqn(group, iface_ip, iface_index))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, _mreqn("0.0.0.0", source_ip, iface_index))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
    except BaseException:
        s.close()
        raise
    return s
