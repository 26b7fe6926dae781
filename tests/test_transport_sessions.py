"""Transport sessions (lbmr_proto.transport_sessions, issue 24): LBT-RM, LBT-RU
and LBT-TCP records judged field by field by tshark's lbtrm, lbtru, lbttcp and
lbmc dissectors (with "Decode As"; we use none), on generated traffic and on
the real capture; per-session counts equal to tshark's; the tables; merging
partitions; bounds; bad input counted by reason, never raised."""

from __future__ import annotations

import struct
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lbmr_proto import lbmc as C
from lbmr_proto import lbtrm as RM
from lbmr_proto import lbtru as RU
from lbmr_proto.capture import LINKTYPE_RAW, PcapWriter, TcpSegment, read_packets
from lbmr_proto.transport_sessions import (
    MAX_RECEIVERS,
    MessageRecord,
    SessionsState,
    TransportDecoder,
    TransportRecord,
    receiver_rows,
    session_rows,
    source_string,
    topic_rows,
)
from tests.helpers import real_capture
from tests.transport_captures import (
    GEN_DECODE_AS,
    GEN_RM,
    GEN_RM_NO_TIR,
    UNNAMED_RU,
    UNNAMED_RU_CTX,
    UNNAMED_RU_DECODE_AS,
    UNNAMED_RU_GONE,
    UNNAMED_RU_LEAVES,
    UNNAMED_RU_STAYS,
    icmp_unreachable,
    udp_packet,
    write_transport_capture,
    write_unnamed_lbtru_capture,
)
from tests.tshark_judge import tcp_segment, tshark_field_rows

REAL_DECODE_AS = ("udp.port==14400,lbtrm", "udp.port==12090,lbtrm", "udp.port==12091,lbtrm",
                  "udp.port==12965,lbmr")
RM_TYPES = {"DATA": 0, "SM": 2, "NAK": 3, "NCF": 4}
RU_TYPES = {"DATA": 0, "SM": 2, "NAK": 3, "NCF": 4, "ACK": 5, "CREQ": 6, "RST": 7}
RM_FIELDS = ["lbtrm.hdr.type", "lbtrm.hdr.ucast_port", "lbtrm.hdr.session_id", "lbtrm.data.sqn",
             "lbtrm.data.trail_sqn", "lbtrm.data.flags_fec_type.rx", "lbtrm.sm.sm_sqn", "lbtrm.sm.lead_sqn",
             "lbtrm.sm.trail_sqn", "lbtrm.nak.list.nak", "lbtrm.ncf.trail_sqn", "lbtrm.ncf.reason",
             "lbtrm.ncf.list.ncf"]
RU_FIELDS = ["lbtru.hdr.type", "lbtru.data.sqn", "lbtru.data.trail", "lbtru.hdr.flags.rx", "lbtru.sm.sqn",
             "lbtru.sm.lead", "lbtru.sm.trail", "lbtru.hdr.flags.syn", "lbtru.nak.list.nak", "lbtru.ncf.trail",
             "lbtru.ncf.reason", "lbtru.ncf.list.ncf", "lbtru.ack.sqn", "lbtru.opt_sid.session_id",
             "lbtru.opt_cid.client_id", "lbtru.hdr.request", "lbtru.hdr.reason"]
LBMC_FIELDS = ["lbmc.tidx", "lbmc.sqn", "lbmc.msglen", "lbmc.tcp_sid.sid"]


def decode_capture(path) -> tuple[TransportDecoder, list]:
    dec = TransportDecoder()
    records = []
    for item in read_packets(path):
        records += dec.feed(item)
    return dec, records


def _port(session: str) -> int:
    return int(session.split(":")[2])


def our_fields(records) -> dict[int, dict[str, list]]:
    """Our records as tshark's fields, per frame (the fields named above)."""
    out: dict[int, dict[str, list]] = {}
    for r in records:
        f = out.setdefault(r.frame, {})

        def add(name, *values, f=f):
            f.setdefault(name, []).extend(values)

        if isinstance(r, MessageRecord):
            if r.kind in ("MESSAGE", "RETRANS", "PRORX"):
                add("lbmc.tidx", r.tidx)
                add("lbmc.sqn", r.sqn)
            add("lbmc.msglen", r.msglen)
            continue
        if r.transport == "LBTRM":
            add("lbtrm.hdr.type", RM_TYPES[r.kind])
            add("lbtrm.hdr.ucast_port", _port(r.session))
            add("lbtrm.hdr.session_id", r.session_id)
            if r.kind == "DATA":
                add("lbtrm.data.sqn", r.sqn)
                add("lbtrm.data.trail_sqn", r.trail_sqn)
                add("lbtrm.data.flags_fec_type.rx", int(r.retransmission))
            elif r.kind == "SM":
                add("lbtrm.sm.sm_sqn", r.sqn)
                add("lbtrm.sm.lead_sqn", r.lead_sqn)
                add("lbtrm.sm.trail_sqn", r.trail_sqn)
            elif r.kind == "NAK":
                add("lbtrm.nak.list.nak", *r.sqns)
            elif r.kind == "NCF":
                add("lbtrm.ncf.trail_sqn", r.trail_sqn)
                add("lbtrm.ncf.reason", r.reason)
                add("lbtrm.ncf.list.ncf", *r.sqns)
        elif r.transport == "LBTRU":
            add("lbtru.hdr.type", RU_TYPES[r.kind])
            if r.session_id >= 0:
                add("lbtru.opt_sid.session_id", r.session_id)
            if r.client_id >= 0:
                add("lbtru.opt_cid.client_id", r.client_id)
            if r.kind == "DATA":
                add("lbtru.data.sqn", r.sqn)
                add("lbtru.data.trail", r.trail_sqn)
                add("lbtru.hdr.flags.rx", int(r.retransmission))
            elif r.kind == "SM":
                add("lbtru.sm.sqn", r.sqn)
                add("lbtru.sm.lead", r.lead_sqn)
                add("lbtru.sm.trail", r.trail_sqn)
                add("lbtru.hdr.flags.syn", int(bool(r.flags & RU.FLAG_SYN)))
            elif r.kind == "NAK":
                add("lbtru.nak.list.nak", *r.sqns)
            elif r.kind == "NCF":
                add("lbtru.ncf.trail", r.trail_sqn)
                add("lbtru.ncf.reason", r.reason)
                add("lbtru.ncf.list.ncf", *r.sqns)
            elif r.kind == "ACK":
                add("lbtru.ack.sqn", r.sqn)
            elif r.kind == "CREQ":
                add("lbtru.hdr.request", r.flags)
            elif r.kind == "RST":
                add("lbtru.hdr.reason", r.flags)
    return {k: v for k, v in out.items() if v}


