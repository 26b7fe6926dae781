"""lbmrd's sans-IO relay core: client table, relay decisions, fill-in, limits."""

from __future__ import annotations

import pytest

import lbmr_proto as L
from lbmrd.clients import ClientTable
from lbmrd.relay import Drop, Quiet, Relay, RelayCore, Reply

A = ("10.0.0.1", 14402)
B = ("10.0.0.2", 14402)
C = ("10.0.0.3", 14403)
TQR = L.encode(L.Packet(0, 1, tqrs=[L.TQR("md.X")]))


def tir_packet(ip="0.0.0.0", port=14371, topic="md.X", options=None):
    return L.encode(L.Packet(0, 1, tirs=[L.TIR(topic, L.TcpTransport(ip, port), 16, 1, options)]))


def dests(d: Relay) -> list[tuple[bytes, list]]:
    """(payload, [addr...]) as the shell would send, sender excluded."""
    return [(p, sorted(c.addr for c in g.members if c is not d.sender)) for p, g in d.parts]


def test_keepalives_register_and_get_a_normal_reply():
    core = RelayCore()
    for t in (2, 3):
        d = core.handle(bytes((t, 0, 0, 0)), A, 0.0)
        assert d == Reply(b"\x00\x00\x00\x00")
    d = core.handle(bytes((0x12, 0, 0, 0)), B, 0.0)  # version 1 receiver alive
    assert d == Reply(b"\x10\x00\x00\x00")
    # a NORMAL packet with no records but packet options registers, and is not relayed
    opts_only = L.encode(L.Packet(0, 1, options=[L.SourceTypeOption(0x80, L.SourceType.APPLICATION)]))
    assert isinstance(core.handle(opts_only, C, 0.0), Quiet)
    assert len(core.table) == 3 and core.counters.clients_added == 3
    assert core.counters.rx == {"RCV_ALIVE": 2, "SRC_ALIVE": 1, "NORMAL": 1}


def test_relay_goes_to_every_other_client_unchanged():
    core = RelayCore()
    for a in (A, B, C):
        core.handle(b"\x02\x00\x00\x00", a, 0.0)
    d = core.handle(TQR, A, 1.0)
    assert isinstance(d, Relay) and d.sender.addr == A
    assert dests(d) == [(TQR, [B, C])]
    assert d.parts[0][0] is TQR  # one shared buffer, no copy


def test_malformed_is_dropped_and_does_not_register():
    core = RelayCore()
    for bad in (b"", b"\x05\x00\x00\x00", b"\x00\x01\x00\x00abc", TQR + b"x"):
        assert core.handle(bad, A, 0.0) == Drop("malformed")
    assert len(core.table) == 0 and core.counters.drops["malformed"] == 4
    assert [e[1] for e in core.events] == ["malformed"] * 4


def test_fill_in_replaces_zero_addresses_with_the_sender():
    core = RelayCore()
    core.handle(b"\x02\x00\x00\x00", B, 0.0)
    opts = [L.ExFuncOption(0x8000, 14391, 0, "0.0.0.0", 1), L.UmeOption(0, 1, 2, "10.9.9.9", "0.0.0.0")]
    d = core.handle(tir_packet(options=opts), A, 0.0)
    (payload, to), = dests(d)
    assert to == [B]
    tir = L.decode(payload).tirs[0]
    assert tir.transport.ip == "10.0.0.1" and tir.transport.port == 14371
    assert tir.options[0].src_ip_addr == "10.0.0.1"
    assert tir.options[1].src_tcp_addr == "10.0.0.1" and tir.options[1].store_tcp_addr == "10.9.9.9"
    assert core.counters.fillins == 3
    # a real address is left alone and the buffer is shared
    data = tir_packet("192.168.5.5")
    d = core.handle(data, A, 0.0)
    assert d.parts[0][0] is data


def test_lbtrm_fill_in_never_touches_the_group():
    core = RelayCore()
    core.handle(b"\x02\x00\x00\x00", B, 0.0)
    data = L.encode(L.Packet(0, tirs=[L.TIR("t", L.LbtrmTransport("0.0.0.0", "239.1.1.1", 5, 14400, 14390))]))
    (payload, _), = dests(core.handle(data, A, 0.0))
    t = L.decode(payload).tirs[0].transport
    assert (t.ip, t.mcast_group, t.src_ucast_port) == ("10.0.0.1", "239.1.1.1", 14390)


def test_expiry_after_ttl():
    core = RelayCore(ttl=60)
    core.handle(b"\x02\x00\x00\x00", A, 0.0)
    core.handle(b"\x02\x00\x00\x00", B, 30.0)
    assert core.expire(59.0) == []
    core.handle(TQR, A, 59.5)  # any valid datagram refreshes
    assert [c.addr for c in core.expire(90.5)] == [B]
    assert [c.addr for c in core.table] == [A]
    assert core.counters.clients_expired == 1
    assert [c.addr for c in core.expire(120.0)] == [A]
    assert len(core.table) == 0 and core.table.groups == {}


