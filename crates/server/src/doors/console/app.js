// The agentjail operator console (docs/console.md). Plain ES module, no dependency.
//
// Every string that comes from the server is UNTRUSTED (the sandbox's output, names chosen by
// tenants): it is only ever put into the page as text (createTextNode / textContent), never
// as HTML, and never into an attribute that could run it (links are built from
// encodeURIComponent'd path parts behind a fixed '#/' prefix).

const SVG = "http://www.w3.org/2000/svg";
const session = { csrf: null, actor: null };
let timer = null;
let events = null; // the runs list's EventSource, while it is shown

/** An element `tag` with `props` (attributes, `on*` listeners) and children (text or nodes). */
function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "href") el.setAttribute("href", safeHref(v));
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Only the console's own '#/…' routes are ever linked. */
function safeHref(v) {
  const s = String(v);
  return s.startsWith("#/") ? s : "#/";
}

function runHref(tenant, id) {
  return "#/run/" + encodeURIComponent(tenant) + "/" + encodeURIComponent(id);
}

function text(v) {
  if (v === null || v === undefined) return "—";
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

function statusClass(s) {
  if (s === "ok") return "status-ok";
  if (s === "unknown" || s === "queued" || s === "running") return "status-warn";
  return "status-bad";
}

function dl(pairs) {
  return h("dl", {}, pairs.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v instanceof Node ? v : text(v))]));
}

function table(caption, cols, rows) {
  if (!rows || rows.length === 0) return h("p", { class: "muted" }, caption + ": none.");
  return h("table", {},
    h("caption", { class: "muted" }, caption),
    h("thead", {}, h("tr", {}, cols.map(([label]) => h("th", { scope: "col" }, label)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, cols.map(([, get]) => {
      const v = get(r);
      return h("td", {}, v instanceof Node ? v : text(v));
    })))));
}

class HttpError extends Error {
  constructor(status, detail) { super(detail); this.status = status; }
}

async function api(path, opts = {}) {
  const init = { method: opts.method || "GET", credentials: "same-origin", headers: { Accept: "application/json" } };
  if (opts.body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(opts.body);
  }
  if (init.method !== "GET") init.headers["X-CSRF-Token"] = session.csrf || "";
  const r = await fetch(path, init);
  if (r.status === 401 && path !== "/console/login") {
    showLogin("Your console session has ended: log in again.");
    throw new HttpError(401, "not logged in");
  }
  if (r.status === 204) return null;
  const body = await r.json().catch(() => null);
  if (!r.ok) throw new HttpError(r.status, (body && body.detail) || r.statusText);
  return body;
}

const main = () => document.getElementById("main");

function show(...nodes) {
  const m = main();
  m.replaceChildren();
  delete m.dataset.q;
  append(m, nodes);
}

function fail(e) {
  if (e instanceof HttpError && e.status === 401) return;
  show(h("h1", {}, "Error"), h("p", { class: "error", role: "alert" }, String(e.message || e)));
}

function stop() {
  if (timer) clearInterval(timer);
  timer = null;
  if (events) events.close();
  events = null;
}

// The runs list's live updates (/console/api/runs/events): each `changed` reads the list
// again. Started after `every` (which stops any earlier stream); false where the browser has
// no EventSource, and the caller polls instead.
function live(f) {
  if (typeof EventSource === "undefined") return false;
  events = new EventSource("/console/api/runs/events");
  events.addEventListener("changed", () => f().catch(() => {}));
  return true;
}

function every(ms, f) {
  stop();
  timer = setInterval(() => f().catch(() => {}), ms);
}

// ---------------------------------------------------------------------------------------------
// Login

function showLogin(message) {
  stop();
  session.csrf = null;
  document.getElementById("nav").hidden = true;
  document.getElementById("logout").hidden = true;
  document.getElementById("who").textContent = "";
  const input = h("input", { id: "token", name: "token", type: "password", autocomplete: "off", required: true });
  const err = h("p", { class: "error", role: "alert" }, message || "");
  const form = h("form", { class: "login", onsubmit: async (ev) => {
    ev.preventDefault();
    try {
      const r = await api("/console/login", { method: "POST", body: { token: input.value } });
      input.value = "";
      loggedIn(r);
    } catch (e) {
      input.value = "";
      err.textContent = e.status === 403
        ? "Refused: the console is for operators, and this token is not an operator's."
        : "Log-in failed: " + e.message;
    }
  } },
  h("label", { for: "token" }, "Operator token", input),
  h("button", { type: "submit" }, "Log in"),
  err);
  show(h("h1", {}, "Log in"), h("p", {}, "The console is for operators: use an operator's API token."), form);
  input.focus();
}

