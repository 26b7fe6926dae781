"""lbmrd command line: the same options as Ultra Messaging's lbmrd, plus
long-only extensions. See lbmrd(8).

Exit status: 0 normal stop or valid file; 1 invalid configuration;
2 usage error; 3 socket/bind failure; 4 fatal runtime error.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys

from lbmr_runtime.netif import InterfaceError
from lbmr_runtime.process import EXIT_CONFIG, EXIT_USAGE, run_daemon, setup_logging

from .server import Daemon
from .settings import DEFAULTS, Settings

log = logging.getLogger("lbmrd")


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _positive_int(s: str) -> int:
    try:
        v = int(s, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {s!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {s!r}")
    return v


def _port(s: str) -> int:
    v = _positive_int(s)
    if v > 65535:
        raise argparse.ArgumentTypeError(f"port out of range: {s!r}")
    return v


def _hostport(s: str) -> tuple[str, int]:
    host, sep, port = s.rpartition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected ADDR:PORT, got {s!r}")
    return host or "127.0.0.1", int(_port(port)) if port != "0" else 0


def _positive_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {s!r}") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number: {s!r}")
    return v


def _stats_interval(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {s!r}") from None
    if not (v == 0 or 1 <= v < float("inf")):
        raise argparse.ArgumentTypeError(f"must be 0 (off) or a positive number of seconds, at "
                                         f"least 1: {s!r}")
    return v


def _peer(s: str) -> tuple[str, int | None]:
    """ADDR[:PORT] or CIDR[:PORT] of another daemon (no port = every port)."""
    host, sep, port = s.partition(":")
    try:
        ipaddress.IPv4Network(host, strict=False)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return host, (_port(port) if sep else None)


def _cidr(s: str) -> str:
    try:
        ipaddress.IPv4Network(s, strict=False)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return s


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="lbmrd", description="Unicast topic-resolution daemon for Ultra Messaging "
                "(lbmr-kit's drop-in lbmrd).", add_help=False)
    p.add_argument("config", nargs="?", metavar="config-file", help="XML configuration file (optional)")
    g = p.add_argument_group("UM lbmrd options")
    g.add_argument("-a", "--activity", type=_positive_int, metavar="IVL",
                   help="activity check interval in milliseconds (default 60000)")
    g.add_argument("-d", "--dump-dtd", action="store_true", help="print the configuration DTD and exit")
    g.add_argument("-h", "--help", action="help", help="print this help and exit")
    g.add_argument("-i", "--interface", metavar="ADDR",
                   help="interface to bind: address, CIDR network, device name or host name (default 0.0.0.0)")
    g.add_argument("-L", "--logfile", metavar="FILE", help="write the log to FILE instead of stdout")
    g.add_argument("-p", "--port", type=_port, metavar="PORT", help="UDP port to listen on (default 15380)")
    g.add_argument("-t", "--ttl", type=_positive_int, metavar="TTL",
                   help="seconds of silence after which a client is removed (default 60)")
    g.add_argument("-r", "--rcv-buf", type=_positive_int, metavar="SIZE", help="socket receive buffer, bytes (default 1048576)")
    g.add_argument("-s", "--snd-buf", type=_positive_int, metavar="SIZE", help="socket send buffer, bytes (default 1048576)")
    g.add_argument("-v", "--validate", action="store_true", help="validate config-file and exit (0 = valid)")
    g.add_argument("-f", "--lic-file", metavar="FILE", help=argparse.SUPPRESS)
    g.add_argument("--strict", action="store_true",
                   help="with -v: require UM's strict grammar (<domains> and <transformations> present)")
    x = p.add_argument_group("lbmr-kit extensions")
    x.add_argument("--metrics", type=_hostport, metavar="ADDR:PORT",
                   help="serve Prometheus /metrics, JSON /status and the operators' page / over "
                        "HTTP (off by default; see lbmrd(8), MONITOR)")
    x.add_argument("--metrics-token-file", metavar="FILE",
                   help="with --metrics: require the token in FILE (Authorization: Bearer, or as "
                        "the password of HTTP basic authentication)")
    x.add_argument("--metrics-cert", metavar="FILE",
                   help="with --metrics: serve HTTPS with this PEM certificate (chain)")
    x.add_argument("--metrics-key", metavar="FILE",
                   help="with --metrics-cert: the certificate's PEM private key")
    x.add_argument("--allow", type=_cidr, action="append", default=[], metavar="CIDR",
                   help="accept clients only from these networks (repeatable; default: everyone)")
    x.add_argument("--max-clients", type=_positive_int, metavar="N",
                   help="at most N clients; when full, new clients are refused and counted")
    x.add_argument("--rate-limit", type=_positive_float, metavar="N",
                   help="per-client (ip:port) limit, datagrams per second")
    x.add_argument("--burst", type=_positive_float, metavar="N",
                   help="per-client burst, datagrams, at least 1 (default 2 x rate, at least 1)")
    x.add_argument("--ip-rate-limit", type=_positive_float, metavar="N",
                   help="per source address limit (all its ports together), datagrams per second")
    x.add_argument("--ip-burst", type=_positive_float, metavar="N",
                   help="per source address burst, datagrams, at least 1 (default 2 x rate)")
    x.add_argument("--peer-daemon", type=_peer, action="append", default=[], metavar="ADDR[:PORT]",
                   help="another lbmrd (address or CIDR, optional port): never registered, never "
                        "relayed (repeatable)")
    x.add_argument("--echo", action="store_true", help="also send each datagram back to its sender")
    x.add_argument("--log-format", choices=["text", "json"], default="text", help="log line format")
    x.add_argument("--stats-interval", type=_stats_interval, default=60.0, metavar="SECONDS",
                   help="period of the one-line stats log, 0 = off (default 60)")
    x.add_argument("--events", type=_positive_int, default=1000, metavar="N", help="size of the recent-events ring")
    x.add_argument("--debug", action="store_true", help="debug logging")
    return p


def effective_settings(args, cfg) -> Settings:
    """CLI values override the file's <daemon> values, which override defaults."""
    cli = Settings(interface=args.interface, port=args.port, activity_ms=args.activity,
                   ttl_s=None if args.ttl is None else float(args.ttl), log=args.logfile,
                   rcv_buf=args.rcv_buf, snd_buf=args.snd_buf,
                   config_path=args.config, metrics=args.metrics,
                   metrics_token_file=args.metrics_token_file, metrics_cert=args.metrics_cert,
                   metrics_key=args.metrics_key, allow=tuple(args.allow),
                   max_clients=args.max_clients, rate=args.rate_limit, burst=args.burst,
                   ip_rate=args.ip_rate_limit, ip_burst=args.ip_burst,
                   peer_daemons=tuple(args.peer_daemon), echo=args.echo,
                   stats_interval=args.stats_interval, events=args.events, handle_signals=True)
    return DEFAULTS.overlay(cfg.daemon if cfg is not None else Settings()).overlay(cli).effective()


