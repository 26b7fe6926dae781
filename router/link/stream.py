"""The I/O side of one relayed stream on a peer link (:class:`StreamState`, either
end of the link), the pieces of its zero-copy path (:class:`PipeSeg`,
:class:`HeldChunk`) and the sizes of its flow control.

The order of a stream's bytes from the peer: ``StreamState.incoming`` holds them in
the order of the stream, ``bytes`` (or read-only views) of the copy path and
:class:`PipeSeg` items of the zero-copy path alike; bytes join at its tail
(:meth:`StreamState.pipe_in` for spliced ones) and only the item at its head goes
to the stream's socket (:meth:`StreamState.splice_out` for pipe segments; the
stream's pump for the rest), an item staying at the head until all its bytes went.
So no byte overtakes another of its stream, whichever path each took.
"""

from __future__ import annotations

import os
from collections import deque

import trio

from ..peerlink import streams as S
from ..peerlink.outqueue import OutQueue
from .splice import Pipe, PipePool, splice

READ_SIZE = 256 << 10  # bytes per read from the link and from relayed TCP streams
# Per-stream flow control: how many bytes a peer may send on one stream before
# credit comes back (also the most a stream buffers here), and the largest
# STREAM_DATA frame. bench/router.py: 256 KiB/64 KiB gave ~350 MB/s through two
# routers on loopback, 4 MiB/256 KiB ~760 MB/s.
# A stream's window starts at STREAM_WINDOW (the credit in STREAM_OPEN/ACCEPT) and
# doubles, up to STREAM_WINDOW_MAX, while its consumer keeps up, within
# LINK_WINDOW_BUDGET bytes of growth over all the link's streams: a stream never holds
# more than STREAM_WINDOW_MAX here, a link never more than STREAM_WINDOW per stream plus
# LINK_WINDOW_BUDGET. (bench/router.py, zero copy, busy 2-core host: a 4 MiB window
# stalled the stream whenever a router waited for the CPU, about 0.6 of the splice relay;
# windows of 16 to 32 MiB about 0.7 to 0.75, with a third less CPU per byte.)
STREAM_WINDOW = 4 << 20
STREAM_WINDOW_MAX = 32 << 20
LINK_WINDOW_BUDGET = 128 << 20
# The initial windows of a link's open streams total at most LINK_INITIAL_BUDGET: past
# it a new stream starts at 64 KiB (and grows while its consumer keeps up). A TRD's
# receivers that open thousands of streams and never read hold at most this, plus 64 KiB
# a stream beyond it, plus LINK_WINDOW_BUDGET (4096 such streams: 16 GiB before).
LINK_INITIAL_BUDGET = 128 << 20
STREAM_FRAME = 256 << 10
# pipes one stream may be filling at once before its bytes take the copy path. Full pipes
# waiting for the stream's socket to drain them (rx_retired) are not counted: a stream holds
# at most its receive window in pipes (bytes the peer may send it), and a router at most its
# PipePool's limit (256 pipes of 1 MiB) in all; a stream whose window grew has a consumer
# that keeps up, so its pipes rarely wait long
RX_PIPES = 4


class PipeSeg:
    """``nbytes`` of a stream's bytes from the peer, in order, at the head of ``pipe``."""

    __slots__ = ("pipe", "nbytes")

    def __init__(self, pipe: Pipe, nbytes: int) -> None:
        self.pipe = pipe
        self.nbytes = nbytes


class SplicedBytes(bytes):
    """Bytes of a frame spliced to a fanned-out session's lone receiver
    (:attr:`StreamState.whole_only`) that took the copy path (no pipe was free):
    they go to ``sock`` in order with the pipe segments around them, never to
    the session's framer."""

    __slots__ = ()


#: the types of what a stream holds of frames spliced to its ``sock`` (items of ``incoming``)
SPLICED_ITEMS = (PipeSeg, SplicedBytes)


class HeldChunk:
    """The pipe of one queued :class:`~router.peerlink.streams.HeldData` frame; ``done``
    once the writer wrote it (or the link threw it away)."""

    __slots__ = ("pipe", "done")

    def __init__(self, pipe: Pipe) -> None:
        self.pipe = pipe
        self.done = False


