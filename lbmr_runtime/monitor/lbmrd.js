// lbmrd's operators' page: clients (paged, filtered and sorted by the daemon),
// rates, drops by reason, clients by domain, NAT rules, recent events.
"use strict";

(() => {
  const {el, $, clear, count, bytes, rate, secs, agoCell, api, every, Table, card, tiles} = M;
  const main = $("main");

  const overview = card(main, "Traffic", {wide: true, id: "traffic"});
  const traffic = el("div", {cls: "tiles", id: "traffic-tiles"});
  overview.append(traffic, el("p", {cls: "note", text: "Rates are per second over the last refresh."}));

  const clientsCard = card(main, "Clients", {wide: true, id: "clients"});
  const clients = new Table(clientsCard, [
    {key: "addr", label: "client (TR socket)", name: true},
    {key: "domain", label: "domain", name: true},
    {key: "first_seen", label: "first seen", fmt: r => agoCell(r.age_s), descFirst: false},
    {key: "last_seen", label: "last heard", fmt: r => agoCell(r.idle_s), descFirst: true},
    {key: "datagrams", label: "datagrams", num: true, fmt: r => count(r.datagrams), descFirst: true},
  ], {id: "client-table", label: "clients", placeholder: "filter by address or domain", limit: 100,
      sort: "first_seen", server: {refresh: () => refreshClients()}});

  const dropsCard = card(main, "Drops by reason", {id: "drops"});
  const drops = new Table(dropsCard, [
    {key: "where", label: "where"},
    {key: "reason", label: "reason", name: true},
    {key: "count", label: "count", num: true, fmt: r => count(r.count)},
    {key: "rate", label: "rate", num: true, fmt: r => rate(r.rate)},
  ], {id: "drop-table", label: "drops", sort: "count", desc: true});

  const domCard = card(main, "Clients by domain", {id: "domains"});
  const domains = new Table(domCard, [
    {key: "domain", label: "domain", name: true, fmt: r => r.domain || "(no domain)"},
    {key: "clients", label: "clients", num: true, fmt: r => count(r.clients)},
  ], {id: "domain-table", label: "domains", sort: "clients", desc: true});

  const natCard = card(main, "NAT rules", {id: "nat"});
  const nat = new Table(natCard, [
    {key: "source", label: "from domain", name: true},
    {key: "destination", label: "to domain", name: true},
    {key: "rule", label: "rule (match \u2192 replace)", name: true},
  ], {id: "nat-table", label: "NAT rules", sort: "source"});
  const natNets = new Table(natCard, [
    {key: "name", label: "domain", name: true},
    {key: "networks", label: "networks", name: true},
  ], {id: "nat-domain-table", label: "NAT domains", sort: "name"});

  const evCard = card(main, "Recent events", {wide: true, id: "events"});
  const events = new Table(evCard, [
    {key: "age_s", label: "when", fmt: r => agoCell(r.age_s), sort: r => r.age_s},
    {key: "event", label: "event"},
    {key: "detail", label: "detail", name: true},
  ], {id: "event-table", label: "events", sort: "age_s"});

  const rates = new M.Rates(), dropRateOf = new M.Rates();
  const sum = o => Object.values(o || {}).reduce((a, b) => a + b, 0);

  let asked = 0;  // the newest request for clients: an older answer arriving late is dropped
  async function refreshClients() {
    const mine = ++asked;
    const p = await api("/api/clients", clients.query());
    if (mine !== asked) return;
    clients.setPage(p.rows, p.matched, p.total);
    clientsCard.count.textContent = count(p.total);
  }

  async function refresh() {
    const s = await api("/api/summary");
    M.setWall(s.wall_time);
    const d = s.daemon, c = s.counters;
    $("title").textContent = `lbmrd ${d.interface}:${d.port}`;
    document.title = `lbmrd ${d.interface}:${d.port}`;
    const facts = clear($("facts"));
    for (const t of [`up ${secs(d.uptime_s)}`, `ttl ${secs(d.ttl_s)}`, `activity ${secs(d.activity_ms / 1000)}`,
                     `pid ${d.pid}`, d.config ? `config ${d.config}` : "no config file",
                     d.max_clients ? `max ${count(d.max_clients)} clients` : null])
      if (t) facts.append(el("span", {text: t}));
    const dropped = sum(c.drops), relDrop = sum(c.relays_dropped), copyDrop = sum(c.copies_dropped);
    const errs = sum(c.send_errors) + sum(c.recv_errors);
    const r = rates.update({received: c.received, tx: c.tx, rx_bytes: c.rx_bytes, tx_bytes: c.tx_bytes,
                            relayed: c.relayed, replies: c.replies, dropped, copyDrop});
    tiles(traffic, [
      ["clients", count(s.clients_total)],
      ["datagrams in", rate(r.received)],
      ["datagrams out", rate(r.tx)],
      ["bytes in", rate(r.rx_bytes, "B")],
      ["bytes out", rate(r.tx_bytes, "B")],
      ["relayed", rate(r.relayed)],
      ["keepalives answered", rate(r.replies)],
      ["dropped in", rate(r.dropped), r.dropped > 0],
      ["received (total)", count(c.received)],
      ["dropped (total)", count(dropped + relDrop + copyDrop), dropped + relDrop + copyDrop > 0],
      ["send/recv errors", count(errs), errs > 0],
      ["NAT rewrites", count(c.nat_rewrites)],
    ]);
    const dropRows = [];
    const counts = {};
    for (const [where, obj] of [["input", c.drops], ["relay", c.relays_dropped], ["copy", c.copies_dropped],
                                ["send error", c.send_errors], ["receive error", c.recv_errors]])
      for (const [reason, n] of Object.entries(obj || {})) {
        counts[where + "/" + reason] = n;
        dropRows.push({where, reason, count: n});
      }
    const dropRates = dropRateOf.update(counts);
    for (const row of dropRows) row.rate = dropRates[row.where + "/" + row.reason] ?? null;
    drops.set(dropRows);
    dropsCard.count.textContent = count(dropRows.reduce((a, x) => a + x.count, 0));
    domains.set(s.by_domain.items);
    domCard.count.textContent = count(s.by_domain.total);
    const rules = [];
    for (const t of s.nat.transforms.items)
      for (const rule of t.rules.items) rules.push({source: t.source, destination: t.destination, rule});
    nat.set(rules);
    natNets.set(s.nat.domains.items.map(x => ({name: x.name, networks: x.networks.items.join(", ") +
                                               (x.networks.total > x.networks.items.length ? ` \u2026 (${x.networks.total})` : "")})));
    natCard.count.textContent = `${count(s.nat.domains.total)} domains, ${count(rules.length)} rules`;
    events.set(s.events.items);
    evCard.count.textContent = `${count(s.events.items.length)} newest of ${count(s.events.total)}`;
    await refreshClients();
  }
  every(refresh);
})();
