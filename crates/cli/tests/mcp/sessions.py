"""Sessions over MCP, driven with the official Python MCP SDK (`mcp` on PyPI).

Run by crates/cli/tests/mcp_sessions.rs, over stdio (the SDK launches `agentjail mcp`) or over
Streamable HTTP (`agentjail serve`'s /mcp with a bearer token; --other-token-file: a second
actor of the same tenant). Every check failure raises; the last stdout line is
`RESULT {json}` for the Rust test; --transcript writes what was sent and what came back.

Scenarios: tools/list has session_open, session_run and session_close with their input
schemas; a session is opened; cell 0 writes /work/x (live progress received), cell 1 reads it
back, a variable of cell 0 is gone in cell 2 (NameError in the untrusted stderr); a repeated
call with the same step_id runs once, and so does a repeated call without one (the derived
step id); session_get lists the cells with their status; session_fork from a given cell starts a
new session from the /work that cell left (a later file absent), from the head with all of it,
and the original is unchanged by what the fork writes; a repeated fork with the same request_id
is the same session; a closed session cannot be forked; after session_close a cell is refused with a readable error; over HTTP, the other
actor's call (run, get, fork, close) with this session id is refused exactly as one with a missing id.
"""

import argparse
import json
import secrets
import sys

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

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


def code(body):
    """A cell's code: `body`, then the task's output (so that the cell ends ok)."""
    return body + "\nimport json as _j\n_j.dump({'ok': 1}, open('/output/o.json', 'w'))\n"


def texts(r):
    return "\n".join(c.text for c in r.content if getattr(c, "type", "") == "text")


async def call(client, name, args, **kw):
    log(f"> tools/call {name} {short(args, 400)}")
    r = await client.call_tool(name, args, **kw)
    log(f"< isError={r.is_error} structuredContent={short(r.structured_content, 300)}")
    for c in r.content:
        if getattr(c, "type", "") == "text":
            log(f"< text: {short(c.text, 400)}")
    if r.meta:
        log(f"< _meta={short(r.meta, 500)}")
    return r


def cell_meta(r):
    return r.meta["dev.agentjail/run"]


def error_of(r):
    return r.meta["dev.agentjail/error"]


async def tools_listed(client, out):
    log("> tools/list")
    tools = {t.name: t for t in (await client.list_tools()).tools}
    log("< tools:", sorted(tools))
    out["tools"] = sorted(tools)
    o, r, c = tools["session_open"], tools["session_run"], tools["session_close"]
    g, f = tools["session_get"], tools["session_fork"]
    check(g.input_schema["required"] == ["session_id"], f"session_get required: {g.input_schema}")
    check(f.input_schema["required"] == ["session_id"], f"session_fork required: {f.input_schema}")
    check(set(f.input_schema["properties"]) == {"session_id", "cell", "request_id"}, f"{f.input_schema}")
    check("NEW session" in f.description and "unchanged" in f.description, "session_fork says the original stays")
    check("status" in g.description and g.annotations.read_only_hint is True, "session_get: read-only, lists statuses")
    check(o.input_schema["required"] == ["task"], f"session_open required: {o.input_schema}")
    check(o.input_schema["properties"]["task"]["enum"] == ["live", "py"], f"session_open tasks: {o.input_schema}")
    check(set(o.input_schema["properties"]) == {"task", "inputs", "request_id"}, f"{o.input_schema}")
    check(r.input_schema["required"] == ["session_id", "code"], f"session_run required: {r.input_schema}")
    check(set(r.input_schema["properties"]) == {"session_id", "code", "step_id"}, f"{r.input_schema}")
    check(c.input_schema["required"] == ["session_id"], f"session_close required: {c.input_schema}")
    for t in (o, r, c, g, f):
        check(t.input_schema.get("additionalProperties") is False, f"{t.name}: closed input schema")
        log(f"  {t.name} inputSchema:", short(t.input_schema, 2000))
        log(f"  {t.name} description:", t.description)
    # What a model must know to use them right.
    check("/work" in o.description and "variables" in o.description, "session_open says what persists")
    check("task's own tool" in o.description, "session_open says when a one-shot run is better")
    check("only the inputs" in o.description, "session_open says what a cell sees")
    check("step_id" in r.input_schema["properties"]["step_id"]["description"] and "derived" in r.input_schema["properties"]["step_id"]["description"], "step_id explained")
    check(o.output_schema and "session_id" in o.output_schema["required"], "session_open output schema")


