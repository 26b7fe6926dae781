"""Late join and OTR across routers, the control plane, on loopback: a source in TRD1
advertises a TIR with late-join and extended-functionality options naming its request
port; a receiver in TRD2 resolves the proxy of router B and finds those options naming
router B's request listener (<request-tcp>), the OTID, domain id and cost options as
before, and tshark dissects the proxy's TIR without expert info. Without a request
listener the options are left out (counted); towards an older peer (no TIR_OPTIONS
capability) they are never sent; along a chain of routers each one that advertises a
proxy names its own listener."""

from __future__ import annotations

import trio

import lbmr_proto as L
from lbmr_proto.capture import write_udp_pcap
from lbmr_proto.um import synthesize_otid
from router import peerlink as P
from router.config.model import RequestListener, lbmrd_endpoint, router_config
from router.shell.router import MultiRouter
from tests.router.helpers import (
    IPS,
    ROUTE_INFO,
    ROUTED_TOPIC,
    acceptor_link,
    acceptor_router,
    connect_as_peer,
    converged,
    initiator_link,
    start_lbmrd,
    start_routers,
    tcp_source,
    tirs_in,
    udp,
)
from tests.tshark_judge import (
    compare,
    expected_experts,
    expected_fields,
    flatten,
    run_tshark,
    tshark_defect,
)

SOURCE_REQUEST_PORT = 14391  # the source context's request port (UM request_tcp_port)
ROUTER_REQUEST_PORT = 15391  # router B's <request-tcp port> in TRD2


def source_options(ip: str) -> list:
    return [L.LateJoinOption(0, SOURCE_REQUEST_PORT, 0, ip, 1, 0, 0),
            L.ExFuncOption(0x8000, SOURCE_REQUEST_PORT, 0, ip, 0x1)]


async def advertise_with_options(sock, daemon, ip, port, topic=ROUTED_TOPIC):
    """A UM source at ``ip``:``port`` whose TIR carries late-join and exfunc options,
    advertised to the lbmrd ``daemon`` every 0.5 s."""
    body = L.TcpTransport(ip, port)
    otid = synthesize_otid(body, 7)
    data = L.encode(L.Packet(0, 1, tirs=[L.TIR(topic, body, 60, 7,
                                                [L.OtidOption(0x8000, otid), *source_options(ip)])]))
    while True:
        await sock.sendto(data, daemon)
        await trio.sleep(0.5)


async def resolve_raw(sock, daemon, topic=ROUTED_TOPIC, timeout=10.0) -> tuple[bytes, L.TIR]:
    """Query ``topic`` as a UM receiver until a (non-final) TIR for it arrives: the
    datagram and the TIR."""
    tqr = L.encode(L.Packet(0, 1, tqrs=[L.TQR(topic)]))
    with trio.fail_after(timeout):
        while True:
            await sock.sendto(tqr, daemon)
            with trio.move_on_after(0.2):
                while True:
                    data, _ = await sock.recvfrom(65535)
                    for t in tirs_in(data):
                        if t.topic == topic and not any(isinstance(o, L.CostOption) and o.cost == -1
                                                        for o in t.options or ()):
                            return data, t


def of(tir: L.TIR, cls) -> list:
    return [o for o in tir.options or () if isinstance(o, cls)]


async def test_the_proxy_advertises_late_join_at_the_routers_request_listener(tmp_path):
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        ra, rb = await start_routers(n, trd1, trd2, request_listener=RequestListener(port=ROUTER_REQUEST_PORT))
        src = await tcp_source(n, "127.0.1.5", 1024)
        n.start_soon(advertise_with_options, udp("127.0.1.5"), trd1, *src)
        rcv = udp("127.0.2.9")
        data, tir = await resolve_raw(rcv, trd2)
        # the proxy at router B's relay, with the origin's identity as before ...
        assert tir.transport.NAME == "TCP" and tir.transport.ip == "127.0.2.1"
        assert of(tir, L.OtidOption)[0].otid == synthesize_otid(L.TcpTransport(*src), 7)
        cost = of(tir, L.CostOption)[0]
        assert of(tir, L.DomainIdOption)[0].domain_id == 1 and cost.hop_count == 1 and cost.cost > 0
        # ... and the late-join and exfunc options at router B's request listener in TRD2
        assert of(tir, L.LateJoinOption) == [L.LateJoinOption(0, ROUTER_REQUEST_PORT, 0, "127.0.2.1", 1, 0, 0)]
        assert of(tir, L.ExFuncOption) == [L.ExFuncOption(0x8000, ROUTER_REQUEST_PORT, 0, "127.0.2.1", 0x1)]
        assert rb.status()["portal"]["stats"]["tir_options_substituted"] >= 1
        n.cancel_scope.cancel()
    # tshark, the judge: the datagram the receiver got dissects exactly, without expert info
    pcap = tmp_path / "proxy.pcap"
    write_udp_pcap(pcap, [(1.0, "127.0.2.1", trd2[1], "127.0.2.9", 14402, data)])
    (fr,) = run_tshark(pcap, trd2[1])
    pkt = L.decode(data)
    assert fr.lbmr is not None and not fr.flagged, fr.experts
    assert expected_experts(pkt) == [] and tshark_defect(pkt) is None
    assert compare(flatten(fr.lbmr), expected_fields(pkt)) == []


