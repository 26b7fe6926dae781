"""lbmr-analyze pipeline benchmark: Spark local[2] versus a single-process pyarrow baseline.

    python bench/pipeline.py [--sizes 1000000,4000000] [--split-size 128M]
                             [--max-minutes 40] [--tmp DIR] [--no-baseline]
                             [--small-capture PCAP | --small-capture '']

For each size it generates a capture of realistic topic-resolution traffic
(bench/traffic.py; 10M datagrams is about 1.8 GB) in a temporary folder, then
measures on this machine, in this run:

* a small capture (default the real UM capture, 179 LBMR datagrams) end to end:
  the ``lbmr-analyze`` command (a new process each time: Python, JVM and Spark
  start-up, the job, the report) against tshark + pandas on the same capture
  (tshark's LBMR fields into a DataFrame, then the same summary counts: datagrams,
  TIRs, TQRs, wildcard TQRs, topics, contexts), alternating, with the ratio and
  a check that the counts agree;
* the fixed cost: starting the SparkSession, and a whole job on a 1,000-datagram
  capture (scheduling, Python workers, Parquet, the analysis passes, report);
* the Spark job (``lbmr_analyze.job.run``: byte-range splits decoded on the
  executors (one RDD task each), Parquet partitioned by hour, partial aggregates
  computed by the decoding tasks and merged on the driver, one more pass for
  time to resolve, stale queries and storm seconds, report with plots):
  seconds, records/s and datagrams/s, and the analysis steps alone;
* the baseline: the same decoding code (lbmr_analyze.rows) in this one process,
  the same Parquet output (pyarrow.dataset, partitioned by hour) and the same
  analyses written with pyarrow compute + numpy: seconds and records/s;

then prints Spark's time over the baseline's (whole job, and analyses alone
against the baseline's read-back plus analyses), the CPU seconds each used
(every process of the Spark job: driver, JVM, Python workers; a figure the
other load on a shared machine does not change, unlike the times), the decoding
tasks' parallelism and CPU share, checks that both find the same
counts (topics, never-advertised topics, conflicts, stale queriers, contexts,
NAT, storms, ...), and the time ratio between consecutive sizes (linear scaling
would be the size ratio; the target is within 1.3x of it).  Captures and outputs are deleted afterwards.  The run is bounded:
sizes that would start after --max-minutes are skipped.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.traffic import write_capture  # noqa: E402
from lbmr_analyze.cli import parse_size  # noqa: E402

# --------------------------------------------------------------------------- baseline

def baseline(path: Path, out: Path, ports=frozenset({12965, 15380})) -> dict:
    """Decode, write Parquet and run the analyses in one process with pyarrow."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from lbmr_analyze.rows import write_split
    from lbmr_analyze.splits import plan

    # the executors' code, in this one process: decode the whole file as one range
    # and stream the Arrow batches into Parquet (hour-partitioned), then read back
    # only the columns the analyses use (holding every column of 10M datagrams in
    # memory does not fit in 24 GB next to anything else)
    t0 = time.perf_counter()
    (out / "records").mkdir(parents=True, exist_ok=True)
    for s in plan([str(path)], 1 << 62):
        write_split(s, ports, b"", str(out / "records"))
    t_decode = time.perf_counter() - t0
    cols = ["ts", "src", "sport", "dst", "length", "packet_type", "record_index", "record_kind", "kind_first",
            "topic", "pattern_type", "transport_id", "transport_ip", "offset", "context_id", "otid"]
    t = ds.dataset(out / "records", format="parquet", partitioning="hive").to_table(columns=cols)
    t_write = time.perf_counter() - t0 - t_decode
    us = pc.cast(t["ts"], pa.int64())
    sec = pc.divide(us, 1_000_000)
    t = t.append_column("us", us).append_column("second", sec)
    kind = t["record_kind"]
    res: dict = {}
    # topic inventory / unresolved / conflicts
    tt = t.filter(pc.is_in(kind, pa.array(["TIR", "TQR"])))
    is_tir = pc.equal(tt["record_kind"], "TIR")
    tt = tt.append_column("is_tir", pc.cast(is_tir, pa.int64())) \
           .append_column("is_tqr", pc.cast(pc.invert(is_tir), pa.int64())) \
           .append_column("adv_src", pc.if_else(is_tir, tt["src"], pa.scalar(None, pa.string()))) \
           .append_column("querier", pc.if_else(is_tir, pa.scalar(None, pa.string()),
                                                pc.binary_join_element_wise(tt["src"], pc.cast(tt["sport"], pa.string()), ":")))
    inv = tt.group_by("topic").aggregate([
        ("is_tir", "sum"), ("is_tqr", "sum"), ("transport_id", "count_distinct"), ("transport_id", "distinct"),
        ("adv_src", "distinct"), ("querier", "count_distinct"), ("us", "min"), ("us", "max")])
    res["topics"] = inv.num_rows
    res["unresolved"] = pc.sum(pc.equal(inv["is_tir_sum"], 0)).as_py()
    tirs = t.filter(pc.equal(kind, "TIR"))
    # contexts (src:sport + src_id): transport conflicts, OTID collisions, one context on two transports
    ctx = pc.binary_join_element_wise(tirs["src"], pc.cast(tirs["sport"], pa.string()),
                                      pc.fill_null(tirs["context_id"], ""), ":")
    tirs = tirs.append_column("ctx", ctx)
    xs = tirs.group_by(["transport_id", "ctx"]).aggregate([]).group_by("transport_id").aggregate([("ctx", "count")])
    res["transport_conflicts"] = pc.sum(pc.greater(xs["ctx_count"], 1)).as_py() or 0
    ot = tirs.filter(pc.is_valid(tirs["otid"])).group_by("otid").aggregate([("topic", "count_distinct"),
                                                                            ("ctx", "count_distinct")])
    res["otid_collisions"] = pc.sum(pc.or_(pc.greater(ot["topic_count_distinct"], 1),
                                           pc.greater(ot["ctx_count_distinct"], 1))).as_py() or 0
    mt = tirs.group_by(["ctx", "topic"]).aggregate([("transport_id", "count_distinct")])
    res["multi_transport_topics"] = pc.sum(pc.greater(mt["transport_id_count_distinct"], 1)).as_py() or 0
    # stale queries: TQRs after their topic's last TIR
    last = tirs.group_by("topic").aggregate([("us", "max")])
    tq_all = t.filter(pc.equal(kind, "TQR")).join(last, "topic", join_type="inner")
    tq_all = tq_all.filter(pc.greater(tq_all["us"], tq_all["us_max"]))
    res["stale_queriers"] = tq_all.group_by(["topic", "src", "sport", "context_id"]).aggregate([]).num_rows
    # time to resolve: sorted TIR keys, searchsorted per first query
    tq = t.filter(pc.equal(kind, "TQR")).group_by(["src", "sport", "context_id", "topic"]).aggregate([("us", "min")])
    topics = pc.unique(pa.chunked_array(tirs["topic"].chunks + tq["topic"].chunks, pa.string()))
    base = pc.min(us).as_py() or 0
    ti = pc.index_in(tirs["topic"], topics).to_numpy(zero_copy_only=False).astype(np.int64)
    tu = pc.subtract(tirs["us"], base).to_numpy(zero_copy_only=False).astype(np.int64)
    keys = np.sort((ti << 40) | tu)
    qi = pc.index_in(tq["topic"], topics).to_numpy(zero_copy_only=False).astype(np.int64)
    qu = pc.subtract(tq["us_min"], base).to_numpy(zero_copy_only=False).astype(np.int64)
    pos = np.searchsorted(keys, (qi << 40) | qu)
    ok = pos < len(keys)
    hit = np.zeros(len(qi), bool)
    hit[ok] = (keys[pos[ok]] >> 40) == qi[ok]
    ttr = ((keys[pos[hit]] & ((1 << 40) - 1)) - qu[hit]) / 1e6
    res["ttr_pairs"] = int(hit.sum())
    res["ttr_mean_s"] = float(ttr.mean()) if len(ttr) else None
    # load per second by kind and in total, storms, talkers
    first = pc.equal(t["record_index"], 0)
    t = t.append_column("kf", pc.cast(t["kind_first"], pa.int64())) \
         .append_column("kf_len", pc.if_else(t["kind_first"], t["length"], 0)) \
         .append_column("first", pc.cast(first, pa.int64())) \
         .append_column("first_len", pc.if_else(first, t["length"], 0))
    load = t.group_by(["second", "record_kind"]).aggregate([("kf", "sum"), ("offset", "count"), ("kf_len", "sum")])
    total = t.group_by("second").aggregate([("first", "sum"), ("offset", "count"), ("first_len", "sum")])
    res["load_rows"] = load.num_rows + total.num_rows
    res["storm_seconds"] = pc.sum(pc.greater(total["first_sum"], 1000)).as_py() or 0
    talk = t.group_by(["src", "sport", "context_id"]).aggregate([("first", "sum"), ("first_len", "sum"),
                                                                 ("offset", "count"), ("us", "min"), ("us", "max")])
    talk = talk.sort_by([("first_sum", "descending"), ("first_len_sum", "descending"), ("src", "ascending")])
    res["contexts"] = talk.num_rows
    storm_secs = total.filter(pc.greater(total["first_sum"], 1000))["second"]
    st = t.filter(pc.and_(first, pc.is_in(t["second"], storm_secs)))
    res["storm_context_rows"] = st.group_by(["second", "src", "sport", "context_id"]).aggregate([]).num_rows
    # wildcards
    wc = t.filter(pc.equal(kind, "WC_TQR")).group_by(["topic", "pattern_type"]).aggregate([("us", "min"), ("us", "max")])
    names = pc.unique(tt["topic"]).to_pylist()
    matches = 0
    for p in wc["topic"].to_pylist():
        try:
            rx = re.compile(p)
        except re.error:
            continue
        matches += sum(1 for n in names if rx.search(n))
    res["wildcard_matches"] = matches
    # keepalives, NAT audit, errors
    ka = t.filter(pc.equal(kind, "KEEPALIVE"))
    ka = ka.append_column("minute", pc.multiply(pc.divide(ka["second"], 60), 60))
    res["keepalive_clients"] = ka.group_by(["src", "sport"]).aggregate([("us", "count")]).num_rows
    census = ka.group_by(["minute", "src", "sport"]).aggregate([]).group_by("minute").aggregate([("src", "count")])
    res["census_minutes"] = census.num_rows
    hosts = pc.unique(pa.chunked_array(t.filter(pc.not_equal(t["sport"], 15380))["src"].chunks
                                       + t["dst"].chunks, pa.string())).to_pylist()
    import ipaddress
    private = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                                 "127.0.0.0/8", "169.254.0.0/16")]

    def block(a):
        return next((n for n in private if a in n), None)

    addrs = [ipaddress.ip_address(h) for h in hosts if h]
    addrs = [a for a in addrs if not a.is_multicast and not a.is_unspecified]
    nets = {int(a) >> 8 for a in addrs}
    blocks = {block(a) for a in addrs} - {None}
    bad = []
    for i in pc.unique(tirs["transport_ip"]).to_pylist():
        a = ipaddress.ip_address(i) if i else None
        if a is None or a.is_unspecified or a.is_multicast or int(a) >> 8 in nets or block(a) in blocks - {None}:
            continue
        bad.append(i)
    res["nat_mismatches"] = tirs.filter(pc.is_in(tirs["transport_ip"], pa.array(bad, pa.string()))) \
        .group_by(["transport_ip", "transport_id", "topic", "ctx"]).aggregate([]).num_rows
    res["capture_errors"] = pc.sum(pc.equal(kind, "CAPTURE_ERROR")).as_py() or 0
    res["rows"] = t.num_rows
    t_an = time.perf_counter() - t0 - t_decode - t_write
    res["times"] = {"decode+parquet": t_decode, "read back": t_write, "analyses": t_an}
    return res


