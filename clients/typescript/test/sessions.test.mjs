// Sessions: cells share /work, a retried step runs once, the receipt chain verifies offline,
// fork, close then cell is SessionClosed, `await using`.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as aj from "../dist/index.js";
import { text } from "../dist/node.js";
import { live, rid, OUT } from "./helpers.mjs";

test("cells share /work, retry safely and chain their receipts", live, async () => {
  const c = new aj.Client();
  const pem = await text(process.env.AGENTJAIL_PUBKEY);
  const opened = rid("sess");
  const s = await c.session("py", [], { requestId: opened });
  assert.match(s.sessionId, /^ses_/);
  assert.equal(s.state, "open");
  assert.equal((await c.session("py", [], { requestId: opened })).sessionId, s.sessionId);

  const step1 = "open('/work/notes.txt', 'w').write('from cell 0')\nprint('wrote')\n" + OUT;
  const c0 = await s.run(step1, { requestId: "step-1" });
  assert.ok(c0 instanceof aj.Cell && c0.ok, c0.stderrTail);
  assert.equal(c0.cell, 0);
  assert.equal(c0.cellRequestId, "step-1");
  assert.equal(c0.requestId, `${s.sessionId}-0`);
  assert.ok(!c0.workspace.before && c0.workspace.after);
  // A retry of the same step: the recorded cell, nothing runs again.
  const again = await s.run(step1, { requestId: "step-1" });
  assert.equal(again.cell, 0);
  assert.equal(again.record.job_id, c0.record.job_id);
  await assert.rejects(s.run("print(2)\n" + OUT, { requestId: "step-1" }), (e) => e instanceof aj.Conflict && e.slug === "request-id-conflict");

  const c1 = await s.run("print(open('/work/notes.txt').read())\n" + OUT);
  assert.ok(c1.ok && c1.cell === 1);
  assert.equal(c1.stdout.trim(), "from cell 0");
  assert.equal(c1.workspace.before, c0.workspace.after);

  const listed = [];
  for await (const cell of s.cells({ pageSize: 1 })) listed.push(cell);
  assert.deepEqual(listed.map((x) => x.cell), [0, 1]);
  assert.equal((await s.refresh()).record.cells, 2);

  // The chain verifies offline; out of order or cut, it does not.
  const verified = await s.verifyChain(pem);
  assert.deepEqual(verified.map((v) => v.predicate.session.cell), [0, 1]);
  const receipts = listed.map((x) => x.receipt);
  assert.equal(verified[1].predicate.session.previous_receipt_sha256, await aj.receiptDigest(await c.receipt(listed[0].requestId)));
  await assert.rejects(aj.verifySession([receipts[1], receipts[0]], { publicKey: pem }), aj.VerificationError);
  await assert.rejects(aj.verifySession(receipts.slice(1), { publicKey: pem }), /names cell 1/);
  await assert.rejects(aj.verifySession([null, receipts[1]], { publicKey: pem }), /previous receipt/);

  // A fork from cell 0 starts from what cell 0 left; its chain starts at cell 0's receipt.
  const forked = await s.fork({ cell: 0 });
  assert.notEqual(forked.sessionId, s.sessionId);
  const f0 = await forked.run("print(open('/work/notes.txt').read())\n" + OUT);
  assert.ok(f0.ok && f0.cell === 0 && f0.stdout.trim() === "from cell 0");
  await forked.verifyChain(pem, { previous: await aj.receiptDigest(receipts[0]) });
  await forked.close();

  await s.close();
  assert.equal(s.state, "closed");
  await s.close(); // idempotent
  await assert.rejects(s.run(OUT), (e) => e instanceof aj.SessionClosed && e.status === 409);
  await assert.rejects(c.getSession("ses_00000000000000000000000000000000"), aj.NotFound);
});

test("a session is async-disposable (`await using s = await client.session(...)` in TypeScript)", live, async () => {
  // Node 20's JavaScript has no `await using` syntax: what it calls, by hand.
  const c = new aj.Client();
  const s = await c.session("py");
  try {
    assert.ok((await s.run(OUT)).ok);
  } finally {
    await s[Symbol.asyncDispose]();
  }
  assert.equal((await c.getSession(s.sessionId)).state, "closed");
});

test("a live session's cells have receipts of their own that chain", live, async () => {
  const c = new aj.Client();
  const pem = await text(process.env.AGENTJAIL_PUBKEY);
  const s = await c.session("py_live", [], { requestId: rid("live") });
  try {
    const code = "x = 21\nprint(x)\n";
    const c0 = await s.run(code);
    const c1 = await s.run("print(x * 2)\n");
    assert.ok(c0.ok && c1.ok, c1.stderrTail);
    assert.equal(c1.stdout.trim(), "42");
    // A checkpoint on request (on the fleet, by the worker holding the interpreter): the
    // interpreter keeps its variables.
    const sha = await s.checkpoint();
    assert.match(sha, /^sha256:/);
    const c2 = await s.run("print(x)\n");
    assert.equal(c2.stdout.trim(), "21");
    const verified = await s.verifyChain(pem);
    assert.deepEqual(verified.map((v) => [v.isLiveCell, v.predicate.interpreter.state]), [[true, "started"], [true, "kept"], [true, "kept"]]);
    assert.equal(verified[2].predicate.session_head, sha);
    const one = await aj.verify(c0.receipt, { publicKey: pem, artifact: ["code.py", code], stdout: c0.stdout, liveCell: true });
    assert.equal(one.status, "ok");
    // Never taken for a run's receipt unless asked for.
    await assert.rejects(aj.verify(c0.receipt, { publicKey: pem, artifact: ["code.py", code] }), /liveCell: true/);
    await assert.rejects(aj.verify(c0.receipt, { publicKey: pem, artifact: ["code.py", "print(1)\n"], liveCell: true }), aj.VerificationError);
    await assert.rejects(aj.verify(c0.receipt, { publicKey: pem, workspace: "", liveCell: true }), /no digest of the workspace/);
  } finally {
    await s.close();
  }
});
