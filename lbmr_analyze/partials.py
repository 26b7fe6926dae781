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
``tr``, ``tr_dropped``
    the distinct datagrams holding a TIR or TQR (src, sport, dst, dport,
    payload; first time), which the transport pass learns first
    (:class:`lbmr_analyze.rows.TopicResolution`), and per split how many a bound
    kept out.
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


def _counts(col) -> dict:
    vc = pc.value_counts(col)
    return dict(zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist(), strict=True))


def _files_one(t: pa.Table, kind, us, dg, not_cap, length) -> pa.Table:
    """The ``files`` row of a batch of one file: two value counts instead of a
    comparison per kind and packet type."""
    kinds = _counts(kind)
    dgm = pc.fill_null(dg, False)
    pts = _counts(pc.filter(t["packet_type"], dgm))
    mm = pc.min_max(us)
    row = {"datagrams": pc.sum(_i(dgm)).as_py() or 0, "records": pc.sum(_i(not_cap)).as_py() or 0,
           "bytes": pc.sum(pc.filter(pc.fill_null(length, 0), dgm)).as_py() or 0,
           "decode_errors": kinds.get("DECODE_ERROR", 0), "capture_errors": kinds.get("CAPTURE_ERROR", 0),
           "first_us": mm["min"].as_py(), "last_us": mm["max"].as_py()}
    row.update({"k_" + k: kinds.get(k, 0) for k in KINDS})
    row.update({"pt_" + p: pts.get(p, 0) for p in PACKET_TYPES})
    return pa.table({k: pa.array([v], _I64) for k, v in row.items()} | {"file": t["file"].slice(0, 1)})


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
    if pc.count_distinct(t["file"]).as_py() == 1:
        out = {"files": _files_one(t, kind, us, dg, not_cap, length)}
    else:                                    # (batches hold one split, so one file: not reached)
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
    names = list(dict.fromkeys(n for p in parts for n in p))   # parts may lack a table
    for name in names:
        have = [p[name] for p in parts if name in p]
        t = pa.concat_tables(have)
        if name == "errors" or len(have) == 1:
            out[name] = t
            continue
        keys, specs = _MERGE[name]
        if specs is None:                        # files: every other column is a sum, but the times
            specs = [(c, "min" if c == "first_us" else "max" if c == "last_us" else "sum")
                     for c in t.column_names if c not in keys]
        out[name] = _agg(t, keys, [(c, f, c) for c, f in specs]).select(t.column_names)
    return out


_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")


def to_ipc(parts: dict[str, pa.Table]) -> bytes:
    """Serialise a set of partial tables (one Arrow IPC stream per table, length-prefixed)."""
    import struct
    chunks = []
    for name, t in parts.items():
        sink = pa.BufferOutputStream()
        # compressed: a split's facts repeat the same topics and transports (MBs -> 100s of KB)
        with pa.ipc.new_stream(sink, t.schema, options=_IPC_OPTIONS) as w:
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


def _codes(col: pa.DictionaryArray, value: str) -> pa.Array:
    """Boolean mask: rows of the dictionary-encoded ``col`` equal to ``value``."""
    d = col.dictionary.to_pylist()
    if value not in d:
        return pa.nulls(len(col), pa.bool_()).fill_null(False)
    return pc.fill_null(pc.equal(col.indices, d.index(value)), False)


def _decoded(col: pa.DictionaryArray, idx: pa.Array) -> pa.Array:
    """Rows ``idx`` of a dictionary-encoded column, as plain strings."""
    return _names(col.dictionary, pc.take(col.indices, idx))


def _names(dictionary: pa.Array, codes) -> pa.Array:
    """The strings of dictionary ``codes``; a null code gives null (so an empty
    dictionary, a column null in every row, is fine: nothing is looked up)."""
    return pc.take(dictionary, codes).cast(pa.string())


def _iota(n: int, typ=_I64) -> pa.Array:
    """0, 1, ..., n - 1."""
    return pc.subtract(pc.cumulative_sum(pa.nulls(n, typ).fill_null(1)), 1) if n else pa.array([], typ)


