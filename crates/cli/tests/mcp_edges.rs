//! Edges of the MCP server driven with raw HTTP (no SDK between the test and the wire):
//! sessions bound to the actor that created them, tool schemas that hosts accept, error results
//! that strict clients can read, errors on bad framing, and logs that do not quote arguments.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::serve::{Serve, actor, json_output, sleepy_task, write_config};

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

const ALICE: &str = "tok-alice-edges-5c2e81";
const MALLORY: &str = "tok-mallory-edges-9a0f3d";

fn config() -> String {
    format!(
        r#"
[tenants.acme]
[tenants.evil]
{alice}{mallory}
{sleepy}
[tasks.counted]
description = "Counts with model-proposed Python"
code = "allowed"
command = ["/usr/bin/python3", "/input/code.py"]
allowed_actors = ["alice"]
{counted_output}schema = '{{"type": "object", "required": ["rows"], "additionalProperties": false, "properties": {{"rows": {{"type": "integer"}}}}}}'
[tasks.counted.limits]
seconds = 30
"#,
        alice = actor("alice", "acme", ALICE, false),
        mallory = actor("mallory", "evil", MALLORY, false),
        sleepy = sleepy_task(),
        counted_output = json_output("counted", "o.json", 1000),
    )
}

fn serve(dir: &Path) -> Serve {
    Serve::start(&write_config(dir, &config()), &dir.join("data"), &[])
}

struct Reply {
    status: u16,
    session: Option<String>,
    body: String,
}

impl Reply {
    /// The JSON-RPC message in the body (plain JSON or the last SSE `data:` line that parses).
    fn message(&self) -> Value {
        if let Ok(v) = serde_json::from_str::<Value>(&self.body) {
            return v;
        }
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .rfind(|v| v.get("id").is_some())
            .unwrap_or_else(|| panic!("no JSON-RPC response in {:?}", self.body))
    }
}

fn http(
    method: &str,
    url: &str,
    token: &str,
    session: Option<&str>,
    body: Option<String>,
) -> Reply {
    let c = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let mut rq = c
        .request(method.parse().unwrap(), url)
        .header("authorization", format!("Bearer {token}"))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25");
    if let Some(s) = session {
        rq = rq.header("mcp-session-id", s);
    }
    if let Some(b) = body {
        rq = rq.header("content-type", "application/json").body(b);
    }
    let r = rq.send().unwrap();
    let status = r.status().as_u16();
    let session = r
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_string());
    let body = r.text().unwrap_or_default();
    Reply {
        status,
        session,
        body,
    }
}

fn open_session(url: &str, token: &str) -> String {
    let r = http(
        "POST",
        url,
        token,
        None,
        Some(json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"edges","version":"1"}}}).to_string()),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let sid = r.session.clone().expect("no Mcp-Session-Id");
    let n = http(
        "POST",
        url,
        token,
        Some(&sid),
        Some(json!({"jsonrpc":"2.0","method":"notifications/initialized"}).to_string()),
    );
    assert_eq!(n.status, 202, "{}", n.body);
    sid
}

