"""The cluster commands of lbmr-analyze(1), run as written.

The lines between the ``cluster-commands`` markers (CLUSTERS; the README points
there) start a standalone master and worker from pip's pyspark on 127.0.0.1, run
``lbmr-analyze --master spark://...`` and ``spark-submit`` on the real capture,
and stop the master and worker.  They are fed one command at a time to one
``bash``, as a user types them; the test changes only the values of the
variables the page defines for that (the port, the captures, the output
folder), waits where the page says to wait, and after each job asks bash
for its exit status.  ``spark-submit``'s error messages must reach its standard
error, not its standard output.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pyspark  # noqa: F401  - a test requirement: a missing pyspark fails, never skips
import pytest

from .shell import Shell, logical

ROOT = Path(__file__).resolve().parents[1]
REAL_CAPTURE = ROOT.parent / "shared" / "captures" / "um614-multicast-tr.pcap"
VENV_BIN = Path(sys.executable).parent
BEGIN, END = "cluster-commands: begin", "cluster-commands: end"
#: seconds for the worker to register, and for one job
REGISTER_S, JOB_S = 180, 600


def man_commands() -> list[str]:
    """The marked lines of lbmr-analyze(1), without roff requests and escapes."""
    text = (ROOT / "man" / "lbmr-analyze.1").read_text()
    block = text.split(BEGIN, 1)[1].split(END, 1)[0].splitlines()[1:-1]
    lines = [ln for ln in block if not ln.startswith(".")]
    return [ln.replace("\\-", "-").replace("\\e", "\\").replace("\\&", "") for ln in lines]


def assign(cmd: str, name: str, value: str) -> str:
    """``cmd`` with the value of the page's ``NAME=...`` line replaced."""
    new, n = re.subn(rf"^{name}=\S+", f"{name}={shlex.quote(value)}", cmd)
    assert n == 1, (name, cmd)
    return new


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def venv_env() -> dict:
    """The environment of a shell with lbmr-kit's venv active (pip's spark-submit
    finds its SPARK_HOME through the python3 on PATH)."""
    env = dict(os.environ, PATH=os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")]))
    for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME", "SPARK_LOCAL_IP"):
        env.pop(k, None)
    return env


@pytest.fixture
def shell(tmp_path):
    sh = Shell(tmp_path, venv_env())
    yield sh
    sh.close()


def test_cluster_commands_work_as_written(tmp_path, shell):
    caps = tmp_path / "caps"
    caps.mkdir()
    (caps / "real.pcap").write_bytes(REAL_CAPTURE.read_bytes())
    out = tmp_path / "tr"
    values = {"PORT": str(_free_port()), "CAPTURES": str(caps), "OUT": str(out)}
    cmds = logical(man_commands())
    starts = [c for c in cmds if c.startswith("spark-class ")]
    jobs = [c for c in cmds if c.startswith(("lbmr-analyze ", "spark-submit "))]
    assert [c.split()[1] for c in starts] == ["org.apache.spark.deploy.master.Master",
                                              "org.apache.spark.deploy.worker.Worker"]
    assert [c.split()[0] for c in jobs] == ["lbmr-analyze", "spark-submit"]
    assert "spark.pyspark.driver.python=" in jobs[1] and "spark.pyspark.python=" in jobs[1]
    for cmd in cmds:
        name = re.match(r"(?:export )?([A-Z_]+)=", cmd)
        if name and name.group(1) in values:
            cmd = assign(cmd, name.group(1), values.pop(name.group(1)))
        shell.send(cmd)
        if cmd is starts[-1]:
            shell.wait_for(lambda: "Successfully registered with master" in shell.err(), REGISTER_S)
        if cmd in jobs:
            status = shell.status(JOB_S)
            assert status == 0, (cmd, shell.out()[-3000:], shell.err()[-5000:])
            assert (out / "report.html").is_file()
            assert "lbmr-analyze: 1 file(s), 1 byte range(s): 179 LBMR datagrams" in shell.out()
            (out / "report.html").unlink()
    assert values == {}, f"the page no longer defines {sorted(values)}"
    assert shell.status(60) == 0                            # kill %2 %1
    shell.send("wait\n")
    assert shell.status(120) == 0                           # the master and the worker have ended
    progress = re.findall(r"^lbmr-analyze \[.*$", shell.err(), re.M)
    assert len(progress) == 2 * 7, shell.err()[-5000:]      # both jobs' progress on standard error
    assert not re.search(r"^lbmr-analyze \[", shell.out(), re.M), shell.out()[-3000:]


STDERR_KINDS = {"pipe": None, "file opened for appending": "ab", "file opened for writing": "wb"}


def test_spark_submit_errors_go_to_standard_error(tmp_path):
    """Our messages reach spark-submit's standard error when it is a pipe or a file
    opened for appending; a file opened otherwise (``2> file``) cannot be shared
    with the JVM, so they stay in the standard output (lbmr-analyze(1), OUTPUT).
    The three spark-submits run side by side (each a JVM's start: the test's time)."""
    script = subprocess.run([VENV_BIN / "lbmr-analyze", "--submit-script"], capture_output=True, text=True,
                            check=True).stdout.strip()
    env = dict(venv_env(), SPARK_LOCAL_IP="127.0.0.1")
    runs = {}
    try:
        for i, (kind, mode) in enumerate(STDERR_KINDS.items()):
            d = tmp_path / f"run{i}"
            d.mkdir()
            err_path = d / "stderr"
            err_file = open(err_path, mode) if mode else subprocess.PIPE
            # (the JVM's client compiler only, as lbmr-analyze starts its own: a third less of each start)
            p = subprocess.Popen(["spark-submit", "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                                  "--driver-java-options", "-XX:TieredStopAtLevel=1", script, str(d / "missing.pcap"), "--out", str(d / "out")],
                                 stdout=subprocess.PIPE, stderr=err_file, text=True, cwd=d, env=env)
            runs[kind] = (p, err_path, err_file)
        for kind, (p, err_path, err_file) in runs.items():
            stdout, stderr = p.communicate(timeout=JOB_S)
            if STDERR_KINDS[kind]:
                err_file.close()
            err = err_path.read_text() if STDERR_KINDS[kind] else stderr
            assert p.returncode == 2, (kind, stdout[-2000:], err[-3000:])
            ours, theirs = (stdout, err) if kind == "file opened for writing" else (err, stdout)
            assert "Error: " in ours and "missing.pcap" in ours and "lbmr-analyze [" in ours, \
                (kind, ours[-3000:], theirs[-3000:])
            assert "missing.pcap" not in theirs and "lbmr-analyze [" not in theirs, (kind, theirs[-2000:])
            assert "Using incubator modules" in err, kind      # the JVM's own standard error, intact
    finally:
        for p, _, err_file in runs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
            if err_file is not subprocess.PIPE:
                err_file.close()
