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

// A controller that takes the connection but never answers (stopped, its event loop
// blocked) would otherwise leave the fetch pending for minutes under a "live" badge.
const FETCH_TIMEOUT_MS = 10000;
let inflight = null; // the AbortController of the fetch under way

class Unreadable extends Error {}

// Start polling now; a poll loop already running (the form submitted again while a
// fetch waits) is ended, so there is never more than one.
function restart() {
  clearTimeout(timer);
  if (inflight) inflight.abort();
  poll();
}

async function poll() {
  const started = performance.now();
  const ctl = new AbortController();
  inflight = ctl;
  const headers = {};
  const t = token();
  if (t) headers.Authorization = "Bearer " + t;
  const timeout = setTimeout(() => ctl.abort(new Error(
    `no answer in ${FETCH_TIMEOUT_MS / 1000} s`)), FETCH_TIMEOUT_MS);
  try {
    const resp = await fetch("/admin/status", { headers, cache: "no-store", signal: ctl.signal });
    if (resp.status === 401 || resp.status === 403) {
      showLogin(resp.status === 401 ? "the token was refused" : "that token may not read");
      return;
    }
    if (!resp.ok) throw new Error("controller answered " + resp.status);
    const d = await read(resp);
    try {
      render(d);
    } catch (e) {
      throw new Unreadable("cannot draw it: " + e.message);
    }
    last = d; // only a picture drawn whole: the filters redraw from it
    // For bench/status_page.py and the browser test: when the first picture was complete.
    if (!document.body.dataset.firstRenderMs) {
      document.body.dataset.firstRenderMs = String(Math.round(performance.now()));
    }
    setBadge("conn", "live", true);
    // A big fleet takes longer to fetch: never poll faster than 4× what a fetch costs.
    // Only an answer sets the pace: a fetch that timed out says nothing of the next one,
    // and 4× its timeout would leave a recovered controller unseen for 40 s.
    pollMs = Math.max(MIN_POLL_MS, 4 * (performance.now() - started));
  } catch (err) {
    if (inflight !== ctl) return; // restart() ended this loop
    const why = err instanceof Unreadable ? "unreadable answer: " : "not reachable: ";
    const shown = last ? "; figures as of " + new Date(last.now * 1000).toLocaleTimeString() : "";
    setBadge("conn", why + (ctl.signal.aborted ? ctl.signal.reason.message : err.message) +
      shown + " (retrying)", false);
  } finally {
    clearTimeout(timeout);
  }
  if (inflight !== ctl) return;
  timer = setTimeout(poll, pollMs);
}

// The answer as the page knows it, or Unreadable: a proxy's error page, a captive
// portal, an answer cut short or of another shape must not be half drawn.
async function read(resp) {
  const text = await resp.text(); // a connection lost or timed out here is not "unreadable"
  let d;
  try {
    d = JSON.parse(text);
  } catch (e) {
    throw new Unreadable("not JSON (" + (resp.headers.get("Content-Type") || "no type") + ")");
  }
  const arrays = ["nodes", "models", "replicas", "events"];
  const ok = d !== null && typeof d === "object" && typeof d.now === "number" &&
    d.summary !== null && typeof d.summary === "object" && Array.isArray(d.summary.gpus) &&
    Array.isArray(d.summary.fabrics) && typeof d.waiting === "object" &&
    arrays.every((k) => Array.isArray(d[k]) && d[k].every(Array.isArray));
  if (!ok) throw new Unreadable("not the status page's data (another llmgw version?)");
  return d;
}

function showLogin(why) {
  document.getElementById("fleet").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = why || "";
}

function render(d) {
  document.getElementById("login").hidden = true;
  document.getElementById("fleet").hidden = false;
  setText(document.getElementById("where"), location.host);
  setText(document.getElementById("clock"), new Date(d.now * 1000).toLocaleTimeString());
  setBadge("leader", d.leading ? "leader" : "standby (not acting)", d.leading);
  const s = d.summary;
  for (const e of document.querySelectorAll("[data-k]")) {
    const [a, b] = e.dataset.k.split(".");
    setText(e, s[a][b]);
  }
  setText(document.getElementById("gpu-total"), s.gpus.reduce((n, c) => n + c.total, 0));
  keyed(document.querySelector("#gpus tbody"), s.gpus, (c) => c["class"], gpuRow, (tr, c) => {
    tr.dataset.gpuClass = c["class"];
    const scale = c.total > 0 ? 100 / c.total : 0;
    const [used, bad] = tr.cells[1].firstChild.children;
    used.style.width = c.used * scale + "%";
    bad.style.width = c.unhealthy * scale + "%";
    const free = c.total - c.used - c.unhealthy;
    [c["class"], null, c.used, free, c.unhealthy, c.total].forEach((v, i) => {
      if (v !== null) setText(tr.cells[i], v);
    });
  });
  keyed(document.querySelector("#fabrics tbody"), s.fabrics, (f) => f.fabric,
    () => rowOf(["", "num nodes", "num free-nodes"]), (tr, f) => {
      tr.dataset.fabric = f.fabric;
      [f.fabric, f.nodes, f.largest_free_block].forEach((v, i) => setText(tr.cells[i], v));
    });
  list("unplaceable", s.unplaceable_reasons.map((u) => [u.model, u.reason]), "models");
  list("waiting", Object.entries(d.waiting).filter(([, n]) => n > 0)
    .map(([m, n]) => [m, n + " waiting"]), "models");
  list("idle", s.idle_replicas.map((r) =>
    [r.id, `${r.model} · idle ${Math.round(r.idle_seconds / 60)}m · ${r.gpus} GPUs`]), "replicas");
  table("nodes", d.nodes, 1);
  table("models", d.models, -1, [6]);
  // Idle seconds -1: no router has reported on the replica (unknown is not idle).
  table("replicas", d.replicas.map((r) => [...r.slice(0, 4), r[4] < 0 ? "unknown" : r[4],
    ...r.slice(5)]), 2, [6]);
  // Newest first.
  table("events", d.events.map((e) => [new Date(e[0] * 1000).toLocaleTimeString(), ...e.slice(1)])
    .reverse(), -1, [4]);
}

