//! Sessions over MCP (issue #34: `session_open`, `session_run`, `session_get`,
//! `session_fork`, `session_close`), driven by the
//! official Python MCP SDK (`tests/mcp/sessions.py`) over stdio (`agentjail mcp`) and over
//! Streamable HTTP (`/mcp` of `agentjail serve`, two actors' tokens): the tools are listed
//! with their input schemas; `/work` persists from one cell to the next and variables do not;
//! a repeated call (with the same step id, or with none) runs once; `session_get` lists the
//! cells and their status; `session_fork` from a cell starts a new session from the `/work` that
//! cell left (and from the head, all of it) without changing the original; a closed session refuses
//! a cell with an error the model can read; another actor's session id is refused exactly as
//! a missing one; the same on PostgreSQL. The calls are the
//! HTTP routes' service functions: the cells are audited as theirs are. Without `import mcp` the test prints SKIP and passes outside CI; under CI
//! (`CI` set) it fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::serve::{Serve, actor, json_output, write_config, write_token};
use common::skip;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const ALICE: &str = "tok-alice-mcpsess-1f0c3a";
const CAROL: &str = "tok-carol-mcpsess-8d2e57";

fn python_has_mcp() -> bool {
    Command::new("python3")
        .args(["-c", "import mcp"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn config() -> String {
    format!(
        r#"
[tenants.acme]
{alice}{carol}
[tasks.py]
description = "Model-proposed Python"
code = "allowed"
command = ["/usr/bin/python3", "/input/code.py"]
allowed_actors = ["alice", "carol"]
stdout_bytes = 2048
expose_stderr_bytes = 2048
{output}[tasks.py.limits]
seconds = 20
[tasks.py.session]
max_mb = 2
max_cells = 50

[tasks.live]
description = "Python in a live session"
code = "allowed"
command = ["/usr/bin/python3", "/input/code.py"]
allowed_actors = ["alice", "carol"]
{live_output}[tasks.live.limits]
seconds = 20
[tasks.live.session]
interpreter = "python"

[tasks.fixed]
description = "A fixed program"
code = "forbidden"
command = ["/usr/bin/true"]
allowed_actors = ["alice", "carol"]
{fixed_output}"#,
        alice = actor("alice", "acme", ALICE, false),
        carol = actor("carol", "acme", CAROL, false),
        output = json_output("py", "o.json", 1000),
        fixed_output = json_output("fixed", "o.json", 1000),
        live_output = json_output("live", "o.json", 1000),
    )
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/sessions.py")
}

/// Runs the Python scenarios; returns their RESULT object.
fn run(args: &[&str], transcript: &Path) -> serde_json::Value {
    let mut cmd = Command::new("python3");
    cmd.arg(script())
        .args(args)
        .arg("--transcript")
        .arg(transcript);
    common::result_of(cmd, "python scenarios")
}

fn check(r: &serde_json::Value) {
    assert_eq!(
        r["tools"],
        serde_json::json!([
            "fixed",
            "get_run",
            "live",
            "py",
            "session_close",
            "session_fork",
            "session_get",
            "session_open",
            "session_run",
            "upload_input"
        ])
    );
    assert_eq!(r["read_back"], "forty-two");
    assert_eq!(r["appended"], 2);
    assert_eq!(r["after_close"], "session-closed");
    assert_eq!(r["fork_after_close"], "session-closed");
    assert_eq!(
        r["get_statuses"],
        serde_json::json!(["ok", "ok", "exit_nonzero", "ok", "ok", "ok"])
    );
    assert_eq!(
        r["forked"],
        serde_json::json!({"from_cell_1": "forty-two False", "from_head": "2", "original": "forty-two"})
    );
    assert!(r["progress"].as_u64().unwrap() >= 1, "{r}");
}

/// The live session scenario (`--live`): both cells successes, the variable kept.
fn check_live(r: &serde_json::Value) {
    assert_eq!(
        r["live"],
        serde_json::json!({"set_is_error": false, "use_is_error": false, "use_prints_42": true}),
        "{r}"
    );
}

/// The audit records of the session tools' calls: each cell is audited as the HTTP route's
/// (`session_cell`), and as an `mcp_tool_call` by `actor` over `route`.
fn check_audit(data: &Path, route: &str, live_cells: usize) -> Vec<serde_json::Value> {
    let p = data.join("private/audit.jsonl");
    agentjail_server::audit::verify_chain(&p).unwrap();
    let log: Vec<serde_json::Value> = std::fs::read_to_string(&p)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let calls = |tool: &str| {
        log.iter()
            .filter(|v| v["event"] == "mcp_tool_call" && v["tool"] == tool)
            .count()
    };
    assert!(calls("session_open") >= 2 && calls("session_run") >= 9 && calls("session_close") >= 1);
    assert!(
        log.iter()
            .filter(|v| v["event"] == "mcp_tool_call")
            .all(|v| v["route"] == route)
    );
    // Six cells ran (0-5) in the session, one in each of its two forks and one more in it
    // after the forks (the repeats were replays), and `live_cells` of the live scenario.
    let cells = log
        .iter()
        .filter(|v| v["event"] == "session_cell" && v["decision"] == "allow")
        .count();
    assert_eq!(cells, 9 + live_cells, "cells run");
    assert!(
        log.iter()
            .any(|v| v["event"] == "mcp_tool_call" && v["tool"] == "session_fork")
    );
    assert!(
        log.iter()
            .any(|v| v["event"] == "mcp_tool_call" && v["tool"] == "session_get")
    );
    assert!(
        log.iter()
            .any(|v| v["event"] == "session_cell_replay" && v["decision"] == "allow")
    );
    log
}

#[test]
fn sessions_over_mcp_stdio_with_the_python_sdk() {
    if !python_has_mcp() {
        skip("python3 cannot `import mcp` (.ci/run installs it: python3 -m pip install mcp)");
        return;
    }
    let dir = common::tmp();
    let cfg = write_config(dir.path(), &config());
    let tok = write_token(dir.path(), "alice.token", ALICE);
    let data = dir.path().join("data");
    let r = run(
        &[
            "--transport",
            "stdio",
            "--bin",
            &common::bin_str(),
            "--config",
            cfg.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
            "--token-file",
            tok.to_str().unwrap(),
            "--live",
        ],
        &dir.path().join("stdio.txt"),
    );
    check(&r);
    check_live(&r);
    check_audit(&data, "mcp stdio", 2);
}

#[test]
fn sessions_over_mcp_http_are_the_actors_own() {
    if !python_has_mcp() {
        skip("python3 cannot `import mcp` (.ci/run installs it: python3 -m pip install mcp)");
        return;
    }
    let dir = common::tmp();
    let cfg = write_config(dir.path(), &config());
    let alice = write_token(dir.path(), "alice.token", ALICE);
    let carol = write_token(dir.path(), "carol.token", CAROL);
    let data = dir.path().join("data");
    let s = Serve::start(&cfg, &data, &[]);
    let url = format!("{}/mcp", s.base);
    let r = run(
        &[
            "--transport",
            "http",
            "--url",
            &url,
            "--token-file",
            alice.to_str().unwrap(),
            "--other-token-file",
            carol.to_str().unwrap(),
        ],
        &dir.path().join("http.txt"),
    );
    check(&r);
    assert_eq!(
        r["other_actor"],
        serde_json::json!({"run": "not-found", "get": "not-found", "fork": "not-found", "close": "not-found"})
    );
    drop(s);
    let log = check_audit(&data, "mcp http", 0);
    // Carol's calls were refused as `not-found`, and audited as hers.
    assert!(log.iter().any(|v| v["event"] == "mcp_tool_call"
        && v["actor"] == "carol"
        && v["tool"] == "session_run"
        && v["decision"] == "deny"
        && v["reason"].as_str().unwrap_or("").starts_with("not-found")));
}

/// On PostgreSQL the same scenarios over `/mcp` of a replica whose cells run from the
/// database's queue (checkpoints in the database): `/work` persists, a repeated call runs
/// once, a closed session refuses a cell, another actor's session is `not-found`.
#[test]
fn sessions_over_mcp_on_postgresql() {
    if !python_has_mcp() {
        skip("python3 cannot `import mcp` (.ci/run installs it: python3 -m pip install mcp)");
        return;
    }
    let Some(pg) = common::pg::Pg::start() else {
        return;
    };
    let dir = common::pg::tempdir("mcp-sessions-pg");
    let alice = write_token(dir.path(), "alice.token", ALICE);
    let carol = write_token(dir.path(), "carol.token", CAROL);
    let (_node, base) = common::pg::Node::serve(dir.path(), &pg.url(), &config());
    let r = run(
        &[
            "--transport",
            "http",
            "--url",
            &format!("{base}/mcp"),
            "--token-file",
            alice.to_str().unwrap(),
            "--other-token-file",
            carol.to_str().unwrap(),
        ],
        &dir.path().join("pg.txt"),
    );
    check(&r);
    assert_eq!(
        r["other_actor"],
        serde_json::json!({"run": "not-found", "get": "not-found", "fork": "not-found", "close": "not-found"})
    );
    // Nine cells ran (0-5 in the session, one in each of its two forks, one more after them),
    // each audited once in the database's chain.
    assert_eq!(
        pg.psql("SELECT count(*) FROM audit_log WHERE record::jsonb->>'event' = 'session_cell' AND record::jsonb->>'decision' = 'allow'"),
        "9"
    );
}
