"""The analyses, as Spark DataFrame queries over the Parquet records.

Nothing here collects raw rows: every function returns a DataFrame of results
(one row per topic, per second, per sender, ...), and the job collects only those.
Definitions (see lbmr-analyze(1) for the full text):

* *sender* of a datagram: its source IP address; *querier* and keepalive
  *client*: ``src:sport`` (a UM context's resolver socket).
* *transport identity*: the ``transport_id`` text of a TIR (see
  :func:`lbmr_analyze.rows.transport_identity`).
* *time to resolve* for (querier, topic): from the querier's first TQR for the
  topic to the first TIR for that topic (from anyone) at or after it.
* *NAT audit*: a TIR whose advertised transport IP is not ``0.0.0.0`` (filled in
  by the receiver or lbmrd), differs from the datagram's source IP and is not in
  the same /24 as it.
* Timestamps are UTC, ISO 8601 with microseconds; ``second`` and ``minute`` are
  epoch seconds.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

PACKET_TYPES = ("NORMAL", "WC_TQR", "RCV_ALIVE", "SRC_ALIVE", "TOPIC_MGMT", "QUEUE_RES", "EXT")
ISO = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'"
ISO_S = "yyyy-MM-dd'T'HH:mm:ss'Z'"


def _iso(c) -> F.Column:
    return F.date_format(c, ISO)


def _set(c) -> F.Column:
    """Sorted, space-separated distinct non-null values."""
    return F.array_join(F.array_sort(F.collect_set(c)), " ")


def _kind(k: str) -> F.Column:
    return F.col("record_kind") == k


def _querier() -> F.Column:
    return F.concat_ws(":", "src", F.col("sport").cast("string"))


def prepare(records: DataFrame) -> DataFrame:
    """Add ``us`` (epoch microseconds) and ``second`` (epoch second) columns."""
    us = F.unix_micros("ts")
    return records.withColumn("us", us).withColumn("second", F.floor(us / 1_000_000))


def files(r: DataFrame) -> DataFrame:
    dg = (F.col("record_index") == 0) & (F.col("record_kind") != "CAPTURE_ERROR")
    return (r.groupBy("file").agg(
        F.sum(F.when(dg, 1).otherwise(0)).alias("datagrams"),
        F.sum(F.when(F.col("record_kind") != "CAPTURE_ERROR", 1).otherwise(0)).alias("records"),
        F.coalesce(F.sum(F.when(dg, F.col("length"))), F.lit(0)).alias("bytes"),
        F.sum(F.when(_kind("DECODE_ERROR"), 1).otherwise(0)).alias("decode_errors"),
        F.sum(F.when(_kind("CAPTURE_ERROR"), 1).otherwise(0)).alias("capture_errors"),
        _iso(F.min("ts")).alias("first_seen"),
        _iso(F.max("ts")).alias("last_seen"),
    ).orderBy("file"))


def topic_summary(r: DataFrame) -> DataFrame:
    """One aggregation per topic over TIRs and TQRs, shared by the inventory, the
    unresolved topics, the topic conflicts and the top topics (cache it: it is small)."""
    # first collapse the repetition (a cheap hash aggregate on flat keys), then
    # build the per-topic sets from the few distinct combinations
    t = (r.where(F.col("record_kind").isin("TIR", "TQR"))
         .groupBy("topic", "record_kind", "transport_id", "src", "sport")
         .agg(F.count(F.lit(1)).alias("n"), F.min("ts").alias("first"), F.max("ts").alias("last")))
    tir, tqr = _kind("TIR"), _kind("TQR")
    return (t.groupBy("topic").agg(
        F.sum(F.when(tir, F.col("n")).otherwise(0)).alias("advertisements"),
        F.sum(F.when(tqr, F.col("n")).otherwise(0)).alias("queries"),
        F.array_sort(F.collect_set("transport_id")).alias("_sources"),
        _set(F.when(tir, F.col("src"))).alias("advertisers"),
        F.array_sort(F.collect_set(F.when(tqr, _querier()))).alias("_queriers"),
        F.min("first").alias("_first"),
        F.max("last").alias("_last"),
        F.min(F.when(tir, F.col("first"))).alias("_first_tir"),
        F.min(F.when(tqr, F.col("first"))).alias("_first_tqr"),
    ).select("topic", "advertisements", "queries",
             F.size("_sources").alias("n_sources"), F.array_join("_sources", " ").alias("sources"),
             "advertisers", F.size("_queriers").alias("n_queriers"),
             F.array_join("_queriers", " ").alias("queriers"),
             _iso("_first").alias("first_seen"), _iso("_last").alias("last_seen"),
             _iso("_first_tir").alias("first_advertised"), _iso("_first_tqr").alias("first_queried")))


def topic_inventory(ts: DataFrame) -> DataFrame:
    """Every topic seen in a TIR or TQR: advertisements, queries, its sources
    (transport identities), advertisers, queriers, first/last seen."""
    return (ts.select("topic", "advertisements", "queries", "n_sources", "sources", "advertisers",
                      "n_queriers", "first_seen", "last_seen", "first_advertised", "first_queried")
            .orderBy("topic"))


def unresolved_topics(ts: DataFrame) -> DataFrame:
    """Topics queried (TQR) but never advertised (TIR) anywhere in the input."""
    return (ts.where(F.col("advertisements") == 0)
            .select("topic", "queries", "n_queriers", "queriers",
                    F.col("first_seen").alias("first_queried"), F.col("last_seen").alias("last_queried"))
            .orderBy("topic"))


def topic_conflicts(ts: DataFrame) -> DataFrame:
    """Topics advertised by more than one transport identity."""
    return (ts.where(F.col("n_sources") > 1)
            .select("topic", F.col("n_sources").alias("n_transports"), F.col("sources").alias("transports"),
                    "advertisers", "advertisements")
            .orderBy("topic"))


def time_to_resolve(r: DataFrame) -> DataFrame:
    """Per (querier, topic): first TQR -> first TIR for the topic at or after it.

    One window over the topic's events sorted newest first, so the running minimum
    of TIR times is the first TIR at or after each query (TIRs sort before a TQR
    of the same microsecond)."""
    q = (r.where(_kind("TQR")).groupBy("src", "sport", "topic").agg(F.min("us").alias("us")))
    a = r.where(_kind("TIR")).select("topic", "us")     # (a distinct or semi-join costs more than it saves)
    ev = (q.withColumn("is_tir", F.lit(0))
          .unionByName(a.withColumn("src", F.lit(None).cast("string"))
                       .withColumn("sport", F.lit(None).cast("int"))
                       .withColumn("is_tir", F.lit(1))))
    w = (Window.partitionBy("topic").orderBy(F.desc("us"), F.desc("is_tir"))
         .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    ev = ev.withColumn("next_tir", F.min(F.when(F.col("is_tir") == 1, F.col("us"))).over(w))
    res = ev.where((F.col("is_tir") == 0) & F.col("next_tir").isNotNull())
    return (res.select(
        _querier().alias("querier"), "topic",
        _iso(F.timestamp_micros("us")).alias("first_query"),
        _iso(F.timestamp_micros("next_tir")).alias("resolved_at"),
        ((F.col("next_tir") - F.col("us")) / 1e6).alias("time_to_resolve_s"),
    ).orderBy("topic", "querier"))


def transport_conflicts(r: DataFrame) -> DataFrame:
    """Transport identities advertised from more than one source IP address."""
    g = (r.where(_kind("TIR")).groupBy("transport_id", "src", "topic").agg(F.count(F.lit(1)).alias("n"))
         .groupBy("transport_id").agg(
             F.size(F.collect_set("src")).alias("n_senders"),
             _set("src").alias("senders"),
             F.size(F.collect_set("topic")).alias("n_topics"),
             F.sum("n").alias("advertisements"),
         ))
    return (g.where(F.col("n_senders") > 1)
            .select("transport_id", "n_senders", "senders", "n_topics", "advertisements")
            .orderBy("transport_id"))


def load_per_second(r: DataFrame) -> DataFrame:
    """Per second and record kind: datagrams holding that kind, records, bytes of
    those datagrams; kind ``ALL`` for every datagram."""
    t = r.where(F.col("ts").isNotNull())
    by_kind = t.groupBy("second", "record_kind").agg(
        F.sum(F.when(F.col("kind_first"), 1).otherwise(0)).alias("packets"),
        F.count(F.lit(1)).alias("records"),
        F.coalesce(F.sum(F.when(F.col("kind_first"), F.col("length"))), F.lit(0)).alias("bytes"),
    )
    first = F.col("record_index") == 0
    total = t.groupBy("second").agg(
        F.sum(F.when(first, 1).otherwise(0)).alias("packets"),
        F.count(F.lit(1)).alias("records"),
        F.coalesce(F.sum(F.when(first, F.col("length"))), F.lit(0)).alias("bytes"),
    ).withColumn("record_kind", F.lit("ALL"))
    out = by_kind.unionByName(total)
    return (out.select("second", F.date_format(F.timestamp_seconds("second"), ISO_S).alias("time"),
                       "record_kind", "packets", "records", "bytes")
            .orderBy("second", "record_kind"))


def senders(r: DataFrame) -> DataFrame:
    """Per source IP: datagrams, bytes, records, TIRs, TQRs, first/last seen
    (cache it: one row per sender)."""
    t = r.where(F.col("ts").isNotNull())
    first = F.col("record_index") == 0
    return t.groupBy("src").agg(
        F.sum(F.when(first, 1).otherwise(0)).alias("packets"),
        F.coalesce(F.sum(F.when(first, F.col("length"))), F.lit(0)).alias("bytes"),
        F.count(F.lit(1)).alias("records"),
        F.sum(F.when(_kind("TIR"), 1).otherwise(0)).alias("tirs"),
        F.sum(F.when(_kind("TQR"), 1).otherwise(0)).alias("tqrs"),
        _iso(F.min("ts")).alias("first_seen"),
        _iso(F.max("ts")).alias("last_seen"),
    ).withColumnRenamed("src", "sender")


def top_talkers(snd: DataFrame, top: int) -> DataFrame:
    return snd.orderBy(F.desc("packets"), F.desc("bytes"), "sender").limit(top)


def top_topics(inventory: DataFrame, top: int) -> DataFrame:
    return (inventory.select("topic", (F.col("advertisements") + F.col("queries")).alias("records"),
                             "advertisements", "queries", "n_sources")
            .orderBy(F.desc("records"), "topic").limit(top))


def wildcard_patterns(r: DataFrame) -> DataFrame:
    """Wildcard query patterns (before matching)."""
    return (r.where(_kind("WC_TQR")).groupBy(F.col("topic").alias("pattern"), "pattern_type").agg(
        F.count(F.lit(1)).alias("queries"),
        _set(_querier()).alias("queriers"),
        _iso(F.min("ts")).alias("first_seen"),
        _iso(F.max("ts")).alias("last_seen"),
    ).orderBy("pattern", "pattern_type"))


def compile_pattern(pattern: str, pattern_type: int) -> re.Pattern | str:
    """A wildcard pattern as a Python regex, or the compile error text.

    UM matches PCRE (type 1) and POSIX extended (type 2) patterns anywhere in the
    topic name (unanchored search); Python's ``re`` covers the common subset of
    both (no possessive quantifiers or POSIX classes such as ``[[:alpha:]]``)."""
    try:
        return re.compile(pattern)
    except re.error as e:
        return f"invalid pattern: {e}"
    except (TypeError, ValueError, RecursionError) as e:
        return f"invalid pattern: {e}"


def _matcher(compiled: list[tuple[str, int, re.Pattern]]):
    def match(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            topics = b.column(0).to_pylist()
            pats, types, tops = [], [], []
            for p, t, rx in compiled:
                s = rx.search
                for topic in topics:
                    if topic is not None and s(topic):
                        pats.append(p)
                        types.append(t)
                        tops.append(topic)
            yield pa.RecordBatch.from_arrays(
                [pa.array(pats, pa.string()), pa.array(types, pa.int32()), pa.array(tops, pa.string())],
                names=["pattern", "pattern_type", "topic"])
    return match


def wildcard_matches(r: DataFrame, patterns: list[tuple[str, int]]) -> tuple[DataFrame, dict]:
    """(pattern, pattern_type, topic) for every topic seen in a TIR or TQR that a
    valid pattern matches, and {(pattern, type): error} for invalid ones."""
    compiled, errors = [], {}
    for p, t in patterns:
        rx = compile_pattern(p, t)
        if isinstance(rx, str):
            errors[(p, t)] = rx
        else:
            compiled.append((p, t, rx))
    topics = r.where(F.col("record_kind").isin("TIR", "TQR")).select("topic").distinct()
    m = topics.mapInArrow(_matcher(compiled), "pattern string, pattern_type int, topic string")
    return m.orderBy("pattern", "pattern_type", "topic"), errors


def keepalive_senders(r: DataFrame) -> DataFrame:
    return (r.where(_kind("KEEPALIVE")).groupBy("src", "sport").agg(
        F.count(F.lit(1)).alias("packets"),
        _set("packet_type").alias("types"),
        _set("dst").alias("destinations"),
        _iso(F.min("ts")).alias("first_seen"),
        _iso(F.max("ts")).alias("last_seen"),
    ).select(_querier().alias("client"), "packets", "types", "destinations", "first_seen", "last_seen")
        .orderBy("client"))


def keepalive_census(r: DataFrame) -> DataFrame:
    """Distinct keepalive clients (``src:sport``) per minute."""
    k = r.where(_kind("KEEPALIVE")).withColumn("minute", F.floor(F.col("second") / 60) * 60)
    return (k.groupBy("minute").agg(
        F.countDistinct("src", "sport").alias("clients"),
        F.count(F.lit(1)).alias("packets"),
    ).select("minute", F.date_format(F.timestamp_seconds("minute"), ISO_S).alias("time"),
             "clients", "packets").orderBy("minute"))


def nat_audit(r: DataFrame) -> DataFrame:
    """TIRs advertising an IP outside the sender's /24 (see the module docs)."""
    ip = F.col("transport_ip")
    t = r.where(_kind("TIR") & ip.isNotNull() & (ip != "0.0.0.0") & (ip != F.col("src"))
                & (F.substring_index(ip, ".", 3) != F.substring_index("src", ".", 3)))
    return (t.groupBy(F.col("src").alias("sender"), F.col("transport_ip").alias("advertised_ip"),
                      "transport_id", "topic").agg(
        F.count(F.lit(1)).alias("advertisements"),
        _iso(F.min("ts")).alias("first_seen"),
        _iso(F.max("ts")).alias("last_seen"),
    ).orderBy("sender", "advertised_ip", "topic", "transport_id"))


