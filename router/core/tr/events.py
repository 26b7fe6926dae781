"""What a :class:`~router.core.tr.portal.PortalTR` takes and hands out: the
proxy sources it is given to advertise, the datagrams it sends
(:class:`Outgoing`) and the events it reports (interest and sources of its
TRD). All frozen values; times are seconds on the portal's clock.

Pattern types are the LBMR/LBRP values: 0 exact topic, 1 PCRE, 2 POSIX regex
(:class:`router.peerlink.PatternType`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "Addr", "Outgoing", "PATTERN_TOPIC", "PATTERN_PCRE", "PATTERN_REGEX", "ProxySource",
    "LocalInterest", "LocalInterestGone", "LocalInterestRefresh", "SourceSeen", "SourceGone",
    "RemoteInterestExpired",
]

Addr = tuple[str, int]

PATTERN_TOPIC = 0  # an exact topic name (LBRP INTEREST pattern type 0)
PATTERN_PCRE = 1  # LBMR wildcard pattern types
PATTERN_REGEX = 2


class Outgoing(NamedTuple):
    """One datagram to send: ``data`` to ``dest`` (ip, port)."""

    data: bytes
    dest: Addr


@dataclass(frozen=True, slots=True)
class ProxySource:
    """A source behind the peer, to advertise in this portal's TRD.

    ``transport_body`` is the lbmr_proto transport body the TRD's receivers
    should join: the router's relay address and port, same transport type as
    the origin (see :func:`router.core.tr.adverts.relay_transport`). ``otid``
    is the origin's 32-byte OTID, ``origin_domain`` its TRD's domain id.
    ``topic_index`` is the TIR's topic index; None takes it from the OTID
    (:func:`lbmr_proto.um.otid_topic_index`, 0 if the OTID does not say)."""

    advert_id: int
    topic: str
    transport_body: object
    origin_domain: int
    otid: bytes
    topic_index: int | None = None
    hop_count: int = 1  # peer links between the source's TRD and this one (1: one hop)
    cost: int = 0  # what the route from this TRD to the source's costs (sum of portal costs)
    #: the origin TIR's UME, late-join and extended-functionality options as on the wire
    #: (an ADVERTISEMENT's ``tir_options``): advertised with the portal's request address
    tir_options: bytes = b""


@dataclass(frozen=True, slots=True)
class LocalInterest:
    """Receivers in this TRD want ``topic`` (``pattern``: a wildcard pattern of
    ``pattern_type`` 1 PCRE or 2 regex; exact topics have pattern_type 0)."""

    topic: str
    pattern: bool = False
    pattern_type: int = PATTERN_TOPIC


@dataclass(frozen=True, slots=True)
class LocalInterestGone:
    """The local interest in ``topic`` (same key fields as LocalInterest) ended."""

    topic: str
    pattern: bool = False
    pattern_type: int = PATTERN_TOPIC


@dataclass(frozen=True, slots=True)
class SourceSeen:
    """A source of a topic the peer wants exists in this TRD: send (or resend) an
    ADVERTISEMENT. ``first``: not reported before (or reported, then gone or no
    longer wanted). ``transport_body`` is the TIR's transport (join it to get the
    data); ``topic_index`` the TIR's topic index; ``tir_options`` its UME, late-join and
    extended-functionality options as on the wire (the ADVERTISEMENT's ``tir_options``;
    :func:`router.core.tr.adverts.origin_request_options`)."""

    topic: str
    otid: bytes
    transport_body: object
    first: bool
    topic_index: int = 0
    tir_options: bytes = b""


@dataclass(frozen=True, slots=True)
class SourceGone:
    """A reported source sent no TIR for ``source_timeout`` seconds: withdraw it."""

    topic: str
    otid: bytes


@dataclass(frozen=True, slots=True)
class LocalInterestRefresh:
    """Local interest in ``topic`` is still alive: time to send the peer an
    INTEREST REFRESH (paced per interest, ``refresh_pacing``)."""

    topic: str
    pattern: bool = False
    pattern_type: int = PATTERN_TOPIC


@dataclass(frozen=True, slots=True)
class RemoteInterestExpired:
    """The peer's interest in ``topic`` (pattern) was not refreshed for the
    ``remote_topic`` / ``remote_pattern`` timeout and is dropped: withdraw what
    was advertised for it."""

    topic: str
    pattern_type: int = PATTERN_TOPIC
