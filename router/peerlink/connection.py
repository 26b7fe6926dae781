"""The peer-link connection state machine, sans-IO: :class:`PeerConnection`
(handshake, keepalive/RTT, dead-peer detection, graceful disconnect, which frame
may be sent when; the events it returns: :mod:`router.peerlink.events`) and the
zero-copy fast paths for STREAM_DATA heads (:meth:`PeerConnection.send_data_head`,
:meth:`PeerConnection.receive_data_head`), which apply the same checks."""

from __future__ import annotations

import dataclasses
import math
import secrets
import struct
from collections.abc import Callable

from .codec import (
    FrameReader,
    RawFrame,
    decode_payload,
    encode,
)
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
    StreamAccept,
    StreamClose,
    StreamCredit,
    StreamData,
    StreamOpen,
    StreamRefuse,
    Topology,
)
from .handshake import judge_peer, version_reason
from .wire import (
    FLAG_IGNORABLE,
    FLAG_WHOLE_MESSAGES,
    KIND_CAPABILITY,
    LARGE_PAYLOAD,
    MAGIC,
    MAX_PAYLOAD,
    PROTOCOL_VERSION,
    U64,
    WIRE_VERSION,
    Capability,
    ConnectCode,
    FrameDecodeError,
    FrameEncodeError,
    FrameType,
    LocalProtocolError,
    PayloadReader,
    State,
    StreamKind,
)

# (a plain int: ``int & IntFlag`` goes through enum, a few microseconds on a per-frame path)
_WHOLE_MESSAGES = int(Capability.WHOLE_MESSAGES)

# --------------------------------------------------------------------------- connection

# frames the application passes to send(); the rest are produced by the connection itself
_APP_FRAMES = (Interest, Advertisement, Topology, StreamOpen, StreamAccept, StreamRefuse, StreamData,
               StreamCredit, StreamClose, Datagram)
# what a side that is "done sending" (it sent DISCONNECT_REQUEST or DISCONNECT_RESPONSE) may
# still send: frames that serve the data it is still receiving
_RECEIVE_SIDE = (StreamCredit, StreamClose, StreamRefuse)
# frames that may only be used when both sides announced the capability
_NEEDS_CAPABILITY = {cls: Capability.STREAMS for cls in (
    StreamOpen, StreamAccept, StreamRefuse, StreamData, StreamCredit, StreamClose)}
_NEEDS_CAPABILITY[Datagram] = Capability.DATAGRAMS
_NEEDS_CAPABILITY[Topology] = Capability.ROUTING
_DATA_HEAD = struct.Struct(">4sBBBBII")  # a STREAM_DATA frame's header and stream id
_LEN4 = struct.pack(">I", 4)
U32 = 0xFFFFFFFF

AcceptFn = Callable[[PeerInfo], tuple[bool, str]]


