"""The fan-out measurement of bench/router.py (section 5): one live LBMC source
in TRD1, N receivers in TRD2, through the router pair (fan-out on, the
default) and through a minimal fan-out process that reads the source's one
socket and writes every read to N sockets, in the same run.

* The source (SOURCE_CODE, a process of its own) sends a 4 MiB run of LBMC
  data messages over and over to each connection, paced to a rate in bytes
  per second or as fast as the socket takes it (rate 0).
* The receivers are sockets of this process read by one epoll loop
  (``recv_into``, bytes counted, not checked: tests/router/relays/test_fanout_relay.py
  checks them), read from the start, measured over a window after a
  warm-up.
* The link between the routers goes through :class:`CountingForwarder`
  (a process of its own, ``os.splice`` through a pipe each way), which
  counts the bytes from router A (the sources' side) to router B.

Per N: link bytes / the bytes of the receiver that got the most (paced
source: nobody falls behind, so no drops blur the ratio), and delivered bytes
per second of all receivers, routed against the minimal fan-out (source as
fast as it goes). With them, the CPU seconds per GB delivered of the minimal
fan-out process and of the routed path's processes (router A, router B, the
forwarder) over the same windows: read from /proc, they change nothing in
either measurement, and say where the routed path's time goes (the source
and the receivers are the same programs on both sides).
"""

from __future__ import annotations

import contextlib
import select
import socket
import subprocess
import sys
import time

PY = [sys.executable, "-c"]
SOURCE_CODE = r"""
import socket, sys, threading, time
from lbmr_proto import lbmc
ip, size, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
run = b"".join(lbmc.data_message(1, q, bytes([q & 255]) * size) for q in range((4 << 20) // (size + 12)))
step = 64 << 10
ls = socket.create_server((ip, 0), backlog=64)
print(ls.getsockname()[1], flush=True)
def serve(c):
    mv, t0, sent = memoryview(run), time.monotonic(), 0
    try:
        while True:
            for off in range(0, len(run), step):
                chunk = mv[off:off + step]
                c.sendall(chunk)
                sent += len(chunk)
                if rate:
                    ahead = sent / rate - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
    except OSError:
        pass
    c.close()
while True:
    c, _ = ls.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""
BASELINE_CODE = r"""
import socket, sys
ip, sip, sport, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ls = socket.create_server((ip, 0), backlog=n + 8)
print(ls.getsockname()[1], flush=True)
outs = [ls.accept()[0] for _ in range(n)]
up = socket.create_connection((sip, sport))
buf = bytearray(1 << 18)
mv = memoryview(buf)
try:
    while k := up.recv_into(buf):
        for o in outs:
            o.sendall(mv[:k])
except OSError:
    pass
"""
READ = 1 << 18


def spawn(code: str, *args) -> tuple[subprocess.Popen, int]:
    """A helper process that prints its port first."""
    p = subprocess.Popen(PY + [code, *map(str, args)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    return p, int(p.stdout.readline())


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait()
    p.stdout.close()


FORWARDER_CODE = r"""
import os, socket, sys, threading
ip, tip, tport = sys.argv[1], sys.argv[2], int(sys.argv[3])
ls = socket.create_server((ip, 0), backlog=4)
print(ls.getsockname()[1], flush=True)
count = [0]
def pump(src, dst, counted):
    r, w = os.pipe()
    try:
        while k := os.splice(src.fileno(), w, 1 << 20):
            if counted:
                count[0] += k
            while k:
                k -= os.splice(r, dst.fileno(), k)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
def accept():
    while True:
        a, _ = ls.accept()
        try:
            b = socket.create_connection((tip, tport))
        except OSError:  # the router is not listening yet: the other one dials again
            a.close()
            continue
        threading.Thread(target=pump, args=(a, b, True), daemon=True).start()
        threading.Thread(target=pump, args=(b, a, False), daemon=True).start()
threading.Thread(target=accept, daemon=True).start()
for _ in sys.stdin:
    print(count[0], flush=True)
