"""The analyses: the decoding tasks' partial aggregates plus one more pass,
finished on the driver in plain Python over their small results.

The decoding tasks aggregate the records while they write them
(:mod:`lbmr_analyze.partials`): per-file counts, *topic facts* (one row per
distinct topic, record kind, sender, context id, transport and OTID), *flows*
(one row per sender, destination, context id and packet type), load per second
and record kind, keepalive clients per minute and the error rows.  One more
Spark job (:func:`second_pass`) reads the Parquet records with pyarrow for what
needs those facts first: time to resolve (the TIRs joined with the first
queries), stale queries and the contexts of storm seconds.  Every table of the report is derived from those
results by :func:`derive` (:mod:`lbmr_analyze.findings` turns them into
findings).  Definitions (see lbmr-analyze(1) for the full text):

* *context*: the ``ip:port`` of the socket a UM context sends topic resolution
  from, with the context's ``src_id`` (packet-trailer source-id option, 8 bytes as
  hex) where present.  A datagram from UDP port 15380 (lbmrd's) is taken as relayed
  by lbmrd: its context is named ``[src_id] via lbmrd ip:port``.  Contexts -- and so
  queriers -- are told apart by (ip, port, src_id): the queries lbmrd relays from
  several contexts, all from lbmrd's ip:port, are as many queriers as src_ids.
* *context identity* (:func:`context_key`): what a claim about one context, or
  about several different ones, rests on -- the src_id of a relayed datagram, the
  ip:port and src_id of a direct one.  Relayed TIRs without src_id may come from
  any number of publishers: no conflict or "one context" row counts them.
* *transport identity*: the ``transport_id`` text of a TIR (see
  :func:`lbmr_analyze.rows.transport_identity`).
* *time to resolve* for (querier, topic), the querier a context as above: from
  its first TQR for the topic to the first TIR for that topic (from anyone) at or
  after it.
* *stale query*: a TQR for a topic sent after the last TIR for that topic.
* *reachable address* (NAT audit rule of thumb): an advertised IPv4 address is
  reachable when its /24 holds a host seen in the capture (a direct sender or a
  unicast destination of LBMR), or when it lies in the same private block (10/8,
  172.16/12, 192.168/16) as such a host; 0.0.0.0 (filled in by receivers or
  lbmrd) and multicast addresses are never flagged.
* Timestamps are UTC, ISO 8601 with microseconds; ``second`` and ``minute`` are
  epoch seconds; durations are seconds.
"""

from __future__ import annotations

import ipaddress
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NamedTuple

from lbmr_proto.constants import LBMRD_PORT

PACKET_TYPES = ("NORMAL", "WC_TQR", "RCV_ALIVE", "SRC_ALIVE", "TOPIC_MGMT", "QUEUE_RES", "EXT")
#: A keepalive client silent for longer than this before the end of the capture
#: (or first heard this long after its start) is reported as vanished (joined); seconds.
CLIENT_SILENCE_S = 15


