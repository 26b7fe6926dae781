"""A live LBT-RU source and receiver on UM's own LBT-RU wire protocol
(:mod:`lbmr_proto.lbtru`), whose DATA datagrams carry the LBMC messages of
the live stream (:mod:`.live`): one session per source, shared by every
receiver, as a UM LBT-RU source sends it (see :mod:`lbmr_tools.sim.dataplane`).
"""

from __future__ import annotations

import math
import socket
from dataclasses import asdict, dataclass

import trio

from lbmr_proto import lbmc
from lbmr_proto import lbtru as RU

from .live import (
    LiveMessages,
    MessageClock,
    Repair,
    RepairCounts,
    StreamMismatch,
    data_message,
    verify_message,
)
from .pattern import check_seed, rate_of

__all__ = ["RuLiveSource", "RuClient", "RuLiveReceiver", "RuLiveReceiveResult", "LIVE_RU_MIN_DATAGRAM",
           "LIVE_RU_MAX_DATAGRAM", "live_ru_payload"]

Addr = tuple[str, int]

LIVE_RU_MAX_DATAGRAM = 1400
#: the smallest DATA datagram: LBT-RU header, session id option, LBMC header, one payload byte
LIVE_RU_MIN_DATAGRAM = RU.DATA_OVERHEAD + lbmc.DATA_HEADER.size + 1
DEFAULT_RETRANSMIT_WINDOW = 4096  # messages a NAK can still get back


def live_ru_payload(datagram_size: int) -> int:
    """Payload bytes of the LBMC message in a DATA datagram of ``datagram_size`` bytes."""
    return datagram_size - RU.DATA_OVERHEAD - lbmc.DATA_HEADER.size


@dataclass
class RuClient:
    """One receiver a :class:`RuLiveSource` confirmed (a CREQ from ``peer``):
    ``first_sqn`` is the first sequence it was sent (None: none yet)."""

    peer: str
    client_id: int
    started: float = 0.0  # trio.current_time()
    last_heard: float = 0.0
    finished: float | None = None
    creqs: int = 0
    acks: int = 0
    ack_sqn: int | None = None  # from the last ACK
    naks: int = 0
    retransmitted: int = 0
    not_retransmitted: int = 0  # NAKed sequences outside the window (answered by an NCF)
    datagrams_sent: int = 0
    bytes_sent: int = 0
    first_sqn: int | None = None
    send_errors: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


