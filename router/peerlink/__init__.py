"""Sans-IO core of the router's peer link (the TCP link between two routers), as a
package: :mod:`.wire` (header, codes, capabilities, errors, payload codec),
:mod:`.frames`, :mod:`.codec`, :mod:`.events` and :mod:`.connection`,
:mod:`.outqueue`, and :mod:`.streams` (with :mod:`.stream_events`); every public
name of the first six is importable from here.

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

Per-stream flow control lives in :mod:`router.peerlink.streams`.

Outgoing bytes, the one rule: every frame the connection produces -- on
:meth:`~PeerConnection.start`, :meth:`~PeerConnection.send`,
:meth:`~PeerConnection.tick` or automatically while receiving (CONNECT_RESPONSE,
CONNECT_OK, KEEPALIVE_ACK, DISCONNECT_OK) -- is appended, in order, to one
outgoing buffer. ``start``, ``send`` and ``tick`` return the whole buffer (and
empty it); after ``receive_data`` call :meth:`~PeerConnection.data_to_send`
(or just the next ``send``/``tick``, which will include those bytes).
"""

from .codec import (
    FrameReader,
    RawFrame,
    decode,
    decode_payload,
    encode,
    encode_raw,
)
from .connection import AcceptFn, PeerConnection
from .events import (
    Closed,
    Connected,
    ConnectionLost,
    DisconnectRequested,
    Event,
    LinkStats,
    PeerInfo,
    ProtocolError,
    Rejected,
    RouterIdentity,
    RttStats,
    Terminated,
    Timeout,
)
from .frames import (
    FRAME_TYPES,
    KIND_TARGET,
    Advertisement,
    ConnectOk,
    ConnectRequest,
    ConnectResponse,
    Datagram,
    DisconnectOk,
    DisconnectRequest,
    DisconnectResponse,
    Frame,
    Interest,
    Keepalive,
    KeepaliveAck,
    ResponseTarget,
    RoutedUimTarget,
    StreamAccept,
    StreamClose,
    StreamCredit,
    StreamData,
    StreamOpen,
    StreamRefuse,
    StreamTarget,
    Topology,
    check_target,
)
from .outqueue import (
    OutQueue,
)
from .wire import (
    ADVERT_TIR_OPTION_TYPES,
    ADVERT_TIR_OPTIONS,
    ADVERT_TIR_OPTIONS_MAX,
    ADVERT_WITHDRAW,
    DEFAULT_CAPABILITIES,
    FLAG_IGNORABLE,
    FLAG_WHOLE_MESSAGES,
    HEADER,
    HEADER_SIZE,
    KIND_CAPABILITY,
    LARGE_PAYLOAD,
    MAGIC,
    MAX_PAYLOAD,
    PROTOCOL_VERSION,
    U64,
    WIRE_VERSION,
    Capability,
    CloseCode,
    ConnectCode,
    FrameDecodeError,
    FrameEncodeError,
    FrameType,
    InterestAction,
    LocalProtocolError,
    OutQueueOverflow,
    PatternType,
    PayloadReader,
    RefuseCode,
    State,
    StreamKind,
    check_tir_options,
    stream_kinds,
)

__all__ = [
    "MAGIC", "WIRE_VERSION", "PROTOCOL_VERSION", "HEADER_SIZE", "MAX_PAYLOAD", "LARGE_PAYLOAD", "FLAG_IGNORABLE", "FLAG_WHOLE_MESSAGES",
    "FrameType", "ConnectCode", "InterestAction", "PatternType", "StreamKind", "RefuseCode",
    "CloseCode", "Capability", "State",
    "LocalProtocolError", "FrameEncodeError", "FrameDecodeError", "OutQueueOverflow",
    "Frame", "ConnectRequest", "ConnectResponse", "ConnectOk", "Keepalive", "KeepaliveAck",
    "DisconnectRequest", "DisconnectResponse", "DisconnectOk", "Interest", "Advertisement", "Topology",
    "StreamOpen", "StreamAccept", "StreamRefuse", "StreamData", "StreamCredit", "StreamClose",
    "Datagram", "ResponseTarget", "RoutedUimTarget", "StreamTarget", "KIND_CAPABILITY", "KIND_TARGET",
    "check_target", "stream_kinds", "check_tir_options", "ADVERT_TIR_OPTION_TYPES", "ADVERT_TIR_OPTIONS",
    "ADVERT_TIR_OPTIONS_MAX", "FRAME_TYPES", "encode", "encode_raw", "decode", "decode_payload", "RawFrame",
    "FrameReader", "Event", "Connected", "DisconnectRequested", "Terminated", "Rejected",
    "Closed", "ConnectionLost", "Timeout", "ProtocolError", "RouterIdentity", "PeerInfo",
    "RttStats", "LinkStats", "PeerConnection", "OutQueue",
]
