"""lbmr-sim: play N Ultra Messaging contexts' topic resolution on loopback.

Two layers:

* :class:`Context` is a sans-IO model of one UM context's UDP topic
  resolution (no sockets, no clock), either unicast through lbmrds or
  multicast to a group: it owns sources (topic -> transport address) and
  receivers (topics), and is driven by ``tick(now)`` (the datagrams due at
  ``now``), ``receive(data, now, src)`` (an incoming TR datagram; returns
  immediate replies) and ``next_deadline()``. Times are seconds on any
  monotonic clock. The cadence follows UM's defaults and is configurable
  through :class:`Timing`.
* :func:`run_sim` is the trio shell: one UDP socket per context, either on a
  loopback address talking to one or more lbmrds, or bound to a multicast
  group's port and joined to the group (multicast mode; needs an interface
  with multicast enabled, e.g. ``lo`` inside a network namespace), until
  every receiver has resolved or ``duration`` has passed. It uses
  :func:`trio.current_time`, so it runs unchanged on a virtual clock
  (``autojump_clock`` in tests).

With data (``SimConfig.data_bytes`` / ``data_datagrams``) every source
also serves numbered data on the transport address it advertises, through
:mod:`lbmr_tools.dataplane` (TCP, or our simplified LBT-RU-like datagram
protocol), and with ``verify_data`` every receiver, once resolved, connects
to (registers with) the address it resolved and verifies what arrives.

``main`` is the ``lbmr-sim`` command; see lbmr-sim(1).
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import fcntl
import ipaddress
import json
import math
import os
import random
import socket
import statistics
import struct
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import click
import trio

from lbmr_proto import (
    TIR,
    TQR,
    ExFuncOption,
    LBMRDecodeError,
    LbtrmTransport,
    LbtruTransport,
    OtidOption,
    SourceIdOption,
    TcpTransport,
    decode,
)
from lbmr_proto.capture import PcapWriter
from lbmr_proto.constants import LBMRD_PORT, MAX_NAME_LEN
from lbmr_proto.um import (  # RCV_ALIVE, SRC_ALIVE, UM_VERSION, VERSION_FLAGS: re-exported
    DEFAULT_MAX_DATAGRAM,
    RCV_ALIVE,  # noqa: F401
    SRC_ALIVE,  # noqa: F401
    TIMING_FIELDS,
    TIR_TTL,
    UM_VERSION,  # noqa: F401
    VERSION_FLAGS,  # noqa: F401
    Schedule,
    Targets,
    Timing,
    make_otid,
    pack_records,
    um_trailer,
)
from lbmr_tools.dataplane import (
    RU_MAX_DATAGRAM,
    RU_MIN_DATAGRAM,
    RuDataReceiver,
    RuDataSource,
    RuReceiveResult,
    TcpDataReceiver,
    TcpDataSource,
    topic_seed,
)

Addr = tuple[str, int]

MIN_STEP = 1e-6  # seconds; the shortest wait between two ticks of one context
MAX_CONTEXTS = 1000
REQUEST_PORT_BASE = 14391  # UM request_tcp_port_low: the extended-functionality option's port
LBTRM_GROUP = "224.10.10.10"  # UM transport_lbtrm_multicast_address_low (advertised only)
LBTRM_DEST_PORT = 14400  # UM transport_lbtrm_destination_port (advertised only)
TRANSPORTS = ("tcp", "lbtru", "lbtrm")
PORT_BASES = {"tcp": 14371, "lbtru": 14380, "lbtrm": 14390}  # UM's *_port_low defaults
LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")
MULTICAST = ipaddress.IPv4Network("224.0.0.0/4")
DEFAULT_DAEMON: Addr = ("127.0.0.1", LBMRD_PORT)
MC_GROUP = "224.9.10.11"  # UM resolver_multicast_address
MC_PORT = 12965  # UM resolver_multicast_port
MC_INTERFACE = "127.0.0.1"
DEFAULT_DATA_RATE = 10000.0  # LBT-RU-like datagrams per second per receiver
MAX_DATA_DATAGRAMS = 10_000_000


# ------------------------------------------------------------- sans-IO core


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
                 request_port: int = REQUEST_PORT_BASE, ignore_unknown_source: bool = True) -> None:
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

    # ------------------------------------------------------------ setup

    def add_source(self, topic: str, transport, *, now: float | None = None,
                   topic_index: int | None = None) -> Source:
        """Create a source advertising ``transport`` (a TcpTransport,
        LbtruTransport, LbtrmTransport...) for ``topic`` from ``now``
        (default: the context's start)."""
        now = self.start if now is None else now
        self._activate(now)
        idx = self.rng.getrandbits(32) if topic_index is None else topic_index
        session = getattr(transport, "session_id", None)
        session = self.rng.getrandbits(32) if session is None else session
        otid = make_otid(transport, idx, self.ctx_id, len(self.sources) + 1, session)
        ip = getattr(transport, "ip", "0.0.0.0")
        tir = TIR(topic, transport, ttl=TIR_TTL, index=idx,
                  options=[OtidOption(0x8000, otid),
                           ExFuncOption(0x8000, self.request_port, 0, ip, 0)])
        src = Source(topic, transport, idx, otid, tir, tir.encode(),
                     Schedule(now, self.timing.ad_phase()))
        self.sources.append(src)
        self._sources_by_topic.setdefault(topic, []).append(src)
        for r in self._receivers_by_topic.get(topic, ()):
            if not r.resolved:
                self._resolve_local(r, src, now)
        return src

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
                answer.append(s.record)
        st["responses"] += len(answer)
        return self._send_tr([], answer, now, "response")


# ---------------------------------------------------------------- topology


@dataclass
class SimConfig:
    """What :func:`run_sim` plays.

    Unicast mode (``multicast`` is None): the contexts talk to ``daemons``
    (empty: 127.0.0.1:15380). Multicast mode: ``multicast`` is the (group,
    port) every context sends to and listens on, ``daemons`` must be empty,
    ``mc_interface`` is the address of the interface used for the group
    membership and for sending (IP_MULTICAST_IF), ``mc_ttl`` (0 or 1) the
    multicast TTL: 0 never leaves the host, 1 reaches the link.

    ``bind`` is every context's local address unless ``bind_base`` is given
    (context i then uses ``bind_base + i``); None means 127.0.0.1, or the
    multicast interface's address when that is not a loopback address (the
    only address allowed then). In multicast mode it is the source address
    of the context's datagrams (the socket itself is bound to the group's
    port). ``source_ip`` is advertised in the TIRs ("0.0.0.0" lets lbmrd fill
    in the sender's address; "bind" advertises each context's own address);
    None means "0.0.0.0" with daemons and "bind" with multicast (no lbmrd
    fills anything in there). ``source_port_base`` defaults per transport
    (tcp 14371, lbtru 14380, lbtrm 14390); source number n (counted over all
    contexts) advertises port ``base + n``. ``keep_running`` runs the full
    ``duration`` even after every receiver has resolved. ``record_sent``
    keeps every sent datagram in :attr:`SimResult.sent`.

    Data (see :mod:`lbmr_tools.dataplane`): with ``data_bytes`` TCP sources
    serve that many bytes to every receiver that connects, with
    ``data_datagrams`` LBT-RU sources send that many datagrams of
    ``data_datagram_size`` bytes at ``data_rate`` per second to every
    receiver that registers. Each source binds its data socket on its
    context's address and the port it advertises (a kernel-chosen one, then
    advertised, when that port is taken). The stream of topic T is keyed by
    ``topic_seed(T, data_seed)``. With ``verify_data`` every receiver, once
    resolved, fetches and verifies the data of the address it resolved,
    expecting ``data_bytes`` (TCP) or ``data_datagrams`` (LBT-RU), reading
    TCP at most ``data_rate_limit`` bytes per second when given; the run
    then also waits for the data."""

    daemons: list[Addr] = field(default_factory=list)
    contexts: int = 4
    topics: int = 4
    sources_per_topic: int = 1
    receivers_per_context: int = 1
    transport: str = "tcp"
    source_ip: str | None = None
    source_port_base: int | None = None
    bind: str | None = None
    bind_base: str | None = None
    duration: float = 10.0
    keep_running: bool = False
    pcap: str | None = None
    seed: int | None = None
    topic_prefix: str = "md."
    max_datagram: int = DEFAULT_MAX_DATAGRAM
    timing: Timing = field(default_factory=Timing)
    record_sent: bool = False
    multicast: Addr | None = None
    mc_interface: str = MC_INTERFACE
    mc_ttl: int = 0
    data_bytes: int | None = None
    data_datagrams: int | None = None
    data_seed: int = 0
    data_rate: float = DEFAULT_DATA_RATE
    data_datagram_size: int = RU_MAX_DATAGRAM
    data_rate_limit: float | None = None
    verify_data: bool = False


def _ipv4(ip: str, what: str) -> ipaddress.IPv4Address:
    try:
        return ipaddress.IPv4Address(ip)
    except ValueError:
        raise ValueError(f"{what} {ip!r} is not an IPv4 address") from None


def _loopback(ip: str, what: str) -> ipaddress.IPv4Address:
    a = _ipv4(ip, what)
    if a not in LOOPBACK:
        raise ValueError(f"{what} {ip} is not a loopback address (127.0.0.0/8); lbmr-sim only "
                         "plays on loopback (or on a multicast group)")
    return a


def _group(ip: str, what: str = "multicast group") -> ipaddress.IPv4Address:
    a = _ipv4(ip, what)
    if a not in MULTICAST:
        raise ValueError(f"{what} {ip} is not a multicast address (224.0.0.0/4)")
    return a


def daemon_list(cfg: SimConfig) -> list[Addr]:
    """The daemons the contexts use: none in multicast mode, else
    ``cfg.daemons`` or the default 127.0.0.1:15380."""
    if cfg.multicast is not None:
        return []
    return list(cfg.daemons) or [DEFAULT_DAEMON]


def source_ip_of(cfg: SimConfig) -> str:
    """The effective ``source_ip``: an address or "bind"."""
    if cfg.source_ip is not None:
        return cfg.source_ip
    return "bind" if cfg.multicast is not None else "0.0.0.0"


def _loopback_interface(cfg: SimConfig) -> bool:
    return cfg.multicast is None or _ipv4(cfg.mc_interface, "multicast interface") in LOOPBACK


def bind_addresses(cfg: SimConfig) -> list[str]:
    """The local address of each context (in multicast mode: the source
    address of its datagrams)."""
    if not _loopback_interface(cfg):
        if cfg.bind_base is not None or cfg.bind not in (None, cfg.mc_interface):
            raise ValueError(f"with the non-loopback multicast interface {cfg.mc_interface} every "
                             "context sends from that address; --bind/--bind-base do not apply")
        return [cfg.mc_interface] * cfg.contexts
    if cfg.bind_base is None:
        bind = "127.0.0.1" if cfg.bind is None else cfg.bind
        _loopback(bind, "bind address")
        return [bind] * cfg.contexts
    base = _loopback(cfg.bind_base, "bind base")
    last = int(base) + cfg.contexts - 1
    if last > int(LOOPBACK.broadcast_address) - 1:
        raise ValueError(f"bind base {cfg.bind_base} + {cfg.contexts} contexts leaves 127.0.0.0/8")
    return [str(ipaddress.IPv4Address(int(base) + i)) for i in range(cfg.contexts)]


def topic_names(cfg: SimConfig) -> list[str]:
    return [f"{cfg.topic_prefix}{j}" for j in range(cfg.topics)]


def check_config(cfg: SimConfig) -> None:
    """Raise ValueError with a readable message if ``cfg`` cannot be played."""
    if not 1 <= cfg.contexts <= MAX_CONTEXTS:
        raise ValueError(f"contexts must be 1..{MAX_CONTEXTS}")
    if cfg.topics < 0 or cfg.sources_per_topic < 0 or cfg.receivers_per_context < 0:
        raise ValueError("topics, sources per topic and receivers per context must be >= 0")
    if cfg.receivers_per_context > cfg.topics:
        raise ValueError(f"receivers per context ({cfg.receivers_per_context}) exceeds the number "
                         f"of topics ({cfg.topics})")
    if cfg.multicast is not None:
        if cfg.daemons:
            raise ValueError("--daemon and --multicast are mutually exclusive: a context uses "
                             "lbmrds or a multicast group")
        group, port = cfg.multicast
        _group(group)
        if not 1 <= port <= 65535:
            raise ValueError(f"multicast port {port} out of range")
        _ipv4(cfg.mc_interface, "multicast interface")
        if cfg.mc_ttl not in (0, 1):
            raise ValueError(f"multicast TTL must be 0 (host) or 1 (link), not {cfg.mc_ttl}")
    seen = set()
    for ip, port in cfg.daemons:
        _loopback(ip, "daemon address")
        if not 1 <= port <= 65535:
            raise ValueError(f"daemon port {port} out of range")
        if (ip, port) in seen:
            raise ValueError(f"daemon {ip}:{port} given twice")
        seen.add((ip, port))
    bind_addresses(cfg)
    if cfg.transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}")
    source_ip = source_ip_of(cfg)
    if source_ip != "bind":
        try:
            ipaddress.IPv4Address(source_ip)
        except ValueError:
            raise ValueError(f"source IP {source_ip!r} is neither an IPv4 address nor 'bind'") from None
    base = PORT_BASES[cfg.transport] if cfg.source_port_base is None else cfg.source_port_base
    n = cfg.topics * cfg.sources_per_topic
    if not 1 <= base or base + max(n, 1) - 1 > 65535:
        raise ValueError(f"source ports {base}..{base + n - 1} do not fit in 1..65535")
    if cfg.topics and len(f"{cfg.topic_prefix}{cfg.topics - 1}".encode()) >= MAX_NAME_LEN:
        raise ValueError("topic names would be longer than 255 bytes")
    if "\0" in cfg.topic_prefix:
        raise ValueError("the topic prefix contains a NUL")
    if not (cfg.duration > 0 and math.isfinite(cfg.duration)):
        raise ValueError("duration must be a positive number of seconds")
    if cfg.max_datagram > 65507:
        raise ValueError("max datagram larger than a UDP datagram")
    check_data_config(cfg)


