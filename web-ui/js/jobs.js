/* Headrace dashboard: the overview, the job list and a job's page (#/jobs/<id>/<tab>). */
import {
  TERMINAL, $, h, setText, replaceIfChanged, syncRows, badge, fact, link, enc, jobHref, tmHref, deploymentHref,
  fmtTime, fmtDuration, fmtNumber, dash, api, errorText, taskBadges, say,
} from "./core.js";
import { resetCheckpointView, refreshCheckpoints, installCheckpointActions } from "./checkpoints.js";
import { recordSample, loadMetricHistory, renderMetrics } from "./metrics.js";

/* ---------------------------------------------------------------- overview */

export function renderClusterOverview(o) {
  setText($("slots-available"), o["slots-available"]);
  setText($("slots-total"), o["slots-total"]);
  setText($("tm-count"), o.taskmanagers);
  setText($("jobs-running"), o["jobs-running"]);
  setText($("jobs-finished"), o["jobs-finished"]);
  setText($("jobs-cancelled"), o["jobs-cancelled"]);
  setText($("jobs-failed"), o["jobs-failed"]);
  const total = o["slots-total"] || 0;
  const used = total - (o["slots-available"] || 0);
  const bar = $("cluster-slotbar");
  bar.style.width = total ? `${(100 * used) / total}%` : "0";
  bar.classList.toggle("full", total > 0 && used >= total);
}

export function renderLeaderBadge(o) {
  setText($("version"), o["flink-version"]);
  const jm = o.jobmanager;
  const leader = $("leader");
  setText(leader, jm ? `JobManager ${jm.id} · epoch ${jm.epoch}${jm.mode === "zookeeper" ? " · HA" : ""}`
    : "no JobManager leads: submissions wait");
  leader.classList.toggle("live", !!jm);
  leader.classList.toggle("down", !jm);
}

/* ---------------------------------------------------------------- job tables */

/* Columns a job table can show; each table lists the ones it has, in order. */
const JOB_COLUMNS = {
  name: {
    create: () => h("td", { class: "name" }, h("a", { class: "job-link" })),
    update: (td, job) => {
      const a = td.firstChild;
      a.href = jobHref(job.jid);
      setText(a, job.name);
      a.title = `${job.name} (${job.jid})`;
    },
  },
  start: { create: () => h("td", { class: "nowrap" }), update: (td, job) => setText(td, fmtTime(job["start-time"])) },
  duration: { create: () => h("td"), update: (td, job) => setText(td, fmtDuration(job.duration)) },
  end: { create: () => h("td", { class: "nowrap" }), update: (td, job) => setText(td, fmtTime(job["end-time"])) },
  tasks: {
    create: () => h("td"),
    update: (td, job) => replaceIfChanged(td, JSON.stringify(job.tasks), () => taskBadges(job.tasks)),
  },
  state: { create: () => h("td", { class: "state" }), update: (td, job) => replaceIfChanged(td, job.state, () => badge(job.state)) },
  reason: { create: () => h("td", { class: "reason" }), update: (td, job) => setText(td, job["waiting-reason"] || "") },
  restarts: {
    create: () => h("td", { class: "restarts" }),
    update: (td, job) => {
      setText(td, job.restarts === undefined || job.restarts === null ? "–" : String(job.restarts));
      td.classList.toggle("restarted", job.restarts > 0);
    },
  },
  // A deployment starts a job per generation, rescale and rollback, all with its name: the link
  // says which deployment, and its page which generation.
  deployment: {
    create: () => h("td", { class: "deployment" }),
    update: (td, job) => replaceIfChanged(td, String(job.deployment || ""), () => (job.deployment
      ? link(deploymentHref(job.deployment), job.deployment, { title: `deployment ${job.deployment}` }) : "–")),
  },
  cancel: {
    create: (job) => {
      const btn = h("button", { type: "button", class: "cancel", text: "Cancel" });
      btn.addEventListener("click", (ev) => { ev.stopPropagation(); cancelJob(job.jid, btn, null); });
      return h("td", {}, btn);
    },
    update: (td, job) => {
      const btn = td.firstChild;
      btn.hidden = TERMINAL.has(job.state);
      if (job.state === "CANCELLING") { btn.disabled = true; setText(btn, "Cancelling"); }
    },
  },
};

