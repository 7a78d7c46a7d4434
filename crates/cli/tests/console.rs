//! The operator console (`/console`, docs/console.md) in a real browser: a real `agentjail
//! serve`, runs whose stdout, stderr, output file names and denials carry HTML/JS payloads,
//! an `unknown` run (the service killed mid-run and restarted), then
//! `tests/console/console.py` (Playwright for Python driving Debian's Chromium, axe-core from
//! `tests/console/package.json`, installed with `npm ci`) logs in, sees a run appear live,
//! opens the payloads' run, finds its denials, checks that nothing executed, abandons the
//! `unknown` run and finds its audit record, and attacks the console's session, CSRF and
//! tenant checks and its headers. Without Chromium, Playwright or axe-core the test prints
//! SKIP outside CI and fails under CI.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::serve::*;
use serde_json::{Value, json};

const OPS: &str = "tok-ops-console-3f9a1c";
const ALICE: &str = "tok-alice-console-8b2d07";
const GINA: &str = "tok-gina-console-51c0e4";

/// Model-proposed Python whose every visible trace is a payload.
const XSS_CODE: &str = r#"
import json, os, sys
print('<img src=x onerror="window.__pwned=1;alert(1)"> <script>window.__pwned=2</script> <a href="javascript:alert(3)">x</a>')
sys.stderr.write('<script>window.__pwned=3;alert(4)</script><img src=x onerror=alert(5)>\n')
open('/output/<img src=x onerror=alert(6)>', 'w').write('x')
os.symlink('/etc/passwd', '/output/<script>alert(7)<img src=x onerror=alert(8)>')
json.dump({'ok': True}, open('/output/o.json', 'w'))
"#;

fn console_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/console")
}

fn chromium() -> PathBuf {
    std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"))
}

