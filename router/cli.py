"""lbmr-router command line. See lbmr-router(8).

Exit status: 0 normal stop or valid file; 1 invalid configuration;
2 usage error; 3 socket error; 4 fatal runtime error.
"""

from __future__ import annotations

import argparse
import logging
import ssl
import sys

from lbmr_runtime.netif import InterfaceError, resolve_interface
from lbmr_runtime.process import EXIT_CONFIG, EXIT_USAGE, run_daemon, setup_logging

from .daemon import EndpointSettings, PeerSettings
from .multi import MultiRouter, MultiSettings

log = logging.getLogger("lbmr-router")


def tls_context(tls, server_side: bool) -> ssl.SSLContext:
    """Mutual authentication: our certificate, and the peer's must chain to the CA."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls.certificate, tls.certificate_key, password=tls.certificate_key_password)
    if tls.trusted_certificates:
        ctx.load_verify_locations(tls.trusted_certificates)
    else:
        ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH if server_side else ssl.Purpose.SERVER_AUTH)
    ctx.check_hostname = False  # peers are identified by their certificate chain, not a host name
    ctx.verify_mode = ssl.CERT_REQUIRED
    if tls.cipher_suites:
        ctx.set_ciphers(tls.cipher_suites)
    return ctx


def _iface(spec: str | None, default: str) -> str:
    """An interface spec of the file (address, CIDR, device) as an address."""
    return default if not spec else resolve_interface(spec)


def _endpoint_settings(e) -> EndpointSettings:
    tr = e.topic_resolution
    if tr.kind == "multicast":
        ep = EndpointSettings(e.name, e.domain_id, mode="multicast",
                              multicast=(tr.multicast.group, tr.multicast.port),
                              tr_ip=_iface(tr.interface, "127.0.0.1"))
    else:
        ep = EndpointSettings(e.name, e.domain_id, mode="lbmrd",
                              daemons=[(d.address, d.port) for d in tr.lbmrds],
                              tr_ip=_iface(tr.interface, "0.0.0.0"),
                              tr_port_low=tr.port_range.low if tr.port_range else 0,
                              tr_port_high=tr.port_range.high if tr.port_range else 0)
    ep.relay_ip = _iface(e.relay.interface, "0.0.0.0")
    ep.relay_port_low, ep.relay_port_high = e.relay.ports.low, e.relay.ports.high
    ep.source_deletion_delay = e.source_deletion_delay_ms / 1000.0
    return ep


def _peer_settings(p) -> PeerSettings:
    ka = p.keepalive
    peer = PeerSettings(p.name, p.role, max_queue=p.max_queue,
                        keepalive_interval=ka.interval_ms / 1000.0 if ka.idle else 0.0,
                        dead_after=ka.timeout_ms / 1000.0)
    if p.role == "initiator":
        peer.address, peer.port = p.initiator.address, p.initiator.port
        peer.reconnect_interval = p.initiator.reconnect_interval_ms / 1000.0
    else:
        peer.listen_ip, peer.port = _iface(p.interface, "0.0.0.0"), p.acceptor.listen_port
    if p.tls is not None:
        peer.tls = tls_context(p.tls, server_side=(p.role == "acceptor"))
    return peer


def settings_from_config(cfg, *, handle_signals: bool = True) -> MultiSettings:
    """The running router's settings: every endpoint portal, every peer portal."""
    return MultiSettings(cfg.name, [_endpoint_settings(e) for e in cfg.endpoints],
                         [_peer_settings(p) for p in cfg.peers], metrics=cfg.metrics,
                         handle_signals=handle_signals)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lbmr-router", description="Topic Resolution Domain router for "
                                "Ultra Messaging (lbmr-kit): endpoint portals joined directly or to TCP peer links.")
    p.add_argument("config", nargs="?", help="XML configuration file")
    p.add_argument("-v", "--validate", action="store_true", help="validate the configuration file and exit")
    p.add_argument("-d", "--dump-dtd", action="store_true", help="print the configuration DTD and exit")
    p.add_argument("-L", "--logfile", metavar="FILE", help="log to FILE instead of stdout")
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
        setup_logging(args.logfile, args.log_format, logging.DEBUG if args.debug else logging.INFO,
                      name="lbmr-router")
    except OSError as e:
        print(f"lbmr-router: cannot open log file: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        settings = settings_from_config(cfg)
    except InterfaceError as e:
        log.error("%s", e)
        return EXIT_CONFIG
    except (ssl.SSLError, OSError) as e:
        log.error("TLS setup failed: %s", e)
        return EXIT_CONFIG
    log.info("lbmr-router %s starting: endpoints %s, peers %s", cfg.name,
             ", ".join(f"{e.name} (domain {e.domain_id})" for e in cfg.endpoints),
             ", ".join(f"{p.name} ({p.role})" for p in cfg.peers) or "none (direct link)")
    return run_daemon(MultiRouter(settings).run, log)


def entry() -> None:
    sys.exit(main())
