"""Fan-out of one live LBMC session to many sinks, sans-IO.

A UM TCP session is one live stream of LBMC messages for all its receivers.
The router takes it once (the proxy receiver, far side) and carries it once
per link; each sink (a link stream at the far router, a receiver connection
at the near one) gets whole messages from the next message boundary after it
joined, through its own bounded queue:

* :class:`SessionFanout` frames the session's bytes
  (:class:`lbmr_proto.lbmc_stream.StreamFramer`: at most one incomplete message
  held) and offers each run of whole messages (a :class:`Batch`) to every
  sink. It keeps the session's last TCP_SID control message (at most one
  message, < 64 KiB) and puts it first in the queue of every new sink, as the
  origin does on each of its connections.
* :class:`SinkQueue` holds at most ``max_queue`` bytes (the DRO's
  ``max-queue``: 1,000,000 bytes by default). A run that does not fit is
  cut at a message boundary: the messages that fit are queued, the rest are
  dropped and counted (the newest go, as in the DRO's "dropped due to
  blocking"); a sink never receives a partial message. A sink that holds
  bytes and takes none for ``stall_timeout`` seconds is stalled
  (:meth:`SinkQueue.stalled`): the shell disconnects it.
* The queues hold views of the session's buffers, not copies; a
  :class:`SharedBuffer` counts the queued views into one buffer, and all the
  sinks of a relay share a :class:`QueueBudget` (256 MiB) that counts each
  buffer once, at its full size, from its first view to its last: what is
  really held. Half the budget is open to every queue, the other half only
  to queues within their fair share (:attr:`QueueBudget.share`): sinks that
  do not keep up fill their own queues, never the room of the ones that do.
* Pacing (:meth:`SessionFanout.room`): the shell reads the session only as
  far as the slowest sink that keeps up takes it whole, so when every way
  out is full the origin is paced (as a UM TCP source is by its receivers)
  and nothing is dropped. A sink that holds the others back most of the
  time, for the lag timeout in all (``lag_timeout``, 1 s; a tenth of it
  until the sink took a queue's worth), or takes nothing for that long,
  stops pacing and drops its own messages until its queue
  is down to a quarter again: a receiver that never reads, or reads slower
  than the rest, holds them back for about the lag timeout.

Every run of whole messages passes the session's message path
(:class:`router.core.message_path.MessagePath`, when it has one: the far
router's upstream session) before any sink's queue: the place where the
router rewrites them (REQUEST, late join, retransmission requests); a
rewritten run is what every sink gets, and what is counted. Units: bytes and
seconds (the caller's clock).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

from lbmr_proto import lbmc, lbmc_stream
from lbmr_runtime.buffers import BufferPool

from .message_path import MessagePath, headed

__all__ = ["COPY_RATIO", "DEFAULT_MAX_QUEUE", "MIN_MAX_QUEUE", "DEFAULT_STALL_TIMEOUT", "DEFAULT_BUDGET",
           "DEFAULT_LAG_TIMEOUT", "Batch",
           "Dropped", "QueueBudget", "SharedBuffer", "SinkQueue", "SessionFanout"]

#: the DRO's endpoint ``max-queue`` default, bytes
DEFAULT_MAX_QUEUE = 1_000_000
#: the smallest queue: one message of the largest size always fits an empty queue
MIN_MAX_QUEUE = lbmc.MAX_MSGLEN + 1
#: seconds a receiver may hold queued bytes without taking any before it is disconnected
DEFAULT_STALL_TIMEOUT = 10.0
#: bytes the queues of one portal's sinks may hold together
DEFAULT_BUDGET = 256 << 20
#: bytes :meth:`SessionFanout.room` offers at least when a queue is empty
MIN_READ = 4096
#: seconds a sink may hold the others back (its queue nearly full while another's is not)
#: before the session stops waiting for it
DEFAULT_LAG_TIMEOUT = 1.0
#: ... a share of that for a sink that has not yet taken a queue's worth: a receiver that
#: connects and never reads (again and again) holds the others back a tenth as long
NEW_SINK_LAG = 0.1


#: a view of less than 1/COPY_RATIO of its buffer is queued as a copy of its own (a run
#: fed, the rest of a chunk after a write), so that a few bytes do not keep a large
#: buffer (counted in the budget at its full size) alive; larger ones stay views
#: (a copy of a quarter of each buffer fed in pieces cost a router half its bytes
#: copied once more)
COPY_RATIO = 16

#: a run of whole LBMC messages (``data``, ``ends``: the offset just past each)
Batch = lbmc_stream.MessageRun


@dataclass(frozen=True, slots=True)
class Dropped:
    """``messages`` (``nbytes``) of a run did not fit ``sink``'s queue."""

    sink: Hashable
    messages: int
    nbytes: int


