"""The transport pass: UM transport sessions (LBT-RM, LBT-RU, LBT-TCP) of the
captures, decoded on the executors and joined with topic resolution.

How it runs
    The decoding tasks (:func:`lbmr_analyze.rows.write_split_task`) keep the
    distinct datagrams of their split that hold a TIR or a TQR (the ``tr``
    partial table).  The driver merges them and broadcasts them; then one
    transport task per split (:func:`transport_task`, the same byte ranges)
    feeds a :class:`lbmr_proto.transport_sessions.TransportDecoder` those
    datagrams first, in time order, so every task knows every session the
    capture advertises, then every UDP datagram, TCP segment and ICMP error of
    its range.  A task returns its :class:`TransportPart`: the decoder's bounded
    :class:`~lbmr_proto.transport_sessions.SessionsState`, a per-second
    timeline per session and a few per-session facts; the driver merges the
    parts in time order (:func:`merge`), as one pass over the capture would
    have built them, and makes the tables (:func:`tables`).

Tables (times as UTC ISO strings, see lbmr-analyze(1))
    ``transport_sessions`` one row per session (the columns of
    :class:`~lbmr_proto.transport_sessions.SessionRow`, plus ``source_last``:
    the last packet the source sent, and ``icmp_first``/``icmp_last``);
    ``transport_receivers`` one row per (session, receiver)
    (:class:`~lbmr_proto.transport_sessions.ReceiverRow`, plus
    ``outstanding_from``/``outstanding_to``: the first NAKs of the sequence
    numbers still outstanding, earliest and latest); ``transport_topics`` one
    row per (session, topic index), with the contexts whose TQRs asked for the
    topic (``queriers``); ``transport_timeline`` per (session, second): original
    and retransmitted datagrams, NAK packets and entries, NCFs, session
    messages and ICMP errors quoting datagrams sent to the source; ``transport_errors`` bad input by reason and what
    a bound kept out.

What byte ranges change
    Every range knows every session a TIR anywhere in the capture advertises,
    so it may count a datagram sent before its session's first TIR that one
    pass in capture order (``lbmr-inspect --sessions``) does not (when the
    datagram does not pass the decoder's no-TIR header checks, e.g. a
    payload that is not LBMC).  A session found only by its headers (no TIR
    in the capture) is known to a range from its first packet there: packets
    on its addresses that do not decode before that are not counted as bad
    input, nor LBT-RU packets without a session-id option.  An LBT-TCP stream
    cut by a range boundary resynchronises on the next LBMC message.

Bounds
    The decoder's own (see :mod:`lbmr_proto.transport_sessions`);
    :data:`TIMELINE_MAX` (session, second) buckets per task (beyond, counted as
    ``timeline_buckets`` in ``transport_errors``); the topic-resolution
    datagrams every task learns: per decoding task those of
    :class:`lbmr_analyze.rows.TopicResolution`, in all the earliest
    :data:`TR_MAX_ROWS` (:data:`TR_MAX_BYTES`), the rest counted as
    ``tr_datagrams``.
"""

from __future__ import annotations

import math
import os
import pickle
import time
from collections import Counter
from dataclasses import dataclass, field

from lbmr_proto.capture import UdpDatagram
from lbmr_proto.transport_sessions import (
    LBTTCP,
    SessionsState,
    TransportDecoder,
    TransportRecord,
    receiver_rows,
    session_rows,
    topic_rows,
)

from .analyses import iso_us
from .splits import Split, segments

#: (session, second) buckets of the timeline kept per task.
TIMELINE_MAX = 1 << 18
#: Topic-resolution datagrams (distinct) sent to every transport task, and their payload bytes.
TR_MAX_ROWS = 1 << 16
TR_MAX_BYTES = 64 << 20
#: The timeline's counters, in order.
TIMELINE_COLUMNS = ("originals", "retransmissions", "nak_packets", "nak_entries", "ncf_packets",
                    "session_messages", "icmp_errors")
_ORIG, _RX, _NAK, _NAKE, _NCF, _SM, _ICMP = range(7)
#: The transport tables, in report order.
TABLES = ("transport_sessions", "transport_receivers", "transport_topics", "transport_timeline",
          "transport_errors")
_SOURCE_KINDS = frozenset(("DATA", "SM", "NCF"))


