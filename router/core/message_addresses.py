"""The addresses LBMC messages carry, read and written in place, sans-IO
(``lbmr-router(8)``, "Requests and responses" and "Unicast immediate messages
by domain").

In UM an *answer address* travels inside a message: a request (LBMC REQUEST
header, 0x04) names the requester's request listener, to which each responder
connects and sends its response UIMs, answering request index ``qidx``; a
late-join information request (LJI_REQ, 0x4E) and a retransmission request
(UME_RXREQ, 0x15) name the listener the answer is unicast to
(:class:`AnswerHeader`: :data:`REQUEST`, :data:`LATE_JOIN_REQUEST`,
:data:`RETRANSMIT_REQUEST`). :func:`find_header` finds the headers of one type
in a message, :func:`answer_at` reads one and :func:`write_answer_at` writes
its address (the headers have a fixed size, so ``msglen`` and everything else
stay as they are; :func:`rewrite_answer_address` does it for every such header
of a message). The maps that decide what an address is rewritten to are
:mod:`router.core.request_maps`.

A unicast immediate message addressed by domain carries a DESTINATION header
(0x64): :func:`destination_of` reads it, :func:`with_hops_taken` sets its hop
count (the routing of UIMs by domain is :mod:`router.core.uim`).
:func:`deliverable_address` says whether the router may connect to an address
a message from another TRD names.

Addresses are dotted-quad IPv4 strings and ports ints; on the wire both are
big-endian (network order).
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass
from typing import NamedTuple

from lbmr_proto import lbmc

__all__ = [
    "AnswerHeader", "REQUEST", "LATE_JOIN_REQUEST", "RETRANSMIT_REQUEST", "ANSWER_HEADERS",
    "AnswerAddress", "Destination", "find_header", "answer_at", "packed_address", "write_answer_at",
    "answer_address", "rewrite_answer_address",
    "destination_of", "with_hops_taken", "deliverable_address",
]


@dataclass(frozen=True, slots=True)
class AnswerHeader:
    """An LBMC header that names the address an answer goes to: its type ``code``, its
    ``size`` in bytes (``next_hdr`` and ``hdr_len`` included) and the byte offsets, from
    the header's first byte, of the request index (u32), the IPv4 address (4 bytes) and
    the port (u16), all big-endian."""

    name: str
    code: int
    size: int
    index_at: int
    ip_at: int
    port_at: int


#: REQUEST (0x04): the requester's request listener; the index is ``qidx``
REQUEST = AnswerHeader("REQUEST", 0x04, 16, 4, 12, 8)
#: LJI_REQ (0x4E): where the late-join information goes; the index is ``request_idx``
LATE_JOIN_REQUEST = AnswerHeader("LJI_REQ", 0x4E, 36, 4, 16, 20)
#: UME_RXREQ (0x15): where the retransmission goes; the index is ``request_idx``
RETRANSMIT_REQUEST = AnswerHeader("UME_RXREQ", 0x15, 28, 4, 24, 20)
ANSWER_HEADERS = (REQUEST, LATE_JOIN_REQUEST, RETRANSMIT_REQUEST)


class AnswerAddress(NamedTuple):
    """What an :class:`AnswerHeader` says: request ``index``, ``ip`` and ``port``."""

    index: int
    ip: str
    port: int


class Destination(NamedTuple):
    """A DESTINATION header (0x64): where a unicast immediate message goes (``domain_id``,
    ``ip``, ``port``), the routers it crossed (``hops_taken``) and its sender
    (``orig_domain_id``, ``orig_ip``, ``orig_port``)."""

    domain_id: int
    ip: str
    port: int
    hops_taken: int
    orig_domain_id: int
    orig_ip: str
    orig_port: int


_DESTINATION = lbmc.DestinationHeader.CODE
_DESTINATION_SIZE = lbmc.DestinationHeader.SIZE
_HOPS_AT = 14  # hops_taken (u16) within the DESTINATION header
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_DATA, _NONE = lbmc.NHDR_DATA, lbmc.NHDR_NONE


def find_header(message: bytes | bytearray | memoryview, code: int, size: int) -> tuple[int, ...]:
    """The offsets of every header of type ``code`` in one LBMC message (in chain order;
    empty if there is none). Each must be ``size`` bytes long. Walks the chain only (not
    the payload). A message whose chain is empty (its ``next_hdr``, byte 1, is DATA or
    NONE: most data messages) has none, and is not looked at further (its start is the
    framer's to check: :class:`lbmr_proto.lbmc_stream.StreamFramer`). Otherwise
    :class:`lbmr_proto.lbmc.LbmcDecodeError` (with the byte offset) for a message that is
    not one well-formed message: bad start, ``msglen`` other than the length, a header
    running past the end or of the wrong size."""
    n = len(message)
    if n < lbmc.CONTROL_HEADER.size:
        raise lbmc.LbmcDecodeError(0, f"{n} bytes: shorter than the 4-byte LBMC header")
    nxt = message[1]
    if nxt == _DATA or nxt == _NONE:
        return ()
    kind, msglen = lbmc.check_start(message)
    if msglen != n:
        raise lbmc.LbmcDecodeError(2, f"msglen {msglen} but the message has {n} bytes")
    off = lbmc.DATA_HEADER.size if kind in lbmc.DATA_KINDS else lbmc.CONTROL_HEADER.size
    found = []
    while nxt != _DATA and nxt != _NONE:
        if off + 2 > n:
            raise lbmc.LbmcDecodeError(off, f"header {nxt:#04x} announced but the message ends at byte {n}")
        hlen = message[off + 1]
        if hlen < lbmc.MIN_HDR_LEN or off + hlen > n:
            raise lbmc.LbmcDecodeError(off + 1, f"header {nxt:#04x} hdr_len {hlen} (at least "
                                                f"{lbmc.MIN_HDR_LEN}, within msglen {n})")
        if nxt == code:
            if hlen != size:
                raise lbmc.LbmcDecodeError(off + 1, f"header {code:#04x} hdr_len {hlen}, expected {size}")
            found.append(off)
        nxt = message[off]
        off += hlen
    return tuple(found)


def answer_at(message: bytes | bytearray | memoryview, offset: int, header: AnswerHeader) -> AnswerAddress:
    """What the ``header`` (e.g. :data:`REQUEST`) at byte ``offset`` of ``message`` says
    (an offset :func:`find_header` gave)."""
    at = offset + header.ip_at
    return AnswerAddress(_U32.unpack_from(message, offset + header.index_at)[0],
                         socket.inet_ntoa(bytes(message[at:at + 4])),
                         _U16.unpack_from(message, offset + header.port_at)[0])


def packed_address(ip: str, port: int) -> bytes:
    """``ip`` (an IPv4 dotted quad) and ``port`` (1..65535) as 4 + 2 bytes, network order,
    for :func:`write_answer_at`. ValueError for anything else."""
    if not (isinstance(port, int) and 0 < port <= 0xFFFF):
        raise ValueError(f"port {port!r} (1..65535)")
    try:
        return socket.inet_pton(socket.AF_INET, ip) + _U16.pack(port)
    except (OSError, TypeError):
        raise ValueError(f"not an IPv4 address: {ip!r}") from None


def write_answer_at(buf: bytearray, offset: int, header: AnswerHeader, packed: bytes) -> None:
    """Put the address ``packed`` (:func:`packed_address`) in the ``header`` at byte
    ``offset`` of ``buf``; the request index and every other byte stay. The one place
    the router writes an answer address (:func:`rewrite_answer_address`, and the message
    path's address rules, :mod:`router.core.message_path`)."""
    at = offset + header.ip_at
    buf[at:at + 4] = packed[:4]
    at = offset + header.port_at
    buf[at:at + 2] = packed[4:]


def answer_address(message: bytes | bytearray | memoryview, header: AnswerHeader) -> AnswerAddress | None:
    """The address the first ``header`` (e.g. :data:`REQUEST`) of one LBMC message names,
    or None if it has none. :class:`lbmr_proto.lbmc.LbmcDecodeError` as :func:`find_header`."""
    found = find_header(message, header.code, header.size)
    return answer_at(message, found[0], header) if found else None


def rewrite_answer_address(message: bytes, header: AnswerHeader, ip: str, port: int) -> bytes:
    """``message`` (one LBMC message) with the address of every ``header`` in it replaced
    by ``ip``:``port`` (the request index and every other byte unchanged, so ``msglen``
    too); ``message`` itself (no copy) when it has no such header. Every one, not only the
    first: no address of the origin's TRD crosses the router in a header of that type.
    :class:`lbmr_proto.lbmc.LbmcDecodeError` as :func:`find_header`; ValueError for an
    ``ip`` that is not IPv4 or a ``port`` outside 1..65535."""
    found = find_header(message, header.code, header.size)
    if not found:
        return message
    packed = packed_address(ip, port)
    out = bytearray(message)
    for off in found:
        write_answer_at(out, off, header, packed)
    return bytes(out)


def destination_of(message: bytes | bytearray | memoryview) -> Destination | None:
    """The first DESTINATION header of one LBMC message (a unicast immediate message
    addressed by domain), or None. :class:`lbmr_proto.lbmc.LbmcDecodeError` as
    :func:`find_header`."""
    found = find_header(message, _DESTINATION, _DESTINATION_SIZE)
    if not found:
        return None
    h = lbmc.DestinationHeader.unpack_body(message, found[0])
    return Destination(h.domain_id, h.ipaddr, h.port, h.hops_taken, h.orig_domain_id, h.orig_ipaddr,
                       h.orig_port)


def with_hops_taken(message: bytes, hops: int) -> bytes:
    """``message`` with ``hops_taken`` of its DESTINATION header(s) set to ``hops``
    (u16; every other byte unchanged); ``message`` itself if it has none."""
    found = find_header(message, _DESTINATION, _DESTINATION_SIZE)
    if not found:
        return message
    if not 0 <= hops <= 0xFFFF:
        raise ValueError(f"hops_taken {hops} (a u16)")
    out = bytearray(message)
    for off in found:
        _U16.pack_into(out, off + _HOPS_AT, hops)
    return bytes(out)


def deliverable_address(ip: str, endpoint_ip: str) -> bool:
    """Whether a router may connect to ``ip`` in the TRD of an endpoint portal whose
    interface address is ``endpoint_ip``, on the word of a message from elsewhere (a
    DESTINATION header): a unicast IPv4 address -- not unspecified (0.0.0.0 reaches the
    router's own host), multicast, broadcast or reserved (240/4) -- and loopback only when
    the endpoint itself is on loopback. Anything else (the TRD's own networks) is the
    operator's ACL."""
    try:
        a = ipaddress.IPv4Address(ip)
    except (ipaddress.AddressValueError, ValueError):
        return False
    if a.is_unspecified or a.is_multicast or a.is_reserved or a == ipaddress.IPv4Address("255.255.255.255"):
        return False
    if a.is_loopback:
        try:
            return ipaddress.IPv4Address(endpoint_ip).is_loopback
        except (ipaddress.AddressValueError, ValueError):
            return False
    return True
