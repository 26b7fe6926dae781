"""lbmrd's HTTP endpoint: ``GET /metrics`` (Prometheus text format) and
``GET /status`` (JSON: client table, counters, recent events), served by
:func:`lbmr_runtime.http.serve_http` (bounded in requests, size and time)."""

from __future__ import annotations

import json
import logging

import trio

from lbmr_runtime.http import PrometheusText, serve_http

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


async def serve_metrics(daemon, addr: tuple[str, int], *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    routes = {
        "/metrics": ("text/plain; version=0.0.4", lambda: prometheus_text(daemon)),
        "/status": ("application/json", lambda: json.dumps(daemon.core.snapshot(trio.current_time()))),
    }
    await serve_http(routes, addr, logger=log, task_status=task_status)
