"""UM-like applications for the UIM-by-domain tests: a context's request port
that collects the unicast immediate messages it is sent (:class:`UimInbox`),
UIMs addressed ``TCP:domain:ip:port`` (:func:`uim`), the routed pair they
cross (:func:`pair`: TRD1 and TRD2 on loopback, request listeners on
:data:`PORT`) and tshark's judgement of what was delivered."""

from __future__ import annotations

import dataclasses

import trio

from lbmr_proto import lbmc, lbmc_stream
from router.config.model import RequestListener
from tests.router.helpers import start_lbmrd, start_routers
from tests.tshark_judge import compare_lbmc, run_tshark_lbmc, segments, write_lbttcp_pcap


def uim(seq: int, dest: tuple[int, str, int], orig: tuple[int, str, int], size: int = 100, hops: int = 0) -> bytes:
    """UIM number ``seq`` to ``dest`` (domain, ip, port) from ``orig``: a MESSAGE with a
    DESTINATION header, ``size`` payload bytes that name ``seq``."""
    d = lbmc.DestinationHeader(0, dest[0], dest[1], dest[2], hops, orig[0], orig[1], orig[2])
    payload = (f"uim {seq} ".encode() * size)[:size]
    return lbmc.data_message(0, seq, payload, d)


class UimInbox:
    """A context's request port at ``ip``: collects every whole LBMC message sent to it."""

    def __init__(self, ip: str) -> None:
        self.ip = ip
        self.address: tuple[str, int] | None = None
        self.messages: list[bytes] = []
        self.connections = 0
        self.got = trio.Event()

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host=self.ip)
        self.address = listeners[0].socket.getsockname()[:2]
        task_status.started(self.address)
        await trio.serve_listeners(self._conn, listeners)

    async def _conn(self, stream) -> None:
        self.connections += 1
        framer = lbmc_stream.StreamFramer()
        async with stream:
            while True:
                try:
                    data = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return
                if not data:
                    return
                self.messages += framer.feed(data)
                self.got.set()

    async def wait_for(self, n: int, timeout: float = 10.0) -> list[bytes]:
        with trio.move_on_after(timeout):
            while len(self.messages) < n:
                self.got = trio.Event()
                await self.got.wait()
        return self.messages


async def send_uims(to: tuple[str, int], messages: list[bytes], bind_ip: str | None = None) -> None:
    """One connection to a request listener ``to`` carrying ``messages``."""
    stream = await trio.open_tcp_stream(*to, local_address=bind_ip) if bind_ip else await trio.open_tcp_stream(*to)
    async with stream:
        await stream.send_all(b"".join(messages))
        await trio.sleep(0.1)


def hops_of(message: bytes) -> int:
    return lbmc.decode(message).header(lbmc.DestinationHeader).hops_taken


def with_hops(message: bytes, hops: int) -> bytes:
    m = lbmc.decode(message)
    d = m.header(lbmc.DestinationHeader)
    heads = tuple(dataclasses.replace(h, hops_taken=hops) if h is d else h for h in m.headers)
    return lbmc.encode(dataclasses.replace(m, headers=heads))


PORT = 14611


async def routed(*routers, timeout: float = 10.0) -> None:
    """Until each router has a route to the other's domain."""
    with trio.fail_after(timeout):
        while not all(r.routing is not None and len(r.routing.map.routes()) >= 2 for r in routers):
            await trio.sleep(0.05)


async def pair_and_trds(n):
    """Routers A and B, routed, and the lbmrds (ip, port) of TRD1 and TRD2."""
    _, trd1 = await start_lbmrd(n, "127.0.1.1")
    _, trd2 = await start_lbmrd(n, "127.0.2.1")
    ra, rb = await start_routers(n, trd1, trd2, request_listener=RequestListener(port=PORT))
    await routed(ra, rb)
    return ra, rb, trd1, trd2


async def pair(n):
    ra, rb, _, _ = await pair_and_trds(n)
    return ra, rb


def tshark_agrees(tmp_path, messages: list[bytes], source: tuple[str, int]) -> None:
    """The messages as delivered, in an LBT-TCP capture: tshark decodes each (DESTINATION
    with its hops_taken) as we do, with no expert info."""
    pcap = tmp_path / "uim.pcap"
    write_lbttcp_pcap(pcap, [(True, s) for s in segments(messages)], source=source)
    frames = run_tshark_lbmc(pcap, port=source[1])
    layers = [layer for f in frames for layer in f.lbmc]
    assert len(layers) == len(messages) and not any(f.flagged for f in frames)
    assert [compare_lbmc(layer, lbmc.decode(m)) for layer, m in zip(layers, messages, strict=True)] \
        == [[]] * len(messages)
