"""Sections 1 to 3 of bench/router.py: TCP throughput through a deployment
(best of rounds, CPU per GB), LBT-RU datagrams direct and routed, and topic
resolution convergence across the routers (times from time.perf_counter(),
in seconds).
"""

from __future__ import annotations

import random
import select
import subprocess
import time

import lbmr_proto as L
from bench.router_deploy import (
    IO_TIMEOUT_S,
    PY,
    RCV_IP,
    ROOT,
    SRC_IP,
    TPUT_TOPIC,
    Advertiser,
    DataSource,
    RelayChain,
    cpu_snapshot,
    cpu_user_sys,
    decode,
    is_proxy_tir,
    receive,
    resolve,
    tir_packet,
    tqr_packet,
    udp,
)

RU_SIZE = 1400  # LBT-RU datagram bytes
RU_TOPIC = "bench.router.ru"
GAP_S = 0.2  # between the first and the second application in a convergence measurement
CONVERGE_TIMEOUT_S = 5.0




def throughput(dep, source: DataSource, runs: int) -> dict:
    """Best-of-runs direct and routed transfer times on a started deployment."""
    adv = Advertiser(TPUT_TOPIC, dep.lbmrd1, source.port)
    try:
        proxy = resolve(TPUT_TOPIC, dep.lbmrd2)
        direct = (SRC_IP, source.port)
        best = {"direct": float("inf"), "routed": float("inf")}
        cpu_best: dict[str, float] = {}
        for i in range(runs):
            for kind in (("direct", "routed") if i % 2 == 0 else ("routed", "direct")):
                before = cpu_snapshot(dep)
                dt = receive(direct if kind == "direct" else proxy, source.total)
                after = cpu_snapshot(dep)
                if dt < best[kind]:
                    best[kind] = dt
                    if kind == "routed":
                        cpu_best = {k: (after[k] - before[k]) / dt for k in after}
        return {"best": best, "cpu": cpu_best, "proxy": proxy}
    finally:
        adv.close()


def throughput_paths(paths: dict[str, tuple[str, int]], source: DataSource, runs: int,
                     cpu_dep, cpu_path: str, relays: dict[str, RelayChain] | None = None) -> dict:
    """Best transfer time of each path (name -> address to connect to): every round
    measures each path once, the order rotating; the CPU use over the best ``cpu_path``
    transfer (``cpu_dep``'s routers); and, over all rounds, the user and system
    CPU-seconds per GB moved of the processes in the middle of each path: ``cpu_dep``'s
    routers for ``cpu_path``, the relay processes of ``relays[name]`` for those paths, and
    of this process (the source and the receiver) for every path."""
    names = list(paths)
    best = dict.fromkeys(names, float("inf"))
    cpu_best: dict[str, float] = {}
    relays = relays or {}
    middle = {cpu_path: [cpu_dep.pid(r) for r in ("a", "b")]} if hasattr(cpu_dep, "pid") else {}
    middle.update({name: [p.pid for p in chain.procs] for name, chain in relays.items()})
    spent = {name: [0.0, 0.0] for name in middle}
    ends = dict.fromkeys(names, 0.0)  # CPU-seconds of this process (source + receiver)
    for i in range(runs):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            pids = middle.get(name, [])
            t0 = [cpu_user_sys(p) for p in pids]
            before = cpu_snapshot(cpu_dep)
            dt = receive(paths[name], source.total)
            after = cpu_snapshot(cpu_dep)
            ends[name] += after["self"] - before["self"]
            for p, (u0, s0) in zip(pids, t0, strict=True):
                u1, s1 = cpu_user_sys(p)
                spent[name][0] += u1 - u0
                spent[name][1] += s1 - s0
            if dt < best[name]:
                best[name] = dt
                if name == cpu_path:
                    cpu_best = {c: (after[c] - before[c]) / dt for c in after}
    gb = runs * source.total / 1e9
    per_gb = {name: (u / gb, s_ / gb) for name, (u, s_) in spent.items()}
    return {"best": best, "cpu": cpu_best, "cpu_per_gb": per_gb,
            "ends_per_gb": {name: v / gb for name, v in ends.items()}}


# An LBT-RU-like source (lbmr_tools.sim.dataplane.RuDataSource) in a process of its own:
# argv ip, count, seed, rate, size; prints its port, serves every receiver that says HELLO.
RU_SOURCE_CODE = r"""
import sys, trio
from lbmr_tools.sim.dataplane import RuDataSource
ip, count, seed, rate, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
async def main():
    src = RuDataSource(ip, count=count, seed=seed, rate=rate, datagram_size=size, max_burst=64,
                       snd_buf=8 << 20)
    async with trio.open_nursery() as n:
        addr = await n.start(src.serve)
        print(addr[1], flush=True)
trio.run(main)
"""


def udp_rcvbuf_errors() -> int:
    """UDP datagrams the kernel dropped for a full socket receive buffer (whole machine)."""
    with open("/proc/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Udp:")]
    return int(dict(zip(rows[0][1:], rows[1][1:], strict=False)).get("RcvbufErrors", 0))