def check_data_config(cfg: SimConfig) -> None:
    """The data options' part of :func:`check_config`."""
    if cfg.data_bytes is not None and cfg.data_bytes < 1:
        raise ValueError("data bytes must be >= 1")
    if cfg.data_datagrams is not None and not 1 <= cfg.data_datagrams <= MAX_DATA_DATAGRAMS:
        raise ValueError(f"data datagrams must be 1..{MAX_DATA_DATAGRAMS}")
    if not 0 <= cfg.data_seed < 1 << 64:
        raise ValueError("data seed must be in 0..2**64-1")
    if not (cfg.data_rate > 0 and math.isfinite(cfg.data_rate)):
        raise ValueError("data rate must be a positive number of datagrams per second")
    if not RU_MIN_DATAGRAM <= cfg.data_datagram_size <= RU_MAX_DATAGRAM:
        raise ValueError(f"data datagram size must be {RU_MIN_DATAGRAM}..{RU_MAX_DATAGRAM} bytes")
    if cfg.data_rate_limit is not None and not (cfg.data_rate_limit > 0
                                                and math.isfinite(cfg.data_rate_limit)):
        raise ValueError("data rate limit must be a positive number of bytes per second")
    if cfg.topics * cfg.sources_per_topic:
        if cfg.data_bytes is not None and cfg.transport != "tcp":
            raise ValueError(f"--data-bytes is for TCP sources; these sources use {cfg.transport} "
                             "(--data-datagrams is for lbtru)")
        if cfg.data_datagrams is not None and cfg.transport != "lbtru":
            raise ValueError(f"--data-datagrams is for LBT-RU sources; these sources use "
                             f"{cfg.transport} (--data-bytes is for tcp)")
    if cfg.verify_data and cfg.data_bytes is None and cfg.data_datagrams is None:
        raise ValueError("--verify-data needs --data-bytes (TCP) or --data-datagrams (LBT-RU): "
                         "how much data to expect")


