"""What lbmr-sim plays: :class:`SimConfig`, its checks, and the placement of
sources and receivers on contexts."""

from __future__ import annotations

import ipaddress
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from lbmr_proto import (
    LbtrmTransport,
    LbtruTransport,
    TcpTransport,
)
from lbmr_proto.constants import MAX_NAME_LEN
from lbmr_proto.um import (
    DEFAULT_MAX_DATAGRAM,
    Timing,
)

from .context import DEFAULT_DAEMON, REQUEST_PORT_BASE, Context
from .dataplane import (
    LIVE_RU_MIN_DATAGRAM,
    MAX_PAYLOAD,
    RM_MIN_DATAGRAM,
    RU_MAX_DATAGRAM,
)
from .netif import LOOPBACK, check_group, check_ipv4, check_loopback

Addr = tuple[str, int]

MAX_CONTEXTS = 1000
LBTRM_GROUP = "224.10.10.10"  # UM transport_lbtrm_multicast_address_low (advertised only)
LBTRM_DEST_PORT = 14400  # UM transport_lbtrm_destination_port (advertised only)
TRANSPORTS = ("tcp", "lbtru", "lbtrm")
PORT_BASES = {"tcp": 14371, "lbtru": 14380, "lbtrm": 14390}  # UM's *_port_low defaults
MC_GROUP = "224.9.10.11"  # UM resolver_multicast_address
MC_PORT = 12965  # UM resolver_multicast_port
MC_INTERFACE = "127.0.0.1"
# Messages (datagrams with LBT-RM) per second per source, and TCP payload bytes per message:
# 1,000 x 1 KiB, about 1 MB/s a source (1.4 MB/s over LBT-RU), so that a routed pair carries a
# hundred default sources (the LBT-RU relay sends a system call per datagram: thousands a second,
# not tens of thousands). lbmr-sim(1), DATA RATE.
DEFAULT_DATA_RATE = 1000.0
DEFAULT_DATA_MESSAGE_SIZE = 1024
MAX_DATA_DATAGRAMS = 10_000_000
# LBT-RM: the sources' NAK ignore interval and the receivers' wait between NAKs of one datagram, seconds
# (UM's defaults: 500 ms and 200 ms; the ignore interval is shorter here, so that loopback sessions recover
# quickly)
DEFAULT_IGNORE_INTERVAL = 0.05
DEFAULT_NAK_BACKOFF = 0.2
MAX_REQUESTS = 1_000_000  # requests per source, and messages between two
MAX_RETENTION = 1_000_000  # messages retained per source (a range: payloads are derived)


# ---------------------------------------------------------------- topology