class RuLiveSource:
    """A live UM LBT-RU source: one session of LBMC data messages for all receivers.

    One UDP socket on (``bind_ip``, ``port``). A receiver connects with a
    CREQ (SYN); the source confirms it with a session message with SYN
    (``session_id`` and a client id of its own as options) and sends it
    every DATA datagram from the next batch on: the clock
    (:class:`.live.MessageClock`, ``rate`` messages per second, batches of
    at most ``max_burst``) makes message ``sqn`` due; its datagram (LBT-RU
    sequence ``sqn``, one LBMC message with topic index ``tidx``, sequence
    ``sqn`` and the payload of that sequence, ``datagram_size`` bytes in
    all) goes to every confirmed receiver. Nothing is replayed to a
    joining receiver; the clock runs only while receivers are connected
    (``dropped`` stays 0).
    A NAK of a sequence among the last ``retransmit_window`` gets it again
    (flagged retransmission; the payload is derived, nothing is stored),
    older ones an NCF "do not retry". ACKs are counted. A receiver silent
    for ``client_timeout`` seconds (no CREQ, ACK or NAK) is forgotten, at
    most ``max_clients`` are served at once (more are counted in
    ``refused``) and ``clients`` keeps at most four times as many (the
    oldest gone ones are dropped). After ``max_messages`` (None: never), or when cancelled,
    the source sends every receiver an RST: the session ends with the
    source. ``clients`` holds a :class:`RuClient` per receiver ever
    confirmed; ``counters`` the rest.
    """

    def __init__(self, bind_ip: str = "127.0.0.1", port: int = 0, *, seed: int = 0, tidx: int = 0,
                 session_id: int = 0, rate: float = 10000.0,
                 datagram_size: int = LIVE_RU_MAX_DATAGRAM, max_burst: int = 32,
                 max_messages: int | None = None, retransmit_window: int = DEFAULT_RETRANSMIT_WINDOW,
                 client_timeout: float = 10.0, max_clients: int = 1024, snd_buf: int = 1 << 20) -> None:
        if not LIVE_RU_MIN_DATAGRAM <= datagram_size <= LIVE_RU_MAX_DATAGRAM:
            raise ValueError(f"datagram_size must be {LIVE_RU_MIN_DATAGRAM}..{LIVE_RU_MAX_DATAGRAM}")
        if retransmit_window < 0 or not client_timeout > 0 or max_clients < 1:
            raise ValueError("retransmit_window >= 0, client_timeout and max_clients > 0")
        self.bind_ip, self.port = bind_ip, port
        self.seed = check_seed(seed)
        self.tidx, self.session_id = tidx, session_id
        self.datagram_size = datagram_size
        self.clock = MessageClock(rate, max_burst, max_messages)
        self.retransmit_window = retransmit_window
        self.client_timeout, self.max_clients = client_timeout, max_clients
        self.snd_buf = snd_buf
        self.address: Addr | None = None
        self.clients: dict[str, RuClient] = {}
        self.dropped = 0
        self.refused = 0
        self.counters: dict[str, int] = dict.fromkeys(
            ("creqs", "acks", "naks", "unknown_client", "malformed", "recv_errors", "rsts"), 0)
        self._live: dict[Addr, RuClient] = {}
        self._sock = None
        self._sm_sqn = 0
        self._next_client_id = 0

    @property
    def next_sqn(self) -> int:
        return self.clock.next_sqn

    @property
    def datagrams_sent(self) -> int:
        return sum(c.datagrams_sent for c in self.clients.values())

    @property
    def bytes_sent(self) -> int:
        return sum(c.bytes_sent for c in self.clients.values())

    @property
    def trail_sqn(self) -> int:
        """The oldest sequence a NAK can still get back."""
        return max(0, self.clock.next_sqn - self.retransmit_window)

    def _datagram(self, sqn: int, retransmission: bool = False) -> bytes:
        msg = data_message(self.seed, self.tidx, sqn, live_ru_payload(self.datagram_size))
        return RU.encode_data(sqn, self.trail_sqn, msg, session_id=self.session_id,
                              retransmission=retransmission)

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Bind, report the bound (ip, port) through ``task_status.started``,
        send until cancelled (or ``max_messages``), then reset every
        receiver. Raises OSError before ``started``."""
        raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # kept: the RSTs go out after cancellation
        sock = trio.socket.from_stdlib_socket(raw)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.snd_buf)
            await sock.bind((self.bind_ip, self.port))
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self.address = sock.getsockname()[:2]
        with sock:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._receive)
                    task_status.started(self.address)
                    await self._clock()
                    nursery.cancel_scope.cancel()
            finally:
                self._reset_all(raw)

    def _reset_all(self, raw: socket.socket) -> None:
        """The session ends: an RST to every receiver (non-blocking, best effort)."""
        rst = RU.encode_rst()
        for addr, c in list(self._live.items()):
            try:
                raw.sendto(rst, addr)
            except OSError:
                pass
            self._forget(addr, c)
            self.counters["rsts"] += 1

    def _forget(self, addr: Addr, c: RuClient) -> None:
        self._live.pop(addr, None)
        if not self._live:
            self.clock.stop()
        c.finished = trio.current_time()

    async def _clock(self) -> None:
        clock = self.clock
        while True:
            sqn, n = await clock.next_batch()
            if not n:
                return
            self._expire(trio.current_time())
            if not self._live:
                self.dropped += n
                continue
            for q in range(sqn, sqn + n):
                data = self._datagram(q)
                for addr, c in list(self._live.items()):
                    await self._send(c, addr, data)
                    if c.first_sqn is None:
                        c.first_sqn = q

    def _expire(self, now: float) -> None:
        for addr, c in list(self._live.items()):
            if now - c.last_heard >= self.client_timeout:
                self._forget(addr, c)

    async def _send(self, c: RuClient, addr: Addr, data: bytes) -> None:
        try:
            await self._sock.sendto(data, addr)
        except OSError:
            c.send_errors += 1
            return
        c.datagrams_sent += 1
        c.bytes_sent += len(data)

    async def _receive(self) -> None:
        while True:
            try:
                data, src = await self._sock.recvfrom(2048)
            except OSError:
                self.counters["recv_errors"] += 1
                await trio.sleep(0)  # never spin on a pending socket error
                continue
            await self._on_datagram(data, src[:2])

    async def _on_datagram(self, data: bytes, src: Addr) -> None:
        try:
            msg = RU.decode(data)
        except RU.LbtruDecodeError:
            self.counters["malformed"] += 1
            return
        now = trio.current_time()
        if isinstance(msg, RU.Creq):
            self.counters["creqs"] += 1
            await self._connect(src, now)
            return
        c = self._live.get(src)
        if c is None or not isinstance(msg, RU.Ack | RU.Nak):
            self.counters["unknown_client" if c is None else "malformed"] += 1
            return
        c.last_heard = now
        if isinstance(msg, RU.Ack):
            self.counters["acks"] += 1
            c.acks += 1
            c.ack_sqn = msg.ack_sqn
        else:
            self.counters["naks"] += 1
            c.naks += 1
            await self._answer_nak(c, src, msg.sqns)

    async def _connect(self, src: Addr, now: float) -> None:
        """Confirm a CREQ (again, for a receiver that lost the first answer)."""
        c = self._live.get(src)
        if c is None:
            if len(self._live) >= self.max_clients:
                self.refused += 1
                return
            key = f"{src[0]}:{src[1]}"
            self._next_client_id += 1
            c = RuClient(key, client_id=self._next_client_id, started=now)
            self.clients[f"{key}#{c.client_id}"] = c
            self._live[src] = c
            self.clock.run()
            self._trim_history()
        c.creqs += 1
        c.last_heard = now
        self._sm_sqn += 1
        lead = (self.clock.next_sqn - 1) & 0xFFFFFFFF
        await self._send(c, src, RU.encode_sm(self._sm_sqn, lead, self.trail_sqn, syn=True,
                                              session_id=self.session_id, client_id=c.client_id))

    def _trim_history(self) -> None:
        """Keep at most ``4 * max_clients`` receivers in ``clients``: the oldest gone ones go."""
        extra = len(self.clients) - 4 * self.max_clients
        for key in [k for k, c in self.clients.items() if c.finished is not None][:max(extra, 0)]:
            del self.clients[key]

    async def _answer_nak(self, c: RuClient, src: Addr, sqns) -> None:
        trail, top = self.trail_sqn, self.clock.next_sqn
        lost = []
        for q in sqns:
            if trail <= q < top:
                c.retransmitted += 1
                await self._send(c, src, self._datagram(q, retransmission=True))
            else:
                lost.append(q)
        if lost:
            c.not_retransmitted += len(lost)
            await self._send(c, src, RU.encode_ncf(trail, lost, reason=RU.NCF_NO_RETRY,
                                                   session_id=self.session_id, client_id=c.client_id))


@dataclass
class RuLiveReceiveResult(LiveMessages, RepairCounts):
    """What an :class:`RuLiveReceiver` saw: the verified messages
    (:class:`.live.LiveMessages`), its connection and the datagrams; with
    NAKs, the repair counts (:class:`.live.RepairCounts`), the NAKs sent
    and the NCFs taken. ``ok``: done, no error, ``expect_count`` messages
    verified (and nothing missing)."""

    source: str = ""
    expect_count: int = 0
    client_id: int | None = None
    creqs_sent: int = 0
    acks_sent: int = 0
    datagrams: int = 0  # DATA datagrams taken
    retransmissions: int = 0  # DATA flagged retransmission (ignored without NAKs)
    naks_sent: int = 0  # NAK datagrams
    ncfs: int = 0
    foreign: int = 0  # datagrams from another address or session (ignored)
    reset: bool = False  # the source ended the session (RST)
    error: str | None = None
    elapsed: float = 0.0  # seconds from the first CREQ to the end
    data_elapsed: float = 0.0  # seconds from the first to the last DATA
    done: bool = False

    @property
    def received(self) -> int:
        return self.messages

    @property
    def ok(self) -> bool:
        return (self.done and self.error is None and self.messages >= self.expect_count
                and self.unrecovered == 0)

    @property
    def bytes_per_s(self) -> float:
        return rate_of(self.bytes_received, self.data_elapsed)


class RuLiveReceiver:
    """Connect to a :class:`RuLiveSource` (or whatever relays one) at
    (``source_ip``, ``port``) and verify ``expect_count`` messages of the live
    stream of ``seed`` from the first DATA it gets: whole LBMC messages in
    each datagram, one topic index (``tidx``; None: the first one's),
    consecutive sequence numbers, each payload its sequence's.

    A CREQ every ``connect_interval`` (UM's transport_lbtru_connect_interval)
    until a session message with SYN answers, at most ``connect_attempts``;
    then an ACK of the last verified sequence at once and every
    ``ack_interval``. A session id from the TIR (``session_id``) must match
    the datagrams'; without one, the first the source's datagrams carry is
    taken (and named in the receiver's ACKs and NAKs, as the source's own
    control datagrams name it). Without ``nak`` loss is not repaired: a gap is an
    error. With ``nak`` (what a UM receiver does) a gap is NAKed at once and
    again every ``nak_interval`` for as long as it stays missing, at most
    ``nak_attempts`` times (UM's transport_lbtru_nak_*), retransmissions
    fill it, an NCF "do not retry" gives its sequences up (an error), and
    ``drop_every`` n > 0 discards the first copy of every DATA whose
    sequence is n-1 mod n on purpose; the run is done once nothing is
    missing (once the live messages span ``expect_count`` sequences, later
    ones are not taken: only repairs are awaited). An RST before
    the expected messages ends the run with an error. Bounds:
    ``idle_timeout`` without a datagram once connected, ``timeout`` for the
    whole run. ``bind_ip`` is the local address (None: 127.0.0.1 for a
    loopback source, else any).
    """

    def __init__(self, source_ip: str, port: int, *, expect_count: int, seed: int = 0,
                 tidx: int | None = None, session_id: int | None = None, bind_ip: str | None = None,
                 connect_interval: float = 0.1, connect_attempts: int = 100, ack_interval: float = 0.5,
                 idle_timeout: float = 5.0, timeout: float = 60.0, rcv_buf: int = 4 << 20,
                 nak: bool = False, drop_every: int = 0, nak_interval: float = 0.2,
                 nak_attempts: int = 25) -> None:
        if expect_count < 1:
            raise ValueError("expect_count must be >= 1")
        if not (connect_interval > 0 and connect_attempts >= 1 and ack_interval > 0
                and idle_timeout > 0 and timeout > 0):
            raise ValueError("intervals, attempts and timeouts must be positive")
        self.source: Addr = (source_ip, port)
        self.seed = check_seed(seed)
        self.tidx, self.sid = tidx, session_id
        if bind_ip is None:
            bind_ip = "127.0.0.1" if source_ip.startswith("127.") else "0.0.0.0"
        self.bind_ip = bind_ip
        self.connect_interval, self.connect_attempts = connect_interval, connect_attempts
        self.ack_interval, self.idle_timeout, self.timeout = ack_interval, idle_timeout, timeout
        self.rcv_buf = rcv_buf
        if drop_every < 0 or (drop_every and not nak) or not nak_interval > 0 or nak_attempts < 1:
            raise ValueError("drop_every needs nak (and >= 0); nak_interval and nak_attempts positive")
        self.nak, self.drop_every = nak, drop_every
        self.nak_interval, self.nak_attempts = nak_interval, nak_attempts
        self.result = RuLiveReceiveResult(source=f"{source_ip}:{port}", expect_count=expect_count)
        self.repair = Repair(self.result, self.seed, tidx)
        self._naks: dict[int, int] = {}  # missing sequence -> NAKs sent for it
        self._nak_at = math.inf

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> RuLiveReceiveResult:
        """Connect and verify until done or a bound is hit; reports the local
        (ip, port) through ``task_status.started`` (None: the socket failed)."""
        r = self.result
        t0 = trio.current_time()
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            with sock:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcv_buf)
                    await sock.bind((self.bind_ip, 0))
                except OSError as e:
                    r.error = f"socket error: {e.strerror or e}"
                    task_status.started(None)
                    r.done = True
                    return r
                task_status.started(sock.getsockname()[:2])
                with trio.move_on_after(self.timeout) as scope:
                    await self._loop(sock)
                if scope.cancelled_caught and r.error is None:
                    r.error = f"timeout after {self.timeout:g} s ({r.messages} of {r.expect_count} messages)"
                r.done = True
        except trio.Cancelled:
            if r.error is None:
                r.error = f"cancelled after {r.messages} messages"
            raise
        finally:
            r.elapsed = trio.current_time() - t0
        return r

    async def _send(self, sock, data: bytes) -> None:
        try:
            await sock.sendto(data, self.source)
        except OSError:  # e.g. ECONNREFUSED from an earlier datagram: the next try may do
            pass

    async def _loop(self, sock) -> None:
        r = self.result
        connected = False
        now = trio.current_time()
        creq_at, ack_at, last_rx = now, math.inf, now
        first_data = None
        while r.messages < r.expect_count or self.repair.missing:
            now = trio.current_time()
            if not connected and now >= creq_at:
                if r.creqs_sent >= self.connect_attempts:
                    r.error = f"no answer to {r.creqs_sent} connection requests"
                    return
                await self._send(sock, RU.encode_creq(session_id=self.sid))
                r.creqs_sent += 1
                creq_at = now + self.connect_interval
            if connected and now - last_rx >= self.idle_timeout:
                r.error = f"stalled: nothing from the source for {self.idle_timeout:g} s after {r.messages} messages"
                return
            if connected and now >= self._nak_at and not await self._nak_again(sock, now):
                return
            if connected and now >= ack_at:
                await self._send(sock, RU.encode_ack(r.last_sqn or 0, session_id=self.sid, client_id=r.client_id))
                r.acks_sent += 1
                ack_at = now + self.ack_interval
            wake = min(ack_at, self._nak_at, last_rx + self.idle_timeout) if connected else creq_at
            with trio.move_on_at(wake):
                data, src = await self._recv(sock)
                if data is None:
                    continue
                now = trio.current_time()
                msg = self._decode(data, src)
                if msg is None:
                    continue
                if isinstance(msg, RU.Rst):
                    r.reset = True
                    r.error = f"the source ended the session after {r.messages} of {r.expect_count} messages"
                    return
                if isinstance(msg, RU.SessionMessage) and msg.syn and not connected:
                    connected, ack_at, r.client_id = True, now, msg.header.client_id
                if not connected:
                    r.foreign += 1
                    continue
                last_rx = now
                if isinstance(msg, RU.Ncf) and self.nak:
                    if not self._ncf(msg):
                        return
                if isinstance(msg, RU.Data):
                    first_data = now if first_data is None else first_data
                    r.data_elapsed = now - first_data
                    if not self._take(msg):
                        return
                    if self.nak:
                        await self._nak_new(sock, now)

    async def _recv(self, sock) -> tuple[bytes | None, Addr | None]:
        try:
            data, src = await sock.recvfrom(65536)
        except OSError:  # an ICMP error reported on the socket
            await trio.sleep(0.001)
            return None, None
        return data, src[:2]

    def _take_repairing(self, d: RU.Data) -> bool:
        """:meth:`_take` with NAKs: a gap is missing, retransmissions (and
        late datagrams) fill it."""
        r = self.result
        if d.retransmission:
            r.retransmissions += 1
        else:
            r.datagrams += 1
        try:
            for m in self._messages(d):
                if d.retransmission or (self.repair.next_live is not None and m.sqn < self.repair.next_live):
                    self.repair.retrans(m)
                elif self.repair.live_span >= r.expect_count:
                    continue  # the expected messages are spanned: only repairs matter now
                else:
                    drop = bool(self.drop_every) and m.sqn % self.drop_every == self.drop_every - 1
                    self.repair.live(m, discard=drop)
        except StreamMismatch as e:
            r.error = str(e)
            return False
        except lbmc.LbmcDecodeError as e:
            r.error = f"DATA {d.sqn} does not carry whole LBMC messages: {e}"
            return False
        return True

    @staticmethod
    def _messages(d: RU.Data) -> list[lbmc.Message]:
        """The whole LBMC messages of a DATA datagram (LbmcDecodeError otherwise)."""
        payload, off, out = d.payload, 0, []
        while off < len(payload):
            if len(payload) - off < lbmc.CONTROL_HEADER.size:
                raise lbmc.LbmcDecodeError(off, "a message header cut by the datagram's end")
            _, msglen = lbmc.check_start(payload, off)
            if off + msglen > len(payload):
                raise lbmc.LbmcDecodeError(off, f"a {msglen}-byte message cut by the datagram's end")
            out.append(lbmc.decode(payload[off:off + msglen]))
            off += msglen
        return out

    def _decode(self, data: bytes, src: Addr):
        """The datagram when it is the source's, else None (counted as foreign)."""
        r = self.result
        if src != self.source:
            r.foreign += 1
            return None
        try:
            msg = RU.decode(data)
        except RU.LbtruDecodeError:
            r.foreign += 1
            return None
        sid = msg.header.session_id
        if self.sid is not None and sid is not None and sid != self.sid:
            r.foreign += 1
            return None
        if self.sid is None and sid is not None:
            self.sid = sid  # a TIR without one: the source's session id, named in the ACKs and NAKs from now on
        return msg

    async def _nak_new(self, sock, now: float) -> None:
        """NAK the sequences found missing that were never NAKed."""
        new = [q for q in sorted(self.repair.missing) if q not in self._naks]
        if new:
            await self._send_naks(sock, new)
            if self._nak_at == math.inf:
                self._nak_at = now + self.nak_interval
        for q in list(self._naks):
            if q not in self.repair.missing:
                del self._naks[q]

    async def _nak_again(self, sock, now: float) -> bool:
        """NAK what is still missing again; False (and ``error``) once one
        sequence has had ``nak_attempts`` NAKs."""
        r = self.result
        for q in list(self._naks):
            if q not in self.repair.missing:
                del self._naks[q]
        if not self._naks:
            self._nak_at = math.inf
            return True
        spent = [q for q, n in self._naks.items() if n >= self.nak_attempts]
        if spent:
            r.error = f"sequence {spent[0]} still missing after {self.nak_attempts} NAKs"
            return False
        await self._send_naks(sock, sorted(self._naks))
        self._nak_at = now + self.nak_interval
        return True

    async def _send_naks(self, sock, sqns: list[int]) -> None:
        for i in range(0, len(sqns), 64):  # at most 64 sequences a NAK (a datagram of 256 bytes of them)
            part = sqns[i:i + 64]
            await self._send(sock, RU.encode_nak([q & 0xFFFFFFFF for q in part], session_id=self.sid,
                                                 client_id=self.result.client_id))
            self.result.naks_sent += 1
            for q in part:
                self._naks[q] = self._naks.get(q, 0) + 1

    def _ncf(self, ncf: RU.Ncf) -> bool:
        """An NCF: "do not retry" for a missing sequence is the end (False, ``error``)."""
        r = self.result
        r.ncfs += 1
        gone = [q for q in ncf.sqns if q in self.repair.missing]
        if ncf.reason == RU.NCF_NO_RETRY and gone:
            r.error = f"sequence {gone[0]} cannot be retransmitted (NCF, no retry)"
            return False
        return True

    def _take(self, d: RU.Data) -> bool:
        """Verify the messages of one DATA datagram; False (and ``error``) on the first problem."""
        r = self.result
        if self.nak:
            return self._take_repairing(d)
        if d.retransmission:
            r.retransmissions += 1
            return True
        r.datagrams += 1
        payload, off = d.payload, 0
        try:
            while off < len(payload) and r.messages < r.expect_count:
                if len(payload) - off < lbmc.CONTROL_HEADER.size:
                    raise lbmc.LbmcDecodeError(off, "a message header cut by the datagram's end")
                _, msglen = lbmc.check_start(payload, off)
                if off + msglen > len(payload):
                    raise lbmc.LbmcDecodeError(off, f"a {msglen}-byte message cut by the datagram's end")
                verify_message(r, lbmc.decode(payload[off:off + msglen]), self.seed, self.tidx)
                off += msglen
        except StreamMismatch as e:
            r.error = str(e)
            return False
        except lbmc.LbmcDecodeError as e:
            r.error = f"DATA {d.sqn} does not carry whole LBMC messages: {e}"
            return False
        return True
