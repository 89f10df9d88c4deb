// One queue's page: its counts, the history graph, its lists, and what an operator can do
// to it, every action confirmed first and written to the queue's log by the server.
import { confirmAction, showMessage } from "./dialogs.js";
import { drawGraph } from "./graph.js";
import {
  $, age, api, copy, esc, expanded, idCell, job, num, plural, probe, queueKey, queueOf,
  queuePath, renderInto, sameQueue, table, when,
} from "./util.js";

let shown = null;        // {kind, name, namespace, detail, row} of the page on screen
let refreshNow = () => {};
const pausable = new Map();  // queueKey -> true | false (pause endpoints exist?) | null

export function initQueue(refresh) {
  refreshNow = refresh;
  const view = $("view-queue");
  view.addEventListener("click", onAction);
  view.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && e.target.dataset && e.target.dataset.action === "open") {
      e.preventDefault();
      open(e.target.dataset.id);
    }
  });
  $("graph-range").addEventListener("change", () => shown && drawHistory(shown.detail));
  $("sweep").addEventListener("click", sweep);
  $("purge").addEventListener("click", purge);
  $("pause").addEventListener("click", () => pause(true));
  $("resume").addEventListener("click", () => pause(false));
  $("replay-all").addEventListener("click", () => replay(null));
  $("delete-all-dead").addEventListener("click", () => deleteDead(null));
  $("retry-all").addEventListener("click", () => retry(null));
  $("delete-all-failed").addEventListener("click", () => deleteFailed(null));
  window.addEventListener("resize", () => shown && drawHistory(shown.detail));
}

/** The queue whose page is open ({kind, name, namespace, ...}), or null. */
export const openQueue = () => shown;

/** Leave the page: what it showed is forgotten (the next queue starts empty). */
export function closeQueue() { shown = null; }

export function say(text, error = false) {
  const out = $("action-result");
  out.textContent = text;
  out.classList.toggle("error", error);
  out.hidden = !text;
}

// -- drawing -----------------------------------------------------------------------------

/** Draw the page of queue ``q`` ({kind, name, namespace}). */
export function renderQueue(q, detail, row) {
  const { kind, name, namespace } = q;
  const fresh = !sameQueue(shown, q);
  shown = { ...queueOf(kind, name, namespace), detail, row };
  if (fresh) {
    say("");
    $("sweep-result").textContent = "";
    checkPause(shown);
  }
  $("queue-kind").textContent = kind;
  $("queue-namespace").textContent = namespace ? `${namespace} /` : "";
  $("queue-namespace").hidden = !namespace;
  $("queue-name").textContent = name;
  document.title = `${namespace ? `${namespace}/` : ""}${name} · belayq`;
  $("paused-badge").hidden = !(row && row.paused);
  const canPause = pausable.get(queueKey(q)) === true;
  $("pause").hidden = !canPause || Boolean(row && row.paused);
  $("resume").hidden = !canPause || !(row && row.paused);
  $("queue-error").hidden = !(row && row.error);
  $("queue-error").textContent = row && row.error ? row.error : "";
  cards(detail, row);
  drawHistory(detail);
  lists(kind, detail);
}

function cards(d, row) {
  const s = d.stats, c = d.counts;
  const values = {
    "n-ready": c.ready, "n-in-flight": c.in_flight, "n-delayed": c.delayed,
    "n-acked": c.acked, "n-nacked": s.nacked || 0, "n-dead": c.dead,
    "n-reclaimed": (s.reclaimed || 0) + (s.adopted || 0), "n-published": c.published,
    "n-in-rate": row ? row.in_per_min : null, "n-out-rate": row ? row.out_per_min : null,
    "n-framework-failed": c.failed,
  };
  for (const [id, v] of Object.entries(values)) {
    $(id).textContent = num(v, id.endsWith("rate") ? 1 : 0);
  }
  $("card-framework-failed").hidden = !d.framework_failed;
  $("n-running-for").textContent = age(c.running_for_s);
  const levels = Object.entries(d.ready_by_priority || {}).filter(([, n]) => n > 0);
  $("ready-levels").textContent = levels.length > 1
    ? "by priority: " + levels.map(([p, n]) => `${p}: ${num(n)}`).join(", ") : "";
}

