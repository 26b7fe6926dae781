"""The router's peer link, sans-IO: framing, handshake, keepalive, disconnect, garbage,
writer queue, and per-stream flow control (router/peerlink/).

Time is explicit (``now`` arguments); the two trio tests at the end drive the same objects
over a memory stream with trio's autojump clock and over a loopback TCP connection.
"""

from __future__ import annotations

import math
import random
import struct

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.peerlink import (
    FLAG_IGNORABLE,
    FRAME_TYPES,
    HEADER_SIZE,
    KIND_TARGET,
    MAX_PAYLOAD,
    Advertisement,
    Capability,
    Closed,
    ConnectCode,
    Connected,
    ConnectionLost,
    ConnectOk,
    ConnectRequest,
    ConnectResponse,
    Datagram,
    DisconnectOk,
    DisconnectRequest,
    DisconnectRequested,
    DisconnectResponse,
    FrameDecodeError,
    FrameEncodeError,
    FrameType,
    Interest,
    InterestAction,
    Keepalive,
    KeepaliveAck,
    LocalProtocolError,
    OutQueue,
    OutQueueOverflow,
    PatternType,
    PeerConnection,
    ProtocolError,
    Rejected,
    RouterIdentity,
    State,
    StreamAccept,
    StreamClose,
    StreamCredit,
    StreamData,
    StreamKind,
    StreamOpen,
    StreamRefuse,
    Terminated,
    Timeout,
    Topology,
    decode,
    encode,
    encode_raw,
)
from router.peerlink.streams import (
    INITIAL_WINDOW,
    MAX_FRAME_DATA,
    MIN_INITIAL_WINDOW,
    STREAM_FRAMES,
    CreditAvailable,
    DatagramReceived,
    DataReceived,
    DataRefused,
    LocalStreamError,
    StreamAccepted,
    StreamClosed,
    StreamClosedError,
    StreamError,
    StreamOpened,
    StreamRefused,
    StreamState,
    StreamTable,
)
from tests.router.helpers import (
    A_ID,
    B_ID,
    connected_peers,
    deliver_and_answer,
    peer_handshake,
    peer_pair,
)

OTID = bytes(range(32))


# --------------------------------------------------------------------------- handshake


@pytest.mark.parametrize("a_caps, b_caps", [
    (3, 3), (Capability.STREAMS, 3), (3, Capability.DATAGRAMS), (0x80000003, 0x40000001)])
def test_handshake_both_sides_get_connected(a_caps, b_caps):
    a, b = peer_pair(RouterIdentity("router-a", (1, 2), a_caps), RouterIdentity("router-b", (3,), b_caps))
    assert a.state is b.state is State.IDLE
    b.start(0.0)
    req = a.start(0.0)
    assert a.state is b.state is State.CONNECTING
    assert decode(req) == ConnectRequest("router-a", (1, 2), 0xA, a_caps, (1, 0))
    assert b.receive_data(req, 0.1) == []  # the acceptor answers, but is not connected yet
    resp = b.data_to_send()
    assert decode(resp) == ConnectResponse("router-b", (3,), 0xB, 0, "", b_caps)
    ea = a.receive_data(resp, 0.2)
    assert ea == [Connected(a.peer, a_caps & b_caps)]
    assert ea[0].peer.name == "router-b" and ea[0].peer.domains == (3,) and ea[0].peer.nonce == 0xB
    ok = a.data_to_send()
    assert decode(ok) == ConnectOk()
    eb = b.receive_data(ok, 0.3)
    assert eb == [Connected(b.peer, a_caps & b_caps)] and b.peer.name == "router-a"
    assert a.state is b.state is State.CONNECTED
    assert a.capabilities == b.capabilities == a_caps & b_caps
    assert math.isfinite(a.next_deadline()) and math.isfinite(b.next_deadline())


def test_an_advertisement_names_its_session_only_to_a_peer_with_sessions():
    f = Advertisement("md.a", 1, bytes(32), 0, 7, session=0x0123456789ABCDEF)
    assert decode(encode(f)) == f and encode(decode(encode(f))) == encode(f)
    plain = Advertisement("md.a", 1, bytes(32), 0, 7)
    assert len(encode(f)) == len(encode(plain)) + 8 and decode(encode(plain)).session == 0
    # the trailer is never 0 (0 is said by leaving it out), nor of another length
    with pytest.raises(FrameDecodeError, match="session 0"):
        decode(_with_payload(plain, plain.payload() + bytes(8)))
    with pytest.raises(FrameDecodeError):
        decode(_with_payload(plain, plain.payload() + b"\x01\x02\x03"))
    # negotiated: carried; a peer without SESSIONS: left out when sending, an error when received
    a, b = peer_pair()
    peer_handshake(a, b)
    assert a.capabilities & Capability.SESSIONS
    assert b.receive_data(a.send(f, 1.0), 1.0) == [f]
    a, b = peer_pair(RouterIdentity("router-a", (1,), Capability.STREAMS), B_ID)
    peer_handshake(a, b)
    assert b.receive_data(a.send(f, 1.0), 1.0) == [plain]
    evs = a.receive_data(encode(f), 1.0)
    assert isinstance(evs[0], ProtocolError) and "SESSIONS was not negotiated" in evs[0].reason


def test_an_advertisement_carries_the_origin_session_id_only_to_a_peer_with_origin_sid():
    f = Advertisement("md.a", 1, bytes(32), 0, 7, session=5, origin_session_id=0xCAFEF00D)
    assert decode(encode(f)) == f
    with_session = Advertisement("md.a", 1, bytes(32), 0, 7, session=5)
    assert len(encode(f)) == len(encode(with_session)) + 4
    with pytest.raises(FrameEncodeError, match="goes with a session"):
        encode(Advertisement("md.a", 1, bytes(32), 0, 7, origin_session_id=9))
    with pytest.raises(FrameDecodeError, match="origin session id 0"):
        decode(_with_payload(with_session, with_session.payload() + bytes(4)))
    a, b = peer_pair()
    peer_handshake(a, b)
    assert a.capabilities & Capability.ORIGIN_SID
    assert b.receive_data(a.send(f, 1.0), 1.0) == [f]
    old = Capability.STREAMS | Capability.SESSIONS  # a router before ORIGIN_SID
    a, b = peer_pair(RouterIdentity("router-a", (1,), old), B_ID)
    peer_handshake(a, b)
    assert b.receive_data(a.send(f, 1.0), 1.0) == [with_session]
    evs = a.receive_data(encode(f), 1.0)
    assert isinstance(evs[0], ProtocolError) and "ORIGIN_SID was not negotiated" in evs[0].reason


def _with_payload(f, payload: bytes) -> bytes:
    return encode_raw(int(f.TYPE), payload)


def test_frames_of_a_capability_not_negotiated_are_refused():
    a, b = peer_pair(RouterIdentity("router-a", (1,), Capability.STREAMS), B_ID)
    peer_handshake(a, b)
    assert a.capabilities == b.capabilities == Capability.STREAMS
    with pytest.raises(LocalProtocolError, match="capability DATAGRAMS"):
        a.send(Datagram(1, b"x"), 1.0)
    with pytest.raises(LocalProtocolError, match="capability DATAGRAMS"):
        b.send(Datagram(2, b"x"), 1.0)
    assert b.receive_data(a.send(StreamOpen(1, 1), 1.0), 1.0) == [StreamOpen(1, 1)]
    evs = a.receive_data(encode(Datagram(2, b"x")), 1.0)
    assert isinstance(evs[0], ProtocolError) and "DATAGRAMS was not negotiated" in evs[0].reason


