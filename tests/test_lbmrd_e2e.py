"""lbmrd end to end on real UDP sockets on loopback (trio)."""

from __future__ import annotations

import json
import logging
import math
import socket

import pytest
import trio

import lbmr_proto as L
from lbmrd.config import parse_config
from lbmrd.server import Daemon, Settings

TQR = L.encode(L.Packet(0, 1, tqrs=[L.TQR("md.X")]))


def tir(ip="0.0.0.0", port=14371, topic="md.X"):
    return L.encode(L.Packet(0, 1, tirs=[L.TIR(topic, L.TcpTransport(ip, port), 16, 1)]))


async def start(nursery, config=None, **kw) -> tuple[Daemon, tuple[str, int]]:
    s = Settings(bind_ip="127.0.0.1", port=0, stats_interval=0, **kw)
    d = Daemon(s, config)
    bound = await nursery.start(d.run)
    return d, bound


def client(ip="127.0.0.1") -> trio.socket.SocketType:
    s = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    s._sock.bind((ip, 0))  # bind synchronously (loopback only)
    return s


async def recv(s, timeout=2.0):
    with trio.fail_after(timeout):
        return await s.recvfrom(65535)


async def nothing(s, wait=0.2) -> bool:
    with trio.move_on_after(wait):
        await s.recvfrom(65535)
        return False
    return True


async def test_keepalive_reply_and_relay_with_fill_in():
    async with trio.open_nursery() as n:
        d, daemon = await start(n)
        a, b, c = client(), client(), client()
        for s in (a, b, c):
            await s.sendto(b"\x02\x00\x00\x00", daemon)
            data, src = await recv(s)
            assert data == b"\x00\x00\x00\x00" and src == daemon  # from the listening socket
        await a.sendto(tir(), daemon)
        for s in (b, c):
            data, src = await recv(s)
            assert src == daemon
            t = L.decode(data).tirs[0].transport
            assert (t.ip, t.port) == ("127.0.0.1", 14371)  # 0.0.0.0 filled with the sender's address
        assert await nothing(a)  # never echoed to the sender
        assert len(d.core.table) == 3 and d.core.counters.fillins == 1
        n.cancel_scope.cancel()


async def test_ttl_expiry_on_virtual_clock(autojump_clock):
    async with trio.open_nursery() as n:
        d, daemon = await start(n, ttl_s=60, activity_ms=1000)
        a, b = client(), client()
        await a.sendto(TQR, daemon)
        await b.sendto(TQR, daemon)
        await recv(a)  # b's TQR reached a: both registered
        assert len(d.core.table) == 2
        await trio.sleep(30)
        await a.sendto(b"\x03\x00\x00\x00", daemon)  # a stays alive
        await recv(a)
        await trio.sleep(31.5)
        assert [c.addr for c in d.core.table] == [a.getsockname()]
        await trio.sleep(30)
        assert len(d.core.table) == 0 and d.core.counters.clients_expired == 2
        n.cancel_scope.cancel()


async def test_malformed_flood_is_counted_and_dropped():
    async with trio.open_nursery() as n:
        d, daemon = await start(n)
        good, bad = client(), client()
        await good.sendto(b"\x02\x00\x00\x00", daemon)
        await recv(good)
        for i in range(3000):
            await bad.sendto(bytes((5, i & 255, 0, 0)) + b"x" * (i % 50), daemon)
            if i % 500 == 0:
                await trio.sleep(0.01)  # let the daemon drain: loopback buffers are finite
        await bad.sendto(b"\x02\x00\x00\x00", daemon)
        await recv(bad)  # the daemon is alive and answers
        c = d.core.counters
        assert c.drops["malformed"] + 0 >= 2500  # a few may be lost in the socket buffer
        assert len(d.core.table) == 2  # garbage never registered anyone
        assert await nothing(good)  # nothing malformed was relayed
        n.cancel_scope.cancel()


