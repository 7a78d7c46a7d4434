// A strict TypeScript consumer of the installed package: crates/cli/tests/client_typescript.rs
// type-checks it (never runs it) in the folder the packed tarball was installed into.
import { Client, verify, RateLimited, type RunRecord, type RunEvent } from "agentjail";
import { file } from "agentjail/node";
const client = new Client({ baseUrl: "http://127.0.0.1:1", token: "t" });
export async function main(): Promise<string> {
  await using s = await client.session("py");
  const cell = await s.run("print(1)", { requestId: "step-1" });
  const r: RunRecord = cell.record;
  const seen: RunEvent[] = [];
  const run = await client.run("summarize_csv", [await client.upload(await file("x.csv"))], { code: "", onEvent: (e) => { seen.push(e); } });
  const v = await verify(run.receipt ?? {}, { publicKey: "", artifact: ["summary.json", new Uint8Array()] });
  try { await client.get("x"); } catch (e) { if (e instanceof RateLimited) return String(e.retryAfter); }
  return r.status + v.keyid + (v.status ?? "");
}
