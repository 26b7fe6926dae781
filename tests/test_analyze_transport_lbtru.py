"""lbmr-analyze's transport pass (without Spark: the job's functions in this
process) on an LBT-RU session advertised by TIRs without session id while its
datagrams carry one, with a receiver that leaves while the source still sends
to it (its host answers with ICMP port unreachable), and optionally a source
that exits while a receiver NAKs: the session is the advertised one, whole
and cut into byte ranges; ICMP errors quoting the source's datagrams make a
"closed receiver" finding, never a stopped source; those quoting a NAK do."""

from __future__ import annotations

import pytest

from tests.analyze_reference import analyse_without_spark
from tests.transport_captures import (
    UNNAMED_RU_GONE,
    UNNAMED_RU_LEAVES,
    UNNAMED_RU_STAYS,
    write_unnamed_lbtru_capture,
)

SOURCE = "LBTRU:10.3.0.1:14380:5eed0001"


@pytest.mark.parametrize("source_exits", [False, True])
def test_unnamed_tir_session_and_icmp_direction(tmp_path, source_exits):
    cap = tmp_path / "ru.pcap"
    write_unnamed_lbtru_capture(cap, source_exits=source_exits)
    whole = analyse_without_spark(cap, tmp_path / "whole", 1 << 20)[1]
    cut = analyse_without_spark(cap, tmp_path / "cut", 512)[1]  # many byte ranges
    for t in (whole, cut):
        (s,) = t["transport_sessions"]
        assert s["source"] == SOURCE and s["from_tir"] and s["topics"] == "ru.plain | ru.other"
        assert (s["originals"], s["icmp_errors"], s["receiver_icmp_errors"]) == (
            16, int(source_exits), UNNAMED_RU_GONE)
        recv = {r["receiver"]: r for r in t["transport_receivers"]}
        leaves, stays = ("{}:{}".format(*a) for a in (UNNAMED_RU_LEAVES, UNNAMED_RU_STAYS))
        assert (recv[leaves]["icmp_errors"], recv[stays]["icmp_errors"]) == (UNNAMED_RU_GONE, 0)
        # the timeline and icmp_first/_last count only errors quoting datagrams sent to the source
        assert sum(x["icmp_errors"] for x in t["transport_timeline"]) == s["icmp_errors"]
        assert (s["icmp_first"] is not None) == source_exits
        kinds = {f["kind"]: f for f in t["findings"] if f["session"]}
        assert "receiver of an unadvertised session" not in kinds
        gone = kinds["datagrams to a closed receiver"]
        assert gone["severity"] == "low" and gone["session"] == SOURCE and f"receiver {leaves} " in gone["finding"]
        assert gone["evidence"] == f"receiver_icmp_errors={UNNAMED_RU_GONE}"
        assert "transport_lbtru_client_activity_timeout" in gone["finding"]
        assert ("NAKs to a stopped source" in kinds) == source_exits
        assert "unrecoverable loss: source stopped" not in kinds
        if source_exits:
            assert kinds["NAKs to a stopped source"]["evidence"].startswith("icmp_errors=1,")
    assert whole["transport_sessions"] == cut["transport_sessions"]
    assert whole["transport_receivers"] == cut["transport_receivers"]
    assert whole["transport_topics"] == cut["transport_topics"]
