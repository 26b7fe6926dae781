"""lbmr_runtime.buffers: a pooled buffer is given out again only once no view of it is alive."""

import pytest

from lbmr_proto import lbmc as C
from lbmr_proto import lbmc_stream
from lbmr_runtime.buffers import BufferPool


def test_a_buffer_comes_back_only_once_no_view_of_it_is_alive():
    pool = BufferPool(1000, keep=2)
    a = memoryview(pool.take(1000))
    held = a.toreadonly()[10:20]  # a view of a view holds the buffer too
    del a
    b = memoryview(pool.take(600))
    assert b.obj is not held.obj and len(b.obj) == 1000
    c = pool.take(1000)  # both kept ones are viewed: a new one, not kept
    assert c is not held.obj and c is not b.obj
    del b
    assert pool.take(1000) is not held.obj and pool.reused == 1  # b's came back, a's did not
    first = held.obj
    del held
    assert pool.take(1000) is first and pool.reused == 2
    assert len(first) == 1000  # (the probe that found it free left its size as it was)


def test_small_and_large_requests_get_buffers_of_their_own():
    pool = BufferPool(1000, keep=4)
    assert (len(pool.take(249)), len(pool.take(1001))) == (249, 1001)
    assert len(pool.take(250)) == 1000  # from a quarter of the size on: a pooled one
    assert pool.reused == 0
    with pytest.raises(ValueError):
        BufferPool(0)


def test_a_framer_reading_into_pooled_buffers_keeps_its_buffer_viewed_until_received():
    pool = BufferPool(4096, keep=1)
    f = lbmc_stream.StreamFramer()
    ms = [C.data_message(1, q, bytes([q]) * 700) for q in range(8)]
    stream = b"".join(ms)
    got, pos = [], 0
    for k in (1100, 1500, len(stream) - 2600):
        piece = stream[pos:pos + k]
        rx = f.receive_buffer(k, pool.take(f.buffered + k))
        assert f.reserved == f.buffered + k
        assert pool.take(2048) is not rx.obj  # reserved: not given out meanwhile
        rx[:len(piece)] = piece
        del rx
        runs = f.received(len(piece))
        got += [m for r in runs for m in r.messages()]  # copies: the views go with the runs
        del runs
        pos += k
    assert got == ms and pool.reused == 2
    with pytest.raises(ValueError):
        f.receive_buffer(100, bytearray(50))


def test_a_free_buffer_is_found_whichever_kept_one_it_is():
    pool = BufferPool(1000, keep=4)
    views = [memoryview(pool.take(1000)) for _ in range(4)]
    bufs = [v.obj for v in views]
    del views[2]  # the third given out comes free first; the oldest two stay viewed
    assert pool.take(1000) is bufs[2] and pool.reused == 1
    views.clear()
    assert {id(pool.take(1000)) for _ in range(3)} <= {id(b) for b in bufs}
    assert pool.reused == 4
