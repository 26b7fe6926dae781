"""Relay-rate benchmark: lbmrd versus a minimal C relay, plus lbmrd's memory
for a large client table.

    python bench/relay.py [--clients 10,100,1000] [--seconds 5] [--size 200]
                          [--window 64] [--rounds 10] [--memory-clients 100000]
                          [--profile] [--baseline-tree DIR]

Over 600 lines because it is one self-contained script (relays under test,
load generator, report) meant to be read and run on its own.

Everything runs on loopback (127.0.0.1) and stops by itself.

Relays under test
    * ``bench/relay_c.c``, compiled here with ``gcc -O2`` into a temporary
      directory: one UDP socket, hash table of clients, keepalive replies,
      ``sendmmsg`` fan-out in batches of 1024 sharing one iovec (the same
      semantics as lbmrd's relay path, lighter validation);
    * lbmrd (``lbmrd.cli.main`` in a subprocess, ``--metrics`` on loopback).

Load, for each N in --clients (a fresh C relay and a fresh lbmrd, each with
its own client sockets)
    1. The driver socket registers first (keepalive, waits for the reply).
    2. N-1 "sink" sockets register (keepalive, reply); their receive buffers
       are the kernel minimum and they are never read, so the kernel drops
       what reaches them: the benchmark measures the relay's send rate, not
       the sinks.
    3. One "probe" socket registers last (large receive buffer, read by the
       driver). Every TQR the driver sends is therefore relayed to exactly N
       clients (N-1 sinks + the probe; never back to the sender), and the
       probe's copy is the last one of each fan-out on both relays (both send
       in registration order).
    4. Pacing -- a bounded in-flight window: the driver keeps at most
       --window TQRs (a valid LBMR TQR whose topic name pads it to --size
       bytes) between "sent" and "the probe received its relayed copy". It
       tops the window up after every batch of probe receipts, so the relay's
       receive queue is never empty (it is busy all the time) yet never holds
       more than --window datagrams (~100 KB, far below its 1-2 MB receive
       buffer), so input is not lost. If the probe sees nothing for
       STALL_S the window is reset (counted as a stall; a lost copy).
    5. The rate is the relay's own counter of datagrams sent, read just
       before and just after the run (C relay: a JSON line on SIGUSR1;
       lbmrd: ``/status`` counters.tx), over the wall time from the first
       send to the last probe receipt. The relay is idle at both readings,
       so the keepalive replies of the registration are excluded. Input
       drops = TQRs sent minus the relay's count of datagrams received.
    6. Each relay is driven for --seconds in total, in --rounds alternating
       segments (C, lbmrd, lbmrd, C, ...), so the slow drifts of a shared
       machine hit both alike; the idle one costs nothing meanwhile.
    7. The relay's CPU use over the run comes from /proc/PID/stat. The
       driver runs on the same machine (and, where the CPUs are shared or
       throttled, partly at the relay's expense: it sends one datagram and
       reads one probe copy per relayed input, which matters at small N), so
       the table also shows datagrams out per relay CPU-second.

Memory (in-process, sans-IO)
    ``lbmrd.relay.RelayCore`` fed --memory-clients keepalives from distinct
    127.x.y.z addresses: RSS delta (/proc/self/status VmRSS, without
    tracemalloc) and tracemalloc's traced delta (separate pass), MB and
    bytes/client; the time of ``core.handle(TQR)`` with that table (the
    fan-out decision); and the time and size of the ctypes sendmmsg arrays
    that lbmrd's shell (lbmrd.fanout) builds for the group on the first
    relay after any membership change (built here without sending).

--profile additionally runs lbmrd under cProfile for the last N and prints
the functions with the most own time.

--baseline-tree DIR also runs another version of lbmrd ("before") in the
same alternating segments, for before/after figures from one run, e.g.
``git archive main lbmr_proto lbmr_runtime lbmrd | tar -x -C DIR``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import pstats
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import lbmr_proto as L  # noqa: E402

LOOPBACK = "127.0.0.1"
KEEPALIVE = b"\x02\x00\x00\x00"
REPLY = b"\x00\x00\x00\x00"
IP_PKTINFO = getattr(socket, "IP_PKTINFO", 8)  # Linux's value; Python 3.11 lacks the name
TQR_SMALL = L.encode(L.Packet(0, 1, tqrs=[L.TQR("bench.stall")]))
STALL_S = 0.2  # no probe receipt for this long: the window is reset
REGISTER_CHUNK = 128  # keepalives in flight during registration
REGISTER_TRIES = 5
START_TIMEOUT = 15.0  # seconds for a relay to come up
DRAIN_TIMEOUT = 5.0  # seconds to wait for the window's last copies after a run
C_SOURCE = Path(__file__).with_name("relay_c.c")
CLK_TCK = os.sysconf("SC_CLK_TCK")

_PROCS: list[subprocess.Popen] = []  # everything we started, stopped in main's finally


# ---------------------------------------------------------------- helpers


def tqr_payload(size: int) -> bytes:
    """A valid LBMR packet with one TQR, padded to ``size`` bytes by its topic name."""
    prefix = "bench.relay."
    pad = size - 4 - 1 - len(prefix)  # header, NUL
    if not 0 <= pad <= 255 - len(prefix):
        raise SystemExit(f"--size must be between {5 + len(prefix)} and 260")
    b = L.encode(L.Packet(0, 1, tqrs=[L.TQR(prefix + "x" * pad)]))
    assert len(b) == size, len(b)
    return b


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def udp_socket(rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        if rcvbuf is not None:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.bind((LOOPBACK, 0))
        s.setblocking(False)
    except OSError:
        s.close()
        raise
    return s


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (0.0 if unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def vmrss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _die_with_parent() -> None:
    """Child side of Popen (Linux): get SIGTERM if the benchmark dies, even by SIGKILL."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def spawn(cmd: list[str], **kw) -> subprocess.Popen:
    p = subprocess.Popen(cmd, preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None, **kw)
    _PROCS.append(p)
    return p


