//! Sessions over HTTP (issue #34, stage 1b; docs/api.md "Sessions"): cells of a session share
//! a persistent `/work`, restored from the session's last checkpoint and collected into the
//! next one, each cell a run in its own right with a receipt that names the previous one.
//! Every claim is attacked through a real `agentjail serve` and real sandboxes: the workspace
//! persists; a retried cell runs once; a second cell while one runs is refused; another
//! tenant's or actor's session is the same 404 as a missing one; a session's cell never sees
//! another session's workspace; a tampered checkpoint is refused; an ended session takes no
//! cell; a fork starts from the cell it names; the receipt chain verifies; the workspace bound
//! holds across cells.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
use common::serve::{Api, Serve, actor, cell_code as code, json_output, sha256_hex, write_config};

use std::path::PathBuf;

use serde_json::{Value, json};

const ALICE: &str = "tok-alice-sessions-5c1d7e";
const CAROL: &str = "tok-carol-sessions-09ab4f";
const BOB: &str = "tok-bob-sessions-e3f2a8";

fn config() -> String {
    format!(
        r#"
[tenants.acme]
[tenants.beta]
{alice}{carol}{bob}
[tasks.py]
description = "Model-proposed Python"
code = "allowed"
command = ["/usr/bin/python3", "/input/code.py"]
allowed_actors = ["alice", "carol", "bob"]
stdout_bytes = 2048
{output}[tasks.py.limits]
seconds = 20
[tasks.py.session]
max_mb = 2
max_cells = 50

[tasks.once]
description = "Model-proposed Python, one cell per session"
code = "allowed"
command = ["/usr/bin/python3", "/input/code.py"]
allowed_actors = ["alice"]
{once_output}[tasks.once.session]
max_cells = 1

[tasks.fixed]
description = "A fixed program"
code = "forbidden"
command = ["/usr/bin/true"]
allowed_actors = ["alice"]
{fixed_output}"#,
        alice = actor("alice", "acme", ALICE, false),
        carol = actor("carol", "acme", CAROL, false),
        bob = actor("bob", "beta", BOB, false),
        output = json_output("py", "o.json", 1000),
        once_output = json_output("once", "o.json", 1000),
        fixed_output = json_output("fixed", "o.json", 1000),
    )
}

/// A service with sessions: `agentjail serve` on SQLite, or a fleet on a throwaway PostgreSQL
/// cluster (cells claimed from the database's queue, checkpoints in the database).
pub(crate) struct Env {
    _serve: Option<Serve>,
    fleet: Option<common::pg::Fleet>,
    _dir: Option<tempfile::TempDir>,
    data: PathBuf,
    api: Api,
}

fn start() -> Env {
    let dir = common::tmp();
    let cfg = write_config(dir.path(), &config());
    let data = dir.path().join("data");
    let serve = Serve::start(&cfg, &data, &[]);
    let api = Api::new(&serve.base);
    Env {
        _serve: Some(serve),
        fleet: None,
        _dir: Some(dir),
        data,
        api,
    }
}

/// [`start`] on PostgreSQL: `replicas` API replicas with `slots` run slots each and
/// `workers` workers. None when PostgreSQL is missing (fails under CI).
fn start_pg_with(slots: &str, replicas: usize, workers: usize) -> Option<Env> {
    let f = common::pg::Fleet::start(&config(), slots, replicas, workers)?;
    Some(Env {
        _serve: None,
        data: f.data.clone(),
        api: f.apis[0].clone(),
        fleet: Some(f),
        _dir: None,
    })
}

fn start_pg() -> Option<Env> {
    start_pg_with("2", 1, 0)
}

on_both_stores!(
    work_persists_a_retried_cell_runs_once_and_the_receipts_chain,
    a_second_cell_while_one_runs_is_refused_and_an_ended_session_takes_none,
    another_tenants_or_actors_session_is_the_same_404_as_a_missing_one,
    a_cell_never_sees_another_sessions_workspace,
    a_tampered_checkpoint_is_refused_before_anything_runs,
    a_fork_starts_from_the_cell_it_names,
    the_workspace_bound_holds_across_cells,
    ending_a_session_cancels_its_running_cell,
    of_cells_submitted_at_once_exactly_one_runs,
);

impl Env {
    /// The stored bytes of checkpoint `sha` (its file on SQLite, its row on PostgreSQL).
    fn checkpoint(&self, sha: &str) -> Vec<u8> {
        match &self.fleet {
            None => std::fs::read(
                self.data
                    .join("checkpoints")
                    .join(sha.trim_start_matches("sha256:")),
            )
            .expect("the checkpoint is stored under its digest"),
            Some(f) => f.checkpoint(sha),
        }
    }

    /// Overwrites the stored bytes of checkpoint `sha` (a tampering with the store).
    fn set_checkpoint(&self, sha: &str, bytes: &[u8]) {
        match &self.fleet {
            None => std::fs::write(
                self.data
                    .join("checkpoints")
                    .join(sha.trim_start_matches("sha256:")),
                bytes,
            )
            .unwrap(),
            Some(f) => f.set_checkpoint(sha, bytes),
        }
    }

