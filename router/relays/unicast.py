"""UM's unicast TCP connections as the router's relays make them (the UIM
listener and its destinations, :mod:`router.relays.uim` and
:mod:`router.relays.uim_targets`; late-join and OTR answers,
:mod:`router.relays.recovery`; responses, :mod:`router.relays.responses`): a
connection from an endpoint's address (:func:`connect_from`), a peer-link
stream opened and accepted by the peer (:func:`open_accepted_stream`), bytes on
a peer-link stream within its credit (:func:`send_on_stream`), a destination
watched until it closes (:func:`watch_until_closed`), a UIM stream cut into
whole LBMC messages up to its first malformed one (:class:`UimFramer`). Sizes
in bytes, times in seconds (trio's clock)."""

from __future__ import annotations

import socket
from collections import Counter

import trio

from lbmr_proto import lbmc, lbmc_stream

from .. import peerlink as P
from ..link import CONNECT_TIMEOUT, Link, StreamState
from ..peerlink import streams as S

__all__ = ["READ_CHUNK", "STALL_TIMEOUT", "connect_from", "send_on_stream", "watch_until_closed", "UimFramer",
           "open_accepted_stream", "StreamNotOpened", "StreamRefused"]

READ_CHUNK = 64 << 10  # bytes per read from a sender's or destination's connection
STALL_TIMEOUT = 5.0  # seconds a destination (or a stream's credit) may take to take what is written to it


class StreamNotOpened(Exception):
    """A stream could not be opened on the link (its stream ids ran out, a target
    that does not encode): nothing was sent. The message is the cause's."""


class StreamRefused(Exception):
    """The peer refused a stream we opened, or did not answer in time; the message
    is the refusal's reason (or "no answer"). The stream is closed."""


async def open_accepted_stream(link: Link, advert_id: int, kind: P.StreamKind, target, *,
                               counters: Counter[str], opened: str, refused: str,
                               accept_timeout: float = CONNECT_TIMEOUT) -> StreamState:
    """Open a ``kind`` stream for ``advert_id`` (0: none) towards ``target`` on ``link``,
    then wait at most ``accept_timeout`` seconds for the peer to accept it: the
    accepted stream. Counted in ``counters``: under ``opened`` once it is opened,
    under ``refused`` when it is refused or not answered (:class:`StreamRefused`, the
    stream closed); :class:`StreamNotOpened` when it cannot be opened."""
    try:
        sid = link.streams.open(advert_id, kind, target)
    except (S.LocalStreamError, P.FrameEncodeError) as e:
        raise StreamNotOpened(str(e)) from e
    st = link.state[sid] = StreamState(sid, kind)
    link.flush_streams()
    counters[opened] += 1
    with trio.move_on_after(accept_timeout):
        await st.accepted.wait()
    if st.refused is not None or not st.accepted.is_set() or st.closed:
        counters[refused] += 1
        link.close_stream(st)
        raise StreamRefused(st.refused or "no answer")
    return st


async def send_on_stream(link: Link, st: StreamState, data: bytes | memoryview, stall_timeout: float) -> bool:
    """``data`` on stream ``st`` within its credit and the link queue's space;
    False if the stream or link closed, or no credit came for ``stall_timeout``
    seconds."""
    pending = memoryview(data)
    while pending:
        if st.closed or link.closed:
            return False
        st.credit = trio.Event()
        try:
            rest = link.streams.send(st.sid, pending, limit=link.outq.data_space())
        except S.LocalStreamError:
            return False
        link.flush_streams()
        if len(rest) == len(pending):
            with trio.move_on_after(stall_timeout) as cs:
                await st.credit.wait()
            if cs.cancelled_caught:
                return False
        pending = rest
    return True


async def watch_until_closed(conn: trio.SocketStream, gone: trio.Event) -> None:
    """Read (and discard) what a destination sends on its connection until it closes
    it: then ``gone``."""
    try:
        while await conn.receive_some(READ_CHUNK):
            pass
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    gone.set()


class UimFramer:
    """:class:`lbmr_proto.lbmc_stream.StreamFramer` for a stream that ends at its first malformed
    message: :meth:`cut` gives the whole messages before it too. ``held``: a copy of the
    incomplete message the framer holds (< 64 KiB)."""

    __slots__ = ("framer", "held")

    def __init__(self) -> None:
        self.framer = lbmc_stream.StreamFramer()
        self.held = b""

    @property
    def buffered(self) -> int:
        return self.framer.buffered

    def cut(self, data: bytes | memoryview) -> tuple[list[lbmc_stream.MessageRun], lbmc.LbmcDecodeError | None]:
        """The runs of whole messages ``data`` completes, and the error of a malformed
        message (None: none; the stream is over after one)."""
        f = self.framer
        start = f.offset  # stream offset of the held message's first byte
        try:
            runs = f.cut(data)
        except lbmc.LbmcDecodeError as e:  # e.offset: where the bad message starts (or its msglen)
            whole = (self.held + bytes(data))[:max(0, e.offset - start)]
            return lbmc_stream.StreamFramer().cut(whole), e
        b = f.buffered
        self.held = b"" if not b else bytes(data[-b:]) if b <= len(data) else self.held + bytes(data)
        return runs, None


async def connect_from(bind_ip: str, addr: tuple[str, int]) -> trio.SocketStream:
    """A TCP connection to ``addr`` from ``bind_ip`` ("0.0.0.0": the system's choice)."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if bind_ip != "0.0.0.0":
            await sock.bind((bind_ip, 0))
        await sock.connect(addr)
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)
