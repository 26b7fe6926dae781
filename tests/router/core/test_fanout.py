"""router.core.fanout, sans-IO: whole messages from a sink's join point,
bounded queues cut at message boundaries, drop accounting, the session's
TCP_SID for every new sink, the end of a session."""

from __future__ import annotations

import math

import pytest

from lbmr_proto import lbmc, lbmc_stream
from router.core.fanout import (
    DEFAULT_MAX_QUEUE,
    MIN_MAX_QUEUE,
    Batch,
    Dropped,
    QueueBudget,
    SessionFanout,
)


def msg(sqn: int, size: int = 100) -> bytes:
    return lbmc.data_message(3, sqn, bytes([sqn & 0xFF]) * size)


def taken(q) -> list[bytes]:
    """Everything queued, written out, framed back into messages."""
    data = b"".join(bytes(c) for c in q.head(1 << 20))
    q.wrote(len(data), 0.0)
    return lbmc_stream.StreamFramer().feed(data)


def test_reads_into_the_sessions_receive_buffer_queue_one_run_per_read_with_drops_counted():
    f = SessionFanout(max_queue=MIN_MAX_QUEUE)
    a = f.add("a", 0.0)
    stream = b"".join(msg(q, 1000) for q in range(80))
    drops, pos = [], 0
    for k in (1, 3, 1500, 700, 40_000, len(stream)):
        k = min(k, len(stream) - pos)
        f.receive_buffer(k)[:] = stream[pos:pos + k]
        drops += f.received(k, 0.0)
        pos += k
    assert len(a.chunks) <= 6  # one view per read that completed a message, no copies
    lost = sum(d.messages for d in drops)
    assert lost and a.dropped_messages == lost
    assert taken(a) == [msg(q, 1000) for q in range(80 - lost)]  # the newest went
    assert f.messages == 80


def test_a_sink_gets_whole_messages_from_the_next_boundary_after_it_joined():
    f = SessionFanout()
    a = f.add("a", 0.0)
    stream = b"".join(msg(q) for q in range(6))
    cut = len(msg(0)) * 2 + 37  # inside message 2
    assert f.feed(stream[:cut], 0.0) == []
    b = f.add("b", 0.0)  # joins while message 2 is half framed
    f.feed(stream[cut:], 0.0)
    assert taken(a) == [msg(q) for q in range(6)]
    got = taken(b)
    # message 2 was completed by the feed after b joined: b gets it whole, then the rest
    assert got == [msg(q) for q in range(2, 6)]
    assert f.messages == 6 and f.nbytes == len(stream)


def test_a_full_queue_drops_the_newest_messages_whole_and_counts_them():
    size = len(msg(0, 1000))
    f = SessionFanout(max_queue=MIN_MAX_QUEUE)
    q = f.add("slow", 0.0)
    fast = f.add("fast", 0.0)
    per_queue = MIN_MAX_QUEUE // size
    drops = f.feed(b"".join(msg(i, 1000) for i in range(per_queue + 5)), 1.0)
    assert drops == [Dropped("slow", 5, 5 * size), Dropped("fast", 5, 5 * size)]
    assert q.held == per_queue * size <= q.limit
    assert taken(fast) == [msg(i, 1000) for i in range(per_queue)]  # a prefix, whole messages
    # the fast one drained, so it has room; the slow one is still full
    drops = f.feed(msg(per_queue + 5, 1000), 2.0)
    assert drops == [Dropped("slow", 1, size)]
    assert q.dropped_messages == 6 and q.dropped_bytes == 6 * size
    assert taken(fast) == [msg(per_queue + 5, 1000)]


def test_partial_writes_keep_the_order_and_the_stall_clock():
    f = SessionFanout()
    q = f.add("r", 0.0)
    f.feed(msg(1) + msg(2), 5.0)
    assert not q.stalled(14.9, 10.0) and q.stalled(15.0, 10.0)
    q.wrote(30, 15.0)  # a partial write is progress
    assert not q.stalled(24.0, 10.0)
    assert lbmc_stream.StreamFramer().feed(bytes(msg(1)[:30]) + b"".join(bytes(c) for c in q.head())) == [msg(1), msg(2)]
    q.wrote(q.held, 16.0)
    assert q.held == 0 and not q.stalled(100.0, 10.0)  # holding nothing is never stalled


def test_every_new_sink_gets_the_sessions_tcp_sid_first():
    sid = lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(lbmc.TcpSidHeader(0, 0xABCD),)))
    f = SessionFanout()
    f.feed(sid + msg(0), 0.0)
    late = f.add("late", 1.0)
    f.feed(msg(1), 1.0)
    assert taken(late) == [sid, msg(1)]