def test_max_clients_refuses_new_and_keeps_old():
    core = RelayCore(max_clients=2)
    core.handle(TQR, A, 0.0)
    core.handle(TQR, B, 0.0)
    assert core.handle(TQR, C, 0.0) == Drop("table_full")
    assert {c.addr for c in core.table} == {A, B}
    assert isinstance(core.handle(TQR, A, 1.0), Relay)
    assert core.counters.drops["table_full"] == 1


def test_allow_list():
    core = RelayCore(allow=["10.0.0.0/31"])
    assert isinstance(core.handle(TQR, A, 0.0), Relay)
    assert core.handle(TQR, B, 0.0) == Drop("denied")
    assert len(core.table) == 1


def test_rate_limit_token_bucket():
    core = RelayCore(rate=10.0, burst=3)
    got = [core.handle(TQR, A, 0.0) for _ in range(5)]
    assert [type(g).__name__ for g in got] == ["Relay", "Relay", "Relay", "Drop", "Drop"]
    assert isinstance(core.handle(TQR, A, 0.1), Relay)  # one token back after 100 ms
    assert core.handle(TQR, A, 0.1) == Drop("rate_limited")
    assert core.counters.drops["rate_limited"] == 3


def test_snapshot_and_events_ring_is_bounded():
    core = RelayCore(events=5)
    for i in range(20):
        core.handle(b"\x02\x00\x00\x00", (f"10.0.1.{i}", 14402), float(i))
    snap = core.snapshot(20.0)
    assert len(snap["clients"]) == 20 and len(snap["events"]) == 5
    assert snap["events"][-1]["detail"].startswith("10.0.1.19:14402")
    assert snap["counters"]["clients_added"] == 20


def test_client_table_remove_keeps_dense_groups():
    t = ClientTable(ttl=10)
    cs = [t.register((f"10.0.0.{i}", 1), 0.0, None) for i in range(5)]
    g = t.groups[None]
    v = g.version
    t.remove(cs[1])
    assert [c.addr[0] for c in g.members] == ["10.0.0.0", "10.0.0.4", "10.0.0.2", "10.0.0.3"]
    assert all(c.pos == i for i, c in enumerate(g.members)) and g.version != v
    with pytest.raises(KeyError):
        t.remove(cs[1])


def test_rate_and_burst_are_validated():
    with pytest.raises(ValueError):
        RelayCore(rate=0)
    with pytest.raises(ValueError):
        RelayCore(rate=5, burst=0.5)
    core = RelayCore(rate=0.4)  # a slow rate still lets one datagram through (burst >= 1)
    assert isinstance(core.handle(TQR, A, 0.0), Relay)
    assert core.handle(TQR, A, 1.0) == Drop("rate_limited")
    assert isinstance(core.handle(TQR, A, 3.0), Relay)


def test_dirty_marks_stay_bounded_without_a_syncing_sender():
    t = ClientTable(ttl=10)
    cs = [t.register((f"10.0.0.{i}", 1), 0.0, None) for i in range(3)]
    g = t.groups[None]
    for i in range(100_000):
        g.move_to_end(cs[i % 3])
    assert len(g.dirty) <= 4098


def test_snapshot_caps_the_client_list():
    core = RelayCore()
    for i in range(1500):
        core.handle(b"\x02\x00\x00\x00", (f"10.1.{i >> 8}.{i & 255}", 14402), 0.0)
    snap = core.snapshot(1.0)
    assert snap["clients_total"] == 1500 and len(snap["clients"]) == 1000


# ----------------------------------------------------------- spoofed sources

D1, D2, D3 = ("127.0.0.1", 15380), ("127.0.0.2", 15380), ("127.0.0.3", 15380)


def test_own_address_never_registers():
    core = RelayCore()
    core.set_own_addresses(["127.0.0.1"], 15380)
    assert core.handle(b"\x02\x00\x00\x00", D1, 0.0) == Drop("own_address")
    assert core.handle(TQR, D1, 0.0) == Drop("own_address")
    assert isinstance(core.handle(b"\x02\x00\x00\x00", ("127.0.0.1", 14402), 0.0), Reply)  # other port
    assert len(core.table) == 1 and core.counters.drops["own_address"] == 2
    # bound to 0.0.0.0: every loopback address with our port is ours too
    core = RelayCore()
    core.set_own_addresses(["10.0.0.9"], 15380, any_address=True)
    for addr in (("10.0.0.9", 15380), ("127.0.0.7", 15380)):
        assert core.handle(b"\x02\x00\x00\x00", addr, 0.0) == Drop("own_address")
    assert len(core.table) == 0


