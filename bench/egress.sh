#!/usr/bin/env bash
# Egress gateway benchmark, direct on loopback vs through the gateway (curl inside an agentjail
# sandbox whose only way out is the proxy), side by side in one run:
#   - a large plain-HTTP download from a slow upstream (Python's http.server) and from a fast one
#     (a small Python server that answers with sendfile(2) and keeps connections alive);
#   - a large download over TLS through a CONNECT tunnel (openssl s_server -WWW), the path every
#     https:// client takes;
#   - many small requests, one curl process each (new connection per request), and the same
#     number on one kept-alive connection (one curl process, many URLs);
#   - credentialed requests (network.credentials): nginx serves https://api.test on port 443
#     with a certificate from a test CA; through the gateway, which terminates the sandbox's TLS
#     and adds the secret (from the supervisor's environment) on its own TLS connection
#     upstream, curl makes REQUESTS small GETs on one kept-alive connection and one large
#     download of text (the gateway may scan response bodies for the secret); directly, curl
#     sends the same header itself. The gateway finds api.test through a tiny DNS server
#     (--egress-dns). Prints MB/s, the mean (with the first request's set-up) and median time
#     per request, and how many upstream connections nginx served the small requests on.
#     Every response must be 200: nginx answers 403 without the credential. Skipped when nginx
#     is not installed.
# Runs entirely inside a network namespace made for it (loopback only). Needs root.
# Usage: bench/egress.sh [SIZE_MB] [REQUESTS] [ROUNDS]   (AGENTJAIL_BIN=path: use that binary,
# no build). ROUNDS (default 1) runs direct, gateway, direct, gateway… with the same upstreams
# and prints every round, then the median and the range of each figure (shares and ratios are
# medians of the per-round values). AGENTJAIL_BENCH_CPUS sets the sandbox's limits.cpus
# (default: the manifest default, 1). AGENTJAIL_BENCH_TLS_RESUME=0: nginx issues no session
# tickets and keeps no session cache, so every upstream TLS handshake is a full one (by default
# the gateway resumes sessions from the first connection). The credentialed manifest uses only the fields every
# binary since credentials exist accepts, so old and new binaries run the same one.
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
# The credentialed phase's upstream, name and secret.
cred=0
if command -v nginx >/dev/null 2>&1; then cred=1; else echo "nginx not found: no credentialed phase" >&2; fi
if [ $cred = 1 ]; then
  mkdir -p "$work/cred/v1" "$work/nginx"
  secret="Bearer sk-bench-$(head -c 18 /dev/urandom | base64 | tr '+/' '-_')"
  (cd "$work" && ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes" &&
    openssl req -x509 $ec -days 2 -subj "/CN=agentjail bench CA" -keyout ca.key -out ca.pem &&
    openssl req $ec -subj /CN=api.test -keyout api.key -out api.csr &&
    printf 'subjectAltName=DNS:api.test\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n' > api.ext &&
    openssl x509 -req -in api.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
      -extfile api.ext -out api.pem) >/dev/null 2>&1
  echo ok > "$work/cred/v1/small.txt"
  # Text, not zeros: a body scanner's work depends on how often the needle's first byte occurs
  # (random base64: b/B and s/S, the first bytes of "Bearer sk-…", every ~32 bytes).
  base64 -w 76 < <(head -c $((size_mb * 786432)) /dev/urandom) > "$work/cred/v1/big.txt"
  truncate -s $((size_mb << 20)) "$work/cred/v1/big.txt"
  chmod -R a+rX "$work/cred" "$work/ca.pem"
  cat > "$work/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log;
events { worker_connections 1024; }
http {
  types { text/plain txt; }
  log_format conn '\$connection \$uri \$ssl_session_reused';
  access_log $work/nginx/access.log conn;
  client_body_temp_path $work/nginx/body;
  proxy_temp_path $work/nginx/proxy;
  fastcgi_temp_path $work/nginx/fastcgi;
  uwsgi_temp_path $work/nginx/uwsgi;
  scgi_temp_path $work/nginx/scgi;
  keepalive_requests 1000000;
  keepalive_timeout 600s;
  server {
    listen 127.0.0.1:443 ssl;
    server_name api.test;
    ssl_certificate $work/api.pem;
    ssl_certificate_key $work/api.key;
$([ "${AGENTJAIL_BENCH_TLS_RESUME:-1}" != 0 ] || echo "    ssl_session_tickets off; ssl_session_cache off;")
    root $work/cred;
    # Only a request that carries the credential gets the file (the script checks for 200).
    location /v1/ {
      if (\$http_authorization != "$secret") { return 403; }
    }
  }
}
NGINX
  nginx -e "$work/nginx/error.log" -p "$work/nginx" -c "$work/nginx.conf" &
  pids+=($!)
  # A name server for the gateway: api.test is 127.0.0.1 (TTL 300, as a real one would cache
  # it), any other name does not exist. The same answers as crates/cli/tests/common/netns.rs.
  cat > "$work/dns.py" <<'PY'
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 5353))
while True:
    q, peer = s.recvfrom(512)
    i, labels = 12, []
    while i < len(q) and q[i]:
        labels.append(q[i + 1:i + 1 + q[i]].decode("ascii", "replace").lower())
        i += 1 + q[i]
    end = i + 5
    if len(q) < 17 or end > len(q):
        continue
    known = ".".join(labels) == "api.test"
    a = [bytes([127, 0, 0, 1])] if known and q[i + 1:i + 3] == b"\0\1" else []
    r = q[:2] + bytes([0x81, 0x80 if known else 0x83]) + b"\0\1" + len(a).to_bytes(2, "big")
    r += b"\0\0\0\0" + q[12:end]
    for ip in a:
        r += b"\xc0\x0c\0\1\0\1\0\0\1\x2c\0\4" + ip
    s.sendto(r, peer)
