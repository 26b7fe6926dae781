"""The scenario of tests/router/system/test_recovery_hostile.py's namespace test, run
inside a network namespace where TRD1 (10.1.0.0/24) and TRD2 (10.2.0.0/24) are local
addresses that are not loopback. Prints one JSON object.

A source in TRD1 names 127.0.0.1:TRAP_PORT as its late-join request port (a service
on router A's own loopback, not in TRD1). A receiver in TRD2 sends an LJI_REQ for the
proxy to router B's request listener; B carries it on a RECOVERY stream to router A.
Router A must not connect to 127.0.0.1 on a TIR's word: it refuses the stream."""

from __future__ import annotations

import json

import trio

import lbmr_proto as L
from lbmr_proto import lbmc
from lbmr_proto.um import synthesize_otid
from router.config.model import RequestListener, acceptor_peer, initiator_peer, lbmrd_endpoint
from router.shell.single import Router
from tests.router.helpers import LJ_TIDX, ROUTED_TOPIC, resolve, start_lbmrd, udp

TRD_NETS = ("10.1.0.0/24", "10.2.0.0/24")
A_IP, B_IP = "10.1.0.1", "10.2.0.1"  # each TRD's lbmrd and router endpoint
SOURCE_IP, RCV = "10.1.0.5", "10.2.0.9"
TRAP = ("127.0.0.1", 15397)  # the router host's own loopback
LISTENER = RequestListener(port=15391)
PEER_PORT = 26310
LIMIT = 20.0


def tir_naming_request_port(ip: str, port: int, request_ip: str, request_port: int) -> bytes:
    """A TR datagram: a TCP source at ``ip``:``port`` whose late-join option names
    ``request_ip``:``request_port``."""
    body = L.TcpTransport(ip, port)
    return L.encode(L.Packet(0, 1, tirs=[L.TIR(ROUTED_TOPIC, body, 60, LJ_TIDX, [
        L.OtidOption(0x8000, synthesize_otid(body, LJ_TIDX)),
        L.LateJoinOption(0, request_port, 0, request_ip, 1, 0, 0)])]))


def lji_req(transport_idx: int, req_ip: str, req_port: int) -> bytes:
    return lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(
        lbmc.LateJoinRequestHeader(0, 1, transport_idx, LJ_TIDX, req_ip, req_port),)))


async def main() -> dict:
    accepted = []
    async with trio.open_nursery() as n:
        with trio.fail_after(LIMIT):
            trap = trio.socket.socket()
            await trap.bind(TRAP)
            trap.listen(8)

            async def count_connections():
                while True:
                    c, peer = await trap.accept()
                    accepted.append(peer)
                    c.close()
            n.start_soon(count_connections)
            _, trd1 = await start_lbmrd(n, A_IP)
            _, trd2 = await start_lbmrd(n, B_IP)
            rb = Router("routerB", lbmrd_endpoint("B-TRD2", 2, [trd2], interface=B_IP, request_listener=LISTENER),
                        acceptor_peer("B-to-A", PEER_PORT, interface=B_IP))
            await n.start(rb.run)
            ra = Router("routerA", lbmrd_endpoint("A-TRD1", 1, [trd1], interface=A_IP, request_listener=LISTENER),
                        initiator_peer("A-to-B", B_IP, PEER_PORT, reconnect_interval_ms=300))
            await n.start(ra.run)

            async def advertise():
                sock, data = udp(SOURCE_IP), tir_naming_request_port(SOURCE_IP, 14371, *TRAP)
                while True:
                    await sock.sendto(data, trd1)
                    await trio.sleep(0.5)
            n.start_soon(advertise)
            tir = await resolve(udp(RCV), trd2)
            (lj,) = [o for o in tir.options if isinstance(o, L.LateJoinOption)]
            uim = await trio.open_tcp_stream(lj.src_ip_addr, lj.src_tcp_port)
            await uim.send_all(lji_req(lj.transport_idx, RCV, 14392))
            ub, ca = rb.uim.counters, ra.counters
            while not (ub["recovery_streams_refused_by_peer"] or accepted or ca["recovery_streams_accepted"]):
                await trio.sleep(0.02)
            await trio.sleep(0.3)
            out = {"accepted": [list(p) for p in accepted], "proxy_request_port": [lj.src_ip_addr, lj.src_tcp_port],
                   "a": {k: ca.get(k, 0) for k in ("recovery_refused_source_address", "recovery_streams_accepted",
                                                   "recovery_source_unreachable")},
                   "b": {k: ub.get(k, 0) for k in ("recovery_requests", "recovery_streams_opened",
                                                   "recovery_streams_refused_by_peer")}}
            await uim.aclose()
        n.cancel_scope.cancel()
    return out


if __name__ == "__main__":
    print(json.dumps(trio.run(main)))
