/* Headrace dashboard: submitting a job (#/submit) and schedules (#/schedules, #/schedules/<id>). */
import {
  $, h, setText, replaceIfChanged, syncRows, fact, link, enc, jobHref, fmtTime, toMillis, fmtWhen, fmtDuration,
  dash, api, errorText, say,
} from "./core.js";

/* ---------------------------------------------------------------- uploaded pipelines */

let jarFiles = [];

export async function loadJars(selectId) {
  try {
    const { files } = await api("/jars");
    jarFiles = files || [];
  } catch (_) {
    return; // the list is a convenience; the poller reports connection problems
  }
  for (const [id, blank] of [["f-jar", "— upload the file above —"], ["s-jar", "— choose an uploaded pipeline —"]]) {
    const sel = $(id);
    const keep = (id === "f-jar" && selectId) || sel.value;
    sel.replaceChildren(h("option", { value: "", text: blank }),
      ...jarFiles.map((f) => h("option", { value: f.id, text: `${f.name} (${fmtTime(f.uploaded)})` })));
    sel.value = jarFiles.some((f) => f.id === keep) ? keep : "";
  }
  showEntries();
}

/* The uploaded module's top-level functions, offered as entry functions. */
function showEntries() {
  const jar = jarFiles.find((f) => f.id === $("f-jar").value);
  const names = jar ? (jar.entry || []).map((e) => e.name) : [];
  $("f-entries").replaceChildren(...names.map((n) => h("option", { value: n })));
  $("f-entry").placeholder = names[0] || "build";
}

/* ---------------------------------------------------------------- submit */

const FIELD_INPUTS = {
  jarfile: "f-file", jarid: "f-jar", entryClass: "f-entry", parallelism: "f-parallelism",
  programArgs: "f-args", jobName: "f-name", restartStrategy: "f-restart", savepointPath: "f-savepoint",
};

function markInvalid(form, field, inputs) {
  form.querySelectorAll(".field.invalid").forEach((el) => el.classList.remove("invalid"));
  if (!field) return;
  const top = String(field).split(".")[0];
  const label = form.querySelector(`.field[data-field="${top}"]`);
  if (label) {
    label.classList.add("invalid");
    const input = $(inputs[top] || "");
    if (input) input.focus();
  }
}

function showRestartFields() {
  const t = $("f-restart").value;
  $("f-restart-fixed").hidden = t !== "fixed-delay";
  $("f-restart-rate").hidden = t !== "failure-rate";
  $("f-restart-exp").hidden = t !== "exponential-delay";
}

function numberOf(id) {
  const v = $(id).value.trim();
  return v === "" ? undefined : Number(v);
}

function restartStrategy() {
  const type = $("f-restart").value;
  if (!type) return null;
  if (type === "none") return { type };
  if (type === "fixed-delay") return { type, attempts: numberOf("f-rs-attempts"), delay: numberOf("f-rs-delay") };
  if (type === "failure-rate") {
    return { type, "max-failures-per-interval": numberOf("f-rs-maxfail"), "failure-rate-interval": numberOf("f-rs-interval"),
      delay: numberOf("f-rs-rate-delay") };
  }
  return { type, "initial-backoff": numberOf("f-rs-initial"), "max-backoff": numberOf("f-rs-max"),
    "backoff-multiplier": numberOf("f-rs-mult") };
}