def test_acceptor_starts_implicitly_and_handshake_survives_one_byte_chunks():
    a, b = peer_pair()
    req = a.start(0.0)
    evs = []
    for i in range(len(req)):  # b never called start(): receive_data does it
        evs += b.receive_data(req[i:i + 1], 0.0)
    assert evs == [] and b.state is State.CONNECTING
    resp = b.data_to_send()
    for i in range(len(resp)):
        evs += a.receive_data(resp[i:i + 1], 0.0)
    assert [type(e) for e in evs] == [Connected]
    assert [type(e) for e in b.receive_data(a.data_to_send(), 0.0)] == [Connected]


def test_reject_same_domain_id_with_reason():
    a, b = peer_pair(RouterIdentity("router-a", (1, 5)), RouterIdentity("router-b", (5, 7)))
    ea, eb = peer_handshake(a, b)
    assert a.state is b.state is State.CLOSED
    assert len(eb) == 1 and isinstance(eb[0], Rejected) and not eb[0].by_peer
    assert len(ea) == 1 and isinstance(ea[0], Rejected) and ea[0].by_peer
    assert ea[0].code == eb[0].code == ConnectCode.DOMAIN_CONFLICT
    assert "domain id 5" in ea[0].reason and "router-b" in ea[0].reason
    assert isinstance(ea[0], Terminated) and a.close_reason == ea[0].reason
    with pytest.raises(LocalProtocolError):
        a.send(Interest(InterestAction.ADD, "t", 1), 1.0)


@pytest.mark.parametrize("b_identity, code, words", [
    (RouterIdentity("router-a", (3,)), ConnectCode.DUPLICATE_NAME, "named 'router-a'"),
    (RouterIdentity("router-b", (0,)), ConnectCode.BAD_REQUEST, "domain id 0"),
])
def test_reject_duplicate_name_and_bad_identity(b_identity, code, words):
    # the initiator announces the faulty identity; the acceptor (A_ID) refuses it
    b, a = PeerConnection("initiator", b_identity), PeerConnection("acceptor", A_ID)
    eb, ea = peer_handshake(b, a)
    assert eb[0].code == code and words in eb[0].reason and eb[0].by_peer


def test_reject_by_accept_callback():
    seen = []

    def accept(peer):
        seen.append(peer)
        return False, "router-a is not on the allow list"

    a, b = peer_pair(b_accept=accept)
    ea, eb = peer_handshake(a, b)
    assert seen[0].name == "router-a" and seen[0].domains == (1, 2)
    assert ea == [Rejected("peer 'router-b' refused the connection: router-a is not on the allow list",
                           ConnectCode.REFUSED, True)]


def test_accept_callback_that_raises_is_a_refusal_not_a_crash():
    a, b = peer_pair(b_accept=lambda peer: 1 / 0)
    ea, eb = peer_handshake(a, b)
    assert ea[0].code == ConnectCode.REFUSED and "ZeroDivisionError" in ea[0].reason


def test_initiator_may_refuse_the_response_and_acceptor_times_out():
    a, b = peer_pair(a_accept=lambda peer: (False, "wrong peer"))
    ea, eb = peer_handshake(a, b)
    assert ea == [Rejected("wrong peer", ConnectCode.REFUSED, by_peer=False)]
    assert a.data_to_send() == b"" and a.state is State.CLOSED
    assert eb == [] and b.state is State.CONNECTING and b.next_deadline() == 5.0
    assert b.tick(4.9) == (b"", [])
    _, evs = b.tick(5.0)
    assert isinstance(evs[0], Timeout) and evs[0].phase == "handshake" and b.state is State.CLOSED


def _request_payload(major: int, minor: int, rest: bytes) -> bytes:
    return encode_raw(FrameType.CONNECT_REQUEST, struct.pack(">HH", major, minor) + rest)


@pytest.mark.parametrize("rest", [
    ConnectRequest("x", (9,), 1).payload()[4:],  # a version-1 layout with a version-2 number
    b"\xff" * 7,  # a future layout we cannot parse
])
def test_higher_major_version_is_rejected_with_a_reason(rest):
    b = PeerConnection("acceptor", B_ID)
    evs = b.receive_data(_request_payload(2, 3, rest), 0.0)
    assert evs[0].code == ConnectCode.VERSION_MISMATCH and "higher major" in evs[0].reason
    resp = decode(b.data_to_send())
    assert isinstance(resp, ConnectResponse) and not resp.accepted
    assert resp.code == ConnectCode.VERSION_MISMATCH and "2.3" in resp.reason
    # ... and a version-1 initiator reading a version-2 refusal still gets the peer's reason
    a = PeerConnection("initiator", A_ID)
    a.start(0.0)
    v2 = struct.pack(">HHH", 2, 0, 2) + struct.pack(">H", 5) + b"old!!" + b"\x01\x02"
    evs = a.receive_data(encode_raw(FrameType.CONNECT_RESPONSE, v2), 0.0)
    assert isinstance(evs[0], Rejected) and evs[0].by_peer and "the peer says: old!!" in evs[0].reason


def test_minor_version_and_trailing_handshake_bytes_are_accepted():
    b = PeerConnection("acceptor", B_ID)
    payload = ConnectRequest("router-a", (1,), 7, 3, (1, 9)).payload() + b"future fields"
    assert b.receive_data(encode_raw(FrameType.CONNECT_REQUEST, payload), 0.0) == []
    assert decode(b.data_to_send()).accepted and b.peer.version == (1, 9)


@pytest.mark.parametrize("role", ["initiator", "acceptor"])
def test_handshake_timeout(role):
    c = PeerConnection(role, A_ID)
    c.start(10.0)
    assert c.next_deadline() == 15.0
    assert c.tick(14.99) == (b"", [])
    _, evs = c.tick(15.0)
    assert evs == [Timeout("handshake did not complete within 5 s", "handshake")]
    assert c.state is State.CLOSED and c.next_deadline() == math.inf


def test_wrong_frame_during_handshake_is_a_protocol_error():
    b = PeerConnection("acceptor", B_ID)
    evs = b.receive_data(encode(Interest(InterestAction.ADD, "t", 1)), 0.0)
    assert isinstance(evs[0], ProtocolError) and "expected CONNECT_REQUEST" in evs[0].reason
    a = PeerConnection("initiator", A_ID)
    a.start(0.0)
    # refused at the header, before the announced 1 MiB payload has arrived
    evs = a.receive_data(encode_raw(FrameType.STREAM_DATA, b"x" * MAX_PAYLOAD)[:HEADER_SIZE], 0.0)
    assert isinstance(evs[0], ProtocolError) and "expected CONNECT_RESPONSE" in evs[0].reason


def test_unknown_type_before_handshake_is_an_error_even_if_ignorable():
    b = PeerConnection("acceptor", B_ID)
    evs = b.receive_data(encode_raw(0x7E, b"", FLAG_IGNORABLE), 0.0)
    assert isinstance(evs[0], ProtocolError) and "unknown frame type 0x7e" in evs[0].reason


def test_handshake_frames_after_the_handshake_are_errors():
    a, b = connected_peers()
    evs = b.receive_data(encode(ConnectRequest("x", (9,), 1)), 1.0)
    assert isinstance(evs[0], ProtocolError) and "after the handshake" in evs[0].reason


# --------------------------------------------------------------------------- keepalive


