"""lbmr-analyze on any capture the decoder accepts: generated captures (hypothesis)
with and without packet options (src_id, source type, local domain), header
versions 0 and 1, direct and lbmrd-relayed traffic through several lbmrds,
storms, empty hours and single records.  On every one the pipeline finishes, its
tables equal the plain-Python reference of tests/test_analyze.py, and no finding
claims what the generated traffic does not hold (a "one context" claim needs a
context that really did it).

The pipeline's pure parts (decoding tasks, partial aggregates, the second pass run
in this process, the tables and findings) run on many examples; the whole Spark
job on a few, on one SparkSession for the module.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lbmr_proto as L
from lbmr_analyze import partials as P
from lbmr_analyze import splits as S
from lbmr_analyze.findings import SEVERITIES
from lbmr_analyze.job import TABLES, analyse, run
from lbmr_analyze.rows import write_split
from tests.analyze_reference import (
    PORTS,
    T0,
    assert_tables_equal,
    hashed_tir,
    iso,
    iso_s,
    reference_for,
    shuffle_partitions,
    write_pcap,
)

STORM = 5


def pure_analyse(cap: Path, out: Path, *, storm: int = STORM, top: int = 20) -> tuple[dict, dict]:
    """The job without Spark: each split decoded to Parquet with its partial
    aggregates (as a decoding task does), the second pass in this process."""
    parts: list = []
    records = out / "records"
    for s in S.plan([str(cap)]):
        write_split(s, frozenset(PORTS), b"", str(records), partials=parts)
    return analyse(None, str(records), P.merge(parts), storm_threshold=storm, top=top)


@pytest.fixture(scope="module")
def spark(spark_session):
    yield from shuffle_partitions(spark_session, 2)


# ============================================================== no source-id option, a storm second

def no_src_id_storm() -> list[tuple]:
    """A pre-6 UM capture: no packet carries options; a storm second of TQRs from two
    contexts, one relayed by lbmrd, and a TIR answering them."""
    q = L.encode(L.Packet(tqrs=[L.TQR("A")]))
    d = [(T0 + 0.001 * i, "10.4.4.4", 14402, "239.101.3.1", 12965, q) for i in range(6)]
    d += [(T0 + 0.5 + 0.001 * i, "10.0.0.1", 15380, "10.1.1.5", 14402, q) for i in range(3)]
    d.append((T0 + 1.5, "10.1.1.10", 14402, "239.101.3.1", 12965,
              L.encode(L.Packet(tirs=[L.TIR("A", L.TcpTransport("10.1.1.10", 14371), 16, 1)]))))
    return d


def test_storm_without_src_id_pure(tmp_path):
    cap = write_pcap(tmp_path / "old.pcap", no_src_id_storm())
    summary, t = pure_analyse(cap, tmp_path)
    assert_tables_equal(t, reference_for(cap, ports=PORTS, storm=STORM))
    assert [(r["context"], r["src_id"], r["packets"]) for r in t["storm_contexts"]] == \
        [("10.4.4.4:14402", None, 6), ("10.0.0.1:15380", None, 3)]
    assert summary["storm_seconds"] == 1


def test_storm_without_src_id_spark(spark, tmp_path):
    cap = write_pcap(tmp_path / "old.pcap", no_src_id_storm())
    res = run(spark, [cap], tmp_path / "out", storm_threshold=STORM, report=False)
    assert_tables_equal(res.tables, reference_for(cap, ports=PORTS, storm=STORM))
    assert [f["kind"] for f in res.tables["findings"]].count("storm") == 1


def test_two_relayed_publishers_without_src_id_are_not_one_context(tmp_path):
    """Two publishers of topic X relayed by lbmrd, no source-id option: not "one
    context advertises X on 2 transports" (the issue's false finding); with their
    src_ids, still two contexts; one src_id relayed by two lbmrds is one context."""
    lb = ("10.0.0.1", 15380)

    def relayed(ts, tr, options=None, via=lb):
        return (T0 + ts, *via, *HOST, L.encode(L.Packet(tirs=[hashed_tir("X", TRANSPORTS[tr])], options=options)))

    bare = [relayed(1, 0), relayed(1.5, 1)]
    cap = write_pcap(tmp_path / "bare.pcap", bare)
    _s, t = pure_analyse(cap, tmp_path / "bare")
    assert t["multi_transport_topics"] == [] and not [f for f in t["findings"] if "one context" in f["kind"]]
    ids = [[L.SourceIdOption(0x8000, bytes([i]) * 8)] for i in (1, 2)]
    cap = write_pcap(tmp_path / "ids.pcap", [relayed(1, 0, ids[0]), relayed(1.5, 1, ids[1]),
                                             relayed(2, 0, ids[0], ("10.0.0.2", 15380))])
    _s, t = pure_analyse(cap, tmp_path / "ids")
    assert t["multi_transport_topics"] == [] and t["transport_conflicts"] == []
    assert t["topic_inventory"][0]["advertisers"] == (f"[{'01' * 8}] via lbmrd 10.0.0.1:15380 | "
                                                      f"[{'01' * 8}] via lbmrd 10.0.0.2:15380 | "
                                                      f"[{'02' * 8}] via lbmrd 10.0.0.1:15380")


# ============================================================== generated captures

LBMRDS = ("10.0.0.1", "10.0.0.2", "10.0.0.3")
HOST = ("10.1.1.5", 14402)                               # the capturing lbmrd client
MCAST = ("239.101.3.1", 12965)
TOPICS = ("A", "B", "C")
TRANSPORTS = (L.TcpTransport("10.1.1.10", 14371), L.TcpTransport("10.1.1.11", 14372),
              L.LbtrmTransport("10.1.1.12", "239.1.1.1", 1111, 14400, 14390),
              L.TcpTransport("192.168.50.5", 15001), L.TcpTransport("0.0.0.0", 15002))
HOUR_US = 3_600_000_000


@st.composite
def contexts(draw) -> list[dict]:
    """1-4 contexts, each: address, src_id or not, which packet options, header
    version, the lbmrds relaying it (none: direct), and whether the capture also
    sees its own datagrams to lbmrd."""
    addrs = draw(st.lists(st.tuples(st.sampled_from(["10.1.1.20", "10.1.1.21", "10.3.3.3"]),
                                    st.sampled_from([14402, 14403])), min_size=1, max_size=4, unique=True))
    ids = draw(st.lists(st.binary(min_size=8, max_size=8), min_size=len(addrs), max_size=len(addrs), unique=True))
    out = []
    for (ip, port), sid in zip(addrs, ids, strict=True):
        opts = draw(st.sets(st.sampled_from(["src_id", "src_type", "local_domain"])))
        options = ([L.SourceIdOption(0x8000, sid)] if "src_id" in opts else []) \
            + ([L.SourceTypeOption(0x80, 0)] if "src_type" in opts else []) \
            + ([L.LocalDomainOption(0x8000, 5)] if "local_domain" in opts else [])
        out.append(dict(addr=(ip, port), options=options or None, version=draw(st.sampled_from([0, 1])),
                        lbmrds=draw(st.lists(st.sampled_from(LBMRDS), max_size=2, unique=True)),
                        to_lbmrd_seen=draw(st.booleans())))
    return out


#: one thing a context sends: (time in µs from T0, context number, what, topic, transport number)
event = st.tuples(
    st.one_of(st.integers(0, 40_000_000), st.integers(2 * HOUR_US, 2 * HOUR_US + 20_000_000)),   # empty hours
    st.integers(0, 3), st.sampled_from(["TIR", "TIR", "TQR", "TQR", "WC", "KA"]), st.sampled_from(TOPICS),
    st.integers(0, len(TRANSPORTS) - 1))


@st.composite
def captures(draw) -> tuple[list[tuple], list[dict], list[tuple]]:
    """(datagrams, contexts, events): single records, storms (a burst of events in
    one second), events hours apart."""
    ctxs = draw(contexts())
    evs = draw(st.lists(event, min_size=1, max_size=14))
    if draw(st.booleans()):                                   # a storm second
        at, who, kind = draw(st.integers(0, 40_000_000)), draw(st.integers(0, 3)), draw(st.sampled_from(["TIR", "TQR"]))
        evs += [(at // 1_000_000 * 1_000_000 + 70_000 * i, who, kind, "A", 0) for i in range(STORM + 1)]
    evs = [(t, w % len(ctxs), k, tp, tr) for t, w, k, tp, tr in evs]
    return datagrams(ctxs, evs), ctxs, evs


def _payload(c: dict, kind: str, topic: str, tr: int) -> bytes:
    v, o = c["version"], c["options"]
    if kind == "TIR":
        return L.encode(L.Packet(version=v, tirs=[hashed_tir(topic, TRANSPORTS[tr], tr)], options=o))
    if kind == "TQR":
        return L.encode(L.Packet(version=v, tqrs=[L.TQR(topic)], options=o))
    if kind == "WC":
        return L.encode(L.Packet(1, version=v, wc_tqrs=[L.WcTQR(f"^{topic}", 1)], options=o))
    return L.encode(L.Packet(2, version=v, options=o))


def datagrams(ctxs: list[dict], evs: list[tuple]) -> list[tuple]:
    """The capture of ``evs`` as seen on the lbmrd client HOST: a direct context's
    datagrams (keepalives to the first lbmrd) and, for a relayed one, each lbmrd's
    copy and, if the capture sees them, its own datagrams to lbmrd."""
    out = []
    for t, w, kind, topic, tr in evs:
        c, ts = ctxs[w], T0 + t / 1e6
        data = _payload(c, kind, topic, tr)
        if not c["lbmrds"]:
            out.append((ts, *c["addr"], *(MCAST if kind != "KA" else (LBMRDS[0], 15380)), data))
            continue
        if c["to_lbmrd_seen"] or kind == "KA":
            out.append((ts, *c["addr"], c["lbmrds"][0], 15380, data))
        if kind != "KA":
            out += [(ts + 0.0001 * (i + 1), lb, 15380, *HOST, data) for i, lb in enumerate(c["lbmrds"])]
    out.sort(key=lambda x: x[0])
    return out


def truth(ctxs: list[dict], evs: list[tuple]) -> tuple[dict, dict, dict]:
    """What each context really advertised: (context, topic) -> transport
    identities; transport identity -> contexts; OTID -> contexts."""
    from tests.analyze_reference import ref_tid
    adv, by_tid, by_otid = defaultdict(set), defaultdict(set), defaultdict(set)
    for _t, w, kind, topic, tr in evs:
        if kind == "TIR":
            tid = ref_tid(TRANSPORTS[tr])
            adv[(w, topic)].add(tid)
            by_tid[tid].add(w)
            by_otid[hashed_tir(topic, TRANSPORTS[tr]).options[0].otid.hex()].add(w)
    return adv, by_tid, by_otid


def check_claims(t: dict, ctxs: list[dict], evs: list[tuple]) -> None:
    """No finding or conflict row claims what the generated traffic does not hold."""
    adv, by_tid, by_otid = truth(ctxs, evs)
    for r in t["multi_transport_topics"]:            # "one context advertises X on n transports"
        assert any(set(r["transports"].split()) <= adv[(w, r["topic"])] for w in range(len(ctxs))), r
    for r in t["transport_conflicts"]:                # "n different contexts advertise one transport"
        assert len(by_tid[r["transport_id"]]) >= r["n_contexts"] >= 2, r
    for r in t["otid_collisions"]:
        assert len(by_otid[r["otid"]]) >= r["n_contexts"], r
    advertised = {topic for (_w, topic) in adv}
    assert not {r["topic"] for r in t["unresolved_topics"]} & advertised
    heads = set(TABLES)
    for f in t["findings"]:
        assert f["severity"] in SEVERITIES and f["kind"] and f["table"] in heads, f
        names = [c for c in f["contexts"].split(" | ") if c]
        assert len(names) == len(set(names)), f
    per_sec = defaultdict(int)
    for d in datagrams(ctxs, evs):
        per_sec[int(d[0])] += 1
    for r in t["storms"]:
        assert per_sec[r["second"]] == r["packets"] > STORM, r
        assert sum(c["packets"] for c in t["storm_contexts"] if c["second"] == r["second"]) == r["packets"]
    for f in t["findings"]:                      # "mostly" only when one context sent more than half
        if f["kind"] == "storm" and not f["finding"].startswith("..."):
            ep = [r for r in t["storm_contexts"] if f["first_seen"] <= r["time"] <= f["last_seen"]]
            per = defaultdict(int)
            for r in ep:
                per[(r["context"], r["src_id"])] += r["packets"]
            assert ("sent mostly by" in f["finding"]) == (2 * max(per.values()) > sum(per.values())), f


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(cap=captures())
def test_generated_captures_pure(tmp_path_factory, cap):
    dgs, ctxs, evs = cap
    d = tmp_path_factory.mktemp("gen")
    path = write_pcap(d / "g.pcap", dgs)
    _summary, t = pure_analyse(path, d)
    assert_tables_equal(t, reference_for(path, ports=PORTS, storm=STORM))
    check_claims(t, ctxs, evs)


@settings(max_examples=2, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(cap=captures())
def test_generated_captures_spark(spark, tmp_path_factory, cap):
    dgs, ctxs, evs = cap
    d = tmp_path_factory.mktemp("gen-spark")
    path = write_pcap(d / "g.pcap", dgs)
    res = run(spark, [path], d / "out", storm_threshold=STORM, report=False)
    assert_tables_equal(res.tables, reference_for(path, ports=PORTS, storm=STORM))
    check_claims(res.tables, ctxs, evs)


# ============================================================== finding content

def test_storm_shares_and_query_at_capture_end(tmp_path):
    """A storm spread over many contexts names its top senders with their shares
    (never "mostly"); a storm of one context says "sent mostly by" with its share;
    lbmrd-relayed senders are named with their src_id; a query after the last
    advertisement in the capture's last 5 s is "at capture end" and low, one
    earlier high."""
    d = []
    for i in range(8):                                   # second 10: 8 relayed contexts, 1 datagram each
        q = L.encode(L.Packet(tqrs=[L.TQR("S")], options=[L.SourceIdOption(0x8000, bytes([i]) * 8)]))
        d.append((T0 + 10 + 0.01 * i, "10.0.0.1", 15380, *HOST, q))
    q = L.encode(L.Packet(tqrs=[L.TQR("S")]))
    d += [(T0 + 20 + 0.01 * i, "10.4.4.4", 14402, *MCAST, q) for i in range(7)]    # second 20: one context
    for k in range(1, 38, 2):                               # E advertised until +37 s, G until +5 s
        d.append((T0 + k, "10.1.1.10", 14402, *MCAST,
                  L.encode(L.Packet(tirs=[hashed_tir("E", TRANSPORTS[0])] + ([hashed_tir("G", TRANSPORTS[1])] if k <= 5 else [])))))
    for ts in (0, 30):                                      # the capture starts at T0
        d.append((T0 + ts, "10.4.4.5", 14402, *MCAST, L.encode(L.Packet(tqrs=[L.TQR("G")]))))
    d.append((T0 + 38.5, "10.4.4.5", 14402, *MCAST, L.encode(L.Packet(tqrs=[L.TQR("E")]))))
    cap = write_pcap(tmp_path / "c.pcap", sorted(d, key=lambda x: x[0]))
    _s, t = pure_analyse(cap, tmp_path)
    storms = [f for f in t["findings"] if f["kind"] == "storm"]
    assert len(storms) == 2
    spread = next(f for f in storms if f["first_seen"] == iso_s(int(T0) + 10))
    assert "mostly" not in spread["finding"]
    assert f"[{'00' * 8}] via lbmrd 10.0.0.1:15380 1/s (12.5 %)" in spread["finding"]
    assert "37.5 % of 8/s together; 5 other context(s) sent the rest" in spread["finding"]
    assert len(spread["contexts"].split(" | ")) == 3
    one = next(f for f in storms if f["first_seen"] == iso_s(int(T0) + 20))
    assert "sent mostly by 10.4.4.4:14402: 7/s, 100.0 % of 7/s" in one["finding"]
    stale = {f["topics"]: f for f in t["findings"] if f["kind"] == "querying after last advertisement"}
    assert stale["E"]["severity"] == "low" and "at capture end" in stale["E"]["finding"]
    assert stale["G"]["severity"] == "high" and "at capture end" not in stale["G"]["finding"]
    assert f"advertisement at {iso(int(T0 + 5) * 10**6)} (last query {iso(int(T0 + 30) * 10**6)})" in stale["G"]["finding"]
    assert [f["severity"] for f in t["findings"]] == sorted((f["severity"] for f in t["findings"]),
                                                            key=SEVERITIES.index)


# ============================================================== anything the decoder accepts

@st.composite
def any_capture(draw) -> list[tuple]:
    """Every packet type the codec knows (tests/strategies.py: topic management,
    queue resolution, extended packets, any options and transports), and bytes that
    are not LBMR, from direct senders and lbmrds, at times hours apart."""
    from tests.strategies import packet
    out = []
    for _ in range(draw(st.integers(1, 12))):
        payload = draw(st.one_of(packet.map(L.encode), packet.map(L.encode), st.binary(min_size=1, max_size=40)))
        src = draw(st.sampled_from([("10.1.1.20", 14402), ("10.0.0.1", 15380), ("10.0.0.2", 15380)]))
        dst = draw(st.sampled_from([MCAST, HOST, (LBMRDS[0], 15380)]))
        out.append((T0 + draw(st.integers(0, 3 * HOUR_US)) / 1e6, *src, *dst, payload))
    if draw(st.booleans()):                                  # a storm second of one payload
        out += [(T0 + 1 + 0.01 * i, *out[0][1:]) for i in range(STORM + 1)]
    return sorted(out, key=lambda x: x[0])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(dgs=any_capture())
def test_any_decodable_capture_pure(tmp_path_factory, dgs):
    d = tmp_path_factory.mktemp("any")
    path = write_pcap(d / "a.pcap", dgs)
    summary, t = pure_analyse(path, d)
    assert set(t) >= set(TABLES) - {"summary"}
    lbmr = [x for x in dgs if x[2] in PORTS or x[4] in PORTS]         # a unicast 14402 -> 14402 is not
    assert summary["datagrams"] == len(lbmr) == sum(r["packets"] for r in t["load_per_second"]
                                                    if r["record_kind"] == "ALL")
    per_sec = defaultdict(int)
    for x in lbmr:
        per_sec[int(x[0])] += 1
    assert [(r["second"], r["packets"]) for r in t["storms"]] == sorted((s, n) for s, n in per_sec.items() if n > STORM)
    for f in t["findings"]:
        assert f["severity"] in SEVERITIES and f["kind"] and f["table"] in TABLES, f


def test_findings_per_kind_are_capped(tmp_path):
    """Twelve topics never advertised: ten findings, then one "... and 2 more"."""
    from lbmr_analyze.findings import PER_KIND
    d = [(T0 + i, "10.4.4.4", 14402, *MCAST, L.encode(L.Packet(tqrs=[L.TQR(f"T{i:02d}")]))) for i in range(12)]
    _s, t = pure_analyse(write_pcap(tmp_path / "q.pcap", d), tmp_path)
    never = [f for f in t["findings"] if f["kind"] == "never advertised"]
    assert len(never) == PER_KIND + 1 and never[-1]["finding"].startswith("... and 2 more")


def test_storm_contexts_tied_at_one_lbmrd_are_in_a_stable_order(tmp_path):
    """Found by the property test: two contexts relayed by one lbmrd with the
    same count in a storm second (src_id 1 and 2 via 10.0.0.2) came out in the
    order of the input, so the top three named either."""
    opts = lambda i: [L.SourceIdOption(0x8000, i.to_bytes(8, "big"))]  # noqa: E731
    tir = L.TIR("A", L.TcpTransport("10.1.1.5", 14402), 60, 1, [])
    pkt = lambda i: L.encode(L.Packet(0, 1, tirs=[tir], options=opts(i) if i else []))  # noqa: E731
    t0 = 1700000000.0001
    dgs = ([(t0, "10.0.0.2", 15380, "10.1.1.5", 14402, pkt(0))] * 7
           + [(t0, "10.0.0.1", 15380, "10.1.1.5", 14402, pkt(1)),
              (t0, "10.0.0.2", 15380, "10.1.1.5", 14402, pkt(2)),
              (t0, "10.0.0.2", 15380, "10.1.1.5", 14402, pkt(1))])
    path = write_pcap(tmp_path / "g.pcap", dgs)
    _summary, t = pure_analyse(path, tmp_path)
    assert_tables_equal(t, reference_for(path, ports=PORTS, storm=STORM))
    (storm,) = t["storms"]
    assert storm["top_contexts"].endswith("[0000000000000001] via lbmrd 10.0.0.2:15380 1/s (10.0 %)")
