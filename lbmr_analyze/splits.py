"""Byte-range splits of capture files, so one big file spreads over many tasks.

How a file is split
    The driver only lists the input files and stats their sizes: every file is cut
    into *nominal* byte ranges ``[k * split_size, (k + 1) * split_size)``.  It never
    reads capture data, so planning costs nothing however big the files are.

    Each task then **resynchronises** on its own: from its nominal start it looks for
    the first offset where a chain of plausible record headers begins
    (:func:`resync`), and it owns every record that starts between that point and
    the resynchronisation point of its nominal *end*.  Both neighbours compute the
    same boundary from the same bytes with the same deterministic function, so every
    record is read by exactly one task without any communication between them.  The
    task owning the file start begins at the first record (offset 24 for classic
    pcap, 0 for pcapng) without resynchronising.

    A header is *plausible* (classic pcap) when its fraction field is below the
    file's tick rate, ``0 < incl_len <= orig_len``, ``incl_len`` is at most the
    snapshot length (or 256 KiB when the header's is 0 or absurd), and the record
    fits in the file; a chain is ``CHAIN`` such headers laid end to end (or fewer
    that end exactly at the end of the file) whose seconds lie within a day of the
    first one.  For pcapng a block is plausible when its type is a known block
    type, its length is a multiple of 4 between 12 bytes and 16 MiB, its trailing
    length copy matches and an Enhanced Packet Block's captured length fits in it.
    Random data passes one check with a probability well under 10^-9, a chain of
    eight practically never; if it did happen, the task that reads up to the false
    boundary notices that its record chain does not meet it and reports a capture
    error there (records would be missing, never silently).

    pcapng files need the Section Header and Interface Description Blocks in force
    at a task's start (for link types and timestamp resolution).  When a pcapng file
    has more than one split, a cheap pre-pass (one task per split, walking block
    headers only) collects those blocks; each decoding task is handed the ones that
    precede its range (:func:`context_for`).

Reading a split
    :func:`read_split` serves the owned byte range, behind the file's own header (or
    the pcapng context blocks), to :func:`lbmr_proto.capture.read_udp` through a small
    file-like object, so the codec's fast record loop does the work; offsets are
    translated back to file offsets.  A corrupt record is reported as a
    :class:`~lbmr_proto.capture.CaptureError` (path and file offset) and reading
    resumes at the next resynchronisation point after it, so the rest of the file is
    still analysed.  IPv4 fragments are only reassembled within one split.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from lbmr_proto.capture import MAX_RECORD_SIZE, CaptureError, UdpDatagram, read_packets, read_udp

from . import fsio

#: Default size of a nominal byte range (bytes).
DEFAULT_SPLIT_SIZE = 128 << 20
#: How many consecutive plausible headers make a resynchronisation point.
CHAIN = 8
#: File name suffixes picked up when a folder is given.
CAPTURE_SUFFIXES = (".pcap", ".pcapng", ".cap", ".ntar", ".pcap.gz", ".pcapng.gz", ".cap.gz")

_PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"
_PCAP_MAGICS = {   # magic as stored -> (byte order, ticks per second); see pcap-savefile(5)
    b"\xd4\xc3\xb2\xa1": ("<", 1_000_000), b"\xa1\xb2\xc3\xd4": (">", 1_000_000),
    b"\x4d\x3c\xb2\xa1": ("<", 1_000_000_000), b"\xa1\xb2\x3c\x4d": (">", 1_000_000_000),
}
# pcapng block types that may appear in a file (pcapng draft, section 11.1)
_NG_BLOCKS = frozenset((0x0A0D0D0A, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0xBAD, 0x40000BAD))
_DEFAULT_MAXLEN = 262144
_DAY = 86400


class Split(NamedTuple):
    """A nominal byte range ``[start, end)`` of the file ``path`` (``size`` bytes)."""

    split_id: int
    path: str
    start: int
    end: int
    size: int


def _wanted(name: str) -> bool:
    return name.lower().endswith(CAPTURE_SUFFIXES) and not name.startswith(".")


def unlistable_error(into: list[str]):
    """An ``os.walk`` error handler that keeps the folders it could not list."""
    return lambda e: into.append(e.filename)


def discover(inputs: Iterable[str | os.PathLike]) -> list[str]:
    """Expand the inputs (local paths or URIs, see :mod:`lbmr_analyze.fsio`) into
    capture files: files as given, folders searched recursively for ``*.pcap``,
    ``*.pcapng``, ``*.cap``, ``*.ntar`` and those with ``.gz`` (sorted).  Entries
    that cannot be opened (a dangling link, no permission) are kept, and so are
    folders that cannot be listed: they are reported as capture errors.  Raises :class:`FileNotFoundError` for an input
    that does not exist."""
    out: list[str] = []
    seen: set[str] = set()
    for inp in inputs:
        inp = os.fspath(inp)
        if fsio.is_local(inp):
            p = fsio.local_path(inp)
            if os.path.isdir(p):
                found = []
                unlistable: list[str] = []      # reported as capture errors by the task
                for root, dirs, files in os.walk(p, onerror=unlistable_error(unlistable)):
                    dirs.sort()
                    found += [os.path.join(root, f) for f in files if _wanted(f)]
                paths = sorted(found + unlistable)
            elif os.path.lexists(p):
                paths = [p]
            else:
                raise FileNotFoundError(f"no such capture file or folder: {inp}")
        else:
            paths = _discover_remote(inp)
        for q in paths:
            if q not in seen:
                seen.add(q)
                out.append(q)
    return out


def _discover_remote(uri: str) -> list[str]:
    from urllib.parse import urlparse

    import pyarrow.fs as pafs

    fs, base = fsio.filesystem(uri)
    u = urlparse(uri)
    prefix = f"{u.scheme}://" + ("" if u.scheme.startswith("s3") else u.netloc)
    info = fs.get_file_info(base)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"no such capture file or folder: {uri}")
    if info.type == pafs.FileType.Directory:
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
        return sorted(prefix + ("" if i.path.startswith("/") or not prefix.endswith("//") else "") + i.path
                      for i in infos if i.type == pafs.FileType.File and _wanted(i.base_name))
    return [uri]


def size_of(path: str) -> int:
    """The file's size in bytes (0 when it cannot be read: the task reports why)."""
    try:
        if fsio.is_local(path):
            return os.stat(fsio.local_path(path)).st_size
        fs, p = fsio.filesystem(path)
        return fs.get_file_info(p).size or 0
    except OSError:
        return 0


