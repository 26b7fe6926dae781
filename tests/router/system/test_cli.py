"""lbmr-router as a user runs it: the shipped NAT-example configs, real processes."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import lbmr_proto as L
from lbmr_proto import lbmc
from lbmr_proto import lbtru as RU
from router.cli import main

ROOT = Path(__file__).resolve().parents[3]
PY = [sys.executable, "-c"]
ROUTER = PY + ["import sys; from router.cli import main; sys.exit(main(sys.argv[1:]))"]
LBMRD = PY + ["import sys; from lbmrd.cli import main; sys.exit(main(sys.argv[1:]))"]


def free_port(kind=socket.SOCK_STREAM, ip="127.0.0.1") -> int:
    s = socket.socket(socket.AF_INET, kind)
    s.bind((ip, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_validate_and_dump(capsys):
    for name in ("router-a.xml", "router-b.xml", "router-direct.xml"):
        assert main(["-v", str(ROOT / "configs" / name)]) == 0
    assert main(["-d"]) == 0
    assert "<!ELEMENT lbmr-router" in capsys.readouterr().out
    assert main([]) == 2


def test_validate_reports_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.xml"
    bad.write_text((ROOT / "configs" / "router-b.xml").read_text().replace("<domain-id>2</domain-id>",
                                                                          "<domain-id>0</domain-id>"))
    assert main(["-v", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:" in err and "domain" in err


def _wait(cond, timeout=20.0, what=""):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _stop(procs):
    for p in procs:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()


def _status(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as r:
        return json.loads(r.read())


def test_shipped_pair_bridges_a_topic(tmp_path):
    """router-a.xml and router-b.xml (ports moved to free ones) with two lbmrds;
    a TCP source in TRD1 is seen in TRD2 as a proxy and its bytes arrive."""
    peer, ma, mb = free_port(), free_port(), free_port()
    l1, l2 = free_port(socket.SOCK_DGRAM, "127.0.1.1"), free_port(socket.SOCK_DGRAM, "127.0.2.1")
    cfgs = {}
    for name, metrics in (("router-a.xml", ma), ("router-b.xml", mb)):
        text = (ROOT / "configs" / name).read_text()
        text = text.replace("26123", str(peer)).replace("127.0.1.1\" port=\"15380", f"127.0.1.1\" port=\"{l1}")
        text = text.replace("127.0.2.1\" port=\"15380", f"127.0.2.1\" port=\"{l2}")
        text = text.replace("9390", str(metrics)).replace("9391", str(metrics))
        cfgs[name] = tmp_path / name
        cfgs[name].write_text(text)
    procs = []
    try:
        procs.append(subprocess.Popen(LBMRD + ["-i", "127.0.1.1", "-p", str(l1), "--stats-interval", "0"],
                                      stdout=subprocess.DEVNULL))
        procs.append(subprocess.Popen(LBMRD + ["-i", "127.0.2.1", "-p", str(l2), "--stats-interval", "0"],
                                      stdout=subprocess.DEVNULL))
        logb = tmp_path / "b.log"
        procs.append(subprocess.Popen(ROUTER + ["-L", str(logb), str(cfgs["router-b.xml"])]))

        def serving(port):
            try:
                return bool(_status(port))
            except OSError:
                return False

        # router B's portals listen before its metrics answer: A's first connection is not refused (to be
        # tried again only after the shipped reconnect interval, 5 s)
        _wait(lambda: serving(mb), what="router B")
        procs.append(subprocess.Popen(ROUTER + ["-L", str(tmp_path / "a.log"), str(cfgs["router-a.xml"])]))

        def connected():
            try:
                return _status(mb)["peer"]["state"] == "CONNECTED"
            except OSError:
                return False

        _wait(connected, what="the peer link")
        # a TCP source in TRD1 on 127.0.1.5, advertised through lbmrd 1
        src = socket.socket()
        src.bind(("127.0.1.5", 0))
        src.listen()
        sport = src.getsockname()[1]
        ctx1 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        ctx1.bind(("127.0.1.5", 0))
        tir = L.encode(L.Packet(0, 1, tirs=[L.TIR("md.cli", L.TcpTransport("0.0.0.0", sport), 60, 3)]))
        rcv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rcv.bind(("127.0.2.9", 0))
        rcv.settimeout(0.2)
        tqr = L.encode(L.Packet(0, 1, tqrs=[L.TQR("md.cli")]))
        proxy = None
        deadline = time.monotonic() + 20
        while proxy is None:
            assert time.monotonic() < deadline, "no proxy TIR in TRD2"
            ctx1.sendto(tir, ("127.0.1.1", l1))
            rcv.sendto(tqr, ("127.0.2.1", l2))
            try:
                while True:
                    pkt = L.decode(rcv.recvfrom(65535)[0])
                    hit = [t for t in pkt.tirs if t.topic == "md.cli"]
                    if hit:
                        proxy = hit[0].transport
                        break
            except TimeoutError:
                pass
        assert proxy.ip == "127.0.2.1" and 25000 <= proxy.port <= 25999  # router B's relay range
        c = socket.create_connection((proxy.ip, proxy.port), timeout=10)
        s, _ = src.accept()
        data = session(b"numbered-data-")
        s.sendall(data)
        s.close()
        got = b""
        while chunk := c.recv(65536):
            got += chunk
        logs = "\n".join((tmp_path / f).read_text()[-3000:] for f in ("a.log", "b.log"))
        assert got == data, logs
        st = _status(mb)
        assert st["proxies"] and st["counters"]["peer_connects"] >= 1
        procs[2].send_signal(signal.SIGUSR1)
        _wait(lambda: "dump " in logb.read_text(), what="the SIGUSR1 dump")
        # an LBT-RU stream runs through both routers while they are stopped (SIGTERM
        # of a router relaying LBT-RU used to exit 4: trio.ClosedResourceError)
        ru_src = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        ru_src.bind(("127.0.1.5", 0))
        ru_tir = L.encode(L.Packet(0, 1, tirs=[L.TIR("md.cli.ru", L.LbtruTransport("127.0.1.5",
                                                                                   ru_src.getsockname()[1]), 60, 4)]))
        ru_tqr = L.encode(L.Packet(0, 1, tqrs=[L.TQR("md.cli.ru")]))
        ru_proxy = None
        deadline = time.monotonic() + 20
        while ru_proxy is None:
            assert time.monotonic() < deadline, "no LBT-RU proxy TIR in TRD2"
            ctx1.sendto(ru_tir, ("127.0.1.1", l1))
            rcv.sendto(ru_tqr, ("127.0.2.1", l2))
            try:
                while ru_proxy is None:
                    hit = [t for t in L.decode(rcv.recvfrom(65535)[0]).tirs if t.topic == "md.cli.ru"]
                    ru_proxy = hit[0].transport if hit else None
            except TimeoutError:
                pass
        # (fanned out: router B's proxy is an LBT-RU source, router A one client of the origin)
        ru_rcv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        ru_rcv.bind(("127.0.2.10", 0))
        ru_rcv.settimeout(5)
        ru_rcv.sendto(RU.encode_creq(), (ru_proxy.ip, ru_proxy.port))
        syn = RU.decode(ru_rcv.recvfrom(65535)[0])
        assert isinstance(syn, RU.SessionMessage) and syn.syn, syn
        ru_rcv.sendto(RU.encode_ack(0, client_id=syn.header.client_id), (ru_proxy.ip, ru_proxy.port))
        ru_src.settimeout(10)
        creq, ru_addr = ru_src.recvfrom(65535)  # router A's upstream receiver connects
        assert isinstance(RU.decode(creq), RU.Creq)
        ru_src.sendto(RU.encode_sm(0, 0, 1, syn=True, client_id=1), ru_addr)
        for i in range(50):
            ru_src.sendto(RU.encode_data(i, 0, b"ru-%d" % i), ru_addr)
        while not isinstance(m := RU.decode(ru_rcv.recvfrom(65535)[0]), RU.Data):
            pass
        assert m.payload.startswith(b"ru-")  # the stream runs
        for p in procs[2:]:
            p.send_signal(signal.SIGTERM)
        assert [p.wait(timeout=10) for p in procs[2:]] == [0, 0]
        for s_ in (src, ctx1, rcv, c, ru_src, ru_rcv):
            s_.close()
    finally:
        _stop(procs)


def session(text: bytes) -> bytes:
    """What a TCP source sends: LBMC data messages (a fanned-out session is
    framed), 1000 of them with ``text`` repeated as payload."""
    return b"".join(lbmc.data_message(3, q, text * 10) for q in range(1000))


def _proxy_for(rcv, tqr, topic, ctx, tir, lbmrd, trd, timeout=20.0):
    """Advertise ``tir`` in one TRD and query ``topic`` in the other until a TIR for it arrives."""
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"no proxy TIR for {topic}"
        ctx.sendto(tir, lbmrd)
        rcv.sendto(tqr, trd)
        try:
            while True:
                hit = [t for t in L.decode(rcv.recvfrom(65535)[0]).tirs if t.topic == topic]
                if hit:
                    return hit[0].transport
        except TimeoutError:
            pass


def test_shipped_direct_link_router(tmp_path):
    """router-direct.xml (ports moved to free ones) between two lbmrds: a TCP
    source in each TRD reaches a receiver in the other; /status and /metrics
    show both portals; SIGUSR1 dumps them; SIGTERM exits 0."""
    metrics = free_port()
    l1, l2 = free_port(socket.SOCK_DGRAM, "127.0.1.1"), free_port(socket.SOCK_DGRAM, "127.0.2.1")
    text = (ROOT / "configs" / "router-direct.xml").read_text().replace("9392", str(metrics))
    text = text.replace('127.0.1.1" port="15380', f'127.0.1.1" port="{l1}')
    text = text.replace('127.0.2.1" port="15380', f'127.0.2.1" port="{l2}')
    cfg = tmp_path / "direct.xml"
    cfg.write_text(text)
    log = tmp_path / "r.log"
    procs = []
    socks = []
    try:
        for ip, port in (("127.0.1.1", l1), ("127.0.2.1", l2)):
            procs.append(subprocess.Popen(LBMRD + ["-i", ip, "-p", str(port), "--stats-interval", "0"],
                                          stdout=subprocess.DEVNULL))
        procs.append(subprocess.Popen(ROUTER + ["-L", str(log), str(cfg)]))

        def up():
            try:
                return all(lk["state"] == "CONNECTED" for p in _status(metrics)["portals"] for lk in p["links"])
            except OSError:
                return False

        _wait(up, what="the direct link")
        for n, (side, other, lb_src, lb_dst) in enumerate(((1, 2, l1, l2), (2, 1, l2, l1))):
            src = socket.socket()
            src.bind((f"127.0.{side}.5", 0))
            src.listen()
            ctx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            ctx.bind((f"127.0.{side}.5", 0))
            rcv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            rcv.bind((f"127.0.{other}.9", 0))
            rcv.settimeout(0.2)
            socks += [src, ctx, rcv]
            topic = f"md.direct.{side}"
            tir = L.encode(L.Packet(0, 1, tirs=[L.TIR(topic, L.TcpTransport("0.0.0.0", src.getsockname()[1]),
                                                      60, 3 + n)]))
            tqr = L.encode(L.Packet(0, 1, tqrs=[L.TQR(topic)]))
            proxy = _proxy_for(rcv, tqr, topic, ctx, tir, (f"127.0.{side}.1", lb_src),
                               (f"127.0.{other}.1", lb_dst))
            assert proxy.ip == f"127.0.{other}.1" and (24000 if other == 1 else 25000) <= proxy.port
            c = socket.create_connection((proxy.ip, proxy.port), timeout=10)
            s, _ = src.accept()
            data = session(topic.encode())
            s.sendall(data)
            s.close()
            got = b""
            while chunk := c.recv(65536):
                got += chunk
            c.close()
            assert got == data
        st = _status(metrics)
        assert [(p["name"], p["domain_id"], p["proxies"]) for p in st["portals"]] == [("TRD1", 1, 1), ("TRD2", 2, 1)]
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=2) as r:
            text = r.read().decode()
        assert 'lbmr_router_portal_proxies{portal="TRD2"} 1' in text
        assert 'lbmr_router_link_up{link="TRD1<->TRD2"} 1' in text
        procs[2].send_signal(signal.SIGUSR1)
        _wait(lambda: "dump " in log.read_text() and '"portals"' in log.read_text(), what="the dump")
        procs[2].send_signal(signal.SIGTERM)
        assert procs[2].wait(timeout=10) == 0
    finally:
        for s_ in socks:
            s_.close()
        _stop(procs)