@dataclass
class SimConfig:
    """What :func:`run_sim` plays.

    Unicast mode (``multicast`` is None): the contexts talk to ``daemons``
    (empty: 127.0.0.1:15380). Multicast mode: ``multicast`` is the (group,
    port) every context sends to and listens on, ``daemons`` must be empty,
    ``mc_interface`` is the address of the interface used for the group
    membership and for sending (IP_MULTICAST_IF), ``mc_ttl`` (0 or 1) the
    multicast TTL: 0 never leaves the host, 1 reaches the link.

    ``bind`` is every context's local address unless ``bind_base`` is given
    (context i then uses ``bind_base + i``); None means 127.0.0.1, or the
    multicast interface's address when that is not a loopback address (the
    only address allowed then). In multicast mode it is the source address
    of the context's datagrams (the socket itself is bound to the group's
    port). ``source_ip`` is advertised in the TIRs ("0.0.0.0" lets lbmrd fill
    in the sender's address; "bind" advertises each context's own address);
    None means "0.0.0.0" with daemons and "bind" with multicast (no lbmrd
    fills anything in there). ``source_port_base`` defaults per transport
    (tcp 14371, lbtru 14380, lbtrm 14390); source number n (counted over all
    contexts) advertises port ``base + n``. ``keep_running`` runs the full
    ``duration`` even after every receiver has resolved. ``record_sent``
    keeps every sent datagram in :attr:`SimResult.sent`.

    Data (see :mod:`lbmr_tools.sim.dataplane`): with ``data_bytes`` TCP sources
    send one live stream of LBMC messages (``data_message_size`` payload bytes
    each, at most ``data_bytes``; ``data_rate`` messages per second) to every
    receiver connected, each of which verifies ``data_bytes`` payload bytes
    of whole, consecutive messages from the first it gets; with
    ``data_datagrams`` LBT-RU sources send one live session of LBMC
    messages (one per UM LBT-RU DATA datagram of ``data_datagram_size``
    bytes, ``data_rate`` per second; :mod:`.dataplane.rulive`) to every
    receiver connected, each of which verifies that many consecutive
    messages from the first it gets, and LBT-RM sources multicast that many to
    their group and port once (real LBT-RM datagrams; they answer NAKs with
    retransmissions; the interface needs multicast, e.g. lo inside a network
    namespace). With ``lbtru_wire`` "um" receivers of LBT-RU sources verify
    numbered datagrams instead (:mod:`.dataplane.umru`: for a router's LBT-RU
    proxy of an LBT-RM source; the payload is checked as an LBT-RM source's). LBT-RM and LBT-RU receivers with ``data_drop_every`` n > 0 discard the
    first copy of every n-th datagram on purpose and recover it by NAK
    (LBT-RM receivers: the first ``data_drop_copies`` copies, so they lose
    retransmissions too). LBT-RM sources answer a NAK for a datagram they
    retransmitted less than ``data_ignore_interval`` seconds before with an
    NCF "NAK ignored" (UM's transport_lbtrm_ignore_interval); LBT-RM
    receivers NAK a missing datagram again every ``data_nak_backoff``
    seconds (UM's transport_lbtrm_nak_backoff_interval); with
    ``data_source_linger`` an LBT-RM source exits (closes its socket) that
    many seconds after its last datagram. Each source binds its data socket on its
    context's address and the port it advertises (a kernel-chosen one, then
    advertised, when that port is taken). The stream of topic T is keyed by
    ``topic_seed(T, data_seed)``. With ``verify_data`` every receiver, once
    resolved, fetches and verifies the data of the address it resolved,
    expecting ``data_bytes`` (TCP) or ``data_datagrams`` (LBT-RU, LBT-RM), reading
    TCP at most ``data_rate_limit`` bytes per second when given; the run
    then also waits for the data.

    UM's request/response, late join and OTR (TCP sources; see
    :mod:`.dataplane.umtcp`): with ``requests`` n > 0 every source sends n
    requests, on messages ``request_interval``, ``2 * request_interval``, ...
    of its stream, naming its context's request port, and every receiver
    responds to each request it gets; ``retention`` keeps the last that many
    messages of each source for ``late_join`` receivers (which ask for them
    once the first live message is in) and ``otr`` receivers (which ask for
    every message missing from the stream; ``data_drop_every`` n discards
    some on purpose). With any of these every context opens its request
    port (UM's request_tcp_port: 14391 + context index, or a kernel-chosen
    port when taken) and advertises it.

    Unicast immediate messages by domain: with ``uim`` (domain, ip, port),
    UM's ``TCP:domain:ip:port``, context 0 sends ``uim_count`` UIMs there
    once it has heard, in its TRD, a router's remote domain route record for
    that domain (LBMR ext 6): to the router's request listener the record
    names, each with a DESTINATION header (orig: the context's domain as the
    routers' records say it, its address and request port).
    ``request_ports`` opens every context's request port without requests:
    a context that takes UIMs (counted in its port's report). With either,
    contexts keep themselves known to their lbmrds even without sources or
    receivers (UM's ``resolver_unicast_force_alive``), to hear the records."""

    daemons: list[Addr] = field(default_factory=list)
    contexts: int = 4
    topics: int = 4
    sources_per_topic: int = 1
    receivers_per_context: int = 1
    transport: str = "tcp"
    source_ip: str | None = None
    source_port_base: int | None = None
    bind: str | None = None
    bind_base: str | None = None
    duration: float = 10.0
    keep_running: bool = False
    pcap: str | None = None
    seed: int | None = None
    topic_prefix: str = "md."
    max_datagram: int = DEFAULT_MAX_DATAGRAM
    timing: Timing = field(default_factory=Timing)
    record_sent: bool = False
    multicast: Addr | None = None
    mc_interface: str = MC_INTERFACE
    mc_ttl: int = 0
    data_bytes: int | None = None
    data_datagrams: int | None = None
    data_seed: int = 0
    data_rate: float = DEFAULT_DATA_RATE
    data_datagram_size: int = RU_MAX_DATAGRAM
    data_message_size: int = DEFAULT_DATA_MESSAGE_SIZE
    data_rate_limit: float | None = None
    verify_data: bool = False
    data_drop_every: int = 0
    data_drop_copies: int = 1
    data_ignore_interval: float = DEFAULT_IGNORE_INTERVAL
    data_nak_backoff: float = DEFAULT_NAK_BACKOFF
    data_source_linger: float | None = None
    lbtru_wire: str = "sim"
    requests: int = 0
    request_interval: int = 100
    retention: int = 0
    late_join: bool = False
    otr: bool = False
    uim: tuple[int, str, int] | None = None
    uim_count: int = 10
    request_ports: bool = False

    @property
    def uses_uim(self) -> bool:
        """Requests, late join or OTR (modelled on TCP sources' streams)."""
        return bool(self.requests or self.late_join or self.otr)

    @property
    def opens_request_ports(self) -> bool:
        """Every context opens its request port: for requests, late join or OTR, to
        send UIMs by domain (``uim``: the replies' address) or to take them
        (``request_ports``)."""
        return self.uses_uim or self.uim is not None or self.request_ports


