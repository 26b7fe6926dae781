// lbmr-kit operators' pages: the shared part (JSON fetches, formatting,
// tables). Every value from the daemon is put into the page as text
// (textContent, createTextNode, SVG attributes): never as markup.
"use strict";

const M = (() => {
  const REFRESH_MS = 3000;  // between refreshes of the page's data

  // ------------------------------------------------------------------ DOM
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    if (props) {
      for (const [k, v] of Object.entries(props)) {
        if (v === undefined || v === null) continue;
        if (k === "cls") e.className = v;
        else if (k === "text") e.textContent = String(v);
        else if (k === "title") e.title = String(v);
        else if (k === "on") for (const [ev, fn] of Object.entries(v)) e.addEventListener(ev, fn);
        else e.setAttribute(k, String(v));
      }
    }
    for (const c of children) if (c !== null && c !== undefined) e.append(c);  // strings become text nodes
    return e;
  }
  const $ = id => document.getElementById(id);
  function clear(e) { while (e.firstChild) e.removeChild(e.firstChild); return e; }

  // ------------------------------------------------------------------ numbers and times
  function count(n) {
    if (n === null || n === undefined) return "\u2013";
    const a = Math.abs(n);
    if (a < 10000) return String(Math.round(n * 100) / 100);
    for (const [d, u] of [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]])
      if (a >= d) return (n / d).toFixed(a / d < 100 ? 1 : 0) + "\u202f" + u;
    return String(n);
  }
  function bytes(n) {
    if (n === null || n === undefined) return "\u2013";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0, v = n;
    while (Math.abs(v) >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(v < 100 ? 1 : 0) : String(v)) + "\u202f" + u[i];
  }
  function rate(n, unit) {
    if (n === null || n === undefined) return "\u2013";
    return (unit === "B" ? bytes(n) : count(n)) + (unit === "B" ? "/s" : "\u202f/s");
  }
  function secs(s) {
    if (s === null || s === undefined) return "\u2013";
    if (s < 0.001) return (s * 1e6).toFixed(0) + "\u202f\u00b5s";
    if (s < 1) return (s * 1000).toFixed(s < 0.01 ? 2 : 1) + "\u202fms";
    if (s < 120) return s.toFixed(s < 10 ? 1 : 0) + "\u202fs";
    if (s < 7200) return (s / 60).toFixed(0) + "\u202fmin";
    if (s < 172800) return (s / 3600).toFixed(1) + "\u202fh";
    return (s / 86400).toFixed(1) + "\u202fd";
  }
  let wallOffset = 0;  // the daemon's wall clock minus ours, seconds
  function setWall(serverWall) { if (typeof serverWall === "number") wallOffset = serverWall - Date.now() / 1000; }
  function absolute(ageS) {
    const t = new Date((Date.now() / 1000 + wallOffset - ageS) * 1000);
    const p = x => String(x).padStart(2, "0");
    return `${t.getFullYear()}-${p(t.getMonth() + 1)}-${p(t.getDate())} ${p(t.getHours())}:${p(t.getMinutes())}:${p(t.getSeconds())}`;
  }
  // a cell for a time ``ageS`` seconds ago: relative text, absolute in its tooltip
  function agoCell(ageS) {
    return el("td", {cls: "time", text: secs(ageS) + " ago", title: absolute(ageS), "data-v": -ageS});
  }

  // ------------------------------------------------------------------ fetching
  async function api(path, params) {
    const q = params ? "?" + new URLSearchParams(params).toString() : "";
    const r = await fetch(path + q, {cache: "no-store", credentials: "same-origin"});
    if (!r.ok) throw new Error(`${path}: HTTP ${r.status} ${(await r.text()).trim()}`);
    return r.json();
  }

  // refresh ``fn`` now and every REFRESH_MS (never two at once); the header's
  // "updated" line says when the data last came, or what went wrong
  function every(fn) {
    const mark = $("updated");
    let last = 0, busy = false;
    async function run() {
      if (busy) return;
      busy = true;
      try {
        await fn();
        last = Date.now();
        mark.classList.remove("stale");
        mark.textContent = "updated " + new Date(last).toLocaleTimeString();
      } catch (e) {
        mark.classList.add("stale");
        mark.textContent = "no data: " + String(e.message || e).slice(0, 160) +
          (last ? " (last " + new Date(last).toLocaleTimeString() + ")" : "");
      } finally { busy = false; }
    }
    run();
    setInterval(run, REFRESH_MS);
    return run;
  }

  // ------------------------------------------------------------------ tables
  // A table in ``container``: columns [{key, label, num, name, fmt(row)->text or
  // cell, sort(row)->value}]. Client-side: set(rows) filters and sorts here.
  // Server-side (``server``: fn({offset, limit, q, sort, order}) -> {rows, matched,
  // total}): paging, filter and sort are the daemon's.
  class Table {
    constructor(container, columns, opts = {}) {
      this.columns = columns;
      this.opts = opts;
      this.sort = opts.sort || columns[0].key;
      this.desc = !!opts.desc;
      this.q = "";
      this.offset = 0;
      this.limit = opts.limit || 100;
      this.rows = [];
      const id = opts.id || "";
      this.search = el("input", {type: "search", placeholder: opts.placeholder || "filter",
                                 "aria-label": "filter " + (opts.label || "table"), id: id ? id + "-filter" : null});
      let typing = null;  // a daemon's table asks once the typing paused
      this.search.addEventListener("input", () => {
        clearTimeout(typing);
        typing = setTimeout(() => { this.q = this.search.value; this.offset = 0; this.changed(); },
                            opts.server ? 200 : 0);
      });
      this.info = el("span", {cls: "info"});
      const tools = el("div", {cls: "tools"}, this.search, this.info);
      if (opts.server) {
        this.prev = el("button", {type: "button", text: "\u2039 prev", on: {click: () => this.page(-1)}});
        this.next = el("button", {type: "button", text: "next \u203a", on: {click: () => this.page(1)}});
        this.pos = el("span");
        tools.append(el("span", {cls: "pager"}, this.prev, this.pos, this.next));
      }
      this.head = el("tr");
      for (const c of columns) {
        const th = el("th", {cls: c.num ? "num" : null, text: c.label, scope: "col", "data-key": c.key,
                             title: "sort by " + c.label});
        th.addEventListener("click", () => {
          if (this.sort === c.key) this.desc = !this.desc;
          else { this.sort = c.key; this.desc = !!c.descFirst; }
          this.offset = 0;
          this.changed();
        });
        this.head.append(th);
      }
      this.body = el("tbody");
      this.table = el("table", {id: id || null}, el("thead", null, this.head), this.body);
      container.append(tools, el("div", {cls: "scroll"}, this.table));
      this.markSort();
    }
    markSort() {
      for (const th of this.head.cells)
        if (th.dataset.key === this.sort) th.setAttribute("aria-sort", this.desc ? "descending" : "ascending");
        else th.removeAttribute("aria-sort");
    }
    page(step) {
      this.offset = Math.max(0, this.offset + step * this.limit);
      this.changed();
    }
    changed() {
      this.markSort();
      if (this.opts.server) this.opts.server.refresh();
      else this.render();
    }
    query() {
      return {offset: this.offset, limit: this.limit, q: this.q, sort: this.sort, order: this.desc ? "desc" : "asc"};
    }
    set(rows) { this.rows = rows || []; this.render(); }
    // rows already paged by the daemon, with how many matched and the total
    setPage(rows, matched, total) {
      this.draw(rows || []);
      const end = Math.min(this.offset + rows.length, matched);
      this.pos.textContent = matched ? `${count(this.offset + 1)}\u2013${count(end)} of ${count(matched)}` : "0 of 0";
      this.info.textContent = this.q ? `${count(matched)} of ${count(total)} match` : `${count(total)} in all`;
      this.prev.disabled = this.offset <= 0;
      this.next.disabled = end >= matched;
    }
    render() {
      const q = this.q.toLowerCase();
      let rows = this.rows;
      if (q) rows = rows.filter(r => this.columns.some(c => String(this.text(c, r)).toLowerCase().includes(q)));
      const col = this.columns.find(c => c.key === this.sort) || this.columns[0];
      const key = col.sort || (r => r[col.key]);
      const sign = this.desc ? -1 : 1;
      rows = rows.slice().sort((a, b) => {
        const x = key(a), y = key(b);
        if (x === y) return 0;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return (typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y))) * sign;
      });
      this.info.textContent = q ? `${rows.length} of ${this.rows.length} match` : `${this.rows.length} in all`;
      this.draw(rows.slice(0, this.opts.max || 2000));
    }
    text(c, r) {
      const v = c.fmt ? c.fmt(r) : r[c.key];
      return v instanceof Node ? v.textContent : (v === null || v === undefined ? "" : v);
    }
    draw(rows) {
      const body = el("tbody");
      for (const r of rows) {
        const tr = el("tr");
        for (const c of this.columns) {
          const v = c.fmt ? c.fmt(r) : r[c.key];
          if (v instanceof HTMLTableCellElement) { tr.append(v); continue; }
          const td = el("td", {cls: c.num ? "num" : (c.name ? "name" : null)});
          if (v instanceof Node) td.append(v);
          else td.textContent = v === null || v === undefined ? "\u2013" : String(v);
          tr.append(td);
        }
        body.append(tr);
      }
      if (!rows.length)
        body.append(el("tr", {cls: "empty"}, el("td", {colspan: this.columns.length,
                                                         text: this.q ? "nothing matches the filter" : "none"})));
      this.table.replaceChild(body, this.body);
      this.body = body;
    }
  }

  // a section (card) with a heading and a count; returns its body element
  function card(parent, title, opts = {}) {
    const cnt = el("span", {cls: "count"});
    const sec = el("section", {cls: "card" + (opts.wide ? " wide" : ""), id: opts.id || null},
                   el("h2", null, title, cnt));
    parent.append(sec);
    sec.count = cnt;
    return sec;
  }
  function tiles(container, items) {
    clear(container);
    for (const [k, v, bad] of items)
      container.append(el("div", {cls: "tile" + (bad ? " bad" : "")}, el("div", {cls: "v", text: v}),
                          el("div", {cls: "k", text: k})));
  }
  function state(text, good, bad) {
    const s = String(text);
    const cls = good.includes(s) ? "good" : bad.includes(s) ? "bad" : "warn";
    return el("span", {cls: "state " + cls, text: s});
  }

  // per-second rates from successive counter readings
  class Rates {
    constructor() { this.last = null; }
    update(values) {
      const now = performance.now() / 1000;
      const out = {};
      if (this.last) {
        const dt = now - this.last.t;
        for (const [k, v] of Object.entries(values))
          if (k in this.last.v && dt > 0) out[k] = Math.max(0, (v - this.last.v[k]) / dt);
      }
      this.last = {t: now, v: values};
      return out;
    }
  }

  return {el, $, clear, count, bytes, rate, secs, absolute, agoCell, setWall, api, every, Table, card, tiles,
          state, Rates};
})();
