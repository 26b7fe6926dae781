"""Drivers shared by the router's tests: TR datagrams and advertisements for
the sans-IO cores, configuration files, lbmrds, routers, sources and receivers
on loopback, a peer of our own, certificates, and two peer connections wired
back to back. Addresses are (ip, port) tuples; times are seconds."""

from __future__ import annotations

import hashlib
import itertools
import socket
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

import trio

import lbmr_proto as L
from lbmr_proto import (
    TIR,
    TQR,
    OtidOption,
    Packet,
    SourceIdOption,
    SourceTypeOption,
    TcpTransport,
    encode,
    lbmc,
    lbmc_stream,
    lbtru,
)
from lbmr_proto.um import synthesize_otid
from lbmr_tools.sim.dataplane import (
    RequestPort,
    RuLiveReceiver,
    RuLiveSource,
    TcpDataReceiver,
    TcpDataSource,
    UmTcpReceiver,
    UmTcpSource,
)
from lbmrd.server import Daemon, Settings
from router import peerlink as P
from router.config import ConfigError, RouterConfig, load_config
from router.config.model import (
    RouteInfoConfig,
    acceptor_peer,
    initiator_peer,
    lbmrd_endpoint,
    router_config,
)
from router.core.bridge import Bridge
from router.core.bridge_outputs import SendFrame
from router.core.routing import Routing
from router.core.tr import PortalTR, PortalTRSettings
from router.core.transit import Transit
from router.peerlink import PeerConnection, RouterIdentity, State
from router.shell.router import MultiRouter
from router.shell.single import Router
from tests.helpers import expect_config_error, write

# --------------- TR datagrams, advertisements and a bridge for the sans-IO cores (times explicit)


GROUP = ("239.192.1.1", 12965)
APP = ("10.1.0.5", 12965)
TOPIC = "md.quotes"
OTID = bytes([0]) + bytes(range(1, 31)) + b"\x01"


def bridge(domain: int = 1, name: str = "A") -> Bridge:
    """A bridge over a multicast portal of ``domain`` (at GROUP) named ``name``, at time 0."""
    tr = PortalTR(PortalTRSettings(name, domain, src_id=name.encode() * 8, mode="multicast", multicast=GROUP,
                                   source_timeout=3.0, requery_interval=1.0), now=0.0)
    return Bridge(tr)


def dgram(*, tqrs=(), tirs=(), src_id=b"APPCTX01", src_type=0) -> bytes:
    """A TR datagram from a UM context ``src_id``: TQRs for the topics ``tqrs`` and the TIRs
    ``tirs``."""
    opts = [SourceIdOption(0x8000, src_id), SourceTypeOption(0x80, src_type)]
    return encode(Packet(type=0, version=1, tqrs=[TQR(t) for t in tqrs], tirs=list(tirs), options=opts))


def source_tir(topic=TOPIC, port=14371, otid=OTID) -> TIR:
    """The TIR of a TCP source of ``topic`` at 10.1.0.5:``port`` with the OTID ``otid``."""
    return TIR(topic, TcpTransport("10.1.0.5", port), 60, 7, [OtidOption(0x8000, otid)])


def frames(b: Bridge) -> list:
    """The peer frames the bridge ``b`` has to send now."""
    return [o.frame for o in b.outputs() if isinstance(o, SendFrame)]


def advert(aid=11, topic=TOPIC, domain=2, transport=P.StreamKind.TCP, withdraw=False):
    """An ADVERTISEMENT frame of a proxy ``aid`` for ``topic`` (from domain ``domain``;
    ``withdraw``: a withdrawal)."""
    return P.Advertisement(topic, domain, OTID, transport, aid, withdraw)


def portal(**kw):
    """A multicast portal's topic resolution (PortalTR "A", domain 1, at GROUP) at time 0;
    ``kw``: more settings."""
    return PortalTR(PortalTRSettings("A", 1, src_id=b"AAAAAAAA", mode="multicast", multicast=GROUP, **kw), now=0.0)


def use_queries(out) -> list[tuple[str, int]]:
    """(name, flags) of the use queries in the datagrams ``out``."""
    from lbmr_proto import decode

    got = []
    for o in out:
        pkt = decode(o.data)
        if pkt.type == 4:
            got += [(m.name, m.flags) for m in pkt.tmb.tmrs if m.type == 1 and not m.flags & 0x80]
    return got


def run_until(tr, until, step_events=None):
    """tick at every deadline up to ``until``: [(time, outgoing list, events)]."""
    log = []
    for _ in range(100_000):
        t = tr.next_deadline()
        if t > until:
            return log
        out = tr.tick(t)
        log.append((t, out, tr.events()))
    raise AssertionError("too many deadlines")


# ---------------------------------------------------------------------------- configuration files


ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"


def expect_error(tmp_path: Path, name: str, text: str, marker: str, *needles: str,
                 offset: int = 0) -> ConfigError:
    """Loading fails at the line of ``marker`` (+ offset); the message has every needle."""
    return expect_config_error(load_config, ConfigError, tmp_path, name, text, marker, *needles,
                               offset=offset)


def expect_ok(tmp_path: Path, name: str, text: str) -> RouterConfig:
    """Loads ``text`` as the file ``name``: the configuration."""
    return load_config(write(tmp_path, name, text))


HEAD = '<?xml version="1.0" encoding="UTF-8" ?>\n'
DAEMON = """\
  <daemon>
    <name>router-x</name>
  </daemon>
"""
TR_LBMRD = """\
      <topic-resolution>
        <lbmrd address="10.1.1.50"/>
      </topic-resolution>
"""
TR_MULTICAST = """\
      <topic-resolution>
        <multicast group="239.192.0.1" port="13000" interface="10.2.0.0/16"/>
      </topic-resolution>
"""
INITIATOR = """\
        <initiator>
          <address>203.0.113.7</address>
          <port>26123</port>
        </initiator>
"""
ACCEPTOR = """\
        <acceptor>
          <listen-port>26123</listen-port>
        </acceptor>
"""


def endpoint(tr: str = TR_LBMRD, *, name: str = "ep", domain: str = "1", extra: str = "") -> str:
    """An ``<endpoint>`` element: ``tr`` (a ``<topic-resolution>``), then ``extra``."""
    return (f"    <endpoint>\n      <name>{name}</name>\n      <domain-id>{domain}</domain-id>\n"
            f"{tr}{extra}    </endpoint>\n")


