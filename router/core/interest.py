"""Interest in topics: which of a set of exact topics and wildcard patterns
want a topic, sans-IO.

One :class:`InterestIndex` holds *keys* (any hashable value: the caller's
name for a piece of interest), each wanting an exact topic or a
:class:`Pattern`, and answers for a topic: which keys want it
(:meth:`~InterestIndex.matches`), whether any does
(:meth:`~InterestIndex.wants`), whether one given key does
(:meth:`~InterestIndex.covers`). Interest comes from the wire (TQRs and
WC-TQRs of a TRD, INTEREST frames of a peer) and from the configuration (ACL
conditions); topics come from the wire. Everything is bounded:

* **Compiling.** A :class:`Pattern` is compiled once, when it is built, by
  :class:`router.core.wildcard.Matcher`: at most
  :data:`~router.core.wildcard.MAX_PATTERN` characters and
  :data:`~router.core.wildcard.MAX_STATES` states, else
  :class:`~router.core.wildcard.PatternError`. The index keeps one compiled
  pattern per distinct pattern text it holds (keys wanting the same text
  share it and its search), for as long as a key holds it.
* **Searching.** A search costs at most the pattern's states
  (:attr:`Pattern.size`) per character of the topic, whatever the pattern
  (no backtracking). Before the matcher runs, the literal text a match must
  start with (after a leading ``^``) and the literal text the pattern
  starts with, which a match must contain (:func:`literal_hints`), are
  looked for in the topic: a topic that lacks them costs a string
  comparison. A topic searched against every pattern an index holds costs
  at most :attr:`InterestIndex.states` steps per character. An index made
  with ``max_states`` refuses a pattern that would take it past that sum
  (:meth:`~InterestIndex.fits`); patterns from the wire are held under
  :data:`MAX_HELD_STATES` per peer link (a peer link's transit patterns,
  its remote interest at an endpoint portal), so one peer's patterns cost
  a new topic at most that many steps per character wherever they are
  matched. A portal's ACL list has its own bound (its own configuration).
* **Caching.** What the searches found is kept per topic in the index's
  :class:`TopicCache`: for each topic, the patterns that matched it and up
  to which pattern (in the order they were added) that answer is complete.
  A topic asked again costs a dictionary look-up; a pattern added since is
  searched against it alone (not every pattern again), and one removed is
  dropped from the answer (removal never searches).
  :meth:`~InterestIndex.covers` answers from the cache when it can and adds
  what it searched. Bound: at most
  :data:`CACHE_TOPICS` topics and :data:`CACHE_FACTS` remembered facts (one
  per topic, plus one per pattern matched or searched alone) per index; the
  topic used least recently is evicted first, so a flood of distinct topics
  (each used once) cannot push out the topics asked about all the time as
  long as they are asked again before that many others. Topics longer than
  :data:`MAX_CACHED_TOPIC` characters (no UM topic is) are searched but not
  kept. An index that holds no pattern any more empties its cache.

Exact topics are a dictionary look-up and never cached.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Hashable, Iterator
from re import _constants as _C  # type: ignore[attr-defined]
from re import _parser as _sre_parse  # type: ignore[attr-defined]
from typing import Generic, NamedTuple, TypeVar

from .wildcard import Matcher

__all__ = [
    "PATTERN_TOPIC", "PATTERN_PCRE", "PATTERN_REGEX",
    "CACHE_TOPICS", "CACHE_FACTS", "MAX_CACHED_TOPIC", "MAX_HELD_STATES",
    "LiteralHints", "literal_hints", "Pattern", "interest_of", "TopicCache", "InterestIndex",
]

PATTERN_TOPIC = 0  # an exact topic name (LBRP INTEREST pattern type 0)
PATTERN_PCRE = 1  # LBMR wildcard pattern types (WC-TQR, INTEREST)
PATTERN_REGEX = 2

#: Topics whose answers one index keeps, at most.
CACHE_TOPICS = 4096
#: Facts (one per topic kept, one per pattern each matched or was searched alone) one index keeps, at most.
CACHE_FACTS = 1 << 16
#: Characters of the longest topic whose answer is kept (UM topics are at most 255 bytes).
MAX_CACHED_TOPIC = 256
#: NFA states, summed over its distinct patterns, that the wire interest of one
#: peer link may hold where it is matched (transit, an endpoint portal's view of
#: the link): the most one new topic costs against them is this many matcher
#: steps per character. One worst-case pattern
#: (:data:`~router.core.wildcard.MAX_STATES` states) fills it: about 0.1 s
#: for a 255-byte topic on a 2-core host; a plain prefix pattern such as
#: ``^md\.quotes\.`` takes a dozen states.
MAX_HELD_STATES = 2000

K = TypeVar("K", bound=Hashable)


# --------------------------------------------------------------------------- patterns


class LiteralHints(NamedTuple):
    """What every topic a pattern matches holds: ``prefix``, the topic
    starts with it (the literal text right after a leading ``^`` or ``\\A``;
    "" when not anchored so), and ``run``, the topic contains it (the
    literal text the pattern's top-level sequence starts with, after any
    anchors; "" if none)."""

    prefix: str
    run: str


def literal_hints(source: str) -> LiteralHints:
    """The :class:`LiteralHints` of pattern ``source`` (empty for a pattern
    that ignores case or does not parse): necessary conditions of a match,
    cheap to test before the matcher."""
    try:
        parsed = _sre_parse.parse(source)
    except (re.error, RecursionError, OverflowError, ValueError):
        return LiteralHints("", "")
    if parsed.state.flags & re.IGNORECASE:
        return LiteralHints("", "")
    items = list(parsed)
    i, anchored = 0, False
    while i < len(items) and items[i][0] is _C.AT:  # zero-width: the literals after them still follow
        anchored = anchored or items[i][1] in (_C.AT_BEGINNING, _C.AT_BEGINNING_STRING)
        i += 1
    run = []
    while i < len(items) and items[i][0] is _C.LITERAL:
        run.append(chr(items[i][1]))
        i += 1
    text = "".join(run)
    return LiteralHints(text if anchored else "", text)


class Pattern:
    """A wildcard pattern (PCRE syntax; ``re.search`` semantics: anchor it
    with ``^``/``$``), compiled when built:
    :class:`~router.core.wildcard.PatternError` if the matcher refuses it
    (syntax, unsupported construct, size). Equal to another of the same text."""

    __slots__ = ("source", "matcher", "hints")

    def __init__(self, source: str) -> None:
        self.source = source
        self.matcher = Matcher(source)
        self.hints = literal_hints(source)

    @property
    def size(self) -> int:
        """The matcher's states: a search costs at most this many steps per character."""
        return self.matcher.size

    def admits(self, topic: str) -> bool:
        """Does ``topic`` hold the pattern's literal hints (the cheap test)?"""
        prefix, run = self.hints
        return topic.startswith(prefix) and run in topic

    def search(self, topic: str) -> bool:
        """Does the pattern match ``topic`` (anywhere, as ``re.search``)?"""
        return self.admits(topic) and self.matcher.search(topic)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pattern) and other.source == self.source

    def __hash__(self) -> int:
        return hash(self.source)

    def __repr__(self) -> str:
        return f"Pattern({self.source!r})"


