"""The report's transport section in a real browser (Debian's chromium,
headless, driven by Playwright; nothing downloaded), for two reports made by
the job's own functions in this process (no Spark): the generated capture
whose sessions carry every transport finding, and the real UM 6.14 capture.

For each: a full-page screenshot; the transport section after the plots and
before the tables, laid out findings, then one plot per session with NAKs or
retransmissions, then the transport tables; every transport finding listed
there (and among all findings at the top); no overlapping blocks, no
horizontal overflow, every image loaded, no console error or request other
than file://; filtering and sorting the session table.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lbmr_analyze.job import TABLES, TRANSPORT_TABLES
from lbmr_analyze.report import write_report, write_tables
from tests.analyze_reference import analyse_without_spark
from tests.browser import OVERLAPS_JS, REPORT_BLOCKS, ReportPage, headless_chromium
from tests.helpers import real_capture
from tests.transport_captures import FINDINGS_SESSIONS, write_transport_findings_capture

WIDTH = 1400


browser = headless_chromium  # the fixture


def _report(cap: Path, d: Path) -> tuple[Path, dict, dict]:
    summary, tables = analyse_without_spark(cap, d, 4096)
    summary.update(files=1, byte_ranges=1, parquet_rows=summary["records"])
    tables["summary"] = [{"key": k, "value": str(v)} for k, v in summary.items()]
    tables = {k: tables[k] for k in TABLES + TRANSPORT_TABLES}
    write_tables(d, tables)
    write_report(d, tables, summary)
    return d / "report.html", summary, tables


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    gen = tmp_path_factory.mktemp("tx-gen")
    cap = gen / "findings.pcap"
    write_transport_findings_capture(cap)
    real = tmp_path_factory.mktemp("tx-real")
    return {"generated": _report(cap, gen), "real": _report(real_capture(), real)}


@pytest.fixture(params=["generated", "real"])
def opened(request, browser, reports, tmp_path):
    report, summary, tables = reports[request.param]
    p = ReportPage(browser, report, tmp_path / "report.png", WIDTH)
    yield request.param, p, tables
    p.context.close()


def test_transport_section_layout(opened):
    name, p, tables = opened
    data = p.shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(data[16:20], "big") == WIDTH
    assert p.errors == [] and p.requests and all(u.startswith("file://") for u in p.requests)
    # findings, plots, then the transport section (its findings, plots, tables), then the other tables
    order = ["h2#findings", "h2#plots", "h2#transport", "h3#transport-findings", "ul.tfindings",
             "img[src^='transport-']", "h3#transport_sessions", "h3#transport_receivers", "h3#transport_topics",
             "h3#transport_errors", "h2#tables"]
    ys = [p.y(s) for s in order]
    assert ys == sorted(ys), list(zip(order, ys, strict=True))
    res = p.page.evaluate(OVERLAPS_JS, REPORT_BLOCKS)
    assert res["checked"] > 30 and res["bad"] == []
    assert p.page.evaluate("() => document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    assert p.page.evaluate("() => Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
    # one plot per session with NAKs, NCFs, ICMP errors or retransmissions
    busy = [s for s in tables["transport_sessions"] if s["nak_packets"] or s["retransmissions"] or s["icmp_errors"]]
    assert p.page.locator("img[src^='transport-']").count() == len(busy) == (5 if name == "generated" else 2)
    alts = p.page.locator("img[src^='transport-']").evaluate_all("els => els.map(e => e.alt)")
    assert sorted(a.split(": ", 1)[1] for a in alts) == sorted(s["source"] for s in busy)


def test_transport_findings_listed_with_links(opened):
    name, p, tables = opened
    tx = [f for f in tables["findings"] if f["table"].startswith("transport_")]
    assert tx and p.page.locator("ul.tfindings li").count() == len(tx)
    links = p.page.locator("ul.tfindings li a").evaluate_all("els => els.map(e => e.getAttribute('href'))")
    assert links == [f"#{f['table']}" for f in tx]
    assert all(p.page.locator(h).count() == 1 for h in set(links))
    # the same findings unfold among all findings at the top
    assert p.page.locator("details.finding, p.more").count() == len(tables["findings"])
    first = p.page.locator("ul.tfindings li").first.inner_text()
    assert first.startswith("critical unrecoverable loss: source stopped: Receiver ")   # badge, kind, sentence
    assert ("was still NAKing" in first) and (FINDINGS_SESSIONS["stop"] in first if name == "generated" else
                                               "LBTRM:10.29.4.121:12091:a7f10561" in first)


def test_transport_session_table_filters_and_sorts(opened):
    name, p, tables = opened
    rows = tables["transport_sessions"]
    t = "#t-transport_sessions"
    visible = f"() => Array.from(document.querySelector('{t}').tBodies[0].rows).filter(r => r.checkVisibility()).length"
    assert p.page.evaluate(visible) == len(rows)
    if len(rows) > 5:
        p.page.fill('input.filter[data-table="transport_sessions"]', "LBTRU")
        assert p.page.evaluate(visible) == 1
        p.page.fill('input.filter[data-table="transport_sessions"]', "")
    headers = p.page.locator(f"{t} th")
    names = [headers.nth(k).text_content() for k in range(headers.count())]
    assert names[:3] == ["source", "topics", "originals"]
    i = names.index("nak_packets")
    headers.nth(i).click()
    headers.nth(i).click()
    col = p.page.locator(f"{t} tbody tr td:nth-child({i + 1})").all_text_contents()
    assert [int(v) for v in col] == sorted((r["nak_packets"] for r in rows), reverse=True)