def peer(link: str = INITIATOR, *, name: str = "pe", tcp_head: str = "", after: str = "") -> str:
    """A ``<peer>`` element: ``tcp_head`` and ``link`` (``<initiator>`` or ``<acceptor>``) in its
    ``<single-tcp>``, ``after`` it."""
    return (f"    <peer>\n      <name>{name}</name>\n      <single-tcp>\n{tcp_head}{link}"
            f"      </single-tcp>\n{after}    </peer>\n")


def doc(*, root: str = '<lbmr-router version="1.0">', daemon: str = DAEMON,
        portals: str | None = None) -> str:
    """A whole lbmr-router file: ``root`` element, ``daemon`` and the ``portals`` (an endpoint
    and a peer unless given)."""
    if portals is None:
        portals = endpoint() + peer()
    return f"{HEAD}{root}\n{daemon}  <portals>\n{portals}  </portals>\n</lbmr-router>\n"


# --------------------------------------------- lbmrds, routers, sources and receivers on loopback


ROUTED_TOPIC = "md.routed.1"


async def start_lbmrd(nursery, ip):
    """An in-process lbmrd on ``ip`` (a free port): (daemon, its address)."""
    d = Daemon(Settings(bind_ip=ip, port=0, stats_interval=0))
    return d, await nursery.start(d.run)


async def start_routers(nursery, trd1, trd2, *, reconnect=1.0, **endpoint):
    """Router B (acceptor, TRD2) and router A (initiator, TRD1); ``endpoint``:
    more EndpointConfig fields for both. The TCP sources of these tests send
    byte patterns, not LBMC: the routers relay each connection on its own
    (``fanout=False``) unless told otherwise (fan-out: tests/router/relays/test_fanout_relay.py)."""
    endpoint.setdefault("fanout", False)
    rb = Router("routerB", lbmrd_endpoint("B-TRD2", 2, [trd2], interface="127.0.2.1", **endpoint),
                acceptor_peer("B-to-A", 0, interface="127.0.0.1"))
    b_addr = await nursery.start(rb.run)
    ra = Router("routerA", lbmrd_endpoint("A-TRD1", 1, [trd1], interface="127.0.1.1", **endpoint),
                initiator_peer("A-to-B", "127.0.0.1", b_addr["peer"][1],
                               reconnect_interval_ms=round(reconnect * 1000)))
    await nursery.start(ra.run)
    return ra, rb


def pattern(n: int) -> bytes:
    """``n`` bytes of the known pattern the TCP sources serve."""
    block = hashlib.sha256(b"lbmr").digest() * 2048  # 64 KiB
    return (block * (n // len(block) + 1))[:n]


async def tcp_source(nursery, ip, total):
    """A TCP 'source': serves `total` bytes of a known pattern to each connection
    (a connection the other side resets just ends)."""
    data = pattern(total)

    async def handler(stream):
        try:
            await stream.send_all(data)
        except trio.BrokenResourceError:
            pass
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host=ip)
    nursery.start_soon(trio.serve_listeners, handler, listeners)
    return listeners[0].socket.getsockname()


async def endless_source(nursery, trd, ip="127.0.1.5", topic=ROUTED_TOPIC) -> trio.CancelScope:
    """A TCP source at ``ip`` that sends to every connection until it dies, and
    advertises itself in ``trd``; cancelling the returned scope kills it (its
    sockets close, it advertises no more)."""
    scope = trio.CancelScope()

    async def handler(stream):
        async with stream:
            try:
                while True:
                    await stream.send_all(b"x" * 1000)
                    await trio.sleep(0.01)
            except trio.BrokenResourceError:
                pass  # that receiver (the router) went away: the source serves the others

    listeners = await trio.open_tcp_listeners(0, host=ip)
    addr = listeners[0].socket.getsockname()

    async def run():
        with scope:
            async with trio.open_nursery() as sn:
                sn.start_soon(trio.serve_listeners, handler, listeners)
                sn.start_soon(advertise_forever, udp(ip), trd, *addr, topic)

    nursery.start_soon(run)
    return scope


def tir_packet(ip, port, topic=ROUTED_TOPIC):
    """A TR datagram with the TIR of a TCP source of ``topic`` at ``ip``:``port``."""
    otid = synthesize_otid(L.TcpTransport(ip, port), 7)
    return L.encode(L.Packet(0, 1, tirs=[L.TIR(topic, L.TcpTransport(ip, port), 60, 7,
                                               [L.OtidOption(0x8000, otid)])]))


def tirs_in(data: bytes) -> list:
    """The TIRs of a TR datagram (none if it does not decode)."""
    try:
        return L.decode(data).tirs
    except L.LBMRDecodeError:
        return []


async def resolve(sock, daemon, timeout=10.0, topic=ROUTED_TOPIC):
    """Act as a UM receiver in a TRD: query ``topic`` until a TIR for it arrives."""
    tqr = L.encode(L.Packet(0, 1, tqrs=[L.TQR(topic)]))
    with trio.fail_after(timeout):
        while True:
            await sock.sendto(tqr, daemon)
            with trio.move_on_after(0.2):
                while True:
                    data, _ = await sock.recvfrom(65535)
                    for t in tirs_in(data):
                        final = any(isinstance(o, L.CostOption) and o.cost == -1 for o in t.options or ())
                        if t.topic == topic and not final:  # a final advertisement withdraws
                            return t


async def advertise_forever(sock, daemon, ip, port, topic=ROUTED_TOPIC):
    """Advertise the TCP source at ``ip``:``port`` for ``topic`` to the lbmrd ``daemon`` every
    0.5 s."""
    data = tir_packet(ip, port, topic)
    while True:
        await sock.sendto(data, daemon)
        await trio.sleep(0.5)


async def rm_source(nursery, trd, topic, *, count, rate, size=1400, ip="127.0.1.5", ctx_ip="127.0.1.6",
                    group=("239.192.9.9", 15009), session_id=0x5151, seed=11):
    """An LBT-RM source (lbmr-sim's RmDataSource: ``count`` datagrams of ``size``
    bytes at ``rate`` a second to ``group``) at ``ip``, advertised for ``topic``
    in the lbmrd ``trd`` from ``ctx_ip`` every 0.5 s; returns the source."""
    from lbmr_tools.sim.dataplane import RmDataSource

    src = RmDataSource(ip, 0, group=group[0], dest_port=group[1], session_id=session_id, count=count,
                       seed=seed, rate=rate, datagram_size=size)
    sip, sport = await nursery.start(src.serve)
    tir = L.encode(L.Packet(0, 1, tirs=[L.TIR(topic, L.LbtrmTransport(sip, group[0], session_id, group[1], sport),
                                              60, 3)]))
    ctx = udp(ctx_ip)

    async def advertise():
        while True:
            await ctx.sendto(tir, trd)
            await trio.sleep(0.5)

    nursery.start_soon(advertise)
    return src


def udp(ip):
    """A trio UDP socket bound to ``ip`` (a free port)."""
    s = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    s._sock.bind((ip, 0))
    return s


async def fetch(ip, port, limit=None):
    """Every byte a TCP connection to ``ip``:``port`` delivers until it closes (within 60 s)."""
    stream = await trio.open_tcp_stream(ip, port)
    got = bytearray()
    with trio.fail_after(60):
        while chunk := await stream.receive_some(1 << 16):
            got += chunk
    await stream.aclose()
    return bytes(got)


def make_certs(tmp, name, ca_key, ca_crt):
    """A certificate for CN ``name`` signed by the CA (``ca_key``, ``ca_crt``), made by openssl
    in ``tmp``: (certificate path, key path)."""
    subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{tmp}/{name}.key",
                    "-out", f"{tmp}/{name}.csr", "-subj", f"/CN={name}"], check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", f"{tmp}/{name}.csr", "-CA", ca_crt, "-CAkey", ca_key,
                    "-CAcreateserial", "-out", f"{tmp}/{name}.pem", "-days", "2"], check=True,
                   capture_output=True)
    return f"{tmp}/{name}.pem", f"{tmp}/{name}.key"


