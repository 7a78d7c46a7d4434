// Drives agentjail's MCP server with the official TypeScript SDK (@modelcontextprotocol/sdk,
// pinned in package.json). Run by crates/cli/tests/mcp_ts.rs, over stdio (the SDK launches
// `agentjail mcp`) or over Streamable HTTP (`agentjail serve`'s /mcp with a bearer token).
//
// The SDK's callTool validates structuredContent against the tool's outputSchema (cached from
// tools/list) and throws "Structured content does not match the tool's output schema" when it
// does not match, so every call below that returns is one a strict client accepts.
//
// Scenarios: tools/list; upload_input; summarize_csv with model-proposed code (the verified
// summary as structuredContent); a failed run (isError, the cause and the untrusted stderr tail
// readable); a policy denial and a forbidden task (isError, "Denied (...)"); a cancelled call
// whose sandbox is gone afterwards (no process with the marker in /proc) and whose run is
// recorded as cancelled; a call with a progress token sees the run's output live. Every failed check throws; the last stdout line is `RESULT {json}`.
//
// Usage: node client.mjs --transport stdio --bin AGENTJAIL --config FILE --data-dir DIR --token-file FILE
//        node client.mjs --transport http --url URL --token-file FILE
import { readFileSync, readdirSync } from "node:fs";
import { randomBytes } from "node:crypto";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const here = dirname(fileURLToPath(import.meta.url));
const SUMMARIZE = readFileSync(join(here, "../../../../../examples/csv-summary/summarize.py"), "utf8");
const CSV = "region,units,price\nnorth,12,2.5\nsouth,7,3.0\neast,,4.0\n";

function args() {
  const a = {};
  const v = process.argv.slice(2);
  for (let i = 0; i < v.length; i += 2) a[v[i].replace(/^--/, "")] = v[i + 1];
  return a;
}

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

