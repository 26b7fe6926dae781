"""What the live sources and receivers of the data plane share (see
:mod:`lbmr_tools.sim.dataplane`): the LBMC data messages of a stream, the
clock that makes them due, the check of one received message, and the
listening socket of a TCP source."""

from __future__ import annotations

import math
import socket
from dataclasses import asdict, dataclass

import trio

from lbmr_proto import lbmc

from .pattern import pattern

MAX_MISSING = 4096  # sequence numbers a receiver waits for at once

MSG_SPACING = 65536  # the payload of sequence q is the pattern at q * 65536 (> any payload)
MAX_PAYLOAD = lbmc.MAX_MSGLEN - lbmc.DATA_HEADER.size
DEFAULT_MESSAGE_SIZE = 8192  # payload bytes per message
DEFAULT_MESSAGE_RATE = 10000.0  # messages per second


def message_payload(seed: int, sqn: int, size: int) -> bytearray:
    """The ``size`` payload bytes of message ``sqn`` of the stream of ``seed``."""
    return pattern(seed).bytes_at(sqn * MSG_SPACING, size)


def data_message(seed: int, tidx: int, sqn: int, size: int) -> bytes:
    """One LBMC data message of the stream (topic index ``tidx``; the
    sequence number wraps at 2**32, as on the wire)."""
    sqn &= 0xFFFFFFFF
    return lbmc.data_message(tidx, sqn, message_payload(seed, sqn, size))


class MessageClock:
    """Message ``sqn`` is due ``sqn / rate`` seconds (``rate``: messages per
    second) after :meth:`start`, counting only the time the clock runs;
    :meth:`next_batch` waits until at least one is due and hands out the next
    at most ``max_burst``, up to ``max_messages`` (None: no end).

    The clock runs only while its source has receivers: it starts stopped,
    :meth:`run` (a receiver arrived) makes ``next_sqn`` due at once and the
    rest follow at ``rate``, :meth:`stop` (the last receiver left) makes
    :meth:`next_batch` wait, without a timer, for the next :meth:`run`. A
    source with no receivers costs nothing and its stream goes on at the next
    sequence number."""

    def __init__(self, rate: float, max_burst: int, max_messages: int | None) -> None:
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError("rate must be a positive number of messages per second")
        if max_burst < 1:
            raise ValueError("max_burst must be positive")
        if max_messages is not None and max_messages < 0:
            raise ValueError("max_messages must be >= 0 or None")
        self.rate, self.max_burst, self.max_messages = float(rate), max_burst, max_messages
        self.next_sqn = 0  # messages handed out so far
        self._t0 = 0.0
        self.running = False
        self._run = trio.Event()

    def run(self) -> None:
        """A receiver is there: ``next_sqn`` is due now (no-op if running)."""
        if self.running:
            return
        self.running = True
        self._t0 = trio.current_time() - self.next_sqn / self.rate
        self._run.set()

    def stop(self) -> None:
        """No receiver is left: :meth:`next_batch` waits for :meth:`run`."""
        if self.running:
            self.running = False
            self._run = trio.Event()

    @property
    def ended(self) -> bool:
        return self.max_messages is not None and self.next_sqn >= self.max_messages

    async def next_batch(self) -> tuple[int, int]:
        """(first sequence, count) of the next due batch; (next_sqn, 0) once ended."""
        last = self.max_messages
        while not self.ended:
            if not self.running:
                await self._run.wait()
                continue
            sqn = self.next_sqn
            # + 1e-6: waking at t0 + sqn / rate must make sqn due despite float rounding
            due = math.floor((trio.current_time() - self._t0) * self.rate + 1e-6) + 1
            if last is not None:
                due = min(due, last)
            if due <= sqn:
                await trio.sleep_until(self._t0 + sqn / self.rate)
                continue
            n = min(due - sqn, self.max_burst)
            self.next_sqn = sqn + n
            return sqn, n
        return self.next_sqn, 0


class StreamMismatch(Exception):
    """The stream broke a rule: the message says which."""