def test_keepalive_only_when_idle_answered_and_rtt():
    a, b = connected_peers()
    ka_times = []
    for t in range(1, 21):  # a sends something every second: it never needs a keepalive
        data = a.send(Interest(InterestAction.REFRESH, "md.x", 1), float(t))
        out, evs = a.tick(float(t))
        assert out == b"" and evs == []
        deliver_and_answer(a, b, data, float(t))
        out, evs = b.tick(float(t))  # b only receives: it keeps its side alive
        assert evs == []
        if out:
            assert isinstance(decode(out), Keepalive)
            ka_times.append(t)
            assert deliver_and_answer(b, a, out, float(t)) == []  # answered at once; no event for a
    assert ka_times == [5, 10, 15, 20]
    assert a.stats.keepalives_sent == 0 and b.stats.keepalives_sent == 4
    assert b.rtt.count == 4 and b.rtt.last == 0.0
    # now a falls silent too: b's next keepalive, answered 50 ms later
    assert b.next_deadline() == 25.0
    out, _ = b.tick(25.0)
    ka = decode(out)
    assert isinstance(ka, Keepalive) and ka.seq == 5 and ka.timestamp_ns == 25 * 10**9
    assert a.receive_data(out, 25.03) == []  # keepalives are link business: no event
    ack = a.data_to_send()
    assert decode(ack) == KeepaliveAck(ka.seq, ka.timestamp_ns)
    assert b.receive_data(ack, 25.05) == []
    assert b.rtt.count == 5 and b.rtt.last == pytest.approx(0.05) and b.rtt.last_at == 25.05
    assert b.rtt.min == 0.0 and b.rtt.max == b.rtt.last and b.rtt.mean == pytest.approx(0.01)
    assert b.stats.keepalives_answered == 5
    # an ack of nothing we sent is ignored
    b.receive_data(encode(KeepaliveAck(99, 1)), 25.1)
    assert b.stats.unmatched_acks == 1 and b.rtt.count == 5 and b.state is State.CONNECTED


def test_keepalive_is_due_exactly_after_the_idle_interval():
    a, b = connected_peers(keepalive_interval=2.0)
    a.send(Interest(InterestAction.ADD, "t", 1), 3.0)
    assert a.next_deadline() == 5.0
    assert a.tick(4.999)[0] == b""
    assert isinstance(decode(a.tick(5.0)[0]), Keepalive)
    assert a.next_deadline() == 7.0


def test_rtt_statistics_over_several_samples():
    a, b = connected_peers()
    for i, rtt in enumerate([0.030, 0.010, 0.050]):
        t0 = 5.0 * (i + 1)
        out, _ = a.tick(t0)
        b.receive_data(out, t0)
        a.receive_data(b.data_to_send(), t0 + rtt)
    assert a.rtt.count == 3
    assert a.rtt.min == pytest.approx(0.010) and a.rtt.max == pytest.approx(0.050)
    assert a.rtt.mean == pytest.approx(0.030) and a.rtt.last == pytest.approx(0.050)


def test_timeout_after_15_seconds_of_silence():
    a, b = connected_peers(now=100.0)
    sent = []
    t = 100.0
    while a.state is State.CONNECTED:
        t = a.next_deadline()
        out, evs = a.tick(t)
        if out:
            sent.append((t, type(decode(out)).__name__))
    assert sent == [(105.0, "Keepalive"), (110.0, "Keepalive")]  # nobody answers
    assert t == 115.0 and evs == [Timeout(evs[0].reason, "keepalive")]
    assert "nothing received from the peer for 15 s" in evs[0].reason
    assert a.state is State.CLOSED and a.next_deadline() == math.inf


def test_any_received_frame_counts_as_liveness():
    a, b = connected_peers()
    deliver_and_answer(b, a, b.send(Advertisement("t", 3, OTID, 0, 1), 14.0), 14.0)
    out, evs = a.tick(15.0)  # not dead (heard at 14); its own keepalive was overdue
    assert evs == [] and isinstance(decode(out), Keepalive)
    sent = []
    while a.state is State.CONNECTED:
        t = a.next_deadline()
        out, evs = a.tick(t)
        sent.append((t, type(decode(out)).__name__ if out else type(evs[0]).__name__))
    assert sent == [(20.0, "Keepalive"), (25.0, "Keepalive"), (29.0, "Timeout")]


def test_keepalives_can_be_disabled():
    a, b = connected_peers(keepalive_interval=0, dead_after=0)
    assert a.next_deadline() == math.inf and a.tick(1e6) == (b"", [])


# --------------------------------------------------------------------------- disconnect


@pytest.mark.parametrize("who", ["initiator", "acceptor"])
def test_graceful_disconnect_request_response_ok(who):
    a, b = connected_peers()
    x, y = (a, b) if who == "initiator" else (b, a)  # x asks, y answers
    req = x.send(DisconnectRequest("shutting down"), 1.0)
    assert x.state is State.DISCONNECTING
    with pytest.raises(LocalProtocolError, match="after DISCONNECT_REQUEST"):
        x.send(Interest(InterestAction.ADD, "t", 1), 1.0)
    assert x.can_send(StreamCredit(1, 10)) and not x.can_send(StreamData(1, b"x"))
    assert y.receive_data(req, 1.1) == [DisconnectRequested("shutting down")]
    assert y.state is State.DISCONNECTING
    # y flushes what it still has, then answers
    flush = y.send(Datagram(5, b"last words"), 1.2)
    assert x.receive_data(flush, 1.2) == [Datagram(5, b"last words")]
    x.receive_data(x.send(StreamCredit(5, 100), 1.25), 1.25)  # credit still allowed
    resp = y.send(DisconnectResponse(), 1.3)
    with pytest.raises(LocalProtocolError):
        y.send(Datagram(5, b"too late"), 1.3)
    ex = x.receive_data(resp, 1.4)
    assert ex == [Closed("shutting down", "local")] and x.state is State.CLOSED
    ok = x.data_to_send()  # written after the Closed event, then the socket is closed
    assert decode(ok) == DisconnectOk()
    assert y.receive_data(ok, 1.5) == [Closed("shutting down", "peer")] and y.state is State.CLOSED
    assert x.receive_data(b"", 1.6) == [] and y.receive_data(b"", 1.6) == []  # EOF after close


def test_disconnect_requests_that_cross():
    a, b = connected_peers()
    ra, rb = a.send(DisconnectRequest("a"), 1.0), b.send(DisconnectRequest("b"), 1.0)
    assert a.receive_data(rb, 1.1) == [DisconnectRequested("b")]
    assert b.receive_data(ra, 1.1) == [DisconnectRequested("a")]
    pa, pb = a.send(DisconnectResponse(), 1.2), b.send(DisconnectResponse(), 1.2)
    assert a.receive_data(pb, 1.3) == [] and b.receive_data(pa, 1.3) == []  # each sends OK
    oa, ob = a.data_to_send(), b.data_to_send()
    assert a.receive_data(ob, 1.4) == [Closed("a", "both")]
    assert b.receive_data(oa, 1.4) == [Closed("b", "both")]


def test_disconnect_times_out_if_the_peer_never_answers():
    a, b = connected_peers()
    b.receive_data(a.send(DisconnectRequest("bye"), 1.0), 1.0)  # b never responds
    assert a.next_deadline() == 6.0
    assert a.tick(5.9)[1] == []
    _, evs = a.tick(6.0)
    assert evs == [Timeout("no DISCONNECT_RESPONSE within 5 s", "disconnect")]
    assert a.state is State.CLOSED


def test_disconnect_times_out_if_the_ok_never_comes():
    a, b = connected_peers()
    b.receive_data(a.send(DisconnectRequest("bye"), 10.0), 10.0)
    b.send(DisconnectResponse(), 11.0)  # never delivered
    assert b.tick(15.9)[1] == [] and b.next_deadline() == 16.0
    _, evs = b.tick(16.0)
    assert evs[0].phase == "disconnect" and "DISCONNECT_OK" in evs[0].reason


def test_disconnect_rule_breaking_peer_is_a_protocol_error():
    a, b = connected_peers()
    b.receive_data(a.send(DisconnectRequest("bye"), 1.0), 1.0)
    # a promised to send nothing but receive-side frames after its request
    evs = b.receive_data(encode(StreamData(1, b"sneaky")), 1.1)
    assert isinstance(evs[0], ProtocolError) and "after the peer's DISCONNECT_REQUEST" in evs[0].reason
    a, b = connected_peers()
    evs = b.receive_data(encode(DisconnectResponse()), 1.0)
    assert isinstance(evs[0], ProtocolError)
    a, b = connected_peers()
    with pytest.raises(LocalProtocolError):
        a.send(DisconnectResponse(), 1.0)  # nothing to answer


