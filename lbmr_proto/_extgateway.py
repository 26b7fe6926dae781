"""Extended records of the gateway / DRO (packet type 7, types 0x05 to 0x07):
the TNWG message (:class:`Tnwg`, with :class:`InterestRecord` and
:class:`TnwgOption`), the remote domain route (:class:`RemoteDomainRoute`)
and remote context information (:class:`RemoteCtxInfo`, with
:class:`RctxRecord` and :class:`RctxOption`). Big-endian throughout; offsets
are datagram offsets (the record's first two bytes are ``ver_type`` and the
type code).

Length fields whose meaning the public sources leave open (TNWG header
``length``, remote-domain-route ``length``, remote-context-info ``length``)
are kept as received when decoding; ``None`` means "compute the inferred
value" when encoding. Length fields with a known meaning are derived on
encode and checked on decode.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import ClassVar

from ._extwire import BBH, HH, H, need, option_wire, pack
from ._wire import ip_bytes, ip_text, opt_text, opt_wire
from .constants import ExtType
from .errors import LBMRDecodeError, LBMREncodeError

# -------------------------------------------------------------------- 0x05 TNWG

_TNWGHDR = struct.Struct("!HHH")  # from offset 2
_INTREC = struct.Struct("!HBBI")
_TNCTX = struct.Struct("!HBBII")


@dataclass(slots=True)
class TnwgOption:
    """A TNWG option: type 0 context instance (8 bytes), 1 address (port, res,
    ip), 2 domain, 3 name; other types keep ``data``."""

    type: int
    flags: int = 0
    instance: bytes = bytes(8)
    port: int = 0
    res: int = 0
    ip: str = "0.0.0.0"
    domain_id: int = 0
    name: str = ""
    name_nul: bool = True
    data: bytes = b""

    def encode(self) -> bytes:
        t = self.type
        if t == 0:
            body = self.instance
            if len(body) != 8:
                raise LBMREncodeError("TNWG instance must be 8 bytes")
        elif t == 1:
            body = pack(HH, self.port, self.res) + ip_bytes(self.ip)
        elif t == 2:
            body = pack(struct.Struct("!I"), self.domain_id)
        elif t == 3:
            body = opt_wire(self.name, self.name_nul)
        else:
            body = self.data
        return option_wire(t, self.flags, body, "TNWG")


_TNWG_FIXED = {0: 12, 1: 12, 2: 8}


def _decode_tnwg_options(data: bytes, p: int, stop: int) -> list[TnwgOption]:
    out = []
    while p < stop:
        need(p, 4, stop, "TNWG option")
        t, ln, flags = BBH.unpack_from(data, p)
        want = _TNWG_FIXED.get(t)
        if (want is not None and ln != want) or ln < 4 or p + ln > stop:
            raise LBMRDecodeError(p, f"TNWG option {t} has bad len {ln}")
        o = TnwgOption(t, flags)
        if t == 0:
            o.instance = data[p + 4:p + 12]
        elif t == 1:
            o.port, o.res = HH.unpack_from(data, p + 4)
            o.ip = ip_text(data[p + 8:p + 12])
        elif t == 2:
            o.domain_id = struct.unpack_from("!I", data, p + 4)[0]
        elif t == 3:
            o.name, o.name_nul = opt_text(data[p + 4:p + ln])
        else:
            o.data = data[p + 4:p + ln]
        out.append(o)
        p += ln
    return out


@dataclass(slots=True)
class InterestRecord:
    """TNWG interest record: flags 0x80 pattern, 0x40 cancel, 0x20 refresh;
    ``pattype`` 1 PCRE, 2 REGEX; ``symbol`` a topic or pattern."""

    symbol: str
    flags: int = 0
    pattype: int = 0
    domain_id: int = 0
    symbol_nul: bool = True

    def encode(self) -> bytes:
        sym = opt_wire(self.symbol, self.symbol_nul)
        return pack(_INTREC, 8 + len(sym), self.flags, self.pattype, self.domain_id) + sym


@dataclass(slots=True)
class Tnwg:
    """Gateway/DRO message (ext 0x05). ``type`` 0 interest (``interest``),
    1 context info (``hop_count``, ``flags1``, ``flags2``, ``options``),
    2 topic-resolution request (``options``); other types keep ``raw``.
    ``length`` is the header's u16 (inferred: whole message; None = compute)."""

    EXT: ClassVar[int] = ExtType.TNWG
    type: int = 0
    reserved: int = 0
    length: int | None = None
    interest: list[InterestRecord] = field(default_factory=list)
    hop_count: int = 0
    ctx_reserved: int = 0
    flags1: int = 0
    flags2: int = 0
    options: list[TnwgOption] = field(default_factory=list)
    raw: bytes = b""

    def _body(self) -> bytes:
        if self.type == 0:
            recs = b"".join([r.encode() for r in self.interest])
            return pack(HH, 4 + len(recs), len(self.interest)) + recs
        opts = b"".join([o.encode() for o in self.options])
        if self.type == 1:
            return pack(_TNCTX, 12 + len(opts), self.hop_count, self.ctx_reserved,
                         self.flags1, self.flags2) + opts
        if self.type == 2:
            return pack(H, 2 + len(opts)) + opts
        return self.raw

    def encode(self, ver_type: int) -> bytes:
        body = self._body()
        length = 8 + len(body) if self.length is None else self.length
        return bytes((ver_type, self.EXT)) + pack(_TNWGHDR, length, self.type, self.reserved) + body

    @classmethod
    def decode(cls, data: bytes, end: int) -> tuple[Tnwg, int]:
        need(0, 8, end, "TNWG header")
        length, typ, res = _TNWGHDR.unpack_from(data, 2)
        rec = cls(typ, res, length)
        p = 8
        if typ == 0:
            need(p, 4, end, "TNWG interest header")
            blen, count = HH.unpack_from(data, p)
            if blen < 4 or p + blen > end:
                raise LBMRDecodeError(p, f"TNWG interest len {blen} out of range")
            stop = p + blen
            p += 4
            for _ in range(count):
                need(p, 8, stop, "TNWG interest record")
                rlen, flags, pattype, dom = _INTREC.unpack_from(data, p)
                if rlen < 8 or p + rlen > stop:
                    raise LBMRDecodeError(p, f"TNWG interest record len {rlen} out of range")
                sym, nul = opt_text(data[p + 8:p + rlen])
                rec.interest.append(InterestRecord(sym, flags, pattype, dom, nul))
                p += rlen
            if p != stop:
                raise LBMRDecodeError(p, "TNWG interest records do not fill the block len")
        elif typ == 1:
            need(p, 12, end, "TNWG context info")
            clen, rec.hop_count, rec.ctx_reserved, rec.flags1, rec.flags2 = _TNCTX.unpack_from(data, p)
            if clen < 12 or p + clen > end:
                raise LBMRDecodeError(p, f"TNWG context info len {clen} out of range")
            rec.options = _decode_tnwg_options(data, p + 12, p + clen)
            p += clen
        elif typ == 2:
            need(p, 2, end, "TNWG TR request")
            tlen = H.unpack_from(data, p)[0]
            if tlen < 2 or p + tlen > end:
                raise LBMRDecodeError(p, f"TNWG TR request len {tlen} out of range")
            rec.options = _decode_tnwg_options(data, p + 2, p + tlen)
            p += tlen
        else:
            rec.raw = data[p:end]
            p = end
        return rec, p


