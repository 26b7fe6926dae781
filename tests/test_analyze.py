"""Tests for lbmr-analyze (lbmr_analyze): byte-range splitting, the Spark job on
captures with known answers and on the real capture, the report, idempotence,
corrupt captures, split-vs-unsplit equality, the CLI and the Java check.

One real SparkSession (local[2], the suite's: ``spark_session`` in conftest.py)
serves the whole module.  Every analysis is
compared with a plain-Python computation written here, independently of the
package, over the same decoded records.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pyspark  # noqa: E402,F401  - a test requirement: a missing pyspark fails, never skips
import pytest

import lbmr_proto as L
from lbmr_analyze import splits as S  # noqa: E402
from lbmr_analyze.cli import main as cli_main  # noqa: E402
from lbmr_analyze.cli import parse_size  # noqa: E402
from lbmr_analyze.javacheck import find_java, java_version  # noqa: E402
from lbmr_analyze.job import TABLES, Progress, run  # noqa: E402
from lbmr_proto.capture import (
    LINKTYPE_RAW,
    CaptureError,
    PcapngWriter,
    read_udp,
)
from tests.analyze_reference import (
    COMPARED,
    PORTS,
    STORM,
    T0,
    assert_tables_equal,
    hashed_tir,
    ref_records,
    reference,
    reference_for,
    shuffle_partitions,
    synthetic_datagrams,
    write_pcap,
)

ROOT = Path(__file__).resolve().parents[1]
REAL_CAPTURE = Path(__file__).resolve().parents[1].parent / "shared" / "captures" / "um614-multicast-tr.pcap"


# ============================================================== spark


@pytest.fixture(scope="module")
def spark(spark_session):
    yield from shuffle_partitions(spark_session, 4)


# ============================================================== synthetic captures


def write_pcapng(path: Path, dgrams, *, sections=1, tsresol=9) -> Path:
    """pcapng; every 3rd datagram on a second interface with ``tsresol``; with
    sections=2 the second half is a second, big-endian section (raw IPv4)."""
    half = len(dgrams) // 2 if sections == 2 else len(dgrams)
    with open(path, "wb") as f:
        with PcapngWriter(f) as w:
            w.add_interface(1, tsresol=tsresol)
            for i, dg in enumerate(dgrams[:half]):
                w.write_udp(*dg, ip_id=i, interface=i % 3 == 0 and 1 or 0)
        if sections == 2:
            with PcapngWriter(f, LINKTYPE_RAW, tsresol=tsresol, big_endian=True) as w:
                for i, dg in enumerate(dgrams[half:]):
                    w.write_udp(*dg, ip_id=i)
    return path


def traffic(n: int) -> list[tuple]:
    sys.path.insert(0, str(ROOT))
    from bench.traffic import datagrams
    return list(datagrams(n))


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> Path:
    return write_pcap(tmp_path_factory.mktemp("synth") / "synthetic.pcap", synthetic_datagrams())


# ============================================================== independent reference


# ============================================================== splitting (no Spark)

def _read_all(path: str, split_size: int, ports=PORTS) -> tuple[list, list]:
    splits = S.plan([path], split_size)
    with open(path, "rb") as f:
        ng = f.read(4) == b"\x0a\x0d\x0d\x0a"
    blocks: list = []
    dgs, errs = [], []
    for s in splits:
        ctx = S.context_for(blocks, 1 << 62) if ng and s.start else b""
        for x in S.read_split(s, ports, ctx):
            (errs if isinstance(x, CaptureError) else dgs).append(x)
        if ng:
            blocks += S.context_blocks(s)
    return dgs, errs


@pytest.mark.parametrize("fmt", ["pcap", "pcap-ns", "pcapng", "pcapng-2sections"])
def test_split_reading_sees_every_record_exactly_once(tmp_path, fmt):
    dg = traffic(600) + synthetic_datagrams()
    p = tmp_path / f"t.{fmt}"
    if fmt.startswith("pcapng"):
        write_pcapng(p, dg, sections=2 if "2" in fmt else 1)
    else:
        write_pcap(p, dg, nanosecond=fmt == "pcap-ns")
    want = [d._replace(frame=0) for d in read_udp(str(p), ports=PORTS)]
    assert len(want) == len(dg) - 2
    size = p.stat().st_size
    for split_size in (64, 97, 1000, 4096, 33333, size, size * 2):
        got, errs = _read_all(str(p), split_size)
        assert errs == [], (split_size, errs)
        assert got == want, split_size
    assert len(S.plan([str(p)], 1000)) == -(-size // 1000)


def test_resync_finds_record_boundaries(tmp_path):
    p = write_pcap(tmp_path / "r.pcap", traffic(300))
    offsets = [d.offset for d in read_udp(str(p))]
    with S._open(str(p)) as mm:
        f = S._format(mm, str(p))
        size = len(mm)
        for nominal in range(25, size, 173):
            r = S.resync(mm, nominal, size, f)
            assert r == next((o for o in offsets if o >= nominal), size)


def _corrupt_copy(src: Path, dst: Path, smash_index: int) -> tuple[int, int]:
    """Copy ``src`` with record ``smash_index``'s length fields destroyed and a truncated
    record appended; returns (smashed offset, tail offset)."""
    offs = [d.offset for d in read_udp(str(src))]
    data = bytearray(src.read_bytes())
    x = offs[smash_index]
    data[x + 8:x + 16] = struct.pack("<II", 0xFFFFFFF0, 0xFFFFFFF0)
    tail = len(data)
    data += struct.pack("<IIII", int(T0) + 99, 0, 100, 100) + b"\x01" * 10
    dst.write_bytes(bytes(data))
    return x, tail


def test_split_reading_resumes_after_corruption(tmp_path):
    clean = write_pcap(tmp_path / "c.pcap", traffic(400))
    bad = tmp_path / "bad.pcap"
    x, tail = _corrupt_copy(clean, bad, 150)
    want = [d._replace(frame=0) for d in read_udp(str(clean), ports=PORTS) if d.offset != x]
    for split_size in (64, 500, 3000, 10**9):
        got, errs = _read_all(str(bad), split_size)
        assert [(e.path, e.offset) for e in errs] == [(str(bad), x), (str(bad), tail)], split_size
        assert "implausible record length" in errs[0].reason and "truncated" in errs[1].reason
        assert got == want, split_size


def test_unreadable_files_report_offset_zero(tmp_path):
    (tmp_path / "empty.pcap").write_bytes(b"")
    (tmp_path / "text.pcap").write_bytes(b"this is not a capture file at all\n" * 10)
    for name, reason in (("empty.pcap", "empty file"), ("text.pcap", "unknown file magic")):
        got, errs = _read_all(str(tmp_path / name), 64)
        assert got == [] and len(errs) == 1 and errs[0].offset == 0 and reason in errs[0].reason


def test_discover_and_sizes(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    for n in ("a/x.pcap", "a/b/y.pcapng", "a/notes.txt", "z.cap"):
        (tmp_path / n).write_bytes(b"")
    got = S.discover([tmp_path, tmp_path / "z.cap"])
    assert got == [str(tmp_path / "a/b/y.pcapng"), str(tmp_path / "a/x.pcap"), str(tmp_path / "z.cap")]
    with pytest.raises(FileNotFoundError):
        S.discover([tmp_path / "missing"])
    assert parse_size("64M") == 64 << 20 and parse_size("1000") == 1000 and parse_size("2g") == 2 << 30
    with pytest.raises(ValueError):
        parse_size("lots")


# ============================================================== Java check (no Spark)

def test_java_version_parsing():
    assert java_version('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime') == 17
    assert java_version('java version "1.8.0_402"') == 8
    assert java_version('openjdk version "21" 2023-09-19') == 21
    assert java_version("no version here") is None


def _fake_java(tmp_path: Path, version_line: str) -> Path:
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    j = home / "bin" / "java"
    j.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    j.chmod(0o755)
    return home


def _cli_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYSPARK_GATEWAY_PORT")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def test_cli_without_java_says_how_to_install(tmp_path, synth):
    empty = tmp_path / "bin"
    empty.mkdir()
    env = _cli_env(PATH=str(empty))
    p = subprocess.run([sys.executable, "-m", "lbmr_analyze", str(synth), "--out", str(tmp_path / "o")],
                       env=env, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert p.returncode == 3, p.stderr
    assert "no Java runtime found" in p.stderr and "openjdk-17-jre-headless" in p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "o").exists()
    # too old, through JAVA_HOME
    home = _fake_java(tmp_path, 'java version "1.8.0_402"')
    p = subprocess.run([sys.executable, "-m", "lbmr_analyze", str(synth), "--out", str(tmp_path / "o")],
                       env=_cli_env(PATH=str(empty), JAVA_HOME=str(home)), capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert p.returncode == 3 and "is Java 8" in p.stderr and "JAVA_HOME" in p.stderr
    with pytest.raises(Exception, match="not an executable"):
        find_java({"JAVA_HOME": str(tmp_path / "nowhere"), "PATH": ""})
    assert find_java()[1] >= 17          # the machine running the tests has one


# ============================================================== the Spark job


@pytest.fixture(scope="module")
def synth_run(spark, synth, tmp_path_factory):
    out = tmp_path_factory.mktemp("synth_out")
    return run(spark, [synth], out, ports=[20000], storm_threshold=STORM, top=20)


def test_known_answers(synth_run, synth):
    t = synth_run.tables
    inv = {r["topic"]: r for r in t["topic_inventory"]}
    assert set(inv) == {"A", "B", "C", "D", "E", "F", "G", "Z"}
    # A: advertised and queried; Q1 resolved after 0.5 s, Q2 (the storm) after 1.0 s
    ttr = {(r["querier"], r["topic"]): r["time_to_resolve_s"] for r in t["time_to_resolve"]}
    assert ttr[("10.2.2.20:14403", "A")] == pytest.approx(0.5)
    assert ttr[("10.4.4.4:14402", "A")] == pytest.approx(0.995)
    assert ("10.2.2.20:14403", "C") not in ttr            # C was advertised only before the query
    assert ("10.2.2.20:14403", "B") not in ttr
    # B never advertised (two queries from Q1), Z only with --port 20000
    assert [(r["topic"], r["querier"], r["queries"]) for r in t["unresolved_topics"]] == \
        [("B", "10.2.2.20:14403", 2), ("Z", "10.8.8.9:5556", 1)]
    assert t["unresolved_topics"][0]["src_id"] == "0001020304050607"
    # Q1 asked for C after C's last advertisement
    assert [(r["topic"], r["querier"], r["queries_after"]) for r in t["stale_queries"]] == \
        [("C", "10.2.2.20:14403", 1)]
    # C has two publishers (normal UM): no conflict; TCP:10.5.5.5:15000 claimed by two contexts is one
    assert t["multi_transport_topics"] == []
    assert [(r["topics"], r["n_contexts"]) for r in t["otid_collisions"]] == [("D", 2)]   # D's one OTID twice
    assert [(r["transport_id"], r["contexts"]) for r in t["transport_conflicts"]] == \
        [("TCP:10.5.5.5:15000", "10.5.5.5:14402 [0001020304050607] | 10.5.5.6:14402 [0001020304050607]")]
    # wildcard ^(A|C)$ matches A and C; the broken pattern is reported
    assert [(m["pattern"], m["topic"]) for m in t["wildcard_matches"]] == [("^(A|C)$", "A"), ("^(A|C)$", "C")]
    bad = [p for p in t["wildcard_patterns"] if p["error"]]
    assert [p["pattern"] for p in bad] == ["([unclosed"] and bad[0]["matched_topics"] == 0
    # keepalive census: 2 clients in the first minute, 3 in the second
    assert [(r["time"], r["clients"]) for r in t["keepalive_census"]] == \
        [("2023-11-14T22:13:00Z", 2), ("2023-11-14T22:14:00Z", 3)]
    assert [r["client"] for r in t["keepalive_senders"]] == ["10.9.9.1:14402", "10.9.9.2:14402", "10.9.9.3:14405"]
    # NAT: only E (F is 0.0.0.0, G's /24 has hosts, 192.168/16 has none)
    assert [(r["advertiser"], r["advertised_ip"], r["topic"]) for r in t["nat_audit"]] == \
        [("10.7.7.7:14402 [0001020304050607]", "192.168.50.5", "E")]
    # storm second T0+10: 60 TQR datagrams from Q2 + one TIR from S1
    assert [(r["second"], r["packets"]) for r in t["storms"]] == [(int(T0) + 10, 61)]
    assert [(r["context"], r["packets"]) for r in t["storm_contexts"]] == \
        [("10.4.4.4:14402", 60), ("10.1.1.10:14402", 1)]
    assert t["storms"][0]["top_contexts"].startswith("10.4.4.4:14402 [0001020304050607] 60/s (98.4 %)")
    # top talkers are contexts (ip:port), Q2 first
    assert t["top_talkers"][0]["context"] == "10.4.4.4:14402" and t["top_talkers"][0]["packets"] == 60
    # keepalive client 10.9.9.3 joined at T0+45.2
    assert [(r["client"], r["event"]) for r in t["client_changes"]] == [("10.9.9.3:14405", "joined")]
    # findings: most severe first, each naming its table
    f = t["findings"]
    assert [x["severity"] for x in f] == sorted((x["severity"] for x in f),
                                                key=["critical", "high", "medium", "low"].index)
    assert f[0]["kind"] == "transport conflict" and "10.5.5.6:14402" in f[0]["finding"]
    kinds: dict = {}
    for x in f:
        kinds.setdefault(x["kind"], x)                     # the first (most severe, biggest) of each kind
    assert {"never advertised", "querying after last advertisement", "storm", "unreachable address",
            "lbmrd client joined", "undecodable datagrams", "invalid wildcard pattern"} <= set(kinds)
    assert "10.4.4.4:14402" in kinds["storm"]["finding"] and kinds["storm"]["table"] == "storms"
    assert "'B'" in kinds["never advertised"]["finding"] and "10.2.2.20:14403" in kinds["never advertised"]["finding"]
    # the undecodable datagram on 15380, not the one on 9999; --port 20000 was honoured
    assert [(r["src"], r["dport"]) for r in t["decode_errors"]] == [("10.8.8.8", 15380)]
    assert "Z" in inv and inv["Z"]["queries"] == 1
    assert t["capture_errors"] == []
    s = synth_run.summary
    assert s["datagrams"] == len(synthetic_datagrams()) - 1 and s["tirs"] == 20 + 2 + 2 + 3
    assert synth_run.rows == s["parquet_rows"] == s["records"]
    # the Parquet records are partitioned by hour
    assert sorted(p.name for p in (synth_run.out / "records").glob("hour=*")) == ["hour=2023-11-14T22"]


def test_synthetic_matches_plain_python(synth_run, synth):
    want = reference_for(synth, storm=STORM)
    assert_tables_equal(synth_run.tables, want)


def test_real_capture_matches_plain_python(spark, tmp_path):
    res = run(spark, [REAL_CAPTURE], tmp_path / "real", storm_threshold=5, top=5)
    want = reference_for(REAL_CAPTURE, ports=PORTS, storm=5, top=5)
    assert_tables_equal(res.tables, want)
    s = res.summary
    assert (s["datagrams"], s["tirs"], s["tqrs"], s["wc_tqrs"]) == (179, 141, 43, 18)
    assert s["packet_types"] == {"NORMAL": 161, "WC_TQR": 18}
    assert all(r["sources"].startswith("LBTRM:") for r in res.tables["topic_inventory"])
    assert res.tables["storms"]            # threshold 5 pkt/s: the start-up burst
    t = res.tables
    # 10.29.4.101:54247 queries both topics after their last advertisement; :35101 multi.0
    assert sorted((r["querier"], r["topic"], r["queries_after"]) for r in t["stale_queries"]) == [
        ("10.29.4.101:35101", "29west.example.multi.0", 6),
        ("10.29.4.101:54247", "29west.example.multi.0", 1),
        ("10.29.4.101:54247", "29west.example.multi.1", 1)]
    assert {r["src_id"] for r in t["stale_queries"] if r["querier"] == "10.29.4.101:54247"} == {"27a4abdfc5eeaba5"}
    # 10.29.4.121 is two contexts; two publishers of multi.0 are not a conflict
    ctx = {r["context"]: r["src_id"] for r in t["contexts"]}
    assert ctx["10.29.4.121:37168"] == "12c4ba70db622fd2" and ctx["10.29.4.121:42180"] == "c64aaecb2b0204c8"
    assert len(ctx) == 4
    assert t["transport_conflicts"] == t["otid_collisions"] == t["multi_transport_topics"] == t["nat_audit"] == []
    stale = [f for f in t["findings"] if f["kind"] == "querying after last advertisement"]
    assert any("10.29.4.101:54247" in f["finding"] and "multi.1" in f["finding"] for f in stale)
    # 54247 asked once, 4 s before the capture stopped: "at capture end"; 35101 kept asking for 5 s
    assert sorted((f["contexts"].split()[0], f["severity"]) for f in stale) == [
        ("10.29.4.101:35101", "high"), ("10.29.4.101:54247", "low"), ("10.29.4.101:54247", "low")]
    storm = [f for f in t["findings"] if f["kind"] == "storm"]
    assert storm and "10.29.4.121:37168" in storm[0]["finding"]


class _Html(HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs, self.tables, self.links, self.headings, self.scripts = [], [], [], [], []
        self._script = False

    def handle_data(self, data):
        if self._script:
            self.scripts.append(data)

    def handle_endtag(self, tag):
        self._script = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self._script = tag == "script"
        if tag in ("h2", "h3") and a.get("id"):
            self.headings.append(a["id"])
        if tag == "img":
            self.imgs.append(a["src"])
        elif tag == "table":
            self.tables.append(a.get("data-table"))
        elif tag == "a":
            self.links.append(a.get("href"))


def test_report_renders(synth_run):
    out = synth_run.out
    p = _Html()
    p.feed((out / "report.html").read_text(encoding="utf-8"))
    assert sorted(p.imgs) == sorted(["load.png", "census.png", "top_topics.png", "top_talkers.png",
                                     "time_to_resolve.png"])
    assert p.headings[0] == "findings" and p.headings.index("findings") < p.headings.index("files")
    assert p.scripts and "addEventListener" in p.scripts[0] and "http" not in p.scripts[0]
    for f in synth_run.tables["findings"]:
        assert f["table"] in p.headings, f
    for img in p.imgs:
        data = (out / img).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        w, h = struct.unpack(">II", data[16:24])
        assert w >= 600 and h >= 100 and len(data) > 5000, img
    assert "load_per_second" not in p.tables               # a long series: a plot, not a table
    assert "Rule of thumb: an advertised address is reachable" in (out / "report.html").read_text()
    for name in TABLES:
        assert f"{name}.csv" in p.links and f"{name}.json" in p.links
        rows = json.loads((out / f"{name}.json").read_text())
        assert rows == json.loads(json.dumps(synth_run.tables[name], default=str))
        import pyarrow.parquet as pq
        assert pq.read_table(out / f"{name}.parquet").num_rows == len(rows), name
        lines = (out / f"{name}.csv").read_text().splitlines()
        assert len(lines) == len(rows) + 1 or (not rows and len(lines) == 1)
    assert "topic_inventory" in p.tables and "nat_audit" in p.tables


def test_rerun_is_idempotent(spark, synth, synth_run):
    before = {n: (synth_run.out / f"{n}.csv").read_bytes() for n in TABLES}
    res = run(spark, [synth], synth_run.out, ports=[20000], storm_threshold=STORM, top=20)
    assert res.rows == synth_run.rows
    assert spark.read.parquet(str(res.out / "records")).count() == synth_run.rows
    assert res.tables == synth_run.tables
    assert {n: (res.out / f"{n}.csv").read_bytes() for n in TABLES} == before


def test_corrupt_capture_reported_and_rest_analysed(spark, synth, tmp_path):
    d = tmp_path / "caps"
    d.mkdir()
    bad = d / "bad.pcap"
    x, tail = _corrupt_copy(synth, bad, 30)
    (d / "zz-notacapture.pcap").write_bytes(b"hello\n" * 20)
    good_ng = write_pcapng(d / "more.pcapng", synthetic_datagrams()[:40])
    res = run(spark, [d], tmp_path / "out", ports=[20000], storm_threshold=STORM, split_size=4096)
    errs = [(e["file"], e["offset"]) for e in res.tables["capture_errors"]]
    assert errs == [(str(bad), x), (str(bad), tail), (str(d / "zz-notacapture.pcap"), 0)]
    dgs = [dd for dd in read_udp(str(synth), ports=PORTS | {20000}) if dd.offset != x]
    recs = ref_records(str(bad), dgs) + ref_records(str(good_ng), read_udp(str(good_ng), ports=PORTS | {20000}))
    cerrs = [CaptureError(e["file"], e["offset"], e["error"]) for e in res.tables["capture_errors"]]
    want = reference(recs, capture_errors=cerrs)
    assert_tables_equal(res.tables, want, [n for n in COMPARED if n != "files"])
    files = {f["file"]: f for f in res.tables["files"]}
    assert files[str(d / "zz-notacapture.pcap")]["capture_errors"] == 1
    assert files[str(bad)]["capture_errors"] == 2
    assert files[str(bad)]["datagrams"] == len(dgs)
    assert "implausible record length" in res.tables["capture_errors"][0]["error"]


def test_big_file_split_into_byte_ranges(spark, tmp_path):
    dg = traffic(6000)
    pc = write_pcap(tmp_path / "big.pcap", dg)
    # microsecond pcapng: float seconds from nanosecond stamps may round to another microsecond
    ng = write_pcapng(tmp_path / "big.pcapng", dg, sections=2, tsresol=6)
    whole = run(spark, [pc], tmp_path / "whole", report=False)
    assert len(whole.splits) == 1 and whole.decode_partitions == 1
    # (each split is a task of its own: a dozen prove the point, and cost about a second per two)
    split = run(spark, [pc], tmp_path / "split", split_size=90_000, report=False)
    assert len(split.splits) > 10 and split.decode_partitions == len(split.splits)
    assert split.rows == whole.rows
    assert_tables_equal(split.tables, whole.tables)
    ngs = run(spark, [ng], tmp_path / "ng", split_size=90_000, report=False)
    assert ngs.decode_partitions > 10
    assert_tables_equal(ngs.tables, whole.tables, [n for n in COMPARED if n not in ("files", "decode_errors")])
    want = reference_for(pc, ports=PORTS, storm=1000)
    assert_tables_equal(whole.tables, want, [n for n in COMPARED if n not in ("files",)])


@pytest.fixture
def sigint_kept():
    """SIGINT's handler restored after the test: the CLI run in this process ignores
    SIGINT once its output is in place, and an ignored SIGINT is inherited by every
    process the suite starts later (those tests stop theirs with SIGINT); the suite's
    SparkSession lives on, so no new SparkContext installs its own handler again."""
    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)


def test_cli_end_to_end(spark, synth, tmp_path, sigint_kept):
    from click.testing import CliRunner
    r = CliRunner().invoke(cli_main, [str(synth), "--out", str(tmp_path / "o"), "--port", "20000",
                                      "--storm-threshold", str(STORM), "--split-size", "2K", "--top", "3"],
                           catch_exceptions=False)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN     # (what sigint_kept undoes)
    assert r.exit_code == 0, r.output
    assert "lbmr-analyze: 1 file(s)" in r.stdout and "report:" in r.stdout
    assert "7/7 writing report" in r.stderr      # (the transport pass is a step of its own)
    assert (tmp_path / "o" / "report.html").exists()
    top = json.loads((tmp_path / "o" / "top_talkers.json").read_text())
    assert len(top) == 3 and top[0]["context"] == "10.4.4.4:14402"
    assert not spark.sparkContext._jsc.sc().isStopped()      # an embedding caller's session survives
    bad = CliRunner().invoke(cli_main, [str(synth), "--out", str(tmp_path / "o"), "--split-size", "tiny"])
    assert bad.exit_code == 2 and "not a size" in bad.output


# ============================================================== an lbmrd client's capture

def lbmrd_client_datagrams() -> list[tuple]:
    """Captured on lbmrd client 10.1.1.5: lbmrd 10.0.0.1:15380 relays other contexts'
    TIRs (each trailer carries the original context's src_id); client 10.1.1.6 stops
    sending keepalives at T0+10."""
    d = []
    lbmrd, me, other = ("10.0.0.1", 15380), ("10.1.1.5", 14402), ("10.1.1.6", 14402)

    def relayed(ts, src_id: bytes, tirs):
        pkt = L.Packet(tirs=tirs, options=[L.SourceIdOption(0x8000, src_id)])
        d.append((T0 + ts, *lbmrd, *me, L.encode(pkt)))

    for k in range(0, 41, 5):
        d.append((T0 + k, *me, *lbmrd, L.encode(L.Packet(2))))
        if k <= 10:
            d.append((T0 + k + 0.5, *other, *lbmrd, L.encode(L.Packet(3))))
    x1, x2, x3 = b"\x11" * 8, b"\x22" * 8, b"\x33" * 8
    same = L.OtidOption(0x8000, b"\x44" * 32)
    for k in range(1, 40, 3):
        relayed(k, x1, [hashed_tir("P", L.TcpTransport("10.1.1.10", 14371)),      # the capture host's /24
                        hashed_tir("Q", L.TcpTransport("10.3.3.3", 14371)),       # another 10/8 subnet: routed
                        hashed_tir("R", L.TcpTransport("172.16.9.9", 14371))])    # nobody of 172.16/12 here
        relayed(k + 0.1, x2, [hashed_tir("M", L.TcpTransport("10.1.1.11", 14371)),
                              hashed_tir("M", L.TcpTransport("10.1.1.11", 14372))])
        relayed(k + 0.2, x3, [L.TIR("N1", L.TcpTransport("10.1.1.12", 14371), 16, 1, [same]),
                              L.TIR("N2", L.TcpTransport("10.1.1.12", 14371), 16, 2, [same])])
    for k, src_id in ((2, b"\x55" * 8), (3, b"\x66" * 8), (4, b"\x66" * 8)):     # relayed queries for U
        d.append((T0 + k + 0.3, *lbmrd, *me,
                  L.encode(L.Packet(tqrs=[L.TQR("U")], options=[L.SourceIdOption(0x8000, src_id)]))))
    # relayed queries for P (advertised at T0+1, +4, ..., +37) from two contexts: 0x77 first
    # asks at T0+0.5 (resolved 0.5 s later), 0x88 at T0+2.25 (1.75 s) and again after P's
    # last advertisement (T0+38 and +39: a stale querier)
    for ts, src_id in ((0.5, b"\x77" * 8), (0.75, b"\x77" * 8), (2.25, b"\x88" * 8), (38, b"\x88" * 8),
                       (39, b"\x88" * 8)):
        d.append((T0 + ts, *lbmrd, *me,
                  L.encode(L.Packet(tqrs=[L.TQR("P")], options=[L.SourceIdOption(0x8000, src_id)]))))
    d.sort(key=lambda x: x[0])
    return d


def test_lbmrd_client_capture_findings(spark, tmp_path):
    cap = write_pcap(tmp_path / "client.pcap", lbmrd_client_datagrams())
    res = run(spark, [cap], tmp_path / "out", storm_threshold=STORM)
    t = res.tables
    assert_tables_equal(t, reference_for(cap, ports=PORTS))
    via = "via lbmrd 10.0.0.1:15380"
    # a relayed TIR carries the original source's address: only R's 172.16.9.9 is unreachable
    assert [(r["advertised_ip"], r["topic"], r["advertiser"], r["via_lbmrd"]) for r in t["nat_audit"]] == \
        [("172.16.9.9", "R", f"[{'11' * 8}] {via}", True)]
    assert [(r["context"], r["src_id"], r["topic"], r["n_transports"]) for r in t["multi_transport_topics"]] == \
        [(via, "22" * 8, "M", 2)]
    assert [(r["topics"], r["n_contexts"]) for r in t["otid_collisions"]] == [("N1 N2", 1)]
    assert t["transport_conflicts"] == []        # N1 and N2 share one transport in one context: normal
    # two contexts query U through lbmrd: told apart by their src_id
    assert [(r["topic"], r["querier"], r["src_id"], r["queries"], r["via_lbmrd"]) for r in t["unresolved_topics"]] \
        == [("U", "10.0.0.1:15380", "66" * 8, 2, True), ("U", "10.0.0.1:15380", "55" * 8, 1, True)]
    # relayed queries for P: one time to resolve per querying context (its src_id), not per lbmrd
    assert [(r["querier"], r["src_id"], r["topic"], r["time_to_resolve_s"]) for r in t["time_to_resolve"]] == \
        [("10.0.0.1:15380", "88" * 8, "P", 1.75), ("10.0.0.1:15380", "77" * 8, "P", 0.5)]
    assert [(r["querier"], r["src_id"], r["topic"], r["queries_after"]) for r in t["stale_queries"]] == \
        [("10.0.0.1:15380", "88" * 8, "P", 2)]
    assert {r["topic"]: r["n_queriers"] for r in t["topic_inventory"]}["P"] == 2
    assert [(r["client"], r["event"], r["silent_s"]) for r in t["client_changes"]] == \
        [("10.1.1.6:14402", "vanished", 29.5)]
    kinds = [(f["severity"], f["kind"]) for f in t["findings"]]
    # P's stale queries came at +38 and +39 s, in the capture's last 5 s: "at capture end", low
    assert kinds == [("critical", "OTID collision"), ("high", "never advertised"), ("high", "unreachable address"),
                     ("medium", "one context, several transports"), ("medium", "lbmrd client vanished"),
                     ("low", "querying after last advertisement")]
    assert "at capture end" in t["findings"][5]["finding"] and "'P'" in t["findings"][5]["finding"]
    assert t["findings"][5]["contexts"] == f"[{'88' * 8}] via lbmrd 10.0.0.1:15380"
    assert t["findings"][3]["finding"].startswith(f"Context [{'22' * 8}] via lbmrd 10.0.0.1:15380 advertises")
    assert "172.16.9.9" in t["findings"][2]["finding"] and "relayed by lbmrd" in t["findings"][2]["finding"]
    # the two relayed queriers of U are named apart
    assert t["findings"][1]["contexts"] == f"[{'66' * 8}] via lbmrd 10.0.0.1:15380 | [{'55' * 8}] {via}"


# ============================================================== cluster safety (local mode)

def test_uris_gzip_and_unopenable_captures(spark, synth, synth_run, tmp_path):
    d = tmp_path / "caps"
    d.mkdir()
    with open(synth, "rb") as f, gzip.open(d / "synthetic.pcap.gz", "wb") as g:
        g.write(f.read())
    (d / "gone.pcap").symlink_to(tmp_path / "missing.pcap")          # dangling link
    (d / "broken.pcap.gz").write_bytes(b"\x1f\x8b\x08\x00 not gzip at all")
    out_uri = (tmp_path / "o u t").as_uri()                          # file:// URI, quoted space
    res = run(spark, [d.as_uri()], out_uri, ports=[20000], storm_threshold=STORM, top=20)
    assert res.out == tmp_path / "o u t" and (tmp_path / "o u t" / "report.html").exists()
    same = [n for n in COMPARED if n not in ("files", "decode_errors", "capture_errors")]
    assert_tables_equal(res.tables, synth_run.tables, same)
    errs = {Path(e["file"]).name: e["error"] for e in res.tables["capture_errors"]}
    assert errs["gone.pcap"] == "cannot open the capture: No such file or directory"
    assert errs["broken.pcap.gz"].startswith("cannot open the capture: gzip")
    assert len(errs) == 2
    assert {Path(f["file"]).name for f in res.tables["files"]} == {"synthetic.pcap.gz", "gone.pcap",
                                                                  "broken.pcap.gz"}


def _unprivileged(cmd: list, env: dict) -> subprocess.CompletedProcess:
    """Run ``cmd`` as user nobody (permissions apply: root would bypass them).

    This interpreter may live under a folder nobody cannot enter (pyenv under /root,
    mode 700): the command runs in a private mount namespace where that folder is a
    world-readable tmpfs with only the interpreter's own subfolder bound back in."""
    real = Path(os.path.realpath(sys.executable))
    closed = [a for a in real.parents if a != real.parent and not os.stat(a).st_mode & 0o001]
    assert len(closed) <= 1, f"more than one folder closed to others above {real}: {closed}"
    script = 'exec setpriv --reuid=nobody --regid=nogroup --clear-groups -- "$@"'
    args: list = []
    if closed:
        a = closed[0]
        c = real.relative_to(a).parts[0]
        hold = Path(env["LBMR_TEST_TMP"]) / "hold"
        hold.mkdir()
        script = ('set -e; mount --bind "$1/$2" "$3"; mount -t tmpfs -o mode=0755 lbmr-open "$1"; '
                  'mkdir -p "$1/$2"; mount --bind "$3" "$1/$2"; shift 3; ' + script)
        args = [str(a), c, str(hold)]
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *args,
                           *map(str, cmd)], env=env, capture_output=True, text=True, timeout=600)


