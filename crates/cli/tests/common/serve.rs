//! Setting up `agentjail serve` / `agentjail mcp` for a test: the configuration's pieces (token
//! digests, the example task's output schema, the shared task tables), token files, and a
//! started `agentjail serve` on 127.0.0.1 whose stderr is kept for assertions.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

/// The lowercase hex SHA-256 of `s`: what a configuration's `token_sha256` holds.
pub fn sha256_hex(s: impl AsRef<[u8]>) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(s.as_ref())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The output schema of the example configuration's `summarize_csv` task (its `schema = '''…'''`).
pub fn example_schema() -> String {
    let example = agentjail_server::example_config();
    example
        .split("schema = '''")
        .nth(1)
        .and_then(|s| s.split("'''").next())
        .expect("the example configuration has a `schema = '''…'''` block")
        .to_string()
}

/// Writes `toml` to `DIR/config.toml`; returns its path.
pub fn write_config(dir: &Path, toml: &str) -> PathBuf {
    let cfg = dir.join("config.toml");
    std::fs::write(&cfg, toml).expect("write config.toml");
    cfg
}

/// Writes `token` to `DIR/NAME` with mode 0600 (what `--token-file` accepts); returns its path.
pub fn write_token(dir: &Path, name: &str, token: &str) -> PathBuf {
    let tok = dir.join(name);
    std::fs::write(&tok, token).expect("write the token file");
    std::fs::set_permissions(&tok, std::fs::Permissions::from_mode(0o600))
        .expect("make the token file 0600");
    tok
}

/// `[actors.NAME]` of `tenant`, holding `token` (its digest), an operator when `operator`.
pub fn actor(name: &str, tenant: &str, token: &str, operator: bool) -> String {
    format!(
        "\n[actors.{name}]\ntenant = \"{tenant}\"\ntoken_sha256 = \"{}\"\n{}",
        sha256_hex(token),
        if operator { "operator = true\n" } else { "" }
    )
}

/// `[tasks.NAME]` running a fixed program (`code = "forbidden"`): `command` is its TOML array,
/// `who` the line naming its callers.
pub fn fixed_task(name: &str, description: &str, command: &str, who: &str) -> String {
    format!(
        "\n[tasks.{name}]\ndescription = \"{description}\"\ncode = \"forbidden\"\ncommand = {command}\n{who}\n"
    )
}

/// `[[tasks.TASK.inputs]]`: one CSV mounted at `/input/data.csv`, of at most `max_bytes`.
pub fn csv_input(task: &str, max_bytes: u32) -> String {
    format!(
        "[[tasks.{task}.inputs]]\nmount = \"/input/data.csv\"\nmedia_types = [\"text/csv\"]\nmax_bytes = {max_bytes}\n"
    )
}

/// `[tasks.TASK.output]`: JSON at `/output/FILE`, of at most `max_bytes`.
pub fn json_output(task: &str, file: &str, max_bytes: u32) -> String {
    format!(
        "[tasks.{task}.output]\npath = \"/output/{file}\"\nmedia_type = \"application/json\"\nmax_bytes = {max_bytes}\n"
    )
}

/// `[tasks.NAME]` running model-proposed Python (`/input/code.py`) with an `o.json` output of
/// at most 1000 bytes and a time limit; `who` is the line naming its callers (e.g.
/// `allowed_actors = ["alice"]`).
pub fn python_code_task(name: &str, description: &str, who: &str, seconds: u32) -> String {
    format!(
        "\n[tasks.{name}]\ndescription = \"{description}\"\ncode = \"allowed\"\ncommand = [\"/usr/bin/python3\", \"/input/code.py\"]\n{who}\n{}[tasks.{name}.limits]\nseconds = {seconds}\n",
        json_output(name, "o.json", 1000)
    )
}

