//! The worker fleet on PostgreSQL (issue #19, part 2): `serve --slots 0` (an API replica that
//! only enqueues) and `agentjail worker` processes that claim runs with leases and fencing
//! tokens, on a throwaway cluster (tests/common/pg.rs), against the real binary.
//! What is attacked: execute-once across workers; a worker killed mid-run (its sandbox dies
//! with it, the run becomes `unknown` when its lease expires, it never runs twice); a worker
//! whose lease is taken from it while it is stopped (it kills its sandbox and its late
//! result is refused by the fencing); the cluster gauges.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::pg::{self, Node, Pg};
use common::serve::{Api, sha256_hex, sleeper_task};
use common::{payloads, wait_payloads};
use serde_json::{Value, json};

const ALICE: &str = "tok-alice-fleet-1";

/// One configuration for every node: a 3-second lease, the `sleeper` task (its processes carry
/// `marker` in their command line).
fn config(marker: &str) -> String {
    format!(
        r#"
[server]
node_id = "api"
lease_seconds = 3
auth_failure_audit_seconds = 3600

[tenants.acme]

[actors.alice]
tenant = "acme"
token_sha256 = "{a}"
operator = true
{sleeper}"#,
        a = sha256_hex(ALICE),
        // Its stdout shown (a fixed program shows none by default): the streams' tests.
        sleeper =
            sleeper_task(marker, 30).replace("max_args = 1\n", "max_args = 1\nstdout_bytes = 64\n"),
    )
}

fn tempdir() -> tempfile::TempDir {
    pg::tempdir("fleet")
}

