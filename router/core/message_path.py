"""The one place every relayed LBMC message of a fanned-out session passes
whole, sans-IO: :class:`MessagePath`, and the rewrites it can make
(:class:`AddressRule`, :class:`Rule`).

Where (each message passes once per router it crosses, on each side):

* origin to receivers, at the far router (the origin's): the origin's TCP
  session as the upstream connection frames it (:class:`router.core.fanout.SessionFanout`
  of the upstream, before any sink's queue), the payload of every DATA of an
  LBT-RU origin (:class:`router.core.lbtru_upstream.RuUpstream`) and of an
  LBT-RM origin (:class:`router.core.lbtrm.RmOrigin`), before they go to the
  links: the endpoint's ``downstream_rules`` and the recording of the
  requesters (:class:`RecordRequesters`);
* origin to receivers, at the near router (the receivers'): the session as
  the proxy frames it (the proxy's ``SessionFanout``), the payload of each
  new DATA of an LBT-RU proxy source (:class:`router.core.lbtru_fanout.RuFanout`)
  and of each DATA an LBT-RM proxy multicasts (:class:`router.core.lbtrm.RmProxy`):
  the requests pointed at the router's request listeners (:class:`MapRequests`,
  :mod:`router.relays.responses`);
* receivers to origin: at the near router, what each TCP receiver sends
  (framed, passed, counted; not sent on: :mod:`router.relays.tcp_fanout`);
  nothing LBMC of LBT-RU or LBT-RM receivers is relayed (their datagrams are
  the transport's own: connection requests, ACKs, NAKs).

A path is made of rules, typed values. Address rules (:class:`AddressRule`:
:class:`SetRequestAddress`, :class:`MapRequests`,
:class:`RecordRequesters`, :class:`CountRequests`) see the address a REQUEST
header names and may put another in its place (UM sends LJI_REQ and
UME_RXREQ to a source's request port, not in the session: they take the
request listener's path, :mod:`router.core.recovery`): the
header is found by walking the chain and the address written over at its
offsets (:mod:`router.core.message_addresses`: the one implementation), the message
is not decoded and keeps its length. Header rules (:class:`Rule`:
:class:`DropHeaders`) see decoded headers and may change anything, after
the address rules. With no rule every input comes back as it is, at the
cost of one call. With rules, a message with no
extension header (its base header's ``next_hdr`` is DATA, 0x00, or NONE,
0xFF: the common case) is not parsed: one C-level pass over a run picks
the messages that have headers, and only those are looked at. A rewritten
message may change length; the run that holds it is rebuilt (new bytes,
new message ends; when every rewrite kept its message's length, a copy of
the run patched in place, the same ends), the others are passed on
untouched (the same object).
A message the rules would make longer than 65535 bytes, or that does not
decode, passes as it is (counted: :attr:`MessagePath.too_long`,
:attr:`MessagePath.undecodable`): the path never raises on wire input.
Rules that keep time take ``now`` (seconds, the caller's clock) from
:meth:`MessagePath.run` and :meth:`MessagePath.payload`.

Inputs and outputs: :meth:`MessagePath.run` takes and returns a
:class:`lbmr_proto.lbmc_stream.MessageRun` (whole messages back to back and the
offset just past each); :meth:`MessagePath.payload` a datagram's payload
(bytes holding whole messages back to back). Byte order: the wire's
(big-endian), as :mod:`lbmr_proto.lbmc` reads it.
"""

from __future__ import annotations

import re
import struct
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from itertools import chain, islice
from typing import ClassVar

from lbmr_proto import LBMREncodeError, lbmc, lbmc_stream

from .message_addresses import (
    REQUEST,
    AnswerAddress,
    AnswerHeader,
    answer_at,
    find_header,
    packed_address,
    write_answer_at,
)
from .request_maps import RequesterKey, RequesterTable, RequestMap, RewriteTo

__all__ = ["MessagePath", "Rule", "AddressRule", "SetRequestAddress",
           "MapRequests", "RecordRequesters", "CountRequests", "DropHeaders",
           "headed"]

_NO_HEADERS = bytes((lbmc.NHDR_DATA, lbmc.NHDR_NONE))
_HEADED = re.compile(b"[^%c%c]" % (lbmc.NHDR_DATA, lbmc.NHDR_NONE))  # a next_hdr that names a header
_ONE = (1).__add__
_START = struct.Struct("!BxH")  # ver_type, msglen


