//! The fleet on separate test hosts (issue #19): PostgreSQL, two API replicas (`serve --slots
//! 0`) and three workers (`worker --slots 2`), each in its own network namespace, joined by
//! veth links to a bridge in a "switch" namespace (10.201.0.0/24, common::netns::Topology);
//! the test's HTTP client runs on a host of its own. Nothing is added to the machine's own
//! namespace. The API replicas run nothing themselves, so that every execution is a worker's
//! (one job folder each, counted across the three workers).
//! What is attacked: 500 runs over both replicas (none lost, none twice, every worker used);
//! `kill -9` of a worker mid-run; a worker whose link is taken down mid-run (lease, sandbox
//! killed, late result fenced); a worker paused mid-run (its runner kills the payload before
//! the lease ends; the retry never overlaps it); workers and a replica stopped at random under
//! load and a worker host partitioned and killed (no stall, no overlap, a complete trail);
//! PostgreSQL restarted under load; one request sent to both replicas at once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use common::netns::Topology;
use common::pg::{self, Node, Pg};
use common::serve::{Api, sha256_hex, sleeper_task};
use common::{payload_cmdlines, payloads, wait_payloads};
use serde_json::{Value, json};

const ALICE: &str = "tok-alice-topology-1";
const HOSTS: &[&str] = &["pg", "api1", "api2", "w1", "w2", "w3", "client"];
const WORKERS: &[&str] = &["w1", "w2", "w3"];

/// One node's configuration: a 3-second lease; the tasks `sleeper` (marker in its command
/// line), `chatty` (like `sleeper`, printing 64 KiB every 0.5 s meanwhile), `echo` (writes its
/// argument, a number, as its JSON output) and `beater` (prints a heartbeat line every 0.2 s
/// for two minutes; marker in its command line).
fn config(node_id: &str, marker: &str) -> String {
    format!(
        r#"
[server]
node_id = "{node_id}"
lease_seconds = 3
auth_failure_audit_seconds = 3600

[tenants.acme]

[actors.alice]
tenant = "acme"
token_sha256 = "{a}"
operator = true
{sleeper}
[tasks.echo]
description = "Writes its argument"
code = "forbidden"
command = ["/bin/sh", "-c", "echo ran; echo \"$1\" > /output/o.json", "sh"]
max_args = 1
allowed_tenants = ["acme"]
[tasks.echo.output]
path = "/output/o.json"
media_type = "application/json"
max_bytes = 100

[tasks.chatty]
description = "Prints 64 KiB every 0.5 s for as long as its argument says, then writes its output"
code = "forbidden"
command = ["/usr/bin/python3", "-c", "import json, sys, time\nprint('ran', flush=True)\nend = time.time() + float(sys.argv[2])\nwhile time.time() < end:\n    sys.stdout.write('x' * 65536); sys.stdout.flush(); time.sleep(0.5)\njson.dump({{'args': sys.argv[1:]}}, open('/output/o.json', 'w'))", "{marker}"]
max_args = 1
allowed_tenants = ["acme"]
[tasks.chatty.output]
path = "/output/o.json"
media_type = "application/json"
max_bytes = 1000
[tasks.chatty.limits]
seconds = 60

[tasks.beater]
description = "Prints a heartbeat line every 0.2 s"
code = "forbidden"
command = ["/usr/bin/python3", "-c", "import time; [print('beat', i, flush=True) or time.sleep(0.2) for i in range(600)]", "{marker}-beater"]
allowed_tenants = ["acme"]
[tasks.beater.output]
path = "/output/o.json"
media_type = "application/json"
max_bytes = 100
[tasks.beater.limits]
seconds = 150
"#,
        a = sha256_hex(ALICE),
        sleeper = sleeper_task(marker, 60),
    )
}

/// The serialised test lock: each test builds its hosts, a cluster and five nodes.
static SERIAL: Mutex<()> = Mutex::new(());

/// The fleet on its hosts. Fields drop in order: the nodes, then PostgreSQL (stopped through
/// its host), then the hosts, then the folders.
struct Fleet {
    apis: Vec<Node>,
    workers: Vec<Node>,
    pg: Pg,
    topo: Topology,
    marker: String,
    _dirs: Vec<tempfile::TempDir>,
}