def main(argv: list[str] | None = None) -> int:
    from .config import DTD_TEXT, ConfigError, load_config, validate

    args = build_parser().parse_args(argv)
    if args.dump_dtd:
        sys.stdout.write(DTD_TEXT)
        return 0
    if args.validate:
        if not args.config:
            print("lbmrd: -v/--validate needs a config-file", file=sys.stderr)
            return EXIT_USAGE
        try:
            cfg = validate(args.config, strict=args.strict)
        except ConfigError as e:
            print(f"lbmrd: {e.format_all()}", file=sys.stderr)
            return EXIT_CONFIG
        for line, msg in cfg.warnings:
            print(f"lbmrd: {args.config}:{line}: warning: {msg}", file=sys.stderr)
        print(f"{args.config}: valid")
        return 0
    cfg = None
    if args.config:
        try:
            cfg = load_config(args.config)
        except ConfigError as e:
            print(f"lbmrd: {e}", file=sys.stderr)
            return EXIT_CONFIG
    logfile = args.logfile or (cfg.daemon.log if cfg is not None else None)
    try:
        setup_logging(logfile, args.log_format, logging.DEBUG if args.debug else logging.INFO)
    except OSError as e:
        print(f"lbmrd: cannot open log file: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.lic_file:
        log.warning("-f/--lic-file is ignored (no licence is needed)")
    for opt, value in (("--burst", args.burst), ("--ip-burst", args.ip_burst)):
        if value is not None and value < 1:
            log.error("%s must be at least 1 datagram", opt)
            return EXIT_USAGE
    try:
        settings = effective_settings(args, cfg)
    except InterfaceError as e:
        log.error("%s", e)
        return EXIT_USAGE
    if cfg is not None:
        for line, msg in cfg.warnings:
            log.warning("%s:%s: %s", args.config, line, msg)
    if (args.activity is not None or args.ttl is not None) and settings.activity_ms > settings.ttl_s * 1000:
        log.warning("activity interval %d ms is longer than the ttl (%g s): clients may live up to %g s",
                    settings.activity_ms, settings.ttl_s, settings.ttl_s + settings.activity_ms / 1000)
    if settings.bind_ip == "0.0.0.0":
        log.warning("bound to all interfaces: replies leave from the address the route picks; give -i "
                    "the address clients use in resolver_unicast_daemon")
    monitor_opts = [o for o, v in (("--metrics-token-file", args.metrics_token_file),
                                   ("--metrics-cert", args.metrics_cert),
                                   ("--metrics-key", args.metrics_key)) if v is not None]
    if monitor_opts and args.metrics is None:
        log.error("%s needs --metrics ADDR:PORT", " and ".join(monitor_opts))
        return EXIT_USAGE
    if args.metrics is not None and args.metrics[0] in ("0.0.0.0", ""):
        log.warning("--metrics %s:%d serves the client table (every client's address) on all "
                    "interfaces: give a loopback or management address unless that is intended",
                    *args.metrics)
    log.info("lbmr-kit lbmrd starting: interface %s port %d ttl %g s activity %d ms config %s",
             settings.bind_ip, settings.port, settings.ttl_s, settings.activity_ms, args.config or "(none)")
    def reload():
        """Run in a worker thread on SIGHUP: the new file and the settings it gives."""
        new = load_config(args.config)
        return new, effective_settings(args, new)

    reload = reload if args.config else None
    try:
        daemon = Daemon(settings, cfg, reload=reload)
    except ValueError as e:  # the HTTP endpoint's token or TLS files
        log.error("%s", e)
        return EXIT_USAGE
    return run_daemon(daemon.run, log)


def entry() -> None:
    sys.exit(main())