def headed(run: lbmc_stream.MessageRun) -> list[int]:
    """The indexes (ascending) of the messages of ``run`` that have extension
    headers: whose base header's ``next_hdr`` (the message's byte 1) is
    neither DATA nor NONE. C-level passes only when there are none (a strided
    slice when the messages are all of one size)."""
    data, ends = run.data, run.ends
    n, size = len(ends), ends[0]
    if type(ends) is range or (ends[-1] == size * n and ends == list(range(size, size * n + 1, size))):
        nexts = bytes(memoryview(data)[1::size])  # messages of one size
    else:
        nexts = bytes(map(data.__getitem__, map(_ONE, chain((0,), islice(ends, n - 1)))))
    if not nexts.translate(None, _NO_HEADERS):
        return []
    return [m.start() for m in _HEADED.finditer(nexts)]


class Rule(ABC):
    """A rewrite of the headers of type ``CODES`` (codes as on the wire), given
    the decoded header (:meth:`rewrite`): any change, the length too."""

    __slots__ = ()
    CODES: ClassVar[frozenset[int]]

    @abstractmethod
    def rewrite(self, header):
        """The header to put in place of ``header`` (itself: unchanged; None: removed)."""


class AddressRule(ABC):
    """A rule on the answer address of the headers of one type (``HEADER``, a
    :class:`router.core.message_addresses.AnswerHeader`: REQUEST, LJI_REQ, UME_RXREQ):
    :meth:`address` is shown what each such header names and says where it
    should name instead. The path reads and writes the address in place, at
    the header's offsets (:func:`router.core.message_addresses.answer_at`,
    :func:`router.core.message_addresses.write_answer_at`): no decoding, the message's
    length kept."""

    __slots__ = ()
    HEADER: ClassVar[AnswerHeader]

    @abstractmethod
    def address(self, named: AnswerAddress, now: float) -> tuple[str, int] | None:
        """The (ip, port) to put in place of ``named``'s, or None: unchanged.
        ``now``: seconds, the caller's clock (what the path was given)."""


@dataclass(frozen=True, slots=True)
class _SetAddress(AddressRule):
    """A rule that puts (``ip``, ``port``) in every header of its type: a
    dotted quad and a u16, checked when the rule is made (ValueError)."""

    ip: str
    port: int

    def __post_init__(self) -> None:
        packed_address(self.ip, self.port)  # ValueError if not a dotted quad and a port 1..65535

    def address(self, named: AnswerAddress, now: float) -> tuple[str, int]:
        return self.ip, self.port


@dataclass(frozen=True, slots=True)
class SetRequestAddress(_SetAddress):
    """REQUEST headers (0x04) name (``ip``, ``port``) as the requester's
    request port (the responder connects there)."""

    HEADER: ClassVar[AnswerHeader] = REQUEST


@dataclass(frozen=True, slots=True, eq=False)
class MapRequests(AddressRule):
    """The receivers' side of a proxied session (``origin``: what names it in
    ``requests``' keys): each REQUEST header is pointed at the request
    listener of ``requests`` (:class:`router.core.request_maps.RequestMap`) that
    stands for its requester (:meth:`~router.core.request_maps.RequestMap.map_request`);
    the request index stays. A request the map cannot give a listener passes
    unchanged (counted there)."""

    requests: RequestMap
    origin: Hashable
    HEADER: ClassVar[AnswerHeader] = REQUEST

    def address(self, named: AnswerAddress, now: float) -> tuple[str, int] | None:
        got = self.requests.map_request(RequesterKey(self.origin, named.ip, named.port), now)
        return got.slot.listener if isinstance(got, RewriteTo) else None


@dataclass(frozen=True, slots=True, eq=False)
class RecordRequesters(AddressRule):
    """The origin's side of a session (``origin``: what names it in
    ``requesters``' keys): every requester its REQUEST headers name is
    recorded (:meth:`router.core.request_maps.RequesterTable.saw`), so that a
    response for it may come back; nothing is changed."""

    requesters: RequesterTable
    origin: Hashable
    HEADER: ClassVar[AnswerHeader] = REQUEST

    def address(self, named: AnswerAddress, now: float) -> None:
        self.requesters.saw(self.origin, named.ip, named.port, now)
        return None


