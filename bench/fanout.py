"""The fan-out measurement of bench/router.py (section 5): one live LBMC source
in TRD1, N receivers in TRD2, through the router pair (fan-out on, the
default) and through a minimal fan-out process that reads the source's one
socket and writes every read to N sockets, in the same run.

* The source (SOURCE_CODE, a process of its own) sends a 4 MiB run of LBMC
  data messages over and over to each connection, paced to a rate in bytes
  per second or as fast as the socket takes it (rate 0).
* The receivers are sockets of this process read by one epoll loop
  (``recv_into``, bytes counted, not checked: tests/test_router_fanout.py
  checks them), read from the start, measured over a window after a
  warm-up.
* The link between the routers goes through :class:`CountingForwarder`
  (threads of this process, ``os.splice`` through a pipe each way), which
  counts the bytes from router A (the sources' side) to router B.

Per N: link bytes / the bytes of the receiver that got the most (paced
source: nobody falls behind, so no drops blur the ratio), and delivered bytes
per second of all receivers, routed against the minimal fan-out (source as
fast as it goes).
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import threading
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


class CountingForwarder:
    """Listens on ``ip``; each connection is forwarded to ``target`` with
    ``os.splice``; ``a_to_b`` counts the bytes from the connecting side."""

    def __init__(self, ip: str, target: tuple[str, int]) -> None:
        self.target = target
        self.a_to_b = 0
        self.ls = socket.create_server((ip, 0), backlog=4)
        self.port = self.ls.getsockname()[1]
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                a, _ = self.ls.accept()
                b = socket.create_connection(self.target)
            except OSError:
                return
            self.socks += [a, b]
            threading.Thread(target=self._pump, args=(a, b, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(b, a, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        r, w = os.pipe()
        try:
            while k := os.splice(src.fileno(), w, 1 << 20):
                if count:
                    self.a_to_b += k
                while k:
                    k -= os.splice(r, dst.fileno(), k)
        except OSError:
            pass
        finally:
            os.close(r)
            os.close(w)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.ls.close()
        for s in self.socks:
            s.close()


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


def baseline(src: tuple[str, int], n: int, ip: str, bind_ip: str, warmup: float, window: float) -> float:
    """Delivered bytes per second of all receivers through the minimal fan-out."""
    p, port = spawn(BASELINE_CODE, ip, src[0], src[1], n)
    try:
        counts, secs, _ = receive((ip, port), n, bind_ip, warmup, window, lambda: 0)
    finally:
        stop(p)
    return sum(counts) / secs
