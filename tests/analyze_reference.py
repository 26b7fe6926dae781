"""lbmr-analyze's synthetic capture (:func:`synthetic_datagrams`) and the
plain-Python reference of its tables (:func:`reference`, :func:`reference_for`),
and the job run in this process without Spark (:func:`analyse_without_spark`)."""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import lbmr_proto as L
from lbmr_analyze.job import TABLES
from lbmr_proto.capture import PcapWriter, read_udp

PORTS = {12965, 15380}
T0 = 1_700_000_000.0          # 2023-11-14T22:13:20Z; its minute starts at T0 - 20
STORM = 50
TRAILER = [L.SourceIdOption(0x8000, bytes(range(8))), L.SourceTypeOption(0x80, 0),
           L.VersionOption(0x8001, 0x060E0000), L.LocalDomainOption(0x8000, 5)]
S1, S2 = ("10.1.1.10", 14402), ("10.1.1.11", 14402)
Q1, Q2 = ("10.2.2.20", 14403), ("10.4.4.4", 14402)
TA = L.LbtrmTransport("10.1.1.10", "239.1.1.1", 1111, 14400, 14390)
TC1 = L.TcpTransport("10.1.1.10", 14371)
TC2 = L.LbtruSessionTransport("10.1.1.11", 77, 14380)
TX = L.TcpTransport("10.5.5.5", 15000)               # advertised from 10.5.5.5 and 10.5.5.6
TE = L.TcpTransport("192.168.50.5", 15001)           # NAT mismatch when sent from 10.7.7.7
TF = L.TcpTransport("0.0.0.0", 15002)                # filled in by receivers: never a mismatch
TG = L.TcpTransport("10.7.7.99", 15003)              # same /24 as its sender: not a mismatch


def hashed_tir(topic, transport, index=0, domain=None):
    """A TIR of ``topic`` on ``transport`` (topic index ``index``), its OTID a hash of both;
    ``domain``: a domain id option too."""
    otid = hashlib.sha256(f"{topic} {transport}".encode()).digest()
    opts = [L.OtidOption(0x8000, otid)] + ([L.DomainIdOption(0, domain)] if domain is not None else [])
    return L.TIR(topic, transport, 16, index, opts)


def trailed_datagram(**kw) -> bytes:
    """A TR datagram (``kw``: the Packet's fields) with the options of a UM 6.14 context
    (TRAILER)."""
    return L.encode(L.Packet(**kw, options=TRAILER))


