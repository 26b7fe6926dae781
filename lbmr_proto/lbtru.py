"""LBT-RU datagrams (UM's reliable unicast transport): the header, the seven
packet bodies and the session-id / client-id option headers, sans-IO.

Layout (all integers big-endian), as Wireshark's ``packet-lbtru.c`` reads it:

* header, 4 bytes: ``ver_type`` u8 (version in the high nibble, 0; packet
  type in the low nibble), ``next_hdr`` u8 (the first option header, 0:
  none), ``flags_or_res`` u16 (DATA: 0x4000 retransmission; SM: 0x8000 SYN,
  the answer to a connection request; CREQ: the request, 0 = SYN; RST: the
  reason, 0 = default; reserved otherwise);
* DATA (type 0), 8 bytes then the payload: ``sqn``, ``trail_sqn`` (oldest
  sequence the source can still retransmit) u32 each;
* SM, session message (type 2), 12 bytes: ``sm_sqn``, ``lead_sqn`` (newest
  data sequence sent), ``trail_sqn`` u32 each;
* NAK (type 3): ``num_naks`` u16, ``format`` u16 (low nibble: 0 selective),
  then ``num_naks`` u32 sequence numbers;
* NCF, NAK confirmation (type 4): ``trail_sqn`` u32, ``num_ncfs`` u16, a
  reserved byte, ``reason_format`` u8 (reason in the high nibble: 0 do not
  retry, 1 ignored, 2 retransmit delay, 3 shed; format in the low nibble),
  then ``num_ncfs`` u32 sequence numbers;
* ACK (type 5), 4 bytes: ``ack_sqn`` u32;
* CREQ, connection request (type 6), and RST, reset (type 7): no body (the
  header's last field says which request or reason);
* option headers follow the body, each 8 bytes: ``next_hdr`` u8, ``hdr_len``
  u8 (8, this header included), ``flags`` u16 (0x8000: may be ignored), a
  u32 value: the session id (option type 1, SID) or the client id (type 2,
  CID). The payload of a DATA datagram follows the last option.

A receiver sends CREQs, ACKs and NAKs to the source's (ip, port); the source
answers from that port with SMs (the first with SYN), DATA, NCFs and RSTs.
Which datagram carries which option is not in the dissector; what
:mod:`router.lbtru_fanout` sends is stated there. Everything here is pure:
bytes in, values or bytes out; :class:`LbtruDecodeError` for malformed input.

One decoding defect of the dissector (tshark 4.0): it does not step over the
2-byte reason of an RST, so an RST with options is shown wrongly there (its
first option read at byte 2). :func:`encode_rst` therefore writes no options
by default.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "DATA", "SM", "NAK", "NCF", "ACK", "CREQ", "RST", "TYPE_NAMES",
    "HEADER", "DATA_HDR", "SM_HDR", "NAK_HDR", "NCF_HDR", "ACK_HDR", "OPT",
    "OPT_SID", "OPT_CID", "FLAG_RETRANSMISSION", "FLAG_SYN", "CREQ_SYN", "RST_DEFAULT",
    "NCF_NO_RETRY", "NCF_IGNORED", "NCF_RX_DELAY", "NCF_SHED", "MAX_NAKS",
    "LbtruDecodeError", "Header", "Data", "SessionMessage", "Nak", "Ncf", "Ack", "Creq", "Rst",
    "decode", "encode_data", "encode_sm", "encode_nak", "encode_ncf", "encode_ack",
    "encode_creq", "encode_rst", "DATA_OVERHEAD",
]

DATA, SM, NAK, NCF, ACK, CREQ, RST = 0x0, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7
TYPE_NAMES = {DATA: "DATA", SM: "SM", NAK: "NAK", NCF: "NCF", ACK: "ACK", CREQ: "CREQ", RST: "RST"}
HEADER = struct.Struct("!BBH")  # ver_type, next_hdr, flags_or_res
DATA_HDR = struct.Struct("!II")  # sqn, trail_sqn
SM_HDR = struct.Struct("!III")  # sm_sqn, lead_sqn, trail_sqn
NAK_HDR = struct.Struct("!HH")  # num_naks, format
NCF_HDR = struct.Struct("!IHBB")  # trail_sqn, num_ncfs, reserved, reason_format
ACK_HDR = struct.Struct("!I")  # ack_sqn
OPT = struct.Struct("!BBHI")  # next_hdr, hdr_len, flags, value
OPT_SID, OPT_CID = 0x01, 0x02
OPT_IGNORE = 0x8000
FLAG_RETRANSMISSION = 0x4000  # DATA
FLAG_SYN = 0x8000  # SM
CREQ_SYN = 0x0
RST_DEFAULT = 0x0
NCF_NO_RETRY, NCF_IGNORED, NCF_RX_DELAY, NCF_SHED = 0, 1, 2, 3
VERSION = 0
MAX_OPTIONS = 8  # option headers one datagram may carry (more: malformed)
#: sequence numbers in one NAK or NCF that fit a 1500-byte datagram with two options
MAX_NAKS = (1500 - 20 - 8 - HEADER.size - NCF_HDR.size - 2 * OPT.size) // 4
#: bytes before the payload of a DATA datagram with a session id option
DATA_OVERHEAD = HEADER.size + DATA_HDR.size + OPT.size
_BODY = {DATA: DATA_HDR.size, SM: SM_HDR.size, ACK: ACK_HDR.size, CREQ: 0, RST: 0}


class LbtruDecodeError(ValueError):
    """Bytes that are not a well-formed LBT-RU datagram (the message says why)."""


@dataclass(frozen=True, slots=True)
class Header:
    """What every datagram has: ``type``, the header's ``flags`` field (flags,
    request or reason), the options' ``session_id`` and ``client_id`` (None
    when absent), ``version``."""

    type: int
    flags: int = 0
    session_id: int | None = None
    client_id: int | None = None
    version: int = VERSION


@dataclass(frozen=True, slots=True)
class Data:
    header: Header
    sqn: int
    trail_sqn: int
    payload: bytes

    @property
    def retransmission(self) -> bool:
        return bool(self.header.flags & FLAG_RETRANSMISSION)


@dataclass(frozen=True, slots=True)
class SessionMessage:
    header: Header
    sm_sqn: int
    lead_sqn: int
    trail_sqn: int

    @property
    def syn(self) -> bool:
        return bool(self.header.flags & FLAG_SYN)


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


@dataclass(frozen=True, slots=True)
class Ack:
    header: Header
    ack_sqn: int


@dataclass(frozen=True, slots=True)
class Creq:
    header: Header

    @property
    def request(self) -> int:
        return self.header.flags


@dataclass(frozen=True, slots=True)
class Rst:
    header: Header

    @property
    def reason(self) -> int:
        return self.header.flags


def _sqn_list(data, off: int, n: int, what: str) -> tuple[tuple[int, ...], int]:
    if off + 4 * n > len(data):
        raise LbtruDecodeError(f"{what} announces {n} sequence numbers, {(len(data) - off) // 4} present")
    return struct.unpack_from(f"!{n}I", data, off), off + 4 * n


def _options(data, off: int, nh: int) -> tuple[int | None, int | None, int]:
    """The session and client ids of the option chain starting at ``off``
    with type ``nh``, and the offset after it."""
    sid = cid = None
    for _ in range(MAX_OPTIONS):
        if nh == 0:
            return sid, cid, off
        if off + 2 > len(data):
            raise LbtruDecodeError(f"option header {nh} at byte {off}: the datagram ends there")
        nxt, hlen = data[off], data[off + 1]
        if hlen < 4 or off + hlen > len(data):
            raise LbtruDecodeError(f"option header {nh} at byte {off}: length {hlen} does not fit")
        if nh in (OPT_SID, OPT_CID):
            if hlen != OPT.size:
                raise LbtruDecodeError(f"option header {nh} at byte {off}: length {hlen}, not 8")
            value = OPT.unpack_from(data, off)[3]
            if nh == OPT_SID:
                sid = value
            else:
                cid = value
        nh, off = nxt, off + hlen
    raise LbtruDecodeError(f"more than {MAX_OPTIONS} option headers")


def decode(data: bytes | bytearray | memoryview) -> Data | SessionMessage | Nak | Ncf | Ack | Creq | Rst:
    """One LBT-RU datagram (unknown option types are stepped over)."""
    if len(data) < HEADER.size:
        raise LbtruDecodeError(f"{len(data)} bytes: shorter than the 4-byte LBT-RU header")
    vt, nh, flags = HEADER.unpack_from(data)
    if vt >> 4 != VERSION:
        raise LbtruDecodeError(f"version {vt >> 4} (only 0 is known)")
    t = vt & 0x0F
    off = HEADER.size
    name = TYPE_NAMES.get(t)
    if name is None:
        raise LbtruDecodeError(f"unknown packet type {t}")
    if t in _BODY:
        if len(data) < off + _BODY[t]:
            raise LbtruDecodeError(f"{name} shorter than its {_BODY[t]}-byte body")
        body_end = off + _BODY[t]
    elif t == NAK:
        if len(data) < off + NAK_HDR.size:
            raise LbtruDecodeError("NAK shorter than its 4-byte header")
        n, fmt = NAK_HDR.unpack_from(data, off)
        sqns, body_end = _sqn_list(data, off + NAK_HDR.size, n, "NAK")
    else:  # NCF
        if len(data) < off + NCF_HDR.size:
            raise LbtruDecodeError("NCF shorter than its 8-byte header")
        trail, n, _, rf = NCF_HDR.unpack_from(data, off)
        sqns, body_end = _sqn_list(data, off + NCF_HDR.size, n, "NCF")
    sid, cid, end = _options(data, body_end, nh)
    h = Header(t, flags, sid, cid, vt >> 4)
    if t == DATA:
        sqn, trail = DATA_HDR.unpack_from(data, off)
        return Data(h, sqn, trail, bytes(data[end:]))
    if t == SM:
        return SessionMessage(h, *SM_HDR.unpack_from(data, off))
    if t == NAK:
        return Nak(h, sqns, fmt & 0x0F)
    if t == NCF:
        return Ncf(h, trail, sqns, rf >> 4, rf & 0x0F)
    if t == ACK:
        return Ack(h, ACK_HDR.unpack_from(data, off)[0])
    return Creq(h) if t == CREQ else Rst(h)


def _frame(ptype: int, flags: int, body: bytes, session_id: int | None, client_id: int | None) -> bytes:
    """Header, body and the options (SID before CID)."""
    opts = [(OPT_SID, session_id), (OPT_CID, client_id)]
    opts = [(k, v) for k, v in opts if v is not None]
    out = [HEADER.pack((VERSION << 4) | ptype, opts[0][0] if opts else 0, flags & 0xFFFF), body]
    for i, (_, value) in enumerate(opts):
        nxt = opts[i + 1][0] if i + 1 < len(opts) else 0
        try:
            out.append(OPT.pack(nxt, OPT.size, 0, value))
        except struct.error:
            raise ValueError(f"LBT-RU option value {value!r}: a u32") from None
    return b"".join(out)


def _sqns(sqns, what: str) -> bytes:
    sqns = list(sqns)
    if not 0 < len(sqns) <= MAX_NAKS:
        raise ValueError(f"{what}: 1..{MAX_NAKS} sequence numbers, not {len(sqns)}")
    return struct.pack(f"!{len(sqns)}I", *(s & 0xFFFFFFFF for s in sqns))


def _u32(v: int) -> int:
    return v & 0xFFFFFFFF


def encode_data(sqn: int, trail_sqn: int, payload: bytes, *, session_id: int | None = None,
                client_id: int | None = None, retransmission: bool = False) -> bytes:
    """A DATA datagram (the payload after the options)."""
    return _frame(DATA, FLAG_RETRANSMISSION if retransmission else 0,
                  DATA_HDR.pack(_u32(sqn), _u32(trail_sqn)), session_id, client_id) + bytes(payload)


def encode_sm(sm_sqn: int, lead_sqn: int, trail_sqn: int, *, syn: bool = False,
              session_id: int | None = None, client_id: int | None = None) -> bytes:
    return _frame(SM, FLAG_SYN if syn else 0, SM_HDR.pack(_u32(sm_sqn), _u32(lead_sqn), _u32(trail_sqn)),
                  session_id, client_id)


def encode_nak(sqns, *, session_id: int | None = None, client_id: int | None = None) -> bytes:
    """A selective NAK for ``sqns``."""
    body = _sqns(sqns, "NAK")
    return _frame(NAK, 0, NAK_HDR.pack(len(body) // 4, 0) + body, session_id, client_id)


def encode_ncf(trail_sqn: int, sqns, *, reason: int = NCF_RX_DELAY, session_id: int | None = None,
               client_id: int | None = None) -> bytes:
    body = _sqns(sqns, "NCF")
    return _frame(NCF, 0, NCF_HDR.pack(_u32(trail_sqn), len(body) // 4, 0, (reason & 0x0F) << 4) + body,
                  session_id, client_id)


def encode_ack(ack_sqn: int, *, session_id: int | None = None, client_id: int | None = None) -> bytes:
    return _frame(ACK, 0, ACK_HDR.pack(_u32(ack_sqn)), session_id, client_id)


def encode_creq(*, request: int = CREQ_SYN, session_id: int | None = None,
                client_id: int | None = None) -> bytes:
    return _frame(CREQ, request, b"", session_id, client_id)


def encode_rst(*, reason: int = RST_DEFAULT, session_id: int | None = None,
               client_id: int | None = None) -> bytes:
    """A reset (no options by default: see the module doc)."""
    return _frame(RST, reason, b"", session_id, client_id)
