"""Set-up shared by several test modules: commands, free ports, config-file
helpers, a driver for sans-IO objects with deadlines, waiting for a daemon's
HTTP answer, a forged UDP datagram, lbmr-router files for processes in
namespaces, the real capture beside the checkout, and the data plane's
forwarders between a source and its receivers. Support by area is in its own
modules: ``analyze_reference`` (lbmr-analyze's synthetic capture and
plain-Python reference), ``transport_captures`` (generated transport
captures), ``browser`` (pages in a browser), ``router_chain`` (daemons on
loopback for the pages), ``certificates`` and ``lbmrd_networks``; the
router's in-process drivers are in ``tests.router.helpers``."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
import trio

ROOT = Path(__file__).resolve().parents[1]
#: lbmrd as a process, from this checkout (no installed script needed)
LBMRD = [sys.executable, "-c", "import sys; from lbmrd.cli import main; sys.exit(main(sys.argv[1:]))"]
#: lbmr-router and lbmr-sim the same way
ROUTER = [sys.executable, "-c", "import sys; from router.cli import main; sys.exit(main(sys.argv[1:]))"]
SIM = [sys.executable, "-m", "lbmr_tools.sim"]


def free_port(kind=socket.SOCK_DGRAM, ip: str = "127.0.0.1") -> int:
    """A port the kernel considers free on ``ip`` now (UDP by default)."""
    s = socket.socket(socket.AF_INET, kind)
    s.bind((ip, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def line_of(text: str, marker: str) -> int:
    """1-based line of the only occurrence of ``marker`` in ``text``."""
    assert text.count(marker) == 1, marker
    return text[: text.index(marker)].count("\n") + 1


def write(tmp_path: Path, name: str, text: str) -> Path:
    """Write ``text`` (UTF-8) to the file ``name`` in ``tmp_path``; its path."""
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def expect_config_error(load, error_class, tmp_path: Path, name: str, text: str, marker: str,
                        *needles: str, offset: int = 0):
    """``load(path)`` fails at the line of ``marker`` (+ offset) with an
    ``error_class`` whose message has every needle; returns the error."""
    p = write(tmp_path, name, text)
    with pytest.raises(error_class) as info:
        load(p)
    err = info.value
    line = line_of(text, marker) + offset
    assert err.path == str(p)
    assert err.line == line, str(err)
    assert str(err).startswith(f"{p}:{line}: "), str(err)
    for needle in needles:
        assert needle in err.message, (needle, str(err))
    return err


def drive(ctx, until: float) -> list:
    """Call ``ctx.tick`` at every deadline up to ``until``; (time, datagram) pairs."""
    out = []
    for _ in range(100_000):
        t = ctx.next_deadline()
        if t > until:
            return out
        out += [(t, d) for d in ctx.tick(t)]
    raise AssertionError("too many deadlines")


def wait_http(url: str, timeout: float = 20.0, **kw) -> bytes:
    """GET ``url`` until it answers 200 (a daemon starting); its body."""
    import time
    import urllib.request

    end = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5, **kw) as r:
                return r.read()
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


def spoof_udp(sock: socket.socket, payload: bytes, src: tuple[str, int], dst: tuple[str, int]) -> None:
    """One UDP datagram on loopback with a forged source, through ``sock``
    (a raw IPPROTO_RAW socket: root)."""
    import struct

    udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(payload), 0) + payload  # checksum 0: none
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, socket.IPPROTO_UDP, 0,
                     socket.inet_aton(src[0]), socket.inet_aton(dst[0]))
    sock.sendto(ip + udp, (dst[0], 0))


# ---------------------------------------------------------------- lbmr-router configuration files


def router_xml(name: str, endpoints: list[str], peers: list[str] = (), *, daemon: str = "") -> str:
    """A whole lbmr-router file: ``<daemon>`` (name, console log, ``daemon``: more
    elements) and the ``<portals>`` given (from :func:`endpoint_xml`, :func:`peer_xml`)."""
    return (f'<?xml version="1.0" encoding="UTF-8" ?>\n<lbmr-router version="1.0">\n'
            f'  <daemon><name>{name}</name><log type="console"/>{daemon}</daemon>\n  <portals>\n'
            + "".join(endpoints) + "".join(peers) + "  </portals>\n</lbmr-router>\n")


#: the fan-out queue (<relay max-queue>) of the test routers' endpoints: lbmr-sim's TCP
#: sources are not paced by receivers behind a router, and its verifying receivers are
#: slower than its sources; a queue that holds a test's whole transfer keeps them lossless
SIM_MAX_QUEUE = 64 << 20


def endpoint_xml(name: str, domain: int, ip: str, *, tr: str | None = None,
                 relay: tuple[int, int] = (14371, 14390), extra: str = "",
                 max_queue: int = SIM_MAX_QUEUE) -> str:
    """An endpoint portal: topic resolution by the lbmrd at ``ip``:15380 (or ``tr``, a
    ``<topic-resolution>`` element), proxies at ``ip`` on the ``relay`` ports with
    ``max_queue`` bytes of fan-out queue; ``extra``: more elements (e.g. ``<lbt-rm>``)."""
    tr = tr or (f'<topic-resolution>\n        <interface>{ip}</interface>\n'
                f'        <lbmrd address="{ip}" port="15380"/>\n      </topic-resolution>')
    return (f"    <endpoint>\n      <name>{name}</name>\n      <domain-id>{domain}</domain-id>\n"
            f"      {tr}\n"
            f'      <relay interface="{ip}" port-low="{relay[0]}" port-high="{relay[1]}" '
            f'max-queue="{max_queue}"/>\n'
            + (f"      {extra}\n" if extra else "") + "    </endpoint>\n")


def peer_xml(name: str, link_ip: str, role: str, *, cost: int | None = None,
             keepalive: tuple[int, int] = (1000, 3000)) -> str:
    """A peer portal on ``link_ip`` (``role``: :func:`initiator_xml` or
    :func:`acceptor_xml`); keepalive (interval, timeout) in milliseconds."""
    cost_el = f"      <cost>{cost}</cost>\n" if cost is not None else ""
    return (f"    <peer>\n      <name>{name}</name>\n{cost_el}      <single-tcp>\n"
            f"        <interface>{link_ip}</interface>\n        {role}\n      </single-tcp>\n"
            f'      <gateway-keepalive idle="yes" interval="{keepalive[0]}" timeout="{keepalive[1]}"/>\n'
            f"    </peer>\n")


def initiator_xml(address: str, port: int, reconnect_ms: int = 500) -> str:
    """An ``<initiator>`` connecting to ``address``:``port``, retrying every ``reconnect_ms``
    milliseconds."""
    return (f'<initiator reconnect-interval="{reconnect_ms}"><address>{address}</address>'
            f"<port>{port}</port></initiator>")


def acceptor_xml(port: int) -> str:
    """An ``<acceptor>`` listening on ``port``."""
    return f"<acceptor><listen-port>{port}</listen-port></acceptor>"


def pair_xml(name: str, domain: int, trd_ip: str, link_ip: str, role: str, *, tr: str | None = None,
             relay: tuple[int, int] = (14371, 14390), extra: str = "", metrics: bool = False) -> str:
    """One router of a pair: an endpoint on ``trd_ip`` (``tr``, ``relay``, ``extra`` as
    :func:`endpoint_xml`) and a peer on ``link_ip`` (``role``: :func:`initiator_xml` or
    :func:`acceptor_xml`); with ``metrics`` its /status at ``trd_ip``:18080."""
    return router_xml(name, [endpoint_xml(f"{name}-trd", domain, trd_ip, tr=tr, relay=relay, extra=extra)],
                      [peer_xml(f"{name}-peer", link_ip, role)],
                      daemon=f"\n    <metrics>{trd_ip}:18080</metrics>" if metrics else "")


def ns_status(ns, ip: str, port: int = 18080) -> dict:
    """A router's /status at ``ip``:``port``, fetched inside the namespace ``ns``."""
    import json

    r = ns.run([sys.executable, "-c", f"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen("
                                      f"'http://{ip}:{port}/status', timeout=5).read().decode())"], timeout=20)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def start_pair(a, b, cfg_a, cfg_b, logs: dict) -> tuple:
    """lbmrds on 127.0.1.1 (in namespace ``a``) and 127.0.2.1 (in ``b``), then router
    B (``cfg_b``) and router A (``cfg_a``), each writing to ``logs[la|lb|ra|rb]``;
    returns the two routers' processes (A, B)."""
    a.popen(LBMRD + ["-i", "127.0.1.1", "--stats-interval", "0"], stdout=logs["la"], stderr=logs["la"])
    b.popen(LBMRD + ["-i", "127.0.2.1", "--stats-interval", "0"], stdout=logs["lb"], stderr=logs["lb"])
    rb = b.popen(ROUTER + [str(cfg_b)], stdout=logs["rb"], stderr=logs["rb"])
    ra = a.popen(ROUTER + [str(cfg_a)], stdout=logs["ra"], stderr=logs["ra"])
    return ra, rb