function loggedIn(r) {
  session.csrf = r.csrf;
  session.actor = r.actor;
  document.getElementById("nav").hidden = false;
  document.getElementById("logout").hidden = false;
  document.getElementById("who").textContent = "operator: " + r.actor;
  route();
}

// ---------------------------------------------------------------------------------------------
// Runs

const STATUSES = ["", "queued", "running", "ok", "exit_nonzero", "signaled", "timeout", "memory_limit",
  "output_rejected", "setup_error", "expired", "unknown", "abandoned", "cancelled"];
const filters = { tenant: "", task: "", status: "", since: "" };

function runsPage() {
  const field = (name, label, input) => h("label", { for: "f-" + name }, label, input);
  const tenant = h("input", { id: "f-tenant", value: filters.tenant, size: 12 });
  const task = h("input", { id: "f-task", value: filters.task, size: 14 });
  const status = h("select", { id: "f-status" }, STATUSES.map((s) => h("option", { value: s, selected: s === filters.status }, s || "any")));
  const since = h("select", { id: "f-since" }, [["", "any time"], ["3600", "last hour"], ["86400", "last day"], ["604800", "last week"]]
    .map(([v, l]) => h("option", { value: v, selected: v === filters.since }, l)));
  const body = h("div", { id: "runs", "aria-live": "polite" }, h("p", {}, "Loading…"));
  const load = async () => {
    const q = new URLSearchParams();
    if (filters.tenant) q.set("tenant", filters.tenant);
    if (filters.task) q.set("task", filters.task);
    if (filters.status) q.set("status", filters.status);
    if (filters.since) q.set("created_after", new Date(Date.now() - Number(filters.since) * 1000).toISOString().replace(/\.\d+Z$/, "Z"));
    q.set("limit", "100");
    try {
      const r = await api("/console/api/runs?" + q);
      body.replaceChildren(table("Runs, newest first (updated every 2 s)", [
        ["Request", (x) => h("a", { href: runHref(x.tenant, x.request_id) }, x.request_id)],
        ["Tenant", (x) => x.tenant],
        ["Task", (x) => x.task],
        ["Actor", (x) => x.actor],
        ["Status", (x) => h("span", { class: statusClass(x.status) }, x.status)],
        ["Created", (x) => x.created_at],
        ["Finished", (x) => x.finished_at],
      ], r.runs));
    } catch (e) {
      if (e.status !== 401) body.replaceChildren(h("p", { class: "error", role: "alert" }, e.message));
    }
  };
  const form = h("form", { class: "filters", onsubmit: (ev) => {
    ev.preventDefault();
    Object.assign(filters, { tenant: tenant.value.trim(), task: task.value.trim(), status: status.value, since: since.value });
    load();
  } },
  field("tenant", "Tenant", tenant), field("task", "Task", task), field("status", "Status", status), field("since", "Created", since),
  h("button", { type: "submit" }, "Filter"));
  show(h("h1", {}, "Runs"), form, body);
  load();
  // Live over the events stream, with a slow read for runs on other nodes of a fleet (the
  // stream tells only of this node's); without EventSource, a read every 2 s.
  every(10000, load);
  if (!live(load)) every(2000, load);
}

// ---------------------------------------------------------------------------------------------
// A run

function stream(name, s) {
  if (!s) return [h("h2", {}, name), h("p", { class: "muted" }, "Nothing recorded (yet).")];
  const parts = [s.head];
  if (s.omitted_bytes) parts.push(`\n… ${s.omitted_bytes} bytes omitted …\n`);
  if (s.tail) parts.push(s.tail);
  return [
    h("h2", {}, name + " (untrusted)"),
    h("p", { class: "muted" }, `${s.bytes} bytes${s.truncated ? ", truncated" : ""}${s.sha256 ? ", sha256 " + s.sha256 : ""}`),
    h("pre", { class: "untrusted", "data-stream": name, tabindex: 0 }, parts.join("")),
  ];
}

