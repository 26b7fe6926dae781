"""UM transport traffic written as raw-IPv4 captures, for the transport-session
decoder, lbmr-inspect and lbmr-analyze's transport pass: IPv4/UDP/TCP/ICMP
packet builders, the generated transport capture (``GEN_*``,
:func:`write_transport_capture`), the findings capture (``FINDINGS_*``,
:func:`write_transport_findings_capture`), and tshark's LBT-RM counts of a
capture (:func:`tshark_lbtrm_counts`)."""

from __future__ import annotations

from pathlib import Path


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


#: the unnamed LBT-RU capture (see write_unnamed_lbtru_capture): the source's ip, port and session id, the
#: receiver that stays, the one that leaves, the TIR's context
UNNAMED_RU = ("10.3.0.1", 14380, 0x5EED0001)
UNNAMED_RU_STAYS, UNNAMED_RU_LEAVES, UNNAMED_RU_CTX = ("10.3.0.2", 45100), ("10.3.0.3", 45101), ("10.3.0.1", 40000)
UNNAMED_RU_GONE = 3  # DATA datagrams the leaving receiver's host answers with ICMP port unreachable
UNNAMED_RU_DECODE_AS = ("udp.port==14380,lbtru", "udp.port==12965,lbmr")


def write_unnamed_lbtru_capture(path: Path, *, tir_first: bool = True, source_exits: bool = False) -> int:
    """An LBT-RU session advertised by TIRs without session id (UM's plain
    ``LbtruTransport``: ip, port; topic ``ru.plain`` index 3, and ``ru.other``
    index 4 in a second TIR at the end) while every datagram carries the
    session-id option; returns the frame count.

    Two receivers connect (a CREQ without session id, the SYN names it);
    DATA 0..9 to both; the staying one
    NAKs 4 and gets it retransmitted, ACKs without session id; the leaving
    one closes its socket after DATA 5, and its host answers the source's
    DATA 6..8 to it with ICMP port unreachable (``UNNAMED_RU_GONE``) before
    the source drops it. ``tir_first``: the first TIR before the traffic
    (else after it); ``source_exits``: the source exits at the end and the
    staying receiver's NAK of 10 is answered with ICMP port unreachable by
    the source's host.
    """
    import lbmr_proto as L
    from lbmr_proto import lbmc as C
    from lbmr_proto import lbtru as RU
    from lbmr_proto.capture import LINKTYPE_RAW, PcapWriter

    ip, port, sid = UNNAMED_RU
    src, stays, leaves = (ip, port), UNNAMED_RU_STAYS, UNNAMED_RU_LEAVES

    def tir(topic, idx):
        return udp_packet(UNNAMED_RU_CTX, ("239.1.1.1", 12965),
                          L.encode(L.Packet(0, tirs=[L.TIR(topic, L.LbtruTransport(ip, port), 0, idx)])))

    frames: list[bytes] = [tir("ru.plain", 3)] if tir_first else []
    for k, rcv in enumerate((stays, leaves)):
        frames.append(udp_packet(rcv, src, RU.encode_creq(client_id=k + 1)))  # the id is not known yet
        frames.append(udp_packet(src, rcv, RU.encode_sm(0, 0, 0, syn=True, session_id=sid, client_id=k + 1)))
    for q in range(10):
        frames.append(udp_packet(src, stays, RU.encode_data(q, 0, C.data_message(3, q, b"d"), session_id=sid)))
        if q < 6:
            frames.append(udp_packet(src, leaves, RU.encode_data(q, 0, C.data_message(3, q, b"d"), session_id=sid)))
        elif q < 6 + UNNAMED_RU_GONE:
            frames.append(icmp_unreachable(leaves[0], udp_packet(src, leaves, RU.encode_data(
                q, 0, C.data_message(3, q, b"d"), session_id=sid))))
    frames.append(udp_packet(stays, src, RU.encode_nak([4], session_id=sid, client_id=1)))
    frames.append(udp_packet(src, stays, RU.encode_data(4, 0, C.data_message(3, 4, b"d"), session_id=sid,
                                                        retransmission=True)))
    frames.append(udp_packet(stays, src, RU.encode_ack(9)))  # no session-id option: the address names it
    if source_exits:
        frames.append(icmp_unreachable(ip, udp_packet(stays, src, RU.encode_nak([10], session_id=sid,
                                                                                 client_id=1))))
    if not tir_first:
        frames.append(tir("ru.plain", 3))
    frames.append(tir("ru.other", 4))
    with PcapWriter(path, linktype=LINKTYPE_RAW) as w:
        for i, f in enumerate(frames):
            w.write_frame(1_700_000_100 + i / 100, f)
    return len(frames)
