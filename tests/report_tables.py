"""Result tables of a busy made-up capture, for the report's tests without Spark.

Columns follow the job's tables; the values are chosen to exercise the page:
findings of several kinds and severities (one kind with an "... and N more" row,
one finding with a field the report does not know), a storm, bar values that
span three orders of magnitude, more contexts than ``--top``, tables long enough
for a filter box, booleans and ISO times.
"""

from __future__ import annotations

from datetime import UTC, datetime

from lbmr_analyze.job import TABLES

T0 = 1_700_000_000          # capture start, seconds (2023-11-14T22:13:20Z)
START_US = 250_000          # the first datagram is 250 ms into that second
TOP = 20
STORM_FROM, STORM_SECONDS = 120, 30
THRESHOLD = 1000


def iso(us_after_t0: int) -> str:
    """The tables' ISO time, ``us_after_t0`` microseconds after :data:`T0`."""
    t = datetime.fromtimestamp(T0, UTC).timestamp() + us_after_t0 / 1e6
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def src_id(i: int) -> str:
    return f"{0x1234_5678_9abc_0000 + i:016x}"


def _load() -> list[dict]:
    rows = []
    for s in range(300):
        storm = STORM_FROM <= s < STORM_FROM + STORM_SECONDS
        tir, tqr = (9000, 1011) if storm else (20 + s % 7, 3 + s % 3)
        for kind, n in (("TIR", tir), ("TQR", tqr), ("ALL", tir + tqr)):
            rows.append(dict(second=T0 + s, time=iso(s * 1_000_000), record_kind=kind, packets=n,
                             records=n, bytes=n * 90))
    return rows


def _contexts(n: int) -> list[dict]:
    out = []
    for i in range(n):
        packets = 40_000 // (i + 1) ** 2 + 1
        out.append(dict(context=f"10.9.{i // 200}.{i % 200 + 1}:{14000 + i}", src_id=src_id(i) if i % 5 else None,
                        via_lbmrd=i % 4 == 0, packets=packets, bytes=packets * 120, records=packets,
                        tirs=packets - i, tqrs=i, keepalives=0, first_seen=iso(START_US + i * 1000),
                        last_seen=iso(290_000_000 - i * 1000)))
    return out


def _topics(n: int) -> list[dict]:
    return [dict(topic=f"orders.region{i}.fills", records=5000 // (i + 1) + 2, advertisements=5000 // (i + 1),
                 queries=2 + i % 3, n_sources=1 + i % 2) for i in range(n)]


def _unresolved(n: int) -> list[dict]:
    return [dict(topic=f"missing.topic.{i % 12}", querier=f"10.2.2.{i % 9 + 1}:{15000 + i}",
                 src_id=src_id(100 + i), queries=97 - 3 * i, first_query=iso(START_US + i * 10_000),
                 last_query=iso(200_000_000 + i * 10_000), via_lbmrd=i % 2 == 0) for i in range(n)]


def _findings() -> list[dict]:
    def f(severity, kind, text, table, **kw):
        return dict(severity=severity, kind=kind, finding=text, topics=kw.get("topics", ""),
                    contexts=kw.get("contexts", ""), first_seen=kw.get("first"), last_seen=kw.get("last"),
                    table=table, **kw.get("extra", {}))
    out = [f("critical", "transport conflict",
             "Transport TCP:10.5.5.5:15000 is advertised by 2 different contexts (10.5.5.5:14000 | "
             "10.5.5.6:14000) for topic(s) orders.region0.fills: receivers may join the wrong source.",
             "transport_conflicts", topics="orders.region0.fills", contexts="10.5.5.5:14000 10.5.5.6:14000",
             first=iso(START_US), last=iso(280_000_000))]
    for i in range(10):
        out.append(f("high", "never advertised",
                     f"Topic 'missing.topic.{i}' was queried {90 - i} time(s) and never advertised in the "
                     f"capture; queriers: 10.2.2.{i + 1}:{15000 + i} [{src_id(100 + i)}] ({90 - i} queries, "
                     f"{iso(START_US + i * 10_000)} .. {iso(200_000_000 + i * 10_000)}).", "unresolved_topics",
                     topics=f"missing.topic.{i}", contexts=f"10.2.2.{i + 1}:{15000 + i}",
                     first=iso(START_US + i * 10_000), last=iso(200_000_000 + i * 10_000)))
    out.append(f("high", "never advertised", "... and 2 more 'never advertised' finding(s): see the table.",
                 "unresolved_topics"))
    out.append(f("high", "storm",
                 f"Storm of {STORM_SECONDS} s from {iso(STORM_FROM * 1_000_000)} (peak 10011 datagrams/s, "
                 f"threshold {THRESHOLD}); sent mostly by 10.9.0.1:14000 [{src_id(0)}] 9000/s.", "storms",
                 contexts="10.9.0.1:14000", first=iso(STORM_FROM * 1_000_000),
                 last=iso((STORM_FROM + STORM_SECONDS - 1) * 1_000_000),
                 extra=dict(top_share=0.899, at_capture_end=False)))
    out.append(f("low", "lbmrd client joined", f"lbmrd client 10.9.0.2:14001 was first heard at "
                 f"{iso(60_000_000)}.", "client_changes", contexts="10.9.0.2:14001", first=iso(60_000_000),
                 last=iso(60_000_000)))
    return out


def tables(*, n_contexts: int = 30) -> dict[str, list[dict]]:
    """Every table of the job (in its order); ``n_contexts`` contexts, of which
    :data:`TOP` are the top talkers."""
    ctx = _contexts(n_contexts)
    t = {name: [] for name in TABLES}
    t.update(
        findings=_findings(),
        files=[dict(file="/captures/busy.pcap", datagrams=400_000, records=420_000, bytes=36_000_000,
                    decode_errors=0, capture_errors=0, first_seen=iso(START_US), last_seen=iso(299_900_000))],
        unresolved_topics=_unresolved(24),
        load_per_second=_load(),
        keepalive_census=[dict(minute=T0 + 60 * m, time=iso(60_000_000 * m), clients=3 + m % 2, packets=40)
                          for m in range(5)],
        storms=[dict(second=T0 + s, time=iso(s * 1_000_000), packets=10011, records=10011, tirs=9000,
                     tqrs=1011, contexts=3) for s in range(STORM_FROM, STORM_FROM + STORM_SECONDS)],
        top_topics=_topics(TOP),
        topic_inventory=_topics(40),
        top_talkers=ctx[:TOP],
        contexts=ctx,
        time_to_resolve=[dict(querier=f"10.2.2.{i % 9 + 1}:{15000 + i}", src_id=src_id(200 + i),
                              topic=f"orders.region{i}.fills", first_query=iso(START_US + i * 1000),
                              resolved_at=iso(START_US + i * 1000 + 1000 * (i + 1) ** 2),
                              time_to_resolve_s=round(0.001 * (i + 1) ** 2, 6)) for i in range(30)],
    )
    t["summary"] = [dict(key=k, value=v) for k, v in summary(n_contexts).items()]
    return t


def summary(n_contexts: int = 30) -> dict:
    return dict(files=1, datagrams=400_000, records=420_000, bytes=36_000_000, first_seen=iso(START_US),
                last_seen=iso(299_900_000), topics=52, contexts=n_contexts, storm_threshold=THRESHOLD,
                findings="critical=1 high=14 low=1 medium=0", compressed=False)
