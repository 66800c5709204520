/* The deployment page's autoscaler panel: its evaluations over time (GET
 * /deployments/{name}/autoscaler), drawn with the Metrics tab's charts (metrics.js): the
 * parallelism, what arrives, what the task can process, its lag and busy time, and the decisions
 * that were not "wait" or "keep", newest first. Hidden unless the deployment enables it. */
import { $, h, setText, syncRows, enc, fmtWhen, fmtNumber, api } from "./core.js";
import { chart } from "./metrics.js";
import { shownDeployment } from "./deployments.js";

const AUTOSCALER_CHARTS = [
  ["parallelism", "Parallelism", (v) => fmtNumber(v, 0)],
  ["arrivalRate", "Arriving rows/s", (v) => fmtNumber(v, 1)],
  ["capacity", "Capacity rows/s", (v) => fmtNumber(v, 1)],
  ["lag", "Source lag", (v) => fmtNumber(v, 0)],
  ["busy", "Busy (time in batches)", (v) => fmtNumber(v, 2)],
];

/* Chart samples from evaluations: one per evaluation, its figures plus the parallelism. A pure
 * function of its argument. */
function autoscalerSamples(evaluations) {
  return (evaluations || []).map((e) => ({ t: e.at, parallelism: e.parallelism, ...(e.figures || {}) }));
}

function decisions(evaluations) {
  return (evaluations || []).filter((e) => e.outcome !== "wait" && e.outcome !== "keep").reverse();
}

export async function refreshAutoscaler(name, detail) {
  const panel = $("depd-autoscaler");
  const status = (detail && detail.status) || {};
  if (!status.autoscaler) {
    panel.hidden = true;
    return;
  }
  let a;
  try {
    a = await api(`/deployments/${enc(name)}/autoscaler?limit=720`);
  } catch (e) {
    if (e.status === 401) throw e;
    return; // the next refresh tries again; the rest of the page stands
  }
  if (name !== shownDeployment) return;
  panel.hidden = false;
  const last = (status.autoscaler || {}).lastEvaluation;
  setText($("depd-autoscaler-note"), status.autoscaler.heldOff ? `holding off: ${status.autoscaler.heldOff}`
    : last ? `last: ${last.outcome}, ${last.reason}` : "no evaluation yet");
  const samples = autoscalerSamples(a.evaluations);
  $("depd-autoscaler-charts").replaceChildren(...AUTOSCALER_CHARTS.map(([f, label, fmt]) => chart(label, samples, f, fmt)));
  syncRows($("depd-decisions"), decisions(a.evaluations), (e) => String(e.at),
    () => h("tr", {}, h("td"), h("td"), h("td"), h("td")),
    (tr, e) => {
      const c = tr.children;
      setText(c[0], fmtWhen(e.at));
      setText(c[1], e.outcome);
      setText(c[2], `${e.parallelism} → ${e.proposed}`);
      setText(c[3], e.reason);
    });
}

// What a test (or the console) may call: Autoscaler.autoscalerSamples(evaluations).
window.Autoscaler = Object.freeze({ autoscalerSamples, decisions });
