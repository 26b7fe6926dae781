"""router.core.message_path: the one place every relayed LBMC message of a
fanned-out session passes whole (rewrites that keep or change a message's
length, through a fan-out sink queue and an LBT-RU upstream), and
router.relays.interface: the relays' one interface and the table that
chooses one."""

from __future__ import annotations

import inspect
from collections import Counter
from dataclasses import dataclass, replace
from functools import partial
from typing import ClassVar

import pytest
import trio

from lbmr_proto import lbmc, lbmc_stream
from lbmr_proto import lbtru as RU
from router import peerlink as P
from router.config.model import lbmrd_endpoint, router_config
from router.core.fanout import SessionFanout
from router.core.lbtru_upstream import RuUpstream
from router.core.message_path import (
    DropHeaders,
    MessagePath,
    Rule,
    SetRequestAddress,
    headed,
)
from router.relays.endpoint_relay import RELAYS, Relay
from router.relays.interface import (
    LBTRM,
    LBTRU,
    TCP,
    Mode,
    RelaySettings,
    TransportRelay,
    far_table,
    near_relay,
)
from router.relays.lbtrm import RmRelay
from router.relays.lbtru_fanout import RuSessionRelay
from router.relays.lbtru_streams import RuStreamRelay
from router.relays.tcp_fanout import FanoutRelay
from router.relays.tcp_streams import TcpStreamRelay
from router.shell.router import MultiRouter
from tests.helpers import LoneSite
from tests.router.helpers import advertise_forever, resolve, start_lbmrd, udp

REQ = lbmc.RequestHeader(transport=0, qidx=7, port=14391, ipaddr="10.29.4.121")
ODOMAIN = lbmc.OriginDomainHeader(domain_id=3)


def plain(sqn: int, size: int = 40) -> bytes:
    return lbmc.data_message(1, sqn, bytes([sqn & 0xFF]) * size)


def request(sqn: int, *more) -> bytes:
    return lbmc.data_message(1, sqn, b"what is the price?", REQ, *more)


def frame(data: bytes) -> list[bytes]:
    return lbmc_stream.StreamFramer().feed(data)


# ------------------------------------------------------------ the path alone


def test_a_path_without_rules_passes_the_run_itself():
    run = lbmc_stream.MessageRun.of([plain(1), request(2), plain(3)])
    path = MessagePath()
    assert not path.active
    assert path.run(run) is run
    data = b"".join([plain(1), request(2)])
    assert path.payload(data) is data


def test_headed_picks_the_messages_with_extension_headers():
    control = lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(lbmc.TcpSidHeader(session_id=5),)))
    bare_control = lbmc.encode(lbmc.Message(lbmc.CONTROL))
    run = lbmc_stream.MessageRun.of([plain(1), request(2), bare_control, control, plain(5)])
    assert headed(run) == [1, 3]
    assert headed(lbmc_stream.MessageRun.of([plain(1), plain(2)])) == []
    assert headed(lbmc_stream.MessageRun.of([request(1)])) == [0]


def test_headed_agrees_with_reading_each_message():
    """Runs of messages of one size (a strided look) and of mixed sizes."""
    import random

    rng = random.Random(23)
    same = [request(i) for i in range(3)]  # REQUEST messages and plain ones of their size
    filler = lbmc.data_message(1, 9, bytes(len(same[0]) - lbmc.DATA_HEADER.size))
    assert len(filler) == len(same[0])
    for _ in range(300):
        if rng.random() < 0.5:
            msgs = [rng.choice([same[0], filler]) for _ in range(rng.randint(1, 40))]
        else:
            msgs = [rng.choice([plain(1, rng.randint(0, 300)), request(2), same[1]]) for _ in range(rng.randint(1, 40))]
        run = lbmc_stream.MessageRun.of(msgs)
        want = [i for i, m in enumerate(msgs) if m[1] not in (lbmc.NHDR_DATA, lbmc.NHDR_NONE)]
        assert headed(run) == want
        view = lbmc_stream.MessageRun(memoryview(run.data).toreadonly(), run.ends)
        assert headed(view) == want


