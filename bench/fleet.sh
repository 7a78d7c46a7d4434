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
#
# bench/fleet.sh stop [SECONDS] [ROUNDS]   (issue #30: "the fleet survives any one node")
#   Latency while a node is stopped. Per round, on a fresh cluster: two API replicas
#   (`serve --slots 0`, node ids api-a and api-b) and two workers (`worker --slots 2`, w0 and
#   w1). 8 clients on api-a, paced to $AGENTJAIL_BENCH_RATE submissions/s in all (default 6;
#   below what the two workers run, so the queue stays short), each: POST /v1/runs?wait=false
#   of `tiny` with a unique request_id (must answer 202, or 200 if the run was final by the
#   answer, counted; a 429 or 503 is retried with the same request_id and counted apart, its
#   time not in the figures); 4 more on api-a, 12 GETs/s in all, each GET /v1/runs/{id} of a
#   run submitted before, picked at random (200 or 202). 2 clients on api-b, 2 submissions/s
#   in all, each followed by 100 GETs of it ($AGENTJAIL_BENCH_B_GETS; reads are audited, so
#   api-b appends audit records all the time, as a replica serving status polls does; not
#   reported). After 3 s of warm-up and 15 s without stops, a chaos loop repeats for SECONDS
#   (default 110): wait a random 0.1-0.5 s, SIGSTOP one of w0, w1, api-b chosen at random at
#   that random moment, hold it stopped 1 s ($AGENTJAIL_BENCH_STOP), SIGCONT it. A stop of fixed length bounds any stall it
#   causes (so the bench cannot hang), and short stops make many of them: only a stop that
#   lands while the node holds the audit lock (old design) stalls the others. Half-way through
#   each stop it counts the sessions waiting on an advisory lock (pg_locks). Reported per binary,
#   over its rounds: p50/p99/max of api-a's submissions (202) and GETs in two windows: requests
#   that overlap no stop ("no node stopped") and requests that overlap one ("a node stopped");
#   the stops per target, those during which an api-a request took over half the stop
#   ("stalled"), those with an advisory-lock waiter half-way, and the load average (1 min) at
#   each round's start and end. With $AGENTJAIL_BIN_OLD set, rounds alternate old, new, old,
#   new, ... ($AGENTJAIL_BIN, or the release build, is "new"). Signals go only to processes the
#   bench started (their Popen handles; they also die with it, PR_SET_PDEATHSIG); everything
#   listens on 127.0.0.1; every process and folder is removed at exit, also on error.
#   Example: AGENTJAIL_BIN_OLD=/tmp/aj-old AGENTJAIL_BIN=/tmp/aj-new bench/fleet.sh stop 110 2
#
# bench/fleet.sh live [N] [ROUNDS]   (issue #34: a live session's cell on the fleet)
#   One caller, N sequential `print(1)` cells (after one untimed cell that starts the
#   interpreter) in one live session (`session.interpreter = "python"`), per round each way:
#   fleet: a fresh cluster, one `serve --slots 0` (the replica the caller talks to) and one
#   `worker --slots 2` (holds the interpreter); single: one `serve` on SQLite (2 slots), the
#   same cells. Prints p50/p99/max per way over all rounds. With $AGENTJAIL_BIN_OLD set, the
#   fleet way is also run with that binary in each round (old, new, single).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=scale
if [ "${1:-}" = stop ]; then
  mode=stop
  shift
  n=${1:-110}
  rounds=${2:-2}
elif [ "${1:-}" = live ]; then
  mode=live
  shift
  n=${1:-100}
  rounds=${2:-3}
else
  n=${1:-60}
  rounds=${2:-3}
fi
if [ -z "${AGENTJAIL_BIN:-}" ]; then
  cargo build --release -q -p agentjail
  aj="$PWD/target/x86_64-unknown-linux-gnu/release/agentjail"
else
  aj=$(realpath "$AGENTJAIL_BIN")
fi
aj_old=""
if [ "$mode" != scale ] && [ -n "${AGENTJAIL_BIN_OLD:-}" ]; then
  aj_old=$(realpath "$AGENTJAIL_BIN_OLD")
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
MODE="$mode" AJ="$aj" AJ_OLD="$aj_old" PGBIN="$pgbin" WORK="$work" N="$n" ROUNDS="$rounds" python3 - <<'PY'
import hashlib, http.client, json, os, pwd, re, shutil, socket, statistics, subprocess, sys, threading, time

