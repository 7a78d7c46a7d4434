#!/usr/bin/env bash
# Egress gateway benchmark, direct on loopback vs through the gateway (curl inside an agentjail
# sandbox whose only way out is the proxy), side by side in one run:
#   - a large plain-HTTP download from a slow upstream (Python's http.server) and from a fast one
#     (a small Python server that answers with sendfile(2) and keeps connections alive);
#   - a large download over TLS through a CONNECT tunnel (openssl s_server -WWW), the path every
#     https:// client takes;
#   - many small requests, one curl process each (new connection per request), and the same
#     number on one kept-alive connection (one curl process, many URLs).
# Runs entirely inside a network namespace made for it (loopback only). Needs root.
# Usage: bench/egress.sh [SIZE_MB] [REQUESTS] [ROUNDS]   (AGENTJAIL_BIN=path: use that binary,
# no build). ROUNDS (default 1) runs direct, gateway, direct, gateway… with the same upstreams
# and prints every round, then the median and the range of each figure (shares and ratios are
# medians of the per-round values). AGENTJAIL_BENCH_CPUS sets the sandbox's limits.cpus
# (default: the manifest default, 1).
set -euo pipefail
cd "$(dirname "$0")/.."
size_mb=${1:-1024}
requests=${2:-200}
rounds=${3:-1}
[ -n "${AGENTJAIL_BIN:-}" ] || cargo build --release -q -p agentjail
if [ "${AGENTJAIL_BENCH_IN_NETNS:-}" != 1 ]; then
  exec env AGENTJAIL_BENCH_IN_NETNS=1 unshare -n -- "$0" "$@"
fi
ip link set lo up
aj="${AGENTJAIL_BIN:-$PWD/target/x86_64-unknown-linux-gnu/release/agentjail}"
work=$(mktemp -d /tmp/agentjail-egress-bench-XXXXXX)
chmod 755 "$work"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
head -c $((size_mb << 20)) /dev/zero > "$work/big.bin"
echo ok > "$work/small.txt"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj /CN=bench.test -keyout "$work/key.pem" -out "$work/cert.pem" >/dev/null 2>&1
cat > "$work/fast.py" <<'PY'
# HTTP/1.1 with keep-alive; bodies sent with socket.sendfile (sendfile(2)).
import os, socket, sys, threading
root = sys.argv[1]
def handle(c):
    f = c.makefile("rb")
    try:
        while True:
            line = f.readline()
            if not line:
                return
            path = line.split()[1].decode()
            while f.readline() not in (b"\r\n", b""):
                pass
            fn = os.path.join(root, os.path.basename(path))
            with open(fn, "rb") as fh:
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % os.fstat(fh.fileno()).st_size)
                c.sendfile(fh)
    except OSError:
        pass
    finally:
        c.close()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8081))
s.listen(128)
while True:
    c, _ = s.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=handle, args=(c,), daemon=True).start()
