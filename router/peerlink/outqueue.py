"""The bounded per-peer writer queue (:class:`OutQueue`)."""

from __future__ import annotations

from collections import deque

from .frames import (
    Datagram,
    Frame,
    StreamData,
)
from .streams import DatagramBatch, HeldData
from .wire import (
    HEADER_SIZE,
    OutQueueOverflow,
)

# --------------------------------------------------------------------------- writer queue


class OutQueue:
    """Bounded queue of frames waiting to be written to one peer.

    Two classes of frames share one FIFO (so order is kept: a STREAM_CLOSE never overtakes
    its stream's data, a withdrawn advertisement never overtakes the last data):

    * control -- everything except STREAM_DATA and DATAGRAM: never dropped; at most
      ``max_control`` queued, beyond that :meth:`put` raises :class:`OutQueueOverflow`
      (the link is hopeless and should be closed);
    * data -- STREAM_DATA (also :class:`router.peerlink.streams.HeldData`, whose bytes the
      I/O layer holds) and DATAGRAM (also :class:`router.peerlink.streams.DatagramBatch`): at most ``max_data_bytes`` of encoded frames queued.
      When full, a DATAGRAM is dropped and counted (LBT-RU recovers by itself); a STREAM_DATA
      is refused (``put`` returns False) so the caller keeps the bytes and waits: size
      writes with :meth:`data_space` (``StreamTable.send(limit=...)``) to never be refused.

    ``put`` never blocks, so a slow peer never stalls the portal feeding it.
    """

    def __init__(self, *, max_control: int = 10_000, max_data_bytes: int = 8 << 20) -> None:
        self.max_control = max_control
        self.max_data_bytes = max_data_bytes
        self._q: deque[tuple[Frame, int]] = deque()  # (frame, data bytes or 0 for control)
        self.control_count = 0
        self.data_bytes = 0
        # encoded data bytes ever queued, and ever taken off the queue (written or thrown
        # away): a frame queued when ``data_in`` reached x has left once ``data_out`` >= x
        self.data_in = 0
        self.data_out = 0
        self.dropped_datagrams = 0
        self.dropped_datagram_bytes = 0
        self.refused_stream_data = 0
        self.discarded = 0  # frames thrown away by clear()

    @staticmethod
    def is_data(frame: Frame) -> bool:
        return isinstance(frame, StreamData | Datagram | HeldData | DatagramBatch)

    def __len__(self) -> int:
        return len(self._q)

    def __bool__(self) -> bool:
        return bool(self._q)

    def data_space(self) -> int:
        """Encoded bytes of data frames that would be accepted now."""
        return max(0, self.max_data_bytes - self.data_bytes)

    def put(self, frame: Frame) -> bool:
        """Queue a frame: True if queued, False if a data frame did not fit (see class doc)."""
        if self.is_data(frame):
            size = frame.wire_size()
            if self.data_bytes + size > self.max_data_bytes:
                if isinstance(frame, Datagram):
                    self.dropped_datagrams += 1
                    self.dropped_datagram_bytes += size
                elif isinstance(frame, DatagramBatch):
                    self.dropped_datagrams += len(frame.datagrams)
                    self.dropped_datagram_bytes += size
                else:
                    self.refused_stream_data += 1
                return False
            self.data_bytes += size
            self.data_in += size
            self._q.append((frame, size))
            return True
        if self.control_count >= self.max_control:
            raise OutQueueOverflow(
                f"{self.control_count} control frames already queued for this peer "
                f"(limit {self.max_control})")
        self.control_count += 1
        self._q.append((frame, 0))
        return True

    def pop(self) -> Frame | None:
        if not self._q:
            return None
        frame, size = self._q.popleft()
        if size:
            self.data_bytes -= size
            self.data_out += size
        else:
            self.control_count -= 1
        return frame

    def pop_batch(self, max_bytes: int = 256 * 1024) -> list[Frame]:
        """Frames from the head up to about ``max_bytes`` of data (at least one frame)."""
        out: list[Frame] = []
        budget = max_bytes
        while self._q and (not out or budget > 0):
            budget -= self._q[0][1] or HEADER_SIZE
            out.append(self.pop())  # type: ignore[arg-type]
        return out

    def take_all(self) -> list[Frame]:
        """Remove and return every queued frame, in order (the link went down and the
        caller must release what some frames hold, e.g. :class:`HeldData` pipes)."""
        out = [f for f, _ in self._q]
        self.discarded += len(out)
        self._q.clear()
        self.data_out += self.data_bytes
        self.control_count = self.data_bytes = 0
        return out

    def clear(self) -> int:
        """Drop everything (the link went down); returns how many frames were dropped."""
        n = len(self._q)
        self._q.clear()
        self.data_out += self.data_bytes
        self.control_count = self.data_bytes = 0
        self.discarded += n
        return n
