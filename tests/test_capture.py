"""Tests for lbmr_proto.capture: pcap/pcapng reading, reassembly, writing."""

from __future__ import annotations

import io
import random
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lbmr_proto import capture
from lbmr_proto.capture import (
    LINKTYPE_ETHERNET,
    LINKTYPE_IPV4,
    LINKTYPE_LINUX_SLL,
    LINKTYPE_LINUX_SLL2,
    LINKTYPE_LOOP,
    LINKTYPE_NULL,
    LINKTYPE_RAW,
    MAX_REASSEMBLY_BUFFERS,
    CaptureError,
    PcapngWriter,
    PcapWriter,
    Reassembler,
    UdpDatagram,
    read_frames,
    read_udp,
    udp_frames,
    udp_from_frame,
    write_udp_pcap,
)

REAL_CAPTURE = Path(__file__).resolve().parents[1].parent / "shared" / "captures" / "um614-multicast-tr.pcap"
T0 = 1_653_336_679.0


# ----------------------------------------------------------------- independent frame builders

def ip_checksum(hdr: bytes) -> int:
    s = sum(struct.unpack(f"!{len(hdr) // 2}H", hdr))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ipv4(src: str, dst: str, data: bytes, *, ident=0, frag=0, mf=False, proto=17, options=b"",
         total=None) -> bytes:
    """An IPv4 packet (``frag`` in bytes) built without the module under test."""
    hl = 20 + len(options)
    tl = hl + len(data) if total is None else total
    hdr = struct.pack("!BBHHHBBH4s4s", 0x40 | hl // 4, 0, tl, ident, (frag // 8) | (0x2000 if mf else 0),
                      64, proto, 0, bytes(map(int, src.split("."))), bytes(map(int, dst.split(".")))) + options
    hdr = hdr[:10] + struct.pack("!H", ip_checksum(hdr)) + hdr[12:]
    return hdr + data


def udp(sport: int, dport: int, payload: bytes) -> bytes:
    return struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload


def ether(ip: bytes, tags=(), *, ethertype=0x0800) -> bytes:
    hdr = bytes.fromhex("0100 5e65 0301 fcbd 6701 0203".replace(" ", ""))
    for tpid, vid in tags:
        hdr += struct.pack("!HH", tpid, vid)
    return hdr + struct.pack("!H", ethertype) + ip


def classic_pcap(records, *, order="<", nano=False, linktype=1) -> bytes:
    """records: (sec, frac, frame) -> classic pcap bytes in the given byte order."""
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    out = [struct.pack(order + "IHHiIII", magic, 2, 4, 0, 0, 65535, linktype)]
    for sec, frac, frame in records:
        out.append(struct.pack(order + "IIII", sec, frac, len(frame), len(frame)) + frame)
    return b"".join(out)


def ng_block(order: str, btype: int, body: bytes) -> bytes:
    body += bytes(-len(body) & 3)
    n = 12 + len(body)
    return struct.pack(order + "II", btype, n) + body + struct.pack(order + "I", n)


def sample(n: int, seed: int = 1, max_payload: int = 1400):
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        out.append((T0 + i * 0.001 + rnd.randrange(1000) * 1e-6,
                    f"10.{rnd.randrange(4)}.{rnd.randrange(256)}.{rnd.randrange(1, 255)}",
                    rnd.randrange(1024, 65536), f"239.101.3.{rnd.randrange(1, 4)}",
                    rnd.choice((12965, 15380, 40001)), rnd.randbytes(rnd.randrange(max_payload))))
    return out


def tshark_fields(path: Path, *fields: str, display_filter: str = "udp") -> list[list[str]]:
    cmd = ["tshark", "-r", str(path), "-T", "fields", "-Y", display_filter]
    for f in fields:
        cmd += ["-e", f]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60)
    return [line.split("\t") for line in res.stdout.splitlines() if line]


class Trickle(io.RawIOBase):
    """A file object whose reads return at most ``step`` bytes (exercises chunk refills)."""

    def __init__(self, data: bytes, step: int) -> None:
        self._b, self._step = io.BytesIO(data), step

    def readable(self) -> bool:
        return True

    def read(self, n=-1) -> bytes:
        return self._b.read(self._step if n < 0 else min(n, self._step))


