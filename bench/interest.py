"""Interest index benchmark: matching topics against many patterns
(router/core/interest.py).

    python bench/interest.py [--patterns 1000] [--topics 500] [--rounds 5]

Measured in one run, each figure as a ratio to a baseline of the same run:
the baseline asks every pattern's matcher about every topic on every call
(what a set of patterns without the index does: each TIR of a source asks
again whether remote interest wants its topic).

1. hot: --topics topics asked about --rounds times (sources advertising
   every second) against --patterns wire-like patterns;
2. after a change: one pattern added and one removed between rounds; the
   index searches the new pattern alone for each hot topic;
3. flood: distinct topics, each asked about once (every one a cache miss):
   the literal hints spare searches, the cache's bookkeeping costs a little.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from router.core.interest import InterestIndex, Pattern  # noqa: E402


def wire_patterns(n: int) -> list[Pattern]:
    """Patterns of the kinds receivers use: anchored prefixes, suffixes, alternations."""
    kinds = (r"^md\.eq\.{i}\.", r"\.{i}$", r"^(orders|fills)/{i}/", r"^ref\..*\.{i}\.snapshot$", r"q{i}[0-9]+")
    return [Pattern(kinds[i % len(kinds)].format(i=f"k{i}")) for i in range(n)]


def topics(n: int, salt: str) -> list[str]:
    kinds = ("md.eq.k{i}.IBM", "x.y.k{i}", "orders/k{i}/eu", "ref.a.k{i}.snapshot", "qk{i}77", "other.{s}{i}")
    return [kinds[i % len(kinds)].format(i=i, s=salt) for i in range(n)]


def per_call(patterns: list[Pattern], topic: str) -> bool:
    return any(p.matcher.search(topic) for p in patterns)


def timed(fn, items, rounds: int = 1) -> float:
    """Seconds for ``rounds`` passes of ``fn`` over ``items``."""
    t0 = time.perf_counter()
    for _ in range(rounds):
        for t in items:
            fn(t)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--patterns", type=int, default=1000)
    ap.add_argument("--topics", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    pats = wire_patterns(args.patterns)
    index: InterestIndex[int] = InterestIndex()
    for i, p in enumerate(pats):
        index.add(i, p)
    hot = topics(args.topics, "h")
    assert all(index.wants(t) == per_call(pats, t) for t in hot[:200]), "the index and the matchers disagree"

    base = timed(lambda t: per_call(pats, t), hot, args.rounds)
    got = timed(index.wants, hot, args.rounds)

    extra = Pattern(r"^md\.")
    changed = 0.0
    for r in range(args.rounds):
        index.add(-1 - r, extra if r % 2 == 0 else Pattern(rf"\.k{r}$"))
        index.remove(r)
        changed += timed(index.wants, hot)
    flood = topics(args.topics * args.rounds, "f")
    flood_base = timed(lambda t: per_call(pats, t), flood)
    flood_got = timed(index.wants, flood)

    n = args.topics * args.rounds
    print(f"interest index: {args.patterns} patterns, {args.topics} hot topics x {args.rounds} rounds")
    print(f"  hot            {got / n * 1e6:9.2f} us/topic   per-call baseline {base / n * 1e6:9.2f} us   "
          f"ratio {base / got:8.1f}x faster")
    print(f"  after a change {changed / n * 1e6:9.2f} us/topic   per-call baseline {base / n * 1e6:9.2f} us   "
          f"ratio {base / changed:8.1f}x faster")
    print(f"  flood          {flood_got / n * 1e6:9.2f} us/topic   per-call baseline {flood_base / n * 1e6:9.2f} us   "
          f"ratio {flood_base / flood_got:8.2f}")
    print(f"  cache: {len(index.cache)} topics, {index.cache.facts} facts, {index.cache.evicted} evicted")


if __name__ == "__main__":
    main()
