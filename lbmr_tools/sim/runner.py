"""The trio shell of lbmr-sim: :func:`run_sim`."""

from __future__ import annotations

import dataclasses
import errno
import random
import socket
import time
from collections import Counter
from collections.abc import Iterable

import trio

from lbmr_proto import LateJoinOption
from lbmr_proto.capture import PcapWriter

from .config import (
    LBTRM_DEST_PORT,
    LBTRM_GROUP,
    SimConfig,
    bind_addresses,
    build_contexts,
    check_config,
    daemon_list,
    serves_data,
    source_placement,
    source_port_base,
)
from .context import REQUEST_PORT_BASE, Context, Datagram
from .dataplane import (
    RequestPort,
    RmDataReceiver,
    RmDataSource,
    RuLiveReceiver,
    RuLiveSource,
    TcpDataReceiver,
    TcpDataSource,
    UimSendReport,
    UmRuDataReceiver,
    UmTcpReceiver,
    UmTcpSource,
    send_by_domain,
    topic_seed,
)
from .netif import multicast_interface, open_multicast_socket
from .report import SentDatagram, SimResult, data_source_report, receiver_results

Addr = tuple[str, int]

MIN_STEP = 1e-6  # seconds; the shortest wait between two ticks of one context


async def _start_on(nursery, make, port: int):
    """Start ``make(port).serve``, or ``make(0).serve`` when ``port`` is taken: (server, bound port)."""
    for p in (port, 0):
        server = make(p)
        try:
            addr = await nursery.start(server.serve)
        except OSError as e:
            if e.errno != errno.EADDRINUSE or p == 0:
                raise
            continue
        return server, addr[1]
    raise AssertionError("unreachable")


def _port_of(transport) -> int:
    """The data port a transport advertises (LBT-RM: the source's unicast NAK port)."""
    return transport.src_ucast_port if transport.NAME == "LBTRM" else transport.port


def _with_port(transport, port: int):
    field = "src_ucast_port" if transport.NAME == "LBTRM" else "port"
    return dataclasses.replace(transport, **{field: port})


async def _start_data_source(nursery, cfg: SimConfig, ip: str, port: int, topic: str,
                             request_port: RequestPort | None):
    """Start the data source of one simulated source on (ip, port), or on a
    kernel-chosen port when that one is taken: (server, bound port). Its
    requests (``cfg.requests``) name ``request_port``."""
    seed = topic_seed(topic, cfg.data_seed)
    if cfg.transport == "tcp" and (cfg.requests or cfg.retention):
        first = request_port.add_requests(topic, seed, cfg.requests).first_qidx if cfg.requests else 0

        def make(p):  # sends with the advertised topic index once build_contexts chose it
            return UmTcpSource(ip, p, seed=seed, rate=cfg.data_rate,
                               message_size=min(cfg.data_message_size, cfg.data_bytes),
                               requests=cfg.requests, request_interval=cfg.request_interval,
                               request_port=None if request_port is None else request_port.address,
                               first_qidx=first, retention=cfg.retention)
    elif cfg.transport == "tcp":
        def make(p):
            return TcpDataSource(ip, p, seed=seed, rate=cfg.data_rate,
                                 message_size=min(cfg.data_message_size, cfg.data_bytes))
    elif cfg.transport == "lbtrm":  # sends once build_contexts has chosen its session id
        def make(p):
            return RmDataSource(ip, p, group=LBTRM_GROUP, dest_port=LBTRM_DEST_PORT,
                                count=cfg.data_datagrams, seed=seed, datagram_size=cfg.data_datagram_size,
                                rate=cfg.data_rate, ttl=max(cfg.mc_ttl, 1) if cfg.multicast else 1,
                                ignore_interval=cfg.data_ignore_interval, linger=cfg.data_source_linger)
    else:  # LBT-RU: sends with the advertised topic index once build_contexts chose it
        def make(p):
            return RuLiveSource(ip, p, seed=seed, session_id=seed & 0xFFFFFFFF,
                                datagram_size=cfg.data_datagram_size, rate=cfg.data_rate)
    return await _start_on(nursery, make, port)


