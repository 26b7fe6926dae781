"""Which interest covers which topic, for one portal: the one place where a
:class:`~router.core.tr.portal.PortalTR` matches topics against interest keys
``(pattern type, topic or pattern)``. Patterns run on
:class:`router.core.wildcard.Matcher` (from the wire: never backtracks),
compiled once and cached (at most 4096; the cache is emptied when full).
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from ..wildcard import Matcher, PatternError
from .events import PATTERN_TOPIC
from .timers import SourceTimer

__all__ = ["InterestMatching"]

Key = tuple[int, str]  # (pattern type, topic or pattern)


class InterestMatching:
    """Matching over the portal's remote interest (``remote``: key -> its
    state, ``remote_patterns``: the pattern keys among them) and the sources
    of its TRD (``sources_by_topic``: topic -> OTID -> source). It reads these
    tables of the portal and changes none of them."""

    __slots__ = ("_regexes", "_rint", "_rint_patterns", "_src_by_topic")

    def __init__(self, remote: Mapping[Key, object], remote_patterns: Set[Key],
                 sources_by_topic: Mapping[str, Mapping[bytes, SourceTimer]]) -> None:
        self._regexes: dict[Key, Matcher | None] = {}
        self._rint = remote
        self._rint_patterns = remote_patterns
        self._src_by_topic = sources_by_topic

    def regex(self, key: Key) -> Matcher | None:
        """The matcher of pattern ``key`` (None: not a valid pattern)."""
        try:
            return self._regexes[key]
        except KeyError:
            pass
        try:
            rx = Matcher(key[1])  # from the wire: never backtracks (router.core.wildcard)
        except PatternError:
            rx = None
        if len(self._regexes) >= 4096:
            self._regexes.clear()
        self._regexes[key] = rx
        return rx

    def covers(self, key: Key, topic: str) -> bool:
        """Does interest ``key`` (exact topic or pattern) cover ``topic``?"""
        if key[0] == PATTERN_TOPIC:
            return key[1] == topic
        rx = self.regex(key)
        return rx is not None and rx.search(topic)

    def wanted(self, topic: str) -> bool:
        """Does the peer want sources of ``topic``?"""
        if (PATTERN_TOPIC, topic) in self._rint:
            return True
        return any(self.covers(k, topic) for k in self._rint_patterns)

    def matching_sources(self, key: Key) -> list[SourceTimer]:
        """The TRD's sources whose topic ``key`` covers."""
        if key[0] == PATTERN_TOPIC:
            return list(self._src_by_topic.get(key[1], {}).values())
        return [s for t, ss in self._src_by_topic.items() if self.covers(key, t) for s in ss.values()]
