"""The deployments and the traffic of bench/router.py: addresses, the
helper processes' code (routers, lbmrds, minimal relays), ports, LBMR
packets, the advertiser, the byte-pattern TCP source and its checking
receiver, CPU accounting from /proc, and the deployments themselves
(:class:`Processes`, :class:`DirectLink`, :class:`InProcess`,
:class:`RelayChain`). Everything on loopback (127.0.0.0/8).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import lbmr_proto as L

ROOT = Path(__file__).resolve().parents[1]


TRD1, TRD2 = "127.0.1.1", "127.0.2.1"  # lbmrd, router TR socket and relay address of each TRD
SRC_IP, RCV_IP = "127.0.1.5", "127.0.2.9"  # the applications
CHUNK = 1 << 20  # bytes per sendall / recv_into
PERIOD = CHUNK + 4099  # pattern period: no read or frame size divides it
PATTERN = random.Random(7).randbytes(PERIOD) * 2
PROBE = 16
IO_TIMEOUT_S = 30.0
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




def cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` spent so far."""
    return sum(cpu_user_sys(pid))


def cpu_user_sys(pid: int) -> tuple[float, float]:
    """CPU-seconds of a process so far: (user, system)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def machine_busy() -> float:
    """CPU-seconds all CPUs spent busy since boot (/proc/stat; idle and iowait excluded)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / CLK_TCK


def cpu_snapshot(dep) -> dict[str, float]:
    """CPU-seconds so far: router processes (if separate), this process, the whole machine."""
    snap = dep.cpu()
    snap["self"] = time.process_time()
    snap["machine"] = machine_busy()
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
        return {k: cpu_seconds(self.pid(k)) for k in self.routers}

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
        from router.config.model import acceptor_peer, initiator_peer, lbmrd_endpoint
        from router.shell.single import Router

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
