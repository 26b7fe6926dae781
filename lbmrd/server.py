"""The lbmrd I/O shell on trio: one UDP socket, one nursery.

Tasks: the receive/relay loop, the activity check (client expiry), the
periodic stats line, signal handling (SIGHUP reload, SIGUSR1 dump) and the
optional metrics endpoint. All protocol decisions are made by
:class:`lbmrd.relay.RelayCore`; this module only moves bytes.
"""

from __future__ import annotations

import gc
import json
import logging
import select
import signal
import socket
import time
from collections import deque
from dataclasses import replace
from functools import partial

import trio

from lbmr_runtime.eventlog import LimitedLog
from lbmr_runtime.loglimit import LogLimiter
from lbmr_runtime.netif import local_addresses

from .fanout import BatchReceiver, Fanout, Outbox, os_error_name
from .relay import Drop, Relay, RelayCore, Reply
from .settings import RELOADABLE, RESTART_ONLY, Settings

log = logging.getLogger("lbmrd")

WRITE_WAIT = 0.05  # seconds a relay may wait for a full send buffer before dropping
WRITE_STEP = 0.002  # seconds between looks at waiting datagrams while the buffer is full
FANOUT_CHUNK = 1024  # destinations per sendmmsg call before the loop serves other work
GAP_EVERY = 0.002  # seconds of NAT copying between pauses
SWEEP_SLICE = 2000  # clients checked per slice of an activity check
SWEEP_FORCE = 1.0  # seconds a due activity check may wait for a quiet socket
BACKLOG = 1024  # relays received during a large fan-out, waiting for their turn
OUTBOX_CLIENTS = 256  # at most this many clients: relays are gathered in the outbox
OUTBOX_FLUSH = 256  # copies gathered from a batch before they are sent (bounds their delay)
TURN_EVERY = 0.001  # seconds of received batches handled at most before the other tasks run
EXPIRED_LOG_LINES = 100  # per activity check; the rest is one summary line
MALFORMED_LOG_LINES = 20  # --debug lines of dropped malformed datagrams per MALFORMED_LOG_WINDOW
MALFORMED_LOG_WINDOW = 10.0  # seconds; the rest of a window is one summary line


def _large(d: Relay) -> bool:
    """Whether a relay will pause between chunks or groups (see Daemon._relay)."""
    parts = d.parts
    if type(parts) is not list:
        return True
    for _, g in parts:
        if len(g.members) > FANOUT_CHUNK:
            return True
    return False


def _without_gc(fn):
    """``fn()`` with the cyclic garbage collector paused: parsing a big file
    makes many objects, and a full collection holds the interpreter lock for
    tens of milliseconds, stalling the relay thread."""
    was = gc.isenabled()
    gc.disable()
    try:
        return fn()
    finally:
        if was:
            gc.enable()