def daemon_list(cfg: SimConfig) -> list[Addr]:
    """The daemons the contexts use: none in multicast mode, else
    ``cfg.daemons`` or the default 127.0.0.1:15380."""
    if cfg.multicast is not None:
        return []
    return list(cfg.daemons) or [DEFAULT_DAEMON]


def source_ip_of(cfg: SimConfig) -> str:
    """The effective ``source_ip``: an address or "bind"."""
    if cfg.source_ip is not None:
        return cfg.source_ip
    return "bind" if cfg.multicast is not None else "0.0.0.0"


def _loopback_interface(cfg: SimConfig) -> bool:
    return cfg.multicast is None or check_ipv4(cfg.mc_interface, "multicast interface") in LOOPBACK


def bind_addresses(cfg: SimConfig) -> list[str]:
    """The local address of each context (in multicast mode: the source
    address of its datagrams)."""
    if not _loopback_interface(cfg):
        if cfg.bind_base is not None or cfg.bind not in (None, cfg.mc_interface):
            raise ValueError(f"with the non-loopback multicast interface {cfg.mc_interface} every "
                             "context sends from that address; --bind/--bind-base do not apply")
        return [cfg.mc_interface] * cfg.contexts
    if cfg.bind_base is None:
        bind = "127.0.0.1" if cfg.bind is None else cfg.bind
        check_loopback(bind, "bind address")
        return [bind] * cfg.contexts
    base = check_loopback(cfg.bind_base, "bind base")
    last = int(base) + cfg.contexts - 1
    if last > int(LOOPBACK.broadcast_address) - 1:
        raise ValueError(f"bind base {cfg.bind_base} + {cfg.contexts} contexts leaves 127.0.0.0/8")
    return [str(ipaddress.IPv4Address(int(base) + i)) for i in range(cfg.contexts)]