function reconcileActions(tenant, id, retryPossible, after) {
  const box = h("div", { class: "actions" });
  const msg = h("p", { role: "status" });
  const ask = (action) => {
    const label = action === "retry" ? "Retry" : "Abandon";
    const confirm = h("div", { class: "confirm", role: "group", "aria-label": label + " confirmation" },
      h("p", {}, action === "retry"
        ? `Run ${id} again, under the same manifest digest? It may then have run twice.`
        : `Abandon ${id}? Its record stays, with status abandoned.`),
      h("button", { type: "button", class: "danger", "data-confirm": action, onclick: async () => {
        confirm.remove();
        msg.textContent = label + "…";
        try {
          const r = await api(`/console/api/runs/${encodeURIComponent(tenant)}/${encodeURIComponent(id)}/reconcile`, { method: "POST", body: { action } });
          msg.textContent = `${label}: the run is now ${r.status}.`;
          after();
        } catch (e) {
          msg.textContent = `${label} refused: ${e.message}`;
        }
      } }, "Confirm " + action),
      " ",
      h("button", { type: "button", onclick: () => confirm.remove() }, "Cancel"));
    box.querySelectorAll(".confirm").forEach((c) => c.remove());
    box.append(confirm);
    confirm.querySelector("button").focus();
  };
  append(box, [
    h("button", { type: "button", "data-action": "retry", disabled: !retryPossible, title: retryPossible ? null : "only network-free tasks with a fixed program can be retried", onclick: () => ask("retry") }, "Retry…"),
    " ",
    h("button", { type: "button", class: "danger", "data-action": "abandon", onclick: () => ask("abandon") }, "Abandon…"),
    msg,
  ]);
  return box;
}

// Whether the run's receipt verifies, and with whose key (another node's is the database's word).
function receiptCheck(rc) {
  if (rc.verifies === true && rc.trust === "this node") {
    return h("p", { id: "receipt-check", class: "status-ok" }, "The receipt verifies with this node's key.");
  }
  if (rc.verifies === true) {
    return h("p", { id: "receipt-check", class: "status-warn" },
      "The receipt's signature matches the key that node ", h("code", {}, String(rc.signer_node)),
      " published in the shared database: the database's word, not a key this node holds. Verify it offline with a key you trust.");
  }
  if (rc.verifies === null) return h("p", { id: "receipt-check", class: "status-warn" }, "The receipt could not be checked: " + (rc.error || ""));
  return h("p", { id: "receipt-check", class: "status-bad" }, "The receipt does NOT verify: " + (rc.error || ""));
}

async function runPage(tenant, id) {
  stop();
  const load = async () => {
    const v = await api(`/console/api/runs/${encodeURIComponent(tenant)}/${encodeURIComponent(id)}`);
    const rep = v.report || {};
    const out = rep.output || {};
    const rc = v.receipt_check;
    show(
      h("h1", {}, "Run ", h("code", {}, v.request_id)),
      dl([
        ["Tenant", v.tenant], ["Task", v.task], ["Actor", v.actor],
        ["Status", h("span", { class: statusClass(v.status), id: "run-status" }, v.status)],
        ["Reason", v.reason], ["Manifest digest", v.manifest_digest], ["Job", v.job_id],
        ["Exit code", rep.exit_code], ["Wall time (ms)", rep.wall_ms], ["Peak memory (bytes)", rep.peak_memory_bytes],
      ]),
      v.status === "unknown" ? [h("h2", {}, "Needs a decision"), reconcileActions(v.tenant, v.request_id, true, load)] : null,
      h("h2", {}, "Timeline"),
      dl([["Created", v.created_at], ["Started", v.started_at], ["Finished", v.finished_at], ["Job expires", v.job_expires_at]]),
      h("h2", {}, "Limits"),
      rep.limits ? dl(Object.entries(rep.limits)) : h("p", { class: "muted" }, "No report (yet)."),
      h("h2", {}, "Denials"),
      table("Every refusal of the sandbox, with its reason (untrusted details)", [
        ["Kind", (d) => d.kind], ["Detail", (d) => h("span", { class: "denial-detail" }, text(d.detail))], ["Count", (d) => d.count || 1],
      ], rep.denials),
      h("h2", {}, "Network connections"),
      table("Connections through the egress gateway", [
        ["Host", (c) => c.host], ["Port", (c) => c.port], ["Allowed", (c) => c.allowed], ["Detail", (c) => text(c)],
      ], rep.network && rep.network.connections),
      h("h2", {}, "Output verdicts"),
      table("Accepted files", [["Path", (f) => f.path || f.name], ["Bytes", (f) => f.bytes], ["sha256", (f) => f.sha256]], out.files),
      table("Rejected files (untrusted names)", [["Path", (f) => h("span", { class: "rejected-name" }, text(f.path || f.name))], ["Reason", (f) => f.reason]], out.rejected),
      table("Output errors", [["Error", (e) => text(e)]], out.errors),
      v.artifact ? [h("h2", {}, "Artifact"), dl([["Media type", v.artifact.media_type], ["Bytes", v.artifact.bytes], ["sha256", v.artifact.sha256]]),
        v.artifact.json !== undefined ? h("pre", { tabindex: 0 }, JSON.stringify(v.artifact.json, null, 2)) : null] : null,
      stream("stdout", v.stdout),
      stream("stderr", v.stderr),
      h("h2", {}, "Receipt"),
      rc ? receiptCheck(rc) : h("p", { class: "muted" }, "No receipt."),
      v.receipt ? h("details", {}, h("summary", {}, "The DSSE envelope"), h("pre", { tabindex: 0 }, JSON.stringify(v.receipt, null, 2))) : null,
    );
    if (v.status === "queued" || v.status === "running") {
      if (!timer) every(2000, load);
    } else stop();
  };
  await load();
}

