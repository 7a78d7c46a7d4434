//! `agentjail serve --database postgres://…` (issue #19, part 1): several replicas on one real
//! PostgreSQL (a throwaway cluster per test, tests/common/pg.rs), against the real binary.
//! What is attacked: execute-once across replicas, tenant isolation from any replica, the
//! start-up reconcile's scope (a replica marks only its own runs), concurrent migrations, a
//! database restart under a stream of submissions, and the audit chain in the database.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::pg::{self, Node, Pg};
use common::serve::{Api, sha256_hex, sleeper_task};
use reqwest::blocking::Client;
use serde_json::{Value, json};

const ALICE: &str = "tok-alice-pg-1";
const GINA: &str = "tok-gina-pg-2";
const CSV: &str = "region,units\nnorth,12\nsouth,7\n";

fn sha(s: &str) -> String {
    sha256_hex(s)
}

fn config(node: &str, marker: &str) -> String {
    config_with(node, marker, "", "")
}

/// The configuration, with `server` lines and `[tasks.line_count.retention]` lines added
/// (`max_concurrent_runs = 4` unless `server` sets it).
fn config_with(node: &str, marker: &str, server: &str, retention: &str) -> String {
    let slots = if server.contains("max_concurrent_runs") {
        ""
    } else {
        "max_concurrent_runs = 4"
    };
    format!(
        r#"
[server]
{server}
node_id = "{node}"
{slots}
auth_failure_audit_seconds = 3600

[tenants.acme]
[tenants.globex]

[actors.alice]
tenant = "acme"
token_sha256 = "{a}"
operator = true

[actors.gina]
tenant = "globex"
token_sha256 = "{g}"

[tasks.line_count]
description = "Fixed program: count lines"
code = "forbidden"
command = ["/usr/bin/python3", "-c", "import json; print('ran'); json.dump({{'lines': sum(1 for _ in open('/input/data.csv'))}}, open('/output/count.json', 'w'))"]
allowed_tenants = ["acme", "globex"]
[[tasks.line_count.inputs]]
mount = "/input/data.csv"
media_types = ["text/csv"]
max_bytes = 100000
[tasks.line_count.output]
path = "/output/count.json"
media_type = "application/json"
max_bytes = 1000
[tasks.line_count.retention]
{retention}

{sleeper}"#,
        a = sha(ALICE),
        g = sha(GINA),
        sleeper = sleeper_task(marker, 30),
    )
}

struct Server {
    node: Node,
    api: Api,
}

impl std::ops::Deref for Server {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

/// Starts `serve` on `db` as node `node`, its data in `dir/data`, and its base URL; None if it
/// exits first (its stderr is then in the node's log).
fn spawn(dir: &Path, db: &str, node: &str, marker: &str) -> (Node, Option<String>) {
    spawn_cfg(dir, db, &config(node, marker))
}

/// As [`spawn`], with the configuration's text.
fn spawn_cfg(dir: &Path, db: &str, cfg_text: &str) -> (Node, Option<String>) {
    let args = ["serve", "--listen", "127.0.0.1:0"];
    let (node, line) = Node::spawn(dir, db, cfg_text, &args, "listening on ");
    let base = line.map(|l| {
        let rest = l.split("listening on ").nth(1).unwrap_or_default();
        rest.split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    });
    (node, base)
}

impl Server {
    fn start(dir: &Path, pg: &Pg, node: &str, marker: &str) -> Server {
        Server::start_cfg(dir, pg, &config(node, marker))
    }

    fn start_cfg(dir: &Path, pg: &Pg, cfg: &str) -> Server {
        let (node, base) = spawn_cfg(dir, &pg.url(), cfg);
        let base = base.unwrap_or_else(|| panic!("server did not start:\n{}", node.log()));
        Server {
            node,
            api: Api::new(&base),
        }
    }

    fn status_of(&self, id: &str) -> Value {
        self.get(ALICE, &format!("/v1/runs/{id}")).json().unwrap()
    }

    fn wait_final(&self, id: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let v = self.status_of(id);
            if v["status"] != "queued" && v["status"] != "running" {
                return v;
            }
            assert!(Instant::now() < deadline, "{id} never finished: {v}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_status(&self, id: &str, want: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let v = self.status_of(id);
            if v["status"] == want {
                return v;
            }
            assert!(Instant::now() < deadline, "{id} never reached {want}: {v}");
            std::thread::sleep(Duration::from_millis(30));
        }
    }

    /// Job folders this replica created: one per execution it started (every task here prints
    /// a line, and a job folder is made for a run's first byte of log).
    fn job_folders(&self) -> Vec<String> {
        self.node.job_folders()
    }