# --------------------------------------------------------------------------- CPU accounting

def tree_cpu(root: int) -> float:
    """CPU seconds (user + system) used so far by process ``root`` and its live
    descendants (the JVM, the Python daemons and workers), counting the children
    they have reaped (Linux /proc).  Differences of it measure a job's CPU however
    busy the machine is."""
    ticks = os.sysconf("SC_CLK_TCK")
    kids: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        rest = st[st.rindex(")") + 2:].split()
        kids.setdefault(int(rest[1]), []).append(int(d))
        cpu[int(d)] = sum(int(x) for x in rest[11:15]) / ticks     # utime stime cutime cstime
    total, todo = 0.0, [root]
    while todo:
        p = todo.pop()
        total += cpu.get(p, 0.0)
        todo += kids.get(p, [])
    return total


# --------------------------------------------------------------------------- small capture

REAL_CAPTURE = Path(__file__).resolve().parents[2] / "shared" / "captures" / "um614-multicast-tr.pcap"
#: tshark field -> DataFrame column
TSHARK_FIELDS = {"frame.time_epoch": "ts", "ip.src": "src", "udp.srcport": "sport", "udp.length": "length",
                 "lbmr.hdr.type": "type", "lbmr.tir.name": "tir", "lbmr.tqr.name": "tqr",
                 "lbmr.tqr.pattern": "pattern", "lbmr.opt.src_id.src_id": "src_id"}