def topic_names(cfg: SimConfig) -> list[str]:
    return [f"{cfg.topic_prefix}{j}" for j in range(cfg.topics)]


def check_config(cfg: SimConfig) -> None:
    """Raise ValueError with a readable message if ``cfg`` cannot be played."""
    if not 1 <= cfg.contexts <= MAX_CONTEXTS:
        raise ValueError(f"contexts must be 1..{MAX_CONTEXTS}")
    if cfg.topics < 0 or cfg.sources_per_topic < 0 or cfg.receivers_per_context < 0:
        raise ValueError("topics, sources per topic and receivers per context must be >= 0")
    if cfg.receivers_per_context > cfg.topics:
        raise ValueError(f"receivers per context ({cfg.receivers_per_context}) exceeds the number "
                         f"of topics ({cfg.topics})")
    if cfg.multicast is not None:
        if cfg.daemons:
            raise ValueError("--daemon and --multicast are mutually exclusive: a context uses "
                             "lbmrds or a multicast group")
        group, port = cfg.multicast
        check_group(group)
        if not 1 <= port <= 65535:
            raise ValueError(f"multicast port {port} out of range")
        check_ipv4(cfg.mc_interface, "multicast interface")
        if cfg.mc_ttl not in (0, 1):
            raise ValueError(f"multicast TTL must be 0 (host) or 1 (link), not {cfg.mc_ttl}")
    seen = set()
    for ip, port in cfg.daemons:
        check_loopback(ip, "daemon address")
        if not 1 <= port <= 65535:
            raise ValueError(f"daemon port {port} out of range")
        if (ip, port) in seen:
            raise ValueError(f"daemon {ip}:{port} given twice")
        seen.add((ip, port))
    bind_addresses(cfg)
    if cfg.transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}")
    source_ip = source_ip_of(cfg)
    if source_ip != "bind":
        try:
            ipaddress.IPv4Address(source_ip)
        except ValueError:
            raise ValueError(f"source IP {source_ip!r} is neither an IPv4 address nor 'bind'") from None
    base = PORT_BASES[cfg.transport] if cfg.source_port_base is None else cfg.source_port_base
    n = cfg.topics * cfg.sources_per_topic
    if not 1 <= base or base + max(n, 1) - 1 > 65535:
        raise ValueError(f"source ports {base}..{base + n - 1} do not fit in 1..65535")
    if cfg.topics and len(f"{cfg.topic_prefix}{cfg.topics - 1}".encode()) >= MAX_NAME_LEN:
        raise ValueError("topic names would be longer than 255 bytes")
    if "\0" in cfg.topic_prefix:
        raise ValueError("the topic prefix contains a NUL")
    if not (cfg.duration > 0 and math.isfinite(cfg.duration)):
        raise ValueError("duration must be a positive number of seconds")
    if cfg.max_datagram > 65507:
        raise ValueError("max datagram larger than a UDP datagram")
    check_data_config(cfg)


