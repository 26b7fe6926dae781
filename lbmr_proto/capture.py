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

Writing
    :class:`PcapWriter` (classic pcap, little-endian) and :class:`PcapngWriter`
    (one section, little- or big-endian) write raw frames or synthesise
    Ethernet/IPv4/UDP frames, optionally fragmented to an MTU.

Over 600 lines because reading and writing share the link-layer and IPv4/UDP
header code and its byte-order conventions; each half is a section of its own.

Conventions: timestamps are ``float`` seconds since the Unix epoch; addresses are
dotted-quad strings; ports and lengths are ints; all protocol header fields are
big-endian (network byte order) on the wire; the byte order of capture-file
headers is whatever the file declares.  A damaged capture file raises
:class:`CaptureError` carrying the byte offset of the bad record; damaged
*packets* are skipped silently.

Over 600 lines: pcap and pcapng reading, IPv4 reassembly and the two writers
share the link-layer and record-layout tables and the inline fast path, which
is what makes reading run at a million datagrams per second.
"""

from __future__ import annotations

import ipaddress
import math
import mmap
import os
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO, NamedTuple

__all__ = [
    "CaptureError", "UdpDatagram", "RawFrame", "Reassembler",
    "read_udp", "read_frames", "udp_from_frame", "udp_frames",
    "PcapWriter", "PcapngWriter", "write_udp_pcap",
    "MAX_REASSEMBLY_BUFFERS", "MAX_DATAGRAM_SIZE", "REASSEMBLY_TIMEOUT",
    "MAX_RECORD_SIZE", "CHUNK_SIZE",
    "LINKTYPE_NULL", "LINKTYPE_ETHERNET", "LINKTYPE_RAW", "LINKTYPE_LOOP",
    "LINKTYPE_LINUX_SLL", "LINKTYPE_IPV4", "LINKTYPE_LINUX_SLL2",
]

#: Most IPv4 datagrams being reassembled at once; the oldest is evicted beyond this.
MAX_REASSEMBLY_BUFFERS = 1024
#: Largest reassembled IPv4 payload (bytes); fragments reaching past it are dropped.
MAX_DATAGRAM_SIZE = 65535
#: Incomplete fragment sets older than this (seconds of capture time) are dropped.
REASSEMBLY_TIMEOUT = 30.0
#: Records or blocks longer than this (bytes) are treated as file corruption.
MAX_RECORD_SIZE = 1 << 24
#: How much of the file is read at a time (bytes).
CHUNK_SIZE = 1 << 22

LINKTYPE_NULL = 0          # 4-byte address family in the capturing host's byte order
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101         # raw IPv4 or IPv6
LINKTYPE_LOOP = 108        # OpenBSD loopback: address family big-endian
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_LINUX_SLL2 = 276
_RAW_LINKTYPES = frozenset((LINKTYPE_RAW, LINKTYPE_IPV4, 12, 14))   # 12/14: DLT_RAW on BSDs
_VLAN_TPIDS = frozenset((0x8100, 0x88A8, 0x9100))


class CaptureError(ValueError):
    """The capture file is truncated or corrupt.

    ``path`` names the file (or ``'<bytes>'`` / ``'<stream>'``), ``offset`` is the
    byte offset in the file of the bad record, block or header, ``reason`` says why.
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(path, offset, reason)
        self.path, self.offset, self.reason = path, offset, reason

    def __str__(self) -> str:
        return f"{self.path}: byte offset {self.offset}: {self.reason}"


class UdpDatagram(NamedTuple):
    """One UDP datagram from a capture.

    ``ts`` is seconds since the epoch; ``frame`` the 1-based number (as Wireshark
    numbers them) of the frame that completed the datagram (the last fragment, for a
    reassembled one) and ``offset`` the byte offset of that frame's record (pcap) or
    block (pcapng) in the file.
    """

    ts: float
    src: str
    sport: int
    dst: str
    dport: int
    payload: bytes
    frame: int
    offset: int


class RawFrame(NamedTuple):
    """A captured link-layer frame: ``ts`` in seconds since the epoch, the file's or
    interface's link type, and the captured bytes."""

    ts: float
    linktype: int
    data: bytes


# --------------------------------------------------------------------------- helpers