    fn send(
        &self,
        method: reqwest::Method,
        token: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        self.api.send(method, token, path, body)
    }

    fn open(&self, token: &str, request_id: &str) -> Value {
        self.open_task(token, request_id, "py")
    }

    fn open_task(&self, token: &str, request_id: &str, task: &str) -> Value {
        let (s, v) = self.send(
            reqwest::Method::POST,
            token,
            "/v1/sessions",
            Some(json!({"request_id": request_id, "task": task})),
        );
        assert_eq!(s, 201, "{v}");
        v
    }

    fn cell_raw(
        &self,
        token: &str,
        sid: &str,
        request_id: &str,
        body: &str,
        wait: bool,
    ) -> (u16, Value) {
        self.api.cell_raw(token, sid, request_id, body, wait)
    }

    /// A cell that must finish `ok`.
    fn cell(&self, sid: &str, request_id: &str, body: &str) -> Value {
        let (s, v) = self.cell_raw(ALICE, sid, request_id, body, true);
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["status"], "ok", "{v}");
        v
    }

    fn session(&self, sid: &str) -> Value {
        let (s, v) = self.send(
            reqwest::Method::GET,
            ALICE,
            &format!("/v1/sessions/{sid}"),
            None,
        );
        assert_eq!(s, 200, "{v}");
        v
    }
}

fn stdout(v: &Value) -> String {
    format!(
        "{}{}",
        v["stdout"]["head"].as_str().unwrap_or(""),
        v["stdout"]["tail"].as_str().unwrap_or("")
    )
}

