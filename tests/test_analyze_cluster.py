"""lbmr-analyze on a real Spark standalone cluster: a master and a worker started
from pyspark's own jars on 127.0.0.1, executors running a Python environment that
has pyarrow but not lbmr-kit; ``lbmr-analyze --master spark://...`` and
``spark-submit`` must produce the same tables as ``local[2]``, quietly; executors
whose Python lacks pyarrow give a clear error naming ``spark.pyspark.python``.

The worker runs in its own mount namespace (``unshare -m``) with a private tmpfs
over one folder (:data:`PRIVATE`): an output folder there is genuinely not shared
between the driver and the executors, as on a cluster whose ``--out`` is each
machine's local disk.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import venv
from pathlib import Path

import pyspark
import pytest

from lbmr_analyze.job import TABLES, TRANSPORT_TABLES, run

ROOT = Path(__file__).resolve().parents[1]
REAL_CAPTURE = ROOT.parent / "shared" / "captures" / "um614-multicast-tr.pcap"
SPARK_HOME = Path(pyspark.__file__).parent
VENV_BIN = Path(sys.executable).parent
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
SPLIT = 400_000             # bytes: the 1.4 MB real capture in four byte ranges
#: the JVM's client compiler only (as lbmr-analyze's own driver, lbmr_analyze.job.DRIVER_JIT): the
#: master, the worker and each job's executor are started, then do little JVM work (the records
#: go from the Python workers to Parquet), so the optimising compiler's start-up work never pays back
JIT = "-XX:TieredStopAtLevel=1"
FEW = ["--conf", "spark.sql.shuffle.partitions=4", "--conf", "spark.ui.enabled=false",
       "--conf", "spark.executor.memory=1g", "--conf", f"spark.executor.extraJavaOptions={JIT}"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: Below the cluster's temporary folder: the worker (and its executors) see a tmpfs there.
PRIVATE = "private"


def _spark_env(tmp: Path) -> dict:
    env = dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_LOG_DIR=str(tmp / "logs"), SPARK_PID_DIR=str(tmp), SPARK_NO_DAEMONIZE="1",
               SPARK_DAEMON_JAVA_OPTS=JIT)
    # no python3 with lbmr-kit on PATH: executors run only the Python they are told to
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and Path(p).resolve() != VENV_BIN.resolve())
    env.pop("PYSPARK_PYTHON", None)
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    return env


def _python_env(path: Path, with_deps: bool) -> Path:
    """A fresh venv; with_deps: it sees this venv's site-packages (pyarrow, ...) through
    a plain path line, so the editable lbmr-kit install there (a .pth hook) is not
    active and lbmr_analyze is not importable."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(path)
    if with_deps:
        import pyarrow
        site = Path(pyarrow.__file__).parents[1]
        (path / "lib" / f"python{PY}" / "site-packages" / "deps.pth").write_text(f"{site}\n")
    return path / "bin" / "python"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster")
    env = _spark_env(tmp)
    mport, mui, wui = _free_port(), _free_port(), _free_port()
    cls = str(SPARK_HOME / "bin" / "spark-class")
    logs = [open(tmp / "master.log", "wb"), open(tmp / "worker.log", "wb")]
    master = subprocess.Popen([cls, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(mport), "--webui-port", str(mui)],
                              env=env, stdout=logs[0], stderr=subprocess.STDOUT)
    url = f"spark://127.0.0.1:{mport}"
    (tmp / PRIVATE).mkdir()
    # the worker in its own mount namespace, a tmpfs over tmp/private (we are root, as for tests/netns.py)
    worker = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c",
                               'mount -t tmpfs -o size=256m lbmr-private "$0" && exec "$@"', str(tmp / PRIVATE),
                               cls, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                               "--webui-port", str(wui), "--cores", "2", "--memory", "2g",
                               "--work-dir", str(tmp / "work"), url],
                              env=env, stdout=logs[1], stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{mui}/json/", timeout=2) as r:
                    state = json.loads(r.read())
                if state.get("aliveworkers", 0) >= 1:
                    break
            except (OSError, ValueError):       # not listening yet, or not yet serving its JSON
                pass
            assert master.poll() is None and worker.poll() is None, (tmp / "master.log").read_text()
            assert time.monotonic() < deadline, "the worker did not register with the master"
            time.sleep(0.2)
        yield dict(url=url, env=env, tmp=tmp)
    finally:
        for p in (worker, master):
            p.terminate()
        for p in (worker, master):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in logs:
            f.close()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """The real capture and a synthetic one (cut into byte ranges below)."""
    sys.path.insert(0, str(ROOT))
    from tests.analyze_reference import synthetic_datagrams, write_pcap
    d = tmp_path_factory.mktemp("caps")
    (d / "real.pcap").write_bytes(REAL_CAPTURE.read_bytes())
    write_pcap(d / "synthetic.pcap", synthetic_datagrams())
    return d


@pytest.fixture(scope="module")
def local_tables(inputs, tmp_path_factory, spark_session) -> dict:
    """The tables of the same inputs on local[2] (the suite's embedded session)."""
    res = run(spark_session, [inputs], tmp_path_factory.mktemp("local") / "out", split_size=SPLIT,
              storm_threshold=50, report=False)
    return json.loads(json.dumps(res.tables, default=str))


def _tables(out: Path) -> dict:
    return {n: json.loads((out / f"{n}.json").read_text()) for n in TABLES + TRANSPORT_TABLES}