@dataclass(frozen=True, slots=True, eq=False)
class CountRequests(AddressRule):
    """Every REQUEST header is counted in ``counters[counter]`` and left as
    it is (a session whose requests cannot be mapped: the peer does not
    relay responses)."""

    counters: Counter
    counter: str
    HEADER: ClassVar[AnswerHeader] = REQUEST

    def address(self, named: AnswerAddress, now: float) -> None:
        self.counters[self.counter] += 1
        return None


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
    """The rewrites ``rules`` (in order; module doc) of one direction of a
    relayed session: :class:`AddressRule` s (answer addresses, in place) and
    :class:`Rule` s (any header change; applied after the address rules).
    ``rewritten``: messages changed; ``undecodable``: messages with headers
    that did not decode, and payloads that were not whole messages;
    ``too_long``: rewrites not made because the message would pass 65535
    bytes (all passed as they were)."""

    __slots__ = ("rules", "_by_code", "_addresses", "rewritten", "undecodable", "too_long")

    def __init__(self, rules: Iterable[Rule | AddressRule] = ()) -> None:
        self.rules = tuple(rules)
        self._by_code: dict[int, tuple[Rule, ...]] = {}
        addresses: dict[AnswerHeader, tuple[AddressRule, ...]] = {}
        for r in self.rules:
            if isinstance(r, AddressRule):
                addresses[r.HEADER] = (*addresses.get(r.HEADER, ()), r)
                continue
            for code in r.CODES:
                self._by_code[code] = (*self._by_code.get(code, ()), r)
        self._addresses = tuple(addresses.items())
        self.rewritten = 0
        self.undecodable = 0
        self.too_long = 0

    @property
    def active(self) -> bool:
        """Whether any message can be changed or looked at (False: every input
        comes back as it is)."""
        return bool(self._by_code or self._addresses)

    def run(self, run: lbmc_stream.MessageRun, now: float = 0.0) -> lbmc_stream.MessageRun:
        """``run`` after the rules: itself when no message changed, else a new
        run (new bytes; the messages not changed copied as they were).
        ``now``: seconds on the caller's clock, for the rules that keep time."""
        if not self.active:
            return run
        which = headed(run)
        return self.run_at(run, which, now) if which else run

    def run_at(self, run: lbmc_stream.MessageRun, which: list[int], now: float = 0.0) -> lbmc_stream.MessageRun:
        """:meth:`run` for a caller that has the run's :func:`headed` indexes
        ``which`` already (the messages not in it are not looked at)."""
        data, ends = run.data, run.ends
        changes: list[tuple[int, bytes]] = []
        for i in which:
            new = self._message(data[ends[i - 1] if i else 0:ends[i]], now)
            if new is not None:
                changes.append((i, new))
        if not changes:
            return run
        if all(len(new) == ends[i] - (ends[i - 1] if i else 0) for i, new in changes):
            # lengths kept (addresses rewritten): the run copied once and patched, the ends as they were
            buf = bytearray(data)
            for i, new in changes:
                buf[ends[i] - len(new):ends[i]] = new
            return lbmc_stream.MessageRun(memoryview(buf).toreadonly(), ends)
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
        return lbmc_stream.MessageRun(b"".join(parts), new_ends)

    def payload(self, data: bytes, now: float = 0.0) -> bytes:
        """A datagram's payload (whole LBMC messages back to back) after the
        rules: ``data`` itself when nothing changed (or it is not whole
        messages: counted, passed as it is)."""
        if not self.active:
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
        out = self.run(lbmc_stream.MessageRun(data, ends), now)
        return data if out.data is data else bytes(out.data)

    def _message(self, message, now: float) -> bytes | None:
        """The rewritten message, or None when it stays as it is (counted)."""
        out = self._addressed(message, now) if self._addresses else None
        if out is False:
            return None  # undecodable
        if self._by_code:
            new = self._headers(message if out is None else bytes(out))
            if new is not None:
                self.rewritten += 1
                return new
        if out is None:
            return None
        self.rewritten += 1
        return bytes(out)

    def _addressed(self, message, now: float) -> bytearray | None | bool:
        """The message with the address rules' addresses written in (a copy), None
        when none changed, False when its chain does not decode (counted)."""
        out = None
        try:
            for header, rules in self._addresses:
                for off in find_header(message, header.code, header.size):
                    named = answer_at(message, off, header)
                    was = where = (named.ip, named.port)
                    for rule in rules:
                        got = rule.address(named, now)
                        if got is not None:
                            where = got
                            named = AnswerAddress(named.index, *got)
                    if where != was:
                        if out is None:
                            out = bytearray(message)
                        write_answer_at(out, off, header, packed_address(*where))
        except lbmc.LbmcDecodeError:
            self.undecodable += 1
            return False
        except ValueError:  # a rule's address out of range: the message as it was
            self.undecodable += 1
            return False
        return out

    def _headers(self, message) -> bytes | None:
        """The message after the header rules, or None when it stays as it is.
        Headers replaced by ones of the same type and length are written over the
        old ones in a copy of the message; any other change encodes it anew."""
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
            return bytes(out)
        try:
            return lbmc.encode(lbmc.Message(m.kind, m.tidx, m.sqn, m.payload, tuple(headers), m.end))
        except LBMREncodeError:
            self.too_long += 1
            return None
