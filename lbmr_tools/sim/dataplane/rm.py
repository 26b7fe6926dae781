"""LBT-RM data endpoints: a multicast source that answers NAKs with NCFs and
retransmissions, and a receiver that verifies the data, finds gaps and
recovers them by NAK (see :mod:`lbmr_tools.sim.dataplane`).

The datagrams are real LBT-RM (:mod:`lbmr_proto.lbtrm`: DATA, SM, NAK,
NCF); the payload is the numbered pattern, sequence ``q`` carrying the
stream at ``q * 65536`` (as the LBT-RU-like protocol does), instead of UM's
LBMC message headers. The minimal honest form of UM's reliability:

* the source multicasts DATA ``0 .. count-1`` at ``rate`` per second to
  (group, dest_port) from its unicast (ip, port) -- the port of the TIR,
  where NAKs go -- then session messages (SM, lead = count-1) every
  ``sm_interval``, doubling up to ``sm_max_interval`` (so a receiver notices
  a lost tail), until cancelled, or for ``linger`` seconds after its last
  DATA: then it closes its socket (the source exited: later NAKs meet ICMP
  port unreachable);
* every sequence stays retransmittable (the payload is computed again, not
  kept: trail_sqn is 0). A NAK for the source's session id gets an NCF
  (reason "retransmit delay", multicast) and the retransmissions (DATA with
  the retransmission flag, multicast); a sequence is retransmitted at most
  once every ``ignore_interval`` (UM's transport_lbtrm_ignore_interval): a
  NAK for it within that gets an NCF with reason "NAK ignored" instead;
* the receiver joins (group, dest_port), keeps the datagrams of its
  session id, verifies every payload, and counts a gap as soon as it sees a
  higher sequence (DATA or an SM's lead). A missing sequence is NAKed (to
  the source's ip and unicast port) ``nak_backoff`` after it went missing,
  then every ``nak_interval`` (an NCF for it postpones the next NAK by one
  interval) at most ``nak_attempts`` times: then it is unrecoverable. It
  expects ``0 .. expect_count-1`` (a receiver that joins late NAKs what it
  missed: there is no late join). ``drop_every`` n > 0 makes it discard,
  on purpose, the first ``drop_copies`` copies of every sequence ``q`` with
  ``q % n == n-1`` (loss to recover; with 2 it loses the first
  retransmission too and NAKs again ``nak_interval`` later).
"""

from __future__ import annotations

import contextlib
import math
import socket
from dataclasses import dataclass

import trio

from lbmr_proto import lbtrm as RM
from lbmr_runtime.netif import open_multicast_socket

from .pattern import ReceiveRates, check_seed, pattern

Addr = tuple[str, int]

RM_SEQ_SPACING = 65536  # the payload of sequence q: the stream at q * 65536
RM_OVERHEAD = RM.HEADER.size + RM.DATA_HDR.size  # 20 bytes before the payload
RM_MAX_DATAGRAM = 1400
RM_MIN_DATAGRAM = RM_OVERHEAD + 8  # room for the payload's offset stamp


def encode_rm_data(pat, port: int, session_id: int, seq: int, datagram_size: int, *,
                   retransmission: bool = False) -> bytes:
    """The DATA datagram of sequence ``seq``, ``datagram_size`` bytes in all."""
    flags = RM.FLAG_UNICAST_NAKS | (RM.FLAG_RETRANSMISSION if retransmission else 0)
    return RM.encode_data(port, session_id, seq, 0,
                          pat.bytes_at(seq * RM_SEQ_SPACING, datagram_size - RM_OVERHEAD), flags=flags)


def _multicast_sender(ip: str, port: int, ttl: int, snd_buf: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, snd_buf)
        except OSError:
            pass
        s.bind((ip, port))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(ip))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
    except BaseException:
        s.close()
        raise
    return s