def synthetic_datagrams() -> list[tuple]:
    """(ts, src, sport, dst, dport, payload) with known answers (see the tests)."""
    d = []
    dst = ("239.101.3.1", 12965)

    def add(ts, who, payload, to=dst):
        d.append((T0 + ts, who[0], who[1], to[0], to[1], payload))

    add(0.5, Q1, trailed_datagram(tqrs=[L.TQR("A")]))
    add(0.6, Q1, trailed_datagram(tqrs=[L.TQR("B")]))
    add(0.7, Q1, trailed_datagram(type=1, version=1, wc_tqrs=[L.WcTQR("^(A|C)$", 1)]))
    add(0.8, Q1, trailed_datagram(type=1, version=1, wc_tqrs=[L.WcTQR("([unclosed", 1)]))
    for k in range(1, 21):                                  # A advertised every second
        add(float(k), S1, trailed_datagram(tirs=[hashed_tir("A", TA, 1, domain=7)]))
    add(1.2, S1, trailed_datagram(tirs=[hashed_tir("C", TC1, 2)]))
    add(1.3, S2, trailed_datagram(tirs=[hashed_tir("C", TC2, 3)]))
    add(1.5, Q1, trailed_datagram(tqrs=[L.TQR("A"), L.TQR("C")]))
    add(2.1, ("10.5.5.5", 14402), trailed_datagram(tirs=[hashed_tir("D", TX)]))
    add(2.2, ("10.5.5.6", 14402), trailed_datagram(tirs=[hashed_tir("D", TX)]))
    add(2.3, ("10.7.7.7", 14402), trailed_datagram(tirs=[hashed_tir("E", TE), hashed_tir("F", TF), hashed_tir("G", TG)]))
    add(3.0, Q1, trailed_datagram(tqrs=[L.TQR("B")]))
    for i in range(60):                                     # a storm second: 61 datagrams at T0+10
        add(10.005 + i * 0.01, Q2, trailed_datagram(tqrs=[L.TQR("A")]))
    # keepalives (lbmrd clients) in two minutes: 2 clients, then 3
    lbmrd = ("10.0.0.1", 15380)
    add(1.1, ("10.9.9.1", 14402), L.encode(L.Packet(2)), lbmrd)
    add(1.1, ("10.9.9.2", 14402), L.encode(L.Packet(3)), lbmrd)
    add(45.0, ("10.9.9.1", 14402), L.encode(L.Packet(2)), lbmrd)
    add(45.1, ("10.9.9.2", 14402), L.encode(L.Packet(3)), lbmrd)
    add(45.2, ("10.9.9.3", 14405), L.encode(L.Packet(0)), lbmrd)
    add(46.0, ("10.9.9.3", 14405), L.encode(L.Packet(0)), lbmrd)
    add(5.0, ("10.8.8.8", 5555), b"\x07\xff\x00", lbmrd)     # undecodable on the lbmrd port
    add(5.5, ("10.8.8.8", 5555), b"not lbmr", ("10.0.0.2", 9999))        # other port: ignored
    add(6.0, ("10.8.8.9", 5556), trailed_datagram(tqrs=[L.TQR("Z")]), ("10.0.0.2", 20000))   # only with --port
    d.sort(key=lambda x: x[0])
    return d


def write_pcap(path: Path, dgrams, *, nanosecond=False) -> Path:
    """Write the datagrams ``dgrams`` ((ts, src, sport, dst, dport, payload)) to a pcap at
    ``path`` (``nanosecond``: nanosecond timestamps); the path."""
    with PcapWriter(path, nanosecond=nanosecond) as w:
        for i, dg in enumerate(dgrams):
            w.write_udp(*dg, ip_id=i)
    return path