def key(d: UdpDatagram):
    return (d.src, d.sport, d.dst, d.dport, d.payload)


# ----------------------------------------------------------------- round trips

def test_round_trip_pcap(tmp_path):
    data = sample(300)
    path = tmp_path / "rt.pcap"
    with PcapWriter(path) as w:
        for i, (ts, src, sport, dst, dport, payload) in enumerate(data):
            w.write_udp(ts, src, sport, dst, dport, payload, ip_id=i)
    got = list(read_udp(path))
    assert len(got) == len(data)
    offset = 24
    for i, (d, (ts, src, sport, dst, dport, payload)) in enumerate(zip(got, data, strict=True), 1):
        assert isinstance(d, UdpDatagram)
        assert abs(d.ts - ts) <= 1e-6
        assert (d.src, d.sport, d.dst, d.dport, d.payload) == (src, sport, dst, dport, payload)
        assert d.frame == i
        assert d.offset == offset
        offset += 16 + 14 + 20 + 8 + len(payload)
    assert offset == path.stat().st_size
    raw = path.read_bytes()
    assert list(read_udp(raw)) == got                     # bytes source
    with open(path, "rb") as f:
        assert list(read_udp(f)) == got                   # file object source
    assert list(read_udp(Trickle(raw, 7))) == got          # tiny reads
    only = list(read_udp(path, ports={12965}))
    assert only == [d for d in got if 12965 in (d.sport, d.dport)] and only


def test_write_udp_pcap_and_nanosecond_writer(tmp_path):
    data = [(1000.123456789, "1.2.3.4", 1, "5.6.7.8", 2, b"abc"), (1001.5, "1.2.3.4", 3, "5.6.7.8", 4, b"")]
    assert write_udp_pcap(tmp_path / "a.pcap", data) == 2
    with PcapWriter(tmp_path / "n.pcap", nanosecond=True) as w:
        for d in data:
            w.write_udp(*d)
    micro, nano = list(read_udp(tmp_path / "a.pcap")), list(read_udp(tmp_path / "n.pcap"))
    assert [key(d) for d in micro] == [key(d) for d in nano] == [(s, sp, d, dp, p) for _, s, sp, d, dp, p in data]
    assert micro[0].ts == pytest.approx(1000.123457, abs=1e-9)
    assert nano[0].ts == pytest.approx(1000.123456789, abs=1e-9)
    assert (tmp_path / "n.pcap").read_bytes()[:4] == bytes.fromhex("4d3cb2a1")


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("nano", [False, True])
def test_classic_byte_orders_by_hand(order, nano):
    frames = [ether(ipv4("10.0.0.1", "10.0.0.2", udp(1000 + i, 2000, bytes([i]) * (i * 7)))) for i in range(5)]
    frac = 123_456_789 if nano else 123_456
    blob = classic_pcap([(1000 + i, frac, f) for i, f in enumerate(frames)], order=order, nano=nano)
    got = list(read_udp(blob))
    assert [(d.sport, d.payload) for d in got] == [(1000 + i, bytes([i]) * (i * 7)) for i in range(5)]
    scale = 1e-9 if nano else 1e-6
    for i, d in enumerate(got):
        assert abs(d.ts - (1000 + i + frac * scale)) < 1e-9
    assert [d.offset for d in got] == [24 + sum(16 + len(f) for f in frames[:i]) for i in range(5)]
    assert [f.linktype for f in read_frames(blob)] == [1] * 5
    assert [f.data for f in read_frames(blob)] == frames


# ----------------------------------------------------------------- link types