PY
chmod 644 "$work"/*
/usr/bin/python3 -m http.server 8080 --bind 127.0.0.1 --directory "$work" >/dev/null 2>&1 &
pids+=($!)
/usr/bin/python3 "$work/fast.py" "$work" >/dev/null 2>&1 &
pids+=($!)
(cd "$work" && exec openssl s_server -quiet -WWW -accept 127.0.0.1:8443 -cert cert.pem -key key.pem) >/dev/null 2>&1 &
pids+=($!)
# Wait until every upstream accepts (a fixed sleep was too short on a loaded machine).
for port in 8080 8081 8443; do
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
  done
done
# The workload, the same text run directly and inside the sandbox.
many=""
for _ in $(seq "$requests"); do many="$many -o /dev/null http://127.0.0.1:8081/small.txt"; done
cat > "$work/load.sh" <<SH
curl -s -o /dev/null -w 'slow %{speed_download}\n' http://127.0.0.1:8080/big.bin
curl -s -o /dev/null -w 'fast %{speed_download}\n' http://127.0.0.1:8081/big.bin
curl -sk -o /dev/null -w 'tls %{speed_download}\n' https://127.0.0.1:8443/big.bin
for i in \$(seq $requests); do curl -s -o /dev/null -w 'time %{time_total}\n' http://127.0.0.1:8081/small.txt; done
curl -s -w 'ka %{time_total}\n'$many
SH
chmod 644 "$work/load.sh"
manifest="$work/m.json"
cpus=""
[ -z "${AGENTJAIL_BENCH_CPUS:-}" ] || cpus="\"cpus\": $AGENTJAIL_BENCH_CPUS, "
cat > "$manifest" <<JSON
{"command": ["/bin/sh", "/input/load.sh"],
 "inputs": [{"source": "$work/load.sh", "mount": "/input/load.sh"}],
 "network": {"allow": [{"host": "127.0.0.1", "ports": [8080, 8081, 8443]}], "allow_private": ["127.0.0.1/32"]},
 "limits": {$cpus"seconds": 600, "memory_mb": 512, "processes": 16, "network_up_mb": 1024, "network_down_mb": 65536, "network_connections": 10000}}
JSON
mbs() { awk -v k="$1" '$1 == k {printf "%.0f", $2/1048576}'; }
median() { awk '/^time/ {print $2*1000}' | sort -n | awk '{a[NR]=$1} END {printf "%.3f", a[int((NR+1)/2)]}'; }
ka() { awk -v n="$requests" '/^ka/ {s += $2} END {printf "%.3f", s*1000/n}'; }
share() { awk -v d="$1" -v g="$2" 'BEGIN {printf "%.0f", d ? 100*g/d : 0}'; }
ratio() { awk -v d="$1" -v g="$2" 'BEGIN {printf "%.2f", d ? g/d : 0}'; }
# One figure per line of $work/figures: "round name value".
: > "$work/figures"
for r in $(seq "$rounds"); do
  direct=$(sh "$work/load.sh")
  proxied=$("$aj" run --manifest "$manifest")
  for k in slow fast tls; do
    d=$(echo "$direct" | mbs $k); g=$(echo "$proxied" | mbs $k)
    echo "$r $k.direct $d" >> "$work/figures"
    echo "$r $k.gateway $g" >> "$work/figures"
    echo "$r $k.share $(share "$d" "$g")" >> "$work/figures"
  done
  for k in new ka; do
    if [ $k = new ]; then d=$(echo "$direct" | median); g=$(echo "$proxied" | median)
    else d=$(echo "$direct" | ka); g=$(echo "$proxied" | ka); fi
    echo "$r $k.direct $d" >> "$work/figures"
    echo "$r $k.gateway $g" >> "$work/figures"
    echo "$r $k.ratio $(ratio "$d" "$g")" >> "$work/figures"
  done
  if [ "$rounds" -gt 1 ]; then
    awk -v r="$r" -v load="$(cut -d' ' -f1 /proc/loadavg)" '$1 == r {v[$2] = $3} END {
      printf "round %d (load %s): slow %s%% fast %s%% tls %s%% (%s/%s MB/s) new %s/%s ms ka %s/%s ms (%s×)\n",
        r, load, v["slow.share"], v["fast.share"], v["tls.share"], v["tls.direct"], v["tls.gateway"],
        v["new.direct"], v["new.gateway"], v["ka.direct"], v["ka.gateway"], v["ka.ratio"]}' "$work/figures"
  fi
done
# Median (and, over several rounds, the range) of one figure.
stat() {
  awk -v k="$1" '$2 == k {print $3}' "$work/figures" | sort -g | awk -v n="$rounds" -v f="$2" -v unit="$3" '
    {a[NR] = $1} END {
      m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
      printf f unit, m
      if (n > 1) printf " [" f "-" f "]", a[1], a[NR] }'
}
if [ "$rounds" -gt 1 ]; then
  echo "download ${size_mb} MiB three ways and ${requests} small requests on loopback, ${rounds} interleaved rounds: medians [min-max]"
else
  echo "download ${size_mb} MiB three ways and ${requests} small requests on loopback"
fi
printf '%-28s %22s %22s %18s\n' "" direct gateway "share / ratio"
for k in slow fast tls; do
  printf '%-28s %22s %22s %18s\n' "download ($k upstream)" "$(stat $k.direct %.0f ' MB/s')" "$(stat $k.gateway %.0f ' MB/s')" "$(stat $k.share %.0f %%)"
done
printf '%-28s %22s %22s %18s\n' "new connection per request" "$(stat new.direct %.3f ' ms')" "$(stat new.gateway %.3f ' ms')" "$(stat new.ratio %.2f ×)"
printf '%-28s %22s %22s %18s\n' "kept-alive, per request" "$(stat ka.direct %.3f ' ms')" "$(stat ka.gateway %.3f ' ms')" "$(stat ka.ratio %.2f ×)"
