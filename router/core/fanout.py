"""Fan-out of one live LBMC session to many sinks, sans-IO.

A UM TCP session is one live stream of LBMC messages for all its receivers.
The router takes it once (the proxy receiver, far side) and carries it once
per link; each sink (a link stream at the far router, a receiver connection
at the near one) gets whole messages from the next message boundary after it
joined, through its own bounded queue:

* :class:`SessionFanout` frames the session's bytes
  (:class:`lbmr_proto.lbmc.StreamFramer`: at most one incomplete message
  held) and offers each run of whole messages (a :class:`Batch`) to every
  sink. It keeps the session's last TCP_SID control message (at most one
  message, < 64 KiB) and puts it first in the queue of every new sink, as the
  origin does on each of its connections.
* :class:`SinkQueue` holds at most ``max_queue`` bytes (the DRO's
  ``max-queue``: 1,000,000 bytes by default). A run that does not fit is
  cut at a message boundary: the messages that fit are queued, the rest are
  dropped and counted (the newest go, as in the DRO's "dropped due to
  blocking"); a sink never receives a partial message. All the sinks of a
  portal share a :class:`QueueBudget` (256 MiB): memory stays bounded
  whatever the number of receivers. A sink that holds
  bytes and takes none for ``stall_timeout`` seconds is stalled
  (:meth:`SinkQueue.stalled`): the shell disconnects it.

Every run of whole messages passes the session's message path
(:class:`router.core.message_path.MessagePath`, when it has one: the far
router's upstream session) before any sink's queue: the place where the
router rewrites them (REQUEST, late join, retransmission requests); a
rewritten run is what every sink gets, and what is counted. Units: bytes and
seconds (the caller's clock).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

from lbmr_proto import lbmc

from .message_path import MessagePath, headed

__all__ = ["DEFAULT_MAX_QUEUE", "MIN_MAX_QUEUE", "DEFAULT_STALL_TIMEOUT", "DEFAULT_BUDGET", "Batch",
           "Dropped", "QueueBudget", "SinkQueue", "SessionFanout"]

#: the DRO's endpoint ``max-queue`` default, bytes
DEFAULT_MAX_QUEUE = 1_000_000
#: the smallest queue: one message of the largest size always fits an empty queue
MIN_MAX_QUEUE = lbmc.MAX_MSGLEN + 1
#: seconds a receiver may hold queued bytes without taking any before it is disconnected
DEFAULT_STALL_TIMEOUT = 10.0
#: bytes the queues of one portal's sinks may hold together
DEFAULT_BUDGET = 256 << 20


#: a run of whole LBMC messages (``data``, ``ends``: the offset just past each)
Batch = lbmc.MessageRun


@dataclass(frozen=True, slots=True)
class Dropped:
    """``messages`` (``nbytes``) of a run did not fit ``sink``'s queue."""

    sink: Hashable
    messages: int
    nbytes: int


class QueueBudget:
    """Bytes all the sinks sharing it may hold together (``limit``), and how many
    they hold (``held``): a bound on a portal's memory whatever the number of
    its receivers."""

    __slots__ = ("limit", "held")

    def __init__(self, limit: int = DEFAULT_BUDGET) -> None:
        self.limit = limit
        self.held = 0


def _compact(view: memoryview) -> memoryview:
    """``view`` itself, or a copy when it is under a quarter of the run it
    points into (a sink holding a little of a run must not keep it all)."""
    return memoryview(bytes(view)) if len(view) * 4 < len(view.obj) else view


class SinkQueue:
    """The bounded queue of one sink: whole messages, at most ``limit`` bytes
    (and what ``budget`` has left). ``dropped_messages``/``dropped_bytes``
    count what did not fit; ``closing``: the session ended, the sink ends
    once its queue is empty."""

    __slots__ = ("limit", "budget", "chunks", "held", "last_progress", "dropped_messages",
                 "dropped_bytes", "messages", "closing")

    def __init__(self, limit: int, now: float, budget: QueueBudget | None = None) -> None:
        self.limit = limit
        self.budget = budget if budget is not None else QueueBudget(limit)
        self.chunks: deque[memoryview] = deque()
        self.held = 0  # bytes queued
        self.last_progress = now  # when it last took bytes (or last was empty)
        self.dropped_messages = 0
        self.dropped_bytes = 0
        self.messages = 0  # messages queued, in all
        self.closing = False

    def offer(self, batch: Batch, now: float) -> tuple[int, int]:
        """Queue the leading messages of ``batch`` that fit; (messages, bytes) dropped."""
        budget = self.budget
        k = batch.fitting(min(self.limit - self.held, budget.limit - budget.held))
        if k:
            cut = batch.ends[k - 1]
            if not self.held:
                self.last_progress = now
            self.chunks.append(_compact(memoryview(batch.data)[:cut]))
            self.held += cut
            budget.held += cut
            self.messages += k
        lost = batch.count - k
        if not lost:
            return 0, 0
        nbytes = len(batch.data) - (batch.ends[k - 1] if k else 0)
        self.dropped_messages += lost
        self.dropped_bytes += nbytes
        return lost, nbytes

    def head(self, max_parts: int = 64) -> list[memoryview]:
        """The first ``max_parts`` chunks to write (not taken until :meth:`wrote`)."""
        if len(self.chunks) <= max_parts:
            return list(self.chunks)
        return [self.chunks[i] for i in range(max_parts)]

    def wrote(self, nbytes: int, now: float) -> None:
        """``nbytes`` from the head went to the sink."""
        if nbytes <= 0:
            return
        self.held -= nbytes
        self.budget.held -= nbytes
        self.last_progress = now
        chunks = self.chunks
        while nbytes:
            c = chunks[0]
            if len(c) <= nbytes:
                nbytes -= len(c)
                chunks.popleft()
            else:
                chunks[0] = _compact(c[nbytes:])
                nbytes = 0

    def release(self) -> None:
        """The sink is gone: what it held goes back to the budget."""
        self.budget.held -= self.held
        self.held = 0
        self.chunks.clear()

    @property
    def finished(self) -> bool:
        """The session ended and everything queued went."""
        return self.closing and not self.held

    def stalled(self, now: float, timeout: float) -> bool:
        return self.held > 0 and now - self.last_progress >= timeout


