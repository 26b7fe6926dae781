"""The data side of a pair of endpoints of one router, in memory: no socket,
no encoding, no copy.

The control of an endpoint pair is joined inside the core
(:class:`router.core.router_core.RouterCore`). What remains between the two
sides is the relayed sessions, as between two routers: a proxy in one
endpoint (its :class:`router.relays.endpoint_relay.Relay`) opens a stream to the other
endpoint's relay, which takes the session from its origin (the proxy
receiver) and hands it over. The streams keep the peer-link stream protocol
(:class:`router.peerlink.streams.StreamTable`: stream ids, accept and
refuse, per-stream credit, close), so both relays run unchanged and every
bound of a link holds: a :class:`PairLink` is one side, with its own stream
table and writer queue (:class:`router.peerlink.OutQueue`, bounded like a
peer link's). What one side's table and relay queue (frames as objects; the
data they carry by reference) the other side takes from that queue
(:meth:`PairLink.receive`): one task per side, in its link task
(:class:`router.shell.link_task.LinkTask`). Datagrams go straight to their
streams, as on a peer link's fast path. Nothing here is zero copy in the
splice sense, and nothing needs to be: bytes are never copied between the
sides.

A pair lives as long as its router. Its queue overflowing with control
frames (250,000: the streams' own frames, which the other side takes at
every turn of the scheduler) ends it, both sides, as it would end a peer
link; it is logged, and the pair's sessions are relayed no more.
"""

from __future__ import annotations

import logging

import trio

from .. import peerlink as P
from ..link import (
    LINK_INITIAL_BUDGET,
    LINK_WINDOW_BUDGET,
    MAX_CONTROL_FRAMES,
    STREAM_FRAME,
    STREAM_WINDOW,
    STREAM_WINDOW_MAX,
    StreamState,
    forget_stream,
)
from ..link.splice import PIPE_POOL
from ..peerlink import streams as S

__all__ = ["PairLink", "pair_links"]

log = logging.getLogger("lbmr-router")

TAKE_BYTES = 1 << 20  # data bytes the other side takes from the queue at a time


class PairLink:
    """One side of an endpoint pair (``role``: "initiator" or "acceptor", the
    parity of the stream ids it opens); the other side is :attr:`other`
    (:func:`pair_links` makes both). ``max_queue``: the writer queue's bound
    on data bytes (the pair's ``<peer>`` settings' ``max-queue``). The
    attributes the relays use are those of :class:`router.link.Link`."""

    zero_copy = False  # (the relays' splice paths are for sockets)
    connected = True
    capabilities = P.DEFAULT_CAPABILITIES | P.Capability.RECOVERY  # both sides are this router
    state_name = P.State.CONNECTED.value

    def __init__(self, peer_name: str, role: str, max_queue: int) -> None:
        self.peer_name = peer_name
        self.streams = S.StreamTable(role, initial_window=STREAM_WINDOW, max_window=STREAM_WINDOW_MAX,
                                     initial_budget=LINK_INITIAL_BUDGET, window_budget=LINK_WINDOW_BUDGET,
                                     max_frame=STREAM_FRAME, kinds=P.stream_kinds(self.capabilities))
        self.outq = P.OutQueue(max_control=MAX_CONTROL_FRAMES, max_data_bytes=max_queue)
        self.state: dict[int, StreamState] = {}
        self.pipes = PIPE_POOL  # (the relays count their streams there)
        self.nursery: trio.Nursery | None = None  # stream tasks of this side
        self.closed = False
        self.other: PairLink | None = None
        self.queued = trio.Event()  # set when this side queued frames for the other
        self.ru_streams = 0  # LBT-RU streams we opened (near side) ...
        self.ru_streams_far = 0  # ... and the other side opened (far side)
        self.frames_sent = 0
        self.datagrams_sent = 0

    @property
    def ended(self) -> bool:
        """Either side is closed: the pair relays no more."""
        return self.closed or self.other is None or self.other.closed

    # -------------------------------------------------------------- sending

    def put(self, frame: P.Frame) -> bool:
        """Queue ``frame`` for the other side: False if a data frame did not fit."""
        try:
            ok = self.outq.put(frame)
        except P.OutQueueOverflow as e:
            log.error("endpoint pair %s: %s; the pair relays no more sessions", self.peer_name, e)
            self.closed = True
            ok = False
        self.queued.set()
        return ok

    def flush_streams(self, direct: bool = False) -> None:
        """Queue the stream table's frames for the other side (``direct``: as for
        a peer link; the other side takes them at its next turn)."""
        for f in self.streams.frames_to_send():
            self.put(f)

    def close_stream(self, st: StreamState) -> None:
        """Close stream ``st`` towards the other side (unless closed already) and forget it."""
        forget_stream(self, st)

    # ------------------------------------------------------------ receiving

    async def receive(self) -> list:
        """The other side's next frames (waits for some): stream frames for the
        link task to hand to the stream table; DATAGRAM batches go to their
        streams here. Their queue's space is freed: its writers may go on."""
        other = self.other
        while not other.outq:
            if self.ended:
                return []
            other.queued = trio.Event()
            await other.queued.wait()
        frames = other.outq.pop_batch(TAKE_BYTES)
        for st in other.state.values():
            st.credit.set()  # queue space freed: writers may retry
        out = []
        woken: set[StreamState] = set()
        for f in frames:
            other.frames_sent += 1
            if type(f) is S.DatagramBatch:
                other.datagrams_sent += len(f.datagrams)
                self._datagrams(f, woken)
            else:
                out.append(f)
        for st in woken:
            st.incoming_ready.set()
        return out

    def _datagrams(self, f: S.DatagramBatch, woken: set[StreamState]) -> None:
        st = self.state.get(f.stream_id)
        for d in f.datagrams:
            if self.streams.receive_datagram(f.stream_id, len(d)) is not None and st is not None:
                st.incoming.append(d)
                woken.add(st)

    def down(self) -> None:
        """The pair has ended (or the router stops): close every stream's state
        and socket; the other side's task wakes to end too."""
        self.closed = True
        self.queued.set()
        self.outq.take_all()
        for st in self.state.values():
            st.closed = True
            st.accepted.set()
            st.wake()
            if st.sock is not None and st.owns_sock and hasattr(st.sock, "close"):
                st.sock.close()

    def status(self) -> dict:
        return {"name": self.peer_name, "state": "closed" if self.closed else self.state_name,
                "peer": self.other.peer_name if self.other else None, "rtt_last": None,
                "queued_frames": len(self.outq), "dropped_datagrams": self.outq.dropped_datagrams,
                "frames_sent": self.frames_sent, "datagrams_sent": self.datagrams_sent}


def pair_links(name_a: str, name_b: str, max_queue_a: int, max_queue_b: int) -> tuple[PairLink, PairLink]:
    """Both sides of an endpoint pair, joined (``name_a``: the side named in
    the logs of the first; the first opens odd stream ids)."""
    a = PairLink(name_a, "initiator", max_queue_a)
    b = PairLink(name_b, "acceptor", max_queue_b)
    a.other, b.other = b, a
    return a, b
