"""The byte-offset TCP source and receiver: every connection gets the raw
numbered stream from offset 0 (see :mod:`lbmr_tools.sim.dataplane`). Kept for
tests about raw bytes (a relay that must be byte-transparent); ``lbmr-sim``
uses the live LBMC stream of :mod:`.tcp`."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import trio

from .live import open_tcp_listener
from .pattern import PATTERN_LEN, check_seed, pattern, rate_of
from .tcp import StreamReceiver

Addr = tuple[str, int]

# --------------------------------------------------------------------- TCP


@dataclass
class TcpByteConnStats:
    """One connection a :class:`TcpByteSource` served."""

    peer: str
    bytes_sent: int = 0
    started: float = 0.0  # trio.current_time()
    finished: float | None = None
    complete: bool = False  # all total_bytes handed to the kernel and the connection closed
    error: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


class TcpByteSource:
    """Serve the stream of ``seed`` to every connecting receiver.

    Listens on (``bind_ip``, ``port``) (0: a kernel-chosen port); each
    connection gets ``total_bytes`` bytes from offset 0 in writes of
    ``chunk`` bytes, then is closed; with ``total_bytes`` 0 the source sends
    until the peer goes away (or the task is cancelled). At most
    ``max_connections`` connections are accepted (None: no limit), after
    which :meth:`serve` returns once they are done. ``connections`` holds a
    :class:`TcpByteConnStats` per connection, updated as bytes go out.
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
        self.seed = check_seed(seed)
        self.max_connections = max_connections
        self.backlog = backlog
        self.address: Addr | None = None
        self.connections: list[TcpByteConnStats] = []

    @property
    def bytes_sent(self) -> int:
        return sum(c.bytes_sent for c in self.connections)

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Bind, report the bound (ip, port) through ``task_status.started``
        and serve connections until cancelled (or ``max_connections`` are
        done). Raises OSError (e.g. EADDRINUSE) before ``started``."""
        listener = await open_tcp_listener(self.bind_ip, self.port, self.backlog)
        self.address = listener.socket.getsockname()[:2]
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
        st = TcpByteConnStats(peer, started=trio.current_time())
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
class TcpByteReceiveResult:
    """What a :class:`TcpByteReceiver` saw. ``exact``: the stream ended
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
        return rate_of(self.bytes_received, self.elapsed)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(exact=self.exact, ok=self.ok, bytes_per_s=round(self.bytes_per_s, 1))
        return d


class TcpByteReceiver(StreamReceiver):
    """Connect to a :class:`TcpByteSource` (or whatever relays one) and
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
        self._settings(connect_ip, port, expect_bytes, seed, rate_limit_bps, timeout, idle_timeout,
                       bind_ip, min(read_size, PATTERN_LEN), max_bytes)
        self.result = TcpByteReceiveResult(f"{connect_ip}:{port}", expect_bytes)

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