def test_bytes_that_are_not_lbmc_raise_and_keep_raising():
    f = SessionFanout()
    f.add("a", 0.0)
    with pytest.raises(lbmc.LbmcDecodeError):
        f.feed(b"\xff\xff\xff\xff", 0.0)
    with pytest.raises(lbmc.LbmcDecodeError):
        f.feed(msg(0), 0.0)


def test_the_end_of_a_session_finishes_each_sink_once_its_queue_went():
    f = SessionFanout()
    q = f.add("a", 0.0)
    f.feed(msg(0), 0.0)
    f.end()
    assert q.closing and not q.finished
    taken(q)
    assert q.finished
    assert f.add("after", 0.0).finished  # a sink joining an ended session ends at once


def test_queue_bounds_and_batches():
    assert DEFAULT_MAX_QUEUE == 1_000_000  # the DRO's max-queue default
    with pytest.raises(ValueError):
        SessionFanout(max_queue=MIN_MAX_QUEUE - 1)
    b = Batch.of([b"a" * 10, b"b" * 20, b"c" * 5])
    assert b.ends == [10, 30, 35] and [b.fitting(n) for n in (0, 9, 10, 34, 35, 99)] == [0, 0, 1, 2, 3, 3]
    f = SessionFanout(max_queue=MIN_MAX_QUEUE)
    q = f.add("a", 0.0)
    big = lbmc.data_message(1, 0, b"x" * (lbmc.MAX_MSGLEN - lbmc.DATA_HEADER.size))
    assert f.feed(big, 0.0) == [] and q.held == len(big)  # the largest message fits an empty queue


def test_a_shared_budget_bounds_every_queue_of_a_portal_together():
    """Half the budget is open to every queue, the rest only to queues within
    their fair share (a quarter of the limit split among the sinks)."""
    def pair() -> bytes:  # a buffer of its own each time
        return msg(0, 1000) + msg(1, 1000)

    size = len(pair())
    budget = QueueBudget(limit=16 * size)
    one, two, three = (SessionFanout(budget=budget) for _ in range(3))
    a, b = one.add("a", 0.0), two.add("b", 0.0)
    three.add("c", 0.0)
    assert budget.sinks == 3 and budget.share == budget.limit // 12
    for _ in range(8):
        assert one.feed(pair(), 0.0) == []
    assert budget.held == a.held == budget.limit // 2  # the open half, all a's
    assert one.feed(pair(), 0.0) == [Dropped("a", 2, size)]  # over its share
    assert two.feed(pair(), 0.0) == []  # b holds nothing: within its share
    assert two.feed(pair(), 0.0) == [Dropped("b", 2, size)]  # its share is one pair
    assert budget.held == a.held + b.held
    taken(a)  # written: room again
    assert budget.held == b.held and one.feed(pair(), 0.0) == []
    two.remove("b")  # a receiver that leaves gives its bytes back
    three.remove("c")
    taken(a)
    assert budget.held == 0 and budget.sinks == 1


def test_the_budget_counts_a_buffer_once_however_many_queues_hold_views_of_it():
    budget = QueueBudget()
    f = SessionFanout(budget=budget)
    sinks = [f.add(k, 0.0) for k in range(100)]
    run = b"".join(msg(q, 1000) for q in range(50))
    assert f.feed(run, 0.0) == []
    assert all(q.held == len(run) for q in sinks) and budget.held == len(run)
    for q in sinks[:99]:
        taken(q)
    assert budget.held == len(run)  # one queue still holds a view: the whole buffer stays
    taken(sinks[99])
    assert budget.held == 0
    # a run cut at a message boundary keeps its whole buffer: that is what is counted
    small = SessionFanout(max_queue=MIN_MAX_QUEUE, budget=budget)
    q = small.add("q", 0.0)
    big = b"".join(msg(k, 10_000) for k in range(10))
    lost = small.feed(big, 0.0)[0].messages
    assert q.held == len(big) - lost * len(msg(0, 10_000)) and budget.held == len(big)
    # a little of a large buffer left after a write is copied: only it is counted
    q.wrote(q.held - 100, 0.0)
    assert q.held == 100 and budget.held == 100
    small.remove("q")
    f.remove(0)
    assert budget.held == 0


