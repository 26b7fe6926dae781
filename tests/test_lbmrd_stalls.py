"""lbmrd under work that used to stop its loop: mass expiry, huge fan-outs,
reloads of big files, running out of descriptors. The assertions are about
order (was a keepalive answered while the big job was still under way?),
not about time; bench/relay.py measures the round trips."""

from __future__ import annotations

import json
import logging
import resource
import socket
import subprocess
import time

import trio

import lbmr_proto as L
from lbmrd.config import load_config
from lbmrd.server import FANOUT_CHUNK, SWEEP_SLICE, Daemon, Settings
from tests.lbmrd_networks import networks_file

from .helpers import LBMRD, free_port

TQR = L.encode(L.Packet(0, 1, tqrs=[L.TQR("md.X")]))
KA = b"\x02\x00\x00\x00"


def client(ip="127.0.0.1") -> trio.socket.SocketType:
    s = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    s._sock.bind((ip, 0))
    return s


def fake_clients(d: Daemon, n: int, now: float) -> None:
    """Register ``n`` clients on loopback ports nobody listens on (core only)."""
    for i in range(n):
        d.core.handle(KA, (f"127.9.{i >> 8 & 255}.{i & 255}", 20000 + (i >> 16)), now)


async def test_mass_expiry_runs_in_slices_and_keepalives_are_answered_meanwhile():
    n = 8 * SWEEP_SLICE
    async with trio.open_nursery() as nursery:
        d = Daemon(Settings(bind_ip="127.0.0.1", port=0, stats_interval=0, activity_ms=100, ttl_s=0.05))
        daemon = await nursery.start(d.run)
        fake_clients(d, n, trio.current_time())
        c = client()
        sizes = []
        with trio.fail_after(20):
            while not sizes or sizes[-1] > 1:
                await c.sendto(KA, daemon)
                await c.recvfrom(16)
                sizes.append(len(d.core.table))
        # answered while the sweep was between its first and its last slice
        assert any(1 < s < n + 1 for s in sizes), sizes[:5]
        assert d.core.table.get(c.getsockname()) is not None  # the live client stays
        assert d.core.counters.clients_expired == n
        nursery.cancel_scope.cancel()


async def test_a_keepalive_is_answered_in_the_middle_of_a_huge_fan_out():
    n = 5 * FANOUT_CHUNK
    async with trio.open_nursery() as nursery:
        d = Daemon(Settings(bind_ip="127.0.0.1", port=0, stats_interval=0))
        daemon = await nursery.start(d.run)
        fake_clients(d, n, trio.current_time())
        sender, c = client(), client()
        await c.sendto(KA, daemon)
        await c.recvfrom(16)
        await sender.sendto(TQR, daemon)
        with trio.fail_after(20):
            while not d._fanning:  # the fan-out has paused after its first chunk
                await trio.sleep(0)
        await c.sendto(KA, daemon)
        with trio.fail_after(20):
            while True:
                data, _ = await c.recvfrom(65535)
                if data == b"\x00\x00\x00\x00":
                    break
        assert d._fanning, "the reply waited for the whole fan-out"
        with trio.fail_after(20):
            data, _ = await c.recvfrom(65535)  # and the TQR itself still reaches c
        assert data == TQR
        nursery.cancel_scope.cancel()


async def test_reload_of_a_big_file_does_not_stop_the_relay(tmp_path):
    path = tmp_path / "big.xml"
    path.write_text(networks_file(50_000))
    async with trio.open_nursery() as nursery:
        d = Daemon(Settings(bind_ip="127.0.0.1", port=0, stats_interval=0), None,
                   reload=lambda: load_config(path))
        daemon = await nursery.start(d.run)
        c = client()
        done = trio.Event()
        answered_during = 0

        async def reload():
            assert await d.reload()
            done.set()

        nursery.start_soon(reload)
        with trio.fail_after(60):
            while not done.is_set():
                await c.sendto(KA, daemon)
                await c.recvfrom(16)
                answered_during += not done.is_set()
                await trio.sleep(0.005)
        assert answered_during >= 2  # the parse ran beside the relay
        assert len(d.core.config.domains) == 50
        nursery.cancel_scope.cancel()


async def test_reload_applies_ttl_and_activity_and_warns_about_the_rest(caplog):
    from lbmrd.config import Config, DaemonSettings

    caplog.set_level(logging.INFO, logger="lbmrd")
    logger = logging.getLogger("lbmrd")
    logger.addHandler(caplog.handler)  # also when an earlier test turned propagation off
    cfg = Config.empty()
    new = Settings(bind_ip="127.0.0.1", port=15999, ttl_s=7.0, activity_ms=500)
    async with trio.open_nursery() as nursery:
        d = Daemon(Settings(bind_ip="127.0.0.1", port=0, stats_interval=0), cfg,
                   reload=lambda: (Config("x", DaemonSettings(ttl_s=7.0)), new))
        await nursery.start(d.run)
        assert await d.reload()
        assert d.core.table.ttl == 7.0 and d.settings.activity_ms == 500
        nursery.cancel_scope.cancel()
    logger.removeHandler(caplog.handler)
    msgs = [r.getMessage() for r in caplog.records]
    assert any("ttl_s changed from 60.0 to 7.0 (applied)" in m for m in msgs)
    assert any("port changed from 0 to 15999: takes effect only after a restart" in m for m in msgs)