class StreamState:
    """The I/O side of one relayed stream (either end of the link). The methods
    of its zero-copy path take the link's :class:`~router.link.splice.PipePool`
    (``pool``), where its pipes come from and go back to."""

    def __init__(self, sid: int, kind: int) -> None:
        self.sid = sid
        self.kind = kind
        self.accepted = trio.Event()
        self.refused: str | None = None
        self.credit = trio.Event()  # set when credit may have become available
        self.incoming: deque[bytes] = deque()  # data or datagrams from the peer
        self.incoming_ready = trio.Event()
        self.closed = False
        self.sock = None  # trio SocketStream (TCP) or UDP socket (far LBT-RU)
        self.ru_addr: tuple[str, int] | None = None  # near LBT-RU: the receiver
        # False when ``sock`` belongs to someone else (near LBT-RU: the proxy's socket,
        # shared by all its receivers and still read by the proxy after the link ends)
        self.owns_sock = True
        self.last_active = 0.0  # LBT-RU: when a datagram last crossed (either way)
        self.advert_id = 0  # far side: the advertisement the peer opened the stream for
        self.source_ended = False  # the local socket ended (far side: the source closed it)
        # zero copy: the pipe the link's reader splices the peer's bytes into, older ones
        # still holding bytes, how many the stream holds (the bytes are PipeSeg items of
        # ``incoming``); the reader is in the middle of a payload for this stream
        self.rx_pipe: Pipe | None = None
        self.rx_retired: set[Pipe] = set()
        self.rx_pipes = 0
        self.rx_splicing = False
        self.sink_broken = False  # splicing into ``sock`` failed: the pump ends the stream
        # a fanned-out TCP session's stream (near side): its bytes are spliced into ``sock``
        # (its proxy's lone receiver) only for frames of whole messages (FLAG_WHOLE_MESSAGES)
        # while ``splice_whole``, and passed on at once only while ``sink_idle`` (nothing is
        # queued for ``sock`` elsewhere); the proxy sets both (router.relays.tcp_fanout)
        self.whole_only = False
        self.splice_whole = False
        self.sink_idle = True
        self.spliced_in = 0  # bytes spliced from the link into the stream's pipes, in all
        self.spliced_out = 0  # ... and out of them (to ``sock``, or thrown away), in all
        # the stream's frames in the link writer's queue, as noted (:meth:`queued`): per
        # flush, the queue's ``data_in`` after it and the encoded bytes it queued; their sum
        self.queued_frames: deque[tuple[int, int]] = deque()
        self.queued_bytes = 0

    def queued(self, outq: OutQueue, nbytes: int) -> None:
        """The stream's frames just queued in the link writer's ``outq``: ``nbytes``
        encoded bytes, the last the queue took."""
        self.queued_frames.append((outq.data_in, nbytes))
        self.queued_bytes += nbytes

    def writer_backlog(self, outq: OutQueue) -> int:
        """Encoded bytes of the stream's frames (as :meth:`queued` noted them) still
        in the link writer's queue ``outq``: not yet taken by the writer (a frame
        taken is being written from memory, or was written)."""
        frames, out = self.queued_frames, outq.data_out
        while frames and frames[0][0] <= out:
            self.queued_bytes -= frames.popleft()[1]
        return self.queued_bytes

    def take_data(self, data: bytes, whole: bool) -> None:
        """Bytes of a STREAM_DATA frame that came on the copy path (``whole``: flagged
        whole messages) at the tail of ``incoming``: for a fanned-out session whose
        frames go to its lone receiver (``splice_whole``), as :class:`SplicedBytes`
        (to ``sock`` as they are, in order, never framed)."""
        if whole and self.whole_only and self.splice_whole:
            data = SplicedBytes(data)
        self.incoming.append(data)
        self.incoming_ready.set()

    def wake(self) -> None:
        self.incoming_ready.set()
        self.credit.set()

    # --------------------------------------------------- zero copy: the pipes

    def fill_pipe(self, pool: PipePool, full: bool) -> Pipe | None:
        """The pipe to splice the stream's bytes into: the current one, or (none yet, or
        ``full``) a new one if the stream holds fewer than RX_PIPES and the pool has one."""
        pipe = self.rx_pipe
        if pipe is not None and not full:
            return pipe
        if self.rx_pipes >= RX_PIPES:
            return None
        new = pool.acquire()
        if new is None:
            return None
        if pipe is not None and pipe.held == 0:
            pool.release(pipe)
        elif pipe is not None:
            self.rx_pipes -= 1  # stays in use until its segments are delivered, then released
            self.rx_retired.add(pipe)
        self.rx_pipe = new
        self.rx_pipes += 1
        return new

    def pipe_in(self, pipe: Pipe, k: int) -> bool:
        """``k`` bytes were spliced into ``pipe``: count them at the tail of ``incoming``.
        True when they are at its head (nothing of the stream is ahead of them: they may
        go on to the socket at once)."""
        pipe.held += k
        self.spliced_in += k
        inc = self.incoming
        if inc and type(inc[-1]) is PipeSeg and inc[-1].pipe is pipe:
            inc[-1].nbytes += k
        else:
            inc.append(PipeSeg(pipe, k))
        return len(inc) == 1

    def splice_out(self, pool: PipePool) -> tuple[int, bool]:
        """Splice the pipe segments at the head of ``incoming`` into the stream's socket
        as far as it takes them now (never waits): the bytes that went, and True when the
        head is no longer a pipe segment (all went, or bytes are next), False when bytes
        are left in the pipe (the socket is full, or failed: ``sink_broken``)."""
        inc = self.incoming
        fd = self.sock.socket.fileno()
        moved = 0
        while inc and type(inc[0]) is PipeSeg:
            seg = inc[0]
            try:
                k = splice(seg.pipe.r, fd, seg.nbytes)
            except (BlockingIOError, InterruptedError):
                return moved, False
            except OSError:
                self.sink_broken = True  # the receiver went away (or the link took the pipe)
                return moved, False
            if k <= 0:
                self.sink_broken = True
                return moved, False
            moved += k
            self.pipe_out(pool, seg, k)
        return moved, True

    def pipe_out(self, pool: PipePool, seg: PipeSeg, k: int) -> None:
        """``k`` bytes of the head segment ``seg`` went to the stream's socket: account
        them (the caller returns their credit), drop the segment when done, give back
        drained pipes."""
        seg.nbytes -= k
        self.spliced_out += k
        pipe = seg.pipe
        pipe.held -= k
        if seg.nbytes:
            return
        self.incoming.popleft()
        self._drained(pool, pipe)

    def _drained(self, pool: PipePool, pipe: Pipe) -> None:
        """Give ``pipe`` back if it is empty and no longer filled."""
        if pipe.held == 0:
            if pipe in self.rx_retired:
                self.rx_retired.discard(pipe)
                pool.release(pipe)
            elif pipe is self.rx_pipe and not self.rx_splicing:
                self.retire_pipe(pool)

    def drop_spliced(self, pool: PipePool) -> int:
        """Throw away what ``incoming`` holds of frames spliced to ``sock`` (its receiver
        is gone; the pipes' bytes read and dropped), keeping the other bytes in order:
        the number of bytes dropped."""
        kept, dropped = [], 0
        for item in self.incoming:
            if type(item) is PipeSeg:
                pipe, n = item.pipe, item.nbytes
                _discard(pipe, n)
                pipe.held -= n
                dropped += n
                self._drained(pool, pipe)
            elif type(item) is SplicedBytes:
                dropped += len(item)
            else:
                kept.append(item)
        if dropped:
            self.incoming.clear()
            self.incoming.extend(kept)
        return dropped

    def retire_pipe(self, pool: PipePool) -> None:
        """Give back the stream's fill pipe (empty, or the stream is gone)."""
        if self.rx_pipe is not None:
            pool.release(self.rx_pipe)
            self.rx_pipe = None
            self.rx_pipes -= 1

    def release_pipes(self, pool: PipePool) -> None:
        """The stream is over: give back its pipes (closed if they still hold bytes)."""
        if self.rx_splicing:
            return  # the reader gives them back when it is done with the payload
        self.retire_pipe(pool)
        for pipe in self.rx_retired:
            pool.release(pipe)
        self.rx_retired.clear()


