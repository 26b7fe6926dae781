"""The proxy receiver of one LBT-RU origin session at the far router, sans-IO.

Per origin session (address, port, session id) the router is ONE LBT-RU
receiver of the origin, whatever the number of links and receivers behind
them (:mod:`router.relays.lbtru_fanout` runs it on one UDP socket and passes what it
takes to every link stream of the session; the near router's proxy source,
:class:`router.core.lbtru_fanout.RuFanout`, re-publishes it). It speaks
UM's LBT-RU (:mod:`lbmr_proto.lbtru`) to the origin:

* **connecting**: a CREQ every ``connect_interval`` seconds (UM's
  transport_lbtru_connect_interval) until a session message with SYN
  answers, at most ``connect_attempts`` (transport_lbtru_maximum_connect_attempts;
  then the session ends, :attr:`EndReason.NO_ANSWER`). The SYN's client id
  goes on every ACK and NAK after it, and an ACK answers it at once (an
  origin confirms a client by its first ACK or NAK);
* **data**: the origin's DATA and SM datagrams go to the links as they came
  (:attr:`UpstreamOut.to_links`), retransmissions included, but for the
  payload of a DATA, which passes the message path (``path``,
  :class:`router.core.message_path.MessagePath`): a payload it rewrote goes
  in a DATA of the same sequences, flags and options; its NCFs are its
  answer to us and go no further. A gap in the sequences (a DATA past the
  next one expected) is NAKed at once, at most :data:`MAX_GAP` sequences of
  it (the newest): the links then get the origin's retransmissions;
* **NAKs from the links**: a near proxy NAKs what it never got
  (:meth:`RuUpstream.from_link`, an LBT-RU NAK); each sequence is asked of
  the origin at most once per ``nak_ignore`` seconds, whichever links ask,
  and only sequences the origin has sent (below the next expected, at most
  :data:`MAX_NAKED` behind it; others are counted and dropped);
* **keepalive**: an ACK of the newest sequence every ``ack_interval``
  seconds, so that the origin keeps us (its client activity timeout);
* **end**: an RST from the origin (:attr:`EndReason.RESET`), nothing from it
  for ``activity_timeout`` seconds (UM's transport_lbtru_activity_timeout,
  60 s; :attr:`EndReason.SILENT`), or the shell's report that datagrams to
  it are refused (:meth:`RuUpstream.unreachable`).

Hostile input: a datagram from another address or port than the origin's,
or with another session id than the session's (the TIR's, or the SYN's when
the TIR named none), over ``max_datagram`` bytes, not LBT-RU, or of a type an
origin does not send, is counted once and dropped. Memory: the NAK
bookkeeping holds at most :data:`MAX_NAKED` sequences. Times are seconds on
the caller's clock; sequence numbers are u32 as on the wire.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from enum import Enum

from lbmr_proto import lbtru as RU

from .message_path import MessagePath

__all__ = ["RuUpstream", "UpstreamOut", "UpstreamState", "EndReason", "CONNECT_INTERVAL",
           "CONNECT_ATTEMPTS", "ACK_INTERVAL", "ACTIVITY_TIMEOUT", "NAK_IGNORE", "MAX_GAP", "MAX_NAKED",
           "MAX_DATAGRAM"]

CONNECT_INTERVAL = 0.1  # seconds between CREQs (UM's transport_lbtru_connect_interval)
CONNECT_ATTEMPTS = 50  # CREQs before giving up (UM's transport_lbtru_maximum_connect_attempts)
ACK_INTERVAL = 0.5  # seconds between keepalive ACKs
ACTIVITY_TIMEOUT = 60.0  # seconds of silence that end the session (UM's transport_lbtru_activity_timeout)
NAK_IGNORE = 0.2  # seconds between two NAKs of one sequence to the origin
MAX_GAP = RU.MAX_NAKS  # sequences of one gap NAKed at once (the newest)
MAX_NAKED = 65536  # sequences remembered as NAKed (the oldest are forgotten)
MAX_DATAGRAM = 65507  # bytes: the largest UDP payload over IPv4

Addr = tuple[str, int]


class UpstreamState(Enum):
    CONNECTING = "connecting"
    CONNECTED = "connected"
    ENDED = "ended"


class EndReason(Enum):
    RESET = "the origin reset the session"
    SILENT = "nothing from the origin for the activity timeout"
    NO_ANSWER = "the origin did not answer the connection requests"
    UNREACHABLE = "datagrams to the origin are refused"


@dataclass(slots=True)
class UpstreamOut:
    """What one input produced: datagrams for the origin and for every link stream."""

    to_origin: list[bytes] = field(default_factory=list)
    to_links: list[bytes] = field(default_factory=list)


class RuUpstream:
    """The LBT-RU receiver of the origin at ``origin`` (ip, port) for session
    ``session_id`` (None: the one its SYN names); ``path``: the message path
    of the DATA payloads (None: none). See the module doc."""

    def __init__(self, origin: Addr, session_id: int | None, counters: Counter[str] | None = None, *,
                 path: MessagePath | None = None,
                 connect_interval: float = CONNECT_INTERVAL, connect_attempts: int = CONNECT_ATTEMPTS,
                 ack_interval: float = ACK_INTERVAL, activity_timeout: float = ACTIVITY_TIMEOUT,
                 nak_ignore: float = NAK_IGNORE, max_datagram: int = MAX_DATAGRAM) -> None:
        if not (connect_interval > 0 and connect_attempts >= 1 and ack_interval > 0 and activity_timeout > 0
                and nak_ignore >= 0 and max_datagram > 0):
            raise ValueError("LBT-RU upstream: intervals, attempts and bounds must be positive")
        self.origin = (origin[0], origin[1])
        self.session_id = session_id
        self.path = path
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self.connect_interval, self.connect_attempts = connect_interval, connect_attempts
        self.ack_interval, self.activity_timeout = ack_interval, activity_timeout
        self.nak_ignore, self.max_datagram = nak_ignore, max_datagram
        self.state = UpstreamState.CONNECTING
        self.ended: EndReason | None = None
        self.client_id: int | None = None
        self.creqs = 0
        self.next_sqn: int | None = None  # the DATA sequence expected next
        self.heard = 0.0  # when the origin was last heard from
        self._creq_at = 0.0
        self._ack_at = math.inf
        self._naked: OrderedDict[int, float] = OrderedDict()  # sequence -> when NAKed, oldest first

    # --------------------------------------------------------------- origin

    def from_origin(self, data: bytes, src: Addr, now: float) -> UpstreamOut:
        """A datagram that arrived from ``src`` on the upstream socket."""
        out = UpstreamOut()
        m = self._check(data, src)
        if m is None or self.state is UpstreamState.ENDED:
            return out
        c = self.counters
        if isinstance(m, RU.Rst):
            self._end(EndReason.RESET)
            return out
        if self.state is UpstreamState.CONNECTING:
            if isinstance(m, RU.SessionMessage) and m.syn:
                self._connected(m, now, out)
            else:
                c["lbtru_upstream_before_connect"] += 1
            return out
        self.heard = now
        if isinstance(m, RU.Data):
            self._data(m, now, out)
            out.to_links.append(bytes(data) if self.path is None else self._relayed(m, data, now))
        elif isinstance(m, RU.SessionMessage):
            out.to_links.append(bytes(data))
        elif isinstance(m, RU.Ncf):
            c["lbtru_upstream_ncfs"] += 1
        else:
            c["lbtru_upstream_unexpected_type"] += 1
        return out

    def _check(self, data: bytes, src: Addr):
        """The decoded datagram, or None (counted) when it is not the origin's."""
        c = self.counters
        if (src[0], src[1]) != self.origin:
            c["lbtru_upstream_foreign"] += 1
            return None
        if len(data) > self.max_datagram:
            c["lbtru_upstream_oversize"] += 1
            return None
        try:
            m = RU.decode(data)
        except RU.LbtruDecodeError:
            c["lbtru_upstream_malformed"] += 1
            return None
        sid = m.header.session_id
        if sid is not None and self.session_id is not None and sid != self.session_id:
            c["lbtru_upstream_other_session"] += 1
            return None
        return m

    def _relayed(self, m: RU.Data, data: bytes, now: float) -> bytes:
        """The DATA ``m`` (``data`` on the wire) after the message path (at ``now``)."""
        payload = self.path.payload(m.payload, now)
        if payload is m.payload:
            return bytes(data)
        return RU.encode_data(m.sqn, m.trail_sqn, payload, session_id=m.header.session_id,
                              client_id=m.header.client_id, retransmission=m.retransmission)

    def _connected(self, m: RU.SessionMessage, now: float, out: UpstreamOut) -> None:
        self.state = UpstreamState.CONNECTED
        self.counters["lbtru_upstream_connected"] += 1
        if self.session_id is None:
            self.session_id = m.header.session_id
        self.client_id = m.header.client_id
        self.heard = now
        out.to_links.append(RU.encode_sm(m.sm_sqn, m.lead_sqn, m.trail_sqn, session_id=self.session_id))
        out.to_origin.append(self._ack())
        self._ack_at = now + self.ack_interval

    def _data(self, m: RU.Data, now: float, out: UpstreamOut) -> None:
        """Note a DATA's sequence; NAK the gap before it, if any."""
        q = m.sqn
        if m.retransmission:
            self.counters["lbtru_upstream_retransmissions"] += 1
            return
        nxt = self.next_sqn
        if nxt is not None and nxt < q <= nxt + MAX_NAKED:
            self.counters["lbtru_upstream_gaps"] += 1
            out.to_origin += self._naks(list(range(max(nxt, q - MAX_GAP), q)), now)
        if nxt is None or q >= nxt or q < nxt - MAX_NAKED:  # (far behind: the origin restarted or wrapped)
            self.next_sqn = (q + 1) & 0xFFFFFFFF

    def unreachable(self) -> None:
        """Datagrams to the origin are refused (ICMP port unreachable): it is gone."""
        self._end(EndReason.UNREACHABLE)

    def _end(self, reason: EndReason) -> None:
        if self.state is not UpstreamState.ENDED:
            self.state, self.ended = UpstreamState.ENDED, reason
            self.counters["lbtru_upstream_ended"] += 1

    # ---------------------------------------------------------------- links

    def from_link(self, data: bytes, now: float) -> list[bytes]:
        """A datagram from a near proxy on a link stream of the session (its
        NAK of what it never got): the NAKs for the origin."""
        c = self.counters
        try:
            m = RU.decode(data)
        except RU.LbtruDecodeError:
            c["lbtru_upstream_link_malformed"] += 1
            return []
        if not isinstance(m, RU.Nak):
            c["lbtru_upstream_link_not_nak"] += 1
            return []
        if self.state is not UpstreamState.CONNECTED or self.next_sqn is None:
            return []
        c["lbtru_upstream_link_naks"] += 1
        top = self.next_sqn
        sqns = [q for q in m.sqns[:RU.MAX_NAKS] if top - MAX_NAKED <= q < top]
        if len(sqns) < min(len(m.sqns), RU.MAX_NAKS):
            c["lbtru_upstream_link_naks_out_of_range"] += 1  # not sent yet, or long gone
        return self._naks(sqns, now)

    def _naks(self, sqns: list[int], now: float) -> list[bytes]:
        """NAKs of those of ``sqns`` not asked of the origin within ``nak_ignore``."""
        naked = self._naked
        fresh = []
        for q in dict.fromkeys(sqns):
            if now - naked.get(q, -math.inf) < self.nak_ignore:
                continue
            naked[q] = now
            naked.move_to_end(q)
            fresh.append(q)
        while len(naked) > MAX_NAKED:
            naked.popitem(last=False)
        if not fresh:
            return []
        self.counters["lbtru_upstream_naks"] += 1
        return [RU.encode_nak(fresh[i:i + RU.MAX_NAKS], session_id=self.session_id, client_id=self.client_id)
                for i in range(0, len(fresh), RU.MAX_NAKS)]

    def _ack(self) -> bytes:
        last = (self.next_sqn - 1) & 0xFFFFFFFF if self.next_sqn is not None else 0
        return RU.encode_ack(last, session_id=self.session_id, client_id=self.client_id)

    # ----------------------------------------------------------------- time

    def tick(self, now: float) -> tuple[list[bytes], float]:
        """CREQs, keepalive ACKs and the activity timeout due at ``now``: the
        datagrams for the origin, and when to call again (inf: ended)."""
        out: list[bytes] = []
        if self.state is UpstreamState.CONNECTING and now >= self._creq_at:
            if self.creqs >= self.connect_attempts:
                self._end(EndReason.NO_ANSWER)
            else:
                self.creqs += 1
                self._creq_at = now + self.connect_interval
                out.append(RU.encode_creq(session_id=self.session_id))
        elif self.state is UpstreamState.CONNECTED:
            if now - self.heard >= self.activity_timeout:
                self._end(EndReason.SILENT)
            elif now >= self._ack_at:
                self._ack_at = now + self.ack_interval
                out.append(self._ack())
        return out, self.next_due()

    def next_due(self) -> float:
        if self.state is UpstreamState.CONNECTING:
            return self._creq_at
        if self.state is UpstreamState.CONNECTED:
            return min(self._ack_at, self.heard + self.activity_timeout)
        return math.inf
