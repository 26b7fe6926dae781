"""lbmrd counts every datagram exactly once (lbmrd(8), COUNTERS): a known
mix of valid, looping, reply-shaped, malformed, garbage, rate-limited and
refused datagrams sent to a real lbmrd on 127.0.0.1, then the counters
and the /metrics families checked to the datagram."""

from __future__ import annotations

import random
import re
import socket

import trio

import lbmr_proto as L
from lbmr_proto.fast import scan
from lbmrd.server import Daemon, Settings

KEEPALIVE = b"\x02\x00\x00\x00"  # RCV_ALIVE
REPLY_SHAPE = b"\x00\x00\x00\x00"
CHUNK = 200  # datagrams sent before waiting for the daemon to read them
WAIT = 20.0  # seconds a phase may take at most


def tqr(i: int) -> bytes:
    return L.encode(L.Packet(0, 1, tqrs=[L.TQR(f"count.q{i}")]))


def tir(topic: str) -> bytes:
    """A TIR with a filled-in address: relayed byte for byte (so a copy from anyone else is a loop)."""
    return L.encode(L.Packet(0, 1, tirs=[L.TIR(topic, L.TcpTransport("127.0.0.1", 14371), 16, 1)]))


QUIET = L.encode(L.Packet(0, 1, options=[L.SourceTypeOption(0x80, L.SourceType.APPLICATION)]))


def malformed(i: int) -> bytes:
    """Well-formed-looking LBMR that is not: truncated, unknown type."""
    good = tqr(i)
    return good[:-1] if i % 2 else b"\x05" + good[1:]


def garbage(n: int, seed: int = 17) -> list[bytes]:
    """``n`` random datagrams that are not LBMR (checked)."""
    rnd = random.Random(seed)
    out = []
    while len(out) < n:
        b = rnd.randbytes(rnd.randrange(1, 300))
        try:
            scan(b)
        except L.LBMRDecodeError:
            out.append(b)
    return out


def udp() -> trio.socket.SocketType:
    s = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    s._sock.bind(("127.0.0.1", 0))  # bind synchronously (loopback only)
    s._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # relayed copies are not read
    return s


class Sender:
    """Sends datagrams to the daemon and waits (bounded) until it has read
    all of them, so that none is lost in a full receive buffer."""

    def __init__(self, daemon: Daemon, addr: tuple[str, int]) -> None:
        self.daemon = daemon
        self.addr = addr
        self.sent = 0

    async def send(self, sock, datagrams) -> None:
        for i, data in enumerate(datagrams, 1):
            await sock.sendto(data, self.addr)
            self.sent += 1
            if i % CHUNK == 0:
                await self.settle()
        await self.settle()

    async def settle(self) -> None:
        with trio.fail_after(WAIT):
            while self.daemon.core.counters.received < self.sent:
                await trio.sleep(0.005)


async def scrape(addr: tuple[str, int]) -> str:
    stream = await trio.open_tcp_stream(*addr)
    await stream.send_all(b"GET /metrics HTTP/1.0\r\n\r\n")
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    await stream.aclose()
    return data.decode()


def family_sum(text: str, name: str) -> int:
    """Sum of the samples of metric family ``name`` in Prometheus text."""
    values = re.findall(rf"^{name}(?:{{[^}}]*}})? (\d+)$", text, re.M)
    assert values or f"# TYPE {name} counter" in text, name
    return sum(int(v) for v in values)


def check_identities(c) -> None:
    assert c.received == sum(c.rx.values()) + sum(c.drops.values())
    assert sum(c.rx.values()) == c.replies + c.quiet + c.relayed


