"""Router benchmark: TCP relay throughput through two routers (zero-copy and
copy data paths, plain and TLS peer links) against a minimal splice relay and
direct loopback, LBT-RU datagram throughput and loss, and topic resolution
convergence across the routers.

    python bench/router.py [--mbytes 200] [--runs 3] [--topics 8] [--ru-count 30000]
                           [--ru-rates 10000,30000] [--no-tls] [--no-ru]
                           [--profile auto|py-spy|cprofile|none] [--no-inprocess]
                           [--fanout-n 1,10,100] [--fanout-window 3] [--no-fanout] [--only-fanout]

Everything runs on loopback (127.0.0.0/8) and stops by itself (a hard limit
of HARD_LIMIT_S seconds ends a stuck run).

Deployment (as tests/test_router_cli.py runs it): two lbmrds
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
   ``router.daemon.Router`` as tests/test_router_e2e.py sets them up): the
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

5. Fan-out (bench/fanout.py; --fanout-n, --fanout-window, --no-fanout,
   --only-fanout): two more deployments, the shipped configs as they are
   (fan-out on) and with fanout="off" (the per-connection relay: before),
   each peer link through a counting forwarder process; one
   live LBMC source in TRD1 and N receivers in TRD2 (this process, one epoll
   loop) against a minimal fan-out process (reads one socket, writes N) in
   the same run: link bytes / one receiver's (goal TARGET_LINK_RATIO), and
   delivered bytes per second of all receivers with the routed source
   paced at FANOUT_LOADS (100 % and 80 %) of what the minimal fan-out
   delivered to each receiver (goal TARGET_FANOUT_RATIO), with the messages
   each router dropped and the CPU seconds per GB delivered of router A,
   router B and the forwarder, and of the minimal fan-out process. With
   them, the minimal chain: the routed path's processes built of minimal
   ones (a copy relay, the counting forwarder, the minimal fan-out: no
   framing, queues or drops), what any router in that place could reach on
   this host, and the routed rate as a share of it.

Over 600 lines because it is one self-contained script (deployment,
baselines, load, report) meant to be read and run on its own.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import os
import pstats
import queue
import random
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import lbmr_proto as L  # noqa: E402
from bench import fanout as F  # noqa: E402

TRD1, TRD2 = "127.0.1.1", "127.0.2.1"  # lbmrd, router TR socket and relay address of each TRD
SRC_IP, RCV_IP = "127.0.1.5", "127.0.2.9"  # the applications
CHUNK = 1 << 20  # bytes per sendall / recv_into
PERIOD = CHUNK + 4099  # pattern period: no read or frame size divides it
PATTERN = random.Random(7).randbytes(PERIOD) * 2
PROBE = 16
TARGET_RATIO = 0.8  # routed (zero copy) / minimal splice relay
RU_SIZE = 1400  # LBT-RU datagram bytes
RU_TOPIC = "bench.router.ru"
TARGET_CONVERGENCE_MS = 50.0
GAP_S = 0.2  # between the first and the second application in a convergence measurement
CONVERGE_TIMEOUT_S = 5.0
IO_TIMEOUT_S = 30.0
HARD_LIMIT_S = 420
PROFILE_S = 3  # seconds (whole) of routed transfers sampled by py-spy
RELAY_PORTS = 64
TPUT_TOPIC = "bench.router.tput"
PY = [sys.executable, "-c"]
ROUTER_CODE = "import sys; from router.cli import main; sys.exit(main(sys.argv[1:]))"
# router.cli under cProfile, off until SIGUSR2 (which toggles it); the stats go to argv[1] at exit
ROUTER_PROFILED = r"""
import cProfile, signal, sys
from router.cli import main
prof, on = cProfile.Profile(), []
def toggle(*_):
    if on:
        prof.disable()
        on.clear()
    else:
        on.append(1)
        prof.enable()
signal.signal(signal.SIGUSR2, toggle)
rc = main(sys.argv[2:])
prof.dump_stats(sys.argv[1])
sys.exit(rc)
"""
LBMRD_CODE = "import sys; from lbmrd.cli import main; sys.exit(main(sys.argv[1:]))"
CLK_TCK = os.sysconf("SC_CLK_TCK")
# A minimal one-way TCP relay (reference ceiling): accepts on argv[1], connects to argv[2]:argv[3]
# for each connection and moves bytes upstream -> downstream with recv_into/sendall of CHUNK
# ("copy") or zero-copy os.splice through a pipe ("splice"). Prints its port.
RELAY_CODE = r"""
import fcntl, os, socket, sys
lip, uip, uport, mode, chunk = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
ls = socket.create_server((lip, 0))
print(ls.getsockname()[1], flush=True)
buf = bytearray(chunk)
mv = memoryview(buf)
while True:
    down, _ = ls.accept()
    with down, socket.create_connection((uip, uport)) as up:
        if mode == "splice":
            r, w = os.pipe()
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, chunk)
            while n := os.splice(up.fileno(), w, chunk):
                while n:
                    n -= os.splice(r, down.fileno(), n)
            os.close(r)
            os.close(w)
        else:
            while n := up.recv_into(mv):
                down.sendall(mv[:n])
