"""Peer-link frames: constants, enums, errors, and one frozen dataclass per frame
type with its payload codec (``router/PEERLINK.md``).

About 600 lines: one dataclass and codec per frame type.
"""

from __future__ import annotations

import socket
import struct
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum, IntEnum, IntFlag
from typing import ClassVar

from lbmr_proto import ExFuncOption, LateJoinOption, UmeOption

# --------------------------------------------------------------------------- constants

MAGIC = b"LBRP"
WIRE_VERSION = 1  # the frame-header version byte; changes only if the header changes
PROTOCOL_VERSION = (1, 0)  # (major, minor) carried in the handshake
HEADER = struct.Struct(">4sBBBBI")  # magic, version, type, flags, reserved, payload length
HEADER_SIZE = HEADER.size  # 12
MAX_PAYLOAD = 1 << 20  # 1 MiB
FLAG_IGNORABLE = 0x01  # header flag: a receiver that does not know the type may skip the frame
# header flag of STREAM_DATA (capability WHOLE_MESSAGES): the data is whole LBMC messages, none
# with extension headers, and the stream is at a message boundary before and after it
FLAG_WHOLE_MESSAGES = 0x02
ADVERT_WITHDRAW = 0x01  # ADVERTISEMENT flags bit
ADVERT_TIR_OPTIONS = 0x02  # ADVERTISEMENT flags bit: origin TIR options follow the topic
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
    TOPOLOGY = 0x12
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
    LBTRM = 0x10  # DATAGRAMs both ways: the source's session one way, receivers' NAKs the other
    # capability RU_SESSIONS: one LBT-RU origin session per link, DATAGRAMs both ways: the
    # origin's DATA and SMs from the acceptor's side, the opener's proxy's NAKs the other way
    LBTRU_SESSION = 0x81
    # capability RESPONSES: one responder's UIM connection to a request listener of the
    # receivers' router, carried (STREAM_DATA, from the opener) back towards the requester
    # named in the STREAM_OPEN (:class:`ResponseTarget`)
    RESPONSE = 0x82
    # capability UIM_ROUTING: unicast immediate messages for one destination (domain, ip,
    # port), carried (STREAM_DATA, from the opener) towards the router that serves the
    # domain (:class:`RoutedUimTarget`)
    UIM_ROUTED = 0x83
    # capability RECOVERY: one receiver's late-join and OTR requests (LJI_REQ, UME_RXREQ UIMs)
    # for one of the acceptor's advertisements, carried (STREAM_DATA, from the opener) towards
    # the source, and the source's answers (UME_LJ_INFO, RETRANS) back the other way, for the
    # receiver's request address named in the STREAM_OPEN (:class:`ResponseTarget`)
    RECOVERY = 0x84


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
    ROUTING = 0x04  # TOPOLOGY frames (multi-hop routing)
    SESSIONS = 0x08  # ADVERTISEMENT frames name the source's transport session
    ORIGIN_SID = 0x10  # ADVERTISEMENT frames carry the origin's transport session id
    RU_SESSIONS = 0x20  # LBTRU_SESSION streams (LBT-RU fan-out: one stream per origin session per link)
    RESPONSES = 0x40  # RESPONSE streams (responses to requests relayed across the link)
    UIM_ROUTING = 0x80  # UIM_ROUTED streams (unicast immediate messages routed by domain id)
    TIR_OPTIONS = 0x100  # ADVERTISEMENT frames carry the origin's late-join, exfunc and UME TIR options
    RECOVERY = 0x200  # RECOVERY streams (late-join and OTR requests to the source, its answers back)
    WHOLE_MESSAGES = 0x400  # STREAM_DATA may carry FLAG_WHOLE_MESSAGES (fanned-out TCP sessions)


DEFAULT_CAPABILITIES = int(Capability.STREAMS | Capability.DATAGRAMS | Capability.SESSIONS
                           | Capability.ORIGIN_SID | Capability.RU_SESSIONS
                           | Capability.TIR_OPTIONS | Capability.RESPONSES)  # a router adds ROUTING
# stream kinds a router opens only towards a peer that announced the capability (the
# connection refuses to send the STREAM_OPEN otherwise); every other known kind needs none
KIND_CAPABILITY: dict[int, Capability] = {
    StreamKind.LBTRU_SESSION: Capability.RU_SESSIONS,
    StreamKind.RESPONSE: Capability.RESPONSES,
    StreamKind.UIM_ROUTED: Capability.UIM_ROUTING,
    StreamKind.RECOVERY: Capability.RECOVERY,
}


def stream_kinds(capabilities: int) -> tuple[StreamKind, ...]:
    """The stream kinds a link with these negotiated ``capabilities`` may carry: those that
    need no capability and those whose capability is in the set (e.g. the ``kinds`` of the
    link's :class:`router.peerlink.streams.StreamTable`: it refuses the others with
    UNSUPPORTED_KIND, as a peer that does not know them does)."""
    return tuple(k for k in StreamKind
                 if k not in KIND_CAPABILITY or capabilities & KIND_CAPABILITY[k])


# The origin TIR options an ADVERTISEMENT may carry (capability TIR_OPTIONS), by LBMR TIR
# option type: UME (0x01), late join (0x04) and extended functionality (0x0E), the options
# that name the source's request (late-join, retransmission) address; each at most once,
# with its fixed size, so the field is at most ADVERT_TIR_OPTIONS_MAX bytes
ADVERT_TIR_OPTION_TYPES: dict[int, int] = {c.CODE: c.SIZE for c in (UmeOption, LateJoinOption, ExFuncOption)}
ADVERT_TIR_OPTIONS_MAX = sum(ADVERT_TIR_OPTION_TYPES.values())  # 72 bytes