def test_plain_messages_are_not_touched_by_an_active_path():
    run = lbmc_stream.MessageRun.of([plain(i) for i in range(50)])
    path = MessagePath([SetRequestAddress("192.168.7.1", 15000)])
    assert path.active
    assert path.run(run) is run
    assert path.rewritten == 0


def test_request_address_rewritten_in_place_and_the_rest_untouched():
    msgs = [plain(1), request(2), plain(3), request(4, ODOMAIN), plain(5)]
    path = MessagePath([SetRequestAddress("192.168.7.1", 15000)])
    out = path.run(lbmc_stream.MessageRun.of(msgs))
    got = out.messages()
    assert len(out.data) == sum(map(len, msgs))  # same lengths
    assert [got[i] for i in (0, 2, 4)] == [msgs[i] for i in (0, 2, 4)]
    for i in (1, 3):
        m = lbmc.decode(got[i])
        assert m.header(lbmc.RequestHeader) == lbmc.RequestHeader(transport=0, qidx=7, port=15000,
                                                                  ipaddr="192.168.7.1")
        assert m.payload == b"what is the price?" and m.sqn == i + 1
    assert lbmc.decode(got[3]).header(lbmc.OriginDomainHeader) == ODOMAIN
    assert path.rewritten == 2
    # already pointing there: nothing to do
    assert path.run(out) is out


def test_a_rewrite_that_changes_the_length_moves_every_later_message():
    msgs = [plain(1, 10), request(2, ODOMAIN), plain(3, 300), request(4, ODOMAIN), plain(5, 1)]
    path = MessagePath([DropHeaders(frozenset({lbmc.OriginDomainHeader.CODE}))])
    out = path.run(lbmc_stream.MessageRun.of(msgs))
    got = out.messages()
    assert out.ends[-1] == len(out.data) == sum(map(len, msgs)) - 2 * ODOMAIN.SIZE
    assert got[0] == msgs[0] and got[2] == msgs[2] and got[4] == msgs[4]
    assert got[1] == request(2) and got[3] == request(4)
    assert frame(bytes(out.data)) == got  # the ends are the messages' boundaries


@pytest.mark.parametrize("ip, port", [("10.0.0.256", 1), ("host", 1), ("10.0.0.1", 65536), ("10.0.0.1", -1)])
def test_an_address_rule_is_checked_when_made(ip, port):
    with pytest.raises(ValueError):
        SetRequestAddress(ip, port)


def test_an_undecodable_message_passes_as_it_is_and_is_counted():
    good = request(2)
    bad = bytearray(request(3))
    bad[lbmc.DATA_HEADER.size + 1] = 5  # the REQUEST header's hdr_len: not 16
    msgs = [plain(1), bytes(bad), good]
    path = MessagePath([SetRequestAddress("192.168.7.1", 15000)])
    got = path.run(lbmc_stream.MessageRun.of(msgs)).messages()
    assert got[1] == bytes(bad) and got[0] == msgs[0]
    assert lbmc.decode(got[2]).header(lbmc.RequestHeader).port == 15000
    assert (path.undecodable, path.rewritten) == (1, 1)


@dataclass(frozen=True, slots=True)
class Pad(Rule):
    """A test rule: an ORIGIN DOMAIN header becomes an unknown header of ``size`` bytes."""

    CODES: ClassVar[frozenset[int]] = frozenset({lbmc.OriginDomainHeader.CODE})
    size: int

    def rewrite(self, header):
        return lbmc.UnknownHeader(0x7E, bytes(self.size - 2))


def test_a_rewrite_past_65535_bytes_is_not_made():
    big = lbmc.data_message(1, 1, bytes(65400), ODOMAIN)
    small = request(2, ODOMAIN)
    path = MessagePath([Pad(250)])
    got = path.run(lbmc_stream.MessageRun.of([big, small])).messages()
    assert got[0] == big and path.too_long == 1
    assert len(got[1]) == len(small) - ODOMAIN.SIZE + 250 and path.rewritten == 1


def test_a_datagram_payload():
    path = MessagePath([SetRequestAddress("192.168.7.1", 15000)])
    payload = plain(1) + request(2) + plain(3)
    out = path.payload(payload)
    assert out != payload and len(out) == len(payload)
    assert lbmc.decode(frame(out)[1]).header(lbmc.RequestHeader).ipaddr == "192.168.7.1"
    plain_only = plain(1) + plain(2)
    assert path.payload(plain_only) is plain_only
    cut = payload[:-3]  # not whole messages: passed as it is, counted
    assert path.payload(cut) is cut and path.undecodable == 1