def test_eof_before_close_is_connection_lost():
    a, b = connected_peers()
    assert b.receive_data(encode(Interest(InterestAction.ADD, "t", 1))[:5], 1.0) == []
    evs = b.receive_data(b"", 1.0)
    assert evs == [ConnectionLost("peer closed the connection in the middle of a frame (state CONNECTED)")]
    assert b.state is State.CLOSED


def test_link_frames_cannot_be_sent_by_hand():
    a, b = connected_peers()
    for f in (Keepalive(1, 1), KeepaliveAck(1, 1), ConnectOk(), DisconnectOk(),
              ConnectRequest("x", (), 1)):
        with pytest.raises(LocalProtocolError, match="produced by the connection"):
            a.send(f, 1.0)
    c = PeerConnection("initiator", A_ID)
    with pytest.raises(LocalProtocolError, match="state IDLE"):
        c.send(Interest(InterestAction.ADD, "t", 1), 0.0)
    c.start(0.0)
    with pytest.raises(LocalProtocolError):
        c.start(0.0)


# --------------------------------------------------------------------------- garbage

_TLS_CLIENT_HELLO = (bytes.fromhex("160301020001" "0001fc0303") + bytes(range(32)) + b"\x20" + bytes(32)
                     + bytes.fromhex("0036130213031301c02cc030"))


@pytest.mark.parametrize("garbage, hint", [
    (random.Random(1).randbytes(300), "does not speak"),
    (b"GET / HTTP/1.1\r\nHost: router:7000\r\n\r\n", "HTTP request"),
    (b"POST /x HTTP/1.0\r\n\r\n", "HTTP request"),
    (_TLS_CLIENT_HELLO, "TLS"),
    (b"\x16", "TLS"),  # one byte is enough
    (b"SSH-2.0-OpenSSH_9.6\r\n", "SSH"),
    (b"LBRQ" + bytes(8), "bad magic"),
    (b"LBRP\x02\x01\x00\x00\x00\x00\x00\x00", "header version 2"),
    (b"LBRP\x01\x01\x00\x00\x01\x00\x00\x01", "above the limit"),
    (encode_raw(FrameType.CONNECT_REQUEST, b"\x00\x01\x00"), "truncated"),
    (encode_raw(FrameType.CONNECT_REQUEST, b"\x00\x01\x00\x00" + b"\x00" * 12 + b"\xff\xff"), "truncated"),
])
@pytest.mark.parametrize("role", ["initiator", "acceptor"])
def test_garbage_is_refused_cleanly(garbage, hint, role):
    c = PeerConnection(role, A_ID)
    c.start(0.0)
    c.data_to_send()
    if role == "initiator" and garbage.startswith(b"LBRP") and garbage[5:6] == b"\x01":
        garbage = garbage[:5] + b"\x02" + garbage[6:]  # make it a (bad) CONNECT_RESPONSE
    evs = c.receive_data(garbage, 0.1)
    assert len(evs) == 1 and isinstance(evs[0], ProtocolError), evs
    assert hint in evs[0].reason
    assert c.state is State.CLOSED and c.data_to_send() == b""
    assert c.receive_data(b"more garbage", 0.2) == [] and c.tick(100.0) == (b"", [])


def test_garbage_is_refused_at_the_first_wrong_byte():
    c = PeerConnection("acceptor", B_ID)
    assert c.receive_data(b"LB", 0.0) == []  # could still be a frame
    evs = c.receive_data(b"X", 0.0)
    assert isinstance(evs[0], ProtocolError) and "4c 42 58" in evs[0].reason


@given(st.binary(min_size=1, max_size=200), st.sampled_from(["initiator", "acceptor"]))
@settings(max_examples=200, deadline=None)
def test_arbitrary_bytes_never_crash(data, role):
    c = PeerConnection(role, A_ID)
    c.start(0.0)
    evs = c.receive_data(data, 1.0)
    assert c.state in (State.CONNECTING, State.CONNECTED, State.CLOSED)
    assert all(isinstance(e, ProtocolError | Rejected | Connected) for e in evs)
    c.tick(100.0)


@given(st.binary(min_size=1, max_size=300))
@settings(max_examples=200, deadline=None)
def test_arbitrary_bytes_after_the_handshake_never_crash(data):
    a, b = connected_peers()
    evs = b.receive_data(b"LBRP\x01" + data, 1.0)
    for e in evs:
        assert isinstance(e, ProtocolError | DisconnectRequested) or type(e) in FRAME_TYPES.values()


def test_unknown_frame_types_after_the_handshake():
    a, b = connected_peers()
    interest = Interest(InterestAction.ADD, "t", 1)
    data = encode_raw(0x7F, b"from the future", FLAG_IGNORABLE) + encode(interest)
    assert b.receive_data(data, 1.0) == [interest] and b.stats.ignored_frames == 1
    evs = b.receive_data(encode_raw(0x7F, b"must understand"), 1.0)
    assert isinstance(evs[0], ProtocolError) and "without the ignorable flag" in evs[0].reason


def test_malformed_known_frame_after_handshake():
    a, b = connected_peers()
    evs = b.receive_data(encode_raw(FrameType.INTEREST, b"\x09\x00\x00\x00\x00\x01\x00\x00"), 1.0)
    assert isinstance(evs[0], ProtocolError) and "InterestAction value 9" in evs[0].reason
    a, b = connected_peers()
    evs = b.receive_data(encode_raw(FrameType.STREAM_CREDIT, bytes(9)), 1.0)
    assert "1 unexpected trailing byte" in evs[0].reason


# --------------------------------------------------------------------------- codec

u8, u16, u32, u64 = (st.integers(0, 2**n - 1) for n in (8, 16, 32, 64))
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
domains = st.lists(u32, max_size=6).map(tuple)
payload = st.binary(max_size=2000)

APP_FRAME_STRATEGIES = (
    st.builds(Interest, st.sampled_from(InterestAction), text, u32, st.sampled_from(PatternType)),
    st.builds(Advertisement, text, u32, st.binary(min_size=32, max_size=32), u8, u32,
              st.booleans(), u16),
    st.builds(StreamOpen, u32, u32, u8.filter(lambda k: k not in KIND_TARGET), u32),  # (targets: test_router_peerlink_uim)
    st.builds(StreamAccept, u32, u32),
    st.builds(StreamRefuse, u32, u16, text),
    st.builds(StreamData, u32, payload),
    st.builds(StreamCredit, u32, u32),
    st.builds(StreamClose, u32, u16),
    st.builds(Datagram, u32, payload),
)
APP_FRAMES = st.one_of(*APP_FRAME_STRATEGIES)
CONTROL_FRAME_STRATEGIES = (
    st.builds(Topology, st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30),
              u64, u8, st.lists(st.tuples(u32, u32), max_size=5).map(tuple),
              st.lists(st.tuples(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1,
                                         max_size=30), u32), max_size=5).map(tuple)),
    st.builds(ConnectRequest, text, domains, u64, u32, st.tuples(u16, u16)),
    st.builds(ConnectResponse, text, domains, u64, u16, text, u32, st.tuples(u16, u16)),
    st.just(ConnectOk()),
    st.builds(Keepalive, u64, u64),
    st.builds(KeepaliveAck, u64, u64),
    st.builds(DisconnectRequest, text),
    st.just(DisconnectResponse()),
    st.just(DisconnectOk()),
)
ALL_FRAMES = st.one_of(APP_FRAMES, *CONTROL_FRAME_STRATEGIES)


