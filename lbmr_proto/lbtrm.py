"""LBT-RM datagrams (UM's reliable multicast transport): the common header
and the DATA, SM, NAK and NCF bodies, sans-IO.

Layout (all integers big-endian), as Wireshark's ``packet-lbtrm.c`` reads it:

* header, 8 bytes: ``ver_type`` u8 (version in the high nibble, 0; packet
  type in the low nibble), ``next_hdr`` u8 (0: no option headers follow the
  body), ``ucast_port`` u16 (the source's unicast port, where NAKs go; a NAK
  carries the port of the source it is for), ``session_id`` u32;
* DATA (type 0), 12 bytes then the payload: ``sqn`` u32, ``trail_sqn`` u32
  (oldest sequence the source can still retransmit), ``flags_fec`` u8 (flags
  in the high nibble: 0x80 unicast NAKs, 0x40 multicast NAKs, 0x20
  retransmission, 0x10 late join; FEC type in the low nibble), ``tgsz`` u8,
  ``fec_symbol`` u16;
* SM, session message (type 2), 16 bytes: ``sm_sqn``, ``lead_sqn`` (newest
  data sequence sent), ``trail_sqn`` u32 each, ``flags_fec`` u8, ``tgsz``
  u8, 2 reserved bytes;
* NAK (type 3): ``num_naks`` u16, ``format`` u16 (low nibble: 0 selective,
  1 parity), then ``num_naks`` u32 sequence numbers;
* NCF, NAK confirmation (type 4): ``trail_sqn`` u32, ``num_ncfs`` u16, a
  reserved byte, ``reason_format`` u8 (reason in the high nibble: 0 do not
  retry, 1 ignored, 2 retransmit delay, 3 shed; format in the low nibble),
  then ``num_ncfs`` u32 sequence numbers;
* option headers (when ``next_hdr`` != 0) follow the body: ``next_hdr`` u8,
  ``hdr_len`` u8 (bytes, this header included), 2 reserved bytes.

Sources multicast DATA, SM and NCF datagrams to the transport's group and
destination port from their own address; receivers send NAKs unicast to the
source's address and ``ucast_port``. Everything here is pure: bytes in,
values or bytes out; :class:`LbtrmDecodeError` for malformed input.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "DATA", "SM", "NAK", "NCF", "HEADER", "DATA_HDR", "SM_HDR", "NAK_HDR", "NCF_HDR",
    "FLAG_UNICAST_NAKS", "FLAG_MULTICAST_NAKS", "FLAG_RETRANSMISSION", "FLAG_LATE_JOIN",
    "NCF_NO_RETRY", "NCF_IGNORED", "NCF_RX_DELAY", "NCF_SHED", "MAX_NAKS",
    "LbtrmDecodeError", "Header", "Data", "SessionMessage", "Nak", "Ncf",
    "parse_header", "decode", "encode_data", "encode_sm", "encode_nak", "encode_ncf",
    "rewrite_header",
]

DATA, SM, NAK, NCF = 0x0, 0x2, 0x3, 0x4
TYPE_NAMES = {DATA: "DATA", SM: "SM", NAK: "NAK", NCF: "NCF"}
HEADER = struct.Struct("!BBHI")  # ver_type, next_hdr, ucast_port, session_id
DATA_HDR = struct.Struct("!IIBBH")  # sqn, trail_sqn, flags_fec, tgsz, fec_symbol
SM_HDR = struct.Struct("!IIIBBH")  # sm_sqn, lead_sqn, trail_sqn, flags_fec, tgsz, reserved
NAK_HDR = struct.Struct("!HH")  # num_naks, format
NCF_HDR = struct.Struct("!IHBB")  # trail_sqn, num_ncfs, reserved, reason_format
OPT_HDR = struct.Struct("!BBH")  # next_hdr, hdr_len, reserved
FLAG_UNICAST_NAKS = 0x80
FLAG_MULTICAST_NAKS = 0x40
FLAG_RETRANSMISSION = 0x20
FLAG_LATE_JOIN = 0x10
NCF_NO_RETRY, NCF_IGNORED, NCF_RX_DELAY, NCF_SHED = 0, 1, 2, 3
VERSION = 0
#: sequence numbers in one NAK or NCF that fit a 1500-byte datagram
MAX_NAKS = (1500 - 20 - 8 - HEADER.size - NCF_HDR.size) // 4
_U32 = struct.Struct("!I")


class LbtrmDecodeError(ValueError):
    """Bytes that are not a well-formed LBT-RM datagram (``reason`` says why)."""


@dataclass(frozen=True, slots=True)
class Header:
    """The common header: ``type`` (DATA, SM, NAK or NCF; others are kept as
    read), ``version``, ``next_hdr``, ``ucast_port``, ``session_id``."""

    type: int
    ucast_port: int
    session_id: int
    next_hdr: int = 0
    version: int = VERSION


@dataclass(frozen=True, slots=True)
class Data:
    header: Header
    sqn: int
    trail_sqn: int
    flags: int  # the high nibble of flags_fec (FLAG_*)
    payload: bytes

    @property
    def retransmission(self) -> bool:
        return bool(self.flags & FLAG_RETRANSMISSION)


@dataclass(frozen=True, slots=True)
class SessionMessage:
    header: Header
    sm_sqn: int
    lead_sqn: int
    trail_sqn: int
    flags: int


@dataclass(frozen=True, slots=True)
class Nak:
    header: Header
    sqns: tuple[int, ...]
    format: int = 0


@dataclass(frozen=True, slots=True)
class Ncf:
    header: Header
    trail_sqn: int
    sqns: tuple[int, ...]
    reason: int = NCF_NO_RETRY
    format: int = 0


def parse_header(data: bytes | bytearray | memoryview) -> Header:
    """The common header of ``data``; LbtrmDecodeError if it is shorter than
    8 bytes or not version 0."""
    if len(data) < HEADER.size:
        raise LbtrmDecodeError(f"{len(data)} bytes: shorter than the 8-byte LBT-RM header")
    vt, nh, port, sid = HEADER.unpack_from(data)
    if vt >> 4 != VERSION:
        raise LbtrmDecodeError(f"version {vt >> 4} (only 0 is known)")
    return Header(vt & 0x0F, port, sid, nh, vt >> 4)


def _sqn_list(data, off: int, n: int, what: str) -> tuple[int, ...]:
    if off + 4 * n > len(data):
        raise LbtrmDecodeError(f"{what} announces {n} sequence numbers, {(len(data) - off) // 4} present")
    return struct.unpack_from(f"!{n}I", data, off)


def decode(data: bytes | bytearray | memoryview) -> Data | SessionMessage | Nak | Ncf:
    """One LBT-RM datagram. Option headers (``next_hdr`` != 0) are skipped for
    SM, NAK and NCF; a DATA datagram with option headers keeps them at the
    start of its payload (their length is not known before the payload)."""
    h = parse_header(data)
    off = HEADER.size
    if h.type == DATA:
        if len(data) < off + DATA_HDR.size:
            raise LbtrmDecodeError("DATA shorter than its 12-byte header")
        sqn, trail, fl, _, _ = DATA_HDR.unpack_from(data, off)
        return Data(h, sqn, trail, fl & 0xF0, bytes(data[off + DATA_HDR.size:]))
    if h.type == SM:
        if len(data) < off + SM_HDR.size:
            raise LbtrmDecodeError("SM shorter than its 16-byte header")
        sm, lead, trail, fl, _, _ = SM_HDR.unpack_from(data, off)
        return SessionMessage(h, sm, lead, trail, fl & 0xF0)
    if h.type == NAK:
        if len(data) < off + NAK_HDR.size:
            raise LbtrmDecodeError("NAK shorter than its 4-byte header")
        n, fmt = NAK_HDR.unpack_from(data, off)
        return Nak(h, _sqn_list(data, off + NAK_HDR.size, n, "NAK"), fmt & 0x0F)
    if h.type == NCF:
        if len(data) < off + NCF_HDR.size:
            raise LbtrmDecodeError("NCF shorter than its 8-byte header")
        trail, n, _, rf = NCF_HDR.unpack_from(data, off)
        return Ncf(h, trail, _sqn_list(data, off + NCF_HDR.size, n, "NCF"), rf >> 4, rf & 0x0F)
    raise LbtrmDecodeError(f"unknown packet type {h.type}")


def _header(ptype: int, ucast_port: int, session_id: int) -> bytes:
    try:
        return HEADER.pack((VERSION << 4) | ptype, 0, ucast_port, session_id)
    except struct.error as e:
        raise ValueError(f"LBT-RM header: {e} (port {ucast_port!r}, session id {session_id!r})") from None


def encode_data(ucast_port: int, session_id: int, sqn: int, trail_sqn: int, payload: bytes,
                *, flags: int = FLAG_UNICAST_NAKS) -> bytes:
    """A DATA datagram (``flags``: FLAG_* bits; FLAG_RETRANSMISSION for a retransmission)."""
    return (_header(DATA, ucast_port, session_id)
            + DATA_HDR.pack(sqn & 0xFFFFFFFF, trail_sqn & 0xFFFFFFFF, flags & 0xF0, 0, 0) + bytes(payload))


def encode_sm(ucast_port: int, session_id: int, sm_sqn: int, lead_sqn: int, trail_sqn: int,
              *, flags: int = FLAG_UNICAST_NAKS) -> bytes:
    return (_header(SM, ucast_port, session_id)
            + SM_HDR.pack(sm_sqn & 0xFFFFFFFF, lead_sqn & 0xFFFFFFFF, trail_sqn & 0xFFFFFFFF,
                          flags & 0xF0, 0, 0))


def _sqns(sqns, what: str) -> bytes:
    sqns = list(sqns)
    if not 0 < len(sqns) <= MAX_NAKS:
        raise ValueError(f"{what}: 1..{MAX_NAKS} sequence numbers, not {len(sqns)}")
    return struct.pack(f"!{len(sqns)}I", *(s & 0xFFFFFFFF for s in sqns))


def encode_nak(ucast_port: int, session_id: int, sqns) -> bytes:
    """A selective NAK for ``sqns``, addressed (header) to the source's
    ``ucast_port`` and ``session_id``."""
    body = _sqns(sqns, "NAK")
    return _header(NAK, ucast_port, session_id) + NAK_HDR.pack(len(body) // 4, 0) + body


def encode_ncf(ucast_port: int, session_id: int, trail_sqn: int, sqns, *, reason: int = NCF_RX_DELAY) -> bytes:
    body = _sqns(sqns, "NCF")
    return (_header(NCF, ucast_port, session_id)
            + NCF_HDR.pack(trail_sqn & 0xFFFFFFFF, len(body) // 4, 0, (reason & 0x0F) << 4) + body)


def rewrite_header(data: bytes | bytearray | memoryview, ucast_port: int, session_id: int) -> bytes:
    """``data`` with the header's unicast port and session id replaced (the
    rest unchanged, byte for byte). LbtrmDecodeError if it has no valid header."""
    h = parse_header(data)
    return (HEADER.pack((h.version << 4) | h.type, h.next_hdr, ucast_port, session_id)
            + bytes(data[HEADER.size:]))