def test_permission_denied_captures_are_capture_errors(synth):
    """Run as nobody: a capture file and a folder it may not read are capture errors
    in the report; the readable capture is analysed; exit 0."""
    import pwd
    import shutil
    import tempfile
    nobody = pwd.getpwnam("nobody")
    tmp = Path(tempfile.mkdtemp(prefix="lbmr-analyze-perm-"))        # pytest's tmp_path is root-only
    try:
        os.chmod(tmp, 0o755)
        caps = tmp / "caps"
        (caps / "locked").mkdir(parents=True)
        (caps / "good.pcap").write_bytes(synth.read_bytes())
        (caps / "secret.pcap").write_bytes(synth.read_bytes())
        (caps / "locked" / "inner.pcap").write_bytes(synth.read_bytes())
        os.chmod(caps, 0o755)
        os.chmod(caps / "good.pcap", 0o644)
        os.chmod(caps / "secret.pcap", 0o600)          # root's: nobody cannot read it
        os.chmod(caps / "locked", 0o700)                # nor list this folder
        home = tmp / "home"
        home.mkdir()
        os.chown(home, nobody.pw_uid, nobody.pw_gid)
        # (no class archive: nobody's empty cache would have its JVM write one, 120 MB, at exit)
        env = dict(os.environ, HOME=str(home), LBMR_TEST_TMP=str(tmp), LBMR_ANALYZE_CLASS_CACHE="off")
        env.pop("PYSPARK_PYTHON", None)
        p = _unprivileged([Path(sys.executable).parent / "lbmr-analyze", caps, "--out", home / "out",
                           "--port", "20000", "--conf", "spark.ui.enabled=false", "--master", "local[2]",
                           "-q"], env)
        assert p.returncode == 0, p.stderr[-3000:]
        out = home / "out"
        assert (out / "report.html").stat().st_uid == nobody.pw_uid          # it did run as nobody
        errs = json.loads((out / "capture_errors.json").read_text())
        assert [(Path(e["file"]).name, e["offset"], e["error"]) for e in errs] == [
            ("locked", 0, "cannot open the capture: Permission denied"),
            ("secret.pcap", 0, "cannot open the capture: Permission denied")]
        files = {Path(f["file"]).name: f for f in json.loads((out / "files.json").read_text())}
        assert files["good.pcap"]["datagrams"] == len(synthetic_datagrams()) - 1
        assert "errors: 2 capture" in p.stdout
        assert f"{caps / 'secret.pcap'}: byte offset 0: cannot open the capture: Permission denied" in p.stderr
        assert "Traceback" not in p.stderr
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_hadoop_filesystem_uris(spark, synth, synth_run, tmp_path):
    """Inputs and --out as URIs of a Hadoop file system other than file://: a
    viewfs:// mount table (Hadoop's ViewFileSystem, in pyspark's own jars; no
    network) whose links lead to local folders, resolved through Hadoop's
    FileSystem API; a scheme nobody has a file system for is a clear error."""
    import shutil

    from lbmr_analyze.fsio import UnsupportedURI, hadoop_resolve
    caps, outs = tmp_path / "caps", tmp_path / "outs"
    caps.mkdir()
    outs.mkdir()
    shutil.copy(synth, caps / "synthetic.pcap")
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    links = {"fs.viewfs.mounttable.lbmrtest.link./caps": caps.as_uri(),
             "fs.viewfs.mounttable.lbmrtest.link./results": outs.as_uri()}
    for k, v in links.items():
        conf.set(k, v)
    try:
        # the Hadoop API itself: existing paths, and an output folder not there yet
        assert hadoop_resolve(spark, "viewfs://lbmrtest/caps/synthetic.pcap") == (caps / "synthetic.pcap").as_uri()
        assert hadoop_resolve(spark, "viewfs://lbmrtest/results/tr/x") == (outs / "tr" / "x").as_uri()
        res = run(spark, ["viewfs://lbmrtest/caps"], "viewfs://lbmrtest/results/tr", ports=[20000],
                  storm_threshold=STORM, top=20)
    finally:
        for k in links:
            conf.unset(k)
    assert res.out == outs / "tr" and (outs / "tr" / "report.html").exists()
    assert [f["file"] for f in res.tables["files"]] == [str(caps / "synthetic.pcap")]
    assert_tables_equal(res.tables, synth_run.tables, [n for n in COMPARED if n not in ("files", "decode_errors")])
    assert [(e["file"], e["offset"]) for e in res.tables["decode_errors"]] == \
        [(str(caps / "synthetic.pcap"), e["offset"]) for e in synth_run.tables["decode_errors"]]
    with pytest.raises(UnsupportedURI, match="nosuchfs://x/caps: lbmr-analyze's executors read and write "
                                             "through pyarrow, which cannot open it"):
        run(spark, [synth], "nosuchfs://x/caps")


