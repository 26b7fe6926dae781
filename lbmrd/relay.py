"""The lbmrd relay core (sans-IO): bytes and time in, decisions out.

:meth:`RelayCore.handle` takes one datagram, its source (ip, port) and the
current time in seconds, updates the client table and counters, and returns
what to send: nothing, a keepalive reply to the sender, or the datagram
(possibly rewritten per destination domain) for every other client. The
trio shell in :mod:`lbmrd.server` only moves bytes.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Iterable, Iterator
from socket import inet_aton
from typing import NamedTuple

from lbmr_proto import LBMRDecodeError
from lbmr_proto.fast import scan
from lbmr_proto.packet import TYPE_NAMES
from lbmr_runtime.events import EventRing

from .clients import Client, ClientTable, ExpirySweep, Group, RegroupSweep
from .nat import NatTable

ZERO_IP = b"\0\0\0\0"
#: What lbmrd sends back to a keepalive: a NORMAL header with no records, in
#: either version. UM contexts never send it, so it marks another daemon.
REPLY_SHAPES = frozenset({b"\x00\x00\x00\x00", b"\x10\x00\x00\x00"})
#: How many recently relayed payloads are remembered for loop detection.
LOOP_MEMORY = 65536
#: Seconds a relayed payload is remembered (a loop returns within milliseconds).
LOOP_WINDOW = 2.0
#: Copies of an address-free datagram (a query) from one other source, each
#: less than LOOP_GAP seconds after the previous, relayed before the next is
#: taken for a loop.
LOOP_REPEATS = 8
LOOP_GAP = 0.05
#: How many addresses seen behaving as another daemon are remembered.
SUSPECTS_MAX = 4096


class Drop(NamedTuple):
    reason: str


class Reply(NamedTuple):
    payload: bytes


class Relay(NamedTuple):
    """Send ``payload`` of each (payload, group) pair to every member of the
    group except ``sender``. ``parts`` is a list, or (with NAT) an iterator
    that computes each group's copy when it is reached."""

    parts: list[tuple[bytes, Group]] | Iterator[tuple[bytes, Group]]
    sender: Client


class Quiet(NamedTuple):
    """Valid and registered, nothing to send (a resolver keepalive from a client)."""


QUIET = Quiet()


class Counters:
    """What the daemon has seen and done (exported as metrics; lbmrd(8),
    COUNTERS, says how they relate).

    Every datagram read from the socket is counted once in ``received`` and
    once in either ``rx`` (accepted, by packet type) or ``drops`` (by
    reason): ``received == sum(rx) + sum(drops)``. Every accepted one is
    exactly one decision: ``sum(rx) == replies + quiet + relayed``. What
    the shell then fails to send is counted per relayed datagram in
    ``relays_dropped`` and per destination copy in ``copies_dropped`` and
    ``send_errors``."""

    def __init__(self) -> None:
        self.received = 0  # datagrams read from the socket
        self.rx_by_type = [0] * 16  # accepted datagrams, by packet type code (a list: the hot path)
        self.rx_bytes = 0  # bytes of the accepted datagrams
        self.drops: Counter[str] = Counter()  # datagrams dropped whole on input, by reason
        self.replies = 0  # accepted keepalives (answered)
        self.quiet = 0  # accepted, nothing to send (NORMAL without records)
        self.relayed = 0  # accepted and handed to the shell for relaying
        self.relays_dropped: Counter[str] = Counter()  # relayed datagrams the shell dropped whole
        self.copies_dropped: Counter[str] = Counter()  # relay copies not sent, by reason
        self.tx = 0  # datagrams sent (relayed copies and replies)
        self.tx_bytes = 0
        self.send_errors: Counter[str] = Counter()  # by errno name, counted by the shell
        self.recv_errors: Counter[str] = Counter()  # socket errors on receive, by errno name
        self.nat_rewrites = 0  # per-destination-domain copies changed by NAT rules
        self.fillins = 0  # 0.0.0.0 address fields filled with the sender's address
        self.clients_added = 0
        self.clients_expired = 0

    @property
    def rx(self) -> dict[str, int]:
        """Accepted datagrams by packet type name (the types seen)."""
        return {TYPE_NAMES.get(t, f"TYPE_{t}"): n for t, n in enumerate(self.rx_by_type) if n}

    def as_dict(self) -> dict:
        return {"received": self.received, "rx": self.rx, "rx_bytes": self.rx_bytes,
                "drops": dict(self.drops), "replies": self.replies, "quiet": self.quiet,
                "relayed": self.relayed, "relays_dropped": dict(self.relays_dropped),
                "copies_dropped": dict(self.copies_dropped), "tx": self.tx, "tx_bytes": self.tx_bytes,
                "send_errors": dict(self.send_errors), "recv_errors": dict(self.recv_errors),
                "nat_rewrites": self.nat_rewrites, "fillins": self.fillins,
                "clients_added": self.clients_added, "clients_expired": self.clients_expired}


