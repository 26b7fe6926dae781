"""Plain-data (JSON-ready) views of decoded packets.

Used by ``lbmr-inspect --json`` and the analysis pipeline. Byte strings are
shown as lowercase hex; IPv4 addresses as dotted quads; numbers as ints.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

from .packet import Packet
from .records import TIR

# Option/record class name -> short label shown as "kind"
_LABELS = {
    "UmeOption": "UME", "UmeStoreOption": "UME_STORE", "UmeStoreGroupOption": "UME_STORE_GROUP",
    "LateJoinOption": "LATE_JOIN", "UmqRcrIdxOption": "UMQ_RCRIDX", "UmqQueueInfoOption": "UMQ_QINFO",
    "CostOption": "COST", "OtidOption": "OTID", "CtxInstOption": "CTXINST",
    "StoreCtxInstOption": "CTXINSTS", "UlbOption": "ULB", "QueueCtxInstOption": "CTXINSTQ",
    "DomainIdOption": "DOMAIN_ID", "ExFuncOption": "EXFUNC", "UnknownTirOption": "UNKNOWN",
    "SourceIdOption": "SRC_ID", "SourceTypeOption": "SRC_TYPE", "VersionOption": "VERSION",
    "LocalDomainOption": "LOCAL_DOMAIN", "UnknownPacketOption": "UNKNOWN",
    "Pser": "PSER", "Qmgmt": "QMGMT", "CtxInfo": "CTXINFO", "TopicResRequest": "TOPIC_RES_REQUEST",
    "Tnwg": "TNWG", "RemoteDomainRoute": "REMOTE_DOMAIN_ROUTE", "RemoteCtxInfo": "REMOTE_CTXINFO",
    "UnknownExt": "UNKNOWN",
}


_SHAPES: dict[type, tuple] = {}


def _shape(cls: type) -> tuple:
    """(label, field names, has CODE, has EXT) of a record class, computed once."""
    s = _SHAPES.get(cls)
    if s is None:
        names = tuple(f.name for f in fields(cls))
        s = _SHAPES[cls] = (_LABELS.get(cls.__name__), names, hasattr(cls, "CODE"),
                            hasattr(cls, "EXT") and "ext_type" not in names)
    return s


def plain(obj: Any) -> Any:
    """Recursively turn codec objects into dicts/lists/ints/strs."""
    t = type(obj)
    if t is int or t is str or obj is None or t is bool:
        return obj
    if t is bytes or t is bytearray:
        return obj.hex()
    if t is list or t is tuple:
        return [plain(x) for x in obj]
    if not is_dataclass(obj):
        return int(obj) if isinstance(obj, int) else obj
    label, names, has_code, has_ext = _shape(t)
    d: dict[str, Any] = {}
    if label is not None:
        d["kind"] = label
        if has_code:
            d["code"] = obj.CODE
        elif "code" in names:
            d["code"] = obj.code
    for n in names:
        v = getattr(obj, n)
        tv = type(v)
        d[n] = v if tv is int or tv is str or v is None else plain(v)
    if has_ext:
        d["ext_type"] = int(obj.EXT)
    return d


def tir_dict(tir: TIR) -> dict[str, Any]:
    """A TIR as a flat dict: topic, transport name, ttl, index, the transport's fields, options."""
    t = tir.transport
    d: dict[str, Any] = {"topic": tir.topic, "transport": t.NAME, "ttl": tir.ttl, "index": tir.index}
    if t.NAME == "UNKNOWN":
        d["transport_type"] = t.type_code
        d["data"] = t.data.hex()
    else:
        for n in t._NAMES:
            d[n] = getattr(t, n)
    d["options"] = None if tir.options is None else plain(tir.options)
    return d


def packet_dict(pkt: Packet) -> dict[str, Any]:
    """The packet's records as plain data (keys as documented in lbmr-inspect(1))."""
    return {
        "version": pkt.version,
        "type": pkt.type_name,
        "tqrs": [q.topic for q in pkt.tqrs],
        "wc_tqrs": [{"pattern": w.pattern, "pattern_type": w.pattern_type} for w in pkt.wc_tqrs],
        "tirs": [tir_dict(t) for t in pkt.tirs],
        "tmb": plain(pkt.tmb),
        "qqrs": [q.queue for q in pkt.qqrs],
        "qirs": plain(pkt.qirs),
        "ext": plain(pkt.ext),
        "options": plain(pkt.options),
    }
