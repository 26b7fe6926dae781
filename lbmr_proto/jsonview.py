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


def plain(obj: Any) -> Any:
    """Recursively turn codec objects into dicts/lists/ints/strs."""
    if isinstance(obj, (bytes, bytearray)):
        return obj.hex()
    if isinstance(obj, list):
        return [plain(x) for x in obj]
    if is_dataclass(obj):
        d: dict[str, Any] = {}
        label = _LABELS.get(type(obj).__name__)
        if label is not None:
            d["kind"] = label
            code = getattr(obj, "CODE", None)
            if code is None:
                code = getattr(obj, "code", None)
            if code is not None:
                d["code"] = code
        for f in fields(obj):
            d[f.name] = plain(getattr(obj, f.name))
        if label is not None and "EXT" in dir(type(obj)) and "ext_type" not in d:
            d["ext_type"] = int(obj.EXT)
        return d
    return obj


def tir_dict(tir: TIR) -> dict[str, Any]:
    """A TIR as a flat dict: topic, transport name, ttl, index, the transport's fields, options."""
    t = tir.transport
    d: dict[str, Any] = {"topic": tir.topic, "transport": t.NAME, "ttl": tir.ttl, "index": tir.index}
    if t.NAME == "UNKNOWN":
        d["transport_type"] = t.type_code
        d["data"] = t.data.hex()
    else:
        for f in fields(t):
            d[f.name] = getattr(t, f.name)
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
