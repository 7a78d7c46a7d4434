"""Drives agentjail's MCP server with the official Python MCP SDK (`mcp` on PyPI).

Run by crates/cli/tests/mcp.rs, over stdio (the SDK launches `agentjail mcp`) or over
Streamable HTTP (`agentjail serve`'s /mcp with a bearer token). Every check failure raises;
the last stdout line is `RESULT {json}` for the Rust test. A readable transcript of the
session (requests and what came back) is written with --transcript.

Scenarios: list tools (schemas, annotations), upload a CSV, run summarize_csv with
model-proposed code (verified summary as structuredContent), replay by request_id, a policy
denial (isError), a task the actor may not use (isError), invalid arguments (-32602), a
timeout (isError naming the limit), and a cancelled call whose sandbox is gone afterwards.
"""

import argparse
import json
import os
import sys
import time
import uuid

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

SUMMARIZE = open(os.path.join(os.path.dirname(__file__), "../../../../examples/csv-summary/summarize.py")).read()
CSV = "region,units,price\nnorth,12,2.5\nsouth,7,3.0\neast,,4.0\n"

log_lines = []


def log(*parts):
    line = " ".join(str(p) for p in parts)
    log_lines.append(line)
    print(line, file=sys.stderr, flush=True)


def short(v, n=600):
    s = json.dumps(v, sort_keys=True) if not isinstance(v, str) else v
    return s if len(s) <= n else s[:n] + f"... ({len(s)} chars)"


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def marker_pids(marker):
    """Pids whose command line contains `marker` (the sandbox's processes are visible from here)."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(d))
        except OSError:
            pass
    return found


async def call(client, name, args, **kw):
    log(f"> tools/call {name} {short({k: (v if k != 'code' else f'<{len(v)} chars of code>') for k, v in args.items()}, 300)}")
    r = await client.call_tool(name, args, **kw)
    log(f"< isError={r.is_error} structuredContent={short(r.structured_content)}")
    for c in r.content:
        if getattr(c, "type", "") == "text" and r.is_error:
            log(f"< text: {short(c.text, 400)}")
    if r.meta:
        log(f"< _meta={short(r.meta, 300)}")
    return r


async def scenarios(client, out):
    info = client.initialize_result if hasattr(client, "initialize_result") else None
    log("# connected", short(getattr(info, "server_info", None).model_dump() if info and getattr(info, "server_info", None) else "", 200))

    # 1. Tools from the catalogue, for this actor.
    log("> tools/list")
    tools = {t.name: t for t in (await client.list_tools()).tools}
    log("< tools:", sorted(tools))
    out["tools"] = sorted(tools)
    s = tools["summarize_csv"]
    check(s.input_schema["required"] == ["input_id", "code"], f"summarize_csv required: {s.input_schema}")
    check(s.input_schema.get("additionalProperties") is False, "closed input schema")
    check("request_id" in s.input_schema["properties"], "request_id property")
    check(s.output_schema and s.output_schema.get("title") == "CSV summary", f"output schema {s.output_schema}")
    a = s.annotations
    check(a.read_only_hint is True and a.destructive_hint is False and a.idempotent_hint is True and a.open_world_hint is False, f"annotations {a}")
    check("admin_only" not in tools, "a task the actor may not use is not listed")
    check(tools["upload_input"].annotations.read_only_hint is False, "upload_input is not read-only")
    check(tools["get_run"].annotations.read_only_hint is True, "get_run is read-only")
    log("  summarize_csv inputSchema:", short(s.input_schema, 2000))
    log("  summarize_csv annotations:", short(a.model_dump(exclude_none=True)))

    # 2. Upload a CSV.
    up = await call(client, "upload_input", {"name": "report.csv", "media_type": "text/csv", "text": CSV})
    check(not up.is_error, "upload ok")
    input_id = up.structured_content["input_id"]
    check(input_id.startswith("in_"), "input id")

    # 3. Model-proposed code; the verified summary comes back as structuredContent.
    rid = f"sum-{uuid.uuid4().hex[:8]}"
    r = await call(client, "summarize_csv", {"input_id": input_id, "code": SUMMARIZE, "request_id": rid})
    check(not r.is_error, "summarize ok")
    summary = r.structured_content
    check(summary["rows"] == 3 and summary["columns"] == ["region", "units", "price"], f"summary {summary}")
    check(summary["numeric"]["units"]["sum"] == 19, f"units sum {summary}")
    check(json.loads(r.content[0].text) == summary, "the text block is the same JSON")
    check(r.meta["dev.agentjail/run"]["status"] == "ok", "meta status")
    out["summary"] = summary

    # 4. Execute-once: the same request_id and arguments return the recorded run.
    r2 = await call(client, "summarize_csv", {"input_id": input_id, "code": SUMMARIZE, "request_id": rid})
    check(r2.structured_content == summary and r2.meta["dev.agentjail/run"]["job_id"] == r.meta["dev.agentjail/run"]["job_id"], "replay")

    # 5. Policy denial: the task accepts text/csv only.
    txt = await call(client, "upload_input", {"name": "notes.txt", "media_type": "text/plain", "text": "hello"})
    d = await call(client, "summarize_csv", {"input_id": txt.structured_content["input_id"], "code": SUMMARIZE})
    # Error results carry no structuredContent (it would not match the outputSchema); the
    # cause is in the text and in _meta["dev.agentjail/error"].
    check(d.is_error and d.structured_content is None and d.meta["dev.agentjail/error"]["error"] == "input-mismatch", f"denial {d.meta}")
    check("text/plain" in d.content[0].text and "text/csv" in d.content[0].text, "the reason names the media types")

    # 6. A task this actor may not use: denied by policy, as a tool error.
    f = await call(client, "admin_only", {"input_id": input_id})
    check(f.is_error and f.structured_content is None and f.meta["dev.agentjail/error"]["error"] == "forbidden", f"forbidden {f.meta}")

    # 7. Invalid arguments are a protocol error (-32602).
    for bad in ({"input_id": "/etc/passwd", "code": "x"}, {"input_id": input_id, "code": "x", "limits": {"seconds": 999}}):
        try:
            await call(client, "summarize_csv", bad)
            raise AssertionError(f"invalid arguments accepted: {bad}")
        except MCPError as e:
            log(f"< error {e.code}: {short(e.error.message, 300)}")
            check(e.code == -32602, f"code {e.code}")
    out["invalid_params"] = True

    # 8. Code that runs past the task's limit: isError naming the limit.
    t = await call(client, "summarize_csv", {"input_id": input_id, "code": "import time\ntime.sleep(60)\n"})
    check(t.is_error and t.structured_content is None and t.meta["dev.agentjail/error"]["status"] == "timeout", f"timeout {t.meta}")
    check("time limit of 2 s" in t.content[0].text, f"timeout text {t.content[0].text}")

    # 9. Cancel a running call: the sandbox (every process of the run) must be gone.
    marker = f"agentjail-mcp-cancel-{uuid.uuid4().hex}"
    code = (
        "import subprocess, time\n"
        f"subprocess.Popen(['/usr/bin/python3', '-c', 'import time; time.sleep(600)', '{marker}'])\n"
        "time.sleep(600)\n"
    )
    crid = f"cancel-{uuid.uuid4().hex[:8]}"
    progress = []

    async def on_progress(p, total, message):
        progress.append((p, total, message))

    seen = []
    async with anyio.create_task_group() as tg:
        async def long_call():
            await call(client, "sleepy", {"code": code, "request_id": crid}, progress_callback=on_progress)

        with anyio.CancelScope() as scope:
            tg.start_soon(long_call)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not seen:
                seen = marker_pids(marker)
                await anyio.sleep(0.1)
            check(seen, "the sandboxed process started")
            log(f"# sandbox process with the marker is running: pids {seen}; waiting for progress, then cancelling")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not progress:
                await anyio.sleep(0.1)
            tg.cancel_scope.cancel()
    log(f"# progress notifications received: {len(progress)}; first: {progress[:1]}")
    check(progress, "progress notifications")
    deadline = time.monotonic() + 15
    left = seen
    while time.monotonic() < deadline and left:
        await anyio.sleep(0.1)
        left = marker_pids(marker)
    log(f"# after cancellation, processes with the marker: {left}")
    check(not left, f"sandbox processes survived the cancellation: {left}")
    status = None
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        g = await call(client, "get_run", {"request_id": crid})
        status = g.structured_content["status"]
        if status not in ("queued", "running"):
            break
        await anyio.sleep(0.2)
    check(status == "cancelled", f"cancelled run recorded as {status}")
    out["cancelled"] = {"pids": seen, "status": status, "progress": len(progress)}


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--transport", choices=["stdio", "http"], required=True)
    ap.add_argument("--bin")
    ap.add_argument("--config")
    ap.add_argument("--data-dir")
    ap.add_argument("--token-file")
    ap.add_argument("--url")
    ap.add_argument("--mode", default="auto")
    ap.add_argument("--transcript")
    a = ap.parse_args()
    out = {"transport": a.transport, "mode": a.mode}
    if a.transport == "stdio":
        server = StdioServerParameters(
            command=a.bin,
            args=["mcp", "--config", a.config, "--data-dir", a.data_dir, "--tenant", "acme", "--actor", "alice", "--token-file", a.token_file],
            env={"AGENTJAIL_LOG": "info"},
        )
        log(f"# stdio: {a.bin} mcp --config CONFIG --data-dir DIR --tenant acme --actor alice --token-file FILE")
    else:
        token = open(a.token_file).read().strip()
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        server = streamable_http_client(a.url, http_client=http)
        log(f"# http: {a.url} with Authorization: Bearer <token>")
    async with Client(server, mode=a.mode) as client:
        await scenarios(client, out)
    if a.transcript:
        with open(a.transcript, "w") as f:
            f.write("\n".join(log_lines) + "\n")
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    anyio.run(main)