// Writes only what changed: rewriting a text the operator has selected clears the
// selection, so a page that redrew everything every 2 s could not be copied from.
function setText(e, v) {
  const t = v === null || v === undefined ? "–" : String(v);
  if (e.textContent !== t) e.textContent = t;
}

function setClass(e, c) {
  if (e.className !== c) e.className = c;
}

function rowOf(classes) {
  const tr = el("tr");
  for (const c of classes) tr.append(el("td", null, c));
  return tr;
}

function gpuRow() {
  const tr = rowOf(["", "", "num used", "num free", "num unhealthy", "num total"]);
  const bar = el("div", null, "bar");
  bar.append(el("span", null, "used"), el("span", null, "bad"));
  tr.cells[1].append(bar);
  return tr;
}

// Makes `parent`'s children one per item, in order: the element of a key it had before
// is kept (with the operator's selection and the layout around it) and updated; others
// are made or removed. Linear in the items; repeated keys get a count appended.
function keyed(parent, items, keyOf, make, update) {
  const old = new Map();
  for (const c of parent.children) old.set(c.rowKey, c);
  const seen = new Map();
  const want = [];
  for (const it of items) {
    let k = String(keyOf(it));
    const n = seen.get(k) || 0;
    seen.set(k, n + 1);
    if (n) k += "\u0000" + n;
    let e = old.get(k);
    if (e) {
      old.delete(k);
    } else {
      e = make(it);
      e.rowKey = k;
    }
    update(e, it);
    want.push(e);
  }
  for (const e of old.values()) e.remove();
  let at = parent.firstElementChild;
  for (const e of want) {
    if (e === at) at = at.nextElementSibling;
    else parent.insertBefore(e, at);
  }
}

const LIST_SHOWN = 10; // per summary list; the tables below hold every one

function list(id, items, tableName) {
  const shown = items.slice(0, LIST_SHOWN).map(([name, why]) => ({ name, why }));
  const rest = items.length - shown.length;
  if (items.length === 0) shown.push({ more: "none" });
  if (rest > 0) shown.push({ more: `… ${rest} more: the ${tableName} table below has them all` });
  keyed(document.getElementById(id), shown, (it) => (it.more ? "\u0001more" : it.name), (it) => {
    if (it.more) return el("li", null, "more");
    const li = el("li");
    li.append(el("b"), document.createTextNode(""));
    return li;
  }, (li, it) => {
    if (it.more) return setText(li, it.more);
    li.dataset.name = it.name;
    setText(li.firstChild, it.name);
    const why = " — " + it.why;
    if (li.lastChild.data !== why) li.lastChild.data = why;
  });
}

function table(name, rows, stateCol, wrapCols) {
  const sec = document.querySelector(`section[data-table="${name}"]`);
  const q = sec.querySelector("input").value.trim().toLowerCase();
  const match = q ? rows.filter((r) => r.join(" ").toLowerCase().includes(q)) : rows;
  keyed(sec.querySelector("tbody"), match.slice(0, ROWS_SHOWN), (r) => r[0], () => el("tr"),
    (tr, r) => {
      if (tr.dataset.key !== String(r[0])) tr.dataset.key = r[0];
      while (tr.cells.length < r.length) tr.append(el("td"));
      while (tr.cells.length > r.length) tr.lastChild.remove();
      r.forEach((v, i) => {
        const td = tr.cells[i];
        setText(td, v);
        let cls = typeof v === "number" ? "num" : "";
        if (wrapCols && wrapCols.includes(i)) cls = "wrap";
        if (i === stateCol) cls = "state-" + v;
        setClass(td, cls);
      });
    });
  const more = match.length - Math.min(match.length, ROWS_SHOWN);
  setText(sec.querySelector(".count"),
    `${match.length} of ${rows.length}` + (more > 0 ? ` · ${more} not shown, filter to narrow` : ""));
}

document.addEventListener("DOMContentLoaded", () => {
  for (const input of document.querySelectorAll("section.table input")) {
    input.addEventListener("input", () => last && render(last));
  }
  document.getElementById("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem("llmgw-token", document.getElementById("token").value);
    restart();
  });
  poll();
});