def test_reply_shaped_datagram_never_registers_and_marks_a_daemon():
    core = RelayCore(ttl=60)
    assert core.handle(b"\x10\x00\x00\x00", D2, 0.0) == Drop("reply_shaped")
    assert len(core.table) == 0 and core.suspected_daemons == [D2]
    # the suspected daemon's relays are not taken while the mark lasts (ttl seconds)
    assert core.handle(TQR, D2, 1.0) == Drop("suspected_daemon")
    assert core.handle(TQR, D2, 59.0) == Drop("suspected_daemon")
    assert isinstance(core.handle(TQR, D2, 61.0), Relay)
    # a keepalive (which no daemon sends) clears the mark at once: a forged reply
    # cannot lock a client out for longer than its keepalive interval
    core.handle(b"\x00\x00\x00\x00", D3, 70.0)
    assert core.handle(TQR, D3, 70.1) == Drop("suspected_daemon")
    assert isinstance(core.handle(b"\x02\x00\x00\x00", D3, 70.2), Reply)
    assert core.table.get(D3) is not None
    # a registered client is never marked (a spoofed reply cannot evict it)
    core.handle(b"\x02\x00\x00\x00", A, 0.0)
    assert core.handle(b"\x00\x00\x00\x00", A, 1.0) == Drop("reply_shaped")
    assert core.table.get(A) is not None and A not in core.suspected_daemons
    assert [e[1] for e in core.events].count("suspected_daemon") == 2