// ---------------------------------------------------------------------------------------------
// Needs a decision

async function decisionsPage() {
  stop();
  const load = async () => {
    const r = await api("/console/api/decisions");
    show(h("h1", {}, "Needs a decision"),
      h("p", {}, "Runs whose outcome is unknown: the node stopped hearing from them. Retry (network-free tasks with a fixed program only) or abandon; each decision is audited."),
      r.runs.length === 0 ? h("p", { class: "muted" }, "Nothing needs a decision.") : null,
      r.runs.map((d) => h("section", { class: "card", "aria-label": "Run " + d.request_id },
        h("h2", {}, h("a", { href: runHref(d.tenant, d.request_id) }, d.request_id)),
        dl([["Tenant", d.tenant], ["Task", d.task], ["Actor", d.actor], ["Why unknown", d.reason], ["Job", d.job_id],
          ["Created", d.created_at], ["Started", d.started_at], ["Marked unknown (lease ended)", d.ended_at],
          ["Network access", d.network === null ? "task gone" : d.network ? "yes: it may have acted outside" : "no"]]),
        table("Network connections recorded", [["Connection", (c) => text(c)]], d.connections),
        reconcileActions(d.tenant, d.request_id, d.retry_possible, load))));
  };
  await load();
}

// ---------------------------------------------------------------------------------------------
// Denials

function barChart(title, counts) {
  const entries = Object.entries(counts).sort((a, b) => b[1] - a[1]).slice(0, 12);
  const max = Math.max(1, ...entries.map(([, n]) => n));
  const rowH = 22, labelW = 180, barW = 320;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "chart");
  svg.setAttribute("role", "img");
  svg.setAttribute("width", String(labelW + barW + 60));
  svg.setAttribute("height", String(rowH * entries.length + 4));
  const t = document.createElementNS(SVG, "title");
  t.textContent = title;
  svg.append(t);
  entries.forEach(([k, n], i) => {
    const label = document.createElementNS(SVG, "text");
    label.setAttribute("x", "0");
    label.setAttribute("y", String(i * rowH + 15));
    label.textContent = k.length > 28 ? k.slice(0, 27) + "…" : k;
    const rect = document.createElementNS(SVG, "rect");
    rect.setAttribute("x", String(labelW));
    rect.setAttribute("y", String(i * rowH + 3));
    rect.setAttribute("height", String(rowH - 6));
    rect.setAttribute("width", String(Math.max(2, (n / max) * barW)));
    const num = document.createElementNS(SVG, "text");
    num.setAttribute("x", String(labelW + (n / max) * barW + 6));
    num.setAttribute("y", String(i * rowH + 15));
    num.textContent = String(n);
    svg.append(label, rect, num);
  });
  return [h("h2", {}, title), entries.length ? svg : h("p", { class: "muted" }, "None.")];
}

async function denialsPage() {
  stop();
  const r = await api("/console/api/denials");
  const by = (f) => r.denials.reduce((m, d) => { const k = f(d); m[k] = (m[k] || 0) + (d.count || 1); return m; }, {});
  show(h("h1", {}, "Denials"),
    h("p", { class: "muted" }, `The sandbox's refusals in the last ${r.runs_scanned} runs.`),
    barChart("By kind", by((d) => d.kind)),
    barChart("By task", by((d) => d.task)),
    barChart("By tenant", by((d) => d.tenant)),
    h("h2", {}, "Each denial"),
    table("Newest first (untrusted details)", [
      ["When", (d) => d.created_at], ["Kind", (d) => d.kind], ["Detail", (d) => text(d.detail)], ["Count", (d) => d.count || 1],
      ["Task", (d) => d.task], ["Tenant", (d) => d.tenant], ["Run", (d) => h("a", { href: runHref(d.tenant, d.request_id) }, d.request_id)],
    ], r.denials));
}

