"""Command line: ``lbmr-analyze CAPTURE... --out DIR [--master URL]``; see lbmr-analyze(1).

Exit status: 0 done (capture and decode errors are reported in the output, not
as failure), 1 the Spark job failed, 2 usage error (click), 3 no usable Java or
PySpark, 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import logging
import re
import signal
import sys
import time

import click

from .job import DEFAULT_STORM_THRESHOLD, DEFAULT_TOP
from .splits import DEFAULT_SPLIT_SIZE

EXIT_FAILED, EXIT_ENVIRONMENT, EXIT_INTERRUPTED = 1, 3, 130
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``134217728``, ``128M``, ``64k``, ``1G`` (binary units) -> bytes."""
    m = re.fullmatch(r"\s*([0-9]+)\s*([kKmMgG]?)(?:i?[bB])?\s*", text)
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 134217728, 64M, 1G)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def _size(ctx, param, value):
    try:
        n = parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    if n < 64:
        raise click.BadParameter("must be at least 64 bytes")
    return n


def _conf(ctx, param, values):
    out = []
    for v in values:
        k, sep, val = v.partition("=")
        if not sep or not k:
            raise click.BadParameter(f"{v!r}: expected KEY=VALUE")
        out.append((k, val))
    return out


def _on_interrupt(signum, frame):
    """SIGINT (Ctrl-C): one KeyboardInterrupt in the main thread, wherever it waits
    (usually inside a Py4J call).  Later SIGINTs are ignored while the job deletes its
    staging folder and stops Spark, and logging is switched off: Py4J logs the
    interrupted call's broken connection with tracebacks (pyspark's own handler also
    calls into the JVM from the signal handler, which fails the same way)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.disable(logging.CRITICAL)
    raise KeyboardInterrupt


def _submit_script(ctx, param, value):
    if value and not ctx.resilient_parsing:
        from pathlib import Path
        click.echo(Path(__file__).with_name("submit.py"))
        ctx.exit(0)


def _log4j_config(ctx, param, value):
    if value and not ctx.resilient_parsing:
        from pathlib import Path
        click.echo(Path(__file__).with_name("log4j2.properties"))
        ctx.exit(0)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--submit-script", is_flag=True, expose_value=False, is_eager=True, callback=_submit_script,
              help="Print the path of the .py file to give spark-submit, and exit.")
@click.option("--log4j-config", is_flag=True, expose_value=False, is_eager=True, callback=_log4j_config,
              help="Print the path of lbmr-analyze's quiet log4j2 configuration (for spark-submit's "
                   "--driver-java-options), and exit.")
@click.argument("captures", nargs=-1, required=True)
@click.option("--out", "out", required=True, metavar="DIR",
              help="Output folder or URI: records/ (Parquet), report.html, plots, tables; replaced "
                   "only when the run succeeds.")
@click.option("--master", metavar="URL",
              help="Spark master, e.g. spark://host:7077 (default local[*], or spark-submit's).")
@click.option("--port", "ports", type=click.IntRange(1, 65535), multiple=True, metavar="N",
              help="Also treat UDP port N as LBMR (repeatable). Always: 12965, 15380.")
@click.option("--split-size", default=str(DEFAULT_SPLIT_SIZE), callback=_size, metavar="SIZE",
              show_default=True, help="Byte range per task (e.g. 64M); big files are cut into such ranges.")
@click.option("--storm-threshold", type=click.IntRange(min=0), default=DEFAULT_STORM_THRESHOLD,
              show_default=True, metavar="N", help="A second with more than N LBMR datagrams is a storm.")
@click.option("--top", type=click.IntRange(min=1), default=DEFAULT_TOP, show_default=True, metavar="N",
              help="Rows in the top talkers / top topics tables and plots.")
@click.option("--no-transport", is_flag=True,
              help="Skip the transport pass (LBT-RM, LBT-RU, LBT-TCP sessions and their findings).")
@click.option("--conf", "conf", multiple=True, callback=_conf, metavar="KEY=VALUE",
              help="Extra Spark configuration (repeatable), e.g. spark.driver.memory=4g.")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
@click.option("-v", "--verbose", is_flag=True,
              help="Show Spark's own start-up output and warnings (by default they go to a log file).")
def main(captures, out, master, ports, split_size, storm_threshold, top, no_transport, conf, quiet, verbose):
    """Analyse LBMR (Ultra Messaging topic resolution) traffic in pcap/pcapng
    CAPTURES (files or folders, .gz too; local paths or file://, hdfs://, s3a://
    URIs) with Spark: decode to Parquet, run the analyses, write DIR/report.html,
    findings first.

    \b
    Examples:
      lbmr-analyze trace.pcapng --out report/
      lbmr-analyze /data/captures/ --out /shared/tr --master spark://head:7077
      spark-submit --master yarn --conf spark.pyspark.driver.python=$(command -v python3) \\
        --driver-java-options "-Dlog4j2.configurationFile=$(lbmr-analyze --log4j-config)" \\
        "$(lbmr-analyze --submit-script)" hdfs:///caps --out hdfs:///tr

    A cluster on one machine, exit statuses, the fixed cost: lbmr-analyze(1).
    """
    from .javacheck import JavaError, find_java, under_spark_submit

    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as e:
        click.echo(f"lbmr-analyze: {e.name} is not installed: pip install 'lbmr-kit[spark]'", err=True)
        sys.exit(EXIT_ENVIRONMENT)
    if not under_spark_submit():
        try:
            find_java()
        except JavaError as e:
            click.echo(f"lbmr-analyze: {e}", err=True)
            sys.exit(EXIT_ENVIRONMENT)

    from .job import Progress, summary_text

    prog = Progress(1 + 5 + (not no_transport), enabled=not quiet)
    t0 = time.perf_counter()
    signal.signal(signal.SIGINT, _on_interrupt)
    try:
        res, started = _start_and_run(prog, master, conf, verbose, dict(
            inputs=captures, out=out, ports=ports, split_size=split_size,
            storm_threshold=storm_threshold, top=top, transport=not no_transport))
    except KeyboardInterrupt:
        click.echo("lbmr-analyze: interrupted; the previous output, if any, is unchanged", err=True)
        sys.exit(EXIT_INTERRUPTED)
    click.echo(summary_text(res, (started, time.perf_counter() - t0)))
    for e in res.tables["capture_errors"]:
        click.echo(f"lbmr-analyze: {e['file']}: byte offset {e['offset']}: {e['error']}", err=True)


def _start_and_run(prog, master, conf, verbose, job_args):
    """Start Spark, run the job, stop Spark (unless an embedding caller owns the
    session): the job's :class:`~lbmr_analyze.job.Result` and the seconds Spark took
    to start.  Errors become a message on stderr and an exit status."""
    from pyspark.sql import SparkSession

    from .fsio import UnsupportedURI
    from .job import (
        SPARK_LOG,
        EnvironmentError_,
        OutputNotVisible,
        build_session,
        import_ahead,
        run,
        stop_session,
    )

    prog.step("starting Spark" + (f" ({master})" if master else ""))
    owned = SparkSession.getActiveSession() is None    # embedded callers keep their session
    try:
        t = time.perf_counter()
        ahead = import_ahead()
        spark = build_session(master, conf, quiet_jvm=not verbose, class_cache=True)
        ahead.join()                    # the job's own imports never run beside the thread's
        started = time.perf_counter() - t
    except Exception as e:  # noqa: BLE001 - Py4J/JVM start-up failures have many types
        click.echo(f"lbmr-analyze: could not start Spark: {e}" + ("" if verbose else
                   f" (Spark's output: {SPARK_LOG})"), err=True)
        sys.exit(EXIT_ENVIRONMENT)
    signal.signal(signal.SIGINT, _on_interrupt)         # in place of the one SparkContext installs
    interrupted = False
    try:
        return run(spark, progress=prog, **job_args), started
    except KeyboardInterrupt:
        interrupted = True
        raise
    except (FileNotFoundError, FileExistsError, UnsupportedURI) as e:
        raise click.UsageError(str(e)) from None
    except EnvironmentError_ as e:
        prog.done()
        click.echo(f"lbmr-analyze: {e}", err=True)
        sys.exit(EXIT_ENVIRONMENT)
    except OutputNotVisible as e:
        prog.done()
        click.echo(f"lbmr-analyze: {e}; the previous output, if any, is unchanged", err=True)
        sys.exit(EXIT_FAILED)
    except Exception as e:  # noqa: BLE001
        prog.done()
        click.echo(f"lbmr-analyze: analysis failed: {e}; the previous output, if any, is unchanged", err=True)
        sys.exit(EXIT_FAILED)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)    # the output is in place (or not): stop quietly
        if owned:
            try:
                saved = stop_session(spark, interrupted=interrupted)
            except Exception:  # noqa: BLE001 - Py4J errors of a connection broken by Ctrl-C
                if not interrupted:
                    raise
            else:
                if saved is not None and prog.enabled:
                    click.echo(f"lbmr-analyze     saved Spark's classes for faster starts (once): {saved:.1f} s",
                               err=True)


if __name__ == "__main__":
    main()
