//! The MCP server driven by a client this project did not write: the official Python MCP SDK
//! (`mcp` from PyPI), over stdio (`agentjail mcp`, launched by the SDK) and over Streamable
//! HTTP (`agentjail serve`'s `/mcp`). The scenarios live in `tests/mcp/session.py`: tools with
//! schemas and annotations, upload, `summarize_csv` with model-proposed code returning the
//! verified summary as `structuredContent`, replay, policy denials, invalid arguments
//! (-32602), a timeout, and a cancelled call whose sandbox is gone afterwards. Here: a wrong
//! token over HTTP (401 before any MCP processing), the Host/Origin checks, the audit records
//! and the metrics. Without `import mcp` the test prints SKIP and passes outside CI; under CI (`CI` set) it fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::serve::{Serve, example_schema, mcp_config, write_config, write_token};
use common::skip;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const ALICE: &str = "tok-alice-mcp-4b1d9e";
const OPS: &str = "tok-ops-mcp-77c0aa";

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
    mcp_config(ALICE, OPS, &example_schema(), 2)
}

fn setup(dir: &Path) -> (PathBuf, PathBuf) {
    (
        write_config(dir, &config()),
        write_token(dir, "alice.token", ALICE),
    )
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/session.py")
}

/// Runs the Python session; returns its RESULT object.
fn run_session(args: &[&str], transcript: &Path) -> serde_json::Value {
    let mut cmd = Command::new("python3");
    cmd.arg(script())
        .args(args)
        .arg("--transcript")
        .arg(transcript);
    common::result_of(cmd, "python session")
}

fn check_result(r: &serde_json::Value) {
    assert_eq!(
        r["tools"],
        serde_json::json!([
            "get_run",
            "session_close",
            "session_fork",
            "session_get",
            "session_open",
            "session_run",
            "sleepy",
            "summarize_csv",
            "upload_input"
        ])
    );
    assert_eq!(r["summary"]["rows"], 3);
    assert_eq!(r["invalid_params"], true);
    assert_eq!(r["cancelled"]["status"], "cancelled");
}

fn check_audit(data: &Path, route: &str) {
    let p = data.join("private/audit.jsonl");
    agentjail_server::audit::verify_chain(&p).unwrap();
    let log = std::fs::read_to_string(&p).unwrap();
    let calls: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["event"] == "mcp_tool_call")
        .collect();
    assert!(calls.len() >= 10, "{} mcp_tool_call records", calls.len());
    for c in &calls {
        assert_eq!(c["route"], route);
        assert_eq!(c["actor"], "alice");
        assert_eq!(c["tenant"], "acme");
        assert!(c["tool"].is_string() && c["decision"].is_string(), "{c}");
    }
    assert!(calls.iter().any(|c| c["tool"] == "admin_only"
        && c["decision"] == "deny"
        && c["reason"].as_str().unwrap().starts_with("forbidden")));
    assert!(
        calls
            .iter()
            .any(|c| c["tool"] == "sleepy" && c["status"] == "cancelled")
    );
    // Never a token, code or content: the marker of the code and the CSV rows stay out.
    for needle in [ALICE, "time.sleep", "north,12", "agentjail-mcp-cancel-"] {
        assert!(!log.contains(needle), "audit log contains {needle:?}");
    }
}

