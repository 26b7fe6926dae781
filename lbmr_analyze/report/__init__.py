"""The report: tables as Parquet, CSV and JSON, PNG plots and report.html.

Everything here works on the small collected result tables (lists of dicts):
:mod:`.files` writes the tables, :mod:`.plots` the plots, :mod:`.page` the HTML,
and :mod:`.clock` turns the tables' ISO times into milliseconds after the
capture start for the page.
"""

from __future__ import annotations

import html
from pathlib import Path

from . import page
from .clock import CaptureClock
from .files import replace, write_tables
from .page import HTML_ROWS, SERIES
from .plots import write_plots, write_transport_plots

__all__ = ["HTML_ROWS", "SERIES", "html_page", "write_report", "write_tables", "write_plots"]

#: A table left out of the page when another one shown before it holds the same rows.
DUPLICATES = {"contexts": "top_talkers"}


def _head(s: dict, clock: CaptureClock) -> str:
    """The page's first line: totals, and the capture's absolute start (once)."""
    when = "no datagrams"
    if s["first_seen"]:
        end = clock.short(s["last_seen"]) if s["last_seen"] else "-"
        when = (f"capture start {s['first_seen']}, end {end}; "
                "every other time on this page is in milliseconds after the start")
    return (f"{s['files']} file(s), {s['datagrams']} LBMR datagrams, {s['records']} records, "
            f"{s['bytes']} bytes; {s['topics']} topics, {s['contexts']} contexts; {when}.")


def _transport(name: str) -> bool:
    return name.startswith("transport_") and name != "transport_conflicts"


def _tables_html(tables: dict[str, list[dict]], clock: CaptureClock, top: int) -> list[str]:
    out = []
    for name, rows in tables.items():
        if name == "findings" or _transport(name):
            continue
        of = DUPLICATES.get(name)
        if of in tables and 0 < len(rows) <= top and page.same_rows(rows, tables[of]):
            out.append(page.duplicate_html(name, rows, of))
        else:
            out.append(page.table_html(name, rows, clock))
    return out


def write_report(out: Path, tables: dict[str, list[dict]], summary: dict, *, top: int = 20) -> None:
    """The plots and ``out/report.html`` (see :func:`html_page`)."""
    clock = CaptureClock(summary["first_seen"])
    plots = write_plots(out, tables, summary.get("storm_threshold", 0), clock)
    tplots = write_transport_plots(out, tables, clock)
    replace(out / "report.html", html_page(tables, summary, plots, top=top, transport_plots=tplots))


def _transport_head(s: dict) -> str:
    return (f"{s.get('transport_sessions', 0)} session(s) with traffic, "
            f"{s.get('transport_sessions_advertised', 0)} advertised by TIRs; "
            f"{s.get('transport_originals', 0)} original datagrams, {s.get('transport_retransmissions', 0)} "
            f"retransmissions, {s.get('transport_nak_packets', 0)} NAK packets; "
            f"{s.get('transport_bad_input', 0)} bad packet(s).")


def transport_html(tables: dict[str, list[dict]], summary: dict, plots: list[tuple[str, str]],
                   clock: CaptureClock) -> list[str]:
    """The transport section: its findings, a plot per session, its tables."""
    body = ['<h2 id="transport">Transport sessions</h2>',
            f'<p id="transport-head">{html.escape(_transport_head(summary))}</p>',
            '<h3 id="transport-findings">Transport findings</h3>',
            page.transport_findings_html(tables.get("findings", []), clock)]
    body += [f'<img src="{p}" alt="{html.escape(d)}">' for p, d in plots] or [
        '<p class="note">No NAKs or retransmissions to plot.</p>']
    body += [page.table_html(name, rows, clock) for name, rows in tables.items() if _transport(name)]
    return body


def html_page(tables: dict[str, list[dict]], summary: dict, plots: list[tuple[str, str]], *,
              top: int = 20, transport_plots: list[tuple[str, str]] = ()) -> str:
    """The page.  ``tables`` maps each table's name to its rows (the page shows
    them in that order); ``summary`` holds the totals (files, datagrams, records,
    bytes, topics, contexts, first_seen and last_seen as ISO times); ``plots`` are
    the (file name, description) of the plots beside it; ``top`` is the length of
    the top-N tables (``--top``): a table of at most that many rows that repeats one
    of them is left out.  With transport tables (``transport_*``), a transport
    section (its findings, ``transport_plots``, its tables) comes after the plots."""
    clock = CaptureClock(summary["first_seen"])
    toc = " &middot; ".join(f'<a href="#{n}">{html.escape(n)}</a>' for n in tables if n != "findings")
    body = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>lbmr-analyze report</title>", f"<style>{page.CSS}</style></head><body>",
        "<h1>LBMR topic resolution analysis</h1>",
        f'<p id="capture">{html.escape(_head(summary, clock))}</p>',
        '<h2 id="findings">Findings</h2>',
        page.findings_html(tables["findings"], clock),
        f'<p class="note">Findings as {page.links("findings")}. Tables: {toc}</p>',
        '<h2 id="plots">Plots</h2>',
    ]
    body += [f'<img src="{p}" alt="{html.escape(d)}">' for p, d in plots] or ["<p>no data to plot</p>"]
    if any(_transport(n) for n in tables):
        body += transport_html(tables, summary, list(transport_plots), clock)
    body.append('<h2 id="tables">Tables</h2>')
    body += _tables_html(tables, clock, top)
    body.append('<p class="note">Generated by lbmr-analyze; raw records: '
                '<code>records/</code> (Parquet, partitioned by hour; schema in lbmr-analyze(1)).</p>')
    body.append(f"<script>{page.JS}</script>")
    body.append("</body></html>")
    return "\n".join(body) + "\n"
