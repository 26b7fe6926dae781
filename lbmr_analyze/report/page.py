"""report.html: one self-contained page (inline style and script, plots beside it).

Order: one line on the capture (with its absolute start; every other time on the
page is milliseconds after it), the findings (a count per kind, most severe kind
first, then per kind one line per finding whose details unfold on a click), the
plots, and the tables: sortable (click a column header) and filterable (a text
box above each long table) by a small inline script.  Long time series (load per
second, clients per minute) are plots only; their full data is in the files.
"""

from __future__ import annotations

import html
import json

from ..findings import SEVERITIES
from .clock import ISO_TIME, CaptureClock
from .files import as_text

#: Rows of each table shown in report.html (the CSV/JSON files have them all).
HTML_ROWS = 1000
#: Tables shown as plots only (long series).
SERIES = ("load_per_second", "keepalive_census", "transport_timeline")
#: Tables with more rows than this get a filter box.
FILTER_ROWS = 5
#: The fields every finding has; any other field is shown among its details.
_FINDING_HEAD = ("severity", "kind", "finding", "table")

TITLES = {
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
    "transport_sessions": "Transport sessions (one row per session: UM's source string)",
    "transport_receivers": "Transport receivers (one row per session and receiver)",
    "transport_topics": "Transport topics (one row per session and topic index)",
    "transport_timeline": "Transport traffic per session and second",
    "transport_errors": "Transport bad input and bounds",
}

