//! `agentjail serve` end to end over real HTTP on 127.0.0.1: the test starts the binary with a
//! test configuration and a temporary data directory, and drives it with a blocking HTTP client.
//! Covers the seed's `summarize_csv` with model-proposed code, execute-once (replay and
//! conflict), authentication, tenant isolation, policy denials, refusal of smuggled fields,
//! timeout, output rejection, async runs, metrics, OpenAPI, the audit chain, overload (429) and
//! the crash/restart reconciliation (`unknown`, then an operator's `abandon`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::serve::{Api, actor, fixed_task, sleeper_task};
use common::serve::{
    Serve, csv_input, example_schema, json_output, python_code_task, sha256_hex,
    summarize_csv_task, write_config,
};

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::blocking::Response;
use serde_json::{Value, json};

const ALICE: &str = "tok-alice-7c1f0e";
const BOB: &str = "tok-bob-91aa2d";
const GINA: &str = "tok-gina-55e0b3";
const CSV: &str = "region,units\nnorth,12\nsouth,7\nzz-secret-marker-row,3\n";
const CODE: &str = include_str!("../../../examples/csv-summary/summarize.py");

fn config(extra_server: &str) -> String {
    format!(
        r#"
[server]
{extra_server}

[tenants.acme]
[tenants.globex]

{alice}{bob}{gina}{summarize}{slow}{line_count}{line_input}{line_output}schema = {{ type = "object", required = ["lines"] }}
"#,
        alice = actor("alice", "acme", ALICE, true),
        bob = actor("bob", "acme", BOB, false),
        gina = actor("gina", "globex", GINA, false),
        line_count = fixed_task(
            "line_count",
            "Fixed program: count lines",
            r#"["/usr/bin/python3", "-c", "import json; json.dump({'lines': sum(1 for _ in open('/input/data.csv'))}, open('/output/count.json', 'w'))"]"#,
            r#"allowed_tenants = ["acme"]"#,
        ),
        summarize = summarize_csv_task(
            r#"allowed_actors = ["alice", "gina"]"#,
            100_000,
            &example_schema(),
            "seconds = 2\nmemory_mb = 256\nprocesses = 16\noutput_mb = 1",
        ),
        slow = python_code_task("slow", "Sleeps", r#"allowed_tenants = ["acme"]"#, 3),
        line_input = csv_input("line_count", 100_000),
        line_output = json_output("line_count", "count.json", 1000),
    )
}

struct Server {
    serve: Serve,
    api: Api,
    stderr: Arc<Mutex<String>>,
}

impl std::ops::Deref for Server {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

impl Server {
    fn start(dir: &Path, extra_server: &str) -> Server {
        Server::start_with(dir, extra_server, "")
    }

    /// As [`Server::start`], with more tables (tasks) appended to the configuration.
    fn start_with(dir: &Path, extra_server: &str, extra_tables: &str) -> Server {
        let cfg = write_config(dir, &(config(extra_server) + extra_tables));
        let serve = Serve::start(&cfg, &dir.join("data"), &[("AGENTJAIL_LOG", "info")]);
        Server {
            api: Api::new(&serve.base),
            stderr: serve.log.clone(),
            serve,
        }
    }

    fn kill(&mut self) {
        self.serve.kill();
    }
}

fn problem(r: Response, status: u16, slug: &str) -> Value {
    assert_eq!(r.status().as_u16(), status);
    assert_eq!(
        r.headers()["content-type"].to_str().unwrap(),
        "application/problem+json"
    );
    let v: Value = r.json().unwrap();
    assert_eq!(
        v["type"],
        format!("https://agentjail.dev/problems/{slug}"),
        "{v}"
    );
    assert_eq!(v["status"], status);
    v
}

fn audit(dir: &Path) -> (PathBuf, String) {
    let p = dir.join("data/private/audit.jsonl");
    let t = std::fs::read_to_string(&p).unwrap();
    (p, t)
}

#[test]
fn serve_end_to_end() {
    let dir = common::tmp();
    // Authentication failures after the first are aggregated; a window longer than the test
    // keeps the flusher from appending while the log is compared with its chain.
    let s = Server::start(dir.path(), "auth_failure_audit_seconds = 3600");

    // Health, OpenAPI, catalogue.
    assert_eq!(s.http.get(s.url("/healthz")).send().unwrap().status(), 200);
    let doc: Value = s
        .http
        .get(s.url("/openapi.json"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    for p in [
        "/v1/inputs",
        "/v1/runs",
        "/v1/runs/{request_id}",
        "/v1/runs/{request_id}/artifact",
        "/v1/runs/{request_id}/receipt",
        "/v1/runs/{request_id}/reconcile",
        "/v1/tasks",
        "/healthz",
        "/metrics",
    ] {
        assert!(doc["paths"][p].is_object(), "openapi lacks {p}");
    }
    let tasks: Value = s.get(BOB, "/v1/tasks").json().unwrap();
    let names: Vec<&str> = tasks["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["line_count", "slow"],
        "bob may not use summarize_csv"
    );

    // Authentication.
    problem(
        s.http.get(s.url("/v1/tasks")).send().unwrap(),
        401,
        "unauthorized",
    );
    let wrong = problem(s.get("tok-wrong", "/v1/tasks"), 401, "unauthorized");
    let missing = problem(
        s.http.get(s.url("/v1/runs/x")).send().unwrap(),
        401,
        "unauthorized",
    );
    assert_eq!(wrong, missing);
    // The hash is not a token.
    problem(s.get(&sha256_hex(ALICE), "/v1/tasks"), 401, "unauthorized");

    // The seed's task: upload, run model-proposed code, get the verified artifact.
    let input = s.upload(ALICE, CSV, "text/csv");
    let id = input["input_id"].as_str().unwrap().to_string();
    assert_eq!(input["bytes"], CSV.len());
    assert_eq!(input["sha256"], format!("sha256:{}", sha256_hex(CSV)));
    let req = json!({"request_id": "req-1", "task": "summarize_csv", "inputs": [id], "code": CODE});
    let r = s.run(ALICE, &req, "");
    assert_eq!(r.status(), 200);
    let first: Value = r.json().unwrap();
    assert_eq!(first["status"], "ok", "{first}");
    assert_eq!(first["artifact"]["json"]["rows"], 3);
    assert_eq!(first["artifact"]["media_type"], "application/json");
    assert_eq!(first["report"]["status"], "ok");
    assert!(first["receipt"]["signatures"].is_array());
    assert!(first["job_id"].as_str().unwrap().starts_with("job_"));
    let art = s.get(ALICE, "/v1/runs/req-1/artifact");
    assert_eq!(art.status(), 200);
    assert_eq!(art.headers()["content-type"], "application/json");
    let art: Value = art.json().unwrap();
    assert_eq!(art, first["artifact"]["json"]);
    let receipt: Value = s.get(ALICE, "/v1/runs/req-1/receipt").json().unwrap();
    assert_eq!(receipt, first["receipt"]);

    // Execute once: the same request again is the recorded run, not a second execution.
    let again: Value = s.run(ALICE, &req, "").json().unwrap();
    assert_eq!(again, first);
    let (_, log) = audit(dir.path());
    let starts = log
        .lines()
        .filter(|l| l.contains("\"run_start\"") && l.contains("\"req-1\""))
        .count();
    assert_eq!(starts, 1, "req-1 ran more than once");
    // Same request_id, different body: refused.
    let mut other = req.clone();
    other["code"] = json!("print('different')");
    problem(s.run(ALICE, &other, ""), 409, "request-id-conflict");

    // Policy: bob (same tenant) may not use summarize_csv.
    let mut bobs = req.clone();
    bobs["request_id"] = json!("bob-1");
    problem(s.run(BOB, &bobs, ""), 403, "forbidden");
    // A fixed-program task refuses code, and runs without it.
    let fixed = json!({"request_id": "fixed-1", "task": "line_count", "inputs": [id]});
    let mut with_code = fixed.clone();
    with_code["code"] = json!("import os");
    problem(s.run(BOB, &with_code, ""), 403, "forbidden");
    let v: Value = s.run(BOB, &fixed, "").json().unwrap();
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["artifact"]["json"]["lines"], 4);
    assert_eq!(v["actor"], "bob");

    // Tenant isolation: gina (globex) using acme's input id = a missing id, same body.
    let mut ginas = req.clone();
    ginas["request_id"] = json!("g-1");
    let cross = problem(s.run(GINA, &ginas, ""), 404, "not-found");
    ginas["inputs"] = json!(["in_00000000000000000000000000000000"]);
    let absent = problem(s.run(GINA, &ginas, ""), 404, "not-found");
    assert_eq!(cross, absent);
    // And acme's run is invisible to globex.
    let a = problem(s.get(GINA, "/v1/runs/req-1"), 404, "not-found");
    let b = problem(s.get(GINA, "/v1/runs/never-was"), 404, "not-found");
    assert_eq!(a, b);
    problem(s.get(GINA, "/v1/runs/req-1/artifact"), 404, "not-found");

    // The request can name no host path, mount, image, limit or destination.
    for (field, value) in [
        ("mounts", json!([{"source": "/etc", "mount": "/input/etc"}])),
        ("source", json!("/etc/passwd")),
        ("limits", json!({"seconds": 86400})),
        (
            "network",
            json!({"allow": [{"host": "evil.example", "ports": [443]}]}),
        ),
        ("image_digest", json!("sha256:00")),
    ] {
        let mut bad = req.clone();
        bad["request_id"] = json!("smuggle");
        bad[field] = value;
        let p = problem(s.run(ALICE, &bad, ""), 400, "invalid-request");
        assert!(p["detail"].as_str().unwrap().contains(field), "{p}");
    }
    let mut bad = req.clone();
    bad["request_id"] = json!("smuggle");
    bad["inputs"] = json!(["/etc/passwd"]);
    problem(s.run(ALICE, &bad, ""), 400, "invalid-request");
    bad["inputs"] = json!([id]);
    bad["request_id"] = json!("../../etc");
    problem(s.run(ALICE, &bad, ""), 400, "invalid-request");
    let p = problem(
        s.http
            .post(s.url("/v1/inputs?name=../../etc/passwd&media_type=text/csv"))
            .bearer_auth(ALICE)
            .body("x")
            .send()
            .unwrap(),
        400,
        "invalid-request",
    );
    assert!(p["detail"].as_str().unwrap().contains("name"));
    // Wrong media type for the task.
    let txt = s.upload(ALICE, "hello", "text/plain");
    let mut mism = req.clone();
    mism["request_id"] = json!("mt-1");
    mism["inputs"] = json!([txt["input_id"]]);
    problem(s.run(ALICE, &mism, ""), 422, "input-mismatch");
    // Oversized JSON body.
    let mut huge = req.clone();
    huge["request_id"] = json!("huge");
    huge["code"] = json!("#".repeat(2 * 1024 * 1024));
    problem(s.run(ALICE, &huge, ""), 413, "too-large");

    // Code that runs past the limit: status `timeout`, HTTP 200 (the run is recorded and final).
    let mut slow = req.clone();
    slow["request_id"] = json!("timeout-1");
    slow["code"] = json!("while True:\n    pass\n");
    let r = s.run(ALICE, &slow, "");
    assert_eq!(r.status(), 200);
    let v: Value = r.json().unwrap();
    assert_eq!(v["status"], "timeout", "{v}");
    assert!(v.get("artifact").is_none());

    // Output that fails the schema: `output_rejected`, and no artifact leaves.
    let mut badout = req.clone();
    badout["request_id"] = json!("reject-1");
    badout["code"] =
        json!("import json\njson.dump({'rows': 'many'}, open('/output/summary.json', 'w'))\n");
    let v: Value = s.run(ALICE, &badout, "").json().unwrap();
    assert_eq!(v["status"], "output_rejected", "{v}");
    assert!(v.get("artifact").is_none());
    assert!(
        !v["report"]["output"]["errors"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    problem(
        s.get(ALICE, "/v1/runs/reject-1/artifact"),
        409,
        "no-verified-artifact",
    );

    // Asynchronous: 202 at once, then poll.
    let mut later = req.clone();
    later["request_id"] = json!("async-1");
    let r = s.run(ALICE, &later, "?wait=false");
    assert_eq!(r.status(), 202);
    assert_eq!(r.headers()["location"], "/v1/runs/async-1");
    let deadline = Instant::now() + Duration::from_secs(30);
    let done = loop {
        let r = s.get(ALICE, "/v1/runs/async-1");
        let code = r.status().as_u16();
        let v: Value = r.json().unwrap();
        if code == 200 {
            break v;
        }
        assert_eq!(code, 202);
        assert!(["queued", "running"].contains(&v["status"].as_str().unwrap()));
        assert!(Instant::now() < deadline, "async run did not finish");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(done["status"], "ok");
    assert_eq!(done["artifact"], first["artifact"]);

    // Concurrent duplicates of one request_id race: exactly one execution, identical answers.
    let mut race = req.clone();
    race["request_id"] = json!("race-1");
    let answers: Vec<Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4)
            .map(|_| sc.spawn(|| s.run(ALICE, &race, "").json::<Value>().unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        answers
            .iter()
            .all(|a| a == &answers[0] && a["status"] == "ok"),
        "{answers:?}"
    );
    let (_, log) = audit(dir.path());
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("\"run_start\"") && l.contains("\"race-1\""))
            .count(),
        1
    );

    // Metrics reflect what happened.
    let m = s
        .http
        .get(s.url("/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    for needle in [
        "agentjail_runs_total{task=\"summarize_csv\",status=\"ok\"} 3",
        "agentjail_runs_total{task=\"summarize_csv\",status=\"timeout\"} 1",
        "agentjail_runs_total{task=\"summarize_csv\",status=\"output_rejected\"} 1",
        "agentjail_runs_total{task=\"line_count\",status=\"ok\"} 1",
        "agentjail_auth_failures_total 4",
        "agentjail_denials_total{reason=\"forbidden\"} 2",
        "agentjail_denials_total{reason=\"request-id-conflict\"} 1",
        "agentjail_replays_total 4",
        "agentjail_inputs_stored_total 2",
        "agentjail_runs_in_flight 0",
        "agentjail_run_duration_seconds_count{task=\"summarize_csv\"} 5",
    ] {
        assert!(m.contains(needle), "metrics lack {needle}:\n{m}");
    }

    // The audit log: chain verifies; decisions recorded; no token, code or input content.
    let (path, log) = audit(dir.path());
    let (n, _) = agentjail_server::audit::verify_chain(&path).unwrap();
    assert_eq!(n as usize, log.lines().count());
    for needle in [
        "\"auth_failure\"",
        "\"run_end\"",
        "\"run_replay\"",
        "actor may not use this task",
        "\"status\":\"timeout\"",
    ] {
        assert!(log.contains(needle), "audit lacks {needle}");
    }
    for secret in [
        ALICE,
        BOB,
        GINA,
        "tok-wrong",
        "zz-secret-marker-row",
        "def summarize",
        "while True",
        "many",
    ] {
        assert!(!log.contains(secret), "audit log contains {secret:?}");
        assert!(
            !s.stderr.lock().unwrap().contains(secret),
            "server log contains {secret:?}"
        );
    }
}

/// A scratch folder and a marker named after it (`prefix-<folder>`), for a payload's command
/// line that the test then finds in /proc.
fn marked_tmp(prefix: &str) -> (tempfile::TempDir, String) {
    let dir = common::tmp();
    let marker = format!(
        "{prefix}-{}",
        dir.path().file_name().unwrap().to_string_lossy()
    );
    (dir, marker)
}

fn wait_status(s: &Server, id: &str, want: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let v: Value = s.get(ALICE, &format!("/v1/runs/{id}")).json().unwrap();
        if v["status"] == want {
            return v;
        }
        if Instant::now() >= deadline {
            let log = s.stderr.lock().unwrap().clone();
            let tail: String = log.lines().rev().take(20).collect::<Vec<_>>().join("\n");
            panic!(
                "{id} never reached {want}: {v}\nservice log (last lines, newest first):\n{tail}"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Held by the tests that kill the service or start payloads they later look for in /proc,
/// and by the load test, so that 200 concurrent runs do not slow down their starts.
static TIMING: Mutex<()> = Mutex::new(());

/// Whole seconds of an RFC 3339 time in a run record.
fn unix_seconds(v: &Value) -> i64 {
    v.as_str()
        .unwrap()
        .parse::<jiff::Timestamp>()
        .unwrap()
        .as_second()
}

/// Kills (SIGKILL) the payload whose command line holds `marker`: a run's end that the test
/// chooses, not the clock.
fn kill_payload(marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let payloads: Vec<_> = procs_matching(marker)
            .into_iter()
            .filter(|(_, cmdline)| cmdline.starts_with("/usr/bin/python3"))
            .collect();
        if let [((pid, _), _)] = payloads.as_slice() {
            // SAFETY: not unsafe in effect; kill(2) on a pid the test just found.
            assert_eq!(unsafe { libc::kill(*pid, libc::SIGKILL) }, 0);
            return;
        }
        assert!(payloads.len() <= 1, "{payloads:?}");
        assert!(Instant::now() < deadline, "the payload never started");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Overload (429), a job id that expires while it waits for a slot, and a crash mid-run. The
/// expiry is made certain rather than raced: the one run slot is held by a run that only ends
/// when the test kills its payload, which it does once the clock has passed the queued job's
/// expiry. Job ids live 6 s, so the holder itself starts well within its own.
#[test]
fn overload_expiry_crash_and_reconcile() {
    let _serial = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let (dir, marker) = marked_tmp("holder-marker");
    let holder_task = format!(
        r#"
[tasks.holder]
description = "Holds its run slot until the test kills it"
code = "forbidden"
command = ["/usr/bin/python3", "-c", "import time; time.sleep(600)", "{marker}"]
allowed_tenants = ["acme"]
[tasks.holder.output]
path = "/output/o.json"
media_type = "application/json"
max_bytes = 1000
[tasks.holder.limits]
seconds = 120
"#
    );
    let settings = "max_concurrent_runs = 1\nmax_queued_runs = 1\njob_ttl_seconds = 6";
    let mut s = Server::start_with(dir.path(), settings, &holder_task);
    let holder = json!({"request_id": "holder-1", "task": "holder", "inputs": []});
    assert_eq!(s.run(ALICE, &holder, "?wait=false").status(), 202);
    wait_status(&s, "holder-1", "running");
    // One queued behind it; its job id expires before the slot frees.
    let r = s.run(
        ALICE,
        &json!({"request_id": "queued", "task": "slow", "inputs": [], "code": "pass"}),
        "?wait=false",
    );
    assert_eq!(r.status(), 202);
    // Slot and queue full: 429 with Retry-After; a replay is still answered.
    let r = s.run(
        ALICE,
        &json!({"request_id": "third", "task": "slow", "inputs": [], "code": "pass"}),
        "",
    );
    assert!(r.headers().contains_key("retry-after"));
    problem(r, 429, "overloaded");
    assert_eq!(s.run(ALICE, &holder, "?wait=false").status(), 202);
    // Wait until the queued job's id has expired by the clock the service reads, then free
    // the slot: the queued job is then certainly expired when it gets it.
    let v: Value = s.get(ALICE, "/v1/runs/queued").json().unwrap();
    assert_eq!(v["status"], "queued", "{v}");
    let expires = unix_seconds(&v["job_expires_at"]);
    while jiff::Timestamp::now().as_second() < expires {
        std::thread::sleep(Duration::from_millis(50));
    }
    let v: Value = s.get(ALICE, "/v1/runs/holder-1").json().unwrap();
    assert_eq!(v["status"], "running", "the holder ended by itself: {v}");
    kill_payload(&marker);
    wait_status(&s, "holder-1", "signaled");
    let v = wait_status(&s, "queued", "expired");
    assert!(
        v.get("started_at").is_none(),
        "an expired job never starts: {v}"
    );

    // A crash mid-run, on a service whose job ids outlive any start.
    s.kill();
    let settings = "max_concurrent_runs = 1\nmax_queued_runs = 1";
    let mut s = Server::start_with(dir.path(), settings, &holder_task);
    let sleeper = |id: &str| json!({"request_id": id, "task": "slow", "inputs": [], "code": "import time\ntime.sleep(60)\n"});
    // kill -9 mid-run, restart: the run reads `unknown`, never re-run.
    assert_eq!(
        s.run(ALICE, &sleeper("sleeper-2"), "?wait=false").status(),
        202
    );
    wait_status(&s, "sleeper-2", "running");
    // On the local store `run_start` is appended just after the `running` mark, when the
    // payload is handed its manifest: a kill between the two leaves a run that never started
    // (the restart audits it `run_unknown` alone). This test kills a run that did start.
    let deadline = Instant::now() + Duration::from_secs(15);
    while audit(dir.path()).1.matches("\"run_start\"").count() < 2 {
        assert!(
            Instant::now() < deadline,
            "sleeper-2's run_start was never audited"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    s.kill();
    let s = Server::start_with(dir.path(), settings, &holder_task);
    let v: Value = s.get(ALICE, "/v1/runs/sleeper-2").json().unwrap();
    assert_eq!(v["status"], "unknown", "{v}");
    assert!(v["reason"].as_str().unwrap().contains("in flight"));
    // Replaying the request returns the recorded `unknown` run; it does not execute again.
    let v2: Value = s.run(ALICE, &sleeper("sleeper-2"), "").json().unwrap();
    assert_eq!(v2["status"], "unknown");
    // Only an operator reconciles (alice is one, bob is not).
    let reconcile = |tok: &str, action: &str| {
        s.http
            .post(s.url("/v1/runs/sleeper-2/reconcile"))
            .bearer_auth(tok)
            .json(&json!({ "action": action }))
            .send()
            .unwrap()
    };
    problem(reconcile(BOB, "abandon"), 403, "forbidden");
    // A code task cannot be retried: its code is not kept after the run.
    problem(reconcile(ALICE, "retry"), 409, "not-reconcilable");
    let r = reconcile(ALICE, "abandon");
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().unwrap()["status"], "abandoned");
    problem(reconcile(ALICE, "abandon"), 409, "not-reconcilable");
    let (path, log) = audit(dir.path());
    agentjail_server::audit::verify_chain(&path).unwrap();
    assert!(log.contains("\"run_unknown\""));
    assert_eq!(log.matches("\"run_start\"").count(), 2);
}

/// The issue's load test, as a bounded client: 200 small runs (the fixed-program task) from 8
/// concurrent clients, each with its own request id, then every id replayed once. Nothing may
/// be lost (every run recorded and readable, `ok`) or duplicated (exactly one `run_start` per
/// request id in the audit log, and a replay returns the recorded run).
#[test]
fn load_200_runs_at_concurrency_8_lose_and_duplicate_nothing() {
    let _serial = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    const CLIENTS: usize = 8;
    const PER_CLIENT: usize = 25;
    let dir = common::tmp();
    let s = Arc::new(Server::start(
        dir.path(),
        "max_concurrent_runs = 8\nmax_queued_runs = 64",
    ));
    let input = s.upload(ALICE, CSV, "text/csv")["input_id"]
        .as_str()
        .unwrap()
        .to_string();
    let started = Instant::now();
    let handles: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let s = s.clone();
            let input = input.clone();
            std::thread::spawn(move || {
                let mut bodies = Vec::new();
                for i in 0..PER_CLIENT {
                    let id = format!("load-{c}-{i}");
                    let body = json!({"request_id": id, "task": "line_count", "inputs": [input]});
                    let r = s.run(ALICE, &body, "");
                    assert_eq!(r.status(), 200, "{id}");
                    let v: Value = r.json().unwrap();
                    assert_eq!(v["status"], "ok", "{id}: {v}");
                    bodies.push((id, v));
                }
                bodies
            })
        })
        .collect();
    let runs: Vec<(String, Value)> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let elapsed = started.elapsed();
    assert_eq!(runs.len(), CLIENTS * PER_CLIENT);
    eprintln!(
        "load: {} runs at concurrency {CLIENTS} in {:.1} s ({:.1} runs/s)",
        runs.len(),
        elapsed.as_secs_f64(),
        runs.len() as f64 / elapsed.as_secs_f64()
    );
    // Every run is recorded and readable; a replay returns the recorded run, not a new one.
    for (id, first) in &runs {
        let got: Value = s.get(ALICE, &format!("/v1/runs/{id}")).json().unwrap();
        assert_eq!(got["status"], "ok", "{id}: {got}");
        let again: Value = s
            .run(
                ALICE,
                &json!({"request_id": id, "task": "line_count", "inputs": [input]}),
                "",
            )
            .json()
            .unwrap();
        assert_eq!(again["report"], first["report"], "{id} was run twice");
    }
    let (_, log) = audit(dir.path());
    for (id, _) in &runs {
        let starts = log
            .lines()
            .filter(|l| l.contains("\"run_start\"") && l.contains(&format!("\"{id}\"")))
            .count();
        assert_eq!(starts, 1, "{id} started {starts} times");
    }
    assert_eq!(log.matches("\"run_start\"").count(), CLIENTS * PER_CLIENT);
}

/// A process seen in /proc: its pid and start time (clock ticks since boot), which together
/// name one process even if the pid is reused.
type ProcId = (i32, u64);

fn proc_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 (starttime); the command name (field 2) may hold spaces, so count after ')'.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// Every process whose command line, working directory or environment holds `needle`.
fn procs_matching(needle: &str) -> Vec<(ProcId, String)> {
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
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd"))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let environ = std::fs::read(format!("/proc/{pid}/environ"))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        if (cmdline.contains(needle) || cwd.contains(needle) || environ.contains(needle))
            && let Some(t) = proc_start_time(pid)
        {
            found.push(((pid, t), cmdline));
        }
    }
    found
}

/// Watches /proc every 10 ms and collects every distinct process whose command line holds
/// `marker`: the test's own count of how often the payload executed. The payload cannot forge
/// or hide it (it is the kernel's view of processes, outside the sandbox), and it does not
/// depend on anything the service says.
struct Executions {
    seen: Arc<Mutex<std::collections::BTreeSet<ProcId>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Executions {
    fn watch(marker: String) -> Executions {
        let seen = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s2, st2) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st2.load(std::sync::atomic::Ordering::Relaxed) {
                for (id, cmdline) in procs_matching(&marker) {
                    // Only the payload itself (python), not a runner or anything else.
                    if cmdline.starts_with("/usr/bin/python3") {
                        s2.lock().unwrap().insert(id);
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Executions {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    fn finish(mut self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.count()
    }
}

/// Issue #15, item 1: runs never outlive the service. A `kill -9` of `agentjail serve` while a
/// run executes must take the run's runner and sandbox with it within a few seconds; after the
/// restart the run reads `unknown`, and an operator's `retry` executes the payload exactly
/// once more (counted from /proc by the test, not by the service's records), with the same
/// request, `args` included (item 2).
#[test]
fn sigkill_of_the_service_kills_its_runs_and_retry_runs_once() {
    let _serial = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::tmp();
    let data = dir.path().join("data");
    let marker = format!(
        "lifeline-marker-{}",
        dir.path().file_name().unwrap().to_string_lossy()
    );
    // A fixed program (retry is allowed only without code and without network): it sleeps
    // long enough that an orphan would still be alive when the test looks, then writes output.
    let task = sleeper_task(&marker, 20);
    let mut s = Server::start_with(dir.path(), "max_concurrent_runs = 2", &task);
    let executions = Executions::watch(marker.clone());
    let body = json!({"request_id": "crash-1", "task": "sleeper", "inputs": [], "args": ["6"]});
    assert_eq!(s.run(ALICE, &body, "?wait=false").status(), 202);
    wait_status(&s, "crash-1", "running");
    let deadline = Instant::now() + Duration::from_secs(15);
    while executions.count() == 0 {
        assert!(Instant::now() < deadline, "the payload never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    s.kill(); // SIGKILL

    // A few seconds later nothing of that run exists: no payload, no runner, no sandbox init
    // (anything whose command line, working directory or environment names the data dir).
    let data_s = data.to_string_lossy().into_owned();
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left: Vec<_> = procs_matching(&marker)
            .into_iter()
            .chain(procs_matching(&data_s))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "3 s after the service was killed, processes of its run are still alive: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(executions.count(), 1);

    let s = Server::start_with(dir.path(), "max_concurrent_runs = 2", &task);
    let v: Value = s.get(ALICE, "/v1/runs/crash-1").json().unwrap();
    assert_eq!(v["status"], "unknown", "{v}");
    // Item 7: a run marked unknown at start-up is logged.
    let log = s.stderr.lock().unwrap().clone();
    assert!(
        log.lines()
            .any(|l| l.contains("unknown") && l.contains("crash-1")),
        "the run marked unknown is not in the service log:\n{log}"
    );
    let r = s
        .http
        .post(s.url("/v1/runs/crash-1/reconcile"))
        .bearer_auth(ALICE)
        .json(&json!({ "action": "retry" }))
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    let v = loop {
        let v: Value = s.get(ALICE, "/v1/runs/crash-1").json().unwrap();
        if v["status"] != "queued" && v["status"] != "running" {
            break v;
        }
        assert!(Instant::now() < deadline, "the retry never finished: {v}");
        std::thread::sleep(Duration::from_millis(50));
    };
    // Item 2: the retry is the same request, `args` included (the payload sleeps as long as
    // its argument says and echoes its arguments).
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["artifact"]["json"]["args"], json!([marker, "6"]), "{v}");
    // Exactly two executions in all: the killed one and the retry.
    assert_eq!(
        executions.finish(),
        2,
        "the payload did not run exactly once more"
    );
    let (path, log) = audit(dir.path());
    agentjail_server::audit::verify_chain(&path).unwrap();
    assert!(log.contains("\"run_unknown\""));
}

/// A runner that dies mid-run without a report (killed from outside, or crashed) may have
/// let the command run: the run ends `unknown`, never `setup_error` (which says nothing ran
/// and cannot be reconciled). Its sandbox dies with it, and a retry executes exactly once
/// more.
#[test]
fn a_runner_killed_mid_run_leaves_the_run_unknown_not_setup_error() {
    let _serial = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::tmp();
    let data = dir.path().join("data");
    let data_s = data.to_string_lossy().into_owned();
    let marker = format!(
        "runner-kill-marker-{}",
        dir.path().file_name().unwrap().to_string_lossy()
    );
    let task = sleeper_task(&marker, 20);
    let s = Server::start_with(dir.path(), "max_concurrent_runs = 2", &task);
    let executions = Executions::watch(marker.clone());
    let body = json!({"request_id": "runner-1", "task": "sleeper", "inputs": [], "args": ["6"]});
    assert_eq!(s.run(ALICE, &body, "?wait=false").status(), 202);
    let deadline = Instant::now() + Duration::from_secs(15);
    while executions.count() == 0 {
        assert!(Instant::now() < deadline, "the payload never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The runner is the one whose parent is not also a runner (it forks the sandbox's
    // parent, which keeps its command line).
    let runners: Vec<_> = procs_matching(&data_s)
        .into_iter()
        .filter(|(_, cmdline)| cmdline.contains(" run --lifeline"))
        .map(|((pid, _), _)| pid)
        .collect();
    let ppid = |pid: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let top: Vec<i32> = runners
        .iter()
        .copied()
        .filter(|p| ppid(*p).is_none_or(|pp| !runners.contains(&pp)))
        .collect();
    let [pid] = top.as_slice() else {
        panic!("expected one runner: {runners:?}");
    };
    // SAFETY: not unsafe in effect; kill(2) on a pid the test just found.
    assert_eq!(unsafe { libc::kill(*pid, libc::SIGKILL) }, 0);
    let v = wait_status(&s, "runner-1", "unknown");
    assert!(
        v["reason"]
            .as_str()
            .unwrap_or("")
            .contains("without a report"),
        "{v}"
    );
    // Its sandbox went with it.
    let deadline = Instant::now() + Duration::from_secs(3);
    while !procs_matching(&marker).is_empty() {
        assert!(Instant::now() < deadline, "the payload outlived its runner");
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = s
        .http
        .post(s.url("/v1/runs/runner-1/reconcile"))
        .bearer_auth(ALICE)
        .json(&json!({ "action": "retry" }))
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().unwrap());
    let v = wait_status(&s, "runner-1", "ok");
    assert_eq!(v["artifact"]["json"]["args"], json!([marker, "6"]), "{v}");
    assert_eq!(
        executions.finish(),
        2,
        "the payload did not run exactly once more"
    );
    let (path, log) = audit(dir.path());
    agentjail_server::audit::verify_chain(&path).unwrap();
    assert!(log.contains("without a report"), "{log}");
}

/// The other side of the test above: a runner that dies before it starts the sandbox (here a
/// wrapper that kills itself before it execs the runner, as a broken or replaced binary
/// would) ran nothing, so the run ends `setup_error`, not `unknown`: the runner announces on
/// its lifeline when it is about to start the sandbox, and only after that is a death
/// without a report an unknown outcome.
#[test]
fn a_runner_that_dies_before_its_sandbox_starts_leaves_setup_error() {
    let _serial = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::tmp();
    let flag = dir.path().join("die");
    let wrapper = dir.path().join("dying-agentjail");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n[ -e {} ] && kill -9 $$\nexec {} \"$@\"\n",
            flag.display(),
            common::bin().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let marker = format!(
        "early-death-marker-{}",
        dir.path().file_name().unwrap().to_string_lossy()
    );
    let server = format!(
        "max_concurrent_runs = 1\nrunner = \"{}\"",
        wrapper.display()
    );
    let s = Server::start_with(dir.path(), &server, &sleeper_task(&marker, 20));
    let executions = Executions::watch(marker.clone());
    std::fs::write(&flag, "").unwrap();
    let body = json!({"request_id": "early-1", "task": "sleeper", "inputs": [], "args": ["1"]});
    assert_eq!(s.run(ALICE, &body, "?wait=false").status(), 202);
    let v = wait_status(&s, "early-1", "setup_error");
    assert!(
        v["reason"]
            .as_str()
            .unwrap_or("")
            .contains("before it started the sandbox"),
        "{v}"
    );
    // The control: the same runner without the flag runs the task.
    std::fs::remove_file(&flag).unwrap();
    let body = json!({"request_id": "early-2", "task": "sleeper", "inputs": [], "args": ["1"]});
    assert_eq!(s.run(ALICE, &body, "?wait=false").status(), 202);
    wait_status(&s, "early-2", "ok");
    assert_eq!(executions.finish(), 1, "only the control ran");
}

/// A fixed-program task (retry needs no code and no network) that sleeps as long as its
/// argument says and writes its output; `env` and `schema` vary to change the task's config.
fn echo_task(env: &str, schema: &str) -> String {
    format!(
        r#"
[tasks.echo]
description = "Sleeps as long as its argument says, then writes its output"
code = "forbidden"
command = ["/usr/bin/python3", "-c", "import json, os, sys, time; time.sleep(float(sys.argv[1])); json.dump({{'mode': os.environ.get('MODE')}}, open('/output/o.json', 'w'))"]
max_args = 1
allowed_tenants = ["acme"]
env = {{ MODE = "{env}" }}
[tasks.echo.output]
path = "/output/o.json"
media_type = "application/json"
max_bytes = 1000
schema = '{schema}'
[tasks.echo.limits]
seconds = 20
"#
    )
}

/// Issue #15, item 2 (retry fidelity): a retry rebuilds the manifest from the stored request and
/// the task type; if the task type changed since the first attempt (here its `env`, then only
/// its output schema), the rebuilt run is a different run, and the retry is refused with 409
/// naming both manifest digests. With the configuration unchanged, the retry runs, under the
/// same manifest digest as the first attempt.
#[test]
fn retry_refuses_a_changed_task_and_runs_an_unchanged_one_under_the_same_digest() {
    let _serial = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::tmp();
    const SCHEMA: &str = r#"{"type": "object", "required": ["mode"]}"#;
    let original = echo_task("a", SCHEMA);
    let mut s = Server::start_with(dir.path(), "", &original);
    let body = json!({"request_id": "fidelity-1", "task": "echo", "inputs": [], "args": ["2"]});
    assert_eq!(s.run(ALICE, &body, "?wait=false").status(), 202);
    let v = wait_status(&s, "fidelity-1", "running");
    let first = v["manifest_digest"]
        .as_str()
        .unwrap_or_else(|| panic!("the run records no manifest digest: {v}"))
        .to_string();
    assert!(first.starts_with("sha256:") && first.len() == 71, "{first}");
    s.kill(); // SIGKILL mid-run: the run reads `unknown` after the restart.

    let retry = |s: &Server| {
        s.http
            .post(s.url("/v1/runs/fidelity-1/reconcile"))
            .bearer_auth(ALICE)
            .json(&json!({ "action": "retry" }))
            .send()
            .unwrap()
    };
    // The task's env changed (an operator rotated a value), then only its output schema: each
    // time the retry is refused, naming the recorded digest and the rebuilt one.
    for changed in [
        echo_task("b", SCHEMA),
        echo_task(
            "a",
            r#"{"type": "object", "required": ["mode"], "maxProperties": 1}"#,
        ),
    ] {
        let s = Server::start_with(dir.path(), "", &changed);
        let v: Value = s.get(ALICE, "/v1/runs/fidelity-1").json().unwrap();
        assert_eq!(v["status"], "unknown", "{v}");
        let p = problem(retry(&s), 409, "task-changed");
        let detail = p["detail"].as_str().unwrap();
        assert!(detail.contains(&first), "{detail}");
        let digests: Vec<&str> = detail
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == ':'))
            .filter(|w| w.starts_with("sha256:"))
            .collect();
        assert_eq!(digests.len(), 2, "{detail}");
        assert_ne!(digests[0], digests[1], "{detail}");
        // Refused: nothing ran, the record is unchanged.
        let v: Value = s.get(ALICE, "/v1/runs/fidelity-1").json().unwrap();
        assert_eq!(v["status"], "unknown", "{v}");
        assert_eq!(v["manifest_digest"], first, "{v}");
    }
    let (_, log) = audit(dir.path());
    assert_eq!(
        log.matches("\"run_start\"").count(),
        1,
        "a refused retry ran"
    );

    // Back to the original configuration: the retry runs the same manifest.
    let s = Server::start_with(dir.path(), "", &original);
    let r = retry(&s);
    assert!(r.status().is_success(), "{}", r.text().unwrap());
    let v = wait_status(&s, "fidelity-1", "ok");
    assert_eq!(v["manifest_digest"], first, "{v}");
    assert_eq!(v["artifact"]["json"]["mode"], "a", "{v}");
    let (path, log) = audit(dir.path());
    agentjail_server::audit::verify_chain(&path).unwrap();
    assert_eq!(log.matches("\"run_start\"").count(), 2);
}

/// Issue #15, item 1 (the start-up sweep): a runner that outlived its service anyway (here:
/// one whose lifeline the test holds open) is killed, with its sandbox, when a service starts
/// on its data directory, before reconciliation. Only verified runners of this data directory
/// are killed: a process that merely carries the mark, and a runner of another data
/// directory, are left alone.
#[test]
fn startup_sweep_kills_only_this_data_dirs_leftover_runners() {
    let _serial = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    use std::io::Write;
    let dir = common::tmp();
    let other = common::tmp();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("jobs/job_left")).unwrap();
    let data = data.canonicalize().unwrap();
    let marker = format!(
        "sweep-marker-{}",
        dir.path().file_name().unwrap().to_string_lossy()
    );
    let manifest = json!({
        "command": ["/usr/bin/python3", "-c", "import time; time.sleep(60)", marker],
    });
    let runner = |data_dir: &Path, cwd: &Path| {
        let mut c = Command::new(common::bin())
            .args(["run", "--lifeline", "--allow-degraded"])
            .env("AGENTJAIL_SERVICE_DATA", data_dir)
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut w = c.stdin.take().unwrap();
        w.write_all(format!("{manifest}\n").as_bytes()).unwrap();
        (c, w) // the test keeps the lifeline open: only the sweep can end this runner
    };
    let (mut left, _lifeline) = runner(&data, &data.join("jobs/job_left"));
    let (mut foreign, _lifeline2) = runner(&other.path().canonicalize().unwrap(), other.path());
    let mut decoy = Command::new("/bin/sleep")
        .arg("60")
        .env("AGENTJAIL_SERVICE_DATA", &data)
        .spawn()
        .unwrap();
    // Both payloads run before the service starts.
    let deadline = Instant::now() + Duration::from_secs(20);
    while procs_matching(&marker)
        .iter()
        .filter(|(_, c)| c.starts_with("/usr/bin/python3"))
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "the payloads never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let s = Server::start(dir.path(), "");
    // The service listens only after the sweep: the leftover runner is gone (reaped here)…
    let deadline = Instant::now() + Duration::from_secs(5);
    while left.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the leftover runner of this data directory is still alive"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // … and so is its sandbox; the other data directory's payload still runs.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let payloads: Vec<_> = procs_matching(&marker)
            .into_iter()
            .filter(|(_, c)| c.starts_with("/usr/bin/python3"))
            .collect();
        if payloads.len() == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "expected only the foreign payload alive: {payloads:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        foreign.try_wait().unwrap().is_none(),
        "a foreign runner was killed"
    );
    assert!(
        decoy.try_wait().unwrap().is_none(),
        "an unverified process was killed"
    );
    drop(s);
    let _ = foreign.kill();
    let _ = decoy.kill();
    let _ = foreign.wait();
    let _ = decoy.wait();
}

/// Issue #15: the service's runner must take `--results-on-lifeline`. A `server.runner` that is
/// an older agentjail (here a script that refuses the flag the way clap does and otherwise
/// runs this build) would end every run `setup_error`: the service refuses to start and says
/// why. The control: the same configuration naming this build starts.
#[test]
fn a_runner_that_cannot_send_results_back_is_refused_at_start() {
    let dir = common::tmp();
    let old = dir.path().join("old-agentjail");
    std::fs::write(
        &old,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = --results-on-lifeline ] && {{ echo \"error: unexpected argument '--results-on-lifeline' found\" >&2; exit 2; }}; done\nexec {} \"$@\"\n",
            common::bin().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
    let start = |runner: &Path| {
        let cfg = write_config(
            dir.path(),
            &config(&format!("runner = \"{}\"", runner.display())),
        );
        Command::new(common::bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&cfg)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut c = start(&old);
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = c.kill();
            let _ = c.wait();
            panic!("the service started with a runner that cannot send results back");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = c.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("refusing to start") && err.contains("--results-on-lifeline"),
        "{err}"
    );
    assert!(!err.contains("listening on"), "{err}");
    // The control: this build as the runner.
    let mut c = start(&common::bin());
    let mut seen = String::new();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(c.stderr.take().unwrap()));
    while let Some(Ok(l)) = lines.next() {
        seen.push_str(&l);
        seen.push('\n');
        if l.contains("listening on") {
            break;
        }
    }
    let _ = c.kill();
    let _ = c.wait();
    assert!(seen.contains("listening on"), "{seen}");
}

/// Issue #15, performance: `run --results-on-lifeline` (the service's runner) sends the
/// verified artifact, the signed receipt and the report back over its lifeline, a Unix
/// socket, and writes no file. The command inside is hostile: it looks for a socket among its
/// descriptors and writes a forged report frame (sentinel `forged-by-the-sandbox`) to every
/// descriptor it has; the control is its own socketpair, which the same check must find. The
/// service must get the runner's frames only: the artifact, a receipt, and the genuine report.
#[test]
fn results_come_back_on_the_lifeline_and_the_sandbox_cannot_forge_them() {
    use std::io::{Read, Write};
    let dir = common::tmp();
    let src = dir.path().join("src");
    let cwd = dir.path().join("cwd");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::write(src.join("data.txt"), "zz-input\n").unwrap();
    for d in [&src, &cwd] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(src.join("data.txt"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let probe = r#"
import json, os, socket, stat
forged = json.dumps({"status": "ok", "request_id": "forged-by-the-sandbox"}).encode()
frame = b"R" + len(forged).to_bytes(8, "little") + forged
a, b = socket.socketpair()
def is_sock(fd):
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:
        return False
control = is_sock(a.fileno())
fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
ours = {a.fileno(), b.fileno()}
sockets = [fd for fd in fds if fd not in ours and is_sock(fd)]
written = []
for fd in fds:
    if fd in ours:
        continue
    try:
        os.write(fd, frame)
        written.append(fd)
    except OSError:
        pass
json.dump({"control": control, "sockets": sockets, "written": written,
           "input": open("/input/data.txt").read()}, open("/output/o.json", "w"))
import time
time.sleep(1.5)
"#;
    let manifest = json!({
        "inputs": [{"source": src.join("data.txt"), "mount": "/input/data.txt", "mode": "read-only"}],
        "output": "/output/o.json",
        "command": ["/usr/bin/python3", "-c", probe],
    });
    let key = dir.path().join("key.pem");
    let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let link = {
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&theirs)
        ))
        .unwrap()
        .ino();
        format!("socket:[{ino}]")
    };
    let c = Command::new(common::bin())
        .args([
            "run",
            "--lifeline",
            "--results-on-lifeline",
            "--allow-degraded",
        ])
        .arg("--source-root")
        .arg(&src)
        .arg("--key")
        .arg(&key)
        .current_dir(&cwd)
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    ours.write_all(format!("{manifest}\n").as_bytes()).unwrap();
    // From the host: while the command runs, the runner holds the socket (the control) and no
    // process below it does, the sandbox's init included (it is cloned with the runner's
    // descriptors, stdin among them).
    let holds = |pid: &str| -> bool {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| {
                d.flatten().any(|e| {
                    std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy() == link)
                })
            })
            .unwrap_or(false)
    };
    let below = |root: u32| -> Vec<String> {
        let mut all = Vec::new();
        let mut todo = vec![root.to_string()];
        while let Some(p) = todo.pop() {
            for t in std::fs::read_dir(format!("/proc/{p}/task"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
                for k in kids.split_whitespace() {
                    all.push(k.to_string());
                    todo.push(k.to_string());
                }
            }
        }
        all
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut inside = Vec::new();
    while inside.len() < 2 && Instant::now() < deadline {
        inside = below(c.id());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        inside.len() >= 2,
        "the sandbox's init and command were not seen: {inside:?}"
    );
    assert!(
        holds(&c.id().to_string()),
        "the control: the runner holds {link}"
    );
    let holding: Vec<&String> = inside.iter().filter(|p| holds(p)).collect();
    assert!(
        holding.is_empty(),
        "{holding:?} below the runner hold the lifeline {link}"
    );
    let mut frames: Vec<(u8, Vec<u8>)> = Vec::new();
    loop {
        let mut head = [0u8; 9];
        if ours.read_exact(&mut head).is_err() {
            break;
        }
        let len = u64::from_le_bytes(head[1..].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len];
        ours.read_exact(&mut body).unwrap();
        frames.push((head[0], body));
    }
    let out = c.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let tags: Vec<char> = frames.iter().map(|(t, _)| *t as char).collect();
    assert_eq!(tags, ['S', 'A', 'C', 'R'], "{stderr}");
    // The start's announcement is empty; the results follow it.
    assert!(frames[0].1.is_empty());
    let frames = &frames[1..];
    let artifact: Value = serde_json::from_slice(&frames[0].1).unwrap();
    assert_eq!(
        artifact["control"], true,
        "the probe cannot see a socket: {artifact}"
    );
    assert_eq!(artifact["sockets"], json!([]), "{artifact}");
    assert_eq!(artifact["input"], "zz-input\n", "{artifact}");
    let report: Value = serde_json::from_slice(&frames[2].1).unwrap();
    assert_eq!(report["status"], "ok", "{report}");
    assert_ne!(report["request_id"], "forged-by-the-sandbox", "{report}");
    assert_eq!(
        report["output"]["files"][0]["sha256"],
        format!("sha256:{}", sha256_hex(&frames[0].1)),
        "{report}"
    );
    let receipt: Value = serde_json::from_slice(&frames[1].1).unwrap();
    assert!(receipt["signatures"].is_array(), "{receipt}");
    // Nothing written: not in the working folder, not beside the inputs.
    assert!(std::fs::read_dir(&cwd).unwrap().next().is_none());
    assert_eq!(std::fs::read_dir(&src).unwrap().count(), 1);
    // Only for the service's runner, and never with files to write as well.
    for extra in [
        &["--report", "r.json"][..],
        &["--output-dir", "o"],
        &["--job-dir", "."],
    ] {
        let o = Command::new(common::bin())
            .args(["run", "--lifeline", "--results-on-lifeline"])
            .args(extra)
            .current_dir(&cwd)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(125), "{extra:?}: {o:?}");
    }
}

/// Issue #15 (performance): the service no longer starts its runner in the job folder (a child
/// with a working directory is forked; without one, posix_spawn'd), but names the folder with
/// `--job-dir`, and the runner changes into it before anything else. Attacked here with the
/// runner started elsewhere: a source named relative to the job folder is found there (and the
/// same name in the starting folder is not what runs), the relative report lands in the job
/// folder; `--job-dir` is refused without `--lifeline`, and a job folder that does not exist
/// ends the runner with no report written anywhere.
#[test]
fn runner_job_dir_is_the_lifeline_runs_folder() {
    use std::io::Write;
    let dir = common::tmp();
    let job = dir.path().join("job");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(&job).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(job.join("data.txt"), "from-the-job-folder\n").unwrap();
    std::fs::write(elsewhere.join("data.txt"), "from-the-start-folder\n").unwrap();
    for d in [&job, &elsewhere] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(d.join("data.txt"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
    }
    let manifest = json!({
        "inputs": [{"source": "data.txt", "mount": "/input/data.txt", "mode": "read-only"}],
        "output": "/output/sub/o.txt",
        "command": ["/bin/sh", "-c",
            "cat /input/data.txt; mkdir /output/sub; cat /input/data.txt > /output/sub/o.txt"],
    });
    let runner = |job_dir: &Path| {
        let mut c = Command::new(common::bin())
            .args(["run", "--lifeline", "--allow-degraded", "--job-dir"])
            .arg(job_dir)
            .args(["--report", "report.json", "--output-dir", "out"])
            .current_dir(&elsewhere)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut w = c.stdin.take().unwrap();
        let _ = w.write_all(format!("{manifest}\n").as_bytes());
        let out = c.wait_with_output().unwrap();
        drop(w);
        out
    };
    let out = runner(&job);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout, "from-the-job-folder\n", "{stderr}");
    let report: Value =
        serde_json::from_slice(&std::fs::read(job.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["status"], "ok", "{report}");
    assert!(!elsewhere.join("report.json").exists());
    // What the runner delivers to a job folder is private already (the service no longer
    // has to chmod it): folders 0700, files 0600; a person's `--output-dir` gets 0644.
    assert_eq!(
        std::fs::read_to_string(job.join("out/sub/o.txt")).unwrap(),
        "from-the-job-folder\n"
    );
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&job.join("out")), 0o700);
    assert_eq!(mode(&job.join("out/sub")), 0o700);
    assert_eq!(mode(&job.join("out/sub/o.txt")), 0o600);
    assert_eq!(mode(&job.join("report.json")), 0o600);
    // A job folder that is not there: refused before anything is read or written.
    let out = runner(&dir.path().join("missing"));
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--job-dir"),
        "{out:?}"
    );
    assert!(!elsewhere.join("report.json").exists());
    // Only for the service's runner.
    let out = Command::new(common::bin())
        .args(["run", "--job-dir"])
        .arg(&job)
        .args(["--", "/bin/true"])
        .current_dir(&elsewhere)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--lifeline"),
        "{out:?}"
    );
}

/// Every file and folder below `dir` with its mode.
fn modes_below(dir: &Path) -> Vec<(PathBuf, u32, bool)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let m = std::fs::symlink_metadata(e.path()).unwrap();
        out.push((e.path(), m.permissions().mode() & 0o7777, m.is_dir()));
        if m.is_dir() {
            out.extend(modes_below(&e.path()));
        }
    }
    out
}

/// Whether any file below `dir` contains `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    modes_below(dir)
        .into_iter()
        .filter(|(p, _, d)| {
            !d && std::fs::read(p)
                .map(|b| b.windows(needle.len()).any(|w| w == needle))
                .unwrap_or(false)
        })
        .map(|(p, _, _)| p)
        .collect()
}

/// Issue #15, items 3 and 4: what the service writes is private (job folders 0700, files
/// 0600; the task's env values never on disk), while the run executes and after it; and
/// retention means deletion (after `outputs_seconds` the artifact, report and receipt files
/// are gone from the job folder, not only answered 410).
#[test]
fn job_files_are_private_env_never_on_disk_and_retention_deletes() {
    let _serial = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::tmp();
    let data = dir.path().join("data");
    let secret = "zz-env-secret-4b1d9";
    let task = format!(
        r#"
[tasks.keyed]
description = "Uses an API key from the task's env"
code = "allowed"
command = ["/usr/bin/python3", "/input/code.py"]
env = {{ API_KEY = "{secret}" }}
allowed_tenants = ["acme"]
[tasks.keyed.output]
path = "/output/o.json"
media_type = "application/json"
max_bytes = 1000
[tasks.keyed.retention]
outputs_seconds = 2
logs_seconds = 3600
"#
    );
    let s = Server::start_with(dir.path(), "sweep_interval_seconds = 1", &task);
    // The request's code carries a sentinel of its own: the model's code is no more the
    // host's to keep than the task's secrets (it went to `DATA/code/<job_id>`, 0644, until the
    // code was carried in the manifest).
    let code_mark = "zz-code-sentinel-7f3a";
    let code = format!(
        "# {code_mark}\nimport json, os, time\nprint('log line', flush=True)\ntime.sleep(2)\njson.dump({{'key_len': len(os.environ['API_KEY']), 'code_len': len(open('/input/code.py').read())}}, open('/output/o.json', 'w'))\n"
    );
    let body = json!({"request_id": "priv-1", "task": "keyed", "inputs": [], "code": code});
    assert_eq!(s.run(ALICE, &body, "?wait=false").status(), 202);
    let v = wait_status(&s, "priv-1", "running");
    let job = data.join("jobs").join(v["job_id"].as_str().unwrap());
    let check = |when: &str| {
        let m = std::fs::metadata(&job).unwrap().permissions().mode() & 0o7777;
        assert_eq!(m, 0o700, "{when}: job folder mode {m:o}");
        for (p, m, is_dir) in modes_below(&job) {
            if is_dir {
                assert_eq!(m & 0o077, 0, "{when}: {} is {m:o}", p.display());
            } else {
                assert_eq!(m & 0o177, 0, "{when}: {} is {m:o}", p.display());
            }
        }
        let leaked = files_containing(&data, secret.as_bytes());
        assert!(
            leaked.is_empty(),
            "{when}: the env value is on disk in {leaked:?}"
        );
        let leaked = files_containing(&data, code_mark.as_bytes());
        assert!(
            leaked.is_empty(),
            "{when}: the request's code is on disk in {leaked:?}"
        );
    };
    // The job folder is made for the run's first byte of log (the code prints at once, then
    // sleeps 2 s): wait for it rather than guess how long a loaded machine takes.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !job.join("stdout.log").exists() {
        assert!(Instant::now() < deadline, "the run's log never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    check("while running");
    let v = wait_status(&s, "priv-1", "ok");
    assert_eq!(v["artifact"]["json"]["key_len"], secret.len(), "{v}");
    // The sandbox read its code (the control: the code is not on disk because it was never
    // needed there, not because the run failed to get it).
    assert_eq!(v["artifact"]["json"]["code_len"], code.len(), "{v}");
    check("after the run");
    // The run's report, receipt and artifact came back over the runner's lifeline into the
    // store: no copy of them is on disk, only the log the run wrote.
    let entries = |dir: &std::path::Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(entries(&job), ["stdout.log"], "{}", job.display());

    // Retention (outputs_seconds = 2, a sweep every second): 410.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = s.get(ALICE, "/v1/runs/priv-1/artifact");
        if r.status() == 410 {
            break;
        }
        assert!(Instant::now() < deadline, "the artifact never expired");
        std::thread::sleep(Duration::from_millis(200));
    }
    // The logs stay until logs_seconds.
    assert_eq!(entries(&job), ["stdout.log"], "{}", job.display());
}

/// Issue #15, item 5: an input referenced by a queued run is not swept before the run ends,
/// even when its retention passes while the run waits for a slot.
#[test]
fn inputs_of_a_queued_run_are_pinned_until_it_ends() {
    let _serial = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::tmp();
    let s = Server::start(
        dir.path(),
        "max_concurrent_runs = 1\ninput_retention_seconds = 1\nsweep_interval_seconds = 1",
    );
    let input = s.upload(ALICE, CSV, "text/csv")["input_id"]
        .as_str()
        .unwrap()
        .to_string();
    // Occupy the only slot for ~2.5 s.
    let blocker = json!({"request_id": "blocker", "task": "slow", "inputs": [], "code": "import time, json\ntime.sleep(2.5)\njson.dump({}, open('/output/o.json', 'w'))\n"});
    assert_eq!(s.run(ALICE, &blocker, "?wait=false").status(), 202);
    wait_status(&s, "blocker", "running");
    let queued = json!({"request_id": "pinned", "task": "line_count", "inputs": [input]});
    assert_eq!(s.run(ALICE, &queued, "?wait=false").status(), 202);
    let v = wait_status(&s, "pinned", "ok");
    assert_eq!(v["artifact"]["json"]["lines"], 4, "{v}");
    // After the run ends, the expired input goes at the next sweep.
    let objects = dir.path().join("data/objects");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !modes_below(&objects).is_empty() {
        assert!(Instant::now() < deadline, "the input was never swept");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Issue #15, item 7: the small holes, each attacked over real HTTP.
#[test]
fn small_holes_are_closed() {
    let dir = common::tmp();
    let s = Server::start(dir.path(), "");
    // Two Authorization headers: refused with 400, whichever comes first.
    for (first, second) in [(ALICE, "nope"), ("nope", ALICE), (ALICE, ALICE)] {
        let r = s
            .http
            .get(s.url("/v1/tasks"))
            .header("authorization", format!("Bearer {first}"))
            .header("authorization", format!("Bearer {second}"))
            .send()
            .unwrap();
        problem(r, 400, "invalid-request");
    }
    // request_id `.` and `..` are refused (Location: /v1/runs/.. cannot be fetched).
    let input = s.upload(ALICE, CSV, "text/csv")["input_id"]
        .as_str()
        .unwrap()
        .to_string();
    for id in [".", ".."] {
        let r = s.run(
            ALICE,
            &json!({"request_id": id, "task": "line_count", "inputs": [input]}),
            "",
        );
        problem(r, 400, "invalid-request");
    }
    // 405 with a problem+json body.
    let r = s
        .http
        .delete(s.url("/v1/tasks"))
        .bearer_auth(ALICE)
        .send()
        .unwrap();
    problem(r, 405, "method-not-allowed");
    // `"args": []` and an absent `args` are the same request.
    let body = json!({"request_id": "args-same", "task": "line_count", "inputs": [input]});
    assert_eq!(s.run(ALICE, &body, "").status(), 200);
    let mut with_empty = body.clone();
    with_empty["args"] = json!([]);
    let r = s.run(ALICE, &with_empty, "");
    assert_eq!(r.status(), 200, "{}", r.text().unwrap());
    // An artifact request answered 409 is audited as a denial.
    let failing = json!({"request_id": "no-artifact", "task": "summarize_csv", "inputs": [input], "code": "raise SystemExit(3)"});
    let v: Value = s.run(ALICE, &failing, "").json().unwrap();
    assert_eq!(v["status"], "exit_nonzero", "{v}");
    problem(
        s.get(ALICE, "/v1/runs/no-artifact/artifact"),
        409,
        "no-verified-artifact",
    );
    let (_, log) = audit(dir.path());
    let rec: Value = log
        .lines()
        .filter(|l| l.contains("\"artifact_read\"") && l.contains("\"no-artifact\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .next_back()
        .unwrap();
    assert_eq!(rec["decision"], "deny", "{rec}");
    // The log has no ANSI colour codes when stderr is not a terminal (here: a pipe).
    assert!(
        !s.stderr.lock().unwrap().contains('\x1b'),
        "ANSI escape codes in the service log"
    );
}

/// Issue #15, item 7: every metric family is present from start-up, at zero.
#[test]
fn metric_families_are_present_at_start_up() {
    let dir = common::tmp();
    let s = Server::start(dir.path(), "");
    let text = s
        .http
        .get(s.url("/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    for family in [
        "agentjail_runs_total",
        "agentjail_denials_total",
        "agentjail_sandbox_denials_total",
        "agentjail_auth_failures_total",
        "agentjail_unknown_outcomes_total",
        "agentjail_inputs_stored_total",
        "agentjail_replays_total",
        "agentjail_overload_refusals_total",
        "agentjail_audit_failures_total",
        "agentjail_runs_in_flight",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(family)),
            "{family} missing at start-up:\n{text}"
        );
    }
}

/// Reads from `c` until the peer closes; returns what arrived and how long it took (bounded
/// by `max`: then `None`).
fn read_until_closed(c: &mut std::net::TcpStream, max: Duration) -> Option<(String, Duration)> {
    use std::io::Read;
    let t = Instant::now();
    c.set_read_timeout(Some(max)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(0) => return Some((String::from_utf8_lossy(&got).into_owned(), t.elapsed())),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Some((String::from_utf8_lossy(&got).into_owned(), t.elapsed()));
            }
            Err(_) => return None,
        }
    }
}

/// Issue #15, item 6: slow and abusive clients are bounded: a client that stalls in its
/// headers (slowloris), an idle keep-alive connection and a stalled body are cut off; a huge
/// `Content-Length` is refused with 413 before any body is sent; connections beyond the
/// limit are closed; and a flood of unauthenticated requests leaves a few aggregated
/// `auth_failure` records that still count every failure.
#[test]
fn slow_and_abusive_clients_are_bounded() {
    use std::io::Write;
    use std::net::TcpStream;
    let dir = common::tmp();
    let s = Server::start(
        dir.path(),
        "header_timeout_seconds = 1\nbody_timeout_seconds = 1\nmax_connections = 4\nauth_failure_audit_seconds = 2",
    );
    let addr = s.base.trim_start_matches("http://").to_string();
    let connect = || TcpStream::connect(&addr).unwrap();
    // Slowloris: half a header, then nothing.
    let mut c = connect();
    c.write_all(b"GET /v1/tasks HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let (_, took) = read_until_closed(&mut c, Duration::from_secs(10))
        .expect("a stalled header was not cut off within 10 s");
    assert!(took < Duration::from_secs(5), "{took:?}");
    // Idle keep-alive: one full request, then silence.
    let mut c = connect();
    c.write_all(
        format!("GET /v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n\r\n")
            .as_bytes(),
    )
    .unwrap();
    let (got, _) = read_until_closed(&mut c, Duration::from_secs(10))
        .expect("an idle keep-alive connection was not closed within 10 s");
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    // A stalled body: 408 (or a close) within the body timeout.
    let mut c = connect();
    c.write_all(format!("POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"req").as_bytes())
        .unwrap();
    let (got, took) = read_until_closed(&mut c, Duration::from_secs(10))
        .expect("a stalled body was not cut off within 10 s");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(got.is_empty() || got.starts_with("HTTP/1.1 408"), "{got}");
    // A huge Content-Length: 413 at once, without sending the body.
    let mut c = connect();
    c.write_all(format!("POST /v1/inputs?name=a.csv&media_type=text/csv HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\nContent-Length: 1000000000000\r\n\r\n").as_bytes())
        .unwrap();
    let (got, took) = read_until_closed(&mut c, Duration::from_secs(10))
        .expect("a huge Content-Length was not answered within 10 s");
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    // The connection limit, on a service of its own whose header timeout is long (with the
    // 1-s timeout above, a loaded machine could cut the held connections before the fifth
    // arrives, and the fifth would then rightly be served): 4 open (stalled) connections; a
    // fifth is closed unanswered; once the 4 are closed by their client, it answers again.
    {
        let dir = common::tmp();
        let s = Server::start(
            dir.path(),
            "header_timeout_seconds = 60\nmax_connections = 4",
        );
        let addr = s.base.trim_start_matches("http://").to_string();
        let connect = || TcpStream::connect(&addr).unwrap();
        let mut held: Vec<TcpStream> = (0..4)
            .map(|_| {
                let mut c = connect();
                c.write_all(b"GET /v1/tasks HTTP/1.1\r\n").unwrap();
                c
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        let mut fifth = connect();
        let _ = fifth.write_all(
            format!("GET /v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n\r\n")
                .as_bytes(),
        );
        let (got, _) = read_until_closed(&mut fifth, Duration::from_secs(10))
            .expect("the connection beyond the limit was not closed");
        assert!(got.is_empty(), "served beyond max_connections: {got}");
        for c in &held {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        held.clear();
        let t = Instant::now();
        let answered = || {
            s.http
                .get(s.url("/v1/tasks"))
                .bearer_auth(ALICE)
                .send()
                .is_ok_and(|r| r.status() == 200)
        };
        while !answered() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "connections were not released"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    // 300 unauthenticated requests: every one refused and counted; a bounded number of
    // audit records, whose counts add up to 300.
    let (_, before) = audit(dir.path());
    let before = before.lines().count();
    for i in 0..300 {
        let tok = if i % 2 == 0 { "wrong" } else { "" };
        let r = s.get(tok, "/v1/tasks");
        assert_eq!(r.status(), 401);
    }
    std::thread::sleep(Duration::from_secs(3)); // one window: the flusher writes the rest
    let (path, log) = audit(dir.path());
    agentjail_server::audit::verify_chain(&path).unwrap();
    let records: Vec<Value> = log
        .lines()
        .skip(before)
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["event"] == "auth_failure")
        .collect();
    assert!(
        !records.is_empty() && records.len() <= 4,
        "{} auth_failure records for 300 failures",
        records.len()
    );
    let counted: u64 = records
        .iter()
        .map(|r| {
            r["reason"]
                .as_str()
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert_eq!(counted, 300, "{records:?}");
    let metrics = s
        .http
        .get(s.url("/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        metrics.contains("agentjail_auth_failures_total 300"),
        "{metrics}"
    );
}

/// The service's own database, opened by the test: to inject a store failure (a trigger) or to
/// hold its write lock, as a slow or failing store would.
fn service_db(dir: &Path) -> rusqlite::Connection {
    let db = rusqlite::Connection::open(dir.join("data/private/agentjail.db")).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    db
}

/// A fixed-program task whose payload writes its output at once (the sentinel of its having
/// run) and then stays alive for `seconds`, its command line marked with `marker`.
fn sentinel_task(marker: &str, seconds: u32) -> String {
    format!(
        r#"
[tasks.sentinel]
description = "Writes its output at once, then stays alive"
code = "forbidden"
command = ["/usr/bin/python3", "-c", "import json, time; json.dump({{'ran': True}}, open('/output/o.json', 'w')); time.sleep({seconds})", "{marker}"]
allowed_tenants = ["acme"]
[tasks.sentinel.output]
path = "/output/o.json"
media_type = "application/json"
max_bytes = 1000
[tasks.sentinel.limits]
seconds = 60
"#
    )
}

/// Issue #15, the runner's start: the runner is spawned before the run is recorded as started
/// (its start-up overlaps the store's write), but it reads its manifest before anything else
/// and gets it only once the `running` mark is committed. Here the store refuses that mark for
/// one request (a trigger in the service's own database): the runner must end without running
/// the payload — no payload process ever seen in /proc, no sentinel output — and the run is
/// recorded `setup_error`, never left `queued`. A control run of the same task first shows that
/// the payload does run, is seen, and writes its sentinel when nothing fails.
#[test]
fn a_failed_running_mark_stops_the_started_runner_before_its_payload() {
    let _serial = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::tmp();
    let data = dir.path().join("data");
    let marker = format!(
        "mark-marker-{}",
        dir.path().file_name().unwrap().to_string_lossy()
    );
    let s = Server::start_with(
        dir.path(),
        "max_concurrent_runs = 2",
        &sentinel_task(&marker, 2),
    );
    let executions = Executions::watch(marker.clone());
    let body = |id: &str| json!({"request_id": id, "task": "sentinel", "inputs": []});
    let v: Value = s.run(ALICE, &body("control"), "").json().unwrap();
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["artifact"]["json"]["ran"], true, "{v}");
    assert_eq!(
        executions.count(),
        1,
        "the control run's payload was not seen"
    );

    service_db(dir.path())
        .execute_batch(
            "CREATE TRIGGER refuse_mark BEFORE UPDATE OF status ON runs
             WHEN NEW.status = 'running' AND OLD.request_id = 'mark-fails'
             BEGIN SELECT RAISE(ABORT, 'injected: the running mark fails'); END;",
        )
        .unwrap();
    let v: Value = s.run(ALICE, &body("mark-fails"), "").json().unwrap();
    assert_eq!(v["status"], "setup_error", "{v}");
    assert!(
        v["reason"].as_str().unwrap_or("").contains("not run"),
        "{v}"
    );
    let job = data.join("jobs").join(v["job_id"].as_str().unwrap());
    // The runner had been started (before the mark) and ended for want of its manifest (its
    // one line on stderr, in the job's log).
    let err = std::fs::read_to_string(job.join("stderr.log")).unwrap();
    assert!(err.contains("stdin ended before the manifest"), "{err}");
    // Longer than the watcher's period: a payload that had started would have been seen.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        executions.finish(),
        1,
        "the payload ran although its run was never recorded as started"
    );
    assert!(!job.join("out").join("o.json").exists());
    assert!(files_containing(&job, b"\"ran\"").is_empty());
    let (path, log) = audit(dir.path());
    agentjail_server::audit::verify_chain(&path).unwrap();
    let starts = log
        .lines()
        .filter(|l| l.contains("\"run_start\"") && l.contains("\"mark-fails\""))
        .count();
    assert_eq!(starts, 0, "a run that never started has a run_start record");
    assert!(
        log.lines()
            .any(|l| l.contains("\"run_end\"") && l.contains("\"mark-fails\"")),
        "no run_end record for the refused run"
    );
}

/// Issue #15, the run slot: it is released as soon as the runner exits; reading the report,
/// copying the outputs, recording the outcome and auditing happen outside it. With one slot, a
/// first run holds it until the test kills its payload, a second waits queued. The test then
/// holds the database's write lock (as a slow store would be slow), so the first run's outcome
/// cannot be recorded; the second run's runner must still be started (seen in /proc, in its
/// job folder) while the first run's record still reads `running`. Then the lock is let go and
/// both end as they should. On a service that holds the slot until the outcome is recorded,
/// the second runner never starts while the lock is held.
#[test]
fn the_run_slot_is_free_while_the_previous_outcome_is_recorded() {
    let _serial = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let (dir, marker) = marked_tmp("slot-marker");
    let s = Server::start_with(
        dir.path(),
        "max_concurrent_runs = 1\nmax_queued_runs = 2",
        &sentinel_task(&marker, 600),
    );
    let a: Value = s
        .run(
            ALICE,
            &json!({"request_id": "first", "task": "sentinel", "inputs": []}),
            "?wait=false",
        )
        .json()
        .unwrap();
    assert!(a["job_id"].is_string(), "{a}");
    wait_status(&s, "first", "running");
    let b: Value = s
        .run(
            ALICE,
            &json!({"request_id": "second", "task": "slow", "inputs": [],
                "code": "open('/output/o.json', 'w').write('{}')"}),
            "?wait=false",
        )
        .json()
        .unwrap();
    assert!(b["job_id"].is_string(), "{b}");
    assert_eq!(
        s.get(ALICE, "/v1/runs/second").json::<Value>().unwrap()["status"],
        "queued"
    );
    // This service's runners and their sandboxes' inits (a clone of the runner: the same
    // command line, which names the data directory); so far only the first run's.
    let data_s = dir.path().join("data").display().to_string();
    let runners = || -> Vec<ProcId> {
        procs_matching(&data_s)
            .into_iter()
            .filter(|(_, c)| c.contains(" run --lifeline "))
            .map(|(id, _)| id)
            .collect()
    };
    let first = runners();
    assert!(!first.is_empty(), "the first run's runner is not seen");
    let second = || -> Vec<ProcId> {
        runners()
            .into_iter()
            .filter(|id| !first.contains(id))
            .collect()
    };
    // No HTTP from here until the lock is let go: the service's one database connection
    // waits for it, and so would every request.
    let db = service_db(dir.path());
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    kill_payload(&marker);
    // The service waits up to 10 s for the lock (its busy timeout); look for 6 s.
    let deadline = Instant::now() + Duration::from_secs(6);
    while second().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the second run's runner was not started while the first run's outcome waited to be recorded: the run slot is held through the recording"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let first_status: String = db
        .query_row(
            "SELECT status FROM runs WHERE request_id = 'first'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        first_status, "running",
        "the first run's outcome was recorded although the database was locked"
    );
    assert!(
        runners().iter().all(|id| !first.contains(id)),
        "the first run's runner is still alive"
    );
    db.execute_batch("ROLLBACK").unwrap();
    drop(db);
    wait_status(&s, "first", "signaled");
    let v = wait_status(&s, "second", "ok");
    assert!(v.get("started_at").is_some(), "{v}");
    let (path, _) = audit(dir.path());
    agentjail_server::audit::verify_chain(&path).unwrap();
}

/// Issue #15, crash semantics of a run's end: no outcome may be recorded that the audit chain
/// does not account for, whatever moment the service dies at. The audit log is a file beside
/// the database, so the record is appended first. The test holds the database's write lock
/// while a run ends (its payload killed by the test), so the outcome cannot be recorded: its
/// `run_end` must still be appended (on a service that records first it is not, for the
/// 10 s of the service's busy timeout). The service is then killed mid-write; its restart
/// marks the run `unknown` and audits that, and the chain verifies.
#[test]
fn a_service_killed_while_recording_an_outcome_has_audited_it() {
    let _serial = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let (dir, marker) = marked_tmp("end-marker");
    let task = sentinel_task(&marker, 600);
    let mut s = Server::start_with(dir.path(), "max_concurrent_runs = 1", &task);
    let body = json!({"request_id": "end-1", "task": "sentinel", "inputs": []});
    assert_eq!(s.run(ALICE, &body, "?wait=false").status(), 202);
    wait_status(&s, "end-1", "running");
    let records = |event: &str| {
        audit(dir.path())
            .1
            .lines()
            .filter(|l| l.contains(&format!("\"event\":\"{event}\"")) && l.contains("\"end-1\""))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while records("run_start") != 1 {
        assert!(Instant::now() < deadline, "run_start never audited");
        std::thread::sleep(Duration::from_millis(20));
    }
    // No HTTP from here until the service is killed: its database connection waits.
    let db = service_db(dir.path());
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    kill_payload(&marker);
    let deadline = Instant::now() + Duration::from_secs(6);
    while records("run_end") != 1 {
        assert!(
            Instant::now() < deadline,
            "the run ended but its run_end was not appended while its outcome waited to be recorded"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let status: String = db
        .query_row(
            "SELECT status FROM runs WHERE request_id = 'end-1'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(status, "running", "the outcome was recorded under the lock");
    // Appended before the outcome's write, not after it gave up on the lock.
    let log = s.stderr.lock().unwrap().clone();
    assert!(
        !log.contains("recording a finished run failed"),
        "the run_end followed a failed write of the outcome:\n{log}"
    );
    s.kill(); // SIGKILL, while the outcome waits for the lock
    db.execute_batch("ROLLBACK").unwrap();
    drop(db);
    drop(s);
    let s = Server::start_with(dir.path(), "max_concurrent_runs = 1", &task);
    let v: Value = s.get(ALICE, "/v1/runs/end-1").json().unwrap();
    assert_eq!(v["status"], "unknown", "{v}");
    assert_eq!(records("run_end"), 1);
    assert_eq!(
        records("run_unknown"),
        1,
        "the restart's marking is audited"
    );
    let (path, _) = audit(dir.path());
    agentjail_server::audit::verify_chain(&path).unwrap();
}

/// Issue #15, crash semantics of the start-up marking: a run the service finds in flight at
/// start-up becomes `unknown`, and that marking must never be recorded without its
/// `run_unknown`. The log is a file beside the database, so the records are appended first.
/// The service is killed mid-run; its restart finds the run while the test holds the
/// database's write lock, so the marking cannot be committed: the record must be appended all
/// the same (on a service that marks first it is not, for the 10 s of its busy timeout). The
/// restart is killed there; the next one finds the run in flight again, audits and marks it.
#[test]
fn a_service_killed_while_marking_its_runs_unknown_has_audited_them() {
    let _serial = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let (dir, marker) = marked_tmp("startup-marker");
    let task = sentinel_task(&marker, 600);
    let mut s = Server::start_with(dir.path(), "max_concurrent_runs = 1", &task);
    let body = json!({"request_id": "mark-1", "task": "sentinel", "inputs": []});
    assert_eq!(s.run(ALICE, &body, "?wait=false").status(), 202);
    wait_status(&s, "mark-1", "running");
    s.kill(); // SIGKILL mid-run
    drop(s);
    let records = || {
        audit(dir.path())
            .1
            .lines()
            .filter(|l| l.contains("\"event\":\"run_unknown\"") && l.contains("\"mark-1\""))
            .count()
    };
    let db = service_db(dir.path());
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    // The restart, by hand: it must not get past its start-up marking.
    let cfg = write_config(dir.path(), &(config("max_concurrent_runs = 1") + &task));
    let mut restart = Command::new(common::bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(6);
    while records() != 1 {
        assert!(
            restart.try_wait().unwrap().is_none(),
            "the restart exited while the database was locked"
        );
        assert!(
            Instant::now() < deadline,
            "the restart found the run in flight but did not audit its marking before committing it"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let status: String = db
        .query_row(
            "SELECT status FROM runs WHERE request_id = 'mark-1'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        status, "running",
        "the marking was committed under the lock"
    );
    restart.kill().unwrap(); // SIGKILL, mid-marking
    restart.wait().unwrap();
    db.execute_batch("ROLLBACK").unwrap();
    drop(db);
    let s = Server::start_with(dir.path(), "max_concurrent_runs = 1", &task);
    let v: Value = s.get(ALICE, "/v1/runs/mark-1").json().unwrap();
    assert_eq!(v["status"], "unknown", "{v}");
    assert_eq!(
        records(),
        2,
        "each start-up that found the run in flight audited it"
    );
    let (path, _) = audit(dir.path());
    agentjail_server::audit::verify_chain(&path).unwrap();
}

/// An operator's reconcile never lands without its audit record. On SQLite (the audit log is
/// a file beside the database) the record is appended first, after the run was found still
/// `unknown`, and the change committed after it: a service killed between the two leaves the
/// record and the run still `unknown` (reconcile it again), never a changed run that no record
/// accounts for. The database's write lock is held while the operator abandons the run, and the
/// service is killed while it waits on it.
#[test]
fn a_reconcile_is_never_committed_without_its_record() {
    let _serial = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let (dir, marker) = marked_tmp("reconcile-marker");
    let task = sleeper_task(&marker, 30);
    let mut s = Server::start_with(dir.path(), "max_concurrent_runs = 1", &task);
    let body = json!({"request_id": "rec-1", "task": "sleeper", "inputs": [], "args": ["20"]});
    assert_eq!(s.run(ALICE, &body, "?wait=false").status(), 202);
    wait_status(&s, "rec-1", "running");
    s.kill(); // SIGKILL mid-run: the restart marks it unknown
    drop(s);
    let mut s = Server::start_with(dir.path(), "max_concurrent_runs = 1", &task);
    assert_eq!(
        s.get(ALICE, "/v1/runs/rec-1").json::<Value>().unwrap()["status"],
        "unknown"
    );
    let records = || {
        audit(dir.path())
            .1
            .lines()
            .filter(|l| l.contains("\"event\":\"reconcile\"") && l.contains("\"rec-1\""))
            .count()
    };
    let db = service_db(dir.path());
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    let (http, url) = (s.http.clone(), s.url("/v1/runs/rec-1/reconcile"));
    let abandon = std::thread::spawn(move || {
        let _ = http
            .post(url)
            .bearer_auth(ALICE)
            .json(&json!({ "action": "abandon" }))
            .send();
    });
    // Within the database's 10 s busy timeout, plus that much again in case the start-up
    // sweep took the connection just before the lock and waits on it first.
    let deadline = Instant::now() + Duration::from_secs(25);
    while records() != 1 {
        assert!(
            Instant::now() < deadline,
            "the abandon waits on the database without its record appended first"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    s.kill(); // SIGKILL while the change waits on the lock
    db.execute_batch("ROLLBACK").unwrap();
    drop(db);
    let _ = abandon.join();
    let s = Server::start_with(dir.path(), "max_concurrent_runs = 1", &task);
    let v: Value = s.get(ALICE, "/v1/runs/rec-1").json().unwrap();
    assert_eq!(v["status"], "unknown", "{v}");
    // The operator decides again; this time it lands, with its own record.
    let r = s
        .http
        .post(s.url("/v1/runs/rec-1/reconcile"))
        .bearer_auth(ALICE)
        .json(&json!({ "action": "abandon" }))
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().unwrap());
    assert_eq!(
        s.get(ALICE, "/v1/runs/rec-1").json::<Value>().unwrap()["status"],
        "abandoned"
    );
    assert_eq!(records(), 2);
    let (path, _) = audit(dir.path());
    agentjail_server::audit::verify_chain(&path).unwrap();
}

/// A client that goes away mid-request does not cut the service's work short: a submission
/// whose client disconnects while its run is being recorded (here: while the database's write
/// lock, held by the test, holds up the insert) still has its acceptance audited and its run
/// executed, never a run recorded `queued` that nothing will ever execute (until a restart
/// marks it `unknown`) and no record accounts for.
#[test]
fn a_client_that_disconnects_mid_request_leaves_no_half_done_work() {
    let _serial = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let (dir, marker) = marked_tmp("disconnect-marker");
    let s = Server::start_with(
        dir.path(),
        "max_concurrent_runs = 1",
        &sleeper_task(&marker, 20),
    );
    let db = service_db(dir.path());
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    let impatient = reqwest::blocking::Client::builder()
        .timeout(Duration::from_millis(1500))
        .build()
        .unwrap();
    let body = json!({"request_id": "gone-1", "task": "sleeper", "inputs": [], "args": ["0"]});
    let r = impatient
        .post(s.url("/v1/runs?wait=false"))
        .bearer_auth(ALICE)
        .json(&body)
        .send();
    assert!(r.is_err(), "answered while the database was locked: {r:?}");
    // The client is gone; the insert it started goes through once the lock is released.
    db.execute_batch("ROLLBACK").unwrap();
    drop(db);
    let v = wait_status(&s, "gone-1", "ok");
    assert_eq!(v["artifact"]["json"]["args"], json!([marker, "0"]), "{v}");
    let (path, log) = audit(dir.path());
    agentjail_server::audit::verify_chain(&path).unwrap();
    for event in ["run_accepted", "run_start", "run_end"] {
        assert!(
            log.lines()
                .any(|l| l.contains(&format!("\"event\":\"{event}\"")) && l.contains("\"gone-1\"")),
            "no {event} record for the run"
        );
    }
}

/// The other side of detaching handlers: a client that leaves does not leave a waiter behind.
/// Replays of a run in flight (`?wait=true`) whose clients disconnect stop waiting at once
/// (the run goes on), so they cannot pile up: with `max_connections = 3` (also the bound on
/// detached handlers), six such replays in a row leave room for a new submission, which is
/// accepted rather than answered `503`.
#[test]
fn clients_that_leave_a_waiting_replay_leave_no_waiter_behind() {
    let _serial = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let (dir, marker) = marked_tmp("waiter-marker");
    let s = Server::start_with(
        dir.path(),
        "max_concurrent_runs = 2\nmax_connections = 3",
        &sleeper_task(&marker, 30),
    );
    let body = |id: &str, secs: &str| json!({"request_id": id, "task": "sleeper", "inputs": [], "args": [secs]});
    assert_eq!(
        s.run(ALICE, &body("long", "20"), "?wait=false").status(),
        202
    );
    wait_status(&s, "long", "running");
    let impatient = reqwest::blocking::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    for _ in 0..6 {
        let r = impatient
            .post(s.url("/v1/runs?wait=true"))
            .bearer_auth(ALICE)
            .json(&body("long", "20"))
            .send();
        assert!(r.is_err(), "a replay of a running run answered: {r:?}");
    }
    std::thread::sleep(Duration::from_millis(500));
    let r = s.run(ALICE, &body("next", "0"), "?wait=false");
    assert_eq!(r.status(), 202, "{}", r.text().unwrap());
    wait_status(&s, "next", "ok");
}

/// Issue #15, performance (per-run file-system work): the task's output schema is written once
/// per schema, at start-up, content-addressed (`DATA/schemas/<sha256>.json`, 0600 in a 0700
/// folder), and never into a job folder; runs still have their output checked against it (the
/// sentinel: a schema that the payload's output breaks makes the run `output_rejected`, one it
/// meets makes it `ok`).
#[test]
fn the_output_schema_is_written_once_per_schema_not_per_job() {
    let _serial = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::tmp();
    let data = dir.path().join("data");
    const SCHEMA: &str = r#"{"type": "object", "required": ["mode"]}"#;
    let s = Server::start_with(dir.path(), "", &echo_task("a", SCHEMA));
    let schemas = data.join("schemas");
    let files = |d: &Path| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(d)
            .unwrap_or_else(|e| panic!("{}: {e}", d.display()))
            .map(|e| e.unwrap().path())
            .collect();
        v.sort();
        v
    };
    let before = files(&schemas);
    // The test configuration's other tasks have schemas too: one file per schema.
    let of_schema = |schema: &str| -> Vec<PathBuf> {
        let want: Value = serde_json::from_str(schema).unwrap();
        files(&schemas)
            .into_iter()
            .filter(|f| {
                serde_json::from_slice::<Value>(&std::fs::read(f).unwrap()).ok()
                    == Some(want.clone())
            })
            .collect()
    };
    let mine = of_schema(SCHEMA);
    assert_eq!(mine.len(), 1, "one schema, one file: {before:?}");
    let file = &mine[0];
    let text = std::fs::read(file).unwrap();
    assert_eq!(
        file.file_name().unwrap().to_string_lossy(),
        format!("{}.json", sha256_hex(&text)),
        "the schema file is named by its content"
    );
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&schemas), 0o700);
    assert_eq!(mode(file), 0o600);
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(file).unwrap().ino();
    for i in 0..2 {
        let id = format!("schema-once-{i}");
        let body = json!({"request_id": id, "task": "echo", "inputs": [], "args": ["0"]});
        assert_eq!(s.run(ALICE, &body, "").status(), 200);
        let v = wait_status(&s, &id, "ok");
        let job = data.join("jobs").join(v["job_id"].as_str().unwrap());
        assert!(
            !job.join("output.schema.json").exists(),
            "a job folder holds a copy of the schema"
        );
    }
    assert_eq!(files(&schemas), before, "a run wrote a schema file");
    assert_eq!(
        std::fs::metadata(file).unwrap().ino(),
        ino,
        "a run rewrote the schema file"
    );
    drop(s);
    // The sentinel: the schema is applied (the payload writes {"mode": "a"}, a string).
    let strict = r#"{"type": "object", "properties": {"mode": {"type": "integer"}}}"#;
    let s = Server::start_with(dir.path(), "", &echo_task("a", strict));
    let body = json!({"request_id": "schema-strict", "task": "echo", "inputs": [], "args": ["0"]});
    s.run(ALICE, &body, "");
    wait_status(&s, "schema-strict", "output_rejected");
    assert_eq!(of_schema(strict).len(), 1, "{:?}", files(&schemas));
    assert_eq!(files(&schemas).len(), before.len() + 1);
}

/// Issue #15, performance (per-run file-system work): the runner's stdout and stderr come back
/// through pipes that the service drains into the job folder; a log file is created only once
/// its stream has a first byte, 0600, in a job folder (0700) created only then, and holds what
/// the command wrote (the sentinels), bounded. A run that writes nothing costs no inode at all:
/// its results come back over the lifeline.
#[test]
fn run_logs_are_created_only_for_streams_that_have_output() {
    let _serial = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::tmp();
    let data = dir.path().join("data");
    let task = r#"
[tasks.talk]
description = "Runs the request's code"
code = "allowed"
command = ["/usr/bin/python3", "/input/code.py"]
allowed_tenants = ["acme"]
[tasks.talk.output]
path = "/output/o.json"
media_type = "application/json"
max_bytes = 1000
"#;
    let s = Server::start_with(dir.path(), "", task);
    let job_of = |id: &str, code: &str| {
        let body = json!({"request_id": id, "task": "talk", "inputs": [], "code": code});
        s.run(ALICE, &body, "");
        let v = wait_status(&s, id, "ok");
        data.join("jobs").join(v["job_id"].as_str().unwrap())
    };
    let silent = job_of(
        "logs-silent",
        "import json\njson.dump({}, open('/output/o.json', 'w'))\n",
    );
    assert!(
        !silent.exists(),
        "a run that wrote nothing has a job folder: {:?}",
        std::fs::read_dir(&silent).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
    let talk = job_of(
        "logs-talk",
        "import json, sys\nprint('zz-out-sentinel')\nprint('zz-err-sentinel', file=sys.stderr)\nsys.stdout.write('x' * 3000000)\njson.dump({}, open('/output/o.json', 'w'))\n",
    );
    let out = std::fs::read(talk.join("stdout.log")).unwrap();
    let err = std::fs::read_to_string(talk.join("stderr.log")).unwrap();
    assert!(
        out.starts_with(b"zz-out-sentinel\n"),
        "{:?}",
        &out[..out.len().min(64)]
    );
    assert!(
        out.len() < 2 * 1024 * 1024,
        "stdout.log is not bounded: {} bytes",
        out.len()
    );
    assert!(err.contains("zz-err-sentinel"), "{err}");
    assert_eq!(
        std::fs::metadata(&talk).unwrap().permissions().mode() & 0o7777,
        0o700
    );
    for log in ["stdout.log", "stderr.log"] {
        let m = std::fs::metadata(talk.join(log))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777;
        assert_eq!(m, 0o600, "{log} is {m:o}");
    }
}

/// A client that stops reading a large answer (a 24 MB artifact, more than the loopback
/// socket buffers hold) is disconnected once nothing could be written to it for
/// `body_timeout_seconds`: a reader that never reads cannot hold a connection slot (or the
/// answer's buffers) forever. The stall is counted in `/metrics`.
#[test]
fn a_client_that_stops_reading_is_disconnected() {
    use std::io::{Read, Write};
    let dir = common::tmp();
    let token = "tok-stall-reader-1";
    let cfg = format!(
        "[server]\nbody_timeout_seconds = 1\n\n[tenants.acme]\n{alice}{big}[tasks.big.output]\npath = \"/output/o.json\"\nmedia_type = \"application/json\"\nmax_bytes = 30000000\n[tasks.big.limits]\nseconds = 60\noutput_mb = 32\nmemory_mb = 512\n",
        alice = actor("alice", "acme", token, false),
        big = fixed_task(
            "big",
            "Writes a 24 MB artifact",
            r#"["/usr/bin/python3", "-c", "import json; json.dump({'pad': 'x' * 24000000}, open('/output/o.json', 'w'))"]"#,
            r#"allowed_tenants = ["acme"]"#,
        ),
    );
    let s = common::serve::Serve::start(
        &common::serve::write_config(dir.path(), &cfg),
        &dir.path().join("data"),
        &[],
    );
    let api = Api::new(&s.base);
    let r = api.run(
        token,
        &json!({"request_id": "big-1", "task": "big", "inputs": []}),
        "",
    );
    let v: Value = r.json().unwrap();
    assert_eq!(v["status"], "ok", "{v}");
    // Ask for the artifact, read nothing for 5 s (the server fills the socket's buffers, then
    // stalls), then read what there is.
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut c = std::net::TcpStream::connect(&addr).unwrap();
    c.write_all(
        format!("GET /v1/runs/big-1/artifact HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n")
            .as_bytes(),
    )
    .unwrap();
    std::thread::sleep(Duration::from_secs(5));
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    let t = Instant::now();
    loop {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "still reading after 60 s"
        );
    }
    let head = String::from_utf8_lossy(&got[..got.len().min(200)]).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        got.len() < 24_000_000,
        "the whole artifact ({} bytes) was sent to a client that read nothing for 5 s: it was not disconnected",
        got.len()
    );
    let metrics = api.metrics();
    assert!(
        metrics
            .lines()
            .any(|l| l == "agentjail_http_write_stalls_total 1"),
        "{metrics}"
    );
}
