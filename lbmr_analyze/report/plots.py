"""The report's PNG plots (matplotlib, Agg backend).

Times on the axes are offsets from the capture start (seconds, or minutes for
spans over two hours); legends sit outside the axes, right of them, so they never
cover data; bar charts carry their values and switch to a log scale when the
largest bar is more than :data:`LOG_RATIO` times the smallest.
"""

from __future__ import annotations

import os
from pathlib import Path

from .clock import CaptureClock

#: Bars use a log scale when max / min (of the non-zero values) exceeds this.
LOG_RATIO = 50
#: Longest bar or dot label, in characters (longer ones end in "...").
LABEL_CHARS = 80
#: Load over a span longer than this (seconds) is plotted per minute.
PER_MINUTE_SPAN = 7200


def _plt():
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def save(fig, path: Path | None) -> bool:
    """Write ``fig`` to ``path`` atomically and close it; False (and no file) for no figure."""
    if fig is None:
        return False
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, path)
    _plt().close(fig)
    return True


def _legend_outside(ax) -> None:
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _short_label(s: str) -> str:
    return s if len(s) <= LABEL_CHARS else s[:LABEL_CHARS - 3] + "..."


def _time_axis(span_s: float) -> tuple[float, str]:
    """(seconds per axis unit, unit name) for a span in seconds."""
    return (60.0, "minutes") if span_s > PER_MINUTE_SPAN else (1.0, "seconds")


def plot_load(load: list[dict], threshold: int, clock: CaptureClock):
    """Datagrams per second (per-minute means for spans over two hours) as steps,
    all kinds and per record kind, on a log scale with the storm threshold drawn.  None when
    there is no traffic."""
    if not load:
        return None
    plt = _plt()
    span = load[-1]["second"] - load[0]["second"]
    step = 60 if span > PER_MINUTE_SPAN else 1
    unit, unit_name = _time_axis(span)
    series: dict[str, dict[int, int]] = {}
    for r in load:
        b = r["second"] // step * step
        d = series.setdefault(r["record_kind"], {})
        d[b] = d.get(b, 0) + r["packets"]
    first, last = load[0]["second"] // step * step, load[-1]["second"] // step * step
    fig, ax = plt.subplots(figsize=(11, 4.2), layout="constrained")
    dense = (last - first) // step < 200_000
    for kind in sorted(series, key=lambda k: (k != "ALL", k)):
        d = series[kind]
        pts = [(b, d.get(b, 0)) for b in range(first, last + step, step)] if dense else sorted(d.items())
        pts.append((pts[-1][0] + step, pts[-1][1]))                # the last bucket's end
        xs = [clock.offset_s(t) / unit for t, _ in pts]
        ys = [v / step if v else float("nan") for _, v in pts]     # log scale: gaps for idle buckets
        ax.step(xs, ys, where="post", linewidth=2 if kind == "ALL" else 0.9, label=kind,
                color="black" if kind == "ALL" else None, zorder=3 if kind == "ALL" else 2)
    ax.axhline(threshold, color="red", linestyle="--", linewidth=1, label=f"storm threshold ({threshold}/s)")
    ax.set_yscale("log")
    ax.set_xlim(0, clock.offset_s(last + step) / unit)     # the first bucket starts before the first datagram
    ax.set_ylabel("datagrams per second" + (" (per-minute mean)" if step > 1 else ""))
    ax.set_xlabel(f"{unit_name} after capture start")
    _legend_outside(ax)
    ax.grid(alpha=0.3, which="both")
    ax.set_title("LBMR load over time (log scale)")
    return fig


def plot_census(census: list[dict], clock: CaptureClock):
    """Keepalive clients per minute (None with less than two minutes of data)."""
    if len(census) < 2:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(11, 3), layout="constrained")
    ax.step([clock.offset_s(r["minute"]) / 60 for r in census], [r["clients"] for r in census],
            where="post")
    ax.set_ylabel("clients")
    ax.set_xlabel("minutes after capture start")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.set_title("lbmrd keepalive clients per minute")
    return fig


def wants_log(values: list[float]) -> bool:
    """True when the non-zero values span more than :data:`LOG_RATIO` (largest over smallest)."""
    pos = [v for v in values if v > 0]
    return bool(pos) and max(pos) / min(pos) > LOG_RATIO


def _value_axis(ax, values: list[float], log: bool) -> None:
    """Room right of the longest bar for its value label."""
    top = max(values) if values and max(values) > 0 else 1
    if log:
        ax.set_xscale("log")
        bottom = 0.5 * min(v for v in values if v > 0)
        ax.set_xlim(bottom, top * (top / bottom) ** 0.15)
    else:
        ax.set_xlim(0, top * 1.15)


