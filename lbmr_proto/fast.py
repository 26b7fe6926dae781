"""Fast path for daemons: validate a datagram and locate its TIR address
fields without building record objects.

:func:`scan` accepts exactly the datagrams :func:`lbmr_proto.decode` accepts
(a property test holds the two together) and raises the same
:class:`~lbmr_proto.errors.LBMRDecodeError` otherwise. For NORMAL and WC_TQR
packets it walks the bytes itself; the rarer kinds go through the full
decoder. The offsets it returns are datagram offsets of big-endian fields:
4-byte IPv4 address, 2-byte port, so a daemon can rewrite a copy in place::

    res = scan(data)
    buf = None
    for tir in res.tirs:
        if tir.addr >= 0 and data[tir.addr:tir.addr + 4] == b"\\0\\0\\0\\0":
            buf = buf or bytearray(data)
            buf[tir.addr:tir.addr + 4] = sender_ip_bytes
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from .constants import HDR_OPTIONS_FLAG, MAX_NAME_LEN, TIR_OPTIONS_FLAG
from .errors import LBMRDecodeError
from .packet import decode
from .popts import check_packet_options, trailer_length
from .records import KNOWN_TRANSPORTS, TRANSPORT_BODIES
from .topts import check_tir_options, option_addr_pairs

_HDR = struct.Struct("!BBH")

# (transport code, tlen) -> (addr offset, port offset) within the body, -1 = none
_ADDR_FIELDS: dict[tuple[int, int], tuple[int, int]] = {
    key: (-1 if cls.ADDR is None else cls.ADDR, -1 if cls.PORT is None else cls.PORT)
    for key, cls in TRANSPORT_BODIES.items()
}


class TirFields(NamedTuple):
    """Where one TIR's fields are in the datagram (offsets; -1 = not present).

    ``topic``..``topic_end`` is the topic name without its NUL; ``addr`` the
    source IPv4 address (4 bytes), ``port`` the source port (2 bytes; for
    LBT-RM the source unicast port), ``body`` the transport body start;
    ``opt_pairs`` the (address, port) offset pairs carried by TIR options
    (UME source and store, UME store, late join, ULB, extended functionality).
    """

    transport: int
    topic: int
    topic_end: int
    body: int
    addr: int
    port: int
    opt_pairs: tuple[tuple[int, int], ...] = ()


class ScanResult(NamedTuple):
    """Summary of a valid datagram: ``type``/``version`` from the header;
    ``tqrs`` and ``tirs_count`` the record counts (TQRs or wildcard TQRs, and
    TIRs; for QUEUE_RES the QQR/QIR counts; 0 for other types);
    ``record_end`` the offset where packet options start (= length when
    there are none); ``tirs`` one :class:`TirFields` per TIR."""

    type: int
    version: int
    tqrs: int
    tirs_count: int
    record_end: int
    tirs: tuple[TirFields, ...]


def _topic_end(data: bytes, p: int, end: int, what: str) -> int:
    nul = data.find(b"\0", p, end)
    if nul < 0:
        raise LBMRDecodeError(p, f"{what} is not NUL-terminated before byte {end}")
    if nul - p >= MAX_NAME_LEN:
        raise LBMRDecodeError(p, f"{what} is {nul - p} bytes long (at most {MAX_NAME_LEN - 1})")
    return nul


# Valid datagrams seen recently -> their (immutable) ScanResult. Topic
# resolution repeats itself, so a daemon sees the same bytes again and again.
# Bounded: cleared when full. Only successes are kept.
_MEMO: dict[bytes, ScanResult] = {}
MEMO_MAX = 1 << 14


def scan(data: bytes) -> ScanResult:
    """Validate ``data`` as one LBMR datagram and summarise it (see module doc)."""
    if type(data) is bytes:
        hit = _MEMO.get(data)
        if hit is not None:
            return hit
        res = _scan(data)
        if len(data) <= 1500:
            if len(_MEMO) >= MEMO_MAX:
                _MEMO.clear()
            _MEMO[data] = res
        return res
    return _scan(bytes(data))


def _scan(data: bytes) -> ScanResult:
    n = len(data)
    if n < 4:
        raise LBMRDecodeError(0, f"datagram of {n} bytes is shorter than the 4-byte header")
    b0, b1, b23 = _HDR.unpack_from(data, 0)
    version = b0 >> 4
    ptype = b0 & 7
    if ptype > 3 or version > 1:
        pkt = decode(data)  # rare kinds (and errors): the full decoder
        end = n - trailer_length(data) if b0 & HDR_OPTIONS_FLAG else n
        if ptype == 6:
            return ScanResult(ptype, version, len(pkt.qqrs), len(pkt.qirs), end, ())
        return ScanResult(ptype, version, 0, 0, end, ())
    end = n - trailer_length(data) if b0 & HDR_OPTIONS_FLAG else n
    p = 4
    tirs: list[TirFields] = []
    if ptype >= 2:
        if b1 or b23:
            raise LBMRDecodeError(1, f"keepalive with non-zero counts ({b1}, {b23})")
    else:
        find = data.find
        if ptype == 0:
            for _ in range(b1):
                nul = find(b"\0", p, end)
                if nul < 0 or nul - p >= MAX_NAME_LEN:
                    _topic_end(data, p, end, "TQR topic")
                p = nul + 1
        else:
            for _ in range(b1):
                if p >= end:
                    raise LBMRDecodeError(p, "wildcard TQR truncated")
                p = _topic_end(data, p + 1, end, "wildcard pattern") + 1
        append = tirs.append
        get = _ADDR_FIELDS.get
        for _ in range(b23):
            nul = find(b"\0", p, end)
            if nul < 0 or nul - p >= MAX_NAME_LEN:
                _topic_end(data, p, end, "TIR topic")
            h = nul + 1
            if h + 8 > end:
                raise LBMRDecodeError(h, "TIR header truncated")
            tbyte = data[h]
            tlen = data[h + 1]
            body = h + 8
            pairs = ()
            if tbyte & TIR_OPTIONS_FLAG:
                body = check_tir_options(data, h + 8, end)
                pairs = option_addr_pairs(data, h + 8, body)
            code = tbyte & 0x7F
            if body + tlen > end:
                raise LBMRDecodeError(body, f"TIR transport body of {tlen} bytes truncated")
            fields = get((code, tlen))
            if fields is None:
                if code in KNOWN_TRANSPORTS:
                    raise LBMRDecodeError(h + 1, f"wrong transport length {tlen} for transport {code:#04x}")
                append(TirFields(code, p, nul, body, -1, -1, pairs))
            else:
                a, o = fields
                append(TirFields(code, p, nul, body, -1 if a < 0 else body + a, -1 if o < 0 else body + o,
                                 pairs))
            p = body + tlen
    if p != end:
        raise LBMRDecodeError(p, f"{end - p} stray bytes after the records")
    if b0 & HDR_OPTIONS_FLAG:
        check_packet_options(data, end)
    return ScanResult(ptype, version, b1, b23, end, tuple(tirs))