def late_join_port(tir, fill_ip: str) -> tuple[str, int, int] | None:
    """(ip, port, transport index) of the source's request port as the
    late-join option of ``tir`` names them (an address 0.0.0.0: ``fill_ip``,
    the transport's), or None without one."""
    for o in (tir.options or ()) if tir is not None else ():
        if isinstance(o, LateJoinOption):
            return (fill_ip if o.src_ip_addr == "0.0.0.0" else o.src_ip_addr), o.src_tcp_port, o.transport_idx
    return None


def _data_receiver(cfg: SimConfig, topic: str, transport, local_ip: str, request_port: RequestPort | None,
                   tir=None):
    """The data receiver for a receiver of ``topic`` resolved to
    ``transport`` (its context's request port: ``request_port``; the
    source's, for late join and OTR, from the late-join option of ``tir``),
    or an error text when there is no data to fetch."""
    seed = topic_seed(topic, cfg.data_seed)
    name = transport.NAME
    if name == "TCP":
        if cfg.data_bytes is None:
            return "resolved a TCP source but --data-bytes is not given"
        if cfg.uses_uim:
            source_request = late_join_port(tir, transport.ip)
            if (cfg.late_join or cfg.otr) and source_request is None:
                return "resolved a TCP source whose TIR offers no late join (no late-join option)"
            return UmTcpReceiver(transport.ip, transport.port, cfg.data_bytes, seed,
                                 request_port=request_port, source_request=source_request,
                                 late_join=cfg.late_join, otr=cfg.otr,
                                 drop_every=cfg.data_drop_every, rate_limit_bps=cfg.data_rate_limit,
                                 timeout=cfg.duration, bind_ip=local_ip)
        return TcpDataReceiver(transport.ip, transport.port, cfg.data_bytes, seed,
                               rate_limit_bps=cfg.data_rate_limit, timeout=cfg.duration,
                               bind_ip=local_ip)
    if name == "LBTRU":
        if cfg.data_datagrams is None:
            return "resolved an LBT-RU source but --data-datagrams is not given"
        if cfg.lbtru_wire == "um":
            return UmRuDataReceiver(transport.ip, transport.port, getattr(transport, "session_id", None),
                                    bind_ip=local_ip, seed=seed, expect_count=cfg.data_datagrams,
                                    drop_every=cfg.data_drop_every, timeout=cfg.duration)
        return RuLiveReceiver(transport.ip, transport.port, expect_count=cfg.data_datagrams, seed=seed,
                              session_id=getattr(transport, "session_id", None), bind_ip=local_ip,
                              timeout=cfg.duration, nak=True, drop_every=cfg.data_drop_every)
    if name == "LBTRM":
        if cfg.data_datagrams is None:
            return "resolved an LBT-RM source but --data-datagrams is not given"
        return RmDataReceiver(transport.ip, transport.src_ucast_port, transport.session_id,
                              transport.mcast_group, transport.dest_port, iface_ip=local_ip, seed=seed,
                              expect_count=cfg.data_datagrams, drop_every=cfg.data_drop_every,
                              drop_copies=cfg.data_drop_copies, nak_interval=cfg.data_nak_backoff,
                              timeout=cfg.duration)
    return f"no data for {name} transports"


