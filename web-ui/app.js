/* Headrace dashboard: the hash router and the 1-second poll. Pages live in index.html as
 * <section class="page">; the router shows one, and each poll refreshes only what it shows,
 * in place (no page reloads). The pieces are ES modules in js/: core (elements, REST client,
 * sign-in), jobs, checkpoints, metrics, cluster (TaskManagers, JobManager, logs), submit (submit,
 * schedules), deployments and autoscaler. Each keeps its names to itself and imports what it uses
 * from the others: two pages' scripts once both defined a global renderHistory, and the one
 * loaded last drew every page's history. */
import { REFRESH_MS, $, setText, api, errorText, Auth } from "./js/core.js";
import {
  renderClusterOverview, renderLeaderBadge, renderOverviewJobs, renderJobList, openJob, closeJob,
  refreshJobPage, installJobPage,
} from "./js/jobs.js";
import { pollOperations } from "./js/checkpoints.js";
import {
  refreshTaskManagers, openTaskManager, closeTaskManager, refreshTaskManager, openJobManager,
  refreshJobManager, installClusterPages,
} from "./js/cluster.js";
import { loadJars, refreshSchedules, openSchedule, refreshSchedule, installSubmitPages } from "./js/submit.js";
import { refreshDeployments, openDeployment, refreshDeployment, installDeploymentPages } from "./js/deployments.js";

const TITLES = {
  overview: "Overview", jobs: "Jobs", job: "Job", taskmanagers: "Task Managers", taskmanager: "Task Manager",
  jobmanager: "Job Manager", submit: "Submit New Job", schedules: "Schedules", schedule: "Schedule",
  deployments: "Deployments", deployment: "Deployment", notfound: "Not Found",
};

// Links of the one-page dashboard this replaced (#jobs, #job/<id>/checkpoints) still work.
const LEGACY = /^#(overview|jobs|taskmanagers|submit)$|^#job\/([^/]+)(?:\/(checkpoints))?$/;

let route = { page: "overview", id: null, tab: null };

function parseRoute(hash) {
  const legacy = LEGACY.exec(hash);
  if (legacy) return legacy[1] ? { page: legacy[1] } : { page: "job", id: decodeURIComponent(legacy[2]), tab: legacy[3] || null };
  const parts = hash.replace(/^#\/?/, "").split("/").filter((p) => p !== "").map((p) => {
    try { return decodeURIComponent(p); } catch (_) { return p; }
  });
  const [top, id, tab] = parts;
  if (!top || top === "overview") return { page: "overview" };
  if (top === "jobs") return id ? { page: "job", id, tab: tab || null } : { page: "jobs" };
  if (top === "taskmanagers") return id ? { page: "taskmanager", id } : { page: "taskmanagers" };
  if (top === "schedules") return id ? { page: "schedule", id } : { page: "schedules" };
  if (top === "deployments") return id ? { page: "deployment", id } : { page: "deployments" };
  if (["jobmanager", "submit"].includes(top) && !id) return { page: top };
  return { page: "notfound" };
}

function navigate() {
  const next = parseRoute(window.location.hash);
  if (route.page === "job" && next.page !== "job") closeJob();
  if (route.page === "taskmanager" && next.page !== "taskmanager") closeTaskManager();
  route = next;
  for (const sec of document.querySelectorAll("main > .page")) sec.hidden = sec.dataset.page !== route.page;
  const navKey = { job: "jobs", taskmanager: "taskmanagers", schedule: "schedules", deployment: "deployments" }[route.page]
    || route.page;
  for (const a of document.querySelectorAll("#nav a[data-route]")) a.classList.toggle("active", a.dataset.route === navKey);
  setText($("page-title"), TITLES[route.page]);
  document.title = `${TITLES[route.page]} · Headrace`;
  if (route.page === "job") openJob(route.id, route.tab);
  else if (route.page === "taskmanager") openTaskManager(route.id);
  else if (route.page === "jobmanager") openJobManager();
  else if (route.page === "schedule") openSchedule(route.id);
  else if (route.page === "deployment") openDeployment(route.id);
  else if (route.page === "submit" || route.page === "schedules") loadJars();
  refresh(true);
}

