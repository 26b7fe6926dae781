"""A small HTTP/1.0 GET endpoint for the daemons' ``/metrics``,
``/status`` and operators' pages (:mod:`lbmr_runtime.monitor`), bounded in
connections, request size and time, read-only, with an optional token and
TLS (:class:`Access`); and the Prometheus text format writer."""

from __future__ import annotations

import base64
import binascii
import errno
import hmac
import inspect
import ipaddress
import logging
import os
import ssl
import urllib.parse

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


#: (content type, function of the request's query parameters returning the body, as
#: str or bytes, or an awaitable of it: work on a large table done in slices)
Route = tuple[str, "callable"]

MAX_QUERY_FIELDS = 16  # query parameters read at most (the rest are ignored)
MAX_QUERY_VALUE = 256  # characters of a query parameter value kept at most

#: headers of every response: the pages are one origin's static files that read
#: its JSON (no inline script or style, nothing from elsewhere, no framing, no
#: forms), no type sniffing, nothing kept in caches or sent as a referrer
SECURITY_HEADERS = (
    ("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; "
     "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
     "frame-ancestors 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
    ("Cache-Control", "no-store"),
)
AUTH_REALM = "lbmr-kit monitor"


def parse_query(text: str) -> dict[str, str]:
    """The query string's parameters (the first :data:`MAX_QUERY_FIELDS`,
    values cut to :data:`MAX_QUERY_VALUE` characters; a repeated name keeps
    its first value)."""
    out: dict[str, str] = {}
    for k, v in urllib.parse.parse_qsl(text, keep_blank_values=True,
                                       max_num_fields=None)[:MAX_QUERY_FIELDS]:
        out.setdefault(k, v[:MAX_QUERY_VALUE])
    return out


class Access:
    """Who may read the endpoint: ``token`` (text; None = anyone who can
    connect) is checked in ``Authorization: Bearer <token>`` or as the
    password of ``Authorization: Basic`` (any user name: what a browser
    asks for); ``tls`` is a server :class:`ssl.SSLContext` (None = plain
    HTTP). ``loopback_only_names``: the endpoint listens on loopback, so a
    request must name it by address or ``localhost`` in ``Host`` (a web
    page whose host name was re-pointed at 127.0.0.1 cannot read it)."""

    __slots__ = ("token", "tls", "loopback_only_names")

    def __init__(self, token: str | None = None, tls: ssl.SSLContext | None = None) -> None:
        self.token = token.encode() if token is not None else None
        self.tls = tls
        self.loopback_only_names = False

    def allows(self, headers: dict[bytes, bytes]) -> bool:
        if self.token is None:
            return True
        kind, _, cred = headers.get(b"authorization", b"").strip().partition(b" ")
        cred = cred.strip()
        if kind.lower() == b"basic":
            try:
                cred = base64.b64decode(cred, validate=True).partition(b":")[2]
            except (binascii.Error, ValueError):
                return False
        elif kind.lower() != b"bearer":
            return False
        return hmac.compare_digest(cred, self.token)

    def host_ok(self, headers: dict[bytes, bytes]) -> bool:
        if not self.loopback_only_names:
            return True
        host = headers.get(b"host")
        if host is None:
            return True  # HTTP/1.0 without Host: not a browser
        name = host.decode("ascii", "replace").strip().lower()
        if name.startswith("["):
            name = name[1:].partition("]")[0]
        else:
            name = name.rpartition(":")[0] if name.count(":") == 1 else name
        if name == "localhost" or name.endswith(".localhost"):
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True


MAX_TOKEN_FILE = 4096  # bytes of a token file read at most
MIN_TOKEN = 16  # characters of a token at least


def load_token(path: str) -> str:
    """The bearer token in file ``path`` (surrounding white space dropped);
    ValueError naming the file and the problem."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TOKEN_FILE + 1)
    except OSError as e:
        raise ValueError(f"token file {path}: {e.strerror or e}") from None
    if len(data) > MAX_TOKEN_FILE:
        raise ValueError(f"token file {path}: longer than {MAX_TOKEN_FILE} bytes")
    token = data.strip()
    if not all(0x21 <= b <= 0x7e for b in token):
        raise ValueError(f"token file {path}: the token must be printable ASCII without spaces")
    if len(token) < MIN_TOKEN:
        raise ValueError(f"token file {path}: the token must be at least {MIN_TOKEN} characters "
                         f"(got {len(token)})")
    return token.decode("ascii")


def server_tls(certificate: str, key: str, password: str | None = None,
               ciphers: str | None = None, client_ca: str | None = None) -> ssl.SSLContext:
    """A TLS server context (TLS 1.2 at least) for PEM files ``certificate``
    and ``key``; with ``client_ca`` (a PEM CA bundle) every client must
    present a certificate it signed. ValueError naming the file and the problem."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if client_ca is not None:
        try:
            ctx.load_verify_locations(client_ca)
        except (OSError, ssl.SSLError) as e:
            raise ValueError(f"client CA bundle {client_ca}: {getattr(e, 'strerror', None) or e}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    for path in (certificate, key):
        if not os.path.isfile(path):
            raise ValueError(f"TLS certificate or key {path}: no such file")
    try:
        ctx.load_cert_chain(certificate, key, password)
    except ssl.SSLError as e:  # (an OSError too)
        raise ValueError(f"TLS certificate {certificate} and key {key} cannot be used: "
                         f"{e.reason or e}") from None
    except OSError as e:
        raise ValueError(f"TLS certificate {certificate} or key {key}: {e.strerror or e}") from None
    if ciphers:
        try:
            ctx.set_ciphers(ciphers)
        except ssl.SSLError:
            raise ValueError(f"no cipher suite of {ciphers!r} is known to this OpenSSL") from None
    return ctx


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


async def _read_request(stream) -> bytes:
    """The request head: up to the blank line, end of stream or
    :data:`MAX_REQUEST` bytes."""
    req = b""
    while b"\r\n\r\n" not in req and b"\n\n" not in req and len(req) < MAX_REQUEST:
        chunk = await stream.receive_some(4096)
        if not chunk:
            break
        req += chunk
    return req


def _headers(lines: list[bytes]) -> dict[bytes, bytes]:
    """Header fields by lower-case name (the first of a repeated name)."""
    out: dict[bytes, bytes] = {}
    for line in lines:
        name, sep, value = line.partition(b":")
        if sep:
            out.setdefault(name.strip().lower(), value.strip())
    return out


async def _response(req: bytes, routes: dict[str, Route], access: Access | None = None) -> bytes:
    """The whole HTTP/1.0 response (head and body) to request head ``req``."""
    lines = req.replace(b"\r\n", b"\n").split(b"\n")
    parts = lines[0].split()
    target = parts[1].decode("ascii", "replace") if len(parts) >= 2 else ""
    path, _, query = target.partition("?")
    headers = _headers(lines[1:])
    route = routes.get(path)
    extra = ""
    if parts[:1] != [b"GET"]:
        status, ctype, body = "405 Method Not Allowed", "text/plain", "GET only: this endpoint is read-only\n"
        extra = "Allow: GET\r\n"
    elif access is not None and not access.host_ok(headers):
        status, ctype, body = ("421 Misdirected Request", "text/plain",
                               "this endpoint listens on loopback: name it by address or localhost\n")
    elif access is not None and not access.allows(headers):
        status, ctype, body = "401 Unauthorized", "text/plain", "a token is needed\n"
        extra = f'WWW-Authenticate: Basic realm="{AUTH_REALM}", charset="UTF-8"\r\n'
    elif route is None:
        status, ctype, body = "404 Not Found", "text/plain", "try " + " or ".join(
            r for r in routes if not r.startswith("/static/")) + "\n"
    else:
        status, (ctype, fn) = "200 OK", route
        try:
            body = fn(parse_query(query))
            if inspect.isawaitable(body):
                body = await body
        except ValueError as e:  # a bad query parameter
            status, ctype, body = "400 Bad Request", "text/plain", f"{e}\n"
    data = body if isinstance(body, bytes) else body.encode()
    security = "".join(f"{k}: {v}\r\n" for k, v in SECURITY_HEADERS)
    head = (f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\n"
            f"{security}{extra}Connection: close\r\n\r\n").encode()
    return head + data


async def _handle(stream: trio.SocketStream, routes: dict[str, Route], conn: _Connection,
                  access: Access | None) -> None:
    try:
        with conn.scope:
            if access is not None and access.tls is not None:
                stream = trio.SSLStream(stream, access.tls, server_side=True, https_compatible=True)
                await stream.do_handshake()
            req = await _read_request(stream)
            conn.requested = True
            await stream.send_all(await _response(req, routes, access))
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        with trio.CancelScope(shield=True, deadline=trio.current_time() + 1.0):
            try:
                await stream.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass


async def _accept_loop(listener: trio.SocketListener, routes: dict[str, Route],
                       nursery: trio.Nursery, log: logging.Logger, access: Access | None) -> None:
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
            await _handle(stream, routes, conn, access)
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
                     logger: logging.Logger | None = None, access: Access | None = None,
                     task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A minimal HTTP/1.0 GET server for ``routes`` on ``addr`` (bounded
    requests); reports the bound address through ``task_status.started``
    and logs to ``logger`` (the daemon's). ``access``: the token and TLS
    (:class:`Access`; None = plain HTTP for anyone who can connect). Every
    response carries :data:`SECURITY_HEADERS`; a listener on loopback
    answers only requests that name it by address or ``localhost``. An
    address that cannot be listened on raises OSError naming it."""
    log = logger or _log
    access = access if access is not None else Access()
    try:
        listeners = await trio.open_tcp_listeners(addr[1], host=addr[0])
    except OSError as e:
        shown = ", ".join(r for r in routes if not r.startswith(("/static/", "/api/")))
        raise OSError(e.errno, f"HTTP endpoint {addr[0]}:{addr[1]} ({shown}): "
                               f"{e.strerror or e}") from e
    bound = listeners[0].socket.getsockname()
    access.loopback_only_names = all(ipaddress.ip_address(lst.socket.getsockname()[0]).is_loopback
                                     for lst in listeners)
    scheme = "https" if access.tls is not None else "http"
    log.info("monitor and metrics on %s://%s:%d (%s)%s", scheme, bound[0], bound[1],
             ", ".join(r for r in routes if not r.startswith(("/static/", "/api/"))),
             ", token required" if access.token is not None else "")
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(_accept_loop, listener, routes, nursery, log, access)
        task_status.started(bound)