async def open_session(client, request_id):
    s = await call(client, "session_open", {"task": "py", "request_id": request_id})
    check(not s.is_error, f"session_open ok: {texts(s)}")
    sid = s.structured_content["session_id"]
    check(sid.startswith("ses_") and s.structured_content["state"] == "open", f"session {s.structured_content}")
    check("session_run" in s.structured_content["usage"] and "/work" in s.structured_content["usage"], "usage")
    return sid


async def persists_and_runs_once(client, out):
    sid = await open_session(client, "mcp-open-1")
    # A retried opening: the same session.
    again = await call(client, "session_open", {"task": "py", "request_id": "mcp-open-1"})
    check(again.structured_content["session_id"] == sid, "the opening is execute-once")

    progress = []

    async def on_progress(p, total, message):
        progress.append((p, total, message))

    c0 = await call(
        client,
        "session_run",
        {"session_id": sid, "step_id": "write-x", "code": code("v = 41\nopen('/work/x', 'w').write('forty-two')\nprint('wrote x')\nimport time; time.sleep(1.5)")},
        progress_callback=on_progress,
    )
    check(not c0.is_error, f"cell 0 ok: {texts(c0)}")
    m0 = cell_meta(c0)
    check(m0["cell"] == 0 and m0["session_id"] == sid and m0["step_id"] == "write-x", f"cell 0 meta {m0}")
    check(m0["workspace"]["before"] is None and m0["workspace"]["after"].startswith("sha256:"), f"workspace {m0}")
    check(m0["status"] == "ok" and "wrote x" in m0["stdout"]["head"], f"stdout {m0}")
    check(any("UNTRUSTED" in c.text and "wrote x" in c.text for c in c0.content), "stdout as untrusted content")
    check(c0.structured_content == {"ok": 1}, "the verified output")
    log(f"# progress notifications received: {len(progress)}; {progress[:3]}")
    check(progress, "live progress of a cell")
    out["progress"] = len(progress)

    c1 = await call(client, "session_run", {"session_id": sid, "step_id": "read-x", "code": code("print(open('/work/x').read())")})
    check(not c1.is_error, f"cell 1 ok: {texts(c1)}")
    m1 = cell_meta(c1)
    check(m1["cell"] == 1 and "forty-two" in m1["stdout"]["head"], f"cell 1 reads /work/x: {m1}")
    check(m1["workspace"]["before"] == m0["workspace"]["after"], "cell 1 starts from cell 0's checkpoint")
    out["read_back"] = m1["stdout"]["head"].strip()

    # Variables do not persist: no resident interpreter.
    c2 = await call(client, "session_run", {"session_id": sid, "step_id": "use-v", "code": code("print(v)")})
    check(c2.is_error and "NameError" in error_of(c2).get("stderr_tail_untrusted", ""), f"cell 2 NameError: {texts(c2)}")

    # The same step_id again: the recorded cell, nothing run again.
    append = code("open('/work/log', 'a').write('step\\n')")
    a1 = await call(client, "session_run", {"session_id": sid, "step_id": "append", "code": append})
    a2 = await call(client, "session_run", {"session_id": sid, "step_id": "append", "code": append})
    check(not a1.is_error and not a2.is_error, "append ok")
    check(cell_meta(a1)["cell"] == cell_meta(a2)["cell"] == 3 and cell_meta(a1)["job_id"] == cell_meta(a2)["job_id"], "a repeated step_id runs once")
    check(cell_meta(a1)["replayed"] is False and cell_meta(a2)["replayed"] is True and "nothing ran again" in texts(a2), "a repeat says so")
    # No step_id: the derived one makes a repeat of the same call a replay too.
    d1 = await call(client, "session_run", {"session_id": sid, "code": append})
    d2 = await call(client, "session_run", {"session_id": sid, "code": append})
    check(cell_meta(d1)["step_id_derived"] is True and cell_meta(d1)["step_id"].startswith("auto-"), f"derived {cell_meta(d1)}")
    check(cell_meta(d1)["cell"] == cell_meta(d2)["cell"] == 4 and cell_meta(d1)["job_id"] == cell_meta(d2)["job_id"], "a repeat without step_id runs once")
    check(cell_meta(d2)["replayed"] is True, "the derived repeat says so")
    n = await call(client, "session_run", {"session_id": sid, "step_id": "count", "code": code("print(len(open('/work/log').readlines()))")})
    check(cell_meta(n)["stdout"]["head"].strip() == "2", f"two appends ran, not four: {cell_meta(n)}")
    out["appended"] = int(cell_meta(n)["stdout"]["head"].strip())

    await get_and_fork(client, sid, out)

    # Closed: a cell is refused, readably.
    cl = await call(client, "session_close", {"session_id": sid})
    check(not cl.is_error and cl.structured_content["state"] == "closed", f"closed {cl.structured_content}")
    refused = await call(client, "session_run", {"session_id": sid, "step_id": "late", "code": code("print(1)")})
    check(refused.is_error and error_of(refused)["error"] == "session-closed", f"refused after close: {texts(refused)}")
    check("session-closed" in texts(refused), "the refusal is in the text the model reads")
    out["after_close"] = error_of(refused)["error"]
    nofork = await call(client, "session_fork", {"session_id": sid, "request_id": "fork-late"})
    check(nofork.is_error and error_of(nofork)["error"] == "session-closed", f"no fork of a closed session: {texts(nofork)}")
    out["fork_after_close"] = error_of(nofork)["error"]
    return sid