def plot_bars(labels: list[str], series: list[tuple[str, list[float]]], title: str, xlabel: str):
    """Horizontal bars (one per series side by side for each label), each labelled
    with its value; the figure's height grows with the number of bars.  None
    without labels."""
    if not labels:
        return None
    plt = _plt()
    per = len(series)
    fig, ax = plt.subplots(figsize=(11, (0.22 + 0.14 * per) * len(labels) + 1.4), layout="constrained")
    height = 0.8 / per
    values = [v for _name, vals in series for v in vals]
    log = wants_log(values)
    for i, (name, vals) in enumerate(series):
        ys = [len(labels) - 1 - j + 0.4 - height * (i + 0.5) for j in range(len(labels))]
        bars = ax.barh(ys, vals, height=height, label=name)
        ax.bar_label(bars, labels=[f"{v:,}" if v else "" for v in vals], padding=3, fontsize="x-small")
    _value_axis(ax, values, log)
    ax.set_yticks(range(len(labels))[::-1])
    ax.set_yticklabels([_short_label(lb) for lb in labels], fontsize="small")
    ax.set_ylim(-0.6, len(labels) - 0.4)
    ax.set_xlabel(xlabel + (" (log scale)" if log else ""))
    if per > 1:
        _legend_outside(ax)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title)
    return fig


def context_label(context: str, src_id: str | None) -> str:
    """``ip:port [src_id]`` (the src_id's 16 hex digits in full), or the context alone."""
    return f"{context} [{src_id}]" if src_id else context


