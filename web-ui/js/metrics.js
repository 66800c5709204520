/* The job's Metrics tab: charts of its tasks' micro-batch figures. They start with the last ten
 * minutes the TaskManagers keep (GET /jobs/{id}/progress/history), loaded when the job page opens,
 * and go on with the live figures of GET /jobs/{id}/progress that the job page polls (jobs.js). */
import {
  $, h, s, setText, replaceIfChanged, syncRows, link, enc, tmHref, toMillis, fmtClock, fmtWhen, fmtDuration,
  fmtMillis, fmtNumber, dash, api,
} from "./core.js";
import { selectedJob, jobDetail, progress, sparkLinks } from "./jobs.js";

const metricHistory = new Map(); // jid -> [{t, input, processed, duration, lag}], oldest first

/* ---------------------------------------------------------------- metrics (from /progress) */

function sum(tasks, field) {
  const vals = tasks.filter((t) => t[field] !== null && t[field] !== undefined).map((t) => Number(t[field]))
    .filter((n) => !Number.isNaN(n));
  return vals.length ? vals.reduce((a, b) => a + b, 0) : null;
}

const HISTORY_MS = 600 * 1000; // what the charts show: the TaskManagers keep the same 10 minutes

/* One chart point from the figures of the job's tasks at one moment. */
function sampleOf(t, tasks) {
  const lags = tasks.filter((x) => typeof x.sourceLag === "number").map((x) => x.sourceLag);
  return {
    t,
    input: sum(tasks, "inputRowsPerSecond"),
    processed: sum(tasks, "processedRowsPerSecond"),
    duration: tasks.length ? Math.max(...tasks.map((x) => Number(x.batchDurationMs) || 0)) : null,
    lag: lags.length ? Math.max(...lags) : null,
  };
}

/* Samples are keyed by the TaskManagers' batch time, so a live point the history already holds
 * is not drawn twice, and the list keeps only the last HISTORY_MS. */
function keepSamples(jid, list) {
  list.sort((a, b) => a.t - b.t);
  const newest = list.length ? list[list.length - 1].t : 0;
  metricHistory.set(jid, list.filter((p, i) => p.t > newest - HISTORY_MS && (i === 0 || p.t !== list[i - 1].t)));
}

export function recordSample(jid, tasks) {
  const running = tasks.filter((t) => typeof t.timestamp === "number");
  if (!running.length) return;
  const t = Math.max(...running.map((x) => x.timestamp));
  const list = metricHistory.get(jid) || [];
  if (list.length && list[list.length - 1].t >= t) return; // nothing new since the last poll
  list.push(sampleOf(t, running));
  keepSamples(jid, list);
}

/* GET /jobs/{id}/progress/history: each recent attempt's points (at most one a second), merged
 * into one point per second across the job's tasks, so a chart opened now starts full. */
function mergeHistory(jid, history) {
  const bySecond = new Map();
  for (const task of (history && history.tasks) || []) {
    for (const p of task.points || []) {
      const sec = Math.floor(p.timestamp / 1000);
      const slot = bySecond.get(sec) || new Map();
      slot.set(task.executionId, p); // the newest point of each task in that second
      bySecond.set(sec, slot);
    }
  }
  const list = (metricHistory.get(jid) || []).slice();
  for (const slot of bySecond.values()) {
    const points = [...slot.values()];
    list.push(sampleOf(Math.max(...points.map((p) => p.timestamp)), points));
  }
  keepSamples(jid, list);
}

/* Whether there is nothing more to load: true once merged, and for a dispatcher without history
 * (404); false when it should be asked again (Redis away, an answer that timed out). */
export async function loadMetricHistory(jid) {
  try {
    const history = await api(`/jobs/${enc(jid)}/progress/history`);
    if (jid === selectedJob) mergeHistory(jid, history);
    return true;
  } catch (e) {
    return e && e.status === 404; // meanwhile the charts fill from live points
  }
}

const CHARTS = [
  ["input", "Input rows/s", (v) => fmtNumber(v, 1)],
  ["processed", "Processed rows/s", (v) => fmtNumber(v, 1)],
  ["duration", "Batch duration (latency)", fmtMillis],
  ["lag", "Source lag", (v) => fmtNumber(v, 0)],
];

/* A small line chart against time: an SVG polyline (no library: the page loads nothing but its
 * own files). x is each sample's time `t` within the samples' span, so a 30 s gap between two
 * batches is thirty times as wide as one second between the next two, and the line breaks there
 * instead of joining them (what happened meanwhile is unknown); the axis under it is labelled
 * with the span's first, middle and last times. */
const W = 280;
const H = 88;
const PLOT_TOP = 16;
const PLOT_BOTTOM = 66; // the time axis; its labels below it


