"""Unit tests for lbmr_analyze.report on made-up result tables (no Spark): short
times, finding groups, the page's structure, the table files and the plots'
scales, labels and legends.  tests/test_report_browser.py renders the page in a
real browser."""

from __future__ import annotations

import csv
import json
import re
from html.parser import HTMLParser

import pytest

from lbmr_analyze.report import html_page, write_report, write_tables
from lbmr_analyze.report.clock import ISO_TIME, CaptureClock
from lbmr_analyze.report.page import finding_groups, findings_html
from lbmr_analyze.report.plots import figures, plot_bars, plot_time_to_resolve, wants_log

from . import report_tables as RT

# ============================================================== clock


def test_short_times_are_ms_after_the_start():
    c = CaptureClock("2022-05-23T20:11:19.855974Z")
    assert c.short("2022-05-23T20:11:19.855974Z") == "+0.000 ms"
    assert c.short("2022-05-23T20:11:31.830986Z") == "+11975.012 ms"
    assert c.short("2022-05-23T20:11:19.855973Z") == "-0.001 ms"
    assert c.short("2022-05-23T21:11:19Z") == "+3599144.026 ms"
    assert c.offset_us("2022-05-23T20:11:20Z") == 144_026
    assert c.shorten_text("from 2022-05-23T20:11:20.000000Z .. 2022-05-23T20:11:21.000000Z (x)") == \
        "from +144.026 ms .. +1144.026 ms (x)"


def test_no_start_leaves_times_as_they_are():
    c = CaptureClock(None)
    assert c.short("2022-05-23T20:11:20Z") == "2022-05-23T20:11:20Z"
    assert c.shorten_text("at 2022-05-23T20:11:20Z") == "at 2022-05-23T20:11:20Z"


# ============================================================== finding groups


def test_groups_most_severe_kind_first_with_counts():
    groups = finding_groups(RT.tables()["findings"])
    assert [(k, s, n) for k, s, n, _rows in groups] == [
        ("transport conflict", "critical", 1),
        ("storm", "high", 1),                     # one severity: the shorter list first
        ("never advertised", "high", 12),         # 10 listed and "... and 2 more"
        ("lbmrd client joined", "low", 1),
    ]


def test_a_kind_takes_its_most_severe_finding():
    f = [dict(severity="low", kind="a", finding="x", table="t"), dict(severity="medium", kind="b", finding="y",
                                                                        table="t"),
         dict(severity="critical", kind="a", finding="z", table="t")]
    assert [(k, s, n) for k, s, n, _r in finding_groups(f)] == [("a", "critical", 2), ("b", "medium", 1)]


def test_a_kind_of_mixed_severities_says_how_many_of_each_and_badges_every_finding():
    """Defect (reading): a kind of one high and two low findings was headed
    "high ... (3)", and its high finding's line had no badge (only the lines
    that differ from the kind's did): three high findings, at a glance."""
    f = [dict(severity=sev, kind="querying after last advertisement", finding=f"topic t{i}", table="t",
              topics=f"t{i}") for i, sev in enumerate(("low", "high", "low"))]
    f.append(dict(severity="medium", kind="storm", finding="one storm", table="t", topics="s"))
    html = findings_html(f, CaptureClock(None))
    assert "querying after last advertisement (3: 1 high, 2 low)</h3>" in html
    assert '<td class="n">3: 1 high, 2 low</td>' in html
    lines = re.findall(r"<summary[^>]*>(.*?)</summary>", html)
    assert [re.sub(r"<[^>]+>", "", x) for x in lines] == [
        "high topic t1", "low topic t0", "low topic t2", "one storm"]  # one kind's: its severity is the badge
    assert "storm (1)</h3>" in html


# ============================================================== the page


class Page(HTMLParser):
    """The page's visible text, elements in document order (tag, attributes), and text per element id."""

    def __init__(self, text: str):
        super().__init__()
        self.elements: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self._skip = 0
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))
        if tag in ("script", "style", "title"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style", "title"):
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)

    def index(self, tag: str, **attrs) -> int:
        for i, (t, a) in enumerate(self.elements):
            if t == tag and all(a.get(k) == v for k, v in attrs.items()):
                return i
        raise AssertionError(f"no <{tag} {attrs}>")

    def all(self, tag: str, cls: str | None = None) -> list[dict]:
        return [a for t, a in self.elements if t == tag and (cls is None or cls in a.get("class", "").split())]


PLOTS = [("load.png", "load")]


def render(tables=None, summary=None) -> Page:
    """The page of ``tables`` (the busy made-up capture's by default), without plotting."""
    return Page(html_page(tables or RT.tables(), summary or RT.summary(), PLOTS, top=RT.TOP))


@pytest.fixture(scope="module")
def page():
    return render()


def test_page_order_counts_then_findings_then_plots(page):
    kinds = page.index("table", id="finding-kinds")
    assert page.index("h2", id="findings") < kinds < page.index("details") < page.index("h2", id="plots")
    assert page.index("h2", id="plots") < page.index("img") < page.index("h2", id="tables")
    # the count table links each kind to its group, in the groups' order
    assert [a["href"] for a in page.all("a") if a.get("href", "").startswith("#fk-")] == \
        ["#fk-0", "#fk-1", "#fk-2", "#fk-3"]
    text = "".join(page.text)
    assert "never advertised (12)" in text and "storm (1)" in text


