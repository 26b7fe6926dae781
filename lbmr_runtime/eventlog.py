"""A daemon's per-input log lines through a :class:`~lbmr_runtime.loglimit.LogLimiter`,
on trio's clock: :class:`LimitedLog` logs or counts each line and logs the
summaries when windows end (:meth:`LimitedLog.serve`, a task in the daemon's
nursery, so a summary needs no later event)."""

from __future__ import annotations

import logging

import trio

from .loglimit import LogDecision, LogLimiter

__all__ = ["LimitedLog"]


class LimitedLog:
    """Lines of ``logger`` at ``level`` limited per kind by ``limit``; its
    summary lines go to the same logger at the same level. While the logger
    does not log ``level``, lines are neither logged nor counted."""

    def __init__(self, logger: logging.Logger, limit: LogLimiter, level: int = logging.INFO) -> None:
        self.logger, self.limit, self.level = logger, limit, level

    def line(self, now: float, kind: str, msg: str, *args) -> None:
        """One ``msg % args`` line of ``kind`` at ``now`` (trio's clock,
        seconds), after the summaries of the windows ended by then."""
        if not self.logger.isEnabledFor(self.level):
            return
        self.summaries(now)
        if self.limit.admit(kind, now) is LogDecision.LOG:
            self.logger.log(self.level, msg, *args)

    def summaries(self, now: float) -> None:
        """Log the summary of each window ended by ``now`` (seconds) that left lines out."""
        for s in self.limit.due(now):
            self.logger.log(self.level, "%s", s.line())

    async def serve(self) -> None:
        """Log summaries as their windows end; runs until cancelled."""
        limit = self.limit
        while True:
            due = limit.next_due()
            await trio.sleep_until(due if due is not None else trio.current_time() + limit.window_s)
            self.summaries(trio.current_time())
