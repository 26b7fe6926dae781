"""The report: tables as CSV and JSON, PNG plots (matplotlib, Agg) and report.html.

Everything here works on the small collected result tables (lists of dicts).
"""

from __future__ import annotations

import csv
import html
import json
import os
from datetime import UTC, datetime
from pathlib import Path

#: Rows of each table shown in report.html (the CSV/JSON files have them all).
HTML_ROWS = 200
PLOTS = ("load.png", "top_topics.png", "top_talkers.png", "time_to_resolve.png")

_TITLES = {
    "summary": "Summary",
    "files": "Capture files",
    "topic_inventory": "Topic inventory",
    "unresolved_topics": "Unresolved topics (queried, never advertised)",
    "time_to_resolve": "Time to resolve (first TQR from a querier to the first TIR at or after it)",
    "topic_conflicts": "Topics advertised by several transport identities",
    "transport_conflicts": "Transport identities advertised from several source addresses",
    "load_per_second": "Load per second by record kind",
    "storms": "Storm seconds",
    "top_talkers": "Top talkers",
    "top_topics": "Top topics",
    "wildcard_patterns": "Wildcard patterns",
    "wildcard_matches": "Topics matched by wildcard patterns",
    "keepalive_senders": "Keepalive clients (lbmrd view)",
    "keepalive_census": "Keepalive clients per minute",
    "nat_audit": "NAT audit: TIRs advertising an address outside the sender's /24",
    "capture_errors": "Capture file errors",
    "decode_errors": "Undecodable datagrams",
}


def _replace(path: Path, data: bytes | str) -> None:
    """Write atomically (so a re-run never leaves a half-written file)."""
    tmp = path.with_name(path.name + ".tmp")
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(tmp, mode, **({} if isinstance(data, bytes) else {"encoding": "utf-8", "newline": ""})) as f:
        f.write(data)
    os.replace(tmp, path)


def _columns(rows: list[dict]) -> list[str]:
    cols: list[str] = []
    for r in rows[:1]:
        cols = list(r)
    return cols


def write_tables(out: Path, tables: dict[str, list[dict]]) -> None:
    """``out/<name>.csv`` (header row, empty cell for null) and ``out/<name>.json``
    (a list of objects) for every table."""
    import io
    for name, rows in tables.items():
        buf = io.StringIO()
        cols = _columns(rows)
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        for r in rows:
            w.writerow(["" if r[c] is None else r[c] for c in cols])
        _replace(out / f"{name}.csv", buf.getvalue())
        _replace(out / f"{name}.json", json.dumps(rows, indent=1, default=str) + "\n")


# --------------------------------------------------------------------------- plots