async def test_malformed_debug_lines_are_bounded_and_summarised(monkeypatch, caplog):
    from lbmrd import server as S

    monkeypatch.setattr(S, "MALFORMED_LOG_WINDOW", 1.0)  # a short window, so the summary comes soon
    caplog.set_level(logging.DEBUG, logger="lbmrd")
    async with trio.open_nursery() as n:
        d, daemon = await start(n)
        bad = client()
        t0 = trio.current_time()
        for i in range(500):
            await bad.sendto(bytes((5, i & 255, 0, 0)), daemon)
            if i % 100 == 0:
                await trio.sleep(0.01)
        await bad.sendto(b"\x02\x00\x00\x00", daemon)
        await recv(bad)
        dropped = d.core.counters.drops["malformed"]
        assert dropped >= 400  # a few may be lost in the socket buffer
        with trio.fail_after(5):
            while d.malformed_log.limit.next_due() is not None:
                await trio.sleep(0.05)
        elapsed = trio.current_time() - t0
        n.cancel_scope.cancel()
    msgs = [r.getMessage() for r in caplog.records if r.name == "lbmrd"]
    lines = [m for m in msgs if m.startswith("dropped malformed datagram from ")]
    summaries = [m for m in msgs if m.endswith(" more malformed events suppressed in the last 1 s")]
    assert summaries
    assert len(lines) + sum(int(m.split()[0]) for m in summaries) == dropped
    windows = math.ceil(elapsed / 1.0) + 1
    assert len(lines) <= S.MALFORMED_LOG_LINES * windows


NAT_XML = """<?xml version="1.0" encoding="UTF-8" ?>
<lbmrd version="1.0">
  <domains>
    <domain name="Net-NYC"><network>127.0.1.0/24</network></domain>
    <domain name="Net-NJC"><network>127.0.2.0/24</network></domain>
  </domains>
  <transformations>
    <transform source="Net-NYC" destination="Net-NJC">
      <rule><match address="127.0.1.50" port="*"/><replace address="127.0.2.1" port="*"/></rule>
      <rule><match address="127.0.1.51" port="14371"/><replace address="127.0.2.2" port="24371"/></rule>
    </transform>
  </transformations>
</lbmrd>
"""


async def test_nat_transform_between_domains():
    """The UM documentation's NAT example on loopback addresses: NYC = 127.0.1.x
    (the source side), NJC = 127.0.2.x; TIRs for NJC clients are rewritten."""
    cfg = parse_config(NAT_XML, "nat.xml")
    async with trio.open_nursery() as n:
        d, daemon = await start(n, cfg)
        src = client("127.0.1.50")
        nyc = client("127.0.1.7")
        njc = client("127.0.2.9")
        for s in (src, nyc, njc):
            await s.sendto(b"\x02\x00\x00\x00", daemon)
            await recv(s)
        await src.sendto(tir("0.0.0.0", 12001), daemon)  # fill-in gives 127.0.1.50, then NAT
        got_nyc = L.decode((await recv(nyc))[0]).tirs[0].transport
        got_njc = L.decode((await recv(njc))[0]).tirs[0].transport
        assert (got_nyc.ip, got_nyc.port) == ("127.0.1.50", 12001)  # same domain: untouched
        assert (got_njc.ip, got_njc.port) == ("127.0.2.1", 12001)  # `*` keeps the port
        # second rule: address and port matched as a pair
        await src.sendto(tir("127.0.1.51", 14371), daemon)
        t = L.decode((await recv(njc))[0]).tirs[0].transport
        assert (t.ip, t.port) == ("127.0.2.2", 24371)
        await recv(nyc)
        await src.sendto(tir("127.0.1.51", 14372), daemon)  # port does not match: unchanged
        t = L.decode((await recv(njc))[0]).tirs[0].transport
        assert (t.ip, t.port) == ("127.0.1.51", 14372)
        await recv(nyc)
        # TIRs from NJC to NYC: no transform for that direction
        await njc.sendto(tir("127.0.2.9", 5000), daemon)
        t = L.decode((await recv(nyc))[0]).tirs[0].transport
        assert (t.ip, t.port) == ("127.0.2.9", 5000)
        assert d.core.counters.nat_rewrites == 2
        assert {c.domain for c in d.core.table} == {"Net-NYC", "Net-NJC"}
        n.cancel_scope.cancel()


async def test_metrics_and_status_endpoint():
    async with trio.open_nursery() as n:
        d, daemon = await start(n, metrics=("127.0.0.1", 0))
        a, b = client(), client()
        await a.sendto(TQR, daemon)
        await b.sendto(TQR, daemon)
        await recv(a)
        await b.sendto(b"garbage", daemon)
        await trio.sleep(0.05)

        async def get(path):
            stream = await trio.open_tcp_stream(*d.metrics_addr)
            await stream.send_all(f"GET {path} HTTP/1.0\r\n\r\n".encode())
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
            return data.decode()

        text = await get("/metrics")
        assert "HTTP/1.0 200 OK" in text
        assert "lbmrd_clients 2" in text
        assert 'lbmrd_datagrams_in_total{type="NORMAL"} 2' in text
        assert 'lbmrd_drops_total{reason="malformed"} 1' in text
        assert "lbmrd_datagrams_out_total 1" in text  # b -> a (a was alone when it sent)
        status = json.loads((await get("/status")).split("\r\n\r\n", 1)[1])
        assert len(status["clients"]) == 2 and status["events"][0]["event"] == "client_added"
        assert "404" in (await get("/nope")).split("\r\n")[0]
        n.cancel_scope.cancel()


