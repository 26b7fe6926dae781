"""lbmrd's operators' page (``GET /`` on its ``--metrics`` endpoint) in Debian's
headless chromium, against an lbmrd process with 100,000 clients (keepalives
from forged loopback sources: root, a raw socket) in two NAT domains, one of
them with a right-to-left name.

Checked in the browser: screenshots at 1280x800 and 390x844, no console error,
no request leaving the endpoint, no dialog, no overlapping blocks, no sideways
scrolling; the client table's paging, filter and sort (done by the daemon:
the browser gets one page of rows); names shown as text. Over plain HTTP: the
JSON's bounds and its refusals, the security headers, a read-only endpoint.

``LBMR_PAGE_SHOTS=DIR`` also keeps the screenshots in DIR.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from tests.browser import (
    PAGE_SIZES,
    MonitorPage,
    check_page_basics,
    headless_chromium,
    keep_shot,
)
from tests.helpers import LBMRD, free_port, spoof_udp, wait_http

CLIENTS = 100_000
RTL_DOMAIN = "\u05e9\u05d5\u05e7_\u05de\u05e2\u05e8\u05d1"  # Hebrew letters: a right-to-left name
CONFIG = f"""<?xml version="1.0" encoding="UTF-8" ?>
<lbmrd version="1.0">
  <daemon><ttl>600</ttl></daemon>
  <domains>
    <domain name="trading-floor"><network>127.1.0.0/16</network></domain>
    <domain name="{RTL_DOMAIN}"><network>127.2.0.0/16</network></domain>
  </domains>
  <transformations>
    <transform source="trading-floor" destination="{RTL_DOMAIN}">
      <rule><match address="127.1.0.9" port="*"/><replace address="127.2.0.9" port="*"/></rule>
    </transform>
  </transformations>
