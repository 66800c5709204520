/* Headrace dashboard: deployments (#/deployments, #/deployments/<name>): a named pipeline the
 * JobManager keeps running at its latest spec, upgrading, rolling back and suspending its job.
 * Like every page, server text is only ever written as text (h(..., {text}), setText). */
import {
  $, h, setText, replaceIfChanged, syncRows, badge, fact, link, enc, jobHref, deploymentHref, fmtTime, toMillis,
  fmtWhen, fmtAgo, dash, api, errorText, say,
} from "./core.js";
import { refreshAutoscaler } from "./autoscaler.js";

/* Lifecycle states drawn with the job states' colours (style.css): unknown ones get the grey
 * default of .badge. */
const LIFECYCLE_CLASS = {
  DEPLOYING: "DEPLOYING", STABLE: "RUNNING", UPGRADING: "RESTARTING", ROLLING_BACK: "CANCELLING",
  ROLLED_BACK: "CANCELED", SUSPENDED: "SUSPENDED", FAILED: "FAILED",
};

function lifecycleBadge(state) {
  if (!state) return h("span", { class: "badge", title: "the JobManager has not taken it up yet", text: "NEW" });
  return h("span", { class: `badge state-${LIFECYCLE_CLASS[state] || state}`, text: state });
}

/* ---------------------------------------------------------------- spec differences */

const isPlainObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);

