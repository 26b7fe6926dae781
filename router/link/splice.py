"""Zero-copy data path of the relay: pipes for ``os.splice`` and the calls
that move bytes between sockets and pipes without a copy into Python.

A relayed TCP stream over a plain TCP peer link moves its bytes like this
(:mod:`router.link.reader`, :mod:`router.link.writer`,
:mod:`router.link.stream` and :mod:`router.relays.tcp_streams` use the pieces here):

* sending (a source's or receiver's socket -> peer link): the stream's pump
  splices up to the stream's credit (and the writer queue's space) from its
  socket into a pipe and queues a :class:`router.peerlink.streams.HeldData`
  frame holding that pipe; the link's writer writes the STREAM_DATA header
  (12 + 4 bytes, from Python) and splices the pipe into the link socket;
* receiving (peer link -> socket): the link's reader peeks at the next frame
  header; a large STREAM_DATA frame's payload is spliced from the link socket
  into the stream's pipe (the header alone goes through the sans-IO
  connection and stream table, with the same checks and credit), and the
  stream's pump splices the pipe into its socket.

Pipes are bounded: one :class:`PipePool` per process hands out at most
``limit`` pipes (two descriptors each, ``capacity`` bytes each); when none is
free the bytes take the copy path, which is always correct. A pipe given back
is kept for reuse if it is empty (up to ``idle`` of them, within ``limit``, and only
while some stream runs: the last stream to end closes them), else closed. Every pipe
descriptor is read from the :class:`Pipe` at the moment of each call and set
to -1 when closed, so a stale task can never splice into a recycled
descriptor (trio runs the tasks of a router in one thread).
"""

from __future__ import annotations

import errno
import fcntl
import os
import resource

__all__ = ["SPLICE_FLAGS", "Pipe", "PipePool", "PIPE_POOL", "splice", "splice_supported"]

SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)
PIPE_CAPACITY = 1 << 20  # bytes asked per pipe (Linux default pipe-max-size)
# Empty pipes kept open for reuse (within the pool's limit: kept pipes count against it):
# a relayed stream takes a pipe per frame of up to a megabyte, and making and closing one
# costs 5 system calls (F_SETPIPE_SZ allocates its ring), a tenth of the routers' system
# time at a gigabyte per second. An empty pipe holds no data pages, only its ring and two
# descriptors.
POOL_IDLE = 8


def splice_supported() -> bool:
    return hasattr(os, "splice")


def splice(src: int, dst: int, nbytes: int) -> int:
    """One non-blocking ``os.splice`` of at most ``nbytes`` (one side must be a pipe):
    the bytes moved (0: end of file), :class:`BlockingIOError` when nothing can move now."""
    return os.splice(src, dst, nbytes, flags=SPLICE_FLAGS)


class Pipe:
    """A non-blocking pipe (``r``, ``w`` descriptors, -1 once closed); ``held``: bytes
    in it, kept by the callers that splice in and out; ``capacity``: its size in bytes
    (the bytes it holds may be fewer: a pipe slot holds at most a page)."""

    __slots__ = ("r", "w", "held", "capacity", "lent")

    def __init__(self, capacity: int = PIPE_CAPACITY) -> None:
        self.r, self.w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.held = 0
        self.lent = False  # acquired from a pool and not yet released
        try:
            fcntl.fcntl(self.w, F_SETPIPE_SZ, capacity)
        except OSError:  # above pipe-max-size, or the user's pipe pages are used up
            pass
        self.capacity = fcntl.fcntl(self.w, F_GETPIPE_SZ)

    @property
    def closed(self) -> bool:
        return self.r < 0

    def close(self) -> None:
        for fd in (self.r, self.w):
            if fd >= 0:
                os.close(fd)
        self.r = self.w = -1
        self.held = 0


def _default_limit() -> int:
    """Pipes per process: 1/16 of the descriptor limit (64 at 1024), at most 256."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        soft = 1024
    if soft == resource.RLIM_INFINITY:
        soft = 65536
    return max(2, min(256, soft // 16))


class PipePool:
    """At most ``limit`` pipes open at once, in use or kept empty for reuse (two
    descriptors each; at most ``idle`` kept); :meth:`acquire` gives None beyond that
    (the caller copies instead). Counters: ``created``,
    ``exhausted`` (acquires refused), ``closed_full`` (pipes closed with bytes in them)."""

    def __init__(self, limit: int | None = None, capacity: int = PIPE_CAPACITY,
                 idle: int = POOL_IDLE) -> None:
        self.limit = _default_limit() if limit is None else limit
        self.capacity = capacity
        self.idle_max = idle
        self._idle: list[Pipe] = []
        self.in_use = 0
        self.streams = 0  # streams running (stream_started, not yet ended)
        self.created = 0
        self.exhausted = 0
        self.closed_full = 0
        self.broken = False  # pipes cannot be made here (no splice, EMFILE): copy path only

    def acquire(self) -> Pipe | None:
        if self._idle:
            self.in_use += 1
            p = self._idle.pop()
            p.lent = True
            return p
        if self.broken or self.in_use >= self.limit:
            self.exhausted += 1
            return None
        try:
            p = Pipe(self.capacity)
        except OSError as e:
            if e.errno not in (errno.EMFILE, errno.ENFILE):
                self.broken = True
            self.exhausted += 1
            return None
        self.created += 1
        self.in_use += 1
        p.lent = True
        return p

    def release(self, pipe: Pipe | None) -> None:
        """Give a pipe back: an empty one is kept for reuse (up to ``idle``), any other closed."""
        if pipe is None or not pipe.lent:
            return  # released already
        pipe.lent = False
        self.in_use -= 1
        if pipe.closed:
            return
        if (pipe.held == 0 and self.streams and len(self._idle) < self.idle_max
                and self.in_use + len(self._idle) < self.limit):
            self._idle.append(pipe)
            return
        if pipe.held:
            self.closed_full += 1
        pipe.close()

    def stream_started(self) -> None:
        """A stream that may use pipes began (empty pipes are kept for reuse only while
        some stream runs)."""
        self.streams += 1

    def stream_ended(self) -> None:
        """A stream of :meth:`stream_started` ended; with the last one the kept pipes close."""
        self.streams = max(0, self.streams - 1)
        if not self.streams:
            self.close_idle()

    @property
    def idle(self) -> int:
        return len(self._idle)

    def close_idle(self) -> None:
        """Close the pipes kept for reuse (tests counting descriptors, shutdown)."""
        while self._idle:
            self._idle.pop().close()

    def stats(self) -> dict[str, int]:
        return {"pipes_in_use": self.in_use, "pipes_idle": self.idle, "pipes_limit": self.limit,
                "pipes_created": self.created, "pipes_exhausted": self.exhausted,
                "pipes_closed_full": self.closed_full}


PIPE_POOL = PipePool()  # the process's pipes, shared by every link of every router in it
