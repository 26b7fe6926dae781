"""router.core.interest: one index of exact topics and wildcard patterns, its
answers checked against a brute-force reference, its cache's invalidation and
bounds, and hostile patterns."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from router.core.interest import (
    CACHE_FACTS,
    CACHE_TOPICS,
    MAX_CACHED_TOPIC,
    MAX_HELD_STATES,
    PATTERN_PCRE,
    PATTERN_REGEX,
    PATTERN_TOPIC,
    InterestIndex,
    Pattern,
    interest_of,
    literal_hints,
)
from router.core.wildcard import MAX_PATTERN, Matcher, PatternError

ATOMS = ["a", "b", "x", r"\.", ".", "^", "$", "*", "+", "?", "|", "(", ")", "[ab]", "[^a]", "{1,2}", r"\d", "1"]
TOPIC_CHARS = "abx.1"

patterns = st.lists(st.sampled_from(ATOMS), min_size=1, max_size=7).map("".join)
topics = st.text(TOPIC_CHARS, max_size=8)


def compiles(source: str) -> bool:
    try:
        re.compile(source)
        Pattern(source)
    except (re.error, PatternError):
        return False
    return True


@pytest.fixture
def searches(monkeypatch):
    """Every matcher search, as (pattern, topic)."""
    done: list[tuple[str, str]] = []
    real = Matcher.search
    monkeypatch.setattr(Matcher, "search", lambda self, text: done.append((self.pattern, text)) or real(self, text))
    return done


# --------------------------------------------------------------------------- answers


@given(patterns, topics)
def test_literal_hints_hold_for_every_match(source, topic):
    assume(compiles(source))
    prefix, run = literal_hints(source)
    if re.search(source, topic):
        assert topic.startswith(prefix) and run in topic
    assert Pattern(source).search(topic) == (re.search(source, topic) is not None)


def test_literal_hints_examples():
    assert literal_hints(r"^md\.q\.0000") == ("md.q.0000", "md.q.0000")
    assert literal_hints(r"q\.\d+\.x$") == ("", "q.")
    assert literal_hints(r"\bfoo") == ("", "foo")
    assert literal_hints("(?i)^MD") == ("", "")
    assert literal_hints("^x|y") == ("", "")
    assert literal_hints("(.?){990}x") == ("", "")
    assert literal_hints("ab*c") == ("", "a")


SOME_TOPICS = st.sampled_from(["", "a", "ab", "a.b", "xab1", "b.x", "1", "ba"])
SOME_INTERESTS = st.one_of(SOME_TOPICS, st.sampled_from(
    ["a", "b$", "^a", r"\.", "x|1", "^$", "[ab]+", "(ab)?", r"a\.b", "b.", "^a.*b$", "."]).map(lambda p: ("p", p)),
    patterns.map(lambda p: ("p", p)))
OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 4), SOME_INTERESTS),
    st.tuples(st.just("remove"), st.integers(0, 4), st.none()),
    st.tuples(st.just("ask"), st.integers(0, 4), st.one_of(SOME_TOPICS, topics)),
    st.tuples(st.just("cover"), st.integers(0, 4), SOME_TOPICS),
), min_size=8, max_size=40)


@settings(max_examples=400)
@given(OPS, st.integers(1, 6), st.integers(1, 30))
def test_answers_are_the_brute_force_answers(ops, max_topics, max_facts):
    """Adds, removes and questions in any order, with a cache small enough to
    evict all the time: every answer is the one computed from scratch."""
    index: InterestIndex[int] = InterestIndex(max_topics=max_topics, max_facts=max_facts)
    held: dict[int, str | Pattern] = {}

    def want(interest: str | Pattern, topic: str) -> bool:
        return interest == topic if isinstance(interest, str) else re.search(interest.source, topic) is not None

    for op, key, arg in ops:
        if op == "add":
            interest = arg
            if isinstance(arg, tuple):
                if not compiles(arg[1]):
                    continue
                interest = Pattern(arg[1])
            if key in held and held[key] != interest:
                with pytest.raises(ValueError):
                    index.add(key, interest)
                continue
            assert index.add(key, interest) == (key not in held)
            held[key] = interest
        elif op == "remove":
            assert index.remove(key) == (key in held)
            held.pop(key, None)
        elif op == "cover":  # one key alone, maybe before the topic is asked about
            assert index.covers(key, arg) == (key in held and want(held[key], arg))
        else:
            expect = {k for k, i in held.items() if want(i, arg)}
            assert index.matches(arg) == expect
            assert index.wants(arg) == bool(expect)
            for k in range(5):
                assert index.covers(k, arg) == (k in expect)
        assert set(index) == set(held) and len(index) == len(held)
        assert len(index.cache) <= max_topics and index.cache.facts <= max_facts
        distinct = {i.source: i.size for i in held.values() if isinstance(i, Pattern)}
        assert index.patterns == len(distinct) and index.states == sum(distinct.values())


def test_keys_of_one_pattern_share_its_search(searches):
    index: InterestIndex[tuple[str, int]] = InterestIndex()
    for origin in range(50):
        index.add(("^md\\.", origin), Pattern("^md\\."))
    index.add(("exact", 0), "md.x")
    assert index.patterns == 1
    assert index.matches("md.x") == {("^md\\.", o) for o in range(50)} | {("exact", 0)}
    assert searches == [("^md\\.", "md.x")]
    assert index.matches("q.x") == set() and len(searches) == 1  # its prefix is not there: no search


def test_interest_of_reads_the_wire_pattern_types():
    assert interest_of(PATTERN_TOPIC, "a.b") == "a.b"
    assert interest_of(PATTERN_PCRE, "^a") == Pattern("^a") == interest_of(PATTERN_REGEX, "^a")
    with pytest.raises(ValueError):
        interest_of(3, "a")
    index: InterestIndex[str] = InterestIndex()
    index.add("k", "a.b")
    with pytest.raises(ValueError):
        index.add("k", Pattern("a"))  # one key wants one thing
    assert not index.add("k", "a.b") and not index.remove("other") and not index.covers("other", "a.b")


# --------------------------------------------------------------------------- the cache


def test_a_hot_topic_is_searched_once_and_a_new_pattern_alone(searches):
    index: InterestIndex[int] = InterestIndex()
    for i in range(100):
        index.add(i, Pattern(f".x{i}$"))  # no literal hint: each is searched
    hot = "a.x7"
    assert index.matches(hot) == {7}
    first = len(searches)
    assert first == 100  # every pattern once
    for _ in range(10):
        assert index.matches(hot) == {7} and index.wants(hot)
    assert len(searches) == first
    # a pattern added: only it is searched for the hot topic
    index.add(100, Pattern(r"^a\."))
    assert index.matches(hot) == {7, 100}
    assert searches[first:] == [(r"^a\.", hot)]
    # removed: gone from the answer, nothing searched
    index.remove(7)
    assert index.matches(hot) == {100} and len(searches) == first + 1
    # added again: searched again (it is a new pattern for the cache)
    index.add(7, Pattern(".x7$"))
    assert index.matches(hot) == {7, 100} and searches[first + 1:] == [(".x7$", hot)]


def test_thousands_of_patterns_cost_one_search_per_change_for_hot_topics(searches):
    """3000 patterns from the wire, 50 topics asked about all the time: after
    their first answers, a pattern added costs one search per hot topic, a
    pattern removed none, and asking again none."""
    index: InterestIndex[tuple[str, int]] = InterestIndex()
    for i in range(3000):
        index.add((f".q{i}$", 7), Pattern(f".q{i}$"))
    hot = [f"md.q{i}" for i in range(50)]
    for t in hot:
        assert index.matches(t) == {(f".q{t[4:]}$", 7)}
    assert len(searches) == 50 * 3000
    searches.clear()
    index.add(("md", 8), Pattern("md"))
    index.remove((".q3$", 7))
    for _ in range(3):
        for i, t in enumerate(hot):
            assert index.matches(t) == ({(f".q{i}$", 7)} if i != 3 else set()) | {("md", 8)}
    assert sorted(searches) == sorted(("md", t) for t in hot)


def test_covers_answers_from_the_cache_and_feeds_it(searches):
    index: InterestIndex[str] = InterestIndex()
    index.add("a", Pattern("ab+"))
    index.add("b", Pattern("b"))
    assert index.covers("a", "xaab")  # searched alone
    assert searches == [("ab+", "xaab")]
    assert index.matches("xaab") == {"a", "b"}  # only the other pattern is searched now
    assert searches[1:] == [("b", "xaab")]
    assert index.covers("a", "xaab") and index.covers("b", "xaab") and len(searches) == 2
    assert not index.covers("a", "zzz") and len(searches) == 2  # no "a" in it: not searched
    # a pattern added after the topic's answer: searched alone, then known
    index.add("c", Pattern("aab$"))
    assert index.covers("c", "xaab") and searches[2:] == [("aab$", "xaab")]
    assert index.matches("xaab") == {"a", "b", "c"} and len(searches) == 3


def test_the_cache_is_bounded_under_a_flood_of_distinct_topics(searches):
    """Topics from the wire, each new: the cache keeps at most its bound of
    topics, and a topic asked about between every 1000 new ones stays."""
    index: InterestIndex[int] = InterestIndex()
    index.add(0, Pattern(r"\d+$"))
    index.add(1, Pattern("^hot"))
    assert index.matches("hot.1") == {0, 1}
    hot_searches = len(searches)
    for i in range(3 * CACHE_TOPICS):
        assert index.matches(f"flood.{i}") == {0}
        if i % 1000 == 0:
            assert index.matches("hot.1") == {0, 1}
    assert len(index.cache) == CACHE_TOPICS and index.cache.facts <= CACHE_FACTS
    assert index.cache.evicted == 2 * CACHE_TOPICS + 1
    assert len([s for s in searches if s[1] == "hot.1"]) == hot_searches  # never searched again


def test_the_cache_is_bounded_by_facts_when_every_pattern_matches():
    """A thousand patterns matching every topic: each answer holds a thousand
    facts; the cache keeps what fits in its bound of facts."""
    index: InterestIndex[int] = InterestIndex(max_facts=10_000)
    for i in range(1000):
        index.add(i, Pattern(f"(x{{{i}}})?"))
    for i in range(50):
        assert len(index.matches(f"t{i}")) == 1000
        assert index.cache.facts <= 10_000
    assert len(index.cache) == 9


def test_long_topics_are_answered_but_not_kept(searches):
    index: InterestIndex[int] = InterestIndex()
    index.add(0, Pattern("a$"))
    long = "x" * MAX_CACHED_TOPIC + "a"
    assert index.matches(long) == {0} and index.matches(long) == {0}
    assert len(searches) == 2 and len(index.cache) == 0


def test_an_index_without_patterns_keeps_no_cache():
    index: InterestIndex[int] = InterestIndex()
    index.add(0, "t")
    assert index.matches("t") == {0} and len(index.cache) == 0
    index.add(1, Pattern("t"))
    index.matches("t")
    index.matches("u")
    assert len(index.cache) == 2
    index.remove(1)
    assert len(index.cache) == 0 and index.matches("t") == {0}


def test_an_index_with_max_states_refuses_what_would_pass_it():
    """Patterns are held within ``max_states`` summed over their distinct
    texts; exact topics and texts already held add nothing; removing gives
    states back; the bound may change."""
    a, b = Pattern("(.?){40}a"), Pattern("(.?){40}b")
    index: InterestIndex[str] = InterestIndex(max_states=a.size + b.size - 1)
    assert index.fits(a) and index.add("a", a) and index.states == a.size
    assert not index.fits(b)
    with pytest.raises(ValueError, match="states"):
        index.add("b", b)
    assert "b" not in index and index.states == a.size
    assert index.fits(Pattern(a.source)) and index.add("a2", Pattern(a.source)) and index.states == a.size
    assert index.fits("t" * 300) and index.add("t", "t" * 300)
    index.max_states = a.size + b.size
    assert index.add("b", b) and index.states == a.size + b.size
    index.remove("b")
    assert index.states == a.size and index.fits(b)
    assert InterestIndex().fits(Pattern("(.?){990}x")) and InterestIndex().max_states is None
    assert MAX_HELD_STATES >= Matcher("(.?){990}x").size


def test_add_and_remove_churn_does_not_grow_anything():
    """A peer adding and cancelling patterns in a loop while a topic is asked
    about: the removed patterns leave nothing behind (what the index holds
    after 5000 more is what it held after the first 1000)."""
    import gc
    import tracemalloc

    index: InterestIndex[int] = InterestIndex()
    index.add(0, Pattern("keep"))

    def churn(n: int) -> None:
        for i in range(n):
            index.add(1, Pattern(f"t|{i}"))
            assert index.matches("t.keep") == {0, 1}
            index.remove(1)

    churn(1000)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        churn(5000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert index.matches("t.keep") == {0}
    assert index.cache.facts == 2 and index.patterns == 1 and len(index.cache) == 1
    assert grown < 20_000  # bytes; one id kept per pattern added: ~0.2 MB


# --------------------------------------------------------------------------- hostile patterns


@pytest.mark.parametrize("source", [r"(a)\1", r"(?=a)b", r"(?<!a)b", "(a{100}){100}", "a" * (MAX_PATTERN + 1),
                                    r"(?m)^a", "(", r"a(?i:b)"])
def test_hostile_or_bad_patterns_are_refused(source):
    with pytest.raises(PatternError):
        Pattern(source)
    with pytest.raises(PatternError):
        interest_of(PATTERN_PCRE, source)


def test_a_worst_case_pattern_costs_its_states_per_character_once_per_topic(searches):
    """Patterns built to keep every state alive are bounded by their states
    (the index sums them for its callers' bounds) and searched once per topic."""
    index: InterestIndex[int] = InterestIndex()
    worst = [Pattern(f"(.?){{990}}x{k}") for k in range(3)] + [Pattern("^q(.?){990}x")]
    for k, p in enumerate(worst):
        index.add(k, p)
    assert index.states == sum(p.size for p in worst) and all(p.size <= 2000 for p in worst)
    topic = "a" * 250 + "x1"
    for _ in range(5):
        assert index.matches(topic) == {1}
    assert len(searches) == 3  # once each; the anchored one not at all (no "q" first)
    assert index.matches("q" + topic) == {1, 3} and len(searches) == 7
