"""The recent-events ring of a daemon: the last N ``(time, kind, detail)``
entries (time in seconds of the daemon's clock), shown by SIGUSR1 dumps and
``/status``."""

from __future__ import annotations

from collections import deque


class EventRing(deque):
    """A bounded deque of ``(time_s, kind, detail)`` tuples."""

    def __init__(self, size: int = 1000) -> None:
        super().__init__(maxlen=size)

    def add(self, now: float, kind: str, detail: str) -> None:
        self.append((now, kind, detail))

    def dump(self, now: float) -> list[dict]:
        """The entries as plain data, oldest first, with their age in seconds."""
        return [{"age_s": round(now - t, 3), "event": k, "detail": d} for t, k, d in self]
