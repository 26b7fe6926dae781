"""The LBT-RU-like datagram protocol: its datagrams, source and receiver (see
:mod:`lbmr_tools.sim.dataplane`), one session per receiver from sequence 0.
``lbmr-sim`` no longer uses it (its LBT-RU sources are live UM LBT-RU
sessions, :mod:`.rulive`); the router's tests and benchmarks of
per-receiver datagram relaying do."""

from __future__ import annotations

import errno
import math
import socket
import struct
from dataclasses import dataclass, field, fields

import trio

from .pattern import Pattern, ReceiveRates, check_seed, pattern

Addr = tuple[str, int]

RU_SEQ_SPACING = 65536  # RU-DATA payload of sequence q: the stream at q * 65536
RU_MAX_DATAGRAM = 1400
TAG_HELLO = b"RU-HELLO"
TAG_DATA = b"RU-DATA"
TAG_END = b"RU-END"
TAG_STATUS = b"RU-STATUS"
DATA_HDR = struct.Struct("!7sQH")
HELLO = struct.Struct("!8sQ")
END = struct.Struct("!6sQ")
STATUS = struct.Struct("!9sQQB")
RU_MIN_DATAGRAM = DATA_HDR.size + 8  # room for the payload's offset stamp
NO_SEQ = (1 << 64) - 1
FLAG_END_SEEN = 0x01


# ------------------------------------------------------------ LBT-RU-like


def encode_hello(seed: int) -> bytes:
    return HELLO.pack(TAG_HELLO, seed)


def encode_data(pat: Pattern, seq: int, datagram_size: int) -> bytes:
    """The RU-DATA datagram of sequence ``seq``, ``datagram_size`` bytes."""
    n = datagram_size - DATA_HDR.size
    return DATA_HDR.pack(TAG_DATA, seq, n) + pat.bytes_at(seq * RU_SEQ_SPACING, n)


def encode_end(count: int) -> bytes:
    return END.pack(TAG_END, count)


def encode_status(highest: int | None, received: int, end_seen: bool) -> bytes:
    return STATUS.pack(TAG_STATUS, NO_SEQ if highest is None else highest, received,
                       FLAG_END_SEEN if end_seen else 0)


def parse_datagram(data: bytes) -> tuple:
    """("hello", seed) | ("data", seq, length field, payload) | ("end", count) |
    ("status", highest or None, received, flags) | ("malformed",)."""
    if data.startswith(TAG_DATA):
        if len(data) < DATA_HDR.size:
            return ("malformed",)
        _, seq, n = DATA_HDR.unpack_from(data)
        return ("data", seq, n, memoryview(data)[DATA_HDR.size:])
    if data.startswith(TAG_HELLO) and len(data) == HELLO.size:
        return ("hello", HELLO.unpack(data)[1])
    if data.startswith(TAG_END) and len(data) == END.size:
        return ("end", END.unpack(data)[1])
    if data.startswith(TAG_STATUS) and len(data) == STATUS.size:
        _, high, rcvd, flags = STATUS.unpack(data)
        return ("status", None if high == NO_SEQ else high, rcvd, flags)
    return ("malformed",)


@dataclass
class RuSession:
    """One receiver an :class:`RuDataSource` served."""

    peer: str
    started: float
    finished: float | None = None
    datagrams_sent: int = 0
    bytes_sent: int = 0
    ends_sent: int = 0
    status_received: int = 0
    reported_highest: int | None = None  # from the last STATUS
    reported_received: int = 0
    end_acked: bool = False  # a STATUS with the END flag arrived
    complete: bool = False  # every datagram and the ENDs sent
    send_errors: int = 0
    _acked: trio.Event = field(default_factory=trio.Event, repr=False)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}