/* JSON with object keys sorted, so {"a":1,"b":2} equals {"b":2,"a":1}. */
function canonicalJson(v) {
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(",")}]`;
  if (isPlainObject(v)) {
    return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonicalJson(v[k])}`).join(",")}}`;
  }
  return v === undefined ? "null" : JSON.stringify(v);
}

/* The key-by-key difference from spec `before` to spec `after`: a list, sorted by path, of
 * {path, change: "added"|"removed"|"changed", from, to} (from/to are the values, absent where the
 * key is). Objects on both sides are compared key by key, their keys joined into dotted paths
 * (rollback.readyWithin); anything else (arrays, scalars, an object replaced by a scalar) is one
 * value compared whole. A pure function of its arguments. */
function diffSpecs(before, after, prefix) {
  const out = [];
  const a = isPlainObject(before) ? before : {};
  const b = isPlainObject(after) ? after : {};
  const keys = [...new Set([...Object.keys(a), ...Object.keys(b)])].sort();
  for (const k of keys) {
    const path = prefix ? `${prefix}.${k}` : k;
    const inA = Object.prototype.hasOwnProperty.call(a, k);
    const inB = Object.prototype.hasOwnProperty.call(b, k);
    if (!inB) out.push({ path, change: "removed", from: a[k] });
    else if (!inA) out.push({ path, change: "added", to: b[k] });
    else if (isPlainObject(a[k]) && isPlainObject(b[k])) out.push(...diffSpecs(a[k], b[k], path));
    else if (canonicalJson(a[k]) !== canonicalJson(b[k])) out.push({ path, change: "changed", from: a[k], to: b[k] });
  }
  return out;
}

const specValue = (v) => (v === undefined ? "" : typeof v === "string" ? JSON.stringify(v) : canonicalJson(v));
const textOf = (v) => (v === null || v === undefined || v === "" ? "" : typeof v === "string" ? v : JSON.stringify(v));

/* ---------------------------------------------------------------- the list */

function createDeploymentRow(d) {
  const tr = h("tr", { class: "clickable" },
    h("td", { class: "name" }, h("a")), h("td", { class: "state" }), h("td"), h("td"), h("td"),
    h("td", { class: "mono" }), h("td", { class: "job-state" }), h("td", { class: "nowrap" }),
    h("td", { class: "reason fail-text" }));
  tr.addEventListener("click", (ev) => {
    if (!ev.target.closest("a, button")) window.location.hash = deploymentHref(d.name);
  });
  return tr;
}

function updateDeploymentRow(tr, d) {
  const c = tr.children;
  const a = c[0].firstChild;
  a.href = deploymentHref(d.name);
  setText(a, d.name);
  a.title = d.name;
  replaceIfChanged(c[1], String(d.lifecycleState), () => lifecycleBadge(d.lifecycleState));
  setText(c[2], dash(d.generation));
  setText(c[3], dash(d.stableGeneration));
  setText(c[4], dash(d.parallelism));
  replaceIfChanged(c[5], String(d.jobId || ""), () => (d.jobId
    ? link(jobHref(d.jobId), d.jobId.slice(0, 8), { title: d.jobId, class: "job-link" }) : "–"));
  replaceIfChanged(c[6], String(d.jobState || ""), () => (d.jobState ? badge(d.jobState) : "–"));
  setText(c[7], fmtAgo(d.updatedAt));
  c[7].title = fmtTime(d.updatedAt);
  setText(c[8], textOf(d.error));
}

export async function refreshDeployments() {
  let out;
  try {
    out = await api("/deployments");
  } catch (e) {
    if (e.status === 401) throw e;
    $("dep-table").hidden = true;
    $("dep-empty").hidden = false;
    setText($("dep-empty"), errorText(e));
    return;
  }
  const list = [...((out && out.deployments) || [])].sort((x, y) => (x.name < y.name ? -1 : x.name > y.name ? 1 : 0));
  syncRows($("dep-body"), list, (d) => String(d.name), createDeploymentRow, updateDeploymentRow);
  $("dep-table").hidden = !list.length;
  $("dep-empty").hidden = list.length > 0;
  setText($("dep-empty"), "No deployments. Create one with headrace deploy apply, or PUT /deployments/{name}.");
  const problems = list.filter((d) => ["FAILED", "ROLLED_BACK", "ROLLING_BACK"].includes(d.lifecycleState)).length;
  setText($("dep-note"), list.length ? `${list.length} deployment${list.length === 1 ? "" : "s"}`
    + `${problems ? ` · ${problems} failed or rolled back` : ""}` : "");
}

/* ---------------------------------------------------------------- one deployment */

export let shownDeployment = null;  // the name whose page is open
let deploymentDetail = null; // its latest GET /deployments/{name}

export function openDeployment(name) {
  if (shownDeployment === name) return;
  shownDeployment = name;
  deploymentDetail = null;
  setText($("depd-name"), name);
  $("depd-state").replaceChildren();
  $("depd-state").dataset.v = "";
  for (const k of ["depd-facts", "depd-generations", "depd-history", "depd-savepoints"]) {
    $(k).replaceChildren();
    $(k).dataset.v = "";
  }
  say($("depd-message"), "");
  $("depd-actions").hidden = true;
}

function generationBlock(gen, prev) {
  const diff = prev ? diffSpecs(prev.spec, gen.spec) : [];
  const head = h("div", { class: "generation-head" },
    h("b", { text: `Generation ${dash(gen.generation)}` }),
    h("span", { class: "muted", text: fmtWhen(gen.at) }),
    h("span", { class: "muted", text: prev ? `compared with generation ${prev.generation}`
      : gen.generation === 1 ? "the first generation" : "no earlier generation is kept" }));
  let body;
  if (!prev) body = null;
  else if (!diff.length) body = h("div", { class: "muted", text: "Same spec as the previous generation." });
  else {
    body = h("table", { class: "grid diff" },
      h("thead", {}, h("tr", {}, h("th", { text: "Key" }), h("th", { text: "Change" }), h("th", { text: "Before" }),
        h("th", { text: "After" }))),
      h("tbody", {}, ...diff.map((d) => h("tr", { class: `diff-${d.change}`, "data-path": d.path },
        h("td", { class: "mono diff-path", text: d.path }), h("td", { class: "diff-change", text: d.change }),
        h("td", { class: "mono diff-from", text: specValue(d.from) }),
        h("td", { class: "mono diff-to", text: specValue(d.to) })))));
  }
  const spec = h("details", { class: "spec" }, h("summary", { text: "spec" }),
    h("pre", { class: "mono", text: JSON.stringify(gen.spec, null, 2) }));
  return h("div", { class: "generation" }, head, body, spec);
}

/* Each generation's block is built once (its spec never changes): an opened "spec" stays open. */
function renderGenerations(generations) {
  const gens = [...(generations || [])].sort((x, y) => (x.generation || 0) - (y.generation || 0));
  const items = gens.map((gen, i) => ({ gen, prev: i > 0 ? gens[i - 1] : null })).reverse(); // newest first
  syncRows($("depd-generations"), items, (it) => `${it.gen.generation}:${it.prev ? it.prev.generation : ""}`,
    (it) => generationBlock(it.gen, it.prev), () => {});
  $("depd-generations-empty").hidden = items.length > 0;
}

/* Rows keyed by their content, so an unchanged row is never rebuilt (same content twice: #2). */
function contentKeys(rows) {
  const seen = new Map();
  return rows.map((r) => {
    const k = canonicalJson(r);
    const n = (seen.get(k) || 0) + 1;
    seen.set(k, n);
    return { r, key: `${k}#${n}` };
  });
}