def make_ca(tmp, name):
    """A self-signed CA named ``name``, made by openssl in ``tmp``: (key path, certificate path)."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{tmp}/{name}.key",
                    "-out", f"{tmp}/{name}.pem", "-days", "2", "-subj", f"/CN={name}"], check=True,
                   capture_output=True)
    return f"{tmp}/{name}.key", f"{tmp}/{name}.pem"


def ep(name, dom, trd, ip):
    """An endpoint portal; its TCP sources send byte patterns, not LBMC: each
    receiver connection relayed on its own."""
    return lbmrd_endpoint(name, dom, [trd], interface=ip, fanout=False)


async def fetch_tcp(tir, total):
    """Every byte the TCP source (or proxy) of ``tir`` serves."""
    return await fetch(tir.transport.ip, tir.transport.port)


async def ru_through(n, src_ip, trd, other_trd, rcv_ip, relay_ip, topic, count=5000):
    """An LBT-RU source (lbmr_tools.sim.dataplane) at ``src_ip`` advertised in
    ``trd``; a receiver at ``rcv_ip`` resolves it in ``other_trd`` at
    ``relay_ip`` and gets every datagram, verified."""
    from lbmr_tools.sim.dataplane import RuDataReceiver, RuDataSource

    src = RuDataSource(src_ip, count=count, seed=3, rate=20_000.0)
    sip, sport = await n.start(src.serve)
    otid = synthesize_otid(L.LbtruTransport(sip, sport), 7)
    pkt = L.encode(L.Packet(0, 1, tirs=[L.TIR(topic, L.LbtruTransport(sip, sport), 60, 7,
                                              [L.OtidOption(0x8000, otid)])]))
    ctx = udp(src_ip)

    async def adv():
        while True:
            await ctx.sendto(pkt, trd)
            await trio.sleep(0.5)

    n.start_soon(adv)
    t = await resolve(udp(rcv_ip), other_trd, topic=topic)
    assert t.transport.NAME == "LBTRU" and t.transport.ip == relay_ip
    res = await RuDataReceiver(t.transport.ip, t.transport.port, seed=3, expect_count=count,
                               bind_ip=rcv_ip, idle_timeout=5.0, timeout=60.0).run()
    assert res.error is None and res.corrupt == 0, res
    assert res.received == count and res.end_count == count, res


async def count_proxies(sock, counts, stop):
    """Collect the (topic, OTID, address) of every router TIR seen by ``sock``."""
    while not stop.is_set():
        data, _ = await sock.recvfrom(65535)
        for t in tirs_in(data):
            otid = next((o.otid for o in t.options or () if isinstance(o, L.OtidOption)), b"")
            counts[t.topic].add((otid, t.transport.ip, t.transport.port))


async def every_trd_gets_the_others(n, ips, trds):
    """A TCP source of ``topic.<d>`` in each TRD d: a receiver in every TRD
    resolves every other TRD's topic at its own TRD's router address and gets
    its bytes exactly; then each topic is advertised once per TRD."""
    sources = {}
    for d in ips:
        ip = f"127.0.{d}.5"
        sources[d] = await tcp_source(n, ip, 1000 * d)
        n.start_soon(advertise_forever, udp(ip), trds[d], *sources[d], f"topic.{d}")
    for d in ips:
        rcv = udp(f"127.0.{d}.9")
        for k in ips:
            if k != d:
                tir = await resolve(rcv, trds[d], topic=f"topic.{k}")
                assert tir.transport.ip == ips[d]
                assert await fetch_tcp(tir, 1000 * k) == pattern(1000 * k)
    await each_topic_once_per_trd(ips, trds, sources)


async def each_topic_once_per_trd(ips, trds, sources, listen=3.0):
    """A second receiver in each TRD asks for every topic and listens for
    ``listen`` s: its own TRD's topic has only the real source (a router never
    advertises it back), every other topic exactly one proxy (one OTID, one
    address: this TRD's router address)."""
    counts = {d: defaultdict(set) for d in ips}
    stop = trio.Event()
    async with trio.open_nursery() as watch:
        for d in ips:
            s = udp(f"127.0.{d}.10")
            tqr = L.encode(L.Packet(0, 1, tqrs=[L.TQR(f"topic.{k}") for k in ips]))
            await s.sendto(tqr, trds[d])  # registers with the lbmrd, asks everything
            watch.start_soon(count_proxies, s, counts[d], stop)
            watch.start_soon(requery, s, tqr, trds[d])
        await trio.sleep(listen)
        stop.set()
        watch.cancel_scope.cancel()
    for d in ips:
        for k in ips:
            seen = counts[d][f"topic.{k}"]
            if k == d:
                assert seen == {(synthesize_otid(L.TcpTransport(*sources[k]), 7), *sources[k])}, seen
            else:
                assert len(seen) == 1 and next(iter(seen))[1] == ips[d], (d, k, seen)


async def requery(sock, tqr, trd):
    """Send the TQR datagram ``tqr`` to the lbmrd ``trd`` every 0.5 s."""
    while True:
        await trio.sleep(0.5)
        await sock.sendto(tqr, trd)


IPS = {d: f"127.0.{d}.1" for d in range(1, 5)}
ROUTE_INFO = RouteInfoConfig(propagation_interval_ms=500, timeout_ms=2000)


async def converged(routers, domains, timeout=10.0):
    """Wait (at most ``timeout`` s) until every router in ``routers`` has a route to every domain
    in ``domains``."""
    with trio.fail_after(timeout):
        while not all(set(map(int, r.status()["topology"]["routes"])) >= set(domains) for r in routers):
            await trio.sleep(0.02)


def multihop_router(name, d, trd, peers):
    """A router ``name`` with an endpoint in TRD ``d`` (the lbmrd ``trd``, at IPS[d]) and the
    ``peers``, exchanging route info every 0.5 s (ROUTE_INFO)."""
    return MultiRouter(router_config(name, [lbmrd_endpoint(f"T{d}", d, [trd], interface=IPS[d], fanout=False)],
                                     peers,
                                     route_info=ROUTE_INFO))


def acceptor_link(name, cost=1):
    """An acceptor peer ``name`` on 127.0.0.1 (a free port) of ``cost``."""
    return acceptor_peer(name, 0, interface="127.0.0.1", cost=cost)


def initiator_link(name, addr, cost=1):
    """An initiator peer ``name`` connecting to ``addr`` (retrying every 0.2 s) of ``cost``."""
    return initiator_peer(name, addr[0], addr[1], reconnect_interval_ms=200, cost=cost)


class Cuttable:
    """A TCP forwarder on 127.0.0.1 between two routers: :meth:`cut` closes
    every connection through it and stops accepting (a link cut)."""

    def __init__(self, target):
        self.target = target
        self.scope = trio.CancelScope()

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED):
        with self.scope:
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            task_status.started(listeners[0].socket.getsockname())
            await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, a):
        async with a, await trio.open_tcp_stream(*self.target) as b:
            async with trio.open_nursery() as n:
                n.start_soon(pump, a, b)
                n.start_soon(pump, b, a)

    def cut(self):
        self.scope.cancel()