def iso_us(us: int | None) -> str | None:
    """Epoch microseconds -> ``YYYY-MM-DDTHH:MM:SS.ffffffZ``."""
    if us is None:
        return None
    return datetime.fromtimestamp(us // 1_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{us % 1_000_000:06d}Z"


def iso_s(sec: int) -> str:
    """Epoch seconds -> ``YYYY-MM-DDTHH:MM:SSZ``."""
    return datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def context_label(src: str | None, sport: int | None, src_id: str | None) -> str:
    """``ip:port [src_id]``, or ``[src_id] via lbmrd ip:port`` for datagrams from lbmrd's port."""
    addr = f"{src}:{sport}"
    if sport == LBMRD_PORT:
        return f"[{src_id}] via lbmrd {addr}" if src_id else f"via lbmrd {addr}"
    return f"{addr} [{src_id}]" if src_id else addr


def share_text(n: float, total: float) -> str:
    """``n`` as a percentage of ``total``: ``12.5 %``, ``<0.1 %`` for a small non-zero share."""
    pct = 100 * n / total if total else 0.0
    return "<0.1 %" if 0 < pct < 0.1 else f"{pct:.1f} %"


def _join(vals) -> str:
    return " ".join(sorted({v for v in vals if v is not None}))


# --------------------------------------------------------------------------- from the partial aggregates

def files(P: dict) -> list[dict]:
    """Per file: datagrams, records, bytes, error counts, first/last time, and the
    per-kind record counts used for the summary (``k_<KIND>``, ``pt_<TYPE>``)."""
    return sorted(P["files"].to_pylist(), key=lambda x: x["file"]) if "files" in P else []


def topic_facts(P: dict) -> list[dict]:
    """One row per distinct (topic, kind, pattern type, sender, context id, transport
    identity, transport IP, OTID) over TIR, TQR and WC_TQR records: count, first and
    last time (epoch microseconds)."""
    return P["facts"].to_pylist() if "facts" in P else []


def flows(P: dict) -> list[dict]:
    """One row per (sender, destination, context id, packet type): datagrams, bytes,
    records, TIRs, TQRs, keepalives and times (epoch microseconds)."""
    return P["flows"].to_pylist() if "flows" in P else []


def load_per_second(P: dict) -> list[dict]:
    """Per second and record kind: datagrams holding that kind, records, bytes of
    those datagrams; kind ``ALL`` for every datagram."""
    out, total = [], {}
    for x in (P["load"].to_pylist() if "load" in P else []):
        out.append(dict(second=x["second"], time=iso_s(x["second"]), record_kind=x["record_kind"],
                        packets=x["packets"], records=x["records"], bytes=x["bytes"]))
        a = total.setdefault(x["second"], [0, 0, 0])
        a[0] += x["dg"]
        a[1] += x["records"]
        a[2] += x["dg_bytes"]
    out += [dict(second=s, time=iso_s(s), record_kind="ALL", packets=a[0], records=a[1], bytes=a[2])
            for s, a in total.items()]
    out.sort(key=lambda x: (x["second"], x["record_kind"]))
    return out


def keepalive_census(P: dict) -> list[dict]:
    """Distinct keepalive clients (``src:sport``) per minute."""
    per: dict[int, list] = {}
    for x in (P["census"].to_pylist() if "census" in P else []):
        a = per.setdefault(x["minute"], [0, 0])
        a[0] += 1
        a[1] += x["packets"]
    return [dict(minute=m, time=iso_s(m), clients=a[0], packets=a[1]) for m, a in sorted(per.items())]


def error_rows(P: dict) -> tuple[list[dict], list[dict]]:
    """(capture errors, decode errors), each sorted by file and offset."""
    rows = P["errors"].to_pylist() if "errors" in P else []
    rows.sort(key=lambda x: (x["file"], x["offset"]))
    cap = [dict(file=x["file"], offset=x["offset"], error=x["error"])
           for x in rows if x["record_kind"] == "CAPTURE_ERROR"]
    dec = [dict(file=x["file"], offset=x["offset"], time=iso_us(x["us"]), src=x["src"], sport=x["sport"],
                dst=x["dst"], dport=x["dport"], length=x["length"], error=x["error"])
           for x in rows if x["record_kind"] == "DECODE_ERROR"]
    return cap, dec


# --------------------------------------------------------------------------- Spark passes

class SecondPassPlan:
    """The driver's side of the second pass: from the topic facts and the storm
    seconds, the inputs every task gets (:class:`lbmr_analyze.partials.SecondPass`:
    the first query of each (querier, topic), the last TIR time of each topic
    queried after it, the storm seconds), and the rows made of the merged results."""

    def __init__(self, facts: list[dict], storm_secs: list[int]) -> None:
        first: dict[tuple, int] = {}        # (src, sport, context id, topic) -> first query
        last_tir: dict[str, int] = {}
        last_tqr: dict[str, int] = {}
        for f in facts:
            k = f["record_kind"]
            if k == "TQR":
                key = (f["src"], f["sport"], f["context_id"], f["topic"])
                x = first.get(key)
                if x is None or f["first_us"] < x:
                    first[key] = f["first_us"]
                last_tqr[f["topic"]] = max(last_tqr.get(f["topic"], f["last_us"]), f["last_us"])
            elif k == "TIR":
                last_tir[f["topic"]] = max(last_tir.get(f["topic"], f["last_us"]), f["last_us"])
        self.first = first
        self.keys = list(first)
        self.cand = {t: us for t, us in last_tir.items() if last_tqr.get(t, -1) > us}
        self.storm_secs = storm_secs

    @property
    def needed(self) -> bool:
        return bool(self.first or self.storm_secs)

    def inputs_ipc(self) -> bytes:
        """The tasks' inputs as Arrow IPC (:func:`lbmr_analyze.partials.to_ipc`)."""
        import pyarrow as pa

        from . import partials as P
        topics = sorted({k[3] for k in self.keys} | set(self.cand))
        tid = {t: i for i, t in enumerate(topics)}
        return P.to_ipc({
            # explicit types: an empty list would otherwise be of type null
            "topics": pa.table({"topic": pa.array(topics, pa.string())}),
            "firstq": pa.table({"q": pa.array(range(len(self.keys)), pa.int64()),
                                "tid": pa.array([tid[k[3]] for k in self.keys], pa.int32()),
                                "us": pa.array([self.first[k] for k in self.keys], pa.int64())}),
            "last_tir": pa.table({"tid": pa.array([tid[t] for t in self.cand], pa.int32()),
                                  "last_tir_us": pa.array(list(self.cand.values()), pa.int64())}),
            "storm_secs": pa.table({"second": pa.array(self.storm_secs, pa.int64())}),
        })

    def rows(self, m: dict) -> tuple[list[dict], list[dict], list[dict]]:
        """(time to resolve, stale queries, storm contexts) rows of the merged results ``m``."""
        ttr = []
        for x in (m["ttr"].to_pylist() if "ttr" in m else []):
            if x["next_tir"] is not None:
                key = self.keys[x["q"]]
                s, p, cid, topic = key
                ttr.append(dict(src=s, sport=p, context_id=cid, topic=topic, us=self.first[key],
                                next_tir=x["next_tir"]))
        stale = [dict(x, last_tir_us=self.cand[x["topic"]]) for x in (m["stale"].to_pylist() if "stale" in m else [])]
        storm = m["storm"].to_pylist() if "storm" in m else []
        return ttr, stale, storm


def parquet_files(records_path: str) -> list[str]:
    """The Parquet files under ``records_path`` (paths within its file system)."""
    import pyarrow.fs as pafs

    from . import fsio
    fs, base = fsio.filesystem(records_path)
    return sorted(i.path for i in fs.get_file_info(pafs.FileSelector(base, recursive=True))
                  if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
                  and not i.base_name.startswith("."))


def second_pass(spark, records_path: str, facts: list[dict], storm_secs: list[int]
                ) -> tuple[list[dict], list[dict], list[dict]]:
    """One more pass over the Parquet records, for what needs facts known only after
    the first: (time to resolve, stale queries, storm contexts) rows.

    The driver sends every task the inputs of :class:`SecondPassPlan` (a
    broadcast); the tasks read their Parquet files with pyarrow
    (:class:`lbmr_analyze.partials.SecondPass`) and return small partial tables,
    merged here.  With ``spark`` None the pass runs in this process, as one task
    over every file."""
    import functools

    from . import partials as P

    plan = SecondPassPlan(facts, storm_secs)
    files = parquet_files(records_path) if plan.needed else []
    if not files:
        return [], [], []
    if spark is None:
        got = [P.second_pass_files(files, records_path, plan.inputs_ipc())]
    else:
        sc = spark.sparkContext
        n = max(1, min(len(files), 2 * sc.defaultParallelism))
        groups = [files[i::n] for i in range(n)]
        bc = sc.broadcast(plan.inputs_ipc())
        try:
            got = (sc.parallelize(groups, n)
                   .map(functools.partial(P.run_second, base_uri=records_path, inputs=bc)).collect())
        finally:
            bc.unpersist()
    return plan.rows(P.merge([P.from_ipc(b) for b in got if b]))


# --------------------------------------------------------------------------- driver side

def compile_pattern(pattern: str, pattern_type: int) -> re.Pattern | str:
    """A wildcard pattern as a Python regex, or the compile error text.

    UM matches PCRE (type 1) and POSIX extended (type 2) patterns anywhere in the
    topic name (unanchored search); Python's ``re`` covers the common subset of
    both (no possessive quantifiers or POSIX classes such as ``[[:alpha:]]``)."""
    try:
        return re.compile(pattern)
    except (re.error, TypeError, ValueError, RecursionError) as e:
        return f"invalid pattern: {e}"


_PRIVATE = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                             "127.0.0.0/8", "169.254.0.0/16")]