def check_data_config(cfg: SimConfig) -> None:
    """The data options' part of :func:`check_config`."""
    if cfg.data_bytes is not None and cfg.data_bytes < 1:
        raise ValueError("data bytes must be >= 1")
    if cfg.data_datagrams is not None and not 1 <= cfg.data_datagrams <= MAX_DATA_DATAGRAMS:
        raise ValueError(f"data datagrams must be 1..{MAX_DATA_DATAGRAMS}")
    if not 0 <= cfg.data_seed < 1 << 64:
        raise ValueError("data seed must be in 0..2**64-1")
    if not (cfg.data_rate > 0 and math.isfinite(cfg.data_rate)):
        raise ValueError("data rate must be a positive number of datagrams per second")
    low = RM_MIN_DATAGRAM if cfg.transport == "lbtrm" else LIVE_RU_MIN_DATAGRAM
    if not low <= cfg.data_datagram_size <= RU_MAX_DATAGRAM:
        raise ValueError(f"data datagram size must be {low}..{RU_MAX_DATAGRAM} bytes")
    if not 1 <= cfg.data_message_size <= MAX_PAYLOAD:
        raise ValueError(f"data message size must be 1..{MAX_PAYLOAD} bytes")
    if cfg.lbtru_wire not in ("sim", "um"):
        raise ValueError(f"lbtru_wire {cfg.lbtru_wire!r}: sim or um")
    if cfg.data_drop_every < 0:
        raise ValueError("data drop interval must be >= 0")
    if cfg.data_drop_copies < 1:
        raise ValueError("data drop copies must be >= 1")
    if not (cfg.data_ignore_interval >= 0 and math.isfinite(cfg.data_ignore_interval)):
        raise ValueError("data ignore interval must be a non-negative number of seconds")
    if not (cfg.data_nak_backoff > 0 and math.isfinite(cfg.data_nak_backoff)):
        raise ValueError("data NAK backoff must be a positive number of seconds")
    if cfg.data_source_linger is not None and not (cfg.data_source_linger >= 0
                                                   and math.isfinite(cfg.data_source_linger)):
        raise ValueError("data source linger must be a non-negative number of seconds")
    lbtrm_only = [opt for opt, v in (("--data-drop-copies", cfg.data_drop_copies != 1),
                                     ("--data-ignore-interval", cfg.data_ignore_interval != DEFAULT_IGNORE_INTERVAL),
                                     ("--data-nak-backoff", cfg.data_nak_backoff != DEFAULT_NAK_BACKOFF),
                                     ("--data-source-linger", cfg.data_source_linger is not None)) if v]
    if lbtrm_only and cfg.transport != "lbtrm":
        raise ValueError(f"{', '.join(lbtrm_only)}: for LBT-RM sources and receivers (--transport lbtrm)")
    if cfg.data_rate_limit is not None and not (cfg.data_rate_limit > 0
                                                and math.isfinite(cfg.data_rate_limit)):
        raise ValueError("data rate limit must be a positive number of bytes per second")
    if not 0 <= cfg.requests <= MAX_REQUESTS or not 1 <= cfg.request_interval <= MAX_REQUESTS:
        raise ValueError(f"requests must be 0..{MAX_REQUESTS} and the request interval 1..{MAX_REQUESTS}")
    if not 0 <= cfg.retention <= MAX_RETENTION:
        raise ValueError(f"retention must be 0..{MAX_RETENTION} messages")
    if cfg.uses_uim or cfg.retention:
        if cfg.transport != "tcp" or cfg.data_bytes is None:
            raise ValueError("requests, retention, late join and OTR are modelled for TCP sources "
                             "with --data-bytes")
    if (cfg.late_join or cfg.otr) and not cfg.retention:
        raise ValueError("late join and OTR need sources with a retention buffer (--retention)")
    if cfg.transport == "tcp" and cfg.data_drop_every and not cfg.otr:
        raise ValueError("TCP receivers discard messages on purpose only with --otr (to recover them)")
    if cfg.topics * cfg.sources_per_topic:
        if cfg.data_bytes is not None and cfg.transport != "tcp":
            raise ValueError(f"--data-bytes is for TCP sources; these sources use {cfg.transport} "
                             "(--data-datagrams is for lbtru)")
        if cfg.data_datagrams is not None and cfg.transport not in ("lbtru", "lbtrm"):
            raise ValueError(f"--data-datagrams is for LBT-RU and LBT-RM sources; these sources use "
                             f"{cfg.transport} (--data-bytes is for tcp)")
    if cfg.verify_data and cfg.data_bytes is None and cfg.data_datagrams is None:
        raise ValueError("--verify-data needs --data-bytes (TCP) or --data-datagrams (LBT-RU, LBT-RM): "
                         "how much data to expect")