def plan(paths: Iterable[str], split_size: int = DEFAULT_SPLIT_SIZE) -> list[Split]:
    """Cut every file into nominal ranges of ``split_size`` bytes (driver side: one
    ``stat`` per file, no reads).  An empty or unreadable file still gets one split
    (which reports it); a gzip file is one split (it cannot be cut)."""
    if split_size < 64:
        raise ValueError("split size must be at least 64 bytes")
    splits: list[Split] = []
    for path in paths:
        size = size_of(path)
        if path.lower().endswith(".gz"):
            splits.append(Split(len(splits), path, 0, size, size))
            continue
        start = 0
        while True:
            end = min(start + split_size, size)
            splits.append(Split(len(splits), path, start, end, size))
            if end >= size:
                break
            start = end
    return splits


# --------------------------------------------------------------------------- formats

class _Format(NamedTuple):
    kind: str          # "pcap" or "pcapng"
    order: str         # struct byte order of the (first) header
    ticks: int         # pcap: ticks per second
    maxlen: int        # pcap: largest plausible incl_len
    first: int         # offset of the first record / block


def _format(mm, path: str) -> _Format:
    """Recognise the file from its first bytes; raise :class:`CaptureError` (offset 0)
    with the codec's own message when it is neither pcap nor pcapng."""
    head = bytes(mm[:24])
    if head[:4] in _PCAP_MAGICS and len(head) >= 24:
        order, ticks = _PCAP_MAGICS[head[:4]]
        snaplen = struct.unpack_from(order + "I", head, 16)[0]
        maxlen = snaplen if 0 < snaplen <= MAX_RECORD_SIZE else _DEFAULT_MAXLEN
        return _Format("pcap", order, ticks, max(maxlen, 16), 24)
    if head[:4] == _PCAPNG_MAGIC and len(head) >= 12:
        bom = head[8:12]
        if bom in (b"\x4d\x3c\x2b\x1a", b"\x1a\x2b\x3c\x4d"):
            return _Format("pcapng", "<" if bom[0] == 0x4D else ">", 0, 0, 0)
    # let the codec word the error exactly as lbmr-inspect would
    try:
        for _ in read_udp(head):
            pass
    except CaptureError as e:
        raise CaptureError(path, e.offset, e.reason) from None
    raise CaptureError(path, 0, "unrecognised capture file header")