def _block(ip: ipaddress.IPv4Address):
    for n in _PRIVATE:
        if ip in n:
            return n
    return None


def _ip(text: str | None):
    try:
        return ipaddress.IPv4Address(text)
    except (ipaddress.AddressValueError, ValueError, TypeError):
        return None


# --------------------------------------------------------------------------- typed inputs and accumulators

class Fact(NamedTuple):
    """One topic fact (:func:`topic_facts`); times in epoch microseconds."""

    topic: str | None
    record_kind: str
    pattern_type: int | None
    src: str | None
    sport: int | None
    context_id: str | None
    transport_id: str | None
    transport_ip: str | None
    otid: str | None
    n: int
    first_us: int
    last_us: int


class Flow(NamedTuple):
    """One flow (:func:`flows`); times in epoch microseconds."""

    src: str | None
    sport: int | None
    dst: str | None
    dport: int | None
    context_id: str | None
    packet_type: str | None
    packets: int
    bytes: int
    records: int
    tirs: int
    tqrs: int
    keepalives: int
    first_us: int
    last_us: int
    ka_first_us: int | None
    ka_last_us: int | None


@dataclass
class Tally:
    """A count with its first and last time (epoch microseconds; None before the first)."""

    n: int = 0
    first: int | None = None
    last: int | None = None

    def add(self, n: int, first: int | None, last: int | None) -> None:
        self.n += n
        if first is not None:
            self.first = first if self.first is None else min(self.first, first)
        if last is not None:
            self.last = last if self.last is None else max(self.last, last)

    def fact(self, f: Fact) -> None:
        self.add(f.n, f.first_us, f.last_us)


