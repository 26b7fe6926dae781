"""Late join and OTR across routers, sans-IO (router/core/recovery.py, the RecoverMessage
decision of router/core/uim.py, RouterCore's views): two routers' cores back to back
in memory, a source with a late-join option in A's TRD, a receiver in B's. A request
that reaches B's listener names B's proxy by its transport index; B carries it towards
the advertisement's link; A knows where its source takes requests and rewrites it
(transport index, answer address), every other byte as it was."""

from __future__ import annotations

import pytest

import lbmr_proto as L
from lbmr_proto import lbmc
from router import peerlink as P
from router.core.acl import OPEN
from router.core.message_addresses import LATE_JOIN_REQUEST, RETRANSMIT_REQUEST
from router.core.recovery import (
    RecoveryRequest,
    SourceRequestPort,
    answer_from_source,
    proxy_transport_index,
    recovery_request,
    request_port_of,
    to_source,
)
from router.core.router_core import (
    EndpointRules,
    LinkSpec,
    RouterCore,
    SendFrame,
    SendTR,
    StartProxy,
)
from router.core.routing import Routing
from router.core.tr import PortalTR, PortalTRSettings
from router.core.uim import DropMessage, ForwardMessage, RecoverMessage, UimDrop, UimPath
from tests.router.helpers import APP, GROUP, OTID, TOPIC, dgram
from tests.tshark_judge import compare_lbmc, run_tshark_lbmc, write_lbttcp_pcap

CAPS = int(P.DEFAULT_CAPABILITIES | P.Capability.ROUTING | P.Capability.RECOVERY)
RELAY = ("10.2.0.1", 24000)
LISTENER_B = ("10.2.0.1", 15391)  # router B's <request-tcp> in TRD2
SOURCE_PORT = ("10.1.0.5", 14391)  # the source context's request port in TRD1
RECEIVER = ("10.2.0.9", 14392)  # the receiver context's request port in TRD2
LATE_JOIN = L.LateJoinOption(0, SOURCE_PORT[1], 0, SOURCE_PORT[0], 5, 0, 0)
EXFUNC = L.ExFuncOption(0x8000, SOURCE_PORT[1], 0, SOURCE_PORT[0], 0x1)
UME = L.UmeOption(0x4000, 0, 14500, "0.0.0.0", "10.1.0.6", 1, 6, 0, 0)


def core(name: str, endpoint: str, domain: int, request_address=None) -> RouterCore:
    tr = PortalTR(PortalTRSettings(endpoint, domain, src_id=endpoint.encode().ljust(8, b"_")[:8], mode="multicast",
                                   multicast=GROUP, source_timeout=3.0, requery_interval=1.0,
                                   request_address=request_address), now=0.0)
    return RouterCore(name, {endpoint: tr}, {endpoint: EndpointRules(domain, OPEN, 1.0, 100)},
                      [LinkSpec("peer", "peer", (endpoint,), 1, OPEN, True)],
                      Routing(name, {domain: 1}, now=0.0), now=0.0)


def pump(a: RouterCore, b: RouterCore, now: float) -> list:
    rest = []
    for _ in range(5):
        for src, dst in ((a, b), (b, a)):
            for o in src.outputs():
                if isinstance(o, SendFrame):
                    dst.link_frame("peer", o.frame, now)
                else:
                    rest.append(o)
    return rest


def pair(options=(LATE_JOIN, EXFUNC)):
    """Cores A (T1, the source) and B (T2, a receiver, a request listener), B's proxy
    bound and advertised: (a, b, the advert id, B's proxy TIR)."""
    a, b = core("A", "T1", 1), core("B", "T2", 2, LISTENER_B)
    a.link_up("peer", P.PeerInfo("B", (2,), 1, CAPS, (1, 0)), CAPS, 0.0)
    b.link_up("peer", P.PeerInfo("A", (1,), 1, CAPS, (1, 0)), CAPS, 0.0)
    pump(a, b, 0.0)
    b.tr_datagram("T2", dgram(tqrs=[TOPIC]), APP, 0.1)
    pump(a, b, 0.1)
    tir = L.TIR(TOPIC, L.TcpTransport("10.1.0.5", 14371), 60, 7, [L.OtidOption(0x8000, OTID), *options])
    a.tr_datagram("T1", dgram(tirs=[tir]), APP, 0.2)
    (start,) = [o for o in pump(a, b, 0.2) if isinstance(o, StartProxy)]
    assert b.proxy_listening("peer", "T2", start.advert.advert_id, RELAY, 0.3)
    b.tick(0.3)
    (proxy,) = [t for o in b.outputs() if isinstance(o, SendTR) for t in L.decode(o.data).tirs]
    return a, b, start.advert.advert_id, proxy


