"""The datagrams a portal sends, and its outgoing buffer (:class:`TROutbox`).

Every TR datagram is a version-1 LBMR packet (:mod:`lbmr_proto`) with the
portal's packet-options trailer (:func:`lbmr_proto.um.um_options`: its source
id, source type TNWGD, UM's version and its domain id) and at most
``max_datagram`` bytes: NORMAL (TQRs then TIRs) and WC_TQR datagrams of the
records due together (:func:`lbmr_proto.um.pack_records`), TOPIC_MGMT
datagrams of use queries, the TR request (extended type 0x04) of the start,
and remote domain route records (extended type 0x06, one a datagram, as many
domain ids as fit). Keepalives are UM's 4-byte ones (:class:`lbmr_proto.um.Targets`), no
trailer. Byte counts are UDP payload bytes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from lbmr_proto import TMR, Packet, RemoteDomainRoute, TopicMgmtBlock, TopicResRequest
from lbmr_proto.constants import (
    TMR_FLAG_WILDCARD_PCRE,
    TMR_FLAG_WILDCARD_REGEX,
    TMR_TOPIC_USE,
    TRREQ_QUERY,
    TRREQ_WILDCARD_QUERY,
    PacketType,
    SourceType,
)
from lbmr_proto.popts import encode_packet_options
from lbmr_proto.um import Targets, pack_records, um_options

from .events import PATTERN_PCRE, PATTERN_TOPIC, Addr, Outgoing
from .pacing import RatePacer
from .settings import PortalTRSettings

__all__ = ["DueRecords", "TROutbox", "use_query_record", "TMB_HEADER", "ROUTE_HEADER"]

TMB_HEADER = 8  # a TOPIC_MGMT datagram: packet header (4), TMB header (4), records, trailer
#: a remote domain route datagram: its 16-byte header, 4 bytes per domain id, trailer
ROUTE_HEADER = 16


@dataclass(slots=True)
class DueRecords:
    """Encoded records that fell due together, sent in as few datagrams as fit:
    TQRs, wildcard TQRs and TIRs; and the domain ids whose route records fell
    due (``routes``)."""

    tqrs: list[bytes] = field(default_factory=list)
    wcs: list[bytes] = field(default_factory=list)
    tirs: list[bytes] = field(default_factory=list)
    routes: list[int] = field(default_factory=list)


def use_query_record(topic: str, pattern_type: int) -> TMR:
    """The use query ("topic use" TMR) of local interest ``(pattern_type, topic)``."""
    flags = (0 if pattern_type == PATTERN_TOPIC
             else TMR_FLAG_WILDCARD_PCRE if pattern_type == PATTERN_PCRE else TMR_FLAG_WILDCARD_REGEX)
    return TMR(topic, TMR_TOPIC_USE, flags)


class TROutbox:
    """One portal's outgoing datagrams, in order (the one outgoing buffer of
    :mod:`router.core.tr`), with where they go (:attr:`targets`: the group or
    the current lbmrd, and the keepalives) and the counters of what was sent
    (``stats``, the portal's counters)."""

    __slots__ = ("options", "trailer", "max_datagram", "targets", "_st", "_out", "_use_queries",
                 "_tr_request")

    def __init__(self, settings: PortalTRSettings, now: float, stats: Counter[str]) -> None:
        self.options = um_options(settings.src_id, SourceType.TNWGD, settings.domain_id)
        self.trailer = encode_packet_options(self.options)
        self.max_datagram = settings.max_datagram
        timing = settings.timing
        # first keepalives at creation
        self.targets = Targets(settings.daemons, settings.multicast, timing, now,
                               last_tx=now - timing.keepalive_interval)
        self._st = stats
        self._out: list[Outgoing] = []
        # use queries due (the TMR, its encoded size, and the pacer that pays the
        # headers of the datagram it opens: None = paid already), sent by send_use_queries
        self._use_queries: list[tuple[TMR, int, RatePacer | None]] = []
        # TR request: queries and wildcard queries
        self._tr_request = Packet(PacketType.EXT, 1, ext=TopicResRequest(TRREQ_QUERY | TRREQ_WILDCARD_QUERY),
                                  options=self.options).encode()

    def __len__(self) -> int:
        return len(self._out)

    def drain(self) -> list[Outgoing]:
        """Everything queued for sending, in order; empties the buffer."""
        out, self._out = self._out, []
        return out

    @property
    def use_query_overhead(self) -> int:
        """Bytes of a TOPIC_MGMT datagram besides its records (headers and trailer)."""
        return TMB_HEADER + len(self.trailer)

    def _append(self, data: bytes, dest) -> None:
        self._out.append(Outgoing(data, dest))
        self._st["datagrams_sent"] += 1
        self._st["bytes_sent"] += len(data)

    def send_records(self, records: DueRecords, now: float, kind: str) -> None:
        """Datagrams of ``records`` (NORMAL, then WC_TQR), counted as ``kind``."""
        if not (records.tqrs or records.wcs or records.tirs):
            return
        dest = self.targets.send_tr(now)
        pack = dict(trailer=self.trailer, max_datagram=self.max_datagram)
        for data in (pack_records(records.tqrs, records.tirs, **pack)
                     + pack_records(records.wcs, [], ptype=PacketType.WC_TQR, **pack)):
            self._append(data, dest)
            self._st[f"{kind}_datagrams_sent"] += 1

    def queue_use_query(self, tmr: TMR, size: int, pacer: RatePacer | None) -> None:
        """A use query of ``size`` encoded bytes, sent by the next
        :meth:`send_use_queries`; ``pacer`` (if any) pays the headers of the
        datagram it opens."""
        self._use_queries.append((tmr, size, pacer))

    def send_use_queries(self, now: float) -> None:
        """The use queries queued, batched: TOPIC_MGMT datagrams of at most ``max_datagram``."""
        queued, self._use_queries = self._use_queries, []
        if not queued:
            return
        dest = self.targets.send_tr(now)
        room = self.max_datagram - TMB_HEADER - len(self.trailer)
        batch: list[TMR] = []
        size = 0
        opener = None  # the pacer of a datagram's first record pays its headers
        for i, (tmr, n, pacer) in enumerate(queued + [(None, 0, None)]):
            if batch and (i == len(queued) or size + n > room):
                data = Packet(PacketType.TOPIC_MGMT, 1, tmb=TopicMgmtBlock(batch), options=self.options).encode()
                self._append(data, dest)
                if opener is not None:
                    opener.charge(now, len(data) - size)
                self._st["use_query_datagrams_sent"] += 1
                batch, size = [], 0
            if not batch:
                opener = pacer
            batch.append(tmr)
            size += n

    def send_tr_request(self, now: float) -> None:
        """One TR request (queries and wildcard queries)."""
        self._append(self._tr_request, self.targets.send_tr(now))
        self._st["tr_requests_sent"] += 1

    def route_overhead(self) -> int:
        """Bytes of a remote domain route datagram besides its domain ids."""
        return ROUTE_HEADER + len(self.trailer)

    def send_domain_routes(self, domains: list[int], address: Addr, now: float) -> int:
        """Remote domain route datagrams: ``domains`` reachable through
        ``address`` (ip, port), in order, as many a datagram as ``max_datagram``
        holds. Returns the number of datagrams."""
        if not domains:
            return 0
        dest = self.targets.send_tr(now)
        per = min(0xFFFF, (self.max_datagram - self.route_overhead()) // 4)
        ip, port = address
        n = 0
        for i in range(0, len(domains), per):
            rec = RemoteDomainRoute(domains[i:i + per], ip, port)
            self._append(Packet(PacketType.EXT, 1, ext=rec, options=self.options).encode(), dest)
            self._st["route_datagrams_sent"] += 1
            n += 1
        return n

    def send_keepalives(self, now: float) -> None:
        """The keepalives due at ``now`` (lbmrd mode)."""
        for ka, dest in self.targets.keepalives(now):
            self._append(ka, dest)
            self._st["keepalives_sent"] += 1