class QueueBudget:
    """Bytes the queues of the sinks sharing it (``sinks`` of them) really hold
    together (``held``: each buffer that any queue holds a view of counted once,
    at its full size, however many queues share it) and the bound on them
    (``limit``).

    The lower half of the limit is open to every queue; the upper half only to
    queues that hold at most their fair share (:attr:`share`): sinks that do
    not keep up fill their own queues and about half the budget, and the
    ones that keep up (their queues near empty) still find room."""

    __slots__ = ("limit", "held", "sinks")

    def __init__(self, limit: int = DEFAULT_BUDGET) -> None:
        self.limit = limit
        self.held = 0
        self.sinks = 0

    @property
    def share(self) -> int:
        """Bytes of views a queue may hold and still add more once the budget is
        over half full: a quarter of the limit split among the sinks. The
        queues within their share hold at most a quarter together, so with the
        open half the budget stays below three quarters plus the views' slack:
        a queue within its share always finds room."""
        return self.limit // (4 * max(1, self.sinks))

    def room(self, queued: int, cost: int) -> int:
        """Bytes of views a queue that holds ``queued`` bytes of them may add,
        when the addition brings ``cost`` bytes of buffers nobody holds yet (0:
        views of buffers held already, which the queue would keep alive)."""
        held = self.held + cost
        if held <= self.limit >> 1:
            return self.limit  # the open half (the queue's own limit applies)
        if cost and held > self.limit:
            return 0
        return self.share - queued


class SharedBuffer:
    """A buffer that queued views point into: its ``size`` in bytes (what it
    really holds in memory) and how many queued chunks (``refs``, over all the
    sinks) hold views of it. The budget counts it from its first view to its
    last."""

    __slots__ = ("size", "refs")

    def __init__(self, size: int) -> None:
        self.size = size
        self.refs = 0

    @classmethod
    def of(cls, data: bytes | memoryview) -> SharedBuffer:
        """The buffer ``data`` is (``bytes``) or is a view into (``memoryview``)."""
        if isinstance(data, memoryview):
            obj = data.obj
            return cls(obj.nbytes if isinstance(obj, memoryview) else len(obj))
        return cls(len(data))


