// Runs against the real service: the csv-summary example, failures, execute-once, cancel,
// pagination, typed errors, offline verification.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { generateKeyPairSync } from "node:crypto";
import * as aj from "../dist/index.js";
import { file, text } from "../dist/node.js";
import { live, rid, OUT } from "./helpers.mjs";

const client = () => new aj.Client();
const example = () => process.env.AGENTJAIL_EXAMPLE;

async function summarize(c) {
  const data = await c.upload(await file(join(example(), "report.csv")));
  const code = await text(join(example(), "summarize.py"));
  return [data, code, await c.run("summarize_csv", [data], { code })];
}

test("summarize_csv end to end, and its receipt verifies offline", live, async () => {
  const c = client();
  const [data, , run] = await summarize(c);
  assert.equal(data.name, "report.csv");
  assert.ok(run.ok && run.finished && run.status === "ok", JSON.stringify(run.record));
  assert.equal(run.raiseForStatus(), run);
  const summary = run.artifact;
  assert.equal(summary.rows, 8);
  const artifact = await c.artifact(run.requestId);
  assert.deepEqual(JSON.parse(new TextDecoder().decode(artifact)), summary);
  const receipt = await c.receipt(run.requestId);
  assert.deepEqual(receipt, run.receipt);
  const pem = await text(process.env.AGENTJAIL_PUBKEY);
  const v = await aj.verify(receipt, { publicKey: pem, artifact: new File([artifact], "summary.json") });
  assert.equal(v.status, "ok");
  assert.deepEqual(v.subjects.map((s) => s.name), ["summary.json"]);
  assert.equal(v.predicate.request_id, run.requestId);
  // Bare bytes (one subject), a [name, bytes] pair, the receipt's JSON text, PEM bytes.
  await aj.verify(JSON.stringify(receipt), { publicKey: new TextEncoder().encode(pem), artifact: [["summary.json", artifact]] });
  await aj.verify(receipt, { publicKey: pem, artifact });
  const stdout = await c.logs(run.requestId, "stdout");
  assert.ok(stdout.sha256 && stdout.masked === 0);
  await aj.verify(receipt, { publicKey: pem, stdout: stdout.bytes });

  // A changed artifact byte, another key, a changed payload, a changed log: refused.
  const bad = artifact.slice();
  bad[2] ^= 1;
  await assert.rejects(aj.verify(receipt, { publicKey: pem, artifact: ["summary.json", bad] }), (e) => e instanceof aj.VerificationError && /does not match/.test(e.reason));
  const other = generateKeyPairSync("ed25519").publicKey.export({ type: "spki", format: "pem" });
  await assert.rejects(aj.verify(receipt, { publicKey: other, artifact }), /no signature verifies/);
  const rsa = generateKeyPairSync("rsa", { modulusLength: 1024 }).publicKey.export({ type: "spki", format: "pem" });
  await assert.rejects(aj.verify(receipt, { publicKey: rsa }), /not an Ed25519 key/);
  await assert.rejects(aj.verify(receipt, { publicKey: "nonsense" }), /not a PEM public key/);
  const p = receipt.payload;
  const i = p.length >> 1;
  const tampered = { ...receipt, payload: p.slice(0, i) + (p[i] === "A" ? "B" : "A") + p.slice(i + 1) };
  await assert.rejects(aj.verify(tampered, { publicKey: pem }), aj.VerificationError);
  const more = new Uint8Array([...stdout.bytes, 0x78]);
  await assert.rejects(aj.verify(receipt, { publicKey: pem, stdout: more }), /stdout log/);
  await assert.rejects(aj.verify(receipt, { publicKey: pem, artifact: ["other.json", "{}"] }), /not \(exactly one\) subject/);
  await assert.rejects(aj.verify({ ...receipt, payloadType: "x" }, { publicKey: pem }), /wrong payloadType/);
});