@pytest.mark.parametrize("big_endian", [False, True])
def test_pcapng_two_interfaces_and_tsresol(tmp_path, big_endian):
    path = tmp_path / "two.pcapng"
    data = sample(40, seed=2)
    with PcapngWriter(path, LINKTYPE_ETHERNET, tsresol=9, big_endian=big_endian) as w:
        raw = w.add_interface(LINKTYPE_IPV4, tsresol=0x80 | 20)       # 2**-20 s
        for i, (ts, src, sport, dst, dport, payload) in enumerate(data):
            w.write_udp(ts, src, sport, dst, dport, payload, interface=i % 2 and raw)
    assert path.read_bytes()[8:12] == (b"\x1a\x2b\x3c\x4d" if big_endian else b"\x4d\x3c\x2b\x1a")
    got = list(read_udp(path))
    assert [key(d) for d in got] == [(s, sp, d, dp, p) for _, s, sp, d, dp, p in data]
    for i, (d, item) in enumerate(zip(got, data, strict=True)):
        assert abs(d.ts - item[0]) <= (1e-6 if i % 2 else 1e-8)
        assert d.frame == i + 1
    assert [f.linktype for f in read_frames(path)] == [1, 228] * 20
    # tshark agrees on interfaces, times and ports
    rows = tshark_fields(path, "frame.interface_id", "frame.time_epoch", "udp.srcport", "udp.dstport")
    assert [(int(r[0]), int(r[2]), int(r[3])) for r in rows] == [(i % 2, it[2], it[4]) for i, it in enumerate(data)]
    assert all(abs(float(r[1]) - d.ts) < 1e-6 for r, d in zip(rows, got, strict=True))


def test_pcapng_big_endian_sections_and_other_blocks(tmp_path):
    """Two sections (BE then LE), SPB, obsolete PB, unknown blocks, if_tsoffset."""
    ip1 = ipv4("192.168.1.1", "192.168.1.2", udp(5000, 6000, b"spb"))
    ip2 = ipv4("192.168.1.1", "192.168.1.2", udp(5001, 6000, b"obsolete"))
    be = ">"
    sec1 = (ng_block(be, 0x0A0D0D0A, struct.pack(be + "IHHq", 0x1A2B3C4D, 1, 0, -1))
            + ng_block(be, 1, struct.pack(be + "HHI", LINKTYPE_RAW, 0, 0)
                       + struct.pack(be + "HHq", 14, 8, 100) + struct.pack(be + "HH", 0, 0))   # if_tsoffset 100 s
            + ng_block(be, 4, b"\x00\x00\x00\x00")                                       # name resolution
            + ng_block(be, 3, struct.pack(be + "I", len(ip1)) + ip1)                      # simple packet
            + ng_block(be, 0x40000BAD, b"custom junk")
            + ng_block(be, 2, struct.pack(be + "HHIIII", 0, 0, 0, 5_000_000, len(ip2), len(ip2)) + ip2)
            + ng_block(be, 5, struct.pack(be + "III", 0, 0, 0)))                          # statistics
    le_path = tmp_path / "le.pcapng"
    with PcapngWriter(le_path, LINKTYPE_LINUX_SLL) as w:
        w.write_udp(T0, "10.1.1.1", 7, "10.1.1.2", 8, b"second section")
    blob = sec1 + le_path.read_bytes()
    got = list(read_udp(blob))
    # the custom block counts as a frame (as in Wireshark)
    assert [(d.sport, d.payload, d.frame) for d in got] == [
        (5000, b"spb", 1), (5001, b"obsolete", 3), (7, b"second section", 4)]
    assert got[0].ts == 100.0 and got[1].ts == pytest.approx(105.0)
    assert abs(got[2].ts - T0) < 1e-6
    assert got[1].offset == len(sec1) - 24 - len(ng_block(be, 2, struct.pack(be + "HHIIII", 0, 0, 0, 0, 0, 0) + ip2))
    assert got[2].offset > len(sec1)
    assert list(read_udp(Trickle(blob, 5))) == got
    frames = list(read_frames(blob))
    assert [(f.linktype, f.data) for f in frames[:2]] == [(LINKTYPE_RAW, ip1), (LINKTYPE_RAW, ip2)]
    (tmp_path / "mixed.pcapng").write_bytes(blob)
    rows = tshark_fields(tmp_path / "mixed.pcapng", "frame.number", "udp.srcport")
    assert [(int(a), int(b)) for a, b in rows] == [(d.frame, d.sport) for d in got]


@pytest.mark.parametrize("linktype", [LINKTYPE_LINUX_SLL, LINKTYPE_LINUX_SLL2, LINKTYPE_RAW, LINKTYPE_IPV4,
                                      LINKTYPE_NULL, LINKTYPE_LOOP, 12])
