"""Section 5 of bench/router.py: the fan-out deployments (links through
counting forwarders), the rows measured per receiver count (link bytes,
delivered bytes per second against the minimal fan-out and the minimal
chain, messages dropped, CPU seconds per GB delivered) and their report.
The processes themselves are in bench/fanout.py.
"""

from __future__ import annotations

import contextlib
import functools
import json
import statistics
import time
import urllib.request
from pathlib import Path

from bench import fanout as F
from bench.router_deploy import (
    CHUNK,
    RCV_IP,
    RELAY_CODE,
    SRC_IP,
    TRD2,
    Advertiser,
    Processes,
    cpu_seconds,
    resolve,
)

FANOUT_PACED_BPS = 2_000_000  # the paced source of the link-bytes ratio, bytes per second
FANOUT_MESSAGE = 8192  # payload bytes per LBMC message of the fan-out sources
FANOUT_WARMUP_S = 1.0
TARGET_LINK_RATIO = 1.05  # link bytes / one receiver's
TARGET_FANOUT_RATIO = 0.8  # delivered bytes per second, routed / minimal fan-out
TARGET_CHAIN_RATIO = 0.8  # delivered bytes per second, routed / minimal chain (no receiver slow: no drop)
# offered loads of the routed measurement: None, a source as fast as it goes (the routers pace
# it: nothing may be dropped), then shares of what the minimal fan-out delivered (a fan-out
# that drops instead of pacing its source loses at the edge of what its receivers take)
FANOUT_LOADS = (None, 1.0, 0.8)


def fanout_rows(tmp: Path, stack: contextlib.ExitStack, ns: list[int], window: float,
                rounds: int = 1) -> list[dict]:
    """Section 5 (see bench/fanout.py): two deployments whose link crosses a
    counting forwarder, fan-out on (the default) and off (the per-connection
    relay, as before). Per N: the minimal fan-out's delivered bytes per second
    from a source as fast as it goes; per deployment the link ratio with a
    paced source, then the routed delivered bytes per second from a source
    paced at FANOUT_LOADS of what the minimal fan-out delivered to each
    receiver (a fan-out that drops instead of pacing its source cannot be fed
    an unpaced one; the per-connection relay paces it: 100 % only), with the
    messages dropped at each router in the measured window and from the first
    connection on.

    The ratio to the minimal chain (fan-out on, source unpaced) is measured
    ``rounds`` times, the chain and the routed path in turn, each round with
    sources of its own: a single pair of windows on a shared 2-CPU host swings
    by several hundredths, so the row keeps every round's ratio and reports
    their median ("chain", "routed": the medians of each; CPU per GB and drops
    over all rounds)."""
    deps = {mode: _fanout_deployment(tmp, stack, mode) for mode in ("on", "off")}
    _, fast_port = deps["on"]["source"]("fast", 3, 0)
    index = iter(range(10, 1 << 16))  # (each source's advertisement index: one of its own)
    rows = []
    for n in ns:
        base, base_cpu = F.baseline((SRC_IP, fast_port), n, TRD2, RCV_IP, FANOUT_WARMUP_S, window, cpu_seconds)
        chains: list[tuple[float, float]] = []  # (bytes per second, CPU seconds per GB) of each round's chain
        for mode, d in deps.items():
            dep, fwd, source = d["dep"], d["fwd"], d["source"]
            counts, _, (l0, l1) = F.receive(d["paced"], n, RCV_IP, FANOUT_WARMUP_S, window, fwd.a_to_b)
            for k, load in enumerate(FANOUT_LOADS if mode == "on" else FANOUT_LOADS[:2]):
                measured = mode == "on" and load is None  # (first: the other cases use its chains)
                cases = []
                for r in range(rounds if measured else 1):
                    if measured:
                        chain = F.minimal_chain((SRC_IP, fast_port), n, (RELAY_CODE, "copy", CHUNK), TRD2,
                                                RCV_IP, FANOUT_WARMUP_S, window, cpu_seconds)
                    offered, _ = source(f"offered{n}.{mode}.{k}.{r}", next(index),
                                        0 if load is None else load * base / n)
                    cases.append(_routed_case(dep, fwd, offered, n, window))
                    if measured:
                        chains.append(chain)
                        cases[-1]["ratio"] = cases[-1]["routed"] / chain[0]
                    time.sleep(3)  # the proxies' streams and the upstream connections close (lingers)
                rows.append({"n": n, "mode": mode, "load": load, "link": l1 - l0, "one": max(counts),
                             "baseline": base, "baseline_cpu": base_cpu,
                             "chain": statistics.median(c[0] for c in chains),
                             "chain_cpu": statistics.median(c[1] for c in chains), **_combined(cases)})
    return rows


