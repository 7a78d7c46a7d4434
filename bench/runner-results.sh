#!/usr/bin/env bash
# The service's runner alone, its two ways of handing results back (issue #15), side by side:
#   files:    `agentjail run --lifeline --job-dir J --output-dir J/out --report J/report.json
#             --receipt J/receipt.json` (a pipe for the manifest), as `agentjail serve` ran its
#             runners up to commit 64783ea;
#   lifeline: `agentjail run --lifeline --results-on-lifeline` (a socketpair; the artifact,
#             receipt and report come back as frames, no file written), as it runs them now.
# Both get the CSV-summary example's manifest as the service builds it (the data by path, the
# code inline, the schema, a receipt key); N sequential runs per round, the two modes
# alternating for ROUNDS rounds; prints each round's runs/s and CPU per run (getrusage of the
# waited-for children) and the medians.
# Usage: bench/runner-results.sh [N] [ROUNDS]  (as root, like CI; builds the release binary,
# or takes the one in $AGENTJAIL_BIN)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-60}
rounds=${2:-4}
if [ -z "${AGENTJAIL_BIN:-}" ]; then
  cargo build --release -q -p agentjail
  aj="$PWD/target/x86_64-unknown-linux-gnu/release/agentjail"
else
  aj=$(realpath "$AGENTJAIL_BIN")
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/agentjail-bench-runner-XXXXXX")
chmod 755 "$work"
trap 'rm -rf "$work"' EXIT
AJ="$aj" WORK="$work" N="$n" ROUNDS="$rounds" python3 - <<'PY'
import json, os, re, resource, shutil, socket, statistics, subprocess, time

aj, w, n, rounds = os.environ["AJ"], os.environ["WORK"], int(os.environ["N"]), int(os.environ["ROUNDS"])
src = f"{w}/objects"
os.makedirs(src)
os.chmod(src, 0o755)
shutil.copy("examples/csv-summary/report.csv", f"{src}/data.csv")
cfg = open("examples/server/config.toml").read()
open(f"{src}/output.schema.json", "w").write(re.search(r"schema = '''(.*?)'''", cfg, re.S).group(1))
for f in ("data.csv", "output.schema.json"):
    os.chmod(f"{src}/{f}", 0o644)
manifest = {
    "request_id": "bench",
    "inputs": [{"source": f"{src}/data.csv", "mount": "/input/data.csv", "mode": "read-only"}],
    "inline_inputs": [{"mount": "/input/code.py", "content": open("examples/csv-summary/summarize.py").read()}],
    "output": "/output/summary.json",
    "output_schema": f"{src}/output.schema.json",
    "network": "deny",
    "limits": {"seconds": 30, "memory_mb": 256, "processes": 16, "output_mb": 5},
    "expires_at": "2099-01-01T00:00:00Z",
    "command": ["/usr/bin/python3", "/input/code.py", "/input/data.csv", "/output/summary.json"],
    "env": {"LANG": "C.UTF-8"},
}
line = (json.dumps(manifest) + "\n").encode()
key = f"{w}/receipt-key.pem"
env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


def run_files(i):
    job = f"{w}/jobs/{i}"
    os.makedirs(job, mode=0o700)
    r, wr = os.pipe()
    p = subprocess.Popen([aj, "run", "--lifeline", "--job-dir", job, "--source-root", src,
                          "--output-dir", f"{job}/out", "--report", f"{job}/report.json",
                          "--receipt", f"{job}/receipt.json", "--key", key],
                         stdin=r, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    os.close(r)
    os.write(wr, line)
    p.wait()
    os.close(wr)
    assert json.load(open(f"{job}/report.json"))["status"] == "ok"


def run_lifeline(i):
    ours, theirs = socket.socketpair()
    p = subprocess.Popen([aj, "run", "--lifeline", "--results-on-lifeline", "--source-root", src,
                          "--key", key],
                         stdin=theirs.fileno(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    theirs.close()
    ours.sendall(line)
    data = b""
    while chunk := ours.recv(65536):
        data += chunk
    p.wait()
    ours.close()
    # The last frame is the report.
    at, frames = 0, {}
    while at < len(data):
        tag, size = data[at:at + 1], int.from_bytes(data[at + 1:at + 9], "little")
        frames[tag] = data[at + 9:at + 9 + size]
        at += 9 + size
    assert json.loads(frames[b"R"])["status"] == "ok" and b"A" in frames and b"C" in frames


run_files("warm")  # creates the receipt key, warms the page cache
res = {"files": [], "lifeline": []}
for r in range(rounds):
    for mode, one in (("files", run_files), ("lifeline", run_lifeline)):
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        for i in range(n):
            one(f"{r}-{i}")
        dt = time.monotonic() - t0
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        u = (ru1.ru_utime - ru0.ru_utime) * 1000 / n
        s = (ru1.ru_stime - ru0.ru_stime) * 1000 / n
        res[mode].append(u + s)
        print(f"round {r + 1} {mode:8s}: {n / dt:5.1f} runs/s, CPU per run user {u:.2f} + sys {s:.2f} = {u + s:.2f} ms", flush=True)
print("\nmedian CPU per run: " + ", ".join(f"{k} {statistics.median(v):.2f} ms" for k, v in res.items()))
PY