def judge(path, records, decode_as, fields) -> None:
    """Every field of every frame, ours against tshark's."""
    theirs = tshark_field_rows(path, decode_as, fields)
    ours = our_fields(records)
    fields_set = set(fields)
    bad = []
    for frame in sorted(set(theirs) | set(ours)):
        t = {k: v for k, v in theirs.get(frame, {}).items() if k in fields_set}
        o = {k: v for k, v in ours.get(frame, {}).items() if k in fields_set}
        if t != o:
            bad.append(f"frame {frame}: tshark {t} ours {o}")
    assert not bad, "\n".join(bad[:20]) + f"\n({len(bad)} frames differ)"


# ------------------------------------------------------------------ generated traffic


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    path = tmp_path_factory.mktemp("gen") / "transport.pcap"
    write_transport_capture(path)
    dec, records = decode_capture(path)
    return path, dec, records


def test_generated_every_field_as_tshark_reads_it(generated):
    path, _, records = generated
    judge(path, records, GEN_DECODE_AS, RM_FIELDS + RU_FIELDS)
    # LBMC inside LBT-RM, LBT-RU and LBT-TCP
    judge(path, [r for r in records if isinstance(r, MessageRecord)], GEN_DECODE_AS,
          ["lbmc.tidx", "lbmc.sqn", "lbmc.msglen"])


def test_generated_sessions_found_without_decode_as(generated):
    _, dec, _ = generated
    rows = {r.source: r for r in session_rows(dec.state)}
    ip, port, sid, grp, dport = GEN_RM
    assert set(rows) == {
        source_string("LBTRM", ip, port, sid, grp, dport), "LBTRM:10.0.0.3:14391:deadbeef:239.2.2.3:14401",
        "LBTRU:10.0.0.1:14380:0a0b0c0d", "TCP:10.0.0.1:14371:11223344"}
    rm = rows["LBTRM:10.0.0.1:14390:01020304:239.2.2.2:14400"]
    assert rm.from_tir and rm.topics == ("alpha", "beta") and rm.source_contexts == ("10.0.0.1:40000",)
    assert "ctx:10.0.0.2:40001" in rm.receivers and "10.0.0.2:45000" in rm.receivers
    no_tir = rows[source_string("LBTRM", *GEN_RM_NO_TIR)]
    assert not no_tir.from_tir and no_tir.originals == 5 and no_tir.receivers == ("10.0.0.4:45001",)
    assert dict(rows["LBTRU:10.0.0.1:14380:0a0b0c0d"].control) == {"ACK": 1, "CREQ": 1, "RST": 1, "SYN": 1}
    tcp = rows["TCP:10.0.0.1:14371:11223344"]
    assert tcp.topics == ("tcp.topic",) and tcp.receivers == ("10.0.0.6:45200",) and tcp.lbmc_messages == 4
    assert not dec.state.errors


def _tshark_session_counts(path, decode_as, session_field, port_field, rx_field, ncf_field, nak_field,
                           type_field, proto) -> dict[tuple[int, int], Counter]:
    """Per (session id, port): originals, retransmissions, NAK packets and
    entries, NCFs by reason and SMs, as tshark counts them (no ICMP quotes)."""
    rows = tshark_field_rows(path, decode_as, [type_field, session_field, port_field, rx_field, ncf_field,
                                               nak_field], f"{proto} && !icmp")
    out: dict[tuple[int, int], Counter] = {}
    for f in rows.values():
        key = (f.get(session_field, [None])[0], f.get(port_field, [None])[0])
        c = out.setdefault(key, Counter())
        t = f[type_field][0]
        if t == 0:
            c["retransmissions" if f[rx_field][0] else "originals"] += 1
        elif t == 2:
            c["session_messages"] += 1
        elif t == 3:
            c["nak_packets"] += 1
            c["nak_entries"] += len(f.get(nak_field, []))
        elif t == 4:
            c[f"ncf_{f[ncf_field][0]}"] += 1
    return out


