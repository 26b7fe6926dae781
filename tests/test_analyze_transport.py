"""lbmr-analyze's transport pass (issue 24) on Spark: the session table the
pipeline builds from byte ranges spread over executors equals the one-process
table (``lbmr-inspect --sessions``) and tshark's per-session counts (with
"Decode As") on the real UM capture, whole and cut into many ranges; the
receiver and topic tables equal the one-process ones; a generated capture
whose sessions each carry known evidence gives exactly the known findings;
bad input is counted by reason and reported.

One real SparkSession (local[2]) serves the module.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pyspark  # noqa: F401  - a test requirement: a missing pyspark fails, never skips
import pytest

from lbmr_analyze.job import TRANSPORT_TABLES, run
from lbmr_analyze.transport_findings import NAK_GENERATION_S
from tests.analyze_reference import shuffle_partitions
from tests.helpers import real_capture
from tests.transport_captures import (
    FINDINGS_DECODE_AS,
    FINDINGS_SESSIONS,
    FINDINGS_T0,
    tshark_lbtrm_counts,
    write_transport_findings_capture,
)
from tests.tshark_judge import tshark_field_rows

REAL_DECODE_AS = ("udp.port==14400,lbtrm", "udp.port==12090,lbtrm", "udp.port==12091,lbtrm",
                  "udp.port==12965,lbmr")
LBMR_INSPECT = Path(sys.executable).parent / "lbmr-inspect"


@pytest.fixture(scope="module")
def spark(spark_session):
    yield from shuffle_partitions(spark_session, 2)


# ============================================================== references, written here

def _iso(ts: float) -> str | None:
    if not ts:
        return None
    us = round(ts * 1e6)
    return datetime.fromtimestamp(us // 1_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{us % 1_000_000:06d}Z"


def inspect_tables(path: Path) -> dict:
    """``lbmr-inspect --sessions --json``: the one-process tables."""
    r = subprocess.run([LBMR_INSPECT, "--sessions", "--json", str(path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def as_job_session(s: dict) -> dict:
    """A session of lbmr-inspect's JSON as the job's table writes it."""
    out = dict(s)
    for k in ("first_ts", "last_ts", "last_original_ts"):
        out[k] = _iso(s[k])
    out["topics"] = " | ".join(s["topics"])
    out["source_contexts"] = " ".join(s["source_contexts"])
    out["receivers"] = " ".join(s["receivers"])
    out["control"] = " ".join(f"{k}={n}" for k, n in s["control"])
    out["session_id"] = f"{s['session_id']:08x}"
    out["rate_bps"] = round(s["rate_bps"], 1)
    return out


def as_job_receiver(r: dict) -> dict:
    out = dict(r)
    for k in ("first_ts", "last_ts", "silent_ts"):
        out[k] = _iso(r[k])
    for k in ("loss_estimate", "recovery_p50", "recovery_max"):
        out[k] = round(r[k], 6)
    out["outstanding"] = " ".join(map(str, r["outstanding"]))
    return out


def job_counts(row: dict) -> Counter:
    return +Counter(originals=row["originals"], retransmissions=row["retransmissions"],
                    session_messages=row["session_messages"], nak_packets=row["nak_packets"],
                    nak_entries=row["nak_entries"], ncf_0=row["ncf_no_retry"], ncf_1=row["ncf_ignored"],
                    ncf_2=row["ncf_rx_delay"], ncf_3=row["ncf_shed"])


def without_extras(row: dict, extra=("source_last", "icmp_first", "icmp_last")) -> dict:
    return {k: v for k, v in row.items() if k not in extra}


# ============================================================== the real capture

@pytest.fixture(scope="module")
def real_runs(spark, tmp_path_factory):
    """The real capture whole (one byte range) and cut into 32 KiB ranges (42 tasks)."""
    d = tmp_path_factory.mktemp("real-tx")
    path = real_capture()
    whole = run(spark, [path], d / "whole", report=False)
    cut = run(spark, [path], d / "cut", split_size=32 << 10, report=False)
    assert whole.decode_partitions == 1 and cut.decode_partitions > 30
    return path, whole, cut


def test_real_capture_sessions_equal_inspect_and_tshark(real_runs):
    path, whole, cut = real_runs
    ref = inspect_tables(path)
    want = [as_job_session(s) for s in ref["sessions"]]
    theirs = tshark_lbtrm_counts(path, REAL_DECODE_AS)
    for res in (whole, cut):
        got = res.tables["transport_sessions"]
        assert [without_extras(r) for r in got] == want
        assert {(int(r["session_id"], 16), r["port"]): job_counts(r) for r in got} == theirs
        assert [r["originals"] for r in got] == [5000, 5000] and [r["icmp_errors"] for r in got] == [0, 8]
        recv = res.tables["transport_receivers"]
        assert [without_extras(r, ("outstanding_from", "outstanding_to")) for r in recv] == \
            [as_job_receiver(r) for r in ref["receivers"]]
        assert [(r["outstanding_from"] is None, r["outstanding_to"] is None) for r in recv] == \
            [(not r["outstanding_count"],) * 2 for r in recv]
        assert [without_extras(t, ("queriers",)) for t in res.tables["transport_topics"]] == ref["topics"]
        assert [t["queriers"] for t in res.tables["transport_topics"]] == [
            "10.29.4.101:35101 10.29.4.101:54247", "10.29.4.101:35101 10.29.4.101:54247", "10.29.4.101:54247"]
        assert res.tables["transport_errors"] == []
    # the cut run merges its 42 parts to the very same tables, timeline included
    for name in TRANSPORT_TABLES:
        assert cut.tables[name] == whole.tables[name], name


def test_real_capture_timeline_adds_up_to_the_sessions(real_runs):
    _, whole, _ = real_runs
    per = Counter()
    for r in whole.tables["transport_timeline"]:
        for k in ("originals", "retransmissions", "nak_packets", "nak_entries", "ncf_packets", "session_messages",
                  "icmp_errors"):
            per[(r["session"], k)] += r[k]
    for s in whole.tables["transport_sessions"]:
        ncfs = s["ncf_no_retry"] + s["ncf_ignored"] + s["ncf_rx_delay"] + s["ncf_shed"]
        assert [per[(s["session"], k)] for k in ("originals", "retransmissions", "nak_packets", "nak_entries",
                                                 "ncf_packets", "session_messages", "icmp_errors")] == [
            s["originals"], s["retransmissions"], s["nak_packets"], s["nak_entries"], ncfs, s["session_messages"],
            s["icmp_errors"]]


def test_real_capture_findings(real_runs):
    """The publisher of multi.0/multi.1 on 12091 exited (ICMP port unreachable) while
    10.29.4.101:45241 still NAKed six sequence numbers; both sessions answered with
    'NAK ignored' NCFs; 10.29.4.101:35101 asked for multi.0 only and gets multi.1."""
    _, whole, _ = real_runs
    f = [x for x in whole.tables["findings"] if x["session"]]
    by_kind = Counter(x["kind"] for x in f)
    assert by_kind["unrecoverable loss: source stopped"] == 1 and by_kind["NCF: NAK ignored"] == 2
    assert by_kind["lossy receiver"] == 2 and by_kind["uninteresting topic traffic"] == 1
    stop = next(x for x in f if x["kind"] == "unrecoverable loss: source stopped")
    assert whole.tables["findings"][0] is stop and stop["severity"] == "critical"   # ranked first
    assert stop["session"] == "LBTRM:10.29.4.121:12091:a7f10561:239.101.3.10:14400"
    assert "4689 4731 4781 4855 4894 4997" in stop["finding"] and "8 NAK(s) with ICMP port unreachable" in \
        stop["finding"]
    assert "icmp_errors=8" in stop["evidence"] and "outstanding=6" in stop["evidence"]
    un = next(x for x in f if x["kind"] == "uninteresting topic traffic")
    assert un["contexts"] == "10.29.4.101:35101" and un["topics"] == "29west.example.multi.1"
    assert "2765 messages" in un["finding"]   # 2500 originals and 265 retransmitted messages of multi.1
    assert whole.summary["transport_sessions"] == 2 and whole.summary["transport_nak_packets"] == 295 + 344


# ============================================================== known answers per finding

#: (kind, session name) of every transport finding the generated capture must give
EXPECTED = {
    ("unrecoverable loss: source stopped", "stop"), ("lossy receiver", "stop"),
    ("NAKs in an idle window", "stop"), ("uninteresting topic traffic", "stop"),
    ("NAKs never answered", "ncf"), ("NCF: NAK ignored", "ncf"), ("NCF: NAK shed", "ncf"),
    ("NCF: retransmit delay", "ncf"), ("NCF: do not retry", "ncf"), ("lossy receiver", "ncf"),
    ("lossy receiver", "ru"), ("retransmission rate", "ru"),
    ("slow TCP receiver", "tcp"), ("TCP session reset", "tcp"),
    ("NAK storm", "storm"), ("retransmission rate", "storm"), ("lossy receiver", "storm"), ("idle session", "storm"),
    ("receiver of an unadvertised session", "unadvertised"), ("lossy receiver", "unadvertised"),
    ("retransmission rate", "unadvertised"),
    ("transport bad input", None),
}


@pytest.fixture(scope="module")
def generated_run(spark, tmp_path_factory):
    d = tmp_path_factory.mktemp("gen-tx")
    path = d / "findings.pcap"
    write_transport_findings_capture(path)
    res = run(spark, [path], d / "out", split_size=2048, report=False)
    assert res.decode_partitions > 10
    return path, res


def test_generated_findings_are_the_known_ones(generated_run):
    _, res = generated_run
    names = {v: k for k, v in FINDINGS_SESSIONS.items()}
    got = [(f["kind"], names.get(f["session"])) for f in res.tables["findings"]
           if f["session"] or f["table"].startswith("transport_")]
    assert sorted(got, key=str) == sorted(EXPECTED, key=str) and len(got) == len(EXPECTED)
    assert not any(FINDINGS_SESSIONS["clean"] in f["finding"] for f in res.tables["findings"])


def test_generated_findings_name_their_evidence(generated_run):
    _, res = generated_run
    f = {(x["kind"], x["session"]): x for x in res.tables["findings"]}
    S = FINDINGS_SESSIONS

    def t(sec: float) -> str:
        return _iso(FINDINGS_T0 + sec)

    stop = f[("unrecoverable loss: source stopped", S["stop"])]
    # the receiver first NAKed 95 and 97 at 1.05 s, the last original at 0.99 s: linger 1.05 + 10 - 0.99 s
    assert f"lingered at least {1.05 + NAK_GENERATION_S - 0.99:.1f} s" in stop["finding"]
    assert f"until {t(1.05 + NAK_GENERATION_S)}" in stop["finding"] and "(95 97)" in stop["finding"]
    assert f"last packet at {t(1.2)}" in stop["finding"] and "2 NAK(s) with ICMP port unreachable" in stop["finding"]
    assert (stop["first_seen"], stop["last_seen"]) == (t(1.05), t(2.2))
    assert stop["topics"] == "stop.a | stop.b" and "10.2.0.1:45001" in stop["contexts"]
    never = f[("NAKs never answered", S["ncf"])]
    assert "(5 6 7 8)" in never["finding"]
    assert "transport_lbtrm_nak_backoff_interval" in f[("NCF: NAK ignored", S["ncf"])]["finding"]
    assert "ncf_ignored=2" in f[("NCF: NAK ignored", S["ncf"])]["evidence"]
    assert "retransmit_rate_limit" in f[("NCF: NAK shed", S["ncf"])]["finding"]
    un = f[("uninteresting topic traffic", S["stop"])]
    assert un["contexts"] == "10.2.0.1:40001" and un["topics"] == "stop.b" and "51 messages" in un["finding"]
    assert "its host also sends this session's NAKs (10.2.0.1:45001)" in un["finding"]
    storm = f[("NAK storm", S["storm"])]
    assert "250 NAK packets" in storm["finding"] and storm["first_seen"] == t(6)
    idle = f[("idle session", S["storm"])]
    assert (idle["first_seen"], idle["last_seen"]) == (t(8), t(9))
    assert "zero TCP window in 3 segments" in f[("slow TCP receiver", S["tcp"])]["finding"]
    assert "7.1%" in f[("retransmission rate", S["ru"])]["finding"]
    assert f[("receiver of an unadvertised session", S["unadvertised"])]["contexts"] == "10.2.0.3:45003"


def test_generated_counts_equal_tshark_and_bad_input_is_reported(generated_run):
    path, res = generated_run
    rows = res.tables["transport_sessions"]
    theirs = tshark_lbtrm_counts(path, FINDINGS_DECODE_AS)
    assert {(int(r["session_id"], 16), r["port"]): job_counts(r) for r in rows if r["transport"] == "LBTRM"} \
        == theirs
    assert {r["source"] for r in rows} == set(FINDINGS_SESSIONS.values())
    assert res.tables["transport_errors"] == [dict(kind="bad input", reason="lbtrm_bad_header", count=1),
                                              dict(kind="bad input", reason="lbtrm_nak_list", count=1)]
    bad = tshark_field_rows(path, FINDINGS_DECODE_AS, ["lbtrm.hdr.ver"], "lbtrm && (lbtrm.hdr.ver != 0 || _ws.malformed)")
    assert len(bad) == 2
    assert res.summary["transport_bad_input"] == 2
    # the same tables as one process over the whole capture
    ref = inspect_tables(path)
    assert [without_extras(r) for r in rows] == [as_job_session(s) for s in ref["sessions"]]


def test_uninteresting_topics_name_contexts_not_lbmrd_relays():
    """The rule on tables alone: a context that asked for one topic of a session
    carrying two gets the finding; the same queries heard only from lbmrd's port
    (relayed) name no context and give none; a wildcard pattern that matches the
    other topic satisfies the context."""
    from lbmr_analyze import transport_findings as TF
    src = "LBTRM:10.1.0.1:14390:00000011:239.3.3.1:14400"
    session = dict(session="LBTRM:10.1.0.1:14390:00000011", source=src, topics="a | b", source_contexts="",
                   receivers="ctx:10.2.0.1:40001", first_ts=None, last_ts=None)

    def tables(querier: str, wildcard: bool = False) -> dict:
        return {"transport_sessions": [session | {k: 0 for k in (
                    "originals", "original_bytes", "retransmissions", "retransmission_bytes", "nak_packets",
                    "ncf_no_retry", "ncf_ignored", "ncf_rx_delay", "ncf_shed", "icmp_errors")}],
                "transport_topics": [dict(session=session["session"], tidx=1, topic="a", messages=5, rx_messages=0,
                                          queriers=querier),
                                     dict(session=session["session"], tidx=2, topic="b", messages=7, rx_messages=1,
                                          queriers="")],
                "wildcard_patterns": [dict(pattern="^b$", pattern_type=1, queriers=f"{querier} [0011223344556677]")]
                if wildcard else [],
                "wildcard_matches": [dict(pattern="^b$", pattern_type=1, topic="b")] if wildcard else []}

    (f,) = [x for x in TF.build(tables("10.2.0.1:40001")) if x["kind"] == "uninteresting topic traffic"]
    assert f["contexts"] == "10.2.0.1:40001" and f["topics"] == "b" and "b (8 messages)" in f["finding"]
    assert "uninteresting_messages=8" in f["evidence"] and "messages=13" in f["evidence"]
    assert not [x for x in TF.build(tables("10.0.0.9:15380")) if x["kind"] == "uninteresting topic traffic"]
    assert not [x for x in TF.build(tables("10.2.0.1:40001", wildcard=True))
                if x["kind"] == "uninteresting topic traffic"]


def test_without_transport_pass(spark, generated_run, tmp_path):
    path, _ = generated_run
    res = run(spark, [path], tmp_path / "out", report=False, transport=False)
    assert all(res.tables[n] == [] for n in TRANSPORT_TABLES)
    assert not [f for f in res.tables["findings"] if f["session"] or f["table"].startswith("transport_")]
    assert res.summary["transport_sessions"] == 0 and "transport" not in res.decode_stats


def test_topic_resolution_sent_to_the_tasks_is_bounded(monkeypatch):
    import pyarrow as pa

    from lbmr_analyze import transport as TX
    monkeypatch.setattr(TX, "TR_MAX_ROWS", 3)
    n = 5
    t = pa.table({"us": list(range(n, 0, -1)), "src": ["10.0.0.1"] * n, "sport": [1] * n, "dst": ["239.1.1.1"] * n,
                  "dport": [12965] * n, "payload": [bytes([i]) for i in range(n)]})
    rows, dropped = TX.tr_rows_of({"tr": t, "tr_dropped": pa.table({"dropped": [4], "split": [0]})})
    assert [r[0] for r in rows] == [1, 2, 3] and dropped == 4 + 2
