"""Small shared helpers of the codec: IPv4 text/bytes, NUL-terminated strings,
and fixed-layout records described by a struct format.

Everything is big-endian (network order). Nothing here does I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from .constants import MAX_NAME_LEN
from .errors import LBMRDecodeError, LBMREncodeError

_ip_text_cache: dict[bytes, str] = {}
_ip_bytes_cache: dict[str, bytes] = {}


def ip_text(raw: bytes) -> str:
    """4 raw network-order bytes -> dotted quad (cached: addresses repeat a lot)."""
    s = _ip_text_cache.get(raw)
    if s is None:
        if len(_ip_text_cache) > 65536:
            _ip_text_cache.clear()
        if len(raw) != 4:
            raise ValueError(f"an IPv4 address is 4 bytes, got {len(raw)}")
        s = _ip_text_cache[raw] = f"{raw[0]}.{raw[1]}.{raw[2]}.{raw[3]}"
    return s


def ip_bytes(text: str) -> bytes:
    """Dotted quad -> 4 network-order bytes; :class:`LBMREncodeError` if invalid."""
    b = _ip_bytes_cache.get(text)
    if b is None:
        parts = text.split(".") if isinstance(text, str) else ()
        if len(parts) != 4 or not all(p.isascii() and p.isdigit() and len(p) <= 3 and int(p) <= 255
                                      for p in parts):
            raise LBMREncodeError(f"not an IPv4 address: {text!r}")
        b = bytes(int(p) for p in parts)
        if len(_ip_bytes_cache) > 65536:
            _ip_bytes_cache.clear()
        _ip_bytes_cache[text] = b
    return b


def text(raw: bytes) -> str:
    """Wire bytes of a name -> str (UTF-8; undecodable bytes survive via surrogateescape)."""
    return raw.decode("utf-8", "surrogateescape")


def wire(s: str) -> bytes:
    """Inverse of :func:`text`."""
    try:
        return s.encode("utf-8", "surrogateescape")
    except (UnicodeEncodeError, AttributeError) as e:
        raise LBMREncodeError(f"cannot encode name {s!r}: {e}") from None


def read_strz(data: bytes, off: int, end: int, what: str) -> tuple[str, int]:
    """Read a NUL-terminated name in ``data[off:end]``; returns (name, offset after the NUL).

    Names longer than 255 bytes (256 with the NUL) are rejected, as UM does.
    """
    nul = data.find(b"\0", off, end)
    if nul < 0:
        raise LBMRDecodeError(off, f"{what} is not NUL-terminated before byte {end}")
    if nul - off >= MAX_NAME_LEN:
        raise LBMRDecodeError(off, f"{what} is {nul - off} bytes long (at most {MAX_NAME_LEN - 1})")
    return data[off:nul].decode("utf-8", "surrogateescape"), nul + 1


def strz(s: str, what: str) -> bytes:
    """Encode a name with its NUL terminator, checking UM's length limit."""
    b = wire(s)
    if b"\0" in b:
        raise LBMREncodeError(f"{what} {s!r} contains a NUL byte")
    if len(b) >= MAX_NAME_LEN:
        raise LBMREncodeError(f"{what} is {len(b)} bytes long (at most {MAX_NAME_LEN - 1})")
    return b + b"\0"


def opt_text(raw: bytes) -> tuple[str, bool]:
    """A name whose NUL terminator is optional on the wire -> (name, had_nul)."""
    if raw.endswith(b"\0"):
        return raw[:-1].decode("utf-8", "surrogateescape"), True
    return raw.decode("utf-8", "surrogateescape"), False


def opt_wire(s: str, nul: bool) -> bytes:
    """Inverse of :func:`opt_text`."""
    return wire(s) + (b"\0" if nul else b"")


@dataclass(frozen=True, slots=True)
class Fixed:
    """Base of records whose wire layout is one struct format.

    These are immutable values (like dnspython's rdata): decoded instances
    may be shared between packets, so change one with
    :func:`dataclasses.replace`.

    A subclass sets ``_FMT`` (struct codes of its dataclass fields in
    declaration order, without the leading ``!``), ``_HEAD`` (struct codes of
    leading constant bytes, e.g. ``"BB"`` for an option's type and length)
    and ``_IPS`` (names of fields held as dotted-quad strings, coded ``4s``).
    """

    _FMT: ClassVar[str] = ""
    _HEAD: ClassVar[str] = ""
    _IPS: ClassVar[tuple[str, ...]] = ()
    _S: ClassVar[struct.Struct]
    _NAMES: ClassVar[tuple[str, ...]]
    _IPIDX: ClassVar[tuple[int, ...]]
    SIZE: ClassVar[int]

    @classmethod
    def _compile(cls) -> None:
        names = tuple(f.name for f in fields(cls))
        cls._NAMES = names
        cls._IPIDX = tuple(names.index(n) for n in cls._IPS)
        cls._S = struct.Struct("!" + cls._HEAD + cls._FMT)
        cls.SIZE = cls._S.size

    @classmethod
    def unpack_body(cls, data: bytes, off: int) -> Any:
        """Build from ``data`` at ``off`` (the caller has checked the size)."""
        vals = cls._S.unpack_from(data, off)[len(cls._HEAD):]
        if cls._IPIDX:
            vals = list(vals)
            for i in cls._IPIDX:
                vals[i] = ip_text(vals[i])
        return cls(*vals)

    def pack_body(self, *head: int) -> bytes:
        vals = [getattr(self, n) for n in self._NAMES]
        for i in self._IPIDX:
            vals[i] = ip_bytes(vals[i])
        try:
            return self._S.pack(*head, *vals)
        except struct.error as e:
            raise LBMREncodeError(f"{type(self).__name__}: {e}") from None


def fixed(cls):
    """Class decorator: make ``cls`` a slotted dataclass, compile its layout
    and generate a specialised ``unpack_body`` (one ``unpack_from`` and one
    constructor call, no loops) -- the decoder's hot path."""
    cls = dataclass(frozen=True, slots=True)(cls)
    cls._compile()
    nhead = len(cls._HEAD)
    names = [f"_h{i}" for i in range(nhead)] + [f"v{i}" for i in range(len(cls._NAMES))]
    args = [f"ip_text(v{i})" if i in cls._IPIDX else f"v{i}" for i in range(len(cls._NAMES))]
    lhs = ", ".join(names) + ("," if len(names) == 1 else "")
    src = (f"def unpack_body(data, off):\n"
           f"    {lhs} = unpack_from(data, off)\n"
           f"    return cls({', '.join(args)})\n")
    ns = {"unpack_from": cls._S.unpack_from, "cls": cls, "ip_text": ip_text}
    exec(src, ns)  # noqa: S102 - generated from the class's own field list
    cls.unpack_body = staticmethod(ns["unpack_body"])
    return cls