def _pcap_ok(mm, p: int, size: int, f: _Format, u) -> int:
    """End of the plausible pcap record at ``p``, or -1 (with its seconds in ``u``)."""
    if p + 16 > size:
        return -1
    sec, frac, incl, orig = struct.unpack_from(f.order + "IIII", mm, p)
    if frac >= f.ticks or incl == 0 or incl > f.maxlen or orig < incl or orig > MAX_RECORD_SIZE:
        return -1
    end = p + 16 + incl
    if end > size:
        return -1
    u.append(sec)
    return end


def _ng_ok(mm, p: int, size: int, order: str) -> tuple[int, str]:
    """(end, byte order after it) of the plausible pcapng block at ``p`` read in
    ``order`` (a Section Header Block sets its own), or (-1, order)."""
    if p + 12 > size:
        return -1, order
    btype = struct.unpack_from(order + "I", mm, p)[0]
    if btype == 0x0A0D0D0A:
        bom = bytes(mm[p + 8:p + 12])
        if bom not in (b"\x4d\x3c\x2b\x1a", b"\x1a\x2b\x3c\x4d"):
            return -1, order
        order = "<" if bom[0] == 0x4D else ">"
    elif btype not in _NG_BLOCKS:
        return -1, order
    blen = struct.unpack_from(order + "I", mm, p + 4)[0]
    if blen < 12 or blen & 3 or blen > MAX_RECORD_SIZE or p + blen > size:
        return -1, order
    if struct.unpack_from(order + "I", mm, p + blen - 4)[0] != blen:
        return -1, order
    if btype == 6:
        if blen < 32 or struct.unpack_from(order + "I", mm, p + 20)[0] > blen - 32:
            return -1, order
    return p + blen, order


def _ng_chain(mm, p: int, size: int, f: _Format) -> str | None:
    """The byte order in which a chain of plausible pcapng blocks starts at ``p``
    (sections of one file may differ), or None."""
    for order in (f.order, ">" if f.order == "<" else "<"):
        q, o = p, order
        for _ in range(CHAIN):
            q, o = _ng_ok(mm, q, size, o)
            if q < 0 or q == size:
                break
        if q >= 0:
            return order
    return None


def _chain_ok(mm, p: int, size: int, f: _Format) -> bool:
    if f.kind != "pcap":
        return _ng_chain(mm, p, size, f) is not None
    secs: list[int] = []
    q = p
    for _ in range(CHAIN):
        q = _pcap_ok(mm, q, size, f, secs)
        if q < 0:
            return False
        if q == size:
            break
    return not secs or max(secs) - min(secs) <= _DAY


def resync(mm, p: int, size: int, f: _Format) -> int:
    """The first offset ``>= p`` where a chain of plausible records starts, or
    ``size`` if there is none (see the module documentation)."""
    p = max(p, f.first)
    step = 1
    if f.kind == "pcapng":            # every pcapng block length is a multiple of 4
        p, step = (p + 3) & ~3, 4
    while p < size:
        if _chain_ok(mm, p, size, f):
            return p
        p += step
    return min(p, size)


