"""A small HTTP/1.0 GET endpoint for the daemons' ``/metrics`` and
``/status``, bounded in requests, size and time, and the Prometheus text
format writer."""

from __future__ import annotations

import errno
import logging
import os

import trio

_log = logging.getLogger("lbmr_runtime.http")
MAX_REQUEST = 8192  # bytes of request head read at most
REQUEST_TIMEOUT = 5.0  # seconds for a whole connection (request and response)
MAX_CONNECTIONS = 64  # connections served at once (a new one closes the oldest idle)
ACCEPT_RETRY = 0.1  # seconds between accept attempts when out of descriptors
ACCEPT_LOG_EVERY = 10.0  # seconds between log lines about failing accepts
_ACCEPT_RESOURCE_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class PrometheusText:
    """Prometheus text exposition format (version 0.0.4), written in order:
    ``family(name, type, help)`` once per metric family, then ``sample``
    lines; :meth:`text` joins them."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help: str | None = None) -> PrometheusText:
        if help:
            self.lines.append(f"# HELP {name} {help}")
        self.lines.append(f"# TYPE {name} {kind}")
        return self

    def sample(self, name: str, value, labels: dict[str, object] | None = None) -> PrometheusText:
        if labels:
            inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
            self.lines.append(f"{name}{{{inner}}} {value}")
        else:
            self.lines.append(f"{name} {value}")
        return self

    def metric(self, name: str, kind: str, value, help: str | None = None) -> PrometheusText:
        """A family with one unlabelled sample."""
        return self.family(name, kind, help).sample(name, value)

    def by_label(self, name: str, kind: str, label: str, values: dict, help: str | None = None
                 ) -> PrometheusText:
        """A family with one sample per ``values`` item, sorted by label."""
        self.family(name, kind, help)
        for k, v in sorted(values.items(), key=lambda kv: str(kv[0])):
            self.sample(name, v, {label: k})
        return self

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


Route = tuple[str, "callable"]  # (content type, function returning the body text)


class _Connection:
    """One connection being served: its cancel scope (deadline
    :data:`REQUEST_TIMEOUT` seconds after it was accepted) and whether its
    request has been read in full."""

    __slots__ = ("scope", "requested")

    def __init__(self) -> None:
        self.scope = trio.CancelScope(deadline=trio.current_time() + REQUEST_TIMEOUT)
        self.requested = False


class _Connections:
    """The connections being served, oldest first, at most ``size``. When
    all slots are taken, a new connection closes the oldest one still
    waiting for its request (else the oldest of all), so idle sockets held
    open cannot keep a monitoring system out."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._open: dict[_Connection, None] = {}  # insertion order = age

    def admit(self) -> _Connection:
        if len(self._open) >= self.size:
            self._evict()
        conn = _Connection()
        self._open[conn] = None
        return conn

    def release(self, conn: _Connection) -> None:
        self._open.pop(conn, None)

    def _evict(self) -> None:
        victim = next((c for c in self._open if not c.requested), None) or next(iter(self._open))
        del self._open[victim]
        victim.scope.cancel()  # its task closes the socket on its next turn


async def _read_request(stream: trio.SocketStream) -> bytes:
    """The request head: up to the blank line, end of stream or
    :data:`MAX_REQUEST` bytes."""
    req = b""
    while b"\r\n\r\n" not in req and b"\n\n" not in req and len(req) < MAX_REQUEST:
        chunk = await stream.receive_some(4096)
        if not chunk:
            break
        req += chunk
    return req


def _response(req: bytes, routes: dict[str, Route]) -> bytes:
    """The whole HTTP/1.0 response (head and body) to request head ``req``."""
    parts = req.split(b"\r\n", 1)[0].split()
    path = parts[1].decode("ascii", "replace") if len(parts) >= 2 else ""
    route = routes.get(path)
    if parts[:1] != [b"GET"]:
        status, ctype, body = "405 Method Not Allowed", "text/plain", "GET only\n"
    elif route is None:
        status, ctype, body = "404 Not Found", "text/plain", "try " + " or ".join(routes) + "\n"
    else:
        status, (ctype, fn) = "200 OK", route
        body = fn()
    data = body.encode()
    head = (f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\n"
            "Connection: close\r\n\r\n").encode()
    return head + data


async def _handle(stream: trio.SocketStream, routes: dict[str, Route], conn: _Connection) -> None:
    try:
        with conn.scope:
            req = await _read_request(stream)
            conn.requested = True
            await stream.send_all(_response(req, routes))
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        await stream.aclose()


async def _accept_loop(listener: trio.SocketListener, routes: dict[str, Route],
                       nursery: trio.Nursery, log: logging.Logger) -> None:
    """Accept connections; out of descriptors (EMFILE, ENFILE) or kernel
    memory, wait and retry with one log line per :data:`ACCEPT_LOG_EVERY`
    seconds instead of a traceback per attempt. At most
    :data:`MAX_CONNECTIONS` connections are served at once; a new one
    closes the oldest that has not sent its request yet (see
    :class:`_Connections`)."""
    conns = _Connections(MAX_CONNECTIONS)
    last_log = -ACCEPT_LOG_EVERY
    failures = 0

    async def serve(stream: trio.SocketStream, conn: _Connection) -> None:
        try:
            await _handle(stream, routes, conn)
        finally:
            conns.release(conn)

    while True:
        try:
            stream = await listener.accept()
        except OSError as e:
            if e.errno not in _ACCEPT_RESOURCE_ERRORS:
                raise
            failures += 1
            now = trio.current_time()
            if now - last_log >= ACCEPT_LOG_EVERY:
                log.warning("HTTP endpoint cannot accept connections: %s (%d failures); retrying",
                            os.strerror(e.errno), failures)
                last_log = now
                failures = 0
            await trio.sleep(ACCEPT_RETRY)
            continue
        nursery.start_soon(serve, stream, conns.admit())


async def serve_http(routes: dict[str, Route], addr: tuple[str, int], *,
                     logger: logging.Logger | None = None,
                     task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A minimal HTTP/1.0 GET server for ``routes`` on ``addr`` (bounded
    requests); reports the bound address through ``task_status.started``
    and logs to ``logger`` (the daemon's). An address that cannot be
    listened on raises OSError naming it."""
    log = logger or _log
    try:
        listeners = await trio.open_tcp_listeners(addr[1], host=addr[0])
    except OSError as e:
        raise OSError(e.errno, f"HTTP endpoint {addr[0]}:{addr[1]} ({', '.join(routes)}): "
                               f"{e.strerror or e}") from e
    bound = listeners[0].socket.getsockname()
    log.info("metrics on http://%s:%d (%s)", bound[0], bound[1], ", ".join(routes))
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(_accept_loop, listener, routes, nursery, log)
        task_status.started(bound)