impl Fleet {
    /// Builds the hosts and starts PostgreSQL, both replicas and the three workers; `None`
    /// (after `common::skip`) when `ip`, `nsenter` or PostgreSQL is missing.
    fn up(what: &str) -> Option<Fleet> {
        let topo = Topology::new(HOSTS)?;
        // The machine's own namespace got no address of the test network.
        let own = Command::new("ip").args(["-o", "addr"]).output().unwrap();
        assert!(
            !String::from_utf8_lossy(&own.stdout).contains("10.201."),
            "the test network leaked into the machine's namespace"
        );
        let pg = Pg::start_on(topo.wrap("pg"), &topo.addr("pg"))?;
        let dirs: Vec<tempfile::TempDir> = (0..5).map(|_| pg::tempdir("topology")).collect();
        let marker = format!(
            "topo-{what}-{}",
            dirs[0].path().file_name().unwrap().to_string_lossy()
        );
        let url = pg.url();
        let apis = ["api1", "api2"]
            .iter()
            .zip(&dirs)
            .map(|(h, d)| {
                let listen = format!("{}:8080", topo.addr(h));
                Node::start_on(
                    &topo.wrap(h),
                    d.path(),
                    &url,
                    &config(h, &marker),
                    &["serve", "--listen", &listen, "--slots", "0"],
                    "listening on ",
                )
                .0
            })
            .collect();
        let workers = WORKERS
            .iter()
            .zip(&dirs[2..])
            .map(|(h, d)| {
                Node::start_on(
                    &topo.wrap(h),
                    d.path(),
                    &url,
                    &config(h, &marker),
                    &["worker", "--slots", "2", "--node-id", h],
                    "claiming runs",
                )
                .0
            })
            .collect();
        Some(Fleet {
            apis,
            workers,
            pg,
            topo,
            marker,
            _dirs: dirs,
        })
    }

    /// The clients of both replicas; call on the client host (see [`Fleet::on_client`]).
    fn clients(&self) -> [Api; 2] {
        ["api1", "api2"].map(|h| Api::new(&format!("http://{}:8080", self.topo.addr(h))))
    }

    /// Runs `f` on the client host.
    fn on_client<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.topo.run_on("client", f)
    }

    /// `worker`'s node (by host name).
    fn worker(&self, host: &str) -> &Node {
        &self.workers[WORKERS.iter().position(|w| *w == host).unwrap()]
    }

    /// The job folders of all workers (one per execution started: each task prints a line).
    fn job_folders(&self) -> Vec<String> {
        self.workers.iter().flat_map(Node::job_folders).collect()
    }

    /// How many `event` records the audit chain holds for `request_id`.
    fn audited(&self, event: &str, request_id: &str) -> i64 {
        self.pg
            .psql(&format!(
                "SELECT count(*) FROM audit_log WHERE record::jsonb->>'event' = '{event}' AND record::jsonb->>'request_id' = '{request_id}'"
            ))
            .parse()
            .unwrap()
    }

    /// The run's row in the database: `status|owner|job_id`.
    fn row(&self, request_id: &str) -> String {
        self.pg.psql(&format!(
            "SELECT status || '|' || coalesce(owner, '') || '|' || job_id FROM runs WHERE request_id = '{request_id}'"
        ))
    }

    /// `agentjail audit verify --database URL`, run from the client host: (exit code, stdout).
    fn verify_audit(&self) -> (i32, String) {
        let w = self.topo.wrap("client");
        let o = Command::new(&w[0])
            .args(&w[1..])
            .arg(common::bin())
            .args(["audit", "verify", "--database", &self.pg.url()])
            .env("PGPASSWORD", pg::PASSWORD)
            .output()
            .unwrap();
        (
            o.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        )
    }
}

fn status_of(api: &Api, id: &str) -> Value {
    api.status_of(ALICE, id)
}

fn wait_status(api: &Api, id: &str, want: &str, secs: u64) -> Value {
    api.wait_status(ALICE, id, want, secs)
}

/// An operator's `retry` of an `unknown` run, which must be accepted.
fn retry(api: &Api, id: &str) {
    let r = api
        .http
        .post(api.url(&format!("/v1/runs/{id}/reconcile")))
        .bearer_auth(ALICE)
        .json(&json!({"action": "retry"}))
        .send()
        .unwrap();
    let code = r.status();
    assert!(code.is_success(), "{code}: {:?}", r.text());
}

