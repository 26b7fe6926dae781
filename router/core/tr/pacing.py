"""Pacing of what a portal sends: the DRO's ``<rate-limit>`` (:class:`RatePacer`,
objects and bits a second), the query rates (:class:`Pacer`), the 20 ms steps
that held-back queries share (:func:`query_step`) and what an INTEREST
REFRESH frame costs on the peer link (:func:`interest_frame_size`). Times are
seconds on the portal's clock.
"""

from __future__ import annotations

import math

from lbmr_proto.um import EPS

__all__ = ["RatePacer", "Pacer", "QUERY_STEP", "query_step", "INTEREST_FRAME_OVERHEAD",
           "interest_frame_size"]

#: Seconds: a query held back by the query rates goes at the next multiple of this
#: (never earlier than its slot), with every other query of that step in one datagram.
QUERY_STEP = 0.02

#: Bytes of an LBRP INTEREST frame besides its topic's UTF-8 bytes: the 12-byte
#: frame header, action, pattern type, domain id (4) and the topic's 2-byte length
#: (:class:`router.peerlink.Interest`; a test checks the two agree).
INTEREST_FRAME_OVERHEAD = 20


def interest_frame_size(topic: str) -> int:
    """Bytes of the INTEREST frame for ``topic`` (what a refresh costs on the link)."""
    return INTEREST_FRAME_OVERHEAD + len(topic.encode("utf-8", "surrogateescape"))


def query_step(at: float) -> float:
    """When a query whose paced slot is ``at`` goes: the next multiple of
    ``QUERY_STEP`` seconds (with the other queries of that step)."""
    return math.ceil(at / QUERY_STEP - EPS) * QUERY_STEP


class RatePacer:
    """The DRO's ``<rate-limit>``: at most ``per_second`` objects and ``bps`` bits
    a second (0: no limit of that kind).

    One virtual clock per limit (the generic cell rate algorithm): an object
    advances it by its cost (``1/per_second`` seconds, or its bits / ``bps``);
    an object may go once every clock has reached now; a clock never lags now
    by more than its slack, which bounds a burst to ``burst`` objects and to a
    tenth of a second's bits (at least ``burst_bytes``, one datagram)."""

    __slots__ = ("gap", "obj_slack", "obj_next", "bit_time", "bit_slack", "bit_next")

    def __init__(self, limit: tuple[float, float], burst: int, burst_bytes: int) -> None:
        bps, per_second = limit
        if not (0 <= bps < math.inf and 0 <= per_second < math.inf):
            raise ValueError(f"rate limit (bps, per second) must be >= 0 and finite, not {limit!r}")
        self.gap = 1.0 / per_second if per_second else 0.0
        self.obj_slack = burst * self.gap
        self.obj_next = -math.inf
        self.bit_time = 1.0 / bps if bps else 0.0  # seconds a bit
        self.bit_slack = max(0.1, 8 * burst_bytes * self.bit_time) if bps else 0.0
        self.bit_next = -math.inf

    def reserve(self, now: float, nbytes: int, deferred_extra: int = 0) -> float:
        """Charge one object of ``nbytes`` bytes (``deferred_extra`` more if it
        must wait: it will go alone, in a datagram of its own) and return when
        it may go (``<= now + EPS``: at once; later: the slot now reserved for it)."""
        at = -math.inf
        if self.gap:
            at = max(self.obj_next, now - self.obj_slack)
        if self.bit_time:
            at = max(at, self.bit_next, now - self.bit_slack)
        t = max(at, now)
        if self.gap:
            self.obj_next = max(self.obj_next, t - self.obj_slack) + self.gap
        if self.bit_time:
            if at > now + EPS:
                nbytes += deferred_extra
            self.bit_next = max(self.bit_next, t - self.bit_slack) + 8 * nbytes * self.bit_time
        return at

    def charge(self, now: float, nbytes: int) -> None:
        """Charge ``nbytes`` more bytes sent at ``now`` (bits only: datagram headers)."""
        if self.bit_time:
            self.bit_next = max(self.bit_next, now - self.bit_slack) + 8 * nbytes * self.bit_time


class Pacer:
    """At most ``rate`` events a second, in bursts of at most ``burst``."""

    __slots__ = ("gap", "slack", "next")

    def __init__(self, rate: float, burst: int) -> None:
        self.gap = 1.0 / rate
        self.slack = burst * self.gap
        self.next = -math.inf

    def free_at(self, now: float) -> float:
        """When the next event may happen (``<= now``: at once)."""
        return max(self.next, now - self.slack)
