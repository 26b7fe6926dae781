"""Exceptions raised by the LBMR codec."""

from __future__ import annotations


class LBMRDecodeError(ValueError):
    """A datagram is not a well-formed LBMR packet.

    ``offset`` is the byte offset into the datagram (0 = first byte of the UDP
    payload) where the problem was found; ``reason`` says what is wrong.
    This is the only exception :func:`lbmr_proto.decode` raises.
    """

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason

    def __reduce__(self):  # picklable (Spark executors ship exceptions around)
        return (type(self), (self.offset, self.reason))


class LBMREncodeError(ValueError):
    """A packet object cannot be encoded (a value out of range, a name too long, ...)."""
