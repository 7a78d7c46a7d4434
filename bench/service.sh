#!/usr/bin/env bash
# The orchestrator against direct runs, side by side in one script run (issue #15):
#   service: N CSV-summary runs (the example's summarize.py on its report.csv, the shipped
#            `summarize_csv` task with the code in the request) submitted to `agentjail serve`
#            (2 run slots) by 8 concurrent HTTP clients (keep-alive, `wait` = true; each a
#            thread with one socket and a minimal HTTP/1.1 parser), timed from the first
#            request to the last answer; every run must end `ok`;
#   direct:  the same N runs as `agentjail run` processes, 2 at a time (xargs -P 2), with what
#            the service's runner is given: the same manifest (inputs, output, schema, limits,
#            env), output dir, report, and a receipt signed with a key.
# The two alternate for ROUNDS rounds (service, direct, service, direct, …), each service round
# on a fresh data directory after a short warm-up (every round's files are removed only at the
# end: no round pays for the clean-up of another); the medians and their ratio are printed,
# with the load average (1 min) at the start of each round, and the CPU each path spends per
# run: direct, the runners' (getrusage of the waited-for children); service, the service
# process's own (its threads, /proc/<pid>/stat utime/stime), its runners' (cutime/cstime: the
# children it waited for) and the 8 HTTP clients' (this benchmark process's own CPU during the
# round). Runs are CPU-bound on a small machine, so the ratio of those totals predicts the
# throughput ratio even when other work shares the machine and makes the timed ratio scatter.
# Each round also prints the share of the machine's CPU left idle while it ran (/proc/stat): on
# an otherwise idle machine, what a path leaves unused between runs (waits, not work).
# With FOLLOW=1 (issue #33, "streaming on"), each service client submits with `?wait=false` and
# follows its run's events (`GET /v1/runs/{id}/events`, Server-Sent Events) on the same socket
# until `ended`, whose record must be `ok`: the path of an agent that watches its runs live.
# With FOLLOW=submit, each submission asks for the events itself (`Accept: text/event-stream`):
# one request per run.
# Usage: bench/service.sh [N] [ROUNDS]   (as root, like CI; needs python3; builds the release
# binary, or takes the one in $AGENTJAIL_BIN). With AGENTJAIL_BIN_BASE=another-binary, every
# round also runs a service round with that build, after this one's in odd rounds and before it in even ones (an A/B of two
# builds of the service on the same, possibly loaded, machine).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200}
rounds=${2:-3}
if [ -z "${AGENTJAIL_BIN:-}" ]; then
  cargo build --release -q -p agentjail
  aj="$PWD/target/x86_64-unknown-linux-gnu/release/agentjail"
else
  aj=$(realpath "$AGENTJAIL_BIN")
fi
base=""
if [ -n "${AGENTJAIL_BIN_BASE:-}" ]; then
  base=$(realpath "$AGENTJAIL_BIN_BASE")
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/agentjail-bench-service-XXXXXX")
chmod 755 "$work"
trap 'rm -rf "$work"' EXIT
AJ="$aj" AJ_BASE="$base" WORK="$work" N="$n" ROUNDS="$rounds" FOLLOW="${FOLLOW:-0}" python3 - <<'PY'
import hashlib, http.client, json, os, re, resource, shutil, socket, statistics, subprocess, sys, threading, time

aj, work, n, rounds = os.environ["AJ"], os.environ["WORK"], int(os.environ["N"]), int(os.environ["ROUNDS"])
follow = os.environ.get("FOLLOW") in ("1", "submit")
# FOLLOW=submit: one request per run, `POST /v1/runs` with `Accept: text/event-stream` (the
# events from `queued` to `ended` as its answer) instead of a submission and a follow.
in_one = os.environ.get("FOLLOW") == "submit"
aj_base = os.environ.get("AJ_BASE") or None
ex = "examples/csv-summary"
csv = open(f"{ex}/report.csv", "rb").read()
code = open(f"{ex}/summarize.py").read()
token = "bench-token-" + os.urandom(8).hex()
SLOTS, CLIENTS = 2, 8

# The shipped example configuration, with a known token and 2 run slots.
cfg = open("examples/server/config.toml").read()
cfg = re.sub(r'token_sha256 = "[0-9a-f]+"', 'token_sha256 = "%s"' % hashlib.sha256(token.encode()).hexdigest(), cfg)
cfg = cfg.replace("# max_concurrent_runs = 4               # default: number of CPUs", f"max_concurrent_runs = {SLOTS}")
assert f"max_concurrent_runs = {SLOTS}" in cfg
open(f"{work}/config.toml", "w").write(cfg)

