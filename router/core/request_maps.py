"""Requests and responses across routers, sans-IO: the maps that bring an
answer back (``lbmr-router(8)``, "Requests and responses").

A request (LBMC REQUEST header) names the requester's request listener, to
which each responder connects and sends its response UIMs; a late-join or
retransmission request names the listener its answer is unicast to
(:mod:`router.core.message_addresses` reads and writes those addresses). Across
a router that address is in another TRD, often unreachable from there. So:

* the router in the answerers' TRD (a request's receivers; "B") rewrites the
  address in each such message of a proxied session to a listener of its
  own (:func:`router.core.message_addresses.rewrite_answer_address`), one
  listener per distinct original requester (:class:`RequestMap`), so that the
  request index, which only the requester can interpret, need not change: the
  response bytes pass unchanged;
* the router where the origin session lives ("A") records the requesters it
  saw in requests of each origin session (:class:`RequesterTable`) and
  connects, for a response coming back across the peer links, only to one of
  those: a peer can never make it connect to an arbitrary address.

Everything here takes and returns values: times are seconds on the caller's
monotonic clock (``now``), addresses dotted-quad IPv4 strings and ports ints.
Bounds: a map never holds more than its ``max_*`` entries; entries idle for
``idle_timeout`` seconds go at :meth:`RequestMap.expire` /
:meth:`RequesterTable.expire`.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

__all__ = [
    "RequesterKey", "RequestSlot", "RewriteTo", "NeedListener", "Unmapped", "PassUnchanged",
    "RequestRoute", "RequestMap", "RequesterTable",
    "DEFAULT_MAX_LISTENERS", "DEFAULT_IDLE_TIMEOUT", "DEFAULT_MAX_RESPONDERS",
    "DEFAULT_MAX_RESPONDERS_TOTAL", "DEFAULT_LISTENER_RETRY",
    "DEFAULT_MAX_PER_ORIGIN", "DEFAULT_MAX_REQUESTERS", "DEFAULT_SPARE_LISTENERS",
]


# ------------------------------------------------------------------ receivers' side

#: request listeners of one endpoint portal
DEFAULT_MAX_LISTENERS = 256
#: seconds a listener (or a recorded requester) lives after its last request or response
DEFAULT_IDLE_TIMEOUT = 600.0
#: responder connections open at once on one request listener, and on all of them
DEFAULT_MAX_RESPONDERS = 64
DEFAULT_MAX_RESPONDERS_TOTAL = 1024
#: seconds without opening a listener after opening one failed
DEFAULT_LISTENER_RETRY = 1.0
#: listeners ready and unassigned for new requesters (:meth:`RequestMap.map_request`)
DEFAULT_SPARE_LISTENERS = 16


class RequesterKey(NamedTuple):
    """An original requester: ``ip`` and ``port`` as its requests name them in the origin's
    TRD, and ``origin``, what names the origin session at this router (e.g. the link and
    advert id of the session's advertisement): the same address behind two origins (two
    TRDs with the same private networks) is two requesters."""

    origin: Hashable
    ip: str
    port: int


@dataclass(slots=True, eq=False)
class RequestSlot:
    """One request listener of the receivers' router and the requester it stands for.
    ``listener``: the (ip, port) it listens on in the receivers' TRD (what requests are
    rewritten to); ``last_used``: time of the last request through it, or of the last
    responder leaving; ``responders``: responder connections open on it now."""

    key: RequesterKey
    listener: tuple[str, int]
    created: float
    last_used: float
    requests: int = 0
    responders: int = 0


@dataclass(frozen=True, slots=True)
class RewriteTo:
    """Rewrite the request to ``slot.listener`` (counted ``requests_rewritten``)."""

    slot: RequestSlot


@dataclass(frozen=True, slots=True)
class NeedListener:
    """No listener stands for ``key`` yet and there is room: open one in the receivers'
    TRD, then :meth:`RequestMap.add` it (or :meth:`RequestMap.listener_failed`)."""

    key: RequesterKey


class Unmapped(Enum):
    """Why a request passes with its address unchanged."""

    FULL = "every request listener is in use"
    LISTENER_FAILED = "opening a request listener failed a moment ago"
    NO_LISTENER_READY = "more new requesters at once than listeners ready (spares)"
    NO_PORT = "the request names port 0: nobody to answer"


@dataclass(frozen=True, slots=True)
class PassUnchanged:
    """The request passes with its address unchanged (counted ``requests_unmapped_full``
    or ``requests_unmapped_failed``): its receivers still get it as a message; answering it
    needs a direct route from the responders to the requester, as without a router."""

    key: RequesterKey
    reason: Unmapped


RequestRoute = RewriteTo | NeedListener | PassUnchanged


class RequestMap:
    """The request listeners of one endpoint portal on the receivers' side: one per
    distinct original requester (:class:`RequesterKey`), at most ``max_listeners``, each
    closed after ``idle_timeout`` seconds without a request or a responder; at most
    ``max_responders`` responder connections at once on one listener and
    ``max_responders_total`` on all.

    Calling contract: for a message of a proxied session with a REQUEST header,
    :meth:`route` says what to do (:data:`RequestRoute`); a responder connecting to a
    listener is :meth:`responder_connected` (and :meth:`responder_closed`); the caller
    calls :meth:`expire` at :meth:`next_expiry` and closes the listeners it returns, and
    :meth:`forget_origin` when an origin session goes away.

    A full map passes new requesters' requests unchanged (:class:`PassUnchanged`): a
    request is a data message, and dropping it would be a gap in the session; no listener
    is taken from another requester while it may still be answered. So does a map whose
    last attempt to open a listener failed less than ``listener_retry`` seconds ago
    (descriptors or ports run out: not retried for every request).

    Listeners ready in advance (the message path maps requests synchronously, sans-IO,
    as messages pass; it cannot wait for a socket): the caller keeps up to
    ``spare_listeners`` listeners open and unassigned (:meth:`spares_wanted`,
    :meth:`add_spare`); :meth:`map_request` gives a new requester one of them at once
    (:meth:`take_added`: the slots to start serving), and passes the request unchanged
    when none is left (counted ``requests_unmapped_waiting``; the caller opens more after
    the run). Slots the map removes on its own (expired while making room) are handed
    back by :meth:`take_expired`.

    ``counters`` (the router's, or a new Counter): ``requests_rewritten``,
    ``requests_unmapped_full``, ``requests_unmapped_failed``,
    ``requests_unmapped_waiting``, ``requests_unmapped_no_port``,
    ``request_listeners_opened``, ``request_listeners_failed``,
    ``request_listeners_expired``, ``request_listeners_forgotten``,
    ``responders_accepted``, ``responders_refused_busy`` (the listener, or all of them,
    had their most), ``responders_refused_unknown`` (the listener is gone)."""

    def __init__(self, *, max_listeners: int = DEFAULT_MAX_LISTENERS,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                 max_responders: int = DEFAULT_MAX_RESPONDERS,
                 max_responders_total: int = DEFAULT_MAX_RESPONDERS_TOTAL,
                 listener_retry: float = DEFAULT_LISTENER_RETRY,
                 spare_listeners: int = DEFAULT_SPARE_LISTENERS,
                 counters: Counter[str] | None = None) -> None:
        if min(max_listeners, max_responders, max_responders_total) < 1 or idle_timeout <= 0 \
                or listener_retry < 0 or spare_listeners < 0:
            raise ValueError("max_listeners, max_responders and max_responders_total must be at least 1, "
                             "idle_timeout positive, listener_retry and spare_listeners not negative")
        self.max_listeners = max_listeners
        self.idle_timeout = idle_timeout
        self.max_responders = max_responders
        self.max_responders_total = max_responders_total
        self.listener_retry = listener_retry
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self.responders = 0  # responder connections open on all the listeners
        self._slots: dict[RequesterKey, RequestSlot] = {}
        self._idle: OrderedDict[RequesterKey, None] = OrderedDict()  # slots without responders, oldest use first
        self._retry_at = float("-inf")  # no listener opened before (after a failure)
        self.spare_listeners = spare_listeners
        self._spare: list[tuple[str, int]] = []  # listeners open, not yet standing for a requester
        self._added: list[RequestSlot] = []  # slots map_request made since take_added
        self._expired: list[RequestSlot] = []  # slots route removed to make room, since take_expired

    def __len__(self) -> int:
        return len(self._slots)

    def get(self, key: RequesterKey) -> RequestSlot | None:
        return self._slots.get(key)

    def slots(self) -> list[RequestSlot]:
        return list(self._slots.values())

    def route(self, key: RequesterKey, now: float) -> RequestRoute:
        """What to do with a request of requester ``key`` at ``now``."""
        slot = self._slots.get(key)
        if slot is not None:
            slot.last_used = now
            slot.requests += 1
            if key in self._idle:
                self._idle.move_to_end(key)
            self.counters["requests_rewritten"] += 1
            return RewriteTo(slot)
        if now < self._retry_at:
            self.counters["requests_unmapped_failed"] += 1
            return PassUnchanged(key, Unmapped.LISTENER_FAILED)
        if len(self._slots) >= self.max_listeners:
            self._expired += self.expire(now)
            if len(self._slots) >= self.max_listeners:
                self.counters["requests_unmapped_full"] += 1
                return PassUnchanged(key, Unmapped.FULL)
        return NeedListener(key)

    def map_request(self, key: RequesterKey, now: float) -> RewriteTo | PassUnchanged:
        """:meth:`route`, with a :class:`NeedListener` answered at once by a spare listener
        (the new slot is also in :meth:`take_added`), or, with none left, passed unchanged
        (:data:`Unmapped.NO_LISTENER_READY`, counted ``requests_unmapped_waiting``). A
        request naming port 0 passes unchanged (counted ``requests_unmapped_no_port``):
        no listener is spent on it."""
        if not key.port:
            self.counters["requests_unmapped_no_port"] += 1
            return PassUnchanged(key, Unmapped.NO_PORT)
        got = self.route(key, now)
        if not isinstance(got, NeedListener):
            return got
        if not self._spare:
            self.counters["requests_unmapped_waiting"] += 1
            return PassUnchanged(key, Unmapped.NO_LISTENER_READY)
        slot = self.add(key, self._spare.pop(0), now)
        self._added.append(slot)
        return RewriteTo(slot)

    def spares_wanted(self, now: float) -> int:
        """How many more spare listeners to open now: up to ``spare_listeners``, never
        more than the map has room for, none within ``listener_retry`` of a failure."""
        if now < self._retry_at:
            return 0
        room = min(self.spare_listeners, self.max_listeners - len(self._slots))
        return max(0, room - len(self._spare))

    def add_spare(self, listener: tuple[str, int]) -> None:
        """A listener the caller opened for :meth:`spares_wanted`."""
        self._spare.append(listener)

    def spares(self) -> list[tuple[str, int]]:
        return list(self._spare)

    def take_spares(self) -> list[tuple[str, int]]:
        """The spare listeners, taken out (close them: the caller is going away)."""
        out, self._spare = self._spare, []
        return out

    def take_added(self) -> list[RequestSlot]:
        """The slots :meth:`map_request` made since the last call (serve their listeners)."""
        out, self._added = self._added, []
        return out

    def take_expired(self) -> list[RequestSlot]:
        """The slots :meth:`route` expired to make room since the last call (close them)."""
        out, self._expired = self._expired, []
        return out

    def add(self, key: RequesterKey, listener: tuple[str, int], now: float) -> RequestSlot:
        """The listener the caller opened after :class:`NeedListener` for ``key``; counts the
        request that asked for it as rewritten. ValueError if ``key`` has one already or the
        map is full (call it right after :meth:`route`)."""
        if key in self._slots or len(self._slots) >= self.max_listeners:
            raise ValueError(f"{key} already has a listener, or the map is full: add() follows NeedListener")
        slot = self._slots[key] = RequestSlot(key, listener, now, now, requests=1)
        self._idle[key] = None
        self.counters["request_listeners_opened"] += 1
        self.counters["requests_rewritten"] += 1
        return slot

    def listener_failed(self, now: float) -> None:
        """Opening the listener :class:`NeedListener` asked for failed at ``now``: its request
        passes unchanged, and so do new requesters' for ``listener_retry`` seconds."""
        self._retry_at = now + self.listener_retry
        self.counters["request_listeners_failed"] += 1
        self.counters["requests_unmapped_failed"] += 1

    def spare_failed(self, now: float) -> None:
        """Opening a spare listener failed at ``now``: none is tried again for
        ``listener_retry`` seconds (counted ``request_listeners_failed``)."""
        self._retry_at = now + self.listener_retry
        self.counters["request_listeners_failed"] += 1

    def _current(self, slot: RequestSlot) -> bool:
        return self._slots.get(slot.key) is slot

    def responder_connected(self, slot: RequestSlot, now: float) -> bool:
        """A responder connected to ``slot``'s listener: True to take it (open the response
        stream towards ``slot.key``), False to refuse it (the listener is gone, or it or all
        of them have their most responders)."""
        if not self._current(slot):
            self.counters["responders_refused_unknown"] += 1
            return False
        if slot.responders >= self.max_responders or self.responders >= self.max_responders_total:
            self.counters["responders_refused_busy"] += 1
            return False
        slot.responders += 1
        self.responders += 1
        slot.last_used = now
        self._idle.pop(slot.key, None)
        self.counters["responders_accepted"] += 1
        return True

    def responder_closed(self, slot: RequestSlot, now: float) -> None:
        """A responder connection taken on ``slot``'s listener ended."""
        if not self._current(slot) or slot.responders == 0:
            return  # (forget_origin let its responders go already)
        slot.responders -= 1
        self.responders -= 1
        slot.last_used = now
        if slot.responders == 0:
            self._idle[slot.key] = None

    def next_expiry(self) -> float:
        """When :meth:`expire` next has something to do (inf: never, as things stand)."""
        for key in self._idle:
            return self._slots[key].last_used + self.idle_timeout
        return float("inf")

    def expire(self, now: float) -> list[RequestSlot]:
        """Remove the listeners idle for ``idle_timeout`` seconds with no responder
        connected; returns them (close them)."""
        gone = []
        while self._idle:
            key = next(iter(self._idle))
            slot = self._slots[key]
            if slot.last_used + self.idle_timeout > now:
                break
            del self._idle[key]
            del self._slots[key]
            gone.append(slot)
        self.counters["request_listeners_expired"] += len(gone)
        return gone

    def forget_origin(self, origin: Hashable) -> list[RequestSlot]:
        """The origin session ``origin`` is gone (withdrawn, its link down): remove its
        listeners, whatever their responders; returns them (close them and their
        responder connections)."""
        gone = [s for k, s in self._slots.items() if k.origin == origin]
        for s in gone:
            del self._slots[s.key]
            self._idle.pop(s.key, None)
            self.responders -= s.responders
        self.counters["request_listeners_forgotten"] += len(gone)
        return gone

# ------------------------------------------------------------------ origin side

#: distinct requesters recorded per origin session
DEFAULT_MAX_PER_ORIGIN = 64
#: distinct requesters recorded in all
DEFAULT_MAX_REQUESTERS = 4096


class RequesterTable:
    """The requesters a router saw in requests of each origin session it serves (the
    sources' side): a response arriving across the peer links for (origin, ip, port) is
    delivered -- the router connects to ip:port -- only if :meth:`allows` it. At most
    ``max_per_origin`` requesters per origin and ``max_requesters`` in all; a requester
    unseen for ``idle_timeout`` seconds is forgotten.

    A full table records no new requester (its responses are refused; counted
    ``requesters_unrecorded_full``) and keeps the ones it has.

    ``counters``: ``requesters_recorded``, ``requesters_unrecorded_full``,
    ``requesters_expired``, ``responses_allowed``, ``responses_refused``."""

    def __init__(self, *, max_per_origin: int = DEFAULT_MAX_PER_ORIGIN,
                 max_requesters: int = DEFAULT_MAX_REQUESTERS,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                 counters: Counter[str] | None = None) -> None:
        if max_per_origin < 1 or max_requesters < 1 or idle_timeout <= 0:
            raise ValueError("max_per_origin and max_requesters must be at least 1, idle_timeout positive")
        self.max_per_origin = max_per_origin
        self.max_requesters = max_requesters
        self.idle_timeout = idle_timeout
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self._seen: OrderedDict[RequesterKey, float] = OrderedDict()  # last seen, oldest first
        self._per_origin: Counter[Hashable] = Counter()

    def __len__(self) -> int:
        return len(self._seen)

    def saw(self, origin: Hashable, ip: str, port: int, now: float) -> bool:
        """A request of origin session ``origin`` named requester ``ip``:``port`` at ``now``.
        False if it could not be recorded (the table is full)."""
        key = RequesterKey(origin, ip, port)
        if key in self._seen:
            self._seen[key] = now
            self._seen.move_to_end(key)
            return True
        if self._per_origin[origin] >= self.max_per_origin or len(self._seen) >= self.max_requesters:
            self.expire(now)
            if self._per_origin[origin] >= self.max_per_origin or len(self._seen) >= self.max_requesters:
                self.counters["requesters_unrecorded_full"] += 1
                return False
        self._seen[key] = now
        self._per_origin[origin] += 1
        self.counters["requesters_recorded"] += 1
        return True

    def allows(self, origin: Hashable, ip: str, port: int, now: float) -> bool:
        """Whether a response for requester ``ip``:``port`` of origin session ``origin`` may
        be delivered at ``now``: it was seen in a request of that session within
        ``idle_timeout`` seconds."""
        seen = self._seen.get(RequesterKey(origin, ip, port))
        ok = seen is not None and seen + self.idle_timeout > now
        self.counters["responses_allowed" if ok else "responses_refused"] += 1
        return ok

    def next_expiry(self) -> float:
        for seen in self._seen.values():
            return seen + self.idle_timeout
        return float("inf")

    def expire(self, now: float) -> int:
        """Forget the requesters unseen for ``idle_timeout`` seconds; returns how many."""
        n = 0
        while self._seen:
            key, seen = next(iter(self._seen.items()))
            if seen + self.idle_timeout > now:
                break
            del self._seen[key]
            self._drop(key.origin)
            n += 1
        self.counters["requesters_expired"] += n
        return n

    def forget_origin(self, origin: Hashable) -> int:
        """The origin session is gone: forget its requesters; returns how many."""
        gone = [k for k in self._seen if k.origin == origin]
        for k in gone:
            del self._seen[k]
        self._per_origin.pop(origin, None)
        return len(gone)

    def _drop(self, origin: Hashable) -> None:
        self._per_origin[origin] -= 1
        if self._per_origin[origin] <= 0:
            del self._per_origin[origin]
