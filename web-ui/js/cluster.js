/* Headrace dashboard: TaskManagers (#/taskmanagers, #/taskmanagers/<id>), the JobManager
 * (#/jobmanager) and the log viewer both use. */
import {
  $, h, setText, replaceIfChanged, syncRows, badge, fact, link, enc, jobHref, tmHref, fmtTime, toMillis, fmtWhen,
  fmtBytes, fmtAgo, fmtNumber, dash, session, api, errorText,
} from "./core.js";

/* ---------------------------------------------------------------- log viewer */

const LOG_TAILS = [[65536, "last 64 KB"], [262144, "last 256 KB"], [1048576, "last 1 MB"]];
const LOG_LIST_EVERY_MS = 5000;

/* A list of log files and the tail of the chosen one, followed while "follow" is ticked.
 * `listPath` answers {"logs": [{name, size, mtime}]}, `filePath(name)` the text; `singlePath`
 * (optional) is the one log a server without a list still serves. */
class LogViewer {
  constructor(container, { listPath, filePath, singlePath }) {
    this.listPath = listPath;
    this.filePath = filePath;
    this.singlePath = singlePath;
    this.files = null;
    this.listedAt = 0;
    this.current = null;
    this.loadedKey = null;
    this.select = h("select", { class: "log-file", "aria-label": "log file" });
    this.tail = h("select", { class: "log-tail", "aria-label": "how much of the log" },
      ...LOG_TAILS.map(([v, label]) => h("option", { value: v, text: label })));
    this.follow = h("input", { type: "checkbox", checked: true });
    this.status = h("span", { class: "muted log-status" });
    this.pre = h("pre", { class: "log", tabindex: "0" });
    this.select.addEventListener("change", () => { this.current = this.select.value; this.refresh(true); });
    this.tail.addEventListener("change", () => this.refresh(true));
    const reload = h("button", { type: "button", class: "action small", text: "Reload" });
    reload.addEventListener("click", () => { this.listedAt = 0; this.refresh(true); });
    container.replaceChildren(
      h("div", { class: "log-toolbar" }, this.select, this.tail,
        h("label", { class: "check" }, this.follow, " follow"), reload, this.status),
      this.pre);
  }

  async list() {
    if (this.files !== null && Date.now() - this.listedAt < LOG_LIST_EVERY_MS) return;
    this.listedAt = Date.now();
    try {
      const out = await api(this.listPath);
      // The service's own log first, then its Spark drivers' logs, newest first.
      const driver = (f) => (/^driver-/.test(f.name) ? 1 : 0);
      this.files = ((out && out.logs) || []).slice()
        .sort((a, b) => driver(a) - driver(b) || (toMillis(b.mtime) || 0) - (toMillis(a.mtime) || 0));
    } catch (e) {
      if (!e.missingEndpoint || !this.singlePath) throw e;
      this.files = [{ name: "", label: "log" }]; // an older server: only the one log
    }
    const key = JSON.stringify(this.files.map((f) => [f.name, f.size]));
    if (this.select.dataset.v !== key) {
      this.select.dataset.v = key;
      this.select.replaceChildren(...this.files.map((f) => h("option", {
        value: f.name,
        text: f.label || `${f.name}${f.size !== undefined ? ` (${fmtBytes(f.size)}${f.mtime ? `, ${fmtWhen(f.mtime)}` : ""})` : ""}`,
      })));
    }
    if (this.current === null || !this.files.some((f) => f.name === this.current)) {
      this.current = this.files.length ? this.files[0].name : null;
    }
    this.select.value = this.current === null ? "" : this.current;
    this.select.hidden = this.files.length < 2 && !this.files.some((f) => f.name);
  }