# The direct runs' manifest: what the service builds for `summarize_csv` (runner::build_manifest).
d = f"{work}/direct"
os.makedirs(d)
shutil.copy(f"{ex}/report.csv", f"{d}/data.csv")
shutil.copy(f"{ex}/summarize.py", f"{d}/code.py")
schema = re.search(r"schema = '''(.*?)'''", cfg, re.S).group(1)
open(f"{d}/output.schema.json", "w").write(schema)
for f in ("data.csv", "code.py", "output.schema.json"):
    os.chmod(f"{d}/{f}", 0o644)
manifest = {
    "request_id": "bench",
    "inputs": [
        {"source": f"{d}/data.csv", "mount": "/input/data.csv", "mode": "read-only"},
        {"source": f"{d}/code.py", "mount": "/input/code.py", "mode": "read-only"},
    ],
    "output": "/output/summary.json",
    "output_schema": "output.schema.json",
    "network": "deny",
    "limits": {"seconds": 30, "memory_mb": 256, "processes": 16, "output_mb": 5},
    "expires_at": "2099-01-01T00:00:00Z",
    "command": ["/usr/bin/python3", "/input/code.py", "/input/data.csv", "/output/summary.json"],
    "env": {"LANG": "C.UTF-8"},
}
json.dump(manifest, open(f"{d}/manifest.json", "w"))


def direct_round(r):
    out = f"{d}/r{r}"
    os.makedirs(out)
    key = f"{d}/receipt-key.pem"
    # One run first creates the receipt key (and warms the page cache), untimed.
    subprocess.run([aj, "run", "--manifest", f"{d}/manifest.json", "--output-dir", f"{out}/warm",
                    "--report", f"{out}/warm.json", "--receipt", f"{out}/warm.receipt", "--key", key],
                   check=True, stdout=subprocess.DEVNULL)
    ids = "".join(f"{i}\n" for i in range(n)).encode()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    i0 = cpu_idle()
    t0 = time.monotonic()
    subprocess.run(["xargs", "-P", "2", "-I{}", aj, "run", "--manifest", f"{d}/manifest.json",
                    "--output-dir", f"{out}/{{}}", "--report", f"{out}/{{}}.json",
                    "--receipt", f"{out}/{{}}.receipt", "--key", key],
                   input=ids, check=True, stdout=subprocess.DEVNULL)
    dt = time.monotonic() - t0
    idle.setdefault("direct", []).append(idle_share(i0, cpu_idle()))
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The runners' CPU (xargs's too, negligible): every child is waited for, so it is counted.
    cpus.setdefault("direct", []).append([(ru1.ru_utime - ru0.ru_utime) * 1000 / n,
                                          (ru1.ru_stime - ru0.ru_stime) * 1000 / n])
    for i in range(n):
        rep = json.load(open(f"{out}/{i}.json"))
        assert rep["status"] == "ok", rep
    # Kept until the end (the trap removes the work folder): on an ext4 without a journal,
    # every inode created walks past the inodes freed in the last 30 s (`recently_deleted`),
    # so a clean-up here would tax the next rounds' creates, whichever path they measure.
    return dt


