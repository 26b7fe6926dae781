"""Sans-IO core of the router's peer link (the TCP link between two routers).

Protocol logic only, in the style of h11/wsproto: objects take bytes and the
current time and return events and bytes. Nothing here touches a socket, a
clock, trio or TLS; the I/O shell feeds received bytes to
:meth:`PeerConnection.receive_data`, writes what the connection hands back,
and calls :meth:`PeerConnection.tick` at :meth:`PeerConnection.next_deadline`.
The wire format and the state machine are specified in ``router/PEERLINK.md``;
this module implements exactly that document.

Layers, bottom up:

* frames: one frozen dataclass per frame type (:class:`Interest`,
  :class:`StreamData`, ...), :func:`encode` and :func:`decode`, the registry
  :data:`FRAME_TYPES` (type code -> class) and :class:`FrameReader`, which cuts
  a byte stream into frames and refuses garbage at the first wrong byte;
* :class:`PeerConnection`: handshake, keepalive/RTT, dead-peer detection,
  graceful disconnect and the rules of which frame may be sent when;
* :class:`OutQueue`: the bounded per-peer writer queue (control frames never
  dropped, data frames bounded in bytes).

Per-stream flow control lives in :mod:`router.streams`.

Outgoing bytes, the one rule: every frame the connection produces -- on
:meth:`~PeerConnection.start`, :meth:`~PeerConnection.send`,
:meth:`~PeerConnection.tick` or automatically while receiving (CONNECT_RESPONSE,
CONNECT_OK, KEEPALIVE_ACK, DISCONNECT_OK) -- is appended, in order, to one
outgoing buffer. ``start``, ``send`` and ``tick`` return the whole buffer (and
empty it); after ``receive_data`` call :meth:`~PeerConnection.data_to_send`
(or just the next ``send``/``tick``, which will include those bytes).
"""

from __future__ import annotations

import math
import secrets
import struct
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum, IntEnum, IntFlag
from typing import ClassVar, NamedTuple

__all__ = [
    "MAGIC", "WIRE_VERSION", "PROTOCOL_VERSION", "HEADER_SIZE", "MAX_PAYLOAD", "FLAG_IGNORABLE",
    "FrameType", "ConnectCode", "InterestAction", "PatternType", "StreamKind", "RefuseCode",
    "CloseCode", "Capability", "State",
    "LocalProtocolError", "FrameEncodeError", "FrameDecodeError", "OutQueueOverflow",
    "Frame", "ConnectRequest", "ConnectResponse", "ConnectOk", "Keepalive", "KeepaliveAck",
    "DisconnectRequest", "DisconnectResponse", "DisconnectOk", "Interest", "Advertisement",
    "StreamOpen", "StreamAccept", "StreamRefuse", "StreamData", "StreamCredit", "StreamClose",
    "Datagram", "FRAME_TYPES", "encode", "encode_raw", "decode", "decode_payload", "RawFrame",
    "FrameReader", "Event", "Connected", "DisconnectRequested", "Terminated", "Rejected",
    "Closed", "ConnectionLost", "Timeout", "ProtocolError", "RouterIdentity", "PeerInfo",
    "RttStats", "LinkStats", "PeerConnection", "OutQueue",
]

# --------------------------------------------------------------------------- constants

MAGIC = b"LBRP"
WIRE_VERSION = 1  # the frame-header version byte; changes only if the header changes
PROTOCOL_VERSION = (1, 0)  # (major, minor) carried in the handshake
HEADER = struct.Struct(">4sBBBBI")  # magic, version, type, flags, reserved, payload length
HEADER_SIZE = HEADER.size  # 12
MAX_PAYLOAD = 1 << 20  # 1 MiB
FLAG_IGNORABLE = 0x01  # header flag: a receiver that does not know the type may skip the frame
ADVERT_WITHDRAW = 0x01  # ADVERTISEMENT flags bit
U64 = (1 << 64) - 1


class FrameType(IntEnum):
    CONNECT_REQUEST = 0x01
    CONNECT_RESPONSE = 0x02
    CONNECT_OK = 0x03
    KEEPALIVE = 0x04
    KEEPALIVE_ACK = 0x05
    DISCONNECT_REQUEST = 0x06
    DISCONNECT_RESPONSE = 0x07
    DISCONNECT_OK = 0x08
    INTEREST = 0x10
    ADVERTISEMENT = 0x11
    STREAM_OPEN = 0x20
    STREAM_ACCEPT = 0x21
    STREAM_REFUSE = 0x22
    STREAM_DATA = 0x23
    STREAM_CREDIT = 0x24
    STREAM_CLOSE = 0x25
    DATAGRAM = 0x26


class ConnectCode(IntEnum):
    """CONNECT_RESPONSE code; any value other than ACCEPTED is a refusal."""

    ACCEPTED = 0
    REFUSED = 1  # local policy (the accept() callback) said no
    VERSION_MISMATCH = 2  # different protocol major version
    DOMAIN_CONFLICT = 3  # both routers serve the same domain id
    DUPLICATE_NAME = 4  # both routers have the same name (or a router connected to itself)
    BAD_REQUEST = 5  # a malformed identity (empty name, domain id 0, duplicated domain ids)


class InterestAction(IntEnum):
    ADD = 1
    REFRESH = 2
    CANCEL = 3


class PatternType(IntEnum):
    """INTEREST topic kind; 1 and 2 are the LBMR wildcard pattern types."""

    TOPIC = 0  # an exact topic name
    PCRE = 1
    REGEX = 2


class StreamKind(IntEnum):
    """STREAM_OPEN kind; the values are the LBMR TIR transport codes."""

    TCP = 0x00
    LBTRU = 0x01


class RefuseCode(IntEnum):
    REFUSED = 1
    UNKNOWN_ADVERT = 2
    UNSUPPORTED_KIND = 3
    TOO_MANY_STREAMS = 4
    BAD_STREAM_ID = 5


class CloseCode(IntEnum):
    NORMAL = 0
    CANCELLED = 1
    FLOW_CONTROL = 2
    INTERNAL = 3


class Capability(IntFlag):
    """Capability bits of the handshake; a feature is used only if both sides set its bit."""

    STREAMS = 0x01  # STREAM_* frames (TCP transport relay)
    DATAGRAMS = 0x02  # DATAGRAM frames (LBT-RU relay)


DEFAULT_CAPABILITIES = int(Capability.STREAMS | Capability.DATAGRAMS)


class State(Enum):
    IDLE = "IDLE"
    CONNECTING = "CONNECTING"
    CONNECTED = "CONNECTED"
    DISCONNECTING = "DISCONNECTING"
    CLOSED = "CLOSED"