function jobRows(tbody, jobs, columns) {
  syncRows(tbody, jobs, (j) => j.jid,
    (job) => {
      const tr = h("tr", { class: "clickable" }, ...columns.map((c) => JOB_COLUMNS[c].create(job)));
      tr.addEventListener("click", (ev) => {
        if (ev.target.closest("a, button")) return;
        window.location.hash = jobHref(job.jid);
      });
      return tr;
    },
    (tr, job) => columns.forEach((c, i) => JOB_COLUMNS[c].update(tr.children[i], job)));
}

const newestFirst = (a, b) => (b["start-time"] || 0) - (a["start-time"] || 0) || (a.jid < b.jid ? 1 : -1);

export function renderOverviewJobs(jobs) {
  const running = jobs.filter((j) => !TERMINAL.has(j.state)).sort(newestFirst);
  const done = jobs.filter((j) => TERMINAL.has(j.state))
    .sort((a, b) => (b["end-time"] || 0) - (a["end-time"] || 0)).slice(0, 10);
  jobRows($("ov-running"), running, ["name", "start", "duration", "tasks", "state", "restarts", "reason"]);
  jobRows($("ov-completed"), done, ["name", "start", "duration", "end", "tasks", "state"]);
  $("ov-running-table").hidden = !running.length;
  $("ov-running-empty").hidden = running.length > 0;
  $("ov-completed-table").hidden = !done.length;
  $("ov-completed-empty").hidden = done.length > 0;
}

function jobMatches(job, state, text) {
  if (state === "live" && TERMINAL.has(job.state)) return false;
  if (state === "completed" && !TERMINAL.has(job.state)) return false;
  if (state && state !== "live" && state !== "completed" && job.state !== state) return false;
  if (text && !`${job.name}\n${job.jid}`.toLowerCase().includes(text)) return false;
  return true;
}

let lastJobs = null; // the list last shown: the filters redraw it without asking the server

export function renderJobList(jobs) {
  lastJobs = jobs;
  const state = $("jobs-filter-state").value;
  const text = $("jobs-filter-name").value.trim().toLowerCase();
  const shown = jobs.filter((j) => jobMatches(j, state, text)).sort(newestFirst);
  jobRows($("jobs-body"), shown,
    ["name", "deployment", "start", "duration", "end", "tasks", "state", "restarts", "reason", "cancel"]);
  $("jobs-table").hidden = shown.length === 0;
  const empty = $("jobs-empty");
  empty.hidden = shown.length > 0;
  if (jobs.length && !shown.length) setText(empty, "No job matches the filters.");
  const live = jobs.filter((j) => !TERMINAL.has(j.state)).length;
  setText($("jobs-summary"), jobs.length
    ? `${live} running · ${jobs.length - live} completed${shown.length !== jobs.length ? ` · ${shown.length} shown` : ""}` : "");
}

async function cancelJob(jid, button, messageEl) {
  if (!window.confirm(`Cancel job ${jid}?`)) return;
  button.disabled = true;
  try {
    await api(`/jobs/${enc(jid)}?mode=cancel`, { method: "PATCH" });
    setText(button, "Cancelling");
    if (messageEl) say(messageEl, "cancel requested", "ok");
  } catch (e) {
    button.disabled = false;
    if (messageEl) say(messageEl, errorText(e, "Could not cancel"), "error");
    else window.alert(errorText(e, "Could not cancel"));
  }
}

/* ---------------------------------------------------------------- a job's page */

const JOB_TABS = ["overview", "attempts", "exceptions", "configuration", "checkpoints", "metrics"];
export let selectedJob = null;   // the job whose page is open
let activeTab = "overview";
export let jobDetail = null;     // its latest GET /jobs/{id}
export let progress = null;      // its latest GET /jobs/{id}/progress tasks (null: unknown or not served)
let historyLoaded = false;       // its metric history merged (asked again at each refresh until it is)