_new = tuple.__new__
_U16 = struct.Struct("!H").unpack_from
_IP = struct.Struct("!BxHHHxB2x4s4s").unpack_from     # vihl, total len, id, flags/frag, proto, src, dst
_UDP = struct.Struct("!HHH").unpack_from              # sport, dport, length
# From Ethernet byte 12: (ethertype<<16 | vihl<<8 | tos), total length, (flags/frag<<16 | ttl<<8 | proto),
# src+dst+sport+dport (12 bytes), UDP length.
_FAST = struct.Struct("!IH2xI2x12sH").unpack_from

_ADDRS: dict[bytes, str] = {}


def _addr(b: bytes) -> str:
    s = _ADDRS.get(b)
    if s is None:
        if len(_ADDRS) >= 65536:
            _ADDRS.clear()
        s = _ADDRS[b] = f"{b[0]}.{b[1]}.{b[2]}.{b[3]}"
    return s


def _flow(cache: dict, key: bytes, ports) -> tuple | None:
    """Cache entry for src+dst+sport+dport bytes: (src, sport, dst, dport), or None if
    neither port is in ``ports``."""
    if len(cache) >= 65536:
        cache.clear()
    sp, dp = _U16(key, 8)[0], _U16(key, 10)[0]
    f = None
    if ports is None or sp in ports or dp in ports:
        f = (_addr(key[:4]), sp, _addr(key[4:8]), dp)
    cache[key] = f
    return f


class Reassembler:
    """IPv4 fragment reassembly with bounded memory.

    At most ``max_buffers`` datagrams are pending (the oldest is evicted to make room),
    none grows past :data:`MAX_DATAGRAM_SIZE` bytes, and a datagram whose first
    fragment is more than ``timeout`` seconds (capture time) older than the newest
    fragment is dropped.  Fragments may arrive in any order; overlapping or duplicate
    data simply overwrites earlier data.
    """

    __slots__ = ("max_buffers", "timeout", "_pending")

    def __init__(self, max_buffers: int = MAX_REASSEMBLY_BUFFERS,
                 timeout: float = REASSEMBLY_TIMEOUT) -> None:
        self.max_buffers = max_buffers
        self.timeout = timeout
        # key -> [first ts, bytearray data, bytearray coverage mask, covered bytes, total or -1]
        self._pending: OrderedDict[Any, list] = OrderedDict()

    def __len__(self) -> int:
        """Number of incomplete datagrams currently buffered."""
        return len(self._pending)

    def clear(self) -> None:
        self._pending.clear()

    def feed(self, ts: float, key: Any, offset: int, more: bool, data: bytes) -> bytes | None:
        """Add one fragment; return the whole IP payload once it is complete.

        ``offset`` is the fragment offset in bytes (the header field times 8), ``more``
        the MF flag, ``key`` identifies the datagram (e.g. src, dst, id, protocol).
        Work per fragment is proportional to its length (a byte mask tracks coverage).
        """
        pending = self._pending
        while pending:
            first = next(iter(pending.values()))
            if ts - first[0] <= self.timeout:
                break
            pending.popitem(last=False)
        end = offset + len(data)
        entry = pending.get(key)
        if end > MAX_DATAGRAM_SIZE:
            if entry is not None:
                del pending[key]
            return None
        if entry is None:
            while pending and len(pending) >= self.max_buffers:
                pending.popitem(last=False)
            entry = pending[key] = [ts, bytearray(), bytearray(), 0, -1]
        buf = entry[1]
        mask = entry[2]
        if len(buf) < end:
            grow = end - len(buf)
            buf.extend(bytes(grow))
            mask.extend(bytes(grow))
        buf[offset:end] = data
        entry[3] += mask.count(0, offset, end)  # bytes covered for the first time
        mask[offset:end] = b"\x01" * (end - offset)
        if not more:
            entry[4] = end
        total = entry[4]
        if total >= 0 and len(buf) == total and entry[3] == total:
            del pending[key]
            return bytes(buf)
        return None