class SessionFanout:
    """One live session's messages to its sinks (keys chosen by the caller).
    ``max_queue``: bytes per sink (at least :data:`MIN_MAX_QUEUE`); ``budget``:
    shared with the other sessions of the portal (default: this session's own,
    :data:`DEFAULT_BUDGET`); ``path``: the message path every run passes
    before the queues (None: none, the messages go as they came)."""

    def __init__(self, max_queue: int = DEFAULT_MAX_QUEUE, budget: QueueBudget | None = None,
                 path: MessagePath | None = None) -> None:
        if max_queue < MIN_MAX_QUEUE:
            raise ValueError(f"max_queue must be at least {MIN_MAX_QUEUE} bytes (one message)")
        self.max_queue = max_queue
        self.budget = budget if budget is not None else QueueBudget()
        self.path = path
        self.framer = lbmc.StreamFramer()
        self.sinks: dict[Hashable, SinkQueue] = {}
        self.session_id_message: bytes | None = None  # the last TCP_SID control message
        self.messages = 0  # whole messages framed
        self.nbytes = 0
        self.ended = False

    def add(self, key: Hashable, now: float) -> SinkQueue:
        """A new sink: it gets the session's TCP_SID message first (if one came),
        then the messages of every later :meth:`feed`."""
        q = self.sinks[key] = SinkQueue(self.max_queue, now, self.budget)
        q.closing = self.ended
        if self.session_id_message is not None:
            q.offer(Batch.of([self.session_id_message]), now)
        return q

    def remove(self, key: Hashable) -> None:
        """A sink leaves; its queue is emptied."""
        q = self.sinks.pop(key, None)
        if q is not None:
            q.release()

    def feed(self, data: bytes | memoryview, now: float) -> list[Dropped]:
        """The session's next bytes (never changed afterwards: the queues hold views
        of them): the whole messages they complete go to every sink's queue; what
        each sink had no room for. Raises
        :class:`lbmr_proto.lbmc.LbmcDecodeError` on bytes that are not LBMC."""
        return self._offer(self.framer.cut(data), now)

    def receive_buffer(self, size: int) -> memoryview:
        """Room for the session's next ``size`` bytes at most, to read into; then
        :meth:`received` (the messages they complete go to the queues as one run:
        :meth:`lbmr_proto.lbmc.StreamFramer.receive_buffer`)."""
        return self.framer.receive_buffer(size)

    def received(self, nbytes: int, now: float) -> list[Dropped]:
        """:meth:`feed` for the ``nbytes`` read into the last :meth:`receive_buffer`."""
        return self._offer(self.framer.received(nbytes), now)

    def _offer(self, batches: list[Batch], now: float) -> list[Dropped]:
        out = []
        path = self.path if self.path is not None and self.path.active else None
        for batch in batches:
            if path is None:
                self._note_controls(batch)
            else:  # one scan for the path and the TCP_SID control messages (both have headers)
                which = headed(batch)
                if which:
                    batch = path.run_at(batch, which, now)
                    self._note_controls_at(batch, which)
            self.messages += batch.count
            self.nbytes += len(batch.data)
            for key, q in self.sinks.items():
                lost, nbytes = q.offer(batch, now)
                if lost:
                    out.append(Dropped(key, lost, nbytes))
        return out

    def _note_controls(self, batch: Batch) -> None:
        data, start = batch.data, 0
        for end in batch.ends:
            if data[start] & 0x0F == lbmc.CONTROL:
                self._note_control(bytes(data[start:end]))
            start = end

    def _note_controls_at(self, batch: Batch, which: list[int]) -> None:
        """:meth:`_note_controls` for the messages ``which`` (those with extension
        headers: a TCP_SID control message has one)."""
        data, ends = batch.data, batch.ends
        for i in which:
            start = ends[i - 1] if i else 0
            if data[start] & 0x0F == lbmc.CONTROL:
                self._note_control(bytes(data[start:ends[i]]))

    def _note_control(self, message: bytes) -> None:
        try:
            m = lbmc.decode(message)
        except lbmc.LbmcDecodeError:
            return  # framed but not decodable: passed on as it is, not remembered
        if m.header(lbmc.TcpSidHeader) is not None:
            self.session_id_message = message

    def end(self) -> None:
        """The session ended: every sink ends once its queue is empty."""
        self.ended = True
        for q in self.sinks.values():
            q.closing = True
