"""Peer-link framing: :func:`encode` / :func:`decode` of whole frames and
:class:`FrameReader`, which cuts a byte stream into frames and refuses garbage at
the first wrong byte."""

from __future__ import annotations

import struct
from typing import NamedTuple

from .frames import (
    FRAME_TYPES,
    Frame,
)
from .wire import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    MAX_PAYLOAD,
    WIRE_VERSION,
    FrameDecodeError,
    FrameEncodeError,
    PayloadReader,
)


def encode_raw(type_code: int, payload: bytes = b"", flags: int = 0, *,
               version: int = WIRE_VERSION, max_payload: int = MAX_PAYLOAD) -> bytes:
    """A frame from its parts (also for frame types this module does not know)."""
    if len(payload) > max_payload:
        raise FrameEncodeError(f"payload of {len(payload)} bytes exceeds the limit of {max_payload}")
    try:
        return HEADER.pack(MAGIC, version, type_code, flags, 0, len(payload)) + payload
    except struct.error as e:
        raise FrameEncodeError(f"bad header field: {e}") from None


def encode(frame: Frame, *, max_payload: int = MAX_PAYLOAD) -> bytes:
    """The wire bytes of one frame; :class:`FrameEncodeError` if it cannot be encoded."""
    if not isinstance(frame, Frame) or type(frame) not in FRAME_TYPES.values():
        raise FrameEncodeError(f"not a frame: {frame!r}")
    return encode_raw(frame.TYPE, frame.payload(), frame.header_flags(), max_payload=max_payload)


def decode_payload(type_code: int, payload: bytes, flags: int = 0) -> Frame:
    """The frame object of a known type from its payload (and its header's ``flags``);
    :class:`FrameDecodeError` if it is malformed or the type is unknown."""
    cls = FRAME_TYPES.get(type_code)
    if cls is None:
        raise FrameDecodeError(f"unknown frame type 0x{type_code:02x}")
    r = PayloadReader(payload, cls.TYPE.name)
    frame = cls._parse(r)
    if not cls._EXTENSIBLE:
        r.end()
    return frame.with_header_flags(flags) if flags else frame


def decode(data: bytes, *, max_payload: int = MAX_PAYLOAD) -> Frame:
    """Decode exactly one complete frame (header and payload)."""
    reader = FrameReader(max_payload)
    reader.feed(data)
    raw = reader.next_frame()
    if raw is None:
        raise FrameDecodeError(f"incomplete frame ({len(data)} bytes)")
    if reader.buffered:
        raise FrameDecodeError(f"{reader.buffered} byte(s) after the frame")
    return decode_payload(raw.type, raw.payload, raw.flags)


# --------------------------------------------------------------------------- framing


class RawFrame(NamedTuple):
    type: int
    flags: int
    payload: bytes


_HTTP_METHODS = (b"GET ", b"POST", b"PUT ", b"HEAD", b"DELE", b"OPTI", b"PATC", b"CONN",
                 b"TRAC", b"PRI ")


def _garbage_hint(prefix: bytes) -> str:
    if prefix[:1] == b"\x16" and prefix[1:2] in (b"", b"\x03"):
        return "this looks like a TLS handshake: is TLS enabled on one side of the link only?"
    if prefix[:4] in _HTTP_METHODS or (len(prefix) < 4 and any(m.startswith(prefix) for m in _HTTP_METHODS)):
        return "this looks like an HTTP request: is something other than a router connecting?"
    if prefix.startswith(b"SSH-"):
        return "this looks like SSH: is something other than a router connecting?"
    return "the peer does not speak the router peer-link protocol"


class FrameReader:
    """Cuts a byte stream into frames. Refuses a stream at the first byte that cannot start a
    frame (so garbage is refused before a whole header has arrived), an unknown header
    version, and a payload length above ``max_payload``."""

    def __init__(self, max_payload: int = MAX_PAYLOAD) -> None:
        self.max_payload = max_payload
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf) - self._pos

    def header(self) -> tuple[int, int, int] | None:
        """(type, flags, length) of the frame at the head once its header is complete
        (checked like :meth:`next_frame` does), else None."""
        if self.buffered < HEADER_SIZE:
            self._check_magic()
            return None
        _, _, ftype, flags, _, length = self._check_header()
        return ftype, flags, length

    def _check_magic(self) -> None:
        p = self._pos
        n = min(4, len(self._buf) - p)
        got = bytes(self._buf[p:p + n])
        if got != MAGIC[:n]:
            seen = bytes(self._buf[p:p + 16])
            raise FrameDecodeError(
                f"bad magic {seen[:4].hex(' ')} (expected 4c 42 52 50 'LBRP'; first bytes "
                f"{seen!r}): {_garbage_hint(seen)}")

    def _check_header(self):
        self._check_magic()
        h = HEADER.unpack_from(self._buf, self._pos)
        if h[1] != WIRE_VERSION:
            raise FrameDecodeError(
                f"unsupported frame header version {h[1]} (this router speaks {WIRE_VERSION})")
        if h[5] > self.max_payload:
            raise FrameDecodeError(
                f"frame type 0x{h[2]:02x} announces a {h[5]}-byte payload, above the limit of "
                f"{self.max_payload}")
        return h

    def next_frame(self) -> RawFrame | None:
        """The next complete frame, or None if more bytes are needed."""
        if self.buffered < HEADER_SIZE:
            self._check_magic()
            return None
        _, _, ftype, flags, _, length = self._check_header()
        start = self._pos + HEADER_SIZE
        if len(self._buf) - start < length:
            return None
        self._pos = start + length
        return RawFrame(ftype, flags, bytes(self._buf[start:self._pos]))
