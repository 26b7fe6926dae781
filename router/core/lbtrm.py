"""LBT-RM sources across the peer link, sans-IO: what the router keeps, drops
and rewrites of an LBT-RM transport session (the trio shell that owns the
sockets is :mod:`router.relays.lbtrm`).

An LBT-RM source multicasts its session (DATA, SM, NCF datagrams,
:mod:`lbmr_proto.lbtrm`) to a group and destination port; receivers ask for
what they lost with NAKs sent unicast to the source's address and unicast
port. Across a router pair:

* **far side** (the source's TRD; :class:`RmOrigin`): for a stream the peer
  opens (kind LBT-RM) the router joins the source's group and port and
  keeps the datagrams of that session only (the header's session id and
  unicast port are the advertised ones, and the sender is the advertised
  source address when it is known); those cross the link one DATAGRAM each.
  NAKs coming back over the link get the origin's unicast port and session
  id in their header and go to the source's (ip, unicast port);
* **near side** (the receivers' TRD; :class:`RmProxy`): the proxy source is
  a UDP socket at the relay address. Its advertisement (TIR) names that
  address and port as source and NAK address, a multicast group and
  destination port of this side's choosing (:class:`GroupPool`) and a
  session id of its own. Datagrams from the peer get the proxy's unicast
  port and session id in their header and are multicast to the proxy's
  group; NAKs from receivers (to the proxy's port, with the proxy's session
  id) cross the link back.

Everything else is dropped and counted: datagrams that are not LBT-RM, of
another session, NAKs on the multicast side, DATA on the NAK side. The
payload of a DATA (whole LBMC messages) passes the side's message path
when it has one (``path``, :mod:`router.core.message_path`: the far side
records the requesters its requests name, the near side points them at its
request listeners; a rewrite keeps the length); nothing else of it is
looked at or changed (message fragments, OTIDs cross as they are; a DATA
with option headers passes as it is, counted ``lbtrm_path_skipped``);
sequence numbers are the source's.
"""

from __future__ import annotations

import ipaddress
import struct
from collections import Counter, deque

from lbmr_proto import LbtrmTransport
from lbmr_proto import lbtrm as RM

__all__ = [
    "DEFAULT_GROUPS", "DEFAULT_DEST_PORT", "GroupPool", "RmOrigin", "RmProxy", "DatagramQueue",
    "otid_group",
]

DEFAULT_GROUPS = ("224.10.10.10", "224.10.10.14")  # UM's transport_lbtrm_multicast_address_low/high
DEFAULT_DEST_PORT = 14400  # UM's transport_lbtrm_destination_port
NAK_RATE = 1000.0  # NAK datagrams a second one proxy passes on ...
NAK_BURST = 200  # ... in bursts of at most this many
MULTICAST = ipaddress.IPv4Network("224.0.0.0/4")
_FORWARDED = (RM.DATA, RM.SM, RM.NCF)  # what a source sends to its group
_PAYLOAD_AT = RM.HEADER.size + RM.DATA_HDR.size  # where a DATA's payload starts (no option headers)


def _through(path, h, data: bytes, now: float, counters) -> bytes:
    """``data`` (a datagram whose header is ``h``) after the message path
    ``path`` (None or inactive: as it is): the payload of a DATA without
    option headers."""
    if path is None or h.type != RM.DATA or not path.active:
        return data
    if h.next_hdr:
        counters["lbtrm_path_skipped"] += 1
        return data
    payload = bytes(data[_PAYLOAD_AT:])
    out = path.payload(payload, now)
    return data if out is payload else bytes(data[:_PAYLOAD_AT]) + out


def otid_group(otid: bytes) -> tuple[str, int] | None:
    """The (group, destination port) inside an LBT-RM OTID laid out as UM's
    (``lbmotid.c``: type 0x10 at byte 0, group at 7, port at 11), or None
    when the OTID is not of that form or names no multicast group."""
    if len(otid) != 32 or otid[0] != 0x10:
        return None
    group = str(ipaddress.IPv4Address(otid[7:11]))
    port = struct.unpack_from("!H", otid, 11)[0]
    if ipaddress.IPv4Address(group) not in MULTICAST or port == 0:
        return None
    return group, port


