"""The lbmrd command line, as a user runs it: real processes, real sockets."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from lbmrd.cli import main

from .helpers import LBMRD, free_port

ROOT = Path(__file__).resolve().parents[1]




def test_dump_dtd(capsys):
    assert main(["-d"]) == 0
    out = capsys.readouterr().out
    assert "<!ELEMENT lbmrd" in out and "<!ATTLIST transform" in out


@pytest.mark.parametrize("name", ["lbmrd.xml", "lbmrd-dummy.xml", "lbmrd-nat-example.xml"])
def test_validate_shipped_configs(name, capsys):
    assert main(["-v", str(ROOT / "configs" / name)]) == 0
    assert "valid" in capsys.readouterr().out


def test_validate_reports_file_line_and_exits_1(tmp_path, capsys):
    bad = tmp_path / "bad.xml"
    bad.write_text('<?xml version="1.0"?>\n<lbmrd version="1.0">\n  <daemon>\n    <port>70000</port>\n'
                   "  </daemon>\n</lbmrd>\n")
    assert main(["-v", "--strict", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:" in err
    assert main(["-v"]) == 2  # -v needs a file
    assert main(["-v", str(tmp_path / "missing.xml")]) == 1


def test_usage_errors_exit_2():
    for argv in (["-p", "70000"], ["-t", "abc"], ["--bogus"], ["-i", "203.0.113.77"]):
        r = subprocess.run(LBMRD + argv, capture_output=True, text=True, timeout=30)
        assert r.returncode == 2, (argv, r.stdout, r.stderr)


def test_bind_failure_exits_3():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    try:
        r = subprocess.run(LBMRD + ["-i", "127.0.0.1", "-p", str(port)], capture_output=True,
                           text=True, timeout=30)
    finally:
        s.close()
    assert r.returncode == 3 and "Address already in use" in r.stdout
    assert f"UDP 127.0.0.1:{port}" in r.stdout, r.stdout


def _wait_http(url: str, deadline: float, proc: subprocess.Popen | None = None) -> str:
    """The body at ``url`` once it answers; fails at ``deadline``, or at once with what
    ``proc`` (the daemon serving it) printed if it exited first."""
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                return r.read().decode()
        except OSError:
            if proc is not None and proc.poll() is not None:
                out = proc.stdout.read() if proc.stdout is not None else ""
                raise AssertionError(f"the daemon exited with {proc.returncode} before serving {url}: {out}") from None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_daemon_process_signals_metrics_and_json_log(tmp_path):
    port, mport = free_port(), free_port(socket.SOCK_STREAM)
    cfg = tmp_path / "lbmrd.xml"
    cfg.write_text((ROOT / "configs" / "lbmrd-dummy.xml").read_text())
    log = tmp_path / "lbmrd.log"
    p = subprocess.Popen(LBMRD + ["-i", "127.0.0.1", "-p", str(port), "-L", str(log), "--log-format", "json",
                                  "--metrics", f"127.0.0.1:{mport}", str(cfg)])
    try:
        _wait_http(f"http://127.0.0.1:{mport}/metrics", time.monotonic() + 20, p)
        c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        c.bind(("127.0.0.1", 0))
        c.settimeout(5)
        c.sendto(b"\x02\x00\x00\x00", ("127.0.0.1", port))
        data, src = c.recvfrom(100)
        assert data == b"\x00\x00\x00\x00" and src == ("127.0.0.1", port)
        c.close()
        p.send_signal(signal.SIGUSR1)
        p.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "configuration reloaded" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    msgs = [x["msg"] for x in lines]
    assert all(x["ts"].endswith("Z") for x in lines)  # UTC
    assert any(m.startswith("Using interface [127.0.0.1]") for m in msgs)
    dump = next(m for m in msgs if m.startswith("dump "))
    snap = json.loads(dump[5:])
    assert snap["clients"][0]["addr"].startswith("127.0.0.1:") and snap["events"][0]["event"] == "client_added"
    assert any("configuration reloaded" in m for m in msgs)
    assert any("stopping (SIGTERM)" in m for m in msgs)


def test_systemd_unit_uses_valid_options():
    from lbmrd.cli import build_parser

    unit = (ROOT / "configs" / "lbmrd.service").read_text()
    execs = [line.split("=", 1)[1].split() for line in unit.splitlines()
             if line.startswith(("ExecStart=", "ExecStartPre="))]
    assert len(execs) == 2
    for argv in execs:
        assert argv[0].endswith("/lbmrd")
        build_parser().parse_args(argv[1:])  # exits 2 on an unknown option


def test_sigint_stops_cleanly_and_busy_metrics_port_exits_3(tmp_path):
    port = free_port()
    p = subprocess.Popen(LBMRD + ["-i", "127.0.0.1", "-p", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        c.settimeout(0.2)
        deadline = time.monotonic() + 20
        while True:  # wait until it answers
            c.sendto(b"\x02\x00\x00\x00", ("127.0.0.1", port))
            try:
                c.recvfrom(16)
                break
            except TimeoutError:
                assert time.monotonic() < deadline
        c.close()
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=10) == 0
        assert "stopping (SIGINT)" in p.stdout.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    mport = busy.getsockname()[1]
    try:
        r = subprocess.run(LBMRD + ["-i", "127.0.0.1", "-p", str(free_port()), "--metrics",
                                    f"127.0.0.1:{mport}"], capture_output=True, text=True, timeout=30)
    finally:
        busy.close()
    assert r.returncode == 3, r.stdout
    errors = [line for line in r.stdout.splitlines() if "socket error" in line]
    assert len(errors) == 1, r.stdout
    assert f"HTTP endpoint 127.0.0.1:{mport}" in errors[0] and "Address already in use" in errors[0]


def test_stats_interval_must_not_be_negative_and_open_metrics_warns():
    r = subprocess.run(LBMRD + ["--stats-interval", "-1"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "must be 0 (off) or a positive number of seconds" in r.stderr
    r = subprocess.run(LBMRD + ["--stats-interval", "1e-9"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    r = subprocess.run(LBMRD + ["--peer-daemon", "10.0.0.300"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    port, mport = free_port(), free_port(socket.SOCK_STREAM)
    p = subprocess.Popen(LBMRD + ["-i", "127.0.0.1", "-p", str(port), "--metrics", f"0.0.0.0:{mport}",
                                  "--peer-daemon", "127.0.0.2:15380", "--ip-rate-limit", "100"],
                         stdout=subprocess.PIPE, text=True)
    try:
        _wait_http(f"http://127.0.0.1:{mport}/metrics", time.monotonic() + 20, p)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == 0
        out = p.stdout.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "serves the client table (every client's address) on all interfaces" in out
    assert "final stats clients=0" in out
