"""LBT-RM across the router, sans-IO (router.core.lbtrm): which datagrams each
side keeps, how headers are rewritten both ways, group choice, bounds."""

from __future__ import annotations

from collections import Counter

import pytest

from lbmr_proto import LbtrmTransport
from lbmr_proto import lbtrm as RM
from lbmr_proto.um import make_otid
from router.core.lbtrm import DatagramQueue, GroupPool, RmOrigin, RmProxy, otid_group

SRC = LbtrmTransport("10.1.0.5", "239.1.2.3", 0xCAFE0001, 14400, 14390)
SRC_ADDR = ("10.1.0.5", 40001)


def test_a_session_crosses_both_ways_with_headers_rewritten():
    c = Counter()
    origin = RmOrigin(SRC, c)
    proxy = RmProxy("192.0.2.7", 24010, "224.10.10.11", 14400, 0x77, c)
    assert proxy.transport_body == LbtrmTransport("192.0.2.7", "224.10.10.11", 0x77, 14400, 24010)
    for d in (RM.encode_data(14390, 0xCAFE0001, 41, 0, b"payload bytes"),
              RM.encode_sm(14390, 0xCAFE0001, 3, 41, 0),
              RM.encode_ncf(14390, 0xCAFE0001, 0, [40])):
        assert origin.from_group(d, SRC_ADDR)
        out = proxy.to_receivers(d)
        assert out[8:] == d[8:] and RM.parse_header(out) == RM.Header(RM.parse_header(d).type, 24010, 0x77)
    # a receiver NAKs the proxy, the source gets a NAK for its own session
    nak = RM.encode_nak(24010, 0x77, [40, 41])
    assert proxy.from_receiver(nak, 0.0)
    back = origin.nak_to_source(nak)
    assert RM.decode(back) == RM.Nak(RM.Header(RM.NAK, 14390, 0xCAFE0001), (40, 41))
    assert origin.nak_address == ("10.1.0.5", 14390) and origin.group == ("239.1.2.3", 14400)
    assert c["lbtrm_datagrams_relayed"] == 3 and c["lbtrm_datagrams_emitted"] == 3
    assert c["lbtrm_naks_from_receivers"] == 1 and c["lbtrm_naks_to_source"] == 1


@pytest.mark.parametrize("data, src, counter", [
    (RM.encode_data(14390, 0xCAFE0002, 1, 0, b"x"), SRC_ADDR, "lbtrm_other_session"),  # session id
    (RM.encode_data(14391, 0xCAFE0001, 1, 0, b"x"), SRC_ADDR, "lbtrm_other_session"),  # unicast port
    (RM.encode_data(14390, 0xCAFE0001, 1, 0, b"x"), ("10.1.0.6", 1), "lbtrm_other_session"),  # sender
    (RM.encode_nak(14390, 0xCAFE0001, [1]), SRC_ADDR, "lbtrm_unexpected_type"),  # a NAK on the group
    (b"\x01\x02\x03", SRC_ADDR, "lbtrm_malformed"),
    (b"LBMR" + bytes(20), SRC_ADDR, "lbtrm_malformed"),
])
def test_far_side_keeps_only_the_advertised_session(data, src, counter):
    c = Counter()
    assert not RmOrigin(SRC, c).from_group(data, src)
    assert c == {counter: 1}


def test_far_side_with_an_unknown_source_address_takes_any_sender():
    origin = RmOrigin(LbtrmTransport("0.0.0.0", "239.1.2.3", 5, 14400, 14390))
    assert origin.from_group(RM.encode_sm(14390, 5, 0, 0, 0), ("10.9.9.9", 1))


def test_far_side_refuses_what_is_not_a_nak_from_the_peer():
    c = Counter()
    o = RmOrigin(SRC, c)
    assert o.nak_to_source(RM.encode_data(1, 2, 3, 4, b"")) is None
    assert o.nak_to_source(b"\x03\x00") is None
    assert o.nak_to_source(RM.encode_nak(1, 2, [3])[:8] + b"\x00\x05\x00\x00" + bytes(8)) is None  # 5 NAKs, 2 present
    assert c == {"lbtrm_unexpected_type": 1, "lbtrm_malformed": 2}
    with pytest.raises(ValueError):
        RmOrigin(object())


