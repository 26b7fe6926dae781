"""Peer-link frames (``router/PEERLINK.md``): one frozen dataclass per frame type
with its payload codec, built on the wire vocabulary of :mod:`router.peerlink.wire`.
Integers big-endian."""

from __future__ import annotations

import socket
import struct
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from .wire import (
    ADVERT_TIR_OPTIONS,
    ADVERT_TIR_OPTIONS_MAX,
    ADVERT_WITHDRAW,
    DEFAULT_CAPABILITIES,
    FLAG_WHOLE_MESSAGES,
    HEADER_SIZE,
    MAX_ROUTER_ID,
    MAX_TOPOLOGY_ENTRIES,
    PROTOCOL_VERSION,
    CloseCode,
    ConnectCode,
    FrameDecodeError,
    FrameEncodeError,
    FrameType,
    InterestAction,
    PatternType,
    PayloadReader,
    RefuseCode,
    StreamKind,
    check_tir_options,
    pack_fields,
    pack_str,
    to_enum,
)

_U16, _U32 = struct.Struct(">H"), struct.Struct(">I")


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
    def _parse(cls, r: PayloadReader) -> Frame:
        """Read one frame of this type from its payload."""

    def wire_size(self) -> int:
        """Size of the encoded frame, header included."""
        return HEADER_SIZE + len(self.payload())

    def header_flags(self) -> int:
        """The flags byte of the frame's header (0 but for STREAM_DATA's FLAG_WHOLE_MESSAGES)."""
        return 0

    def with_header_flags(self, flags: int) -> Frame:
        """The frame as decoded with the flags byte ``flags`` of its header (itself, but for
        STREAM_DATA)."""
        return self


FRAME_TYPES: dict[int, type[Frame]] = {}


def _frame(cls):
    FRAME_TYPES[int(cls.TYPE)] = cls
    return cls


def _domains(domains: Iterable[int], what: str) -> bytes:
    ds = tuple(domains)
    if len(ds) > 0xFFFF:
        raise FrameEncodeError(f"{what}: {len(ds)} domain ids (at most 65535)")
    return pack_fields(f">H{len(ds)}I", len(ds), *ds, what=what)


def _read_domains(r: PayloadReader) -> tuple[int, ...]:
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
        return (pack_fields(">HHQI", *self.version, self.nonce, self.capabilities, what=w)
                + pack_str(self.name, "router name") + _domains(self.domains, w))

    @classmethod
    def _parse(cls, r: PayloadReader) -> ConnectRequest:
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
        return (pack_fields(">HHH", *self.version, self.code, what=w) + pack_str(self.reason, "reason")
                + pack_fields(">QI", self.nonce, self.capabilities, what=w)
                + pack_str(self.name, "router name") + _domains(self.domains, w))

    @classmethod
    def _parse(cls, r: PayloadReader) -> ConnectResponse:
        major, minor, code = r.u16(), r.u16(), r.u16()
        reason = r.string()
        nonce, caps = r.u64(), r.u32()
        return cls(r.string(), _read_domains(r), nonce, code, reason, caps, (major, minor))


@dataclass(frozen=True, slots=True)
class _Empty(Frame):
    def payload(self) -> bytes:
        return b""

    @classmethod
    def _parse(cls, r: PayloadReader):
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
        return pack_fields(">QQ", self.seq, self.timestamp_ns, what=self.TYPE.name)

    @classmethod
    def _parse(cls, r: PayloadReader):
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
        return pack_str(self.reason, "reason")

    @classmethod
    def _parse(cls, r: PayloadReader):
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
        return (pack_fields(">BBI", self.action, self.pattern_type, self.domain_id, what="INTEREST")
                + pack_str(self.topic, "topic"))

    @classmethod
    def _parse(cls, r: PayloadReader):
        action = to_enum(InterestAction, r.u8(), "INTEREST")
        ptype = to_enum(PatternType, r.u8(), "INTEREST")
        domain = r.u32()
        return cls(action, r.string(), domain, ptype)


