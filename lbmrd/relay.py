"""The lbmrd relay core (sans-IO): bytes and time in, decisions out.

:meth:`RelayCore.handle` takes one datagram, its source (ip, port) and the
current time in seconds, updates the client table and counters, and returns
what to send: nothing, a keepalive reply to the sender, or the datagram
(possibly rewritten per destination domain) for every other client. The
trio shell in :mod:`lbmrd.server` only moves bytes.
"""

from __future__ import annotations

import ipaddress
from collections import Counter, deque
from socket import inet_aton
from typing import NamedTuple

from lbmr_proto import LBMRDecodeError
from lbmr_proto.fast import scan
from lbmr_proto.packet import TYPE_NAMES

from .clients import Client, ClientTable, Group

ZERO_IP = b"\0\0\0\0"


class Drop(NamedTuple):
    reason: str


class Reply(NamedTuple):
    payload: bytes


class Relay(NamedTuple):
    """Send ``payload`` of each (payload, group) pair to every member of the
    group except ``sender``."""

    parts: list[tuple[bytes, Group]]
    sender: Client


class Quiet(NamedTuple):
    """Valid and registered, nothing to send (a resolver keepalive from a client)."""


QUIET = Quiet()


class Counters:
    """What the daemon has seen and done (exported as metrics)."""

    def __init__(self) -> None:
        self.rx: Counter[str] = Counter()  # valid datagrams in, by packet type
        self.rx_bytes = 0
        self.tx = 0  # datagrams sent (relayed copies and replies)
        self.tx_bytes = 0
        self.drops: Counter[str] = Counter()  # by reason
        self.send_errors: Counter[str] = Counter()  # by errno name, counted by the shell
        self.nat_rewrites = 0  # per-destination-domain copies changed by NAT rules
        self.fillins = 0  # 0.0.0.0 address fields filled with the sender's address
        self.clients_added = 0
        self.clients_expired = 0

    def as_dict(self) -> dict:
        return {"rx": dict(self.rx), "rx_bytes": self.rx_bytes, "tx": self.tx, "tx_bytes": self.tx_bytes,
                "drops": dict(self.drops), "send_errors": dict(self.send_errors),
                "nat_rewrites": self.nat_rewrites, "fillins": self.fillins,
                "clients_added": self.clients_added, "clients_expired": self.clients_expired}


