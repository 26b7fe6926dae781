"""Hostile late-join and OTR traffic across routers: a source whose TIR names a
request port the router must not connect to (router A's own loopback while its
endpoint is not on loopback). Runs tests/router/system/recovery_source_scenario.py in
a network namespace the test creates (TRD1 and TRD2 are local, non-loopback networks
there); the namespace is removed even when the test fails."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests import netns
from tests.router.system.recovery_source_scenario import TRD_NETS

netns_factory = netns.netns_factory  # the fixture

ROOT = Path(__file__).resolve().parents[3]


def test_a_tir_naming_the_routers_own_loopback_as_request_port_makes_no_connection(netns_factory):
    ns = netns_factory()
    for net in TRD_NETS:
        ns.ip("route", "add", "local", net, "dev", "lo")
    r = ns.run([sys.executable, "-m", "tests.router.system.recovery_source_scenario"], cwd=ROOT, timeout=40)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["b"]["recovery_requests"] == 1 and out["b"]["recovery_streams_opened"] == 1, out
    assert out["accepted"] == [], out  # router A connected nowhere on the TIR's word
    assert out["a"] == {"recovery_refused_source_address": 1, "recovery_streams_accepted": 0,
                        "recovery_source_unreachable": 0}, out
    assert out["b"]["recovery_streams_refused_by_peer"] == 1, out
