//! Sessions over MCP (issue #34: `session_open`, `session_run`, `session_close`), driven by the
//! official Python MCP SDK (`tests/mcp/sessions.py`) over stdio (`agentjail mcp`) and over
//! Streamable HTTP (`/mcp` of `agentjail serve`, two actors' tokens): the tools are listed
//! with their input schemas; `/work` persists from one cell to the next and variables do not;
//! a repeated call (with the same step id, or with none) runs once; a closed session refuses
//! a cell with an error the model can read; another actor's session id is refused exactly as
//! a missing one; on PostgreSQL each tool answers `sessions-unsupported`. The calls are the
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
            "py",
            "session_close",
            "session_open",
            "session_run",
            "upload_input"
        ])
    );
    assert_eq!(r["read_back"], "forty-two");
    assert_eq!(r["appended"], 2);
    assert_eq!(r["after_close"], "session-closed");
    assert!(r["progress"].as_u64().unwrap() >= 1, "{r}");
}

/// The audit records of the session tools' calls: each cell is audited as the HTTP route's
/// (`session_cell`), and as an `mcp_tool_call` by `actor` over `route`.
fn check_audit(data: &Path, route: &str) -> Vec<serde_json::Value> {
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
    // Six cells ran (0-5); the repeats were replays.
    let cells = log
        .iter()
        .filter(|v| v["event"] == "session_cell" && v["decision"] == "allow")
        .count();
    assert_eq!(cells, 6, "cells run");
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
        ],
        &dir.path().join("stdio.txt"),
    );
    check(&r);
    check_audit(&data, "mcp stdio");
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
        serde_json::json!({"run": "not-found", "close": "not-found"})
    );
    drop(s);
    let log = check_audit(&data, "mcp http");
    // Carol's calls were refused as `not-found`, and audited as hers.
    assert!(log.iter().any(|v| v["event"] == "mcp_tool_call"
        && v["actor"] == "carol"
        && v["tool"] == "session_run"
        && v["decision"] == "deny"
        && v["reason"].as_str().unwrap_or("").starts_with("not-found")));
}

/// On PostgreSQL (no sessions in this version) the session tools are still listed and each
/// answers the HTTP routes' refusal, `sessions-unsupported`, as a tool error the model reads.
#[test]
fn on_postgresql_the_session_tools_answer_sessions_unsupported() {
    if !python_has_mcp() {
        skip("python3 cannot `import mcp` (.ci/run installs it: python3 -m pip install mcp)");
        return;
    }
    let Some(pg) = common::pg::Pg::start() else {
        return;
    };
    let dir = common::pg::tempdir("mcp-sessions-pg");
    let alice = write_token(dir.path(), "alice.token", ALICE);
    let (_node, line) = common::pg::Node::start(
        dir.path(),
        &pg.url(),
        &config(),
        &["serve", "--listen", "127.0.0.1:0"],
        "listening on ",
    );
    let base = line
        .split("listening on ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap()
        .to_string();
    let base = if base.starts_with("http") {
        base
    } else {
        format!("http://{base}")
    };
    let r = run(
        &[
            "--transport",
            "http",
            "--url",
            &format!("{base}/mcp"),
            "--token-file",
            alice.to_str().unwrap(),
            "--expect-unsupported",
        ],
        &dir.path().join("pg.txt"),
    );
    assert_eq!(
        r["unsupported"],
        serde_json::json!({
            "session_open": "sessions-unsupported",
            "session_run": "sessions-unsupported",
            "session_close": "sessions-unsupported"
        })
    );
}
