"""Fast, dependency-free reading and writing of UDP-over-IPv4 packet captures.

Only the standard library is used.  Files given by path are memory-mapped (other
file objects are read ``CHUNK_SIZE`` bytes at a time), records are decoded with
precompiled :class:`struct.Struct` objects, and the common case (Ethernet + IPv4
without options + UDP, not fragmented) is parsed inline with a per-flow cache of
address strings, so iterating a classic pcap of small datagrams runs at over a
million datagrams per second even in CPython.

Reading
    :func:`read_udp` yields :class:`UdpDatagram` records from a classic pcap
    (micro- or nanosecond, either byte order) or a pcapng file (any number of
    sections and interfaces, either byte order, ``if_tsresol``/``if_tsoffset``;
    Enhanced, Simple and obsolete Packet Blocks).  Link types: Ethernet with
    802.1Q/802.1ad tags (stacked), Linux cooked SLL and SLL2, raw IPv4
    (101, 228, 12, 14), BSD null/loopback (0, 108).  IPv4 fragments are
    reassembled by a bounded :class:`Reassembler`.  :func:`read_frames` yields the
    raw link-layer frames instead.  Both also accept the capture as ``bytes``, and
    :func:`udp_from_frame` decodes a single frame, for sans-IO use.
    :func:`read_packets` yields, beside the UDP datagrams, every TCP segment
    (:class:`TcpSegment`) and every ICMP destination-unreachable error quoting a
    UDP datagram (:class:`IcmpError`): the transport-session decoders'
    input (:mod:`lbmr_proto.tcpstream` reassembles the TCP streams).

Writing
    :class:`PcapWriter` (classic pcap, little-endian) and :class:`PcapngWriter`
    (one section, little- or big-endian) write raw frames or synthesise
    Ethernet/IPv4/UDP frames, optionally fragmented to an MTU.

Conventions: timestamps are ``float`` seconds since the Unix epoch; addresses are
dotted-quad strings; ports and lengths are ints; all protocol header fields are
big-endian (network byte order) on the wire; the byte order of capture-file
headers is whatever the file declares.  A damaged capture file raises
:class:`CaptureError` carrying the byte offset of the bad record; damaged
*packets* are skipped silently.

This module is the public face; the work is done by private modules of
lbmr_proto, each importing only ones listed before it (and the codec's
``_wire``): ``_reassembly`` (bounded IPv4 reassembly), ``_udpframing``
(link-layer/IPv4/UDP decoding and frame building, shared by reading and
writing), ``_capfile`` (byte source, format magic numbers, result types,
:class:`CaptureError`), ``_pcapngread`` (the pcapng block loop), ``_pcapread``
(the classic pcap record loop, and the generator behind :func:`read_udp` with
its inline fast path), ``_ippackets`` (TCP segments and ICMP errors, for
:func:`read_packets`) and ``_capwrite`` (the writers).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

from . import _capfile, _pcapngread, _pcapread
from ._capfile import CHUNK_SIZE, MAX_RECORD_SIZE, CaptureError, RawFrame, UdpDatagram
from ._capwrite import PcapngWriter, PcapWriter, write_udp_pcap
from ._ippackets import (
    ICMP_PORT_UNREACHABLE,
    ICMP_UNREACHABLE,
    TCP_ACK,
    TCP_FIN,
    TCP_PSH,
    TCP_RST,
    TCP_SYN,
    IcmpError,
    TcpSegment,
    ip_packet,
    ip_packets,
)
from ._reassembly import MAX_DATAGRAM_SIZE, MAX_REASSEMBLY_BUFFERS, REASSEMBLY_TIMEOUT, Reassembler
from ._udpframing import (
    LINKTYPE_ETHERNET,
    LINKTYPE_IPV4,
    LINKTYPE_LINUX_SLL,
    LINKTYPE_LINUX_SLL2,
    LINKTYPE_LOOP,
    LINKTYPE_NULL,
    LINKTYPE_RAW,
    udp_frames,
    udp_from_frame,
)

__all__ = [
    "CaptureError", "UdpDatagram", "RawFrame", "Reassembler",
    "read_udp", "read_frames", "read_packets", "packet_from_frame", "TcpSegment", "IcmpError",
    "TCP_FIN", "TCP_SYN", "TCP_RST", "TCP_PSH", "TCP_ACK", "ICMP_UNREACHABLE", "ICMP_PORT_UNREACHABLE", "udp_from_frame", "udp_frames",
    "PcapWriter", "PcapngWriter", "write_udp_pcap",
    "MAX_REASSEMBLY_BUFFERS", "MAX_DATAGRAM_SIZE", "REASSEMBLY_TIMEOUT",
    "MAX_RECORD_SIZE", "CHUNK_SIZE",
    "LINKTYPE_NULL", "LINKTYPE_ETHERNET", "LINKTYPE_RAW", "LINKTYPE_LOOP",
    "LINKTYPE_LINUX_SLL", "LINKTYPE_IPV4", "LINKTYPE_LINUX_SLL2",
]

_new = tuple.__new__


def read_frames(path_or_fileobj, *, on_error: Callable[[CaptureError], Any] | None = None
                ) -> Iterator[RawFrame]:
    """Yield every captured frame as ``RawFrame(ts, linktype, data)``.

    ``path_or_fileobj`` is a path, a binary file object or the capture as bytes.  ``ts`` is in
    seconds since the epoch (0.0 for pcapng Simple Packet Blocks, which carry none).
    Errors behave as in :func:`read_udp`.
    """
    src = _capfile.CaptureSource(path_or_fileobj)
    try:
        buf = src.head()
        ng = buf[:4] == _capfile.PCAPNG_MAGIC
        records = _pcapngread.pcapng_records if ng else _pcapread.pcap_records
        for ts, lt, b, start, end, _, _ in records(src, buf):
            yield _new(RawFrame, (ts, lt, b[start:end]))
    except CaptureError as err:
        if on_error is None:
            raise
        on_error(err)
    finally:
        src.close()


def read_udp(path_or_fileobj: str | os.PathLike | BinaryIO | bytes, *,
             ports: Iterable[int] | None = None,
             on_error: Callable[[CaptureError], Any] | None = None,
             reassembler: Reassembler | None = None) -> Iterator[UdpDatagram]:
    """Yield the UDP/IPv4 datagrams of a pcap or pcapng capture as :class:`UdpDatagram`.

    ``path_or_fileobj`` is a path (memory-mapped), a binary file object (read from its
    current position; not closed) or the whole capture as bytes.  With ``ports``,
    datagrams whose source and destination ports are both outside it are skipped
    before their payload is copied.  Fragmented datagrams are reassembled (by
    ``reassembler`` if given, else a fresh :class:`Reassembler`).

    A truncated or corrupt file raises :class:`CaptureError` (after everything good
    before the bad record has been yielded).  If ``on_error`` is given it is called
    with the error instead, once, and iteration stops cleanly.  The file is opened
    lazily, on the first ``next()``.
    """
    return _pcapread.udp_datagrams(path_or_fileobj, None if ports is None else frozenset(ports),
                                   on_error, Reassembler() if reassembler is None else reassembler)


def read_packets(path_or_fileobj: str | os.PathLike | BinaryIO | bytes, *,
                 on_error: Callable[[CaptureError], Any] | None = None,
                 reassembler: Reassembler | None = None
                 ) -> Iterator[UdpDatagram | TcpSegment | IcmpError]:
    """Yield the UDP datagrams (:class:`UdpDatagram`, fragments reassembled), the
    TCP segments (:class:`TcpSegment`; IPv4 fragments of TCP are dropped) and the
    ICMP destination-unreachable errors quoting a UDP datagram (:class:`IcmpError`)
    of a pcap or pcapng capture, in capture order. Slower than :func:`read_udp`
    (no inline fast path). Sources and errors as in :func:`read_udp`.
    """
    return ip_packets(path_or_fileobj, on_error, Reassembler() if reassembler is None else reassembler)


def packet_from_frame(ts: float, linktype: int, frame: bytes, *, frame_number: int = 0,
                      reassembler: Reassembler | None = None) -> UdpDatagram | TcpSegment | IcmpError | None:
    """Decode one link-layer frame (sans-IO) as :func:`read_packets` does: a
    :class:`UdpDatagram` (with ``offset`` -1), a :class:`TcpSegment`, an
    :class:`IcmpError` or None. Pass the same ``reassembler`` for successive
    frames to reassemble UDP fragments (without one, fragments yield nothing)."""
    return ip_packet(ts, linktype, frame, 0, len(frame), frame_number, -1,
                     reassembler if reassembler is not None else Reassembler())
