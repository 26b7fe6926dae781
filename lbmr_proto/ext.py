"""Extended (packet type 7) records. Exactly one per datagram; its first two
bytes are the main header's ``ver_type`` and the extended type code, so all
offsets are datagram offsets. Big-endian throughout.

This module is the face of the extended types: the registry from type code
to record class (:data:`EXT_TYPES`), :func:`decode_ext`, and
:class:`UnknownExt` for codes the codec does not know. The record classes
live by family and are re-exported here: :mod:`lbmr_proto._extume` (0x01
PSER, 0x02 QMGMT), :mod:`lbmr_proto._extcontext` (0x03 context info, 0x04
topic-resolution request) and :mod:`lbmr_proto._extgateway` (0x05 TNWG,
0x06 remote domain route, 0x07 remote context info);
:mod:`lbmr_proto._extwire` holds what they share.

Length fields whose meaning the public sources leave open are kept as
received when decoding; ``None`` means "compute the inferred value" when
encoding. Length fields with a known meaning are derived on encode and
checked on decode.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._extcontext import CtxInfo, TopicResRequest
from ._extgateway import (
    InterestRecord,
    RctxOption,
    RctxRecord,
    RemoteCtxInfo,
    RemoteDomainRoute,
    Tnwg,
    TnwgOption,
)
from ._extume import (
    QMGMT_CNIL,
    QMGMT_EC,
    QMGMT_EV,
    QMGMT_IKA,
    QMGMT_IL,
    QMGMT_JR,
    QMGMT_JREJ,
    QMGMT_QRO,
    Pser,
    PserOption,
    Qmgmt,
    QmgmtInstance,
)
from .errors import LBMRDecodeError, LBMREncodeError

__all__ = [
    "EXT_TYPES", "decode_ext", "UnknownExt",
    "Pser", "PserOption", "Qmgmt", "QmgmtInstance",
    "QMGMT_IL", "QMGMT_JR", "QMGMT_JREJ", "QMGMT_IKA", "QMGMT_EC", "QMGMT_EV", "QMGMT_CNIL", "QMGMT_QRO",
    "CtxInfo", "TopicResRequest",
    "Tnwg", "TnwgOption", "InterestRecord", "RemoteDomainRoute", "RemoteCtxInfo", "RctxRecord", "RctxOption",
]


# ------------------------------------------------------------------ unknown


@dataclass(slots=True)
class UnknownExt:
    """An extended type the codec does not know: everything after byte 1, raw."""

    ext_type: int
    data: bytes = b""

    @property
    def EXT(self) -> int:  # noqa: N802
        return self.ext_type

    def encode(self, ver_type: int) -> bytes:
        if not 0 <= self.ext_type <= 255 or self.ext_type in EXT_TYPES:
            raise LBMREncodeError(f"ext_type {self.ext_type} out of range or not unknown")
        if len(self.data) < 2:
            raise LBMREncodeError("an extended record is at least 4 bytes")
        return bytes((ver_type, self.ext_type)) + self.data

    @classmethod
    def decode_raw(cls, data: bytes, end: int) -> tuple[UnknownExt, int]:
        if end < 4:
            raise LBMRDecodeError(0, "extended record shorter than 4 bytes")
        return cls(data[1], data[2:end]), end


EXT_TYPES: dict[int, type] = {
    c.EXT: c for c in (Pser, Qmgmt, CtxInfo, TopicResRequest, Tnwg, RemoteDomainRoute, RemoteCtxInfo)
}


def decode_ext(data: bytes, end: int):
    """Decode the one extended record in ``data[0:end]``; returns (record, end offset)."""
    if end < 2:
        raise LBMRDecodeError(0, "extended header truncated")
    cls = EXT_TYPES.get(data[1])
    if cls is None:
        return UnknownExt.decode_raw(data, end)
    return cls.decode(data, end)
