"""The sans-IO model of one UM context's topic resolution (no sockets, no clock)."""

from __future__ import annotations

import dataclasses
import math
import random
import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from lbmr_proto import (
    TIR,
    TQR,
    ExFuncOption,
    LateJoinOption,
    LBMRDecodeError,
    LocalDomainOption,
    OtidOption,
    RemoteDomainRoute,
    SourceIdOption,
    decode,
)
from lbmr_proto.constants import LBMRD_PORT, MAX_NAME_LEN
from lbmr_proto.records import TMR
from lbmr_proto.um import (
    DEFAULT_MAX_DATAGRAM,
    TIR_TTL,
    Schedule,
    Targets,
    Timing,
    make_otid,
    pack_records,
    um_trailer,
)

Addr = tuple[str, int]

DEFAULT_DAEMON: Addr = ("127.0.0.1", LBMRD_PORT)
REQUEST_PORT_BASE = 14391  # UM request_tcp_port_low: the extended-functionality option's port
MAX_DOMAIN_ROUTES = 4096  # remote domains a context remembers routes to



class Datagram(bytes):
    """The bytes of one datagram, with where it goes: ``dest`` (ip, port) and
    ``kind`` ("tr" scheduled TR, "response" answer to a query, "keepalive")."""

    dest: Addr
    kind: str

    def __new__(cls, data: bytes, dest: Addr, kind: str = "tr") -> Datagram:
        self = super().__new__(cls, data)
        self.dest = dest
        self.kind = kind
        return self

    def __repr__(self) -> str:
        return f"Datagram({bytes(self)!r}, dest={self.dest!r}, kind={self.kind!r})"


@dataclass(eq=False)
class Source:
    """One simulated source: its topic, advertised transport and TIR."""

    topic: str
    transport: object
    index: int
    otid: bytes
    tir: TIR
    record: bytes  # the encoded TIR
    schedule: Schedule
    ready: bool = True  # advertised (False: its data port is not bound yet)


@dataclass(eq=False)
class Receiver:
    """One simulated receiver. ``resolved_at`` is ``None`` until a TIR for
    the topic arrives; ``transport`` is the first source's transport (the
    address it would connect to), ``tir`` that TIR as received; ``sources``
    every distinct transport seen. ``local`` means resolved from a source
    in the same context (no TR traffic needed)."""

    topic: str
    created: float
    schedule: Schedule
    resolved_at: float | None = None
    transport: object | None = None
    tir: TIR | None = None
    sources: set = field(default_factory=set)
    local: bool = False

    @property
    def resolved(self) -> bool:
        return self.resolved_at is not None

    @property
    def time_to_resolve(self) -> float | None:
        return None if self.resolved_at is None else self.resolved_at - self.created


def transport_text(t) -> str:
    """``TCP 127.0.1.3:14371``-style text of a TIR transport."""
    name = t.NAME
    if name == "LBTRM":
        return f"LBTRM {t.ip}:{t.src_ucast_port} grp {t.mcast_group}:{t.dest_port}"
    if hasattr(t, "ip") and hasattr(t, "port"):
        return f"{name} {t.ip}:{t.port}"
    return name