AGGREGATOR = "\x1f"        # between a field's occurrences in one datagram (topic names may hold spaces)


def tshark_pandas(path: str, ports=(12965, 15380)) -> dict:
    """The small-capture baseline: tshark's LBMR fields as a pandas DataFrame, and
    the summary's counts from it."""
    import pandas as pd
    cmd = ["tshark", "-r", path, *[a for p in ports for a in ("-d", f"udp.port=={p},lbmr")], "-Y", "lbmr",
           "-T", "fields", "-E", "separator=/t", "-E", "occurrence=a", "-E", f"aggregator={AGGREGATOR}",
           *[a for f in TSHARK_FIELDS for a in ("-e", f)]]
    out = subprocess.run(cmd, capture_output=True, check=True, timeout=600).stdout
    df = pd.read_csv(io.BytesIO(out), sep="\t", names=list(TSHARK_FIELDS.values()), dtype=str,
                     keep_default_na=False, quoting=3)

    def each(col):
        x = df[col].str.split(AGGREGATOR).explode()
        return x[x != ""]

    tirs, tqrs = each("tir"), each("tqr")
    return {"datagrams": len(df), "tirs": len(tirs), "tqrs": len(tqrs), "wc_tqrs": len(each("pattern")),
            "topics": len(set(tirs) | set(tqrs)), "contexts": df.groupby(["src", "sport", "src_id"]).ngroups}


