"""The DRO's ``<rate-limit>`` children of the endpoint's topic-resolution
timing elements (issue 11 item 6): read from the file (defaults per parent,
file:line errors, the DTD) and applied by the portal, sans-IO on explicit
``now`` values: use queries and INTEREST REFRESHes honour objects a second
and bits a second, 0 = no limit, bursts bounded. ``<domain-route>`` without a
``<request-tcp>`` listener has no effect (a warning); with one: tests/router/config/test_request_tcp.py."""

from __future__ import annotations

import io

import pytest
from lxml import etree

from router.config import DTD_TEXT, load_config
from router.config.model import (
    DOMAIN_ROUTE_RATE_LIMIT,
    INTEREST_RATE_LIMIT,
    USE_QUERY_RATE_LIMIT,
    DomainRoute,
    InterestPacing,
    RateLimit,
    UseQuery,
)
from router.shell.portal_task import portal_timing
from tests.helpers import write
from tests.router.helpers import (
    APP,
    CONFIGS,
    doc,
    endpoint,
    expect_error,
    expect_ok,
    peer,
    portal,
    run_until,
    use_queries,
)

LBMRD = '        <lbmrd address="10.1.1.50" port="15380"/>\n'


def with_timing(timing: str) -> str:
    """A whole file whose endpoint's <topic-resolution> ends with ``timing``."""
    tr = f"      <topic-resolution>\n{LBMRD}{timing}      </topic-resolution>\n"
    return doc(portals=endpoint(tr) + peer())


# --------------------------------------------------------------------------- the file


def test_rate_limits_are_read_with_the_dros_defaults_per_parent(tmp_path):
    timing = """\
        <topic-use-query max="6" periodic-interval="250000" timeout="4000">
          <rate-limit bps="550000" objects-per-second="0"/>
        </topic-use-query>
        <pattern-use-query>
          <rate-limit objects-per-second="20"/>
        </pattern-use-query>
        <remote-topic-interest min-interval="1000" max-interval="90000">
          <rate-limit/>
        </remote-topic-interest>
        <remote-pattern-interest>
          <rate-limit bps="8000" objects-per-second="3"/>
        </remote-pattern-interest>
"""
    cfg = expect_ok(tmp_path, "rl.xml", with_timing(timing))
    assert cfg.warnings == ()
    t = cfg.endpoint.topic_resolution
    assert t.topic_use_query == UseQuery(4000, 6, 250000, RateLimit(550_000, 0))
    # an attribute left out keeps the DRO's default for that parent
    assert t.pattern_use_query.rate_limit == RateLimit(500_000, 20)
    assert t.remote_topic_interest == InterestPacing(1000, 90000, RateLimit(500_000, 0))
    assert t.remote_pattern_interest.rate_limit == RateLimit(8000, 3)
    assert t.domain_route is None
    # and the portal is built with them (bits a second, objects a second)
    kw = portal_timing(cfg.endpoint)
    assert kw["use_query_limit"] == (550_000.0, 0.0)
    assert kw["pattern_use_query_limit"] == (500_000.0, 20.0)
    assert kw["refresh_limit"] == (500_000.0, 0.0)
    assert kw["pattern_refresh_limit"] == (8000.0, 3.0)


def test_without_rate_limit_elements_the_dros_defaults_apply(tmp_path):
    cfg = expect_ok(tmp_path, "none.xml", with_timing(""))
    t = cfg.endpoint.topic_resolution
    assert USE_QUERY_RATE_LIMIT == RateLimit(500_000, 500)
    assert INTEREST_RATE_LIMIT == RateLimit(500_000, 0)
    assert DOMAIN_ROUTE_RATE_LIMIT == RateLimit(0, 50)
    assert t.topic_use_query.rate_limit == t.pattern_use_query.rate_limit == USE_QUERY_RATE_LIMIT
    assert t.remote_topic_interest.rate_limit == t.remote_pattern_interest.rate_limit \
        == INTEREST_RATE_LIMIT
    kw = portal_timing(cfg.endpoint)
    assert kw["use_query_limit"] == kw["pattern_use_query_limit"] == (500_000.0, 500.0)
    assert kw["refresh_limit"] == kw["pattern_refresh_limit"] == (500_000.0, 0.0)