async def pump(src, dst):
    """Copy ``src`` to ``dst`` until ``src`` ends or either breaks; then close ``dst``."""
    try:
        while data := await src.receive_some(65536):
            await dst.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await trio.aclose_forcefully(dst)


async def start_loop(n):
    """A loop of three routers, one TRD each: r1 - r2 - r3 the cheap way (cost 2
    a link), r1 - r3 direct the dear one (cost 10), the r1-r2 link through a
    :class:`Cuttable` forwarder. Returns (routers, trds, forwarder) once the
    routes have converged."""
    trds = {d: (await start_lbmrd(n, IPS[d]))[1] for d in (1, 2, 3)}
    r2 = multihop_router("r2", 2, trds[2], [acceptor_link("2-1"), acceptor_link("2-3")])
    p21, p23 = (lk["peer"] for lk in (await n.start(r2.run))["links"])
    r3 = multihop_router("r3", 3, trds[3], [acceptor_link("3-1", cost=5), initiator_link("3-2", p23)])
    p31 = (await n.start(r3.run))["links"][0]["peer"]
    fwd = Cuttable(p21)
    via = await n.start(fwd.serve)
    r1 = multihop_router("r1", 1, trds[1], [initiator_link("1-2", via), initiator_link("1-3", p31, cost=5)])
    await n.start(r1.run)
    await converged((r1, r2, r3), (1, 2, 3))
    return (r1, r2, r3), trds, fwd


# ----- lbmr-sim's live sources and receivers through a router pair joined by a counting forwarder


SRC_IP = "127.0.1.5"
TCP_SEED, TCP_TIDX, TCP_SID = 21, 3, 0x5EED


class Forwarder:
    """A TCP forwarder between two routers' peer ports that counts the bytes
    of each direction (``a_to_b``: from the initiator, A, to B); ``pace``:
    bytes per second it relays from A to B (None: as fast as it goes)."""

    def __init__(self, target: tuple[str, int], pace: float | None = None) -> None:
        self.target = target
        self.pace = pace
        self.a_to_b = 0
        self.b_to_a = 0

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[:2])
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, a: trio.SocketStream) -> None:
        b = await trio.open_tcp_stream(*self.target)
        async with a, b, trio.open_nursery() as n:
            n.start_soon(self._copy, a, b, "a_to_b", n.cancel_scope)
            n.start_soon(self._copy, b, a, "b_to_a", n.cancel_scope)

    async def _copy(self, src, dst, name, scope) -> None:
        try:
            paced = self.pace if name == "a_to_b" else None
            while data := await src.receive_some(1 << 14 if paced else 1 << 18):
                setattr(self, name, getattr(self, name) + len(data))
                await dst.send_all(data)
                if paced:
                    await trio.sleep(len(data) / paced)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        scope.cancel()


async def start_forwarded_pair(n, a: dict | None = None, b: dict | None = None, *, pace: float | None = None,
                               **endpoint):
    """lbmrds, router B (TRD2, acceptor), the forwarder (``pace``: its bytes per
    second from A to B), router A (TRD1, initiator to the forwarder);
    ``endpoint``: EndpointConfig fields of both, ``a``/``b``: of one. The link
    is up when it returns. (ra, rb, fwd, trd1, trd2)."""
    _, trd1 = await start_lbmrd(n, "127.0.1.1")
    _, trd2 = await start_lbmrd(n, "127.0.2.1")
    rb = Router("routerB", lbmrd_endpoint("B-TRD2", 2, [trd2], interface="127.0.2.1", **endpoint | (b or {})),
                acceptor_peer("B-to-A", 0, interface="127.0.0.1"))
    b_addr = await n.start(rb.run)
    fwd = Forwarder(b_addr["peer"], pace=pace)
    f_addr = await n.start(fwd.serve)
    ra = Router("routerA", lbmrd_endpoint("A-TRD1", 1, [trd1], interface="127.0.1.1", **endpoint | (a or {})),
                initiator_peer("A-to-B", *f_addr, reconnect_interval_ms=500))
    await n.start(ra.run)
    with trio.fail_after(5):
        while rb.status()["peer"]["state"] != "CONNECTED":
            await trio.sleep(0.05)
    return ra, rb, fwd, trd1, trd2