/// A fixed-program task `sleeper` (tenant `acme`): prints `ran` (so every execution leaves a
/// job folder, for its stdout log), sleeps as long as its one argument says, then writes
/// `{"args": [...]}` to /output/o.json; `marker` is in its command line, so that a test can
/// find its processes; `seconds` is its time limit.
pub fn sleeper_task(marker: &str, seconds: u32) -> String {
    format!(
        r#"
[tasks.sleeper]
description = "Sleeps as long as its argument says, then writes its output"
code = "forbidden"
command = ["/usr/bin/python3", "-c", "import json, sys, time; print('ran', flush=True); time.sleep(float(sys.argv[2])); json.dump({{'args': sys.argv[1:]}}, open('/output/o.json', 'w'))", "{marker}"]
max_args = 1
allowed_tenants = ["acme"]
[tasks.sleeper.output]
path = "/output/o.json"
media_type = "application/json"
max_bytes = 1000
[tasks.sleeper.limits]
seconds = {seconds}
"#
    )
}

/// The `[tasks.sleepy]` table: model-proposed Python for up to two minutes, for `alice`.
pub fn sleepy_task() -> String {
    python_code_task(
        "sleepy",
        "Runs code for up to two minutes",
        r#"allowed_actors = ["alice"]"#,
        120,
    )
}

/// The seed's `[tasks.summarize_csv]` (model-proposed Python over one CSV of at most
/// `input_bytes`, a verified `summary.json` against `schema`): `lines` are its other keys (who
/// may call it, env, …), `limits` the lines of its limits table.
pub fn summarize_csv_task(lines: &str, input_bytes: u32, schema: &str, limits: &str) -> String {
    format!(
        r#"
[tasks.summarize_csv]
description = "Summarize one CSV with model-proposed Python"
code = "allowed"
command = ["/usr/bin/python3", "/input/code.py", "/input/data.csv", "/output/summary.json"]
{lines}
{}{}schema = '''{schema}'''
[tasks.summarize_csv.limits]
{limits}
"#,
        csv_input("summarize_csv", input_bytes),
        json_output("summarize_csv", "summary.json", 100_000),
    )
}

/// The configuration the MCP client tests (Python and TypeScript SDKs) share: tenant `acme`,
/// actors `alice` and `ops` (an operator), `summarize_csv` (with `schema` and its time limit),
/// `sleepy` and the operators' `admin_only`.
pub fn mcp_config(alice_token: &str, ops_token: &str, schema: &str, seconds: u32) -> String {
    format!(
        r#"
[tenants.acme]
{alice}{ops}{summarize}{sleepy}{admin}{input}{output}"#,
        alice = actor("alice", "acme", alice_token, false),
        ops = actor("ops", "acme", ops_token, true),
        admin = fixed_task(
            "admin_only",
            "Fixed program for operators",
            r#"["/usr/bin/python3", "-c", "print(1)"]"#,
            r#"allowed_actors = ["ops"]"#,
        ),
        summarize = summarize_csv_task(
            "allowed_actors = [\"alice\"]\nexpose_stderr_bytes = 2048",
            100_000,
            schema,
            &format!("seconds = {seconds}"),
        ),
        sleepy = sleepy_task(),
        input = csv_input("admin_only", 100_000),
        output = json_output("admin_only", "o.json", 1000),
    )
}

/// A running `agentjail serve --listen 127.0.0.1:0`, killed when dropped.
pub struct Serve {
    pub child: Child,
    /// `http://127.0.0.1:PORT`, as the server logged it.
    pub base: String,
    /// Everything the server wrote to stderr so far.
    pub log: Arc<Mutex<String>>,
}

impl Serve {
    /// Starts `agentjail serve` with `cfg` and the data directory `data` (and `env` set), and
    /// waits for its "listening on" line.
    pub fn start(cfg: &Path, data: &Path, env: &[(&str, &str)]) -> Serve {
        let mut cmd = Command::new(super::bin());
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(cfg)
            .arg("--data-dir")
            .arg(data)
            .envs(env.iter().copied());
        Serve::spawn(cmd)
    }

