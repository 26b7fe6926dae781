"""The events of a peer-link connection (:class:`router.peerlink.connection.PeerConnection`
returns them beside the frames it received), who each side is
(:class:`RouterIdentity`, :class:`PeerInfo`) and the link's statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

from .wire import DEFAULT_CAPABILITIES, ConnectCode

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
