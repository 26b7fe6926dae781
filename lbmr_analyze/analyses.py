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
from datetime import UTC, datetime

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

def second_pass(spark, records_path: str, facts: list[dict], storm_secs: list[int]
                ) -> tuple[list[dict], list[dict], list[dict]]:
    """One more pass over the Parquet records, for what needs facts known only after
    the first: (time to resolve, stale queries, storm contexts) rows.

    The driver sends every task the first query of each (querier, topic), the last
    TIR time of each topic queried after it, and the storm seconds (a broadcast);
    the tasks read their Parquet files with pyarrow
    (:class:`lbmr_analyze.partials.SecondPass`) and return small partial tables,
    merged here."""
    import functools

    import pyarrow as pa
    import pyarrow.fs as pafs

    from . import fsio
    from . import partials as P

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
    cand = {t: us for t, us in last_tir.items() if last_tqr.get(t, -1) > us}
    if not first and not storm_secs:
        return [], [], []
    fs, base = fsio.filesystem(records_path)
    files = sorted(i.path for i in fs.get_file_info(pafs.FileSelector(base, recursive=True))
                   if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
                   and not i.base_name.startswith("."))
    if not files:
        return [], [], []
    keys = list(first)
    topics = sorted({k[3] for k in keys} | set(cand))
    tid = {t: i for i, t in enumerate(topics)}
    inputs = {
        # explicit types: an empty list would otherwise be of type null
        "topics": pa.table({"topic": pa.array(topics, pa.string())}),
        "firstq": pa.table({"q": pa.array(range(len(keys)), pa.int64()),
                            "tid": pa.array([tid[k[3]] for k in keys], pa.int32()),
                            "us": pa.array([first[k] for k in keys], pa.int64())}),
        "last_tir": pa.table({"tid": pa.array([tid[t] for t in cand], pa.int32()),
                              "last_tir_us": pa.array(list(cand.values()), pa.int64())}),
        "storm_secs": pa.table({"second": pa.array(storm_secs, pa.int64())}),
    }
    sc = spark.sparkContext
    n = max(1, min(len(files), 2 * sc.defaultParallelism))
    groups = [files[i::n] for i in range(n)]
    bc = sc.broadcast(P.to_ipc(inputs))
    try:
        got = (sc.parallelize(groups, n)
               .map(functools.partial(P.run_second, base_uri=records_path, inputs=bc)).collect())
    finally:
        bc.unpersist()
    m = P.merge([P.from_ipc(b) for b in got if b])
    ttr = []
    for x in (m["ttr"].to_pylist() if "ttr" in m else []):
        if x["next_tir"] is not None:
            s, p, cid, topic = keys[x["q"]]
            ttr.append(dict(src=s, sport=p, context_id=cid, topic=topic, us=first[keys[x["q"]]],
                            next_tir=x["next_tir"]))
    stale = [dict(x, last_tir_us=cand[x["topic"]]) for x in (m["stale"].to_pylist() if "stale" in m else [])]
    storm = m["storm"].to_pylist() if "storm" in m else []
    return ttr, stale, storm


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


