"""report.html in a real browser: Debian's chromium, headless, driven by Playwright
(``executable_path`` is the system chromium; Playwright downloads nothing).

Two reports: a busy made-up capture's (tests/report_tables.py, written through
the report's API, no Spark) and the real UM 6.14 capture's (one lbmr-analyze run
for the module).  For each: a full-page screenshot (under tmp_path), then in the
rendered page: findings before plots, no two blocks' boxes overlapping, no
horizontal overflow, every image loaded, the filter box above a full-width
table, the filter narrowing a table, sorting by a column, folded findings that
unfold, no console error and no request other than file://.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lbmr_analyze.job import TABLES
from lbmr_analyze.report import write_report, write_tables
from lbmr_analyze.report.page import finding_groups, kind_count, same_rows

from . import report_tables as RT
from .browser import OVERLAPS_JS, ReportPage, headless_chromium

REAL_CAPTURE = Path(__file__).resolve().parents[2] / "shared" / "captures" / "um614-multicast-tr.pcap"
WIDTH = 1400

#: The page's main blocks: none may overlap another (unless one contains the other).
BLOCKS = "h1,h2,h3,p,img,input.filter,div.scroll,table.kinds,section.kind,details.finding"

_VISIBLE_ROWS = "id => Array.from(document.getElementById(id).tBodies[0].rows).filter(r => r.checkVisibility()).length"
_COLUMN = """([id, i]) => Array.from(document.getElementById(id).tBodies[0].rows)
  .map(r => r.cells[i].hasAttribute('data-v') ? r.cells[i].getAttribute('data-v') : r.cells[i].textContent)"""


browser = headless_chromium  # the fixture


def _opened(browser, report: Path, tmp_path: Path):
    o = ReportPage(browser, report, tmp_path / "report.png", WIDTH)
    try:
        yield o
    finally:
        o.close()


# ============================================================== checks (both reports)


def check_screenshot(o: ReportPage, shot: Path) -> None:
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    height = o.js("() => document.documentElement.scrollHeight")
    assert int.from_bytes(data[16:20], "big") == WIDTH and int.from_bytes(data[20:24], "big") >= min(height, 16000)


def check_self_contained(o: ReportPage) -> None:
    assert o.errors == []
    assert o.requests and all(u.startswith("file://") for u in o.requests), o.requests


def check_findings_before_plots(o: ReportPage) -> None:
    first_plot = o.box("img")["y"]
    assert o.box("h2#findings")["y"] < first_plot
    for sel in ("table.kinds", "details.finding", "section.kind"):
        boxes = [o.page.locator(sel).nth(i).bounding_box() for i in range(o.page.locator(sel).count())]
        assert all(b["y"] + b["height"] <= first_plot for b in boxes), sel


def check_layout(o: ReportPage) -> None:
    res = o.js(OVERLAPS_JS, BLOCKS)
    assert res["checked"] > 30 and res["bad"] == []
    assert o.js("() => document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    assert o.js("() => Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
    content = o.box("h1")["width"]
    for i in range(o.page.locator("input.filter").count()):
        inp = o.page.locator("input.filter").nth(i)
        name = inp.get_attribute("data-table")
        box, table = inp.bounding_box(), o.box(f"div.scroll:has(#t-{name})")
        assert box["y"] + box["height"] <= table["y"] <= box["y"] + box["height"] + 12, name   # just above
        assert abs(box["x"] - table["x"]) < 1 and abs(table["width"] - content) < 2, name       # full width


def check_filter(o: ReportPage, name: str, query: str, expected: int, total: int) -> None:
    tid = f"t-{name}"
    assert o.js(_VISIBLE_ROWS, tid) == total
    o.page.fill(f'input.filter[data-table="{name}"]', query)
    assert o.js(_VISIBLE_ROWS, tid) == expected
    o.page.fill(f'input.filter[data-table="{name}"]', "")
    assert o.js(_VISIBLE_ROWS, tid) == total


def check_sort(o: ReportPage, name: str, column: str) -> None:
    """Click a numeric column's header twice: ascending, then descending."""
    headers = o.page.locator(f"#t-{name} th")
    i = [headers.nth(k).text_content() for k in range(headers.count())].index(column)
    for _ in range(2):
        headers.nth(i).click()
        vals = [float(v) for v in o.js(_COLUMN, [f"t-{name}", i])]
        order = sorted(vals) if "asc" in headers.nth(i).get_attribute("class") else sorted(vals, reverse=True)
        assert vals == order, (name, column)
    assert "desc" in headers.nth(i).get_attribute("class")