async def get_and_fork(client, sid, out):
    """session_get lists the six cells; forks from cell 1 and from the head."""
    g = await call(client, "session_get", {"session_id": sid})
    check(not g.is_error, f"session_get ok: {texts(g)}")
    sc = g.structured_content
    got = [(c["cell"], c["step_id"], c["status"]) for c in sc["cell_list"]]
    check(sc["state"] == "open" and sc["cells"] == 6 and len(got) == 6, f"six cells: {sc}")
    check(got[0] == (0, "write-x", "ok") and got[1] == (1, "read-x", "ok") and got[2][2] == "exit_nonzero", f"cells: {got}")
    check("read-x" in texts(g), "the cells are in the text the model reads")
    out["get_statuses"] = [c[2] for c in got]

    # From cell 1: /work/x is there, /work/log (written by cells 3 and 4) is not.
    f1 = await call(client, "session_fork", {"session_id": sid, "cell": 1, "request_id": "fork-1"})
    check(not f1.is_error, f"fork ok: {texts(f1)}")
    fid = f1.structured_content["session_id"]
    check(fid != sid and fid.startswith("ses_"), f"a new session {fid}")
    check(f1.structured_content["forked_from"] == {"session_id": sid, "cell": 1}, f"forked_from {f1.structured_content}")
    again = await call(client, "session_fork", {"session_id": sid, "cell": 1, "request_id": "fork-1"})
    check(again.structured_content["session_id"] == fid, "a repeated fork is the same session")
    fc = await call(client, "session_run", {"session_id": fid, "step_id": "in-fork", "code": code(
        "import os\nprint(open('/work/x').read(), os.path.exists('/work/log'))\nopen('/work/x', 'w').write('changed')")})
    check(not fc.is_error and cell_meta(fc)["stdout"]["head"].strip() == "forty-two False", f"the fork's /work is cell 1's: {cell_meta(fc)}")
    # From the head: all of /work, the two appends included.
    f2 = await call(client, "session_fork", {"session_id": sid, "request_id": "fork-head"})
    hid = f2.structured_content["session_id"]
    hc = await call(client, "session_run", {"session_id": hid, "step_id": "in-head-fork", "code": code("print(len(open('/work/log').readlines()))")})
    check(cell_meta(hc)["stdout"]["head"].strip() == "2", f"the head fork has /work/log: {cell_meta(hc)}")
    # The original is unchanged by what the fork wrote.
    oc = await call(client, "session_run", {"session_id": sid, "step_id": "after-fork", "code": code("print(open('/work/x').read())")})
    check(cell_meta(oc)["stdout"]["head"].strip() == "forty-two", f"the original is unchanged: {cell_meta(oc)}")
    for f in (fid, hid):
        cl = await call(client, "session_close", {"session_id": f})
        check(cl.structured_content["state"] == "closed", "fork closed")
    out["forked"] = {"from_cell_1": cell_meta(fc)["stdout"]["head"].strip(), "from_head": cell_meta(hc)["stdout"]["head"].strip(), "original": cell_meta(oc)["stdout"]["head"].strip()}