def test_out_of_descriptors_logs_one_line_not_tracebacks(tmp_path):
    """The metrics endpoint with 48 descriptors and 200 idle connections: accept
    fails with EMFILE; the log stays JSON, says so once, and the daemon lives."""
    port, mport = free_port(), free_port(socket.SOCK_STREAM)
    log = tmp_path / "lbmrd.log"

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))

    p = subprocess.Popen(LBMRD + ["-i", "127.0.0.1", "-p", str(port), "-L", str(log), "--log-format",
                                  "json", "--metrics", f"127.0.0.1:{mport}"],
                         stderr=subprocess.PIPE, text=True, preexec_fn=limit)
    conns = []
    try:
        deadline = time.monotonic() + 20
        while "metrics on" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.05)
        for _ in range(200):
            s = socket.socket()
            s.settimeout(5)
            s.connect(("127.0.0.1", mport))
            conns.append(s)
        time.sleep(1.0)
        for s in conns:
            s.close()
        conns = []
        c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        c.settimeout(5)
        c.sendto(KA, ("127.0.0.1", port))
        assert c.recvfrom(16)[0] == b"\x00\x00\x00\x00"
        c.close()
        deadline = time.monotonic() + 20
        while True:  # the endpoint recovers once descriptors are free again
            try:
                with socket.create_connection(("127.0.0.1", mport), timeout=5) as s:
                    s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                    if b"lbmrd_clients 1" in s.recv(65536):
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.2)
        p.terminate()
        assert p.wait(timeout=10) == 0
    finally:
        for s in conns:
            s.close()
        if p.poll() is None:
            p.kill()
            p.wait()
    err = p.stderr.read()
    assert "Traceback" not in err and "EMFILE" not in err, err[:2000]
    lines = [json.loads(line) for line in log.read_text().splitlines()]  # all JSON
    emfile = [x for x in lines if "cannot accept connections" in x["msg"]]
    assert 1 <= len(emfile) <= 3, emfile
    assert any(x["msg"].startswith("stopping (SIGTERM); final stats clients=1") for x in lines)


def hub_config(domains: int) -> str:
    """d0 plus ``domains`` other domains on loopback, a transform from d0 to each."""
    nets = "".join(f'<domain name="d{i}"><network>127.{10 + i}.0.0/16</network></domain>\n'
                   for i in range(domains + 1))
    rules = "".join(f'<transform source="d0" destination="d{i}"><rule><match address="127.10.0.1" '
                    f'port="*"/><replace address="127.{10 + i}.0.1" port="*"/></rule></transform>\n'
                    for i in range(1, domains + 1))
    return (f'<?xml version="1.0"?>\n<lbmrd version="1.0">\n<domains>\n{nets}</domains>\n'
            f"<transformations>\n{rules}</transformations>\n</lbmrd>\n")


async def test_a_keepalive_is_answered_while_nat_copies_are_made():
    """One datagram of many TIRs from a hub domain to 60 others: the copies
    are made group by group, and the loop answers keepalives in between."""
    from lbmrd.config import parse_config

    domains = 60
    cfg = parse_config(hub_config(domains), "hub.xml")
    tirs = [L.TIR(f"t{i}", L.TcpTransport("127.10.0.1", 14371), 16, i) for i in range(400)]
    big = L.encode(L.Packet(0, 1, tirs=tirs))
    async with trio.open_nursery() as nursery:
        d = Daemon(Settings(bind_ip="127.0.0.1", port=0, stats_interval=0), cfg)
        daemon = await nursery.start(d.run)
        for i in range(1, domains + 1):  # one client in each destination domain
            d.core.handle(KA, (f"127.{10 + i}.0.9", 20000), trio.current_time())
        sender, c = client("127.10.0.1"), client("127.10.0.2")
        await c.sendto(KA, daemon)
        await c.recvfrom(16)
        await sender.sendto(big, daemon)
        with trio.fail_after(20):
            while not d._fanning:
                await trio.sleep(0)
        await c.sendto(KA, daemon)
        with trio.fail_after(20):
            while (await c.recvfrom(65535))[0] != b"\x00\x00\x00\x00":
                pass
        assert d._fanning, "the reply waited for every domain's copy"
        with trio.fail_after(20):
            while d._fanning:
                await trio.sleep(0.01)
        assert d.core.counters.nat_rewrites == domains
        nursery.cancel_scope.cancel()


async def test_reload_re_classifies_clients_in_slices(tmp_path):
    from lbmrd.config import parse_config

    n = 4 * SWEEP_SLICE
    path = tmp_path / "hub.xml"
    path.write_text(hub_config(2))
    async with trio.open_nursery() as nursery:
        d = Daemon(Settings(bind_ip="127.0.0.1", port=0, stats_interval=0),
                   parse_config(hub_config(1), "hub.xml"), reload=lambda: load_config(path))
        daemon = await nursery.start(d.run)
        for i in range(n):  # clients in 127.12/16: no domain yet, d2 after the reload
            d.core.handle(KA, (f"127.12.{i >> 8}.{i & 255}", 20000), trio.current_time())
        c = client()
        await c.sendto(KA, daemon)
        await c.recvfrom(16)
        assert await d.reload()
        assert d._regroup is not None  # more than one slice to go
        await c.sendto(KA, daemon)
        await c.recvfrom(16)
        with trio.fail_after(20):
            while d._regroup is not None:
                await trio.sleep(0.01)
        assert sorted({cl.domain for cl in d.core.table}, key=str) == [None, "d2"]
        assert sum(cl.domain == "d2" for cl in d.core.table) == n
        nursery.cancel_scope.cancel()
