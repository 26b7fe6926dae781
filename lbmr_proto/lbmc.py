"""LBMC, UM's message format (the messages of LBT-TCP, LBT-RU and LBT-RM
data streams and of unicast immediate messages), sans-IO.

Layout, all integers big-endian (network byte order), as Wireshark's
``packet-lbmc.c`` and ``packet-lbttcp.c`` read it:

* a message starts with ``ver_type`` u8 (version in the high nibble, 0;
  message type in the low nibble), ``next_hdr`` u8 (the type of the first
  header of the chain) and ``msglen`` u16 (the whole message in bytes,
  these 4 bytes included);
* the data kinds -- MESSAGE (type 0), PRORX (2, proactive retransmission)
  and RETRANS (0x0A) -- add ``tidx`` u32 (the topic index within the
  transport session) and ``sqn`` u32 (the topic's message sequence number):
  a 12-byte header. CONTROL (8) and EOT (1) have the 4-byte header only;
* then a chain of headers, each ``next_hdr`` u8 (the type of the header
  after it), ``hdr_len`` u8 (this header in bytes, these two included) and a
  body, until a ``next_hdr`` of DATA (0x00; the rest of the message is the
  payload) or NONE (0xFF; nothing follows: control messages have no payload.
  The dissector ignores bytes after NONE; :func:`decode` rejects them).

Headers whose type this module knows are typed values with a fixed length
(:data:`HEADER_TYPES`); any other header is kept byte for byte
(:class:`UnknownHeader`), so ``encode(decode(b)) == b`` for every message
:func:`decode` accepts. A malformed message raises :class:`LbmcDecodeError`
(only that), with the byte offset of the problem.

On TCP (LBT-TCP sources, UIM connections) a stream is nothing but
consecutive messages framed by ``msglen``: :class:`StreamFramer` cuts one
into whole messages, buffering at most one incomplete message (< 64 KiB).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import ClassVar

from ._wire import Fixed, fixed
from .errors import LBMREncodeError, WireDecodeError

__all__ = [
    "MESSAGE", "EOT", "PRORX", "CONTROL", "RETRANS", "DATA_KINDS", "CONTROL_KINDS", "KIND_NAMES",
    "NHDR_DATA", "NHDR_NONE", "DATA_HEADER", "CONTROL_HEADER", "MAX_MSGLEN",
    "LbmcDecodeError", "LbmcHeader", "UnknownHeader", "FragmentHeader", "RequestHeader",
    "SsfInitHeader", "SsfCreqHeader", "UmeRxReqHeader", "UmeLateJoinInfoHeader", "DomainHeader", "OriginDomainHeader",
    "StreamHeader", "LateJoinRequestHeader", "DestinationHeader", "TcpSidHeader",
    "HEADER_TYPES", "Message", "decode", "encode", "data_message",
]

MESSAGE, EOT, PRORX, CONTROL, RETRANS = 0x0, 0x1, 0x2, 0x8, 0xA
DATA_KINDS = frozenset({MESSAGE, PRORX, RETRANS})  # 12-byte header: tidx and sqn
CONTROL_KINDS = frozenset({CONTROL, EOT})  # 4-byte header
KIND_NAMES = {MESSAGE: "MESSAGE", EOT: "EOT", PRORX: "PRORX", CONTROL: "CONTROL", RETRANS: "RETRANS"}
NHDR_DATA, NHDR_NONE = 0x00, 0xFF
VERSION = 0
DATA_HEADER = struct.Struct("!BBHII")  # ver_type, next_hdr, msglen, tidx, sqn
CONTROL_HEADER = struct.Struct("!BBH")  # ver_type, next_hdr, msglen
MAX_MSGLEN = 0xFFFF
MIN_HDR_LEN = 4  # next_hdr, hdr_len and at least a 16-bit field: every header UM defines


class LbmcDecodeError(WireDecodeError):
    """Bytes that are not one well-formed LBMC message (or a stream that is
    not a sequence of them). ``offset``: byte offset into the message (into
    the stream for :class:`StreamFramer`). The only exception :func:`decode`
    and :meth:`StreamFramer.feed` raise."""


# ------------------------------------------------------------------ headers


class LbmcHeader(Fixed):
    """Base of the typed headers; ``CODE`` is the header type (the value of
    the previous ``next_hdr``). Fields follow ``next_hdr`` and ``hdr_len``,
    which :func:`encode` writes."""

    __slots__ = ()
    CODE: ClassVar[int]
    _HEAD = "BB"

    def encode(self, next_hdr: int) -> bytes:
        """This header's bytes, followed by a header of type ``next_hdr``."""
        return self.pack_body(next_hdr, self.SIZE)