@dataclass
class LiveMessages:
    """The data messages a receiver verified: ``messages`` consecutive ones
    from ``first_sqn`` to ``last_sqn`` of topic index ``tidx``,
    ``bytes_received`` payload bytes; ``control_messages`` counted,
    ``session_id`` from a TCP_SID control message."""

    bytes_received: int = 0
    messages: int = 0
    control_messages: int = 0
    first_sqn: int | None = None
    last_sqn: int | None = None
    tidx: int | None = None
    session_id: int | None = None

    def as_dict(self) -> dict:
        """The fields, plus the subclass's ``ok`` and ``bytes_per_s`` properties."""
        d = asdict(self)
        d.update(ok=self.ok, bytes_per_s=round(self.bytes_per_s, 1))
        return d


def count_control(r: LiveMessages, m: lbmc.Message) -> bool:
    """Count ``m`` in ``r`` if it is a control message (its TCP_SID header, if
    any, gives ``r.session_id``); whether it was one."""
    if m.kind not in lbmc.CONTROL_KINDS:
        return False
    r.control_messages += 1
    sid = m.header(lbmc.TcpSidHeader)
    if sid is not None:
        r.session_id = sid.session_id
    return True


def verify_message(r: LiveMessages, m: lbmc.Message, seed: int, tidx: int | None) -> None:
    """Check message ``m`` of the live stream of ``seed`` against what ``r``
    has seen (data messages: the topic index ``tidx``, or the first one's
    when None; the sequence after the last; the payload of its sequence)
    and count it in ``r``; raises :class:`StreamMismatch`."""
    if count_control(r, m):
        return
    if m.kind != lbmc.MESSAGE:
        raise StreamMismatch(f"a {lbmc.KIND_NAMES[m.kind]} message (sequence {m.sqn}) in a live stream")
    want_tidx = tidx if r.tidx is None else r.tidx
    if want_tidx is not None and m.tidx != want_tidx:
        raise StreamMismatch(f"topic index {m.tidx} (sequence {m.sqn}), expected {want_tidx}")
    if r.last_sqn is not None and m.sqn != (r.last_sqn + 1) & 0xFFFFFFFF:
        raise StreamMismatch(f"sequence {m.sqn} after {r.last_sqn}: "
                             f"{'a gap' if m.sqn > r.last_sqn else 'out of order'}")
    if message_payload(seed, m.sqn, len(m.payload)) != m.payload:
        raise StreamMismatch(f"payload of sequence {m.sqn} ({len(m.payload)} bytes) is not the stream's")
    if r.first_sqn is None:
        r.first_sqn, r.tidx = m.sqn, m.tidx
    r.last_sqn = m.sqn
    r.messages += 1
    r.bytes_received += len(m.payload)


@dataclass
class RepairCounts:
    """What a receiver that repairs its stream (:class:`Repair`) counted:
    the first live sequence number (its join point), messages discarded on
    purpose, found missing, recovered, still missing (``unrecovered``) and
    retransmissions of messages it already had (``duplicates``)."""

    first_live_sqn: int | None = None
    dropped_on_purpose: int = 0
    missing_found: int = 0
    recovered: int = 0
    unrecovered: int = 0
    duplicates: int = 0


