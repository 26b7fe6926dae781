"""The LBT-RM data endpoints (lbmr_tools.sim.dataplane.rm) on the multicast
loopback of a network namespace the test creates: a receiver that discards
datagrams on purpose recovers them by NAK, byte-exact; a source that never
answers leaves the receiver with unrecoverable sequences, reported."""

from __future__ import annotations

import json
import sys

from tests import netns

netns_factory = netns.netns_factory

SCRIPT = r'''
import json, sys, trio
from lbmr_tools.sim.dataplane import RmDataSource, RmDataReceiver
answer = sys.argv[1] == "answer"
async def main():
    out = {}
    async with trio.open_nursery() as n:
        src = RmDataSource("127.0.1.1", 0, group="224.10.10.10", dest_port=14400, session_id=0x1234,
                           count=1500, seed=7, rate=3000)
        addr = await n.start(src.serve)
        port = addr[1] if answer else 9  # discard port: the NAKs reach nobody
        rx = RmDataReceiver("127.0.1.1", port, 0x1234, "224.10.10.10", 14400, iface_ip="127.0.1.2",
                            seed=7, expect_count=1500, drop_every=30, nak_interval=0.05,
                            nak_attempts=4, timeout=20)
        out["rx"] = (await rx.run()).as_dict()
        out["src"] = src.counters
        n.cancel_scope.cancel()
    print(json.dumps(out))
trio.run(main)
'''


def _run(ns, mode):
    r = ns.run([sys.executable, "-c", SCRIPT, mode], timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_receiver_recovers_dropped_datagrams_by_nak(netns_factory):
    out = _run(netns_factory(), "answer")
    rx, src = out["rx"], out["src"]
    assert rx["ok"] and rx["received"] == 1500 and rx["corrupt"] == 0, rx
    assert rx["dropped_on_purpose"] == 50 and rx["recovered"] >= 50, rx
    assert rx["naks_sent"] >= 1 and rx["ncfs"] >= 1, rx
    assert src["retransmissions"] >= 50 and src["naks"] == rx["naks_sent"], src


def test_unanswered_naks_leave_sequences_unrecoverable(netns_factory):
    rx = _run(netns_factory(), "silent")["rx"]
    assert not rx["ok"] and rx["unrecoverable"] >= 50 and rx["missing"] >= 50, rx
    assert "unrecoverable" in rx["error"] or "stalled" in rx["error"], rx
    assert rx["recovered"] == 0 and rx["received"] == 1500 - rx["missing"], rx