async def other_actor(client, sid, out):
    """The other actor: alice's session id is refused exactly as a missing one."""
    missing = "ses_" + secrets.token_hex(16)
    results = {}
    for name, args in [
        ("run", lambda s: ("session_run", {"session_id": s, "step_id": "x", "code": code("print(1)")})),
        ("get", lambda s: ("session_get", {"session_id": s})),
        ("fork", lambda s: ("session_fork", {"session_id": s, "request_id": "carol-fork"})),
        ("close", lambda s: ("session_close", {"session_id": s})),
    ]:
        theirs = await call(client, *args(sid))
        none = await call(client, *args(missing))
        check(theirs.is_error and none.is_error, f"{name}: both refused")
        check(error_of(theirs)["error"] == "not-found", f"{name}: not-found {error_of(theirs)}")
        check(error_of(theirs) == error_of(none) and texts(theirs) == texts(none), f"{name}: the same refusal: {error_of(theirs)} vs {error_of(none)}")
        results[name] = error_of(theirs)["error"]
    out["other_actor"] = results


async def live_cells(client, out):
    """A live session (task `live`: a resident interpreter): the usage says variables persist,
    a cell that ends ok without an output file is a success, and a variable of one cell is
    there in the next."""
    o = await call(client, "session_open", {"task": "live", "request_id": "mcp-live"})
    check(not o.is_error, f"live session_open ok: {texts(o)}")
    sid = o.structured_content["session_id"]
    usage = o.structured_content["usage"]
    check("resident" in usage and "variables" in usage, f"live usage: {usage}")
    a = await call(client, "session_run", {"session_id": sid, "step_id": "set", "code": "x = 41\nprint('set')"})
    b = await call(client, "session_run", {"session_id": sid, "step_id": "use", "code": "print(x + 1)"})
    await call(client, "session_close", {"session_id": sid})
    out["live"] = {
        "set_is_error": a.is_error,
        "use_is_error": b.is_error,
        "use_prints_42": "42" in texts(b),
    }


def connect(a, token_file):
    if a.transport == "stdio":
        log(f"# stdio: {a.bin} mcp --config CONFIG --data-dir DIR --tenant acme --actor alice --token-file FILE")
        return StdioServerParameters(
            command=a.bin,
            args=["mcp", "--config", a.config, "--data-dir", a.data_dir, "--tenant", "acme", "--actor", "alice", "--token-file", token_file],
            env={"AGENTJAIL_LOG": "info"},
        )
    token = open(token_file).read().strip()
    log(f"# http: {a.url} with Authorization: Bearer <token of {token_file.rsplit('/', 1)[-1]}>")
    return streamable_http_client(a.url, http_client=create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}))


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--transport", choices=["stdio", "http"], required=True)
    ap.add_argument("--bin")
    ap.add_argument("--config")
    ap.add_argument("--data-dir")
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--other-token-file")
    ap.add_argument("--url")
    ap.add_argument("--transcript")
    ap.add_argument("--live", action="store_true", help="also the live session scenario (task `live`)")
    a = ap.parse_args()
    out = {"transport": a.transport}
    try:
        async with Client(connect(a, a.token_file)) as client:
            await tools_listed(client, out)
            sid = await persists_and_runs_once(client, out)
            if a.live:
                await live_cells(client, out)
        if a.other_token_file and sid:
            async with Client(connect(a, a.other_token_file)) as client:
                await other_actor(client, sid, out)
    finally:
        if a.transcript:
            with open(a.transcript, "w") as f:
                f.write("\n".join(log_lines) + "\n")
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    anyio.run(main)
