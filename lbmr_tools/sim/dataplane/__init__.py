"""Data endpoints that send verifiable numbered data: live TCP and LBT-RU
sources of LBMC messages and their receivers, LBT-RM, and older per-receiver
stand-ins (:mod:`.pattern`, :mod:`.live`, :mod:`.tcp`, :mod:`.rulive`,
:mod:`.ru`, :mod:`.rm`, :mod:`.umru`; everything is importable from here).

They stand in for Ultra Messaging data transports in end-to-end tests (of
``lbmr-sim`` and of the TRD router, which relays TCP streams and LBT-RU
datagrams between domains): a receiver checks every byte it gets, so a relay
that loses, duplicates, reorders, truncates or corrupts data is caught, with
the exact position. Everything runs on trio, in the caller's tasks (no
threads), and every endpoint is bounded in time and volume.

The data pattern
----------------
A stream is keyed by a 64-bit ``seed``. Its byte at offset ``o`` is

* byte ``o mod 4096`` of the big-endian u64 ``o - o mod 4096`` when
  ``o mod 4096 < 8`` (every 4096-byte block starts with its own offset), else
* ``P[o mod 1048573]``, where ``P`` is the first 1048573 bytes of
  SHAKE128(``b"lbmr-dataplane/1"`` + big-endian u64 ``seed``).

Any position can be verified on its own; the period of ``P`` (odd, so it
drifts against the blocks) plus the offset stamps make every shift, loss or
repetition visible. Generation is a slice of a precomputed buffer plus one
8-byte stamp per 4 KiB (:class:`Pattern`, several GB/s).
:func:`topic_seed` derives per-topic seeds (used by ``lbmr-sim``).

TCP
---
:class:`TcpDataSource` is a live LBT-TCP source: one stream of LBMC data
messages (:mod:`lbmr_proto.lbmc`; topic index, sequence number and a payload
that is the pattern at ``sequence * 65536``, so any message can be checked on
its own) sent to every connected receiver on a clock (``rate`` messages per
second), never replayed: a receiver that connects starts at the next message;
the clock runs only while the source has receivers (a source nobody listens
to costs nothing). The slowest receiver paces the source (UM's default for TCP).
:class:`TcpDataReceiver` connects and verifies whole messages, one topic
index and consecutive sequence numbers from its first message, until it has
the payload bytes it expects; it can throttle its reads to play a slow
receiver. :mod:`.tcpbytes` keeps the older raw byte stream from offset 0 per
connection (:class:`TcpByteSource`, :class:`TcpByteReceiver`) for tests about
byte-transparent relays.

Requests, late join and OTR
---------------------------
:class:`UmTcpSource` (:mod:`.umtcp`) is a :class:`TcpDataSource` that sends
requests (messages of its stream with a REQUEST header naming its context's
request port) and keeps a retention buffer; :class:`UmTcpReceiver` responds
to requests, asks for retained messages when it joins (LJI_REQ) and for
missing ones (UME_RXREQ) as UIMs to the source's request port (named in its
TIR's late-join option), naming its context's request port, where the
source's answers come (UME_LJ_INFO, RETRANS). :class:`RequestPort`
(:mod:`.uim`) is that port: it counts responses per request index and hands
answers to the receivers that asked.

LBT-RU
------
:class:`RuLiveSource` (:mod:`.rulive`) is a live UM LBT-RU source
(:mod:`lbmr_proto.lbtru`): a receiver's CREQ gets a session message with
SYN (session id, client id), then the DATA of every message the clock makes
(:class:`.live.MessageClock`), each carrying one LBMC data message of the
stream as the TCP source makes it, to every confirmed receiver; nothing is
replayed, NAKs in a window get retransmissions, older ones an NCF, and the
source ends the session with an RST to each receiver. :class:`RuLiveReceiver`
connects, ACKs, and verifies whole messages and consecutive sequence numbers
from its first (the check :func:`.live.verify_message` the TCP receiver
uses); with ``nak`` it NAKs its gaps and takes the retransmissions, as a UM
receiver does (:class:`.live.Repair`). ``lbmr-sim`` uses these for LBT-RU,
with NAKs.

The LBT-RU-like datagram protocol
---------------------------------
The older, simplified protocol of our own, over UDP, unicast, one source
socket serving any number of receivers, one session per receiver from
sequence 0 (:class:`RuDataSource`, :class:`RuDataReceiver`; kept for the
router's tests and benchmarks of per-receiver datagram relaying).
All integers are big-endian; every datagram starts with an ASCII tag.

=============  ===================================================  =========
datagram       layout                                                 size
=============  ===================================================  =========
``RU-HELLO``   tag, u64 seed                                          16
``RU-DATA``    tag, u64 sequence, u16 payload length, payload         17 + n
``RU-END``     tag, u64 count                                         14
``RU-STATUS``  tag, u64 highest sequence (2**64-1: none), u64         26
               received count, u8 flags (0x01: END seen)
=============  ===================================================  =========

1. The receiver sends ``RU-HELLO`` with the seed it expects to the source's
   advertised (ip, port), again every ``hello_interval`` until the first
   datagram from that address arrives (at most ``hello_attempts`` times).
2. The source accepts a HELLO whose seed is its own, once per receiver
   address, and sends ``RU-DATA`` sequences 0..count-1 from the same socket
   to the address the HELLO came from, paced at ``rate`` datagrams per
   second. The payload of sequence ``q`` (``n`` bytes) is the pattern at
   offsets ``q * 65536 .. q * 65536 + n`` (it starts with the stamp
   ``q * 65536``).
3. Then it sends ``RU-END`` with the count, every ``end_interval`` until a
   STATUS with the END flag arrives, at most ``end_repeats`` times.
4. The receiver sends ``RU-STATUS`` every ``status_interval`` once data
   flows, and one with the END flag for every END it gets; it stays
   ``linger`` seconds after the first END, then reports.

There are no retransmissions: loss is counted, not repaired. Traffic flows
both ways (HELLO and STATUS towards the source, which counts the STATUS
datagrams), so a relay that forwards one direction only is noticed.

LBT-RM
------
Real LBT-RM datagrams (:mod:`lbmr_proto.lbtrm`) carrying the pattern:
:class:`RmDataSource` multicasts DATA, then session messages, and answers
NAKs with an NCF and retransmissions; :class:`RmDataReceiver` joins the
group, verifies, finds gaps and recovers them by NAK, optionally discarding
the first copy of some sequences on purpose (:mod:`.rm`).

UM's LBT-RU
-----------
:class:`UmRuDataReceiver` (:mod:`.umru`) speaks UM's own LBT-RU
(:mod:`lbmr_proto.lbtru`: CREQ, SM with SYN, DATA, ACK, NAK, NCF, RST) to a
source that does -- an lbmr-router's LBT-RU proxy of an LBT-RM source -- and
verifies and recovers like the LBT-RM receiver.
"""

