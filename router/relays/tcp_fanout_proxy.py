"""The near side of one TCP fan-out proxy (:mod:`router.relays.tcp_fanout`): its
receivers (:class:`Receiver`), its link stream and session (:class:`Proxy`), and
the zero-copy path to a lone receiver.

While a proxy has one receiver, the link's reader splices the frames of whole
messages without extension headers (STREAM_DATA flagged FLAG_WHOLE_MESSAGES: the
far router's message path passed them, this one has nothing to rewrite; each
begins and ends at a message boundary) straight into that receiver's socket. What
is spliced waits in the stream's bytes in order with the bytes framed for the
queues (:data:`router.link.SPLICED_ITEMS`) and goes to its receiver once what was
queued for it before has gone (``StreamState.sink_idle``), to the receiver it was
spliced for (:attr:`Proxy.spliced`), which changes only once none of it is left.
The methods here change the proxy's state and return what the relay counts;
they never wait. Sizes in bytes, times in seconds (trio's clock).
"""

from __future__ import annotations

import math
import os

import trio

from .. import peerlink as P
from ..core.fanout import SessionFanout, SinkQueue
from ..link import SPLICED_ITEMS, Link, PipeSeg, SplicedBytes, StreamState, return_credit

__all__ = ["Proxy", "Receiver"]

_WHOLE_MESSAGES = int(P.Capability.WHOLE_MESSAGES)  # (a plain int: ``int & IntFlag`` goes through enum)


class Receiver:
    """One receiver connection of a proxy: its socket (``conn``, ``fd``), queue and
    writer's state."""

    __slots__ = ("conn", "fd", "queue", "peer", "blocked", "broken", "wake", "proxy", "scope")

    def __init__(self, conn: trio.SocketStream, queue: SinkQueue, peer: str, proxy: Proxy) -> None:
        self.conn, self.queue, self.peer, self.proxy = conn, queue, peer, proxy
        self.fd = conn.socket.fileno()  # written only while the receiver is in its proxy's table
        self.blocked = False  # its socket was full: the writer waits for it
        self.broken = False  # writing failed: it went away
        self.wake = trio.Event()
        self.scope: trio.CancelScope | None = None  # its tasks' (cancelled: it is disconnected)