fn work_persists_a_retried_cell_runs_once_and_the_receipts_chain(e: Env) {
    let s = e.open(ALICE, "open-1");
    let sid = s["session_id"].as_str().unwrap().to_string();
    assert!(sid.starts_with("ses_") && sid.len() >= 4 + 32, "{sid}");
    assert_eq!(s["state"], "open");
    assert_eq!(s["cells"], 0);
    assert!(s["workspace_sha256"].is_null());
    // A retry of the opening returns the same session.
    let (st, again) = e.send(
        reqwest::Method::POST,
        ALICE,
        "/v1/sessions",
        Some(json!({"request_id": "open-1", "task": "py"})),
    );
    assert_eq!(st, 200, "{again}");
    assert_eq!(again["session_id"], sid.as_str());

    let append = "open('/work/log.txt', 'a').write('step\\n')\nopen('/work/a.txt', 'w').write('from-cell-0')";
    let c0 = e.cell(&sid, "step-1", append);
    assert_eq!(c0["cell"], 0);
    assert!(c0["workspace"]["before"].is_null(), "{c0}");
    let after0 = c0["workspace"]["after"].as_str().unwrap().to_string();
    // The framework retries the same step: the recorded cell, nothing run again.
    let (st, r0) = e.cell_raw(ALICE, &sid, "step-1", append, true);
    assert_eq!(st, 200, "{r0}");
    assert_eq!(r0["cell"], 0);
    assert_eq!(r0["job_id"], c0["job_id"]);
    // The same request id with other code is a conflict.
    let (st, conflict) = e.cell_raw(ALICE, &sid, "step-1", "print(2)", true);
    assert_eq!(st, 409, "{conflict}");
    assert!(
        conflict["type"]
            .as_str()
            .unwrap()
            .ends_with("/request-id-conflict")
    );

    let c1 = e.cell(
        &sid,
        "step-2",
        "print('LINES=%d' % len(open('/work/log.txt').read().splitlines()))\nprint('A=' + open('/work/a.txt').read())",
    );
    assert_eq!(c1["cell"], 1);
    let out = stdout(&c1);
    assert!(
        out.contains("LINES=1"),
        "the retried cell ran twice, or /work was lost: {out}"
    );
    assert!(out.contains("A=from-cell-0"), "{out}");
    assert_eq!(c1["workspace"]["before"].as_str(), Some(after0.as_str()));
    assert_eq!(e.session(&sid)["cells"], 2);

    // The receipt chain: cell 1's receipt binds the session, its index and cell 0's receipt.
    let r0: Value = e
        .api
        .get(
            ALICE,
            &format!("/v1/runs/{}/receipt", c0["request_id"].as_str().unwrap()),
        )
        .json()
        .unwrap();
    let digest0 = format!("sha256:{}", sha256_hex(serde_jcs::to_vec(&r0).unwrap()));
    let predicate = |receipt: &Value| -> Value {
        use base64::Engine;
        let p = base64::engine::general_purpose::STANDARD
            .decode(receipt["payload"].as_str().unwrap())
            .unwrap();
        serde_json::from_slice::<Value>(&p).unwrap()["predicate"].clone()
    };
    let p0 = predicate(&c0["receipt"]);
    assert_eq!(p0["session"]["id"], sid.as_str());
    assert_eq!(p0["session"]["cell"], 0);
    assert!(p0["session"]["previous_receipt_sha256"].is_null(), "{p0}");
    let p1 = predicate(&c1["receipt"]);
    assert_eq!(p1["session"]["id"], sid.as_str());
    assert_eq!(p1["session"]["cell"], 1);
    assert_eq!(
        p1["session"]["previous_receipt_sha256"].as_str(),
        Some(digest0.as_str())
    );
    assert_eq!(p1["workspace"]["before"].as_str(), Some(after0.as_str()));
    let digest1 = format!(
        "sha256:{}",
        sha256_hex(serde_jcs::to_vec(&c1["receipt"]).unwrap())
    );
    assert_eq!(
        e.session(&sid)["last_receipt_sha256"].as_str(),
        Some(digest1.as_str())
    );
    // And `agentjail receipt verify` accepts it with the service's key.
    let dir = common::tmp();
    let key = e.data.join("private").join("receipt-key.pem");
    let pubkey = common::agentjail(&["receipt", "pubkey", "--key", key.to_str().unwrap()]);
    assert_eq!(pubkey.code, 0, "{}", pubkey.dump());
    let pem = dir.path().join("pub.pem");
    std::fs::write(&pem, &pubkey.stdout).unwrap();
    let rc = dir.path().join("receipt.json");
    std::fs::write(&rc, serde_json::to_vec(&c1["receipt"]).unwrap()).unwrap();
    let v = common::agentjail(&[
        "receipt",
        "verify",
        rc.to_str().unwrap(),
        "--pubkey",
        pem.to_str().unwrap(),
    ]);
    assert_eq!(v.code, 0, "{}", v.dump());
    // With the stored checkpoint it left, and by the third-party verifier too.
    let after1 = c1["workspace"]["after"].as_str().unwrap();
    let checkpoint = dir.path().join("checkpoint.tar");
    std::fs::write(&checkpoint, e.checkpoint(after1)).unwrap();
    let v = common::agentjail(&[
        "receipt",
        "verify",
        rc.to_str().unwrap(),
        "--pubkey",
        pem.to_str().unwrap(),
        "--workspace",
        checkpoint.to_str().unwrap(),
    ]);
    assert_eq!(v.code, 0, "{}", v.dump());
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../verify/tests/receipt_verify.py");
    let py = std::process::Command::new("python3")
        .arg(&script)
        .arg(&rc)
        .arg(&pem)
        .arg("--workspace")
        .arg(&checkpoint)
        .output()
        .expect("python3 runs");
    assert!(
        py.status.success(),
        "{}{}",
        String::from_utf8_lossy(&py.stdout),
        String::from_utf8_lossy(&py.stderr)
    );

    // A run request cannot take (or replay) the name of a cell's run.
    for id in [format!("{sid}-1"), format!("{sid}-2")] {
        let r = e.api.run(
            ALICE,
            &json!({"request_id": id, "task": "py", "code": "print(1)"}),
            "",
        );
        assert_eq!(r.status().as_u16(), 400, "{id}");
        let v: Value = r.json().unwrap();
        assert!(v["detail"].as_str().unwrap().contains("reserved"), "{v}");
    }

    // The cells, in order, a page at a time.
    let (st, page) = e.send(
        reqwest::Method::GET,
        ALICE,
        &format!("/v1/sessions/{sid}/cells?limit=1"),
        None,
    );
    assert_eq!(st, 200, "{page}");
    assert_eq!(page["cells"][0]["cell"], 0);
    let cursor = page["next_cursor"].as_str().unwrap();
    let (_, page2) = e.send(
        reqwest::Method::GET,
        ALICE,
        &format!("/v1/sessions/{sid}/cells?limit=1&cursor={cursor}"),
        None,
    );
    assert_eq!(page2["cells"][0]["cell"], 1, "{page2}");
    assert!(page2.get("next_cursor").is_none(), "{page2}");
}

fn a_second_cell_while_one_runs_is_refused_and_an_ended_session_takes_none(e: Env) {
    let sid = e.open(ALICE, "open-busy")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let (st, running) = e.cell_raw(ALICE, &sid, "slow", "import time\ntime.sleep(4)", false);
    assert_eq!(st, 202, "{running}");
    let (st, refused) = e.cell_raw(ALICE, &sid, "next", "open('/work/SENTINEL-RAN', 'w')", true);
    assert_eq!(st, 409, "{refused}");
    assert!(
        refused["type"]
            .as_str()
            .unwrap()
            .ends_with("/cell-in-progress"),
        "{refused}"
    );
    assert!(
        refused["detail"]
            .as_str()
            .unwrap()
            .contains("one at a time"),
        "{refused}"
    );
    // The first one ends on its own; the refused one never became a cell.
    let done = e
        .api
        .wait_status(ALICE, running["request_id"].as_str().unwrap(), "ok", 60);
    assert_eq!(done["status"], "ok", "{done}");
    let check = e.cell(
        &sid,
        "check",
        "import os\nprint('SEEN=%s' % os.path.exists('/work/SENTINEL-RAN'))",
    );
    assert!(stdout(&check).contains("SEEN=False"), "{check}");
    assert_eq!(check["cell"], 1);

    // DELETE ends it; again is the same answer; a new cell is refused.
    let (st, closed) = e.send(
        reqwest::Method::DELETE,
        ALICE,
        &format!("/v1/sessions/{sid}"),
        None,
    );
    assert_eq!(st, 200, "{closed}");
    assert_eq!(closed["state"], "closed");
    let (st, again) = e.send(
        reqwest::Method::DELETE,
        ALICE,
        &format!("/v1/sessions/{sid}"),
        None,
    );
    assert_eq!(st, 200, "{again}");
    assert_eq!(again["closed_at"], closed["closed_at"]);
    let (st, after) = e.cell_raw(ALICE, &sid, "late", "print(1)", true);
    assert_eq!(st, 409, "{after}");
    assert!(
        after["type"].as_str().unwrap().ends_with("/session-closed"),
        "{after}"
    );
    assert_eq!(e.session(&sid)["cells"], 2);
}