def _bounds(mm, split: Split, f: _Format) -> tuple[int, int]:
    """The owned range ``[first record, next split's first record)``."""
    size = split.size
    a = f.first if split.start == 0 else resync(mm, split.start, size, f)
    b = size if split.end >= size else resync(mm, split.end, size, f)
    return a, max(a, b)


# --------------------------------------------------------------------------- pcapng context

def _walk_blocks(mm, a: int, b: int, f: _Format) -> Iterator[tuple[int, int, int]]:
    """(offset, type, length) of the pcapng blocks in ``[a, b)``; after an implausible
    block, walking resumes at the next resynchronisation point."""
    p = a
    order = None
    while p < b:
        if order is None:
            order = _ng_chain(mm, p, b, f) or f.order
        end, o = _ng_ok(mm, p, b, order)
        if end < 0:
            p = resync(mm, p + 1, b, f)
            order = None
            continue
        order = o
        yield p, struct.unpack_from(order + "I", mm, p)[0], end - p
        p = end


def context_blocks(split: Split) -> list[tuple[int, bytes]]:
    """Pre-pass for a pcapng split: ``(offset, bytes)`` of the Section Header and
    Interface Description Blocks in the range the split owns (block headers only)."""
    try:
        opener = _open(split.path, split.start, split.end)
        mm = opener.__enter__()
    except OSError:
        return []                               # the decoding task reports it
    with opener:
        if mm is None:
            return []
        try:
            f = _format(mm, split.path)
        except CaptureError:
            return []
        if f.kind != "pcapng":
            return []
        a, b = _bounds(mm, split, f)
        return [(p, bytes(mm[p:p + n])) for p, t, n in _walk_blocks(mm, a, b, f)
                if t in (0x0A0D0D0A, 1)]


def context_for(blocks: Iterable[tuple[int, bytes]], offset: int) -> bytes:
    """The last Section Header Block before ``offset`` and the Interface Description
    Blocks after it, concatenated: the prefix that makes a range readable."""
    ctx: list[bytes] = []
    for p, blk in sorted(blocks):
        if p >= offset:
            break
        if blk[:4] == _PCAPNG_MAGIC:
            ctx = [blk]
        elif ctx:
            ctx.append(blk)
    return b"".join(ctx)


# --------------------------------------------------------------------------- reading