# ---------------------------------------------- through a fan-out sink queue


@pytest.mark.parametrize("piece", [1, 7, 100, 100_000])
def test_the_rewritten_session_is_what_every_sink_gets(piece):
    sid_msg = lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(lbmc.TcpSidHeader(session_id=0x1234),)))
    msgs = [sid_msg] + [request(i, ODOMAIN) if i % 3 == 0 else plain(i, 20 + i) for i in range(1, 60)]
    stream = b"".join(msgs)
    path = MessagePath([SetRequestAddress("192.168.7.1", 15000),
                        DropHeaders(frozenset({lbmc.OriginDomainHeader.CODE}))])
    fan = SessionFanout(max_queue=1 << 20, path=path)
    queues = [fan.add(k, 0.0) for k in range(3)]
    for pos in range(0, len(stream), piece):
        assert fan.feed(stream[pos:pos + piece], 0.0) == []
    want = [sid_msg] + [request(i) if i % 3 == 0 else plain(i, 20 + i) for i in range(1, 60)]
    for q in queues:
        out = b"".join(bytes(c) for c in q.head(1 << 20))
        got = frame(out)
        assert len(got) == len(want) and q.held == len(out) == sum(map(len, want))
        for g, w in zip(got, want, strict=True):
            if w[1] == lbmc.RequestHeader.CODE:
                assert lbmc.decode(g).header(lbmc.RequestHeader).ipaddr == "192.168.7.1"
                assert lbmc.decode(g).header(lbmc.OriginDomainHeader) is None
                assert len(g) == len(w)
            else:
                assert g == w
    assert fan.nbytes == sum(map(len, want)) and fan.messages == len(want)
    # a sink joining later gets the session's TCP_SID message first, as the origin does
    late = fan.add("late", 0.0)
    assert bytes(late.head()[0]) == sid_msg


def test_a_sink_queue_cuts_the_rewritten_run_at_its_message_boundaries():
    path = MessagePath([DropHeaders(frozenset({lbmc.OriginDomainHeader.CODE}))])
    fan = SessionFanout(max_queue=lbmc.MAX_MSGLEN + 1, path=path)
    q = fan.add("slow", 0.0)
    msgs = [lbmc.data_message(1, i, bytes(30_000), ODOMAIN) for i in range(4)]
    drops = fan.feed(b"".join(msgs), 0.0)
    shrunk = len(msgs[0]) - ODOMAIN.SIZE
    assert q.held == 2 * shrunk  # two whole rewritten messages fit, the rest is dropped whole
    assert [(d.messages, d.nbytes) for d in drops] == [(2, 2 * shrunk)]


def test_received_runs_pass_the_path_too():
    path = MessagePath([SetRequestAddress("192.168.7.1", 15000)])
    fan = SessionFanout(path=path)
    q = fan.add(0, 0.0)
    stream = plain(1) + request(2) + plain(3)
    buf = fan.receive_buffer(len(stream))
    buf[:len(stream)] = stream
    fan.received(len(stream), 0.0)
    got = frame(b"".join(bytes(c) for c in q.head()))
    assert lbmc.decode(got[1]).header(lbmc.RequestHeader).port == 15000 and got[0] == plain(1)


# ------------------------------------------------------ through an LBT-RU upstream


def test_lbtru_upstream_rewrites_data_payloads_for_the_links():
    origin = ("10.1.1.1", 14390)
    path = MessagePath([SetRequestAddress("192.168.7.1", 15000)])
    up = RuUpstream(origin, 0x99, Counter(), path=path)
    up.tick(0.0)
    up.from_origin(RU.encode_sm(0, 0, 1, syn=True, session_id=0x99, client_id=4), origin, 0.0)
    payload = plain(1) + request(2)
    out = up.from_origin(RU.encode_data(1, 1, payload, session_id=0x99), origin, 0.1)
    (dgram,) = out.to_links
    m = RU.decode(dgram)
    assert (m.sqn, m.trail_sqn, m.header.session_id, m.retransmission) == (1, 1, 0x99, False)
    got = frame(m.payload)
    assert got[0] == plain(1) and lbmc.decode(got[1]).header(lbmc.RequestHeader).ipaddr == "192.168.7.1"
    rx = RU.encode_data(2, 1, plain(3), session_id=0x99, retransmission=True)
    assert up.from_origin(rx, origin, 0.2).to_links == [rx]  # nothing to rewrite: as it came


