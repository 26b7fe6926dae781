"""LBT-RM streams from a hostile peer (in process, on loopback): a router
accepts one LBT-RM stream per advertisement of an LBT-RM source and refuses
the rest (a second one, one for a TCP source, more than its limit), drops
what is not a NAK, and passes NAKs to the source rewritten for its session;
a flood of datagrams is bounded. The far side only joins a group here (it
sends no multicast: that is tested in namespaces, tests/router/system/test_lbtrm_netns.py)."""

from __future__ import annotations

import trio

import lbmr_proto as L
from lbmr_proto import lbtrm as RM
from router import peerlink as P
from router.peerlink import streams as S
from tests.router.helpers import acceptor_router, connect_as_peer, start_lbmrd, udp

RM_TOPIC, TCP_TOPIC = "md.rm.evil", "md.tcp.evil"
GROUP, DPORT, SESSION = "239.255.77.1", 14777, 0xABCD1234


async def advertise(nursery, trd, tirs):
    pkt = L.encode(L.Packet(0, 1, tirs=tirs))
    ctx = udp("127.0.2.6")

    async def adv():
        while True:
            await ctx.sendto(pkt, trd)
            await trio.sleep(0.2)

    nursery.start_soon(adv)


class Evil:
    """The hostile peer's side of the link: its connection and stream table."""

    def __init__(self, stream, conn):
        self.stream, self.conn = stream, conn
        self.table = S.StreamTable("initiator", kinds=tuple(P.StreamKind))
        self.adverts: dict[str, int] = {}
        self.events: list = []

    async def send(self, *frames):
        now = trio.current_time()
        await self.stream.send_all(b"".join(self.conn.send(f, now) for f in frames))

    async def flush(self):
        await self.send(*self.table.frames_to_send())

    async def pump(self, until, timeout=10.0):
        with trio.fail_after(timeout):
            while not until():
                for it in self.conn.receive_data(await self.stream.receive_some(65536), trio.current_time()):
                    if isinstance(it, P.Advertisement) and not it.withdraw:
                        self.adverts[it.topic] = it.advert_id
                    elif isinstance(it, S.STREAM_FRAMES):
                        self.events += self.table.receive(it)
                out = self.conn.data_to_send()
                if out:
                    await self.stream.send_all(out)
                await self.flush()

    def answered(self, sid):
        return [e for e in self.events if e.stream_id == sid and isinstance(e, S.StreamAccepted | S.StreamRefused)]


async def test_hostile_peer_lbtrm_streams_are_bounded_and_only_naks_reach_the_source():
    async with trio.open_nursery() as n:
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        rb = acceptor_router(trd2)
        addr = await n.start(rb.run)
        nak_sock = udp("127.0.2.5")  # the LBT-RM source's unicast (NAK) port
        sip, sport = nak_sock.getsockname()
        await advertise(n, trd2, [
            L.TIR(RM_TOPIC, L.LbtrmTransport(sip, GROUP, SESSION, DPORT, sport), 60, 1),
            L.TIR(TCP_TOPIC, L.TcpTransport(sip, 9), 60, 2)])
        evil = Evil(*await connect_as_peer(addr["peer"]))
        await evil.send(P.Interest(P.InterestAction.ADD, RM_TOPIC, 1, P.PatternType.TOPIC),
                        P.Interest(P.InterestAction.ADD, TCP_TOPIC, 1, P.PatternType.TOPIC))
        await evil.pump(lambda: len(evil.adverts) == 2)
        rm_aid, tcp_aid = evil.adverts[RM_TOPIC], evil.adverts[TCP_TOPIC]
        first = evil.table.open(rm_aid, P.StreamKind.LBTRM)
        second = evil.table.open(rm_aid, P.StreamKind.LBTRM)
        wrong = evil.table.open(tcp_aid, P.StreamKind.LBTRM)
        await evil.flush()
        await evil.pump(lambda: all(evil.answered(s) for s in (first, second, wrong)))
        assert isinstance(evil.answered(first)[0], S.StreamAccepted)
        for sid, code in ((second, P.RefuseCode.TOO_MANY_STREAMS), (wrong, P.RefuseCode.UNSUPPORTED_KIND)):
            (ev,) = evil.answered(sid)
            assert isinstance(ev, S.StreamRefused) and ev.code == code, ev
        # junk, a DATA and a flood on the accepted stream; one real NAK among them
        junk = [b"", b"\x03", b"LBMR" * 10, RM.encode_data(1, 2, 3, 4, b"data"), RM.encode_sm(1, 2, 3, 4, 5)]
        for d in junk + [b"\xff" * 1400] * 20_000:
            evil.table.send_datagram(first, d)
        evil.table.send_datagram(first, RM.encode_nak(4242, 0x77, [5, 6, 7]))
        await evil.flush()
        with trio.fail_after(10):
            data, src = await nak_sock.recvfrom(65535)
        assert src[0] == "127.0.2.1"  # from the router's relay address
        assert RM.decode(data) == RM.Nak(RM.Header(RM.NAK, sport, SESSION), (5, 6, 7))
        c = rb.counters
        assert c["lbtrm_streams_accepted"] == 1 and c["lbtrm_streams_refused"] == 2, c
        assert c["lbtrm_naks_to_source"] == 1, c
        assert c["lbtrm_malformed"] + c["lbtrm_unexpected_type"] + c["lbtrm_queue_full"] == len(junk) + 20_000, c
        with trio.move_on_after(0.2):
            await nak_sock.recvfrom(65535)
            raise AssertionError("only the NAK may reach the source")
        assert rb.status()["peer"]["state"] == "CONNECTED"  # the link lives on
        n.cancel_scope.cancel()


async def test_far_side_stream_limit_per_link():
    async with trio.open_nursery() as n:
        _, trd2 = await start_lbmrd(n, "127.0.2.1")
        rb = acceptor_router(trd2)
        addr = await n.start(rb.run)
        rb.relay.lbtrm.max_streams = 2
        topics = [f"md.rm.limit.{i}" for i in range(3)]
        await advertise(n, trd2, [L.TIR(t, L.LbtrmTransport("127.0.2.5", GROUP, i + 1, DPORT, 9), 60, i + 1)
                                  for i, t in enumerate(topics)])
        evil = Evil(*await connect_as_peer(addr["peer"]))
        await evil.send(*(P.Interest(P.InterestAction.ADD, t, 1, P.PatternType.TOPIC) for t in topics))
        await evil.pump(lambda: len(evil.adverts) == 3)
        sids = [evil.table.open(evil.adverts[t], P.StreamKind.LBTRM) for t in topics]
        await evil.flush()
        await evil.pump(lambda: all(evil.answered(s) for s in sids))
        kinds = [type(evil.answered(s)[0]) for s in sids]
        assert kinds == [S.StreamAccepted, S.StreamAccepted, S.StreamRefused], kinds
        # closing one frees its place
        evil.table.close(sids[0])
        await evil.flush()
        with trio.fail_after(10):
            while rb.counters["lbtrm_streams_ended"] < 1:
                await trio.sleep(0.01)
        again = evil.table.open(evil.adverts[topics[2]], P.StreamKind.LBTRM)
        await evil.flush()
        await evil.pump(lambda: evil.answered(again))
        assert isinstance(evil.answered(again)[0], S.StreamAccepted)
        n.cancel_scope.cancel()
