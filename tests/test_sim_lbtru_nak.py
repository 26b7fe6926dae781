"""LBT-RU receivers NAK their gaps and take the retransmissions, as UM's do
(lbmr_tools.sim.dataplane.rulive with ``nak``), and lbmr-sim's LBT-RU
receivers do so."""

from __future__ import annotations

import trio

from lbmr_proto import lbtru as RU
from lbmr_tools.sim import SimConfig, run_sim
from lbmr_tools.sim.dataplane import RuLiveReceiver, RuLiveSource
from lbmrd.server import Daemon, Settings
from tests.helpers import udp_forwarder

LO = "127.0.0.1"


def _drop_data(nth: int):
    """A ``drop`` for udp_forwarder: the ``nth`` DATA (first copies only) from the source."""
    seen = [0]

    def drop(data: bytes) -> bool:
        msg = RU.decode(data)
        if isinstance(msg, RU.Data) and not msg.retransmission:
            seen[0] += 1
            return seen[0] == nth
        return False
    return drop


async def test_a_lost_datagram_is_naked_and_recovered():
    async with trio.open_nursery() as nursery:
        src = RuLiveSource(LO, 0, seed=4, rate=3000, datagram_size=300)
        addr = await nursery.start(src.serve)
        front = await nursery.start(lambda task_status: udp_forwarder(addr, drop=_drop_data(20),
                                                                    task_status=task_status))
        r = await RuLiveReceiver(*front, expect_count=100, seed=4, nak=True).run()
        nursery.cancel_scope.cancel()
    assert r.ok, r
    assert (r.missing_found, r.recovered, r.unrecovered) == (1, 1, 0) and r.naks_sent >= 1
    assert r.messages >= 100 and r.messages == r.last_sqn - r.first_sqn + 1
    (c,) = src.clients.values()
    assert c.naks >= 1 and c.retransmitted >= 1


async def test_discarded_datagrams_come_back_by_nak():
    async with trio.open_nursery() as nursery:
        src = RuLiveSource(LO, 0, seed=5, rate=5000, datagram_size=200)
        addr = await nursery.start(src.serve)
        r = await RuLiveReceiver(*addr, expect_count=500, seed=5, nak=True, drop_every=10).run()
        nursery.cancel_scope.cancel()
    assert r.ok, r
    assert r.dropped_on_purpose >= 49 and r.recovered == r.dropped_on_purpose and r.unrecovered == 0
    assert r.retransmissions >= r.recovered and src.counters["naks"] >= 1


async def test_an_ncf_do_not_retry_ends_the_run_with_the_sequence_named():
    async with trio.open_nursery() as nursery:
        src = RuLiveSource(LO, 0, seed=6, rate=3000, datagram_size=200, retransmit_window=0)
        addr = await nursery.start(src.serve)
        front = await nursery.start(lambda task_status: udp_forwarder(addr, drop=_drop_data(10),
                                                                    task_status=task_status))
        r = await RuLiveReceiver(*front, expect_count=100, seed=6, nak=True).run()
        nursery.cancel_scope.cancel()
    assert not r.ok and r.ncfs >= 1 and r.unrecovered == 1
    assert r.error == f"sequence {r.first_live_sqn + 9} cannot be retransmitted (NCF, no retry)"


async def test_a_nak_without_answer_is_given_up_after_its_attempts(autojump_clock):
    async with trio.open_nursery() as nursery:
        src = RuLiveSource(LO, 0, seed=7, rate=1000, datagram_size=200)
        addr = await nursery.start(src.serve)

        def drop(data: bytes) -> bool:  # the 5th DATA, and every retransmission
            msg = RU.decode(data)
            return isinstance(msg, RU.Data) and (msg.retransmission or msg.sqn == 4)
        front = await nursery.start(lambda task_status: udp_forwarder(addr, drop=drop, task_status=task_status))
        r = await RuLiveReceiver(*front, expect_count=100, seed=7, nak=True, nak_attempts=3).run()
        nursery.cancel_scope.cancel()
    assert not r.ok and r.error == "sequence 4 still missing after 3 NAKs" and r.naks_sent == 3


async def test_sim_lbtru_receivers_recover_what_they_discard():
    async with trio.open_nursery() as nursery:
        d = Daemon(Settings(bind_ip=LO, port=0, stats_interval=0))
        addr = await nursery.start(d.run)
        cfg = SimConfig(daemons=[addr], contexts=2, topics=2, transport="lbtru", bind_base="127.0.6.21",
                        data_datagrams=400, data_datagram_size=300, data_rate=4000, data_drop_every=20,
                        verify_data=True, duration=30.0)
        res = await run_sim(cfg)
        nursery.cancel_scope.cancel()
    assert res.all_resolved and res.all_data_verified, [r.data for r in res.receivers]
    for r in res.receivers:
        d = r.data["detail"]
        assert d["dropped_on_purpose"] >= 19 and d["recovered"] == d["dropped_on_purpose"] and d["naks_sent"] >= 1