# ------------------------------------------------------------ the relays' table


def test_the_table_names_five_relays_of_one_interface():
    classes = set(RELAYS.values())
    assert classes == {FanoutRelay, TcpStreamRelay, RuSessionRelay, RuStreamRelay, RmRelay}
    assert set(RELAYS) == {(t, m) for t in (TCP, LBTRU, LBTRM) for m in Mode}
    sig = inspect.signature(TransportRelay.serve_proxy)
    for cls in classes:
        assert issubclass(cls, TransportRelay)
        assert list(inspect.signature(cls.serve_proxy).parameters) == list(sig.parameters), cls
        assert (list(inspect.signature(cls.open_far).parameters)
                == list(inspect.signature(TransportRelay.open_far).parameters)), cls


class _Link:
    def __init__(self, capabilities) -> None:
        self.capabilities = capabilities


@pytest.mark.parametrize("fanout", [True, False])
def test_which_relay_serves_what(fanout):
    relay = Relay(RelaySettings(relay_ip="127.0.0.1", fanout=fanout), Counter(), lambda k, d: None, LoneSite())
    t = relay.relays
    mode = relay.settings.mode
    sessions = _Link(P.Capability.RU_SESSIONS)
    older = _Link(P.Capability(0))
    assert type(near_relay(t, TCP, mode, sessions)) is (FanoutRelay if fanout else TcpStreamRelay)
    assert type(near_relay(t, LBTRU, mode, sessions)) is (RuSessionRelay if fanout else RuStreamRelay)
    assert type(near_relay(t, LBTRU, mode, older)) is RuStreamRelay  # a peer without LBT-RU sessions
    assert type(near_relay(t, LBTRU, mode, None)) is (RuSessionRelay if fanout else RuStreamRelay)
    assert type(near_relay(t, LBTRM, mode, older)) is RmRelay
    far = far_table(t, mode)
    assert {k: type(r) for k, r in far.items()} == {
        P.StreamKind.TCP: FanoutRelay if fanout else TcpStreamRelay,
        P.StreamKind.LBTRU: RuStreamRelay,
        P.StreamKind.LBTRU_SESSION: RuSessionRelay,  # whatever our mode: the peer fans out
        P.StreamKind.LBTRM: RmRelay,
    }
    # one instance per relay class, sharing the relay's context
    assert len({id(r) for r in t.values()}) == 5
    assert len({id(r.context) for r in t.values()}) == 1
    assert relay.lbtrm is t[LBTRM, mode]


def test_settings_are_the_endpoints():
    e = lbmrd_endpoint("A", 1, [("127.0.1.1", 1)], relay_interface="127.0.1.1", fanout=False,
                       fanout_max_queue=200_000, fanout_stall_timeout_ms=2500, ru_idle_timeout_ms=4000,
                       ru_max_streams=9)
    s = RelaySettings.of(e)
    assert (s.relay_ip, s.fanout, s.mode, s.fanout_max_queue, s.fanout_stall_timeout, s.ru_idle_timeout,
            s.ru_max_streams) == ("127.0.1.1", False, Mode.PER_CONNECTION, 200_000, 2.5, 4.0, 9)
    d = RelaySettings.of(lbmrd_endpoint("B", 1, [("127.0.1.1", 1)]))
    default = RelaySettings()
    for name in ("port_quarantine", "fanout", "fanout_max_queue", "fanout_stall_timeout", "ru_idle_timeout",
                 "ru_max_streams", "lbtrm_group_low", "lbtrm_group_high", "lbtrm_dest_port", "lbtrm_same_group",
                 "lbtrm_proxy_transport", "lbtrm_max_clients", "lbtrm_queue_limit", "lbtrm_max_streams",
                 "multicast_ttl", "downstream_rules", "upstream_rules"):
        assert getattr(d, name) == getattr(default, name), name
    relay = Relay(s, Counter(), lambda k, d: None, LoneSite())
    fan = relay.relays[TCP, Mode.FANOUT]
    ru = relay.relays[LBTRU, Mode.PER_CONNECTION]
    assert (fan.max_queue, fan.stall_timeout, ru.ru_idle_timeout, ru.ru_max_streams) == (200_000, 2.5, 4.0, 9)