</lbmrd>
"""


def client_addr(i: int) -> tuple[str, int]:
    """The i-th forged client: half in 127.1/16, half in 127.2/16."""
    j = i >> 1
    return f"127.{1 + (i & 1)}.{j >> 8}.{j & 255}", 30000 + (i % 7)


def summary(base: str) -> dict:
    return json.loads(wait_http(base + "/api/summary"))


@pytest.fixture(scope="module")
def lbmrd(tmp_path_factory):
    """An lbmrd process on 127.0.0.1 with CLIENTS clients; its endpoint's base URL."""
    tmp = tmp_path_factory.mktemp("lbmrd")
    cfg = tmp / "lbmrd.xml"
    cfg.write_text(CONFIG, encoding="utf-8")
    port, http_port = free_port(), free_port(socket.SOCK_STREAM)
    log = open(tmp / "lbmrd.log", "wb")
    proc = subprocess.Popen(LBMRD + [str(cfg), "-i", "127.0.0.1", "-p", str(port), "--stats-interval", "0",
                                     "-r", str(8 << 20), "--metrics", f"127.0.0.1:{http_port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{http_port}"
    try:
        wait_http(base + "/metrics")
        with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as raw:
            sent = 0
            for _ in range(8):  # a keepalive each; again for those the socket buffer dropped
                for i in range(CLIENTS):
                    spoof_udp(raw, b"\x02\x00\x00\x00", client_addr(i), ("127.0.0.1", port))
                    sent += 1
                    if i % 1000 == 999:  # paced by the daemon: it has read what was sent (or 1 s)
                        end = time.monotonic() + 1.0
                        while summary(base)["counters"]["received"] < sent and time.monotonic() < end:
                            time.sleep(0.002)
                        sent = summary(base)["counters"]["received"]  # what the kernel dropped is gone
                if summary(base)["clients_total"] >= CLIENTS:
                    break
        assert summary(base)["clients_total"] == CLIENTS
        yield base
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


browser = headless_chromium  # the fixture


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.mark.parametrize("size", list(PAGE_SIZES))
def test_the_page_reads_at_both_sizes(lbmrd, browser, tmp_path, size):
    p = MonitorPage(browser, lbmrd, size)
    try:
        p.open()
        p.page.wait_for_function("() => document.querySelectorAll('#client-table tbody tr').length === 100")
        # a second refresh gives the rates (per second between the two)
        p.page.wait_for_function("() => document.querySelector('#traffic-tiles .tile:nth-child(2) .v')"
                                 ".textContent.endsWith('/s')", timeout=15000)
        shot = tmp_path / f"lbmrd-{size}.png"
        assert png_size(p.screenshot(shot)) == PAGE_SIZES[size]
        keep_shot(shot, f"lbmrd-page-{size}.png")
        check_page_basics(p)
        assert p.js("() => document.getElementById('clients').querySelector('h2 .count').textContent") \
            == "100\u202fk"
        pos = p.js("() => document.querySelector('#clients .pager span').textContent")
        assert pos == "1\u2013100 of 100\u202fk"
        # every section is there, the client table within the window's width
        for sec in ("traffic", "clients", "drops", "domains", "nat", "events"):
            assert p.page.locator(f"section#{sec}").is_visible()
        box = p.page.locator("#clients div.scroll").bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= PAGE_SIZES[size][0]
        # the browser got one page of rows, not the table
        assert not any("limit=" in u and "limit=100&" not in u + "&" for u in p.requests)
    finally:
        p.close()


def test_filter_sort_and_paging_are_the_daemons(lbmrd, browser):
    p = MonitorPage(browser, lbmrd).open()
    try:
        rows = "() => document.querySelectorAll('#client-table tbody tr:not(.empty)').length"
        p.page.fill("#client-table-filter", "127.2.3.")
        p.page.wait_for_function("() => document.querySelector('#clients .tools .info').textContent"
                                 ".startsWith('256 of')")
        addrs = p.column("client-table", 0)
        assert len(addrs) == 100 and all(a.startswith("127.2.3.") for a in addrs)
        assert set(p.column("client-table", 1)) == {RTL_DOMAIN}
        # sort by address, descending (two clicks), over the filtered rows
        head = p.page.locator("#client-table th[data-key=addr]")
        head.click()
        p.page.wait_for_function("() => document.querySelector('#client-table th[data-key=addr]')"
                                 ".getAttribute('aria-sort') === 'ascending'")
        head.click()
        p.page.wait_for_function("() => document.querySelector('#client-table tbody td').textContent"
                                 ".startsWith('127.2.3.255')")
        addrs = p.column("client-table", 0)
        keys = [tuple(map(int, a.replace(":", ".").split("."))) for a in addrs]
        assert keys == sorted(keys, reverse=True)
        # the next page of the same filter and sort
        p.page.click("#clients .pager button:has-text('next')")
        p.page.wait_for_function("() => document.querySelector('#clients .pager span').textContent"
                                 ".startsWith('101')")
        more = p.column("client-table", 0)
        assert len(more) == 100 and tuple(map(int, more[0].replace(":", ".").split("."))) < keys[-1]
        # a filter nothing matches
        p.page.fill("#client-table-filter", "no such client")
        p.page.wait_for_function(f"{rows} === 0")
        assert p.js("() => document.querySelector('#client-table tbody tr.empty').textContent") \
            == "nothing matches the filter"
        # client-side tables filter too: the domains
        p.page.fill("#domain-table-filter", "trading")
        p.page.wait_for_function("() => document.querySelectorAll('#domain-table tbody tr').length === 1")
        assert p.column("domain-table", 0) == ["trading-floor"]
        assert p.column("domain-table", 1) == ["50.0\u202fk"]
        check_page_basics(p)
    finally:
        p.close()


def get(url: str, method: str = "GET") -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_the_json_is_paged_bounded_and_read_only(lbmrd):
    status, headers, body = get(lbmrd + "/api/clients?limit=500&sort=datagrams&order=desc")
    assert status == 200 and headers["Content-Type"] == "application/json"
    page = json.loads(body)
    assert page["total"] == CLIENTS and len(page["rows"]) == 500 and len(body) < 64 * 1024
    assert [r["datagrams"] for r in page["rows"]] == sorted((r["datagrams"] for r in page["rows"]),
                                                             reverse=True)
    assert json.loads(get(lbmrd + "/api/clients?offset=99999")[2])["rows"][0]["addr"]
    assert json.loads(get(lbmrd + "/api/clients?offset=100000")[2])["rows"] == []
    for bad, needle in (("limit=501", b"limit must be from 1 to 500"), ("limit=0", b"limit"),
                        ("offset=-1", b"offset must be a whole number"), ("sort=password", b"sort must be one of"),
                        ("order=sideways", b"order must be asc or desc")):
        status, headers, body = get(f"{lbmrd}/api/clients?{bad}")
        assert status == 400 and needle in body, (bad, body)
    status, headers, body = get(lbmrd + "/api/summary")
    assert len(body) < 64 * 1024
    for path in ("/", "/api/summary", "/static/lbmrd.js", "/metrics", "/nope"):
        status, headers, _ = get(lbmrd + path)
        csp = headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe" not in csp
        assert headers["X-Content-Type-Options"] == "nosniff" and headers["X-Frame-Options"] == "DENY"
    for method in ("POST", "PUT", "DELETE"):
        status, headers, _ = get(lbmrd + "/api/clients", method)
        assert status == 405 and headers["Allow"] == "GET"
    # the page's HTML holds no script of its own: only same-origin files
    html = get(lbmrd + "/")[2].decode()
    assert html.count("<script") == 2 and html.count('<script src="/static/') == 2


async def test_a_sliced_scan_gives_the_page_a_whole_sort_would():
    """TableQuery.page_in_slices (filter and heap selection SLICE rows at a time, the
    daemon's loop running between slices) against sorting the whole list."""
    import random

    import trio

    from lbmr_runtime.monitor import SLICE, TableQuery

    rng = random.Random(5)
    rows = [(rng.randrange(1000), f"10.{i >> 8 & 255}.{i & 255}.1") for i in range(3 * SLICE + 17)]
    cols = {"v": lambda r: (r[0], r[1]), "ip": lambda r: r[1]}
    turns = 0

    async def count_turns():
        nonlocal turns
        while True:
            await trio.sleep(0)
            turns += 1

    async with trio.open_nursery() as n:
        n.start_soon(count_turns)
        for query in ({"sort": "v"}, {"sort": "v", "order": "desc", "offset": "7000", "limit": "500"},
                      {"sort": "ip", "q": "10.3.", "limit": "50"}, {"sort": "v", "q": "no such"},
                      {"sort": "ip", "offset": "15016", "limit": "5"}):
            tq = TableQuery(query, cols, default_sort="v")
            want = sorted((r for r in rows if tq.q in r[1]), key=cols[tq.sort], reverse=tq.desc)
            before = turns
            matched, page = await tq.page_in_slices(rows, cols[tq.sort], lambda r: r[1], lock=trio.Lock())
            assert matched == len(want) and page == want[tq.offset:tq.offset + tq.limit], query
            assert turns - before >= 3  # the other task ran between the slices
        n.cancel_scope.cancel()