async function submitJob(ev) {
  ev.preventDefault();
  const form = $("submit-form");
  const msg = $("f-message");
  markInvalid(form, null);
  const file = $("f-file").files[0];
  let jarId = $("f-jar").value;
  if (!file && !jarId) {
    markInvalid(form, "jarfile", FIELD_INPUTS);
    say(msg, "Choose a .py or .zip file, or a previously uploaded one.", "error");
    return;
  }
  const body = {};
  const entry = $("f-entry").value.trim();
  const par = $("f-parallelism").value.trim();
  const args = $("f-args").value.trim();
  const name = $("f-name").value.trim();
  const savepoint = $("f-savepoint").value.trim();
  if (entry) body.entryClass = entry;
  if (par) body.parallelism = /^-?\d+$/.test(par) ? Number(par) : par;
  if (args) body.programArgs = args;
  if (name) body.jobName = name;
  const rs = restartStrategy();
  if (rs) body.restartStrategy = Object.fromEntries(Object.entries(rs).filter(([, v]) => v !== undefined));
  if (savepoint) body.savepointPath = savepoint;
  if ($("f-allow-non-restored").checked) body.allowNonRestoredState = true;

  const button = $("f-submit");
  button.disabled = true;
  try {
    if (file) {
      say(msg, `Uploading ${file.name}…`);
      const data = new FormData();
      data.append("jarfile", file, file.name);
      jarId = (await api("/jars/upload", { method: "POST", body: data })).id;
      $("f-file").value = "";
      await loadJars(jarId);
    }
    say(msg, "Submitting…");
    const res = await api(`/jars/${enc(jarId)}/run`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    msg.replaceChildren();
    msg.className = "message ok";
    msg.append("Job ", link(jobHref(res.jobid), res.jobid, { class: "mono", id: "f-job-link" }), " submitted.");
  } catch (e) {
    markInvalid(form, (e.body || {}).field, FIELD_INPUTS);
    say(msg, errorText(e), "error");
  } finally {
    button.disabled = false;
  }
}

/* ---------------------------------------------------------------- schedules */

function scheduleWhen(sc) {
  if (sc.cron) return `cron ${sc.cron}`;
  if (sc.everySeconds) return `every ${fmtDuration(sc.everySeconds * 1000)}`;
  return "–";
}

function createScheduleRow(sc) {
  const toggle = h("button", { type: "button", class: "action small" });
  const del = h("button", { type: "button", class: "action small danger", text: "Delete" });
  const msg = h("span", { class: "message" });
  toggle.addEventListener("click", () => changeSchedule(sc.id, { method: "PATCH", toggle: true }, toggle, msg));
  del.addEventListener("click", () => {
    if (window.confirm(`Delete schedule ${sc.name || sc.id}? Jobs it started keep running.`)) {
      changeSchedule(sc.id, { method: "DELETE" }, del, msg);
    }
  });
  return h("tr", {}, h("td", { class: "name" }, h("a")), h("td"), h("td", { class: "mono" }), h("td"), h("td", { class: "nowrap" }),
    h("td", { class: "nowrap" }), h("td", { class: "mono" }), h("td"), h("td"), h("td", { class: "row-actions" }, toggle, del, msg));
}

function updateScheduleRow(tr, sc) {
  const c = tr.children;
  const a = c[0].firstChild;
  a.href = `#/schedules/${enc(sc.id)}`;
  setText(a, sc.name || sc.id);
  setText(c[1], scheduleWhen(sc));
  setText(c[2], sc.entryClass || "build");
  setText(c[3], dash(sc.overlap));
  setText(c[4], fmtWhen(sc.nextFire));
  setText(c[5], fmtWhen(sc.lastFire));
  replaceIfChanged(c[6], JSON.stringify([sc.lastJobId, sc.lastOutcome]), () => (sc.lastJobId
    ? [link(jobHref(sc.lastJobId), sc.lastJobId.slice(0, 8)), sc.lastOutcome ? ` ${sc.lastOutcome}` : ""] : "–"));
  setText(c[7], dash(sc.runs));
  setText(c[8], sc.enabled ? "yes" : "paused");
  const toggle = c[9].firstChild;
  toggle.dataset.enabled = sc.enabled ? "1" : "0";
  setText(toggle, sc.enabled ? "Pause" : "Resume");
}

async function changeSchedule(id, { method, toggle }, button, msg) {
  button.disabled = true;
  try {
    const init = { method };
    if (toggle) {
      init.headers = { "Content-Type": "application/json" };
      init.body = JSON.stringify({ enabled: button.dataset.enabled !== "1" });
    }
    await api(`/jobs/schedules/${enc(id)}`, init);
    say(msg, "");
    await refreshSchedules();
  } catch (e) {
    say(msg, errorText(e), "error");
  } finally {
    button.disabled = false;
  }
}

export async function refreshSchedules() {
  let out;
  try {
    out = await api("/jobs/schedules");
  } catch (e) {
    if (e.status === 401) throw e;
    $("sch-table").hidden = true;
    $("sch-empty").hidden = false;
    setText($("sch-empty"), errorText(e));
    return;
  }
  const list = (out && out.schedules) || [];
  syncRows($("sch-body"), list, (sc) => String(sc.id), createScheduleRow, updateScheduleRow);
  $("sch-table").hidden = !list.length;
  $("sch-empty").hidden = list.length > 0;
  setText($("sch-empty"), "No schedules.");
}

const SCHEDULE_INPUTS = { name: "s-name", jarId: "s-jar", entryClass: "s-entry", parallelism: "s-parallelism",
  programArgsList: "s-args", cron: "s-cron", everySeconds: "s-every", overlap: "s-overlap", misfireGraceSeconds: "s-grace" };

function splitArgs(text) {
  // Shell-like: whitespace separates, single or double quotes keep spaces together.
  const out = [];
  const re = /"([^"]*)"|'([^']*)'|(\S+)/g;
  let m;
  while ((m = re.exec(text)) !== null) out.push(m[1] !== undefined ? m[1] : m[2] !== undefined ? m[2] : m[3]);
  return out;
}

