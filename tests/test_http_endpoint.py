"""lbmr_runtime.http: the daemons' /metrics and /status endpoint against
hostile clients (idle connections, slow readers, oversized heads), on real
TCP sockets on 127.0.0.1."""

from __future__ import annotations

import errno
import resource
import select
import socket
import time
import urllib.request

import pytest
import trio

from lbmr_runtime import http

IDLE = 500  # idle connections opened before the scrape
BIG = 20 << 20  # bytes of a response larger than the loopback socket buffers
WAIT = 20.0  # seconds any step of a test may take at most


@pytest.fixture
def fds():
    """Enough descriptors for the idle connections (soft limit raised to the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < 4 * IDLE:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
def long_timeout(monkeypatch):
    """Connections live long enough that only eviction closes them during a test."""
    monkeypatch.setattr(http, "REQUEST_TIMEOUT", 120.0)


ROUTES = {"/metrics": ("text/plain", lambda query: "up 1\n"),
          "/big": ("text/plain", lambda query: "x" * BIG)}


def scrape(addr: tuple[str, int], path: str = "/metrics") -> tuple[int, bytes]:
    with urllib.request.urlopen(f"http://{addr[0]}:{addr[1]}{path}", timeout=WAIT) as r:
        return r.status, r.read()


def closed_by_server(socks: list[socket.socket], expected: int) -> set[int]:
    """Indices of ``socks`` the server has closed (EOF or reset), waiting
    (bounded) until at least ``expected`` are, then one more look."""
    poller = select.poll()
    index = {s.fileno(): i for i, s in enumerate(socks)}
    for fd in index:
        poller.register(fd, select.POLLIN)
    closed: set[int] = set()
    end = time.monotonic() + WAIT
    while True:
        timeout = 0 if len(closed) >= expected else max(0, int((end - time.monotonic()) * 1000))
        events = poller.poll(min(timeout, 200))
        for fd, _ in events:
            closed.add(index[fd])
            poller.unregister(fd)
        if len(closed) >= expected and not events or time.monotonic() > end:
            return closed


def idle_flood_then_scrape(addr: tuple[str, int]) -> tuple[int, bytes, set[int], int]:
    """IDLE connections that never finish a request (half send nothing, half
    an unfinished head), then a normal scrape; returns its status and body,
    which idle connections the server closed, and how many there were."""
    socks = []
    try:
        for i in range(IDLE):
            s = socket.create_connection(addr, timeout=WAIT)
            if i % 2:
                s.sendall(b"GET /metrics HTTP/1.0\r\n")  # no blank line: not a complete request
            socks.append(s)
        status, body = scrape(addr)
        closed = closed_by_server(socks, IDLE - http.MAX_CONNECTIONS + 1)
        return status, body, closed, len(socks)
    finally:
        for s in socks:
            s.close()


async def test_idle_connections_cannot_keep_a_scrape_out(fds, long_timeout):
    async with trio.open_nursery() as n:
        addr = await n.start(http.serve_http, ROUTES, ("127.0.0.1", 0))
        with trio.fail_after(3 * WAIT):
            status, body, closed, opened = await trio.to_thread.run_sync(idle_flood_then_scrape, addr)
        n.cancel_scope.cancel()
    assert opened == IDLE
    assert (status, body) == (200, b"up 1\n")
    # the server held MAX_CONNECTIONS at most: the scrape closed the oldest idle one,
    # and every idle one older than the newest MAX_CONNECTIONS - 1 was closed
    kept = http.MAX_CONNECTIONS - 1
    assert closed == set(range(IDLE - kept)), sorted(set(range(IDLE)) - closed)[:10]


def slow_reader_then_idle_flood(addr: tuple[str, int]) -> tuple[int, int, set[int]]:
    """A client that asks for a response larger than the socket buffers and
    does not read it (its connection stays in the middle of the response),
    then MAX_CONNECTIONS idle connections and a scrape; then the slow client
    reads its whole response. Returns the scrape's status, the slow client's
    body length and the idle connections the server closed."""
    slow = socket.create_connection(addr, timeout=WAIT)
    socks = []
    try:
        slow.sendall(b"GET /big HTTP/1.0\r\n\r\n")
        # the response has started: its request is complete on the server side
        assert select.select([slow], [], [], WAIT)[0], "no response to /big"
        for _ in range(http.MAX_CONNECTIONS):
            socks.append(socket.create_connection(addr, timeout=WAIT))
        status, _ = scrape(addr)
        closed = closed_by_server(socks, 2)
        data = bytearray()
        while chunk := slow.recv(1 << 20):
            data += chunk
        head, body = bytes(data).split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.0 200 OK")
        return status, len(body), closed
    finally:
        slow.close()
        for s in socks:
            s.close()


async def test_a_response_in_progress_outlives_idle_connections(long_timeout):
    async with trio.open_nursery() as n:
        addr = await n.start(http.serve_http, ROUTES, ("127.0.0.1", 0))
        with trio.fail_after(3 * WAIT):
            status, length, closed = await trio.to_thread.run_sync(slow_reader_then_idle_flood, addr)
        n.cancel_scope.cancel()
    assert status == 200
    assert length == BIG  # the slow reader was never the one closed
    # slots: the slow reader + 64 idle ones -> the first idle one went; the scrape -> the second
    assert closed == {0, 1}


def read_all(sock: socket.socket) -> bytes:
    data = bytearray()
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return bytes(data)


def slow_readers_then_scrape(addr: tuple[str, int], n: int) -> tuple[int, list[int]]:
    """``n`` clients that ask for /big and do not read (all slots in the
    middle of a response), then a scrape; then each reads what it gets.
    Returns the scrape's status and each slow client's body length."""
    slow = [socket.create_connection(addr, timeout=WAIT) for _ in range(n)]
    try:
        for s in slow:
            s.sendall(b"GET /big HTTP/1.0\r\n\r\n")
            assert select.select([s], [], [], WAIT)[0], "no response to /big"
        status, _ = scrape(addr)
        return status, [len(read_all(s).split(b"\r\n\r\n", 1)[-1]) for s in slow]
    finally:
        for s in slow:
            s.close()


async def test_with_every_slot_answering_a_new_connection_closes_the_oldest(long_timeout, monkeypatch):
    monkeypatch.setattr(http, "MAX_CONNECTIONS", 2)
    async with trio.open_nursery() as n:
        addr = await n.start(http.serve_http, ROUTES, ("127.0.0.1", 0))
        with trio.fail_after(3 * WAIT):
            status, lengths = await trio.to_thread.run_sync(slow_readers_then_scrape, addr, 2)
        n.cancel_scope.cancel()
    assert status == 200
    assert lengths[0] < BIG and lengths[1] == BIG  # the oldest was cut off, the other finished


async def test_idle_connection_closed_after_the_request_timeout(autojump_clock):
    async with trio.open_nursery() as n:
        addr = await n.start(http.serve_http, ROUTES, ("127.0.0.1", 0))
        stream = await trio.open_tcp_stream(*addr)
        t0 = trio.current_time()
        with trio.fail_after(10 * http.REQUEST_TIMEOUT):
            assert await stream.receive_some(100) == b""
        assert trio.current_time() - t0 >= http.REQUEST_TIMEOUT
        await stream.aclose()
        n.cancel_scope.cancel()


async def test_oversized_request_head_is_cut_at_max_request():
    async with trio.open_nursery() as n:
        addr = await n.start(http.serve_http, ROUTES, ("127.0.0.1", 0))
        stream = await trio.open_tcp_stream(*addr)
        with trio.fail_after(WAIT):
            await stream.send_all(b"GET /" + b"a" * (http.MAX_REQUEST - 5))  # a head without its end
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
        assert data.startswith(b"HTTP/1.0 404 Not Found")
        await stream.aclose()
        n.cancel_scope.cancel()


async def test_address_in_use_names_the_address():
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        with pytest.raises(OSError) as info:
            await http.serve_http(ROUTES, ("127.0.0.1", port))
    finally:
        busy.close()
    err = info.value
    assert err.errno == errno.EADDRINUSE
    assert f"HTTP endpoint 127.0.0.1:{port}" in str(err) and "Address already in use" in str(err)