    fn kill(&mut self) {
        self.node.kill();
    }
}

fn tempdir() -> tempfile::TempDir {
    pg::tempdir("pg")
}

/// The serialised test lock: these tests start several servers and a cluster each; on two
/// cores, running them at once only makes each slower.
static SERIAL: Mutex<()> = Mutex::new(());

fn agentjail(args: &[&str], env: &[(&str, &str)]) -> common::Out {
    let mut c = Command::new(common::bin());
    c.args(args).env_remove("PGPASSWORD");
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    common::Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// The server's core behaviours on PostgreSQL: upload, submit, get, artifact, receipt; tenant
/// isolation (another tenant's run is a 404 byte-identical to a missing one); the input is
/// materialised from the database on the replica that runs it; the password is never in a
/// log; a URL carrying a password, or asking for TLS, is refused without echoing it.
#[test]
fn core_behaviours_on_postgres() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let dir = tempdir();
    let s = Server::start(dir.path(), &pg, "node-a", "m-core");

    let up = s.upload(ALICE, CSV, "text/csv");
    let id = up["input_id"].as_str().unwrap();
    assert_eq!(
        pg.psql(&format!("SELECT count(*) FROM inputs WHERE id = '{id}'")),
        "1",
        "the input record is in PostgreSQL"
    );
    assert_eq!(
        pg.psql(&format!(
            "SELECT octet_length(content) FROM objects WHERE sha256 = '{}'",
            sha(CSV)
        )),
        CSV.len().to_string(),
        "the input's content is in PostgreSQL"
    );
    let body = json!({"request_id": "core-1", "task": "line_count", "inputs": [id]});
    let r = s.run(ALICE, &body, "");
    assert_eq!(r.status(), 200, "{}", r.text().unwrap());
    let v: Value = r.json().unwrap();
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["artifact"]["json"]["lines"], 3, "{v}");
    assert!(s.node.dir.join("data/objects").join(sha(CSV)).exists());
    assert_eq!(
        pg.psql("SELECT node_id || ' ' || status FROM runs WHERE request_id = 'core-1'"),
        "node-a ok"
    );
    let art = s.get(ALICE, "/v1/runs/core-1/artifact");
    assert_eq!(art.status(), 200);
    let rec = s.get(ALICE, "/v1/runs/core-1/receipt");
    assert_eq!(rec.status(), 200);
    // Replay answers from the record.
    let again: Value = s.run(ALICE, &body, "").json().unwrap();
    assert_eq!(again["job_id"], v["job_id"]);

    // Tenant isolation: gina (globex) sees acme's run exactly as a missing one.
    for p in ["", "/artifact", "/receipt"] {
        let theirs = s.get(GINA, &format!("/v1/runs/core-1{p}"));
        let missing = s.get(GINA, &format!("/v1/runs/no-such-run{p}"));
        assert_eq!(theirs.status(), 404);
        assert_eq!(missing.status(), 404);
        assert_eq!(theirs.bytes().unwrap(), missing.bytes().unwrap(), "{p}");
    }
    // gina cannot run on acme's input either.
    let r = s.run(
        GINA,
        &json!({"request_id": "g-1", "task": "line_count", "inputs": [id]}),
        "",
    );
    assert_eq!(r.status(), 404, "{}", r.text().unwrap());

    let log = s.node.log();
    assert!(!log.contains(pg::PASSWORD), "the password is in the log");
    assert!(log.contains("store: PostgreSQL"), "{log}");

    // A URL with a password is refused, and the refusal does not repeat it; so is TLS.
    let d2 = tempdir();
    let with_pw = format!(
        "postgres://{}:{}@127.0.0.1:{}/{}",
        pg::USER,
        pg::PASSWORD,
        pg.port,
        pg::DB
    );
    for (url, want) in [
        (with_pw.as_str(), "holds a password"),
        (
            &*format!(
                "{}&sslmode=require",
                pg.url().replace("?sslmode=disable", "?x=1")
            ),
            "TLS",
        ),
    ] {
        let (mut node, base) = spawn(d2.path(), url, "node-x", "m");
        node.kill();
        assert!(base.is_none(), "serve started with {url}");
        let e = node.log();
        assert!(e.contains(want), "{e}");
        assert!(
            !e.contains(pg::PASSWORD),
            "the refusal repeats the password: {e}"
        );
    }
}

