"""The lbmrd client table (sans-IO): who has sent us valid topic resolution
recently, grouped by NAT domain for the fan-out.

Times are in seconds (floats from any monotonic clock the caller uses).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

_SOCKADDR = struct.Struct("=H2s4s8x")  # struct sockaddr_in (Linux): family host order, port/addr network order


class Client:
    """One registered client: a UM context's unicast TR socket (ip, port)."""

    __slots__ = ("addr", "ip4", "sockaddr", "domain", "first_seen", "last_seen", "tokens",
                 "token_time", "rx", "group", "pos")

    def __init__(self, addr: tuple[str, int], now: float, domain: str | None, burst: float) -> None:
        self.addr = addr
        self.ip4 = socket.inet_aton(addr[0])
        self.sockaddr = _SOCKADDR.pack(socket.AF_INET, addr[1].to_bytes(2, "big"), self.ip4)
        self.domain = domain
        self.first_seen = now
        self.last_seen = now
        self.tokens = burst  # rate-limit bucket (datagrams)
        self.token_time = now
        self.rx = 0  # datagrams received from this client
        self.group: Group | None = None
        self.pos = -1

    def as_dict(self, now: float) -> dict:
        return {"addr": f"{self.addr[0]}:{self.addr[1]}", "domain": self.domain,
                "age_s": round(now - self.first_seen, 3), "idle_s": round(now - self.last_seen, 3),
                "datagrams": self.rx}


class Group:
    """The clients of one NAT domain, as a dense list (for batched sends).

    ``version`` changes whenever membership changes, so a sender can cache
    per-group socket-address arrays; ``dirty`` lists the positions whose
    member changed since the sender last synchronised (it clears it), so
    keeping those arrays up to date costs O(1) per join or removal.
    """

    __slots__ = ("domain", "members", "version", "dirty", "sender_cache")

    def __init__(self, domain: str | None) -> None:
        self.domain = domain
        self.members: list[Client] = []
        self.version = 0
        self.dirty: list[int] = []
        self.sender_cache = None  # the sender's per-group arrays; they die with the group

    def _mark(self, *positions: int) -> None:
        if len(self.dirty) > 4096:  # nobody is syncing: forget, the sender rebuilds
            self.dirty = [-1]
        else:
            self.dirty += positions

    def add(self, c: Client) -> None:
        c.group = self
        c.pos = len(self.members)
        self.members.append(c)
        self.version += 1
        self._mark(c.pos)

    def move_to_end(self, c: Client) -> None:
        """Swap ``c`` with the last member, so "everyone but c" is one range."""
        members = self.members
        j = len(members) - 1
        i = c.pos
        if i != j:
            last = members[j]
            members[i] = last
            members[j] = c
            last.pos = i
            c.pos = j
            self._mark(i, j)

    def remove(self, c: Client) -> None:
        last = self.members.pop()
        if last is not c:  # move the last member into the hole: O(1)
            self.members[c.pos] = last
            last.pos = c.pos
            self._mark(c.pos)
        c.group = None
        c.pos = -1
        self.version += 1