@pytest.mark.parametrize("attrs, needles", [
    ('bps="fast"', ('<rate-limit> bps "fast" is not a number', "bits a second")),
    ('bps="-1"', ('<rate-limit> bps "-1" is not a number',)),
    ('bps="1000000000001"', ("<rate-limit> bps", "out of range", "0..1000000000000")),
    ('objects-per-second="2147483648"', ("<rate-limit> objects-per-second", "out of range",
                                        "use queries a second")),
    ('objects-per-second=""', ("<rate-limit> objects-per-second is empty",)),
    ('bsp="10"', ('unknown attribute "bsp" on <rate-limit>', "allowed: bps, objects-per-second")),
])
def test_bad_rate_limit_values_name_file_and_line(tmp_path, attrs, needles):
    timing = ('        <topic-use-query>\n'
              f'          <rate-limit {attrs}/>\n'
              '        </topic-use-query>\n')
    expect_error(tmp_path, "bad.xml", with_timing(timing), "<rate-limit", *needles)


def test_bad_interest_rate_limit_names_its_line(tmp_path):
    timing = ('        <remote-pattern-interest min-interval="500">\n'
              '          <rate-limit bps="1" objects-per-second="1.5"/>\n'
              '        </remote-pattern-interest>\n')
    expect_error(tmp_path, "bad.xml", with_timing(timing), "<rate-limit",
                 '<rate-limit> objects-per-second "1.5" is not a number',
                 "interest refreshes a second")


def test_rate_limit_twice_or_under_initial_request_is_refused(tmp_path):
    twice = ('        <remote-topic-interest>\n'
             '          <rate-limit/>\n          <rate-limit bps="1"/>\n'
             '        </remote-topic-interest>\n')
    expect_error(tmp_path, "twice.xml", with_timing(twice), "<remote-topic-interest>",
                 "<remote-topic-interest> has <rate-limit> 2 times", "at most one <rate-limit")
    # the DRO's DTD keeps <initial-request> empty (rate-limit's parents are the others)
    ir = '        <initial-request>\n          <rate-limit/>\n        </initial-request>\n'
    expect_error(tmp_path, "ir.xml", with_timing(ir), "<initial-request>",
                 "<initial-request> must be empty")


def test_no_limit_at_all_is_accepted_with_a_warning(tmp_path):
    timing = ('        <topic-use-query>\n'
              '          <rate-limit bps="0" objects-per-second="0"/>\n'
              '        </topic-use-query>\n')
    text = with_timing(timing)
    cfg = expect_ok(tmp_path, "zero.xml", text)
    assert cfg.endpoint.topic_resolution.topic_use_query.rate_limit == RateLimit(0, 0)
    line = text.splitlines().index('          <rate-limit bps="0" objects-per-second="0"/>') + 1
    assert [(w[0], "not paced" in w[1]) for w in cfg.warnings] == [(line, True)]


def test_domain_route_without_a_request_listener_warns_and_its_values_are_checked(tmp_path):
    timing = ('        <domain-route min-interval="200" max-interval="2000">\n'
              '          <rate-limit bps="0" objects-per-second="40"/>\n'
              '        </domain-route>\n')
    text = with_timing(timing)
    cfg = expect_ok(tmp_path, "dr.xml", text)
    line = text.splitlines().index(timing.splitlines()[0]) + 1
    assert cfg.endpoint.topic_resolution.domain_route == DomainRoute(200, 2000, RateLimit(0, 40))
    assert len(cfg.warnings) == 1 and cfg.warnings[0][0] == line
    assert "<domain-route> has no effect without a <request-tcp> listener" in cfg.warnings[0][1]
    # the DRO's default for a domain-route rate-limit: 50 a second, no bit limit
    bare = with_timing('        <domain-route><rate-limit/></domain-route>\n')
    assert expect_ok(tmp_path, "dr0.xml", bare).endpoint.topic_resolution.domain_route.rate_limit \
        == RateLimit(0, 50)
    # without effect, but not unchecked
    expect_error(tmp_path, "dr1.xml", with_timing(
        '        <domain-route min-interval="2000" max-interval="200"/>\n'), "<domain-route",
        "min-interval 2000 is greater than max-interval 200")
    expect_error(tmp_path, "dr2.xml", with_timing(
        '        <domain-route>\n          <rate-limit objects-per-second="x"/>\n'
        '        </domain-route>\n'), "<rate-limit", "domain route messages a second")


def test_initial_request_after_the_others_says_where_it_goes(tmp_path):
    """The DRO's DTD has <initial-request> last; ours first (named in the error)."""
    timing = '        <topic-use-query/>\n        <initial-request duration="5"/>\n'
    expect_error(tmp_path, "order.xml", with_timing(timing), "<topic-resolution>",
                 "<initial-request> (line", "must come before the other timing elements")


