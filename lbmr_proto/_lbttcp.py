"""LBT-TCP for the transport-session decoder: the TCP connections of known
sessions (from TIRs) and new connections whose first bytes are LBMC messages
with a TCP_SID header, each direction followed (at most ``max_flows``; the
oldest dropped beyond), reassembled (:mod:`lbmr_proto.tcpstream`) and cut
into LBMC messages by a :class:`TcpFlow`, which resynchronises on the next
message boundary after a hole or a mid-stream start. Private to lbmr_proto;
the public face is :mod:`lbmr_proto.transport_sessions`."""

from __future__ import annotations

import struct

from . import lbmc as C
from ._ippackets import TcpSegment
from ._sessionlbmc import message_record
from ._sessionrecords import LBTTCP, MAX_TCP_FLOWS, session_key, transport_record
from ._sessionstate import SessionsState
from .tcpstream import TcpStreams

#: bytes of an LBT-TCP stream held while hunting for a message boundary (a hole, a mid-stream start)
RESYNC_WINDOW = 65536
_TCP_SYN, _TCP_FIN, _TCP_RST = 0x02, 0x01, 0x04

# header size by the first byte of a message (0: not a version-0 message of a known kind)
_START_HLEN = bytes(0 if vt >> 4 else C.DATA_HEADER.size if vt in C.DATA_KINDS else C.CONTROL_HEADER.size
                    if vt in C.KIND_NAMES else 0 for vt in range(256))
_U16 = struct.Struct("!H").unpack_from


def _starts(data, off: int, n: int) -> int:
    """The msglen of a plausible message start at ``off`` (0: none there)."""
    hl = _START_HLEN[data[off]]
    if not hl or off + 4 > n:
        return 0
    ml = _U16(data, off + 2)[0]
    return ml if ml >= hl else 0


class TcpFlow:
    """One direction of an LBT-TCP connection cut into LBMC messages. Holds at
    most one incomplete message (< 64 KiB) or, while hunting for a message
    boundary (a mid-stream start, a hole, bytes that are not LBMC), at most
    ``RESYNC_WINDOW`` + 4 bytes.

    Hunting: every offset of the held bytes is looked at once; a plausible
    message start (version 0, a known kind, ``msglen`` at least its header)
    is a candidate until the bytes at its end arrive. The first candidate
    followed by another plausible start, or whose message ends exactly where
    the bytes received end, is the boundary; a candidate followed by anything
    else is dropped. If the window fills without a boundary, its bytes are
    dropped (counted) and the hunt starts over."""

    __slots__ = ("session", "from_source", "receiver", "hunting", "buf", "_scanned", "_cands")

    def __init__(self, session: str, from_source: bool, receiver: str, hunting: bool) -> None:
        self.session = session
        self.from_source = from_source
        self.receiver = receiver
        self.hunting = hunting
        self.buf = b""
        self._scanned = 0  # hunting: offsets of buf below this were looked at
        self._cands: list[tuple[int, int]] = []  # hunting: (offset, end of its message), undecided

    def resync(self) -> None:
        """The next bytes do not continue the stream (a hole): drop what is held, hunt."""
        self.buf, self.hunting, self._scanned, self._cands = b"", True, 0, []

    def _hunt(self, buf) -> int:
        """The boundary's offset in ``buf`` (hunting ends), or -1 (keep hunting)."""
        n = len(buf)
        for off in range(self._scanned, max(n - 3, self._scanned)):
            ml = _starts(buf, off, n)
            if ml:
                self._cands.append((off, off + ml))
        self._scanned = max(n - 3, self._scanned)
        keep = []
        for off, end in self._cands:
            if end == n or (end + 4 <= n and _starts(buf, end, n)):
                self.hunting, self._scanned, self._cands = False, 0, []
                return off
            if end + 4 > n:
                keep.append((off, end))
        self._cands = keep
        return -1

    def feed(self, data: bytes) -> tuple[list[bytes], int, int]:
        """(whole messages, bad message starts met, times bytes were dropped hunting for a boundary)."""
        buf = self.buf + data if self.buf else data
        msgs: list[bytes] = []
        bad = lost = 0
        pos = 0
        while True:
            if self.hunting:
                off = self._hunt(buf)
                if off < 0:
                    full = len(buf) > RESYNC_WINDOW + 4
                    if full or not self._cands:
                        keep = max(len(buf) - 3, 0)  # (a start may straddle into the next bytes)
                        lost += keep > 0
                        self.buf, self._scanned, self._cands = bytes(buf[keep:]), 0, []
                    else:
                        self.buf = bytes(buf)
                    return msgs, bad, lost
                pos = off
            n = len(buf)
            while n - pos >= 4:
                ml = _starts(buf, pos, n)
                if not ml or pos + ml > n:
                    break
                msgs.append(bytes(buf[pos:pos + ml]))
                pos += ml
            if n - pos < 4 or _starts(buf, pos, n):
                self.buf = bytes(buf[pos:])
                return msgs, bad, lost
            bad += 1  # not a message start: hunt in what follows
            buf = buf[pos + 1:]
            pos = 0
            self.hunting, self._scanned, self._cands = True, 0, []