def serves_data(cfg: SimConfig) -> bool:
    """Whether the sources of ``cfg`` serve data."""
    return bool(cfg.topics * cfg.sources_per_topic) and (
        (cfg.transport == "tcp" and cfg.data_bytes is not None)
        or (cfg.transport in ("lbtru", "lbtrm") and cfg.data_datagrams is not None))


def make_transport(kind: str, ip: str, port: int, rng: random.Random):
    if kind == "tcp":
        return TcpTransport(ip, port)
    if kind == "lbtru":
        return LbtruTransport(ip, port)
    if kind == "lbtrm":
        return LbtrmTransport(ip, LBTRM_GROUP, rng.getrandbits(32), LBTRM_DEST_PORT, port)
    raise ValueError(f"unknown transport {kind!r}")


def receiver_topics(i: int, topics: list[str], local: set[str], count: int) -> list[str]:
    """Topics for context ``i``'s receivers: starting after topic ``i``,
    those it does not source itself first, then the ones it does."""
    n = len(topics)
    order = [topics[(i + 1 + m) % n] for m in range(n)]
    picked = [t for t in order if t not in local] + [t for t in order if t in local]
    return picked[:count]


def source_placement(cfg: SimConfig) -> list[tuple[int, str, int]]:
    """(context index, topic, source number n) of every source, in order:
    source k of topic j lives on context ``(j * sources_per_topic + k) mod
    contexts`` and is source number ``j * sources_per_topic + k``."""
    out = []
    for j, topic in enumerate(topic_names(cfg)):
        for k in range(cfg.sources_per_topic):
            n = j * cfg.sources_per_topic + k
            out.append((n % cfg.contexts, topic, n))
    return out


def source_port_base(cfg: SimConfig) -> int:
    return PORT_BASES[cfg.transport] if cfg.source_port_base is None else cfg.source_port_base


def build_contexts(cfg: SimConfig, addrs: Sequence[Addr], start: float,
                   rng: random.Random, ports: Sequence[int] | None = None,
                   request_ports: Sequence[int] | None = None, ready: bool = True) -> list[Context]:
    """Place sources and receivers: source k of topic j lives on context
    ``(j * sources_per_topic + k) mod contexts``; each context gets
    ``receivers_per_context`` receivers (see :func:`receiver_topics`).
    Source number n advertises ``ports[n]`` (default: the port base + n),
    context i the request port ``request_ports[i]`` (default 14391 + i).
    With ``ready`` False the sources wait for ``Context.source_ready`` (their
    data ports) before they advertise."""
    daemons = daemon_list(cfg)
    ctxs = [Context(daemons, multicast=cfg.multicast, timing=cfg.timing, start=start,
                    src_id=rng.randbytes(8), rng=rng, index=i, local_ip=addrs[i][0],
                    max_datagram=cfg.max_datagram, late_join=cfg.transport == "tcp" and cfg.retention > 0,
                    # a context that sends or takes UIMs by domain must hear the routers' records
                    # without sources or receivers (UM's resolver_unicast_force_alive)
                    force_alive=cfg.uim is not None or cfg.request_ports,
                    request_port=REQUEST_PORT_BASE + i if request_ports is None else request_ports[i])
            for i in range(cfg.contexts)]
    topics = topic_names(cfg)
    base = source_port_base(cfg)
    source_ip = source_ip_of(cfg)
    for ci, topic, n in source_placement(cfg):
        ctx = ctxs[ci]
        ip = ctx.local_ip if source_ip == "bind" else source_ip
        port = base + n if ports is None else ports[n]
        ctx.add_source(topic, make_transport(cfg.transport, ip, port, rng), now=start, ready=ready)
    for i, ctx in enumerate(ctxs):
        local = {s.topic for s in ctx.sources}
        for topic in receiver_topics(i, topics, local, cfg.receivers_per_context):
            ctx.add_receiver(topic, now=start)
    return ctxs
