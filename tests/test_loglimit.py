"""The log limiter (lbmr_runtime.loglimit) on explicit clock values: a kind's
lines up to the bound, then counted; one summary when the window ends; a new
window logs again; the kinds table is bounded."""

from __future__ import annotations

import pytest

from lbmr_runtime.loglimit import OTHER_KINDS, LogDecision, LogLimiter, Suppressed

LOG, SUPPRESS = LogDecision.LOG, LogDecision.SUPPRESS


def test_n_lines_then_suppressed_and_one_summary_at_the_window_end():
    lim = LogLimiter(lines_per_window=3, window_s=10.0)
    got = [lim.admit("uim_malformed", 100.0 + i * 0.1) for i in range(8)]
    assert got == [LOG] * 3 + [SUPPRESS] * 5
    assert lim.next_due() == 110.0
    assert lim.due(109.999) == []
    summaries = lim.due(110.0)
    assert summaries == [Suppressed("uim_malformed", 5, 10.0, 110.0)]
    assert summaries[0].line() == "5 more uim_malformed events suppressed in the last 10 s"
    assert lim.due(200.0) == []  # handed out once
    assert lim.next_due() is None and len(lim) == 0
    assert lim.suppressed_total == 5


def test_a_new_window_logs_again():
    lim = LogLimiter(lines_per_window=2, window_s=5.0)
    assert [lim.admit("k", 0.0) for _ in range(3)] == [LOG, LOG, SUPPRESS]
    assert [s.count for s in lim.due(5.0)] == [1]
    assert [lim.admit("k", 5.0) for _ in range(3)] == [LOG, LOG, SUPPRESS]
    assert lim.next_due() == 10.0


def test_a_window_without_suppressions_ends_without_a_summary():
    lim = LogLimiter(lines_per_window=2, window_s=5.0)
    assert [lim.admit("k", 1.0), lim.admit("k", 2.0)] == [LOG, LOG]
    assert lim.due(6.0) == [] and len(lim) == 0


def test_kinds_are_limited_apart_and_summarised_in_the_order_their_windows_end():
    lim = LogLimiter(lines_per_window=1, window_s=10.0)
    assert [lim.admit("a", 0.0), lim.admit("a", 0.0)] == [LOG, SUPPRESS]
    assert [lim.admit("b", 3.0), lim.admit("b", 3.0), lim.admit("b", 4.0)] == [LOG, SUPPRESS, SUPPRESS]
    assert [(s.kind, s.count) for s in lim.due(10.0)] == [("a", 1)]
    assert lim.next_due() == 13.0
    assert [(s.kind, s.count) for s in lim.due(20.0)] == [("b", 2)]


def test_a_window_stays_closed_to_lines_until_due_closes_it():
    lim = LogLimiter(lines_per_window=1, window_s=1.0)
    assert [lim.admit("k", 0.0), lim.admit("k", 5.0)] == [LOG, SUPPRESS]
    assert [s.count for s in lim.due(5.0)] == [1]


def test_the_kinds_table_is_bounded_and_the_rest_share_one_bucket():
    lim = LogLimiter(lines_per_window=2, window_s=10.0, max_kinds=4)
    for i in range(4):
        assert lim.admit(f"kind{i}", 0.0) is LOG
    # 1,000 new kinds: one bucket of 2 lines between them
    got = [lim.admit(f"new{i}", 1.0) for i in range(1000)]
    assert got.count(LOG) == 2 and got.count(SUPPRESS) == 998
    assert len(lim) == 5
    assert lim.admit("kind0", 1.0) is LOG  # a kind in the table keeps its own window
    assert [(s.kind, s.count) for s in lim.due(11.0)] == [(OTHER_KINDS, 998)]
    assert len(lim) == 0
    assert lim.admit("new7", 12.0) is LOG and len(lim) == 1  # room again: a window of its own


@pytest.mark.parametrize("args", [(0, 10.0, 256), (20, 0.0, 256), (20, 10.0, 0)])
def test_a_limit_that_cannot_work_is_refused(args):
    with pytest.raises(ValueError):
        LogLimiter(*args)