def test_strategies_cover_every_frame_type():
    """Each frame type has a strategy of its own (drawn from each: sampling
    ``ALL_FRAMES`` 400 times missed a type now and then)."""
    seen = set()

    @given(st.data())
    @settings(max_examples=1, database=None)
    def collect(data):
        for strategy in APP_FRAME_STRATEGIES + CONTROL_FRAME_STRATEGIES:
            seen.add(type(data.draw(strategy)))

    collect()
    assert seen == set(FRAME_TYPES.values())


@given(ALL_FRAMES)
@settings(max_examples=300)
def test_encode_decode_round_trip(frame):
    data = encode(frame)
    assert data[:4] == b"LBRP" and data[4] == 1 and data[5] == frame.TYPE
    assert struct.unpack(">I", data[8:12])[0] == len(data) - HEADER_SIZE == len(frame.payload())
    assert frame.wire_size() == len(data)
    back = decode(data)
    assert back == frame and type(back) is type(frame)
    assert encode(back) == data


def test_exact_layouts():
    """Pin a few frames to the byte, as PEERLINK.md shows them."""
    assert encode(Keepalive(1, 2)) == (b"LBRP\x01\x04\x00\x00\x00\x00\x00\x10"
                                       + (1).to_bytes(8, "big") + (2).to_bytes(8, "big"))
    assert encode(Interest(InterestAction.ADD, "md.x", 7, PatternType.PCRE)) == (
        b"LBRP\x01\x10\x00\x00\x00\x00\x00\x0c" + b"\x01\x01\x00\x00\x00\x07\x00\x04md.x")
    assert encode(StreamData(3, b"hi")) == b"LBRP\x01\x23\x00\x00\x00\x00\x00\x06\x00\x00\x00\x03hi"
    assert encode(StreamOpen(1, 2, StreamKind.LBTRU, 65536)) == (
        b"LBRP\x01\x20\x00\x00\x00\x00\x00\x0d" + bytes.fromhex("00000001 00000002 00010000 01"))
    assert encode(ConnectRequest("r", (5,), 0x0102030405060708, 3)) == (
        b"LBRP\x01\x01\x00\x00\x00\x00\x00\x19"
        + bytes.fromhex("0001 0000 0102030405060708 00000003 0001") + b"r" + bytes.fromhex("0001 00000005"))


@pytest.mark.parametrize("bad", [
    Interest(InterestAction.ADD, "t", 2**32),
    Advertisement("t", 1, b"short", 0, 1),
    StreamData(-1, b""),
    Keepalive(2**64, 0),
    DisconnectRequest("x" * 70000),
    ConnectRequest("r", tuple(range(70000)), 1),
    Interest(InterestAction.ADD, "\udc80\ud800", 1),
])
def test_encode_errors(bad):
    with pytest.raises(FrameEncodeError):
        encode(bad)


def test_payload_limit_is_configurable():
    big = StreamData(1, bytes(MAX_PAYLOAD))  # 4 bytes over the 1 MiB default
    with pytest.raises(FrameEncodeError):
        encode(big)
    a, b = connected_peers(max_payload=2 * MAX_PAYLOAD)
    assert b.receive_data(a.send(big, 1.0), 1.0) == [big]
    a, b = connected_peers(b_max_payload=1000)
    with pytest.raises(FrameDecodeError):
        decode(encode(StreamData(1, bytes(2000))), max_payload=1000)
    evs = b.receive_data(a.send(StreamData(1, bytes(2000)), 1.0), 1.0)
    assert isinstance(evs[0], ProtocolError) and "2004-byte payload, above the limit of 1000" in evs[0].reason


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted(set(c % (len(data) + 1) for c in cuts))
    edges = [0, *points, len(data)]
    return [data[i:j] for i, j in zip(edges, edges[1:], strict=False) if j > i]  # b"" = EOF


@given(st.lists(APP_FRAMES, min_size=1, max_size=12), st.data())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_chunkings_decode_identically(frames, data):
    wire = b"".join(encode(f) for f in frames)
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=40))
    a, b = connected_peers()
    got = []
    for chunk in _chunks(wire, cuts):
        got += b.receive_data(chunk, 1.0)
    assert got == frames and b.state is State.CONNECTED and b.stats.frames_received == len(frames) + 2


def test_every_byte_boundary_decodes_identically():
    frames = [Interest(InterestAction.ADD, "md.*", 4, PatternType.PCRE),
              Advertisement("md.x", 3, OTID, StreamKind.TCP, 42, False, 1),
              StreamOpen(1, 42, StreamKind.TCP, INITIAL_WINDOW), StreamAccept(2, 1000),
              StreamData(1, b"hello"), StreamCredit(1, 77), Datagram(3, b""),
              StreamRefuse(5, 2, "no such advert"), StreamClose(1, 0)]
    wire = b"".join(encode(f) for f in frames)
    for i in range(len(wire) + 1):
        a, b = connected_peers()
        got = [e for part in (wire[:i], wire[i:]) if part for e in b.receive_data(part, 1.0)]
        assert got == frames, i
    a, b = connected_peers()
    got = [e for i in range(len(wire)) for e in b.receive_data(wire[i:i + 1], 1.0)]
    assert got == frames


# --------------------------------------------------------------------------- writer queue


def test_outqueue_control_never_dropped_but_bounded():
    q = OutQueue(max_control=3, max_data_bytes=100)
    for i in range(3):
        assert q.put(Interest(InterestAction.ADD, f"t{i}", 1))
    with pytest.raises(OutQueueOverflow, match="limit 3"):
        q.put(Interest(InterestAction.ADD, "t3", 1))
    assert len(q) == 3 and q.control_count == 3
    q.pop()
    assert q.put(StreamClose(1))  # room again


def test_outqueue_data_bounded_in_bytes_datagrams_dropped_stream_data_refused():
    q = OutQueue(max_control=10, max_data_bytes=100)
    d = Datagram(1, bytes(34))  # 12 + 4 + 34 = 50 wire bytes
    assert d.wire_size() == 50
    assert q.put(d) and q.put(d) and q.data_bytes == 100 and q.data_space() == 0
    assert not q.put(Datagram(1, b"x"))
    assert not q.put(Datagram(2, bytes(500)))
    assert q.dropped_datagrams == 2 and q.dropped_datagram_bytes == 17 + 516
    assert not q.put(StreamData(3, b"abc"))
    assert q.refused_stream_data == 1 and q.dropped_datagrams == 2
    assert q.put(Keepalive(1, 1))  # control frames still go in when data is full
    assert q.pop() == d and q.data_space() == 50
    assert q.put(StreamData(3, bytes(34)))
    assert [type(f) for f in q.pop_batch()] == [Datagram, Keepalive, StreamData]
    assert not q and q.data_bytes == 0 and q.control_count == 0


def test_outqueue_keeps_fifo_order_across_classes_and_clear_counts():
    q = OutQueue()
    frames = [StreamOpen(1, 1), StreamData(1, b"a"), Datagram(1, b"b"), StreamData(1, b"c"),
              StreamClose(1), Advertisement("t", 1, OTID, 0, 1, withdraw=True)]
    for f in frames:
        q.put(f)
    assert [q.pop() for _ in frames] == frames and q.pop() is None
    for f in frames:
        q.put(f)
    assert q.clear() == len(frames) and q.discarded == len(frames) and len(q) == 0


def test_outqueue_counts_data_bytes_in_and_out():
    """``data_in``/``data_out``: encoded data bytes ever queued, and ever taken
    off (popped or thrown away); control frames not counted."""
    q = OutQueue()
    q.put(StreamData(1, bytes(84)))  # 100 wire bytes
    q.put(Keepalive(1, 1))
    q.put(Datagram(3, bytes(34)))  # 50
    assert (q.data_in, q.data_out) == (150, 0)
    q.pop()
    q.pop()
    assert (q.data_in, q.data_out) == (150, 100)
    q.put(StreamData(1, bytes(84)))
    assert q.clear() == 2 and (q.data_in, q.data_out, q.data_bytes) == (250, 250, 0)
    q.put(StreamData(1, bytes(84)))
    assert len(q.take_all()) == 1 and (q.data_in, q.data_out) == (350, 350)


