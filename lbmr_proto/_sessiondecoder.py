"""The transport-session decoder: capture items in, records out, per-session
state kept. LBMR is learned here, UDP is classified and LBT-RM and LBT-RU
decoded here; LBT-TCP is :mod:`lbmr_proto._lbttcp`'s, the LBMC messages
:mod:`lbmr_proto._sessionlbmc`'s. Private to lbmr_proto; the public face and
the calling contract are :mod:`lbmr_proto.transport_sessions`."""

from __future__ import annotations

import struct

from . import lbtrm as RM
from . import lbtru as RU
from ._capfile import UdpDatagram
from ._ippackets import IcmpError, TcpSegment
from ._lbttcp import LbtTcpDecoder
from ._sessionlbmc import lbmc_spans, message_records
from ._sessionrecords import (
    LBTRM,
    LBTRU,
    LBTTCP,
    MAX_RECEIVERS,
    MAX_SESSIONS,
    MAX_SQNS,
    MAX_TCP_FLOWS,
    MAX_TOPICS,
    TransportRecord,
    session_key,
    transport_record,
)
from ._sessionstate import SessionsState, SessionState
from .constants import LBMR_MC_PORT, LBMRD_PORT
from .errors import LBMRDecodeError
from .packet import decode as decode_lbmr

_RU_NAMES = RU.TYPE_NAMES
_RM_NAMES = RM.TYPE_NAMES
_RM_DATA = struct.Struct("!BBHIIIB").unpack_from  # LBT-RM header + DATA's sqn, trail_sqn, flags_fec


def _advertise(st: SessionsState, s: SessionState | None, tidx: int, topic: str, ctx: str) -> bool:
    """A TIR (topic index ``tidx``, from context ``ctx``) advertises ``s``;
    False when ``s`` knew all of it already (or is None)."""
    if s is None:
        return False
    new = not s.from_tir
    s.from_tir = True
    if tidx not in s.topics:
        if len(s.topics) < MAX_TOPICS:
            s.topics[tidx] = topic
            new = True
        else:
            st.overflow["topics"] += 1
    if ctx not in s.source_contexts and len(s.source_contexts) < MAX_RECEIVERS:
        s.source_contexts.add(ctx)
        new = True
    return new


def _multicast(ip: str) -> bool:
    head = ip.split(".", 1)[0]
    return head.isdigit() and 224 <= int(head) <= 239


