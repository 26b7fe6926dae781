"""Wildcard patterns from the wire (WC-TQRs of a TRD, INTEREST frames of the
peer), matched without backtracking.

Python's ``re`` backtracks: a pattern such as ``^(a+)+$`` against 30 a's and
a ``!`` takes exponential time, and a router matching it froze. A
:class:`Matcher` parses the pattern with Python's own parser (the PCRE
syntax UM patterns use: literals, ``.``, classes, ``\\d \\w \\s``, anchors
``^ $ \\A \\Z \\b \\B``, groups, ``|``, ``* + ? {m,n}`` greedy or lazy, and
``(?i)``) and runs it as a Thompson NFA (a Pike VM without captures): the
time of a search is at most the pattern's states times the topic's length,
whatever the pattern. Back-references, look-around, conditionals, atomic
groups, possessive quantifiers and scoped flags are refused
(:class:`PatternError`), as are patterns longer than :data:`MAX_PATTERN`
characters or larger than :data:`MAX_STATES` states once their repetitions
are expanded (``(a{100}){100}``).
"""

from __future__ import annotations

import re
from re import _constants as C  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]

__all__ = ["Matcher", "PatternError", "MAX_PATTERN", "MAX_STATES"]

MAX_PATTERN = 512  # characters
MAX_STATES = 2000  # NFA states after expanding repetitions

_CHAR, _SPLIT, _ASSERT, _MATCH = range(4)


class PatternError(ValueError):
    """The pattern is not one we match (syntax, unsupported construct, size)."""


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


_CATEGORIES = {
    C.CATEGORY_DIGIT: str.isdecimal,
    C.CATEGORY_NOT_DIGIT: lambda ch: not ch.isdecimal(),
    C.CATEGORY_SPACE: str.isspace,
    C.CATEGORY_NOT_SPACE: lambda ch: not ch.isspace(),
    C.CATEGORY_WORD: _is_word,
    C.CATEGORY_NOT_WORD: lambda ch: not _is_word(ch),
}


def _at_boundary(text: str, pos: int) -> bool:
    before = pos > 0 and _is_word(text[pos - 1])
    after = pos < len(text) and _is_word(text[pos])
    return before != after


_ASSERTIONS = {
    C.AT_BEGINNING: lambda text, pos: pos == 0,
    C.AT_BEGINNING_STRING: lambda text, pos: pos == 0,
    C.AT_END: lambda text, pos: pos == len(text) or (pos == len(text) - 1 and text[-1] == "\n"),
    C.AT_END_STRING: lambda text, pos: pos == len(text),
    C.AT_BOUNDARY: _at_boundary,
    C.AT_NON_BOUNDARY: lambda text, pos: not _at_boundary(text, pos),
}


