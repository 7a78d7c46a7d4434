// The committed src/models.ts is what the pinned openapi-typescript makes of this service's
// /openapi.json: a drift (the document changed) fails here; run `npm run generate -- URL`.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { generate } from "../scripts/generate.mjs";
import * as aj from "../dist/index.js";
import { live } from "./helpers.mjs";

test("the models are generated from this service's document", live, async () => {
  const doc = await new aj.Client().openapi();
  const committed = await readFile(new URL("../src/models.ts", import.meta.url), "utf8");
  const fresh = await generate(doc);
  assert.ok(fresh === committed, "src/models.ts differs from what this service's /openapi.json generates: run `npm run generate -- $AGENTJAIL_URL/openapi.json` in clients/typescript");
});
