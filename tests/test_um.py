"""lbmr_proto.um: UM's topic-resolution model (the one datagram packer, destinations,
keepalives, OTIDs), shared by lbmr-sim and the router."""

from __future__ import annotations

import math

import pytest

import lbmr_proto as L
from lbmr_proto.um import (
    RCV_ALIVE,
    SRC_ALIVE,
    Targets,
    Timing,
    make_otid,
    otid_topic_index,
    pack_records,
    synthesize_otid,
    um_trailer,
)

TRAILER = um_trailer(b"ABCDEFGH", 1, 7)


def test_pack_records_batches_in_order_within_the_size_limit():
    tqrs = [L.TQR(f"q.{i}").encode() for i in range(40)]
    tirs = [L.TIR(f"t.{i}", L.TcpTransport("10.0.0.1", 14371 + i), ttl=60, index=i).encode()
            for i in range(40)]
    out = pack_records(tqrs, tirs, trailer=TRAILER, max_datagram=512)
    assert len(out) > 2 and all(len(d) <= 512 for d in out)
    pkts = [L.decode(d) for d in out]
    assert [q.topic for p in pkts for q in p.tqrs] == [f"q.{i}" for i in range(40)]
    assert [t.topic for p in pkts for t in p.tirs] == [f"t.{i}" for i in range(40)]
    assert all(p.type == L.PacketType.NORMAL and p.version == 1 for p in pkts)
    assert pkts[0].options == [L.SourceIdOption(0x8000, b"ABCDEFGH"), L.SourceTypeOption(0x80, 1),
                               L.VersionOption(0x8001, 0x060E0000), L.LocalDomainOption(0x8000, 7)]
    assert all(d.endswith(TRAILER) for d in out)


def test_pack_records_limits_and_wildcards():
    assert pack_records([], [], trailer=TRAILER) == []
    tqrs = [L.TQR("x").encode()] * 300  # more than the one-byte count
    out = pack_records(tqrs, [], trailer=TRAILER, max_datagram=65000)
    assert [len(L.decode(d).tqrs) for d in out] == [255, 45]
    wc = pack_records([L.WcTQR("^md\\.", 1).encode()], [], trailer=TRAILER,
                      ptype=L.PacketType.WC_TQR)
    (p,) = [L.decode(d) for d in wc]
    assert p.type == L.PacketType.WC_TQR and p.wc_tqrs[0].pattern == "^md\\."


def test_targets_round_robin_and_keepalives():
    d = [("127.0.0.1", 15380), ("127.0.0.2", 15380)]
    t = Targets(d, None, Timing(), start=10.0)
    assert [t.destination(10.0 + k * 0.2 + 0.01) for k in range(3)] == [d[0], d[1], d[0]]
    assert t.keepalive_deadline() == -math.inf and t.keepalive_deadline(since=10.0) == 10.5
    assert t.keepalives(10.0, since=10.0) == []
    assert t.keepalives(10.5, since=10.0) == [(RCV_ALIVE, d[0]), (RCV_ALIVE, d[1])]
    assert t.send_tr(10.6) == d[1] and t.keepalive_deadline() == 11.0
    assert t.keepalives(11.0) == [(SRC_ALIVE, d[0])]
    m = Targets([], ("224.9.10.11", 12965), Timing(), start=0.0)
    assert m.send_tr(5.0) == ("224.9.10.11", 12965) and m.keepalives(99.0) == []
    assert m.keepalive_deadline() == math.inf
    with pytest.raises(ValueError):
        m.current_daemon(0.0)


def test_otids():
    t = L.LbtruTransport("10.1.2.3", 14380)
    otid = make_otid(t, 77, b"\x01\x02\x03\x04", 1, 99)
    assert len(otid) == 32 and otid[0] == t.TYPE and otid[-1] == 1
    assert otid_topic_index(otid) == 77
    assert otid_topic_index(synthesize_otid(L.TcpTransport("10.1.2.3", 14371), 5)) == 5
    assert synthesize_otid(t, 5) == synthesize_otid(t, 5) != synthesize_otid(t, 6)
