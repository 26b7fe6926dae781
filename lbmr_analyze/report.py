"""The report: tables as CSV and JSON, PNG plots (matplotlib, Agg) and report.html.

Everything here works on the small collected result tables (lists of dicts).
The page opens with the findings (most severe first, each linking to its table),
then a short summary, the plots, and the tables: sortable (click a column
header) and filterable (a text box per table) by a small inline script, so the
page needs no network.  Long time series (load per second, clients per minute)
are plots only; their full data is in the CSV/JSON files.
"""

from __future__ import annotations

import html
import json
import os
from datetime import UTC, datetime
from pathlib import Path

#: Rows of each table shown in report.html (the CSV/JSON files have them all).
HTML_ROWS = 1000
#: Tables shown as plots only (long series).
SERIES = ("load_per_second", "keepalive_census")

_TITLES = {
    "findings": "Findings",
    "summary": "Summary",
    "files": "Capture files",
    "topic_inventory": "Topic inventory (most records first)",
    "unresolved_topics": "Topics queried and never advertised (per querier)",
    "stale_queries": "Queriers still asking after their topic's last advertisement",
    "time_to_resolve": "Time to resolve (first TQR from a querier to the first TIR at or after it; slowest first)",
    "transport_conflicts": "Transport conflicts: one transport identity advertised by several contexts",
    "otid_collisions": "OTID collisions: one OTID for several topics or contexts",
    "multi_transport_topics": "One context advertising a topic on several transports",
    "load_per_second": "Load per second by record kind",
    "storms": "Storm seconds (with the contexts that sent most)",
    "storm_contexts": "Datagrams per context in storm seconds",
    "top_talkers": "Top talkers (contexts, ip:port)",
    "contexts": "All contexts (ip:port and src_id)",
    "top_topics": "Top topics",
    "wildcard_patterns": "Wildcard patterns",
    "wildcard_matches": "Topics matched by wildcard patterns",
    "keepalive_senders": "Keepalive clients (lbmrd view)",
    "keepalive_census": "Keepalive clients per minute",
    "client_changes": "lbmrd clients that joined or vanished",
    "nat_audit": "NAT audit: advertised addresses unreachable from the capture's networks",
    "capture_errors": "Capture file errors",
    "decode_errors": "Undecodable datagrams",
}


#: The rule behind a table, shown under its title.
_NOTES = {
    "nat_audit": "Rule of thumb: an advertised address is reachable when a host of its /24 was seen in the "
                 "capture (sending LBMR not relayed by lbmrd, or as a unicast destination), or when it is in the "
                 "same private block (10/8, 172.16/12, 192.168/16, 127/8, 169.254/16) as such a host. A TIR "
                 "relayed by lbmrd carries the original source's address; 0.0.0.0 and multicast are never flagged.",
    "client_changes": "lbmrd clients (keepalives or LBMR to port 15380) first heard more than 15 s after the "
                      "capture's first datagram (joined) or silent for more than 15 s before its last (vanished).",
    "stale_queries": "TQRs sent after the last TIR for their topic anywhere in the capture: the source went "
                     "silent, or this receiver does not hear it.",
    "transport_conflicts": "Several publishers of one topic on different transports are normal UM; one transport "
                           "identity claimed by different contexts is not.",
}


def _replace(path: Path, data: bytes | str) -> None:
    """Write atomically (so a re-run never leaves a half-written file)."""
    tmp = path.with_name(path.name + ".tmp")
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(tmp, mode, **({} if isinstance(data, bytes) else {"encoding": "utf-8", "newline": ""})) as f:
        f.write(data)
    os.replace(tmp, path)


def _columns(rows: list[dict]) -> list[str]:
    return list(rows[0]) if rows else []


def _arrow(rows: list[dict]):
    """The table as Arrow (columns typed from the values; a column mixing types,
    like the summary's values, as text)."""
    import pyarrow as pa
    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        return pa.Table.from_pylist([{k: None if v is None else str(v) for k, v in r.items()} for r in rows])


