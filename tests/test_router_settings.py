"""Every setting the router's file accepts takes effect (issue 11 item 6):
peer-link socket options, multicast TTL, topic resolution timing, interest
lifetime, logging and the statistics line. Each test fails if its setting is
not applied."""

from __future__ import annotations

import socket

import pytest
import trio

from router.config import ConfigError, load_config
from router.config_model import acceptor_peer, initiator_peer, lbmrd_endpoint, multicast_endpoint
from router.daemon import Router

from .helpers import free_port, write
from .test_router_config import ACCEPTOR, doc, endpoint, peer
from .test_router_e2e import start_lbmrd


async def wait_connected(*routers, timeout=10.0):
    with trio.fail_after(timeout):
        while not all(r.link is not None and r.link.connected for r in routers):
            await trio.sleep(0.02)


def sockopt(router, level, opt):
    return router.link.stream.socket.getsockopt(level, opt)


async def _linked(nursery, a_peer_opts, b_peer_opts, *, a_interface=None):
    _, trd1 = await start_lbmrd(nursery, "127.0.1.1")
    _, trd2 = await start_lbmrd(nursery, "127.0.2.1")
    rb = Router("routerB", lbmrd_endpoint("B-TRD2", 2, [trd2], interface="127.0.2.1"),
                acceptor_peer("B-to-A", 0, interface="127.0.0.1", **b_peer_opts))
    b = await nursery.start(rb.run)
    ra = Router("routerA", lbmrd_endpoint("A-TRD1", 1, [trd1], interface="127.0.1.1"),
                initiator_peer("A-to-B", "127.0.0.1", b["peer"][1], reconnect_interval_ms=200,
                               interface=a_interface, **a_peer_opts))
    await nursery.start(ra.run)
    await wait_connected(ra, rb)
    return ra, rb


async def test_single_tcp_options_are_set_on_both_ends_of_the_link():
    opts = dict(receive_buffer=50_000, send_buffer=40_000, tcp_keepalive=True, nodelay=True)
    async with trio.open_nursery() as n:
        ra, rb = await _linked(n, opts, opts, a_interface="127.0.3.1")
        for r in (ra, rb):
            assert sockopt(r, socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1, r.name
            assert sockopt(r, socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1, r.name
            # Linux reports twice the value set (its bookkeeping overhead)
            assert sockopt(r, socket.SOL_SOCKET, socket.SO_RCVBUF) == 2 * 50_000, r.name
            assert sockopt(r, socket.SOL_SOCKET, socket.SO_SNDBUF) == 2 * 40_000, r.name
        # the initiator bound its <interface> before connecting
        assert ra.link.stream.socket.getsockname()[0] == "127.0.3.1"
        assert rb.link.stream.socket.getpeername()[0] == "127.0.3.1"
        n.cancel_scope.cancel()


async def test_without_keepalive_and_nodelay_the_link_keeps_nagle_and_no_tcp_keepalive():
    """The file's defaults (the DRO's): no SO_KEEPALIVE, TCP_NODELAY off (trio
    turns it on for every stream; the router turns it off again)."""
    opts = dict(tcp_keepalive=False, nodelay=False)
    async with trio.open_nursery() as n:
        ra, rb = await _linked(n, opts, opts)
        for r in (ra, rb):
            assert sockopt(r, socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0, r.name
            assert sockopt(r, socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0, r.name
        assert ra.link.stream.socket.getsockname()[0] == "127.0.0.1"  # no <interface>: the OS's choice
        n.cancel_scope.cancel()


def test_multicast_ttl_is_read_from_the_file(tmp_path):
    tr = ('      <topic-resolution>\n        <multicast group="239.192.0.1" port="13000" ttl="3"/>\n'
          '      </topic-resolution>\n')
    cfg = load_config(write(tmp_path, "ttl.xml", doc(portals=endpoint(tr) + peer(ACCEPTOR))))
    assert cfg.endpoint.multicast_ttl == 3
    bare = doc(portals=endpoint("      <topic-resolution><multicast/></topic-resolution>\n") + peer())
    assert load_config(write(tmp_path, "ttl0.xml", bare)).endpoint.multicast_ttl == 16  # UM's default
    bad = tr.replace('ttl="3"', 'ttl="256"')
    with pytest.raises(ConfigError, match="ttl"):
        load_config(write(tmp_path, "ttl1.xml", doc(portals=endpoint(bad) + peer(ACCEPTOR))))


async def test_multicast_ttl_is_set_on_the_portals_tr_socket():
    ep = multicast_endpoint("M", 1, "239.192.7.1", free_port(), interface="127.0.0.1", ttl=3)
    r = Router("routerM", ep, acceptor_peer("M-peer", 0, interface="127.0.0.1"))
    async with trio.open_nursery() as n:
        await n.start(r.run)
        assert r.tr_sock.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL) == 3
        n.cancel_scope.cancel()


# ------------------------------------------------ a cancelled interest withdraws its adverts


def test_cancelled_interest_withdraws_the_adverts_sent_for_it():
    from router import peerlink as P

    from .test_router_bridge import OTID, TOPIC, bridge, dgram, frames, source_tir

    b = bridge()
    b.link_up(0.0)
    b.peer_frame(P.Interest(P.InterestAction.ADD, TOPIC, 2), 0.0)
    b.peer_frame(P.Interest(P.InterestAction.ADD, "md.other", 2), 0.0)
    b.on_datagram(dgram(tirs=[source_tir(), source_tir("md.other", 14372, OTID[:-1] + b"\x02")]),
                  ("10.1.0.5", 12965), 0.05)
    assert [f.withdraw for f in frames(b)] == [False, False]
    b.peer_frame(P.Interest(P.InterestAction.CANCEL, TOPIC, 2), 0.1)
    assert frames(b) == [P.Advertisement(TOPIC, 1, OTID, P.StreamKind.TCP, 1, True)]
    assert b.advert_source(1) is None and b.advert_source(2) is not None  # md.other still wanted
    assert b.counters["adverts_withdrawn_uninterested"] == 1
    # interest again: advertised again (first=True in the portal) under a new id
    b.peer_frame(P.Interest(P.InterestAction.ADD, TOPIC, 2), 0.2)
    (adv,) = frames(b)
    assert (adv.topic, adv.withdraw) == (TOPIC, False)


def test_a_pattern_cancel_keeps_adverts_another_interest_still_covers():
    from router import peerlink as P

    from .test_router_bridge import TOPIC, bridge, dgram, frames, source_tir

    b = bridge()
    b.link_up(0.0)
    b.peer_frame(P.Interest(P.InterestAction.ADD, "^md\\.", 2, P.PatternType.PCRE), 0.0)
    b.peer_frame(P.Interest(P.InterestAction.ADD, TOPIC, 2), 0.0)
    b.on_datagram(dgram(tirs=[source_tir()]), ("10.1.0.5", 12965), 0.05)
    assert [f.withdraw for f in frames(b)] == [False]
    b.peer_frame(P.Interest(P.InterestAction.CANCEL, "^md\\.", 2, P.PatternType.PCRE), 0.1)
    assert frames(b) == []  # the exact topic still wants it
    b.peer_frame(P.Interest(P.InterestAction.CANCEL, TOPIC, 2), 0.2)
    assert [f.withdraw for f in frames(b)] == [True]
