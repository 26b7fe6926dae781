"""TIR options (also used by QIRs): the chunk after a TIR's 8-byte header.

A chunk is present iff bit 0x80 of the TIR transport byte is set. On the wire
it starts with the 4-byte length option ``00 04 <total_len:u16>`` whose
``total_len`` counts the whole chunk; the codec writes and checks that option
itself, so the lists held by records never contain it.

Each option starts ``type:u8 len:u8``; ``len`` is the whole option in bytes.
Integers are big-endian; ``flags`` fields carry 0x8000 (u16) or 0x80 (u8) =
"ignore" (a receiver that does not know the option may skip it).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar

from ._wire import Fixed, fixed, text, wire
from .errors import LBMRDecodeError, LBMREncodeError

_HDR = struct.Struct("!BBH")


class TirOption(Fixed):
    """Base of typed TIR options; ``CODE`` is the option type byte."""

    __slots__ = ()
    CODE: ClassVar[int]
    _HEAD = "BB"

    def encode(self) -> bytes:
        return self.pack_body(self.CODE, self.SIZE)


@fixed
class UmeOption(TirOption):
    """0x01: UME (persistence) source information, 32 bytes."""

    CODE = 0x01
    _FMT = "HHH4s4sIIII"
    _IPS = ("store_tcp_addr", "src_tcp_addr")
    flags: int = 0
    store_tcp_port: int = 0
    src_tcp_port: int = 0
    store_tcp_addr: str = "0.0.0.0"
    src_tcp_addr: str = "0.0.0.0"
    src_reg_id: int = 0
    transport_idx: int = 0
    high_seqnum: int = 0
    low_seqnum: int = 0


@fixed
class UmeStoreOption(TirOption):
    """0x02: one UME store, 16 bytes (u8 flags)."""

    CODE = 0x02
    _FMT = "BBHH4sI"
    _IPS = ("store_ip_addr",)
    flags: int = 0
    grp_idx: int = 0
    store_tcp_port: int = 0
    store_idx: int = 0
    store_ip_addr: str = "0.0.0.0"
    src_reg_id: int = 0


@fixed
class UmeStoreGroupOption(TirOption):
    """0x03: UME store group, 8 bytes (u8 flags)."""

    CODE = 0x03
    _FMT = "BBHH"
    flags: int = 0
    grp_idx: int = 0
    grp_sz: int = 0
    reserved: int = 0


@fixed
class LateJoinOption(TirOption):
    """0x04: late join, 24 bytes."""

    CODE = 0x04
    _FMT = "HHH4sIII"
    _IPS = ("src_ip_addr",)
    flags: int = 0
    src_tcp_port: int = 0
    reserved: int = 0
    src_ip_addr: str = "0.0.0.0"
    transport_idx: int = 0
    high_seqnum: int = 0
    low_seqnum: int = 0


@fixed
class UmqRcrIdxOption(TirOption):
    """0x05: UMQ receiver-control-record index, 8 bytes."""

    CODE = 0x05
    _FMT = "HI"
    flags: int = 0
    rcr_idx: int = 0


@fixed
class CostOption(TirOption):
    """0x07: cost, 8 bytes (u8 flags; cost is signed, -1 = infinite/withdrawn)."""

    CODE = 0x07
    _FMT = "BBi"
    flags: int = 0
    hop_count: int = 0
    cost: int = 0


@fixed
class OtidOption(TirOption):
    """0x08: originating transport id (32 opaque bytes), 36 bytes."""

    CODE = 0x08
    _FMT = "H32s"
    flags: int = 0
    otid: bytes = bytes(32)


@fixed
class CtxInstOption(TirOption):
    """0x09: context instance, 12 bytes (u8 flags, u8 res)."""

    CODE = 0x09
    _FMT = "BB8s"
    flags: int = 0
    res: int = 0
    ctxinst: bytes = bytes(8)


@fixed
class StoreCtxInstOption(TirOption):
    """0x0A: store context instance, 12 bytes."""

    CODE = 0x0A
    _FMT = "BB8s"
    flags: int = 0
    idx: int = 0
    ctxinst: bytes = bytes(8)


@fixed
class UlbOption(TirOption):
    """0x0B: UMQ ULB source, 28 bytes."""

    CODE = 0x0B
    _FMT = "HIQI4sHH"
    _IPS = ("src_ip_addr",)
    flags: int = 0
    queue_id: int = 0
    regid: int = 0
    ulb_src_id: int = 0
    src_ip_addr: str = "0.0.0.0"
    src_tcp_port: int = 0
    reserved: int = 0


@fixed
class QueueCtxInstOption(TirOption):
    """0x0C: queue context instance, 12 bytes."""

    CODE = 0x0C
    _FMT = "BB8s"
    flags: int = 0
    idx: int = 0
    ctxinst: bytes = bytes(8)


@fixed
class DomainIdOption(TirOption):
    """0x0D: domain id of the source's Topic Resolution Domain, 8 bytes."""

    CODE = 0x0D
    _FMT = "HI"
    flags: int = 0
    domain_id: int = 0