class _open:  # noqa: N801 - used as a context manager
    """Memory-map a capture read-only (None for an empty file); remote and gzip
    captures through a local copy (:class:`lbmr_analyze.fsio.LocalCopy`).  Raises
    OSError when the capture cannot be opened."""

    def __init__(self, path: str, start: int = 0, end: int | None = None) -> None:
        self.copy = fsio.LocalCopy(path, start, end)
        self.f = None
        self.mm = None

    def __enter__(self):
        if self.f is not None:                  # already open (entered by hand first)
            return self.mm
        local = self.copy.__enter__()
        try:
            self.f = open(local, "rb")
        except BaseException:
            self.copy.__exit__(None, None, None)
            raise
        try:
            self.mm = mmap.mmap(self.f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:            # empty file
            self.mm = None
        return self.mm

    @property
    def size(self) -> int:
        return 0 if self.mm is None else len(self.mm)

    def __exit__(self, *exc) -> None:
        if self.mm is not None:
            self.mm.close()
        self.f.close()
        self.copy.__exit__(*exc)


class _RangeStream:
    """A read-only binary stream: ``prefix`` then ``mm[a:b]``."""

    def __init__(self, name: str, prefix: bytes, mm, a: int, b: int) -> None:
        self.name = name
        self._prefix = prefix
        self._mm, self._pos, self._end = mm, a, b

    def read(self, n: int = -1) -> bytes:
        if self._prefix:
            out, self._prefix = self._prefix, b""
            return out
        if self._pos >= self._end:
            return b""
        stop = self._end if n is None or n < 0 else min(self._end, self._pos + n)
        out = self._mm[self._pos:stop]
        self._pos = stop
        return out


def read_split(split: Split, ports: Iterable[int] | None, context: bytes = b""
               ) -> Iterator[UdpDatagram | CaptureError]:
    """Yield the UDP datagrams whose frames start in the range ``split`` owns (with
    file offsets; ``frame`` is 0 since frames are not numbered across splits), and a
    :class:`CaptureError` (path, file offset, reason) for every corruption found
    there; reading resumes after each one.

    ``context`` is the pcapng prefix from :func:`context_for` (ignored for classic
    pcap, whose 24-byte file header is used instead)."""
    for part in segments(split, ports, context):
        if type(part) is CaptureError:
            yield part
        else:
            shift, datagrams = part
            for d in datagrams:
                yield d._replace(offset=d.offset + shift, frame=0)


def segments(split: Split, ports: Iterable[int] | None, context: bytes = b"", *, packets: bool = False
             ) -> Iterator[tuple[int, Iterator[UdpDatagram]] | CaptureError]:
    """Lower-level :func:`read_split`: yields ``(shift, datagrams)`` pairs, whose
    datagrams' ``offset + shift`` is the file offset (consume each iterator before
    asking for the next item), and :class:`CaptureError` items.  With ``packets``
    the iterators yield what :func:`lbmr_proto.capture.read_packets` does (every
    UDP datagram, TCP segment and quoting ICMP error; ``ports`` is ignored) and
    frame numbers count from the range's start."""
    portset = None if ports is None else frozenset(ports)
    path = split.path
    opener = _open(path, split.start, split.end)
    try:
        mm = opener.__enter__()
    except OSError as e:
        if split.start == 0:
            yield CaptureError(path, 0, f"cannot open the capture: {e.strerror or e}")
        return
    if path.lower().endswith(".gz"):          # offsets are in the decompressed stream
        split = split._replace(end=opener.size, size=opener.size)
    with opener:
        if mm is None:
            if split.start == 0:
                yield CaptureError(path, 0, "empty file (no capture header)")
            return
        try:
            f = _format(mm, path)
        except CaptureError as e:
            if split.start == 0:
                yield e
            return
        a, b = _bounds(mm, split, f)
        if f.kind == "pcap":
            prefix = bytes(mm[:24])
        else:
            prefix = b"" if a == 0 else context
        while a < b:
            errors: list[CaptureError] = []
            shift = a - len(prefix)
            stream = _RangeStream(path, prefix, mm, a, b)
            if packets:
                yield shift, read_packets(stream, on_error=errors.append)
            else:
                yield shift, read_udp(stream, ports=portset, on_error=errors.append)
            if not errors:
                return
            e = errors[0]
            x = max(e.offset + shift, a)
            reason = e.reason
            if b < split.size and reason.startswith("truncated"):
                reason = (f"record runs past offset {b}, where the next byte range resynchronised "
                          f"({reason}); the file is corrupt here or the split boundary is wrong")
            yield CaptureError(path, x, reason)
            nxt = resync(mm, x + 1, b, f)
            if f.kind == "pcapng" and nxt < b:
                blocks = [(-1, prefix)] if prefix else []
                blocks += [(p, bytes(mm[p:p + n])) for p, t, n in _walk_blocks(mm, a, x, f)
                           if t in (0x0A0D0D0A, 1)]
                prefix = _merge_context(blocks, mm, nxt)
            a = nxt


def _merge_context(blocks: list[tuple[int, bytes]], mm, at: int) -> bytes:
    """Context prefix for resuming at ``at``: the prefix blocks in force (the first
    entry may itself be a concatenated context) followed by newer SHB/IDBs, unless a
    block at ``at`` is itself a Section Header Block."""
    if bytes(mm[at:at + 4]) == _PCAPNG_MAGIC:
        return b""
    ctx: list[bytes] = []
    for _p, blk in blocks:
        if blk[:4] == _PCAPNG_MAGIC and _p >= 0:
            ctx = [blk]
        else:
            ctx.append(blk)
    return b"".join(ctx)