class Context:
    """Sans-IO model of one UM context's UDP topic resolution.

    Unicast mode: ``daemons`` are the lbmrd (ip, port)s (UM's
    ``resolver_unicast_daemon`` list; default 127.0.0.1:15380). Keepalives go
    to every daemon; scheduled TR and query responses go to the current
    daemon, which changes round-robin every ``timing.change_interval``
    seconds counted from ``start`` (daemon ``k mod n`` during the k-th
    interval; UM randomises the period and skips inactive daemons, this
    model does neither).

    Multicast mode: ``multicast`` is the (group, port) (UM's
    ``resolver_multicast_address`` / ``resolver_multicast_port``) and no
    daemons are given. Every TR datagram, scheduled or a query response, goes
    to the group; no keepalives are sent; datagrams are accepted from
    anyone (the group delivers the context's own datagrams too, which are
    dropped by source id like everyone's own).

    Every TR datagram is a version-1 NORMAL packet with a packet-options
    trailer (source id = ``src_id``, source type 0, version, local domain 0),
    as UM 6.x sends; due TQRs and TIRs are batched into datagrams of at
    most ``max_datagram`` bytes. Keepalives are the 4-byte ``02 00 00 00`` /
    ``03 00 00 00`` (alternating per daemon).

    With ``ignore_unknown_source`` (UM's default since 6.7.1) ``receive``
    drops datagrams whose ``src`` is not a configured daemon (unicast mode
    only). Datagrams carrying this context's own source id are always
    ignored. A context without sources and receivers sends nothing unless
    ``force_alive`` (which only concerns keepalives, so unicast mode).
    """

    def __init__(self, daemons: Sequence[Addr] | None = None, *, multicast: Addr | None = None,
                 timing: Timing | None = None, start: float = 0.0, src_id: bytes | None = None,
                 rng: random.Random | None = None, index: int = 0, local_ip: str = "127.0.0.1",
                 max_datagram: int = DEFAULT_MAX_DATAGRAM, force_alive: bool = False,
                 request_port: int = REQUEST_PORT_BASE, ignore_unknown_source: bool = True,
                 late_join: bool = False) -> None:
        if multicast is not None:
            if daemons:
                raise ValueError("a context uses either daemons or a multicast group, not both")
            self.multicast: Addr | None = (str(multicast[0]), int(multicast[1]))
            daemons = ()
        else:
            self.multicast = None
            if daemons is None:
                daemons = (DEFAULT_DAEMON,)
            if not daemons:
                raise ValueError("a context needs at least one daemon or a multicast group")
        self.daemons: list[Addr] = [(str(ip), int(port)) for ip, port in daemons]
        self.timing = timing if timing is not None else Timing()
        self.start = start
        self.rng = rng if rng is not None else random.Random()
        self.src_id = src_id if src_id is not None else self.rng.randbytes(8)
        if len(self.src_id) != 8:
            raise ValueError("src_id must be 8 bytes")
        self.ctx_id = self.src_id[:4]
        self.index = index
        self.local_ip = local_ip
        self.max_datagram = max_datagram
        self.request_port = request_port
        self.late_join = late_join
        self.ignore_unknown_source = ignore_unknown_source
        self.trailer = um_trailer(self.src_id)
        if max_datagram < 4 + len(self.trailer) + MAX_NAME_LEN + 80:
            raise ValueError(f"max_datagram {max_datagram} cannot hold the largest record")
        self.sources: list[Source] = []
        self.receivers: list[Receiver] = []
        self._sources_by_topic: dict[str, list[Source]] = {}
        self._receivers_by_topic: dict[str, list[Receiver]] = {}
        self._daemon_set = set(self.daemons)
        self._targets = Targets(self.daemons, self.multicast, self.timing, start)
        self._alive_since: float | None = start if force_alive else None
        self.stats: Counter[str] = Counter()
        # what DRO traffic in the TRD tells a context (UM's "Domain ID discovered", "Route
        # discovered to Domain ID d through ip:port"): its TRD's domain id (0: not heard)
        # and, per remote domain, the router request listener to send its UIMs to
        self.domain_id = 0
        self.domain_routes: dict[int, Addr] = {}

    # ------------------------------------------------------------ setup

    def add_source(self, topic: str, transport, *, now: float | None = None,
                   topic_index: int | None = None, ready: bool = True) -> Source:
        """Create a source advertising ``transport`` (a TcpTransport,
        LbtruTransport, LbtrmTransport...) for ``topic`` from ``now``
        (default: the context's start). With ``ready`` False it neither
        advertises nor answers queries until :meth:`source_ready` (its data
        port is being bound); local receivers resolve to it at once."""
        now = self.start if now is None else now
        self._activate(now)
        idx = self.rng.getrandbits(32) if topic_index is None else topic_index
        session = getattr(transport, "session_id", None)
        session = self.rng.getrandbits(32) if session is None else session
        otid = make_otid(transport, idx, self.ctx_id, len(self.sources) + 1, session)
        ip = getattr(transport, "ip", "0.0.0.0")
        tir = TIR(topic, transport, ttl=TIR_TTL, index=idx,
                  options=self._source_options(otid, ip, len(self.sources) + 1))
        src = Source(topic, transport, idx, otid, tir, tir.encode(),
                     Schedule(now, self.timing.ad_phase()), ready)
        if not ready:
            src.schedule.stop()
        self.sources.append(src)
        self._sources_by_topic.setdefault(topic, []).append(src)
        for r in self._receivers_by_topic.get(topic, ()):
            if not r.resolved:
                self._resolve_local(r, src, now)
        return src

    def source_ready(self, src: Source, now: float, transport=None) -> None:
        """``src``'s data port is bound (on ``transport`` when that is not the
        one it was created with: the port was taken): it advertises from
        ``now`` as a new source does."""
        if transport is not None and transport != src.transport:
            self._move_source(src, transport)
        src.ready = True
        src.schedule = Schedule(now, self.timing.ad_phase())

    def _move_source(self, src: Source, transport) -> None:
        """``src`` serves on ``transport``: its TIR says so (same topic
        index, a new OTID). Local receivers resolved to the old one follow."""
        idx = src.index
        session = getattr(transport, "session_id", None)
        session = self.rng.getrandbits(32) if session is None else session
        otid = make_otid(transport, idx, self.ctx_id, self.sources.index(src) + 1, session)
        ip = getattr(transport, "ip", "0.0.0.0")
        tir = TIR(src.topic, transport, ttl=TIR_TTL, index=idx,
                  options=self._source_options(otid, ip, self.sources.index(src) + 1))
        old = src.transport
        src.transport, src.otid, src.tir, src.record = transport, otid, tir, tir.encode()
        for r in self._receivers_by_topic.get(src.topic, ()):
            if r.local and r.tir is not None and r.tir.transport == old:
                r.sources.discard(r.transport)
                r.resolved_at = None
                self._resolve_local(r, src, r.created)

    def transport_index(self, src: Source) -> int:
        """``src``'s transport index (1, 2, ... in the order sources were added):
        what its late-join option names."""
        return self.sources.index(src) + 1

    def _source_options(self, otid: bytes, ip: str, transport_idx: int) -> list:
        """A source's TIR options: its OTID and the context's request port
        (extended functionality; with ``late_join`` also the late-join option,
        naming the source's transport index ``transport_idx``: late-join and
        OTR requests go to that port and name that index)."""
        if not self.late_join:
            return [OtidOption(0x8000, otid), ExFuncOption(0x8000, self.request_port, 0, ip, 0)]
        return [OtidOption(0x8000, otid), LateJoinOption(0, self.request_port, 0, ip, transport_idx, 0, 0),
                ExFuncOption(0x8000, self.request_port, 0, ip, 0x1)]

    def add_receiver(self, topic: str, *, now: float | None = None) -> Receiver:
        """Create a receiver for ``topic`` from ``now``. It queries until a
        TIR for the topic arrives (or at once resolves from a source of the
        same context)."""
        now = self.start if now is None else now
        self._activate(now)
        r = Receiver(topic, now, Schedule(now, self.timing.query_phase()))
        self.receivers.append(r)
        self._receivers_by_topic.setdefault(topic, []).append(r)
        local = self._sources_by_topic.get(topic)
        if local:
            self._resolve_local(r, local[0], now)
        return r

    def _activate(self, now: float) -> None:
        if self._alive_since is None:
            self._alive_since = now

    def _resolve_local(self, r: Receiver, src: Source, now: float) -> None:
        t = src.transport
        if getattr(t, "ip", None) == "0.0.0.0":
            t = dataclasses.replace(t, ip=self.local_ip)
        r.resolved_at, r.transport, r.tir, r.local = now, t, src.tir, True
        r.sources.add(t)
        r.schedule.stop()

    # ------------------------------------------------------------ state

    @property
    def all_resolved(self) -> bool:
        return all(r.resolved for r in self.receivers)

    def current_daemon(self, now: float) -> int:
        """Index of the daemon that gets normal TR traffic at ``now``
        (unicast mode; ValueError in multicast mode)."""
        return self._targets.current_daemon(now)

    def destination(self, now: float) -> Addr:
        """Where TR datagrams sent at ``now`` go: the multicast group, or
        the current daemon."""
        return self._targets.destination(now)

    def next_deadline(self) -> float:
        """The earliest time at which :meth:`tick` has something to send
        (``inf`` if never, e.g. an inactive context)."""
        d = math.inf
        for s in self.sources:
            d = min(d, s.schedule.next)
        for r in self.receivers:
            if not r.resolved:
                d = min(d, r.schedule.next)
        if self._alive_since is not None:
            d = min(d, self._targets.keepalive_deadline(self._alive_since))
        return d

    def _use_responses(self, tmrs, now: float) -> list[Datagram]:
        """A router's topic use queries (TOPIC_MGMT type 1, no response flag):
        answer "in use" (flag 0x80) for the exact topics this context receives."""
        st = self.stats
        names = []
        for m in tmrs:
            if m.type == 1 and not m.flags & 0xE0 and m.name in self._receivers_by_topic:
                names.append(m.name)
        st["use_queries_received"] += len(tmrs)
        out: list[Datagram] = []
        room = self.max_datagram - 8 - len(self.trailer)
        batch: list[bytes] = []
        for rec in [TMR(n, 1, 0x80).encode() for n in names] + [b""]:
            if batch and (not rec or sum(map(len, batch)) + len(rec) > room):
                body = b"".join(batch)
                data = (bytes((0x1C, 0, 0, 0)) + struct.pack("!HH", 4 + len(body), len(batch))
                        + body + self.trailer)
                out.append(Datagram(data, self._targets.send_tr(now), "response"))
                st["use_responses_sent"] += len(batch)
                st["datagrams_sent"] += 1
                st["bytes_sent"] += len(data)
                batch = []
            if rec:
                batch.append(rec)
        return out

    # ------------------------------------------------------------ output

    def _send_tr(self, tqrs: list[bytes], tirs: list[bytes], now: float, kind: str) -> list[Datagram]:
        if not tqrs and not tirs:
            return []
        dest = self._targets.send_tr(now)
        out = [Datagram(d, dest, kind)
               for d in pack_records(tqrs, tirs, trailer=self.trailer, max_datagram=self.max_datagram)]
        st = self.stats
        st["tqrs_sent"] += len(tqrs)
        st["tirs_sent"] += len(tirs)
        st["datagrams_sent"] += len(out)
        st["bytes_sent"] += sum(len(d) for d in out)
        return out

    def tick(self, now: float) -> list[Datagram]:
        """Everything due at ``now``: advertisements, queries (both batched,
        to the current daemon or the multicast group), then keepalives to
        every daemon that has been idle for ``keepalive_interval`` (none in
        multicast mode)."""
        tirs = []
        for s in self.sources:
            if s.schedule.due(now):
                tirs.append(s.record)
                s.schedule.advance(now)
        tqrs = []
        for r in self.receivers:
            if not r.resolved and r.schedule.due(now):
                tqrs.append(TQR(r.topic).encode())
                r.schedule.advance(now)
        if tirs:
            self.stats["advertisements"] += len(tirs)
        if tqrs:
            self.stats["queries"] += len(tqrs)
        out = self._send_tr(tqrs, tirs, now, "tr")
        if self._alive_since is not None:
            for ka, dest in self._targets.keepalives(now, self._alive_since):
                out.append(Datagram(ka, dest, "keepalive"))
                self.stats["keepalives_sent"] += 1
                self.stats["datagrams_sent"] += 1
                self.stats["bytes_sent"] += 4
        return out

    # ------------------------------------------------------------- input

    def _route_heard(self, pkt) -> None:
        """A remote domain route record (LBMR ext 6) of a router in the TRD: each domain
        it names is reached through its ``ip``:``port``; the packet's local domain option
        names our TRD's domain id."""
        st = self.stats
        st["domain_routes_received"] += 1
        r = pkt.ext
        for o in pkt.options or ():
            if type(o) is LocalDomainOption and o.local_domain_id:
                self.domain_id = o.local_domain_id
        if not r.port or r.ip == "0.0.0.0":
            return
        for d in r.domains:
            if d and (d in self.domain_routes or len(self.domain_routes) < MAX_DOMAIN_ROUTES):
                self.domain_routes[d] = (r.ip, r.port)

    def receive(self, data: bytes, now: float, src: Addr | None = None) -> list[Datagram]:
        """Process one incoming datagram at ``now`` from ``src`` (if known).

        A TIR for a wanted topic resolves that topic's receivers (the first
        one sets the resolved transport and time); a TQR for a topic this
        context sources is answered at once with the sources' TIRs (the
        returned datagrams, sent to the current daemon or the multicast
        group). Keepalive replies (empty NORMAL packets) are counted.
        """
        st = self.stats
        if (src is not None and self.multicast is None and self.ignore_unknown_source
                and (src[0], src[1]) not in self._daemon_set):
            st["ignored_unknown_source"] += 1
            return []
        try:
            pkt = decode(data)
        except LBMRDecodeError:
            st["malformed"] += 1
            return []
        st["datagrams_received"] += 1
        if pkt.options:
            for o in pkt.options:
                if type(o) is SourceIdOption and o.src_id == self.src_id:
                    st["ignored_own"] += 1
                    return []
        if pkt.type in (2, 3):
            st["keepalives_received"] += 1
            return []
        if isinstance(pkt.ext, RemoteDomainRoute):
            self._route_heard(pkt)
            return []
        if pkt.type == 4 and pkt.tmb is not None:
            return self._use_responses(pkt.tmb.tmrs, now)
        if pkt.type != 0:
            st["other_received"] += 1
            return []
        if not pkt.tqrs and not pkt.tirs:
            st["keepalive_replies"] += 1
            return []
        for tir in pkt.tirs:
            st["tirs_received"] += 1
            for r in self._receivers_by_topic.get(tir.topic, ()):
                r.sources.add(tir.transport)
                if r.resolved_at is None:
                    r.resolved_at = now
                    r.transport = tir.transport
                    r.tir = tir
                    r.schedule.stop()
                    st["resolved"] += 1
        answer = []
        for q in pkt.tqrs:
            st["tqrs_received"] += 1
            for s in self._sources_by_topic.get(q.topic, ()):
                if s.ready:
                    answer.append(s.record)
        st["responses"] += len(answer)
        return self._send_tr([], answer, now, "response")
