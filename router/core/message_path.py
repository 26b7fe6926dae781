"""The one place every relayed LBMC message of a fanned-out session passes
whole, sans-IO: :class:`MessagePath`, and the rewrites it can make
(:class:`Rule`).

Where (each message passes once per router it crosses, at the router where
it enters the relay from its sender's side):

* TCP fan-out, origin to receivers: at the far router, the origin's session
  as the upstream connection frames it (:class:`router.core.fanout.SessionFanout`
  of the upstream, before any sink's queue); receivers to origin: at the
  near router, what each receiver sends (framed, passed, counted; today
  not sent on: :mod:`router.relays.tcp_fanout`);
* LBT-RU fan-out, origin to receivers: at the far router, the payload of
  every DATA datagram of the origin (:class:`router.core.lbtru_upstream.RuUpstream`,
  before it goes to the links); receivers to origin nothing LBMC is relayed
  (their datagrams are LBT-RU's own: connection requests, ACKs, NAKs).

A path is made of rules, typed values (:class:`SetRequestAddress`,
:class:`SetLateJoinAddress`, :class:`SetRetransmissionAddress`,
:class:`DropHeaders`); with none (the router's default today) every input
comes back as it is, at the cost of one call. With rules, a message with no
extension header (its base header's ``next_hdr`` is DATA, 0x00, or NONE,
0xFF: the common case) is not parsed: one C-level pass over a run picks
the messages that have headers, and only those are decoded. A rewritten
message may change length; the run that holds it is rebuilt (new bytes,
new message ends; when every rewrite kept its message's length, a copy of
the run patched in place, the same ends), the others are passed on
untouched (the same object).
A message the rules would make longer than 65535 bytes, or that does not
decode, passes as it is (counted: :attr:`MessagePath.too_long`,
:attr:`MessagePath.undecodable`): the path never raises on wire input.

Inputs and outputs: :meth:`MessagePath.run` takes and returns a
:class:`lbmr_proto.lbmc.MessageRun` (whole messages back to back and the
offset just past each); :meth:`MessagePath.payload` a datagram's payload
(bytes holding whole messages back to back). Byte order: the wire's
(big-endian), as :mod:`lbmr_proto.lbmc` reads it.
"""

from __future__ import annotations

import ipaddress
import re
import struct
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain, islice
from typing import ClassVar

from lbmr_proto import LBMREncodeError, lbmc

__all__ = ["MessagePath", "Rule", "SetRequestAddress", "SetLateJoinAddress", "SetRetransmissionAddress",
           "DropHeaders", "headed"]

_NO_HEADERS = bytes((lbmc.NHDR_DATA, lbmc.NHDR_NONE))
_HEADED = re.compile(b"[^%c%c]" % (lbmc.NHDR_DATA, lbmc.NHDR_NONE))  # a next_hdr that names a header
_ONE = (1).__add__
_START = struct.Struct("!BxH")  # ver_type, msglen


def headed(run: lbmc.MessageRun) -> list[int]:
    """The indexes (ascending) of the messages of ``run`` that have extension
    headers: whose base header's ``next_hdr`` (the message's byte 1) is
    neither DATA nor NONE. C-level passes only when there are none (a strided
    slice when the messages are all of one size)."""
    data, ends = run.data, run.ends
    n, size = len(ends), ends[0]
    if ends[-1] == size * n and ends == list(range(size, size * n + 1, size)):  # messages of one size
        nexts = bytes(memoryview(data)[1::size])
    else:
        nexts = bytes(map(data.__getitem__, map(_ONE, chain((0,), islice(ends, n - 1)))))
    if not nexts.translate(None, _NO_HEADERS):
        return []
    return [m.start() for m in _HEADED.finditer(nexts)]


class Rule(ABC):
    """A rewrite of the headers of type ``CODES`` (codes as on the wire)."""

    __slots__ = ()
    CODES: ClassVar[frozenset[int]]

    @abstractmethod
    def rewrite(self, header):
        """The header to put in place of ``header`` (itself: unchanged; None: removed)."""