def _ip_start(lt: int, buf: bytes, start: int, end: int) -> int:
    """Offset of the IPv4 header inside the frame ``buf[start:end]``, or -1."""
    if lt == LINKTYPE_ETHERNET:
        p = start + 12
        if p + 2 > end:
            return -1
        et = _U16(buf, p)[0]
        while et in _VLAN_TPIDS and p + 6 <= end:
            p += 4
            et = _U16(buf, p)[0]
        return p + 2 if et == 0x0800 else -1
    if lt in _RAW_LINKTYPES:
        return start
    if lt == LINKTYPE_LINUX_SLL:
        return start + 16 if end - start >= 16 and buf[start + 14:start + 16] == b"\x08\x00" else -1
    if lt == LINKTYPE_LINUX_SLL2:
        return start + 20 if end - start >= 20 and buf[start:start + 2] == b"\x08\x00" else -1
    if lt == LINKTYPE_NULL:
        return start + 4 if buf[start:start + 4] in (b"\x02\0\0\0", b"\0\0\0\x02") else -1
    if lt == LINKTYPE_LOOP:
        return start + 4 if buf[start:start + 4] == b"\0\0\0\x02" else -1
    return -1


def _udp_in(buf: bytes, u: int, uend: int, s4: bytes, d4: bytes, ports) -> tuple | None:
    """Decode the UDP header at ``buf[u:uend]`` -> (src, sport, dst, dport, payload)."""
    if u + 8 > uend:
        return None
    sp, dp, ul = _UDP(buf, u)
    if ports is not None and sp not in ports and dp not in ports:
        return None
    return (_addr(s4), sp, _addr(d4), dp, buf[u + 8:u + ul if 8 <= ul <= uend - u else uend])


def _ipv4_udp(buf: bytes, ip: int, end: int, ts: float, ports, reasm: Reassembler) -> tuple | None:
    """Decode IPv4 (+ reassembly) and UDP at ``buf[ip:end]``."""
    if ip + 20 > end:
        return None
    vihl, tl, ident, ff, proto, s4, d4 = _IP(buf, ip)
    hl = (vihl & 15) * 4
    if vihl >> 4 != 4 or proto != 17 or hl < 20 or tl < hl:
        return None
    truncated = tl > end - ip          # snaplen cut the packet short
    ip_end = end if truncated else ip + tl
    if ff & 0x3FFF:
        if truncated or ip + hl > ip_end:
            return None
        data = reasm.feed(ts, (s4, d4, ident, proto), (ff & 0x1FFF) * 8, bool(ff & 0x2000),
                          buf[ip + hl:ip_end])
        return None if data is None else _udp_in(data, 0, len(data), s4, d4, ports)
    return _udp_in(buf, ip + hl, ip_end, s4, d4, ports)


def udp_from_frame(ts: float, linktype: int, frame: bytes, *, ports=None,
                   reassembler: Reassembler | None = None) -> tuple | None:
    """Decode one link-layer frame (sans-IO).

    Returns ``(src, sport, dst, dport, payload)`` for a UDP/IPv4 datagram, or ``None``
    for anything else.  Pass the same ``reassembler`` for successive frames to
    reassemble fragments (``ts`` in seconds drives its timeout); without one,
    fragments yield nothing.
    """
    ip = _ip_start(linktype, frame, 0, len(frame))
    if ip < 0:
        return None
    return _ipv4_udp(frame, ip, len(frame), ts, ports,
                     reassembler if reassembler is not None else Reassembler())


# --------------------------------------------------------------------------- input

class _Source:
    """Where the capture bytes come from: a memory-mapped file (or, if it cannot be
    mapped, the file read in chunks), a binary file object read in ``CHUNK_SIZE``
    pieces, or an in-memory buffer.  ``read(n)`` returns a bytes-like object, empty
    at the end of the data."""

    __slots__ = ("name", "read", "_closers")

    def __init__(self, source) -> None:
        self._closers: list[Callable[[], Any]] = []
        if isinstance(source, (bytes, bytearray, memoryview)):
            self.name = "<bytes>"
            self._once(bytes(source))
        elif isinstance(source, (str, os.PathLike)):
            self.name = os.fsdecode(source)
            f = open(source, "rb", buffering=0)
            self._closers.append(f.close)
            try:
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):       # empty file, pipe, ...
                self.read = f.read
            else:
                self._closers.insert(0, m.close)
                self._once(m)
        else:
            name = getattr(source, "name", None)
            self.name = name if isinstance(name, str) else "<stream>"
            self.read = source.read

    def _once(self, data) -> None:
        chunks = [data]
        self.read = lambda n: chunks.pop() if chunks else b""

    def close(self) -> None:
        for close in self._closers:
            close()

    def head(self):
        """At least 24 bytes (or the whole file), checked for a known magic number."""
        buf = self.read(CHUNK_SIZE)
        while len(buf) < 24:
            chunk = self.read(CHUNK_SIZE)
            if not chunk:
                break
            buf = bytes(buf) + chunk
        magic = buf[:4]
        if magic == _PCAPNG_MAGIC:
            return buf
        if magic in _PCAP_MAGICS:
            if len(buf) < 24:
                raise CaptureError(self.name, 0, "truncated pcap file header")
            return buf
        if not buf:
            raise CaptureError(self.name, 0, "empty file (no capture header)")
        if magic[:2] == b"\x1f\x8b":
            raise CaptureError(self.name, 0, "gzip-compressed capture; decompress it first")
        raise CaptureError(self.name, 0, f"unknown file magic 0x{magic.hex()} (not pcap or pcapng)")


_PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"
_PCAP_MAGICS = {   # magic bytes as stored -> (struct byte order, ticks per second)
    b"\xd4\xc3\xb2\xa1": ("<", 1_000_000), b"\xa1\xb2\xc3\xd4": (">", 1_000_000),
    b"\x4d\x3c\xb2\xa1": ("<", 1_000_000_000), b"\xa1\xb2\x3c\x4d": (">", 1_000_000_000),
}


def _pcap_header(buf: bytes) -> tuple[str, int, int]:
    order, ticks = _PCAP_MAGICS[buf[:4]]
    network = struct.unpack_from(order + "I", buf, 20)[0]
    return order, ticks, network & 0x03FFFFFF    # upper bits carry FCS information


def _refill(src: _Source, buf: bytes, pos: int, need: int, what: str, base: int) -> bytes | None:
    """``buf[pos:]`` plus more file data, or None at a clean end of file."""
    chunk = src.read(max(CHUNK_SIZE, need))
    if chunk:
        return buf[pos:] + chunk
    if pos < len(buf):
        raise CaptureError(src.name, base + pos,
                           f"truncated {what}: {len(buf) - pos} of {need} bytes present")
    return None


def _pcap_records(src: _Source, buf: bytes) -> Iterator[tuple]:
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
        buf = _refill(src, buf, pos, need, "record", base)
        if buf is None:
            return
        base += pos
        pos = 0


def _idb_options(buf: bytes, p: int, end: int, order: str) -> tuple[int, int]:
    """(ticks per second, offset in seconds) from an Interface Description Block."""
    ticks, offset = 1_000_000, 0
    hh = order + "HH"
    while p + 4 <= end:
        code, length = struct.unpack_from(hh, buf, p)
        p += 4
        if code == 0 or p + length > end:
            break
        if code == 9 and length >= 1:       # if_tsresol
            v = buf[p]
            ticks = 2 ** (v & 0x7F) if v & 0x80 else 10 ** v
        elif code == 14 and length >= 8:    # if_tsoffset
            offset = struct.unpack_from(order + "q", buf, p)[0]
        p += (length + 3) & ~3
    return ticks, offset


_NG_OTHER_RECORDS = frozenset((9, 0x0BAD, 0x40000BAD))    # systemd journal export, custom blocks


