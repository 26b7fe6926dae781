"""Short times for the report: offsets from the capture's first datagram.

The tables keep UTC ISO 8601 times with microseconds (``2022-05-23T20:11:19.855974Z``);
the page shows them as milliseconds after the capture start (``+11975.012 ms``)
and names the absolute start once, in its first line.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

#: A UTC ISO 8601 time as the tables write it (``YYYY-MM-DDTHH:MM:SS[.ffffff]Z``).
ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?Z")
_US = timedelta(microseconds=1)


def parse(iso: str) -> datetime:
    """An ISO time of the tables as an aware datetime."""
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


class CaptureClock:
    """Offsets from ``start`` (an ISO time, or None for an empty capture: then
    times are shown as they are)."""

    def __init__(self, start: str | None) -> None:
        self.start = start
        self._t0 = parse(start) if start else None

    def offset_us(self, iso: str) -> int | None:
        """Microseconds from the start to ``iso`` (None without a start)."""
        if self._t0 is None:
            return None
        return (parse(iso) - self._t0) // _US

    def offset_s(self, epoch_s: float) -> float:
        """Seconds from the start to a Unix time in seconds (0 without a start)."""
        return epoch_s - self._t0.timestamp() if self._t0 is not None else 0.0

    def short(self, iso: str) -> str:
        """``+11975.012 ms`` (milliseconds after the start, to the microsecond)."""
        us = self.offset_us(iso)
        if us is None:
            return iso
        sign = "-" if us < 0 else "+"
        ms, frac = divmod(abs(us), 1000)
        return f"{sign}{ms}.{frac:03d} ms"

    def shorten_text(self, text: str) -> str:
        """``text`` with every ISO time in it made short."""
        return ISO_TIME.sub(lambda m: self.short(m.group(0)), text)
