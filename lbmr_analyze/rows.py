"""Executor side: decode a split's datagrams into flat Arrow record batches and
write them as Parquet (:func:`write_split_task` is the decoding task).

One row per *record*: a TQR, a wildcard TQR, a TIR, a keepalive, a TMR, a QQR or
QIR, an extended record, an undecodable datagram (``DECODE_ERROR``) or a capture
file error (``CAPTURE_ERROR``).  Every datagram yields at least one row; the
first row of a datagram has ``record_index`` 0, so packet and byte counts are
sums over those rows.  See lbmr-analyze(1) for the column list.

Batches are built column-wise, never one Python object per row: topic resolution
repeats the same datagrams over and over, so a datagram's record tuples are
computed once per distinct payload and each batch stores, per row, only the
index of its datagram and of its record; the columns are then assembled with
Arrow ``take``.  The payload cache (:class:`PayloadCache`) lives as long as the
Python worker, which Spark reuses for the next split, so the same contexts'
datagrams are decoded once per worker, not once per split; it is bounded by
entries and by payload bytes (hostile captures of big distinct payloads only
make it clear itself).
"""

from __future__ import annotations

import gc
import json
import os
from array import array
from collections.abc import Iterable, Iterator
from itertools import repeat

import pyarrow as pa
import pyarrow.compute as pc

from lbmr_proto import LBMRDecodeError, decode
from lbmr_proto.capture import CaptureError
from lbmr_proto.jsonview import plain
from lbmr_proto.popts import LocalDomainOption, SourceIdOption, SourceTypeOption
from lbmr_proto.topts import DomainIdOption, OtidOption

from .splits import Split, segments

#: Datagrams per Arrow record batch.
BATCH_DATAGRAMS = 1 << 16
#: Payload cache bounds: distinct payloads, and their bytes.
CACHE_MAX_ENTRIES = 1 << 15
CACHE_MAX_BYTES = 32 << 20

# per-datagram columns
_DG_FIELDS = [
    pa.field("file", pa.string()),
    pa.field("offset", pa.int64()),
    pa.field("ts", pa.timestamp("us", tz="UTC")),
    pa.field("src", pa.string()),
    pa.field("sport", pa.int32()),
    pa.field("dst", pa.string()),
    pa.field("dport", pa.int32()),
    pa.field("length", pa.int32()),
]
# per-record columns, in the order of the record tuples built below
_REC_FIELDS = [
    pa.field("packet_type", pa.string()),
    pa.field("version", pa.int32()),
    pa.field("record_index", pa.int32()),
    pa.field("record_kind", pa.string()),
    pa.field("kind_first", pa.bool_()),
    pa.field("topic", pa.string()),
    pa.field("pattern_type", pa.int32()),
    pa.field("transport", pa.string()),
    pa.field("transport_id", pa.string()),
    pa.field("transport_ip", pa.string()),
    pa.field("transport_port", pa.int32()),
    pa.field("session_id", pa.int64()),
    pa.field("mcast_group", pa.string()),
    pa.field("dest_port", pa.int32()),
    pa.field("host_id", pa.int64()),
    pa.field("xport_id", pa.int32()),
    pa.field("ttl", pa.int32()),
    pa.field("topic_index", pa.int64()),
    pa.field("domain_id", pa.int64()),
    pa.field("local_domain_id", pa.int64()),
    pa.field("options", pa.string()),
    pa.field("context_id", pa.string()),
    pa.field("source_type", pa.int32()),
    pa.field("otid", pa.string()),
    pa.field("error", pa.string()),
]
#: Version of the record schema, stored in every Parquet file's key/value metadata
#: under ``lbmr_analyze.schema_version`` (2: ``otid`` column added).
SCHEMA_VERSION = 2
SCHEMA_METADATA = {b"lbmr_analyze.schema_version": str(SCHEMA_VERSION).encode(),
                   b"lbmr_analyze.writer": b"lbmr-analyze"}
SCHEMA = pa.schema(_DG_FIELDS + _REC_FIELDS, metadata=SCHEMA_METADATA)
_NREC = len(_REC_FIELDS)

_SPARK_TYPES = {pa.string(): "string", pa.int64(): "bigint", pa.int32(): "int", pa.bool_(): "boolean",
                pa.timestamp("us", tz="UTC"): "timestamp"}
#: The same schema as a Spark DDL string.
SPARK_DDL = ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in SCHEMA)


def _text(s: str) -> str:
    """Names decoded with surrogateescape -> valid UTF-8 text (bad bytes as ``\\xNN``)."""
    if s.isascii():
        return s
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


_JSON_CACHE: dict = {}


