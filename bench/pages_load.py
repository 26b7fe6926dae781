"""Operators' pages under load: the relay rate of a router pair with and
without 64 clients polling the pages' JSON every 100 ms (issue 25).

    python bench/pages_load.py [--mbytes 300] [--runs 3] [--clients 64] [--interval 0.1]
                               [--poll b|a|both]

The deployment is bench/router.py's "processes" one (bench/router_deploy.py:
two lbmrds and two lbmr-router processes with the shipped configs, ports
moved, the endpoint's ``<metrics>`` on 127.0.0.1): a TCP source in TRD1
serves --mbytes MB of a known pattern to each connection; a receiver in TRD2
reads it through router B's proxy, router A and the peer link, checking the
bytes (the per-connection relay, zero copy: the source sends a byte pattern,
not LBMC). The time runs from connect to EOF.

The pollers are one process of their own (trio): --clients loops, each
getting ``/api/router`` and ``/api/sessions`` by turns every --interval
seconds from router B (``--poll``: or A, or both), a new connection each
time, as the page's ``fetch`` does (the endpoint speaks HTTP/1.0).

Each of --runs rounds measures the transfer three ways (the order rotating):
without pollers (the baseline), with the pollers getting a static file of
the endpoint instead (``/static/icon.svg``: what the pollers and the
connections cost the machine, which has two cores for everything), and with
the pollers getting the JSON. Printed: the best and the median rate of each,
their ratios to the baseline and JSON/static (the cost of making the JSON
in the router), the polls answered per second, their latency (median, 99th
percentile), errors, and the CPU of each router and of the machine over the
best transfer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.router_deploy import (  # noqa: E402
    SRC_IP,
    Advertiser,
    DataSource,
    Processes,
    cpu_snapshot,
    receive,
    resolve,
)

TOPIC = "bench.pages.load"
KINDS = ("without", "static", "json")
POLLED = {"static": ["/static/icon.svg"], "json": ["/api/router", "/api/sessions"]}
LABEL = {"without": "no pollers", "static": "pollers: static file", "json": "pollers: the JSON"}

#: the pollers' process: argv = JSON {"targets": [[host, port], ...], "clients": n,
#: "interval": s, "seconds": s}; prints JSON {"polls", "errors", "latency": [...]}
POLLERS = r'''
import json, signal, sys, trio
cfg = json.loads(sys.argv[1])
PATHS = cfg["paths"]
polls, errors, lat = [0], {}, []

async def one(host, port, path):
    t0 = trio.current_time()
    with trio.fail_after(5):
        s = await trio.open_tcp_stream(host, port)
        async with s:
            await s.send_all(f"GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\n\r\n".encode())
            data = b""
            while chunk := await s.receive_some(65536):
                data += chunk
    if not data.startswith(b"HTTP/1.0 200"):
        raise RuntimeError(data[:40].decode(errors="replace"))
    if path.startswith("/api/"):
        json.loads(data.partition(b"\r\n\r\n")[2])
    lat.append(trio.current_time() - t0)

async def client(i, end):
    host, port = cfg["targets"][i % len(cfg["targets"])]
    k = i
    nxt = trio.current_time() + cfg["interval"] * i / cfg["clients"]  # spread over the interval
    while nxt < end:
        await trio.sleep_until(nxt)
        try:
            await one(host, port, PATHS[k % len(PATHS)])
            polls[0] += 1
        except Exception as e:
            name = type(e).__name__
            errors[name] = errors.get(name, 0) + 1
        k += 1
        nxt += cfg["interval"]

async def stop_on_term(scope):
    with trio.open_signal_receiver(signal.SIGTERM) as sigs:
        async for _ in sigs:
            scope.cancel()

async def main():
    t0 = trio.current_time()
    end = t0 + cfg["seconds"]
    async with trio.open_nursery() as n:
        n.start_soon(stop_on_term, n.cancel_scope)
        async with trio.open_nursery() as clients:
            for i in range(cfg["clients"]):
                clients.start_soon(client, i, end)
        n.cancel_scope.cancel()
    lat.sort()
    print(json.dumps({"polls": polls[0], "errors": errors, "seconds": trio.current_time() - t0,
                      "p50": lat[len(lat) // 2] if lat else None,
                      "p99": lat[int(len(lat) * 0.99)] if lat else None}))

trio.run(main)
'''


class Pollers:
    """The pollers' process for ``seconds`` seconds at most (ended with the transfer)."""

    def __init__(self, targets, paths, clients: int, interval: float, seconds: float) -> None:
        cfg = json.dumps({"targets": targets, "paths": paths, "clients": clients, "interval": interval,
                          "seconds": seconds})
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-c", POLLERS, cfg], stdout=subprocess.PIPE, text=True)

    def stop(self) -> dict:
        """End the pollers; what they counted."""
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=60)
        return json.loads(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mbytes", type=float, default=300.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--poll", choices=("a", "b", "both"), default="b")
    a = ap.parse_args(argv)
    total = int(a.mbytes * 1e6)
    with tempfile.TemporaryDirectory(prefix="pages-load-") as tmp:
        dep = Processes(Path(tmp))
        dep.start()
        source = DataSource(total)
        adv = Advertiser(TOPIC, dep.lbmrd1, source.port)
        try:
            proxy = resolve(TOPIC, dep.lbmrd2)
            targets = {"a": [["127.0.0.1", dep.metrics_a]], "b": [["127.0.0.1", dep.metrics_b]]}
            targets["both"] = targets["a"] + targets["b"]
            receive(proxy, total)  # warm up: the proxy's stream, the page caches
            rates: dict[str, list[float]] = {k: [] for k in KINDS}
            cpu: dict[str, list[dict]] = {k: [] for k in KINDS}
            polls: dict[str, list[dict]] = {k: [] for k in KINDS[1:]}
            for i in range(a.runs):
                for kind in KINDS[i % 3:] + KINDS[:i % 3]:
                    pollers = None
                    if kind != "without":
                        pollers = Pollers(targets[a.poll], POLLED[kind], a.clients, a.interval, 600.0)
                        time.sleep(1.0)  # the pollers running before the transfer starts
                    before = cpu_snapshot(dep)
                    dt = receive(proxy, total)
                    after = cpu_snapshot(dep)
                    if pollers is not None:
                        polls[kind].append(pollers.stop())
                    rates[kind].append(total / dt / 1e6)
                    cpu[kind].append({k: (after[k] - before[k]) / dt for k in after})
        finally:
            adv.close()
            source.close()
            dep.stop()
    print(f"pages load: {a.mbytes:g} MB per transfer, {a.runs} rounds, per-connection (zero copy) relay, "
          f"{a.clients} clients polling router {a.poll.upper()} every {a.interval * 1000:g} ms")
    for kind in KINDS:
        r = rates[kind]
        best = max(range(len(r)), key=r.__getitem__)
        c = cpu[kind][best]
        print(f"  relay, {LABEL[kind]:22s}: best {max(r):7.1f} MB/s  median {statistics.median(r):7.1f} MB/s"
              f"   CPU at best: router A {c['a']:.2f}  router B {c['b']:.2f}  machine {c['machine']:.2f}")
    med = {k: statistics.median(rates[k]) for k in KINDS}
    top = {k: max(rates[k]) for k in KINDS}
    print(f"  ratio JSON/without: best {top['json'] / top['without']:.3f}  median {med['json'] / med['without']:.3f};"
          f"  static/without: best {top['static'] / top['without']:.3f}  median {med['static'] / med['without']:.3f};"
          f"  JSON/static: best {top['json'] / top['static']:.3f}  median {med['json'] / med['static']:.3f}")
    for kind in KINDS[1:]:
        ps = polls[kind]
        answered = sum(p["polls"] for p in ps) / sum(p["seconds"] for p in ps)
        errors: dict[str, int] = {}
        for p in ps:
            for k, v in p["errors"].items():
                errors[k] = errors.get(k, 0) + v
        p50 = statistics.median(p["p50"] for p in ps if p["p50"] is not None)
        p99 = max(p["p99"] for p in ps if p["p99"] is not None)
        print(f"  polls of the {kind:6s}: {answered:.0f}/s answered (asked {a.clients / a.interval:.0f}/s), "
              f"latency median {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, errors {errors or 'none'}")
    print(f"  (source {SRC_IP}, machine CPUs: {os.cpu_count()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
