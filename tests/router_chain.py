"""lbmrds and lbmr-routers as processes on loopback, for the pages' tests
(:class:`RouterChain`)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from tests.helpers import (
    LBMRD,
    ROUTER,
    acceptor_xml,
    endpoint_xml,
    free_port,
    initiator_xml,
    peer_xml,
    router_xml,
)


class RouterChain:
    """lbmrds and lbmr-routers as processes on loopback, for the pages'
    tests and benchmarks: router ``r{i}`` (i from 1) in domain i, its TRD an
    lbmrd on 127.0.i.1 (a free port), its ``<metrics>`` endpoint on
    127.0.0.1 (a free port; ``metrics_extra``: more ``<metrics>`` attributes
    and ``daemon_extra``: more ``<daemon>`` elements after it), each linked
    to the next (``r{i}`` initiator, ``r{i+1}`` acceptor, on 127.0.0.1).
    ``spare_acceptors``: router name -> extra acceptor peer portals (their
    listen ports in ``spare_ports``), for a test's own peer. Logs in ``tmp``."""

    def __init__(self, tmp: Path, n: int, *, spare_acceptors: dict[str, int] | None = None,
                 metrics_extra: str = "", daemon_extra: str = "") -> None:

        self.tmp, self.n = tmp, n
        self.procs: list = []
        self.by_name: dict = {}  # process name (r1, lbmrd1, a spawned one's) -> its Popen
        self.lbmrd = {i: (f"127.0.{i}.1", free_port(socket.SOCK_DGRAM, f"127.0.{i}.1")) for i in range(1, n + 1)}
        self.metrics = {f"r{i}": free_port(socket.SOCK_STREAM) for i in range(1, n + 1)}
        link_ports = {i: free_port(socket.SOCK_STREAM) for i in range(2, n + 1)}  # r{i} accepts r{i-1}
        self.spare_ports: dict[str, list[int]] = {}
        try:
            for i, (ip, port) in self.lbmrd.items():
                self._spawn(f"lbmrd{i}", LBMRD + ["-i", ip, "-p", str(port), "--stats-interval", "0"])
            for i in range(1, n + 1):
                ip, lport = self.lbmrd[i]
                tr = (f'<topic-resolution>\n        <interface>{ip}</interface>\n'
                      f'        <lbmrd address="{ip}" port="{lport}"/>\n      </topic-resolution>')
                # proxies' ports: 40 a router, 200 a test process (by its pid, so that runs side by
                # side differ), below 65536 whatever the pid (pid % 200 once gave 66640)
                low = 30000 + 40 * i + (os.getpid() % 170) * 200
                peers = []
                if i > 1:
                    peers.append(peer_xml(f"{i}-from-{i - 1}", "127.0.0.1", acceptor_xml(link_ports[i])))
                if i < n:
                    peers.append(peer_xml(f"{i}-to-{i + 1}", "127.0.0.1",
                                          initiator_xml("127.0.0.1", link_ports[i + 1], 300)))
                for k in range((spare_acceptors or {}).get(f"r{i}", 0)):
                    p = free_port(socket.SOCK_STREAM)
                    self.spare_ports.setdefault(f"r{i}", []).append(p)
                    peers.append(peer_xml(f"{i}-spare-{k}", "127.0.0.1", acceptor_xml(p)))
                daemon = (f"\n    <metrics{metrics_extra}>127.0.0.1:{self.metrics[f'r{i}']}</metrics>"
                          f"{daemon_extra}")
                cfg = tmp / f"r{i}.xml"
                cfg.write_text(router_xml(f"r{i}", [endpoint_xml(f"T{i}", i, ip, tr=tr, relay=(low, low + 39))],
                                          peers, daemon=daemon), encoding="utf-8")
                self._spawn(f"r{i}", ROUTER + [str(cfg)])
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, argv: list[str]) -> None:
        import subprocess

        log = open(self.tmp / f"{name}.log", "wb")
        self.procs.append((subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), log))
        self.by_name[name] = self.procs[-1][0]

    def spawn(self, name: str, argv: list[str]) -> None:
        """One more process of the test's (stopped with the others)."""
        self._spawn(name, argv)

    def end(self, name: str) -> None:
        """Stop one process (SIGTERM, then SIGKILL after 10 s)."""
        import subprocess

        p = self.by_name[name]
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def base(self, router: str, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.metrics[router]}"

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for p, _ in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p, log in self.procs:
            try:
                p.wait(10)
            except Exception:  # noqa: BLE001 - a process that ignores SIGTERM
                p.kill()
                p.wait()
            log.close()
        self.procs = []