def derive(facts: list[dict], flow_rows: list[dict], *, top: int) -> dict[str, list[dict]]:
    """The topic, conflict, NAT, talker, client and wildcard tables from the topic
    facts and flows (see the module docs for the definitions)."""
    T: dict[str, list[dict]] = {}
    label = context_label
    tirs = [f for f in facts if f["record_kind"] == "TIR"]
    tqrs = [f for f in facts if f["record_kind"] == "TQR"]
    wcs = [f for f in facts if f["record_kind"] == "WC_TQR"]

    # ---- topics
    by_topic: dict[str, dict] = {}
    for f in tirs + tqrs:
        t = by_topic.setdefault(f["topic"], dict(adv=0, q=0, tids=set(), advs=set(), qs=set(),
                                                 first=None, last=None, ftir=None, ltir=None, ftqr=None))
        if f["record_kind"] == "TIR":
            t["adv"] += f["n"]
            t["tids"].add(f["transport_id"])
            t["advs"].add(label(f["src"], f["sport"], f["context_id"]))
            t["ftir"] = f["first_us"] if t["ftir"] is None else min(t["ftir"], f["first_us"])
            t["ltir"] = f["last_us"] if t["ltir"] is None else max(t["ltir"], f["last_us"])
        else:
            t["q"] += f["n"]
            t["qs"].add((f["src"], f["sport"], f["context_id"]))
            t["ftqr"] = f["first_us"] if t["ftqr"] is None else min(t["ftqr"], f["first_us"])
        t["first"] = f["first_us"] if t["first"] is None else min(t["first"], f["first_us"])
        t["last"] = f["last_us"] if t["last"] is None else max(t["last"], f["last_us"])
    inv = [dict(topic=k, advertisements=t["adv"], queries=t["q"], n_sources=len(t["tids"]),
                sources=_join(t["tids"]), advertisers=_join(t["advs"]), n_queriers=len(t["qs"]),
                first_seen=iso_us(t["first"]), last_seen=iso_us(t["last"]),
                first_advertised=iso_us(t["ftir"]), last_advertised=iso_us(t["ltir"]),
                first_queried=iso_us(t["ftqr"]))
           for k, t in by_topic.items()]
    inv.sort(key=lambda x: (-(x["advertisements"] + x["queries"]), x["topic"]))
    T["topic_inventory"] = inv
    T["top_topics"] = [dict(topic=i["topic"], records=i["advertisements"] + i["queries"],
                            advertisements=i["advertisements"], queries=i["queries"], n_sources=i["n_sources"])
                       for i in inv[:top]]

    # ---- unresolved: per (topic, querier)
    unres: dict[tuple, list] = {}
    for f in tqrs:
        if by_topic[f["topic"]]["adv"]:
            continue
        # per context: relayed by lbmrd, the sender is lbmrd, so the src_id tells them apart
        k = (f["topic"], f["src"], f["sport"], f["context_id"])
        u = unres.setdefault(k, [0, f["first_us"], f["last_us"]])
        u[0] += f["n"]
        u[1], u[2] = min(u[1], f["first_us"]), max(u[2], f["last_us"])
    T["unresolved_topics"] = sorted(
        (dict(topic=t, querier=f"{s}:{p}", src_id=c, queries=u[0],
              first_query=iso_us(u[1]), last_query=iso_us(u[2]), via_lbmrd=p == LBMRD_PORT)
         for (t, s, p, c), u in unres.items()),
        key=lambda x: (-x["queries"], x["topic"], x["querier"], x["src_id"] or ""))

    # ---- conflicts
    by_tid: dict[str, dict] = defaultdict(lambda: dict(ctx=set(), topics=set(), n=0, first=None, last=None))
    by_otid: dict[str, dict] = defaultdict(lambda: dict(ctx=set(), topics=set(), tids=set(), n=0))
    by_ctx_topic: dict[tuple, dict] = defaultdict(lambda: dict(tids=set(), n=0, first=None, last=None))
    for f in tirs:
        c = label(f["src"], f["sport"], f["context_id"])
        x = by_tid[f["transport_id"]]
        x["ctx"].add(c)
        x["topics"].add(f["topic"])
        x["n"] += f["n"]
        x["first"] = f["first_us"] if x["first"] is None else min(x["first"], f["first_us"])
        x["last"] = f["last_us"] if x["last"] is None else max(x["last"], f["last_us"])
        if f["otid"] is not None:
            o = by_otid[f["otid"]]
            o["ctx"].add(c)
            o["topics"].add(f["topic"])
            o["tids"].add(f["transport_id"])
            o["n"] += f["n"]
        y = by_ctx_topic[(f["src"], f["sport"], f["context_id"], f["topic"])]
        y["tids"].add(f["transport_id"])
        y["n"] += f["n"]
        y["first"] = f["first_us"] if y["first"] is None else min(y["first"], f["first_us"])
        y["last"] = f["last_us"] if y["last"] is None else max(y["last"], f["last_us"])
    T["transport_conflicts"] = sorted(
        (dict(transport_id=k, n_contexts=len(x["ctx"]), contexts=" | ".join(sorted(x["ctx"])),
              n_topics=len(x["topics"]), topics=_join(x["topics"]), advertisements=x["n"],
              first_seen=iso_us(x["first"]), last_seen=iso_us(x["last"]))
         for k, x in by_tid.items() if len(x["ctx"]) > 1),
        key=lambda x: (-x["n_contexts"], x["transport_id"]))
    T["otid_collisions"] = sorted(
        (dict(otid=k, n_topics=len(o["topics"]), topics=_join(o["topics"]), n_contexts=len(o["ctx"]),
              contexts=" | ".join(sorted(o["ctx"])), transports=_join(o["tids"]), advertisements=o["n"])
         for k, o in by_otid.items() if len(o["topics"]) > 1 or len(o["ctx"]) > 1),
        key=lambda x: (-(x["n_topics"] + x["n_contexts"]), x["otid"]))
    T["multi_transport_topics"] = sorted(
        (dict(context=label(s, p, cid), src_id=cid, topic=t, n_transports=len(y["tids"]),
              transports=_join(y["tids"]), advertisements=y["n"],
              first_seen=iso_us(y["first"]), last_seen=iso_us(y["last"]))
         for (s, p, cid, t), y in by_ctx_topic.items() if len(y["tids"]) > 1),
        key=lambda x: (-x["n_transports"], x["context"], x["topic"]))

    # ---- NAT audit
    seen24, blocks = set(), set()
    for fl in flow_rows:
        for a, direct in ((fl["src"], fl["sport"] != LBMRD_PORT), (fl["dst"], True)):
            ip = _ip(a)
            if ip is None or ip.is_multicast or not direct or ip.is_unspecified:
                continue
            seen24.add(int(ip) >> 8)
            b = _block(ip)
            if b is not None:
                blocks.add(b)
    nat: dict[tuple, dict] = {}
    for f in tirs:
        ip = _ip(f["transport_ip"])
        if ip is None or ip.is_unspecified or ip.is_multicast:
            continue
        if int(ip) >> 8 in seen24 or (_block(ip) is not None and _block(ip) in blocks):
            continue
        k = (f["transport_ip"], f["transport_id"], f["topic"], label(f["src"], f["sport"], f["context_id"]))
        x = nat.setdefault(k, dict(n=0, first=f["first_us"], last=f["last_us"], relayed=f["sport"] == LBMRD_PORT))
        x["n"] += f["n"]
        x["first"], x["last"] = min(x["first"], f["first_us"]), max(x["last"], f["last_us"])
    T["nat_audit"] = [dict(advertised_ip=k[0], transport_id=k[1], topic=k[2], advertiser=k[3],
                           via_lbmrd=x["relayed"], advertisements=x["n"],
                           first_seen=iso_us(x["first"]), last_seen=iso_us(x["last"]),
                           reason="no host of this /24 or private block was seen in the capture")
                      for k, x in sorted(nat.items())]

    # ---- contexts: top talkers, keepalive clients, census changes
    ctx: dict[tuple, dict] = {}
    for fl in flow_rows:
        k = (fl["src"], fl["sport"], fl["context_id"])
        c = ctx.setdefault(k, dict(packets=0, bytes=0, records=0, tirs=0, tqrs=0, keepalives=0,
                                   first=fl["first_us"], last=fl["last_us"], ka_first=None, ka_last=None,
                                   types=set(), dsts=set(), to_lbmrd=False))
        for n in ("packets", "bytes", "records", "tirs", "tqrs", "keepalives"):
            c[n] += fl[n]
        c["first"], c["last"] = min(c["first"], fl["first_us"]), max(c["last"], fl["last_us"])
        if fl["keepalives"]:
            c["types"].add(fl["packet_type"])
            c["dsts"].add(fl["dst"])
            c["ka_first"] = fl["ka_first_us"] if c["ka_first"] is None else min(c["ka_first"], fl["ka_first_us"])
            c["ka_last"] = fl["ka_last_us"] if c["ka_last"] is None else max(c["ka_last"], fl["ka_last_us"])
        if fl["dport"] == LBMRD_PORT:
            c["to_lbmrd"] = True
    talkers = [dict(context=f"{s}:{p}", src_id=cid, via_lbmrd=p == LBMRD_PORT, packets=c["packets"],
                    bytes=c["bytes"], records=c["records"], tirs=c["tirs"], tqrs=c["tqrs"],
                    keepalives=c["keepalives"], first_seen=iso_us(c["first"]), last_seen=iso_us(c["last"]))
               for (s, p, cid), c in ctx.items()]
    talkers.sort(key=lambda x: (-x["packets"], -x["bytes"], x["context"], x["src_id"] or ""))
    T["contexts"] = talkers
    T["top_talkers"] = talkers[:top]
    ka: dict[tuple, dict] = {}
    for (s, p, _cid), c in ctx.items():
        if c["keepalives"]:
            x = ka.setdefault((s, p), dict(n=0, types=set(), dsts=set(), first=c["ka_first"], last=c["ka_last"]))
            x["n"] += c["keepalives"]
            x["types"] |= c["types"]
            x["dsts"] |= c["dsts"]
            x["first"], x["last"] = min(x["first"], c["ka_first"]), max(x["last"], c["ka_last"])
    T["keepalive_senders"] = [dict(client=f"{s}:{p}", packets=x["n"], types=_join(x["types"]),
                                   destinations=_join(x["dsts"]), first_seen=iso_us(x["first"]),
                                   last_seen=iso_us(x["last"]))
                              for (s, p), x in sorted(ka.items(), key=lambda kv: f"{kv[0][0]}:{kv[0][1]}")]
    T["client_changes"] = client_changes(ctx, flow_rows)

    # ---- wildcards
    pats: dict[tuple, dict] = {}
    for f in wcs:
        k = (f["topic"], f["pattern_type"])
        x = pats.setdefault(k, dict(n=0, qs=set(), first=f["first_us"], last=f["last_us"]))
        x["n"] += f["n"]
        x["qs"].add(label(f["src"], f["sport"], f["context_id"]))
        x["first"], x["last"] = min(x["first"], f["first_us"]), max(x["last"], f["last_us"])
    topics = sorted(by_topic)
    prow, matches = [], []
    for (p, t) in sorted(pats):
        x = pats[(p, t)]
        rx = compile_pattern(p, t)
        err = rx if isinstance(rx, str) else None
        hits = [] if err else [tp for tp in topics if rx.search(tp)]
        matches += [dict(pattern=p, pattern_type=t, topic=tp) for tp in hits]
        prow.append(dict(pattern=p, pattern_type=t, queries=x["n"], queriers=" | ".join(sorted(x["qs"])),
                         first_seen=iso_us(x["first"]), last_seen=iso_us(x["last"]),
                         matched_topics=len(hits), error=err))
    T["wildcard_patterns"] = prow
    T["wildcard_matches"] = matches
    return T