# --------------------------------------------------------------------------- streams


class Link:
    """Two connected routers (connection + stream table + writer queue each) and a byte pipe
    that delivers in random chunk sizes."""

    def __init__(self, seed=0, max_data_bytes=8 << 20, **table_kw):
        self.rng = random.Random(seed)
        self.now = 0.0
        self.a, self.b = connected_peers()
        self.ta, self.tb = StreamTable("initiator", **table_kw), StreamTable("acceptor", **table_kw)
        self.qa, self.qb = OutQueue(max_data_bytes=max_data_bytes), OutQueue(max_data_bytes=max_data_bytes)
        self.events = {"a": [], "b": []}

    def side(self, name):
        return (self.a, self.ta, self.qa, self.b, self.tb) if name == "a" else (
            self.b, self.tb, self.qb, self.a, self.ta)

    def flush(self, name, max_bytes=1 << 30, frames=None):
        """Move ``name``'s stream frames through its queue onto the wire to the other side
        (the writer writes at most ``max_bytes``); returns the other side's stream events."""
        conn, table, q, peer, ptable = self.side(name)
        for f in table.frames_to_send() if frames is None else frames:
            assert q.put(f)
        wire = bytearray()
        while q and len(wire) < max_bytes:
            wire += conn.send(q.pop(), self.now)
        evs = []
        pos = 0
        while pos < len(wire):
            n = self.rng.randint(1, 200_000)
            for f in peer.receive_data(bytes(wire[pos:pos + n]), self.now):
                assert isinstance(f, STREAM_FRAMES), f
                evs += ptable.receive(f)
            pos += n
        self.events["b" if name == "a" else "a"] += evs
        return evs


def test_stream_ids_initiator_odd_acceptor_even():
    ta, tb = StreamTable("initiator"), StreamTable("acceptor")
    assert [ta.open(i) for i in range(3)] == [1, 3, 5]
    assert [tb.open(i) for i in range(3)] == [2, 4, 6]
    assert ta.frames_to_send()[0] == StreamOpen(1, 0, StreamKind.TCP, INITIAL_WINDOW)


