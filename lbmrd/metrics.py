"""lbmrd's HTTP endpoint: ``GET /metrics`` (Prometheus text format),
``GET /status`` (JSON: client table, counters, recent events) and the
operators' page ``GET /`` with the JSON it reads (``/api/summary``,
``/api/clients``: paged, filtered and sorted here, so the browser never
holds the whole table), served by :func:`lbmr_runtime.http.serve_http`
(bounded in connections, size and time; optional token and TLS)."""

from __future__ import annotations

import json
import logging
import os
import time

import trio

from lbmr_runtime.http import Access, PrometheusText, load_token, serve_http, server_tls
from lbmr_runtime.monitor import TableQuery, bounded, page_routes

log = logging.getLogger("lbmrd")


def prometheus_text(daemon) -> str:
    core = daemon.core
    c = core.counters
    p = PrometheusText()
    p.metric("lbmrd_clients", "gauge", len(core.table), "Known clients.")
    p.family("lbmrd_clients_by_domain", "gauge")
    for dom, g in sorted(core.table.groups.items(), key=lambda kv: str(kv[0])):
        p.sample("lbmrd_clients_by_domain", len(g.members), {"domain": dom or ""})
    p.metric("lbmrd_datagrams_received_total", "counter", c.received,
             "Datagrams read from the socket: datagrams_in plus drops.")
    p.by_label("lbmrd_datagrams_in_total", "counter", "type", c.rx,
               "Datagrams accepted, by packet type: replies plus quiet plus relayed.")
    p.by_label("lbmrd_drops_total", "counter", "reason", c.drops,
               "Datagrams received and dropped whole, by reason.")
    p.metric("lbmrd_replies_total", "counter", c.replies, "Keepalives accepted and answered.")
    p.metric("lbmrd_quiet_total", "counter", c.quiet, "Datagrams accepted with nothing to send.")
    p.metric("lbmrd_relayed_total", "counter", c.relayed, "Datagrams accepted for relaying.")
    p.by_label("lbmrd_relays_dropped_total", "counter", "reason", c.relays_dropped,
               "Relayed datagrams dropped before any copy was sent, by reason.")
    p.by_label("lbmrd_copies_dropped_total", "counter", "reason", c.copies_dropped,
               "Relay copies (one per destination) not sent, by reason.")
    p.metric("lbmrd_datagrams_out_total", "counter", c.tx, "Datagrams sent (relay copies and replies).")
    p.metric("lbmrd_bytes_in_total", "counter", c.rx_bytes, "Bytes of the accepted datagrams.")
    p.metric("lbmrd_bytes_out_total", "counter", c.tx_bytes)
    p.by_label("lbmrd_send_errors_total", "counter", "errno", c.send_errors,
               "Copies or replies the kernel refused, by errno.")
    p.by_label("lbmrd_recv_errors_total", "counter", "errno", c.recv_errors,
               "Errors reported on receive (no datagram), by errno.")
    p.metric("lbmrd_nat_rewrites_total", "counter", c.nat_rewrites,
             "Per-domain copies rewritten by NAT rules.")
    p.metric("lbmrd_fillins_total", "counter", c.fillins,
             "0.0.0.0 address fields filled with the sender's address.")
    p.metric("lbmrd_clients_added_total", "counter", c.clients_added)
    p.metric("lbmrd_clients_expired_total", "counter", c.clients_expired)
    return p.text()


EVENTS_SHOWN = 200  # newest events in the page's summary

#: the client table's columns the page sorts by: the key of a client for each
CLIENT_SORT = {
    "addr": lambda c: (c.ip4, c.addr[1]),
    "domain": lambda c: (c.domain or "", c.ip4, c.addr[1]),
    "first_seen": lambda c: c.first_seen,
    "last_seen": lambda c: c.last_seen,
    "datagrams": lambda c: c.rx,
}


def _client_text(c) -> str:
    return f"{c.addr[0]}:{c.addr[1]} {c.domain or ''}"