def serves_data(cfg: SimConfig) -> bool:
    """Whether the sources of ``cfg`` serve data."""
    return bool(cfg.topics * cfg.sources_per_topic) and (
        (cfg.transport == "tcp" and cfg.data_bytes is not None)
        or (cfg.transport == "lbtru" and cfg.data_datagrams is not None))


def make_transport(kind: str, ip: str, port: int, rng: random.Random):
    if kind == "tcp":
        return TcpTransport(ip, port)
    if kind == "lbtru":
        return LbtruTransport(ip, port)
    if kind == "lbtrm":
        return LbtrmTransport(ip, LBTRM_GROUP, rng.getrandbits(32), LBTRM_DEST_PORT, port)
    raise ValueError(f"unknown transport {kind!r}")


def receiver_topics(i: int, topics: list[str], local: set[str], count: int) -> list[str]:
    """Topics for context ``i``'s receivers: starting after topic ``i``,
    those it does not source itself first, then the ones it does."""
    n = len(topics)
    order = [topics[(i + 1 + m) % n] for m in range(n)]
    picked = [t for t in order if t not in local] + [t for t in order if t in local]
    return picked[:count]


def source_placement(cfg: SimConfig) -> list[tuple[int, str, int]]:
    """(context index, topic, source number n) of every source, in order:
    source k of topic j lives on context ``(j * sources_per_topic + k) mod
    contexts`` and is source number ``j * sources_per_topic + k``."""
    out = []
    for j, topic in enumerate(topic_names(cfg)):
        for k in range(cfg.sources_per_topic):
            n = j * cfg.sources_per_topic + k
            out.append((n % cfg.contexts, topic, n))
    return out


def source_port_base(cfg: SimConfig) -> int:
    return PORT_BASES[cfg.transport] if cfg.source_port_base is None else cfg.source_port_base


def build_contexts(cfg: SimConfig, addrs: Sequence[Addr], start: float,
                   rng: random.Random, ports: Sequence[int] | None = None) -> list[Context]:
    """Place sources and receivers: source k of topic j lives on context
    ``(j * sources_per_topic + k) mod contexts``; each context gets
    ``receivers_per_context`` receivers (see :func:`receiver_topics`).
    Source number n advertises ``ports[n]`` (default: the port base + n)."""
    daemons = daemon_list(cfg)
    ctxs = [Context(daemons, multicast=cfg.multicast, timing=cfg.timing, start=start,
                    src_id=rng.randbytes(8), rng=rng, index=i, local_ip=addrs[i][0],
                    max_datagram=cfg.max_datagram, request_port=REQUEST_PORT_BASE + i)
            for i in range(cfg.contexts)]
    topics = topic_names(cfg)
    base = source_port_base(cfg)
    source_ip = source_ip_of(cfg)
    for ci, topic, n in source_placement(cfg):
        ctx = ctxs[ci]
        ip = ctx.local_ip if source_ip == "bind" else source_ip
        port = base + n if ports is None else ports[n]
        ctx.add_source(topic, make_transport(cfg.transport, ip, port, rng), now=start)
    for i, ctx in enumerate(ctxs):
        local = {s.topic for s in ctx.sources}
        for topic in receiver_topics(i, topics, local, cfg.receivers_per_context):
            ctx.add_receiver(topic, now=start)
    return ctxs


