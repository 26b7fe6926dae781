"""Late join and OTR across routers, sans-IO: where a receiver's late-join and
retransmission requests go, and how each hop rewrites them (``lbmr-router(8)``,
"Late join and OTR").

In UM a source that offers late join names its context's request port in its
TIR (late-join option 0x04 ``src_ip``/``src_tcp_port`` and its
``transport_idx``; UME option 0x01; extended-functionality option 0x0E). A
receiver sends its LJI_REQ (0x4E) or UME_RXREQ (0x15) there as a UIM, naming
that transport index, the topic index and its own request listener
(``req_ip``/``req_port``, ``rx_ip``/``rx_port``); the source connects there and
unicasts its answers (UME_LJ_INFO, then RETRANS messages).

Across routers:

* the proxy's TIR names the router's own request listener and, as transport
  index, the proxy's id in its portal (:func:`proxy_transport_index`; the
  advert id of the peer's advertisement), so that the receivers' router
  ("B") finds the proxied source of a request by its transport index alone
  (:class:`RecoverMessage` decisions of :class:`router.core.uim.UimPath`);
* B carries the request on a RECOVERY stream to the router it got the
  advertisement from, naming that advertisement and the receiver's address;
* the router behind the advertisement ("A") knows where its source takes
  requests (:func:`request_port_of` its TIR options, or, for a proxy of its
  own that it passes on, its own listener and that proxy's index) and
  rewrites each request (:func:`to_source`): the source's transport index,
  and as answer address a listener of A's own for that receiver
  (:class:`router.core.request_maps.RequestMap`); the source's answers there go
  back on the stream, and B writes them to the receiver, unchanged.

Byte order: everything on the wire is big-endian (network order); addresses
are dotted-quad IPv4 strings here.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from lbmr_proto import ExFuncOption, LateJoinOption, LBMRDecodeError, UmeOption
from lbmr_proto.topts import decode_tir_options

from .message_addresses import (
    LATE_JOIN_REQUEST,
    RETRANSMIT_REQUEST,
    AnswerHeader,
    find_header,
    packed_address,
    write_answer_at,
)

__all__ = ["SourceRequestPort", "RecoveryRequest", "request_port_of", "proxy_transport_index", "answer_from_source",
           "recovery_request", "to_source", "TRANSPORT_AT", "TOPIC_AT"]

#: byte offsets, from the header's first byte, of ``transport_idx`` and the topic index
#: (LJI_REQ ``topic_idx``, UME_RXREQ ``id_2``), both u32, in both request headers
TRANSPORT_AT = 8
TOPIC_AT = 12
_U32 = struct.Struct("!I")


class SourceRequestPort(NamedTuple):
    """Where a source takes late-join and OTR requests: its context's request port
    (``ip``, ``port``) and the ``transport_idx`` its requests must name."""

    ip: str
    port: int
    transport_idx: int


class RecoveryRequest(NamedTuple):
    """A late-join or retransmission request in one LBMC message: its ``header``
    (:data:`router.core.message_addresses.LATE_JOIN_REQUEST` or ``RETRANSMIT_REQUEST``) at byte
    ``offset``, and what it names: ``transport_idx``, ``topic_idx``, the answer address
    (``ip``, ``port``)."""

    header: AnswerHeader
    offset: int
    transport_idx: int
    topic_idx: int
    ip: str
    port: int


def request_port_of(tir_options: bytes) -> SourceRequestPort | None:
    """Where the source of a TIR whose UME, late-join and extended-functionality options
    are ``tir_options`` (as on the wire: an ADVERTISEMENT's field) takes requests: the
    late-join option's address and transport index, else the UME option's, else the
    extended-functionality option's (transport index 0); None when none names a port (or
    the bytes are not options)."""
    if not tir_options:
        return None
    try:
        opts, _ = decode_tir_options(struct.pack("!BBH", 0, 4, 4 + len(tir_options)) + tir_options, 0,
                                     4 + len(tir_options))
    except (LBMRDecodeError, struct.error):
        return None
    found: dict[type, SourceRequestPort] = {}
    for o in opts:
        if isinstance(o, LateJoinOption):
            found.setdefault(LateJoinOption, SourceRequestPort(o.src_ip_addr, o.src_tcp_port, o.transport_idx))
        elif isinstance(o, UmeOption):
            found.setdefault(UmeOption, SourceRequestPort(o.src_tcp_addr, o.src_tcp_port, o.transport_idx))
        elif isinstance(o, ExFuncOption):
            found.setdefault(ExFuncOption, SourceRequestPort(o.src_ip_addr, o.src_tcp_port, 0))
    for kind in (LateJoinOption, UmeOption, ExFuncOption):
        got = found.get(kind)
        if got is not None and got.port:
            return got
    return None


def proxy_transport_index(proxy_id: int) -> int:
    """The transport index a proxy's TIR names (late-join and UME options): its id in
    the portal (the advert id of the peer's advertisement it proxies; u32), unique among
    the portal's proxies, so a request's transport index names one proxy."""
    return proxy_id & 0xFFFFFFFF


def recovery_request(message: bytes | bytearray | memoryview) -> RecoveryRequest | None:
    """The first LJI_REQ or UME_RXREQ header of one LBMC message, or None.
    :class:`lbmr_proto.lbmc.LbmcDecodeError` for a malformed message
    (:func:`router.core.message_addresses.find_header`)."""
    for header in (LATE_JOIN_REQUEST, RETRANSMIT_REQUEST):
        found = find_header(message, header.code, header.size)
        if found:
            off = found[0]
            at = off + header.ip_at
            ip = ".".join(str(b) for b in bytes(message[at:at + 4]))
            port = struct.unpack_from("!H", message, off + header.port_at)[0]
            return RecoveryRequest(header, off, _U32.unpack_from(message, off + TRANSPORT_AT)[0],
                                   _U32.unpack_from(message, off + TOPIC_AT)[0], ip, port)
    return None


def to_source(message: bytes, source: SourceRequestPort, listener: tuple[str, int]) -> bytes | None:
    """``message`` as the router behind the advertisement delivers it to ``source``: every
    LJI_REQ and UME_RXREQ header in it names the source's transport index and, as
    answer address, ``listener`` (the router's listener for the receiver); the request
    index, topic index, sequence numbers and every other byte (so ``msglen``) unchanged.
    None when the message is no late-join or retransmission request (nothing else is
    passed to a source on a peer's word). LbmcDecodeError as :func:`recovery_request`;
    ValueError for a listener that is not IPv4 with a port."""
    packed = packed_address(*listener)
    out: bytearray | None = None
    for header in (LATE_JOIN_REQUEST, RETRANSMIT_REQUEST):
        for off in find_header(message, header.code, header.size):
            if out is None:
                out = bytearray(message)
            _U32.pack_into(out, off + TRANSPORT_AT, source.transport_idx & 0xFFFFFFFF)
            write_answer_at(out, off, header, packed)
    return None if out is None else bytes(out)


def answer_from_source(peer_ip: str, source_ip: str) -> bool:
    """Whether a connection from ``peer_ip`` to the router's listener for a request may
    carry the answers of the source at ``source_ip``: from the same address, or both on
    loopback (a host's contexts use several). Nobody else's bytes reach the receiver."""
    return peer_ip == source_ip or (peer_ip.startswith("127.") and source_ip.startswith("127."))
