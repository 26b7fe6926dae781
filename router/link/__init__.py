"""One connected peer link on trio (:class:`Link`): the sans-IO connection
(:class:`router.peerlink.PeerConnection`), its stream table and the state of
each relayed stream on either end of the link (:class:`StreamState`, in
:mod:`router.link.stream`), its writer (:class:`router.link.writer.LinkWriter`:
the bounded queue and the writer task) and, on a zero-copy link (plain TCP, not
TLS), its reader (:class:`router.link.reader.LinkReader`: large STREAM_DATA
payloads spliced, never in Python). The names the relays and tests use are all
here.
"""

from __future__ import annotations

import os
import socket

import trio

from .. import peerlink as P
from ..peerlink import streams as S
from .reader import SPLICE_MIN, LinkReader
from .splice import PIPE_POOL, PipePool, splice_supported
from .stream import (
    LINK_INITIAL_BUDGET,
    LINK_WINDOW_BUDGET,
    READ_SIZE,
    SPLICED_ITEMS,
    STREAM_FRAME,
    STREAM_WINDOW,
    STREAM_WINDOW_MAX,
    HeldChunk,
    PipeSeg,
    SplicedBytes,
    StreamState,
    flush_stream,
    forget_stream,
    return_credit,
)
from .writer import MAX_CONTROL_FRAMES, LinkWriter

__all__ = [
    "CONNECT_TIMEOUT", "LINK_INITIAL_BUDGET", "LINK_WINDOW_BUDGET", "MAX_CONTROL_FRAMES",
    "RAW_LIMIT", "READ_SIZE", "SPLICED_ITEMS", "SPLICE_FRAME", "SPLICE_MIN", "STREAM_FRAME", "STREAM_WINDOW",
    "STREAM_WINDOW_MAX", "ZERO_COPY", "HeldChunk", "Link", "PipeSeg", "SplicedBytes", "StreamState",
    "flush_stream", "forget_stream", "return_credit",
]

CONNECT_TIMEOUT = 5.0  # seconds to connect to a real source (far side) or to the peer
RAW_LIMIT = 1 << 20  # bytes of the connection's own answers (keepalive acks, ...) held unsent
# Zero-copy links: frames of up to MAX_PAYLOAD less the stream id (a pipe's worth), or
# LARGE_PAYLOAD less it once the handshake negotiated LARGE_FRAMES (:meth:`Link.negotiated`).
# LBMR_ROUTER_ZERO_COPY=0 in the environment turns zero copy off (bench/router.py
# measures both paths).
SPLICE_FRAME = P.MAX_PAYLOAD - 4
ZERO_COPY = os.environ.get("LBMR_ROUTER_ZERO_COPY", "1") != "0"