def test_other_link_types_match_ethernet(tmp_path, linktype):
    data = sample(30, seed=linktype)
    write_udp_pcap(tmp_path / "eth.pcap", data, mtu=600)
    write_udp_pcap(tmp_path / "lt.pcap", data, linktype=linktype, mtu=600)
    eth, other = list(read_udp(tmp_path / "eth.pcap")), list(read_udp(tmp_path / "lt.pcap"))
    assert len(eth) == 30
    assert [(key(d), d.ts, d.frame) for d in other] == [(key(d), d.ts, d.frame) for d in eth]


def test_sll_sll2_agree_with_tshark(tmp_path):
    for lt in (LINKTYPE_LINUX_SLL, LINKTYPE_LINUX_SLL2):
        path = tmp_path / f"{lt}.pcap"
        write_udp_pcap(path, sample(10, seed=lt), linktype=lt)
        rows = tshark_fields(path, "udp.srcport", "udp.dstport", "udp.length", "ip.src", "ip.dst")
        assert rows == [[str(d.sport), str(d.dport), str(8 + len(d.payload)), d.src, d.dst]
                        for d in read_udp(path)]


def test_vlan_tags_padding_and_options():
    ip = ipv4("10.9.8.7", "10.9.8.6", udp(4000, 5000, b"vlan"))
    frames = [
        ether(ip, [(0x8100, 100)]),
        ether(ip, [(0x88A8, 200), (0x8100, 100)]),
        ether(ip, [(0x88A8, 1), (0x8100, 2), (0x8100, 3)]),
        ether(ipv4("10.9.8.7", "10.9.8.6", udp(4000, 5000, b"x"))) + bytes(13) + b"FCS!",   # padding + FCS
        ether(ipv4("10.9.8.7", "10.9.8.6", udp(4000, 5000, b"opts"), options=b"\x01\x01\x01\x00")),
        ether(ip, [(0x8100, 5)], ethertype=0x86DD),                                       # not IPv4
        ether(b"\x00" * 28, ethertype=0x0806),                                          # ARP
        ether(ipv4("10.9.8.7", "10.9.8.6", b"\x00" * 20, proto=6)),                     # TCP
        ether(ip)[:30],                                                                 # cut IP header
        ether(ip, [(0x8100, 100)])[:15],                                                # cut inside the tag
    ]
    got = list(read_udp(classic_pcap([(1, 0, f) for f in frames])))
    assert [(d.frame, d.payload, d.src, d.dport) for d in got] == [
        (1, b"vlan", "10.9.8.7", 5000), (2, b"vlan", "10.9.8.7", 5000), (3, b"vlan", "10.9.8.7", 5000),
        (4, b"x", "10.9.8.7", 5000), (5, b"opts", "10.9.8.7", 5000)]


def test_udp_length_field_handling():
    def frame(payload, ulen, total=None):
        u = struct.pack("!HHHH", 1, 2, ulen, 0) + payload
        return ether(ipv4("1.1.1.1", "2.2.2.2", u, total=total))
    frames = [
        frame(b"abcdef", 8 + 3),                    # shorter UDP length: trim to 3
        frame(b"abcdef", 8 + 60),                   # longer than the packet: use what is there
        frame(b"abcdef", 4),                        # impossible: use what is there
        frame(b"abcdef", 14, total=20 + 8 + 2),     # IP total length trims
        frame(b"abcdef", 14, total=10),             # bad IP total length: skipped
        ether(ipv4("1.1.1.1", "2.2.2.2", b"\x00\x01\x00"))[:40],   # UDP header cut off
    ]
    got = list(read_udp(classic_pcap([(1, 0, f) for f in frames])))
    assert [d.payload for d in got] == [b"abc", b"abcdef", b"abcdef", b"ab"]
    # snaplen-truncated frame: payload is what was captured
    cut = frame(b"abcdefgh", 16)[:-3]
    assert [d.payload for d in read_udp(classic_pcap([(1, 0, cut)]))] == [b"abcde"]


