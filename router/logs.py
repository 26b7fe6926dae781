"""Where lbmr-router logs (``<daemon><log>``) and its statistics line
(``<daemon><stats-interval>``).

* ``type="console"``: standard output.
* ``type="file"``: appended to the file (never truncated). ``frequency``
  daily / hourly rolls it at each UTC midnight / hour, ``size`` (MB, 0 = no
  limit) rolls it once it would grow past that; both may be set. As the DRO
  does, a rolled file is kept, never deleted: it is renamed
  ``FILE.YYYY-MM-DD.N`` (``FILE.YYYY-MM-DDTHH.N`` for hourly rolling), with
  the UTC date (hour) of the roll and the first free sequence number N from 1,
  and a new FILE is started.
* ``type="syslog"``: the local syslog daemon (``/dev/log``, else UDP
  127.0.0.1:514), facility daemon, ident ``lbmr-router``.

``-L FILE`` on the command line wins over the file's ``<log>`` (a plain
append, no rolling).
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import time

__all__ = ["RollingFileHandler", "log_handler", "stats_line", "SYSLOG_SOCKET"]

SYSLOG_SOCKET = "/dev/log"
_MB = 1 << 20


class RollingFileHandler(logging.handlers.BaseRotatingHandler):
    """Append to ``path``; roll it by UTC time (``frequency`` "daily" or
    "hourly"; "disable" = never) and/or by size (``max_bytes``, 0 = never).
    Rolled files are kept (see the module doc). ``start``: when the file's
    current period began (seconds since the epoch, UTC; None: the file's
    modification time if it holds anything, else now)."""

    def __init__(self, path: str, frequency: str = "disable", max_bytes: int = 0, *,
                 start: float | None = None) -> None:
        if frequency not in ("disable", "daily", "hourly"):
            raise ValueError(f"frequency must be disable, daily or hourly, not {frequency!r}")
        super().__init__(path, "a", encoding="utf-8", delay=False)
        self.frequency = frequency
        self.max_bytes = max_bytes
        self._period = {"daily": 86400, "hourly": 3600}.get(frequency, 0)
        if start is None:
            try:
                start = os.stat(path).st_mtime if os.path.getsize(path) else time.time()
            except OSError:
                start = time.time()
        self._next_roll = self._boundary_after(start)
        self._roll_time = start

    def _boundary_after(self, t: float) -> float:
        """The first UTC midnight (hour) after ``t`` (inf without time rolling)."""
        if not self._period:
            return float("inf")
        return (int(t) // self._period + 1) * self._period

    def shouldRollover(self, record: logging.LogRecord) -> bool:  # noqa: N802 - logging API
        if record.created >= self._next_roll:
            return True
        if self.max_bytes and self.stream is not None:
            msg = f"{self.format(record)}\n"
            pos = self.stream.tell()
            if pos and pos + len(msg.encode("utf-8", "replace")) > self.max_bytes:
                return True
        return False

    def emit(self, record: logging.LogRecord) -> None:
        self._roll_time = record.created
        super().emit(record)

    def doRollover(self) -> None:  # noqa: N802 - logging API
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        when = self._roll_time
        if when >= self._next_roll:  # the period that just ended names the file
            when = self._next_roll - 1
        stamp = time.strftime("%Y-%m-%dT%H" if self.frequency == "hourly" else "%Y-%m-%d",
                              time.gmtime(when))
        n = 1
        while os.path.exists(f"{self.baseFilename}.{stamp}.{n}"):
            n += 1
        if os.path.exists(self.baseFilename) and os.path.getsize(self.baseFilename):
            os.rename(self.baseFilename, f"{self.baseFilename}.{stamp}.{n}")
        self._next_roll = self._boundary_after(self._roll_time)
        self.stream = self._open()


def log_handler(log, *, syslog_address=None) -> logging.Handler | None:
    """The handler for a :class:`router.config.model.LogConfig` (None: standard
    output). ``syslog_address`` overrides where syslog messages go (tests).
    OSError if the file cannot be opened."""
    if log.type == "file" and log.file:
        return RollingFileHandler(log.file, log.frequency, log.size_mb * _MB)
    if log.type == "syslog":
        addr = syslog_address
        if addr is None:
            addr = SYSLOG_SOCKET if os.path.exists(SYSLOG_SOCKET) else ("127.0.0.1", 514)
        h = logging.handlers.SysLogHandler(addr, facility=logging.handlers.SysLogHandler.LOG_DAEMON)
        h.ident = "lbmr-router: "
        return h
    return None


def stats_line(router) -> str:
    """The periodic statistics line of a :class:`router.shell.router.MultiRouter`:
    links up / links, and per router totals of proxies, adverts, local and
    remote interest, relayed streams, datagrams dropped towards peers, TR
    datagrams in and out, and drops."""
    summary = router.portal_summary()
    links = router.links
    up = sum(1 for r in links if r.link is not None and r.link.connected)
    tr_in = tr_out = drops = 0
    for s in summary:
        tr_in += s["tr"].get("datagrams_received", 0)
        tr_out += s["tr"].get("datagrams_sent", 0)
        drops += sum(s["drops"].values())
    return (f"stats links={up}/{len(links)} proxies={sum(s['proxies'] for s in summary)} "
            f"adverts={sum(s['adverts'] for s in summary)} "
            f"local_interest={sum(len(s['local_interest']) for s in summary)} "
            f"remote_interest={sum(len(s['remote_interest']) for s in summary)} "
            f"streams={sum(len(r.link.state) for r in links if r.link)} "
            f"peer_dropped={sum(r.link.outq.dropped_datagrams for r in links if r.link)} "
            f"tr_rx={tr_in} tr_tx={tr_out} drops={drops}")
