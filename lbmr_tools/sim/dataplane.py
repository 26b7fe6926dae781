"""Simple TCP and LBT-RU-like data endpoints that send verifiable numbered data.

They stand in for Ultra Messaging data transports in end-to-end tests (of
``lbmr-sim`` and of the TRD router, which relays TCP streams and LBT-RU
datagrams between domains): a receiver checks every byte it gets, so a relay
that loses, duplicates, reorders, truncates or corrupts data is caught, with
the exact position. Everything runs on trio, in the caller's tasks (no
threads), and every endpoint is bounded in time and volume.

The data pattern
----------------
A stream is keyed by a 64-bit ``seed``. Its byte at offset ``o`` is

* byte ``o mod 4096`` of the big-endian u64 ``o - o mod 4096`` when
  ``o mod 4096 < 8`` (every 4096-byte block starts with its own offset), else
* ``P[o mod 1048573]``, where ``P`` is the first 1048573 bytes of
  SHAKE128(``b"lbmr-dataplane/1"`` + big-endian u64 ``seed``).

Any position can be verified on its own; the period of ``P`` (odd, so it
drifts against the blocks) plus the offset stamps make every shift, loss or
repetition visible. Generation is a slice of a precomputed buffer plus one
8-byte stamp per 4 KiB (:class:`Pattern`, several GB/s).
:func:`topic_seed` derives per-topic seeds (used by ``lbmr-sim``).

TCP
---
:class:`TcpDataSource` listens; every connection gets the stream from
offset 0, ``total_bytes`` bytes, then the source closes it (0: until the
peer goes away). :class:`TcpDataReceiver` connects, verifies everything
incrementally and reports bytes, the first mismatching offset, throughput
and whether the stream ended exactly at ``expect_bytes``; it can throttle
its reads to play a slow receiver.

The LBT-RU-like datagram protocol
---------------------------------
Real LBT-RU framing is proprietary; this is a simplified protocol of our
own, over UDP, unicast, one source socket serving any number of receivers.
All integers are big-endian; every datagram starts with an ASCII tag.

=============  ===================================================  =========
datagram       layout                                                 size
=============  ===================================================  =========
``RU-HELLO``   tag, u64 seed                                          16
``RU-DATA``    tag, u64 sequence, u16 payload length, payload         17 + n
``RU-END``     tag, u64 count                                         14
``RU-STATUS``  tag, u64 highest sequence (2**64-1: none), u64         26
               received count, u8 flags (0x01: END seen)
=============  ===================================================  =========

1. The receiver sends ``RU-HELLO`` with the seed it expects to the source's
   advertised (ip, port), again every ``hello_interval`` until the first
   datagram from that address arrives (at most ``hello_attempts`` times).
2. The source accepts a HELLO whose seed is its own, once per receiver
   address, and sends ``RU-DATA`` sequences 0..count-1 from the same socket
   to the address the HELLO came from, paced at ``rate`` datagrams per
   second. The payload of sequence ``q`` (``n`` bytes) is the pattern at
   offsets ``q * 65536 .. q * 65536 + n`` (it starts with the stamp
   ``q * 65536``).
3. Then it sends ``RU-END`` with the count, every ``end_interval`` until a
   STATUS with the END flag arrives, at most ``end_repeats`` times.
4. The receiver sends ``RU-STATUS`` every ``status_interval`` once data
   flows, and one with the END flag for every END it gets; it stays
   ``linger`` seconds after the first END, then reports.

There are no retransmissions: loss is counted, not repaired. Traffic flows
both ways (HELLO and STATUS towards the source, which counts the STATUS
datagrams), so a relay that forwards one direction only is noticed.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import math
import socket
import struct
from dataclasses import asdict, dataclass, field, fields

import trio

__all__ = [
    "PATTERN_LEN", "STAMP_INTERVAL", "RU_SEQ_SPACING", "RU_MAX_DATAGRAM", "RU_MIN_DATAGRAM",
    "Pattern", "pattern", "topic_seed",
    "TcpDataSource", "TcpConnStats", "TcpDataReceiver", "TcpReceiveResult",
    "RuDataSource", "RuSession", "RuDataReceiver", "RuReceiveResult",
    "encode_hello", "encode_data", "encode_end", "encode_status", "parse_datagram",
]

Addr = tuple[str, int]

PATTERN_LEN = 1_048_573  # odd: the pattern drifts against the 4 KiB blocks
STAMP_INTERVAL = 4096  # every block of this many bytes starts with its u64 offset
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
U64 = struct.Struct("!Q")
U64_MAX = (1 << 64) - 1
_DOMAIN = b"lbmr-dataplane/1"
_TOPIC_DOMAIN = b"lbmr-dataplane/topic"


def _check_seed(seed: int) -> int:
    if not isinstance(seed, int) or not 0 <= seed <= U64_MAX:
        raise ValueError(f"seed must be an integer in 0..2**64-1, not {seed!r}")
    return seed


# ----------------------------------------------------------------- pattern


class Pattern:
    """The byte stream of one seed (see the module docstring)."""

    __slots__ = ("seed", "_mv")

    def __init__(self, seed: int) -> None:
        self.seed = _check_seed(seed)
        base = hashlib.shake_128(_DOMAIN + U64.pack(seed)).digest(PATTERN_LEN)
        self._mv = memoryview(base + base)  # doubled: any window of <= PATTERN_LEN is one slice

    def bytes_at(self, offset: int, n: int) -> bytearray:
        """The ``n`` bytes of the stream from ``offset``."""
        if offset < 0 or n < 0:
            raise ValueError("offset and length must be >= 0")
        s = offset % PATTERN_LEN
        if n <= PATTERN_LEN:
            out = bytearray(self._mv[s:s + n])
        else:
            out = bytearray()
            while len(out) < n:
                k = min(PATTERN_LEN, n - len(out))
                out += self._mv[s:s + k]
                s = (s + k) % PATTERN_LEN
        end = offset + n
        first = offset - offset % STAMP_INTERVAL
        if offset - first >= 8:
            first += STAMP_INTERVAL
        pack_into = U64.pack_into
        for b in range(first, end, STAMP_INTERVAL):
            if b >= offset and b + 8 <= end:
                pack_into(out, b - offset, b)
            else:  # a stamp cut by the window's start or end
                lo, hi = max(b, offset), min(b + 8, end)
                out[lo - offset:hi - offset] = U64.pack(b)[lo - b:hi - b]
        return out

    def check(self, offset: int, data) -> int | None:
        """Index in ``data`` of the first byte that differs from the stream
        at ``offset`` (None when all match)."""
        expected = self.bytes_at(offset, len(data))
        if expected == data:
            return None
        return first_difference(expected, data)


def first_difference(a, b) -> int:
    """Index of the first differing byte of ``a`` and ``b`` (the shorter
    length when one is a prefix of the other)."""
    ma, mb = memoryview(a).cast("B"), memoryview(b).cast("B")
    lo, hi = 0, min(len(ma), len(mb))
    while hi - lo > 64:  # invariant: a[:lo] == b[:lo] and a difference exists in [lo, hi) or at hi
        mid = (lo + hi) // 2
        if ma[lo:mid] == mb[lo:mid]:
            lo = mid
        else:
            hi = mid
    for i in range(lo, hi):
        if ma[i] != mb[i]:
            return i
    return hi


@functools.lru_cache(maxsize=32)
def pattern(seed: int) -> Pattern:
    """The (cached) :class:`Pattern` of ``seed``."""
    return Pattern(seed)


def topic_seed(topic: str | bytes, seed: int = 0) -> int:
    """A per-topic u64 seed: the first 8 bytes (big-endian) of
    SHAKE128(``b"lbmr-dataplane/topic"`` + u64 ``seed`` + topic bytes)."""
    raw = topic.encode() if isinstance(topic, str) else bytes(topic)
    return int.from_bytes(hashlib.shake_128(_TOPIC_DOMAIN + U64.pack(_check_seed(seed)) + raw)
                          .digest(8), "big")


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else 0.0


# --------------------------------------------------------------------- TCP


@dataclass
class TcpConnStats:
    """One connection a :class:`TcpDataSource` served."""

    peer: str
    bytes_sent: int = 0
    started: float = 0.0  # trio.current_time()
    finished: float | None = None
    complete: bool = False  # all total_bytes handed to the kernel and the connection closed
    error: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


class TcpDataSource:
    """Serve the stream of ``seed`` to every connecting receiver.

    Listens on (``bind_ip``, ``port``) (0: a kernel-chosen port); each
    connection gets ``total_bytes`` bytes from offset 0 in writes of
    ``chunk`` bytes, then is closed; with ``total_bytes`` 0 the source sends
    until the peer goes away (or the task is cancelled). At most
    ``max_connections`` connections are accepted (None: no limit), after
    which :meth:`serve` returns once they are done. ``connections`` holds a
    :class:`TcpConnStats` per connection, updated as bytes go out.
    """

    def __init__(self, bind_ip: str = "127.0.0.1", port: int = 0, total_bytes: int = 0,
                 chunk: int = 65536, seed: int = 0, *, max_connections: int | None = None,
                 backlog: int = 128) -> None:
        if total_bytes < 0:
            raise ValueError("total_bytes must be >= 0")
        if not 1 <= chunk <= PATTERN_LEN:
            raise ValueError(f"chunk must be 1..{PATTERN_LEN}")
        if max_connections is not None and max_connections < 1:
            raise ValueError("max_connections must be >= 1 or None")
        self.bind_ip = bind_ip
        self.port = port
        self.total_bytes = total_bytes
        self.chunk = chunk
        self.seed = _check_seed(seed)
        self.max_connections = max_connections
        self.backlog = backlog
        self.address: Addr | None = None
        self.connections: list[TcpConnStats] = []

    @property
    def bytes_sent(self) -> int:
        return sum(c.bytes_sent for c in self.connections)

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Bind, report the bound (ip, port) through ``task_status.started``
        and serve connections until cancelled (or ``max_connections`` are
        done). Raises OSError (e.g. EADDRINUSE) before ``started``."""
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            await sock.bind((self.bind_ip, self.port))
            sock.listen(self.backlog)
        except BaseException:
            sock.close()
            raise
        listener = trio.SocketListener(sock)
        self.address = sock.getsockname()[:2]
        async with trio.open_nursery() as nursery:
            async with listener:
                task_status.started(self.address)
                accepted = 0
                while self.max_connections is None or accepted < self.max_connections:
                    try:
                        stream = await listener.accept()
                    except OSError:  # e.g. EMFILE; try again later
                        await trio.sleep(0.05)
                        continue
                    accepted += 1
                    nursery.start_soon(self._serve_one, stream)

    async def _serve_one(self, stream: trio.SocketStream) -> None:
        try:
            peer = "{}:{}".format(*stream.socket.getpeername()[:2])
        except OSError:  # already gone
            peer = "?"
        st = TcpConnStats(peer, started=trio.current_time())
        self.connections.append(st)
        pat = pattern(self.seed)
        total, chunk = self.total_bytes, self.chunk
        try:
            async with stream:
                off = 0
                while total == 0 or off < total:
                    n = chunk if total == 0 else min(chunk, total - off)
                    await stream.send_all(pat.bytes_at(off, n))
                    off += n
                    st.bytes_sent = off
                st.complete = True
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            st.error = f"connection lost after {st.bytes_sent} bytes: {e or type(e).__name__}"
        finally:
            st.finished = trio.current_time()