class _FailAt(Progress):
    """Progress that raises at one step: a run interrupted there (as by Ctrl-C)."""

    def __init__(self, at: str):
        super().__init__(9, enabled=False)
        self.at = at

    def step(self, name):
        if name.startswith(self.at):
            raise KeyboardInterrupt(name)
        super().step(name)


def test_failed_rerun_keeps_previous_output(spark, synth, tmp_path):
    out = tmp_path / "out"
    first = run(spark, [synth], out, ports=[20000], storm_threshold=STORM)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert (out / "records" / "_SUCCESS").exists() and len(before) > 40
    for step in ("decoding", "writing report"):
        with pytest.raises(KeyboardInterrupt):
            run(spark, [synth], out, ports=[20000], storm_threshold=STORM, progress=_FailAt(step))
        after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
        assert after == before, step
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]       # no staging left behind
    assert first.tables["findings"]


def test_records_invisible_to_driver_is_an_error(spark, synth, tmp_path):
    from lbmr_analyze.job import OutputNotVisible, analyse_written, decode_to_parquet
    from lbmr_analyze.splits import discover, plan
    rec = str(tmp_path / "records")
    _, written, partials = decode_to_parquet(spark, plan(discover([synth])), rec, frozenset(PORTS))
    assert written > 100
    for p in (tmp_path / "records").rglob("*.parquet"):      # as if on an executor's own disk
        p.unlink()
    with pytest.raises(OutputNotVisible, match=f"executors wrote {written} records .* reads 0 there"):
        analyse_written(spark, rec, written, partials)


# ============================================================== schema documentation

def test_schema_documented_and_versioned(synth_run):
    import pyarrow.parquet as pq

    from lbmr_analyze.rows import SCHEMA_VERSION, SPARK_DDL
    man = (ROOT / "man" / "lbmr-analyze.1").read_text()
    table = man.split(".TS\n", 1)[1].split(".TE\n", 1)[0].splitlines()[2:]    # after format and header
    documented = []
    for line in table:
        names, typ, _ = line.split("\t")
        documented += [(n.strip(), typ) for n in names.split(",")]
    code = [tuple(c.split(" ")) for c in SPARK_DDL.split(", ")]
    assert sorted(documented) == sorted(code)
    assert f"describes version {SCHEMA_VERSION}" in man
    files = list((synth_run.out / "records").rglob("*.parquet"))
    assert files
    for f in files:
        meta = pq.read_metadata(f).metadata
        assert meta[b"lbmr_analyze.schema_version"] == str(SCHEMA_VERSION).encode()