class Matcher:
    """One compiled pattern; :meth:`search` is ``re.search(...) is not None``
    without backtracking. :class:`PatternError` if it cannot be compiled."""

    def __init__(self, pattern: str) -> None:
        if len(pattern) > MAX_PATTERN:
            raise PatternError(f"pattern of {len(pattern)} characters (at most {MAX_PATTERN})")
        try:
            parsed = sre_parse.parse(pattern)
        except (re.error, RecursionError, OverflowError, ValueError) as e:
            raise PatternError(f"bad pattern: {e}") from None
        flags = parsed.state.flags
        if flags & ~(re.IGNORECASE | re.DOTALL | re.UNICODE):
            raise PatternError("only the i and s flags are supported")
        self.pattern = pattern
        self.icase = bool(flags & re.IGNORECASE)
        self.dotall = bool(flags & re.DOTALL)
        # states: [kind, arg, out1, out2]; CHAR: arg = predicate; ASSERT: arg = test(text, pos)
        self._states: list[list] = []
        start, outs = self._seq(list(parsed))
        match = self._new(_MATCH)
        self._patch(outs, match)
        self._start = start

    @property
    def size(self) -> int:
        """The pattern's NFA states: a :meth:`search` costs at most this many
        steps per character of the text."""
        return len(self._states)

    # ------------------------------------------------------------------ compile

    def _new(self, kind: int, arg=None) -> int:
        if len(self._states) >= MAX_STATES:
            raise PatternError(f"pattern too large (more than {MAX_STATES} states)")
        self._states.append([kind, arg, None, None])
        return len(self._states) - 1

    def _patch(self, outs: list[tuple[int, int]], target: int) -> None:
        for state, slot in outs:
            self._states[state][slot] = target

    def _epsilon(self) -> tuple[int, list[tuple[int, int]]]:
        s = self._new(_ASSERT, lambda text, pos: True)
        return s, [(s, 2)]

    def _seq(self, items: list) -> tuple[int, list[tuple[int, int]]]:
        if not items:
            return self._epsilon()
        start, outs = self._item(*items[0])
        for op, av in items[1:]:
            s, o = self._item(op, av)
            self._patch(outs, s)
            outs = o
        return start, outs

    def _char(self, pred) -> tuple[int, list[tuple[int, int]]]:
        s = self._new(_CHAR, pred)
        return s, [(s, 2)]

    def _item(self, op, av) -> tuple[int, list[tuple[int, int]]]:
        if op is C.LITERAL:
            ch = chr(av).lower() if self.icase else chr(av)
            return self._char(ch.__eq__)
        if op is C.NOT_LITERAL:
            ch = chr(av).lower() if self.icase else chr(av)
            return self._char(ch.__ne__)
        if op is C.ANY:
            return self._char((lambda ch: True) if self.dotall else "\n".__ne__)
        if op is C.IN:
            return self._char(self._class(av))
        if op is C.AT:
            test = _ASSERTIONS.get(av)
            if test is None:
                raise PatternError(f"unsupported anchor {av}")
            s = self._new(_ASSERT, test)
            return s, [(s, 2)]
        if op is C.SUBPATTERN:
            _group, add_flags, del_flags, p = av
            if add_flags or del_flags:
                raise PatternError("scoped flags are not supported")
            return self._seq(list(p))
        if op is C.BRANCH:
            _, alternatives = av
            starts, outs = [], []
            for alt in alternatives:
                s, o = self._seq(list(alt))
                starts.append(s)
                outs += o
            start = starts[-1]
            for s in reversed(starts[:-1]):
                split = self._new(_SPLIT)
                self._states[split][2], self._states[split][3] = s, start
                start = split
            return start, outs
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):
            return self._repeat(*av)
        raise PatternError(f"unsupported construct {op}")

    def _repeat(self, lo: int, hi: int, sub) -> tuple[int, list[tuple[int, int]]]:
        parts: list[tuple[int, list[tuple[int, int]]]] = [self._seq(list(sub)) for _ in range(lo)]
        if hi == C.MAXREPEAT:
            s, o = self._seq(list(sub))
            split = self._new(_SPLIT)
            self._states[split][2] = s
            self._patch(o, split)
            parts.append((split, [(split, 3)]))
        else:
            for _ in range(hi - lo):  # optional copies: (x(x(x)?)?)?
                s, o = self._seq(list(sub))
                split = self._new(_SPLIT)
                self._states[split][2] = s
                parts.append((split, o + [(split, 3)]))
        if not parts:
            return self._epsilon()
        start, outs = parts[0]
        for s, o in parts[1:]:
            self._patch(outs, s)
            outs = o
        return start, outs

    def _class(self, items) -> object:
        negate = False
        chars: set[str] = set()
        ranges: list[tuple[int, int]] = []
        cats = []
        for op, av in items:
            if op is C.NEGATE:
                negate = True
            elif op is C.LITERAL:
                chars.add(chr(av).lower() if self.icase else chr(av))
            elif op is C.RANGE or op is C.RANGE_UNI_IGNORE:
                ranges.append(av)
            elif op is C.CATEGORY and av in _CATEGORIES:
                cats.append(_CATEGORIES[av])
            else:
                raise PatternError(f"unsupported class item {op}")
        icase = self.icase

        def pred(ch: str) -> bool:
            hit = ch in chars or any(f(ch) for f in cats)
            if not hit and ranges:
                codes = (ord(ch), ord(ch.upper())) if icase else (ord(ch),)
                hit = any(lo <= c <= hi for lo, hi in ranges for c in codes)
            return hit != negate

        return pred

    # ------------------------------------------------------------------ match

    def _closure(self, states: list[int], text: str, pos: int, into: set[int]) -> bool:
        """Add ``states`` and everything reachable without a character to
        ``into``; True when the match state is among them."""
        table = self._states
        stack = list(states)
        matched = False
        while stack:
            s = stack.pop()
            if s in into:
                continue
            into.add(s)
            kind, arg, out1, out2 = table[s]
            if kind == _SPLIT:
                stack.append(out2)
                stack.append(out1)
            elif kind == _ASSERT:
                if arg(text, pos):
                    stack.append(out1)
            elif kind == _MATCH:
                matched = True
        return matched

    def search(self, text: str) -> bool:
        """Does the pattern match anywhere in ``text`` (``re.search``)?"""
        if self.icase:
            text = text.lower()
        table = self._states
        current: set[int] = set()
        if self._closure([self._start], text, 0, current):
            return True
        for pos, ch in enumerate(text):
            nxt = [table[s][2] for s in current if table[s][0] == _CHAR and table[s][1](ch)]
            nxt.append(self._start)  # a match may begin at the next position too
            current = set()
            if self._closure(nxt, text, pos + 1, current):
                return True
        return False