def capture_errors(r: DataFrame) -> DataFrame:
    return (r.where(_kind("CAPTURE_ERROR")).select("file", "offset", "error")
            .orderBy("file", "offset"))


def decode_errors(r: DataFrame) -> DataFrame:
    return (r.where(_kind("DECODE_ERROR"))
            .select("file", "offset", _iso("ts").alias("time"), "src", "sport", "dst", "dport",
                    "length", "error")
            .orderBy("file", "offset"))


def totals(r: DataFrame) -> dict:
    """A handful of counts for the summary (one small aggregate)."""
    first = (F.col("record_index") == 0) & F.col("ts").isNotNull()
    row = r.agg(
        F.sum(F.when(first, 1).otherwise(0)).alias("datagrams"),
        F.sum(F.when(F.col("ts").isNotNull(), 1).otherwise(0)).alias("records"),
        F.coalesce(F.sum(F.when(first, F.col("length"))), F.lit(0)).alias("bytes"),
        _iso(F.min("ts")).alias("first_seen"),
        _iso(F.max("ts")).alias("last_seen"),
        F.sum(F.when(_kind("TIR"), 1).otherwise(0)).alias("tirs"),
        F.sum(F.when(_kind("TQR"), 1).otherwise(0)).alias("tqrs"),
        F.sum(F.when(_kind("WC_TQR"), 1).otherwise(0)).alias("wc_tqrs"),
        F.sum(F.when(_kind("KEEPALIVE"), 1).otherwise(0)).alias("keepalives"),
        F.sum(F.when(_kind("DECODE_ERROR"), 1).otherwise(0)).alias("decode_errors"),
        F.sum(F.when(_kind("CAPTURE_ERROR"), 1).otherwise(0)).alias("capture_errors"),
        *[F.sum(F.when(first & (F.col("packet_type") == t), 1).otherwise(0)).alias("pt_" + t)
          for t in PACKET_TYPES],
    ).collect()[0].asDict()
    row["packet_types"] = {t: row.pop("pt_" + t) or 0 for t in PACKET_TYPES}
    row["packet_types"] = {k: v for k, v in row["packet_types"].items() if v}
    return {k: (0 if v is None and k not in ("first_seen", "last_seen") else v) for k, v in row.items()}
