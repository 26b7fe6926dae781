"""ACL benchmark: the cost of a portal ACL decision (router/core/acl.py).

    python bench/acl.py [--topics 20000]

Measured in one run, each figure as a ratio to a baseline of the same run:

1. cold: decisions for --topics distinct topics (every one a cache miss, the
   patterns run on the non-backtracking matcher) against Python's ``re``
   running the same patterns in the same first-match loop (the backtracking
   engine the router must not use on wire topics);
2. warm: the same topics again (cached topic-condition results) against a
   plain dict look-up per topic;
3. worst case: a list at the state budget (MAX_ACL_STATES) whose patterns
   keep every state alive, against topics of MAX_TOPIC_CHARS characters:
   the bound on one decision that a hostile stream of distinct topics can
   force, against the typical cold decision.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from router.core.acl import (  # noqa: E402
    MAX_ACL_STATES,
    MAX_TOPIC_CHARS,
    Ace,
    Acl,
    Action,
    Direction,
    TopicIs,
    TopicPattern,
)

PATTERNS = [  # a plausible inbound list: specific rejects, then accepts
    (Action.REJECT, r"^md\.test\."),
    (Action.ACCEPT, "health_check"),
    (Action.REJECT, r"^USER\.(?!x)"),
    (Action.ACCEPT, r"^md\.(eq|fx|fi)\.[A-Z]{2,4}\.[0-9]+$"),
    (Action.ACCEPT, r"^orders/(us|eu|ap)/"),
    (Action.REJECT, r"internal"),
    (Action.ACCEPT, r"^ref\..*\.snapshot$"),
]


def build_acl() -> tuple[Acl, list]:
    entries, plain = [], []
    for action, text in PATTERNS:
        if text == "health_check":
            entries.append(Ace(action, (TopicIs(text),)))
            plain.append((action, None, text))
            continue
        try:
            entries.append(Ace(action, (TopicPattern(text),)))
        except ValueError:  # look-ahead: refused by the matcher, dropped from both
            continue
        plain.append((action, re.compile(text), None))
    return Acl(entries, Direction.INBOUND), plain


def topics(n: int, salt: str) -> list[str]:
    kinds = ("md.eq.IBM.{i}", "md.fx.EUR.{i}", "md.test.{i}", "orders/eu/{i}", "ref.{i}.snapshot",
             "other.{i}.internal", "misc/{i}/x")
    return [kinds[i % len(kinds)].format(i=f"{salt}{i}") for i in range(n)]


def re_decide(plain, topic: str) -> bool:
    for action, rx, exact in plain:
        if (rx.search(topic) if rx is not None else topic == exact):
            return action is Action.ACCEPT
    return False


def rate(fn, items) -> float:
    t0 = time.perf_counter()
    for t in items:
        fn(t)
    return len(items) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--topics", type=int, default=20000)
    args = ap.parse_args()
    acl, plain = build_acl()
    names = topics(args.topics, "a")
    agree = sum(acl.allows(t) == re_decide(plain, t) for t in names[:2000])
    assert agree == min(2000, len(names)), "the matcher and re disagree"

    acl, _ = build_acl()  # fresh cache
    cold = rate(acl.allows, names)
    base_re = rate(lambda t: re_decide(plain, t), names)
    warm = rate(acl.allows, names[-4000:])
    lookup = {t: True for t in names}
    base_dict = rate(lookup.__getitem__, names[-4000:])

    # worst case: every state alive at every character, at the budget
    copies = MAX_ACL_STATES // 2 - 2  # (.?) is 2 states a copy
    worst = Acl([Ace(Action.ACCEPT, (TopicPattern(f"(.?){{{copies}}}!"),))], Direction.INBOUND)
    long_topics = [f"{i:08d}" + "x" * (MAX_TOPIC_CHARS - 9) + "!" for i in range(20)]  # matches at the end
    worst_rate = rate(worst.allows, long_topics)

    print(f"ACL decisions, {len(acl.entries)} entries, {len(names)} distinct topics")
    print(f"  cold (matcher)        {cold:10.0f}/s   re baseline {base_re:10.0f}/s   "
          f"ratio {cold / base_re:.2f}")
    print(f"  warm (cached)         {warm:10.0f}/s   dict baseline {base_dict:8.0f}/s   "
          f"ratio {warm / base_dict:.2f}")
    print(f"  worst case ({MAX_ACL_STATES} states, {MAX_TOPIC_CHARS}-char topics) "
          f"{worst_rate:8.1f}/s = {1000 / worst_rate:.1f} ms per decision; "
          f"{cold / worst_rate:.0f}x a typical cold decision")


if __name__ == "__main__":
    main()
