"""Find a Java runtime Spark 4 can use (Java 17 or newer) before starting Spark.

Spark's own failure without Java is a long Py4J stack trace; this gives one
clear message instead.  The same rules as Spark's launcher: ``$JAVA_HOME/bin/java``
when ``JAVA_HOME`` is set, else ``java`` on ``PATH``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

#: Oldest Java major version Spark 4 runs on.
MIN_JAVA = 17

INSTALL_HINT = (
    "Spark 4 needs a Java {min}+ runtime.  Install one, e.g.\n"
    "  Debian/Ubuntu:  sudo apt-get install openjdk-17-jre-headless\n"
    "  Fedora/RHEL:    sudo dnf install java-17-openjdk-headless\n"
    "  macOS:          brew install openjdk@17\n"
    "then put its bin/ on PATH or set JAVA_HOME to its home directory."
)


class JavaError(RuntimeError):
    """No usable Java runtime; the message says what was found and what to do."""


def java_version(text: str) -> int | None:
    """Major version from ``java -version`` output (``"17.0.15"`` -> 17,
    ``"1.8.0_402"`` -> 8), or None."""
    m = re.search(r'version "([0-9]+)(?:\.([0-9]+))?[^"]*"', text)
    if not m:
        return None
    major = int(m.group(1))
    if major == 1 and m.group(2) is not None:
        major = int(m.group(2))
    return major


def find_java(env: dict[str, str] | None = None) -> tuple[str, int]:
    """``(path to java, major version)`` of the Java Spark would use, or raise
    :class:`JavaError`."""
    env = dict(os.environ if env is None else env)
    hint = INSTALL_HINT.format(min=MIN_JAVA)
    home = env.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        if not (os.path.isfile(java) and os.access(java, os.X_OK)):
            raise JavaError(f"JAVA_HOME is set to {home!r}, but {java} is not an executable file.\n{hint}")
    else:
        java = shutil.which("java", path=env.get("PATH", os.defpath))
        if java is None:
            raise JavaError(f"no Java runtime found: 'java' is not on PATH and JAVA_HOME is not set.\n{hint}")
    try:
        p = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise JavaError(f"could not run {java} -version: {e}\n{hint}") from None
    out = (p.stderr or "") + (p.stdout or "")
    major = java_version(out)
    if p.returncode != 0 or major is None:
        first = out.strip().splitlines()[0] if out.strip() else f"exit status {p.returncode}"
        raise JavaError(f"{java} -version failed or printed no version ({first}).\n{hint}")
    if major < MIN_JAVA:
        raise JavaError(f"{java} is Java {major}; Spark 4 needs Java {MIN_JAVA} or newer.\n{hint}")
    return java, major


def under_spark_submit(env: dict[str, str] | None = None) -> bool:
    """True when this Python process was started by spark-submit (the JVM already runs)."""
    env = os.environ if env is None else env
    return "PYSPARK_GATEWAY_PORT" in env