async def start_forwarded_chain(n):
    """lbmrds of TRD1..3 on 127.0.d.1 and routers r1 - r2 - r3 (r2 the
    acceptor of both links), each link through a counting :class:`Forwarder`
    (``f12.a_to_b``: r1 to r2, ``f32.b_to_a``: r2 to r3). The routers are
    running when it returns: (r1, r2, r3, f12, f32, trds, ips)."""
    from router.config.model import router_config
    from router.shell.router import MultiRouter

    ips = {d: f"127.0.{d}.1" for d in (1, 2, 3)}
    trds = {d: (await start_lbmrd(n, ip))[1] for d, ip in ips.items()}

    def ep(d):
        return lbmrd_endpoint(f"T{d}", d, [trds[d]], interface=ips[d])

    r2 = MultiRouter(router_config("r2", [ep(2)], [acceptor_peer("2-1", 0, interface="127.0.0.1"),
                                                    acceptor_peer("2-3", 0, interface="127.0.0.1")]))
    links = (await n.start(r2.run))["links"]
    f12, f32 = Forwarder(links[0]["peer"]), Forwarder(links[1]["peer"])
    a12, a32 = await n.start(f12.serve), await n.start(f32.serve)
    r1 = MultiRouter(router_config("r1", [ep(1)], [initiator_peer("1-2", *a12, reconnect_interval_ms=300)]))
    r3 = MultiRouter(router_config("r3", [ep(3)], [initiator_peer("3-2", *a32, reconnect_interval_ms=300)]))
    await n.start(r1.run)
    await n.start(r3.run)
    return r1, r2, r3, f12, f32, trds, ips


async def tcp_live_source(n, trd1, **kw) -> tuple[TcpDataSource, trio.CancelScope]:
    """lbmr-sim's live TCP source at SRC_IP, advertised in TRD1; cancelling the
    scope ends the session (the source closes every connection, and advertises
    no more)."""
    src = TcpDataSource(SRC_IP, 0, seed=TCP_SEED, tidx=TCP_TIDX, session_id=TCP_SID, **kw)
    scope = trio.CancelScope()

    async def run(task_status):
        with scope:
            async with trio.open_nursery() as sn:
                ip, port = await sn.start(src.serve)
                sn.start_soon(advertise_forever, udp(SRC_IP), trd1, ip, port)
                task_status.started()

    await n.start(run)
    return src, scope


def tcp_receiver(tir, k: int, **kw) -> TcpDataReceiver:
    """lbmr-sim's verifying receiver of the live TCP source, connecting to the proxy of ``tir``
    from 127.0.2.(20 + ``k``)."""
    return TcpDataReceiver(tir.transport.ip, tir.transport.port, None, TCP_SEED, tidx=TCP_TIDX,
                           bind_ip=f"127.0.2.{20 + k}", timeout=60, **kw)


RU_SEED, RU_TIDX, RU_SID = 33, 4, 0x5E55
RU_SIZE = 1000  # bytes per DATA datagram


def ru_tir(ip: str, port: int, topic: str = ROUTED_TOPIC) -> bytes:
    """A TR datagram with the TIR of the live LBT-RU source's session at ``ip``:``port`` for
    ``topic``."""
    return L.encode(L.Packet(0, 1, tirs=[L.TIR(topic, L.LbtruSessionTransport(ip, RU_SID, port), 60, 7)]))


async def ru_live_source(n, trd1, *, rate: float = 2000, topic: str = ROUTED_TOPIC) -> tuple[RuLiveSource, trio.CancelScope]:
    """lbmr-sim's live LBT-RU source at SRC_IP, advertised for ``topic`` in TRD1
    every 0.5 s; cancelling the scope ends the session (an RST to every
    client, no more TIRs)."""
    src = RuLiveSource(SRC_IP, 0, seed=RU_SEED, tidx=RU_TIDX, session_id=RU_SID, rate=rate, datagram_size=RU_SIZE)
    scope = trio.CancelScope()

    async def advertise(ip, port):
        sock = udp(SRC_IP)
        while True:
            await sock.sendto(ru_tir(ip, port, topic), trd1)
            await trio.sleep(0.5)

    async def run(task_status):
        with scope:
            async with trio.open_nursery() as sn:
                ip, port = await sn.start(src.serve)
                sn.start_soon(advertise, ip, port)
                task_status.started()

    await n.start(run)
    return src, scope


def ru_receiver(tir, k: int, expect: int, **kw) -> RuLiveReceiver:
    """lbmr-sim's verifying receiver of the live LBT-RU source at the proxy of ``tir``, from
    127.0.2.(20 + ``k``), expecting ``expect`` datagrams."""
    return RuLiveReceiver(tir.transport.ip, tir.transport.port, expect_count=expect, seed=RU_SEED, tidx=RU_TIDX,
                          session_id=tir.transport.session_id, bind_ip=f"127.0.2.{20 + k}", timeout=30, **kw)


async def run_all(rxs) -> list:
    """Run the receivers ``rxs`` at once; their results in the order they finished."""
    results = []

    async def run(rx, task_status):
        results.append(await rx.run(task_status=task_status))

    async with trio.open_nursery() as rn:
        for rx in rxs:
            await rn.start(run, rx)
    return results


# ---------------- a peer of our own, and peer connections or routers wired back to back in memory


def acceptor_router(trd2, **peer):
    """Router B: an endpoint in TRD2 (127.0.2.1, the lbmrd ``trd2``) and an acceptor peer on
    127.0.0.1; ``peer``: more peer settings."""
    return Router("routerB", lbmrd_endpoint("B", 2, [trd2], interface="127.0.2.1"),
                  acceptor_peer("B-to-A", 0, interface="127.0.0.1", **peer))


async def connect_as_peer(addr, name="evil", domain=1, rcvbuf=None, capabilities=P.DEFAULT_CAPABILITIES):
    """A peer of our own (announcing ``capabilities``): connects, completes the handshake;
    (stream, conn)."""
    sock = trio.socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.connect(addr)
    stream = trio.SocketStream(sock)
    conn = P.PeerConnection("initiator", P.RouterIdentity(name, (domain,), int(capabilities)))
    await stream.send_all(conn.start(trio.current_time()))
    with trio.fail_after(5):
        while not any(isinstance(e, P.Connected) for e in conn.receive_data(await stream.receive_some(65536),
                                                                            trio.current_time())):
            pass
    await stream.send_all(conn.data_to_send())  # CONNECT_OK
    return stream, conn


