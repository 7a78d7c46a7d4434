// Offline units: the SSE decoder, resume bookkeeping, canonical JSON, typed errors.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as aj from "../dist/index.js";

test("the decoder skips comments and joins data lines", () => {
  const d = new aj.SSEDecoder();
  const out = [":keep-alive", "event: stdout", "id: 1.0.0.0", "data: {\"a\":", "data: 1}", ""].map((l) => d.line(l));
  assert.deepEqual(out.at(-1), ["stdout", "1.0.0.0", "{\"a\":\n1}"]);
  assert.deepEqual(out.slice(0, -1).filter(Boolean), []);
});

test("a resumed stream hands out each chunk once, and a gap is an error", () => {
  const f = new aj.Follower("r", "2.5.0.0", 3);
  assert.deepEqual(f.offsets, { stdout: 5, stderr: 0 });
  const feed = (lines) => lines.map((l) => f.line(l)).filter(Boolean);
  assert.equal(feed(["event: stdout", "id: 2.5.0.0", 'data: {"offset":0,"bytes":5,"text":"hello"}', ""]).length, 0);
  const [ev] = feed(["event: stdout", "id: 2.8.0.0", 'data: {"offset":5,"bytes":3,"text":"abc"}', ""]);
  assert.equal(ev.data.text, "abc");
  assert.equal(f.lastEventId, "2.8.0.0");
  assert.throws(() => feed(["event: stdout", 'data: {"offset":10,"bytes":1,"text":"x"}', ""]), aj.StreamError);
});

test("reconnects are bounded and API errors are not retried", () => {
  const f = new aj.Follower("r", undefined, 1);
  f.dropped(new Error("cut"));
  assert.throws(() => f.dropped(new Error("cut")), aj.StreamError);
  assert.throws(() => new aj.Follower("r", undefined, 5).dropped(new aj.NotFound(404, {})), aj.NotFound);
});

test("RFC 8785 canonical JSON", () => {
  const s = (v) => new TextDecoder().decode(aj.canonicalJson(v));
  assert.equal(s({ b: 1, a: [true, null, "é\n"], "\u20ac": 1, "\u{1F600}": 2 }), '{"a":[true,null,"é\\n"],"b":1,"€":1,"😀":2}');
  assert.equal(s(1e21), "1e+21");
  assert.equal(s(4.0), "4");
  assert.equal(s([1e-5, 1e-7, 0.1]), "[0.00001,1e-7,0.1]");
});

test("problems map to typed errors", () => {
  const e = aj.errorFor(409, { type: "https://agentjail.dev/problems/session-closed", title: "t", detail: "d", status: 409 });
  assert.ok(e instanceof aj.SessionClosed && e instanceof aj.Conflict && e instanceof aj.APIError);
  assert.equal(e.slug, "session-closed");
  const r = aj.errorFor(429, { type: "https://agentjail.dev/problems/overloaded" }, new Headers({ "retry-after": "5" }));
  assert.ok(r instanceof aj.RateLimited);
  assert.equal(r.retryAfter, 5);
  assert.ok(aj.errorFor(501, { type: "https://agentjail.dev/problems/sessions-unsupported" }) instanceof aj.SessionsUnsupported);
});
