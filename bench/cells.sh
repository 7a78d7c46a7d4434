#!/usr/bin/env bash
# A `print(1)` step, side by side in one script run (issues #34 and #35): the latency of one
# call, sequential (one caller, as an agent loop makes them), each way N times:
#   bare:        `/usr/bin/python3 -c CODE`, the interpreter the task runs, started with nothing
#                around it;
#   run:         `agentjail run` per call on the same code (a fresh sandbox each time);
#   http run:    `POST /v1/runs` (wait) to `agentjail serve` (SQLite), raw HTTP/1.1 keep-alive;
#   http cell:   `POST /v1/sessions/{id}/cells` (wait) in one open session, raw HTTP, likewise;
#   live cell:   the same in a live session (`session.interpreter = "python"`): the cell is
#                executed by the session's resident interpreter in its one sandbox (the first,
#                untimed call starts it);
#   mcp live cell: the same through MCP's `session_run` over Streamable HTTP (`/mcp`, the
#                official Python SDK as the client), when the `mcp` package is installed;
#   client cell: the same cell through the Python client (`agentjail` package, clients/python:
#                `session.run(code)`), on its own keep-alive connection;
#   ts cell:     the same cell through the TypeScript client (clients/typescript, its built
#                `dist/`: `await session.run(code)` under Node, fetch), timed inside Node,
#                when `node` and the built client are there (`npm ci && npm run build`);
#   smolagents:  smolagents' LocalPythonExecutor running the code in-process (no sandbox at all),
#                when smolagents is installed.
# Prints p50, p90, p99 and max per way, and the load average at the start. A client's
# overhead is its cell minus "http cell". A cell of a session that is not live starts a
# fresh interpreter in a fresh sandbox, like a run (docs/api.md, "Sessions").
# The step is `print(1)` and, where there is an `/output`, the task's output file (`{}`).
# Usage: bench/cells.sh [N]   (as root; python3 with httpx for the client; builds the release
# binary, or takes the one in $AGENTJAIL_BIN).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-50}
if [ -z "${AGENTJAIL_BIN:-}" ]; then
  cargo build --release -q -p agentjail
  aj="$PWD/target/x86_64-unknown-linux-gnu/release/agentjail"
else
  aj=$(realpath "$AGENTJAIL_BIN")
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/agentjail-bench-cells-XXXXXX")
chmod 755 "$work"
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
echo "bench/cells.sh: $("$aj" --version); $n calls each way; load $(cut -d' ' -f1 /proc/loadavg)"
AJ="$aj" WORK="$work" N="$n" PYTHONPATH="$PWD/clients/python/src" python3 - <<'PY'
import hashlib, http.client, json, os, re, statistics, subprocess, sys, threading, time

aj, work, n = os.environ["AJ"], os.environ["WORK"], int(os.environ["N"])
token = "bench-cells-" + os.urandom(8).hex()
# print(1), and the task's output file where there is an `/output` to write it to (a service
# task declares an output: a run that leaves none does not end `ok`).
code = 'print(1)\ntry:\n    open("/output/o.json", "w").write("{}")\nexcept OSError:\n    pass\n'
cfg = f"""
[tenants.acme]
[actors.agent]
tenant = "acme"
token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"
"""


def task(name, extra=""):
    return f"""[tasks.{name}]
description = "Model-proposed Python"
code = "allowed"
command = ["/usr/bin/python3", "/input/code.py"]
allowed_actors = ["agent"]
[tasks.{name}.output]
path = "/output/o.json"
media_type = "application/json"
max_bytes = 100
[tasks.{name}.limits]
seconds = 20
[tasks.{name}.session]
max_cells = {4 * n + 20}
{extra}"""


# `live`: its sessions keep a resident interpreter (docs/api.md, "Live sessions").
cfg += task("py") + task("live", 'interpreter = "python"\n')
open(f"{work}/config.toml", "w").write(cfg)
results = {}
# The caller's own CPU per call (this process's, or Node's for the TypeScript client): what a
# client costs on top of the call, far less disturbed by other load than the wall time.
cpu = {}


def timed(name, call):
    call(-1)  # warm-up, untimed
    ms, c = [], []
    for i in range(n):
        t0, c0 = time.perf_counter(), time.process_time()
        call(i)
        ms.append((time.perf_counter() - t0) * 1000)
        c.append((time.process_time() - c0) * 1000)
    results[name] = ms
    cpu[name] = c


def check(out):
    assert out.strip() == b"1", out


timed("bare", lambda i: check(subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, check=True).stdout))
open(f"{work}/code.py", "w").write(code)
os.chmod(f"{work}/code.py", 0o644)
manifest = {"inputs": [{"source": f"{work}/code.py", "mount": "/input/code.py", "mode": "read-only"}],
            "network": "deny", "limits": {"seconds": 20},
            "command": ["/usr/bin/python3", "/input/code.py"]}
json.dump(manifest, open(f"{work}/manifest.json", "w"))
timed("run", lambda i: check(subprocess.run([aj, "run", "--manifest", f"{work}/manifest.json"],
                                            capture_output=True, check=True).stdout))

