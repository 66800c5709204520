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

async function api(path, options = {}) {
  const res = await fetch(path, { headers: { Accept: "application/json" }, ...options });
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

function selectJob(jid) {
  selectedJob = selectedJob === jid ? null : jid;
  // #job/<jid> links straight to a job's details.
  window.history.replaceState(null, "", selectedJob ? `#job/${selectedJob}` : "#jobs");
  $("job-detail").hidden = !selectedJob;
  for (const tr of $("jobs-body").children) tr.classList.toggle("selected", tr.dataset.key === selectedJob);
  if (selectedJob) refreshDetail();
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
  const entries = (exc && exc.exceptionHistory && exc.exceptionHistory.entries) || [];
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

async function refreshDetail() {
  const jid = selectedJob;
  if (!jid) return;
  try {
    const [d, exc] = await Promise.all([
      api(`/jobs/${encodeURIComponent(jid)}`),
      api(`/jobs/${encodeURIComponent(jid)}/exceptions`),
    ]);
    if (jid === selectedJob) renderDetail(d, exc);
  } catch (e) {
    if (e.status === 404) selectJob(jid); // the job is gone: close the panel
  }
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
    await refreshDetail();
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
  window.addEventListener("hashchange", highlightNav);
  highlightNav();
  const linked = /^#job\/([^/]+)$/.exec(window.location.hash);
  if (linked) selectJob(decodeURIComponent(linked[1]));
  loadJars();
  refresh();
  window.setInterval(refresh, REFRESH_MS);
});