fn wait_log(node: &Node, needle: &str, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !node.log().contains(needle) {
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in the log:\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// 500 short runs submitted over both replicas by 8 client threads at once (a `429` of the
/// full queue is retried with the same request, as a client does): each ends `ok`
/// with its own output, exactly once (one row, one `run_start` and one `run_end` in the audit
/// chain, one job folder across the workers), and every worker ran some. The audit chain
/// verifies.
#[test]
fn five_hundred_runs_over_two_replicas_and_three_workers() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(f) = Fleet::up("bulk") else { return };
    const N: usize = 500;
    const THREADS: usize = 8;
    let started = Instant::now();
    let overloaded = AtomicUsize::new(0);
    f.on_client(|| {
        let apis = f.clients();
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (apis, overloaded, f) = (&apis, &overloaded, &f);
                s.spawn(move || {
                    for i in (t..N).step_by(THREADS) {
                        let body = json!({"request_id": format!("bulk-{i}"), "task": "echo", "inputs": [], "args": [i.to_string()]});
                        // The cluster-wide queue holds `max_queued_runs` (64): beyond it a
                        // replica answers 429, and the client sends the same request again.
                        let mut tries = Vec::new();
                        loop {
                            let r = apis[i % 2].run(ALICE, &body, "?wait=false");
                            tries.push((r.status().as_u16(), started.elapsed()));
                            match r.status().as_u16() {
                                // 200: a worker finished it before the answer was made.
                                202 | 200 => break,
                                429 => {
                                    assert!(r.headers().get("retry-after").is_some());
                                    overloaded.fetch_add(1, Ordering::SeqCst);
                                    std::thread::sleep(Duration::from_millis(200));
                                }
                                s => panic!(
                                    "bulk-{i}: {s} {:?}\ntries {tries:?}\naudit:\n{}",
                                    r.text(),
                                    f.pg.psql(&format!("SELECT seq || ' ' || record FROM audit_log WHERE record::jsonb->>'request_id' = 'bulk-{i}' ORDER BY seq"))
                                ),
                            }
                        }
                    }
                });
            }
        });
    });
    let submitted = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        let open =
            f.pg.psql("SELECT count(*) FROM runs WHERE status IN ('queued', 'running')");
        if open == "0" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} runs still open; {}",
            f.pg
                .psql("SELECT string_agg(status || ':' || n, ',') FROM (SELECT status, count(*) n FROM runs GROUP BY status) x")
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    eprintln!(
        "500 runs: submitted in {:.1} s ({} answers 429 on the way), all finished after {:.1} s",
        submitted.as_secs_f64(),
        overloaded.load(Ordering::SeqCst),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        f.pg.psql("SELECT string_agg(status || ':' || n, ',') FROM (SELECT status, count(*) n FROM runs GROUP BY status) x"),
        format!("ok:{N}"),
        "not ok: {}\nworkers' errors:\n{}",
        f.pg.psql("SELECT string_agg(request_id || ' ' || node_id || ': ' || coalesce(reason, ''), E'\n') FROM runs WHERE status <> 'ok'"),
        f.workers
            .iter()
            .flat_map(|w| w.log().lines().filter(|l| l.contains("ERROR") || l.contains("WARN")).map(String::from).collect::<Vec<_>>())
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Every answer, from the other replica than the one that took it.
    f.on_client(|| {
        let apis = f.clients();
        for i in 0..N {
            let v = status_of(&apis[(i + 1) % 2], &format!("bulk-{i}"));
            assert_eq!(v["status"], "ok", "{v}");
            assert_eq!(v["artifact"]["json"], json!(i), "bulk-{i}: {v}");
        }
    });
    // One run_start and one run_end per request in the chain.
    for event in ["run_start", "run_end"] {
        let per_request = f.pg.psql(&format!(
            "SELECT count(*) || '/' || coalesce(min(n), 0) || '/' || coalesce(max(n), 0) FROM (SELECT count(*) n FROM audit_log WHERE record::jsonb->>'event' = '{event}' AND record::jsonb->>'request_id' LIKE 'bulk-%' GROUP BY record::jsonb->>'request_id') x"
        ));
        assert_eq!(per_request, format!("{N}/1/1"), "{event}: requests/min/max");
    }
    let folders = f.job_folders();
    assert_eq!(folders.len(), N, "one job folder per run");
    let mut unique = folders.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), N, "no job ran twice");
    for (w, node) in WORKERS.iter().zip(&f.workers) {
        assert!(!node.job_folders().is_empty(), "{w} ran nothing");
    }
    for a in &f.apis {
        assert!(a.job_folders().is_empty(), "an API replica ran a job");
    }
    let (code, out) = f.verify_audit();
    assert_eq!(code, 0, "audit verify: {out}");
}