  async refresh(force) {
    // Refused (a role without log access) or absent: not asked again each second, only on Reload.
    if (this.refused === session.token() && !force) return;
    this.refused = undefined;
    try {
      await this.list();
    } catch (e) {
      if (e.status === 403 || e.missingEndpoint) this.refused = session.token();
      this.showError(e);
      return;
    }
    if (this.current === null) {
      setText(this.status, "");
      setText(this.pre, "No log files.");
      return;
    }
    if (!force && !this.follow.checked && this.loadedKey) return;
    const tail = this.tail.value;
    const path = this.current === "" ? this.singlePath : `${this.filePath(this.current)}?tail=${tail}`;
    try {
      const text = await api(path, { as: "text" });
      const atBottom = this.pre.scrollTop + this.pre.clientHeight >= this.pre.scrollHeight - 20;
      if (this.pre.textContent !== text) {
        this.pre.textContent = text; // a log is text, never markup
        if (atBottom || force) this.pre.scrollTop = this.pre.scrollHeight;
      }
      this.loadedKey = `${this.current}/${tail}`;
      setText(this.status, `${fmtBytes(text.length)} shown · ${new Date().toLocaleTimeString()}`);
    } catch (e) {
      if (e.status === 403 || e.missingEndpoint) this.refused = session.token();
      this.showError(e);
    }
  }

  showError(e) {
    setText(this.status, "");
    this.pre.textContent = errorText(e, "The log could not be read");
    this.loadedKey = null;
  }
}

/* ---------------------------------------------------------------- TaskManager list */

function createTmRow(tm) {
  const tr = h("tr", { class: "clickable" },
    h("td", { class: "mono" }, h("a", { href: tmHref(tm.id), text: tm.id })), h("td"),
    h("td", {}, h("div", { class: "slots" },
      h("div", { class: "slotbar" }, h("div", { class: "slotbar-used" })), h("span"))),
    h("td"), h("td"), h("td"), h("td", { class: "tm-state" }));
  tr.addEventListener("click", (ev) => { if (!ev.target.closest("a")) window.location.hash = tmHref(tm.id); });
  return tr;
}

function slotBar(bar, total, free) {
  bar.style.width = total ? `${(100 * (total - free)) / total}%` : "0";
  bar.classList.toggle("full", total > 0 && free === 0);
}

/* LOST with when and why (the ResourceManager's verdict), or registered. */
function tmState(tm) {
  if (tm.state !== "LOST") return h("span", { class: "muted", text: "registered" });
  const at = tm["last-lost-at"];
  return h("span", {}, badge("LOST"), ` ${at ? fmtAgo(at) : ""}`,
    tm["lost-reason"] ? h("div", { class: "lost-reason", text: tm["lost-reason"] }) : null);
}

function updateTmRow(tr, tm) {
  const c = tr.children;
  const lost = tm.state === "LOST";
  tr.classList.toggle("tm-lost", lost);
  setText(c[1], tm.host || "");
  slotBar(c[2].querySelector(".slotbar-used"), tm.slotsNumber, lost ? tm.slotsNumber : tm.freeSlots);
  setText(c[2].querySelector("span"), lost ? `${tm.slotsNumber} lost` : `${tm.freeSlots} / ${tm.slotsNumber} free`);
  setText(c[3], tm.hardware ? tm.hardware.cpuCores : "–");
  setText(c[4], fmtBytes(tm.hardware ? tm.hardware.physicalMemory : null));
  setText(c[5], fmtAgo(tm.timeSinceLastHeartbeat));
  // Rebuilt each second while lost: "lost 12s ago" goes on counting.
  replaceIfChanged(c[6], JSON.stringify([tm.state, tm["last-lost-at"], tm["lost-reason"], lost ? Date.now() / 1000 | 0 : 0]),
    () => tmState(tm));
}

/* Registered TaskManagers, and lost ones until they register again: a TaskManager that vanished
 * from the list would hide the cause of the failovers it set off. */