@dataclass
class TransportPart:
    """What one transport task found in its byte range (or several merged):
    ``first_ts``/``last_ts`` of any packet read (seconds since the epoch; inf/-inf
    for none); ``state``: the decoder's sessions; ``timeline``: (session key,
    epoch second) -> the :data:`TIMELINE_COLUMNS` counts; ``source_last``:
    session key -> the time of the last packet its source sent; ``icmp``:
    session key -> (first, last) time of an ICMP error quoting a datagram sent
    to its source (a NAK, ACK or CREQ: the source was gone);
    ``overflow``: what this module's bounds kept out."""

    first_ts: float = math.inf
    last_ts: float = -math.inf
    state: SessionsState = field(default_factory=SessionsState)
    timeline: dict = field(default_factory=dict)
    source_last: dict = field(default_factory=dict)
    icmp: dict = field(default_factory=dict)
    overflow: Counter = field(default_factory=Counter)

    def add(self, recs: list) -> None:
        """Count the transport records of one packet."""
        for r in recs:
            if type(r) is not TransportRecord or not r.session:
                continue
            key = (r.session, int(r.ts // 1))
            b = self.timeline.get(key)
            if b is None:
                if len(self.timeline) >= TIMELINE_MAX:
                    self.overflow["timeline_buckets"] += 1
                    continue
                b = self.timeline[key] = [0] * len(TIMELINE_COLUMNS)
            if r.icmp:
                # only a datagram sent to the source (its ip:port is the session key's) says it is gone
                if r.session.split(":")[1:3] == [r.dst, str(r.dport)]:
                    b[_ICMP] += 1
                    f, la = self.icmp.get(r.session, (r.ts, r.ts))
                    self.icmp[r.session] = (min(f, r.ts), max(la, r.ts))
                continue
            k = r.kind
            if k == "DATA":
                b[_RX if r.retransmission else _ORIG] += 1
            elif k == "NAK":
                b[_NAK] += 1
                b[_NAKE] += len(r.sqns)
            elif k == "NCF":
                b[_NCF] += 1
            elif k == "SM":
                b[_SM] += 1
            from_source = k in _SOURCE_KINDS or (
                r.transport == LBTTCP and r.session.split(":")[1:3] == [r.src, str(r.sport)])
            if r.transport == LBTTCP and from_source and k == "SEGMENT" and r.length:
                b[_ORIG] += 1
            if from_source and r.ts > self.source_last.get(r.session, -math.inf):
                self.source_last[r.session] = r.ts

    def merge(self, later: TransportPart) -> TransportPart:
        """Add ``later`` (a later part of the capture); returns self."""
        self.first_ts = min(self.first_ts, later.first_ts)
        self.last_ts = max(self.last_ts, later.last_ts)
        self.state.merge(later.state)
        for k, v in later.timeline.items():
            mine = self.timeline.get(k)
            if mine is not None:
                for i, n in enumerate(v):
                    mine[i] += n
            elif len(self.timeline) < TIMELINE_MAX:
                self.timeline[k] = list(v)
            else:
                self.overflow["timeline_buckets"] += 1
        for s, t in later.source_last.items():
            self.source_last[s] = max(t, self.source_last.get(s, -math.inf))
        for s, (f, la) in later.icmp.items():
            f0, l0 = self.icmp.get(s, (f, la))
            self.icmp[s] = (min(f, f0), max(la, l0))
        self.overflow.update(later.overflow)
        return self


# --------------------------------------------------------------------------- executor side

def topic_resolution(tr_rows: list[tuple]) -> list[tuple]:
    """The ``tr`` partial table's rows (us, src, sport, dst, dport, payload) in
    time order, as the transport tasks learn them."""
    return sorted(tr_rows, key=lambda r: (r[0], r[1], r[2], r[3], r[4], r[5]))


def learn(decoder: TransportDecoder, tr_rows: list[tuple]) -> None:
    """Feed ``decoder`` the topic-resolution datagrams (time-ordered rows of
    :func:`topic_resolution`)."""
    for us, src, sport, dst, dport, payload in tr_rows:
        decoder.feed(UdpDatagram(us / 1e6, src, sport, dst, dport, payload, 0, -1))


def decode_range(split: Split, context: bytes, ports: frozenset[int], tr_rows: list[tuple]) -> TransportPart:
    """The transport part of one byte range (capture errors are the decoding
    task's to report; here reading just stops where it must)."""
    dec = TransportDecoder(lbmr_ports=ports)
    learn(dec, tr_rows)
    part = TransportPart(state=dec.state)
    feed, add = dec.packet, part.add
    first, last = math.inf, -math.inf
    for seg in segments(split, None, context, packets=True):
        if not isinstance(seg, tuple):
            continue
        for p in seg[1]:
            ts = p.ts
            if ts < first:
                first = ts
            if ts > last:
                last = ts
            recs = feed(p)
            if recs:
                add(recs)
    part.first_ts, part.last_ts = first, last
    return part


def transport_task(row: tuple, ports: frozenset[int], tr_rows: list[tuple]) -> dict:
    """The transport task: ``row`` as for the decoding task (split id, path,
    start, end, size, pcapng context), ``tr_rows`` the time-ordered
    topic-resolution rows.  Returns the split id, the first time read, its
    pickled :class:`TransportPart` and the task's wall and CPU seconds."""
    t0, c0 = time.perf_counter(), time.process_time()
    split = Split(*row[:5])
    part = decode_range(split, bytes(row[5] or b""), ports, tr_rows)
    return {"split_id": split.split_id, "first_ts": part.first_ts,
            "part": pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL),
            "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "pid": os.getpid()}


def broadcast_task(row: tuple, ports: frozenset[int], tr) -> dict:
    """:func:`transport_task` as a Spark RDD ``map`` function: ``tr`` is a
    broadcast of the topic-resolution rows."""
    return transport_task(row, ports, tr.value)


# --------------------------------------------------------------------------- driver side

def merge(parts: list[tuple[float, int, TransportPart]]) -> TransportPart:
    """Merge (first time, split id, part) in time order (ties by split id)."""
    out = TransportPart()
    for _, _, p in sorted(parts, key=lambda x: (x[0], x[1])):
        out.merge(p)
    return out


def tr_rows_of(partials: dict) -> tuple[list[tuple], int]:
    """(time-ordered topic-resolution rows, datagrams a bound kept out) from the
    merged partial tables: the earliest :data:`TR_MAX_ROWS` distinct datagrams,
    at most :data:`TR_MAX_BYTES` of payload (what every transport task is sent)."""
    t = partials.get("tr")
    d = partials.get("tr_dropped")
    dropped = 0 if d is None else sum(d["dropped"].to_pylist())
    if t is None:
        return [], dropped
    rows = topic_resolution(list(zip(*(t[c].to_pylist() for c in ("us", "src", "sport", "dst", "dport", "payload")),
                                     strict=True)))
    kept, nbytes = [], 0
    for r in rows:
        if len(kept) >= TR_MAX_ROWS or nbytes + len(r[5]) > TR_MAX_BYTES:
            break
        kept.append(r)
        nbytes += len(r[5])
    return kept, dropped + len(rows) - len(kept)


def transport_pass(spark, split_rows: list[tuple], ports: frozenset[int], partials: dict,
                   stats: dict | None = None) -> TransportPart:
    """Run the transport tasks over ``split_rows`` (as :func:`lbmr_analyze.job.decode_to_parquet`
    makes them) on ``spark`` (None: in this process) and merge their parts."""
    from functools import partial as bind
    tr, dropped = tr_rows_of(partials)
    t0 = time.perf_counter()
    if spark is None:
        got = [transport_task(r, ports, tr) for r in split_rows]
    else:
        sc = spark.sparkContext
        b = sc.broadcast(tr)
        try:
            got = (sc.parallelize(split_rows, len(split_rows))
                   .map(bind(broadcast_task, ports=ports, tr=b)).collect())
        finally:
            b.unpersist()
    if stats is not None:
        stats.update(tasks=len(got), wall_s=sum(r["wall_s"] for r in got), cpu_s=sum(r["cpu_s"] for r in got),
                     elapsed_s=time.perf_counter() - t0)
    out = merge([(r["first_ts"], r["split_id"], pickle.loads(r["part"])) for r in got])  # noqa: S301 - our tasks'
    if dropped:
        out.overflow["tr_datagrams"] += dropped
    return out


def _iso(ts: float) -> str | None:
    """A time as the tables write it; None for none (the decoder's rows say 0.0, ours -inf)."""
    return iso_us(round(ts * 1e6)) if ts and math.isfinite(ts) else None


#: Column order of the session and receiver tables (the most telling first).
SESSION_COLUMNS = (
    "source", "topics", "originals", "original_bytes", "retransmissions", "retransmission_bytes", "rate_bps",
    "nak_packets", "nak_entries", "naked_sqns", "ncf_no_retry", "ncf_ignored", "ncf_rx_delay", "ncf_shed",
    "session_messages", "icmp_errors", "receiver_icmp_errors", "lbmc_messages", "receivers", "source_contexts",
    "first_ts", "last_original_ts", "source_last", "last_ts", "icmp_first", "icmp_last", "lead_sqn", "control", "from_tir",
    "session", "transport", "source_ip", "port", "group", "dport", "session_id")
RECEIVER_COLUMNS = (
    "session", "receiver", "kind", "loss_estimate", "nak_packets", "nak_entries", "naked_sqns", "recovered",
    "recovery_p50", "recovery_max", "outstanding_count", "outstanding", "outstanding_from", "outstanding_to",
    "first_ts", "last_ts", "silent_ts", "packets", "zero_windows", "resets", "icmp_errors")


def tables(part: TransportPart) -> dict[str, list[dict]]:
    """The transport tables (see the module documentation)."""
    st = part.state
    sessions = []
    for r in session_rows(st):
        d = r._asdict()
        for k in ("first_ts", "last_ts", "last_original_ts"):
            d[k] = _iso(d[k])
        d["topics"] = " | ".join(r.topics)
        d["source_contexts"] = " ".join(r.source_contexts)
        d["control"] = " ".join(f"{k}={n}" for k, n in r.control)
        d["receivers"] = " ".join(r.receivers)
        d["session_id"] = f"{r.session_id:08x}"
        d["rate_bps"] = round(r.rate_bps, 1)
        d["source_last"] = _iso(part.source_last.get(r.session, -math.inf))
        f, la = part.icmp.get(r.session, (-math.inf, -math.inf))
        d["icmp_first"], d["icmp_last"] = _iso(f), _iso(la)
        sessions.append({k: d[k] for k in SESSION_COLUMNS})
    receivers = []
    joined = st.joined()
    for r in receiver_rows(st):
        d = r._asdict()
        for k in ("first_ts", "last_ts", "silent_ts"):
            d[k] = _iso(d[k])
        d["loss_estimate"] = round(r.loss_estimate, 6)
        d["recovery_p50"], d["recovery_max"] = round(r.recovery_p50, 6), round(r.recovery_max, 6)
        d["outstanding"] = " ".join(str(q) for q in r.outstanding)
        rs = joined[r.session].receivers[r.receiver]
        times = list(rs.outstanding.values())
        d["outstanding_from"] = _iso(min(times)) if times else None
        d["outstanding_to"] = _iso(max(times)) if times else None
        receivers.append({k: d[k] for k in RECEIVER_COLUMNS})
    topics = []
    for r in topic_rows(st):
        d = r._asdict()
        d["queriers"] = " ".join(sorted(st.queries.get(r.topic, ()))) if r.topic else ""
        topics.append(d)
    timeline = [dict(session=s, second=sec, time=iso_us(sec * 1_000_000),
                     **dict(zip(TIMELINE_COLUMNS, v, strict=True)))
                for (s, sec), v in sorted(part.timeline.items())]
    errors = ([dict(kind="bad input", reason=k, count=n) for k, n in sorted(st.errors.items())]
              + [dict(kind="not kept (bound)", reason=k, count=n)
                 for k, n in sorted((st.overflow + part.overflow).items())])
    return {"transport_sessions": sessions, "transport_receivers": receivers, "transport_topics": topics,
            "transport_timeline": timeline, "transport_errors": errors}


def empty_tables() -> dict[str, list[dict]]:
    """The transport tables of a run without a transport pass."""
    return {n: [] for n in TABLES}


def summary(t: dict[str, list[dict]]) -> dict:
    """The summary's transport figures."""
    s = t["transport_sessions"]
    return dict(
        transport_sessions=sum(1 for r in s if r["originals"] or r["retransmissions"] or r["nak_packets"]
                               or r["session_messages"] or r["lbmc_messages"]),
        transport_sessions_advertised=sum(1 for r in s if r["from_tir"]),
        transport_originals=sum(r["originals"] for r in s),
        transport_retransmissions=sum(r["retransmissions"] for r in s),
        transport_nak_packets=sum(r["nak_packets"] for r in s),
        transport_bad_input=sum(r["count"] for r in t["transport_errors"] if r["kind"] == "bad input"),
    )
