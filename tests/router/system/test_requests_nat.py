"""Requests and responses across a real NAT. Three network namespaces the test
creates:

    site A (TRD1)                       NAT                         site B (TRD2)
    lo: 10.1.0.0/24 local               forwards; nftables          lo: 10.1.0.0/24 local
    lbmrd, router A (initiator),        masquerades what leaves     lbmrd, router B (acceptor
    requester 10.1.0.5                  by the outside interface    on 198.18.0.2), responders
    172.16.1.2 ---- veth ---- 172.16.1.1 | 198.18.0.1 ---- veth ---- 198.18.0.2
    (default route via the NAT)                                    (no route to 172.16.1.0/24)

Both TRDs use the same private addresses (10.1.0.0/24: lbmrd and router at
10.1.0.1 on each side); only the peer link crosses the NAT, and router B sees
it come from the NAT's outside address. The requester's 20 requests name its
request port at 10.1.0.5, an address of site B's own network there: router B
points them at its own request listener, the responders connect to it, and
the 20 responses reach the requester through the link with their index and
payload. Runs tests/router/system/nat_requests_scenario.py in each site.
The namespaces are removed even when the test fails."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import netns
from tests.router.helpers import request_payload, response_payload
from tests.router.system.nat_requests_scenario import (
    PEER_PORT,
    REQUESTER_IP,
    RESPONDER_IP,
    TRD_IP,
    TRD_NET,
)

netns_factory = netns.netns_factory  # the fixture

ROOT = Path(__file__).resolve().parents[3]
SITE_A, NAT_IN = "172.16.1.2", "172.16.1.1"
NAT_OUT, SITE_B = "198.18.0.1", "198.18.0.2"
SCENARIO = [sys.executable, "-m", "tests.router.system.nat_requests_scenario"]


def nat_ruleset(inside: str, outside: str) -> str:
    """Masquerade what leaves by ``outside``; forward from ``inside`` out, and back only what
    belongs to a connection made from inside."""
    return f"""
table ip nat {{
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname "{outside}" counter masquerade
  }}
}}
table ip filter {{
  chain forward {{
    type filter hook forward priority filter; policy drop;
    ct state established,related accept
    iifname "{inside}" oifname "{outside}" accept
  }}
}}
"""


def build(factory):
    """The three namespaces (site A, NAT, site B), wired and routed; fails the test with the
    reason when the NAT cannot be set up."""
    if shutil.which("nft") is None:
        pytest.fail("nft(8) is missing: this test needs a real NAT; install the Debian package nftables "
                    "(scripts/test does)", pytrace=False)
    a, nat, b = factory(), factory(), factory()
    _, nat_in = netns.veth(a, f"{SITE_A}/24", nat, f"{NAT_IN}/24")
    nat_out, _ = netns.veth(nat, f"{NAT_OUT}/24", b, f"{SITE_B}/24")
    for site in (a, b):  # the TRD's private network, the same on both sides
        site.ip("route", "add", "local", TRD_NET, "dev", "lo")
    a.ip("route", "add", "default", "via", NAT_IN)
    fwd = nat.run(["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"], timeout=10)
    rules = nat.run(["nft", "-f", "-"], input=nat_ruleset(nat_in, nat_out), timeout=10)
    if fwd.returncode or rules.returncode:
        pytest.fail(f"cannot set up the NAT namespace: forwarding: {fwd.stderr.strip()!r}; "
                    f"nft: {rules.stderr.strip()!r}", pytrace=False)
    return a, nat, b


def test_twenty_requests_through_a_nat_between_trds_of_the_same_addresses(netns_factory):
    a, nat, b = build(netns_factory)
    # site B cannot reach site A's link (nor, being 10.1.0.0/24 itself, A's TRD): only the NAT
    assert "unreachable" in b.run(["ip", "route", "get", SITE_A]).stderr
    assert "local" in b.run(["ip", "route", "get", REQUESTER_IP]).stdout
    pipes = {"cwd": ROOT, "stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE,
             "text": True}
    rcv = b.popen(SCENARIO + ["receivers", SITE_B], **pipes)
    org = a.popen(SCENARIO + ["origin", SITE_B], **pipes)
    try:
        first = org.stdout.readline()  # "done" (its 20 responses came), or nothing: it failed (within 25 s)
        # the link, still up: A connects from its own address to B's; B sees the NAT's address
        a_side = a.run(["ss", "-Htn", "state", "established", f"dport = :{PEER_PORT}"]).stdout.split()
        b_side = b.run(["ss", "-Htn", "state", "established", f"sport = :{PEER_PORT}"]).stdout.split()
        ruleset = nat.run(["nft", "list", "table", "ip", "nat"]).stdout
    finally:
        reports = {}
        for name, p in (("origin", org), ("receivers", rcv)):
            try:
                reports[name] = p.communicate(timeout=20)  # closes its standard input: it reports
            except subprocess.TimeoutExpired:
                p.kill()
                reports[name] = p.communicate()
    (out_a, err_a), (out_b, err_b) = reports["origin"], reports["receivers"]
    logs = f"origin:\n{err_a[-3000:]}\nreceivers:\n{err_b[-3000:]}"
    assert first == "done\n" and org.returncode == 0 and rcv.returncode == 0, logs
    assert out_b.startswith("done\n"), logs
    sa, sb = json.loads(out_a), json.loads(out_b.removeprefix("done\n"))

    # ss: Recv-Q Send-Q local peer (one connection each)
    assert len(a_side) == 4 and a_side[2].startswith(f"{SITE_A}:") and a_side[3] == f"{SITE_B}:{PEER_PORT}", a_side
    assert len(b_side) == 4 and b_side[2] == f"{SITE_B}:{PEER_PORT}" and b_side[3].startswith(f"{NAT_OUT}:"), b_side
    masquerade = next(ln for ln in ruleset.splitlines() if "masquerade" in ln)
    assert "packets 0 " not in masquerade, ruleset  # the link's first packet went through the rule

    # the requests reached B's responders, each pointing at B's one request listener in TRD2
    assert sa["peer"] == sb["peer"] == "CONNECTED"
    assert sb["proxy"][0] == TRD_IP
    assert [q for q, _, _ in sb["requests"]] == list(range(100, 120))
    assert sb["payloads"] == [request_payload(q).hex() for q in range(100, 120)]
    ((ip, port),) = {(ip, port) for _, ip, port in sb["requests"]}
    assert [ip, port] in sb["listeners"] and ip == TRD_IP and [ip, port] != [REQUESTER_IP, sa["request_port"]]
    assert sb["failed"] == 0 and sb["answered"] == 20
    # the 20 responses came back through the link to the requester, index and payload unchanged
    assert sa["answers"] == sorted([q, response_payload(q, 0).hex()] for q in range(100, 120))
    assert len(sa["callers"]) == 20 and RESPONDER_IP not in sa["callers"]  # router A's connections
    assert sa["connections"] == 1  # router A's one upstream connection to the requester's source
    ca, cb = sa["a"], sb["b"]
    assert cb["requests_rewritten"] == 20 and cb["request_listeners_opened"] == 1
    assert cb["response_streams_opened"] == 20 and ca["responses_delivered"] == 20
    assert ca["responses_refused_unseen"] == ca["responses_refused_address"] == ca["responses_requester_gone"] == 0
    assert cb["requests_unmapped_no_address"] == cb["requests_unmapped_peer"] == 0
