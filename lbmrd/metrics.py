"""A small HTTP endpoint for lbmrd: ``GET /metrics`` (Prometheus text
format) and ``GET /status`` (JSON: client table, counters, recent events).
Loopback by default; requests are bounded in size and time."""

from __future__ import annotations

import errno
import json
import logging
import os

import trio

log = logging.getLogger("lbmrd")
MAX_REQUEST = 8192
REQUEST_TIMEOUT = 5.0
MAX_CONNECTIONS = 64  # requests served at once
ACCEPT_RETRY = 0.1  # seconds between accept attempts when out of descriptors
ACCEPT_LOG_EVERY = 10.0  # seconds between log lines about failing accepts
_ACCEPT_RESOURCE_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def prometheus_text(daemon) -> str:
    c = daemon.core.counters
    out = [
        "# HELP lbmrd_clients Known clients.", "# TYPE lbmrd_clients gauge",
        f"lbmrd_clients {len(daemon.core.table)}",
    ]
    for dom, g in sorted(daemon.core.table.groups.items(), key=lambda kv: str(kv[0])):
        out.append(f'lbmrd_clients_by_domain{{domain="{dom or ""}"}} {len(g.members)}')
    out += ["# HELP lbmrd_datagrams_in_total Valid datagrams received, by packet type.",
            "# TYPE lbmrd_datagrams_in_total counter"]
    out += [f'lbmrd_datagrams_in_total{{type="{k}"}} {v}' for k, v in sorted(c.rx.items())]
    out += ["# HELP lbmrd_datagrams_out_total Datagrams sent.", "# TYPE lbmrd_datagrams_out_total counter",
            f"lbmrd_datagrams_out_total {c.tx}",
            "# TYPE lbmrd_bytes_in_total counter", f"lbmrd_bytes_in_total {c.rx_bytes}",
            "# TYPE lbmrd_bytes_out_total counter", f"lbmrd_bytes_out_total {c.tx_bytes}",
            "# HELP lbmrd_drops_total Datagrams dropped, by reason.", "# TYPE lbmrd_drops_total counter"]
    out += [f'lbmrd_drops_total{{reason="{k}"}} {v}' for k, v in sorted(c.drops.items())]
    out += ["# HELP lbmrd_send_errors_total Send failures, by errno.", "# TYPE lbmrd_send_errors_total counter"]
    out += [f'lbmrd_send_errors_total{{errno="{k}"}} {v}' for k, v in sorted(c.send_errors.items())]
    out += ["# HELP lbmrd_nat_rewrites_total Per-domain copies rewritten by NAT rules.",
            "# TYPE lbmrd_nat_rewrites_total counter", f"lbmrd_nat_rewrites_total {c.nat_rewrites}",
            "# HELP lbmrd_fillins_total 0.0.0.0 address fields filled with the sender's address.",
            "# TYPE lbmrd_fillins_total counter", f"lbmrd_fillins_total {c.fillins}",
            "# TYPE lbmrd_clients_added_total counter", f"lbmrd_clients_added_total {c.clients_added}",
            "# TYPE lbmrd_clients_expired_total counter", f"lbmrd_clients_expired_total {c.clients_expired}"]
    return "\n".join(out) + "\n"


Route = tuple[str, "callable"]  # (content type, function returning the body text)


async def _handle(stream: trio.SocketStream, routes: dict[str, Route]) -> None:
    try:
        with trio.move_on_after(REQUEST_TIMEOUT):
            req = b""
            while b"\r\n\r\n" not in req and b"\n\n" not in req and len(req) < MAX_REQUEST:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    break
                req += chunk
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
            await stream.send_all(head + data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        await stream.aclose()


async def _accept_loop(listener: trio.SocketListener, routes: dict[str, Route],
                       nursery: trio.Nursery) -> None:
    """Accept connections; out of descriptors (EMFILE, ENFILE) or kernel
    memory, wait and retry with one log line per :data:`ACCEPT_LOG_EVERY`
    seconds instead of a traceback per attempt. At most
    :data:`MAX_CONNECTIONS` requests are served at once; more are closed."""
    limit = trio.CapacityLimiter(MAX_CONNECTIONS)
    last_log = -ACCEPT_LOG_EVERY
    failures = 0

    async def serve(stream: trio.SocketStream) -> None:
        try:
            await _handle(stream, routes)
        finally:
            limit.release_on_behalf_of(stream)

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
        try:
            limit.acquire_on_behalf_of_nowait(stream)
        except trio.WouldBlock:
            await stream.aclose()  # too many at once: the client may retry
            continue
        nursery.start_soon(serve, stream)


async def serve_http(routes: dict[str, Route], addr: tuple[str, int], *,
                     task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A minimal HTTP/1.0 GET server for ``routes`` on ``addr`` (bounded requests)."""
    listeners = await trio.open_tcp_listeners(addr[1], host=addr[0])
    bound = listeners[0].socket.getsockname()
    log.info("metrics on http://%s:%d (%s)", bound[0], bound[1], ", ".join(routes))
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(_accept_loop, listener, routes, nursery)
        task_status.started(bound)


async def serve_metrics(daemon, addr: tuple[str, int], *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    routes = {
        "/metrics": ("text/plain; version=0.0.4", lambda: prometheus_text(daemon)),
        "/status": ("application/json", lambda: json.dumps(daemon.core.snapshot(trio.current_time()))),
    }
    await serve_http(routes, addr, task_status=task_status)
