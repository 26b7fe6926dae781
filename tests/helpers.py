"""Set-up shared by several test modules: commands, free ports, config-file
helpers, and a driver for sans-IO objects with deadlines."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: lbmrd as a process, from this checkout (no installed script needed)
LBMRD = [sys.executable, "-c", "import sys; from lbmrd.cli import main; sys.exit(main(sys.argv[1:]))"]
#: lbmr-router and lbmr-sim the same way
ROUTER = [sys.executable, "-c", "import sys; from router.cli import main; sys.exit(main(sys.argv[1:]))"]
SIM = [sys.executable, "-m", "lbmr_tools.sim"]


def free_port(kind=socket.SOCK_DGRAM, ip: str = "127.0.0.1") -> int:
    """A port the kernel considers free on ``ip`` now (UDP by default)."""
    s = socket.socket(socket.AF_INET, kind)
    s.bind((ip, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def line_of(text: str, marker: str) -> int:
    """1-based line of the only occurrence of ``marker`` in ``text``."""
    assert text.count(marker) == 1, marker
    return text[: text.index(marker)].count("\n") + 1


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def expect_config_error(load, error_class, tmp_path: Path, name: str, text: str, marker: str,
                        *needles: str, offset: int = 0):
    """``load(path)`` fails at the line of ``marker`` (+ offset) with an
    ``error_class`` whose message has every needle; returns the error."""
    p = write(tmp_path, name, text)
    with pytest.raises(error_class) as info:
        load(p)
    err = info.value
    line = line_of(text, marker) + offset
    assert err.path == str(p)
    assert err.line == line, str(err)
    assert str(err).startswith(f"{p}:{line}: "), str(err)
    for needle in needles:
        assert needle in err.message, (needle, str(err))
    return err


def drive(ctx, until: float) -> list:
    """Call ``ctx.tick`` at every deadline up to ``until``; (time, datagram) pairs."""
    out = []
    for _ in range(100_000):
        t = ctx.next_deadline()
        if t > until:
            return out
        out += [(t, d) for d in ctx.tick(t)]
    raise AssertionError("too many deadlines")


# ---------------------------------------------------------------- lbmr-router configuration files


def router_xml(name: str, endpoints: list[str], peers: list[str] = (), *, daemon: str = "") -> str:
    """A whole lbmr-router file: ``<daemon>`` (name, console log, ``daemon``: more
    elements) and the ``<portals>`` given (from :func:`endpoint_xml`, :func:`peer_xml`)."""
    return (f'<?xml version="1.0" encoding="UTF-8" ?>\n<lbmr-router version="1.0">\n'
            f'  <daemon><name>{name}</name><log type="console"/>{daemon}</daemon>\n  <portals>\n'
            + "".join(endpoints) + "".join(peers) + "  </portals>\n</lbmr-router>\n")


#: the fan-out queue (<relay max-queue>) of the test routers' endpoints: lbmr-sim's TCP
#: sources are not paced by receivers behind a router, and its verifying receivers are
#: slower than its sources; a queue that holds a test's whole transfer keeps them lossless
SIM_MAX_QUEUE = 64 << 20


def endpoint_xml(name: str, domain: int, ip: str, *, tr: str | None = None,
                 relay: tuple[int, int] = (14371, 14390), extra: str = "",
                 max_queue: int = SIM_MAX_QUEUE) -> str:
    """An endpoint portal: topic resolution by the lbmrd at ``ip``:15380 (or ``tr``, a
    ``<topic-resolution>`` element), proxies at ``ip`` on the ``relay`` ports with
    ``max_queue`` bytes of fan-out queue; ``extra``: more elements (e.g. ``<lbt-rm>``)."""
    tr = tr or (f'<topic-resolution>\n        <interface>{ip}</interface>\n'
                f'        <lbmrd address="{ip}" port="15380"/>\n      </topic-resolution>')
    return (f"    <endpoint>\n      <name>{name}</name>\n      <domain-id>{domain}</domain-id>\n"
            f"      {tr}\n"
            f'      <relay interface="{ip}" port-low="{relay[0]}" port-high="{relay[1]}" '
            f'max-queue="{max_queue}"/>\n'
            + (f"      {extra}\n" if extra else "") + "    </endpoint>\n")


def peer_xml(name: str, link_ip: str, role: str, *, cost: int | None = None,
             keepalive: tuple[int, int] = (1000, 3000)) -> str:
    """A peer portal on ``link_ip`` (``role``: :func:`initiator_xml` or
    :func:`acceptor_xml`); keepalive (interval, timeout) in milliseconds."""
    cost_el = f"      <cost>{cost}</cost>\n" if cost is not None else ""
    return (f"    <peer>\n      <name>{name}</name>\n{cost_el}      <single-tcp>\n"
            f"        <interface>{link_ip}</interface>\n        {role}\n      </single-tcp>\n"
            f'      <gateway-keepalive idle="yes" interval="{keepalive[0]}" timeout="{keepalive[1]}"/>\n'
            f"    </peer>\n")


def initiator_xml(address: str, port: int, reconnect_ms: int = 500) -> str:
    return (f'<initiator reconnect-interval="{reconnect_ms}"><address>{address}</address>'
            f"<port>{port}</port></initiator>")


def acceptor_xml(port: int) -> str:
    return f"<acceptor><listen-port>{port}</listen-port></acceptor>"


def pair_xml(name: str, domain: int, trd_ip: str, link_ip: str, role: str, *, tr: str | None = None,
             relay: tuple[int, int] = (14371, 14390), extra: str = "", metrics: bool = False) -> str:
    """One router of a pair: an endpoint on ``trd_ip`` (``tr``, ``relay``, ``extra`` as
    :func:`endpoint_xml`) and a peer on ``link_ip`` (``role``: :func:`initiator_xml` or
    :func:`acceptor_xml`); with ``metrics`` its /status at ``trd_ip``:18080."""
    return router_xml(name, [endpoint_xml(f"{name}-trd", domain, trd_ip, tr=tr, relay=relay, extra=extra)],
                      [peer_xml(f"{name}-peer", link_ip, role)],
                      daemon=f"\n    <metrics>{trd_ip}:18080</metrics>" if metrics else "")


def ns_status(ns, ip: str, port: int = 18080) -> dict:
    """A router's /status at ``ip``:``port``, fetched inside the namespace ``ns``."""
    import json

    r = ns.run([sys.executable, "-c", f"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen("
                                      f"'http://{ip}:{port}/status', timeout=5).read().decode())"], timeout=20)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def start_pair(a, b, cfg_a, cfg_b, logs: dict) -> tuple:
    """lbmrds on 127.0.1.1 (in namespace ``a``) and 127.0.2.1 (in ``b``), then router
    B (``cfg_b``) and router A (``cfg_a``), each writing to ``logs[la|lb|ra|rb]``;
    returns the two routers' processes (A, B)."""
    a.popen(LBMRD + ["-i", "127.0.1.1", "--stats-interval", "0"], stdout=logs["la"], stderr=logs["la"])
    b.popen(LBMRD + ["-i", "127.0.2.1", "--stats-interval", "0"], stdout=logs["lb"], stderr=logs["lb"])
    rb = b.popen(ROUTER + [str(cfg_b)], stdout=logs["rb"], stderr=logs["rb"])
    ra = a.popen(ROUTER + [str(cfg_a)], stdout=logs["ra"], stderr=logs["ra"])
    return ra, rb