async def test_without_a_request_listener_the_proxy_leaves_late_join_out():
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        ra, rb = await start_routers(n, trd1, trd2)
        src = await tcp_source(n, "127.0.1.5", 1024)
        n.start_soon(advertise_with_options, udp("127.0.1.5"), trd1, *src)
        _, tir = await resolve_raw(udp("127.0.2.9"), trd2)
        assert [type(o) for o in tir.options] == [L.OtidOption, L.DomainIdOption, L.CostOption]
        assert rb.status()["portal"]["stats"]["tir_options_dropped_no_listener"] >= 1
        n.cancel_scope.cancel()


async def _first_advert(capabilities: int) -> tuple[P.Advertisement, int]:
    """Router B (the sources' side, TRD2 on 127.0.2.1) and a peer of ours announcing
    ``capabilities`` that asks for the topic: B's first ADVERTISEMENT of it, and the
    capabilities negotiated."""
    async with trio.open_nursery() as n:
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        rb = acceptor_router(trd2)
        addr = await n.start(rb.run)
        src = await tcp_source(n, "127.0.2.5", 1024)
        n.start_soon(advertise_with_options, udp("127.0.2.5"), trd2, *src)
        stream, conn = await connect_as_peer(addr["peer"], capabilities=capabilities)
        await stream.send_all(conn.send(P.Interest(P.InterestAction.ADD, ROUTED_TOPIC, 1), trio.current_time()))
        with trio.fail_after(10):
            while True:
                for ev in conn.receive_data(await stream.receive_some(65536), trio.current_time()):
                    if isinstance(ev, P.Advertisement) and ev.topic == ROUTED_TOPIC and not ev.withdraw:
                        n.cancel_scope.cancel()
                        return ev, conn.capabilities
                await stream.send_all(conn.data_to_send())


async def test_a_peer_with_the_capability_gets_the_origins_options():
    ad, caps = await _first_advert(P.DEFAULT_CAPABILITIES)
    assert caps & P.Capability.TIR_OPTIONS
    # as the origin's TIR says them (the receiving router substitutes its own address)
    assert ad.tir_options == b"".join(o.encode() for o in source_options("127.0.2.5"))


async def test_an_older_peer_never_gets_the_options():
    """A router before TIR_OPTIONS: the ADVERTISEMENT is the one it knows (its decoder
    would take the field for the session), the rest of the frame as before."""
    ad, caps = await _first_advert(P.DEFAULT_CAPABILITIES & ~P.Capability.TIR_OPTIONS)
    assert not caps & P.Capability.TIR_OPTIONS
    assert ad.tir_options == b"" and ad.session and ad.origin_domain == 2


def chain_router(name: str, d: int, trd, peers) -> MultiRouter:
    """A router with an endpoint in TRD ``d`` (at IPS[d]) whose request listener is port
    15390 + d, and the ``peers``."""
    ep = lbmrd_endpoint(f"T{d}", d, [trd], interface=IPS[d], fanout=False,
                        request_listener=RequestListener(port=15390 + d))
    return MultiRouter(router_config(name, [ep], peers, route_info=ROUTE_INFO))


async def test_along_a_chain_each_router_names_its_own_request_listener():
    """r1 (TRD1, the source) - r2 (TRD2) - r3 (TRD3): r3's proxy in TRD3 names r3's
    listener, r2's proxy in TRD2 names r2's; the options crossed r2 unchanged."""
    async with trio.open_nursery() as n:
        trds = {d: (await start_lbmrd(n, IPS[d]))[1] for d in (1, 2, 3)}
        r2 = chain_router("r2", 2, trds[2], [acceptor_link("2-1"), acceptor_link("2-3")])
        p21, p23 = (lk["peer"] for lk in (await n.start(r2.run))["links"])
        r1 = chain_router("r1", 1, trds[1], [initiator_link("1-2", p21)])
        r3 = chain_router("r3", 3, trds[3], [initiator_link("3-2", p23)])
        await n.start(r1.run)
        await n.start(r3.run)
        await converged((r1, r2, r3), (1, 2, 3))
        src = await tcp_source(n, "127.0.1.5", 1024)
        n.start_soon(advertise_with_options, udp("127.0.1.5"), trds[1], *src)
        for d in (3, 2):
            _, tir = await resolve_raw(udp(f"127.0.{d}.9"), trds[d])
            assert tir.transport.ip == IPS[d]
            assert of(tir, L.LateJoinOption) == [L.LateJoinOption(0, 15390 + d, 0, IPS[d], 1, 0, 0)]
            assert of(tir, L.ExFuncOption) == [L.ExFuncOption(0x8000, 15390 + d, 0, IPS[d], 0x1)]
            assert of(tir, L.CostOption)[0].hop_count == d - 1
        n.cancel_scope.cancel()
