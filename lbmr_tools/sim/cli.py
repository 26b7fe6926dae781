"""``lbmr-sim``, the command: options to :class:`SimConfig`, run, report."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence

import click
import trio

from lbmr_proto.um import (
    DEFAULT_MAX_DATAGRAM,
    TIMING_FIELDS,
    Timing,
)

from .config import (
    DEFAULT_DATA_MESSAGE_SIZE,
    DEFAULT_DATA_RATE,
    DEFAULT_IGNORE_INTERVAL,
    DEFAULT_NAK_BACKOFF,
    MAX_CONTEXTS,
    MAX_DATA_DATAGRAMS,
    MAX_REQUESTS,
    MAX_RETENTION,
    MC_GROUP,
    MC_INTERFACE,
    MC_PORT,
    TRANSPORTS,
    SimConfig,
    check_config,
    source_ip_of,
)
from .context import DEFAULT_DAEMON
from .dataplane import (
    MAX_PAYLOAD,
    RM_MIN_DATAGRAM,
    RU_MAX_DATAGRAM,
    parse_uim_address,
)
from .netif import check_group, check_loopback
from .report import exit_status, render
from .runner import run_sim

Addr = tuple[str, int]

# ---------------------------------------------------------------------- CLI


def parse_hostport(text: str) -> Addr:
    """``IP:PORT`` -> (ip, port); the IP must be in 127.0.0.0/8."""
    ip, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected IP:PORT, got {text!r}")
    p = int(port)
    if not 1 <= p <= 65535:
        raise ValueError(f"port out of range in {text!r}")
    check_loopback(ip, "daemon address")
    return ip, p


def parse_group(text: str) -> Addr:
    """``GROUP[:PORT]`` -> (group, port); the group must be in 224.0.0.0/4,
    the port defaults to 12965 (UM's resolver_multicast_port)."""
    group, sep, port = text.partition(":")
    if sep and not port.isdigit():
        raise ValueError(f"expected GROUP[:PORT], got {text!r}")
    p = int(port) if sep else MC_PORT
    if not 1 <= p <= 65535:
        raise ValueError(f"port out of range in {text!r}")
    check_group(group)
    return group, p


def parse_timing(items: Iterable[str]) -> Timing:
    """``FIELD=SECONDS`` overrides of :class:`Timing`."""
    kw: dict[str, float] = {}
    for it in items:
        name, sep, val = it.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in TIMING_FIELDS:
            raise ValueError(f"expected FIELD=SECONDS with FIELD one of {', '.join(TIMING_FIELDS)}; got {it!r}")
        try:
            kw[name] = float(val)
        except ValueError:
            raise ValueError(f"not a number of seconds: {val!r}") from None
    return Timing(**kw)


SIZE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``N`` or ``N`` followed by K, M or G (powers of 1024) -> a positive
    number of bytes."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    num, suffix = (t[:-1], t[-1]) if t and t[-1] in "KMG" else (t, "")
    if not num.isdigit():
        raise ValueError(f"expected a number of bytes, optionally with K, M or G; got {text!r}")
    n = int(num) * SIZE_SUFFIXES[suffix]
    if n < 1:
        raise ValueError(f"expected at least 1 byte, got {text!r}")
    return n


def _size_cb(ctx, param, value):
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _daemons_cb(ctx, param, values):
    try:
        return [parse_hostport(v) for v in values]
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _group_cb(ctx, param, value):
    if value is None:
        return None
    try:
        return parse_group(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _uim_cb(ctx, param, value):
    if value is None:
        return None
    try:
        return parse_uim_address(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _timing_cb(ctx, param, values):
    try:
        return parse_timing(values)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def config_from_params(params: dict) -> SimConfig:
    """Build a SimConfig from the command's parsed parameters."""
    multicast = params["multicast"]
    daemons = list(params["daemons"])
    if multicast is not None and daemons:
        raise ValueError("--daemon and --multicast are mutually exclusive")
    if multicast is None:
        for opt in ("mc_interface", "mc_ttl"):
            if params[opt] is not None:
                raise ValueError(f"--{opt.replace('_', '-')} needs --multicast")
    cfg = SimConfig(
        daemons=daemons or ([] if multicast is not None else [DEFAULT_DAEMON]),
        multicast=multicast,
        mc_interface=MC_INTERFACE if params["mc_interface"] is None else params["mc_interface"],
        mc_ttl=0 if params["mc_ttl"] is None else params["mc_ttl"],
        contexts=params["contexts"], topics=params["topics"],
        sources_per_topic=params["sources_per_topic"],
        receivers_per_context=params["receivers_per_context"],
        transport=params["transport"].lower(), source_ip=params["source_ip"],
        source_port_base=params["source_port_base"], bind=params["bind"], bind_base=params["bind_base"],
        duration=params["duration"], keep_running=params["keep_running"], pcap=params["pcap"],
        seed=params["seed"], topic_prefix=params["topic_prefix"], max_datagram=params["max_datagram"],
        timing=params["timing"], data_bytes=params["data_bytes"],
        data_datagrams=params["data_datagrams"], data_seed=params["data_seed"],
        data_rate=params["data_rate"], data_datagram_size=params["data_datagram_size"],
        data_message_size=params["data_message_size"],
        data_rate_limit=params["data_rate_limit"], verify_data=params["verify_data"],
        data_drop_every=params["data_drop_every"], data_drop_copies=params["data_drop_copies"],
        data_ignore_interval=params["data_ignore_interval"], data_nak_backoff=params["data_nak_backoff"],
        data_source_linger=params["data_source_linger"], lbtru_wire=params["lbtru_wire"],
        requests=params["requests"], request_interval=params["request_interval"],
        retention=params["retention"], late_join=params["late_join"], otr=params["otr"],
        uim=params["uim"], uim_count=params["uim_count"], request_ports=params["request_ports"])
    check_config(cfg)
    cfg.source_ip = source_ip_of(cfg)
    return cfg


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--daemon", "daemons", multiple=True, metavar="IP:PORT", callback=_daemons_cb,
              help="An lbmrd to use (repeatable; loopback only). Default 127.0.0.1:15380.")
@click.option("--multicast", metavar="GROUP[:PORT]", is_flag=False, flag_value=f"{MC_GROUP}:{MC_PORT}",
              callback=_group_cb,
              help=f"Multicast topic resolution on GROUP:PORT instead of lbmrds (alone: "
                   f"{MC_GROUP}:{MC_PORT}; port default {MC_PORT}). Needs an interface with "
                   "multicast on, e.g. lo inside a network namespace.")
@click.option("--mc-interface", metavar="IP",
              help=f"With --multicast: address of the interface for the membership and for "
                   f"sending (IP_MULTICAST_IF). Default {MC_INTERFACE}.")
@click.option("--mc-ttl", type=click.IntRange(0, 1),
              help="With --multicast: multicast TTL, 0 (never leaves the host) or 1 (the link). "
                   "Default 0.")
@click.option("--contexts", type=click.IntRange(1, MAX_CONTEXTS), default=4, show_default=True,
              help="Number of simulated UM contexts.")
@click.option("--topics", type=click.IntRange(min=0), default=4, show_default=True,
              help="Number of topics (named PREFIX0, PREFIX1, ...).")
@click.option("--sources-per-topic", type=click.IntRange(min=0), default=1, show_default=True,
              help="Sources per topic, spread round-robin over the contexts.")
@click.option("--receivers-per-context", type=click.IntRange(min=0), default=1, show_default=True,
              help="Receivers per context (topics other contexts source first).")
@click.option("--transport", type=click.Choice(TRANSPORTS, case_sensitive=False), default="tcp",
              show_default=True, help="Transport the sources advertise.")
@click.option("--source-ip", metavar="IP|bind",
              help="Address advertised in TIRs; 0.0.0.0 lets lbmrd fill in the sender's "
                   "address, 'bind' advertises each context's own address. Default 0.0.0.0 "
                   "with lbmrds, bind with --multicast.")
@click.option("--source-port-base", type=click.IntRange(1, 65535), metavar="PORT",
              help="First advertised source port (default tcp 14371, lbtru 14380, lbtrm 14390).")
@click.option("--bind", metavar="IP",
              help="Loopback address every context binds to (with --multicast: sends from). "
                   "Default 127.0.0.1.")
@click.option("--bind-base", metavar="IP",
              help="Bind context i to IP + i (e.g. 127.0.1.1 gives 127.0.1.1, 127.0.1.2, ...).")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, metavar="S", help="Stop after S seconds at most.")
@click.option("--keep-running", is_flag=True,
              help="Run the whole duration even after every receiver has resolved.")
@click.option("--pcap", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write every datagram the simulator sends to FILE (classic pcap).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--seed", type=int, help="Random seed (source ids, topic indexes, session ids).")
@click.option("--topic-prefix", default="md.", show_default=True, help="Topic name prefix.")
@click.option("--max-datagram", type=click.IntRange(512, 65507), default=DEFAULT_MAX_DATAGRAM,
              show_default=True, metavar="BYTES", help="Largest TR datagram when batching records.")
@click.option("--timing", "timing", multiple=True, metavar="FIELD=SECONDS", callback=_timing_cb,
              help="Override one timing parameter (repeatable), e.g. keepalive_interval=0.25.")
@click.option("--data-bytes", metavar="N[K|M|G]", callback=_size_cb,
              help="TCP sources send one live stream of LBMC messages to every receiver connected "
                   "to the address they advertise (never replayed: a receiver starts at the next "
                   "message); with --verify-data, the payload bytes each receiver verifies.")
@click.option("--data-datagrams", type=click.IntRange(1, MAX_DATA_DATAGRAMS), metavar="N",
              help="LBT-RU sources send one live session of LBMC messages, one per UM LBT-RU "
                   "datagram, to every receiver connected (a receiver starts at the next message), "
                   "and receivers verify N of them; LBT-RM sources multicast N datagrams (real "
                   "LBT-RM, answering NAKs); with --verify-data, what receivers expect.")
@click.option("--verify-data", is_flag=True,
              help="Receivers, once resolved, fetch the data from the address they resolved and "
                   "verify it; the report gives each one's result and throughput.")
@click.option("--data-seed", type=click.IntRange(0, (1 << 64) - 1), default=0, show_default=True,
              metavar="N", help="Key of the data streams (simulators exchanging data must agree).")
@click.option("--data-rate", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_DATA_RATE,
              show_default=True, metavar="N/S",
              help="Messages (TCP, LBT-RU) or datagrams (LBT-RM) per second, per source, while it "
                   "has receivers (the default, with 1 KiB TCP messages, is about 1 MB/s a source: "
                   "what a routed pair carries for a hundred sources).")
@click.option("--data-datagram-size", type=click.IntRange(RM_MIN_DATAGRAM, RU_MAX_DATAGRAM),
              default=RU_MAX_DATAGRAM, show_default=True, metavar="BYTES",
              help="Size of each LBT-RU/LBT-RM data datagram (UDP payload).")
@click.option("--data-message-size", type=click.IntRange(1, MAX_PAYLOAD), default=DEFAULT_DATA_MESSAGE_SIZE,
              show_default=True, metavar="BYTES",
              help="Payload bytes of each TCP data message (at most --data-bytes).")
@click.option("--data-drop-every", type=click.IntRange(min=0), default=0, metavar="N",
              help="LBT-RM and LBT-RU receivers discard the first copy of every N-th datagram "
                   "on purpose and recover it by NAK; TCP receivers with --otr every N-th message, "
                   "recovered by OTR (0: none).")
@click.option("--data-drop-copies", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="LBT-RM receivers discard the first N copies of each datagram --data-drop-every picks "
                   "(2: they lose the first retransmission too and NAK again).")
@click.option("--data-ignore-interval", type=click.FloatRange(min=0), default=DEFAULT_IGNORE_INTERVAL,
              show_default=True, metavar="S",
              help="LBT-RM sources answer a NAK for a datagram they retransmitted less than S seconds "
                   "before with an NCF 'NAK ignored' (UM's transport_lbtrm_ignore_interval).")
@click.option("--data-nak-backoff", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_NAK_BACKOFF,
              show_default=True, metavar="S",
              help="LBT-RM receivers NAK a missing datagram again every S seconds, after its last NAK "
                   "or NCF (UM's transport_lbtrm_nak_backoff_interval).")
@click.option("--data-source-linger", type=click.FloatRange(min=0), metavar="S",
              help="LBT-RM sources exit (close their socket) S seconds after their last datagram; "
                   "receivers still NAKing then meet ICMP port unreachable (default: run to the end).")
@click.option("--lbtru-wire", type=click.Choice(["sim", "um"]), default="sim", show_default=True,
              help="What LBT-RU receivers verify (both speak UM's LBT-RU): the simulator's own "
                   "live sessions of LBMC messages, or numbered datagrams (an lbmr-router's LBT-RU "
                   "proxy of an LBT-RM source).")
@click.option("--data-rate-limit", metavar="BYTES/S[K|M|G]", callback=_size_cb,
              help="TCP receivers read at most this many bytes per second (slow receivers).")
@click.option("--requests", type=click.IntRange(0, MAX_REQUESTS), default=0, metavar="N",
              help="TCP sources send N requests (messages of their stream with a REQUEST header "
                   "naming their context's request port); every receiver responds to each request "
                   "it gets, and the report counts the responses per request index.")
@click.option("--request-interval", type=click.IntRange(1, MAX_REQUESTS), default=100, show_default=True,
              metavar="N", help="Request i rides message (i + 1) * N of a source's stream.")
@click.option("--retention", type=click.IntRange(0, MAX_RETENTION), default=0, metavar="N",
              help="TCP sources keep their last N messages for late join and OTR.")
@click.option("--late-join", is_flag=True,
              help="Receivers ask for the retained messages when they join (LJI_REQ naming their "
                   "context's request port) and verify them, then the live stream, consecutively.")
@click.option("--otr", is_flag=True,
              help="Receivers ask for every message missing from the stream (UME_RXREQ naming their "
                   "request port; --data-drop-every N discards some on purpose) and take the "
                   "retransmissions.")
@click.option("--uim", metavar="TCP:DOMAIN:IP:PORT", callback=_uim_cb,
              help="Context 0 sends unicast immediate messages to the context at IP:PORT (its request "
                   "port) in domain DOMAIN, as UM addresses them when DROs are in use: through the "
                   "router request listener its TRD's remote domain route records name for DOMAIN, once "
                   "it has heard one, each with a DESTINATION header (orig: its domain, address and "
                   "request port). The run ends once they are sent.")
@click.option("--uim-count", type=click.IntRange(1, MAX_REQUESTS), default=10, show_default=True, metavar="N",
              help="How many UIMs --uim sends.")
@click.option("--request-ports", is_flag=True,
              help="Every context opens its request port (UM's request_tcp_port: 14391 + context index) "
                   "and the report counts the UIMs by domain each one takes.")
def main(as_json: bool, **params) -> None:
    """Simulate Ultra Messaging contexts' topic resolution on loopback,
    against one or more lbmrds (unicast) or on a multicast group, and report
    how fast each receiver resolved.

    Exit status: 0 if every receiver resolved (and, with --verify-data, verified
    its data), 1 otherwise, 2 usage error.

    \b
    Examples:
      lbmr-sim --daemon 127.0.0.1:15380 --contexts 8 --topics 100 --receivers-per-context 10
      lbmr-sim --daemon 127.0.0.1:15380 --data-bytes 4M --verify-data
      lbmr-sim --daemon 127.0.0.1:15380 --daemon 127.0.0.1:15381 --bind-base 127.0.1.1
      lbmr-sim --transport lbtrm --pcap sim.pcap --json
      lbmr-sim --data-bytes 3M --verify-data --requests 20 --retention 1000 --late-join --otr
      lbmr-sim --daemon 127.0.1.1:15380 --bind 127.0.1.9 --topics 0 --receivers-per-context 0 \\
          --uim TCP:2:127.0.2.9:14391
      ip netns exec NS lbmr-sim --multicast 224.9.10.11:12965 --bind-base 127.0.1.1
      ip netns exec NS lbmr-sim --multicast --transport lbtrm --data-datagrams 400 --verify-data \\
          --data-drop-every 20 --data-drop-copies 2 --data-ignore-interval 0.3 --data-nak-backoff 0.05
    """
    try:
        cfg = config_from_params(params)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    try:
        result = trio.run(run_sim, cfg)
    except KeyboardInterrupt:
        click.echo("lbmr-sim: interrupted", err=True)
        sys.exit(130)
    except OSError as e:
        raise click.ClickException(str(e)) from None
    click.echo(render(result, as_json), nl=False)
    sys.exit(exit_status(result))


def parse_args(argv: Sequence[str]) -> tuple[SimConfig, bool]:
    """Parse ``lbmr-sim`` arguments without running: (config, as_json).
    Raises :class:`click.UsageError`/:class:`click.BadParameter` on errors."""
    with main.make_context("lbmr-sim", list(argv)) as ctx:
        params = dict(ctx.params)
    as_json = params.pop("as_json")
    try:
        return config_from_params(params), as_json
    except ValueError as e:
        raise click.UsageError(str(e)) from None


if __name__ == "__main__":
    main()
