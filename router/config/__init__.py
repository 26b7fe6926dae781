"""Configuration layer of lbmr-router: parse and check the XML configuration file.

Sans-IO apart from reading files: ``load_config`` reads the configuration
(and checks that the TLS files it names exist and are readable);
``parse_config`` takes text.  Both return an immutable :class:`RouterConfig`
and open no sockets.

The grammar is modelled on the DRO's ``<tnw-gateway>`` file (element names,
order, defaults, milliseconds), with ``<lbmr-router version="1.0">`` as the
root and ``<topic-resolution>``/``<relay>`` instead of a UM configuration
file; :data:`DTD_TEXT` (``router/config/router.dtd``, printed by ``lbmr-router -d``)
documents every element.  Following the DRO, the peer link is written in
child-element style (``<initiator><address>..</address><port>..</port>``,
``<acceptor><listen-port>..</listen-port>``, ``<name>``, ``<domain-id>``),
settings of our own (topic resolution, relay) as attributes of empty elements.

Pipeline, every failure raising :class:`ConfigError` (``path:line: message``,
the same class as lbmrd's):

1. XML parse with lxml (no entity expansion, no network, no XInclude, no DTD
   from the document itself).
2. Root checks: the root is ``<lbmr-router>`` and carries ``version="1.0"``.
3. Validation against our own DTD; libxml2 messages are rewritten into
   configuration terms (with hints for DRO elements we do not support).
4. Values: numbers and ranges, IPv4 addresses, port ranges, keepalive
   timing, TLS files; then unique portal names, domain ids and listen ports.
5. What this version supports: one or more ``<endpoint>``s with any number of
   ``<peer>``s, but at least two portals (a lone endpoint joins nothing).

Things accepted but suspicious are returned in :attr:`RouterConfig.warnings`
as ``(line, message)`` pairs.

This module holds the entry points (:func:`load_config`, :func:`parse_config`,
:func:`validate`), the root checks and the ``<daemon>`` checker, and is the
public face of the layer (its ``__all__`` names the values too).  The rest:

* :mod:`router.config.model` — the values (immutable dataclasses, defaults);
* :mod:`router.config.grammar` — the DTD and the translation of its messages;
* :mod:`router.config.checker` — the :class:`~router.config.checker.Checker`
  that collects errors and warnings, and the shared value parsers;
* :mod:`router.config.endpoint` — the checkers of an ``<endpoint>`` and its
  topic resolution, relay and LBT-RM elements;
* :mod:`router.config.peer` — the checkers of a ``<peer>`` and its TLS files;
* :mod:`router.config.cross_checks` — the checks that read across portals;
* :mod:`router.config.acl` — a portal's ``<acl>``.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from lxml import etree

from lbmr_runtime.http import load_token
from lbmr_runtime.xmlconfig import (
    ConfigError,
    element_text,
    parse_xml,
    raise_errors,
    read_config_file,
    refuse_entities_and_xinclude,
)

from .checker import INT_MAX, Checker, parse_ipv4, parse_number
from .cross_checks import check_across_portals, check_supported
from .endpoint import parse_endpoint
from .grammar import DTD_TEXT, dtd_errors
from .model import (
    DEFAULT_KEEPALIVE_INTERVAL_MS,
    DEFAULT_KEEPALIVE_TIMEOUT_MS,
    DEFAULT_LBMRD_PORT,
    DEFAULT_MAX_QUEUE,
    DEFAULT_MULTICAST_GROUP,
    DEFAULT_MULTICAST_PORT,
    DEFAULT_RECONNECT_INTERVAL_MS,
    DEFAULT_RELAY_PORTS,
    DEFAULT_REQUEST_PORT,
    DEFAULT_SOURCE_DELETION_DELAY_MS,
    DEFAULT_STATS_INTERVAL_MS,
    DEFAULT_TR_PORTS,
    MIN_MAX_QUEUE,
    AcceptorConfig,
    DomainRoute,
    EndpointConfig,
    InitialRequest,
    InitiatorConfig,
    InterestPacing,
    KeepaliveConfig,
    LbmrdAddress,
    LbtrmConfig,
    LogConfig,
    MonitorAccessConfig,
    MulticastResolver,
    PeerConfig,
    PortRange,
    RateLimit,
    RelayConfig,
    RemoteInterest,
    RequestListener,
    RouteInfoConfig,
    RouterConfig,
    TlsConfig,
    TopicResolution,
    UseQuery,
)
from .peer import parse_peer, parse_tls

__all__ = [
    "DTD_TEXT",
    "DEFAULT_STATS_INTERVAL_MS",
    "DEFAULT_MULTICAST_GROUP",
    "DEFAULT_MULTICAST_PORT",
    "DEFAULT_LBMRD_PORT",
    "DEFAULT_TR_PORTS",
    "DEFAULT_RELAY_PORTS",
    "DEFAULT_REQUEST_PORT",
    "DEFAULT_SOURCE_DELETION_DELAY_MS",
    "DEFAULT_RECONNECT_INTERVAL_MS",
    "DEFAULT_KEEPALIVE_INTERVAL_MS",
    "DEFAULT_KEEPALIVE_TIMEOUT_MS",
    "DEFAULT_MAX_QUEUE",
    "MIN_MAX_QUEUE",
    "ConfigError",
    "PortRange",
    "LogConfig",
    "MulticastResolver",
    "LbmrdAddress",
    "InitialRequest",
    "UseQuery",
    "InterestPacing",
    "RateLimit",
    "DomainRoute",
    "RemoteInterest",
    "TopicResolution",
    "RelayConfig",
    "RequestListener",
    "LbtrmConfig",
    "EndpointConfig",
    "InitiatorConfig",
    "AcceptorConfig",
    "KeepaliveConfig",
    "TlsConfig",
    "MonitorAccessConfig",
    "PeerConfig",
    "RouterConfig",
    "load_config",
    "parse_config",
    "validate",
]


# --------------------------------------------------------------------------- <daemon>


def _route_info(c: Checker, el: etree._Element | None) -> RouteInfoConfig:
    d = RouteInfoConfig()
    if el is None:
        return d
    interval = c.attr_ms(el, "propagation-interval", d.propagation_interval_ms)
    timeout = c.attr_ms(el, "timeout", d.timeout_ms)
    hops = c.attr_int(el, "max-hop-count", d.max_hop_count, "a hop count 1..255", 1, 255)
    if timeout <= interval:
        c.error(el, f"<route-info> timeout {timeout} ms must be greater than the propagation-interval "
                    f"{interval} ms: every router would time out between two announcements "
                    "(about 4 x the interval is advised)")
    return RouteInfoConfig(interval, timeout, hops, el.sourceline or 0)


def _monitor(c: Checker, m_el: etree._Element, daemon: etree._Element) -> MonitorAccessConfig:
    """``<metrics token-file="...">`` and ``<metrics-tls>``: who may read the endpoint."""
    token_file = None
    text = m_el.get("token-file")
    if text is not None:
        p = os.path.normpath(c.base_dir / Path(text.strip()).expanduser()) if text.strip() else ""
        if not p:
            c.error(m_el, '<metrics> token-file is empty: give the file holding the token')
        elif c.check_files:
            try:
                load_token(p)
            except ValueError as e:
                c.error(m_el, f"<metrics> {e}")
            else:
                token_file = p
        else:
            token_file = p
    tls_el = daemon.find("metrics-tls")
    tls = parse_tls(c, tls_el, peer=False) if tls_el is not None else None
    return MonitorAccessConfig(token_file, tls)


def _daemon(c: Checker, daemon: etree._Element) -> tuple[str, LogConfig, tuple[str, int] | None, int,
                                                        MonitorAccessConfig]:
    name = c.name(daemon.find("name"), "this router's name, unique among your routers")
    log = LogConfig()
    log_el = daemon.find("log")
    if log_el is not None:
        kind = log_el.get("type", "console")
        frequency = log_el.get("frequency", "disable")
        size = c.attr_int(log_el, "size", 0, "a size in MB 0..4000 (0 = no limit)", 0, 4000)
        text = element_text(log_el)
        file = None
        if kind == "file":
            if not text:
                c.error(log_el, '<log type="file"> needs the file name as its text, e.g. '
                                '<log type="file">/var/log/lbmr-router.log</log>')
            else:
                file = c.file_path(log_el)
        else:
            if text:
                c.warn(log_el, f'<log type="{kind}"> ignores its text "{text}": write '
                               'type="file" to log to a file')
            if log_el.get("frequency") is not None or log_el.get("size") is not None:
                c.warn(log_el, f'frequency and size roll a log file: they do nothing with type="{kind}"')
        log = LogConfig(kind, file, frequency, size)
    metrics = None
    access = MonitorAccessConfig()
    m_el = daemon.find("metrics")
    if m_el is not None:
        access = _monitor(c, m_el, daemon)
        text = element_text(m_el)
        host, colon, port_text = text.rpartition(":")
        try:
            if not colon:
                raise ValueError(f'"{text}" has no port: write ADDR:PORT, e.g. 127.0.0.1:9390')
            addr = "0.0.0.0" if host.strip() == "*" else parse_ipv4(host, "a local IPv4 address")
            port = parse_number(port_text, "a TCP port 1..65535", 1, 65535)
        except ValueError as e:
            c.error(m_el, f"<metrics> {e}")
        else:
            metrics = (addr, port)
            if not ipaddress.IPv4Address(addr).is_loopback and access.token_file is None:
                c.warn(m_el, f"<metrics> listens on {addr}, not on loopback: the endpoint has "
                             "no authentication, restrict access with a firewall")
    elif daemon.find("metrics-tls") is not None:
        c.error(daemon.find("metrics-tls"), "<metrics-tls> without <metrics>: give the endpoint's "
                                            "ADDR:PORT in <metrics>")
    stats = c.text_int(daemon.find("stats-interval"), DEFAULT_STATS_INTERVAL_MS,
                       f"milliseconds 0..{INT_MAX} (0 = no statistics in the log)", 0, INT_MAX)
    return name, log, metrics, stats, access

# --------------------------------------------------------------------------- parsing


def load_config(path: str | os.PathLike[str], *, check_files: bool = True) -> RouterConfig:
    """Read and check the configuration file at ``path``; ``ConfigError`` if invalid.

    Relative file names in it are relative to the file's directory.
    ``check_files=False`` skips opening the TLS files (e.g. to check a file
    meant for another host).
    """
    p = os.fspath(path)
    data = read_config_file(p)
    return parse_config(data, p, base_dir=Path(p).resolve().parent, check_files=check_files)


def validate(path: str | os.PathLike[str], *, check_files: bool = True) -> RouterConfig:
    """``lbmr-router -v``: the checked config (see its ``warnings``), else ``ConfigError``."""
    return load_config(path, check_files=check_files)


def parse_config(text: bytes | str, path: str | os.PathLike[str] = "<string>", *,
                 base_dir: str | os.PathLike[str] | None = None,
                 check_files: bool = True) -> RouterConfig:
    """Check configuration text; ``path`` is used in messages and ``RouterConfig.path``.

    Relative file names are resolved against ``base_dir`` (default: the
    directory of ``path``, or the current directory when ``path`` is a
    pseudo-name such as ``"<string>"``).
    """
    path = os.fspath(path)
    if base_dir is None:
        base_dir = Path.cwd() if path.startswith("<") else Path(path).resolve().parent
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    root = parse_xml(data, path, "lbmr-router")

    _check_root(path, root)
    errors = dtd_errors(root.getroottree())
    if errors:
        raise_errors(path, errors)

    c = Checker(path, Path(base_dir), check_files)
    name, log, metrics, stats, monitor = _daemon(c, root.find("daemon"))
    route_info = _route_info(c, root.find("daemon").find("route-info"))
    portals = root.find("portals")
    endpoints = [parse_endpoint(c, ep) for ep in portals.iterchildren("endpoint")]
    peers = [parse_peer(c, peer) for peer in portals.iterchildren("peer")]
    check_across_portals(c, endpoints, peers)
    if c.errors:
        raise_errors(path, c.errors)
    check_supported(c, root, endpoints, peers)
    if c.errors:
        raise_errors(path, c.errors)
    return RouterConfig(
        path=path, name=name, endpoints=tuple(endpoints), peers=tuple(peers), log=log,
        metrics=metrics, monitor=monitor, stats_interval_ms=stats,
        warnings=tuple(sorted(c.warnings, key=lambda w: w[0])), route_info=route_info,
    )


def _check_root(path: str, root: etree._Element) -> None:
    line = root.sourceline or 0
    if etree.QName(root).namespace is not None:
        raise ConfigError(path, line, f"the root element <{etree.QName(root).localname}> is in "
                                      f'the XML namespace "{etree.QName(root).namespace}": '
                                      "lbmr-router files use no namespaces")
    if root.tag != "lbmr-router":
        if root.tag == "tnw-gateway":
            hint = ("this looks like a DRO (tnwgd) file: rename the root to "
                    '<lbmr-router version="1.0"> and describe each endpoint\'s TRD with '
                    "<topic-resolution> (see lbmr-router -d)")
        elif root.tag == "lbmrd":
            hint = "this is an lbmrd configuration file, not a router configuration"
        else:
            hint = 'an lbmr-router configuration file starts with <lbmr-router version="1.0">'
        raise ConfigError(path, line, f"the root element is <{root.tag}>: {hint}")
    version = root.get("version")
    if version is None:
        raise ConfigError(path, line, 'missing version attribute: write <lbmr-router version="1.0">')
    if version != "1.0":
        raise ConfigError(path, line, f'unsupported version "{version}": the only lbmr-router '
                                      'configuration version is "1.0"')
    refuse_entities_and_xinclude(path, root, "lbmr-router")