def test_near_side_drops_naks_from_the_peer_and_foreign_naks_from_receivers():
    c = Counter()
    p = RmProxy("192.0.2.7", 24010, "224.10.10.11", 14400, 0x77, c)
    assert p.to_receivers(RM.encode_nak(1, 2, [3])) is None
    assert p.to_receivers(b"junk") is None
    assert not p.from_receiver(RM.encode_nak(24010, 0x78, [1]), 0.0)  # another session
    assert not p.from_receiver(RM.encode_data(24010, 0x77, 1, 0, b""), 0.0)  # not a NAK
    assert not p.from_receiver(b"", 0.0)
    assert c == {"lbtrm_unexpected_type": 2, "lbtrm_malformed": 2, "lbtrm_other_session": 1}


def test_a_nak_storm_from_the_trd_is_cut_at_the_proxy():
    c = Counter()
    p = RmProxy("192.0.2.7", 24010, "224.10.10.11", 14400, 0x77, c, nak_rate=100.0, nak_burst=10)
    nak = RM.encode_nak(24010, 0x77, [1])
    passed = sum(p.from_receiver(nak, 0.0) for _ in range(1000))  # a burst at one instant
    assert passed == 10 and c["lbtrm_naks_rate_limited"] == 990
    passed = sum(p.from_receiver(nak, 1.0 + k / 1000) for k in range(1000))  # 1000/s for 1 s
    assert 100 <= passed <= 111, passed  # the rate (100/s) plus what was saved up (at most 10)
    assert p.from_receiver(nak, 100.0)  # later, NAKs pass again


def test_group_pool_round_robin_least_used_first():
    pool = GroupPool("224.10.10.10", "224.10.10.12", dest_port=15000)
    otid = make_otid(SRC, 1, bytes(4), 0, 0)
    got = [pool.take(otid) for _ in range(4)]
    assert got == [("224.10.10.10", 15000), ("224.10.10.11", 15000), ("224.10.10.12", 15000),
                   ("224.10.10.10", 15000)]
    pool.give("224.10.10.11")
    assert pool.take(otid) == ("224.10.10.11", 15000)  # the one with the fewest proxies
    pool.give("224.10.10.10")
    pool.give("224.10.10.10")
    assert "224.10.10.10" not in pool.users


def test_group_pool_same_group_from_the_otid():
    pool = GroupPool(same=True)
    assert pool.take(make_otid(SRC, 1, bytes(4), 0, 0)) == ("239.1.2.3", 14400)
    assert otid_group(make_otid(SRC, 1, bytes(4), 0, 0)) == ("239.1.2.3", 14400)
    # an OTID that does not say (not LBT-RM, or no multicast group): the range
    assert otid_group(bytes(32)) is None and otid_group(b"\x10" + bytes(31)) is None
    assert pool.take(bytes(32)) == ("224.10.10.10", 14400)


@pytest.mark.parametrize("low, high", [("10.0.0.1", "10.0.0.2"), ("224.0.0.9", "224.0.0.1"),
                                       ("224.0.0.0", "239.255.255.255")])
def test_group_pool_bad_ranges(low, high):
    with pytest.raises(ValueError):
        GroupPool(low, high)


def test_datagram_queue_is_bounded():
    c = Counter()
    q = DatagramQueue(3, c, "lbtrm_queue_full")
    for i in range(10):
        q.append(bytes([i]))
    assert list(q) == [b"\x00", b"\x01", b"\x02"] and c["lbtrm_queue_full"] == 7


# --------------------------------------------------------------------------- <lbt-rm> in the file