def _label(f: Fact | Flow) -> str:
    return context_label(f.src, f.sport, f.context_id)


def context_key(src: str | None, sport: int | None, src_id: str | None) -> tuple | None:
    """What tells the context of a datagram apart: (``ip:port``, src_id) of a direct
    sender; (None, src_id) of a datagram relayed by lbmrd (the src_id names the
    context, whichever lbmrd relayed it); None for a relayed datagram without
    src_id (lbmrd's address names no one context)."""
    if sport != LBMRD_PORT:
        return (f"{src}:{sport}", src_id)
    return (None, src_id) if src_id else None


def count_contexts(keys: set) -> int:
    """How many contexts the :func:`context_key` keys (None left out) surely are: a
    relayed key (None, x) is the direct sender of src_id x where one was seen."""
    direct = {cid for a, cid in keys if a is not None}
    return sum(1 for a, cid in keys if a is not None or cid not in direct)


# --------------------------------------------------------------------------- topics

@dataclass
class TopicStats:
    """What the TIRs and TQRs of one topic add up to."""

    seen: Tally = field(default_factory=Tally)
    tir: Tally = field(default_factory=Tally)
    tqr: Tally = field(default_factory=Tally)
    transports: set = field(default_factory=set)
    advertisers: set = field(default_factory=set)
    queriers: set = field(default_factory=set)


def topic_stats(facts: list[Fact]) -> dict[str, TopicStats]:
    """Per topic of a TIR or TQR: its :class:`TopicStats`."""
    out: dict[str, TopicStats] = {}
    for f in facts:
        if f.record_kind not in ("TIR", "TQR"):
            continue
        t = out.setdefault(f.topic, TopicStats())
        t.seen.fact(f)
        if f.record_kind == "TIR":
            t.tir.fact(f)
            t.transports.add(f.transport_id)
            t.advertisers.add(_label(f))
        else:
            t.tqr.fact(f)
            t.queriers.add((f.src, f.sport, f.context_id))
    return out


class TopicRow(NamedTuple):
    topic: str
    advertisements: int
    queries: int
    n_sources: int
    sources: str
    advertisers: str
    n_queriers: int
    first_seen: str | None
    last_seen: str | None
    first_advertised: str | None
    last_advertised: str | None
    first_queried: str | None


def topic_inventory(stats: dict[str, TopicStats]) -> list[TopicRow]:
    """Every topic: advertisements, queries, transports, advertisers, queriers and times;
    busiest first."""
    rows = [TopicRow(k, t.tir.n, t.tqr.n, len(t.transports), _join(t.transports), " | ".join(sorted(t.advertisers)),
                     len(t.queriers), iso_us(t.seen.first), iso_us(t.seen.last), iso_us(t.tir.first),
                     iso_us(t.tir.last), iso_us(t.tqr.first))
            for k, t in stats.items()]
    rows.sort(key=lambda x: (-(x.advertisements + x.queries), x.topic))
    return rows


class TopTopicRow(NamedTuple):
    topic: str
    records: int
    advertisements: int
    queries: int
    n_sources: int


def top_topics(inventory: list[TopicRow], top: int) -> list[TopTopicRow]:
    """The ``top`` busiest topics of the inventory."""
    return [TopTopicRow(i.topic, i.advertisements + i.queries, i.advertisements, i.queries, i.n_sources)
            for i in inventory[:top]]


class UnresolvedRow(NamedTuple):
    topic: str
    querier: str
    src_id: str | None
    queries: int
    first_query: str | None
    last_query: str | None
    via_lbmrd: bool