A_ID = RouterIdentity("router-a", (1, 2))
B_ID = RouterIdentity("router-b", (3,))


def peer_pair(a_id=A_ID, b_id=B_ID, **kw):
    """Two peer connections, A the initiator and B the acceptor; ``kw``: settings of both, or of
    one with an ``a_`` or ``b_`` prefix."""
    a_kw = {k[2:]: v for k, v in kw.items() if k.startswith("a_")}
    b_kw = {k[2:]: v for k, v in kw.items() if k.startswith("b_")}
    common = {k: v for k, v in kw.items() if not k.startswith(("a_", "b_"))}
    a = PeerConnection("initiator", a_id, nonce=0xA, **common, **a_kw)
    b = PeerConnection("acceptor", b_id, nonce=0xB, **common, **b_kw)
    return a, b


def peer_handshake(a, b, now=0.0):
    """Run the handshake; returns (events of a, events of b)."""
    ea, eb = [], []
    b.start(now)
    req = a.start(now)
    eb += b.receive_data(req, now)
    resp = b.data_to_send()
    if resp:
        ea += a.receive_data(resp, now)
    ok = a.data_to_send()
    if ok:  # (b"" would mean EOF)
        eb += b.receive_data(ok, now)
    return ea, eb


def connected_peers(now=0.0, **kw):
    """A :func:`peer_pair` after its handshake at ``now``, both CONNECTED."""
    a, b = peer_pair(**kw)
    peer_handshake(a, b, now)
    assert a.state is b.state is State.CONNECTED
    return a, b


def deliver_and_answer(src, dst, data, now):
    """Deliver ``data`` to ``dst``, then deliver its automatic answers back to ``src``."""
    evs = dst.receive_data(data, now)
    back = dst.data_to_send()
    if back:
        src.receive_data(back, now)
    return evs


class Net:
    """Routers named by letter; router X serves domain ord(X) - 64 (A=1, B=2 ...)
    unless told otherwise; link names are "X-Y" as seen from X."""

    def __init__(self, names, domains=None, **kw):
        ids = itertools.count(1)
        self.r = {}
        self.t = {}
        for n in names:
            doms = (domains or {}).get(n, {ord(n) - 64: 1})
            self.r[n] = Routing(n, doms, now=0.0, **kw)
            self.t[n] = Transit(self.r[n], ids)
        self.up: set[tuple[str, str]] = set()
        self.local: dict[str, set[tuple[str, int]]] = {x: set() for x in names}  # receivers' interest
        self.sent: dict[tuple[str, str], set] = {}  # local interest sent, by (router, link)
        self.got: list[tuple[str, str, P.Frame]] = []  # (to router, link, frame) of interest/adverts
        self.now = 0.0

    def deliver(self, sender, outputs):
        queue = [(sender, o) for o in outputs]
        while queue:
            frm, o = queue.pop(0)
            to = o.link.split("-")[1]
            if (frm, to) not in self.up:
                continue
            back = f"{to}-{frm}"
            if isinstance(o.frame, P.Topology):
                queue += [(to, x) for x in self.r[to].on_topology(back, o.frame, self.now)]
            else:
                self.got.append((to, back, o.frame))
                if isinstance(o.frame, P.Interest):
                    queue += [(to, x) for x in self.t[to].on_interest(back, o.frame)]
            queue += [(to, x) for x in self.resync(to)]

    def resync(self, name):
        """Transit's resync and the bridges' (local interest where the routes say)."""
        out = self.t[name].resync()
        from router.core.transit import SendOnLink

        dom = next(iter(self.r[name].domains))
        kids = set(self.r[name].children_links(dom))
        for link in self.r[name].links():
            sent = self.sent.setdefault((name, link), set())
            want = self.local[name] if link in kids else set()
            for topic, pt in want - sent:
                out.append(SendOnLink(link, P.Interest(P.InterestAction.ADD, topic, dom, P.PatternType(pt))))
            for topic, pt in sent - want:
                out.append(SendOnLink(link, P.Interest(P.InterestAction.CANCEL, topic, dom, P.PatternType(pt))))
            self.sent[(name, link)] = set(want)
        return out

    def link(self, a, b, cost=1):
        self.up |= {(a, b), (b, a)}
        out_a = self.r[a].link_up(f"{a}-{b}", b, cost, self.now)  # both ends connected, then
        out_b = self.r[b].link_up(f"{b}-{a}", a, cost, self.now)  # their frames cross
        self.deliver(a, out_a)
        self.deliver(b, out_b)

    def cut(self, a, b):
        self.up -= {(a, b), (b, a)}
        self.deliver(a, self.r[a].link_down(f"{a}-{b}", self.now) + self.t[a].link_down(f"{a}-{b}"))
        self.deliver(b, self.r[b].link_down(f"{b}-{a}", self.now) + self.t[b].link_down(f"{b}-{a}"))

    def want(self, name, topic, ptype=P.PatternType.TOPIC):
        """Receivers in ``name``'s domain want ``topic``: the interest goes where
        the routes say (what the bridges do with their local interest)."""
        self.local[name].add((topic, int(ptype)))
        self.deliver(name, self.resync(name))

    def adds(self, topic):
        return Counter(to for to, _, f in self.got
                       if isinstance(f, P.Interest) and f.topic == topic and f.action == P.InterestAction.ADD)


# ---------------- requests and responses: a UM-like requester (a TCP source whose messages are
# requests) and responders (receivers that answer each request on a connection of their own)

REQ_TOPIC = "md.requests.1"
REQ_TIDX, REQ_SID = 5, 0x7E9


def request_payload(qidx: int) -> bytes:
    return b"request %d: what is the price?" % qidx


def response_payload(qidx: int, responder: int) -> bytes:
    """What responder ``responder`` answers to request ``qidx`` (the qidx first, u32 big-endian:
    the router never looks at a response; the requester checks it)."""
    return qidx.to_bytes(4, "big") + b" answer %d from responder %d" % (qidx, responder)