@dataclass(frozen=True, slots=True)
class _SetAddress(Rule):
    """A rule that puts (``ip``, ``port``) in a header: a dotted quad and a
    u16, checked when the rule is made (ValueError)."""

    ip: str
    port: int

    def __post_init__(self) -> None:
        ipaddress.IPv4Address(self.ip)  # ValueError if not a dotted quad
        if not (isinstance(self.port, int) and 0 <= self.port <= 0xFFFF):
            raise ValueError(f"port {self.port!r}: not a u16")


@dataclass(frozen=True, slots=True)
class SetRequestAddress(_SetAddress):
    """REQUEST headers (0x04) name (``ip``, ``port``) as the requester's
    request port (the responder connects there)."""

    CODES: ClassVar[frozenset[int]] = frozenset({lbmc.RequestHeader.CODE})

    def rewrite(self, header):
        if header.ipaddr == self.ip and header.port == self.port:
            return header
        h = header
        return lbmc.RequestHeader(h.flags, h.transport, h.qidx, self.port, h.reserved, self.ip)


@dataclass(frozen=True, slots=True)
class SetLateJoinAddress(_SetAddress):
    """Late-join requests (LJI_REQ, 0x4E) ask for the answer at (``ip``, ``port``)."""

    CODES: ClassVar[frozenset[int]] = frozenset({lbmc.LateJoinRequestHeader.CODE})

    def rewrite(self, header):
        if header.req_ip == self.ip and header.req_port == self.port:
            return header
        h = header
        return lbmc.LateJoinRequestHeader(h.flags, h.request_idx, h.transport_idx, h.topic_idx, self.ip, self.port,
                                          h.reserved, h.tx_low_sqn, h.rx_req_max, h.rx_req_outstanding_max)


@dataclass(frozen=True, slots=True)
class SetRetransmissionAddress(_SetAddress):
    """Retransmission requests (UME_RXREQ, 0x15) ask for the retransmission at (``ip``, ``port``)."""

    CODES: ClassVar[frozenset[int]] = frozenset({lbmc.UmeRxReqHeader.CODE})

    def rewrite(self, header):
        if header.rx_ip == self.ip and header.rx_port == self.port:
            return header
        h = header
        return lbmc.UmeRxReqHeader(h.flags, h.request_idx, h.transport_idx, h.id_2, h.seqnum, self.port,
                                   h.reserved, self.ip)


@dataclass(frozen=True, slots=True)
class DropHeaders(Rule):
    """Headers of the types ``codes`` are taken out of the chain (the message shrinks)."""

    codes: frozenset[int]

    @property
    def CODES(self) -> frozenset[int]:  # noqa: N802 (the rules' common name)
        return self.codes

    def rewrite(self, header):
        return None


def _code(h) -> int:
    return h.code if isinstance(h, lbmc.UnknownHeader) else h.CODE


def _size(h) -> int:
    """Bytes of header ``h`` on the wire."""
    return 2 + len(h.data) if isinstance(h, lbmc.UnknownHeader) else h.SIZE