def test_a_small_read_into_a_large_buffer_is_counted_at_its_own_size():
    budget = QueueBudget()
    f = SessionFanout(budget=budget)
    f.add("a", 0.0)
    m = msg(0)
    f.receive_buffer(256 << 10)[:len(m)] = m
    assert f.received(len(m), 0.0) == [] and budget.held == len(m)


def sqn(message: bytes) -> int:
    return int.from_bytes(message[8:12], "big")


def test_five_readers_lose_nothing_beside_five_hundred_sinks_that_never_take():
    """A session read as the shell reads it (only as far as SessionFanout.room
    lets, a quarter of a second apart), 500 sinks that never take anything
    joining one by one over the session (each holding views of its own part
    of it: together more than the budget), 5 that take all after each read:
    the 5 get every message, in order; only the 500 drop (each holds the
    session back for its lag timeout, then no more); the budget is never
    exceeded."""
    limit, count, size = 24 << 20, 170_000, 188
    budget = QueueBudget(limit)
    f = SessionFanout(max_queue=MIN_MAX_QUEUE, budget=budget)
    readers = [f.add(("reader", k), 0.0) for k in range(5)]
    framers = [lbmc_stream.StreamFramer() for _ in readers]
    seen = [[] for _ in readers]
    stream = b"".join(msg(q, size) for q in range(count))
    pos, deaf, high, now, waits = 0, 0, 0, 0.0, 0
    drops = []
    while pos < len(stream):
        now += 0.25
        if deaf < 500 and pos >= deaf * MIN_MAX_QUEUE:
            f.add(("deaf", deaf), now)
            deaf += 1
        room = f.room(now)
        if not room:
            waits += 1
            continue
        k = min(room, 65_536, len(stream) - pos)
        f.receive_buffer(k)[:] = stream[pos:pos + k]
        drops += f.received(k, now)
        pos += k
        high = max(high, budget.held)
        for q, framer, got in zip(readers, framers, seen, strict=True):
            data = b"".join(q.head(1 << 20))
            q.wrote(len(data), 0.0)
            got.extend(map(sqn, framer.feed(data)))
    assert deaf == 500 and f.fell_behind == 500 and waits <= 500 * 4
    for got in seen:
        assert got == list(range(count))
    assert all(q.dropped_messages == 0 for q in readers)
    assert {d.sink[0] for d in drops} == {"deaf"}
    assert limit // 2 < high <= limit  # the budget was over half: the fair shares applied
    buffers = {id(b): b for q in f.sinks.values() for b, _, _ in q.chunks}
    assert budget.held == sum(b.size for b in buffers.values())  # each buffer held, once


def drain(q, framer, now: float, nbytes: int | None = None) -> list[int]:
    """What ``q`` writes at ``now`` (all, or ``nbytes`` at most): the sequence numbers of the
    messages it completes."""
    data = b"".join(q.head(1 << 20))[:nbytes]
    q.wrote(len(data), now)
    return list(map(sqn, framer.feed(data)))


def test_a_lone_sink_paces_the_session_and_never_drops_however_slow():
    f = SessionFanout(max_queue=MIN_MAX_QUEUE * 4)
    assert f.room(0.0) == f.max_queue  # nobody to keep: anything
    q = f.add("q", 0.0)
    framer, seen = lbmc_stream.StreamFramer(), []
    stream = b"".join(msg(k, 1000) for k in range(3000))
    pos, now, waits = 0, 0.0, 0
    while pos < len(stream):
        now += 0.01
        room = f.room(now)
        if room:
            k = min(room, len(stream) - pos)
            f.receive_buffer(k)[:] = stream[pos:pos + k]
            assert f.received(k, now) == []
            pos += k
        else:
            waits += 1
        seen += drain(q, framer, now, 2000)  # far slower than the session could go
    seen += drain(q, framer, now)
    assert waits and f.fell_behind == 0 and f.recheck_at() == math.inf
    assert seen == list(range(3000))