# --------------------------------------------------------------------------- errors


class LocalProtocolError(Exception):
    """The caller asked for something the protocol does not allow now (a bug in the caller)."""


class FrameEncodeError(LocalProtocolError, ValueError):
    """A frame cannot be encoded: a value out of range, a string too long, a payload too big."""


class FrameDecodeError(ValueError):
    """Received bytes are not a valid frame. Inside :class:`PeerConnection` this becomes a
    :class:`ProtocolError` event; only :func:`decode` and :class:`FrameReader` raise it."""


class OutQueueOverflow(Exception):
    """More control frames are queued for a peer than :class:`OutQueue` allows: the peer is
    hopelessly behind and the link should be closed."""


# --------------------------------------------------------------------------- payload codec

_U8, _U16, _U32, _U64 = (struct.Struct(f) for f in (">B", ">H", ">I", ">Q"))


class _Reader:
    __slots__ = ("buf", "pos", "what")

    def __init__(self, buf: bytes, what: str) -> None:
        self.buf, self.pos, self.what = buf, 0, what

    def _take(self, n: int) -> int:
        p = self.pos
        if p + n > len(self.buf):
            raise FrameDecodeError(
                f"{self.what} payload truncated: needs {p + n - len(self.buf)} more byte(s) at offset {p}")
        self.pos = p + n
        return p

    def u8(self) -> int:
        return self.buf[self._take(1)]

    def u16(self) -> int:
        return _U16.unpack_from(self.buf, self._take(2))[0]

    def u32(self) -> int:
        return _U32.unpack_from(self.buf, self._take(4))[0]

    def u64(self) -> int:
        return _U64.unpack_from(self.buf, self._take(8))[0]

    def raw(self, n: int) -> bytes:
        p = self._take(n)
        return bytes(self.buf[p:p + n])

    def string(self) -> str:
        return self.raw(self.u16()).decode("utf-8", "surrogateescape")

    def rest(self) -> bytes:
        p, self.pos = self.pos, len(self.buf)
        return bytes(self.buf[p:])

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise FrameDecodeError(
                f"{self.what} payload has {len(self.buf) - self.pos} unexpected trailing byte(s)")


def _str(s: str, what: str) -> bytes:
    try:
        b = s.encode("utf-8", "surrogateescape")
    except (UnicodeEncodeError, AttributeError) as e:
        raise FrameEncodeError(f"{what}: cannot encode {s!r} as UTF-8: {e}") from None
    if len(b) > 0xFFFF:
        raise FrameEncodeError(f"{what} is {len(b)} bytes long (at most 65535)")
    return _U16.pack(len(b)) + b


def _pack(fmt: str, *values, what: str) -> bytes:
    try:
        return struct.pack(fmt, *values)
    except struct.error as e:
        raise FrameEncodeError(f"{what}: value out of range in {values!r}: {e}") from None


def _enum(cls, value: int, what: str):
    try:
        return cls(value)
    except ValueError:
        raise FrameDecodeError(f"{what}: unknown {cls.__name__} value {value}") from None


# --------------------------------------------------------------------------- frames


class Frame(ABC):
    """Base of the frame dataclasses. ``TYPE`` is the type code; ``payload()`` builds the
    payload bytes; ``_parse`` reads one from a payload."""

    __slots__ = ()
    TYPE: ClassVar[FrameType]
    _EXTENSIBLE: ClassVar[bool] = False  # trailing payload bytes allowed (handshake frames)

    @abstractmethod
    def payload(self) -> bytes:
        """The frame's payload bytes (everything after the 12-byte header)."""

    @classmethod
    @abstractmethod
    def _parse(cls, r: _Reader) -> Frame:
        """Read one frame of this type from its payload."""

    def wire_size(self) -> int:
        """Size of the encoded frame, header included."""
        return HEADER_SIZE + len(self.payload())


FRAME_TYPES: dict[int, type[Frame]] = {}


def _frame(cls):
    FRAME_TYPES[int(cls.TYPE)] = cls
    return cls


def _domains(domains: Iterable[int], what: str) -> bytes:
    ds = tuple(domains)
    if len(ds) > 0xFFFF:
        raise FrameEncodeError(f"{what}: {len(ds)} domain ids (at most 65535)")
    return _pack(f">H{len(ds)}I", len(ds), *ds, what=what)


def _read_domains(r: _Reader) -> tuple[int, ...]:
    n = r.u16()
    return tuple(r.u32() for _ in range(n))


@_frame
@dataclass(frozen=True, slots=True)
class ConnectRequest(Frame):
    """Initiator's hello. ``version`` is (major, minor)."""

    TYPE: ClassVar[FrameType] = FrameType.CONNECT_REQUEST
    _EXTENSIBLE: ClassVar[bool] = True
    name: str
    domains: tuple[int, ...]
    nonce: int
    capabilities: int = DEFAULT_CAPABILITIES
    version: tuple[int, int] = PROTOCOL_VERSION

    def payload(self) -> bytes:
        w = "CONNECT_REQUEST"
        return (_pack(">HHQI", *self.version, self.nonce, self.capabilities, what=w)
                + _str(self.name, "router name") + _domains(self.domains, w))

    @classmethod
    def _parse(cls, r: _Reader) -> ConnectRequest:
        major, minor, nonce, caps = r.u16(), r.u16(), r.u64(), r.u32()
        return cls(r.string(), _read_domains(r), nonce, caps, (major, minor))


@_frame
@dataclass(frozen=True, slots=True)
class ConnectResponse(Frame):
    """Acceptor's answer: its own hello plus ``code`` (0 = accepted) and ``reason``."""

    TYPE: ClassVar[FrameType] = FrameType.CONNECT_RESPONSE
    _EXTENSIBLE: ClassVar[bool] = True
    name: str
    domains: tuple[int, ...]
    nonce: int
    code: int = ConnectCode.ACCEPTED
    reason: str = ""
    capabilities: int = DEFAULT_CAPABILITIES
    version: tuple[int, int] = PROTOCOL_VERSION

    @property
    def accepted(self) -> bool:
        return self.code == ConnectCode.ACCEPTED

    def payload(self) -> bytes:
        w = "CONNECT_RESPONSE"
        return (_pack(">HHH", *self.version, self.code, what=w) + _str(self.reason, "reason")
                + _pack(">QI", self.nonce, self.capabilities, what=w)
                + _str(self.name, "router name") + _domains(self.domains, w))

    @classmethod
    def _parse(cls, r: _Reader) -> ConnectResponse:
        major, minor, code = r.u16(), r.u16(), r.u16()
        reason = r.string()
        nonce, caps = r.u64(), r.u32()
        return cls(r.string(), _read_domains(r), nonce, code, reason, caps, (major, minor))