/// `kill -9` of the worker running a run: its sandbox is gone within seconds (no payload
/// process left), the run becomes `unknown` once its lease expires and stays so (the two live
/// workers never take it), and an operator's `retry` through the other replica runs it exactly
/// once more (never two payloads at a time).
#[test]
fn a_worker_killed_mid_run_leaves_it_unknown_and_a_retry_runs_it_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(mut f) = Fleet::up("kill") else {
        return;
    };
    let marker = f.marker.clone();
    f.on_client(|| {
        let [a1, a2] = f.clients();
        let body = json!({"request_id": "victim", "task": "sleeper", "inputs": [], "args": ["8"]});
        assert_eq!(a1.run(ALICE, &body, "?wait=false").status(), 202);
        wait_status(&a2, "victim", "running", 30);
    });
    wait_payloads(&marker, 1, 20);
    let owner = f.row("victim").split('|').nth(1).unwrap().to_string();
    let i = WORKERS.iter().position(|w| *w == owner).unwrap();
    // The payload's first line (`ran`) has reached its worker's log: its job folder exists
    // (the evidence of this execution counted below).
    let deadline = Instant::now() + Duration::from_secs(10);
    while f.workers[i].job_folders().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the payload's first line never reached its log"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    f.workers[i].kill(); // SIGKILL
    let killed_at = Instant::now();
    wait_payloads(&marker, 0, 3);
    eprintln!(
        "the sandbox was gone {:?} after the kill",
        killed_at.elapsed()
    );
    f.on_client(|| {
        let [a1, a2] = f.clients();
        let v = wait_status(&a2, "victim", "unknown", 15);
        assert!(v["reason"].as_str().unwrap_or("").contains("lease"), "{v}");
        // Two live workers, claiming: neither takes it.
        std::thread::sleep(Duration::from_secs(4));
        assert_eq!(status_of(&a1, "victim")["status"], "unknown");
    });
    assert!(payloads(&marker).is_empty(), "the run executed again");
    assert_eq!(
        f.job_folders().len(),
        1,
        "only the killed worker's execution"
    );
    assert_eq!(f.audited("run_start", "victim"), 1);
    assert_eq!(f.audited("run_unknown", "victim"), 1);
    assert_eq!(f.audited("run_end", "victim"), 0);
    // The operator retries it (no network: safe): one more execution, to `ok`.
    f.on_client(|| {
        let [_, a2] = f.clients();
        retry(&a2, "victim");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            assert!(payloads(&marker).len() <= 1, "two executions at once");
            let v = status_of(&a2, "victim");
            if v["status"] == "ok" {
                break;
            }
            assert!(Instant::now() < deadline, "the retry never ended: {v}");
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let live: usize = f
        .workers
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != i)
        .map(|(_, w)| w.job_folders().len())
        .sum();
    assert_eq!(live, 1, "the retry ran once, on a live worker");
    assert_eq!(f.job_folders().len(), 2);
    assert_eq!(f.audited("run_start", "victim"), 2);
    assert_eq!(f.audited("run_end", "victim"), 1);
}

