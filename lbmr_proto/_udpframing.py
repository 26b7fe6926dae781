"""UDP/IPv4 datagrams in link-layer frames, both ways: the framing that capture
reading and writing share.

Decoding
    :func:`ip_start` finds the IPv4 header behind a frame's link-layer header
    (Ethernet with stacked 802.1Q/802.1ad tags, Linux cooked SLL and SLL2, raw
    IPv4, BSD null/loopback), :func:`ipv4_udp` decodes the IPv4 and UDP headers
    (feeding fragments to a :class:`~lbmr_proto._reassembly.Reassembler`) and
    :func:`udp_from_frame` does both for one frame, sans-IO.

Encoding
    :func:`udp_frames` builds the frame(s) carrying one datagram, fragmented to
    an MTU if asked.

All IPv4, UDP, Ethernet and SLL header fields are big-endian (network byte
order); the 4-byte address family of ``LINKTYPE_NULL`` is in the capturing
host's byte order (either is accepted; little-endian is written).  Offsets,
lengths and MTUs are in bytes; addresses are dotted-quad strings, ports ints.
"""

from __future__ import annotations

import ipaddress
import struct
from typing import Any

from ._reassembly import Reassembler
from ._wire import ip_text

LINKTYPE_NULL = 0          # 4-byte address family in the capturing host's byte order
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101         # raw IPv4 or IPv6
LINKTYPE_LOOP = 108        # OpenBSD loopback: address family big-endian
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_LINUX_SLL2 = 276
_RAW_LINKTYPES = frozenset((LINKTYPE_RAW, LINKTYPE_IPV4, 12, 14))   # 12/14: DLT_RAW on BSDs
_VLAN_TPIDS = frozenset((0x8100, 0x88A8, 0x9100))

_U16 = struct.Struct("!H").unpack_from
_IP = struct.Struct("!BxHHHxB2x4s4s").unpack_from     # vihl, total len, id, flags/frag, proto, src, dst
_UDP = struct.Struct("!HHH").unpack_from              # sport, dport, length


def ip_start(lt: int, buf: bytes, start: int, end: int) -> int:
    """Offset of the IPv4 header inside the frame ``buf[start:end]``, or -1."""
    if lt == LINKTYPE_ETHERNET:
        p = start + 12
        if p + 2 > end:
            return -1
        et = _U16(buf, p)[0]
        while et in _VLAN_TPIDS and p + 6 <= end:
            p += 4
            et = _U16(buf, p)[0]
        return p + 2 if et == 0x0800 else -1
    if lt in _RAW_LINKTYPES:
        return start
    if lt == LINKTYPE_LINUX_SLL:
        return start + 16 if end - start >= 16 and buf[start + 14:start + 16] == b"\x08\x00" else -1
    if lt == LINKTYPE_LINUX_SLL2:
        return start + 20 if end - start >= 20 and buf[start:start + 2] == b"\x08\x00" else -1
    if lt == LINKTYPE_NULL:
        return start + 4 if buf[start:start + 4] in (b"\x02\0\0\0", b"\0\0\0\x02") else -1
    if lt == LINKTYPE_LOOP:
        return start + 4 if buf[start:start + 4] == b"\0\0\0\x02" else -1
    return -1


def _udp_in(buf: bytes, u: int, uend: int, s4: bytes, d4: bytes, ports) -> tuple | None:
    """Decode the UDP header at ``buf[u:uend]`` -> (src, sport, dst, dport, payload)."""
    if u + 8 > uend:
        return None
    sp, dp, ul = _UDP(buf, u)
    if ports is not None and sp not in ports and dp not in ports:
        return None
    return (ip_text(s4), sp, ip_text(d4), dp, buf[u + 8:u + ul if 8 <= ul <= uend - u else uend])


def ipv4_udp(buf: bytes, ip: int, end: int, ts: float, ports, reasm: Reassembler) -> tuple | None:
    """Decode IPv4 (+ reassembly) and UDP at ``buf[ip:end]`` -> (src, sport, dst, dport,
    payload), or None.  ``ts`` (seconds) drives ``reasm``'s timeout; ``ports`` is a set
    of ports or None for all."""
    if ip + 20 > end:
        return None
    vihl, tl, ident, ff, proto, s4, d4 = _IP(buf, ip)
    hl = (vihl & 15) * 4
    if vihl >> 4 != 4 or proto != 17 or hl < 20 or tl < hl:
        return None
    truncated = tl > end - ip          # snaplen cut the packet short
    ip_end = end if truncated else ip + tl
    if ff & 0x3FFF:
        if truncated or ip + hl > ip_end:
            return None
        data = reasm.feed(ts, (s4, d4, ident, proto), (ff & 0x1FFF) * 8, bool(ff & 0x2000),
                          buf[ip + hl:ip_end])
        return None if data is None else _udp_in(data, 0, len(data), s4, d4, ports)
    return _udp_in(buf, ip + hl, ip_end, s4, d4, ports)