async def run_sim(config: SimConfig, *, task_status=trio.TASK_STATUS_IGNORED) -> SimResult:
    """Play ``config`` on loopback until every receiver has resolved (unless
    ``keep_running``) or ``config.duration`` seconds have passed.

    Reports the contexts' (ip, port)s through ``task_status.started`` once
    the sockets are open (in multicast mode: each context's source address
    and the group's port). Returns a :class:`SimResult`. In multicast mode
    the interface is checked first (:func:`multicast_interface`): raises
    :class:`MulticastUnavailable` before any socket is opened.

    With data the sources' data sockets are open before the first
    advertisement; with ``verify_data`` each receiver starts fetching the
    data as soon as it has resolved, and the run ends early only once every
    receiver has resolved and every data receiver has finished.
    """
    check_config(config)
    rng = random.Random(config.seed)
    addrs = bind_addresses(config)
    iface = None if config.multicast is None else multicast_interface(config.mc_interface)
    socks: list[trio.socket.SocketType] = []
    pcap: PcapWriter | None = None
    sent: list[SentDatagram] | None = [] if config.record_sent else None
    errors = Counter()
    ctxs: list[Context] = []
    servers: list[tuple[int, str, object]] = []  # (context, topic, data source)
    req_ports: list[RequestPort] = []  # one per context, with requests, late join or OTR
    data_rx: dict | None = {} if config.verify_data else None  # Receiver -> data receiver | error
    uim_report = None
    if config.uim is not None:
        d, ip, port = config.uim
        uim_report = UimSendReport(f"TCP:{d}:{ip}:{port}", config.uim_count,
                                   error=f"no route to domain {d} heard")
    try:
        if iface is not None:
            group, port = config.multicast
            for ip in addrs:
                socks.append(trio.socket.from_stdlib_socket(open_multicast_socket(
                    group, port, iface.index, config.mc_interface, ip, config.mc_ttl)))
            clients: list[Addr] = [(ip, port) for ip in addrs]
        else:
            for ip in addrs:
                s = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(s)
                await s.bind((ip, 0))
            clients = [s.getsockname()[:2] for s in socks]
        if config.pcap:
            pcap = PcapWriter(config.pcap)
        start = trio.current_time()
        wall0 = time.time()
        end = start + config.duration

        async with trio.open_nursery() as nursery:
            nursery.cancel_scope.deadline = end
            req_port_numbers = None
            if config.opens_request_ports:  # the ports the TIRs advertise: open before the first one
                req_port_numbers = [0] * len(addrs)
                req_ports.extend([None] * len(addrs))

                async def open_request_port(i: int, ip: str) -> None:
                    req_ports[i], req_port_numbers[i] = await _start_on(
                        nursery, lambda p: RequestPort(ip, p), REQUEST_PORT_BASE + i)

                async with trio.open_nursery() as opening:
                    for i, ip in enumerate(addrs):
                        opening.start_soon(open_request_port, i, ip)
            placed = source_placement(config) if serves_data(config) else []
            base = source_port_base(config)
            # every source advertises once its own data port is bound (not_ready: being bound)
            ctxs[:] = build_contexts(config, clients, start, rng, None, req_port_numbers,
                                     ready=not placed)
            data_ready = trio.Event()  # every data source is up (receivers wait for it)

            async def start_data_sources() -> None:
                """Start every data source at once, while topic resolution runs; each
                advertises once its port is bound (a taken one: a kernel-chosen port)."""
                slots: list = [None] * len(placed)  # the data sources, in placement order

                async def start_one(k: int, ci: int, topic: str, n: int) -> None:
                    ctx = ctxs[ci]
                    (src,) = [s for s in ctx.sources if s.topic == topic and _port_of(s.transport) == base + n]
                    server, port = await _start_data_source(nursery, config, addrs[ci], base + n, topic,
                                                            req_ports[ci] if req_ports else None)
                    if isinstance(server, RmDataSource):  # send with the advertised session id
                        server.set_session(src.transport.session_id)
                    else:  # TCP and LBT-RU: the advertised topic index
                        server.tidx = src.index
                    if isinstance(server, UmTcpSource) and server.retention and req_ports:
                        # late join and OTR requests come to the context's request port, naming
                        # the transport index the source's late-join option advertises
                        nursery.start_soon(server.take_requests,
                                           req_ports[ci].serve_source(ctx.transport_index(src)))
                    ctx.source_ready(src, trio.current_time(),
                                     None if port == base + n else _with_port(src.transport, port))
                    wakes[ci][0].set()  # its ticker: advertise now
                    slots[k] = (ci, topic, server)

                try:
                    async with trio.open_nursery() as starting:
                        for k, (ci, topic, n) in enumerate(placed):
                            starting.start_soon(start_one, k, ci, topic, n)
                finally:
                    servers.extend(x for x in slots if x is not None)
                    data_ready.set()

            has_receivers = any(c.receivers for c in ctxs)
            task_status.started(clients)
            data_pending = 0
            if uim_report is not None:
                data_pending += 1  # (its task starts below)
            resolved_seen = [-1] * len(ctxs)

            def check_done() -> None:
                if ((has_receivers or uim_report is not None) and not config.keep_running and data_pending == 0
                        and all(c.all_resolved for c in ctxs)):
                    nursery.cancel_scope.cancel()

            async def send_uims(report: UimSendReport) -> None:
                """Context 0's UIMs by domain, once it heard a route to the domain."""
                nonlocal data_pending
                try:
                    ctx, dest = ctxs[0], config.uim
                    while dest[0] not in ctx.domain_routes:
                        await trio.sleep(0.05)
                    now = trio.current_time()
                    report.route_after_s = round(now - start, 3)
                    report.error = None
                    orig = (ctx.domain_id, addrs[0], req_port_numbers[0])
                    await send_by_domain(report, ctx.domain_routes[dest[0]], addrs[0], dest, orig, end - now)
                finally:
                    data_pending -= 1
                    check_done()

            async def fetch(ctx: Context, r) -> None:
                """Fetch receiver ``r``'s data once every data source is up (a local
                receiver's source may have moved to another port meanwhile)."""
                nonlocal data_pending
                try:
                    await data_ready.wait()
                    rx = _data_receiver(config, r.topic, r.transport, ctx.local_ip,
                                        req_ports[ctx.index] if req_ports else None, r.tir)
                    data_rx[r] = rx
                    if not isinstance(rx, str):
                        await rx.run()
                finally:
                    data_pending -= 1
                    check_done()

            def start_data(ctx: Context) -> None:
                """Start the data receivers of ctx's newly resolved receivers."""
                nonlocal data_pending
                if data_rx is None or ctx.stats["resolved"] == resolved_seen[ctx.index]:
                    return
                resolved_seen[ctx.index] = ctx.stats["resolved"]
                for r in ctx.receivers:
                    if r.resolved and r not in data_rx:
                        data_rx[r] = "the run ended before the data sources were up"
                        data_pending += 1
                        nursery.start_soon(fetch, ctx, r)

            async def send(sock, me: Addr, dgs: Iterable[Datagram]) -> None:
                for d in dgs:
                    try:
                        await sock.sendto(d, d.dest)
                    except OSError:
                        errors["send"] += 1
                        continue
                    # stamped when recorded, so the pcap's timestamps never go backwards
                    ts = wall0 + (trio.current_time() - start)
                    rec = SentDatagram(ts, me[0], me[1], d.dest[0], d.dest[1], bytes(d))
                    if pcap is not None:
                        pcap.write_udp(*rec)
                    if sent is not None:
                        sent.append(rec)

            async def ticker(ctx: Context, sock, me: Addr, wake: list[trio.Event]) -> None:
                while trio.current_time() < end:
                    now = trio.current_time()
                    await send(sock, me, ctx.tick(now))
                    # never wait for a time already passed: the loop always makes progress,
                    # also on a virtual clock that only moves when every task sleeps
                    with trio.move_on_at(min(max(ctx.next_deadline(), now + MIN_STEP), end)):
                        await wake[0].wait()
                    wake[0] = trio.Event()

            async def listener(ctx: Context, sock, me: Addr, wake: list[trio.Event]) -> None:
                while trio.current_time() < end:
                    try:
                        data, src = await sock.recvfrom(65535)
                    except OSError:  # e.g. an ICMP error reported on the socket
                        errors["recv"] += 1
                        continue
                    now = trio.current_time()
                    await send(sock, me, ctx.receive(data, now, src[:2]))
                    wake[0].set()
                    start_data(ctx)
                    check_done()

            for ctx in ctxs:  # receivers resolved from their own context's sources
                start_data(ctx)
            check_done()
            wakes = []
            for ctx, sock, me in zip(ctxs, socks, clients, strict=True):
                wake = [trio.Event()]
                wakes.append(wake)
                nursery.start_soon(ticker, ctx, sock, me, wake)
                nursery.start_soon(listener, ctx, sock, me, wake)
            nursery.start_soon(start_data_sources)
            if uim_report is not None:
                nursery.start_soon(send_uims, uim_report)
        elapsed = trio.current_time() - start
        if not ctxs:  # the duration ended while the data sources were starting
            ctxs[:] = build_contexts(config, clients, start, rng)
    finally:
        for s in socks:
            s.close()
        if pcap is not None:
            pcap.close()
    return SimResult(receiver_results(ctxs, clients, data_rx), ctxs, clients, daemon_list(config), elapsed,
                     errors["send"], errors["recv"], sent, config.multicast, config.verify_data,
                     [data_source_report(ci, topic, server) for ci, topic, server in servers],
                     [dict(rp.report(), context=i) for i, rp in enumerate(req_ports)],
                     None if uim_report is None else uim_report.as_dict())