/// Two replicas on one database: the same request submitted to both at once, 20 times, runs
/// exactly once each time (one run record, one execution: one job folder on one replica and
/// one `run_start` in the audit chain), and both answers name the same job; a run accepted by
/// A is readable from B, artifact included.
#[test]
fn two_replicas_execute_each_request_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (da, db) = (tempdir(), tempdir());
    let a = Server::start(da.path(), &pg, "node-a", "m-two");
    let b = Server::start(db.path(), &pg, "node-b", "m-two");
    let up = a.upload(ALICE, CSV, "text/csv");
    let input = up["input_id"].as_str().unwrap().to_string();
    let a = Arc::new(a);
    let b = Arc::new(b);
    for i in 0..20 {
        let id = format!("dup-{i}");
        let body = json!({"request_id": id, "task": "line_count", "inputs": [input]});
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let hs: Vec<_> = [a.clone(), b.clone()]
            .into_iter()
            .map(|s| {
                let (body, barrier) = (body.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let r = s.run(ALICE, &body, "?wait=false");
                    let st = r.status().as_u16();
                    (st, r.json::<Value>().unwrap())
                })
            })
            .collect();
        let answers: Vec<(u16, Value)> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        for (st, v) in &answers {
            assert!(*st == 202 || *st == 200, "{st} {v}");
        }
        assert_eq!(
            answers[0].1["job_id"], answers[1].1["job_id"],
            "{answers:?}"
        );
        assert_eq!(answers[0].1["request_id"], answers[1].1["request_id"]);
        let fa = a.wait_final(&id);
        let fb = b.wait_final(&id);
        assert_eq!(fa, fb, "both replicas answer the same record");
        assert_eq!(fa["status"], "ok", "{fa}");
    }
    assert_eq!(
        pg.psql("SELECT count(*) FROM runs WHERE request_id LIKE 'dup-%'"),
        "20"
    );
    let folders = a.job_folders().len() + b.job_folders().len();
    assert_eq!(folders, 20, "executions (job folders) on A and B together");
    assert_eq!(
        pg.psql(
            "SELECT count(*) FROM audit_log WHERE record LIKE '%\"event\":\"run_start\"%' AND record LIKE '%\"request_id\":\"dup-%'"
        ),
        "20",
        "run_start records"
    );
    // Accepted by A, readable (artifact included) from B.
    let body = json!({"request_id": "via-a", "task": "line_count", "inputs": [input]});
    assert_eq!(a.run(ALICE, &body, "").status(), 200);
    let from_b = b.get(ALICE, "/v1/runs/via-a/artifact");
    assert_eq!(from_b.status(), 200);
    let from_a = a.get(ALICE, "/v1/runs/via-a/artifact");
    assert_eq!(from_b.bytes().unwrap(), from_a.bytes().unwrap());
}

/// Three replicas started at once on an empty database: the migrations are applied once (one
/// row per version in schema_migrations) and all three serve.
#[test]
fn three_replicas_starting_at_once_migrate_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let dirs: Vec<_> = (0..3).map(|_| tempdir()).collect();
    let url = pg.url();
    let hs: Vec<_> = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let (p, url) = (d.path().to_path_buf(), url.clone());
            std::thread::spawn(move || spawn(&p, &url, &format!("node-{i}"), "m-three"))
        })
        .collect();
    let started: Vec<(Node, Option<String>)> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    for (node, base) in &started {
        assert!(base.is_some(), "a replica did not start:\n{}", node.log());
    }
    let versions =
        pg.psql("SELECT string_agg(version::text, ',' ORDER BY version) FROM schema_migrations");
    let want: Vec<String> = (1..=agentjail_server::pg::SCHEMA_VERSION)
        .map(|v| v.to_string())
        .collect();
    assert_eq!(versions, want.join(","));
    let http = Client::new();
    for (_, base) in &started {
        let h = http
            .get(format!("{}/healthz", base.as_deref().unwrap()))
            .send()
            .unwrap();
        assert_eq!(h.status(), 200);
    }
    for (mut node, _) in started {
        node.kill();
    }
}

fn procs_matching(needle: &str) -> Vec<i32> {
    let mut found = Vec::new();
    let me = std::process::id() as i32;
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        if cmdline.starts_with("/usr/bin/python3") && cmdline.contains(needle) {
            found.push(pid);
        }
    }
    found
}

