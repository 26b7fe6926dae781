"""UM transport sessions in captures, sans-IO: LBT-RM, LBT-RU and LBT-TCP
datagrams and streams decoded into typed records, and joined per session with
the session's topics, source context and receivers.

Calling contract
    :class:`TransportDecoder` takes, in capture order, the LBMR packets of the
    capture (:meth:`~TransportDecoder.lbmr`: its TIRs and TQRs) and every UDP
    datagram, TCP segment and ICMP error (:meth:`~TransportDecoder.packet`,
    the items of :func:`lbmr_proto.capture.read_packets`); ``packet`` returns
    the records the item decodes to (an empty list for traffic that is not a
    UM transport). :meth:`~TransportDecoder.feed` does both: a UDP datagram on
    an LBMR port is decoded as LBMR and learned, anything else goes to
    ``packet``. :attr:`TransportDecoder.state` is the per-session state so
    far: a :class:`SessionsState`, bounded, and mergeable with
    :meth:`SessionsState.merge` (partitions of one capture, merged in time
    order: counts add, sets unite, and a NAK still open at the end of one part
    is answered by the first retransmission of it in the next, as in one
    pass; an LBT-TCP stream cut by a partition resynchronises on the next
    message boundary). :func:`session_rows`, :func:`receiver_rows` and
    :func:`topic_rows` turn a state into the three tables.

Finding sessions (no "Decode As")
    * from the TIRs seen so far: LBT-RM (source ip, NAK port, session id,
      group, destination port), LBT-RU and LBT-TCP (ip, port, session id);
    * where no TIR was captured, from the protocols' own headers, accepted only
      when every byte is accounted for: an LBT-RM DATA, SM or NCF to a multicast
      group (version 0, no option headers, a DATA's payload whole LBMC
      messages, an SM or NCF exactly its length), an LBT-RM NAK whose header
      names the UDP port it is sent to, an LBT-RU datagram with a session-id
      option and exact length, a TCP stream opened by a SYN whose first bytes
      are whole LBMC messages with a TCP_SID header.
    Once a session is known its addresses classify later traffic, and traffic
    to or from them that does not decode is counted by reason
    (:attr:`SessionsState.errors`) and reported as a record with ``error`` set,
    never raised. With partitions, feed every partition's decoder the
    capture's TIRs first (:meth:`TransportDecoder.lbmr`) so that all classify
    alike.

Bad input (the keys of ``SessionsState.errors``)
    ``lbtrm_truncated``, ``lbtrm_nak_list`` (a NAK or NCF list shorter than
    announced), ``lbtrm_malformed``, ``lbtrm_bad_header`` (not version 0, on a
    known session's address), the same four for ``lbtru_``; ``lbmc_malformed``
    (a DATA payload that is not whole LBMC messages, or a message that does not
    decode); ``nak_duplicate_sqns`` (a NAK naming a sequence number twice; the
    NAK still counts); ``tcp_not_lbmc`` (bytes on an LBT-TCP connection that
    are not a message start), ``tcp_no_boundary`` (bytes dropped hunting for a
    message boundary), ``tcp_hole`` (a TCP hole skipped), ``tcp_sid_mismatch``
    (a TCP_SID header naming another session); ``lbmr_undecodable``.

ICMP port unreachable
    A datagram quoted in an ICMP error is never counted as a NAK, DATA or NCF
    of its session. Which way it went says who is gone: one sent to the
    source (a NAK, ACK or CREQ; the quoted destination is the session's
    address) counts as the session's ``icmp_errors`` (the source's socket is
    closed: it stopped); one the source sent (DATA, SM, NCF, RST) counts as
    the session's ``receiver_icmp_errors`` and, for LBT-RU, as the quoted
    destination receiver's ``icmp_errors`` (that receiver closed its socket
    while the source still sent to it; nothing about the source).

LBT-RU TIRs without session id
    UM's LBT-RU TIR may name only ip and port while the datagrams carry a
    session-id option. Such a TIR advertises session id 0 at that address
    (:attr:`SessionState.unnamed`), and every session seen at the address,
    whatever its id, takes its topics, source contexts and ``from_tir``
    (in either order: TIR first or datagrams first; partitions learn the
    capture's TIRs first, so each part joins alike and merging keeps it).
    A datagram without session-id option there belongs to the one id seen at
    the address (to session 0 while none or several were: e.g. a receiver's
    first CREQ, sent before the source's SYN names the id). The tables
    (:meth:`SessionsState.joined`) fold session 0 into the one session with
    an id seen at its address; with several there it stays apart (left out
    when it saw nothing of its own).

Session names
    UM's source strings, session ids in lowercase hex (8 digits):
    ``LBTRM:ip:nakport:sessionid:group:dport``, ``LBTRU:ip:port:sessionid``,
    ``TCP:ip:port:sessionid``. The records' ``session`` field is the stable key
    (:func:`session_key`, the source string without LBT-RM's group and port,
    which are not in NAKs); the tables give both.

Record schema (stable; the Spark pipeline makes rows of it)
    :class:`TransportRecord`, one per datagram (TCP: per segment) and
    :class:`MessageRecord`, one per LBMC message inside one. Their fields,
    units and byte order are documented on the classes; ``-1`` stands for a
    field the packet kind has not (never None, so that columns keep one type).

Bounds
    Sessions (``MAX_SESSIONS``), receivers per session (``MAX_RECEIVERS``),
    topic indexes per session (``MAX_TOPICS``), distinct NAKed sequence numbers
    per session and receiver and outstanding NAKs per receiver
    (``MAX_SQNS``), retransmission times kept for merging (``MAX_SQNS``), TCP
    directions followed (``MAX_TCP_FLOWS``, the decoder's ``max_tcp_flows``;
    only those are reassembled) and
    their held bytes (:mod:`lbmr_proto.tcpstream`): beyond a bound, new
    entries are not kept (TCP directions: the oldest is dropped) and
    ``SessionsState.overflow`` counts them.

Time is ``float`` seconds since the Unix epoch (capture time); byte counts are
UDP payload bytes (TCP: segment payload bytes); sequence numbers are the
protocols' u32 values (all protocol fields big-endian on the wire).

This module is the public face; the work is done by private modules of
lbmr_proto, each importing only ones listed before it: ``_sessionrecords``
(the record schema, session names, bounds), ``_sessionstate`` (the mergeable
state), ``_sessionlbmc`` (LBMC messages in payloads), ``_lbttcp`` (LBT-TCP
connections followed and cut into messages), ``_sessiondecoder``
(:class:`TransportDecoder`: LBMR learned, UDP classified, LBT-RM and LBT-RU
decoded) and ``_sessiontables`` (the three tables).
"""

from __future__ import annotations

from ._lbttcp import RESYNC_WINDOW
from ._sessiondecoder import TransportDecoder
from ._sessionrecords import (
    LBTRM,
    LBTRU,
    LBTTCP,
    MAX_RECEIVERS,
    MAX_SESSIONS,
    MAX_SQNS,
    MAX_TCP_FLOWS,
    MAX_TOPICS,
    NCF_REASONS,
    MessageRecord,
    TransportRecord,
    session_key,
    source_string,
)
from ._sessionstate import ReceiverState, SessionsState, SessionState
from ._sessiontables import (
    ReceiverRow,
    SessionRow,
    TopicRow,
    receiver_rows,
    session_rows,
    topic_rows,
)

__all__ = [
    "TransportRecord", "MessageRecord", "TransportDecoder", "SessionsState", "SessionState",
    "ReceiverState", "SessionRow", "ReceiverRow", "TopicRow", "session_rows", "receiver_rows",
    "topic_rows", "session_key", "source_string", "LBTRM", "LBTRU", "LBTTCP", "NCF_REASONS",
    "MAX_SESSIONS", "MAX_RECEIVERS", "MAX_TOPICS", "MAX_SQNS", "MAX_TCP_FLOWS", "RESYNC_WINDOW",
]