class SocketWaiter:
    """Waits until a socket is readable or writable through a private epoll
    set that holds the socket only while waiting (trio waits on that set).
    A socket left in trio's own set keeps an entry on its wait queue, which
    the kernel calls on every datagram sent from it: about 5% of the cost of
    each relayed copy. Elsewhere than Linux, trio waits on the socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._epoll = select.epoll() if hasattr(select, "epoll") else None

    async def readable(self) -> None:
        if self._epoll is None:
            await trio.lowlevel.wait_readable(self.sock)
        else:
            await self._wait(select.EPOLLIN)

    async def writable(self) -> None:
        if self._epoll is None:
            await trio.lowlevel.wait_writable(self.sock)
        else:
            await self._wait(select.EPOLLOUT)

    async def _wait(self, events: int) -> None:
        self._epoll.register(self.sock, events)
        try:
            await trio.lowlevel.wait_readable(self._epoll)
        finally:
            self._epoll.unregister(self.sock)

    def close(self) -> None:
        if self._epoll is not None:
            self._epoll.close()


class Daemon:
    """One lbmrd instance: ``await daemon.run(task_status=...)`` inside a
    nursery; reports the bound (ip, port) through ``task_status.started``.

    ``reload`` is a callable run in a worker thread on SIGHUP (or
    :meth:`reload`): it returns the new config, or ``(config, settings)``
    where ``settings`` are the effective :class:`Settings` the new file
    gives (then changed ``<ttl>``/``<activity>`` are applied and other
    changed settings are reported as needing a restart). It raises on error.

    The receive loop is the only task that changes the client table:
    activity checks and config swaps are handed to it, so a fan-out that
    pauses between chunks never sees its groups change under it.
    """

    def __init__(self, settings: Settings, config=None, *, reload=None) -> None:
        settings = self.settings = settings.effective()
        self.core = RelayCore(config, ttl=settings.ttl_s, allow=settings.allow,
                              max_clients=settings.max_clients, rate=settings.rate,
                              burst=settings.burst, ip_rate=settings.ip_rate,
                              ip_burst=settings.ip_burst, peer_daemons=settings.peer_daemons,
                              echo=settings.echo, events=settings.events)
        self.reload_config = reload
        self.sock: socket.socket | None = None
        self.fanout: Fanout | None = None
        self._waiter: SocketWaiter | None = None
        self.metrics_addr: tuple[str, int] | None = None
        self.started = 0.0  # when run() began (trio's clock, seconds)
        # the --debug line of each malformed datagram, limited (a sender must not fill the disk)
        self.malformed_log = LimitedLog(log, LogLimiter(MALFORMED_LOG_LINES, MALFORMED_LOG_WINDOW), logging.DEBUG)
        self.monitor_access = None  # the endpoint's token and TLS (lbmrd.metrics.monitor_access)
        if settings.metrics is not None:
            from .metrics import monitor_access

            self.monitor_access = monitor_access(settings)  # ValueError: a bad token or TLS file
        self._nursery: trio.Nursery | None = None
        self._idle_scope: trio.CancelScope | None = None
        self._fanning = 0  # > 0 while a fan-out may pause between chunks
        self._backlog: deque[Relay] = deque()
        self._sweep = None  # the activity check in progress (ExpirySweep)
        self._sweep_due: float | None = None  # when the next check became due
        self._sweep_dead = 0
        self._pending_config: list = []  # reloaded configs waiting for the receive loop
        self._regroup = None  # clients being re-classified after a reload (RegroupSweep)
        self._rx: BatchReceiver | None = None

    # -------------------------------------------------------------- socket

    def open_socket(self) -> socket.socket:
        st = self.settings
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, st.rcv_buf)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, st.snd_buf)
            s.bind((st.bind_ip, st.port))
        except OSError as e:
            s.close()
            raise OSError(e.errno, f"UDP {st.bind_ip}:{st.port}: {e.strerror or e}") from e
        s.setblocking(False)
        got_r = s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        got_s = s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        log.info("socket buffers: receive %d requested, %d granted; send %d requested, %d granted",
                 st.rcv_buf, got_r, st.snd_buf, got_s)
        return s

    def _set_own_addresses(self, bound: tuple[str, int]) -> None:
        ip, port = bound
        if ip == "0.0.0.0":
            try:
                ips = [a for _, a in local_addresses()]
            except OSError:
                ips = []
            self.core.set_own_addresses(ips, port, any_address=True)
        else:
            self.core.set_own_addresses([ip], port)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.started = trio.current_time()
        self.sock = sock = self.open_socket()
        self.fanout = Fanout(sock)
        self._waiter = SocketWaiter(sock)
        bound = sock.getsockname()
        self._set_own_addresses(bound)
        gc.freeze()  # the config (50,000 networks are a million objects): out of full collections
        log.info("Using interface [%s], listening on UDP %s:%d", bound[0], bound[0], bound[1])
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._activity_loop)
                nursery.start_soon(self.malformed_log.serve)
                if self.settings.stats_interval > 0:
                    nursery.start_soon(self._stats_loop)
                if self.settings.handle_signals:
                    await nursery.start(self._signal_loop)
                if self.settings.metrics is not None:
                    from .metrics import serve_metrics

                    self.metrics_addr = await nursery.start(
                        partial(serve_metrics, access=self.monitor_access), self, self.settings.metrics)
                task_status.started(bound)
                await self._recv_loop()
        finally:
            self._waiter.close()
            sock.close()

    # ---------------------------------------------------------------- loops

    def _wake(self) -> None:
        """Wake the receive loop if it is waiting for the socket."""
        if self._idle_scope is not None:
            self._idle_scope.cancel()

    async def _recv_loop(self) -> None:
        sock = self.sock
        self._rx = rx = BatchReceiver(sock)
        counters = self.core.counters
        clock = trio.current_time
        last_turn = clock()  # when the other tasks last had a turn
        while True:
            if self._pending_config:
                self._apply_config(self._pending_config.pop(0))
                continue
            if self._regroup is not None:
                self._regroup_step()
            try:
                batch = rx.receive()
            except OSError as e:  # e.g. ICMP port unreachable reported on the socket
                counters.recv_errors[os_error_name(e)] += 1
                continue
            if batch:
                await self._handle_batch(batch)
                while self._backlog:
                    await self._relay(self._backlog.popleft())
                due = self._sweep_due
                if self._sweep is not None or (due is not None and clock() - due >= SWEEP_FORCE):
                    self._sweep_step()  # under a flood the check still runs, a slice per batch
                if clock() - last_turn >= TURN_EVERY:
                    # let the timers and the metrics endpoint run under a flood
                    await trio.lowlevel.checkpoint()
                    last_turn = clock()
                continue
            # the socket is drained: every queued keepalive has been counted
            if self._sweep is not None or self._sweep_due is not None:
                self._sweep_step()
                await trio.lowlevel.checkpoint()
                continue
            if self._regroup is not None:
                await trio.lowlevel.checkpoint()  # re-classifying: a slice per turn
                continue
            with trio.CancelScope() as self._idle_scope:
                await self._waiter.readable()
            self._idle_scope = None
            last_turn = clock()

    async def _handle_batch(self, batch, *, defer: bool = False) -> None:
        """Handle received datagrams; relays wait in the backlog when ``defer``
        (we are between the chunks of a large fan-out), and so do large relays
        in any case, so that the rest of the batch (keepalives) is answered
        before them."""
        handle = self.core.handle
        counters = self.core.counters
        # relays that pause (NAT copies, groups over a chunk) wait for the rest of the batch
        may_pause = self.core.nat is not None or len(self.core.table) > FANOUT_CHUNK
        # with few clients, relays are queued and sent together (one sendmmsg for many)
        few = len(self.core.table) <= OUTBOX_CLIENTS and self.fanout.use_sendmmsg
        outbox = self.fanout.outbox if few and not defer else None
        echo = self.core.echo
        now = trio.current_time()
        for data, addr in batch:
            d = handle(data, addr, now)
            t = type(d)
            if t is Relay:
                if defer or may_pause and _large(d):
                    if len(self._backlog) >= BACKLOG:
                        counters.relays_dropped["backlog_full"] += 1
                    else:
                        self._backlog.append(d)
                elif outbox is not None:
                    skip = None if echo else d.sender
                    if not outbox.add(d.parts, skip):
                        await self._flush(outbox)  # emptied, it holds a relay to OUTBOX_CLIENTS
                        if not outbox.add(d.parts, skip):
                            await self._relay(d)
                    if outbox.count >= OUTBOX_FLUSH:
                        await self._flush(outbox)
                else:
                    await self._relay(d)
            elif t is Reply:
                self._reply(d.payload, addr)
            elif t is Drop and d.reason == "malformed":
                self.malformed_log.line(now, "malformed", "dropped malformed datagram from %s:%d", *addr)
        if outbox is not None and outbox.count:
            await self._flush(outbox)

    def _reply(self, payload: bytes, addr: tuple[str, int]) -> None:
        c = self.core.counters
        try:
            self.sock.sendto(payload, addr)
            c.tx += 1
            c.tx_bytes += len(payload)
        except OSError as e:
            c.send_errors[os_error_name(e)] += 1

    async def _flush(self, outbox: Outbox) -> None:
        """Send what the outbox holds; a full send buffer is waited on as in
        :meth:`_send_rest`, then what still does not fit is dropped."""
        c = self.core.counters
        while True:
            sent, nbytes, err = outbox.send()
            c.tx += sent
            c.tx_bytes += nbytes
            if err is None:
                return
            if err != "EAGAIN":
                c.send_errors[err] += 1
            elif not await self._room_to_send():
                c.copies_dropped["send_buffer_full"] += outbox.pending
                outbox.clear()
                return

    async def _relay(self, d: Relay) -> None:
        c = self.core.counters
        fan = self.fanout
        skip = None if self.core.echo else d.sender
        lazy = not isinstance(d.parts, list)  # NAT copies, computed group by group
        if lazy:
            self._fanning += 1
            last_gap = time.perf_counter()
        try:
            for payload, group in d.parts:
                stop = len(group.members)
                if skip is not None and skip.group is group:
                    group.move_to_end(skip)  # everyone but the sender is one range: one syscall
                    stop -= 1
                if stop > FANOUT_CHUNK:
                    self._fanning += 1
                    try:
                        await self._large_fanout(payload, group, stop)
                    finally:
                        self._fanning -= 1
                elif stop > 0:
                    sent, start, err = fan.send_range(payload, group, 0, stop)
                    c.tx += sent
                    c.tx_bytes += sent * len(payload)
                    if err is not None:
                        await self._send_rest(payload, group, start, stop, err)
                if lazy and time.perf_counter() - last_gap > GAP_EVERY:
                    await self._gap()  # pause only when the copies take long
                    last_gap = time.perf_counter()
        finally:
            if lazy:
                self._fanning -= 1

    async def _large_fanout(self, payload: bytes, group, stop: int) -> None:
        """A fan-out to many clients in chunks; between chunks other tasks run
        and waiting datagrams are handled (keepalives answered at once, relays
        kept for later), so one big fan-out never stops the daemon for long.
        Only appends can change the group meanwhile (new clients), which
        leaves the range being sent untouched."""
        c = self.core.counters
        start = 0
        while start < stop:
            end = min(start + FANOUT_CHUNK, stop)
            sent, nxt, err = self.fanout.send_range(payload, group, start, end)
            c.tx += sent
            c.tx_bytes += sent * len(payload)
            if err is not None:
                await self._send_rest(payload, group, nxt, end, err)
            start = end
            await self._gap()

    async def _gap(self) -> None:
        """A pause inside a long relay: other tasks run, and datagrams that
        arrived meanwhile are handled (relays wait in the backlog)."""
        await trio.lowlevel.checkpoint()
        try:
            batch = self._rx.receive()
        except OSError as e:
            self.core.counters.recv_errors[os_error_name(e)] += 1
            return
        if batch:
            await self._handle_batch(batch, defer=True)

    async def _send_rest(self, payload: bytes, group, start: int, stop: int, err: str) -> None:
        """Slow path of a fan-out: per-destination errors and a full buffer.

        A full send buffer is waited on for at most :data:`WRITE_WAIT`
        seconds per occurrence, in steps of :data:`WRITE_STEP` between which
        waiting datagrams are handled (keepalives answered, relays kept for
        later), so a congested fan-out does not stop the daemon; what still
        does not fit is counted as ``send_buffer_full``. Only appends can
        change the group meanwhile (removals wait for relays to end)."""
        c = self.core.counters
        self._fanning += 1
        try:
            while True:
                if err == "EAGAIN":
                    if not await self._room_to_send():
                        c.copies_dropped["send_buffer_full"] += stop - start
                        return
                    if len(group.members) < stop:
                        c.copies_dropped["group_changed_while_blocked"] += stop - start
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
        finally:
            self._fanning -= 1

    async def _room_to_send(self) -> bool:
        """Wait at most :data:`WRITE_WAIT` seconds for room in the send
        buffer, in steps of :data:`WRITE_STEP` between which waiting
        datagrams are handled (:meth:`_gap`); False if there is none."""
        deadline = trio.current_time() + WRITE_WAIT
        while not self._writable():
            if trio.current_time() >= deadline:
                return False
            with trio.move_on_after(WRITE_STEP):
                await self._waiter.writable()
            await self._gap()
        return True

    def _writable(self) -> bool:
        p = select.poll()
        p.register(self.sock, select.POLLOUT)
        return bool(p.poll(0))

    async def _activity_loop(self) -> None:
        """Every ``activity_ms``: mark an activity check due; the receive loop
        runs it in slices once the socket is drained (so keepalives already
        queued count first), or after :data:`SWEEP_FORCE` seconds under a flood."""
        while True:
            await trio.sleep(self.settings.activity_ms / 1000.0)
            if self._sweep is None and self._sweep_due is None:
                self._sweep_due = trio.current_time()
                self._wake()

    def _sweep_step(self) -> None:
        now = trio.current_time()
        if self._sweep is None:
            self._sweep = self.core.table.sweep(now)
            self._sweep_due = None
            self._sweep_dead = 0
        dead = self.core.expire_step(self._sweep, SWEEP_SLICE, now)
        for cl in dead:
            self._sweep_dead += 1
            if self._sweep_dead <= EXPIRED_LOG_LINES:
                log.info("client %s:%d expired after %.0f s of silence", cl.addr[0], cl.addr[1],
                         self.core.table.ttl)
        if self._sweep.done:
            if self._sweep_dead > EXPIRED_LOG_LINES:
                log.info("%d more clients expired in this activity check",
                         self._sweep_dead - EXPIRED_LOG_LINES)
            self._sweep = None

    def stats_line(self) -> str:
        c = self.core.counters
        return (f"stats clients={len(self.core.table)} received={c.received} rx={sum(c.rx.values())} "
                f"tx={c.tx} "
                f"drops={sum(c.drops.values())} nat_rewrites={c.nat_rewrites} fillins={c.fillins} "
                f"send_errors={sum(c.send_errors.values())}")

    async def _stats_loop(self) -> None:
        while True:
            await trio.sleep(self.settings.stats_interval)
            log.info("%s", self.stats_line())

    async def _signal_loop(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGHUP, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT) as sigs:
            task_status.started()  # handlers are in place before the daemon reports readiness
            async for sig in sigs:
                if sig == signal.SIGHUP:
                    await self.reload()
                elif sig in (signal.SIGTERM, signal.SIGINT):
                    log.info("stopping (%s); final %s", signal.Signals(sig).name, self.stats_line())
                    self._nursery.cancel_scope.cancel()
                else:
                    log.info("dump %s", json.dumps(self.core.snapshot(trio.current_time())))

    async def reload(self) -> bool:
        """Reload the config file (SIGHUP); keeps the old one on error.

        The file is read and checked in a worker thread, so the relay goes on
        meanwhile; the new config is swapped in by the receive loop."""
        if self.reload_config is None:
            log.warning("SIGHUP: no configuration file to reload")
            return False
        try:
            got = await trio.to_thread.run_sync(_without_gc, self.reload_config)
        except Exception as e:  # noqa: BLE001 - any failure keeps the running config
            log.error("reload failed, keeping the running configuration: %s", e)
            return False
        if self._fanning:
            self._pending_config.append(got)
        else:
            self._apply_config(got)
        return True

    def _apply_config(self, got) -> None:
        cfg, new = got if isinstance(got, tuple) else (got, None)
        self._regroup = self.core.set_config(cfg, regroup=False)
        self.core.event(trio.current_time(), "reload", f"{len(cfg.domains)} domains")
        if new is not None:
            self._apply_settings(new)
        log.info("configuration reloaded: %d domains, %d transforms; re-classifying %d clients",
                 len(cfg.domains), len(cfg.transforms), len(self.core.table))
        self._regroup_step()
        self._wake()

    def _regroup_step(self) -> None:
        """One slice of re-classifying the clients after a reload."""
        sweep = self._regroup
        sweep.step(SWEEP_SLICE)
        if sweep.done:
            gc.freeze()  # the new config's objects, as at start-up
            self._regroup = None
            log.info("%d clients re-classified into the new domains", sweep.moved)

    def _apply_settings(self, new: Settings) -> None:
        cur, new = self.settings, new.effective()
        for name in RELOADABLE:
            old, value = getattr(cur, name), getattr(new, name)
            if old != value:
                self.settings = replace(self.settings, **{name: value})
                if name == "ttl_s":
                    self.core.table.ttl = value
                log.info("reload: %s changed from %s to %s (applied)", name, old, value)
        for name in RESTART_ONLY:
            old, value = getattr(cur, name), getattr(new, name)
            if old != value:
                log.warning("reload: %s changed from %s to %s: takes effect only after a restart",
                            name, old, value)