def _json(opts) -> str | None:
    if opts is None:
        return None
    try:
        key = tuple(opts)
        hit = _JSON_CACHE.get(key)
    except TypeError:             # an unhashable option value
        key, hit = None, None
    if hit is None:
        hit = json.dumps(plain(list(opts)), separators=(",", ":"), default=str)
        if key is not None:
            if len(_JSON_CACHE) >= 4096:
                _JSON_CACHE.clear()
            _JSON_CACHE[key] = hit
    return hit


def transport_identity(t) -> tuple:
    """(name, identity text, ip, port, session id, group, dest port, host id, xport id)
    of a TIR transport body.

    The identity text names the transport a receiver would join:
    ``TCP:ip:port[:session]``, ``LBTRU:ip:port[:session]``,
    ``LBTRM:ip:src_ucast_port:group:dest_port:session``,
    ``LBTRDMA:ip:port:session``, ``LBTIPC|LBTSMX:host_id:xport_id:session``
    (numbers in decimal) and ``UNKNOWN:type:hex``."""
    name = t.NAME
    if name == "LBTRM":
        return (name, f"LBTRM:{t.ip}:{t.src_ucast_port}:{t.mcast_group}:{t.dest_port}:{t.session_id}",
                t.ip, t.src_ucast_port, t.session_id, t.mcast_group, t.dest_port, None, None)
    if name in ("LBTIPC", "LBTSMX"):
        return (name, f"{name}:{t.host_id}:{t.xport_id}:{t.session_id}",
                None, None, t.session_id, None, None, t.host_id, t.xport_id)
    if name == "UNKNOWN":
        return (name, f"UNKNOWN:{t.type_code}:{t.data.hex()}",
                None, None, None, None, None, None, None)
    sess = getattr(t, "session_id", None)
    ident = f"{name}:{t.ip}:{t.port}" + ("" if sess is None else f":{sess}")
    return (name, ident, t.ip, t.port, sess, None, None, None, None)


_NO_TRANSPORT = (None,) * 9


def _rec(ptype, version, idx, kind, first, topic=None, pattern_type=None, tp=_NO_TRANSPORT,
         ttl=None, index=None, domain=None, local_domain=None, options=None, popts=(None, None),
         error=None, otid=None) -> tuple:
    return (ptype, version, idx, kind, first, topic, pattern_type, *tp, ttl, index, domain,
            local_domain, options, *popts, otid, error)


def records_of(payload: bytes) -> tuple[tuple, ...]:
    """The record tuples (columns of ``_REC_FIELDS``) of one UDP payload."""
    try:
        pkt = decode(payload)
    except LBMRDecodeError as e:
        return (_rec(None, None, 0, "DECODE_ERROR", True,
                     error=f"LBMR decode error at datagram byte {e.offset}: {e.reason}"),)
    pt, ver = pkt.type_name, pkt.version
    local = ctx = stype = None
    if pkt.options:
        for o in pkt.options:
            t = type(o)
            if t is LocalDomainOption:
                local = o.local_domain_id
            elif t is SourceIdOption:
                ctx = o.src_id.hex()
            elif t is SourceTypeOption:
                stype = o.src_type
    pj = (ctx, stype)
    out: list[tuple] = []
    for q in pkt.tqrs:
        out.append(_rec(pt, ver, len(out), "TQR", not out, _text(q.topic),
                        local_domain=local, popts=pj))
    n0 = len(out)
    for w in pkt.wc_tqrs:
        out.append(_rec(pt, ver, len(out), "WC_TQR", len(out) == n0, _text(w.pattern), w.pattern_type,
                        local_domain=local, popts=pj))
    n0 = len(out)
    for t in pkt.tirs:
        dom = otid = None
        if t.options:
            for o in t.options:
                to = type(o)
                if to is DomainIdOption:
                    dom = o.domain_id
                elif to is OtidOption:
                    otid = o.otid.hex()
        out.append(_rec(pt, ver, len(out), "TIR", len(out) == n0, _text(t.topic), None,
                        transport_identity(t.transport), t.ttl, t.index, dom, local,
                        _json(t.options), pj, otid=otid))
    if pkt.tmb is not None:
        n0 = len(out)
        for m in pkt.tmb.tmrs:
            out.append(_rec(pt, ver, len(out), "TMR", len(out) == n0, _text(m.name),
                            local_domain=local, popts=pj))
    n0 = len(out)
    for q in pkt.qqrs:
        out.append(_rec(pt, ver, len(out), "QQR", len(out) == n0, _text(q.queue),
                        local_domain=local, popts=pj))
    n0 = len(out)
    for q in pkt.qirs:
        out.append(_rec(pt, ver, len(out), "QIR", len(out) == n0, _text(q.topic),
                        local_domain=local, options=_json([q]), popts=pj))
    if pkt.ext is not None:
        out.append(_rec(pt, ver, len(out), "EXT", True, local_domain=local,
                        options=_json([pkt.ext]), popts=pj))
    if not out:
        out.append(_rec(pt, ver, 0, "KEEPALIVE" if pkt.is_keepalive else "EMPTY", True,
                        local_domain=local, popts=pj))
    return tuple(out)


