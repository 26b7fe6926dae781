"""The TCP data source and receiver: one live LBMC stream per session, as a
UM LBT-TCP source sends it (see :mod:`lbmr_tools.sim.dataplane`)."""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass

import trio

from lbmr_proto import lbmc, lbmc_stream

from .live import (
    DEFAULT_MESSAGE_RATE,
    DEFAULT_MESSAGE_SIZE,
    MAX_PAYLOAD,
    LiveMessages,
    MessageClock,
    StreamMismatch,
    data_message,
    message_payload,
    open_tcp_listener,
    verify_message,
)
from .pattern import check_seed, rate_of

__all__ = ["TcpDataSource", "TcpConnStats", "TcpDataReceiver", "TcpReceiveResult", "StreamReceiver",
           "DEFAULT_MESSAGE_RATE", "DEFAULT_MESSAGE_SIZE", "MAX_PAYLOAD", "data_message",
           "message_payload"]

Addr = tuple[str, int]


@dataclass
class TcpConnStats:
    """One receiver connection a :class:`TcpDataSource` served: ``first_sqn``
    is the sequence number of the first message it got (None: none yet)."""

    peer: str
    started: float = 0.0  # trio.current_time()
    finished: float | None = None
    bytes_sent: int = 0  # stream bytes (whole messages)
    messages_sent: int = 0  # data messages
    first_sqn: int | None = None
    control_received: int = 0  # messages from the receiver (e.g. source-side filtering)
    error: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


class _Conn:
    __slots__ = ("stream", "stats", "prefix")

    def __init__(self, stream: trio.SocketStream, stats: TcpConnStats, prefix: bytes) -> None:
        self.stream, self.stats, self.prefix = stream, stats, prefix