MAX_TOPOLOGY_ENTRIES = 4096  # domains, and peers, in one TOPOLOGY frame
MAX_ROUTER_ID = 255  # bytes of a router id (its name) in a TOPOLOGY frame


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

def check_tir_options(raw: bytes | bytearray | memoryview, error: type[ValueError] = FrameDecodeError) -> bytes:
    """``raw`` as an ADVERTISEMENT's origin TIR options field: TIR options as on the wire
    (``type:u8 len:u8 ...``, big-endian, no length option), only the kinds of
    :data:`ADVERT_TIR_OPTION_TYPES`, each once and of its size, not empty. Returns the bytes;
    raises ``error`` (:class:`FrameDecodeError` for received bytes) naming what is wrong."""
    raw = bytes(raw)
    if not raw or len(raw) > ADVERT_TIR_OPTIONS_MAX:
        raise error(f"ADVERTISEMENT: TIR options field of {len(raw)} bytes (1..{ADVERT_TIR_OPTIONS_MAX})")
    seen = set()
    p = 0
    while p < len(raw):
        if p + 2 > len(raw):
            raise error(f"ADVERTISEMENT: TIR option header truncated at offset {p}")
        typ, ln = raw[p], raw[p + 1]
        want = ADVERT_TIR_OPTION_TYPES.get(typ)
        if want is None:
            raise error(f"ADVERTISEMENT: TIR option type 0x{typ:02x} is not carried "
                        f"(only {', '.join(f'0x{t:02x}' for t in ADVERT_TIR_OPTION_TYPES)})")
        if ln != want or p + ln > len(raw):
            raise error(f"ADVERTISEMENT: TIR option 0x{typ:02x} of {ln} bytes ({want} expected, "
                        f"{len(raw) - p} left)")
        if typ in seen:
            raise error(f"ADVERTISEMENT: TIR option 0x{typ:02x} twice")
        seen.add(typ)
        p += ln
    return raw



_U8, _U16, _U32, _U64 = (struct.Struct(f) for f in (">B", ">H", ">I", ">Q"))


class PayloadReader:
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
    return _pack(f">H{len(ds)}I", len(ds), *ds, what=what)


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
        return (_pack(">HHQI", *self.version, self.nonce, self.capabilities, what=w)
                + _str(self.name, "router name") + _domains(self.domains, w))

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
        return (_pack(">HHH", *self.version, self.code, what=w) + _str(self.reason, "reason")
                + _pack(">QI", self.nonce, self.capabilities, what=w)
                + _str(self.name, "router name") + _domains(self.domains, w))

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
        return _pack(">QQ", self.seq, self.timestamp_ns, what=self.TYPE.name)

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
        return _str(self.reason, "reason")

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
        return (_pack(">BBI", self.action, self.pattern_type, self.domain_id, what="INTEREST")
                + _str(self.topic, "topic"))

    @classmethod
    def _parse(cls, r: PayloadReader):
        action = _enum(InterestAction, r.u8(), "INTEREST")
        ptype = _enum(PatternType, r.u8(), "INTEREST")
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
        out = (_pack(">IIBBH", self.origin_domain, self.advert_id, self.transport, flags,
                     self.hop_count, what="ADVERTISEMENT")
               + bytes(self.otid) + _str(self.topic, "topic") + opts)
        if self.origin_session_id and not self.session:
            raise FrameEncodeError("ADVERTISEMENT: an origin session id goes with a session")
        if self.session:  # the optional trailer (capability SESSIONS)
            out += _pack(">Q", self.session, what="ADVERTISEMENT session")
        if self.origin_session_id:  # and its optional tail (capability ORIGIN_SID)
            out += _pack(">I", self.origin_session_id, what="ADVERTISEMENT origin session id")
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
        out = [_pack(">QBHH", self.seq, self.hops, len(self.domains), len(self.peers), what="TOPOLOGY"),
               _router_id(self.router_id)]
        out.extend(_pack(">II", d, c, what="TOPOLOGY domain") for d, c in self.domains)
        for rid, c in self.peers:
            out.append(_router_id(rid))
            out.append(_pack(">I", c, what="TOPOLOGY peer cost"))
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
    b = _str(rid, "router id")
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
        head = _pack(">IIIB", self.stream_id, self.advert_id, self.initial_credit, self.kind,
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
        return _pack(">II", self.stream_id, self.initial_credit, what="STREAM_ACCEPT")

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
        return _pack(">IH", self.stream_id, self.code, what="STREAM_REFUSE") + _str(self.reason, "reason")

    @classmethod
    def _parse(cls, r: PayloadReader):
        return cls(r.u32(), r.u16(), r.string())


@dataclass(frozen=True, slots=True)
class _StreamBytes(Frame):
    stream_id: int
    data: bytes | memoryview  # (a read-only view, never changed: StreamTable.send)

    def payload(self) -> bytes:
        return _pack(">I", self.stream_id, what=self.TYPE.name) + self.data

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
        return _pack(">II", self.stream_id, self.increment, what="STREAM_CREDIT")

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
        return _pack(">IH", self.stream_id, self.code, what="STREAM_CLOSE")

    @classmethod
    def _parse(cls, r: PayloadReader):
        return cls(r.u32(), r.u16())


@_frame
@dataclass(frozen=True, slots=True)
class Datagram(_StreamBytes):
    """One LBT-RU datagram relayed on ``stream_id`` (either direction, no credit)."""

    TYPE: ClassVar[FrameType] = FrameType.DATAGRAM