def unresolved_topics(facts: list[Fact], stats: dict[str, TopicStats]) -> list[UnresolvedRow]:
    """Per topic queried and never advertised, and querier (``ip:port`` and src_id:
    relayed by lbmrd the sender is lbmrd, so the src_id tells the contexts apart)."""
    per: dict[tuple, Tally] = defaultdict(Tally)
    for f in facts:
        if f.record_kind == "TQR" and not stats[f.topic].tir.n:
            per[(f.topic, f.src, f.sport, f.context_id)].fact(f)
    rows = [UnresolvedRow(t, f"{s}:{p}", c, u.n, iso_us(u.first), iso_us(u.last), p == LBMRD_PORT)
            for (t, s, p, c), u in per.items()]
    rows.sort(key=lambda x: (-x.queries, x.topic, x.querier, x.src_id or ""))
    return rows


# --------------------------------------------------------------------------- conflicts

@dataclass
class TransportUse:
    """The advertisements of one transport identity or OTID."""

    tally: Tally = field(default_factory=Tally)
    contexts: set = field(default_factory=set)
    #: :func:`context_key` of the contexts told apart
    keys: set = field(default_factory=set)
    topics: set = field(default_factory=set)
    transports: set = field(default_factory=set)

    def add(self, f: Fact) -> None:
        self.tally.fact(f)
        self.contexts.add(_label(f))
        k = context_key(f.src, f.sport, f.context_id)
        if k is not None:
            self.keys.add(k)
        self.topics.add(f.topic)
        self.transports.add(f.transport_id)


class TransportConflictRow(NamedTuple):
    transport_id: str
    n_contexts: int
    contexts: str
    n_topics: int
    topics: str
    advertisements: int
    first_seen: str | None
    last_seen: str | None


def transport_conflicts(tirs: list[Fact]) -> list[TransportConflictRow]:
    """Transport identities advertised by more than one context (contexts told apart
    by :func:`context_key`; ``contexts`` names every sender, ``n_contexts`` counts
    the contexts surely distinct)."""
    per: dict[str, TransportUse] = defaultdict(TransportUse)
    for f in tirs:
        per[f.transport_id].add(f)
    rows = [TransportConflictRow(k, count_contexts(x.keys), " | ".join(sorted(x.contexts)), len(x.topics),
                                 _join(x.topics), x.tally.n, iso_us(x.tally.first), iso_us(x.tally.last))
            for k, x in per.items() if count_contexts(x.keys) > 1]
    rows.sort(key=lambda x: (-x.n_contexts, x.transport_id))
    return rows


class OtidCollisionRow(NamedTuple):
    otid: str
    n_topics: int
    topics: str
    n_contexts: int
    contexts: str
    transports: str
    advertisements: int


def otid_collisions(tirs: list[Fact]) -> list[OtidCollisionRow]:
    """OTIDs advertised for more than one topic or by more than one context
    (counted as in :func:`transport_conflicts`)."""
    per: dict[str, TransportUse] = defaultdict(TransportUse)
    for f in tirs:
        if f.otid is not None:
            per[f.otid].add(f)
    rows = [OtidCollisionRow(k, len(o.topics), _join(o.topics), count_contexts(o.keys),
                             " | ".join(sorted(o.contexts)), _join(o.transports), o.tally.n)
            for k, o in per.items() if len(o.topics) > 1 or count_contexts(o.keys) > 1]
    rows.sort(key=lambda x: (-(x.n_topics + x.n_contexts), x.otid))
    return rows


class MultiTransportRow(NamedTuple):
    context: str
    src_id: str | None
    topic: str
    n_transports: int
    transports: str
    advertisements: int
    first_seen: str | None
    last_seen: str | None


def multi_transport_topics(tirs: list[Fact]) -> list[MultiTransportRow]:
    """A context advertising one topic on more than one transport identity; only
    contexts told apart (:func:`context_key`): TIRs relayed by lbmrd without src_id
    may come from several publishers.  ``context`` names the sender (``ip:port``,
    or ``via lbmrd ip:port`` for each lbmrd that relayed the context's TIRs), the
    src_id is a column of its own."""
    per: dict[tuple, TransportUse] = defaultdict(TransportUse)
    senders: dict[tuple, set] = defaultdict(set)
    for f in tirs:
        k = context_key(f.src, f.sport, f.context_id)
        if k is not None:
            per[(k, f.topic)].add(f)
            senders[(k, f.topic)].add(context_label(f.src, f.sport, None))
    rows = [MultiTransportRow(" | ".join(sorted(senders[(k, t)])), k[1], t, len(y.transports),
                              _join(y.transports), y.tally.n, iso_us(y.tally.first), iso_us(y.tally.last))
            for (k, t), y in per.items() if len(y.transports) > 1]
    rows.sort(key=lambda x: (-x.n_transports, x.context, x.topic, x.src_id or ""))
    return rows


