"""Packet-level options: the trailer present when header bit 0x08 is set.

The trailer is the last ``total_len`` bytes of the datagram and ends with the
4-byte length option ``80 04 <total_len:u16>``; the codec writes and checks
that option itself, so ``Packet.options`` never holds it. Big-endian.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar

from ._wire import Fixed, fixed
from .errors import LBMRDecodeError, LBMREncodeError

_HDR = struct.Struct("!BBH")
LENGTH_OPTION = 0x80


class PacketOption(Fixed):
    __slots__ = ()
    CODE: ClassVar[int]
    _HEAD = "BB"

    def encode(self) -> bytes:
        return self.pack_body(self.CODE, self.SIZE)


@fixed
class SourceIdOption(PacketOption):
    """0x81: the sender's context instance (8 bytes); flags 0x8000 ignore."""

    CODE = 0x81
    _FMT = "H8s"
    flags: int = 0x8000
    src_id: bytes = bytes(8)


@fixed
class SourceTypeOption(PacketOption):
    """0x82: sender kind, 0 application, 1 TNWGD (gateway/DRO), 2 store; u8 flags 0x80 ignore."""

    CODE = 0x82
    _FMT = "BB"
    flags: int = 0x80
    src_type: int = 0


@fixed
class VersionOption(PacketOption):
    """0x83: product version (u32, major in the top byte); flags 0x8000 ignore,
    0x0001 UME capable, 0x0002 UMQ capable."""

    CODE = 0x83
    _FMT = "HI"
    flags: int = 0x8000
    version: int = 0


@fixed
class LocalDomainOption(PacketOption):
    """0x84: the sender's local Topic Resolution Domain id; flags 0x8000 ignore, 0x0001 viral."""

    CODE = 0x84
    _FMT = "HI"
    flags: int = 0x8000
    local_domain_id: int = 0


@dataclass(frozen=True, slots=True)
class UnknownPacketOption:
    """A packet option the codec does not know, kept byte for byte."""

    code: int
    flags: int = 0
    data: bytes = b""

    def encode(self) -> bytes:
        if self.code == LENGTH_OPTION:
            raise LBMREncodeError("the length option is written by the codec")
        if 4 + len(self.data) > 255:
            raise LBMREncodeError("unknown packet option longer than 255 bytes")
        try:
            return _HDR.pack(self.code, 4 + len(self.data), self.flags) + self.data
        except struct.error as e:
            raise LBMREncodeError(f"UnknownPacketOption: {e}") from None


PACKET_OPTION_TYPES: dict[int, type] = {
    c.CODE: c for c in (SourceIdOption, SourceTypeOption, VersionOption, LocalDomainOption)
}
_FIXED_SIZE = {code: cls.SIZE for code, cls in PACKET_OPTION_TYPES.items()}


def trailer_length(data: bytes) -> int:
    """Size of the options trailer of a datagram whose header bit 0x08 is set
    (the ``total_len`` of the length option in its last 4 bytes)."""
    n = len(data)
    if n < 8 or data[n - 4] != LENGTH_OPTION or data[n - 3] != 4:
        raise LBMRDecodeError(max(n - 4, 0), "options flag set but the datagram does not end with a length option")
    total = (data[n - 2] << 8) | data[n - 1]
    if total < 4 or total > n - 4:
        raise LBMRDecodeError(n - 2, f"packet options total_len {total} out of range for a {n}-byte datagram")
    return total


def check_packet_options(data: bytes, off: int) -> None:
    """Validate the trailer from ``off`` to the end without building objects."""
    end = len(data) - 4
    p = off
    while p < end:
        if p + 2 > end:
            raise LBMRDecodeError(p, "packet option header truncated")
        typ = data[p]
        ln = data[p + 1]
        want = _FIXED_SIZE.get(typ)
        if want is not None:
            if ln != want:
                raise LBMRDecodeError(p, f"packet option {typ:#04x} has len {ln}, expected {want}")
        elif typ == LENGTH_OPTION:
            raise LBMRDecodeError(p, "length option before the end of the packet options")
        elif ln < 4:
            raise LBMRDecodeError(p, f"packet option {typ:#04x} has len {ln} (< 4)")
        p += ln
    if p != end:
        raise LBMRDecodeError(end, "packet options overrun the length option")


def decode_packet_options(data: bytes, off: int) -> list:
    """Decode (and validate, in the same pass) the trailer from ``off``."""
    end = len(data) - 4
    out: list = []
    p = off
    get = PACKET_OPTION_TYPES.get
    while p < end:
        if p + 2 > end:
            raise LBMRDecodeError(p, "packet option header truncated")
        typ = data[p]
        ln = data[p + 1]
        cls = get(typ)
        if cls is not None:
            if ln != cls.SIZE:
                raise LBMRDecodeError(p, f"packet option {typ:#04x} has len {ln}, expected {cls.SIZE}")
            if p + ln > end:
                break
            out.append(cls.unpack_body(data, p))
        elif typ == LENGTH_OPTION:
            raise LBMRDecodeError(p, "length option before the end of the packet options")
        elif ln < 4:
            raise LBMRDecodeError(p, f"packet option {typ:#04x} has len {ln} (< 4)")
        else:
            if p + ln > end:
                break
            out.append(UnknownPacketOption(typ, _HDR.unpack_from(data, p)[2], data[p + 4:p + ln]))
        p += ln
    if p != end:
        raise LBMRDecodeError(end, "packet options overrun the length option")
    return out


def encode_packet_options(options: list) -> bytes:
    body = b"".join([o.encode() for o in options])
    total = len(body) + 4
    if total > 0xFFFF:
        raise LBMREncodeError("packet options longer than 65535 bytes")
    return body + _HDR.pack(LENGTH_OPTION, 4, total)
