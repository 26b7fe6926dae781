"""Numeric codes of the LBMR wire format (see shared/spec/lbmr-wire-format.md).

All multi-byte integers on the wire are big-endian (network byte order).
"""

from __future__ import annotations

from enum import IntEnum


class PacketType(IntEnum):
    """Low three bits of the first header byte."""

    NORMAL = 0
    WC_TQR = 1
    RCV_ALIVE = 2
    SRC_ALIVE = 3
    TOPIC_MGMT = 4
    QUEUE_RES = 6
    EXT = 7


class ExtType(IntEnum):
    """Second byte of an extended (type 7) packet."""

    PSER = 0x01
    QMGMT = 0x02
    CTXINFO = 0x03
    TOPIC_RES_REQUEST = 0x04
    TNWG = 0x05
    REMOTE_DOMAIN_ROUTE = 0x06
    REMOTE_CTXINFO = 0x07


class Transport(IntEnum):
    """TIR transport type (transport byte & 0x7F)."""

    TCP = 0x00
    LBTRU = 0x01
    TCP6 = 0x02
    LBTSMX = 0x04
    LBTRM = 0x10
    PGM = 0x11
    LBTRDMA = 0x20
    LBTIPC = 0x40


class WildcardType(IntEnum):
    """Pattern type of a wildcard TQR and of TNWG interest records."""

    PCRE = 1
    REGEX = 2


class SourceType(IntEnum):
    """Value of the packet-level source-type option (0x82)."""

    APPLICATION = 0
    TNWGD = 1
    STORE = 2


HDR_OPTIONS_FLAG = 0x08  # bit in byte 0: packet-options trailer present
TIR_OPTIONS_FLAG = 0x80  # bit in the TIR transport byte: options chunk present
MAX_NAME_LEN = 256  # longest topic/queue name in bytes, NUL terminator included

LBMR_MC_PORT = 12965  # default multicast topic-resolution UDP port
LBMRD_PORT = 15380  # default lbmrd UDP port
UC_PORT_LOW = 14402  # default unicast TR client port range (low)
UC_PORT_HIGH = 14406  # default unicast TR client port range (high)

# TMR (topic management record) codes
TMR_LEAVE = 0
TMR_TOPIC_USE = 1
TMR_FLAG_RESPONSE = 0x80
TMR_FLAG_WILDCARD_PCRE = 0x40
TMR_FLAG_WILDCARD_REGEX = 0x20

# Topic-resolution request (ext 0x04) flags
TRREQ_GW_REMOTE_INTEREST = 0x0040
TRREQ_CONTEXT_QUERY = 0x0020
TRREQ_CONTEXT_ADVERTISEMENT = 0x0010
TRREQ_GATEWAY_META = 0x0008
TRREQ_ADVERTISEMENT = 0x0004
TRREQ_QUERY = 0x0002
TRREQ_WILDCARD_QUERY = 0x0001