# ------------------------------------------------------ multicast interface

SIOCGIFCONF = 0x8912
SIOCGIFFLAGS = 0x8913
IFF_UP = 0x1
IFF_LOOPBACK = 0x8
IFF_MULTICAST = 0x1000
IP_MULTICAST_ALL = getattr(socket, "IP_MULTICAST_ALL", 49)  # Linux
PROC_NET_INIT_INO = 0xEFFFFFF9  # the initial network namespace's inode (linux/proc_ns.h)
_IFREQ_SIZE = 40 if struct.calcsize("P") == 8 else 32  # sizeof(struct ifreq)


class MulticastUnavailable(OSError):
    """Multicast mode cannot run on the requested interface."""


class Interface(NamedTuple):
    name: str
    index: int
    flags: int

    @property
    def loopback(self) -> bool:
        return bool(self.flags & IFF_LOOPBACK)


def _ipv4_addresses(sock: socket.socket) -> list[tuple[str, str]]:
    """(interface name, address) of every IPv4 address (SIOCGIFCONF)."""
    n = 64
    while True:
        buf = bytearray(_IFREQ_SIZE * n)
        cbuf = (ctypes.c_char * len(buf)).from_buffer(buf)
        ifc = struct.pack("iP", len(buf), ctypes.addressof(cbuf))
        length = struct.unpack("iP", fcntl.ioctl(sock.fileno(), SIOCGIFCONF, ifc))[0]
        data = bytes(buf[:length])
        del cbuf
        if length < len(buf) - _IFREQ_SIZE or n >= 65536:
            break
        n *= 4
    out = []
    for off in range(0, len(data) - _IFREQ_SIZE + 1, _IFREQ_SIZE):
        name = data[off:off + 16].split(b"\0", 1)[0].decode(errors="replace")
        family = struct.unpack_from("=H", data, off + 16)[0]
        if family == socket.AF_INET:
            out.append((name.partition(":")[0], socket.inet_ntoa(data[off + 20:off + 24])))
    return out


def _flags(sock: socket.socket, name: str) -> int:
    req = struct.pack("16sh", name.encode(), 0) + bytes(_IFREQ_SIZE - 18)
    return struct.unpack_from("h", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, req), 16)[0] & 0xFFFF


def in_initial_netns() -> bool:
    """Whether this process runs in the host's initial network namespace (the
    kernel gives it the fixed inode number PROC_NET_INIT_INO) or in the one
    of process 1 (a container's). True when that cannot be told."""
    try:
        mine = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return True
    if mine == PROC_NET_INIT_INO:
        return True
    try:
        return mine == os.stat("/proc/1/ns/net").st_ino
    except OSError:  # process 1 may be unreadable even for root
        return False


def multicast_interface(ip: str) -> Interface:
    """The interface owning ``ip`` (any 127/8 address belongs to the
    loopback interface), checked for multicast mode: it must be up and have
    the MULTICAST flag, and a non-loopback interface is only accepted inside
    a network namespace other than the initial one. Raises
    :class:`MulticastUnavailable` with a readable message; sends nothing."""
    a = _ipv4(ip, "multicast interface")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        addrs = _ipv4_addresses(s)
        names = [n for n, addr in addrs if addr == ip]
        if not names and a in LOOPBACK:  # 127/8 is the loopback interface's (even when down)
            names = [n for _, n in socket.if_nameindex() if _flags(s, n) & IFF_LOOPBACK]
        if not names:
            raise MulticastUnavailable(f"no interface has the address {ip} (--mc-interface)")
        name = names[0]
        iface = Interface(name, socket.if_nametoindex(name), _flags(s, name))
    if not iface.flags & IFF_UP:
        raise MulticastUnavailable(f"the interface {name} ({ip}) is down")
    if not iface.flags & IFF_MULTICAST:
        raise MulticastUnavailable(
            f"multicast is not enabled on the interface {name} ({ip}); run inside a network "
            "namespace with multicast on lo (ip link set lo up multicast on)")
    if not iface.loopback and in_initial_netns():
        raise MulticastUnavailable(
            f"refusing multicast on the non-loopback interface {name} ({ip}) in the initial network "
            "namespace; lbmr-sim keeps multicast on loopback or inside a network namespace")
    return iface


def _mreqn(group: str, ip: str, index: int) -> bytes:
    """struct ip_mreqn."""
    return socket.inet_aton(group) + socket.inet_aton(ip) + struct.pack("@i", index)


