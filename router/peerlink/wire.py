"""Peer-link wire vocabulary (``router/PEERLINK.md``): the frame header, the
codes, capability bits and limits, the errors, and the payload codec the frames
are built with (:class:`PayloadReader`, :func:`pack_fields`, :func:`pack_str`,
:func:`to_enum`). Integers big-endian."""

from __future__ import annotations

import struct
from enum import Enum, IntEnum, IntFlag

from lbmr_proto import ExFuncOption, LateJoinOption, UmeOption

# --------------------------------------------------------------------------- constants

MAGIC = b"LBRP"
WIRE_VERSION = 1  # the frame-header version byte; changes only if the header changes
PROTOCOL_VERSION = (1, 0)  # (major, minor) carried in the handshake
HEADER = struct.Struct(">4sBBBBI")  # magic, version, type, flags, reserved, payload length
HEADER_SIZE = HEADER.size  # 12
STREAM_DATA_OVERHEAD = HEADER_SIZE + 4  # bytes of a STREAM_DATA or DATAGRAM frame besides its data (header, stream id)
MAX_PAYLOAD = 1 << 20  # 1 MiB: the payload limit until the handshake, and with a peer without LARGE_FRAMES
# the payload limit once both sides announced capability LARGE_FRAMES (both ways, from the
# frame after the handshake's last): 4 MiB, so that a fanned-out session crosses in a
# quarter of the frames (each costs both routers Python time: bench/router.py, fan-out)
LARGE_PAYLOAD = 4 << 20
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
    LARGE_FRAMES = 0x800  # frames of up to LARGE_PAYLOAD payload bytes (else MAX_PAYLOAD), once connected


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


def pack_str(s: str, what: str) -> bytes:
    try:
        b = s.encode("utf-8", "surrogateescape")
    except (UnicodeEncodeError, AttributeError) as e:
        raise FrameEncodeError(f"{what}: cannot encode {s!r} as UTF-8: {e}") from None
    if len(b) > 0xFFFF:
        raise FrameEncodeError(f"{what} is {len(b)} bytes long (at most 65535)")
    return _U16.pack(len(b)) + b


def pack_fields(fmt: str, *values, what: str) -> bytes:
    try:
        return struct.pack(fmt, *values)
    except struct.error as e:
        raise FrameEncodeError(f"{what}: value out of range in {values!r}: {e}") from None


def to_enum(cls, value: int, what: str):
    try:
        return cls(value)
    except ValueError:
        raise FrameDecodeError(f"{what}: unknown {cls.__name__} value {value}") from None