"""


# ------------------------------------------------------------------ ports


def free_port(ip: str, kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def free_range(ip: str, n: int) -> int:
    """The first port of n consecutive TCP ports bindable on ip."""
    rng = random.Random()
    for _ in range(200):
        low = rng.randrange(20000, 60000 - n)
        socks = []
        try:
            for p in range(low, low + n):
                s = socket.socket()
                socks.append(s)
                s.bind((ip, p))
            return low
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports on {ip}")


# ------------------------------------------------------------ LBMR helpers


def tir_packet(topic: str, ip: str, port: int, index: int) -> bytes:
    return L.encode(L.Packet(0, 1, tirs=[L.TIR(topic, L.TcpTransport(ip, port), 60, index)]))


def tqr_packet(topic: str) -> bytes:
    return L.encode(L.Packet(0, 1, tqrs=[L.TQR(topic)]))


def decode(data: bytes):
    try:
        return L.decode(data)
    except Exception:  # noqa: BLE001 - lbmrd keepalives and anything else not LBMR
        return None


def is_proxy_tir(t, topic: str) -> bool:
    final = any(isinstance(o, L.CostOption) and o.cost == -1 for o in t.options or ())
    return t.topic == topic and not final and getattr(t.transport, "ip", None) == TRD2


def udp(ip: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((ip, 0))
    return s


def resolve(topic: str, lbmrd2, timeout: float = 15.0) -> tuple[str, int]:
    """Query ``topic`` in TRD2 until router B's proxy TIR arrives; its (ip, port)."""
    deadline = time.monotonic() + timeout
    with udp(RCV_IP) as s:
        s.settimeout(0.05)
        tqr = tqr_packet(topic)
        while time.monotonic() < deadline:
            s.sendto(tqr, lbmrd2)
            with contextlib.suppress(TimeoutError):
                while True:
                    pkt = decode(s.recv(65535))
                    for t in pkt.tirs if pkt else ():
                        if is_proxy_tir(t, topic):
                            return t.transport.ip, t.transport.port
    raise TimeoutError(f"no proxy TIR for {topic} in TRD2 within {timeout:g} s")


class Advertiser:
    """A source context advertising one topic in TRD1 every 0.5 s (keeps the proxy alive)."""

    def __init__(self, topic: str, lbmrd1, src_port: int, index: int = 1, packet: bytes | None = None) -> None:
        self.sock = udp(SRC_IP)
        self.pkt = packet if packet is not None else tir_packet(topic, SRC_IP, src_port, index)
        self.lbmrd1 = lbmrd1
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError):
                self.sock.sendto(self.pkt, self.lbmrd1)
            self.stop.wait(0.5)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


# ------------------------------------------------------------- data plane


class DataSource:
    """The TCP source: every connection gets ``total`` bytes of PATTERN, then EOF."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.lsock = socket.create_server((SRC_IP, 0), backlog=16)
        self.lsock.settimeout(0.2)
        self.port = self.lsock.getsockname()[1]
        self.closed = False
        self.workers: list[threading.Thread] = []
        self.thread = threading.Thread(target=self._accept_loop, daemon=True)
        self.thread.start()

    def _accept_loop(self) -> None:
        while not self.closed:
            try:
                c, _ = self.lsock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(c,), daemon=True)
            self.workers.append(t)
            t.start()

    def _serve(self, c: socket.socket) -> None:
        mv = memoryview(PATTERN)
        with c:
            c.settimeout(IO_TIMEOUT_S)
            pos, total = 0, self.total
            try:
                while pos < total:
                    off = pos % PERIOD
                    n = min(CHUNK, total - pos)
                    c.sendall(mv[off:off + n])
                    pos += n
            except OSError:
                pass

    def close(self) -> None:
        self.closed = True
        self.thread.join(2)
        self.lsock.close()
        for t in self.workers:
            t.join(2)


def receive(addr, total: int) -> float:
    """Connect, read to EOF checking the data; the elapsed seconds."""
    buf = bytearray(CHUNK)
    mv = memoryview(buf)
    t0 = time.perf_counter()
    with socket.create_connection(addr, timeout=IO_TIMEOUT_S) as s:
        pos = 0
        while True:
            n = s.recv_into(mv)
            if not n:
                break
            off = pos % PERIOD
            if n >= PROBE and (buf[:PROBE] != PATTERN[off:off + PROBE]
                               or buf[n - PROBE:n] != PATTERN[off + n - PROBE:off + n]):
                raise RuntimeError(f"data mismatch in the read at byte {pos} from {addr}")
            pos += n
    elapsed = time.perf_counter() - t0
    if pos != total:
        raise RuntimeError(f"{addr}: got {pos} bytes, expected {total}")
    return elapsed


# ------------------------------------------------------------- deployments


def _cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` spent so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def _machine_busy() -> float:
    """CPU-seconds all CPUs spent busy since boot (/proc/stat; idle and iowait excluded)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / CLK_TCK


def cpu_snapshot(dep) -> dict[str, float]:
    """CPU-seconds so far: router processes (if separate), this process, the whole machine."""
    snap = dep.cpu()
    snap["self"] = time.process_time()
    snap["machine"] = _machine_busy()
    return snap