"""


class CountingForwarder:
    """A process (FORWARDER_CODE) listening on ``ip`` that forwards each
    connection to ``target`` with ``os.splice`` through a pipe each way;
    :meth:`a_to_b` asks it for the bytes it forwarded from the connecting
    side so far."""

    def __init__(self, ip: str, target: tuple[str, int]) -> None:
        self.proc = subprocess.Popen(PY + [FORWARDER_CODE, ip, target[0], str(target[1])],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())

    def a_to_b(self) -> int:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


def receive(addr: tuple[str, int], n: int, bind_ip: str, warmup: float, window: float,
            mark) -> tuple[list[int], float, tuple]:
    """Connect ``n`` receivers to ``addr``, read them all for ``warmup`` then
    ``window`` seconds; (bytes per receiver in the window, its seconds, (mark()
    at its start, mark() at its end))."""
    socks = [socket.create_connection(addr, timeout=10, source_address=(bind_ip, 0)) for _ in range(n)]
    ep = select.epoll()
    counts = [0] * n
    buf = bytearray(READ)
    try:
        for s in socks:
            s.setblocking(False)
            ep.register(s.fileno(), select.EPOLLIN)
        by_fd = {s.fileno(): i for i, s in enumerate(socks)}
        t0 = time.monotonic()
        start = t0 + warmup
        end = start + window
        marks = []
        now = t0
        while now < end:
            if not marks and now >= start:
                marks.append(mark())
                counts = [0] * n
            for fd, _ in ep.poll(0.05):
                with contextlib.suppress(BlockingIOError):
                    k = socks[by_fd[fd]].recv_into(buf)
                    counts[by_fd[fd]] += k
                    if not k:
                        ep.unregister(fd)
            now = time.monotonic()
        marks.append(mark())
        return counts, now - start, tuple(marks)
    finally:
        ep.close()
        for s in socks:
            s.close()


def baseline(src: tuple[str, int], n: int, ip: str, bind_ip: str, warmup: float, window: float,
             cpu) -> tuple[float, float]:
    """Delivered bytes per second of all receivers through the minimal fan-out,
    and the CPU seconds its process spent per GB delivered (``cpu(pid)``: its
    CPU seconds so far)."""
    p, port = spawn(BASELINE_CODE, ip, src[0], src[1], n)
    try:
        counts, secs, (c0, c1) = receive((ip, port), n, bind_ip, warmup, window, lambda: cpu(p.pid))
    finally:
        stop(p)
    return sum(counts) / secs, (c1 - c0) / max(sum(counts) / 1e9, 1e-9)


def minimal_chain(src: tuple[str, int], n: int, relay: tuple[str, ...], ip: str, bind_ip: str,
                  warmup: float, window: float, cpu) -> tuple[float, float]:
    """The routed path's shape built of minimal processes: a one-way copy relay
    (``relay``: its code and arguments after the listening address, the
    source's address first), a :class:`CountingForwarder`, and the minimal
    fan-out to ``n`` receivers. No framing, no queues, no drops: the source is
    held back by blocking writes. Delivered bytes per second of all
    receivers, and the CPU seconds per GB delivered of its three processes."""
    code, *args = relay
    relay_p, relay_port = spawn(code, ip, src[0], src[1], *args)
    fwd = CountingForwarder(ip, (ip, relay_port))
    fan_p, fan_port = spawn(BASELINE_CODE, ip, ip, fwd.port, n)
    procs = (relay_p, fwd.proc, fan_p)
    try:
        counts, secs, (c0, c1) = receive((ip, fan_port), n, bind_ip, warmup, window,
                                         lambda: sum(cpu(p.pid) for p in procs))
    finally:  # from the source's side: each process sees its upstream close, not a reset downstream
        stop(relay_p)
        fwd.close()
        stop(fan_p)
    return sum(counts) / secs, (c1 - c0) / max(sum(counts) / 1e9, 1e-9)