def _decoded(decode, data: bytes, counters):
    """``decode(data)``, or None with ``lbtrm_malformed`` counted."""
    try:
        return decode(data)
    except RM.LbtrmDecodeError:
        counters["lbtrm_malformed"] += 1
        return None


class GroupPool:
    """Multicast groups for proxy sources on one side: ``low`` .. ``high``
    (inclusive) round robin, the least used first; with ``same`` the origin's
    own group and port (read from its OTID, :func:`otid_group`) whenever
    that can be told (the two TRDs are different networks), the range
    otherwise. ``dest_port``: the destination port for groups of the range."""

    def __init__(self, low: str = DEFAULT_GROUPS[0], high: str = DEFAULT_GROUPS[1], *,
                 dest_port: int = DEFAULT_DEST_PORT, same: bool = False) -> None:
        lo, hi = ipaddress.IPv4Address(low), ipaddress.IPv4Address(high)
        if lo not in MULTICAST or hi not in MULTICAST or hi < lo:
            raise ValueError(f"LBT-RM group range {low}..{high}: two multicast addresses, low first")
        if int(hi) - int(lo) >= 1 << 16:
            raise ValueError(f"LBT-RM group range {low}..{high}: at most 65536 groups")
        if not 0 < dest_port <= 0xFFFF:
            raise ValueError(f"LBT-RM destination port {dest_port}: 1..65535")
        self.groups = [str(ipaddress.IPv4Address(a)) for a in range(int(lo), int(hi) + 1)]
        self.dest_port = dest_port
        self.same = same
        self.users: Counter[str] = Counter()
        self._next = 0

    def take(self, otid: bytes) -> tuple[str, int]:
        """A (group, port) for a new proxy of the source with ``otid``."""
        if self.same:
            g = otid_group(otid)
            if g is not None:
                self.users[g[0]] += 1
                return g
        n = len(self.groups)
        best = min(range(n), key=lambda k: (self.users[self.groups[(self._next + k) % n]], k))
        g = self.groups[(self._next + best) % n]
        self._next = (self._next + best + 1) % n
        self.users[g] += 1
        return g, self.dest_port

    def give(self, group: str) -> None:
        """A proxy using ``group`` ended."""
        self.users[group] -= 1
        if self.users[group] <= 0:
            del self.users[group]


class DatagramQueue(deque):
    """Datagrams waiting to be sent, at most ``limit``: one more is dropped
    (the newest) and counted in ``counters[counter]``; never unbounded."""

    def __init__(self, limit: int, counters: Counter[str], counter: str) -> None:
        super().__init__()
        self.limit = limit
        self.counters = counters
        self.counter = counter

    def append(self, item) -> None:
        if len(self) >= self.limit:
            self.counters[self.counter] += 1
            return
        super().append(item)