class LoneSite:
    """The site of a relay tested without a router around it
    (:class:`router.shell.relay_site.RelaySite`'s calls): ``link`` fixed (or None),
    no source behind any advertisement, a proxy's streams name the proxy's own
    id, and the ends of sessions reported are kept in ``ended``."""

    def __init__(self, link=None) -> None:
        self.link = link
        self.ended: list[int] = []

    def advert_source(self, advert_id: int):
        return None

    def proxy_advert(self, proxy_id: int) -> int:
        return proxy_id

    def session_ended(self, advert_id: int) -> None:
        self.ended.append(advert_id)


# ---------------------------------------------------------------- the real capture

def real_capture() -> Path:
    """The real UM 6.14 capture kept beside the checkout (``shared/captures``
    next to it, or next to the directory that holds it)."""
    for base in (ROOT.parent, ROOT.parent.parent):
        p = base / "shared" / "captures" / "um614-multicast-tr.pcap"
        if p.exists():
            return p
    raise FileNotFoundError("shared/captures/um614-multicast-tr.pcap next to the checkout")


# ------------------------------ lbmr-sim's data plane: proxies between a source and its receivers


LO = "127.0.0.1"


async def tcp_proxy(upstream, *, flip_at: int | None = None, cut_at: int | None = None,
                    task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Accept one connection, relay it to ``upstream``; downstream, flip
    the byte at stream offset ``flip_at`` or stop (closing both sides)
    after ``cut_at`` bytes."""
    (listener,) = await trio.open_tcp_listeners(0, host=LO)
    async with listener:
        task_status.started(listener.socket.getsockname()[:2])
        client = await listener.accept()
    server = await trio.open_tcp_stream(*upstream)
    async with client, server:
        off = 0
        while True:
            want = 65536 if cut_at is None else min(65536, cut_at - off)
            if want <= 0:
                return
            data = bytearray(await server.receive_some(want))
            if not data:
                return
            if flip_at is not None and off <= flip_at < off + len(data):
                data[flip_at - off] ^= 0xFF
            await client.send_all(data)
            off += len(data)


#: the LBT-RU dissector's chat-level notes of the session's steps (not findings, like TCP's SYN)
RU_CHAT = {"CREQ SYN", "SM SYN", "ACK"}


async def udp_forwarder(source, *, drop=lambda data: False, log=None, task_status=trio.TASK_STATUS_IGNORED):
    """A UDP forwarder for one receiver: datagrams from the receiver go to
    ``source`` and back; ``drop(data)`` true discards one from the source,
    ``log`` gets (from_receiver, receiver address, datagram) of each passed on."""
    front = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    back = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with front, back:
        await front.bind((LO, 0))
        await back.bind((LO, 0))
        task_status.started(front.getsockname()[:2])
        peer = None

        async def down():
            while True:
                data, _ = await back.recvfrom(65536)
                if peer is not None and not drop(data):
                    if log is not None:
                        log.append((False, peer, data))
                    await front.sendto(data, peer)

        async with trio.open_nursery() as n:
            n.start_soon(down)
            while True:
                data, peer = await front.recvfrom(65536)
                if log is not None:
                    log.append((True, peer, data))
                await back.sendto(data, source)
