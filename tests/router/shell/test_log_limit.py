"""The router's event log lines are bounded per kind (router.shell.router
log_event over lbmr_runtime.loglimit), on trio's virtual clock: a burst of
events logs LOG_LINES_PER_WINDOW lines and one summary when the window ends,
with no later event needed; the event ring and counters see every event."""

from __future__ import annotations

import logging

import trio

from router.config.model import acceptor_peer, multicast_endpoint, router_config
from router.shell import router as R
from tests.helpers import free_port


async def _router(n):
    ep = multicast_endpoint("M", 1, "239.192.7.3", free_port(), interface="127.0.0.1")
    router = R.MultiRouter(router_config("r", [ep], [acceptor_peer("p", 0, interface="127.0.0.1")]))
    await n.start(router.run)
    return router


def _lines(caplog, text):
    return [(r.created, r.getMessage()) for r in caplog.records if text in r.getMessage()]


async def test_a_burst_of_one_kind_logs_the_bound_and_one_summary_after_the_window(autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="lbmr-router")
    async with trio.open_nursery() as n:
        router = await _router(n)
        unit = router.links[0]
        t0 = trio.current_time()
        for i in range(10_000):
            unit.event("uim_malformed", f"garbage {i}")
        assert len(unit.events) == 1000 and unit.events[-1][2] == "garbage 9999"  # the ring sees all
        lines = [m for _, m in _lines(caplog, "uim_malformed")]
        assert lines == [f"uim_malformed garbage {i}" for i in range(R.LOG_LINES_PER_WINDOW)]
        await trio.sleep(R.LOG_WINDOW - 0.5)
        assert not _lines(caplog, "suppressed")
        await trio.sleep(1.0)  # the window ended: its summary, though no event came since
        summary = f"{10_000 - R.LOG_LINES_PER_WINDOW} more uim_malformed events suppressed in the last 10 s"
        assert [m for _, m in _lines(caplog, "suppressed")] == [summary]
        assert trio.current_time() - t0 >= R.LOG_WINDOW
        assert f"lbmr_router_log_lines_suppressed_total {10_000 - R.LOG_LINES_PER_WINDOW}" in router.prometheus_text()
        # a new window logs again; a quiet window leaves no summary
        for i in range(5):
            unit.event("uim_malformed", f"later {i}")
        await trio.sleep(3 * R.LOG_WINDOW)
        assert len(_lines(caplog, "uim_malformed")) == R.LOG_LINES_PER_WINDOW + 5 + 1
        n.cancel_scope.cancel()


async def test_units_and_uim_events_share_the_router_s_limit(autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="lbmr-router")
    async with trio.open_nursery() as n:
        router = await _router(n)
        unit = router.links[0]
        for i in range(50):
            unit.event("peer_refused", str(i))
            router._uim_event("peer_refused", str(i))
            router._uim_event("uim_stream_refused", str(i))
        assert len(router.uim_events) == 100
        assert len(_lines(caplog, "peer_refused ")) == R.LOG_LINES_PER_WINDOW
        assert len(_lines(caplog, "uim_stream_refused ")) == R.LOG_LINES_PER_WINDOW
        await trio.sleep(R.LOG_WINDOW + 0.1)  # past the window's end (the summary task wakes at it)
        assert sorted(m for _, m in _lines(caplog, "suppressed")) == [
            "30 more uim_stream_refused events suppressed in the last 10 s",
            "80 more peer_refused events suppressed in the last 10 s"]
        n.cancel_scope.cancel()
