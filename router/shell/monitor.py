"""The JSON of lbmr-router's operators' page (``GET /`` on the ``<metrics>``
endpoint, :mod:`lbmr_runtime.monitor`): ``/api/router`` (the router, its
topology and routes, portals, peer links, recent events; every list cut to a
bound) and ``/api/sessions`` (the proxied transport sessions with their
receivers, paged, filtered and sorted here: a router may proxy thousands).

Names from the wire (topics, patterns, router names) go to the page through
:func:`lbmr_runtime.monitor.page_json`, which makes every string printable."""

from __future__ import annotations

import os
import time

import trio

from lbmr_proto import Transport
from lbmr_runtime.http import Access, load_token, server_tls
from lbmr_runtime.monitor import TableQuery, bounded

__all__ = ["monitor_access", "router_page", "sessions_page"]

EVENTS_SHOWN = 200  # newest events of all links in the page's summary
NODES_SHOWN = 200  # routers of the topology map shown at most
PER_NODE_SHOWN = 64  # domains, and peers, of one router shown at most (a TOPOLOGY frame may list 4096)
INTEREST_SHOWN = 50  # topics and patterns of a portal's interest shown (the rest counted)
SESSION_TOPICS_SHOWN = 20  # topics of one proxied session shown (the rest counted)
SESSIONS_PAGE = 100  # sessions in one page at most
RECEIVERS_SHOWN = 50  # receivers of one session shown at most


def _transport(code: int) -> str:
    try:
        return Transport(code & 0x7F).name
    except ValueError:
        return f"0x{code:02x}"


def _topology(router) -> dict:
    routing = router.routing
    if routing is None:
        return {"self": router.config.name, "nodes": [], "routes": []}
    st = routing.status()
    nodes = []
    for name, n in sorted(st.get("nodes", {}).items())[:NODES_SHOWN]:
        domains = sorted(int(d) for d in n.get("domains", {}))
        peers = sorted(n.get("peers", {}).items())
        nodes.append({"name": name, "domains": domains[:PER_NODE_SHOWN], "domains_total": len(domains),
                      "peers": [{"name": p, "cost": c} for p, c in peers[:PER_NODE_SHOWN]],
                      "peers_total": len(peers)})
    total_nodes = len(st.get("nodes", {}))
    routes = [{"domain": int(d), "cost": r["cost"], "hops": r["hops"], "next_hop": r["next_hop"],
               "path": " \u2192 ".join(r["path"])} for d, r in sorted(st.get("routes", {}).items(),
                                                                     key=lambda kv: int(kv[0]))]
    return {"self": st.get("router_id", router.config.name), "nodes": {"total": total_nodes, "items": nodes},
            "routes": bounded(routes, NODES_SHOWN),
            "counters": dict(router.core.routing_counters) if router.core is not None else {}}


def _portals(router) -> list[dict]:
    out = []
    for s in router.portal_summary():
        task = router.portals[s["name"]]
        try:
            tr = "{}:{}".format(*task.sock.getsockname()[:2]) if task.sock is not None else None
        except OSError:
            tr = None
        out.append({"name": s["name"], "domain_id": s["domain_id"], "mode": s["mode"], "tr_socket": tr,
                    "source_id": task.src_id.hex(),
                    "links": s["links"],
                    "local_interest": bounded(s["local_interest"], INTEREST_SHOWN),
                    "remote_interest": bounded(s["remote_interest"], INTEREST_SHOWN),
                    "proxies": s["proxies"], "adverts": s["adverts"], "drops": s["drops"],
                    "drops_total": sum(s["drops"].values()), "acl_rejected": s["acl_rejected"]})
    return out


def _links(router) -> list[dict]:
    """One row per link (a peer link serves every endpoint: its first unit speaks for it)."""
    seen: dict[str, dict] = {}
    for u in router.links:
        if u.link_id in seen:
            seen[u.link_id]["endpoints"].append(u.endpoint.name)
            continue
        st = u.task.status() if u.task is not None else {"name": u.peer.name, "state": "down"}
        link = u.link
        conn = getattr(link, "conn", None)
        stats = getattr(conn, "stats", None)
        rtt = getattr(conn, "rtt", None)
        c = u.counters
        seen[u.link_id] = {
            "name": st.get("name", u.peer.name), "peer": st.get("peer"), "state": str(st.get("state")),
            "kind": "pair" if u.task is not None and u.task.pair is not None else "peer",
            "cost": u.peer.cost, "endpoints": [u.endpoint.name],
            "rtt_last_s": getattr(rtt, "last", None), "rtt_mean_s": getattr(rtt, "mean", None),
            "bytes_sent": getattr(stats, "bytes_sent", None), "bytes_received": getattr(stats, "bytes_received", None),
            "frames_sent": getattr(stats, "frames_sent", st.get("frames_sent")),
            "frames_received": getattr(stats, "frames_received", None),
            "queued_frames": st.get("queued_frames", 0), "dropped_datagrams": st.get("dropped_datagrams", 0),
            "streams": len(link.state) if link is not None else 0,
            "reconnects": max(0, c.get("peer_connects", 0) - 1),
        }
    return list(seen.values())


