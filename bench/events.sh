#!/usr/bin/env bash
# Latency of live output (issue #33): from a line's write inside the sandbox to its arrival at
# a follower of `GET /v1/runs/{id}/events` (Server-Sent Events), on one node (SQLite).
#   A run of model code prints LINES lines, one every 50 ms, each carrying time.time() at its
#   write (the sandbox shares the host's clock); a follower (Python's standard library, one
#   socket) reads the stream, and for every line in a chunk computes arrival - write. The
#   task's env holds no secret here, so nothing is held back for masking: what is measured is
#   the poll (200 ms), the log's way to the job folder and the event's way to the client.
# Prints p50, p90, p99 and max over RUNS runs, and the load average at the start.
# Usage: bench/events.sh [RUNS] [LINES]   (as root; python3; builds the release binary, or
# takes the one in $AGENTJAIL_BIN).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
lines=${2:-60}
if [ -z "${AGENTJAIL_BIN:-}" ]; then
  cargo build --release -q -p agentjail
  aj="$PWD/target/x86_64-unknown-linux-gnu/release/agentjail"
else
  aj=$(realpath "$AGENTJAIL_BIN")
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/agentjail-bench-events-XXXXXX")
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
token=tok-bench-events-3c1e
hash=$(printf %s "$token" | sha256sum | cut -d' ' -f1)
cat > "$work/config.toml" <<EOF
[tenants.bench]
[actors.bench]
tenant = "bench"
token_sha256 = "$hash"
[tasks.printer]
description = "Prints timestamped lines"
code = "allowed"
command = ["/usr/bin/python3", "/input/code.py"]
allowed_actors = ["bench"]
stdout_bytes = 4096
[tasks.printer.output]
path = "/output/o.json"
media_type = "application/json"
max_bytes = 100
[tasks.printer.limits]
seconds = 120
EOF
"$aj" serve --listen 127.0.0.1:0 --config "$work/config.toml" --data-dir "$work/data" \
  2> "$work/serve.log" &
pid=$!
for _ in $(seq 100); do
  grep -q "listening on" "$work/serve.log" && break
  sleep 0.1
done
base=$(grep -o "listening on [^ ]*" "$work/serve.log" | head -1 | cut -d' ' -f3)
[ -n "$base" ] || { cat "$work/serve.log" >&2; echo "the service did not start" >&2; exit 1; }
echo "bench/events.sh: $("$aj" --version); $runs runs of $lines lines; load $(cut -d' ' -f1 /proc/loadavg)"
python3 - "$base" "$token" "$runs" "$lines" <<'EOF'
import http.client, json, sys, time, urllib.parse
base, token, runs, lines = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
u = urllib.parse.urlparse(base)
code = (
    "import json, time\n"
    f"for i in range({lines}):\n"
    "    print('%d %.6f' % (i, time.time()), flush=True)\n"
    "    time.sleep(0.05)\n"
    "json.dump({}, open('/output/o.json', 'w'))\n"
)
lat = []
for r in range(runs):
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    rid = f"bench-{r}-{time.time_ns()}"
    body = json.dumps({"request_id": rid, "task": "printer", "code": code})
    c.request("POST", "/v1/runs?wait=false", body,
              {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    resp = c.getresponse(); resp.read()
    assert resp.status == 202, resp.status
    c.request("GET", f"/v1/runs/{rid}/events", headers={"Authorization": f"Bearer {token}"})
    resp = c.getresponse()
    assert resp.status == 200, resp.status
    event, pending = "", ""
    while True:
        line = resp.fp.readline()
        if not line:
            break
        line = line.decode().rstrip("\n")
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:") and event == "stdout":
            now = time.time()
            text = pending + json.loads(line[5:].strip())["text"]
            parts = text.split("\n")
            pending = parts.pop()
            for p in parts:
                lat.append(now - float(p.split()[1]))
        elif line.startswith("data:") and event == "ended":
            break
    c.close()
lat.sort()
q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))] * 1000
print(f"lines received: {len(lat)} of {runs * lines}")
print(f"write to arrival, ms: p50 {q(0.5):.0f}  p90 {q(0.9):.0f}  p99 {q(0.99):.0f}  max {lat[-1] * 1000:.0f}")
EOF
