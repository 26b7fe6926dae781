"""Extended records of UME and UMQ (packet type 7, types 0x01 and 0x02):
UME proxy source election (:class:`Pser`, with :class:`PserOption`) and UMQ
queue management (:class:`Qmgmt`, with :class:`QmgmtInstance` and the
``QMGMT_*`` packet types). Big-endian throughout; offsets are datagram
offsets (the record's first two bytes are ``ver_type`` and the type code).

The PSER options-header ``opt_type`` (its meaning is not public) is kept as
received; length fields with a known meaning are derived on encode and
checked on decode.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import ClassVar

from ._extwire import HH, need, pack
from ._wire import Fixed, fixed, ip_bytes, ip_text, opt_text, opt_wire
from .constants import ExtType
from .errors import LBMRDecodeError, LBMREncodeError

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
        out = bytes((ver_type, self.EXT)) + pack(
            _PSER, self.dep_type, 28 + len(topic), flags, ip_bytes(self.source_ip),
            ip_bytes(self.store_ip), self.transport_idx, self.topic_idx, self.source_port,
            self.store_port) + topic
        if self.options is not None:
            body = b"".join([o.encode() for o in self.options])
            out += pack(HH, self.opt_type, 4 + len(body)) + body
        return out

    @classmethod
    def decode(cls, data: bytes, end: int) -> tuple[Pser, int]:
        need(0, 28, end, "PSER record")
        dep, ln, flags, sip, stip, tidx, topidx, sport, stport = _PSER.unpack_from(data, 2)
        if ln < 28 or ln > end:
            raise LBMRDecodeError(4, f"PSER len {ln} out of range")
        topic, nul = opt_text(data[28:ln])
        p = ln
        options = None
        opt_type = 0
        if flags & 0x8000:
            need(p, 4, end, "PSER options header")
            opt_type, optlen = HH.unpack_from(data, p)
            if optlen < 4 or p + optlen > end:
                raise LBMRDecodeError(p + 2, f"PSER optlen {optlen} out of range")
            stop = p + optlen
            p += 4
            options = []
            while p < stop:
                need(p, 2, stop, "PSER option")
                oln, otyp = data[p], data[p + 1]
                if otyp in (0, 1):
                    if oln != 10:
                        raise LBMRDecodeError(p, f"PSER option {otyp} has len {oln}, expected 10")
                    need(p, 10, stop, "PSER option")
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
        out = [bytes((ver_type, self.EXT)), pack(
            _QM, flags, t, self.cfgsig, self.queue_id, self.queue_ver, ip_bytes(self.ip),
            self.port, self.inst_idx, self.grp_idx, dep16)]
        if t == QMGMT_IL:
            out.append(pack(struct.Struct("!I"), self.highest_rcr_tsp))
            out += [i.pack_body() for i in self.instances]
        elif t == QMGMT_EC:
            out.append(pack(struct.Struct("!I"), self.queue_new_ver))
        elif t == QMGMT_EV:
            out.append(pack(struct.Struct("!II"), self.highest_rcr_tsp, self.age))
        elif t == QMGMT_QRO:
            out.append(pack(struct.Struct("!I"), self.highest_rcr_tsp))
        elif not known:
            out.append(self.raw)
            return b"".join(out)
        if self.queue_name is not None:
            out.append(opt_wire(self.queue_name, self.queue_name_nul))
        return b"".join(out)

    @classmethod
    def decode(cls, data: bytes, end: int) -> tuple[Qmgmt, int]:
        need(0, 44, end, "QMGMT header")
        flags, t, cfgsig, qid, qver, ip, port, inst, grp, dep16 = _QM.unpack_from(data, 2)
        rec = cls(t, flags, cfgsig, qid, qver, ip_text(ip), port, inst, grp, dep16)
        p = 44
        if t == QMGMT_IL:
            need(p, 4 + 12 * dep16, end, f"QMGMT instance list of {dep16}")
            rec.highest_rcr_tsp = struct.unpack_from("!I", data, p)[0]
            p += 4
            for _ in range(dep16):
                rec.instances.append(QmgmtInstance.unpack_body(data, p))
                p += 12
        elif t == QMGMT_EC:
            need(p, 4, end, "QMGMT EC body")
            rec.queue_new_ver = struct.unpack_from("!I", data, p)[0]
            p += 4
        elif t == QMGMT_EV:
            need(p, 8, end, "QMGMT EV body")
            rec.highest_rcr_tsp, rec.age = struct.unpack_from("!II", data, p)
            p += 8
        elif t == QMGMT_QRO:
            need(p, 4, end, "QMGMT QRO body")
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
