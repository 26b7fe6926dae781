"""Partial aggregates computed by the decoding tasks, so most analyses need no
second pass over the records (executor side: pyarrow only).

While a task writes its split's records as Parquet it also aggregates each Arrow
batch into a few small tables (:func:`of_batch`); the partial tables of a split,
and then of all splits on the driver, are combined by grouping again
(:func:`merge`).  The tables (times in epoch microseconds, ``second`` and
``minute`` in epoch seconds):

``files``
    per file: datagrams, records, bytes, decode and capture errors, first/last
    time, records per kind ``k_<KIND>`` and datagrams per packet type ``pt_<TYPE>``.
``facts``
    per (topic, record kind, pattern type, src, sport, context id, transport
    identity, transport IP, OTID) over TIR, TQR and WC_TQR records: count, first
    and last time.
``flows``
    per (src, sport, dst, dport, context id, packet type), decodable datagrams
    only: datagrams, bytes, records, TIRs, TQRs, keepalives, first/last time,
    first/last keepalive time.
``load``
    per (second, record kind): datagrams holding the kind, records, their bytes,
    and datagrams and bytes counted once per datagram (for the ALL series).
``census``
    per (minute, src, sport) of keepalives: count.
``errors``
    the DECODE_ERROR and CAPTURE_ERROR rows themselves.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

KINDS = ("TIR", "TQR", "WC_TQR", "KEEPALIVE")
PACKET_TYPES = ("NORMAL", "WC_TQR", "RCV_ALIVE", "SRC_ALIVE", "TOPIC_MGMT", "QUEUE_RES", "EXT")
FACT_KEYS = ["topic", "record_kind", "pattern_type", "src", "sport", "context_id", "transport_id",
             "transport_ip", "otid"]
FLOW_KEYS = ["src", "sport", "dst", "dport", "context_id", "packet_type"]
ERROR_COLS = ["record_kind", "file", "offset", "us", "src", "sport", "dst", "dport", "length", "error"]

_I64 = pa.int64()


def _i(mask) -> pa.Array:
    return pc.cast(pc.fill_null(mask, False), _I64)


def _when(mask, values) -> pa.Array:
    return pc.if_else(pc.fill_null(mask, False), values, pa.scalar(None, values.type))


def _agg(t: pa.Table, keys: list[str], specs: list[tuple[str, str, str]]) -> pa.Table:
    """Group ``t`` by ``keys``; specs (column, function, output name)."""
    g = t.group_by(keys, use_threads=False).aggregate([(c, f) for c, f, _ in specs])
    names = [f"{c}_{f}" for c, f, _ in specs]
    return pa.table([g[n] for n in names] + [g[k] for k in keys], names=[o for _, _, o in specs] + keys)


def of_batch(b: pa.RecordBatch) -> dict[str, pa.Table]:
    """The partial tables of one record batch (:data:`lbmr_analyze.rows.SCHEMA`)."""
    t = pa.Table.from_batches([b])
    kind = t["record_kind"]
    us = pc.cast(t["ts"], _I64)
    ts_ok = pc.is_valid(us)
    first = pc.equal(t["record_index"], 0)
    not_cap = pc.not_equal(kind, "CAPTURE_ERROR")
    dg = pc.and_(first, not_cap)
    length = pc.cast(t["length"], _I64)
    zero = pa.scalar(0, _I64)
    cols = {"us": us, "dg": _i(dg), "rec": _i(not_cap),
            "dg_bytes": pc.if_else(pc.fill_null(dg, False), pc.fill_null(length, 0), zero),
            "dec": _i(pc.equal(kind, "DECODE_ERROR")), "cap": _i(pc.equal(kind, "CAPTURE_ERROR"))}
    for k in KINDS:
        cols["k_" + k] = _i(pc.equal(kind, k))
    for p in PACKET_TYPES:
        cols["pt_" + p] = _i(pc.and_(dg, pc.equal(t["packet_type"], p)))
    ft = pa.table(dict(file=t["file"], **cols))
    out = {"files": _agg(ft, ["file"], [("dg", "sum", "datagrams"), ("rec", "sum", "records"),
                                        ("dg_bytes", "sum", "bytes"), ("dec", "sum", "decode_errors"),
                                        ("cap", "sum", "capture_errors"), ("us", "min", "first_us"),
                                        ("us", "max", "last_us")]
                         + [("k_" + k, "sum", "k_" + k) for k in KINDS]
                         + [("pt_" + p, "sum", "pt_" + p) for p in PACKET_TYPES])}
    # topic facts
    m = pc.is_in(kind, pa.array(["TIR", "TQR", "WC_TQR"]))
    ftab = t.select(FACT_KEYS).append_column("us", us).filter(m)
    out["facts"] = _agg(ftab, FACT_KEYS, [("us", "count", "n"), ("us", "min", "first_us"),
                                          ("us", "max", "last_us")])
    # flows
    ok = pc.and_(ts_ok, pc.not_equal(kind, "DECODE_ERROR"))
    ka = pc.equal(kind, "KEEPALIVE")
    fl = t.select(FLOW_KEYS).append_column("us", us)
    for name, col in (("first", _i(first)), ("bytes", pc.if_else(first, pc.fill_null(length, 0), zero)),
                      ("tir", _i(pc.equal(kind, "TIR"))), ("tqr", _i(pc.equal(kind, "TQR"))),
                      ("ka", _i(ka)), ("ka_us", _when(ka, us))):
        fl = fl.append_column(name, col)
    out["flows"] = _agg(fl.filter(ok), FLOW_KEYS, [
        ("first", "sum", "packets"), ("bytes", "sum", "bytes"), ("us", "count", "records"),
        ("tir", "sum", "tirs"), ("tqr", "sum", "tqrs"), ("ka", "sum", "keepalives"),
        ("us", "min", "first_us"), ("us", "max", "last_us"), ("ka_us", "min", "ka_first_us"),
        ("ka_us", "max", "ka_last_us")])
    # load per second and kind
    second = pc.divide(us, 1_000_000)
    kf = t["kind_first"]
    lt = pa.table({"second": second, "record_kind": kind, "kf": _i(kf), "us": us,
                   "kf_bytes": pc.if_else(pc.fill_null(kf, False), pc.fill_null(length, 0), zero),
                   "dg": _i(first), "dg_bytes": pc.if_else(first, pc.fill_null(length, 0), zero)}).filter(ts_ok)
    out["load"] = _agg(lt, ["second", "record_kind"], [
        ("kf", "sum", "packets"), ("us", "count", "records"), ("kf_bytes", "sum", "bytes"),
        ("dg", "sum", "dg"), ("dg_bytes", "sum", "dg_bytes")])
    # keepalive clients per minute
    ct = pa.table({"minute": pc.multiply(pc.divide(second, 60), 60), "src": t["src"], "sport": t["sport"],
                   "us": us}).filter(pc.and_(ka, ts_ok))
    out["census"] = _agg(ct, ["minute", "src", "sport"], [("us", "count", "packets")])
    et = t.append_column("us", us).filter(pc.is_in(kind, pa.array(["DECODE_ERROR", "CAPTURE_ERROR"])))
    out["errors"] = et.select(ERROR_COLS)
    return out


_MERGE = {
    "files": (["file"], None),
    "facts": (FACT_KEYS, [("n", "sum"), ("first_us", "min"), ("last_us", "max")]),
    "flows": (FLOW_KEYS, [("packets", "sum"), ("bytes", "sum"), ("records", "sum"), ("tirs", "sum"),
                          ("tqrs", "sum"), ("keepalives", "sum"), ("first_us", "min"), ("last_us", "max"),
                          ("ka_first_us", "min"), ("ka_last_us", "max")]),
    "load": (["second", "record_kind"], [("packets", "sum"), ("records", "sum"), ("bytes", "sum"),
                                         ("dg", "sum"), ("dg_bytes", "sum")]),
    "census": (["minute", "src", "sport"], [("packets", "sum")]),
}


def merge(parts: list[dict[str, pa.Table]]) -> dict[str, pa.Table]:
    """Combine partial tables (from batches or splits) into one set."""
    out: dict[str, pa.Table] = {}
    if not parts:
        return out
    for name in parts[0]:
        t = pa.concat_tables([p[name] for p in parts])
        if name == "errors" or len(parts) == 1:
            out[name] = t
            continue
        keys, specs = _MERGE[name]
        if specs is None:                        # files: every other column is a sum, but the times
            specs = [(c, "min" if c == "first_us" else "max" if c == "last_us" else "sum")
                     for c in t.column_names if c not in keys]
        out[name] = _agg(t, keys, [(c, f, c) for c, f in specs]).select(t.column_names)
    return out


def to_ipc(parts: dict[str, pa.Table]) -> bytes:
    """Serialise a set of partial tables (one Arrow IPC stream per table, length-prefixed)."""
    import struct
    chunks = []
    for name, t in parts.items():
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        data = sink.getvalue().to_pybytes()
        nb = name.encode()
        chunks += [struct.pack(">HQ", len(nb), len(data)), nb, data]
    return b"".join(chunks)


def from_ipc(data: bytes) -> dict[str, pa.Table]:
    import struct
    out, p = {}, 0
    while p < len(data):
        n, size = struct.unpack_from(">HQ", data, p)
        p += 10
        name = data[p:p + n].decode()
        p += n
        out[name] = pa.ipc.open_stream(data[p:p + size]).read_all()
        p += size
    return out


# --------------------------------------------------------------------------- second pass

#: Record columns the second pass reads.
SECOND_COLUMNS = ["topic", "record_kind", "record_index", "src", "sport", "context_id", "ts"]


def second_pass(t: pa.Table, firstq: pa.Table, last_tir: pa.Table, storm_secs: pa.Array) -> dict[str, pa.Table]:
    """Partial tables of the analyses that need global facts, for one piece of the
    records ``t`` (:data:`SECOND_COLUMNS`):

    ``ttr``    per querier ``q`` of ``firstq`` (q, topic, us: a querier's first query
               for the topic): the earliest TIR time at or after it (``next_tir``);
    ``stale``  per (topic, src, sport, context_id): TQRs after the topic's last
               TIR (``last_tir``: topic, last_tir_us): count, first and last time;
    ``storm``  per (second, src, sport, context_id) for the seconds in
               ``storm_secs``: datagrams.

    Times in epoch microseconds, seconds in epoch seconds."""
    us = pc.cast(t["ts"], _I64)
    t = t.append_column("us", us)
    kind = t["record_kind"]
    out: dict[str, pa.Table] = {}
    tirs = t.filter(pc.equal(kind, "TIR")).select(["topic", "us"]).rename_columns(["topic", "tir_us"])
    j = tirs.join(firstq, "topic", join_type="inner", use_threads=False)
    j = j.filter(pc.greater_equal(j["tir_us"], j["us"]))
    out["ttr"] = _agg(j, ["q"], [("tir_us", "min", "next_tir")])
    tq = t.filter(pc.equal(kind, "TQR")).select(["topic", "src", "sport", "context_id", "us"])
    tq = tq.join(last_tir, "topic", join_type="inner", use_threads=False)
    tq = tq.filter(pc.greater(tq["us"], tq["last_tir_us"]))
    out["stale"] = _agg(tq, ["topic", "src", "sport", "context_id"],
                        [("us", "count", "n"), ("us", "min", "first_us"), ("us", "max", "last_us")])
    sec = pc.divide(us, 1_000_000)
    st = pa.table({"second": sec, "src": t["src"], "sport": t["sport"], "context_id": t["context_id"],
                   "us": us}).filter(pc.and_(pc.fill_null(pc.equal(t["record_index"], 0), False),
                                             pc.fill_null(pc.is_in(sec, storm_secs), False)))
    out["storm"] = _agg(st, ["second", "src", "sport", "context_id"], [("us", "count", "packets")])
    return out


_MERGE.update({
    "ttr": (["q"], [("next_tir", "min")]),
    "stale": (["topic", "src", "sport", "context_id"], [("n", "sum"), ("first_us", "min"), ("last_us", "max")]),
    "storm": (["second", "src", "sport", "context_id"], [("packets", "sum")]),
})


def second_pass_files(paths: list[str], base_uri: str, inputs_ipc: bytes) -> bytes:
    """Executor side: :func:`second_pass` over Parquet record files (paths within
    the file system of ``base_uri``), merged, as IPC bytes."""
    import pyarrow.parquet as pq

    from . import fsio
    fs, _ = fsio.filesystem(base_uri)
    inp = from_ipc(inputs_ipc)
    secs = inp["storm_secs"]["second"].combine_chunks()
    parts = []
    for p in paths:
        t = pq.read_table(p, columns=SECOND_COLUMNS, filesystem=fs)
        parts.append(second_pass(t, inp["firstq"], inp["last_tir"], secs))
        if len(parts) >= 16:
            parts = [merge(parts)]
    return to_ipc(merge(parts)) if parts else b""


def run_second(paths: list[str], base_uri: str, inputs) -> bytes:
    """The task function: ``inputs`` is a Spark broadcast of the IPC inputs."""
    return second_pass_files(paths, base_uri, inputs.value)
