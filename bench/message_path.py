"""The cost of the message path on the fan-out's session (sans-IO, in
process): :class:`router.core.fanout.SessionFanout` with ten sinks takes a
live session's bytes as the upstream reads them (64 KiB reads into its
receive buffer) and every sink takes all it is offered, without, and then
with, a message path (:mod:`router.core.message_path`) in the same run.

Cases: no path (the baseline), a path without rules (every relayed session
today), a path with a rule (the messages have no extension header: the
common case the path must keep cheap); then a session where one message
in ``--request-every`` is a request, without a path and with a rule that
rewrites every request. Sessions: messages
of one size (``--sizes``) and of mixed sizes. Printed: seconds of CPU per GB
through the fan-out (best of ``--runs``) and each case's ratio to the
baseline of the same session.

    python bench/message_path.py [--sizes 8192,1000,200] [--runs 9] [--mbytes 4]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lbmr_proto import lbmc  # noqa: E402
from router.core.fanout import SessionFanout  # noqa: E402
from router.core.message_path import MessagePath, SetRequestAddress  # noqa: E402

READ = 65536  # bytes per upstream read
SINKS = 10
MIXED = (180, 240, 1000, 60, 400)  # payload bytes of the mixed session's messages, in turn
REQUEST = lbmc.RequestHeader(transport=0, qidx=1, port=14391, ipaddr="10.29.4.121")


def session(size: int | None, mbytes: float, request_every: int) -> bytes:
    """About ``mbytes`` MB of LBMC data messages of ``size`` bytes (None:
    mixed), one in ``request_every`` a request (0: none)."""
    msgs = []
    total, k = 0, 0
    while total < mbytes * 1e6:
        payload = MIXED[k % len(MIXED)] if size is None else size - lbmc.DATA_HEADER.size
        if request_every and k % request_every == 0:
            m = lbmc.data_message(1, k, bytes(max(0, payload - REQUEST.SIZE)), REQUEST)
        else:
            m = lbmc.data_message(1, k, bytes(payload))
        msgs.append(m)
        total += len(m)
        k += 1
    return b"".join(msgs)


def measure(stream: bytes, path: MessagePath | None) -> float:
    """CPU seconds per GB of ``stream`` through a fan-out of SINKS sinks."""
    fan = SessionFanout(max_queue=1 << 30, path=path)
    sinks = [fan.add(k, 0.0) for k in range(SINKS)]
    t = time.process_time()
    for pos in range(0, len(stream), READ):
        piece = stream[pos:pos + READ]
        buf = fan.receive_buffer(len(piece))
        buf[:len(piece)] = piece
        fan.received(len(piece), 0.0)
        for q in sinks:
            q.wrote(q.held, 0.0)
    return (time.process_time() - t) / len(stream) * 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="8192,1000,200", help="message sizes in bytes, comma-separated")
    ap.add_argument("--runs", type=int, default=9, help="measurements per case; the best counts")
    ap.add_argument("--mbytes", type=float, default=4.0, help="MB (10^6 bytes) of session per measurement")
    ap.add_argument("--request-every", type=int, default=100, help="one request in this many messages")
    args = ap.parse_args(argv)
    rule = (SetRequestAddress("192.168.7.1", 15000),)
    sessions = [(f"{s} B", int(s)) for s in args.sizes.split(",")] + [("mixed", None)]
    print(f"message path on the fan-out's session: {SINKS} sinks, {READ} B reads, best of {args.runs}, "
          "CPU s/GB (ratio to no path)")
    for name, size in sessions:
        plain = session(size, args.mbytes, 0)
        requests = session(size, args.mbytes, args.request_every)
        cases = [("no path", plain, lambda: None), ("path, no rules", plain, MessagePath),
                 ("path, a rule", plain, lambda: MessagePath(rule)),
                 (f"1 request in {args.request_every}, no path", requests, lambda: None),
                 (f"1 request in {args.request_every}, a rule", requests, lambda: MessagePath(rule))]
        best = {label: float("inf") for label, _, _ in cases}
        for _ in range(args.runs):  # interleaved: the machine's noise spreads over every case
            for label, stream, make in cases:
                best[label] = min(best[label], measure(stream, make()))
        base = best["no path"]
        print(f"  {name:>7}: " + "; ".join(f"{label} {v:.3f} ({v / base:.2f})" for label, v in best.items()))
        if args.request_every:
            with_requests = best[f"1 request in {args.request_every}, a rule"]
            print(f"  {'':>7}  requests rewritten: {with_requests / best[f'1 request in {args.request_every}, no path']:.2f}"
                  " of the same session without a path")
    return 0


if __name__ == "__main__":
    sys.exit(main())