def _our_counts(row) -> Counter:
    c = Counter(originals=row.originals, retransmissions=row.retransmissions, session_messages=row.session_messages,
                nak_packets=row.nak_packets, nak_entries=row.nak_entries, ncf_0=row.ncf_no_retry,
                ncf_1=row.ncf_ignored, ncf_2=row.ncf_rx_delay, ncf_3=row.ncf_shed)
    return +c


def test_generated_counts_equal_tshark(generated):
    path, dec, _ = generated
    rows = session_rows(dec.state)
    rm = _tshark_session_counts(path, GEN_DECODE_AS, "lbtrm.hdr.session_id", "lbtrm.hdr.ucast_port",
                                "lbtrm.data.flags_fec_type.rx", "lbtrm.ncf.reason", "lbtrm.nak.list.nak",
                                "lbtrm.hdr.type", "lbtrm")
    assert {(r.session_id, r.port): _our_counts(r) for r in rows if r.transport == "LBTRM"} == rm
    ru = _tshark_session_counts(path, GEN_DECODE_AS, "lbtru.opt_sid.session_id", "udp.srcport",
                                "lbtru.hdr.flags.rx", "lbtru.ncf.reason", "lbtru.nak.list.nak",
                                "lbtru.hdr.type", "lbtru")
    theirs = Counter()
    for c in ru.values():
        theirs.update(c)
    (ours,) = [_our_counts(r) for r in rows if r.transport == "LBTRU"]
    assert ours == +theirs
    icmp = tshark_field_rows(path, GEN_DECODE_AS, ["lbtrm.hdr.session_id"], "icmp && lbtrm")
    assert sum(r.icmp_errors for r in rows) == len(icmp) == 1


def test_generated_receivers_and_topics(generated):
    _, dec, _ = generated
    recv = {(r.session, r.receiver): r for r in receiver_rows(dec.state)}
    r = recv[("LBTRM:10.0.0.1:14390:01020304", "10.0.0.2:45000")]
    # NAKed 5, 6 then 6, 7, 8; 5, 6 and 8 retransmitted after; 7 never
    assert (r.nak_packets, r.nak_entries, r.naked_sqns, r.recovered) == (2, 5, 4, 3)
    assert r.outstanding == (7,) and r.loss_estimate == pytest.approx(4 / 20)
    assert r.recovery_max == pytest.approx(0.08, abs=1e-6)  # NAK of 6 (frame 23) to its retransmission (31)
    assert 0.0 < r.recovery_p50 <= r.recovery_max
    ru = recv[("LBTRU:10.0.0.1:14380:0a0b0c0d", "10.0.0.5:45100")]
    assert ru.kind == "lbtru" and ru.outstanding == (4,) and ru.resets == 1
    topics = {(t.session, t.tidx): (t.topic, t.messages, t.rx_messages) for t in topic_rows(dec.state)}
    assert topics[("LBTRM:10.0.0.1:14390:01020304", 1)] == ("alpha", 10, 2)
    assert topics[("LBTRM:10.0.0.1:14390:01020304", 2)] == ("beta", 10, 1)
    assert topics[("LBTRM:10.0.0.3:14391:deadbeef", 42)] == ("", 5, 0)
    assert topics[("TCP:10.0.0.1:14371:11223344", 9)] == ("tcp.topic", 4, 0)


def test_records_name_topics_once_the_tir_is_known(generated):
    _, _, records = generated
    msgs = [r for r in records if isinstance(r, MessageRecord) and r.session.startswith("LBTRM:10.0.0.1")]
    assert {r.topic for r in msgs} == {"alpha", "beta"}
    assert all(r.topic == ("alpha" if r.tidx == 1 else "beta") for r in msgs)


# ------------------------------------------------------------------ the real capture


@pytest.fixture(scope="module")
def real():
    path = real_capture()
    dec, records = decode_capture(path)
    return path, dec, records


def test_real_capture_every_field_as_tshark_reads_it(real):
    path, _, records = real
    judge(path, records, REAL_DECODE_AS, RM_FIELDS + ["lbmc.tidx", "lbmc.sqn", "lbmc.msglen"])