class Link:
    """One connected peer link: the connection, its streams, its writer (``tx``) and,
    zero copy, its reader (``rx``; None otherwise). ``peer_name`` is the configured
    peer's name (for logs); ``max_queue`` the writer queue's bound on data bytes."""

    def __init__(self, conn: P.PeerConnection, stream, *, peer_name: str, max_queue: int,
                 zero_copy: bool | None = None, pipes: PipePool | None = None) -> None:
        self.peer_name = peer_name
        self.conn = conn
        self.stream = stream
        self.pipes = PIPE_POOL if pipes is None else pipes
        # zero copy: a descriptor of our own on the link socket (MSG_PEEK, splice, MSG_MORE),
        # for a plain TCP link only
        self._sock: socket.socket | None = None
        want = ZERO_COPY if zero_copy is None else zero_copy
        if (want and splice_supported() and isinstance(stream, trio.SocketStream)
                and stream.socket.family in (socket.AF_INET, socket.AF_INET6)):
            self._sock = socket.socket(fileno=os.dup(stream.socket.fileno()))
            self._sock.setblocking(False)
        self.zero_copy = self._sock is not None
        self.streams = S.StreamTable(conn.role, initial_window=STREAM_WINDOW, max_window=STREAM_WINDOW_MAX,
                                     initial_budget=LINK_INITIAL_BUDGET,
                                     window_budget=LINK_WINDOW_BUDGET,
                                     max_frame=SPLICE_FRAME if self.zero_copy else STREAM_FRAME)
        self.state: dict[int, StreamState] = {}
        self.tx = LinkWriter(conn, stream, self._sock, self.streams, self.state, self.pipes,
                             peer_name=peer_name, max_queue=max_queue)
        self.rx: LinkReader | None = None
        if self._sock is not None:
            self.rx = LinkReader(self._sock, stream, conn, self.streams, self.state, self.pipes,
                                 self.tx)
        self.handshake: trio.CancelScope | None = None  # an incoming link until its handshake completes
        self.up = trio.Event()
        self.nursery: trio.Nursery | None = None  # stream tasks of this link die with it
        self.ru_streams = 0  # LBT-RU streams we opened (near side) ...
        self.ru_streams_far = 0  # ... and the peer opened (far side)

    @property
    def connected(self) -> bool:
        return self.conn.state is P.State.CONNECTED

    @property
    def capabilities(self) -> int:
        """The capabilities both ends set (:class:`router.peerlink.Capability` bits)."""
        return self.conn.capabilities

    @property
    def state_name(self) -> str:
        """The connection's state, as ``/status`` shows it."""
        return self.conn.state.value

    @property
    def closed(self) -> bool:
        """The link is closed: nothing more is written (the writer's flag)."""
        return self.tx.closed

    @closed.setter
    def closed(self, value: bool) -> None:
        self.tx.closed = value

    @property
    def outq(self) -> P.OutQueue:
        """The writer's queue of frames."""
        return self.tx.outq

    @property
    def raw(self) -> bytearray:
        """Bytes the connection produced (handshake, acks), not yet taken by the writer."""
        return self.tx.raw

    @property
    def raw_taken(self) -> trio.Event:
        """Set (and replaced) whenever the writer takes :attr:`raw`."""
        return self.tx.raw_taken

    @property
    def wake_writer(self) -> trio.Event:
        """Set to wake the writer task (replaced by it)."""
        return self.tx.wake

    @property
    def spliced_in(self) -> int:
        """Payload bytes spliced from the link."""
        return 0 if self.rx is None else self.rx.spliced_in

    @property
    def spliced_out(self) -> int:
        """Payload bytes spliced into the link."""
        return self.tx.spliced_out

    @property
    def tx_blocked(self) -> int:
        """Times the zero-copy writer found the socket full in the middle of a frame."""
        return self.tx.tx_blocked

    def negotiated(self, capabilities: int) -> None:
        """The handshake completed with ``capabilities`` (both sides' bits): the stream
        kinds they allow are accepted from now (RESPONSE, ...), and a zero-copy link's
        frames carry up to the connection's payload limit (LARGE_FRAMES: 4 MiB)."""
        self.streams.kinds = frozenset(int(k) for k in P.stream_kinds(capabilities))
        if self.zero_copy:
            self.streams.max_frame = self.conn.max_payload - 4

    # ------------------------------------------------------------- writing

    def put(self, frame: P.Frame, wake: bool = True) -> bool:
        return self.tx.put(frame, wake)

    def flush_streams(self, direct: bool = False) -> None:
        """Queue the stream table's frames for the writer (:meth:`LinkWriter.flush_streams`)."""
        self.tx.flush_streams(direct)

    def send_now(self) -> None:
        """Write what is queued, as far as the socket takes it at once (zero-copy links; the
        writer task otherwise). Never waits, never raises."""
        self.tx.send_now()

    def push_raw(self, data: bytes) -> None:
        self.tx.push_raw(data)

    async def finish(self, scope: trio.CancelScope) -> None:
        """End the link: let the writer flush the connection's last bytes, then cancel."""
        await self.tx.finish()
        scope.cancel()

    async def writer(self) -> None:
        """The writer task."""
        await self.tx.run()

    # ------------------------------------------------------------- reading

    async def receive(self) -> tuple[list, bool]:
        """Read from the link: the connection's frames and events for what arrived, and
        True when the peer closed the connection. On a zero-copy link the payloads of large
        STREAM_DATA frames are spliced to their streams before this returns."""
        if self.rx is None:
            data = await self.stream.receive_some(READ_SIZE)
            return self.conn.receive_data(data, trio.current_time()), not data
        return await self.rx.receive()

    def forward(self, st: StreamState) -> bool:
        """Pass on the spliced bytes at the head of ``st.incoming`` (zero-copy links;
        :meth:`LinkReader.forward`): True when the head is no longer a pipe segment."""
        return self.rx.forward(st)

    def pipe_out(self, st: StreamState, seg: PipeSeg, k: int) -> None:
        """``k`` bytes of the head segment ``seg`` went to the stream's socket
        (:meth:`StreamState.pipe_out`)."""
        st.pipe_out(self.pipes, seg, k)

    # ------------------------------------------------------------- streams

    def close_stream(self, st: StreamState) -> None:
        """Close stream ``st`` towards the peer (unless it is closed already), forget it
        and give back its pipes."""
        forget_stream(self, st)
        st.release_pipes(self.pipes)

    def release_stream(self, st: StreamState) -> None:
        """A stream is over: give back its pipes (closed if they still hold bytes)."""
        st.release_pipes(self.pipes)

    def down(self) -> None:
        """The link has ended: close every stream's state and socket, release every pipe."""
        self.tx.close()
        for st in self.state.values():
            st.closed = True
            st.accepted.set()  # nobody waits for an answer that cannot come
            st.wake()
            st.rx_splicing = False
            st.release_pipes(self.pipes)
            if st.sock is not None and st.owns_sock and hasattr(st.sock, "close"):
                st.sock.close()
        if self._sock is not None:
            self._sock.close()
