"""The numbered data pattern of the data plane (see :mod:`lbmr_tools.sim.dataplane`)."""

from __future__ import annotations

import functools
import hashlib
import struct
from dataclasses import asdict

Addr = tuple[str, int]

PATTERN_LEN = 1_048_573  # odd: the pattern drifts against the 4 KiB blocks
STAMP_INTERVAL = 4096  # every block of this many bytes starts with its u64 offset
U64 = struct.Struct("!Q")
U64_MAX = (1 << 64) - 1
_DOMAIN = b"lbmr-dataplane/1"
_TOPIC_DOMAIN = b"lbmr-dataplane/topic"


def check_seed(seed: int) -> int:
    if not isinstance(seed, int) or not 0 <= seed <= U64_MAX:
        raise ValueError(f"seed must be an integer in 0..2**64-1, not {seed!r}")
    return seed


# ----------------------------------------------------------------- pattern


class Pattern:
    """The byte stream of one seed (see the module docstring)."""

    __slots__ = ("seed", "_mv")

    def __init__(self, seed: int) -> None:
        self.seed = check_seed(seed)
        base = hashlib.shake_128(_DOMAIN + U64.pack(seed)).digest(PATTERN_LEN)
        self._mv = memoryview(base + base)  # doubled: any window of <= PATTERN_LEN is one slice

    def bytes_at(self, offset: int, n: int) -> bytearray:
        """The ``n`` bytes of the stream from ``offset``."""
        if offset < 0 or n < 0:
            raise ValueError("offset and length must be >= 0")
        s = offset % PATTERN_LEN
        if n <= PATTERN_LEN:
            out = bytearray(self._mv[s:s + n])
        else:
            out = bytearray()
            while len(out) < n:
                k = min(PATTERN_LEN, n - len(out))
                out += self._mv[s:s + k]
                s = (s + k) % PATTERN_LEN
        end = offset + n
        first = offset - offset % STAMP_INTERVAL
        if offset - first >= 8:
            first += STAMP_INTERVAL
        pack_into = U64.pack_into
        for b in range(first, end, STAMP_INTERVAL):
            if b >= offset and b + 8 <= end:
                pack_into(out, b - offset, b)
            else:  # a stamp cut by the window's start or end
                lo, hi = max(b, offset), min(b + 8, end)
                out[lo - offset:hi - offset] = U64.pack(b)[lo - b:hi - b]
        return out

    def check(self, offset: int, data) -> int | None:
        """Index in ``data`` of the first byte that differs from the stream
        at ``offset`` (None when all match)."""
        expected = self.bytes_at(offset, len(data))
        if expected == data:
            return None
        return first_difference(expected, data)


def first_difference(a, b) -> int:
    """Index of the first differing byte of ``a`` and ``b`` (the shorter
    length when one is a prefix of the other)."""
    ma, mb = memoryview(a).cast("B"), memoryview(b).cast("B")
    lo, hi = 0, min(len(ma), len(mb))
    while hi - lo > 64:  # invariant: a[:lo] == b[:lo] and a difference exists in [lo, hi) or at hi
        mid = (lo + hi) // 2
        if ma[lo:mid] == mb[lo:mid]:
            lo = mid
        else:
            hi = mid
    for i in range(lo, hi):
        if ma[i] != mb[i]:
            return i
    return hi


@functools.lru_cache(maxsize=32)
def pattern(seed: int) -> Pattern:
    """The (cached) :class:`Pattern` of ``seed``."""
    return Pattern(seed)


def topic_seed(topic: str | bytes, seed: int = 0) -> int:
    """A per-topic u64 seed: the first 8 bytes (big-endian) of
    SHAKE128(``b"lbmr-dataplane/topic"`` + u64 ``seed`` + topic bytes)."""
    raw = topic.encode() if isinstance(topic, str) else bytes(topic)
    return int.from_bytes(hashlib.shake_128(_TOPIC_DOMAIN + U64.pack(check_seed(seed)) + raw)
                          .digest(8), "big")


def rate_of(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else 0.0


class ReceiveRates:
    """Rates and the report dict of a receiver's result dataclass (fields
    ``received``, ``bytes_received``, ``data_elapsed`` seconds, property ``ok``)."""

    @property
    def datagrams_per_s(self) -> float:
        return rate_of(self.received, self.data_elapsed)

    @property
    def bytes_per_s(self) -> float:
        return rate_of(self.bytes_received, self.data_elapsed)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(ok=self.ok, datagrams_per_s=round(self.datagrams_per_s, 1),
                 bytes_per_s=round(self.bytes_per_s, 1))
        return d