/// A worker cut off from the network (its switch port taken down) mid-run: its lease expires
/// and it kills its sandbox by its own clock (the payload's heartbeat lines in the job's
/// stdout.log stop), another node marks the run `unknown`; when the link is back, the worker's
/// late result is refused by the fencing (its log says so), the run stays `unknown` and no
/// `run_end` is audited. The worker then takes new work.
#[test]
fn a_worker_whose_link_goes_down_kills_its_sandbox_and_is_fenced() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(f) = Fleet::up("cut") else { return };
    let beater = format!("{}-beater", f.marker);
    f.on_client(|| {
        let [a1, a2] = f.clients();
        let body = json!({"request_id": "cut", "task": "beater", "inputs": [], "args": []});
        assert_eq!(a1.run(ALICE, &body, "?wait=false").status(), 202);
        wait_status(&a2, "cut", "running", 30);
    });
    wait_payloads(&beater, 1, 20);
    let row = f.row("cut");
    let mut parts = row.split('|');
    let (owner, job) = (
        parts.nth(1).unwrap().to_string(),
        parts.next().unwrap().to_string(),
    );
    let w = f.worker(&owner);
    let beats = w.dir.join("data/jobs").join(&job).join("stdout.log");
    let lines = || {
        std::fs::read_to_string(&beats)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("beat "))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while lines() < 3 {
        assert!(
            Instant::now() < deadline,
            "no heartbeat in {}",
            beats.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    f.topo.set_link(&owner, false);
    let cut_at = Instant::now();
    // Lease 3 s, renewed every second: the sandbox is gone within about 3 s of the last
    // renewal, with no answer from the database.
    wait_payloads(&beater, 0, 10);
    eprintln!("the sandbox was gone {:?} after the cut", cut_at.elapsed());
    wait_log(w, "killing the sandbox", 5);
    let stopped = lines();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(lines(), stopped, "the payload still beats");
    f.on_client(|| {
        let [a1, a2] = f.clients();
        let v = wait_status(&a2, "cut", "unknown", 15);
        assert!(v["reason"].as_str().unwrap_or("").contains("lease"), "{v}");
        f.topo.set_link(&owner, true);
        wait_log(w, "the result was refused by fencing", 60);
        std::thread::sleep(Duration::from_secs(1));
        let v = status_of(&a1, "cut");
        assert_eq!(v["status"], "unknown", "{v}");
        assert!(v.get("artifact").is_none(), "{v}");
    });
    assert_eq!(f.audited("run_start", "cut"), 1);
    assert_eq!(f.audited("run_end", "cut"), 0);
    assert_eq!(f.job_folders().len(), 1, "nobody else ran it");
    // Back on the network, the worker claims again: stop the two others, run one more.
    for (j, h) in WORKERS.iter().enumerate() {
        if *h != owner {
            let pid = f.workers[j].pid().to_string();
            assert!(
                Command::new("kill")
                    .args(["-STOP", &pid])
                    .status()
                    .unwrap()
                    .success()
            );
        }
    }
    f.on_client(|| {
        let [a1, _] = f.clients();
        let body = json!({"request_id": "after-cut", "task": "echo", "inputs": [], "args": ["7"]});
        let r = a1.run(ALICE, &body, "?wait=true");
        let v: Value = r.json().unwrap();
        assert_eq!(v["status"], "ok", "{v}");
    });
    assert_eq!(w.job_folders().len(), 2);
}

/// Sends `sig` (`STOP`, `CONT`) to a node's process (the child this test started).
fn signal(node: &Node, sig: &str) {
    let pid = node.pid().to_string();
    assert!(
        Command::new("kill")
            .args([&format!("-{sig}"), &pid])
            .status()
            .unwrap()
            .success()
    );
}

/// Issue #30, finding 2: a worker paused (SIGSTOP) mid-run. Its runner is a separate process
/// and lives on, so it must enforce the lease itself: the payload is dead before the lease
/// ends (3 s after the last renewal), i.e. before any node can mark the run `unknown`, and the
/// `unknown` reason says so. The payload prints 64 KiB every 0.5 s, so the paused worker's log
/// pipe fills and the runner's relay blocks on it (the red team's attack on the first fix:
/// the kill then waited for the worker to be resumed); the runner's watchdog thread kills it. The operator's retry then runs on a live worker while the paused
/// one is resumed: sampled from /proc (one pid namespace for every test host) all along, there
/// is never more than one payload of the run, the resumed worker's late result is fenced, and
/// the trail is two `run_start`, one `run_unknown`, one `run_end`.
#[test]
fn a_paused_workers_payload_dies_before_its_lease_ends_and_a_retry_never_overlaps_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(f) = Fleet::up("pause") else { return };
    let marker = f.marker.clone();
    // Every 10 ms until the end: the most payload processes of the run seen at once.
    let sampling = std::sync::atomic::AtomicBool::new(true);
    let most = AtomicUsize::new(0);
    /// Ends the sampling when dropped, also when an assertion below panics.
    struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(false, Ordering::Relaxed);
        }
    }
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while sampling.load(Ordering::Relaxed) {
                most.fetch_max(payloads(&marker).len(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let _stop = Stop(&sampling);
        f.on_client(|| {
            let [a1, a2] = f.clients();
            let body =
                json!({"request_id": "paused", "task": "chatty", "inputs": [], "args": ["10"]});
            assert_eq!(a1.run(ALICE, &body, "?wait=false").status(), 202);
            wait_status(&a2, "paused", "running", 30);
        });
        wait_payloads(&marker, 1, 20);
        let owner = f.row("paused").split('|').nth(1).unwrap().to_string();
        let w = f.worker(&owner);
        signal(w, "STOP");
        let stopped_at = Instant::now();
        // Lease 3 s, renewed every second; the runner's end is half a second before the
        // lease's. Before the fix the payload ran on until the worker was resumed.
        wait_payloads(&marker, 0, 4);
        let dead_after = stopped_at.elapsed();
        eprintln!("the paused worker's payload was dead {dead_after:?} after the pause");
        f.on_client(|| {
            let [a1, a2] = f.clients();
            let v = wait_status(&a2, "paused", "unknown", 15);
            let reason = v["reason"].as_str().unwrap_or("");
            assert!(
                reason.contains("lease") && reason.contains("runner kills the sandbox"),
                "{v}"
            );
            retry(&a1, "paused");
        });
        // The retry runs on a live worker; then the paused one wakes up.
        wait_payloads(&marker, 1, 20);
        signal(w, "CONT");
        wait_log(w, "the result was refused by fencing", 30);
        f.on_client(|| {
            let [a1, _] = f.clients();
            let v = wait_status(&a1, "paused", "ok", 60);
            assert!(v.get("reason").is_none_or(|r| r.is_null()), "{v}");
        });
    });
    assert_eq!(
        most.load(Ordering::Relaxed),
        1,
        "two payloads of one run at once"
    );
    assert_eq!(
        f.job_folders().len(),
        2,
        "the paused execution and the retry"
    );
    assert_eq!(f.audited("run_start", "paused"), 2);
    assert_eq!(f.audited("run_unknown", "paused"), 1);
    assert_eq!(f.audited("run_end", "paused"), 1);
    let (code, out) = f.verify_audit();
    assert_eq!(code, 0, "{out}");
}