def interest_of(pattern_type: int, text: str) -> str | Pattern:
    """The interest of a TQR / WC-TQR / INTEREST frame: ``text`` itself for an
    exact topic (:data:`PATTERN_TOPIC`), else its :class:`Pattern` (PCRE and
    POSIX regex are read with the same syntax). PatternError if the pattern
    cannot be matched, ValueError for an unknown pattern type."""
    if pattern_type == PATTERN_TOPIC:
        return text
    if pattern_type in (PATTERN_PCRE, PATTERN_REGEX):
        return Pattern(text)
    raise ValueError(f"unknown pattern type {pattern_type}")


# --------------------------------------------------------------------------- the cache


class _Answer:
    """What an index knows of one topic: every pattern with an id up to
    ``upto`` was searched; ``hit`` holds the ids that matched (up to ``upto``
    and among ``alone``; ids of patterns removed since ``pruned`` may remain);
    ``alone`` the ids above ``upto`` searched one by one
    (:meth:`InterestIndex.covers`)."""

    __slots__ = ("upto", "hit", "alone", "pruned")

    def __init__(self, pruned: int) -> None:
        self.upto = 0
        self.hit: tuple[int, ...] = ()
        self.alone: set[int] | None = None
        self.pruned = pruned  # the index's count of removed patterns when ``hit`` was last pruned

    @property
    def facts(self) -> int:
        return 1 + len(self.hit) + (len(self.alone) if self.alone else 0)


