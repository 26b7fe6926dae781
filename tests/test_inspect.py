"""lbmr-inspect over real and generated captures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

import lbmr_proto as L
from lbmr_proto.capture import PcapWriter, read_udp
from lbmr_tools.inspect import main

CAPTURE = Path(__file__).resolve().parents[1].parent / "shared" / "captures" / "um614-multicast-tr.pcap"
ROOT = Path(__file__).resolve().parents[1]


def _json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_json_on_real_capture_matches_decoder():
    r = CliRunner().invoke(main, ["--json", str(CAPTURE)])
    assert r.exit_code == 0, r.output
    objs = _json_lines(r.output)
    assert len(objs) == 179
    assert sum(o["type"] == "WC_TQR" for o in objs) == 18
    assert sum(len(o["tirs"]) for o in objs) == 141
    assert sum(len(o["tqrs"]) for o in objs) == 43
    datagrams = [d for d in read_udp(CAPTURE) if 12965 in (d.sport, d.dport)]
    for o, d in zip(objs, datagrams, strict=True):
        p = L.decode(d.payload)
        assert o["src"] == f"{d.src}:{d.sport}" and o["dst"] == f"{d.dst}:{d.dport}"
        assert abs(o["ts"] - d.ts) < 1e-6 and o["version"] == p.version == 1
        assert o["tqrs"] == [q.topic for q in p.tqrs]
        for jt, t in zip(o["tirs"], p.tirs, strict=True):
            assert jt["transport"] == "LBTRM" and jt["topic"] == t.topic
            assert jt["ip"] == t.transport.ip and jt["mcast_group"] == t.transport.mcast_group
            assert jt["dest_port"] == t.transport.dest_port and jt["session_id"] == t.transport.session_id
            assert [x["kind"] for x in jt["options"]] == ["OTID", "EXFUNC"]
        assert [x["kind"] for x in o["options"]] == ["SRC_ID", "SRC_TYPE", "VERSION", "LOCAL_DOMAIN"]
    wc = next(o for o in objs if o["type"] == "WC_TQR")
    assert wc["wc_tqrs"][0]["pattern_type"] == 1 and wc["wc_tqrs"][0]["pattern"].startswith("^29west")


def _mixed_capture(path: Path) -> list[L.Packet]:
    pkts = [
        L.Packet(0, tqrs=[L.TQR("md.AAPL"), L.TQR("other")]),
        L.Packet(0, tirs=[L.TIR("md.AAPL", L.TcpTransport("10.1.2.3", 14371), 0, 7)]),
        L.Packet(1, wc_tqrs=[L.WcTQR("^md\\..*", 2)]),
        L.Packet(2),
        L.Packet(0, tirs=[L.TIR("ipc.topic", L.LbtipcTransport(1, 2, 3), 0, 1, [L.DomainIdOption(0, 9)])],
                 options=[L.SourceTypeOption(0x80, 1)]),
    ]
    with PcapWriter(path) as w:
        for i, p in enumerate(pkts):
            w.write_udp(1700000000.0 + i, "127.0.1.1", 14402, "127.0.0.1", 15380, L.encode(p))
        w.write_udp(1700000010.0, "127.0.1.2", 14403, "127.0.0.1", 15380, b"\x05\x00\x00\x00")  # bad type
        w.write_udp(1700000011.0, "127.0.1.2", 40000, "127.0.0.1", 13000, L.encode(pkts[0]))  # other port
    return pkts


def test_text_filters_and_ports(tmp_path):
    cap = tmp_path / "mixed.pcap"
    _mixed_capture(cap)
    r = CliRunner().invoke(main, [str(cap)])
    assert r.exit_code == 0
    lines = r.output.splitlines()
    assert len(lines) == 6  # port 13000 is not LBMR by default
    assert "TQR 'md.AAPL'" in lines[0] and "TIR 'md.AAPL' TCP 10.1.2.3:14371" in lines[1]
    assert "RCV_ALIVE" in lines[3] and "ERROR" in lines[5] and "unknown LBMR packet type 5" in lines[5]
    assert "127.0.1.1:14402 -> 127.0.0.1:15380" in lines[0]
    r = CliRunner().invoke(main, ["--port", "13000", str(cap)])
    assert len(r.output.splitlines()) == 7
    r = CliRunner().invoke(main, ["--topic", "md", str(cap)])
    assert len(r.output.splitlines()) == 3  # TQR, TIR, and the wildcard pattern
    r = CliRunner().invoke(main, ["--type", "RCV_ALIVE", "--type", "error", "--json", str(cap)])
    objs = _json_lines(r.output)
    assert [o.get("type") for o in objs] == ["RCV_ALIVE", None]
    assert objs[1]["error"].startswith("offset 0:") and objs[1]["data"] == "05000000"
    r = CliRunner().invoke(main, ["-c", "2", str(cap)])
    assert len(r.output.splitlines()) == 2


def test_stats(tmp_path):
    cap = tmp_path / "mixed.pcap"
    _mixed_capture(cap)
    r = CliRunner().invoke(main, ["--stats", "--json", str(cap)])
    assert r.exit_code == 0
    s = json.loads(r.output)
    assert s["packets"] == 6 and s["decode_errors"] == 1
    assert s["types"] == {"NORMAL": 3, "WC_TQR": 1, "RCV_ALIVE": 1, "ERROR": 1}
    assert s["topics"]["md.AAPL"] == {"tqrs": 1, "tirs": 1}
    assert s["senders"]["127.0.1.1:14402"]["packets"] == 5
    r = CliRunner().invoke(main, ["--stats", str(CAPTURE)])
    assert "179 LBMR datagrams, 0 undecodable" in r.output and "WC_TQR" in r.output


def test_truncated_capture_reports_file_and_offset(tmp_path):
    cap = tmp_path / "mixed.pcap"
    _mixed_capture(cap)
    data = cap.read_bytes()
    sixth = [d.offset for d in read_udp(cap)][5]
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(data[:sixth + 30])  # the 6th record is cut short
    r = CliRunner().invoke(main, [str(cut), str(cap)])
    assert r.exit_code == 2
    assert "cut.pcap" in r.stderr and f"offset {sixth}" in r.stderr
    # everything before the cut, then the whole second file
    assert len(r.stdout.splitlines()) == 5 + 6


def test_console_script_runs(tmp_path):
    exe = Path(sys.executable).with_name("lbmr-inspect")
    out = subprocess.run([str(exe), "--json", "-c", "3", str(CAPTURE)], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert len(_json_lines(out)) == 3
    bad = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "capture file or --live" in bad.stderr


def test_undecodable_names_and_exotic_timestamps(tmp_path):
    cap = tmp_path / "odd.pcap"
    with PcapWriter(cap) as w:
        w.write_udp(1700000000.0, "127.0.1.1", 14402, "127.0.0.1", 15380, b"\x00\x01\x00\x00md\xff\x00")
    r = CliRunner().invoke(main, [str(cap)])
    assert r.exit_code == 0, r.output
    assert "TQR 'md\\xff'" in r.output
    r = CliRunner().invoke(main, ["--json", str(cap)])
    obj = json.loads(r.output)
    assert obj["tqrs"] == ["md\\xff"]  # strict JSON: no lone surrogates
    r = subprocess.run([str(Path(sys.executable).with_name("lbmr-inspect")), str(cap)], capture_output=True,
                       timeout=60, env={"PYTHONIOENCODING": "utf-8", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and b"md\\xff" in r.stdout, r.stderr
    from lbmr_tools.inspect import _ts_text

    assert _ts_text(1e20) == "100000000000000000000.000000s"  # beyond time_t: raw seconds, no crash