// ---------------------------------------------------------------------------------------------
// Audit

async function auditPage(q = "") {
  stop();
  const r = await api("/console/api/audit" + (q ? "?q=" + encodeURIComponent(q) : ""));
  const input = h("input", { id: "audit-q", value: q, size: 30 });
  const v = r.verified;
  show(h("h1", {}, "Audit"),
    v === null ? h("p", { class: "muted" }, r.note)
      : h("p", { id: "audit-verified", class: v.ok ? "status-ok" : "status-bad" },
        v.ok ? (v.chains ? `The database's ${v.chains} chain(s) verify (${v.records} records, each node's and the anchors between them).` : `The chain verifies (${v.records} records).`)
          : "The chain does NOT verify: " + v.error),
    h("form", { class: "filters", role: "search", onsubmit: (ev) => { ev.preventDefault(); auditPage(input.value.trim()).catch(fail); } },
      h("label", { for: "audit-q" }, "Search the records", input), h("button", { type: "submit" }, "Search")),
    table("The most recent matching records, newest first", [
      ["Time", (x) => x.ts], ["Event", (x) => x.event], ["Actor", (x) => x.actor], ["Tenant", (x) => x.tenant],
      ["Task", (x) => x.task], ["Request", (x) => x.request_id], ["Decision", (x) => x.decision], ["Reason", (x) => x.reason], ["Status", (x) => x.status],
    ], r.records));
  main().dataset.q = q;
}

// ---------------------------------------------------------------------------------------------
// Fleet

const when = (s) => (s === null || s === undefined ? null : new Date(s * 1000).toISOString().replace(/\.000Z$/, "Z"));

async function fleetPage() {
  stop();
  const r = await api("/console/api/fleet");
  if (r.store !== "postgresql") {
    show(h("h1", {}, "Fleet"), h("p", {}, "One node with SQLite: no fleet. A PostgreSQL deployment (serve --database) lists its replicas and workers here."));
    return;
  }
  show(h("h1", {}, "Fleet"),
    h("p", { class: "muted" }, "This node: " + r.node + ". Read-only, from the shared store."),
    h("h2", {}, "Nodes"),
    table("Replicas (with or without run slots) and workers, by node", [
      ["Node", (w) => w.node_id], ["Live", (w) => h("span", { class: w.live ? "status-ok" : "status-bad" }, w.live ? "yes" : "NO")],
      ["Draining", (w) => (w.draining ? "yes: claims no more, finishing its runs" : "no")],
      ["Slots", (w) => (w.slots === 0 ? "0 (an API replica: runs nothing)" : w.slots)], ["Runs held", (w) => w.runs_held], ["Labels", (w) => w.labels.join(", ")],
      ["Started", (w) => when(w.started_at)], ["Last heartbeat", (w) => when(w.heartbeat_at)],
    ], r.workers),
    h("h2", {}, "Leases"),
    table("Runs held by a node, nearest the end of their lease first", [
      ["Run", (l) => h("a", { href: runHref(l.tenant, l.request_id) }, l.request_id)], ["Tenant", (l) => l.tenant], ["Task", (l) => l.task],
      ["Node", (l) => l.owner], ["Status", (l) => l.status], ["Lease ends", (l) => when(l.lease_expires_at)],
    ], r.leases));
}

// ---------------------------------------------------------------------------------------------
// Health

// What `agentjail check` reports on a host: each item, whether a strict run works, the fixes.
const list = (v) => (Array.isArray(v) ? v.filter((x) => x && typeof x === "object") : []);

function isolation(c) {
  if (!c || typeof c !== "object") return h("p", { class: "muted" }, "Being read (`agentjail check` runs a strict sandbox just after start-up); reload in a moment.");
  if (c.error) return h("p", { class: "status-bad" }, String(c.error));
  return h("div", {},
    h("p", { class: c.strict_run_ok ? "status-ok" : "status-bad" },
      c.strict_run_ok ? "A strict run works on this host." : "A strict run is REFUSED on this host (runs need --allow-degraded)."),
    table("The isolation facts `agentjail check` reports", [
      ["Item", (i) => i.name], ["OK", (i) => h("span", { class: i.ok ? "status-ok" : "status-bad" }, i.ok ? "yes" : "NO")], ["Detail", (i) => i.detail],
    ], list(c.items)),
    Array.isArray(c.fixes) && c.fixes.length ? h("ul", {}, ...c.fixes.map((f) => h("li", {}, String(f)))) : "");
}