@fixed
class ExFuncOption(TirOption):
    """0x0E: extended functionality, 16 bytes (flags 0x1 late join, 0x2 UME, 0x4 UMQ, 0x8 ULB)."""

    CODE = 0x0E
    _FMT = "HHH4sI"
    _IPS = ("src_ip_addr",)
    flags: int = 0
    src_tcp_port: int = 0
    reserved: int = 0
    src_ip_addr: str = "0.0.0.0"
    functionality_flags: int = 0


@dataclass(frozen=True, slots=True)
class UmqQueueInfoOption:
    """0x06: UMQ queue info; variable length: 4 + queue-name bytes (no NUL required)."""

    CODE: ClassVar[int] = 0x06
    flags: int = 0
    queue: str = ""

    def encode(self) -> bytes:
        q = wire(self.queue)
        if len(q) > 251:
            raise LBMREncodeError("UMQ queue-info name longer than 251 bytes")
        return _HDR.pack(self.CODE, 4 + len(q), self.flags) + q


@dataclass(frozen=True, slots=True)
class UnknownTirOption:
    """A TIR option whose type the codec does not know, kept byte for byte."""

    code: int
    flags: int = 0
    data: bytes = b""

    def encode(self) -> bytes:
        if not 4 + len(self.data) <= 255:
            raise LBMREncodeError("unknown TIR option longer than 255 bytes")
        if self.code == 0:
            raise LBMREncodeError("option type 0 is the length option, written by the codec")
        try:
            return _HDR.pack(self.code, 4 + len(self.data), self.flags) + self.data
        except struct.error as e:
            raise LBMREncodeError(f"UnknownTirOption: {e}") from None


TIR_OPTION_TYPES: dict[int, type] = {
    c.CODE: c
    for c in (
        UmeOption, UmeStoreOption, UmeStoreGroupOption, LateJoinOption, UmqRcrIdxOption,
        UmqQueueInfoOption, CostOption, OtidOption, CtxInstOption, StoreCtxInstOption,
        UlbOption, QueueCtxInstOption, DomainIdOption, ExFuncOption,
    )
}
_FIXED_SIZE = {code: cls.SIZE for code, cls in TIR_OPTION_TYPES.items() if hasattr(cls, "SIZE")}


# Address-bearing options: type -> ((address offset, port offset), ...) within
# the option (4-byte IPv4 address, 2-byte port; big-endian). Resolver daemons
# fill in 0.0.0.0 and apply NAT rules to each pair separately.
OPTION_ADDR_PAIRS: dict[int, tuple[tuple[int, int], ...]] = {
    UmeOption.CODE: ((12, 6), (8, 4)),  # source, store
    UmeStoreOption.CODE: ((8, 4),),
    LateJoinOption.CODE: ((8, 4),),
    UlbOption.CODE: ((20, 24),),
    ExFuncOption.CODE: ((8, 4),),
}