class Processes:
    """lbmrds and routers as separate processes (router.cli / lbmrd.cli)."""

    name = "processes"

    def __init__(self, tmp: Path, cprofile: bool = False, *, tls: dict[str, str] | None = None,
                 env: dict[str, str] | None = None, tag: str = "", fanout: bool = False,
                 link_hop=None) -> None:
        """``fanout``: TCP sessions fanned out (the default of the shipped configs) or
        relayed per connection (byte-pattern sources, zero copy); ``link_hop(port)``:
        the port router A dials instead of router B's listen ``port`` (a forwarder)."""
        self.fanout = fanout
        self.link_hop = link_hop
        self.tmp = tmp / tag if tag else tmp
        self.tmp.mkdir(exist_ok=True)
        self.cprofile = cprofile
        self.tls = tls
        self.env = env
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.profiles: dict[str, Path] = {}

    def _configs(self) -> dict[str, Path]:
        peer = free_port(TRD2)
        l1, l2 = free_port(TRD1, socket.SOCK_DGRAM), free_port(TRD2, socket.SOCK_DGRAM)
        self.lbmrd1, self.lbmrd2 = (TRD1, l1), (TRD2, l2)
        out = {}
        for name, ip, lbmrd_port, metrics_old, relay_old in (
                ("router-a.xml", TRD1, l1, "9390", 'port-low="24000" port-high="24999"'),
                ("router-b.xml", TRD2, l2, "9391", 'port-low="25000" port-high="25999"')):
            text = (ROOT / "configs" / name).read_text()
            metrics = free_port("127.0.0.1")
            tr = free_port(ip, socket.SOCK_DGRAM)
            relay = free_range(ip, RELAY_PORTS)
            if self.tls is not None:
                r = name[7]
                block = (f"<tls><certificate>{self.tls[r + '.pem']}</certificate>"
                         f"<certificate-key>{self.tls[r + '.key']}</certificate-key>"
                         f"<trusted-certificates>{self.tls['ca.pem']}</trusted-certificates></tls>")
                # <tls> comes last before <initiator>/<acceptor> (the DTD's order)
                anchor = "        <initiator" if "        <initiator" in text else "        <acceptor>"
                if text.count(anchor) != 1:
                    raise RuntimeError(f"configs/{name}: one {anchor!r} expected (the shipped file changed)")
                text = text.replace(anchor, block + anchor)
            fanout = "" if self.fanout else ' fanout="off"'
            for old, new in (("26123", str(peer)),
                             (f'{ip}" port="15380', f'{ip}" port="{lbmrd_port}'),
                             (metrics_old, str(metrics)),
                             ('low="14402" high="14406"', f'low="{tr}" high="{tr}"'),
                             (relay_old, f'port-low="{relay}" port-high="{relay + RELAY_PORTS - 1}"{fanout}')):
                if old not in text:
                    raise RuntimeError(f"configs/{name}: {old!r} not found (the shipped file changed)")
                text = text.replace(old, new)
            if self.link_hop is not None and name == "router-a.xml":
                text = text.replace(f"<port>{peer}</port>", f"<port>{self.link_hop(peer)}</port>")
            path = self.tmp / name
            path.write_text(text)
            out[name[7]] = path
            setattr(self, f"metrics_{name[7]}", metrics)
        return out

    def _spawn(self, key: str, argv: list[str]) -> None:
        env = None if self.env is None or key.startswith("lbmrd") else {**os.environ, **self.env}
        self.procs[key] = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, env=env,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    routers = ("b", "a")  # the router processes, in the order they start

    def start(self) -> None:
        """The lbmrds, then the routers (``_configs``' files); returns once router
        B's ``/status`` says its peer link is up (its only portal link)."""
        cfg = self._configs()
        for key, (ip, port) in (("lbmrd1", self.lbmrd1), ("lbmrd2", self.lbmrd2)):
            self.logs[key] = self.tmp / f"{key}.log"
            self._spawn(key, PY + [LBMRD_CODE, "-i", ip, "-p", str(port), "--stats-interval", "0",
                                   "-L", str(self.logs[key])])
        for r in self.routers:
            self.logs[r] = self.tmp / f"router-{r}.log"
            args = ["-L", str(self.logs[r]), str(cfg[r])]
            if self.cprofile:
                self.profiles[r] = self.tmp / f"router-{r}.prof"
                self._spawn(r, PY + [ROUTER_PROFILED, str(self.profiles[r])] + args)
            else:
                self._spawn(r, PY + [ROUTER_CODE] + args)
        deadline = time.monotonic() + 20
        while True:
            for k, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{k} exited with {p.returncode}: {self.log_tail(k)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_b}/status", timeout=1) as r:
                    if json.loads(r.read())["peer"]["state"] == "CONNECTED":
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the routers' link did not come up within 20 s")
            time.sleep(0.05)

    def log_tail(self, key: str) -> str:
        with contextlib.suppress(OSError):
            return self.logs[key].read_text()[-2000:]
        return ""

    def pid(self, key: str) -> int:
        return self.procs[key].pid

    def cpu(self) -> dict[str, float]:
        return {k: _cpu_seconds(self.pid(k)) for k in self.routers}

    def stop(self) -> None:
        for key in (*self.routers, "lbmrd1", "lbmrd2"):
            p = self.procs.get(key)
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class DirectLink(Processes):
    """One router joining TRD1 and TRD2 directly (configs/router-direct.xml, ports
    moved, the per-connection relay: byte-pattern sources) and its two lbmrds, as
    separate processes: the sessions between its endpoints cross in memory."""

    name = "direct link"
    routers = ("d",)

    def _configs(self) -> dict[str, Path]:
        l1, l2 = free_port(TRD1, socket.SOCK_DGRAM), free_port(TRD2, socket.SOCK_DGRAM)
        self.lbmrd1, self.lbmrd2 = (TRD1, l1), (TRD2, l2)
        text = (ROOT / "configs" / "router-direct.xml").read_text()
        self.metrics_b = free_port("127.0.0.1")
        edits = [("127.0.0.1:9392", f"127.0.0.1:{self.metrics_b}")]
        for ip, lbmrd_port, relay_old in ((TRD1, l1, 'port-low="24000" port-high="24999"'),
                                          (TRD2, l2, 'port-low="25000" port-high="25999"')):
            tr, relay = free_port(ip, socket.SOCK_DGRAM), free_range(ip, RELAY_PORTS)
            edits += [(f'{ip}" port="15380', f'{ip}" port="{lbmrd_port}'),
                      ('low="14402" high="14406"', f'low="{tr}" high="{tr}"'),
                      (relay_old, f'port-low="{relay}" port-high="{relay + RELAY_PORTS - 1}" fanout="off"')]
        for old, new in edits:
            if old not in text:
                raise RuntimeError(f"configs/router-direct.xml: {old!r} not found (the shipped file changed)")
            text = text.replace(old, new, 1)
        path = self.tmp / "router-direct.xml"
        path.write_text(text)
        return {"d": path}


