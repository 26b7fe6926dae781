"""pcapng reading: the block loop, yielding one frame per packet block.

A pcapng file is a sequence of blocks (type, total length, body, total length
again), each section starting with a Section Header Block whose byte-order magic
sets the byte order of every block in it.  Interface Description Blocks declare
each interface's link type, snap length and timestamp resolution
(``if_tsresol``: a power of 10 or of 2 ticks per second) and offset
(``if_tsoffset``, seconds); Enhanced, obsolete and Simple Packet Blocks carry the
frames.  Lengths and offsets are in bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from ._capfile import MAX_RECORD_SIZE, PCAPNG_MAGIC, CaptureError, CaptureSource, refill


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


def pcapng_records(src: CaptureSource, buf: bytes) -> Iterator[tuple]:
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
            if buf[pos:pos + 4] == PCAPNG_MAGIC:
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
        buf = refill(src, buf, pos, need, "block", base)
        if buf is None:
            return
        base += pos
        pos = 0