/// `serve --slots 0` on `dir`: the API replica; returns it and its client.
fn api(dir: &Path, pg: &Pg, cfg: &str) -> (Node, Api) {
    let (n, line) = Node::start(
        dir,
        &pg.url(),
        cfg,
        &["serve", "--listen", "127.0.0.1:0", "--slots", "0"],
        "listening on ",
    );
    let base = line
        .split("listening on ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    (n, Api::new(&base))
}

/// `worker --slots 1 --node-id ID` on `dir`.
fn worker(dir: &Path, pg: &Pg, cfg: &str, id: &str) -> Node {
    Node::start(
        dir,
        &pg.url(),
        cfg,
        &["worker", "--slots", "1", "--node-id", id],
        "claiming runs",
    )
    .0
}

fn status_of(api: &Api, id: &str) -> Value {
    api.status_of(ALICE, id)
}

fn wait_status(api: &Api, id: &str, want: &str, secs: u64) -> Value {
    api.wait_status(ALICE, id, want, secs)
}

fn wait_final(api: &Api, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let v = status_of(api, id);
        if v["status"] != "queued" && v["status"] != "running" {
            return v;
        }
        assert!(Instant::now() < deadline, "{id} never finished: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How many `event` records the audit chain holds for `request_id`.
/// One value of `/metrics`, by its series' name.
fn metric(api: &Api, name: &str) -> Option<f64> {
    api.metrics()
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

fn marker_for(d: &tempfile::TempDir, what: &str) -> String {
    format!(
        "fleet-{what}-{}",
        d.path().file_name().unwrap().to_string_lossy()
    )
}

/// The serialised test lock: each test starts a cluster and several processes.
static SERIAL: Mutex<()> = Mutex::new(());

/// `serve --slots 0` and two workers: every run finishes `ok` exactly once (one `run_start`,
/// one job folder, on a worker, none on the API replica), spread over both workers. The
/// cluster gauges are on the API replica's `/metrics` from start-up.
#[test]
fn two_workers_execute_each_run_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (d_api, d_w1, d_w2) = (tempdir(), tempdir(), tempdir());
    let cfg = config(&marker_for(&d_api, "once"));
    let (api_node, api) = api(d_api.path(), &pg, &cfg);
    for g in [
        "agentjail_cluster_queue_depth",
        "agentjail_cluster_oldest_queued_seconds",
        "agentjail_cluster_live_workers",
        "agentjail_cluster_expired_leases_total",
    ] {
        assert_eq!(metric(&api, g), Some(0.0), "{g} at start-up");
    }
    // Queued before any worker exists: they wait in the queue, visible in the gauges.
    let n = 6;
    for i in 0..n {
        let body =
            json!({"request_id": format!("r-{i}"), "task": "sleeper", "inputs": [], "args": ["1"]});
        assert_eq!(api.run(ALICE, &body, "?wait=false").status(), 202);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&api, "agentjail_cluster_queue_depth") != Some(n as f64) {
        assert!(Instant::now() < deadline, "the queue depth never read {n}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(status_of(&api, "r-0")["status"], "queued");
    let w1 = worker(d_w1.path(), &pg, &cfg, "w1");
    let w2 = worker(d_w2.path(), &pg, &cfg, "w2");
    for i in 0..n {
        let v = wait_final(&api, &format!("r-{i}"));
        assert_eq!(v["status"], "ok", "{v}");
        // What the worker's sandbox printed reaches the record that the API replica serves
        // (issue #33): shown, counted and digested.
        assert_eq!(v["stdout"]["bytes"], 4, "{v}");
        assert_eq!(
            v["stdout"]["sha256"],
            format!("sha256:{}", sha256_hex("ran\n")),
            "{v}"
        );
        assert_eq!(
            (&v["stdout"]["head"], &v["stdout"]["omitted_bytes"]),
            (&json!("ran\n"), &json!(0)),
            "{v}"
        );
        assert_eq!(pg.audited("run_start", &format!("r-{i}")), "1");
        assert_eq!(pg.audited("run_end", &format!("r-{i}")), "1");
    }
    // Listed by the API replica from the shared store (an operator: every tenant's).
    let listed: Value = api.get(ALICE, "/v1/runs?status=ok&limit=4").json().unwrap();
    assert_eq!(listed["runs"].as_array().map(Vec::len), Some(4), "{listed}");
    let cursor = listed["next_cursor"]
        .as_str()
        .unwrap_or_else(|| panic!("{listed}"));
    let rest: Value = api
        .get(
            ALICE,
            &format!("/v1/runs?status=ok&limit=4&cursor={cursor}"),
        )
        .json()
        .unwrap();
    assert_eq!(rest["runs"].as_array().map(Vec::len), Some(n - 4), "{rest}");
    // The log of a worker's run, served by the API replica from the shared store.
    let log = api.get(ALICE, "/v1/runs/r-0/logs?stream=stdout");
    assert_eq!(log.status(), 200);
    assert_eq!(log.bytes().unwrap().as_ref(), b"ran\n");
    // Its stderr is not shown (stderr_bytes 0 for a fixed program): it never leaves.
    let log = api.get(ALICE, "/v1/runs/r-0/logs?stream=stderr");
    assert_eq!(log.status(), 403);
    let (f1, f2) = (w1.job_folders(), w2.job_folders());
    assert_eq!(
        f1.len() + f2.len(),
        n,
        "one job folder per run: {f1:?} {f2:?}"
    );
    assert!(
        !f1.is_empty() && !f2.is_empty(),
        "both workers ran some: {f1:?} {f2:?}"
    );
    assert!(
        api_node.job_folders().is_empty(),
        "the API replica ran nothing"
    );
    assert_eq!(
        pg.psql("SELECT count(DISTINCT node_id) FROM runs WHERE status = 'ok'"),
        "2"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&api, "agentjail_cluster_live_workers") != Some(2.0)
        || metric(&api, "agentjail_cluster_queue_depth") != Some(0.0)
    {
        assert!(
            Instant::now() < deadline,
            "the gauges never read 2 live workers, an empty queue"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(w1);
    drop(w2);
    drop(api_node);
}

/// The `sleeper` as task `denier`, refused a syscall first: ptrace(PTRACE_ATTACH, 1), which
/// the seccomp filter reports by name (a `syscall` denial `ptrace`).
fn denier_task(marker: &str) -> String {
    sleeper_task(marker, 30)
        .replace("[tasks.sleeper", "[tasks.denier")
        .replace(
            "import json, sys, time; ",
            "import ctypes, json, sys, time; L = ctypes.c_long; ctypes.CDLL(None).syscall(L(101), L(16), L(1), L(0), L(0)); ",
        )
        .replace("max_args = 1\n", "max_args = 1\nstdout_bytes = 64\n")
}

/// `GET /v1/runs/{id}/events` on the API replica while the run executes on a worker (issue
/// #33): the worker's output and its denial reach the follower live through the database (a
/// chunk and the `denial` arrive while the record says `running`), then `ended` with the final
/// record.
#[test]
fn a_run_on_a_worker_is_followed_live_through_a_replica() {
    use common::serve::read_sse;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (d_api, d_w1) = (tempdir(), tempdir());
    let marker = marker_for(&d_api, "follow");
    let cfg = format!("{}{}", config(&marker), denier_task(&marker));
    let (_api_node, api) = api(d_api.path(), &pg, &cfg);
    let _w1 = worker(d_w1.path(), &pg, &cfg, "w1");
    let body = json!({"request_id": "followed", "task": "denier", "inputs": [], "args": ["3"]});
    assert_eq!(api.run(ALICE, &body, "?wait=false").status(), 202);
    let r = api
        .http
        .get(api.url("/v1/runs/followed/events"))
        .bearer_auth(ALICE)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let (mut kinds, mut live, mut text, mut ended) =
        (Vec::new(), false, String::new(), Value::Null);
    let (mut denials, mut denied_live) = (Vec::new(), false);
    read_sse(r, |e| {
        kinds.push(e.event.clone());
        match e.event.as_str() {
            "stdout" => {
                let d: Value = serde_json::from_str(&e.data).unwrap();
                text.push_str(d["text"].as_str().unwrap());
                live |= status_of(&api, "followed")["status"] == "running";
            }
            "denial" => {
                denials.push(serde_json::from_str::<Value>(&e.data).unwrap());
                denied_live |= status_of(&api, "followed")["status"] == "running";
            }
            "ended" => ended = serde_json::from_str(&e.data).unwrap(),
            _ => {}
        }
        e.event != "ended"
    });
    assert_eq!(text, "ran\n", "{kinds:?}");
    assert!(
        live,
        "the worker's output reached the replica only at the end: {kinds:?}"
    );
    assert_eq!(ended["status"], "ok", "{ended}");
    assert_eq!(
        denials,
        [json!({"kind": "syscall", "detail": "ptrace", "untrusted": true})],
        "{kinds:?}"
    );
    assert!(
        denied_live,
        "the worker's denial reached the replica only at the end: {kinds:?}"
    );
    assert_eq!(ended["report"]["denials"][0]["detail"], "ptrace", "{ended}");
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("queued"),
        "{kinds:?}"
    );
}

/// `POST /v1/runs/{id}/cancel` on an API replica (issue #33): a queued run no executor has
/// claimed ends `cancelled` at once and never starts; a run executing on a worker is killed by
/// that worker at its next lease renewal (a third of the 3-second lease), its sandbox gone,
/// what it printed kept; each audited once.
#[test]
fn a_cancel_on_a_replica_stops_a_queued_run_and_kills_one_on_a_worker() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (d_api, d_w1) = (tempdir(), tempdir());
    let marker = marker_for(&d_api, "cancel");
    let cfg = config(&marker);
    let (_api_node, api) = api(d_api.path(), &pg, &cfg);
    let cancel = |id: &str| -> (u16, Value) {
        let r = api
            .http
            .post(api.url(&format!("/v1/runs/{id}/cancel")))
            .bearer_auth(ALICE)
            .send()
            .unwrap();
        (r.status().as_u16(), r.json().unwrap())
    };
    // No worker yet: the run waits in the queue.
    let body = json!({"request_id": "queued", "task": "sleeper", "inputs": [], "args": ["0"]});
    assert_eq!(api.run(ALICE, &body, "?wait=false").status(), 202);
    let (code, v) = cancel("queued");
    assert_eq!((code, &v["status"]), (200, &json!("cancelled")), "{v}");
    assert_eq!(pg.audited("run_end", "queued"), "1");
    // A worker comes: it never claims the cancelled run.
    let _w1 = worker(d_w1.path(), &pg, &cfg, "w1");
    let body = json!({"request_id": "running", "task": "sleeper", "inputs": [], "args": ["30"]});
    assert_eq!(api.run(ALICE, &body, "?wait=false").status(), 202);
    wait_status(&api, "running", "running", 30);
    wait_payloads(&marker, 1, 20);
    let t = Instant::now();
    let (code, v) = cancel("running");
    assert!(code == 200 || code == 202, "{code}: {v}");
    let v = wait_final(&api, "running");
    assert_eq!(v["status"], "cancelled", "{v}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    wait_payloads(&marker, 0, 5);
    assert_eq!(v["stdout"]["bytes"], 4, "what it printed so far: {v}");
    assert_eq!(pg.audited("run_cancel", "running"), "1");
    assert_eq!(
        pg.audited("run_start", "queued"),
        "0",
        "the cancelled queued run started"
    );
    assert_eq!(status_of(&api, "queued")["status"], "cancelled");
    // Idempotent.
    let (code, again) = cancel("running");
    assert_eq!((code, &again["finished_at"]), (200, &v["finished_at"]));
}

/// One JSON-RPC message to `/mcp` (Streamable HTTP) as alice: the status, the session id it
/// answered, and the body.
fn mcp_post(api: &Api, session: Option<&str>, msg: &Value) -> (u16, Option<String>, String) {
    let mut rq = api
        .http
        .post(api.url("/mcp"))
        .bearer_auth(ALICE)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .header("content-type", "application/json")
        .timeout(Duration::from_secs(120))
        .body(msg.to_string());
    if let Some(s) = session {
        rq = rq.header("mcp-session-id", s);
    }
    let r = rq.send().unwrap();
    let sid = r
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_string());
    (r.status().as_u16(), sid, r.text().unwrap_or_default())
}

/// An MCP client that cancels its call (`notifications/cancelled`) through the API replica
/// cancels the run itself, on the worker that executes it: the sandbox is killed and the run
/// ends `cancelled`, as with `POST /v1/runs/{id}/cancel` (not only the replica's wait).
#[test]
fn an_mcp_cancel_through_a_replica_kills_the_run_on_a_worker() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (d_api, d_w1) = (tempdir(), tempdir());
    let marker = marker_for(&d_api, "mcp-cancel");
    let cfg = config(&marker);
    let (_api_node, api) = api(d_api.path(), &pg, &cfg);
    let _w1 = worker(d_w1.path(), &pg, &cfg, "w1");
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
        "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"fleet","version":"1"}}});
    let (code, sid, body) = mcp_post(&api, None, &init);
    assert_eq!(code, 200, "{body}");
    let sid = sid.expect("no Mcp-Session-Id");
    let (code, _, body) = mcp_post(
        &api,
        Some(&sid),
        &json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
    );
    assert_eq!(code, 202, "{body}");
    let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{
        "name":"sleeper","arguments":{"args":["30"],"request_id":"mcp-cancel"}}});
    let (api2, sid2) = (Api::new(&api.base), sid.clone());
    // Its answer never comes (a cancelled request is not answered): not joined.
    std::thread::spawn(move || mcp_post(&api2, Some(&sid2), &call));
    wait_status(&api, "mcp-cancel", "running", 30);
    wait_payloads(&marker, 1, 20);
    let t = Instant::now();
    let cancel = json!({"jsonrpc":"2.0","method":"notifications/cancelled",
        "params":{"requestId":2,"reason":"the agent gave up"}});
    let (code, _, body) = mcp_post(&api, Some(&sid), &cancel);
    assert_eq!(code, 202, "{body}");
    let v = wait_final(&api, "mcp-cancel");
    assert_eq!(v["status"], "cancelled", "{v}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    wait_payloads(&marker, 0, 5);
    assert_eq!(pg.audited("run_start", "mcp-cancel"), "1");
}

/// `kill -9` of a worker mid-run: its payload is gone within seconds (the runner's lifeline),
/// the run becomes `unknown` once its lease expires (any node's sweeper), the expired lease is
/// counted, and another worker never runs it again.
#[test]
fn a_killed_worker_leaves_its_run_unknown_never_twice() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (d_api, d_w1, d_w2) = (tempdir(), tempdir(), tempdir());
    let marker = marker_for(&d_api, "kill");
    let cfg = config(&marker);
    let (_api_node, api) = api(d_api.path(), &pg, &cfg);
    let mut w1 = worker(d_w1.path(), &pg, &cfg, "w1");
    let body = json!({"request_id": "victim", "task": "sleeper", "inputs": [], "args": ["20"]});
    assert_eq!(api.run(ALICE, &body, "?wait=false").status(), 202);
    wait_status(&api, "victim", "running", 30);
    wait_payloads(&marker, 1, 20);
    w1.kill(); // SIGKILL
    wait_payloads(&marker, 0, 3);
    let w2 = worker(d_w2.path(), &pg, &cfg, "w2");
    let v = wait_status(&api, "victim", "unknown", 15);
    assert!(v["reason"].as_str().unwrap_or("").contains("lease"), "{v}");
    // The lease expired under a live worker: it must not take the run again.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(status_of(&api, "victim")["status"], "unknown");
    assert!(payloads(&marker).is_empty(), "the run executed again");
    assert!(w2.job_folders().is_empty(), "w2 started the killed run");
    assert_eq!(pg.audited("run_start", "victim"), "1");
    assert_eq!(pg.audited("run_unknown", "victim"), "1");
    assert!(metric(&api, "agentjail_cluster_expired_leases_total").unwrap_or(0.0) >= 1.0);
}

/// Fencing: a worker stopped (SIGSTOP) past its lease. Its runner, a process of its own, gets
/// no more renewals and kills its sandbox before the lease ends (issue #30, finding 2: before,
/// the payload slept on until the worker was continued); meanwhile the API replica's sweeper
/// marks the run `unknown`. Continued, the worker finds its lease gone, its late result is
/// refused by the fencing (in its log), and the run stays `unknown` with no `run_end`.
#[test]
fn a_worker_that_lost_its_lease_kills_its_sandbox_and_is_refused() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (d_api, d_w) = (tempdir(), tempdir());
    let marker = marker_for(&d_api, "fence");
    let cfg = config(&marker);
    let (_api_node, api) = api(d_api.path(), &pg, &cfg);
    let w = worker(d_w.path(), &pg, &cfg, "w-stopped");
    let body = json!({"request_id": "fenced", "task": "sleeper", "inputs": [], "args": ["25"]});
    assert_eq!(api.run(ALICE, &body, "?wait=false").status(), 202);
    wait_status(&api, "fenced", "running", 30);
    wait_payloads(&marker, 1, 20);
    let pid = w.pid().to_string();
    assert!(
        Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    // Lease 3 s: the runner's end is 0.5 s before it, by the last renewal sent.
    wait_payloads(&marker, 0, 4);
    let v = wait_status(&api, "fenced", "unknown", 15);
    assert!(v["reason"].as_str().unwrap_or("").contains("lease"), "{v}");
    assert!(
        Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !w.log().contains("the result was refused by fencing") {
        assert!(
            Instant::now() < deadline,
            "no fencing refusal in the worker's log:\n{}",
            w.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(w.log().contains("lease"), "{}", w.log());
    std::thread::sleep(Duration::from_secs(1));
    let v = status_of(&api, "fenced");
    assert_eq!(v["status"], "unknown", "{v}");
    assert!(
        v.get("report").is_none() && v.get("artifact").is_none(),
        "{v}"
    );
    assert_eq!(pg.audited("run_start", "fenced"), "1");
    assert_eq!(pg.audited("run_end", "fenced"), "0");
    // The worker lives on and takes new work.
    let body = json!({"request_id": "after", "task": "sleeper", "inputs": [], "args": ["0"]});
    assert_eq!(api.run(ALICE, &body, "?wait=false").status(), 202);
    assert_eq!(wait_final(&api, "after")["status"], "ok");
}

/// A claim given up before its start. A worker killed after it claimed a run and prepared its
/// job folder, but before the `running` mark (so nothing of the run ran), leaves the run claimed
/// by it and the folder on its disk; a worker whose lease ran out before the mark (PostgreSQL
/// down for longer than the lease) leaves the same. That state is set up here as such a kill
/// leaves it (the window is microseconds wide; fleet_topology.rs's PostgreSQL restart hit it
/// once: the run, claimed again by the same worker, found its old folder and ended
/// `setup_error`). Restarted, the worker gives the claim up; the run goes back on the queue under
/// a new job id, runs once, on that worker, and ends `ok`; the old folder is removed. A run
/// claimed by a node that never comes back is put back by the lease sweep, also under a new id.
#[test]
fn a_claim_given_up_before_its_start_runs_later_under_a_new_job_id() {
    use std::os::unix::fs::DirBuilderExt;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (d_api, d_w) = (tempdir(), tempdir());
    let cfg = config(&marker_for(&d_api, "reclaim"));
    let (_api_node, api) = api(d_api.path(), &pg, &cfg);
    for id in ["claimed-here", "claimed-by-the-gone"] {
        let body = json!({"request_id": id, "task": "sleeper", "inputs": [], "args": ["0"]});
        assert_eq!(api.run(ALICE, &body, "?wait=false").status(), 202);
    }
    let job_of = |id: &str| {
        pg.psql(&format!(
            "SELECT job_id FROM runs WHERE request_id = '{id}'"
        ))
    };
    let (here, gone) = (job_of("claimed-here"), job_of("claimed-by-the-gone"));
    assert!(
        here.starts_with("job_") && gone.starts_with("job_"),
        "{here} {gone}"
    );
    // What the killed worker w1 left: its claim (a fence, a lease still running) and the folder
    // it prepared; and a claim of a node that is gone for good, its lease expired.
    pg.psql("UPDATE runs SET owner = 'w1', node_id = 'w1', fence = nextval('run_fence'), lease_expires_at = now() + interval '1 hour' WHERE request_id = 'claimed-here'");
    pg.psql("UPDATE runs SET owner = 'gone', node_id = 'gone', fence = nextval('run_fence'), lease_expires_at = now() - interval '1 second' WHERE request_id = 'claimed-by-the-gone'");
    // The prepared job folder (0700); and what an earlier build (which wrote each run's code
    // to `DATA/code/<job id>`, 0644 in 0711) left there: the code files of this claim and of
    // one some other node's sweep gave up while w1 was down (its job id names no run any more).
    let data = d_w.path().join("data");
    let left = data.join("jobs").join(&here);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&left)
        .unwrap();
    std::fs::DirBuilder::new()
        .mode(0o711)
        .create(data.join("code"))
        .unwrap();
    for id in [&here, "job_0123456789abcdef0123456789abcdef"] {
        std::fs::write(data.join("code").join(id), "print('prepared, never run')\n").unwrap();
    }
    let w = worker(d_w.path(), &pg, &cfg, "w1");
    for id in ["claimed-here", "claimed-by-the-gone"] {
        let v = wait_final(&api, id);
        assert_eq!(v["status"], "ok", "{v}\n{}", w.log());
        assert_eq!(pg.audited("run_start", id), "1", "{id}");
        assert_eq!(pg.audited("run_end", id), "1", "{id}");
    }
    let (now_here, now_gone) = (job_of("claimed-here"), job_of("claimed-by-the-gone"));
    assert!(
        now_here != here && now_here.starts_with("job_") && now_here.len() == here.len(),
        "a new job id for the given-up claim: {here} -> {now_here}"
    );
    assert!(
        now_gone != gone && now_gone.starts_with("job_"),
        "a new job id for the expired claim: {gone} -> {now_gone}"
    );
    assert!(!left.exists(), "the given-up claim's folder is removed");
    assert!(
        !data.join("code").exists(),
        "an earlier build's code files are removed at start-up"
    );
    let mut folders = w.job_folders();
    folders.sort();
    let mut want = vec![now_here, now_gone];
    want.sort();
    assert_eq!(folders, want, "one folder per execution, under the new ids");
}

/// Labels: a run of a task type with `labels = ["gpu"]` waits in the queue while only a worker
/// without that label runs; a worker with `--labels gpu` claims it. SIGTERM to that worker
/// mid-run: it claims nothing more, finishes the run (`ok`), leaves `workers` and exits 0.
#[test]
fn labels_route_runs_and_sigterm_finishes_the_held_run() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (d_api, d_plain, d_gpu) = (tempdir(), tempdir(), tempdir());
    let marker = marker_for(&d_api, "labels");
    let gpu_task = sleeper_task(&marker, 30)
        .replace("[tasks.sleeper", "[tasks.gpu")
        .replace(
            "allowed_tenants = [\"acme\"]",
            "allowed_tenants = [\"acme\"]\nlabels = [\"gpu\"]",
        );
    let cfg = format!("{}\n{gpu_task}", config(&marker));
    let (_api_node, api) = api(d_api.path(), &pg, &cfg);
    let plain = worker(d_plain.path(), &pg, &cfg, "plain");
    let body = json!({"request_id": "needs-gpu", "task": "gpu", "inputs": [], "args": ["3"]});
    assert_eq!(api.run(ALICE, &body, "?wait=false").status(), 202);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(status_of(&api, "needs-gpu")["status"], "queued");
    assert!(plain.job_folders().is_empty());
    let (mut gpu, _) = Node::start(
        d_gpu.path(),
        &pg.url(),
        &cfg,
        &[
            "worker",
            "--slots",
            "1",
            "--node-id",
            "gpu-1",
            "--labels",
            "gpu",
        ],
        "claiming runs",
    );
    wait_status(&api, "needs-gpu", "running", 20);
    let pid = gpu.pid().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let exit = gpu.wait_exit(30);
    assert_eq!(exit.code(), Some(0), "{}", gpu.log());
    let v = status_of(&api, "needs-gpu");
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(gpu.job_folders().len(), 1);
    assert!(plain.job_folders().is_empty());
    assert_eq!(
        pg.psql("SELECT string_agg(node_id, ',' ORDER BY node_id) FROM workers WHERE slots > 0"),
        "plain",
        "the executors left (the API replica, without slots, is listed with 0)"
    );
}

/// A TCP relay between a worker and PostgreSQL whose link can be cut: while cut, it forwards
/// nothing in either direction and holds new connections (packets dropped, as when a network
/// link goes down, not refused); restored, it forwards what was held.
struct Link {
    port: u16,
    cut: Arc<std::sync::atomic::AtomicBool>,
}

impl Link {
    fn new(upstream_port: u16) -> Link {
        use std::sync::atomic::{AtomicBool, Ordering};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let c2 = cut.clone();
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(down) = conn else { continue };
                let cut = c2.clone();
                std::thread::spawn(move || {
                    while cut.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    let Ok(up) = std::net::TcpStream::connect(("127.0.0.1", upstream_port)) else {
                        return;
                    };
                    let pump = |mut from: std::net::TcpStream,
                                mut to: std::net::TcpStream,
                                cut: Arc<AtomicBool>| {
                        use std::io::{Read, Write};
                        let mut buf = [0u8; 16384];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            while cut.load(Ordering::SeqCst) {
                                std::thread::sleep(Duration::from_millis(50));
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    };
                    let (d2, u2) = (down.try_clone().unwrap(), up.try_clone().unwrap());
                    let c3 = cut.clone();
                    let t = std::thread::spawn(move || pump(d2, u2, c3));
                    pump(up, down, cut);
                    let _ = t.join();
                });
            }
        });
        Link { port, cut }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.store(cut, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Fencing, by cutting the link: a worker reaches PostgreSQL through a link that is cut
/// mid-run. With no database, the worker kills its sandbox by its own clock once its lease
/// ends; the API replica marks the run `unknown`; when the link is back, the worker's late
/// result is refused by the fencing and the run stays `unknown`.
#[test]
fn a_worker_cut_off_from_the_database_kills_its_sandbox_and_is_refused() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (d_api, d_w) = (tempdir(), tempdir());
    let marker = marker_for(&d_api, "cut");
    let cfg = config(&marker);
    let (_api_node, api) = api(d_api.path(), &pg, &cfg);
    let port = pg
        .url()
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap()
        .parse::<u16>()
        .unwrap();
    let link = Link::new(port);
    let url = pg
        .url()
        .replace(&format!(":{port}/"), &format!(":{}/", link.port));
    let (w, _) = Node::start(
        d_w.path(),
        &url,
        &cfg,
        &["worker", "--slots", "1", "--node-id", "w-cut"],
        "claiming runs",
    );
    let body = json!({"request_id": "cut", "task": "sleeper", "inputs": [], "args": ["25"]});
    assert_eq!(api.run(ALICE, &body, "?wait=false").status(), 202);
    wait_status(&api, "cut", "running", 30);
    wait_payloads(&marker, 1, 20);
    link.set_cut(true);
    // Lease 3 s, renewed every second: the sandbox is gone within about 3 s, without any
    // answer from the database (its runner ends it half a second before the lease's end, the
    // worker's own clock then kills what is left).
    wait_payloads(&marker, 0, 8);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !w.log().contains("killing the sandbox") {
        assert!(Instant::now() < deadline, "{}", w.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let v = wait_status(&api, "cut", "unknown", 15);
    assert!(v["reason"].as_str().unwrap_or("").contains("lease"), "{v}");
    link.set_cut(false);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !w.log().contains("the result was refused by fencing") {
        assert!(
            Instant::now() < deadline,
            "no fencing refusal in the worker's log:\n{}",
            w.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let v = status_of(&api, "cut");
    assert_eq!(v["status"], "unknown", "{v}");
    assert_eq!(pg.audited("run_start", "cut"), "1");
    assert_eq!(pg.audited("run_end", "cut"), "0");
}

/// The text of a plain GET (no token) and its status and content type.
fn get_plain(base: &str, path: &str) -> (u16, String, String) {
    let r = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
        .get(format!("{base}{path}"))
        .send()
        .unwrap();
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or_default().to_string())
        .unwrap_or_default();
    (status, ct, r.text().unwrap())
}

/// One series' value in a Prometheus text body (`name` with its labels, as rendered).
fn series(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.rsplit_once(' ').map(|(k, _)| k) == Some(name))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
}

fn wait_health(base: &str, want: u16, secs: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let (s, _, body) = get_plain(base, "/healthz");
        if s == want {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/healthz never answered {want} (last {s}: {body})"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `worker --listen`: its own `/metrics` (every family at zero from start-up, then the run it
/// executed counted, its slot busy while it runs, its heartbeats), `/healthz` and `/readyz`
/// (200 while it reaches PostgreSQL and its heartbeat is fresh; 503 with a one-line reason
/// once PostgreSQL is stopped; 200 again after PostgreSQL is back), and nothing else (404).
#[test]
fn a_worker_serves_its_metrics_and_health() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (d_api, d_w) = (tempdir(), tempdir());
    let cfg = config(&marker_for(&d_api, "probe"));
    let (_api_node, api) = api(d_api.path(), &pg, &cfg);
    let (w, line) = Node::start(
        d_w.path(),
        &pg.url(),
        &cfg,
        &[
            "worker",
            "--slots",
            "1",
            "--node-id",
            "w-probe",
            "--listen",
            "127.0.0.1:0",
        ],
        "probes on http://",
    );
    let base = format!(
        "http://{}",
        line.split("probes on http://")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
    );
    let (s, ct, text) = get_plain(&base, "/metrics");
    assert_eq!(s, 200, "{text}");
    assert!(ct.starts_with("text/plain"), "{ct}");
    for (name, want) in [
        (r#"agentjail_runs_total{task="sleeper",status="ok"}"#, 0.0),
        ("agentjail_runs_in_flight", 0.0),
        ("agentjail_worker_slots_busy", 0.0),
        ("agentjail_worker_slots_free", 1.0),
        (
            r#"agentjail_heartbeats_total{kind="node",result="failed"}"#,
            0.0,
        ),
        (
            r#"agentjail_heartbeats_total{kind="lease",result="ok"}"#,
            0.0,
        ),
        (
            r#"agentjail_heartbeats_total{kind="lease",result="failed"}"#,
            0.0,
        ),
        (
            r#"agentjail_heartbeats_total{kind="lease",result="refused"}"#,
            0.0,
        ),
        ("agentjail_fenced_writes_total", 0.0),
        ("agentjail_unknown_outcomes_total", 0.0),
        ("agentjail_cluster_expired_leases_total", 0.0),
    ] {
        assert_eq!(
            series(&text, name),
            Some(want),
            "{name} at start-up:\n{text}"
        );
    }
    for g in [
        "agentjail_cluster_queue_depth",
        "agentjail_cluster_oldest_queued_seconds",
        "agentjail_cluster_live_workers",
    ] {
        assert!(
            series(&text, g).is_some(),
            "{g} missing at start-up:\n{text}"
        );
    }
    let body = wait_health(&base, 200, 20);
    assert!(body.contains("ok"), "{body}");
    assert_eq!(get_plain(&base, "/readyz").0, 200);
    let (s, ct, body) = get_plain(&base, "/v1/runs/x");
    assert_eq!(s, 404, "{body}");
    assert_eq!(ct, "application/problem+json", "{body}");

    // One run (3 s): the slot is busy while it runs, then it is counted.
    let b = json!({"request_id": "probe-1", "task": "sleeper", "inputs": [], "args": ["3"]});
    assert_eq!(api.run(ALICE, &b, "?wait=false").status(), 202);
    wait_status(&api, "probe-1", "running", 60);
    let text = get_plain(&base, "/metrics").2;
    assert_eq!(
        series(&text, "agentjail_worker_slots_busy"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        series(&text, "agentjail_worker_slots_free"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(wait_final(&api, "probe-1")["status"], "ok");
    let text = get_plain(&base, "/metrics").2;
    assert_eq!(
        series(&text, r#"agentjail_runs_total{task="sleeper",status="ok"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        series(
            &text,
            r#"agentjail_run_duration_seconds_count{task="sleeper"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        series(&text, "agentjail_worker_slots_busy"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        series(&text, "agentjail_worker_slots_free"),
        Some(1.0),
        "{text}"
    );
    assert!(
        series(
            &text,
            r#"agentjail_heartbeats_total{kind="node",result="ok"}"#
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{text}"
    );
    assert!(
        series(
            &text,
            r#"agentjail_heartbeats_total{kind="lease",result="ok"}"#
        )
        .unwrap_or(0.0)
            >= 1.0,
        "a 3 s run under a 3 s lease renews it:\n{text}"
    );

    // PostgreSQL stopped: unhealthy with a reason; back: healthy again.
    pg.stop();
    let body = wait_health(&base, 503, 30);
    assert_eq!(body.trim().lines().count(), 1, "one line: {body:?}");
    assert!(body.contains("database"), "{body}");
    assert_eq!(get_plain(&base, "/readyz").0, 503);
    // The database stays down until the worker's next heartbeat has come and failed (the
    // health check can notice the outage before a heartbeat is due).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = get_plain(&base, "/metrics").2;
        let failed = series(
            &text,
            r#"agentjail_heartbeats_total{kind="node",result="failed"}"#,
        )
        .unwrap_or(0.0);
        if failed >= 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no heartbeat was counted failed while PostgreSQL was stopped:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    pg.start_again();
    wait_health(&base, 200, 60);
    assert_eq!(get_plain(&base, "/readyz").0, 200);

    // SIGTERM while a run is held: not ready (draining), still healthy and answering, the
    // run finishes `ok`, the worker exits 0.
    let mut w = w;
    let b = json!({"request_id": "probe-2", "task": "sleeper", "inputs": [], "args": ["6"]});
    assert_eq!(api.run(ALICE, &b, "?wait=false").status(), 202);
    wait_status(&api, "probe-2", "running", 60);
    let pid = w.pid().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let drained = loop {
        let (s, _, body) = get_plain(&base, "/readyz");
        if s == 503 {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never turned 503 after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(drained.contains("draining"), "{drained}");
    assert_eq!(
        get_plain(&base, "/healthz").0,
        200,
        "healthy while draining"
    );
    // The store says so too (the console's Fleet page reads it), and the worker's heartbeat
    // goes on while it finishes the run it holds.
    let row = || {
        pg.psql(
            "SELECT draining, (extract(epoch FROM heartbeat_at) * 1000)::bigint FROM workers WHERE node_id = 'w-probe'",
        )
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let first = loop {
        let r = row();
        if r.starts_with('t') {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "never recorded as draining: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let beat = |r: &str| -> i64 { r.split('|').nth(1).unwrap().trim().parse().unwrap() };
    let deadline = Instant::now() + Duration::from_secs(4);
    loop {
        let r = row();
        if r.starts_with('t') && beat(&r) > beat(&first) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no heartbeat while draining: {first:?} then {r:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        status_of(&api, "probe-2")["status"],
        "running",
        "still held"
    );
    assert_eq!(wait_final(&api, "probe-2")["status"], "ok");
    let exit = w.wait_exit(30);
    assert_eq!(exit.code(), Some(0), "{}", w.log());
}

/// [`config`] with its own node id (two replicas must not share one).
fn config_node(marker: &str, node: &str) -> String {
    config(marker).replace("node_id = \"api\"", &format!("node_id = \"{node}\""))
}

/// Sends `signal` (`STOP`, `CONT`) to a node this test started (its `Child`, not yet reaped:
/// the pid is still that process's).
fn signal(node: &Node, signal: &str) {
    assert!(
        Command::new("kill")
            .args([&format!("-{signal}"), &node.pid().to_string()])
            .status()
            .unwrap()
            .success()
    );
}

/// One request, timed, by a client that gives up after 20 s: (elapsed, HTTP status or 0).
fn timed(
    f: impl FnOnce(&reqwest::blocking::Client) -> reqwest::Result<reqwest::blocking::Response>,
) -> (Duration, u16) {
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let t = Instant::now();
    let s = f(&http).map(|r| r.status().as_u16()).unwrap_or(0);
    (t.elapsed(), s)
}

/// Issue 30, finding 1: a node stopped (SIGSTOP) in the middle of an audit append, its
/// transaction left open, stalls no other node. The append is made to wait (a trigger holds
/// the insert of that one record on an advisory lock the test holds) so that the node is
/// stopped *while* it appends, then the hold is released: the stopped node's transaction is
/// open, holding whatever an append holds. Meanwhile a submission on another replica and GETs
/// on a third node must each be answered within [`STALL_BOUND`]; first with a worker stopped,
/// then with a replica stopped (a healthy worker's run in flight meanwhile ends `ok`). Every
/// run has its `run_accepted`, and `audit verify` passes.
#[test]
fn a_node_stopped_mid_audit_append_stalls_no_other_node() {
    /// The most a submission or a GET may wait for a stopped node (measured: see the log).
    const STALL_BOUND: Duration = Duration::from_secs(2);
    const HOLD: i64 = 4243;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (d_a, d_b, d_w) = (tempdir(), tempdir(), tempdir());
    let marker = marker_for(&d_a, "stall");
    let (a_node, api_a) = api(d_a.path(), &pg, &config_node(&marker, "api-a"));
    let (_b_node, api_b) = api(d_b.path(), &pg, &config_node(&marker, "api-b"));
    let w = worker(d_w.path(), &pg, &config_node(&marker, "w"), "w-stop");
    let mut measured = Vec::new();
    // A run not final yet is answered 202, a final one 200.
    let mut check = |what: &str, (t, s): (Duration, u16), want: &[u16]| {
        eprintln!("{what}: {s} after {t:?}");
        measured.push((what.to_string(), t));
        assert!(
            want.contains(&s) && t <= STALL_BOUND,
            "{what}: answered {s} after {t:?} (bound {STALL_BOUND:?}) while a node is stopped mid-append"
        );
    };
    let sleeper = |id: &str, secs: &str| json!({"request_id": id, "task": "sleeper", "inputs": [], "args": [secs]});

    // 1. The worker, stopped while it appends its run's `run_start`.
    pg.hold_audit_insert("hold_w", "run_start", "stall-w", HOLD);
    let lock = pg.hold_advisory_lock(HOLD);
    assert_eq!(
        api_a
            .run(ALICE, &sleeper("stall-w", "1"), "?wait=false")
            .status(),
        202
    );
    pg.wait_advisory_waiter(HOLD, "the worker's run_start", || true);
    signal(&w, "STOP");
    drop(lock);
    std::thread::sleep(Duration::from_millis(300)); // its insert is through; its commit is not
    let u = api_b.url("/v1/runs?wait=false");
    check(
        "submission on api-b, worker stopped",
        timed(|h| {
            h.post(&u)
                .bearer_auth(ALICE)
                .json(&sleeper("other-1", "0"))
                .send()
        }),
        &[202],
    );
    let u = api_a.url("/v1/runs/stall-w");
    check(
        "GET on api-a, worker stopped",
        timed(|h| h.get(&u).bearer_auth(ALICE).send()),
        &[200, 202],
    );
    // The stopped worker's open transaction is ended by the database, not left to hold.
    let t = Instant::now();
    while pg.psql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'agentjail' AND state LIKE 'idle in transaction%'") != "0" {
        assert!(t.elapsed() < Duration::from_secs(15), "a stopped node's transaction stays open");
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "the stopped worker's open transaction was ended after {:?} more",
        t.elapsed()
    );
    signal(&w, "CONT");
    assert_eq!(wait_final(&api_a, "other-1")["status"], "ok");

    // 2. A replica, stopped while it appends a run's `run_accepted`; a healthy worker's run
    // is in flight meanwhile.
    assert_eq!(
        api_b
            .run(ALICE, &sleeper("busy", "3"), "?wait=false")
            .status(),
        202
    );
    wait_status(&api_b, "busy", "running", 30);
    pg.hold_audit_insert("hold_r", "run_accepted", "stall-r", HOLD);
    let lock = pg.hold_advisory_lock(HOLD);
    let (http, u) = (api_a.http.clone(), api_a.url("/v1/runs?wait=false"));
    let body = sleeper("stall-r", "0");
    let stalled = std::thread::spawn(move || {
        http.post(u)
            .bearer_auth(ALICE)
            .json(&body)
            .send()
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
    });
    pg.wait_advisory_waiter(HOLD, "the replica's run_accepted", || true);
    signal(&a_node, "STOP");
    drop(lock);
    std::thread::sleep(Duration::from_millis(300));
    let u = api_b.url("/v1/runs?wait=false");
    check(
        "submission on api-b, replica stopped",
        timed(|h| {
            h.post(&u)
                .bearer_auth(ALICE)
                .json(&sleeper("other-2", "0"))
                .send()
        }),
        &[202],
    );
    let u = api_b.url("/v1/runs/busy");
    check(
        "GET on api-b, replica stopped",
        timed(|h| h.get(&u).bearer_auth(ALICE).send()),
        &[200, 202],
    );
    assert_eq!(
        wait_final(&api_b, "busy")["status"],
        "ok",
        "a healthy worker's run"
    );
    assert_eq!(wait_final(&api_b, "other-2")["status"], "ok");
    signal(&a_node, "CONT");
    let s = stalled.join().unwrap();
    if s != 202 {
        // The stopped replica's transaction was ended under it: nothing of it was recorded,
        // and the client resends.
        assert_eq!(
            api_b
                .run(ALICE, &sleeper("stall-r", "0"), "?wait=false")
                .status(),
            202,
            "first answer {s}"
        );
    }
    for id in ["stall-w", "other-1", "busy", "stall-r", "other-2"] {
        let v = wait_final(&api_b, id);
        assert_eq!(pg.audited("run_accepted", id), "1", "{id}");
        // stall-w's worker was stopped past its lease: `unknown`, and audited as such.
        let end = if v["status"] == "unknown" {
            "run_unknown"
        } else {
            "run_end"
        };
        assert!(v["status"] == "ok" || id == "stall-w", "{id}: {v}");
        assert_eq!(pg.audited(end, id), "1", "{id}: {v}");
    }
    let o: common::Out = Command::new(common::bin())
        .args(["audit", "verify", "--database", &pg.url()])
        .env("PGPASSWORD", pg::PASSWORD)
        .output()
        .unwrap()
        .into();
    assert_eq!(o.code, 0, "{}", o.dump());
    eprintln!("stall bound {STALL_BOUND:?}; measured {measured:?}");
}

/// Issue 30, finding 3: a second process with a live node's id is refused at start (exit 125,
/// naming the fix), before it touches anything: the first's run is not marked `unknown` by the
/// second's start-up and ends `ok`. The same for `serve`. Once the first stops, its id is free.
#[test]
fn a_live_node_id_is_refused_at_start() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (d_api, d_w1, d_w2, d_s) = (tempdir(), tempdir(), tempdir(), tempdir());
    let marker = marker_for(&d_api, "dup");
    let cfg = config(&marker);
    let (_api_node, api) = api(d_api.path(), &pg, &cfg);
    let mut w1 = worker(d_w1.path(), &pg, &cfg, "w1");
    let body = json!({"request_id": "first", "task": "sleeper", "inputs": [], "args": ["3"]});
    assert_eq!(api.run(ALICE, &body, "?wait=false").status(), 202);
    wait_status(&api, "first", "running", 30);
    for args in [
        &["worker", "--slots", "1", "--node-id", "w1"][..],
        &["serve", "--listen", "127.0.0.1:0", "--slots", "0"][..],
    ] {
        let dir = if args[0] == "worker" { &d_w2 } else { &d_s };
        let cfg = if args[0] == "worker" {
            cfg.clone()
        } else {
            config_node(&marker, "w1")
        };
        let (mut dup, ready) = Node::spawn(dir.path(), &pg.url(), &cfg, args, "agentjail");
        let code = dup.wait_exit(20).code();
        let log = dup.log();
        assert_eq!(code, Some(125), "{args:?}: {ready:?}\n{log}");
        assert!(
            log.contains("node id w1 is in use") && log.contains("--node-id"),
            "{args:?}: the refusal names the fix:\n{log}"
        );
    }
    let v = wait_final(&api, "first");
    assert_eq!(v["status"], "ok", "the first worker's run: {v}");
    assert_eq!(pg.audited("run_unknown", "first"), "0");
    // Stopped, the first frees its id.
    w1.kill();
    let _w = worker(d_w2.path(), &pg, &cfg, "w1");
}

/// Issue 30, finding 4: a replica killed between recording a new run and appending its
/// `run_accepted` leaves neither: the insert and its record commit in one transaction. The
/// append is held (a trigger waits on a lock the test holds) and the replica is SIGKILLed while
/// it waits. The client resends to the other replica: the run is accepted there, runs once,
/// and its trail is `run_accepted`, `run_start`, `run_end`.
#[test]
fn a_replica_killed_between_insert_and_audit_leaves_neither() {
    const HOLD: i64 = 4244;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (d_a, d_b, d_w) = (tempdir(), tempdir(), tempdir());
    let marker = marker_for(&d_a, "acc");
    let (mut a_node, api_a) = api(d_a.path(), &pg, &config_node(&marker, "api-a"));
    let (_b_node, api_b) = api(d_b.path(), &pg, &config_node(&marker, "api-b"));
    let _w = worker(d_w.path(), &pg, &config_node(&marker, "w"), "w1");
    pg.hold_audit_insert("hold_acc", "run_accepted", "acc-1", HOLD);
    let lock = pg.hold_advisory_lock(HOLD);
    let body = json!({"request_id": "acc-1", "task": "sleeper", "inputs": [], "args": ["0"]});
    let (http, u, b2) = (
        api_a.http.clone(),
        api_a.url("/v1/runs?wait=false"),
        body.clone(),
    );
    let call = std::thread::spawn(move || {
        let _ = http.post(u).bearer_auth(ALICE).json(&b2).send();
    });
    pg.wait_advisory_waiter(HOLD, "api-a's run_accepted", || true);
    a_node.kill(); // SIGKILL while its append waits
    drop(lock);
    let _ = call.join();
    // The killed replica's session ends once its held insert is through.
    std::thread::sleep(Duration::from_secs(2));
    let seen = (
        pg.psql("SELECT count(*) FROM runs WHERE request_id = 'acc-1'"),
        pg.audited("run_accepted", "acc-1"),
    );
    assert!(
        seen == ("0".into(), "0".into()) || seen == ("1".into(), "1".into()),
        "(runs, run_accepted records) = {seen:?}: a run was recorded without its run_accepted"
    );
    assert_eq!(api_b.run(ALICE, &body, "?wait=false").status(), 202);
    assert_eq!(wait_final(&api_b, "acc-1")["status"], "ok");
    for ev in ["run_accepted", "run_start", "run_end"] {
        assert_eq!(pg.audited(ev, "acc-1"), "1", "{ev}");
    }
}

/// Issue 30, finding 6: a run is recorded started only if its payload can still start. Every
/// write of a claimed run is held in the database (a trigger waits on a lock the test holds:
/// the `running` mark and the lease renewals alike) for longer than the lease, so the worker's
/// own deadline passes and it gives the claim up. Released, the mark must not commit a start
/// the worker can no longer run (on the old code: a `run_start` with no payload, status
/// `unknown`). The claim is given back, the run is claimed again and ends `ok`, with one
/// `run_start` and one `run_end`.
#[test]
fn a_running_mark_that_outlived_the_lease_records_no_start() {
    const HOLD: i64 = 4245;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (d_api, d_w) = (tempdir(), tempdir());
    let marker = marker_for(&d_api, "slow");
    let cfg = config(&marker);
    let (_api_node, api) = api(d_api.path(), &pg, &cfg);
    let w = worker(d_w.path(), &pg, &cfg, "w1");
    pg.psql(&format!(
        "CREATE FUNCTION hold_slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF OLD.request_id = 'slow-1' AND OLD.owner IS NOT NULL THEN PERFORM pg_advisory_xact_lock({HOLD}); END IF; RETURN NEW; END $$; CREATE TRIGGER hold_slow BEFORE UPDATE ON runs FOR EACH ROW EXECUTE FUNCTION hold_slow()"
    ));
    let lock = pg.hold_advisory_lock(HOLD);
    let body = json!({"request_id": "slow-1", "task": "sleeper", "inputs": [], "args": ["0"]});
    assert_eq!(api.run(ALICE, &body, "?wait=false").status(), 202);
    pg.wait_advisory_waiter(HOLD, "the running mark", || true);
    // Past the 3 s lease by the worker's clock, within the 5 s lock_timeout.
    std::thread::sleep(Duration::from_millis(4200));
    drop(lock);
    let v = wait_final(&api, "slow-1");
    assert_eq!(v["status"], "ok", "{v}\n{}", w.log());
    assert_eq!(
        pg.audited("run_start", "slow-1"),
        "1",
        "a start was recorded twice"
    );
    assert_eq!(pg.audited("run_end", "slow-1"), "1");
    assert_eq!(pg.audited("run_unknown", "slow-1"), "0");
}

/// Issue 30, finding 7: job expiry is decided by the database's clock, as leases are. A worker
/// whose wall clock is 400 s ahead (more than `job_ttl_seconds`, 300; a fault-injection hook
/// of debug builds, `AGENTJAIL_TEST_CLOCK_SKEW_SECONDS`, shifts the server's wall clock) runs
/// a fresh run `ok`; on the old code it ended every run `expired` (the replica's clock + 300 s
/// checked against the worker's).
#[test]
fn a_worker_with_a_clock_ahead_does_not_expire_fresh_runs() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (d_api, d_w) = (tempdir(), tempdir());
    let marker = marker_for(&d_api, "skew");
    let cfg = config(&marker);
    let (_api_node, api) = api(d_api.path(), &pg, &cfg);
    let wrap = [
        "env".to_string(),
        "AGENTJAIL_TEST_CLOCK_SKEW_SECONDS=400".to_string(),
    ];
    let (w, _) = Node::start_on(
        &wrap,
        d_w.path(),
        &pg.url(),
        &cfg,
        &["worker", "--slots", "1", "--node-id", "w-ahead"],
        "claiming runs",
    );
    let body = json!({"request_id": "skew-1", "task": "sleeper", "inputs": [], "args": ["0"]});
    assert_eq!(api.run(ALICE, &body, "?wait=false").status(), 202);
    let v = wait_final(&api, "skew-1");
    assert_eq!(v["status"], "ok", "{v}\n{}", w.log());
}

/// Issue 30, finding 5: of two concurrent retries of one `unknown` run (one per replica), one
/// wins; the other is told the truth: `409` naming the winner's decision, and its refusal is
/// audited. The first retry is held between its change and its record (a trigger), the second
/// is sent meanwhile (it waits on the run's row), then the first is let through.
#[test]
fn the_losing_one_of_two_concurrent_retries_gets_409() {
    const HOLD: i64 = 4246;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pg) = Pg::start() else { return };
    let (d_a, d_b) = (tempdir(), tempdir());
    let marker = marker_for(&d_a, "race");
    let (_a, api_a) = api(d_a.path(), &pg, &config_node(&marker, "api-a"));
    let (_b, api_b) = api(d_b.path(), &pg, &config_node(&marker, "api-b"));
    let body = json!({"request_id": "race-1", "task": "sleeper", "inputs": [], "args": ["0"]});
    assert_eq!(api_a.run(ALICE, &body, "?wait=false").status(), 202);
    // No worker: as a lost executor leaves it.
    pg.psql("UPDATE runs SET status = 'unknown', reason = 'test', spec = NULL WHERE request_id = 'race-1'");
    pg.hold_audit_insert("hold_rec", "reconcile", "race-1", HOLD);
    let lock = pg.hold_advisory_lock(HOLD);
    let retry = |api: &Api| {
        let (http, u) = (api.http.clone(), api.url("/v1/runs/race-1/reconcile"));
        std::thread::spawn(move || {
            let r = http
                .post(u)
                .bearer_auth(ALICE)
                .json(&json!({"action": "retry"}))
                .send()
                .unwrap();
            (r.status().as_u16(), r.text().unwrap())
        })
    };
    let first = retry(&api_a);
    pg.wait_advisory_waiter(HOLD, "the first retry's record", || true);
    let second = retry(&api_b);
    std::thread::sleep(Duration::from_millis(500)); // it waits on the run's row
    drop(lock);
    let (first, second) = (first.join().unwrap(), second.join().unwrap());
    let job = pg.psql("SELECT job_id FROM runs WHERE request_id = 'race-1'");
    assert!(first.0 < 300, "the first retry: {first:?}");
    assert_eq!(
        second.0, 409,
        "the second retry was told it succeeded: {second:?}"
    );
    assert!(
        second.1.contains("retried") && second.1.contains(&job),
        "the 409 names the winner's decision: {second:?}"
    );
    assert_eq!(
        pg.psql("SELECT count(*) FROM audit_log WHERE record::jsonb->>'event' = 'reconcile' AND record::jsonb->>'request_id' = 'race-1' AND record::jsonb->>'decision' = 'deny'"),
        "1",
        "the refusal is audited"
    );
    assert_eq!(pg.audited("reconcile", "race-1"), "2");
}