/* Runs of consecutive points no further apart than `gapMs`: one polyline each. */
function segments(points, gapMs) {
  const out = [];
  for (const p of points) {
    const run = out[out.length - 1];
    if (run && p.t - run[run.length - 1].t <= gapMs) run.push(p);
    else out.push([p]);
  }
  return out;
}

/* A gap is a pause of more than five times the usual spacing of the points (and at least 5 s):
 * batches every second with one missing are still a line. */
function gapOf(points) {
  const steps = points.slice(1).map((p, i) => p.t - points[i].t).sort((a, b) => a - b);
  const usual = steps.length ? steps[Math.floor(steps.length / 2)] : 0;
  return Math.max(5000, 5 * usual);
}

export function chart(label, samples, field, fmt) {
  const points = samples.map((p) => ({ t: toMillis(p.t), v: p[field] }))
    .filter((p) => p.t !== null && p.v !== null && p.v !== undefined).sort((a, b) => a.t - b.t);
  const last = points.length ? points[points.length - 1].v : null;
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": label });
  svg.append(s("line", { x1: 0, y1: PLOT_BOTTOM, x2: W, y2: PLOT_BOTTOM, class: "axis" }));
  if (points.length > 1) {
    const t0 = points[0].t;
    const span = Math.max(points[points.length - 1].t - t0, 1);
    const max = Math.max(...points.map((p) => p.v), 1e-9);
    const x = (t) => (((t - t0) / span) * W).toFixed(1);
    const y = (v) => (PLOT_BOTTOM - 2 - (v / max) * (PLOT_BOTTOM - PLOT_TOP)).toFixed(1);
    for (const run of segments(points, gapOf(points))) {
      if (run.length === 1) svg.append(s("circle", { cx: x(run[0].t), cy: y(run[0].v), r: 1.5, class: "series-dot" }));
      else svg.append(s("polyline", { points: run.map((p) => `${x(p.t)},${y(p.v)}`).join(" "), class: "series" }));
    }
    svg.append(s("text", { x: 4, y: 10, class: "chart-max", text: `max ${fmt(max)}` }));
    const ticks = [[t0, "start"], [t0 + span / 2, "middle"], [t0 + span, "end"]];
    for (const [t, anchor] of ticks) {
      const tx = anchor === "start" ? 0 : anchor === "end" ? W : W / 2;
      svg.append(s("line", { x1: tx, y1: PLOT_BOTTOM, x2: tx, y2: PLOT_BOTTOM + 3, class: "axis" }));
      svg.append(s("text", { x: tx, y: H - 8, "text-anchor": anchor, class: "chart-tick", text: fmtClock(t) }));
    }
  }
  return h("figure", { class: "chart-box" },
    h("figcaption", {}, h("span", { text: label }), h("b", { text: last === null ? "–" : fmt(last) })), svg,
    points.length > 1 ? h("div", { class: "chart-axis-label",
      text: `time · ${fmtDuration(points[points.length - 1].t - points[0].t)} shown` }) : null);
}

export function renderMetrics(jid) {
  const samples = metricHistory.get(jid) || [];
  $("metrics-charts").replaceChildren(...CHARTS.map(([f, label, fmt]) => chart(label, samples, f, fmt)));
  const tasks = progress || [];
  const byName = new Map(((jobDetail && jobDetail.vertices) || []).map((v) => [v.id, v.name]));
  syncRows($("metrics-tasks"), tasks, (t) => `${t.executionId || t.vertexId}/${t.subtask}`,
    () => h("tr", {}, ...Array.from({ length: 12 }, () => h("td"))),
    (tr, t) => {
      const c = tr.children;
      setText(c[0], byName.get(t.vertexId) || t.vertexId);
      setText(c[1], dash(t.subtask));
      setText(c[2], dash(t.attempt));
      replaceIfChanged(c[3], String(t.taskmanagerId), () => (t.taskmanagerId ? link(tmHref(t.taskmanagerId), t.taskmanagerId) : "–"));
      setText(c[4], dash(t.batchId));
      setText(c[5], fmtNumber(t.inputRowsPerSecond, 1));
      setText(c[6], fmtNumber(t.processedRowsPerSecond, 1));
      setText(c[7], fmtMillis(t.batchDurationMs));
      // A Kafka source's lag per partition beside its sum: one lagging partition is a skew, not a load.
      const parts = t.partitionLag ? Object.entries(t.partitionLag).map(([p, n]) => `${p}: ${n}`).join(", ") : "";
      setText(c[8], dash(t.sourceLag) + (parts ? ` (${parts})` : ""));
      setText(c[9], fmtNumber(t.numInputRows));
      setText(c[10], fmtWhen(t.timestamp));
      replaceIfChanged(c[11], String(t.sparkUi), () => sparkLinks([t]));
    });
}