class LoneSite:
    """The site of a relay tested without a router around it
    (:class:`router.relay_site.RelaySite`'s calls): ``link`` fixed (or None),
    no source behind any advertisement, a proxy's streams name the proxy's own
    id, and the ends of sessions reported are kept in ``ended``."""

    def __init__(self, link=None) -> None:
        self.link = link
        self.ended: list[int] = []

    def advert_source(self, advert_id: int):
        return None

    def proxy_advert(self, proxy_id: int) -> int:
        return proxy_id

    def session_ended(self, advert_id: int) -> None:
        self.ended.append(advert_id)


# ---------------------------------------------------------------- operators' pages in a browser

#: Debian's chromium (scripts/test installs it); Playwright drives it and downloads nothing
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: the sizes a page must read at: a laptop screen and a phone
PAGE_SIZES = {"wide": (1280, 800), "narrow": (390, 844)}
#: a page's blocks: no two may overlap (unless one holds the other)
PAGE_BLOCKS = "header,h1,h2,h3,summary,section.card,div.tile,div.tools,div.scroll,svg.topology,div.legend,p.note"

_PAGE_OVERLAPS = """sel => {
  const els = Array.from(document.querySelectorAll(sel)).filter(e => e.checkVisibility());
  const box = els.map(e => e.getBoundingClientRect());
  const name = e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + ' "' + e.textContent.trim().slice(0, 30) + '"';
  const bad = [];
  for (let i = 0; i < els.length; i++) for (let j = i + 1; j < els.length; j++) {
    if (els[i].contains(els[j]) || els[j].contains(els[i])) continue;
    const a = box[i], b = box[j];
    const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
    const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
    if (w > 0.5 && h > 0.5) bad.push(name(els[i]) + ' / ' + name(els[j]));
  }
  return {checked: els.length, bad: bad};
}"""


def launch_chromium(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])