class Proxy:
    """The near side of one proxy: the link stream (if open), the receivers and
    the nursery of its tasks (its request listeners' too)."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.core: SessionFanout | None = None
        self.link: Link | None = None
        self.st: StreamState | None = None
        self.receivers: dict[int, Receiver] = {}
        # the receiver what the stream holds spliced is for (its socket is the stream's ``sock``)
        self.spliced: Receiver | None = None
        self._counted = 0  # bytes passed on spliced (pipes and copies), counted
        self._seen = 0  # ... seen (its receiver's progress, whoever passed them on)
        self._copied = 0  # bytes of spliced frames written from memory (their frame took the copy path)
        self.spliced_wait = math.inf  # since when what is spliced holds back receivers that joined after

    def stream_opened(self, core: SessionFanout, link: Link, st: StreamState) -> None:
        """The proxy's link stream ``st`` opened on ``link`` for the session ``core``."""
        self.core, self.link, self.st = core, link, st
        st.whole_only = True  # (spliced to a lone receiver: splice_check)

    def stream_ended(self, st: StreamState) -> None:
        """The link stream ``st`` ended (the proxy may open another)."""
        if self.st is st:
            self.st = self.link = self.core = self.spliced = None
            self._counted = self._seen = self._copied = 0
            self.spliced_wait = math.inf

    def held_back(self) -> int:
        """Bytes of the stream held and not yet framed (a new receiver joins at the
        next message after them; what is spliced for another is not the session's)."""
        return sum(len(d) for d in self.st.incoming if type(d) not in SPLICED_ITEMS)

    # ------------------------------------------------ the lone receiver, zero copy

    def splice_check(self) -> None:
        """Let the link's reader splice whole-message frames into the lone receiver's
        socket, or stop it (another receiver came, or it left); ``sink_idle``: its
        queue is empty, so spliced bytes may go at once."""
        st = self.st
        if st is None:
            return
        link, receivers = self.link, self.receivers
        old = self.spliced
        if old is not None and (old.broken or len(receivers) != 1) and not st.rx_splicing \
                and not any(type(d) in SPLICED_ITEMS for d in st.incoming):
            self.spliced = st.sock = None  # (its receiver went or is not alone; nothing left for it)
        ok = False
        if len(receivers) == 1 and link.zero_copy and link.capabilities & _WHOLE_MESSAGES:
            rx = next(iter(receivers.values()))
            if self.spliced is None and not rx.broken and not st.rx_splicing:
                self.spliced, st.sock, st.owns_sock, st.sink_broken = rx, rx.conn, False, False
                self._counted = self._seen = st.spliced_out + self._copied
            ok = self.spliced is rx and not rx.broken
        st.splice_whole = ok
        rx = self.spliced
        st.sink_idle = rx is not None and not rx.broken and not rx.queue.held

    def holds_spliced(self, rx: Receiver) -> bool:
        """Whether bytes spliced for ``rx`` are at the head of the stream."""
        st = self.st
        return self.spliced is rx and st is not None and bool(st.incoming) and type(st.incoming[0]) in SPLICED_ITEMS

    def spliced_stalled(self, rx: Receiver, now: float, timeout: float) -> bool:
        """``rx`` holds spliced bytes and took none of them for ``timeout``."""
        return self.holds_spliced(rx) and now - rx.queue.last_progress >= timeout

    def forward(self) -> tuple[bool, int]:
        """The spliced bytes at the head of the stream into the socket of the receiver
        they are for, once its queue is empty, as far as the socket takes them now
        (their credit goes back); thrown away if it is gone. (True when none is left
        at the head, bytes thrown away.)"""
        st, rx = self.st, self.spliced
        inc = st.incoming
        if not inc or type(inc[0]) not in SPLICED_ITEMS:
            return True, 0
        if rx is None or rx.broken or st.sink_broken:
            return True, self.drop_spliced()
        if rx.queue.held:
            st.sink_idle = False
            return False, 0  # (what was queued for it goes first, then this)
        link = self.link
        done = True
        while inc and type(inc[0]) in SPLICED_ITEMS:
            if type(inc[0]) is PipeSeg:
                if not link.forward(st):
                    done = False
                    break
                continue
            data = inc[0]  # (SplicedBytes: its frame took the copy path)
            try:
                k = os.write(rx.fd, data)
            except (BlockingIOError, InterruptedError):
                done = False
                break
            except OSError:
                st.sink_broken = True
                break
            self._copied += k
            return_credit(link, st, k)
            if k < len(data):
                inc[0] = SplicedBytes(data[k:])
                done = False
                break
            inc.popleft()
        if st.sink_broken:  # it went away
            rx.broken = True
            rx.wake.set()
            return True, self.drop_spliced()
        out = st.spliced_out + self._copied
        if out != self._seen:  # it took bytes (here, or from the link's reader)
            self._seen = out
            rx.queue.last_progress = trio.current_time()
        if done:
            self.spliced_wait = math.inf  # (nobody waits behind them any more)
        elif not rx.blocked:
            rx.blocked = True  # its writer task goes on once its socket is writable
            rx.wake.set()
        return done, 0

    def spliced_held(self, now: float, lag_timeout: float) -> bool:
        """Spliced bytes at the head wait for their receiver. True when receivers that
        joined after waited behind them for ``lag_timeout`` (a receiver that keeps up
        takes what was spliced for it, at most the stream's window, in milliseconds):
        the receiver is cut off (marked broken: its spliced bytes cannot be cut at a
        message boundary); the caller throws them away (:meth:`drop_spliced`) and the
        others go on."""
        if len(self.receivers) < 2:
            self.spliced_wait = math.inf
        elif self.spliced_wait == math.inf:
            self.spliced_wait = now
        elif now >= self.spliced_wait + lag_timeout:
            self.spliced_wait = math.inf
            rx = self.spliced
            if rx is not None:
                rx.broken = True
                rx.wake.set()
            self.st.incoming_ready.set()
            return True
        return False

    def drop_spliced(self) -> int:
        """Throw away what the stream holds spliced (its receiver is gone) and return
        its credit: the bytes; once the reader finished its last spliced frame the
        stream is spliced to nobody (:meth:`splice_check`)."""
        st, link = self.st, self.link
        dropped = st.drop_spliced(link.pipes)
        if dropped:
            return_credit(link, st, dropped)
        st.splice_whole = st.sink_idle = False
        if not st.rx_splicing:
            st.sink_broken = False
            st.sock = self.spliced = None
        self._seen = st.spliced_out + self._copied
        return dropped

    def spliced_count(self) -> int:
        """Bytes passed on spliced since the last call (for the counters)."""
        st = self.st
        if st is None:
            return 0
        out = st.spliced_out + self._copied
        n = out - self._counted
        self._counted = out
        return max(0, n)