export async function refreshTaskManagers() {
  const { taskmanagers } = await api("/taskmanagers?include=lost");
  const order = (tm) => (tm.state === "LOST" ? 1 : 0);
  const shown = [...taskmanagers].sort((a, b) => order(a) - order(b) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  syncRows($("tm-body"), shown, (t) => t.id, createTmRow, updateTmRow);
  $("tm-empty").hidden = shown.length > 0;
  $("tm-table").hidden = shown.length === 0;
}

/* ---------------------------------------------------------------- one TaskManager */

let shownTm = null;
let tmLogs = null;

export function openTaskManager(id) {
  if (shownTm === id) return;
  shownTm = id;
  setText($("tmd-id"), id);
  setText($("tmd-state"), "");
  for (const k of ["tmd-facts", "tmd-resources", "tmd-slots"]) { $(k).replaceChildren(); $(k).dataset.v = ""; }
  const base = `/taskmanagers/${enc(id)}`;
  tmLogs = new LogViewer($("tmd-logs"), {
    listPath: `${base}/logs`, filePath: (name) => `${base}/logs/${enc(name)}`, singlePath: `${base}/log`,
  });
  tmLogs.refresh(true);
}

export function closeTaskManager() {
  shownTm = null;
  tmLogs = null;
}

/* A task's memory as its TaskManager measures it for its limit: "1.2 GB of 3.0 GB (PSS)". Shown on
   the first slot its task holds; a task of parallelism 2 holds two. */
function taskMemory(a, first) {
  const m = a.memory;
  if (!a.execution_id) return "";
  if (!first) return "same task";
  if (!m) return "–";
  const limit = m.limit === null || m.limit === undefined ? "no limit" : `of ${fmtBytes(m.limit)}`;
  return `${fmtBytes(m.used)} ${limit} (${m.measure})`;
}

function resourceRows(tm) {
  const total = tm.totalResource || {};
  const free = tm.freeResource || {};
  const hw = tm.hardware || {};
  const row = (label, a, b) => h("tr", {}, h("th", { scope: "row", text: label }), h("td", { text: a }), h("td", { class: "muted", text: b || "" }));
  return [
    row("CPU cores", dash(hw.cpuCores), total.cpuCores !== undefined ? `${free.cpuCores} free of ${total.cpuCores}` : ""),
    row("Physical memory", fmtBytes(hw.physicalMemory), hw.freeMemory !== undefined ? `${fmtBytes(hw.freeMemory)} not allocated to slots` : ""),
    row("Task heap", total.taskHeapMemory !== undefined ? `${fmtNumber(total.taskHeapMemory)} MB` : "–",
      free.taskHeapMemory !== undefined ? `${fmtNumber(free.taskHeapMemory)} MB free` : ""),
    row("Total process memory", fmtBytes((tm.memoryConfiguration || {}).totalProcessMemory)),
  ];
}

export async function refreshTaskManager() {
  const id = shownTm;
  if (!id) return;
  const logs = tmLogs;
  let tm;
  try {
    tm = await api(`/taskmanagers/${enc(id)}`);
  } catch (e) {
    if (id !== shownTm) return;
    $("tmd-error").hidden = false;
    setText($("tmd-error"), errorText(e));
    if (e.status !== 404) throw e;
    return;
  }
  if (id !== shownTm) return;
  $("tmd-error").hidden = true;
  const st = $("tmd-state");
  st.className = `badge state-${tm.state || "RUNNING"}`;
  setText(st, tm.state || "");
  replaceIfChanged($("tmd-facts"), JSON.stringify([tm.host, tm.path, tm.registered, tm["lost-reason"], tm["last-lost-at"], tm.slotsNumber, tm.freeSlots,
    Math.round((Date.now() - tm.timeSinceLastHeartbeat) / 1000)]), () => [
    fact("Host", dash(tm.host)),
    fact("Queue", h("span", { class: "mono", text: dash(tm.path) })),
    fact("Registered", fmtTime(tm.registered)),
    fact("Last Heartbeat", fmtAgo(tm.timeSinceLastHeartbeat)),
    fact("Slots", `${tm.freeSlots} free of ${tm.slotsNumber}`),
    tm["lost-reason"] ? fact("Lost Because", tm["lost-reason"]) : null,
    // Kept after it registered again: a supervisor restarts a killed TaskManager within seconds.
    tm["last-lost-at"] ? fact("Last Lost", `${fmtTime(tm["last-lost-at"])}: ${tm["last-lost-reason"] || ""}`) : null,
  ].filter(Boolean));
  replaceIfChanged($("tmd-resources"), JSON.stringify([tm.hardware, tm.totalResource, tm.freeResource]), () => resourceRows(tm));
  const allocated = new Map((tm.allocatedSlots || []).map((a) => [a.index, a]));
  const slots = Array.from({ length: tm.slotsNumber || 0 }, (_, i) => allocated.get(i) || { index: i });
  for (const a of tm.allocatedSlots || []) if (!(a.index >= 0 && a.index < slots.length)) slots.push(a);
  const seen = new Set();
  const slotRow = (a) => {
    const first = !seen.has(a.execution_id);
    seen.add(a.execution_id);
    return h("tr", {},
      h("td", { text: dash(a.index) }),
      h("td", { class: "mono", text: a.allocation_id || "free" }),
      h("td", { class: "mono" }, a.job_id ? link(jobHref(a.job_id), a.job_id) : "–"),
      h("td", { class: "mono" }, a.job_id && a.execution_id ? link(jobHref(a.job_id, "attempts"), a.execution_id) : dash(a.execution_id)),
      h("td", { class: "task-memory", text: taskMemory(a, first) }));
  };
  replaceIfChanged($("tmd-slots"), JSON.stringify(slots), () => (slots.length ? slots.map(slotRow)
    : h("tr", {}, h("td", { colspan: 5, class: "muted", text: "no slots" }))));
  if (logs === tmLogs && logs) await logs.refresh(false);
}

/* ---------------------------------------------------------------- JobManager */

let jmLogs = null;
let jmConfigAt = 0;

export function openJobManager() {
  if (!jmLogs) {
    jmLogs = new LogViewer($("jm-logs"), {
      listPath: "/jobmanager/logs", filePath: (name) => `/jobmanager/logs/${enc(name)}`,
    });
  }
  jmConfigAt = 0;
  jmLogs.refresh(true);
}

function renderLeader(info, fromOverview) {
  const leader = info.leader;
  const note = $("jm-leader-note");
  note.hidden = !!leader && !fromOverview;
  setText(note, !leader ? "No JobManager leads: submissions wait until one is elected."
    : "The leader as /overview reports it; this server has no /jobmanager/leader (contenders unknown).");
  replaceIfChanged($("jm-leader"), JSON.stringify(info), () => (leader ? [
    fact("Leader", h("span", { class: "mono", text: dash(leader.id) })),
    fact("Epoch", dash(leader.epoch !== undefined ? leader.epoch : info.epoch)),
    fact("Mode", leader.mode === "zookeeper" ? "ZooKeeper HA" : leader.mode === "none" ? "standalone (no HA)" : dash(leader.mode)),
    fact("Leading Since", fmtWhen(leader.since)),
    fact("Address", dash(leader.address)),
    fact("Highest Epoch", dash(info.epoch)),
  ] : [fact("Highest Epoch", dash(info.epoch))]));
  const contenders = info.contenders || [];
  replaceIfChanged($("jm-contenders"), JSON.stringify([contenders, leader && leader.id]), () => (contenders.length
    ? contenders.map((c) => h("li", { class: "mono" }, String(c), leader && c === leader.id ? h("span", { class: "tag", text: "leader" }) : null))
    : h("li", { class: "muted", text: fromOverview ? "unknown" : "none" })));
}

function renderJmConfig(entries) {
  const filter = $("jm-config-filter").value.trim().toLowerCase();
  const list = (Array.isArray(entries) ? entries : Object.entries(entries || {}).map(([key, value]) => ({ key, value })))
    .filter((e) => !filter || String(e.key).toLowerCase().includes(filter))
    .sort((a, b) => (a.key < b.key ? -1 : 1));
  $("jm-config-note").hidden = list.length > 0;
  setText($("jm-config-note"), "No setting matches.");
  replaceIfChanged($("jm-config"), JSON.stringify(list), () => list.map((e) => h("tr", {},
    h("th", { scope: "row", class: "mono", text: e.key }),
    h("td", { class: "mono path", text: e.value === null || e.value === undefined || e.value === "" ? "–" : typeof e.value === "object" ? JSON.stringify(e.value) : String(e.value) }))));
}

let jmConfig = null;

export async function refreshJobManager(overview) {
  try {
    renderLeader(await api("/jobmanager/leader"), false);
  } catch (e) {
    if (!e.missingEndpoint) throw e;
    const jm = overview && overview.jobmanager;
    renderLeader({ leader: jm || null, epoch: jm ? jm.epoch : null, contenders: jm ? [jm.id] : [] }, true);
  }
  if (Date.now() - jmConfigAt > 10000) {
    jmConfigAt = Date.now();
    try {
      jmConfig = await api("/jobmanager/config");
      renderJmConfig(jmConfig);
    } catch (e) {
      $("jm-config").replaceChildren();
      $("jm-config").dataset.v = "";
      $("jm-config-note").hidden = false;
      setText($("jm-config-note"), errorText(e));
    }
  }
  if (jmLogs) await jmLogs.refresh(false);
}

export function installClusterPages() {
  $("jm-config-filter").addEventListener("input", () => { if (jmConfig) renderJmConfig(jmConfig); });
}
