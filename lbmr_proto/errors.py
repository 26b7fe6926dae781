"""Exceptions raised by the codecs of lbmr_proto."""

from __future__ import annotations


class WireDecodeError(ValueError):
    """Base of the decode errors that carry a byte offset: ``offset`` is where
    the problem was found (0 = the first byte given to the decoder),
    ``reason`` says what is wrong."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason

    def __reduce__(self):  # picklable (Spark executors ship exceptions around)
        return (type(self), (self.offset, self.reason))


class LBMRDecodeError(WireDecodeError):
    """A datagram is not a well-formed LBMR packet.

    ``offset`` is the byte offset into the datagram (0 = first byte of the UDP
    payload). This is the only exception :func:`lbmr_proto.decode` raises.
    """


class LBMREncodeError(ValueError):
    """A packet object cannot be encoded (a value out of range, a name too long, ...)."""