class PayloadCache(dict):
    """payload bytes -> record tuples (:func:`records_of`), cleared whole when it
    would exceed :data:`CACHE_MAX_ENTRIES` entries or :data:`CACHE_MAX_BYTES`
    payload bytes (the record tuples are a small multiple of the payload)."""

    def __init__(self) -> None:
        super().__init__()
        self.nbytes = 0

    def records(self, payload: bytes) -> tuple:
        rs = self.get(payload)
        if rs is None:
            if len(self) >= CACHE_MAX_ENTRIES or self.nbytes + len(payload) > CACHE_MAX_BYTES:
                self.clear()
                self.nbytes = 0
            rs = self[payload] = records_of(payload)
            self.nbytes += len(payload)
        return rs


#: The worker-wide cache (see the module documentation).
PAYLOADS = PayloadCache()


def _i32(a: array) -> pa.Array:
    return pa.Array.from_buffers(pa.int32(), len(a), [None, pa.py_buffer(a)])


class _Batch:
    """Column builder for one record batch: per datagram its offset, time, flow and
    length; per distinct payload its record tuples; per row two indices."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.dg_off: list[int] = []
        self.dg_ts: list[float | None] = []
        self.dg_flow = array("i")
        self.dg_len: list[int | None] = []
        self.flows: dict[tuple, int] = {}
        self.recs: list[tuple] = []
        self.payload_ids: dict[bytes, tuple[int, ...]] = {}
        self.row_dg = array("i")
        self.row_rec = array("i")

    def parts(self) -> tuple:
        return (self.payload_ids, self.recs, self.flows, self.dg_off, self.dg_ts, self.dg_flow,
                self.dg_len, self.row_dg, self.row_rec)

    def add_error(self, err: CaptureError) -> None:
        k = len(self.dg_off)
        self.dg_off.append(err.offset)
        self.dg_ts.append(None)
        key = (None, None, None, None)
        f = self.flows.get(key)
        if f is None:
            f = self.flows[key] = len(self.flows)
        self.dg_flow.append(f)
        self.dg_len.append(None)
        self.recs.append(_rec(None, None, 0, "CAPTURE_ERROR", True, error=err.reason))
        self.row_dg.append(k)
        self.row_rec.append(len(self.recs) - 1)

    def build(self) -> pa.RecordBatch:
        idx_dg = _i32(self.row_dg)
        idx_rec = _i32(self.row_rec)
        n = len(self.row_dg)
        ts = pa.array(self.dg_ts, pa.float64())
        ts_us = pc.round(pc.multiply(ts, 1e6)).cast(pa.int64())
        flows = list(zip(*self.flows.keys(), strict=True))
        flow_rows = _i32(self.dg_flow).take(idx_dg)
        cols = [
            pa.array([self.path], pa.string()).take(pa.nulls(n, pa.int32()).fill_null(0)),
            pa.array(self.dg_off, pa.int64()).take(idx_dg),
            ts_us.cast(pa.timestamp("us", tz="UTC")).take(idx_dg),
            pa.array(flows[0], pa.string()).take(flow_rows),
            pa.array(flows[1], pa.int32()).take(flow_rows),
            pa.array(flows[2], pa.string()).take(flow_rows),
            pa.array(flows[3], pa.int32()).take(flow_rows),
            pa.array(self.dg_len, pa.int32()).take(idx_dg),
        ]
        rec_cols = list(zip(*self.recs, strict=True))
        for fld, col in zip(_REC_FIELDS, rec_cols, strict=True):
            cols.append(pa.array(col, fld.type).take(idx_rec))
        return pa.RecordBatch.from_arrays(cols, schema=SCHEMA)


#: Topic-resolution datagrams kept per split for the transport pass (distinct
#: sender and payload), and their payload bytes.
TR_MAX_DATAGRAMS = 1 << 14
TR_MAX_BYTES = 32 << 20


class TopicResolution:
    """The distinct LBMR datagrams of a split that hold a TIR or a TQR (by sender,
    receiver and payload, with the first time each was seen), bounded by
    :data:`TR_MAX_DATAGRAMS` and :data:`TR_MAX_BYTES` (``dropped`` counts the
    rest): what every transport task learns before it decodes its range (see
    :mod:`lbmr_analyze.transport`)."""

    def __init__(self) -> None:
        self.first: dict[tuple, float] = {}
        self.nbytes = 0
        self.dropped = 0

    def add(self, ts: float, src: str, sport: int, dst: str, dport: int, payload: bytes) -> None:
        key = (src, sport, dst, dport, payload)
        t = self.first.get(key)
        if t is not None:
            if ts < t:
                self.first[key] = ts
            return
        if len(self.first) >= TR_MAX_DATAGRAMS or self.nbytes + len(payload) > TR_MAX_BYTES:
            self.dropped += 1
            return
        self.first[key] = ts
        self.nbytes += len(payload)

    def table(self) -> pa.Table:
        """The datagrams as the ``tr`` partial table (:mod:`lbmr_analyze.partials`)."""
        keys = list(self.first)
        cols = list(zip(*keys, strict=True)) if keys else [[]] * 5
        return pa.table({
            "us": pa.array([round(self.first[k] * 1e6) for k in keys], pa.int64()),
            "src": pa.array(cols[0], pa.string()), "sport": pa.array(cols[1], pa.int32()),
            "dst": pa.array(cols[2], pa.string()), "dport": pa.array(cols[3], pa.int32()),
            "payload": pa.array(cols[4], pa.binary())})


_TR_KINDS = frozenset(("TIR", "TQR"))


def decode_split(split: Split, ports: Iterable[int] | None, context: bytes = b"",
                 batch_datagrams: int = BATCH_DATAGRAMS, tr: TopicResolution | None = None
                 ) -> Iterator[pa.RecordBatch]:
    """Arrow record batches (:data:`SCHEMA`) for every datagram and capture error in
    ``split``; with ``tr``, the datagrams holding TIRs or TQRs are added to it."""
    gc_was_on = gc.isenabled()
    gc.disable()          # millions of acyclic tuples: the cyclic collector only costs time here
    try:
        yield from _decode_split(split, ports, context, batch_datagrams, tr)
    finally:
        if gc_was_on:
            gc.enable()


def _decode_split(split: Split, ports, context: bytes, batch_datagrams: int,
                  tr: TopicResolution | None = None) -> Iterator[pa.RecordBatch]:
    cached = PAYLOADS.get
    decode_new = PAYLOADS.records
    batch = _Batch(split.path)
    payload_ids, recs, flows, dg_off, dg_ts, dg_flow, dg_len, row_dg, row_rec = batch.parts()
    tr_payloads: set[bytes] = set()   # payloads holding a TIR or TQR (per worker-cache entry)
    for part in segments(split, ports, context):
        if type(part) is CaptureError:
            batch.add_error(part)
            continue
        shift, datagrams = part
        for ts, src, sport, dst, dport, payload, _, off in datagrams:
            ids = payload_ids.get(payload)
            if ids is None:
                rs = cached(payload)
                if rs is None:
                    rs = decode_new(payload)
                base = len(recs)
                recs.extend(rs)
                ids = payload_ids[payload] = tuple(range(base, base + len(rs)))
                if tr is not None and any(r[3] in _TR_KINDS for r in rs):
                    tr_payloads.add(payload)
            if tr is not None and payload in tr_payloads:
                tr.add(ts, src, sport, dst, dport, payload)
            k = len(dg_off)
            dg_off.append(off + shift)
            dg_ts.append(ts)
            key = (src, sport, dst, dport)
            f = flows.get(key)
            if f is None:
                f = flows[key] = len(flows)
            dg_flow.append(f)
            dg_len.append(len(payload))
            if len(ids) == 1:
                row_dg.append(k)
                row_rec.append(ids[0])
            else:
                row_dg.extend(repeat(k, len(ids)))
                row_rec.extend(ids)
            if k >= batch_datagrams - 1:
                yield batch.build()
                batch = _Batch(split.path)
                payload_ids, recs, flows, dg_off, dg_ts, dg_flow, dg_len, row_dg, row_rec = batch.parts()
    if dg_off:
        yield batch.build()


HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def hour_numbers(ts: pa.Array) -> pa.Array:
    """Hours since the epoch (UTC, floor) of a ``timestamp[us]`` column; null stays null.
    (Integer arithmetic: ``strftime`` on every row cost a tenth of the decoding.)"""
    us = pc.cast(ts, pa.int64())
    h = pc.divide(us, 3_600_000_000)
    # integer division truncates toward zero: step back one hour for times before 1970
    neg = pc.and_(pc.less(us, 0), pc.not_equal(pc.multiply(h, 3_600_000_000), us))
    return pc.if_else(pc.fill_null(neg, False), pc.subtract(h, 1), h)


def hour_name(h: int | None) -> str:
    """The ``hour=`` partition value of an hour number: ``YYYY-MM-DDTHH`` (UTC)."""
    if h is None:
        return HIVE_NULL
    from datetime import UTC, datetime, timedelta
    try:
        return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(hours=h)).strftime("%Y-%m-%dT%H")
    except (OverflowError, ValueError):             # beyond year 9999: a corrupt timestamp
        return f"epoch+{h}h"


def write_split(split: Split, ports, context: bytes, out_dir: str,
                batch_datagrams: int = BATCH_DATAGRAMS, partials: list | None = None) -> tuple[int, int, int]:
    """Decode ``split`` and write its records as Parquet under ``out_dir``, one file
    per hour: ``out_dir/hour=YYYY-MM-DDTHH/part-<split_id>.parquet`` (records without
    a time, i.e. capture errors, under ``hour=__HIVE_DEFAULT_PARTITION__``), the
    layout Spark's ``partitionBy("hour")`` writes and reads.  File names depend only
    on the split, so a re-run or a retried task replaces, never duplicates; each
    file is written under a hidden temporary name and renamed when complete.
    With ``partials`` (a list), the batches' partial aggregates
    (:mod:`lbmr_analyze.partials`) are appended to it, and the split's
    topic-resolution datagrams (:class:`TopicResolution`) as the ``tr`` table.
    Returns (records, capture errors, files)."""
    import pyarrow.parquet as pq

    from . import fsio

    fs, base = fsio.filesystem(out_dir)
    writers: dict[str, tuple] = {}
    rows = errors = 0
    name = f"part-{split.split_id:06d}.parquet"
    tr = None
    if partials is not None:
        from . import partials as P
        tr = TopicResolution()
    try:
        for b in decode_split(split, ports, context, batch_datagrams, tr):
            rows += b.num_rows
            if partials is not None:
                partials.append(P.of_batch(b))
                if len(partials) >= 16:
                    partials[:] = [P.merge(partials)]
            hours = hour_numbers(b.column("ts"))
            errors += pc.sum(pc.equal(b.column("record_kind"), "CAPTURE_ERROR")).as_py() or 0
            uniq = pc.unique(hours).to_pylist()
            for hn in uniq:
                part = b if len(uniq) == 1 else b.filter(
                    pc.is_null(hours) if hn is None else pc.fill_null(pc.equal(hours, hn), False))
                h = hour_name(hn)
                w = writers.get(h)
                if w is None:
                    d = fsio.join(base, f"hour={h}")
                    fs.create_dir(d, recursive=True)
                    tmp = fsio.join(d, f".{name}.{os.getpid()}.tmp")
                    w = writers[h] = (pq.ParquetWriter(tmp, SCHEMA, compression="snappy", filesystem=fs),
                                      tmp, fsio.join(d, name))
                w[0].write_batch(part)
    except BaseException:
        for w, tmp, _ in writers.values():
            w.close()
            fs.delete_file(tmp)
        raise
    for w, tmp, final in writers.values():
        w.close()
        fs.move(tmp, final)
    if tr is not None and (tr.first or tr.dropped):
        partials.append({"tr": tr.table(), "tr_dropped": pa.table({"dropped": pa.array([tr.dropped], pa.int64()),
                                                                  "split": pa.array([split.split_id], pa.int64())})})
    return rows, errors, len(writers)


def write_split_task(row: tuple, ports: frozenset[int], out_dir: str,
                     batch_datagrams: int = BATCH_DATAGRAMS) -> dict:
    """The decoding task (a plain Spark RDD ``map``; nothing but this small status
    goes back to the driver): ``row`` is (split_id, path, start, end, size, pcapng
    context) of one split, decoded and written as Parquet on the executor
    (:func:`write_split`).  Returns the split's record and capture-error counts,
    Parquet files, its partial aggregates as Arrow IPC
    (:func:`lbmr_analyze.partials.to_ipc`), and the task's wall and CPU seconds
    and worker pid."""
    import time

    from . import partials as P
    t0, c0 = time.perf_counter(), time.process_time()
    split = Split(*row[:5])
    parts: list = []
    n, errs, files = write_split(split, ports, bytes(row[5] or b""), out_dir, batch_datagrams, parts)
    blob = P.to_ipc(P.merge(parts)) if parts else b""
    return {"split_id": split.split_id, "records": n, "capture_errors": errs, "files": files, "partials": blob,
            "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "pid": os.getpid()}
