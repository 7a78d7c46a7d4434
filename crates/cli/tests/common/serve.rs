//! Setting up `agentjail serve` / `agentjail mcp` for a test: the configuration's pieces (token
//! digests, the example task's output schema, the shared task tables), token files, and a
//! started `agentjail serve` on 127.0.0.1 whose stderr is kept for assertions.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

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

/// The `[tasks.sleepy]` table: model-proposed Python for up to two minutes, for `alice`.
pub const SLEEPY_TASK: &str = r#"
[tasks.sleepy]
description = "Runs code for up to two minutes"
code = "allowed"
command = ["/usr/bin/python3", "/input/code.py"]
allowed_actors = ["alice"]
[tasks.sleepy.output]
path = "/output/o.json"
media_type = "application/json"
max_bytes = 1000
[tasks.sleepy.limits]
seconds = 120
"#;

/// The configuration the MCP client tests (Python and TypeScript SDKs) share: tenant `acme`,
/// actors `alice` and `ops` (an operator), `summarize_csv` (with `schema` and its time limit),
/// `sleepy` and the operators' `admin_only`.
pub fn mcp_config(alice_token: &str, ops_token: &str, schema: &str, seconds: u32) -> String {
    format!(
        r#"
[tenants.acme]

[actors.alice]
tenant = "acme"
token_sha256 = "{a}"

[actors.ops]
tenant = "acme"
token_sha256 = "{o}"
operator = true

[tasks.summarize_csv]
description = "Summarize one CSV with model-proposed Python"
code = "allowed"
command = ["/usr/bin/python3", "/input/code.py", "/input/data.csv", "/output/summary.json"]
allowed_actors = ["alice"]
expose_stderr_bytes = 2048
[[tasks.summarize_csv.inputs]]
mount = "/input/data.csv"
media_types = ["text/csv"]
max_bytes = 100000
[tasks.summarize_csv.output]
path = "/output/summary.json"
media_type = "application/json"
max_bytes = 100000
schema = '''{schema}'''
[tasks.summarize_csv.limits]
seconds = {seconds}
{SLEEPY_TASK}
[tasks.admin_only]
description = "Fixed program for operators"
code = "forbidden"
command = ["/usr/bin/python3", "-c", "print(1)"]
allowed_actors = ["ops"]
[[tasks.admin_only.inputs]]
mount = "/input/data.csv"
media_types = ["text/csv"]
max_bytes = 100000
[tasks.admin_only.output]
path = "/output/o.json"
media_type = "application/json"
max_bytes = 1000
"#,
        a = sha256_hex(alice_token),
        o = sha256_hex(ops_token),
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
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentjail"));
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
