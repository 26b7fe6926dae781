"""router.core.lbtru_fanout: an LBT-RM session re-published as an LBT-RU source,
sans-IO (no sockets, time passed in)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbmr_proto import lbtrm as RM
from lbmr_proto import lbtru as RU
from router.core.lbtru_fanout import RuFanout
from router.core.lbtru_origin import LbtrmInput
from router.core.lbtru_window import WindowBudget

SID = 0x5E55
A, B = ("10.0.0.5", 14360), ("10.0.0.6", 14361)


def rm_data(q: int, payload: bytes = b"", *, rx: bool = False) -> bytes:
    flags = RM.FLAG_UNICAST_NAKS | (RM.FLAG_RETRANSMISSION if rx else 0)
    return RM.encode_data(14400, 77, q, 0, payload or q.to_bytes(4, "big") * 8, flags=flags)


def decoded(out):
    return [(RU.decode(b), a) for b, a in out]


def connect(f: RuFanout, addr, now: float = 0.0, *, confirm: bool = True):
    (syn, to), = decoded(f.from_client(RU.encode_creq(session_id=SID), addr, now))
    assert to == addr and isinstance(syn, RU.SessionMessage) and syn.syn
    if confirm:
        assert f.from_client(RU.encode_ack(0, session_id=SID, client_id=syn.header.client_id), addr, now) == []
    return syn


def test_connect_then_data_only_after_the_first_ack():
    f = RuFanout(SID, origin=LbtrmInput(1, 2))
    f.from_peer(rm_data(10), 0.0)  # before anyone connects: kept
    syn = connect(f, A, 0.1, confirm=False)
    assert (syn.lead_sqn, syn.trail_sqn, syn.header.session_id, syn.header.client_id) == (10, 0, SID, 1)
    assert f.from_peer(rm_data(11), 0.2) == []  # unconfirmed: nothing (a CREQ may be spoofed)
    f.from_client(RU.encode_ack(0, session_id=SID), A, 0.3)
    ((d, to),) = decoded(f.from_peer(rm_data(12, b"payload"), 0.4))
    assert to == A and isinstance(d, RU.Data) and (d.sqn, d.trail_sqn, d.payload) == (12, 0, b"payload")
    assert d.header.session_id == SID and not d.retransmission
    # what it missed meanwhile it NAKs, and gets from the buffer
    out = decoded(f.from_client(RU.encode_nak([11], session_id=SID), A, 0.5))
    assert [(m.sqn, m.retransmission, m.payload) for m, _ in out] == [(11, True, (11).to_bytes(4, "big") * 8)]
    assert f.counters["lbtru_clients_connected"] == 1 and f.counters["lbtru_retransmissions"] == 1


def test_a_repeated_creq_is_answered_again_with_the_same_client_id():
    f = RuFanout(SID)
    s1 = connect(f, A)
    s2 = connect(f, A)
    s3 = connect(f, B)
    assert s1.header.client_id == s2.header.client_id == 1 and s3.header.client_id == 2
    assert s2.sm_sqn == s1.sm_sqn + 1 and len(f.clients) == 2


def test_a_sequence_lost_on_the_way_is_naked_towards_the_origin_once():
    f = RuFanout(SID, origin=LbtrmInput(4321, 0xABC), nak_ignore=0.2)
    connect(f, A)
    connect(f, B)
    f.from_peer(rm_data(1), 0.0)
    f.from_peer(rm_data(3), 0.0)  # 2 never came
    (ncf, to), = decoded(f.from_client(RU.encode_nak([2], session_id=SID), A, 0.01))
    assert isinstance(ncf, RU.Ncf) and ncf.reason == RU.NCF_RX_DELAY and ncf.sqns == (2,) and to == A
    (nak,) = f.take_naks_up()
    m = RM.decode(nak)
    assert isinstance(m, RM.Nak) and m.sqns == (2,) and (m.header.ucast_port, m.header.session_id) == (4321, 0xABC)
    f.from_client(RU.encode_nak([2], session_id=SID), B, 0.05)  # within nak_ignore: not again
    assert f.take_naks_up() == []
    f.from_client(RU.encode_nak([2], session_id=SID), B, 0.30)  # later: again
    assert len(f.take_naks_up()) == 1
    # the origin's retransmission goes to the two clients waiting, as a retransmission
    out = decoded(f.from_peer(rm_data(2, b"two", rx=True), 0.4))
    assert sorted(to for _, to in out) == [A, B]
    assert all(m.retransmission and m.sqn == 2 and m.payload == b"two" for m, _ in out)
    assert f.pending == {} and f.from_peer(rm_data(2, b"two", rx=True), 0.5) == []  # a duplicate


def test_what_the_router_never_saw_is_asked_of_the_origin_back_to_its_trail():
    f = RuFanout(SID, window=100)
    connect(f, A)
    f.from_peer(RM.encode_data(1, 2, 50, 30, b"x"), 0.0)  # joined late: the origin keeps 30..
    assert f.trail == 30
    out = decoded(f.from_client(RU.encode_nak([29, 30, 49], session_id=SID), A, 0.0))
    assert {m.reason: m.sqns for m, _ in out} == {RU.NCF_NO_RETRY: (29,), RU.NCF_RX_DELAY: (30, 49)}
    assert RM.decode(f.take_naks_up()[0]).sqns == (30, 49)
    ((d, _),) = decoded(f.from_peer(rm_data(30, b"old", rx=True), 0.1))
    assert d.sqn == 30 and d.retransmission and d.payload == b"old"


def test_naks_older_than_the_window_ahead_of_the_lead_and_rate_limited():
    f = RuFanout(SID, window=4, rx_burst=2, rx_rate=1.0)
    connect(f, A)
    for q in range(10):
        f.from_peer(rm_data(q), 0.0)
    assert sorted(f.buffer) == [6, 7, 8, 9] and f.trail == 6
    out = decoded(f.from_client(RU.encode_nak([1, 6, 7, 8, 50], session_id=SID), A, 0.0))
    data = [m.sqn for m, _ in out if isinstance(m, RU.Data)]
    ncfs = {m.reason: m.sqns for m, _ in out if isinstance(m, RU.Ncf)}
    assert data == [6, 7] and ncfs == {RU.NCF_NO_RETRY: (1,), RU.NCF_SHED: (8,)}
    assert f.counters["lbtru_naks_ahead"] == 1 and f.counters["lbtru_retransmissions_limited"] == 1


def test_the_window_is_bounded_in_bytes_and_a_jump_starts_over():
    f = RuFanout(SID, window=1000, window_bytes=100)
    for q in range(10):
        f.from_peer(rm_data(q, b"x" * 30), 0.0)
    assert f.buffer_bytes <= 100 and sorted(f.buffer) == [7, 8, 9]
    f.from_peer(rm_data(2**32 - 1, b"y"), 0.0)  # far past the window: a new start
    assert list(f.buffer) == [2**32 - 1] and f.trail == 2**32 - 1000
    assert f.counters["lbtru_origin_sequence_jump"] == 1
    g = RuFanout(SID, window=1000)
    g.from_peer(rm_data(0), 0.0)
    g.from_peer(RM.encode_sm(1, 2, 0, 5000, 0), 0.0)  # an SM's lead as well
    assert g.buffer == {} and (g.trail, g.lead) == (4001, 5000)  # what it may ask of the origin


def test_session_messages_back_off_while_no_data_flows():
    f = RuFanout(SID, sm_min=0.2, sm_max=1.0)
    connect(f, A)
    connect(f, B, confirm=False)
    f.from_peer(rm_data(5), 0.0)
    times = []
    now = 0.0
    for _ in range(7):
        out, nxt = f.tick(now)
        if out:
            times.append(round(now, 3))
            assert {to for _, to in out} == {A}  # confirmed clients only
            f.from_client(RU.encode_ack(5, session_id=SID), A, now)
        now = nxt
    assert times == [0.2, 0.6, 1.4, 2.4, 3.4]  # B (unconfirmed) expired at 2.0 meanwhile
    (sm, _), = decoded(f.tick(3.4 + 1.0)[0])
    assert isinstance(sm, RU.SessionMessage) and not sm.syn and sm.lead_sqn == 5
    assert B not in f.clients and f.counters["lbtru_clients_expired"] == 1


def test_silent_clients_expire_with_an_rst_and_unknown_ones_get_one():
    f = RuFanout(SID, client_timeout=10.0, connect_timeout=2.0)
    connect(f, A, 0.0)
    connect(f, B, 0.0, confirm=False)
    out, _ = f.tick(2.0)
    assert out == [] and set(f.clients) == {A}  # the unconfirmed one: silently
    f.from_client(RU.encode_ack(0, session_id=SID), A, 5.0)
    assert f.tick(14.9)[0] == [] and A in f.clients
    out, _ = f.tick(15.0)
    assert [(type(m), to) for m, to in decoded(out)] == [(RU.Rst, A)] and not f.clients
    (rst, to), = decoded(f.from_client(RU.encode_ack(0, session_id=SID), A, 16.0))
    assert isinstance(rst, RU.Rst) and to == A and f.counters["lbtru_unknown_client"] == 1


def test_the_client_table_is_bounded_and_spoofed_creqs_only_replace_unconfirmed_clients():
    f = RuFanout(SID, max_clients=3)
    connect(f, A)
    sent = 0
    for i in range(100):  # a CREQ flood from spoofed addresses
        out = f.from_client(RU.encode_creq(session_id=SID), ("10.9.0.1", 1000 + i), i * 0.001)
        assert len(out) == 1 and len(out[0][0]) <= 32
        sent += len(out)
    assert len(f.clients) == 3 and A in f.clients and sent == 100
    assert f.counters["lbtru_clients_replaced"] == 98
    # and nothing but the real client gets data
    assert [to for _, to in f.from_peer(rm_data(1), 1.0)] == [A]
    connect(f, B)
    connect(f, ("10.0.0.7", 1))
    out = f.from_client(RU.encode_creq(session_id=SID), ("10.0.0.8", 1), 1.0)
    assert out == [] and f.counters["lbtru_clients_full"] == 1  # all three confirmed


def test_foreign_and_malformed_datagrams_are_counted_and_dropped():
    f = RuFanout(SID)
    connect(f, A)
    assert f.from_client(b"\x00", A, 0) == []
    assert f.from_client(RU.encode_ack(0, session_id=SID + 1), A, 0) == []
    assert f.from_client(RU.encode_data(1, 0, b"x", session_id=SID), A, 0) == []
    assert f.from_peer(b"junk", 0) == []
    assert f.from_peer(RM.encode_ncf(1, 2, 0, [1]), 0) == []
    opt = bytearray(rm_data(1))
    opt[1] = 1  # an LBT-RM option header: the payload cannot be told
    assert f.from_peer(bytes(opt), 0) == [] and f.buffer == {}
    c = f.counters
    assert (c["lbtru_malformed"], c["lbtru_other_session"], c["lbtru_unexpected_type"], c["lbtru_rm_malformed"],
            c["lbtru_rm_not_data"], c["lbtru_rm_options_dropped"]) == (1, 1, 1, 1, 1, 1)


def test_close_resets_the_confirmed_clients():
    f = RuFanout(SID)
    connect(f, A)
    connect(f, B, confirm=False)
    assert [(type(m), to) for m, to in decoded(f.close())] == [(RU.Rst, A)] and not f.clients


def test_bad_bounds():
    with pytest.raises(ValueError):
        RuFanout(SID, max_clients=0)


@given(st.lists(st.tuples(st.booleans(), st.binary(max_size=60)), max_size=40))
def test_any_input_is_handled(items):
    f = RuFanout(SID, counters=Counter(), window=16)
    connect(f, A)
    for i, (from_peer, data) in enumerate(items):
        out = f.from_peer(data, i * 0.01) if from_peer else f.from_client(data, A, i * 0.01)
        assert all(isinstance(b, bytes) for b, _ in out)
        f.tick(i * 0.01)
    assert len(f.buffer) <= 16


def test_a_nak_flood_from_a_client_is_cut_and_long_naks_truncated():
    f = RuFanout(SID, window=100)
    connect(f, A)
    for q in range(10):
        f.from_peer(rm_data(q), 0.0)
    answered = 0
    for _ in range(200):  # at one instant: the burst of 50 passes, the rest is dropped
        answered += bool(f.from_client(RU.encode_nak([1], session_id=SID), A, 1.0))
    assert answered == 50 and f.counters["lbtru_naks_rate_limited"] == 150
    # a NAK far longer than a UM NAK (a 64 KiB datagram): only its first MAX_NAKS sequences count
    n = RU.MAX_NAKS + 1000
    huge = bytes([RU.NAK, 0, 0, 0]) + RU.NAK_HDR.pack(n, 0) + (50).to_bytes(4, "big") * n
    assert len(RU.decode(huge).sqns) == n
    f.from_client(huge, A, 2.0)
    assert f.counters["lbtru_nak_truncated"] == 1 and f.counters["lbtru_naks_ahead"] == 1


class _NoScan(dict):
    """A pending table that must not be scanned whole (one client's expiry
    touches that client's own entries only)."""

    def values(self):
        raise AssertionError("the whole pending table scanned")

    def items(self):
        raise AssertionError("the whole pending table scanned")

    def __iter__(self):
        raise AssertionError("the whole pending table scanned")


def test_an_expiring_client_forgets_its_own_pending_naks_without_scanning_all():
    f = RuFanout(SID, window=1000, client_timeout=10.0)
    f.from_peer(RM.encode_data(1, 2, 999, 0, b"x"), 0.0)  # joined late: 0..998 can be asked of the origin
    connect(f, A)
    connect(f, B)
    f.from_client(RU.encode_nak(list(range(0, 300)), session_id=SID), A, 0.0)
    f.from_client(RU.encode_nak(list(range(200, 400)), session_id=SID), B, 0.0)
    assert f.pending_naks == 500 and len(f.pending) == 400
    f.pending = _NoScan(f.pending)
    f.from_client(RU.encode_ack(0, session_id=SID), B, 5.0)
    f.tick(10.0)  # A expires, B stays
    assert set(f.clients) == {B} and f.counters["lbtru_clients_expired"] == 1
    assert f.pending_naks == 200 and sorted(dict(f.pending)) == list(range(200, 400))
    assert all(v == {B} for v in dict.values(f.pending))
    # the origin's retransmission goes to B alone, and leaves nothing pending
    assert [to for _, to in f.from_peer(rm_data(250, rx=True), 10.1)] == [B]
    assert f.pending_naks == 199 and f.clients[B].waiting == set(range(200, 400)) - {250}


def test_a_sequence_that_wraps_or_restarts_far_behind_starts_the_window_over():
    f = RuFanout(SID, window=100)
    connect(f, A)
    sent = list(range(2**32 - 16, 2**32)) + list(range(0, 10))  # the origin's u32 wraps
    got = [RU.decode(b).sqn for q in sent for b, _ in f.from_peer(rm_data(q), 0.0)]
    assert got == sent and f.counters["lbtru_origin_sequence_jump"] == 1 and (f.trail, f.lead) == (0, 9)
    # one stray datagram far ahead does not shut out the rest of the session
    g = RuFanout(SID, window=100)
    connect(g, A)
    for q in range(50):
        g.from_peer(rm_data(q), 0.0)
    g.from_peer(rm_data(2**31), 0.0)
    got = [RU.decode(b).sqn for q in range(50, 60) for b, _ in g.from_peer(rm_data(q), 0.0)]
    assert got == list(range(50, 60)) and g.counters["lbtru_origin_sequence_jump"] == 2
    # a late retransmission just behind the window is still too old, not a restart
    h = RuFanout(SID, window=100)
    for q in range(200):
        h.from_peer(rm_data(q), 0.0)
    h.from_peer(rm_data(50, rx=True), 0.0)
    assert h.counters["lbtru_origin_too_old"] == 1 and (h.trail, h.lead) == (100, 199)
    assert h.counters["lbtru_origin_sequence_jump"] == 0


def test_retransmissions_are_bounded_for_the_proxy_as_a_whole_and_shared_out_evenly():
    f = RuFanout(SID, window=1000, max_clients=64)
    for q in range(1000):
        f.from_peer(rm_data(q), 0.0)
    addrs = [("10.0.1.1", 2000 + i) for i in range(40)]
    for a in addrs:
        connect(f, a)
    nak = RU.encode_nak(range(0, RU.MAX_NAKS), session_id=SID)

    def sent(clients, now):
        return [sum(isinstance(m, RU.Data) for m, _ in decoded(f.from_client(nak, a, now))) for a in clients]

    # 39 clients NAK at one instant: beyond ten NAKing, each gets 5000 shared by the clients
    # NAKing so far, not its own burst of 500 (with 361 asked: the first 13 all)
    first = sent(addrs[:-1], 1.0)
    assert first[:13] == [361] * 13 and first[13:] == [min(361, 5000 // n) for n in range(14, 40)]
    assert sum(first) == 10051 and f.counters["lbtru_retransmissions_limited"] == 39 * 361 - 10051
    # ... the 40th still gets its share
    assert sent(addrs[-1:], 1.0) == [125]
    # ... then all of them 20000 a second together (what is left of the bursts spent at 1.1)
    sent(addrs, 1.1)
    assert sum(sent(addrs, 1.2)) <= 2000
    # when the others have stopped NAKing (for a second), a client gets its whole burst again
    assert sent(addrs[:5], 3.0) == [361] * 5


class _NoScanClients(dict):
    """A client table that must not be scanned whole."""

    def values(self):
        raise AssertionError("the whole client table scanned")

    def __iter__(self):
        raise AssertionError("the whole client table scanned")


def test_unconfirmed_clients_cost_nothing_per_datagram_or_timer_wake_up():
    """A CREQ flood fills the table with unconfirmed clients (each kept
    connect_timeout): data, the timer and its next wake-up look at the
    confirmed clients and at the clients due to expire only."""
    f = RuFanout(SID, max_clients=2000, connect_timeout=2.0, client_timeout=10.0)
    connect(f, A, 0.0)
    for i in range(1000):
        f.from_client(RU.encode_creq(session_id=SID), ("10.9.0.1", 1000 + i), i * 0.001)
    f.from_client(RU.encode_ack(0, session_id=SID), A, 1.5)
    f.clients = _NoScanClients(f.clients)
    assert [to for _, to in f.from_peer(rm_data(1), 1.5)] == [A]
    assert f.next_due() == 1.7  # the SM (sm_min after the data); then the first CREQ's expiry at 2.0
    out, due = f.tick(1.7)
    assert [to for _, to in out] == [A] and due == 2.0
    out, due = f.tick(2.0005)  # the first one expired (silently)
    assert out == [] and due == pytest.approx(2.001) and len(f.clients) == 1000
    assert f.counters["lbtru_clients_expired"] == 1
    # a repeated CREQ keeps an unconfirmed client for another connect_timeout
    f.from_client(RU.encode_creq(session_id=SID), ("10.9.0.1", 1001), 2.0008)
    f.tick(2.0025)
    assert ("10.9.0.1", 1001) in f.clients and ("10.9.0.1", 1002) not in f.clients
    assert f.next_due() == pytest.approx(2.003) and f.counters["lbtru_clients_expired"] == 2
    f.tick(5.0)
    assert list(dict.keys(f.clients)) == [A] and f.counters["lbtru_clients_expired"] == 1000


def test_the_proxies_of_an_endpoint_share_one_window_budget(monkeypatch):
    monkeypatch.setattr(WindowBudget, "MIN_SHARE", 100)
    budget = WindowBudget(1000)
    f, g = RuFanout(SID, budget=budget), RuFanout(SID + 1, budget=budget)
    for q in range(20):
        f.from_peer(rm_data(q, b"f" * 100), 0.0)
    assert 900 <= budget.used <= 1000 and f.buffer_bytes == budget.used  # f alone (g empty): the budget
    for q in range(8):
        g.from_peer(rm_data(q, b"g" * 100), 0.0)
    # g adds data while they are over: each is cut to its fair share (500), f's oldest first
    assert budget.used <= 1000 and f.buffer_bytes == 500 and g.buffer_bytes == 500
    assert sorted(f.buffer) == [15, 16, 17, 18, 19] and sorted(g.buffer) == [3, 4, 5, 6, 7]
    f.close()
    assert budget.used == g.buffer_bytes and f.buffer_bytes == 0 and budget.members == [g]
    g.close()
    assert budget.used == 0 and budget.members == []