# ------------------------------------------------------ 0x06 remote domain route

_RDR = struct.Struct("!H4sHHI")  # from offset 2


@dataclass(slots=True)
class RemoteDomainRoute:
    """Remote domain route (ext 0x06): the domains reachable via the router
    portal at ``ip``:``port``. ``length`` is the u32 length field (inferred
    16 + 4·n; None = compute)."""

    EXT: ClassVar[int] = ExtType.REMOTE_DOMAIN_ROUTE
    domains: list[int] = field(default_factory=list)
    ip: str = "0.0.0.0"
    port: int = 0
    route_index: int = 0
    length: int | None = None

    def encode(self, ver_type: int) -> bytes:
        n = len(self.domains)
        length = 16 + 4 * n if self.length is None else self.length
        return bytes((ver_type, self.EXT)) + pack(
            _RDR, n, ip_bytes(self.ip), self.port, self.route_index, length) + pack(
            struct.Struct(f"!{n}I"), *self.domains)

    @classmethod
    def decode(cls, data: bytes, end: int) -> tuple[RemoteDomainRoute, int]:
        need(0, 16, end, "remote domain route")
        n, ip, port, idx, length = _RDR.unpack_from(data, 2)
        need(16, 4 * n, end, f"remote domain route list of {n} domains")
        doms = list(struct.unpack_from(f"!{n}I", data, 16))
        return cls(doms, ip_text(ip), port, idx, length), 16 + 4 * n