def client_changes(ctx: dict[tuple, dict], flow_rows: list[dict]) -> list[dict]:
    """lbmrd clients (contexts that sent keepalives or LBMR to UDP port 15380) that
    joined (first heard more than :data:`CLIENT_SILENCE_S` after the capture's first
    datagram) or vanished (silent for more than that before its last datagram)."""
    times = [fl["first_us"] for fl in flow_rows] + [fl["last_us"] for fl in flow_rows]
    if not times:
        return []
    start, end = min(times), max(times)
    lim = CLIENT_SILENCE_S * 1_000_000
    out = []
    for (s, p, cid), c in ctx.items():
        if not (c["keepalives"] or c["to_lbmrd"]) or p == LBMRD_PORT:
            continue
        name = f"{s}:{p}"
        if c["first"] - start > lim:
            out.append(dict(client=name, src_id=cid, event="joined", time=iso_us(c["first"]),
                            silent_s=None, datagrams=c["packets"]))
        if end - c["last"] > lim:
            out.append(dict(client=name, src_id=cid, event="vanished", time=iso_us(c["last"]),
                            silent_s=round((end - c["last"]) / 1e6, 3), datagrams=c["packets"]))
    out.sort(key=lambda x: (x["time"], x["client"], x["event"]))
    return out


def storms_table(load: list[dict], threshold: int, per_ctx: list[dict]) -> tuple[list[dict], list[dict]]:
    """(storm seconds with their top contexts, per-context rows of storm seconds)."""
    by_sec: dict[int, list] = defaultdict(list)
    for x in per_ctx:
        by_sec[x["second"]].append(x)
    storms, rows = [], []
    for x in load:
        if x["record_kind"] != "ALL" or x["packets"] <= threshold:
            continue
        cs = sorted(by_sec.get(x["second"], []), key=lambda c: (-c["packets"], c["src"], c["sport"]))
        for c in cs:
            rows.append(dict(second=x["second"], time=x["time"], context=f"{c['src']}:{c['sport']}",
                             src_id=c["context_id"], packets=c["packets"],
                             share=round(c["packets"] / x["packets"], 4)))
        storms.append(dict(second=x["second"], time=x["time"], packets=x["packets"], records=x["records"],
                           bytes=x["bytes"],
                           top_contexts="; ".join(f"{context_label(c['src'], c['sport'], c['context_id'])} "
                                                  f"{c['packets']}/s" for c in cs[:3])))
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
