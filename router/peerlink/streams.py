"""Sans-IO stream multiplexing with per-stream flow control over one peer link.

A :class:`StreamTable` (one per connected :class:`router.peerlink.PeerConnection`, same
role) keeps the streams of a link: the relayed TCP transport sessions and LBT-RU sessions.
It never sees bytes on the wire, only frame objects:

* incoming stream frames go to :meth:`StreamTable.receive`, which returns stream events
  (:class:`DataReceived`, :class:`CreditAvailable`, :class:`StreamClosed`, ...);
* every outgoing frame -- caused by a call (``open``, ``send``, ``consumed``, ``close`` ...)
  or automatically by an incoming frame (the answering STREAM_CLOSE, a refusal, a credit
  grant) -- is appended to one outbox, drained in order by :meth:`StreamTable.frames_to_send`;
  hand those frames to the writer (``OutQueue.put`` / ``PeerConnection.send``).

Flow control (per stream and per direction, like HTTP/2 but without a connection-wide
window): the receiver announces an initial credit in STREAM_OPEN / STREAM_ACCEPT; a sender
never sends more STREAM_DATA bytes than its credit; the receiver grants more with
STREAM_CREDIT once the application has *consumed* (:meth:`StreamTable.consumed`) at least
half a window. A stream whose consumer stalls therefore stops only itself: the others keep
their own credit. DATAGRAMs use no credit (LBT-RU has its own rate control; the writer queue
drops them when full).

Zero-copy relay (the I/O layer moves the data bytes itself, e.g. with ``os.splice``
through a pipe, and never hands them to this table): :meth:`StreamTable.send_held` accounts
``n`` bytes the I/O layer holds and queues a :class:`HeldData` frame for the writer, which
writes the STREAM_DATA header and then the bytes; :meth:`StreamTable.receive_held` is
``receive(StreamData)`` for a frame whose header arrived and whose ``n`` data bytes the I/O
layer will move: same checks and credit accounting, :class:`DataArriving` instead of
:class:`DataReceived` (the refusals are the same events: the I/O layer then discards the
bytes). The wire is the same either way: a peer cannot tell the two paths apart.

Peer mistakes are events, never exceptions; calling a method the wrong way (sending on a
stream that is not open, consuming more than was received) raises :class:`LocalStreamError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .frames import (
    Datagram,
    Frame,
    StreamAccept,
    StreamClose,
    StreamCredit,
    StreamData,
    StreamOpen,
    StreamRefuse,
    StreamTarget,
    check_target,
)
from .stream_events import (
    CreditAvailable,
    DataArriving,
    DatagramBatch,
    DatagramReceived,
    DataReceived,
    DataRefused,
    HeldData,
    StreamAccepted,
    StreamClosed,
    StreamError,
    StreamEvent,
    StreamOpened,
    StreamRefused,
)
from .wire import (
    MAX_PAYLOAD,
    STREAM_DATA_OVERHEAD,
    CloseCode,
    LocalProtocolError,
    RefuseCode,
    StreamKind,
)

__all__ = [
    "INITIAL_WINDOW", "MIN_INITIAL_WINDOW", "MAX_FRAME_DATA", "STREAM_DATA_OVERHEAD", "STREAM_FRAMES", "StreamState",
    "LocalStreamError", "StreamClosedError", "StreamEvent", "StreamOpened", "StreamAccepted",
    "StreamRefused", "DataReceived", "DatagramReceived", "CreditAvailable", "StreamClosed",
    "DataRefused", "StreamError", "DataArriving", "HeldData", "DatagramBatch", "Stream",
    "StreamTable",
]

INITIAL_WINDOW = 256 * 1024  # credit each receiver grants a new stream
MIN_INITIAL_WINDOW = 64 * 1024  # the smallest initial window under an initial_budget
MAX_FRAME_DATA = 64 * 1024  # data bytes per STREAM_DATA frame
MAX_STREAM_ID = 0xFFFFFFFF
STREAM_FRAMES = (StreamOpen, StreamAccept, StreamRefuse, StreamData, StreamCredit, StreamClose,
                 Datagram)


class StreamState(Enum):
    OPENING = "OPENING"  # we sent STREAM_OPEN, no answer yet
    PENDING = "PENDING"  # the peer sent STREAM_OPEN, we have not accepted/refused yet
    OPEN = "OPEN"
    CLOSING = "CLOSING"  # we sent STREAM_CLOSE, waiting for the peer's


class LocalStreamError(LocalProtocolError):
    """A :class:`StreamTable` method was called in a way the protocol does not allow."""


class StreamClosedError(LocalStreamError):
    """The stream is closed (or closing, or never existed): nothing can be sent on it."""


# --------------------------------------------------------------------------- table


@dataclass
class Stream:
    id: int
    advert_id: int
    kind: int
    local: bool  # opened by us
    state: StreamState
    target: StreamTarget | None = None  # the fields of a RESPONSE or UIM_ROUTED stream's STREAM_OPEN
    send_credit: int = 0  # bytes we may still send
    # the most credit the peer gave at once (first its initial credit): a lower bound of its
    # window, which grows while its consumer keeps up (the peer gives back what it consumes)
    peer_window: int = 0
    recv_window: int = 0  # bytes the peer may still send
    unconsumed: int = 0  # received, not yet reported consumed
    ungranted: int = 0  # consumed, not yet returned to the peer as credit
    window: int = 0  # our receive window (the initial one, grown while the consumer keeps up)
    base: int = 0  # our initial receive window (what the table's initial_budget counts)
    bytes_sent: int = 0
    bytes_received: int = 0
    datagrams_sent: int = 0
    datagrams_received: int = 0


class StreamTable:
    """The streams of one peer link (see the module doc).

    Stream ids: the initiator of the TCP connection uses odd ids (1, 3, 5, ...), the acceptor
    even ids (2, 4, ...); each side's ids strictly increase and are never reused on the
    connection. ``kinds``: the stream kinds this side accepts (others are refused
    automatically, UNSUPPORTED_KIND); by default the four data kinds, never RESPONSE or
    UIM_ROUTED: a router that serves those passes ``router.peerlink.stream_kinds(negotiated
    capabilities)``."""

    def __init__(self, role: str, *, initial_window: int = INITIAL_WINDOW,
                 max_window: int | None = None, window_budget: int = 0, initial_budget: int = 0,
                 max_frame: int = MAX_FRAME_DATA, max_streams: int = 4096,
                 max_datagram: int = MAX_PAYLOAD - 4,
                 kinds: tuple[int, ...] = (StreamKind.TCP, StreamKind.LBTRU, StreamKind.LBTRM,
                                           StreamKind.LBTRU_SESSION)) -> None:
        if role not in ("initiator", "acceptor"):
            raise ValueError(f"role must be 'initiator' or 'acceptor', not {role!r}")
        if not 0 < initial_window <= 0xFFFFFFFF or max_frame <= 0:
            raise ValueError("initial_window must be 1..2**32-1 and max_frame positive")
        self.role = role
        self.initial_window = initial_window
        # receive windows grow from initial_window up to max_window while their consumer
        # keeps up, by at most window_budget bytes over all the streams of the table
        self.max_window = max(initial_window, max_window or initial_window)
        self.window_budget = window_budget
        self.window_grown = 0  # bytes the open streams' windows have grown, in all
        # the initial windows of the open streams total at most initial_budget (0: no bound)
        # beyond MIN_INITIAL_WINDOW each: a stream opened when the budget is spent starts
        # smaller (and grows while its consumer keeps up, within window_budget)
        self.initial_budget = initial_budget
        self.initial_committed = 0
        self.max_frame = max_frame
        self.max_streams = max_streams
        self.max_datagram = max_datagram
        self.kinds = frozenset(int(k) for k in kinds)
        self.streams: dict[int, Stream] = {}
        self._next_id = 1 if role == "initiator" else 2
        self._peer_parity = 0 if role == "initiator" else 1
        self._last_peer_id = 0
        self._outbox: list[Frame] = []
        self.refused_frames = 0  # DataRefused events
        self.refused_bytes = 0
        self.ignored_frames = 0  # credit/accept/close for unknown streams, ignored

    # ---------------------------------------------------------------- outgoing

    def __len__(self) -> int:
        return len(self.streams)

    def __contains__(self, stream_id: int) -> bool:
        return stream_id in self.streams

    def get(self, stream_id: int) -> Stream | None:
        return self.streams.get(stream_id)

    def frames_to_send(self) -> list[Frame]:
        """All frames produced since the last call, in order."""
        out, self._outbox = self._outbox, []
        return out

    def open(self, advert_id: int, kind: int = StreamKind.TCP, target: StreamTarget | None = None) -> int:
        """Open a stream for an advertisement; returns its id (STREAM_OPEN in the outbox).
        Data may be sent once :class:`StreamAccepted` arrives. ``target``: the fields of a
        RESPONSE (:class:`router.peerlink.ResponseTarget`) or UIM_ROUTED
        (:class:`router.peerlink.RoutedUimTarget`) stream, None for the other kinds
        (:class:`LocalStreamError` otherwise). Open a kind of
        :data:`router.peerlink.KIND_CAPABILITY` only on a link that negotiated its
        capability: the connection refuses to send the STREAM_OPEN otherwise."""
        try:
            check_target(kind, target)
        except LocalProtocolError as e:
            raise LocalStreamError(str(e)) from None
        sid = self._next_id
        if sid > MAX_STREAM_ID:
            raise LocalStreamError("stream ids exhausted on this connection: reconnect")
        self._next_id += 2
        w = self._take_initial()
        self.streams[sid] = Stream(sid, advert_id, int(kind), True, StreamState.OPENING, target,
                                   recv_window=w, window=w, base=w)
        self._outbox.append(StreamOpen(sid, advert_id, kind, w, target))
        return sid

    def _take_initial(self) -> int:
        """The initial receive window of a new stream: ``initial_window``, less
        when the open streams' initial windows have spent ``initial_budget``."""
        w = self.initial_window
        if self.initial_budget:
            w = min(w, max(MIN_INITIAL_WINDOW, self.initial_budget - self.initial_committed))
        self.initial_committed += w
        return w

    def _forget(self, st: Stream) -> None:
        """``st`` is gone: its initial window and its growth return to the budgets."""
        if st.window:
            self.window_grown -= st.window - st.base
            self.initial_committed -= st.base

    def _pending(self, stream_id: int) -> Stream:
        st = self.streams.get(stream_id)
        if st is None or st.state is not StreamState.PENDING:
            raise LocalStreamError(f"stream {stream_id} is not waiting to be accepted")
        return st

    def accept(self, stream_id: int) -> None:
        st = self._pending(stream_id)
        st.state = StreamState.OPEN
        st.recv_window = st.window = st.base = self._take_initial()
        self._outbox.append(StreamAccept(stream_id, st.base))

    def refuse(self, stream_id: int, code: int = RefuseCode.REFUSED, reason: str = "") -> None:
        self._pending(stream_id)
        del self.streams[stream_id]
        self._outbox.append(StreamRefuse(stream_id, code, reason))

    def _sendable(self, stream_id: int) -> Stream:
        st = self.streams.get(stream_id)
        if st is None or st.state is StreamState.CLOSING:
            raise StreamClosedError(f"stream {stream_id} is closed")
        if st.state is StreamState.PENDING:
            raise LocalStreamError(f"stream {stream_id} must be accepted before sending")
        return st

    def send(self, stream_id: int, data: bytes | bytearray | memoryview,
             limit: int | None = None) -> memoryview:
        """Frame as much of ``data`` as the stream's credit allows (at most ``limit`` wire
        bytes, frame overhead included, e.g. ``OutQueue.data_space()``) into STREAM_DATA
        frames of at most ``max_frame`` bytes. Returns the unsent tail (empty when all was
        framed): send it after the next :class:`CreditAvailable`. Before the stream is
        accepted the credit is 0, so everything comes back. The frames hold views of
        read-only ``data`` (``bytes``, or a read-only view of a buffer nobody writes
        again); of a copy of writable data."""
        st = self._sendable(stream_id)
        mv = memoryview(data).cast("B")
        if not mv.readonly:
            mv = memoryview(bytes(mv))
        off, n = 0, len(mv)
        credit = st.send_credit
        while off < n and credit > 0:
            chunk = min(self.max_frame, credit, n - off)
            if limit is not None:
                chunk = min(chunk, limit - STREAM_DATA_OVERHEAD)
                if chunk <= 0:
                    break
                limit -= STREAM_DATA_OVERHEAD + chunk
            self._outbox.append(StreamData(stream_id, mv[off:off + chunk]))
            off += chunk
            credit -= chunk
        st.send_credit = credit
        st.bytes_sent += off
        return mv[off:]

    def send_whole(self, stream_id: int, data: bytes | memoryview, limit: int | None = None) -> bool:
        """Frame ``data`` (read-only: whole LBMC messages, none with extension headers)
        as one STREAM_DATA frame flagged whole (:attr:`StreamData.whole`) if the
        stream's credit, ``limit`` (wire bytes) and a frame take it all: True. False:
        nothing was framed; try again after the next :class:`CreditAvailable` if
        :meth:`whole_fits`, else send it with :meth:`send`."""
        st = self._sendable(stream_id)
        n = len(data)
        if not 0 < n <= min(st.send_credit, self.max_frame) or (
                limit is not None and n + STREAM_DATA_OVERHEAD > limit):
            return False
        mv = memoryview(data).cast("B")
        self._outbox.append(StreamData(stream_id, mv if mv.readonly else memoryview(bytes(mv)), True))
        st.send_credit -= n
        st.bytes_sent += n
        return True

    def whole_fits(self, stream_id: int, nbytes: int) -> bool:
        """Whether :meth:`send_whole` of ``nbytes`` can ever succeed on the stream: a
        frame's worth at most, and at most half the peer's window (``peer_window``, a
        lower bound of it). The peer grants credit once half its window was consumed,
        so once it consumed what it got the credit is more than half the window: a
        larger frame could wait for credit that never comes (the peer waiting for
        more bytes before it grants any)."""
        return 0 < nbytes <= self.whole_limit(stream_id)

    def whole_limit(self, stream_id: int) -> int:
        """The largest ``nbytes`` :meth:`whole_fits` takes now (0: no such stream)."""
        st = self.streams.get(stream_id)
        return 0 if st is None else min(self.max_frame, st.peer_window >> 1)

    def send_datagram(self, stream_id: int, data: bytes) -> None:
        """One DATAGRAM on an open stream (no credit involved)."""
        st = self._sendable(stream_id)
        if st.state is not StreamState.OPEN:
            raise LocalStreamError(f"stream {stream_id} is not open yet")
        if len(data) > self.max_datagram:
            raise LocalStreamError(f"datagram of {len(data)} bytes (at most {self.max_datagram})")
        st.datagrams_sent += 1
        self._outbox.append(Datagram(stream_id, bytes(data)))

    def send_datagrams(self, stream_id: int, datagrams: list[bytes]) -> DatagramBatch:
        """Several DATAGRAMs on an open stream as one :class:`DatagramBatch` (in the outbox,
        and returned)."""
        st = self._sendable(stream_id)
        if st.state is not StreamState.OPEN:
            raise LocalStreamError(f"stream {stream_id} is not open yet")
        for d in datagrams:
            if len(d) > self.max_datagram:
                raise LocalStreamError(f"datagram of {len(d)} bytes (at most {self.max_datagram})")
        st.datagrams_sent += len(datagrams)
        batch = DatagramBatch(stream_id, tuple(datagrams))
        self._outbox.append(batch)
        return batch

    def receive_datagram(self, stream_id: int, nbytes: int) -> Stream | None:
        """``receive(Datagram)`` without the frame object and event (the I/O layer's fast
        path for bursts): the open stream it is for, or None if it is refused (unknown,
        closed or not open: counted like :class:`DataRefused`)."""
        st = self.streams.get(stream_id)
        if st is None or st.state is not StreamState.OPEN:
            self.refused_frames += 1
            self.refused_bytes += nbytes
            return None
        st.datagrams_received += 1
        return st

    def send_credit(self, stream_id: int) -> int:
        """Data bytes that may be sent on the stream now (0 if it is not open)."""
        st = self.streams.get(stream_id)
        return st.send_credit if st is not None and st.state is StreamState.OPEN else 0

    def send_held(self, stream_id: int, nbytes: int, holder: object) -> HeldData:
        """Account ``nbytes`` (1 .. credit, at most ``max_frame``) of stream data that the
        I/O layer holds itself and queue one :class:`HeldData` frame for them (returned too)."""
        st = self._sendable(stream_id)
        if not 0 < nbytes <= min(st.send_credit, self.max_frame):
            raise LocalStreamError(
                f"stream {stream_id}: {nbytes} held bytes with {st.send_credit} bytes of credit "
                f"(frames of at most {self.max_frame})")
        st.send_credit -= nbytes
        st.bytes_sent += nbytes
        frame = HeldData(stream_id, nbytes, holder)
        self._outbox.append(frame)
        return frame

    def consumed(self, stream_id: int, nbytes: int) -> None:
        """The application passed on ``nbytes`` received bytes; grants the peer more credit
        (STREAM_CREDIT) once at least half the stream's window has been consumed. Ignored for
        streams that are gone.

        Window growth (``max_window`` above ``initial_window``): when a grant is due and the
        consumer keeps up (what it has not consumed yet is at most a quarter of the window),
        the window doubles (up to ``max_window``, and as far as ``window_budget``, shared by
        all the streams of the table, allows) and the grant carries the increase. A stream
        therefore never has more than ``max_window`` bytes in flight or held here, and the
        table never more than its streams' initial windows plus ``window_budget``."""
        st = self.streams.get(stream_id)
        if st is None or st.state is not StreamState.OPEN:
            return
        if not 0 <= nbytes <= st.unconsumed:
            raise LocalStreamError(
                f"stream {stream_id}: consumed {nbytes} bytes but only {st.unconsumed} are unconsumed")
        st.unconsumed -= nbytes
        st.ungranted += nbytes
        window = st.window
        if st.ungranted >= max(1, window // 2):
            grant = st.ungranted
            if window < self.max_window and st.unconsumed <= window // 4:
                extra = min(window, self.max_window - window, self.window_budget - self.window_grown)
                if extra > 0:
                    st.window = window + extra
                    self.window_grown += extra
                    grant += extra
            self._outbox.append(StreamCredit(stream_id, grant))
            st.recv_window += grant
            st.ungranted = 0

    def close(self, stream_id: int, code: int = CloseCode.NORMAL) -> bool:
        """Close a stream (both directions); the id is freed when the peer's STREAM_CLOSE
        arrives, data arriving meanwhile is discarded. False if it was already closed/closing."""
        st = self.streams.get(stream_id)
        if st is None or st.state is StreamState.CLOSING:
            return False
        st.state = StreamState.CLOSING
        self._outbox.append(StreamClose(stream_id, code))
        return True

    # ---------------------------------------------------------------- incoming

    def receive(self, frame: Frame) -> list[StreamEvent]:
        """Handle one incoming stream frame (any of :data:`STREAM_FRAMES`)."""
        handler = self._handlers.get(type(frame))
        if handler is None:
            raise TypeError(f"not a stream frame: {frame!r}")
        return handler(self, frame)

    def _on_open(self, f: StreamOpen) -> list[StreamEvent]:
        sid = f.stream_id
        problem = None
        if sid == 0 or sid % 2 != self._peer_parity:
            problem = (RefuseCode.BAD_STREAM_ID, f"stream id {sid} does not belong to the peer "
                       f"({'even' if self._peer_parity == 0 else 'odd'} ids, not 0)")
        elif sid <= self._last_peer_id:
            problem = (RefuseCode.BAD_STREAM_ID,
                       f"stream id {sid} reused (ids must increase; last was {self._last_peer_id})")
        else:
            self._last_peer_id = sid
            if len(self.streams) >= self.max_streams:
                problem = (RefuseCode.TOO_MANY_STREAMS,
                           f"{len(self.streams)} stream(s) already open (limit {self.max_streams})")
            elif int(f.kind) not in self.kinds:
                problem = (RefuseCode.UNSUPPORTED_KIND, f"stream kind {int(f.kind)} not supported")
        if problem is not None:
            if sid not in self.streams:  # never disturb an existing stream
                self._outbox.append(StreamRefuse(sid, *problem))
            return [StreamError(sid, problem[1])]
        self.streams[sid] = Stream(sid, f.advert_id, f.kind, False, StreamState.PENDING, f.target,
                                   send_credit=f.initial_credit, peer_window=f.initial_credit)
        return [StreamOpened(sid, f.advert_id, f.kind, f.target)]

    def _on_accept(self, f: StreamAccept) -> list[StreamEvent]:
        st = self.streams.get(f.stream_id)
        if st is not None and st.local and st.state is StreamState.OPENING:
            st.state = StreamState.OPEN
            st.send_credit = st.peer_window = f.initial_credit
            return [StreamAccepted(st.id, st.send_credit)]
        if st is not None and st.state is StreamState.CLOSING:
            return []  # we cancelled it meanwhile; its STREAM_CLOSE will follow
        self.ignored_frames += 1
        return [StreamError(f.stream_id, "STREAM_ACCEPT for a stream we did not open")]

    def _on_refuse(self, f: StreamRefuse) -> list[StreamEvent]:
        st = self.streams.get(f.stream_id)
        if st is None or not st.local or st.state not in (StreamState.OPENING, StreamState.CLOSING):
            self.ignored_frames += 1
            return []
        del self.streams[f.stream_id]
        self._forget(st)
        if st.state is StreamState.CLOSING:
            return []
        return [StreamRefused(f.stream_id, f.code, f.reason)]

    def _refused(self, sid: int, n: int, reason: str) -> list[StreamEvent]:
        self.refused_frames += 1
        self.refused_bytes += n
        return [DataRefused(sid, n, reason)]

    def _receivable(self, sid: int, n: int) -> Stream | list[StreamEvent]:
        st = self.streams.get(sid)
        if st is None:
            return self._refused(sid, n, "unknown or closed stream")
        if st.state is StreamState.CLOSING:
            return self._refused(sid, n, "stream closed locally")
        if st.state is not StreamState.OPEN:
            return self._refused(sid, n, f"stream not open ({st.state.value})")
        return st

    def _take_data(self, sid: int, n: int) -> Stream | list[StreamEvent]:
        """Checks and credit accounting of ``n`` incoming STREAM_DATA bytes."""
        st = self._receivable(sid, n)
        if isinstance(st, list):
            return st
        if n > st.recv_window:
            reason = f"peer sent {n} bytes with {st.recv_window} bytes of credit left"
            self.close(st.id, CloseCode.FLOW_CONTROL)
            self.refused_frames += 1
            self.refused_bytes += n
            return [StreamError(st.id, reason)]
        st.recv_window -= n
        st.unconsumed += n
        st.bytes_received += n
        return st

    def _on_data(self, f: StreamData) -> list[StreamEvent]:
        st = self._take_data(f.stream_id, len(f.data))
        if isinstance(st, list):
            return st
        return [DataReceived(st.id, f.data, f.whole)]

    def receive_held(self, stream_id: int, nbytes: int) -> list[StreamEvent]:
        """``receive(StreamData)`` for a frame of ``nbytes`` data bytes that the I/O layer
        moves itself (zero copy): :class:`DataArriving` when they may be delivered, else the
        refusal events of :meth:`receive` (the I/O layer discards the bytes)."""
        st = self._take_data(stream_id, nbytes)
        if isinstance(st, list):
            return st
        return [DataArriving(st.id, nbytes)]

    def _on_datagram(self, f: Datagram) -> list[StreamEvent]:
        st = self._receivable(f.stream_id, len(f.data))
        if isinstance(st, list):
            return st
        st.datagrams_received += 1
        return [DatagramReceived(st.id, f.data)]

    def _on_credit(self, f: StreamCredit) -> list[StreamEvent]:
        st = self.streams.get(f.stream_id)
        if st is None or st.state is not StreamState.OPEN:
            self.ignored_frames += 1  # crossed our close, or a confused peer: harmless
            return []
        if f.increment == 0:
            return []
        st.send_credit += f.increment
        if st.send_credit > st.peer_window:
            st.peer_window = st.send_credit  # (its window grew: a grant carried the growth)
        return [CreditAvailable(st.id, st.send_credit)]

    def _on_close(self, f: StreamClose) -> list[StreamEvent]:
        st = self.streams.pop(f.stream_id, None)
        if st is None:
            self.ignored_frames += 1
            return []
        self._forget(st)
        if st.state is StreamState.CLOSING:
            return []  # the answer to our close (or a crossing close): the id is free
        self._outbox.append(StreamClose(f.stream_id, CloseCode.NORMAL))
        return [StreamClosed(f.stream_id, f.code)]

    _handlers = {
        StreamOpen: _on_open, StreamAccept: _on_accept, StreamRefuse: _on_refuse,
        StreamData: _on_data, Datagram: _on_datagram, StreamCredit: _on_credit,
        StreamClose: _on_close,
    }