fn audit(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("data/private/audit.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Item 1: another tenant's actor who learns a session id can neither cancel the victim's
/// running call, nor delete, read or use the session; the refusals are audited as theirs.
#[test]
fn a_session_belongs_to_the_actor_that_created_it() {
    let dir = common::tmp();
    let s = serve(dir.path());
    let url = format!("{}/mcp", s.base);
    let sid = open_session(&url, ALICE);

    // Alice runs code that takes a few seconds and then writes a sentinel result.
    let code = "import time, json\ntime.sleep(4)\nopen('/output/o.json','w').write(json.dumps({'sentinel': 'alice-finished-7e1'}))\n";
    let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call",
        "params":{"name":"sleepy","arguments":{"code": code, "request_id": "victim-run-1"}}})
    .to_string();
    let (u, sid2) = (url.clone(), sid.clone());
    let victim = std::thread::spawn(move || http("POST", &u, ALICE, Some(&sid2), Some(call)));
    std::thread::sleep(Duration::from_millis(1500));

    // Mallory (tenant evil) knows the session id and tries everything.
    let cancel = json!({"jsonrpc":"2.0","method":"notifications/cancelled",
        "params":{"requestId": 2, "reason": "mallory"}})
    .to_string();
    let r = http("POST", &url, MALLORY, Some(&sid), Some(cancel));
    assert_eq!(r.status, 404, "cancel by another actor: {}", r.body);
    let list = json!({"jsonrpc":"2.0","id":9,"method":"tools/list"}).to_string();
    let r = http("POST", &url, MALLORY, Some(&sid), Some(list.clone()));
    assert_eq!(r.status, 404, "POST by another actor: {}", r.body);
    let r = http("GET", &url, MALLORY, Some(&sid), None);
    assert_eq!(r.status, 404, "GET by another actor: {}", r.body);
    let r = http("DELETE", &url, MALLORY, Some(&sid), None);
    assert_eq!(r.status, 404, "DELETE by another actor: {}", r.body);
    // The refusal looks exactly like an unknown session: ids are not confirmed.
    let unknown = http("DELETE", &url, MALLORY, Some("no-such-session"), None);
    assert_eq!(unknown.status, 404);

    // Alice's run completes with her result.
    let v = victim.join().unwrap();
    assert_eq!(v.status, 200, "{}", v.body);
    let m = v.message();
    assert_eq!(m["result"]["isError"], json!(false), "{m}");
    assert_eq!(
        m["result"]["structuredContent"]["sentinel"], "alice-finished-7e1",
        "{m}"
    );
    // The session is still hers.
    let r = http("POST", &url, ALICE, Some(&sid), Some(list));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.message()["result"]["tools"].is_array());
    let r = http("DELETE", &url, ALICE, Some(&sid), None);
    assert!(r.status < 300, "owner DELETE: {} {}", r.status, r.body);
    let metrics = reqwest::blocking::get(format!("{}/metrics", s.base))
        .unwrap()
        .text()
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l == "agentjail_mcp_session_refusals_total 4"),
        "{metrics}"
    );

    drop(s);
    let log = audit(dir.path());
    let refused: Vec<&Value> = log
        .iter()
        .filter(|e| e["event"] == "mcp_session_refused")
        .collect();
    assert!(refused.len() >= 4, "{refused:?}");
    for e in &refused {
        assert_eq!(e["actor"], "mallory", "{e}");
        assert_eq!(e["tenant"], "evil", "{e}");
        assert_eq!(e["decision"], "deny", "{e}");
    }
    let run = log
        .iter()
        .find(|e| e["event"] == "mcp_tool_call" && e["tool"] == "sleepy")
        .expect("no audit record of the call");
    assert_eq!(run["actor"], "alice");
    assert_eq!(run["status"], "ok", "{run}");
    assert!(
        !log.iter().any(|e| e["status"] == "cancelled"),
        "a cancellation was recorded"
    );
    assert!(
        log.iter()
            .any(|e| e["event"] == "mcp_session" && e["actor"] == "alice"),
        "session open/close not audited"
    );
}

