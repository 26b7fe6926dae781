"""Who may read a daemon's HTTP endpoint (issue 25, part 2): the token (from
a file; ``Authorization: Bearer`` or the password of basic authentication)
and TLS (lbmrd: ``--metrics-token-file``, ``--metrics-cert``/``--metrics-key``;
lbmr-router: ``<metrics token-file>`` and ``<metrics-tls>``, the peer's
certificate elements, ``<trusted-certificates>`` asking clients for theirs).

Refused without the token, served with it: the page (in Debian's headless
chromium, over HTTPS with the credentials a person types), its JSON, and a
Prometheus scrape of ``/metrics``. Bad values: a clear error naming the
file and the problem, exit status 2 (lbmrd) or a configuration error at its
line (lbmr-router). A loopback endpoint answers only requests naming it by
address or localhost (a web page's host name re-pointed at 127.0.0.1 reads
nothing).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from playwright.sync_api import Error as PlaywrightError

from router.config import ConfigError, load_config
from tests.browser import MonitorPage, check_page_basics, headless_chromium
from tests.certificates import make_ca, make_cert
from tests.helpers import LBMRD, acceptor_xml, endpoint_xml, free_port, peer_xml, router_xml
from tests.router_chain import RouterChain

TOKEN = "s3cr3t-monitor-token-0123456789"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pki")
    ca = make_ca(tmp, "ca")
    server = make_cert(tmp, "server", ca)
    client = make_cert(tmp, "client", ca, san="DNS:operator")
    token = tmp / "monitor.token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    return {"tmp": tmp, "ca": ca[1], "server": server, "client": client, "token": str(token)}


def fetch(url: str, *, token: str | None = None, basic: str | None = None, ca: str | None = None,
          client: tuple[str, str] | None = None, host: str | None = None) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    if basic is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(basic.encode()).decode())
    if host is not None:
        req.add_header("Host", host)
    ctx = None
    if url.startswith("https"):
        ctx = ssl.create_default_context(cafile=ca)
        if client is not None:
            ctx.load_cert_chain(*client)
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def start_lbmrd(tmp, *extra: str) -> tuple[subprocess.Popen, int]:
    port = free_port(socket.SOCK_STREAM)
    log = open(tmp / f"lbmrd-{port}.log", "wb")
    p = subprocess.Popen(LBMRD + ["-i", "127.0.0.1", "-p", str(free_port()), "--stats-interval", "0",
                                  "--metrics", f"127.0.0.1:{port}", *extra], stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return p, port


def wait_listening(port: int, proc: subprocess.Popen) -> None:
    end = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert proc.poll() is None and time.monotonic() < end
            time.sleep(0.1)


browser = headless_chromium  # the fixture


def test_lbmrd_token_and_tls(pki, tmp_path, browser):
    p, port = start_lbmrd(tmp_path, "--metrics-token-file", pki["token"], "--metrics-cert", pki["server"][0],
                          "--metrics-key", pki["server"][1])
    base = f"https://127.0.0.1:{port}"
    try:
        wait_listening(port, p)
        # plain HTTP gets no answer from a TLS endpoint
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            fetch(f"http://127.0.0.1:{port}/metrics")
        for path in ("/", "/api/summary", "/api/clients", "/metrics", "/status", "/static/lbmrd.js"):
            for kw in ({}, {"token": "wrong-token-wrong-token"}, {"basic": "x:" + TOKEN[:-1]},
                       {"token": TOKEN + "x"}, {"basic": "not base64!"}):
                status, headers, body = fetch(base + path, ca=pki["ca"], **kw)
                assert status == 401 and b"token" in body, (path, kw, status)
                assert headers["WWW-Authenticate"].startswith('Basic realm="lbmr-kit monitor"')
                assert "lbmrd" not in body.decode() and len(body) < 100
        # a scrape with the token, as Prometheus sends it (authorization: credentials_file), while
        # 100 connections sit idle without a TLS handshake: the oldest idle ones are closed for it
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(100)]
        try:
            status, headers, body = fetch(base + "/metrics", ca=pki["ca"], token=TOKEN)
        finally:
            for s in idle:
                s.close()
        assert status == 200 and b"lbmrd_clients 0" in body and headers["Content-Type"].startswith("text/plain")
        assert fetch(base + "/api/summary", ca=pki["ca"], basic="anyone:" + TOKEN)[0] == 200
        # the page, as a person opens it: the browser asks for the credentials
        page = MonitorPage(browser, base, credentials=("operator", TOKEN), ignore_https_errors=True).open()
        try:
            check_page_basics(page)
            assert page.js("() => document.title").startswith("lbmrd 127.0.0.1:")
        finally:
            page.close()
        # without them: the browser is refused (Playwright has nothing to answer the challenge with)
        page = MonitorPage(browser, base, ignore_https_errors=True)
        try:
            with pytest.raises(PlaywrightError, match="ERR_INVALID_AUTH_CREDENTIALS"):
                page.page.goto(base + "/")
            assert page.context.request.get(base + "/api/summary").status == 401
        finally:
            page.close()
    finally:
        p.terminate()
        p.wait(10)


def test_lbmrd_without_token_answers_loopback_names_only(tmp_path):
    p, port = start_lbmrd(tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_listening(port, p)
        assert fetch(base + "/metrics")[0] == 200
        assert fetch(base + "/metrics", host=f"localhost:{port}")[0] == 200
        assert fetch(base + "/metrics", host=f"127.0.0.1:{port}")[0] == 200
        status, _, body = fetch(base + "/api/summary", host=f"rebound.example.com:{port}")
        assert status == 421 and b"loopback" in body
    finally:
        p.terminate()
        p.wait(10)


@pytest.mark.parametrize("args, needles", [
    (["--metrics-token-file", "/nonexistent/token"], ["token file /nonexistent/token", "No such file"]),
    (["--metrics-token-file", "SHORT"], ["token file", "at least 16 characters (got 5)"]),
    (["--metrics-token-file", "SPACES"], ["printable ASCII without spaces"]),
    (["--metrics-token-file", "EMPTY"], ["at least 16 characters (got 0)"]),
    (["--metrics-token-file", "HUGE"], ["longer than 4096 bytes"]),
    (["--metrics-cert", "CERT"], ["--metrics-cert and --metrics-key go together"]),
    (["--metrics-cert", "CERT", "--metrics-key", "/nonexistent/key"], ["/nonexistent/key", "no such file"]),
    (["--metrics-cert", "TOKEN", "--metrics-key", "KEY"], ["cannot be used"]),
])
def test_lbmrd_bad_token_or_tls_files_are_named(pki, tmp_path, args, needles):
    files = {"SHORT": "short", "SPACES": "a token with spaces in it", "EMPTY": "\n", "HUGE": "x" * 5000}
    subst = {"CERT": pki["server"][0], "KEY": pki["server"][1], "TOKEN": pki["token"]}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        subst[name] = str(tmp_path / name)
    argv = [subst.get(a, a) for a in args]
    r = subprocess.run(LBMRD + ["-i", "127.0.0.1", "-p", str(free_port()), "--metrics",
                                f"127.0.0.1:{free_port(socket.SOCK_STREAM)}", *argv],
                       capture_output=True, text=True, timeout=30)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    for n in needles:
        assert n in out, (n, out)
    assert "Traceback" not in out


def test_lbmrd_access_options_need_metrics(pki):
    r = subprocess.run(LBMRD + ["-i", "127.0.0.1", "-p", str(free_port()), "--metrics-token-file", pki["token"]],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--metrics-token-file needs --metrics ADDR:PORT" in r.stdout + r.stderr
    help_text = subprocess.run(LBMRD + ["--help"], capture_output=True, text=True, timeout=30).stdout
    for opt in ("--metrics-token-file FILE", "--metrics-cert FILE", "--metrics-key FILE"):
        assert opt in help_text


def test_router_token_and_mutual_tls(pki, tmp_path):
    tls = (f"\n    <metrics-tls><certificate>{pki['server'][0]}</certificate>"
           f"<certificate-key>{pki['server'][1]}</certificate-key>"
           f"<trusted-certificates>{pki['ca']}</trusted-certificates></metrics-tls>")
    chain = RouterChain(tmp_path, 2, metrics_extra=f' token-file="{pki["token"]}"', daemon_extra=tls)
    try:
        base = chain.base("r1", "https")
        end = time.monotonic() + 30
        while True:
            try:
                status, _, body = fetch(base + "/metrics", ca=pki["ca"], client=pki["client"], token=TOKEN)
                if status == 200 and b'lbmr_router_peer_up 1' in body:
                    break
            except OSError:
                pass
            assert time.monotonic() < end, chain.log("r1")[-2000:]
            time.sleep(0.2)
        # a client without a certificate: the handshake fails
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            fetch(base + "/metrics", ca=pki["ca"], token=TOKEN)
        # a certificate without the token: refused
        for path in ("/metrics", "/", "/api/router", "/api/sessions", "/status"):
            status, _, body = fetch(base + path, ca=pki["ca"], client=pki["client"])
            assert status == 401 and b"r1" not in body
        router = json.loads(fetch(base + "/api/router", ca=pki["ca"], client=pki["client"],
                                  basic="ops:" + TOKEN)[2])
        assert router["router"]["name"] == "r1"
        assert "monitor and metrics on https://127.0.0.1:" in chain.log("r1")
        assert "token required" in chain.log("r1")
    finally:
        chain.stop()


def _router_file(tmp_path, metrics: str, daemon_extra: str = "") -> str:
    text = router_xml("rx", [endpoint_xml("T1", 1, "127.0.1.1")],
                      [peer_xml("p", "127.0.0.1", acceptor_xml(free_port(socket.SOCK_STREAM)))],
                      daemon=f"\n    {metrics}{daemon_extra}")
    path = tmp_path / "rx.xml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("metrics, extra, needles", [
    ('<metrics token-file="missing.token">127.0.0.1:9390</metrics>', "",
     ["<metrics> token file", "missing.token", "No such file"]),
    ('<metrics token-file="short.token">127.0.0.1:9390</metrics>', "", ["at least 16 characters (got 5)"]),
    ('<metrics token-file="">127.0.0.1:9390</metrics>', "", ["token-file is empty"]),
    ("", "<metrics-tls><certificate>s.pem</certificate><certificate-key>s.key</certificate-key></metrics-tls>",
     ["<metrics-tls> without <metrics>"]),
    ("<metrics>127.0.0.1:9390</metrics>",
     "<metrics-tls><certificate>nope.pem</certificate><certificate-key>s.key</certificate-key></metrics-tls>",
     ["nope.pem", "does not exist"]),
    ("<metrics>127.0.0.1:9390</metrics>", "<metrics-tls><certificate>s.pem</certificate></metrics-tls>",
     ["metrics-tls"]),
])
def test_router_bad_monitor_access_is_a_config_error_at_its_line(pki, tmp_path, metrics, extra, needles):
    (tmp_path / "short.token").write_text("short")
    os.symlink(pki["server"][0], tmp_path / "s.pem")
    os.symlink(pki["server"][1], tmp_path / "s.key")
    path = _router_file(tmp_path, metrics, extra)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert text.startswith(f"{path}:4: ") or text.startswith(f"{path}:5: "), text
    for n in needles:
        assert n in text, (n, text)


def test_router_monitor_access_in_the_config(pki, tmp_path):
    tls = (f"<metrics-tls><certificate>{pki['server'][0]}</certificate>"
           f"<certificate-key>{pki['server'][1]}</certificate-key></metrics-tls>")
    cfg = load_config(_router_file(tmp_path, f'<metrics token-file="{pki["token"]}">10.1.2.3:9390</metrics>', tls))
    assert cfg.monitor.token_file == pki["token"] and cfg.monitor.tls.certificate == pki["server"][0]
    assert cfg.monitor.tls.trusted_certificates is None
    assert not any("no authentication" in w for _, w in cfg.warnings)  # a token: no warning
    cfg = load_config(_router_file(tmp_path, "<metrics>10.1.2.3:9390</metrics>"))
    assert any("no authentication" in w for _, w in cfg.warnings)