@fixed
class FragmentHeader(LbmcHeader):
    """0x01 FRAG, 16 bytes: one fragment of a message larger than a
    datagram. ``first_sqn``: sequence number of the first fragment;
    ``offset``/``length``: this fragment's place in, and the length of, the
    whole message in bytes. ``flags`` 0x8000: ignore."""

    CODE = 0x01
    _FMT = "HIII"
    flags: int = 0
    first_sqn: int = 0
    offset: int = 0
    length: int = 0


@fixed
class RequestHeader(LbmcHeader):
    """0x04 REQUEST, 16 bytes: the message is a request; the responder
    connects to (``ipaddr``, ``port``), the requester's request listener,
    over ``transport`` (0: TCP) and answers request ``qidx``. ``flags`` is
    u8 (0x80: ignore)."""

    CODE = 0x04
    _FMT = "BBIHH4s"
    _IPS = ("ipaddr",)
    flags: int = 0
    transport: int = 0
    qidx: int = 0
    port: int = 0
    reserved: int = 0
    ipaddr: str = "0.0.0.0"


@fixed
class SsfInitHeader(LbmcHeader):
    """0x10 SSF_INIT, 20 bytes: source-side filtering initialisation.
    ``flags`` u8 (0x80 ignore, 0x40 default inclusions, 0x20 default
    exclusions) comes before ``transport`` u8 on the wire."""

    CODE = 0x10
    _FMT = "BBIIHH4s"
    _IPS = ("ssf_ip",)
    flags: int = 0
    transport: int = 0
    transport_idx: int = 0
    client_idx: int = 0
    ssf_port: int = 0
    reserved: int = 0
    ssf_ip: str = "0.0.0.0"


@fixed
class SsfCreqHeader(LbmcHeader):
    """0x11 SSF_CREQ, 16 bytes: source-side filtering control request
    (``mode``: include or exclude topic ``topic_idx`` for client
    ``client_idx``). ``flags`` u8 (0x80: ignore)."""

    CODE = 0x11
    _FMT = "BBIII"
    flags: int = 0
    mode: int = 0
    transport_idx: int = 0
    topic_idx: int = 0
    client_idx: int = 0


@fixed
class UmeRxReqHeader(LbmcHeader):
    """0x15 UME_RXREQ, 28 bytes: retransmission request for ``seqnum``; the
    retransmission goes to (``rx_ip``, ``rx_port``). ``flags`` u16 (0x8000
    ignore, 0x4000 T; the low byte is a marker)."""

    CODE = 0x15
    _FMT = "HIIIIHH4s"
    _IPS = ("rx_ip",)
    flags: int = 0
    request_idx: int = 0
    transport_idx: int = 0
    id_2: int = 0
    seqnum: int = 0
    rx_port: int = 0
    reserved: int = 0
    rx_ip: str = "0.0.0.0"


@fixed
class UmeLateJoinInfoHeader(LbmcHeader):
    """0x1E UME_LJ_INFO, 16 bytes: late-join information, a source's answer
    to a late-join information request (:class:`LateJoinRequestHeader`) whose
    ``request_idx`` it repeats as ``qidx``: the retained messages it has,
    sequence numbers ``low_seqnum`` to ``high_seqnum``. ``flags`` u16
    (0x8000: ignore)."""

    CODE = 0x1E
    _FMT = "HIII"
    flags: int = 0
    low_seqnum: int = 0
    high_seqnum: int = 0
    qidx: int = 0


@fixed
class DomainHeader(LbmcHeader):
    """0x43 DOMAIN, 8 bytes: a domain id (``flags`` 0x8000 ignore, 0x4000 active)."""

    CODE = 0x43
    _FMT = "HI"
    flags: int = 0
    domain_id: int = 0


@fixed
class OriginDomainHeader(LbmcHeader):
    """0x4A ODOMAIN, 8 bytes: the originating domain id (``flags`` 0x8000: ignore)."""

    CODE = 0x4A
    _FMT = "HI"
    flags: int = 0
    domain_id: int = 0


@fixed
class StreamHeader(LbmcHeader):
    """0x4B STREAM, 20 bytes: unicast immediate messages as a stream:
    ``stream_id``, the stream's ``sqn`` and the sending context's 8-byte
    instance ``ctxinst``."""

    CODE = 0x4B
    _FMT = "HII8s"
    flags: int = 0
    stream_id: int = 0
    sqn: int = 0
    ctxinst: bytes = bytes(8)


@fixed
class LateJoinRequestHeader(LbmcHeader):
    """0x4E LJI_REQ, 36 bytes: late-join information request; the answer
    goes to (``req_ip``, ``req_port``). ``flags`` u16 (0x8000 ignore, 0x1 L,
    0x2 M, 0x4 O)."""

    CODE = 0x4E
    _FMT = "HIII4sHHIII"
    _IPS = ("req_ip",)
    flags: int = 0
    request_idx: int = 0
    transport_idx: int = 0
    topic_idx: int = 0
    req_ip: str = "0.0.0.0"
    req_port: int = 0
    reserved: int = 0
    tx_low_sqn: int = 0
    rx_req_max: int = 0
    rx_req_outstanding_max: int = 0