def test_udp_from_frame_sans_io():
    frames = udp_frames(LINKTYPE_ETHERNET, "1.2.3.4", 10, "5.6.7.8", 20, b"q" * 3000, ip_id=9, mtu=1000)
    assert len(frames) == 4
    assert udp_from_frame(0.0, 1, frames[0]) is None            # fragment without a reassembler
    r = Reassembler()
    out = [udp_from_frame(0.0, 1, f, reassembler=r) for f in frames]
    assert out[:3] == [None] * 3 and out[3] == ("1.2.3.4", 10, "5.6.7.8", 20, b"q" * 3000)
    single = udp_frames(LINKTYPE_RAW, "1.2.3.4", 10, "5.6.7.8", 20, b"hi")[0]
    assert udp_from_frame(0.0, LINKTYPE_RAW, single) == ("1.2.3.4", 10, "5.6.7.8", 20, b"hi")
    assert udp_from_frame(0.0, LINKTYPE_RAW, single, ports={1}) is None
    with pytest.raises(ValueError):
        udp_frames(999, "1.2.3.4", 10, "5.6.7.8", 20, b"")


# ----------------------------------------------------------------- fragments

def test_fragmented_write_and_reassembly(tmp_path):
    path = tmp_path / "frag.pcap"
    big = random.Random(5).randbytes(5000)
    with PcapWriter(path) as w:
        w.write_udp(T0, "10.0.0.1", 1111, "10.0.0.2", 2222, b"before", ip_id=1, mtu=1500)
        w.write_udp(T0 + 1, "10.0.0.1", 1111, "10.0.0.2", 2222, big, ip_id=2, mtu=1500)
        w.write_udp(T0 + 2, "10.0.0.1", 1111, "10.0.0.2", 2222, b"after", ip_id=3, mtu=1500)
    frames = list(read_frames(path))
    assert len(frames) == 6 and all(len(f.data) <= 14 + 1500 for f in frames)
    flags = [struct.unpack_from("!H", f.data, 20)[0] for f in frames[1:5]]
    assert [(f & 0x2000 != 0, (f & 0x1FFF) * 8) for f in flags] == [(True, 0), (True, 1480), (True, 2960), (False, 4440)]
    got = list(read_udp(path))
    assert [d.payload for d in got] == [b"before", big, b"after"]
    assert [d.frame for d in got] == [1, 5, 6]
    rec_offsets = [24]
    for f in frames[:-1]:
        rec_offsets.append(rec_offsets[-1] + 16 + len(f.data))
    assert [d.offset for d in got] == [rec_offsets[0], rec_offsets[4], rec_offsets[5]]


def test_fragments_out_of_order_overlapping_and_interleaved():
    rnd = random.Random(7)
    a, b = rnd.randbytes(4000), rnd.randbytes(2500)
    fa = udp_frames(LINKTYPE_ETHERNET, "10.0.0.1", 1, "10.0.0.9", 2, a, ip_id=77, mtu=576)
    fb = udp_frames(LINKTYPE_ETHERNET, "10.0.0.1", 1, "10.0.0.9", 2, b, ip_id=78, mtu=576)
    frames = fa + fb
    rnd.shuffle(frames)
    # an overlapping fragment with the right bytes, a duplicate, and an overlapping one at offset 8
    ua = udp(1, 2, a)
    frames.insert(3, ether(ipv4("10.0.0.1", "10.0.0.9", ua[8:1008], ident=77, frag=8, mf=True)))
    frames.insert(5, frames[0])
    frames.insert(1, ether(ipv4("10.0.0.1", "10.0.0.9", ua[552:1560], ident=77, frag=552, mf=True)))
    got = list(read_udp(classic_pcap([(100, i, f) for i, f in enumerate(frames)])))
    assert sorted(d.payload for d in got) == sorted([a, b])
    # out-of-range fragments are dropped without trouble
    bad = [ether(ipv4("1.1.1.1", "2.2.2.2", b"z" * 200, ident=5, frag=65528, mf=False)),
           ether(ipv4("1.1.1.1", "2.2.2.2", b"z" * 16, ident=5, frag=0, mf=True))]
    assert list(read_udp(classic_pcap([(1, 0, f) for f in bad]))) == []