class RmDataSource:
    """An LBT-RM source (module doc): NAKs on (``bind_ip``, ``port``), data to
    (``group``, ``dest_port``). ``session_id`` None: :meth:`serve` binds and
    reports, then waits for :meth:`set_session` before sending anything (the
    simulator learns the advertised session id after binding). Counters:
    datagrams_sent, sms_sent, naks, nak_sqns, naks_foreign (another session
    id), retransmissions, retransmissions_ignored (within ignore_interval),
    naks_out_of_range, ncfs_sent (reason "retransmit delay", with the
    retransmissions), ncfs_ignored_sent (reason "NAK ignored"), malformed,
    send_errors, recv_errors, unread_at_exit (datagrams left queued when it
    exited, unanswered). ``linger``: None runs until cancelled, else the
    seconds it stays after its last DATA (:attr:`exited` then)."""

    def __init__(self, bind_ip: str = "127.0.0.1", port: int = 0, *, group: str = "224.10.10.10",
                 dest_port: int = 14400, session_id: int | None = None, count: int = 1000,
                 seed: int = 0, datagram_size: int = RM_MAX_DATAGRAM, rate: float = 1000.0,
                 max_burst: int = 32, ttl: int = 1, sm_interval: float = 0.05,
                 sm_max_interval: float = 1.0, ignore_interval: float = 0.05,
                 snd_buf: int = 1 << 20, linger: float | None = None) -> None:
        if count < 0:
            raise ValueError("count must be >= 0")
        if not RM_MIN_DATAGRAM <= datagram_size <= RM_MAX_DATAGRAM:
            raise ValueError(f"datagram_size must be {RM_MIN_DATAGRAM}..{RM_MAX_DATAGRAM}")
        if not (rate > 0 and math.isfinite(rate)) or max_burst < 1:
            raise ValueError("rate and max_burst must be positive")
        if not (0 < sm_interval <= sm_max_interval) or ignore_interval < 0:
            raise ValueError("need 0 < sm_interval <= sm_max_interval and ignore_interval >= 0")
        if linger is not None and not (linger >= 0 and math.isfinite(linger)):
            raise ValueError("linger must be a finite number of seconds >= 0")
        self.bind_ip, self.port = bind_ip, port
        self.group, self.dest_port = group, dest_port
        self.session_id = session_id
        self.count, self.seed = count, check_seed(seed)
        self.datagram_size, self.rate, self.max_burst = datagram_size, float(rate), max_burst
        self.ttl, self.snd_buf = ttl, snd_buf
        self.sm_interval, self.sm_max_interval = sm_interval, sm_max_interval
        self.ignore_interval, self.linger = ignore_interval, linger
        self.exited = False  # it lingered after its data and closed its socket
        self.address: Addr | None = None
        self.next_seq = 0  # sequences below it were sent
        self.counters: dict[str, int] = dict.fromkeys(
            ("datagrams_sent", "sms_sent", "naks", "nak_sqns", "naks_foreign", "retransmissions",
             "retransmissions_ignored", "naks_out_of_range", "ncfs_sent", "ncfs_ignored_sent", "malformed",
             "send_errors", "unread_at_exit",
             "recv_errors"), 0)
        self._sock = None
        self._go = trio.Event()
        self._last_rx: dict[int, float] = {}  # sequence -> when last retransmitted
        if session_id is not None:
            self._go.set()

    def set_session(self, session_id: int) -> None:
        """The session id to send with; sending starts now."""
        self.session_id = session_id
        self._go.set()

    @property
    def datagrams_sent(self) -> int:
        return self.counters["datagrams_sent"]

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Bind, report the bound (ip, port), send the data and then session
        messages, and answer NAKs, until cancelled (or, with ``linger``, that
        long after the last DATA: then the socket closes)."""
        raw = _multicast_sender(self.bind_ip, self.port, self.ttl, self.snd_buf)
        sock = trio.socket.from_stdlib_socket(raw)
        self._sock = sock
        self.address = sock.getsockname()[:2]
        with sock:
            async with trio.open_nursery() as n:
                task_status.started(self.address)
                await self._go.wait()
                n.start_soon(self._naks)
                await self._send_all()
                n.cancel_scope.cancel()
            self._count_unread(raw)
        self.exited = True

    def _count_unread(self, raw: socket.socket) -> None:
        """The source exits: count the datagrams still queued on its socket
        (``unread_at_exit``), which it never answers (bounded by the socket's
        receive buffer)."""
        raw.setblocking(False)
        while True:
            try:
                raw.recv(1)
            except OSError:  # (BlockingIOError: nothing left)
                return
            self.counters["unread_at_exit"] += 1

    async def _send(self, data: bytes) -> bool:
        try:
            await self._sock.sendto(data, (self.group, self.dest_port))
        except OSError:
            self.counters["send_errors"] += 1
            return False
        return True

    async def _send_all(self) -> None:
        pat = pattern(self.seed)
        port, sid, c = self.address[1], self.session_id, self.counters
        t0 = trio.current_time()
        while self.next_seq < self.count:
            due = min(self.count, math.floor((trio.current_time() - t0) * self.rate + 1e-6) + 1)
            if due <= self.next_seq:
                await trio.sleep_until(t0 + self.next_seq / self.rate)
                continue
            for _ in range(min(due - self.next_seq, self.max_burst)):
                if await self._send(encode_rm_data(pat, port, sid, self.next_seq, self.datagram_size)):
                    c["datagrams_sent"] += 1
                self.next_seq += 1
        gap, sm_sqn = self.sm_interval, 0
        with trio.move_on_after(math.inf if self.linger is None else self.linger):
            while True:
                if self.count and await self._send(RM.encode_sm(port, sid, sm_sqn, self.count - 1, 0)):
                    c["sms_sent"] += 1
                    sm_sqn += 1
                await trio.sleep(gap)
                gap = min(gap * 2, self.sm_max_interval)

    async def _naks(self) -> None:
        pat = pattern(self.seed)
        port, sid, c = self.address[1], self.session_id, self.counters
        while True:
            try:
                data, _ = await self._sock.recvfrom(65536)
            except OSError:
                c["recv_errors"] += 1
                await trio.sleep(0.001)
                continue
            try:
                nak = RM.decode(data)
            except RM.LbtrmDecodeError:
                c["malformed"] += 1
                continue
            if not isinstance(nak, RM.Nak):
                c["malformed"] += 1
                continue
            if nak.header.session_id != sid:
                c["naks_foreign"] += 1
                continue
            c["naks"] += 1
            c["nak_sqns"] += len(nak.sqns)
            now = trio.current_time()
            todo, ignored = [], []
            for q in dict.fromkeys(nak.sqns):  # each once, in order
                if q >= self.next_seq:
                    c["naks_out_of_range"] += 1
                elif now - self._last_rx.get(q, -math.inf) < self.ignore_interval:
                    c["retransmissions_ignored"] += 1
                    ignored.append(q)
                else:
                    self._last_rx[q] = now
                    todo.append(q)
            if ignored and await self._send(RM.encode_ncf(port, sid, 0, ignored, reason=RM.NCF_IGNORED)):
                c["ncfs_ignored_sent"] += 1
            if not todo:
                continue
            if await self._send(RM.encode_ncf(port, sid, 0, todo, reason=RM.NCF_RX_DELAY)):
                c["ncfs_sent"] += 1
            for q in todo:
                if await self._send(encode_rm_data(pat, port, sid, q, self.datagram_size, retransmission=True)):
                    c["retransmissions"] += 1


@dataclass
class RmReceiveResult(ReceiveRates):
    """What an :class:`RmDataReceiver` saw. ``ok``: every sequence of
    ``0 .. expect_count-1`` received and verified, nothing corrupt."""

    source: str
    expect_count: int
    received: int = 0  # distinct, verified sequences
    bytes_received: int = 0
    dropped_on_purpose: int = 0
    recovered: int = 0  # sequences received as retransmissions after a NAK
    duplicates: int = 0
    corrupt: int = 0
    missing: int = 0
    unrecoverable: int = 0
    naks_sent: int = 0
    nak_sqns: int = 0
    ncfs: int = 0
    sms: int = 0
    foreign: int = 0  # other sessions' datagrams on the group, and NAKs (ignored)
    error: str | None = None
    elapsed: float = 0.0
    data_elapsed: float = 0.0
    done: bool = False

    @property
    def ok(self) -> bool:
        return (self.done and self.error is None and self.missing == 0 and self.corrupt == 0
                and self.received == self.expect_count)


class RmDataReceiver:
    """An LBT-RM receiver (module doc) of the transport (``source_ip``,
    ``ucast_port``, ``session_id``, ``group``, ``dest_port``), joined on the
    interface of ``iface_ip``. Bounds: ``timeout`` for the whole run,
    ``idle_timeout`` without any datagram of the session, ``nak_attempts``
    NAKs per sequence, sequences below ``expect_count``."""

    def __init__(self, source_ip: str, ucast_port: int, session_id: int, group: str, dest_port: int, *,
                 iface_ip: str, seed: int = 0, expect_count: int, drop_every: int = 0, drop_copies: int = 1,
                 nak_backoff: float = 0.02, nak_interval: float = 0.2, nak_attempts: int = 25,
                 idle_timeout: float = 5.0, timeout: float = 60.0, rcv_buf: int = 4 << 20) -> None:
        if expect_count < 1 or drop_every < 0 or drop_copies < 1:
            raise ValueError("expect_count must be >= 1, drop_every >= 0 and drop_copies >= 1")
        if not (nak_backoff >= 0 and nak_interval > 0 and nak_attempts >= 1 and idle_timeout > 0
                and timeout > 0):
            raise ValueError("NAK timing, attempts and timeouts must be positive")
        self.source = (source_ip, ucast_port)
        self.session_id, self.group, self.dest_port = session_id, group, dest_port
        self.iface_ip, self.seed = iface_ip, check_seed(seed)
        self.expect_count, self.drop_every, self.drop_copies = expect_count, drop_every, drop_copies
        self.nak_backoff, self.nak_interval, self.nak_attempts = nak_backoff, nak_interval, nak_attempts
        self.idle_timeout, self.timeout, self.rcv_buf = idle_timeout, timeout, rcv_buf
        self.result = RmReceiveResult(f"LBTRM {source_ip}:{ucast_port} {group}:{dest_port} "
                                      f"session {session_id:#010x}", expect_count)
        self._seen = bytearray(expect_count)
        self._dropped: dict[int, int] = {}  # sequence -> copies of it discarded on purpose
        self._missing: dict[int, list] = {}  # sequence -> [next NAK at, NAKs sent]
        self._known = 0  # sequences below it are received or missing
        self._naked: set[int] = set()
        self._expect_n: int | None = None  # the payload size of the first datagram
        self._first: float | None = None  # when the first datagram came

    async def _open(self) -> list:
        """The sockets, the one to report (its address) last: the group's and
        a unicast one for NAKs."""
        mc = trio.socket.from_stdlib_socket(open_multicast_socket(
            self.group, self.dest_port, 0, self.iface_ip, self.iface_ip, 1, buffer=self.rcv_buf))
        try:
            uc = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            await uc.bind((self.iface_ip, 0))
        except BaseException:
            mc.close()
            raise
        return [mc, uc]

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> RmReceiveResult:
        """Receive until everything arrived, the session stalls or ``timeout``;
        reports the unicast socket's address through ``task_status``."""
        r = self.result
        t0 = trio.current_time()
        try:
            socks = await self._open()
        except OSError as e:
            r.error, r.done = f"socket error: {e.strerror or e}", True
            task_status.started(None)
            return r
        try:
            with contextlib.ExitStack() as stack:
                for s in socks:
                    stack.enter_context(s)
                task_status.started(socks[-1].getsockname()[:2])
                with trio.move_on_after(self.timeout) as scope:
                    await self._loop(*socks)
                if scope.cancelled_caught and r.error is None:
                    r.error = f"timeout after {self.timeout:g} s ({r.received} of {self.expect_count})"
        finally:
            r.missing = self.expect_count - r.received
            r.elapsed = trio.current_time() - t0
            r.done = True
        return r

    def _gap_to(self, top: int, now: float) -> float:
        """Sequences below ``top`` not seen yet are missing from ``now``; when
        the first NAK for them is due (inf: none went missing)."""
        top = min(top, self.expect_count)
        added = False
        for q in range(self._known, top):
            if not self._seen[q] and q not in self._missing:
                self._missing[q] = [now + self.nak_backoff, 0]
                added = True
        self._known = max(self._known, top)
        return now + self.nak_backoff if added else math.inf

    async def _send_naks(self, uc, now: float) -> float:
        """NAK the missing sequences that are due; the next NAK time."""
        r = self.result
        due = []
        nxt = math.inf
        for q, st in list(self._missing.items()):
            if st[0] <= now:
                if st[1] >= self.nak_attempts:
                    del self._missing[q]
                    r.unrecoverable += 1
                    if r.error is None:
                        r.error = f"sequence {q} unrecoverable after {st[1]} NAKs"
                    continue
                due.append(q)
                st[1] += 1
                st[0] = now + self.nak_interval
            nxt = min(nxt, st[0])
        for i in range(0, len(due), self.MAX_NAKS):
            chunk = due[i:i + self.MAX_NAKS]
            try:
                await uc.sendto(self._nak_datagram(chunk), self.source)
            except OSError:
                continue
            r.naks_sent += 1
            r.nak_sqns += len(chunk)
            self._naked.update(chunk)
        return nxt

    MAX_NAKS = RM.MAX_NAKS  # sequences in one NAK

    def _nak_datagram(self, sqns: list[int]) -> bytes:
        """The NAK for ``sqns`` to send to the source."""
        return RM.encode_nak(self.source[1], self.session_id, sqns)

    def _ncf(self, sqns, now: float) -> None:
        """The source confirmed NAKs for ``sqns``: the next NAK for each waits."""
        for q in sqns:
            st = self._missing.get(q)
            if st is not None:
                st[0] = max(st[0], now + self.nak_interval)

    def _data(self, q: int, payload, now: float, pat) -> float:
        """A DATA datagram of sequence ``q``: verify and keep it, or count it
        (dropped on purpose, duplicate, corrupt); when a NAK is due next
        because of it (inf: none)."""
        r = self.result
        n = len(payload)
        if q >= self.expect_count:
            r.corrupt += 1
            r.error = r.error or f"sequence {q} beyond the {self.expect_count} expected"
            return math.inf
        if (self.drop_every and q % self.drop_every == self.drop_every - 1
                and self._dropped.get(q, 0) < self.drop_copies and not self._seen[q]):
            if q not in self._dropped:
                r.dropped_on_purpose += 1
            self._dropped[q] = self._dropped.get(q, 0) + 1
            return self._gap_to(q + 1, now)
        if self._seen[q]:
            r.duplicates += 1
            return math.inf
        bad = None
        if self._expect_n is not None and n != self._expect_n:
            bad = f"payload of {n} bytes, earlier ones had {self._expect_n}"
        else:
            i = pat.check(q * RM_SEQ_SPACING, payload)
            if i is not None:
                bad = f"payload byte {i} wrong"
        if bad is not None:
            r.corrupt += 1
            r.error = r.error or f"corrupt datagram (sequence {q}): {bad}"
            return math.inf
        self._expect_n = n
        nak_at = self._gap_to(q, now)
        self._known = max(self._known, q + 1)
        self._seen[q] = 1
        if self._missing.pop(q, None) is not None and q in self._naked:
            r.recovered += 1
        r.received += 1
        r.bytes_received += n
        self._first = now if self._first is None else self._first
        r.data_elapsed = now - self._first
        return nak_at

    async def _loop(self, mc, uc) -> None:
        r = self.result
        pat = pattern(self.seed)
        last_rx = trio.current_time()
        nak_at = math.inf
        while r.received < self.expect_count:
            if self._known >= self.expect_count and not self._missing:
                return  # the rest is unrecoverable: nothing left to wait for
            now = trio.current_time()
            if now - last_rx >= self.idle_timeout:
                r.error = (f"stalled: nothing from the session for {self.idle_timeout:g} s after "
                           f"{r.received} datagrams")
                return
            if nak_at <= now:
                nak_at = await self._send_naks(uc, now)
                continue
            with trio.move_on_at(min(nak_at, last_rx + self.idle_timeout)):
                try:
                    data, src = await mc.recvfrom(65536)
                except OSError:
                    await trio.sleep(0.001)
                    continue
                now = trio.current_time()
                try:
                    msg = RM.decode(data)
                except RM.LbtrmDecodeError:
                    r.foreign += 1
                    continue
                if msg.header.session_id != self.session_id or isinstance(msg, RM.Nak):
                    r.foreign += 1
                    continue
                last_rx = now
                if isinstance(msg, RM.SessionMessage):
                    r.sms += 1
                    nak_at = min(nak_at, self._gap_to(msg.lead_sqn + 1, now))
                elif isinstance(msg, RM.Ncf):
                    r.ncfs += 1
                    self._ncf(msg.sqns, now)
                elif isinstance(msg, RM.Data):
                    nak_at = min(nak_at, self._data(msg.sqn, msg.payload, now, pat))
