"""Transport-session decoding cost on the real capture, against plain LBMR decoding.

    python bench/transport_decode.py [--capture PATH] [--repeat 5]

On the real UM capture (12,058 frames: 179 LBMR, the rest two LBT-RM sessions
with NAKs, retransmissions, NCFs and ICMP errors), measured in this run, best
of ``--repeat``:

* baseline: what lbmr-inspect does without --transport: ``read_udp`` on the
  LBMR ports and ``lbmr_proto.decode`` of each LBMR datagram;
* ``read_packets`` alone (every UDP datagram, TCP segment and ICMP error);
* ``read_packets`` + ``TransportDecoder.feed`` (what --transport and --sessions
  decode): LBMR learned, every transport datagram and LBMC message decoded into
  records, per-session state kept;
* the same plus the three tables;
* ``lbmr-inspect --sessions`` and ``lbmr-inspect --transport --json`` as
  subprocesses, against plain ``lbmr-inspect --json``;

and prints each time with its ratio to the baseline (and frames per second).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.timing import best_of  # noqa: E402
from lbmr_proto import LBMRDecodeError, decode  # noqa: E402
from lbmr_proto.capture import read_packets, read_udp  # noqa: E402
from lbmr_proto.transport_sessions import (  # noqa: E402
    TransportDecoder,
    receiver_rows,
    session_rows,
    topic_rows,
)
from tests.helpers import real_capture  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capture", type=Path)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    try:
        cap = args.capture or real_capture()
    except FileNotFoundError:
        raise SystemExit("the real capture (shared/captures/um614-multicast-tr.pcap) was not found; "
                         "use --capture") from None
    frames = sum(1 for _ in read_packets(cap))

    def lbmr_only():
        for d in read_udp(cap, ports=(12965, 15380)):
            try:
                decode(d.payload)
            except LBMRDecodeError:
                pass

    def read_all():
        for _ in read_packets(cap):
            pass

    def transport():
        dec = TransportDecoder()
        for item in read_packets(cap):
            dec.feed(item)
        return dec

    def tables():
        st = transport().state
        session_rows(st), receiver_rows(st), topic_rows(st)

    inspect = [sys.executable, "-m", "lbmr_tools.inspect"]

    def cli(*opts):
        return lambda: subprocess.run([*inspect, *opts, str(cap)], check=True, stdout=subprocess.DEVNULL, cwd=ROOT)

    rows = [("baseline: read_udp + LBMR decode", best_of(lbmr_only, args.repeat)),
            ("read_packets (UDP, TCP, ICMP)", best_of(read_all, args.repeat)),
            ("read_packets + TransportDecoder", best_of(transport, args.repeat)),
            ("  + session/receiver/topic tables", best_of(tables, args.repeat))]
    base = rows[0][1]
    cli_runs = max(1, args.repeat // 2)
    cli_rows = [("lbmr-inspect --json (LBMR only)", best_of(cli("--json"), cli_runs)),
                ("lbmr-inspect --sessions", best_of(cli("--sessions"), cli_runs)),
                ("lbmr-inspect --transport --json", best_of(cli("--transport", "--json"), cli_runs))]
    print(f"{cap.name}: {frames} IP packets read (UDP, TCP, ICMP); best of {args.repeat}")
    for name, t in rows:
        print(f"  {name:<40} {t * 1000:9.1f} ms  {t / base:7.1f}x baseline  {frames / t:12,.0f} packets/s")
    cli_base = cli_rows[0][1]
    for name, t in cli_rows:
        print(f"  {name:<40} {t * 1000:9.1f} ms  {t / cli_base:7.1f}x lbmr-inspect --json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