def test_real_capture_counts_equal_tshark_with_decode_as(real):
    path, dec, _ = real
    rows = session_rows(dec.state)
    theirs = _tshark_session_counts(path, REAL_DECODE_AS, "lbtrm.hdr.session_id", "lbtrm.hdr.ucast_port",
                                    "lbtrm.data.flags_fec_type.rx", "lbtrm.ncf.reason", "lbtrm.nak.list.nak",
                                    "lbtrm.hdr.type", "lbtrm")
    ours = {(r.session_id, r.port): _our_counts(r) for r in rows}
    assert ours == theirs
    assert len(rows) == 2 and all(r.from_tir and r.group == "239.101.3.10" and r.dport == 14400 for r in rows)
    assert {r.source for r in rows} == {"LBTRM:10.29.4.121:12090:f9d74f3e:239.101.3.10:14400",
                                        "LBTRM:10.29.4.121:12091:a7f10561:239.101.3.10:14400"}
    icmp = tshark_field_rows(path, REAL_DECODE_AS, ["lbtrm.hdr.session_id"], "icmp && lbtrm")
    assert Counter(f["lbtrm.hdr.session_id"][0] for f in icmp.values()) == Counter(
        {r.session_id: r.icmp_errors for r in rows if r.icmp_errors})
    tidx = tshark_field_rows(path, REAL_DECODE_AS, ["lbtrm.hdr.session_id", "lbmc.tidx"], "lbmc && !icmp")
    per_topic = Counter()
    for f in tidx.values():
        for t in f["lbmc.tidx"]:
            per_topic[(f["lbtrm.hdr.session_id"][0], t)] += 1
    sid = {r.session: r.session_id for r in rows}
    assert {(sid[t.session], t.tidx): t.messages + t.rx_messages for t in topic_rows(dec.state)} == per_topic
    assert not dec.state.errors and not dec.state.overflow


def test_real_capture_topics_receivers_contexts(real):
    _, dec, _ = real
    rows = {r.port: r for r in session_rows(dec.state)}
    assert rows[12090].topics == ("29west.example.multi.0",)
    assert rows[12091].topics == ("29west.example.multi.0", "29west.example.multi.1")
    for r in rows.values():
        assert r.receivers == ("10.29.4.101:45241", "ctx:10.29.4.101:35101", "ctx:10.29.4.101:54247")
    recv = {r.session: r for r in receiver_rows(dec.state)}
    assert all(r.kind == "nak" and r.recovered > 0 and r.recovery_max >= r.recovery_p50 > 0
               for r in recv.values())


@pytest.mark.parametrize("parts", [2, 3, 7])
def test_partitions_merge_to_the_single_pass_tables(real, parts):
    path, dec, _ = real
    items = list(read_packets(path))
    lbmr = [i for i in items if getattr(i, "dport", None) == 12965]
    step = len(items) // parts + 1
    merged = SessionsState()
    for k in range(parts):
        part = TransportDecoder()
        for i in lbmr:  # every partition learns the capture's TIRs first
            part.feed(i)
        for i in items[k * step:(k + 1) * step]:
            if getattr(i, "dport", None) != 12965:
                part.feed(i)
        merged.merge(part.state)
    assert session_rows(merged) == session_rows(dec.state)
    assert topic_rows(merged) == topic_rows(dec.state)
    assert receiver_rows(merged) == receiver_rows(dec.state)


# ------------------------------------------------------------------ bad input, bounds


def _raw_capture(path: Path, frames: list[bytes]) -> Path:
    with PcapWriter(path, linktype=LINKTYPE_RAW) as w:
        for i, f in enumerate(frames):
            w.write_frame(1_700_000_000 + i / 1000, f)
    return path


def test_bad_input_is_counted_by_reason(tmp_path):
    import lbmr_proto as L
    ip, nport, sid, grp, dport = GEN_RM
    src, rcv, to_src = (ip, 50000), ("10.0.0.2", 45000), (ip, nport)
    tir = L.encode(L.Packet(0, tirs=[L.TIR("alpha", L.LbtrmTransport(ip, grp, sid, dport, nport), 0, 1)]))
    good = RM.encode_data(nport, sid, 1, 0, C.data_message(1, 0, b"x"))
    frames = [
        udp_packet(("10.0.0.1", 40000), ("239.1.1.1", 12965), tir),
        udp_packet(src, (grp, dport), good[:15]),  # truncated DATA header
        udp_packet(rcv, to_src, RM.encode_nak(nport, sid, [1, 2, 3])[:-4]),  # NAK list shorter than announced
        udp_packet(src, (grp, dport), good[:-3]),  # LBMC message cut short
        udp_packet(src, (grp, dport), b"\x10" + good[1:]),  # version 1
        udp_packet(rcv, to_src, RM.encode_nak(nport, sid, [4, 4])),  # the same sqn twice
        udp_packet(src, (grp, dport), good),
    ]
    dec, records = decode_capture(_raw_capture(tmp_path / "bad.pcap", frames))
    assert dec.state.errors == Counter(lbtrm_truncated=1, lbtrm_nak_list=1, lbmc_malformed=1,
                                       lbtrm_bad_header=1, nak_duplicate_sqns=1)
    errs = [r for r in records if r.error]
    assert [r.frame for r in errs] == [2, 3, 4, 5] and all(r.kind == "ERROR" for r in errs)
    (row,) = session_rows(dec.state)
    assert row.originals == 2 and row.nak_packets == 1  # the cut LBMC message's datagram still counts


def test_tcp_stream_that_is_not_lbmc(tmp_path):
    import lbmr_proto as L
    t_src, rcv = ("10.0.0.1", 14371), ("10.0.0.6", 45200)
    tir = L.encode(L.Packet(0, tirs=[L.TIR("t", L.TcpSessionTransport(t_src[0], 7, t_src[1]), 0, 9)]))
    frames = [udp_packet(("10.0.0.1", 40000), ("239.1.1.1", 12965), tir),
              tcp_segment(rcv, t_src, 100, 0, 0x02), tcp_segment(t_src, rcv, 900, 101, 0x12),
              tcp_segment(t_src, rcv, 901, 101, 0x18, b"GET / HTTP/1.1\r\n\r\n" * 4),
              tcp_segment(t_src, rcv, 901 + 72, 101, 0x18, C.data_message(9, 0, b"ok"))]
    dec, records = decode_capture(_raw_capture(tmp_path / "http.pcap", frames))
    assert dec.state.errors["tcp_not_lbmc"] == 1
    # after the junk, the decoder hunts for a boundary and finds the next whole message
    assert [(r.kind, r.tidx) for r in records if isinstance(r, MessageRecord)] == [("MESSAGE", 9)]