def test_incomplete_fragments_bounded_memory(tmp_path):
    r = Reassembler()
    for i in range(5000):
        assert r.feed(1.0 + i * 1e-4, ("a", i), 0, True, b"x" * 64) is None
        assert len(r) <= MAX_REASSEMBLY_BUFFERS
    assert len(r) == MAX_REASSEMBLY_BUFFERS
    # the oldest were evicted: completing a recent datagram works, an old one does not
    assert r.feed(2.0, ("a", 4999), 64, False, b"y") == b"x" * 64 + b"y"
    assert r.feed(2.0, ("a", 0), 64, False, b"y") is None
    # the same through the file reader, with the reassembler observable
    path = tmp_path / "incomplete.pcap"
    with PcapWriter(path) as w:
        for i in range(5000):
            frames = udp_frames(1, "10.0.0.1", 1, "10.0.0.2", 2, b"p" * 3000, ip_id=i, mtu=1500)
            w.write_frame(T0 + i * 1e-3, frames[0])
    reasm = Reassembler()
    assert list(read_udp(path, reassembler=reasm)) == []
    assert 0 < len(reasm) <= MAX_REASSEMBLY_BUFFERS


def test_reassembly_timeout():
    r = Reassembler()
    assert r.feed(0.0, "old", 0, True, b"a" * 8) is None
    assert r.feed(29.0, "new", 0, True, b"b" * 8) is None
    assert len(r) == 2
    assert r.feed(30.5, "new", 8, False, b"c") == b"b" * 8 + b"c"     # "old" (30.5 s) expired
    assert len(r) == 0
    assert r.feed(30.5, "old", 8, False, b"c") is None


# ----------------------------------------------------------------- cross-checks with tshark

def test_agrees_with_tshark(tmp_path):
    path = tmp_path / "x.pcap"
    data = sample(150, seed=11, max_payload=4000)
    write_udp_pcap(path, data, mtu=1500)        # payloads over 1472 bytes get fragmented
    assert len(list(read_frames(path))) > len(data)
    ours = [[str(d.frame), str(d.sport), str(d.dport), str(8 + len(d.payload)), d.src, d.dst]
            for d in read_udp(path)]
    theirs = tshark_fields(path, "frame.number", "udp.srcport", "udp.dstport", "udp.length", "ip.src", "ip.dst")
    assert len(ours) == len(data)
    assert ours == theirs


def test_real_capture_against_tshark():
    got = list(read_udp(REAL_CAPTURE, ports={12965}))
    lbmr = [d for d in got if d.dport == 12965]
    assert len(lbmr) == 179
    frames = [int(r[0]) for r in tshark_fields(REAL_CAPTURE, "frame.number", display_filter="udp.dstport==12965")]
    assert [d.frame for d in lbmr] == frames
    assert all(d.dst == "239.101.3.1" and d.payload[:1] for d in lbmr)
    everything = list(read_udp(REAL_CAPTURE))
    assert len(everything) == 12025
    assert [d for d in everything if 12965 in (d.sport, d.dport)] == got
    assert sum(1 for _ in read_frames(REAL_CAPTURE)) == 12058


# ----------------------------------------------------------------- errors

def test_truncated_file(tmp_path):
    path = tmp_path / "t.pcap"
    write_udp_pcap(path, [(T0 + i, "10.0.0.1", 1, "10.0.0.2", 2, bytes(100)) for i in range(10)])
    full = list(read_udp(path))
    raw = path.read_bytes()
    for cut in (full[5].offset + 20, full[5].offset + 10, full[5].offset + 1):
        part = tmp_path / f"cut{cut}.pcap"
        part.write_bytes(raw[:cut])
        seen = []
        with pytest.raises(CaptureError) as info:
            for d in read_udp(part):
                seen.append(d)
        assert seen == full[:5]
        err = info.value
        assert isinstance(err, ValueError)
        assert (err.path, err.offset) == (str(part), full[5].offset)
        assert "truncated" in err.reason and str(full[5].offset) in str(err)
        errors = []
        assert list(read_udp(part, on_error=errors.append)) == full[:5]
        assert [e.offset for e in errors] == [full[5].offset]
        errors.clear()
        assert list(read_udp(Trickle(raw[:cut], 64), on_error=errors.append)) == full[:5]
        assert [e.offset for e in errors] == [full[5].offset]
    # cut exactly at a record boundary is a clean end
    assert list(read_udp(raw[:full[5].offset])) == full[:5]