@_frame
@dataclass(frozen=True, slots=True)
class Advertisement(Frame):
    """A source of ``topic`` exists in ``origin_domain`` (``withdraw``: it is gone).

    ``transport`` is the LBMR TIR transport code; ``advert_id`` names the advertisement on this
    link (STREAM_OPEN refers to it); ``hop_count`` counts routers already crossed. ``session``
    (capability SESSIONS; 0 = not said) names the source's transport session: advertisements
    with the same transport and non-zero session are topics of one session, which the receiving
    router serves with one proxy (one listener, one stream per receiver connection).
    ``origin_session_id`` (capability ORIGIN_SID; 0 = not said, and said only with a session):
    the origin TIR's 32-bit transport session id (TCP or LBT-RU "with session id"), which the
    proxy advertises too: its receivers get the origin's session in the stream.
    ``tir_options`` (capability TIR_OPTIONS; empty = not said, never with ``withdraw``): the
    origin TIR's UME, late-join and extended-functionality options as on the wire
    (:func:`check_tir_options`), which the proxy advertises with the request address
    substituted."""

    TYPE: ClassVar[FrameType] = FrameType.ADVERTISEMENT
    topic: str
    origin_domain: int
    otid: bytes
    transport: int
    advert_id: int
    withdraw: bool = False
    hop_count: int = 0
    session: int = 0
    origin_session_id: int = 0
    tir_options: bytes = b""

    def payload(self) -> bytes:
        if not isinstance(self.otid, bytes | bytearray) or len(self.otid) != 32:
            raise FrameEncodeError(f"ADVERTISEMENT: OTID must be 32 bytes, not {self.otid!r}")
        flags = ADVERT_WITHDRAW if self.withdraw else 0
        opts = b""
        if self.tir_options:
            if self.withdraw:
                raise FrameEncodeError("ADVERTISEMENT: a withdrawal carries no TIR options")
            opts = check_tir_options(self.tir_options, FrameEncodeError)
            opts = _U16.pack(len(opts)) + opts
            flags |= ADVERT_TIR_OPTIONS
        out = (pack_fields(">IIBBH", self.origin_domain, self.advert_id, self.transport, flags,
                     self.hop_count, what="ADVERTISEMENT")
               + bytes(self.otid) + pack_str(self.topic, "topic") + opts)
        if self.origin_session_id and not self.session:
            raise FrameEncodeError("ADVERTISEMENT: an origin session id goes with a session")
        if self.session:  # the optional trailer (capability SESSIONS)
            out += pack_fields(">Q", self.session, what="ADVERTISEMENT session")
        if self.origin_session_id:  # and its optional tail (capability ORIGIN_SID)
            out += pack_fields(">I", self.origin_session_id, what="ADVERTISEMENT origin session id")
        return out

    @classmethod
    def _parse(cls, r: PayloadReader):
        domain, advert_id, transport, flags, hops = r.u32(), r.u32(), r.u8(), r.u8(), r.u16()
        otid = r.raw(32)
        topic = r.string()
        opts = b""
        if flags & ADVERT_TIR_OPTIONS:  # the origin TIR options (capability TIR_OPTIONS)
            if flags & ADVERT_WITHDRAW:
                raise FrameDecodeError("ADVERTISEMENT: a withdrawal with TIR options")
            n = r.u16()
            if not 0 < n <= ADVERT_TIR_OPTIONS_MAX:
                raise FrameDecodeError(f"ADVERTISEMENT: TIR options field of {n} bytes "
                                       f"(1..{ADVERT_TIR_OPTIONS_MAX})")
            opts = check_tir_options(r.raw(n))
        session = sid = 0
        if r.pos < len(r.buf):  # the optional trailer
            session = r.u64()
            if not session:
                raise FrameDecodeError("ADVERTISEMENT: session 0 is said by leaving the field out")
        if r.pos < len(r.buf):  # and its optional tail
            sid = r.u32()
            if not sid:
                raise FrameDecodeError("ADVERTISEMENT: origin session id 0 is said by leaving the field out")
        return cls(topic, domain, otid, transport, advert_id, bool(flags & ADVERT_WITHDRAW),
                   hops, session, sid, opts)