async def test_a_known_mix_adds_up_exactly():
    a, b, c, r, peer, suspect, stranger, late = (udp() for _ in range(8))
    peer_port = peer._sock.getsockname()[1]
    burst = 20
    s = Settings(bind_ip="127.0.0.1", port=0, stats_interval=0, metrics=("127.0.0.1", 0),
                 max_clients=4, rate=0.001, burst=burst, peer_daemons=(("127.0.0.1/32", peer_port),))
    d = Daemon(s)
    junk = garbage(1000)
    async with trio.open_nursery() as n:
        addr = await n.start(d.run)
        out = Sender(d, addr)
        # four clients register with a keepalive each (answered)
        for sock in (a, b, c, r):
            await out.send(sock, [KEEPALIVE])
        # valid traffic from known clients: 10 queries, a TIR, a records-free NORMAL with options
        await out.send(a, [tqr(i) for i in range(10)] + [tir("count.loop"), QUIET])
        # the TIR comes back from two other clients: loops
        await out.send(b, [tir("count.loop")])
        await out.send(c, [tir("count.loop")])
        # reply-shaped from a known client, then from a stranger (then suspected)
        await out.send(b, [REPLY_SHAPE] * 3)
        await out.send(suspect, [REPLY_SHAPE])
        await out.send(suspect, [tqr(100), tqr(101)])
        # malformed from a known client, garbage from a known client and from strangers
        await out.send(a, [malformed(i) for i in range(6)])
        await out.send(c, junk[:500])
        await out.send(stranger, junk[500:])
        # a named peer daemon; a fifth client when the table holds four
        await out.send(peer, [tqr(200)] * 3)
        await out.send(late, [KEEPALIVE] * 2)
        # r goes over its rate limit: 1 keepalive + 25 queries against a burst of 20
        await out.send(r, [tqr(300 + i) for i in range(25)])
        metrics = await scrape(d.metrics_addr)
        n.cancel_scope.cancel()
    for sock in (a, b, c, r, peer, suspect, stranger, late):
        sock.close()

    cnt = d.core.counters
    sent = 4 + 12 + 2 + 3 + 1 + 2 + 6 + 1000 + 3 + 2 + 25
    assert out.sent == sent and cnt.received == sent
    assert dict(cnt.drops) == {"loop": 2, "reply_shaped": 4, "suspected_daemon": 2, "malformed": 1006,
                               "peer_daemon": 3, "table_full": 2, "rate_limited": 25 - (burst - 1)}
    assert dict(cnt.rx) == {"RCV_ALIVE": 4, "NORMAL": 10 + 1 + 1 + burst - 1}
    assert (cnt.replies, cnt.quiet, cnt.relayed) == (4, 1, 11 + burst - 1)
    check_identities(cnt)
    assert not cnt.relays_dropped and not cnt.copies_dropped and not cnt.recv_errors
    assert cnt.clients_added == 4
    # the exported families say the same
    assert family_sum(metrics, "lbmrd_datagrams_received_total") == sent
    assert (family_sum(metrics, "lbmrd_datagrams_in_total") + family_sum(metrics, "lbmrd_drops_total")
            == sent)
    assert family_sum(metrics, "lbmrd_datagrams_in_total") == sum(
        family_sum(metrics, f"lbmrd_{k}_total") for k in ("replies", "quiet", "relayed"))
    assert 'lbmrd_drops_total{reason="loop"} 2' in metrics


async def test_per_address_rate_limit_adds_up_exactly():
    a, b = udp(), udp()
    s = Settings(bind_ip="127.0.0.1", port=0, stats_interval=0, ip_rate=0.001, ip_burst=5)
    d = Daemon(s)
    async with trio.open_nursery() as n:
        addr = await n.start(d.run)
        out = Sender(d, addr)
        await out.send(a, [KEEPALIVE] + [tqr(i) for i in range(3)])  # 4 tokens of 5
        await out.send(b, [KEEPALIVE, tqr(10), tqr(11)] + garbage(4))  # 1 token left; garbage takes none
        n.cancel_scope.cancel()
    a.close()
    b.close()
    cnt = d.core.counters
    assert cnt.received == out.sent == 11
    assert dict(cnt.drops) == {"ip_rate_limited": 2, "malformed": 4}
    assert dict(cnt.rx) == {"RCV_ALIVE": 2, "NORMAL": 3}
    assert (cnt.replies, cnt.quiet, cnt.relayed) == (2, 0, 3)
    check_identities(cnt)
