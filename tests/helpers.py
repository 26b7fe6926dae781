"""Set-up shared by several test modules: commands, free ports, config-file
helpers, and a driver for sans-IO objects with deadlines."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

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
    return (f'<initiator reconnect-interval="{reconnect_ms}"><address>{address}</address>'
            f"<port>{port}</port></initiator>")


def acceptor_xml(port: int) -> str:
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
    (:class:`router.relay_site.RelaySite`'s calls): ``link`` fixed (or None),
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