@dataclass(frozen=True, slots=True)
class _Empty(Frame):
    def payload(self) -> bytes:
        return b""

    @classmethod
    def _parse(cls, r: _Reader):
        return cls()


@_frame
@dataclass(frozen=True, slots=True)
class ConnectOk(_Empty):
    TYPE: ClassVar[FrameType] = FrameType.CONNECT_OK


@dataclass(frozen=True, slots=True)
class _SeqStamp(Frame):
    seq: int
    timestamp_ns: int

    def payload(self) -> bytes:
        return _pack(">QQ", self.seq, self.timestamp_ns, what=self.TYPE.name)

    @classmethod
    def _parse(cls, r: _Reader):
        return cls(r.u64(), r.u64())


@_frame
@dataclass(frozen=True, slots=True)
class Keepalive(_SeqStamp):
    """``timestamp_ns``: the sender's clock in ns (any epoch; only the sender interprets it)."""

    TYPE: ClassVar[FrameType] = FrameType.KEEPALIVE


@_frame
@dataclass(frozen=True, slots=True)
class KeepaliveAck(_SeqStamp):
    """Echoes a KEEPALIVE's ``seq`` and ``timestamp_ns`` unchanged."""

    TYPE: ClassVar[FrameType] = FrameType.KEEPALIVE_ACK


@_frame
@dataclass(frozen=True, slots=True)
class DisconnectRequest(Frame):
    TYPE: ClassVar[FrameType] = FrameType.DISCONNECT_REQUEST
    reason: str = ""

    def payload(self) -> bytes:
        return _str(self.reason, "reason")

    @classmethod
    def _parse(cls, r: _Reader):
        return cls(r.string())


@_frame
@dataclass(frozen=True, slots=True)
class DisconnectResponse(_Empty):
    TYPE: ClassVar[FrameType] = FrameType.DISCONNECT_RESPONSE


@_frame
@dataclass(frozen=True, slots=True)
class DisconnectOk(_Empty):
    TYPE: ClassVar[FrameType] = FrameType.DISCONNECT_OK


@_frame
@dataclass(frozen=True, slots=True)
class Interest(Frame):
    """Receivers in ``domain_id`` want ``topic`` (an exact name, or a PCRE/regex pattern)."""

    TYPE: ClassVar[FrameType] = FrameType.INTEREST
    action: InterestAction
    topic: str
    domain_id: int
    pattern_type: PatternType = PatternType.TOPIC

    def payload(self) -> bytes:
        return (_pack(">BBI", self.action, self.pattern_type, self.domain_id, what="INTEREST")
                + _str(self.topic, "topic"))

    @classmethod
    def _parse(cls, r: _Reader):
        action = _enum(InterestAction, r.u8(), "INTEREST")
        ptype = _enum(PatternType, r.u8(), "INTEREST")
        domain = r.u32()
        return cls(action, r.string(), domain, ptype)


@_frame
@dataclass(frozen=True, slots=True)
class Advertisement(Frame):
    """A source of ``topic`` exists in ``origin_domain`` (``withdraw``: it is gone).

    ``transport`` is the LBMR TIR transport code; ``advert_id`` names the advertisement on this
    link (STREAM_OPEN refers to it); ``hop_count`` counts routers already crossed."""

    TYPE: ClassVar[FrameType] = FrameType.ADVERTISEMENT
    topic: str
    origin_domain: int
    otid: bytes
    transport: int
    advert_id: int
    withdraw: bool = False
    hop_count: int = 0

    def payload(self) -> bytes:
        if not isinstance(self.otid, bytes | bytearray) or len(self.otid) != 32:
            raise FrameEncodeError(f"ADVERTISEMENT: OTID must be 32 bytes, not {self.otid!r}")
        flags = ADVERT_WITHDRAW if self.withdraw else 0
        return (_pack(">IIBBH", self.origin_domain, self.advert_id, self.transport, flags,
                      self.hop_count, what="ADVERTISEMENT")
                + bytes(self.otid) + _str(self.topic, "topic"))

    @classmethod
    def _parse(cls, r: _Reader):
        domain, advert_id, transport, flags, hops = r.u32(), r.u32(), r.u8(), r.u8(), r.u16()
        otid = r.raw(32)
        return cls(r.string(), domain, otid, transport, advert_id, bool(flags & ADVERT_WITHDRAW),
                   hops)


@_frame
@dataclass(frozen=True, slots=True)
class StreamOpen(Frame):
    """Open stream ``stream_id`` for ``advert_id``; ``initial_credit`` is how many data bytes
    the opener lets the peer send on it before the first STREAM_CREDIT."""

    TYPE: ClassVar[FrameType] = FrameType.STREAM_OPEN
    stream_id: int
    advert_id: int
    kind: int = StreamKind.TCP
    initial_credit: int = 0

    def payload(self) -> bytes:
        return _pack(">IIIB", self.stream_id, self.advert_id, self.initial_credit, self.kind,
                     what="STREAM_OPEN")

    @classmethod
    def _parse(cls, r: _Reader):
        sid, advert, credit, kind = r.u32(), r.u32(), r.u32(), r.u8()
        try:
            kind = StreamKind(kind)
        except ValueError:
            pass  # unknown kinds decode fine; the stream table refuses them
        return cls(sid, advert, kind, credit)


@_frame
@dataclass(frozen=True, slots=True)
class StreamAccept(Frame):
    TYPE: ClassVar[FrameType] = FrameType.STREAM_ACCEPT
    stream_id: int
    initial_credit: int = 0

    def payload(self) -> bytes:
        return _pack(">II", self.stream_id, self.initial_credit, what="STREAM_ACCEPT")

    @classmethod
    def _parse(cls, r: _Reader):
        return cls(r.u32(), r.u32())


@_frame
@dataclass(frozen=True, slots=True)
class StreamRefuse(Frame):
    TYPE: ClassVar[FrameType] = FrameType.STREAM_REFUSE
    stream_id: int
    code: int = RefuseCode.REFUSED
    reason: str = ""

    def payload(self) -> bytes:
        return _pack(">IH", self.stream_id, self.code, what="STREAM_REFUSE") + _str(self.reason, "reason")

    @classmethod
    def _parse(cls, r: _Reader):
        return cls(r.u32(), r.u16(), r.string())


@dataclass(frozen=True, slots=True)
class _StreamBytes(Frame):
    stream_id: int
    data: bytes

    def payload(self) -> bytes:
        return _pack(">I", self.stream_id, what=self.TYPE.name) + bytes(self.data)

    def wire_size(self) -> int:
        return HEADER_SIZE + 4 + len(self.data)

    @classmethod
    def _parse(cls, r: _Reader):
        return cls(r.u32(), r.rest())


