"""One endpoint portal's task on trio: its TR socket and its shared topic
resolution (:class:`router.core.endpoint_portal.EndpointPortal`), serving every
link of the endpoint (one UM context in the TRD, as the DRO's portal is).

The endpoint's links (:class:`router.daemon.Router` units) each get a
:class:`router.core.endpoint_portal.PortalView` (:meth:`PortalTask.view`) and
register with :meth:`PortalTask.serve`; after every datagram and timer the
task has each of them act on its events (``portal_changed()``), and a link
that gave its view work calls :meth:`PortalTask.wake`. Times are seconds
(trio's clock).
"""

from __future__ import annotations

import logging
import secrets
import socket
from dataclasses import dataclass

import trio

from lbmr_runtime.netif import open_multicast_socket

from .config_model import EndpointConfig
from .core.endpoint_portal import EndpointPortal, PortalView
from .core.tr import PortalTR

__all__ = ["PortalTask", "PORTAL_QUEUE", "TR_SOCKET_BUFFER"]

log = logging.getLogger("lbmr-router")

PORTAL_QUEUE = 1000  # datagrams (and wake-ups) queued for the portal task
TR_SOCKET_BUFFER = 4 << 20  # the portal's TR socket: receive and send buffers


@dataclass(frozen=True, slots=True)
class TRDatagram:
    """A datagram received on the portal's TR socket (for the portal task)."""

    data: bytes
    src: tuple[str, int]


@dataclass(frozen=True, slots=True)
class Wake:
    """A link gave the portal work: the portal task ticks again."""


class PortalTask:
    """``await nursery.start(task.run)`` reports the TR socket's address; then
    :meth:`view` and :meth:`serve` for each link. ``endpoint``: the portal's
    settings; ``timing``: :class:`router.core.tr.PortalTR` keyword arguments (the
    endpoint's ``<topic-resolution>``); ``counters``: where drops are counted."""

    def __init__(self, endpoint: EndpointConfig, timing: dict, counters) -> None:
        self.endpoint = endpoint
        self.timing = timing
        self.counters = counters
        self.src_id = secrets.token_bytes(8)  # the portal's context instance in its TRD
        self.portal: EndpointPortal | None = None
        self.sock = None
        self._units: list = []
        self._send, self._recv = trio.open_memory_channel(PORTAL_QUEUE)
        self._wake_pending = False

    def view(self, name: str) -> PortalView:
        return self.portal.view(name)

    def serve(self, unit) -> None:
        """``unit.portal_changed()`` is called after every datagram and timer."""
        self._units.append(unit)

    def wake(self) -> None:
        """A link gave the portal work: tick again soon (one wake-up queued at a
        time: a burst of peer frames must not push the TRD's datagrams out)."""
        if self._wake_pending:
            return
        try:
            self._send.send_nowait(Wake())
            self._wake_pending = True
        except trio.WouldBlock:
            pass  # a full queue wakes the portal task anyway

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        e = self.endpoint
        self.sock = await self._open_tr_socket()
        self.portal = EndpointPortal(PortalTR(
            e.name, e.domain_id, src_id=self.src_id, mode=e.mode,
            daemons=e.daemons if e.mode == "lbmrd" else (),
            multicast=e.multicast if e.mode == "multicast" else None,
            source_timeout=e.source_timeout, requery_interval=e.requery_interval,
            requery_jitter=0.2, now=trio.current_time(), **self.timing))
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._receive)
                nursery.start_soon(self._loop)
                task_status.started(self.sock.getsockname())
        finally:
            self.sock.close()

    async def _open_tr_socket(self):
        """The portal's TR socket: joined to the group (multicast), or bound to the
        first free port of the TR port range (lbmrd)."""
        e = self.endpoint
        if e.mode == "multicast":
            group, port = e.multicast
            return trio.socket.from_stdlib_socket(open_multicast_socket(
                group, port, 0, e.tr_ip, e.tr_ip, e.multicast_ttl, buffer=TR_SOCKET_BUFFER))
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):  # bursts of TR traffic (best effort)
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, TR_SOCKET_BUFFER)
            except OSError:
                pass
        ports = range(e.tr_port_low, e.tr_port_high + 1) if e.tr_port_low else [0]
        for i, port in enumerate(ports):
            try:
                await sock.bind((e.tr_ip, port))
                break
            except OSError:
                if i == len(ports) - 1:
                    sock.close()
                    raise
        return sock

    async def _receive(self) -> None:
        """TR datagrams from the TRD (or lbmrd) into the portal's queue; when it
        is full, they wait in the socket's (4 MiB) buffer instead of being dropped."""
        while True:
            data, src = await self.sock.recvfrom(65535)
            try:
                self._send.send_nowait(TRDatagram(data, src))
            except trio.WouldBlock:
                self.counters["portal_queue_full"] += 1  # not dropped: waits for room
                await self._send.send(TRDatagram(data, src))

    def _changed(self) -> None:
        for unit in self._units:
            unit.portal_changed()

    async def _loop(self) -> None:
        """The portal: its timers and datagrams, serially."""
        portal = self.portal
        while True:
            for data, dest in portal.tick(trio.current_time()):
                try:
                    await self.sock.sendto(data, dest)
                except OSError as e:
                    self.counters["tr_send_error"] += 1
                    log.debug("TR send to %s failed: %s", dest, e)
            self._changed()
            with trio.move_on_at(portal.next_deadline()):
                item = await self._recv.receive()
                if isinstance(item, Wake):
                    self._wake_pending = False
                elif isinstance(item, TRDatagram):
                    portal.on_datagram(item.data, item.src, trio.current_time())
                    self._changed()
