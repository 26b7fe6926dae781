"""Scapy layer for LBMR (Ultra Messaging topic resolution).

``from lbmr_proto.scapy import LBMR`` registers the layer on UDP ports 12965
(multicast topic resolution) and 15380 (lbmrd), source or destination, so
captured frames dissect to ``LBMR`` and ``IP()/UDP(dport=15380)/LBMR(...)``
builds. The wire format is not re-described in scapy fields: the 4-byte main
header is exposed as fields (``version``, ``opts``, ``type``, ``count1``,
``count2``) and everything else is one :class:`LBMRBodyField` whose value is
an :class:`lbmr_proto.Packet`, coded by :func:`lbmr_proto.decode` /
:func:`lbmr_proto.encode`.

Header fields left unset (``None``) are derived from the packet (reading them
gives the derived value); a value set explicitly is put on the wire as is,
which is how malformed datagrams are crafted. After a successful dissection
the header fields are derived again, so editing ``.packet`` and rebuilding
yields a consistent datagram. When the payload does not decode, the layer
keeps the header fields, ``packet`` is ``None``, the bytes after the header
go to a ``Raw`` payload and ``decode_error`` says why.

Crafting::

    LBMR(packet=Packet(...))                 # any packet
    LBMR(tqrs=["a", "b"])                    # NORMAL with two TQRs
    LBMR(tirs=[TIR("t", LbtrmTransport(...))])
    LBMR(wc_tqrs=["^a.*"])                   # type inferred: WC_TQR
    LBMR(type="RCV_ALIVE")                   # keepalive
    LBMR(packet=p, count2=7)                 # header override (malformed)

With record keywords (no ``packet=``), ``type``/``version`` set the Packet's
type and version when they are valid codes; otherwise (``type=5``) they are
raw header values over an inferred packet.
"""

from __future__ import annotations

import copy
import dataclasses

from scapy.config import conf
from scapy.fields import BitEnumField, BitField, ByteField, Field, ShortField
from scapy.layers.inet import UDP
from scapy.packet import Packet as ScapyPacket
from scapy.packet import bind_bottom_up, bind_top_down

from .constants import LBMR_MC_PORT, LBMRD_PORT, WildcardType
from .errors import LBMRDecodeError, LBMREncodeError
from .packet import TYPE_NAMES, Packet, decode, encode
from .records import QQR, TQR, LbtrmTransport, UnknownTransport, WcTQR

__all__ = ["LBMR", "LBMRBodyField", "summarize"]

HEADER_FIELDS = ("version", "opts", "type", "count1", "count2")
RECORD_KEYWORDS = ("tqrs", "wc_tqrs", "tirs", "tmb", "qqrs", "qirs", "ext", "options")


# ------------------------------------------------------------- readable text


def _val(v) -> str:
    if isinstance(v, (bytes, bytearray)):
        return v.hex() if v else "''"
    if isinstance(v, list):
        return "[" + ", ".join(_val(x) for x in v) + "]"
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return _compact(v)
    return repr(v)


def _compact(obj) -> str:
    """``Name(field=value, ...)`` with bytes in hex (dataclass reprs are long)."""
    args = ", ".join(f"{f.name}={_val(getattr(obj, f.name))}" for f in dataclasses.fields(obj))
    return f"{type(obj).__name__}({args})"


def _opts(options) -> str:
    if options is None:
        return ""
    return " opts=[" + ", ".join(type(o).__name__.removesuffix("Option") for o in options) + "]"


def _transport(t) -> str:
    if isinstance(t, LbtrmTransport):
        return (f"LBTRM {t.ip}:{t.src_ucast_port} -> {t.mcast_group}:{t.dest_port}"
                f" sess=0x{t.session_id:08x}")
    if isinstance(t, UnknownTransport):
        return f"transport 0x{t.type_code:02x} ({len(t.data)} bytes)"
    if hasattr(t, "ip") and hasattr(t, "port"):
        sess = f" sess=0x{t.session_id:08x}" if hasattr(t, "session_id") else ""
        return f"{t.NAME} {t.ip}:{t.port}{sess}"
    if hasattr(t, "host_id"):
        return f"{t.NAME} host=0x{t.host_id:08x} sess=0x{t.session_id:08x} xport={t.xport_id}"
    return _compact(t)


def _wc_name(code: int) -> str:
    try:
        return WildcardType(code).name
    except ValueError:
        return f"pattern_type={code}"