def _children_cpu() -> float:
    """CPU seconds (user + system) of every descendant reaped so far."""
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _reap_orphans(seconds: float = 60) -> None:
    """Wait (bounded) for the descendants left behind by a finished command (the
    JVM outlives lbmr-analyze's Python by a moment); with this process their
    subreaper, their CPU time then counts in :func:`_children_cpu`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)


def _timed(cmd: list[str], env=None) -> tuple[float, float, str]:
    """Run ``cmd``: its wall seconds, the CPU seconds of it and every process it
    started (this process must be their subreaper, see :func:`small_capture`),
    and its standard output."""
    t, c = time.perf_counter(), _children_cpu()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    dt = time.perf_counter() - t
    _reap_orphans()
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited {p.returncode}: {p.stderr[-2000:]}")
    return dt, _children_cpu() - c, p.stdout


def _analyze_counts(stdout: str) -> dict:
    """The summary counts from lbmr-analyze's standard output."""
    def num(rx):
        return int(re.search(rx, stdout).group(1))
    return {"datagrams": num(r"([0-9]+) LBMR datagrams"), "tirs": num(r"TIRs ([0-9]+)"),
            "tqrs": num(r"TQRs ([0-9]+),"), "wc_tqrs": num(r"wildcard TQRs ([0-9]+)"),
            "topics": num(r"topics: ([0-9]+)"), "contexts": num(r"contexts ([0-9]+)")}