function drawHistory(d) {
  drawGraph({ canvas: $("graph"), x: $("graph-x"), y: $("graph-y"), legend: $("graph-legend"),
    empty: $("graph-empty") }, d.per_minute || [], Number($("graph-range").value), Date.now());
}

function leaseBar(r, leaseMs) {
  const left = Math.max(0, Number(r.lease_left_s));
  const share = leaseMs ? Math.min(1, (left * 1000) / leaseMs) : 0;
  return `<span class="lease"><span class="bar" style="width:${Math.round(share * 100)}%">` +
    `</span></span> ${num(left, 1)} s`;
}

function historyOff(kind) {
  const own = kind === "belayq"
    ? "Open the queue with <code>history_max=50</code> (for example " +
      "<code>ReliableQueue(client, name, history_max=50)</code>) to keep the last 50 of each."
    : "Celery and RQ keep results in their own result stores; belayq's history " +
      "(<code>history_max</code>) is for its own queues.";
  return `<span data-testid="history-off">History is off (<code>history_max</code> is 0): ` +
    `belayq keeps no completed or failed messages of this queue. ${own}</span>`;
}

function lists(kind, d) {
  const idCol = ["id", (r) => idCell(r.id), "id"];
  const jobCol = ["message", (r) => esc(job(r))];
  renderInto($("list-ready"), table([idCol, jobCol], d.ready));
  renderInto($("list-delayed"), table([idCol, ["due in", (r) => age(r.due_in_s), "short"], jobCol],
    d.delayed));
  const holder = d.in_flight.some((r) => r.held_by)
    ? [["held by", (r) => esc(r.held_by), "when"]] : [];
  renderInto($("list-in-flight"), table([idCol,
    ["lease left", (r) => leaseBar(r, d.lease_ms), "leasecol"],
    ["running for", (r) => age(r.running_for_s), "short"],
    ["deliveries", (r) => esc(r.deliveries), "short"],
    ...holder, jobCol], d.in_flight, { rowClass: (r) => (r.hung ? "hung" : "") }));
  renderInto($("list-consumers"), table([
    ["holder", (r) => esc(r.holder || "(not registered yet)")],
    ["leases", (r) => esc(num(r.leases)), "short"]], d.consumers || [],
    { empty: "(no claim held)" }));
  renderInto($("list-dead"), table([idCol, ["reason", (r) => esc(r.reason)],
    ["deliveries", (r) => esc(r.deliveries), "short"],
    ["dead since", (r) => esc(when(r.dead_at_ms)), "when"],
    jobCol,
    ["", (r) => `<button type="button" class="replay" data-action="replay" data-id="${esc(r.id)}" ` +
      `data-focus="replay:${esc(r.id)}" data-testid="replay-one">Replay</button> ` +
      `<button type="button" class="danger" data-action="delete-dead" data-id="${esc(r.id)}" ` +
      `data-focus="delete:${esc(r.id)}" data-testid="delete-one">Delete</button>`, "buttons"]], d.dead));
  $("dead-count").textContent = d.dead.length < d.stats.dead
    ? `(newest ${num(d.dead.length)} of ${num(d.stats.dead)})` : "";
  const ff = d.framework_failed;
  $("panel-framework-failed").hidden = !ff;
  if (ff) {
    renderInto($("list-framework-failed"), table([idCol, ["task", (r) => esc(r.task)],
      ["failed at", (r) => esc(when(r.failed_at_ms)), "when"], ["reason", (r) => esc(r.reason)],
      ["", (r) => (ff.can_retry ? `<button type="button" data-action="retry" data-id="${esc(r.id)}" ` +
        `data-focus="retry:${esc(r.id)}" data-testid="retry-one">Requeue</button> ` : "") +
        `<button type="button" class="danger" data-action="delete-failed" data-id="${esc(r.id)}" ` +
        `data-focus="delete-failed:${esc(r.id)}" data-testid="delete-failed-one">Delete</button>`, "buttons"]],
    ff.rows));
    $("framework-failed-count").textContent = `(${plural(ff.count, "job")})`;
    $("retry-all").hidden = !ff.can_retry;
  }
  const off = d.history_max === 0 ? historyOff(kind) : null;
  renderInto($("list-completed"), table([idCol, ["result", (r) => esc(r.result)],
    ["deliveries", (r) => esc(r.deliveries), "short"],
    ["finished", (r) => esc(when(r.finished_ms)), "when"], jobCol], off ? [] : d.completed, { empty: off || "(none yet)" }));
  renderInto($("list-failed"), table([idCol, ["reason", (r) => esc(r.reason)],
    ["deliveries", (r) => esc(r.deliveries), "short"],
    ["finished", (r) => esc(when(r.finished_ms)), "when"], jobCol], off ? [] : d.failed, { empty: off || "(none yet)" }));
  renderInto($("list-actions"), actionsTable(d.actions));
}