class PeerConnection:
    """One peer-link TCP connection, either side. See the module doc for the byte rule.

    ``accept(peer_info) -> (ok, reason)`` is consulted (after the built-in checks: protocol
    major version, overlapping or invalid domain ids, same router name) by the acceptor
    before it answers CONNECT_REQUEST, and by the initiator on the CONNECT_RESPONSE.
    Times are seconds on any monotonic clock; ``keepalive_interval=0`` disables keepalives
    and ``dead_after=0`` disables dead-peer detection. ``keepalive_idle`` (the DRO's
    ``idle="yes"``): a keepalive only after ``keepalive_interval`` with nothing sent;
    False: one every ``keepalive_interval`` whatever else is sent.
    """

    def __init__(self, role: str, identity: RouterIdentity, *, accept: AcceptFn | None = None,
                 keepalive_interval: float = 5.0, dead_after: float = 15.0,
                 handshake_timeout: float = 5.0, disconnect_timeout: float = 5.0,
                 max_payload: int = MAX_PAYLOAD, nonce: int | None = None,
                 keepalive_idle: bool = True, large_payload: int = LARGE_PAYLOAD) -> None:
        if role not in ("initiator", "acceptor"):
            raise ValueError(f"role must be 'initiator' or 'acceptor', not {role!r}")
        self.role = role
        self.identity = identity
        self.accept_fn = accept
        self.keepalive_interval = keepalive_interval
        self.keepalive_idle = keepalive_idle
        self.dead_after = dead_after
        self.handshake_timeout = handshake_timeout
        self.disconnect_timeout = disconnect_timeout
        if large_payload < max_payload:
            raise ValueError(f"large_payload ({large_payload}) must be at least max_payload ({max_payload})")
        self.max_payload = max_payload  # the limit now (raised to large_payload once connected with LARGE_FRAMES)
        self.large_payload = large_payload
        self.nonce = secrets.randbits(64) if nonce is None else nonce
        self.state = State.IDLE
        self.peer: PeerInfo | None = None
        self.capabilities = 0  # negotiated, once connected
        self.has_streams = False  # capability STREAMS negotiated (with ``capabilities``)
        self.rtt = RttStats()
        self.stats = LinkStats()
        self.close_reason: str | None = None
        self._reader = FrameReader(max_payload)
        self._out = bytearray()
        self._last_sent = 0.0
        self._last_recv = 0.0
        self._last_ka = 0.0  # last keepalive sent (or the connection), for keepalive_idle False
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
        all pending outgoing bytes. :class:`LocalProtocolError` if not allowed now. An
        ADVERTISEMENT's session goes only to a peer that has capability SESSIONS, its origin
        session id only to one that has ORIGIN_SID, its TIR options only to one that has
        TIR_OPTIONS; a STREAM_DATA's FLAG_WHOLE_MESSAGES only to one that has WHOLE_MESSAGES."""
        self._check_send(frame)
        if type(frame) is Advertisement:
            if frame.session and not self.capabilities & Capability.SESSIONS:
                frame = dataclasses.replace(frame, session=0, origin_session_id=0)
            elif frame.origin_session_id and not self.capabilities & Capability.ORIGIN_SID:
                frame = dataclasses.replace(frame, origin_session_id=0)
            if frame.tir_options and not self.capabilities & Capability.TIR_OPTIONS:
                frame = dataclasses.replace(frame, tir_options=b"")
        elif type(frame) is StreamData and frame.whole and not self.capabilities & Capability.WHOLE_MESSAGES:
            frame = StreamData(frame.stream_id, frame.data)
        self._emit(frame, now)
        if isinstance(frame, DisconnectRequest):
            self._req_sent, self._req_reason = True, frame.reason
            self._req_deadline = now + self.disconnect_timeout
            self.state = State.DISCONNECTING
        elif isinstance(frame, DisconnectResponse):
            self._resp_sent = True
            self._resp_deadline = now + self.disconnect_timeout
        return self.data_to_send()

    def send_data_head(self, stream_id: int, nbytes: int, now: float, whole: bool = False) -> bytes:
        """Zero copy: the pending outgoing bytes and then the 16-byte head (header and stream
        id, big-endian) of a STREAM_DATA frame of ``nbytes`` data bytes that the caller
        writes right after it (``whole``: flagged FLAG_WHOLE_MESSAGES, if the peer has
        capability WHOLE_MESSAGES). Checked and counted as ``send(StreamData(...))`` of those
        bytes would be (:class:`LocalProtocolError` if not allowed now, FrameEncodeError
        beyond ``max_payload``), without building the frame."""
        if self.state is not State.CONNECTED or not self.has_streams:
            self._check_send(StreamData(stream_id, b""))
        if not 0 <= stream_id <= U32 or not 0 <= nbytes <= self.max_payload - 4:
            raise FrameEncodeError(f"STREAM_DATA of {nbytes} bytes for stream {stream_id}: "
                                   f"not encodable (payload limit {self.max_payload})")
        flags = FLAG_WHOLE_MESSAGES if whole and self.capabilities & _WHOLE_MESSAGES else 0
        head = _DATA_HEAD.pack(MAGIC, WIRE_VERSION, FrameType.STREAM_DATA, flags, 0, 4 + nbytes, stream_id)
        self._last_sent = now
        st = self.stats
        st.frames_sent += 1
        st.bytes_sent += _DATA_HEAD.size
        if not self._out:
            return head
        self._out += head
        return self.data_to_send()

    def receive_data_head(self, head: bytes, now: float) -> list[Frame | Event] | None:
        """Zero copy: the 16-byte head (header and stream id) of a STREAM_DATA frame whose
        data bytes the caller moves itself. None when the frame is accepted: counted, and
        the peer's liveness updated, as ``receive_data`` of that frame would (its data bytes
        are the caller's to count in ``stats.bytes_received``); otherwise what
        ``receive_data`` returns for the head as an empty STREAM_DATA (a refusal, which ends
        the connection, or the empty frame when the connection is not connected)."""
        if len(head) != _DATA_HEAD.size:
            return self.receive_data(head, now)
        magic, ver, ftype, _, _, length, _ = _DATA_HEAD.unpack(head)
        if not 4 <= length <= self.max_payload:
            return self.receive_data(head, now)  # refused at the header
        if (self.state is State.CONNECTED and self.has_streams and not self._reader.buffered
                and magic == MAGIC and ver == WIRE_VERSION and ftype == FrameType.STREAM_DATA):
            self._last_recv = now
            st = self.stats
            st.bytes_received += _DATA_HEAD.size
            st.frames_received += 1
            st.by_type_received["STREAM_DATA"] = st.by_type_received.get("STREAM_DATA", 0) + 1
            return None
        return self.receive_data(head[:8] + _LEN4 + head[12:], now)

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
            elif self.keepalive_interval > 0 and now >= self._keepalive_base() + self.keepalive_interval:
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
                d = min(d, self._keepalive_base() + self.keepalive_interval)
            return d
        return math.inf

    # ---------------------------------------------------------------- sending

    def _emit(self, frame: Frame, now: float) -> None:
        b = encode(frame, max_payload=self.max_payload)
        self._out += b
        self._last_sent = now
        self.stats.frames_sent += 1
        self.stats.bytes_sent += len(b)

    def _keepalive_base(self) -> float:
        return self._last_sent if self.keepalive_idle else self._last_ka

    def _send_keepalive(self, now: float) -> None:
        self._last_ka = now
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
            if type(frame) is StreamOpen and st in (State.CONNECTED, State.DISCONNECTING):
                cap = KIND_CAPABILITY.get(int(frame.kind))
                if cap is not None and not self.capabilities & cap:
                    raise LocalProtocolError(
                        f"cannot open a stream of kind {_kind_name(frame.kind)}: capability {cap.name} "
                        "was not negotiated with this peer (it would refuse the stream, or, before "
                        "that kind existed, close the link)")
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
                                 version_reason(major, minor), now)
                else:  # its code and reason sit in the frozen leading fields too
                    r = PayloadReader(raw.payload, "CONNECT_RESPONSE")
                    r.pos = 4
                    try:
                        code, said = r.u16(), r.string()
                    except FrameDecodeError:
                        code, said = ConnectCode.ACCEPTED, ""
                    reason = version_reason(major, minor) + (f"; the peer says: {said}" if said else "")
                    self._terminate(events, Rejected(reason, ConnectCode.VERSION_MISMATCH,
                                                     by_peer=code != ConnectCode.ACCEPTED))
                return
        # (a header flag means something only with the capability that defines it)
        flags = raw.flags & FLAG_WHOLE_MESSAGES if self.capabilities & _WHOLE_MESSAGES else 0
        frame = decode_payload(raw.type, raw.payload, flags)
        if self.state is State.CONNECTING:
            self._handle_handshake(frame, now, events)
        else:
            self._handle_connected(frame, now, events)

    def _handle_handshake(self, frame: Frame, now: float, events: list) -> None:
        if isinstance(frame, ConnectRequest):
            peer = PeerInfo(frame.name, frame.domains, frame.nonce, frame.capabilities, frame.version)
            self.peer = peer
            code, reason = judge_peer(self.identity, peer, self.accept_fn)
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
            code, reason = judge_peer(self.identity, peer, self.accept_fn)
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
        self._last_ka = max(self._last_sent, self._last_recv)
        self._hs_deadline = math.inf
        self.capabilities = self.identity.capabilities & self.peer.capabilities
        self.has_streams = bool(self.capabilities & Capability.STREAMS)
        if self.capabilities & Capability.LARGE_FRAMES:
            # (from the next frame on, both ways: each side raises its limit as it connects, and
            # the peer sends a large frame only once it is connected, after its last handshake frame)
            self.max_payload = self._reader.max_payload = self.large_payload
        events.append(Connected(self.peer, self.capabilities))

    def _response(self, code: int, reason: str) -> ConnectResponse:
        me = self.identity
        return ConnectResponse(me.name, me.domains, self.nonce, code, reason, me.capabilities)

    def _refuse(self, events: list, code: int, reason: str, now: float) -> None:
        """Acceptor: answer with a refusing CONNECT_RESPONSE and close."""
        self._emit(self._response(code, reason), now)
        self._terminate(events, Rejected(reason, code, by_peer=False), keep_output=True)

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
            if type(frame) is Advertisement and frame.session and not self.capabilities & Capability.SESSIONS:
                raise FrameDecodeError("ADVERTISEMENT with a session but capability SESSIONS was not negotiated")
            if type(frame) is Advertisement and frame.origin_session_id \
                    and not self.capabilities & Capability.ORIGIN_SID:
                raise FrameDecodeError("ADVERTISEMENT with an origin session id but capability ORIGIN_SID "
                                       "was not negotiated")
            if type(frame) is Advertisement and frame.tir_options \
                    and not self.capabilities & Capability.TIR_OPTIONS:
                raise FrameDecodeError("ADVERTISEMENT with TIR options but capability TIR_OPTIONS "
                                       "was not negotiated")
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


def _kind_name(kind: int) -> str:
    try:
        return StreamKind(kind).name
    except ValueError:
        return f"0x{int(kind):02x}"