def _discard(pipe: Pipe, nbytes: int) -> None:
    """Read and drop ``nbytes`` at the head of ``pipe`` (copied once: a rare path)."""
    while nbytes > 0 and not pipe.closed:
        try:
            k = len(os.read(pipe.r, min(nbytes, 1 << 20)))
        except OSError:
            return
        if not k:
            return
        nbytes -= k


def return_credit(link, st: StreamState, nbytes: int, direct: bool = False) -> bool:
    """``nbytes`` of stream ``st``'s bytes from the peer were passed on: their credit goes
    back to ``link``'s other end (a :class:`router.link.Link` or a
    :class:`router.shell.pair_link.PairLink`), and the frames it makes are queued
    (``direct``: written at once, zero-copy links). False when the stream is gone here."""
    try:
        link.streams.consumed(st.sid, nbytes)
    except S.LocalStreamError:
        return False
    link.flush_streams(direct)
    return True


def flush_stream(link, st: StreamState) -> None:
    """``link.flush_streams(direct=True)`` after a data pump queued frames of ``st``
    (``link``: a :class:`router.link.Link` or a
    :class:`router.shell.pair_link.PairLink`): what the flush queued is noted as the
    stream's (:meth:`StreamState.writer_backlog` tells how much of it the writer has
    not taken yet)."""
    outq = link.outq
    before = outq.data_in
    link.flush_streams(True)
    if outq.data_in > before:
        st.queued(outq, outq.data_in - before)


def forget_stream(link, st: StreamState) -> None:
    """Close stream ``st`` towards ``link``'s other end (a :class:`router.link.Link` or a
    :class:`router.shell.pair_link.PairLink`; unless the stream or the link is closed
    already) and forget its state."""
    if not link.closed:
        try:
            if link.streams.close(st.sid):
                link.flush_streams()
        except S.LocalStreamError:
            pass
    if link.state.get(st.sid) is st:
        del link.state[st.sid]