    /// Spawns `cmd` (an `agentjail serve` on `127.0.0.1:0`) with stderr kept, and waits for
    /// its "listening on" line.
    pub fn spawn(mut cmd: Command) -> Serve {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn agentjail serve");
        let mut lines = BufReader::new(child.stderr.take().expect("piped stderr")).lines();
        let log = Arc::new(Mutex::new(String::new()));
        let mut base = None;
        for line in lines.by_ref() {
            let line = line.expect("read the server's stderr");
            log.lock().unwrap().push_str(&(line.clone() + "\n"));
            if let Some(rest) = line.split("listening on ").nth(1) {
                base = rest.split_whitespace().next().map(str::to_string);
                break;
            }
        }
        let l2 = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                l2.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let base = base.unwrap_or_else(|| panic!("serve did not start:\n{}", log.lock().unwrap()));
        Serve { child, base, log }
    }

    /// The server's stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Kills the server and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A blocking client of one server's HTTP API, the bearer token given per call.
#[derive(Clone)]
pub struct Api {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    pub http: reqwest::blocking::Client,
}

impl Api {
    /// `method path` with `token` and an optional JSON body: the status and the JSON answer
    /// (the text as a JSON string when it is not JSON).
    pub fn send(
        &self,
        method: reqwest::Method,
        token: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let mut rq = self.http.request(method, self.url(path)).bearer_auth(token);
        if let Some(b) = body {
            rq = rq.json(&b);
        }
        let r = rq.send().expect("answered");
        let status = r.status().as_u16();
        let text = r.text().unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
        )
    }

    /// A session's cell (`POST /v1/sessions/{sid}/cells?wait=…`) running `body` followed by
    /// the write of the sessions' tests' task output ([`cell_code`]).
    pub fn cell_raw(
        &self,
        token: &str,
        sid: &str,
        request_id: &str,
        body: &str,
        wait: bool,
    ) -> (u16, serde_json::Value) {
        self.send(
            reqwest::Method::POST,
            token,
            &format!("/v1/sessions/{sid}/cells?wait={wait}"),
            Some(serde_json::json!({"request_id": request_id, "code": cell_code(body)})),
        )
    }

    pub fn new(base: &str) -> Api {
        Api {
            base: base.to_string(),
            http: reqwest::blocking::Client::builder()
                .timeout(std::time::Duration::from_secs(60))
                .build()
                .expect("an HTTP client"),
        }
    }

    pub fn url(&self, p: &str) -> String {
        format!("{}{p}", self.base)
    }

    /// Uploads `body` as the input `data.csv` of type `media_type`; it must be accepted (201).
    pub fn upload(&self, token: &str, body: &str, media_type: &str) -> serde_json::Value {
        let r = self
            .http
            .post(self.url(&format!("/v1/inputs?name=data.csv&media_type={media_type}")))
            .bearer_auth(token)
            .body(body.to_string())
            .send()
            .expect("the upload is answered");
        assert_eq!(r.status(), 201);
        r.json().expect("the upload's answer is JSON")
    }

    /// Submits a run (`query`: e.g. `?wait=true`, or empty).
    pub fn run(
        &self,
        token: &str,
        body: &serde_json::Value,
        query: &str,
    ) -> reqwest::blocking::Response {
        self.http
            .post(self.url(&format!("/v1/runs{query}")))
            .bearer_auth(token)
            .json(body)
            .send()
            .expect("the submission is answered")
    }

    /// The text of `/metrics` (unauthenticated).
    pub fn metrics(&self) -> String {
        self.http
            .get(self.url("/metrics"))
            .send()
            .and_then(|r| r.text())
            .expect("/metrics is answered")
    }

    pub fn get(&self, token: &str, p: &str) -> reqwest::blocking::Response {
        self.http
            .get(self.url(p))
            .bearer_auth(token)
            .send()
            .expect("the request is answered")
    }

    /// The run record of `request_id`, as `token`'s tenant sees it.
    pub fn status_of(&self, token: &str, request_id: &str) -> serde_json::Value {
        self.get(token, &format!("/v1/runs/{request_id}"))
            .json()
            .expect("the run record is JSON")
    }