export function openJob(jid, tab) {
  const tabName = JOB_TABS.includes(tab) ? tab : "overview";
  if (jid !== selectedJob) {
    selectedJob = jid;
    jobDetail = null;
    progress = null;
    historyLoaded = false;
    for (const id of ["detail-facts", "detail-graph", "detail-vertices", "detail-attempts", "detail-root-exception",
      "detail-exceptions", "detail-config", "metrics-charts", "metrics-tasks"]) {
      $(id).replaceChildren();
      $(id).dataset.v = "";
    }
    setText($("detail-name"), jid);
    setText($("detail-state"), "");
    say($("detail-cancel-message"), "");
    const cancel = $("detail-cancel");
    cancel.hidden = true;
    cancel.disabled = false;
    setText(cancel, "Cancel Job");
    resetCheckpointView();
  }
  activeTab = tabName;
  for (const a of document.querySelectorAll("#job-tabs .tab")) {
    const on = a.dataset.tab === tabName;
    a.href = jobHref(jid, a.dataset.tab === "overview" ? "" : a.dataset.tab);
    a.classList.toggle("active", on);
    a.setAttribute("aria-selected", on ? "true" : "false");
  }
  for (const t of JOB_TABS) $(`tab-${t}`).hidden = t !== tabName;
}

export function closeJob() {
  selectedJob = null;
}

function restartText(rs) {
  const r = rs || {};
  const rest = Object.entries(r).filter(([k]) => k !== "type").map(([k, v]) => `${k}=${v}`).join(", ");
  return `${r.type || "cluster default"}${rest ? ` (${rest})` : ""}`;
}

function renderJobHeader(d) {
  setText($("detail-name"), d.name);
  const st = $("detail-state");
  st.className = `badge state-${d.state}`;
  setText(st, d.state);
  document.title = `${d.name} · Headrace`;
  const cancel = $("detail-cancel");
  cancel.hidden = TERMINAL.has(d.state);
  if (d.state === "CANCELLING") { cancel.disabled = true; setText(cancel, "Cancelling"); }
  const scheduleId = d["schedule-id"] || d.scheduleId || null;
  const failure = d["last-failure"] || null;
  const key = JSON.stringify([d.jid, d["start-time"], d.duration, d.attempts, d["restart-strategy"], d.maxParallelism,
    d["job-type"], d["waiting-reason"], d["end-time"], scheduleId, d.restarts, d.deployment, failure]);
  replaceIfChanged($("detail-facts"), key, () => [
    fact("Job ID", h("span", { class: "mono", text: d.jid })),
    fact("Start Time", fmtTime(d["start-time"])),
    fact("End Time", fmtTime(d["end-time"])),
    fact("Duration", fmtDuration(d.duration)),
    fact("Attempts", dash(d.attempts)),
    fact("Restart Strategy", restartText(d["restart-strategy"])),
    fact("Max Parallelism", dash(d.maxParallelism)),
    fact("Type", dash(d["job-type"])),
    d["waiting-reason"] ? fact("Waiting Reason", d["waiting-reason"]) : null,
    scheduleId ? fact("Started by schedule", link(`#/schedules/${enc(scheduleId)}`, scheduleId)) : null,
    d.deployment ? fact("Deployment", link(deploymentHref(d.deployment), d.deployment, { id: "detail-deployment" })) : null,
    d.restarts !== undefined ? fact("Restarts", String(d.restarts)) : null,
    // The newest exception as one line; the whole trace is in the Exceptions tab.
    failure ? fact("Last Failure", h("span", {},
      h("span", { class: "fail-text last-failure", title: `${failure.summary || ""}\n(the whole trace: Exceptions tab)`,
        text: failure.summary || "–" }),
      h("span", { class: "muted", text: fmtTime(failure.timestamp) }))) : null,
  ].filter(Boolean));
}

