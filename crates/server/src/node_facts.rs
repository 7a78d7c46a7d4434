//! What this node is, for the operator console's Health page (docs/console.md): the isolation
//! facts `agentjail check` reports on its host (read once, in the background, after start-up:
//! it runs a strict sandbox, which takes a moment), the public half of its receipt key, and
//! its start-up self-test with the attestation it signed. On PostgreSQL every node publishes
//! them with its heartbeat (`workers.facts`), so any node's console lists them all and
//! verifies a receipt another node signed with that node's recorded key.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::{Value, json};

static CHECK: OnceLock<Value> = OnceLock::new();
static KEY: OnceLock<Value> = OnceLock::new();

/// Runs `runner check --json` on a thread of its own; its report becomes [`check`].
pub fn spawn_check(runner: PathBuf) {
    std::thread::spawn(move || {
        let out = std::process::Command::new(&runner)
            .args(["check", "--json"])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output();
        let v = match out {
            Ok(o) => serde_json::from_slice::<Value>(&o.stdout).unwrap_or_else(|_| {
                json!({"error": format!("`agentjail check` printed no report (exit {:?})", o.status.code())})
            }),
            Err(e) => json!({"error": format!("cannot run `agentjail check`: {e}")}),
        };
        let _ = CHECK.set(v);
    });
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