# ----------------------------------------------------- 0x07 remote context info

_RCHDR = struct.Struct("!HHH")  # from offset 2
_RCADDR = struct.Struct("!I4sHH")


@dataclass(slots=True)
class RctxOption:
    """Remote-context-info record option: type 1 address (domain_id, ip, port,
    res), 2 instance, 3 originating domain, 4 name; others keep ``data``."""

    type: int
    flags: int = 0
    domain_id: int = 0
    ip: str = "0.0.0.0"
    port: int = 0
    res: int = 0
    instance: bytes = bytes(8)
    name: str = ""
    name_nul: bool = True
    data: bytes = b""

    def encode(self) -> bytes:
        t = self.type
        if t == 1:
            body = pack(_RCADDR, self.domain_id, ip_bytes(self.ip), self.port, self.res)
        elif t == 2:
            body = self.instance
            if len(body) != 8:
                raise LBMREncodeError("instance must be 8 bytes")
        elif t == 3:
            body = pack(struct.Struct("!I"), self.domain_id)
        elif t == 4:
            body = opt_wire(self.name, self.name_nul)
        else:
            body = self.data
        return option_wire(t, self.flags, body, "remote context info")


_RC_FIXED = {1: 16, 2: 12, 3: 8}


@dataclass(slots=True)
class RctxRecord:
    """One remote-context-info record: flags 0x8000 query; its options."""

    flags: int = 0
    options: list[RctxOption] = field(default_factory=list)

    def encode(self) -> bytes:
        body = b"".join([o.encode() for o in self.options])
        return pack(HH, 4 + len(body), self.flags) + body


@dataclass(slots=True)
class RemoteCtxInfo:
    """Remote context information (ext 0x07). ``length`` is the u16 header
    length (inferred: whole message; None = compute)."""

    EXT: ClassVar[int] = ExtType.REMOTE_CTXINFO
    records: list[RctxRecord] = field(default_factory=list)
    reserved: int = 0
    length: int | None = None

    def encode(self, ver_type: int) -> bytes:
        body = b"".join([r.encode() for r in self.records])
        length = 8 + len(body) if self.length is None else self.length
        return bytes((ver_type, self.EXT)) + pack(
            _RCHDR, length, len(self.records), self.reserved) + body

    @classmethod
    def decode(cls, data: bytes, end: int) -> tuple[RemoteCtxInfo, int]:
        need(0, 8, end, "remote context info header")
        length, n, res = _RCHDR.unpack_from(data, 2)
        rec = cls([], res, length)
        p = 8
        for _ in range(n):
            need(p, 4, end, "remote context info record")
            rlen, flags = HH.unpack_from(data, p)
            if rlen < 4 or p + rlen > end:
                raise LBMRDecodeError(p, f"remote context info record len {rlen} out of range")
            stop = p + rlen
            r = RctxRecord(flags)
            q = p + 4
            while q < stop:
                need(q, 4, stop, "remote context info option")
                t, ln, oflags = BBH.unpack_from(data, q)
                want = _RC_FIXED.get(t)
                if (want is not None and ln != want) or ln < 4 or q + ln > stop:
                    raise LBMRDecodeError(q, f"remote context info option {t} has bad len {ln}")
                o = RctxOption(t, oflags)
                if t == 1:
                    o.domain_id, ip, o.port, o.res = _RCADDR.unpack_from(data, q + 4)
                    o.ip = ip_text(ip)
                elif t == 2:
                    o.instance = data[q + 4:q + 12]
                elif t == 3:
                    o.domain_id = struct.unpack_from("!I", data, q + 4)[0]
                elif t == 4:
                    o.name, o.name_nul = opt_text(data[q + 4:q + ln])
                else:
                    o.data = data[q + 4:q + ln]
                r.options.append(o)
                q += ln
            rec.records.append(r)
            p = stop
        return rec, p
