"""Property tests of lbmr-analyze's transport pass, without Spark (the job's
own functions in this process: each byte range decoded and written as a
decoding task does, the transport tasks' function per range, the driver's
merge and analyses).

For any capture of LBT-RM, LBT-RU and LBT-TCP traffic (with or without TIRs,
NAKs, NCFs, session messages, ICMP errors, TCP holes and junk, in any order):
no crash; the tables cut into many byte ranges equal the tables of one range;
every transport finding rests on evidence in the tables, checked here rule by
rule; bad input is counted by reason, never raised.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lbmr_proto as L
from lbmr_analyze import transport_findings as TF
from lbmr_analyze.findings import SEVERITIES
from lbmr_analyze.job import TRANSPORT_TABLES
from lbmr_proto import lbmc as C
from lbmr_proto import lbtrm as RM
from lbmr_proto import lbtru as RU
from lbmr_proto.capture import LINKTYPE_RAW, PcapWriter
from tests.analyze_reference import analyse_without_spark
from tests.transport_captures import icmp_unreachable, tcp_packet, udp_packet

T0 = 1_700_000_000.0
SRC = "10.1.0.1"
#: LBT-RM sessions: (source ip, NAK port, session id, group, with a TIR)
RM_SESSIONS = [(SRC, 14390, 0x11, "239.3.3.1", True), (SRC, 14391, 0x22, "239.3.3.2", True),
               ("10.1.0.9", 14394, 0x77, "239.3.3.9", False)]
RU_SRC, RU_SID = (SRC, 14380), 0x44
TCP_SRC, TCP_SID = (SRC, 14371), 0x55
RECEIVERS = [("10.2.0.1", 45001), ("10.2.0.2", 45002), ("10.2.0.3", 45003)]
CONTEXTS = [("10.2.0.1", 40001), ("10.2.0.2", 40002)]
TOPICS = ["a", "b", "c", "d"]


def _tirs() -> bytes:
    tirs = []
    for i, (ip, port, sid, grp, tir) in enumerate(RM_SESSIONS):
        if tir:
            tirs += [L.TIR(TOPICS[2 * i], L.LbtrmTransport(ip, grp, sid, 14400, port), 0, 1),
                     L.TIR(TOPICS[2 * i + 1], L.LbtrmTransport(ip, grp, sid, 14400, port), 0, 2)]
    tirs += [L.TIR("ru", L.LbtruSessionTransport(SRC, RU_SID, RU_SRC[1]), 0, 5),
             L.TIR("tcp", L.TcpSessionTransport(SRC, TCP_SID, TCP_SRC[1]), 0, 6)]
    return L.encode(L.Packet(0, tirs=tirs))


sqn = st.integers(0, 40)
sqns = st.lists(sqn, min_size=1, max_size=5)
events = st.one_of(
    st.tuples(st.just("rm_data"), st.integers(0, 2), sqn, st.booleans(), st.integers(1, 3)),
    st.tuples(st.just("rm_nak"), st.integers(0, 2), st.integers(0, 2), sqns),
    st.tuples(st.just("rm_ncf"), st.integers(0, 2), st.integers(0, 3), sqns),
    st.tuples(st.just("rm_sm"), st.integers(0, 2), sqn),
    st.tuples(st.just("rm_icmp"), st.integers(0, 2), st.integers(0, 2), sqns),
    st.tuples(st.just("ru"), st.sampled_from(["data", "rx", "nak", "ncf", "sm", "ack", "creq", "rst"]), sqn, sqns),
    st.tuples(st.just("tcp"), st.sampled_from(["open", "data", "junk", "hole", "zero", "rst", "fin"]),
              st.integers(1, 3)),
    st.tuples(st.just("junk"), st.sampled_from([14390, 14400, 14380, 14394]), st.binary(max_size=40)),
    st.tuples(st.just("lbmr"), st.sampled_from(["tir", "tqr0", "tqr1", "wc"])),
)
captures = st.lists(st.tuples(st.floats(0, 0.7), events), min_size=1, max_size=80)


class _Tcp:
    def __init__(self) -> None:
        self.seq = {True: 1000, False: 5000}
        self.rcv = ("10.2.0.6", 45200)

    def frames(self, kind: str, n: int) -> list[bytes]:
        src, rcv, s = TCP_SRC, self.rcv, self.seq
        if kind == "open":
            s[True], s[False] = 1000, 5000
            out = [tcp_packet(rcv, src, s[False], 0, 0x02), tcp_packet(src, rcv, s[True], s[False] + 1, 0x12)]
            s[True] += 1
            s[False] += 1
            first = C.encode(C.Message(C.CONTROL, headers=(C.TcpSidHeader(0, TCP_SID),)))
            out.append(tcp_packet(src, rcv, s[True], s[False], 0x18, first))
            s[True] += len(first)
            return out
        if kind in ("data", "junk", "hole"):
            body = b"".join(C.data_message(6, k, b"x" * k) for k in range(n)) if kind != "junk" else b"\xff" * 7 * n
            if kind == "hole":
                s[True] += 13
            out = [tcp_packet(src, rcv, s[True], s[False], 0x18, body)]
            s[True] += len(body)
            return out
        flags = {"zero": 0x10, "rst": 0x14, "fin": 0x11}[kind]
        return [tcp_packet(rcv, src, s[False], s[True], flags, window=0 if kind == "zero" else 65535)]


def _ru(what: str, q: int, qs: list[int]) -> tuple[bool, bytes]:
    """(sent by the source, LBT-RU payload) of one LBT-RU event."""
    if what in ("data", "rx"):
        return True, RU.encode_data(q, 0, C.data_message(5, q, b"r"), session_id=RU_SID, retransmission=what == "rx")
    if what == "ncf":
        return True, RU.encode_ncf(0, qs, reason=q % 4, session_id=RU_SID)
    if what == "sm":
        return True, RU.encode_sm(q, q, 0, syn=q % 2 == 0, session_id=RU_SID)
    if what == "rst":
        return True, RU.encode_rst()
    if what == "nak":
        return False, RU.encode_nak(qs, session_id=RU_SID, client_id=3)
    if what == "ack":
        return False, RU.encode_ack(q, session_id=RU_SID, client_id=3)
    return False, RU.encode_creq(session_id=RU_SID, client_id=3)


def _lbmr(what: str) -> bytes:
    """A TIR datagram from the source context, or a query from a receiving context."""
    if what == "tir":
        return udp_packet((SRC, 40000), ("239.1.1.1", 12965), _tirs())
    if what == "wc":
        pkt = L.Packet(1, version=1, wc_tqrs=[L.WcTQR("^[bd]$", 1)])
    else:
        pkt = L.Packet(0, tqrs=[L.TQR("a")] if what == "tqr0" else [L.TQR("a"), L.TQR("c"), L.TQR("d")])
    return udp_packet(CONTEXTS[0] if what in ("tqr0", "wc") else CONTEXTS[1], ("239.1.1.1", 12965), L.encode(pkt))


def build(path: Path, caps) -> None:
    frames: list[tuple[float, bytes]] = []
    t = 0.0
    tcp = _Tcp()
    for dt, ev in caps:
        t += dt
        kind = ev[0]
        out: list[bytes] = []
        if kind.startswith("rm_"):
            ip, port, sid, grp, _ = RM_SESSIONS[ev[1]]
            if kind == "rm_data":
                flags = RM.FLAG_RETRANSMISSION if ev[3] else 0
                out.append(udp_packet((ip, 50000), (grp, 14400), RM.encode_data(
                    port, sid, ev[2], 0, C.data_message(ev[4], ev[2], b"m"), flags=flags)))
            elif kind == "rm_nak":
                out.append(udp_packet(RECEIVERS[ev[2]], (ip, port), RM.encode_nak(port, sid, ev[3])))
            elif kind == "rm_ncf":
                out.append(udp_packet((ip, 50000), (grp, 14400), RM.encode_ncf(port, sid, 0, ev[3], reason=ev[2])))
            elif kind == "rm_sm":
                out.append(udp_packet((ip, 50000), (grp, 14400), RM.encode_sm(port, sid, 0, ev[2], 0)))
            else:
                out.append(icmp_unreachable(ip, udp_packet(RECEIVERS[ev[2]], (ip, port),
                                                           RM.encode_nak(port, sid, ev[3]))))
        elif kind == "ru":
            from_source, body = _ru(*ev[1:])
            rcv = ("10.2.0.4", 45100)
            out.append(udp_packet(RU_SRC, rcv, body) if from_source else udp_packet(rcv, RU_SRC, body))
        elif kind == "tcp":
            out += tcp.frames(ev[1], ev[2])
        elif kind == "junk":
            dst = (SRC, ev[1]) if ev[1] != 14400 else ("239.3.3.1", 14400)
            out.append(udp_packet(("10.2.0.9", 45999), dst, ev[2]))
        else:
            out.append(_lbmr(ev[1]))
        frames += [(t + i * 1e-4, f) for i, f in enumerate(out)]
    with PcapWriter(path, linktype=LINKTYPE_RAW) as w:
        for ts, f in frames:
            w.write_frame(T0 + ts, f)


def pipeline(cap: Path, out: Path, split_size: int) -> tuple[dict, dict]:
    """The job without Spark, transport pass included: (summary, tables)."""
    return analyse_without_spark(cap, out, split_size)


# ============================================================== evidence, rule by rule

def _sessions(t: dict) -> dict:
    return {s["source"]: s for s in t["transport_sessions"]}


def _receivers(t: dict, key: str) -> list[dict]:
    return [r for r in t["transport_receivers"] if r["session"] == key]


def _timeline(t: dict, key: str) -> list[dict]:
    return [r for r in t["transport_timeline"] if r["session"] == key]


def _secs(a: str, b: str) -> float:
    from datetime import datetime
    return (datetime.fromisoformat(b.replace("Z", "+00:00")) - datetime.fromisoformat(a.replace("Z", "+00:00"))
            ).total_seconds()


def evidence_holds(f: dict, t: dict) -> bool:
    """Whether the tables hold what finding ``f`` claims (checked apart from the rules' code)."""
    kind = f["kind"]
    if kind == "transport bad input":
        return any(r["kind"] == "bad input" and r["count"] > 0 for r in t["transport_errors"])
    if kind == "transport bounds reached":
        return any(r["kind"] != "bad input" and r["count"] > 0 for r in t["transport_errors"])
    s = _sessions(t).get(f["session"])
    if s is None:
        return False
    recv, tl = _receivers(t, s["session"]), _timeline(t, s["session"])
    if kind == "unrecoverable loss: source stopped":
        last = s["source_last"] or s["last_original_ts"]
        return any(r["outstanding_count"] and (s["icmp_errors"] or (last and r["last_ts"] > last)) for r in recv)
    if kind == "NAKs never answered":
        return any(r["outstanding_count"] for r in recv)
    if kind == "NAKs to a stopped source":
        return s["icmp_errors"] > 0
    if kind == "datagrams to a closed receiver":
        return s["receiver_icmp_errors"] > 0 and any(r["icmp_errors"] and r["receiver"] in f["finding"] for r in recv)
    if kind.startswith("NCF: "):
        col = {"NAK ignored": "ncf_ignored", "NAK shed": "ncf_shed", "retransmit delay": "ncf_rx_delay",
               "do not retry": "ncf_no_retry"}[kind[5:]]
        return s[col] > 0
    if kind == "lossy receiver":
        return any(r["nak_packets"] and (r["naked_sqns"] > TF.LOSS_THRESHOLD * s["originals"] or r["nak_packets"]
                                         > TF.NAK_RATE_THRESHOLD * max(_secs(r["first_ts"], r["last_ts"]), 1.0))
                   for r in recv)
    if kind == "NAK storm":
        return any(x["nak_packets"] >= TF.NAK_STORM_PER_S for x in tl)
    if kind == "retransmission rate":
        return s["retransmission_bytes"] > TF.RETRANSMISSION_RATIO * s["original_bytes"] > 0
    if kind in ("idle session", "NAKs in an idle window"):
        idle = [x for x in tl if x["session_messages"] and not x["originals"] and f["first_seen"] <= x["time"]
                <= f["last_seen"]]
        return bool(idle) and (kind == "idle session" or any(x["nak_packets"] for x in idle))
    if kind == "uninteresting topic traffic":
        rows = [x for x in t["transport_topics"] if x["session"] == s["session"]]
        ctx = f["contexts"]
        asked = any(ctx in x["queriers"].split() for x in rows)
        extra = [x for x in rows if (x["topic"] or f"tidx {x['tidx']}") in f["topics"].split(" | ")]
        return asked and bool(extra) and all(x["messages"] + x["rx_messages"] and ctx not in x["queriers"].split()
                                             for x in extra)
    if kind == "receiver of an unadvertised session":
        return not s["from_tir"] and any(r["receiver"] == f["contexts"] for r in recv)
    if kind == "slow TCP receiver":
        return any(r["zero_windows"] >= TF.ZERO_WINDOW_SEGMENTS for r in recv)
    if kind == "TCP session reset":
        return any(r["resets"] for r in recv)
    return False


def comparable(caps, rows: list[dict]) -> list[dict]:
    """The rows that byte ranges must give exactly as one range does: all of
    them, but (documented) an LBT-TCP stream cut by a range boundary
    resynchronises on the next message; and for sessions found only by their
    headers (no TIR in the capture), a range knows them from their first packet
    in it, so the bad input on their addresses before that, and LBT-RU packets
    without a session-id option, are not counted there."""
    advertised = any(ev == ("lbmr", "tir") for _dt, ev in caps)
    exact = advertised and not any(ev[0].startswith("rm_") and ev[1] == 2 for _dt, ev in caps)

    def keep(r: dict) -> bool:
        key = str(r.get("session", ""))
        if key.startswith("TCP") or str(r.get("reason", "")).startswith("tcp_"):
            return False
        if not exact and ("reason" in r or (key.startswith("LBTRU") and not advertised)):
            return False
        return True

    return [r for r in rows if keep(r)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                  HealthCheck.function_scoped_fixture])
@given(caps=captures, cut=st.integers(300, 3000))
def test_any_transport_capture_analyses_and_every_finding_has_evidence(tmp_path, caps, cut):
    cap = tmp_path / "t.pcap"
    build(cap, caps)
    summary, whole = pipeline(cap, tmp_path / "whole", 1 << 30)
    _, parts = pipeline(cap, tmp_path / "cut", cut)
    assert whole["capture_errors"] == []
    # (a byte range may, rarely, resynchronise inside a record of a tiny capture: the range before
    # it reports a capture error there, records are missing, never silently; lbmr_analyze.splits)
    for name in TRANSPORT_TABLES if not parts["capture_errors"] else ():
        assert comparable(caps, parts[name]) == comparable(caps, whole[name]), name
    for f in whole["findings"]:
        assert f["severity"] in SEVERITIES and f["kind"] and f["finding"]
        if f["table"].startswith("transport_") or f["session"]:
            assert f["table"] in TRANSPORT_TABLES and (f["evidence"] or f["finding"].startswith("... and")), f
            assert f["finding"].startswith("... and") or evidence_holds(f, whole), f
    bad = sum(r["count"] for r in whole["transport_errors"] if r["kind"] == "bad input")
    assert summary["transport_bad_input"] == bad