aj, pgbin, work = os.environ["AJ"], os.environ["PGBIN"], os.environ["WORK"]
n, rounds = int(os.environ["N"]), int(os.environ["ROUNDS"])
CLIENTS, WORKERS = 8, (1, 2, 3)
token = "bench-token-" + os.urandom(8).hex()
try:
    owner = pwd.getpwnam("postgres")
except KeyError:
    owner = pwd.getpwnam("nobody")


def config(slots, node_id=None):
    return f"""
[server]
max_concurrent_runs = {slots}
max_queued_runs = 256
{f'node_id = "{node_id}"' if node_id else ''}
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

[tasks.live]
description = "Cells in a live session"
code = "allowed"
command = ["/usr/bin/python3", "/input/code.py"]
allowed_tenants = ["bench"]
[tasks.live.output]
path = "/output/o.json"
media_type = "application/json"
max_bytes = 100
[tasks.live.limits]
seconds = 30
[tasks.live.session]
interpreter = "python"
max_cells = 100000
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
    shutil.rmtree(d, ignore_errors=True)  # the trap removes whatever is left


def psql(d, port, sql):
    return subprocess.run(["psql", "-X", "-q", "-t", "-A", "-h", d, "-p", str(port), "-U", "agentjail",
                           "-d", "agentjail", "-c", sql], check=True, capture_output=True, text=True).stdout.strip()


def start(args, tag, slots, ready, binary=None, node_id=None, preexec=None):
    d = f"{work}/{tag}"
    os.makedirs(d)
    os.chmod(d, 0o755)
    open(f"{d}/config.toml", "w").write(config(slots, node_id))
    p = subprocess.Popen([binary or aj, *args, "--config", f"{d}/config.toml", "--data-dir", f"{d}/data"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "AGENTJAIL_LOG": "warn"}, preexec_fn=preexec)
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


# ---- `stop` mode: latency while a node is stopped (issue #30) ----
import ctypes, math, random, signal

STOP_S = float(os.environ.get("AGENTJAIL_BENCH_STOP", "1"))
RATE = float(os.environ.get("AGENTJAIL_BENCH_RATE", "6"))
GAP = (0.1, 0.5)
QUIET_S = 15  # no stop yet: the first window's baseline
A_CLIENTS, A_READERS, A_READ_RATE, B_CLIENTS, B_RATE = 8, 4, 12.0, 2, 2.0
B_GETS = int(os.environ.get("AGENTJAIL_BENCH_B_GETS", "100"))
STALL_S = STOP_S / 2
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlive the bench


def _terminated(signum, frame):
    sys.exit(f"bench/fleet.sh: signal {signum}")


def pct(xs, q):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


class Load:
    """One replica's clients: each paced to `period` s per submission (202) + `gets` GETs of
    it; and `readers` clients paced to `read_rate` GETs/s in all, each of a run submitted
    before, picked at random (so that GETs start at any moment, not only after a POST)."""

    def __init__(self, port, name, clients, rate, end, gets=0, readers=0, read_rate=1.0):
        self.port, self.name, self.end, self.gets = port, name, end, gets
        self.period = clients / rate
        self.read_period = readers / read_rate if readers else 0
        self.post, self.get = [], []  # (t0, t1)
        self.retried = {}  # status -> count (429, 503: retried, not in the figures)
        self.errors = []
        self.ids = []
        self.threads = [threading.Thread(target=self.client, args=(c,), daemon=True) for c in range(clients)]
        self.threads += [threading.Thread(target=self.reader, daemon=True) for _ in range(readers)]

    def reader(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        nxt = time.monotonic() + random.uniform(0, self.read_period)
        try:
            while not self.end.is_set():
                d = nxt - time.monotonic()
                if d > 0:
                    time.sleep(d)
                nxt = max(nxt + self.read_period, time.monotonic())
                if not self.ids:
                    continue
                rid = random.choice(self.ids)
                st, t0, t1 = self.req(conn, "GET", f"/v1/runs/{rid}")
                if st in (200, 202):
                    self.get.append((t0, t1))
                elif st == 503:
                    self.retried["GET 503"] = self.retried.get("GET 503", 0) + 1
                else:
                    raise AssertionError(f"GET {rid}: {st}")
        except Exception as e:  # noqa: BLE001 (reported by the round)
            self.errors.append(e)

    def req(self, conn, method, path, body=None):
        h = {"Authorization": f"Bearer {token}"}
        if body is not None:
            h["Content-Type"] = "application/json"
        t0 = time.monotonic()
        conn.request(method, path, body=body, headers=h)
        resp = conn.getresponse()
        resp.read()
        return resp.status, t0, time.monotonic()

    def client(self, c):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        i = 0
        nxt = time.monotonic() + random.uniform(0, self.period)
        try:
            while not self.end.is_set():
                d = nxt - time.monotonic()
                if d > 0:
                    time.sleep(d)
                nxt = max(nxt + self.period, time.monotonic())  # no burst after a stall
                rid = f"{self.name}-{c}-{i}"
                i += 1
                body = json.dumps({"request_id": rid, "task": "tiny", "inputs": []})
                tries = 0
                while True:
                    st, t0, t1 = self.req(conn, "POST", "/v1/runs?wait=false", body)
                    if st in (200, 202):  # 200: the run was final by the answer (or a retry's replay)
                        self.post.append((t0, t1))
                        if st == 200:
                            self.retried["POST 200"] = self.retried.get("POST 200", 0) + 1
                        self.ids.append(rid)
                        break
                    tries += 1
                    if st in (429, 503):
                        self.retried[f"POST {st}"] = self.retried.get(f"POST {st}", 0) + 1
                        time.sleep(0.1)
                        continue
                    raise AssertionError(f"POST {rid}: {st}")
                for _ in range(self.gets):
                    st, t0, t1 = self.req(conn, "GET", f"/v1/runs/{rid}")
                    if st in (200, 202):
                        self.get.append((t0, t1))
                        continue
                    if st == 503:  # counted apart, not retried
                        self.retried["GET 503"] = self.retried.get("GET 503", 0) + 1
                        time.sleep(0.1)
                        continue
                    raise AssertionError(f"GET {rid}: {st}")
        except Exception as e:  # noqa: BLE001 (reported by the round)
            self.errors.append(e)


def stop_round(binary, label, r, secs):
    tag = f"x{label}-{r}"
    d, port = pg_start(tag)
    url = f"postgres://agentjail@127.0.0.1:{port}/agentjail?sslmode=disable"
    procs = []
    stops = []  # (target, t_stop, t_cont, advisory-lock waiters half-way)
    end, chaos_end = threading.Event(), threading.Event()
    load0 = os.getloadavg()[0]
    try:
        ports = {}
        for name in ("api-a", "api-b"):
            p, _, line = start(["serve", "--listen", "127.0.0.1:0", "--slots", "0", "--database", url],
                               f"{tag}-{name}", 1, "listening on ", binary, name, _die_with_parent)
            procs.append(p)
            ports[name] = (p, int(re.search(r"listening on http://127\.0\.0\.1:(\d+)", line).group(1)))
        targets = {"api-b": ports["api-b"][0]}
        for w in ("w0", "w1"):
            p, _, _ = start(["worker", "--slots", "2", "--node-id", w, "--database", url],
                            f"{tag}-{w}", 2, "claiming runs", binary, None, _die_with_parent)
            procs.append(p)
            targets[w] = p
        c = http.client.HTTPConnection("127.0.0.1", ports["api-a"][1], timeout=120)
        for i in range(4):  # warm-up, through the workers
            c.request("POST", "/v1/runs", body=json.dumps({"request_id": f"warm-{i}", "task": "tiny", "inputs": []}),
                      headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            resp = c.getresponse()
            v = json.loads(resp.read())
            assert resp.status == 200 and v["status"] == "ok", (resp.status, v)
        c.close()
        la = Load(ports["api-a"][1], "a", A_CLIENTS, RATE, end, 0, A_READERS, A_READ_RATE)
        lb = Load(ports["api-b"][1], "b", B_CLIENTS, B_RATE, end, B_GETS)
        for t in la.threads + lb.threads:
            t.start()
        time.sleep(3 + QUIET_S)

        def chaos():
            rnd = random.Random()
            deadline = time.monotonic() + secs
            while time.monotonic() < deadline and not chaos_end.is_set():
                time.sleep(rnd.uniform(*GAP))
                name = rnd.choice(sorted(targets))
                p = targets[name]
                waiters = -1
                t_stop = time.monotonic()
                p.send_signal(signal.SIGSTOP)
                try:
                    time.sleep(STOP_S / 2)
                    waiters = psql(d, port, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
                    rest = STOP_S - (time.monotonic() - t_stop)
                    if rest > 0:
                        time.sleep(rest)
                finally:
                    p.send_signal(signal.SIGCONT)
                stops.append((name, t_stop, time.monotonic(), int(waiters)))

        ch = threading.Thread(target=chaos, daemon=True)
        ch.start()
        ch.join(secs + 60)
        assert not ch.is_alive(), "the chaos loop did not end"
        time.sleep(2)
        end.set()
        for t in la.threads + lb.threads:
            t.join(90)
        if la.errors or lb.errors:
            sys.exit(f"round {tag}: {(la.errors + lb.errors)[0]!r}")
        states = psql(d, port, "SELECT string_agg(status || '=' || n, ' ' ORDER BY status) FROM (SELECT status, count(*) n FROM runs GROUP BY status) s")
    finally:
        chaos_end.set()
        end.set()
        for p in procs:  # none stays stopped
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        pg_stop(d)
        for q in os.listdir(work):
            if q.startswith(tag):
                shutil.rmtree(f"{work}/{q}")
    load1 = os.getloadavg()[0]

    def split(samples):
        quiet, stopped = [], []
        for t0, t1 in samples:
            (stopped if any(s < t1 and t0 < e for _, s, e, _ in stops) else quiet).append(t1 - t0)
        return quiet, stopped

    stalled = {}
    for name, s, e, _ in stops:
        worst = max((t1 - t0 for t0, t1 in la.post + la.get if s < t1 and t0 < e), default=0.0)
        if worst > STALL_S:
            stalled[name] = stalled.get(name, 0) + 1
    res = {"post": split(la.post), "get": split(la.get), "stops": stops, "stalled": stalled,
           "retried": la.retried, "load": (load0, load1), "states": states}
    print(f"{label} round {r + 1}: load {load0:.1f}->{load1:.1f}; runs at the end: {states}; "
          f"api-a submissions {len(la.post)}, GETs {len(la.get)}, other answers {la.retried or 'none'} "
          f"(api-b submissions {len(lb.post)}, GETs {len(lb.get)}, other answers {lb.retried or 'none'})", flush=True)
    print(f"  stops: {len(stops)} ({', '.join(f'{k} {sum(1 for x in stops if x[0] == k)}' for k in sorted(targets))}); "
          f"stalled (an api-a request > {STALL_S:g} s): {sum(stalled.values())} {stalled or ''}; "
          f"with an advisory-lock waiter {STOP_S / 2:g} s in: {sum(1 for x in stops if x[3] > 0)}", flush=True)
    for what in ("post", "get"):
        q, s = res[what]
        print(f"  {what.upper():4s} no node stopped: n {len(q)} p50 {pct(q, .5) * 1e3:.1f} p99 {pct(q, .99) * 1e3:.1f} "
              f"max {max(q, default=0) * 1e3:.1f} ms | a node stopped: n {len(s)} p50 {pct(s, .5) * 1e3:.1f} "
              f"p99 {pct(s, .99) * 1e3:.1f} max {max(s, default=0) * 1e3:.1f} ms", flush=True)
    return res


def stop_main():
    signal.signal(signal.SIGTERM, _terminated)
    signal.signal(signal.SIGHUP, _terminated)
    bins = [("new", aj)]
    if os.environ.get("AJ_OLD"):
        bins = [("old", os.environ["AJ_OLD"]), ("new", aj)]
    for label, b in bins:
        v = subprocess.run([b, "--version"], capture_output=True, text=True).stdout.strip()
        print(f"{label}: {b}: {v}", flush=True)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {n} s of stops per round, {rounds} "
          f"round(s) per binary; stop {STOP_S:g} s, gap {GAP[0]:g}-{GAP[1]:g} s; {QUIET_S} s without stops first; {A_CLIENTS} clients on api-a at "
          f"{RATE:g} submissions/s in all and {A_READERS} at {A_READ_RATE:g} GETs/s, {B_CLIENTS} on api-b at {B_RATE:g}/s ({B_GETS} GETs each)", flush=True)
    out = {label: [] for label, _ in bins}
    for r in range(rounds):
        for label, b in bins:
            out[label].append(stop_round(b, label, r, n))
    print(f"\nall rounds per binary (load average now {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs); ms:")
    print("  binary | window | POST n | p50 | p99 | max | GET n | p50 | p99 | max")
    for label, _ in bins:
        rs = out[label]
        for w, wname in ((0, "no node stopped"), (1, "a node stopped")):
            po = [x for r_ in rs for x in r_["post"][w]]
            ge = [x for r_ in rs for x in r_["get"][w]]
            print(f"  {label} | {wname} | {len(po)} | {pct(po, .5) * 1e3:.1f} | {pct(po, .99) * 1e3:.1f} | "
                  f"{max(po, default=0) * 1e3:.1f} | {len(ge)} | {pct(ge, .5) * 1e3:.1f} | {pct(ge, .99) * 1e3:.1f} | "
                  f"{max(ge, default=0) * 1e3:.1f}")
    for label, _ in bins:
        rs = out[label]
        stops = [s for r_ in rs for s in r_["stops"]]
        by = {}
        for s in stops:
            by.setdefault(s[0], [0, 0, 0])[0] += 1
            by[s[0]][2] += s[3] > 0
        for r_ in rs:
            for k, v in r_["stalled"].items():
                by[k][1] += v
        retried = {}
        for r_ in rs:
            for k, v in r_["retried"].items():
                retried[k] = retried.get(k, 0) + v
        loads = [x for r_ in rs for x in r_["load"]]
        print(f"  {label}: stops {len(stops)}; per target (stops, stalled > {STALL_S:g} s, advisory-lock waiter): "
              f"{', '.join(f'{k} {v[0]}/{v[1]}/{v[2]}' for k, v in sorted(by.items()))}; api-a other answers "
              f"{retried or 'none'}; load {min(loads):.1f}-{max(loads):.1f}")


# ---- `live` mode: a live session's cell on the fleet against one node ----
def live_cells(port, tag):
    """Opens a live session, runs one untimed cell, then N timed `print(1)` cells; returns
    the seconds of each (every cell must end `ok` and print 1)."""
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def post(path, body):
        conn.request("POST", path, body=json.dumps(body), headers=auth)
        resp = conn.getresponse()
        v = json.loads(resp.read())
        assert resp.status in (200, 201), (resp.status, v)
        return v

    sid = post("/v1/sessions", {"request_id": f"live-{tag}", "task": "live"})["session_id"]
    post(f"/v1/sessions/{sid}/cells", {"request_id": "warm", "code": "x = 0"})
    times = []
    for i in range(n):
        t0 = time.monotonic()
        v = post(f"/v1/sessions/{sid}/cells", {"request_id": f"c{i}", "code": "print(1)"})
        times.append(time.monotonic() - t0)
        assert v["status"] == "ok" and v["stdout"]["head"].strip() == "1", v
    conn.request("DELETE", f"/v1/sessions/{sid}", headers=auth)
    conn.getresponse().read()
    conn.close()
    return times


def live_fleet_round(binary, tag):
    d, port = pg_start(tag)
    url = f"postgres://agentjail@127.0.0.1:{port}/agentjail?sslmode=disable"
    procs = []
    try:
        api, _, line = start(["serve", "--listen", "127.0.0.1:0", "--slots", "0", "--database", url],
                             f"{tag}-api", 1, "listening on ", binary=binary)
        procs.append(api)
        api_port = int(re.search(r"listening on http://127\.0\.0\.1:(\d+)", line).group(1))
        wp, _, _ = start(["worker", "--slots", "2", "--node-id", "w0", "--database", url],
                         f"{tag}-w0", 2, "claiming runs", binary=binary)
        procs.append(wp)
        return live_cells(api_port, tag)
    finally:
        stop(procs)
        pg_stop(d)


def live_single_round(tag):
    p, d, line = start(["serve", "--listen", "127.0.0.1:0"], tag, 2, "listening on ")
    try:
        port = int(re.search(r"listening on http://127\.0\.0\.1:(\d+)", line).group(1))
        return live_cells(port, tag)
    finally:
        stop([p])


def live_main():
    ways = [("fleet", aj)]
    if os.environ.get("AJ_OLD"):
        ways = [("fleet, old", os.environ["AJ_OLD"]), ("fleet", aj)]
    for label, b in ways:
        v = subprocess.run([b, "--version"], capture_output=True, text=True).stdout.strip()
        print(f"{label}: {b}: {v}", flush=True)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {n} cells per way, {rounds} round(s)", flush=True)
    out = {}
    for r in range(rounds):
        for label, b in ways:
            out.setdefault(label, []).extend(live_fleet_round(b, f"lf{len(out)}-{r}-{label[-3:]}"))
        out.setdefault("single", []).extend(live_single_round(f"ls-{r}"))
        print(f"round {r + 1} done (load {os.getloadavg()[0]:.1f})", flush=True)
    print(f"\n`print(1)` cells in a live session, {rounds} x {n} per way (load average now {os.getloadavg()[0]:.1f}); ms:")
    print("  way | n | p50 | p90 | p99 | max")
    for label, xs in out.items():
        print(f"  {label} | {len(xs)} | {pct(xs, .5) * 1e3:.1f} | {pct(xs, .9) * 1e3:.1f} | "
              f"{pct(xs, .99) * 1e3:.1f} | {max(xs) * 1e3:.1f}")


if os.environ["MODE"] == "stop":
    stop_main()
    sys.exit(0)
if os.environ["MODE"] == "live":
    live_main()
    sys.exit(0)

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
