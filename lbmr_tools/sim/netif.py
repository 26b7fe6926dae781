"""Addresses and network interfaces for lbmr-sim: loopback and multicast
address checks, the multicast interface check and the multicast socket set-up."""

from __future__ import annotations

import ctypes
import fcntl
import ipaddress
import os
import socket
import struct
from typing import NamedTuple

Addr = tuple[str, int]

LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")
MULTICAST = ipaddress.IPv4Network("224.0.0.0/4")


def check_ipv4(ip: str, what: str) -> ipaddress.IPv4Address:
    try:
        return ipaddress.IPv4Address(ip)
    except ValueError:
        raise ValueError(f"{what} {ip!r} is not an IPv4 address") from None


def check_loopback(ip: str, what: str) -> ipaddress.IPv4Address:
    a = check_ipv4(ip, what)
    if a not in LOOPBACK:
        raise ValueError(f"{what} {ip} is not a loopback address (127.0.0.0/8); lbmr-sim only "
                         "plays on loopback (or on a multicast group)")
    return a


def check_group(ip: str, what: str = "multicast group") -> ipaddress.IPv4Address:
    a = check_ipv4(ip, what)
    if a not in MULTICAST:
        raise ValueError(f"{what} {ip} is not a multicast address (224.0.0.0/4)")
    return a


# ------------------------------------------------------ multicast interface

SIOCGIFCONF = 0x8912
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


def _ipv4_addresses(sock: socket.socket) -> list[tuple[str, str]]:
    """(interface name, address) of every IPv4 address (SIOCGIFCONF)."""
    n = 64
    while True:
        buf = bytearray(_IFREQ_SIZE * n)
        cbuf = (ctypes.c_char * len(buf)).from_buffer(buf)
        ifc = struct.pack("iP", len(buf), ctypes.addressof(cbuf))
        length = struct.unpack("iP", fcntl.ioctl(sock.fileno(), SIOCGIFCONF, ifc))[0]
        data = bytes(buf[:length])
        del cbuf
        if length < len(buf) - _IFREQ_SIZE or n >= 65536:
            break
        n *= 4
    out = []
    for off in range(0, len(data) - _IFREQ_SIZE + 1, _IFREQ_SIZE):
        name = data[off:off + 16].split(b"\0", 1)[0].decode(errors="replace")
        family = struct.unpack_from("=H", data, off + 16)[0]
        if family == socket.AF_INET:
            out.append((name.partition(":")[0], socket.inet_ntoa(data[off + 20:off + 24])))
    return out


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


def multicast_interface(ip: str) -> Interface:
    """The interface owning ``ip`` (any 127/8 address belongs to the
    loopback interface), checked for multicast mode: it must be up and have
    the MULTICAST flag, and a non-loopback interface is only accepted inside
    a network namespace other than the initial one. Raises
    :class:`MulticastUnavailable` with a readable message; sends nothing."""
    a = check_ipv4(ip, "multicast interface")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        addrs = _ipv4_addresses(s)
        names = [n for n, addr in addrs if addr == ip]
        if not names and a in LOOPBACK:  # 127/8 is the loopback interface's (even when down)
            names = [n for _, n in socket.if_nameindex() if _flags(s, n) & IFF_LOOPBACK]
        if not names:
            raise MulticastUnavailable(f"no interface has the address {ip} (--mc-interface)")
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
            "namespace; lbmr-sim keeps multicast on loopback or inside a network namespace")
    return iface


def _mreqn(group: str, ip: str, index: int) -> bytes:
    """struct ip_mreqn."""
    return socket.inet_aton(group) + socket.inet_aton(ip) + struct.pack("@i", index)


def open_multicast_socket(group: str, port: int, iface: Interface, iface_ip: str, source_ip: str,
                          ttl: int) -> socket.socket:
    """A UDP socket for one context in multicast mode: bound to (group,
    port) with SO_REUSEADDR and SO_REUSEPORT (every context of every
    process in the network namespace shares the port; the kernel gives each
    a copy of every datagram to the group), joined to the group on ``iface``, sending
    to it through ``iface`` from ``source_ip`` with loopback on and TTL
    ``ttl``."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((group, port))
        s.setsockopt(socket.IPPROTO_IP, IP_MULTICAST_ALL, 0)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, _mreqn(group, iface_ip, iface.index))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, _mreqn("0.0.0.0", source_ip, iface.index))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
    except BaseException:
        s.close()
        raise
    return s
