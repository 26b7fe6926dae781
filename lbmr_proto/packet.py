"""The LBMR packet: one UDP datagram of topic resolution.

:func:`decode` turns bytes into a :class:`Packet`, :func:`encode` the reverse;
``encode(decode(b)) == b`` for every datagram ``decode`` accepts. Decoding is
strict (stricter than Wireshark's dissector): see the module docs in
``man/`` and ``shared/spec/lbmr-wire-format.md`` §11.4. Sans-IO: no sockets,
no clocks.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from ._wire import read_strz
from .constants import HDR_OPTIONS_FLAG, MAX_NAME_LEN, PacketType
from .errors import LBMRDecodeError, LBMREncodeError
from .ext import decode_ext
from .popts import decode_packet_options, encode_packet_options, trailer_length
from .records import (
    QIR,
    QQR,
    TIR,
    TQR,
    TopicMgmtBlock,
    WcTQR,
    decode_qir,
    decode_tir,
    decode_tmb,
)

_HDR = struct.Struct("!BBH")
# packet-options trailer bytes -> decoded (immutable) options; a sender's
# trailer is the same in every datagram it sends. Bounded: cleared when full.
_TRAILER_CACHE: dict[bytes, tuple] = {}
TYPE_NAMES = {
    0: "NORMAL", 1: "WC_TQR", 2: "RCV_ALIVE", 3: "SRC_ALIVE", 4: "TOPIC_MGMT",
    6: "QUEUE_RES", 7: "EXT",
}


@dataclass(slots=True)
class Packet:
    """One LBMR datagram.

    ``type`` is a :class:`~lbmr_proto.constants.PacketType` code and
    ``version`` the header's version nibble (0 or 1). Which record lists are
    used depends on the type: NORMAL ``tqrs`` + ``tirs``; WC_TQR ``wc_tqrs`` +
    ``tirs``; TOPIC_MGMT ``tmb``; QUEUE_RES ``qqrs`` + ``qirs``; EXT ``ext``;
    RCV_ALIVE/SRC_ALIVE none. ``options`` is ``None`` when the packet has no
    options trailer, else the list of packet options (length option excluded).
    """

    type: int = PacketType.NORMAL
    version: int = 0
    tqrs: list[TQR] = field(default_factory=list)
    wc_tqrs: list[WcTQR] = field(default_factory=list)
    tirs: list[TIR] = field(default_factory=list)
    tmb: TopicMgmtBlock | None = None
    qqrs: list[QQR] = field(default_factory=list)
    qirs: list[QIR] = field(default_factory=list)
    ext: object | None = None
    options: list | None = None

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.type, f"TYPE_{self.type}")

    @property
    def is_keepalive(self) -> bool:
        """RCV_ALIVE, SRC_ALIVE, or the NORMAL 0/0 resolver keepalive."""
        return self.type in (2, 3) or (self.type == 0 and not self.tqrs and not self.tirs)

    def encode(self) -> bytes:
        return encode(self)


# Whole-datagram memo for NORMAL / WC_TQR packets: datagram bytes -> the
# decoded immutable parts. Topic resolution is periodic repetition (sources
# re-advertise and receivers re-query with identical bytes), so most
# datagrams have been seen before. A hit still returns fresh, mutable record
# objects; only immutable values (strings, option and transport objects) are
# shared. Bounded: cleared when full.
_MEMO: dict[bytes, tuple] = {}
MEMO_MAX = 1 << 14


def decode(data: bytes | bytearray | memoryview) -> Packet:
    """Decode one UDP payload. Raises :class:`LBMRDecodeError` (and nothing
    else) for anything that is not a well-formed LBMR packet."""
    if type(data) is not bytes:
        data = bytes(data)
    hit = _MEMO.get(data)
    if hit is not None:
        ptype, version, tqrs, wcs, tirs, popts = hit
        if not tqrs:
            tq = []
        elif len(tqrs) == 1:  # the common case, without a comprehension's call
            tq = [TQR(tqrs[0])]
        else:
            tq = [TQR(t) for t in tqrs]
        if not tirs:
            ti = []
        elif len(tirs) == 1:
            t, b, ttl, i, o = tirs[0]
            ti = [TIR(t, b, ttl, i, None if o is None else list(o))]
        else:
            ti = [TIR(t, b, ttl, i, None if o is None else list(o)) for t, b, ttl, i, o in tirs]
        return Packet(ptype, version, tq, [WcTQR(p, t) for p, t in wcs] if wcs else [], ti,
                      None, [], [], None, None if popts is None else list(popts))
    pkt = _decode(data)
    if pkt.type <= 3 and len(data) <= 1500:
        if len(_MEMO) >= MEMO_MAX:
            _MEMO.clear()
        _MEMO[data] = (pkt.type, pkt.version, tuple(q.topic for q in pkt.tqrs),
                       tuple((w.pattern, w.pattern_type) for w in pkt.wc_tqrs),
                       tuple((t.topic, t.transport, t.ttl, t.index, None if t.options is None else tuple(t.options))
                             for t in pkt.tirs),
                       None if pkt.options is None else tuple(pkt.options))
    return pkt


def _decode(data: bytes) -> Packet:
    n = len(data)
    if n < 4:
        raise LBMRDecodeError(0, f"datagram of {n} bytes is shorter than the 4-byte header")
    b0, b1, b23 = _HDR.unpack_from(data, 0)
    version = b0 >> 4
    ptype = b0 & 7
    if version > 1:
        raise LBMRDecodeError(0, f"unsupported LBMR version {version}")
    end = n - trailer_length(data) if b0 & HDR_OPTIONS_FLAG else n
    pkt = Packet(ptype, version)
    if ptype == 0 or ptype == 1:
        p = 4
        if ptype == 0:
            tq = pkt.tqrs
            find = data.find
            for _ in range(b1):
                nul = find(b"\0", p, end)
                if nul < 0 or nul - p >= MAX_NAME_LEN:
                    read_strz(data, p, end, "TQR topic")  # raises the precise error
                tq.append(TQR(data[p:nul].decode("utf-8", "surrogateescape")))
                p = nul + 1
        else:
            wq = pkt.wc_tqrs
            for _ in range(b1):
                if p >= end:
                    raise LBMRDecodeError(p, "wildcard TQR truncated")
                pt = data[p]
                pattern, p = read_strz(data, p + 1, end, "wildcard pattern")
                wq.append(WcTQR(pattern, pt))
        ti = pkt.tirs
        for _ in range(b23):
            tir, p = decode_tir(data, p, end)
            ti.append(tir)
    elif ptype == 2 or ptype == 3:
        if b1 or b23:
            raise LBMRDecodeError(1, f"keepalive with non-zero counts ({b1}, {b23})")
        p = 4
    elif ptype == 4:
        pkt.tmb, p = decode_tmb(data, 4, end, b1, b23)
    elif ptype == 6:
        p = 4
        for _ in range(b1):
            q, p = read_strz(data, p, end, "QQR queue")
            pkt.qqrs.append(QQR(q))
        for _ in range(b23):
            qir, p = decode_qir(data, p, end)
            pkt.qirs.append(qir)
    elif ptype == 7:
        pkt.ext, p = decode_ext(data, end)
    else:
        raise LBMRDecodeError(0, f"unknown LBMR packet type {ptype}")
    if p != end:
        raise LBMRDecodeError(p, f"{end - p} stray bytes after the records")
    if b0 & HDR_OPTIONS_FLAG:
        trailer = data[end:]
        opts = _TRAILER_CACHE.get(trailer)
        if opts is None:
            opts = tuple(decode_packet_options(data, end))
            if len(_TRAILER_CACHE) >= 4096:
                _TRAILER_CACHE.clear()
            _TRAILER_CACHE[trailer] = opts
        pkt.options = list(opts)
    return pkt


def encode(pkt: Packet) -> bytes:
    """Encode a :class:`Packet`; header counts and length fields are derived."""
    t = pkt.type
    version = pkt.version
    if not 0 <= version <= 15 or t not in TYPE_NAMES:
        raise LBMREncodeError(f"bad version {version} or packet type {t}")
    b0 = (version << 4) | t | (HDR_OPTIONS_FLAG if pkt.options is not None else 0)
    if t == 0 or t == 1:
        recs = pkt.tqrs if t == 0 else pkt.wc_tqrs
        if len(recs) > 255 or len(pkt.tirs) > 0xFFFF:
            raise LBMREncodeError("too many TQRs (max 255) or TIRs (max 65535)")
        parts = [_HDR.pack(b0, len(recs), len(pkt.tirs))]
        parts += [r.encode() for r in recs]
        parts += [r.encode() for r in pkt.tirs]
    elif t == 2 or t == 3:
        parts = [_HDR.pack(b0, 0, 0)]
    elif t == 4:
        tmb = pkt.tmb if pkt.tmb is not None else TopicMgmtBlock()
        try:
            parts = [_HDR.pack(b0, tmb.hdr_b1, tmb.hdr_b23), tmb.encode()]
        except struct.error as e:
            raise LBMREncodeError(f"TMB header: {e}") from None
    elif t == 6:
        if len(pkt.qqrs) > 255 or len(pkt.qirs) > 0xFFFF:
            raise LBMREncodeError("too many QQRs (max 255) or QIRs (max 65535)")
        parts = [_HDR.pack(b0, len(pkt.qqrs), len(pkt.qirs))]
        parts += [r.encode() for r in pkt.qqrs]
        parts += [r.encode() for r in pkt.qirs]
    else:
        if pkt.ext is None:
            raise LBMREncodeError("EXT packet without an extended record")
        parts = [pkt.ext.encode(b0)]
    if pkt.options is not None:
        parts.append(encode_packet_options(pkt.options))
    return b"".join(parts)
