"""Addresses for lbmr-sim: loopback and multicast address checks. The
multicast interface check and socket set-up are the runtime's
(:mod:`lbmr_runtime.netif`), re-exported here."""

from __future__ import annotations

import ipaddress

from lbmr_runtime.netif import (  # noqa: F401 - re-exported for the simulator
    IFF_LOOPBACK,
    IFF_MULTICAST,
    IFF_UP,
    IP_MULTICAST_ALL,
    Interface,
    MulticastUnavailable,
    in_initial_netns,
    multicast_interface,
    open_multicast_socket,
)

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
