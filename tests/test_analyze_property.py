"""lbmr-analyze on any capture the decoder accepts: generated captures (hypothesis)
with and without packet options (src_id, source type, local domain), header
versions 0 and 1, direct and lbmrd-relayed traffic through several lbmrds,
storms, empty hours and single records.  On every one the pipeline finishes, its
tables equal the plain-Python reference of tests/test_analyze.py, and no finding
claims what the generated traffic does not hold (a "one context" claim needs a
context that really did it).

The pipeline's pure parts (decoding tasks, partial aggregates, the second pass run
in this process, the tables and findings) run on many examples; the whole Spark
job on a few, on one SparkSession for the module.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import lbmr_proto as L
from lbmr_analyze import partials as P
from lbmr_analyze import splits as S
from lbmr_analyze.job import analyse, build_session, run
from lbmr_analyze.rows import write_split
from tests.test_analyze import PORTS, T0, _ref_for, assert_tables_equal, write_pcap

STORM = 5


def pure_analyse(cap: Path, out: Path, *, storm: int = STORM, top: int = 20) -> tuple[dict, dict]:
    """The job without Spark: each split decoded to Parquet with its partial
    aggregates (as a decoding task does), the second pass in this process."""
    parts: list = []
    records = out / "records"
    for s in S.plan([str(cap)]):
        write_split(s, frozenset(PORTS), b"", str(records), partials=parts)
    return analyse(None, str(records), P.merge(parts), storm_threshold=storm, top=top)


@pytest.fixture(scope="module")
def spark():
    s = build_session("local[2]", [("spark.sql.shuffle.partitions", "2"), ("spark.ui.enabled", "false")],
                      progress_bar=False)
    yield s
    s.stop()


# ============================================================== no source-id option, a storm second

def no_src_id_storm() -> list[tuple]:
    """A pre-6 UM capture: no packet carries options; a storm second of TQRs from two
    contexts, one relayed by lbmrd, and a TIR answering them."""
    q = L.encode(L.Packet(tqrs=[L.TQR("A")]))
    d = [(T0 + 0.001 * i, "10.4.4.4", 14402, "239.101.3.1", 12965, q) for i in range(6)]
    d += [(T0 + 0.5 + 0.001 * i, "10.0.0.1", 15380, "10.1.1.5", 14402, q) for i in range(3)]
    d.append((T0 + 1.5, "10.1.1.10", 14402, "239.101.3.1", 12965,
              L.encode(L.Packet(tirs=[L.TIR("A", L.TcpTransport("10.1.1.10", 14371), 16, 1)]))))
    return d


def test_storm_without_src_id_pure(tmp_path):
    cap = write_pcap(tmp_path / "old.pcap", no_src_id_storm())
    summary, t = pure_analyse(cap, tmp_path)
    assert_tables_equal(t, _ref_for(cap, ports=PORTS, storm=STORM))
    assert [(r["context"], r["src_id"], r["packets"]) for r in t["storm_contexts"]] == \
        [("10.4.4.4:14402", None, 6), ("10.0.0.1:15380", None, 3)]
    assert summary["storm_seconds"] == 1


def test_storm_without_src_id_spark(spark, tmp_path):
    cap = write_pcap(tmp_path / "old.pcap", no_src_id_storm())
    res = run(spark, [cap], tmp_path / "out", storm_threshold=STORM, report=False)
    assert_tables_equal(res.tables, _ref_for(cap, ports=PORTS, storm=STORM))
    assert [f["kind"] for f in res.tables["findings"]].count("storm") == 1