/* Progress rows of one vertex's running attempts (the newest per subtask). */
function progressOf(vertexId) {
  return (progress || []).filter((t) => t.vertexId === vertexId);
}

export function sparkLinks(tasks) {
  const urls = [...new Set(tasks.map((t) => t.sparkUi).filter((u) => typeof u === "string" && /^https?:\/\//.test(u)))];
  if (!urls.length) return h("span", { class: "muted", text: "–" });
  return h("span", {}, ...urls.map((u, i) => h("a", {
    href: u, target: "_blank", rel: "noopener noreferrer", class: "ext", text: urls.length > 1 ? `Spark UI ${i + 1}` : "Spark UI",
  })));
}

function recordsOut(v, tasks) {
  const m = v.metrics || {};
  if (m["write-records"] !== undefined) return m["write-records"];
  return tasks.length ? tasks.reduce((n, t) => n + (Number(t.numInputRows) || 0), 0) : null;
}

/* The execution graph: one box per vertex, left to right in plan order (Headrace's plans are
 * chains: each vertex is one Spark query), with its parallelism, state and records. */
function renderGraph(d) {
  const box = $("detail-graph");
  const vs = d.vertices || [];
  const key = JSON.stringify([vs.map((v) => [v.id, v.name, v.parallelism, v.status, v.metrics]),
    (progress || []).map((t) => [t.vertexId, t.processedRowsPerSecond, t.sparkUi])]);
  replaceIfChanged(box, key, () => {
    if (!vs.length) return h("div", { class: "muted", text: "The JobManager has not built the plan yet." });
    const nodes = [];
    vs.forEach((v, i) => {
      if (i) nodes.push(h("div", { class: "edge", "aria-hidden": "true" }));
      const tasks = progressOf(v.id);
      const rate = tasks.reduce((n, t) => n + (Number(t.processedRowsPerSecond) || 0), 0);
      const out = recordsOut(v, tasks);
      nodes.push(h("div", { class: `node node-${v.status}`, "data-vertex": v.id },
        h("div", { class: "node-name", text: v.name, title: v.name }),
        h("div", { class: "node-row" }, badge(v.status), h("span", { class: "muted", text: `parallelism ${v.parallelism}` })),
        h("dl", { class: "node-stats" },
          h("dt", { text: "records in" }), h("dd", { text: fmtNumber((v.metrics || {})["read-records"]) }),
          h("dt", { text: "records out" }), h("dd", { text: out === null ? "–" : fmtNumber(out) }),
          h("dt", { text: "rows/s" }), h("dd", { text: tasks.length ? fmtNumber(rate, 1) : "–" })),
        tasks.length ? h("div", { class: "node-row" }, sparkLinks(tasks)) : null));
    });
    return h("div", { class: "graph-chain" }, ...nodes);
  });
}

function renderVertices(d, tmByVertex) {
  const body = $("detail-vertices");
  const vs = d.vertices || [];
  const key = JSON.stringify([vs, [...tmByVertex], (progress || []).map((t) => [t.vertexId, t.sparkUi, t.numInputRows])]);
  replaceIfChanged(body, key, () => {
    if (!vs.length) return h("tr", {}, h("td", { colspan: 9, class: "muted", text: "not scheduled yet" }));
    return vs.map((v) => {
      const tasks = progressOf(v.id);
      const out = recordsOut(v, tasks);
      const tm = tmByVertex.get(v.id);
      return h("tr", {},
        h("td", { class: "name", text: v.name, title: v.name }), h("td", { text: v.parallelism }), h("td", {}, badge(v.status)),
        h("td", { class: "nowrap", text: fmtTime(v["start-time"]) }), h("td", { text: fmtDuration(v.duration) }),
        h("td", { text: fmtNumber((v.metrics || {})["read-records"]) }), h("td", { text: out === null ? "–" : fmtNumber(out) }),
        h("td", { class: "mono" }, tm ? link(tmHref(tm), tm) : "–"),
        h("td", {}, sparkLinks(tasks)));
    });
  });
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
  const key = JSON.stringify(rows.map(({ v, a }) => [v.id, a]));
  replaceIfChanged($("detail-attempts"), key, () => {
    if (!rows.length) return h("tr", {}, h("td", { colspan: 10, class: "muted", text: "no attempt yet" }));
    return rows.map(({ v, a }) => h("tr", {},
      h("td", { class: "name", text: v.name, title: v.name }),
      h("td", { text: a.attempt }),
      h("td", {}, badge(a.status)),
      h("td", { class: "mono" }, a["taskmanager-id"] ? link(tmHref(a["taskmanager-id"]), a["taskmanager-id"]) : "–"),
      h("td", { class: "nowrap", text: fmtTime(a["start-time"]) }),
      h("td", { class: "nowrap", text: fmtTime(a["end-time"]) }),
      h("td", { text: fmtDuration(a.duration) }),
      h("td", { text: dash(a["last-batch-id"]) }),
      h("td", { class: "restore-cell" }, restoreCell(a)),
      // The exception's type and message; the whole cause on hover and in the Exceptions tab.
      h("td", { class: "cause-cell" }, a["failure-cause"] ? h("div", { class: "cause", title: a["failure-cause"],
        text: a["failure-summary"] || a["failure-cause"] }) : null)));
  });
}

function exceptionBox(e) {
  return h("div", { class: "exc" },
    h("div", { class: "exc-head" },
      h("span", {}, h("span", { class: "exc-name", text: e.exceptionName || "exception" }),
        ` in ${e.taskName || "job"}${e.attempt !== null && e.attempt !== undefined ? ` (attempt ${e.attempt})` : ""}`),
      h("span", {}, fmtTime(e.timestamp),
        e.taskManagerId ? " · " : null, e.taskManagerId ? link(tmHref(e.taskManagerId), e.endpoint || e.taskManagerId) : null)),
    e.summary ? h("div", { class: "exc-summary fail-text", text: e.summary }) : null,
    h("pre", { class: "stacktrace", text: e.stacktrace || "" }));
}

function renderExceptions(exc) {
  const entries = (exc.exceptionHistory && exc.exceptionHistory.entries) || [];
  replaceIfChanged($("detail-root-exception"), JSON.stringify([exc["root-exception"], exc.timestamp]), () =>
    exc["root-exception"]
      ? h("div", { class: "exc" }, h("div", { class: "exc-head" }, h("span", { text: fmtTime(exc.timestamp) })),
        h("pre", { class: "stacktrace", text: exc["root-exception"] }))
      : h("div", { class: "muted", text: "No exceptions." }));
  replaceIfChanged($("detail-exceptions"), JSON.stringify(entries.map((e) => [e.timestamp, e.exceptionName, e.attempt])), () => {
    const out = entries.map(exceptionBox);
    if (!entries.length) out.push(h("div", { class: "muted", text: "No exceptions." }));
    if (exc.exceptionHistory && exc.exceptionHistory.truncated) {
      out.push(h("div", { class: "muted", text: "Older entries are not kept (exception_history_size)." }));
    }
    return out;
  });
}

function configRows(obj, prefix) {
  const rows = [];
  for (const k of Object.keys(obj || {}).sort()) {
    const v = obj[k];
    if (v !== null && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length) {
      rows.push(...configRows(v, `${prefix}${k}.`));
    } else {
      const text = v === null || v === undefined ? "–" : typeof v === "object" ? JSON.stringify(v) : String(v);
      rows.push(h("tr", {}, h("th", { scope: "row", class: "mono", text: `${prefix}${k}` }), h("td", { class: "mono path", text })));
    }
  }
  return rows;
}

function renderJobConfig(cfg) {
  $("detail-config-empty").hidden = true;
  replaceIfChanged($("detail-config"), JSON.stringify(cfg), () => {
    const ec = cfg["execution-config"] || {};
    const { "user-config": user, ...exec } = ec;
    const rows = [h("tr", {}, h("th", { colspan: 2, class: "kv-group", text: "Execution" })), ...configRows(exec, "")];
    rows.push(h("tr", {}, h("th", { colspan: 2, class: "kv-group", text: "Job configuration" })));
    const userRows = configRows(user || {}, "");
    rows.push(...(userRows.length ? userRows : [h("tr", {}, h("td", { colspan: 2, class: "muted", text: "none set" }))]));
    return rows;
  });
}

/* ---------------------------------------------------------------- polling the open job */

export async function refreshJobPage() {
  const jid = selectedJob;
  if (!jid) return;
  const base = `/jobs/${enc(jid)}`;
  let d;
  try {
    d = await api(base);
  } catch (e) {
    if (jid !== selectedJob) return;
    if (e.status === 404) {
      setText($("detail-name"), `Job ${jid} not found`);
      $("detail-facts").replaceChildren(h("div", { class: "muted", text: errorText(e) }));
      $("detail-facts").dataset.v = "";
      return;
    }
    throw e;
  }
  if (jid !== selectedJob) return;
  jobDetail = d;
  renderJobHeader(d);
  // Progress feeds the graph, the Spark UI links and the charts; the endpoint may not exist yet.
  const live = !TERMINAL.has(d.state);
  // Once per opening (the last minutes, at once), again at the next refresh if it failed (a slow
  // dispatcher timed out, Redis away): else the charts stayed empty until the page was reopened.
  if (!historyLoaded) {
    const loaded = await loadMetricHistory(jid);
    // Another job opened meanwhile: its own flag, reset by openJob, is not this answer's to set.
    if (jid !== selectedJob) return;
    historyLoaded = loaded;
  }
  if (live || progress === null) {
    try {
      const p = await api(`${base}/progress`);
      if (jid !== selectedJob) return;
      progress = (p && p.tasks) || [];
      recordSample(jid, progress);
      setText($("metrics-note"), progress.length ? "" : "No task reports progress yet.");
    } catch (e) {
      if (jid !== selectedJob) return;
      progress = [];
      setText($("metrics-note"), errorText(e));
    }
  }
  if (jid !== selectedJob) return;
  if (activeTab === "overview") {
    renderGraph(d);
    const details = await vertexDetails(jid, d);
    const tmByVertex = new Map(details.map((v) => [v.id, ((v.subtasks || [])[0] || {})["taskmanager-id"]]).filter(([, t]) => t));
    if (jid === selectedJob) renderVertices(d, tmByVertex);
  } else if (activeTab === "attempts") {
    const details = await vertexDetails(jid, d);
    if (jid === selectedJob) renderAttempts(details);
  } else if (activeTab === "exceptions") {
    const exc = await api(`${base}/exceptions`);
    if (jid === selectedJob) renderExceptions(exc);
  } else if (activeTab === "configuration") {
    if ($("detail-config").dataset.v && TERMINAL.has(d.state)) return;
    try {
      const cfg = await api(`${base}/config`);
      if (jid === selectedJob) renderJobConfig(cfg);
    } catch (e) {
      const box = $("detail-config-empty");
      box.hidden = false;
      setText(box, errorText(e));
    }
  } else if (activeTab === "checkpoints") {
    await refreshCheckpoints(jid, d);
  } else if (activeTab === "metrics") {
    renderMetrics(jid);
  }
}

async function vertexDetails(jid, d) {
  try {
    return await Promise.all((d.vertices || []).map((v) => api(`/jobs/${enc(jid)}/vertices/${enc(v.id)}`)));
  } catch (_) {
    return []; // a vertex that vanished between the two requests shows up at the next refresh
  }
}

export function installJobPage() {
  $("detail-cancel").addEventListener("click", () => {
    if (selectedJob) cancelJob(selectedJob, $("detail-cancel"), $("detail-cancel-message"));
  });
  $("jobs-filters").addEventListener("submit", (ev) => ev.preventDefault());
  for (const id of ["jobs-filter-state", "jobs-filter-name"]) {
    $(id).addEventListener("input", () => { if (lastJobs) renderJobList(lastJobs); });
  }
  installCheckpointActions();
}
