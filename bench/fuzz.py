"""Fuzz lbmr_proto.decode / lbmr_proto.fast.scan with random and mutated datagrams.

    python bench/fuzz.py [--inputs 1000000] [--seed 1]

Seeds: every LBMR payload of the sample UM capture plus packets of every kind
drawn from the test strategies. Each input is a seed mutated 1-8 times (byte
set, bit flip, truncate, insert, delete, splice with another seed, header
count bump) or plain random bytes. Checks, for every input: only
LBMRDecodeError escapes decode() and scan(); both accept or both reject; an
accepted input re-encodes to the same bytes. Exits 1 on the first violation,
printing the input in hex. Bounded by --inputs.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import lbmr_proto as L  # noqa: E402
from lbmr_proto.capture import read_udp  # noqa: E402
from lbmr_proto.fast import scan  # noqa: E402

CAPTURE = ROOT.parent / "shared" / "captures" / "um614-multicast-tr.pcap"


def seeds(n_generated: int) -> list[bytes]:
    out: list[bytes] = []
    if CAPTURE.exists():
        out += [d.payload for d in read_udp(CAPTURE, ports={12965}) if d.dport == 12965]
    from hypothesis.errors import NonInteractiveExampleWarning

    from tests import strategies as S

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonInteractiveExampleWarning)
        for _ in range(n_generated):
            out.append(L.encode(S.packet.example()))
    return out


def mutate(rng: random.Random, b: bytes, pool: list[bytes]) -> bytes:
    a = bytearray(b)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(7)
        n = len(a)
        if op == 0 and n:
            a[rng.randrange(n)] = rng.randrange(256)
        elif op == 1 and n:
            a[rng.randrange(n)] ^= 1 << rng.randrange(8)
        elif op == 2 and n:
            del a[rng.randrange(n):]
        elif op == 3:
            i = rng.randint(0, n)
            a[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == 4 and n > 1:
            i = rng.randrange(n)
            del a[i:i + rng.randint(1, 8)]
        elif op == 5:
            other = rng.choice(pool)
            i = rng.randint(0, n)
            j = rng.randint(0, len(other))
            a[i:] = other[j:]
        elif n >= 4:
            a[rng.choice((1, 3))] = (a[1] + rng.choice((1, 255))) & 0xFF
    return bytes(a)


def check(b: bytes) -> str:
    try:
        pkt = L.decode(b)
        ok = True
    except L.LBMRDecodeError:
        ok = False
    try:
        scan(b)
        sok = True
    except L.LBMRDecodeError:
        sok = False
    if ok != sok:
        return f"decode {'accepts' if ok else 'rejects'} but scan {'accepts' if sok else 'rejects'}"
    if ok and L.encode(pkt) != b:
        return "accepted input does not re-encode to the same bytes"
    return ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--generated", type=int, default=400, help="packets drawn from the strategies as seeds")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    pool = seeds(args.generated)
    t0 = time.perf_counter()
    accepted = 0
    for i in range(args.inputs):
        if i % 10 == 9:
            b = rng.randbytes(rng.randint(0, 80))
        else:
            b = mutate(rng, rng.choice(pool), pool)
        try:
            problem = check(b)
        except Exception as e:  # noqa: BLE001 - the point of the fuzzer
            problem = f"{type(e).__name__} escaped: {e}"
        if problem:
            print(f"FAIL after {i} inputs: {problem}\n  input: {b.hex()}")
            return 1
        accepted += 0 if check_rejected(b) else 1
    dt = time.perf_counter() - t0
    print(f"fuzz: {args.inputs} inputs ({len(pool)} seeds), {accepted} still valid after mutation, "
          f"no exception but LBMRDecodeError, scan == decode everywhere; {dt:.1f} s "
          f"({args.inputs / dt:,.0f} inputs/s)")
    return 0


def check_rejected(b: bytes) -> bool:
    try:
        scan(b)
        return False
    except L.LBMRDecodeError:
        return True


if __name__ == "__main__":
    sys.exit(main())
