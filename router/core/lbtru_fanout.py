"""One origin session re-published as an LBT-RU source to many receivers,
sans-IO: the proxy of an LBT-RU origin (fan-out, :mod:`router.relays.lbtru_fanout`)
and of an LBT-RM origin in a TRD without multicast (the endpoint's
``<lbt-rm transport="lbt-ru"/>``, :mod:`router.relays.lbtrm`). The
datagrams are :mod:`lbmr_proto.lbtru` (UM's LBT-RU) towards the receivers;
from the peer they are the origin's as it sent them, read by the proxy's
origin input (:mod:`router.core.lbtru_origin`: LBT-RM or LBT-RU, each
giving sequences, payloads and the origin's lead and trail).

The proxy's TIR advertises an LBT-RU transport: the relay address and port
and a session id (the origin's for an LBT-RU origin, the proxy's own for an
LBT-RM one). Then:

* **connecting**: a receiver sends a CREQ (SYN) with that session id; the
  proxy makes it a client (a client id of its own; at most ``max_clients``,
  the unconfirmed client heard from longest ago is replaced when the
  table is full) and answers with a session message with SYN (lead and
  trail sequence -- trail above lead while the window is empty -- and the
  client id). A CREQ from a client is answered again;
* **data**: every original DATA of the origin (payload untouched, sequence
  number the origin's) goes to every *confirmed* client as an LBT-RU DATA
  with the proxy's session id. A client is confirmed by its first ACK or
  NAK: a CREQ alone never makes the router send data to an address, so a
  spoofed CREQ costs one 32-byte session message (one datagram for one: no
  amplification). Data the client missed meanwhile it NAKs, like any loss;
* **retransmission**: the last ``window`` datagrams (and at most
  ``window_bytes`` of payload; all the proxies of an endpoint together
  within their :class:`router.core.lbtru_window.WindowBudget`, each cut to a
  fair share while they are over it) are kept. A NAK from a client is answered
  from them (DATA with the retransmission flag, at most ``rx_rate`` a second
  per client in bursts of ``rx_burst``, and with many clients NAKing (within
  the last second) ``rx_total_rate`` and ``rx_total_burst`` shared out
  evenly among them --
  many clients NAKing the window cannot make the proxy send max_clients
  times ``rx_rate``, nor take the others' share -- else an NCF "shed"; a
  client's NAK
  datagrams beyond 200 a second, bursts of 50, are dropped, and a NAK's
  sequences beyond :data:`lbmr_proto.lbtru.MAX_NAKS` ignored); a sequence the
  proxy never got (lost on the way) is NAKed towards the origin over the
  link (each sequence at most once per ``nak_ignore``) and
  the client gets an NCF "retransmit delay"; the origin's retransmission
  then goes to the clients waiting for it. A sequence older than the window
  gets an NCF "do not retry". The window starts, with the first datagram of
  the origin, as far back as the origin's trail sequence allows (at most
  ``window``), so a receiver can recover what was sent before the router
  joined, through the origin;
* **session messages**: while data flows none; when it stops, an SM (lead,
  trail) to every confirmed client after ``sm_min``, the interval doubling
  up to ``sm_max`` (UM's transport_lbtru_sm_minimum/maximum_interval);
* **liveness**: a client that has sent nothing for ``client_timeout`` (UM's
  transport_lbtru_client_activity_timeout, 10 s) is dropped with an RST; an
  unconfirmed one after ``connect_timeout``. A datagram from an address
  that is not a client gets an RST (so a receiver whose entry expired
  connects again); :meth:`RuFanout.close` resets every client.

What is kept of the origin: original and retransmitted DATA (its session
messages only move the lead sequence; its NCFs are the origin's answer to
the router and go no further). An LBT-RM DATA datagram with option headers
is dropped (counted): its payload cannot be told from them.
Sequence numbers are the origin's (u32; at 100,000 datagrams a second they
wrap after 12 hours): a DATA more than ``window`` sequences behind the
trail (the origin wrapped, or restarted) or past the window ahead starts
the window over there (counted ``lbtru_origin_sequence_jump``), so one stray
sequence does not shut the session out; one less far behind is too old.
A client's expiry costs its own pending NAKs (:attr:`RuClient.waiting`),
not the whole table.

Which datagram carries which option (inferred; the dissector shows both on
every type): the proxy puts its session id on everything it sends except
RSTs (see :mod:`lbmr_proto.lbtru`) and the client id on session messages;
it reads the session id of a client's datagram when there is one.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from lbmr_proto import lbtru as RU

from .lbtru_origin import LbtrmInput, LbtruInput, OriginLead
from .lbtru_window import WindowBudget

__all__ = ["RuFanout", "RuClient", "MAX_CLIENTS", "WINDOW", "WINDOW_BYTES"]

MAX_CLIENTS = 256  # receivers of one proxy
WINDOW = 4096  # datagrams kept for retransmission ...
WINDOW_BYTES = 8 << 20  # ... and at most this many payload bytes
CLIENT_TIMEOUT = 10.0  # seconds (UM's transport_lbtru_client_activity_timeout)
CONNECT_TIMEOUT = 2.0  # seconds an unconfirmed client is kept
SM_MIN, SM_MAX = 0.2, 10.0  # seconds (UM's transport_lbtru_sm_minimum/maximum_interval)
NAK_IGNORE = 0.2  # seconds between two NAKs of one sequence towards the origin
RX_RATE, RX_BURST = 2000.0, 500  # retransmissions per client a second, burst
RX_TOTAL_RATE, RX_TOTAL_BURST = 20000.0, 5000  # ... and of all clients together, shared out evenly
NAKER_WINDOW = 1.0  # seconds: the clients that NAKed within it share the proxy's retransmissions
NAK_RATE, NAK_BURST = 200.0, 50  # NAK datagrams per client a second, burst (more are dropped)
MAX_PENDING = 65536  # (sequence, client) pairs waiting for the origin's retransmission

Addr = tuple[str, int]
Out = list[tuple[bytes, Addr]]


@dataclass(slots=True)
class RuClient:
    """One receiver of the proxy: ``addr``, ``client_id``, when it connected
    and was last heard from (seconds), whether it confirmed (ACK or NAK),
    its retransmission tokens, the sequences it waits for from the origin
    (its entries in :attr:`RuFanout.pending`)."""

    addr: Addr
    client_id: int
    since: float
    heard: float
    confirmed: bool = False
    tokens: float = float(RX_BURST)
    tokens_at: float = 0.0
    nak_tokens: float = float(NAK_BURST)
    waiting: set[int] = field(default_factory=set)


class RuFanout:
    """The LBT-RU source of one proxy (module doc). ``session_id``: the proxy's
    (advertised) session id; ``origin``: how the origin's datagrams from the
    peer are read and the NAKs towards it written (default: LBT-RM, with
    port and session 0). Every method takes the time ``now`` in seconds and
    returns datagrams for the receivers as (bytes, address) pairs; NAKs for the
    peer collect in :attr:`naks_up` (take them with :meth:`take_naks_up`).
    ``path``: the message path the payload of each new DATA from the peer
    passes before it is kept and sent (:mod:`router.core.message_path`: the
    receivers' router points the requests at its request listeners; None: as
    it came). A rewrite keeps the payload's length."""

    def __init__(self, session_id: int, counters: Counter[str] | None = None, *,
                 origin: LbtrmInput | LbtruInput | None = None, max_clients: int = MAX_CLIENTS, window: int = WINDOW,
                 window_bytes: int = WINDOW_BYTES, client_timeout: float = CLIENT_TIMEOUT,
                 connect_timeout: float = CONNECT_TIMEOUT, sm_min: float = SM_MIN, sm_max: float = SM_MAX,
                 nak_ignore: float = NAK_IGNORE, rx_rate: float = RX_RATE, rx_burst: int = RX_BURST,
                 rx_total_rate: float = RX_TOTAL_RATE, rx_total_burst: int = RX_TOTAL_BURST,
                 budget: WindowBudget | None = None) -> None:
        if not (max_clients >= 1 and window >= 1 and window_bytes >= 1 and 0 < sm_min <= sm_max
                and client_timeout > 0 and connect_timeout > 0 and rx_rate > 0 and rx_burst >= 1
                and rx_total_rate > 0 and rx_total_burst >= 1):
            raise ValueError("LBT-RU fan-out: bounds and intervals must be positive")
        self.session_id = session_id & 0xFFFFFFFF
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self.origin = origin if origin is not None else LbtrmInput()
        self.max_clients, self.window, self.window_bytes = max_clients, window, window_bytes
        self.client_timeout, self.connect_timeout = client_timeout, connect_timeout
        self.sm_min, self.sm_max, self.nak_ignore = sm_min, sm_max, nak_ignore
        self.rx_rate, self.rx_burst = rx_rate, rx_burst
        self.rx_total_rate, self.rx_total_burst = rx_total_rate, rx_total_burst
        self.path = None  # MessagePath | None
        self.clients: dict[Addr, RuClient] = {}
        # the clients in the order they were last heard from (oldest first), so that
        # expiry, the next wake-up and the data's targets cost O(1) per client concerned
        self._confirmed: OrderedDict[Addr, None] = OrderedDict()
        self._unconfirmed: OrderedDict[Addr, None] = OrderedDict()
        self._nakers: OrderedDict[Addr, float] = OrderedDict()  # when each last NAKed, oldest first
        self.lead: int | None = None  # newest sequence known (data or the origin's SM)
        self.trail = 0  # oldest sequence served: from the buffer, or asked of the origin
        self.buffer: dict[int, bytes] = {}  # sequence -> payload
        self.buffer_bytes = 0
        self.budget = budget
        if budget is not None:
            budget.members.append(self)
        self.pending: dict[int, set[Addr]] = {}  # sequence -> clients waiting for it
        self._pending_n = 0
        self._naked_up: dict[int, float] = {}  # sequence -> when last NAKed towards the origin
        self.naks_up: list[bytes] = []
        self._next_id = 1
        self._sm_sqn = 0
        self._sm_interval = sm_min
        self._sm_at = math.inf

    @property
    def pending_naks(self) -> int:
        """The (sequence, client) pairs of :attr:`pending`: NAKs waiting for the
        origin's retransmission (at most :data:`MAX_PENDING`)."""
        return self._pending_n

    # ------------------------------------------------------------ the origin

    def from_peer(self, data: bytes, now: float) -> Out:
        """A datagram of the origin's session from the link (as :attr:`origin` reads it)."""
        m = self.origin.decode(data, self.counters)
        if isinstance(m, OriginLead):
            self._advance(m.lead, now, min(m.trail, m.lead + 1))
            return []
        if m is None:
            return []
        c = self.counters
        q = m.sqn
        if self.lead is not None and self.trail - self.window <= q < self.trail:
            c["lbtru_origin_too_old"] += 1  # (further behind: the origin wrapped or restarted, see _advance)
            return []
        self._advance(q, now, min(m.trail, q))
        if q in self.buffer:
            c["lbtru_origin_duplicate"] += 1
            return []
        payload = m.payload if self.path is None else self.path.payload(m.payload, now)
        self.buffer[q] = payload
        self._bytes(len(payload))
        self._evict()
        waiting = self._unpend(q)
        self._naked_up.pop(q, None)
        if m.retransmission:
            targets = [a for a in waiting if a in self.clients]
            out = RU.encode_data(q, self.trail, payload, session_id=self.session_id, retransmission=True)
            c["lbtru_retransmissions"] += len(targets)
        else:
            targets = list(self._confirmed)
            out = RU.encode_data(q, self.trail, payload, session_id=self.session_id)
            c["lbtru_datagrams_sent"] += len(targets)
        if targets:
            self._sm_interval, self._sm_at = self.sm_min, now + self.sm_min
        return [(out, a) for a in targets]

    def _advance(self, q: int, now: float, origin_trail: int) -> None:
        """Sequence ``q`` exists at the origin (a DATA or an SM's lead), which
        can retransmit from ``origin_trail`` on. The first time (and after a
        jump past the window, ahead or more than a window behind the trail:
        the origin's u32 wrapped, or it restarted) the window starts as far
        back as the origin can still retransmit, at most ``window``
        sequences: a receiver's NAK for what the router never saw is then
        asked of the origin."""
        if self.lead is None or q > self.lead + self.window or q < self.trail - self.window:
            # the first one, or a jump past the whole window: start over there
            if self.lead is not None:
                self.counters["lbtru_origin_sequence_jump"] += 1
            self.buffer.clear()
            self._bytes(-self.buffer_bytes)
            self.pending.clear()
            self._pending_n = 0
            for a in self._confirmed:  # (only confirmed clients NAK)
                self.clients[a].waiting.clear()
            self._naked_up.clear()
            self.trail = max(0, q - self.window + 1, origin_trail)
            self.lead = q
            if self._sm_at == math.inf:
                self._sm_at = now + self.sm_min
            return
        self.lead = max(self.lead, q)

    def _bytes(self, n: int) -> None:
        """``n`` payload bytes more (or fewer) in the buffer, and in the budget."""
        self.buffer_bytes += n
        if self.budget is not None:
            self.budget.used += n

    def _evict(self) -> None:
        """Keep at most ``window`` sequences and ``window_bytes`` bytes; while
        the proxies sharing :attr:`budget` are over it, at most our fair share,
        and then trim the others above theirs (:meth:`router.core.lbtru_window.WindowBudget.reclaim`)."""
        assert self.lead is not None
        b = self.budget
        while self.buffer and (self.lead - self.trail + 1 > self.window or self.buffer_bytes > self.window_bytes
                               or (b is not None and b.used > b.limit and self.buffer_bytes > b.fair())):
            self.evict_oldest()
        if not self.buffer and self.lead - self.trail + 1 > self.window:
            self.trail = self.lead - self.window + 1
        if b is not None and b.used > b.limit:
            b.reclaim()

    def evict_oldest(self) -> None:
        """Forget the oldest sequence of the window (and step past it)."""
        p = self.buffer.pop(self.trail, None)
        if p is not None:
            self._bytes(-len(p))
        self._unpend(self.trail)
        self._naked_up.pop(self.trail, None)
        self.trail += 1

    def _unpend(self, q: int) -> set[Addr]:
        """Sequence ``q`` is no longer waited for: the clients that were."""
        waiting = self.pending.pop(q, set())
        self._pending_n -= len(waiting)
        for a in waiting:
            cl = self.clients.get(a)
            if cl is not None:
                cl.waiting.discard(q)
        return waiting

    def _forget(self, cl: RuClient) -> None:
        """``cl`` leaves: its entries in :attr:`pending` go (its own only)."""
        self._unconfirmed.pop(cl.addr, None)
        self._confirmed.pop(cl.addr, None)
        self._nakers.pop(cl.addr, None)
        for q in cl.waiting:
            waiting = self.pending.get(q)
            if waiting is not None and cl.addr in waiting:
                waiting.discard(cl.addr)
                self._pending_n -= 1
                if not waiting:
                    del self.pending[q]
        cl.waiting.clear()

    # -------------------------------------------------------------- receivers

    def from_client(self, data: bytes, addr: Addr, now: float) -> Out:
        """A datagram a receiver sent to the proxy's port."""
        c = self.counters
        try:
            m = RU.decode(data)
        except RU.LbtruDecodeError:
            c["lbtru_malformed"] += 1
            return []
        sid = m.header.session_id
        if sid is not None and sid != self.session_id:
            c["lbtru_other_session"] += 1
            return []
        cl = self.clients.get(addr)
        if isinstance(m, RU.Creq):
            return self._connect(cl, addr, now)
        if not isinstance(m, RU.Ack | RU.Nak):
            c["lbtru_unexpected_type"] += 1
            return []
        if cl is None:
            c["lbtru_unknown_client"] += 1
            return [(RU.encode_rst(), addr)]
        if not cl.confirmed:
            cl.confirmed = True
            self._unconfirmed.pop(addr, None)
            c["lbtru_clients_confirmed"] += 1
        self._heard(cl, now)
        if isinstance(m, RU.Ack):
            return []
        dt, cl.tokens_at = max(0.0, now - cl.tokens_at), now
        nakers = self._nakers  # the proxy's retransmissions shared out evenly among them
        nakers[cl.addr] = now
        nakers.move_to_end(cl.addr)
        while now - next(iter(nakers.values())) > NAKER_WINDOW:
            nakers.popitem(last=False)
        n = len(nakers)
        cl.tokens = min(min(float(self.rx_burst), max(1.0, self.rx_total_burst / n)),
                        cl.tokens + dt * min(self.rx_rate, self.rx_total_rate / n))
        cl.nak_tokens = min(float(NAK_BURST), cl.nak_tokens + dt * NAK_RATE)
        if cl.nak_tokens < 1.0:
            c["lbtru_naks_rate_limited"] += 1
            return []
        cl.nak_tokens -= 1.0
        c["lbtru_naks_from_clients"] += 1
        sqns = m.sqns
        if len(sqns) > RU.MAX_NAKS:
            c["lbtru_nak_truncated"] += 1
            sqns = sqns[:RU.MAX_NAKS]
        return self._nak(cl, sqns, now)

    def _heard(self, cl: RuClient, now: float) -> None:
        cl.heard = now
        order = self._confirmed if cl.confirmed else self._unconfirmed
        order[cl.addr] = None
        order.move_to_end(cl.addr)

    def _connect(self, cl: RuClient | None, addr: Addr, now: float) -> Out:
        c = self.counters
        if cl is None:
            if len(self.clients) >= self.max_clients:
                old = next(iter(self._unconfirmed), None)
                if old is None:
                    c["lbtru_clients_full"] += 1
                    return []
                self._forget(self.clients.pop(old))
                c["lbtru_clients_replaced"] += 1
            cl = self.clients[addr] = RuClient(addr, self._next_id, now, now, tokens_at=now,
                                               tokens=float(self.rx_burst))
            self._unconfirmed[addr] = None
            self._next_id = self._next_id % 0xFFFFFFFF + 1
            c["lbtru_clients_connected"] += 1
        else:
            self._heard(cl, now)
            c["lbtru_creq_repeated"] += 1
        # nothing from the origin yet: trail above lead (an empty window)
        lead = self.lead if self.lead is not None else 0
        trail = self.trail if self.lead is not None else 1
        self._sm_sqn += 1
        return [(RU.encode_sm(self._sm_sqn - 1, lead, trail, syn=True, session_id=self.session_id,
                              client_id=cl.client_id), addr)]

    def _nak(self, cl: RuClient, sqns, now: float) -> Out:
        c = self.counters
        out: Out = []
        no_retry, delay, shed = [], [], []
        up = []
        for q in dict.fromkeys(sqns):
            if self.lead is None or q > self.lead:
                c["lbtru_naks_ahead"] += 1
                continue
            if q < self.trail:
                no_retry.append(q)
                continue
            p = self.buffer.get(q)
            if p is not None:
                if cl.tokens < 1.0:
                    shed.append(q)
                    c["lbtru_retransmissions_limited"] += 1
                    continue
                cl.tokens -= 1.0
                out.append((RU.encode_data(q, self.trail, p, session_id=self.session_id, retransmission=True),
                            cl.addr))
                c["lbtru_retransmissions"] += 1
                continue
            waiting = self.pending.setdefault(q, set())
            if cl.addr not in waiting:
                if self._pending_n >= MAX_PENDING:
                    shed.append(q)
                    c["lbtru_pending_full"] += 1
                    if not waiting:
                        del self.pending[q]
                    continue
                waiting.add(cl.addr)
                cl.waiting.add(q)
                self._pending_n += 1
            delay.append(q)
            if now - self._naked_up.get(q, -math.inf) >= self.nak_ignore:
                self._naked_up[q] = now
                up.append(q)
        naks = self.origin.encode_naks(up) if up else []
        self.naks_up += naks
        c["lbtru_naks_up"] += len(naks)
        for reason, qs in ((RU.NCF_NO_RETRY, no_retry), (RU.NCF_RX_DELAY, delay), (RU.NCF_SHED, shed)):
            for i in range(0, len(qs), RU.MAX_NAKS):
                out.append((RU.encode_ncf(self.trail, qs[i:i + RU.MAX_NAKS], reason=reason,
                                          session_id=self.session_id), cl.addr))
                c["lbtru_ncfs_sent"] += 1
        return out

    def take_naks_up(self) -> list[bytes]:
        """The NAKs for the origin collected so far (then forgotten), as
        :attr:`origin` writes them."""
        naks, self.naks_up = self.naks_up, []
        return naks

    # ------------------------------------------------------------------ time

    def tick(self, now: float) -> tuple[Out, float]:
        """Session messages and expiries due at ``now``; and when to call again."""
        c = self.counters
        out: Out = []
        for order, limit in ((self._confirmed, self.client_timeout), (self._unconfirmed, self.connect_timeout)):
            while order:
                cl = self.clients[next(iter(order))]
                if now - cl.heard < limit:
                    break
                del self.clients[cl.addr]
                self._forget(cl)
                c["lbtru_clients_expired"] += 1
                if cl.confirmed:
                    out.append((RU.encode_rst(), cl.addr))
        if self._sm_at <= now and self.lead is not None:
            sm = RU.encode_sm(self._sm_sqn, self.lead, self.trail, session_id=self.session_id)
            targets = list(self._confirmed)
            if targets:
                self._sm_sqn += 1
                c["lbtru_sms_sent"] += len(targets)
                out.extend((sm, a) for a in targets)
            self._sm_interval = min(self._sm_interval * 2, self.sm_max)
            self._sm_at = now + self._sm_interval
        return out, self.next_due()

    def next_due(self) -> float:
        """When :meth:`tick` has something to do next (seconds; inf: nothing)."""
        nxt = self._sm_at if self.lead is not None else math.inf
        for order, limit in ((self._confirmed, self.client_timeout), (self._unconfirmed, self.connect_timeout)):
            if order:
                nxt = min(nxt, self.clients[next(iter(order))].heard + limit)
        return nxt

    def reset(self) -> Out:
        """The origin ended the session: an RST to every confirmed client, and
        the window, the clients and the sequences forgotten (the proxy may
        serve a next session of the origin)."""
        out = [(RU.encode_rst(), a) for a in self._confirmed]
        self.buffer.clear()
        self._bytes(-self.buffer_bytes)
        self.clients.clear()
        self._unconfirmed.clear()
        self._confirmed.clear()
        self._nakers.clear()
        self.pending.clear()
        self._pending_n = 0
        self._naked_up.clear()
        self.lead, self.trail = None, 0
        self._sm_at = math.inf
        return out

    def close(self) -> Out:
        """The proxy ends: an RST to every confirmed client (and its window
        given back to the budget)."""
        out = self.reset()
        if self.budget is not None and self in self.budget.members:
            self.budget.members.remove(self)
        return out