class TcpDataSource:
    """A live LBT-TCP source: one stream of LBMC data messages for all receivers.

    Listens on (``bind_ip``, ``port``). A clock makes message ``sqn`` due at
    ``sqn / rate`` seconds after :meth:`serve` starts; every due message
    (topic index ``tidx``, ``message_size`` payload bytes, see
    :func:`data_message`) goes to every receiver connected at that moment, in
    batches of at most ``max_burst`` messages, one receiver after the other:
    the slowest receiver paces the source, as a UM TCP source's receivers do
    by default. The stream is never replayed: a receiver that connects gets
    the messages from the next batch on (first, when ``session_id`` is given,
    a CONTROL message with that TCP session id); the clock runs only while
    receivers are connected (``dropped`` stays 0). A receiver that
    takes more than ``stall_timeout`` seconds to accept one batch is
    disconnected. After ``max_messages`` messages (None: never) the source
    closes every connection and :meth:`serve` returns. Messages receivers
    send are framed and counted; a malformed one closes that connection.
    ``connections`` holds a :class:`TcpConnStats` per receiver.
    """

    def __init__(self, bind_ip: str = "127.0.0.1", port: int = 0, *, seed: int = 0, tidx: int = 0,
                 session_id: int | None = None, rate: float = DEFAULT_MESSAGE_RATE,
                 message_size: int = DEFAULT_MESSAGE_SIZE, max_burst: int = 8,
                 max_messages: int | None = None, max_receivers: int = 1024,
                 stall_timeout: float = 10.0, backlog: int = 128) -> None:
        if not 1 <= message_size <= MAX_PAYLOAD:
            raise ValueError(f"message_size must be 1..{MAX_PAYLOAD}")
        if max_receivers < 1 or not stall_timeout > 0:
            raise ValueError("max_receivers and stall_timeout must be positive")
        self.clock = MessageClock(rate, max_burst, max_messages)
        self.bind_ip, self.port, self.backlog = bind_ip, port, backlog
        self.seed = check_seed(seed)
        self.tidx = tidx
        self.session_id = session_id
        self.message_size = message_size
        self.max_receivers = max_receivers
        self.stall_timeout = stall_timeout
        self.address: Addr | None = None
        self.connections: list[TcpConnStats] = []
        self.dropped = 0  # messages made while no receiver was connected
        self.refused = 0  # connections beyond max_receivers
        self._live: list[_Conn] = []
        self._nursery = None

    @property
    def next_sqn(self) -> int:
        """Messages the clock made so far."""
        return self.clock.next_sqn

    @property
    def bytes_sent(self) -> int:
        return sum(c.bytes_sent for c in self.connections)

    def _prefix(self) -> bytes:
        if self.session_id is None:
            return b""
        return lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(lbmc.TcpSidHeader(0, self.session_id),)))

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Bind, report the bound (ip, port) through ``task_status.started``,
        send until cancelled (or ``max_messages``). Raises OSError (e.g.
        EADDRINUSE) before ``started``."""
        listener = await open_tcp_listener(self.bind_ip, self.port, self.backlog)
        self.address = listener.socket.getsockname()[:2]
        try:
            async with trio.open_nursery() as nursery, listener:
                self._nursery = nursery
                nursery.start_soon(self._accept, listener, nursery)
                task_status.started(self.address)
                await self._clock()
                nursery.cancel_scope.cancel()
        finally:
            for c in self._live:
                self._close(c, None)

    async def _accept(self, listener: trio.SocketListener, nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError:  # e.g. EMFILE; try again later
                await trio.sleep(0.05)
                continue
            if len(self._live) >= self.max_receivers:
                self.refused += 1
                await stream.aclose()
                continue
            try:
                peer = "{}:{}".format(*stream.socket.getpeername()[:2])
            except OSError:  # already gone
                peer = "?"
            c = _Conn(stream, TcpConnStats(peer, started=trio.current_time()), self._prefix())
            self.connections.append(c.stats)
            self._live.append(c)
            self.clock.run()
            nursery.start_soon(self._read, c)

    async def _read(self, c: _Conn) -> None:
        """Frame and count what the receiver sends; close it on a malformed message."""
        framer = lbmc_stream.StreamFramer()
        try:
            while True:
                data = await c.stream.receive_some(65536)
                if not data:
                    return
                for raw in framer.feed(data):
                    c.stats.control_received += 1
                    self._from_receiver(c, raw)
        except lbmc.LbmcDecodeError as e:
            self._close(c, f"malformed message from the receiver: {e}")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return

    def _close(self, c: _Conn, error: str | None) -> None:
        if c in self._live:
            self._live.remove(c)
            if not self._live:
                self.clock.stop()
        c.stats.error = c.stats.error or error
        c.stats.finished = trio.current_time()
        c.stream.socket.close()

    async def _clock(self) -> None:
        clock = self.clock
        while True:
            sqn, n = await clock.next_batch()
            if not n:
                return
            if not self._live:
                self.dropped += n
                continue
            batch = self._batch(sqn, n)
            for c in list(self._live):
                await self._send(c, batch, sqn, n)

    def _batch(self, sqn: int, n: int) -> bytes:
        """The bytes of messages ``sqn`` to ``sqn + n - 1``."""
        return b"".join([data_message(self.seed, self.tidx, q, self.message_size)
                         for q in range(sqn, sqn + n)])

    def _from_receiver(self, c: _Conn, raw: bytes) -> None:
        """One whole message from receiver ``c`` (counted; a plain source ignores it)."""

    async def _send(self, c: _Conn, batch: bytes, sqn: int, n: int) -> None:
        data = c.prefix + batch if c.prefix else batch
        try:
            with trio.move_on_after(self.stall_timeout) as scope:
                await c.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            self._close(c, f"connection lost after {c.stats.bytes_sent} bytes: {e or type(e).__name__}")
            return
        if scope.cancelled_caught:
            self._close(c, f"stalled: a batch not taken in {self.stall_timeout:g} s")
            return
        c.prefix = b""
        st = c.stats
        if st.first_sqn is None:
            st.first_sqn = sqn
        st.bytes_sent += len(data)
        st.messages_sent += n


@dataclass
class TcpReceiveResult(LiveMessages):
    """What a :class:`TcpDataReceiver` saw. ``bytes_received``: verified
    payload bytes; ``stream_bytes``: every byte the connection carried;
    ``messages``: verified data messages, consecutive from ``first_sqn`` to
    ``last_sqn``; ``ok``: done, no error, and ``expect_bytes`` payload bytes
    verified (some, when None)."""

    peer: str = ""
    expect_bytes: int | None = None
    stream_bytes: int = 0
    connected: bool = False
    eof: bool = False
    error: str | None = None  # the first problem, readable
    elapsed: float = 0.0  # seconds from connection to the end
    done: bool = False

    @property
    def ok(self) -> bool:
        return self.done and self.error is None and self.messages > 0 and (
            self.expect_bytes is None or self.bytes_received >= self.expect_bytes)

    @property
    def bytes_per_s(self) -> float:
        return rate_of(self.bytes_received, self.elapsed)


class StreamReceiver:
    """What the TCP receivers share: connect from ``bind_ip`` to ``addr``
    within ``timeout`` and hand the stream to ``_read(stream, t0)`` (each
    receiver class defines it), keeping
    ``result`` (``peer``, ``error``, ``connected``, ``done``, ``elapsed``,
    ``bytes_received``) up to date."""

    addr: Addr
    bind_ip: str | None
    timeout: float
    result: object

    def _settings(self, connect_ip: str, port: int, expect_bytes: int | None, seed: int,
                  rate_limit_bps: float | None, timeout: float, idle_timeout: float,
                  bind_ip: str | None, read_size: int, max_bytes: int | None) -> None:
        """The receivers' common settings, checked (ValueError)."""
        if expect_bytes is not None and expect_bytes < 0:
            raise ValueError("expect_bytes must be >= 0 or None")
        if rate_limit_bps is not None and not rate_limit_bps > 0:
            raise ValueError("rate_limit_bps must be > 0 or None")
        if not (timeout > 0 and idle_timeout > 0 and read_size > 0):
            raise ValueError("timeouts and read_size must be > 0")
        self.addr: Addr = (connect_ip, port)
        self.expect_bytes = expect_bytes
        self.seed = check_seed(seed)
        self.rate_limit_bps = rate_limit_bps
        self.timeout = timeout
        self.idle_timeout = idle_timeout
        self.bind_ip = bind_ip
        self.read_size = read_size
        self.max_bytes = max_bytes

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

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) :
        """Connect, verify until done or a bound is hit; reports the local
        (ip, port) through ``task_status.started`` once connected (or None
        when the connection failed); returns ``result``."""
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


