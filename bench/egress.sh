#!/usr/bin/env bash
# Egress gateway benchmark: a large download and many small requests, direct on loopback vs
# through the gateway (curl inside an agentjail sandbox whose only way out is the proxy).
# Runs entirely inside a network namespace made for it (loopback only). Needs root.
# Usage: bench/egress.sh [SIZE_MB] [REQUESTS]
set -euo pipefail
cd "$(dirname "$0")/.."
size_mb=${1:-1024}
requests=${2:-200}
cargo build --release -q -p agentjail
if [ "${AGENTJAIL_BENCH_IN_NETNS:-}" != 1 ]; then
  exec env AGENTJAIL_BENCH_IN_NETNS=1 unshare -n -- "$0" "$@"
fi
ip link set lo up
aj="$PWD/target/x86_64-unknown-linux-gnu/release/agentjail"
work=$(mktemp -d /tmp/agentjail-egress-bench-XXXXXX)
chmod 755 "$work"
trap 'kill $server 2>/dev/null || true; rm -rf "$work"' EXIT
head -c $((size_mb << 20)) /dev/zero > "$work/big.bin"
echo ok > "$work/small.txt"
chmod 644 "$work"/*
/usr/bin/python3 -m http.server 8080 --bind 127.0.0.1 --directory "$work" >/dev/null 2>&1 &
server=$!
sleep 1
manifest="$work/m.json"
cat > "$manifest" <<JSON
{"command": ["/bin/sh", "-c", "curl -s -o /dev/null -w 'speed %{speed_download}\\\\n' http://127.0.0.1:8080/big.bin; for i in \$(seq $requests); do curl -s -o /dev/null -w 'time %{time_total}\\\\n' http://127.0.0.1:8080/small.txt; done"],
 "network": {"allow": [{"host": "127.0.0.1", "ports": [8080]}], "allow_private": ["127.0.0.1/32"]},
 "limits": {"seconds": 600, "memory_mb": 512, "processes": 16, "network_down_mb": 65536, "network_connections": 10000}}
JSON
direct=$(sh -c "curl -s -o /dev/null -w 'speed %{speed_download}\n' http://127.0.0.1:8080/big.bin; for i in \$(seq $requests); do curl -s -o /dev/null -w 'time %{time_total}\n' http://127.0.0.1:8080/small.txt; done")
proxied=$("$aj" run --manifest "$manifest")
summarize() {
  local input speed median
  input=$(cat)
  speed=$(echo "$input" | awk '/^speed/ {printf "%.0f", $2/1048576}')
  median=$(echo "$input" | awk '/^time/ {print $2*1000}' | sort -n | awk '{a[NR]=$1} END {printf "%.3f", a[int((NR+1)/2)]}')
  echo "$speed MB/s, median request ${median} ms"
}
echo "download ${size_mb} MiB and ${requests} small requests on loopback"
echo "direct:  $(echo "$direct" | summarize)"
echo "gateway: $(echo "$proxied" | summarize)"
