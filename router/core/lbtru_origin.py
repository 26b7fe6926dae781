"""The origin of an LBT-RU proxy, sans-IO: how the proxy
(:class:`router.core.lbtru_fanout.RuFanout`) reads the origin session's
datagrams that come from the peer, as the origin sent them, and writes its
NAKs towards it.

:class:`LbtrmInput`: an LBT-RM origin (LBT-RM DATA and SM; NAKs up are LBT-RM
NAKs), the proxy of an LBT-RM origin in a TRD without multicast (the
endpoint's ``<lbt-rm transport="lbt-ru"/>``, :mod:`router.relays.lbtrm`);
:class:`LbtruInput`: an LBT-RU origin (LBT-RU DATA and SM, as the far router's
upstream receiver passes them on; NAKs up are LBT-RU NAKs), the fan-out of
:mod:`router.relays.lbtru_fanout`. Either gives the same three things: a
sequence, its payload and whether it is a retransmission (:class:`OriginData`),
or the origin's lead and trail (:class:`OriginLead`). Sequences are the
origin's (u32).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from lbmr_proto import lbtrm as RM
from lbmr_proto import lbtru as RU

__all__ = ["OriginData", "OriginLead", "LbtrmInput", "LbtruInput"]


@dataclass(frozen=True, slots=True)
class OriginData:
    """A DATA datagram of the origin: sequence ``sqn``, the origin's trail
    sequence ``trail``, ``payload`` and whether it is a ``retransmission``."""

    sqn: int
    trail: int
    payload: bytes
    retransmission: bool


@dataclass(frozen=True, slots=True)
class OriginLead:
    """A session message of the origin: its ``lead`` and ``trail`` sequences."""

    lead: int
    trail: int


class LbtrmInput:
    """An LBT-RM origin: its DATA and SM datagrams; NAKs up are LBT-RM NAKs
    whose header carries ``nak_port`` and ``nak_session`` (the far router
    rewrites them for the origin)."""

    def __init__(self, nak_port: int = 0, nak_session: int = 0) -> None:
        self.nak_port, self.nak_session = nak_port, nak_session & 0xFFFFFFFF

    @staticmethod
    def decode(data: bytes, counters: Counter[str]) -> OriginData | OriginLead | None:
        """What the datagram says, or None (counted) if it is not for the proxy."""
        try:
            m = RM.decode(data)
        except RM.LbtrmDecodeError:
            counters["lbtru_rm_malformed"] += 1
            return None
        if isinstance(m, RM.SessionMessage):
            return OriginLead(m.lead_sqn, m.trail_sqn)
        if not isinstance(m, RM.Data):
            counters["lbtru_rm_not_data"] += 1  # the origin's NCFs, or a NAK that has no business here
            return None
        if m.header.next_hdr:
            counters["lbtru_rm_options_dropped"] += 1
            return None
        return OriginData(m.sqn, m.trail_sqn, m.payload, m.retransmission)

    def encode_naks(self, sqns: list[int]) -> list[bytes]:
        """LBT-RM NAKs of ``sqns`` (as many as they need)."""
        return [RM.encode_nak(self.nak_port, self.nak_session, sqns[i:i + RM.MAX_NAKS])
                for i in range(0, len(sqns), RM.MAX_NAKS)]


class LbtruInput:
    """An LBT-RU origin, through the far router's upstream receiver
    (:mod:`router.core.lbtru_upstream`): its DATA and SM datagrams as it
    sent them; NAKs up are LBT-RU NAKs without options (the upstream
    receiver asks the origin under its own client and session ids)."""

    @staticmethod
    def decode(data: bytes, counters: Counter[str]) -> OriginData | OriginLead | None:
        """What the datagram says, or None (counted) if it is not for the proxy."""
        try:
            m = RU.decode(data)
        except RU.LbtruDecodeError:
            counters["lbtru_session_malformed"] += 1
            return None
        if isinstance(m, RU.SessionMessage):
            return OriginLead(m.lead_sqn, m.trail_sqn)
        if not isinstance(m, RU.Data):
            counters["lbtru_session_not_data"] += 1
            return None
        return OriginData(m.sqn, m.trail_sqn, m.payload, m.retransmission)

    @staticmethod
    def encode_naks(sqns: list[int]) -> list[bytes]:
        """LBT-RU NAKs of ``sqns`` (as many as they need)."""
        return [RU.encode_nak(sqns[i:i + RU.MAX_NAKS]) for i in range(0, len(sqns), RU.MAX_NAKS)]
