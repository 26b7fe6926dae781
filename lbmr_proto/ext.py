"""Extended (packet type 7) records. Exactly one per datagram; its first two
bytes are the main header's ``ver_type`` and the extended type code, so all
offsets here are datagram offsets. Big-endian throughout.

Length fields whose meaning the public sources leave open (TNWG header
``length``, remote-domain-route ``length``, remote-context-info ``length``,
the PSER options-header ``opt_type``) are kept as received when decoding;
``None`` means "compute the inferred value" when encoding. Length fields with
a known meaning are derived on encode and checked on decode.

Over 600 lines because it holds one record class per extended type (seven,
with their sub-records) and the registry from type code to class, like the
other record modules; each class is short and stands alone.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import ClassVar

from ._wire import Fixed, fixed, ip_bytes, ip_text, opt_text, opt_wire
from .constants import ExtType
from .errors import LBMRDecodeError, LBMREncodeError

_H = struct.Struct("!H")
_HH = struct.Struct("!HH")
_BBH = struct.Struct("!BBH")


def _pack(s: struct.Struct, *vals) -> bytes:
    try:
        return s.pack(*vals)
    except struct.error as e:
        raise LBMREncodeError(str(e)) from None


def _need(off: int, n: int, end: int, what: str) -> None:
    if off + n > end:
        raise LBMRDecodeError(off, f"{what} truncated")


# ------------------------------------------------------------------- 0x01 PSER

_PSER = struct.Struct("!HHH4s4sIIHH")  # from offset 2


@dataclass(slots=True)
class PserOption:
    """PSER option (length byte first, then type): type 0 source context
    instance, 1 store context instance (10 bytes); other types kept raw."""

    type: int
    ctxinst: bytes = bytes(8)
    data: bytes = b""  # payload of unknown types

    def encode(self) -> bytes:
        if self.type in (0, 1):
            if len(self.ctxinst) != 8:
                raise LBMREncodeError("PSER ctxinst must be 8 bytes")
            return bytes((10, self.type)) + self.ctxinst
        if 2 + len(self.data) > 255:
            raise LBMREncodeError("PSER option too long")
        return bytes((2 + len(self.data), self.type)) + self.data


@dataclass(slots=True)
class Pser:
    """UME proxy source election (ext 0x01). ``dep_type`` 0 election, 1 re-election.
    ``options`` None = no options (flags bit 0x8000 clear)."""

    EXT: ClassVar[int] = ExtType.PSER
    topic: str = ""
    dep_type: int = 0
    flags: int = 0
    source_ip: str = "0.0.0.0"
    store_ip: str = "0.0.0.0"
    transport_idx: int = 0
    topic_idx: int = 0
    source_port: int = 0
    store_port: int = 0
    topic_nul: bool = True
    options: list[PserOption] | None = None
    opt_type: int = 0

    def encode(self, ver_type: int) -> bytes:
        topic = opt_wire(self.topic, self.topic_nul)
        flags = (self.flags & 0x7FFF) | (0x8000 if self.options is not None else 0)
        out = bytes((ver_type, self.EXT)) + _pack(
            _PSER, self.dep_type, 28 + len(topic), flags, ip_bytes(self.source_ip),
            ip_bytes(self.store_ip), self.transport_idx, self.topic_idx, self.source_port,
            self.store_port) + topic
        if self.options is not None:
            body = b"".join([o.encode() for o in self.options])
            out += _pack(_HH, self.opt_type, 4 + len(body)) + body
        return out

    @classmethod
    def decode(cls, data: bytes, end: int) -> tuple[Pser, int]:
        _need(0, 28, end, "PSER record")
        dep, ln, flags, sip, stip, tidx, topidx, sport, stport = _PSER.unpack_from(data, 2)
        if ln < 28 or ln > end:
            raise LBMRDecodeError(4, f"PSER len {ln} out of range")
        topic, nul = opt_text(data[28:ln])
        p = ln
        options = None
        opt_type = 0
        if flags & 0x8000:
            _need(p, 4, end, "PSER options header")
            opt_type, optlen = _HH.unpack_from(data, p)
            if optlen < 4 or p + optlen > end:
                raise LBMRDecodeError(p + 2, f"PSER optlen {optlen} out of range")
            stop = p + optlen
            p += 4
            options = []
            while p < stop:
                _need(p, 2, stop, "PSER option")
                oln, otyp = data[p], data[p + 1]
                if otyp in (0, 1):
                    if oln != 10:
                        raise LBMRDecodeError(p, f"PSER option {otyp} has len {oln}, expected 10")
                    _need(p, 10, stop, "PSER option")
                    options.append(PserOption(otyp, data[p + 2:p + 10]))
                else:
                    if oln < 2 or p + oln > stop:
                        raise LBMRDecodeError(p, f"PSER option len {oln} out of range")
                    options.append(PserOption(otyp, bytes(8), data[p + 2:p + oln]))
                p += oln
        rec = cls(topic, dep, flags & 0x7FFF, ip_text(sip), ip_text(stip), tidx, topidx,
                  sport, stport, nul, options, opt_type)
        return rec, p


# ------------------------------------------------------------------ 0x02 QMGMT

_QM = struct.Struct("!BB20sII4sHHHH")  # from offset 2
_QMINST = struct.Struct("!4sHHHH")
QMGMT_IL, QMGMT_JR, QMGMT_JREJ, QMGMT_IKA, QMGMT_EC, QMGMT_EV, QMGMT_CNIL, QMGMT_QRO = range(1, 9)


@fixed
class QmgmtInstance(Fixed):
    """Queue instance in an IL body, 12 bytes; flags 0x8000 M, 0x4000 Q, 0x2000 P."""

    _FMT = "4sHHHH"
    _IPS = ("ip",)
    ip: str = "0.0.0.0"
    port: int = 0
    inst_idx: int = 0
    grp_idx: int = 0
    flags: int = 0


@dataclass(slots=True)
class Qmgmt:
    """UMQ queue management (ext 0x02). ``pckt_type`` 1 IL .. 8 QRO.

    Body fields by type: IL ``highest_rcr_tsp`` + ``instances`` (dep16 =
    instance count, derived); EC ``queue_new_ver``; EV ``highest_rcr_tsp`` +
    ``age``; QRO ``highest_rcr_tsp``. ``queue_name`` (flags 0x40) is all
    remaining bytes. Unknown packet types keep the rest in ``raw``.
    """

    EXT: ClassVar[int] = ExtType.QMGMT
    pckt_type: int = QMGMT_IKA
    flags: int = 0
    cfgsig: bytes = bytes(20)
    queue_id: int = 0
    queue_ver: int = 0
    ip: str = "0.0.0.0"
    port: int = 0
    inst_idx: int = 0
    grp_idx: int = 0
    dep16: int = 0
    highest_rcr_tsp: int = 0
    queue_new_ver: int = 0
    age: int = 0
    instances: list[QmgmtInstance] = field(default_factory=list)
    queue_name: str | None = None
    queue_name_nul: bool = False
    raw: bytes = b""

    def encode(self, ver_type: int) -> bytes:
        t = self.pckt_type
        dep16 = len(self.instances) if t == QMGMT_IL else self.dep16
        known = QMGMT_IL <= t <= QMGMT_QRO
        flags = self.flags
        if known:
            flags = (flags & ~0x40) | (0x40 if self.queue_name is not None else 0)
        out = [bytes((ver_type, self.EXT)), _pack(
            _QM, flags, t, self.cfgsig, self.queue_id, self.queue_ver, ip_bytes(self.ip),
            self.port, self.inst_idx, self.grp_idx, dep16)]
        if t == QMGMT_IL:
            out.append(_pack(struct.Struct("!I"), self.highest_rcr_tsp))
            out += [i.pack_body() for i in self.instances]
        elif t == QMGMT_EC:
            out.append(_pack(struct.Struct("!I"), self.queue_new_ver))
        elif t == QMGMT_EV:
            out.append(_pack(struct.Struct("!II"), self.highest_rcr_tsp, self.age))
        elif t == QMGMT_QRO:
            out.append(_pack(struct.Struct("!I"), self.highest_rcr_tsp))
        elif not known:
            out.append(self.raw)
            return b"".join(out)
        if self.queue_name is not None:
            out.append(opt_wire(self.queue_name, self.queue_name_nul))
        return b"".join(out)

    @classmethod
    def decode(cls, data: bytes, end: int) -> tuple[Qmgmt, int]:
        _need(0, 44, end, "QMGMT header")
        flags, t, cfgsig, qid, qver, ip, port, inst, grp, dep16 = _QM.unpack_from(data, 2)
        rec = cls(t, flags, cfgsig, qid, qver, ip_text(ip), port, inst, grp, dep16)
        p = 44
        if t == QMGMT_IL:
            _need(p, 4 + 12 * dep16, end, f"QMGMT instance list of {dep16}")
            rec.highest_rcr_tsp = struct.unpack_from("!I", data, p)[0]
            p += 4
            for _ in range(dep16):
                rec.instances.append(QmgmtInstance.unpack_body(data, p))
                p += 12
        elif t == QMGMT_EC:
            _need(p, 4, end, "QMGMT EC body")
            rec.queue_new_ver = struct.unpack_from("!I", data, p)[0]
            p += 4
        elif t == QMGMT_EV:
            _need(p, 8, end, "QMGMT EV body")
            rec.highest_rcr_tsp, rec.age = struct.unpack_from("!II", data, p)
            p += 8
        elif t == QMGMT_QRO:
            _need(p, 4, end, "QMGMT QRO body")
            rec.highest_rcr_tsp = struct.unpack_from("!I", data, p)[0]
            p += 4
        elif not QMGMT_IL <= t <= QMGMT_QRO:
            rec.raw = data[p:end]
            return rec, end
        if flags & 0x40:
            rec.queue_name, rec.queue_name_nul = opt_text(data[p:end])
            p = end
        rec.flags &= ~0x40
        return rec, p


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
        return bytes((ver_type, self.EXT)) + _pack(
            _CTX, 20 + len(name), self.hop_count, flags, self.port, ip_bytes(self.ip),
            self.instance) + name

    @classmethod
    def decode(cls, data: bytes, end: int) -> tuple[CtxInfo, int]:
        _need(0, 20, end, "context info")
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
        return bytes((ver_type, self.EXT)) + _pack(_H, self.flags)

    @classmethod
    def decode(cls, data: bytes, end: int) -> tuple[TopicResRequest, int]:
        _need(0, 4, end, "topic resolution request")
        return cls(_H.unpack_from(data, 2)[0]), 4


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
            body = _pack(_HH, self.port, self.res) + ip_bytes(self.ip)
        elif t == 2:
            body = _pack(struct.Struct("!I"), self.domain_id)
        elif t == 3:
            body = opt_wire(self.name, self.name_nul)
        else:
            body = self.data
        if len(body) + 4 > 255:
            raise LBMREncodeError("TNWG option too long")
        return _pack(_BBH, t, 4 + len(body), self.flags) + body


_TNWG_FIXED = {0: 12, 1: 12, 2: 8}


def _decode_tnwg_options(data: bytes, p: int, stop: int) -> list[TnwgOption]:
    out = []
    while p < stop:
        _need(p, 4, stop, "TNWG option")
        t, ln, flags = _BBH.unpack_from(data, p)
        want = _TNWG_FIXED.get(t)
        if (want is not None and ln != want) or ln < 4 or p + ln > stop:
            raise LBMRDecodeError(p, f"TNWG option {t} has bad len {ln}")
        o = TnwgOption(t, flags)
        if t == 0:
            o.instance = data[p + 4:p + 12]
        elif t == 1:
            o.port, o.res = _HH.unpack_from(data, p + 4)
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
        return _pack(_INTREC, 8 + len(sym), self.flags, self.pattype, self.domain_id) + sym


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
            return _pack(_HH, 4 + len(recs), len(self.interest)) + recs
        opts = b"".join([o.encode() for o in self.options])
        if self.type == 1:
            return _pack(_TNCTX, 12 + len(opts), self.hop_count, self.ctx_reserved,
                         self.flags1, self.flags2) + opts
        if self.type == 2:
            return _pack(_H, 2 + len(opts)) + opts
        return self.raw

    def encode(self, ver_type: int) -> bytes:
        body = self._body()
        length = 8 + len(body) if self.length is None else self.length
        return bytes((ver_type, self.EXT)) + _pack(_TNWGHDR, length, self.type, self.reserved) + body

    @classmethod
    def decode(cls, data: bytes, end: int) -> tuple[Tnwg, int]:
        _need(0, 8, end, "TNWG header")
        length, typ, res = _TNWGHDR.unpack_from(data, 2)
        rec = cls(typ, res, length)
        p = 8
        if typ == 0:
            _need(p, 4, end, "TNWG interest header")
            blen, count = _HH.unpack_from(data, p)
            if blen < 4 or p + blen > end:
                raise LBMRDecodeError(p, f"TNWG interest len {blen} out of range")
            stop = p + blen
            p += 4
            for _ in range(count):
                _need(p, 8, stop, "TNWG interest record")
                rlen, flags, pattype, dom = _INTREC.unpack_from(data, p)
                if rlen < 8 or p + rlen > stop:
                    raise LBMRDecodeError(p, f"TNWG interest record len {rlen} out of range")
                sym, nul = opt_text(data[p + 8:p + rlen])
                rec.interest.append(InterestRecord(sym, flags, pattype, dom, nul))
                p += rlen
            if p != stop:
                raise LBMRDecodeError(p, "TNWG interest records do not fill the block len")
        elif typ == 1:
            _need(p, 12, end, "TNWG context info")
            clen, rec.hop_count, rec.ctx_reserved, rec.flags1, rec.flags2 = _TNCTX.unpack_from(data, p)
            if clen < 12 or p + clen > end:
                raise LBMRDecodeError(p, f"TNWG context info len {clen} out of range")
            rec.options = _decode_tnwg_options(data, p + 12, p + clen)
            p += clen
        elif typ == 2:
            _need(p, 2, end, "TNWG TR request")
            tlen = _H.unpack_from(data, p)[0]
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
        return bytes((ver_type, self.EXT)) + _pack(
            _RDR, n, ip_bytes(self.ip), self.port, self.route_index, length) + _pack(
            struct.Struct(f"!{n}I"), *self.domains)

    @classmethod
    def decode(cls, data: bytes, end: int) -> tuple[RemoteDomainRoute, int]:
        _need(0, 16, end, "remote domain route")
        n, ip, port, idx, length = _RDR.unpack_from(data, 2)
        _need(16, 4 * n, end, f"remote domain route list of {n} domains")
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
            body = _pack(_RCADDR, self.domain_id, ip_bytes(self.ip), self.port, self.res)
        elif t == 2:
            body = self.instance
            if len(body) != 8:
                raise LBMREncodeError("instance must be 8 bytes")
        elif t == 3:
            body = _pack(struct.Struct("!I"), self.domain_id)
        elif t == 4:
            body = opt_wire(self.name, self.name_nul)
        else:
            body = self.data
        if len(body) + 4 > 255:
            raise LBMREncodeError("remote context info option too long")
        return _pack(_BBH, t, 4 + len(body), self.flags) + body


_RC_FIXED = {1: 16, 2: 12, 3: 8}


@dataclass(slots=True)
class RctxRecord:
    """One remote-context-info record: flags 0x8000 query; its options."""

    flags: int = 0
    options: list[RctxOption] = field(default_factory=list)

    def encode(self) -> bytes:
        body = b"".join([o.encode() for o in self.options])
        return _pack(_HH, 4 + len(body), self.flags) + body


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
        return bytes((ver_type, self.EXT)) + _pack(
            _RCHDR, length, len(self.records), self.reserved) + body

    @classmethod
    def decode(cls, data: bytes, end: int) -> tuple[RemoteCtxInfo, int]:
        _need(0, 8, end, "remote context info header")
        length, n, res = _RCHDR.unpack_from(data, 2)
        rec = cls([], res, length)
        p = 8
        for _ in range(n):
            _need(p, 4, end, "remote context info record")
            rlen, flags = _HH.unpack_from(data, p)
            if rlen < 4 or p + rlen > end:
                raise LBMRDecodeError(p, f"remote context info record len {rlen} out of range")
            stop = p + rlen
            r = RctxRecord(flags)
            q = p + 4
            while q < stop:
                _need(q, 4, stop, "remote context info option")
                t, ln, oflags = _BBH.unpack_from(data, q)
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


# ------------------------------------------------------------------ unknown


@dataclass(slots=True)
class UnknownExt:
    """An extended type the codec does not know: everything after byte 1, raw."""

    ext_type: int
    data: bytes = b""

    @property
    def EXT(self) -> int:  # noqa: N802
        return self.ext_type

    def encode(self, ver_type: int) -> bytes:
        if not 0 <= self.ext_type <= 255 or self.ext_type in EXT_TYPES:
            raise LBMREncodeError(f"ext_type {self.ext_type} out of range or not unknown")
        if len(self.data) < 2:
            raise LBMREncodeError("an extended record is at least 4 bytes")
        return bytes((ver_type, self.ext_type)) + self.data

    @classmethod
    def decode_raw(cls, data: bytes, end: int) -> tuple[UnknownExt, int]:
        if end < 4:
            raise LBMRDecodeError(0, "extended record shorter than 4 bytes")
        return cls(data[1], data[2:end]), end


EXT_TYPES: dict[int, type] = {
    c.EXT: c for c in (Pser, Qmgmt, CtxInfo, TopicResRequest, Tnwg, RemoteDomainRoute, RemoteCtxInfo)
}


def decode_ext(data: bytes, end: int):
    """Decode the one extended record in ``data[0:end]``; returns (record, end offset)."""
    if end < 2:
        raise LBMRDecodeError(0, "extended header truncated")
    cls = EXT_TYPES.get(data[1])
    if cls is None:
        return UnknownExt.decode_raw(data, end)
    return cls.decode(data, end)