def test_lbtrm_config_element(tmp_path):
    from router.config import LbtrmConfig
    from tests.router.helpers import doc, endpoint, expect_ok, peer

    cfg = expect_ok(tmp_path, "r.xml", doc(portals=endpoint(extra='      <lbt-rm group-low="239.1.1.1" '
                                                                  'group-high="239.1.1.4" destination-port="15400" '
                                                                  'same-group="yes"/>\n') + peer()))
    (ep,) = cfg.endpoints
    assert ep.lbtrm == LbtrmConfig("239.1.1.1", "239.1.1.4", 15400, True)
    assert (ep.lbtrm_group_low, ep.lbtrm_group_high, ep.lbtrm_dest_port, ep.lbtrm_same_group) == (
        "239.1.1.1", "239.1.1.4", 15400, True)
    assert expect_ok(tmp_path, "d.xml", doc()).endpoints[0].lbtrm == LbtrmConfig()
    ru = expect_ok(tmp_path, "u.xml", doc(portals=endpoint(extra='      <lbt-rm transport="lbtru" '
                                                                 'max-clients="12"/>\n') + peer()))
    assert (ru.endpoints[0].lbtrm_proxy_transport, ru.endpoints[0].lbtrm_max_clients) == ("lbt-ru", 12)
    assert expect_ok(tmp_path, "d.xml", doc()).endpoints[0].lbtrm_proxy_transport == "lbt-rm"
    w = expect_ok(tmp_path, "w.xml", doc(portals=endpoint(extra='      <lbt-rm transport="lbt-ru" '
                                                                'destination-port="15400"/>\n') + peer()))
    assert [m for _, m in w.warnings] == ['<lbt-rm transport="lbt-ru"> ignores destination-port: its proxies are unicast']


@pytest.mark.parametrize("attrs, needle", [
    ('group-low="10.0.0.1"', "not a multicast address"),
    ('group-low="239.1.1.9" group-high="239.1.1.1"', "reversed"),
    ('group-low="224.0.0.0" group-high="239.255.255.255"', "at most 65536"),
    ('destination-port="0"', "destination-port"),
    ('same-group="maybe"', "same-group"),
    ('transport="tcp"', "transport"),
    ('transport="lbt-ru" max-clients="0"', "max-clients"),
])
def test_lbtrm_config_errors(tmp_path, attrs, needle):
    from tests.router.helpers import doc, endpoint, expect_error, peer

    expect_error(tmp_path, "r.xml", doc(portals=endpoint(extra=f"      <lbt-rm {attrs}/>\n") + peer()),
                 "<lbt-rm", needle)


def test_requests_in_data_payloads_pass_each_sides_message_path():
    """The far side records the requesters its DATA payloads' requests name, the near
    side points them at its request listener; the length, sequence numbers and the
    other messages stay; an SM passes untouched."""
    from lbmr_proto import lbmc, lbmc_stream
    from router.core.message_path import MapRequests, MessagePath, RecordRequesters
    from router.core.request_maps import RequesterTable, RequestMap

    c = Counter()
    origin = RmOrigin(SRC, c)
    table = RequesterTable()
    origin.path = MessagePath([RecordRequesters(table, "rm")])
    proxy = RmProxy("192.0.2.7", 24010, "224.10.10.11", 14400, 0x77, c)
    m = RequestMap()
    m.add_spare(("192.0.2.7", 40001))
    proxy.path = MessagePath([MapRequests(m, "proxy")])
    req = lbmc.data_message(3, 9, b"price?", lbmc.RequestHeader(qidx=42, port=14391, ipaddr="10.1.0.9"))
    tick = lbmc.data_message(3, 10, b"tick")
    d = RM.encode_data(14390, 0xCAFE0001, 41, 0, req + tick)
    relayed = origin.from_group(d, SRC_ADDR, 5.0)
    assert relayed == d and table.allows("rm", "10.1.0.9", 14391, 6.0)
    out = proxy.to_receivers(relayed, 6.0)
    got = RM.decode(out)
    assert (got.sqn, len(out)) == (41, len(d)) and got.header == RM.Header(RM.DATA, 24010, 0x77)
    first, second = lbmc_stream.StreamFramer().feed(got.payload)
    assert lbmc.decode(first).header(lbmc.RequestHeader) == lbmc.RequestHeader(qidx=42, port=40001,
                                                                               ipaddr="192.0.2.7")
    assert second == tick
    sm = RM.encode_sm(14390, 0xCAFE0001, 3, 41, 0)
    assert origin.from_group(sm, SRC_ADDR, 7.0) == sm and proxy.to_receivers(sm, 7.0)[8:] == sm[8:]