def summarize(p: Packet) -> list[str]:
    """One line for the packet, then one per record (used by ``show()``)."""
    name = TYPE_NAMES.get(p.type, f"TYPE_{p.type}")
    lines = [f"{name} v{p.version}"]
    lines += [f"TQR {r.topic!r}" for r in p.tqrs] if p.type == 0 else []
    lines += [f"WC-TQR {_wc_name(r.pattern_type)} {r.pattern!r}" for r in p.wc_tqrs] if p.type == 1 else []
    if p.type in (0, 1):
        lines += [f"TIR {r.topic!r} {_transport(r.transport)} idx={r.index} ttl={r.ttl}{_opts(r.options)}"
                  for r in p.tirs]
    elif p.type == 4 and p.tmb is not None:
        lines[0] += f" length={p.tmb.length}"
        lines += [f"TMR {'USE' if t.type == 1 else 'LEAVE' if t.type == 0 else t.type} {t.name!r}"
                  f" flags=0x{t.flags:02x}" for t in p.tmb.tmrs]
    elif p.type == 6:
        lines += [f"QQR {r.queue!r}" for r in p.qqrs]
        lines += [f"QIR {r.queue!r} topic={r.topic!r} id={r.queue_id} ver={r.queue_ver}"
                  f" groups={len(r.groups)} queues={len(r.queues)}{_opts(r.options)}" for r in p.qirs]
    elif p.type == 7 and p.ext is not None:
        lines.append(_compact(p.ext) if dataclasses.is_dataclass(p.ext) else repr(p.ext))
    if p.options is not None:
        lines.append("packet options " + _val(p.options))
    return lines


# ------------------------------------------------------------------- fields


class LBMRBodyField(Field):
    """Everything after the 4-byte header; internal value an :class:`lbmr_proto.Packet`
    (``None`` when the datagram did not decode). Building emits
    ``encode(packet)[4:]``; dissecting decodes header + rest with the codec."""

    ismutable = True  # in-place edits of the Packet invalidate scapy's raw cache
    __slots__ = ()

    def __init__(self, name: str) -> None:
        Field.__init__(self, name, None)

    def getfield(self, pkt, s):
        f = pkt.fields
        hdr = bytes(((f["version"] << 4) | (f["opts"] << 3) | f["type"], f["count1"]))
        try:
            return b"", decode(hdr + f["count2"].to_bytes(2, "big") + s)
        except LBMRDecodeError:
            return s, None  # the rest becomes a Raw payload; see LBMR.decode_error

    def addfield(self, pkt, s, val):
        return s if val is None else s + encode(val)[4:]

    def any2i(self, pkt, x):
        if isinstance(x, (bytes, bytearray, memoryview)):
            return decode(x)
        if x is not None and not isinstance(x, Packet):
            raise TypeError(f"LBMR packet must be an lbmr_proto.Packet, got {type(x).__name__}")
        return x

    def i2repr(self, pkt, x):
        if x is None:
            err = pkt.decode_error if isinstance(pkt, LBMR) else None
            return f"<not decoded: {err}>" if err else "None"
        return "\n".join(summarize(x))

    def i2len(self, pkt, x):
        return 0 if x is None else len(encode(x)) - 4

    def do_copy(self, x):
        return copy.deepcopy(x)


_TYPE_FIELD = BitEnumField("type", None, 3, TYPE_NAMES)


def _keyword_packet(records: dict, fields: dict) -> Packet:
    """Build the Packet for ``LBMR(tqrs=..., tirs=..., type=..., ...)``.

    ``type``/``version`` describe the packet when they are valid codes (and are
    then not header overrides); otherwise they stay as raw header values.
    """
    rec = dict(records)
    for key, cls in (("tqrs", TQR), ("wc_tqrs", WcTQR), ("qqrs", QQR)):
        if key in rec:
            rec[key] = [cls(x) if isinstance(x, str) else x for x in rec[key]]
    ptype = fields.get("type")
    if isinstance(ptype, str):
        ptype = _TYPE_FIELD.any2i(None, ptype)
    if isinstance(ptype, int) and ptype in TYPE_NAMES:
        del fields["type"]
    else:
        ptype = (7 if "ext" in rec else 6 if {"qqrs", "qirs"} & rec.keys()
                 else 4 if "tmb" in rec else 1 if "wc_tqrs" in rec else 0)
    version = fields.get("version")
    if isinstance(version, int) and 0 <= version <= 15:
        del fields["version"]
    else:
        version = 0
    return Packet(type=ptype, version=version, **rec)


# -------------------------------------------------------------------- layer