def _plt():
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, path)


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def plot_load(path: Path, load: list[dict]) -> None:
    """Datagrams per second (per minute for spans over two hours) by record kind."""
    plt = _plt()
    from matplotlib import dates as mdates
    fig, ax = plt.subplots(figsize=(9, 4.5))
    if not load:
        _empty(ax, "no LBMR traffic")
    else:
        span = load[-1]["second"] - load[0]["second"]
        step = 60 if span > 7200 else 1
        series: dict[str, dict[int, int]] = {}
        for r in load:
            b = r["second"] // step * step
            d = series.setdefault(r["record_kind"], {})
            d[b] = d.get(b, 0) + r["packets"]
        first, last = load[0]["second"] // step * step, load[-1]["second"] // step * step
        dense = (last - first) // step < 200_000       # show idle buckets as zero
        for kind in sorted(series, key=lambda k: (k != "ALL", k)):
            d = series[kind]
            pts = ([(b, d.get(b, 0)) for b in range(first, last + step, step)] if dense
                   else sorted(d.items()))
            xs = [datetime.fromtimestamp(t, UTC) for t, _ in pts]
            ys = [v / step for _, v in pts]
            ax.plot(xs, ys, marker="." if len(xs) < 120 else None, linewidth=1.5 if kind == "ALL" else 1,
                    label=kind)
        ax.set_ylabel("datagrams per second" + (" (per-minute mean)" if step > 1 else ""))
        ax.set_xlabel("time (UTC)")
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
        ax.legend(fontsize="small", ncol=3)
        ax.grid(alpha=0.3)
    ax.set_title("LBMR load over time by record kind")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def _barh(path: Path, labels: list[str], series: list[tuple[str, list[float]]], title: str,
          xlabel: str, empty: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, max(3.0, 0.3 * len(labels) + 1.5)))
    if not labels:
        _empty(ax, empty)
    else:
        ys = list(range(len(labels)))[::-1]
        left = [0.0] * len(labels)
        for name, vals in series:
            ax.barh(ys, vals, left=left, label=name)
            left = [a + b for a, b in zip(left, vals, strict=True)]
        ax.set_yticks(ys)
        ax.set_yticklabels([lb if len(lb) <= 48 else lb[:45] + "..." for lb in labels], fontsize="small")
        ax.set_xlabel(xlabel)
        if len(series) > 1:
            ax.legend(fontsize="small")
        ax.grid(axis="x", alpha=0.3)
    ax.set_title(title)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def plot_time_to_resolve(path: Path, ttr: list[dict]) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    vals = [r["time_to_resolve_s"] for r in ttr if r["time_to_resolve_s"] is not None]
    if not vals:
        _empty(ax, "no query was answered by an advertisement in the capture")
    else:
        ax.hist(vals, bins=min(40, max(5, len(vals) // 2)))
        ax.set_xlabel("seconds from first TQR to first TIR")
        ax.set_ylabel("(querier, topic) pairs")
        ax.grid(alpha=0.3)
    ax.set_title(f"Time to resolve ({len(vals)} pairs)")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def write_plots(out: Path, tables: dict[str, list[dict]]) -> None:
    plot_load(out / "load.png", tables["load_per_second"])
    tt = tables["top_topics"]
    _barh(out / "top_topics.png", [r["topic"] for r in tt],
          [("advertisements", [r["advertisements"] for r in tt]), ("queries", [r["queries"] for r in tt])],
          "Top topics by records", "records (TIRs + TQRs)", "no topics")
    tk = tables["top_talkers"]
    _barh(out / "top_talkers.png", [r["sender"] for r in tk], [("datagrams", [r["packets"] for r in tk])],
          "Top talkers (source IP) by datagrams", "LBMR datagrams", "no senders")
    plot_time_to_resolve(out / "time_to_resolve.png", tables["time_to_resolve"])


# --------------------------------------------------------------------------- html

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#eee}td.n{text-align:right}
img{max-width:100%;border:1px solid #ddd;margin:.5em 0}
.note{color:#666;font-size:12px}
"""


def _cell(v) -> str:
    if v is None:
        return "<td></td>"
    if isinstance(v, bool):
        return f"<td>{v}</td>"
    if isinstance(v, (int, float)):
        return f'<td class="n">{html.escape(str(v))}</td>'
    return f"<td>{html.escape(str(v))}</td>"


def _table_html(name: str, rows: list[dict]) -> str:
    title = _TITLES.get(name, name)
    parts = [f'<h2 id="{name}">{html.escape(title)}</h2>',
             f'<p class="note">{len(rows)} row(s) &middot; <a href="{name}.csv">CSV</a> &middot; '
             f'<a href="{name}.json">JSON</a>'
             + (f" &middot; first {HTML_ROWS} shown" if len(rows) > HTML_ROWS else "") + "</p>"]
    if rows:
        cols = _columns(rows)
        parts.append('<table class="t" data-table="' + name + '"><thead><tr>'
                     + "".join(f"<th>{html.escape(c)}</th>" for c in cols) + "</tr></thead><tbody>")
        for r in rows[:HTML_ROWS]:
            parts.append("<tr>" + "".join(_cell(r[c]) for c in cols) + "</tr>")
        parts.append("</tbody></table>")
    else:
        parts.append("<p>none</p>")
    return "\n".join(parts)


def write_report(out: Path, tables: dict[str, list[dict]], summary: dict, *, top: int = 20) -> None:
    """The plots and ``out/report.html``."""
    write_plots(out, tables)
    s = summary
    head = (f"{s['files']} file(s), {s['datagrams']} LBMR datagrams, {s['records']} records, "
            f"{s['bytes']} bytes, {s['first_seen'] or '-'} .. {s['last_seen'] or '-'}")
    toc = " &middot; ".join(f'<a href="#{n}">{html.escape(n)}</a>' for n in tables)
    body = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>lbmr-analyze report</title>", f"<style>{_CSS}</style></head><body>",
        "<h1>LBMR topic resolution analysis</h1>",
        f"<p>{html.escape(head)}</p>",
        f'<p class="note">{toc}</p>',
        "<h2>Plots</h2>",
        '<img src="load.png" alt="LBMR load over time by record kind">',
        f'<img src="top_topics.png" alt="Top {top} topics">',
        f'<img src="top_talkers.png" alt="Top {top} talkers">',
        '<img src="time_to_resolve.png" alt="Time to resolve distribution">',
    ]
    for name, rows in tables.items():
        body.append(_table_html(name, rows))
    body.append('<p class="note">Generated by lbmr-analyze; raw records: '
                '<code>records/</code> (Parquet, partitioned by hour).</p>')
    body.append("</body></html>")
    _replace(out / "report.html", "\n".join(body) + "\n")
