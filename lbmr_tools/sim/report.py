"""What a run of lbmr-sim produced: results per receiver and data source, as
text or JSON, and the exit status."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from .context import Context, transport_text
from .dataplane import (
    RmDataSource,
    RmReceiveResult,
    RuLiveReceiveResult,
    TcpDataSource,
    UmRuReceiveResult,
    UmTcpSource,
)

Addr = tuple[str, int]

class SentDatagram(NamedTuple):
    """One datagram the simulator sent (``ts`` in seconds since the epoch)."""

    ts: float
    src: str
    sport: int
    dst: str
    dport: int
    payload: bytes


@dataclass
class ReceiverResult:
    context: int
    client: str  # the context's socket "ip:port"
    topic: str
    time_ms: float | None
    transport: str | None  # "TCP 127.0.1.3:14371"
    sources_seen: int
    local: bool
    data: dict | None = None  # with verify_data: see data_outcome()

    @property
    def resolved(self) -> bool:
        return self.time_ms is not None

    @property
    def data_ok(self) -> bool:
        return self.data is not None and self.data["ok"]

    def as_dict(self) -> dict:
        return {"context": self.context, "client": self.client, "topic": self.topic,
                "resolved": self.resolved,
                "time_ms": None if self.time_ms is None else round(self.time_ms, 3),
                "transport": self.transport, "sources_seen": self.sources_seen, "local": self.local,
                "data": self.data}


@dataclass
class SimResult:
    receivers: list[ReceiverResult]
    contexts: list[Context]
    clients: list[Addr]
    daemons: list[Addr]
    elapsed: float
    send_errors: int = 0
    recv_errors: int = 0
    sent: list[SentDatagram] | None = None
    multicast: Addr | None = None
    verify_data: bool = False
    data_sources: list[dict] = field(default_factory=list)  # see data_source_report()
    request_ports: list[dict] = field(default_factory=list)  # RequestPort.report() + context
    uim: dict | None = None  # context 0's UIMs by domain (UimSendReport.as_dict()), if asked

    @property
    def resolved(self) -> int:
        return sum(r.resolved for r in self.receivers)

    @property
    def all_resolved(self) -> bool:
        return self.resolved == len(self.receivers)

    @property
    def data_verified(self) -> int:
        return sum(r.data_ok for r in self.receivers)

    @property
    def all_data_verified(self) -> bool:
        return self.data_verified == len(self.receivers)

    def times_ms(self) -> list[float]:
        return [r.time_ms for r in self.receivers if r.time_ms is not None]

    def summary(self) -> dict:
        t = self.times_ms()
        return {"resolved": self.resolved, "total": len(self.receivers),
                "median_ms": round(statistics.median(t), 3) if t else None,
                "max_ms": round(max(t), 3) if t else None,
                "elapsed_s": round(self.elapsed, 3), "send_errors": self.send_errors,
                "recv_errors": self.recv_errors,
                "data_verified": self.data_verified if self.verify_data else None}

    def as_dict(self) -> dict:
        return {
            "receivers": [r.as_dict() for r in self.receivers],
            "summary": self.summary(),
            "daemons": [f"{ip}:{port}" for ip, port in self.daemons],
            "multicast": None if self.multicast is None else f"{self.multicast[0]}:{self.multicast[1]}",
            "contexts": [{"context": c.index, "client": f"{a[0]}:{a[1]}", "src_id": c.src_id.hex(),
                          "sources": [f"{s.topic} {transport_text(s.transport)}" for s in c.sources],
                          "receivers": [r.topic for r in c.receivers], "stats": dict(sorted(c.stats.items()))}
                         for c, a in zip(self.contexts, self.clients, strict=True)],
            "data_sources": self.data_sources,
            "request_ports": self.request_ports,
            "uim": self.uim,
        }


def receiver_results(ctxs: Sequence[Context], clients: Sequence[Addr],
             data: dict | None = None) -> list[ReceiverResult]:
    """One ReceiverResult per receiver; ``data`` (with verify_data) maps a
    Receiver to its data receiver, or to an error text when none could run."""
    out = []
    for c, (ip, port) in zip(ctxs, clients, strict=True):
        for r in c.receivers:
            ttr = r.time_to_resolve
            d = None
            if data is not None:
                d = data_outcome(data.get(r, "unresolved: no data fetched"))
            out.append(ReceiverResult(c.index, f"{ip}:{port}", r.topic,
                                      None if ttr is None else ttr * 1000.0,
                                      None if r.transport is None else transport_text(r.transport),
                                      len(r.sources), r.local, d))
    return out


def data_outcome(rx) -> dict:
    """A receiver's data report: kind ("tcp", "lbtru", "lbtrm" or None), ok, bytes
    (verified payload bytes for LBT-RU/RM), datagrams (LBT-RU/RM; None for TCP),
    error (the first problem or None), bytes_per_s, elapsed_s and the data
    receiver's full result as ``detail``."""
    if isinstance(rx, str):
        return {"kind": None, "ok": False, "bytes": 0, "datagrams": None, "error": rx,
                "bytes_per_s": 0.0, "elapsed_s": 0.0, "detail": None}
    res = rx.result
    error = res.error
    if not res.done:
        error = f"the run ended (--duration) before the data did: {error}"
    ru = isinstance(res, RmReceiveResult | RuLiveReceiveResult)
    kind = ("lbtru" if isinstance(res, UmRuReceiveResult) else "lbtrm" if isinstance(res, RmReceiveResult)
            else "lbtru" if ru else "tcp")
    return {"kind": kind, "ok": res.ok, "bytes": res.bytes_received,
            "datagrams": res.received if ru else None, "error": error,
            "bytes_per_s": round(res.bytes_per_s, 1), "elapsed_s": round(res.elapsed, 6),
            "detail": res.as_dict()}


