"""lbmr-sim addresses UIMs as UM users do, ``TCP:domain:ip:port``, across two
routers on loopback (the pair of test_uim_routing): the sending context learns
the route to the domain from its TRD's remote domain route records and sends
through the router listener they name; a simulated context in the other TRD
takes them (its request port's report)."""

from __future__ import annotations

import socket

import trio

from lbmr_proto import lbmc
from lbmr_tools.sim import SimConfig, run_sim
from lbmr_tools.sim.dataplane import uim_payload
from tests.router.system.uim_apps import UimInbox, hops_of, pair_and_trds


async def test_lbmr_sim_sends_uims_by_domain_through_the_route_it_heard():
    async with trio.open_nursery() as n:
        _, _, trd1, _ = await pair_and_trds(n)
        app2 = UimInbox("127.0.2.9")
        await n.start(app2.serve)
        cfg = SimConfig(daemons=[trd1], contexts=1, topics=0, receivers_per_context=0, bind="127.0.1.9",
                        uim=(2, *app2.address), uim_count=25, duration=10.0)
        result = await run_sim(cfg)
        assert result.uim["sent"] == 25 and result.uim["error"] is None, result.uim
        assert result.uim["via"] == "127.0.1.1:14611"
        got = await app2.wait_for(25)
        assert len(got) == 25 and {hops_of(m) for m in got} == {2}
        msgs = [lbmc.decode(m) for m in got]
        assert [m.sqn for m in msgs] == list(range(25))
        assert all(m.payload == uim_payload(m.sqn) for m in msgs)
        d = msgs[0].header(lbmc.DestinationHeader)
        assert (d.orig_domain_id, d.orig_ipaddr) == (1, "127.0.1.9")  # its domain, as the routers said
        n.cancel_scope.cancel()


def _free(ip: str, port: int) -> bool:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the request port binds
    try:
        s.bind((ip, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


async def test_two_simulators_one_sends_the_other_takes():
    port = 14391  # the receiving context's request port (UM's request_tcp_port_low)
    assert _free("127.0.2.9", port)
    async with trio.open_nursery() as n:
        _, _, t1, t2 = await pair_and_trds(n)
        taker = SimConfig(daemons=[t2], contexts=1, topics=0, receivers_per_context=0, bind="127.0.2.9",
                          request_ports=True, duration=4.0, keep_running=True)
        sender = SimConfig(daemons=[t1], contexts=1, topics=0, receivers_per_context=0, bind="127.0.1.9",
                           uim=(2, "127.0.2.9", port), uim_count=10, duration=3.0)
        results = {}

        async def run(name, cfg):
            results[name] = await run_sim(cfg)
        async with trio.open_nursery() as sims:
            sims.start_soon(run, "taker", taker)
            await trio.sleep(0.3)
            sims.start_soon(run, "sender", sender)
        assert results["sender"].uim["sent"] == 10
        (rp,) = results["taker"].request_ports
        assert rp["address"] == f"127.0.2.9:{port}"
        assert rp["stats"]["uims"] == 10 and rp["stats"]["uim_hops"] == {"2": 10}, rp
        n.cancel_scope.cancel()
