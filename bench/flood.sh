#!/usr/bin/env bash
# Reports under a flood of refusals: a payload asks the egress gateway for N different hosts
# (none allowed; pipelined plain-HTTP requests on one kept-alive connection), or makes N
# refused ptrace calls with different arguments. Prints the run's wall time, the time spent
# after the command ended, the peak RSS and the report's size and denials.
# Runs inside a network namespace made for it (loopback only). Needs root.
# Usage: bench/flood.sh [proxy|syscall] [N] [AGENTJAIL_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-proxy}
n=${2:-41600}
aj=${3:-$PWD/target/x86_64-unknown-linux-gnu/debug/agentjail}
if [ "${AGENTJAIL_BENCH_IN_NETNS:-}" != 1 ]; then
  exec env AGENTJAIL_BENCH_IN_NETNS=1 unshare -n -- "$0" "$kind" "$n" "$aj"
fi
ip link set lo up
work=$(mktemp -d /tmp/agentjail-flood-bench-XXXXXX)
chmod 755 "$work"
trap 'rm -rf "$work"' EXIT
cat > "$work/proxy.py" <<'PY'
import socket, sys
n = int(sys.argv[1]); pat = b"HTTP/1.1 4"; answered = 0; i = 0
s = socket.create_connection(("127.0.0.1", 3128))
while i < n:
    batch = min(200, n - i)
    s.sendall(b"".join(b"GET http://h%d.flood.test/ HTTP/1.1\r\nHost: h%d.flood.test\r\n\r\n" % (j, j) for j in range(i, i + batch)))
    i += batch; tail = b""; want = answered + batch
    while answered < want:
        data = s.recv(1 << 16)
        if not data:
            sys.exit("closed at %d" % answered)
        buf = tail + data; answered += buf.count(pat); tail = buf[-(len(pat) - 1):]
print("FLOOD-DONE", answered)
PY
cat > "$work/syscall.py" <<'PY'
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True); n = int(sys.argv[1]); refused = 0
for i in range(n):
    if libc.syscall(101, i, i + 1, i + 2, i + 3) == -1 and ctypes.get_errno() == 1:
        refused += 1
print("FLOOD-DONE", refused)
PY
chmod 644 "$work"/*.py
cat > "$work/m.json" <<JSON
{"command": ["/usr/bin/python3", "/input/$kind.py", "$n"],
 "inputs": [{"source": "$work/$kind.py", "mount": "/input/$kind.py", "mode": "read-only"}],
 "network": {"allow": [{"host": "allowed.test", "ports": [80]}]},
 "limits": {"seconds": 3600, "memory_mb": 1024, "network_connections": 10000}}
JSON
start=$(date +%s.%N)
/usr/bin/time -f 'peak RSS %M KiB' "$aj" run --manifest "$work/m.json" --egress-dns 127.0.0.1:9 \
  --report "$work/r.json" 2> "$work/err" || true
end=$(date +%s.%N)
grep -h 'FLOOD-DONE\|peak RSS' "$work/err" || true
python3 - "$work/r.json" "$start" "$end" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1])); total = float(sys.argv[3]) - float(sys.argv[2])
print("status %s; run %.2f s; after the command %.2f s; report %d bytes; %d denials listed, %d counted, %s dropped"
      % (r["status"], total, total - r["wall_ms"] / 1000, os.path.getsize(sys.argv[1]), len(r["denials"]),
         sum(d.get("count", 1) for d in r["denials"]), r.get("denials_dropped")))
PY
