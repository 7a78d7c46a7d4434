#!/usr/bin/env bash
# The worker fleet's scaling (issue #19): throughput at 1, 2 and 3 workers on the same short
# task, and the fleet's per-run overhead against one `serve` on SQLite with the same slots.
#   fleet:  a throwaway PostgreSQL cluster (initdb and pg_ctl as the user `postgres`, else
#           `nobody`, in a temporary folder, 127.0.0.1 at a free port, fsync off), one
#           `serve --slots 0` (the API replica: it only enqueues) and K = 1, 2, 3 `agentjail
#           worker --slots 1` processes (1 slot each: a worker's slot is the unit that scales);
#           N runs of the fixed-program task `tiny` (python3 writes a 1-line JSON file; no
#           inputs, no network) submitted by 8 concurrent HTTP clients (keep-alive, `wait` =
#           true), timed from the first request to the last answer; every run must end `ok`
#           and be recorded exactly once (one row per request, one `run_start` each);
#   single: the same N runs through one `agentjail serve` on SQLite with K run slots.
# For each K the two alternate for ROUNDS rounds (fleet, single, fleet, single, ...), each on a
# fresh database and data directories after a short warm-up; the medians are printed: runs/s,
# the fleet's scaling (÷ its 1-worker figure), and fleet / single, with the load average (1
# min) at the start of each round.
# Usage: bench/fleet.sh [N] [ROUNDS]   (as root, like CI; needs python3 and PostgreSQL's
# initdb/pg_ctl (Debian: postgresql); builds the release binary, or takes $AGENTJAIL_BIN).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-60}
rounds=${2:-3}
if [ -z "${AGENTJAIL_BIN:-}" ]; then
  cargo build --release -q -p agentjail
  aj="$PWD/target/x86_64-unknown-linux-gnu/release/agentjail"
else
  aj=$(realpath "$AGENTJAIL_BIN")