def check_unfold(o: ReportPage) -> None:
    first = o.page.locator("details.finding").first
    body = first.locator(".fbody")
    assert not body.is_visible()
    first.locator("summary").click()
    assert body.is_visible() and first.get_attribute("open") is not None
    assert o.js(OVERLAPS_JS, BLOCKS)["bad"] == []


def check_all(o: ReportPage, shot: Path) -> None:
    check_screenshot(o, shot)
    check_self_contained(o)
    check_findings_before_plots(o)
    check_layout(o)


# ============================================================== a busy made-up capture


@pytest.fixture(scope="module")
def made_up_report(tmp_path_factory) -> Path:
    """The report of the made-up tables, written once (its plots take seconds); each test
    opens it in a fresh page of its own."""
    out = tmp_path_factory.mktemp("made-up") / "report"
    out.mkdir()
    t = RT.tables()
    write_tables(out, t)
    write_report(out, t, RT.summary(), top=RT.TOP)
    return out / "report.html"


@pytest.fixture
def made_up(browser, made_up_report, tmp_path):
    yield from _opened(browser, made_up_report, tmp_path)


def test_made_up_capture_renders(made_up, tmp_path):
    check_all(made_up, tmp_path / "report.png")
    # the storm's group comes before the twelve per-topic findings of the same severity
    groups = made_up.page.locator("section.kind h3").all_text_contents()
    assert [g.split(" ", 1)[1] for g in groups] == ["transport conflict (1)", "storm (1)", "never advertised (12)",
                                                    "lbmrd client joined (1)"]


def test_made_up_capture_filter_and_sort(made_up):
    rows = RT.tables()["unresolved_topics"]
    check_filter(made_up, "unresolved_topics", "missing.topic.1",
                 sum("missing.topic.1" in r["topic"] for r in rows), len(rows))
    check_sort(made_up, "unresolved_topics", "queries")
    check_sort(made_up, "unresolved_topics", "first_query")      # a time column sorts by its offset
    check_sort(made_up, "top_talkers", "packets")


def test_made_up_capture_findings_unfold(made_up):
    check_unfold(made_up)
    text = made_up.page.locator("details.finding[open] .fbody").inner_text()
    assert "first_seen" in text and "+0.000 ms" in text


# ============================================================== the real capture


@pytest.fixture(scope="module")
def real_out(tmp_path_factory):
    """One lbmr-analyze run on the real capture (the CLI, so the whole job and its Spark)."""
    out = tmp_path_factory.mktemp("real") / "report"
    r = subprocess.run([sys.executable, "-m", "lbmr_analyze", str(REAL_CAPTURE), "--out", str(out), "-q"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture
def real(browser, real_out, tmp_path):
    yield from _opened(browser, real_out / "report.html", tmp_path)


def test_real_capture_renders(real, real_out, tmp_path):
    check_all(real, tmp_path / "report.png")
    tables = {n: json.loads((real_out / f"{n}.json").read_text()) for n in TABLES}
    # four contexts, --top 20: "All contexts" is left out when it repeats "Top talkers"
    assert len(tables["contexts"]) == 4 and real.page.locator("#t-top_talkers tbody tr").count() == 4
    assert real.page.locator("#t-contexts").count() == (not same_rows(tables["contexts"], tables["top_talkers"]))
    n = len(tables["findings"])
    assert n and real.page.locator("details.finding, p.more").count() == n
    heads = [h.split(" ", 1)[1] for h in real.page.locator("section.kind h3").all_text_contents()]
    assert heads == [f"{kind} ({kind_count(count, rows)})" for kind, _sev, count, rows in finding_groups(tables["findings"])]


def test_real_capture_filter_sort_unfold(real, real_out):
    summary = json.loads((real_out / "summary.json").read_text())
    check_filter(real, "summary", "stale", sum("stale" in f"{r['key']}{r['value']}" for r in summary), len(summary))
    check_sort(real, "top_talkers", "packets")
    check_sort(real, "top_talkers", "first_seen")
    check_unfold(real)