/// Issue #30 ("Tests and figures"): nodes stopped and lost at random under load. While 8
/// client threads submit runs through `api1` (each one every 1.5 s) and read each back, a
/// chaos loop stops (SIGSTOP) a random worker or `api2` at a random moment for 0.3–4 s (so
/// also beyond the 3 s lease), twelve times (the seed is printed), then cuts `w3`'s host off
/// the network and kills its process (so PostgreSQL never sees its connections close), and
/// the load goes on for 5 s.
/// Asserted: every submission and read is
/// answered within [`STALL_BOUND`]; sampled from /proc every 10 ms, never two payloads of one
/// request at once; every run ends in a final state with a complete trail (its
/// `run_accepted`, at most one `run_start`, and for a started run one `run_end` or
/// `run_unknown`); `audit verify` passes.
#[test]
fn nodes_stopped_and_lost_at_random_under_load_stall_nobody_and_never_overlap() {
    /// The most a submission or a read may take while another node is stopped or lost.
    const STALL_BOUND: Duration = Duration::from_secs(3);
    const THREADS: usize = 8;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(f) = Fleet::up("chaos") else { return };
    let marker = f.marker.clone();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("chaos seed {seed}");
    let mut rng = seed;
    let mut next = move |n: u64| {
        // xorshift64: enough to place the stops; the seed reproduces them.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let loading = std::sync::atomic::AtomicBool::new(true);
    let submitted = AtomicUsize::new(0);
    let sampling = std::sync::atomic::AtomicBool::new(true);
    let overlaps = Mutex::new(Vec::<String>::new());
    let slowest = Mutex::new((Duration::ZERO, String::new()));
    /// Ends a loop when dropped, also when an assertion panics.
    struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(false, Ordering::Relaxed);
        }
    }
    std::thread::scope(|scope| {
        let _stop_sampling = Stop(&sampling);
        scope.spawn(|| {
            while sampling.load(Ordering::Relaxed) {
                let mut seen = payload_cmdlines(&marker)
                    .into_iter()
                    .map(|(_, c)| c)
                    .collect::<Vec<_>>();
                seen.sort();
                for w in seen.windows(2) {
                    if w[0] == w[1] {
                        overlaps.lock().unwrap().push(w[0].clone());
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let load = scope.spawn(|| {
            f.on_client(|| {
                let [a1, _] = f.clients();
                let timed = |what: String, t: Instant| {
                    let took = t.elapsed();
                    let mut s = slowest.lock().unwrap();
                    if took > s.0 {
                        *s = (took, what);
                    }
                };
                std::thread::scope(|s| {
                    for t in 0..THREADS {
                        let (a1, timed, loading, submitted) = (&a1, &timed, &loading, &submitted);
                        s.spawn(move || {
                            let mut i = t;
                            while loading.load(Ordering::Relaxed) {
                                // The argument (seconds to sleep) is unique per run: it is in
                                // the payload's command line, so /proc tells the runs apart.
                                let arg = format!("0.{:04}", 3000 + i);
                                let body = json!({"request_id": format!("chaos-{i}"), "task": "sleeper", "inputs": [], "args": [arg]});
                                loop {
                                    let t0 = Instant::now();
                                    let r = a1.run(ALICE, &body, "?wait=false");
                                    timed(format!("POST chaos-{i}"), t0);
                                    match r.status().as_u16() {
                                        202 | 200 => break,
                                        // The queue is full (64): the same request again.
                                        429 => std::thread::sleep(Duration::from_millis(200)),
                                        s => panic!("chaos-{i}: {s} {:?}", r.text()),
                                    }
                                }
                                let t0 = Instant::now();
                                let v = status_of(a1, &format!("chaos-{i}"));
                                timed(format!("GET chaos-{i}"), t0);
                                assert!(v.get("status").is_some(), "{v}");
                                submitted.fetch_add(1, Ordering::Relaxed);
                                i += THREADS;
                                std::thread::sleep(Duration::from_millis(1500));
                            }
                        });
                    }
                });
            });
        });
        // The chaos, while the load runs: random stops of a worker or of api2.
        let mut stops = Vec::new();
        let _stop_loading = Stop(&loading);
        for _ in 0..12 {
            std::thread::sleep(Duration::from_millis(100 + next(900)));
            let k = next(4) as usize;
            let (name, node) = if k < 3 {
                (WORKERS[k], &f.workers[k])
            } else {
                ("api2", &f.apis[1])
            };
            let pause = Duration::from_millis(300 + next(3700));
            signal(node, "STOP");
            std::thread::sleep(pause);
            signal(node, "CONT");
            stops.push(format!("{name} {:.1}s", pause.as_secs_f64()));
        }
        eprintln!("stops: {}", stops.join(", "));
        // A worker host partitioned and killed: its connections stay open on PostgreSQL's side.
        f.topo.set_link("w3", false);
        signal(&f.workers[2], "KILL");
        std::thread::sleep(Duration::from_secs(5));
        loading.store(false, Ordering::Relaxed);
        load.join().unwrap();
    });
    let (took, what) = slowest.into_inner().unwrap();
    eprintln!("slowest answer under chaos: {what} in {took:?}");
    assert!(took <= STALL_BOUND, "{what} took {took:?}");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let open =
            f.pg.psql("SELECT count(*) FROM runs WHERE status IN ('queued', 'running')");
        if open == "0" {
            break;
        }
        assert!(Instant::now() < deadline, "{open} runs still open");
        std::thread::sleep(Duration::from_millis(250));
    }
    sampling.store(false, Ordering::Relaxed);
    let overlaps = overlaps.into_inner().unwrap();
    assert!(
        overlaps.is_empty(),
        "two payloads of one run at once: {overlaps:?}"
    );
    eprintln!(
        "statuses: {}",
        f.pg.psql("SELECT string_agg(status || ':' || n, ',') FROM (SELECT status, count(*) n FROM runs GROUP BY status) x")
    );
    // The trail: per request, accepted / started / ended or unknown.
    let trail = f.pg.psql(
        "SELECT coalesce(string_agg(r.request_id || ' ' || r.status || ' ' || a || '/' || s || '/' || e, ', '), '') FROM runs r, LATERAL (SELECT
            count(*) FILTER (WHERE record::jsonb->>'event' = 'run_accepted') a,
            count(*) FILTER (WHERE record::jsonb->>'event' = 'run_start') s,
            count(*) FILTER (WHERE record::jsonb->>'event' IN ('run_end', 'run_unknown')) e
          FROM audit_log WHERE record::jsonb->>'request_id' = r.request_id) c
         WHERE r.request_id LIKE 'chaos-%' AND NOT (a = 1 AND s <= 1 AND e = s)",
    );
    assert_eq!(trail, "", "incomplete trails (accepted/started/ended)");
    assert_eq!(
        f.pg.psql("SELECT count(*) FROM runs WHERE request_id LIKE 'chaos-%'"),
        submitted.load(Ordering::Relaxed).to_string()
    );
    let (code, out) = f.verify_audit();
    assert_eq!(code, 0, "{out}");
}

/// PostgreSQL stopped and started again while 50 runs are queued and running and more are
/// being submitted: while it is down, a replica answers `503 unavailable` with `Retry-After`
/// (and `/healthz` 503); clients resubmit the same request_id until accepted. Afterwards
/// replicas and workers have reconnected; every run is in the database, each in a final
/// state, each execution started once (one job folder per started run, none for two runs).
#[test]
fn postgres_restarted_under_load_loses_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(f) = Fleet::up("pgrestart") else {
        return;
    };
    const N: usize = 50;
    let seen_503 = std::sync::atomic::AtomicUsize::new(0);
    let submit = |apis: &[Api; 2], i: usize| {
        let body = json!({"request_id": format!("pgr-{i}"), "task": "sleeper", "inputs": [], "args": ["1"]});
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = apis[i % 2].run(ALICE, &body, "?wait=false");
            match r.status().as_u16() {
                202 | 200 => return,
                503 => {
                    assert!(
                        r.headers().get("retry-after").is_some(),
                        "503 without Retry-After"
                    );
                    seen_503.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                s => panic!("pgr-{i}: {s} {:?}", r.text()),
            }
            assert!(Instant::now() < deadline, "pgr-{i} never accepted");
            std::thread::sleep(Duration::from_millis(300));
        }
    };
    f.on_client(|| {
        let apis = f.clients();
        for i in 0..N / 2 {
            submit(&apis, i);
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in N / 2..N {
                    submit(&apis, i);
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
            std::thread::sleep(Duration::from_millis(500));
            f.pg.stop();
            let down = Instant::now();
            let h = apis[0].get(ALICE, "/healthz");
            assert_eq!(h.status(), 503, "healthz while the database is down");
            let r = apis[1].run(
                ALICE,
                &json!({"request_id": "pgr-probe", "task": "echo", "inputs": [], "args": ["1"]}),
                "?wait=false",
            );
            assert_eq!(r.status(), 503, "a submission while the database is down");
            assert!(r.headers().get("retry-after").is_some());
            let v: Value = r.json().unwrap();
            assert!(
                v["type"].as_str().unwrap_or("").ends_with("/unavailable"),
                "{v}"
            );
            std::thread::sleep(Duration::from_secs(2).saturating_sub(down.elapsed()));
            f.pg.start_again();
        });
    });
    eprintln!(
        "{} submissions answered 503 while the database was down",
        seen_503.load(std::sync::atomic::Ordering::SeqCst)
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let open = f
            .pg
            .psql("SELECT count(*) FROM runs WHERE request_id LIKE 'pgr-%' AND status IN ('queued', 'running')");
        if open == "0" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} runs still open after the restart"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let by_status = f.pg.psql("SELECT string_agg(status || ':' || n, ',' ORDER BY status) FROM (SELECT status, count(*) n FROM runs WHERE request_id LIKE 'pgr-%' GROUP BY status) x");
    eprintln!("after the restart: {by_status}");
    assert_eq!(
        f.pg.psql("SELECT count(*) FROM runs WHERE request_id LIKE 'pgr-%'"),
        N.to_string(),
        "every submitted run is recorded"
    );
    let odd = f.pg.psql(
        "SELECT string_agg(request_id || ' ' || status || ' ' || coalesce(reason, '') || ' ' || coalesce(report, ''), E'\\n') FROM runs WHERE request_id LIKE 'pgr-%' AND status NOT IN ('ok', 'unknown')",
    );
    let errors: Vec<String> = f
        .workers
        .iter()
        .flat_map(|w| {
            w.log()
                .lines()
                .filter(|l| l.contains("ERROR"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        odd.is_empty(),
        "{by_status}: {odd}\nthe workers' errors:\n{}",
        errors.join("\n")
    );
    // Executions: a job folder (made for a run's first line of log) only for a started run,
    // under its current job id, never twice; and one for every run that ended `ok`. A run
    // whose executor lost its lease while the database was down may have been killed before
    // its first line: started, `unknown`, and no folder.
    let folders = f.job_folders();
    let mut unique = folders.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), folders.len(), "a job folder twice");
    let jobs = |filter: &str| -> Vec<String> {
        f.pg.psql(&format!(
            "SELECT string_agg(job_id, ',') FROM runs WHERE request_id LIKE 'pgr-%' AND {filter}"
        ))
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
    };
    let started = jobs("started_at IS NOT NULL");
    let not_started: Vec<&String> = unique.iter().filter(|j| !started.contains(j)).collect();
    assert!(
        not_started.is_empty(),
        "executions of runs never marked started: {not_started:?}"
    );
    let silent: Vec<String> = jobs("status = 'ok'")
        .into_iter()
        .filter(|j| !unique.contains(j))
        .collect();
    assert!(silent.is_empty(), "ok runs with no execution: {silent:?}");
    assert_eq!(
        f.pg.psql("SELECT count(*) FROM runs WHERE request_id LIKE 'pgr-%' AND status = 'ok' AND started_at IS NULL"),
        "0"
    );
    // Every run that ended `ok` has its run_end in the chain; the chain verifies.
    let missing = f.pg.psql(
        "SELECT count(*) FROM runs r WHERE r.request_id LIKE 'pgr-%' AND r.status = 'ok' AND NOT EXISTS (SELECT 1 FROM audit_log a WHERE a.record::jsonb->>'event' = 'run_end' AND a.record::jsonb->>'request_id' = r.request_id)",
    );
    assert_eq!(missing, "0", "ok runs without run_end");
    let (code, out) = f.verify_audit();
    assert_eq!(code, 0, "audit verify: {out}");
    // Both replicas serve again.
    f.on_client(|| {
        for (k, a) in f.clients().iter().enumerate() {
            let v: Value = a
                .run(
                    ALICE,
                    &json!({"request_id": format!("after-restart-{k}"), "task": "echo", "inputs": [], "args": ["5"]}),
                    "?wait=true",
                )
                .json()
                .unwrap();
            assert_eq!(v["status"], "ok", "{v}");
        }
    });
}

/// One request (same tenant, request_id and body) sent to both replicas at the same instant,
/// 20 times over: each time one run and two identical answers (status and body).
#[test]
fn one_request_sent_to_both_replicas_at_once_runs_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(f) = Fleet::up("twice") else { return };
    const ROUNDS: usize = 20;
    f.on_client(|| {
        let apis = f.clients();
        for k in 0..ROUNDS {
            let body = json!({"request_id": format!("same-{k}"), "task": "echo", "inputs": [], "args": [k.to_string()]});
            let barrier = Barrier::new(2);
            let answers: Vec<(u16, Value)> = std::thread::scope(|s| {
                let hs: Vec<_> = apis
                    .iter()
                    .map(|a| {
                        let (b, body) = (&barrier, &body);
                        s.spawn(move || {
                            b.wait();
                            let r = a.run(ALICE, body, "?wait=true");
                            (r.status().as_u16(), r.json::<Value>().unwrap())
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert_eq!(answers[0], answers[1], "same-{k}: different answers");
            assert_eq!(answers[0].0, 200, "{:?}", answers[0]);
            assert_eq!(answers[0].1["status"], "ok");
            assert_eq!(answers[0].1["artifact"]["json"], json!(k));
        }
    });
    assert_eq!(f.job_folders().len(), ROUNDS, "one execution per request");
    for k in 0..ROUNDS {
        assert_eq!(f.audited("run_start", &format!("same-{k}")), 1);
    }
}
