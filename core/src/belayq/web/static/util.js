// What every part of the page uses: the API client, escaping, number and time formats,
// id cells, and tables redrawn only when their content changed (so focus, an expanded id
// and a click in progress survive the refresh).

const TOKEN_KEY = "belayq-token";

// The token arrives in the address's fragment (#token=T), which browsers never send to
// the server; the page keeps it for the tab and frees the fragment for its routes.
export const token = (() => {
  const given = new URLSearchParams(location.hash.slice(1)).get("token");
  if (given) {
    sessionStorage.setItem(TOKEN_KEY, given);
    history.replaceState(null, "", location.pathname + location.search + "#/");
  }
  return sessionStorage.getItem(TOKEN_KEY);
})();

export class ApiError extends Error {
  constructor(message, status, routeMissing) {
    super(message);
    this.status = status;
    this.routeMissing = routeMissing;  // a 404 from the router itself, not from the API
  }
}

export async function api(path, body) {
  const init = { headers: {} };
  if (token) init.headers.Authorization = "Bearer " + token;
  if (body !== undefined) {
    init.method = "POST";
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  let data = null;
  try { data = await r.json(); } catch { data = null; }
  if (!r.ok) {
    const message = (data && data.error) || `${r.status} ${r.statusText}`;
    throw new ApiError(message, r.status, r.status === 404 && data === null);
  }
  return data;
}

/** The status of a GET (no body read): tells an endpoint that exists from one that does not. */
export async function probe(path) {
  const init = { headers: {} };
  if (token) init.headers.Authorization = "Bearer " + token;
  return (await fetch(path, init)).status;
}

export const $ = (id) => document.getElementById(id);
export const enc = encodeURIComponent;

/** A queue is its kind, its name and its namespace: two apps that share the server (Dramatiq
 * apps with their own namespace, Celery apps with their own key prefix) may each have a
 * queue of one name. ``namespace`` "" is the framework's default. */
export const queueOf = (kind, name, namespace = "") => ({ kind, name, namespace: namespace || "" });
export const sameQueue = (a, b) => Boolean(a && b) && a.kind === b.kind && a.name === b.name &&
  a.namespace === b.namespace;
export const queueKey = (q) => JSON.stringify([q.kind, q.namespace, q.name]);
/** ``?namespace=NS`` for a queue of a namespace other than the default; "" otherwise. */
export const namespaceQuery = (q) => (q.namespace ? `?namespace=${enc(q.namespace)}` : "");
/** The API address of queue ``q``, or of ``rest`` under it ("/pause", "/message/<id>"). */
export const queuePath = (q, rest = "") =>
  `/api/queue/${enc(q.kind)}/${enc(q.name)}${rest}${namespaceQuery(q)}`;

export function esc(s) {
  return String(s ?? "–").replace(/[&<>"']/g,
    (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

export function num(n, digits = 0) {
  if (n === null || n === undefined || n === "") return "–";
  return Number(n).toLocaleString(undefined, { maximumFractionDigits: digits });
}

export function plural(n, one, many) {
  return `${num(n)} ${n === 1 ? one : (many || one + "s")}`;
}

export function age(s) {
  if (s === null || s === undefined) return "–";
  const v = Math.max(0, Number(s));
  if (v < 60) return `${v.toFixed(v < 10 ? 1 : 0)} s`;
  if (v < 3600) return `${Math.floor(v / 60)} min ${Math.floor(v % 60)} s`;
  if (v < 86400) return `${Math.floor(v / 3600)} h ${Math.floor((v % 3600) / 60)} min`;
  return `${Math.floor(v / 86400)} d ${Math.floor((v % 86400) / 3600)} h`;
}

const pad = (n) => String(n).padStart(2, "0");
export const hhmm = (d) => `${pad(d.getHours())}:${pad(d.getMinutes())}`;

export function when(ms) {
  if (!ms) return "–";
  const d = new Date(Number(ms));
  const time = `${hhmm(d)}:${pad(d.getSeconds())}`;
  if (d.toDateString() === new Date().toDateString()) return time;
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${time}`;
}

export const json = (v) => JSON.stringify(v, null, 2);

/** What a list row's message is: its Celery task's name, else its payload's preview. */
export const job = (row) => row.task ?? row.payload ?? "";

// -- ids: long ones are cut, with a control that shows the whole id and one that copies it

/** Characters kept of each end of a long id (ids of one queue often share a long start). */
export const ID_ENDS = 6;
export const expanded = new Set();

export function idCell(id) {
  if (id === null || id === undefined) return '<span class="muted">(no id)</span>';
  const long = id.length > 2 * ID_ENDS + 2;
  const open = expanded.has(id);
  const shown = long && !open ? `${id.slice(0, ID_ENDS)}…${id.slice(-ID_ENDS)}` : id;
  const expand = long
    ? `<button type="button" class="id" data-action="expand" data-id="${esc(id)}" ` +
      `data-focus="expand:${esc(id)}" data-testid="id-expand" aria-expanded="${open}" ` +
      `title="${open ? "shorten" : "show the full id"}">${esc(shown)}</button>`
    : `<span class="id">${esc(id)}</span>`;
  return `<span class="idcell${open ? " open" : ""}">${expand}<button type="button" ` +
    `class="copy" data-action="copy" data-id="${esc(id)}" data-focus="copy:${esc(id)}" ` +
    `data-testid="id-copy" aria-label="copy the id">copy</button></span>`;
}

export async function copy(text, button) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {  // no clipboard API (an address that is not a secure context): select and copy
    const area = document.createElement("textarea");
    area.value = text;
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  if (button) {
    button.textContent = "copied";
    setTimeout(() => { button.textContent = "copy"; }, 1200);
  }
}

// -- tables ------------------------------------------------------------------------------

const drawn = new WeakMap();

/** Replace ``el``'s content by ``html`` unless it is the same; the element that had the
 * focus (known by its data-focus) has it again after. */
export function renderInto(el, html) {
  if (drawn.get(el) === html) return;
  const active = document.activeElement;
  const key = active && el.contains(active) ? active.dataset.focus : null;
  el.innerHTML = html;
  drawn.set(el, html);
  if (key) {
    const again = [...el.querySelectorAll("[data-focus]")].find((n) => n.dataset.focus === key);
    if (again) again.focus();
  }
}

/** A table of ``rows``: ``columns`` are [heading, cell(row) -> html, class of the column
 * (its width: "id", "short", "when", "buttons"; none shares what is left)]; a row with an id opens
 * its message (click, or Enter once focused). ``empty`` (html) is said when there are none. */
export function table(columns, rows, { empty = "(none)", rowClass } = {}) {
  const head = "<thead><tr>" + columns.map(([h, , cls]) =>
    `<th scope="col" class="${cls || ""}">${esc(h)}</th>`).join("") + "</tr></thead>";
  const body = rows.map((r) => {
    const cls = rowClass ? rowClass(r) : "";
    const open = r.id !== null && r.id !== undefined
      ? ` tabindex="0" data-action="open" data-id="${esc(r.id)}" data-focus="row:${esc(r.id)}"`
      : "";
    return `<tr class="${cls}"${open}>` + columns.map(([, f]) => `<td>${f(r)}</td>`).join("") +
      "</tr>";
  }).join("");
  const none = `<tr class="none"><td colspan="${columns.length}">${empty}</td></tr>`;
  return `<table>${head}<tbody>${body || none}</tbody></table>`;
}
