"""What the benchmarks share to time their runs, in this process."""

from __future__ import annotations

import time


def best_of(fn, runs: int = 3) -> float:
    """The fastest of ``runs`` calls of ``fn``, in seconds (wall clock)."""
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