fi
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -n "$pgbin" ] && [ -x "$pgbin/initdb" ] || { echo "bench/fleet.sh: PostgreSQL's initdb not found (apt-get install postgresql)" >&2; exit 1; }
work=$(mktemp -d /tmp/agentjail-bench-fleet-XXXXXX)
chmod 755 "$work"
cleanup() {
  # Any cluster a round left running (an error mid-round), then the folder.
  for d in "$work"/pg*/data; do
    [ -d "$d" ] && setpriv --reuid="$(stat -c %u "$d")" --regid="$(stat -c %g "$d")" --clear-groups \
      "$pgbin/pg_ctl" -D "$d" -m immediate -w stop >/dev/null 2>&1 || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
AJ="$aj" PGBIN="$pgbin" WORK="$work" N="$n" ROUNDS="$rounds" python3 - <<'PY'
import hashlib, http.client, json, os, pwd, re, shutil, socket, statistics, subprocess, sys, threading, time

aj, pgbin, work = os.environ["AJ"], os.environ["PGBIN"], os.environ["WORK"]
n, rounds = int(os.environ["N"]), int(os.environ["ROUNDS"])
CLIENTS, WORKERS = 8, (1, 2, 3)
token = "bench-token-" + os.urandom(8).hex()
try:
    owner = pwd.getpwnam("postgres")
except KeyError:
    owner = pwd.getpwnam("nobody")


def config(slots):
    return f"""
[server]
max_concurrent_runs = {slots}
max_queued_runs = 256
lease_seconds = 10
auth_failure_audit_seconds = 3600

[tenants.bench]

[actors.bench]
tenant = "bench"
token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"

[tasks.tiny]
description = "Writes one line of JSON"
code = "forbidden"
command = ["/usr/bin/python3", "-c", "import json; json.dump({{'ok': True}}, open('/output/o.json', 'w'))"]
allowed_tenants = ["bench"]
[tasks.tiny.output]
path = "/output/o.json"
media_type = "application/json"
max_bytes = 100
[tasks.tiny.limits]
seconds = 30
"""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def as_owner(*args):
    return subprocess.run(["setpriv", f"--reuid={owner.pw_uid}", f"--regid={owner.pw_gid}",
                           "--clear-groups", *args], check=True, capture_output=True, text=True)


def pg_start(tag):
    d = f"{work}/pg{tag}"
    os.makedirs(d)
    os.chown(d, owner.pw_uid, owner.pw_gid)
    port = free_port()
    as_owner(f"{pgbin}/initdb", "-D", f"{d}/data", "-U", "agentjail", "--auth=trust", "-E", "UTF8",
             "--no-sync")
    as_owner(f"{pgbin}/pg_ctl", "-D", f"{d}/data", "-l", f"{d}/log", "-w", "-t", "60", "-o",
             f"-c listen_addresses=127.0.0.1 -p {port} -k {d} -c fsync=off -c max_connections=200",
             "start")
    subprocess.run(["psql", "-X", "-q", "-h", d, "-p", str(port), "-U", "agentjail", "-d", "postgres",
                    "-c", "CREATE DATABASE agentjail"], check=True, capture_output=True)
    return d, port


def pg_stop(d):
    as_owner(f"{pgbin}/pg_ctl", "-D", f"{d}/data", "-m", "immediate", "-w", "stop")
    shutil.rmtree(d)


def psql(d, port, sql):
    return subprocess.run(["psql", "-X", "-q", "-t", "-A", "-h", d, "-p", str(port), "-U", "agentjail",
                           "-d", "agentjail", "-c", sql], check=True, capture_output=True, text=True).stdout.strip()


def start(args, tag, slots, ready):
    d = f"{work}/{tag}"
    os.makedirs(d)
    os.chmod(d, 0o755)
    open(f"{d}/config.toml", "w").write(config(slots))
    p = subprocess.Popen([aj, *args, "--config", f"{d}/config.toml", "--data-dir", f"{d}/data"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "AGENTJAIL_LOG": "warn"})
    found = None
    seen = []
    for line in p.stderr:
        seen.append(line)
        if ready in line:
            found = line
            break
    if found is None:
        sys.exit(f"{args[0]} did not start:\n{''.join(seen)}")
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    return p, d, found


def stop(procs):
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()


def load_runs(port, tag):
    """N runs (after 4 untimed warm-up runs) by CLIENTS clients; returns the seconds."""
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def submit(conn, rid):
        conn.request("POST", "/v1/runs", body=json.dumps({"request_id": rid, "task": "tiny", "inputs": []}),
                     headers=auth)
        resp = conn.getresponse()
        v = json.loads(resp.read())
        assert resp.status == 200 and v["status"] == "ok", (resp.status, v)

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    for i in range(4):
        submit(c, f"warm-{tag}-{i}")
    c.close()
    ids = iter(range(n))
    lock = threading.Lock()
    errors = []

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        try:
            while True:
                with lock:
                    i = next(ids, None)
                if i is None:
                    return
                submit(conn, f"bench-{tag}-{i}")
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.monotonic() - t0
    if errors:
        sys.exit(f"round {tag}: {errors[0]!r}")
    return dt


def fleet_round(k, r):
    tag = f"f{k}-{r}"
    d, port = pg_start(tag)
    url = f"postgres://agentjail@127.0.0.1:{port}/agentjail?sslmode=disable"
    procs = []
    try:
        api, _, line = start(["serve", "--listen", "127.0.0.1:0", "--slots", "0", "--database", url],
                             f"{tag}-api", 1, "listening on ")
        procs.append(api)
        api_port = int(re.search(r"listening on http://127\.0\.0\.1:(\d+)", line).group(1))
        for w in range(k):
            wp, _, _ = start(["worker", "--slots", "1", "--node-id", f"w{w}", "--database", url],
                             f"{tag}-w{w}", 1, "claiming runs")
            procs.append(wp)
        dt = load_runs(api_port, tag)
        rows = psql(d, port, "SELECT count(*), count(DISTINCT request_id), count(*) FILTER (WHERE status = 'ok') FROM runs WHERE request_id LIKE 'bench-%'")
        starts = psql(d, port, "SELECT count(*) FROM audit_log WHERE record LIKE '%\"event\":\"run_start\"%' AND record LIKE '%\"request_id\":\"bench-%'")
        assert rows == f"{n}|{n}|{n}", f"runs recorded (rows|distinct|ok): {rows}, expected {n} of each"
        assert starts == str(n), f"run_start records: {starts}, expected {n}"
        owners = psql(d, port, "SELECT count(DISTINCT node_id) FROM runs WHERE request_id LIKE 'bench-%'")
    finally:
        stop(procs)
        pg_stop(d)
    for p in os.listdir(work):
        if p.startswith(tag):
            shutil.rmtree(f"{work}/{p}")
    return dt, owners


def single_round(k, r):
    tag = f"s{k}-{r}"
    p, d, line = start(["serve", "--listen", "127.0.0.1:0"], tag, k, "listening on ")
    try:
        port = int(re.search(r"listening on http://127\.0\.0\.1:(\d+)", line).group(1))
        dt = load_runs(port, tag)
    finally:
        stop([p])
    shutil.rmtree(d)
    return dt


res = {}
for k in WORKERS:
    for r in range(rounds):
        load = os.getloadavg()[0]
        f, owners = fleet_round(k, r)
        s = single_round(k, r)
        res.setdefault(k, []).append((n / f, n / s, load))
        print(f"{k} worker(s), round {r + 1} (load {load:.1f}): fleet {n} runs in {f:.2f} s = {n / f:.2f} runs/s "
              f"(nodes that started runs: {owners or '?'}); single serve ({k} slots, SQLite) {n / s:.2f} runs/s; "
              f"fleet / single {s / f:.3f}", flush=True)
print(f"\nmedian of {rounds} rounds, {n} runs of `tiny` each, {CLIENTS} clients (load average now {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs):")
print("  workers | fleet runs/s | scaling (÷ 1 worker) | single serve runs/s (same slots) | fleet / single")
base = statistics.median(x[0] for x in res[WORKERS[0]])
for k in WORKERS:
    fm = statistics.median(x[0] for x in res[k])
    sm = statistics.median(x[1] for x in res[k])
    print(f"  {k:7d} | {fm:12.2f} | {fm / base:20.2f} | {sm:32.2f} | {fm / sm:14.3f}")
PY