class LBMR(ScapyPacket):
    """Ultra Messaging topic resolution (LBMR) datagram."""

    name = "LBMR"
    fields_desc = [
        BitField("version", None, 4),
        BitField("opts", None, 1),
        _TYPE_FIELD,
        ByteField("count1", None),  # TQRs / QQRs (EXT: extended type)
        ShortField("count2", None),  # TIRs / QIRs
        LBMRBodyField("packet"),
    ]

    def __init__(self, _pkt=b"", *args, **kwargs):
        records = {k: kwargs.pop(k) for k in RECORD_KEYWORDS if k in kwargs}
        if records and (_pkt or "packet" in kwargs):
            raise TypeError("LBMR: give either packet= or record keywords, not both")
        if not _pkt and "packet" not in kwargs:
            kwargs["packet"] = _keyword_packet(records, kwargs)
        super().__init__(_pkt, *args, **kwargs)

    # Header fields left unset read as (and build from) the packet's own header.
    def _auto_header(self, attr):
        pkt = super().getfieldval("packet")
        if pkt is None:
            return None
        try:
            b0, b1, b2, b3 = encode(pkt)[:4]
        except LBMREncodeError:
            return None  # building will raise the encode error
        return {"version": b0 >> 4, "opts": (b0 >> 3) & 1, "type": b0 & 7,
                "count1": b1, "count2": (b2 << 8) | b3}[attr]

    def getfieldval(self, attr):
        v = super().getfieldval(attr)
        if v is None and attr in HEADER_FIELDS:
            v = self._auto_header(attr)
        return v

    def getfield_and_val(self, attr):
        fld, v = super().getfield_and_val(attr)
        if v is None and attr in HEADER_FIELDS:
            v = self._auto_header(attr)
        return fld, v

    def do_dissect(self, s):
        if len(s) < 4:  # no complete header: everything goes to Raw
            self.fields["packet"] = None
            self.raw_packet_cache, self.raw_packet_cache_fields, self.explicit = b"", {}, 1
            return s
        return super().do_dissect(s)

    def post_dissect(self, s):
        if self.fields.get("packet") is not None:
            # encode(decode(b)) == b: the wire header is the derived one, so
            # let it follow later edits of .packet
            for name in HEADER_FIELDS:
                self.fields.pop(name, None)
        return s

    @property
    def decode_error(self) -> str | None:
        """Why this layer's bytes (header + Raw payload) are not a valid LBMR
        datagram, or ``None`` when ``packet`` holds the decoded Packet."""
        if super().getfieldval("packet") is not None:
            return None
        try:
            decode(self.build())
        except LBMRDecodeError as e:
            return str(e)
        return None

    def __repr__(self):
        return super().__repr__().replace("\n", "; ")  # show() keeps one record per line

    def guess_payload_class(self, payload):
        return conf.raw_layer  # LBMR is the last layer; leftovers only on errors

    def mysummary(self):
        p = super().getfieldval("packet")
        if p is None:
            return "LBMR (undecodable)"
        name = TYPE_NAMES.get(p.type, f"TYPE_{p.type}")
        if p.type in (0, 1):
            q = "tqrs" if p.type == 0 else "wc_tqrs"
            return f"LBMR {name} {q}={len(getattr(p, q))} tirs={len(p.tirs)}"
        if p.type == 6:
            return f"LBMR {name} qqrs={len(p.qqrs)} qirs={len(p.qirs)}"
        if p.type == 4:
            return f"LBMR {name} tmrs={len(p.tmb.tmrs) if p.tmb else 0}"
        if p.type == 7:
            return f"LBMR {name} {type(p.ext).__name__}"
        return f"LBMR {name}"


def _record_property(name: str) -> property:
    def get(self):
        p = self.getfieldval("packet")
        return getattr(Packet() if p is None else p, name)
    return property(get, doc=f"``packet.{name}`` (empty when the datagram did not decode)")


for _name in RECORD_KEYWORDS:
    setattr(LBMR, _name, _record_property(_name))
del _name

for _port in (LBMR_MC_PORT, LBMRD_PORT):
    bind_bottom_up(UDP, LBMR, dport=_port)
    bind_bottom_up(UDP, LBMR, sport=_port)
del _port
# UDP()/LBMR() defaults to the multicast resolver port both ways (UDP's own
# default sport 53 would make the frame dissect as DNS).
bind_top_down(UDP, LBMR, sport=LBMR_MC_PORT, dport=LBMR_MC_PORT)
