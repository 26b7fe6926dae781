"""The lbmr-analyze job: captures -> Parquet records -> Spark SQL analyses -> report.

:func:`build_session` makes the SparkSession (``local[*]`` unless a master is
given or the process runs under spark-submit); :func:`run` does the work on any
session, so tests and notebooks can pass their own.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from lbmr_proto.constants import LBMR_MC_PORT, LBMRD_PORT

from . import fsio
from .splits import DEFAULT_SPLIT_SIZE, Split, context_blocks, context_for, discover, plan
from .transport import TABLES as TRANSPORT_TABLES

DEFAULT_PORTS = frozenset({LBMR_MC_PORT, LBMRD_PORT})
DEFAULT_STORM_THRESHOLD = 1000
DEFAULT_TOP = 20
RECORDS_DIR = "records"

#: Every table of the report, in report order.
TABLES = (
    "findings", "summary", "files", "unresolved_topics", "stale_queries", "transport_conflicts",
    "otid_collisions", "multi_transport_topics", "storms", "storm_contexts", "nat_audit",
    "client_changes", "time_to_resolve", "topic_inventory", "top_topics", "top_talkers", "contexts",
    "keepalive_senders", "keepalive_census", "load_per_second", "wildcard_patterns",
    "wildcard_matches", "capture_errors", "decode_errors",
)


class Progress:
    """Per-step progress on stderr: ``lbmr-analyze [3/9] analysing: topics ... 1.2 s``.

    Steps are announced before they start and timed when they end; nothing runs
    in the background.  While a step runs Spark's own stage progress bar shows on a
    terminal (``spark.ui.showConsoleProgress``)."""

    def __init__(self, total: int, stream=None, enabled: bool = True) -> None:
        self.total, self.stream, self.enabled = total, stream, enabled
        self.n = 0
        self.timings: dict[str, float] = {}
        self._t = 0.0
        self._name = ""

    def _out(self):
        return self.stream if self.stream is not None else sys.stderr

    def step(self, name: str) -> None:
        self.done()
        self.n += 1
        self._name, self._t = name, time.perf_counter()
        if self.enabled:
            bar = "#" * self.n + "." * max(self.total - self.n, 0)
            print(f"lbmr-analyze [{bar}] {self.n}/{self.total} {name} ...", file=self._out(), flush=True)

    def done(self) -> None:
        if self._name:
            dt = time.perf_counter() - self._t
            self.timings[self._name] = dt
            if self.enabled:
                print(f"lbmr-analyze     {self._name}: {dt:.1f} s", file=self._out(), flush=True)
            self._name = ""


@dataclass
class Result:
    """What :func:`run` did."""

    out: Path | str
    files: list[str]
    splits: list[Split]
    decode_partitions: int
    rows: int
    summary: dict
    tables: dict[str, list[dict]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    #: the decoding tasks' figures (see :func:`decode_to_parquet`)
    decode_stats: dict = field(default_factory=dict)

    @property
    def report(self) -> Path | str:
        return self.out / "report.html" if isinstance(self.out, Path) else fsio.join(self.out, "report.html")


# --------------------------------------------------------------------------- session

_SHIPPED: set[int] = set()


def _package_zip() -> bytes:
    """lbmr_proto and lbmr_analyze as a zip, for executors (sc.addPyFile)."""
    buf = io.BytesIO()
    root = Path(__file__).resolve().parents[1]
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for pkg in ("lbmr_proto", "lbmr_analyze"):
            for p in sorted((root / pkg).rglob("*.py")):
                z.write(p, p.relative_to(root).as_posix())
    return buf.getvalue()


def ship_code(spark) -> None:
    """Make lbmr_proto and lbmr_analyze importable on the executors (once per context),
    so a cluster needs only pyarrow (and Python) installed, not lbmr-kit."""
    sc = spark.sparkContext
    if id(sc) in _SHIPPED:
        return
    d = tempfile.mkdtemp(prefix="lbmr-analyze-")
    path = os.path.join(d, "lbmr_analyze_code.zip")
    with open(path, "wb") as f:
        f.write(_package_zip())
    sc.addPyFile(path)
    _SHIPPED.add(id(sc))


class EnvironmentError_(RuntimeError):
    """The cluster cannot run the job (executors' Python, output not shared); the
    message says what to change."""


def build_session(master: str | None = None, conf: Iterable[tuple[str, str]] = (),
                  *, progress_bar: bool | None = None, quiet_jvm: bool = False, class_cache: bool = False):
    """A SparkSession for the job.  ``master`` None means ``local[*]`` unless the
    process runs under spark-submit (then spark-submit's ``--master`` applies).

    Spark's own logging is at ERROR (our log4j2 file for the driver JVM); with
    ``quiet_jvm`` the JVM's stderr (start-up notes, warnings) goes to
    :data:`SPARK_LOG` instead of the terminal (the file is named in errors).
    ``conf`` pairs are applied last (so they override these defaults); a
    ``spark.driver.extraJavaOptions`` of theirs is added after ours
    (:func:`driver_java_options`).  With ``class_cache`` the driver JVM starts from
    :mod:`lbmr_analyze.classcache`'s archive, or writes one (then end with
    :func:`stop_session`)."""
    conf = list(conf)
    from pyspark.sql import SparkSession

    from .javacheck import under_spark_submit

    submitted = under_spark_submit()
    if master is None and not submitted:
        master = "local[*]"
    b = SparkSession.builder.appName("lbmr-analyze")
    if master is not None:
        b = b.master(master)
    exe = [v for k, v in conf if k == "spark.pyspark.python"]
    if exe and not submitted and SparkSession.getActiveSession() is None:
        # PySpark takes the executors' Python from PYSPARK_PYTHON only (spark-submit
        # turns the conf into it): do the same for --conf spark.pyspark.python=...
        os.environ["PYSPARK_PYTHON"] = exe[-1]
    if (master or "").startswith("local"):
        # executors are this machine's Python workers: use this interpreter
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        b = (b.config("spark.sql.shuffle.partitions", str(max(4, 2 * (os.cpu_count() or 1))))
             .config("spark.ui.enabled", "false"))          # a second of start-up; --conf turns it on
    if progress_bar is None:
        progress_bar = sys.stderr.isatty() and not quiet_jvm
    b = (b.config("spark.sql.session.timeZone", "UTC")
         .config("spark.ui.showConsoleProgress", "true" if progress_bar else "false")
         .config("spark.log.level", "ERROR"))
    for k, v in conf:
        b = b.config(k, v)
    if not submitted:
        b = b.config("spark.driver.extraJavaOptions",
                     driver_java_options([v for k, v in conf if k == "spark.driver.extraJavaOptions"],
                                         class_cache=class_cache and SparkSession.getActiveSession() is None))
    if quiet_jvm and not submitted and SparkSession.getActiveSession() is None:
        spark = _quietly(b.getOrCreate)
    else:
        spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


#: Options of the driver JVM that lbmr-analyze starts itself: the client compiler
#: only (the driver schedules tasks and receives one small status per byte range, as
#: the records go from the Python workers straight to Parquet, so the optimising
#: compiler's work during start-up, half of the JVM's CPU there, never pays back).
DRIVER_JIT = "-XX:TieredStopAtLevel=1"


def driver_java_options(user: Sequence[str] = (), *, class_cache: bool = False) -> str:
    """``spark.driver.extraJavaOptions`` for a driver JVM lbmr-analyze starts: our
    log4j2 file (Spark logs errors only), :data:`DRIVER_JIT` and, with
    ``class_cache``, :mod:`lbmr_analyze.classcache`'s options; then the ``user``'s
    options (later ones win, in the JVM as for system properties)."""
    from . import classcache
    from .javacheck import JavaError, find_java

    log4j = Path(__file__).with_name("log4j2.properties")
    ours = [f"-Dlog4j2.configurationFile={log4j.as_uri()}", DRIVER_JIT]
    if class_cache:
        try:
            ours += classcache.java_options(find_java()[0])
        except JavaError:
            pass                                # Spark says it its own way
    return " ".join([*ours, *user])


def stop_session(spark, *, interrupted: bool = False) -> float | None:
    """Stop ``spark``.  When its driver JVM is to write a class archive at exit
    (:mod:`lbmr_analyze.classcache`): after an ``interrupted`` run, end the JVM
    at once (no archive); otherwise end it, wait for it and keep the archive,
    returning the seconds that took (else None)."""
    from pyspark import SparkContext

    from . import classcache
    from .javacheck import find_java

    jvm = getattr(SparkContext._gateway, "proc", None)     # pyspark keeps its JVM's Popen there
    dumping = classcache.dumping() and jvm is not None
    try:
        spark.stop()
    finally:
        if dumping and interrupted:
            classcache.discard(jvm)
    if not dumping or interrupted:
        return None
    t = time.perf_counter()
    classcache.keep(jvm, find_java()[0])
    return time.perf_counter() - t


#: Modules the driver imports during a run, after Spark has started (pyarrow's
#: Parquet and compute, matplotlib, the analyses and the report).
RUN_IMPORTS = ("pyarrow.compute", "pyarrow.csv", "pyarrow.dataset", "pyarrow.parquet", "matplotlib.pyplot",
               "lbmr_analyze.analyses", "lbmr_analyze.findings", "lbmr_analyze.partials", "lbmr_analyze.report")


def import_ahead() -> threading.Thread:
    """Import :data:`RUN_IMPORTS` in a thread, while the JVM starts (a second of
    the run on a small capture: the main thread mostly waits for the JVM then);
    join it before the job runs, so that no module is imported by two threads at
    once.  A module that fails to import fails again, with its error, where it is
    used."""
    import importlib

    def work():
        for name in RUN_IMPORTS:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001, S112 - reported where it is really imported
                continue

    t = threading.Thread(target=work, name="lbmr-analyze-imports", daemon=True)
    t.start()
    return t


#: Where the JVM's stderr goes when Spark is started quietly.
SPARK_LOG = os.path.join(tempfile.gettempdir(), f"lbmr-analyze-spark-{os.getuid()}.log")


def _quietly(start):
    """Call ``start`` with file descriptor 2 pointing at :data:`SPARK_LOG`, so the
    JVM that it launches (and keeps) writes its stderr there."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(SPARK_LOG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.dup2(fd, 2)
        return start()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def _probe(_):
    """Runs on an executor: its Python version and executable and whether pyarrow
    and lbmr-analyze's shipped code import."""
    import sys as _sys
    out = {"python": "{}.{}".format(*_sys.version_info[:2]), "executable": _sys.executable, "error": None}
    try:
        import pyarrow  # noqa: F401

        import lbmr_analyze.rows  # noqa: F401
    except ImportError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def executors_are_this_python(spark) -> bool:
    """Whether the executors are Python workers on this machine running this very
    interpreter (a local master, as :func:`build_session` sets it up), which
    :func:`check_executors` would only confirm."""
    sc = spark.sparkContext
    exe = shutil.which(sc.pythonExec) or sc.pythonExec
    return sc.master.startswith("local") and os.path.abspath(exe) == os.path.abspath(sys.executable)


def check_executors(spark) -> None:
    """Run a one-task probe on the executors before any work: their Python must
    start, match the driver's version, and import pyarrow and the shipped code.
    Raises :class:`EnvironmentError_` saying what to set (``spark.pyspark.python``)."""
    drv = "{}.{}".format(*sys.version_info[:2])
    hint = (f"set spark.pyspark.python (or PYSPARK_PYTHON) to a Python {drv} that has pyarrow "
            f"installed on every executor, e.g. --conf spark.pyspark.python=/opt/venv/bin/python; "
            f"lbmr-kit itself need not be installed there")
    sc = spark.sparkContext
    try:
        got = sc.parallelize([0], 1).map(_probe).collect()[0]
    except Exception as e:  # noqa: BLE001 - Py4J wraps the worker's failure
        text = str(e)
        line = next((ln.strip() for ln in text.splitlines()
                     if "Error" in ln or "error" in ln or "No such file" in ln), text.splitlines()[0] if text else "")
        raise EnvironmentError_(f"the executors' Python could not start or run lbmr-analyze's code "
                                f"({line[:300]}); {hint}") from None
    if got["python"] != drv:
        raise EnvironmentError_(f"the executors run Python {got['python']} ({got['executable']}), the driver "
                                f"Python {drv}; {hint}")
    if got["error"]:
        raise EnvironmentError_(f"the executors' Python {got['executable']} cannot import what "
                                f"lbmr-analyze needs ({got['error']}); {hint}")


# --------------------------------------------------------------------------- job

def _is_pcapng(path: str) -> bool:
    from .splits import _open
    try:
        with _open(path, 0, 4) as mm:
            return mm is not None and mm[:4] == b"\x0a\x0d\x0d\x0a"
    except OSError:
        return False


def _split_rows(spark, splits: list[Split]) -> list[tuple]:
    """Split descriptors with their pcapng context prefixes (pre-pass only for
    pcapng files cut into several ranges)."""
    by_file: dict[str, list[Split]] = {}
    for s in splits:
        by_file.setdefault(s.path, []).append(s)
    ng = [s for p, ss in by_file.items() if len(ss) > 1 and _is_pcapng(p) for s in ss]
    blocks: dict[int, list] = {}
    if ng:
        got = (spark.sparkContext.parallelize(ng, len(ng))
               .map(lambda s: (s.split_id, context_blocks(s))).collect())
        blocks = dict(got)
    rows = []
    for ss in by_file.values():
        seen: list = []
        for s in ss:
            ctx = context_for(seen, 1 << 62) if s.split_id in blocks and s.start > 0 else b""
            rows.append((s.split_id, s.path, s.start, s.end, s.size, bytearray(ctx)))
            seen += blocks.get(s.split_id, [])
    return rows


def decode_to_parquet(spark, splits: list[Split], records_path: str, ports: frozenset[int],
                      stats: dict | None = None, split_rows: list[tuple] | None = None) -> tuple[int, int, dict]:
    """Decode every split on the executors, which write the Parquet records
    themselves (partitioned by hour, see :func:`lbmr_analyze.rows.write_split`)
    under ``records_path`` (a local path or URI; replaced); returns the number of
    decoding partitions (one per split), of records written, and the merged
    partial aggregates (:mod:`lbmr_analyze.partials`).

    The records never pass through the JVM on their way to Parquet: Arrow batches
    go straight from the decoder to pyarrow's Parquet writer, and only one status
    per split comes back (:func:`lbmr_analyze.rows.write_split_task`).  ``records_path`` must be on a file system that the
    driver and every executor see at the same path (as the captures must be);
    :func:`check_visible` verifies it.

    With ``stats`` (a dict), the decoding tasks' figures are put in it: ``tasks``,
    ``wall_s`` and ``cpu_s`` (sums of the tasks' seconds), ``workers`` (distinct
    Python worker processes) and ``elapsed_s`` (the whole step).  ``split_rows``:
    the tasks' inputs (split id, path, start, end, size, pcapng context) if
    already made (the transport tasks take the same)."""
    from . import partials as P
    from .rows import write_split_task

    rows = split_rows if split_rows is not None else _split_rows(spark, splits)
    fs, base = fsio.filesystem(records_path)
    fs.create_dir(base, recursive=True)
    fs.delete_dir_contents(base, missing_dir_ok=True)
    # a plain RDD map: one split per task, one small status dict back (no DataFrame, no
    # Arrow round trip through the JVM, one Python worker per task)
    rdd = spark.sparkContext.parallelize(rows, len(rows))
    t0 = time.perf_counter()
    got = rdd.map(partial(write_split_task, ports=ports, out_dir=str(records_path))).collect()
    if stats is not None:
        stats.update(tasks=len(got), wall_s=sum(r["wall_s"] for r in got), cpu_s=sum(r["cpu_s"] for r in got),
                     workers=len({r["pid"] for r in got}), elapsed_s=time.perf_counter() - t0)
    written = sum(r["records"] for r in got)
    parts = [P.from_ipc(bytes(r["partials"])) for r in got if r["partials"]]
    with fs.open_output_stream(fsio.join(base, "_SUCCESS")):
        pass
    return rdd.getNumPartitions(), written, P.merge(parts)


class OutputNotVisible(RuntimeError):
    """The driver does not see what the executors wrote."""


def check_visible(written: int, seen: int, records_path: str) -> None:
    """Raise :class:`OutputNotVisible` unless the driver read back as many records
    (``seen``) as the executors reported writing (``written``)."""
    if written != seen:
        raise OutputNotVisible(
            f"the executors wrote {written} records under {records_path} but the driver reads {seen} "
            f"there: --out must be on a file system that the driver and every executor share at the "
            f"same path (hdfs://..., s3a://..., or a shared mount), not a local folder of each machine")


def read_records(spark, records_path: str):
    """The Parquet records as a DataFrame (with the ``hour`` partition column);
    ``records_path`` a local path or URI."""
    from .rows import SPARK_DDL
    return spark.read.schema(SPARK_DDL + ", hour string").parquet(fsio.spark_uri(str(records_path)))


def analyse(spark, records_path: str, partials: dict, *, storm_threshold: int = DEFAULT_STORM_THRESHOLD,
            top: int = DEFAULT_TOP, progress: Progress | None = None, transport=None
            ) -> tuple[dict, dict[str, list[dict]]]:
    """All tables from the decoding tasks' merged ``partials``
    (:mod:`lbmr_analyze.partials`) and one more pass over the Parquet records
    under ``records_path`` (time to resolve, stale queries, storm contexts; see
    :func:`lbmr_analyze.analyses.second_pass`): (summary, tables).  ``transport``:
    the merged :class:`lbmr_analyze.transport.TransportPart` (None: no transport
    pass ran; its tables are empty)."""
    from . import analyses as A
    from . import findings as FND
    from . import transport as TX

    prog = progress if progress is not None else Progress(3, enabled=False)
    prog.step("analysing: files, topics, contexts")
    file_rows = A.files(partials)
    summary = A.totals(file_rows)
    tables: dict[str, list[dict]] = {"files": A.files_table(file_rows)}
    facts = A.topic_facts(partials)
    flow_rows = A.flows(partials)
    tables.update(A.derive(facts, flow_rows, top=top))
    load = A.load_per_second(partials)
    tables["load_per_second"] = load
    tables["keepalive_census"] = A.keepalive_census(partials)
    tables["capture_errors"], tables["decode_errors"] = A.error_rows(partials)
    prog.step("analysing: time to resolve, stale queries, storms")
    storm_secs = [x["second"] for x in load if x["record_kind"] == "ALL" and x["packets"] > storm_threshold]
    ttr, stale, storm = A.second_pass(spark, records_path, facts, storm_secs)
    tables["time_to_resolve"] = A.ttr_table(ttr)
    tables["stale_queries"] = A.stale_table(stale)
    tables["storms"], tables["storm_contexts"] = A.storms_table(load, storm_threshold, storm)
    summary.update(
        storm_threshold=storm_threshold,
        topics=len(tables["topic_inventory"]),
        contexts=len(tables["contexts"]),
        unresolved_topics=len({x["topic"] for x in tables["unresolved_topics"]}),
        stale_queriers=len(tables["stale_queries"]),
        transport_conflicts=len(tables["transport_conflicts"]),
        otid_collisions=len(tables["otid_collisions"]),
        multi_transport_topics=len(tables["multi_transport_topics"]),
        nat_mismatches=len(tables["nat_audit"]),
        storm_seconds=len(tables["storms"]),
        wildcard_patterns=len(tables["wildcard_patterns"]),
        keepalive_clients=len(tables["keepalive_senders"]),
        clients_vanished=sum(1 for x in tables["client_changes"] if x["event"] == "vanished"),
    )
    tables.update(TX.tables(transport) if transport is not None else TX.empty_tables())
    summary.update(TX.summary(tables))
    tables["findings"] = FND.build(tables, summary)
    summary["findings"] = {s: sum(1 for f in tables["findings"] if f["severity"] == s and
                                  not f["finding"].startswith("..."))
                           for s in FND.SEVERITIES}
    return summary, tables


def analyse_written(spark, records_path: str, written: int, partials: dict, **kw
                    ) -> tuple[dict, dict[str, list[dict]]]:
    """:func:`analyse` the records the executors wrote under ``records_path``,
    after checking that the driver reads back all ``written`` of them
    (:class:`OutputNotVisible` otherwise: never a silent partial or empty report)."""
    check_visible(written, count_records(records_path), records_path)
    return analyse(spark, records_path, partials, **kw)


def count_records(records_path: str) -> int:
    """The records the driver sees under ``records_path`` (a local path or URI),
    from the Parquet files' footers (pyarrow; no Spark job): 0 when the folder is
    missing."""
    import pyarrow.dataset as ds
    fs, base = fsio.filesystem(records_path)
    try:
        return ds.dataset(base, filesystem=fs, format="parquet").count_rows()
    except FileNotFoundError:
        return 0


def run(spark, inputs: Sequence[str | os.PathLike], out: str | os.PathLike, *,
        ports: Iterable[int] = DEFAULT_PORTS, split_size: int = DEFAULT_SPLIT_SIZE,
        storm_threshold: int = DEFAULT_STORM_THRESHOLD, top: int = DEFAULT_TOP,
        progress: Progress | None = None, report: bool = True, transport: bool = True) -> Result:
    """Run the whole job on ``spark``; write ``out/records`` (Parquet), the tables
    (``out/<table>.csv`` and ``.json``) and ``out/report.html`` with its plots.

    ``inputs`` and ``out`` are local paths or URIs (``file://``, ``hdfs://``,
    ``s3a://``, or any scheme Hadoop resolves to one of those, see
    :mod:`lbmr_analyze.fsio`).  Everything is written into a staging folder beside ``out``
    (``.<name>.lbmr-analyze-<id>``) that replaces ``out`` only when the run has
    succeeded (two renames), so a failed run leaves the previous result intact.
    With ``transport`` the transport pass runs too (:mod:`lbmr_analyze.transport`:
    LBT-RM, LBT-RU and LBT-TCP sessions joined with topic resolution).
    Raises :class:`OutputNotVisible` when the driver does not read back what the
    executors wrote, :class:`EnvironmentError_` when the executors cannot run."""
    import uuid

    import pyarrow.fs as pafs

    from . import report as R

    prog = progress if progress is not None else Progress(5 + report + transport, enabled=False)
    # URIs as Hadoop resolves them (mount tables, configured schemes), then opened with pyarrow
    out_s = fsio.normal(fsio.hadoop_resolve(spark, os.fspath(out)))
    fs, final = fsio.filesystem(out_s)
    portset = frozenset(ports) | DEFAULT_PORTS
    if spark.sparkContext.getConf().get("spark.sql.session.timeZone") != "UTC":
        # for Spark SQL on the records in this session (the job itself uses none: touching
        # the SQL configuration builds the session state, a second of start-up)
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    prog.step("planning byte ranges")
    files = discover([fsio.hadoop_resolve(spark, os.fspath(i)) for i in inputs])
    if not files:
        raise FileNotFoundError("no capture files found in the inputs")
    splits = plan(files, split_size)
    if fs.get_file_info(final).type == pafs.FileType.File:
        raise FileExistsError(f"--out {out_s} is a file, not a folder")
    ship_code(spark)
    if not executors_are_this_python(spark):
        check_executors(spark)

    parent, name = fsio.parent_and_name(final)
    fs.create_dir(parent, recursive=True)
    tag = uuid.uuid4().hex[:12]
    staging = fsio.join(parent, f".{name}.lbmr-analyze-{tag}")
    staging_s = fsio.join(fsio.parent_and_name(out_s)[0], f".{name}.lbmr-analyze-{tag}")
    local_tmp = None
    try:
        fs.create_dir(staging, recursive=True)
        prog.step(f"decoding {len(files)} file(s) in {len(splits)} byte range(s) to Parquet")
        records_s = fsio.join(staging_s, RECORDS_DIR)
        dstats: dict = {}
        srows = _split_rows(spark, splits)
        parts, nrows, partials = decode_to_parquet(spark, splits, records_s, portset, dstats, srows)
        tx = None
        if transport:
            from .transport import transport_pass
            prog.step(f"decoding transport sessions in {len(splits)} byte range(s)")
            tstats: dict = {}
            tx = transport_pass(spark, srows, portset, partials, tstats)
            dstats["transport"] = tstats
        summary, tables = analyse_written(spark, records_s, nrows, partials, storm_threshold=storm_threshold,
                                          top=top, progress=prog, transport=tx)
        summary.update(files=len(files), byte_ranges=len(splits), parquet_rows=nrows)
        tables["summary"] = [{"key": k, "value": v if not isinstance(v, dict) else
                              " ".join(f"{a}={b}" for a, b in sorted(v.items()))}
                             for k, v in summary.items()]
        tables = {k: tables[k] for k in TABLES + TRANSPORT_TABLES}
        if report:
            prog.step("writing report")
            if fsio.is_local(out_s):
                rdir = Path(staging)
            else:
                local_tmp = tempfile.mkdtemp(prefix="lbmr-analyze-report-")
                rdir = Path(local_tmp)
            R.write_tables(rdir, tables)
            R.write_report(rdir, tables, summary, top=top)
            if local_tmp is not None:
                pafs.copy_files(local_tmp, staging, source_filesystem=pafs.LocalFileSystem(),
                                destination_filesystem=fs)
        _swap(fs, staging, final, fsio.join(parent, f".{name}.lbmr-analyze-old-{tag}"))
    except BaseException:
        try:
            fs.delete_dir(staging)
        except OSError:
            pass
        raise
    finally:
        if local_tmp is not None:
            shutil.rmtree(local_tmp, ignore_errors=True)
    prog.done()
    res_out: Path | str = Path(final) if fsio.is_local(out_s) else out_s
    return Result(res_out, files, splits, parts, nrows, summary, tables, dict(prog.timings), dstats)


def _swap(fs, staging: str, final: str, old: str) -> None:
    """Put ``staging`` in the place of ``final`` (renames; the previous ``final``
    is deleted once the new one is in place).  On object stores, which cannot
    rename folders, the previous ``final`` is deleted and ``staging`` copied in."""
    import pyarrow.fs as pafs
    had = fs.get_file_info(final).type != pafs.FileType.NotFound
    if fs.type_name in ("s3", "gcs", "abfs"):
        if had:
            fs.delete_dir(final)
        pafs.copy_files(staging, final, source_filesystem=fs, destination_filesystem=fs)
        fs.delete_dir(staging)
        return
    if had:
        fs.move(final, old)
    try:
        fs.move(staging, final)
    except BaseException:
        if had:
            fs.move(old, final)
        raise
    if had:
        fs.delete_dir(old)


def summary_text(res: Result, times: tuple[float, float] | None = None) -> str:
    """The short summary printed on stdout; with ``times`` (seconds: starting
    Spark, and everything) a last line with them: starting Spark is the fixed
    cost of a run."""
    s = res.summary
    lines = [
        f"lbmr-analyze: {s['files']} file(s), {s['byte_ranges']} byte range(s): "
        f"{s['datagrams']} LBMR datagrams, {s['records']} records, {s['bytes']} bytes",
        f"  time span: {s['first_seen'] or '-'} .. {s['last_seen'] or '-'}",
        "  findings: " + ", ".join(f"{n} {k}" for k, n in s["findings"].items()),
        f"  topics: {s['topics']} ({s['unresolved_topics']} never advertised, {s['stale_queriers']} "
        f"querier(s) asking after the last advertisement); contexts {s['contexts']}; TIRs {s['tirs']}, "
        f"TQRs {s['tqrs']}, wildcard TQRs {s['wc_tqrs']}, keepalives {s['keepalives']}",
        f"  conflicts: {s['transport_conflicts']} transport, {s['otid_collisions']} OTID, "
        f"{s['multi_transport_topics']} topic(s) on several transports in one context; "
        f"NAT: {s['nat_mismatches']} unreachable; storm seconds (> {s['storm_threshold']} pkt/s): "
        f"{s['storm_seconds']}",
        f"  errors: {s['capture_errors']} capture, {s['decode_errors']} decode",
        f"  transport: {s.get('transport_sessions', 0)} session(s) with traffic "
        f"({s.get('transport_sessions_advertised', 0)} advertised by TIRs): {s.get('transport_originals', 0)} "
        f"original datagrams, {s.get('transport_retransmissions', 0)} retransmissions, "
        f"{s.get('transport_nak_packets', 0)} NAKs; bad input {s.get('transport_bad_input', 0)}",
        f"  records: {fsio.join(str(res.out), RECORDS_DIR)}",
        f"  report:  {res.report}",
    ]
    if times is not None:
        start, total = times
        lines.append(f"  time: {total:.1f} s, of which starting Spark {start:.1f} s (a fixed cost)")
    return "\n".join(lines)
