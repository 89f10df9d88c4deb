// The console of a fleet's queues: the overview of every queue (#/), one queue's page
// (#/queue/<kind>/<name>, and ?namespace=<ns> for a queue of an app's own namespace), search
// by message id, and the demo's pool when there is one.
// It reads the JSON API every second; nothing is loaded from anywhere else.
import {
  $, ApiError, age, api, enc, esc, namespaceQuery, num, queueOf, queuePath, renderInto, sameQueue,
} from "./util.js";
import { closeMessageUnlessOf } from "./dialogs.js";
import { closeQueue, initQueue, open, openQueue, renderQueue } from "./queue.js";

const REFRESH_MS = 1000;

// -- routes ------------------------------------------------------------------------------

/** The view the address names: {view: "overview"}, or {view: "queue", queue}. */
function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const cut = hash.indexOf("?");  // a name's own "?" is sent encoded
  const parts = (cut < 0 ? hash : hash.slice(0, cut)).split("/");
  if (parts[0] === "queue" && parts.length >= 3) {
    const query = new URLSearchParams(cut < 0 ? "" : hash.slice(cut + 1));
    return { view: "queue", queue: queueOf(decodeURIComponent(parts[1]),
      decodeURIComponent(parts.slice(2).join("/")), query.get("namespace")) };
  }
  return { view: "overview" };
}

export const queueHash = (q) => `#/queue/${enc(q.kind)}/${enc(q.name)}${namespaceQuery(q)}`;

/** The queue of an overview line (its data-kind, data-queue and data-namespace). */
const queueOfRow = (row) => queueOf(row.dataset.kind, row.dataset.queue, row.dataset.namespace);

function show(r) {
  $("view-overview").hidden = r.view !== "overview";
  $("view-queue").hidden = r.view !== "queue";
  if (r.view === "overview") {
    closeQueue();
    document.title = "belayq";
  }
}

// -- the overview ------------------------------------------------------------------------

const COLUMNS = [
  ["kind", "kind", "text"], ["queue", "queue", "text"], ["ready", "ready", "n"],
  ["delayed", "delayed", "n"], ["in_flight", "in flight", "n"], ["dead", "dead", "n"],
  ["failed", "framework failed", "n"], ["in_per_min", "in/min", "rate"],
  ["out_per_min", "out/min", "rate"], ["oldest_ready_s", "oldest waiting", "age"],
  ["running_for_s", "running for", "age"], ["paused", "paused", "flag"],
  ["error", "error", "text"],
];
const sorting = { key: "queue", descending: false };
let lastOverview = null;

function compare(a, b) {
  const x = a[sorting.key], y = b[sorting.key];
  const missing = (v) => v === null || v === undefined || v === "";
  if (missing(x) || missing(y)) return missing(x) - missing(y);  // the unknown go last
  const order = typeof x === "string" ? x.localeCompare(y) : Number(x) - Number(y);
  return sorting.descending ? -order : order;
}

function cell(row, key, type) {
  const v = row[key];
  if (type === "n") return num(v);
  if (type === "rate") return num(v, 1);
  if (type === "age") return age(v);
  if (type === "flag") return v ? '<span class="badge warn" data-testid="paused-flag">paused</span>' : "";
  if (key === "error") return v ? `<span class="error">${esc(v)}</span>` : "";
  if (key === "kind") return `<span class="kind">${esc(v)}</span>`;
  if (key === "queue" && row.namespace) {  // another app's queue of this name
    return `<span class="muted" data-testid="overview-namespace">${esc(row.namespace)} / </span>` +
      `<b>${esc(v)}</b>`;
  }
  return `<b>${esc(v)}</b>`;
}