def test_each_finding_one_folded_line(page):
    details = page.all("details", "finding")
    assert len(details) == len(RT.tables()["findings"]) - 1          # the "... and 2 more" row is a plain line
    assert len(page.all("p", "more")) == 1
    assert all("open" not in d for d in details)
    text = "".join(page.text)
    # fields the report does not know are shown among the details, generically
    assert "top_share" in text and "0.899" in text and "at_capture_end" in text


def test_one_absolute_time_and_short_ones_elsewhere(page):
    text = "".join(page.text)
    assert ISO_TIME.findall(text) == [RT.iso(RT.START_US)]
    assert "capture start 2023-11-14T22:13:20.250000Z" in text
    assert "+119750.000 ms" in text                     # the storm's start, in its finding
    cells = [a for a in page.all("td") if "data-v" in a]
    assert cells and all(ISO_TIME.fullmatch(a["title"]) for a in cells)


def test_booleans_lower_case(page, tmp_path):
    write_tables(tmp_path, RT.tables())
    text = "".join(page.text)
    assert not re.search(r"\b(True|False)\b", text)
    assert "false" in text and "true" in text
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert {r["key"]: r["value"] for r in rows}["compressed"] == "false"
    assert json.loads((tmp_path / "summary.json").read_text())[-1] == {"key": "compressed", "value": False}
    assert "true" in (tmp_path / "unresolved_topics.csv").read_text()


def test_filter_box_before_its_table(page):
    for inp in page.all("input", "filter"):
        name = inp["data-table"]
        assert page.index("input", **{"data-table": name}) < page.index("table", id=f"t-{name}")


@pytest.mark.parametrize("n_contexts, shown", [(RT.TOP + 5, True), (RT.TOP, False), (RT.TOP - 3, False)])
def test_all_contexts_left_out_when_it_repeats_top_talkers(n_contexts, shown):
    p = render(RT.tables(n_contexts=n_contexts), RT.summary(n_contexts))
    assert any(a.get("data-table") == "top_talkers" for a in p.all("table"))
    assert any(a.get("data-table") == "contexts" for a in p.all("table")) == shown
    p.index("h3", id="contexts")                        # the section stays, with its file links
    assert "contexts.csv" in [a.get("href") for a in p.all("a")]


def test_same_length_different_rows_are_shown():
    t = RT.tables(n_contexts=RT.TOP)
    t["contexts"] = [dict(r, packets=r["packets"] + 1) for r in t["contexts"]]
    assert any(a.get("data-table") == "contexts" for a in render(t, RT.summary(RT.TOP)).all("table"))


def test_empty_capture(tmp_path):
    t = {name: [] for name in RT.tables()}
    t["summary"] = [dict(key="datagrams", value=0)]
    s = dict(RT.summary(0), datagrams=0, records=0, bytes=0, first_seen=None, last_seen=None, topics=0)
    write_report(tmp_path, t, s, top=RT.TOP)
    text = "".join(Page((tmp_path / "report.html").read_text()).text)
    assert "no datagrams" in text and "No problems found" in text and "no data to plot" in text


# ============================================================== plots


def _drawn(fig):
    fig.canvas.draw()
    return fig


def test_legends_outside_the_axes():
    for name, _what, fig in figures(RT.tables(), RT.THRESHOLD, CaptureClock(RT.iso(RT.START_US))):
        _drawn(fig)
        for ax in fig.axes:
            leg = ax.get_legend()
            if leg is not None:
                assert not leg.get_window_extent().overlaps(ax.get_window_extent()), name


def test_bars_log_scaled_when_range_demands_and_labelled():
    assert wants_log([1, 51]) and not wants_log([1, 50]) and not wants_log([0, 0]) and wants_log([0, 2, 500])
    fig = _drawn(plot_bars(["a", "b", "c"], [("n", [5000, 40, 2])], "t", "x"))
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.texts] == ["5,000", "40", "2"]
    labels = [t.get_window_extent() for t in ax.texts]
    assert all(ax.get_window_extent().contains(b.x1 - 1, (b.y0 + b.y1) / 2) for b in labels)  # inside the axes
    fig = _drawn(plot_bars(["a", "b"], [("n", [50, 1]), ("m", [0, 3])], "t", "x"))
    assert fig.axes[0].get_xscale() == "linear"
    assert [t.get_text() for t in fig.axes[0].texts] == ["50", "1", "", "3"]     # no label on an empty bar


def test_time_to_resolve_names_the_full_src_id():
    rows = [dict(querier="10.0.0.1:1000", src_id="0123456789abcdef", topic="t", time_to_resolve_s=0.5),
            dict(querier="10.0.0.2:1000", src_id=None, topic="u", time_to_resolve_s=None)]
    labels = [t.get_text() for t in _drawn(plot_time_to_resolve(rows)).axes[0].get_yticklabels()]
    assert labels == ["10.0.0.1:1000 [0123456789abcdef] t"]


def test_plots_written_as_png(tmp_path):
    t = RT.tables()
    write_report(tmp_path, t, RT.summary(), top=RT.TOP)
    for name in ("load.png", "census.png", "top_topics.png", "top_talkers.png", "time_to_resolve.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    empty = {name: [] for name in t}                   # a re-run without data leaves no stale plot
    write_report(tmp_path, empty, RT.summary(), top=RT.TOP)
    assert not list(tmp_path.glob("*.png"))