function renderDeploymentHistory(history) {
  const rows = contentKeys([...(history || [])]).reverse()
    .sort((x, y) => (toMillis(y.r.at) || 0) - (toMillis(x.r.at) || 0)); // newest first; stable for equal times
  syncRows($("depd-history"), rows, (x) => x.key, ({ r }) => h("tr", {},
    h("td", { class: "nowrap", text: fmtWhen(r.at) }), h("td", { text: dash(r.generation) }),
    h("td", {}, r.from ? lifecycleBadge(r.from) : "–"), h("td", {}, r.to ? lifecycleBadge(r.to) : "–"),
    h("td", { class: "history-reason", text: dash(textOf(r.reason)) }),
    h("td", { class: "mono" }, r.jobId ? link(jobHref(r.jobId), r.jobId.slice(0, 8), { title: r.jobId }) : "–"),
    h("td", { class: "path-cell mono", text: dash(r.savepoint) })), () => {});
  $("depd-history-empty").hidden = rows.length > 0;
}

function renderSavepoints(savepoints) {
  const list = [...(savepoints || [])].sort((x, y) => (toMillis(y.at) || 0) - (toMillis(x.at) || 0));
  syncRows($("depd-savepoints"), list, (sp) => String(sp.path || canonicalJson(sp)), (sp) => h("tr", {},
    h("td", { class: "nowrap", text: fmtWhen(sp.at) }), h("td", { class: "path-cell mono", text: dash(sp.path) }),
    h("td", { text: dash(sp.trigger) }), h("td", { text: dash(sp.generation) }),
    h("td", { class: "mono" }, sp.jobId ? link(jobHref(sp.jobId), sp.jobId.slice(0, 8), { title: sp.jobId }) : "–"),
    h("td", { class: "disposed" })), (tr, sp) => setText(tr.lastChild, sp.disposed ? "yes" : "no"));
  $("depd-savepoints-empty").hidden = list.length > 0;
}