def small_capture(path: str, work: Path, rounds: int = 2) -> None:
    """lbmr-analyze end to end on a small capture against tshark + pandas,
    alternating: wall and CPU seconds (of every process each started: this process
    becomes the subreaper of orphans, so the JVM's CPU counts too; run it before
    this process starts Spark of its own)."""
    import ctypes
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)                # PR_SET_CHILD_SUBREAPER (Linux)
    lbmr = [str(Path(sys.executable).parent / "lbmr-analyze"), path, "--out", str(work / "small-out"), "-q"]
    base = [sys.executable, str(Path(__file__).resolve()), "--tshark-pandas", path]
    print(f"\nsmall capture {path} ({os.path.getsize(path):,} bytes), end to end, {rounds} rounds alternating; "
          f"load average {os.getloadavg()[0]:.1f}")
    t_first, c_first, out = _timed(lbmr)
    print(f"  lbmr-analyze first run {t_first:.1f} s, {c_first:.1f} CPU-s (writes the class cache when it is missing)")
    runs: dict[str, list[tuple[float, float]]] = {"lbmr-analyze": [], "tshark+pandas": []}
    for _ in range(rounds):
        dt, cpu, out = _timed(lbmr)
        runs["lbmr-analyze"].append((dt, cpu))
        start = re.search(r"of which starting Spark ([0-9.]+) s", out)
        dt, cpu, bout = _timed(base)
        runs["tshark+pandas"].append((dt, cpu))
    for name, xs in runs.items():
        print(f"  {name:14} " + ", ".join(f"{t:.1f} s ({c:.1f} CPU-s)" for t, c in xs))
    print(f"  starting Spark (the fixed cost) {start.group(1)} s in lbmr-analyze's last run")
    got, want = _analyze_counts(out), json.loads(bout)
    best_t = [min(t for t, _ in xs) for xs in runs.values()]
    best_c = [min(c for _, c in xs) for xs in runs.values()]
    print(f"  lbmr-analyze / tshark+pandas, best of each: time {best_t[0] / best_t[1]:.1f}, CPU seconds "
          f"{best_c[0] / best_c[1]:.1f}; counts agree: {got == want}; load average {os.getloadavg()[0]:.1f}")
    if got != want:
        print(f"  lbmr-analyze: {got}\n  tshark+pandas: {want}")
    shutil.rmtree(work / "small-out", ignore_errors=True)