def write_tables(out: Path, tables: dict[str, list[dict]]) -> None:
    """``out/<name>.parquet``, ``out/<name>.csv`` (RFC 4180: header row, text quoted,
    ``true``/``false``, empty cell for null) and ``out/<name>.json`` (a list of
    objects) for every table, each written atomically.  Parquet and CSV come from
    one Arrow table (pyarrow's writers: a storm's 400,000 per-context rows took
    seconds through Python's csv and json modules)."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq
    for name, rows in tables.items():
        t = _arrow(rows)
        tmp = out / f"{name}.parquet.tmp"
        pq.write_table(t, tmp)
        os.replace(tmp, out / f"{name}.parquet")
        if t.num_columns:
            tmp = out / f"{name}.csv.tmp"
            pacsv.write_csv(t, str(tmp), pacsv.WriteOptions(quoting_style="needed"))
            os.replace(tmp, out / f"{name}.csv")
        else:
            _replace(out / f"{name}.csv", "\n")
        _replace(out / f"{name}.json", json.dumps(rows, default=str) + "\n")


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


def plot_load(path: Path, load: list[dict], threshold: int) -> bool:
    """Datagrams per second (per-minute means for spans over two hours), all kinds
    and per record kind, on a log scale with the storm threshold drawn.  False
    (and no file) when there is no traffic."""
    if not load:
        return False
    plt = _plt()
    from matplotlib import dates as mdates
    span = load[-1]["second"] - load[0]["second"]
    step = 60 if span > 7200 else 1
    series: dict[str, dict[int, int]] = {}
    for r in load:
        b = r["second"] // step * step
        d = series.setdefault(r["record_kind"], {})
        d[b] = d.get(b, 0) + r["packets"]
    first, last = load[0]["second"] // step * step, load[-1]["second"] // step * step
    fig, ax = plt.subplots(figsize=(10, 4.2))
    dense = (last - first) // step < 200_000
    for kind in sorted(series, key=lambda k: (k != "ALL", k)):
        d = series[kind]
        pts = [(b, d.get(b, 0)) for b in range(first, last + step, step)] if dense else sorted(d.items())
        xs = [datetime.fromtimestamp(t, UTC) for t, _ in pts]
        ys = [v / step if v else float("nan") for _, v in pts]     # log scale: gaps for idle buckets
        ax.plot(xs, ys, marker="." if len(xs) < 120 else None, linewidth=2 if kind == "ALL" else 0.8,
                label=kind, color="black" if kind == "ALL" else None)
    ax.axhline(threshold, color="red", linestyle="--", linewidth=1, label=f"storm threshold ({threshold}/s)")
    ax.set_yscale("log")
    ax.set_ylabel("datagrams per second" + (" (per-minute mean)" if step > 1 else ""))
    ax.set_xlabel("time (UTC)")
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    ax.legend(fontsize="small", ncol=4)
    ax.grid(alpha=0.3, which="both")
    ax.set_title("LBMR load over time (log scale)")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return True


def plot_census(path: Path, census: list[dict]) -> bool:
    """Keepalive clients per minute (only with more than one minute of data)."""
    if len(census) < 2:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 3))
    ax.step([datetime.fromtimestamp(r["minute"], UTC) for r in census], [r["clients"] for r in census],
            where="post")
    ax.set_ylabel("clients")
    ax.set_xlabel("minute (UTC)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.set_title("lbmrd keepalive clients per minute")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return True


def _barh(path: Path, labels: list[str], series: list[tuple[str, list[float]]], title: str,
          xlabel: str) -> bool:
    """Horizontal bars, the figure's height proportional to the number of bars."""
    if not labels:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(labels) + 1.3))
    ys = list(range(len(labels)))[::-1]
    left = [0.0] * len(labels)
    for name, vals in series:
        ax.barh(ys, vals, left=left, label=name)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_yticks(ys)
    ax.set_yticklabels([lb if len(lb) <= 60 else lb[:57] + "..." for lb in labels], fontsize="small")
    ax.set_xlabel(xlabel)
    if len(series) > 1:
        ax.legend(fontsize="small")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return True


