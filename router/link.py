"""The I/O side of one connected peer link on trio: the sans-IO connection
(:class:`router.peerlink.PeerConnection`), its stream table, its bounded
writer queue and the writer task. The state of each relayed stream on either
end of the link is a :class:`StreamState`.
"""

from __future__ import annotations

import logging
from collections import deque

import trio

from . import peerlink as P
from .peerlink import streams as S

log = logging.getLogger("lbmr-router")

CONNECT_TIMEOUT = 5.0  # seconds to connect to a real source (far side) or to the peer
READ_SIZE = 256 << 10  # bytes per read from the link and from relayed TCP streams
RAW_LIMIT = 1 << 20  # bytes of the connection's own answers (keepalive acks, ...) held unsent
FLUSH_TIMEOUT = 1.0  # seconds to write a link's last frames (e.g. DISCONNECT_OK) before closing
# Per-stream flow control: how many bytes a peer may send on one stream before
# credit comes back (also the most a stream buffers here), and the largest
# STREAM_DATA frame. bench/router.py: 256 KiB/64 KiB gave ~350 MB/s through two
# routers on loopback, 4 MiB/256 KiB ~760 MB/s.
STREAM_WINDOW = 4 << 20
STREAM_FRAME = 256 << 10


class StreamState:
    """The I/O side of one relayed stream (either end of the link)."""

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

    def wake(self) -> None:
        self.incoming_ready.set()
        self.credit.set()


class Link:
    """One connected peer link: the connection, its streams and its writer.
    ``peer_name`` is the configured peer's name (for logs); ``max_queue`` the
    writer queue's bound on data bytes."""

    def __init__(self, conn: P.PeerConnection, stream, *, peer_name: str, max_queue: int) -> None:
        self.peer_name = peer_name
        self.conn = conn
        self.stream = stream
        self.streams = S.StreamTable(conn.role, initial_window=STREAM_WINDOW, max_frame=STREAM_FRAME)
        self.outq = P.OutQueue(max_data_bytes=max_queue)
        self.raw = bytearray()  # bytes the connection produced (handshake, acks)
        self.raw_taken = trio.Event()  # set (and replaced) whenever the writer takes ``raw``
        self.handshake: trio.CancelScope | None = None  # an incoming link until its handshake completes
        self.wake_writer = trio.Event()
        self.state: dict[int, StreamState] = {}
        self.up = trio.Event()
        self.closed = False
        self.closing = False  # finished: the writer flushes what the connection produced, then stops
        self.writer_done = trio.Event()
        self.nursery: trio.Nursery | None = None  # stream tasks of this link die with it
        self.ru_streams = 0  # LBT-RU streams we opened (near side) ...
        self.ru_streams_far = 0  # ... and the peer opened (far side)

    @property
    def connected(self) -> bool:
        return self.conn.state is P.State.CONNECTED

    def put(self, frame: P.Frame) -> bool:
        try:
            ok = self.outq.put(frame)
        except P.OutQueueOverflow as e:
            log.error("peer %s: %s; closing the link", self.peer_name, e)
            self.closed = True
            ok = False
        self.wake_writer.set()
        return ok

    def flush_streams(self) -> None:
        for f in self.streams.frames_to_send():
            self.put(f)

    def push_raw(self, data: bytes) -> None:
        if data:
            self.raw += data
            self.wake_writer.set()

    async def finish(self, scope: trio.CancelScope) -> None:
        """End the link: let the writer flush the connection's last bytes, then cancel."""
        self.closing = True
        self.wake_writer.set()
        with trio.move_on_after(FLUSH_TIMEOUT):
            await self.writer_done.wait()
        scope.cancel()

    async def writer(self) -> None:
        while not self.closed:
            if self.closing and not self.raw:
                self.writer_done.set()
                return
            await self.wake_writer.wait()
            self.wake_writer = trio.Event()
            now = trio.current_time()
            out = bytes(self.raw)
            self.raw.clear()
            self.raw_taken.set()
            self.raw_taken = trio.Event()
            if self.conn.state is P.State.CONNECTED or self.conn.state is P.State.DISCONNECTING:
                parts = [out]
                for f in self.outq.pop_batch(1 << 20):
                    if self.conn.can_send(f):
                        parts.append(self.conn.send(f, now))
                out = b"".join(parts)
                if self.outq:
                    self.wake_writer.set()
            if out:
                await self.stream.send_all(out)
                for st in self.state.values():
                    st.credit.set()  # queue space freed: writers may retry

    def down(self) -> None:
        """The link has ended: close every stream's state and socket."""
        self.closed = True
        for st in self.state.values():
            st.closed = True
            st.accepted.set()  # nobody waits for an answer that cannot come
            st.wake()
            if st.sock is not None and st.owns_sock and hasattr(st.sock, "close"):
                st.sock.close()