function selftest(st) {
  if (!st) return h("p", { class: "muted" }, "The start-up self-test did not run (server.selftest).");
  return dl([["Result", st.passed ? "passed" : "FAILED"], ["Probes passed", st.probes_passed], ["Probes failed", st.probes_failed],
    ["Probes skipped", st.probes_skipped], ["Failed probes", (st.failed_probes || []).join(", ") || "none"], ["Sandbox mode", st.sandbox_mode],
    ["Mode", st.mode], ["Started", st.started_at],
    ["Attestation", st.attestation_sha256 ? st.attestation_sha256 + " (DATA/private/selftest-attestation.json; `agentjail receipt verify` checks it)" : "none written"]]);
}

async function healthPage() {
  stop();
  const r = await api("/console/api/health");
  const key = r.receipt_key || {};
  // What another node published is its word: read defensively.
  const facts = (n) => (n.facts && typeof n.facts === "object" ? n.facts : {});
  const strict = (f) => (f.check && typeof f.check === "object" ? (f.check.error ? "not read: " + f.check.error : f.check.strict_run_ok ? "works" : "REFUSED") : "not read yet");
  const nodes = Array.isArray(r.nodes) ? [
    h("h2", {}, "Every node (PostgreSQL)"),
    h("p", { class: "muted" }, "What each node published of itself with its heartbeat: its word, as recorded in the shared database."),
    table("Each node's host, receipt key and self-test", [
      ["Node", (n) => n.node_id], ["Live", (n) => h("span", { class: n.live ? "status-ok" : "status-bad" }, n.live ? "yes" : "NO")],
      ["Strict run", (n) => strict(facts(n))],
      ["Isolation", (n) => list(facts(n).check && facts(n).check.items).map((i) => (i.ok ? "" : "NOT ") + String(i.name)).join(", ")],
      ["Self-test", (n) => { const t = facts(n).selftest; return t && typeof t === "object" ? (t.passed ? "passed" : "FAILED") + ", " + String(t.probes_passed) + " passed" : "did not run"; }],
      ["Attestation", (n) => String((facts(n).selftest && facts(n).selftest.attestation_sha256) || "")],
      ["Receipt key id", (n) => String((facts(n).receipt_key && facts(n).receipt_key.keyid) || "")], ["Version", (n) => String(facts(n).version || "")],
    ], list(r.nodes))] : [];
  show(h("h1", {}, "Health"),
    dl([["Store", r.store], ["Store reachable", r.store_ok ? "yes" : "NO"], ["Runs in flight or queued", r.runs_in_flight_or_queued],
      ["Run slots", r.slots], ["Version", r.version], ["Node", r.node || "this one (SQLite)"], ["Receipt key id", key.keyid || key.error || ""]]),
    h("h2", {}, "Isolation on this host"),
    isolation(r.isolation),
    h("h2", {}, "Self-test at start-up"),
    selftest(r.selftest),
    ...nodes);
}

// ---------------------------------------------------------------------------------------------

function route() {
  if (!session.csrf) return;
  const parts = (location.hash || "#/runs").slice(2).split("/");
  const page = parts[0] || "runs";
  for (const a of document.querySelectorAll("#nav a")) {
    if (a.getAttribute("href") === "#/" + page) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  let p;
  if (page === "run" && parts.length === 3) p = runPage(decodeURIComponent(parts[1]), decodeURIComponent(parts[2]));
  else if (page === "decisions") p = decisionsPage();
  else if (page === "denials") p = denialsPage();
  else if (page === "audit") p = auditPage();
  else if (page === "health") p = healthPage();
  else if (page === "fleet") p = fleetPage();
  else p = Promise.resolve(runsPage());
  p.catch(fail);
}

window.addEventListener("hashchange", route);
document.getElementById("logout").addEventListener("click", async () => {
  try { await api("/console/api/logout", { method: "POST" }); } catch (e) { /* ended anyway */ }
  showLogin("Logged out.");
});

api("/console/api/session").then(loggedIn, (e) => {
  if (!(e instanceof HttpError && e.status === 401)) showLogin(e.message);
});