def open_multicast_socket(group: str, port: int, iface: Interface, iface_ip: str, source_ip: str,
                          ttl: int) -> socket.socket:
    """A UDP socket for one context in multicast mode: bound to (group,
    port) with SO_REUSEADDR and SO_REUSEPORT (every context of every
    process in the network namespace shares the port; the kernel gives each
    a copy of every datagram to the group), joined to the group on ``iface``, sending
    to it through ``iface`` from ``source_ip`` with loopback on and TTL
    ``ttl``."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((group, port))
        s.setsockopt(socket.IPPROTO_IP, IP_MULTICAST_ALL, 0)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, _mreqn(group, iface_ip, iface.index))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, _mreqn("0.0.0.0", source_ip, iface.index))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
    except BaseException:
        s.close()
        raise
    return s


# -------------------------------------------------------------- trio shell


class SentDatagram(NamedTuple):
    """One datagram the simulator sent (``ts`` in seconds since the epoch)."""

    ts: float
    src: str
    sport: int
    dst: str
    dport: int
    payload: bytes


@dataclass
class ReceiverResult:
    context: int
    client: str  # the context's socket "ip:port"
    topic: str
    time_ms: float | None
    transport: str | None  # "TCP 127.0.1.3:14371"
    sources_seen: int
    local: bool
    data: dict | None = None  # with verify_data: see data_outcome()

    @property
    def resolved(self) -> bool:
        return self.time_ms is not None

    @property
    def data_ok(self) -> bool:
        return self.data is not None and self.data["ok"]

    def as_dict(self) -> dict:
        return {"context": self.context, "client": self.client, "topic": self.topic,
                "resolved": self.resolved,
                "time_ms": None if self.time_ms is None else round(self.time_ms, 3),
                "transport": self.transport, "sources_seen": self.sources_seen, "local": self.local,
                "data": self.data}


@dataclass
class SimResult:
    receivers: list[ReceiverResult]
    contexts: list[Context]
    clients: list[Addr]
    daemons: list[Addr]
    elapsed: float
    send_errors: int = 0
    recv_errors: int = 0
    sent: list[SentDatagram] | None = None
    multicast: Addr | None = None
    verify_data: bool = False
    data_sources: list[dict] = field(default_factory=list)  # see data_source_report()

    @property
    def resolved(self) -> int:
        return sum(r.resolved for r in self.receivers)

    @property
    def all_resolved(self) -> bool:
        return self.resolved == len(self.receivers)

    @property
    def data_verified(self) -> int:
        return sum(r.data_ok for r in self.receivers)

    @property
    def all_data_verified(self) -> bool:
        return self.data_verified == len(self.receivers)

    def times_ms(self) -> list[float]:
        return [r.time_ms for r in self.receivers if r.time_ms is not None]

    def summary(self) -> dict:
        t = self.times_ms()
        return {"resolved": self.resolved, "total": len(self.receivers),
                "median_ms": round(statistics.median(t), 3) if t else None,
                "max_ms": round(max(t), 3) if t else None,
                "elapsed_s": round(self.elapsed, 3), "send_errors": self.send_errors,
                "recv_errors": self.recv_errors,
                "data_verified": self.data_verified if self.verify_data else None}

    def as_dict(self) -> dict:
        return {
            "receivers": [r.as_dict() for r in self.receivers],
            "summary": self.summary(),
            "daemons": [f"{ip}:{port}" for ip, port in self.daemons],
            "multicast": None if self.multicast is None else f"{self.multicast[0]}:{self.multicast[1]}",
            "contexts": [{"context": c.index, "client": f"{a[0]}:{a[1]}", "src_id": c.src_id.hex(),
                          "sources": [f"{s.topic} {transport_text(s.transport)}" for s in c.sources],
                          "receivers": [r.topic for r in c.receivers], "stats": dict(sorted(c.stats.items()))}
                         for c, a in zip(self.contexts, self.clients, strict=True)],
            "data_sources": self.data_sources,
        }


def _results(ctxs: Sequence[Context], clients: Sequence[Addr],
             data: dict | None = None) -> list[ReceiverResult]:
    """One ReceiverResult per receiver; ``data`` (with verify_data) maps a
    Receiver to its data receiver, or to an error text when none could run."""
    out = []
    for c, (ip, port) in zip(ctxs, clients, strict=True):
        for r in c.receivers:
            ttr = r.time_to_resolve
            d = None
            if data is not None:
                d = data_outcome(data.get(r, "unresolved: no data fetched"))
            out.append(ReceiverResult(c.index, f"{ip}:{port}", r.topic,
                                      None if ttr is None else ttr * 1000.0,
                                      None if r.transport is None else transport_text(r.transport),
                                      len(r.sources), r.local, d))
    return out


def data_outcome(rx) -> dict:
    """A receiver's data report: kind ("tcp", "lbtru" or None), ok, bytes
    (verified payload bytes for LBT-RU), datagrams (LBT-RU; None for TCP),
    error (the first problem or None), bytes_per_s, elapsed_s and the data
    receiver's full result as ``detail``."""
    if isinstance(rx, str):
        return {"kind": None, "ok": False, "bytes": 0, "datagrams": None, "error": rx,
                "bytes_per_s": 0.0, "elapsed_s": 0.0, "detail": None}
    res = rx.result
    error = res.error
    if not res.done:
        error = f"the run ended (--duration) before the data did: {error}"
    ru = isinstance(res, RuReceiveResult)
    return {"kind": "lbtru" if ru else "tcp", "ok": res.ok, "bytes": res.bytes_received,
            "datagrams": res.received if ru else None, "error": error,
            "bytes_per_s": round(res.bytes_per_s, 1), "elapsed_s": round(res.elapsed, 6),
            "detail": res.as_dict()}


def data_source_report(ctx_index: int, topic: str, server) -> dict:
    """What one data source served (for SimResult.data_sources)."""
    ip, port = server.address
    if isinstance(server, TcpDataSource):
        return {"context": ctx_index, "topic": topic, "kind": "tcp", "address": f"{ip}:{port}",
                "receivers": len(server.connections), "bytes_sent": server.bytes_sent,
                "datagrams_sent": None, "status_received": None,
                "complete": sum(c.complete for c in server.connections)}
    return {"context": ctx_index, "topic": topic, "kind": "lbtru", "address": f"{ip}:{port}",
            "receivers": len(server.sessions),
            "bytes_sent": sum(s.bytes_sent for s in server.sessions.values()),
            "datagrams_sent": server.datagrams_sent, "status_received": server.status_received,
            "complete": sum(s.complete for s in server.sessions.values()),
            "counters": dict(server.counters)}


async def _start_data_source(nursery, cfg: SimConfig, ip: str, port: int, topic: str):
    """Start the data source of one simulated source on (ip, port), or on a
    kernel-chosen port when that one is taken: (server, bound port)."""
    seed = topic_seed(topic, cfg.data_seed)
    for p in (port, 0):
        if cfg.transport == "tcp":
            server = TcpDataSource(ip, p, total_bytes=cfg.data_bytes, seed=seed)
        else:
            server = RuDataSource(ip, p, count=cfg.data_datagrams, seed=seed,
                                  datagram_size=cfg.data_datagram_size, rate=cfg.data_rate)
        try:
            addr = await nursery.start(server.serve)
        except OSError as e:
            if e.errno != errno.EADDRINUSE or p == 0:
                raise
            continue
        return server, addr[1]
    raise AssertionError("unreachable")


def _data_receiver(cfg: SimConfig, topic: str, transport, local_ip: str):
    """The data receiver for a receiver of ``topic`` resolved to
    ``transport``, or an error text when there is no data to fetch."""
    seed = topic_seed(topic, cfg.data_seed)
    name = transport.NAME
    if name == "TCP":
        if cfg.data_bytes is None:
            return "resolved a TCP source but --data-bytes is not given"
        return TcpDataReceiver(transport.ip, transport.port, cfg.data_bytes, seed,
                               rate_limit_bps=cfg.data_rate_limit, timeout=cfg.duration,
                               bind_ip=local_ip)
    if name == "LBTRU":
        if cfg.data_datagrams is None:
            return "resolved an LBT-RU source but --data-datagrams is not given"
        return RuDataReceiver(transport.ip, transport.port, seed=seed,
                              expect_count=cfg.data_datagrams, bind_ip=local_ip,
                              timeout=cfg.duration)
    return f"no data for {name} transports"


