"""Classic pcap reading, and the UDP datagram reader built on it.

A classic pcap file is a 24-byte header (magic, version, snaplen, link type)
then records of a 16-byte header (seconds, fraction, captured length, original
length) and the captured bytes.  The byte order of both headers is the one the
magic number declares (:data:`~lbmr_proto._capfile.PCAP_MAGICS`); the fraction
is in micro- or nanoseconds; lengths and offsets are in bytes.

:func:`pcap_records` yields every record's frame as a slice of the buffer.
:func:`udp_datagrams` reads a pcap or pcapng capture into :class:`UdpDatagram`
records: pcapng through the block loop of :mod:`lbmr_proto._pcapngread`, classic
pcap with Ethernet + IPv4 without options + unfragmented UDP decoded in place
and a per-flow cache of address strings, which is what lets it read over a
million small datagrams per second in CPython.  Anything else goes through the
general link-layer/IPv4/UDP decoder of :mod:`lbmr_proto._udpframing`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from ._capfile import (
    MAX_RECORD_SIZE,
    PCAP_MAGICS,
    PCAPNG_MAGIC,
    CaptureError,
    CaptureSource,
    UdpDatagram,
    refill,
)
from ._pcapngread import pcapng_records
from ._reassembly import Reassembler
from ._udpframing import LINKTYPE_ETHERNET, ip_start, ipv4_udp
from ._wire import ip_text

_new = tuple.__new__
_PORTS = struct.Struct("!HH").unpack_from
# From Ethernet byte 12: (ethertype<<16 | vihl<<8 | tos), total length, (flags/frag<<16 | ttl<<8 | proto),
# src+dst+sport+dport (12 bytes), UDP length.
_FAST = struct.Struct("!IH2xI2x12sH").unpack_from


def _flow(cache: dict, key: bytes, ports) -> tuple | None:
    """Cache entry for src+dst+sport+dport bytes: (src, sport, dst, dport), or None if
    neither port is in ``ports``."""
    if len(cache) >= 65536:
        cache.clear()
    sp, dp = _PORTS(key, 8)
    f = None
    if ports is None or sp in ports or dp in ports:
        f = (ip_text(key[:4]), sp, ip_text(key[4:8]), dp)
    cache[key] = f
    return f


def _pcap_header(buf: bytes) -> tuple[str, int, int]:
    order, ticks = PCAP_MAGICS[buf[:4]]
    network = struct.unpack_from(order + "I", buf, 20)[0]
    return order, ticks, network & 0x03FFFFFF    # upper bits carry FCS information


def pcap_records(src: CaptureSource, buf: bytes) -> Iterator[tuple]:
    """Classic pcap -> (ts, linktype, buf, start, end, frame, offset)."""
    order, ticks, lt = _pcap_header(buf)
    rec = struct.Struct(order + "III4x").unpack_from
    base, pos, frame = 0, 24, 0
    while True:
        n = len(buf)
        need = 16
        while pos + 16 <= n:
            sec, frac, incl = rec(buf, pos)
            end = pos + 16 + incl
            if end > n:
                if incl > MAX_RECORD_SIZE:
                    raise CaptureError(src.name, base + pos, f"implausible record length {incl}")
                need = 16 + incl
                break
            frame += 1
            yield sec + frac / ticks, lt, buf, pos + 16, end, frame, base + pos
            pos = end
        buf = refill(src, buf, pos, need, "record", base)
        if buf is None:
            return
        base += pos
        pos = 0


def udp_datagrams(source, ports, on_error, reasm: Reassembler) -> Iterator[UdpDatagram]:
    """The generator behind :func:`lbmr_proto.capture.read_udp`, arguments already checked:
    ``ports`` is a frozenset or None, ``reasm`` the reassembler to use.

    pcapng goes through :func:`~lbmr_proto._pcapngread.pcapng_records`; classic pcap runs
    the record loop of :func:`pcap_records` with the common case inlined.  Both loops sit
    in this one generator: delegating to another generator per datagram costs several
    per cent of throughput.
    """
    src = CaptureSource(source)
    try:
        buf = src.head()
        if buf[:4] == PCAPNG_MAGIC:
            for ts, lt, b, start, end, frame, off in pcapng_records(src, buf):
                ip = ip_start(lt, b, start, end)
                if ip >= 0:
                    r = ipv4_udp(b, ip, end, ts, ports, reasm)
                    if r is not None:
                        yield _new(UdpDatagram, (ts, *r, frame, off))
            return
        # Classic pcap: the record loop of pcap_records with the common case inlined.
        order, ticks, lt = _pcap_header(buf)
        ticks = float(ticks)
        rec = struct.Struct(order + "III4x").unpack_from
        fast, new, UD = _FAST, _new, UdpDatagram
        fast_min = 42 if lt == LINKTYPE_ETHERNET else 1 << 62   # smallest frame for the fast path
        flows: dict[bytes, Any] = {}    # src+dst+sport+dport -> (src, sport, dst, dport) or None
        base, pos, frame = 0, 24, 0
        while True:
            n = len(buf)
            last = n - 16           # last offset where a record header fits
            need = 16
            while pos <= last:
                sec, frac, incl = rec(buf, pos)
                end = pos + 16 + incl
                if end > n:
                    if incl > MAX_RECORD_SIZE:
                        raise CaptureError(src.name, base + pos, f"implausible record length {incl}")
                    need = 16 + incl
                    break
                frame += 1
                if incl >= fast_min:
                    a, tl, b, flow, ul = fast(buf, pos + 28)
                    # IPv4, IHL 5, UDP, not a fragment, UDP length == IP length - 20, all captured
                    if a >> 8 == 0x080045 and b & 0x3FFF00FF == 17 and 8 <= ul == tl - 20 <= incl - 34:
                        try:
                            f = flows[flow]
                        except KeyError:
                            f = _flow(flows, flow, ports)
                        if f is not None:
                            s, sp, d, dp = f
                            yield new(UD, (sec + frac / ticks, s, sp, d, dp,
                                           buf[pos + 58:pos + 50 + ul], frame, base + pos))
                        pos = end
                        continue
                ip = ip_start(lt, buf, pos + 16, end)
                if ip >= 0:
                    ts = sec + frac / ticks
                    r = ipv4_udp(buf, ip, end, ts, ports, reasm)
                    if r is not None:
                        yield new(UD, (ts, *r, frame, base + pos))
                pos = end
            buf = refill(src, buf, pos, need, "record", base)
            if buf is None:
                return
            base += pos
            pos = 0
    except CaptureError as err:
        if on_error is None:
            raise
        on_error(err)
    finally:
        src.close()