p = subprocess.Popen([aj, "serve", "--config", f"{work}/config.toml", "--listen", "127.0.0.1:0",
                      "--data-dir", f"{work}/data"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.PIPE, text=True,
                     # The live cells' exchange times (the service's frame out to the answer
                     # back: the sandbox's share of a live cell), from one debug line per cell.
                     env={**os.environ, "AGENTJAIL_LOG": "warn,agentjail_server::service::live_cells=debug"})
port = None
for line in p.stderr:
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
    if m:
        port = int(m.group(1))
        break
assert port, "the service did not start"
exchange_us = []
def drain():
    for line in p.stderr:
        m = re.search(r"exec_us\D*(\d+)", line)
        if m:
            exchange_us.append(int(m.group(1)))
threading.Thread(target=drain, daemon=True).start()
try:
    hdr = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    c = http.client.HTTPConnection("127.0.0.1", port)

    def post(path, body):
        c.request("POST", path, body=json.dumps(body), headers=hdr)
        r = c.getresponse()
        v = json.loads(r.read())
        assert r.status in (200, 201), (r.status, v)
        return v

    def ok_stdout(v):
        assert v["status"] == "ok", v
        assert v["stdout"]["head"].strip() == "1", v["stdout"]

    timed("http run", lambda i: ok_stdout(post("/v1/runs", {"request_id": f"r{i}", "task": "py", "code": code})))
    sid = post("/v1/sessions", {"request_id": "s", "task": "py"})["session_id"]
    timed("http cell", lambda i: ok_stdout(post(f"/v1/sessions/{sid}/cells", {"request_id": f"c{i}", "code": code})))
    lid = post("/v1/sessions", {"request_id": "l", "task": "live"})["session_id"]
    timed("live cell", lambda i: ok_stdout(post(f"/v1/sessions/{lid}/cells", {"request_id": f"c{i}", "code": "print(1)"})))
    try:
        import anyio
        from mcp import Client as McpClient
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client
    except ImportError as e:
        print(f"  (the MCP SDK is not importable here: {e}; the MCP line is left out)")
    else:
        async def over_mcp():
            http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
            async with McpClient(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)) as m:
                o = await m.call_tool("session_open", {"task": "live", "request_id": "mcp-live"})
                assert not o.is_error, o
                msid = o.structured_content["session_id"]
                ms = []
                for i in range(-1, n):
                    t0 = time.perf_counter()
                    r = await m.call_tool("session_run", {"session_id": msid, "step_id": f"m{i}", "code": "print(1)"})
                    assert not r.is_error, r
                    if i >= 0:  # the first starts the interpreter: untimed
                        ms.append((time.perf_counter() - t0) * 1000)
                await m.call_tool("session_close", {"session_id": msid})
                return ms
        results["mcp live cell"] = anyio.run(over_mcp)
    try:
        import agentjail
    except ImportError as e:
        print(f"  (the Python client is not importable here: {e}; its line is left out)")
    else:
        client = agentjail.Client(f"http://127.0.0.1:{port}", token=token)
        s = client.session(task="py")

        def cell(i):
            r = s.run(code)
            assert r.ok, r
        timed("client cell", cell)
        s.close()
        client.close()
    dist = os.path.join(os.getcwd(), "clients/typescript/dist/index.js")
    if not os.path.exists(dist) or subprocess.run(["node", "--version"], capture_output=True).returncode:
        print("  (node or the built TypeScript client is missing: its line is left out)")
    else:
        js = """
import * as aj from %s;
const c = new aj.Client({ baseUrl: %s, token: %s });
const s = await c.session("py");
const code = %s, ms = [], cpu = [];
for (let i = -1; i < %d; i++) {
  const t0 = performance.now(), c0 = process.cpuUsage();
  const r = await s.run(code);
  if (!r.ok || r.stdout.trim() !== "1") throw new Error("cell not ok: " + r.status);
  const c = process.cpuUsage(c0);
  if (i >= 0) {  // the first, a warm-up, untimed
    ms.push(performance.now() - t0);
    cpu.push((c.user + c.system) / 1000);
  }
}
await s.close();
console.log(JSON.stringify({ ms, cpu }));
""" % (json.dumps("file://" + dist), json.dumps(f"http://127.0.0.1:{port}"), json.dumps(token), json.dumps(code), n)
        open(f"{work}/ts.mjs", "w").write(js)
        out = subprocess.run(["node", f"{work}/ts.mjs"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        results["ts cell"], cpu["ts cell"] = got["ms"], got["cpu"]
finally:
    p.terminate()
    p.wait()

try:
    from smolagents.local_python_executor import LocalPythonExecutor
except ImportError:
    print("  (smolagents is not installed: its line is left out)")
else:
    ex = LocalPythonExecutor(additional_authorized_imports=[])
    ex.send_tools({})
    # Its interpreter refuses `open`: the step is `print(1)` alone there.
    timed("smolagents", lambda i: ex("print(1)"))


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


for name, ms in results.items():
    print(f"  {name:13s}: p50 {pct(ms, .5):7.2f}  p90 {pct(ms, .9):7.2f}  p99 {pct(ms, .99):7.2f}  max {max(ms):7.2f} ms")
# The first exchange of each live session starts its sandbox: left out with the untimed calls.
ex = [u / 1000 for u in exchange_us[1:n + 1]]
if ex:
    print(f"  live cell's exchange (frame out to answer back, in the service): p50 {pct(ex, .5):6.2f}  p90 {pct(ex, .9):6.2f}  p99 {pct(ex, .99):6.2f} ms")
for way in ("http cell", "client cell", "ts cell"):
    if way in cpu:
        print(f"  {way:12s}: the caller's CPU per call p50 {pct(cpu[way], .5):6.2f}  p90 {pct(cpu[way], .9):6.2f} ms")
for way in ("client cell", "ts cell"):
    if way in results:
        print(f"  {way} overhead (p50 of {way} - http cell): {pct(results[way], .5) - pct(results['http cell'], .5):.2f} ms")
PY