def option_addr_pairs(data: bytes, off: int, stop: int) -> tuple[tuple[int, int], ...]:
    """Datagram offsets of the (address, port) pairs in the already validated
    TIR options chunk ``data[off:stop]``."""
    out: list[tuple[int, int]] = []
    p = off + 4
    get = OPTION_ADDR_PAIRS.get
    while p < stop:
        pairs = get(data[p])
        if pairs is not None:
            out += [(p + a, p + o) for a, o in pairs]
        p += data[p + 1]
    return tuple(out)


def check_tir_options(data: bytes, off: int, end: int) -> int:
    """Validate a TIR options chunk at ``off`` without building objects.

    Returns the offset just past the chunk. Used by the decoder and by the
    fast path (:mod:`lbmr_proto.fast`) so both accept exactly the same bytes.
    """
    if off + 4 > end:
        raise LBMRDecodeError(off, "TIR options chunk truncated")
    typ, ln, total = _HDR.unpack_from(data, off)
    if typ != 0 or ln != 4:
        raise LBMRDecodeError(off, f"TIR options must start with the length option, got type {typ:#04x} len {ln}")
    if total < 4 or off + total > end:
        raise LBMRDecodeError(off, f"TIR options total_len {total} does not fit")
    stop = off + total
    p = off + 4
    while p < stop:
        if p + 2 > stop:
            raise LBMRDecodeError(p, "TIR option header truncated")
        typ = data[p]
        ln = data[p + 1]
        want = _FIXED_SIZE.get(typ)
        if want is not None:
            if ln != want:
                raise LBMRDecodeError(p, f"TIR option {typ:#04x} has len {ln}, expected {want}")
        elif typ == 0:
            raise LBMRDecodeError(p, "second length option inside a TIR options chunk")
        elif ln < 4:
            raise LBMRDecodeError(p, f"TIR option {typ:#04x} has len {ln} (< 4)")
        p += ln
    if p != stop:
        raise LBMRDecodeError(stop, "TIR options overrun their total_len")
    return stop


def decode_tir_options(data: bytes, off: int, end: int) -> tuple[list, int]:
    """Decode (and validate, in the same pass as :func:`check_tir_options`
    would) a TIR options chunk at ``off``; returns (options, offset after it)."""
    if off + 4 > end:
        raise LBMRDecodeError(off, "TIR options chunk truncated")
    typ, ln, total = _HDR.unpack_from(data, off)
    if typ != 0 or ln != 4:
        raise LBMRDecodeError(off, f"TIR options must start with the length option, got type {typ:#04x} len {ln}")
    if total < 4 or off + total > end:
        raise LBMRDecodeError(off, f"TIR options total_len {total} does not fit")
    stop = off + total
    out: list = []
    p = off + 4
    get = TIR_OPTION_TYPES.get
    while p < stop:
        if p + 2 > stop:
            raise LBMRDecodeError(p, "TIR option header truncated")
        typ = data[p]
        ln = data[p + 1]
        cls = get(typ)
        if cls is not None and cls is not UmqQueueInfoOption:
            if ln != cls.SIZE:
                raise LBMRDecodeError(p, f"TIR option {typ:#04x} has len {ln}, expected {cls.SIZE}")
            if p + ln > stop:
                break
            out.append(cls.unpack_body(data, p))
        elif typ == 0:
            raise LBMRDecodeError(p, "second length option inside a TIR options chunk")
        elif ln < 4:
            raise LBMRDecodeError(p, f"TIR option {typ:#04x} has len {ln} (< 4)")
        else:
            if p + ln > stop:
                break
            flags = _HDR.unpack_from(data, p)[2]
            if cls is None:
                out.append(UnknownTirOption(typ, flags, data[p + 4:p + ln]))
            else:
                out.append(UmqQueueInfoOption(flags, text(data[p + 4:p + ln])))
        p += ln
    if p != stop:
        raise LBMRDecodeError(stop, "TIR options overrun their total_len")
    return out, stop


def encode_tir_options(options: list) -> bytes:
    """Encode a TIR options chunk, length option first."""
    body = b"".join([o.encode() for o in options])
    total = 4 + len(body)
    if total > 0xFFFF:
        raise LBMREncodeError("TIR options chunk longer than 65535 bytes")
    return _HDR.pack(0, 4, total) + body