def plot_time_to_resolve(ttr: list[dict]):
    """A histogram of times to resolve (20 or more pairs) or one dot per pair (None
    without a resolved pair)."""
    vals = sorted(r["time_to_resolve_s"] for r in ttr if r["time_to_resolve_s"] is not None)
    if not vals:
        return None
    plt = _plt()
    n = len(vals)
    if n >= 20:
        fig, ax = plt.subplots(figsize=(11, 3.5), layout="constrained")
        ax.hist(vals, bins=min(40, max(10, n // 5)))
        ax.set_ylabel("(querier, topic) pairs")
        ax.set_xlim(left=0)
    else:
        fig, ax = plt.subplots(figsize=(11, 0.3 * n + 1.4), layout="constrained")
        rows = sorted((r for r in ttr if r["time_to_resolve_s"] is not None),
                      key=lambda r: r["time_to_resolve_s"])
        ax.scatter([r["time_to_resolve_s"] for r in rows], range(n))
        ax.set_yticks(range(n))
        ax.set_yticklabels([_short_label(f"{context_label(r['querier'], r['src_id'])} {r['topic']}")
                            for r in rows], fontsize="small")
        ax.set_xlim(0, max(vals) * 1.1 or 1)
        ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlabel("seconds from first TQR to first TIR")
    ax.grid(alpha=0.3)
    ax.set_title(f"Time to resolve ({n} pair{'s' if n != 1 else ''}; median {vals[n // 2]:.3f} s, "
                 f"max {vals[-1]:.3f} s)")
    return fig


#: Every plot file the report may hold.
PLOT_FILES = ("load.png", "census.png", "top_topics.png", "top_talkers.png", "time_to_resolve.png")


def figures(tables: dict[str, list[dict]], threshold: int, clock: CaptureClock) -> list[tuple[str, str, object]]:
    """(file name, description, figure or None) of every plot."""
    tt, tk = tables["top_topics"], tables["top_talkers"]
    return [
        ("load.png", "LBMR load over time, log scale, with the storm threshold",
         plot_load(tables["load_per_second"], threshold, clock)),
        ("census.png", "lbmrd keepalive clients per minute", plot_census(tables["keepalive_census"], clock)),
        ("top_topics.png", "Top topics",
         plot_bars([r["topic"] for r in tt], [("advertisements", [r["advertisements"] for r in tt]),
                                              ("queries", [r["queries"] for r in tt])],
                   "Top topics by records", "records (TIRs, TQRs)")),
        ("top_talkers.png", "Top talkers (contexts)",
         plot_bars([context_label(r["context"], r["src_id"]) for r in tk], [("datagrams", [r["packets"] for r in tk])],
                   "Top talkers (contexts) by datagrams", "LBMR datagrams")),
        ("time_to_resolve.png", "Time to resolve", plot_time_to_resolve(tables["time_to_resolve"])),
    ]


def write_plots(out: Path, tables: dict[str, list[dict]], threshold: int,
                clock: CaptureClock) -> list[tuple[str, str]]:
    """Write the plots that have data; returns their (file name, description)."""
    for p in PLOT_FILES:
        (out / p).unlink(missing_ok=True)
    return [(name, what) for name, what, fig in figures(tables, threshold, clock) if save(fig, out / name)]


#: Sessions plotted in the transport section (most NAKs and retransmissions first).
TRANSPORT_PLOTS = 8
#: (timeline column, label, colour, line width) of a session's plot.
_TRANSPORT_SERIES = (("originals", "original datagrams", "#9e9e9e", 1.0),
                     ("retransmissions", "retransmissions", "#1f77b4", 1.6),
                     ("nak_packets", "NAK packets", "#d62728", 1.6),
                     ("ncf_packets", "NCFs", "#ff7f0e", 1.2),
                     ("session_messages", "session messages", "#2ca02c", 1.0),
                     ("icmp_errors", "ICMP port unreachable", "#8c564b", 1.2))


def _epoch(iso: str | None) -> float | None:
    from .clock import parse
    return parse(iso).timestamp() if iso else None


def plot_transport_session(session: dict, rows: list[dict], clock: CaptureClock, base: float):
    """One session's traffic per second (originals, retransmissions, NAKs, NCFs,
    session messages, ICMP errors) as steps on a log scale, with the source's
    last original datagram and last packet marked.  ``base``: the epoch second
    the axis starts from when the capture has no start."""
    plt = _plt()
    off = (lambda t: clock.offset_s(t)) if clock.start else (lambda t: t - base)
    secs = [r["second"] for r in rows]
    first, last = min(secs), max(secs)
    span = last + 1 - first
    unit, unit_name = _time_axis(span)
    dense = span < 200_000
    by_sec = {r["second"]: r for r in rows}
    fig, ax = plt.subplots(figsize=(11, 3.4), layout="constrained")
    for col, label, colour, width in _TRANSPORT_SERIES:
        if not any(r[col] for r in rows):
            continue
        xs_s = range(first, last + 1) if dense else sorted(by_sec)
        pts = [(t, by_sec[t][col] if t in by_sec else 0) for t in xs_s]
        pts.append((pts[-1][0] + 1, pts[-1][1]))
        ax.step([off(t) / unit for t, _ in pts], [v if v else float("nan") for _, v in pts], where="post",
                color=colour, linewidth=width, label=label)
    for iso, label, style in ((session.get("last_original_ts"), "last original", ":"),
                              (session.get("source_last"), "source's last packet", "--")):
        t = _epoch(iso)
        if t is not None:
            ax.axvline(off(t) / unit, color="black", linestyle=style, linewidth=1, label=label)
    ax.set_yscale("log")
    ax.set_ylabel("per second")
    ax.set_xlabel(f"{unit_name} after capture start")
    ax.grid(alpha=0.3, which="both")
    _legend_outside(ax)
    topics = session.get("topics") or "topics unknown"
    title = f"{session['source']}  ({topics})"
    ax.set_title(title if len(title) <= 2 * LABEL_CHARS else title[:2 * LABEL_CHARS - 3] + "...", fontsize="medium")
    return fig


def transport_figures(tables: dict[str, list[dict]], clock: CaptureClock) -> list[tuple[str, str, object]]:
    """(file name, description, figure) of the sessions with NAKs, NCFs or
    retransmissions, at most :data:`TRANSPORT_PLOTS`, most NAKs and
    retransmissions first."""
    per: dict[str, list[dict]] = {}
    for r in tables.get("transport_timeline", []):
        per.setdefault(r["session"], []).append(r)
    sessions = {s["session"]: s for s in tables.get("transport_sessions", [])}
    busy = [s for s in sessions.values() if s["session"] in per
            and (s["nak_packets"] or s["retransmissions"] or s["icmp_errors"] or sum(
                s[c] for c in ("ncf_no_retry", "ncf_ignored", "ncf_rx_delay", "ncf_shed")))]
    busy.sort(key=lambda s: (-(s["nak_packets"] + s["retransmissions"]), s["session"]))
    base = min((r["second"] for rows in per.values() for r in rows), default=0)
    out = []
    for i, s in enumerate(busy[:TRANSPORT_PLOTS], 1):
        out.append((f"transport-{i}.png", f"NAKs and retransmissions over time: {s['source']}",
                    plot_transport_session(s, per[s["session"]], clock, base)))
    return out


def write_transport_plots(out: Path, tables: dict[str, list[dict]], clock: CaptureClock) -> list[tuple[str, str]]:
    """Write the transport section's plots; returns their (file name, description)."""
    for p in out.glob("transport-*.png"):
        p.unlink()
    return [(name, what) for name, what, fig in transport_figures(tables, clock) if save(fig, out / name)]
