"""TCP segments and ICMP errors in link-layer frames (beside the UDP datagrams
of :mod:`lbmr_proto._udpframing`), for the transport-session decoders.

:func:`ip_packet` decodes one frame into a :class:`~lbmr_proto._capfile.UdpDatagram`
(fragments reassembled by the caller's :class:`~lbmr_proto._reassembly.Reassembler`),
a :class:`TcpSegment`, an :class:`IcmpError` quoting a UDP datagram, or None.
:func:`ip_packets` does it for every frame of a capture.

All IPv4, TCP, UDP and ICMP header fields are big-endian (network byte order).
Timestamps are ``float`` seconds since the Unix epoch; addresses dotted-quad
strings; ports, sequence numbers and lengths ints (lengths in bytes).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from . import _capfile, _pcapngread, _pcapread
from ._capfile import CaptureError, UdpDatagram
from ._reassembly import Reassembler
from ._udpframing import ip_start, ipv4_udp
from ._wire import ip_text

_IP = struct.Struct("!BxHHHxB2x4s4s").unpack_from   # vihl, total len, id, flags/frag, proto, src, dst
_TCP = struct.Struct("!HHIIBBH").unpack_from        # sport, dport, seq, ack, data offset, flags, window
_UDP = struct.Struct("!HHH").unpack_from            # sport, dport, length

#: TCP flag bits (the 13th byte of the TCP header)
TCP_FIN, TCP_SYN, TCP_RST, TCP_PSH, TCP_ACK = 0x01, 0x02, 0x04, 0x08, 0x10
#: ICMP destination unreachable (type 3), port unreachable (code 3)
ICMP_UNREACHABLE, ICMP_PORT_UNREACHABLE = 3, 3


class TcpSegment(NamedTuple):
    """One TCP segment over IPv4 (not fragmented): ``seq`` and ``ack`` are the
    header's u32 sequence and acknowledgement numbers, ``flags`` its flag byte
    (``TCP_*``), ``window`` the u16 advertised window (unscaled), ``payload`` the
    segment's data (cut short if the capture's snaplen did). ``frame`` is the
    1-based frame number, ``offset`` the byte offset of its record in the file."""

    ts: float
    src: str
    sport: int
    dst: str
    dport: int
    seq: int
    ack: int
    flags: int
    window: int
    payload: bytes
    frame: int
    offset: int


class IcmpError(NamedTuple):
    """An ICMP destination-unreachable error (from ``sender``, to ``receiver``)
    quoting the start of a UDP datagram: ``type``/``code`` of the ICMP message,
    the quoted datagram's addresses and ports, its UDP payload as far as it is
    quoted (``quoted_len``: the payload's length by its UDP header, bytes)."""

    ts: float
    sender: str
    receiver: str
    type: int
    code: int
    src: str
    sport: int
    dst: str
    dport: int
    payload: bytes
    quoted_len: int
    frame: int
    offset: int


def _tcp(ts, buf, ip: int, hl: int, end: int, s4: bytes, d4: bytes, frame: int, off: int) -> TcpSegment | None:
    t = ip + hl
    if t + 20 > end:
        return None
    sp, dp, seq, ack, doff, flags, win = _TCP(buf, t)
    thl = (doff >> 4) * 4
    if thl < 20 or t + thl > end:
        return None
    return TcpSegment(ts, ip_text(s4), sp, ip_text(d4), dp, seq, ack, flags, win,
                      bytes(buf[t + thl:end]), frame, off)


def _icmp(ts, buf, ip: int, hl: int, end: int, s4: bytes, d4: bytes, frame: int, off: int) -> IcmpError | None:
    c = ip + hl
    if c + 8 + 20 + 8 > end or buf[c] != ICMP_UNREACHABLE:
        return None
    q = c + 8  # the quoted IPv4 header
    vihl, _, _, ff, proto, qs, qd = _IP(buf, q)
    qhl = (vihl & 15) * 4
    if vihl >> 4 != 4 or proto != 17 or qhl < 20 or ff & 0x1FFF or q + qhl + 8 > end:
        return None
    sp, dp, ulen = _UDP(buf, q + qhl)
    u = q + qhl + 8
    want = max(ulen - 8, 0)
    return IcmpError(ts, ip_text(s4), ip_text(d4), buf[c], buf[c + 1], ip_text(qs), sp, ip_text(qd), dp,
                     bytes(buf[u:min(end, u + want)]), want, frame, off)


def ip_packet(ts: float, linktype: int, buf: bytes, start: int, end: int, frame: int, offset: int,
              reasm: Reassembler) -> UdpDatagram | TcpSegment | IcmpError | None:
    """Decode the frame ``buf[start:end]``: a UDP datagram (once its last
    fragment is in), a TCP segment, an ICMP error quoting UDP, or None."""
    ip = ip_start(linktype, buf, start, end)
    if ip < 0 or ip + 20 > end:
        return None
    vihl, tl, _, ff, proto, s4, d4 = _IP(buf, ip)
    hl = (vihl & 15) * 4
    if vihl >> 4 != 4 or hl < 20 or tl < hl:
        return None
    if proto == 17:
        r = ipv4_udp(buf, ip, end, ts, None, reasm)
        return None if r is None else UdpDatagram(ts, *r, frame, offset)
    ip_end = min(end, ip + tl)
    if ff & 0x3FFF:  # TCP and ICMP fragments are not reassembled
        return None
    if proto == 6:
        return _tcp(ts, buf, ip, hl, ip_end, s4, d4, frame, offset)
    if proto == 1:
        return _icmp(ts, buf, ip, hl, ip_end, s4, d4, frame, offset)
    return None


def ip_packets(source, on_error: Callable[[CaptureError], Any] | None,
               reasm: Reassembler) -> Iterator[UdpDatagram | TcpSegment | IcmpError]:
    """Every UDP datagram, TCP segment and quoting ICMP error of a pcap or pcapng capture."""
    src = _capfile.CaptureSource(source)
    try:
        buf = src.head()
        records = _pcapngread.pcapng_records if buf[:4] == _capfile.PCAPNG_MAGIC else _pcapread.pcap_records
        for ts, lt, b, start, end, frame, off in records(src, buf):
            p = ip_packet(ts, lt, b, start, end, frame, off, reasm)
            if p is not None:
                yield p
    except CaptureError as err:
        if on_error is None:
            raise
        on_error(err)
    finally:
        src.close()
