"""A wake-up for the router's core task on trio: set by any task that gave
the core input, waited for by the one task that acts on the core's outputs."""

from __future__ import annotations

import trio

__all__ = ["Wake"]


class Wake:
    """Like a :class:`trio.Event` that re-arms: :meth:`set` any number of
    times; :meth:`wait_until` returns once it was set (then clears it) or at
    the deadline (trio's clock, seconds)."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait_until(self, deadline: float) -> None:
        with trio.move_on_at(deadline):
            await self._event.wait()
        if self._event.is_set():
            self._event = trio.Event()