async function createSchedule(ev) {
  ev.preventDefault();
  const form = $("sch-form");
  const msg = $("s-message");
  markInvalid(form, null);
  const body = {
    jarId: $("s-jar").value,
    entryClass: $("s-entry").value.trim() || "build",
    programArgsList: splitArgs($("s-args").value),
    parallelism: numberOf("s-parallelism") || 1,
    overlap: $("s-overlap").value,
    misfireGraceSeconds: numberOf("s-grace"),
    enabled: $("s-enabled").checked,
  };
  const name = $("s-name").value.trim();
  if (name) body.name = name;
  if ($("s-kind").value === "cron") body.cron = $("s-cron").value.trim();
  else body.everySeconds = numberOf("s-every");
  if (!body.jarId) {
    markInvalid(form, "jarId", SCHEDULE_INPUTS);
    say(msg, "Choose an uploaded pipeline (upload one on the Submit page).", "error");
    return;
  }
  $("s-submit").disabled = true;
  try {
    const res = await api("/jobs/schedules", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    say(msg, `Schedule ${res && res.id !== undefined ? res.id : ""} created.`, "ok");
    await refreshSchedules();
  } catch (e) {
    markInvalid(form, (e.body || {}).field, SCHEDULE_INPUTS);
    say(msg, errorText(e), "error");
  } finally {
    $("s-submit").disabled = false;
  }
}

/* ---------------------------------------------------------------- one schedule */

let shownSchedule = null;

export function openSchedule(id) {
  if (shownSchedule === id) return;
  shownSchedule = id;
  setText($("schd-name"), id);
  for (const k of ["schd-facts", "schd-history"]) { $(k).replaceChildren(); $(k).dataset.v = ""; }
}

export async function refreshSchedule() {
  const id = shownSchedule;
  if (id === null) return;
  let sc;
  try {
    sc = await api(`/jobs/schedules/${enc(id)}`);
  } catch (e) {
    if (e.status === 401) throw e;
    $("schd-error").hidden = false;
    setText($("schd-error"), errorText(e));
    return;
  }
  if (id !== shownSchedule) return;
  $("schd-error").hidden = true;
  setText($("schd-name"), sc.name || sc.id);
  replaceIfChanged($("schd-facts"), JSON.stringify(sc), () => [
    fact("ID", h("span", { class: "mono", text: String(sc.id) })),
    fact("When", scheduleWhen(sc)),
    fact("Pipeline", h("span", { class: "mono", text: dash(sc.jarId) })),
    fact("Entry", dash(sc.entryClass)),
    fact("Arguments", (sc.programArgs || []).length ? JSON.stringify(sc.programArgs) : "none"),
    fact("Parallelism", dash(sc.parallelism)),
    fact("Overlap", dash(sc.overlap)),
    fact("Misfire Grace", sc.misfireGraceSeconds !== undefined ? `${sc.misfireGraceSeconds} s` : "–"),
    fact("Enabled", sc.enabled ? "yes" : "paused"),
    fact("Next Fire", fmtWhen(sc.nextFire)),
    fact("Last Fire", fmtWhen(sc.lastFire)),
    fact("Runs", dash(sc.runs)),
  ]);
  const hist = [...(sc.history || [])].sort((a, b) => (toMillis(b.tick) || 0) - (toMillis(a.tick) || 0));
  replaceIfChanged($("schd-history"), JSON.stringify(hist), () => (hist.length ? hist.map((r) => h("tr", {},
    h("td", { text: fmtWhen(r.tick) }), h("td", { text: fmtWhen(r.time) }),
    h("td", { class: "mono" }, r.jobId ? link(jobHref(r.jobId), r.jobId) : "–"),
    h("td", { text: dash(r.outcome) }))) : h("tr", {}, h("td", { colspan: 4, class: "muted", text: "never fired" }))));
}

export function installSubmitPages() {
  $("submit-form").addEventListener("submit", submitJob);
  $("f-jar").addEventListener("change", showEntries);
  $("f-restart").addEventListener("change", showRestartFields);
  $("sch-form").addEventListener("submit", createSchedule);
  $("s-kind").addEventListener("change", () => {
    const cron = $("s-kind").value === "cron";
    $("s-cron-field").hidden = !cron;
    $("s-every-field").hidden = cron;
  });
  showRestartFields();
}