@_frame
@dataclass(frozen=True, slots=True)
class StreamData(_StreamBytes):
    """Bytes of a stream (counted against the receiver's credit)."""

    TYPE: ClassVar[FrameType] = FrameType.STREAM_DATA


@_frame
@dataclass(frozen=True, slots=True)
class StreamCredit(Frame):
    TYPE: ClassVar[FrameType] = FrameType.STREAM_CREDIT
    stream_id: int
    increment: int

    def payload(self) -> bytes:
        return _pack(">II", self.stream_id, self.increment, what="STREAM_CREDIT")

    @classmethod
    def _parse(cls, r: _Reader):
        return cls(r.u32(), r.u32())


@_frame
@dataclass(frozen=True, slots=True)
class StreamClose(Frame):
    TYPE: ClassVar[FrameType] = FrameType.STREAM_CLOSE
    stream_id: int
    code: int = CloseCode.NORMAL

    def payload(self) -> bytes:
        return _pack(">IH", self.stream_id, self.code, what="STREAM_CLOSE")

    @classmethod
    def _parse(cls, r: _Reader):
        return cls(r.u32(), r.u16())


@_frame
@dataclass(frozen=True, slots=True)
class Datagram(_StreamBytes):
    """One LBT-RU datagram relayed on ``stream_id`` (either direction, no credit)."""

    TYPE: ClassVar[FrameType] = FrameType.DATAGRAM


def encode_raw(type_code: int, payload: bytes = b"", flags: int = 0, *,
               version: int = WIRE_VERSION, max_payload: int = MAX_PAYLOAD) -> bytes:
    """A frame from its parts (also for frame types this module does not know)."""
    if len(payload) > max_payload:
        raise FrameEncodeError(f"payload of {len(payload)} bytes exceeds the limit of {max_payload}")
    try:
        return HEADER.pack(MAGIC, version, type_code, flags, 0, len(payload)) + payload
    except struct.error as e:
        raise FrameEncodeError(f"bad header field: {e}") from None


def encode(frame: Frame, *, max_payload: int = MAX_PAYLOAD) -> bytes:
    """The wire bytes of one frame; :class:`FrameEncodeError` if it cannot be encoded."""
    if not isinstance(frame, Frame) or type(frame) not in FRAME_TYPES.values():
        raise FrameEncodeError(f"not a frame: {frame!r}")
    return encode_raw(frame.TYPE, frame.payload(), max_payload=max_payload)


def decode_payload(type_code: int, payload: bytes) -> Frame:
    """The frame object of a known type from its payload; :class:`FrameDecodeError` if it is
    malformed or the type is unknown."""
    cls = FRAME_TYPES.get(type_code)
    if cls is None:
        raise FrameDecodeError(f"unknown frame type 0x{type_code:02x}")
    r = _Reader(payload, cls.TYPE.name)
    frame = cls._parse(r)
    if not cls._EXTENSIBLE:
        r.end()
    return frame


def decode(data: bytes, *, max_payload: int = MAX_PAYLOAD) -> Frame:
    """Decode exactly one complete frame (header and payload)."""
    reader = FrameReader(max_payload)
    reader.feed(data)
    raw = reader.next_frame()
    if raw is None:
        raise FrameDecodeError(f"incomplete frame ({len(data)} bytes)")
    if reader.buffered:
        raise FrameDecodeError(f"{reader.buffered} byte(s) after the frame")
    return decode_payload(raw.type, raw.payload)


# --------------------------------------------------------------------------- framing


class RawFrame(NamedTuple):
    type: int
    flags: int
    payload: bytes


_HTTP_METHODS = (b"GET ", b"POST", b"PUT ", b"HEAD", b"DELE", b"OPTI", b"PATC", b"CONN",
                 b"TRAC", b"PRI ")


def _garbage_hint(prefix: bytes) -> str:
    if prefix[:1] == b"\x16" and prefix[1:2] in (b"", b"\x03"):
        return "this looks like a TLS handshake: is TLS enabled on one side of the link only?"
    if prefix[:4] in _HTTP_METHODS or (len(prefix) < 4 and any(m.startswith(prefix) for m in _HTTP_METHODS)):
        return "this looks like an HTTP request: is something other than a router connecting?"
    if prefix.startswith(b"SSH-"):
        return "this looks like SSH: is something other than a router connecting?"
    return "the peer does not speak the router peer-link protocol"


class FrameReader:
    """Cuts a byte stream into frames. Refuses a stream at the first byte that cannot start a
    frame (so garbage is refused before a whole header has arrived), an unknown header
    version, and a payload length above ``max_payload``."""

    def __init__(self, max_payload: int = MAX_PAYLOAD) -> None:
        self.max_payload = max_payload
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf) - self._pos

    def header(self) -> tuple[int, int, int] | None:
        """(type, flags, length) of the frame at the head once its header is complete
        (checked like :meth:`next_frame` does), else None."""
        if self.buffered < HEADER_SIZE:
            self._check_magic()
            return None
        _, _, ftype, flags, _, length = self._check_header()
        return ftype, flags, length

    def _check_magic(self) -> None:
        p = self._pos
        n = min(4, len(self._buf) - p)
        got = bytes(self._buf[p:p + n])
        if got != MAGIC[:n]:
            seen = bytes(self._buf[p:p + 16])
            raise FrameDecodeError(
                f"bad magic {seen[:4].hex(' ')} (expected 4c 42 52 50 'LBRP'; first bytes "
                f"{seen!r}): {_garbage_hint(seen)}")

    def _check_header(self):
        self._check_magic()
        h = HEADER.unpack_from(self._buf, self._pos)
        if h[1] != WIRE_VERSION:
            raise FrameDecodeError(
                f"unsupported frame header version {h[1]} (this router speaks {WIRE_VERSION})")
        if h[5] > self.max_payload:
            raise FrameDecodeError(
                f"frame type 0x{h[2]:02x} announces a {h[5]}-byte payload, above the limit of "
                f"{self.max_payload}")
        return h

    def next_frame(self) -> RawFrame | None:
        """The next complete frame, or None if more bytes are needed."""
        if self.buffered < HEADER_SIZE:
            self._check_magic()
            return None
        _, _, ftype, flags, _, length = self._check_header()
        start = self._pos + HEADER_SIZE
        if len(self._buf) - start < length:
            return None
        self._pos = start + length
        return RawFrame(ftype, flags, bytes(self._buf[start:self._pos]))


# --------------------------------------------------------------------------- link events