async def run_sim(config: SimConfig, *, task_status=trio.TASK_STATUS_IGNORED) -> SimResult:
    """Play ``config`` on loopback until every receiver has resolved (unless
    ``keep_running``) or ``config.duration`` seconds have passed.

    Reports the contexts' (ip, port)s through ``task_status.started`` once
    the sockets are open (in multicast mode: each context's source address
    and the group's port). Returns a :class:`SimResult`. In multicast mode
    the interface is checked first (:func:`multicast_interface`): raises
    :class:`MulticastUnavailable` before any socket is opened.

    With data the sources' data sockets are open before the first
    advertisement; with ``verify_data`` each receiver starts fetching the
    data as soon as it has resolved, and the run ends early only once every
    receiver has resolved and every data receiver has finished.
    """
    check_config(config)
    rng = random.Random(config.seed)
    addrs = bind_addresses(config)
    iface = None if config.multicast is None else multicast_interface(config.mc_interface)
    socks: list[trio.socket.SocketType] = []
    pcap: PcapWriter | None = None
    sent: list[SentDatagram] | None = [] if config.record_sent else None
    errors = Counter()
    ctxs: list[Context] = []
    servers: list[tuple[int, str, object]] = []  # (context, topic, data source)
    data_rx: dict | None = {} if config.verify_data else None  # Receiver -> data receiver | error
    try:
        if iface is not None:
            group, port = config.multicast
            for ip in addrs:
                socks.append(trio.socket.from_stdlib_socket(open_multicast_socket(
                    group, port, iface, config.mc_interface, ip, config.mc_ttl)))
            clients: list[Addr] = [(ip, port) for ip in addrs]
        else:
            for ip in addrs:
                s = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(s)
                await s.bind((ip, 0))
            clients = [s.getsockname()[:2] for s in socks]
        if config.pcap:
            pcap = PcapWriter(config.pcap)
        start = trio.current_time()
        wall0 = time.time()
        end = start + config.duration

        async with trio.open_nursery() as nursery:
            nursery.cancel_scope.deadline = end
            ports = None
            if serves_data(config):
                base = source_port_base(config)
                ports = []
                for ci, topic, n in source_placement(config):
                    server, port = await _start_data_source(nursery, config, addrs[ci], base + n, topic)
                    ports.append(port)
                    servers.append((ci, topic, server))
            ctxs[:] = build_contexts(config, clients, start, rng, ports)
            has_receivers = any(c.receivers for c in ctxs)
            task_status.started(clients)
            data_pending = 0
            resolved_seen = [-1] * len(ctxs)

            def check_done() -> None:
                if (has_receivers and not config.keep_running and data_pending == 0
                        and all(c.all_resolved for c in ctxs)):
                    nursery.cancel_scope.cancel()

            async def fetch(rx) -> None:
                nonlocal data_pending
                try:
                    await rx.run()
                finally:
                    data_pending -= 1
                    check_done()

            def start_data(ctx: Context) -> None:
                """Start the data receivers of ctx's newly resolved receivers."""
                nonlocal data_pending
                if data_rx is None or ctx.stats["resolved"] == resolved_seen[ctx.index]:
                    return
                resolved_seen[ctx.index] = ctx.stats["resolved"]
                for r in ctx.receivers:
                    if r.resolved and r not in data_rx:
                        rx = _data_receiver(config, r.topic, r.transport, ctx.local_ip)
                        data_rx[r] = rx
                        if not isinstance(rx, str):
                            data_pending += 1
                            nursery.start_soon(fetch, rx)

            async def send(sock, me: Addr, dgs: Iterable[Datagram]) -> None:
                for d in dgs:
                    try:
                        await sock.sendto(d, d.dest)
                    except OSError:
                        errors["send"] += 1
                        continue
                    # stamped when recorded, so the pcap's timestamps never go backwards
                    ts = wall0 + (trio.current_time() - start)
                    rec = SentDatagram(ts, me[0], me[1], d.dest[0], d.dest[1], bytes(d))
                    if pcap is not None:
                        pcap.write_udp(*rec)
                    if sent is not None:
                        sent.append(rec)

            async def ticker(ctx: Context, sock, me: Addr, wake: list[trio.Event]) -> None:
                while trio.current_time() < end:
                    now = trio.current_time()
                    await send(sock, me, ctx.tick(now))
                    # never wait for a time already passed: the loop always makes progress,
                    # also on a virtual clock that only moves when every task sleeps
                    with trio.move_on_at(min(max(ctx.next_deadline(), now + MIN_STEP), end)):
                        await wake[0].wait()
                    wake[0] = trio.Event()

            async def listener(ctx: Context, sock, me: Addr, wake: list[trio.Event]) -> None:
                while trio.current_time() < end:
                    try:
                        data, src = await sock.recvfrom(65535)
                    except OSError:  # e.g. an ICMP error reported on the socket
                        errors["recv"] += 1
                        continue
                    now = trio.current_time()
                    await send(sock, me, ctx.receive(data, now, src[:2]))
                    wake[0].set()
                    start_data(ctx)
                    check_done()

            for ctx in ctxs:  # receivers resolved from their own context's sources
                start_data(ctx)
            check_done()
            for ctx, sock, me in zip(ctxs, socks, clients, strict=True):
                wake = [trio.Event()]
                nursery.start_soon(ticker, ctx, sock, me, wake)
                nursery.start_soon(listener, ctx, sock, me, wake)
        elapsed = trio.current_time() - start
    finally:
        for s in socks:
            s.close()
        if pcap is not None:
            pcap.close()
    return SimResult(_results(ctxs, clients, data_rx), ctxs, clients, daemon_list(config), elapsed,
                     errors["send"], errors["recv"], sent, config.multicast, config.verify_data,
                     [data_source_report(ci, topic, server) for ci, topic, server in servers])


# ------------------------------------------------------------------- report


def data_text(d: dict) -> str:
    """``data OK: 4194304 bytes, 812.3 MB/s``-style text of a data_outcome()."""
    if d["datagrams"] is not None:
        expect = (d["detail"] or {}).get("expect_count")
        amount = f"{d['datagrams']}/{expect} datagrams ({d['bytes']} bytes)"
    else:
        amount = f"{d['bytes']} bytes"
    rate = f"{d['bytes_per_s'] / 1e6:.1f} MB/s"
    if d["ok"]:
        return f"data OK: {amount}, {rate}"
    if d["kind"] is None:
        return f"data FAILED: {d['error']}"
    return f"data FAILED: {d['error'] or 'incomplete'}; {amount}, {rate}"