@fixed
class DestinationHeader(LbmcHeader):
    """0x64 DESTINATION, 28 bytes: the domain-qualified addresses of a
    unicast immediate message's destination (``domain_id``, ``ipaddr``,
    ``port``) and origin (``orig_*``); ``hops_taken`` counts routers."""

    CODE = 0x64
    _FMT = "HI4sHHI4sHH"
    _IPS = ("ipaddr", "orig_ipaddr")
    flags: int = 0
    domain_id: int = 0
    ipaddr: str = "0.0.0.0"
    port: int = 0
    hops_taken: int = 0
    orig_domain_id: int = 0
    orig_ipaddr: str = "0.0.0.0"
    orig_port: int = 0
    reserved: int = 0


@fixed
class TcpSidHeader(LbmcHeader):
    """0x6B TCP_SID, 8 bytes: binds a TCP connection to the TCP transport
    session ``session_id`` (``flags`` 0x8000: ignore)."""

    CODE = 0x6B
    _FMT = "HI"
    flags: int = 0
    session_id: int = 0


@dataclass(frozen=True, slots=True)
class UnknownHeader:
    """A header of a type this module has no class for: ``code`` and the
    ``data`` after ``next_hdr``/``hdr_len`` (at least 2 bytes), kept byte for byte."""

    code: int
    data: bytes = b"\0\0"

    def encode(self, next_hdr: int) -> bytes:
        if self.code in HEADER_TYPES or self.code in (NHDR_DATA, NHDR_NONE) or not 0 <= self.code <= 0xFF:
            raise LBMREncodeError(f"UnknownHeader code {self.code:#x}: a known type, DATA, NONE or not a u8")
        n = 2 + len(self.data)
        if not MIN_HDR_LEN <= n <= 0xFF:
            raise LBMREncodeError(f"UnknownHeader {self.code:#04x}: {n} bytes (4..255)")
        return bytes((next_hdr, n)) + self.data


HEADER_TYPES: dict[int, type[LbmcHeader]] = {
    c.CODE: c for c in (
        FragmentHeader, RequestHeader, SsfInitHeader, SsfCreqHeader, UmeRxReqHeader,
        UmeLateJoinInfoHeader, DomainHeader,
        OriginDomainHeader, StreamHeader, LateJoinRequestHeader, DestinationHeader, TcpSidHeader,
    )
}


def _code(h: LbmcHeader | UnknownHeader) -> int:
    return h.code if isinstance(h, UnknownHeader) else h.CODE


# ------------------------------------------------------------------ message


@dataclass(frozen=True, slots=True)
class Message:
    """One LBMC message.

    ``kind``: MESSAGE, PRORX, RETRANS (data kinds: ``tidx`` and ``sqn``
    are on the wire) or CONTROL, EOT (``tidx`` and ``sqn`` must be 0);
    ``headers``: the chain in wire order; ``end``: how the chain ends,
    :data:`NHDR_DATA` or :data:`NHDR_NONE` (None: DATA for the data kinds,
    NONE for the others); ``payload``: the bytes after the chain.
    """

    kind: int
    tidx: int = 0
    sqn: int = 0
    payload: bytes = b""
    headers: tuple = field(default=())
    end: int | None = None

    def __post_init__(self) -> None:
        if self.end is None:
            object.__setattr__(self, "end", NHDR_DATA if self.kind in DATA_KINDS else NHDR_NONE)
        if not isinstance(self.headers, tuple):
            object.__setattr__(self, "headers", tuple(self.headers))

    def header(self, cls: type):
        """The first header of class ``cls`` in the chain, or None."""
        return next((h for h in self.headers if isinstance(h, cls)), None)


def encode(msg: Message) -> bytes:
    """The bytes of ``msg`` (``msglen`` computed); :class:`~lbmr_proto.LBMREncodeError`
    for a value out of range or a message longer than 65535 bytes."""
    kind = msg.kind
    if kind not in KIND_NAMES:
        raise LBMREncodeError(f"LBMC message type {kind!r} is not one of {sorted(KIND_NAMES)}")
    if msg.end not in (NHDR_DATA, NHDR_NONE):
        raise LBMREncodeError(f"LBMC chain end {msg.end!r}: DATA (0) or NONE (255)")
    if msg.end == NHDR_NONE and msg.payload:
        raise LBMREncodeError("a payload after a chain that ends with NONE (only DATA carries one)")
    codes = [_code(h) for h in msg.headers] + [msg.end]
    chain = b"".join([h.encode(codes[i + 1]) for i, h in enumerate(msg.headers)])
    hlen = DATA_HEADER.size if kind in DATA_KINDS else CONTROL_HEADER.size
    msglen = hlen + len(chain) + len(msg.payload)
    if msglen > MAX_MSGLEN:
        raise LBMREncodeError(f"LBMC message of {msglen} bytes (at most {MAX_MSGLEN})")
    try:
        if kind in DATA_KINDS:
            head = DATA_HEADER.pack(kind, codes[0], msglen, msg.tidx, msg.sqn)
        elif msg.tidx or msg.sqn:
            raise LBMREncodeError(f"{KIND_NAMES[kind]} message with a tidx or sqn (not on the wire)")
        else:
            head = CONTROL_HEADER.pack(kind, codes[0], msglen)
    except struct.error as e:
        raise LBMREncodeError(f"LBMC message header: {e}") from None
    return b"".join((head, chain, msg.payload))


