"""The LBT-RM data endpoints (lbmr_tools.sim.dataplane.rm) on the multicast
loopback of a network namespace the test creates: a receiver that discards
datagrams on purpose recovers them by NAK, byte-exact; a source that never
answers leaves the receiver with unrecoverable sequences, reported; a receiver
that loses retransmissions too NAKs again inside the source's ignore interval
and gets NCFs "NAK ignored"; a source that exits after its data leaves the
NAKs after it unanswered."""

from __future__ import annotations

import json
import sys

import click
import pytest

from lbmr_tools.sim.cli import parse_args
from tests import netns

netns_factory = netns.netns_factory

SCRIPT = r'''
import json, sys, trio
from lbmr_tools.sim.dataplane import RmDataSource, RmDataReceiver
answer = sys.argv[1] != "silent"
src_kw = dict(ignored=dict(ignore_interval=0.3), exits=dict(linger=0)).get(sys.argv[1], {})
rx_kw = dict(ignored=dict(drop_copies=2)).get(sys.argv[1], {})
async def main():
    out = {}
    async with trio.open_nursery() as n:
        src = RmDataSource("127.0.1.1", 0, group="224.10.10.10", dest_port=14400, session_id=0x1234,
                           count=1500, seed=7, rate=3000, **src_kw)
        addr = await n.start(src.serve)
        port = addr[1] if answer else 9  # discard port: the NAKs reach nobody
        rx = RmDataReceiver("127.0.1.1", port, 0x1234, "224.10.10.10", 14400, iface_ip="127.0.1.2",
                            seed=7, expect_count=1500, drop_every=30, nak_interval=0.05,
                            nak_attempts=4 if sys.argv[1] != "ignored" else 25, timeout=20, **rx_kw)
        out["rx"] = (await rx.run()).as_dict()
        await trio.sleep(0.2)  # (the source counts a datagram once its send returned)
        out["src"] = dict(src.counters, exited=src.exited)
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


def test_lbmr_sim_lbtrm_sources_and_receivers_recover_by_nak(netns_factory):
    """lbmr-sim with LBT-RM data: two contexts on one multicast TRD, each
    receiver discards every 25th datagram once and recovers it by NAK."""
    ns = netns_factory()
    r = ns.run([sys.executable, "-m", "lbmr_tools.sim", "--multicast", "224.9.10.11:12965",
                "--mc-interface", "127.0.1.1", "--bind-base", "127.0.1.1", "--contexts", "2",
                "--topics", "2", "--transport", "lbtrm", "--data-datagrams", "2000", "--data-rate",
                "4000", "--verify-data", "--data-drop-every", "25", "--duration", "30", "--json"],
               timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert len(report["receivers"]) == 2
    for rcv in report["receivers"]:
        d = rcv["data"]
        assert rcv["transport"].startswith("LBTRM 127.0.1.") and d["kind"] == "lbtrm", rcv
        assert d["ok"] and d["datagrams"] == 2000 and d["detail"]["dropped_on_purpose"] == 80, d
        assert d["detail"]["recovered"] >= 80 and d["detail"]["naks_sent"] >= 1, d
    sources = report["data_sources"]
    assert [s["kind"] for s in sources] == ["lbtrm", "lbtrm"]
    assert all(s["counters"]["retransmissions"] >= 80 for s in sources), sources


def test_lbmr_sim_lbtrm_data_options():
    cfg, _ = parse_args(["--transport", "lbtrm", "--data-datagrams", "10", "--data-drop-every", "3"])
    assert (cfg.transport, cfg.data_datagrams, cfg.data_drop_every) == ("lbtrm", 10, 3)
    for argv in (["--data-drop-every", "-1"],
                 ["--transport", "lbtrm", "--data-datagrams", "10", "--data-datagram-size", "27"]):
        with pytest.raises(click.UsageError):
            parse_args(argv)


def test_naks_inside_the_ignore_interval_get_ncf_nak_ignored(netns_factory):
    out = _run(netns_factory(), "ignored")
    rx, src = out["rx"], out["src"]
    # each of the 50 datagrams: original and first retransmission discarded, NAKed again every 50 ms,
    # ignored for 300 ms after each retransmission, then retransmitted again
    assert rx["ok"] and rx["dropped_on_purpose"] == 50 and rx["recovered"] >= 50, rx
    assert src["retransmissions_ignored"] >= 50 and src["ncfs_ignored_sent"] >= 1, src
    assert src["retransmissions"] >= 100 and rx["ncfs"] == src["ncfs_sent"] + src["ncfs_ignored_sent"], (rx, src)


def test_a_source_that_exits_leaves_later_naks_unanswered(netns_factory):
    out = _run(netns_factory(), "exits")
    rx, src = out["rx"], out["src"]
    assert src["exited"] and src["sms_sent"] == 0 and src["datagrams_sent"] == 1500, src
    assert not rx["ok"] and rx["unrecoverable"] >= 1 and rx["naks_sent"] > src["naks"], (rx, src)
    assert rx["dropped_on_purpose"] == 50 and rx["recovered"] + rx["unrecoverable"] >= 50, rx