fn call(url: &str, token: &str, sid: &str, id: u64, tool: &str, args: Value) -> Value {
    let r = http(
        "POST",
        url,
        token,
        Some(sid),
        Some(
            json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":tool,"arguments":args}})
                .to_string(),
        ),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    r.message()
}

fn tools(url: &str, token: &str, sid: &str) -> Vec<Value> {
    let r = http(
        "POST",
        url,
        token,
        Some(sid),
        Some(json!({"jsonrpc":"2.0","id":3,"method":"tools/list"}).to_string()),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    r.message()["result"]["tools"].as_array().unwrap().clone()
}

/// Item 3: no tool has a top-level combinator in its inputSchema (hosts such as Claude Code
/// drop such tools), and upload_input's "exactly one of text and base64" is still enforced.
#[test]
fn tool_input_schemas_have_no_top_level_combinators() {
    let dir = common::tmp();
    let s = serve(dir.path());
    let url = format!("{}/mcp", s.base);
    let sid = open_session(&url, ALICE);
    let list = tools(&url, ALICE, &sid);
    assert!(list.iter().any(|t| t["name"] == "upload_input"), "{list:?}");
    for t in &list {
        let schema = &t["inputSchema"];
        assert_eq!(schema["type"], "object", "{t}");
        for k in ["oneOf", "anyOf", "allOf", "not"] {
            assert!(
                schema.get(k).is_none(),
                "tool {} has a top-level {k} in its inputSchema",
                t["name"]
            );
        }
    }
    // Both, and neither: refused with a clear -32602.
    for (i, args) in [
        json!({"media_type": "text/csv", "text": "a", "base64": "YQ=="}),
        json!({"media_type": "text/csv"}),
    ]
    .into_iter()
    .enumerate()
    {
        let m = call(&url, ALICE, &sid, 10 + i as u64, "upload_input", args);
        assert_eq!(m["error"]["code"], -32602, "{m}");
        let msg = m["error"]["message"].as_str().unwrap();
        assert!(msg.contains("exactly one of `text` and `base64`"), "{msg}");
    }
    let ok = call(
        &url,
        ALICE,
        &sid,
        20,
        "upload_input",
        json!({"media_type": "text/csv", "text": "a,b\n"}),
    );
    assert!(
        ok["result"]["structuredContent"]["input_id"]
            .as_str()
            .unwrap()
            .starts_with("in_"),
        "{ok}"
    );
}

/// Item 2: a failed run and a denied call are readable by strict clients: no
/// structuredContent that violates the tool's outputSchema, and the cause in the text and
/// in `_meta`.
#[test]
fn error_results_do_not_violate_the_output_schema() {
    let dir = common::tmp();
    let s = serve(dir.path());
    let url = format!("{}/mcp", s.base);
    let sid = open_session(&url, ALICE);
    let list = tools(&url, ALICE, &sid);
    let out_schema = |name: &str| {
        list.iter()
            .find(|t| t["name"] == name)
            .and_then(|t| t.get("outputSchema").cloned())
            .unwrap_or_else(|| panic!("{name} has no outputSchema"))
    };
    let check = |m: &Value, schema: &Value, cause: &str| {
        let r = &m["result"];
        assert_eq!(r["isError"], true, "{m}");
        if let Some(sc) = r.get("structuredContent") {
            let v = jsonschema::validator_for(schema).unwrap();
            assert!(
                v.is_valid(sc),
                "structuredContent {sc} violates the outputSchema {schema}"
            );
        }
        let text: String = r["content"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["text"].as_str())
            .collect();
        assert!(text.contains(cause), "cause {cause:?} not in text {text:?}");
        let meta = r["_meta"]["dev.agentjail/error"].to_string();
        assert!(meta.contains(cause), "cause {cause:?} not in _meta {m}");
    };
    // A run that fails: exit status 3.
    let m = call(
        &url,
        ALICE,
        &sid,
        30,
        "counted",
        json!({"code": "import sys\nsys.exit(3)\n"}),
    );
    check(&m, &out_schema("counted"), "exited with status 3");
    // Output that fails verification.
    let m = call(
        &url,
        ALICE,
        &sid,
        31,
        "counted",
        json!({"code": "open('/output/o.json','w').write('{\"rows\": \"many\"}')\n"}),
    );
    check(&m, &out_schema("counted"), "output_rejected");
    // A denied call: get_run of a request_id that does not exist, and upload of a media type
    // too large to store? (denials of the shared API).
    let m = call(
        &url,
        ALICE,
        &sid,
        32,
        "get_run",
        json!({"request_id": "never-ran-42"}),
    );
    check(&m, &out_schema("get_run"), "not-found");
    // Another tenant's actor calling alice's task: forbidden.
    let msid = open_session(&url, MALLORY);
    let m = call(
        &url,
        MALLORY,
        &msid,
        33,
        "counted",
        json!({"code": "print(1)\n"}),
    );
    check(&m, &out_schema("counted"), "forbidden");
}

/// Item 8: the service log does not quote invalid arguments (they can contain uploaded text
/// or code); it names the reason only.
#[test]
fn logs_do_not_quote_invalid_arguments() {
    let dir = common::tmp();
    let s = serve(dir.path());
    let url = format!("{}/mcp", s.base);
    let sid = open_session(&url, ALICE);
    let marker = "SECRET-MARKER-3f9c1e";
    let bad = [
        (
            "counted",
            json!({"code": 7, "request_id": format!("{marker}/x")}),
        ),
        (
            "counted",
            json!({"code": format!("print('{marker}')"), "extra": marker}),
        ),
        (
            "upload_input",
            json!({"media_type": "text/csv", "text": marker, "name": format!("../{marker}")}),
        ),
        ("get_run", json!({"request_id": format!("{marker} !")})),
        ("no_such_tool", json!({"x": marker})),
    ];
    for (i, (tool, args)) in bad.into_iter().enumerate() {
        let m = call(&url, ALICE, &sid, 40 + i as u64, tool, args);
        assert!(
            m.get("error").is_some() || m["result"]["isError"] == true,
            "{m}"
        );
        if i == 0 {
            // The client still learns where and why.
            let msg = m["error"]["message"].as_str().unwrap();
            assert!(
                msg.contains("/request_id") && msg.contains("pattern"),
                "{msg}"
            );
            assert!(msg.contains("/code") && msg.contains("type"), "{msg}");
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let log = s.log();
    assert!(
        !log.contains(marker),
        "the service log quotes the arguments:\n{log}"
    );
    let audit = std::fs::read_to_string(dir.path().join("data/private/audit.jsonl")).unwrap();
    assert!(
        !audit.contains(marker),
        "the audit log quotes the arguments"
    );
}

/// Item 7 over HTTP: a POST body that is not JSON gets 400 with the JSON-RPC parse error.
#[test]
fn http_malformed_json_gets_400_parse_error() {
    let dir = common::tmp();
    let s = serve(dir.path());
    let url = format!("{}/mcp", s.base);
    for sid in [None, Some(open_session(&url, ALICE))] {
        let r = http(
            "POST",
            &url,
            ALICE,
            sid.as_deref(),
            Some("{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": ".into()),
        );
        assert_eq!(r.status, 400, "{}", r.body);
        let v: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["error"]["code"], -32700, "{v}");
        assert_eq!(v["id"], Value::Null);
    }
}

/// Item 7 over stdio: a malformed line and an over-long line each get a -32700 response
/// instead of silence, and the session goes on.
#[test]
fn stdio_bad_framing_gets_parse_errors() {
    use std::io::Write;
    let dir = common::tmp();
    let cfg = write_config(
        dir.path(),
        &format!(
            "[server]\nmax_input_bytes = 3000\nmax_request_bytes = 1000\n{}",
            config()
        ),
    );
    let mut child = Command::new(common::bin())
        .args(["mcp", "--tenant", "acme", "--actor", "alice", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("AGENTJAIL_TOKEN", ALICE)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut stdin = child.stdin.take().unwrap();
    let next = |what: &str| -> Value {
        let l = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no response to {what} within 30 s"));
        serde_json::from_str(&l).unwrap()
    };
    stdin.write_all(b"{this is not json\n").unwrap();
    stdin.flush().unwrap();
    let v = next("a malformed line");
    assert_eq!(v["error"]["code"], -32700, "{v}");
    let long = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"ping\",\"params\":{{\"pad\":\"{}\"}}}}\n",
        "x".repeat(20_000)
    );
    stdin.write_all(long.as_bytes()).unwrap();
    stdin.flush().unwrap();
    let v = next("an over-long line");
    assert_eq!(v["error"]["code"], -32700, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("limit"),
        "{v}"
    );
    // The session goes on.
    stdin
        .write_all(format!("{}\n", json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"edges","version":"1"}}})).as_bytes())
        .unwrap();
    stdin.flush().unwrap();
    let v = next("initialize");
    assert_eq!(v["id"], 1, "{v}");
    assert!(v["result"]["serverInfo"].is_object(), "{v}");
    drop(stdin);
    let _ = child.wait();
}