class TopicCache:
    """The answers of one index by topic, least recently used evicted first
    (module doc): at most ``max_topics`` topics and ``max_facts`` facts."""

    def __init__(self, max_topics: int = CACHE_TOPICS, max_facts: int = CACHE_FACTS) -> None:
        if max_topics < 1 or max_facts < 1:
            raise ValueError("a cache holds at least one topic and one fact")
        self.max_topics, self.max_facts = max_topics, max_facts
        self._answers: dict[str, _Answer] = {}
        self.facts = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._answers)

    def __contains__(self, topic: object) -> bool:
        return topic in self._answers

    def get(self, topic: str) -> _Answer | None:
        """The answer kept for ``topic`` (now the most recently used), or None."""
        a = self._answers.pop(topic, None)
        if a is not None:
            self._answers[topic] = a
        return a

    def put(self, topic: str, answer: _Answer, old_facts: int = 0) -> None:
        """Keep ``answer`` (new, or changed from ``old_facts`` facts) as the
        most recently used; evict the least recently used beyond the bounds."""
        if len(topic) > MAX_CACHED_TOPIC:
            return
        if self._answers.pop(topic, None) is not None:
            self.facts -= old_facts
        self._answers[topic] = answer
        self.facts += answer.facts
        answers = self._answers
        while answers and (len(answers) > self.max_topics or self.facts > self.max_facts):
            gone = answers.pop(next(iter(answers)))
            self.facts -= gone.facts
            self.evicted += 1

    def clear(self) -> None:
        self._answers.clear()
        self.facts = 0


# --------------------------------------------------------------------------- the index


class _Group:
    """The keys holding one pattern text; ``gid`` numbers the patterns in
    the order they were added (a text removed and added again is a new one)."""

    __slots__ = ("gid", "pattern", "keys")

    def __init__(self, gid: int, pattern: Pattern) -> None:
        self.gid, self.pattern = gid, pattern
        self.keys: set = set()


