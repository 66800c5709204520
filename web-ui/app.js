/* Headrace dashboard: polls the dispatcher's REST API (Flink REST v1 shapes) once a second and
 * updates the page in place. Plain JavaScript, no build step, no external resources. Every value
 * from the server is written with textContent, never as HTML. */
"use strict";

const REFRESH_MS = 1000;
const TERMINAL = new Set(["FINISHED", "FAILED", "CANCELED"]);
const TASK_STATES = ["created", "scheduled", "deploying", "initializing", "running", "finished",
  "canceling", "canceled", "failed", "reconciling"];

const $ = (id) => document.getElementById(id);

/* ---------------------------------------------------------------- helpers */

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

class ApiError extends Error {
  constructor(status, body) {
    const errors = (body && body.errors) || [`HTTP ${status}`];
    super(errors.join("; "));
    this.status = status;
    this.body = body || {};
  }
}

/* With auth on (docs/runbooks/auth.md) every API call needs a bearer token: it is asked for on
 * the first 401 and kept in this browser's localStorage. The prompt blocks the page, so polls
 * that fail meanwhile find the new token stored and retry with it instead of asking again;
 * after "Cancel" the page stops asking until it is reloaded. */
const TOKEN_KEY = "headrace.token";
let tokenDeclined = false;

function askForToken(reason) {
  if (tokenDeclined) return null;
  const answer = window.prompt(`${reason}\n\nPaste a Headrace API token ` +
    "(an admin makes one with: headrace token create --role viewer|operator|admin):");
  const token = (answer || "").trim();
  if (token) localStorage.setItem(TOKEN_KEY, token);
  else tokenDeclined = true;
  return token || null;
}

function withToken(options) {
  const token = localStorage.getItem(TOKEN_KEY);
  const headers = { Accept: "application/json", ...(options.headers || {}) };
  if (token) headers.Authorization = `Bearer ${token}`;
  return { ...options, headers };
}

async function api(path, options = {}) {
  const sent = localStorage.getItem(TOKEN_KEY);
  let res = await fetch(path, withToken(options));
  if (res.status === 401) {
    // Unknown or revoked: forget it, unless another request has stored a new one meanwhile.
    if (sent && localStorage.getItem(TOKEN_KEY) === sent) localStorage.removeItem(TOKEN_KEY);
    const current = localStorage.getItem(TOKEN_KEY);
    if (current && current !== sent) return api(path, options);
    const why = sent ? "The stored token was refused (unknown or revoked)." : "This dispatcher requires a token.";
    if (askForToken(why)) res = await fetch(path, withToken(options));
  }
  let body = null;
  const text = await res.text();
  if (text) {
    try { body = JSON.parse(text); } catch (_) { body = { errors: [text.slice(0, 200)] }; }
  }
  if (!res.ok) throw new ApiError(res.status, body);
  return body;
}

const pad = (n) => String(n).padStart(2, "0");