def lbtru_throughput(dep, count: int, rates: list[float]) -> list[dict]:
    """For each rate: a new LBT-RU-like source process (RU_SOURCE_CODE on SRC_IP, advertised
    in ``dep``'s TRD1 with a TIR every 0.5 s), and ``count`` verified datagrams taken once
    straight from it and once through router B's proxy (RuDataReceiver on RCV_IP, in this
    process)."""
    import trio

    from lbmr_proto.um import synthesize_otid
    from lbmr_tools.sim.dataplane import RuDataReceiver

    out: list[dict] = []
    tag = random.Random().randrange(1 << 30)
    for i, rate in enumerate(rates):
        index = 1000 + i
        topic = f"{RU_TOPIC}.{tag}.{index}"
        seed = random.Random(index).randrange(1 << 63)
        proc = subprocess.Popen(PY + [RU_SOURCE_CODE, SRC_IP, str(count), str(seed), str(rate), str(RU_SIZE)],
                                cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        try:
            sport = int(proc.stdout.readline())
            transport = L.LbtruTransport(SRC_IP, sport)
            tir = L.encode(L.Packet(0, 1, tirs=[L.TIR(topic, transport, 60, index, [
                L.OtidOption(0x8000, synthesize_otid(transport, index))])]))
            adv = Advertiser(topic, dep.lbmrd1, sport, index, packet=tir)
            try:
                proxy = resolve(topic, dep.lbmrd2)
                row: dict = {"rate": rate}
                for path, (ip, port) in (("direct", (SRC_IP, sport)), ("routed", proxy)):
                    before = udp_rcvbuf_errors()
                    r = trio.run(RuDataReceiver(ip, port, seed=seed, expect_count=count, bind_ip=RCV_IP,
                                                idle_timeout=2.0, timeout=IO_TIMEOUT_S + count / rate).run)
                    if r.corrupt or r.error:
                        raise RuntimeError(f"LBT-RU {path}: {r.corrupt} corrupt datagrams, error {r.error}")
                    row[path] = r
                    row[path + " drops"] = udp_rcvbuf_errors() - before
                out.append(row)
            finally:
                adv.close()
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()
    return out


def print_lbtru(rows: list[dict], count: int) -> None:
    for row in rows:
        print(f"  source paced at {row['rate']:,.0f} datagrams/s of {RU_SIZE} bytes, {count:,} datagrams:")
        got = {}
        for path in ("direct", "routed"):
            r = row[path]
            got[path] = r
            print(f"    {path:7s} received {r.received:9,d}  lost {count - r.received:7,d} "
                  f"({100 * (count - r.received) / count:5.2f}%)  {r.datagrams_per_s:10,.0f} datagrams/s "
                  f"{r.bytes_per_s / 1e6:7.1f} MB/s  (machine: {row[path + ' drops']:,} datagrams dropped "
                  "at full socket buffers)")
        d, rt = got["direct"], got["routed"]
        if d.received and d.datagrams_per_s:
            print(f"    ratio routed/direct: datagrams received {rt.received / d.received:.3f}x, "
                  f"rate {rt.datagrams_per_s / d.datagrams_per_s:.3f}x")


AD_MIN, AD_MAX, Q_MIN, Q_MAX = 0.010, 0.500, 0.020, 0.200  # UM's initial TR timing


def converge_once(dep, topic: str, index: int, order: str, src_port: int) -> float | None:
    """Seconds from the second application's first TR datagram to the first proxy TIR."""
    src, rcv = udp(SRC_IP), udp(RCV_IP)
    try:
        tir, tqr = tir_packet(topic, SRC_IP, src_port, index), tqr_packet(topic)
        t0 = time.perf_counter()
        first, second = ("rcv", "src") if order == "receiver first" else ("src", "rcv")
        nxt = {first: t0, second: t0 + GAP_S}
        gap = {"src": AD_MIN, "rcv": Q_MIN}
        cap = {"src": AD_MAX, "rcv": Q_MAX}
        sent_at: dict[str, float] = {}
        deadline = t0 + GAP_S + CONVERGE_TIMEOUT_S
        while True:
            now = time.perf_counter()
            if now > deadline:
                return None
            for who in ("src", "rcv"):
                if now >= nxt[who]:
                    if who == "src":
                        src.sendto(tir, dep.lbmrd1)
                    else:
                        rcv.sendto(tqr, dep.lbmrd2)
                    sent_at.setdefault(who, now)
                    nxt[who] = now + gap[who]
                    gap[who] = min(gap[who] * 2, cap[who])
            wait = max(0.0, min(min(nxt.values()), deadline) - time.perf_counter())
            ready, _, _ = select.select([src, rcv], [], [], wait)
            for s in ready:
                data = s.recv(65535)
                got = time.perf_counter()
                pkt = decode(data)
                if pkt is None:
                    continue
                if s is rcv:
                    if second in sent_at and any(is_proxy_tir(t, topic) for t in pkt.tirs):
                        return got - sent_at[second]
                elif "src" in sent_at and any(q.topic == topic for q in pkt.tqrs):
                    src.sendto(tir, dep.lbmrd1)  # UM sources answer queries at once
    finally:
        src.close()
        rcv.close()


def convergence(dep, topics: int, src_port: int) -> dict[str, list[float | None]]:
    out: dict[str, list[float | None]] = {"receiver first": [], "source first": []}
    tag = random.Random().randrange(1 << 30)
    index = 100
    for i in range(topics):
        for order in out:
            index += 1
            topic = f"bench.router.conv.{tag}.{order.split()[0]}.{i}"
            out[order].append(converge_once(dep, topic, index, order, src_port))
    return out
