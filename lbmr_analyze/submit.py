"""The ``spark-submit`` entry point of lbmr-analyze (spark-submit runs a ``.py`` file,
not a console script)::

    spark-submit --master yarn --conf spark.pyspark.driver.python=$(command -v python3) \
        --driver-java-options "-Dlog4j2.configurationFile=$(lbmr-analyze --log4j-config)" \
        "$(lbmr-analyze --submit-script)" hdfs:///caps --out hdfs:///tr

(``--driver-java-options`` makes Spark's driver log only errors from its start;
without it Spark's start-up lines show until the session sets the level.
``spark.pyspark.driver.python`` is the driver's Python, which needs lbmr-kit;
without it spark-submit takes ``spark.pyspark.python``, the executors'.)

It takes the same arguments as ``lbmr-analyze`` (see lbmr-analyze(1)); the driver's
Python must have lbmr-kit installed, the executors' only pyarrow.
"""

import os
import stat
import sys


def stderr_to_spark_submits() -> bool:
    """Point this process's standard error (file descriptor 2) at the standard error
    of the spark-submit JVM that started it; True when done.

    spark-submit starts the Python driver with its standard error merged into the
    standard output it copies to its own, so progress and error messages would land
    among the results on standard output.  On Linux the parent's descriptor is
    reachable as ``/proc/<parent>/fd/2``; opening it makes a new open file, which
    is safe to write beside the JVM's for a terminal, a pipe or a socket, and for a
    file opened for appending (both then write at its end).  A file opened without
    O_APPEND is left alone (the JVM, writing at its own offset, would overwrite our
    lines), as is anything on other systems or under a parent that is no Spark JVM."""
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            if b"org.apache.spark.deploy." not in f.read():
                return False
        with open(f"/proc/{parent}/fdinfo/2") as f:
            flags = int(next(ln for ln in f if ln.startswith("flags:")).split()[1], 8)
        fd = os.open(f"/proc/{parent}/fd/2", os.O_WRONLY | os.O_APPEND)
    except (OSError, StopIteration, ValueError):
        return False
    if stat.S_ISREG(os.fstat(fd).st_mode) and not flags & os.O_APPEND:
        os.close(fd)
        return False
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)
    return True

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    # spark-submit puts this file's folder first on sys.path: drop it, so that the
    # package's modules are imported as lbmr_analyze.*, never as top-level modules
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    from lbmr_analyze.cli import main

    stderr_to_spark_submits()
    main(prog_name="lbmr-analyze")
