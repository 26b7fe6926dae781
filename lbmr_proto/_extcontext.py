"""Extended records a UM context sends about itself (packet type 7, types
0x03 and 0x04): context information (:class:`CtxInfo`) and topic-resolution
requests (:class:`TopicResRequest`). Big-endian throughout; offsets are
datagram offsets (the record's first two bytes are ``ver_type`` and the type
code). Length fields are derived on encode and checked on decode.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar

from ._extwire import H, need, pack
from ._wire import ip_bytes, ip_text, opt_text, opt_wire
from .constants import ExtType
from .errors import LBMRDecodeError

# ---------------------------------------------------------------- 0x03 CTXINFO

_CTX = struct.Struct("!BBHH4s8s")  # from offset 2


@dataclass(slots=True)
class CtxInfo:
    """Context information (ext 0x03). flags: 0x8000 query, 0x4000 IP present,
    0x2000 instance present, 0x1000 TNWG source, 0x0800 TNWG receiver,
    0x0400 proxy; 0x0001 (name present) is derived from ``name``."""

    EXT: ClassVar[int] = ExtType.CTXINFO
    flags: int = 0
    hop_count: int = 0
    port: int = 0
    ip: str = "0.0.0.0"
    instance: bytes = bytes(8)
    name: str | None = None
    name_nul: bool = True

    def encode(self, ver_type: int) -> bytes:
        name = b"" if self.name is None else opt_wire(self.name, self.name_nul)
        flags = (self.flags & ~1) | (1 if self.name is not None else 0)
        return bytes((ver_type, self.EXT)) + pack(
            _CTX, 20 + len(name), self.hop_count, flags, self.port, ip_bytes(self.ip),
            self.instance) + name

    @classmethod
    def decode(cls, data: bytes, end: int) -> tuple[CtxInfo, int]:
        need(0, 20, end, "context info")
        ln, hop, flags, port, ip, inst = _CTX.unpack_from(data, 2)
        if ln > end or ln < 20 or (ln != 20 and not flags & 1):
            raise LBMRDecodeError(2, f"context info len {ln} does not match its contents")
        name = nul = None
        if flags & 1:
            name, nul = opt_text(data[20:ln])
        return cls(flags & ~1, hop, port, ip_text(ip), inst, name, True if nul is None else nul), ln


# ---------------------------------------------------------------- 0x04 TR request


@dataclass(slots=True)
class TopicResRequest:
    """Topic resolution request (ext 0x04): asks for the TR traffic named by ``flags``."""

    EXT: ClassVar[int] = ExtType.TOPIC_RES_REQUEST
    flags: int = 0

    def encode(self, ver_type: int) -> bytes:
        return bytes((ver_type, self.EXT)) + pack(H, self.flags)

    @classmethod
    def decode(cls, data: bytes, end: int) -> tuple[TopicResRequest, int]:
        need(0, 4, end, "topic resolution request")
        return cls(H.unpack_from(data, 2)[0]), 4