#: The rule behind a table, shown under its title.
NOTES = {
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
    "transport_sessions": "Sessions from TIRs, or found by their own headers (from_tir false). Originals and "
                          "retransmissions count DATA datagrams apart; NCFs by reason; receivers: NAK senders, "
                          "LBT-RU clients and TCP connections (ip:port), then ctx:ip:port, the contexts whose "
                          "TQRs asked for one of the session's topics. source_last: the source's last packet. "
                          "icmp_errors: ICMP port unreachable answering datagrams to the source (the source "
                          "was gone); receiver_icmp_errors: answering the source's own datagrams (a receiver "
                          "was gone).",
    "transport_receivers": "loss_estimate: distinct sequence numbers NAKed over the session's originals; recovery: "
                           "first NAK to the first retransmission after it (p50 to 2 %); outstanding: NAKed and "
                           "never retransmitted after (outstanding_from/_to: their first NAKs); icmp_errors: ICMP "
                           "port unreachable from the receiver's host answering the source's datagrams.",
    "transport_errors": "Packets on a session's addresses that did not decode (counted once and dropped), and "
                        "what a bound kept out of the tables.",
}

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em 2em;max-width:1500px;color:#222}
table{border-collapse:collapse;font-size:13px}
table.t{width:100%}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}
table.t th{background:#eee;cursor:pointer;user-select:none;position:sticky;top:0}
th.asc::after{content:" \\25B2"}th.desc::after{content:" \\25BC"}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
img{max-width:100%;border:1px solid #ddd;margin:.3em 0 .8em;display:block}
.note{color:#666;font-size:12px}
input.filter{display:block;font-size:12px;margin:.2em 0 .3em;width:20em}
.scroll{display:block;max-height:32em;overflow:auto;margin:0 0 1.5em}
.sev{font-weight:bold;padding:0 .4em;border-radius:3px;color:#fff;font-size:12px}
.critical{background:#b00020}.high{background:#d35400}.medium{background:#b7950b}.low{background:#607d8b}
table.kinds{margin:.3em 0 1em}table.kinds td{border:none;padding:1px 8px 1px 0}
section.kind{margin:0 0 .8em}
section.kind h3{margin:.6em 0 .2em;font-size:15px}
details.finding{margin:0 0 .15em}
details.finding>summary{display:block;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;cursor:pointer}
details.finding>summary::-webkit-details-marker{display:none}
details.finding>summary::before{content:"\\25B8  "}details.finding[open]>summary::before{content:"\\25BE  "}
.fbody{margin:.1em 0 .5em 1.4em;font-size:13px}
.fbody p{margin:.2em 0}
dl.fields{display:grid;grid-template-columns:max-content 1fr;gap:0 1em;margin:.2em 0}
dl.fields dt{color:#666}dl.fields dd{margin:0;overflow-wrap:anywhere}
p.more{margin:0 0 .15em 1.2em}
ul.tfindings{margin:.3em 0 1em;padding-left:1.2em;font-size:13px}ul.tfindings li{margin:0 0 .3em}
"""

# Sort on header click (by a cell's data-v when it has one, numbers numerically),
# filter rows containing the text typed.
JS = """
document.querySelectorAll('table.t').forEach(function(t){
  var body=t.tBodies[0];
  function key(c){return c.hasAttribute('data-v')?c.getAttribute('data-v'):c.textContent;}
  t.querySelectorAll('th').forEach(function(th,i){
    th.addEventListener('click',function(){
      var asc=!th.classList.contains('asc');
      t.querySelectorAll('th').forEach(function(h){h.classList.remove('asc','desc');});
      th.classList.add(asc?'asc':'desc');
      var rows=Array.prototype.slice.call(body.rows);
      rows.sort(function(a,b){
        var x=key(a.cells[i]),y=key(b.cells[i]),nx=parseFloat(x),ny=parseFloat(y);
        var c=(!isNaN(nx)&&!isNaN(ny)&&/^[-+]?[0-9.e+-]+$/i.test(x)&&/^[-+]?[0-9.e+-]+$/i.test(y))?nx-ny:x.localeCompare(y);
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


def _esc(v) -> str:
    return html.escape(str(v))


def _value(v, clock: CaptureClock) -> str:
    """A value as page text: booleans ``true``/``false``, ISO times short."""
    if isinstance(v, (list, tuple)):
        return ", ".join(_value(x, clock) for x in v)
    return clock.shorten_text(as_text(v) or "")


def _cell(v, clock: CaptureClock) -> str:
    if v is None:
        return "<td></td>"
    if isinstance(v, bool):
        return f"<td>{as_text(v)}</td>"
    if isinstance(v, (int, float)):
        return f'<td class="n">{_esc(v)}</td>'
    s = str(v)
    if ISO_TIME.fullmatch(s) and clock.start:
        return f'<td class="n" data-v="{clock.offset_us(s)}" title="{_esc(s)}">{_esc(clock.short(s))}</td>'
    return f"<td>{_esc(s)}</td>"


def links(name: str) -> str:
    return (f'<a href="{name}.csv">CSV</a> &middot; <a href="{name}.json">JSON</a> &middot; '
            f'<a href="{name}.parquet">Parquet</a>')


def _heading(name: str) -> list[str]:
    parts = [f'<h3 id="{name}">{_esc(TITLES.get(name, name))}</h3>']
    if name in NOTES:
        parts.append(f'<p class="note">{_esc(NOTES[name])}</p>')
    return parts


def table_html(name: str, rows: list[dict], clock: CaptureClock) -> str:
    """One table's section: title, rule, row count and file links, filter box, table."""
    parts = _heading(name)
    if name in SERIES:
        parts.append(f'<p class="note">{len(rows)} row(s), shown as a plot &middot; {links(name)}</p>')
        return "\n".join(parts)
    shown = f" &middot; first {HTML_ROWS} shown (all in the files)" if len(rows) > HTML_ROWS else ""
    parts.append(f'<p class="note">{len(rows)} row(s) &middot; {links(name)}{shown}</p>')
    if not rows:
        parts.append("<p>none</p>")
        return "\n".join(parts)
    cols = list(rows[0])
    if len(rows) > FILTER_ROWS:
        parts.append(f'<input class="filter" data-table="{name}" placeholder="filter rows..." '
                     f'aria-label="filter {name}">')
    parts.append(f'<div class="scroll"><table class="t" id="t-{name}" data-table="{name}"><thead><tr>'
                 + "".join(f"<th>{_esc(c)}</th>" for c in cols) + "</tr></thead><tbody>")
    for r in rows[:HTML_ROWS]:
        parts.append("<tr>" + "".join(_cell(r.get(c), clock) for c in cols) + "</tr>")
    parts.append("</tbody></table></div>")
    return "\n".join(parts)


def same_rows(a: list[dict], b: list[dict]) -> bool:
    """True when two tables hold the same rows (in any order)."""
    def key(rows):
        return sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)
    return len(a) == len(b) and key(a) == key(b)


def duplicate_html(name: str, rows: list[dict], of: str) -> str:
    """The section of a table left out because table ``of`` shows the same rows."""
    return "\n".join(_heading(name) + [
        f'<p class="note">{len(rows)} row(s), the same as <a href="#{of}">{_esc(TITLES.get(of, of))}</a> '
        f"above &middot; {links(name)}</p>"])


# --------------------------------------------------------------------------- findings

def _severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else len(SEVERITIES)


def _more_count(f: dict) -> int:
    """How many findings a row stands for: N for the "... and N more" row, else 1."""
    text = f["finding"]
    if text.startswith("... and "):
        n = text[len("... and "):].split(" ", 1)[0]
        if n.isdigit():
            return int(n)
    return 1


def finding_groups(findings: list[dict]) -> list[tuple[str, str, int, list[dict]]]:
    """(kind, its most severe severity, number of findings, rows) per kind, most
    severe kind first; among kinds of one severity the one with fewer findings
    first (so a capture-wide storm is not pushed below twenty per-topic items),
    then in the order the findings list them. A kind's rows: the most severe
    first, else in the findings' order ("... and N more" last)."""
    rows: dict[str, list[dict]] = {}
    for f in findings:
        rows.setdefault(f["kind"], []).append(f)
    out = []
    for kind, fs in rows.items():
        fs = sorted(fs, key=lambda f: (f["finding"].startswith("... and "), _severity_rank(f["severity"])))
        worst = min((f["severity"] for f in fs), key=_severity_rank)
        out.append((kind, worst, sum(_more_count(f) for f in fs), fs))
    out.sort(key=lambda g: (_severity_rank(g[1]), g[2]))
    return out


def severity_counts(rows: list[dict]) -> list[tuple[str, int]]:
    """(severity, number of findings) of a kind's rows, most severe first."""
    counts: dict[str, int] = {}
    for f in rows:
        counts[f["severity"]] = counts.get(f["severity"], 0) + _more_count(f)
    return sorted(counts.items(), key=lambda c: _severity_rank(c[0]))


def kind_count(n: int, rows: list[dict]) -> str:
    """A kind's number of findings, with how many of each severity when they
    differ ("3: 1 high, 2 low"): its badge shows the most severe one only."""
    counts = severity_counts(rows)
    if len(counts) < 2:
        return str(n)
    return f"{n}: " + ", ".join(f"{k} {sev}" for sev, k in counts)


def _badge(severity: str) -> str:
    cls = severity if severity in SEVERITIES else "low"
    return f'<span class="sev {cls}">{_esc(severity)}</span>'


def _details(f: dict, clock: CaptureClock) -> list[tuple[str, str]]:
    """(field, page text) of a finding's fields beyond severity, kind, text and table."""
    out = []
    for k, v in f.items():
        if k in _FINDING_HEAD or v is None or v == "" or v == []:
            continue
        out.append((k, _value(v, clock)))
    return out


def finding_html(f: dict, clock: CaptureClock, group_severity: str | None) -> str:
    """One line (text, and its severity when it differs from its kind's, or
    always when ``group_severity`` is None: a kind of mixed severities); its
    fields and table link unfold beneath it.  A finding with no fields beyond its
    text (such as "... and N more") is a plain line."""
    text = _esc(_value(f["finding"], clock))
    link = f'<a href="#{_esc(f["table"])}">&rarr; {_esc(f["table"])}</a>' if f.get("table") else ""
    fields = _details(f, clock)
    if not fields:
        return f'<p class="more">{text} {link}</p>'
    badge = _badge(f["severity"]) + " " if f["severity"] != group_severity else ""
    dl = "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(v)}</dd>" for k, v in fields)
    return (f'<details class="finding"><summary title="{text}">{badge}{text}</summary>'
            f'<div class="fbody"><p>{text}</p><dl class="fields">{dl}</dl>{link}</div></details>')


def transport_findings_html(findings: list[dict], clock: CaptureClock) -> str:
    """The transport section's findings: one line each, most severe first, with
    a link to its table (the details unfold in the Findings section above)."""
    rows = [f for f in findings if str(f.get("table", "")).startswith("transport_")]
    if not rows:
        return "<p>No transport findings: no loss, NCFs, storms, slow receivers or bad input in the sessions.</p>"
    parts = ['<ul class="tfindings">']
    for f in rows:
        text = _esc(_value(f["finding"], clock))
        parts.append(f'<li>{_badge(f["severity"])} <b>{_esc(f["kind"])}</b>: {text} <a href="#{_esc(f["table"])}">&rarr; '
                     f'{_esc(f["table"])}</a></li>')
    parts.append("</ul>")
    return "\n".join(parts)


def findings_html(findings: list[dict], clock: CaptureClock) -> str:
    """The count per kind, then each kind's findings."""
    if not findings:
        return ("<p>No problems found: every queried topic was advertised, no conflicts, storms, "
                "unreachable addresses or errors.</p>")
    groups = finding_groups(findings)
    parts = ['<table class="kinds" id="finding-kinds"><tbody>']
    for i, (kind, sev, n, rows) in enumerate(groups):
        parts.append(f'<tr><td>{_badge(sev)}</td><td class="n">{_esc(kind_count(n, rows))}</td>'
                     f'<td><a href="#fk-{i}">{_esc(kind)}</a></td></tr>')
    parts.append("</tbody></table>")
    for i, (kind, sev, n, rows) in enumerate(groups):
        parts.append(f'<section class="kind" id="fk-{i}"><h3>{_badge(sev)} {_esc(kind)} '
                     f'({_esc(kind_count(n, rows))})</h3>')
        mixed = len(severity_counts(rows)) > 1
        parts += [finding_html(f, clock, None if mixed else sev) for f in rows]
        parts.append("</section>")
    return "\n".join(parts)