#: Printed by the JVM (not Spark's logging) when Spark's launcher starts it.
INCUBATOR_WARNING = "WARNING: Using incubator modules: jdk.incubator.vector"


def _noise(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if not ln.startswith("lbmr-analyze")]


@pytest.fixture(scope="module")
def exenv(cluster) -> Path:
    return _python_env(cluster["tmp"] / "exenv", with_deps=True)


def test_executor_python_without_lbmr_kit(cluster, exenv):
    py = exenv
    ok = subprocess.run([py, "-c", "import pyarrow"], cwd=cluster["tmp"], capture_output=True)
    assert ok.returncode == 0, ok.stderr
    no = subprocess.run([py, "-c", "import lbmr_analyze"], cwd=cluster["tmp"], capture_output=True, text=True)
    assert no.returncode == 1 and "No module named 'lbmr_analyze'" in no.stderr


def test_lbmr_analyze_master_spark_url(cluster, exenv, inputs, local_tables):
    out = cluster["tmp"] / "out-cli"
    p = subprocess.run([VENV_BIN / "lbmr-analyze", str(inputs), "--out", str(out), "--master", cluster["url"],
                        "--split-size", str(SPLIT), "--storm-threshold", "50",
                        "--conf", f"spark.pyspark.python={exenv}",
                        *FEW],
                       env=cluster["env"], cwd=cluster["tmp"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert _noise(p.stderr) == [], p.stderr[-3000:]                  # Spark's start-up noise is quiet
    assert "findings:" in p.stdout
    assert _tables(out) == local_tables


def test_spark_submit(cluster, exenv, inputs, local_tables):
    script = subprocess.run([VENV_BIN / "lbmr-analyze", "--submit-script"], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert script.endswith(".py") and Path(script).is_file()
    log4j = subprocess.run([VENV_BIN / "lbmr-analyze", "--log4j-config"], capture_output=True, text=True,
                           check=True).stdout.strip()
    out = cluster["tmp"] / "out-submit"
    # the documented form (lbmr-analyze(1)): quiet from the JVM's start
    p = subprocess.run([SPARK_HOME / "bin" / "spark-submit", "--master", cluster["url"],
                        "--driver-java-options", f"-Dlog4j2.configurationFile={log4j}",
                        "--conf", f"spark.pyspark.python={exenv}",
                        "--conf", f"spark.pyspark.driver.python={sys.executable}",
                        *FEW, script, str(inputs), "--out", str(out), "--split-size", str(SPLIT),
                        "--storm-threshold", "50"],
                       env=cluster["env"], cwd=cluster["tmp"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    assert "lbmr-analyze: 2 file(s)" in p.stdout
    assert _tables(out) == local_tables
    # only our progress lines, and the one line the JVM itself prints before any
    # configuration applies (Spark 4's launcher always adds the incubating vector module);
    # the driver's standard error goes to spark-submit's (lbmr_analyze.submit), the summary
    # to its standard output
    assert [ln for ln in _noise(p.stderr) if ln != INCUBATOR_WARNING] == [], p.stderr[-3000:]
    assert "lbmr-analyze [" in p.stderr                                    # progress still shown
    assert [ln for ln in p.stdout.splitlines() if not ln.startswith("  ")] == [
        next(ln for ln in p.stdout.splitlines() if ln.startswith("lbmr-analyze: 2 file(s)"))], p.stdout[-3000:]


def test_executors_without_pyarrow_get_a_clear_error(cluster, inputs):
    bare = _python_env(cluster["tmp"] / "bare", with_deps=False)
    out = cluster["tmp"] / "out-bare"
    p = subprocess.run([VENV_BIN / "lbmr-analyze", str(inputs), "--out", str(out), "--master", cluster["url"],
                        "--conf", f"spark.pyspark.python={bare}", *FEW, "-q"],
                       env=cluster["env"], cwd=cluster["tmp"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 3, p.stderr[-3000:]
    assert "spark.pyspark.python" in p.stderr and "pyarrow" in p.stderr
    assert "Traceback" not in p.stderr
    assert not out.exists()


def test_output_not_shared_with_executors_is_an_error(cluster, exenv, inputs):
    """--out in a folder the executors see as their own tmpfs: the driver reads back
    none of the records they wrote, and says so (exit 1) instead of reporting 0
    datagrams; the previous output is untouched and no staging folder is left."""
    private = cluster["tmp"] / PRIVATE
    out = private / "out"
    out.mkdir()
    (out / "previous.txt").write_text("the previous result")
    p = subprocess.run([VENV_BIN / "lbmr-analyze", str(inputs), "--out", str(out), "--master", cluster["url"],
                        "--conf", f"spark.pyspark.python={exenv}", *FEW, "-q"],
                       env=cluster["env"], cwd=cluster["tmp"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, (p.returncode, p.stdout[-2000:], p.stderr[-3000:])
    assert re.search(r"the executors wrote [1-9][0-9]* records under \S+ but the driver reads 0 there: --out "
                     r"must be on a file system that the driver and every executor share", p.stderr), p.stderr
    assert "previous output, if any, is unchanged" in p.stderr
    assert "Traceback" not in p.stderr and "LBMR datagrams" not in p.stdout
    assert sorted(x.name for x in private.iterdir()) == ["out"]          # staging removed
    assert [x.name for x in out.iterdir()] == ["previous.txt"]