class RuDataSource:
    """The source side of the LBT-RU-like protocol (module docstring).

    One UDP socket on (``bind_ip``, ``port``); every receiver address that
    sends a HELLO with ``seed`` gets ``count`` RU-DATA datagrams of
    ``datagram_size`` bytes at ``rate`` datagrams per second (bursts of at
    most ``max_burst``), then RU-END. At most ``max_sessions`` receivers are
    served over the source's life (each address once). ``sessions`` maps
    "ip:port" to :class:`RuSession`; ``counters`` counts the rest (hellos,
    hellos_rejected, hellos_repeated, sessions_refused, status_unknown,
    malformed, recv_errors).
    """

    def __init__(self, bind_ip: str = "127.0.0.1", port: int = 0, *, count: int = 1000,
                 seed: int = 0, datagram_size: int = RU_MAX_DATAGRAM, rate: float = 10000.0,
                 max_burst: int = 32, end_repeats: int = 5, end_interval: float = 0.02,
                 max_sessions: int = 1024, snd_buf: int = 1 << 20) -> None:
        if count < 0:
            raise ValueError("count must be >= 0")
        if not RU_MIN_DATAGRAM <= datagram_size <= RU_MAX_DATAGRAM:
            raise ValueError(f"datagram_size must be {RU_MIN_DATAGRAM}..{RU_MAX_DATAGRAM}")
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError("rate must be a positive number of datagrams per second")
        if max_burst < 1 or end_repeats < 1 or not end_interval > 0 or max_sessions < 1:
            raise ValueError("max_burst, end_repeats, end_interval and max_sessions must be positive")
        self.bind_ip = bind_ip
        self.port = port
        self.count = count
        self.seed = check_seed(seed)
        self.datagram_size = datagram_size
        self.rate = float(rate)
        self.max_burst = max_burst
        self.end_repeats = end_repeats
        self.end_interval = end_interval
        self.max_sessions = max_sessions
        self.snd_buf = snd_buf
        self.address: Addr | None = None
        self.sessions: dict[str, RuSession] = {}
        self.counters: dict[str, int] = dict.fromkeys(
            ("hellos", "hellos_rejected", "hellos_repeated", "sessions_refused", "status_unknown",
             "malformed", "recv_errors"), 0)
        self._sock = None
        self._send_lock = trio.Lock()

    @property
    def datagrams_sent(self) -> int:
        return sum(s.datagrams_sent for s in self.sessions.values())

    @property
    def status_received(self) -> int:
        return sum(s.status_received for s in self.sessions.values())

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Bind, report the bound (ip, port) through ``task_status.started``,
        serve receivers until cancelled. Raises OSError before ``started``."""
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.snd_buf)
            await sock.bind((self.bind_ip, self.port))
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self.address = sock.getsockname()[:2]
        with sock:
            async with trio.open_nursery() as nursery:
                task_status.started(self.address)
                while True:
                    try:
                        data, src = await sock.recvfrom(2048)
                    except OSError:
                        self.counters["recv_errors"] += 1
                        await trio.sleep(0)  # never spin on a pending socket error
                        continue
                    self._on_datagram(data, src[:2], nursery)

    def _on_datagram(self, data: bytes, src: Addr, nursery) -> None:
        msg = parse_datagram(data)
        key = f"{src[0]}:{src[1]}"
        c = self.counters
        if msg[0] == "hello":
            c["hellos"] += 1
            if msg[1] != self.seed:
                c["hellos_rejected"] += 1
            elif key in self.sessions:
                c["hellos_repeated"] += 1
            elif len(self.sessions) >= self.max_sessions:
                c["sessions_refused"] += 1
            else:
                st = RuSession(key, trio.current_time())
                self.sessions[key] = st
                nursery.start_soon(self._session, src, st)
        elif msg[0] == "status":
            st = self.sessions.get(key)
            if st is None:
                c["status_unknown"] += 1
                return
            st.status_received += 1
            st.reported_highest, st.reported_received = msg[1], msg[2]
            if msg[3] & FLAG_END_SEEN and st.ends_sent:
                st.end_acked = True
                st._acked.set()
        else:
            c["malformed"] += 1

    async def _send(self, st: RuSession, data: bytes, dest: Addr) -> bool:
        async with self._send_lock:  # one task at a time waits for a full send buffer
            try:
                await self._sock.sendto(data, dest)
            except OSError:
                st.send_errors += 1
                return False
        return True

    async def _session(self, dest: Addr, st: RuSession) -> None:
        pat = pattern(self.seed)
        size, count, rate = self.datagram_size, self.count, self.rate
        t0 = trio.current_time()
        seq = 0
        try:
            while seq < count:
                # + 1e-6: waking at t0 + seq / rate must make seq due despite float rounding
                due = min(count, math.floor((trio.current_time() - t0) * rate + 1e-6) + 1)
                if due <= seq:
                    await trio.sleep_until(t0 + seq / rate)
                    continue
                for _ in range(min(due - seq, self.max_burst)):
                    if await self._send(st, encode_data(pat, seq, size), dest):
                        st.datagrams_sent += 1
                        st.bytes_sent += size
                    seq += 1
            end = encode_end(count)
            for _ in range(self.end_repeats):
                await self._send(st, end, dest)
                st.ends_sent += 1
                with trio.move_on_after(self.end_interval):
                    await st._acked.wait()
                if st.end_acked:
                    break
            st.complete = True
        finally:
            st.finished = trio.current_time()


@dataclass
class RuReceiveResult(ReceiveRates):
    """What an :class:`RuDataReceiver` saw. ``ok``: END seen, its count as
    expected (when given), every sequence received once, nothing corrupt."""

    source: str
    expect_count: int | None
    received: int = 0  # distinct, verified sequences
    bytes_received: int = 0  # verified payload bytes
    duplicates: int = 0
    corrupt: int = 0
    out_of_order: int = 0
    missing: int = 0
    highest: int | None = None
    end_count: int | None = None
    hellos_sent: int = 0
    status_sent: int = 0
    foreign: int = 0  # datagrams from another address (ignored)
    error: str | None = None
    elapsed: float = 0.0  # seconds from the first HELLO to the end
    data_elapsed: float = 0.0  # seconds from the first to the last data datagram
    done: bool = False

    @property
    def ok(self) -> bool:
        return (self.done and self.error is None and self.end_count is not None
                and (self.expect_count is None or self.end_count == self.expect_count)
                and self.missing == 0 and self.corrupt == 0 and self.duplicates == 0)


class RuDataReceiver:
    """The receiver side of the LBT-RU-like protocol (module docstring).

    Registers with the source at (``source_ip``, ``port``) and verifies the
    datagrams of ``seed`` (in order or not). ``expect_count`` (None: take
    END's word) is checked against END's count. Bounds: ``hello_attempts``
    HELLOs ``hello_interval`` apart before giving up, ``idle_timeout``
    without a datagram once data flows, ``timeout`` for the whole run,
    sequences below ``max_count``. ``bind_ip`` None binds to 127.0.0.1 for
    a loopback source, else to any address. ``result`` is updated as
    datagrams arrive; :meth:`run` returns it.
    """

    def __init__(self, source_ip: str, port: int, *, seed: int = 0,
                 expect_count: int | None = None, bind_ip: str | None = None,
                 hello_interval: float = 0.1, hello_attempts: int = 50,
                 status_interval: float = 0.05, idle_timeout: float = 2.0, linger: float = 0.05,
                 timeout: float = 60.0, max_count: int = 10_000_000, rcv_buf: int = 4 << 20) -> None:
        if expect_count is not None and not 0 <= expect_count <= max_count:
            raise ValueError("expect_count must be 0..max_count or None")
        if not (hello_interval > 0 and hello_attempts >= 1 and status_interval > 0
                and idle_timeout > 0 and linger >= 0 and timeout > 0):
            raise ValueError("intervals, attempts and timeouts must be positive")
        self.addr: Addr = (source_ip, port)
        self.seed = check_seed(seed)
        self.expect_count = expect_count
        if bind_ip is None:
            bind_ip = "127.0.0.1" if source_ip.startswith("127.") else "0.0.0.0"
        self.bind_ip = bind_ip
        self.hello_interval = hello_interval
        self.hello_attempts = hello_attempts
        self.status_interval = status_interval
        self.idle_timeout = idle_timeout
        self.linger = linger
        self.timeout = timeout
        self.max_count = max_count
        self.rcv_buf = rcv_buf
        self.result = RuReceiveResult(f"{source_ip}:{port}", expect_count)
        self._seen = bytearray()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> RuReceiveResult:
        """Register, verify until END (plus ``linger``) or a bound is hit;
        reports the local (ip, port) through ``task_status.started``."""
        r = self.result
        t0 = trio.current_time()
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        started = False
        try:
            with sock:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcv_buf)
                    await sock.bind((self.bind_ip, 0))
                    task_status.started(sock.getsockname()[:2])
                    started = True
                    with trio.move_on_after(self.timeout) as scope:
                        await self._loop(sock)
                    if scope.cancelled_caught and r.error is None:
                        r.error = f"timeout after {self.timeout:g} s"
                except OSError as e:
                    r.error = r.error or f"socket error: {e.strerror or e}"
                    if not started:
                        task_status.started(None)
                self._finish()
                r.done = True
        except trio.Cancelled:
            self._finish()
            if r.error is None:
                r.error = f"cancelled after {r.received} datagrams"
            raise
        finally:
            r.elapsed = trio.current_time() - t0
        return r

    def _finish(self) -> None:
        r = self.result
        if r.end_count is not None:
            n = min(r.end_count, len(self._seen))
            r.missing = r.end_count - sum(self._seen[:n])  # each byte of _seen is 0 or 1
        elif r.highest is not None:
            r.missing = r.highest + 1 - r.received

    async def _send(self, sock, data: bytes) -> None:
        try:
            await sock.sendto(data, self.addr)
        except OSError as e:
            if e.errno not in (errno.ECONNREFUSED, errno.EAGAIN):
                raise

    async def _loop(self, sock) -> None:
        r = self.result
        pat = pattern(self.seed)
        seen = self._seen
        expect_n = None  # payload length, from the first data datagram
        first_data = last_data = None
        next_hello = trio.current_time()
        next_status = math.inf
        last_rx = None
        end_at = None  # time of the first END
        end_seen = False
        while True:
            now = trio.current_time()
            if last_rx is None:
                if now >= next_hello:
                    if r.hellos_sent >= self.hello_attempts:
                        r.error = (f"no answer from {r.source} after {r.hellos_sent} HELLOs "
                                   f"{self.hello_interval:g} s apart")
                        return
                    await self._send(sock, encode_hello(self.seed))
                    r.hellos_sent += 1
                    next_hello = now + self.hello_interval
                wake = next_hello
            else:
                if end_at is not None and now >= end_at + self.linger:
                    return
                if now - last_rx >= self.idle_timeout:
                    if end_at is None:
                        r.error = (f"stalled: nothing from {r.source} for {self.idle_timeout:g} s "
                                   f"after {r.received} datagrams")
                    return
                if now >= next_status:
                    await self._send(sock, encode_status(r.highest, r.received, end_seen))
                    r.status_sent += 1
                    next_status = now + self.status_interval
                wake = min(next_status, last_rx + self.idle_timeout,
                           math.inf if end_at is None else end_at + self.linger)
            with trio.move_on_at(wake):
                try:
                    data, src = await sock.recvfrom(65536)
                except OSError:  # an ICMP error reported on the socket
                    await trio.sleep(0)
                    continue
                now = trio.current_time()
                if (src[0], src[1]) != self.addr:
                    r.foreign += 1
                    continue
                if last_rx is None:
                    next_status = now  # data flows: report at once, then every status_interval
                last_rx = now
                msg = parse_datagram(data)
                kind = msg[0]
                if kind == "data":
                    _, seq, n, payload = msg
                    bad = None
                    if n != len(payload):
                        bad = f"length field {n} but {len(payload)} payload bytes"
                    elif expect_n is not None and n != expect_n:
                        bad = f"payload of {n} bytes, earlier ones had {expect_n}"
                    elif seq >= self.max_count or (r.end_count is not None and seq >= r.end_count):
                        bad = "sequence out of range"
                    else:
                        i = pat.check(seq * RU_SEQ_SPACING, payload)
                        if i is not None:
                            bad = f"payload byte {i} wrong"
                    if bad is not None:
                        r.corrupt += 1
                        if r.error is None:
                            r.error = f"corrupt datagram (sequence {seq}): {bad}"
                        continue
                    expect_n = n
                    if seq >= len(seen):
                        seen.extend(bytes(min(self.max_count, max(seq + 1, 2 * len(seen), 1024))
                                          - len(seen)))
                    if seen[seq]:
                        r.duplicates += 1
                        if r.error is None:
                            r.error = f"duplicate datagram (sequence {seq})"
                        continue
                    seen[seq] = 1
                    r.received += 1
                    r.bytes_received += n
                    if r.highest is None or seq > r.highest:
                        r.highest = seq
                    else:
                        r.out_of_order += 1
                    if first_data is None:
                        first_data = now
                    last_data = now
                    r.data_elapsed = last_data - first_data
                elif kind == "end":
                    if r.end_count is None:
                        r.end_count = msg[1]
                        end_at = now
                        if self.expect_count is not None and msg[1] != self.expect_count:
                            r.error = f"END announces {msg[1]} datagrams, {self.expect_count} expected"
                    end_seen = True
                    await self._send(sock, encode_status(r.highest, r.received, True))
                    r.status_sent += 1
                else:
                    r.corrupt += 1
                    if r.error is None:
                        r.error = f"unexpected datagram from the source: {bytes(data[:16])!r}"