async function refreshPage(overview) {
  switch (route.page) {
    case "overview":
      renderClusterOverview(overview);
      renderOverviewJobs((await api("/jobs/overview")).jobs);
      break;
    case "jobs":
      renderJobList((await api("/jobs/overview")).jobs);
      break;
    case "job":
      await Promise.all([refreshJobPage(), pollOperations()]);
      break;
    case "taskmanagers":
      await refreshTaskManagers();
      break;
    case "taskmanager":
      await refreshTaskManager();
      break;
    case "jobmanager":
      await refreshJobManager(overview);
      break;
    case "schedules":
      await refreshSchedules();
      break;
    case "schedule":
      await refreshSchedule();
      break;
    case "deployments":
      await refreshDeployments();
      break;
    case "deployment":
      await refreshDeployment();
      break;
    default:
      break;
  }
}

let inFlight = false;
let again = false;
// A dispatcher that accepts connections but does not answer (stopped, stuck) must not go on
// looking live: a poll unanswered for SILENT_AFTER_MS turns the status red at once, counting the
// seconds since the last answer, and the request's own limit (READ_TIMEOUT_MS) gives it up so
// that the next poll starts.
const SILENT_AFTER_MS = 3000;
let pollStarted = 0;          // when the poll in flight started
let lastAnswer = Date.now();  // when the dispatcher last answered a whole poll
let silent = false;           // the last poll ended without an answer

function showSilence() {
  if (!silent && !(inFlight && Date.now() - pollStarted > SILENT_AFTER_MS)) return;
  const conn = $("conn");
  conn.className = "conn down";
  setText(conn, `no answer from the dispatcher for ${Math.round((Date.now() - lastAnswer) / 1000)} s`);
  $("leader").classList.remove("live"); // who leads now is not known either
}

async function refresh(now) {
  if (inFlight) { again = again || !!now; return; }
  inFlight = true;
  pollStarted = Date.now();
  const conn = $("conn");
  try {
    const overview = await api("/overview");
    renderLeaderBadge(overview);
    await refreshPage(overview);
    silent = false;
    lastAnswer = Date.now();
    conn.className = "conn live";
    setText(conn, `live · updated ${new Date().toLocaleTimeString()}`);
  } catch (e) {
    silent = !!e.timedOut;
    if (silent) showSilence();
    else {
      conn.className = "conn down";
      setText(conn, e.status === 401 ? "sign in to see the cluster" : `disconnected: ${errorText(e)}`);
    }
  } finally {
    inFlight = false;
    if (again) { again = false; refresh(); }
  }
}

/* What runs beside the cluster: a Spark standalone master gets a link to its own web UI, and a
   Kafka broker's address (what pipelines get as ctx.kafka_bootstrap_servers) is on the overview. */
async function showClusterServices() {
  try {
    const cfg = await api("/config");
    const link = $("spark-master-link");
    if (cfg["spark-master-ui"]) {
      link.href = cfg["spark-master-ui"];
      link.title = `executors run on ${cfg["spark-master"]}`;
      link.hidden = false;
    }
    if (cfg["kafka-bootstrap-servers"]) {
      setText($("kafka-bootstrap"), cfg["kafka-bootstrap-servers"]);
      $("kafka-foot").hidden = false;
    }
  } catch (e) { /* an older dispatcher: neither */ }
}

document.addEventListener("DOMContentLoaded", () => {
  Auth.install(() => refresh(true));
  showClusterServices();
  installJobPage();
  installClusterPages();
  installSubmitPages();
  installDeploymentPages();
  window.addEventListener("hashchange", navigate);
  if (!window.location.hash) window.history.replaceState(null, "", "#/overview");
  navigate();
  window.setInterval(() => { showSilence(); refresh(); }, REFRESH_MS);
});