def test_tcp_without_tir_found_by_its_tcp_sid_and_split_messages(tmp_path):
    t_src, rcv, sid = ("10.9.9.9", 30000), ("10.9.9.8", 45200), 0xABCDEF01
    stream = (C.encode(C.Message(C.CONTROL, headers=(C.TcpSidHeader(0, sid),)))
              + b"".join(C.data_message(3, q, b"p" * q) for q in range(6)))
    frames = [tcp_segment(rcv, t_src, 100, 0, 0x02), tcp_segment(t_src, rcv, 900, 101, 0x12)]
    cuts = [0, 5, 13, 14, 40, 41, 77, len(stream)]
    segs = [(901 + a, stream[a:b]) for a, b in pairwise(cuts)]
    segs[2], segs[3] = segs[3], segs[2]  # out of order
    segs.insert(5, segs[4])  # a retransmission
    frames += [tcp_segment(t_src, rcv, s, 101, 0x18, d) for s, d in segs]
    dec, records = decode_capture(_raw_capture(tmp_path / "tcp.pcap", frames))
    msgs = [r for r in records if isinstance(r, MessageRecord)]
    assert [(m.kind, m.sqn) for m in msgs] == [("CONTROL", 0)] + [("MESSAGE", q) for q in range(6)]
    assert msgs[0].headers == ("TcpSid",)
    (row,) = session_rows(dec.state)
    assert row.source == "TCP:10.9.9.9:30000:abcdef01" and not row.from_tir and not dec.state.errors


def test_icmp_quoting_a_cut_datagram_still_names_the_session(tmp_path):
    ip, nport, sid, grp, dport = GEN_RM
    nak = udp_packet(("10.0.0.2", 45000), (ip, nport), RM.encode_nak(nport, sid, list(range(50))))
    quoted = nak[:20 + 8 + 8]  # the quote keeps the IP and UDP headers and 8 bytes: LBT-RM's header
    dec, records = decode_capture(_raw_capture(tmp_path / "icmp.pcap", [
        udp_packet((ip, 50000), (grp, dport), RM.encode_data(nport, sid, 0, 0, C.data_message(1, 0, b""))),
        icmp_unreachable(ip, quoted)]))
    (rec,) = [r for r in records if getattr(r, "icmp", False)]
    assert rec.kind == "NAK" and rec.session == "LBTRM:10.0.0.1:14390:01020304"
    assert session_rows(dec.state)[0].icmp_errors == 1


def test_receivers_per_session_are_bounded(tmp_path):
    ip, nport, sid, grp, dport = GEN_RM
    frames = [udp_packet((ip, 50000), (grp, dport), RM.encode_data(nport, sid, 0, 0, C.data_message(1, 0, b"")))]
    frames += [udp_packet((f"10.1.{k // 250}.{k % 250 + 1}", 45000), (ip, nport), RM.encode_nak(nport, sid, [0]))
               for k in range(MAX_RECEIVERS + 20)]
    dec, _ = decode_capture(_raw_capture(tmp_path / "many.pcap", frames))
    (row,) = session_rows(dec.state)
    assert row.nak_packets == MAX_RECEIVERS + 20 and len(row.receivers) == MAX_RECEIVERS
    assert dec.state.overflow["receivers"] == 20


def test_unrelated_udp_is_not_a_session(tmp_path):
    frames = [udp_packet(("10.0.0.1", 53), ("10.0.0.2", 5353), bytes(40)),
              udp_packet(("10.0.0.1", 1234), ("239.9.9.9", 1234), b"\x00\x00" + bytes(30)),
              udp_packet(("10.0.0.1", 1234), ("10.0.0.2", 1234), b"\x03\x00\x00\x01" + bytes(12))]
    dec, records = decode_capture(_raw_capture(tmp_path / "other.pcap", frames))
    assert records == [] and not dec.state.sessions and not dec.state.errors


_ITEM = st.one_of(
    st.tuples(st.just("rm"), st.integers(0, 4), st.binary(max_size=60)),
    st.tuples(st.just("ru"), st.integers(0, 7), st.binary(max_size=60)),
    st.tuples(st.just("tcp"), st.integers(0, 0xFF), st.binary(max_size=60)),
    st.tuples(st.just("icmp"), st.integers(0, 60), st.binary(max_size=8)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_ITEM, max_size=30), st.randoms(use_true_random=False))
