#!/usr/bin/env python3
"""Benchmark lbmr_proto.capture.read_udp against scapy (and dpkt, if installed).

    python bench/capture_read.py [--packets N]

Writes a classic pcap of N small LBMR-like UDP datagrams (60-byte payloads to
239.101.3.1:15380 from a few hundred source addresses) into a temporary directory
with PcapWriter, then times iterating it.  read_udp runs over the whole file (best
of 3); scapy and dpkt are slow, so they read only the first 20,000 packets and
their rate is extrapolated.  All work is bounded: N is capped at 10,000,000.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lbmr_proto.capture import PcapWriter, read_frames, read_udp  # noqa: E402

MAX_PACKETS = 10_000_000
SLOW_SAMPLE = 20_000
LBMR_PORT = 15380


def generate(path: Path, n: int) -> float:
    """Write ``n`` datagrams to ``path``; returns the seconds it took."""
    rnd = random.Random(614)
    sources = [(f"10.29.{rnd.randrange(256)}.{rnd.randrange(1, 255)}", rnd.randrange(10000, 60000))
               for _ in range(300)]
    # LBMR-ish: version 1 / type 0 header, one TIR for a short topic name, padding to 60 bytes
    payloads = [(b"\x10\x00\x00\x01" + b"\x00\x00\x00\x10" + b"bench/topic/%04d\x00" % i).ljust(60, b"\x00")
                for i in range(64)]
    start = time.perf_counter()
    with PcapWriter(path) as w:
        ts = 1_700_000_000.0
        for i in range(n):
            src, sport = sources[i % 300]
            w.write_udp(ts + i * 1e-5, src, sport, "239.101.3.1", LBMR_PORT, payloads[i & 63], ip_id=i)
    return time.perf_counter() - start


def best_rate(fn, runs: int = 3) -> tuple[float, int]:
    """(packets per second, packets) of the fastest of ``runs`` calls of ``fn``."""
    best, count = float("inf"), 0
    for _ in range(runs):
        start = time.perf_counter()
        count = fn()
        best = min(best, time.perf_counter() - start)
    return count / best, count


def ours(path: Path, **kw) -> int:
    n = 0
    for _ in read_udp(path, **kw):
        n += 1
    return n


def ours_frames(path: Path) -> int:
    n = 0
    for _ in read_frames(path):
        n += 1
    return n


def scapy_sample(path: Path) -> int:
    from scapy.layers.inet import IP, UDP
    from scapy.utils import PcapReader

    n = 0
    with PcapReader(str(path)) as reader:
        for pkt in itertools.islice(reader, SLOW_SAMPLE):
            if UDP in pkt:
                ip, u = pkt[IP], pkt[UDP]
                (ip.src, u.sport, ip.dst, u.dport, bytes(u.payload))
                n += 1
    return n


def dpkt_sample(path: Path) -> int:
    import socket

    import dpkt

    n = 0
    with open(path, "rb") as f:
        for _ts, buf in itertools.islice(dpkt.pcap.Reader(f), SLOW_SAMPLE):
            ip = dpkt.ethernet.Ethernet(buf).data
            if isinstance(ip, dpkt.ip.IP) and isinstance(ip.data, dpkt.udp.UDP):
                (socket.inet_ntoa(ip.src), ip.data.sport, socket.inet_ntoa(ip.dst), ip.data.dport, ip.data.data)
                n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packets", type=int, default=1_000_000, help="datagrams to generate (default 1,000,000)")
    args = ap.parse_args(argv)
    n = max(1, min(args.packets, MAX_PACKETS))

    with tempfile.TemporaryDirectory(prefix="capture-bench-") as tmp:
        path = Path(tmp) / "bench.pcap"
        took = generate(path, n)
        print(f"python {sys.version.split()[0]}; {n:,} datagrams, {path.stat().st_size / 1e6:.1f} MB "
              f"written in {took:.2f} s ({n / took:,.0f}/s)")

        rows = []
        rate, count = best_rate(lambda: ours(path))
        assert count == n, (count, n)
        rows.append(("lbmr_proto read_udp", count, rate))
        rate_ports, count = best_rate(lambda: ours(path, ports={LBMR_PORT}))
        rows.append(("lbmr_proto read_udp(ports=...)", count, rate_ports))
        rate_frames, count = best_rate(lambda: ours_frames(path))
        rows.append(("lbmr_proto read_frames", count, rate_frames))
        slow = {}
        for name, fn in (("scapy PcapReader", scapy_sample), ("dpkt pcap.Reader", dpkt_sample)):
            try:
                r, c = best_rate(lambda fn=fn: fn(path), runs=1)
            except ImportError:
                rows.append((name, 0, None))
                continue
            slow[name] = r
            rows.append((name + " (extrapolated)", c, r))

    print(f"\n{'reader':36s} {'packets':>10s} {'packets/s':>12s}")
    for name, count, r in rows:
        print(f"{name:36s} {count:>10,} {r:>12,.0f}" if r else f"{name:36s} {'-':>10s} {'not installed':>12s}")
    for name, r in slow.items():
        print(f"read_udp / {name}: {rate / r:,.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