class MonitorPage:
    """A daemon's page (``base``: ``http[s]://host:port``) open in a fresh
    browser context of ``size`` (a :data:`PAGE_SIZES` key), with what it
    logged, every request it made and every dialog it opened; ``credentials``:
    (user, password): what a person types when the browser asks (HTTP basic
    authentication, after the endpoint's 401 challenge)."""

    def __init__(self, browser, base: str, size: str = "wide", *, credentials=None,
                 ignore_https_errors: bool = False) -> None:
        w, h = PAGE_SIZES[size]
        self.base = base
        self.context = browser.new_context(
            viewport={"width": w, "height": h}, ignore_https_errors=ignore_https_errors,
            http_credentials=None if credentials is None else {"username": credentials[0],
                                                                 "password": credentials[1]})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.responses: list[tuple[int, str]] = []
        self.dialogs: list[str] = []
        self.page.on("response", lambda r: self.responses.append((r.status, r.url)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    def open(self, path: str = "/", timeout: float = 20.0) -> MonitorPage:
        """Load the page and wait until its data came (the header says "updated")."""
        self.page.goto(self.base + path, wait_until="load")
        self.wait_updated(timeout)
        return self

    def wait_updated(self, timeout: float = 20.0) -> None:
        self.page.wait_for_function(
            "() => (document.getElementById('updated') || {}).textContent.startsWith('updated')",
            timeout=timeout * 1000)

    def js(self, script: str, arg=None):
        return self.page.evaluate(script, arg)

    def overlaps(self) -> dict:
        return self.js(_PAGE_OVERLAPS, PAGE_BLOCKS)

    def horizontal_overflow(self) -> int:
        """Pixels the document is wider than the window (0: no sideways scrolling)."""
        return self.js("() => document.documentElement.scrollWidth - window.innerWidth")

    def column(self, table_id: str, index: int) -> list[str]:
        return self.js("""([id, i]) => Array.from(document.getElementById(id).tBodies[0].rows)
                          .filter(r => !r.classList.contains('empty')).map(r => r.cells[i].textContent)""",
                       [table_id, index])

    def screenshot(self, path, full_page: bool = False) -> bytes:
        return self.page.screenshot(path=str(path), full_page=full_page)

    def close(self) -> None:
        self.context.close()


def check_page_basics(p: MonitorPage) -> None:
    """No console error, no request outside the endpoint, every answer 200, no dialog, no
    overlapping blocks, no sideways scrolling of the whole page."""
    assert p.errors == [], p.errors
    assert p.requests and all(u.startswith(p.base + "/") for u in p.requests), p.requests
    assert all(status == 200 for status, _ in p.responses if status != 401), p.responses  # 401: the challenge
    assert p.dialogs == []
    ov = p.overlaps()
    assert ov["checked"] > 5 and ov["bad"] == [], ov
    assert p.horizontal_overflow() <= 0


def wait_http(url: str, timeout: float = 20.0, **kw) -> bytes:
    """GET ``url`` until it answers 200 (a daemon starting); its body."""
    import time
    import urllib.request

    end = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5, **kw) as r:
                return r.read()
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


def spoof_udp(sock: socket.socket, payload: bytes, src: tuple[str, int], dst: tuple[str, int]) -> None:
    """One UDP datagram on loopback with a forged source, through ``sock``
    (a raw IPPROTO_RAW socket: root)."""
    import struct

    udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(payload), 0) + payload  # checksum 0: none
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, socket.IPPROTO_UDP, 0,
                     socket.inet_aton(src[0]), socket.inet_aton(dst[0]))
    sock.sendto(ip + udp, (dst[0], 0))


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
                low = 30000 + 40 * i + (os.getpid() % 200) * 200
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


def make_ca(tmp: Path, name: str) -> tuple[str, str]:
    """A self-signed CA made by openssl: (key file, certificate file)."""
    import subprocess

    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{tmp}/{name}.key",
                    "-out", f"{tmp}/{name}.pem", "-days", "2", "-subj", f"/CN={name}"], check=True,
                   capture_output=True)
    return f"{tmp}/{name}.key", f"{tmp}/{name}.pem"


def make_cert(tmp: Path, name: str, ca: tuple[str, str], san: str = "IP:127.0.0.1") -> tuple[str, str]:
    """A certificate for ``san`` signed by ``ca`` (from :func:`make_ca`): (certificate, key)."""
    import subprocess

    ca_key, ca_crt = ca
    subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{tmp}/{name}.key",
                    "-out", f"{tmp}/{name}.csr", "-subj", f"/CN={name}", "-addext", f"subjectAltName={san}"],
                   check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", f"{tmp}/{name}.csr", "-CA", ca_crt, "-CAkey", ca_key,
                    "-CAcreateserial", "-out", f"{tmp}/{name}.pem", "-days", "2", "-copy_extensions", "copy"],
                   check=True, capture_output=True)
    os.chmod(f"{tmp}/{name}.key", 0o600)
    return f"{tmp}/{name}.pem", f"{tmp}/{name}.key"