async def test_reload_keeps_clients_and_reclassifies(tmp_path):
    path = tmp_path / "lbmrd.xml"
    path.write_text(NAT_XML)
    from lbmrd.config import load_config

    async with trio.open_nursery() as n:
        s = Settings(bind_ip="127.0.0.1", port=0, stats_interval=0)
        d = Daemon(s, load_config(path), reload=lambda: load_config(path))
        daemon = await n.start(d.run)
        a = client("127.0.2.9")
        await a.sendto(b"\x02\x00\x00\x00", daemon)
        await recv(a)
        assert [c.domain for c in d.core.table] == ["Net-NJC"]
        path.write_text(NAT_XML.replace("127.0.2.0/24", "127.0.3.0/24"))
        assert await d.reload()
        assert [c.domain for c in d.core.table] == [None] and len(d.core.table) == 1
        path.write_text("<lbmrd version='1.0'><oops/></lbmrd>")
        assert not await d.reload()  # a bad file keeps the running config
        assert d.core.config.domains[1].networks[0].exploded == "127.0.3.0/24"
        n.cancel_scope.cancel()


@pytest.mark.parametrize(("sendmmsg", "clients"), [(True, 200), (True, 300), (False, 200)],
                         ids=["sendmmsg-outbox", "sendmmsg-direct", "sendto"])
async def test_many_clients_fan_out(sendmmsg, clients):
    """Up to OUTBOX_CLIENTS clients, relays are gathered in the outbox; above, sent one by one."""
    async with trio.open_nursery() as n:
        d, daemon = await start(n)
        d.fanout.use_sendmmsg = sendmmsg
        socks = [client() for _ in range(clients)]
        for s in socks:
            await s.sendto(b"\x02\x00\x00\x00", daemon)
            await recv(s)
        await socks[0].sendto(TQR, daemon)
        for s in socks[1:]:
            data, src = await recv(s)
            assert data == TQR and src == daemon
        assert d.core.counters.tx == clients + clients - 1  # replies + fan-out
        for s in socks:
            s.close()
        n.cancel_scope.cancel()


def test_sockaddr_layout_matches_the_kernel():
    from lbmrd.clients import Client

    c = Client(("127.0.0.1", 14402), 0.0, None, 0.0)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind(("127.0.0.1", 0))
        assert len(c.sockaddr) == 16 and c.sockaddr[2:4] == (14402).to_bytes(2, "big")
        assert c.sockaddr[4:8] == socket.inet_aton("127.0.0.1")
    finally:
        s.close()