def test_a_sink_that_holds_a_faster_one_back_for_the_lag_timeout_drops_its_own():
    """Two sinks that keep up pace the session together; when one takes far
    less than the other, the session waits for it for ``lag_timeout`` seconds
    (nothing dropped), then stops waiting: the slow one drops its own
    messages, the fast one none, and gets them all."""
    f = SessionFanout(max_queue=MIN_MAX_QUEUE * 4, lag_timeout=1.0)
    fast, slow = f.add("fast", 0.0), f.add("slow", 0.0)
    framers = {"fast": lbmc_stream.StreamFramer(), "slow": lbmc_stream.StreamFramer()}
    seen = {"fast": [], "slow": []}
    stream = b"".join(msg(k, 1000) for k in range(6000))
    pos, now, first_drop, holding = 0, 0.0, None, None
    while pos < len(stream):
        now += 0.01
        room = f.room(now)
        if slow.holding and holding is None:
            holding = now
            assert f.recheck_at() <= now + 1.0
        if room:
            k = min(room, len(stream) - pos)
            f.receive_buffer(k)[:] = stream[pos:pos + k]
            for d in f.received(k, now):
                assert d.sink == "slow"
                first_drop = now if first_drop is None else first_drop
            pos += k
        seen["fast"] += drain(fast, framers["fast"], now)
        seen["slow"] += drain(slow, framers["slow"], now, None if pos < 1_000_000 else 3000)
    seen["fast"] += drain(fast, framers["fast"], now)
    assert holding is not None and first_drop >= holding + 1.0  # waited for it that long first
    assert slow.fell_behind == f.fell_behind == 1 and not slow.pacing and fast.pacing
    assert fast.dropped_messages == 0 and seen["fast"] == list(range(6000))
    assert slow.dropped_messages > 0 and seen["slow"][:100] == list(range(100))


def test_a_sink_that_never_takes_holds_the_others_back_for_the_lag_timeout_only():
    """Alone, a sink that never takes paces the session (every way out is
    full: nothing is read). Once it has taken nothing for a tenth of the lag
    timeout (it never took a queue's worth), the session no longer waits for
    it: a receiver that joins gets the session at once, and the one that does
    not take drops its own messages."""
    f = SessionFanout(max_queue=MIN_MAX_QUEUE, lag_timeout=1.0)
    deaf = f.add("deaf", 0.0)
    f.feed(b"".join(msg(k, 1000) for k in range(80)), 0.0)
    assert deaf.room < deaf.limit // 4 and f.room(0.0) == 0 and f.recheck_at() == pytest.approx(0.1)
    assert f.room(0.05) == 0 and deaf.pacing
    assert f.room(0.1) == 0 and not deaf.pacing and deaf.fell_behind == 1  # alone, it still paces
    assert f.recheck_at() == math.inf
    reader = f.add("reader", 20.0)
    assert f.room(20.0) >= MIN_MAX_QUEUE - lbmc.MAX_MSGLEN  # at once: the reader's room
    framer, seen = lbmc_stream.StreamFramer(), []
    for now in range(21, 221):
        stream = b"".join(msg(k, 1000) for k in range(50 * now, 50 * now + 50))
        assert f.room(float(now)) >= len(stream)
        assert {d.sink for d in f.feed(stream, float(now))} == {"deaf"}
        seen += drain(reader, framer, float(now))
    assert seen == list(range(50 * 21, 50 * 221)) and not deaf.pacing and reader.dropped_messages == 0


def test_sinks_that_keep_up_alike_pace_the_session_together_and_drop_nothing():
    """Sinks of one speed, each the slowest in turn (they take in bursts, out
    of step): none holds the others back for long, none stops pacing, nothing
    is dropped over 100 s of a session faster than they are."""
    f = SessionFanout(max_queue=MIN_MAX_QUEUE * 4, lag_timeout=1.0)
    sinks = [f.add(k, 0.0) for k in range(3)]
    framers = [lbmc_stream.StreamFramer() for _ in sinks]
    seen = [[] for _ in sinks]
    next_sqn, now, step = 0, 0.0, 0
    while now < 100.0:
        now += 0.01
        step += 1
        room = f.room(now)
        count = room // len(msg(0, 1000))
        if count:
            assert f.feed(b"".join(msg(k, 1000) for k in range(next_sqn, next_sqn + count)), now) == []
            next_sqn += count
        for k, (q, framer) in enumerate(zip(sinks, framers, strict=True)):
            if step % 3 == k:
                seen[k] += drain(q, framer, now, 60_000)
    for q, framer, got in zip(sinks, framers, seen, strict=True):
        got += drain(q, framer, now)
        assert got == list(range(next_sqn))
    assert f.fell_behind == 0 and next_sqn > 100_000


def test_the_incomplete_message_a_session_holds_between_reads_is_counted():
    budget = QueueBudget()
    f = SessionFanout(budget=budget)
    q = f.add("a", 0.0)
    m = msg(0, 1000)
    assert f.feed(m[:300], 0.0) == [] and budget.held == 300 and q.held == 0
    assert f.feed(m[300:], 0.0) == [] and budget.held == len(m) == q.held  # now in the queue
    taken(q)
    assert budget.held == 0
    f.feed(m[:10], 0.0)
    assert budget.held == 10
    f.end()  # the session ended: what it held goes back
    assert budget.held == 0