function renderOverview(o) {
  const rows = [...o.queues].sort((a, b) => compare(a, b) ||
    `${a.kind}/${a.queue}`.localeCompare(`${b.kind}/${b.queue}`) ||
    (a.namespace || "").localeCompare(b.namespace || ""));
  const head = "<thead><tr>" + COLUMNS.map(([key, label, type]) => {
    const on = sorting.key === key;
    const aria = on ? ` aria-sort="${sorting.descending ? "descending" : "ascending"}"` : "";
    const arrow = on ? (sorting.descending ? " ▼" : " ▲") : "";
    return `<th scope="col" class="${type}"${aria}><button type="button" data-sort="${key}" ` +
      `data-focus="sort:${key}" data-testid="sort-${key}">${esc(label)}${arrow}</button></th>`;
  }).join("") + "</tr></thead>";
  const body = rows.map((r) => `<tr tabindex="0" data-testid="overview-row" ` +
    `data-kind="${esc(r.kind)}" data-queue="${esc(r.queue)}" data-namespace="${esc(r.namespace || "")}" ` +
    `data-focus="q:${esc(r.kind)}/${esc(r.namespace || "")}/${esc(r.queue)}"` +
    `${r.error ? ' class="broken"' : ""}>` +
    COLUMNS.map(([key, , type]) => `<td class="${type}">${cell(r, key, type)}</td>`).join("") +
    "</tr>").join("");
  const none = `<tr class="none"><td colspan="${COLUMNS.length}">No queue found: a queue ` +
    "shows here once a process has opened it (or an RQ or Celery queue holds a message).</td></tr>";
  renderInto($("overview"), `<table>${head}<tbody>${body || none}</tbody></table>`);
  const total = (k) => o.queues.reduce((s, q) => s + (Number(q[k]) || 0), 0);
  $("overview-summary").textContent = `${num(o.queues.length)} queue${o.queues.length === 1 ? "" : "s"}` +
    ` · ${num(total("ready"))} ready · ${num(total("in_flight"))} in flight` +
    ` · ${num(total("dead"))} dead · ${num(total("failed"))} failed in their framework`;
}

$("overview").addEventListener("click", (e) => {
  const sort = e.target.closest("[data-sort]");
  if (sort) {
    const key = sort.dataset.sort;
    const numeric = COLUMNS.find(([k]) => k === key)[2] !== "text";
    sorting.descending = sorting.key === key ? !sorting.descending : numeric;
    sorting.key = key;
    if (lastOverview) renderOverview(lastOverview);
    return;
  }
  const row = e.target.closest("tr[data-queue]");
  if (row) location.hash = queueHash(queueOfRow(row));
});
$("overview").addEventListener("keydown", (e) => {
  const row = e.target.closest && e.target.closest("tr[data-queue]");
  if (e.key === "Enter" && row && e.target === row) {
    e.preventDefault();
    location.hash = queueHash(queueOfRow(row));
  }
});

// -- the demo's pool ---------------------------------------------------------------------

function renderDemo(demo) {
  $("demo").hidden = !demo;
  if (!demo) return;
  const s = demo.settings, c = demo.counts;
  const running = demo.alive > 0;
  const badge = $("pool-badge");
  badge.textContent = running ? "running" : "stopped";
  badge.className = "badge " + (running ? "ok" : "idle");
  $("pool-state").innerHTML =
    `<span><b>${num(demo.alive)}</b> of ${num(s.size)} workers alive</span>` +
    `<span>latency <b>${num(s.latency_ms)} ms</b></span>` +
    `<span>fail <b>${Math.round(s.fail_rate * 100)} %</b></span>` +
    `<span>hang <b>${Math.round(s.hang_rate * 100)} %</b></span>` +
    `<span>enqueued <b>${num(c.enqueued || 0)}</b></span>` +
    `<span>completed <b>${num(c.completed || 0)}</b></span>` +
    `<span>failed runs <b>${num(c.failed_runs || 0)}</b></span>` +
    `<span>hung <b>${num(c.hung || 0)}</b></span>` +
    (c.errors ? `<span class="error">errors <b>${num(c.errors)}</b></span>` : "");
}

async function demoAction(path, body) {
  try {
    await api(`/api/demo/${path}`, body);
    $("demo-result").textContent = "";
  } catch (e) {
    $("demo-result").textContent = e.message;
  }
  refresh();
}

$("enqueue-form").addEventListener("submit", (e) => {
  e.preventDefault();
  demoAction("enqueue", { kind: $("job-kind").value, count: Number($("job-count").value) });
});
$("pool-form").addEventListener("submit", (e) => {
  e.preventDefault();
  demoAction("workers", { size: Number($("pool-size").value),
    latency_ms: Number($("pool-latency").value), fail_rate: Number($("pool-fail").value) / 100,
    hang_rate: Number($("pool-hang").value) / 100 });
});
$("stop-workers").addEventListener("click", () => demoAction("stop", {}));

