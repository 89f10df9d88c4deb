// The two dialogs: the confirmation every action passes through (typing the queue's name
// for a purge and for every "all"), and one message's detail.
import { $, api, copy, esc, json, num, queueKey, queuePath, when, enc } from "./util.js";

// -- confirmation ------------------------------------------------------------------------

let settle = null;  // resolves the confirmation shown

/** Ask before an action; resolves true once confirmed, false when cancelled (the Cancel
 * button, or Escape). ``typed``: the text to type first (the queue's name). ``danger``:
 * the action destroys something, so the focus starts on Cancel. */
export function confirmAction({ title, text, okLabel = "Confirm", typed = null, danger = false }) {
  const dialog = $("confirm");
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-ok").textContent = okLabel;
  $("confirm-ok").classList.toggle("danger", danger);
  const field = $("confirm-name");
  $("confirm-typed").hidden = typed === null;
  $("confirm-expected").textContent = typed ?? "";
  field.value = "";
  $("confirm-ok").disabled = typed !== null;
  field.oninput = () => { $("confirm-ok").disabled = field.value !== typed; };
  return new Promise((resolve) => {
    settle = resolve;
    dialog.showModal();
    (typed !== null ? field : danger ? $("confirm-cancel") : $("confirm-ok")).focus();
  });
}

function closeConfirm(answer) {
  const dialog = $("confirm");
  if (dialog.open) dialog.close();
  if (settle) { const s = settle; settle = null; s(answer); }
}

$("confirm-ok").addEventListener("click", () => closeConfirm(true));
$("confirm-cancel").addEventListener("click", () => closeConfirm(false));
$("confirm").addEventListener("close", () => closeConfirm(false));  // Escape
$("confirm-name").addEventListener("keydown", (e) => {
  if (e.key === "Enter") {
    e.preventDefault();
    if (!$("confirm-ok").disabled) closeConfirm(true);
  }
});

// -- a message's detail ------------------------------------------------------------------

const STATE_CLASS = { ready: "ok", delayed: "info", "in flight": "info", dead: "bad",
  completed: "ok", failed: "bad" };

/** A definition: ``value`` is text (escaped here), or html when ``html``; none, nothing. */
function field(label, value, testid, html = false) {
  if (value === null || value === undefined || value === "") return "";
  const id = testid ? ` data-testid="${testid}"` : "";
  return `<dt>${esc(label)}</dt><dd${id}>${html ? value : esc(value)}</dd>`;
}

const code = (v) => (v === null || v === undefined ? null : `<code>${esc(v)}</code>`);
const at = (ms) => (ms ? when(ms) : null);

function block(label, text, testid) {
  if (text === null || text === undefined) return "";
  return `<h3>${esc(label)}</h3><pre data-testid="${testid}">${esc(text)}</pre>`;
}

function payloadHtml(p) {
  if (!p) return '<p class="muted">No payload is kept for it.</p>';
  const size = `<p class="muted">${num(p.bytes)} bytes${p.truncated ? ", shown cut" : ""}</p>`;
  if (p.celery) {
    const c = p.celery;
    return "<h3>Celery task</h3><dl>" +
      field("task", c.task, "message-task") + field("task id", c.id) +
      field("retries", c.retries) + field("ETA", c.eta) + field("expires", c.expires) +
      field("root id", c.root_id) + field("parent id", c.parent_id) +
      field("group", c.group) + field("origin", c.origin) + field("body", c.body) + "</dl>" +
      ("args" in c ? block("args", json(c.args), "message-args") : "") +
      ("kwargs" in c ? block("kwargs", json(c.kwargs), "message-kwargs") : "") + size;
  }
  if (p.json !== null && p.json !== undefined) {
    return block("payload (JSON)", json(p.json), "message-json") + size;
  }
  return block("payload", p.text ?? "", "message-text") + size;
}

const FRAMEWORK_NAMES = { celery: "Celery", dramatiq: "Dramatiq" };

/** A failed run an adapter recorded (belayq.failures). */
function failedRunHtml(r) {
  return `<h3>${esc(FRAMEWORK_NAMES[r.framework] || "The framework")}'s failed run</h3><dl>` +
    field("task", r.task, "job-function") + field("status", r.status, "job-status") +
    field("job id", r.id) + field("message id", r.message_id) +
    field("failed", at(r.failed_at_ms)) + field("retries", r.retries) +
    field("worker", r.worker) + field("root id", r.root_id) + field("parent id", r.parent_id) +
    field("args", code(r.args), null, true) + field("kwargs", code(r.kwargs), null, true) +
    field("exception", r.reason, "job-reason") + "</dl>" +
    block("traceback", r.exc_info, "exc-info");
}

