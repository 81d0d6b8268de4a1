// The llmgw status page: polls GET /admin/status and redraws. No framework, no build.
// The token comes from the address (#token=…, never sent to the server in the URL),
// or the form; it is kept for this tab only (sessionStorage).
"use strict";

const ROWS_SHOWN = 200; // per table; the filter narrows the rest
const MIN_POLL_MS = 2000;
let pollMs = MIN_POLL_MS;
let last = null;
let timer = null;

function token() {
  const m = /(?:^|&)token=([^&]*)/.exec(location.hash.slice(1));
  if (m) {
    let t = m[1];
    try {
      t = decodeURIComponent(t);
    } catch (e) {
      // Not percent-encoding (a hand-edited link): the token as written, which the
      // server then refuses, so the login form shows instead of a blank page.
    }
    sessionStorage.setItem("llmgw-token", t);
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem("llmgw-token") || "";
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function setBadge(id, text, ok) {
  const b = document.getElementById(id);
  b.textContent = text;
  b.className = "badge " + (ok ? "ok" : "bad");
}

async function poll() {
  const started = performance.now();
  const headers = {};
  const t = token();
  if (t) headers.Authorization = "Bearer " + t;
  try {
    const resp = await fetch("/admin/status", { headers, cache: "no-store" });
    if (resp.status === 401 || resp.status === 403) {
      showLogin(resp.status === 401 ? "the token was refused" : "that token may not read");
      return;
    }
    if (!resp.ok) throw new Error("controller answered " + resp.status);
    last = await resp.json();
    render(last);
    // For bench/status_page.py and the browser test: when the first picture was complete.
    if (!document.body.dataset.firstRenderMs) {
      document.body.dataset.firstRenderMs = String(Math.round(performance.now()));
    }
    setBadge("conn", "live", true);
  } catch (err) {
    setBadge("conn", "not reachable: " + err.message + " (retrying)", false);
  }
  // A big fleet takes longer to fetch: never poll faster than 4× what a fetch costs.
  pollMs = Math.max(MIN_POLL_MS, 4 * (performance.now() - started));
  timer = setTimeout(poll, pollMs);
}

function showLogin(why) {
  document.getElementById("fleet").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = why || "";
}

function render(d) {
  document.getElementById("login").hidden = true;
  document.getElementById("fleet").hidden = false;
  document.getElementById("where").textContent = location.host;
  document.getElementById("clock").textContent = new Date(d.now * 1000).toLocaleTimeString();
  setBadge("leader", d.leading ? "leader" : "standby (not acting)", d.leading);
  const s = d.summary;
  for (const e of document.querySelectorAll("[data-k]")) {
    const [a, b] = e.dataset.k.split(".");
    e.textContent = s[a][b];
  }
  let gpuTotal = 0;
  const gpus = document.querySelector("#gpus tbody");
  gpus.replaceChildren();
  for (const c of s.gpus) {
    gpuTotal += c.total;
    const free = c.total - c.used - c.unhealthy;
    const tr = el("tr");
    tr.dataset.gpuClass = c["class"];
    tr.append(el("td", c["class"]));
    const bar = el("div", null, "bar");
    const used = el("span", null, "used");
    const bad = el("span", null, "bad");
    const scale = c.total > 0 ? 100 / c.total : 0;
    used.style.width = c.used * scale + "%";
    bad.style.width = c.unhealthy * scale + "%";
    bar.append(used, bad);
    const bc = el("td");
    bc.append(bar);
    tr.append(bc, el("td", c.used, "num used"), el("td", free, "num free"),
      el("td", c.unhealthy, "num unhealthy"), el("td", c.total, "num total"));
    gpus.append(tr);
  }
  document.getElementById("gpu-total").textContent = gpuTotal;
  const fabrics = document.querySelector("#fabrics tbody");
  fabrics.replaceChildren();
  for (const f of s.fabrics) {
    const tr = el("tr");
    tr.dataset.fabric = f.fabric;
    tr.append(el("td", f.fabric), el("td", f.nodes, "num nodes"),
      el("td", f.largest_free_block, "num free-nodes"));
    fabrics.append(tr);
  }
  list("unplaceable", s.unplaceable_reasons.map((u) => [u.model, u.reason]));
  list("waiting", Object.entries(d.waiting).filter(([, n]) => n > 0)
    .map(([m, n]) => [m, n + " waiting"]));
  list("idle", s.idle_replicas.map((r) =>
    [r.id, `${r.model} · idle ${Math.round(r.idle_seconds / 60)}m · ${r.gpus} GPUs`]));
  table("nodes", d.nodes, [2, 3], 1);
  table("models", d.models, [], -1, [6]);
  // Idle seconds -1: no router has reported on the replica (unknown is not idle).
  table("replicas", d.replicas.map((r) => [...r.slice(0, 4), r[4] < 0 ? "unknown" : r[4],
    ...r.slice(5)]), [], 2, [6]);
  // Newest first.
  table("events", d.events.map((e) => [new Date(e[0] * 1000).toLocaleTimeString(), ...e.slice(1)])
    .reverse(), [], -1, [4]);
}

function list(id, items) {
  const ul = document.getElementById(id);
  ul.replaceChildren();
  if (items.length === 0) ul.append(el("li", "none", "more"));
  for (const [name, why] of items) {
    const li = el("li");
    li.dataset.name = name;
    li.append(el("b", name), document.createTextNode(" — " + why));
    ul.append(li);
  }
}

function table(name, rows, textCols, stateCol, wrapCols) {
  const sec = document.querySelector(`section[data-table="${name}"]`);
  const q = sec.querySelector("input").value.trim().toLowerCase();
  const match = q ? rows.filter((r) => r.join(" ").toLowerCase().includes(q)) : rows;
  const body = sec.querySelector("tbody");
  const frag = document.createDocumentFragment();
  for (const r of match.slice(0, ROWS_SHOWN)) {
    const tr = el("tr");
    tr.dataset.key = r[0];
    r.forEach((v, i) => {
      const td = el("td", v === null ? "–" : v);
      if (typeof v === "number") td.className = "num";
      if (wrapCols && wrapCols.includes(i)) td.className = "wrap";
      if (i === stateCol) td.className = "state-" + v;
      tr.append(td);
    });
    frag.append(tr);
  }
  body.replaceChildren(frag);
  const more = match.length - Math.min(match.length, ROWS_SHOWN);
  sec.querySelector(".count").textContent =
    `${match.length} of ${rows.length}` + (more > 0 ? ` · ${more} not shown, filter to narrow` : "");
}

document.addEventListener("DOMContentLoaded", () => {
  for (const input of document.querySelectorAll("section.table input")) {
    input.addEventListener("input", () => last && render(last));
  }
  document.getElementById("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem("llmgw-token", document.getElementById("token").value);
    clearTimeout(timer);
    poll();
  });
  poll();
});