function renderDeploymentFacts(d) {
  const st = d.status || {};
  const spec = d.spec || {};
  const rest = { ...st };
  delete rest.history; // it has its own table
  const key = canonicalJson([rest, d.generation, spec.state, spec.upgradeMode, spec.parallelism]);
  replaceIfChanged($("depd-state"), String(st.lifecycleState), () => lifecycleBadge(st.lifecycleState));
  replaceIfChanged($("depd-facts"), key, () => [
    fact("Lifecycle", st.deleting ? h("span", {}, lifecycleBadge(st.lifecycleState), " being deleted")
      : lifecycleBadge(st.lifecycleState)),
    fact("Generation", dash(d.generation)),
    fact("Job's Generation", dash(st.jobGeneration)),
    fact("Stable Generation", dash(st.stableGeneration)),
    fact("Job", st.jobId ? link(jobHref(st.jobId), st.jobId, { class: "mono job-link" }) : "–"),
    fact("Job State", st.jobState ? badge(st.jobState) : "–"),
    fact("Desired State", dash(spec.state)),
    fact("Upgrade Mode", dash(spec.upgradeMode)),
    fact("Parallelism", st.parallelism !== undefined && st.parallelism !== spec.parallelism
      ? `${st.parallelism} (autoscaler; spec ${spec.parallelism})` : dash(spec.parallelism)),
    fact("Last Savepoint", h("span", { class: "mono path", text: dash(textOf(st.lastSavepoint)) })),
    fact("Error", st.error ? h("span", { class: "fail-text", text: textOf(st.error) }) : "none"),
  ]);
  const toggle = $("depd-suspend");
  const suspended = spec.state === "suspended";
  setText(toggle, suspended ? "Resume" : "Suspend");
  toggle.title = `PUT /deployments/{name} with state "${suspended ? "running" : "suspended"}"`;
  $("depd-actions").hidden = false;
}

export async function refreshDeployment() {
  const name = shownDeployment;
  if (name === null) return;
  let d;
  try {
    d = await api(`/deployments/${enc(name)}`);
  } catch (e) {
    if (e.status === 401) throw e;
    if (name !== shownDeployment) return;
    $("depd-error").hidden = false;
    setText($("depd-error"), errorText(e));
    return;
  }
  if (name !== shownDeployment) return; // the user moved on while it loaded
  deploymentDetail = d;
  $("depd-error").hidden = true;
  setText($("depd-name"), d.name || name);
  renderDeploymentFacts(d);
  renderGenerations(d.generations);
  renderDeploymentHistory((d.status || {}).history);
  renderSavepoints(d.savepoints);
  await refreshAutoscaler(name, d);
}

/* ---------------------------------------------------------------- suspend, resume, roll back */

async function deploymentAction(button, question, request, done) {
  const name = shownDeployment;
  const msg = $("depd-message");
  if (name === null || !deploymentDetail || !window.confirm(question(name))) return;
  button.disabled = true;
  say(msg, "");
  try {
    await request(name);
    if (name === shownDeployment) say(msg, done, "ok");
    await refreshDeployment();
  } catch (e) {
    if (name === shownDeployment) say(msg, errorText(e), "error");
  } finally {
    button.disabled = false;
  }
}

function toggleSuspended() {
  const spec = (deploymentDetail && deploymentDetail.spec) || {};
  const resume = spec.state === "suspended";
  deploymentAction($("depd-suspend"),
    (name) => (resume ? `Resume deployment ${name}? Its job starts again.`
      : `Suspend deployment ${name}? Its job stops until you resume it.`),
    (name) => api(`/deployments/${enc(name)}`, {
      method: "PUT", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ ...spec, state: resume ? "running" : "suspended" }),
    }),
    resume ? "resume requested" : "suspend requested");
}

function rollBack() {
  const st = (deploymentDetail && deploymentDetail.status) || {};
  deploymentAction($("depd-rollback"),
    (name) => `Roll deployment ${name} back${st.stableGeneration ? ` to generation ${st.stableGeneration}` : ""}?`,
    (name) => api(`/deployments/${enc(name)}/rollback`, { method: "POST" }),
    "rollback requested");
}

export function installDeploymentPages() {
  $("depd-suspend").addEventListener("click", toggleSuspended);
  $("depd-rollback").addEventListener("click", rollBack);
}

/* What a test (or the console) may call: Deployments.diffSpecs(before, after). */
window.Deployments = Object.freeze({ diffSpecs, canonicalJson, lifecycleBadge });