class ClientTable:
    """Clients keyed by their datagrams' source (ip, port).

    ``ttl`` seconds of silence make a client removable by :meth:`expire`.
    ``max_clients`` bounds the table: when it is full a new client is refused
    (its datagram is dropped and counted by the relay) and known clients keep
    their place -- a flood of new sources cannot push real clients out.
    """

    def __init__(self, ttl: float = 60.0, max_clients: int | None = None, burst: float = 0.0) -> None:
        self.ttl = ttl
        self.max_clients = max_clients
        self.burst = burst
        self._by_addr: dict[tuple[str, int], Client] = {}
        self.groups: dict[str | None, Group] = {}

    def __len__(self) -> int:
        return len(self._by_addr)

    def __iter__(self) -> Iterator[Client]:
        return iter(self._by_addr.values())

    def get(self, addr: tuple[str, int]) -> Client | None:
        return self._by_addr.get(addr)

    def register(self, addr: tuple[str, int], now: float, domain: str | None) -> Client | None:
        """Add a new client (``None`` when the table is full)."""
        if self.max_clients is not None and len(self._by_addr) >= self.max_clients:
            return None
        c = Client(addr, now, domain, self.burst)
        self._by_addr[addr] = c
        self._group(domain).add(c)
        return c

    def _group(self, domain: str | None) -> Group:
        g = self.groups.get(domain)
        if g is None:
            g = self.groups[domain] = Group(domain)
        return g

    def remove(self, c: Client) -> None:
        del self._by_addr[c.addr]
        g = c.group
        if g is not None:
            g.remove(c)
            if not g.members:
                del self.groups[g.domain]

    def expire(self, now: float) -> list[Client]:
        """Remove and return every client silent for more than ``ttl`` seconds."""
        return ExpirySweep(self, now).step(len(self._by_addr))

    def sweep(self, now: float) -> ExpirySweep:
        """An activity check to run in slices (see :class:`ExpirySweep`)."""
        return ExpirySweep(self, now)

    def regroup(self, domain_of) -> int:
        """Re-classify every client with ``domain_of(ip4) -> domain`` (after a
        config reload); returns how many moved."""
        return RegroupSweep(self, domain_of).step(len(self._by_addr) + 1)

    def move(self, c: Client, domain: str | None) -> None:
        """Put ``c`` into the group of ``domain``."""
        g = c.group
        if g is not None:
            g.remove(c)
            if not g.members:
                del self.groups[g.domain]
        c.domain = domain
        self._group(domain).add(c)


class _Slices:
    """The clients present when a sweep starts, handed out ``budget`` at a time."""

    __slots__ = ("_todo", "_pos")

    def __init__(self, table: ClientTable) -> None:
        self._todo = list(table)
        self._pos = 0

    @property
    def done(self) -> bool:
        return self._pos >= len(self._todo)

    def _next(self, budget: int) -> list[Client]:
        end = min(self._pos + budget, len(self._todo))
        out = self._todo[self._pos:end]
        self._pos = end
        if end >= len(self._todo):
            self._todo = []
            self._pos = 0
        return out


class ExpirySweep(_Slices):
    """An activity check done in slices, so that a sweep of a large table
    never holds the daemon's loop for long.

    The deadline (``now - ttl``, seconds) and the list of clients to check
    are fixed when the sweep starts; each :meth:`step` checks at most
    ``budget`` of them and removes those still registered and still silent
    since before the deadline (a client heard from between two steps stays).
    """

    __slots__ = ("table", "limit")

    def __init__(self, table: ClientTable, now: float) -> None:
        super().__init__(table)
        self.table = table
        self.limit = now - table.ttl

    def step(self, budget: int) -> list[Client]:
        """Check the next ``budget`` clients; return the ones removed."""
        limit = self.limit
        table = self.table
        dead = []
        for c in self._next(budget):
            if c.last_seen < limit and c.group is not None and table.get(c.addr) is c:
                table.remove(c)
                dead.append(c)
        return dead


class RegroupSweep(_Slices):
    """Re-classifying the clients after a reload, in slices like
    :class:`ExpirySweep` (clients that register meanwhile are classified by
    the new rules already)."""

    __slots__ = ("table", "domain_of", "moved")

    def __init__(self, table: ClientTable, domain_of) -> None:
        super().__init__(table)
        self.table = table
        self.domain_of = domain_of
        self.moved = 0

    def step(self, budget: int) -> int:
        """Re-classify the next ``budget`` clients; returns how many moved in all."""
        table, domain_of = self.table, self.domain_of
        for c in self._next(budget):
            if c.group is None:
                continue  # expired meanwhile
            d = domain_of(c.ip4)
            if d != c.domain:
                table.move(c, d)
                self.moved += 1
        return self.moved