@_frame
@dataclass(frozen=True, slots=True)
class Topology(Frame):
    """Route info: what router ``router_id`` announces (its ``seq``-th announcement),
    having crossed ``hops`` peer links. ``domains``: (domain id, endpoint portal cost)
    of each endpoint portal; ``peers``: (router id, peer portal cost) of each peer
    link it has up. At most :data:`MAX_TOPOLOGY_ENTRIES` of each, router ids at most
    :data:`MAX_ROUTER_ID` bytes."""

    TYPE: ClassVar[FrameType] = FrameType.TOPOLOGY
    router_id: str
    seq: int
    hops: int
    domains: tuple[tuple[int, int], ...] = ()
    peers: tuple[tuple[str, int], ...] = ()

    def payload(self) -> bytes:
        if len(self.domains) > MAX_TOPOLOGY_ENTRIES or len(self.peers) > MAX_TOPOLOGY_ENTRIES:
            raise FrameEncodeError(f"TOPOLOGY: at most {MAX_TOPOLOGY_ENTRIES} domains and peers")
        out = [pack_fields(">QBHH", self.seq, self.hops, len(self.domains), len(self.peers), what="TOPOLOGY"),
               _router_id(self.router_id)]
        out.extend(pack_fields(">II", d, c, what="TOPOLOGY domain") for d, c in self.domains)
        for rid, c in self.peers:
            out.append(_router_id(rid))
            out.append(pack_fields(">I", c, what="TOPOLOGY peer cost"))
        return b"".join(out)

    @classmethod
    def _parse(cls, r: PayloadReader):
        seq, hops, nd, np_ = r.u64(), r.u8(), r.u16(), r.u16()
        if nd > MAX_TOPOLOGY_ENTRIES or np_ > MAX_TOPOLOGY_ENTRIES:
            raise FrameDecodeError(f"TOPOLOGY: {nd} domains, {np_} peers (at most {MAX_TOPOLOGY_ENTRIES})")
        rid = _read_router_id(r)
        domains = tuple((r.u32(), r.u32()) for _ in range(nd))
        peers = tuple((_read_router_id(r), r.u32()) for _ in range(np_))
        return cls(rid, seq, hops, domains, peers)


def _router_id(rid: str) -> bytes:
    b = pack_str(rid, "router id")
    if not rid or len(b) - 2 > MAX_ROUTER_ID:
        raise FrameEncodeError(f"router id must be 1..{MAX_ROUTER_ID} bytes: {rid!r}")
    return b


def _read_router_id(r: PayloadReader) -> str:
    rid = r.string()
    if not rid or len(rid.encode("utf-8", "surrogateescape")) > MAX_ROUTER_ID:
        raise FrameDecodeError(f"TOPOLOGY: router id must be 1..{MAX_ROUTER_ID} bytes")
    return rid


def _ipv4(ip: str, what: str) -> bytes:
    """The 4 bytes (network order) of a dotted-quad IPv4 address."""
    try:
        return socket.inet_pton(socket.AF_INET, ip)
    except (OSError, TypeError):
        raise FrameEncodeError(f"{what}: not an IPv4 address: {ip!r}") from None


@dataclass(frozen=True, slots=True)
class ResponseTarget:
    """The fields a STREAM_OPEN of kind RESPONSE adds: the requester the responses go to,
    ``ip`` (dotted quad; 4 bytes on the wire, network order, as in LBMC's REQUEST header)
    and ``port`` (u16, 1..65535), exactly as the REQUEST header named them in the origin's
    TRD."""

    ip: str
    port: int
    SIZE: ClassVar[int] = 6

    def encode(self) -> bytes:
        if not 0 < self.port <= 0xFFFF:
            raise FrameEncodeError(f"STREAM_OPEN RESPONSE: port {self.port!r} (1..65535)")
        return _ipv4(self.ip, "STREAM_OPEN RESPONSE requester") + _U16.pack(self.port)

    @classmethod
    def parse(cls, r: PayloadReader) -> ResponseTarget:
        ip, port = socket.inet_ntoa(r.raw(4)), r.u16()
        if not port:
            raise FrameDecodeError("STREAM_OPEN RESPONSE: requester port 0")
        return cls(ip, port)