def test_the_dtd_alone_accepts_the_dro_style_rate_limits():
    """lxml with router.dtd (not our checker): the DRO reference's examples."""
    dtd = etree.DTD(io.StringIO(DTD_TEXT))
    attrs = {(e.name, a.name): a for e in dtd.iterelements() for a in e.iterattributes()}
    assert attrs["rate-limit", "bps"].default == "implied"
    assert attrs["rate-limit", "objects-per-second"].default == "implied"
    assert attrs["domain-route", "min-interval"].default_value == "100"
    timing = """\
        <topic-use-query max="6" periodic-interval="250000" timeout="4000">
          <rate-limit bps="550000" objects-per-second="0"/>
        </topic-use-query>
        <pattern-use-query><rate-limit/></pattern-use-query>
        <remote-topic-interest min-interval="1000" max-interval="90000"><rate-limit/></remote-topic-interest>
        <remote-pattern-interest><rate-limit/></remote-pattern-interest>
        <domain-route min-interval="100" max-interval="1000">
          <rate-limit bps="0" objects-per-second="50"/>
        </domain-route>
"""
    assert dtd.validate(etree.fromstring(with_timing(timing).encode())), dtd.error_log
    for bad in ('        <initial-request><rate-limit/></initial-request>\n',
                '        <topic-use-query><rate-limit/><rate-limit/></topic-use-query>\n',
                '        <topic-use-query><rate-limit rate="1"/></topic-use-query>\n'):
        assert not dtd.validate(etree.fromstring(with_timing(bad).encode())), bad


def test_shipped_config_with_rate_limits_loads():
    cfg = load_config(CONFIGS / "router-a.xml")
    assert cfg.warnings == ()
    t = cfg.endpoint.topic_resolution
    assert t.topic_use_query.rate_limit == RateLimit(500_000, 500)
    assert t.remote_topic_interest.rate_limit == RateLimit(500_000, 0)
    text = (CONFIGS / "router-a.xml").read_text()
    assert '<rate-limit bps="500000" objects-per-second="500"/>' in text
    # and the DTD alone accepts it
    assert etree.DTD(io.StringIO(DTD_TEXT)).validate(etree.parse(str(CONFIGS / "router-a.xml")))


def test_a_changed_rate_limit_in_the_file_changes_the_portals_pacing(tmp_path):
    """File -> portal_timing -> PortalTR: 5 use queries a second instead of 500."""
    from router.core.tr import PortalTR, PortalTRSettings
    from tests.router.helpers import dgram

    timing = ('        <topic-use-query periodic-interval="10000" timeout="60000">\n'
              '          <rate-limit objects-per-second="5"/>\n'
              '        </topic-use-query>\n')
    cfg = load_config(write(tmp_path, "slow.xml", with_timing(timing)))
    tr = PortalTR(PortalTRSettings("A", 1, src_id=b"AAAAAAAA", mode="multicast", multicast=("239.192.1.1", 12965),
                                   **{k: v for k, v in portal_timing(cfg.endpoint).items()
                                      if k != "initial_request"}), now=0.0)
    for i in range(100):
        tr.on_datagram(dgram(tqrs=[f"md.{i}"]), APP, 0.0)
    times = [t for t, out, _ in run_until(tr, 30.0) for _ in use_queries(out)]
    assert len(times) == 100
    # 51 at once (a burst of 50 after the first), then 5 a second: 49 more take 9.8 s
    assert times[50] == pytest.approx(10.0) and times[51] == pytest.approx(10.2)
    assert times[-1] == pytest.approx(19.8, abs=0.01)


# --------------------------------------------------------------------------- the portal

def _tmgmt(log):
    """(time, bytes, use queries) of every TOPIC_MGMT datagram in a run_until log."""
    got = [(t, len(o.data), len(use_queries([o]))) for t, out, _ in log for o in out]
    return [g for g in got if g[2]]


def _max_in_window(points, width):
    """The largest sum of ``value`` over ``(time, value)`` points in any window
    [t, t + width) that starts at a point."""
    points = sorted(points)
    best, j, acc = 0, 0, 0
    for i, (t, _) in enumerate(points):
        if i:
            acc -= points[i - 1][1]
        while j < len(points) and points[j][0] < t + width - 1e-9:
            acc += points[j][1]
            j += 1
        best = max(best, acc)
    return best


def _flood(tr, n, *, name="md.{:04d}", now=0.0):
    from tests.router.helpers import dgram

    for i in range(n):
        tr.on_datagram(dgram(tqrs=[name.format(i)]), APP, now)


