// Keeps the status page current: polls status.json and rebuilds the
// tables the server rendered, in place. The formatting mirrors
// handler.go's template functions; change both together.
"use strict";

(function () {
  const pollMillis = 2000;
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

  function bytes(n) {
    if (n < 1024) return n + " B";
    let v = n, i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return v.toFixed(v < 10 ? 1 : 0) + " " + units[i];
  }
  function rate(r) { return r > 0 ? bytes(Math.round(r)) + "/s" : "0 B/s"; }
  function duration(ms) {
    const s = Math.floor(ms / 1000);
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min";
    if (s < 86400) return Math.floor(s / 3600) + " h";
    return Math.floor(s / 86400) + " d";
  }
  // Go's zero time.Time marshals as year 1.
  function isZero(t) { return !t || t.startsWith("0001-01-01"); }
  function ago(t, now) { return isZero(t) ? "never" : duration(Math.max(now - Date.parse(t), 0)) + " ago"; }
  function age(t, now) { return duration(Math.max(now - Date.parse(t), 0)); }
  function until(t, now) { const d = Date.parse(t) - now; return d > 0 ? "in " + duration(d) : "expired"; }
  function clock(t) { return new Date(t).toISOString().slice(11, 19); }
  function used(cap, free) { return cap === 0 || free >= cap ? 0 : Math.round((cap - free) * 100 / cap); }

  // h builds an element: attrs are attributes (class, data-*, style),
  // children are nodes or strings (set as text, never parsed as HTML:
  // client owners are whatever the client sent).
  function h(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== null && v !== undefined && v !== false) e.setAttribute(k, v);
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }
  const num = (...c) => h("td", { class: "num" }, ...c);
  const code = (s) => h("code", null, s);
  function empty(cols, text) { return h("tr", { class: "empty" }, h("td", { colspan: cols }, text)); }
  function fill(id, rows, cols, emptyText) {
    document.getElementById(id).replaceChildren(...(rows.length ? rows : [empty(cols, emptyText)]));
  }
  function text(id, s) { document.getElementById(id).textContent = s; }

  function summary(s) {
    const sum = { ds: 0, up: 0, cap: 0, free: 0, read: 0, write: 0, layouts: 0 };
    for (const d of s.data_servers || []) {
      if (d.state === "removed") continue;
      sum.ds++;
      if (!d.up) continue;
      sum.up++; sum.cap += d.capacity; sum.free += d.free; sum.read += d.read_rate; sum.write += d.write_rate;
    }
    for (const c of s.clients || []) sum.layouts += c.layouts;
    text("sum-ds", sum.up + " / " + sum.ds + " up");
    text("sum-space", bytes(Math.max(sum.cap - sum.free, 0)) + " of " + bytes(sum.cap));
    text("sum-read", rate(sum.read));
    text("sum-write", rate(sum.write));
    text("sum-clients", String((s.clients || []).length));
    text("sum-layouts", String(sum.layouts));
    text("sum-files", String(s.files.placed));
    text("sum-unavailable", String(s.files.unavailable_count));
    document.getElementById("card-unavailable").classList.toggle("bad", s.files.unavailable_count > 0);
  }

  function dataServers(s, now) {
    fill("ds-rows", (s.data_servers || []).map((d) => {
      const upDown = d.up ? "up" : "down";
      const pct = used(d.capacity, d.free);
      return h("tr", { "data-ds": d.id, "data-up": String(d.up), class: d.up ? null : "down" },
        h("td", null, code(d.id)),
        h("td", null, (d.addrs || []).join(", ")),
        h("td", null, h("span", { class: "state state-" + d.state }, d.state)),
        h("td", null, h("span", { class: "pill " + upDown }, upDown), " ", h("span", { class: "muted" }, age(d.since, now))),
        h("td", null, ago(d.last_beat, now)),
        h("td", null,
          h("div", { class: "bar", title: pct + "% used" }, h("div", { style: "width: " + pct + "%" })),
          h("span", { class: "muted" }, bytes(Math.max(d.capacity - d.free, 0)) + " of " + bytes(d.capacity))),
        num(bytes(d.bytes)),
        num(String(d.files)),
        num(d.up ? rate(d.read_rate) : "–"),
        num(d.up ? rate(d.write_rate) : "–"));
    }), 10, "No data server has registered yet.");
  }

  function clients(s, now) {
    fill("client-rows", (s.clients || []).map((c) => {
      const notes = [];
      if (!c.confirmed) notes.push(h("span", { class: "tag" }, "unconfirmed"), " ");
      if (c.recalling) notes.push(h("span", { class: "tag warn" }, "recalling " + c.recalling), " ");
      if (c.fenced) notes.push(h("span", { class: "tag bad" }, "fenced"));
      return h("tr", { "data-client": c.id },
        h("td", null, code(c.id)),
        h("td", null, c.owner),
        h("td", null, (c.addrs || []).join(", ")),
        h("td", null, (c.sessions || []).map((id) => [h("code", { class: "session", title: id }, "…" + id.slice(-8)), " "])),
        h("td", null, until(c.lease_expires, now)),
        num(String(c.opens)),
        num(String(c.layouts)),
        h("td", null, notes));
    }), 8, "No client is connected.");
  }

  // latency formats a mean completion time in nanoseconds (handler.go
  // formatLatency).
  function latency(ns) {
    if (!ns || ns <= 0) return "–";
    const g = (v) => String(Number(v.toPrecision(3)));
    if (ns < 1e6) return g(ns / 1e3) + " µs";
    if (ns < 1e9) return g(ns / 1e6) + " ms";
    return g(ns / 1e9) + " s";
  }

  function layoutIO(s, now) {
    fill("layout-io-rows", (s.layout_io || []).map((l) =>
      h("tr", { "data-client": l.client, "data-ds": l.ds },
        h("td", null, code(l.client)),
        h("td", null, code(l.ds)),
        num(bytes(l.read.bytes)), num(String(l.read.ops)), num(latency(l.read.latency)),
        num(bytes(l.write.bytes)), num(String(l.write.ops)), num(latency(l.write.latency)),
        h("td", null, ago(l.updated, now)))),
      9, "No client has reported I/O statistics.");
  }

  function files(s) {
    const f = s.files;
    text("files-summary", f.placed + " files placed · " + f.replicated + " replicated · " + f.degraded + " degraded · " +
      f.unhealable + " unhealable · " + f.stale_copies + " stale copies · " + f.unavailable_count + " unavailable");
    fill("unavailable-rows", (f.unavailable || []).map((u) =>
      h("tr", null, h("td", null, code(String(u.ino))), h("td", null, (u.down || []).join(", ")))),
      2, "Every file is available.");
  }

  function events(s) {
    fill("event-rows", (s.events || []).map((e) =>
      h("tr", null,
        h("td", null, h("time", { datetime: e.time }, clock(e.time))),
        h("td", null, h("span", { class: "event event-" + e.kind.replaceAll(" ", "-") }, e.kind)),
        h("td", null, code(e.subject)),
        h("td", null, e.detail, e.count > 1 ? [" ", h("span", { class: "muted" }, "×" + e.count)] : null))),
      4, "Nothing has happened yet.");
  }

  function mdsNodes(s) {
    const nodes = s.mds_nodes || [];
    document.getElementById("mds-section").hidden = nodes.length === 0;
    fill("mds-rows", nodes.map((n) => h("tr", { "data-node": n.node },
      h("td", null, code(n.node)),
      h("td", null, n.addr),
      h("td", null, h("span", { class: "pill " + (n.leader ? "up" : "standby") }, n.leader ? "leader" : "standby")),
      num(String(n.term)),
      h("td", null, (n.lease_left / 1e9).toFixed(0) + "s"))), 5, "No metadata server in the election.");
    fill("etcd-rows", (s.etcd || []).map((m) => h("tr", { "data-etcd": m.name, class: m.healthy ? null : "down" },
      h("td", null, code(m.name)),
      h("td", null, (m.endpoints || []).join(", ")),
      h("td", null, m.error ? [h("span", { class: "pill down" }, "unhealthy"), " ", m.error]
        : [h("span", { class: "pill up" }, "healthy"), m.leader ? " raft leader" : ""]))), 3, "No etcd member known.");
  }

  function render(s) {
    // Ages are relative to the snapshot, not to this browser's clock.
    const now = Date.parse(s.time);
    text("mds", s.mds);
    text("cluster-id", s.cluster_id);
    text("durability", s.durability);
    const updated = document.getElementById("updated");
    updated.textContent = clock(s.time);
    updated.setAttribute("datetime", s.time);
    document.getElementById("warnings").replaceChildren(...(s.warnings || []).map((w) => h("p", { class: "warning" }, w)));
    summary(s);
    mdsNodes(s);
    dataServers(s, now);
    clients(s, now);
    layoutIO(s, now);
    files(s);
    events(s);
  }

  function live(ok, why) {
    const e = document.getElementById("live");
    e.className = "live " + (ok ? "on" : "off");
    e.textContent = ok ? "live" : "not updating";
    e.title = ok ? "" : why;
  }

  async function poll() {
    try {
      const r = await fetch("status.json", { cache: "no-store" });
      if (!r.ok) throw new Error((await r.text()) || r.statusText);
      render(await r.json());
      live(true);
    } catch (err) {
      live(false, String(err));
    } finally {
      setTimeout(poll, pollMillis);
    }
  }

  live(true);
  setTimeout(poll, pollMillis);
})();