def iso(us: int) -> str:
    """Microseconds since the epoch as the tables print them (UTC, microseconds, Z)."""
    return datetime.fromtimestamp(us // 1_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{us % 1_000_000:06d}Z"


def iso_s(sec: int) -> str:
    """Seconds since the epoch as the tables print them (UTC, whole seconds, Z)."""
    return datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ref_tid(t) -> str:
    """The id lbmr-analyze gives the transport ``t``: its kind, addresses, ports and session id."""
    if isinstance(t, L.LbtrmTransport):
        return f"LBTRM:{t.ip}:{t.src_ucast_port}:{t.mcast_group}:{t.dest_port}:{t.session_id}"
    if isinstance(t, L.TcpTransport):
        return f"TCP:{t.ip}:{t.port}"
    if isinstance(t, L.TcpSessionTransport):
        return f"TCP:{t.ip}:{t.port}:{t.session_id}"
    if isinstance(t, L.LbtruTransport):
        return f"LBTRU:{t.ip}:{t.port}"
    if isinstance(t, L.LbtruSessionTransport):
        return f"LBTRU:{t.ip}:{t.port}:{t.session_id}"
    if isinstance(t, L.LbtrdmaTransport):
        return f"LBTRDMA:{t.ip}:{t.port}:{t.session_id}"
    if isinstance(t, (L.LbtipcTransport, L.LbtsmxTransport)):
        return f"{t.NAME}:{t.host_id}:{t.xport_id}:{t.session_id}"
    return f"UNKNOWN:{t.type_code}:{t.data.hex()}"


def ref_records(path: str, dgrams) -> list[dict]:
    """Flat records from (ts, src, sport, dst, dport, payload, frame, offset) datagrams."""
    out = []
    for ts, src, sport, dst, dport, payload, _frame, off in dgrams:
        base = dict(file=path, offset=off, us=round(ts * 1e6), src=src, sport=sport, dst=dst, dport=dport,
                    length=len(payload), q=f"{src}:{sport}")
        recs = []
        base["cid"] = None
        try:
            pkt = L.decode(payload)
        except L.LBMRDecodeError as e:
            recs.append(dict(kind="DECODE_ERROR", ptype=None,
                             error=f"LBMR decode error at datagram byte {e.offset}: {e.reason}"))
        else:
            recs += [dict(kind="TQR", topic=q.topic) for q in pkt.tqrs]
            recs += [dict(kind="WC_TQR", topic=w.pattern, pattern_type=w.pattern_type) for w in pkt.wc_tqrs]
            recs += [dict(kind="TIR", topic=t.topic, tid=ref_tid(t.transport),
                          tip=getattr(t.transport, "ip", None),
                          otid=next((o.otid.hex() for o in t.options or () if isinstance(o, L.OtidOption)), None))
                     for t in pkt.tirs]
            base["cid"] = next((o.src_id.hex() for o in pkt.options or () if isinstance(o, L.SourceIdOption)), None)
            assert pkt.tmb is None and not pkt.qqrs and not pkt.qirs and pkt.ext is None
            if not recs:
                assert pkt.type in (2, 3) or (pkt.type == 0)
                recs.append(dict(kind="KEEPALIVE"))
            for r in recs:
                r["ptype"] = pkt.type_name
        seen = set()
        for i, r in enumerate(recs):
            r.update(base, index=i, kind_first=r["kind"] not in seen)
            seen.add(r["kind"])
            out.append(r)
    return out


def joined_set(vals) -> str:
    """The distinct non-None values, sorted and joined by spaces."""
    return " ".join(sorted({v for v in vals if v is not None}))


def ctx_label(src, sport, cid) -> str:
    """Context naming of lbmr-analyze(1): lbmrd's port 15380 means relayed."""
    if sport == 15380:
        return (f"[{cid}] via lbmrd {src}:{sport}" if cid else f"via lbmrd {src}:{sport}")
    return f"{src}:{sport} [{cid}]" if cid else f"{src}:{sport}"


def ctx_ids(rs) -> int:
    """How many contexts TIRs ``rs`` surely come from: a direct sender is its ip:port
    and src_id; a relayed one (port 15380) its src_id, the same context as a direct
    sender with that src_id; relayed without src_id, anyone (not counted)."""
    direct = {(r["q"], r["cid"]) for r in rs if r["sport"] != 15380}
    relayed = {r["cid"] for r in rs if r["sport"] == 15380 and r["cid"]}
    return len(direct) + len(relayed - {c for _, c in direct})


def pct(n: int, total: int) -> str:
    """A share as the tables print it: one decimal, "<0.1 %" when smaller but not zero."""
    return "<0.1 %" if 0 < 1000 * n < total else f"{100 * n / total:.1f} %"


def nat_reachable(ip: str, hosts: set[str]) -> bool:
    """The NAT rule of thumb: a host seen in the same /24, or in the same private block."""
    import ipaddress
    blocks = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                               "127.0.0.0/8", "169.254.0.0/16")]
    a = ipaddress.ip_address(ip)
    for h in hosts:
        b = ipaddress.ip_address(h)
        if ipaddress.ip_network(f"{h}/24", strict=False) == ipaddress.ip_network(f"{ip}/24", strict=False):
            return True
        if any(a in n and b in n for n in blocks):
            return True
    return False


