// The dashboard page: polls the API every 800 ms and draws counts, lists and a chart.
"use strict";
const REFRESH_MS = 800;
const CHART_POINTS = 150; // 2 minutes at 800 ms
const SERIES = { acked: "#16a34a", nacked: "#f59e0b", reclaimed: "#3b82f6", dead_lettered: "#b91c1c" };
const token = new URLSearchParams(location.hash.slice(1)).get("token");
let current = null;      // "kind/name" of the queue shown
let last = null;         // the previous counters, for rates
const history = [];      // [{t, acked, nacked, reclaimed, dead_lettered}] per second

async function api(path, body) {
  const init = { headers: {} };
  if (token) init.headers.Authorization = "Bearer " + token;
  if (body !== undefined) {
    init.method = "POST";
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  const data = await r.json();
  if (!r.ok) throw new Error(data.error || r.statusText);
  return data;
}

const $ = (id) => document.getElementById(id);
const esc = (s) => String(s ?? "–").replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
const what = (row) => row.task ? `${row.task} ${row.task_id || ""}` : (row.payload ?? "");

function table(id, columns, rows, rowClass) {
  const head = "<tr>" + columns.map(([h]) => `<th>${esc(h)}</th>`).join("") + "</tr>";
  const body = rows.map((r) => `<tr class="${rowClass ? rowClass(r) : ""}" data-id="${esc(r.id)}">` +
    columns.map(([, f]) => `<td>${f(r)}</td>`).join("") + "</tr>").join("");
  $(id).innerHTML = head + (body || `<tr><td colspan="${columns.length}">(none)</td></tr>`);
}

function leaseBar(row, leaseMs) {
  const left = Math.max(0, row.lease_left_s);
  const width = Math.round(80 * Math.min(1, (left * 1000) / leaseMs));
  return `<span class="bar" style="width:${width}px"></span> ${left.toFixed(1)} s`;
}

async function refresh() {
  try {
    const o = await api("/api/overview");
    const select = $("queue-select");
    const keys = o.queues.map((q) => `${q.kind}/${q.queue}`);
    if (select.options.length !== keys.length || keys.some((k, i) => select.options[i].value !== k)) {
      select.innerHTML = keys.map((k) => `<option value="${esc(k)}">${esc(k)}</option>`).join("");
      if (current && keys.includes(current)) select.value = current;
    }
    current = select.value || null;
    $("demo").hidden = !o.demo;
    if (o.demo) {
      const s = o.demo.settings, c = o.demo.counts;
      $("pool-state").textContent = `${o.demo.alive} worker(s) running · latency ${s.latency_ms} ms · ` +
        `fail ${Math.round(s.fail_rate * 100)} % · hang ${Math.round(s.hang_rate * 100)} % · ` +
        `enqueued ${c.enqueued || 0} · hung ${c.hung || 0}`;
    }
    if (!current) { $("status").textContent = "no queues found"; return; }
    const d = await api(`/api/queue/${current}`);
    show(d);
    $("status").textContent = "live · " + new Date().toLocaleTimeString();
    $("status").classList.remove("error");
  } catch (e) {
    $("status").textContent = "error: " + e.message;
    $("status").classList.add("error");
  }
}

function show(d) {
  const s = d.stats;
  for (const [id, v] of [["n-ready", s.ready], ["n-in-flight", s.in_flight], ["n-delayed", s.delayed],
    ["n-acked", s.acked || 0], ["n-nacked", s.nacked || 0], ["n-dead", s.dead],
    ["n-reclaimed", (s.reclaimed || 0) + (s.adopted || 0)], ["n-published", s.published || 0]]) {
    $(id).textContent = v;
  }
  table("list-ready", [["id", (r) => esc(r.id)], ["job", (r) => esc(what(r))]], d.ready);
  table("list-in-flight", [["id", (r) => esc(r.id)], ["lease left", (r) => leaseBar(r, d.lease_ms)],
    ["deliveries", (r) => esc(r.deliveries)], ["held by", (r) => esc(r.held_by || null)],
    ["job", (r) => esc(what(r))]], d.in_flight, (r) => (r.hung ? "hung" : ""));
  table("list-completed", [["id", (r) => esc(r.id)], ["result", (r) => esc(r.result)],
    ["deliveries", (r) => esc(r.deliveries)], ["job", (r) => esc(what(r))]],
    d.history_max ? d.completed : []);
  table("list-dead", [["id", (r) => esc(r.id)], ["reason", (r) => esc(r.reason)],
    ["deliveries", (r) => esc(r.deliveries)], ["job", (r) => esc(what(r))],
    ["", (r) => `<button type="button" class="replay" data-id="${esc(r.id)}">Replay</button>`]], d.dead);
  table("list-delayed", [["id", (r) => esc(r.id)], ["due in", (r) => esc(r.due_in_s) + " s"],
    ["job", (r) => esc(what(r))]], d.delayed);
  sample(s);
  draw();
}

function sample(s) {
  const now = Date.now() / 1000;
  const counters = Object.fromEntries(Object.keys(SERIES).map((k) => [k, s[k] || 0]));
  counters.reclaimed += s.adopted || 0;
  if (last && now > last.t) {
    const point = { t: now };
    for (const k of Object.keys(SERIES)) point[k] = Math.max(0, (counters[k] - last[k]) / (now - last.t));
    history.push(point);
    if (history.length > CHART_POINTS) history.shift();
  }
  last = { t: now, ...counters };
}

function draw() {
  const c = $("chart"), g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const top = Math.max(1, ...history.flatMap((p) => Object.keys(SERIES).map((k) => p[k])));
  g.fillStyle = "#889"; g.font = "11px system-ui"; g.fillText(top.toFixed(1) + "/s", 2, 11);
  for (const [k, color] of Object.entries(SERIES)) {
    g.strokeStyle = color; g.lineWidth = 2; g.beginPath();
    history.forEach((p, i) => {
      const x = (i / (CHART_POINTS - 1)) * c.width, y = c.height - 2 - (p[k] / top) * (c.height - 16);
      i ? g.lineTo(x, y) : g.moveTo(x, y);
    });
    g.stroke();
  }
}

async function act(path, body, out) {
  try {
    const r = await api(path, body);
    if (out) $(out).textContent = out === "sweep-result" ? `reclaimed ${r.reclaimed}, adopted ${r.adopted}, promoted ${r.promoted}` : "";
  } catch (e) { alert(e.message); }
  refresh();
}

$("sweep").onclick = () => current && act(`/api/queue/${current}/sweep`, {}, "sweep-result");
$("replay-all").onclick = () => current && act(`/api/queue/${current}/replay`, { all: true });
$("list-dead").onclick = (e) => {
  const id = e.target.dataset && e.target.dataset.id;
  if (id && e.target.classList.contains("replay")) act(`/api/queue/${current}/replay`, { ids: [id] });
};
$("queue-select").onchange = () => { current = $("queue-select").value; last = null; history.length = 0; refresh(); };
$("enqueue-form").onsubmit = (e) => {
  e.preventDefault();
  act("/api/demo/enqueue", { kind: $("job-kind").value, count: Number($("job-count").value) });
};
$("pool-form").onsubmit = (e) => {
  e.preventDefault();
  act("/api/demo/workers", { size: Number($("pool-size").value), latency_ms: Number($("pool-latency").value),
    fail_rate: Number($("pool-fail").value) / 100, hang_rate: Number($("pool-hang").value) / 100 });
};
$("stop-workers").onclick = () => act("/api/demo/stop", {});
refresh();
setInterval(refresh, REFRESH_MS);