#[test]
fn mcp_over_stdio_with_the_python_sdk() {
    if !python_has_mcp() {
        skip("python3 cannot `import mcp` (.ci/run installs it: python3 -m pip install mcp)");
        return;
    }
    let dir = common::tmp();
    let (cfg, tok) = setup(dir.path());
    let data = dir.path().join("data");
    for mode in ["auto", "legacy"] {
        let r = run_session(
            &[
                "--transport",
                "stdio",
                "--mode",
                mode,
                "--bin",
                &common::bin_str(),
                "--config",
                cfg.to_str().unwrap(),
                "--data-dir",
                data.to_str().unwrap(),
                "--token-file",
                tok.to_str().unwrap(),
            ],
            &dir.path().join(format!("stdio-{mode}.txt")),
        );
        check_result(&r);
    }
    check_audit(&data, "mcp stdio");

    // A token that is not the named actor's is refused before serving.
    let wrong = dir.path().join("wrong.token");
    std::fs::write(&wrong, "not-a-token").unwrap();
    let out = Command::new(common::bin())
        .args(["mcp", "--tenant", "acme", "--actor", "alice", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(&data)
        .arg("--token-file")
        .arg(&wrong)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "stdout belongs to the protocol");
    assert!(String::from_utf8_lossy(&out.stderr).contains("matches no configured actor"));
    let out = Command::new(common::bin())
        .args(["mcp", "--tenant", "acme", "--actor", "ops", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(&data)
        .env("AGENTJAIL_TOKEN", ALICE)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not belong to actor `ops`"));
}

fn serve(cfg: &Path, data: &Path) -> Serve {
    Serve::start(cfg, data, &[])
}

fn post_initialize(url: &str, headers: &[(&str, &str)]) -> reqwest::blocking::Response {
    let mut rq = reqwest::blocking::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#);
    for (k, v) in headers {
        rq = rq.header(*k, *v);
    }
    rq.send().unwrap()
}

#[test]
fn mcp_over_streamable_http_with_the_python_sdk() {
    let dir = common::tmp();
    let (cfg, tok) = setup(dir.path());
    let data = dir.path().join("data");
    let s = serve(&cfg, &data);
    let url = format!("{}/mcp", s.base);

    // Authentication comes first: no MCP processing without a valid bearer token.
    let r = post_initialize(&url, &[("authorization", "Bearer wrong-token")]);
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    assert_eq!(post_initialize(&url, &[]).status(), 401);
    // DNS-rebinding protection: a foreign Host or any Origin is refused.
    let bearer = format!("Bearer {ALICE}");
    let r = post_initialize(
        &url,
        &[
            ("authorization", &bearer),
            ("origin", "https://evil.example"),
        ],
    );
    assert_eq!(r.status(), 403);
    let r = post_initialize(
        &url,
        &[("authorization", &bearer), ("host", "evil.example")],
    );
    assert_eq!(r.status(), 403);
    let r = post_initialize(&url, &[("authorization", &bearer)]);
    assert_eq!(r.status(), 200);

    if !python_has_mcp() {
        skip("python3 cannot `import mcp` (.ci/run installs it: python3 -m pip install mcp)");
        return;
    }
    for mode in ["auto", "legacy"] {
        let r = run_session(
            &[
                "--transport",
                "http",
                "--mode",
                mode,
                "--url",
                &url,
                "--token-file",
                tok.to_str().unwrap(),
            ],
            &dir.path().join(format!("http-{mode}.txt")),
        );
        check_result(&r);
    }
    let metrics = reqwest::blocking::get(format!("{}/metrics", s.base))
        .unwrap()
        .text()
        .unwrap();
    assert!(
        metrics.contains(r#"agentjail_mcp_tool_calls_total{tool="summarize_csv",outcome="ok"}"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"agentjail_runs_total{task="sleepy",status="cancelled"}"#));
    drop(s);
    check_audit(&data, "mcp http");
    let log = std::fs::read_to_string(data.join("private/audit.jsonl")).unwrap();
    assert!(log.contains(r#""route":"POST /mcp""#) && log.contains("auth_failure"));
}

/// The naive agent loop on the official Python SDK (`tests/mcp/agent.py`): an agent that uses
/// only what tools/list and the call results say names its CSV by path (`--input-root`), tries
/// pandas, reads `ModuleNotFoundError` in the stderr tail and the runtime line, switches to the
/// csv module and gets a verified result on its second attempt; then a wrong shape, fixed from
/// `schema_errors`, also verified on the second attempt. The SDK checks structuredContent
/// against the outputSchema.
#[test]
fn a_naive_agent_on_the_python_sdk_succeeds_by_its_second_attempt() {
    if !python_has_mcp() {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 cannot `import mcp`: CI must install it (.ci/run)"
        );
        println!("SKIP: python3 cannot `import mcp`; the naive agent test is not run");
        return;
    }
    let dir = common::tmp();
    let (cfg, tok) = setup(dir.path());
    let root = dir.path().join("work");
    std::fs::create_dir(&root).unwrap();
    let csv = root.join("report.csv");
    std::fs::write(
        &csv,
        "region,units,price\nnorth,12,2.5\nsouth,7,3.0\neast,,4.0\n",
    )
    .unwrap();
    let out = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/agent.py"))
        .arg("--bin")
        .arg(common::bin())
        .arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--token-file")
        .arg(&tok)
        .arg("--input-root")
        .arg(&root)
        .arg("--csv")
        .arg(&csv)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "agent failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    let r: serde_json::Value = serde_json::from_str(
        stdout
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("RESULT "))
            .unwrap_or_else(|| panic!("no RESULT\n{stdout}\n{stderr}")),
    )
    .unwrap();
    assert_eq!(r["uploaded_by_path"], true, "{r}");
    assert_eq!(r["output_path"], "/output/summary.json", "{r}");
    for tag in ["pandas", "shape"] {
        assert_eq!(r[tag]["attempts"], 2, "{tag}: {r}");
        assert_eq!(r[tag]["result"]["rows"], 3, "{tag}: {r}");
        assert_eq!(r[tag]["meta"]["status"], "ok", "{tag}: {r}");
        assert_eq!(r[tag]["meta"]["receipt"], true, "{tag}: {r}");
    }
    assert_eq!(
        r["pandas"]["read"], "ModuleNotFoundError: No module named 'pandas'",
        "{r}"
    );
    assert_eq!(r["shape"]["read"]["path"], "/rows", "{r}");
}