class Event:
    """Base of the events :class:`PeerConnection` returns that are not frames."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class RouterIdentity:
    """Who this router is, as told to peers in the handshake."""

    name: str
    domains: tuple[int, ...] = ()
    capabilities: int = DEFAULT_CAPABILITIES

    def __post_init__(self) -> None:
        object.__setattr__(self, "domains", tuple(self.domains))


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """The peer's side of the handshake (what ``accept`` callbacks and :class:`Connected` see)."""

    name: str
    domains: tuple[int, ...]
    nonce: int
    capabilities: int
    version: tuple[int, int]


@dataclass(frozen=True, slots=True)
class Connected(Event):
    """The handshake completed; application frames may flow. ``capabilities`` is the
    negotiated set (bits both sides announced)."""

    peer: PeerInfo
    capabilities: int


@dataclass(frozen=True, slots=True)
class DisconnectRequested(Event):
    """The peer asked to disconnect. Send what is still to be sent, then
    ``send(DisconnectResponse())``; after that only STREAM_CREDIT/CLOSE/REFUSE may be sent."""

    reason: str


@dataclass(frozen=True, slots=True)
class Terminated(Event):
    """Base of the events after which the state is CLOSED: write :meth:`data_to_send`
    (non-empty only after Rejected-by-us and Closed), then close the socket."""

    reason: str


@dataclass(frozen=True, slots=True)
class Rejected(Terminated):
    """The handshake was refused -- by the peer (``by_peer``) or by us."""

    code: int = ConnectCode.REFUSED
    by_peer: bool = True


@dataclass(frozen=True, slots=True)
class Closed(Terminated):
    """The graceful disconnect handshake completed. ``initiated_by``: local, peer or both."""

    initiated_by: str = "local"


@dataclass(frozen=True, slots=True)
class ConnectionLost(Terminated):
    """The peer closed the TCP connection (``receive_data(b"")``) before a graceful close."""


@dataclass(frozen=True, slots=True)
class Timeout(Terminated):
    """``phase``: "handshake", "keepalive" (nothing received for dead_after) or "disconnect"."""

    phase: str = "keepalive"


@dataclass(frozen=True, slots=True)
class ProtocolError(Terminated):
    """The peer broke the protocol (garbage, a malformed or unexpected frame)."""


@dataclass
class RttStats:
    """Round-trip times (seconds) measured from KEEPALIVE/KEEPALIVE_ACK pairs."""

    count: int = 0
    last: float | None = None
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    last_at: float | None = None  # `now` when the last sample was taken

    def add(self, rtt: float, now: float) -> None:
        self.count += 1
        self.last, self.last_at = rtt, now
        self.min = rtt if self.min is None else min(self.min, rtt)
        self.max = rtt if self.max is None else max(self.max, rtt)
        self.mean = rtt if self.mean is None else self.mean + (rtt - self.mean) / self.count


@dataclass
class LinkStats:
    frames_sent: int = 0
    bytes_sent: int = 0
    frames_received: int = 0
    bytes_received: int = 0
    keepalives_sent: int = 0
    keepalives_answered: int = 0
    unmatched_acks: int = 0  # KEEPALIVE_ACKs that echo nothing we sent (ignored)
    ignored_frames: int = 0  # unknown frame types flagged ignorable
    by_type_received: dict[str, int] = field(default_factory=dict)


# --------------------------------------------------------------------------- connection

# frames the application passes to send(); the rest are produced by the connection itself
_APP_FRAMES = (Interest, Advertisement, StreamOpen, StreamAccept, StreamRefuse, StreamData,
               StreamCredit, StreamClose, Datagram)
# what a side that is "done sending" (it sent DISCONNECT_REQUEST or DISCONNECT_RESPONSE) may
# still send: frames that serve the data it is still receiving
_RECEIVE_SIDE = (StreamCredit, StreamClose, StreamRefuse)
# frames that may only be used when both sides announced the capability
_NEEDS_CAPABILITY = {cls: Capability.STREAMS for cls in (
    StreamOpen, StreamAccept, StreamRefuse, StreamData, StreamCredit, StreamClose)}
_NEEDS_CAPABILITY[Datagram] = Capability.DATAGRAMS

AcceptFn = Callable[[PeerInfo], tuple[bool, str]]