def udp_from_frame(ts: float, linktype: int, frame: bytes, *, ports=None,
                   reassembler: Reassembler | None = None) -> tuple | None:
    """Decode one link-layer frame (sans-IO).

    Returns ``(src, sport, dst, dport, payload)`` for a UDP/IPv4 datagram, or ``None``
    for anything else.  Pass the same ``reassembler`` for successive frames to
    reassemble fragments (``ts`` in seconds drives its timeout); without one,
    fragments yield nothing.
    """
    ip = ip_start(linktype, frame, 0, len(frame))
    if ip < 0:
        return None
    return ipv4_udp(frame, ip, len(frame), ts, ports,
                     reassembler if reassembler is not None else Reassembler())


_MAC_DST = bytes.fromhex("020000000002")
_MAC_SRC = bytes.fromhex("020000000001")
_IPV4_HDR = struct.Struct("!BBHHHBBH4s4s")
_UDP_HDR = struct.Struct("!HHHH")
_LINK_HEADERS = {
    LINKTYPE_ETHERNET: _MAC_DST + _MAC_SRC + b"\x08\x00",
    LINKTYPE_RAW: b"", LINKTYPE_IPV4: b"", 12: b"", 14: b"",
    LINKTYPE_NULL: struct.pack("<I", 2),
    LINKTYPE_LOOP: struct.pack(">I", 2),
    # SLL: packet type 0 (to us), ARPHRD_ETHER, address length 6, address, protocol IPv4
    LINKTYPE_LINUX_SLL: struct.pack("!HHH8sH", 0, 1, 6, _MAC_SRC, 0x0800),
    # SLL2: protocol IPv4, reserved, ifindex 1, ARPHRD_ETHER, packet type 0, address length 6, address
    LINKTYPE_LINUX_SLL2: struct.pack("!HHIHBB8s", 0x0800, 0, 1, 1, 0, 6, _MAC_SRC),
}
_INADDR: dict[Any, tuple[bytes, int]] = {}


def _inaddr(a: str | bytes) -> tuple[bytes, int]:
    r = _INADDR.get(a)
    if r is None:
        b = a if isinstance(a, bytes) else ipaddress.IPv4Address(a).packed
        if len(b) != 4:
            raise ValueError(f"not an IPv4 address: {a!r}")
        if len(_INADDR) >= 65536:
            _INADDR.clear()
        r = _INADDR[a] = (b, int.from_bytes(b, "big"))
    return r


def _ipv4_header(length: int, ident: int, ff: int, src: tuple[bytes, int],
                 dst: tuple[bytes, int], proto: int = 17, ttl: int = 64) -> bytes:
    total = 20 + length
    s = (0x4500 + total + ident + ff + (ttl << 8 | proto)
         + (src[1] >> 16) + (src[1] & 0xFFFF) + (dst[1] >> 16) + (dst[1] & 0xFFFF))
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return _IPV4_HDR.pack(0x45, 0, total, ident, ff, ttl, proto, ~s & 0xFFFF, src[0], dst[0])


def udp_frames(linktype: int, src: str, sport: int, dst: str, dport: int, payload: bytes,
               *, ip_id: int = 0, mtu: int | None = None) -> list[bytes]:
    """Build the link-layer frame(s) carrying one UDP/IPv4 datagram.

    The IPv4 header has a valid checksum, TTL 64 and no options; the UDP checksum is
    0 (none).  If ``mtu`` is given and the IP packet would exceed it, the datagram is
    split into IPv4 fragments of at most ``mtu`` bytes (offsets in 8-byte units, MF on
    all but the last).  Ethernet frames use a fixed pair of locally administered MACs.
    """
    link = _LINK_HEADERS.get(linktype)
    if link is None:
        raise ValueError(f"cannot synthesise UDP frames for link type {linktype}")
    udp_len = 8 + len(payload)
    if udp_len > 65515:
        raise ValueError(f"UDP payload too large ({len(payload)} bytes)")
    s, d = _inaddr(src), _inaddr(dst)
    ident = ip_id & 0xFFFF
    data = _UDP_HDR.pack(sport, dport, udp_len, 0) + payload
    if mtu is None or 20 + udp_len <= mtu:
        return [link + _ipv4_header(udp_len, ident, 0, s, d) + data]
    step = (mtu - 20) & ~7
    if step < 8:
        raise ValueError(f"MTU {mtu} too small to fragment")
    return [link + _ipv4_header(len(data[o:o + step]), ident,
                                (o >> 3) | (0x2000 if o + step < udp_len else 0), s, d)
            + data[o:o + step] for o in range(0, udp_len, step)]