# --------------------------------------------------------------------------- NAT audit

class NatRow(NamedTuple):
    advertised_ip: str
    transport_id: str
    topic: str
    advertiser: str
    via_lbmrd: bool
    advertisements: int
    first_seen: str | None
    last_seen: str | None
    reason: str


def nat_audit(tirs: list[Fact], flows: list[Flow]) -> list[NatRow]:
    """TIRs advertising an address no host of the capture's networks shares (the
    module docs' rule of thumb)."""
    seen24, blocks = set(), set()
    for fl in flows:
        for a, direct in ((fl.src, fl.sport != LBMRD_PORT), (fl.dst, True)):
            ip = _ip(a)
            if ip is None or ip.is_multicast or not direct or ip.is_unspecified:
                continue
            seen24.add(int(ip) >> 8)
            b = _block(ip)
            if b is not None:
                blocks.add(b)
    per: dict[tuple, Tally] = defaultdict(Tally)
    relayed: dict[tuple, bool] = {}
    for f in tirs:
        ip = _ip(f.transport_ip)
        if ip is None or ip.is_unspecified or ip.is_multicast:
            continue
        if int(ip) >> 8 in seen24 or (_block(ip) is not None and _block(ip) in blocks):
            continue
        k = (f.transport_ip, f.transport_id, f.topic, _label(f))
        per[k].fact(f)
        relayed.setdefault(k, f.sport == LBMRD_PORT)
    return [NatRow(*k, relayed[k], x.n, iso_us(x.first), iso_us(x.last),
                   "no host of this /24 or private block was seen in the capture")
            for k, x in sorted(per.items())]


# --------------------------------------------------------------------------- contexts

@dataclass
class ContextStats:
    """What the flows of one context (src, sport, context id) add up to."""

    packets: int = 0
    bytes: int = 0
    records: int = 0
    tirs: int = 0
    tqrs: int = 0
    seen: Tally = field(default_factory=Tally)
    keepalive: Tally = field(default_factory=Tally)
    types: set = field(default_factory=set)
    dsts: set = field(default_factory=set)
    to_lbmrd: bool = False


def context_stats(flows: list[Flow]) -> dict[tuple, ContextStats]:
    """Per (src, sport, context id): its :class:`ContextStats`."""
    out: dict[tuple, ContextStats] = {}
    for fl in flows:
        c = out.setdefault((fl.src, fl.sport, fl.context_id), ContextStats())
        c.packets += fl.packets
        c.bytes += fl.bytes
        c.records += fl.records
        c.tirs += fl.tirs
        c.tqrs += fl.tqrs
        c.seen.add(0, fl.first_us, fl.last_us)
        if fl.keepalives:
            c.types.add(fl.packet_type)
            c.dsts.add(fl.dst)
            c.keepalive.add(fl.keepalives, fl.ka_first_us, fl.ka_last_us)
        if fl.dport == LBMRD_PORT:
            c.to_lbmrd = True
    return out


class ContextRow(NamedTuple):
    context: str
    src_id: str | None
    via_lbmrd: bool
    packets: int
    bytes: int
    records: int
    tirs: int
    tqrs: int
    keepalives: int
    first_seen: str | None
    last_seen: str | None


def contexts(ctx: dict[tuple, ContextStats]) -> list[ContextRow]:
    """Every context, most datagrams first (the top talkers are the first rows)."""
    rows = [ContextRow(f"{s}:{p}", cid, p == LBMRD_PORT, c.packets, c.bytes, c.records, c.tirs, c.tqrs,
                       c.keepalive.n, iso_us(c.seen.first), iso_us(c.seen.last))
            for (s, p, cid), c in ctx.items()]
    rows.sort(key=lambda x: (-x.packets, -x.bytes, x.context, x.src_id or ""))
    return rows


class KeepaliveSenderRow(NamedTuple):
    client: str
    packets: int
    types: str
    destinations: str
    first_seen: str | None
    last_seen: str | None


