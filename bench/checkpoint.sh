#!/usr/bin/env bash
# A session's workspace checkpoint at scale (issue #34): one session of `agentjail serve`
# (SQLite), raw HTTP, cells in this order:
#   empty:    `pass` on an empty /work (the cell's fixed cost);
#   fill:     writes FILES files of BYTES bytes each (random, so incompressible) in 10 folders;
#   resume:   `pass` again: restores the whole workspace from its checkpoint (hashed first) and
#             collects it again (the same digest);
#   touch:    changes one file: restore, collect, a new checkpoint stored (whole: checkpoints
#             are whole archives, content-addressed, with nothing shared between two);
# each timed from the request to its answer (and the sandbox's wall time: from its start to
# its last process's end, which includes the restore), with the checkpoint's size and the
# checkpoint store's total. Default: 9,900 files of 10,240 bytes (~100 MB, 9,910 entries with
# the folders: the workspace bound counts files and folders together, at most 10,000).
# Usage: bench/checkpoint.sh [FILES] [BYTES]   (as root; python3; builds the release binary, or
# takes the one in $AGENTJAIL_BIN).
set -euo pipefail
cd "$(dirname "$0")/.."
files=${1:-9900}
bytes=${2:-10240}
if [ -z "${AGENTJAIL_BIN:-}" ]; then
  cargo build --release -q -p agentjail
  aj="$PWD/target/x86_64-unknown-linux-gnu/release/agentjail"
else
  aj=$(realpath "$AGENTJAIL_BIN")
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/agentjail-bench-checkpoint-XXXXXX")
chmod 755 "$work"
trap 'rm -rf "$work"' EXIT
echo "bench/checkpoint.sh: $("$aj" --version); $files files of $bytes bytes; load $(cut -d' ' -f1 /proc/loadavg)"
AJ="$aj" WORK="$work" FILES="$files" BYTES="$bytes" python3 - <<'PY'
import hashlib, http.client, json, os, re, subprocess, threading, time

aj, work = os.environ["AJ"], os.environ["WORK"]
files, size = int(os.environ["FILES"]), int(os.environ["BYTES"])
token = "bench-checkpoint-" + os.urandom(8).hex()
mb = max(1, (files * size) // (1 << 20) + 16)
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
seconds = 120
memory_mb = 1024
[tasks.py.session]
max_mb = {mb}
max_files = 10000
"""
open(f"{work}/config.toml", "w").write(cfg)
out = 'open("/output/o.json", "w").write("{}")\n'
cells = [
    ("empty", "pass\n"),
    ("fill", f"""import os
for d in range(10):
    os.makedirs(f"/work/d{{d}}", exist_ok=True)
for i in range({files}):
    with open(f"/work/d{{i % 10}}/f{{i}}", "wb") as f:
        f.write(os.urandom({size}))
"""),
    ("resume", f"""import os
n = sum(len(fs) for _, _, fs in os.walk("/work"))
assert n == {files}, n
"""),
    ("touch", 'open("/work/d0/f0", "ab").write(b"x")\n'),
]
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
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)

    def post(path, body):
        c.request("POST", path, body=json.dumps(body), headers=hdr)
        r = c.getresponse()
        v = json.loads(r.read())
        assert r.status in (200, 201), (r.status, v)
        return v

    sid = post("/v1/sessions", {"request_id": "s", "task": "py"})["session_id"]
    store = f"{work}/data/checkpoints"

    def stored():
        if not os.path.isdir(store):
            return 0, 0
        names = os.listdir(store)
        return len(names), sum(os.path.getsize(os.path.join(store, n)) for n in names)

    for name, code in cells:
        t0 = time.perf_counter()
        v = post(f"/v1/sessions/{sid}/cells", {"request_id": name, "code": code + out})
        ms = (time.perf_counter() - t0) * 1000
        assert v["status"] == "ok", v
        ws = v["report"].get("workspace") or {}
        n, total = stored()
        print(f"  {name:7s}: {ms:8.1f} ms  sandbox {v['report'].get('wall_ms', 0):6} ms  "
              f"workspace {ws.get('files', 0):5} files {ws.get('bytes', 0) / 1e6:7.1f} MB  "
              f"store: {n} checkpoint(s), {total / 1e6:7.1f} MB")
finally:
    p.terminate()
    p.wait()
PY
