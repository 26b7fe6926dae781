"""lbmr-analyze's fixed cost: the class data sharing archive of Spark's classes
(lbmr_analyze.classcache) written by the first run and mapped by the next, a
truncated archive never given to a JVM (which would crash on it), the driver
JVM's options, the summary's time line.  No timings are asserted (those are in
bench/pipeline.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pyspark  # noqa: F401  - a test requirement: a missing pyspark fails, never skips

from lbmr_analyze import classcache
from lbmr_analyze.javacheck import find_java
from lbmr_analyze.job import DRIVER_JIT, driver_java_options

ROOT = Path(__file__).resolve().parents[1]
REAL_CAPTURE = ROOT.parent / "shared" / "captures" / "um614-multicast-tr.pcap"
LBMR_ANALYZE = Path(sys.executable).parent / "lbmr-analyze"
ARCHIVE = re.compile(r"spark-[0-9a-f]{16}-([0-9]+)\.jsa")


def _run(tmp_path: Path, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    env.pop("LBMR_ANALYZE_CLASS_CACHE", None)
    return subprocess.run([LBMR_ANALYZE, str(REAL_CAPTURE), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=600, env=env)


def test_first_run_writes_the_archive_and_the_next_maps_it(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = _run(tmp_path, cache)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "saved Spark's classes for faster starts (once)" in first.stderr
    assert re.search(r"^  time: [0-9.]+ s, of which starting Spark [0-9.]+ s \(a fixed cost\)$", first.stdout,
                     re.M), first.stdout
    files = list((cache / "lbmr-analyze").iterdir())
    assert len(files) == 1, files                                   # no temporary file left
    m = ARCHIVE.fullmatch(files[0].name)
    assert m and int(m.group(1)) == files[0].stat().st_size > 1_000_000

    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv("LBMR_ANALYZE_CLASS_CACHE", raising=False)
    java = find_java()[0]
    assert classcache.java_options(java) == [f"-XX:SharedArchiveFile={files[0]}", *classcache.QUIET]
    assert not classcache.dumping()
    second = _run(tmp_path, cache)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "saved Spark's classes" not in second.stderr
    assert "LBMR datagrams" in second.stdout and second.stdout.count("\n") == first.stdout.count("\n")
    assert list((cache / "lbmr-analyze").iterdir()) == files

    # a truncated archive: never mapped (its size is not the one in its name) ...
    data = files[0].read_bytes()
    files[0].write_bytes(data[: len(data) // 2])
    opts = classcache.java_options(java)
    assert opts[0].startswith("-XX:ArchiveClassesAtExit=") and classcache.dumping()
    # ... nor installed by keep(), whose own JVM crashes on it
    tmp = Path(opts[0].split("=", 1)[1])
    tmp.write_bytes(data[: len(data) // 2])
    ended = subprocess.Popen(["true"], stdin=subprocess.PIPE)
    crash_reports = set(Path.cwd().glob("hs_err_pid*.log"))
    assert classcache.keep(ended, java) is None
    assert not tmp.exists() and not classcache.dumping()
    assert set(Path.cwd().glob("hs_err_pid*.log")) == crash_reports      # the crashing check leaves none
    # ... while the whole one is (the same checks)
    tmp.write_bytes(data)
    classcache.java_options(java)
    ended = subprocess.Popen(["true"], stdin=subprocess.PIPE)
    kept = classcache.keep(ended, java)
    assert kept is not None and kept.name == f"{tmp.name.split('.')[0]}-{len(data)}.jsa" and not tmp.exists()


def test_cache_off_and_driver_options(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("LBMR_ANALYZE_CLASS_CACHE", "off")
    assert classcache.java_options(find_java()[0]) == []
    assert not classcache.dumping() and not (tmp_path / "lbmr-analyze").exists()
    opts = driver_java_options(["-Dx=1"]).split()
    assert opts[0].startswith("-Dlog4j2.configurationFile=file:") and opts[1] == DRIVER_JIT and opts[-1] == "-Dx=1"
    monkeypatch.delenv("LBMR_ANALYZE_CLASS_CACHE")
    with_cache = driver_java_options(class_cache=True).split()
    assert with_cache[2].startswith("-XX:ArchiveClassesAtExit=" + str(tmp_path / "lbmr-analyze"))
    classcache.keep(subprocess.Popen(["true"], stdin=subprocess.PIPE), find_java()[0])   # nothing written
    assert list((tmp_path / "lbmr-analyze").iterdir()) == []