def test_any_transport_traffic_never_crashes(tmp_path, items, rnd):
    """Valid datagrams of every kind, cut and spliced with junk, in any order."""
    ip, nport, sid, grp, dport = GEN_RM
    good_rm = [RM.encode_data(nport, sid, 1, 0, C.data_message(1, 0, b"x")), RM.encode_sm(nport, sid, 0, 1, 0),
               RM.encode_nak(nport, sid, [1, 2]), RM.encode_ncf(nport, sid, 0, [1], reason=1)]
    good_ru = [RU.encode_data(1, 0, C.data_message(7, 0, b"r"), session_id=5), RU.encode_sm(0, 1, 0, syn=True),
               RU.encode_nak([1], session_id=5), RU.encode_ncf(0, [1], session_id=5), RU.encode_ack(1),
               RU.encode_creq(session_id=5), RU.encode_rst(), RU.encode_data(2, 0, b"zz", session_id=5)]
    frames = []
    seq = 1000
    for kind, k, junk in items:
        cut = rnd.randint(0, 80)
        if kind == "rm":
            d = good_rm[k % 4][:cut] + junk
            to = (ip, nport) if k % 4 == 2 else (grp, dport)
            frames.append(udp_packet(("10.0.0.2", 45000) if k % 4 == 2 else (ip, 50000), to, d))
        elif kind == "ru":
            frames.append(udp_packet(("10.0.0.1", 14380), ("10.0.0.5", 45100), good_ru[k][:cut] + junk))
        elif kind == "tcp":
            data = (C.data_message(9, 0, b"t") + junk)[:cut]
            frames.append(tcp_segment(("10.0.0.1", 14371), ("10.0.0.6", 45200), seq, 0, k, data))
            seq += rnd.choice([len(data), 0, 7, -3])
        else:
            nak = udp_packet(("10.0.0.2", 45000), (ip, nport), RM.encode_nak(nport, sid, [1, 2, 3]))
            frames.append(icmp_unreachable(ip, nak[:20 + 8 + k] + junk))
    dec, records = decode_capture(_raw_capture(tmp_path / "p.pcap", frames))
    assert all(isinstance(r, (TransportRecord, MessageRecord)) for r in records)
    session_rows(dec.state), receiver_rows(dec.state), topic_rows(dec.state)
    assert sum(1 for r in records if r.error) <= sum(dec.state.errors.values())


def test_tcp_segments_and_icmp_errors_are_read(tmp_path):
    frames = [tcp_segment(("1.2.3.4", 5), ("5.6.7.8", 9), 77, 88, 0x18, b"abc"),
              icmp_unreachable("5.6.7.8", udp_packet(("1.2.3.4", 10), ("5.6.7.8", 11), b"hello"))]
    a, b = list(read_packets(_raw_capture(tmp_path / "x.pcap", frames)))
    assert isinstance(a, TcpSegment) and (a.src, a.sport, a.dst, a.dport, a.seq, a.ack, a.flags, a.payload) == (
        "1.2.3.4", 5, "5.6.7.8", 9, 77, 88, 0x18, b"abc")
    assert (b.sender, b.receiver, b.type, b.code, b.src, b.sport, b.dst, b.dport, b.payload, b.quoted_len) == (
        "5.6.7.8", "1.2.3.4", 3, 3, "1.2.3.4", 10, "5.6.7.8", 11, b"hello", 5)
    assert struct.unpack("!H", frames[0][2:4])[0] == len(frames[0])


def test_a_syn_flood_follows_a_bounded_number_of_connections(tmp_path):
    frames = [tcp_segment((f"10.2.{k // 250}.{k % 250 + 1}", 40000), ("10.0.0.1", 80), 7, 0, 0x02)
              for k in range(100)]
    dec = TransportDecoder(max_tcp_flows=50)
    for item in read_packets(_raw_capture(tmp_path / "syn.pcap", frames)):
        dec.feed(item)
    assert dec.tcp_directions == 50 and dec.state.overflow["tcp_flows"] == 150


def test_a_multicast_nak_belongs_to_the_source_of_its_group(tmp_path):
    ip, nport, sid, grp, dport = GEN_RM
    frames = [udp_packet((ip, 50000), (grp, dport), RM.encode_data(nport, sid, 0, 0, C.data_message(1, 0, b""))),
              udp_packet(("10.0.0.2", 45000), (grp, dport), RM.encode_nak(nport, sid, [0])),
              udp_packet((ip, 50000), (grp, dport), RM.encode_sm(nport, sid, 0, 9, 0))]
    dec, _ = decode_capture(_raw_capture(tmp_path / "mcnak.pcap", frames))
    (row,) = session_rows(dec.state)
    assert row.session == "LBTRM:10.0.0.1:14390:01020304" and row.nak_packets == 1
    assert row.receivers == ("10.0.0.2:45000",) and row.lead_sqn == 9


def test_a_tcp_capture_that_starts_mid_message_resynchronises(tmp_path):
    import lbmr_proto as L
    t_src, rcv = ("10.0.0.1", 14371), ("10.0.0.6", 45200)
    tir = L.encode(L.Packet(0, tirs=[L.TIR("t", L.TcpSessionTransport(t_src[0], 7, t_src[1]), 0, 9)]))
    stream = b"".join(C.data_message(9, q, b"payload-%d" % q) for q in range(8))
    start = 5  # the capture begins inside the first message
    frames = [udp_packet(("10.0.0.1", 40000), ("239.1.1.1", 12965), tir)]
    frames += [tcp_segment(t_src, rcv, 1000 + a, 1, 0x18, stream[a:a + 30]) for a in range(start, len(stream), 30)]
    dec, records = decode_capture(_raw_capture(tmp_path / "mid.pcap", frames))
    sqns = [r.sqn for r in records if isinstance(r, MessageRecord)]
    assert sqns == list(range(1, 8)) and not dec.state.errors