def test_use_queries_honour_the_bits_a_second_limit_headers_included():
    from router.core.tr import UseQuery

    bps = 8000  # 1000 bytes a second
    tr = portal(use_query=UseQuery(100.0, 5, 10.0), use_query_limit=(bps, 0))
    _flood(tr, 400)
    sent = _tmgmt(run_until(tr, 60.0))
    assert sum(n for *_, n in sent) == 400  # every one, none lost
    first, last = sent[0][0], sent[-1][0]
    after_burst = sum(b for t, b, _ in sent if t > first)
    # the bytes on the wire (datagram headers too) at 1000 a second once the burst is spent
    assert after_burst / (last - first) == pytest.approx(bps / 8, rel=0.03)
    assert last - first > 10.0  # objects alone (none) would have sent them at once
    # in any 5 s: 5 s of budget + the burst (one datagram's worth here) + one datagram
    assert _max_in_window([(t, b) for t, b, _ in sent], 5.0) <= 5 * bps / 8 + 2 * 1400
    # the burst: one datagram's worth of records at once (the slack of a low rate)
    # plus the headers of the (two) datagrams they fill; every later one waited for
    # its slot, alone in its datagram
    at_once = [(b, n) for t, b, n in sent if t == first]
    assert sum(b for b, _ in at_once) <= 1400 + len(at_once) * 50
    assert tr.stats()["use_queries_deferred"] == 400 - sum(n for _, n in at_once) \
        == len(sent) - len(at_once)


def test_use_queries_honour_whichever_limit_binds():
    from router.core.tr import UseQuery

    # long topics, generous count: the bits bind (about 40 a second, not 100)
    tr = portal(use_query=UseQuery(100.0, 5, 10.0), use_query_limit=(40_000, 100))
    _flood(tr, 300, name="market.data.equities.europe.xetra.{:04d}." + "x" * 60)
    sent = _tmgmt(run_until(tr, 60.0))
    assert sum(n for *_, n in sent) == 300
    first, last = sent[0][0], sent[-1][0]
    assert sum(b for t, b, _ in sent if t > first) / (last - first) == pytest.approx(5000, rel=0.03)
    assert _max_in_window([(t, n) for t, _, n in sent], 1.0) < 100
    # short topics, tight bits would allow more: the count binds at 100 a second
    tr = portal(use_query=UseQuery(100.0, 5, 10.0), use_query_limit=(400_000, 100))
    _flood(tr, 300, name="t{}")
    sent = _tmgmt(run_until(tr, 60.0))
    times = sorted(t for t, _, n in sent for _ in range(n))
    assert len(times) == 300
    assert times[51] - times[50] == pytest.approx(0.01)  # after the burst, 100 a second
    assert times[-1] - times[0] == pytest.approx(2.49, abs=0.01)
    # a burst is at most 50 after the first, however long the portal was idle
    assert _max_in_window([(t, n) for t, _, n in sent], 0.005) == 51


def test_a_zero_rate_limit_is_no_limit():
    from router.core.tr import UseQuery

    tr = portal(use_query=UseQuery(100.0, 5, 10.0), use_query_limit=(0, 0))
    _flood(tr, 2000)
    sent = _tmgmt(run_until(tr, 60.0))
    assert all(t == pytest.approx(10.0) for t, _, _ in sent)  # all at once, batched
    assert sum(n for *_, n in sent) == 2000
    assert tr.stats().get("use_queries_deferred", 0) == 0


def test_topic_and_pattern_use_queries_have_their_own_limits():
    from lbmr_proto import Packet, SourceIdOption, WcTQR, encode
    from router.core.tr import UseQuery

    tr = portal(use_query=UseQuery(100.0, 5, 10.0), pattern_use_query=UseQuery(100.0, 5, 10.0),
                use_query_limit=(0, 0), pattern_use_query_limit=(0, 10))
    _flood(tr, 100)
    for i in range(100):
        tr.on_datagram(encode(Packet(type=1, version=1, wc_tqrs=[WcTQR(f"^p{i}\\.", 1)],
                                     options=[SourceIdOption(0x8000, b"APPCTX01")])), APP, 0.0)
    log = run_until(tr, 60.0)
    topic_times = [t for t, out, _ in log for name, flags in use_queries(out) if not flags]
    pattern_times = [t for t, out, _ in log for name, flags in use_queries(out) if flags]
    assert len(topic_times) == len(pattern_times) == 100
    assert max(topic_times) == pytest.approx(10.0)  # unlimited
    assert max(pattern_times) == pytest.approx(10.0 + 49 * 0.1)  # 51 at once, then 10 a second


def _refreshes(log):
    from router.core.tr import LocalInterestRefresh

    return [(t, e) for t, _, evs in log for e in evs if isinstance(e, LocalInterestRefresh)]