@dataclass(frozen=True, slots=True)
class RoutedUimTarget:
    """The fields a STREAM_OPEN of kind UIM_ROUTED adds: the destination of the unicast
    immediate messages the stream carries, as their DESTINATION header names it --
    ``domain_id`` (u32, not 0), ``ip`` (dotted quad; 4 bytes, network order) and ``port``
    (u16, 1..65535) -- and ``hops`` (u16): the peer links the stream has crossed before
    this one (0 from the router where the messages entered)."""

    domain_id: int
    ip: str
    port: int
    hops: int = 0
    SIZE: ClassVar[int] = 12

    def encode(self) -> bytes:
        if not 0 < self.domain_id <= 0xFFFFFFFF or not 0 < self.port <= 0xFFFF \
                or not 0 <= self.hops <= 0xFFFF:
            raise FrameEncodeError(f"STREAM_OPEN UIM_ROUTED: domain id {self.domain_id!r} (1..2**32-1), "
                                   f"port {self.port!r} (1..65535) or hops {self.hops!r} (u16) out of range")
        return (_U32.pack(self.domain_id) + _ipv4(self.ip, "STREAM_OPEN UIM_ROUTED destination")
                + _U16.pack(self.port) + _U16.pack(self.hops))

    @classmethod
    def parse(cls, r: PayloadReader) -> RoutedUimTarget:
        domain, ip, port, hops = r.u32(), socket.inet_ntoa(r.raw(4)), r.u16(), r.u16()
        if not domain or not port:
            raise FrameDecodeError(f"STREAM_OPEN UIM_ROUTED: domain id {domain}, port {port} (0 is invalid)")
        return cls(domain, ip, port, hops)


StreamTarget = ResponseTarget | RoutedUimTarget
# the kinds whose STREAM_OPEN carries fields after the kind, and the class of those fields
KIND_TARGET: dict[int, type[ResponseTarget] | type[RoutedUimTarget]] = {
    StreamKind.RESPONSE: ResponseTarget,
    StreamKind.UIM_ROUTED: RoutedUimTarget,
    StreamKind.RECOVERY: ResponseTarget,  # the receiver's request address, as its requests name it
}


def check_target(kind: int, target: StreamTarget | None) -> None:
    """:class:`FrameEncodeError` unless ``target`` is what a STREAM_OPEN of ``kind`` carries
    (a :data:`KIND_TARGET` instance for those kinds, None for the others)."""
    want = KIND_TARGET.get(int(kind))
    if want is None and target is not None:
        raise FrameEncodeError(f"STREAM_OPEN of kind 0x{int(kind):02x} carries no target, not {target!r}")
    if want is not None and type(target) is not want:
        raise FrameEncodeError(f"STREAM_OPEN of kind 0x{int(kind):02x} needs a {want.__name__}, not {target!r}")


@_frame
@dataclass(frozen=True, slots=True)
class StreamOpen(Frame):
    """Open stream ``stream_id`` for ``advert_id``; ``initial_credit`` is how many data bytes
    the opener lets the peer send on it before the first STREAM_CREDIT. ``target``: the
    fields of the kinds of :data:`KIND_TARGET` (RESPONSE: a :class:`ResponseTarget`,
    UIM_ROUTED: a :class:`RoutedUimTarget`), None for the others. A STREAM_OPEN of a kind
    this module does not know decodes with the bytes after its kind ignored (the stream
    table refuses it)."""

    TYPE: ClassVar[FrameType] = FrameType.STREAM_OPEN
    stream_id: int
    advert_id: int
    kind: int = StreamKind.TCP
    initial_credit: int = 0
    target: StreamTarget | None = None

    def payload(self) -> bytes:
        head = pack_fields(">IIIB", self.stream_id, self.advert_id, self.initial_credit, self.kind,
                     what="STREAM_OPEN")
        check_target(self.kind, self.target)
        return head if self.target is None else head + self.target.encode()

    @classmethod
    def _parse(cls, r: PayloadReader):
        sid, advert, credit, kind = r.u32(), r.u32(), r.u32(), r.u8()
        try:
            kind = StreamKind(kind)
        except ValueError:  # unknown kinds decode fine; the stream table refuses them
            r.rest()  # (a later kind's fields: not ours to check)
            return cls(sid, advert, kind, credit)
        target_cls = KIND_TARGET.get(kind)
        return cls(sid, advert, kind, credit, None if target_cls is None else target_cls.parse(r))