function fmtTime(ms) {
  if (!ms || ms < 0) return "–";
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

function fmtDuration(ms) {
  if (ms === null || ms === undefined || ms < 0) return "–";
  if (ms < 1000) return `${ms}ms`;
  let s = Math.floor(ms / 1000);
  const d = Math.floor(s / 86400); s %= 86400;
  const hh = Math.floor(s / 3600); s %= 3600;
  const m = Math.floor(s / 60); s %= 60;
  const parts = [];
  if (d) parts.push(`${d}d`);
  if (hh) parts.push(`${hh}h`);
  if (m) parts.push(`${m}m`);
  parts.push(`${s}s`);
  return parts.slice(0, 3).join(" ");
}

function fmtBytes(n) {
  if (!n && n !== 0) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

/* Checkpoint timings are often under a few seconds, where fmtDuration's whole seconds say little. */
function fmtMillis(ms) {
  if (ms === null || ms === undefined || ms < 0) return "–";
  if (ms < 1000) return `${Math.round(ms)}ms`;
  if (ms < 60000) return `${Number((ms / 1000).toFixed(ms < 10000 ? 2 : 1))}s`;
  return fmtDuration(ms);
}

function fmtAgo(ms) {
  if (!ms || ms < 0) return "–";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  return s < 1 ? "just now" : `${fmtDuration(s * 1000)} ago`;
}

function badge(state) {
  return h("span", { class: `badge state-${state}`, text: state });
}

function setText(el, value) {
  const v = value === null || value === undefined ? "" : String(value);
  if (el.textContent !== v) el.textContent = v;
}

/* Keyed table rows: a row is created once per id and updated in place, so a button is never
 * replaced between mousedown and click by the 1-second refresh. */
function syncRows(tbody, items, key, create, update) {
  const existing = new Map();
  for (const tr of tbody.children) existing.set(tr.dataset.key, tr);
  const wanted = new Set();
  items.forEach((item, i) => {
    const k = key(item);
    wanted.add(k);
    let tr = existing.get(k);
    if (!tr) {
      tr = create(item);
      tr.dataset.key = k;
    }
    update(tr, item);
    if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null);
  });
  for (const [k, tr] of existing) if (!wanted.has(k)) tr.remove();
}

/* ---------------------------------------------------------------- overview */

function renderOverview(o) {
  setText($("slots-available"), o["slots-available"]);
  setText($("slots-total"), o["slots-total"]);
  setText($("tm-count"), o.taskmanagers);
  setText($("jobs-running"), o["jobs-running"]);
  setText($("jobs-finished"), o["jobs-finished"]);
  setText($("jobs-cancelled"), o["jobs-cancelled"]);
  setText($("jobs-failed"), o["jobs-failed"]);
  setText($("version"), o["flink-version"]);
  const jm = o.jobmanager;
  const leader = $("leader");
  setText(leader, jm ? `JobManager ${jm.id} · epoch ${jm.epoch}${jm.mode === "zookeeper" ? " · HA" : ""}`
                     : "no JobManager leads: submissions wait");
  leader.classList.toggle("live", !!jm);
  leader.classList.toggle("down", !jm);
  const total = o["slots-total"] || 0;
  const used = total - (o["slots-available"] || 0);
  const bar = $("cluster-slotbar");
  bar.style.width = total ? `${(100 * used) / total}%` : "0";
  bar.classList.toggle("full", total > 0 && used >= total);
}

/* ---------------------------------------------------------------- jobs */

let selectedJob = null;

function taskBadges(tasks) {
  const frag = h("span", { class: "tasks" });
  for (const st of TASK_STATES) {
    const n = tasks[st] || 0;
    if (n) frag.append(h("span", { class: `badge state-${st.toUpperCase()}`, title: st, text: n }));
  }
  if (!frag.children.length) frag.append(h("span", { class: "muted", text: tasks.total ? "" : "–" }));
  return frag;
}

function createJobRow(job) {
  const cancel = h("button", {
    type: "button", class: "cancel", text: "Cancel",
    onclick: (ev) => { ev.stopPropagation(); cancelJob(job.jid, cancel); },
  });
  return h("tr", { onclick: () => selectJob(job.jid) },
    h("td", { class: "name" }), h("td"), h("td"), h("td"), h("td"), h("td"), h("td", { class: "reason" }),
    h("td", {}, cancel));
}

function updateJobRow(tr, job) {
  const c = tr.children;
  setText(c[0], job.name);
  c[0].title = `${job.name} (${job.jid})`;
  setText(c[1], fmtTime(job["start-time"]));
  setText(c[2], fmtDuration(job.duration));
  setText(c[3], fmtTime(job["end-time"]));
  const tasksKey = JSON.stringify(job.tasks);
  if (c[4].dataset.v !== tasksKey) { c[4].replaceChildren(taskBadges(job.tasks)); c[4].dataset.v = tasksKey; }
  if (c[5].dataset.v !== job.state) { c[5].replaceChildren(badge(job.state)); c[5].dataset.v = job.state; }
  setText(c[6], job["waiting-reason"] || "");
  const btn = c[7].firstChild;
  const live = !TERMINAL.has(job.state);
  btn.hidden = !live;
  if (job.state === "CANCELLING") { btn.disabled = true; setText(btn, "Cancelling"); }
  tr.classList.toggle("selected", job.jid === selectedJob);
}

function renderJobs(jobs) {
  syncRows($("jobs-body"), jobs, (j) => j.jid, createJobRow, updateJobRow);
  $("jobs-empty").hidden = jobs.length > 0;
  $("jobs-table").hidden = jobs.length === 0;
  const live = jobs.filter((j) => !TERMINAL.has(j.state)).length;
  setText($("jobs-summary"), jobs.length ? `${live} live · ${jobs.length - live} completed` : "");
}

async function cancelJob(jid, button) {
  if (!window.confirm(`Cancel job ${jid}?`)) return;
  button.disabled = true;
  try {
    await api(`/jobs/${encodeURIComponent(jid)}?mode=cancel`, { method: "PATCH" });
    setText(button, "Cancelling");
  } catch (e) {
    button.disabled = false;
    window.alert(`Could not cancel: ${e.message}`);
  }
}

/* ---------------------------------------------------------------- job detail */

let activeTab = "overview"; // overview | checkpoints

function detailHash() {
  if (!selectedJob) return "#jobs";
  return `#job/${selectedJob}${activeTab === "checkpoints" ? "/checkpoints" : ""}`;
}

function selectJob(jid) {
  const previous = selectedJob;
  selectedJob = selectedJob === jid ? null : jid;
  // #job/<jid> links straight to a job's details, #job/<jid>/checkpoints to its checkpoints.
  window.history.replaceState(null, "", detailHash());
  $("job-detail").hidden = !selectedJob;
  for (const tr of $("jobs-body").children) tr.classList.toggle("selected", tr.dataset.key === selectedJob);
  if (selectedJob !== previous) resetCheckpointView();
  if (selectedJob) refreshDetail();
}

function showTab(tab) {
  activeTab = tab;
  document.querySelectorAll("#job-detail .tab").forEach((b) => {
    const on = b.dataset.tab === tab;
    b.classList.toggle("active", on);
    b.setAttribute("aria-selected", on ? "true" : "false");
  });
  $("tab-overview").hidden = tab !== "overview";
  $("tab-checkpoints").hidden = tab !== "checkpoints";
  if (selectedJob) {
    window.history.replaceState(null, "", detailHash());
    refreshDetail();
  }
}

function fact(label, value) {
  return h("div", {}, h("dt", { text: label }), h("dd", { text: value }));
}

function renderDetail(d, exc) {
  setText($("detail-name"), d.name);
  const st = $("detail-state");
  st.className = `badge state-${d.state}`;
  setText(st, d.state);
  const rs = d["restart-strategy"] || {};
  const rsText = Object.entries(rs).filter(([k]) => k !== "type").map(([k, v]) => `${k}=${v}`).join(", ");
  $("detail-facts").replaceChildren(
    fact("Job ID", d.jid), fact("Start Time", fmtTime(d["start-time"])), fact("Duration", fmtDuration(d.duration)),
    fact("Attempts", d.attempts), fact("Restart Strategy", `${rs.type || "–"}${rsText ? ` (${rsText})` : ""}`),
    fact("Max Parallelism", d.maxParallelism), fact("Type", d["job-type"]),
    fact("Waiting Reason", d["waiting-reason"] || "–"),
  );
  $("detail-vertices").replaceChildren(...d.vertices.map((v) => h("tr", {},
    h("td", { class: "name", text: v.name }), h("td", { text: v.parallelism }), h("td", {}, badge(v.status)),
    h("td", { text: fmtTime(v["start-time"]) }), h("td", { text: fmtDuration(v.duration) }),
    h("td", { text: v.metrics && v.metrics["read-records"] !== undefined ? v.metrics["read-records"] : "–" }))));
  if (!d.vertices.length) {
    $("detail-vertices").append(h("tr", {}, h("td", { colspan: 6, class: "muted", text: "not scheduled yet" })));
  }
  if (!exc) return;
  const entries = (exc.exceptionHistory && exc.exceptionHistory.entries) || [];
  const box = $("detail-exceptions");
  const key = entries.map((e) => `${e.timestamp}:${e.exceptionName}`).join("|");
  if (box.dataset.v === key) return;
  box.dataset.v = key;
  box.replaceChildren(...entries.slice(0, 5).map((e) => h("div", { class: "exc" },
    h("div", { class: "exc-head" },
      h("span", {}, h("span", { class: "exc-name", text: e.exceptionName }),
        ` in ${e.taskName || "job"}${e.attempt !== null && e.attempt !== undefined ? ` (attempt ${e.attempt})` : ""}`),
      h("span", { text: `${fmtTime(e.timestamp)}${e.endpoint ? ` · ${e.endpoint}` : ""}` })),
    h("pre", { text: e.stacktrace }))));
  if (!entries.length) box.append(h("div", { class: "muted", text: "No exceptions." }));
}

/* Where an attempt started from: the JobManager records the checkpoint or savepoint it restored
 * ("restored-from", "restored-checkpoint-id"); neither means it started without state. */
function restoreCell(a) {
  const path = a["restored-from"];
  const id = a["restored-checkpoint-id"];
  if (!path && (id === null || id === undefined)) return h("span", { class: "muted", text: "fresh start" });
  // Savepoint directories are named savepoint-<job6>-<hex>; their id belongs to the job that took them.
  const savepoint = /(^|\/)savepoint-[^/]*\/?$/.test(path || "");
  const label = savepoint ? "savepoint" : id === null || id === undefined || id < 0 ? "" : `checkpoint ${id}`;
  return h("span", { class: "restore", title: path || "" },
    label ? h("b", { text: label }) : null, label && path ? " · " : null,
    path ? h("span", { class: "mono path", text: path }) : null);
}

function renderAttempts(vertexDetails) {
  const rows = [];
  for (const v of vertexDetails) {
    const attempts = [...(v.attempts || [])].sort((a, b) => b.attempt - a.attempt);
    for (const a of attempts) rows.push({ v, a });
  }
  const body = $("detail-attempts");
  const key = JSON.stringify(rows.map(({ v, a }) => [v.id, a.attempt, a.status, a["taskmanager-id"], a["start-time"],
    a["last-batch-id"], a["restored-from"], a["restored-checkpoint-id"], a["failure-cause"], a.duration]));
  if (body.dataset.v === key) return;
  body.dataset.v = key;
  body.replaceChildren(...rows.map(({ v, a }) => h("tr", {},
    h("td", { class: "name", text: v.name, title: v.name }),
    h("td", { text: a.attempt }),
    h("td", {}, badge(a.status)),
    h("td", { class: "mono", text: a["taskmanager-id"] || "–" }),
    h("td", { class: "nowrap", text: fmtTime(a["start-time"]) }),
    h("td", { text: fmtDuration(a.duration) }),
    h("td", { text: a["last-batch-id"] === null || a["last-batch-id"] === undefined ? "–" : a["last-batch-id"] }),
    h("td", { class: "restore-cell" }, restoreCell(a)),
    h("td", { class: "reason", text: a["failure-cause"] || "", title: a["failure-cause"] || "" }))));
  if (!rows.length) body.append(h("tr", {}, h("td", { colspan: 9, class: "muted", text: "no attempt yet" })));
}

async function refreshDetail() {
  const jid = selectedJob;
  if (!jid) return;
  let d;
  try {
    const overview = activeTab === "overview";
    const [job, exc] = await Promise.all([
      api(`/jobs/${encodeURIComponent(jid)}`),
      overview ? api(`/jobs/${encodeURIComponent(jid)}/exceptions`) : null,
    ]);
    d = job;
    if (jid !== selectedJob) return;
    renderDetail(d, exc);
  } catch (e) {
    if (e.status === 404 && jid === selectedJob) selectJob(jid); // the job is gone: close the panel
    return;
  }
  if (activeTab === "overview") await refreshAttempts(jid, d);
  else await refreshCheckpoints(jid, d);
}

async function refreshAttempts(jid, d) {
  try {
    const details = await Promise.all(d.vertices.map((v) =>
      api(`/jobs/${encodeURIComponent(jid)}/vertices/${encodeURIComponent(v.id)}`)));
    if (jid === selectedJob) renderAttempts(details);
  } catch (_) { /* a vertex that vanished between the two requests shows up at the next refresh */ }
}

/* ---------------------------------------------------------------- checkpoints */

// Flink reports "no periodic checkpoints" as Long.MAX_VALUE (9223372036854775807 ms).
const CHECKPOINTING_OFF = Number.MAX_SAFE_INTEGER;

let cpConfigFor = null;     // the job whose configuration is shown
let cpConfigAt = 0;         // when it was fetched (the configuration is re-read every 10 s)
let cpDetailsId = null;     // the checkpoint whose details are open
const operations = new Map(); // jid -> [{kind, requestId, resource, status, text, failed, started}], newest first

function resetCheckpointView() {
  cpConfigFor = null;
  cpConfigAt = 0;
  cpDetailsId = null;
  $("cp-details").hidden = true;
  $("cp-history").replaceChildren();
  $("cp-config").replaceChildren();
  $("cp-latest").replaceChildren();
  $("cp-summary").replaceChildren();
  $("cp-stats").hidden = true;
  for (const id of ["cp-empty", "cp-config-empty"]) {
    const box = $(id);
    box.hidden = false;
    box.dataset.v = "";
    setText(box, "Loading…");
  }
  $("cp-config-table").hidden = true;
  renderOperations();
}

function isSavepoint(s) { return !!(s && s.is_savepoint); }

function kindText(s) { return isSavepoint(s) ? "Savepoint" : "Checkpoint"; }

function duration(s) {
  const d = s.end_to_end_duration;
  if (d !== null && d !== undefined && d >= 0) return d;
  return s.status === "IN_PROGRESS" && s.trigger_timestamp > 0 ? Date.now() - s.trigger_timestamp : -1;
}

function pathCell(s) {
  const td = h("td", { class: "path-cell" });
  if (s.status === "FAILED" || s.failure_message) {
    td.append(h("span", { class: "fail-text", text: s.failure_message || "failed (no cause recorded)" }));
  } else if (s.external_path) {
    td.append(h("span", { class: "mono path", text: s.external_path, title: s.external_path }));
  } else {
    td.append(h("span", { class: "muted", text: s.status === "IN_PROGRESS" ? "in progress…" : "–" }));
  }
  if (s.discarded) td.append(" ", h("span", { class: "tag", text: "discarded", title: "pruned: beyond the retained count" }));
  return td;
}

function renderCounts(c) {
  for (const k of ["total", "in_progress", "completed", "failed", "restored"]) {
    setText($(`cp-count-${k}`), c && c[k] !== undefined ? c[k] : "–");
  }
}

function latestRow(label, s) {
  if (!s) {
    return h("tr", {}, h("th", { scope: "row", text: label }),
      h("td", { colspan: 5, class: "muted", text: "none" }));
  }
  const time = s.status === "FAILED" ? (s.failure_timestamp || s.trigger_timestamp)
    : (s.latest_ack_timestamp > 0 ? s.latest_ack_timestamp : s.trigger_timestamp);
  return h("tr", {}, h("th", { scope: "row", text: label }),
    h("td", { text: s.id }), h("td", { class: "nowrap", text: fmtTime(time) }), h("td", { text: fmtMillis(duration(s)) }),
    h("td", { text: fmtBytes(s.state_size) }), pathCell(s));
}

function restoredRow(r) {
  if (!r) {
    return h("tr", {}, h("th", { scope: "row", text: "Latest Restore" }),
      h("td", { colspan: 5, class: "muted", text: "none: the job started without a checkpoint or savepoint" }));
  }
  return h("tr", {},
    h("th", { scope: "row" }, "Latest Restore ", h("span", { class: "tag", text: r.is_savepoint ? "savepoint" : "checkpoint" })),
    h("td", { text: r.id === null || r.id === undefined || r.id < 0 ? "–" : r.id }),
    h("td", { class: "nowrap", text: fmtTime(r.restore_timestamp) }),
    h("td", { text: "–" }), h("td", { text: "–" }),
    h("td", { class: "path-cell" }, r.external_path
      ? h("span", { class: "mono path", text: r.external_path, title: r.external_path })
      : h("span", { class: "muted", text: "–" })));
}

function renderLatest(latest) {
  const l = latest || {};
  const body = $("cp-latest");
  const key = JSON.stringify([l.completed, l.savepoint, l.failed, l.restored]);
  if (body.dataset.v === key) return;
  body.dataset.v = key;
  body.replaceChildren(latestRow("Latest Completed Checkpoint", l.completed), latestRow("Latest Savepoint", l.savepoint),
    latestRow("Latest Failed Checkpoint", l.failed), restoredRow(l.restored));
}

function createHistoryRow(s) {
  return h("tr", { class: "clickable", title: "show details", onclick: () => showCheckpointDetails(s.id) },
    h("td"), h("td"), h("td"), h("td", { class: "nowrap" }), h("td", { class: "nowrap" }), h("td"), h("td"), h("td"),
    h("td"), h("td", { class: "path-cell" }));
}

function updateHistoryRow(tr, s) {
  const c = tr.children;
  setText(c[0], s.id);
  if (c[1].dataset.v !== s.status) { c[1].replaceChildren(badge(s.status)); c[1].dataset.v = s.status; }
  setText(c[2], kindText(s));
  setText(c[3], fmtTime(s.trigger_timestamp));
  setText(c[4], s.latest_ack_timestamp > 0 ? fmtTime(s.latest_ack_timestamp) : "–");
  setText(c[5], fmtMillis(duration(s)));
  setText(c[6], fmtBytes(s.checkpointed_size));
  setText(c[7], fmtBytes(s.state_size));
  // Headrace: the Spark micro-batch the snapshot holds (the commit that was its barrier).
  setText(c[8], s.batch_id === null || s.batch_id === undefined ? "–" : s.batch_id);
  const pathKey = JSON.stringify([s.status, s.external_path, s.failure_message, s.discarded]);
  if (c[9].dataset.v !== pathKey) { c[9].replaceChildren(...pathCell(s).childNodes); c[9].dataset.v = pathKey; }
  tr.classList.toggle("selected", s.id === cpDetailsId);
  tr.classList.toggle("savepoint-row", isSavepoint(s));
}

function renderHistory(history) {
  const items = [...(history || [])].sort((a, b) => b.id - a.id);
  syncRows($("cp-history"), items, (s) => String(s.id), createHistoryRow, updateHistoryRow);
  $("cp-history-empty").hidden = items.length > 0;
  $("cp-history-table").hidden = items.length === 0;
}

const SUMMARY_ROWS = [
  ["end_to_end_duration", "End to End Duration", fmtMillis],
  ["checkpointed_size", "Checkpointed Data Size", fmtBytes],
  ["state_size", "Full Checkpoint Data Size", fmtBytes],
];

function renderSummary(summary) {
  const sm = summary || {};
  const body = $("cp-summary");
  const key = JSON.stringify(sm);
  if (body.dataset.v === key) return;
  body.dataset.v = key;
  body.replaceChildren(...SUMMARY_ROWS.map(([k, label, fmt]) => {
    const v = sm[k] || {};
    return h("tr", {}, h("th", { scope: "row", text: label }),
      ...["min", "avg", "max", "p50", "p90", "p95", "p99", "p999"].map((q) =>
        h("td", { text: v[q] === undefined || v[q] === null ? "–" : fmt(v[q]) })));
  }));
}

function renderCheckpoints(cp) {
  $("cp-empty").hidden = true;
  $("cp-stats").hidden = false;
  renderCounts(cp.counts);
  renderLatest(cp.latest);
  renderHistory(cp.history);
  renderSummary(cp.summary);
}

function renderCheckpointsUnavailable(e) {
  $("cp-stats").hidden = true;
  const box = $("cp-empty");
  box.hidden = false;
  const text = e.status === 404
    ? "No checkpoint statistics for this job."
    : `Checkpoint statistics are unavailable: ${e.message}`;
  const detail = e.status === 404 ? `The dispatcher answered: ${e.message}` : "";
  if (box.dataset.v === text + detail) return;
  box.dataset.v = text + detail;
  box.replaceChildren(h("div", { text }), detail ? h("div", { class: "muted", text: detail }) : null);
}

/* --- configuration */

const CONFIG_LABELS = {
  mode: "Checkpointing Mode",
  interval: "Interval",
  timeout: "Timeout",
  min_pause: "Minimum Pause Between Checkpoints",
  max_concurrent: "Maximum Concurrent Checkpoints",
  externalization: "Persist Checkpoints Externally",
  tolerable_failed_checkpoints: "Tolerable Failed Checkpoints",
  state_backend: "State Backend",
  checkpoint_storage: "Checkpoint Storage",
  unaligned_checkpoints: "Unaligned Checkpoints",
  num_retained: "Retained Checkpoints",
  savepoint_dir: "Default Savepoint Directory",
  checkpoint_dir: "Checkpoint Directory",
};
const CONFIG_MILLIS = new Set(["interval", "timeout", "min_pause", "aligned_checkpoint_timeout",
  "changelog_periodic_materialization_interval"]);
// Durations among the effective options (`options`, Flink's names) are in seconds.
const OPTION_SECONDS = /(interval|timeout|min-pause)$/;

function optionValue(key, v) {
  if (v === null || v === undefined) return OPTION_SECONDS.test(key) && /interval$/.test(key) ? "off" : "–";
  if (OPTION_SECONDS.test(key) && typeof v === "number") return v === 0 ? "0" : fmtMillis(v * 1000);
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

function configValue(key, v) {
  if (v === null || v === undefined) return "–";
  if (key === "interval" && (v >= CHECKPOINTING_OFF || v < 0)) return "off (no periodic checkpoints)";
  if (CONFIG_MILLIS.has(key) && typeof v === "number") return v === 0 ? "0" : fmtMillis(v);
  if (key === "mode" && typeof v === "string") {
    return v.toLowerCase().split("_").map((w) => w.charAt(0).toUpperCase() + w.slice(1)).join(" ");
  }
  if (key === "externalization" && typeof v === "object") {
    if (!v.enabled) return "Disabled";
    return v.delete_on_cancellation ? "Enabled (delete on cancellation)" : "Enabled (retain on cancellation)";
  }
  if (typeof v === "boolean") return v ? "Enabled" : "Disabled";
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

function configLabel(key) {
  if (CONFIG_LABELS[key]) return CONFIG_LABELS[key];
  const words = key.replace(/[_.-]+/g, " ").trim();
  return words.charAt(0).toUpperCase() + words.slice(1);
}

function renderConfig(cfg) {
  $("cp-config-empty").hidden = true;
  $("cp-config-table").hidden = false;
  const known = Object.keys(CONFIG_LABELS).filter((k) => k in cfg);
  const extra = Object.keys(cfg).filter((k) => !(k in CONFIG_LABELS) && k !== "options").sort();
  const rows = [...known, ...extra].map((k) => h("tr", {},
    h("th", { scope: "row", text: configLabel(k), title: k }),
    h("td", { class: typeof cfg[k] === "string" && cfg[k].includes("/") ? "mono path" : "", text: configValue(k, cfg[k]) })));
  // Headrace adds the effective options under Flink's names: what to put in flinkConfiguration.
  const options = cfg.options && typeof cfg.options === "object" ? cfg.options : {};
  const names = Object.keys(options).sort();
  if (names.length) {
    rows.push(h("tr", {}, h("th", { scope: "row", colspan: 2, class: "kv-group", text: "Effective options" })));
    for (const k of names) {
      rows.push(h("tr", {}, h("th", { scope: "row", class: "mono", text: k }),
        h("td", { class: typeof options[k] === "string" && options[k].includes("/") ? "mono path" : "",
          text: optionValue(k, options[k]) })));
    }
  }
  $("cp-config").replaceChildren(...rows);
}

function renderConfigUnavailable(e) {
  $("cp-config-table").hidden = true;
  const box = $("cp-config-empty");
  box.hidden = false;
  setText(box, e.status === 404 ? "No checkpoint configuration for this job." : `Configuration unavailable: ${e.message}`);
}

async function refreshCheckpoints(jid, d) {
  renderActionState(d);
  const base = `/jobs/${encodeURIComponent(jid)}/checkpoints`;
  const wantConfig = cpConfigFor !== jid || Date.now() - cpConfigAt > 10000;
  const [cp, cfg] = await Promise.all([
    api(base).catch((e) => e),
    wantConfig ? api(`${base}/config`).catch((e) => e) : null,
  ]);
  if (jid !== selectedJob) return;
  if (cp instanceof Error) renderCheckpointsUnavailable(cp); else renderCheckpoints(cp || {});
  if (cfg instanceof Error) {
    renderConfigUnavailable(cfg);
    cpConfigFor = jid;
    cpConfigAt = Date.now() - 5000; // try again in 5 s: the endpoint may appear with a dispatcher upgrade
  } else if (cfg) {
    renderConfig(cfg);
    cpConfigFor = jid;
    cpConfigAt = Date.now();
  }
  if (cpDetailsId !== null) await refreshCheckpointDetails(jid, cpDetailsId, false);
}

/* --- details of one checkpoint (GET /jobs/{id}/checkpoints/details/{n}) */

function showCheckpointDetails(id) {
  cpDetailsId = cpDetailsId === id ? null : id;
  $("cp-details").hidden = cpDetailsId === null;
  for (const tr of $("cp-history").children) tr.classList.toggle("selected", tr.dataset.key === String(cpDetailsId));
  if (cpDetailsId !== null && selectedJob) refreshCheckpointDetails(selectedJob, cpDetailsId, true);
}

// Flink fields Headrace always reports as 0 or repeats (one task per checkpoint): noise in the details.
const DETAIL_SKIP = new Set(["className", "alignment_buffered", "processed_data", "persisted_data", "tasks"]);

async function refreshCheckpointDetails(jid, id, fresh) {
  const box = $("cp-details");
  // A finished checkpoint never changes: read it once; one in progress is followed every refresh.
  if (!fresh && box.dataset.v === `${jid}/${id}` && box.dataset.final === "1") return;
  let det;
  try {
    det = await api(`/jobs/${encodeURIComponent(jid)}/checkpoints/details/${encodeURIComponent(id)}`);
  } catch (e) {
    if (jid !== selectedJob || id !== cpDetailsId) return;
    setText($("cp-details-title"), `${id}: details unavailable`);
    $("cp-details-facts").replaceChildren(fact("Error", e.message));
    setText($("cp-details-more"), "");
    return;
  }
  if (jid !== selectedJob || id !== cpDetailsId) return;
  box.dataset.v = `${jid}/${id}`;
  box.dataset.final = det.status && det.status !== "IN_PROGRESS" ? "1" : "0";
  setText($("cp-details-title"), `${kindText(det)} ${det.id !== undefined ? det.id : id}`);
  const facts = [];
  const nested = {};
  for (const [k, v] of Object.entries(det)) {
    if (DETAIL_SKIP.has(k)) continue;
    if (v !== null && typeof v === "object") { nested[k] = v; continue; }
    let text = v === null || v === undefined ? "–" : String(v);
    if (/timestamp$/.test(k)) text = fmtTime(v);
    else if (/duration$/.test(k)) text = fmtMillis(v);
    else if (/size$/.test(k)) text = `${fmtBytes(v)} (${v} bytes)`;
    facts.push(fact(k, text));
  }
  $("cp-details-facts").replaceChildren(...facts);
  setText($("cp-details-more"), Object.keys(nested).length ? JSON.stringify(nested, null, 2) : "");
}

/* --- actions: savepoint, stop with savepoint, manual checkpoint */

function renderActionState(d) {
  const running = d.state === "RUNNING";
  const busy = (operations.get(d.jid) || []).some((op) => op.kind === "stop" && op.status === "IN_PROGRESS");
  const why = running ? "" : `only a RUNNING job takes savepoints and checkpoints; this one is ${d.state}`;
  for (const id of ["cp-savepoint", "cp-stop", "cp-checkpoint"]) $(id).disabled = !running || busy;
  setText($("cp-actions-note"), why || (busy ? "stopping with a savepoint…" : ""));
}

function failureText(cause) {
  if (cause === null || cause === undefined) return "failed (no cause given)";
  if (typeof cause === "string") return cause;
  // Flink's SerializedThrowable shape: {"class", "stack-trace", "serialized-throwable"}
  return cause["stack-trace"] || cause.message || cause.class || JSON.stringify(cause);
}

function addOperation(jid, op) {
  const list = operations.get(jid) || [];
  list.unshift(op);
  operations.set(jid, list.slice(0, 8));
  renderOperations();
}

async function startOperation(kind, label, path, body, resource) {
  const jid = selectedJob;
  if (!jid) return;
  const button = { savepoint: $("cp-savepoint"), stop: $("cp-stop"), checkpoint: $("cp-checkpoint") }[kind];
  button.disabled = true;
  const op = { kind, label, requestId: null, resource: null, status: "SENDING", text: "sending…", failed: false,
    started: Date.now() };
  addOperation(jid, op);
  try {
    const res = await api(path, {
      method: "POST", headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify(body),
    });
    op.requestId = res && res["request-id"];
    if (!op.requestId) throw new Error("the dispatcher answered without a request-id");
    op.resource = `${resource}/${encodeURIComponent(op.requestId)}`;
    op.status = "IN_PROGRESS";
    op.text = "in progress…";
  } catch (e) {
    op.status = "FAILED";
    op.failed = true;
    const b = e.body || {};
    op.text = e.status === 404 && !b.field ? `not available on this dispatcher (HTTP 404): ${e.message}`
      : b.hint ? `${e.message} — ${b.hint}` : e.message;
  } finally {
    button.disabled = false;
    renderOperations();
  }
}

function triggerSavepoint() {
  const jid = selectedJob;
  const dir = $("cp-dir").value.trim();
  const body = { "cancel-job": false };
  if (dir) body["target-directory"] = dir;
  startOperation("savepoint", "Savepoint", `/jobs/${encodeURIComponent(jid)}/savepoints`, body,
    `/jobs/${encodeURIComponent(jid)}/savepoints`);
}

function stopWithSavepoint() {
  const jid = selectedJob;
  const dir = $("cp-dir").value.trim();
  const drain = $("cp-drain").checked;
  const where = dir || "the default savepoint directory";
  if (!window.confirm(`Stop job ${jid} with a savepoint in ${where}${drain ? ", draining it first" : ""}? ` +
    "The job ends FINISHED once the savepoint is complete.")) return;
  const body = { drain };
  if (dir) body.targetDirectory = dir;
  startOperation("stop", drain ? "Stop with savepoint (drain)" : "Stop with savepoint",
    `/jobs/${encodeURIComponent(jid)}/stop`, body, `/jobs/${encodeURIComponent(jid)}/savepoints`);
}

function triggerCheckpoint() {
  const jid = selectedJob;
  startOperation("checkpoint", "Checkpoint", `/jobs/${encodeURIComponent(jid)}/checkpoints`, {},
    `/jobs/${encodeURIComponent(jid)}/checkpoints`);
}

async function pollOne(op) {
  try {
    const st = await api(op.resource);
    const status = (st && st.status && st.status.id) || "IN_PROGRESS";
    if (status !== "COMPLETED") return;
    const o = (st && st.operation) || {};
    // Savepoint results name it "failure-cause", checkpoint results "failureCause" (Flink's shapes).
    const cause = o["failure-cause"] !== undefined && o["failure-cause"] !== null ? o["failure-cause"] : o.failureCause;
    if (cause !== undefined && cause !== null) {
      op.status = "FAILED";
      op.failed = true;
      op.text = failureText(cause);
    } else {
      op.status = "COMPLETED";
      if (o.location) op.text = o.location;
      else if (o.checkpointId !== undefined) op.text = `checkpoint ${o.checkpointId}`;
      else op.text = "done";
    }
  } catch (e) {
    if (e.status === 404) { // the status resource is gone (dispatcher restarted, or it was never there)
      op.status = "FAILED";
      op.failed = true;
      op.text = `status unknown: ${e.message}`;
    } // other errors: the poller reports the connection; try again at the next refresh
  }
}

async function pollOperations() {
  const pending = [];
  for (const list of operations.values()) {
    for (const op of list) if (op.status === "IN_PROGRESS" && op.resource) pending.push(op);
  }
  if (!pending.length) return;
  await Promise.all(pending.map(pollOne));
  renderOperations();
}

function renderOperations() {
  const list = (selectedJob && operations.get(selectedJob)) || [];
  const ul = $("cp-ops");
  const key = JSON.stringify(list.map((op) => [op.requestId, op.status, op.text]));
  if (ul.dataset.v === key) return;
  ul.dataset.v = key;
  ul.replaceChildren(...list.map((op) => {
    const done = op.status === "COMPLETED";
    return h("li", { class: `op ${op.failed ? "op-failed" : done ? "op-done" : "op-busy"}` },
      h("div", { class: "op-head" },
        h("span", {}, h("b", { text: op.label }), " ", badge(op.status === "SENDING" ? "IN_PROGRESS" : op.status)),
        h("span", { class: "muted", text: `${fmtTime(op.started)}${op.requestId ? ` · request ${op.requestId}` : ""}` })),
      op.failed ? h("pre", { text: op.text })
        : h("div", { class: done && op.kind !== "checkpoint" ? "mono path" : "", text: op.text }));
  }));
}

/* ---------------------------------------------------------------- task managers */

function createTmRow() {
  return h("tr", {},
    h("td", { class: "mono" }), h("td"),
    h("td", {}, h("div", { class: "slots" },
      h("div", { class: "slotbar" }, h("div", { class: "slotbar-used" })), h("span"))),
    h("td"), h("td"), h("td"));
}

function updateTmRow(tr, tm) {
  const c = tr.children;
  setText(c[0], tm.id);
  setText(c[1], tm.host || "");
  const used = tm.slotsNumber - tm.freeSlots;
  const bar = c[2].querySelector(".slotbar-used");
  bar.style.width = tm.slotsNumber ? `${(100 * used) / tm.slotsNumber}%` : "0";
  bar.classList.toggle("full", tm.slotsNumber > 0 && tm.freeSlots === 0);
  setText(c[2].querySelector("span"), `${tm.freeSlots} / ${tm.slotsNumber} free`);
  setText(c[3], tm.hardware ? tm.hardware.cpuCores : "–");
  setText(c[4], fmtBytes(tm.hardware ? tm.hardware.physicalMemory : null));
  setText(c[5], fmtAgo(tm.timeSinceLastHeartbeat));
}

function renderTaskManagers(tms) {
  syncRows($("tm-body"), tms, (t) => t.id, createTmRow, updateTmRow);
  $("tm-empty").hidden = tms.length > 0;
  $("tm-table").hidden = tms.length === 0;
}

/* ---------------------------------------------------------------- polling */

let inFlight = false;

async function refresh() {
  if (inFlight) return;
  inFlight = true;
  const conn = $("conn");
  try {
    const [overview, tms, jobs] = await Promise.all([
      api("/overview"), api("/taskmanagers"), api("/jobs/overview"),
    ]);
    renderOverview(overview);
    renderTaskManagers(tms.taskmanagers);
    renderJobs(jobs.jobs);
    await Promise.all([refreshDetail(), pollOperations()]);
    conn.className = "conn live";
    setText(conn, `live · updated ${new Date().toLocaleTimeString()}`);
  } catch (e) {
    conn.className = "conn down";
    setText(conn, `disconnected: ${e.message}`);
  } finally {
    inFlight = false;
  }
}

/* ---------------------------------------------------------------- submit form */

const FIELD_INPUTS = {
  jarfile: "f-file", jarid: "f-jar", entryClass: "f-entry", parallelism: "f-parallelism",
  programArgs: "f-args", jobName: "f-name",
};

function showMessage(text, kind) {
  const m = $("f-message");
  m.className = `message ${kind || ""}`;
  setText(m, text);
}

function markInvalid(field) {
  document.querySelectorAll("form .field.invalid").forEach((el) => el.classList.remove("invalid"));
  if (!field) return;
  const top = String(field).split(".")[0];
  const label = document.querySelector(`form .field[data-field="${top}"]`);
  if (label) {
    label.classList.add("invalid");
    const input = document.getElementById(FIELD_INPUTS[top]);
    if (input) input.focus();
  }
}

async function loadJars(selectId) {
  try {
    const { files } = await api("/jars");
    const sel = $("f-jar");
    const keep = selectId || sel.value;
    sel.replaceChildren(h("option", { value: "", text: "— upload the file above —" }),
      ...files.map((f) => h("option", { value: f.id, text: `${f.name} (${fmtTime(f.uploaded)})` })));
    sel.value = files.some((f) => f.id === keep) ? keep : "";
  } catch (_) { /* the list is a convenience; the poller reports connection problems */ }
}

async function submitJob(ev) {
  ev.preventDefault();
  markInvalid(null);
  const button = $("f-submit");
  const file = $("f-file").files[0];
  let jarId = $("f-jar").value;
  if (!file && !jarId) {
    markInvalid("jarfile");
    showMessage("Choose a .py or .zip file, or a previously uploaded one.", "error");
    return;
  }
  const body = {};
  const entry = $("f-entry").value.trim();
  const par = $("f-parallelism").value.trim();
  const args = $("f-args").value.trim();
  const name = $("f-name").value.trim();
  if (entry) body.entryClass = entry;
  if (par) body.parallelism = /^-?\d+$/.test(par) ? Number(par) : par;
  if (args) body.programArgs = args;
  if (name) body.jobName = name;

  button.disabled = true;
  try {
    if (file) {
      showMessage(`Uploading ${file.name}…`);
      const form = new FormData();
      form.append("jarfile", file, file.name);
      jarId = (await api("/jars/upload", { method: "POST", body: form })).id;
      $("f-file").value = "";
      await loadJars(jarId);
    }
    showMessage("Submitting…");
    const res = await api(`/jars/${encodeURIComponent(jarId)}/run`, {
      method: "POST", headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify(body),
    });
    showMessage(`Job ${res.jobid} submitted.`, "ok");
    refresh();
  } catch (e) {
    const b = e.body || {};
    markInvalid(b.field);
    showMessage(b.hint ? `${e.message} — ${b.hint}` : e.message, "error");
  } finally {
    button.disabled = false;
  }
}

/* ---------------------------------------------------------------- start */

function highlightNav() {
  const links = document.querySelectorAll(".sidebar nav a[href^='#']");
  const hash = window.location.hash || "#overview";
  links.forEach((a) => a.classList.toggle("active", a.getAttribute("href") === hash));
}

document.addEventListener("DOMContentLoaded", () => {
  $("submit-form").addEventListener("submit", submitJob);
  $("f-jar").addEventListener("focus", () => loadJars());
  $("detail-close").addEventListener("click", () => selectJob(selectedJob));
  document.querySelectorAll("#job-detail .tab").forEach((b) => b.addEventListener("click", () => showTab(b.dataset.tab)));
  $("cp-actions").addEventListener("submit", (ev) => ev.preventDefault()); // Enter in the directory field
  $("cp-savepoint").addEventListener("click", triggerSavepoint);
  $("cp-stop").addEventListener("click", stopWithSavepoint);
  $("cp-checkpoint").addEventListener("click", triggerCheckpoint);
  $("cp-details-close").addEventListener("click", () => showCheckpointDetails(null));
  window.addEventListener("hashchange", highlightNav);
  highlightNav();
  const linked = /^#job\/([^/]+)(?:\/(checkpoints))?$/.exec(window.location.hash);
  if (linked) {
    if (linked[2]) showTab(linked[2]);
    selectJob(decodeURIComponent(linked[1]));
  }
  loadJars();
  refresh();
  window.setInterval(refresh, REFRESH_MS);
});