fn another_tenants_or_actors_session_is_the_same_404_as_a_missing_one(e: Env) {
    let sid = e.open(ALICE, "open-owned")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let missing = "ses_00000000000000000000000000000000";
    type Call<'a> = (reqwest::Method, String, Option<Value>);
    let calls = |id: &str| -> Vec<Call<'_>> {
        vec![
            (reqwest::Method::GET, format!("/v1/sessions/{id}"), None),
            (
                reqwest::Method::GET,
                format!("/v1/sessions/{id}/cells"),
                None,
            ),
            (
                reqwest::Method::POST,
                format!("/v1/sessions/{id}/cells"),
                Some(json!({"request_id": "x", "code": code("open('/work/INTRUDER', 'w')")})),
            ),
            (
                reqwest::Method::POST,
                format!("/v1/sessions/{id}/fork"),
                Some(json!({"request_id": "f"})),
            ),
            (reqwest::Method::DELETE, format!("/v1/sessions/{id}"), None),
        ]
    };
    for token in [BOB, CAROL] {
        for ((m, p, b), (mm, pm, bm)) in calls(&sid).into_iter().zip(calls(missing)) {
            let (st, theirs) = e.send(m.clone(), token, &p, b);
            let (stm, none) = e.send(mm, token, &pm, bm);
            assert_eq!(st, 404, "{m} {p}: {theirs}");
            assert_eq!(stm, 404, "{none}");
            assert_eq!(theirs, none, "{m} {p}: another's session must look missing");
        }
    }
    // Nothing they did reached it: no cell, not closed.
    let s = e.session(&sid);
    assert_eq!(s["cells"], 0, "{s}");
    assert_eq!(s["state"], "open", "{s}");
}

fn a_cell_never_sees_another_sessions_workspace(e: Env) {
    let a = e.open(ALICE, "open-a")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let b = e.open(ALICE, "open-b")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(a, b);
    e.cell(&a, "a1", "open('/work/secret-of-a', 'w').write('A-ONLY')");
    let seen = e.cell(
        &b,
        "b1",
        "import os\nprint('LIST=%r' % sorted(os.listdir('/work')))",
    );
    assert!(stdout(&seen).contains("LIST=[]"), "{seen}");
}

fn a_tampered_checkpoint_is_refused_before_anything_runs(e: Env) {
    let sid = e.open(ALICE, "open-t")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let c0 = e.cell(&sid, "t1", "open('/work/f', 'w').write('genuine')");
    let head = c0["workspace"]["after"].as_str().unwrap().to_string();
    let mut bytes = e.checkpoint(&head);
    assert_eq!(format!("sha256:{}", sha256_hex(&bytes)), head);
    // The content of `f` in the archive, changed in place.
    let at = bytes.windows(7).position(|w| w == b"genuine").unwrap();
    bytes[at..at + 7].copy_from_slice(b"forgery");
    e.set_checkpoint(&head, &bytes);
    let (st, refused) = e.cell_raw(
        ALICE,
        &sid,
        "t2",
        "print('SENTINEL=' + open('/work/f').read())",
        true,
    );
    assert_eq!(st, 409, "{refused}");
    assert!(
        refused["type"]
            .as_str()
            .unwrap()
            .ends_with("/checkpoint-invalid"),
        "{refused}"
    );
    assert!(
        refused["detail"]
            .as_str()
            .unwrap()
            .contains("no longer matches"),
        "{refused}"
    );
    // Nothing ran: no cell 1, no run for it, the head unchanged.
    let s = e.session(&sid);
    assert_eq!(s["cells"], 1, "{s}");
    assert_eq!(s["workspace_sha256"].as_str(), Some(head.as_str()));
    assert_eq!(
        e.api
            .get(ALICE, &format!("/v1/runs/{sid}-1"))
            .status()
            .as_u16(),
        404
    );
}