class Repair:
    """The sans-IO core of a receiver that repairs its stream: live messages
    of topic index ``tidx`` (None: the first one's) with ``seed``'s payloads
    go in with :meth:`live`, RETRANS with :meth:`retrans`, the late-join
    range with :meth:`late_join`; ``missing`` is what it still waits for
    (at most ``max_missing``: beyond, :class:`StreamMismatch`). Counts go
    into ``result`` (a :class:`LiveMessages` and :class:`RepairCounts`;
    :meth:`late_join` sets its ``lj_low``/``lj_high``)."""

    def __init__(self, result, seed: int, tidx: int | None = None, *,
                 max_missing: int = MAX_MISSING) -> None:
        self.r, self.seed, self.tidx, self.max_missing = result, seed, tidx, max_missing
        self.next_live: int | None = None
        self.missing: set[int] = set()
        self.lj_next: int | None = None  # the next retained message a late join waits for
        self.lj_top = 0  # ... up to this one, excluded (the first live one)
        self.covered_bytes = 0  # payload bytes of the live messages seen (discarded too) and late join

    @property
    def live_span(self) -> int:
        """Sequence numbers from the first live message to the last one seen."""
        return 0 if self.next_live is None else self.next_live - self.r.first_live_sqn

    @property
    def pending(self) -> int:
        """Messages still missing: single ones and the rest of a late join."""
        return len(self.missing) + (0 if self.lj_next is None else self.lj_top - self.lj_next)

    def _check(self, m: lbmc.Message) -> None:
        if self.tidx is not None and m.tidx != self.tidx:
            raise StreamMismatch(f"topic index {m.tidx} (sequence {m.sqn}), expected {self.tidx}")
        if message_payload(self.seed, m.sqn, len(m.payload)) != m.payload:
            raise StreamMismatch(f"payload of sequence {m.sqn} ({len(m.payload)} bytes) is not the stream's")

    def _count(self, m: lbmc.Message) -> None:
        r = self.r
        r.messages += 1
        r.bytes_received += len(m.payload)
        r.first_sqn = m.sqn if r.first_sqn is None else min(r.first_sqn, m.sqn)
        r.last_sqn = m.sqn if r.last_sqn is None else max(r.last_sqn, m.sqn)

    def _want(self, sqns: range) -> list[int]:
        if len(self.missing) + len(sqns) > self.max_missing:
            raise StreamMismatch(f"{len(self.missing) + len(sqns)} messages missing at once "
                                 f"(at most {self.max_missing})")
        self.missing.update(sqns)
        self.r.missing_found += len(sqns)
        self.r.unrecovered = self.pending
        return list(sqns)

    def live(self, m: lbmc.Message, discard: bool = False) -> list[int]:
        """A live data message (``discard``: thrown away on purpose, as if
        lost). Returns the sequence numbers newly found missing before it."""
        if m.kind != lbmc.MESSAGE:
            raise StreamMismatch(f"a {lbmc.KIND_NAMES[m.kind]} message (sequence {m.sqn}) in a live stream")
        r = self.r
        if self.next_live is None:
            if discard:  # never discard the first: it is the join point
                discard = False
            self.tidx = m.tidx if self.tidx is None else self.tidx
            self.next_live = r.first_live_sqn = m.sqn
            r.tidx = self.tidx
        if m.sqn < self.next_live:
            raise StreamMismatch(f"sequence {m.sqn} after {self.next_live - 1}: out of order")
        self._check(m)
        new = self._want(range(self.next_live, m.sqn)) if m.sqn > self.next_live else []
        self.next_live = m.sqn + 1
        self.covered_bytes += len(m.payload)
        if discard:
            r.dropped_on_purpose += 1
            return new + self._want(range(m.sqn, m.sqn + 1))
        self._count(m)
        return new

    def retrans(self, m: lbmc.Message) -> bool:
        """A RETRANS: True when it was missing (now verified and counted).
        A late join's messages must come in order."""
        in_lj = self.lj_next is not None and m.sqn == self.lj_next
        if not (in_lj or m.sqn in self.missing) or (self.tidx is not None and m.tidx != self.tidx):
            self.r.duplicates += 1
            return False
        self._check(m)
        if in_lj:
            self.covered_bytes += len(m.payload)
            self.lj_next += 1
            if self.lj_next >= self.lj_top:
                self.lj_next = None
        else:
            self.missing.discard(m.sqn)
        self._count(m)
        self.r.recovered += 1
        self.r.unrecovered = self.pending
        return True

    def late_join(self, low: int, high: int) -> int:
        """The source retains ``low``..``high``: the ones before the first
        live message are now wanted, in order (however many: a range, not a
        set). Returns how many."""
        r = self.r
        r.lj_low, r.lj_high = low, high
        top = min(high + 1, r.first_live_sqn if r.first_live_sqn is not None else low)
        if top <= low:
            return 0
        self.lj_next, self.lj_top = low, top
        r.missing_found += top - low
        r.unrecovered = self.pending
        return top - low


async def open_tcp_listener(bind_ip: str, port: int, backlog: int) -> trio.SocketListener:
    """A TCP socket listening on (``bind_ip``, ``port``; 0: any free port) with
    SO_REUSEADDR, ``backlog`` connections queued, as a trio listener; raises
    OSError (e.g. EADDRINUSE) having closed the socket."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        await sock.bind((bind_ip, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return trio.SocketListener(sock)
