"""The UIM decisions, sans-IO (router/core/uim.py): one whole LBMC message in,
one typed decision out. Routers A - B - C wired in memory (domains 1, 2, 3)."""

from __future__ import annotations

from lbmr_proto import lbmc
from router.core.uim import (
    MAX_HOPS_TAKEN,
    DeliverMessage,
    DropMessage,
    ForwardMessage,
    UimDrop,
    UimPath,
    UimStream,
)
from tests.router.helpers import Net
from tests.router.system.uim_apps import hops_of, uim, with_hops

ORIG = (1, "10.1.0.9", 15001)


def chain():
    n = Net("ABC")
    n.link("A", "B")
    n.link("B", "C")
    path = {r: UimPath({f"ep{r}": (d, "10.0.0.1")}, n.r[r], max_hop_count=100)
            for r, d in (("A", 1), ("B", 2), ("C", 3))}
    return n, path


def test_a_uim_for_a_far_domain_is_forwarded_with_one_more_hop_then_delivered_where_served():
    _, path = chain()
    m = uim(7, (3, "10.3.0.9", 16001), ORIG)
    at_a = path["A"].message(m)
    assert isinstance(at_a, ForwardMessage)
    assert (at_a.next_router, at_a.hops, at_a.domain_id, at_a.ip, at_a.port) == ("B", 0, 3, "10.3.0.9", 16001)
    assert at_a.message == with_hops(m, 1)  # only hops_taken changed
    at_b = path["B"].message(at_a.message, UimStream(3, "10.3.0.9", 16001, 0, "A"))
    assert isinstance(at_b, ForwardMessage) and (at_b.next_router, at_b.hops) == ("C", 1)
    at_c = path["C"].message(at_b.message, UimStream(3, "10.3.0.9", 16001, 1, "B"))
    assert isinstance(at_c, DeliverMessage)
    assert (at_c.endpoint, at_c.ip, at_c.port) == ("epC", "10.3.0.9", 16001)
    assert hops_of(at_c.message) == 3 and at_c.message == with_hops(m, 3)
    d = at_c.destination
    assert (d.orig_domain_id, d.orig_ip, d.orig_port) == ORIG  # kept: a reply by domain finds the sender


def test_drops_are_typed_and_counted():
    _, path = chain()
    a = path["A"]
    cases = [
        (uim(1, (9, "10.9.0.9", 1), ORIG), UimDrop.UNREACHABLE),
        (lbmc.data_message(0, 1, b"no destination header"), UimDrop.NO_DESTINATION),
        (uim(1, (3, "10.3.0.9", 1), ORIG, hops=MAX_HOPS_TAKEN), UimDrop.HOP_LIMIT),
        (uim(1, (1, "224.1.1.1", 1), ORIG), UimDrop.NOT_DELIVERABLE),  # ours, but multicast
        (uim(1, (1, "0.0.0.0", 1), ORIG), UimDrop.NOT_DELIVERABLE),
        (uim(1, (1, "127.0.0.1", 1), ORIG), UimDrop.NOT_DELIVERABLE),  # loopback, endpoint is not
        (uim(1, (1, "10.1.0.5", 0), ORIG), UimDrop.NOT_DELIVERABLE),
    ]
    bad = bytearray(uim(1, (3, "10.3.0.9", 1), ORIG))
    bad[13] = 200  # the DESTINATION header's hdr_len runs past the message
    cases.append((bytes(bad), UimDrop.MALFORMED))
    for m, reason in cases:
        got = a.message(m)
        assert isinstance(got, DropMessage) and got.reason is reason, (reason, got)
        assert a.counters[reason.counter] >= 1
    assert a.counters["uim_in"] == len(cases)


def test_the_routers_own_listener_is_never_a_destination():
    """A UIM delivered to the router's own listener would come back in, again and again."""
    n, _ = chain()
    c = UimPath({"epC": (3, "10.0.0.1")}, n.r["C"], own=frozenset({("10.3.0.1", 14391)}))
    got = c.message(uim(1, (3, "10.3.0.1", 14391), ORIG))
    assert isinstance(got, DropMessage) and got.reason is UimDrop.OWN_LISTENER
    assert c.counters["uim_to_own_listener"] == 1
    assert isinstance(c.message(uim(1, (3, "10.3.0.1", 14392), ORIG)), DeliverMessage)


def test_a_stream_never_goes_back_and_its_messages_must_match_it():
    _, path = chain()
    b = path["B"]
    # a stream from C for domain 3 would go back to C
    assert b.open_stream(UimStream(3, "10.3.0.9", 1, 0, "C")).reason is UimDrop.BACK
    assert b.open_stream(UimStream(9, "10.9.0.9", 1, 0, "A")).reason is UimDrop.UNREACHABLE
    assert b.open_stream(UimStream(3, "10.3.0.9", 1, 0, "A")) is None
    other = uim(1, (3, "10.3.0.8", 1), ORIG, hops=1)
    got = b.message(other, UimStream(3, "10.3.0.9", 1, 0, "A"))
    assert isinstance(got, DropMessage) and got.reason is UimDrop.STREAM_MISMATCH


def test_the_hop_limit_ends_a_stream_before_it_loops():
    n, _ = chain()
    b = UimPath({"epB": (2, "10.0.0.1")}, n.r["B"], max_hop_count=3)
    assert b.open_stream(UimStream(3, "10.3.0.9", 1, 1, "A")) is None  # 2 + 1 <= 3
    assert b.open_stream(UimStream(3, "10.3.0.9", 1, 2, "A")).reason is UimDrop.HOP_LIMIT


def test_decisions_follow_a_route_change():
    n, path = chain()
    a = path["A"]
    m = uim(1, (3, "10.3.0.9", 1), ORIG)
    assert isinstance(a.message(m), ForwardMessage)
    n.cut("B", "C")
    got = a.message(m)
    assert isinstance(got, DropMessage) and got.reason is UimDrop.UNREACHABLE