def _events(router, now: float) -> dict:
    rows = []
    total = 0
    for u in router.links:
        total += len(u.events)
        for t, kind, detail in list(u.events)[-EVENTS_SHOWN:]:
            rows.append((t, u.peer.name, kind, detail))
    rows.sort(key=lambda r: r[0], reverse=True)
    return {"total": total, "items": [{"age_s": round(now - t, 3), "link": link, "event": k, "detail": d}
                                      for t, link, k, d in rows[:EVENTS_SHOWN]]}


def router_page(router, query: dict[str, str] | None = None) -> dict:
    """``/api/router``: see the module's doc."""
    now = trio.current_time()
    return {
        "router": {"name": router.config.name, "config": router.config.path or None, "pid": os.getpid(),
                   "uptime_s": round(now - router.started, 3) if router.started is not None else None,
                   "sessions": sum(len(u.bridge.proxies()) for u in router.links if u.bridge is not None)},
        "wall_time": time.time(),
        "topology": _topology(router),
        "portals": _portals(router),
        "links": _links(router),
        "events": _events(router, now),
    }


def _session_rows(router) -> list[dict]:
    """One row per proxy (a transport session of the peer's, one listener
    for all its topics) on each link."""
    rows = []
    for u in router.links:
        bridge = u.bridge
        if bridge is None:
            continue
        addrs = bridge.proxy_addresses()
        by_proxy: dict[object, dict] = {}
        for aid, f in sorted(bridge.proxies().items()):
            addr = addrs.get(aid)
            row = by_proxy.get(addr) if addr is not None else None
            if row is None:
                row = {"link": u.peer.name, "endpoint": u.endpoint.name, "advert_id": aid, "topics": [],
                       "origin_domain": f.origin_domain, "transport": _transport(f.transport),
                       "session": f"{f.session:x}" if f.session else "", "hops": f.hop_count,
                       "proxy": f"{addr[0]}:{addr[1]}" if addr else "", "receivers": []}
                by_proxy[addr if addr is not None else ("advert", aid)] = row
            row["topics"].append(f.topic)
            if u.relay is not None:
                row["receivers"] += u.relay.receivers_of(aid)
        for row in by_proxy.values():
            rx = row["receivers"]
            row["topic"] = row["topics"][0]
            row["topics"] = bounded(row["topics"], SESSION_TOPICS_SHOWN)
            row["receivers"] = bounded(rx, RECEIVERS_SHOWN)
            row["queued_bytes"] = sum(r["queued_bytes"] for r in rx)
            row["dropped_messages"] = sum(r["dropped_messages"] for r in rx)
            rows.append(row)
    return rows


#: the session table's columns the page sorts by
SESSION_SORT = {
    "topic": lambda r: (r["topic"], r["advert_id"]),
    "origin_domain": lambda r: (r["origin_domain"], r["topic"]),
    "link": lambda r: (r["link"], r["advert_id"]),
    "proxy": lambda r: (r["proxy"], r["advert_id"]),
    "receivers": lambda r: (r["receivers"]["total"], r["advert_id"]),
    "queued_bytes": lambda r: (r["queued_bytes"], r["advert_id"]),
    "dropped_messages": lambda r: (r["dropped_messages"], r["advert_id"]),
}


def _session_text(r: dict) -> str:
    return " ".join([*r["topics"]["items"], r["link"], r["proxy"], r["transport"], str(r["origin_domain"]),
                     r["session"], *(x["peer"] for x in r["receivers"]["items"])])


async def sessions_page(router, query: dict[str, str], lock: trio.Lock | None = None) -> dict:
    """``/api/sessions``: one page of the proxied sessions (:class:`TableQuery`
    parameters; by topic by default), filtered and sorted in slices, one
    such request at a time (``lock``)."""
    tq = TableQuery(query, SESSION_SORT, default_sort="topic", max_limit=SESSIONS_PAGE)
    rows = _session_rows(router)
    matched, page = await tq.page_in_slices(rows, SESSION_SORT[tq.sort], _session_text, lock=lock)
    return {"total": len(rows), "matched": matched, "offset": tq.offset, "limit": tq.limit,
            "sort": tq.sort, "order": "desc" if tq.desc else "asc", "rows": page}


def monitor_access(cfg) -> Access:
    """The endpoint's :class:`~lbmr_runtime.http.Access` from ``<metrics token-file>``
    and ``<metrics-tls>`` (:class:`router.config.model.MonitorAccessConfig`);
    ValueError naming a file that cannot be used."""
    token = load_token(cfg.token_file) if cfg.token_file else None
    t = cfg.tls
    tls = None if t is None else server_tls(t.certificate, t.certificate_key, t.certificate_key_password,
                                            t.cipher_suites, client_ca=t.trusted_certificates)
    return Access(token, tls)
