//! What a model needs to get a task right, driven over stdio with raw JSON-RPC (the real
//! `agentjail mcp`, no SDK between the test and the wire): tool descriptions that state the
//! runtime (probed from the task's interpreter), the output shape, where inputs are mounted and
//! the limits; failed code runs that return a bounded, sanitised, redacted stderr tail, the
//! schema errors and the limits hit; inputs named by path below the operator's `--input-root`s
//! (and nothing outside them); and a naive agent that gets a verified result by its second
//! attempt using only what tools/list and the call results say.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::serve::{actor, fixed_task};
use common::serve::{
    example_schema, json_output, python_code_task, sha256_hex, summarize_csv_task,
};

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use serde_json::{Value, json};

const ALICE: &str = "tok-alice-agent-2f81c3";
/// A secret in the task's env: it must never reach the agent.
const SECRET: &str = "sk-agentjail-secret-7f3a9c51";
const CSV: &str = "region,units,price\nnorth,12,2.5\nsouth,7,3.0\neast,,4.0\n";

fn config() -> String {
    format!(
        r#"
[server]
max_input_bytes = 4096

[tenants.acme]

{alice}{summarize}{slow}{fixed}{fixed_output}
[tasks.custom_rt]
description = "Runs model-proposed code in a runtime the operator describes"
code = "allowed"
runtime = "Custom runtime note: Python 3 with the operator's plotting kit"
command = ["/usr/bin/python3", "/input/code.py"]
allowed_actors = ["alice"]
{custom_output}"#,
        alice = actor("alice", "acme", ALICE, false),
        fixed = fixed_task(
            "fixed_fail",
            "A fixed program that fails",
            r#"["/usr/bin/python3", "-c", "import sys; sys.stderr.write('FIXED-STDERR-SENTINEL\\n'); sys.exit(3)"]"#,
            r#"allowed_actors = ["alice"]"#,
        ),
        summarize = summarize_csv_task(
            &format!(
                "env = {{ LANG = \"C.UTF-8\", API_KEY = \"{SECRET}\" }}\nallowed_actors = [\"alice\"]"
            ),
            4096,
            &example_schema(),
            "seconds = 20\nmemory_mb = 256\nprocesses = 16",
        ),
        slow = python_code_task(
            "slow",
            "Runs model-proposed Python for at most 2 s",
            r#"allowed_actors = ["alice"]"#,
            2,
        ),
        fixed_output = json_output("fixed_fail", "o.json", 1000),
        custom_output = json_output("custom_rt", "o.json", 1000),
    )
}

/// One `agentjail mcp` process spoken to with JSON-RPC lines.
struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    rx: Receiver<String>,
    next_id: u64,
    data: PathBuf,
}