def test_junk_on_a_tcp_session_is_counted_and_bounded(tmp_path):
    import random

    import lbmr_proto as L
    t_src, rcv = ("10.0.0.1", 14371), ("10.0.0.6", 45200)
    tir = L.encode(L.Packet(0, tirs=[L.TIR("t", L.TcpSessionTransport(t_src[0], 7, t_src[1]), 0, 9)]))
    rnd = random.Random(7)
    junk = bytes(rnd.choice(b"\x10\x20\x33\xff") for _ in range(200_000))  # no version-0 byte
    frames = [udp_packet(("10.0.0.1", 40000), ("239.1.1.1", 12965), tir),
              tcp_segment(rcv, t_src, 0, 0, 0x02), tcp_segment(t_src, rcv, 99, 1, 0x12)]
    frames += [tcp_segment(t_src, rcv, 100 + a, 1, 0x18, junk[a:a + 1400]) for a in range(0, len(junk), 1400)]
    dec, records = decode_capture(_raw_capture(tmp_path / "junk.pcap", frames))
    assert not [r for r in records if isinstance(r, MessageRecord)]
    assert dec.state.errors["tcp_not_lbmc"] == 1 and dec.state.errors["tcp_no_boundary"] >= 1


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_a_damaged_capture_never_crashes_the_decoder(data):
    """Bytes of the generated capture flipped, cut or repeated: capture errors
    are reported (on_error), the decoder never raises."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.pcap"
        write_transport_capture(path)
        raw = bytearray(path.read_bytes())
    for _ in range(data.draw(st.integers(1, 20))):
        i = data.draw(st.integers(24, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        raw = raw[:data.draw(st.integers(24, len(raw)))]
    errors = []
    dec = TransportDecoder()
    for item in read_packets(bytes(raw), on_error=errors.append):
        for r in dec.feed(item):
            assert isinstance(r, (TransportRecord, MessageRecord))
    session_rows(dec.state), receiver_rows(dec.state), topic_rows(dec.state)
    assert len(errors) <= 1


# ------------------------------------------------------------------ LBT-RU TIRs without session id, ICMP direction

RU_KEY = "LBTRU:10.3.0.1:14380:5eed0001"


@pytest.mark.parametrize("tir_first", [True, False])
def test_a_tir_without_session_id_names_the_session_seen_at_its_address(tmp_path, tir_first):
    path = tmp_path / "ru.pcap"
    write_unnamed_lbtru_capture(path, tir_first=tir_first)
    dec, records = decode_capture(path)
    # the first receiver's CREQ (no session id, none seen yet) went to the TIR's id-0 session, the second's to
    # the one the source's SYN named since; folded into one row (without the TIR first, the first CREQ is not
    # known to be LBT-RU: no session-id option, no TIR for its address yet)
    assert sorted(dec.state.sessions) == ["LBTRU:10.3.0.1:14380:00000000", RU_KEY]
    creqs = [r for r in records if isinstance(r, TransportRecord) and r.kind == "CREQ"]
    assert [r.session for r in creqs] == ["LBTRU:10.3.0.1:14380:00000000"] * tir_first + [RU_KEY]
    (row,) = session_rows(dec.state)
    assert row.session == RU_KEY and row.from_tir and row.topics == ("ru.plain", "ru.other")
    assert dict(row.control) == {"CREQ": 1 + tir_first, "SYN": 2, "ACK": 1}
    assert row.source_contexts == ("{}:{}".format(*UNNAMED_RU_CTX),)
    assert (row.originals, row.retransmissions, row.nak_packets, row.lbmc_messages) == (16, 1, 1, 17)
    assert [(t.tidx, t.topic, t.messages, t.rx_messages) for t in topic_rows(dec.state)] == [
        (3, "ru.plain", 16, 1), (4, "ru.other", 0, 0)]
    # the ACK without session-id option belongs to the one session seen at the address
    (ack,) = [r for r in records if isinstance(r, TransportRecord) and r.kind == "ACK"]
    assert ack.session == RU_KEY and ack.session_id == -1 and dict(row.control)["ACK"] == 1
    if tir_first:  # messages name their topic once the TIR is known
        assert {r.topic for r in records if isinstance(r, MessageRecord)} == {"ru.plain"}
    # nothing left unadvertised: every receiver is one of the advertised session
    assert {r.session for r in receiver_rows(dec.state)} == {RU_KEY}


def test_a_tir_without_session_id_joins_alike_in_partitions(tmp_path):
    path = tmp_path / "ru.pcap"
    write_unnamed_lbtru_capture(path, tir_first=False, source_exits=True)
    items = list(read_packets(path))
    lbmr = [i for i in items if getattr(i, "dport", None) == 12965]
    single = TransportDecoder()  # one part: the TIRs learned first, as the analyzer's tasks do
    for i in lbmr + [i for i in items if getattr(i, "dport", None) != 12965]:
        single.feed(i)
    assert dict(session_rows(single.state)[0].control)["CREQ"] == 2
    for cut in (3, len(items) // 2, len(items) - 3):
        merged = SessionsState()
        for part_items in (items[:cut], items[cut:]):
            part = TransportDecoder()
            for i in lbmr:  # every partition learns the capture's TIRs first
                part.feed(i)
            for i in part_items:
                if getattr(i, "dport", None) != 12965:
                    part.feed(i)
            merged.merge(part.state)
        assert session_rows(merged) == session_rows(single.state)
        assert topic_rows(merged) == topic_rows(single.state)
        assert receiver_rows(merged) == receiver_rows(single.state)
        assert session_rows(merged)[0].from_tir and session_rows(merged)[0].topics == ("ru.plain", "ru.other")


def test_a_tir_without_session_id_and_datagrams_without_one_are_one_session(tmp_path):
    ip, port, _ = UNNAMED_RU
    import lbmr_proto as L
    tir = udp_packet(UNNAMED_RU_CTX, ("239.1.1.1", 12965),
                     L.encode(L.Packet(0, tirs=[L.TIR("t", L.LbtruTransport(ip, port), 0, 1)])))
    frames = [tir] + [udp_packet((ip, port), UNNAMED_RU_STAYS, RU.encode_data(q, 0, C.data_message(1, q, b"")))
                      for q in range(3)]
    dec, _ = decode_capture(_raw_capture(tmp_path / "plain.pcap", frames))
    (row,) = session_rows(dec.state)
    assert row.session == "LBTRU:10.3.0.1:14380:00000000" and row.from_tir and row.originals == 3
    assert row.topics == ("t",)


def test_a_tir_without_session_id_alone_is_still_a_session(tmp_path):
    path = tmp_path / "ru.pcap"
    write_unnamed_lbtru_capture(path)
    dec = TransportDecoder()
    for i in read_packets(path):
        if getattr(i, "dport", None) == 12965:
            dec.feed(i)
    (row,) = session_rows(dec.state)
    assert row.session == "LBTRU:10.3.0.1:14380:00000000" and row.from_tir and row.originals == 0
    assert row.topics == ("ru.plain", "ru.other")


@pytest.mark.parametrize("source_exits", [False, True])
def test_icmp_errors_quoting_the_sources_datagrams_say_a_receiver_is_gone(tmp_path, source_exits):
    path = tmp_path / "ru.pcap"
    write_unnamed_lbtru_capture(path, source_exits=source_exits)
    dec, records = decode_capture(path)
    (row,) = session_rows(dec.state)
    assert (row.icmp_errors, row.receiver_icmp_errors) == (int(source_exits), UNNAMED_RU_GONE)
    recv = {r.receiver: r for r in receiver_rows(dec.state)}
    stays, leaves = ("{}:{}".format(*a) for a in (UNNAMED_RU_STAYS, UNNAMED_RU_LEAVES))
    assert (recv[leaves].icmp_errors, recv[stays].icmp_errors) == (UNNAMED_RU_GONE, 0)
    quoted = [r for r in records if isinstance(r, TransportRecord) and r.icmp]
    assert Counter(r.kind for r in quoted) == Counter(DATA=UNNAMED_RU_GONE, **({"NAK": 1} if source_exits else {}))
    assert all(r.session == RU_KEY for r in quoted)
    # quoted datagrams are not the session's DATA or NAKs; tshark sees the same ICMP errors, by quoted type
    assert row.originals == 16 and row.nak_packets == 1
    theirs = tshark_field_rows(path, UNNAMED_RU_DECODE_AS, ["lbtru.hdr.type", "lbtru.opt_sid.session_id"],
                               "icmp && lbtru")
    by_type = Counter(f["lbtru.hdr.type"][0] for f in theirs.values())
    assert by_type == +Counter({RU_TYPES["DATA"]: row.receiver_icmp_errors, RU_TYPES["NAK"]: row.icmp_errors})
    assert {f["lbtru.opt_sid.session_id"][0] for f in theirs.values()} == {UNNAMED_RU[2]}
    theirs_data = tshark_field_rows(path, UNNAMED_RU_DECODE_AS, ["lbtru.data.sqn"],
                                    "lbtru.hdr.type == 0 && !icmp && lbtru.hdr.flags.rx == 0")
    assert len(theirs_data) == row.originals


def test_an_lbtrm_datagram_quoted_from_its_source_is_not_the_source_gone(tmp_path):
    ip, nport, sid, grp, dport = GEN_RM
    data = udp_packet((ip, 50000), (grp, dport), RM.encode_data(nport, sid, 0, 0, C.data_message(1, 0, b"")))
    nak = udp_packet(("10.0.0.2", 45000), (ip, nport), RM.encode_nak(nport, sid, [0]))
    dec, _ = decode_capture(_raw_capture(tmp_path / "rm.pcap", [
        data, icmp_unreachable("10.0.0.2", data), icmp_unreachable(ip, nak), icmp_unreachable(ip, nak)]))
    (row,) = session_rows(dec.state)
    assert (row.originals, row.nak_packets, row.icmp_errors, row.receiver_icmp_errors) == (1, 0, 2, 1)