def _scatter(pos: pa.Array, values: pa.Array, n: int) -> pa.Array:
    """An array of length ``n`` with ``values[i]`` at ``pos[i]`` and null elsewhere."""
    where = pc.index_in(_iota(n, pos.type), value_set=pos)
    return pc.take(values, where)


class SecondPass:
    """The analyses that need global facts, over record batches read with the
    strings dictionary-encoded (Parquet keeps them so: ten times faster to read than
    plain strings), computed on integer codes:

    ``ttr``    per querier ``q`` of ``firstq`` (q, tid, us: a querier's first query
               for topic number ``tid``): the earliest TIR time at or after it
               (``next_tir``), found by sorting TIR and query times together per
               topic and filling each query with the next TIR time (no join, so
               no product of TIRs and queriers);
    ``stale``  per (topic, src, sport, context_id): TQRs after the topic's last TIR
               (``last_tir``: tid, last_tir_us): count, first and last time;
    ``storm``  per (second, src, sport, context_id) for the seconds in
               ``storm_secs``: datagrams.

    ``topics`` names the topic numbers.  Times in epoch microseconds, seconds in
    epoch seconds."""

    def __init__(self, inputs: dict[str, pa.Table]) -> None:
        self.topics = inputs["topics"]["topic"].combine_chunks()
        fq = inputs["firstq"]
        self.q, self.q_tid, self.q_us = (fq[c].combine_chunks() for c in ("q", "tid", "us"))
        lt = inputs["last_tir"]
        # last TIR time per topic number (null: not a topic with late queries)
        self.last = _scatter(lt["tid"].combine_chunks(), lt["last_tir_us"].combine_chunks(), len(self.topics))
        self.storm_secs = inputs["storm_secs"]["second"].combine_chunks()
        self.next_tir = pa.nulls(len(self.q), _I64)
        self.parts: list[dict[str, pa.Table]] = []

    def add(self, b: pa.RecordBatch) -> None:
        us = pc.cast(b.column("ts"), _I64)
        kind = b.column("record_kind")
        topic = b.column("topic")
        tmap = pc.index_in(topic.dictionary, value_set=self.topics)
        tid = pc.take(tmap, topic.indices)                          # null: not a topic of interest
        known = pc.is_valid(tid)
        out: dict[str, pa.Table] = {}
        # time to resolve: TIR times of the queried topics
        tir = pc.and_(_codes(kind, "TIR"), known)
        if len(self.q) and pc.any(tir).as_py():
            self._ttr(pc.filter(tid, tir), pc.filter(us, tir))
        # stale queries: TQRs after their topic's last TIR
        if len(self.last):
            tqr = pc.and_(_codes(kind, "TQR"), known)
            late = pc.and_(tqr, pc.fill_null(pc.greater(us, pc.take(self.last, pc.fill_null(tid, 0))), False))
            if pc.any(late).as_py():
                idx = pc.indices_nonzero(late)
                t = pa.table({"topic": pc.take(self.topics, pc.take(tid, idx)), "src": _decoded(b.column("src"), idx),
                              "sport": pc.take(b.column("sport"), idx),
                              "context_id": _decoded(b.column("context_id"), idx), "us": pc.take(us, idx)})
                out["stale"] = _agg(t, ["topic", "src", "sport", "context_id"],
                                    [("us", "count", "n"), ("us", "min", "first_us"), ("us", "max", "last_us")])
        # storm seconds: datagrams per context, grouped on dictionary codes
        if len(self.storm_secs):
            sec = pc.divide(us, 1_000_000)
            m = pc.and_(pc.fill_null(pc.equal(b.column("record_index"), 0), False),
                        pc.fill_null(pc.is_in(sec, self.storm_secs), False))
            if pc.any(m).as_py():
                src, cid = b.column("src"), b.column("context_id")
                # grouped on the codes; a null code (no src_id) stays its own group
                t = pa.table({"second": sec, "s": src.indices, "sport": b.column("sport"),
                              "c": cid.indices, "us": us}).filter(m)
                g = _agg(t, ["second", "s", "sport", "c"], [("us", "count", "packets")])
                out["storm"] = pa.table({
                    "packets": g["packets"], "second": g["second"],
                    "src": _names(src.dictionary, g["s"]), "sport": g["sport"],
                    "context_id": _names(cid.dictionary, g["c"])})
        if out:
            self.parts.append(out)
            if len(self.parts) >= 16:
                self.parts = [merge(self.parts)]

    def _ttr(self, tir_tid: pa.Array, tir_us: pa.Array) -> None:
        """Fold one batch's TIRs into ``next_tir``: queries and TIRs sorted by (topic,
        time, queries first), each query takes the time of the next TIR row if that
        row is of its own topic."""
        n_t, n_q = len(tir_tid), len(self.q)
        t = pa.table({
            "tid": pa.concat_arrays([self.q_tid, tir_tid.cast(pa.int32())]),
            "us": pa.concat_arrays([self.q_us, tir_us]),
            "is_tir": pa.concat_arrays([pa.nulls(n_q, pa.int8()).fill_null(0), pa.nulls(n_t, pa.int8()).fill_null(1)]),
            "row": _iota(n_q + n_t)})
        t = t.take(pc.sort_indices(t, [("tid", "ascending"), ("us", "ascending"), ("is_tir", "ascending")]))
        t = t.combine_chunks()
        is_tir = pc.equal(t["is_tir"], 1)
        nxt_us = pc.fill_null_backward(pc.if_else(is_tir, t["us"], pa.scalar(None, _I64)))
        nxt_tid = pc.fill_null_backward(pc.if_else(is_tir, t["tid"], pa.scalar(None, pa.int32())))
        hit = pc.and_(pc.invert(is_tir), pc.fill_null(pc.equal(nxt_tid, t["tid"]), False))
        found = _scatter(pc.filter(t["row"], hit), pc.filter(nxt_us, hit), n_q)
        self.next_tir = pc.min_element_wise(self.next_tir, found, skip_nulls=True)

    def result(self) -> dict[str, pa.Table]:
        out = merge(self.parts) if self.parts else {}
        have = pc.is_valid(self.next_tir)
        out["ttr"] = pa.table({"next_tir": pc.filter(self.next_tir, have), "q": pc.filter(self.q, have)})
        return out