def keepalive_senders(ctx: dict[tuple, ContextStats]) -> list[KeepaliveSenderRow]:
    """Per ``ip:port`` that sent keepalives: how many, packet types, destinations, times."""
    per: dict[tuple, ContextStats] = {}
    for (s, p, _cid), c in ctx.items():
        if c.keepalive.n:
            x = per.setdefault((s, p), ContextStats())
            x.keepalive.add(c.keepalive.n, c.keepalive.first, c.keepalive.last)
            x.types |= c.types
            x.dsts |= c.dsts
    return [KeepaliveSenderRow(f"{s}:{p}", x.keepalive.n, _join(x.types), _join(x.dsts),
                               iso_us(x.keepalive.first), iso_us(x.keepalive.last))
            for (s, p), x in sorted(per.items(), key=lambda kv: f"{kv[0][0]}:{kv[0][1]}")]


class ClientChangeRow(NamedTuple):
    client: str
    src_id: str | None
    event: str
    time: str | None
    silent_s: float | None
    datagrams: int


def client_changes(ctx: dict[tuple, ContextStats], flows: list[Flow]) -> list[ClientChangeRow]:
    """lbmrd clients (contexts that sent keepalives or LBMR to UDP port 15380) that
    joined (first heard more than :data:`CLIENT_SILENCE_S` after the capture's first
    datagram) or vanished (silent for more than that before its last datagram)."""
    span = Tally()
    for fl in flows:
        span.add(0, fl.first_us, fl.last_us)
    if span.first is None:
        return []
    lim = CLIENT_SILENCE_S * 1_000_000
    out = []
    for (s, p, cid), c in ctx.items():
        if not (c.keepalive.n or c.to_lbmrd) or p == LBMRD_PORT:
            continue
        name = f"{s}:{p}"
        if c.seen.first - span.first > lim:
            out.append(ClientChangeRow(name, cid, "joined", iso_us(c.seen.first), None, c.packets))
        if span.last - c.seen.last > lim:
            out.append(ClientChangeRow(name, cid, "vanished", iso_us(c.seen.last),
                                       round((span.last - c.seen.last) / 1e6, 3), c.packets))
    out.sort(key=lambda x: (x.time, x.client, x.event))
    return out


# --------------------------------------------------------------------------- wildcards

class WildcardPatternRow(NamedTuple):
    pattern: str
    pattern_type: int
    queries: int
    queriers: str
    first_seen: str | None
    last_seen: str | None
    matched_topics: int
    error: str | None


class WildcardMatchRow(NamedTuple):
    pattern: str
    pattern_type: int
    topic: str


def wildcards(wcs: list[Fact], topics: list[str]) -> tuple[list[WildcardPatternRow], list[WildcardMatchRow]]:
    """(per wildcard pattern and type: queries, queriers, times, matches or compile
    error; per pattern the topics of the capture it matches)."""
    per: dict[tuple, TransportUse] = defaultdict(TransportUse)
    for f in wcs:
        per[(f.topic, f.pattern_type)].add(f)
    prow, matches = [], []
    for (p, t) in sorted(per):
        x = per[(p, t)]
        rx = compile_pattern(p, t)
        err = rx if isinstance(rx, str) else None
        hits = [] if err else [tp for tp in topics if rx.search(tp)]
        matches += [WildcardMatchRow(p, t, tp) for tp in hits]
        prow.append(WildcardPatternRow(p, t, x.tally.n, " | ".join(sorted(x.contexts)), iso_us(x.tally.first),
                                       iso_us(x.tally.last), len(hits), err))
    return prow, matches


# --------------------------------------------------------------------------- all of them

def derive(facts: list[dict], flow_rows: list[dict], *, top: int) -> dict[str, list[dict]]:
    """The topic, conflict, NAT, talker, client and wildcard tables from the topic
    facts and flows (see the module docs for the definitions), as lists of dicts."""
    fs = [Fact(**f) for f in facts]
    fls = [Flow(**f) for f in flow_rows]
    tirs = [f for f in fs if f.record_kind == "TIR"]
    stats = topic_stats(fs)
    inventory = topic_inventory(stats)
    ctx = context_stats(fls)
    talkers = contexts(ctx)
    patterns, matches = wildcards([f for f in fs if f.record_kind == "WC_TQR"], sorted(stats))
    tables: dict[str, list[NamedTuple]] = {
        "topic_inventory": inventory,
        "top_topics": top_topics(inventory, top),
        "unresolved_topics": unresolved_topics(fs, stats),
        "transport_conflicts": transport_conflicts(tirs),
        "otid_collisions": otid_collisions(tirs),
        "multi_transport_topics": multi_transport_topics(tirs),
        "nat_audit": nat_audit(tirs, fls),
        "contexts": talkers,
        "top_talkers": talkers[:top],
        "keepalive_senders": keepalive_senders(ctx),
        "client_changes": client_changes(ctx, fls),
        "wildcard_patterns": patterns,
        "wildcard_matches": matches,
    }
    return {name: [r._asdict() for r in rows] for name, rows in tables.items()}


