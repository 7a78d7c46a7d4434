// Live events: the iterator, the callback, the one-request submit (`onEvent`), resume with
// Last-Event-ID, and a connection cut for real (a loopback proxy) resumed without loss or repeat.
import { test } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";
import * as aj from "../dist/index.js";
import { live, rid } from "./helpers.mjs";

// Prints numbered lines over ~3 s, on stdout and stderr, then writes its output.
const TALKS = `
import json, sys, time
for i in range(30):
    print("line %03d" % i, flush=True)
    if i % 10 == 0:
        print("err %03d" % i, file=sys.stderr, flush=True)
    time.sleep(0.1)
json.dump({"lines": 30}, open("/output/o.json", "w"))
`;
const EXPECTED = Array.from({ length: 30 }, (_, i) => `line ${String(i).padStart(3, "0")}\n`).join("");
const EXPECTED_ERR = [0, 10, 20].map((i) => `err ${String(i).padStart(3, "0")}\n`).join("");
const textOf = (events, stream) => events.filter((e) => e.event === stream).map((e) => e.data.text).join("");

test("the iterator gets chunks before ended", live, async () => {
  const c = new aj.Client();
  const run = await c.submit("py", [], { code: TALKS });
  const events = [];
  for await (const ev of c.events(run.requestId)) events.push(ev);
  const kinds = events.map((e) => e.event);
  assert.equal(kinds[0], "queued");
  assert.equal(kinds.at(-1), "ended");
  assert.equal(kinds.filter((k) => k === "ended").length, 1);
  assert.ok(kinds.indexOf("started") < kinds.indexOf("stdout"));
  assert.ok(kinds.indexOf("stdout") < kinds.indexOf("ended"));
  assert.equal(textOf(events, "stdout"), EXPECTED);
  assert.equal(textOf(events, "stderr"), EXPECTED_ERR);
  let at = 0;
  for (const e of events.filter((e) => e.event === "stdout")) {
    assert.equal(e.data.offset, at);
    assert.equal(e.data.untrusted, true);
    at += e.data.bytes;
  }
  const final = new aj.Run(events.at(-1).data);
  assert.ok(final.ok);
  assert.deepEqual(final.artifact, { lines: 30 });
  assert.equal((await c.logs(run.requestId)).text, EXPECTED);
});

test("a callback follows to the end", live, async () => {
  const c = new aj.Client();
  const run = await c.submit("py", [], { code: TALKS });
  const seen = [];
  const final = await c.follow(run.requestId, (e) => { seen.push(e); });
  assert.ok(final.ok && final.requestId === run.requestId);
  assert.equal(textOf(seen, "stdout"), EXPECTED);
  assert.equal(seen.at(-1).event, "ended");
});

test("run with onEvent submits and follows in one request", live, async () => {
  const c = new aj.Client();
  const requestId = rid("onevent");
  const seen = [];
  const run = await c.run("py", [], { code: TALKS, requestId, onEvent: (e) => { seen.push(e); } });
  assert.ok(run.ok, run.status);
  assert.equal(run.requestId, requestId);
  assert.equal(seen[0].event, "queued");
  assert.equal(seen.at(-1).event, "ended");
  assert.equal(textOf(seen, "stdout"), EXPECTED);
  // The same request again is a replay: the recorded run's events, nothing runs twice.
  const replay = [];
  const again = await c.run("py", [], { code: TALKS, requestId, onEvent: (e) => { replay.push(e); } });
  assert.equal(again.record.job_id, run.record.job_id);
  assert.equal(textOf(replay, "stdout"), EXPECTED);
});

test("resume with Last-Event-ID loses and repeats nothing", live, async () => {
  const c = new aj.Client();
  const run = await c.submit("py", [], { code: TALKS });
  const first = [];
  for await (const ev of c.events(run.requestId)) {
    first.push(ev);
    if (ev.event === "stdout" && textOf(first, "stdout").length >= 27) break;
  }
  assert.equal(first.at(-1).event, "stdout");
  const rest = [];
  for await (const ev of c.events(run.requestId, { lastEventId: first.at(-1).id })) rest.push(ev);
  assert.notEqual(rest[0].event, "queued", "resumed from the start");
  const both = first.concat(rest);
  assert.equal(textOf(both, "stdout"), EXPECTED);
  assert.equal(textOf(both, "stderr"), EXPECTED_ERR);
  assert.equal(both.filter((e) => e.event === "ended").length, 1);
});

/** A loopback proxy to `upstream` that cuts each of its first `cuts` connections after `after` bytes of answer. */
function cuttingProxy(upstream, cuts, after) {
  const u = new URL(upstream);
  const state = { connections: 0 };
  const server = net.createServer((client) => {
    const n = state.connections++;
    const up = net.connect(Number(u.port), u.hostname);
    client.pipe(up);
    let sent = 0;
    up.on("data", (chunk) => {
      if (n < cuts && sent + chunk.length > after) {
        client.write(chunk.subarray(0, Math.max(0, after - sent)));
        client.destroy();
        up.destroy();
        return;
      }
      sent += chunk.length;
      client.write(chunk);
    });
    up.on("end", () => client.end());
    up.on("error", () => client.destroy());
    client.on("error", () => up.destroy());
    client.on("close", () => up.destroy());
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => {
    resolve({ url: `http://127.0.0.1:${server.address().port}`, state, close: () => server.close() });
  }));
}

test("a dropped connection is resumed", live, async () => {
  const c = new aj.Client();
  const proxy = await cuttingProxy(c.baseUrl, 3, 600);
  try {
    const through = new aj.Client({ baseUrl: proxy.url });
    const run = await c.submit("py", [], { code: TALKS });
    const events = [];
    for await (const ev of through.events(run.requestId)) events.push(ev);
    assert.ok(proxy.state.connections >= 4, "no connection was cut");
    assert.equal(textOf(events, "stdout"), EXPECTED);
    assert.equal(textOf(events, "stderr"), EXPECTED_ERR);
    const kinds = events.map((e) => e.event);
    assert.equal(kinds.filter((k) => k === "queued").length, 1);
    assert.equal(kinds.filter((k) => k === "ended").length, 1);
    assert.equal(kinds.at(-1), "ended");
  } finally {
    proxy.close();
  }
});

test("events of an unknown run is NotFound", live, async () => {
  const c = new aj.Client();
  await assert.rejects(async () => { for await (const _ of c.events(rid("no-such-run"))) { /* nothing */ } }, aj.NotFound);
});

test("a one-request submit whose connection is cut is resumed, and runs once", live, async () => {
  const c = new aj.Client();
  // Cut before the first event (the submit is sent again: a replay), then mid-stream (resumed
  // with `GET …/events` and the last id).
  for (const after of [0, 600]) {
    const proxy = await cuttingProxy(c.baseUrl, 1, after);
    try {
      const requestId = rid(`cut-${after}`);
      const seen = [];
      const run = await new aj.Client({ baseUrl: proxy.url }).run("py", [], { code: TALKS, requestId, onEvent: (e) => { seen.push(e); } });
      assert.ok(proxy.state.connections >= 2, "no connection was cut");
      assert.ok(run.ok, run.status);
      assert.equal(textOf(seen, "stdout"), EXPECTED);
      assert.equal(seen.filter((e) => e.event === "ended").length, 1);
      const runs = [];
      for await (const r of c.list({ task: "py", limit: 100 })) if (r.request_id === requestId) runs.push(r);
      assert.equal(runs.length, 1);
    } finally {
      proxy.close();
    }
  }
});