class RelayCore:
    """Client table + relay + 0.0.0.0 fill-in + NAT, without I/O.

    ``config`` is an :class:`lbmrd.config.Config` (or None: no domains).
    ``ttl`` seconds of silence expire a client. ``allow`` is a list of CIDR
    strings (empty = everyone). ``max_clients`` bounds the table (new
    clients refused when full). ``rate``/``burst``: per-client token bucket
    in datagrams per second / datagrams (None = unlimited). ``echo`` also
    sends a datagram back to its sender (multicast-like; off by default).
    ``events`` is the size of the recent-events ring.
    """

    def __init__(self, config=None, *, ttl: float = 60.0, allow: list[str] | tuple = (),
                 max_clients: int | None = None, rate: float | None = None, burst: float | None = None,
                 echo: bool = False, events: int = 1000) -> None:
        if rate is not None and not rate > 0:
            raise ValueError(f"rate must be positive, got {rate!r}")
        if burst is not None and not burst >= 1:
            raise ValueError(f"burst must be at least 1 datagram, got {burst!r}")
        self.rate = rate
        self.burst = float(burst if burst is not None else (max(1.0, rate * 2) if rate else 0.0))
        self.table = ClientTable(ttl, max_clients, self.burst)
        self.counters = Counters()
        self.events: deque[tuple[float, str, str]] = deque(maxlen=events)
        self.echo = echo
        self.allow = [ipaddress.IPv4Network(a, strict=False) for a in allow]
        self._allow_masks = [(int(n.network_address), int(n.netmask)) for n in self.allow]
        self.config = None
        self._domain_of = lambda ip4: None
        self.set_config(config)

    # ------------------------------------------------------------- config

    def set_config(self, config) -> int:
        """Install a (re)loaded config; the client table is kept and its
        clients re-classified into the new domains. Returns how many moved."""
        self.config = config
        if config is None or not config.domains:
            self._domain_of = lambda ip4: None
        else:
            self._domain_of = config.domain_of
        moved = self.table.regroup(self._domain_of)
        return moved

    # ---------------------------------------------------------------- core

    def _allowed(self, ip4: bytes) -> bool:
        v = int.from_bytes(ip4, "big")
        return any(v & m == n for n, m in self._allow_masks)

    def event(self, now: float, kind: str, detail: str) -> None:
        self.events.append((now, kind, detail))

    def handle(self, data: bytes, src: tuple[str, int], now: float) -> Drop | Reply | Relay | Quiet:
        """Process one datagram from ``src`` received at ``now`` (seconds)."""
        c = self.counters
        client = self.table.get(src)
        ip4 = None
        if client is None:
            ip4 = inet_aton(src[0])
            if self._allow_masks and not self._allowed(ip4):
                c.drops["denied"] += 1
                return Drop("denied")
        try:
            res = scan(data)
        except LBMRDecodeError as e:
            c.drops["malformed"] += 1
            self.event(now, "malformed", f"{src[0]}:{src[1]} {e}")
            return Drop("malformed")
        if client is None:
            client = self.table.register(src, now, self._domain_of(ip4))
            if client is None:
                c.drops["table_full"] += 1
                return Drop("table_full")
            c.clients_added += 1
            self.event(now, "client_added", f"{src[0]}:{src[1]} domain={client.domain}")
        else:
            client.last_seen = now
        if self.rate is not None:
            tokens = min(self.burst, client.tokens + (now - client.token_time) * self.rate)
            client.token_time = now
            if tokens < 1.0:
                client.tokens = tokens
                c.drops["rate_limited"] += 1
                return Drop("rate_limited")
            client.tokens = tokens - 1.0
        client.rx += 1
        ptype = res.type
        c.rx[TYPE_NAMES[ptype]] += 1
        c.rx_bytes += len(data)
        if ptype == 2 or ptype == 3:
            return Reply(bytes((data[0] & 0xF0, 0, 0, 0)))
        if ptype == 0 and not res.tqrs and not res.tirs_count:
            return QUIET  # a resolver keepalive: nothing to relay
        base = data
        if res.tirs:
            base = self._fill_in(data, res.tirs, client.ip4)
            if len(self.table.groups) > 1 or self.config is not None and self.config.transforms:
                return Relay(self._nat(base, res.tirs, client), client)
        return Relay([(base, g) for g in self.table.groups.values()], client)

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

    def _nat(self, base: bytes, tirs, sender: Client) -> list[tuple[bytes, Group]]:
        """One payload per destination group, rewritten by the rules of
        (source domain of each TIR, group's domain); unchanged ones shared."""
        domain_of = self._domain_of
        config = self.config
        srcdoms = [domain_of(base[t.addr:t.addr + 4]) if t.addr >= 0 else sender.domain for t in tirs]
        parts = []
        for g in self.table.groups.values():
            buf = None
            for t, sd in zip(tirs, srcdoms, strict=True):
                if not config.rules_for(sd, g.domain):
                    continue
                pairs = ((t.addr, t.port),) + t.opt_pairs if t.addr >= 0 else t.opt_pairs
                for a, p in pairs:
                    ip = base[a:a + 4]
                    port = int.from_bytes(base[p:p + 2], "big")
                    out = config.rewrite(sd, g.domain, ip, port)  # first matching rule
                    if out is not None and out != (ip, port):
                        if buf is None:
                            buf = bytearray(base)
                        buf[a:a + 4] = out[0]
                        buf[p:p + 2] = out[1].to_bytes(2, "big")
            if buf is None:
                parts.append((base, g))
            else:
                self.counters.nat_rewrites += 1
                parts.append((bytes(buf), g))
        return parts

    def expire(self, now: float) -> list[Client]:
        """The activity check: drop clients silent for ``ttl`` seconds."""
        dead = self.table.expire(now)
        self.counters.clients_expired += len(dead)
        for cl in dead:
            self.event(now, "client_expired", f"{cl.addr[0]}:{cl.addr[1]}")
        return dead

    def snapshot(self, now: float, max_clients: int = 1000) -> dict:
        """Client table (the first ``max_clients``: a dump must not stall the
        relay), counters and the recent-events ring as plain data."""
        from itertools import islice

        return {
            "clients_total": len(self.table),
            "clients": [c.as_dict(now) for c in islice(self.table, max_clients)],
            "counters": self.counters.as_dict(),
            "events": [{"age_s": round(now - t, 3), "event": k, "detail": d} for t, k, d in self.events],
        }