def _pcapng_records(src: _Source, buf: bytes) -> Iterator[tuple]:
    """pcapng -> (ts, linktype, buf, start, end, frame, offset).

    Frames are numbered as Wireshark does: packet blocks, plus custom and systemd
    journal blocks (which yield nothing here)."""
    name = src.name
    base = pos = frame = 0
    order = ""
    ifaces: list[tuple[int, int, int, int]] = []     # linktype, ticks/s, ts offset, snaplen
    while True:
        n = len(buf)
        need = 12
        if pos + 12 <= n:
            if buf[pos:pos + 4] == _PCAPNG_MAGIC:
                bom = buf[pos + 8:pos + 12]
                if bom == b"\x4d\x3c\x2b\x1a":
                    order = "<"
                elif bom == b"\x1a\x2b\x3c\x4d":
                    order = ">"
                else:
                    raise CaptureError(name, base + pos, f"bad pcapng byte-order magic 0x{bom.hex()}")
                u32, hdr = struct.Struct(order + "I").unpack_from, struct.Struct(order + "II").unpack_from
                epb = struct.Struct(order + "IIII").unpack_from
                pb = struct.Struct(order + "HxxIII").unpack_from
                ifaces = []
            btype, blen = hdr(buf, pos)
            if blen < 12 or blen & 3 or blen > MAX_RECORD_SIZE:
                raise CaptureError(name, base + pos, f"bad block length {blen} (block type 0x{btype:x})")
            need = blen
            if pos + blen <= n:
                bend = pos + blen - 4
                if u32(buf, bend)[0] != blen:
                    raise CaptureError(name, base + pos, "block trailing length does not match")
                data = -1
                if btype == 6 or btype == 2:            # Enhanced / obsolete Packet Block
                    if blen < 32:
                        raise CaptureError(name, base + pos, "packet block too short")
                    if btype == 6:
                        ifid, hi, lo, caplen = epb(buf, pos + 8)
                    else:
                        ifid, hi, lo, caplen = pb(buf, pos + 8)
                    data = pos + 28
                elif btype == 3:                        # Simple Packet Block
                    if blen < 16:
                        raise CaptureError(name, base + pos, "simple packet block too short")
                    ifid, hi, lo, caplen = 0, 0, 0, min(u32(buf, pos + 8)[0], blen - 16)
                    if ifaces and ifaces[0][3]:
                        caplen = min(caplen, ifaces[0][3])
                    data = pos + 12
                elif btype == 1:                        # Interface Description Block
                    if blen < 20:
                        raise CaptureError(name, base + pos, "interface description block too short")
                    lt, snaplen = struct.unpack_from(order + "H2xI", buf, pos + 8)
                    ifaces.append((lt, *_idb_options(buf, pos + 16, bend, order), snaplen))
                elif btype in _NG_OTHER_RECORDS:        # no packet, but Wireshark numbers it
                    frame += 1
                elif btype == 0x0A0D0D0A:               # Section Header Block
                    if blen < 28:
                        raise CaptureError(name, base + pos, "section header block too short")
                    major = struct.unpack_from(order + "H", buf, pos + 12)[0]
                    if major != 1:
                        raise CaptureError(name, base + pos, f"unsupported pcapng version {major}")
                if data >= 0:
                    if data + caplen > bend:
                        raise CaptureError(name, base + pos, "packet data overruns its block")
                    if ifid >= len(ifaces):
                        raise CaptureError(name, base + pos, f"packet for undeclared interface {ifid}")
                    lt, ticks, tsoff, _ = ifaces[ifid]
                    q, r = divmod(hi << 32 | lo, ticks)
                    frame += 1
                    yield q + r / ticks + tsoff, lt, buf, data, data + caplen, frame, base + pos
                pos += blen
                continue
        buf = _refill(src, buf, pos, need, "block", base)
        if buf is None:
            return
        base += pos
        pos = 0


def read_frames(path_or_fileobj, *, on_error: Callable[[CaptureError], Any] | None = None
                ) -> Iterator[RawFrame]:
    """Yield every captured frame as ``RawFrame(ts, linktype, data)``.

    ``path_or_fileobj`` is a path, a binary file object or the capture as bytes.  ``ts`` is in
    seconds since the epoch (0.0 for pcapng Simple Packet Blocks, which carry none).
    Errors behave as in :func:`read_udp`.
    """
    src = _Source(path_or_fileobj)
    try:
        buf = src.head()
        records = _pcapng_records if buf[:4] == _PCAPNG_MAGIC else _pcap_records
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
    return _read_udp(path_or_fileobj, None if ports is None else frozenset(ports), on_error,
                     Reassembler() if reassembler is None else reassembler)


def _read_udp(source, ports, on_error, reasm: Reassembler) -> Iterator[UdpDatagram]:
    src = _Source(source)
    try:
        buf = src.head()
        if buf[:4] == _PCAPNG_MAGIC:
            for ts, lt, b, start, end, frame, off in _pcapng_records(src, buf):
                ip = _ip_start(lt, b, start, end)
                if ip >= 0:
                    r = _ipv4_udp(b, ip, end, ts, ports, reasm)
                    if r is not None:
                        yield _new(UdpDatagram, (ts, *r, frame, off))
            return
        # Classic pcap: the record loop of _pcap_records with the common case inlined.
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
                ip = _ip_start(lt, buf, pos + 16, end)
                if ip >= 0:
                    ts = sec + frac / ticks
                    r = _ipv4_udp(buf, ip, end, ts, ports, reasm)
                    if r is not None:
                        yield new(UD, (ts, *r, frame, base + pos))
                pos = end
            buf = _refill(src, buf, pos, need, "record", base)
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


