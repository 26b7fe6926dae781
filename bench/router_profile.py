"""Section 4 of bench/router.py: the routers profiled (py-spy or cProfile)
while routed transfers run back to back, and the reports: wall time in
epoll, socket syscalls and Python, and where it goes.
"""

from __future__ import annotations

import collections
import pstats
import signal
import subprocess
import threading
import time
from pathlib import Path

from bench.router_deploy import (
    IO_TIMEOUT_S,
    TPUT_TOPIC,
    Advertiser,
    DataSource,
    Processes,
    cpu_snapshot,
    receive,
    resolve,
)

PROFILE_S = 3  # seconds (whole) of routed transfers sampled by py-spy




def profile_transfers(dep: Processes, source: DataSource, begin, end) -> None:
    """Routed transfers back to back from before ``begin()`` (which starts the profilers)
    until after ``end()`` (which returns once they stopped), so that every profiled moment
    falls inside a transfer."""
    adv = Advertiser(TPUT_TOPIC, dep.lbmrd1, source.port)
    stop = threading.Event()
    moved: list[float] = []
    errors: list[BaseException] = []

    def transfers(proxy) -> None:
        try:
            while not stop.is_set():
                moved.append(receive(proxy, source.total))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    try:
        proxy = resolve(TPUT_TOPIC, dep.lbmrd2)
        loop = threading.Thread(target=transfers, args=(proxy,), daemon=True)
        loop.start()
        time.sleep(0.3)
        before, t0 = cpu_snapshot(dep), time.perf_counter()
        begin()
        end()
        dt, after = time.perf_counter() - t0, cpu_snapshot(dep)
        stop.set()
        loop.join(IO_TIMEOUT_S)
        if errors:
            raise errors[0]
        rate = len(moved) * source.total / 1e6 / sum(moved) if moved else 0.0
        print(f"    {len(moved)} transfers back to back, {rate:.1f} MB/s while profiled; CPU "
              + ", ".join(f"router {r.upper()} {100 * (after[r] - before[r]) / dt:.0f}%" for r in ("a", "b"))
              + " of one core")
    finally:
        stop.set()
        adv.close()


def pyspy_profile(dep: Processes, source: DataSource, pyspy: str, tmp: Path) -> dict[str, Path]:
    """Both routers sampled by py-spy (--idle, --nonblocking, raw collapsed stacks) for
    PROFILE_S seconds of routed transfers."""
    spies: dict[str, subprocess.Popen] = {}
    outs = {r: tmp / f"pyspy-{r}.txt" for r in ("a", "b")}

    def begin() -> None:
        for r in ("a", "b"):
            spies[r] = subprocess.Popen([pyspy, "record", "--pid", str(dep.pid(r)), "--rate", "250",
                                         "--duration", str(PROFILE_S), "--idle", "--nonblocking",
                                         "--format", "raw", "--output", str(outs[r])],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE)

    def end() -> None:
        for r, p in spies.items():
            if p.wait(timeout=PROFILE_S + 20) != 0:
                raise RuntimeError(f"py-spy on router {r}: {p.stderr.read().decode()[-500:]}")

    try:
        profile_transfers(dep, source, begin, end)
    finally:
        for p in spies.values():
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stderr.close()
    return outs


def cprofile_profile(dep: Processes, source: DataSource) -> None:
    """cProfile on in both routers (started with cprofile=True) for PROFILE_S seconds of
    routed transfers; the stats are written when the routers stop."""
    def toggle() -> None:
        for r in ("a", "b"):
            dep.procs[r].send_signal(signal.SIGUSR2)

    profile_transfers(dep, source, toggle, lambda: (time.sleep(PROFILE_S), toggle()))


def _short(frame: str) -> str:
    """'func (path/file.py:123)' -> 'func (dir/file.py)'."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({'/'.join(Path(path).parts[-2:])})" if path else name


def report_pyspy(path: Path, top: int) -> None:
    """Wall-time breakdown: waiting in epoll, in socket syscalls (trio's
    _nonblocking_helper is the Python frame around send/recv, router/link/splice.py's splice
    the one around os.splice), Python."""
    selfc: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = idle = sys_ = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_short(f) for f in stack.split(";") if " (" in f]
        if not frames:
            continue
        total += n
        leaf = frames[-1]
        if leaf.startswith(("EpollIOManager.get_events", "EpollIOManager._epoll_wait")):
            idle += n
        elif leaf.startswith(("_SocketType._nonblocking_helper", "splice (router/link/splice.py")):
            sys_ += n  # (router/link/splice.py's splice is the os.splice system call)
        selfc[leaf] += n
        for f in set(frames):
            incl[f] += n
    if not total:
        print("      (no samples)")
        return
    py = total - idle - sys_
    print(f"      {total} samples (wall time): waiting in epoll {100 * idle / total:.0f}%, socket "
          f"send/recv/splice syscalls {100 * sys_ / total:.0f}%, Python (framing, trio) {100 * py / total:.0f}%")
    print(f"      self time, % of wall time (top {top}):")
    for f, n in selfc.most_common(top):
        print(f"        {100 * n / total:5.1f}%  {f}")
    print("      inclusive time of router/ functions, % of wall time:")
    shown = [(f, n) for f, n in incl.most_common() if "(router/" in f and not f.startswith("main (")]
    for f, n in shown[:top]:
        print(f"        {100 * n / total:5.1f}%  {f}")


def report_cprofile(path: Path, top: int) -> None:
    st = pstats.Stats(str(path))
    total = st.total_tt
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():
        where = "/".join(Path(file).parts[-2:]) if file != "~" else "builtin"
        rows.append((tt, ct, nc, f"{func} ({where}:{line})"))
    print(f"      {total:.2f} s profiled (wall time; waiting in epoll is select.epoll.poll)")
    print(f"      self time (top {top}):")
    for tt, _ct, nc, name in sorted(rows, reverse=True)[:top]:
        print(f"        {100 * tt / total:5.1f}%  {tt:6.2f} s  {nc:8d} calls  {name}")
    print("      cumulative time of router/ functions:")
    for _tt, ct, nc, name in sorted(((r[1], r[1], r[2], r[3]) for r in rows if "router/" in r[3]),
                                    reverse=True)[:top]:
        print(f"        {100 * ct / total:5.1f}%  {ct:6.2f} s  {nc:8d} calls  {name}")