function frameworkHtml(f) {
  if (!f) return "";
  if (f.framework) return failedRunHtml(f);
  if (f.actor_name !== undefined) {
    return "<h3>Dramatiq's message</h3><dl>" +
      field("actor", f.actor_name, "job-function") + field("queue", f.queue_name) +
      field("message id", f.message_id) + field("sent", at(f.message_timestamp)) +
      field("options", code(json(f.options)), null, true) + "</dl>" +
      block("args", json(f.args), "message-args") + block("kwargs", json(f.kwargs), "message-kwargs") +
      (f.last_failure ? failedRunHtml(f.last_failure) : "");
  }
  return "<h3>RQ's job record</h3><dl>" +
    field("function", f.function, "job-function") + field("status", f.status, "job-status") +
    field("description", f.description) + field("origin", f.origin) +
    field("enqueued", at(f.enqueued_at_ms)) + field("started", at(f.started_at_ms)) +
    field("ended", at(f.ended_at_ms)) + field("retries left", f.retries_left) +
    field("args", code(f.args), null, true) + field("kwargs", code(f.kwargs), null, true) +
    field("result", code(f.result), "job-result", true) + "</dl>" +
    block("traceback", f.exc_info, "exc-info");
}

function messageHtml(q, m) {
  const badge = `<span class="badge ${STATE_CLASS[m.state] || ""}">${esc(m.state)}</span>`;
  const secs = (v) => (v === undefined || v === null ? null : `${num(v, 1)} s`);
  return "<dl>" +
    field("queue", [q.kind, q.namespace, q.name].filter(Boolean).join(" / ")) + field("state", badge, "message-state", true) +
    field("shard", m.shard) + field("lease left", secs(m.lease_left_s)) +
    field("due in", secs(m.due_in_s)) + field("dead since", at(m.dead_at_ms)) +
    field("deliveries", m.deliveries) + field("runs (attempts)", m.attempts) +
    field("priority level", m.level) + field("error", m.error ?? m.reason, "message-error") +
    field("result", m.result) + field("published", at(m.published_ms)) +
    field("finished", at(m.finished_ms)) + "</dl>" +
    (m.payload || !m.framework ? payloadHtml(m.payload) : "") + frameworkHtml(m.framework);
}

/** Open message ``id`` of queue ``q`` ({kind, name, namespace}). ``actionsFor(message)``
 * lists the buttons its state allows: [{label, testid, run}], each run closing the detail
 * first. */
export async function showMessage(q, id, actionsFor) {
  const dialog = $("message");
  const whose = JSON.stringify([queueKey(q), id]);
  dialog.dataset.queue = queueKey(q);
  dialog.dataset.shows = whose;
  $("message-id").textContent = id;
  $("message-body").innerHTML = '<p class="muted">loading…</p>';
  $("message-actions").innerHTML = "";
  if (!dialog.open) dialog.showModal();
  $("message-close").focus();
  let m;
  try {
    m = await api(queuePath(q, `/message/${enc(id)}`));
  } catch (e) {
    if (dialog.open && dialog.dataset.shows === whose) {
      $("message-body").innerHTML = `<p class="error" data-testid="message-missing">${esc(e.message)}</p>`;
    }
    return;
  }
  if (!dialog.open || dialog.dataset.shows !== whose) return;  // closed, or another since
  $("message-body").innerHTML = messageHtml(q, m);
  const buttons = actionsFor ? actionsFor(m) : [];
  const bar = $("message-actions");
  for (const b of buttons) {
    const el = document.createElement("button");
    el.type = "button";
    el.textContent = b.label;
    el.dataset.testid = b.testid;
    if (b.danger) el.className = "danger";
    el.addEventListener("click", () => { dialog.close(); b.run(); });
    bar.append(el);
  }
}

$("message-close").addEventListener("click", () => $("message").close());

/** Close the message's detail unless it is one of queue ``q`` (null: any). */
export function closeMessageUnlessOf(q) {
  const dialog = $("message");
  if (dialog.open && (q === null || dialog.dataset.queue !== queueKey(q))) {
    dialog.close();
  }
}
$("message-copy").addEventListener("click", (e) => copy($("message-id").textContent, e.target));
