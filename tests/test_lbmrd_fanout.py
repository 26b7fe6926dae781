"""lbmrd.fanout: the receive batches and the outbox that sends the copies
of many small relays in one sendmmsg call, on real UDP sockets on
127.0.0.1."""

from __future__ import annotations

import gc
import socket

import trio

import lbmr_proto as L
from lbmrd.clients import ClientTable
from lbmrd.fanout import BatchReceiver, Outbox
from lbmrd.server import Daemon, Settings

KEEPALIVE = b"\x02\x00\x00\x00"


def udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(5.0)
    return s


def drain(s: socket.socket) -> list[bytes]:
    """Everything waiting on ``s`` (each datagram's bytes)."""
    s.setblocking(False)
    out = []
    try:
        while True:
            out.append(s.recv(65535))
    except BlockingIOError:
        pass
    s.settimeout(5.0)
    return out


def wait_for(socks: list[socket.socket], n: int) -> dict[int, list[bytes]]:
    """Per socket index, the datagrams it received, once each has ``n``
    (bounded: each recv waits at most 5 s)."""
    got = {}
    for i, s in enumerate(socks):
        data = [s.recv(65535) for _ in range(n)]
        got[i] = data + drain(s)
    return got


def register(socks: list[socket.socket], addr: tuple[str, int]) -> None:
    for s in socks:
        s.sendto(KEEPALIVE, addr)
        assert s.recv(16) == b"\x00\x00\x00\x00"


def one_group(n: int) -> tuple[ClientTable, list[socket.socket], list, socket.socket]:
    """A client table of ``n`` clients (real sockets) in one group, and a socket to send from."""
    table = ClientTable()
    socks = [udp() for _ in range(n)]
    clients = [table.register(s.getsockname(), 0.0, None) for s in socks]
    return table, socks, clients, udp()


def test_outbox_sends_each_payload_to_its_group_but_the_sender():
    table, socks, clients, sender = one_group(5)
    group = clients[0].group
    try:
        box = Outbox(sender.fileno())
        payloads = [f"payload-{i}".encode() * 3 for i in range(5)]
        for i, p in enumerate(payloads):
            assert box.add([(p, group)], clients[i])  # everyone but client i
        assert box.count == 5 * 4
        sent, nbytes, err = box.send()
        assert (sent, nbytes, err) == (20, 4 * sum(map(len, payloads)), None)
        assert box.count == box.pending == 0
        got = wait_for(socks, 4)
        for i in range(5):
            assert sorted(got[i]) == sorted(p for j, p in enumerate(payloads) if j != i)
    finally:
        for s in socks + [sender]:
            s.close()


def test_outbox_keeps_what_it_queued_when_the_group_changes_and_payloads_are_dropped():
    table, socks, clients, sender = one_group(3)
    socks.append(udp())  # not a client yet
    group = clients[0].group
    try:
        box = Outbox(sender.fileno())
        payload = bytes(bytearray(b"kept alive by the outbox"))  # a fresh object, only referenced here
        assert box.add([(payload, group)], clients[1])
        del payload
        gc.collect()
        group.move_to_end(clients[0])  # positions change...
        table.remove(clients[2])  # ...a member leaves...
        table.register(socks[3].getsockname(), 0.0, None)  # ...and one joins, before the send
        assert box.send() == (2, 2 * len(b"kept alive by the outbox"), None)
        assert socks[0].recv(100) == socks[2].recv(100) == b"kept alive by the outbox"
        assert drain(socks[1]) == drain(socks[3]) == []
    finally:
        for s in socks + [sender]:
            s.close()


def test_outbox_refuses_what_does_not_fit():
    table, socks, clients, sender = one_group(3)
    try:
        box = Outbox(sender.fileno(), cap=5)
        group = clients[0].group
        assert box.add([(b"a", group)])  # 3 messages
        assert not box.add([(b"b", group)])  # 3 more do not fit: nothing queued
        assert not box.add([(b"c", group), (b"d", group)], clients[0])  # 2 + 2 do not fit either
        assert box.count == 3 and box.add([(b"e", group)], clients[0])  # 2 do
        assert box.send() == (5, 5, None)
        assert sorted(drain(socks[0])) == [b"a"] and sorted(drain(socks[1])) == [b"a", b"e"]
        box.clear()
        assert box.count == 0
    finally:
        for s in socks + [sender]:
            s.close()


def test_batch_receiver_reads_what_the_socket_holds_in_one_call():
    rx_sock = udp()
    senders = [udp() for _ in range(3)]
    try:
        rx_sock.setblocking(False)
        rx = BatchReceiver(rx_sock, batch=8)
        assert rx.receive() == []
        expected = []
        for round_ in range(3):  # the message headers are reused from call to call
            for i, s in enumerate(senders):
                for k in range(3):
                    data = bytes([round_, i, k]) * (1 + 50 * k)
                    s.sendto(data, rx_sock.getsockname())
                    expected.append((data, s.getsockname()))
        got = []
        while True:
            batch = rx.receive()
            if not batch:
                break
            assert len(batch) <= 8
            got += batch
        assert got == expected
    finally:
        for s in senders + [rx_sock]:
            s.close()


async def test_datagrams_of_one_batch_from_several_senders_each_skip_their_sender():
    """Several clients' queries land in one received batch: each client gets
    every other client's query once and never its own."""
    d = Daemon(Settings(bind_ip="127.0.0.1", port=0, stats_interval=0))
    socks = [udp() for _ in range(6)]
    queries = [L.encode(L.Packet(0, 1, tqrs=[L.TQR(f"batch.q{i}")])) for i in range(len(socks))]
    async with trio.open_nursery() as n:
        addr = await n.start(d.run)
        with trio.fail_after(20):
            await trio.to_thread.run_sync(register, socks, addr)
            # no checkpoint between these sends: the daemon reads them in one batch
            for s, q in zip(socks, queries, strict=True):
                s.sendto(q, addr)
            got = await trio.to_thread.run_sync(wait_for, socks, len(socks) - 1)
        n.cancel_scope.cancel()
    for i, s in enumerate(socks):
        assert sorted(got[i]) == sorted(q for j, q in enumerate(queries) if j != i)
        s.close()
    c = d.core.counters
    assert c.relayed == len(socks) and c.tx == len(socks) + len(socks) * (len(socks) - 1)
