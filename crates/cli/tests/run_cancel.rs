//! `POST /v1/runs/{request_id}/cancel` on one node (issue #33): a queued run never starts; a
//! running one is killed, its whole sandbox gone (checked from /proc), and ends `cancelled`
//! with what it printed so far kept; a repeated cancel answers the same record; a run that
//! ended otherwise is not cancelled (409); another tenant's run is the same 404 as a missing
//! one, and another actor of the run's tenant may not cancel it (403). (The fleet's cancel, across nodes, is in fleet.rs.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::serve::{Api, Serve, actor, sleeper_task, write_config};
use common::{payloads, wait_payloads};

use std::time::{Duration, Instant};

use serde_json::{Value, json};

const ALICE: &str = "tok-alice-cancel-93b1d0";
const BOB: &str = "tok-bob-cancel-1c44e2";
const CAROL: &str = "tok-carol-cancel-6b0f3a";

#[test]
fn queued_and_running_runs_are_cancelled_and_the_sandbox_is_gone() {
    let dir = common::tmp();
    let marker = format!("cancel-marker-{}", std::process::id());
    let cfg = format!(
        "[server]\nmax_concurrent_runs = 1\n\n[tenants.acme]\n[tenants.beta]\n{}{}{}{}",
        actor("alice", "acme", ALICE, false),
        actor("bob", "beta", BOB, false),
        actor("carol", "acme", CAROL, false),
        // Its stdout shown (a fixed program shows none by default).
        sleeper_task(&marker, 60).replace("max_args = 1\n", "max_args = 1\nstdout_bytes = 64\n")
    );
    let cfg = write_config(dir.path(), &cfg);
    let s = Serve::start(&cfg, &dir.path().join("data"), &[]);
    let api = Api::new(&s.base);
    let submit = |id: &str, secs: &str| {
        let r = api.run(
            ALICE,
            &json!({"request_id": id, "task": "sleeper", "args": [secs]}),
            "?wait=false",
        );
        assert_eq!(r.status(), 202);
    };
    let cancel = |token: &str, id: &str| -> (u16, Value) {
        let r = api
            .http
            .post(api.url(&format!("/v1/runs/{id}/cancel")))
            .bearer_auth(token)
            .send()
            .unwrap();
        (r.status().as_u16(), r.json().unwrap_or(Value::Null))
    };
    // One slot: the first runs, the second waits for it.
    submit("long", "50");
    wait_payloads(&marker, 1, 30);
    submit("waiting", "0");
    assert_eq!(api.status_of(ALICE, "waiting")["status"], "queued");

    // Another tenant cannot cancel it (the 404 of a missing run).
    let (code, foreign) = cancel(BOB, "long");
    let (code2, missing) = cancel(BOB, "nope");
    assert_eq!((code, code2), (404, 404));
    assert_eq!(foreign, missing);
    // Another actor of the same tenant reads it, but may not stop it.
    assert_eq!(api.status_of(CAROL, "long")["status"], "running");
    let (code, p) = cancel(CAROL, "long");
    assert_eq!(code, 403, "{p}");

    // The queued one never starts.
    let (code, v) = cancel(ALICE, "waiting");
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["status"], "cancelled", "{v}");
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains("before the run started"),
        "{v}"
    );
    assert!(v.get("started_at").is_none(), "{v}");

    // The running one is killed: its payload is gone, what it printed is kept.
    let t = Instant::now();
    let (code, v) = cancel(ALICE, "long");
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["status"], "cancelled", "{v}");
    assert!(v["reason"].as_str().unwrap().contains("killed"), "{v}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(payloads(&marker).is_empty(), "{:?}", payloads(&marker));
    assert_eq!(v["stdout"]["bytes"], 4, "what it printed so far: {v}");
    let log = api.get(ALICE, "/v1/runs/long/logs?stream=stdout");
    assert_eq!(log.bytes().unwrap().as_ref(), b"ran\n");
    // The slot is free again, and the cancelled one never ran.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(api.status_of(ALICE, "waiting")["status"], "cancelled");

    // Idempotent; final.
    let (code, again) = cancel(ALICE, "long");
    assert_eq!(code, 200);
    assert_eq!(again["finished_at"], v["finished_at"]);
    submit("short", "0");
    let done = api.wait_status(ALICE, "short", "ok", 30);
    assert_eq!(done["status"], "ok");
    let (code, p) = cancel(ALICE, "short");
    assert_eq!(code, 409, "{p}");
    assert_eq!(
        p["type"], "https://agentjail.dev/problems/not-cancellable",
        "{p}"
    );

    // Audited.
    let audit = std::fs::read_to_string(dir.path().join("data/private/audit.jsonl")).unwrap();
    assert!(
        audit
            .lines()
            .any(|l| l.contains("\"run_cancel\"") && l.contains("\"long\"")),
        "{audit}"
    );
}
