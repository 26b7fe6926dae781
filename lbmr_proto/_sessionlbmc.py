"""LBMC messages in transport payloads, for the transport-session decoder:
cutting a DATA payload into whole messages (:func:`lbmc_spans`) and making
each message a :class:`~lbmr_proto._sessionrecords.MessageRecord` while
counting it in its session (:func:`message_record`, :func:`message_records`;
a data message without headers is decoded inline). Private to lbmr_proto;
the public face is :mod:`lbmr_proto.transport_sessions`."""

from __future__ import annotations

from . import lbmc as C
from ._sessionrecords import LBTTCP, MAX_TOPICS, MessageRecord
from ._sessionstate import SessionsState, SessionState

_LBMC_DATA = C.DATA_HEADER.unpack_from
_PLAIN_DATA_KINDS = {k: C.KIND_NAMES[k] for k in C.DATA_KINDS}  # ver_type (version 0) -> kind name
_NO_FRAGMENT = (-1, -1, -1)


def lbmc_spans(payload: bytes) -> list[tuple[int, int]] | None:
    """(start, msglen) of each LBMC message if ``payload`` is whole messages back to back, else None."""
    out, pos, n = [], 0, len(payload)
    while pos < n:
        if n - pos < 4:
            return None
        try:
            _, msglen = C.check_start(payload, pos)
        except (C.LbmcDecodeError, IndexError):
            return None
        if pos + msglen > n:
            return None
        out.append((pos, msglen))
        pos += msglen
    return out


def header_name(h) -> str:
    if isinstance(h, C.UnknownHeader):
        return f"0x{h.code:02x}"
    return type(h).__name__.removesuffix("Header")


def message_records(state: SessionsState, s: SessionState | None, ts, frame, transport, key, payload,
                    rx) -> list[MessageRecord]:
    """The records of a DATA payload's LBMC messages (one ERROR record if it is not whole messages)."""
    spans = lbmc_spans(payload)
    if spans is None:
        state.errors["lbmc_malformed"] += 1
        return [MessageRecord(ts, frame, transport, key, "ERROR", -1, -1, "", len(payload), 0, (),
                              (-1, -1, -1), rx, "lbmc_malformed")]
    return [message_record(state, s, ts, frame, transport, key, payload[a:a + n], rx) for a, n in spans]


def message_record(state: SessionsState, s: SessionState | None, ts, frame, transport, key, data,
                   rx) -> MessageRecord:
    """The record of one whole LBMC message, counted in its session ``s`` (None: not kept)."""
    if not data[1] and data[0] in _PLAIN_DATA_KINDS:  # a data message without headers: inline
        _, _, msglen, tidx, sqn = _LBMC_DATA(data)
        topic = ""
        if s is not None:
            counter = s.rx_messages if rx else s.messages
            if tidx in counter or len(counter) < MAX_TOPICS:
                counter[tidx] += 1
            else:
                state.overflow["topics"] += 1
            topic = s.topics.get(tidx, "")
        return MessageRecord(ts, frame, transport, key, _PLAIN_DATA_KINDS[data[0]], tidx, sqn, topic, msglen,
                             msglen - 12, (), _NO_FRAGMENT, rx, "")
    try:
        m = C.decode(data)
    except C.LbmcDecodeError:
        state.errors["lbmc_malformed"] += 1
        return MessageRecord(ts, frame, transport, key, "ERROR", -1, -1, "", len(data), 0, (),
                             (-1, -1, -1), rx, "lbmc_malformed")
    frag = m.header(C.FragmentHeader)
    topic = ""
    if s is not None:
        if m.kind in C.DATA_KINDS:
            counter = s.rx_messages if rx else s.messages
            if m.tidx in counter or len(counter) < MAX_TOPICS:
                counter[m.tidx] += 1
            else:
                state.overflow["topics"] += 1
        topic = s.topics.get(m.tidx, "") if m.kind in C.DATA_KINDS else ""
        sid_h = m.header(C.TcpSidHeader)
        if sid_h is not None and transport == LBTTCP and s.session_id != sid_h.session_id:
            state.errors["tcp_sid_mismatch"] += 1
    return MessageRecord(ts, frame, transport, key, C.KIND_NAMES[m.kind], m.tidx, m.sqn, topic, len(data),
                         len(m.payload), tuple(header_name(h) for h in m.headers),
                         (frag.first_sqn, frag.offset, frag.length) if frag else (-1, -1, -1), rx, "")
