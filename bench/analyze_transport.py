"""lbmr-analyze's transport pass against its decoding pass, per byte range, in this process.

    python bench/analyze_transport.py [--capture PATH] [--lbmr-mb 32] [--repeat 3]

Two captures, each cut into byte ranges as the job cuts them (``--split-size``,
default 8 MiB), measured in this run, best of ``--repeat``:

* the real UM capture (LBT-RM sessions with NAKs, retransmissions, NCFs: what
  the transport pass is for), or ``--capture``;
* a made-up LBMR-only capture of about ``--lbmr-mb`` MiB (TIRs and TQRs from
  many contexts, no transport traffic: what it costs where it finds nothing).

For each: the decoding tasks (``lbmr_analyze.rows.write_split`` with its partial
aggregates: what the job does without the transport pass; the baseline) and the
transport tasks (``lbmr_analyze.transport.transport_task``: ``read_packets``
over the same ranges, ``TransportDecoder``, the timeline), printed with their
ratio to the baseline.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import lbmr_proto as L  # noqa: E402
from bench.timing import best_of  # noqa: E402
from lbmr_analyze import partials as P  # noqa: E402
from lbmr_analyze import splits as S  # noqa: E402
from lbmr_analyze.rows import write_split  # noqa: E402
from lbmr_analyze.transport import tr_rows_of, transport_task  # noqa: E402
from lbmr_proto.capture import LINKTYPE_RAW, PcapWriter  # noqa: E402
from tests.helpers import real_capture  # noqa: E402
from tests.transport_captures import udp_packet  # noqa: E402

PORTS = frozenset({12965, 15380})


def lbmr_capture(path: Path, mb: int) -> Path:
    """TIRs and TQRs from 200 contexts, about ``mb`` MiB."""
    pkts = []
    for c in range(200):
        ip = f"10.{c // 250}.{c % 250}.1"
        tirs = [L.TIR(f"md.{c}.{k}", L.LbtrmTransport(ip, "239.1.1.1", c, 14400, 14390), 0, k) for k in range(8)]
        pkts.append(((ip, 14402), L.encode(L.Packet(0, tirs=tirs))))
        pkts.append(((ip, 14402), L.encode(L.Packet(0, tqrs=[L.TQR(f"md.{(c + 1) % 200}.{k}") for k in range(8)]))))
    frames = [udp_packet(src, ("239.101.3.1", 12965), p) for src, p in pkts]
    size = sum(len(f) + 16 for f in frames)
    with PcapWriter(path, linktype=LINKTYPE_RAW) as w:
        t = 1_700_000_000.0
        for _ in range(max(1, (mb << 20) // size)):
            for f in frames:
                w.write_frame(t, f)
                t += 1e-4
    return path


def measure(cap: Path, split_size: int, repeat: int, tmp: Path) -> None:
    splits = S.plan([str(cap)], split_size)
    rows = [(s.split_id, s.path, s.start, s.end, s.size, b"") for s in splits]
    merged: dict = {}

    def decode():
        shutil.rmtree(tmp / "records", ignore_errors=True)
        parts: list = []
        for s in splits:
            write_split(s, PORTS, b"", str(tmp / "records"), partials=parts)
        merged.clear()
        merged.update(P.merge(parts))

    def transport():
        tr, _ = tr_rows_of(merged)
        for r in rows:
            transport_task(r, PORTS, tr)

    base = best_of(decode, repeat)
    tx = best_of(transport, repeat)
    mb = cap.stat().st_size / (1 << 20)
    print(f"{cap.name}: {mb:.1f} MiB in {len(splits)} range(s)")
    print(f"  decoding tasks (baseline)  {base:8.3f} s  1.00x")
    print(f"  transport tasks            {tx:8.3f} s  {tx / base:.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capture", type=Path, default=None)
    ap.add_argument("--lbmr-mb", type=int, default=32)
    ap.add_argument("--split-size", type=int, default=8 << 20)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-analyze-transport-"))
    try:
        measure(a.capture or real_capture(), a.split_size, a.repeat, tmp)
        measure(lbmr_capture(tmp / "lbmr-only.pcap", a.lbmr_mb), a.split_size, a.repeat, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