def service_round(r, binary=aj):
    data = f"{work}/data{r}"
    p = subprocess.Popen([binary, "serve", "--config", f"{work}/config.toml", "--listen", "127.0.0.1:0",
                          "--data-dir", data], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "AGENTJAIL_LOG": "warn"})
    port = None
    for line in p.stderr:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    assert port, "the service did not start"
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    auth = {"Authorization": f"Bearer {token}"}
    c = http.client.HTTPConnection("127.0.0.1", port)
    c.request("POST", "/v1/inputs?name=report.csv&media_type=text/csv", body=csv, headers=auth)
    resp = c.getresponse()
    assert resp.status == 201
    input_id = json.loads(resp.read())["input_id"]
    hdr = {**auth, "Content-Type": "application/json"}

    def submit(conn, rid):
        body = json.dumps({"request_id": rid, "task": "summarize_csv", "inputs": [input_id], "code": code})
        conn.request("POST", "/v1/runs", body=body, headers=hdr)
        resp = conn.getresponse()
        v = json.loads(resp.read())
        assert resp.status == 200 and v["status"] == "ok", (resp.status, v)

    for i in range(4):  # warm-up, untimed
        submit(c, f"warm-{i}")
    c.close()
    next_id = iter(range(n))
    lock = threading.Lock()
    errors = []

    head = (f"POST /v1/runs{'?wait=false' if follow else ''} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"{'Accept: text/event-stream' + chr(13) + chr(10) if in_one else ''}"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: ").encode()

    def read_head(sock, buf):
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, "the service closed the connection"
            buf += chunk
        hdr, buf = buf.split(b"\r\n\r\n", 1)
        lines = hdr.decode("latin-1").split("\r\n")
        fields = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            fields[k.strip().lower()] = v.strip()
        return int(lines[0].split(" ", 2)[1]), fields, buf

    def events_until_ended(sock, buf, rid, sent=False):
        # GET /v1/runs/{rid}/events on the kept-alive socket (or the answer of a submission
        # that asked for the events: `sent`); the body is chunked: each chunk's size line, the
        # bytes, CRLF; the stream ends after `ended` with the zero chunk.
        if not sent:
            sock.sendall((f"GET /v1/runs/{rid}/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                          f"Authorization: Bearer {token}\r\n\r\n").encode())
        status, fields, buf = read_head(sock, buf)
        assert status == 200 and fields.get("transfer-encoding") == "chunked", (status, fields)
        body = b""
        while True:
            while b"\r\n" not in buf:
                chunk = sock.recv(65536)
                assert chunk, "the service closed the events stream"
                buf += chunk
            size_line, buf = buf.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            while len(buf) < size + 2:
                chunk = sock.recv(65536)
                assert chunk, "the service closed the events stream"
                buf += chunk
            body, buf = body + buf[:size], buf[size + 2:]
            if size == 0:
                break
        ended = [e for e in body.split(b"\n\n") if b"event: ended" in e]
        assert ended, f"no `ended` event: {body[-300:]!r}"
        data = b"".join(l[6:] for l in ended[0].split(b"\n") if l.startswith(b"data: "))
        return json.loads(data), buf

    def client():
        # HTTP/1.1 keep-alive over one socket per client, the request written and the answer
        # read with a minimal parser (status line, Content-Length, body): http.client's
        # header parsing (the email package) cost ~0.5 ms of CPU per request, on the same
        # 2 cores as the service and its runners. The answer is checked as in `submit`.
        sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        buf = b""
        try:
            while True:
                with lock:
                    i = next(next_id, None)
                if i is None:
                    return
                body = json.dumps({"request_id": f"bench-{i}", "task": "summarize_csv",
                                   "inputs": [input_id], "code": code}).encode()
                sock.sendall(head + str(len(body)).encode() + b"\r\n\r\n" + body)
                if in_one:
                    v, buf = events_until_ended(sock, buf, f"bench-{i}", sent=True)
                    assert v["status"] == "ok", v
                    continue
                status, fields, buf = read_head(sock, buf)
                length = fields.get("content-length")
                assert length is not None, f"no Content-Length: {fields!r}"
                length = int(length)
                while len(buf) < length:
                    chunk = sock.recv(65536)
                    assert chunk, "the service closed the connection"
                    buf += chunk
                v, buf = json.loads(buf[:length]), buf[length:]
                if follow:
                    assert status == 202, (status, v)
                    v, buf = events_until_ended(sock, buf, f"bench-{i}")
                    status = 200
                assert status == 200 and v["status"] == "ok", (status, v)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
        finally:
            sock.close()

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    cpu0 = service_cpu(p.pid)
    me0 = resource.getrusage(resource.RUSAGE_SELF)
    i0 = cpu_idle()
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.monotonic() - t0
    idle.setdefault(binary, []).append(idle_share(i0, cpu_idle()))
    me1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = [(b - a) / n for a, b in zip(cpu0, service_cpu(p.pid))]
    # This benchmark process's own CPU: the 8 HTTP clients (threads), part of the service path.
    cpus.setdefault(("clients", binary), []).append([(me1.ru_utime - me0.ru_utime) * 1000 / n,
                                                     (me1.ru_stime - me0.ru_stime) * 1000 / n])
    p.terminate()
    p.wait()
    # The data directory stays until the end, like the direct rounds' output (see there).
    if errors:
        sys.exit(f"service round {r}: {errors[0]!r}")
    cpus.setdefault(binary, []).append(cpu)
    return dt


def service_cpu(pid):
    """The service's own CPU (its threads), user and system, then its runners' (the children
    it has waited for: utime, stime, cutime, cstime of /proc/<pid>/stat), in ms."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return [int(f[i]) * 1000 / tick for i in (11, 12, 13, 14)]


def cpu_idle():
    """The machine's idle and total CPU time so far (/proc/stat's first line, in ticks)."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return f[3] + f[4], sum(f[:8])


def idle_share(a, b):
    """The share of the machine's CPU time left idle between two cpu_idle() readings: on a
    machine with nothing else running, what a path leaves unused (waits between runs)."""
    return (b[0] - a[0]) / max(1, b[1] - a[1])


svc, svc_base, dir_ = [], [], []
cpus = {}
idle = {}
for r in range(rounds):
    load = os.getloadavg()[0]
    # With a base build, the two service rounds swap places every round, so that neither
    # build always runs first (right after the previous round's direct runs) or second.
    if aj_base and r % 2 == 1:
        b = service_round(f"{r}-base", aj_base)
        s = service_round(r)
    else:
        s = service_round(r)
        b = service_round(f"{r}-base", aj_base) if aj_base else None
    svc.append(n / s)
    line = f"round {r + 1} (load {load:.1f}): service {n} runs in {s:.2f} s = {n / s:.1f} runs/s; "
    if aj_base:
        svc_base.append(n / b)
        line += f"base service {n / b:.1f} runs/s{' (ran first)' if r % 2 == 1 else ''}; "
    t = direct_round(r)
    dir_.append(n / t)
    line += f"direct {n} runs in {t:.2f} s = {n / t:.1f} runs/s; ratio {t / s:.3f}; CPU idle: service {idle[aj][-1]:.1%}, direct {idle['direct'][-1]:.1%}"
    if aj_base:
        line += f" (base {t / b:.3f}, CPU idle {idle[aj_base][-1]:.1%})"
    print(line, flush=True)
ms, md = statistics.median(svc), statistics.median(dir_)
print(f"\nmedian of {rounds} rounds, {n} CSV-summary runs each (load average now {os.getloadavg()[0]:.1f}):")
print(f"  service (8 clients, {SLOTS} slots{', each following its run over SSE' if follow else ''}): {ms:6.1f} runs/s")
if aj_base:
    print(f"  base service (AGENTJAIL_BIN_BASE): {statistics.median(svc_base):6.1f} runs/s")
print(f"  direct  (2 at a time)           : {md:6.1f} runs/s")
print(f"  service / direct                : {ms / md:6.3f}  (per-round ratios: "
      + ", ".join(f"{a / b:.3f}" for a, b in zip(svc, dir_)) + ")")

print(f"  machine CPU left idle (median)  : service {statistics.median(idle[aj]):.1%}, "
      f"direct {statistics.median(idle['direct']):.1%}")

def med(rows, i):
    return statistics.median(r[i] for r in rows)


# CPU per run (medians over the rounds, ms): runs are CPU-bound on this machine, so the ratio of
# the CPU the two paths spend per run predicts their throughput ratio whatever else runs on it.
dr = cpus["direct"]
direct_cpu = med(dr, 0) + med(dr, 1)
print(f"  CPU per run, direct: runners user {med(dr, 0):.2f} + sys {med(dr, 1):.2f} = {direct_cpu:.2f} ms")
for b, label in ((aj, "service"), (aj_base, "base service")):
    if b in cpus:
        c, cl = cpus[b], cpus[("clients", b)]
        own = med(c, 0) + med(c, 1)
        runners = med(c, 2) + med(c, 3)
        clients = med(cl, 0) + med(cl, 1)
        total = own + runners + clients
        print(f"  CPU per run, {label}: process user {med(c, 0):.2f} + sys {med(c, 1):.2f}; "
              f"runners user {med(c, 2):.2f} + sys {med(c, 3):.2f}; HTTP clients user "
              f"{med(cl, 0):.2f} + sys {med(cl, 1):.2f}; total {total:.2f} ms "
              f"(direct / this: {direct_cpu / total:.3f})")
if aj_base:
    mb = statistics.median(svc_base)
    print(f"  base service / direct           : {mb / md:6.3f}  (per-round ratios: "
          + ", ".join(f"{a / b:.3f}" for a, b in zip(svc_base, dir_)) + ")")
PY
