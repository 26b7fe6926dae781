// lbmr-router's operators' page: the topology as a drawing (routers, their
// domains, peer links with state and cost), this router's routes, portals,
// peer links, proxied sessions with their receivers (paged, filtered and
// sorted by the router), recent events.
"use strict";

(() => {
  const {el, $, clear, count, bytes, secs, agoCell, api, every, Table, card, state} = M;
  const main = $("main");
  const SVG = "http://www.w3.org/2000/svg";
  const GOOD = ["CONNECTED", "connected"], BAD = ["down", "closed", "DISCONNECTED", "CLOSED"];

  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = String(text);
    return e;
  }
  function short(s, n) { s = String(s); return s.length > n ? s.slice(0, n - 1) + "\u2026" : s; }

  // ------------------------------------------------------------------ sections
  const topoCard = card(main, "Topology", {wide: true, id: "topology"});
  const topoWrap = el("div", {cls: "topo"});
  const drawing = svg("svg", {class: "topology", role: "img", "aria-label": "routers, domains and peer links"});
  const legend = el("div", {cls: "legend"},
    el("span", {text: "\u25a0 this router"}), el("span", {text: "\u25a1 other routers"}),
    el("span", {text: "\u25ad domain (TRD)"}), el("span", {text: "green: link up \u00b7 red dashed: down \u00b7 grey: known from the map"}),
    el("span", {text: "numbers: link cost"}));
  topoWrap.append(drawing, legend);
  const routesBox = el("div", {cls: "side", id: "routes"},
                       el("h3", null, "Routes from this router", el("span", {cls: "count", id: "routes-count"})));
  topoCard.append(el("div", {cls: "split"}, topoWrap, routesBox));
  const routes = new Table(routesBox, [
    {key: "domain", label: "domain", num: true},
    {key: "cost", label: "cost", num: true},
    {key: "hops", label: "hops", num: true},
    {key: "next_hop", label: "next hop", name: true, fmt: r => r.next_hop === null ? "(local)" : r.next_hop},
    {key: "path", label: "path", name: true},
  ], {id: "route-table", label: "routes", sort: "domain"});

  const portalCard = card(main, "Portals", {wide: true, id: "portals"});
  const portals = new Table(portalCard, [
    {key: "name", label: "portal", name: true},
    {key: "domain_id", label: "domain", num: true},
    {key: "mode", label: "TR"},
    {key: "tr_socket", label: "TR socket"},
    {key: "source_id", label: "source id"},
    {key: "links", label: "links", name: true, fmt: r => r.links.map(l => `${l.name} ${l.state}`).join(", "),
     sort: r => r.links.length},
    {key: "local", label: "local interest", num: true, fmt: r => count(r.local_interest.total), sort: r => r.local_interest.total},
    {key: "remote", label: "remote interest", num: true, fmt: r => count(r.remote_interest.total), sort: r => r.remote_interest.total},
    {key: "proxies", label: "proxies", num: true, fmt: r => count(r.proxies)},
    {key: "adverts", label: "adverts", num: true, fmt: r => count(r.adverts)},
    {key: "drops_total", label: "drops", num: true, fmt: r => {
      const td = el("td", {cls: "num", text: count(r.drops_total),
                           title: Object.entries(r.drops).map(([k, v]) => `${k}: ${v}`).join("\n") || "none"});
      if (r.drops_total) td.classList.add("error");
      return td;
    }},
    {key: "acl_rejected", label: "ACL refused", num: true, fmt: r => count(r.acl_rejected)},
  ], {id: "portal-table", label: "portals", sort: "name"});
  const interestCount = el("span", {cls: "count"});
  const interestBox = el("details", {cls: "sub", id: "interest"},
                         el("summary", null, "Interest (topics and patterns) ", interestCount));
  portalCard.append(interestBox);
  const interest = new Table(interestBox, [
    {key: "portal", label: "portal", name: true},
    {key: "side", label: "interest"},
    {key: "topic", label: "topic or pattern", name: true},
  ], {id: "interest-table", label: "interest", sort: "topic"});

  const linkCard = card(main, "Peer links", {wide: true, id: "links"});
  const links = new Table(linkCard, [
    {key: "name", label: "link", name: true},
    {key: "peer", label: "peer router", name: true},
    {key: "state", label: "state", fmt: r => state(r.state, GOOD, BAD)},
    {key: "kind", label: "kind"},
    {key: "cost", label: "cost", num: true},
    {key: "rtt_last_s", label: "round trip", num: true, fmt: r => secs(r.rtt_last_s)},
    {key: "bytes_sent", label: "sent", num: true, fmt: r => bytes(r.bytes_sent)},
    {key: "bytes_received", label: "received", num: true, fmt: r => bytes(r.bytes_received)},
    {key: "queued_frames", label: "queue (frames)", num: true, fmt: r => count(r.queued_frames)},
    {key: "dropped_datagrams", label: "dropped", num: true, fmt: r => count(r.dropped_datagrams)},
    {key: "streams", label: "streams", num: true, fmt: r => count(r.streams)},
    {key: "reconnects", label: "reconnects", num: true, fmt: r => count(r.reconnects)},
  ], {id: "link-table", label: "peer links", sort: "name"});

  const sessCard = card(main, "Proxied sessions", {wide: true, id: "sessions"});
  const sessions = new Table(sessCard, [
    {key: "topic", label: "topics", name: true, fmt: r => r.topics.items.join(", ") +
      (r.topics.total > r.topics.items.length ? ` \u2026 (${r.topics.total})` : "")},
    {key: "origin_domain", label: "origin", num: true, fmt: r => `domain ${r.origin_domain}`},
    {key: "transport", label: "transport", fmt: r => r.transport + (r.session ? ` session ${r.session}` : "")},
    {key: "link", label: "link", name: true},
    {key: "proxy", label: "proxy address"},
    {key: "receivers", label: "receivers", name: true, fmt: r => r.receivers.total ?
      r.receivers.items.map(x => `${x.peer} (queue ${bytes(x.queued_bytes)}, dropped ${count(x.dropped_messages)})`).join("; ") : "none"},
    {key: "queued_bytes", label: "queued", num: true, fmt: r => bytes(r.queued_bytes), descFirst: true},
    {key: "dropped_messages", label: "dropped", num: true, fmt: r => count(r.dropped_messages), descFirst: true},
  ], {id: "session-table", label: "sessions", placeholder: "filter by topic, link, address", limit: 50,
      sort: "topic", server: {refresh: () => refreshSessions()}});

  const evCard = card(main, "Recent events", {wide: true, id: "events"});
  const events = new Table(evCard, [
    {key: "age_s", label: "when", fmt: r => agoCell(r.age_s), sort: r => r.age_s},
    {key: "link", label: "link", name: true},
    {key: "event", label: "event"},
    {key: "detail", label: "detail", name: true},
  ], {id: "event-table", label: "events", sort: "age_s"});

  // ------------------------------------------------------------------ the drawing
  // routers in columns by hops from this one (breadth first over the map's
  // peer lists), each with its domains below it; links of this router whose
  // peer is not in the map (down, or not yet known) as routers of their own
  function draw(topo, linkRows) {
    clear(drawing);
    const nodes = new Map(topo.nodes.items.map(n => [n.name, n]));
    const me = topo.self;
    if (!nodes.has(me)) nodes.set(me, {name: me, domains: [], peers: []});
    const mine = new Map();  // peer router name -> link row (this router's links)
    for (const l of linkRows) {
      if (l.kind === "pair") continue;
      const other = l.peer || `(${l.name})`;
      mine.set(other, l);
      if (!nodes.has(other)) nodes.set(other, {name: other, domains: [], peers: [], unknown: true});
    }
    // edges, undirected, with the cost each side gives
    const edges = new Map();
    const edge = (a, b) => { const k = a < b ? a + "\u0000" + b : b + "\u0000" + a; if (!edges.has(k)) edges.set(k, {a, b, cost: {}}); return edges.get(k); };
    for (const n of nodes.values()) for (const p of n.peers) if (nodes.has(p.name)) edge(n.name, p.name).cost[n.name] = p.cost;
    for (const [other, l] of mine) { const e = edge(me, other); e.link = l; if (e.cost[me] === undefined) e.cost[me] = l.cost; }
    // columns by distance
    const dist = new Map([[me, 0]]);
    const queue = [me];
    const adj = new Map();
    for (const e of edges.values()) {
      if (!adj.has(e.a)) adj.set(e.a, []);
      if (!adj.has(e.b)) adj.set(e.b, []);
      adj.get(e.a).push(e.b); adj.get(e.b).push(e.a);
    }
    while (queue.length) {
      const x = queue.shift();
      for (const y of (adj.get(x) || []).slice().sort()) if (!dist.has(y)) { dist.set(y, dist.get(x) + 1); queue.push(y); }
    }
    let far = Math.max(...dist.values());
    for (const n of [...nodes.keys()].sort()) if (!dist.has(n)) dist.set(n, ++far);  // not connected to us
    let cols = [];
    for (const [n, d] of dist) (cols[d] = cols[d] || []).push(n);
    cols.forEach(c => c.sort());
    // side by side when the card is wide enough, else one level under the other
    const W = 190, RW = 150, RH = 34, DH = 22, GAP = 12, CELL = RW + 24;
    const DW = 70;  // a domain's box (beside its router when drawn one level under the other)
    const room = topoWrap.clientWidth || 800;
    const vertical = cols.length * W + 10 > room;
    const pos = new Map();
    let width, H;
    if (!vertical) {
      const heightOf = n => RH + (nodes.get(n).domains.length ? GAP + DH : 0) + 28;
      const colH = cols.map(c => c.reduce((a, n) => a + heightOf(n), 0));
      H = Math.max(120, ...colH) + 10;
      cols.forEach((c, i) => {
        let y = (H - colH[i]) / 2 + 6;
        for (const n of c) { pos.set(n, {x: 20 + i * W + RW / 2, y: y + RH / 2}); y += heightOf(n); }
      });
      width = Math.max(360, cols.length * W + 10);
    } else {
      const STEP = RW + 16 + DW + 24;  // a router and its domains beside it
      const perRow = Math.max(1, Math.floor(room / STEP));  // a level wider than the card: several rows
      cols = cols.flatMap(c => Array.from({length: Math.ceil(c.length / perRow)}, (_, k) => c.slice(k * perRow, (k + 1) * perRow)));
      const rowH = c => Math.max(RH, ...c.map(n => nodes.get(n).domains.length * (DH + 4))) + 36;
      width = Math.max(300, ...cols.map(c => c.length * STEP));
      H = cols.reduce((a, c) => a + rowH(c), 0) + 10;
      let y = 14;
      cols.forEach(c => {
        const x0 = (width - c.length * STEP) / 2 + RW / 2;
        c.forEach((n, j) => pos.set(n, {x: x0 + j * STEP, y: y + RH / 2}));
        y += rowH(c);
      });
    }
    drawing.setAttribute("viewBox", `0 0 ${width} ${H}`);
    drawing.setAttribute("width", width);
    drawing.setAttribute("height", H);
    const gEdges = svg("g"), gNodes = svg("g"), gCosts = svg("g");
    drawing.append(gEdges, gNodes, gCosts);
    for (const e of edges.values()) {
      const p = pos.get(e.a), q = pos.get(e.b);
      const st = e.link ? (GOOD.includes(e.link.state) ? "up" : "down") : "";
      const line = svg("line", {class: "edge " + st, x1: p.x, y1: p.y, x2: q.x, y2: q.y, "data-a": e.a, "data-b": e.b});
      line.append(svg("title", {}, `${e.a} \u2014 ${e.b}` + (e.link ? ` (link ${e.link.name}: ${e.link.state})` : "")));
      gEdges.append(line);
      const costs = [...new Set(Object.values(e.cost))];
      if (costs.length) {
        const label = costs.join("/");
        const mx = (p.x + q.x) / 2, my = (p.y + q.y) / 2;
        gCosts.append(svg("rect", {class: "costbg", x: mx - 4 - 3.5 * label.length, y: my - 8, width: 8 + 7 * label.length, height: 16, rx: 3}));
        gCosts.append(svg("text", {class: "cost", x: mx, y: my}, label));
      }
    }
    for (const [name, n] of nodes) {
      const p = pos.get(name);
      const g = svg("g", {class: "router" + (name === me ? " self" : ""), "data-name": name});
      g.append(svg("title", {}, name + (n.unknown ? " (not in the topology map)" : "") +
                   (n.domains.length ? `\ndomains ${n.domains.join(", ")}` : "") +
                   (n.peers.length ? `\npeers ${n.peers.map(x => `${x.name} (cost ${x.cost})`).join(", ")}` : "")));
      g.append(svg("rect", {x: p.x - RW / 2, y: p.y - RH / 2, width: RW, height: RH, rx: 6}));
      g.append(svg("text", {x: p.x, y: p.y}, short(name, 20)));
      gNodes.append(g);
      const nd = n.domains.length;
      const dw = vertical ? DW : Math.min(DW, (RW + 20) / Math.max(1, nd) - 6);
      n.domains.forEach((d, i) => {
        const dx = vertical ? p.x + RW / 2 + 16 + DW / 2 : p.x + (i - (nd - 1) / 2) * (dw + 6);
        const dy = vertical ? p.y - RH / 2 + DH / 2 + i * (DH + 4) : p.y + RH / 2 + GAP + DH / 2;
        gEdges.append(vertical ? svg("line", {class: "tie", x1: p.x + RW / 2, y1: dy, x2: dx - dw / 2, y2: dy})
                               : svg("line", {class: "tie", x1: p.x, y1: p.y + RH / 2, x2: dx, y2: dy - DH / 2}));
        const gd = svg("g", {class: "domain", "data-domain": d});
        gd.append(svg("title", {}, `domain ${d} (a TRD of ${name})`));
        gd.append(svg("rect", {x: dx - dw / 2, y: dy - DH / 2, width: dw, height: DH, rx: 4}));
        gd.append(svg("text", {x: dx, y: dy}, nd > 3 && !vertical ? String(d) : `TRD ${d}`));
        gNodes.append(gd);
      });
    }
    topoCard.count.textContent = `${nodes.size} routers, ${edges.size} links`;
  }

  // ------------------------------------------------------------------ refresh
  let asked = 0;
  async function refreshSessions() {
    const mine = ++asked;
    const p = await api("/api/sessions", sessions.query());
    if (mine !== asked) return;
    sessions.setPage(p.rows, p.matched, p.total);
    sessCard.count.textContent = count(p.total);
  }

  async function refresh() {
    const s = await api("/api/router");
    M.setWall(s.wall_time);
    const r = s.router;
    $("title").textContent = `lbmr-router ${r.name}`;
    document.title = `lbmr-router ${r.name}`;
    const facts = clear($("facts"));
    const up = s.links.filter(l => GOOD.includes(l.state)).length;
    for (const t of [`up ${secs(r.uptime_s)}`, `${up} of ${s.links.length} links up`,
                     `${count(r.sessions)} proxied topics`, `pid ${r.pid}`, r.config ? `config ${r.config}` : null])
      if (t) facts.append(el("span", {text: t}));
    draw(s.topology, s.links);
    routes.set(s.topology.routes.items);
    $("routes-count").textContent = count(s.topology.routes.total);
    portals.set(s.portals);
    portalCard.count.textContent = count(s.portals.length);
    const rows = [];
    for (const p of s.portals) {
      for (const t of p.local_interest.items) rows.push({portal: p.name, side: "local", topic: t});
      for (const t of p.remote_interest.items) rows.push({portal: p.name, side: "remote", topic: t});
    }
    interest.set(rows);
    interestCount.textContent = count(rows.length);
    links.set(s.links);
    linkCard.count.textContent = `${up} of ${s.links.length} up`;
    events.set(s.events.items);
    evCard.count.textContent = `${count(s.events.items.length)} newest of ${count(s.events.total)}`;
    await refreshSessions();
  }
  every(refresh);
})();
