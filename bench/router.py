"""Router benchmark: TCP relay throughput through two routers (zero-copy and
copy data paths, plain and TLS peer links) against a minimal splice relay and
direct loopback, LBT-RU datagram throughput and loss, and topic resolution
convergence across the routers.

    python bench/router.py [--mbytes 200] [--runs 3] [--topics 8] [--ru-count 30000]
                           [--ru-rates 10000,30000] [--no-tls] [--no-ru]
                           [--profile auto|py-spy|cprofile|none] [--no-inprocess]
                           [--fanout-n 1,10,100] [--fanout-window 3] [--fanout-rounds 3]
                           [--no-fanout] [--only-fanout]
                           [--rr-runs 2] [--rr-count 2000] [--rr-rate-count 10000] [--rr-responders 3]
                           [--rr-window 64] [--no-requests] [--only-requests]
                           [--lj-rounds 3] [--no-latejoin] [--only-latejoin]

Everything runs on loopback (127.0.0.0/8) and stops by itself (a hard limit
of HARD_LIMIT_S seconds ends a stuck run).

Deployment (as tests/router/system/test_cli.py runs it): two lbmrds
(``lbmrd.cli``, TRD1 on 127.0.1.1, TRD2 on 127.0.2.1) and two routers
(``router.cli`` with configs/router-a.xml and router-b.xml, every port moved
to a free one and the relay range widened to RELAY_PORTS ports) are separate
processes, so each router has a CPU of its own (the two cores of the machine
are shared with the source and the receiver, which are threads of this
process with blocking sockets). Three such deployments run side by side, each
with its own lbmrds: "zero copy" (the shipped configs with <relay
fanout="off">, the per-connection relay, since the source sends a byte
pattern, not LBMC: a plain TCP peer link, payloads spliced), "copy" (the same
with LBMR_ROUTER_ZERO_COPY=0 in the routers' environment: every byte through
Python) and "TLS" (the configs' <tls> block filled in with a throwaway CA and
certificates made by openssl; TLS links always take the copy path), and a
fourth, "direct link": one router with an endpoint in each TRD
(configs/router-direct.xml, per-connection relay), whose sessions cross
between its endpoints in memory.

1. Throughput. A TCP "source" on 127.0.1.5 (TRD1) serves --mbytes MB (10^6
   bytes) of a known pattern to every connection, sent CHUNK bytes per
   ``sendall``, and is advertised through each deployment's lbmrd 1 (a TIR
   every 0.5 s). The receiver (127.0.2.9, TRD2) resolves the topic through
   lbmrd 2, which gives router B's proxy, and reads with ``recv_into`` of
   CHUNK bytes until EOF: receiver -> proxy (router B) -> peer link -> router
   A -> source. The time runs from ``connect`` to EOF; the byte count and a
   16-byte probe at both ends of every read are checked against the pattern
   (whose period is not a multiple of any read size). In the same rounds the
   same receiver also reads straight from the source ("direct") and through
   two minimal one-way relay processes in the same topology (RELAY_CODE,
   started once): "splice" (os.splice through a pipe, the baseline of the
   target) and "copy" (recv_into/sendall). Each of --runs rounds measures
   every path once (the order rotating); the best of each is reported, with
   the ratios routed/splice (target TARGET_RATIO) and routed/direct, and the
   CPU use over the best zero-copy routed transfer (routers, this process,
   everything else on the machine: a shared machine shows here). The routed
   measurement is also made with both lbmrds and both routers in one trio
   loop in a thread of this process (``lbmrd.server.Daemon`` and
   ``router.shell.single.Router`` as tests/router/system/test_e2e.py sets them up): the
   "in-process" number.

2. LBT-RU. A source of the LBT-RU-like protocol (lbmr_tools.sim.dataplane,
   RU_SIZE-byte datagrams) in a process of its own on 127.0.1.5 in TRD1,
   advertised in the zero-copy deployment; a receiver in TRD2 (this process)
   takes --ru-count datagrams, each verified, paced by the source at each of
   --ru-rates datagrams per second, once straight from the source and once
   through the routers' proxy. Printed: datagrams received and lost, the
   achieved rate, routed/direct, and how many UDP datagrams the kernel
   dropped at full socket receive buffers meanwhile (/proc/net/snmp
   RcvbufErrors, whole machine: on a busy machine the receiver, which is
   Python, falls behind the bursts a relay re-emits after a pause). Both ends
   are Python: at high rates they, not the routers, are the limit: compare
   with "direct".

3. Convergence. For each of --topics new topic names and each order:
   * receiver first: a receiver context starts querying (UM receiver timing:
     a TQR at once, then gaps of 20 ms doubling to 200 ms), GAP_S later a
     source context sends its first TIR (UM source timing: at once, then gaps
     of 10 ms doubling to 500 ms; it also answers TQRs for its topic at once).
     Convergence = the receiver's first proxy TIR (router B's relay address,
     not a final advertisement) minus the source's first TIR send.
   * source first: the source starts GAP_S before the receiver; convergence
     = first proxy TIR minus the receiver's first TQR (the source was known
     before the receiver existed, so the later start is the one that counts).
   Both contexts are UDP sockets of this process driven by one select loop;
   times are time.perf_counter() around the syscalls.

4. Profile (when routed/splice is below TARGET_RATIO): py-spy (``--idle
   --nonblocking``, if installed: ``pip install py-spy``) samples both
   zero-copy router processes for PROFILE_S seconds while routed transfers
   run back to back, and the wall time of each router is split into waiting
   in epoll, socket syscalls and Python, with the functions where it goes.
   Without py-spy (or with --profile cprofile) a fresh pair of router
   processes runs one routed transfer under cProfile instead.

5. Fan-out (bench/fanout.py; --fanout-n, --fanout-window, --fanout-rounds,
   --no-fanout, --only-fanout): two more deployments, the shipped configs as they are
   (fan-out on) and with fanout="off" (the per-connection relay: before),
   each peer link through a counting forwarder process; one
   live LBMC source in TRD1 and N receivers in TRD2 (this process, one epoll
   loop) against a minimal fan-out process (reads one socket, writes N) in
   the same run: link bytes / one receiver's (goal TARGET_LINK_RATIO), and
   delivered bytes per second of all receivers with the routed source
   unpaced (the routers pace it: goal TARGET_CHAIN_RATIO of the minimal
   chain and no message dropped), then paced at FANOUT_LOADS (100 % and
   80 %) of what the minimal fan-out delivered to each receiver (goal
   TARGET_FANOUT_RATIO), with the messages
   each router dropped in the measured window (the goal's) and, apart,
   during the warm-up (the receivers connect one after the other and none is
   read until all are: the first ones, taking nothing for a while, may fall
   behind and drop), and the CPU seconds per GB delivered of router A,
   router B (and the two together) and the forwarder, and of the minimal
   fan-out process. With them, the minimal chain: the routed path's
   processes built of minimal ones (a copy relay, the counting forwarder,
   the minimal fan-out: no framing, queues or drops), what any router in
   that place could reach on this host, and the routed rate as a share of
   it; and the CPU seconds per GB of the routed path's three processes as a
   multiple of the minimal chain's three (on a host whose CPUs are the
   limit, the rates follow from these). The share of the chain (source
   unpaced) is measured --fanout-rounds times, the chain and the routed path
   in turn, each against the chain just before it, and their median counts:
   one pair of windows on a shared 2-CPU host swings by several hundredths.

6. Requests and responses (bench/router_requests.py; --rr-runs, --rr-count,
   --rr-rate-count, --rr-responders, --rr-window, --no-requests,
   --only-requests, which runs this section alone in about 25 s): one more
   deployment, the shipped configs as they are (fan-out on: the routers
   rewrite each REQUEST header to a request listener of router B and carry
   each responder's connection back as a RESPONSE stream). A requester (a
   process of its own at 127.0.1.5 in TRD1: a TCP source whose LBMC messages
   carry REQUEST headers naming its request port) and responders (a process
   each: they resolve the topic through their TRD's lbmrd, connect to the
   source the TIR names, and answer every request on one kept connection to
   the address the header names, one 64-byte response per request); the
   same programs with the responders in TRD1 (resolving the requester
   itself, no router on the way) are the baseline, measured in the same
   rounds (the order alternating). Per round: the round trip of --rr-count
   requests one at a time to one responder (p50, p99 and max over all
   rounds, with its two legs, read from CLOCK_MONOTONIC in the requester and
   in the responder), and responses per second of --rr-rate-count requests
   to --rr-responders responders with at most --rr-window outstanding (best
   round); the ratios routed/direct, the routers' CPU time per round trip
   and per response (from /proc, their set-up included) against the
   requester's own, and the routers' request counters over the section.
   Every wait is bounded (warm-up 20 s, a measurement 60 s).
7. Late join (bench/router_latejoin.py; --lj-rounds, --no-latejoin,
   --only-latejoin): a late joiner takes 10,000 retained messages (UME_LJ_INFO,
   RETRANS) then the live stream, straight from lbmr-sim's retaining source and
   through a pair of routers (its LJI_REQ to router B's <request-tcp>, a RECOVERY
   stream to router A, the answers back), in one trio loop in this process: the
   best time of each and routed / direct.

The pieces: bench/router_deploy.py (deployments, sources, receivers, CPU
accounting), bench/router_measure.py (sections 1 to 3), bench/router_profile.py
(section 4), bench/router_fanout.py and bench/fanout.py (section 5),
bench/router_requests.py (section 6), bench/router_latejoin.py (section 7); this script reads the options, runs the
sections and prints what they found.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.router_deploy import (  # noqa: E402
    CHUNK,
    SRC_IP,
    TPUT_TOPIC,
    Advertiser,
    DataSource,
    DirectLink,
    InProcess,
    Processes,
    RelayChain,
    certificates,
    resolve,
)
from bench.router_fanout import run_fanout  # noqa: E402
from bench.router_latejoin import run_latejoin  # noqa: E402
from bench.router_measure import (  # noqa: E402
    CONVERGE_TIMEOUT_S,
    GAP_S,
    convergence,
    lbtru_throughput,
    print_lbtru,
    throughput,
    throughput_paths,
)
from bench.router_profile import (  # noqa: E402
    PROFILE_S,
    cprofile_profile,
    pyspy_profile,
    report_cprofile,
    report_pyspy,
)
from bench.router_requests import print_requests, request_rows  # noqa: E402

TARGET_RATIO = 0.8  # routed (zero copy) / minimal splice relay
TARGET_CONVERGENCE_MS = 50.0
HARD_LIMIT_S = 480




def _ms(v: float | None) -> str:
    return "timeout" if v is None else f"{1000 * v:.1f}"


def print_throughput(label: str, res: dict, mb: float) -> float:
    d, r = res["best"]["direct"], res["best"]["routed"]
    ratio = d / r
    print(f"  {label}:")
    print(f"    direct loopback TCP      {mb / d:9.1f} MB/s  ({d:.3f} s)")
    print(f"    through routers B -> A   {mb / r:9.1f} MB/s  ({r:.3f} s)   proxy {res['proxy'][0]}:{res['proxy'][1]}")
    print(f"    ratio routed/direct      {ratio:9.3f}x")
    print_cpu(res["cpu"])
    return ratio


def print_cpu(c: dict) -> None:
    if not c:
        return
    parts = [f"router {k.upper()} {100 * c[k]:.0f}%" for k in ("a", "b") if k in c]
    parts.append(f"this process (source + receiver) {100 * c['self']:.0f}%")
    others = c["machine"] - sum(v for k, v in c.items() if k != "machine")
    print(f"    CPU during the best zero-copy routed run, % of one core: {', '.join(parts)}; "
          f"other processes {100 * max(0.0, others):.0f}% (machine: {100 * c['machine']:.0f}% of "
          f"{100 * (os.cpu_count() or 1)}%)")
    if others > 0.2:
        print("    WARNING: other processes competed for the CPUs during this run; the numbers are low")


def print_cpu_per_gb(per_gb: dict, ends: dict | None = None) -> None:
    """CPU-seconds per GB of the processes in the middle of the routed path and of the
    splice relay path (all rounds), of the source and the receiver at their ends, and what
    they imply on a host whose CPUs are the limit."""
    if "routed" not in per_gb or "splice" not in per_gb:
        return
    (ru, rs), (su, ss) = per_gb["routed"], per_gb["splice"]
    print(f"    CPU-seconds per GB moved (all rounds): routers A+B {ru + rs:.3f} (user {ru:.3f}, system "
          f"{rs:.3f}); splice relays {su + ss:.3f} (user {su:.3f}, system {ss:.3f}); "
          f"routers / relays {(ru + rs) / max(su + ss, 1e-9):.2f}x")
    if ends and "routed" in ends and "splice" in ends:
        print(f"    source + receiver (this process) at the ends: {ends['routed']:.3f} CPU-seconds per GB "
              f"routed, {ends['splice']:.3f} through the splice relays")
    print(f"    (on {os.cpu_count()} CPUs shared with the source and the receiver, whichever path costs "
          "less CPU per byte moves more bytes once the CPUs are the limit)")


def congestion_control() -> str:
    """The host's default TCP congestion control (Linux), which shapes every
    loopback figure here: BBR paces each socket's sends with timers where the
    qdisc is not fq (loopback's is none), and on a virtual machine that costs
    more CPU than the copies (lbmr-router(8), BUGS)."""
    try:
        return Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mbytes", type=float, default=200, help="MB (10^6 bytes) per transfer")
    ap.add_argument("--runs", type=int, default=3, help="transfers per path; the best counts")
    ap.add_argument("--topics", type=int, default=8, help="convergence measurements per order")
    ap.add_argument("--profile", choices=["auto", "py-spy", "cprofile", "none"], default="auto",
                    help="profiler used when the ratio is below target (auto: py-spy if installed)")
    ap.add_argument("--no-inprocess", action="store_true", help="skip the in-process throughput")
    ap.add_argument("--no-tls", action="store_true", help="skip the TLS-link deployment")
    ap.add_argument("--no-ru", action="store_true", help="skip the LBT-RU measurement")
    ap.add_argument("--ru-count", type=int, default=30_000, help="LBT-RU datagrams per measurement")
    ap.add_argument("--ru-rates", default="10000,30000",
                    help="LBT-RU source rates to measure, datagrams per second, comma-separated")
    ap.add_argument("--top", type=int, default=12, help="profile lines per list")
    ap.add_argument("--fanout-n", default="1,10,100",
                    help="fan-out: receiver counts to measure, comma-separated")
    ap.add_argument("--fanout-window", type=float, default=3.0, help="fan-out: seconds measured per case")
    ap.add_argument("--fanout-rounds", type=int, default=3,
                    help="fan-out: rounds of the routed path against the minimal chain (unpaced source), "
                         "each in turn; the median counts")
    ap.add_argument("--no-fanout", action="store_true", help="skip the fan-out measurement")
    ap.add_argument("--only-fanout", action="store_true", help="measure only the fan-out (section 5)")
    ap.add_argument("--rr-runs", type=int, default=2,
                    help="requests and responses: rounds, every case once per round")
    ap.add_argument("--rr-count", type=int, default=2000,
                    help="requests and responses: requests of the round trip, one at a time")
    ap.add_argument("--rr-rate-count", type=int, default=10000,
                    help="requests and responses: requests of the responses-per-second case")
    ap.add_argument("--rr-responders", type=int, default=3,
                    help="requests and responses: responders of the responses-per-second case")
    ap.add_argument("--rr-window", type=int, default=64,
                    help="requests and responses: outstanding requests at most (responses per second)")
    ap.add_argument("--no-requests", action="store_true", help="skip the requests and responses (section 6)")
    ap.add_argument("--only-requests", action="store_true",
                    help="measure only the requests and responses (section 6)")
    ap.add_argument("--lj-rounds", type=int, default=3, help="late join: rounds of each path; the best counts")
    ap.add_argument("--no-latejoin", action="store_true", help="skip the late-join measurement")
    ap.add_argument("--only-latejoin", action="store_true", help="measure only the late join (section 7)")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.topics < 1 or args.mbytes <= 0 or args.lj_rounds < 1 or not 1 <= args.fanout_rounds <= 10:
        ap.error("--runs, --topics and --lj-rounds must be at least 1, --fanout-rounds 1 to 10, --mbytes positive")
    if not (1 <= args.rr_runs <= 10 and 1 <= args.rr_count <= 100_000 and 1 <= args.rr_rate_count <= 100_000
            and 1 <= args.rr_responders <= 16 and 1 <= args.rr_window <= 4096):
        ap.error("--rr-runs 1 to 10, --rr-count and --rr-rate-count 1 to 100000, --rr-responders 1 to 16, --rr-window 1 to 4096")
    total = int(args.mbytes * 1_000_000)
    mb = total / 1e6

    def hard_limit(signum, frame):
        raise TimeoutError(f"benchmark exceeded {HARD_LIMIT_S} s")

    signal.signal(signal.SIGALRM, hard_limit)
    signal.alarm(HARD_LIMIT_S)
    started = time.monotonic()
    print(f"lbmr-router benchmark: {mb:g} MB per transfer, best of {args.runs}, reads/writes of "
          f"{CHUNK // 1024} KiB, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
          f"TCP congestion control {congestion_control()}")
    source = DataSource(total)
    with tempfile.TemporaryDirectory(prefix="bench-router-") as td, contextlib.ExitStack() as stack:
        tmp = Path(td)
        if args.only_fanout:
            run_fanout(tmp, stack, args)
            print(f"\ntotal {time.monotonic() - started:.1f} s")
            return 0
        if args.only_requests:
            print_requests(request_rows(tmp, stack, args), args)
            print(f"\ntotal {time.monotonic() - started:.1f} s")
            return 0
        if args.only_latejoin:
            run_latejoin(args.lj_rounds)
            print(f"\ntotal {time.monotonic() - started:.1f} s")
            return 0
        stack.callback(source.close)
        dep = Processes(tmp, tag="zero-copy")
        stack.callback(dep.stop)
        dep.start()
        copy_dep = Processes(tmp, env={"LBMR_ROUTER_ZERO_COPY": "0"}, tag="copy")
        stack.callback(copy_dep.stop)
        copy_dep.start()
        direct_dep = DirectLink(tmp, tag="direct-link")
        stack.callback(direct_dep.stop)
        direct_dep.start()
        tls_dep = None
        certs = None if args.no_tls else certificates(tmp)
        if certs is not None:
            tls_dep = Processes(tmp, tls=certs, tag="tls")
            stack.callback(tls_dep.stop)
            tls_dep.start()
        print("\n1. Throughput, one TCP stream (receiver in TRD2 -> proxy of router B -> peer link -> "
              "router A -> source in TRD1), routers and lbmrds as separate processes; best of "
              f"{args.runs} rounds, every path once per round")
        advertisers = [Advertiser(TPUT_TOPIC, d.lbmrd1, source.port)
                       for d in (dep, copy_dep, tls_dep, direct_dep) if d]
        for a in advertisers:
            stack.callback(a.close)
        paths = {"direct": (SRC_IP, source.port)}
        labels = {"direct": "direct loopback TCP"}
        chains = {}
        for mode, what in (("splice", "splice relay: 2 processes, os.splice through a pipe"),
                           ("copy", f"copy relay: 2 processes, recv_into/sendall of {CHUNK // 1024} KiB")):
            chain = chains[mode] = RelayChain(source, mode)
            stack.callback(chain.stop)
            paths[mode], labels[mode] = chain.addr, what
        for key, d, what in (("routed", dep, "routed, plain TCP link, zero copy"),
                             ("routed-copy", copy_dep, "routed, plain TCP link, copy path"),
                             ("routed-tls", tls_dep, "routed, TLS link (copy path)"),
                             ("direct-link", direct_dep, "one router, two endpoints (in memory)")):
            if d is not None:
                paths[key], labels[key] = resolve(TPUT_TOPIC, d.lbmrd2), what
        res = throughput_paths(paths, source, args.runs, dep, "routed", {"splice": chains["splice"]})
        best = res["best"]
        for key in paths:
            print(f"    {labels[key]:56s} {mb / best[key]:8.1f} MB/s  ({best[key]:.3f} s)")
        ratio = best["splice"] / best["routed"]
        verdict = "meets" if ratio >= TARGET_RATIO else "BELOW"
        print(f"    ratio routed (zero copy) / splice relay  {ratio:6.3f}x  ({verdict} the {TARGET_RATIO}x target)")
        print(f"    ratio routed (zero copy) / direct        {best['direct'] / best['routed']:6.3f}x")
        print(f"    ratio routed (copy path) / splice relay  {best['splice'] / best['routed-copy']:6.3f}x")
        if "routed-tls" in best:
            print(f"    ratio routed (TLS link) / splice relay   {best['splice'] / best['routed-tls']:6.3f}x  "
                  f"(/ direct {best['direct'] / best['routed-tls']:.3f}x)")
        else:
            print("    TLS link: not measured (--no-tls, or openssl missing)")
        print(f"    ratio copy relay / splice relay          {best['splice'] / best['copy']:6.3f}x")
        print(f"    ratio one router, two endpoints / splice relay  {best['splice'] / best['direct-link']:6.3f}x "
              f"(/ routed pair, zero copy {best['routed'] / best['direct-link']:.3f}x)")
        print_cpu(res["cpu"])
        print_cpu_per_gb(res["cpu_per_gb"], res["ends_per_gb"])
        if not args.no_inprocess:
            inproc = InProcess()
            try:
                inproc.start()
                ires = throughput(inproc, source, args.runs)
            finally:
                inproc.stop()
            print_throughput("routers and lbmrds in one trio loop in this process (as in the e2e test)",
                             ires, mb)
        if not args.no_ru:
            rates = [float(x) for x in args.ru_rates.split(",") if x]
            print("\n2. LBT-RU datagrams (receiver in TRD2 -> proxy of router B -> peer link -> router A -> "
                  "source in TRD1, zero-copy deployment), every datagram verified")
            print_lbtru(lbtru_throughput(dep, args.ru_count, rates), args.ru_count)

        print(f"\n3. Topic resolution convergence (separate processes; {args.topics} new topics per order, "
              f"the two applications start {GAP_S * 1000:.0f} ms apart)")
        conv = convergence(dep, args.topics, source.port)
        worst = 0.0
        for order, vals in conv.items():
            ok = [v for v in vals if v is not None]
            since = "source's first TIR" if order == "receiver first" else "receiver's first TQR"
            if ok:
                med, mx = statistics.median(ok), max(ok)
                worst = max(worst, mx if len(ok) == len(vals) else float("inf"))
                print(f"  {order:14s} (from the {since}): median {1000 * med:6.1f} ms, max {1000 * mx:6.1f} ms"
                      f"  [{' '.join(_ms(v) for v in vals)}]")
            else:
                worst = float("inf")
                print(f"  {order:14s}: no convergence within {CONVERGE_TIMEOUT_S:g} s")
        verdict = "meets" if worst < TARGET_CONVERGENCE_MS / 1000 else "MISSES"
        print(f"  worst case {_ms(worst) if worst != float('inf') else 'timeout'} ms: {verdict} "
              f"the < {TARGET_CONVERGENCE_MS:g} ms target")

        if ratio < TARGET_RATIO and args.profile != "none":
            pyspy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
            use = args.profile
            if use == "auto":
                use = "py-spy" if pyspy else "cprofile"
            print(f"\n4. Profile of routed transfers ({use}, {PROFILE_S} s; routed/splice {ratio:.3f}x < "
                  f"{TARGET_RATIO}x)")
            if use == "py-spy":
                if not pyspy:
                    print("  py-spy not found (pip install py-spy into the virtualenv)")
                else:
                    outs = pyspy_profile(dep, source, pyspy, tmp)
                    for r in ("a", "b"):
                        role = "far side: source socket -> peer link" if r == "a" else \
                            "near side: peer link -> proxy socket"
                        print(f"    router {r.upper()} ({role})")
                        report_pyspy(outs[r], args.top)
            else:
                dep.stop()
                prof = Processes(tmp, cprofile=True)
                stack.callback(prof.stop)
                prof.start()
                cprofile_profile(prof, source)
                prof.stop()
                for r in ("a", "b"):
                    print(f"    router {r.upper()}")
                    if prof.profiles[r].exists():
                        report_cprofile(prof.profiles[r], args.top)
                    else:
                        print("      (no profile written)")
        if not args.no_fanout:
            run_fanout(tmp, stack, args)
        if not args.no_requests:
            print_requests(request_rows(tmp, stack, args), args)
        if not args.no_latejoin:
            run_latejoin(args.lj_rounds)
    signal.alarm(0)
    print(f"\ntotal {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
