"""Shared pieces of the extended-record (packet type 7) codec, used by every
family of extended types: the struct layouts the families have in common,
packing that reports out-of-range fields as :class:`LBMREncodeError`, and the
truncation check of the decoders. Big-endian throughout; offsets are
datagram offsets.
"""

from __future__ import annotations

import struct

from .errors import LBMRDecodeError, LBMREncodeError

#: one u16
H = struct.Struct("!H")
#: two u16s (a length and a count or flags, in either order)
HH = struct.Struct("!HH")
#: an option header: u8 type, u8 length, u16 flags
BBH = struct.Struct("!BBH")


def pack(s: struct.Struct, *vals) -> bytes:
    """``s.pack(*vals)``, raising :class:`LBMREncodeError` for a value that does not fit."""
    try:
        return s.pack(*vals)
    except struct.error as e:
        raise LBMREncodeError(str(e)) from None


def need(off: int, n: int, end: int, what: str) -> None:
    """Raise :class:`LBMRDecodeError` at ``off`` unless ``n`` bytes from ``off`` fit before ``end``."""
    if off + n > end:
        raise LBMRDecodeError(off, f"{what} truncated")


def option_wire(t: int, flags: int, body: bytes, what: str) -> bytes:
    """An option of type ``t``: u8 type, u8 length (4-byte header included, at most
    255), u16 ``flags``, then ``body``; :class:`LBMREncodeError` naming ``what`` if
    it does not fit."""
    if len(body) + 4 > 255:
        raise LBMREncodeError(f"{what} option too long")
    return pack(BBH, t, 4 + len(body), flags) + body
