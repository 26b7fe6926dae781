"""Multi-hop routing benchmark: convergence over a chain of routers, reroute
after a link cut, and many topics across a chain, each against a baseline
measured in the same run.

    python bench/routing.py [--hops 3] [--topics 10000] [--convergence-topics 10]
                            [--pair-topics 1000] [--pair-sessions 1000] [--pair-delay 0]
                            [--pair-rounds 3] [--skip PARTS]

Everything runs on loopback (127.0.d.1 for TRD d, peer links on 127.0.0.1) and
stops by itself. lbmrds (``lbmrd.cli``) and routers (``router.cli`` with
generated configuration files) are separate processes; the source and
receiver contexts are UDP sockets of this process.

1. Convergence. A chain of --hops + 1 routers, one TRD each. For each of
   --convergence-topics new topics a receiver context in the last TRD queries
   the topic (a TQR every 50 ms); INTEREST_WAIT_S later a source context in
   the first TRD sends its first TIR (and one every 500 ms). Convergence = the
   receiver's first proxy TIR (the last router's relay address) minus the
   source's first TIR. Baseline: the same source and receiver both in the
   first TRD (one lbmrd, no router). Target: under 50 ms over three hops.

2. Reroute. A loop of three routers in one trio loop of this process (as
   tests/router/helpers.py's start_loop sets it up): the cheap path r3-r2-r1 and the
   dear link r3-r1; the r1-r2 link is cut (a forwarder in between closes) and
   the time until the receiver in TRD3 resolves the source of TRD1 at a new
   proxy is measured. Target: within the route timeout + 1 s.

3. Many topics. A chain of three routers; a source context in TRD1 advertises
   --topics topics (TIRs packed into datagrams of at most 8 KiB, all of them
   every second), a receiver context in TRD3 queries every topic not yet
   resolved (every second). Time until every topic is resolved at the last
   router's proxy, against the same two contexts in one TRD; the routers' RSS
   (VmRSS of each process) at the end. The topics come from a thousand
   transport sessions (TCP ports) of the source context, as UM puts many
   topics on one session; each router on the path runs a proxy (a listener)
   per session, bounded by ``<relay max-proxies>``, the relay port range and a
   quarter of its open-files limit (the routers are started with a hard limit
   of 65536 where the host allows raising it; otherwise the inherited one),
   and at most 100,000 topics per link.

4. One context across a pair. Two routers (TRD1, TRD2); a UM-like source
   context (:class:`lbmr_tools.sim.context.Context`: UM's advertisement
   timing, answers to queries) in TRD1 with --pair-topics topics on
   --pair-sessions TCP sessions (1000: a proxy each; 1: UM's default of one
   TCP session per context), and one receiver context in TRD2 with a
   receiver for each (UM's query timing: 20 ms doubling to 200 ms, then
   every second), created --pair-delay seconds after the sources (default 0:
   at the same instant). Each context is a process of its own (forked from
   this one) whose timers run only when due. Time to resolve = a receiver's
   first TIR of router B's proxy minus its creation; p50 and max, over
   --pair-rounds rounds (a new deployment each), against the same two
   contexts in one TRD (no router) measured in the same run, round by round.
   Target: p50 under 1 s.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lbmr_proto as L  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PY = [sys.executable, "-c"]
LBMRD = "import sys; from lbmrd.cli import main; sys.exit(main(sys.argv[1:]))"
ROUTER = "import sys; from router.cli import main; sys.exit(main(sys.argv[1:]))"
INTEREST_WAIT_S = 1.5
TARGET_CONVERGENCE_MS = 50.0
HARD_LIMIT_S = 600


def free_port(ip: str = "127.0.0.1", kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def trd_ip(d: int) -> str:
    return f"127.0.{d}.1"


class Deployment:
    """lbmrds and routers as processes; ``chain(n)`` builds routers r1..rn, one TRD each."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen] = {}
        self.lbmrd: dict[int, tuple[str, int]] = {}

    def start_lbmrd(self, d: int) -> tuple[str, int]:
        ip = trd_ip(d)
        port = free_port(ip, socket.SOCK_DGRAM)
        self.procs[f"lbmrd{d}"] = subprocess.Popen(
            PY + [LBMRD, "-i", ip, "-p", str(port), "--stats-interval", "0"], cwd=ROOT,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.lbmrd[d] = (ip, port)
        return ip, port

    def chain(self, n: int, *, max_topics: int = 1000, route_info: tuple[int, int] = (500, 2000)) -> None:
        """``route_info``: (propagation interval, timeout), milliseconds."""
        for d in range(1, n + 1):
            self.start_lbmrd(d)
        ports = {(a, a + 1): free_port() for a in range(1, n)}
        self.metrics = {d: free_port() for d in range(1, n + 1)}
        for d in range(1, n + 1):
            peers = []
            if d > 1:  # connects to the router before it
                peers.append(_peer(f"{d}-{d - 1}", f"<initiator><address>127.0.0.1</address>"
                                   f"<port>{ports[(d - 1, d)]}</port></initiator>"))
            if d < n:
                peers.append(_peer(f"{d}-{d + 1}", f"<acceptor><listen-port>{ports[(d, d + 1)]}"
                                   "</listen-port></acceptor>"))
            ip, port = self.lbmrd[d]
            relay = 20000  # a proxy a topic: ports 20000 .. 20000 + max_topics on each TRD's address
            xml = f"""<?xml version="1.0"?>
<lbmr-router version="1.0">
  <daemon><name>r{d}</name><metrics>127.0.0.1:{self.metrics[d]}</metrics><stats-interval>0</stats-interval>
    <route-info propagation-interval="{route_info[0]}" timeout="{route_info[1]}"/></daemon>
  <portals>
    <endpoint><name>T{d}</name><domain-id>{d}</domain-id>
      <topic-resolution><interface>{ip}</interface><lbmrd address="{ip}" port="{port}"/>
        <port-range low="14402" high="14420"/></topic-resolution>
      <relay interface="{ip}" port-low="{relay}" port-high="{min(relay + max_topics, 32000)}"
             max-proxies="{max_topics}"/>
      <remote-topic max-topics="{max_topics}"/>
    </endpoint>
{"".join(peers)}  </portals>
</lbmr-router>
"""
            path = self.tmp / f"r{d}.xml"
            path.write_text(xml)
            self.procs[f"r{d}"] = subprocess.Popen(PY + [ROUTER, str(path)], cwd=ROOT, preexec_fn=_more_files,
                                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                   stderr=open(self.tmp / f"r{d}.log", "w"))

    def wait_converged(self, n: int, limit_s: float = 60.0) -> float:
        """Seconds until every router's /status has a route to every domain."""
        import json
        import urllib.request

        t0 = time.monotonic()
        while time.monotonic() - t0 < limit_s:
            try:
                done = 0
                for d in range(1, n + 1):
                    with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics[d]}/status", timeout=2) as r:
                        routes = json.load(r)["topology"]["routes"]
                    done += len(routes) == n
                if done == n:
                    return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"routes did not converge in {limit_s:.0f} s")

    def rss_mb(self, key: str) -> float:
        with open(f"/proc/{self.procs[key].pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        for p in self.procs.values():
            p.terminate()
        for p in self.procs.values():
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


def _more_files() -> None:
    """In a router process before exec: room for a descriptor per proxy and
    per relayed session of many topics (raising the hard limit needs root;
    without it the router raises its soft limit to the hard one itself)."""
    import resource

    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (65536, 65536))
    except (ValueError, OSError):
        pass


