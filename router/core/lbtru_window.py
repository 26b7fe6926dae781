"""The retransmission windows of an endpoint's LBT-RU proxies, together,
sans-IO: a budget of payload bytes (:class:`WindowBudget`) the proxies
(:class:`router.core.lbtru_fanout.RuFanout`) of one endpoint share, each cut
to a fair share while they are over it."""

from __future__ import annotations

from typing import Protocol

__all__ = ["WindowBudget", "WindowMember", "ENDPOINT_WINDOW_BYTES"]

ENDPOINT_WINDOW_BYTES = 256 << 20  # payload bytes all the proxies of one endpoint keep


class WindowMember(Protocol):
    """A proxy sharing a :class:`WindowBudget`: its window's payload by sequence
    (``buffer``), their bytes (``buffer_bytes``), and :meth:`evict_oldest`."""

    buffer: dict[int, bytes]
    buffer_bytes: int

    def evict_oldest(self) -> None: ...


class WindowBudget:
    """The payload bytes the LBT-RU proxies of one endpoint keep, together:
    at most ``limit``, or ``MIN_SHARE`` a proxy when there are so many that
    that is more. While they are over, each is cut to its fair share (the
    limit over the number of proxies): the one adding data first, then the
    others above their share, oldest data first. ``used``: bytes kept now."""

    MIN_SHARE = 64 << 10  # bytes a proxy may always keep

    def __init__(self, limit: int = ENDPOINT_WINDOW_BYTES) -> None:
        if limit < 1:
            raise ValueError("window budget must be positive")
        self.limit = limit
        self.used = 0
        self.members: list[WindowMember] = []
        self._cursor = 0

    def fair(self) -> int:
        """The bytes one proxy may keep while the budget is over."""
        return max(self.MIN_SHARE, self.limit // max(1, len(self.members)))

    def reclaim(self) -> None:
        """Trim the proxies above their fair share (round robin, each proxy
        looked at once per call) until the budget holds."""
        fair = self.fair()
        for _ in range(len(self.members)):
            if self.used <= self.limit:
                return
            self._cursor %= len(self.members)
            m = self.members[self._cursor]
            self._cursor += 1
            while m.buffer and m.buffer_bytes > fair and self.used > self.limit:
                m.evict_oldest()