def data_source_report(ctx_index: int, topic: str, server) -> dict:
    """What one data source served (for SimResult.data_sources)."""
    ip, port = server.address
    if isinstance(server, TcpDataSource):
        d = {"context": ctx_index, "topic": topic, "kind": "tcp", "address": f"{ip}:{port}",
             "receivers": len(server.connections), "bytes_sent": server.bytes_sent,
             "datagrams_sent": None, "status_received": None,
             "messages": server.next_sqn, "dropped": server.dropped,
             "complete": sum(c.error is None for c in server.connections)}
        if isinstance(server, UmTcpSource):  # requests: receivers each went to; answers given
            d.update(requests_sent=list(server.requests_sent), first_qidx=server.first_qidx,
                     retention=server.retention, counters=dict(server.counters))
        return d
    if isinstance(server, RmDataSource):  # multicast: no receiver sessions, NAKs instead
        return {"context": ctx_index, "topic": topic, "kind": "lbtrm", "address": f"{ip}:{port}",
                "group": f"{server.group}:{server.dest_port}", "receivers": 0,
                "bytes_sent": server.datagrams_sent * server.datagram_size,
                "datagrams_sent": server.datagrams_sent, "status_received": None,
                "complete": int(server.next_seq >= server.count), "counters": dict(server.counters)}
    # LBT-RU: one live session; receivers ACK ("status")
    return {"context": ctx_index, "topic": topic, "kind": "lbtru", "address": f"{ip}:{port}",
            "receivers": len(server.clients), "bytes_sent": server.bytes_sent,
            "datagrams_sent": server.datagrams_sent, "status_received": server.counters["acks"],
            "messages": server.next_sqn, "dropped": server.dropped,
            "complete": sum(c.send_errors == 0 for c in server.clients.values()),
            "counters": dict(server.counters, refused=server.refused)}



# ------------------------------------------------------------------- report