def _routed_case(dep: Processes, fwd: F.CountingForwarder, offered: tuple[str, int], n: int,
                 window: float) -> dict:
    """One measured window of ``n`` receivers of the source at ``offered``
    through the deployment: delivered bytes per second, the CPU seconds (per
    process) and bytes delivered, the messages dropped at each router in the
    window and from the first connection on."""
    before = _counters(dep.metrics_a), _counters(dep.metrics_b)
    got, secs, (m0, m1) = F.receive(offered, n, RCV_IP, FANOUT_WARMUP_S, window,
                                    functools.partial(_routed_marks, dep, fwd))
    after = _counters(dep.metrics_a), _counters(dep.metrics_b)
    c0, c1 = m0["cpu"], m1["cpu"]
    return {"routed": sum(got) / secs, "bytes": sum(got), "cpu_s": {k: c1[k] - c0[k] for k in c0},
            "dropped_a": _delta(before[0], after[0], "fanout_link_dropped_messages"),
            "dropped_b": _delta(before[1], after[1], "fanout_dropped_messages"),
            "window_a": _delta(m0["a"], m1["a"], "fanout_link_dropped_messages"),
            "window_b": _delta(m0["b"], m1["b"], "fanout_dropped_messages")}


def _combined(cases: list[dict]) -> dict:
    """The rounds of one case as one row: the median of their delivered rates,
    each round's ratio to the chain measured just before it ("ratios": the
    unpaced case with fan-out on), the routers' CPU per GB and the drops over
    all rounds."""
    gb = max(sum(c["bytes"] for c in cases) / 1e9, 1e-9)
    return {"routed": statistics.median(c["routed"] for c in cases),
            "ratios": [c["ratio"] for c in cases if "ratio" in c],
            "cpu": {k: sum(c["cpu_s"][k] for c in cases) / gb for k in cases[0]["cpu_s"]},
            **{k: sum(c[k] for c in cases) for k in ("dropped_a", "dropped_b", "window_a", "window_b")}}


def _fanout_deployment(tmp: Path, stack: contextlib.ExitStack, mode: str) -> dict:
    """A deployment (fan-out ``mode`` "on" or "off") with its link through a
    counting forwarder, a source maker and a paced source resolved in TRD2."""
    hops = []

    def hop(peer: int) -> int:
        hops.append(F.CountingForwarder(TRD2, (TRD2, peer)))
        stack.callback(hops[-1].close)
        return hops[-1].port

    dep = Processes(tmp, tag=f"fanout-{mode}", fanout=mode == "on", link_hop=hop)
    stack.callback(dep.stop)
    dep.start()

    def source(name: str, index: int, rate: float) -> tuple[tuple[str, int], int]:
        p, port = F.spawn(F.SOURCE_CODE, SRC_IP, FANOUT_MESSAGE, rate)
        stack.callback(F.stop, p)
        adv = Advertiser(f"bench.fanout.{name}", dep.lbmrd1, port, index)
        stack.callback(adv.close)
        return resolve(f"bench.fanout.{name}", dep.lbmrd2), port

    return {"dep": dep, "fwd": hops[-1], "source": source, "paced": source("paced", 2, FANOUT_PACED_BPS)[0]}


def _routed_marks(dep: Processes, fwd: F.CountingForwarder) -> dict[str, dict]:
    """CPU seconds so far of the routers ("a", "b") and the forwarder ("fwd")
    ("cpu"), and the routers' counters ("a", "b")."""
    cpu = {**dep.cpu(), "fwd": cpu_seconds(fwd.proc.pid)}
    return {"cpu": cpu, "a": _counters(dep.metrics_a), "b": _counters(dep.metrics_b)}


def _delta(before: dict, after: dict, key: str) -> int:
    return after.get(key, 0) - before.get(key, 0)