def render_text(result: SimResult) -> str:
    lines = []
    for r in result.receivers:
        head = f"ctx {r.context} ({r.client}) {r.topic}"
        if r.resolved:
            how = " (local source)" if r.local else ""
            line = f"{head} resolved in {r.time_ms:.3f} ms: {r.transport}{how}"
            if r.data is not None:
                line += "; " + data_text(r.data)
            lines.append(line)
        else:
            lines.append(f"{head} unresolved")
    if result.data_sources:
        ds = result.data_sources
        kinds = "/".join(sorted({d["kind"] for d in ds}))
        served = sum(d["receivers"] for d in ds)
        amount = f"{sum(d['bytes_sent'] for d in ds)} bytes"
        if any(d["datagrams_sent"] is not None for d in ds):
            amount = (f"{sum(d['datagrams_sent'] or 0 for d in ds)} datagrams ({amount}), "
                      f"{sum(d['status_received'] or 0 for d in ds)} status datagrams received")
        lines.append(f"data sources: {len(ds)} ({kinds}) served {served} receivers, {amount}")
    s = result.summary()
    if s["median_ms"] is None:
        times = "no time to resolve"
    else:
        times = f"time to resolve median {s['median_ms']:.3f} ms, max {s['max_ms']:.3f} ms"
    verified = ""
    if result.verify_data:
        verified = f"; data verified for {s['data_verified']}/{s['total']} receivers"
    lines.append(f"summary: {s['resolved']}/{s['total']} receivers resolved; {times}{verified}; "
                 f"ran {s['elapsed_s']:.3f} s")
    return "\n".join(lines) + "\n"


def render(result: SimResult, as_json: bool = False) -> str:
    if as_json:
        return json.dumps(result.as_dict(), indent=2) + "\n"
    return render_text(result)


def exit_status(result: SimResult) -> int:
    """0 when every receiver resolved (and, with verify_data, verified its
    data), else 1."""
    ok = result.all_resolved and (not result.verify_data or result.all_data_verified)
    return 0 if ok else 1


# ---------------------------------------------------------------------- CLI


def parse_hostport(text: str) -> Addr:
    """``IP:PORT`` -> (ip, port); the IP must be in 127.0.0.0/8."""
    ip, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected IP:PORT, got {text!r}")
    p = int(port)
    if not 1 <= p <= 65535:
        raise ValueError(f"port out of range in {text!r}")
    _loopback(ip, "daemon address")
    return ip, p


def parse_group(text: str) -> Addr:
    """``GROUP[:PORT]`` -> (group, port); the group must be in 224.0.0.0/4,
    the port defaults to 12965 (UM's resolver_multicast_port)."""
    group, sep, port = text.partition(":")
    if sep and not port.isdigit():
        raise ValueError(f"expected GROUP[:PORT], got {text!r}")
    p = int(port) if sep else MC_PORT
    if not 1 <= p <= 65535:
        raise ValueError(f"port out of range in {text!r}")
    _group(group)
    return group, p


def parse_timing(items: Iterable[str]) -> Timing:
    """``FIELD=SECONDS`` overrides of :class:`Timing`."""
    kw: dict[str, float] = {}
    for it in items:
        name, sep, val = it.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in TIMING_FIELDS:
            raise ValueError(f"expected FIELD=SECONDS with FIELD one of {', '.join(TIMING_FIELDS)}; got {it!r}")
        try:
            kw[name] = float(val)
        except ValueError:
            raise ValueError(f"not a number of seconds: {val!r}") from None
    return Timing(**kw)


SIZE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``N`` or ``N`` followed by K, M or G (powers of 1024) -> a positive
    number of bytes."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    num, suffix = (t[:-1], t[-1]) if t and t[-1] in "KMG" else (t, "")
    if not num.isdigit():
        raise ValueError(f"expected a number of bytes, optionally with K, M or G; got {text!r}")
    n = int(num) * SIZE_SUFFIXES[suffix]
    if n < 1:
        raise ValueError(f"expected at least 1 byte, got {text!r}")
    return n


def _size_cb(ctx, param, value):
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _daemons_cb(ctx, param, values):
    try:
        return [parse_hostport(v) for v in values]
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _group_cb(ctx, param, value):
    if value is None:
        return None
    try:
        return parse_group(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _timing_cb(ctx, param, values):
    try:
        return parse_timing(values)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def config_from_params(params: dict) -> SimConfig:
    """Build a SimConfig from the command's parsed parameters."""
    multicast = params["multicast"]
    daemons = list(params["daemons"])
    if multicast is not None and daemons:
        raise ValueError("--daemon and --multicast are mutually exclusive")
    if multicast is None:
        for opt in ("mc_interface", "mc_ttl"):
            if params[opt] is not None:
                raise ValueError(f"--{opt.replace('_', '-')} needs --multicast")
    cfg = SimConfig(
        daemons=daemons or ([] if multicast is not None else [DEFAULT_DAEMON]),
        multicast=multicast,
        mc_interface=MC_INTERFACE if params["mc_interface"] is None else params["mc_interface"],
        mc_ttl=0 if params["mc_ttl"] is None else params["mc_ttl"],
        contexts=params["contexts"], topics=params["topics"],
        sources_per_topic=params["sources_per_topic"],
        receivers_per_context=params["receivers_per_context"],
        transport=params["transport"].lower(), source_ip=params["source_ip"],
        source_port_base=params["source_port_base"], bind=params["bind"], bind_base=params["bind_base"],
        duration=params["duration"], keep_running=params["keep_running"], pcap=params["pcap"],
        seed=params["seed"], topic_prefix=params["topic_prefix"], max_datagram=params["max_datagram"],
        timing=params["timing"], data_bytes=params["data_bytes"],
        data_datagrams=params["data_datagrams"], data_seed=params["data_seed"],
        data_rate=params["data_rate"], data_datagram_size=params["data_datagram_size"],
        data_rate_limit=params["data_rate_limit"], verify_data=params["verify_data"])
    check_config(cfg)
    cfg.source_ip = source_ip_of(cfg)
    return cfg


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--daemon", "daemons", multiple=True, metavar="IP:PORT", callback=_daemons_cb,
              help="An lbmrd to use (repeatable; loopback only). Default 127.0.0.1:15380.")