@_frame
@dataclass(frozen=True, slots=True)
class StreamAccept(Frame):
    TYPE: ClassVar[FrameType] = FrameType.STREAM_ACCEPT
    stream_id: int
    initial_credit: int = 0

    def payload(self) -> bytes:
        return pack_fields(">II", self.stream_id, self.initial_credit, what="STREAM_ACCEPT")

    @classmethod
    def _parse(cls, r: PayloadReader):
        return cls(r.u32(), r.u32())


@_frame
@dataclass(frozen=True, slots=True)
class StreamRefuse(Frame):
    TYPE: ClassVar[FrameType] = FrameType.STREAM_REFUSE
    stream_id: int
    code: int = RefuseCode.REFUSED
    reason: str = ""

    def payload(self) -> bytes:
        return pack_fields(">IH", self.stream_id, self.code, what="STREAM_REFUSE") + pack_str(self.reason, "reason")

    @classmethod
    def _parse(cls, r: PayloadReader):
        return cls(r.u32(), r.u16(), r.string())


@dataclass(frozen=True, slots=True)
class _StreamBytes(Frame):
    stream_id: int
    data: bytes | memoryview  # (a read-only view, never changed: StreamTable.send)

    def payload(self) -> bytes:
        return pack_fields(">I", self.stream_id, what=self.TYPE.name) + self.data

    def wire_size(self) -> int:
        return HEADER_SIZE + 4 + len(self.data)

    @classmethod
    def _parse(cls, r: PayloadReader):
        return cls(r.u32(), r.rest())


@_frame
@dataclass(frozen=True, slots=True)
class StreamData(_StreamBytes):
    """Bytes of a stream (counted against the receiver's credit). ``whole``: they are
    whole LBMC messages, none with extension headers (header flag FLAG_WHOLE_MESSAGES,
    sent only to a peer with capability WHOLE_MESSAGES): the receiver may pass them on
    without framing them (a fanned-out TCP session's lone receiver: zero copy)."""

    TYPE: ClassVar[FrameType] = FrameType.STREAM_DATA
    whole: bool = False

    def header_flags(self) -> int:
        return FLAG_WHOLE_MESSAGES if self.whole else 0

    def with_header_flags(self, flags: int) -> StreamData:
        return StreamData(self.stream_id, self.data, True) if flags & FLAG_WHOLE_MESSAGES else self


@_frame
@dataclass(frozen=True, slots=True)
class StreamCredit(Frame):
    TYPE: ClassVar[FrameType] = FrameType.STREAM_CREDIT
    stream_id: int
    increment: int

    def payload(self) -> bytes:
        return pack_fields(">II", self.stream_id, self.increment, what="STREAM_CREDIT")

    @classmethod
    def _parse(cls, r: PayloadReader):
        return cls(r.u32(), r.u32())


@_frame
@dataclass(frozen=True, slots=True)
class StreamClose(Frame):
    TYPE: ClassVar[FrameType] = FrameType.STREAM_CLOSE
    stream_id: int
    code: int = CloseCode.NORMAL

    def payload(self) -> bytes:
        return pack_fields(">IH", self.stream_id, self.code, what="STREAM_CLOSE")

    @classmethod
    def _parse(cls, r: PayloadReader):
        return cls(r.u32(), r.u16())


@_frame
@dataclass(frozen=True, slots=True)
class Datagram(_StreamBytes):
    """One LBT-RU datagram relayed on ``stream_id`` (either direction, no credit)."""

    TYPE: ClassVar[FrameType] = FrameType.DATAGRAM
