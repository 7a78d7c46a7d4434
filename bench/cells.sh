#!/usr/bin/env bash
# A `print(1)` step, side by side in one script run (issues #34 and #35): the latency of one
# call, sequential (one caller, as an agent loop makes them), each way N times:
#   bare:        `/usr/bin/python3 -c CODE`, the interpreter the task runs, started with nothing
#                around it;
#   run:         `agentjail run` per call on the same code (a fresh sandbox each time);
#   http run:    `POST /v1/runs` (wait) to `agentjail serve` (SQLite), raw HTTP/1.1 keep-alive;
#   http cell:   `POST /v1/sessions/{id}/cells` (wait) in one open session, raw HTTP, likewise;
#   client cell: the same cell through the Python client (`agentjail` package, clients/python:
#                `session.run(code)`), on its own keep-alive connection;
#   smolagents:  smolagents' LocalPythonExecutor running the code in-process (no sandbox at all),
#                when smolagents is installed.
# Prints p50, p90, p99 and max per way, and the load average at the start. The client's
# overhead is "client cell" minus "http cell". No resident interpreter yet (docs/api.md,
# "Sessions"): a cell starts a fresh interpreter in a fresh sandbox, like a run.
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
[tasks.py]
description = "Model-proposed Python"
code = "allowed"
command = ["/usr/bin/python3", "/input/code.py"]
allowed_actors = ["agent"]
[tasks.py.output]
path = "/output/o.json"
media_type = "application/json"
max_bytes = 100
[tasks.py.limits]
seconds = 20
[tasks.py.session]
max_cells = {4 * n + 20}
"""
open(f"{work}/config.toml", "w").write(cfg)
results = {}


def timed(name, call):
    call(-1)  # warm-up, untimed
    ms = []
    for i in range(n):
        t0 = time.perf_counter()
        call(i)
        ms.append((time.perf_counter() - t0) * 1000)
    results[name] = ms


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
                     stderr=subprocess.PIPE, text=True, env={**os.environ, "AGENTJAIL_LOG": "warn"})
port = None
for line in p.stderr:
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
    if m:
        port = int(m.group(1))
        break
assert port, "the service did not start"
threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
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
    print(f"  {name:12s}: p50 {pct(ms, .5):7.2f}  p90 {pct(ms, .9):7.2f}  p99 {pct(ms, .99):7.2f}  max {max(ms):7.2f} ms")
if "client cell" in results:
    print(f"  client overhead (p50 of client cell - http cell): {pct(results['client cell'], .5) - pct(results['http cell'], .5):.2f} ms")
PY