function actionsTable(rows) {
  const detail = (a) => Object.entries(a).filter(([k]) => !["ms", "action", "by"].includes(k))
    .map(([k, v]) => `${k}: ${Array.isArray(v) ? (v.length === 1 ? v[0] : `${v.length} ids`) : v}`)
    .join(", ");
  const body = rows.map((a) => `<tr><td>${esc(when(a.ms))}</td><td><b>${esc(a.action)}</b></td>` +
    `<td>${esc(a.by)}</td><td>${esc(detail(a))}</td></tr>`).join("");
  return '<table><thead><tr><th class="when">when</th><th class="short">action</th>' +
    '<th class="when">by</th><th>what</th></tr></thead>' +
    `<tbody>${body || '<tr class="none"><td colspan="4">(nothing done from here yet)</td></tr>'}` +
    "</tbody></table>";
}

// -- what the lists' controls do ---------------------------------------------------------

function onAction(e) {
  const el = e.target.closest("[data-action]");
  if (!el || !shown) return;
  const id = el.dataset.id;
  switch (el.dataset.action) {
    case "open": open(id); break;
    case "expand":
      expanded.has(id) ? expanded.delete(id) : expanded.add(id);
      lists(shown.kind, shown.detail);
      break;
    case "copy": copy(id, el); break;
    case "replay": replay(id); break;
    case "delete-dead": deleteDead(id); break;
    case "retry": retry(id); break;
    case "delete-failed": deleteFailed(id); break;
    default: return;
  }
  e.stopPropagation();
}

/** Open message ``id`` of queue ``q`` (the page's). */
export function open(id, q = shown) {
  showMessage(queueOf(q.kind, q.name, q.namespace), id, (m) => {
    const buttons = [];
    if (m.state === "dead") {
      buttons.push({ label: "Replay", testid: "message-replay", run: () => replay(id) },
        { label: "Delete", testid: "message-delete", danger: true, run: () => deleteDead(id) });
    }
    if (m.framework && m.framework.status === "failed") {
      const ff = shown && shown.detail && shown.detail.framework_failed;
      if (ff && ff.can_retry) {
        buttons.push({ label: "Requeue", testid: "message-retry", run: () => retry(id) });
      }
      buttons.push({ label: "Delete", testid: "message-delete-failed", danger: true,
        run: () => deleteFailed(id) });
    }
    return buttons;
  });
}

/** Confirm, send, say what came back, refresh. ``body`` null: the action was cancelled. */
async function act(path, confirm, body, told) {
  const q = queueOf(shown.kind, shown.name, shown.namespace);
  if (!(await confirmAction(confirm))) {
    say("Cancelled: nothing was sent.");
    return null;
  }
  try {
    const r = await api(queuePath(q, `/${path}`), body);
    say(told(r));
    return r;
  } catch (e) {
    say(`${path} refused: ${e.message}`, true);
    if (e.routeMissing && (path === "pause" || path === "resume")) {
      pausable.set(queueKey(q), false);
    }
    return null;
  } finally {
    refreshNow();
  }
}

const everyOne = (what) => ({ typed: shown.name, text: `${what} Type the queue's name to confirm.` });

function replay(id) {
  const all = id === null;
  act("replay", {
    title: all ? "Replay every dead letter?" : "Replay this dead letter?", okLabel: "Replay",
    ...(all ? everyOne(`Every dead letter of ${shown.name} (${num(shown.detail.stats.dead)}) ` +
      "goes back to its ready list, to run again.")
      : { text: `Dead letter ${id} goes back to the ready list of ${shown.name}, to run again.` }),
  }, all ? { all: true, confirm: shown.name } : { ids: [id] },
  (r) => `Replayed ${plural(r.replayed, "dead letter")}.`);
}