/// `kill -9` of replica A mid-run: A's runner and sandbox die with it (the lifeline); on its
/// restart A marks only its own in-flight run `unknown` (B's is untouched and finishes `ok`);
/// an operator's retry runs A's request once more.
#[test]
fn a_killed_replica_marks_only_its_own_runs_unknown() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (da, db) = (tempdir(), tempdir());
    let marker = format!(
        "pg-kill-marker-{}",
        da.path().file_name().unwrap().to_string_lossy()
    );
    // Runs go through the shared queue (crate::fleet): A, alone and with one run slot, claims
    // on-a; B, started afterwards, is then the only node free to claim on-b.
    let mut a = Server::start_cfg(
        da.path(),
        &pg,
        &config_with("node-a", &marker, "max_concurrent_runs = 1", ""),
    );
    let ra = json!({"request_id": "on-a", "task": "sleeper", "inputs": [], "args": ["5"]});
    let rb = json!({"request_id": "on-b", "task": "sleeper", "inputs": [], "args": ["8"]});
    assert_eq!(a.run(ALICE, &ra, "?wait=false").status(), 202);
    a.wait_status("on-a", "running");
    let b = Server::start(db.path(), &pg, "node-b", &marker);
    assert_eq!(b.run(ALICE, &rb, "?wait=false").status(), 202);
    b.wait_status("on-b", "running");
    assert_eq!(
        pg.psql(
            "SELECT string_agg(request_id || '@' || node_id, ',' ORDER BY request_id) FROM runs"
        ),
        "on-a@node-a,on-b@node-b"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while procs_matching(&marker).len() < 2 {
        assert!(Instant::now() < deadline, "the payloads never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    a.kill(); // SIGKILL
    // Within 3 s A's payload is gone; B's still runs.
    let deadline = Instant::now() + Duration::from_secs(3);
    while procs_matching(&marker).len() != 1 {
        assert!(
            Instant::now() < deadline,
            "A's payload outlived it: {:?}",
            procs_matching(&marker)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let a = Server::start(da.path(), &pg, "node-a", &marker);
    assert_eq!(a.status_of("on-a")["status"], "unknown");
    assert_eq!(
        b.status_of("on-b")["status"],
        "running",
        "A's restart touched B's run"
    );
    assert_eq!(b.wait_final("on-b")["status"], "ok");
    let r = a
        .http
        .post(a.url("/v1/runs/on-a/reconcile"))
        .bearer_auth(ALICE)
        .json(&json!({ "action": "retry" }))
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().unwrap());
    let v = a.wait_final("on-a");
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(
        pg.psql(
            "SELECT count(*) FROM audit_log WHERE record LIKE '%\"event\":\"run_start\"%' AND record LIKE '%\"request_id\":\"on-a\"%'"
        ),
        "2",
        "the killed attempt and the retry"
    );
}

/// The advisory lock of `node`'s audit chain (`crate::pg::AUDIT_LOCK_PREFIX` of the server
/// crate), as the database computes it.
fn audit_lock(pg: &Pg, node: &str) -> i64 {
    pg.psql(&format!(
        "SELECT hashtextextended('agentjail-audit-chain:{node}', 0)"
    ))
    .parse()
    .unwrap()
}

/// Starts node-a on `dir`, runs `sleeper` (20 s) as `request_id` and kills (SIGKILL) the
/// replica mid-run: its next start finds the run in flight.
fn kill_mid_run(dir: &Path, pg: &Pg, marker: &str, request_id: &str) {
    let mut a = Server::start(dir, pg, "node-a", marker);
    let body = json!({"request_id": request_id, "task": "sleeper", "inputs": [], "args": ["20"]});
    assert_eq!(a.run(ALICE, &body, "?wait=false").status(), 202);
    a.wait_status(request_id, "running");
    a.kill();
}

/// Waits (at most 30 s) until a session of a replica waits on the advisory lock `key`;
/// `alive` is asked on each round (false: the replica exited first).
fn wait_for_advisory_waiter(pg: &Pg, key: i64, what: &str, mut alive: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    // A one-bigint advisory key is held as (classid, objid) = (high, low 32 bits).
    let waiting = format!(
        "SELECT count(*) > 0 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE a.application_name = 'agentjail' AND l.locktype = 'advisory' AND NOT l.granted
         AND ((l.classid::bigint << 32) | l.objid::bigint) = {key}"
    );
    while pg.psql(&waiting) != "t" {
        assert!(alive(), "the replica exited before {what} reached its lock");
        assert!(Instant::now() < deadline, "{what} never reached its lock");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A replica killed between recording a run's result and appending its `run_end` must not
/// leave an ended run the chain does not account for. The window is made wide on purpose: a
/// session holds the chain's lock while the run ends, so the run's end waits on it, and the
/// replica is killed while it waits. Either the result and its `run_end` both land or neither
/// does (then the restart marks the run `unknown` and audits that).
#[test]
fn a_replica_killed_while_ending_a_run_leaves_no_unaudited_result() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let da = tempdir();
    let marker = format!(
        "pg-end-marker-{}",
        da.path().file_name().unwrap().to_string_lossy()
    );
    let mut a = Server::start(da.path(), &pg, "node-a", &marker);
    let body = json!({"request_id": "end-1", "task": "sleeper", "inputs": [], "args": ["4"]});
    assert_eq!(a.run(ALICE, &body, "?wait=false").status(), 202);
    a.wait_status("end-1", "running");
    let records = |event: &str| pg.audited(event, "end-1");
    let deadline = Instant::now() + Duration::from_secs(10);
    while records("run_start") != "1" {
        assert!(Instant::now() < deadline, "run_start never audited");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The payload sleeps 4 s: the chain is locked before it ends.
    let audit_lock = audit_lock(&pg, "node-a");
    let lock = pg.hold_advisory_lock(audit_lock);
    assert_eq!(
        pg.psql("SELECT status FROM runs WHERE request_id = 'end-1'"),
        "running",
        "the run ended before the lock was taken; the test proves nothing"
    );
    // Wait until the replica's end of the run waits on the chain's lock.
    wait_for_advisory_waiter(&pg, audit_lock, "the run's end", || true);
    let seen = pg.psql("SELECT status FROM runs WHERE request_id = 'end-1'");
    a.kill(); // SIGKILL, mid-append
    drop(lock);
    drop(a);
    let a = Server::start(da.path(), &pg, "node-a", &marker);
    let status = pg.psql("SELECT status FROM runs WHERE request_id = 'end-1'");
    assert_eq!(
        (seen.as_str(), status.as_str(), records("run_end").as_str()),
        ("running", "unknown", "0"),
        "a result was recorded without its run_end (the chain must account for every recorded end)"
    );
    assert_eq!(
        records("run_unknown"),
        "1",
        "the restart's marking is audited"
    );
    assert_eq!(a.status_of("end-1")["status"], "unknown");
    let env = [("PGPASSWORD", pg::PASSWORD)];
    let o = agentjail(&["audit", "verify", "--database", &pg.url()], &env);
    assert_eq!(o.code, 0, "{}", o.dump());
}

/// The start-up marking of a run left in flight, and its `run_unknown` record, land together
/// or not at all. A replica is killed mid-run; its restart is held at the audit chain's lock
/// (a session holds it) while it marks the run, and killed there. On a replica that commits
/// the marking first, the run is then `unknown` with no record, and no later start-up finds
/// it in flight again to audit it; here the marking is undone with its record, and the next
/// start-up marks and audits it.
#[test]
fn a_replica_killed_while_marking_its_runs_unknown_leaves_no_unaudited_marking() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let da = tempdir();
    let marker = format!(
        "pg-mark-marker-{}",
        da.path().file_name().unwrap().to_string_lossy()
    );
    kill_mid_run(da.path(), &pg, &marker, "mark-1");
    let records = || pg.audited("run_unknown", "mark-1");
    let audit_lock = audit_lock(&pg, "node-a");
    let lock = pg.hold_advisory_lock(audit_lock);
    // The restart, by hand: it must not get past its start-up marking.
    let mut restart = Command::new(common::bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(da.path().join("config.toml"))
        .arg("--data-dir")
        .arg(da.path().join("data"))
        .args(["--database", &pg.url()])
        .env("PGPASSWORD", pg::PASSWORD)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for_advisory_waiter(&pg, audit_lock, "the restart's marking", || {
        restart.try_wait().unwrap().is_none()
    });
    let seen = pg.psql("SELECT status FROM runs WHERE request_id = 'mark-1'");
    restart.kill().unwrap(); // SIGKILL, mid-marking
    restart.wait().unwrap();
    drop(lock);
    assert_eq!(
        (seen.as_str(), records().as_str()),
        ("running", "0"),
        "the run was marked unknown without its run_unknown record"
    );
    let a = Server::start(da.path(), &pg, "node-a", &marker);
    assert_eq!(a.status_of("mark-1")["status"], "unknown");
    assert_eq!(records(), "1", "the marking is audited once");
    let env = [("PGPASSWORD", pg::PASSWORD)];
    let o = agentjail(&["audit", "verify", "--database", &pg.url()], &env);
    assert_eq!(o.code, 0, "{}", o.dump());
}

/// An operator's reconcile (retry, then abandon) and its `reconcile` record land together or
/// not at all. A trigger the test adds makes the insert of a `reconcile` record wait on an
/// advisory lock a session holds, and the replica is killed while it waits: on a replica that
/// commits the change first and audits after, the run is then `queued` (retry) or `abandoned`
/// with no record saying who did it; here the change is undone with its record, and the run is
/// still `unknown`.
#[test]
fn a_replica_killed_while_reconciling_leaves_no_unaudited_reconcile() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let da = tempdir();
    let marker = format!(
        "pg-rec-marker-{}",
        da.path().file_name().unwrap().to_string_lossy()
    );
    kill_mid_run(da.path(), &pg, &marker, "rec-1"); // the restart marks it unknown
    const HOLD: i64 = 4242;
    pg.psql(&format!(
        "CREATE FUNCTION hold_reconcile() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.record::jsonb->>'event' = 'reconcile' THEN PERFORM pg_advisory_xact_lock({HOLD}); END IF; RETURN NEW; END $$; CREATE TRIGGER hold_reconcile BEFORE INSERT ON audit_log FOR EACH ROW EXECUTE FUNCTION hold_reconcile()"
    ));
    for action in ["retry", "abandon"] {
        let mut a = Server::start(da.path(), &pg, "node-a", &marker);
        assert_eq!(a.status_of("rec-1")["status"], "unknown");
        let lock = pg.hold_advisory_lock(HOLD);
        let (http, url) = (a.http.clone(), a.url("/v1/runs/rec-1/reconcile"));
        let call = std::thread::spawn(move || {
            let _ = http
                .post(url)
                .bearer_auth(ALICE)
                .json(&json!({ "action": action }))
                .send();
        });
        wait_for_advisory_waiter(&pg, HOLD, &format!("the {action}'s record"), || true);
        let seen = pg.psql("SELECT status FROM runs WHERE request_id = 'rec-1'");
        a.kill(); // SIGKILL while the record's insert waits
        drop(lock);
        let _ = call.join();
        // The killed replica's session ends once its insert is through (it finds no client).
        let deadline = Instant::now() + Duration::from_secs(30);
        while pg.psql(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'agentjail' AND state <> 'idle'",
        ) != "0"
        {
            assert!(Instant::now() < deadline, "the killed replica's session lingers");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            (seen.as_str(), pg.audited("reconcile", "rec-1").as_str()),
            ("unknown", "0"),
            "the {action} was committed before its record"
        );
        assert_eq!(
            pg.psql("SELECT status FROM runs WHERE request_id = 'rec-1'"),
            "unknown",
            "the {action} landed without its record"
        );
    }
    pg.psql("DROP TRIGGER hold_reconcile ON audit_log");
    let a = Server::start(da.path(), &pg, "node-a", &marker);
    assert_eq!(a.status_of("rec-1")["status"], "unknown");
    let r = a
        .http
        .post(a.url("/v1/runs/rec-1/reconcile"))
        .bearer_auth(ALICE)
        .json(&json!({ "action": "abandon" }))
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().unwrap());
    assert_eq!(a.status_of("rec-1")["status"], "abandoned");
    assert_eq!(pg.audited("reconcile", "rec-1"), "1");
    let env = [("PGPASSWORD", pg::PASSWORD)];
    let o = agentjail(&["audit", "verify", "--database", &pg.url()], &env);
    assert_eq!(o.code, 0, "{}", o.dump());
}

/// PostgreSQL stopped (fast: connections cut) and started again during a stream of
/// submissions and runs: each answer is 200/202 or 503 with Retry-After, never 500; runs in
/// flight record their end once the database is back; resubmitting the 503 ones (same
/// request_id) records every request exactly once: none lost, none doubled.
#[test]
fn a_database_restart_loses_and_doubles_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let da = tempdir();
    let a = Arc::new(Server::start(da.path(), &pg, "node-a", "m-restart"));
    let up = a.upload(ALICE, CSV, "text/csv");
    let input = up["input_id"].as_str().unwrap().to_string();
    // The outage is made to meet the stream, whatever the machine's speed: the database goes
    // down only after runs were accepted (some still in flight), comes back only after
    // submissions were refused, and the stream ends only after more were accepted again.
    let stop = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicUsize::new(0));
    let refused_n = Arc::new(AtomicUsize::new(0));
    let (a2, stop2, accepted2, refused2) =
        (a.clone(), stop.clone(), accepted.clone(), refused_n.clone());
    let submitter = std::thread::spawn(move || {
        let mut refused = Vec::new();
        let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
        let mut i = 0;
        while !stop2.load(Ordering::SeqCst) {
            let body =
                json!({"request_id": format!("st-{i}"), "task": "line_count", "inputs": [input]});
            let r = a2.run(ALICE, &body, "?wait=false");
            let st = r.status().as_u16();
            *statuses.entry(st).or_default() += 1;
            match st {
                200 | 202 => {
                    accepted2.fetch_add(1, Ordering::SeqCst);
                }
                503 => {
                    assert!(r.headers().get("retry-after").is_some());
                    refused.push(body);
                    refused2.fetch_add(1, Ordering::SeqCst);
                }
                other => panic!("answer {other}: {}", r.text().unwrap()),
            }
            i += 1;
            std::thread::sleep(Duration::from_millis(60));
        }
        (refused, statuses, i)
    });
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for("10 accepted runs", &|| {
        accepted.load(Ordering::SeqCst) >= 10
    });
    pg.stop();
    wait_for("3 refused submissions", &|| {
        refused_n.load(Ordering::SeqCst) >= 3
    });
    pg.start_again();
    let before = accepted.load(Ordering::SeqCst);
    wait_for("10 runs accepted after the restart", &|| {
        accepted.load(Ordering::SeqCst) >= before + 10
    });
    stop.store(true, Ordering::SeqCst);
    let (refused, statuses, n) = submitter.join().unwrap();
    eprintln!("answers around the restart: {statuses:?}");
    assert!(
        !refused.is_empty(),
        "no submission met the outage (the test did not attack it): {statuses:?}"
    );
    for body in &refused {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let st = a.run(ALICE, body, "?wait=false").status().as_u16();
            if st == 200 || st == 202 {
                break;
            }
            assert_eq!(st, 503);
            assert!(Instant::now() < deadline, "the database never came back");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    for i in 0..n {
        let v = a.wait_final(&format!("st-{i}"));
        assert!(v["status"] == "ok", "st-{i}: {v}");
    }
    assert_eq!(
        pg.psql("SELECT count(*) FROM runs WHERE request_id LIKE 'st-%'"),
        n.to_string()
    );
    assert_eq!(a.job_folders().len(), n, "one execution per request");
}

/// The audit chain in the database: `audit verify --database` passes; `audit export` writes
/// JSONL the file verifier accepts; an UPDATE of one row is detected by both.
#[test]
fn audit_chain_in_the_database_verifies_and_detects_tampering() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (da, db) = (tempdir(), tempdir());
    let a = Server::start(da.path(), &pg, "node-a", "m-audit");
    let b = Server::start(db.path(), &pg, "node-b", "m-audit");
    let up = a.upload(ALICE, CSV, "text/csv");
    let input = up["input_id"].as_str().unwrap().to_string();
    // Both replicas append at once (and stay up to the end of the test).
    let servers = [Arc::new(a), Arc::new(b)];
    let hs: Vec<_> = servers
        .iter()
        .cloned()
        .enumerate()
        .map(|(k, s)| {
            let input = input.clone();
            std::thread::spawn(move || {
                for i in 0..5 {
                    let body = json!({"request_id": format!("au-{k}-{i}"), "task": "line_count", "inputs": [input]});
                    assert_eq!(s.run(ALICE, &body, "").status(), 200);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    // Every decision of both replicas is in the one chain: none lost to a racing append. A
    // run's `run_end` commits with its result, and the answer is read from the result: all
    // ten are in by the time the last answer came back.
    let n = pg.psql(
        "SELECT count(*) FROM audit_log WHERE record LIKE '%\"event\":\"run_end\"%' AND record LIKE '%\"request_id\":\"au-%'",
    );
    assert_eq!(n, "10", "run_end records of the 10 answered runs");
    let env = [("PGPASSWORD", pg::PASSWORD)];
    let url = pg.url();
    let o = agentjail(&["audit", "verify", "--database", &url], &env);
    assert_eq!(o.code, 0, "{}", o.dump());
    assert!(o.stdout.contains("audit chain OK"), "{}", o.dump());
    let n: u64 = pg.psql("SELECT count(*) FROM audit_log").parse().unwrap();
    assert!(o.stdout.contains(&format!("{n} record(s)")), "{}", o.dump());
    let o = agentjail(&["audit", "export", "--database", &url], &env);
    assert_eq!(o.code, 0, "{}", o.dump());
    let file = da.path().join("export.jsonl");
    std::fs::write(&file, &o.stdout).unwrap();
    let v = agentjail(&["audit", "verify", file.to_str().unwrap()], &[]);
    assert_eq!(v.code, 0, "{}", v.dump());
    // One chain per replica, each anchoring the other's head: node-a's chain cut short below
    // the head node-b recorded is detected, though node-a's chain verifies on its own.
    let anchored = "SELECT coalesce(max((x->>'seq')::bigint), 0) FROM audit_log, jsonb_array_elements(record::jsonb->'anchors') x WHERE chain = 'node-b' AND x->>'node' = 'node-a'";
    let deadline = Instant::now() + Duration::from_secs(20);
    while pg.psql(anchored) == "0" {
        assert!(
            Instant::now() < deadline,
            "node-b never anchored node-a's chain"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let o = agentjail(&["audit", "export", "--database", &url], &env);
    let seq: u64 = pg.psql(anchored).parse().unwrap();
    let cut: Vec<&str> = o
        .stdout
        .lines()
        .filter(|l| {
            let r: serde_json::Value = serde_json::from_str(l).unwrap();
            !(r["node"] == "node-a" && r["seq"].as_u64().unwrap() >= seq)
        })
        .collect();
    std::fs::write(&file, cut.join("\n") + "\n").unwrap();
    let v = agentjail(&["audit", "verify", file.to_str().unwrap()], &[]);
    assert_eq!(v.code, 1, "{}", v.dump());
    assert!(
        v.stderr.contains("chain node-a lacks its record"),
        "{}",
        v.dump()
    );
    let o = agentjail(&["audit", "verify", "--database", &url], &env);
    assert!(
        o.stdout.contains("2 chain(s)") && o.stdout.contains("cross-anchor"),
        "{}",
        o.dump()
    );
    // Without the password: a clear refusal (125), not a verdict.
    let o = agentjail(&["audit", "verify", "--database", &url], &[]);
    assert_eq!(o.code, 125, "{}", o.dump());
    // Tamper with one record.
    pg.psql("UPDATE audit_log SET record = replace(record, '\"run_start\"', '\"run_startx\"') WHERE seq = (SELECT min(seq) FROM audit_log WHERE record LIKE '%\"run_start\"%')");
    let o = agentjail(&["audit", "verify", "--database", &url], &env);
    assert_eq!(o.code, 1, "{}", o.dump());
    assert!(o.stderr.contains("BROKEN"), "{}", o.dump());
    let o = agentjail(&["audit", "export", "--database", &url], &env);
    std::fs::write(&file, &o.stdout).unwrap();
    let v = agentjail(&["audit", "verify", file.to_str().unwrap()], &[]);
    assert_eq!(v.code, 1, "{}", v.dump());
}

/// Retention on PostgreSQL: outputs, inputs and their content leave the database once past
/// their retention, the job folder leaves the replica that ran the run, and the replica that
/// ran it drops its cached copy of the input whichever replica's sweep deleted the database's.
#[test]
fn retention_sweeps_the_database_and_every_replica() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (da, db) = (tempdir(), tempdir());
    let server = "sweep_interval_seconds = 1\ninput_retention_seconds = 2";
    let retention = "outputs_seconds = 2\nlogs_seconds = 3";
    let a = Server::start_cfg(
        da.path(),
        &pg,
        &config_with("node-a", "m-ret", server, retention),
    );
    let b = Server::start_cfg(
        db.path(),
        &pg,
        &config_with("node-b", "m-ret", server, retention),
    );
    let up = a.upload(ALICE, CSV, "text/csv");
    let input = up["input_id"].as_str().unwrap().to_string();
    // Submitted to B; whichever replica claims it materialises the input from the database.
    let body = json!({"request_id": "ret-1", "task": "line_count", "inputs": [input]});
    let v: Value = b.run(ALICE, &body, "").json().unwrap();
    assert_eq!(v["status"], "ok", "{v}");
    let (b, db) = if b.job_folders().len() == 1 {
        (&b, &db)
    } else {
        (&a, &da)
    };
    let cached = db.path().join("data/objects").join(sha(CSV));
    assert!(
        cached.exists(),
        "the executor ran the run from its cached copy"
    );
    assert_eq!(b.job_folders().len(), 1);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let outputs_gone = a.get(ALICE, "/v1/runs/ret-1/artifact").status() == 410;
        let rows = pg.psql(
            "SELECT (SELECT count(*) FROM inputs) || ' ' || (SELECT count(*) FROM objects) || ' ' || (SELECT count(*) FROM runs WHERE artifact IS NOT NULL OR report IS NOT NULL)",
        );
        if outputs_gone && rows == "0 0 0" && !cached.exists() && b.job_folders().is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "retention did not apply: artifact gone {outputs_gone}, inputs/objects/outputs {rows}, B's cached object {}, B's job folders {:?}",
            cached.exists(),
            b.job_folders()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let v = a.status_of("ret-1");
    assert_eq!(v["outputs_deleted"], true, "{v}");
    assert_eq!(v["status"], "ok", "the record itself stays");
    let log = pg.psql("SELECT count(*) FROM audit_log WHERE record LIKE '%retention_sweep%'");
    assert_ne!(log, "0", "the sweep is audited");
}