class TcpDataReceiver(StreamReceiver):
    """Connect to a :class:`TcpDataSource` (or whatever relays one) and verify
    its live stream of ``seed``: whole LBMC messages from the first byte,
    data messages with consecutive sequence numbers from the first one
    received and one topic index (``tidx``; None: whatever the first says),
    each payload the one its sequence number gives (:func:`message_payload`).

    Stops (and closes the connection) once ``expect_bytes`` payload bytes are
    verified, at a message boundary; with ``expect_bytes`` None at EOF or
    after ``max_bytes``. EOF before ``expect_bytes`` is "truncated".
    ``rate_limit_bps`` (bytes per second) throttles the reads to play a slow
    receiver. ``timeout`` bounds the whole run, ``idle_timeout`` the wait for
    each read. ``bind_ip`` is the local address to connect from (None: the
    kernel's choice). ``result`` is updated as data arrives; :meth:`run`
    returns it.
    """

    def __init__(self, connect_ip: str, port: int, expect_bytes: int | None, seed: int = 0, *,
                 tidx: int | None = None, rate_limit_bps: float | None = None, timeout: float = 60.0,
                 idle_timeout: float = 5.0, bind_ip: str | None = None, read_size: int = 262144,
                 max_bytes: int | None = None) -> None:
        self._settings(connect_ip, port, expect_bytes, seed, rate_limit_bps, timeout, idle_timeout,
                       bind_ip, read_size, max_bytes)
        self.tidx = tidx
        self.result = TcpReceiveResult(peer=f"{connect_ip}:{port}", expect_bytes=expect_bytes)

    def _enough(self) -> bool:
        r = self.result
        if self.expect_bytes is not None:
            return r.bytes_received >= self.expect_bytes
        return self.max_bytes is not None and r.stream_bytes >= self.max_bytes

    async def _read(self, stream: trio.SocketStream, t0: float) -> None:
        r = self.result
        framer = lbmc_stream.StreamFramer()
        rate = self.rate_limit_bps
        size = self.read_size if rate is None else max(1024, min(self.read_size, int(rate / 50)))
        while not self._enough():
            data = await self._receive(stream, size)
            if not data:
                if data is not None and self.expect_bytes is None and framer.buffered:
                    r.error = f"the stream ended inside a message ({framer.buffered} bytes of it)"
                return
            try:
                for m in framer.feed(data):
                    self._check(m)
                    if self._enough():
                        return
            except (lbmc.LbmcDecodeError, StreamMismatch) as e:
                r.error = str(e) if isinstance(e, StreamMismatch) else f"not an LBMC stream: {e}"
                return
            if rate is not None:
                await trio.sleep_until(t0 + r.stream_bytes / rate)

    async def _receive(self, stream: trio.SocketStream, size: int) -> bytes | None:
        """The next bytes of ``stream`` (at most ``size``), counted in
        ``result.stream_bytes``; b"" at the end of the stream (``result.eof``;
        "truncated" if the payload bytes expected did not all come); None, the
        reason in ``result.error``, when the connection was lost or nothing
        came for ``idle_timeout`` seconds."""
        r = self.result
        with trio.move_on_after(self.idle_timeout) as idle:
            try:
                data = await stream.receive_some(size)
            except (trio.BrokenResourceError, OSError) as e:
                r.error = f"connection lost at {r.stream_bytes} bytes: {e or type(e).__name__}"
                return None
        if idle.cancelled_caught:
            r.error = f"nothing received for {self.idle_timeout:g} s at {r.stream_bytes} bytes"
            return None
        if not data:
            r.eof = True
            if self.expect_bytes is not None:
                r.error = (f"truncated: the stream ended after {r.bytes_received} of "
                           f"{self.expect_bytes} payload bytes")
            return data
        r.stream_bytes += len(data)
        return data

    def _check(self, raw: bytes) -> None:
        verify_message(self.result, lbmc.decode(raw), self.seed, self.tidx)