def lji(transport_idx: int, ip: str = RECEIVER[0], port: int = RECEIVER[1], *more) -> bytes:
    return lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(
        *more, lbmc.LateJoinRequestHeader(0x1, 65536, transport_idx, 7, ip, port, 0, 3, 1000, 10))))


def rxreq(transport_idx: int, seqnum: int = 99) -> bytes:
    return lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(
        lbmc.UmeRxReqHeader(0, 65537, transport_idx, 7, seqnum, RECEIVER[1], 0, RECEIVER[0]),)))


# ------------------------------------------------------------------ the pieces


def test_where_a_source_takes_requests_late_join_first_then_ume_then_exfunc():
    assert request_port_of(LATE_JOIN.encode() + EXFUNC.encode()) == SourceRequestPort(*SOURCE_PORT, 5)
    assert request_port_of(EXFUNC.encode() + UME.encode()) == SourceRequestPort("10.1.0.6", 14500, 6)
    assert request_port_of(EXFUNC.encode()) == SourceRequestPort(*SOURCE_PORT, 0)
    assert request_port_of(b"") is None
    assert request_port_of(b"\x04\x18\x00") is None  # not options: none, no exception
    assert request_port_of(L.LateJoinOption(0, 0, 0, "10.1.0.5", 5, 0, 0).encode()) is None  # port 0


def test_both_requests_are_read_and_anything_else_is_none():
    got = recovery_request(lji(9))
    assert got == RecoveryRequest(LATE_JOIN_REQUEST, 4, 9, 7, *RECEIVER)
    got = recovery_request(rxreq(11))
    assert got == RecoveryRequest(RETRANSMIT_REQUEST, 4, 11, 7, *RECEIVER)
    assert recovery_request(lbmc.data_message(7, 1, b"x" * 10)) is None
    assert recovery_request(lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(lbmc.TcpSidHeader(0, 1),)))) is None
    bad = bytearray(lji(9))
    bad[5] = 200  # a header length past the end
    with pytest.raises(lbmc.LbmcDecodeError):
        recovery_request(bytes(bad))


def test_to_source_rewrites_the_transport_index_and_the_answer_address_only():
    source = SourceRequestPort(*SOURCE_PORT, 5)
    for raw in (lji(1), rxreq(1)):
        out = to_source(raw, source, ("10.1.0.1", 40001))
        assert len(out) == len(raw)
        (h0,), (h1,) = lbmc.decode(raw).headers, lbmc.decode(out).headers
        if isinstance(h0, lbmc.LateJoinRequestHeader):
            assert h1 == lbmc.LateJoinRequestHeader(0x1, 65536, 5, 7, "10.1.0.1", 40001, 0, 3, 1000, 10)
        else:
            assert h1 == lbmc.UmeRxReqHeader(0, 65537, 5, 7, 99, 40001, 0, "10.1.0.1")
        # only the transport index and the address bytes changed
        changed = {i for i in range(len(raw)) if raw[i] != out[i]}
        assert changed <= set(range(4 + 8, 4 + 12)) | set(range(4 + 16, 4 + 28)) and changed
    assert to_source(lbmc.data_message(7, 1, b"x" * 10), source, ("10.1.0.1", 40001)) is None
    with pytest.raises(ValueError):
        to_source(lji(1), source, ("10.1.0.1", 0))


def test_the_proxy_transport_index_is_the_portal_id():
    assert proxy_transport_index(7) == 7 and proxy_transport_index(1 << 32 | 3) == 3


def test_only_the_source_answers_at_the_routers_listener():
    assert answer_from_source("10.1.0.5", "10.1.0.5")
    assert answer_from_source("127.0.1.1", "127.0.1.5")  # loopback: one host
    assert not answer_from_source("10.1.0.6", "10.1.0.5")
    assert not answer_from_source("127.0.0.1", "10.1.0.5") and not answer_from_source("", "10.1.0.5")


# ------------------------------------------------------------------ across two cores


def test_a_request_at_bs_listener_goes_to_the_proxied_advertisement_and_a_delivers_it_rewritten():
    a, b, aid, proxy = pair()
    (lj,) = [o for o in proxy.options if isinstance(o, L.LateJoinOption)]
    assert (lj.src_ip_addr, lj.src_tcp_port) == LISTENER_B
    pid = lj.transport_idx  # B's portal id of the proxy
    path = UimPath({"T2": (2, "10.2.0.1")}, b.routing, proxies=b)
    got = path.message(lji(pid), endpoint="T2")
    assert got == RecoverMessage("T2", "peer", aid, *RECEIVER, lji(pid))
    assert isinstance(path.message(rxreq(pid), endpoint="T2"), RecoverMessage)
    assert path.counters["recovery_requests"] == 2
    # router A: where the source behind its advertisement takes requests, as its TIR said
    source = a.advert_request_port("peer", "T1", aid)
    assert source == SourceRequestPort(*SOURCE_PORT, 5)
    out = lbmc.decode(to_source(got.message, source, ("10.1.0.1", 40001)))
    h = out.header(lbmc.LateJoinRequestHeader)
    assert h == lbmc.LateJoinRequestHeader(0x1, 65536, 5, 7, "10.1.0.1", 40001, 0, 3, 1000, 10)