from .live import MAX_MISSING, Repair, RepairCounts, StreamMismatch
from .pattern import (
    PATTERN_LEN,
    STAMP_INTERVAL,
    U64,
    U64_MAX,
    Pattern,
    check_seed,
    first_difference,
    pattern,
    rate_of,
    topic_seed,
)
from .rm import (
    RM_MAX_DATAGRAM,
    RM_MIN_DATAGRAM,
    RM_SEQ_SPACING,
    RmDataReceiver,
    RmDataSource,
    RmReceiveResult,
    encode_rm_data,
)
from .ru import (
    DATA_HDR,
    END,
    FLAG_END_SEEN,
    HELLO,
    NO_SEQ,
    RU_MAX_DATAGRAM,
    RU_MIN_DATAGRAM,
    RU_SEQ_SPACING,
    STATUS,
    TAG_DATA,
    TAG_END,
    TAG_HELLO,
    TAG_STATUS,
    RuDataReceiver,
    RuDataSource,
    RuReceiveResult,
    RuSession,
    encode_data,
    encode_end,
    encode_hello,
    encode_status,
    parse_datagram,
)
from .rulive import (
    LIVE_RU_MAX_DATAGRAM,
    LIVE_RU_MIN_DATAGRAM,
    RuClient,
    RuLiveReceiver,
    RuLiveReceiveResult,
    RuLiveSource,
    live_ru_payload,
)
from .tcp import (
    DEFAULT_MESSAGE_RATE,
    DEFAULT_MESSAGE_SIZE,
    MAX_PAYLOAD,
    TcpConnStats,
    TcpDataReceiver,
    TcpDataSource,
    TcpReceiveResult,
    data_message,
    message_payload,
)
from .tcpbytes import TcpByteConnStats, TcpByteReceiver, TcpByteReceiveResult, TcpByteSource
from .uim import (
    RESPONSE_SIZE,
    UIM_SIZE,
    RequestPort,
    RequestStats,
    Responder,
    UimSendReport,
    parse_uim_address,
    request_header,
    response_message,
    response_payload,
    send_by_domain,
    uim_by_domain,
    uim_payload,
)
from .umru import UmRuDataReceiver, UmRuReceiveResult
from .umtcp import UmTcpReceiver, UmTcpReceiveResult, UmTcpSource, retrans_message

__all__ = [
    "PATTERN_LEN", "STAMP_INTERVAL", "RU_SEQ_SPACING", "RU_MAX_DATAGRAM", "RU_MIN_DATAGRAM",
    "Pattern", "pattern", "topic_seed",
    "TcpDataSource", "TcpConnStats", "TcpDataReceiver", "TcpReceiveResult", "data_message",
    "message_payload", "DEFAULT_MESSAGE_RATE", "DEFAULT_MESSAGE_SIZE", "MAX_PAYLOAD",
    "TcpByteSource", "TcpByteConnStats", "TcpByteReceiver", "TcpByteReceiveResult",
    "RuDataSource", "RuSession", "RuDataReceiver", "RuReceiveResult",
    "encode_hello", "encode_data", "encode_end", "encode_status", "parse_datagram",
    "RM_MAX_DATAGRAM", "RM_MIN_DATAGRAM", "RM_SEQ_SPACING", "RmDataSource", "RmDataReceiver",
    "RmReceiveResult", "encode_rm_data", "UmRuDataReceiver", "UmRuReceiveResult",
    "RuLiveSource", "RuClient", "RuLiveReceiver", "RuLiveReceiveResult", "LIVE_RU_MIN_DATAGRAM",
    "LIVE_RU_MAX_DATAGRAM", "live_ru_payload",
    "RESPONSE_SIZE", "RequestPort", "RequestStats", "Responder", "request_header", "response_message",
    "UIM_SIZE", "UimSendReport", "parse_uim_address", "send_by_domain", "uim_by_domain", "uim_payload",
    "response_payload", "Repair", "RepairCounts", "MAX_MISSING", "StreamMismatch", "UmTcpReceiver", "UmTcpReceiveResult", "UmTcpSource", "retrans_message",
]
