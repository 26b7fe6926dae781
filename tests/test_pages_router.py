"""lbmr-router's operators' page (``GET /`` on its ``<metrics>`` endpoint) in
Debian's headless chromium, against a chain of three router processes
(r1 - r2 - r3, each with its lbmrd TRD) carrying live TCP sessions: an
lbmr-sim source in TRD1, lbmr-sim receivers in TRD3 reading slowly (their
queues at r3's proxy fill).

Checked in the browser: screenshots at 1280x800 and 390x844, no console
error, no request leaving the endpoint, no dialog, no overlapping blocks, no
sideways scrolling; the topology drawing shows every router, domain and peer
link of the chain from each router; the tables filter and sort; the sessions
show their receivers with queue depth. ``LBMR_PAGE_SHOTS=DIR`` also keeps the
screenshots in DIR.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.browser import (
    PAGE_SIZES,
    MonitorPage,
    check_page_basics,
    headless_chromium,
    keep_shot,
)
from tests.helpers import SIM, wait_http
from tests.router_chain import RouterChain

WAIT = 60.0  # seconds the chain may take to come up and carry the sessions


def api(base: str, what: str) -> dict:
    return json.loads(wait_http(f"{base}/api/{what}"))


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    c = RouterChain(tmp_path_factory.mktemp("chain"), 3)
    try:
        end = time.monotonic() + WAIT

        def until(ok, what):
            while not ok():
                assert time.monotonic() < end, (what, c.log("r1")[-2000:], c.log("r2")[-2000:])
                time.sleep(0.2)

        until(lambda: all(len(api(c.base(r), "router")["topology"]["routes"]["items"]) == 3
                          for r in ("r1", "r2", "r3")), "routes to the three domains")
        (ip1, p1), (ip3, p3) = c.lbmrd[1], c.lbmrd[3]
        c.spawn("source", SIM + ["--daemon", f"{ip1}:{p1}", "--bind-base", "127.0.1.10", "--contexts", "1",
                                 "--topics", "2", "--receivers-per-context", "0", "--data-bytes", "4G",
                                 "--data-rate", "200", "--keep-running", "--duration", "300",
                                 "--topic-prefix", "page."])
        c.spawn("receivers", SIM + ["--daemon", f"{ip3}:{p3}", "--bind-base", "127.0.3.10", "--contexts", "2",
                                    "--topics", "2", "--sources-per-topic", "0", "--receivers-per-context", "2",
                                    "--data-bytes", "4G", "--verify-data", "--data-rate-limit", "20K",
                                    "--duration", "300", "--topic-prefix", "page."])
        until(lambda: sum(r["receivers"]["total"] for r in api(c.base("r3"), "sessions")["rows"]) >= 4,
              "the receivers at r3's proxies")
        yield c
    finally:
        c.stop()


browser = headless_chromium  # the fixture


@pytest.mark.parametrize("size", list(PAGE_SIZES))
@pytest.mark.parametrize("router", ["r2", "r3"])
def test_the_page_reads_at_both_sizes(chain, browser, tmp_path, router, size):
    p = MonitorPage(browser, chain.base(router), size)
    try:
        p.open()
        p.page.wait_for_function("() => document.querySelectorAll('#session-table tbody tr:not(.empty)').length"
                                 + (" >= 2" if router == "r3" else " >= 0"))
        shot = tmp_path / f"{router}-{size}.png"
        data = p.screenshot(shot)
        assert (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) == PAGE_SIZES[size]
        if router == "r3":  # the end of the chain: its receivers' sessions
            keep_shot(shot, f"router-page-{size}.png")
        check_page_basics(p)
        for sec in ("topology", "portals", "links", "sessions", "events"):
            assert p.page.locator(f"section#{sec}").is_visible()
        # the drawing fits the window: no part of it off the screen
        box = p.page.locator("svg.topology").bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= PAGE_SIZES[size][0] and box["height"] > 50
        assert p.js("() => document.title") == f"lbmr-router {router}"
    finally:
        p.close()


_DRAWING = """() => {
  const s = document.querySelector('svg.topology');
  return {routers: Array.from(s.querySelectorAll('g.router')).map(g => g.dataset.name).sort(),
          self: Array.from(s.querySelectorAll('g.router.self')).map(g => g.dataset.name),
          domains: Array.from(s.querySelectorAll('g.domain')).map(g => g.dataset.domain).sort(),
          edges: Array.from(s.querySelectorAll('line.edge')).map(l => [[l.dataset.a, l.dataset.b].sort().join('-'),
                                                                       l.getAttribute('class')]).sort(),
          texts: Array.from(s.querySelectorAll('g.router text')).map(t => t.getBBox().width)};
}"""


@pytest.mark.parametrize("size", list(PAGE_SIZES))
def test_the_drawing_shows_every_router_and_link_of_the_chain(chain, browser, size):
    for router in ("r1", "r2", "r3"):
        p = MonitorPage(browser, chain.base(router), size).open()
        try:
            d = p.js(_DRAWING)
            assert d["routers"] == ["r1", "r2", "r3"] and d["self"] == [router]
            assert d["domains"] == ["1", "2", "3"]
            edges = dict(d["edges"])
            assert sorted(edges) == ["r1-r2", "r2-r3"]
            # this router's own links drawn up (green); the others known from the map
            for e, cls in edges.items():
                assert ("up" in cls.split()) == (router in e.split("-")), (router, e, cls)
            assert all(w > 0 for w in d["texts"])
            # the routes table beside it: the three domains, one local
            assert sorted(p.column("route-table", 0)) == ["1", "2", "3"]
            assert p.column("route-table", 3).count("(local)") == 1
            check_page_basics(p)
        finally:
            p.close()


def test_tables_filter_and_sort(chain, browser):
    p = MonitorPage(browser, chain.base("r2")).open()
    try:
        assert sorted(p.column("link-table", 0)) == ["2-from-1", "2-to-3"]
        assert p.column("link-table", 2) == ["CONNECTED", "CONNECTED"]
        p.page.click("#link-table th[data-key=name]")  # sorted by name: a click turns it round
        p.page.wait_for_function("() => document.querySelector('#link-table th[data-key=name]')"
                                 ".getAttribute('aria-sort') === 'descending'")
        assert p.column("link-table", 0) == ["2-to-3", "2-from-1"]
        p.page.fill("#link-table-filter", "from")
        p.page.wait_for_function("() => document.querySelectorAll('#link-table tbody tr').length === 1")
        assert p.column("link-table", 0) == ["2-from-1"] and p.column("link-table", 1) == ["r1"]
        p.page.click("#interest summary")
        p.page.wait_for_function("() => document.getElementById('interest').open")
        assert sorted(p.column("interest-table", 2)) == ["page.0", "page.1"]
        p.page.fill("#interest-table-filter", "page.1")
        p.page.wait_for_function("() => document.querySelectorAll('#interest-table tbody tr').length === 1")
        p.page.fill("#route-table-filter", "r3")
        p.page.wait_for_function("() => document.querySelectorAll('#route-table tbody tr').length === 1")
        assert p.column("route-table", 0) == ["3"]
        check_page_basics(p)
    finally:
        p.close()
    p = MonitorPage(browser, chain.base("r3")).open()
    try:
        p.page.wait_for_function("() => document.querySelectorAll('#session-table tbody tr:not(.empty)').length === 2")
        assert sorted(p.column("session-table", 0)) == ["page.0", "page.1"]
        receivers = p.column("session-table", 5)
        assert all(r.count("127.0.3.") == 2 and "queue" in r for r in receivers), receivers
        # the daemon filters: one session's topic
        p.page.fill("#session-table-filter", "page.1")
        p.page.wait_for_function("() => document.querySelector('#sessions .tools .info').textContent"
                                 ".startsWith('1 of 2')")
        assert p.column("session-table", 0) == ["page.1"]
        # ... and sorts: by topic, descending
        p.page.fill("#session-table-filter", "")
        p.page.wait_for_function("() => document.querySelector('#sessions .tools .info').textContent === '2 in all'")
        p.page.click("#session-table th[data-key=topic]")
        p.page.wait_for_function("() => document.querySelector('#session-table tbody td').textContent === 'page.1'")
        assert p.column("session-table", 0) == ["page.1", "page.0"]
        # the queue column is in bytes
        assert all(q.endswith(("B", "KiB", "MiB")) for q in p.column("session-table", 6))
        check_page_basics(p)
    finally:
        p.close()


def test_the_router_json_is_bounded(chain):
    page = json.loads(wait_http(chain.base("r3") + "/api/sessions?limit=1&sort=queued_bytes&order=desc"))
    assert page["total"] == 2 and len(page["rows"]) == 1
    body = wait_http(chain.base("r2") + "/api/router")
    assert len(body) < 64 * 1024
    s = json.loads(body)
    assert {lk["name"]: lk["state"] for lk in s["links"]} == {"2-from-1": "CONNECTED", "2-to-3": "CONNECTED"}
    assert all(lk["bytes_sent"] > 0 and lk["bytes_received"] > 0 for lk in s["links"])


def test_a_link_that_goes_down_is_drawn_down(chain, browser):
    """Last in this module: it stops r3. r2's page then draws its link to r3
    red and dashed (down), its own router for the link while r3's announcement
    lives, and says so in the peer links table."""
    chain.end("r3")
    p = MonitorPage(browser, chain.base("r2")).open()
    try:
        p.page.wait_for_function("() => Array.from(document.querySelectorAll('svg.topology line.edge'))"
                                 ".some(l => l.classList.contains('down'))", timeout=30000)
        d = p.js(_DRAWING)
        down = [e for e, cls in d["edges"] if "down" in cls.split()]
        assert len(down) == 1 and "r2" in down[0].split("-"), d["edges"]
        assert ("r1-r2", "edge up") in [tuple(e) for e in d["edges"]]
        states = dict(zip(p.column("link-table", 0), p.column("link-table", 2), strict=True))
        assert states["2-from-1"] == "CONNECTED" and states["2-to-3"] != "CONNECTED"
        assert p.js("() => document.querySelector('#link-table tbody tr:nth-child(2) .state').className") \
            in ("state bad", "state warn")
        check_page_basics(p)
    finally:
        p.close()