def _burst(rate: float | None, burst: float | None) -> float:
    """A bucket's size: ``burst``, else twice the rate (at least 1 datagram)."""
    return float(burst if burst is not None else (max(1.0, rate * 2) if rate else 0.0))


class RelayCore:
    """Client table + relay + 0.0.0.0 fill-in + NAT, without I/O.

    ``config`` is an :class:`lbmrd.config.Config` (or None: no domains);
    the relay uses its :class:`~lbmrd.nat.NatTable`.
    ``ttl`` seconds of silence expire a client. ``allow`` is a list of CIDR
    strings (empty = everyone). ``max_clients`` bounds the table (new
    clients refused when full). ``rate``/``burst``: per-client (ip:port)
    token bucket in datagrams per second / datagrams (None = unlimited);
    ``ip_rate``/``ip_burst``: the same per source IP address, shared by all
    its ports. ``echo`` also sends a datagram back to its sender
    (multicast-like; off by default). ``events`` is the size of the
    recent-events ring.

    Spoofing defences (see lbmrd(8), SPOOFED SOURCES): ``peer_daemons`` is
    a list of ``(CIDR, port or None)`` of other daemons whose datagrams are
    never relayed and which are never registered; :meth:`set_own_addresses`
    names our own; a reply-shaped datagram (an empty NORMAL header) never
    registers its sender and marks it as a suspected daemon for ``ttl``
    seconds; a datagram identical to one relayed in the last
    :data:`LOOP_WINDOW` seconds that comes back from anyone but its
    original sender is dropped as a loop.
    """

    def __init__(self, config=None, *, ttl: float = 60.0, allow: list[str] | tuple = (),
                 max_clients: int | None = None, rate: float | None = None, burst: float | None = None,
                 ip_rate: float | None = None, ip_burst: float | None = None,
                 peer_daemons: Iterable[tuple[str, int | None]] = (),
                 echo: bool = False, events: int = 1000) -> None:
        for name, r, b in (("rate", rate, burst), ("ip_rate", ip_rate, ip_burst)):
            if r is not None and not r > 0:
                raise ValueError(f"{name} must be positive, got {r!r}")
            if b is not None and not b >= 1:
                raise ValueError(f"burst must be at least 1 datagram, got {b!r}")
        self.rate = rate
        self.burst = _burst(rate, burst)
        self.ip_rate = ip_rate
        self.ip_burst = _burst(ip_rate, ip_burst)
        self._ip_buckets: dict[bytes, list[float]] = {}  # ip4 -> [tokens, time]
        self.table = ClientTable(ttl, max_clients, self.burst)
        self.counters = Counters()
        self.events = EventRing(events)
        self.echo = echo
        self.allow = [ipaddress.IPv4Network(a, strict=False) for a in allow]
        self._allow_masks = [(int(n.network_address), int(n.netmask)) for n in self.allow]
        self._peer_masks = []
        for net, port in peer_daemons:
            n = ipaddress.IPv4Network(net, strict=False)
            self._peer_masks.append((int(n.network_address), int(n.netmask), port))
        self._own_ips: frozenset[bytes] = frozenset()
        self._own_port = -1
        self._own_loopback = False
        self._suspects: dict[tuple[str, int], float] = {}  # addr -> until (seconds)
        self._recent: dict[int, list] = {}  # hash(payload) -> see _remember
        self._relays: dict[tuple[str, int], float] = {}  # addr -> until (s): sent back a TIR
        self.config = None
        self.nat: NatTable | None = None
        self._domain_of = lambda ip4: None
        self.set_config(config)

    def set_own_addresses(self, ips: Iterable[str], port: int, *, any_address: bool = False) -> None:
        """Our listening addresses: datagrams "from" them are spoofed and
        dropped, so the daemon never becomes its own client. ``any_address``
        (bound to 0.0.0.0) also counts every 127.0.0.0/8 address as ours."""
        self._own_ips = frozenset(inet_aton(ip) for ip in ips)
        self._own_port = port
        self._own_loopback = any_address

    @property
    def suspected_daemons(self) -> list[tuple[str, int]]:
        return list(self._suspects)

    # ------------------------------------------------------------- config

    def set_config(self, config, *, regroup: bool = True) -> int | RegroupSweep:
        """Install a (re)loaded config; the client table is kept and its
        clients re-classified into the new domains. Returns how many moved,
        or with ``regroup=False`` a :class:`RegroupSweep` to run in slices
        (new clients are classified by the new config at once)."""
        self.config = config
        self.nat = None if config is None else config.nat
        if config is None or not config.domains:
            self._domain_of = lambda ip4: None
        else:
            self._domain_of = self.nat.domain_of
        sweep = RegroupSweep(self.table, self._domain_of)
        if not regroup:
            return sweep
        return sweep.step(len(self.table) + 1)

    # ---------------------------------------------------------------- core

    def _allowed(self, ip4: bytes) -> bool:
        v = int.from_bytes(ip4, "big")
        return any(v & m == n for n, m in self._allow_masks)

    def event(self, now: float, kind: str, detail: str) -> None:
        self.events.add(now, kind, detail)

    def _refusal(self, ip4: bytes, src: tuple[str, int], now: float, data: bytes) -> str | None:
        """Why a datagram from an unregistered ``src`` must not register it (or None)."""
        if self._allow_masks and not self._allowed(ip4):
            return "denied"
        port = src[1]
        if port == self._own_port and (ip4 in self._own_ips or self._own_loopback and ip4[0] == 127):
            return "own_address"
        if self._peer_masks:
            v = int.from_bytes(ip4, "big")
            for n, m, p in self._peer_masks:
                if v & m == n and (p is None or p == port):
                    return "peer_daemon"
        if self._suspects:
            until = self._suspects.get(src)
            if until is not None:
                if now < until and not (len(data) == 4 and (data[0] & 0x0F) in (2, 3)):
                    return "suspected_daemon"
                del self._suspects[src]  # expired, or a keepalive: daemons never send one
        return None

    def _suspect(self, src: tuple[str, int], now: float) -> None:
        sus = self._suspects
        if src not in sus:
            if len(sus) >= SUSPECTS_MAX:
                del sus[next(iter(sus))]  # forget the oldest
            self.event(now, "suspected_daemon", f"{src[0]}:{src[1]} sent a keepalive reply")
        sus[src] = now + self.table.ttl

    def _ip_limited(self, ip4: bytes, now: float) -> bool:
        """Per source IP token bucket (all ports together); True = over the limit."""
        buckets = self._ip_buckets
        b = buckets.get(ip4)
        if b is None:
            if len(buckets) >= 65536:
                del buckets[next(iter(buckets))]  # bounded: forget the oldest address
            b = buckets[ip4] = [self.ip_burst, now]
        tokens = min(self.ip_burst, b[0] + (now - b[1]) * self.ip_rate)
        b[1] = now
        if tokens < 1.0:
            b[0] = tokens
            return True
        b[0] = tokens - 1.0
        return False

    def _drop(self, reason: str) -> Drop:
        self.counters.drops[reason] += 1
        return Drop(reason)

    def handle(self, data: bytes, src: tuple[str, int], now: float) -> Drop | Reply | Relay | Quiet:
        """Process one datagram from ``src`` received at ``now`` (seconds);
        it is counted once: dropped by reason, or accepted by type."""
        c = self.counters
        c.received += 1
        client = self.table.get(src)
        if client is None:
            ip4 = inet_aton(src[0])
            why = self._refusal(ip4, src, now, data)
            if why is not None:
                return self._drop(why)
            if len(data) == 4 and data in REPLY_SHAPES:
                # what a daemon answers to a keepalive: never a client, never relayed
                self._suspect(src, now)
                return self._drop("reply_shaped")
        try:
            res = scan(data)
        except LBMRDecodeError as e:
            self.event(now, "malformed", f"{src[0]}:{src[1]} {e}")
            return self._drop("malformed")
        if self.ip_rate is not None and self._ip_limited(client.ip4 if client else ip4, now):
            return self._drop("ip_rate_limited")
        if client is None:
            client = self.table.register(src, now, self._domain_of(ip4))
            if client is None:
                return self._drop("table_full")
            c.clients_added += 1
            self.event(now, "client_added", f"{src[0]}:{src[1]} domain={client.domain}")
        else:
            client.last_seen = now
        if self.rate is not None and self._rate_limited(client, now):
            return self._drop("rate_limited")
        ptype = res.type
        if ptype == 2 or ptype == 3:
            out = Reply(bytes((data[0] & 0xF0, 0, 0, 0)))
            c.replies += 1
        elif ptype == 0 and not res.tqrs and not res.tirs_count:
            if len(data) == 4:  # reply-shaped, from a known client: not relayed
                return self._drop("reply_shaped")
            out = QUIET  # records-free NORMAL packet with options: nothing to relay
            c.quiet += 1
        else:
            out = self._fan_out(data, res, client, src, now)
            if out is None:
                return self._drop("loop")
            c.relayed += 1
        client.rx += 1
        c.rx_by_type[ptype] += 1
        c.rx_bytes += len(data)
        return out

    def _rate_limited(self, client: Client, now: float) -> bool:
        """Per client token bucket; True = over the limit."""
        tokens = min(self.burst, client.tokens + (now - client.token_time) * self.rate)
        client.token_time = now
        if tokens < 1.0:
            client.tokens = tokens
            return True
        client.tokens = tokens - 1.0
        return False

    def _fan_out(self, data: bytes, res, client: Client, src: tuple[str, int], now: float) -> Relay | None:
        """The relay of a datagram with records (``res``, scanned), or None
        when it is coming back round a loop."""
        # loop memory, on the hot path: one look-up when the sender repeats itself
        key = hash(data)
        seen = self._recent.get(key)
        if seen is not None and now - seen[1] < LOOP_WINDOW:
            if seen[0] is client:
                seen[1] = now  # the sender again: UM re-advertises the same bytes
            elif seen[0].addr != src and self._looped(seen, src, now, res.tirs_count):
                return None
            seen = True  # known: nothing to remember for the bytes as received
        else:
            seen = None
        base = data
        if res.tirs:
            base = self._fill_in(data, res.tirs, client.ip4)
            if len(self.table.groups) > 1 or self.nat is not None and self.nat.transforms:
                # a copy coming back after NAT rewrites in a cycle of daemons is the base again
                self._remember(base, client, now)
                return Relay(self._nat(base, res.tirs, client, now), client)
        if base is not data:
            self._remember(base, client, now)
        elif seen is None:
            recent = self._recent
            if len(recent) >= LOOP_MEMORY:
                del recent[next(iter(recent))]  # bounded: forget the oldest
            recent[key] = [client, now, {}, False]
        return Relay([(base, g) for g in self.table.groups.values()], client)

    def _looped(self, seen: list, src: tuple[str, int], now: float, tirs: int) -> bool:
        """Whether a datagram whose bytes we relayed in the last
        :data:`LOOP_WINDOW` seconds for another sender (``seen``, see
        :meth:`_remember`), now from ``src``, is coming back round a loop.

        A relayed datagram with TIRs names its source (0.0.0.0 is filled in
        before it is remembered), so a copy of it from anyone but its sender
        is a relay's echo: dropped at once, and its sender is marked a relay
        for :data:`LOOP_WINDOW` seconds. Records without addresses (queries)
        can be byte-identical from two contexts, so those copies are dropped
        when they come from a marked relay, or when more than
        :data:`LOOP_REPEATS` of them arrive from one source each less than
        :data:`LOOP_GAP` seconds after the previous (a loop goes round in
        milliseconds; a context repeats a query at most every 20 ms, then
        40, 80, ...): a loop dies within that many rounds, real queries
        pass.
        """
        if tirs:
            self._relays[src] = now + LOOP_WINDOW
            if len(self._relays) > SUSPECTS_MAX:
                del self._relays[next(iter(self._relays))]
            return self._loop_drop(seen, src, now)
        until = self._relays.get(src)
        if until is not None and now < until:
            return self._loop_drop(seen, src, now)
        others = seen[2]  # per other source: [copies in quick succession, time of the last]
        mine = others.get(src)
        if mine is None:
            if len(others) >= 8:
                others.clear()
            mine = others[src] = [0, now]
        elif now - mine[1] > LOOP_GAP:
            mine[0] = 0  # far apart: a context re-querying, not a loop
        mine[0] += 1
        mine[1] = now
        if mine[0] > LOOP_REPEATS:
            return self._loop_drop(seen, src, now)
        return False

    def _loop_drop(self, seen: list, src: tuple[str, int], now: float) -> bool:
        """A loop: reported once per looping datagram (the caller counts the drop)."""
        if not seen[3]:
            seen[3] = True  # one event per looping datagram
            first = seen[0].addr
            self.event(now, "loop", f"{src[0]}:{src[1]} sent back a datagram first "
                                    f"relayed for {first[0]}:{first[1]}")
        return True

    def _remember(self, payload: bytes, sender: Client, now: float) -> None:
        """Note a payload relayed for ``sender`` (bounded: the oldest is
        forgotten). A live entry of another sender is kept, so a copy that
        goes round again is still counted against the first sender.
        Entries: [sender (Client), time (s), {other source: [copies in quick
        succession, time of the last (s)]}, looping reported]."""
        recent = self._recent
        k = hash(payload)
        seen = recent.get(k)
        if seen is not None and now - seen[1] < LOOP_WINDOW:
            if seen[0] is sender:
                seen[1] = now  # the sender again: UM re-advertises the same bytes
            return
        if seen is None and len(recent) >= LOOP_MEMORY:
            del recent[next(iter(recent))]
        recent[k] = [sender, now, {}, False]

    def _fill_in(self, data: bytes, tirs, ip4: bytes) -> bytes:
        buf = None
        n = 0
        for t in tirs:
            a = t.addr
            if a >= 0 and data[a:a + 4] == ZERO_IP:
                if buf is None:
                    buf = bytearray(data)
                buf[a:a + 4] = ip4
                n += 1
            for a, _ in t.opt_pairs:
                if data[a:a + 4] == ZERO_IP:
                    if buf is None:
                        buf = bytearray(data)
                    buf[a:a + 4] = ip4
                    n += 1
        if buf is None:
            return data
        self.counters.fillins += n
        return bytes(buf)

    def _nat(self, base: bytes, tirs, sender: Client, now: float):
        """One payload per destination group (a generator, so that the shell
        can pause between groups: a datagram of thousands of TIRs times
        hundreds of domains is seconds of work), rewritten by the rules of
        (source domain of each TIR, group's domain); unchanged ones shared.
        The groups are those of the moment the datagram arrived."""
        domain_of = self._domain_of
        nat = self.nat
        srcdoms = [domain_of(base[t.addr:t.addr + 4]) if t.addr >= 0 else sender.domain for t in tirs]
        distinct = set(srcdoms)
        for g in list(self.table.groups.values()):
            ruled = {sd for sd in distinct if nat.rules_for(sd, g.domain)}
            if not ruled:
                yield base, g
                continue
            buf = None
            for t, sd in zip(tirs, srcdoms, strict=True):
                if sd not in ruled:
                    continue
                pairs = ((t.addr, t.port),) + t.opt_pairs if t.addr >= 0 else t.opt_pairs
                for a, p in pairs:
                    ip = base[a:a + 4]
                    port = int.from_bytes(base[p:p + 2], "big")
                    out = nat.rewrite(sd, g.domain, ip, port)  # first matching rule
                    if out is not None and out != (ip, port):
                        if buf is None:
                            buf = bytearray(base)
                        buf[a:a + 4] = out[0]
                        buf[p:p + 2] = out[1].to_bytes(2, "big")
            if buf is None:
                yield base, g
            else:
                self.counters.nat_rewrites += 1
                payload = bytes(buf)
                self._remember(payload, sender, now)
                yield payload, g

    def expire(self, now: float) -> list[Client]:
        """The activity check: drop clients silent for ``ttl`` seconds."""
        sweep = self.table.sweep(now)
        return self.expire_step(sweep, len(self.table) + 1, now)

    def expire_step(self, sweep: ExpirySweep, budget: int, now: float) -> list[Client]:
        """One slice of an activity check (:meth:`ClientTable.sweep`): at most
        ``budget`` clients checked; the removed ones are counted and returned."""
        dead = sweep.step(budget)
        self.counters.clients_expired += len(dead)
        for cl in dead:
            self.event(now, "client_expired", f"{cl.addr[0]}:{cl.addr[1]}")
        if self._ip_buckets and sweep.done:  # forget addresses whose bucket is full again
            rate, full = self.ip_rate, self.ip_burst
            self._ip_buckets = {ip: b for ip, b in self._ip_buckets.items()
                                if b[0] + (now - b[1]) * rate < full}
        return dead

    def snapshot(self, now: float, max_clients: int = 1000) -> dict:
        """Client table (the first ``max_clients``: a dump must not stall the
        relay), counters and the recent-events ring as plain data."""
        from itertools import islice

        return {
            "clients_total": len(self.table),
            "clients": [c.as_dict(now) for c in islice(self.table, max_clients)],
            "counters": self.counters.as_dict(),
            "events": self.events.dump(now),
        }
