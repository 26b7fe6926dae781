"""Topic-resolution records: TQR, wildcard TQR, TIR (with its transport
bodies), topic-management records, and the queue records QQR/QIR.

Byte order is big-endian throughout. Offsets in errors are datagram offsets.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import ClassVar

from ._wire import Fixed, fixed, read_strz, strz
from .constants import TIR_OPTIONS_FLAG, Transport
from .errors import LBMRDecodeError, LBMREncodeError
from .topts import decode_tir_options, encode_tir_options

# --------------------------------------------------------------------------- TQR


@dataclass(slots=True)
class TQR:
    """Topic query record: just the NUL-terminated topic name."""

    topic: str

    def encode(self) -> bytes:
        return strz(self.topic, "TQR topic")


@dataclass(slots=True)
class WcTQR:
    """Wildcard topic query: ``pattern_type`` (1 PCRE, 2 POSIX regex) and pattern."""

    pattern: str
    pattern_type: int = 1

    def encode(self) -> bytes:
        if not 0 <= self.pattern_type <= 255:
            raise LBMREncodeError(f"pattern_type {self.pattern_type} out of range")
        return bytes((self.pattern_type,)) + strz(self.pattern, "wildcard pattern")


# ------------------------------------------------------------------ transports


class TransportBody(Fixed):
    """Base of TIR transport bodies. ``TYPE`` is the transport code,
    ``NAME`` the name used in JSON output; ``ADDR``/``PORT`` give the byte
    offsets (within the body) of the source address and source port fields
    that a resolver daemon may rewrite (``None`` where there is none)."""

    __slots__ = ()
    TYPE: ClassVar[int]
    NAME: ClassVar[str]
    ADDR: ClassVar[int | None] = None
    PORT: ClassVar[int | None] = None

    def encode(self) -> bytes:
        return self.pack_body()


@fixed
class TcpTransport(TransportBody):
    """TCP, 6 bytes: ip, port."""

    TYPE, NAME, ADDR, PORT = Transport.TCP, "TCP", 0, 4
    _FMT = "4sH"
    _IPS = ("ip",)
    ip: str = "0.0.0.0"
    port: int = 0


@fixed
class TcpSessionTransport(TransportBody):
    """TCP with session id, 10 bytes: ip, session_id, port (port last)."""

    TYPE, NAME, ADDR, PORT = Transport.TCP, "TCP", 0, 8
    _FMT = "4sIH"
    _IPS = ("ip",)
    ip: str = "0.0.0.0"
    session_id: int = 0
    port: int = 0


@fixed
class LbtruTransport(TransportBody):
    """LBT-RU, 6 bytes: ip, port."""

    TYPE, NAME, ADDR, PORT = Transport.LBTRU, "LBTRU", 0, 4
    _FMT = "4sH"
    _IPS = ("ip",)
    ip: str = "0.0.0.0"
    port: int = 0


@fixed
class LbtruSessionTransport(TransportBody):
    """LBT-RU with session id, 10 bytes: ip, session_id, port."""

    TYPE, NAME, ADDR, PORT = Transport.LBTRU, "LBTRU", 0, 8
    _FMT = "4sIH"
    _IPS = ("ip",)
    ip: str = "0.0.0.0"
    session_id: int = 0
    port: int = 0


@fixed
class LbtrmTransport(TransportBody):
    """LBT-RM, 16 bytes: source ip, multicast group, session id,
    multicast destination port, source unicast (NAK) port."""

    TYPE, NAME, ADDR, PORT = Transport.LBTRM, "LBTRM", 0, 14
    _FMT = "4s4sIHH"
    _IPS = ("ip", "mcast_group")
    ip: str = "0.0.0.0"
    mcast_group: str = "0.0.0.0"
    session_id: int = 0
    dest_port: int = 0
    src_ucast_port: int = 0


@fixed
class LbtipcTransport(TransportBody):
    """LBT-IPC, 10 bytes: host id, session id, transport id."""

    TYPE, NAME = Transport.LBTIPC, "LBTIPC"
    _FMT = "IIH"
    host_id: int = 0
    session_id: int = 0
    xport_id: int = 0


@fixed
class LbtsmxTransport(TransportBody):
    """LBT-SMX, 10 bytes: host id, session id, transport id."""

    TYPE, NAME = Transport.LBTSMX, "LBTSMX"
    _FMT = "IIH"
    host_id: int = 0
    session_id: int = 0
    xport_id: int = 0


@fixed
class LbtrdmaTransport(TransportBody):
    """LBT-RDMA, 10 bytes: ip, session id, port."""

    TYPE, NAME, ADDR, PORT = Transport.LBTRDMA, "LBTRDMA", 0, 8
    _FMT = "4sIH"
    _IPS = ("ip",)
    ip: str = "0.0.0.0"
    session_id: int = 0
    port: int = 0


@dataclass(frozen=True, slots=True)
class UnknownTransport:
    """A transport the codec does not dissect (TCP6 0x02, PGM 0x11, others): raw body."""

    type_code: int
    data: bytes = b""
    NAME: ClassVar[str] = "UNKNOWN"
    ADDR: ClassVar[int | None] = None
    PORT: ClassVar[int | None] = None

    @property
    def TYPE(self) -> int:  # noqa: N802 - mirrors the class constant of known bodies
        return self.type_code

    def encode(self) -> bytes:
        return self.data


# (transport code, tlen) -> body class; the body size must equal tlen exactly.
TRANSPORT_BODIES: dict[tuple[int, int], type] = {
    (c.TYPE, c.SIZE): c
    for c in (
        TcpTransport, TcpSessionTransport, LbtruTransport, LbtruSessionTransport,
        LbtrmTransport, LbtipcTransport, LbtsmxTransport, LbtrdmaTransport,
    )
}
KNOWN_TRANSPORTS = frozenset(c for c, _ in TRANSPORT_BODIES)

# --------------------------------------------------------------------------- TIR

_TIRHDR = struct.Struct("!BBHI")


@dataclass(slots=True)
class TIR:
    """Topic information record (a source's advertisement).

    ``ttl`` is the 16-bit TTL field, ``index`` the 32-bit topic index;
    ``options`` is ``None`` when no options chunk is present (transport bit
    0x80 clear) or the list of TIR options (without the length option).
    """

    topic: str
    transport: TransportBody | UnknownTransport
    ttl: int = 0
    index: int = 0
    options: list | None = None

    @property
    def transport_name(self) -> str:
        return self.transport.NAME

    def encode(self) -> bytes:
        body = self.transport.encode()
        code = self.transport.TYPE
        if not 0 <= code <= 0x7F or len(body) > 255:
            raise LBMREncodeError(f"bad TIR transport type {code} or body length {len(body)}")
        if self.options is not None:
            code |= TIR_OPTIONS_FLAG
        try:
            hdr = _TIRHDR.pack(code, len(body), self.ttl, self.index)
        except struct.error as e:
            raise LBMREncodeError(f"TIR: {e}") from None
        opts = b"" if self.options is None else encode_tir_options(self.options)
        return strz(self.topic, "TIR topic") + hdr + opts + body


# TIR tail (8-byte header + options chunk + transport body) -> decoded parts.
# Sources re-advertise the same bytes over and over, so the immutable parts of
# a TIR are decoded once per distinct tail. Bounded: cleared when full.
_TAIL_CACHE: dict[bytes, tuple] = {}
TAIL_CACHE_MAX = 1 << 16


def decode_tir(data: bytes, off: int, end: int) -> tuple[TIR, int]:
    """Decode one TIR at ``off`` (record area ends at ``end``)."""
    topic, p = read_strz(data, off, end, "TIR topic")
    if p + 8 > end:
        raise LBMRDecodeError(p, "TIR header truncated")
    stop = p + 8 + data[p + 1]
    if data[p] & TIR_OPTIONS_FLAG and p + 12 <= end:
        stop += (data[p + 10] << 8) | data[p + 11]
    if stop <= end:
        tail = data[p:stop]
        hit = _TAIL_CACHE.get(tail)
        if hit is not None:  # these exact bytes were fully validated before
            ttl, index, opts, body = hit
            return TIR(topic, body, ttl, index, None if opts is None else list(opts)), stop
    tir, q = _decode_tir_tail(data, p, end, topic)
    if q == stop:
        if len(_TAIL_CACHE) >= TAIL_CACHE_MAX:
            _TAIL_CACHE.clear()
        _TAIL_CACHE[tail] = (tir.ttl, tir.index, None if tir.options is None else tuple(tir.options),
                             tir.transport)
    return tir, q


def _decode_tir_tail(data: bytes, p: int, end: int, topic: str) -> tuple[TIR, int]:
    tbyte, tlen, ttl, index = _TIRHDR.unpack_from(data, p)
    p += 8
    options = None
    if tbyte & TIR_OPTIONS_FLAG:
        options, p = decode_tir_options(data, p, end)
    code = tbyte & 0x7F
    if p + tlen > end:
        raise LBMRDecodeError(p, f"TIR transport body of {tlen} bytes truncated")
    cls = TRANSPORT_BODIES.get((code, tlen))
    if cls is not None:
        body = cls.unpack_body(data, p)
    elif code in KNOWN_TRANSPORTS:
        raise LBMRDecodeError(p - 7, f"wrong transport length {tlen} for {Transport(code).name}")
    else:
        body = UnknownTransport(code, data[p:p + tlen])
    return TIR(topic, body, ttl, index, options), p + tlen


# ------------------------------------------------------------- topic management

_TMRHDR = struct.Struct("!HBB")
_TMBHDR = struct.Struct("!HH")


@dataclass(slots=True)
class TMR:
    """Topic management record: ``type`` 0 leave / 1 topic use; ``flags``
    0x80 response, 0x40 wildcard PCRE, 0x20 wildcard regex."""

    name: str
    type: int = 1
    flags: int = 0

    def encode(self) -> bytes:
        name = strz(self.name, "TMR name")
        try:
            return _TMRHDR.pack(4 + len(name), self.type, self.flags) + name
        except struct.error as e:
            raise LBMREncodeError(f"TMR: {e}") from None


@dataclass(slots=True)
class TopicMgmtBlock:
    """Topic management block (packet type 4).

    ``length`` is the block's u16 length field; its meaning is inferred
    (header plus all TMRs), so a decoded value is kept as received and
    ``None`` means "compute it" when encoding. ``hdr_b1``/``hdr_b23`` are
    main-header bytes 1 and 2-3, unused for this type and kept verbatim.
    """

    tmrs: list[TMR] = field(default_factory=list)
    length: int | None = None
    hdr_b1: int = 0
    hdr_b23: int = 0

    def encode(self) -> bytes:
        body = b"".join([t.encode() for t in self.tmrs])
        length = 4 + len(body) if self.length is None else self.length
        try:
            return _TMBHDR.pack(length, len(self.tmrs)) + body
        except struct.error as e:
            raise LBMREncodeError(f"TMB: {e}") from None


def decode_tmb(data: bytes, off: int, end: int, b1: int, b23: int) -> tuple[TopicMgmtBlock, int]:
    if off + 4 > end:
        raise LBMRDecodeError(off, "topic management block header truncated")
    length, count = _TMBHDR.unpack_from(data, off)
    p = off + 4
    tmrs = []
    for _ in range(count):
        if p + 4 > end:
            raise LBMRDecodeError(p, "TMR header truncated")
        ln, typ, flags = _TMRHDR.unpack_from(data, p)
        name, q = read_strz(data, p + 4, end, "TMR name")
        if q - p != ln:
            raise LBMRDecodeError(p, f"TMR len {ln} does not match its name ({q - p} bytes)")
        tmrs.append(TMR(name, typ, flags))
        p = q
    return TopicMgmtBlock(tmrs, length, b1, b23), p


# ------------------------------------------------------------------- queue records

_QIRFIX = struct.Struct("!IIIHH")
_QGRP = struct.Struct("!HH")


@dataclass(slots=True)
class QQR:
    """Queue query record: the NUL-terminated queue name."""

    queue: str

    def encode(self) -> bytes:
        return strz(self.queue, "QQR queue")


@fixed
class QirGroup(Fixed):
    """QIR group block, 4 bytes."""

    _FMT = "HH"
    grp_idx: int = 0
    grp_sz: int = 0


@fixed
class QirQueue(Fixed):
    """QIR queue block, 12 bytes: ip, port, idx, grp_idx, reserved."""

    _FMT = "4sHHHH"
    _IPS = ("ip",)
    ip: str = "0.0.0.0"
    port: int = 0
    idx: int = 0
    grp_idx: int = 0
    reserved: int = 0


@dataclass(slots=True)
class QIR:
    """Queue information record. ``options`` as for :class:`TIR`."""

    queue: str
    topic: str
    queue_id: int = 0
    queue_ver: int = 0
    queue_prev_ver: int = 0
    options: list | None = None
    groups: list[QirGroup] = field(default_factory=list)
    queues: list[QirQueue] = field(default_factory=list)

    def encode(self) -> bytes:
        if len(self.groups) > 0x7FFF:
            raise LBMREncodeError("too many QIR group blocks")
        grp = len(self.groups) | (0x8000 if self.options is not None else 0)
        try:
            fix = _QIRFIX.pack(self.queue_id, self.queue_ver, self.queue_prev_ver, grp, len(self.queues))
        except struct.error as e:
            raise LBMREncodeError(f"QIR: {e}") from None
        parts = [strz(self.queue, "QIR queue"), strz(self.topic, "QIR topic"), fix]
        if self.options is not None:
            parts.append(encode_tir_options(self.options))
        parts += [g.pack_body() for g in self.groups]
        parts += [q.pack_body() for q in self.queues]
        return b"".join(parts)


def decode_qir(data: bytes, off: int, end: int) -> tuple[QIR, int]:
    queue, p = read_strz(data, off, end, "QIR queue name")
    topic, p = read_strz(data, p, end, "QIR topic name")
    if p + 16 > end:
        raise LBMRDecodeError(p, "QIR fixed part truncated")
    qid, ver, prev, grp, nq = _QIRFIX.unpack_from(data, p)
    p += 16
    options = None
    if grp & 0x8000:
        options, p = decode_tir_options(data, p, end)
    ng = grp & 0x7FFF
    if p + 4 * ng + 12 * nq > end:
        raise LBMRDecodeError(p, f"QIR blocks ({ng} groups, {nq} queues) truncated")
    groups = []
    for _ in range(ng):
        groups.append(QirGroup.unpack_body(data, p))
        p += 4
    queues = []
    for _ in range(nq):
        queues.append(QirQueue.unpack_body(data, p))
        p += 12
    return QIR(queue, topic, qid, ver, prev, options, groups, queues), p