class InProcess:
    """Both lbmrds and both routers in one trio loop in a thread of this process."""

    name = "in-process"

    def start(self) -> None:
        import trio

        self._trio = trio
        q: queue.Queue = queue.Queue()

        def runner() -> None:
            try:
                trio.run(self._main, q)
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                q.put(e)

        self.thread = threading.Thread(target=runner, daemon=True)
        self.thread.start()
        got = q.get(timeout=20)
        if isinstance(got, BaseException):
            raise RuntimeError(f"in-process routers failed: {got!r}")
        self.lbmrd1, self.lbmrd2 = got

    async def _main(self, q: queue.Queue) -> None:
        trio = self._trio
        from lbmrd.server import Daemon, Settings
        from router.config_model import acceptor_peer, initiator_peer, lbmrd_endpoint
        from router.daemon import Router

        self.token = trio.lowlevel.current_trio_token()
        self.done = trio.Event()
        async with trio.open_nursery() as n:
            d1 = await n.start(Daemon(Settings(bind_ip=TRD1, port=0, stats_interval=0)).run)
            d2 = await n.start(Daemon(Settings(bind_ip=TRD2, port=0, stats_interval=0)).run)
            rb = Router("routerB", lbmrd_endpoint("B-TRD2", 2, [d2], interface=TRD2, fanout=False),
                        acceptor_peer("B-to-A", 0, interface=TRD2))
            b = await n.start(rb.run)
            ra = Router("routerA", lbmrd_endpoint("A-TRD1", 1, [d1], interface=TRD1, fanout=False),
                        initiator_peer("A-to-B", TRD2, b["peer"][1], reconnect_interval_ms=500))
            await n.start(ra.run)
            with trio.fail_after(20):
                while not (rb.link is not None and rb.link.up.is_set()):
                    await trio.sleep(0.01)
            q.put((d1, d2))
            await self.done.wait()
            n.cancel_scope.cancel()

    def cpu(self) -> dict[str, float]:
        return {}

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._trio.from_thread.run_sync(self.done.set, trio_token=self.token)
        self.thread.join(10)


# ------------------------------------------------------------- measurements


def throughput(dep, source: DataSource, runs: int) -> dict:
    """Best-of-runs direct and routed transfer times on a started deployment."""
    adv = Advertiser(TPUT_TOPIC, dep.lbmrd1, source.port)
    try:
        proxy = resolve(TPUT_TOPIC, dep.lbmrd2)
        direct = (SRC_IP, source.port)
        best = {"direct": float("inf"), "routed": float("inf")}
        cpu_best: dict[str, float] = {}
        for i in range(runs):
            for kind in (("direct", "routed") if i % 2 == 0 else ("routed", "direct")):
                before = cpu_snapshot(dep)
                dt = receive(direct if kind == "direct" else proxy, source.total)
                after = cpu_snapshot(dep)
                if dt < best[kind]:
                    best[kind] = dt
                    if kind == "routed":
                        cpu_best = {k: (after[k] - before[k]) / dt for k in after}
        return {"best": best, "cpu": cpu_best, "proxy": proxy}
    finally:
        adv.close()


