//! What this node is, for the operator console's Health page (docs/console.md): the isolation
//! facts `agentjail check` reports on its host (read once, in the background, after start-up:
//! it runs a strict sandbox, which takes a moment), the public half of its receipt key, and
//! its start-up self-test with the attestation it signed. On PostgreSQL every node publishes
//! them with its heartbeat (`workers.facts`), so any node's console lists them all and
//! verifies a receipt another node signed with that node's recorded key.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::{Value, json};

use crate::storage::pg::FACTS_LIMIT;

static CHECK: OnceLock<Value> = OnceLock::new();
static KEY: OnceLock<Value> = OnceLock::new();

/// How long `agentjail check` may take before it is killed (its report then says so).
const CHECK_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs `runner check --json` on a thread of its own, killed after [`CHECK_LIMIT`]; its
/// report becomes [`check`].
pub fn spawn_check(runner: PathBuf) {
    std::thread::spawn(move || {
        let _ = CHECK.set(run_check(&runner));
    });
}

fn run_check(runner: &Path) -> Value {
    use std::io::Read;
    let child = std::process::Command::new(runner)
        .args(["check", "--json"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return json!({"error": format!("cannot run `agentjail check`: {e}")}),
    };
    // Read on a thread of its own (a full pipe would stall the child); bounded.
    let out = child.stdout.take().map(|o| {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = o.take(FACTS_LIMIT as u64).read_to_end(&mut b);
            b
        })
    });
    let deadline = std::time::Instant::now() + CHECK_LIMIT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            _ => {
                // The child this thread spawned and holds: never another process.
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let bytes = out.and_then(|t| t.join().ok()).unwrap_or_default();
    match status {
        None => json!({"error": format!("`agentjail check` did not finish within {} s", CHECK_LIMIT.as_secs())}),
        Some(s) => serde_json::from_slice::<Value>(&bytes).unwrap_or_else(|_| {
            json!({"error": format!("`agentjail check` printed no report (exit {:?})", s.code())})
        }),
    }
}

/// The host's isolation facts (`agentjail check --json`), once read.
pub fn check() -> Option<Value> {
    CHECK.get().cloned()
}

/// Reads the public half of the node's receipt key (`DATA/private/receipt-key.pem`).
pub fn load_key(data_dir: &Path) {
    let path = data_dir.join("private").join("receipt-key.pem");
    let v = match agentjail_verify::receipt::ReceiptKey::load(&path) {
        Ok(k) => json!({"keyid": k.keyid(), "public_key_pem": k.public_key_pem()}),
        Err(e) => json!({"error": e.to_string()}),
    };
    let _ = KEY.set(v);
}

/// The node's receipt key: `{keyid, public_key_pem}` (or `{error}`).
pub fn key() -> Value {
    KEY.get().cloned().unwrap_or(Value::Null)
}

/// All of it, as one JSON document (what a node publishes with its heartbeat).
pub fn facts() -> Value {
    json!({
        "check": check(),
        "receipt_key": key(),
        "selftest": crate::selftest::status(),
        "version": env!("CARGO_PKG_VERSION"),
    })
}
