"""The transport-session tables: one row per session, per (session,
receiver) and per (session, topic index), made from a
:class:`~lbmr_proto._sessionstate.SessionsState`. Private to lbmr_proto; the
public face is :mod:`lbmr_proto.transport_sessions`."""

from __future__ import annotations

import math
from typing import NamedTuple

from ._sessionstate import SessionsState


class SessionRow(NamedTuple):
    """One transport session. Times: seconds since the epoch; ``lead_sqn``: the
    newest data sequence number sent (original DATA or an SM's lead; -1 none);
    ``rate_bps``:
    original datagram bytes per second between the first and last original
    datagram (0.0 with fewer than two); bytes: UDP (TCP) payload bytes;
    ``ncf_*``: NCFs by reason (packets); ``icmp_errors``: ICMP port
    unreachable errors quoting datagrams sent to the source (NAKs, ACKs,
    CREQs: its host says the source is gone); ``receiver_icmp_errors``: those
    quoting the source's own datagrams (DATA, SM, NCF, RST: a receiver's host
    says the receiver is gone); ``lbmc_messages``: LBMC data messages
    (MESSAGE, PRORX, RETRANS; not CONTROL or EOT) carried; ``receivers``: ``ip:port`` of NAK
    senders, LBT-RU clients and TCP connections, then ``ctx:ip:port`` of the
    contexts whose TQRs asked for one of the session's topics."""

    session: str
    source: str
    transport: str
    source_ip: str
    port: int
    group: str
    dport: int
    session_id: int
    from_tir: bool
    topics: tuple[str, ...]
    source_contexts: tuple[str, ...]
    originals: int
    original_bytes: int
    retransmissions: int
    retransmission_bytes: int
    first_ts: float
    last_ts: float
    last_original_ts: float
    lead_sqn: int
    rate_bps: float
    nak_packets: int
    nak_entries: int
    naked_sqns: int
    ncf_no_retry: int
    ncf_ignored: int
    ncf_rx_delay: int
    ncf_shed: int
    session_messages: int
    control: tuple[tuple[str, int], ...]
    icmp_errors: int
    receiver_icmp_errors: int
    lbmc_messages: int
    receivers: tuple[str, ...]


class ReceiverRow(NamedTuple):
    """One (session, receiver). ``loss_estimate``: distinct sequence numbers
    the receiver NAKed / the session's original datagrams (0.0 with none);
    ``recovery_p50``/``recovery_max``: seconds from a sequence number's first
    NAK to the first retransmission of it after (p50 to 2 %); ``outstanding``:
    sequence numbers NAKed and never retransmitted after, ascending (at most
    100 listed; ``outstanding_count`` all), i.e. still missing when the source
    went silent (``silent_ts``: its last original datagram); ``icmp_errors``:
    ICMP port unreachable errors from the receiver's host quoting the source's
    datagrams to it (the receiver had closed its socket)."""

    session: str
    receiver: str
    kind: str
    first_ts: float
    last_ts: float
    packets: int
    nak_packets: int
    nak_entries: int
    naked_sqns: int
    loss_estimate: float
    recovered: int
    recovery_p50: float
    recovery_max: float
    outstanding_count: int
    outstanding: tuple[int, ...]
    silent_ts: float
    zero_windows: int
    resets: int
    icmp_errors: int


class TopicRow(NamedTuple):
    """One (session, topic index): LBMC data messages in original and in
    retransmitted datagrams; ``topic`` "" when no TIR named the index."""

    session: str
    tidx: int
    topic: str
    messages: int
    rx_messages: int


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def session_rows(state: SessionsState) -> list[SessionRow]:
    """The session table, ordered by session key."""
    out = []
    sessions = state.joined()
    for key in sorted(sessions):
        s = sessions[key]
        topics = tuple(s.topics[i] for i in sorted(s.topics))
        wanted = set(s.topics.values())
        ctxs = sorted({c for t in wanted for c in state.queries.get(t, ())})
        span = s.last_original_ts - s.first_ts
        rate = s.original_bytes / span if s.originals > 1 and span > 0 else 0.0
        out.append(SessionRow(
            key, s.source, s.transport, s.ip, s.port, s.group, s.dport, s.session_id, s.from_tir, topics,
            tuple(sorted(s.source_contexts)), s.originals, s.original_bytes, s.retransmissions,
            s.retransmission_bytes, _finite(s.first_ts), _finite(s.last_ts), _finite(s.last_original_ts), s.lead_sqn, rate,
            s.nak_packets, s.nak_entries, len(s.naked), s.ncf_packets[0], s.ncf_packets[1], s.ncf_packets[2],
            s.ncf_packets[3], s.session_messages, tuple(sorted(s.control.items())), s.icmp_errors,
            s.receiver_icmp_errors,            sum(s.messages.values()) + sum(s.rx_messages.values()),
            tuple(sorted(s.receivers)) + tuple(f"ctx:{c}" for c in ctxs)))
    return out


def receiver_rows(state: SessionsState) -> list[ReceiverRow]:
    """The (session, receiver) table, ordered by session key and receiver."""
    out = []
    sessions = state.joined()
    for key in sorted(sessions):
        s = sessions[key]
        for addr in sorted(s.receivers):
            r = s.receivers[addr]
            pending = sorted(r.outstanding)
            out.append(ReceiverRow(
                key, addr, r.kind, _finite(r.first_ts), _finite(r.last_ts), r.packets, r.nak_packets,
                r.nak_entries, len(r.naked), len(r.naked) / s.originals if s.originals else 0.0,
                r.recovery.count, r.recovery.quantile(0.5), r.recovery.max, len(pending), tuple(pending[:100]),
                _finite(s.last_original_ts), r.zero_windows, r.resets, r.icmp_errors))
    return out


def topic_rows(state: SessionsState) -> list[TopicRow]:
    """The (session, topic index) table: every index carried or named by a TIR."""
    out = []
    sessions = state.joined()
    for key in sorted(sessions):
        s = sessions[key]
        for tidx in sorted(set(s.messages) | set(s.rx_messages) | set(s.topics)):
            out.append(TopicRow(key, tidx, s.topics.get(tidx, ""), s.messages[tidx], s.rx_messages[tidx]))
    return out