function deleteDead(id) {
  const all = id === null;
  act("delete", {
    title: all ? "Delete every dead letter?" : "Delete this dead letter?", okLabel: "Delete",
    danger: true,
    ...(all ? everyOne(`Every dead letter of ${shown.name} (${num(shown.detail.stats.dead)}) ` +
      "is deleted, payload and all, for good.")
      : { text: `Dead letter ${id} is deleted, payload and all, for good.` }),
  }, all ? { all: true, confirm: shown.name, from: "dead" } : { ids: [id], from: "dead" },
  (r) => `Deleted ${plural(r.deleted, "dead letter")}.`);
}

function retry(id) {
  const all = id === null;
  const count = shown.detail.framework_failed ? shown.detail.framework_failed.count : 0;
  act("retry", {
    title: all ? "Requeue every failed job?" : "Requeue this failed job?", okLabel: "Requeue",
    ...(all ? everyOne(`Every failed job of ${shown.name} (${num(count)}) is put back on ` +
      "its queue by its framework, to run again.")
      : { text: `Failed job ${id} is put back on ${shown.name} by its framework, to run again.` }),
  }, all ? { all: true, confirm: shown.name } : { ids: [id] },
  (r) => `Requeued ${plural(r.requeued, "failed job")}.`);
}

function deleteFailed(id) {
  const all = id === null;
  const count = shown.detail.framework_failed ? shown.detail.framework_failed.count : 0;
  act("delete", {
    title: all ? "Delete every failed job?" : "Delete this failed job?", okLabel: "Delete",
    danger: true,
    ...(all ? everyOne(`Every failed job of ${shown.name} (${num(count)}) is deleted with ` +
      "its record, for good.")
      : { text: `Failed job ${id} is deleted with its record, for good.` }),
  }, all ? { all: true, confirm: shown.name, from: "failed" } : { ids: [id], from: "failed" },
  (r) => `Deleted ${plural(r.deleted, "failed job")}.`);
}

function purge() {
  act("purge", {
    title: `Purge ${shown.name}?`, okLabel: "Purge", danger: true,
    ...everyOne(`Every waiting message of ${shown.name} (ready and delayed: ` +
      `${num(shown.detail.stats.ready + shown.detail.stats.delayed)}) is deleted for good. ` +
      "Claimed messages and dead letters stay."),
  }, { confirm: shown.name }, (r) => `Purged ${plural(r.purged, "message")}.`);
}

async function sweep() {
  const r = await act("sweep", {
    title: "Run the reclaim sweep?", okLabel: "Sweep",
    text: "Expired leases go back to ready (or to the dead letters once out of runs), " +
      "and due delayed messages are promoted. The workers' lease keepers also sweep on " +
      "their own, every few seconds.",
  }, {}, (r) => `Sweep: reclaimed ${num(r.reclaimed)}, adopted ${num(r.adopted)}, ` +
    `promoted ${num(r.promoted)}, dead-lettered ${num(r.dead_lettered)}.`);
  if (r) $("sweep-result").textContent = `reclaimed ${r.reclaimed}, adopted ${r.adopted}, promoted ${r.promoted}`;
}

function pause(on) {
  act(on ? "pause" : "resume", on
    ? { title: `Pause ${shown.name}?`, okLabel: "Pause",
      text: "Its consumers stop claiming messages until it is resumed; publishing goes on." }
    : { title: `Resume ${shown.name}?`, okLabel: "Resume",
      text: "Its consumers claim messages again." },
  {}, () => (on ? `Paused ${shown.name}.` : `Resumed ${shown.name}.`));
}

/** Whether the server has the pause endpoints: a GET of one answers 404 when no route has
 * that path, 405 (POST only) when it exists. Until the answer comes, the buttons stay hidden. */
async function checkPause(q) {
  const key = queueKey(q);
  if (pausable.has(key)) return;
  pausable.set(key, null);
  try {
    pausable.set(key, (await probe(queuePath(q, "/pause"))) !== 404);
  } catch {
    pausable.delete(key);
  }
  if (sameQueue(shown, q)) {
    renderQueue(shown, shown.detail, shown.row);
  }
}