@click.option("--multicast", metavar="GROUP[:PORT]", is_flag=False, flag_value=f"{MC_GROUP}:{MC_PORT}",
              callback=_group_cb,
              help=f"Multicast topic resolution on GROUP:PORT instead of lbmrds (alone: "
                   f"{MC_GROUP}:{MC_PORT}; port default {MC_PORT}). Needs an interface with "
                   "multicast on, e.g. lo inside a network namespace.")
@click.option("--mc-interface", metavar="IP",
              help=f"With --multicast: address of the interface for the membership and for "
                   f"sending (IP_MULTICAST_IF). Default {MC_INTERFACE}.")
@click.option("--mc-ttl", type=click.IntRange(0, 1),
              help="With --multicast: multicast TTL, 0 (never leaves the host) or 1 (the link). "
                   "Default 0.")
@click.option("--contexts", type=click.IntRange(1, MAX_CONTEXTS), default=4, show_default=True,
              help="Number of simulated UM contexts.")
@click.option("--topics", type=click.IntRange(min=0), default=4, show_default=True,
              help="Number of topics (named PREFIX0, PREFIX1, ...).")
@click.option("--sources-per-topic", type=click.IntRange(min=0), default=1, show_default=True,
              help="Sources per topic, spread round-robin over the contexts.")
@click.option("--receivers-per-context", type=click.IntRange(min=0), default=1, show_default=True,
              help="Receivers per context (topics other contexts source first).")
@click.option("--transport", type=click.Choice(TRANSPORTS, case_sensitive=False), default="tcp",
              show_default=True, help="Transport the sources advertise.")
@click.option("--source-ip", metavar="IP|bind",
              help="Address advertised in TIRs; 0.0.0.0 lets lbmrd fill in the sender's "
                   "address, 'bind' advertises each context's own address. Default 0.0.0.0 "
                   "with lbmrds, bind with --multicast.")
@click.option("--source-port-base", type=click.IntRange(1, 65535), metavar="PORT",
              help="First advertised source port (default tcp 14371, lbtru 14380, lbtrm 14390).")
@click.option("--bind", metavar="IP",
              help="Loopback address every context binds to (with --multicast: sends from). "
                   "Default 127.0.0.1.")
@click.option("--bind-base", metavar="IP",
              help="Bind context i to IP + i (e.g. 127.0.1.1 gives 127.0.1.1, 127.0.1.2, ...).")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, metavar="S", help="Stop after S seconds at most.")
@click.option("--keep-running", is_flag=True,
              help="Run the whole duration even after every receiver has resolved.")
@click.option("--pcap", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write every datagram the simulator sends to FILE (classic pcap).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--seed", type=int, help="Random seed (source ids, topic indexes, session ids).")
@click.option("--topic-prefix", default="md.", show_default=True, help="Topic name prefix.")
@click.option("--max-datagram", type=click.IntRange(512, 65507), default=DEFAULT_MAX_DATAGRAM,
              show_default=True, metavar="BYTES", help="Largest TR datagram when batching records.")
@click.option("--timing", "timing", multiple=True, metavar="FIELD=SECONDS", callback=_timing_cb,
              help="Override one timing parameter (repeatable), e.g. keepalive_interval=0.25.")
@click.option("--data-bytes", metavar="N[K|M|G]", callback=_size_cb,
              help="TCP sources serve N numbered bytes to each receiver that connects, on the "
                   "address they advertise; with --verify-data, what receivers expect.")
@click.option("--data-datagrams", type=click.IntRange(1, MAX_DATA_DATAGRAMS), metavar="N",
              help="LBT-RU sources send N numbered datagrams to each receiver that registers "
                   "(our simplified LBT-RU-like protocol); with --verify-data, what receivers expect.")
@click.option("--verify-data", is_flag=True,
              help="Receivers, once resolved, fetch the data from the address they resolved and "
                   "verify it; the report gives each one's result and throughput.")
@click.option("--data-seed", type=click.IntRange(0, (1 << 64) - 1), default=0, show_default=True,
              metavar="N", help="Key of the data streams (simulators exchanging data must agree).")
@click.option("--data-rate", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_DATA_RATE,
              show_default=True, metavar="DGRAMS/S",
              help="LBT-RU datagrams per second, per receiver.")
@click.option("--data-datagram-size", type=click.IntRange(RU_MIN_DATAGRAM, RU_MAX_DATAGRAM),
              default=RU_MAX_DATAGRAM, show_default=True, metavar="BYTES",
              help="Size of each LBT-RU data datagram (UDP payload).")
@click.option("--data-rate-limit", metavar="BYTES/S[K|M|G]", callback=_size_cb,
              help="TCP receivers read at most this many bytes per second (slow receivers).")
def main(as_json: bool, **params) -> None:
    """Simulate Ultra Messaging contexts' topic resolution on loopback,
    against one or more lbmrds (unicast) or on a multicast group, and report
    how fast each receiver resolved.

    Exit status: 0 if every receiver resolved (and, with --verify-data, verified
    its data), 1 otherwise, 2 usage error.

    \b
    Examples:
      lbmr-sim --daemon 127.0.0.1:15380 --contexts 8 --topics 100 --receivers-per-context 10
      lbmr-sim --daemon 127.0.0.1:15380 --data-bytes 100M --verify-data
      lbmr-sim --daemon 127.0.0.1:15380 --daemon 127.0.0.1:15381 --bind-base 127.0.1.1
      lbmr-sim --transport lbtrm --pcap sim.pcap --json
      ip netns exec NS lbmr-sim --multicast 224.9.10.11:12965 --bind-base 127.0.1.1
    """
    try:
        cfg = config_from_params(params)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    try:
        result = trio.run(run_sim, cfg)
    except KeyboardInterrupt:
        click.echo("lbmr-sim: interrupted", err=True)
        sys.exit(130)
    except OSError as e:
        raise click.ClickException(str(e)) from None
    click.echo(render(result, as_json), nl=False)
    sys.exit(exit_status(result))


def parse_args(argv: Sequence[str]) -> tuple[SimConfig, bool]:
    """Parse ``lbmr-sim`` arguments without running: (config, as_json).
    Raises :class:`click.UsageError`/:class:`click.BadParameter` on errors."""
    with main.make_context("lbmr-sim", list(argv)) as ctx:
        params = dict(ctx.params)
    as_json = params.pop("as_json")
    try:
        return config_from_params(params), as_json
    except ValueError as e:
        raise click.UsageError(str(e)) from None


if __name__ == "__main__":
    main()