# ------------------------------------- end to end: an endpoint pair, real sockets


async def _origin(n, ip: str) -> tuple[str, int]:
    """A live TCP source: to each connection its TCP_SID message, then a
    plain message and a request every 10 ms (for at most 20 s)."""
    sid_msg = lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(lbmc.TcpSidHeader(session_id=0x77),)))

    async def serve(stream):
        try:
            await stream.send_all(sid_msg)
            for i in range(2000):
                await stream.send_all(plain(2 * i) + request(2 * i + 1))
                await trio.sleep(0.01)
        except trio.BrokenResourceError:
            pass

    listeners = await n.start(partial(trio.serve_tcp, serve, 0, host=ip))
    return listeners[0].socket.getsockname()[:2]


async def test_a_request_crossing_the_router_is_rewritten_by_the_origins_side():
    """The rules of the origin's endpoint rewrite the REQUEST header of every
    request (the message path at the far upstream), then the receivers'
    router points it at its request listener for that requester (the near
    side's path: router.relays.responses); the receivers' own messages pass
    the receivers' endpoint's upstream path."""
    async with trio.open_nursery() as n:
        _, trd1 = await start_lbmrd(n, "127.0.1.1")
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        r = MultiRouter(router_config("pair", [lbmrd_endpoint("T1", 1, [trd1], interface="127.0.1.1"),
                                               lbmrd_endpoint("T2", 2, [trd2], interface="127.0.2.1")]))
        r.relay_settings["T1"] = replace(r.relay_settings["T1"],
                                         downstream_rules=(SetRequestAddress("127.0.2.77", 15555),))
        r.relay_settings["T2"] = replace(r.relay_settings["T2"],
                                         upstream_rules=(SetRequestAddress("127.0.1.88", 16666),))
        await n.start(r.run)
        ip, port = await _origin(n, "127.0.1.5")
        n.start_soon(advertise_forever, udp("127.0.1.5"), trd1, ip, port)
        tir = await resolve(udp("127.0.2.9"), trd2)
        conn = await trio.open_tcp_stream(tir.transport.ip, tir.transport.port)
        framer = lbmc_stream.StreamFramer()
        got: list[bytes] = []
        with trio.fail_after(20):
            while sum(m[1] == lbmc.RequestHeader.CODE for m in got) < 5:
                data = await conn.receive_some(65536)
                assert data
                got += framer.feed(data)
            await conn.send_all(request(1) + plain(2) + request(3))  # what a receiver sends: not passed on
            near = [u.relay.relays[TCP, Mode.FANOUT] for u in r.links if u.endpoint.name == "T2"]
            while sum(f.upstream.rewritten for f in near) < 2:
                await trio.sleep(0.01)
        assert lbmc.decode(got[0]).header(lbmc.TcpSidHeader).session_id == 0x77
        requests = [lbmc.decode(m) for m in got if m[1] == lbmc.RequestHeader.CODE]
        (listener,) = [s.listener for u in r.links if u.endpoint.name == "T2" for s in u.relay.requests.map.slots()
                       if (s.key.ip, s.key.port) == ("127.0.2.77", 15555)]
        for m in requests:
            assert m.header(lbmc.RequestHeader) == lbmc.RequestHeader(transport=0, qidx=7, port=listener[1],
                                                                      ipaddr=listener[0])
            assert m.payload == b"what is the price?"
        assert listener[0] == "127.0.2.1"
        plains = [m for m in got[1:] if m[1] == lbmc.NHDR_DATA]
        assert plains and all(m == plain(lbmc.decode(m).sqn) for m in plains)
        sqns = [lbmc.decode(m).sqn for m in got[1:]]
        assert sqns == list(range(sqns[0], sqns[0] + len(sqns)))  # whole and in order from the join
        await conn.aclose()
        n.cancel_scope.cancel()