fn a_fork_starts_from_the_cell_it_names(e: Env) {
    let sid = e.open(ALICE, "open-f")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let c0 = e.cell(&sid, "f1", "open('/work/state', 'w').write('one')");
    e.cell(&sid, "f2", "open('/work/state', 'w').write('two')");
    let (st, fork) = e.send(
        reqwest::Method::POST,
        ALICE,
        &format!("/v1/sessions/{sid}/fork"),
        Some(json!({"request_id": "fork-at-0", "cell": 0})),
    );
    assert_eq!(st, 201, "{fork}");
    let fid = fork["session_id"].as_str().unwrap().to_string();
    assert_ne!(fid, sid);
    assert_eq!(fork["forked_from"]["session_id"], sid.as_str());
    assert_eq!(fork["workspace_sha256"], c0["workspace"]["after"]);
    let seen = e.cell(&fid, "g1", "print('STATE=' + open('/work/state').read())");
    assert!(stdout(&seen).contains("STATE=one"), "{seen}");
    // Its chain goes on from cell 0's receipt.
    let digest0 = format!(
        "sha256:{}",
        sha256_hex(serde_jcs::to_vec(&c0["receipt"]).unwrap())
    );
    assert_eq!(fork["last_receipt_sha256"].as_str(), Some(digest0.as_str()));
    let payload = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD
            .decode(seen["receipt"]["payload"].as_str().unwrap())
            .unwrap()
    };
    let p: Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(p["predicate"]["session"]["id"], fid.as_str());
    assert_eq!(p["predicate"]["session"]["cell"], 0);
    assert_eq!(
        p["predicate"]["session"]["previous_receipt_sha256"].as_str(),
        Some(digest0.as_str())
    );
    // The original goes on from its own head.
    let orig = e.cell(&sid, "f3", "print('STATE=' + open('/work/state').read())");
    assert!(stdout(&orig).contains("STATE=two"), "{orig}");
    // A cell that does not exist.
    let (st, none) = e.send(
        reqwest::Method::POST,
        ALICE,
        &format!("/v1/sessions/{sid}/fork"),
        Some(json!({"request_id": "fork-at-9", "cell": 9})),
    );
    assert_eq!(st, 404, "{none}");
}

fn the_workspace_bound_holds_across_cells(e: Env) {
    let sid = e.open(ALICE, "open-big")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    // max_mb = 2: each cell adds 1 MiB; the third crosses the bound.
    let add = |i: u32| format!("import os\nopen('/work/blob{i}', 'wb').write(os.urandom(1 << 20))");
    let c0 = e.cell(&sid, "b0", &add(0));
    let c1 = e.cell(&sid, "b1", &add(1));
    assert_eq!(c1["workspace"]["before"], c0["workspace"]["after"]);
    let good = c1["workspace"]["after"].as_str().unwrap().to_string();
    let (st, over) = e.cell_raw(ALICE, &sid, "b2", &add(2), true);
    assert_eq!(st, 200, "{over}");
    assert_eq!(over["status"], "output_rejected", "{over}");
    assert!(over["workspace"]["after"].is_null(), "{over}");
    let rejected = over["report"]["workspace"]["rejected"].to_string();
    assert!(rejected.contains("over its bounds"), "{rejected}");
    // The head stays at the last good checkpoint, and the next cell starts there.
    assert_eq!(
        e.session(&sid)["workspace_sha256"].as_str(),
        Some(good.as_str())
    );
    let next = e.cell(
        &sid,
        "b3",
        "import os\nprint('FILES=%r' % sorted(os.listdir('/work')))",
    );
    assert!(stdout(&next).contains("FILES=['blob0', 'blob1']"), "{next}");
}