PY
  /usr/bin/python3 "$work/dns.py" >/dev/null 2>&1 &
  pids+=($!)
  # Direct, curl itself resolves the name, trusts the test CA and sends the header.
  printf 'resolve = "api.test:443:127.0.0.1"\ncacert = "%s"\nheader = "Authorization: %s"\n' \
    "$work/ca.pem" "$secret" > "$work/direct.curlrc"
fi
/usr/bin/python3 -m http.server 8080 --bind 127.0.0.1 --directory "$work" >/dev/null 2>&1 &
pids+=($!)
/usr/bin/python3 "$work/fast.py" "$work" >/dev/null 2>&1 &
pids+=($!)
(cd "$work" && exec openssl s_server -quiet -WWW -accept 127.0.0.1:8443 -cert cert.pem -key key.pem) >/dev/null 2>&1 &
pids+=($!)
# Wait until every upstream accepts (a fixed sleep was too short on a loaded machine).
for port in 8080 8081 8443 $([ $cred = 0 ] || echo 443); do
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
# The credentialed workload, the same text run directly (CFG: curl's config for direct) and
# inside the sandbox (https_proxy and the gateway's CA come from agentjail).
cmany=""
for _ in $(seq "$requests"); do cmany="$cmany -o /dev/null https://api.test/v1/small.txt"; done
cat > "$work/cred.sh" <<SH
curl -s \${CFG:+-K "\$CFG"} -o /dev/null -w 'cdl %{speed_download} %{http_code}\n' https://api.test/v1/big.txt
curl -s \${CFG:+-K "\$CFG"} -w 'cka %{time_total} %{http_code}\n'$cmany
SH
chmod 644 "$work/cred.sh"
cmanifest="$work/cred.json"
cat > "$cmanifest" <<JSON
{"command": ["/bin/sh", "/input/cred.sh"],
 "inputs": [{"source": "$work/cred.sh", "mount": "/input/cred.sh"}],
 "network": {"allow": [{"host": "api.test", "ports": [443]}], "allow_private": ["127.0.0.1/32"],
   "credentials": [{"host": "api.test", "header": "Authorization", "value_from": "env:AJ_BENCH_TOKEN", "paths": ["/v1/"]}],
   "upstream_ca_file": "$work/ca.pem"},
 "limits": {$cpus"seconds": 600, "memory_mb": 512, "processes": 16, "network_up_mb": 1024, "network_down_mb": 65536, "network_connections": 10000}}