class RelayChain:
    """Two minimal one-way relay processes (RELAY_CODE, ``mode`` "splice" or "copy") in
    the routers' topology, started once: receiver -> relay on TRD2 -> relay on TRD1 ->
    source. ``addr``: where the receiver connects."""

    def __init__(self, source: DataSource, mode: str) -> None:
        self.procs: list[subprocess.Popen] = []
        upstream = (SRC_IP, source.port)
        try:
            for ip in (TRD1, TRD2):
                p = subprocess.Popen(PY + [RELAY_CODE, ip, upstream[0], str(upstream[1]), mode, str(CHUNK)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
                self.procs.append(p)
                upstream = (ip, int(p.stdout.readline()))
        except BaseException:
            self.stop()
            raise
        self.addr = upstream

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            p.stdout.close()
        self.procs = []


FANOUT_PACED_BPS = 2_000_000  # the paced source of the link-bytes ratio, bytes per second
FANOUT_MESSAGE = 8192  # payload bytes per LBMC message of the fan-out sources
FANOUT_WARMUP_S = 1.0
TARGET_LINK_RATIO = 1.05  # link bytes / one receiver's
TARGET_FANOUT_RATIO = 0.8  # delivered bytes per second, routed / minimal fan-out
# offered loads of the routed measurement, as shares of what the minimal fan-out delivered: a
# fan-out that drops instead of pacing its source loses at the edge of what its receivers take
FANOUT_LOADS = (1.0, 0.8)


def fanout_rows(tmp: Path, stack: contextlib.ExitStack, ns: list[int], window: float) -> list[dict]:
    """Section 5 (see bench/fanout.py): two deployments whose link crosses a
    counting forwarder, fan-out on (the default) and off (the per-connection
    relay, as before). Per N: the minimal fan-out's delivered bytes per second
    from a source as fast as it goes; per deployment the link ratio with a
    paced source, then the routed delivered bytes per second from a source
    paced at FANOUT_LOADS of what the minimal fan-out delivered to each
    receiver (a fan-out that drops instead of pacing its source cannot be fed
    an unpaced one; the per-connection relay paces it: 100 % only), with the
    messages dropped at each router meanwhile."""
    deps = {mode: _fanout_deployment(tmp, stack, mode) for mode in ("on", "off")}
    _, fast_port = deps["on"]["source"]("fast", 3, 0)
    rows = []
    for i, n in enumerate(ns):
        base, base_cpu = F.baseline((SRC_IP, fast_port), n, TRD2, RCV_IP, FANOUT_WARMUP_S, window, _cpu_seconds)
        chain, chain_cpu = F.minimal_chain((SRC_IP, fast_port), n, (RELAY_CODE, "copy", CHUNK), TRD2, RCV_IP,
                                           FANOUT_WARMUP_S, window, _cpu_seconds)
        for mode, d in deps.items():
            dep, fwd, source = d["dep"], d["fwd"], d["source"]
            counts, _, (l0, l1) = F.receive(d["paced"], n, RCV_IP, FANOUT_WARMUP_S, window, fwd.a_to_b)
            for k, load in enumerate(FANOUT_LOADS if mode == "on" else FANOUT_LOADS[:1]):
                offered, _ = source(f"offered{n}.{k}", 10 + 2 * i + k, load * base / n)
                before = _counters(dep.metrics_a), _counters(dep.metrics_b)
                got, secs, (c0, c1) = F.receive(offered, n, RCV_IP, FANOUT_WARMUP_S, window,
                                                functools.partial(_routed_cpu, dep, fwd))
                after = _counters(dep.metrics_a), _counters(dep.metrics_b)
                gb = max(sum(got) / 1e9, 1e-9)
                rows.append({"n": n, "mode": mode, "load": load, "link": l1 - l0, "one": max(counts),
                             "routed": sum(got) / secs, "baseline": base, "baseline_cpu": base_cpu,
                             "chain": chain, "chain_cpu": chain_cpu,
                             "cpu": {k: (c1[k] - c0[k]) / gb for k in c0},
                             "dropped_a": _delta(before[0], after[0], "fanout_link_dropped_messages"),
                             "dropped_b": _delta(before[1], after[1], "fanout_dropped_messages")})
                time.sleep(3)  # the proxies' streams and the upstream connections close (lingers)
    return rows


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


def _routed_cpu(dep: Processes, fwd: F.CountingForwarder) -> dict[str, float]:
    """CPU seconds so far of the routers ("a", "b") and the forwarder ("fwd")."""
    return {**dep.cpu(), "fwd": _cpu_seconds(fwd.proc.pid)}


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
        print(f"      offered {r['load']:.0%}: {r['routed'] / 1e6:7.1f} MB/s delivered, ratio {ratio:5.3f} "
              f"({'meets' if ratio >= TARGET_FANOUT_RATIO else 'BELOW'} >= {TARGET_FANOUT_RATIO}), "
              f"{r['routed'] / r['chain']:5.3f} of the minimal chain; messages "
              f"dropped at router A {r['dropped_a']}, at router B {r['dropped_b']}")
        c = r["cpu"]
        print(f"        CPU s/GB delivered: router A {c['a']:.2f}, router B {c['b']:.2f}, forwarder "
              f"{c['fwd']:.2f} (minimal fan-out process {r['baseline_cpu']:.2f})")


def certificates(tmp: Path) -> dict[str, str] | None:
    """A throwaway CA and a certificate and key for each router (openssl, EC P-256):
    {"ca.pem", "a.pem", "a.key", "b.pem", "b.key"} -> path; None without openssl."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    d = tmp / "tls"
    d.mkdir(exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, cwd=d)

    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=bench-ca")
    for r in ("a", "b"):
        run("req", *ec, "-keyout", f"{r}.key", "-out", f"{r}.csr", "-subj", f"/CN=router-{r}")
        run("x509", "-req", "-in", f"{r}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{r}.pem", "-days", "2")
    return {k: str(d / k) for k in ("ca.pem", "a.pem", "a.key", "b.pem", "b.key")}


def throughput_paths(paths: dict[str, tuple[str, int]], source: DataSource, runs: int,
                     cpu_dep, cpu_path: str, relays: dict[str, RelayChain] | None = None) -> dict:
    """Best transfer time of each path (name -> address to connect to): every round
    measures each path once, the order rotating; the CPU use over the best ``cpu_path``
    transfer (``cpu_dep``'s routers); and, over all rounds, the user and system
    CPU-seconds per GB moved of the processes in the middle of each path: ``cpu_dep``'s
    routers for ``cpu_path``, the relay processes of ``relays[name]`` for those paths, and
    of this process (the source and the receiver) for every path."""
    names = list(paths)
    best = dict.fromkeys(names, float("inf"))
    cpu_best: dict[str, float] = {}
    relays = relays or {}
    middle = {cpu_path: [cpu_dep.pid(r) for r in ("a", "b")]} if hasattr(cpu_dep, "pid") else {}
    middle.update({name: [p.pid for p in chain.procs] for name, chain in relays.items()})
    spent = {name: [0.0, 0.0] for name in middle}
    ends = dict.fromkeys(names, 0.0)  # CPU-seconds of this process (source + receiver)
    for i in range(runs):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            pids = middle.get(name, [])
            t0 = [_cpu_user_sys(p) for p in pids]
            before = cpu_snapshot(cpu_dep)
            dt = receive(paths[name], source.total)
            after = cpu_snapshot(cpu_dep)
            ends[name] += after["self"] - before["self"]
            for p, (u0, s0) in zip(pids, t0, strict=True):
                u1, s1 = _cpu_user_sys(p)
                spent[name][0] += u1 - u0
                spent[name][1] += s1 - s0
            if dt < best[name]:
                best[name] = dt
                if name == cpu_path:
                    cpu_best = {c: (after[c] - before[c]) / dt for c in after}
    gb = runs * source.total / 1e9
    per_gb = {name: (u / gb, s_ / gb) for name, (u, s_) in spent.items()}
    return {"best": best, "cpu": cpu_best, "cpu_per_gb": per_gb,
            "ends_per_gb": {name: v / gb for name, v in ends.items()}}


def _cpu_user_sys(pid: int) -> tuple[float, float]:
    """CPU-seconds of a process so far: (user, system)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


# An LBT-RU-like source (lbmr_tools.sim.dataplane.RuDataSource) in a process of its own:
# argv ip, count, seed, rate, size; prints its port, serves every receiver that says HELLO.
RU_SOURCE_CODE = r"""
import sys, trio
from lbmr_tools.sim.dataplane import RuDataSource
ip, count, seed, rate, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
async def main():
    src = RuDataSource(ip, count=count, seed=seed, rate=rate, datagram_size=size, max_burst=64,
                       snd_buf=8 << 20)
    async with trio.open_nursery() as n:
        addr = await n.start(src.serve)
        print(addr[1], flush=True)
trio.run(main)
"""


def udp_rcvbuf_errors() -> int:
    """UDP datagrams the kernel dropped for a full socket receive buffer (whole machine)."""
    with open("/proc/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Udp:")]
    return int(dict(zip(rows[0][1:], rows[1][1:], strict=False)).get("RcvbufErrors", 0))


def lbtru_throughput(dep, count: int, rates: list[float]) -> list[dict]:
    """For each rate: a new LBT-RU-like source process (RU_SOURCE_CODE on SRC_IP, advertised
    in ``dep``'s TRD1 with a TIR every 0.5 s), and ``count`` verified datagrams taken once
    straight from it and once through router B's proxy (RuDataReceiver on RCV_IP, in this
    process)."""
    import trio

    from lbmr_proto.um import synthesize_otid
    from lbmr_tools.sim.dataplane import RuDataReceiver

    out: list[dict] = []
    tag = random.Random().randrange(1 << 30)
    for i, rate in enumerate(rates):
        index = 1000 + i
        topic = f"{RU_TOPIC}.{tag}.{index}"
        seed = random.Random(index).randrange(1 << 63)
        proc = subprocess.Popen(PY + [RU_SOURCE_CODE, SRC_IP, str(count), str(seed), str(rate), str(RU_SIZE)],
                                cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        try:
            sport = int(proc.stdout.readline())
            transport = L.LbtruTransport(SRC_IP, sport)
            tir = L.encode(L.Packet(0, 1, tirs=[L.TIR(topic, transport, 60, index, [
                L.OtidOption(0x8000, synthesize_otid(transport, index))])]))
            adv = Advertiser(topic, dep.lbmrd1, sport, index, packet=tir)
            try:
                proxy = resolve(topic, dep.lbmrd2)
                row: dict = {"rate": rate}
                for path, (ip, port) in (("direct", (SRC_IP, sport)), ("routed", proxy)):
                    before = udp_rcvbuf_errors()
                    r = trio.run(RuDataReceiver(ip, port, seed=seed, expect_count=count, bind_ip=RCV_IP,
                                                idle_timeout=2.0, timeout=IO_TIMEOUT_S + count / rate).run)
                    if r.corrupt or r.error:
                        raise RuntimeError(f"LBT-RU {path}: {r.corrupt} corrupt datagrams, error {r.error}")
                    row[path] = r
                    row[path + " drops"] = udp_rcvbuf_errors() - before
                out.append(row)
            finally:
                adv.close()
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()
    return out


def print_lbtru(rows: list[dict], count: int) -> None:
    for row in rows:
        print(f"  source paced at {row['rate']:,.0f} datagrams/s of {RU_SIZE} bytes, {count:,} datagrams:")
        got = {}
        for path in ("direct", "routed"):
            r = row[path]
            got[path] = r
            print(f"    {path:7s} received {r.received:9,d}  lost {count - r.received:7,d} "
                  f"({100 * (count - r.received) / count:5.2f}%)  {r.datagrams_per_s:10,.0f} datagrams/s "
                  f"{r.bytes_per_s / 1e6:7.1f} MB/s  (machine: {row[path + ' drops']:,} datagrams dropped "
                  "at full socket buffers)")
        d, rt = got["direct"], got["routed"]
        if d.received and d.datagrams_per_s:
            print(f"    ratio routed/direct: datagrams received {rt.received / d.received:.3f}x, "
                  f"rate {rt.datagrams_per_s / d.datagrams_per_s:.3f}x")


AD_MIN, AD_MAX, Q_MIN, Q_MAX = 0.010, 0.500, 0.020, 0.200  # UM's initial TR timing


def converge_once(dep, topic: str, index: int, order: str, src_port: int) -> float | None:
    """Seconds from the second application's first TR datagram to the first proxy TIR."""
    src, rcv = udp(SRC_IP), udp(RCV_IP)
    try:
        tir, tqr = tir_packet(topic, SRC_IP, src_port, index), tqr_packet(topic)
        t0 = time.perf_counter()
        first, second = ("rcv", "src") if order == "receiver first" else ("src", "rcv")
        nxt = {first: t0, second: t0 + GAP_S}
        gap = {"src": AD_MIN, "rcv": Q_MIN}
        cap = {"src": AD_MAX, "rcv": Q_MAX}
        sent_at: dict[str, float] = {}
        deadline = t0 + GAP_S + CONVERGE_TIMEOUT_S
        while True:
            now = time.perf_counter()
            if now > deadline:
                return None
            for who in ("src", "rcv"):
                if now >= nxt[who]:
                    if who == "src":
                        src.sendto(tir, dep.lbmrd1)
                    else:
                        rcv.sendto(tqr, dep.lbmrd2)
                    sent_at.setdefault(who, now)
                    nxt[who] = now + gap[who]
                    gap[who] = min(gap[who] * 2, cap[who])
            wait = max(0.0, min(min(nxt.values()), deadline) - time.perf_counter())
            ready, _, _ = select.select([src, rcv], [], [], wait)
            for s in ready:
                data = s.recv(65535)
                got = time.perf_counter()
                pkt = decode(data)
                if pkt is None:
                    continue
                if s is rcv:
                    if second in sent_at and any(is_proxy_tir(t, topic) for t in pkt.tirs):
                        return got - sent_at[second]
                elif "src" in sent_at and any(q.topic == topic for q in pkt.tqrs):
                    src.sendto(tir, dep.lbmrd1)  # UM sources answer queries at once
    finally:
        src.close()
        rcv.close()


def convergence(dep, topics: int, src_port: int) -> dict[str, list[float | None]]:
    out: dict[str, list[float | None]] = {"receiver first": [], "source first": []}
    tag = random.Random().randrange(1 << 30)
    index = 100
    for i in range(topics):
        for order in out:
            index += 1
            topic = f"bench.router.conv.{tag}.{order.split()[0]}.{i}"
            out[order].append(converge_once(dep, topic, index, order, src_port))
    return out


# ------------------------------------------------------------- profiling


def profile_transfers(dep: Processes, source: DataSource, begin, end) -> None:
    """Routed transfers back to back from before ``begin()`` (which starts the profilers)
    until after ``end()`` (which returns once they stopped), so that every profiled moment
    falls inside a transfer."""
    adv = Advertiser(TPUT_TOPIC, dep.lbmrd1, source.port)
    stop = threading.Event()
    moved: list[float] = []
    errors: list[BaseException] = []

    def transfers(proxy) -> None:
        try:
            while not stop.is_set():
                moved.append(receive(proxy, source.total))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    try:
        proxy = resolve(TPUT_TOPIC, dep.lbmrd2)
        loop = threading.Thread(target=transfers, args=(proxy,), daemon=True)
        loop.start()
        time.sleep(0.3)
        before, t0 = cpu_snapshot(dep), time.perf_counter()
        begin()
        end()
        dt, after = time.perf_counter() - t0, cpu_snapshot(dep)
        stop.set()
        loop.join(IO_TIMEOUT_S)
        if errors:
            raise errors[0]
        rate = len(moved) * source.total / 1e6 / sum(moved) if moved else 0.0
        print(f"    {len(moved)} transfers back to back, {rate:.1f} MB/s while profiled; CPU "
              + ", ".join(f"router {r.upper()} {100 * (after[r] - before[r]) / dt:.0f}%" for r in ("a", "b"))
              + " of one core")
    finally:
        stop.set()
        adv.close()


def pyspy_profile(dep: Processes, source: DataSource, pyspy: str, tmp: Path) -> dict[str, Path]:
    """Both routers sampled by py-spy (--idle, --nonblocking, raw collapsed stacks) for
    PROFILE_S seconds of routed transfers."""
    spies: dict[str, subprocess.Popen] = {}
    outs = {r: tmp / f"pyspy-{r}.txt" for r in ("a", "b")}

    def begin() -> None:
        for r in ("a", "b"):
            spies[r] = subprocess.Popen([pyspy, "record", "--pid", str(dep.pid(r)), "--rate", "250",
                                         "--duration", str(PROFILE_S), "--idle", "--nonblocking",
                                         "--format", "raw", "--output", str(outs[r])],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE)

    def end() -> None:
        for r, p in spies.items():
            if p.wait(timeout=PROFILE_S + 20) != 0:
                raise RuntimeError(f"py-spy on router {r}: {p.stderr.read().decode()[-500:]}")

    try:
        profile_transfers(dep, source, begin, end)
    finally:
        for p in spies.values():
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stderr.close()
    return outs


def cprofile_profile(dep: Processes, source: DataSource) -> None:
    """cProfile on in both routers (started with cprofile=True) for PROFILE_S seconds of
    routed transfers; the stats are written when the routers stop."""
    def toggle() -> None:
        for r in ("a", "b"):
            dep.procs[r].send_signal(signal.SIGUSR2)

    profile_transfers(dep, source, toggle, lambda: (time.sleep(PROFILE_S), toggle()))


def _short(frame: str) -> str:
    """'func (path/file.py:123)' -> 'func (dir/file.py)'."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({'/'.join(Path(path).parts[-2:])})" if path else name


def report_pyspy(path: Path, top: int) -> None:
    """Wall-time breakdown: waiting in epoll, in socket syscalls (trio's
    _nonblocking_helper is the Python frame around send/recv, router/splice.py's splice
    the one around os.splice), Python."""
    selfc: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = idle = sys_ = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_short(f) for f in stack.split(";") if " (" in f]
        if not frames:
            continue
        total += n
        leaf = frames[-1]
        if leaf.startswith(("EpollIOManager.get_events", "EpollIOManager._epoll_wait")):
            idle += n
        elif leaf.startswith(("_SocketType._nonblocking_helper", "splice (router/splice.py")):
            sys_ += n  # (router/splice.py's splice is the os.splice system call)
        selfc[leaf] += n
        for f in set(frames):
            incl[f] += n
    if not total:
        print("      (no samples)")
        return
    py = total - idle - sys_
    print(f"      {total} samples (wall time): waiting in epoll {100 * idle / total:.0f}%, socket "
          f"send/recv/splice syscalls {100 * sys_ / total:.0f}%, Python (framing, trio) {100 * py / total:.0f}%")
    print(f"      self time, % of wall time (top {top}):")
    for f, n in selfc.most_common(top):
        print(f"        {100 * n / total:5.1f}%  {f}")
    print("      inclusive time of router/ functions, % of wall time:")
    shown = [(f, n) for f, n in incl.most_common() if "(router/" in f and not f.startswith("main (")]
    for f, n in shown[:top]:
        print(f"        {100 * n / total:5.1f}%  {f}")


def report_cprofile(path: Path, top: int) -> None:
    st = pstats.Stats(str(path))
    total = st.total_tt
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():
        where = "/".join(Path(file).parts[-2:]) if file != "~" else "builtin"
        rows.append((tt, ct, nc, f"{func} ({where}:{line})"))
    print(f"      {total:.2f} s profiled (wall time; waiting in epoll is select.epoll.poll)")
    print(f"      self time (top {top}):")
    for tt, _ct, nc, name in sorted(rows, reverse=True)[:top]:
        print(f"        {100 * tt / total:5.1f}%  {tt:6.2f} s  {nc:8d} calls  {name}")
    print("      cumulative time of router/ functions:")
    for _tt, ct, nc, name in sorted(((r[1], r[1], r[2], r[3]) for r in rows if "router/" in r[3]),
                                    reverse=True)[:top]:
        print(f"        {100 * ct / total:5.1f}%  {ct:6.2f} s  {nc:8d} calls  {name}")


# ------------------------------------------------------------------ main


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
    ap.add_argument("--no-fanout", action="store_true", help="skip the fan-out measurement")
    ap.add_argument("--only-fanout", action="store_true", help="measure only the fan-out (section 5)")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.topics < 1 or args.mbytes <= 0:
        ap.error("--runs and --topics must be at least 1, --mbytes positive")
    total = int(args.mbytes * 1_000_000)
    mb = total / 1e6

    def hard_limit(signum, frame):
        raise TimeoutError(f"benchmark exceeded {HARD_LIMIT_S} s")

    signal.signal(signal.SIGALRM, hard_limit)
    signal.alarm(HARD_LIMIT_S)
    started = time.monotonic()
    print(f"lbmr-router benchmark: {mb:g} MB per transfer, best of {args.runs}, reads/writes of "
          f"{CHUNK // 1024} KiB, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    source = DataSource(total)
    with tempfile.TemporaryDirectory(prefix="bench-router-") as td, contextlib.ExitStack() as stack:
        tmp = Path(td)
        if args.only_fanout:
            run_fanout(tmp, stack, args)
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
    signal.alarm(0)
    print(f"\ntotal {time.monotonic() - started:.1f} s")
    return 0


def run_fanout(tmp: Path, stack: contextlib.ExitStack, args) -> None:
    ns = [int(x) for x in args.fanout_n.split(",") if x]
    print(f"\n5. Fan-out: one live LBMC source in TRD1 ({FANOUT_MESSAGE}-byte messages), N receivers in TRD2, "
          f"router pairs with fan-out and per connection (links through counting forwarders) against a minimal "
          f"fan-out "
          f"process (reads one socket, writes N), {args.fanout_window:g} s per case after "
          f"{FANOUT_WARMUP_S:g} s; link ratio with the source paced at {FANOUT_PACED_BPS / 1e6:g} MB/s; "
          f"delivered bytes per second of all receivers, the routed source paced at "
          f"{', '.join(f'{x:.0%}' for x in FANOUT_LOADS)} of what the minimal fan-out delivered to each")
    print_fanout(fanout_rows(tmp, stack, ns, args.fanout_window))


if __name__ == "__main__":
    sys.exit(main())
