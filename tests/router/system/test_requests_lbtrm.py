"""Requests of an LBT-RM origin across a router pair: the routers, the lbmrds,
the source, the requester and the responders run in one process inside a
network namespace the test creates (its loopback does multicast; this
host's does not): tests/router/system/rm_requests_scenario.py. Router B
points each request its multicast proxy sends at its request listener, router
A records the requester from the group's DATA, and 20 requests get 20
responses with their index and payload. The namespace is removed even when
the test fails."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests import netns
from tests.router.helpers import response_payload

netns_factory = netns.netns_factory  # the fixture

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("shape, near", [("pair", "127.0.2.1"), ("chain", "127.0.3.1")])
def test_twenty_requests_of_an_lbtrm_origin_get_twenty_responses(netns_factory, shape, near):
    ns = netns_factory()
    p = ns.run([sys.executable, "-m", "tests.router.system.rm_requests_scenario", shape], cwd=ROOT, timeout=90)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert out["proxy"][0] == near
    assert [q for q, _, _ in out["requests"]] == list(range(100, 120)) and out["payloads_ok"]
    ((ip, port),) = {(ip, port) for _, ip, port in out["requests"]}  # B's one listener for the one requester
    assert ip == near and port != out["request_port"]
    assert out["answers"] == sorted([q, response_payload(q, 0).hex()] for q in range(100, 120))
    assert len(out["callers"]) == 20 and out["failed"] == 0
    a, b = out["a"], out["b"]
    assert b["requests_rewritten"] == 20 and b["request_listeners_opened"] == 1
    assert b["response_streams_opened"] == 20 and a["responses_delivered"] == 20
    assert a["requesters_recorded"] == 1 and a["lbtrm_path_skipped"] == 0 == b["lbtrm_path_skipped"]
    if shape == "chain":  # the middle router: its own listener, the requester it recorded, every response
        m = out["middle"]
        assert m["request_listeners_opened"] == 1 and m["requesters_recorded"] == 1
        assert m["responses_delivered"] == 20 and m["response_streams_opened"] == 20
