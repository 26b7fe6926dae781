"""Decode-rate benchmark: lbmr_proto and lbmr-inspect versus tshark.

    python bench/decode.py [--packets 1000000] [--tshark-packets 20000]

Generates a capture of realistic UM topic-resolution traffic
(bench/traffic.py), then measures on this machine, in this run:

* pcap reading (lbmr_proto.capture.read_udp), packets/s;
* lbmr_proto.decode over every payload (full typed objects), packets/s,
  and the same without its whole-datagram memo (as if every datagram were
  new);
* lbmr_proto.fast.scan (the daemons' validate-and-locate path), packets/s;
* read + decode end to end, packets/s;
* ``lbmr-inspect --json`` on the whole file (a subprocess), packets/s;
* ``tshark -T json`` (Wireshark's LBMR dissector, full decode) on the first
  --tshark-packets datagrams of the same capture (it manages a few thousand
  per second, so the whole million would take minutes), packets/s;

and prints each rate and its ratio to tshark's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.timing import best_of  # noqa: E402
from bench.traffic import datagrams, write_capture  # noqa: E402
from lbmr_proto import decode  # noqa: E402
from lbmr_proto.capture import PcapWriter, read_udp  # noqa: E402
from lbmr_proto.fast import scan  # noqa: E402
from lbmr_proto.packet import _decode  # noqa: E402  (decode minus the whole-datagram memo)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packets", type=int, default=1_000_000)
    ap.add_argument("--tshark-packets", type=int, default=20_000)
    args = ap.parse_args()
    tshark = shutil.which("tshark")
    inspect = Path(sys.executable).with_name("lbmr-inspect")
    with tempfile.TemporaryDirectory() as tmp:
        cap = Path(tmp) / "tr.pcap"
        t0 = time.perf_counter()
        write_capture(cap, args.packets)
        print(f"generated {args.packets:,} datagrams ({cap.stat().st_size / 1e6:.0f} MB) "
              f"in {time.perf_counter() - t0:.1f} s")
        small = Path(tmp) / "tr-head.pcap"
        with PcapWriter(small) as w:
            for d in datagrams(args.tshark_packets):
                w.write_udp(*d)
        n = args.packets
        payloads = [d.payload for d in read_udp(cap)]
        assert len(payloads) == n
        rows = []
        t = best_of(lambda: sum(1 for _ in read_udp(cap)))
        rows.append(("pcap read (read_udp)", n / t))
        # streaming, as a consumer does: each packet is dropped after use
        t = best_of(lambda: deque(map(decode, payloads), maxlen=0))
        rows.append(("lbmr_proto.decode", n / t))
        t = best_of(lambda: deque(map(_decode, payloads), maxlen=0))
        rows.append(("  ... without the memo", n / t))
        t = best_of(lambda: deque(map(scan, payloads), maxlen=0))
        rows.append(("lbmr_proto.fast.scan", n / t))
        t = best_of(lambda: deque((decode(d.payload) for d in read_udp(cap)), maxlen=0), runs=1)
        rows.append(("read + decode", n / t))
        t0 = time.perf_counter()
        subprocess.run([str(inspect), "--json", str(cap)], stdout=subprocess.DEVNULL, check=True)
        rows.append(("lbmr-inspect --json (process)", n / (time.perf_counter() - t0)))
        base = None
        if tshark:
            t0 = time.perf_counter()
            subprocess.run([tshark, "-r", str(small), "-d", "udp.port==15380,lbmr", "-T", "json"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                           env=dict(os.environ, LC_ALL="C"))
            base = args.tshark_packets / (time.perf_counter() - t0)
            rows.append(("tshark -T json (baseline)", base))
    print(f"\n{'what':<32} {'packets/s':>12} {'x tshark':>9}")
    for name, rate in rows:
        ratio = f"{rate / base:9.1f}" if base else "      n/a"
        print(f"{name:<32} {rate:>12,.0f} {ratio}")
    if not tshark:
        print("tshark not found: no baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