class RmOrigin:
    """The far side of one relayed LBT-RM session: the real source ``body``
    (an :class:`lbmr_proto.LbtrmTransport`; ``ip`` 0.0.0.0 when unknown).
    ``counters`` get ``lbtrm_*`` counts; ``path``: the message path of the
    session's DATA payloads (None: none)."""

    def __init__(self, body: LbtrmTransport, counters: Counter[str] | None = None) -> None:
        if getattr(body, "NAME", None) != "LBTRM":
            raise ValueError(f"not an LBT-RM transport: {body!r}")
        self.body = body
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self.path = None

    @property
    def group(self) -> tuple[str, int]:
        return self.body.mcast_group, self.body.dest_port

    @property
    def nak_address(self) -> tuple[str, int]:
        return self.body.ip, self.body.src_ucast_port

    def from_group(self, data: bytes, src: tuple[str, int], now: float = 0.0) -> bytes | None:
        """A datagram received on the source's group at ``now`` (seconds), as it
        goes over the link (after the path), or None when it does not belong
        to the relayed session (counted)."""
        c = self.counters
        h = _decoded(RM.parse_header, data, c)
        if h is None:
            return None
        b = self.body
        if (h.session_id != b.session_id or h.ucast_port != b.src_ucast_port
                or (b.ip != "0.0.0.0" and src[0] != b.ip)):
            c["lbtrm_other_session"] += 1
            return None
        if h.type not in _FORWARDED:
            c["lbtrm_unexpected_type"] += 1
            return None
        c["lbtrm_datagrams_relayed"] += 1
        return _through(self.path, h, data, now, c)

    def nak_to_source(self, data: bytes) -> bytes | None:
        """A NAK from the peer, with the source's unicast port and session id in
        its header (send it to :attr:`nak_address`); None if it is not a
        well-formed NAK (counted)."""
        c = self.counters
        m = _decoded(RM.decode, data, c)
        if m is None:
            return None
        if not isinstance(m, RM.Nak) or not m.sqns:
            c["lbtrm_unexpected_type"] += 1
            return None
        c["lbtrm_naks_to_source"] += 1
        return RM.rewrite_header(data, self.body.src_ucast_port, self.body.session_id)


class RmProxy:
    """The near side of one relayed LBT-RM session: the proxy source at
    (``ip``, ``port``) that multicasts to (``group``, ``dest_port``) with
    session id ``session_id``. ``counters`` get ``lbtrm_*`` counts. At most
    ``nak_rate`` NAK datagrams a second (bursts of ``nak_burst``) cross the
    link: a NAK storm from the TRD is cut there (``lbtrm_naks_rate_limited``).
    ``path``: the message path of the session's DATA payloads (None: none)."""

    def __init__(self, ip: str, port: int, group: str, dest_port: int, session_id: int,
                 counters: Counter[str] | None = None, *, nak_rate: float = NAK_RATE,
                 nak_burst: int = NAK_BURST) -> None:
        self.ip, self.port = ip, port
        self.group, self.dest_port = group, dest_port
        self.session_id = session_id & 0xFFFFFFFF
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self.nak_rate, self.nak_burst = nak_rate, nak_burst
        self._tokens = float(nak_burst)
        self._tokens_at: float | None = None
        self.path = None

    @property
    def transport_body(self) -> LbtrmTransport:
        """What the proxy's TIR advertises: the router's address as source and
        NAK address, the proxy's group, port and session id."""
        return LbtrmTransport(self.ip, self.group, self.session_id, self.dest_port, self.port)

    def to_receivers(self, data: bytes, now: float = 0.0) -> bytes | None:
        """A datagram from the peer at ``now`` (seconds), rewritten for the
        receivers (multicast it to the proxy's group); None if it is not a
        DATA, SM or NCF (counted)."""
        c = self.counters
        h = _decoded(RM.parse_header, data, c)
        if h is None:
            return None
        if h.type not in _FORWARDED:
            c["lbtrm_unexpected_type"] += 1
            return None
        c["lbtrm_datagrams_emitted"] += 1
        return RM.rewrite_header(_through(self.path, h, data, now, c), self.port, self.session_id)

    def from_receiver(self, data: bytes, now: float) -> bool:
        """Is a datagram on the proxy's unicast port, at ``now`` (seconds), a
        NAK for the proxy's session within the NAK rate (to be sent over the
        link as it is)?"""
        c = self.counters
        h = _decoded(RM.parse_header, data, c)
        if h is None:
            return False
        if h.type != RM.NAK or h.session_id != self.session_id:
            c["lbtrm_unexpected_type" if h.type != RM.NAK else "lbtrm_other_session"] += 1
            return False
        if self._tokens_at is not None:
            self._tokens = min(float(self.nak_burst), self._tokens + (now - self._tokens_at) * self.nak_rate)
        self._tokens_at = now
        if self._tokens < 1.0:
            c["lbtrm_naks_rate_limited"] += 1
            return False
        self._tokens -= 1.0
        c["lbtrm_naks_from_receivers"] += 1
        return True