def test_interest_refreshes_honour_the_count_limit():
    tr = portal(refresh_pacing=(1.0, 8.0), refresh_limit=(0, 10))
    _flood(tr, 200)
    got = _refreshes(run_until(tr, 40.0))
    first = {}
    for t, e in got:
        first.setdefault(e.topic, t)
    assert len(first) == 200  # every interest refreshed
    times = sorted(first.values())
    assert times[50] == pytest.approx(1.0) and times[51] == pytest.approx(1.1)
    assert times[-1] == pytest.approx(1.0 + 149 * 0.1)
    # in any window: at most 10 a second and one burst of 51
    for width in (1.0, 5.0, 20.0):
        assert _max_in_window([(t, 1) for t, _ in got], width) <= 10 * width + 51
    assert tr.stats()["interest_refreshes_deferred"] >= 149


def test_interest_refreshes_honour_the_bits_limit_by_frame_size():
    from router.core.tr import interest_frame_size
    from router.peerlink import Interest, InterestAction, PatternType

    topic = "md.0001"
    assert interest_frame_size(topic) == Interest(InterestAction.REFRESH, topic, 1,
                                                  PatternType.TOPIC).wire_size()
    assert interest_frame_size("é" * 10) == Interest(InterestAction.REFRESH, "é" * 10, 1,
                                                     PatternType.PCRE).wire_size()
    bps = 2700 * 8  # 100 frames of 27 bytes a second
    tr = portal(refresh_pacing=(20.0, 600.0), refresh_limit=(bps, 0))
    _flood(tr, 500, name="md.{:04d}")
    got = _refreshes(run_until(tr, 50.0))  # one round: the next is 40 s after each
    assert sorted(e.topic for _, e in got) == [f"md.{i:04d}" for i in range(500)]
    sizes = [(t, interest_frame_size(e.topic)) for t, e in got]
    assert {s for _, s in sizes} == {27}
    first, last = sizes[0][0], sizes[-1][0]
    burst = sum(s for t, s in sizes if t == first)
    # the burst: a tenth of a second's bits, at least one datagram (1400 bytes)
    assert 1400 <= burst <= 1400 + 27
    # then 100 frames (2700 bytes) a second
    assert (sum(s for _, s in sizes) - burst) / (last - first) == pytest.approx(bps / 8, rel=0.01)
    assert _max_in_window(sizes, 1.0) <= bps / 8 + 1400 + 27


def test_without_a_refresh_limit_or_with_zero_refreshes_are_not_held():
    for kw in ({}, {"refresh_limit": (0, 0)}, {"refresh_limit": None}):
        tr = portal(refresh_pacing=(1.0, 8.0), **kw)
        _flood(tr, 300)
        got = _refreshes(run_until(tr, 1.5))
        assert len(got) == 300 and all(t == pytest.approx(1.0) for t, _ in got), kw


def test_a_deferred_refresh_keeps_its_doubling_and_the_interest_its_use_queries():
    """A refresh held by the limit goes in its slot; the next comes a doubled gap
    after it went; use queries and expiry go on meanwhile."""
    from router.core.tr import LocalInterestGone, UseQuery

    tr = portal(refresh_pacing=(1.0, 4.0), refresh_limit=(0, 1),
                use_query=UseQuery(1.0, 2, 12.0), use_query_limit=(0, 0))
    _flood(tr, 60)
    log = run_until(tr, 30.0)
    by_topic: dict[str, list[float]] = {}
    for t, e in _refreshes(log):
        by_topic.setdefault(e.topic, []).append(t)
    # 51 at 1 s, then one a second: the last topic's first refresh waits until 10 s
    assert by_topic["md.0000"][0] == pytest.approx(1.0)
    assert by_topic["md.0059"][0] == pytest.approx(10.0)
    # meanwhile use queries go out (unlimited) and, unanswered, end every interest:
    # silent 12 s, then 2 use queries 1 s apart, dropped at 14 s
    uq = [t for t, out, _ in log for _ in use_queries(out)]
    assert sorted(uq) == [pytest.approx(12.0)] * 60 + [pytest.approx(13.0)] * 60
    gone = [t for t, _, evs in log for e in evs if isinstance(e, LocalInterestGone)]
    assert gone == [pytest.approx(14.0)] * 60
    # and nothing is refreshed once its interest is gone
    assert max(t for ts in by_topic.values() for t in ts) < 14.0


def test_bad_rate_limits_are_refused_by_the_portal():
    for bad in ((-1, 0), (0, -5), (float("inf"), 0), (0, float("nan"))):
        with pytest.raises(ValueError, match="rate limit"):
            portal(use_query_limit=bad)
        with pytest.raises(ValueError, match="rate limit"):
            portal(refresh_pacing=(1.0, 2.0), refresh_limit=bad)