def storms_table(load: list[dict], threshold: int, per_ctx: list[dict]) -> tuple[list[dict], list[dict]]:
    """(storm seconds with their top contexts, per-context rows of storm seconds)."""
    by_sec: dict[int, list] = defaultdict(list)
    for x in per_ctx:
        by_sec[x["second"]].append(x)
    storms, rows = [], []
    for x in load:
        if x["record_kind"] != "ALL" or x["packets"] <= threshold:
            continue
        # ties in a stable order: one lbmrd relays several contexts (src_id) from one ip:port
        cs = sorted(by_sec.get(x["second"], []),
                    key=lambda c: (-c["packets"], c["src"], c["sport"], c["context_id"] or ""))
        for c in cs:
            rows.append(dict(second=x["second"], time=x["time"], context=f"{c['src']}:{c['sport']}",
                             src_id=c["context_id"], packets=c["packets"],
                             share=round(c["packets"] / x["packets"], 4)))
        storms.append(dict(second=x["second"], time=x["time"], packets=x["packets"], records=x["records"],
                           bytes=x["bytes"],
                           top_contexts="; ".join(f"{context_label(c['src'], c['sport'], c['context_id'])} "
                                                  f"{c['packets']}/s ({share_text(c['packets'], x['packets'])})"
                                                  for c in cs[:3])))
    return storms, rows


def ttr_table(rows: list[dict]) -> list[dict]:
    out = [dict(querier=f"{x['src']}:{x['sport']}", src_id=x["context_id"], topic=x["topic"],
                first_query=iso_us(x["us"]), resolved_at=iso_us(x["next_tir"]),
                time_to_resolve_s=(x["next_tir"] - x["us"]) / 1e6) for x in rows]
    out.sort(key=lambda x: (-x["time_to_resolve_s"], x["topic"], x["querier"], x["src_id"] or ""))
    return out


def stale_table(rows: list[dict]) -> list[dict]:
    out = [dict(topic=x["topic"], querier=f"{x['src']}:{x['sport']}", src_id=x["context_id"],
                last_advertised=iso_us(x["last_tir_us"]), queries_after=x["n"],
                first_query_after=iso_us(x["first_us"]), last_query=iso_us(x["last_us"]),
                silent_s=round((x["last_us"] - x["last_tir_us"]) / 1e6, 6))
           for x in rows]
    out.sort(key=lambda x: (-x["queries_after"], x["topic"], x["querier"], x["src_id"] or ""))
    return out


def totals(file_rows: list[dict]) -> dict:
    """The summary counts from the per-file rows."""
    firsts = [f["first_us"] for f in file_rows if f["first_us"] is not None]
    lasts = [f["last_us"] for f in file_rows if f["last_us"] is not None]
    s = dict(
        datagrams=sum(f["datagrams"] for f in file_rows),
        records=sum(f["records"] for f in file_rows),
        bytes=sum(f["bytes"] for f in file_rows),
        first_seen=iso_us(min(firsts)) if firsts else None,
        last_seen=iso_us(max(lasts)) if lasts else None,
        tirs=sum(f["k_TIR"] for f in file_rows), tqrs=sum(f["k_TQR"] for f in file_rows),
        wc_tqrs=sum(f["k_WC_TQR"] for f in file_rows), keepalives=sum(f["k_KEEPALIVE"] for f in file_rows),
        decode_errors=sum(f["decode_errors"] for f in file_rows),
        capture_errors=sum(f["capture_errors"] for f in file_rows),
    )
    pt = {t: sum(f["pt_" + t] for f in file_rows) for t in PACKET_TYPES}
    s["packet_types"] = {k: v for k, v in pt.items() if v}
    return s


def files_table(file_rows: list[dict]) -> list[dict]:
    return [dict(file=f["file"], datagrams=f["datagrams"], records=f["records"], bytes=f["bytes"],
                 decode_errors=f["decode_errors"], capture_errors=f["capture_errors"],
                 first_seen=iso_us(f["first_us"]), last_seen=iso_us(f["last_us"])) for f in file_rows]