class InterestIndex(Generic[K]):
    """Keys wanting exact topics or patterns, matched against topics with
    one bounded cache (module doc). ``max_topics`` / ``max_facts``: the
    cache's bounds. ``max_states``: the most :attr:`states` may reach (None:
    no bound); the holder may change it (a portal's grows with its links)."""

    def __init__(self, *, max_topics: int = CACHE_TOPICS, max_facts: int = CACHE_FACTS,
                 max_states: int | None = None) -> None:
        self.cache = TopicCache(max_topics, max_facts)
        self.max_states = max_states
        self._where: dict[K, str | _Group] = {}  # key -> its exact topic, or its pattern's group
        self._exact: dict[str, set[K]] = {}
        self._groups: dict[int, _Group] = {}
        self._by_source: dict[str, _Group] = {}
        self._gids: list[int] = []  # ascending; ids of removed groups are dropped now and then
        self._last_gid = 0
        self._removed = 0  # patterns removed so far (an answer older than that is pruned when used)
        self._states = 0

    def __repr__(self) -> str:
        return (f"<InterestIndex {len(self._where)} keys, {len(self._groups)} patterns, "
                f"{len(self.cache)} topics cached>")

    def __len__(self) -> int:
        return len(self._where)

    def __iter__(self) -> Iterator[K]:
        return iter(self._where)

    def __contains__(self, key: object) -> bool:
        return key in self._where

    @property
    def patterns(self) -> int:
        """Distinct patterns held."""
        return len(self._groups)

    @property
    def states(self) -> int:
        """The states of the distinct patterns held, summed: a topic searched
        against all of them costs at most this many steps per character."""
        return self._states

    def fits(self, interest: str | Pattern) -> bool:
        """Could ``interest`` be added within ``max_states``? An exact topic,
        or a pattern whose text is held already, adds no state and always fits."""
        if isinstance(interest, str) or self.max_states is None or interest.source in self._by_source:
            return True
        return self._states + interest.size <= self.max_states

    # ------------------------------------------------------------------ inputs

    def add(self, key: K, interest: str | Pattern) -> bool:
        """``key`` wants ``interest``: an exact topic (str) or a
        :class:`Pattern`. False if it did already; ValueError if ``key``
        wants something else (remove it first) or if ``interest`` does not
        :meth:`fit <fits>`."""
        held = self._where.get(key)
        if held is not None:
            same = held == interest if isinstance(held, str) else held.pattern == interest
            if not same:
                raise ValueError(f"{key!r} already wants {held if isinstance(held, str) else held.pattern}")
            return False
        if isinstance(interest, str):
            self._exact.setdefault(interest, set()).add(key)
            self._where[key] = interest
            return True
        g = self._by_source.get(interest.source)
        if g is None:
            if not self.fits(interest):
                raise ValueError(f"{interest!r} ({interest.size} states) would take the index past "
                                 f"{self.max_states} states ({self._states} held)")
            self._last_gid += 1
            g = _Group(self._last_gid, interest)
            self._groups[g.gid] = self._by_source[interest.source] = g
            self._gids.append(g.gid)
            self._states += interest.size
        g.keys.add(key)
        self._where[key] = g
        return True

    def remove(self, key: K) -> bool:
        """``key`` wants nothing any more; False if it was not held."""
        held = self._where.pop(key, None)
        if held is None:
            return False
        if isinstance(held, str):
            keys = self._exact[held]
            keys.discard(key)
            if not keys:
                del self._exact[held]
            return True
        held.keys.discard(key)
        if not held.keys:
            del self._groups[held.gid]
            del self._by_source[held.pattern.source]
            self._removed += 1
            self._states -= held.pattern.size
            if not self._groups:
                self._gids.clear()
                self.cache.clear()
            elif len(self._gids) > 2 * len(self._groups) + 32:
                self._gids = [gid for gid in self._gids if gid in self._groups]
        return True

    # ------------------------------------------------------------------ answers

    def matches(self, topic: str) -> set[K]:
        """The keys that want ``topic`` (its exact topic, or a pattern matching it)."""
        out = set(self._exact.get(topic, ()))
        for gid in self._hits(topic):
            out |= self._groups[gid].keys
        return out

    def wants(self, topic: str) -> bool:
        """Does any key want ``topic``?"""
        return topic in self._exact or bool(self._hits(topic))

    def covers(self, key: K, topic: str) -> bool:
        """Does ``key`` want ``topic``? (False for a key not held.) The pattern
        of ``key`` alone is searched, if the cache does not know."""
        held = self._where.get(key)
        if held is None:
            return False
        if isinstance(held, str):
            return held == topic
        p, gid = held.pattern, held.gid
        if not p.admits(topic):
            return False
        a = self.cache.get(topic)
        if a is not None and (gid <= a.upto or a.alone and gid in a.alone):
            return gid in a.hit
        hit = p.matcher.search(topic)
        old = 0
        if a is None:
            a = _Answer(self._removed)
        else:
            old = a.facts
        if a.alone is None:
            a.alone = set()
        a.alone.add(gid)
        if hit:
            a.hit += (gid,)
        self.cache.put(topic, a, old)
        return hit

    def _hits(self, topic: str) -> tuple[int, ...]:
        """The ids of the live patterns matching ``topic``, from the cache
        where it knows, searching the patterns added since."""
        if not self._groups:
            return ()
        groups = self._groups
        a = self.cache.get(topic)
        old = 0
        if a is None:
            a = _Answer(self._removed)
            changed = True
        else:
            old = a.facts
            changed = False
        if a.upto < self._last_gid:
            hit = list(a.hit)
            alone = a.alone or ()
            gids = self._gids
            for gid in gids[bisect_right(gids, a.upto):]:
                g = groups.get(gid)
                if g is not None and gid not in alone and g.pattern.search(topic):
                    hit.append(gid)
            a.upto, a.hit, a.alone = self._last_gid, tuple(hit), None
            changed = True
        if a.pruned != self._removed:  # patterns removed since: forget them
            a.hit = tuple(gid for gid in a.hit if gid in groups)
            a.pruned = self._removed
            changed = True
        if changed:
            self.cache.put(topic, a, old)
        return a.hit
