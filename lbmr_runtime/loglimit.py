"""A sans-IO limit on a daemon's log lines per event kind.

Many of a daemon's events come from hostile input (a garbage connection, a
refused stream, a malformed datagram); one log line each would let a sender
fill the disk. :class:`LogLimiter` lets at most ``lines_per_window`` lines of
one kind through per window of ``window_s`` seconds; the rest are counted, and
when the window ends the caller gets one :class:`Suppressed` summary per kind
that lost lines. It does no IO and reads no clock: every call takes ``now``,
seconds of the caller's clock (trio's, in the daemons).

One window per kind opens at that kind's first event and lasts ``window_s``
seconds; a kind's entry is dropped when its window ends, so the table holds
only the kinds seen in the last window, at most ``max_kinds`` of them; kinds
beyond that share one bucket, :data:`OTHER_KINDS` (so at most ``max_kinds + 1``
entries).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["LogLimiter", "LogDecision", "Suppressed", "OTHER_KINDS", "SUMMARY_FORMAT"]

#: the kind the shared bucket's summary names (kinds beyond the table's bound)
OTHER_KINDS = "(other kinds)"

#: a summary line: count suppressed, the kind, the window in seconds
SUMMARY_FORMAT = "%d more %s events suppressed in the last %g s"


class LogDecision(enum.Enum):
    """What to do with one event's log line."""

    LOG = "log"
    SUPPRESS = "suppress"


@dataclass(frozen=True, slots=True)
class Suppressed:
    """``count`` lines of ``kind`` suppressed in the window of ``window_s``
    seconds that ended at ``ended`` (seconds of the caller's clock)."""

    kind: str
    count: int
    window_s: float
    ended: float

    def line(self) -> str:
        """The summary line (:data:`SUMMARY_FORMAT`)."""
        return SUMMARY_FORMAT % (self.count, self.kind, self.window_s)


class _Window:
    __slots__ = ("end", "logged", "suppressed")

    def __init__(self, end: float) -> None:
        self.end = end
        self.logged = 0
        self.suppressed = 0


class LogLimiter:
    """At most ``lines_per_window`` log lines per event kind per window of
    ``window_s`` seconds; at most ``max_kinds`` kinds with their own window
    (the rest share :data:`OTHER_KINDS`).

    Inputs: :meth:`admit` per event; outputs: its :class:`LogDecision`, and the
    :class:`Suppressed` summaries :meth:`due` hands out once windows end (call
    it on each event and by :meth:`next_due`, so that a summary comes even if
    no later event of its kind does)."""

    def __init__(self, lines_per_window: int = 20, window_s: float = 10.0, max_kinds: int = 256) -> None:
        if lines_per_window < 1 or window_s <= 0 or max_kinds < 1:
            raise ValueError("a log limit needs at least 1 line, a window over 0 s and at least 1 kind")
        self.lines_per_window = lines_per_window
        self.window_s = float(window_s)
        self.max_kinds = max_kinds
        # kind -> its open window; insertion order is the order windows opened, and
        # every window lasts window_s, so it is also the order they end
        self._windows: dict[str, _Window] = {}
        self.suppressed_total = 0  # lines suppressed since the start

    def __len__(self) -> int:
        """The kinds with an open window (the shared bucket counts as one)."""
        return len(self._windows)

    def admit(self, kind: str, now: float) -> LogDecision:
        """The decision for one event of ``kind`` at ``now`` (seconds). A
        window stays open until :meth:`due` closes it: call ``due(now)`` first
        so that an ended window's summary is handed out and its kind starts a
        new window."""
        key = kind if kind in self._windows or len(self._windows) < self.max_kinds else OTHER_KINDS
        w = self._windows.get(key)
        if w is None:
            w = self._windows[key] = _Window(now + self.window_s)
        if w.logged < self.lines_per_window:
            w.logged += 1
            return LogDecision.LOG
        w.suppressed += 1
        self.suppressed_total += 1
        return LogDecision.SUPPRESS

    def due(self, now: float) -> list[Suppressed]:
        """Close the windows that ended by ``now`` (seconds) and return a
        summary for each of them that suppressed lines, oldest first."""
        out: list[Suppressed] = []
        windows = self._windows
        while windows:
            key = next(iter(windows))
            w = windows[key]
            if now < w.end:
                break
            del windows[key]
            if w.suppressed:
                out.append(Suppressed(key, w.suppressed, self.window_s, w.end))
        return out

    def next_due(self) -> float | None:
        """When the next window ends (seconds of the caller's clock), or None
        if none is open."""
        for w in self._windows.values():
            return w.end
        return None
