"""The transport-session records and names: :class:`TransportRecord` and
:class:`MessageRecord` (the stable schema the Spark pipeline makes rows of),
UM's source strings and session keys, and the decoder's bounds. Private to
lbmr_proto; the public face is :mod:`lbmr_proto.transport_sessions`."""

from __future__ import annotations

from typing import NamedTuple

LBTRM, LBTRU, LBTTCP = "LBTRM", "LBTRU", "TCP"
NCF_REASONS = {0: "no_retry", 1: "ignored", 2: "rx_delay", 3: "shed"}
MAX_SESSIONS = 4096
MAX_RECEIVERS = 256
MAX_TOPICS = 4096
MAX_SQNS = 65536
#: TCP connection directions followed at once (LBT-TCP ones, and new ones until their first bytes)
MAX_TCP_FLOWS = 4096

class TransportRecord(NamedTuple):
    """One transport datagram (LBT-RM, LBT-RU), one TCP segment of an LBT-TCP
    connection, or one ICMP error quoting a transport datagram.

    ``ts``: capture time, seconds since the epoch; ``frame``: 1-based frame
    number; ``transport``: ``LBTRM``, ``LBTRU`` or ``TCP``; ``session``: the
    session key (:func:`session_key`); ``kind``: the packet type (LBT-RM:
    DATA, SM, NAK, NCF; LBT-RU: also ACK, CREQ, RST; TCP: SEGMENT, SYN, FIN,
    RST; ERROR when it did not decode); ``src``/``sport``/``dst``/``dport``:
    the datagram's addresses (for ICMP, the quoted datagram's); ``session_id``:
    the u32 session id in the header or option (-1: none); ``sqn``: DATA's
    sequence number, SM's ``sm_sqn``, ACK's ``ack_sqn``, TCP's u32 sequence
    number (-1 otherwise); ``trail_sqn``, ``lead_sqn``: the source's window
    (DATA, SM, NCF; -1 otherwise); ``retransmission``: a DATA datagram's
    retransmission flag; ``flags``: the header's flags (LBT-RM: the high
    nibble of ``flags_fec``; LBT-RU: ``flags_or_res``, i.e. SYN, the CREQ
    request or the RST reason; TCP: the flag byte); ``sqns``: a NAK's or
    NCF's list of sequence numbers, in wire order; ``reason``: an NCF's reason
    (0 do not retry, 1 ignored, 2 retransmit delay, 3 shed; -1 otherwise);
    ``client_id``: LBT-RU's client id option (-1: none); ``length``: UDP (TCP)
    payload bytes; ``icmp``: the datagram was quoted in an ICMP
    port-unreachable error (sent by the quoted destination's host) rather than
    captured itself; ``error``: why it did not decode ("" when it did).
    """

    ts: float
    frame: int
    transport: str
    session: str
    kind: str
    src: str
    sport: int
    dst: str
    dport: int
    session_id: int
    sqn: int
    trail_sqn: int
    lead_sqn: int
    retransmission: bool
    flags: int
    sqns: tuple[int, ...]
    reason: int
    client_id: int
    length: int
    icmp: bool
    error: str


class MessageRecord(NamedTuple):
    """One LBMC message inside a DATA datagram or an LBT-TCP stream.

    ``ts``/``frame``: the carrying datagram's (TCP: the segment that
    completed the message); ``transport``/``session``: as in
    :class:`TransportRecord`; ``kind``: MESSAGE, PRORX, RETRANS, CONTROL,
    EOT; ``tidx``: the u32 topic index (the TIR's ``index``), ``sqn`` the
    topic's u32 message sequence number (both 0 for CONTROL and EOT);
    ``topic``: the topic the session's TIRs give that index ("" unknown so
    far); ``msglen``: the message's bytes, header included; ``payload_len``:
    the bytes after the header chain; ``headers``: the chain's header types,
    by name (the class name without ``Header``, or ``0xNN``); ``fragment``:
    ``(first_sqn, offset, length)`` of a FRAG header (-1 each without one);
    ``retransmission``: carried in a retransmitted datagram; ``error``: why it
    did not decode ("" when it did).
    """

    ts: float
    frame: int
    transport: str
    session: str
    kind: str
    tidx: int
    sqn: int
    topic: str
    msglen: int
    payload_len: int
    headers: tuple[str, ...]
    fragment: tuple[int, int, int]
    retransmission: bool
    error: str


def source_string(transport: str, ip: str, port: int, session_id: int, group: str = "", dport: int = 0) -> str:
    """UM's source string of a session (session id in 8-digit lowercase hex)."""
    s = f"{transport}:{ip}:{port}:{session_id & 0xFFFFFFFF:08x}"
    return f"{s}:{group}:{dport}" if transport == LBTRM and group else s


def session_key(transport: str, ip: str, port: int, session_id: int) -> str:
    """The stable key of a session: its source string without LBT-RM's group
    and destination port (``port``: LBT-RM's NAK port, else the source port)."""
    return f"{transport}:{ip}:{port}:{session_id & 0xFFFFFFFF:08x}"



def transport_record(ts, frame, transport, key, kind, src, sport, dst, dport, payload_len, *, sid=-1, sqn=-1,
                     trail=-1, lead=-1, rx=False, flags=0, sqns=(), reason=-1, cid=-1, icmp=False,
                     error="") -> TransportRecord:
    """A :class:`TransportRecord`, the fields a packet kind has not left at -1 (False, "", ())."""
    return TransportRecord(ts, frame, transport, key, kind, src, sport, dst, dport, sid, sqn, trail, lead,
                           rx, flags, tuple(sqns), reason, cid, payload_len, icmp, error)