async def test_um_documentation_nat_example_on_loopback():
    """configs/lbmrd-nat-example.xml (UM's "LBMRD NAT Transit" example) with its
    networks moved onto loopback: 10.1.0.0/16 -> 127.1.0.0/16 (Net-NYC) and
    192.168.1.0/24 -> 127.2.1.0/24 (Net-NJC); lbmrd and the TCP source run on
    the NYC host 10.1.1.50 -> 127.1.1.50, seen from NJC as 192.168.1.1 -> 127.2.1.1."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "configs" / "lbmrd-nat-example.xml").read_text()
    text = text.replace("10.1.", "127.1.").replace("192.168.1", "127.2.1")
    cfg = parse_config(text, "lbmrd-nat-example.xml")
    assert cfg.daemon.interface == "127.1.1.50" and cfg.daemon.port == 12000
    async with trio.open_nursery() as n:
        d = Daemon(Settings(bind_ip=cfg.daemon.interface, port=0, stats_interval=0), cfg)
        daemon = await n.start(d.run)
        app_a = client("127.1.1.50")  # the application on the NAT'ed host (source)
        rcv_a = client("127.1.2.3")  # a receiver on network A
        rcv_b = client("127.2.1.20")  # a receiver on network B
        for s in (app_a, rcv_a, rcv_b):
            await s.sendto(b"\x02\x00\x00\x00", daemon)
            await recv(s)
        await app_a.sendto(tir("0.0.0.0", 12001, "29west.example.multi.0"), daemon)
        ta = L.decode((await recv(rcv_a))[0]).tirs[0].transport
        tb = L.decode((await recv(rcv_b))[0]).tirs[0].transport
        assert (ta.ip, ta.port) == ("127.1.1.50", 12001)
        assert (tb.ip, tb.port) == ("127.2.1.1", 12001)
        # queries pass untouched in both directions
        await rcv_b.sendto(TQR, daemon)
        assert (await recv(app_a))[0] == TQR and (await recv(rcv_a))[0] == TQR
        n.cancel_scope.cancel()


async def test_fan_out_follows_joins_and_expiries(autojump_clock):
    """The sendmmsg arrays are updated in place as clients come and go."""
    async with trio.open_nursery() as n:
        d, daemon = await start(n, ttl_s=10, activity_ms=1000)
        socks = [client() for _ in range(40)]
        for s in socks:
            await s.sendto(b"\x02\x00\x00\x00", daemon)
            await recv(s)
        await trio.sleep(6)
        for s in socks[20:]:  # keep half alive, let the other half expire
            await s.sendto(b"\x02\x00\x00\x00", daemon)
            await recv(s)
        await trio.sleep(5.5)  # ttl 10 s + one activity check (1 s) after the silent half's last word
        assert len(d.core.table) == 20
        late = [client() for _ in range(5)]
        for s in late:
            await s.sendto(b"\x02\x00\x00\x00", daemon)
            await recv(s)
        sender = socks[25]
        await sender.sendto(TQR, daemon)
        for s in socks[20:] + late:
            if s is not sender:
                assert (await recv(s))[0] == TQR
        for s in socks[:20]:
            assert await nothing(s, 0.05)  # expired clients get nothing
        n.cancel_scope.cancel()


# ------------------------------------------------------- spoofed sources (raw sockets)


def spoof(payload: bytes, src: tuple[str, int], dst: tuple[str, int]) -> None:
    """Send one UDP datagram on loopback with a forged source (root: raw socket)."""
    import struct

    udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(payload), 0) + payload  # checksum 0: none
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, socket.IPPROTO_UDP, 0,
                     socket.inet_aton(src[0]), socket.inet_aton(dst[0]))
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as s:
        s.sendto(ip + udp, (dst[0], 0))


async def test_spoofed_own_address_does_not_register():
    async with trio.open_nursery() as n:
        d, daemon = await start(n)
        spoof(b"\x02\x00\x00\x00", daemon, daemon)
        spoof(TQR, daemon, daemon)
        spoof(b"\x00\x00\x00\x00", ("127.0.0.1", 14999), daemon)  # reply-shaped
        c = client()
        await c.sendto(b"\x02\x00\x00\x00", daemon)
        await recv(c)
        assert [cl.addr for cl in d.core.table] == [c.getsockname()]
        assert d.core.counters.drops["own_address"] == 2 and d.core.counters.drops["reply_shaped"] == 1
        n.cancel_scope.cancel()


@pytest.mark.parametrize("kind", ["keepalive", "tir"])
async def test_three_daemons_spoofed_into_a_ring_do_not_loop(kind):
    """The attack: spoofed datagrams to A "from" B, to B "from" C, to C "from" A
    would make three lbmrds clients of each other; one TIR from a client would
    then circulate for ever."""
    async with trio.open_nursery() as n:
        daemons = []
        for ip in ("127.0.0.1", "127.0.0.2", "127.0.0.3"):
            d = Daemon(Settings(bind_ip=ip, port=0, stats_interval=0))
            daemons.append((d, await n.start(d.run)))
        (a, da), (b, db), (c, dc) = daemons
        bait = b"\x02\x00\x00\x00" if kind == "keepalive" else tir("10.6.6.6", 1, "bait")
        for frm, to in ((db, da), (dc, db), (da, dc)):
            spoof(bait, frm, to)
        await trio.sleep(0.2)
        x = client("127.0.1.1")
        await x.sendto(b"\x02\x00\x00\x00", da)
        await recv(x)
        await x.sendto(tir("127.0.1.1", 14371, "md.ring"), da)
        back = 0
        with trio.move_on_after(1.0):
            while True:
                data, _ = await x.recvfrom(65535)
                back += data != b"\x00\x00\x00\x00"
        assert back == 0  # the sender never gets its own TIR back
        total = sum(d.core.counters.tx for d, _ in daemons)
        assert total < 20, total  # a ring would have sent thousands by now
        for d, addr in daemons:
            assert d.core.table.get(addr) is None
        n.cancel_scope.cancel()