def test_suspects_are_bounded():
    core = RelayCore()
    for i in range(10_000):
        core.handle(b"\x00\x00\x00\x00", (f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}", 15380), 0.0)
    assert len(core.suspected_daemons) <= 4096


def test_peer_daemon_deny_list():
    core = RelayCore(peer_daemons=[("127.0.0.2/32", 15380), ("10.5.0.0/16", None)])
    assert core.handle(TQR, D2, 0.0) == Drop("peer_daemon")
    assert core.handle(b"\x02\x00\x00\x00", ("10.5.3.3", 1234), 0.0) == Drop("peer_daemon")
    assert isinstance(core.handle(b"\x02\x00\x00\x00", ("127.0.0.2", 14402), 0.0), Reply)
    assert len(core.table) == 1


def test_a_relayed_datagram_coming_back_is_a_loop():
    core = RelayCore()
    core.handle(b"\x02\x00\x00\x00", B, 0.0)
    data = tir_packet()
    d = core.handle(data, A, 0.0)
    (payload, _), = dests(d)  # filled in with A's address
    assert core.handle(payload, B, 0.1) == Drop("loop")
    assert core.handle(data, B, 0.1) is not None  # the raw bytes are new: relayed
    # the original sender re-sending the same bytes is UM's normal advertising
    assert isinstance(core.handle(data, A, 0.2), Relay)
    # after the window the same bytes from someone else are relayed
    assert isinstance(core.handle(payload, B, 5.0), Relay)
    assert core.counters.drops["loop"] == 1


def _ring(spoof_kind: bytes, payload: bytes | None = None, configs=None) -> tuple[dict, int, int]:
    """Three daemons made clients of each other by spoofed datagrams, then one
    TIR (or ``payload``) from a client of the first: deliveries run until
    quiet (bounded)."""
    cores = {}
    for i, addr in enumerate((D1, D2, D3)):
        c = RelayCore(configs[i] if configs else None)
        c.set_own_addresses([addr[0]], addr[1])
        cores[addr] = c
    X = ("127.0.1.1", 14402)
    queue = [(spoof_kind, D2, D1), (spoof_kind, D3, D2), (spoof_kind, D1, D3),  # (data, "from", to)
             (b"\x02\x00\x00\x00", X, D1)]
    to_x = deliveries = 0
    t = 0.0
    while queue and deliveries < 10_000:
        data, src, dst = queue.pop(0)
        deliveries += 1
        if dst not in cores:
            to_x += dst == X and data != b"\x00\x00\x00\x00"
            continue
        t += 0.0001
        d = cores[dst].handle(data, src, t)
        if isinstance(d, Reply):
            queue.append((d.payload, dst, src))
        elif isinstance(d, Relay):
            for p, g in d.parts:
                queue += [(p, dst, m.addr) for m in g.members if m is not d.sender]
        if src == X and data[0] == 2:  # X advertises (or queries) once registered
            queue.append((payload or tir_packet("127.0.1.1"), X, D1))
    return cores, deliveries, to_x


@pytest.mark.parametrize("spoof", [b"\x02\x00\x00\x00", tir_packet("10.66.6.6", topic="spoof")])
def test_spoofed_ring_of_three_daemons_does_not_loop(spoof):
    cores, deliveries, to_x = _ring(spoof)
    assert deliveries < 100  # finite: the queue emptied
    assert to_x == 0  # the sender never gets its own TIR back
    for addr, core in cores.items():
        assert core.table.get(addr) is None  # nobody is its own client


def test_ip_rate_limit_covers_every_port_of_an_address():
    core = RelayCore(rate=100.0, ip_rate=10.0, ip_burst=3)
    got = [core.handle(b"\x02\x00\x00\x00", ("10.0.0.1", 20000 + i), 0.0) for i in range(6)]
    assert [type(g).__name__ for g in got] == ["Reply"] * 3 + ["Drop"] * 3
    assert core.counters.drops["ip_rate_limited"] == 3
    assert len(core.table) == 3  # refused datagrams register nobody
    assert isinstance(core.handle(b"\x02\x00\x00\x00", ("10.0.0.2", 1), 0.0), Reply)  # other address
    assert isinstance(core.handle(b"\x02\x00\x00\x00", ("10.0.0.1", 20000), 0.1), Reply)


def test_ip_buckets_are_forgotten_when_full_again():
    core = RelayCore(ip_rate=10.0)
    for i in range(100):
        core.handle(b"\x02\x00\x00\x00", (f"10.0.1.{i}", 1), 0.0)
    assert len(core._ip_buckets) == 100
    core.expire(0.05)  # a finished sweep drops buckets that have refilled
    assert len(core._ip_buckets) == 100
    core.expire(1.0)
    assert len(core._ip_buckets) == 0


def test_expiry_sweep_in_slices():
    core = RelayCore(ttl=10)
    for i in range(1000):
        core.handle(b"\x02\x00\x00\x00", (f"10.0.{i >> 8}.{i & 255}", 1), 0.0)
    sweep = core.table.sweep(20.0)
    dead = core.expire_step(sweep, 300, 20.0)
    assert len(dead) == 300 and not sweep.done and len(core.table) == 700
    # a client heard from between two slices survives the sweep
    survivor = next(iter(core.table)).addr
    core.handle(b"\x02\x00\x00\x00", survivor, 20.5)
    while not sweep.done:
        core.expire_step(sweep, 300, 21.0)
    assert [c.addr for c in core.table] == [survivor]
    assert core.counters.clients_expired == 999


def test_a_query_ring_dies_within_a_few_rounds():
    cores, deliveries, to_x = _ring(tir_packet("10.66.6.6", topic="spoof"), TQR)
    assert deliveries < 200 and to_x <= 8
    assert sum(c.counters.drops["loop"] for c in cores.values()) >= 1


def test_nat_rules_in_a_cycle_do_not_make_a_loop():
    """Each daemon's rules rewrite the advertised address one step further
    round a cycle (127.0.1.1 -> .5.1 -> .6.1 -> .1.1): the copy coming back
    after three daemons is the original again, and is known."""
    from lbmrd.config import parse_config

    def conf(frm: str, to: str) -> str:
        return f"""<?xml version="1.0"?>
<lbmrd version="1.0">
  <domains>
    <domain name="lan"><network>127.0.1.0/24</network><network>127.0.5.0/24</network>
      <network>127.0.6.0/24</network></domain>
    <domain name="daemons"><network>127.0.0.0/24</network></domain>
  </domains>
  <transformations>
    <transform source="lan" destination="daemons">
      <rule><match address="{frm}" port="*"/><replace address="{to}" port="*"/></rule>
    </transform>
    <transform source="daemons" destination="daemons">
      <rule><match address="{frm}" port="*"/><replace address="{to}" port="*"/></rule>
    </transform>
  </transformations>
</lbmrd>"""

    cycle = ["127.0.1.1", "127.0.5.1", "127.0.6.1", "127.0.1.1"]
    configs = [parse_config(conf(cycle[i], cycle[i + 1]), "x.xml") for i in range(3)]
    cores, deliveries, to_x = _ring(tir_packet("10.66.6.6", topic="spoof"), configs=configs)
    assert deliveries < 100 and to_x == 0


def test_identical_queries_from_several_receivers_are_relayed():
    """Four contexts querying the same topic with byte-identical datagrams,
    at UM's cadence (20 ms doubling to 200 ms, then every second) but not in
    step: every query is relayed, none is taken for a loop."""
    core = RelayCore()
    receivers = [(f"10.0.3.{i}", 14402) for i in range(4)]
    core.handle(b"\x02\x00\x00\x00", A, 0.0)
    events = []
    for i, r in enumerate(receivers):
        t, step = i * 0.013, 0.02
        while t < 20:
            events.append((t, r))
            t += step
            step = min(step * 2, 1.0) if step < 0.2 else 1.0
    relayed = sum(isinstance(core.handle(TQR, r, t), Relay) for t, r in sorted(events))
    assert core.counters.drops["loop"] == 0 and relayed == len(events) > 80