def test_a_sink_that_joins_while_bytes_are_held_back_starts_after_them():
    """The shell holds bytes back while the sinks that pace are full; a sink
    that joins then starts at the next message after those bytes (it joins at
    the next message, as behind a UM source, not at older ones), the others
    get them all."""
    f = SessionFanout()
    a = f.add("a", 0.0)
    stream = [msg(k) for k in range(8)]
    f.feed(b"".join(stream[:2]), 0.0)
    held = b"".join(stream[2:4]) + stream[4][:30]  # not fed yet: held back for a
    b = f.add("b", 0.0, behind=len(held))
    f.feed(held, 0.0)
    f.feed(stream[4][30:] + b"".join(stream[5:]), 0.0)
    assert taken(a) == stream
    assert taken(b) == stream[5:]  # message 4 began in the bytes held back
    c = f.add("c", 0.0, behind=len(stream[0]))
    f.feed(b"".join(msg(k) for k in range(8, 11)), 0.0)
    assert taken(c) == [msg(k) for k in range(9, 11)] and b.dropped_messages == c.dropped_messages == 0


def test_a_sink_that_joins_before_the_tcp_sid_held_back_still_gets_it_first():
    """The session's TCP_SID arrives in bytes held back when a sink joins: the sink
    skips those bytes (it joins at the next message) but not the TCP_SID, which a UM
    receiver needs first, as from the origin itself."""
    sid = lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(lbmc.TcpSidHeader(0, 0xABCD),)))
    f = SessionFanout()
    f.add("a", 0.0)
    stream = [msg(k) for k in range(4)]
    held = sid + stream[0]  # not fed yet: held back for a
    b = f.add("b", 0.0, behind=len(held))
    f.feed(held, 0.0)
    f.feed(b"".join(stream[1:]), 0.0)
    assert taken(b) == [sid] + stream[1:]


def test_opens_says_when_room_offers_bytes_again_for_its_sink():
    """A sink that took bytes wakes the session's reader only when room() would
    offer some (its queue empty, or room for a quarter beside the incomplete
    message held): opens() agrees with room() for the only sink, at every step."""
    f = SessionFanout(max_queue=MIN_MAX_QUEUE * 2)
    q = f.add("q", 0.0)
    assert f.opens(q) and f.room(0.0) > 0
    run = b"".join(msg(k, 1000) for k in range(120))
    f.feed(run + msg(999, 1000)[:500], 0.0)  # an incomplete message held by the framer
    assert f.framer.buffered == 500
    while q.held:
        assert f.opens(q) == (f.room(0.0) > 0), (q.held, q.room)
        q.wrote(min(q.held, 3000), 0.0)
    assert f.opens(q) and f.room(0.0) > 0


def test_head_whole_is_a_run_of_plain_messages_not_begun():
    """SinkQueue.head_whole: a run of whole messages none of which has extension
    headers, as it was queued (the far router sends it as one frame flagged
    whole); not a run with a headed message, not the rest of a run begun, not
    the TCP_SID a new sink gets first."""
    f = SessionFanout()
    sid = lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(lbmc.TcpSidHeader(0, 0xABCD),)))
    plain = b"".join(msg(q) for q in range(5))
    f.feed(plain, 0.0)  # before any sink: not queued
    f.feed(sid, 0.0)
    a = f.add("a", 0.0)
    assert a.held == len(sid) and a.head_whole() is None  # the TCP_SID first
    a.wrote(len(sid), 0.0)
    f.feed(plain, 0.0)
    assert bytes(a.head_whole()) == plain
    a.wrote(10, 0.0)  # begun: the rest is no longer a whole run
    assert a.head_whole() is None
    a.wrote(len(plain) - 10, 0.0)
    f.feed(msg(7) + sid + msg(8), 0.0)  # a run with a headed message
    assert a.head_whole() is None
    a.wrote(a.held, 0.0)
    assert a.head_whole() is None and not a.held
    # a run cut at a message boundary for want of room is still whole
    small = SessionFanout(max_queue=MIN_MAX_QUEUE)
    b = small.add("b", 0.0)
    big = b"".join(msg(q, 30_000) for q in range(4))
    assert small.feed(big, 0.0)  # some dropped
    assert bytes(b.head_whole()) == big[:b.held] and b.held % len(msg(0, 30_000)) == 0