class SinkQueue:
    """The bounded queue of one sink: whole messages, at most ``limit`` bytes
    (and what ``budget`` lets it add). ``dropped_messages``/``dropped_bytes``
    count what did not fit; ``closing``: the session ended, the sink ends
    once its queue is empty."""

    __slots__ = ("limit", "budget", "chunks", "held", "last_progress", "dropped_messages",
                 "dropped_bytes", "messages", "closing", "pacing", "holding", "lag", "fell_behind", "joins_at", "taken",
                 "sid_sent")

    def __init__(self, limit: int, now: float, budget: QueueBudget | None = None) -> None:
        self.limit = limit
        self.budget = budget if budget is not None else QueueBudget(limit)
        self.budget.sinks += 1
        # the views queued, each with the buffer it points into and whether it is a whole
        # run of messages without extension headers, none of it written yet
        self.chunks: deque[tuple[SharedBuffer, memoryview, bool]] = deque()
        self.held = 0  # bytes queued (of views)
        self.last_progress = now  # when it last took bytes (or last was empty)
        self.dropped_messages = 0
        self.dropped_bytes = 0
        self.messages = 0  # messages queued, in all
        self.closing = False
        # the session waits for this sink (SessionFanout.room): from when it joined, until it
        # held the others back for the lag timeout; again once its queue is down to a quarter
        self.pacing = True
        self.holding = False  # it held the others back at the last SessionFanout.room
        self.lag = 0.0  # seconds it held them back, less twice the seconds it did not (>= 0)
        self.fell_behind = 0  # times it stopped pacing
        self.joins_at = 0  # its first message starts at or after this offset of the session's bytes
        self.taken = 0  # bytes it took, in all
        self.sid_sent = False  # the session's TCP_SID message was queued for it

    @property
    def room(self) -> int:
        """Bytes of new buffers the queue takes now: its own limit, and the
        budget's (what its open half has left, or the queue's fair share)."""
        r = self.limit - self.held
        b = self.budget
        open_half = (b.limit >> 1) - b.held
        if r <= open_half:
            return r
        return max(open_half, min(r, b.share - self.held, b.limit - b.held))

    def offer(self, batch: Batch, now: float, buffer: SharedBuffer | None = None,
              plain: bool = False) -> tuple[int, int]:
        """Queue the leading messages of ``batch`` that fit; (messages, bytes)
        dropped. ``buffer``: the one ``batch.data`` is in (shared with the other
        sinks the batch is offered to; by default its own); ``plain``: none of
        its messages has extension headers (:meth:`head_whole`)."""
        if buffer is None:
            buffer = SharedBuffer.of(batch.data)
        room = min(self.limit - self.held, self.budget.room(self.held, 0 if buffer.refs else buffer.size))
        k = batch.fitting(room)
        if k:
            cut = batch.ends[k - 1]
            if not self.held:
                self.last_progress = now
            self._hold(buffer, memoryview(batch.data)[:cut], plain)
            self.held += cut
            self.messages += k
        lost = batch.count - k
        if not lost:
            return 0, 0
        nbytes = len(batch.data) - (batch.ends[k - 1] if k else 0)
        self.dropped_messages += lost
        self.dropped_bytes += nbytes
        return lost, nbytes

    def _hold(self, buffer: SharedBuffer, view: memoryview, plain: bool) -> None:
        if not buffer.refs:
            self.budget.held += buffer.size
        buffer.refs += 1
        self.chunks.append((buffer, view, plain))

    def _let_go(self, buffer: SharedBuffer) -> None:
        buffer.refs -= 1
        if not buffer.refs:
            self.budget.held -= buffer.size

    def head(self, max_parts: int = 64) -> list[memoryview]:
        """The first ``max_parts`` chunks to write (not taken until :meth:`wrote`)."""
        chunks = self.chunks
        return [chunks[i][1] for i in range(min(max_parts, len(chunks)))]

    def head_whole(self) -> memoryview | None:
        """The chunk at the head when it is a whole run of messages none of which has
        extension headers, none of it written yet (a far router sends it as one frame
        that the near one may pass on unframed); else None."""
        if self.chunks:
            _, view, plain = self.chunks[0]
            if plain:
                return view
        return None

    def wrote(self, nbytes: int, now: float) -> None:
        """``nbytes`` from the head went to the sink."""
        if nbytes <= 0:
            return
        self.held -= nbytes
        self.taken += nbytes
        self.last_progress = now
        if self.held <= self.limit >> 2:
            self.pacing = True  # it took most of what it had: it keeps up again
        chunks = self.chunks
        while nbytes:
            buffer, c, _ = chunks[0]
            if len(c) <= nbytes:
                nbytes -= len(c)
                chunks.popleft()
                self._let_go(buffer)
            else:
                rest = c[nbytes:]
                if len(rest) * COPY_RATIO < buffer.size:  # a little of a large buffer: a copy of its own
                    chunks.popleft()
                    self._let_go(buffer)
                    own = bytes(rest)
                    own_buffer = SharedBuffer(len(own))
                    own_buffer.refs = 1
                    self.budget.held += own_buffer.size
                    chunks.appendleft((own_buffer, memoryview(own), False))
                else:
                    chunks[0] = (buffer, rest, False)
                nbytes = 0

    def release(self) -> None:
        """The sink is gone: what it held goes back to the budget."""
        for buffer, _, _ in self.chunks:
            self._let_go(buffer)
        self.chunks.clear()
        self.held = 0
        self.budget.sinks -= 1
        self.limit = 0  # (takes nothing more)

    @property
    def finished(self) -> bool:
        """The session ended and everything queued went."""
        return self.closing and not self.held

    def stalled(self, now: float, timeout: float) -> bool:
        return self.held > 0 and now - self.last_progress >= timeout


def _from(batch: Batch, first: int) -> Batch:
    """The messages of ``batch`` from its ``first`` (> 0) on, a view of its bytes."""
    base = batch.ends[first - 1]
    return Batch(memoryview(batch.data)[base:], [end - base for end in batch.ends[first:]])


