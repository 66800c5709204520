/* Headrace dashboard, shared pieces: the element builder, the REST client with sign-in, and the
 * formatters. Every value from the server is written with textContent or as an attribute
 * value, never parsed as HTML; the page's Content-Security-Policy (script-src 'self';
 * style-src 'self') also forbids inline scripts and style attributes, so styles come from
 * classes, and sizes from element.style (CSSOM, which the policy allows). */
export const REFRESH_MS = 1000;
export const TERMINAL = new Set(["FINISHED", "FAILED", "CANCELED"]);
const TASK_STATES = ["created", "scheduled", "deploying", "initializing", "running", "finished",
  "canceling", "canceled", "failed", "reconciling"];

export const $ = (id) => document.getElementById(id);

/* ---------------------------------------------------------------- elements */

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  return fill(el, attrs, children);
}

const SVG_NS = "http://www.w3.org/2000/svg";

export function s(tag, attrs, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), attrs, children);
}

function fill(el, attrs, children) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "style") throw new Error("inline styles are refused by the CSP: use a class");
    if (k === "class") el.setAttribute("class", v);
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function setText(el, value) {
  const v = value === null || value === undefined ? "" : String(value);
  if (el.textContent !== v) el.textContent = v;
}

/* Replace an element's children only when `key` (what they were built from) changed, so the
 * 1-second refresh does not rebuild (and lose the selection or scroll of) an unchanged block. */
export function replaceIfChanged(el, key, build) {
  if (el.dataset.v === key) return false;
  el.dataset.v = key;
  const out = build();
  el.replaceChildren(...(Array.isArray(out) ? out : [out]).filter((c) => c !== null && c !== undefined));
  return true;
}

/* Keyed table rows: a row is created once per id and updated in place, so a button is never
 * replaced between mousedown and click by the 1-second refresh. */
