"""A receiver of UM's own LBT-RU wire protocol (:mod:`lbmr_proto.lbtru`), for
LBT-RU sources that speak it: an lbmr-router's LBT-RU proxy of an LBT-RM
source (``<lbt-rm transport="lbt-ru"/>``), or a UM LBT-RU source sending
the numbered pattern. (The simulator's own LBT-RU sources speak the same
protocol but send a live session of LBMC messages, :mod:`.rulive`;
``lbmr-sim --lbtru-wire um`` picks this receiver instead.)

It connects, receives, verifies and recovers like :class:`.rm.RmDataReceiver`
(the payload of sequence ``q`` is the pattern at ``q * 65536``, as an
LBT-RM source of the simulator sends it), over one unicast socket:

* a CREQ (SYN, with the advertised session id) to the source's (ip, port)
  every ``connect_interval`` (UM's transport_lbtru_connect_interval, 0.1 s)
  until a session message with SYN answers, at most ``connect_attempts``
  times; the SYN's client id goes on every later ACK and NAK;
* an ACK (the highest sequence received in order) at once, then every
  ``ack_interval`` (UM's transport_lbtru_acknowledgement_interval, 0.5 s);
* gaps (a higher DATA or an SM's lead) are NAKed after ``nak_backoff``,
  then every ``nak_interval`` (an NCF postpones, an NCF "do not retry" gives
  the sequences up), at most ``nak_attempts`` times; ``drop_every`` n > 0
  discards the first copy of every n-th sequence on purpose;
* an RST makes it connect again (counted in ``resets``).
"""

from __future__ import annotations

import math
import socket
from dataclasses import dataclass

import trio

from lbmr_proto import lbtru as RU

from .pattern import pattern
from .rm import RmDataReceiver, RmReceiveResult

__all__ = ["UmRuDataReceiver", "UmRuReceiveResult"]


@dataclass
class UmRuReceiveResult(RmReceiveResult):
    """What a :class:`UmRuDataReceiver` saw (the fields of
    :class:`.rm.RmReceiveResult`, plus its connection)."""

    client_id: int | None = None
    creqs_sent: int = 0
    acks_sent: int = 0
    resets: int = 0
    given_up: int = 0  # sequences the source said it cannot retransmit


class UmRuDataReceiver(RmDataReceiver):
    """A UM LBT-RU receiver (module doc) of the source at (``source_ip``,
    ``port``) with ``session_id``, its socket bound at ``bind_ip``."""

    def __init__(self, source_ip: str, port: int, session_id: int | None, *, bind_ip: str,
                 connect_interval: float = 0.1, connect_attempts: int = 600, ack_interval: float = 0.5,
                 **kw) -> None:
        if not (connect_interval > 0 and connect_attempts >= 1 and ack_interval > 0):
            raise ValueError("connect and ACK intervals and attempts must be positive")
        super().__init__(source_ip, port, session_id or 0, "0.0.0.0", 0, iface_ip=bind_ip, **kw)
        self.sid = session_id
        self.connect_interval, self.connect_attempts = connect_interval, connect_attempts
        self.ack_interval = ack_interval
        r = self.result
        self.result = UmRuReceiveResult(f"LBTRU {source_ip}:{port} session {session_id or 0:#010x} (UM wire)",
                                        r.expect_count)
        self._client_id: int | None = None

    async def _open(self) -> list:
        uc = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            uc.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcv_buf)
            await uc.bind((self.iface_ip, 0))
        except BaseException:
            uc.close()
            raise
        return [uc]

    async def _send(self, uc, data: bytes) -> bool:
        try:
            await uc.sendto(data, self.source)
        except OSError:
            return False
        return True

    MAX_NAKS = RU.MAX_NAKS

    def _nak_datagram(self, sqns: list[int]) -> bytes:
        return RU.encode_nak(sqns, session_id=self.sid, client_id=self._client_id)

    def _in_order(self) -> int:
        """The highest sequence below which everything was received (for ACKs)."""
        q = 0
        while q < self.expect_count and self._seen[q]:
            q += 1
        return q - 1 if q else 0

    async def _loop(self, uc) -> None:
        r = self.result
        pat = pattern(self.seed)
        connected = False
        now = trio.current_time()
        creq_at, ack_at, nak_at = now, math.inf, math.inf
        attempts = 0
        last_rx = now
        while r.received < self.expect_count:
            if connected and self._known >= self.expect_count and not self._missing:
                return  # the rest is unrecoverable: nothing left to wait for
            now = trio.current_time()
            if connected and now - last_rx >= self.idle_timeout:
                r.error = (f"stalled: nothing from the source for {self.idle_timeout:g} s after "
                           f"{r.received} datagrams")
                return
            if not connected and creq_at <= now:
                if attempts >= self.connect_attempts:
                    r.error = f"no answer to {attempts} connection requests"
                    return
                attempts += 1
                if await self._send(uc, RU.encode_creq(session_id=self.sid)):
                    r.creqs_sent += 1
                creq_at = now + self.connect_interval
                continue
            if connected and ack_at <= now:
                if await self._send(uc, RU.encode_ack(self._in_order(), session_id=self.sid,
                                                      client_id=self._client_id)):
                    r.acks_sent += 1
                ack_at = now + self.ack_interval
                continue
            if connected and nak_at <= now:
                nak_at = await self._send_naks(uc, now)
                continue
            wake = min(nak_at, ack_at, last_rx + self.idle_timeout) if connected else creq_at
            with trio.move_on_at(wake):
                try:
                    data, src = await uc.recvfrom(65536)
                except OSError:
                    await trio.sleep(0.001)
                    continue
                now = trio.current_time()
                if src[:2] != self.source:
                    r.foreign += 1
                    continue
                try:
                    msg = RU.decode(data)
                except RU.LbtruDecodeError:
                    r.foreign += 1
                    continue
                sid = msg.header.session_id
                if self.sid is not None and sid is not None and sid != self.sid:
                    r.foreign += 1
                    continue
                if isinstance(msg, RU.Rst):
                    r.resets += 1
                    connected, creq_at, attempts = False, now, 0
                    continue
                if isinstance(msg, RU.SessionMessage) and msg.syn:
                    if msg.header.client_id is not None:
                        self._client_id = r.client_id = msg.header.client_id
                    if not connected:
                        connected, ack_at = True, now  # acknowledge at once
                if not connected:
                    r.foreign += 1
                    continue
                last_rx = now
                if isinstance(msg, RU.SessionMessage):
                    r.sms += 1
                    if msg.lead_sqn >= msg.trail_sqn:  # trail above lead: nothing sent yet
                        nak_at = min(nak_at, self._gap_to(msg.lead_sqn + 1, now))
                elif isinstance(msg, RU.Ncf):
                    r.ncfs += 1
                    if msg.reason != RU.NCF_NO_RETRY:
                        self._ncf(msg.sqns, now)
                        continue
                    for q in msg.sqns:
                        if self._missing.pop(q, None) is not None:
                            r.given_up += 1
                            r.unrecoverable += 1
                            r.error = r.error or f"sequence {q}: the source cannot retransmit it"
                elif isinstance(msg, RU.Data):
                    nak_at = min(nak_at, self._data(msg.sqn, msg.payload, now, pat))
                else:
                    r.foreign += 1