test("a failing run is a typed result with its stderr", live, async () => {
  const c = client();
  const data = await c.upload(await readFile(join(example(), "report.csv")), { name: "data.csv" });
  const failed = await c.run("summarize_csv", [data], { code: "import pandas_is_not_here\n" });
  assert.ok(!failed.ok && failed.finished);
  assert.equal(failed.status, "exit_nonzero");
  assert.equal(failed.exitCode, 1);
  assert.match(failed.stderrTail, /ModuleNotFoundError/);
  assert.throws(() => failed.raiseForStatus(), (e) => e instanceof aj.RunFailed && /ModuleNotFoundError/.test(e.stderrTail));
});

test("execute once: a request id runs once; generated ids are UUIDs", live, async () => {
  const c = client();
  const [data, code] = await summarize(c);
  const requestId = rid("once");
  const first = await c.run("summarize_csv", [data], { code, requestId });
  const again = await c.run("summarize_csv", [data], { code, requestId });
  assert.equal(again.record.job_id, first.record.job_id);
  await assert.rejects(c.run("summarize_csv", [data], { code: code + "\n", requestId }), (e) => e instanceof aj.Conflict && e.slug === "request-id-conflict");
  const a = await c.submit("py", [], { code: OUT });
  assert.match(a.requestId, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  assert.ok((await c.wait(a.requestId, { timeout: 60 })).ok);
});

const SLEEPS = "import time\nprint('started', flush=True)\ntime.sleep(60)\n";

test("wait times out; cancel ends a running run", live, async () => {
  const c = client();
  const run = await c.submit("py", [], { code: SLEEPS });
  assert.ok(!run.finished);
  await assert.rejects(c.wait(run.requestId, { timeout: 0.5 }), aj.WaitTimeout);
  // A deadline on run, waiting or following (onEvent): WaitTimeout; the run goes on.
  for (const onEvent of [undefined, () => {}]) {
    const requestId = rid("deadline");
    await assert.rejects(c.run("py", [], { code: SLEEPS, requestId, timeout: 0.5, onEvent }), aj.WaitTimeout);
    assert.equal((await c.cancel(requestId)).status, "cancelled");
  }
  for await (const ev of c.events(run.requestId)) if (ev.event === "stdout") break;
  assert.equal((await c.get(run.requestId)).status, "running");
  const cancelled = await c.cancel(run.requestId);
  assert.equal(cancelled.status, "cancelled");
  assert.match(cancelled.stdout, /started/);
  assert.equal((await c.cancel(run.requestId)).status, "cancelled");
  const done = await c.run("py", [], { code: "print(1)" });
  await assert.rejects(c.cancel(done.requestId), aj.Conflict);
});

test("list: filters and cursor pages as an async iterator", live, async () => {
  const c = client();
  const marker = rid("page");
  const ids = [];
  for (let n = 0; n < 5; n++) ids.push((await c.submit("py", [], { code: "print(1)", requestId: `${marker}-${n}` })).requestId);
  for (const id of ids) await c.wait(id, { timeout: 60 });
  const page = await c.listPage({ task: "py", limit: 2 });
  assert.equal(page.runs.length, 2);
  assert.ok(page.nextCursor);
  const seen = [];
  for await (const r of c.list({ task: "py", limit: 2 })) seen.push(r.request_id);
  assert.equal(new Set(seen).size, seen.length, "a run listed twice across pages");
  assert.deepEqual(seen.filter((i) => ids.includes(i)), ids.slice().reverse());
  for await (const r of c.list({ status: "ok", task: "py", limit: 100 })) assert.equal(r.status, "ok");
  await assert.rejects(c.listPage({ limit: 1000 }), (e) => e instanceof aj.BadRequest && e.status === 400);
});

test("errors are typed and carry the problem", live, async () => {
  const c = client();
  await assert.rejects(c.get(rid("no-such-run")), (e) => {
    assert.ok(e instanceof aj.NotFound);
    assert.equal(e.status, 404);
    assert.equal(e.type, "https://agentjail.dev/problems/not-found");
    assert.ok(e.title && e.detail);
    return true;
  });
  await assert.rejects(new aj.Client({ token: "wrong" }).get("x"), aj.Unauthorized);
  await assert.rejects(c.run("no_such_task", [], { code: "1" }), aj.NotFound);
  await assert.rejects(c.submit("py", [], { code: "1", requestId: ".." }), aj.BadRequest);
  await assert.rejects(new aj.Client({ baseUrl: "http://127.0.0.1:9" }).get("x"), aj.TransportError);
});

test("a full service is rate limited, then retried after Retry-After", live, async (t) => {
  const busy = process.env.AGENTJAIL_BUSY_URL;
  if (!busy) {
    if (process.env.CI) throw new Error("AGENTJAIL_BUSY_URL unset under CI");
    t.skip("no AGENTJAIL_BUSY_URL");
    return;
  }
  // The second service: one run slot, no queue.
  const c = new aj.Client({ baseUrl: busy, retries: 0 });
  const first = await c.submit("py", [], { code: SLEEPS });
  for await (const ev of c.events(first.requestId)) if (ev.event === "stdout") break;
  await assert.rejects(c.submit("py", [], { code: OUT }), (e) => {
    assert.ok(e instanceof aj.RateLimited);
    assert.equal(e.status, 429);
    assert.equal(e.slug, "overloaded");
    assert.equal(e.retryAfter, 5);
    return true;
  });
  // With retries, the same call waits for the slot (freed here after a second).
  setTimeout(() => { c.cancel(first.requestId).catch(() => undefined); }, 1000);
  const t0 = Date.now();
  const run = await new aj.Client({ baseUrl: busy, retries: 2 }).run("py", [], { code: OUT });
  assert.ok(run.ok, run.status);
  assert.ok(Date.now() - t0 >= 4000);
});

test("the same verdicts as `agentjail receipt verify`, case by case", live, async (t) => {
  const bin = process.env.AGENTJAIL_BIN;
  if (!bin) {
    if (process.env.CI) throw new Error("AGENTJAIL_BIN unset under CI");
    t.skip("no AGENTJAIL_BIN");
    return;
  }
  const { execFileSync } = await import("node:child_process");
  const { mkdtempSync, writeFileSync, mkdirSync } = await import("node:fs");
  const { tmpdir } = await import("node:os");
  const c = client();
  const [, , run] = await summarize(c);
  const receipt = await c.receipt(run.requestId);
  const artifact = await c.artifact(run.requestId);
  const stdout = (await c.logs(run.requestId, "stdout")).bytes;
  const pem = await text(process.env.AGENTJAIL_PUBKEY);
  const dir = mkdtempSync(join(tmpdir(), "verdicts-"));
  const put = (name, data) => { const p = join(dir, name); writeFileSync(p, data); return p; };
  mkdirSync(join(dir, "bad"));
  const bad = artifact.slice();
  bad[2] ^= 1;
  const other = generateKeyPairSync("ed25519").publicKey.export({ type: "spki", format: "pem" });
  const p = receipt.payload;
  const i = p.length >> 1;
  const tampered = { ...receipt, payload: p.slice(0, i) + (p[i] === "A" ? "B" : "A") + p.slice(i + 1) };
  const cases = [
    ["good", receipt, artifact, "summary.json", pem, stdout],
    ["a changed artifact", receipt, bad, "bad/summary.json", pem, undefined],
    ["another key", receipt, artifact, "summary.json", other, undefined],
    ["a changed payload", tampered, undefined, undefined, pem, undefined],
    ["a changed log", receipt, undefined, undefined, pem, new Uint8Array([...stdout, 0x78])],
  ];
  for (const [what, r, art, artName, key, log] of cases) {
    const args = ["receipt", "verify", put(`${what}.json`, JSON.stringify(r)), "--pubkey", put(`${what}.pem`, key)];
    const ours = { publicKey: key };
    if (art) {
      args.push("--artifact", put(artName, art));
      ours.artifact = new File([art], "summary.json");
    }
    if (log) {
      args.push("--stdout", put(`${what}.log`, log));
      ours.stdout = log;
    }
    let cli = true;
    try { execFileSync(bin, args, { stdio: "pipe" }); } catch { cli = false; }
    const mine = await aj.verify(r, ours).then(() => true, () => false);
    assert.equal(mine, cli, `${what}: verify says ${mine}, the CLI ${cli}`);
    assert.equal(mine, what === "good", what);
  }
});
