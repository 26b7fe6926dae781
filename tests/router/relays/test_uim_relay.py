"""A sender's connection to a request listener (router/relays/uim.py,
``UimRelay.serve_connection``) on trio's virtual clock, over an in-memory
stream: an endless message is cut MESSAGE_TIMEOUT seconds after its first
byte however slowly it trickles, a silent connection after IDLE_TIMEOUT, and
a sender that keeps completing messages is never cut."""

from __future__ import annotations

import trio
import trio.testing

from router.core.uim import RecoverMessage, UimPath
from router.relays import uim as U
from router.relays import uim_targets as UT
from tests.router.system.uim_apps import uim

MSG = uim(1, (2, "10.2.0.9", 15000), (1, "10.1.0.9", 15001), size=1000)


def relay():
    events = []
    r = U.UimRelay(UimPath({}, None), {}, {}, None, lambda kind, detail: events.append(kind))
    return r, events


async def serve(r, fn):
    """Run ``fn(client)`` against ``r.serve_connection``; (when the connection ended, how)."""
    client, server = trio.testing.memory_stream_pair()
    ended = {}

    async def run_server():
        await r.serve_connection(server, "ep")
        ended["at"] = trio.current_time()

    async with trio.open_nursery() as n:
        n.start_soon(run_server)
        await fn(client)
        with trio.fail_after(1000):
            while "at" not in ended:
                await trio.sleep(0.5)
        n.cancel_scope.cancel()
    return ended["at"]


async def test_an_endless_message_is_cut_after_the_message_timeout(autojump_clock):
    r, _ = relay()
    t0 = trio.current_time()

    async def trickle(client):
        await client.send_all(MSG[:100])
        for b in MSG[100:200]:  # a byte a second: never complete in time
            await trio.sleep(1.0)
            try:
                await client.send_all(bytes([b]))
            except trio.BrokenResourceError:
                return
    at = await serve(r, trickle)
    assert U.MESSAGE_TIMEOUT <= at - t0 < U.MESSAGE_TIMEOUT + 1.5
    assert r.counters["uim_message_timeout"] == 1 and r.counters["uim_in"] == 0


async def test_a_silent_connection_is_closed_after_the_idle_timeout(autojump_clock):
    r, _ = relay()
    t0 = trio.current_time()

    async def silent(client):
        pass
    at = await serve(r, silent)
    assert U.IDLE_TIMEOUT <= at - t0 < U.IDLE_TIMEOUT + 1.0
    assert r.counters["uim_connections_idle"] == 1


async def test_completed_messages_start_the_clock_again(autojump_clock):
    """A message is complete every 0.8 timeouts, the next one started with it: the
    connection lives on; then the sender closes."""
    r, _ = relay()

    async def steady(client):
        await client.send_all(MSG[:50])
        for _ in range(5):
            await trio.sleep(U.MESSAGE_TIMEOUT * 0.8)
            await client.send_all(MSG[50:] + MSG[:50])
        await client.send_all(MSG[50:])
        await client.aclose()
    await serve(r, steady)
    assert r.counters["uim_in"] == 6 and r.counters["uim_message_timeout"] == 0
    assert r.counters["uim_unreachable"] == 6  # (no routes here)


async def test_garbage_and_a_cut_message_are_counted(autojump_clock):
    r, events = relay()

    async def garbage(client):
        await client.send_all(MSG + MSG[:500])  # a whole message, the start of the next
        await trio.sleep(1.0)
        await client.send_all(MSG[500:] + MSG + b"\xff" * 8)  # its end, one more, garbage
    await serve(r, garbage)
    # the messages before the garbage are taken, also those its read completed
    assert r.counters["uim_in"] == 3 and r.counters["uim_malformed"] == 1 and "uim_malformed" in events
    r2, _ = relay()

    async def cut(client):
        await client.send_all(MSG[:-1])
        await client.aclose()
    await serve(r2, cut)
    assert r2.counters["uim_truncated"] == 1


async def test_when_all_destinations_are_taken_the_least_recently_used_idle_one_makes_room(monkeypatch):
    """Destinations in our TRD (a served domain): with MAX_TARGETS 2, a third one closes
    the least recently used one with nothing queued, counted."""
    monkeypatch.setattr(UT, "MAX_TARGETS", 2)
    events = []
    r = U.UimRelay(UimPath({"ep": (2, "127.0.0.1")}, None), {"ep": "127.0.0.1"}, {}, None,
                   lambda kind, detail: events.append(kind))
    inbox = []

    async def take_all(stream):
        async with stream:
            while data := await stream.receive_some(65536):
                inbox.append(data)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    def to(p, seq=1):
        return r.path.message(uim(seq, (2, "127.0.0.1", p), (1, "10.1.0.9", 15001)))
    async with trio.open_nursery() as n:
        r.nursery = n
        n.start_soon(trio.serve_listeners, take_all, listeners)
        r.take(to(port))
        await trio.sleep(0.2)
        r.take(to(port + 1))  # (nobody there: down, idle)
        await trio.sleep(0.2)
        r.take(to(port))  # the first is the most recently used now
        await trio.sleep(0.2)
        r.take(to(port + 2))  # evicts port + 1
        assert r.counters["uim_targets_evicted"] == 1 and r.target_count == 2
        assert r.counters["uim_delivered"] == 2
        n.cancel_scope.cancel()


async def test_late_join_destinations_take_only_their_share_of_the_destinations(monkeypatch, autojump_clock):
    """Late-join/OTR destinations (one per receiver address and proxy) hold a RECOVERY
    stream that is never evicted while open: a sender naming many receiver addresses gets
    at most MAX_RECOVERY_TARGETS of them (counted), and deliveries keep their room."""
    monkeypatch.setattr(UT, "MAX_TARGETS", 4)
    monkeypatch.setattr(UT, "MAX_RECOVERY_TARGETS", 2)
    r = U.UimRelay(UimPath({"ep": (2, "127.0.0.1")}, None), {"ep": "127.0.0.1"}, {}, None, lambda kind, detail: None)
    async with trio.open_nursery() as n:
        r.nursery = n
        for port in range(15000, 15005):  # five receivers' addresses, one proxy (link "l1", advert 7)
            r.take(RecoverMessage("ep", "l1", 7, "127.0.0.1", port, MSG))
        await trio.sleep(0.1)
        assert r.recovering == 2 and r.target_count == 2 and r.counters["recovery_targets_full"] == 3
        r.take(r.path.message(uim(1, (2, "127.0.0.1", 9), (1, "10.1.0.9", 15001))))
        r.take(r.path.message(uim(2, (2, "127.0.0.1", 10), (1, "10.1.0.9", 15001))))
        assert r.target_count == 4 and r.counters["uim_targets_full"] == 0
        await trio.sleep(UT.TARGET_IDLE + 1)  # all idle: they close, and the count with them
        assert r.recovering == 0 and r.target_count == 0
        n.cancel_scope.cancel()