def test_stream_open_accept_send_within_credit_and_grant():
    L = Link()
    sid = L.ta.open(advert_id=42)
    assert L.flush("a") == [StreamOpened(sid, 42, StreamKind.TCP)]
    payload = random.Random(5).randbytes(INITIAL_WINDOW + 1000)
    assert bytes(L.ta.send(sid, payload)) == payload  # not accepted yet: no credit
    L.tb.accept(sid)
    assert L.flush("b") == [StreamAccepted(sid, INITIAL_WINDOW)]
    rest = L.ta.send(sid, payload)
    assert len(rest) == 1000 and bytes(rest) == payload[-1000:]
    frames = L.ta.frames_to_send()
    assert len(frames) == INITIAL_WINDOW // MAX_FRAME_DATA
    assert all(isinstance(f, StreamData) and len(f.data) == MAX_FRAME_DATA for f in frames)
    evs = L.flush("a", frames=frames)
    assert b"".join(e.data for e in evs) == payload[:INITIAL_WINDOW]
    assert L.tb.get(sid).recv_window == 0
    # consuming less than half a window grants nothing; half a window grants it
    L.tb.consumed(sid, INITIAL_WINDOW // 2 - 1)
    assert L.tb.frames_to_send() == []
    L.tb.consumed(sid, 1)
    assert L.flush("b") == [CreditAvailable(sid, INITIAL_WINDOW // 2)]
    assert L.tb.get(sid).recv_window == INITIAL_WINDOW // 2
    with pytest.raises(LocalStreamError):
        L.tb.consumed(sid, INITIAL_WINDOW)  # more than was received
    L.tb.consumed(sid, INITIAL_WINDOW // 2)
    assert L.flush("b") == [CreditAvailable(sid, INITIAL_WINDOW)]
    assert len(L.ta.send(sid, rest)) == 0


def _grow_link(window, max_window, budget, streams=1):
    """A Link whose tables grow windows from ``window`` to ``max_window`` within ``budget``;
    ``streams`` streams opened by a and accepted by b (their ids)."""
    L = Link(initial_window=window, max_window=max_window, window_budget=budget, max_frame=window)
    sids = [L.ta.open(advert_id=i) for i in range(streams)]
    L.flush("a")
    for sid in sids:
        L.tb.accept(sid)
    L.flush("b")
    return L, sids


def _send_and_consume(L, sid, nbytes):
    """a sends ``nbytes`` on ``sid`` (within its credit); b consumes all it holds."""
    assert len(L.ta.send(sid, bytes(nbytes))) == 0
    L.flush("a")
    L.tb.consumed(sid, L.tb.get(sid).unconsumed)
    L.flush("b")


def test_window_grows_while_the_consumer_keeps_up_and_never_beyond_its_bounds():
    L, (sid,) = _grow_link(1000, 8000, 100_000)
    windows = []
    for _ in range(8):  # a consumer that keeps up: each grant doubles the window, up to 8000
        _send_and_consume(L, sid, L.ta.send_credit(sid))
        windows.append(L.tb.get(sid).window)
        assert L.ta.send_credit(sid) == L.tb.get(sid).recv_window == L.tb.get(sid).window
    assert windows == [2000, 4000, 8000, 8000, 8000, 8000, 8000, 8000]
    assert L.tb.window_grown == 7000
    # the peer can never send more than the window, however large it grew
    st = L.tb.get(sid)
    evs = L.tb.receive(StreamData(sid, bytes(st.window + 1)))
    assert isinstance(evs[0], StreamError) and "credit" in evs[0].reason


def test_window_does_not_grow_for_a_consumer_that_falls_behind():
    L, (sid,) = _grow_link(1000, 8000, 100_000)
    for _ in range(6):
        # the consumer passes on 600 of the 1000 bytes it holds: a grant is due (>= half a
        # window consumed) but 400 > a quarter of the window are still unconsumed
        credit = L.ta.send_credit(sid)
        assert len(L.ta.send(sid, bytes(credit))) == 0
        L.flush("a")
        st = L.tb.get(sid)
        L.tb.consumed(sid, max(0, st.unconsumed - 400))
        L.flush("b")
        assert st.window == 1000 and st.recv_window + st.unconsumed <= 1000
    assert L.tb.window_grown == 0


def test_window_growth_shares_one_budget_per_link_and_closing_returns_it():
    L, (s1, s2) = _grow_link(1000, 8000, 3000, streams=2)
    for _ in range(4):
        _send_and_consume(L, s1, L.ta.send_credit(s1))
    assert L.tb.get(s1).window == 4000 and L.tb.window_grown == 3000  # 1000 + 2000 of the 3000
    for _ in range(4):
        _send_and_consume(L, s2, L.ta.send_credit(s2))
    assert L.tb.get(s2).window == 1000  # nothing left in the budget
    total = sum(L.tb.get(s).recv_window + L.tb.get(s).unconsumed for s in (s1, s2))
    assert total <= 2 * 1000 + 3000  # initial windows plus the budget, in flight or held
    L.ta.close(s1)
    L.flush("a")
    L.flush("b")
    assert s1 not in L.tb and L.tb.window_grown == 0  # s1's growth is back in the budget
    for _ in range(4):
        _send_and_consume(L, s2, L.ta.send_credit(s2))
    assert L.tb.get(s2).window == 4000 and L.tb.window_grown == 3000


def test_initial_windows_share_one_budget_per_link_and_closing_returns_it():
    """Receivers that open thousands of streams and never read held 4 MiB each
    (16 GiB for the 4096 streams of a link). The initial windows of a table's
    open streams now total at most initial_budget; past it a stream starts at
    MIN_INITIAL_WINDOW, still grows while its consumer keeps up, and a closed
    stream gives its window back."""
    big = 4 * MIN_INITIAL_WINDOW
    L = Link(initial_window=big, max_window=4 * big, window_budget=10 * big,
             initial_budget=2 * big + MIN_INITIAL_WINDOW // 2, max_frame=big)
    sids = [L.ta.open(advert_id=i) for i in range(5)]
    opens = [f for f in L.ta.frames_to_send()]
    assert [f.initial_credit for f in opens] == [big, big, MIN_INITIAL_WINDOW, MIN_INITIAL_WINDOW, MIN_INITIAL_WINDOW]
    L.flush("a", frames=opens)
    for sid in sids:  # b accepts: its windows follow its own budget the same way
        L.tb.accept(sid)
    L.flush("b")
    assert [L.tb.get(s).window for s in sids] == [big, big, MIN_INITIAL_WINDOW, MIN_INITIAL_WINDOW,
                                                  MIN_INITIAL_WINDOW]
    assert [L.ta.send_credit(s) for s in sids] == [L.tb.get(s).window for s in sids]
    assert L.tb.initial_committed == 2 * big + 3 * MIN_INITIAL_WINDOW
    # a small stream whose consumer keeps up grows as any other
    for _ in range(3):
        _send_and_consume(L, sids[2], L.ta.send_credit(sids[2]))
    assert L.tb.get(sids[2]).window == 8 * MIN_INITIAL_WINDOW
    for sid in sids[:2]:
        L.ta.close(sid)
    L.flush("a")
    L.flush("b")
    assert L.tb.initial_committed == 3 * MIN_INITIAL_WINDOW
    new = L.ta.open(advert_id=9)  # the budgets are back: full windows both ways
    L.flush("a")
    L.tb.accept(new)
    L.flush("b")
    assert L.ta.get(new).window == L.tb.get(new).window == L.ta.send_credit(new) == big


def test_window_stays_fixed_without_a_max_window():
    L, (sid,) = _grow_link(1000, None, 100_000)
    for _ in range(4):
        _send_and_consume(L, sid, L.ta.send_credit(sid))
    assert L.tb.get(sid).window == 1000 and L.tb.window_grown == 0


def test_data_for_unknown_or_closed_streams_is_refused_as_an_event():
    t = StreamTable("acceptor")
    assert t.receive(StreamData(7, b"abc")) == [DataRefused(7, 3, "unknown or closed stream")]
    assert t.receive(Datagram(9, b"x")) == [DataRefused(9, 1, "unknown or closed stream")]
    t.receive(StreamOpen(1, 5, StreamKind.TCP, 100))
    assert t.receive(StreamData(1, b"early")) == [DataRefused(1, 5, "stream not open (PENDING)")]
    t.accept(1)
    t.close(1)
    assert t.receive(StreamData(1, b"late")) == [DataRefused(1, 4, "stream closed locally")]
    assert t.refused_frames == 4 and t.refused_bytes == 13
    assert t.receive(StreamCredit(1, 10)) == [] and t.receive(StreamCredit(99, 10)) == []
    with pytest.raises(StreamClosedError):
        t.send(1, b"x")
    with pytest.raises(StreamClosedError):
        t.send(99, b"x")


@pytest.mark.parametrize("closer", ["a", "b"])
def test_stream_close_both_ways(closer):
    L = Link()
    sid = L.ta.open(1)
    L.flush("a")
    L.tb.accept(sid)
    L.flush("b")
    t_close, t_other = (L.ta, L.tb) if closer == "a" else (L.tb, L.ta)
    other = "b" if closer == "a" else "a"
    assert t_close.close(sid, 1) and not t_close.close(sid)
    assert t_close.get(sid).state is StreamState.CLOSING
    assert L.flush(closer) == [StreamClosed(sid, 1)]
    assert sid not in t_other  # the other side answered and forgot the stream
    assert L.flush(other) == []  # the answer frees the id on the closing side too
    assert sid not in t_close and len(L.ta) == len(L.tb) == 0


def test_stream_closes_that_cross():
    L = Link()
    sid = L.ta.open(1)
    L.flush("a")
    L.tb.accept(sid)
    L.flush("b")
    L.ta.close(sid)
    L.tb.close(sid)
    assert L.flush("a") == [] and L.flush("b") == []
    assert len(L.ta) == len(L.tb) == 0


def test_stream_refused_and_bad_opens():
    L = Link()
    sid = L.ta.open(7, StreamKind.LBTRU)
    L.flush("a")
    L.tb.refuse(sid, 2, "no advert 7")
    assert L.flush("b") == [StreamRefused(sid, 2, "no advert 7")] and sid not in L.ta
    t = StreamTable("acceptor", kinds=(StreamKind.TCP,), max_streams=1)
    assert isinstance(t.receive(StreamOpen(2, 1))[0], StreamError)  # even = acceptor's own
    assert isinstance(t.receive(StreamOpen(1, 1, 9))[0], StreamError)  # unknown kind
    assert isinstance(t.receive(StreamOpen(1, 1))[0], StreamError)  # reuses id 1
    assert t.receive(StreamOpen(3, 1)) == [StreamOpened(3, 1, StreamKind.TCP)]
    assert t.receive(StreamOpen(5, 1)) == [StreamError(5, "1 stream(s) already open (limit 1)")]
    refusals = t.frames_to_send()
    assert [(f.stream_id, f.code) for f in refusals] == [(2, 5), (1, 3), (1, 5), (5, 4)]


def test_peer_exceeding_its_credit_closes_only_that_stream():
    t = StreamTable("acceptor", initial_window=10)
    t.receive(StreamOpen(1, 1, StreamKind.TCP, 0))
    t.receive(StreamOpen(3, 1, StreamKind.TCP, 0))
    t.accept(1)
    t.accept(3)
    assert t.receive(StreamData(1, bytes(8))) == [DataReceived(1, bytes(8))]
    evs = t.receive(StreamData(1, bytes(3)))
    assert evs == [StreamError(1, "peer sent 3 bytes with 2 bytes of credit left")]
    assert t.frames_to_send()[-1] == StreamClose(1, 2)
    assert t.receive(StreamData(3, bytes(10))) == [DataReceived(3, bytes(10))]


def test_datagrams_both_directions_need_no_credit():
    L = Link()
    sid = L.ta.open(1, StreamKind.LBTRU)
    L.flush("a")
    L.tb.accept(sid)
    L.flush("b")
    for i in range(50):
        L.ta.send_datagram(sid, bytes([i]) * 1400)
        L.tb.send_datagram(sid, b"nak %d" % i)
    got_b, got_a = L.flush("a"), L.flush("b")
    assert got_b == [DatagramReceived(sid, bytes([i]) * 1400) for i in range(50)]
    assert got_a == [DatagramReceived(sid, b"nak %d" % i) for i in range(50)]
    with pytest.raises(LocalStreamError):
        L.ta.send_datagram(sid, bytes(MAX_PAYLOAD))


def test_send_respects_the_writer_queue_space():
    t = StreamTable("initiator")
    sid = t.open(1)
    t.receive(StreamAccept(sid, 1 << 20))
    t.frames_to_send()
    q = OutQueue(max_data_bytes=150_000)
    rest = t.send(sid, bytes(400_000), limit=q.data_space())
    frames = t.frames_to_send()
    assert all(q.put(f) for f in frames)  # sized to fit: never refused
    assert sum(f.wire_size() for f in frames) <= 150_000 and q.data_space() < 16 + 1
    assert len(rest) == 400_000 - sum(len(f.data) for f in frames)
    assert t.get(sid).send_credit == (1 << 20) - sum(len(f.data) for f in frames)


def test_ten_megabytes_reassembled_byte_exact_in_order():
    L = Link(seed=3)
    payload = random.Random(10).randbytes(10 * 1024 * 1024)
    sid = L.ta.open(1)
    L.flush("a")
    L.tb.accept(sid)
    L.flush("b")
    rest = memoryview(payload)
    got = []
    rounds = 0
    while len(rest) or sum(map(len, got)) < len(payload):
        rounds += 1
        rest = L.ta.send(sid, rest, limit=L.qa.data_space())
        for ev in L.flush("a"):
            assert isinstance(ev, DataReceived)
            got.append(ev.data)
            L.tb.consumed(sid, len(ev.data))
        for ev in L.flush("b"):
            assert isinstance(ev, CreditAvailable)
    assert b"".join(got) == payload
    assert rounds > 20 and L.a.state is L.b.state is State.CONNECTED
    assert L.tb.get(sid).bytes_received == len(payload)


def test_a_stalled_stream_does_not_block_the_others():
    """Stream A's consumer never consumes; stream B still moves 10 MB over the same link."""
    L = Link(seed=4)
    pa = random.Random(20).randbytes(1024 * 1024)
    pb = random.Random(21).randbytes(10 * 1024 * 1024)
    sa, sb = L.ta.open(1), L.ta.open(2)
    L.flush("a")
    L.tb.accept(sa)
    L.tb.accept(sb)
    L.flush("b")
    rest = {sa: memoryview(pa), sb: memoryview(pb)}
    got = {sa: [], sb: []}
    while len(rest[sb]) or sum(map(len, got[sb])) < len(pb):
        for sid in (sa, sb):
            rest[sid] = L.ta.send(sid, rest[sid], limit=L.qa.data_space())
        for ev in L.flush("a"):
            got[ev.stream_id].append(ev.data)
            if ev.stream_id == sb:  # only B's consumer consumes
                L.tb.consumed(sb, len(ev.data))
        L.flush("b")
    assert b"".join(got[sb]) == pb
    assert b"".join(got[sa]) == pa[:INITIAL_WINDOW]  # exactly one window, then it waits
    assert L.ta.get(sa).send_credit == 0 and len(rest[sa]) == len(pa) - INITIAL_WINDOW
    assert L.tb.get(sa).unconsumed == INITIAL_WINDOW and L.tb.get(sa).recv_window == 0
    # once A's consumer wakes up, A resumes
    L.tb.consumed(sa, INITIAL_WINDOW)
    assert L.flush("b") == [CreditAvailable(sa, INITIAL_WINDOW)]


def test_a_slow_writer_queue_does_not_block_other_streams_either():
    """The writer drains only 100 KB per round; the queue bounds, StreamTable follows."""
    L = Link(seed=5, max_data_bytes=300_000)
    pb = random.Random(22).randbytes(2 * 1024 * 1024)
    sa, sb = L.ta.open(1), L.ta.open(2)
    L.flush("a")
    L.tb.accept(sa)
    L.tb.accept(sb)
    L.flush("b")
    rest_b = memoryview(pb)
    got = []
    for _ in range(2000):
        L.ta.send(sa, bytes(1000), limit=L.qa.data_space())
        rest_b = L.ta.send(sb, rest_b, limit=L.qa.data_space())
        assert L.qa.data_bytes <= 300_000
        for ev in L.flush("a", max_bytes=100_000):
            if ev.stream_id == sb:
                got.append(ev.data)
                L.tb.consumed(sb, len(ev.data))
        L.flush("b")
        if sum(map(len, got)) == len(pb):
            break
    assert b"".join(got) == pb and L.qa.refused_stream_data == 0


# --------------------------------------------------------------------------- over trio


async def _drive(conn, stream, log, *, hang_after=None):
    """A minimal I/O shell: one reader task, one timer task, one lock for writes."""
    lock = trio.Lock()

    async def write(data):
        if data:
            async with lock:
                await stream.send_all(data)

    async with trio.open_nursery() as nursery:
        async def reader():
            while True:
                data = await stream.receive_some(65536)
                if hang_after is not None and trio.current_time() >= hang_after:
                    await trio.sleep_forever()  # a hung peer: no reads, no writes
                evs = conn.receive_data(data, trio.current_time())
                log.extend(evs)
                await write(conn.data_to_send())
                if conn.state is State.CLOSED:
                    nursery.cancel_scope.cancel()
                    return
                for ev in evs:
                    if isinstance(ev, DisconnectRequested):
                        await write(conn.send(DisconnectResponse(), trio.current_time()))

        async def timer():
            await write(conn.start(trio.current_time()))
            while conn.state is not State.CLOSED:
                if hang_after is not None and trio.current_time() >= hang_after:
                    await trio.sleep_forever()  # a hung peer: no reads, no writes
                await trio.sleep_until(min(conn.next_deadline(), trio.current_time() + 1.0))
                out, evs = conn.tick(trio.current_time())
                log.extend(evs)
                await write(out)
            nursery.cancel_scope.cancel()

        nursery.start_soon(reader)
        nursery.start_soon(timer)


async def test_keepalives_over_a_memory_stream_then_a_hung_peer_times_out(autojump_clock):
    sa, sb = trio.testing.memory_stream_pair()
    a, b = peer_pair()
    la, lb = [], []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_drive, a, sa, la)
        nursery.start_soon(lambda: _drive(b, sb, lb, hang_after=60.0))
        await trio.sleep(59.0)
        assert a.state is b.state is State.CONNECTED
        assert a.stats.keepalives_sent >= 10 and b.stats.keepalives_sent >= 10  # both idle
        assert a.rtt.count >= 10 and b.rtt.count >= 10
        t_last = trio.current_time()
        await trio.sleep(30.0)
        nursery.cancel_scope.cancel()
    assert [type(e) for e in la] == [Connected, Timeout]
    assert la[-1].phase == "keepalive" and a.state is State.CLOSED
    assert b.state is State.CONNECTED  # the hung side never noticed anything
    # the timer slept until the deadline: exactly dead_after after the last frame from b
    assert la[-1].reason.startswith("nothing received from the peer for 15 s")
    assert a.stats.keepalives_sent > b.stats.keepalives_sent and t_last < 60.0


async def test_loopback_tcp_handshake_interest_and_graceful_disconnect():
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    a, b = peer_pair()
    la, lb = [], []
    interest = Interest(InterestAction.ADD, "md.quotes", 1)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            async def acceptor():
                stream = await listeners[0].accept()
                await _drive(b, stream, lb)
                await stream.aclose()

            async def initiator():
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with trio.open_nursery() as n2:
                    n2.start_soon(_drive, a, stream, la)
                    while a.state is not State.CONNECTED:
                        await trio.sleep(0.01)
                    await stream.send_all(a.send(interest, trio.current_time()))
                    while not any(isinstance(e, Interest) for e in lb):
                        await trio.sleep(0.01)
                    await stream.send_all(a.send(DisconnectRequest("test over"), trio.current_time()))
                await stream.aclose()

            nursery.start_soon(acceptor)
            nursery.start_soon(initiator)
    await listeners[0].aclose()
    assert [type(e) for e in la] == [Connected, Closed] and la[-1].initiated_by == "local"
    assert lb == [Connected(lb[0].peer, int(Capability.STREAMS | Capability.DATAGRAMS | Capability.SESSIONS
                                            | Capability.ORIGIN_SID | Capability.RU_SESSIONS
                                            | Capability.TIR_OPTIONS | Capability.RESPONSES)),
                  interest, DisconnectRequested("test over"),
                  Closed("test over", "peer")]