function log(...parts) {
  console.error(parts.map((p) => (typeof p === "string" ? p : JSON.stringify(p))).join(" "));
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Pids whose command line contains `marker` (the sandbox's processes are visible from here). */
function markerPids(marker) {
  const found = [];
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d) || Number(d) === process.pid) continue;
    try {
      if (readFileSync(`/proc/${d}/cmdline`).includes(marker)) found.push(Number(d));
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

function text(r) {
  return (r.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("\n");
}

async function call(client, name, a, options) {
  log(`> tools/call ${name}`, Object.keys(a));
  const r = await client.callTool({ name, arguments: a }, undefined, options);
  log(`< isError=${r.isError ?? false} structuredContent=${JSON.stringify(r.structuredContent ?? null).slice(0, 300)}`);
  if (r.isError) log(`< text: ${text(r).slice(0, 400)}`);
  return r;
}

async function scenarios(client, out) {
  const info = client.getServerVersion();
  check(info?.name === "agentjail", `serverInfo ${JSON.stringify(info)}`);

  // 1. tools/list: the task tools of this actor, with schemas.
  const { tools } = await client.listTools();
  const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
  out.tools = Object.keys(byName).sort();
  log("< tools:", out.tools);
  const s = byName.summarize_csv;
  check(s && s.outputSchema && s.outputSchema.title === "CSV summary", `summarize_csv outputSchema ${JSON.stringify(s?.outputSchema)}`);
  check(!("admin_only" in byName), "a task the actor may not use is not listed");
  // The SDK now holds a validator for summarize_csv's outputSchema, and it rejects a summary of
  // the wrong shape: so the successful call below really was validated.
  const validator = client.getToolOutputValidator("summarize_csv");
  check(typeof validator === "function", "the SDK compiled a validator for the outputSchema");
  check(validator({ rows: "three" }).valid === false, "the SDK's validator rejects a wrong shape");
  for (const t of tools) {
    for (const k of ["oneOf", "anyOf", "allOf", "not"]) check(!(k in t.inputSchema), `${t.name} has a top-level ${k}`);
  }

  // 2. Upload a CSV.
  const up = await call(client, "upload_input", { name: "report.csv", media_type: "text/csv", text: CSV });
  check(!up.isError, "upload ok");
  const inputId = up.structuredContent.input_id;
  check(/^in_[0-9a-f]{32}$/.test(inputId), `input id ${inputId}`);

  // 3. Run: the verified summary comes back as structuredContent, which the SDK has just
  //    validated against the outputSchema (it throws otherwise).
  const rid = `ts-sum-${randomBytes(4).toString("hex")}`;
  const r = await call(client, "summarize_csv", { input_id: inputId, code: SUMMARIZE, request_id: rid });
  check(!r.isError, `summarize failed: ${text(r)}`);
  const summary = r.structuredContent;
  check(summary.rows === 3 && JSON.stringify(summary.columns) === JSON.stringify(["region", "units", "price"]), `summary ${JSON.stringify(summary)}`);
  check(summary.numeric.units.sum === 19, `units sum ${JSON.stringify(summary)}`);
  check(r._meta?.["dev.agentjail/run"]?.status === "ok" && r._meta["dev.agentjail/run"].request_id === rid, `meta ${JSON.stringify(r._meta)}`);
  out.summary = summary;

  // 4. A failed run: exit status 3 with a marker on stderr. The SDK must not throw (no
  //    structuredContent that violates the schema); the cause is readable in the text.
  const failMarker = `AJ-TS-FAIL-${randomBytes(6).toString("hex")}`;
  const f = await call(client, "summarize_csv", {
    input_id: inputId,
    code: `import sys\nsys.stderr.write("${failMarker}\\n")\nsys.exit(3)\n`,
  });
  check(f.isError === true, "a failed run is isError");
  check(f.structuredContent === undefined, "no structuredContent on an error result");
  const ft = text(f);
  check(ft.includes("exit_nonzero") && ft.includes("3"), `the text names the cause: ${ft}`);
  check(ft.includes(failMarker) && ft.includes("UNTRUSTED"), `the stderr tail is there, labelled untrusted: ${ft}`);
  const fe = f._meta?.["dev.agentjail/error"];
  check(fe?.status === "exit_nonzero", `_meta error ${JSON.stringify(f._meta)}`);
  out.failed = { status: fe.status, text: ft.split("\n")[0] };

  // 5. Denials: wrong media type (input-mismatch) and a task the actor may not use (forbidden).
  const txt = await call(client, "upload_input", { name: "notes.txt", media_type: "text/plain", text: "hello" });
  const d = await call(client, "summarize_csv", { input_id: txt.structuredContent.input_id, code: SUMMARIZE });
  check(d.isError === true && d.structuredContent === undefined, "a denial is isError without structuredContent");
  check(text(d).startsWith("Denied (input-mismatch)") && text(d).includes("text/plain"), `denial text ${text(d)}`);
  check(d._meta?.["dev.agentjail/error"]?.error === "input-mismatch", `denial meta ${JSON.stringify(d._meta)}`);
  const fb = await call(client, "admin_only", { input_id: inputId });
  check(fb.isError === true && text(fb).startsWith("Denied (forbidden)"), `forbidden ${text(fb)}`);
  out.denials = [d._meta["dev.agentjail/error"].error, fb._meta["dev.agentjail/error"].error];

  // 6. Cancellation: abort a running call; the SDK sends notifications/cancelled. Every process
  //    of the sandbox must be gone and the run recorded as cancelled.
  const marker = `agentjail-ts-cancel-${randomBytes(8).toString("hex")}`;
  const code =
    "import subprocess, time\n" +
    `subprocess.Popen(['/usr/bin/python3', '-c', 'import time; time.sleep(600)', '${marker}'])\n` +
    "time.sleep(600)\n";
  const crid = `ts-cancel-${randomBytes(4).toString("hex")}`;
  const ac = new AbortController();
  const progress = [];
  const pending = call(client, "sleepy", { code, request_id: crid }, {
    signal: ac.signal,
    timeout: 300000,
    onprogress: (p) => progress.push(p),
  }).then(
    () => "returned",
    (e) => `rejected: ${e?.message ?? e}`,
  );
  let seen = [];
  for (let t = Date.now(); Date.now() - t < 60000 && seen.length === 0; await sleep(100)) seen = markerPids(marker);
  check(seen.length > 0, "the sandboxed process started");
  log(`# sandbox process with the marker is running: pids ${seen}; cancelling`);
  ac.abort("test cancels");
  const outcome = await pending;
  check(outcome.startsWith("rejected"), `the aborted call ${outcome}`);
  let left = seen;
  for (let t = Date.now(); Date.now() - t < 20000 && left.length > 0; await sleep(100)) left = markerPids(marker);
  log(`# after cancellation, processes with the marker: ${left}`);
  check(left.length === 0, `sandbox processes survived the cancellation: ${left}`);
  let status;
  for (let t = Date.now(); Date.now() - t < 20000; await sleep(200)) {
    const g = await call(client, "get_run", { request_id: crid });
    status = g.structuredContent?.status;
    if (status !== "queued" && status !== "running") break;
  }
  check(status === "cancelled", `cancelled run recorded as ${status}`);
  out.cancelled = { pids: seen, status, progress: progress.length };

  // 7. Live output: a call with a progress token sees what the run prints while it runs, in
  //    its progress messages ("stdout: …", "stderr: …"), each value greater than the last.
  const tag = randomBytes(6).toString("hex");
  const live = [];
  const t0 = Date.now();
  const lr = await call(client, "sleepy", {
    code:
      "import sys, time\n" +
      `print("AJ-LIVE-OUT-${tag}", flush=True)\n` +
      `sys.stderr.write("AJ-LIVE-ERR-${tag}\\n"); sys.stderr.flush()\n` +
      "time.sleep(3)\n" +
      `print("AJ-LIVE-LATE-${tag}")\n`,
  }, {
    timeout: 120000,
    onprogress: (p) => live.push({ at: Date.now() - t0, progress: p.progress, message: p.message ?? "" }),
  });
  const took = Date.now() - t0;
  log(`# live: the call took ${took} ms; progress messages: ${JSON.stringify(live.map((p) => [p.at, p.message.slice(0, 80)]))}`);
  const outAt = live.find((p) => p.message.startsWith("stdout: ") && p.message.includes(`AJ-LIVE-OUT-${tag}`));
  const errAt = live.find((p) => p.message.startsWith("stderr: ") && p.message.includes(`AJ-LIVE-ERR-${tag}`));
  check(outAt, `the stdout line arrived as progress: ${JSON.stringify(live)}`);
  check(errAt, `the stderr line arrived as progress: ${JSON.stringify(live)}`);
  for (let i = 1; i < live.length; i++) check(live[i].progress > live[i - 1].progress, `progress increases: ${JSON.stringify(live)}`);
  check(text(lr).includes(`AJ-LIVE-LATE-${tag}`) || JSON.stringify(lr).includes(`AJ-LIVE-LATE-${tag}`), `the result carries the later line: ${JSON.stringify(lr).slice(0, 600)}`);
  out.live = { stdout_before_end_ms: took - outAt.at, stderr_before_end_ms: took - errAt.at, messages: live.length };
}

async function main() {
  const a = args();
  const out = { transport: a.transport };
  let transport;
  if (a.transport === "stdio") {
    transport = new StdioClientTransport({
      command: a.bin,
      args: ["mcp", "--config", a.config, "--data-dir", a["data-dir"], "--tenant", "acme", "--actor", "alice", "--token-file", a["token-file"]],
      env: { AGENTJAIL_LOG: "info", PATH: process.env.PATH ?? "/usr/bin:/bin" },
      stderr: "inherit",
    });
  } else if (a.transport === "http") {
    const token = readFileSync(a["token-file"], "utf8").trim();
    transport = new StreamableHTTPClientTransport(new URL(a.url), {
      requestInit: { headers: { Authorization: `Bearer ${token}` } },
    });
  } else {
    throw new Error("--transport stdio|http");
  }
  const client = new Client({ name: "agentjail-ts-sdk-test", version: "1.0.0" });
  await client.connect(transport);
  try {
    await scenarios(client, out);
  } finally {
    await client.close();
  }
  console.log(`RESULT ${JSON.stringify(out)}`);
}

main().catch((e) => {
  console.error(`FAILED: ${e?.stack ?? e}`);
  process.exit(1);
});