    /// Polls the run record until its status is `want` (and returns it); panics after `secs`.
    pub fn wait_status(
        &self,
        token: &str,
        request_id: &str,
        want: &str,
        secs: u64,
    ) -> serde_json::Value {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            let v = self.status_of(token, request_id);
            if v["status"] == want {
                return v;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{request_id} never reached {want}: {v}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// One Server-Sent Event: its `id`, `event` and `data`.
#[derive(Debug, Clone, Default)]
pub struct SseEvent {
    pub id: String,
    pub event: String,
    pub data: String,
}

/// Reads Server-Sent Events from `r` (a response body), calling `each` for every event until
/// it returns false or the stream ends. Comments (keep-alives) are skipped.
pub fn read_sse(r: impl std::io::Read, mut each: impl FnMut(&SseEvent) -> bool) {
    let mut cur = SseEvent::default();
    for line in BufReader::new(r).lines() {
        let Ok(line) = line else { return };
        if line.is_empty() {
            if (!cur.event.is_empty() || !cur.data.is_empty()) && !each(&cur) {
                return;
            }
            cur = SseEvent::default();
        } else if let Some(v) = line.strip_prefix("id:") {
            cur.id = v.trim_start().to_string();
        } else if let Some(v) = line.strip_prefix("event:") {
            cur.event = v.trim_start().to_string();
        } else if let Some(v) = line.strip_prefix("data:") {
            if !cur.data.is_empty() {
                cur.data.push('\n');
            }
            cur.data.push_str(v.strip_prefix(' ').unwrap_or(v));
        }
    }
}

/// `body` as a session cell's code in the sessions' tests, which also writes their task's
/// output (`/output/o.json`), so that the cell ends `ok`.
pub fn cell_code(body: &str) -> String {
    format!("{body}\nimport json as _j\n_j.dump({{'ok': 1}}, open('/output/o.json', 'w'))\n")
}

/// The tool descriptions `agentjail mcp` (stdio, tenant `acme`, actor `alice` with `token`)
/// gives for `cfg`, by tool name: initialize, then tools/list.
pub fn mcp_descriptions(
    cfg: &Path,
    data: &Path,
    token: &str,
) -> std::collections::BTreeMap<String, String> {
    let mut child = Command::new(super::bin())
        .args(["mcp", "--tenant", "acme", "--actor", "alice", "--config"])
        .arg(cfg)
        .arg("--data-dir")
        .arg(data)
        .env("AGENTJAIL_TOKEN", token)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut ask = |id: u64, method: &str, params: Value| -> Value {
        let m = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        stdin.write_all(format!("{m}\n").as_bytes()).unwrap();
        if method == "initialize" {
            let v = rx.recv_timeout(Duration::from_secs(90)).unwrap();
            let n = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
            stdin.write_all(format!("{n}\n").as_bytes()).unwrap();
            return serde_json::from_str(&v).unwrap();
        }
        loop {
            let l = rx.recv_timeout(Duration::from_secs(90)).unwrap();
            let v: Value = serde_json::from_str(&l).unwrap();
            if v["id"] == json!(id) {
                return v;
            }
        }
    };
    ask(
        1,
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {},
               "clientInfo": {"name": "image-tasks", "version": "1"}}),
    );
    let list = ask(2, "tools/list", json!({}));
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    list["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                t["description"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The runtime line (the description's line naming Python).
pub fn runtime(d: &str) -> &str {
    d.lines()
        .find(|l| l.contains("Python "))
        .unwrap_or_else(|| panic!("no runtime line in {d}"))
}

/// The packages a runtime line names (`…these packages: a, b; …`).
pub fn runtime_packages(line: &str) -> Vec<String> {
    line.split("these packages: ")
        .nth(1)
        .map(|r| r.split(';').next().unwrap_or(""))
        .unwrap_or("")
        .split(", ")
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}