class LbtTcpDecoder:
    """TCP segments in, LBT-TCP records out, counted in ``state``.
    ``sources``: (source ip, port) -> session ids of the known LBT-TCP
    sessions (from TIRs, or learned from a TCP_SID header); ``flows``: the
    directions followed, oldest first."""

    def __init__(self, state: SessionsState, *, max_flows: int = MAX_TCP_FLOWS) -> None:
        self.state = state
        self.max_flows = max_flows
        self.sources: dict[tuple[str, int], set[int]] = {}
        self.flows: dict[tuple, TcpFlow] = {}
        self._streams = TcpStreams()

    def _session(self, seg: TcpSegment) -> tuple[str, int, int, bool] | None:
        """(source ip, port, session id, segment from the source) of a segment of a known TCP session."""
        for ip, port, from_source in ((seg.src, seg.sport, True), (seg.dst, seg.dport, False)):
            sids = self.sources.get((ip, port))
            if sids:
                return ip, port, next(iter(sids)) if len(sids) == 1 else 0, from_source
        return None

    def segment(self, seg: TcpSegment) -> list:
        """The records of one TCP segment (none for a connection that is not LBT-TCP)."""
        known = self._session(seg)
        direction = (seg.src, seg.sport, seg.dst, seg.dport)
        if known is None and seg.flags & _TCP_SYN and not seg.flags & 0x10:
            # a connection opening: follow it until its first bytes say whether it is LBT-TCP
            self._add_flow(direction, TcpFlow("", False, f"{seg.src}:{seg.sport}", False))
            self._add_flow((seg.dst, seg.dport, seg.src, seg.sport),
                           TcpFlow("", True, f"{seg.src}:{seg.sport}", False))
        if known is None and direction not in self.flows:
            return []
        out: list = []
        if known is not None:
            ip, port, sid, from_source = known
            key = session_key(LBTTCP, ip, port, sid)
            s = self.state.session(LBTTCP, ip, port, sid)
            rcv = f"{seg.dst}:{seg.dport}" if from_source else f"{seg.src}:{seg.sport}"
            flags = seg.flags
            kind = ("RST" if flags & _TCP_RST else "SYN" if flags & _TCP_SYN else "FIN" if flags & _TCP_FIN
                    else "SEGMENT")
            if s is not None:
                s.first_ts = min(s.first_ts, seg.ts)
                s.last_ts = max(s.last_ts, seg.ts)
                r = s.receiver(rcv, "tcp", self.state.overflow)
                if r is not None:
                    r.seen(seg.ts)
                    if not from_source and seg.window == 0 and not flags & (_TCP_RST | _TCP_SYN | _TCP_FIN):
                        r.zero_windows += 1
                    if flags & _TCP_RST:
                        r.resets += 1
                if kind != "SEGMENT" and not (kind == "SYN" and flags & 0x10):
                    s.control[kind] += 1
                if from_source and seg.payload:
                    s.originals += 1
                    s.original_bytes += len(seg.payload)
                    s.last_original_ts = max(s.last_original_ts, seg.ts)
            if kind != "SEGMENT" or seg.payload:
                out.append(transport_record(seg.ts, seg.frame, LBTTCP, key, kind, seg.src, seg.sport, seg.dst,
                                        seg.dport, len(seg.payload), sid=sid, sqn=seg.seq, flags=flags))
            flow = self.flows.get(direction)
            if flow is None or flow.session != key:
                self.flows.pop(direction, None)
                self._add_flow(direction, TcpFlow(key, from_source, rcv, not seg.flags & _TCP_SYN))
        if direction not in self.flows:  # (only the connections followed are reassembled)
            return out
        for chunk in self._streams.feed(seg):
            flow = self.flows.get(chunk.direction)
            if flow is not None:
                out += self._bytes(flow, chunk)
        if seg.flags & (_TCP_FIN | _TCP_RST):
            self.flows.pop(direction, None)
            if seg.flags & _TCP_RST:
                self.flows.pop((seg.dst, seg.dport, seg.src, seg.sport), None)
        return out

    def _add_flow(self, direction: tuple, flow: TcpFlow) -> None:
        """Follow a TCP direction; beyond ``max_flows`` the oldest followed is dropped."""
        if direction in self.flows:
            return
        while len(self.flows) >= self.max_flows:
            self.flows.pop(next(iter(self.flows)))
            self.state.overflow["tcp_flows"] += 1
        self.flows[direction] = flow

    def _bytes(self, flow: TcpFlow, chunk) -> list:
        if chunk.resync and flow.session:
            flow.resync()
            if chunk.skipped:
                self.state.errors["tcp_hole"] += 1
        msgs, bad, lost = flow.feed(chunk.data)
        if not flow.session:  # a new connection: LBT-TCP only if its first bytes are messages
            if bad or lost:
                self.flows.pop(chunk.direction, None)
                return []
            return self._learn(flow, chunk, msgs) if msgs else []
        if bad:
            self.state.errors["tcp_not_lbmc"] += bad
        if lost:
            self.state.errors["tcp_no_boundary"] += lost
        s = self.state.sessions.get(flow.session)
        return [message_record(self.state, s, chunk.ts, chunk.frame, LBTTCP, flow.session, m, False) for m in msgs]

    def _learn(self, flow: TcpFlow, chunk, msgs: list[bytes]) -> list:
        """A connection with no TIR: LBT-TCP if its first message carries a TCP_SID header."""
        try:
            first = C.decode(msgs[0])
        except C.LbmcDecodeError:
            first = None
        sid_h = None if first is None else first.header(C.TcpSidHeader)
        src, sport, dst, dport = chunk.direction
        if sid_h is None:
            self.flows.pop(chunk.direction, None)
            self.flows.pop((dst, dport, src, sport), None)
            return []
        ip, port = (src, sport) if flow.from_source else (dst, dport)
        s = self.state.session(LBTTCP, ip, port, sid_h.session_id)
        if s is None:
            return []
        self.sources.setdefault((ip, port), set()).add(s.session_id)
        for d in (chunk.direction, (dst, dport, src, sport)):
            f = self.flows.get(d)
            if f is not None:
                f.session = s.key
        s.first_ts = min(s.first_ts, chunk.ts)
        s.last_ts = max(s.last_ts, chunk.ts)
        return [message_record(self.state, s, chunk.ts, chunk.frame, LBTTCP, s.key, m, False) for m in msgs]