JSON
# Connections nginx served the small credentialed requests on, in its log after line $1, and
# how many of them resumed a TLS session.
conns() {
  sleep 0.3 # nginx logs a request after its last byte is sent
  awk -v from="$1" 'NR > from && $2 == "/v1/small.txt" && !($1 in c) {c[$1] = 1; n++; if ($3 == "r") res++}
    END {printf "%d %d\n", n, res}' "$work/nginx/access.log"
}
mbs() { awk -v k="$1" '$1 == k {printf "%.0f", $2/1048576}'; }
median() { awk -v k="${1:-time}" '$1 == k {print $2*1000}' | sort -n | awk '{a[NR]=$1} END {printf "%.3f", a[int((NR+1)/2)]}'; }
ka() { awk -v k="${1:-ka}" -v n="$requests" '$1 == k {s += $2} END {printf "%.3f", s*1000/n}'; }
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
  if [ $cred = 1 ]; then
    from=$(wc -l < "$work/nginx/access.log")
    direct=$(CFG="$work/direct.curlrc" sh "$work/cred.sh")
    dconns=$(conns "$from")
    from=$(wc -l < "$work/nginx/access.log")
    proxied=$(AJ_BENCH_TOKEN="$secret" "$aj" run --egress-dns 127.0.0.1:5353 --manifest "$cmanifest")
    gconns=$(conns "$from")
    for out in "$direct" "$proxied"; do
      if [ "$(echo "$out" | awk '$1 ~ /^c(dl|ka)$/ && $3 == 200' | wc -l)" != $((requests + 1)) ]; then
        printf 'credentialed phase: not every request got 200 (the credential missing?):\n%s\n' "$out" >&2
        exit 1
      fi
    done
    d=$(echo "$direct" | mbs cdl); g=$(echo "$proxied" | mbs cdl)
    echo "$r cdl.direct $d" >> "$work/figures"
    echo "$r cdl.gateway $g" >> "$work/figures"
    echo "$r cdl.share $(share "$d" "$g")" >> "$work/figures"
    d=$(echo "$direct" | ka cka); g=$(echo "$proxied" | ka cka)
    echo "$r cka.direct $d" >> "$work/figures"
    echo "$r cka.gateway $g" >> "$work/figures"
    echo "$r cka.ratio $(ratio "$d" "$g")" >> "$work/figures"
    d=$(echo "$direct" | median cka); g=$(echo "$proxied" | median cka)
    echo "$r ckm.direct $d" >> "$work/figures"
    echo "$r ckm.gateway $g" >> "$work/figures"
    echo "$r ckm.ratio $(ratio "$d" "$g")" >> "$work/figures"
    echo "$r cconn.direct ${dconns% *}" >> "$work/figures"
    echo "$r cconn.gateway ${gconns% *}" >> "$work/figures"
    echo "$r cres.direct ${dconns#* }" >> "$work/figures"
    echo "$r cres.gateway ${gconns#* }" >> "$work/figures"
  fi
  if [ "$rounds" -gt 1 ]; then
    awk -v r="$r" -v load="$(cut -d' ' -f1 /proc/loadavg)" '$1 == r {v[$2] = $3} END {
      printf "round %d (load %s): slow %s%% fast %s%% tls %s%% (%s/%s MB/s) new %s/%s ms ka %s/%s ms (%s×)\n",
        r, load, v["slow.share"], v["fast.share"], v["tls.share"], v["tls.direct"], v["tls.gateway"],
        v["new.direct"], v["new.gateway"], v["ka.direct"], v["ka.gateway"], v["ka.ratio"]
      if ("cdl.share" in v)
        printf "  credentialed: download %s/%s MB/s (%s%%) ka mean %s/%s ms (%s×) median %s/%s ms (%s×) upstream connections %s/%s (resumed %s/%s)\n",
          v["cdl.direct"], v["cdl.gateway"], v["cdl.share"], v["cka.direct"], v["cka.gateway"], v["cka.ratio"],
          v["ckm.direct"], v["ckm.gateway"], v["ckm.ratio"], v["cconn.direct"], v["cconn.gateway"], v["cres.direct"], v["cres.gateway"]}' "$work/figures"
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
what="download ${size_mb} MiB three ways and ${requests} small requests on loopback"
[ $cred = 0 ] || what="$what; credentialed: the same through a terminating gateway"
if [ "$rounds" -gt 1 ]; then
  echo "$what, ${rounds} interleaved rounds: medians [min-max]"
else
  echo "$what"
fi
printf '%-28s %22s %22s %18s\n' "" direct gateway "share / ratio"
for k in slow fast tls; do
  printf '%-28s %22s %22s %18s\n' "download ($k upstream)" "$(stat $k.direct %.0f ' MB/s')" "$(stat $k.gateway %.0f ' MB/s')" "$(stat $k.share %.0f %%)"
done
printf '%-28s %22s %22s %18s\n' "new connection per request" "$(stat new.direct %.3f ' ms')" "$(stat new.gateway %.3f ' ms')" "$(stat new.ratio %.2f ×)"
printf '%-28s %22s %22s %18s\n' "kept-alive, per request" "$(stat ka.direct %.3f ' ms')" "$(stat ka.gateway %.3f ' ms')" "$(stat ka.ratio %.2f ×)"
if [ $cred = 1 ]; then
  printf '%-28s %22s %22s %18s\n' "cred. download" "$(stat cdl.direct %.0f ' MB/s')" "$(stat cdl.gateway %.0f ' MB/s')" "$(stat cdl.share %.0f %%)"
  printf '%-28s %22s %22s %18s\n' "cred. kept-alive, mean" "$(stat cka.direct %.3f ' ms')" "$(stat cka.gateway %.3f ' ms')" "$(stat cka.ratio %.2f ×)"
  printf '%-28s %22s %22s %18s\n' "cred. kept-alive, median" "$(stat ckm.direct %.3f ' ms')" "$(stat ckm.gateway %.3f ' ms')" "$(stat ckm.ratio %.2f ×)"
  printf '%-28s %22s %22s %18s\n' "  upstream connections" "$(stat cconn.direct %.0f '')" "$(stat cconn.gateway %.0f '')" ""
  printf '%-28s %22s %22s %18s\n' "  of them TLS-resumed" "$(stat cres.direct %.0f '')" "$(stat cres.gateway %.0f '')" ""
fi