class PeerConnection:
    """One peer-link TCP connection, either side. See the module doc for the byte rule.

    ``accept(peer_info) -> (ok, reason)`` is consulted (after the built-in checks: protocol
    major version, overlapping or invalid domain ids, same router name) by the acceptor
    before it answers CONNECT_REQUEST, and by the initiator on the CONNECT_RESPONSE.
    Times are seconds on any monotonic clock; ``keepalive_interval=0`` disables keepalives
    and ``dead_after=0`` disables dead-peer detection.
    """

    def __init__(self, role: str, identity: RouterIdentity, *, accept: AcceptFn | None = None,
                 keepalive_interval: float = 5.0, dead_after: float = 15.0,
                 handshake_timeout: float = 5.0, disconnect_timeout: float = 5.0,
                 max_payload: int = MAX_PAYLOAD, nonce: int | None = None) -> None:
        if role not in ("initiator", "acceptor"):
            raise ValueError(f"role must be 'initiator' or 'acceptor', not {role!r}")
        self.role = role
        self.identity = identity
        self.accept_fn = accept
        self.keepalive_interval = keepalive_interval
        self.dead_after = dead_after
        self.handshake_timeout = handshake_timeout
        self.disconnect_timeout = disconnect_timeout
        self.max_payload = max_payload
        self.nonce = secrets.randbits(64) if nonce is None else nonce
        self.state = State.IDLE
        self.peer: PeerInfo | None = None
        self.capabilities = 0  # negotiated, once connected
        self.rtt = RttStats()
        self.stats = LinkStats()
        self.close_reason: str | None = None
        self._reader = FrameReader(max_payload)
        self._out = bytearray()
        self._last_sent = 0.0
        self._last_recv = 0.0
        self._hs_deadline = math.inf
        self._ka_seq = 0
        self._ka_outstanding: dict[int, tuple[float, int]] = {}
        # graceful disconnect: two independent request/response/ok exchanges
        self._req_sent = False  # we sent DISCONNECT_REQUEST
        self._req_done = False  # ... got DISCONNECT_RESPONSE, sent DISCONNECT_OK
        self._req_deadline = math.inf
        self._req_reason = ""
        self._peer_req = False  # the peer sent DISCONNECT_REQUEST
        self._resp_sent = False  # ... we sent DISCONNECT_RESPONSE
        self._peer_done = False  # ... got DISCONNECT_OK
        self._resp_deadline = math.inf
        self._peer_reason = ""

    # ---------------------------------------------------------------- public API

    def __repr__(self) -> str:
        peer = self.peer.name if self.peer else "?"
        return f"<PeerConnection {self.role} {self.identity.name}->{peer} {self.state.value}>"

    def start(self, now: float) -> bytes:
        """Begin the handshake: the initiator's CONNECT_REQUEST (the acceptor gets b"" and its
        handshake timer starts). ``receive_data`` in IDLE starts implicitly."""
        if self.state is not State.IDLE:
            raise LocalProtocolError(f"start() in state {self.state.value}")
        self.state = State.CONNECTING
        self._hs_deadline = now + self.handshake_timeout
        self._last_recv = now
        if self.role == "initiator":
            self._emit(ConnectRequest(self.identity.name, self.identity.domains, self.nonce,
                                      self.identity.capabilities), now)
        return self.data_to_send()

    def data_to_send(self) -> bytes:
        """Everything produced so far and not yet handed out (then empty)."""
        out = bytes(self._out)
        self._out.clear()
        return out

    def send(self, frame: Frame, now: float) -> bytes:
        """Encode an application frame (or DisconnectRequest / DisconnectResponse) and return
        all pending outgoing bytes. :class:`LocalProtocolError` if not allowed now."""
        self._check_send(frame)
        self._emit(frame, now)
        if isinstance(frame, DisconnectRequest):
            self._req_sent, self._req_reason = True, frame.reason
            self._req_deadline = now + self.disconnect_timeout
            self.state = State.DISCONNECTING
        elif isinstance(frame, DisconnectResponse):
            self._resp_sent = True
            self._resp_deadline = now + self.disconnect_timeout
        return self.data_to_send()

    def can_send(self, frame: Frame) -> bool:
        try:
            self._check_send(frame)
        except LocalProtocolError:
            return False
        return True

    def receive_data(self, data: bytes, now: float) -> list[Frame | Event]:
        """Feed received bytes (``b""`` = the peer closed its side). Returns application
        frames and link events in order; never raises for anything the peer sends."""
        if self.state is State.CLOSED:
            return []
        if self.state is State.IDLE:
            self.start(now)
        events: list[Frame | Event] = []
        if not data:
            partial = " in the middle of a frame" if self._reader.buffered else ""
            self._terminate(events, ConnectionLost(
                f"peer closed the connection{partial} (state {self.state.value})"))
            return events
        self.stats.bytes_received += len(data)
        self._reader.feed(data)
        try:
            while self.state is not State.CLOSED:
                head = self._reader.header()
                if head is not None:
                    self._check_receive_type(head[0], head[1])
                raw = self._reader.next_frame()
                if raw is None:
                    break
                self._handle(raw, now, events)
        except FrameDecodeError as e:
            self._terminate(events, ProtocolError(str(e)))
        return events

    def tick(self, now: float) -> tuple[bytes, list[Event]]:
        """Run the timers: send a KEEPALIVE when nothing was sent for keepalive_interval;
        end with :class:`Timeout` when nothing was received for dead_after or the handshake
        or disconnect did not complete in time. Returns (pending bytes, events)."""
        events: list[Event] = []
        st = self.state
        if st is State.CONNECTING:
            if now >= self._hs_deadline:
                self._terminate(events, Timeout(
                    f"handshake did not complete within {self.handshake_timeout:g} s", "handshake"))
        elif st in (State.CONNECTED, State.DISCONNECTING):
            if self.dead_after > 0 and now >= self._last_recv + self.dead_after:
                self._terminate(events, Timeout(
                    f"nothing received from the peer for {now - self._last_recv:g} s "
                    f"(dead after {self.dead_after:g} s)", "keepalive"))
            elif now >= min(self._req_deadline, self._resp_deadline):
                waited = "DISCONNECT_RESPONSE" if now >= self._req_deadline else "DISCONNECT_OK"
                self._terminate(events, Timeout(
                    f"no {waited} within {self.disconnect_timeout:g} s", "disconnect"))
            elif self.keepalive_interval > 0 and now >= self._last_sent + self.keepalive_interval:
                self._send_keepalive(now)
        return self.data_to_send(), events

    def next_deadline(self) -> float:
        """When :meth:`tick` has something to do next (``math.inf``: never)."""
        st = self.state
        if st is State.CONNECTING:
            return self._hs_deadline
        if st in (State.CONNECTED, State.DISCONNECTING):
            d = min(self._req_deadline, self._resp_deadline)
            if self.dead_after > 0:
                d = min(d, self._last_recv + self.dead_after)
            if self.keepalive_interval > 0:
                d = min(d, self._last_sent + self.keepalive_interval)
            return d
        return math.inf

    # ---------------------------------------------------------------- sending

    def _emit(self, frame: Frame, now: float) -> None:
        b = encode(frame, max_payload=self.max_payload)
        self._out += b
        self._last_sent = now
        self.stats.frames_sent += 1
        self.stats.bytes_sent += len(b)

    def _send_keepalive(self, now: float) -> None:
        self._ka_seq += 1
        ts = int(now * 1_000_000_000) & U64
        self._emit(Keepalive(self._ka_seq, ts), now)
        self.stats.keepalives_sent += 1
        horizon = now - max(self.dead_after, 3 * self.keepalive_interval)
        for seq in [s for s, (t, _) in self._ka_outstanding.items() if t < horizon]:
            del self._ka_outstanding[seq]
        self._ka_outstanding[self._ka_seq] = (now, ts)

    def _done_sending(self) -> bool:
        return self._req_sent or self._resp_sent

    def _check_send(self, frame: Frame) -> None:
        name = type(frame).__name__
        st = self.state
        if isinstance(frame, _APP_FRAMES):
            cap = _NEEDS_CAPABILITY.get(type(frame))
            if cap is not None and st in (State.CONNECTED, State.DISCONNECTING) \
                    and not self.capabilities & cap:
                raise LocalProtocolError(f"cannot send {name}: capability {cap.name} was not "
                                         "negotiated with this peer")
            if st is State.CONNECTED:
                return
            if st is State.DISCONNECTING:
                if not self._done_sending() or isinstance(frame, _RECEIVE_SIDE):
                    return
                raise LocalProtocolError(
                    f"cannot send {name} after DISCONNECT_{'REQUEST' if self._req_sent else 'RESPONSE'}"
                    " (only STREAM_CREDIT, STREAM_CLOSE and STREAM_REFUSE)")
            raise LocalProtocolError(f"cannot send {name} in state {st.value}")
        if isinstance(frame, DisconnectRequest):
            if st is State.CONNECTED:
                return
            raise LocalProtocolError(f"cannot send DisconnectRequest in state {st.value}"
                                     + (" (the peer asked first: answer with DisconnectResponse)"
                                        if self._peer_req else ""))
        if isinstance(frame, DisconnectResponse):
            if st is State.DISCONNECTING and self._peer_req and not self._resp_sent:
                return
            raise LocalProtocolError("DisconnectResponse only answers the peer's DisconnectRequest,"
                                     " once")
        raise LocalProtocolError(f"{name} is produced by the connection itself, not send()")

    # ---------------------------------------------------------------- receiving

    def _expected(self) -> tuple[type[Frame], ...] | None:
        """Frame classes allowed from the peer now; None = the post-handshake rules."""
        if self.state is State.CONNECTING:
            if self.role == "acceptor":
                return (ConnectOk,) if self.peer is not None else (ConnectRequest,)
            return (ConnectResponse,)
        return None

    def _check_receive_type(self, ftype: int, flags: int) -> None:
        """Header-time check, so a wrong frame is refused before its payload is buffered."""
        expected = self._expected()
        cls = FRAME_TYPES.get(ftype)
        if expected is not None:
            if cls not in expected:
                what = cls.TYPE.name if cls else f"unknown frame type 0x{ftype:02x}"
                want = " or ".join(c.TYPE.name for c in expected)
                raise FrameDecodeError(f"expected {want} during the handshake, got {what}")
        elif cls is None and not flags & FLAG_IGNORABLE:
            raise FrameDecodeError(f"unknown frame type 0x{ftype:02x} without the ignorable flag")

    def _handle(self, raw: RawFrame, now: float, events: list) -> None:
        self._last_recv = now
        st = self.stats
        st.frames_received += 1
        cls = FRAME_TYPES.get(raw.type)
        if cls is None:  # ignorable unknown type (checked at header time)
            st.ignored_frames += 1
            return
        st.by_type_received[cls.TYPE.name] = st.by_type_received.get(cls.TYPE.name, 0) + 1
        if self.state is State.CONNECTING and len(raw.payload) >= 4:
            # another major version: refuse before parsing a layout we may not know (only the
            # leading fields of the handshake frames are the same in every version)
            major, minor = struct.unpack_from(">HH", raw.payload)
            if major != PROTOCOL_VERSION[0]:
                if cls is ConnectRequest:
                    self._refuse(events, ConnectCode.VERSION_MISMATCH,
                                 _version_reason(major, minor), now)
                else:  # its code and reason sit in the frozen leading fields too
                    r = _Reader(raw.payload, "CONNECT_RESPONSE")
                    r.pos = 4
                    try:
                        code, said = r.u16(), r.string()
                    except FrameDecodeError:
                        code, said = ConnectCode.ACCEPTED, ""
                    reason = _version_reason(major, minor) + (f"; the peer says: {said}" if said else "")
                    self._terminate(events, Rejected(reason, ConnectCode.VERSION_MISMATCH,
                                                     by_peer=code != ConnectCode.ACCEPTED))
                return
        frame = decode_payload(raw.type, raw.payload)
        if self.state is State.CONNECTING:
            self._handle_handshake(frame, now, events)
        else:
            self._handle_connected(frame, now, events)

    def _handle_handshake(self, frame: Frame, now: float, events: list) -> None:
        if isinstance(frame, ConnectRequest):
            peer = PeerInfo(frame.name, frame.domains, frame.nonce, frame.capabilities, frame.version)
            self.peer = peer
            code, reason = self._judge(peer)
            if code != ConnectCode.ACCEPTED:
                self._refuse(events, code, reason, now)
                return
            self._emit(self._response(ConnectCode.ACCEPTED, ""), now)
        elif isinstance(frame, ConnectResponse):
            peer = PeerInfo(frame.name, frame.domains, frame.nonce, frame.capabilities, frame.version)
            self.peer = peer
            if not frame.accepted:
                self._terminate(events, Rejected(
                    f"peer {frame.name!r} refused the connection: {frame.reason or 'no reason given'}",
                    frame.code, by_peer=True))
                return
            code, reason = self._judge(peer)
            if code != ConnectCode.ACCEPTED:
                self._terminate(events, Rejected(reason, code, by_peer=False))
                return
            self._emit(ConnectOk(), now)
            self._connected(events)
        elif isinstance(frame, ConnectOk):
            self._connected(events)

    def _connected(self, events: list) -> None:
        assert self.peer is not None
        self.state = State.CONNECTED
        self._hs_deadline = math.inf
        self.capabilities = self.identity.capabilities & self.peer.capabilities
        events.append(Connected(self.peer, self.capabilities))

    def _response(self, code: int, reason: str) -> ConnectResponse:
        me = self.identity
        return ConnectResponse(me.name, me.domains, self.nonce, code, reason, me.capabilities)

    def _refuse(self, events: list, code: int, reason: str, now: float) -> None:
        """Acceptor: answer with a refusing CONNECT_RESPONSE and close."""
        self._emit(self._response(code, reason), now)
        self._terminate(events, Rejected(reason, code, by_peer=False), keep_output=True)

    def _judge(self, peer: PeerInfo) -> tuple[int, str]:
        """The built-in acceptance checks, then the user's ``accept``."""
        if peer.version[0] != PROTOCOL_VERSION[0]:
            return ConnectCode.VERSION_MISMATCH, _version_reason(*peer.version)
        if not peer.name:
            return ConnectCode.BAD_REQUEST, "the peer sent an empty router name"
        if 0 in peer.domains:
            return ConnectCode.BAD_REQUEST, f"router {peer.name!r} announces domain id 0 (invalid)"
        if len(set(peer.domains)) != len(peer.domains):
            return ConnectCode.BAD_REQUEST, f"router {peer.name!r} announces a domain id twice"
        shared = sorted(set(peer.domains) & set(self.identity.domains))
        if shared:
            return ConnectCode.DOMAIN_CONFLICT, (
                f"domain id{'s' if len(shared) > 1 else ''} {', '.join(map(str, shared))} "
                f"served by both {self.identity.name!r} and {peer.name!r}: each TRD must be "
                "behind one side of a peer link")
        if peer.name == self.identity.name:
            return ConnectCode.DUPLICATE_NAME, (
                f"both routers are named {peer.name!r} (or the router connected to itself)")
        if self.accept_fn is not None:
            try:
                ok, reason = self.accept_fn(peer)
            except Exception as e:  # a broken callback must not break the receive path
                return ConnectCode.REFUSED, f"acceptance check failed: {e!r}"
            if not ok:
                return ConnectCode.REFUSED, reason or "refused by local policy"
        return ConnectCode.ACCEPTED, ""

    def _handle_connected(self, frame: Frame, now: float, events: list) -> None:
        name = frame.TYPE.name
        if isinstance(frame, KeepaliveAck):
            sent = self._ka_outstanding.pop(frame.seq, None)
            if sent is None or sent[1] != frame.timestamp_ns:
                self.stats.unmatched_acks += 1
            else:
                self.rtt.add(now - sent[0], now)
                self.stats.keepalives_answered += 1
            return
        if isinstance(frame, Keepalive):
            self._emit(KeepaliveAck(frame.seq, frame.timestamp_ns), now)
            return
        peer_done = self._peer_req or self._req_done  # it sent REQUEST or RESPONSE
        if isinstance(frame, DisconnectRequest):
            if self._peer_req:
                raise FrameDecodeError("second DISCONNECT_REQUEST")
            if self._req_done:
                raise FrameDecodeError("DISCONNECT_REQUEST after DISCONNECT_RESPONSE")
            self._peer_req, self._peer_reason = True, frame.reason
            self.state = State.DISCONNECTING
            events.append(DisconnectRequested(frame.reason))
        elif isinstance(frame, DisconnectResponse):
            if not self._req_sent or self._req_done:
                raise FrameDecodeError("DISCONNECT_RESPONSE without a pending DISCONNECT_REQUEST")
            self._req_done, self._req_deadline = True, math.inf
            self._emit(DisconnectOk(), now)
            self._maybe_closed(events)
        elif isinstance(frame, DisconnectOk):
            if not self._resp_sent or self._peer_done:
                raise FrameDecodeError("DISCONNECT_OK without a pending DISCONNECT_RESPONSE")
            self._peer_done, self._resp_deadline = True, math.inf
            self._maybe_closed(events)
        elif isinstance(frame, ConnectRequest | ConnectResponse | ConnectOk):
            raise FrameDecodeError(f"{name} after the handshake")
        else:
            cap = _NEEDS_CAPABILITY.get(type(frame))
            if cap is not None and not self.capabilities & cap:
                raise FrameDecodeError(f"{name} but capability {cap.name} was not negotiated")
            if peer_done and not isinstance(frame, _RECEIVE_SIDE):
                raise FrameDecodeError(f"{name} after the peer's DISCONNECT_"
                                       f"{'REQUEST' if self._peer_req else 'RESPONSE'}")
            events.append(frame)

    def _maybe_closed(self, events: list) -> None:
        if (self._req_done or not self._req_sent) and (self._peer_done or not self._peer_req):
            by = "both" if self._req_sent and self._peer_req else "local" if self._req_sent else "peer"
            reason = self._req_reason if self._req_sent else self._peer_reason
            self._terminate(events, Closed(reason, by), keep_output=True)

    def _terminate(self, events: list, ev: Terminated, keep_output: bool = False) -> None:
        self.state = State.CLOSED
        self.close_reason = ev.reason
        self._hs_deadline = self._req_deadline = self._resp_deadline = math.inf
        if not keep_output:
            self._out.clear()
        events.append(ev)