/// Why the browser test cannot run here, if it cannot.
fn missing() -> Option<String> {
    if !chromium().exists() {
        return Some(format!(
            "{} is missing (apt-get install chromium)",
            chromium().display()
        ));
    }
    let ok = Command::new("python3")
        .args(["-c", "import playwright.sync_api"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return Some("Python's playwright is missing (pip install playwright==1.65.2)".into());
    }
    let axe = console_dir().join("node_modules/axe-core/axe.min.js");
    if !axe.exists() {
        return Some(format!(
            "{} is missing (run `npm ci` in {})",
            axe.display(),
            console_dir().display()
        ));
    }
    None
}

fn config(marker: &str) -> String {
    format!(
        "[tenants.acme]\n[tenants.globex]\n{}{}{}{}{}",
        actor("ops", "acme", OPS, true),
        actor("alice", "acme", ALICE, false),
        actor("gina", "globex", GINA, false),
        python_code_task(
            "xss",
            "Writes payloads everywhere",
            r#"allowed_tenants = ["acme", "globex"]"#,
            20
        ),
        sleeper_task(marker, 60),
    )
}

fn status_of(api: &Api, id: &str) -> Value {
    let (code, v) = api.send(reqwest::Method::GET, OPS, &format!("/v1/runs/{id}"), None);
    assert!(code == 200 || code == 202, "{code} {v}");
    v
}

/// Submits `id`, a `sleeper` run of 30 s, and waits until it runs.
fn start_sleeper(api: &Api, id: &str) {
    let body = json!({"request_id": id, "task": "sleeper", "inputs": [], "args": ["30"]});
    assert_eq!(api.run(ALICE, &body, "?wait=false").status(), 202);
    let deadline = Instant::now() + Duration::from_secs(20);
    while status_of(api, id)["status"] != "running" {
        assert!(Instant::now() < deadline, "the sleeper never started");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_console_in_a_browser_shows_untrusted_output_as_text_and_only_to_operators() {
    if let Some(why) = missing() {
        common::skip(&why);
        return;
    }
    let dir = common::tmp();
    let marker = format!(
        "console-sleeper-{}",
        dir.path().file_name().unwrap().to_string_lossy()
    );
    let cfg = write_config(dir.path(), &config(&marker));
    let data = dir.path().join("data");

    // An `unknown` run: the service killed while the run runs, then started again.
    let mut first = Serve::start(&cfg, &data, &[]);
    let api = Api::new(&first.base);
    start_sleeper(&api, "lost-1");
    first.kill();
    let serve = Serve::start(&cfg, &data, &[]);
    let api = Api::new(&serve.base);
    assert_eq!(status_of(&api, "lost-1")["status"], "unknown");

    // The payloads' run.
    let body = json!({"request_id": "xss-1", "task": "xss", "inputs": [], "code": XSS_CODE});
    let r = api.run(ALICE, &body, "?wait=true");
    let v: Value = r.json().unwrap();
    assert!(v["receipt"].is_object(), "{v}");
    let denials = v["report"]["denials"].to_string();
    assert!(denials.contains("<img src=x onerror="), "{v}");

    // Another tenant's run: listed to the operator, but neither read nor reconciled by it.
    let body = json!({"request_id": "other-1", "task": "xss", "inputs": [], "code": "print(1)"});
    let r = api.run(GINA, &body, "?wait=true");
    assert!(r.status().is_success(), "{}", r.text().unwrap());

    let shots = std::env::var_os("CONSOLE_SHOTS").map(PathBuf::from);
    let out = Command::new("python3")
        .arg(console_dir().join("console.py"))
        .env("BASE", &serve.base)
        .env("OPS_TOKEN", OPS)
        .env("TENANT_TOKEN", ALICE)
        .env("XSS_RUN", "xss-1")
        .env("UNKNOWN_RUN", "lost-1")
        .env("CHROMIUM", chromium())
        .env(
            "AXE",
            console_dir().join("node_modules/axe-core/axe.min.js"),
        )
        .envs(shots.map(|s| ("SHOTS", s)))
        .output()
        .expect("run console.py");
    assert!(
        out.status.success(),
        "console.py failed:\n{}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        serve.log()
    );
    // The console's decision is the service's: the run is abandoned, and audited so.
    assert_eq!(status_of(&api, "lost-1")["status"], "abandoned");
    let log = std::fs::read_to_string(data.join("private/audit.jsonl")).unwrap();
    let rec: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["event"] == "reconcile" && r["request_id"] == "lost-1")
        .collect();
    assert_eq!(rec.len(), 1, "{log}");
    assert_eq!(rec[0]["actor"], "ops");
    assert_eq!(rec[0]["reason"], "abandon");
    assert!(log.contains("\"console_login\""), "{log}");
    agentjail_server::audit::verify_chain(&data.join("private/audit.jsonl")).unwrap();
}

/// Logs in to the console at `base` with `token` over HTTP: the session cookie (`name=value`).
fn console_login(http: &reqwest::blocking::Client, base: &str, token: &str) -> String {
    let r = http
        .post(format!("{base}/console/login"))
        .header("Origin", base)
        .json(&json!({ "token": token }))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_string();
    cookie.split(';').next().unwrap().to_string()
}

/// The Fleet page's data on PostgreSQL: every executor the store knows (its slots, a recent
/// heartbeat, the runs it holds) and the leases held, for an operator's session only; and the
/// Audit page's: the database's chains verified, a change to one record seen as a break.
#[test]
fn the_fleet_page_shows_the_executors_and_leases_a_postgresql_store_knows() {
    let Some(pg) = common::pg::Pg::start() else {
        return;
    };
    let dir = common::pg::tempdir("console-fleet");
    let marker = format!(
        "console-fleet-{}",
        dir.path().file_name().unwrap().to_string_lossy()
    );
    let cfg = format!(
        "[server]\nnode_id = \"node-a\"\nmax_concurrent_runs = 2\n{}",
        config(&marker)
    );
    let args = ["serve", "--listen", "127.0.0.1:0"];
    let (mut node, line) =
        common::pg::Node::spawn(dir.path(), &pg.url(), &cfg, &args, "listening on ");
    let base = line
        .and_then(|l| {
            l.split("listening on ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .map(str::to_string)
        })
        .unwrap_or_else(|| panic!("serve did not start:\n{}", node.log()));
    let api = Api::new(&base);
    start_sleeper(&api, "held-1");
    let r = api
        .http
        .get(format!("{base}/console/api/fleet"))
        .bearer_auth(OPS)
        .send()
        .unwrap();
    assert_eq!(r.status(), 401, "the fleet without a console session");
    let cookie = console_login(&api.http, &base, OPS);
    let v: Value = api
        .http
        .get(format!("{base}/console/api/fleet"))
        .header("Cookie", &cookie)
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(v["store"], "postgresql", "{v}");
    assert_eq!(v["node"], "node-a", "{v}");
    let w = &v["workers"][0];
    assert_eq!(w["node_id"], "node-a", "{v}");
    assert_eq!(w["slots"], 2, "{v}");
    assert_eq!(w["live"], true, "{v}");
    assert_eq!(w["runs_held"], 1, "{v}");
    assert_eq!(w["draining"], false, "{v}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(
        (now - w["heartbeat_at"].as_i64().unwrap()).abs() < 60,
        "{v}"
    );
    let l = &v["leases"][0];
    assert_eq!(l["request_id"], "held-1", "{v}");
    assert_eq!(l["owner"], "node-a", "{v}");
    assert!(l["lease_expires_at"].as_i64().unwrap() > now - 5, "{v}");

    // A node gone for over an hour without a run is forgotten by the next sweep.
    pg.psql(
        "INSERT INTO workers (node_id, slots, labels, heartbeat_at) VALUES ('gone-long-ago', 1, '{}', now() - interval '2 hours')",
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while pg.psql("SELECT count(*) FROM workers WHERE node_id = 'gone-long-ago'") != "0" {
        assert!(
            Instant::now() < deadline,
            "the gone node was never forgotten"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        pg.psql("SELECT count(*) FROM workers WHERE node_id = 'node-a'"),
        "1",
        "the live node stays"
    );

    // The Audit page on PostgreSQL: the database's chains verified (as `audit verify
    // --database` does), the operator's tenant's records searchable, newest first.
    let audit = |q: &str| -> Value {
        api.http
            .get(format!("{base}/console/api/audit?q={q}"))
            .header("Cookie", &cookie)
            .send()
            .unwrap()
            .json()
            .unwrap()
    };
    let a = audit("");
    assert_eq!(a["store"], "postgresql", "{a}");
    assert_eq!(a["verified"]["ok"], true, "{a}");
    let records = a["records"].as_array().unwrap();
    assert_eq!(records[0]["event"], "console_login", "newest first: {a}");
    let a = audit("held-1");
    let records = a["records"].as_array().unwrap();
    assert!(!records.is_empty(), "{a}");
    assert!(records.iter().all(|r| r["request_id"] == "held-1"), "{a}");
    // One record changed in the database: the page says the chain is broken.
    pg.psql(
        "UPDATE audit_log SET record = replace(record, 'console_login', 'console_logix') WHERE record LIKE '%console_login%'",
    );
    let a = audit("");
    assert_eq!(a["verified"]["ok"], false, "{a}");
    assert!(
        a["verified"]["error"]
            .as_str()
            .unwrap_or("")
            .contains("hash"),
        "{a}"
    );
    node.kill();
}

/// A replica's `serve --slots SLOTS` on `pg` with the console's configuration and its own
/// node id; its base URL.
fn replica(
    pg: &common::pg::Pg,
    dir: &std::path::Path,
    node: &str,
    marker: &str,
    slots: &str,
) -> (common::pg::Node, String) {
    let cfg = format!(
        "[server]\nnode_id = \"{node}\"\nmax_concurrent_runs = 2\n{}",
        config(marker)
    );
    let (n, line) = common::pg::Node::start(
        dir,
        &pg.url(),
        &cfg,
        &["serve", "--listen", "127.0.0.1:0", "--slots", slots],
        "listening on ",
    );
    (n, common::pg::base_of(&line))
}

/// The Runs page's events stream of one replica tells of runs registered on another (the
/// database's `runs_changed` notification), not only of its own: a `changed` event comes
/// within seconds of a run accepted and executed by the other replica (this one has no run
/// slots, so nothing of the run happens here), after a quiet spell with none.
#[test]
fn the_runs_events_of_one_replica_tell_of_runs_on_another() {
    let Some(pg) = common::pg::Pg::start() else {
        return;
    };
    let (da, db) = (
        common::pg::tempdir("console-events-a"),
        common::pg::tempdir("console-events-b"),
    );
    let marker = format!(
        "console-events-{}",
        da.path().file_name().unwrap().to_string_lossy()
    );
    let (mut a, base_a) = replica(&pg, da.path(), "node-a", &marker, "0");
    let (mut b, base_b) = replica(&pg, db.path(), "node-b", &marker, "1");
    let api_a = Api::new(&base_a);
    let cookie = console_login(&api_a.http, &base_a, OPS);
    let resp = api_a
        .http
        .get(format!("{base_a}/console/api/runs/events"))
        .header("Cookie", &cookie)
        .send()
        .unwrap();
    assert_eq!(resp.status(), 200);
    // The stream's lines, as they come.
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for l in std::io::BufReader::new(resp).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    let event_within = |d: Duration| -> Option<String> {
        let deadline = Instant::now() + d;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match rx.recv_timeout(left) {
                Ok(l) if l.starts_with("event:") => return Some(l),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        None
    };
    assert_eq!(
        event_within(Duration::from_millis(1500)),
        None,
        "quiet first"
    );
    let api_b = Api::new(&base_b);
    let body = json!({"request_id": "on-b", "task": "sleeper", "inputs": [], "args": ["1"]});
    assert_eq!(api_b.run(ALICE, &body, "?wait=false").status(), 202);
    assert_eq!(
        event_within(Duration::from_secs(5)).as_deref(),
        Some("event: changed"),
        "replica A's stream told of replica B's run\nA:\n{}\nB:\n{}",
        a.log(),
        b.log()
    );
    let owner = pg.psql("SELECT owner FROM runs WHERE request_id = 'on-b'");
    assert_eq!(owner, "node-b", "executed on B");
    // The Fleet page lists both nodes, the replica without run slots too.
    let v: Value = api_a
        .http
        .get(format!("{base_a}/console/api/fleet"))
        .header("Cookie", &cookie)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let nodes: Vec<(String, i64, bool)> = v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["node_id"].as_str().unwrap().to_owned(),
                w["slots"].as_i64().unwrap(),
                w["live"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        nodes,
        [
            ("node-a".to_owned(), 0, true),
            ("node-b".to_owned(), 1, true)
        ],
        "{v}"
    );
    // The receipt of the run on B verifies on A's console, with B's key as B recorded it (on
    // the previous version: "does not verify with this node's key").
    api_b.wait_status(ALICE, "on-b", "ok", 30);
    let get = |p: &str| -> Value {
        api_a
            .http
            .get(format!("{base_a}{p}"))
            .header("Cookie", &cookie)
            .send()
            .unwrap()
            .json()
            .unwrap()
    };
    let run = get("/console/api/runs/acme/on-b");
    let rc = &run["receipt_check"];
    assert_eq!(
        (&rc["verifies"], &rc["trust"], &rc["signer_node"]),
        (&json!(true), &json!("database"), &json!("node-b")),
        "{run}"
    );
    // A second node publishing B's key id: no key is taken (the database's word is split).
    pg.psql(
        "INSERT INTO workers (node_id, slots, labels, facts) SELECT 'copycat', 0, '{}', facts FROM workers WHERE node_id = 'node-b'",
    );
    let run = get("/console/api/runs/acme/on-b");
    assert_eq!(run["receipt_check"]["verifies"], false, "{run}");
    pg.psql("DELETE FROM workers WHERE node_id = 'copycat'");
    // A receipt whose signature was changed verifies with no node's key.
    pg.psql(
        "UPDATE runs SET receipt = regexp_replace(receipt, '\"sig\": *\"[^\"]*\"', '\"sig\":\"' || repeat('A', 86) || '==\"') WHERE request_id = 'on-b'",
    );
    let run = get("/console/api/runs/acme/on-b");
    assert_eq!(run["receipt_check"]["verifies"], false, "{run}");
    // The Health page: each node's host facts (`agentjail check`), receipt key and version, as
    // each published them with its heartbeat.
    let deadline = Instant::now() + Duration::from_secs(60);
    let health = loop {
        let h = get("/console/api/health");
        let ready = h["nodes"].as_array().is_some_and(|ns| {
            ns.len() == 2 && ns.iter().all(|n| n["facts"]["check"]["items"].is_array())
        });
        if ready {
            break h;
        }
        assert!(Instant::now() < deadline, "no node's facts: {h}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(health["isolation"]["items"].is_array(), "{health}");
    assert_eq!(health["node"], "node-a", "{health}");
    let keyids: Vec<&str> = health["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["facts"]["receipt_key"]["keyid"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        keyids[0],
        health["receipt_key"]["keyid"].as_str().unwrap(),
        "{health}"
    );
    assert!(keyids[1].len() == 64 && keyids[0] != keyids[1], "{health}");
    a.kill();
    b.kill();
}