@pytest.mark.parametrize("blob,reason", [
    (b"", "empty"),
    (b"\xd4\xc3\xb2\xa1\x02\x00", "header"),
    (b"GARBAGE!" * 10, "magic"),
    (b"\x1f\x8b\x08\x00" + bytes(30), "gzip"),
])
def test_bad_headers(tmp_path, blob, reason):
    path = tmp_path / "bad.pcap"
    path.write_bytes(blob)
    with pytest.raises(CaptureError) as info:
        list(read_udp(path))
    assert info.value.offset == 0 and reason in info.value.reason
    errors = []
    assert list(read_frames(path, on_error=errors.append)) == []
    assert len(errors) == 1 and errors[0].offset == 0


def test_corrupt_pcapng_blocks(tmp_path):
    path = tmp_path / "ok.pcapng"
    with PcapngWriter(path) as w:
        for i in range(3):
            w.write_udp(T0 + i, "1.1.1.1", 1, "2.2.2.2", 2, b"data%d" % i)
    raw = path.read_bytes()
    good = list(read_udp(raw))
    assert len(good) == 3
    third = good[2].offset
    errors = []
    assert list(read_udp(raw[:-5], on_error=errors.append)) == good[:2]
    assert errors[0].offset == third and "truncated" in errors[0].reason
    bad_len = raw[:third + 4] + struct.pack("<I", 13) + raw[third + 8:]
    with pytest.raises(CaptureError) as info:
        list(read_udp(bad_len))
    assert info.value.offset == third and "length" in info.value.reason
    bad_trailer = raw[:-1] + b"\x7f"
    with pytest.raises(CaptureError) as info:
        list(read_udp(bad_trailer))
    assert info.value.offset == third
    for ifid in (1, 3):
        bad_iface = raw[:third + 8] + struct.pack("<I", ifid) + raw[third + 12:]
        with pytest.raises(CaptureError, match="interface"):
            list(read_udp(bad_iface))


VALID_PCAP = classic_pcap(
    [(1, i, f) for i, f in enumerate(
        udp_frames(1, "10.0.0.1", 1, "10.0.0.2", 2, bytes(range(256)) * 8, ip_id=3, mtu=600)
        + [ether(ipv4("10.0.0.3", "10.0.0.4", udp(5, 6, b"hello")), [(0x8100, 7)])]
        + udp_frames(1, "10.0.0.1", 1, "10.0.0.2", 2, b"plain"))])


def _valid_pcapng() -> bytes:
    buf = io.BytesIO()
    with PcapngWriter(buf, tsresol=9) as w:
        raw = w.add_interface(LINKTYPE_RAW, tsresol=0x80 | 10)
        w.write_udp(5.0, "10.0.0.1", 1, "10.0.0.2", 2, b"q" * 1000, mtu=400, ip_id=1)
        w.write_udp(6.0, "10.0.0.1", 1, "10.0.0.2", 2, b"raw", interface=raw)
    return buf.getvalue()


VALID_PCAPNG = _valid_pcapng()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from([VALID_PCAP, VALID_PCAPNG]),
       edits=st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 255)), max_size=8),
       cut=st.integers(0, 5000), tail=st.binary(max_size=64), step=st.sampled_from([3, 1 << 20]))
def test_fuzzed_captures_only_raise_capture_error(base, edits, cut, tail, step):
    blob = bytearray(base)
    for pos, value in edits:
        blob[pos % len(blob)] = value
    blob = bytes(blob[:cut] if cut < len(blob) else blob) + tail
    for reader in (read_udp, read_frames):
        try:
            for _ in reader(Trickle(blob, step)):
                pass
        except CaptureError:
            pass
        errors = []
        list(reader(blob, on_error=errors.append))
        assert len(errors) <= 1


def test_fuzz_bases_are_valid():
    assert [d.payload for d in read_udp(VALID_PCAP)] == [bytes(range(256)) * 8, b"hello", b"plain"]
    assert [d.payload for d in read_udp(VALID_PCAPNG)] == [b"q" * 1000, b"raw"]
    assert capture.MAX_REASSEMBLY_BUFFERS == MAX_REASSEMBLY_BUFFERS > 0
