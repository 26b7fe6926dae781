"""Deterministic generator of realistic UM topic-resolution traffic for the
benchmarks: a population of contexts (each with its own packet-options
trailer) advertising and querying a pool of topics, as UM 6.x sends them.

Mix per datagram: 40% TIR advertisements (1-3 TIRs, LBT-RM / TCP / LBT-RU,
each with OTID and extended-functionality options; each context re-sends
its own 40 advertisements), 35% TQRs (1-2 topics; each context re-sends its
own 20 queries),
5% wildcard TQRs, 20% unicast keepalives -- every datagram but the
keepalives carrying the trailer (source id, source type, version, domain).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lbmr_proto as L  # noqa: E402
from lbmr_proto.capture import PcapWriter  # noqa: E402


def datagrams(n: int, *, contexts: int = 200, topics: int = 5000, seed: int = 7
              ) -> Iterator[tuple[float, str, int, str, int, bytes]]:
    rng = random.Random(seed)
    ctx = []
    for i in range(contexts):
        ip = f"10.{1 + i // 250}.{i % 250}.{10 + i % 7}"
        trailer = [L.SourceIdOption(0x8000, rng.randbytes(8)), L.SourceTypeOption(0x80, 0),
                   L.VersionOption(0x8001, 0x060E0000), L.LocalDomainOption(0x8000, 0)]
        ctx.append((ip, 14402 + i % 5, trailer))
    names = [f"md.{rng.choice(['eq', 'fx', 'fi', 'cmd'])}.{i:05d}.{rng.randbytes(3).hex()}" for i in range(topics)]
    cache: dict[tuple[int, int], bytes] = {}
    ts = 1_700_000_000.0
    for k in range(n):
        ts += 0.0001
        c = rng.randrange(contexts)
        ip, port, trailer = ctx[c]
        r = rng.random()
        if r < 0.40:
            key = (c, rng.randrange(40))  # each context re-advertises its own topics
            b = cache.get(key)
            if b is None:
                tirs = []
                for j in range(rng.randint(1, 3)):
                    t = rng.randrange(3)
                    if t == 0:
                        body = L.LbtrmTransport(ip, f"239.100.0.{c % 200}", rng.getrandbits(32), 14400, 14390 + j)
                    elif t == 1:
                        body = L.TcpTransport(ip, 14371 + j)
                    else:
                        body = L.LbtruSessionTransport(ip, rng.getrandbits(32), 14380 + j)
                    opts = [L.OtidOption(0x8000, bytes([body.TYPE]) + rng.randbytes(31)),
                            L.ExFuncOption(0x8000, 14391, 0, ip, 0)]
                    tirs.append(L.TIR(rng.choice(names), body, 16, rng.getrandbits(32), opts))
                b = cache[key] = L.encode(L.Packet(0, 1, tirs=tirs, options=trailer))
            yield ts, ip, port, "10.0.0.1", 15380, b
        elif r < 0.75:
            # receivers re-query the topics they want until resolved: identical datagrams
            key = (c, 1000 + rng.randrange(20))
            b = cache.get(key)
            if b is None:
                tq = [L.TQR(rng.choice(names)) for _ in range(rng.randint(1, 2))]
                b = cache[key] = L.encode(L.Packet(0, 1, tqrs=tq, options=trailer))
            yield ts, ip, port, "10.0.0.1", 15380, b
        elif r < 0.80:
            wc = [L.WcTQR("^md\\." + rng.choice(["eq", "fx"]) + r"\..*", 1)]
            yield ts, ip, port, "10.0.0.1", 15380, L.encode(L.Packet(1, 1, wc_tqrs=wc, options=trailer))
        else:
            yield ts, ip, port, "10.0.0.1", 15380, bytes((2 + (k & 1), 0, 0, 0))


def write_capture(path: Path, n: int) -> Path:
    with PcapWriter(path) as w:
        for d in datagrams(n):
            w.write_udp(*d)
    return path
