"""A class data sharing (CDS) archive of the Spark classes the driver JVM loads at
start-up, so that lbmr-analyze's next JVMs map them instead of loading, verifying
and linking them again (Spark's start about 40 % faster on Java 17).

The first run that finds no archive asks its JVM to write one when it exits
(``-XX:ArchiveClassesAtExit``, into a temporary file); :func:`keep` ends that JVM
after Spark has stopped, waits for it, checks the file with a JVM of its own and
renames it into place.  Later runs start with ``-XX:SharedArchiveFile``.  The
archive's name holds a digest of what it depends on (the java binary, pyspark's
version and jars) and its own size in bytes: a changed installation gets a new
archive, and a truncated one (which would crash the JVM) is never used.

Archives live in ``$XDG_CACHE_HOME/lbmr-analyze`` (default ``~/.cache``), about
120 MB each; ``LBMR_ANALYZE_CLASS_CACHE=off`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path

#: The JVM's CDS notes (e.g. an archive of another build it will not use) off:
#: unified logging writes them to standard output.
QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")
#: Temporary archives older than this (seconds) are from a JVM that never finished.
STALE_S = 600

#: The temporary archive this process's driver JVM writes when it exits, if any.
_dumping: Path | None = None


def enabled(env=None) -> bool:
    env = os.environ if env is None else env
    return env.get("LBMR_ANALYZE_CLASS_CACHE", "on").lower() not in ("off", "0", "no", "false")


def cache_dir(env=None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lbmr-analyze"


def _key(java: str) -> str:
    """16 hex digits naming what an archive depends on."""
    import pyspark
    jars = Path(pyspark.__file__).parent / "jars"
    st = os.stat(os.path.realpath(java))
    parts = [os.path.realpath(java), str(st.st_size), str(st.st_mtime_ns), pyspark.__version__, str(jars),
             *sorted(p.name for p in jars.glob("*.jar"))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _usable(folder: Path, key: str) -> Path | None:
    """The archive for ``key`` whose size is the one in its name, if any."""
    for p in folder.glob(f"spark-{key}-*.jsa"):
        try:
            if p.stat().st_size == int(p.stem.rsplit("-", 1)[1]):
                return p
        except (OSError, ValueError):
            pass
    return None


def _clear_stale(folder: Path) -> None:
    now = time.time()
    for p in folder.glob("*.jsa.tmp"):
        try:
            stale = now - p.stat().st_mtime > STALE_S
        except OSError:
            continue
        if stale:
            _remove(p)


def java_options(java: str) -> list[str]:
    """JVM options for a driver JVM started with ``java``: map the archive, or
    write one at exit (then call :func:`keep` after stopping Spark)."""
    global _dumping
    if not enabled():
        return []
    folder = cache_dir()
    key = _key(java)
    found = _usable(folder, key)
    if found is not None:
        return [f"-XX:SharedArchiveFile={found}", *QUIET]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return []
    _clear_stale(folder)
    _dumping = folder / f"spark-{key}.{os.getpid()}.jsa.tmp"
    return [f"-XX:ArchiveClassesAtExit={_dumping}", *QUIET]


def dumping() -> bool:
    """Whether this process's driver JVM will write an archive when it exits."""
    return _dumping is not None


def _forget() -> Path | None:
    """The temporary archive this process's JVM writes, no longer expected."""
    global _dumping
    tmp, _dumping = _dumping, None
    return tmp


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def discard(jvm: subprocess.Popen) -> None:
    """End the driver JVM ``jvm`` at once (SIGKILL: it writes no archive, and no
    JVM is left writing one after an interrupted run) and remove the temporary
    file."""
    tmp = _forget()
    if tmp is None:
        return
    try:
        jvm.kill()
        jvm.wait(60)
    except (OSError, subprocess.TimeoutExpired):
        pass
    _remove(tmp)


def keep(jvm: subprocess.Popen, java: str, timeout: float = 300) -> Path | None:
    """End the driver JVM ``jvm`` (its standard input closed: Spark's gateway then
    exits) after Spark has stopped, wait for it to write its archive, check the
    archive with a JVM of its own, and put it in place; its path, or None (then
    the temporary file is removed)."""
    tmp = _forget()
    if tmp is None:
        return None
    try:
        if jvm.stdin is not None:
            jvm.stdin.close()
        ok = jvm.wait(timeout) == 0 and tmp.is_file()
        # a bad archive crashes this JVM: its crash report is not wanted anywhere
        ok = ok and subprocess.run([java, f"-XX:SharedArchiveFile={tmp}", *QUIET, f"-XX:ErrorFile={os.devnull}",
                                    "-version"], capture_output=True, timeout=120).returncode == 0
        if ok:
            final = tmp.with_name(tmp.name.split(".", 1)[0] + f"-{tmp.stat().st_size}.jsa")
            os.replace(tmp, final)
            return final
    except (OSError, subprocess.TimeoutExpired):
        pass
    _remove(tmp)
    return None
