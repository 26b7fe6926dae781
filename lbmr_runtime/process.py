"""Running a daemon as a process: exit codes, logging set-up (UTC text or
JSON lines), and :func:`run_daemon` (``trio.run`` with the exit codes)."""

from __future__ import annotations

import gc
import json
import logging
import sys
import time

import trio

#: Exit status: 0 normal stop or valid file; these for failures.
EXIT_CONFIG, EXIT_USAGE, EXIT_SOCKET, EXIT_FATAL = 1, 2, 3, 4

#: allocations of tracked objects between two youngest-generation collections in a
#: running daemon (Python's default is 700: a relay moving a GB a second allocates
#: that many every few hundred microseconds, and its objects are short-lived)
GC_THRESHOLD = 10_000


class UTCFormatter(logging.Formatter):
    """``2026-11-23T22:44:52.662Z [INFO] name: message``."""

    converter = time.gmtime

    def formatTime(self, record, datefmt=None):  # noqa: N802 - logging API
        t = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{t}.{int(record.msecs):03d}Z"


class JSONFormatter(UTCFormatter):
    """One JSON object per line: ts (UTC), level, logger, msg."""

    def format(self, record):
        return json.dumps({"ts": self.formatTime(record), "level": record.levelname.lower(),
                           "logger": record.name, "msg": record.getMessage()})


def setup_logging(logfile: str | None, fmt: str, level: int = logging.INFO, name: str = "lbmrd",
                  handler: logging.Handler | None = None) -> None:
    """Log the ``name`` logger to ``logfile`` (or, without one, to ``handler``,
    else stdout) as ``fmt`` ("text" or "json"); it does not propagate to the
    root logger."""
    if logfile:
        handler = logging.FileHandler(logfile)
    elif handler is None:
        handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JSONFormatter() if fmt == "json" else
                         UTCFormatter("%(asctime)s [%(levelname)s] %(name)s: %(message)s"))
    root = logging.getLogger(name)
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's soft limit of open descriptors to its hard limit
    (a daemon that holds a socket per proxy or client should get all it may);
    returns (old soft limit, new soft limit)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, hard


def run_daemon(fn, logger: logging.Logger) -> int:
    """``trio.run(fn)`` with the daemons' exit codes: 0 for a stop, 3 for a
    socket error, 4 for anything else (trio wraps task errors in groups). The
    objects built before it (modules, configuration) are frozen out of the
    garbage collector's passes, and the youngest generation is collected every
    GC_THRESHOLD allocations."""
    gc.freeze()  # what start-up built (modules, config) is never traversed by a collection again
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
    try:
        trio.run(fn)
    except BaseException as exc:  # noqa: BLE001
        leaves = list(exception_leaves(exc))
        if all(isinstance(e, KeyboardInterrupt) for e in leaves):
            logger.info("stopping (interrupt)")
            return 0
        oserr = next((e for e in leaves if isinstance(e, OSError)), None)
        if oserr is not None:
            logger.error("socket error: %s", oserr)
            return EXIT_SOCKET
        logger.error("fatal error", exc_info=exc)
        return EXIT_FATAL
    return 0


def exception_leaves(exc: BaseException):
    """The non-group exceptions inside (possibly nested) exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        for e in exc.exceptions:
            yield from exception_leaves(e)
    else:
        yield exc
