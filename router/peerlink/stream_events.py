"""The events of a peer link's stream table (:class:`router.peerlink.streams.StreamTable`
returns them for the stream frames it receives) and the two queue items of its zero-copy
and burst paths (:class:`HeldData`, :class:`DatagramBatch`). Sizes in bytes."""

from __future__ import annotations

from dataclasses import dataclass

from .frames import StreamTarget
from .wire import HEADER, MAGIC, STREAM_DATA_OVERHEAD, WIRE_VERSION, FrameType

# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class StreamEvent:
    stream_id: int


@dataclass(frozen=True, slots=True)
class StreamOpened(StreamEvent):
    """The peer opened a stream: answer with :meth:`StreamTable.accept` or ``refuse``.
    ``target``: the STREAM_OPEN's fields of its kind (RESPONSE, UIM_ROUTED), else None."""

    advert_id: int
    kind: int
    target: StreamTarget | None = None


@dataclass(frozen=True, slots=True)
class StreamAccepted(StreamEvent):
    """Our STREAM_OPEN was accepted; ``credit`` bytes may be sent now."""

    credit: int


@dataclass(frozen=True, slots=True)
class StreamRefused(StreamEvent):
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class DataReceived(StreamEvent):
    """Stream bytes, in order. Call :meth:`StreamTable.consumed` once they are passed on.
    ``whole``: their frame was flagged whole messages (:attr:`StreamData.whole`)."""

    data: bytes
    whole: bool = False


@dataclass(frozen=True, slots=True)
class DatagramReceived(StreamEvent):
    data: bytes


@dataclass(frozen=True, slots=True)
class CreditAvailable(StreamEvent):
    """The peer granted more credit; ``credit`` is the total now available for sending."""

    credit: int


@dataclass(frozen=True, slots=True)
class StreamClosed(StreamEvent):
    """The peer closed the stream (we answered with our STREAM_CLOSE; the id is free)."""

    code: int


@dataclass(frozen=True, slots=True)
class DataRefused(StreamEvent):
    """STREAM_DATA/DATAGRAM for a stream that is unknown, closed or not open: discarded."""

    nbytes: int
    reason: str


@dataclass(frozen=True, slots=True)
class StreamError(StreamEvent):
    """The peer broke the stream rules (credit exceeded, bad id, ...); the stream was
    refused or closed as a result. The link itself stays up."""

    reason: str


@dataclass(frozen=True, slots=True)
class DataArriving(StreamEvent):
    """:meth:`StreamTable.receive_held` accepted ``nbytes`` data bytes within the stream's
    credit: the I/O layer moves them to the stream's consumer itself, and calls
    :meth:`StreamTable.consumed` once they are passed on."""

    nbytes: int


@dataclass(frozen=True, slots=True, eq=False)
class HeldData:
    """A STREAM_DATA frame whose ``nbytes`` data bytes are held by the I/O layer
    (``holder``: opaque here, e.g. a pipe) instead of being in the frame: the writer writes
    the header (type STREAM_DATA, payload length ``4 + nbytes``, the stream id), then the
    bytes themselves. Queued like STREAM_DATA (:class:`router.peerlink.OutQueue` counts it as
    data of :meth:`wire_size` bytes); the holder must be released whether it is written or
    thrown away."""

    stream_id: int
    nbytes: int
    holder: object

    def wire_size(self) -> int:
        return STREAM_DATA_OVERHEAD + self.nbytes


@dataclass(frozen=True, slots=True, eq=False)
class DatagramBatch:
    """Several DATAGRAM frames of one stream, queued as one item (one queue operation and
    one encoding pass for a burst of LBT-RU datagrams): on the wire they are the same
    DATAGRAM frames, one per datagram, in order."""

    stream_id: int
    datagrams: tuple[bytes, ...]

    def wire_size(self) -> int:
        return STREAM_DATA_OVERHEAD * len(self.datagrams) + sum(map(len, self.datagrams))

    def encode(self) -> bytes:
        head = HEADER.pack
        sid = self.stream_id.to_bytes(4, "big")
        return b"".join(head(MAGIC, WIRE_VERSION, FrameType.DATAGRAM, 0, 0, 4 + len(d)) + sid + d
                        for d in self.datagrams)
