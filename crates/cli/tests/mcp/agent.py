"""A naive agent on the official Python MCP SDK: it knows nothing about agentjail but what
tools/list and the call results say. Run by crates/cli/tests/mcp.rs over stdio.

It names its CSV by path (the upload_input description says it may, under --input-root),
then writes what a model often writes first (pandas), reads the failed result, and fixes the
code from what the result and the description say (the fix is scripted, but chosen only by
text found in them; each such text is asserted present). The SDK checks the final
structuredContent against the tool's outputSchema. The last stdout line is `RESULT {json}`.
"""

import argparse
import json
import re
import sys

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

FIRST_TRY = """
import json, sys
import pandas as pd
df = pd.read_csv(sys.argv[1])
json.dump({"rows": len(df), "columns": list(df.columns), "numeric": {}}, open(sys.argv[2], "w"))
"""

# What the agent writes once it knows that only the standard library is there. ROWS is how
# it computes the row count; the schema-error fix below changes it.
STDLIB = """
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1], newline="")))
cols = list(rows[0].keys()) if rows else []
json.dump({"rows": ROWS, "columns": cols, "numeric": {}}, open(sys.argv[2], "w"))
"""


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def text_of(r):
    return "\n".join(c.text for c in r.content if getattr(c, "type", "") == "text")


async def agent(client, csv_path, out):
    tools = {t.name: t for t in (await client.list_tools()).tools}
    task = tools["summarize_csv"]
    desc = task.description
    print("description:", desc, file=sys.stderr)
    # Where to put the result, from the description's output shape.
    m = re.search(r"Output: write (/output/\S+?):", desc)
    check(m, f"the description names the output path: {desc}")
    out["output_path"] = m.group(1)

    # Input: by path when the upload tool says it can read the operator's directories.
    up_tool = tools["upload_input"]
    if "path" in up_tool.input_schema.get("properties", {}):
        up = await client.call_tool("upload_input", {"media_type": "text/csv", "path": csv_path})
        out["uploaded_by_path"] = True
    else:
        up = await client.call_tool("upload_input", {"media_type": "text/csv", "text": open(csv_path).read()})
    check(not up.is_error, f"upload: {text_of(up)}")
    input_id = up.structured_content["input_id"]

    # Two independent tasks, each starting from a typical first mistake; each must be fixed by
    # the second attempt.
    out["pandas"] = await loop(client, desc, input_id, FIRST_TRY, "pandas")
    out["shape"] = await loop(client, desc, input_id, STDLIB.replace("ROWS", "str(len(rows))"), "shape")


async def loop(client, desc, input_id, code, tag):
    out = {}
    for attempt in range(1, 3):
        r = await client.call_tool("summarize_csv", {"input_id": input_id, "code": code, "request_id": f"naive-{tag}-{attempt}"})
        said = text_of(r)
        print(f"{tag} attempt {attempt}: is_error={r.is_error}\n{said[:1500]}", file=sys.stderr)
        if not r.is_error:
            out["result"] = r.structured_content
            out["meta"] = r.meta["dev.agentjail/run"]
            out["attempts"] = attempt
            return out
        err = (r.meta or {}).get("dev.agentjail/error", {})
        missing = re.search(r"ModuleNotFoundError: No module named '(\w+)'", said)
        errs = [e for e in err.get("schema_errors") or [] if e.get("path", "").startswith("/")]
        if missing:
            # The runtime line says what there is instead.
            check("standard library" in desc and missing.group(1) in desc, f"the description explains it: {desc}")
            out["read"] = missing.group(0)
            code = STDLIB.replace("ROWS", "len(rows)")
        elif errs:
            e = errs[0]
            field = e["path"].lstrip("/")
            check(f"/{field}" in said, f"the text names the field too: {said}")
            out["read"] = e
            if "integer" in e.get("message", ""):
                code = code.replace(f"\"{field}\": str(len(rows))", f"\"{field}\": len(rows)")
        else:
            raise AssertionError(f"nothing in the result to act on: {said} {err}")
    raise AssertionError(f"{tag}: no verified result by the second attempt: {out}")


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--input-root", required=True)
    ap.add_argument("--csv", required=True)
    a = ap.parse_args()
    server = StdioServerParameters(
        command=a.bin,
        args=["mcp", "--config", a.config, "--data-dir", a.data_dir, "--tenant", "acme", "--actor", "alice",
              "--token-file", a.token_file, "--input-root", a.input_root],
        env={"AGENTJAIL_LOG": "warn"},
    )
    out = {}
    async with Client(server, mode="legacy") as client:
        await agent(client, a.csv, out)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    anyio.run(main)