# --------------------------------------------------------------------------- output

_MAC_DST = bytes.fromhex("020000000002")
_MAC_SRC = bytes.fromhex("020000000001")
_IPV4_HDR = struct.Struct("!BBHHHBBH4s4s")
_UDP_HDR = struct.Struct("!HHHH")
_LINK_HEADERS = {
    LINKTYPE_ETHERNET: _MAC_DST + _MAC_SRC + b"\x08\x00",
    LINKTYPE_RAW: b"", LINKTYPE_IPV4: b"", 12: b"", 14: b"",
    LINKTYPE_NULL: struct.pack("<I", 2),
    LINKTYPE_LOOP: struct.pack(">I", 2),
    # SLL: packet type 0 (to us), ARPHRD_ETHER, address length 6, address, protocol IPv4
    LINKTYPE_LINUX_SLL: struct.pack("!HHH8sH", 0, 1, 6, _MAC_SRC, 0x0800),
    # SLL2: protocol IPv4, reserved, ifindex 1, ARPHRD_ETHER, packet type 0, address length 6, address
    LINKTYPE_LINUX_SLL2: struct.pack("!HHIHBB8s", 0x0800, 0, 1, 1, 0, 6, _MAC_SRC),
}
_INADDR: dict[Any, tuple[bytes, int]] = {}


def _inaddr(a: str | bytes) -> tuple[bytes, int]:
    r = _INADDR.get(a)
    if r is None:
        b = a if isinstance(a, bytes) else ipaddress.IPv4Address(a).packed
        if len(b) != 4:
            raise ValueError(f"not an IPv4 address: {a!r}")
        if len(_INADDR) >= 65536:
            _INADDR.clear()
        r = _INADDR[a] = (b, int.from_bytes(b, "big"))
    return r


def _ipv4_header(length: int, ident: int, ff: int, src: tuple[bytes, int],
                 dst: tuple[bytes, int], proto: int = 17, ttl: int = 64) -> bytes:
    total = 20 + length
    s = (0x4500 + total + ident + ff + (ttl << 8 | proto)
         + (src[1] >> 16) + (src[1] & 0xFFFF) + (dst[1] >> 16) + (dst[1] & 0xFFFF))
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return _IPV4_HDR.pack(0x45, 0, total, ident, ff, ttl, proto, ~s & 0xFFFF, src[0], dst[0])


def udp_frames(linktype: int, src: str, sport: int, dst: str, dport: int, payload: bytes,
               *, ip_id: int = 0, mtu: int | None = None) -> list[bytes]:
    """Build the link-layer frame(s) carrying one UDP/IPv4 datagram.

    The IPv4 header has a valid checksum, TTL 64 and no options; the UDP checksum is
    0 (none).  If ``mtu`` is given and the IP packet would exceed it, the datagram is
    split into IPv4 fragments of at most ``mtu`` bytes (offsets in 8-byte units, MF on
    all but the last).  Ethernet frames use a fixed pair of locally administered MACs.
    """
    link = _LINK_HEADERS.get(linktype)
    if link is None:
        raise ValueError(f"cannot synthesise UDP frames for link type {linktype}")
    udp_len = 8 + len(payload)
    if udp_len > 65515:
        raise ValueError(f"UDP payload too large ({len(payload)} bytes)")
    s, d = _inaddr(src), _inaddr(dst)
    ident = ip_id & 0xFFFF
    data = _UDP_HDR.pack(sport, dport, udp_len, 0) + payload
    if mtu is None or 20 + udp_len <= mtu:
        return [link + _ipv4_header(udp_len, ident, 0, s, d) + data]
    step = (mtu - 20) & ~7
    if step < 8:
        raise ValueError(f"MTU {mtu} too small to fragment")
    return [link + _ipv4_header(len(data[o:o + step]), ident,
                                (o >> 3) | (0x2000 if o + step < udp_len else 0), s, d)
            + data[o:o + step] for o in range(0, udp_len, step)]


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
