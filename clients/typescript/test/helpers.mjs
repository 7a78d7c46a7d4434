// The suite runs against a real `agentjail serve` started by crates/cli/tests/client_typescript.rs,
// which sets AGENTJAIL_URL, AGENTJAIL_TOKEN, AGENTJAIL_PUBKEY (PEM file), AGENTJAIL_EXAMPLE
// (examples/csv-summary), AGENTJAIL_BIN, AGENTJAIL_STORE (`sqlite` or `postgres`). Without them, every test is skipped, but under CI.
import { randomUUID } from "node:crypto";

const NEEDED = ["AGENTJAIL_URL", "AGENTJAIL_TOKEN", "AGENTJAIL_PUBKEY", "AGENTJAIL_EXAMPLE"];
const missing = NEEDED.filter((v) => !process.env[v]);
if (missing.length && process.env.CI) {
  throw new Error(`prerequisite missing under CI: ${missing.join(", ")} unset (run crates/cli/tests/client_typescript.rs)`);
}
/** Options for `test(...)`: skipped when there is no service to test against. */
export const live = missing.length ? { skip: `no agentjail serve (${missing.join(", ")} unset)` } : {};
export const rid = (prefix) => `${prefix}-${randomUUID().slice(0, 12)}`;
/** Sessions need the SQLite store: on the PostgreSQL pass every session call fails typed. */
export const POSTGRES = process.env.AGENTJAIL_STORE === "postgres";
export const OUT = "import json\njson.dump({}, open('/output/o.json', 'w'))\n";