async def clients_page(daemon, query: dict[str, str], lock: trio.Lock | None = None) -> dict:
    """One page of the client table (:class:`TableQuery` parameters; sort
    ``first_seen`` ascending, the table's own order, by default). A filter or
    another sort looks at the clients in slices (the relay runs between
    them), one such request at a time (``lock``)."""
    tq = TableQuery(query, CLIENT_SORT, default_sort="first_seen")
    table = daemon.core.table
    rows = list(table)  # the clients now (one C-level copy); some may expire while we look
    matched, page = await tq.page_in_slices(rows, CLIENT_SORT[tq.sort], _client_text,
                                            natural=tq.sort == "first_seen", lock=lock)
    now = trio.current_time()
    return {"total": len(rows), "matched": matched, "offset": tq.offset, "limit": tq.limit,
            "sort": tq.sort, "order": "desc" if tq.desc else "asc",
            "rows": [c.as_dict(now) for c in page]}


def summary(daemon, query: dict[str, str] | None = None) -> dict:
    """What the page shows besides the client table: the daemon, clients
    by domain, counters, NAT domains and rules, the newest events."""
    core, st = daemon.core, daemon.settings
    now = trio.current_time()
    nat = core.nat
    domains = [{"name": d.name, "networks": bounded([str(n) for n in d.networks], 50)}
               for d in (nat.domains if nat is not None else ())]
    transforms = [{"source": t.source, "destination": t.destination,
                   "rules": bounded([str(r) for r in t.rules], 200)}
                  for t in (nat.transforms if nat is not None else ())]
    by_domain = sorted(((g.domain or "", len(g.members)) for g in core.table.groups.values()),
                       key=lambda x: (-x[1], x[0]))
    events = list(core.events)[-EVENTS_SHOWN:]
    return {
        "daemon": {"kind": "lbmrd", "interface": st.bind_ip, "port": daemon.sock.getsockname()[1]
                   if daemon.sock is not None else st.port,
                   "ttl_s": st.ttl_s, "activity_ms": st.activity_ms, "config": st.config_path,
                   "max_clients": st.max_clients, "pid": os.getpid(),
                   "uptime_s": round(now - daemon.started, 3)},
        "wall_time": time.time(),
        "clients_total": len(core.table),
        "by_domain": bounded([{"domain": d, "clients": n} for d, n in by_domain], 200),
        "counters": core.counters.as_dict(),
        "nat": {"domains": bounded(domains, 200), "transforms": bounded(transforms, 200)},
        "events": {"total": len(core.events),
                   "items": [{"age_s": round(now - t, 3), "event": k, "detail": d}
                             for t, k, d in reversed(events)]},
    }


def monitor_access(settings) -> Access:
    """The token and TLS of the endpoint from ``settings`` (``metrics_token_file``,
    ``metrics_cert``, ``metrics_key``); ValueError naming the file and the problem."""
    token = load_token(settings.metrics_token_file) if settings.metrics_token_file else None
    if (settings.metrics_cert is None) != (settings.metrics_key is None):
        raise ValueError("--metrics-cert and --metrics-key go together")
    tls = server_tls(settings.metrics_cert, settings.metrics_key) if settings.metrics_cert else None
    return Access(token, tls)


async def serve_metrics(daemon, addr: tuple[str, int], *, access: Access | None = None,
                        task_status=trio.TASK_STATUS_IGNORED) -> None:
    scans = trio.Lock()  # one sliced scan of the client table at a time

    async def clients(query):
        return await clients_page(daemon, query, scans)

    routes = {
        "/metrics": ("text/plain; version=0.0.4", lambda query: prometheus_text(daemon)),
        "/status": ("application/json", lambda query: json.dumps(daemon.core.snapshot(trio.current_time()))),
        **page_routes("lbmrd", {"summary": lambda query: summary(daemon, query),
                                "clients": clients}),
    }
    await serve_http(routes, addr, logger=log, access=access, task_status=task_status)