export function syncRows(tbody, items, key, create, update) {
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

export function badge(state) {
  return h("span", { class: `badge state-${state}`, text: state });
}

export function fact(label, value) {
  return h("div", {}, h("dt", { text: label }), value instanceof Node ? h("dd", {}, value) : h("dd", { text: value }));
}

export function link(href, text, attrs) {
  return h("a", { href, text, ...(attrs || {}) });
}

export const enc = encodeURIComponent;
export const jobHref = (jid, tab) => `#/jobs/${enc(jid)}${tab ? `/${tab}` : ""}`;
export const tmHref = (id) => `#/taskmanagers/${enc(id)}`;
export const deploymentHref = (name) => `#/deployments/${enc(name)}`;

/* ---------------------------------------------------------------- formatting */

const pad = (n) => String(n).padStart(2, "0");

export function fmtTime(ms) {
  if (!ms || ms < 0) return "–";
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/* The time of day alone, for a chart's time axis. */
export function fmtClock(ms) {
  const d = new Date(ms);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/* Times that arrive as ISO strings (schedules, log files) or epoch seconds/milliseconds. */
export function toMillis(v) {
  if (v === null || v === undefined || v === "") return null;
  if (typeof v === "number") return v < 1e11 ? v * 1000 : v;
  const t = Date.parse(v);
  return Number.isNaN(t) ? null : t;
}

export function fmtWhen(v) {
  const ms = toMillis(v);
  return ms === null ? (v ? String(v) : "–") : fmtTime(ms);
}

export function fmtDuration(ms) {
  if (ms === null || ms === undefined || ms < 0) return "–";
  if (ms < 1000) return `${ms}ms`;
  let sec = Math.floor(ms / 1000);
  const d = Math.floor(sec / 86400); sec %= 86400;
  const hh = Math.floor(sec / 3600); sec %= 3600;
  const m = Math.floor(sec / 60); sec %= 60;
  const parts = [];
  if (d) parts.push(`${d}d`);
  if (hh) parts.push(`${hh}h`);
  if (m) parts.push(`${m}m`);
  if (sec || !parts.length) parts.push(`${sec}s`);
  return parts.slice(0, 3).join(" ");
}

export function fmtBytes(n) {
  if (!n && n !== 0) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

/* Checkpoint timings are often under a few seconds, where fmtDuration's whole seconds say little. */
export function fmtMillis(ms) {
  if (ms === null || ms === undefined || ms < 0) return "–";
  if (ms < 1000) return `${Math.round(ms)}ms`;
  if (ms < 60000) return `${Number((ms / 1000).toFixed(ms < 10000 ? 2 : 1))}s`;
  return fmtDuration(ms);
}

export function fmtAgo(ms) {
  if (!ms || ms < 0) return "–";
  const sec = Math.max(0, Math.round((Date.now() - ms) / 1000));
  return sec < 1 ? "just now" : `${fmtDuration(sec * 1000)} ago`;
}

export function fmtNumber(v, digits) {
  if (v === null || v === undefined || Number.isNaN(Number(v))) return "–";
  const n = Number(v);
  return digits === undefined ? n.toLocaleString() : n.toLocaleString(undefined, { maximumFractionDigits: digits });
}

export const dash = (v) => (v === null || v === undefined || v === "" ? "–" : v);

/* ---------------------------------------------------------------- REST client and sign-in */

class ApiError extends Error {
  constructor(status, body) {
    const errors = (body && body.errors) || [`HTTP ${status}`];
    super(errors.map((e) => (typeof e === "string" ? e : JSON.stringify(e))).join("; "));
    this.status = status;
    this.body = body || {};
  }

  /* A 404 from a route the server does not have (an older dispatcher), not a missing job:
   * the project's 404s for unknown resources name the field that was not found. */
  get missingEndpoint() { return this.status === 404 && !this.body.field; }

  get forbidden() { return this.status === 403; }

  /* No answer within the request's time limit: the dispatcher is hung, or too busy to answer. */
  get timedOut() { return this.status === 0 && !!this.body.timedOut; }
}

/* How long a request may go unanswered before it is given up. A dispatcher that accepts
 * connections but never answers (stopped, or stuck) would otherwise hold the poll forever, and
 * the page would go on saying "live". Reads are small; a submission waits for the restore check
 * (up to 120 s on the dispatcher's side). */
export const READ_TIMEOUT_MS = 10000;
const WRITE_TIMEOUT_MS = 180000;

/* With auth on (docs/runbooks/auth.md) every API call needs a bearer token. It is kept in
 * sessionStorage (this tab only, gone when it closes); a 401 opens the sign-in dialog, and
 * polls wait for it rather than asking again. */
const TOKEN_KEY = "headrace.token";
const ROLE_KEY = "headrace.role";
export const session = {
  token: () => sessionStorage.getItem(TOKEN_KEY),
  role: () => sessionStorage.getItem(ROLE_KEY),
  authRequired: false,
};

function roleFromMessage(text) {
  const m = /this token has role (\w+)/.exec(text || "");
  return m ? m[1] : null;
}

export async function api(path, options = {}) {
  const { as, timeoutMs, ...init } = options;
  const token = session.token();
  const headers = { Accept: as === "text" ? "text/plain, application/json" : "application/json", ...(init.headers || {}) };
  if (token) headers.Authorization = `Bearer ${token}`;
  const limit = timeoutMs || ((init.method || "GET").toUpperCase() === "GET" ? READ_TIMEOUT_MS : WRITE_TIMEOUT_MS);
  const abort = new AbortController();
  const timer = window.setTimeout(() => abort.abort(), limit);
  let res;
  let text;
  try {
    res = await fetch(path, { ...init, headers, signal: abort.signal });
    text = await res.text(); // the body too: a dispatcher may stop half-way through an answer
  } catch (e) {
    if (abort.signal.aborted) {
      throw new ApiError(0, { errors: [`no answer from the dispatcher within ${limit / 1000} s`], timedOut: true });
    }
    throw new ApiError(0, { errors: [`the dispatcher is unreachable (${e.message})`] });
  } finally {
    window.clearTimeout(timer);
  }
  if (res.ok && as === "text") return text;
  let body = null;
  if (text) {
    try { body = JSON.parse(text); } catch (_) { body = { errors: [text.slice(0, 300)] }; }
  }
  if (!res.ok) {
    const err = new ApiError(res.status, body);
    // A 401 to a request sent before a sign-in says nothing of the new token: it must not reopen
    // the dialog the sign-in has just closed.
    if (res.status === 401 && session.token() === token) {
      session.authRequired = true;
      if (token) signOut(false);
      Auth.ask(token ? "The token was refused: it is unknown or has been revoked." : "This dispatcher requires a token.");
    } else if (res.status === 403) {
      const role = roleFromMessage(err.message);
      if (role && token && session.token() === token) Auth.setRole(role);
    }
    throw err;
  }
  return body;
}

function signOut(reload) {
  sessionStorage.removeItem(TOKEN_KEY);
  sessionStorage.removeItem(ROLE_KEY);
  Auth.render();
  if (reload) Auth.ask("Signed out.", true);
}

/* A readable sentence for an error shown in place of what could not be done or read. */
export function errorText(e, what) {
  if (!(e instanceof ApiError)) return `${what ? `${what}: ` : ""}${e && e.message ? e.message : e}`;
  if (e.status === 403) {
    const role = roleFromMessage(e.message) || session.role() || "unknown";
    const need = /needs role (\w+)/.exec(e.message);
    return `Your token's role ${role} cannot do this${need ? ` (it needs ${need[1]})` : ""}.`;
  }
  if (e.status === 401) return "Sign in to see this.";
  if (e.missingEndpoint) return "Not available on this server.";
  const b = e.body || {};
  return `${what ? `${what}: ` : ""}${e.message}${b.hint ? ` — ${b.hint}` : ""}`;
}

export const Auth = {
  dismissed: false,

  setRole(role) {
    sessionStorage.setItem(ROLE_KEY, role);
    this.render();
  },

  render() {
    const token = session.token();
    const role = session.role();
    setText($("auth-state"), token ? `signed in${role ? ` · ${role}` : ""}` : session.authRequired ? "not signed in" : "");
    $("auth-signin").hidden = !!token || !session.authRequired; // with auth off there is nothing to sign in to
    $("auth-signout").hidden = !token;
    document.body.dataset.role = role || "";
  },

  /* `explicit`: the user asked (the Sign in button); otherwise a 401 did, and after "Not now"
   * the polls' 401s do not reopen the dialog every second. */
  ask(reason, explicit) {
    this.render();
    if (explicit) this.dismissed = false;
    if (this.dismissed) return;
    const dlg = $("signin");
    setText($("signin-reason"), reason || "");
    if (!dlg.open) {
      $("signin-token").value = "";
      setText($("signin-message"), "");
      dlg.showModal();
    }
  },

  /* Checks the token and learns its role from GET /auth/whoami. */
  async signIn(token) {
    const headers = { Accept: "application/json", Authorization: `Bearer ${token}` };
    let who;
    try {
      who = await fetch("/auth/whoami", { headers, signal: AbortSignal.timeout(READ_TIMEOUT_MS) });
    } catch (e) {
      throw new Error(e.name === "TimeoutError" ? `No answer from the dispatcher within ${READ_TIMEOUT_MS / 1000} s.`
        : `The dispatcher is unreachable (${e.message}).`);
    }
    if (who.status === 401) throw new Error("This token is unknown or revoked.");
    if (!who.ok) throw new Error(`The dispatcher answered HTTP ${who.status}.`);
    const body = await who.json().catch(() => ({}));
    const role = (body && body.role) || "viewer";
    sessionStorage.setItem(TOKEN_KEY, token);
    sessionStorage.setItem(ROLE_KEY, role);
    this.render();
    return role;
  },

  /* `onSignedIn`: what to do once a token is accepted (the dashboard polls at once). */
  install(onSignedIn) {
    const form = $("signin-form");
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const token = $("signin-token").value.trim();
      if (!token) { setText($("signin-message"), "Paste a token."); return; }
      $("signin-submit").disabled = true;
      setText($("signin-message"), "Checking…");
      try {
        const role = await this.signIn(token);
        setText($("signin-message"), `Signed in with role ${role}.`);
        $("signin").close();
        if (onSignedIn) onSignedIn();
      } catch (e) {
        setText($("signin-message"), e.message);
      } finally {
        $("signin-submit").disabled = false;
      }
    });
    $("signin-cancel").addEventListener("click", () => { this.dismissed = true; $("signin").close(); });
    $("signin").addEventListener("cancel", () => { this.dismissed = true; }); // Escape
    $("auth-signin").addEventListener("click", () => this.ask("", true));
    $("auth-signout").addEventListener("click", () => signOut(true));
    this.render();
  },
};

/* ---------------------------------------------------------------- small shared widgets */

export function taskBadges(tasks) {
  const frag = h("span", { class: "tasks" });
  for (const st of TASK_STATES) {
    const n = (tasks || {})[st] || 0;
    if (n) frag.append(h("span", { class: `badge state-${st.toUpperCase()}`, title: st, text: n }));
  }
  if (!frag.children.length) frag.append(h("span", { class: "muted", text: "–" }));
  return frag;
}

/* An inline status line next to an action: text, kind ok|error|"" */
export function say(el, text, kind) {
  el.className = `message ${kind || ""}`;
  setText(el, text);
}