def data_text(d: dict) -> str:
    """``data OK: 4194304 bytes, 812.3 MB/s``-style text of a data_outcome()."""
    if d["datagrams"] is not None:
        expect = (d["detail"] or {}).get("expect_count")
        amount = f"{d['datagrams']}/{expect} datagrams ({d['bytes']} bytes)"
    else:
        amount = f"{d['bytes']} bytes"
    rate = f"{d['bytes_per_s'] / 1e6:.1f} MB/s"
    if d["ok"]:
        return f"data OK: {amount}, {rate}"
    if d["kind"] is None:
        return f"data FAILED: {d['error']}"
    return f"data FAILED: {d['error'] or 'incomplete'}; {amount}, {rate}"


def render_text(result: SimResult) -> str:
    lines = []
    for r in result.receivers:
        head = f"ctx {r.context} ({r.client}) {r.topic}"
        if r.resolved:
            how = " (local source)" if r.local else ""
            line = f"{head} resolved in {r.time_ms:.3f} ms: {r.transport}{how}"
            if r.data is not None:
                line += "; " + data_text(r.data)
            lines.append(line)
        else:
            lines.append(f"{head} unresolved")
    if result.data_sources:
        ds = result.data_sources
        kinds = "/".join(sorted({d["kind"] for d in ds}))
        served = sum(d["receivers"] for d in ds)
        amount = f"{sum(d['bytes_sent'] for d in ds)} bytes"
        if any(d["datagrams_sent"] is not None for d in ds):
            amount = (f"{sum(d['datagrams_sent'] or 0 for d in ds)} datagrams ({amount}), "
                      f"{sum(d['status_received'] or 0 for d in ds)} status datagrams received")
        lines.append(f"data sources: {len(ds)} ({kinds}) served {served} receivers, {amount}")
    for rp in result.request_ports:
        for q in rp["requests"]:
            sent = next((d.get("requests_sent", []) for d in result.data_sources
                         if d["context"] == rp["context"] and d["topic"] == q["topic"]), [])
            lines.append(f"requests of ctx {rp['context']} {q['topic']}: {len(sent)}/{q['count']} sent to "
                         f"{sum(sent)} receivers in all; {sum(q['responses'].values())} responses with the "
                         f"right index and payload for {len(q['responses'])} requests, "
                         f"{q['bad_payloads']} with a wrong payload")
        st = rp["stats"]
        if st.get("uims") or st.get("uims_bad"):
            hops = ", ".join(f"{n} with hops_taken {h}" for h, n in sorted(st["uim_hops"].items()))
            lines.append(f"request port of ctx {rp['context']} ({rp['address']}): {st['uims']} UIMs by domain "
                         f"({hops}), {st['uims_bad']} with a wrong payload")
    if result.uim is not None:
        u = result.uim
        via = f" through {u['via']} (route heard after {u['route_after_s']} s)" if u["via"] else ""
        err = f": {u['error']}" if u["error"] else ""
        lines.append(f"UIMs to {u['to']}: {u['sent']}/{u['count']} sent{via}{err}")
    s = result.summary()
    if s["median_ms"] is None:
        times = "no time to resolve"
    else:
        times = f"time to resolve median {s['median_ms']:.3f} ms, max {s['max_ms']:.3f} ms"
    verified = ""
    if result.verify_data:
        verified = f"; data verified for {s['data_verified']}/{s['total']} receivers"
    lines.append(f"summary: {s['resolved']}/{s['total']} receivers resolved; {times}{verified}; "
                 f"ran {s['elapsed_s']:.3f} s")
    return "\n".join(lines) + "\n"


def render(result: SimResult, as_json: bool = False) -> str:
    if as_json:
        return json.dumps(result.as_dict(), indent=2) + "\n"
    return render_text(result)


def exit_status(result: SimResult) -> int:
    """0 when every receiver resolved (and, with verify_data, verified its
    data, and with a UIM by domain asked, all were sent), else 1."""
    ok = result.all_resolved and (not result.verify_data or result.all_data_verified)
    if result.uim is not None and result.uim["sent"] < result.uim["count"]:
        ok = False
    return 0 if ok else 1