def reference(recs: list[dict], *, storm=STORM, top=20, capture_errors=()) -> dict[str, list[dict]]:
    """Every analysis table, computed in plain Python."""
    T: dict[str, list[dict]] = {}
    lab = lambda r: ctx_label(r["src"], r["sport"], r["cid"])  # noqa: E731
    by_topic = defaultdict(list)
    for r in recs:
        if r["kind"] in ("TIR", "TQR"):
            by_topic[r["topic"]].append(r)
    inv = []
    for topic in sorted(by_topic):
        rs = by_topic[topic]
        tirs = [r for r in rs if r["kind"] == "TIR"]
        tqrs = [r for r in rs if r["kind"] == "TQR"]
        inv.append(dict(
            topic=topic, advertisements=len(tirs), queries=len(tqrs),
            n_sources=len({r["tid"] for r in tirs}), sources=joined_set(r["tid"] for r in tirs),
            advertisers=" | ".join(sorted({lab(r) for r in tirs})), n_queriers=len({(r["q"], r["cid"]) for r in tqrs}),
            first_seen=iso(min(r["us"] for r in rs)), last_seen=iso(max(r["us"] for r in rs)),
            first_advertised=iso(min(r["us"] for r in tirs)) if tirs else None,
            last_advertised=iso(max(r["us"] for r in tirs)) if tirs else None,
            first_queried=iso(min(r["us"] for r in tqrs)) if tqrs else None))
    inv.sort(key=lambda i: (-(i["advertisements"] + i["queries"]), i["topic"]))
    T["topic_inventory"] = inv
    T["top_topics"] = [dict(topic=i["topic"], records=i["advertisements"] + i["queries"],
                            advertisements=i["advertisements"], queries=i["queries"], n_sources=i["n_sources"])
                       for i in inv][:top]
    adv = {i["topic"] for i in inv if i["advertisements"]}
    un = defaultdict(list)
    for r in recs:
        if r["kind"] == "TQR" and r["topic"] not in adv:
            un[(r["topic"], r["src"], r["sport"], r["cid"])].append(r)      # a querier: ip:port + src_id
    T["unresolved_topics"] = sorted(
        (dict(topic=t, querier=f"{s}:{p}", src_id=c, queries=len(rs),
              first_query=iso(min(r["us"] for r in rs)), last_query=iso(max(r["us"] for r in rs)),
              via_lbmrd=p == 15380) for (t, s, p, c), rs in un.items()),
        key=lambda x: (-x["queries"], x["topic"], x["querier"], x["src_id"] or ""))
    last_tir = {}
    for r in recs:
        if r["kind"] == "TIR":
            last_tir[r["topic"]] = max(last_tir.get(r["topic"], r["us"]), r["us"])
    st = defaultdict(list)
    for r in recs:
        if r["kind"] == "TQR" and r["topic"] in last_tir and r["us"] > last_tir[r["topic"]]:
            st[(r["topic"], r["src"], r["sport"], r["cid"])].append(r)
    T["stale_queries"] = sorted(
        (dict(topic=t, querier=f"{s}:{p}", src_id=c, last_advertised=iso(last_tir[t]), queries_after=len(rs),
              first_query_after=iso(min(r["us"] for r in rs)), last_query=iso(max(r["us"] for r in rs)),
              silent_s=round((max(r["us"] for r in rs) - last_tir[t]) / 1e6, 6))
         for (t, s, p, c), rs in st.items()),
        key=lambda x: (-x["queries_after"], x["topic"], x["querier"], x["src_id"] or ""))
    # time to resolve
    firstq: dict[tuple, int] = {}
    for r in recs:
        if r["kind"] == "TQR":
            k = (r["q"], r["cid"], r["topic"])
            firstq[k] = min(firstq.get(k, r["us"]), r["us"])
    ttr = []
    for (q, cid, topic), us in firstq.items():
        later = [r["us"] for r in by_topic[topic] if r["kind"] == "TIR" and r["us"] >= us]
        if later:
            ttr.append(dict(querier=q, src_id=cid, topic=topic, first_query=iso(us),
                            resolved_at=iso(min(later)), time_to_resolve_s=(min(later) - us) / 1e6))
    T["time_to_resolve"] = sorted(ttr, key=lambda x: (-x["time_to_resolve_s"], x["topic"], x["querier"],
                                                      x["src_id"] or ""))
    tirs = [r for r in recs if r["kind"] == "TIR"]
    by_tid, by_otid, by_ct = defaultdict(list), defaultdict(list), defaultdict(list)
    for r in tirs:
        by_tid[r["tid"]].append(r)
        if r["otid"]:
            by_otid[r["otid"]].append(r)
        if r["sport"] != 15380:
            by_ct[(r["q"], r["cid"], r["topic"])].append(r)
        elif r["cid"]:                                   # relayed: the src_id is the context
            by_ct[(None, r["cid"], r["topic"])].append(r)
    T["transport_conflicts"] = sorted(
        (dict(transport_id=tid, n_contexts=ctx_ids(rs), contexts=" | ".join(sorted({lab(r) for r in rs})),
              n_topics=len({r["topic"] for r in rs}), topics=joined_set(r["topic"] for r in rs), advertisements=len(rs),
              first_seen=iso(min(r["us"] for r in rs)), last_seen=iso(max(r["us"] for r in rs)))
         for tid, rs in by_tid.items() if ctx_ids(rs) > 1),
        key=lambda x: (-x["n_contexts"], x["transport_id"]))
    T["otid_collisions"] = sorted(
        (dict(otid=o, n_topics=len({r["topic"] for r in rs}), topics=joined_set(r["topic"] for r in rs),
              n_contexts=ctx_ids(rs), contexts=" | ".join(sorted({lab(r) for r in rs})),
              transports=joined_set(r["tid"] for r in rs), advertisements=len(rs))
         for o, rs in by_otid.items() if len({r["topic"] for r in rs}) > 1 or ctx_ids(rs) > 1),
        key=lambda x: (-(x["n_topics"] + x["n_contexts"]), x["otid"]))
    T["multi_transport_topics"] = sorted(
        (dict(context=" | ".join(sorted({ctx_label(r["src"], r["sport"], None) for r in rs})), src_id=c, topic=t,
              n_transports=len({r["tid"] for r in rs}), transports=joined_set(r["tid"] for r in rs), advertisements=len(rs),
              first_seen=iso(min(r["us"] for r in rs)), last_seen=iso(max(r["us"] for r in rs)))
         for (_q, c, t), rs in by_ct.items() if len({r["tid"] for r in rs}) > 1),
        key=lambda x: (-x["n_transports"], x["context"], x["topic"], x["src_id"] or ""))
    # load
    load = defaultdict(lambda: [0, 0, 0])
    for r in recs:
        sec = r["us"] // 1_000_000
        for kind, counts in ((r["kind"], r["kind_first"]), ("ALL", r["index"] == 0)):
            v = load[(sec, kind)]
            v[1] += 1
            if counts:
                v[0] += 1
                v[2] += r["length"]
    T["load_per_second"] = [dict(second=s, time=iso_s(s), record_kind=k, packets=v[0], records=v[1], bytes=v[2])
                            for (s, k), v in sorted(load.items())]
    storms, sc = [], []
    for (s, k), v in sorted(load.items()):
        if k != "ALL" or v[0] <= storm:
            continue
        per = defaultdict(int)
        for r in recs:
            if r["index"] == 0 and r["us"] // 1_000_000 == s:
                per[(r["src"], r["sport"], r["cid"])] += 1
        cs = sorted(per.items(), key=lambda kv: (-kv[1], kv[0][0], kv[0][1], kv[0][2] or ""))
        sc += [dict(second=s, time=iso_s(s), context=f"{a}:{p}", src_id=c, packets=n, share=round(n / v[0], 4))
               for (a, p, c), n in cs]
        storms.append(dict(second=s, time=iso_s(s), packets=v[0], records=v[1], bytes=v[2],
                           top_contexts="; ".join(f"{ctx_label(a, p, c)} {n}/s ({pct(n, v[0])})"
                                                  for (a, p, c), n in cs[:3])))
    T["storms"], T["storm_contexts"] = storms, sc
    talk = defaultdict(list)
    for r in recs:
        if r["kind"] != "DECODE_ERROR":
            talk[(r["src"], r["sport"], r["cid"])].append(r)
    tt = [dict(context=f"{s}:{p}", src_id=c, via_lbmrd=p == 15380, packets=sum(r["index"] == 0 for r in rs),
               bytes=sum(r["length"] for r in rs if r["index"] == 0),
               records=len(rs), tirs=sum(r["kind"] == "TIR" for r in rs), tqrs=sum(r["kind"] == "TQR" for r in rs),
               keepalives=sum(r["kind"] == "KEEPALIVE" for r in rs),
               first_seen=iso(min(r["us"] for r in rs)), last_seen=iso(max(r["us"] for r in rs)))
          for (s, p, c), rs in talk.items()]
    tt.sort(key=lambda x: (-x["packets"], -x["bytes"], x["context"], x["src_id"] or ""))
    T["contexts"] = tt
    T["top_talkers"] = tt[:top]
    # lbmrd clients that joined / vanished (15 s rule)
    good = [r for r in recs if r["kind"] != "DECODE_ERROR"]
    changes = []
    if good:
        start, end = min(r["us"] for r in good), max(r["us"] for r in good)
        for (s, p, c), rs in talk.items():
            if p == 15380 or not any(r["kind"] == "KEEPALIVE" or r["dport"] == 15380 for r in rs):
                continue
            f, la = min(r["us"] for r in rs), max(r["us"] for r in rs)
            n = sum(r["index"] == 0 for r in rs)
            if f - start > 15_000_000:
                changes.append(dict(client=f"{s}:{p}", src_id=c, event="joined", time=iso(f), silent_s=None,
                                    datagrams=n))
            if end - la > 15_000_000:
                changes.append(dict(client=f"{s}:{p}", src_id=c, event="vanished", time=iso(la),
                                    silent_s=round((end - la) / 1e6, 3), datagrams=n))
    T["client_changes"] = sorted(changes, key=lambda x: (x["time"], x["client"], x["event"]))
    # wildcards
    wc = defaultdict(list)
    for r in recs:
        if r["kind"] == "WC_TQR":
            wc[(r["topic"], r["pattern_type"])].append(r)
    topics = sorted(by_topic)
    pats, matches = [], []
    for (p, t) in sorted(wc):
        rs = wc[(p, t)]
        try:
            rx, err = re.compile(p), None
        except re.error as e:
            rx, err = None, f"invalid pattern: {e}"
        hits = [x for x in topics if rx is not None and rx.search(x)]
        matches += [dict(pattern=p, pattern_type=t, topic=x) for x in hits]
        pats.append(dict(pattern=p, pattern_type=t, queries=len(rs),
                         queriers=" | ".join(sorted({lab(r) for r in rs})),
                         first_seen=iso(min(r["us"] for r in rs)), last_seen=iso(max(r["us"] for r in rs)),
                         matched_topics=len(hits), error=err))
    T["wildcard_patterns"] = pats
    T["wildcard_matches"] = matches
    ka = defaultdict(list)
    for r in recs:
        if r["kind"] == "KEEPALIVE":
            ka[r["q"]].append(r)
    T["keepalive_senders"] = [dict(client=c, packets=len(rs), types=joined_set(r["ptype"] for r in rs),
                                   destinations=joined_set(r["dst"] for r in rs),
                                   first_seen=iso(min(r["us"] for r in rs)), last_seen=iso(max(r["us"] for r in rs)))
                              for c, rs in sorted(ka.items())]
    cen = defaultdict(list)
    for rs in ka.values():
        for r in rs:
            cen[r["us"] // 1_000_000 // 60 * 60].append(r)
    T["keepalive_census"] = [dict(minute=m, time=iso_s(m), clients=len({(r["src"], r["sport"]) for r in rs}),
                                  packets=len(rs)) for m, rs in sorted(cen.items())]
    hosts = set()
    for r in good:
        if r["sport"] != 15380:
            hosts.add(r["src"])
        if not r["dst"].startswith(tuple(f"{n}." for n in range(224, 240))):
            hosts.add(r["dst"])
    nat = defaultdict(list)
    for r in tirs:
        ip = r["tip"]
        if ip and ip != "0.0.0.0" and not nat_reachable(ip, hosts):
            nat[(ip, r["tid"], r["topic"], lab(r))].append(r)
    T["nat_audit"] = [dict(advertised_ip=k[0], transport_id=k[1], topic=k[2], advertiser=k[3],
                           via_lbmrd=rs[0]["sport"] == 15380, advertisements=len(rs),
                           first_seen=iso(min(r["us"] for r in rs)), last_seen=iso(max(r["us"] for r in rs)),
                           reason="no host of this /24 or private block was seen in the capture")
                      for k, rs in sorted(nat.items())]
    T["capture_errors"] = [dict(file=e.path, offset=e.offset, error=e.reason) for e in capture_errors]
    T["decode_errors"] = [dict(file=r["file"], offset=r["offset"], time=iso(r["us"]), src=r["src"], sport=r["sport"],
                               dst=r["dst"], dport=r["dport"], length=r["length"], error=r["error"])
                          for r in sorted(recs, key=lambda r: (r["file"], r["offset"])) if r["kind"] == "DECODE_ERROR"]
    files = defaultdict(list)
    for r in recs:
        files[r["file"]].append(r)
    T["files"] = [dict(file=f, datagrams=sum(r["index"] == 0 for r in rs), records=len(rs),
                       bytes=sum(r["length"] for r in rs if r["index"] == 0),
                       decode_errors=sum(r["kind"] == "DECODE_ERROR" for r in rs),
                       capture_errors=sum(e.path == f for e in capture_errors),
                       first_seen=iso(min(r["us"] for r in rs)), last_seen=iso(max(r["us"] for r in rs)))
                  for f, rs in sorted(files.items())]
    return T


COMPARED = [t for t in TABLES if t not in ("summary", "findings")]


def assert_tables_equal(got: dict, want: dict, names=COMPARED) -> None:
    """Each table of ``names`` in ``got`` equals the one in ``want``."""
    for name in names:
        assert got[name] == want[name], f"table {name} differs"


def reference_for(path: Path, ports=PORTS | {20000}, **kw) -> dict:
    """The plain-Python reference tables of the capture at ``path`` (datagrams to ``ports``);
    ``kw``: :func:`reference`'s settings."""
    return reference(ref_records(str(path), read_udp(str(path), ports=ports)), **kw)


def analyse_without_spark(cap: Path, out: Path, split_size: int = 1 << 30, *, transport: bool = True,
                          storm_threshold: int = 1000) -> tuple[dict, dict]:
    """lbmr-analyze's job in this process, without Spark: each byte range of
    ``cap`` decoded and written under ``out/records`` as a decoding task does,
    the transport tasks' function per range, the driver's merge and analyses:
    (summary, tables)."""
    import shutil

    from lbmr_analyze import partials as P
    from lbmr_analyze import splits as S
    from lbmr_analyze.job import analyse
    from lbmr_analyze.rows import write_split
    from lbmr_analyze.transport import transport_pass

    ports = frozenset({12965, 15380})
    shutil.rmtree(out / "records", ignore_errors=True)
    parts: list = []
    splits = S.plan([str(cap)], split_size)
    rows, seen = [], []            # pcapng: the blocks in force at each range's start, as the job hands them
    for s in splits:
        ctx = S.context_for(seen, 1 << 62) if s.start else b""
        seen += S.context_blocks(s) if len(splits) > 1 else []
        rows.append((s.split_id, s.path, s.start, s.end, s.size, ctx))
        write_split(s, ports, ctx, str(out / "records"), partials=parts)
    merged = P.merge(parts)
    tx = None
    if transport:
        tx = transport_pass(None, rows, ports, merged)
    return analyse(None, str(out / "records"), merged, transport=tx, storm_threshold=storm_threshold)


def shuffle_partitions(spark, n: int):
    """``spark`` with ``n`` shuffle partitions (a runtime SQL option), restored after
    (a generator for a module's fixture)."""
    key = "spark.sql.shuffle.partitions"
    before = spark.conf.get(key)
    spark.conf.set(key, str(n))
    try:
        yield spark
    finally:
        spark.conf.set(key, before)
