"""The checks of lbmr-router's configuration that read across portals,
after each portal's own values are checked: :func:`check_across_portals`
(unique portal names, one domain id per TRD, one endpoint per TRD, one peer
link per pair of routers, no listen port used twice on one interface, the
``<request-tcp>`` listeners included) and
:func:`check_supported` (what this version runs: at least two portals, and
enough TR ports for every link of an lbmrd endpoint).
"""

from __future__ import annotations

from lxml import etree

from .checker import Checker
from .model import EndpointConfig, PeerConfig


def check_across_portals(c: Checker, endpoints: list[EndpointConfig], peers: list[PeerConfig]) -> None:
    names: dict[str, int] = {}
    for portal in [*endpoints, *peers]:
        if not portal.name:
            continue
        if portal.name in names:
            c.error(portal.line, f'portal name "{portal.name}" is used twice (also at line '
                                 f"{names[portal.name]}): every portal needs its own name")
        else:
            names[portal.name] = portal.line
    same_trd = _same_trd_checks(c, endpoints)
    ids: dict[int, EndpointConfig] = {}
    for ep in endpoints:
        if not ep.domain_id:
            continue
        first = ids.get(ep.domain_id)
        if first is not None and ep.name not in same_trd:
            c.error(ep.line, f'domain-id {ep.domain_id} of endpoint "{ep.name}" is already used '
                             f'by endpoint "{first.name}" (line {first.line}): a router attaches '
                             "to a TRD once, and every TRD has its own domain id")
        elif first is None:
            ids[ep.domain_id] = ep
    targets: dict[tuple[str, int], PeerConfig] = {}
    for peer in peers:
        if peer.initiator is None or not peer.initiator.port:
            continue
        key = (peer.initiator.address, peer.initiator.port)
        first = targets.get(key)
        if first is not None:
            c.error(peer.initiator.line, f'peer "{peer.name}" connects to {key[0]}:{key[1]} like peer '
                                         f'"{first.name}" (line {first.initiator.line}): two peer links '
                                         "to the same router; one link per pair of routers")
        else:
            targets[key] = peer
    _request_listener_checks(c, endpoints, peers)
    ports: dict[int, list[PeerConfig]] = {}
    for peer in peers:
        if peer.acceptor is None or not peer.acceptor.listen_port:
            continue
        port = peer.acceptor.listen_port
        # one port on two interfaces is fine; on the same one (or on any address) it is not
        clash = [o for o in ports.get(port, ()) if not o.interface or not peer.interface
                 or o.interface == peer.interface]
        if clash:
            c.error(peer.acceptor.line, f'listen-port {port} of peer "{peer.name}" is already '
                                        f'used by peer "{clash[0].name}" (line '
                                        f"{clash[0].line}) on the same interface")
        ports.setdefault(port, []).append(peer)
        for ep in endpoints:
            if port in ep.relay.ports:
                c.warn(peer.acceptor.line, f"listen-port {port} is inside the relay range "
                                           f'{ep.relay.ports} of endpoint "{ep.name}": one relay '
                                           "port fewer is available")


def _request_listener_checks(c: Checker, endpoints: list[EndpointConfig], peers: list[PeerConfig]) -> None:
    """No two ``<request-tcp>`` listeners, nor a ``<request-tcp>`` and a peer's
    listen-port, on one port of one interface (an interface left out is any address)."""
    seen: list[tuple[str | None, int, str, int]] = []  # (interface, port, what, line)
    for peer in peers:
        if peer.acceptor is not None and peer.acceptor.listen_port:
            seen.append((peer.interface, peer.acceptor.listen_port, f'the listen-port of peer "{peer.name}"',
                         peer.acceptor.line))
    for ep in endpoints:
        rl = ep.request_listener
        if rl is None:
            continue
        iface = rl.interface or ep.topic_resolution.interface
        for other_iface, port, what, line in seen:
            if port == rl.port and (not iface or not other_iface or iface == other_iface):
                c.error(rl.line, f'<request-tcp> port {rl.port} of endpoint "{ep.name}" is already {what} '
                                 f"(line {line}) on the same interface: every listener needs its own port")
                break
        seen.append((iface, rl.port, f'the <request-tcp> port of endpoint "{ep.name}"', rl.line))


def _trd_key(ep: EndpointConfig) -> tuple:
    """What identifies an endpoint's TRD: its multicast group, port and interface,
    or its set of lbmrds."""
    tr = ep.topic_resolution
    if tr.multicast is not None:
        return ("multicast", tr.multicast.group, tr.multicast.port, tr.interface or "")
    return ("lbmrd", frozenset((d.address, d.port) for d in tr.lbmrds))


def _same_trd_checks(c: Checker, endpoints: list[EndpointConfig]) -> set[str]:
    """Two endpoints on one TRD (the same multicast group:port on the same
    interface, or lbmrd lists that share a daemon): an error on the second.
    Returns the names of the endpoints so reported."""
    flagged: set[str] = set()
    for i, ep in enumerate(endpoints):
        k = _trd_key(ep)
        for first in endpoints[:i]:
            f = _trd_key(first)
            if k[0] != f[0]:
                continue
            if k[0] == "multicast":
                if k != f:
                    continue
                what = f"multicast {k[1]}:{k[2]}" + (f" on {k[3]}" if k[3] else "")
            else:
                shared = sorted(k[1] & f[1])
                if not shared:
                    continue
                what = "lbmrd " + ", ".join(f"{a}:{p}" for a, p in shared)
            if ep.domain_id != first.domain_id:
                why = (f"one TRD cannot have two domain ids ({first.domain_id} and {ep.domain_id}); "
                       "a router attaches to a TRD once")
            else:
                why = "a router attaches to a TRD once (one endpoint portal per TRD)"
            c.error(ep.line, f'endpoint "{ep.name}" uses the TRD of endpoint "{first.name}" '
                             f"(line {first.line}): both use {what}: {why}")
            flagged.add(ep.name)
            break
    return flagged


def check_supported(c: Checker, root: etree._Element, endpoints: list[EndpointConfig],
               peers: list[PeerConfig]) -> None:
    """What this version runs: at least one endpoint, and a peer or a second
    endpoint; each link of an lbmrd endpoint needs a port of its TR port range."""
    portals = root.find("portals")
    if not endpoints:
        c.error(portals, "<portals> has no <endpoint>: a router needs at least one endpoint portal")
        return
    if len(endpoints) == 1 and not peers:
        c.error(portals, "<portals> has no <peer>: a router with one <endpoint> needs a <peer> "
                         "(or a second <endpoint>: a router joining two TRDs directly)")
    links = len(peers) + len(endpoints) - 1  # each endpoint: every peer, every other endpoint
    for ep in endpoints:
        pr = ep.topic_resolution.port_range
        if ep.topic_resolution.multicast is None and pr is not None and pr.low and len(pr) < links:
            c.error(ep.topic_resolution.line,
                    f'endpoint "{ep.name}" has {links} links (each with its own TR socket) but its '
                    f"<port-range> {pr} has {len(pr)} port(s): widen it to at least {links}")