def stop_process(p: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 5.0) -> None:
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(sig)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def register(socks: list[socket.socket], relay: tuple[str, int]) -> None:
    """Register each socket with a keepalive and wait for its reply, in
    chunks, in list order chunk by chunk; bounded retries."""
    for c in range(0, len(socks), REGISTER_CHUNK):
        chunk = socks[c:c + REGISTER_CHUNK]
        pending = {s.fileno(): s for s in chunk}
        for _ in range(REGISTER_TRIES):
            for s in pending.values():
                s.sendto(KEEPALIVE, relay)
            poller = select.poll()
            for fd in pending:
                poller.register(fd, select.POLLIN)
            deadline = time.monotonic() + 1.0
            while pending and time.monotonic() < deadline:
                for fd, _ in poller.poll(100):
                    s = pending.get(fd)
                    if s is None:
                        continue
                    try:
                        data, src = s.recvfrom(64)
                    except BlockingIOError:
                        continue
                    if data == REPLY and src == relay:
                        del pending[fd]
                        poller.unregister(fd)
            if not pending:
                break
        if pending:
            raise RuntimeError(f"{len(pending)} clients got no keepalive reply from {relay}")


# ----------------------------------------------------------------- relays


class CRelay:
    name = "C"

    def __init__(self, exe: Path, limit_s: float) -> None:
        self.p = spawn([str(exe), "--port", "0", "--seconds", str(limit_s)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._buf = b""
        line = self._line(START_TIMEOUT)
        self.addr = (LOOPBACK, json.loads(line)["port"])

    def _line(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        fd = self.p.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise RuntimeError("C relay: no output")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"C relay exited: {self.p.stderr.read().decode(errors='replace')}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def counters(self) -> dict:
        self.p.send_signal(signal.SIGUSR1)
        c = json.loads(self._line(5.0))
        return {"in": c["in"], "out": c["out"], "clients": c["clients"],
                "drops": c["malformed"] + c["table_full"] + c["send_buffer_full"],
                "send_errors": c["send_errors"]}

    def close(self) -> None:
        stop_process(self.p)
        if self.p.stdout:
            self.p.stdout.close()
        if self.p.stderr:
            self.p.stderr.close()


class Lbmrd:
    """lbmrd in a subprocess, from this checkout or from ``tree`` (a
    directory holding another version's lbmr_proto, lbmr_runtime and lbmrd)."""

    def __init__(self, logdir: str, cmd_prefix: list[str] | None = None,
                 extra: list[str] | None = None, tree: str | None = None) -> None:
        self.name = "lbmrd" if tree is None else "before"
        port, mport = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_STREAM)
        self.addr = (LOOPBACK, port)
        self.url = f"http://{LOOPBACK}:{mport}/status"
        code = "import sys; from lbmrd.cli import main; sys.exit(main(sys.argv[1:]))"
        cmd = cmd_prefix or [sys.executable, "-c", code]
        self.log = open(os.path.join(logdir, f"lbmrd-{port}.log"), "wb")
        self.p = spawn(cmd + ["-i", LOOPBACK, "-p", str(port), "--metrics", f"{LOOPBACK}:{mport}",
                              "--stats-interval", "0", *(extra or [])],
                       stdout=self.log, stderr=subprocess.STDOUT, cwd=tree or str(ROOT))
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                self.status()
                break
            except OSError:
                if self.p.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"lbmrd did not start (see {self.log.name})") from None
                time.sleep(0.05)

    def status(self) -> dict:
        with urllib.request.urlopen(self.url, timeout=5.0) as r:  # loopback only
            return json.loads(r.read())

    def counters(self) -> dict:
        st = self.status()
        c = st["counters"]
        # an older lbmrd (before exact counting) has no "received" nor the drop families
        drops = sum(sum(c.get(k, {}).values()) for k in ("drops", "relays_dropped", "copies_dropped"))
        return {"in": c.get("received", sum(c["rx"].values())), "out": c["tx"],
                "clients": st["clients_total"], "drops": drops,
                "send_errors": sum(c["send_errors"].values())}

    def close(self) -> None:
        stop_process(self.p)
        self.log.close()


# ------------------------------------------------------------------- load


def drive(driver: socket.socket, probe: socket.socket, payload: bytes, seconds: float,
          window: int) -> dict:
    """Send ``payload`` for ``seconds`` keeping at most ``window`` datagrams
    not yet seen by the probe. Returns sent/received counts and times."""
    send = driver.send
    recv_into = probe.recv_into
    rbuf = bytearray(2048)
    poller = select.poll()
    poller.register(probe.fileno(), select.POLLIN)
    stall_ms = int(STALL_S * 1000)
    sent = got = stalls = send_full = 0
    inflight = 0
    clock = time.perf_counter
    t0 = clock()
    end = t0 + seconds
    t_last = t0
    while True:
        now = clock()
        if now >= end:
            break
        while inflight < window:
            try:
                send(payload)
            except BlockingIOError:
                send_full += 1
                break
            sent += 1
            inflight += 1
        if not poller.poll(stall_ms):
            stalls += 1
            inflight = 0
            continue
        while True:
            try:
                recv_into(rbuf)
            except BlockingIOError:
                break
            got += 1
            inflight -= 1
        t_last = clock()
        if inflight < 0:
            inflight = 0
    # let the window drain (bounded)
    deadline = clock() + DRAIN_TIMEOUT
    while inflight > 0 and clock() < deadline:
        if not poller.poll(int(STALL_S * 1000)):
            break
        while True:
            try:
                recv_into(rbuf)
            except BlockingIOError:
                break
            got += 1
            inflight -= 1
        t_last = clock()
    return {"sent": sent, "probe_got": got, "stalls": stalls, "send_full": send_full,
            "t0": t0, "t_last": t_last}


class Session:
    """The driver, n-1 sinks and the probe, registered with one relay; each
    :meth:`segment` drives it for a while and returns what its counters say."""

    def __init__(self, relay, n: int) -> None:
        self.relay = relay
        self.n = n
        self.socks: list[socket.socket] = []
        try:
            self.driver = self._sock()
            sinks = [self._sock(rcvbuf=1) for _ in range(n - 1)]  # kernel minimum
            self.probe = self._sock(rcvbuf=4 << 20)
            register([self.driver], relay.addr)
            register(sinks, relay.addr)
            register([self.probe], relay.addr)
            self.driver.connect(relay.addr)
            c = relay.counters()
            if c["clients"] != n + 1:
                raise RuntimeError(f"{relay.name}: {c['clients']} clients registered, expected {n + 1}")
        except BaseException:
            self.close()
            raise
        self.total = {"seconds": 0.0, "out": 0, "in": 0, "sent": 0, "relay_drops": 0,
                      "send_errors": 0, "stalls": 0, "relay_cpu_s": 0.0, "driver_cpu_s": 0.0}

    def _sock(self, rcvbuf: int | None = None) -> socket.socket:
        s = udp_socket(rcvbuf)
        self.socks.append(s)
        return s

    def segment(self, payload: bytes, seconds: float, window: int) -> None:
        relay = self.relay
        c0 = relay.counters()
        cpu0 = proc_cpu(relay.p.pid)
        my0 = time.process_time()
        d = drive(self.driver, self.probe, payload, seconds, window)
        my1 = time.process_time()
        cpu1 = proc_cpu(relay.p.pid)
        c1 = relay.counters()
        t = self.total
        t["seconds"] += d["t_last"] - d["t0"]
        t["out"] += c1["out"] - c0["out"]
        t["in"] += c1["in"] - c0["in"]
        t["sent"] += d["sent"]
        t["relay_drops"] += c1["drops"] - c0["drops"]
        t["send_errors"] += c1["send_errors"] - c0["send_errors"]
        t["stalls"] += d["stalls"]
        t["relay_cpu_s"] += cpu1 - cpu0
        t["driver_cpu_s"] += my1 - my0

    def result(self) -> dict:
        t = dict(self.total)
        dt = t["seconds"] or float("nan")
        t.update(n=self.n, out_per_s=t["out"] / dt, in_per_s=t["in"] / dt,
                 input_drops=t["sent"] - t["in"], relay_cpu=t["relay_cpu_s"] / dt,
                 driver_cpu=t["driver_cpu_s"] / dt,
                 out_per_cpu_s=t["out"] / t["relay_cpu_s"] if t["relay_cpu_s"] else float("nan"))
        return t

    def close(self) -> None:
        for s in self.socks:
            s.close()
        self.socks = []


def run_pair(relays: dict, n: int, payload: bytes, seconds: float, window: int,
             rounds: int) -> dict:
    """Drive each relay for ``seconds`` in total, in ``rounds`` alternating
    segments (ABBA order), so slow drifts of this machine hit both alike."""
    sessions = {}
    try:
        for kind, relay in relays.items():
            sessions[kind] = Session(relay, n)
        kinds = list(relays)
        for r in range(rounds):
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                sessions[kind].segment(payload, seconds / rounds, window)
        return {kind: s.result() for kind, s in sessions.items()}
    finally:
        for s in sessions.values():
            s.close()


def compile_c(tmp: str) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise SystemExit("gcc not found")
    exe = Path(tmp) / "relay_c"
    subprocess.run([gcc, "-O2", "-Wall", "-o", str(exe), str(C_SOURCE)], check=True, timeout=60)
    return exe


# ----------------------------------------------------------------- memory


def memory_bench(n: int, payload: bytes) -> dict:
    from lbmrd.fanout import _GroupArrays
    from lbmrd.relay import Relay, RelayCore

    def addr(i: int) -> tuple[str, int]:
        return (f"127.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", 14402 + i % 5)

    def fill(core: RelayCore) -> None:
        handle = core.handle
        for i in range(n):
            handle(KEEPALIVE, addr(i), 1000.0)

    # pass 1: RSS, no tracemalloc
    gc.collect()
    rss0 = vmrss_kb()
    core = RelayCore()
    t = time.perf_counter()
    fill(core)
    t_fill = time.perf_counter() - t
    gc.collect()
    rss1 = vmrss_kb()
    assert len(core.table) == n, len(core.table)

    # the fan-out decision with n clients (median of 21)
    sender = addr(n // 2)
    times = []
    for _ in range(21):
        t = time.perf_counter()
        d = core.handle(payload, sender, 1001.0)
        times.append(time.perf_counter() - t)
    assert type(d) is Relay and sum(len(g.members) for _, g in d.parts) == n
    t_decide = sorted(times)[len(times) // 2]

    # lbmrd.fanout's per-group ctypes arrays (rebuilt after any membership change)
    group = next(iter(core.table.groups.values()))
    rss_a0 = vmrss_kb()
    t = time.perf_counter()
    arrays = _GroupArrays(group)
    t_arrays = time.perf_counter() - t
    rss_a1 = vmrss_kb()
    del arrays, core, d
    gc.collect()

    # pass 2: tracemalloc
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    core = RelayCore()
    fill(core)
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - base
    base_a = tracemalloc.get_traced_memory()[0]
    arrays = _GroupArrays(next(iter(core.table.groups.values())))
    traced_arrays = tracemalloc.get_traced_memory()[0] - base_a
    tracemalloc.stop()
    del arrays, core
    gc.collect()
    return {"n": n, "rss_mb": (rss1 - rss0) / 1024, "traced_mb": traced / 2**20,
            "rss_b_per_client": (rss1 - rss0) * 1024 / n, "traced_b_per_client": traced / n,
            "fill_s": t_fill, "decide_s": t_decide, "arrays_s": t_arrays,
            "arrays_rss_mb": (rss_a1 - rss_a0) / 1024, "arrays_traced_mb": traced_arrays / 2**20}


# ---------------------------------------------------------------- profile

PROFILE_CODE = """
import cProfile, sys
from lbmrd.cli import main
pr = cProfile.Profile()
pr.enable()
try:
    rc = main(sys.argv[2:])
finally:
    pr.disable()
    pr.dump_stats(sys.argv[1])
sys.exit(rc)
"""


def profile_lbmrd(tmp: str, n: int, payload: bytes, seconds: float, window: int) -> None:
    prof = os.path.join(tmp, "lbmrd.prof")
    relay = Lbmrd(tmp, [sys.executable, "-c", PROFILE_CODE, prof])
    try:
        r = run_pair({"lbmrd": relay}, n, payload, seconds, window, 1)["lbmrd"]
    finally:
        relay.close()
    print(f"\ncProfile of lbmrd, N={n} (profiling overhead included): "
          f"{r['out_per_s']:,.0f} out/s, {r['in_per_s']:,.0f} in/s")
    if os.path.exists(prof):
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(18)
    else:
        print("  (no profile written)")



# ------------------------------------------------------------------- stalls


def send_from(sock: socket.socket, payload: bytes, src_ip: str, dst: tuple[str, int]) -> None:
    """Send from another 127.x.y.z address of this host (IP_PKTINFO source),
    so one socket can play many clients (loopback only)."""
    info = struct.pack("=I4s4s", 0, socket.inet_aton(src_ip), b"\0\0\0\0")
    sock.sendmsg([payload], [(socket.IPPROTO_IP, IP_PKTINFO, info)], 0, dst)


def many_clients(sock: socket.socket, relay: Lbmrd, n: int) -> None:
    """Register ``n`` clients 127.64.0.1 and up, 1,000 at a time; a chunk is
    sent again (a refresh for those already known) until lbmrd has them all,
    since a busy machine may drop some from the socket buffer."""
    for start in range(0, n, 1000):
        end = min(n, start + 1000)
        for _ in range(REGISTER_TRIES * 4):
            for i in range(start, end):
                send_from(sock, KEEPALIVE, f"127.{64 + (i >> 16)}.{(i >> 8) & 255}.{i & 255}", relay.addr)
            deadline = time.monotonic() + 2.0
            while relay.status()["clients_total"] < end and time.monotonic() < deadline:
                time.sleep(0.01)
            if relay.status()["clients_total"] >= end:
                break
        else:
            raise RuntimeError("lbmrd did not register the clients")


def keepalive_rtts(probe: socket.socket, relay_addr: tuple[str, int], until, period: float = 0.002,
                   limit_s: float = 60.0) -> list[float]:
    """Keepalive round trips (seconds) every ``period`` until ``until()`` is true."""
    rtts = []
    probe.settimeout(5.0)
    end = time.monotonic() + limit_s
    while not until() and time.monotonic() < end:
        t0 = time.perf_counter()
        probe.sendto(KEEPALIVE, relay_addr)
        while True:
            data, src = probe.recvfrom(65535)
            if data == REPLY and src == relay_addr:
                break
        rtts.append(time.perf_counter() - t0)
        time.sleep(period)
    return rtts


def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def stall_bench(tmp: str, n: int, tree: str | None = None) -> dict:
    """Max keepalive round trip while ``n`` clients expire at once, while one
    TQR is fanned out to them, and while a 50,000-network file is reloaded;
    each against the idle round trip measured in the same run (``tree``:
    the lbmrd of another version, see :class:`Lbmrd`)."""
    conf = os.path.join(tmp, "big.xml")
    with open(conf, "w") as f:
        f.write('<?xml version="1.0"?>\n<lbmrd version="1.0">\n<domains>\n')
        for d in range(50):
            f.write(f'<domain name="d{d}">\n')
            f.writelines(f"<network>10.{d}.{i >> 8}.{i & 255}/32</network>\n" for i in range(1000))
            f.write("</domain>\n")
        f.write('</domains>\n<transformations><transform source="d0" destination="d1"><rule>'
                '<match address="10.0.0.1" port="*"/><replace address="10.1.0.1" port="*"/></rule>'
                "</transform></transformations>\n</lbmrd>\n")
    # a ttl long enough to register them all on a busy machine (each new client is
    # classified against the 50,000 networks: 6-16 s)
    relay = Lbmrd(tmp, extra=["-t", "30", "-a", "1000", conf], tree=tree)
    # the n clients: one socket on every loopback address (it sends from
    # 127.64.0.0 and up); what reaches them is mostly dropped (small buffer)
    players = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    players.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    players.bind(("0.0.0.0", 0))
    probe = udp_socket(rcvbuf=4 << 20)
    probe.setblocking(True)
    out = {"n": n, "name": relay.name}
    try:
        probe.settimeout(5.0)
        probe.sendto(KEEPALIVE, relay.addr)
        probe.recvfrom(16)
        t_idle = time.monotonic() + 1.0
        out["idle"] = keepalive_rtts(probe, relay.addr, lambda: time.monotonic() > t_idle)
        many_clients(players, relay, n)
        # a TQR from one of the n, fanned out to all of them (and the probe)
        t_fan = time.monotonic() + 1.0
        send_from(players, TQR_SMALL, "127.64.0.1", relay.addr)
        out["fanout"] = keepalive_rtts(probe, relay.addr, lambda: time.monotonic() > t_fan)
        # all n fall silent; the probe keeps talking while the activity check removes them
        out["expiry"] = keepalive_rtts(probe, relay.addr,
                                       lambda: relay.status()["clients_total"] <= 1, period=0.002)
        # reload the big file
        log = relay.log.name
        before = open(log, "rb").read().count(b"configuration reloaded")
        relay.p.send_signal(signal.SIGHUP)
        out["reload"] = keepalive_rtts(
            probe, relay.addr, lambda: open(log, "rb").read().count(b"configuration reloaded") > before)
    finally:
        players.close()
        probe.close()
        relay.close()
    return out


# ------------------------------------------------------------------- main


def print_stalls(st: dict) -> None:
    idle = _pct(st["idle"], 0.5)
    print(f"loop stalls, {st['name']} with {st['n']:,} clients (keepalive round trips, ms; "
          f"idle median {idle * 1e3:.2f} ms in the same run):")
    for what, label in (("fanout", f"one TQR fanned out to {st['n']:,} clients"),
                        ("expiry", f"{st['n']:,} clients expiring at once"),
                        ("reload", "SIGHUP reload of a 50,000-network file")):
        r = st[what]
        print(f"  {label:<44} {len(r):>5} probes  p50 {_pct(r, 0.5) * 1e3:7.2f}  "
              f"p99 {_pct(r, 0.99) * 1e3:7.2f}  max {max(r) * 1e3:7.2f}  "
              f"max/idle {max(r) / idle:6.0f}x")
    print("  target: max under 50 ms while clients expire", flush=True)


def print_ratios(kind: str, rows: list[tuple[int, dict, dict]]) -> None:
    """One table of ``kind`` against the C relay: rates and rates per CPU-second."""
    k = f"{kind}/C"
    print(f"{'N':>6} {'C out/s':>12} {kind + ' out/s':>13} {k:>9}   "
          f"{'C out/CPU-s':>12} {kind + ' out/CPU-s':>17} {k:>9}")
    for n, c, p in rows:
        ratio = p["out_per_s"] / c["out_per_s"] if c["out_per_s"] else float("nan")
        cratio = p["out_per_cpu_s"] / c["out_per_cpu_s"] if c["out_per_cpu_s"] else float("nan")
        print(f"{n:>6} {c['out_per_s']:>12,.0f} {p['out_per_s']:>13,.0f} {ratio:>9.2f}   "
              f"{c['out_per_cpu_s']:>12,.0f} {p['out_per_cpu_s']:>17,.0f} {cratio:>9.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="10,100,1000", help="comma-separated client counts N")
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run")
    ap.add_argument("--size", type=int, default=200, help="datagram size in bytes")
    ap.add_argument("--window", type=int, default=64, help="datagrams in flight (driver to probe)")
    ap.add_argument("--rounds", type=int, default=10,
                    help="alternating segments per relay and N (ABBA order against drift)")
    ap.add_argument("--memory-clients", type=int, default=100_000, help="clients for the memory test")
    ap.add_argument("--profile", action="store_true", help="also profile lbmrd (cProfile) at the last N")
    ap.add_argument("--stall-clients", type=int, default=100_000,
                    help="clients for the loop-stall figures (0 = skip them)")
    ap.add_argument("--baseline-tree", metavar="DIR",
                    help="also run the lbmrd in DIR (another version's lbmr_proto, lbmr_runtime and "
                         "lbmrd, e.g. from git archive) in the same alternating segments, as 'before'")
    args = ap.parse_args(argv)
    ns = [int(x) for x in args.clients.split(",") if x.strip()]
    if not ns or min(ns) < 1 or max(ns) > 4000:
        ap.error("--clients: each N must be 1..4000 (the C relay's table holds 4096)")
    if not 0 < args.seconds <= 20:
        ap.error("--seconds must be in (0, 20]")
    if not 1 <= args.rounds <= 20:
        ap.error("--rounds must be 1..20")
    if not 1 <= args.window <= 1024:
        ap.error("--window must be 1..1024")
    payload = tqr_payload(args.size)

    def on_term(signum, frame):
        raise SystemExit(128 + signum)  # run the finally blocks: stop the relays

    signal.signal(signal.SIGTERM, on_term)
    mem = memory_bench(args.memory_clients, payload)
    print(f"memory, {mem['n']:,} clients in lbmrd.relay.RelayCore (sans-IO):")
    print(f"  tracemalloc {mem['traced_mb']:.1f} MB ({mem['traced_b_per_client']:.0f} B/client); "
          f"RSS delta {mem['rss_mb']:.1f} MB ({mem['rss_b_per_client']:.0f} B/client); target < 100 MB")
    print(f"  registering them: {mem['fill_s']:.2f} s ({mem['n'] / mem['fill_s']:,.0f} keepalives/s)")
    print(f"  fan-out decision core.handle(TQR) with {mem['n']:,} clients: {mem['decide_s'] * 1e6:.1f} us")
    print(f"  lbmrd.fanout sendmmsg arrays for the group: built in {mem['arrays_s'] * 1e3:.0f} ms, "
          f"{mem['arrays_traced_mb']:.1f} MB traced / {mem['arrays_rss_mb']:.1f} MB RSS "
          "(built once; then kept in step in O(1) per join or expiry)")
    print(f"  total with the arrays: {mem['traced_mb'] + mem['arrays_traced_mb']:.1f} MB traced, "
          f"{mem['rss_mb'] + mem['arrays_rss_mb']:.1f} MB RSS")
    sys.stdout.flush()

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-relay-") as tmp:
        try:
            if args.stall_clients:
                for tree in [None, args.baseline_tree] if args.baseline_tree else [None]:
                    print_stalls(stall_bench(tmp, args.stall_clients, tree))
            exe = compile_c(tmp)
            for n in ns:
                relays = {}
                try:
                    relays["C"] = CRelay(exe, args.seconds * 2 + 60)
                    relays["lbmrd"] = Lbmrd(tmp)
                    if args.baseline_tree:
                        relays["before"] = Lbmrd(tmp, tree=args.baseline_tree)
                    res = run_pair(relays, n, payload, args.seconds, args.window, args.rounds)
                finally:
                    for relay in relays.values():
                        relay.close()
                for kind, r in res.items():
                    print(f"  N={n:<5} {kind:<5} out {r['out_per_s']:>10,.0f}/s  in {r['in_per_s']:>8,.0f}/s  "
                          f"sent {r['sent']:>8,}  input drops {r['input_drops']:>5,}  relay drops "
                          f"{r['relay_drops']:>5,}  stalls {r['stalls']}  relay CPU {r['relay_cpu']:.0%}  "
                          f"driver CPU {r['driver_cpu']:.0%}  out per relay CPU-s {r['out_per_cpu_s']:,.0f}",
                          flush=True)
                rows.append((n, res))
            print(f"\nrelay rate, {args.size}-byte TQRs, window {args.window}, {args.seconds:g} s per relay "
                  f"and N in {args.rounds} alternating segments (datagrams sent by the relay per second):")
            for kind in [k for k in rows[0][1] if k != "C"] if rows else []:
                print_ratios(kind, [(n, res["C"], res[kind]) for n, res in rows])
            print("target ratio >= 0.90")
            if args.profile:
                profile_lbmrd(tmp, ns[-1], payload, args.seconds, args.window)
        finally:
            for p in _PROCS:
                stop_process(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