class TransportDecoder:
    """Capture items in, transport records out; per-session state in
    :attr:`state` (see the module doc). ``lbmr_ports``: UDP ports carrying
    LBMR, never classified as transport traffic; ``max_tcp_flows``: TCP
    connection directions followed at once (LBT-TCP ones, and new ones until
    their first bytes; beyond, the oldest is dropped)."""

    def __init__(self, *, lbmr_ports=frozenset({LBMR_MC_PORT, LBMRD_PORT}),
                 max_tcp_flows: int = MAX_TCP_FLOWS) -> None:
        self.state = SessionsState()
        self.lbmr_ports = frozenset(lbmr_ports)
        self._rm_groups: dict[tuple[str, int], set[str]] = {}  # (group, dport) -> session keys
        self._rm_naks: set[tuple[str, int]] = set()  # (source ip, NAK port)
        self._ru: dict[tuple[str, int], set[int]] = {}  # (source ip, port) -> session ids
        self._tcp = LbtTcpDecoder(self.state, max_flows=max_tcp_flows)
        self._rm_sources: dict[tuple[str, int, int], SessionState] = {}  # (src, NAK port, id): a cache

    @property
    def tcp_directions(self) -> int:
        """TCP connection directions followed now (at most ``max_tcp_flows``)."""
        return len(self._tcp.flows)

    # ---- topic resolution

    def lbmr(self, d: UdpDatagram, pkt) -> None:
        """Learn a decoded LBMR packet's TIRs (sessions, topics, source context)
        and TQRs (which contexts want which topics); ``d`` carried it."""
        ctx = f"{d.src}:{d.sport}"
        st = self.state
        for t in pkt.tirs:
            tr = t.transport
            name = getattr(tr, "NAME", "")
            if name == "LBTRM":
                s = st.session(LBTRM, tr.ip, tr.src_ucast_port, tr.session_id)
                if s is None:
                    continue
                s.group, s.dport = tr.mcast_group, tr.dest_port
                self._rm_groups.setdefault((tr.mcast_group, tr.dest_port), set()).add(s.key)
                self._rm_naks.add((tr.ip, tr.src_ucast_port))
            elif name == "LBTRU" and not hasattr(tr, "session_id"):
                s = st.session(LBTRU, tr.ip, tr.port, 0)
                if s is None:
                    continue
                s.unnamed = True
                ids = self._ru.setdefault((tr.ip, tr.port), set())
                if _advertise(st, s, t.index, t.topic, ctx):
                    for sid in ids:
                        if sid:
                            _advertise(st, st.sessions.get(session_key(LBTRU, tr.ip, tr.port, sid)), t.index,
                                       t.topic, ctx)
                continue
            elif name == "LBTRU" or name == "TCP":
                s = st.session(LBTRU if name == "LBTRU" else LBTTCP, tr.ip, tr.port,
                               getattr(tr, "session_id", 0))
                if s is None:
                    continue
                (self._ru if name == "LBTRU" else self._tcp.sources).setdefault((tr.ip, tr.port), set()).add(s.session_id)
            else:
                continue
            _advertise(st, s, t.index, t.topic, ctx)
        for q in pkt.tqrs:
            ctxs = st.queries.get(q.topic)
            if ctxs is None:
                if len(st.queries) >= MAX_SESSIONS * 4:
                    st.overflow["queried_topics"] += 1
                    continue
                ctxs = st.queries[q.topic] = set()
            if len(ctxs) < MAX_RECEIVERS:
                ctxs.add(ctx)

    # ---- capture items

    def feed(self, p) -> list:
        """:meth:`packet`, and for a UDP datagram on an LBMR port, its LBMR packet
        decoded and learned (:meth:`lbmr`; an undecodable one is counted as
        ``errors['lbmr_undecodable']``)."""
        if isinstance(p, UdpDatagram) and (p.sport in self.lbmr_ports or p.dport in self.lbmr_ports):
            try:
                pkt = decode_lbmr(p.payload)
            except LBMRDecodeError:
                self.state.errors["lbmr_undecodable"] += 1
            else:
                self.lbmr(p, pkt)
            return []
        return self.packet(p)

    def packet(self, p) -> list:
        """The records of one item of :func:`~lbmr_proto.capture.read_packets`."""
        if isinstance(p, UdpDatagram):
            if p.sport in self.lbmr_ports or p.dport in self.lbmr_ports:
                return []
            return self._udp(p.ts, p.frame, p.src, p.sport, p.dst, p.dport, p.payload, False)
        if isinstance(p, TcpSegment):
            return self._tcp.segment(p)
        if isinstance(p, IcmpError):
            return self._icmp(p)
        return []

    def _error(self, ts, frame, transport, key, src, sport, dst, dport, n, reason, icmp) -> list:
        self.state.errors[reason] += 1
        return [transport_record(ts, frame, transport, key, "ERROR", src, sport, dst, dport, n, icmp=icmp,
                             error=reason)]

    def _udp(self, ts, frame, src, sport, dst, dport, payload, icmp) -> list:
        if not payload or payload[0] >> 4:
            if (dst, dport) in self._rm_groups or (dst, dport) in self._rm_naks:
                return self._error(ts, frame, LBTRM, "", src, sport, dst, dport, len(payload),
                                   "lbtrm_bad_header", icmp)
            if (src, sport) in self._ru or (dst, dport) in self._ru:
                return self._error(ts, frame, LBTRU, "", src, sport, dst, dport, len(payload),
                                   "lbtru_bad_header", icmp)
            return []
        known_rm = (dst, dport) in self._rm_groups or (dst, dport) in self._rm_naks
        if known_rm or (not ((src, sport) in self._ru or (dst, dport) in self._ru) and self._rm_shape(
                src, dst, dport, payload, icmp)):
            return self._lbtrm(ts, frame, src, sport, dst, dport, payload, icmp)
        if (src, sport) in self._ru or (dst, dport) in self._ru or self._ru_shape(payload, icmp):
            return self._lbtru(ts, frame, src, sport, dst, dport, payload, icmp)
        return []

    # ---- LBT-RM

    @staticmethod
    def _rm_shape(src, dst, dport, payload, icmp) -> bool:
        """Does an unknown datagram look like LBT-RM down to its last byte?"""
        n = len(payload)
        if n < 8 or payload[1] != 0:
            return False
        t = payload[0] & 0x0F
        if t == RM.NAK:
            if n < 12 or int.from_bytes(payload[2:4], "big") != dport or _multicast(dst):
                return False
            k = int.from_bytes(payload[8:10], "big")
            return k > 0 and (n == 12 + 4 * k or icmp)
        if not _multicast(dst):
            return False
        if t == RM.SM:
            return n == 24
        if t == RM.NCF:
            return n >= 16 and n == 16 + 4 * int.from_bytes(payload[12:14], "big")
        if t == RM.DATA:
            return n > 20 and lbmc_spans(payload[20:]) is not None
        return False

    def _lbtrm(self, ts, frame, src, sport, dst, dport, payload, icmp) -> list:
        n = len(payload)
        if n >= 20 and not payload[0] and not payload[1] and not icmp:  # DATA, version 0, no options: inline
            _, _, port, sid, sqn, trail, fl = _RM_DATA(payload)
            s = self._rm_sources.get((src, port, sid))
            if s is None:
                s = self._rm_source(src, port, sid, dst, dport)
            key = s.key if s is not None else session_key(LBTRM, src, port, sid)
            rx = bool(fl & RM.FLAG_RETRANSMISSION)
            out = [TransportRecord(ts, frame, LBTRM, key, "DATA", src, sport, dst, dport, sid, sqn, trail, -1, rx,
                                   fl & 0xF0, (), -1, -1, n, False, "")]
            if s is not None:
                self._data(s, ts, sqn, n, rx)
            out += message_records(self.state, s, ts, frame, LBTRM, key, payload[20:], rx)
            return out
        try:
            m = RM.decode(payload)
        except RM.LbtrmDecodeError as e:
            reason = "lbtrm_truncated" if "shorter" in str(e) else (
                "lbtrm_nak_list" if "announces" in str(e) else "lbtrm_malformed")
            key = ""
            if n >= 8 and not payload[0] >> 4:
                h = RM.HEADER.unpack_from(payload)
                ip = dst if (payload[0] & 0x0F) == RM.NAK else src
                key = session_key(LBTRM, ip, h[2], h[3])
            if icmp and n >= 8 and key:  # the quote may be cut short: the header names the session
                return self._rm_icmp(ts, frame, src, sport, dst, dport, payload, key)
            return self._error(ts, frame, LBTRM, key, src, sport, dst, dport, n, reason, icmp)
        h = m.header
        st = self.state
        if isinstance(m, RM.Nak):
            ip = dst
            if _multicast(dst):  # a multicast NAK: the source is the one of that group with this port and id
                want = session_key(LBTRM, "", h.ucast_port, h.session_id).split(":", 2)[2]
                for k in self._rm_groups.get((dst, dport), ()):
                    if k.endswith(":" + want):
                        ip = k.split(":")[1]
            s = st.session(LBTRM, ip, h.ucast_port, h.session_id)
        else:
            s = self._rm_source(src, h.ucast_port, h.session_id, dst, dport)
        key = session_key(LBTRM, ip if isinstance(m, RM.Nak) else src, h.ucast_port, h.session_id)
        if icmp:
            return self._rm_icmp(ts, frame, src, sport, dst, dport, payload, key, m)
        rec = transport_record
        if isinstance(m, RM.Data):
            out = [rec(ts, frame, LBTRM, key, "DATA", src, sport, dst, dport, n, sid=h.session_id, sqn=m.sqn,
                       trail=m.trail_sqn, rx=m.retransmission, flags=m.flags)]
            if s is not None:
                self._data(s, ts, m.sqn, n, m.retransmission)
            out += message_records(self.state, s, ts, frame, LBTRM, key, m.payload, m.retransmission)
            return out
        if s is not None:
            s.first_ts = min(s.first_ts, ts)
            s.last_ts = max(s.last_ts, ts)
        if isinstance(m, RM.SessionMessage):
            if s is not None:
                s.session_messages += 1
                s.lead_sqn = max(s.lead_sqn, m.lead_sqn)
            return [rec(ts, frame, LBTRM, key, "SM", src, sport, dst, dport, n, sid=h.session_id, sqn=m.sm_sqn,
                        trail=m.trail_sqn, lead=m.lead_sqn, flags=m.flags)]
        if isinstance(m, RM.Ncf):
            if s is not None:
                s.ncf_packets[m.reason] += 1
                s.ncf_entries[m.reason] += len(m.sqns)
            return [rec(ts, frame, LBTRM, key, "NCF", src, sport, dst, dport, n, sid=h.session_id,
                        trail=m.trail_sqn, sqns=m.sqns, reason=m.reason)]
        if s is not None:
            self._nak(s, f"{src}:{sport}", "nak", ts, m.sqns)
        return [rec(ts, frame, LBTRM, key, "NAK", src, sport, dst, dport, n, sid=h.session_id, sqns=m.sqns)]

    def _rm_source(self, src, port, sid, dst, dport) -> SessionState | None:
        """The session of a datagram its source sent (DATA, SM, NCF) to (dst, dport)."""
        s = self.state.session(LBTRM, src, port, sid)
        if s is None:
            return None
        if not s.group:
            s.group, s.dport = dst, dport
            self._rm_groups.setdefault((dst, dport), set()).add(s.key)
            self._rm_naks.add((src, port))
        if len(self._rm_sources) >= MAX_SESSIONS:
            self._rm_sources.clear()
        self._rm_sources[(src, port, sid)] = s
        return s

    def _rm_icmp(self, ts, frame, src, sport, dst, dport, payload, key, m=None) -> list:
        s = self.state.sessions.get(key)
        h = RM.HEADER.unpack_from(payload)
        kind = _RM_NAMES.get(h[0] & 0x0F, "ERROR")
        if s is not None:
            self._icmp_error(s, kind == "NAK")
        return [transport_record(ts, frame, LBTRM, key, kind, src, sport, dst, dport, len(payload), sid=h[3],
                             sqns=getattr(m, "sqns", ()), icmp=True)]

    def _data(self, s: SessionState, ts: float, sqn: int, n: int, rx: bool) -> None:
        if ts < s.first_ts:
            s.first_ts = ts
        if ts > s.last_ts:
            s.last_ts = ts
        if rx:
            s.retransmissions += 1
            s.retransmission_bytes += n
            if sqn not in s.rx_first:
                if len(s.rx_first) < MAX_SQNS:
                    s.rx_first[sqn] = ts
                else:
                    self.state.overflow["rx_first"] += 1
            for r in s.receivers.values():
                r.recovered(sqn, ts)
        else:
            s.originals += 1
            s.original_bytes += n
            if ts > s.last_original_ts:
                s.last_original_ts = ts
            if sqn > s.lead_sqn:
                s.lead_sqn = sqn

    def _nak(self, s: SessionState, receiver: str, kind: str, ts: float, sqns) -> None:
        s.nak_packets += 1
        s.nak_entries += len(sqns)
        s.first_ts = min(s.first_ts, ts)
        ov = self.state.overflow
        r = s.receiver(receiver, kind, ov)
        if len(set(sqns)) != len(sqns):
            self.state.errors["nak_duplicate_sqns"] += 1
        for q in sqns:
            if q not in s.naked:
                if len(s.naked) < MAX_SQNS:
                    s.naked.add(q)
                else:
                    ov["naked_sqns"] += 1
        if r is None:
            return
        r.seen(ts)
        r.nak_packets += 1
        r.nak_entries += len(sqns)
        for q in sqns:
            if q not in r.naked:
                if len(r.naked) < MAX_SQNS:
                    r.naked.add(q)
                else:
                    ov["naked_sqns"] += 1
            if q not in r.outstanding:
                if len(r.outstanding) < MAX_SQNS:
                    r.outstanding[q] = ts
                    if q not in s.rx_first:
                        r.fresh.add(q)
                else:
                    ov["outstanding_sqns"] += 1

    # ---- LBT-RU

    @staticmethod
    def _ru_shape(payload, icmp) -> bool:
        if len(payload) < 4 or payload[1] != RU.OPT_SID:  # without a TIR: the session id option first
            return False
        try:
            m = RU.decode(payload)
        except RU.LbtruDecodeError:
            return False
        if m.header.session_id is None:
            return False
        if isinstance(m, RU.Data):
            return bool(m.payload) and lbmc_spans(m.payload) is not None
        return True

    def _lbtru(self, ts, frame, src, sport, dst, dport, payload, icmp) -> list:
        n = len(payload)
        try:
            m = RU.decode(payload)
        except RU.LbtruDecodeError as e:
            to_source = (dst, dport) in self._ru
            if icmp and n >= 4 and (to_source or (src, sport) in self._ru):  # a quote cut short: the address
                sip, sp = (dst, dport) if to_source else (src, sport)     # names the session
                key = session_key(LBTRU, sip, sp, self._ru_sid(self._ru[(sip, sp)]))
                s = self.state.sessions.get(key)
                if s is not None:
                    self._icmp_error(s, to_source, f"{src}:{sport}" if to_source else f"{dst}:{dport}")
                return [transport_record(ts, frame, LBTRU, key, _RU_NAMES.get(payload[0] & 0x0F, "ERROR"), src,
                                     sport, dst, dport, n, flags=int.from_bytes(payload[2:4], "big"), icmp=True)]
            reason = "lbtru_truncated" if "shorter" in str(e) else (
                "lbtru_nak_list" if "announces" in str(e) else "lbtru_malformed")
            return self._error(ts, frame, LBTRU, "", src, sport, dst, dport, n, reason, icmp)
        h = m.header
        to_source = isinstance(m, (RU.Creq, RU.Ack, RU.Nak))
        sip, sp = (dst, dport) if to_source else (src, sport)
        rcv = f"{src}:{sport}" if to_source else f"{dst}:{dport}"
        sid = h.session_id
        ids = self._ru.get((sip, sp))
        if sid is None:
            sid = self._ru_sid(ids)
        s = self._ru_session(sip, sp, sid, ids)
        key = session_key(LBTRU, sip, sp, sid)
        kind = _RU_NAMES[h.type]
        rec = dict(sid=-1 if h.session_id is None else h.session_id, flags=h.flags,
                   cid=-1 if h.client_id is None else h.client_id, icmp=icmp)
        if icmp:
            if s is not None:
                self._icmp_error(s, to_source, rcv)
            return [transport_record(ts, frame, LBTRU, key, kind, src, sport, dst, dport, n,
                                 sqns=getattr(m, "sqns", ()), **rec)]
        r = None if s is None else s.receiver(rcv, "lbtru", self.state.overflow)
        if r is not None and not isinstance(m, RU.Nak):
            r.seen(ts)
        if s is not None:
            s.first_ts = min(s.first_ts, ts)
            s.last_ts = max(s.last_ts, ts)
        out = []
        if isinstance(m, RU.Data):
            out.append(transport_record(ts, frame, LBTRU, key, kind, src, sport, dst, dport, n, sqn=m.sqn,
                                    trail=m.trail_sqn, rx=m.retransmission, **rec))
            if s is not None:
                self._data(s, ts, m.sqn, n, m.retransmission)
            return out + message_records(self.state, s, ts, frame, LBTRU, key, m.payload, m.retransmission)
        if isinstance(m, RU.SessionMessage):
            if s is not None:
                s.session_messages += 1
                s.lead_sqn = max(s.lead_sqn, m.lead_sqn)
                if m.syn:
                    s.control["SYN"] += 1
            return [transport_record(ts, frame, LBTRU, key, kind, src, sport, dst, dport, n, sqn=m.sm_sqn,
                                 trail=m.trail_sqn, lead=m.lead_sqn, **rec)]
        if isinstance(m, RU.Ncf):
            if s is not None:
                s.ncf_packets[m.reason] += 1
                s.ncf_entries[m.reason] += len(m.sqns)
            return [transport_record(ts, frame, LBTRU, key, kind, src, sport, dst, dport, n, trail=m.trail_sqn,
                                 sqns=m.sqns, reason=m.reason, **rec)]
        if isinstance(m, RU.Nak):
            if s is not None:
                self._nak(s, rcv, "lbtru", ts, m.sqns)
            return [transport_record(ts, frame, LBTRU, key, kind, src, sport, dst, dport, n, sqns=m.sqns, **rec)]
        if s is not None:
            s.control[kind] += 1
            if isinstance(m, RU.Rst) and r is not None:
                r.resets += 1
        sqn = m.ack_sqn if isinstance(m, RU.Ack) else -1
        return [transport_record(ts, frame, LBTRU, key, kind, src, sport, dst, dport, n, sqn=sqn, **rec)]

    @staticmethod
    def _ru_sid(ids) -> int:
        """The session id of an LBT-RU datagram without one: the only one seen at
        its address (an unnamed TIR's 0 when none or several)."""
        if ids and len(ids) == 1:
            return next(iter(ids))
        return 0

    def _ru_session(self, ip: str, port: int, sid: int, ids) -> SessionState | None:
        """The LBT-RU session (ip, port, sid); one new at an address a TIR without
        session id advertised takes that TIR's topics, contexts and ``from_tir``."""
        st = self.state
        if ids is not None and sid in ids:
            return st.sessions.get(session_key(LBTRU, ip, port, sid))
        s = st.session(LBTRU, ip, port, sid)
        if s is None:
            return None
        if ids is None:
            ids = self._ru[(ip, port)] = set()
        if not sid:
            return s
        ids.add(sid)
        adv = st.sessions.get(session_key(LBTRU, ip, port, 0))
        if adv is not None and adv.unnamed and adv.from_tir:
            s.from_tir = True
            for tidx, topic in adv.topics.items():
                if tidx not in s.topics:
                    if len(s.topics) < MAX_TOPICS:
                        s.topics[tidx] = topic
                    else:
                        st.overflow["topics"] += 1
            for ctx in adv.source_contexts:
                if len(s.source_contexts) < MAX_RECEIVERS:
                    s.source_contexts.add(ctx)
        return s

    # ---- ICMP

    def _icmp_error(self, s: SessionState, to_source: bool, receiver: str = "") -> None:
        """An ICMP port unreachable quoting a datagram of ``s``: sent to its source
        (a NAK, ACK or CREQ: the source is gone) or by it (DATA, SM, NCF, RST) to
        ``receiver`` (``ip:port``; that receiver is gone; "" for multicast)."""
        if to_source:
            s.icmp_errors += 1
            return
        s.receiver_icmp_errors += 1
        if receiver:
            r = s.receiver(receiver, "lbtru", self.state.overflow)
            if r is not None:
                r.icmp_errors += 1

    def _icmp(self, e: IcmpError) -> list:
        if e.type != 3 or e.code != 3 or len(e.payload) < 4:
            return []
        if e.sport in self.lbmr_ports or e.dport in self.lbmr_ports:
            return []
        return self._udp(e.ts, e.frame, e.src, e.sport, e.dst, e.dport, e.payload, True)
