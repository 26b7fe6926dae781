"""lbmr-router command line. See lbmr-router(8).

Exit status: 0 normal stop or valid file; 1 invalid configuration;
2 usage error; 3 socket error; 4 fatal runtime error.
"""

from __future__ import annotations

import argparse
import logging
import ssl
import sys
from functools import partial

import trio

from lbmr_runtime.netif import InterfaceError
from lbmr_runtime.process import (
    EXIT_CONFIG,
    EXIT_USAGE,
    raise_open_files_limit,
    run_daemon,
    setup_logging,
)

from .logs import log_handler, stats_line
from .shell.link_task import tls_context
from .shell.router import MultiRouter

__all__ = ["build_parser", "check_settings", "entry", "main", "tls_context"]

log = logging.getLogger("lbmr-router")


def check_settings(cfg) -> None:
    """What the running router will need from the file, checked before it
    starts: every interface names a local address (:exc:`InterfaceError`) and
    every TLS context loads (:exc:`ssl.SSLError`, :exc:`OSError`)."""
    for e in cfg.endpoints:
        _ = e.tr_ip, e.relay_ip
    for p in cfg.peers:
        if p.role == "acceptor":
            _ = p.listen_ip
        if p.tls is not None:
            tls_context(p.tls, server_side=(p.role == "acceptor"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lbmr-router", description="Topic Resolution Domain router for "
                                "Ultra Messaging (lbmr-kit): endpoint portals joined directly or to TCP peer links.")
    p.add_argument("config", nargs="?", help="XML configuration file")
    p.add_argument("-v", "--validate", action="store_true", help="validate the configuration file and exit")
    p.add_argument("-d", "--dump-dtd", action="store_true", help="print the configuration DTD and exit")
    p.add_argument("-L", "--logfile", metavar="FILE",
                   help="log to FILE (instead of the file's <log>, or stdout)")
    p.add_argument("--log-format", choices=["text", "json"], default="text", help="log line format (UTC)")
    p.add_argument("--debug", action="store_true", help="debug logging")
    return p


def main(argv: list[str] | None = None) -> int:
    from .config import DTD_TEXT, ConfigError, load_config

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code else 0
    if args.dump_dtd:
        sys.stdout.write(DTD_TEXT)
        return 0
    if not args.config:
        parser.print_usage(sys.stderr)
        print("lbmr-router: a configuration file is required", file=sys.stderr)
        return EXIT_USAGE
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        print(f"lbmr-router: {e.format_all()}", file=sys.stderr)
        return EXIT_CONFIG
    for line, msg in cfg.warnings:
        print(f"lbmr-router: {args.config}:{line}: warning: {msg}", file=sys.stderr)
    if args.validate:
        print(f"{args.config}: valid")
        return 0
    try:
        handler = None if args.logfile else log_handler(cfg.log)
        setup_logging(args.logfile, args.log_format, logging.DEBUG if args.debug else logging.INFO,
                      name="lbmr-router", handler=handler)
    except OSError as e:
        print(f"lbmr-router: cannot open log file: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        check_settings(cfg)
    except InterfaceError as e:
        log.error("%s", e)
        return EXIT_CONFIG
    except (ssl.SSLError, OSError) as e:
        log.error("TLS setup failed: %s", e)
        return EXIT_CONFIG
    old, new = raise_open_files_limit()
    if new != old:
        log.info("open files limit raised from %d to %d (a descriptor per proxy and per relayed session)",
                 old, new)
    log.info("lbmr-router %s starting: endpoints %s, peers %s", cfg.name,
             ", ".join(f"{e.name} (domain {e.domain_id})" for e in cfg.endpoints),
             ", ".join(f"{p.name} ({p.role})" for p in cfg.peers) or "none (direct link)")
    return run_daemon(partial(run_router, MultiRouter(cfg, handle_signals=True),
                              cfg.stats_interval_ms / 1000.0), log)


async def run_router(router: MultiRouter, stats_interval: float, *,
                     task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run ``router``; every ``stats_interval`` seconds (0 = never) log its
    statistics line (:func:`router.logs.stats_line`), and once more at the end."""
    async with trio.open_nursery() as n:
        if stats_interval > 0:
            n.start_soon(_stats_loop, router, stats_interval)
        try:
            await router.run(task_status=task_status)
        finally:
            n.cancel_scope.cancel()
            if router.links:
                log.info("final %s", stats_line(router))


async def _stats_loop(router: MultiRouter, interval: float) -> None:
    while True:
        await trio.sleep(interval)
        log.info("%s", stats_line(router))


def entry() -> None:
    sys.exit(main())