class Requester:
    """A UM-like TCP source at ``ip`` whose session is ``count`` requests: each connection
    (the router's upstream) gets the session's TCP_SID control message, then ``count`` data
    messages (topic index REQ_TIDX, sqn 0..), each with a REQUEST header naming the
    requester's request port (qidx ``first_qidx`` + i), one every ``interval`` seconds,
    then ``plain`` messages with no header every ``interval`` (a live session) until it is
    cancelled. Its request port (``request_port``, at ``ip``) records each connection's peer
    (``callers``) and every whole LBMC message it receives (``responses``: (peer ip, message)).
    ``spread``: request i names requester 127.0.1.99:(20000 + i) instead (a distinct requester
    each, where nobody listens), and they go in bursts of ``burst`` requests, ``interval`` apart."""

    def __init__(self, ip: str = SRC_IP, *, count: int = 20, first_qidx: int = 100, interval: float = 0.02,
                 request_ip: str | None = None, request_port: int | None = None, spread: bool = False,
                 burst: int = 500) -> None:
        self.ip, self.count, self.first_qidx, self.interval = ip, count, first_qidx, interval
        self.spread, self.burst = spread, burst
        self.request_ip = request_ip or ip
        self.request_port = request_port  # None: the listener's own (set by serve)
        self.source: tuple[str, int] | None = None
        self.callers: list[tuple[str, int]] = []
        self.responses: list[tuple[str, bytes]] = []
        self.connections = 0

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        src = await trio.open_tcp_listeners(0, host=self.ip)
        req = await trio.open_tcp_listeners(0, host=self.request_ip)
        self.source = src[0].socket.getsockname()[:2]
        if self.request_port is None:
            self.request_port = req[0].socket.getsockname()[1]
        async with trio.open_nursery() as n:
            n.start_soon(trio.serve_listeners, self._session, src)
            n.start_soon(trio.serve_listeners, self._answers, req)
            task_status.started(self.source)

    def messages(self) -> list[bytes]:
        sid = lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(lbmc.TcpSidHeader(session_id=REQ_SID),)))
        out = [sid]
        for i in range(self.count):
            q = self.first_qidx + i
            ip, port = ("127.0.1.99", 20000 + i) if self.spread else (self.request_ip, self.request_port)
            h = lbmc.RequestHeader(transport=0, qidx=q, port=port, ipaddr=ip)
            out.append(lbmc.data_message(REQ_TIDX, i, request_payload(q), h))
        return out

    async def _session(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        msgs = self.messages()
        try:
            async with stream:
                await stream.send_all(msgs[0])
                if self.spread:
                    for k in range(1, len(msgs), self.burst):
                        await stream.send_all(b"".join(msgs[k:k + self.burst]))
                        await trio.sleep(self.interval)
                for m in [] if self.spread else msgs[1:]:
                    await stream.send_all(m)
                    await trio.sleep(self.interval)
                sqn = self.count
                while True:
                    await stream.send_all(lbmc.data_message(REQ_TIDX, sqn, b"tick"))
                    sqn += 1
                    await trio.sleep(self.interval)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _answers(self, stream: trio.SocketStream) -> None:
        peer = stream.socket.getpeername()[:2]
        self.callers.append(peer)
        framer = lbmc_stream.StreamFramer()
        try:
            async with stream:
                while data := await stream.receive_some(65536):
                    for m in framer.feed(data):
                        self.responses.append((peer[0], m))
        except (trio.BrokenResourceError, trio.ClosedResourceError, lbmc.LbmcDecodeError):
            pass

    def answers(self) -> Counter:
        """(qidx, payload) -> how many times it was answered (payloads of data messages)."""
        got: Counter = Counter()
        for _, m in self.responses:
            d = lbmc.decode(m)
            got[int.from_bytes(d.payload[:4], "big"), d.payload] += 1
        return got


class Responders:
    """A receiver of the requests' topic in the receivers' TRD: connects to the proxy
    ``proxy`` (ip, port) from ``bind_ip``, reads the session, and answers every request:
    ``per_request`` responders, each a connection of its own (from ``bind_ip``) to the
    address the REQUEST header names, sending one response (:func:`response_payload`),
    then closing. ``requests``: the REQUEST headers seen, in order (``payloads``: the
    requests' payloads); ``failed``: answers
    whose connection failed."""

    def __init__(self, proxy: tuple[str, int], *, bind_ip: str = "127.0.2.30", per_request: int = 1) -> None:
        self.proxy, self.bind_ip, self.per_request = proxy, bind_ip, per_request
        self.requests: list[lbmc.RequestHeader] = []
        self.payloads: list[bytes] = []  # of the requests
        self.first: list[bytes] = []  # the first 100 messages of the session, as they came
        self.messages = 0
        self.failed = 0
        self.answered = 0

    async def run(self, *, until: int, timeout: float = 20.0) -> None:
        """Until ``until`` requests were seen and answered (trio.TooSlowError after ``timeout``)."""
        sock = trio.socket.socket()
        await sock.bind((self.bind_ip, 0))
        await sock.connect(self.proxy)
        stream = trio.SocketStream(sock)
        framer = lbmc_stream.StreamFramer()
        with trio.fail_after(timeout):
            async with stream, trio.open_nursery() as n:
                while len(self.requests) < until:
                    data = await stream.receive_some(65536)
                    if not data:
                        break
                    for m in framer.feed(data):
                        self.messages += 1
                        if len(self.first) < 100:
                            self.first.append(m)
                        d = lbmc.decode(m)
                        h = d.header(lbmc.RequestHeader)
                        if h is not None:
                            self.requests.append(h)
                            self.payloads.append(d.payload)
                            for k in range(self.per_request):
                                n.start_soon(self._answer, h, k)
            while self.answered + self.failed < len(self.requests) * self.per_request:
                await trio.sleep(0.01)

    async def answer(self, messages: list[bytes], timeout: float = 20.0) -> None:
        """Answer the requests among ``messages`` (whole LBMC messages got some other way:
        an LBT-RU or LBT-RM session), as :meth:`run` does."""
        with trio.fail_after(timeout):
            async with trio.open_nursery() as n:
                for m in messages:
                    d = lbmc.decode(m)
                    h = d.header(lbmc.RequestHeader)
                    if h is not None:
                        self.requests.append(h)
                        self.payloads.append(d.payload)
                        for k in range(self.per_request):
                            n.start_soon(self._answer, h, k)

    async def _answer(self, h: lbmc.RequestHeader, k: int) -> None:
        try:
            sock = trio.socket.socket()
            await sock.bind((self.bind_ip, 0))
            await sock.connect((h.ipaddr, h.port))
            async with trio.SocketStream(sock) as s:
                await s.send_all(lbmc.data_message(0, k, response_payload(h.qidx, k)))
            self.answered += 1
        except OSError:
            self.failed += 1


async def start_requester(n, trd, **kw) -> tuple[Requester, trio.CancelScope]:
    """A :class:`Requester` at SRC_IP advertised for REQ_TOPIC in ``trd`` (TRD1) every 0.5 s;
    cancelling the scope ends it."""
    req = Requester(**kw)
    scope = trio.CancelScope()

    async def run(task_status):
        with scope:
            async with trio.open_nursery() as sn:
                ip, port = await sn.start(req.serve)
                sn.start_soon(advertise_forever, udp(req.ip), trd, ip, port, REQ_TOPIC)
                task_status.started()

    await n.start(run)
    return req, scope


class RuRequester(RuLiveSource):
    """lbmr-sim's live LBT-RU source at SRC_IP (session RU_SID) whose session is ``requester``'s:
    ``LEAD`` plain ticks from the first DATA it sends to a receiver, then ``requester.count``
    requests (one a message), then plain ticks (its request port is ``requester``'s). The
    lead: the source's clock starts with its first receiver (the router's upstream), and a
    UM receiver joining through proxies takes the session from the next message it gets."""

    LEAD = 5  # ticks before the first request

    def __init__(self, requester: Requester, *, rate: float = 100) -> None:
        super().__init__(SRC_IP, 0, seed=RU_SEED, tidx=REQ_TIDX, session_id=RU_SID, rate=rate)
        self.requester = requester
        self._requests = requester.messages()[1:]
        self._base: int | None = None  # the sqn of the first request

    def _datagram(self, sqn: int, retransmission: bool = False) -> bytes:
        if self._base is None:
            self._base = sqn + self.LEAD
        i = sqn - self._base
        msg = self._requests[i] if 0 <= i < len(self._requests) else lbmc.data_message(REQ_TIDX, sqn, b"tick")
        return lbtru.encode_data(sqn, self.trail_sqn, msg, session_id=self.session_id,
                                 retransmission=retransmission)


class RuMessages(RuLiveReceiver):
    """An LBT-RU receiver of the proxy ``proxy`` (ip, port) that keeps every LBMC message of
    the first ``expect`` it gets (``messages``), whatever they are (lbmr-sim's receiver,
    its checks left out)."""

    def __init__(self, proxy: tuple[str, int], *, expect: int, bind_ip: str = "127.0.2.31", **kw) -> None:
        super().__init__(proxy[0], proxy[1], expect_count=expect, bind_ip=bind_ip, timeout=30, **kw)
        self.messages: list[bytes] = []

    def _take(self, d) -> bool:
        if d.retransmission:
            return True
        self.messages += lbmc_stream.StreamFramer().feed(d.payload)
        self.result.messages = len(self.messages)
        return True


async def start_ru_requester(n, trd, **kw) -> tuple[Requester, RuRequester, trio.CancelScope]:
    """A :class:`Requester`'s session (its request port, ``kw``) from an :class:`RuRequester`
    advertised for REQ_TOPIC in ``trd`` every 0.5 s; cancelling the scope ends it."""
    req = Requester(**kw)
    scope = trio.CancelScope()

    async def run(task_status):
        with scope:
            async with trio.open_nursery() as sn:
                await sn.start(req.serve)
                src = RuRequester(req)
                ip, port = await sn.start(src.serve)
                run.src = src

                async def advertise():
                    sock = udp(SRC_IP)
                    while True:
                        await sock.sendto(ru_tir(ip, port, REQ_TOPIC), trd)
                        await trio.sleep(0.5)

                sn.start_soon(advertise)
                task_status.started()

    await n.start(run)
    return req, run.src, scope


# ------------------------------------------------------------------ late join and OTR

LJ_SEED, LJ_TIDX = 41, 9  # the retaining source's stream and topic index


def late_join_tir(ip: str, port: int, request_port: int, topic: str = ROUTED_TOPIC) -> bytes:
    """A TR datagram with the TIR of a retaining TCP source at ``ip``:``port`` whose
    late-join and exfunc options name its context's request port (transport index 1)."""
    body = L.TcpTransport(ip, port)
    return L.encode(L.Packet(0, 1, tirs=[L.TIR(topic, body, 60, LJ_TIDX, [
        L.OtidOption(0x8000, synthesize_otid(body, LJ_TIDX)), L.LateJoinOption(0, request_port, 0, ip, 1, 0, 0),
        L.ExFuncOption(0x8000, request_port, 0, ip, 0x1)])]))


async def retaining_source(n, trd, *, ip: str = "127.0.1.5", retention: int = 10_000, message_size: int = 100,
                           topic: str = ROUTED_TOPIC, **kw) -> tuple[UmTcpSource, RequestPort]:
    """lbmr-sim's retaining TCP source at ``ip`` (transport index 1 of its context, whose
    request port is on ``ip`` too), advertised in ``trd`` every 0.5 s: (source, request port)."""
    port = RequestPort(ip)
    await n.start(port.serve)
    src = UmTcpSource(ip, 0, seed=LJ_SEED, tidx=LJ_TIDX, message_size=message_size, retention=retention, **kw)
    sip, sport = await n.start(src.serve)
    n.start_soon(src.take_requests, port.serve_source(1))

    async def advertise():
        sock, data = udp(ip), late_join_tir(sip, sport, port.address[1], topic)
        while True:
            await sock.sendto(data, trd)
            await trio.sleep(0.5)

    n.start_soon(advertise)
    return src, port


def recovering_receiver(tir, request_port: RequestPort, expect_bytes: int, **kw) -> UmTcpReceiver:
    """lbmr-sim's receiver of the retaining source through the proxy of ``tir``, its
    late-join and OTR requests to the listener the TIR's late-join option names, its
    answers at ``request_port`` (bound where it receives from)."""
    (lj,) = [o for o in tir.options if isinstance(o, L.LateJoinOption)]
    kw.setdefault("timeout", 60)
    kw.setdefault("idle_timeout", 20)
    return UmTcpReceiver(tir.transport.ip, tir.transport.port, expect_bytes, LJ_SEED, request_port=request_port,
                         source_request=(lj.src_ip_addr, lj.src_tcp_port, lj.transport_idx),
                         bind_ip=request_port.address[0], **kw)
