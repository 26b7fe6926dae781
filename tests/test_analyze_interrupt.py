"""Ctrl-C during a real lbmr-analyze run (embedded Spark): SIGINT to the whole
process group, as a terminal sends it, while the executors decode.  The run must
end with one line and exit status 130, leave the previous output as it was (no
staging folder), print no traceback, and leave no process behind (the JVM and
its Python workers; a JVM that was to write a class archive at exit is ended
without one).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyspark  # noqa: F401  - a test requirement: a missing pyspark fails, never skips

ROOT = Path(__file__).resolve().parents[1]
LBMR_ANALYZE = Path(sys.executable).parent / "lbmr-analyze"
#: datagrams: about 35 MB, several seconds of decoding even on an idle machine
DATAGRAMS = 200_000


def _group_gone(pgid: int, seconds: float) -> bool:
    """Whether every process of group ``pgid`` has exited within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_ctrl_c_prints_one_line_and_exits_130(tmp_path):
    sys.path.insert(0, str(ROOT))
    from bench.traffic import write_capture
    cap = write_capture(tmp_path / "big.pcap", DATAGRAMS)
    out = tmp_path / "out"
    out.mkdir()
    (out / "previous.txt").write_text("the previous result")
    cache = tmp_path / "cache"              # empty: the run's JVM is to write a class archive at exit
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    env.pop("LBMR_ANALYZE_CLASS_CACHE", None)
    p = subprocess.Popen([LBMR_ANALYZE, str(cap), "--out", str(out), "--split-size", "4M"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    gone = False
    try:
        before = []
        for line in p.stderr:                           # bounded: the process ends, or decoding starts
            before.append(line)
            if "decoding" in line:
                os.killpg(p.pid, signal.SIGINT)
                break
        stdout, rest = p.communicate(timeout=120)
    finally:
        gone = _group_gone(p.pid, 60)
        if not gone:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)
    err = "".join(before) + rest
    assert any("decoding" in ln for ln in before), err
    assert p.returncode == 130, (p.returncode, err[-3000:])
    assert rest.splitlines() == ["lbmr-analyze: interrupted; the previous output, if any, is unchanged"], err
    assert "Traceback" not in err and "py4j" not in err.lower()
    assert stdout == ""
    assert sorted(x.name for x in tmp_path.iterdir()) == ["big.pcap", "cache", "out"]     # no staging folder
    assert list((cache / "lbmr-analyze").iterdir()) == []          # nor a class archive, whole or partial
    assert [x.name for x in out.iterdir()] == ["previous.txt"]
    assert gone, "a process of the run outlived it by a minute"