// -- search by message id ----------------------------------------------------------------

$("search-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const id = $("search").value.trim();
  const out = $("search-result");
  if (!id) return;
  out.hidden = false;
  out.textContent = "searching…";
  try {
    const { found } = await api(`/api/search?id=${enc(id)}`);
    if (found.length === 0) {
      out.textContent = `No queue knows a message ${id} (in a long backlog, a waiting ` +
        "message is looked for near either end only).";
    } else if (found.length === 1) {
      out.hidden = true;
      openFound(found[0], id);
    } else {
      out.innerHTML = `${esc(id)} is in ${found.length} queues: ` + found.map((f, i) =>
        `<button type="button" data-hit="${i}">${esc(f.kind)}/` +
        `${f.namespace ? `${esc(f.namespace)}/` : ""}${esc(f.queue)} (${esc(f.state)})</button>`).join(" ");
      out.querySelectorAll("[data-hit]").forEach((b) => b.addEventListener("click", () => {
        out.hidden = true;
        openFound(found[Number(b.dataset.hit)], id);
      }));
    }
  } catch (err) {
    out.textContent = err.message;
  }
});

function openFound(hit, id) {
  const q = queueOf(hit.kind, hit.queue, hit.namespace);
  location.hash = queueHash(q);
  open(hit.id || id, q);  // by belayq's id, whichever id was typed
}

document.addEventListener("keydown", (e) => {
  const typing = e.target.closest && e.target.closest("input, textarea, select, [contenteditable]");
  if (e.key === "/" && !typing && !document.querySelector("dialog[open]")) {
    e.preventDefault();
    $("search").focus();
    $("search").select();
  }
});

// -- the server's eviction policy ---------------------------------------------------------

/** The banner that says queue data can vanish (the server's words; its link made live). */
function renderEviction(text) {
  const banner = $("eviction-banner");
  banner.hidden = !text;
  if (!text) return;
  banner.innerHTML = esc(text).replace(/https?:\/\/[^\s<]+/g, (url) =>
    `<a href="${url}" rel="noreferrer" target="_blank">${url}</a>`);
}

// -- the refresh -------------------------------------------------------------------------

let timer = null;
let running = null;

async function load() {
  const r = route();
  const o = await api("/api/overview");
  lastOverview = o;
  renderEviction(o.eviction);
  renderDemo(o.demo);
  if (r.view === "overview") {
    renderOverview(o);
    return;
  }
  const row = o.queues.find((q) => sameQueue(queueOf(q.kind, q.queue, q.namespace),
    r.queue)) || null;
  try {
    const d = await api(queuePath(r.queue));
    const now = route();
    if (now.view === "queue" && sameQueue(now.queue, r.queue)) {
      $("queue-missing").hidden = true;
      $("queue-page").hidden = false;
      renderQueue(r.queue, d, row);
    }
  } catch (e) {
    if (!(e instanceof ApiError) || e.status !== 404) throw e;
    closeQueue();
    $("queue-page").hidden = true;
    $("queue-missing").hidden = false;
    $("queue-missing").textContent = e.message;
  }
}

/** Read the API now (and again every REFRESH_MS); a read in progress is not doubled. */
export function refresh() {
  if (running) return running;
  clearTimeout(timer);
  running = load().then(() => {
    $("status").textContent = "live · " + new Date().toLocaleTimeString();
    $("status").classList.remove("error");
  }, (e) => {
    $("status").textContent = "error: " + e.message;
    $("status").classList.add("error");
  }).finally(() => {
    running = null;
    timer = setTimeout(refresh, REFRESH_MS);
  });
  return running;
}

window.addEventListener("hashchange", () => {
  const r = route();
  closeMessageUnlessOf(r.view === "queue" ? r.queue : null);
  if (r.view !== "queue" || !sameQueue(openQueue(), r.queue)) {
    $("queue-page").hidden = true;  // nothing of another queue shows while this one loads
  }
  show(r);
  running ? running.then(refresh) : refresh();
});

initQueue(refresh);
show(route());
refresh();