class MessagePath:
    """The rewrites ``rules`` (in order; module doc) of one direction of the
    relayed sessions. ``rewritten``: messages changed; ``undecodable``:
    messages with headers that did not decode, and payloads that were not
    whole messages; ``too_long``: rewrites not made because the message
    would pass 65535 bytes (all passed as they were)."""

    __slots__ = ("rules", "_by_code", "rewritten", "undecodable", "too_long")

    def __init__(self, rules: Iterable[Rule] = ()) -> None:
        self.rules = tuple(rules)
        self._by_code: dict[int, tuple[Rule, ...]] = {}
        for r in self.rules:
            for code in r.CODES:
                self._by_code[code] = (*self._by_code.get(code, ()), r)
        self.rewritten = 0
        self.undecodable = 0
        self.too_long = 0

    @property
    def active(self) -> bool:
        """Whether any message can be changed (False: every input comes back as it is)."""
        return bool(self._by_code)

    def run(self, run: lbmc.MessageRun) -> lbmc.MessageRun:
        """``run`` after the rules: itself when no message changed, else a new
        run (new bytes; the messages not changed copied as they were)."""
        if not self._by_code:
            return run
        which = headed(run)
        return self.run_at(run, which) if which else run

    def run_at(self, run: lbmc.MessageRun, which: list[int]) -> lbmc.MessageRun:
        """:meth:`run` for a caller that has the run's :func:`headed` indexes
        ``which`` already (the messages not in it are not looked at)."""
        data, ends = run.data, run.ends
        changes: list[tuple[int, bytes]] = []
        for i in which:
            new = self._message(data[ends[i - 1] if i else 0:ends[i]])
            if new is not None:
                changes.append((i, new))
        if not changes:
            return run
        if all(len(new) == ends[i] - (ends[i - 1] if i else 0) for i, new in changes):
            # lengths kept (addresses rewritten): the run copied once and patched, the ends as they were
            buf = bytearray(data)
            for i, new in changes:
                buf[ends[i] - len(new):ends[i]] = new
            return lbmc.MessageRun(memoryview(buf).toreadonly(), ends)
        parts: list = []
        new_ends: list[int] = []
        prev_i, prev_end, shift = 0, 0, 0
        for i, new in changes:
            start = ends[i - 1] if i else 0
            parts.append(data[prev_end:start])
            new_ends += [e + shift for e in ends[prev_i:i]]
            parts.append(new)
            shift += len(new) - (ends[i] - start)
            new_ends.append(ends[i] + shift)
            prev_i, prev_end = i + 1, ends[i]
        parts.append(data[prev_end:])
        new_ends += [e + shift for e in ends[prev_i:]]
        return lbmc.MessageRun(b"".join(parts), new_ends)

    def payload(self, data: bytes) -> bytes:
        """A datagram's payload (whole LBMC messages back to back) after the
        rules: ``data`` itself when nothing changed (or it is not whole
        messages: counted, passed as it is)."""
        if not self._by_code:
            return data
        ends, pos, n = [], 0, len(data)
        unpack = _START.unpack_from
        while n - pos >= 4:
            msglen = unpack(data, pos)[1]
            if msglen < 4:
                break
            pos += msglen
            ends.append(pos)
        if pos != n or not ends:
            self.undecodable += 1
            return data
        out = self.run(lbmc.MessageRun(data, ends))
        return data if out.data is data else bytes(out.data)

    def _message(self, message) -> bytes | None:
        """The rewritten message, or None when it stays as it is. Headers
        replaced by ones of the same type and length are written over the old
        ones in a copy of the message; any other change encodes it anew."""
        try:
            m = lbmc.decode(message)
        except lbmc.LbmcDecodeError:
            self.undecodable += 1
            return None
        hs = m.headers
        off = lbmc.DATA_HEADER.size if m.kind in lbmc.DATA_KINDS else lbmc.CONTROL_HEADER.size
        headers, patches, in_place = [], [], True
        for k, h in enumerate(hs):
            size = _size(h)
            new = h
            for rule in self._by_code.get(_code(h), ()):
                new = rule.rewrite(new)
                if new is None:
                    break
            if new is not h:
                if new is None or type(new) is not type(h) or _size(new) != size:
                    in_place = False
                elif in_place:
                    try:
                        patches.append((off, new.encode(_code(hs[k + 1]) if k + 1 < len(hs) else m.end)))
                    except LBMREncodeError:  # a rule's value out of range: the message as it was
                        self.undecodable += 1
                        return None
            if new is not None:
                headers.append(new)
            off += size
        if in_place:
            if not patches:
                return None
            out = bytearray(message)
            for at, b in patches:
                out[at:at + len(b)] = b
            self.rewritten += 1
            return bytes(out)
        try:
            encoded = lbmc.encode(lbmc.Message(m.kind, m.tidx, m.sqn, m.payload, tuple(headers), m.end))
        except LBMREncodeError:
            self.too_long += 1
            return None
        self.rewritten += 1
        return encoded