def data_message(tidx: int, sqn: int, payload, *headers) -> bytes:
    """A MESSAGE with ``headers`` and ``payload`` (the common case, encoded
    directly: the simulator sends these at line rate)."""
    if not headers:
        n = DATA_HEADER.size + len(payload)
        if n > MAX_MSGLEN:
            raise LBMREncodeError(f"LBMC message of {n} bytes (at most {MAX_MSGLEN})")
        try:
            return DATA_HEADER.pack(MESSAGE, NHDR_DATA, n, tidx, sqn) + bytes(payload)
        except struct.error as e:
            raise LBMREncodeError(f"LBMC message header: {e}") from None
    return encode(Message(MESSAGE, tidx, sqn, bytes(payload), headers))


def _header_at(data, off: int, code: int, end: int) -> tuple[LbmcHeader | UnknownHeader, int]:
    """The header of type ``code`` at ``off`` and the type of the next one."""
    if off + 2 > end:
        raise LbmcDecodeError(off, f"header {code:#04x} announced but the message ends at byte {end}")
    nxt, hlen = data[off], data[off + 1]
    cls = HEADER_TYPES.get(code)
    if cls is not None and hlen != cls.SIZE:
        raise LbmcDecodeError(off + 1, f"{cls.__name__} ({code:#04x}) hdr_len {hlen}, expected {cls.SIZE}")
    if hlen < MIN_HDR_LEN:
        raise LbmcDecodeError(off + 1, f"header {code:#04x} hdr_len {hlen} (at least {MIN_HDR_LEN})")
    if off + hlen > end:
        raise LbmcDecodeError(off + 1, f"header {code:#04x} hdr_len {hlen} runs past msglen {end}")
    if cls is None:
        return UnknownHeader(code, bytes(data[off + 2:off + hlen])), nxt
    return cls.unpack_body(data, off), nxt


def check_start(data, off: int = 0) -> tuple[int, int]:
    """Validate the first 4 bytes of a message at ``off`` (version, type,
    msglen against the type's header size); returns (kind, msglen)."""
    vt, _, msglen = CONTROL_HEADER.unpack_from(data, off)
    if vt >> 4 != VERSION:
        raise LbmcDecodeError(off, f"LBMC version {vt >> 4} (only {VERSION} is known)")
    kind = vt & 0x0F
    if kind not in KIND_NAMES:
        raise LbmcDecodeError(off, f"unknown LBMC message type {kind:#x}")
    hlen = DATA_HEADER.size if kind in DATA_KINDS else CONTROL_HEADER.size
    if msglen < hlen:
        raise LbmcDecodeError(off + 2, f"msglen {msglen} is shorter than the {hlen}-byte "
                                       f"{KIND_NAMES[kind]} header")
    return kind, msglen


def decode(data: bytes | bytearray | memoryview) -> Message:
    """Exactly one LBMC message (``msglen`` must be ``len(data)``)."""
    n = len(data)
    if n < CONTROL_HEADER.size:
        raise LbmcDecodeError(0, f"{n} bytes: shorter than the 4-byte LBMC header")
    kind, msglen = check_start(data)
    if msglen != n:
        raise LbmcDecodeError(2, f"msglen {msglen} but the message has {n} bytes")
    code = data[1]
    if kind in DATA_KINDS:
        _, _, _, tidx, sqn = DATA_HEADER.unpack_from(data)
        off = DATA_HEADER.size
    else:
        tidx = sqn = 0
        off = CONTROL_HEADER.size
    headers = []
    while code != NHDR_DATA and code != NHDR_NONE:
        h, nxt = _header_at(data, off, code, n)
        headers.append(h)
        off += data[off + 1]
        code = nxt
    if code == NHDR_NONE and off < n:
        raise LbmcDecodeError(off, f"{n - off} bytes after a chain that ends with NONE (no payload)")
    return Message(kind, tidx, sqn, bytes(data[off:]), tuple(headers), code)


# ------------------------------------------------------------------ framing