impl Drop for Session {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Session {
    fn start(dir: &Path, extra: &[&str]) -> Session {
        let cfg = common::serve::write_config(dir, &config());
        let data = dir.join("data");
        let mut child = Command::new(common::bin())
            .args(["mcp", "--tenant", "acme", "--actor", "alice", "--config"])
            .arg(&cfg)
            .arg("--data-dir")
            .arg(&data)
            .args(extra)
            .env("AGENTJAIL_TOKEN", ALICE)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let stdin = child.stdin.take();
        let mut s = Session {
            child,
            stdin,
            rx,
            next_id: 1,
            data,
        };
        let init = s.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "naive-agent", "version": "1"}}),
        );
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        s
    }

    fn send(&mut self, v: &Value) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(format!("{v}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    /// Sends a request and returns its response (notifications in between are skipped).
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let l = self
                .rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no response to {method} within 90 s"));
            let v: Value = serde_json::from_str(&l).unwrap();
            if v["id"] == json!(id) {
                return v;
            }
        }
    }

    fn tools(&mut self) -> Vec<Value> {
        let r = self.request("tools/list", json!({}));
        r["result"]["tools"].as_array().unwrap().clone()
    }

    /// A tools/call; returns the whole JSON-RPC response (result or error).
    fn call(&mut self, tool: &str, args: Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": args}))
    }

    fn upload_csv(&mut self) -> String {
        let r = self.call(
            "upload_input",
            json!({"media_type": "text/csv", "name": "report.csv", "text": CSV}),
        );
        r["result"]["structuredContent"]["input_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}"))
            .to_string()
    }

    fn audit(&self) -> Vec<Value> {
        let p = self.data.join("private/audit.jsonl");
        agentjail_server::audit::verify_chain(&p).unwrap();
        std::fs::read_to_string(&p)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// All text blocks of a tool result, joined.
fn text_of(r: &Value) -> String {
    r["result"]["content"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

fn description(tools: &[Value], name: &str) -> String {
    tools
        .iter()
        .find(|t| t["name"] == name)
        .and_then(|t| t["description"].as_str())
        .unwrap_or_else(|| panic!("no tool {name}"))
        .to_string()
}

/// The interpreter's version as the test sees it, independently of the server.
fn host_python_version() -> String {
    let out = Command::new("/usr/bin/python3")
        .args(["-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn host_python_has(module: &str) -> bool {
    Command::new("/usr/bin/python3")
        .args(["-s", "-c", &format!("import {module}")])
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Item 4: tools/list alone tells the model the runtime, the output shape, the input mounts and
/// the limits, for the example task; an operator's `runtime` note replaces the probe.
#[test]
fn task_descriptions_state_runtime_output_shape_inputs_and_limits() {
    let dir = common::tmp();
    let mut s = Session::start(dir.path(), &[]);
    let tools = s.tools();
    let d = description(&tools, "summarize_csv");
    eprintln!("summarize_csv description:\n{d}");
    let version = host_python_version();
    assert!(
        d.contains(&format!("Python {version}")),
        "runtime version {version} missing: {d}"
    );
    if host_python_has("pandas") {
        assert!(d.contains("pandas"), "{d}");
    } else {
        assert!(
            d.contains("not installed") && d.contains("pandas"),
            "pandas is not importable here, the description must say so: {d}"
        );
    }
    // The output shape, derived from the output schema.
    assert!(
        d.contains("/output/summary.json: {rows: integer, columns: [string], numeric: {<key>: {count: integer, missing: integer, min: number, max: number, mean: number, sum: number}}}"),
        "{d}"
    );
    assert!(d.contains("/input/data.csv"), "{d}");
    assert!(d.contains("/input/code.py"), "{d}");
    for fact in [
        "20 s",
        "256 MiB memory",
        "16 processes",
        "100000 bytes",
        "network denied",
    ] {
        assert!(d.contains(fact), "limit {fact:?} missing: {d}");
    }
    assert!(d.len() <= 2000, "description too long: {} bytes", d.len());
    let c = description(&tools, "custom_rt");
    assert!(
        c.contains("Custom runtime note: Python 3 with the operator's plotting kit"),
        "{c}"
    );
    assert!(
        !c.contains("not installed"),
        "the note replaces the probe: {c}"
    );
}

/// Item 5: a failed run of model code returns the stderr tail (bounded, sanitised, labelled
/// untrusted, the task's env values redacted), the schema errors of its output, and the limits
/// it hit; a fixed program's stderr is never returned.
#[test]
fn failed_code_runs_return_a_sanitised_redacted_tail_schema_errors_and_limits() {
    let dir = common::tmp();
    let mut s = Session::start(dir.path(), &[]);
    let input = s.upload_csv();

    // A traceback after 100 noisy lines, with terminal escapes and the secret env value.
    let code = r#"
import os, sys
for i in range(100):
    sys.stderr.write("noise line %d\n" % i)
sys.stderr.write("key=" + os.environ["API_KEY"] + "\x1b]0;pwned\x07\x1b[2J\n")
raise RuntimeError("ZZ-LAST-LINE-SENTINEL")
"#;
    let r = s.call(
        "summarize_csv",
        json!({"input_id": input, "code": code, "request_id": "tail-1"}),
    );
    assert_eq!(r["result"]["isError"], true, "{r}");
    let all = r.to_string();
    assert!(
        !all.contains(SECRET),
        "the env secret reached the agent: {all}"
    );
    let text = text_of(&r);
    let tail = r["result"]["_meta"]["dev.agentjail/error"]["stderr_tail_untrusted"]
        .as_str()
        .unwrap_or_else(|| panic!("no stderr tail: {r}"))
        .to_string();
    assert!(text.contains("UNTRUSTED"), "{text}");
    assert!(tail.contains("ZZ-LAST-LINE-SENTINEL"), "{tail}");
    assert!(tail.contains("RuntimeError"), "{tail}");
    assert!(tail.contains("key=[redacted]"), "{tail}");
    assert!(!tail.contains('\x1b') && !tail.contains('\x07'), "{tail:?}");
    assert!(tail.contains("\\x1b"), "escapes are shown inert: {tail:?}");
    assert!(tail.len() <= 2048 + 64, "{} bytes", tail.len());
    assert!(tail.lines().count() <= 40, "{} lines", tail.lines().count());
    assert!(!tail.contains("noise line 0\n"), "bounded to the tail");
    // The sandbox's bytes only: agentjail's own summary line is not among them (issue #33).
    assert!(!tail.contains("agentjail: run ended"), "{tail}");
    let run_meta = &r["result"]["_meta"]["dev.agentjail/run"];
    assert_eq!(run_meta["stderr"]["untrusted"], true, "{r}");
    assert!(
        run_meta["stderr"]["head"]
            .as_str()
            .unwrap_or("")
            .starts_with("noise line 0\n"),
        "the whole stderr view (head) is in the run's _meta: {r}"
    );

    // Wrong shape: the schema errors come back as a list (path + message).
    let code = r#"
import json, sys
json.dump({"rows": "3", "columns": ["a"], "numeric": {}}, open(sys.argv[2], "w"))
"#;
    let r = s.call(
        "summarize_csv",
        json!({"input_id": input, "code": code, "request_id": "shape-1"}),
    );
    assert_eq!(r["result"]["isError"], true, "{r}");
    let errs = &r["result"]["_meta"]["dev.agentjail/error"]["schema_errors"];
    let errs = errs.as_array().unwrap_or_else(|| panic!("{r}"));
    assert!(
        errs.iter().any(
            |e| e["path"] == "/rows" && e["message"].as_str().unwrap_or("").contains("integer")
        ),
        "{r}"
    );

    // A limit hit is named.
    let r = s.call(
        "slow",
        json!({"code": "import time\ntime.sleep(30)\n", "request_id": "slow-1"}),
    );
    assert_eq!(r["result"]["isError"], true, "{r}");
    let hit = &r["result"]["_meta"]["dev.agentjail/error"]["limits_hit"];
    assert!(
        hit.as_array()
            .unwrap_or_else(|| panic!("{r}"))
            .iter()
            .any(|h| h["limit"] == "time"),
        "{r}"
    );

    // Output over the task's max_bytes (1000) is named as the output limit.
    let r = s.call(
        "slow",
        json!({"code": "open('/output/o.json', 'w').write('[' + '1,' * 3000 + '1]')\n", "request_id": "big-1"}),
    );
    assert_eq!(r["result"]["isError"], true, "{r}");
    let hit = &r["result"]["_meta"]["dev.agentjail/error"]["limits_hit"];
    assert!(
        hit.as_array()
            .unwrap_or_else(|| panic!("{r}"))
            .iter()
            .any(|h| h["limit"] == "output"),
        "{r}"
    );

    // A fixed program's stderr is not the model's: never returned (no opt-in configured).
    let r = s.call("fixed_fail", json!({"request_id": "fixed-1"}));
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(!r.to_string().contains("FIXED-STDERR-SENTINEL"), "{r}");
}

/// Item 6: `--input-root DIR` lets a call name a file below DIR by path; nothing outside the
/// roots is ever read (`..`, absolute paths, symlinks out, a symlink swapped during the calls),
/// FIFOs and devices are refused without hanging, and size is bounded. Stored content-addressed
/// like uploads and audited.
#[test]
fn input_roots_name_files_by_path_and_nothing_outside() {
    use std::os::unix::fs::symlink;
    let dir = common::tmp();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("sub/data.csv"), CSV).unwrap();
    let outside = dir.path().join("outside.csv");
    let secret = "region,units\nOUTSIDE-SECRET,1\n";
    std::fs::write(&outside, secret).unwrap();
    symlink(&outside, root.join("link-out.csv")).unwrap();
    symlink("../outside.csv", root.join("rel-out.csv")).unwrap();
    symlink("sub/data.csv", root.join("link-in.csv")).unwrap();
    symlink(dir.path(), root.join("dir-out")).unwrap();
    std::fs::write(root.join("big.csv"), "x".repeat(5000)).unwrap();
    let fifo = root.join("fifo.csv");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    symlink("/dev/zero", root.join("zero.csv")).unwrap();
    assert!(
        Command::new("mknod")
            .args([root.join("null.csv").to_str().unwrap(), "c", "1", "3"])
            .status()
            .unwrap()
            .success()
    );
    let mut s = Session::start(dir.path(), &["--input-root", root.to_str().unwrap()]);

    // The tool says where it may read from.
    let tools = s.tools();
    let up = tools.iter().find(|t| t["name"] == "upload_input").unwrap();
    assert!(up["inputSchema"]["properties"]["path"].is_object(), "{up}");
    assert!(
        up["description"]
            .as_str()
            .unwrap()
            .contains(root.to_str().unwrap()),
        "{up}"
    );

    let by_path = |s: &mut Session, p: &str| {
        s.call("upload_input", json!({"media_type": "text/csv", "path": p}))
    };
    // Allowed: relative to the root, absolute below it, and a symlink that stays inside.
    for p in [
        "sub/data.csv".to_string(),
        root.join("sub/data.csv").to_str().unwrap().to_string(),
        "link-in.csv".to_string(),
    ] {
        let r = by_path(&mut s, &p);
        let sc = &r["result"]["structuredContent"];
        assert_eq!(
            sc["sha256"],
            format!("sha256:{}", sha256_hex(CSV.as_bytes())),
            "{p}: {r}"
        );
        // The name is the file name as given (a symlink's own name).
        let given = Path::new(&p).file_name().unwrap().to_str().unwrap();
        assert_eq!(sc["name"], given, "{p}: {r}");
    }
    // And the stored input runs like an upload.
    let r = by_path(&mut s, "sub/data.csv");
    let id = r["result"]["structuredContent"]["input_id"]
        .as_str()
        .unwrap()
        .to_string();
    let code = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/csv-summary/summarize.py"),
    )
    .unwrap();
    let r = s.call(
        "summarize_csv",
        json!({"input_id": id, "code": code, "request_id": "by-path"}),
    );
    assert_eq!(r["result"]["structuredContent"]["rows"], 3, "{r}");

    // Refused: every way out, special files and a file over max_input_bytes.
    let refused = [
        "../outside.csv".to_string(),
        "sub/../../outside.csv".to_string(),
        outside.to_str().unwrap().to_string(),
        "/etc/passwd".to_string(),
        "link-out.csv".to_string(),
        "rel-out.csv".to_string(),
        "dir-out/outside.csv".to_string(),
        "/proc/self/root/etc/passwd".to_string(),
        "fifo.csv".to_string(),
        "zero.csv".to_string(),
        "null.csv".to_string(),
        "big.csv".to_string(),
        "sub".to_string(),
        "missing.csv".to_string(),
    ];
    for p in &refused {
        let t = std::time::Instant::now();
        let r = by_path(&mut s, p);
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{p}: took {:?}",
            t.elapsed()
        );
        let refusedp = r["error"]["code"] == -32602 || r["result"]["isError"] == true;
        assert!(refusedp, "{p} was not refused: {r}");
        assert!(!r.to_string().contains("OUTSIDE-SECRET"), "{p}: {r}");
        assert!(r["result"]["structuredContent"].is_null(), "{p}: {r}");
    }

    // A symlink swapped between inside and outside while calls run (best effort): no call may
    // ever store the outside file.
    let swap = root.join("swap.csv");
    symlink("sub/data.csv", &swap).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flipper = {
        let (stop, swap, outside) = (stop.clone(), swap.clone(), outside.clone());
        std::thread::spawn(move || {
            let tmp = swap.with_extension("tmp");
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = std::fs::remove_file(&tmp);
                let target: PathBuf = if i.is_multiple_of(2) {
                    outside.clone()
                } else {
                    "sub/data.csv".into()
                };
                symlink(&target, &tmp).unwrap();
                std::fs::rename(&tmp, &swap).unwrap();
                i += 1;
            }
        })
    };
    let outside_sha = format!("sha256:{}", sha256_hex(secret.as_bytes()));
    let mut stored = 0;
    for _ in 0..60 {
        let r = by_path(&mut s, "swap.csv");
        assert!(!r.to_string().contains(&outside_sha), "{r}");
        if r["result"]["structuredContent"]["sha256"].is_string() {
            stored += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flipper.join().unwrap();
    eprintln!("swap: {stored} of 60 calls read the inside target");

    // Audited: each read by path, allowed or refused, without the content.
    let audit = s.audit();
    let reads: Vec<&Value> = audit
        .iter()
        .filter(|e| e["event"] == "input_path_read")
        .collect();
    assert!(
        reads.iter().any(|e| e["decision"] == "allow"
            && e["reason"]
                .as_str()
                .unwrap_or("")
                .contains(&sha256_hex(CSV.as_bytes()))),
        "{reads:?}"
    );
    assert!(
        reads.iter().filter(|e| e["decision"] == "deny").count() >= refused.len(),
        "{reads:?}"
    );
    let log = std::fs::read_to_string(s.data.join("private/audit.jsonl")).unwrap();
    assert!(!log.contains("north,12") && !log.contains("OUTSIDE-SECRET"));
}

/// Without `--input-root`, `upload_input` takes no path at all.
#[test]
fn without_input_roots_no_path_is_accepted() {
    let dir = common::tmp();
    let mut s = Session::start(dir.path(), &[]);
    let tools = s.tools();
    let up = tools.iter().find(|t| t["name"] == "upload_input").unwrap();
    assert!(up["inputSchema"]["properties"]["path"].is_null(), "{up}");
    let r = s.call(
        "upload_input",
        json!({"media_type": "text/csv", "path": "/etc/passwd"}),
    );
    assert_eq!(r["error"]["code"], -32602, "{r}");
}

/// The naive agent loop: an agent that knows nothing but tools/list and the call results.
/// Attempt 1 writes what a model often writes first; the fix is scripted but keyed off the
/// result's text (asserted present), and attempt 2 returns a verified result.
#[test]
fn a_naive_agent_gets_a_verified_result_by_its_second_attempt() {
    let dir = common::tmp();
    let mut s = Session::start(dir.path(), &[]);
    let tools = s.tools();
    let d = description(&tools, "summarize_csv");
    let input = s.upload_csv();

    // Scenario A: pandas.
    let pandas = r#"
import json, sys
import pandas as pd
df = pd.read_csv(sys.argv[1])
json.dump({"rows": len(df), "columns": list(df.columns), "numeric": {}}, open(sys.argv[2], "w"))
"#;
    let stdlib = r#"
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1], newline="")))
cols = list(rows[0].keys()) if rows else []
json.dump({"rows": ROWS, "columns": cols, "numeric": {}}, open(sys.argv[2], "w"))
"#;
    let first = pandas;
    let r = s.call(
        "summarize_csv",
        json!({"input_id": input, "code": first, "request_id": "agent-a1"}),
    );
    let first_ok = r["result"]["isError"] == false;
    if first_ok {
        // Only when this host's interpreter has pandas, and then the description said so.
        assert!(d.contains("pandas") && !d.contains("not installed: pandas"));
    } else {
        let said = text_of(&r);
        let missing_module = said.contains("ModuleNotFoundError: No module named 'pandas'");
        let stdlib_only = d.contains("not installed") && d.contains("pandas");
        assert!(
            missing_module,
            "the result must show why (stderr tail): {said}"
        );
        assert!(
            stdlib_only,
            "the description must say pandas is missing: {d}"
        );
        // The fix, keyed off what the result and description said: the standard library.
        let code = stdlib.replace("ROWS", "len(rows)");
        let r = s.call(
            "summarize_csv",
            json!({"input_id": input, "code": code, "request_id": "agent-a2"}),
        );
        assert_eq!(r["result"]["isError"], false, "{r}");
        assert_eq!(r["result"]["structuredContent"]["rows"], 3, "{r}");
        assert_eq!(r["result"]["_meta"]["dev.agentjail/run"]["receipt"], true);
    }

    // Scenario B: the wrong shape (rows as a string).
    let code = stdlib.replace("ROWS", "str(len(rows))");
    let r = s.call(
        "summarize_csv",
        json!({"input_id": input, "code": code, "request_id": "agent-b1"}),
    );
    assert_eq!(r["result"]["isError"], true, "{r}");
    let errs = r["result"]["_meta"]["dev.agentjail/error"]["schema_errors"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let said = text_of(&r);
    // The agent reads which field is wrong and what type it must have.
    let (field, want) = errs
        .iter()
        .find_map(|e| {
            let path = e["path"].as_str()?.trim_start_matches('/').to_string();
            let msg = e["message"].as_str()?;
            let want = ["integer", "number", "string", "array", "object"]
                .into_iter()
                .find(|t| msg.contains(t))?;
            Some((path, want))
        })
        .unwrap_or_else(|| panic!("no usable schema error: {r}"));
    assert!(
        said.contains(&format!("/{field}")),
        "the text names it too: {said}"
    );
    assert_eq!((field.as_str(), want), ("rows", "integer"));
    let fixed = match want {
        "integer" => stdlib.replace("ROWS", "int(str(len(rows)))"),
        _ => unreachable!(),
    };
    let r = s.call(
        "summarize_csv",
        json!({"input_id": input, "code": fixed, "request_id": "agent-b2"}),
    );
    assert_eq!(r["result"]["isError"], false, "{r}");
    assert_eq!(r["result"]["structuredContent"]["rows"], 3, "{r}");
    assert_eq!(r["result"]["_meta"]["dev.agentjail/run"]["status"], "ok");
}