#: Dictionary-encoded when the second pass reads them.
SECOND_DICTIONARY = ["topic", "record_kind", "src", "context_id"]


_MERGE.update({
    "tr": (["src", "sport", "dst", "dport", "payload"], [("us", "min")]),
    "tr_dropped": (["split"], [("dropped", "sum")]),
    "ttr": (["q"], [("next_tir", "min")]),
    "stale": (["topic", "src", "sport", "context_id"], [("n", "sum"), ("first_us", "min"), ("last_us", "max")]),
    "storm": (["second", "src", "sport", "context_id"], [("packets", "sum")]),
})


def second_pass_files(paths: list[str], base_uri: str, inputs_ipc: bytes) -> bytes:
    """Executor side: :class:`SecondPass` over Parquet record files (paths within
    the file system of ``base_uri``), as IPC bytes."""
    import pyarrow.parquet as pq

    from . import fsio
    fs, _ = fsio.filesystem(base_uri)
    sp = SecondPass(from_ipc(inputs_ipc))
    for p in paths:
        with fs.open_input_file(p) as f:
            pf = pq.ParquetFile(f, read_dictionary=SECOND_DICTIONARY)
            for b in pf.iter_batches(batch_size=1 << 18, columns=SECOND_COLUMNS):
                sp.add(b)
    return to_ipc(sp.result())


def run_second(paths: list[str], base_uri: str, inputs) -> bytes:
    """The task function: ``inputs`` is a Spark broadcast of the IPC inputs."""
    return second_pass_files(paths, base_uri, inputs.value)