@dataclass
class TcpReceiveResult:
    """What a :class:`TcpDataReceiver` saw. ``exact``: the stream ended
    (EOF) right after ``expect_bytes`` bytes; ``ok``: exact, every byte
    verified and no error."""

    peer: str
    expect_bytes: int | None
    bytes_received: int = 0
    connected: bool = False
    eof: bool = False
    first_mismatch: int | None = None  # stream offset of the first wrong byte
    expected_byte: int | None = None
    got_byte: int | None = None
    error: str | None = None  # the first problem, readable
    elapsed: float = 0.0  # seconds from connection to the end
    done: bool = False

    @property
    def exact(self) -> bool:
        return self.eof and self.expect_bytes is not None and self.bytes_received == self.expect_bytes

    @property
    def ok(self) -> bool:
        return self.done and self.error is None and self.first_mismatch is None and (
            self.exact or (self.expect_bytes is None and self.bytes_received > 0))

    @property
    def bytes_per_s(self) -> float:
        return _rate(self.bytes_received, self.elapsed)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(exact=self.exact, ok=self.ok, bytes_per_s=round(self.bytes_per_s, 1))
        return d


class TcpDataReceiver:
    """Connect to a :class:`TcpDataSource` (or whatever relays one) and
    verify the stream of ``seed``.

    Reads until EOF; more than ``expect_bytes`` bytes is an error
    ("overrun"); fewer at EOF is "truncated". With ``expect_bytes`` None it
    reads until EOF or ``max_bytes``. ``rate_limit_bps`` (bytes per second)
    throttles the reads to play a slow receiver. ``timeout`` bounds the
    whole run, ``idle_timeout`` the wait for each read. ``bind_ip`` is the
    local address to connect from (None: the kernel's choice).
    ``result`` is updated as data arrives; :meth:`run` returns it.
    """

    def __init__(self, connect_ip: str, port: int, expect_bytes: int | None, seed: int = 0, *,
                 rate_limit_bps: float | None = None, timeout: float = 60.0,
                 idle_timeout: float = 5.0, bind_ip: str | None = None, read_size: int = 262144,
                 max_bytes: int | None = None) -> None:
        if expect_bytes is not None and expect_bytes < 0:
            raise ValueError("expect_bytes must be >= 0 or None")
        if rate_limit_bps is not None and not rate_limit_bps > 0:
            raise ValueError("rate_limit_bps must be > 0 or None")
        if not (timeout > 0 and idle_timeout > 0 and read_size > 0):
            raise ValueError("timeouts and read_size must be > 0")
        self.addr: Addr = (connect_ip, port)
        self.expect_bytes = expect_bytes
        self.seed = _check_seed(seed)
        self.rate_limit_bps = rate_limit_bps
        self.timeout = timeout
        self.idle_timeout = idle_timeout
        self.bind_ip = bind_ip
        self.read_size = min(read_size, PATTERN_LEN)
        self.max_bytes = max_bytes
        self.result = TcpReceiveResult(f"{connect_ip}:{port}", expect_bytes)

    async def _connect(self) -> trio.SocketStream:
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            if self.bind_ip is not None:
                await sock.bind((self.bind_ip, 0))
            await sock.connect(self.addr)
        except BaseException:
            sock.close()
            raise
        return trio.SocketStream(sock)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> TcpReceiveResult:
        """Connect, verify until the stream ends or a bound is hit; reports
        the local (ip, port) through ``task_status.started`` once connected
        (or None when the connection failed)."""
        r = self.result
        t0 = trio.current_time()
        try:
            with trio.move_on_after(self.timeout) as scope:
                try:
                    stream = await self._connect()
                except OSError as e:
                    r.error = f"connect to {r.peer} failed: {e.strerror or e}"
                    task_status.started(None)
                    r.done = True
                    return r
                r.connected = True
                t0 = trio.current_time()
                async with stream:
                    task_status.started(stream.socket.getsockname()[:2])
                    await self._read(stream, t0)
            if scope.cancelled_caught and r.error is None:
                r.error = f"timeout after {self.timeout:g} s at {r.bytes_received} bytes"
            r.done = True
        except trio.Cancelled:
            if r.error is None:
                r.error = f"cancelled at {r.bytes_received} bytes"
            raise
        finally:
            r.elapsed = trio.current_time() - t0
        return r

    async def _read(self, stream: trio.SocketStream, t0: float) -> None:
        r = self.result
        pat = pattern(self.seed)
        expect, rate = self.expect_bytes, self.rate_limit_bps
        size = self.read_size
        if rate is not None:  # read in steps of about 20 ms of the rate
            size = max(1024, min(size, int(rate / 50)))
        off = 0
        verify = True
        while True:
            want = size
            if expect is not None:
                want = max(1, min(want, expect - off + 1))  # one more byte detects an overrun
            elif self.max_bytes is not None:
                want = min(want, self.max_bytes - off)
                if want <= 0:
                    return
            with trio.move_on_after(self.idle_timeout) as idle:
                try:
                    data = await stream.receive_some(want)
                except (trio.BrokenResourceError, OSError) as e:
                    r.error = f"connection lost at {off} bytes: {e or type(e).__name__}"
                    return
            if idle.cancelled_caught:
                r.error = f"nothing received for {self.idle_timeout:g} s at {off} bytes"
                return
            if not data:
                r.eof = True
                if expect is not None and off < expect:
                    r.error = f"truncated: the stream ended at {off} of {expect} bytes"
                return
            if verify:
                i = pat.check(off, data)
                if i is not None:
                    verify = False
                    r.first_mismatch = off + i
                    r.expected_byte = pat.bytes_at(off + i, 1)[0]
                    r.got_byte = data[i]
                    if r.error is None:
                        r.error = (f"mismatch at offset {off + i}: expected 0x{r.expected_byte:02x}, "
                                   f"got 0x{r.got_byte:02x}")
            off += len(data)
            r.bytes_received = off
            if expect is not None and off > expect:
                r.error = r.error or f"overrun: more than the {expect} bytes expected"
                return
            if rate is not None:
                await trio.sleep_until(t0 + off / rate)


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
        self.seed = _check_seed(seed)
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
class RuReceiveResult:
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

    @property
    def datagrams_per_s(self) -> float:
        return _rate(self.received, self.data_elapsed)

    @property
    def bytes_per_s(self) -> float:
        return _rate(self.bytes_received, self.data_elapsed)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(ok=self.ok, datagrams_per_s=round(self.datagrams_per_s, 1),
                 bytes_per_s=round(self.bytes_per_s, 1))
        return d


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
        self.seed = _check_seed(seed)
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
