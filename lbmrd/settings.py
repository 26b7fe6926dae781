"""lbmrd's settings: one type for every layer of them.

A :class:`Settings` is what one source says: UM's defaults (:data:`DEFAULTS`),
the configuration file's ``<daemon>`` section (:attr:`lbmrd.config.Config.daemon`),
the command line. ``None`` means "not said here"; :meth:`Settings.overlay`
lays one source over another, and :meth:`Settings.effective` gives what the
daemon runs with (every unset value from :data:`DEFAULTS`, the interface
resolved to the address to bind):

    DEFAULTS.overlay(config.daemon).overlay(command_line).effective()

The first seven fields are the ones the file can set, in its order; the
others come from the command line (or the embedding program).

Units: ``activity_ms`` milliseconds; ``ttl_s``, ``stats_interval`` seconds;
buffers bytes; rates datagrams per second, bursts datagrams.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from lbmr_runtime.netif import resolve_interface

__all__ = [
    "DEFAULTS",
    "DEFAULT_ACTIVITY_MS",
    "DEFAULT_INTERFACE",
    "DEFAULT_PORT",
    "DEFAULT_SOCKET_BUFFER",
    "DEFAULT_TTL_S",
    "RELOADABLE",
    "RESTART_ONLY",
    "Settings",
]

# UM's documented lbmrd defaults
DEFAULT_INTERFACE = "0.0.0.0"
DEFAULT_PORT = 15380
DEFAULT_ACTIVITY_MS = 60000
DEFAULT_TTL_S = 60.0
DEFAULT_SOCKET_BUFFER = 1048576


@dataclass(frozen=True, slots=True)
class Settings:
    """One source of lbmrd settings; ``None`` = not set by this source."""

    # ---- the file's <daemon> section (and the command line)
    interface: str | None = None  # address, CIDR network or device name
    port: int | None = None  # UDP port (0 = any free port: tests, embedding)
    activity_ms: int | None = None  # client activity check period, milliseconds
    ttl_s: float | None = None  # client time to live, seconds
    log: str | None = None  # log file (None = console)
    rcv_buf: int | None = None  # socket receive buffer, bytes
    snd_buf: int | None = None  # socket send buffer, bytes
    # ---- the command line or the embedding program only
    bind_ip: str | None = None  # the address to bind (None: ``interface`` resolved)
    config_path: str | None = None
    metrics: tuple[str, int] | None = None  # HTTP endpoint (address, port)
    metrics_token_file: str | None = None  # the endpoint's bearer token, in this file
    metrics_cert: str | None = None  # the endpoint's TLS certificate (PEM) ...
    metrics_key: str | None = None  # ... and its private key (PEM)
    allow: tuple[str, ...] = ()  # CIDR networks clients may come from (empty = any)
    max_clients: int | None = None
    rate: float | None = None  # per client (ip:port)
    burst: float | None = None
    ip_rate: float | None = None  # per source address
    ip_burst: float | None = None
    peer_daemons: tuple[tuple[str, int | None], ...] = ()  # other lbmrds (address or CIDR, port)
    echo: bool = False  # also send each datagram back to its sender
    stats_interval: float = 60.0  # seconds between stats lines (0 = off)
    events: int = 1000  # size of the recent-events ring
    handle_signals: bool = False  # SIGHUP/SIGUSR1/SIGTERM; the command line turns it on

    def overlay(self, other: Settings) -> Settings:
        """These settings with every value that ``other`` sets (not None) replacing ours."""
        changes = {}
        for f in fields(self):
            theirs = getattr(other, f.name)
            if theirs is not None:
                changes[f.name] = theirs
        return replace(self, **changes)

    def effective(self) -> Settings:
        """What the daemon runs with: unset values from :data:`DEFAULTS`, and
        ``bind_ip`` from ``interface`` when not given (raises
        :exc:`lbmr_runtime.netif.InterfaceError` for an interface this host lacks)."""
        eff = DEFAULTS.overlay(self)
        if eff.bind_ip is None:
            eff = replace(eff, bind_ip=resolve_interface(eff.interface))
        return eff


#: UM's documented defaults (``log=None`` = console).
DEFAULTS = Settings(
    interface=DEFAULT_INTERFACE,
    port=DEFAULT_PORT,
    activity_ms=DEFAULT_ACTIVITY_MS,
    ttl_s=DEFAULT_TTL_S,
    log=None,
    rcv_buf=DEFAULT_SOCKET_BUFFER,
    snd_buf=DEFAULT_SOCKET_BUFFER,
)

#: Settings a reload can apply to a running daemon; the others need a restart.
RELOADABLE = ("ttl_s", "activity_ms")
RESTART_ONLY = ("bind_ip", "port", "rcv_buf", "snd_buf", "log")