#[test]
fn an_expired_or_full_session_takes_no_cell_and_a_fixed_program_is_no_session() {
    let e = start();
    // A task without code cannot be opened as a session.
    let (st, v) = e.send(
        reqwest::Method::POST,
        ALICE,
        "/v1/sessions",
        Some(json!({"request_id": "open-fixed", "task": "fixed"})),
    );
    assert_eq!(st, 403, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("cannot be opened as a session"),
        "{v}"
    );
    // The cell limit (`once`: one cell).
    let sid = e.open_task(ALICE, "open-once", "once")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    e.cell(&sid, "only", "print(1)");
    let (st, full) = e.cell_raw(ALICE, &sid, "second", "open('/work/SENTINEL', 'w')", true);
    assert_eq!(st, 409, "{full}");
    assert!(
        full["type"]
            .as_str()
            .unwrap()
            .ends_with("/session-cell-limit"),
        "{full}"
    );
    // Expiry: the session's end moved into the past in the service's database.
    let sid = e.open(ALICE, "open-exp")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let db = rusqlite::Connection::open(e.data.join("private").join("agentjail.db")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    let n = db
        .execute(
            "UPDATE sessions SET expires_at = 1 WHERE session_id = ?1",
            [&sid],
        )
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(e.session(&sid)["state"], "expired");
    let (st, late) = e.cell_raw(ALICE, &sid, "late", "open('/work/SENTINEL', 'w')", true);
    assert_eq!(st, 409, "{late}");
    assert!(
        late["type"].as_str().unwrap().ends_with("/session-expired"),
        "{late}"
    );
    assert_eq!(e.session(&sid)["cells"], 0);
}

fn ending_a_session_cancels_its_running_cell(e: Env) {
    let sid = e.open(ALICE, "open-cancel")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let (st, running) = e.cell_raw(
        ALICE,
        &sid,
        "long",
        "print('started', flush=True)\nimport time\ntime.sleep(60)\nopen('/work/SENTINEL-FINISHED', 'w')",
        false,
    );
    assert_eq!(st, 202, "{running}");
    let run_id = running["request_id"].as_str().unwrap().to_string();
    e.api.wait_status(ALICE, &run_id, "running", 30);
    let t = std::time::Instant::now();
    let (st, closed) = e.send(
        reqwest::Method::DELETE,
        ALICE,
        &format!("/v1/sessions/{sid}"),
        None,
    );
    assert_eq!(st, 200, "{closed}");
    assert_eq!(closed["state"], "closed");
    let ended = e.api.wait_status(ALICE, &run_id, "cancelled", 30);
    assert_eq!(ended["status"], "cancelled", "{ended}");
    assert!(t.elapsed() < std::time::Duration::from_secs(30));
    // It left no checkpoint: the head is still the empty start.
    assert!(e.session(&sid)["workspace_sha256"].is_null());
}

fn of_cells_submitted_at_once_exactly_one_runs(e: Env) {
    let sid = e.open(ALICE, "open-race")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    race_for_the_next_cell(&e, &[&e.api], &sid);
}

/// Six requests for the next cell of `sid` at once, spread over `apis` (replicas of one
/// service): exactly one is accepted, the others are `409 cell-in-progress`, and the cell
/// ran once (the next cell counts one write).
fn race_for_the_next_cell(e: &Env, apis: &[&Api], sid: &str) {
    let barrier = std::sync::Barrier::new(6);
    let answers: Vec<(u16, Value)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..6)
            .map(|i| {
                let (api, barrier) = (apis[i % apis.len()], &barrier);
                s.spawn(move || {
                    barrier.wait();
                    api.cell_raw(
                        ALICE,
                        sid,
                        &format!("racer-{i}"),
                        "open('/work/count', 'a').write('x')\nimport time\ntime.sleep(1)",
                        false,
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let accepted: Vec<_> = answers.iter().filter(|(s, _)| *s == 202).collect();
    assert_eq!(accepted.len(), 1, "{answers:?}");
    for (s, v) in answers.iter().filter(|(s, _)| *s != 202) {
        assert_eq!(*s, 409, "{v}");
        assert!(
            v["type"].as_str().unwrap().ends_with("/cell-in-progress"),
            "{v}"
        );
    }
    let run = accepted[0].1["request_id"].as_str().unwrap();
    e.api.wait_status(ALICE, run, "ok", 60);
    let check = e.cell(
        sid,
        "count",
        "print('COUNT=%d' % len(open('/work/count').read()))",
    );
    assert!(stdout(&check).contains("COUNT=1"), "{check}");
    assert_eq!(check["cell"], 1);
}

/// A fork counts toward its source's limits: it ends when its source would (`expires_at`
/// inherited, never later), its `max_cells` is what the source had left at the forked cell,
/// and a closed or expired session cannot be forked (the same 409s as a cell).
#[test]
fn a_fork_inherits_its_sources_limits_and_an_ended_session_cannot_be_forked() {
    let e = start();
    let fork = |sid: &str, rid: &str, cell: Option<u64>| {
        let mut body = json!({"request_id": rid});
        if let Some(c) = cell {
            body["cell"] = json!(c);
        }
        e.send(
            reqwest::Method::POST,
            ALICE,
            &format!("/v1/sessions/{sid}/fork"),
            Some(body),
        )
    };
    // The cell limit: a `once` session that ran its cell forks into one with none left.
    let once = e.open_task(ALICE, "open-once-f", "once")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    e.cell(&once, "only", "open('/work/a', 'w').write('a')");
    let (st, f) = fork(&once, "fork-once", None);
    assert_eq!(st, 201, "{f}");
    assert_eq!(f["max_cells"], 0, "{f}");
    assert_eq!(f["cells"], 0, "{f}");
    let fid = f["session_id"].as_str().unwrap().to_string();
    let (st, v) = e.cell_raw(ALICE, &fid, "more", "open('/work/SENTINEL', 'w')", true);
    assert_eq!(st, 409, "{v}");
    assert!(
        v["type"].as_str().unwrap().ends_with("/session-cell-limit"),
        "{v}"
    );
    // A fork of a fork counts its ancestors' cells too; the py task allows 50.
    let sid = e.open(ALICE, "open-f")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    e.cell(&sid, "c0", "print(0)");
    e.cell(&sid, "c1", "print(1)");
    let (st, f1) = fork(&sid, "fork-1", Some(0));
    assert_eq!(st, 201, "{f1}");
    assert_eq!(f1["max_cells"], 49, "{f1}");
    let f1id = f1["session_id"].as_str().unwrap().to_string();
    e.cell(&f1id, "d0", "print(2)");
    let (st, f2) = fork(&f1id, "fork-2", None);
    assert_eq!(st, 201, "{f2}");
    assert_eq!(f2["max_cells"], 48, "{f2}");
    // The lifetime: the fork ends when its source does.
    let db = rusqlite::Connection::open(e.data.join("private").join("agentjail.db")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    let soon = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
        + 120;
    db.execute(
        "UPDATE sessions SET expires_at = ?2 WHERE session_id = ?1",
        rusqlite::params![sid, soon],
    )
    .unwrap();
    let src = e.session(&sid);
    let (st, f3) = fork(&sid, "fork-3", None);
    assert_eq!(st, 201, "{f3}");
    assert_eq!(f3["expires_at"], src["expires_at"], "{f3} {src}");
    // An expired session cannot be forked, nor a closed one.
    db.execute(
        "UPDATE sessions SET expires_at = 1 WHERE session_id = ?1",
        [&sid],
    )
    .unwrap();
    let (st, v) = fork(&sid, "fork-expired", None);
    assert_eq!(st, 409, "{v}");
    assert!(
        v["type"].as_str().unwrap().ends_with("/session-expired"),
        "{v}"
    );
    let (st, v) = e.send(
        reqwest::Method::DELETE,
        ALICE,
        &format!("/v1/sessions/{f1id}"),
        None,
    );
    assert_eq!(st, 200, "{v}");
    let (st, v) = fork(&f1id, "fork-closed", Some(0));
    assert_eq!(st, 409, "{v}");
    assert!(
        v["type"].as_str().unwrap().ends_with("/session-closed"),
        "{v}"
    );
    // A retried fork request still answers the recorded fork.
    let (st, again) = fork(&sid, "fork-3", None);
    assert_eq!(st, 200, "{again}");
    assert_eq!(again["session_id"], f3["session_id"]);
}

/// On a fleet (an API replica executing nothing, two workers): a worker killed while it runs a
/// cell leaves that cell `unknown` and moves nothing; the session's head stays at the last
/// good checkpoint, and the next cell runs on the other worker from that checkpoint: it sees
/// the files the last good cell left, none of the lost cell's writes, and runs once.
#[test]
fn a_cell_on_a_killed_worker_ends_unknown_and_the_next_resumes_elsewhere_from_the_head() {
    let Some(mut e) = start_pg_with("0", 1, 2) else {
        return;
    };
    let sid = e.open(ALICE, "open-fleet")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let c0 = e.cell(&sid, "good", "open('/work/a', 'w').write('good')");
    let head = c0["workspace"]["after"].as_str().unwrap().to_string();
    let (st, v) = e.cell_raw(
        ALICE,
        &sid,
        "lost",
        "open('/work/a', 'w').write('lost')\nopen('/work/b', 'w').write('lost')\nprint('started', flush=True)\nimport time\ntime.sleep(60)",
        false,
    );
    assert_eq!(st, 202, "{v}");
    let lost = format!("{sid}-1");
    e.api.wait_status(ALICE, &lost, "running", 30);
    // The worker that claimed it (workers are nodes 1 and 2).
    let claimed = |n: &common::pg::Node, rid: &str| {
        n.log()
            .lines()
            .any(|l| l.contains("claimed a run") && l.contains(rid))
    };
    let holder = (1..=2)
        .find(|&i| claimed(&e.fleet.as_ref().unwrap().nodes[i], &lost))
        .expect("a worker claimed the cell");
    let other = 3 - holder;
    e.fleet.as_mut().unwrap().nodes[holder].kill();
    let ended = e.api.wait_status(ALICE, &lost, "unknown", 60);
    assert_eq!(ended["status"], "unknown", "{ended}");
    let s = e.session(&sid);
    assert_eq!(s["workspace_sha256"].as_str(), Some(head.as_str()), "{s}");
    assert_eq!(s["cells"], 2, "{s}");
    let c2 = e.cell(
        &sid,
        "resume",
        "import os\nprint('A=' + open('/work/a').read())\nprint('B=%s' % os.path.exists('/work/b'))",
    );
    let out = stdout(&c2);
    assert!(out.contains("A=good"), "{c2}");
    assert!(out.contains("B=False"), "{c2}");
    assert_eq!(c2["workspace"]["before"].as_str(), Some(head.as_str()));
    let f = e.fleet.as_ref().unwrap();
    assert!(claimed(&f.nodes[other], &format!("{sid}-2")));
    // The lost cell stays what it was: unknown, run once (a single start in the chain).
    let pg = &f.pg;
    assert_eq!(pg.audited("run_start", &lost), "1");
    assert_eq!(
        e.api.wait_status(ALICE, &lost, "unknown", 5)["status"],
        "unknown"
    );
}

/// Two API replicas receiving a session's next cell at once (three requests each): exactly one
/// is accepted across both, the others get the same `409 cell-in-progress` as on SQLite, and
/// the cell runs once.
#[test]
fn two_replicas_racing_for_a_sessions_next_cell_run_exactly_one() {
    let Some(e) = start_pg_with("0", 2, 1) else {
        return;
    };
    let sid = e.open(ALICE, "open-replicas")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    race_for_the_next_cell(&e, &[&e.api, &e.fleet.as_ref().unwrap().apis[1]], &sid);
    let pg = &e.fleet.as_ref().unwrap().pg;
    assert_eq!(
        pg.psql(&format!(
            "SELECT count(*) FROM runs WHERE request_id LIKE '{sid}-%'"
        )),
        "2"
    );
}

/// A checkpoint tampered with in the database after its cell was admitted (queued, no executor
/// yet): the executor that claims the cell hashes it before restoring anything and refuses it;
/// the cell ends `setup_error` with the checkpoint's problem, its command never started, and
/// the session's head stays where it was.
#[test]
fn a_checkpoint_tampered_in_the_database_after_admission_is_refused_by_the_executor() {
    let Some(mut e) = start_pg_with("0", 1, 1) else {
        return;
    };
    let sid = e.open(ALICE, "open-late-tamper")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let c0 = e.cell(&sid, "t1", "open('/work/f', 'w').write('genuine')");
    let head = c0["workspace"]["after"].as_str().unwrap().to_string();
    // The only worker goes; the next cell waits on the queue.
    e.fleet.as_mut().unwrap().nodes[1].kill();
    let (st, v) = e.cell_raw(
        ALICE,
        &sid,
        "t2",
        "print('SENTINEL=' + open('/work/f').read())",
        false,
    );
    assert_eq!(st, 202, "{v}");
    let mut bytes = e.checkpoint(&head);
    let at = bytes.windows(7).position(|w| w == b"genuine").unwrap();
    bytes[at..at + 7].copy_from_slice(b"forgery");
    e.set_checkpoint(&head, &bytes);
    e.fleet.as_mut().unwrap().add_worker("w-late");
    let run = format!("{sid}-1");
    let ended = e.api.wait_status(ALICE, &run, "setup_error", 60);
    assert_eq!(ended["status"], "setup_error", "{ended}");
    assert!(
        ended["reason"]
            .as_str()
            .unwrap_or("")
            .contains("no longer matches"),
        "{ended}"
    );
    assert!(!stdout(&ended).contains("SENTINEL"), "{ended}");
    let pg = &e.fleet.as_ref().unwrap().pg;
    assert_eq!(pg.audited("run_start", &run), "0");
    let s = e.session(&sid);
    assert_eq!(s["workspace_sha256"].as_str(), Some(head.as_str()), "{s}");
}

/// The retention sweep on PostgreSQL: once a session is closed, its checkpoints' rows (and the
/// executor's local copies) go, except those another live session still names; a live
/// session keeps its head, and a fork from it still starts there.
#[test]
fn the_sweep_deletes_a_closed_sessions_checkpoints_from_the_database() {
    let Some(f) = common::pg::Fleet::start(
        &format!("sweep_interval_seconds = 1\n{}", config()),
        "2",
        1,
        0,
    ) else {
        return;
    };
    let e = Env {
        _serve: None,
        data: f.data.clone(),
        api: f.apis[0].clone(),
        fleet: Some(f),
        _dir: None,
    };
    let open = |rid: &str| {
        e.open(ALICE, rid)["session_id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (a, b) = (open("sweep-a"), open("sweep-b"));
    for i in 0..3 {
        e.cell(
            &a,
            &format!("a{i}"),
            &format!("open('/work/a{i}', 'w').write('{i}')"),
        );
    }
    let kept = e.cell(&b, "b0", "open('/work/b', 'w').write('kept')")["workspace"]["after"]
        .as_str()
        .unwrap()
        .to_string();
    let pg = &e.fleet.as_ref().unwrap().pg;
    let rows = || pg.psql("SELECT string_agg(sha256, ',') FROM checkpoints");
    assert_eq!(rows().split(',').count(), 4, "{}", rows());
    let (st, v) = e.send(
        reqwest::Method::DELETE,
        ALICE,
        &format!("/v1/sessions/{a}"),
        None,
    );
    assert_eq!(st, 200, "{v}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while rows() != kept {
        assert!(
            std::time::Instant::now() < deadline,
            "{}\n{}",
            rows(),
            e.fleet.as_ref().unwrap().nodes[0].log()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // The local copies on the executor went too, but for the live head's.
    let local = || {
        std::fs::read_dir(e.data.join("checkpoints"))
            .unwrap()
            .flatten()
            .map(|d| format!("sha256:{}", d.file_name().to_string_lossy()))
            .collect::<Vec<_>>()
    };
    while local() != vec![kept.clone()] {
        assert!(std::time::Instant::now() < deadline, "{:?}", local());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let (st, fork) = e.send(
        reqwest::Method::POST,
        ALICE,
        &format!("/v1/sessions/{b}/fork"),
        Some(json!({"request_id": "sweep-fork"})),
    );
    assert_eq!(st, 201, "{fork}");
    let c = e.cell(
        fork["session_id"].as_str().unwrap(),
        "f0",
        "print('B=' + open('/work/b').read())",
    );
    assert!(stdout(&c).contains("B=kept"), "{c}");
}