def test_requests_for_no_proxy_or_answers_nobody_may_connect_to_are_dropped_and_counted():
    a, b, aid, proxy = pair()
    (lj,) = [o for o in proxy.options if isinstance(o, L.LateJoinOption)]
    path = UimPath({"T2": (2, "10.2.0.1")}, b.routing, proxies=b)
    for tix in (lj.transport_idx + 1, 0, 0xFFFFFFFF):
        got = path.message(lji(tix), endpoint="T2")
        assert isinstance(got, DropMessage) and got.reason is UimDrop.RECOVERY_UNKNOWN
    for ip, port in (("0.0.0.0", 14392), ("224.1.1.1", 14392), ("127.0.0.1", 14392), (RECEIVER[0], 0)):
        got = path.message(lji(lj.transport_idx, ip, port), endpoint="T2")
        assert isinstance(got, DropMessage) and got.reason is UimDrop.RECOVERY_REQUESTER, (ip, port)
    assert path.counters["recovery_unknown_proxy"] == 3 and path.counters["recovery_requester_not_deliverable"] == 4
    # nor our own request listener: the source's answers would come in there as new messages
    # (a source's crafted answer, taken as a request, would open streams of its own)
    own = UimPath({"T2": (2, "10.2.0.1")}, b.routing, proxies=b, own=frozenset({("10.2.0.1", 15390)}))
    got = own.message(lji(lj.transport_idx, "10.2.0.1", 15390), endpoint="T2")
    assert isinstance(got, DropMessage) and got.reason is UimDrop.RECOVERY_REQUESTER
    assert isinstance(own.message(lji(lj.transport_idx, "10.2.0.1", 15391), endpoint="T2"), RecoverMessage)
    # without a listener's endpoint (on a UIM_ROUTED stream) or without proxies: no late join
    assert UimPath({"T2": (2, "10.2.0.1")}, b.routing).message(lji(lj.transport_idx), endpoint="T2").reason \
        is UimDrop.NO_DESTINATION
    # a request with a DESTINATION header is a UIM routed by domain, as before
    dest = lbmc.DestinationHeader(0, 1, "10.1.0.5", 14391, 0, 2, *RECEIVER)
    assert isinstance(path.message(lji(lj.transport_idx, *RECEIVER, dest), endpoint="T2"),
                      ForwardMessage | DropMessage)


def test_the_proxy_goes_the_mapping_with_it():
    a, b, aid, proxy = pair()
    (lj,) = [o for o in proxy.options if isinstance(o, L.LateJoinOption)]
    assert b.proxied("T2", lj.transport_idx) is not None
    b.link_frame("peer", P.Advertisement(TOPIC, 1, OTID, P.StreamKind.TCP, aid, True), 0.5)
    b.outputs()
    assert b.proxied("T2", lj.transport_idx) is None
    b.link_down("peer", 0.6)
    assert a.advert_request_port("peer", "T1", aid) == SourceRequestPort(*SOURCE_PORT, 5)
    a.link_down("peer", 0.6)
    a.outputs()
    with pytest.raises(KeyError):
        a.advert_request_port("nope", "T1", aid)


def test_a_source_without_a_request_port_offers_no_late_join_across_the_routers():
    a, b, aid, proxy = pair(options=())
    assert not [o for o in proxy.options if isinstance(o, L.LateJoinOption)]
    assert a.advert_request_port("peer", "T1", aid) is None


def test_tshark_decodes_the_requests_as_router_a_delivers_them_with_no_expert(tmp_path):
    """The rewritten LJI_REQ and UME_RXREQ on a connection to the source's request port
    (the dissector's default UIM ports are 14391..14395), field by field."""
    source = SourceRequestPort(*SOURCE_PORT, 5)
    msgs = [lbmc.decode(to_source(raw, source, ("10.1.0.1", 40001))) for raw in (lji(3), rxreq(3, 12345))]
    pcap = tmp_path / "to_source.pcap"
    n = write_lbttcp_pcap(pcap, [(False, lbmc.encode(m)) for m in msgs], source=SOURCE_PORT,
                          receiver=("10.1.0.1", 40500))
    frames = run_tshark_lbmc(pcap, port=SOURCE_PORT[1])
    assert len(frames) == n and not [(f.number, f.experts) for f in frames if f.flagged]
    layers = [layer for f in frames for layer in f.lbmc]
    assert len(layers) == 2
    assert [compare_lbmc(layer, m) for layer, m in zip(layers, msgs, strict=True)] == [[], []]