def _peer(name: str, link: str) -> str:
    return f"    <peer><name>{name}</name><single-tcp>{link}</single-tcp></peer>\n"


def ctx(ip: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((ip, 0))
    s.setblocking(False)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    return s


def tirs_of(data: bytes) -> list:
    try:
        return L.decode(data).tirs
    except L.LBMRDecodeError:
        return []


def tir_packet(topic: str, ip: str, port: int) -> bytes:
    return L.encode(L.Packet(0, 1, tirs=[L.TIR(topic, L.TcpTransport(ip, port), 60, 1)]))


# --------------------------------------------------------------------------- 1. convergence

def convergence_once(topic: str, src_trd: tuple, rcv_trd: tuple, src_ip: str, rcv_ip: str,
                     expect_ip: str) -> float | None:
    """Milliseconds from the source's first TIR to the receiver's first TIR at ``expect_ip``."""
    src, rcv = ctx(src_ip), ctx(rcv_ip)
    tqr = L.encode(L.Packet(0, 1, tqrs=[L.TQR(topic)]))
    tir = tir_packet(topic, src_ip, 40000)
    try:
        end = time.monotonic() + INTEREST_WAIT_S
        next_q = 0.0
        while time.monotonic() < end:  # the receiver asks first: interest spreads
            if time.monotonic() >= next_q:
                rcv.sendto(tqr, rcv_trd)
                next_q = time.monotonic() + 0.05
            _drain(rcv)
            time.sleep(0.005)
        src.sendto(tir, src_trd)
        t0 = time.perf_counter()
        next_tir, next_q = t0 + 0.5, t0 + 0.05
        deadline = t0 + 10
        while time.perf_counter() < deadline:
            for data in received(rcv, [src], 0.002):
                if any(t.topic == topic and t.transport.ip == expect_ip for t in tirs_of(data)):
                    return (time.perf_counter() - t0) * 1000
            now = time.perf_counter()
            if now >= next_q:
                rcv.sendto(tqr, rcv_trd)
                next_q = now + 0.05
            if now >= next_tir:
                src.sendto(tir, src_trd)
                next_tir = now + 0.5
        return None
    finally:
        src.close()
        rcv.close()


def received(rcv: socket.socket, others: list[socket.socket], timeout: float):
    """The datagrams ``rcv`` has (waiting at most ``timeout`` seconds for the
    first); what the ``others`` got meanwhile is read and dropped."""
    r, _, _ = select.select([rcv, *others], [], [], timeout)
    for s in r:
        while True:
            try:
                data, _ = s.recvfrom(65536)
            except BlockingIOError:
                break
            if s is rcv:
                yield data


def _drain(s: socket.socket) -> None:
    while True:
        try:
            s.recvfrom(65536)
        except BlockingIOError:
            return


def bench_convergence(tmp: Path, hops: int, n: int) -> None:
    dep = Deployment(tmp / "conv")
    (tmp / "conv").mkdir()
    try:
        dep.chain(hops + 1)
        last = hops + 1
        dep.wait_converged(last)  # routers up, links connected, route info exchanged
        routed, direct = [], []
        for i in range(n):
            ms = convergence_once(f"conv.{i}", dep.lbmrd[1], dep.lbmrd[last], "127.0.1.5",
                                  f"127.0.{last}.9", trd_ip(last))
            routed.append(ms)
            ms = convergence_once(f"direct.{i}", dep.lbmrd[1], dep.lbmrd[1], "127.0.1.5", "127.0.1.9",
                                  "127.0.1.5")
            direct.append(ms)
    finally:
        dep.stop()
    ok = [x for x in routed if x is not None]
    dk = [x for x in direct if x is not None]
    print(f"1. Convergence over {hops} hops ({hops + 1} routers in a chain), receiver first, "
          f"{n} topics")
    if not ok:
        print("    no topic converged: FAILED")
        return
    med, mx = statistics.median(ok), max(ok)
    dmed = statistics.median(dk) if dk else float("nan")
    print(f"    routed: median {med:.1f} ms, max {mx:.1f} ms, {len(ok)}/{n} converged")
    print(f"    direct (one TRD, no router): median {dmed:.2f} ms")
    print(f"    ratio routed/direct {med / dmed:.1f}x; target < {TARGET_CONVERGENCE_MS:.0f} ms: "
          f"{'met' if mx < TARGET_CONVERGENCE_MS and len(ok) == n else 'NOT met'}")


# --------------------------------------------------------------------------- 2. reroute

def bench_reroute() -> None:
    import trio

    from tests.router.helpers import (
        ROUTE_INFO,
        advertise_forever,
        resolve,
        start_loop,
        tcp_source,
        udp,
    )

    async def main() -> float:
        async with trio.open_nursery() as n:
            _, trds, fwd = await start_loop(n)
            sip, sport = await tcp_source(n, "127.0.1.5", 1000)
            n.start_soon(advertise_forever, udp("127.0.1.5"), trds[1], sip, sport, "loop.tcp")
            rcv = udp("127.0.3.9")
            old = await resolve(rcv, trds[3], topic="loop.tcp")
            fwd.cut()
            t0 = trio.current_time()
            while True:
                t = await resolve(rcv, trds[3], topic="loop.tcp")
                if (t.transport.ip, t.transport.port) != (old.transport.ip, old.transport.port):
                    break
                await trio.sleep(0.01)
            took = trio.current_time() - t0
            n.cancel_scope.cancel()
            return took

    took = trio.run(main)
    limit = ROUTE_INFO.timeout_ms / 1000 + 1
    print("2. Reroute: loop of three routers, cheapest link cut")
    print(f"    new proxy resolved {took * 1000:.0f} ms after the cut; target within route timeout + 1 s "
          f"= {limit:.1f} s: {'met' if took <= limit else 'NOT met'} (ratio {took / limit:.2f} of the limit)")


# --------------------------------------------------------------------------- 3. many topics

def resolve_all(topics: list[str], src_trd, rcv_trd, src_ip, rcv_ip, expect_ip, limit_s=60.0) -> float | None:
    src, rcv = ctx(src_ip), ctx(rcv_ip)
    # a thousand transport sessions (ports), each with its topics at indexes 1, 2, ...
    tirs = [L.TIR(t, L.TcpTransport(src_ip, 40000 + i % 1000), 60, i // 1000 + 1) for i, t in enumerate(topics)]
    tir_dgrams = [L.encode(L.Packet(0, 1, tirs=tirs[i:i + 100])) for i in range(0, len(tirs), 100)]
    left = set(topics)
    t0 = time.perf_counter()
    next_round = t0
    times = []  # seconds from the start at which each topic resolved
    try:
        while left and time.perf_counter() - t0 < limit_s:
            now = time.perf_counter()
            if now >= next_round:
                for d in tir_dgrams:
                    src.sendto(d, src_trd)
                ask = sorted(left)[:4000]
                for i in range(0, len(ask), 200):
                    rcv.sendto(L.encode(L.Packet(0, 1, tqrs=[L.TQR(t) for t in ask[i:i + 200]])), rcv_trd)
                next_round = now + 1.0
            for data in received(rcv, [src], 0.01):
                for t in tirs_of(data):
                    if t.transport.ip == expect_ip and t.topic in left:
                        left.discard(t.topic)
                        times.append(time.perf_counter() - t0)
        if left:
            print(f"    ({len(topics) - len(left)} of {len(topics)} resolved after {limit_s:.0f} s)")
        if times:
            q = statistics.quantiles(times, n=10) if len(times) > 1 else times * 9
            print(f"    resolved: first {times[0]:.2f} s, 10% {q[0]:.2f} s, half {q[4]:.2f} s, "
                  f"90% {q[8]:.2f} s, last {times[-1]:.2f} s")
        return None if left else time.perf_counter() - t0
    finally:
        src.close()
        rcv.close()


def bench_many(tmp: Path, n_topics: int) -> None:
    (tmp / "many").mkdir()
    dep = Deployment(tmp / "many")
    topics = [f"many.{i:06d}" for i in range(n_topics)]
    try:
        dep.chain(3, max_topics=n_topics + 100, route_info=(1000, 4000))  # the DRO's defaults
        dep.wait_converged(3)
        direct = resolve_all([f"d.{t}" for t in topics], dep.lbmrd[1], dep.lbmrd[1], "127.0.1.5", "127.0.1.9",
                             "127.0.1.5")
        routed = resolve_all(topics, dep.lbmrd[1], dep.lbmrd[3], "127.0.1.5", "127.0.3.9", trd_ip(3))
        rss = {r: dep.rss_mb(r) for r in ("r1", "r2", "r3")}
    finally:
        dep.stop()
    print(f"3. {n_topics} topics across a chain of three routers (TRD1 -> TRD3)")
    def said(took):
        return f"all resolved in {took:.2f} s" if took else "NOT all resolved"

    print(f"    direct (one TRD): {said(direct)}")
    print(f"    routed: {said(routed)}"
          + (f"; ratio routed/direct {routed / direct:.1f}x" if routed and direct else ""))
    print("    router RSS at the end: " + ", ".join(f"{r} {mb:.0f} MB" for r, mb in rss.items()))


# --------------------------------------------------------------------------- 4. one context, a pair

def play_context(c, sock: socket.socket, limit_s: float) -> None:
    """Play sim context ``c`` on ``sock`` for ``limit_s`` seconds, or until
    each of its receivers (if it has any) has resolved. Its timers run when
    due only (a tick and a deadline cost the context's size)."""
    clock = time.monotonic
    end = clock() + limit_s
    due = clock()
    receivers = len(c.receivers)
    while clock() < end and not (receivers and c.stats["resolved"] >= receivers):
        now = clock()
        if now >= due:
            for d in c.tick(now):
                sock.sendto(d, d.dest)
            due = c.next_deadline()
        ready, _, _ = select.select([sock], [], [], min(max(min(due, end) - clock(), 0.0), 0.05))
        while ready:
            try:
                data, src = sock.recvfrom(65536)
            except BlockingIOError:
                break
            for d in c.receive(data, clock(), src[:2]):
                sock.sendto(d, d.dest)


def _source_context(topics: list[str], sessions: int, port: int, trd, limit_s: float, ready) -> None:
    """In a process of its own: a UM-like source context of ``topics`` on
    ``sessions`` TCP sessions (ports from ``port``) in ``trd``, for ``limit_s`` seconds."""
    import random

    from lbmr_tools.sim.context import Context

    sock = ctx("127.0.1.5")
    src = Context([trd], start=time.monotonic(), rng=random.Random(1), local_ip="127.0.1.5")
    for i, topic in enumerate(topics):
        src.add_source(topic, L.TcpTransport("127.0.1.5", port + i % sessions), topic_index=i // sessions + 1)
    ready.set()
    play_context(src, sock, limit_s)


def resolve_one_context(topics: list[str], src_trd, rcv_trd, rcv_ip: str, expect_ip: str, delay: float,
                        sessions: int, port: int) -> list[float]:
    """Seconds each receiver of one context took to resolve (at ``expect_ip``)
    the sources of another (``topics`` on ``sessions`` TCP sessions, ports
    from ``port``), sorted. Each context runs in a process of its own (as two
    UM applications do)."""
    import multiprocessing
    import random

    from lbmr_tools.sim.context import Context

    mp = multiprocessing.get_context("fork")
    ready = mp.Event()
    source = mp.Process(target=_source_context, args=(topics, sessions, port, src_trd, delay + 40.0, ready),
                        daemon=True)
    source.start()
    sock = ctx(rcv_ip)
    try:
        if not ready.wait(30):
            raise RuntimeError("the source context did not start")
        time.sleep(delay)
        t1 = time.monotonic()
        rcv = Context([rcv_trd], start=t1, rng=random.Random(2), local_ip=rcv_ip)
        for topic in topics:
            rcv.add_receiver(topic, now=t1)
        play_context(rcv, sock, 30.0)
        return sorted(r.time_to_resolve for r in rcv.receivers
                      if r.resolved and getattr(r.transport, "ip", None) == expect_ip)
    finally:
        sock.close()
        source.terminate()
        source.join(5)


def bench_pair(tmp: Path, n: int, delay: float, sessions: int, rounds: int) -> None:
    p50 = {"direct": [], "routed": []}
    done = {"direct": [], "routed": []}
    print(f"4. {n} topics on {sessions} TCP session(s) of one source context in TRD1, one receiver "
          f"context (receivers {delay:g} s after the sources), {rounds} round(s)")
    for r in range(rounds):  # a new deployment each round: no round meets the end of another's sources
        (tmp / f"pair{r}").mkdir()
        dep = Deployment(tmp / f"pair{r}")
        try:
            dep.chain(2, max_topics=n + 100)
            try:
                dep.wait_converged(2)
            except RuntimeError as e:  # e.g. a port taken meanwhile by another program: the next round
                print(f"    round {r + 1}: {e} (router logs: " + ", ".join(
                    (tmp / f"pair{r}" / f"r{d}.log").read_text()[-200:] for d in (1, 2)) + ")")
                continue
            got = {"direct": resolve_one_context([f"d.{i:05d}" for i in range(n)], dep.lbmrd[1], dep.lbmrd[1],
                                                 "127.0.1.9", "127.0.1.5", delay, sessions, 30000),
                   "routed": resolve_one_context([f"r.{i:05d}" for i in range(n)], dep.lbmrd[1], dep.lbmrd[2],
                                                 "127.0.2.9", trd_ip(2), delay, sessions, 40000)}
        finally:
            dep.stop()
        line = []
        for k, times in got.items():
            done[k].append(len(times))
            if times:
                p50[k].append(times[len(times) // 2])
                line.append(f"{k} {len(times)}/{n} p50 {p50[k][-1]:.3f} s max {times[-1]:.3f} s")
            else:
                line.append(f"{k} none resolved")
        print(f"    round {r + 1}: " + "; ".join(line) + f" (load {os.getloadavg()[0]:.1f})")
    if p50["direct"] and p50["routed"]:
        d, rt = statistics.median(p50["direct"]), statistics.median(p50["routed"])
        met = rt < 1.0 and min(done["routed"]) == n
        print(f"    median p50: direct (one TRD) {d:.3f} s, routed (a pair) {rt:.3f} s, "
              f"routed/direct {rt / d:.1f}x; target p50 under 1 s: {'met' if met else 'NOT met'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hops", type=int, default=3)
    ap.add_argument("--convergence-topics", type=int, default=10)
    ap.add_argument("--topics", type=int, default=10_000)
    ap.add_argument("--pair-topics", type=int, default=1000)
    ap.add_argument("--pair-delay", type=float, default=0.0)
    ap.add_argument("--pair-sessions", type=int, default=1000)
    ap.add_argument("--pair-rounds", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: convergence,reroute,many,pair")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    import signal

    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(SystemExit("hard time limit reached")))
    signal.alarm(HARD_LIMIT_S)
    print(f"lbmr-router routing benchmark, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        if os.environ.get("KEEP_TMP"):  # keep the routers' logs and configs for a look
            tmp = tempfile.mkdtemp()
            print(f"    (work directory {tmp})")
        if "convergence" not in skip:
            bench_convergence(Path(tmp), args.hops, args.convergence_topics)
        if "reroute" not in skip:
            bench_reroute()
        if "many" not in skip:
            bench_many(Path(tmp), args.topics)
        if "pair" not in skip:
            bench_pair(Path(tmp), args.pair_topics, args.pair_delay, args.pair_sessions, args.pair_rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