def plot_time_to_resolve(path: Path, ttr: list[dict]) -> bool:
    """A histogram of times to resolve (20 or more pairs) or one dot per pair."""
    vals = sorted(r["time_to_resolve_s"] for r in ttr if r["time_to_resolve_s"] is not None)
    if not vals:
        return False
    plt = _plt()
    n = len(vals)
    if n >= 20:
        fig, ax = plt.subplots(figsize=(10, 3.5))
        ax.hist(vals, bins=min(40, max(10, n // 5)))
        ax.set_ylabel("(querier, topic) pairs")
        ax.set_xlim(left=0)
    else:
        fig, ax = plt.subplots(figsize=(10, 0.3 * n + 1.3))
        rows = sorted(ttr, key=lambda r: r["time_to_resolve_s"])
        ax.scatter([r["time_to_resolve_s"] for r in rows], range(n))
        ax.set_yticks(range(n))
        ax.set_yticklabels([((f"{r['querier']} [{r['src_id'][:8]}] " if r["src_id"] else f"{r['querier']} ")
                             + r["topic"])[:70] for r in rows], fontsize="small")
        ax.set_xlim(0, max(vals) * 1.1 or 1)
    ax.set_xlabel("seconds from first TQR to first TIR")
    ax.grid(alpha=0.3)
    ax.set_title(f"Time to resolve ({n} pair{'s' if n != 1 else ''}; median {vals[n // 2]:.3f} s, "
                 f"max {vals[-1]:.3f} s)")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return True


def write_plots(out: Path, tables: dict[str, list[dict]], threshold: int) -> list[tuple[str, str]]:
    """Write the plots that have data; returns their (file name, description)."""
    made = []
    for p in ("load.png", "census.png", "top_topics.png", "top_talkers.png", "time_to_resolve.png"):
        (out / p).unlink(missing_ok=True)
    if plot_load(out / "load.png", tables["load_per_second"], threshold):
        made.append(("load.png", "LBMR load over time, log scale, with the storm threshold"))
    if plot_census(out / "census.png", tables["keepalive_census"]):
        made.append(("census.png", "lbmrd keepalive clients per minute"))
    tt = tables["top_topics"]
    if _barh(out / "top_topics.png", [r["topic"] for r in tt],
             [("advertisements", [r["advertisements"] for r in tt]), ("queries", [r["queries"] for r in tt])],
             "Top topics by records", "records (TIRs + TQRs)"):
        made.append(("top_topics.png", "Top topics"))
    tk = tables["top_talkers"]
    if _barh(out / "top_talkers.png", [r["context"] + (f" [{r['src_id']}]" if r["src_id"] else "") for r in tk],
             [("datagrams", [r["packets"] for r in tk])], "Top talkers (contexts) by datagrams",
             "LBMR datagrams"):
        made.append(("top_talkers.png", "Top talkers (contexts)"))
    if plot_time_to_resolve(out / "time_to_resolve.png", tables["time_to_resolve"]):
        made.append(("time_to_resolve.png", "Time to resolve"))
    return made


# --------------------------------------------------------------------------- html

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em 2em;max-width:1500px;color:#222}
table{border-collapse:collapse;margin:.3em 0 1.5em;font-size:13px}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#eee;cursor:pointer;user-select:none;position:sticky;top:0}
th.asc::after{content:" \\25B2"}th.desc::after{content:" \\25BC"}
td.n{text-align:right;font-variant-numeric:tabular-nums}
img{max-width:100%;border:1px solid #ddd;margin:.3em 0;display:block}
.note{color:#666;font-size:12px}
.filter{font-size:12px;margin:.2em 0;width:20em}
.sev{font-weight:bold;padding:0 .4em;border-radius:3px;color:#fff}
.critical{background:#b00020}.high{background:#d35400}.medium{background:#b7950b}.low{background:#607d8b}
ol.findings li{margin:.35em 0}
.scroll{max-height:32em;overflow:auto;display:inline-block;max-width:100%}
"""

# Sort on header click (numbers numerically), filter rows containing the text typed.
_JS = """
document.querySelectorAll('table.t').forEach(function(t){
  var body=t.tBodies[0];
  t.querySelectorAll('th').forEach(function(th,i){
    th.addEventListener('click',function(){
      var asc=!th.classList.contains('asc');
      t.querySelectorAll('th').forEach(function(h){h.classList.remove('asc','desc');});
      th.classList.add(asc?'asc':'desc');
      var rows=Array.prototype.slice.call(body.rows);
      rows.sort(function(a,b){
        var x=a.cells[i].textContent,y=b.cells[i].textContent,nx=parseFloat(x),ny=parseFloat(y);
        var c=(!isNaN(nx)&&!isNaN(ny)&&/^-?[0-9.e+-]+$/i.test(x)&&/^-?[0-9.e+-]+$/i.test(y))?nx-ny:x.localeCompare(y);
        return asc?c:-c;});
      rows.forEach(function(r){body.appendChild(r);});
    });
  });
});
document.querySelectorAll('input.filter').forEach(function(inp){
  inp.addEventListener('input',function(){
    var q=inp.value.toLowerCase(),t=document.getElementById('t-'+inp.dataset.table);
    Array.prototype.forEach.call(t.tBodies[0].rows,function(r){
      r.style.display=r.textContent.toLowerCase().indexOf(q)>=0?'':'none';});
  });
});
"""


def _cell(v) -> str:
    if v is None:
        return "<td></td>"
    if isinstance(v, bool):
        return f"<td>{v}</td>"
    if isinstance(v, (int, float)):
        return f'<td class="n">{html.escape(str(v))}</td>'
    return f"<td>{html.escape(str(v))}</td>"


def _links(name: str) -> str:
    return (f'<a href="{name}.csv">CSV</a> &middot; <a href="{name}.json">JSON</a> &middot; '
            f'<a href="{name}.parquet">Parquet</a>')


def _table_html(name: str, rows: list[dict]) -> str:
    title = _TITLES.get(name, name)
    parts = [f'<h3 id="{name}">{html.escape(title)}</h3>']
    if name in SERIES:
        parts.append(f'<p class="note">{len(rows)} row(s), shown as a plot &middot; {_links(name)}</p>')
        return "\n".join(parts)
    if name in _NOTES:
        parts.append(f'<p class="note">{html.escape(_NOTES[name])}</p>')
    shown = f" &middot; first {HTML_ROWS} shown (all in the files)" if len(rows) > HTML_ROWS else ""
    parts.append(f'<p class="note">{len(rows)} row(s) &middot; {_links(name)}{shown}</p>')
    if not rows:
        parts.append("<p>none</p>")
        return "\n".join(parts)
    cols = _columns(rows)
    if len(rows) > 5:
        parts.append(f'<input class="filter" data-table="{name}" placeholder="filter rows...">')
    parts.append(f'<div class="scroll"><table class="t" id="t-{name}" data-table="{name}"><thead><tr>'
                 + "".join(f"<th>{html.escape(c)}</th>" for c in cols) + "</tr></thead><tbody>")
    for r in rows[:HTML_ROWS]:
        parts.append("<tr>" + "".join(_cell(r[c]) for c in cols) + "</tr>")
    parts.append("</tbody></table></div>")
    return "\n".join(parts)


def _findings_html(findings: list[dict]) -> str:
    if not findings:
        return "<p>No problems found: every queried topic was advertised, no conflicts, storms, " \
               "unreachable addresses or errors.</p>"
    items = []
    for f in findings:
        when = ""
        if f["first_seen"]:
            when = f' <span class="note">{html.escape(f["first_seen"])}'
            if f["last_seen"] and f["last_seen"] != f["first_seen"]:
                when += f" .. {html.escape(f['last_seen'])}"
            when += "</span>"
        items.append(f'<li><span class="sev {f["severity"]}">{f["severity"]}</span> '
                     f'<b>{html.escape(f["kind"])}</b>: {html.escape(f["finding"])}{when} '
                     f'<a href="#{f["table"]}">&rarr; {html.escape(f["table"])}</a></li>')
    return '<ol class="findings">' + "\n".join(items) + "</ol>"


def write_report(out: Path, tables: dict[str, list[dict]], summary: dict, *, top: int = 20) -> None:
    """The plots and ``out/report.html``."""
    plots = write_plots(out, tables, summary.get("storm_threshold", 0))
    s = summary
    head = (f"{s['files']} file(s), {s['datagrams']} LBMR datagrams, {s['records']} records, "
            f"{s['bytes']} bytes, {s['first_seen'] or '-'} .. {s['last_seen'] or '-'}; "
            f"{s['topics']} topics, {s['contexts']} contexts")
    counts = ", ".join(f"{n} {k}" for k, n in s["findings"].items() if n) or "none"
    toc = " &middot; ".join(f'<a href="#{n}">{html.escape(n)}</a>' for n in tables if n != "findings")
    body = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>lbmr-analyze report</title>", f"<style>{_CSS}</style></head><body>",
        "<h1>LBMR topic resolution analysis</h1>",
        f"<p>{html.escape(head)}</p>",
        f'<h2 id="findings">Findings ({html.escape(counts)})</h2>',
        _findings_html(tables["findings"]),
        f'<p class="note">Findings as {_links("findings")}. Tables: {toc}</p>',
        "<h2>Plots</h2>",
    ]
    body += [f'<img src="{p}" alt="{html.escape(d)}">' for p, d in plots] or ["<p>no data to plot</p>"]
    body.append("<h2>Tables</h2>")
    for name, rows in tables.items():
        if name != "findings":
            body.append(_table_html(name, rows))
    body.append('<p class="note">Generated by lbmr-analyze; raw records: '
                '<code>records/</code> (Parquet, partitioned by hour; schema in lbmr-analyze(1)).</p>')
    body.append(f"<script>{_JS}</script>")
    body.append("</body></html>")
    _replace(out / "report.html", "\n".join(body) + "\n")
