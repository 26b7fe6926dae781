"""The lbmrd I/O shell on trio: one UDP socket, one nursery.

Tasks: the receive/relay loop, the activity check (client expiry), the
periodic stats line, signal handling (SIGHUP reload, SIGUSR1 dump) and the
optional metrics endpoint. All protocol decisions are made by
:class:`lbmrd.relay.RelayCore`; this module only moves bytes.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
from dataclasses import dataclass, field

import trio

from .fanout import BatchReceiver, Fanout, os_error_name
from .relay import Drop, Relay, RelayCore, Reply

log = logging.getLogger("lbmrd")

WRITE_WAIT = 0.05  # seconds a relay may wait for a full send buffer before dropping


@dataclass
class Settings:
    """Effective daemon settings (times in the units named)."""

    bind_ip: str = "0.0.0.0"
    port: int = 15380
    activity_ms: int = 60000
    ttl_s: float = 60.0
    rcv_buf: int = 1048576
    snd_buf: int = 1048576
    config_path: str | None = None
    metrics: tuple[str, int] | None = None
    allow: list[str] = field(default_factory=list)
    max_clients: int | None = None
    rate: float | None = None
    burst: float | None = None
    echo: bool = False
    stats_interval: float = 60.0
    events: int = 1000
    handle_signals: bool = False  # SIGHUP/SIGUSR1/SIGTERM; the command line turns it on


class Daemon:
    """One lbmrd instance: ``await daemon.run(task_status=...)`` inside a
    nursery; reports the bound (ip, port) through ``task_status.started``."""

    def __init__(self, settings: Settings, config=None, *, reload=None) -> None:
        self.s = settings
        self.core = RelayCore(config, ttl=settings.ttl_s, allow=settings.allow,
                              max_clients=settings.max_clients, rate=settings.rate,
                              burst=settings.burst, echo=settings.echo, events=settings.events)
        self.reload_config = reload  # callable -> Config (raises on error), for SIGHUP
        self.sock: socket.socket | None = None
        self.fanout: Fanout | None = None
        self.metrics_addr: tuple[str, int] | None = None

    # -------------------------------------------------------------- socket

    def open_socket(self) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.s.rcv_buf)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.s.snd_buf)
            s.bind((self.s.bind_ip, self.s.port))
        except OSError:
            s.close()
            raise
        s.setblocking(False)
        got_r = s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        got_s = s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        log.info("socket buffers: receive %d requested, %d granted; send %d requested, %d granted",
                 self.s.rcv_buf, got_r, self.s.snd_buf, got_s)
        return s

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.sock = sock = self.open_socket()
        self.fanout = Fanout(sock)
        bound = sock.getsockname()
        log.info("Using interface [%s], listening on UDP %s:%d", bound[0], bound[0], bound[1])
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._activity_loop)
                if self.s.stats_interval > 0:
                    nursery.start_soon(self._stats_loop)
                if self.s.handle_signals:
                    await nursery.start(self._signal_loop)
                if self.s.metrics is not None:
                    from .metrics import serve_metrics

                    self.metrics_addr = await nursery.start(serve_metrics, self, self.s.metrics)
                task_status.started(bound)
                await self._recv_loop()
        finally:
            sock.close()

    # ---------------------------------------------------------------- loops

    async def _recv_loop(self) -> None:
        sock = self.sock
        rx = BatchReceiver(sock)
        handle = self.core.handle
        counters = self.core.counters
        clock = trio.current_time
        while True:
            try:
                batch = rx.receive()
            except OSError as e:  # e.g. ICMP port unreachable reported on the socket
                counters.drops["recv_error:" + os_error_name(e)] += 1
                continue
            if not batch:
                await trio.lowlevel.wait_readable(sock)
                continue
            now = clock()
            for data, addr in batch:
                d = handle(data, addr, now)
                t = type(d)
                if t is Relay:
                    await self._relay(d)
                elif t is Reply:
                    try:
                        sock.sendto(d.payload, addr)
                        counters.tx += 1
                        counters.tx_bytes += len(d.payload)
                    except OSError as e:
                        counters.send_errors[os_error_name(e)] += 1
                elif t is Drop and d.reason == "malformed":
                    log.debug("dropped malformed datagram from %s:%d", *addr)
            # let the timers and the metrics endpoint run under a flood
            await trio.lowlevel.checkpoint()

    async def _relay(self, d: Relay) -> None:
        c = self.core.counters
        fan = self.fanout
        skip = None if self.core.echo else d.sender
        for payload, group in d.parts:
            stop = len(group.members)
            if skip is not None and skip.group is group:
                group.move_to_end(skip)  # everyone but the sender is one range: one syscall
                stop -= 1
            sent, start, err = fan.send_range(payload, group, 0, stop)
            c.tx += sent
            c.tx_bytes += sent * len(payload)
            if err is not None:
                await self._send_rest(payload, group, start, stop, err)

    async def _send_rest(self, payload: bytes, group, start: int, stop: int, err: str) -> None:
        """Slow path of a fan-out: per-destination errors and a full buffer."""
        c = self.core.counters
        version = group.version
        while True:
            if err == "EAGAIN":
                with trio.move_on_after(WRITE_WAIT):
                    await trio.lowlevel.wait_writable(self.sock)
                if group.version != version:
                    c.drops["group_changed_while_blocked"] += stop - start
                    return
                if not self._writable():
                    c.drops["send_buffer_full"] += stop - start
                    return
            else:
                c.send_errors[err] += 1
            if start >= stop:
                return
            sent, start, err = self.fanout.send_range(payload, group, start, stop)
            c.tx += sent
            c.tx_bytes += sent * len(payload)
            if err is None:
                return

    def _writable(self) -> bool:
        import select

        p = select.poll()
        p.register(self.sock, select.POLLOUT)
        return bool(p.poll(0))

    async def _activity_loop(self) -> None:
        while True:
            await trio.sleep(self.s.activity_ms / 1000.0)
            dead = self.core.expire(trio.current_time())
            for cl in dead:
                log.info("client %s:%d expired after %.0f s of silence", cl.addr[0], cl.addr[1], self.s.ttl_s)

    def stats_line(self) -> str:
        c = self.core.counters
        return (f"stats clients={len(self.core.table)} rx={sum(c.rx.values())} tx={c.tx} "
                f"drops={sum(c.drops.values())} nat_rewrites={c.nat_rewrites} fillins={c.fillins} "
                f"send_errors={sum(c.send_errors.values())}")

    async def _stats_loop(self) -> None:
        while True:
            await trio.sleep(self.s.stats_interval)
            log.info("%s", self.stats_line())

    async def _signal_loop(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGHUP, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT) as sigs:
            task_status.started()  # handlers are in place before the daemon reports readiness
            async for sig in sigs:
                if sig == signal.SIGHUP:
                    self.reload()
                elif sig in (signal.SIGTERM, signal.SIGINT):
                    log.info("stopping (%s)", signal.Signals(sig).name)
                    self._nursery.cancel_scope.cancel()
                else:
                    log.info("dump %s", json.dumps(self.core.snapshot(trio.current_time())))

    def reload(self) -> bool:
        """Reload the config file (SIGHUP); keeps the old one on error."""
        if self.reload_config is None:
            log.warning("SIGHUP: no configuration file to reload")
            return False
        try:
            cfg = self.reload_config()
        except Exception as e:  # noqa: BLE001 - any failure keeps the running config
            log.error("reload failed, keeping the running configuration: %s", e)
            return False
        moved = self.core.set_config(cfg)
        self.core.event(trio.current_time(), "reload", f"{len(cfg.domains)} domains, {moved} clients moved")
        log.info("configuration reloaded: %d domains, %d transforms; %d clients re-classified",
                 len(cfg.domains), len(cfg.transforms), moved)
        return True