# --------------------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000000,4000000", help="datagram counts, comma-separated")
    ap.add_argument("--split-size", default="128M",
                    help="byte range per Spark task (default 128M, lbmr-analyze's own default)")
    ap.add_argument("--max-minutes", type=float, default=40.0, help="skip sizes starting after this")
    ap.add_argument("--tmp", default=None, help="folder for the captures (default: system temp)")
    ap.add_argument("--driver-memory", default="6g", help="spark.driver.memory (local mode: the executor too)")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--baseline-only", action="store_true",
                    help="skip Spark for the sizes (e.g. to redo a baseline without repeating a long Spark run)")
    ap.add_argument("--small-capture", default=str(REAL_CAPTURE) if REAL_CAPTURE.exists() else "",
                    help="capture for the end-to-end comparison with tshark + pandas ('' to skip; "
                         "default the real UM capture)")
    ap.add_argument("--tshark-pandas", metavar="PCAP", help=argparse.SUPPRESS)   # the baseline's own process
    args = ap.parse_args()
    if args.tshark_pandas:
        print(json.dumps(tshark_pandas(args.tshark_pandas)))
        return
    sys.stdout.reconfigure(line_buffering=True)
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    split_size = parse_size(args.split_size)
    deadline = time.monotonic() + args.max_minutes * 60

    from lbmr_analyze.job import build_session, run

    work = Path(tempfile.mkdtemp(prefix="lbmr-pipeline-", dir=args.tmp))
    print(f"bench/pipeline.py: local[2], split size {split_size} bytes, {os.cpu_count()} cores, temp {work}")
    try:
        if args.small_capture:
            small_capture(args.small_capture, work)
        t = time.perf_counter()
        spark = build_session("local[2]", [("spark.ui.enabled", "false"), ("spark.driver.memory", args.driver_memory),
                                           ("spark.sql.shuffle.partitions", "8")], progress_bar=False)
        t_start = time.perf_counter() - t
        tiny = write_capture(work / "tiny.pcap", 1000)
        t = time.perf_counter()
        run(spark, [tiny], work / "tiny-out")
        t_tiny = time.perf_counter() - t
        t = time.perf_counter()
        run(spark, [tiny], work / "tiny-out")
        t_tiny2 = time.perf_counter() - t
        print(f"fixed cost in this process (local[2], no class archive): SparkSession start {t_start:.1f} s; "
              f"whole job on 1,000 datagrams "
              f"{t_tiny:.1f} s (first, cold JIT/workers), {t_tiny2:.1f} s (second)")
        results = []
        for n in sizes:
            if time.monotonic() > deadline:
                print(f"{n}: skipped (past --max-minutes)")
                continue
            cap = work / f"cap-{n}.pcap"
            t = time.perf_counter()
            write_capture(cap, n)
            t_gen = time.perf_counter() - t
            size = cap.stat().st_size
            print(f"\n{n:,} datagrams: capture {size / 1e9:.2f} GB generated in {t_gen:.0f} s")
            if args.baseline_only:
                t = time.perf_counter()
                b = baseline(cap, work / f"base-{n}")
                t_base = time.perf_counter() - t
                print(f"  baseline {t_base:7.1f} s  {b['rows'] / t_base:>10,.0f} records/s  "
                      "(" + ", ".join(f"{k} {v:.1f}s" for k, v in b["times"].items()) + ")")
                print("  results: " + ", ".join(f"{k}={v}" for k, v in b.items() if k != "times"), flush=True)
                shutil.rmtree(work / f"base-{n}", ignore_errors=True)
                cap.unlink()
                continue
            t, c = time.perf_counter(), tree_cpu(os.getpid())
            res = run(spark, [cap], work / f"out-{n}", split_size=split_size)
            t_spark = time.perf_counter() - t
            cpu_spark = tree_cpu(os.getpid()) - c
            rows = res.rows
            print(f"  spark    {t_spark:7.1f} s  {rows / t_spark:>10,.0f} records/s  {n / t_spark:>10,.0f} datagrams/s"
                  f"  ({rows:,} records, {len(res.splits)} byte ranges)")
            print("           steps: " + ", ".join(f"{k} {v:.1f}s" for k, v in res.timings.items()))
            ds = res.decode_stats
            if ds:
                print(f"           decoding tasks: {ds['tasks']} in {ds['workers']} Python worker(s), "
                      f"{ds['elapsed_s']:.1f} s elapsed; sum of task times {ds['wall_s']:.1f} s wall, "
                      f"{ds['cpu_s']:.1f} s CPU (parallelism {ds['wall_s'] / max(ds['elapsed_s'], 1e-9):.2f}, "
                      f"CPU share {ds['cpu_s'] / max(ds['wall_s'], 1e-9):.2f}); load average "
                      f"{os.getloadavg()[0]:.1f}")
            entry = {"n": n, "rows": rows, "spark": t_spark}
            if not args.no_baseline and time.monotonic() < deadline:
                t, c = time.perf_counter(), time.process_time()
                b = baseline(cap, work / f"base-{n}")
                t_base = time.perf_counter() - t
                cpu_base = time.process_time() - c
                entry["baseline"] = t_base
                print(f"  baseline {t_base:7.1f} s  {b['rows'] / t_base:>10,.0f} records/s  "
                      "(" + ", ".join(f"{k} {v:.1f}s" for k, v in b["times"].items()) + ")")
                s = res.summary
                same = (b["rows"] == rows and b["topics"] == s["topics"] and b["unresolved"] == s["unresolved_topics"]
                        and b["transport_conflicts"] == s["transport_conflicts"]
                        and b["otid_collisions"] == s["otid_collisions"]
                        and b["multi_transport_topics"] == s["multi_transport_topics"]
                        and b["stale_queriers"] == s["stale_queriers"] and b["contexts"] == s["contexts"]
                        and b["nat_mismatches"] == s["nat_mismatches"]
                        and b["storm_context_rows"] == len(res.tables["storm_contexts"])
                        and b["ttr_pairs"] == len(res.tables["time_to_resolve"])
                        and b["wildcard_matches"] == len(res.tables["wildcard_matches"])
                        and b["storm_seconds"] == s["storm_seconds"]
                        and b["keepalive_clients"] == s["keepalive_clients"])
                an_spark = sum(v for k, v in res.timings.items() if k.startswith("analysing"))
                an_base = b["times"]["read back"] + b["times"]["analyses"]
                entry["ratio"] = t_spark / t_base
                print(f"  spark / baseline time: {t_spark / t_base:.2f} (below 1: Spark faster); "
                      f"analyses only: {an_spark:.1f} s / {an_base:.1f} s = {an_spark / an_base:.2f}; "
                      f"results agree: {same}")
                print(f"  CPU seconds (every process, however busy the machine): spark {cpu_spark:.1f}, "
                      f"baseline {cpu_base:.1f} ({cpu_spark / cpu_base:.2f}); on 2 free cores the Spark job "
                      f"needs at least {cpu_spark / 2:.1f} s = {cpu_spark / 2 / cpu_base:.2f} of the baseline's "
                      f"CPU time; load average {os.getloadavg()[0]:.1f}")
                if not same:
                    print("  baseline: " + ", ".join(f"{k}={v}" for k, v in b.items() if k != "times"))
                    print("  spark:    " + ", ".join(f"{k}={s[k]}" for k in (
                        "topics", "unresolved_topics", "transport_conflicts", "otid_collisions",
                        "multi_transport_topics", "stale_queriers", "contexts", "nat_mismatches",
                        "storm_seconds", "keepalive_clients")))
                del b
            results.append(entry)
            shutil.rmtree(work / f"out-{n}", ignore_errors=True)
            shutil.rmtree(work / f"base-{n}", ignore_errors=True)
            cap.unlink()
        for a, b in zip(results, results[1:], strict=False):
            ratio = b["spark"] / a["spark"]
            k = b["n"] / a["n"]
            print(f"\nscaling {a['n']:,} -> {b['n']:,} datagrams ({k:g}x): Spark time x{ratio:.2f} "
                  f"(linear: x{k:g}; target at most x{1.3 * k:g}: {'met' if ratio <= 1.3 * k else 'NOT met'})")
            fixed = t_tiny2
            print(f"  without the fixed per-job cost ({fixed:.1f} s): x{(b['spark'] - fixed) / (a['spark'] - fixed):.2f}")
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