class SessionFanout:
    """One live session's messages to its sinks (keys chosen by the caller).
    ``max_queue``: bytes per sink (at least :data:`MIN_MAX_QUEUE`); ``budget``:
    shared with the other sessions of the portal (default: this session's own,
    :data:`DEFAULT_BUDGET`); ``path``: the message path every run passes
    before the queues (None: none, the messages go as they came);
    ``lag_timeout``: seconds a sink may hold the others back (:meth:`room`);
    ``pool``: where :meth:`receive_buffer` takes its buffers (None: a new one
    each time)."""

    def __init__(self, max_queue: int = DEFAULT_MAX_QUEUE, budget: QueueBudget | None = None,
                 path: MessagePath | None = None, lag_timeout: float = DEFAULT_LAG_TIMEOUT,
                 pool: BufferPool | None = None) -> None:
        if max_queue < MIN_MAX_QUEUE:
            raise ValueError(f"max_queue must be at least {MIN_MAX_QUEUE} bytes (one message)")
        self.max_queue = max_queue
        self.lag_timeout = lag_timeout
        self.fell_behind = 0  # times a sink stopped pacing (SinkQueue.fell_behind)
        self._checked = 0.0  # when room() last looked
        self.budget = budget if budget is not None else QueueBudget()
        self.path = path
        self.pool = pool
        self.framer = lbmc_stream.StreamFramer()
        self.sinks: dict[Hashable, SinkQueue] = {}
        self.session_id_message: bytes | None = None  # the last TCP_SID control message
        self._partial = 0  # bytes of the incomplete message the framer holds, counted in the budget
        self._last_buffer: SharedBuffer | None = None  # the buffer of the last run queued ...
        self._last_obj = 0  # ... and the id of the object it is
        self.messages = 0  # whole messages framed
        self.fed = 0  # bytes of the session fed
        self.nbytes = 0
        self.ended = False

    def add(self, key: Hashable, now: float, behind: int = 0, limit: int | None = None) -> SinkQueue:
        """A new sink: it gets the session's TCP_SID message first (if one came),
        then the messages of every later :meth:`feed`; with ``behind``, the
        bytes of the session the caller holds and has not fed yet (taken before
        the sink came), only the messages that start after them: it joins at
        the next message, not at bytes held back for the others. ``limit``:
        its queue's bytes (default ``max_queue``; at least that)."""
        q = self.sinks[key] = SinkQueue(max(limit or 0, self.max_queue), now, self.budget)
        if behind > 0:
            q.joins_at = self.fed + behind
        q.closing = self.ended
        if self.session_id_message is not None:
            q.offer(Batch.of([self.session_id_message]), now)
            q.sid_sent = True
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
        start = self.framer.offset
        self.fed += len(data)
        return self._offer(self.framer.cut(data), now, start)

    def receive_buffer(self, size: int) -> memoryview:
        """Room for the session's next ``size`` bytes at most, to read into; then
        :meth:`received` (the messages they complete go to the queues as one run:
        :meth:`lbmr_proto.lbmc_stream.StreamFramer.receive_buffer`; from the pool, if
        the session has one)."""
        framer = self.framer
        if self.pool is None:
            return framer.receive_buffer(size)
        return framer.receive_buffer(size, self.pool.take(framer.buffered + size))

    def drop_receive_buffer(self) -> None:
        """The last :meth:`receive_buffer` got nothing (the socket was empty): let it
        go, so that an idle session holds none."""
        self.framer.drop_receive_buffer()

    def received(self, nbytes: int, now: float) -> list[Dropped]:
        """:meth:`feed` for the ``nbytes`` read into the last :meth:`receive_buffer`."""
        start = self.framer.offset
        self.fed += nbytes
        return self._offer(self.framer.received(nbytes), now, start)

    def room(self, now: float) -> int:
        """Bytes of the session the fan-out takes now: as far as the pacing sink
        with the least room takes them whole (:attr:`SinkQueue.room`, less the
        incomplete message the framer holds), so that no pacing sink drops; 0
        when that sink holds bytes and has less than a quarter of its queue
        left (wait for it: :meth:`SinkQueue.wrote`, or :meth:`recheck_at`).

        A sink paces from when it joins. A pacing sink holds the others back
        when it has less than half the room of the sink with the most; one
        that does so more than two thirds of the time, for ``lag_timeout``
        seconds in all (:attr:`SinkQueue.lag`), or that holds bytes and took
        none for ``lag_timeout`` seconds (a tenth of that, NEW_SINK_LAG, until
        it took a queue's worth), stops pacing (``fell_behind``): it drops its
        own messages until its queue is down to a quarter, then paces again.
        With no pacing sink the sink with the most room paces; with no sink,
        ``max_queue`` (nobody to keep). So the origin is paced by the slowest
        receiver that keeps up, never dropped for; one slower than the rest
        (or that never reads) holds them back for about the lag timeout, then
        loses its own messages."""
        sinks = self.sinks
        if not sinks:
            return self.max_queue
        dt = max(0.0, now - self._checked)
        self._checked = now
        best, best_size = -1, 0
        for q in sinks.values():
            r = q.room
            if r > best:
                best, best_size = r, r + q.held
        slow, slow_size, paced = best, best_size, False
        half = best >> 1
        for q in sinks.values():
            if not q.pacing:
                continue
            if dt:  # what it did since the last call
                q.lag = q.lag + dt if q.holding else max(0.0, q.lag - 2 * dt)
            timeout = self._timeout(q)
            if q.lag >= timeout or (q.held and now - q.last_progress >= timeout):
                q.pacing, q.holding, q.lag = False, False, 0.0
                q.fell_behind += 1
                self.fell_behind += 1
                continue
            r = q.room
            q.holding = r < half
            if not paced or r < slow:
                slow, slow_size, paced = r, r + q.held, True
        room = slow - self.framer.buffered
        if slow == slow_size:  # an empty queue: nothing to wait for
            return max(room, MIN_READ)
        return room if room >= slow_size >> 2 else 0

    def opens(self, q: SinkQueue) -> bool:
        """Whether :meth:`room` would offer bytes now were ``q`` the pacing sink with
        the least room (its queue empty, or room for a quarter of it beside the
        incomplete message held): a sink that took bytes wakes the reader of the
        session only then (less would be paced again at once)."""
        if not q.held:
            return True
        r = q.room
        return r - self.framer.buffered >= (r + q.held) >> 2

    def recheck_at(self) -> float:
        """When :meth:`room` may say more without any sink taking bytes: when a
        pacing sink that holds bytes reaches the lag timeout (inf: none)."""
        at = math.inf
        for q in self.sinks.values():
            if q.pacing and q.held:
                timeout = self._timeout(q)
                at = min(at, q.last_progress + timeout)
                if q.holding:
                    at = min(at, self._checked + timeout - q.lag)
        return at

    def _timeout(self, q: SinkQueue) -> float:
        """The lag timeout of ``q``: NEW_SINK_LAG of it until it took a queue's worth."""
        return self.lag_timeout if q.taken >= q.limit else self.lag_timeout * NEW_SINK_LAG

    def _offer(self, batches: list[Batch], now: float, offset: int) -> list[Dropped]:
        """``batches``, whose bytes start at ``offset`` of the session's, to the sinks."""
        partial = self.framer.buffered  # (held between reads: counted too)
        self.budget.held += partial - self._partial
        self._partial = partial
        out = []
        path = self.path if self.path is not None and self.path.active else None
        for batch in batches:
            start, ends = offset, batch.ends  # (as they came: the path may change lengths)
            offset += len(batch.data)
            which = headed(batch)  # one scan for the path and the TCP_SID control messages (both have headers)
            if which:
                if path is not None:
                    batch = path.run_at(batch, which, now)
                self._note_controls_at(batch, which)
            self.messages += batch.count
            self.nbytes += len(batch.data)
            if not self.sinks:
                continue
            data = batch.data
            if isinstance(data, memoryview) and len(data) * COPY_RATIO < SharedBuffer.of(data).size:
                batch = Batch(bytes(data), batch.ends)  # a little of a large buffer: a copy
            buffer = self._buffer_of(batch.data)
            for key, q in self.sinks.items():
                if q.joins_at > start:  # joined after bytes held back: from its next message
                    if not q.sid_sent and self.session_id_message is not None:
                        # the TCP_SID came in the bytes held back: it still goes first
                        q.offer(Batch.of([self.session_id_message]), now)
                        q.sid_sent = True
                    first = bisect_left(ends, q.joins_at - start) + 1
                    if first >= batch.count:
                        continue
                    lost, nbytes = q.offer(_from(batch, first), now, buffer, not which)
                else:
                    lost, nbytes = q.offer(batch, now, buffer, not which)
                if lost:
                    out.append(Dropped(key, lost, nbytes))
        return out

    def _buffer_of(self, data: bytes | memoryview) -> SharedBuffer:
        """The :class:`SharedBuffer` of the run ``data``: the last one's when it is
        a view into the same buffer still held (a buffer fed in pieces is counted
        once), else a new one."""
        if not isinstance(data, memoryview):
            return SharedBuffer.of(data)
        last = self._last_buffer
        if last is not None and last.refs and self._last_obj == id(data.obj):
            return last
        self._last_buffer = buffer = SharedBuffer.of(data)
        self._last_obj = id(data.obj)  # (not the object: held views keep it alive, ids unique)
        return buffer

    def _note_controls_at(self, batch: Batch, which: list[int]) -> None:
        """Remember the last TCP_SID control message among the messages ``which`` of
        ``batch`` (those with extension headers: a TCP_SID control message has one)."""
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
        """The session ended: every sink ends once its queue is empty (and the
        incomplete message the framer holds goes back to the budget)."""
        self.budget.held -= self._partial
        self._partial = 0
        self.ended = True
        for q in self.sinks.values():
            q.closing = True