def _counters(metrics_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/status", timeout=5) as r:
        return json.loads(r.read())["counters"]


def print_fanout(rows: list[dict]) -> None:
    for r in rows:
        if r["mode"] == "on" and r["load"] == FANOUT_LOADS[0]:
            print(f"  N={r['n']:<4d} minimal fan-out {r['baseline'] / 1e6:7.1f} MB/s delivered")
            print(f"         minimal chain (copy relay -> forwarder -> minimal fan-out: the routed path's "
                  f"processes, no framing, queues or drops) {r['chain'] / 1e6:7.1f} MB/s, ratio "
                  f"{r['chain'] / r['baseline']:5.3f}; CPU s/GB delivered {r['chain_cpu']:.2f}")
        what = "fan-out" if r["mode"] == "on" else "per connection (fanout=off, before)"
        if r["load"] == FANOUT_LOADS[0]:
            link = r["link"] / max(r["one"], 1)
            goal = f" ({'meets' if link <= TARGET_LINK_RATIO else 'MISSES'} <= {TARGET_LINK_RATIO})" \
                if r["mode"] == "on" else ""
            print(f"    {what}: link / one receiver {link:7.3f}{goal}")
        ratio = r["routed"] / r["baseline"]
        chain = r["routed"] / r["chain"]
        # drops in the measured window, and before it: while the N receivers connect (all are
        # connected before any is read: the first ones take nothing meanwhile) and warm up
        drops = (f"messages dropped at router A {r['window_a']}, at router B {r['window_b']} "
                 f"(warm-up: {r['dropped_a'] - r['window_a']}, {r['dropped_b'] - r['window_b']})")
        if r["load"] is None and r["ratios"]:
            chain = statistics.median(r["ratios"])
            rounds = len(r["ratios"])
            goal = "meets" if chain >= TARGET_CHAIN_RATIO and not (r["window_a"] or r["window_b"]) else "MISSES"
            each = (f" (median of {rounds} rounds, each against the chain just before it: "
                    f"{', '.join(f'{x:.3f}' for x in r['ratios'])})" if rounds > 1 else "")
            print(f"      source unpaced: {r['routed'] / 1e6:7.1f} MB/s delivered, {chain:5.3f} of the minimal "
                  f"chain{each}, {drops} ({goal} >= {TARGET_CHAIN_RATIO} of the chain, none dropped); "
                  f"ratio {ratio:5.3f}")
        elif r["load"] is None:
            print(f"      source unpaced: {r['routed'] / 1e6:7.1f} MB/s delivered, {chain:5.3f} of the minimal "
                  f"chain's median, {drops}; ratio {ratio:5.3f}")
        else:
            print(f"      offered {r['load']:.0%}: {r['routed'] / 1e6:7.1f} MB/s delivered, ratio {ratio:5.3f} "
                  f"({'meets' if ratio >= TARGET_FANOUT_RATIO else 'BELOW'} >= {TARGET_FANOUT_RATIO}), "
                  f"{chain:5.3f} of the minimal chain; {drops}")
        c = r["cpu"]
        path = c["a"] + c["b"] + c["fwd"]
        print(f"        CPU s/GB delivered: router A {c['a']:.2f}, router B {c['b']:.2f} (routers "
              f"{c['a'] + c['b']:.2f}), forwarder {c['fwd']:.2f}; the routed path's processes {path:.2f}, "
              f"{path / max(r['chain_cpu'], 1e-9):.2f}x the minimal chain's {r['chain_cpu']:.2f} "
              f"(minimal fan-out process {r['baseline_cpu']:.2f})")


def run_fanout(tmp: Path, stack: contextlib.ExitStack, args) -> None:
    ns = [int(x) for x in args.fanout_n.split(",") if x]
    print(f"\n5. Fan-out: one live LBMC source in TRD1 ({FANOUT_MESSAGE}-byte messages), N receivers in TRD2, "
          f"router pairs with fan-out and per connection (links through counting forwarders) against a minimal "
          f"fan-out "
          f"process (reads one socket, writes N), {args.fanout_window:g} s per case after "
          f"{FANOUT_WARMUP_S:g} s; link ratio with the source paced at {FANOUT_PACED_BPS / 1e6:g} MB/s; "
          f"delivered bytes per second of all receivers, the routed source unpaced (paced by the routers), "
          f"then paced at {', '.join(f'{x:.0%}' for x in FANOUT_LOADS if x is not None)} of what the "
          f"minimal fan-out delivered to each")
    print_fanout(fanout_rows(tmp, stack, ns, args.fanout_window, args.fanout_rounds))
