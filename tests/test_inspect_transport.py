"""lbmr-inspect --transport and --sessions (issue 24): the same decoding as
lbmr_proto.transport_sessions, in one process, with the filters applied."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from lbmr_proto import lbmc as C
from lbmr_proto import lbtrm as RM
from lbmr_proto.capture import LINKTYPE_RAW, PcapWriter, read_packets
from lbmr_proto.transport_sessions import TransportDecoder, receiver_rows, session_rows, topic_rows
from lbmr_tools.inspect import main
from tests import netns
from tests.helpers import ROOT, real_capture
from tests.netns import veth
from tests.transport_captures import GEN_RM, udp_packet, write_transport_capture

netns_factory = netns.netns_factory  # the fixture, for the live test


def _invoke(*args) -> str:
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r.output


def _json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _plain(obj):
    """JSON's view of a record or row (tuples become lists)."""
    return json.loads(json.dumps(obj))


def _records(path: Path) -> list:
    dec = TransportDecoder()
    out = []
    for item in read_packets(path):
        out += dec.feed(item)
    return out


@pytest.fixture(scope="module")
def gen(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("inspect") / "transport.pcap"
    write_transport_capture(path)
    return path


def test_transport_json_is_every_record_in_capture_order(gen):
    objs = _json_lines(_invoke("--transport", "--json", gen))
    lbmr = [o for o in objs if "record" not in o]
    records = [o for o in objs if "record" in o]
    assert len(lbmr) == 2 and [o["type"] for o in lbmr] == ["NORMAL", "NORMAL"]
    ours = _records(gen)
    assert [{k: v for k, v in o.items() if k != "record"} for o in records] == [_plain(r._asdict()) for r in ours]
    assert [o["record"] for o in records] == ["message" if "tidx" in r._fields else "transport" for r in ours]
    frames = [o["frame"] for o in objs]
    assert frames == sorted(frames)


def test_transport_filters(gen):
    naks = _json_lines(_invoke("--transport", "--json", "--type", "NAK", gen))
    assert {o["kind"] for o in naks} == {"NAK"} and len(naks) == 5  # LBT-RM 3 (1 quoted in ICMP), no TIR 1, RU 1
    assert sum(o["icmp"] for o in naks) == 1
    alpha = _json_lines(_invoke("--transport", "--json", "--topic", "^alpha$", gen))
    msgs = [o for o in alpha if o.get("record") == "message"]
    assert msgs and {o["topic"] for o in msgs} == {"alpha"}
    assert {o["session"] for o in alpha if o.get("record") == "transport"} == {"LBTRM:10.0.0.1:14390:01020304"}
    assert any(o.get("type") == "NORMAL" for o in alpha)  # the TIR and TQR for alpha
    assert len(_json_lines(_invoke("--transport", "--json", "-c", "7", gen))) == 7


def test_transport_text_lines(gen):
    out = _invoke("--transport", gen)
    lines = out.splitlines()
    ncf = [line for line in lines if " NCF " in line]
    assert [line.split(" NCF ")[1].split()[0] for line in ncf] == [
        "ignored", "rx_delay", "shed", "no_retry", "ignored", "rx_delay"]
    assert any("NAK (quoted in ICMP port unreachable)" in line for line in lines)
    assert any("DATA sqn 5 trail 0 RX LBTRM:10.0.0.1:14390:01020304" in line for line in lines)
    assert any("LBMC MESSAGE tidx 1 sqn 0 topic 'alpha'" in line for line in lines)
    assert any("LBMC CONTROL 12 bytes [TcpSid]" in line for line in lines)
    assert any("LBTRU SM sqn 0 lead 0 trail 0 SYN" in line for line in lines)
    assert any("TCP SYN" in line for line in lines)


def test_sessions_json_equals_the_tables(gen):
    (obj,) = _json_lines(_invoke("--sessions", "--json", gen))
    dec = TransportDecoder()
    for item in read_packets(gen):
        dec.feed(item)
    assert obj["sessions"] == [_plain(r._asdict()) for r in session_rows(dec.state)]
    assert obj["receivers"] == [_plain(r._asdict()) for r in receiver_rows(dec.state)]
    assert obj["topics"] == [_plain(r._asdict()) for r in topic_rows(dec.state)]
    assert obj["errors"] == {} and obj["overflow"] == {}


def test_sessions_text_on_the_real_capture():
    out = _invoke("--sessions", real_capture())
    assert out.startswith("2 transport sessions")
    assert "LBTRM:10.29.4.121:12090:f9d74f3e:239.101.3.10:14400  (TIR)" in out
    assert "5000 original datagrams (285000 bytes), 571 retransmissions (32547 bytes)" in out
    assert "NAKs 344 (722 entries, 514 sqns); NCFs ignored 44; session messages 2; ICMP errors 8" in out
    assert "6 never retransmitted (4689,4731,4781,4855,4894,4997)" in out
    assert "tidx 451557767 '29west.example.multi.1': 2500 messages, 265 retransmitted" in out
    assert "10.29.4.101:35101 (context whose queries resolved here)" in out
    assert "Bad input" not in out


def test_sessions_with_transport_prints_both(gen):
    out = _invoke("--transport", "--sessions", "--type", "SM", gen)
    body, _, table = out.partition("transport sessions")
    assert body.count(" SM ") == 5 and "LBTRU:10.0.0.1:14380:0a0b0c0d" in table


def test_bad_input_is_reported_not_raised(tmp_path):
    import lbmr_proto as L
    ip, nport, sid, grp, dport = GEN_RM
    tir = L.encode(L.Packet(0, tirs=[L.TIR("alpha", L.LbtrmTransport(ip, grp, sid, dport, nport), 0, 1)]))
    good = RM.encode_data(nport, sid, 1, 0, C.data_message(1, 0, b"x"))
    path = tmp_path / "bad.pcap"
    with PcapWriter(path, linktype=LINKTYPE_RAW) as w:
        for i, f in enumerate([udp_packet((ip, 40000), ("239.1.1.1", 12965), tir),
                               udp_packet((ip, 50000), (grp, dport), good[:10]),
                               udp_packet(("10.0.0.2", 45000), (ip, nport), RM.encode_nak(nport, sid, [1, 2])[:-2]),
                               udp_packet((ip, 50000), (grp, dport), good)]):
            w.write_frame(1_700_000_000 + i, f)
    out = _invoke("--sessions", path)
    assert "Bad input: lbtrm_nak_list 1, lbtrm_truncated 1" in out
    errs = _json_lines(_invoke("--transport", "--json", "--type", "ERROR", path))
    assert [(o["frame"], o["error"]) for o in errs] == [(2, "lbtrm_truncated"), (3, "lbtrm_nak_list")]


def test_help_names_the_options():
    out = _invoke("--help")
    assert "--transport" in out and "--sessions" in out and "SEGMENT" in out


# ------------------------------------------------------------------ live, in network namespaces

_SOURCE_HOST = r'''
import socket, sys, time
import lbmr_proto as L
from lbmr_proto import lbmc as C, lbtrm as RM
me, peer, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
tir = L.encode(L.Packet(0, tirs=[
    L.TIR("live.rm", L.LbtrmTransport(me, "239.77.0.1", 0x5151, 14400, 14390), 0, 3),
    L.TIR("live.tcp", L.TcpSessionTransport(me, 0x7171, 14371), 0, 4)]))
lst = socket.create_server((me, 14371))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind((me, 40000))
u.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(me))
u.sendto(tir, (peer, 12965))
time.sleep(0.2)
for q in range(n):
    u.sendto(RM.encode_data(14390, 0x5151, q, 0, C.data_message(3, q, b"live")), ("239.77.0.1", 14400))
u.sendto(RM.encode_sm(14390, 0x5151, 0, n - 1, 0), ("239.77.0.1", 14400))
c, _ = lst.accept()
c.sendall(C.encode(C.Message(C.CONTROL, headers=(C.TcpSidHeader(0, 0x7171),))))
for q in range(5):
    c.sendall(C.data_message(4, q, b"tcp"))
c.close()
print("sent", flush=True)
'''

_RECEIVER_HOST = r'''
import socket, sys, time
from lbmr_proto import lbtrm as RM
source = sys.argv[1]
time.sleep(0.5)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 45000))
for k in range(3):  # nobody listens on the NAK port: the source's host answers ICMP port unreachable
    s.sendto(RM.encode_nak(14390, 0x5151, [k, k + 1]), (source, 14390))
    time.sleep(0.05)
t = socket.create_connection((source, 14371), timeout=10)
while t.recv(4096):
    pass
print("done", flush=True)
'''


def test_live_sessions_from_a_veth_link(netns_factory):
    a, b = netns_factory(), netns_factory()
    _, dev_b = veth(a, "198.18.77.1/24", b, "198.18.77.2/24")
    sniff = b.popen([sys.executable, "-m", "lbmr_tools.inspect", "--live", dev_b, "--sessions", "--json"],
                    cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(4)  # scapy's sniffer starting
    source = a.popen([sys.executable, "-c", _SOURCE_HOST, "198.18.77.1", "198.18.77.2", "20"], cwd=ROOT,
                     stdout=subprocess.PIPE, text=True)
    receiver = b.run([sys.executable, "-c", _RECEIVER_HOST, "198.18.77.1"], timeout=60, check=True)
    assert "done" in receiver.stdout
    assert "sent" in source.communicate(timeout=60)[0]
    time.sleep(1.5)
    sniff.send_signal(signal.SIGINT)
    out, err = sniff.communicate(timeout=60)
    assert sniff.returncode == 0, err
    (obj,) = _json_lines(out)
    rows = {r["source"]: r for r in obj["sessions"]}
    rm = rows["LBTRM:198.18.77.1:14390:00005151:239.77.0.1:14400"]
    assert rm["from_tir"] and rm["topics"] == ["live.rm"] and rm["originals"] == 20 and rm["lead_sqn"] == 19
    assert rm["session_messages"] == 1 and rm["nak_packets"] == 3 and rm["nak_entries"] == 6
    assert rm["icmp_errors"] == 3 and rm["receivers"] == ["198.18.77.2:45000"]
    tcp = rows["TCP:198.18.77.1:14371:00007171"]
    assert tcp["topics"] == ["live.tcp"] and tcp["lbmc_messages"] == 5 and len(tcp["receivers"]) == 1
    topics = {(t["session"], t["tidx"]): t["messages"] for t in obj["topics"]}
    assert topics[("TCP:198.18.77.1:14371:00007171", 4)] == 5
    assert topics[("LBTRM:198.18.77.1:14390:00005151", 3)] == 20
    assert obj["errors"] == {}
