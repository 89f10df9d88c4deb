// The queue's history graph: counts per minute (the API's per_minute, kept in Redis for a
// day) over the last hour, 6 hours or day, on a time axis with HH:MM ticks.
import { esc, hhmm, num } from "./util.js";

export const SERIES = [
  { key: "completed", label: "completed", color: "#15803d", of: (p) => p.completed },
  { key: "failed", label: "failed runs", color: "#d97706", of: (p) => p.failed },
  { key: "reclaimed", label: "reclaimed", color: "#2563eb", of: (p) => p.reclaimed + p.adopted },
  { key: "dead_lettered", label: "dead-lettered", color: "#b91c1c", of: (p) => p.dead_lettered },
  { key: "published", label: "published", color: "#6b7280", of: (p) => p.published, dash: [5, 4] },
];

/** Minutes between two ticks of each range (minutes). */
export const TICK_MIN = { 60: 10, 360: 60, 1440: 180 };
const MINUTE_MS = 60_000;

function niceMax(v) {
  if (v <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 2.5, 5, 10].map((m) => m * p).find((m) => m >= v);
}

/** Draw ``perMinute`` over the last ``rangeMin`` minutes before ``nowMs`` into the graph's
 * parts ({canvas, x, y, legend, empty}); returns each series' total over the range. */
export function drawGraph(parts, perMinute, rangeMin, nowMs) {
  const { canvas } = parts;
  const end = nowMs, start = nowMs - rangeMin * MINUTE_MS;
  const points = perMinute.filter((p) => p.t >= start && p.t <= end);
  const totals = Object.fromEntries(SERIES.map((s) => [s.key,
    points.reduce((sum, p) => sum + s.of(p), 0)]));
  const top = niceMax(Math.max(0, ...points.flatMap((p) => SERIES.map((s) => s.of(p)))));

  const dpr = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 800, height = canvas.clientHeight || 200;
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, width, height);
  const X = (t) => ((t - start) / (end - start)) * width;
  const Y = (v) => height - 1 - (v / top) * (height - 8);

  const ticks = [];
  const step = TICK_MIN[rangeMin] || 60;
  for (let t = Math.ceil(start / MINUTE_MS) * MINUTE_MS; t <= end; t += MINUTE_MS) {
    const d = new Date(t);
    if ((d.getHours() * 60 + d.getMinutes()) % step === 0) ticks.push(t);
  }
  g.strokeStyle = "#e3e6ee";
  g.lineWidth = 1;
  for (const t of ticks) { g.beginPath(); g.moveTo(X(t) + 0.5, 0); g.lineTo(X(t) + 0.5, height); g.stroke(); }
  for (const f of [0, 0.5, 1]) {
    g.beginPath(); g.moveTo(0, Math.round(Y(top * f)) + 0.5); g.lineTo(width, Math.round(Y(top * f)) + 0.5); g.stroke();
  }

  for (const s of SERIES) {
    g.strokeStyle = s.color;
    g.fillStyle = s.color;
    g.lineWidth = 2;
    g.setLineDash(s.dash || []);
    g.beginPath();
    let prev = null;
    for (const p of points) {
      const x = X(p.t), y = Y(s.of(p));
      if (prev === null || p.t - prev > MINUTE_MS) g.moveTo(x, y); else g.lineTo(x, y);
      prev = p.t;
    }
    g.stroke();
    if (points.length === 1) { g.beginPath(); g.arc(X(points[0].t), Y(s.of(points[0])), 3, 0, 7); g.fill(); }
  }
  g.setLineDash([]);

  parts.x.innerHTML = ticks.map((t) =>
    `<span data-testid="time-tick" style="left:${((X(t) / width) * 100).toFixed(2)}%">` +
    `${hhmm(new Date(t))}</span>`).join("");
  parts.y.innerHTML = [1, 0.5, 0].map((f) =>
    `<span style="top:${((Y(top * f) / height) * 100).toFixed(2)}%">${num(top * f, 1)}</span>`).join("");
  parts.legend.innerHTML = SERIES.map((s) =>
    `<span class="k" style="--c:${s.color}">${esc(s.label)} ` +
    `<b data-testid="graph-total-${s.key}">${num(totals[s.key])}</b></span>`).join("");
  parts.empty.hidden = points.length > 0;
  canvas.setAttribute("aria-label", `messages per minute, last ${rangeMin / 60} h: ` +
    SERIES.map((s) => `${s.label} ${totals[s.key]}`).join(", "));
  return totals;
}
