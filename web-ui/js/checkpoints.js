/* Headrace dashboard: the Checkpoints tab of a job (statistics, configuration, details of one
 * checkpoint, and the savepoint / stop / checkpoint actions with their status polling).
 * `selectedJob` (jobs.js) is the job whose page is open. */
import { $, h, setText, syncRows, badge, fact, fmtTime, fmtBytes, fmtMillis, api, errorText } from "./core.js";
import { selectedJob } from "./jobs.js";

/* ---------------------------------------------------------------- checkpoints */

// Flink reports "no periodic checkpoints" as Long.MAX_VALUE (9223372036854775807 ms).
const CHECKPOINTING_OFF = Number.MAX_SAFE_INTEGER;

let cpConfigFor = null;     // the job whose configuration is shown
let cpConfigAt = 0;         // when it was fetched (the configuration is re-read every 10 s)
let cpDetailsId = null;     // the checkpoint whose details are open
const operations = new Map(); // jid -> [{kind, requestId, resource, status, text, failed, started}], newest first

export function resetCheckpointView() {
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
  // A Delta sink: the table version this snapshot's batch committed (what a restore rewinds the table to).
  if (s.sink_version !== undefined && s.sink_version !== null) {
    td.append(" ", h("span", { class: "tag", text: `Delta v${s.sink_version}`, title: `${s.sink_table || ""}: table version ${s.sink_version}` }));
  }
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
  const pathKey = JSON.stringify([s.status, s.external_path, s.failure_message, s.discarded, s.sink_version]);
  if (c[9].dataset.v !== pathKey) { c[9].replaceChildren(...pathCell(s).childNodes); c[9].dataset.v = pathKey; }
  tr.classList.toggle("selected", s.id === cpDetailsId);
  tr.classList.toggle("savepoint-row", isSavepoint(s));
}

function renderCheckpointHistory(history) {
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
  renderCheckpointHistory(cp.history);
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

export async function refreshCheckpoints(jid, d) {
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
    op.text = errorText(e);
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
    if (status !== "COMPLETED") {
      // Asked before the task ran: it waits for it (Headrace's `waiting`, absent in Flink's shape).
      op.text = st && st.waiting
        ? `waiting: ${st.waiting.reason}; fails unless it runs by ${fmtTime(st.waiting.deadline)}` : "in progress…";
      return;
    }
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

export async function pollOperations() {
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


export function installCheckpointActions() {
  $("cp-actions").addEventListener("submit", (ev) => ev.preventDefault()); // Enter in the directory field
  $("cp-savepoint").addEventListener("click", triggerSavepoint);
  $("cp-stop").addEventListener("click", stopWithSavepoint);
  $("cp-checkpoint").addEventListener("click", triggerCheckpoint);
  $("cp-details-close").addEventListener("click", () => showCheckpointDetails(null));
}