def _version_reason(major: int, minor: int) -> str:
    me = f"{PROTOCOL_VERSION[0]}.{PROTOCOL_VERSION[1]}"
    rel = "higher" if major > PROTOCOL_VERSION[0] else "lower"
    return (f"the peer speaks protocol {major}.{minor}, this router speaks {me}: "
            f"a {rel} major version is not supported")


# --------------------------------------------------------------------------- writer queue


class OutQueue:
    """Bounded queue of frames waiting to be written to one peer.

    Two classes of frames share one FIFO (so order is kept: a STREAM_CLOSE never overtakes
    its stream's data, a withdrawn advertisement never overtakes the last data):

    * control -- everything except STREAM_DATA and DATAGRAM: never dropped; at most
      ``max_control`` queued, beyond that :meth:`put` raises :class:`OutQueueOverflow`
      (the link is hopeless and should be closed);
    * data -- STREAM_DATA and DATAGRAM: at most ``max_data_bytes`` of encoded frames queued.
      When full, a DATAGRAM is dropped and counted (LBT-RU recovers by itself); a STREAM_DATA
      is refused (``put`` returns False) so the caller keeps the bytes and waits: size
      writes with :meth:`data_space` (``StreamTable.send(limit=...)``) to never be refused.

    ``put`` never blocks, so a slow peer never stalls the portal feeding it.
    """

    def __init__(self, *, max_control: int = 10_000, max_data_bytes: int = 8 << 20) -> None:
        self.max_control = max_control
        self.max_data_bytes = max_data_bytes
        self._q: deque[tuple[Frame, int]] = deque()  # (frame, data bytes or 0 for control)
        self.control_count = 0
        self.data_bytes = 0
        self.dropped_datagrams = 0
        self.dropped_datagram_bytes = 0
        self.refused_stream_data = 0
        self.discarded = 0  # frames thrown away by clear()

    @staticmethod
    def is_data(frame: Frame) -> bool:
        return isinstance(frame, StreamData | Datagram)

    def __len__(self) -> int:
        return len(self._q)

    def __bool__(self) -> bool:
        return bool(self._q)

    def data_space(self) -> int:
        """Encoded bytes of data frames that would be accepted now."""
        return max(0, self.max_data_bytes - self.data_bytes)

    def put(self, frame: Frame) -> bool:
        """Queue a frame: True if queued, False if a data frame did not fit (see class doc)."""
        if self.is_data(frame):
            size = frame.wire_size()
            if self.data_bytes + size > self.max_data_bytes:
                if isinstance(frame, Datagram):
                    self.dropped_datagrams += 1
                    self.dropped_datagram_bytes += size
                else:
                    self.refused_stream_data += 1
                return False
            self.data_bytes += size
            self._q.append((frame, size))
            return True
        if self.control_count >= self.max_control:
            raise OutQueueOverflow(
                f"{self.control_count} control frames already queued for this peer "
                f"(limit {self.max_control})")
        self.control_count += 1
        self._q.append((frame, 0))
        return True

    def pop(self) -> Frame | None:
        if not self._q:
            return None
        frame, size = self._q.popleft()
        if size:
            self.data_bytes -= size
        else:
            self.control_count -= 1
        return frame

    def pop_batch(self, max_bytes: int = 256 * 1024) -> list[Frame]:
        """Frames from the head up to about ``max_bytes`` of data (at least one frame)."""
        out: list[Frame] = []
        budget = max_bytes
        while self._q and (not out or budget > 0):
            budget -= self._q[0][1] or HEADER_SIZE
            out.append(self.pop())  # type: ignore[arg-type]
        return out

    def clear(self) -> int:
        """Drop everything (the link went down); returns how many frames were dropped."""
        n = len(self._q)
        self._q.clear()
        self.control_count = self.data_bytes = 0
        self.discarded += n
        return n
