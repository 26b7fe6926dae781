"""router.core.wildcard: patterns from the wire matched without backtracking, with
``re.search``'s answers."""

from __future__ import annotations

import random
import re
import time

import pytest

from router.core.wildcard import MAX_PATTERN, Matcher, PatternError

PATTERNS = [r"^md\..*", r"^(a+)+$", r"a|b", r"^md\.(quotes|trades)\.[0-9]+$", r"x*", r"", r"\bfoo\b",
            r"[^a-c]z", r"(?i)MD\.[A-Z]+", r"a{2,3}b", r"a{2}", r"a*?b", r".", r"^$", r"\d+\s\w",
            r"ab|cd|ef$", r"(a|ab)(c|bcd)(d*)", r"[\w.]+@x", r"a$", r"(?s).x", r"[A-Z]", r"\Aab\Z", r"\Bb"]
TEXTS = ["", "md.quotes.1", "aaaa", "aaaa!", "md.trades.22x", "a foo b", "xz", "zz", "MD.ABC", "aab", "aaab",
         "b", "\n", "1 a", "ef", "abcd", "u.v@x", "a\n", "\nx", "Q", "ab", "abb"]


def test_same_answers_as_re():
    for p in PATTERNS:
        m, r = Matcher(p), re.compile(p)
        for t in TEXTS:
            assert m.search(t) == (r.search(t) is not None), (p, t)


def test_random_patterns_agree_with_re():
    rnd = random.Random(11)
    atoms = ["a", "b", "(", ")", "|", "*", "+", "?", ".", "[ab]", "[^a]", "^", "$", "{1,2}", "*?"]
    checked = 0
    for _ in range(3000):
        p = "".join(rnd.choice(atoms) for _ in range(rnd.randint(1, 8)))
        try:
            r = re.compile(p)
            m = Matcher(p)
        except (re.error, PatternError):
            continue
        checked += 1
        for t in ["", "a", "ab", "ba", "aab", "bbb", "abab", "b\n"]:
            assert m.search(t) == (r.search(t) is not None), (p, t)
    assert checked > 500


def test_catastrophic_patterns_are_linear():
    t0 = time.perf_counter()
    for p in (r"^(a+)+$", r"^(a|a)*$", r"^(a*)*b$", r"(x+x+)+y"):
        assert not Matcher(p).search("a" * 200 + "!")
    assert time.perf_counter() - t0 < 2.0


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=a)", r"(?<!a)b", r"(a{100}){100}", "a" * (MAX_PATTERN + 1),
                                     r"a++", r"(?>a)", r"(?i:a)b", r"(", r"(?x)a"])
def test_refused(pattern):
    with pytest.raises(PatternError):
        Matcher(pattern)
