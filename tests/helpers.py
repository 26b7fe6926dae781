"""Set-up shared by several test modules: commands, free ports, config-file
helpers, a driver for sans-IO objects with deadlines, lbmr-router files for
processes in namespaces, lbmr-analyze's synthetic capture and plain-Python
reference, the data plane's test proxies and lbmrd's network files. (The
router's in-process drivers are in ``tests.router.helpers``.)"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import sys
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio

import lbmr_proto as L
from lbmr_analyze.job import TABLES
from lbmr_proto.capture import PcapWriter, read_udp

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


# ---------------------------------------------------------------- transport traffic (issue 24)

def real_capture() -> Path:
    """The real UM 6.14 capture kept beside the checkout (``shared/captures``
    next to it, or next to the directory that holds it)."""
    for base in (ROOT.parent, ROOT.parent.parent):
        p = base / "shared" / "captures" / "um614-multicast-tr.pcap"
        if p.exists():
            return p
    raise FileNotFoundError("shared/captures/um614-multicast-tr.pcap next to the checkout")


def ipv4_packet(src: str, dst: str, proto: int, body: bytes, ident: int = 0) -> bytes:
    """A raw IPv4 packet (no options, valid header checksum, TTL 64)."""
    import struct
    s, d = bytes(map(int, src.split("."))), bytes(map(int, dst.split(".")))
    hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(body), ident, 0, 64, proto, 0, s, d)
    total = sum(struct.unpack("!10H", hdr))
    total = (total & 0xFFFF) + (total >> 16)
    total = (total & 0xFFFF) + (total >> 16)
    return hdr[:10] + struct.pack("!H", ~total & 0xFFFF) + hdr[12:] + body


def udp_packet(src: tuple[str, int], dst: tuple[str, int], payload: bytes, ident: int = 0) -> bytes:
    """A raw IPv4 packet holding a UDP datagram (UDP checksum 0: none)."""
    import struct
    return ipv4_packet(src[0], dst[0], 17, struct.pack("!HHHH", src[1], dst[1], 8 + len(payload), 0) + payload,
                       ident)


def icmp_unreachable(sender: str, quoted: bytes, *, code: int = 3) -> bytes:
    """An ICMP destination-unreachable packet from ``sender`` quoting the raw
    IPv4 packet ``quoted`` (sent to the quoted packet's source)."""
    import struct
    dst = ".".join(str(b) for b in quoted[12:16])
    body = struct.pack("!BBHI", 3, code, 0, 0) + quoted
    if len(body) % 2:
        padded = body + b"\0"
    else:
        padded = body
    total = sum(struct.unpack(f"!{len(padded) // 2}H", padded))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    body = body[:2] + struct.pack("!H", ~total & 0xFFFF) + body[4:]
    return ipv4_packet(sender, dst, 1, body)


#: the generated transport capture's sessions (see write_transport_capture)
GEN_SOURCE = "10.0.0.1"
GEN_RM = ("10.0.0.1", 14390, 0x01020304, "239.2.2.2", 14400)  # ip, NAK port, session id, group, dport
GEN_RM_NO_TIR = ("10.0.0.3", 14391, 0xDEADBEEF, "239.2.2.3", 14401)
GEN_RU = ("10.0.0.1", 14380, 0x0A0B0C0D)
GEN_TCP = ("10.0.0.1", 14371, 0x11223344)
#: tshark's "Decode As" rules for the generated capture
GEN_DECODE_AS = ("udp.port==14400,lbtrm", "udp.port==14390,lbtrm", "udp.port==14401,lbtrm",
                 "udp.port==14391,lbtrm", "udp.port==14380,lbtru", "tcp.port==14371,lbttcp",
                 "udp.port==12965,lbmr")


def write_transport_capture(path: Path) -> int:
    """A small raw-IPv4 pcap of UM transport traffic; returns the frame count.

    TIRs (LBMR, 12965) for an LBT-RM session (topics ``alpha`` idx 1, ``beta``
    idx 2), an LBT-RU session (``ru.topic`` idx 7) and an LBT-TCP session
    (``tcp.topic`` idx 9), a TQR for ``alpha`` from context 10.0.0.2:40001;
    LBT-RM DATA 0..19 with NAKs from 10.0.0.2:45000, retransmissions, NCFs of
    every reason, SMs, a NAK never answered and an ICMP port-unreachable
    quoting a NAK; a second LBT-RM session with no TIR (DATA and a NAK);
    LBT-RU CREQ, SM with SYN, DATA, NAK, retransmission, NCF, ACK and RST;
    an LBT-TCP connection with a TCP_SID message then data.
    """
    import lbmr_proto as L
    from lbmr_proto import lbmc as C
    from lbmr_proto import lbtrm as RM
    from lbmr_proto import lbtru as RU
    from lbmr_proto.capture import LINKTYPE_RAW, PcapWriter
    from tests.tshark_judge import tcp_segment

    frames: list[bytes] = []
    ip, nport, sid, grp, dport = GEN_RM
    ctx_src, rcv = ("10.0.0.1", 40000), ("10.0.0.2", 45000)
    tirs = [L.TIR("alpha", L.LbtrmTransport(ip, grp, sid, dport, nport), 0, 1),
            L.TIR("beta", L.LbtrmTransport(ip, grp, sid, dport, nport), 0, 2),
            L.TIR("ru.topic", L.LbtruSessionTransport(GEN_RU[0], GEN_RU[2], GEN_RU[1]), 0, 7),
            L.TIR("tcp.topic", L.TcpSessionTransport(GEN_TCP[0], GEN_TCP[2], GEN_TCP[1]), 0, 9)]
    frames.append(udp_packet(ctx_src, ("239.1.1.1", 12965), L.encode(L.Packet(0, tirs=tirs))))
    frames.append(udp_packet(("10.0.0.2", 40001), ("239.1.1.1", 12965),
                             L.encode(L.Packet(0, tqrs=[L.TQR("alpha")]))))
    src = (ip, 50000)
    for q in range(20):
        frames.append(udp_packet(src, (grp, dport), RM.encode_data(
            nport, sid, q, 0, C.data_message(1 + q % 2, q // 2, b"m%d" % q))))
    to_src = (ip, nport)
    nak = udp_packet(rcv, to_src, RM.encode_nak(nport, sid, [5, 6]))
    frames.append(nak)
    rx = RM.FLAG_UNICAST_NAKS | RM.FLAG_RETRANSMISSION
    frames.append(udp_packet(src, (grp, dport), RM.encode_data(nport, sid, 5, 0, C.data_message(2, 2, b"m5"),
                                                               flags=rx)))
    for reason in (RM.NCF_IGNORED, RM.NCF_RX_DELAY, RM.NCF_SHED, RM.NCF_NO_RETRY, RM.NCF_IGNORED):
        frames.append(udp_packet(src, (grp, dport), RM.encode_ncf(nport, sid, 0, [6], reason=reason)))
    frames.append(udp_packet(rcv, to_src, RM.encode_nak(nport, sid, [6, 7, 8])))
    frames.append(udp_packet(src, (grp, dport), RM.encode_data(nport, sid, 6, 0, C.data_message(1, 3, b"m6"),
                                                               flags=rx)))
    frames.append(udp_packet(src, (grp, dport), RM.encode_data(nport, sid, 8, 0, C.data_message(1, 4, b"m8"),
                                                               flags=rx)))
    for k in range(3):
        frames.append(udp_packet(src, (grp, dport), RM.encode_sm(nport, sid, k, 19, 0)))
    frames.append(icmp_unreachable(ip, udp_packet(rcv, to_src, RM.encode_nak(nport, sid, [7]))))
    ip2, nport2, sid2, grp2, dport2 = GEN_RM_NO_TIR
    for q in range(5):
        frames.append(udp_packet((ip2, 50001), (grp2, dport2), RM.encode_data(
            nport2, sid2, 100 + q, 100, C.data_message(42, q, b"x" * q))))
    frames.append(udp_packet(("10.0.0.4", 45001), (ip2, nport2), RM.encode_nak(nport2, sid2, [101])))
    frames.append(udp_packet((ip2, 50001), (grp2, dport2), RM.encode_sm(nport2, sid2, 0, 104, 100)))
    ru_src, ru_rcv, rsid = (GEN_RU[0], GEN_RU[1]), ("10.0.0.5", 45100), GEN_RU[2]
    frames.append(udp_packet(ru_rcv, ru_src, RU.encode_creq(session_id=rsid, client_id=5)))
    frames.append(udp_packet(ru_src, ru_rcv, RU.encode_sm(0, 0, 0, syn=True, session_id=rsid, client_id=5)))
    for q in range(6):
        if q != 3:
            frames.append(udp_packet(ru_src, ru_rcv, RU.encode_data(q, 0, C.data_message(7, q, b"r"),
                                                                      session_id=rsid)))
    frames.append(udp_packet(ru_rcv, ru_src, RU.encode_nak([3, 4], session_id=rsid, client_id=5)))
    frames.append(udp_packet(ru_src, ru_rcv, RU.encode_data(3, 0, C.data_message(7, 3, b"r"), session_id=rsid,
                                                            retransmission=True)))
    frames.append(udp_packet(ru_src, ru_rcv, RU.encode_ncf(0, [4], reason=RU.NCF_RX_DELAY, session_id=rsid)))
    frames.append(udp_packet(ru_rcv, ru_src, RU.encode_ack(5, session_id=rsid, client_id=5)))
    frames.append(udp_packet(ru_src, ru_rcv, RU.encode_rst()))
    t_src, t_rcv, tsid = (GEN_TCP[0], GEN_TCP[1]), ("10.0.0.6", 45200), GEN_TCP[2]
    seq = {True: 1000, False: 5000}
    frames.append(tcp_segment(t_rcv, t_src, seq[False], 0, 0x02))
    frames.append(tcp_segment(t_src, t_rcv, seq[True], seq[False] + 1, 0x12))
    seq[True] += 1
    seq[False] += 1
    frames.append(tcp_segment(t_rcv, t_src, seq[False], seq[True], 0x10))
    first = C.encode(C.Message(C.CONTROL, headers=(C.TcpSidHeader(0, tsid),)))
    chunks = [first + C.data_message(9, 0, b"t0"), C.data_message(9, 1, b"t1") + C.data_message(9, 2, b"t2"),
              C.data_message(9, 3, b"t3")]
    for data in chunks:
        frames.append(tcp_segment(t_src, t_rcv, seq[True], seq[False], 0x18, data))
        seq[True] += len(data)
    frames.append(tcp_segment(t_rcv, t_src, seq[False], seq[True], 0x14))
    with PcapWriter(path, linktype=LINKTYPE_RAW) as w:
        for i, f in enumerate(frames):
            w.write_frame(1_700_000_000 + i / 100, f)
    return len(frames)

# ----------------- lbmr-analyze: a synthetic capture and the plain-Python reference of its tables


PORTS = {12965, 15380}
T0 = 1_700_000_000.0          # 2023-11-14T22:13:20Z; its minute starts at T0 - 20
STORM = 50
TRAILER = [L.SourceIdOption(0x8000, bytes(range(8))), L.SourceTypeOption(0x80, 0),
           L.VersionOption(0x8001, 0x060E0000), L.LocalDomainOption(0x8000, 5)]
S1, S2 = ("10.1.1.10", 14402), ("10.1.1.11", 14402)
Q1, Q2 = ("10.2.2.20", 14403), ("10.4.4.4", 14402)
TA = L.LbtrmTransport("10.1.1.10", "239.1.1.1", 1111, 14400, 14390)
TC1 = L.TcpTransport("10.1.1.10", 14371)
TC2 = L.LbtruSessionTransport("10.1.1.11", 77, 14380)
TX = L.TcpTransport("10.5.5.5", 15000)               # advertised from 10.5.5.5 and 10.5.5.6
TE = L.TcpTransport("192.168.50.5", 15001)           # NAT mismatch when sent from 10.7.7.7
TF = L.TcpTransport("0.0.0.0", 15002)                # filled in by receivers: never a mismatch
TG = L.TcpTransport("10.7.7.99", 15003)              # same /24 as its sender: not a mismatch


def hashed_tir(topic, transport, index=0, domain=None):
    """A TIR of ``topic`` on ``transport`` (topic index ``index``), its OTID a hash of both;
    ``domain``: a domain id option too."""
    otid = hashlib.sha256(f"{topic} {transport}".encode()).digest()
    opts = [L.OtidOption(0x8000, otid)] + ([L.DomainIdOption(0, domain)] if domain is not None else [])
    return L.TIR(topic, transport, 16, index, opts)


def trailed_datagram(**kw) -> bytes:
    """A TR datagram (``kw``: the Packet's fields) with the options of a UM 6.14 context
    (TRAILER)."""
    return L.encode(L.Packet(**kw, options=TRAILER))


def synthetic_datagrams() -> list[tuple]:
    """(ts, src, sport, dst, dport, payload) with known answers (see the tests)."""
    d = []
    dst = ("239.101.3.1", 12965)

    def add(ts, who, payload, to=dst):
        d.append((T0 + ts, who[0], who[1], to[0], to[1], payload))

    add(0.5, Q1, trailed_datagram(tqrs=[L.TQR("A")]))
    add(0.6, Q1, trailed_datagram(tqrs=[L.TQR("B")]))
    add(0.7, Q1, trailed_datagram(type=1, version=1, wc_tqrs=[L.WcTQR("^(A|C)$", 1)]))
    add(0.8, Q1, trailed_datagram(type=1, version=1, wc_tqrs=[L.WcTQR("([unclosed", 1)]))
    for k in range(1, 21):                                  # A advertised every second
        add(float(k), S1, trailed_datagram(tirs=[hashed_tir("A", TA, 1, domain=7)]))
    add(1.2, S1, trailed_datagram(tirs=[hashed_tir("C", TC1, 2)]))
    add(1.3, S2, trailed_datagram(tirs=[hashed_tir("C", TC2, 3)]))
    add(1.5, Q1, trailed_datagram(tqrs=[L.TQR("A"), L.TQR("C")]))
    add(2.1, ("10.5.5.5", 14402), trailed_datagram(tirs=[hashed_tir("D", TX)]))
    add(2.2, ("10.5.5.6", 14402), trailed_datagram(tirs=[hashed_tir("D", TX)]))
    add(2.3, ("10.7.7.7", 14402), trailed_datagram(tirs=[hashed_tir("E", TE), hashed_tir("F", TF), hashed_tir("G", TG)]))
    add(3.0, Q1, trailed_datagram(tqrs=[L.TQR("B")]))
    for i in range(60):                                     # a storm second: 61 datagrams at T0+10
        add(10.005 + i * 0.01, Q2, trailed_datagram(tqrs=[L.TQR("A")]))
    # keepalives (lbmrd clients) in two minutes: 2 clients, then 3
    lbmrd = ("10.0.0.1", 15380)
    add(1.1, ("10.9.9.1", 14402), L.encode(L.Packet(2)), lbmrd)
    add(1.1, ("10.9.9.2", 14402), L.encode(L.Packet(3)), lbmrd)
    add(45.0, ("10.9.9.1", 14402), L.encode(L.Packet(2)), lbmrd)
    add(45.1, ("10.9.9.2", 14402), L.encode(L.Packet(3)), lbmrd)
    add(45.2, ("10.9.9.3", 14405), L.encode(L.Packet(0)), lbmrd)
    add(46.0, ("10.9.9.3", 14405), L.encode(L.Packet(0)), lbmrd)
    add(5.0, ("10.8.8.8", 5555), b"\x07\xff\x00", lbmrd)     # undecodable on the lbmrd port
    add(5.5, ("10.8.8.8", 5555), b"not lbmr", ("10.0.0.2", 9999))        # other port: ignored
    add(6.0, ("10.8.8.9", 5556), trailed_datagram(tqrs=[L.TQR("Z")]), ("10.0.0.2", 20000))   # only with --port
    d.sort(key=lambda x: x[0])
    return d


def write_pcap(path: Path, dgrams, *, nanosecond=False) -> Path:
    """Write the datagrams ``dgrams`` ((ts, src, sport, dst, dport, payload)) to a pcap at
    ``path`` (``nanosecond``: nanosecond timestamps); the path."""
    with PcapWriter(path, nanosecond=nanosecond) as w:
        for i, dg in enumerate(dgrams):
            w.write_udp(*dg, ip_id=i)
    return path


def iso(us: int) -> str:
    """Microseconds since the epoch as the tables print them (UTC, microseconds, Z)."""
    return datetime.fromtimestamp(us // 1_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{us % 1_000_000:06d}Z"


def iso_s(sec: int) -> str:
    """Seconds since the epoch as the tables print them (UTC, whole seconds, Z)."""
    return datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ref_tid(t) -> str:
    """The id lbmr-analyze gives the transport ``t``: its kind, addresses, ports and session id."""
    if isinstance(t, L.LbtrmTransport):
        return f"LBTRM:{t.ip}:{t.src_ucast_port}:{t.mcast_group}:{t.dest_port}:{t.session_id}"
    if isinstance(t, L.TcpTransport):
        return f"TCP:{t.ip}:{t.port}"
    if isinstance(t, L.TcpSessionTransport):
        return f"TCP:{t.ip}:{t.port}:{t.session_id}"
    if isinstance(t, L.LbtruTransport):
        return f"LBTRU:{t.ip}:{t.port}"
    if isinstance(t, L.LbtruSessionTransport):
        return f"LBTRU:{t.ip}:{t.port}:{t.session_id}"
    if isinstance(t, L.LbtrdmaTransport):
        return f"LBTRDMA:{t.ip}:{t.port}:{t.session_id}"
    if isinstance(t, (L.LbtipcTransport, L.LbtsmxTransport)):
        return f"{t.NAME}:{t.host_id}:{t.xport_id}:{t.session_id}"
    return f"UNKNOWN:{t.type_code}:{t.data.hex()}"


def ref_records(path: str, dgrams) -> list[dict]:
    """Flat records from (ts, src, sport, dst, dport, payload, frame, offset) datagrams."""
    out = []
    for ts, src, sport, dst, dport, payload, _frame, off in dgrams:
        base = dict(file=path, offset=off, us=round(ts * 1e6), src=src, sport=sport, dst=dst, dport=dport,
                    length=len(payload), q=f"{src}:{sport}")
        recs = []
        base["cid"] = None
        try:
            pkt = L.decode(payload)
        except L.LBMRDecodeError as e:
            recs.append(dict(kind="DECODE_ERROR", ptype=None,
                             error=f"LBMR decode error at datagram byte {e.offset}: {e.reason}"))
        else:
            recs += [dict(kind="TQR", topic=q.topic) for q in pkt.tqrs]
            recs += [dict(kind="WC_TQR", topic=w.pattern, pattern_type=w.pattern_type) for w in pkt.wc_tqrs]
            recs += [dict(kind="TIR", topic=t.topic, tid=ref_tid(t.transport),
                          tip=getattr(t.transport, "ip", None),
                          otid=next((o.otid.hex() for o in t.options or () if isinstance(o, L.OtidOption)), None))
                     for t in pkt.tirs]
            base["cid"] = next((o.src_id.hex() for o in pkt.options or () if isinstance(o, L.SourceIdOption)), None)
            assert pkt.tmb is None and not pkt.qqrs and not pkt.qirs and pkt.ext is None
            if not recs:
                assert pkt.type in (2, 3) or (pkt.type == 0)
                recs.append(dict(kind="KEEPALIVE"))
            for r in recs:
                r["ptype"] = pkt.type_name
        seen = set()
        for i, r in enumerate(recs):
            r.update(base, index=i, kind_first=r["kind"] not in seen)
            seen.add(r["kind"])
            out.append(r)
    return out


def joined_set(vals) -> str:
    """The distinct non-None values, sorted and joined by spaces."""
    return " ".join(sorted({v for v in vals if v is not None}))


def ctx_label(src, sport, cid) -> str:
    """Context naming of lbmr-analyze(1): lbmrd's port 15380 means relayed."""
    if sport == 15380:
        return (f"[{cid}] via lbmrd {src}:{sport}" if cid else f"via lbmrd {src}:{sport}")
    return f"{src}:{sport} [{cid}]" if cid else f"{src}:{sport}"


def ctx_ids(rs) -> int:
    """How many contexts TIRs ``rs`` surely come from: a direct sender is its ip:port
    and src_id; a relayed one (port 15380) its src_id, the same context as a direct
    sender with that src_id; relayed without src_id, anyone (not counted)."""
    direct = {(r["q"], r["cid"]) for r in rs if r["sport"] != 15380}
    relayed = {r["cid"] for r in rs if r["sport"] == 15380 and r["cid"]}
    return len(direct) + len(relayed - {c for _, c in direct})


def pct(n: int, total: int) -> str:
    """A share as the tables print it: one decimal, "<0.1 %" when smaller but not zero."""
    return "<0.1 %" if 0 < 1000 * n < total else f"{100 * n / total:.1f} %"


def nat_reachable(ip: str, hosts: set[str]) -> bool:
    """The NAT rule of thumb: a host seen in the same /24, or in the same private block."""
    import ipaddress
    blocks = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                               "127.0.0.0/8", "169.254.0.0/16")]
    a = ipaddress.ip_address(ip)
    for h in hosts:
        b = ipaddress.ip_address(h)
        if ipaddress.ip_network(f"{h}/24", strict=False) == ipaddress.ip_network(f"{ip}/24", strict=False):
            return True
        if any(a in n and b in n for n in blocks):
            return True
    return False


def reference(recs: list[dict], *, storm=STORM, top=20, capture_errors=()) -> dict[str, list[dict]]:
    """Every analysis table, computed in plain Python."""
    T: dict[str, list[dict]] = {}
    lab = lambda r: ctx_label(r["src"], r["sport"], r["cid"])  # noqa: E731
    by_topic = defaultdict(list)
    for r in recs:
        if r["kind"] in ("TIR", "TQR"):
            by_topic[r["topic"]].append(r)
    inv = []
    for topic in sorted(by_topic):
        rs = by_topic[topic]
        tirs = [r for r in rs if r["kind"] == "TIR"]
        tqrs = [r for r in rs if r["kind"] == "TQR"]
        inv.append(dict(
            topic=topic, advertisements=len(tirs), queries=len(tqrs),
            n_sources=len({r["tid"] for r in tirs}), sources=joined_set(r["tid"] for r in tirs),
            advertisers=" | ".join(sorted({lab(r) for r in tirs})), n_queriers=len({(r["q"], r["cid"]) for r in tqrs}),
            first_seen=iso(min(r["us"] for r in rs)), last_seen=iso(max(r["us"] for r in rs)),
            first_advertised=iso(min(r["us"] for r in tirs)) if tirs else None,
            last_advertised=iso(max(r["us"] for r in tirs)) if tirs else None,
            first_queried=iso(min(r["us"] for r in tqrs)) if tqrs else None))
    inv.sort(key=lambda i: (-(i["advertisements"] + i["queries"]), i["topic"]))
    T["topic_inventory"] = inv
    T["top_topics"] = [dict(topic=i["topic"], records=i["advertisements"] + i["queries"],
                            advertisements=i["advertisements"], queries=i["queries"], n_sources=i["n_sources"])
                       for i in inv][:top]
    adv = {i["topic"] for i in inv if i["advertisements"]}
    un = defaultdict(list)
    for r in recs:
        if r["kind"] == "TQR" and r["topic"] not in adv:
            un[(r["topic"], r["src"], r["sport"], r["cid"])].append(r)      # a querier: ip:port + src_id
    T["unresolved_topics"] = sorted(
        (dict(topic=t, querier=f"{s}:{p}", src_id=c, queries=len(rs),
              first_query=iso(min(r["us"] for r in rs)), last_query=iso(max(r["us"] for r in rs)),
              via_lbmrd=p == 15380) for (t, s, p, c), rs in un.items()),
        key=lambda x: (-x["queries"], x["topic"], x["querier"], x["src_id"] or ""))
    last_tir = {}
    for r in recs:
        if r["kind"] == "TIR":
            last_tir[r["topic"]] = max(last_tir.get(r["topic"], r["us"]), r["us"])
    st = defaultdict(list)
    for r in recs:
        if r["kind"] == "TQR" and r["topic"] in last_tir and r["us"] > last_tir[r["topic"]]:
            st[(r["topic"], r["src"], r["sport"], r["cid"])].append(r)
    T["stale_queries"] = sorted(
        (dict(topic=t, querier=f"{s}:{p}", src_id=c, last_advertised=iso(last_tir[t]), queries_after=len(rs),
              first_query_after=iso(min(r["us"] for r in rs)), last_query=iso(max(r["us"] for r in rs)),
              silent_s=round((max(r["us"] for r in rs) - last_tir[t]) / 1e6, 6))
         for (t, s, p, c), rs in st.items()),
        key=lambda x: (-x["queries_after"], x["topic"], x["querier"], x["src_id"] or ""))
    # time to resolve
    firstq: dict[tuple, int] = {}
    for r in recs:
        if r["kind"] == "TQR":
            k = (r["q"], r["cid"], r["topic"])
            firstq[k] = min(firstq.get(k, r["us"]), r["us"])
    ttr = []
    for (q, cid, topic), us in firstq.items():
        later = [r["us"] for r in by_topic[topic] if r["kind"] == "TIR" and r["us"] >= us]
        if later:
            ttr.append(dict(querier=q, src_id=cid, topic=topic, first_query=iso(us),
                            resolved_at=iso(min(later)), time_to_resolve_s=(min(later) - us) / 1e6))
    T["time_to_resolve"] = sorted(ttr, key=lambda x: (-x["time_to_resolve_s"], x["topic"], x["querier"],
                                                      x["src_id"] or ""))
    tirs = [r for r in recs if r["kind"] == "TIR"]
    by_tid, by_otid, by_ct = defaultdict(list), defaultdict(list), defaultdict(list)
    for r in tirs:
        by_tid[r["tid"]].append(r)
        if r["otid"]:
            by_otid[r["otid"]].append(r)
        if r["sport"] != 15380:
            by_ct[(r["q"], r["cid"], r["topic"])].append(r)
        elif r["cid"]:                                   # relayed: the src_id is the context
            by_ct[(None, r["cid"], r["topic"])].append(r)
    T["transport_conflicts"] = sorted(
        (dict(transport_id=tid, n_contexts=ctx_ids(rs), contexts=" | ".join(sorted({lab(r) for r in rs})),
              n_topics=len({r["topic"] for r in rs}), topics=joined_set(r["topic"] for r in rs), advertisements=len(rs),
              first_seen=iso(min(r["us"] for r in rs)), last_seen=iso(max(r["us"] for r in rs)))
         for tid, rs in by_tid.items() if ctx_ids(rs) > 1),
        key=lambda x: (-x["n_contexts"], x["transport_id"]))
    T["otid_collisions"] = sorted(
        (dict(otid=o, n_topics=len({r["topic"] for r in rs}), topics=joined_set(r["topic"] for r in rs),
              n_contexts=ctx_ids(rs), contexts=" | ".join(sorted({lab(r) for r in rs})),
              transports=joined_set(r["tid"] for r in rs), advertisements=len(rs))
         for o, rs in by_otid.items() if len({r["topic"] for r in rs}) > 1 or ctx_ids(rs) > 1),
        key=lambda x: (-(x["n_topics"] + x["n_contexts"]), x["otid"]))
    T["multi_transport_topics"] = sorted(
        (dict(context=" | ".join(sorted({ctx_label(r["src"], r["sport"], None) for r in rs})), src_id=c, topic=t,
              n_transports=len({r["tid"] for r in rs}), transports=joined_set(r["tid"] for r in rs), advertisements=len(rs),
              first_seen=iso(min(r["us"] for r in rs)), last_seen=iso(max(r["us"] for r in rs)))
         for (_q, c, t), rs in by_ct.items() if len({r["tid"] for r in rs}) > 1),
        key=lambda x: (-x["n_transports"], x["context"], x["topic"], x["src_id"] or ""))
    # load
    load = defaultdict(lambda: [0, 0, 0])
    for r in recs:
        sec = r["us"] // 1_000_000
        for kind, counts in ((r["kind"], r["kind_first"]), ("ALL", r["index"] == 0)):
            v = load[(sec, kind)]
            v[1] += 1
            if counts:
                v[0] += 1
                v[2] += r["length"]
    T["load_per_second"] = [dict(second=s, time=iso_s(s), record_kind=k, packets=v[0], records=v[1], bytes=v[2])
                            for (s, k), v in sorted(load.items())]
    storms, sc = [], []
    for (s, k), v in sorted(load.items()):
        if k != "ALL" or v[0] <= storm:
            continue
        per = defaultdict(int)
        for r in recs:
            if r["index"] == 0 and r["us"] // 1_000_000 == s:
                per[(r["src"], r["sport"], r["cid"])] += 1
        cs = sorted(per.items(), key=lambda kv: (-kv[1], kv[0][0], kv[0][1], kv[0][2] or ""))
        sc += [dict(second=s, time=iso_s(s), context=f"{a}:{p}", src_id=c, packets=n, share=round(n / v[0], 4))
               for (a, p, c), n in cs]
        storms.append(dict(second=s, time=iso_s(s), packets=v[0], records=v[1], bytes=v[2],
                           top_contexts="; ".join(f"{ctx_label(a, p, c)} {n}/s ({pct(n, v[0])})"
                                                  for (a, p, c), n in cs[:3])))
    T["storms"], T["storm_contexts"] = storms, sc
    talk = defaultdict(list)
    for r in recs:
        if r["kind"] != "DECODE_ERROR":
            talk[(r["src"], r["sport"], r["cid"])].append(r)
    tt = [dict(context=f"{s}:{p}", src_id=c, via_lbmrd=p == 15380, packets=sum(r["index"] == 0 for r in rs),
               bytes=sum(r["length"] for r in rs if r["index"] == 0),
               records=len(rs), tirs=sum(r["kind"] == "TIR" for r in rs), tqrs=sum(r["kind"] == "TQR" for r in rs),
               keepalives=sum(r["kind"] == "KEEPALIVE" for r in rs),
               first_seen=iso(min(r["us"] for r in rs)), last_seen=iso(max(r["us"] for r in rs)))
          for (s, p, c), rs in talk.items()]
    tt.sort(key=lambda x: (-x["packets"], -x["bytes"], x["context"], x["src_id"] or ""))
    T["contexts"] = tt
    T["top_talkers"] = tt[:top]
    # lbmrd clients that joined / vanished (15 s rule)
    good = [r for r in recs if r["kind"] != "DECODE_ERROR"]
    changes = []
    if good:
        start, end = min(r["us"] for r in good), max(r["us"] for r in good)
        for (s, p, c), rs in talk.items():
            if p == 15380 or not any(r["kind"] == "KEEPALIVE" or r["dport"] == 15380 for r in rs):
                continue
            f, la = min(r["us"] for r in rs), max(r["us"] for r in rs)
            n = sum(r["index"] == 0 for r in rs)
            if f - start > 15_000_000:
                changes.append(dict(client=f"{s}:{p}", src_id=c, event="joined", time=iso(f), silent_s=None,
                                    datagrams=n))
            if end - la > 15_000_000:
                changes.append(dict(client=f"{s}:{p}", src_id=c, event="vanished", time=iso(la),
                                    silent_s=round((end - la) / 1e6, 3), datagrams=n))
    T["client_changes"] = sorted(changes, key=lambda x: (x["time"], x["client"], x["event"]))
    # wildcards
    wc = defaultdict(list)
    for r in recs:
        if r["kind"] == "WC_TQR":
            wc[(r["topic"], r["pattern_type"])].append(r)
    topics = sorted(by_topic)
    pats, matches = [], []
    for (p, t) in sorted(wc):
        rs = wc[(p, t)]
        try:
            rx, err = re.compile(p), None
        except re.error as e:
            rx, err = None, f"invalid pattern: {e}"
        hits = [x for x in topics if rx is not None and rx.search(x)]
        matches += [dict(pattern=p, pattern_type=t, topic=x) for x in hits]
        pats.append(dict(pattern=p, pattern_type=t, queries=len(rs),
                         queriers=" | ".join(sorted({lab(r) for r in rs})),
                         first_seen=iso(min(r["us"] for r in rs)), last_seen=iso(max(r["us"] for r in rs)),
                         matched_topics=len(hits), error=err))
    T["wildcard_patterns"] = pats
    T["wildcard_matches"] = matches
    ka = defaultdict(list)
    for r in recs:
        if r["kind"] == "KEEPALIVE":
            ka[r["q"]].append(r)
    T["keepalive_senders"] = [dict(client=c, packets=len(rs), types=joined_set(r["ptype"] for r in rs),
                                   destinations=joined_set(r["dst"] for r in rs),
                                   first_seen=iso(min(r["us"] for r in rs)), last_seen=iso(max(r["us"] for r in rs)))
                              for c, rs in sorted(ka.items())]
    cen = defaultdict(list)
    for rs in ka.values():
        for r in rs:
            cen[r["us"] // 1_000_000 // 60 * 60].append(r)
    T["keepalive_census"] = [dict(minute=m, time=iso_s(m), clients=len({(r["src"], r["sport"]) for r in rs}),
                                  packets=len(rs)) for m, rs in sorted(cen.items())]
    hosts = set()
    for r in good:
        if r["sport"] != 15380:
            hosts.add(r["src"])
        if not r["dst"].startswith(tuple(f"{n}." for n in range(224, 240))):
            hosts.add(r["dst"])
    nat = defaultdict(list)
    for r in tirs:
        ip = r["tip"]
        if ip and ip != "0.0.0.0" and not nat_reachable(ip, hosts):
            nat[(ip, r["tid"], r["topic"], lab(r))].append(r)
    T["nat_audit"] = [dict(advertised_ip=k[0], transport_id=k[1], topic=k[2], advertiser=k[3],
                           via_lbmrd=rs[0]["sport"] == 15380, advertisements=len(rs),
                           first_seen=iso(min(r["us"] for r in rs)), last_seen=iso(max(r["us"] for r in rs)),
                           reason="no host of this /24 or private block was seen in the capture")
                      for k, rs in sorted(nat.items())]
    T["capture_errors"] = [dict(file=e.path, offset=e.offset, error=e.reason) for e in capture_errors]
    T["decode_errors"] = [dict(file=r["file"], offset=r["offset"], time=iso(r["us"]), src=r["src"], sport=r["sport"],
                               dst=r["dst"], dport=r["dport"], length=r["length"], error=r["error"])
                          for r in sorted(recs, key=lambda r: (r["file"], r["offset"])) if r["kind"] == "DECODE_ERROR"]
    files = defaultdict(list)
    for r in recs:
        files[r["file"]].append(r)
    T["files"] = [dict(file=f, datagrams=sum(r["index"] == 0 for r in rs), records=len(rs),
                       bytes=sum(r["length"] for r in rs if r["index"] == 0),
                       decode_errors=sum(r["kind"] == "DECODE_ERROR" for r in rs),
                       capture_errors=sum(e.path == f for e in capture_errors),
                       first_seen=iso(min(r["us"] for r in rs)), last_seen=iso(max(r["us"] for r in rs)))
                  for f, rs in sorted(files.items())]
    return T


COMPARED = [t for t in TABLES if t not in ("summary", "findings")]


def assert_tables_equal(got: dict, want: dict, names=COMPARED) -> None:
    """Each table of ``names`` in ``got`` equals the one in ``want``."""
    for name in names:
        assert got[name] == want[name], f"table {name} differs"


def reference_for(path: Path, ports=PORTS | {20000}, **kw) -> dict:
    """The plain-Python reference tables of the capture at ``path`` (datagrams to ``ports``);
    ``kw``: :func:`reference`'s settings."""
    return reference(ref_records(str(path), read_udp(str(path), ports=ports)), **kw)


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


# ------------------------------------------------------------------------------------------ lbmrd


def networks_file(n: int, per_domain: int = 1000, overlap_every: int = 0) -> str:
    """An lbmrd file of ``n`` /32 networks, ``per_domain`` to a domain (and a /24 at every
    ``overlap_every``-th, overlapping), and n / 10 transformation rules, one in ten
    shadowed by the one before."""
    out = ['<?xml version="1.0"?>', '<lbmrd version="1.0">', "<domains>"]
    for d in range(max(1, n // per_domain)):
        out.append(f'<domain name="d{d}">')
        for k in range(per_domain):
            i = d * per_domain + k
            out.append(f"<network>10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}/32</network>")
            if overlap_every and i % overlap_every == 0:
                out.append(f"<network>10.{(i >> 16) & 255}.{(i >> 8) & 255}.0/24</network>")
        out.append("</domain>")
    out += ["</domains>", "<transformations>"]
    for k in range(n // 10):  # one rule in ten shadowed by the one before
        port = "*" if k % 10 == 0 else str(1000 + k)
        out.append(f'<transform source="d0" destination="d{k % max(1, n // per_domain)}"><rule>'
                   f'<match address="10.9.{(k >> 8) & 255}.{k & 255}" port="{port}"/>'
                   '<replace address="10.8.0.1" port="*"/></rule></transform>')
    out += ["</transformations>", "</lbmrd>"]
    return "\n".join(out)
# ---------------------------------------------------------------- operators' pages in a browser

#: Debian's chromium (scripts/test installs it); Playwright drives it and downloads nothing
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: the sizes a page must read at: a laptop screen and a phone
PAGE_SIZES = {"wide": (1280, 800), "narrow": (390, 844)}
#: a page's blocks: no two may overlap (unless one holds the other)
PAGE_BLOCKS = "header,h1,h2,h3,summary,section.card,div.tile,div.tools,div.scroll,svg.topology,div.legend,p.note"

_PAGE_OVERLAPS = """sel => {
  const els = Array.from(document.querySelectorAll(sel)).filter(e => e.checkVisibility());
  const box = els.map(e => e.getBoundingClientRect());
  const name = e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + ' "' + e.textContent.trim().slice(0, 30) + '"';
  const bad = [];
  for (let i = 0; i < els.length; i++) for (let j = i + 1; j < els.length; j++) {
    if (els[i].contains(els[j]) || els[j].contains(els[i])) continue;
    const a = box[i], b = box[j];
    const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
    const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
    if (w > 0.5 && h > 0.5) bad.push(name(els[i]) + ' / ' + name(els[j]));
  }
  return {checked: els.length, bad: bad};
}"""



# ---------------------------------------------------------------- transport findings (lbmr-analyze, issue 24)

#: the findings capture's sessions (see write_transport_findings_capture): name -> source string
FINDINGS_SESSIONS = {
    "stop": "LBTRM:10.1.0.1:14390:00000011:239.3.3.1:14400",
    "ncf": "LBTRM:10.1.0.1:14391:00000022:239.3.3.2:14400",
    "clean": "LBTRM:10.1.0.1:14392:00000033:239.3.3.3:14400",
    "ru": "LBTRU:10.1.0.1:14380:00000044",
    "tcp": "TCP:10.1.0.1:14371:00000055",
    "storm": "LBTRM:10.1.0.1:14393:00000066:239.3.3.4:14400",
    "unadvertised": "LBTRM:10.1.0.9:14394:00000077:239.3.3.9:14400",
}
#: tshark's "Decode As" rules for the findings capture
FINDINGS_DECODE_AS = ("udp.port==14400,lbtrm", "udp.port==14390,lbtrm", "udp.port==14391,lbtrm",
                      "udp.port==14392,lbtrm", "udp.port==14393,lbtrm", "udp.port==14394,lbtrm",
                      "udp.port==14380,lbtru", "tcp.port==14371,lbttcp", "udp.port==12965,lbmr")
FINDINGS_T0 = 1_700_000_000


def tcp_packet(src: tuple[str, int], dst: tuple[str, int], seq: int, ack: int, flags: int, payload: bytes = b"",
               window: int = 65535) -> bytes:
    """A raw IPv4 packet holding a TCP segment with the given advertised window (checksums valid)."""
    import struct
    s, d = bytes(map(int, src[0].split("."))), bytes(map(int, dst[0].split(".")))
    hdr = struct.pack("!HHIIBBHHH", src[1], dst[1], seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, 5 << 4, flags, window, 0, 0)
    body = s + d + struct.pack("!BBH", 0, 6, len(hdr) + len(payload)) + hdr + payload
    if len(body) % 2:
        body += b"\0"
    total = sum(struct.unpack(f"!{len(body) // 2}H", body))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    hdr = hdr[:16] + struct.pack("!H", ~total & 0xFFFF) + hdr[18:]
    return ipv4_packet(src[0], dst[0], 6, hdr + payload)


def write_transport_findings_capture(path: Path) -> int:
    """A raw-IPv4 pcap whose transport sessions each show the evidence of known
    findings (times in seconds after FINDINGS_T0; returns the frame count):

    * ``stop`` (LBT-RM, topics stop.a idx 1 and stop.b idx 2): DATA 0..99 in
      0..0.99 s; receiver 10.2.0.1:45001 NAKs 10, 11 (retransmitted), then after
      the last original NAKs 95, 97 at 1.05 s, 1.4, 1.8 and 2.2 s; the source's
      last packet is an SM at 1.2 s; the NAKs at 1.8 and 2.2 s are answered by
      ICMP port unreachable from the source's host.
    * ``ncf`` (topic ncf.t): DATA 0..49 in 3.0..3.49 s; receiver 10.2.0.1:45002
      NAKs 5 (retransmitted, then NAKed again: two NCFs 'ignored'), 6 (NCF
      shed), 7 (retransmit delay), 8 (do not retry); 6, 7, 8 never retransmitted.
    * ``clean`` (topic clean.t): DATA 0..49 in 4.0..4.49 s, no loss.
    * ``ru`` (LBT-RU, topic ru.t): client 10.2.0.4:45100 connects, DATA 0..29
      without 3 and 7, NAKs 3 and 7, both retransmitted.
    * ``tcp`` (LBT-TCP, topic tcp.t): receiver 10.2.0.6:45200 advertises a
      zero window in 3 ACKs, then resets the connection.
    * ``storm`` (topic storm.t): DATA 0..9 at 6.0 s; receiver 10.2.0.5:45005
      sends 250 NAKs of 3 in 6.1..6.9 s, 3 retransmitted at 6.95 s; SMs only
      at 8.0 and 9.0 s.
    * ``unadvertised`` (no TIR): DATA 0..4 at 10.0 s, receiver 10.2.0.3:45003
      NAKs 2, retransmitted.
    * bad input at 11 s: an LBT-RM datagram of version 1 to stop's group, a NAK
      to stop's NAK port shorter than its list.

    Topic resolution: context 10.1.0.1:40000 advertises every topic but
    unadvertised's; context 10.2.0.1:40001 queries stop.a, ncf.t and clean.t,
    context 10.2.0.2:40002 stop.a and stop.b.
    """
    import lbmr_proto as L
    from lbmr_proto import lbmc as C
    from lbmr_proto import lbtrm as RM
    from lbmr_proto import lbtru as RU
    from lbmr_proto.capture import LINKTYPE_RAW, PcapWriter

    frames: list[tuple[float, bytes]] = []

    def at(t: float, frame: bytes) -> None:
        frames.append((t, frame))

    src_ip = "10.1.0.1"
    rm = {"stop": (14390, 0x11, "239.3.3.1"), "ncf": (14391, 0x22, "239.3.3.2"), "clean": (14392, 0x33, "239.3.3.3"),
          "storm": (14393, 0x66, "239.3.3.4")}
    tirs = [L.TIR("stop.a", L.LbtrmTransport(src_ip, "239.3.3.1", 0x11, 14400, 14390), 0, 1),
            L.TIR("stop.b", L.LbtrmTransport(src_ip, "239.3.3.1", 0x11, 14400, 14390), 0, 2),
            L.TIR("ncf.t", L.LbtrmTransport(src_ip, "239.3.3.2", 0x22, 14400, 14391), 0, 3),
            L.TIR("clean.t", L.LbtrmTransport(src_ip, "239.3.3.3", 0x33, 14400, 14392), 0, 4),
            L.TIR("ru.t", L.LbtruSessionTransport(src_ip, 0x44, 14380), 0, 5),
            L.TIR("tcp.t", L.TcpSessionTransport(src_ip, 0x55, 14371), 0, 6),
            L.TIR("storm.t", L.LbtrmTransport(src_ip, "239.3.3.4", 0x66, 14400, 14393), 0, 7)]
    at(-0.5, udp_packet((src_ip, 40000), ("239.1.1.1", 12965), L.encode(L.Packet(0, tirs=tirs))))
    at(-0.7, udp_packet(("10.2.0.1", 40001), ("239.1.1.1", 12965),
                        L.encode(L.Packet(0, tqrs=[L.TQR("stop.a"), L.TQR("ncf.t"), L.TQR("clean.t")]))))
    at(-0.6, udp_packet(("10.2.0.2", 40002), ("239.1.1.1", 12965),
                        L.encode(L.Packet(0, tqrs=[L.TQR("stop.a"), L.TQR("stop.b")]))))
    rx = RM.FLAG_UNICAST_NAKS | RM.FLAG_RETRANSMISSION

    def data(name, t, q, tidx, retx=False, ip=src_ip, group=None, port=None, sid=None):
        p, s, g = rm[name] if name in rm else (port, sid, group)
        at(t, udp_packet((ip, 50000), (g, 14400), RM.encode_data(p, s, q, 0, C.data_message(tidx, q, b"m%d" % q),
                                                                   **({"flags": rx} if retx else {}))))

    def nak(name, t, rcv, sqns, ip=src_ip, port=None, sid=None):
        p, s, _ = rm[name] if name in rm else (port, sid, None)
        pkt = udp_packet(rcv, (ip, p), RM.encode_nak(p, s, sqns))
        at(t, pkt)
        return pkt

    def ncf(name, t, sqns, reason):
        p, s, g = rm[name]
        at(t, udp_packet((src_ip, 50000), (g, 14400), RM.encode_ncf(p, s, 0, sqns, reason=reason)))

    def sm(name, t, k, lead):
        p, s, g = rm[name]
        at(t, udp_packet((src_ip, 50000), (g, 14400), RM.encode_sm(p, s, k, lead, 0)))

    # stop: the source stops while its receiver still NAKs
    r1 = ("10.2.0.1", 45001)
    for q in range(100):
        data("stop", q / 100, q, 1 + q % 2)
    nak("stop", 0.5, r1, [10, 11])
    data("stop", 0.51, 10, 1, retx=True)
    data("stop", 0.52, 11, 2, retx=True)
    for t in (1.05, 1.4):
        nak("stop", t, r1, [95, 97])
    sm("stop", 1.2, 0, 99)
    for t in (1.8, 2.2):
        at(t + 0.0001, icmp_unreachable(src_ip, nak("stop", t, r1, [95, 97])))
    # ncf: every NCF reason
    r2 = ("10.2.0.1", 45002)
    for q in range(50):
        data("ncf", 3 + q / 100, q, 3)
    nak("ncf", 3.1, r2, [5])
    data("ncf", 3.105, 5, 3, retx=True)
    nak("ncf", 3.2, r2, [5])
    ncf("ncf", 3.201, [5], RM.NCF_IGNORED)
    nak("ncf", 3.3, r2, [5])
    ncf("ncf", 3.301, [5], RM.NCF_IGNORED)
    nak("ncf", 3.35, r2, [6, 7, 8])
    ncf("ncf", 3.351, [6], RM.NCF_SHED)
    ncf("ncf", 3.352, [7], RM.NCF_RX_DELAY)
    ncf("ncf", 3.353, [8], RM.NCF_NO_RETRY)
    # clean
    for q in range(50):
        data("clean", 4 + q / 100, q, 4)
    # ru: LBT-RU with loss, recovered
    ru_src, ru_rcv, rsid = (src_ip, 14380), ("10.2.0.4", 45100), 0x44
    at(4.9, udp_packet(ru_rcv, ru_src, RU.encode_creq(session_id=rsid, client_id=9)))
    at(4.95, udp_packet(ru_src, ru_rcv, RU.encode_sm(0, 0, 0, syn=True, session_id=rsid, client_id=9)))
    for q in range(30):
        if q not in (3, 7):
            at(5 + q / 100, udp_packet(ru_src, ru_rcv, RU.encode_data(q, 0, C.data_message(5, q, b"r"),
                                                                       session_id=rsid)))
    at(5.4, udp_packet(ru_rcv, ru_src, RU.encode_nak([3, 7], session_id=rsid, client_id=9)))
    for q in (3, 7):
        at(5.41 + q / 1000, udp_packet(ru_src, ru_rcv, RU.encode_data(q, 0, C.data_message(5, q, b"r"),
                                                                      session_id=rsid, retransmission=True)))
    # tcp: a receiver whose window stays at zero, then a reset
    t_src, t_rcv, tsid = (src_ip, 14371), ("10.2.0.6", 45200), 0x55
    seq = {True: 1000, False: 5000}
    at(5.5, tcp_packet(t_rcv, t_src, seq[False], 0, 0x02))
    at(5.501, tcp_packet(t_src, t_rcv, seq[True], seq[False] + 1, 0x12))
    seq[True] += 1
    seq[False] += 1
    at(5.502, tcp_packet(t_rcv, t_src, seq[False], seq[True], 0x10))
    first = C.encode(C.Message(C.CONTROL, headers=(C.TcpSidHeader(0, tsid),)))
    for i, chunk in enumerate([first + C.data_message(6, 0, b"t0"), C.data_message(6, 1, b"t1")]):
        at(5.51 + i / 100, tcp_packet(t_src, t_rcv, seq[True], seq[False], 0x18, chunk))
        seq[True] += len(chunk)
    for i in range(3):
        at(5.6 + i / 10, tcp_packet(t_rcv, t_src, seq[False], seq[True], 0x10, window=0))
    at(5.95, tcp_packet(t_rcv, t_src, seq[False], seq[True], 0x14))
    # storm: a NAK storm, then an idle session
    r5 = ("10.2.0.5", 45005)
    for q in range(10):
        data("storm", 6 + q / 1000, q, 7)
    for i in range(250):
        nak("storm", 6.1 + i * 0.0032, r5, [3])
    data("storm", 6.95, 3, 7, retx=True)
    sm("storm", 8.0, 0, 9)
    sm("storm", 9.0, 1, 9)
    # unadvertised: no TIR names it
    r3 = ("10.2.0.3", 45003)
    for q in range(5):
        data(None, 10 + q / 100, q, 42, ip="10.1.0.9", group="239.3.3.9", port=14394, sid=0x77)
    nak(None, 10.1, r3, [2], ip="10.1.0.9", port=14394, sid=0x77)
    data(None, 10.12, 2, 42, retx=True, ip="10.1.0.9", group="239.3.3.9", port=14394, sid=0x77)
    # bad input on stop's addresses
    at(11.0, udp_packet((src_ip, 50000), ("239.3.3.1", 14400), b"\x10" + bytes(23)))
    at(11.1, udp_packet(r1, (src_ip, 14390), RM.encode_nak(14390, 0x11, [1, 2, 3])[:-4]))
    frames.sort(key=lambda x: x[0])
    with PcapWriter(path, linktype=LINKTYPE_RAW) as w:
        for t, f in frames:
            w.write_frame(FINDINGS_T0 + t, f)
    return len(frames)


def analyse_without_spark(cap: Path, out: Path, split_size: int = 1 << 30, *, transport: bool = True,
                          storm_threshold: int = 1000) -> tuple[dict, dict]:
    """lbmr-analyze's job in this process, without Spark: each byte range of
    ``cap`` decoded and written under ``out/records`` as a decoding task does,
    the transport tasks' function per range, the driver's merge and analyses:
    (summary, tables)."""
    import shutil

    from lbmr_analyze import partials as P
    from lbmr_analyze import splits as S
    from lbmr_analyze.job import analyse
    from lbmr_analyze.rows import write_split
    from lbmr_analyze.transport import transport_pass

    ports = frozenset({12965, 15380})
    shutil.rmtree(out / "records", ignore_errors=True)
    parts: list = []
    splits = S.plan([str(cap)], split_size)
    rows, seen = [], []            # pcapng: the blocks in force at each range's start, as the job hands them
    for s in splits:
        ctx = S.context_for(seen, 1 << 62) if s.start else b""
        seen += S.context_blocks(s) if len(splits) > 1 else []
        rows.append((s.split_id, s.path, s.start, s.end, s.size, ctx))
        write_split(s, ports, ctx, str(out / "records"), partials=parts)
    merged = P.merge(parts)
    tx = None
    if transport:
        tx = transport_pass(None, rows, ports, merged)
    return analyse(None, str(out / "records"), merged, transport=tx, storm_threshold=storm_threshold)


#: The report's main blocks, none of which may overlap another (unless one contains the other).
REPORT_BLOCKS = "h1,h2,h3,p,img,input.filter,div.scroll,table.kinds,section.kind,details.finding,ul.tfindings"
#: A script returning {checked, bad}: the visible REPORT_BLOCKS and the pairs that overlap.
REPORT_OVERLAPS_JS = """sel => {
  const els = Array.from(document.querySelectorAll(sel)).filter(e => e.checkVisibility({visibilityProperty: true}));
  const box = els.map(e => e.getBoundingClientRect());
  const name = e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + ' "' + e.textContent.trim().slice(0, 40) + '"';
  const bad = [];
  for (let i = 0; i < els.length; i++) for (let j = i + 1; j < els.length; j++) {
    if (els[i].contains(els[j]) || els[j].contains(els[i])) continue;
    const a = box[i], b = box[j];
    const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
    const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
    if (w > 0.5 && h > 0.5) bad.push(name(els[i]) + ' / ' + name(els[j]));
  }
  return {checked: els.length, bad: bad};
}"""


def launch_chromium(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])


class MonitorPage:
    """A daemon's page (``base``: ``http[s]://host:port``) open in a fresh
    browser context of ``size`` (a :data:`PAGE_SIZES` key), with what it
    logged, every request it made and every dialog it opened; ``credentials``:
    (user, password): what a person types when the browser asks (HTTP basic
    authentication, after the endpoint's 401 challenge)."""

    def __init__(self, browser, base: str, size: str = "wide", *, credentials=None,
                 ignore_https_errors: bool = False) -> None:
        w, h = PAGE_SIZES[size]
        self.base = base
        self.context = browser.new_context(
            viewport={"width": w, "height": h}, ignore_https_errors=ignore_https_errors,
            http_credentials=None if credentials is None else {"username": credentials[0],
                                                                 "password": credentials[1]})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.responses: list[tuple[int, str]] = []
        self.dialogs: list[str] = []
        self.page.on("response", lambda r: self.responses.append((r.status, r.url)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    def open(self, path: str = "/", timeout: float = 20.0) -> MonitorPage:
        """Load the page and wait until its data came (the header says "updated")."""
        self.page.goto(self.base + path, wait_until="load")
        self.wait_updated(timeout)
        return self

    def wait_updated(self, timeout: float = 20.0) -> None:
        self.page.wait_for_function(
            "() => (document.getElementById('updated') || {}).textContent.startsWith('updated')",
            timeout=timeout * 1000)

    def js(self, script: str, arg=None):
        return self.page.evaluate(script, arg)

    def overlaps(self) -> dict:
        return self.js(_PAGE_OVERLAPS, PAGE_BLOCKS)

    def horizontal_overflow(self) -> int:
        """Pixels the document is wider than the window (0: no sideways scrolling)."""
        return self.js("() => document.documentElement.scrollWidth - window.innerWidth")

    def column(self, table_id: str, index: int) -> list[str]:
        return self.js("""([id, i]) => Array.from(document.getElementById(id).tBodies[0].rows)
                          .filter(r => !r.classList.contains('empty')).map(r => r.cells[i].textContent)""",
                       [table_id, index])

    def screenshot(self, path, full_page: bool = False) -> bytes:
        return self.page.screenshot(path=str(path), full_page=full_page)

    def close(self) -> None:
        self.context.close()


def check_page_basics(p: MonitorPage) -> None:
    """No console error, no request outside the endpoint, every answer 200, no dialog, no
    overlapping blocks, no sideways scrolling of the whole page."""
    assert p.errors == [], p.errors
    assert p.requests and all(u.startswith(p.base + "/") for u in p.requests), p.requests
    assert all(status == 200 for status, _ in p.responses if status != 401), p.responses  # 401: the challenge
    assert p.dialogs == []
    ov = p.overlaps()
    assert ov["checked"] > 5 and ov["bad"] == [], ov
    assert p.horizontal_overflow() <= 0


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


class RouterChain:
    """lbmrds and lbmr-routers as processes on loopback, for the pages'
    tests and benchmarks: router ``r{i}`` (i from 1) in domain i, its TRD an
    lbmrd on 127.0.i.1 (a free port), its ``<metrics>`` endpoint on
    127.0.0.1 (a free port; ``metrics_extra``: more ``<metrics>`` attributes
    and ``daemon_extra``: more ``<daemon>`` elements after it), each linked
    to the next (``r{i}`` initiator, ``r{i+1}`` acceptor, on 127.0.0.1).
    ``spare_acceptors``: router name -> extra acceptor peer portals (their
    listen ports in ``spare_ports``), for a test's own peer. Logs in ``tmp``."""

    def __init__(self, tmp: Path, n: int, *, spare_acceptors: dict[str, int] | None = None,
                 metrics_extra: str = "", daemon_extra: str = "") -> None:

        self.tmp, self.n = tmp, n
        self.procs: list = []
        self.by_name: dict = {}  # process name (r1, lbmrd1, a spawned one's) -> its Popen
        self.lbmrd = {i: (f"127.0.{i}.1", free_port(socket.SOCK_DGRAM, f"127.0.{i}.1")) for i in range(1, n + 1)}
        self.metrics = {f"r{i}": free_port(socket.SOCK_STREAM) for i in range(1, n + 1)}
        link_ports = {i: free_port(socket.SOCK_STREAM) for i in range(2, n + 1)}  # r{i} accepts r{i-1}
        self.spare_ports: dict[str, list[int]] = {}
        try:
            for i, (ip, port) in self.lbmrd.items():
                self._spawn(f"lbmrd{i}", LBMRD + ["-i", ip, "-p", str(port), "--stats-interval", "0"])
            for i in range(1, n + 1):
                ip, lport = self.lbmrd[i]
                tr = (f'<topic-resolution>\n        <interface>{ip}</interface>\n'
                      f'        <lbmrd address="{ip}" port="{lport}"/>\n      </topic-resolution>')
                low = 30000 + 40 * i + (os.getpid() % 200) * 200
                peers = []
                if i > 1:
                    peers.append(peer_xml(f"{i}-from-{i - 1}", "127.0.0.1", acceptor_xml(link_ports[i])))
                if i < n:
                    peers.append(peer_xml(f"{i}-to-{i + 1}", "127.0.0.1",
                                          initiator_xml("127.0.0.1", link_ports[i + 1], 300)))
                for k in range((spare_acceptors or {}).get(f"r{i}", 0)):
                    p = free_port(socket.SOCK_STREAM)
                    self.spare_ports.setdefault(f"r{i}", []).append(p)
                    peers.append(peer_xml(f"{i}-spare-{k}", "127.0.0.1", acceptor_xml(p)))
                daemon = (f"\n    <metrics{metrics_extra}>127.0.0.1:{self.metrics[f'r{i}']}</metrics>"
                          f"{daemon_extra}")
                cfg = tmp / f"r{i}.xml"
                cfg.write_text(router_xml(f"r{i}", [endpoint_xml(f"T{i}", i, ip, tr=tr, relay=(low, low + 39))],
                                          peers, daemon=daemon), encoding="utf-8")
                self._spawn(f"r{i}", ROUTER + [str(cfg)])
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, argv: list[str]) -> None:
        import subprocess

        log = open(self.tmp / f"{name}.log", "wb")
        self.procs.append((subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), log))
        self.by_name[name] = self.procs[-1][0]

    def spawn(self, name: str, argv: list[str]) -> None:
        """One more process of the test's (stopped with the others)."""
        self._spawn(name, argv)

    def end(self, name: str) -> None:
        """Stop one process (SIGTERM, then SIGKILL after 10 s)."""
        import subprocess

        p = self.by_name[name]
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def base(self, router: str, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.metrics[router]}"

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for p, _ in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p, log in self.procs:
            try:
                p.wait(10)
            except Exception:  # noqa: BLE001 - a process that ignores SIGTERM
                p.kill()
                p.wait()
            log.close()
        self.procs = []


def make_ca(tmp: Path, name: str) -> tuple[str, str]:
    """A self-signed CA made by openssl: (key file, certificate file)."""
    import subprocess

    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{tmp}/{name}.key",
                    "-out", f"{tmp}/{name}.pem", "-days", "2", "-subj", f"/CN={name}"], check=True,
                   capture_output=True)
    return f"{tmp}/{name}.key", f"{tmp}/{name}.pem"


def make_cert(tmp: Path, name: str, ca: tuple[str, str], san: str = "IP:127.0.0.1") -> tuple[str, str]:
    """A certificate for ``san`` signed by ``ca`` (from :func:`make_ca`): (certificate, key)."""
    import subprocess

    ca_key, ca_crt = ca
    subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{tmp}/{name}.key",
                    "-out", f"{tmp}/{name}.csr", "-subj", f"/CN={name}", "-addext", f"subjectAltName={san}"],
                   check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", f"{tmp}/{name}.csr", "-CA", ca_crt, "-CAkey", ca_key,
                    "-CAcreateserial", "-out", f"{tmp}/{name}.pem", "-days", "2", "-copy_extensions", "copy"],
                   check=True, capture_output=True)
    os.chmod(f"{tmp}/{name}.key", 0o600)
    return f"{tmp}/{name}.pem", f"{tmp}/{name}.key"


def tshark_lbtrm_counts(path: Path, decode_as) -> dict:
    """Per LBT-RM (session id, NAK port): a Counter, as tshark counts them (no ICMP quotes):
    originals, retransmissions, NAK packets and entries, NCFs by reason, SMs.
    Packets tshark finds malformed or of another version are bad input (we
    count those by reason instead)."""
    from collections import Counter

    from tests.tshark_judge import tshark_field_rows
    rows = tshark_field_rows(path, decode_as, ["lbtrm.hdr.type", "lbtrm.hdr.session_id", "lbtrm.hdr.ucast_port",
                                               "lbtrm.data.flags_fec_type.rx", "lbtrm.ncf.reason",
                                               "lbtrm.nak.list.nak"],
                             "lbtrm && !icmp && lbtrm.hdr.ver == 0 && !_ws.malformed")
    out: dict[tuple[int, int], Counter] = {}
    for f in rows.values():
        c = out.setdefault((f["lbtrm.hdr.session_id"][0], f["lbtrm.hdr.ucast_port"][0]), Counter())
        t = f["lbtrm.hdr.type"][0]
        if t == 0:
            c["retransmissions" if f["lbtrm.data.flags_fec_type.rx"][0] else "originals"] += 1
        elif t == 2:
            c["session_messages"] += 1
        elif t == 3:
            c["nak_packets"] += 1
            c["nak_entries"] += len(f.get("lbtrm.nak.list.nak", []))
        elif t == 4:
            c[f"ncf_{f['lbtrm.ncf.reason'][0]}"] += 1
    return out
