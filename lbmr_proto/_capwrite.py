"""Capture writing: classic pcap and pcapng writers, and a one-call pcap of UDP
datagrams.

:class:`PcapWriter` writes a classic pcap file (version 2.4, little-endian,
micro- or nanosecond timestamps); :class:`PcapngWriter` one pcapng section
(little- or big-endian, any number of interfaces, any ``if_tsresol``).  Both take
raw link-layer frames or synthesise Ethernet/IPv4/UDP frames (see
:func:`~lbmr_proto._udpframing.udp_frames`; header fields big-endian),
optionally fragmented to an MTU in bytes.  Timestamps are ``float`` seconds
since the Unix epoch, rounded to the file's resolution.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Iterable

from ._udpframing import LINKTYPE_ETHERNET, udp_frames


def _split_ts(ts: float, ticks: int) -> tuple[int, int]:
    """Seconds -> (whole seconds, fraction in 1/ticks)."""
    sec = math.floor(ts)
    frac = round((ts - sec) * ticks)
    if frac >= ticks:
        sec, frac = sec + 1, frac - ticks
    return sec, frac


class _Writer:
    def _open(self, fileobj_or_path) -> None:
        if isinstance(fileobj_or_path, (str, os.PathLike)):
            self._f = open(fileobj_or_path, "wb", buffering=1 << 20)
            self._own = True
        else:
            self._f, self._own = fileobj_or_path, False
        self._write = self._f.write

    def close(self) -> None:
        """Flush; close the file if this writer opened it."""
        if self._f is None:
            return
        self._f.flush()
        if self._own:
            self._f.close()
        self._f = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class PcapWriter(_Writer):
    """Write a classic little-endian pcap file (version 2.4).

    ``fileobj_or_path`` is a binary file object (left open by :meth:`close`) or a path
    (created or truncated).  Timestamps are seconds since the epoch, stored with micro- or
    (``nanosecond=True``) nanosecond resolution.
    """

    def __init__(self, fileobj_or_path, linktype: int = LINKTYPE_ETHERNET, nanosecond: bool = False,
                 *, snaplen: int = 262144) -> None:
        self.linktype = linktype
        self._ticks = 1_000_000_000 if nanosecond else 1_000_000
        self._rec = struct.Struct("<IIII").pack
        self._open(fileobj_or_path)
        self._write(struct.pack("<IHHiIII", 0xA1B23C4D if nanosecond else 0xA1B2C3D4,
                                2, 4, 0, 0, snaplen, linktype))

    def write_frame(self, ts: float, frame: bytes) -> None:
        """Append one record holding the link-layer ``frame`` captured at ``ts`` seconds."""
        sec, frac = _split_ts(ts, self._ticks)
        self._write(self._rec(sec, frac, len(frame), len(frame)))
        self._write(frame)

    def write_udp(self, ts: float, src: str, sport: int, dst: str, dport: int, payload: bytes,
                  *, ip_id: int = 0, mtu: int | None = None) -> None:
        """Append a UDP/IPv4 datagram (several records if fragmented; see :func:`udp_frames`)."""
        for frame in udp_frames(self.linktype, src, sport, dst, dport, payload, ip_id=ip_id, mtu=mtu):
            self.write_frame(ts, frame)


class PcapngWriter(_Writer):
    """Write a minimal pcapng file: one Section Header Block, Interface Description
    Blocks and Enhanced Packet Blocks.

    The constructor declares interface 0 with ``linktype``; :meth:`add_interface`
    declares more.  ``tsresol`` is the raw ``if_tsresol`` byte (6 = microseconds,
    9 = nanoseconds, ``0x80 | n`` = 2**-n seconds).  ``big_endian`` selects the
    section's byte order.
    """

    def __init__(self, fileobj_or_path, linktype: int = LINKTYPE_ETHERNET, *, tsresol: int = 6,
                 snaplen: int = 0, big_endian: bool = False) -> None:
        self._order = ">" if big_endian else "<"
        self._ifaces: list[tuple[int, int]] = []     # linktype, ticks per second
        self._open(fileobj_or_path)
        o = self._order
        self._write(struct.pack(o + "IIIHHqI", 0x0A0D0D0A, 28, 0x1A2B3C4D, 1, 0, -1, 28))
        self.add_interface(linktype, tsresol=tsresol, snaplen=snaplen)

    def add_interface(self, linktype: int, *, tsresol: int = 6, snaplen: int = 0) -> int:
        """Declare an interface; returns its id for ``interface=``."""
        o = self._order
        opts = b""
        if tsresol != 6:
            opts = struct.pack(o + "HHB3x", 9, 1, tsresol) + struct.pack(o + "HH", 0, 0)
        blen = 20 + len(opts)
        self._write(struct.pack(o + "IIHHI", 1, blen, linktype, 0, snaplen) + opts
                    + struct.pack(o + "I", blen))
        self._ifaces.append((linktype, 2 ** (tsresol & 0x7F) if tsresol & 0x80 else 10 ** tsresol))
        return len(self._ifaces) - 1

    def write_frame(self, ts: float, frame: bytes, *, interface: int = 0) -> None:
        """Append an Enhanced Packet Block for ``frame`` captured at ``ts`` seconds."""
        ticks = self._ifaces[interface][1]
        sec, frac = _split_ts(ts, ticks)
        t = sec * ticks + frac
        pad = -len(frame) & 3
        blen = 32 + len(frame) + pad
        o = self._order
        self._write(struct.pack(o + "IIIIIII", 6, blen, interface, t >> 32, t & 0xFFFFFFFF,
                                len(frame), len(frame)) + frame + bytes(pad) + struct.pack(o + "I", blen))

    def write_udp(self, ts: float, src: str, sport: int, dst: str, dport: int, payload: bytes,
                  *, ip_id: int = 0, mtu: int | None = None, interface: int = 0) -> None:
        """Append a UDP/IPv4 datagram on ``interface`` (see :func:`udp_frames`)."""
        for frame in udp_frames(self._ifaces[interface][0], src, sport, dst, dport, payload,
                                ip_id=ip_id, mtu=mtu):
            self.write_frame(ts, frame, interface=interface)


def write_udp_pcap(path, datagrams: Iterable[tuple], *, linktype: int = LINKTYPE_ETHERNET,
                   nanosecond: bool = False, mtu: int | None = None) -> int:
    """Write ``(ts, src, sport, dst, dport, payload)`` tuples to a classic pcap file.

    IP ids count up from 1 (modulo 65536), so fragments of neighbouring datagrams
    never mix.
    Returns the number of datagrams written.
    """
    n = 0
    with PcapWriter(path, linktype, nanosecond) as w:
        for n, (ts, src, sport, dst, dport, payload) in enumerate(datagrams, 1):
            w.write_udp(ts, src, sport, dst, dport, payload, ip_id=n, mtu=mtu)
    return n
