//! `server.selftest`: run `agentjail selftest` (the runner binary's own escape corpus,
//! docs/selftest.md) before the service listens; refuse to start on a failed probe in `refuse`
//! mode, log it in `warn` mode; expose the result on `/healthz` and in `/metrics`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde::Serialize;
use utoipa::ToSchema;

use crate::app::ServerError;

/// What `serve` does with the self-test at start-up (a configuration type, `server.selftest`).
pub use crate::config::SelftestMode;

/// The start-up self-test's result, as `/healthz` shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SelftestStatus {
    /// `warn` or `refuse`.
    pub mode: String,
    /// No probe failed.
    pub passed: bool,
    pub probes_passed: u64,
    pub probes_failed: u64,
    pub probes_skipped: u64,
    /// Ids of the failed probes.
    pub failed_probes: Vec<String>,
    /// `strict` or `degraded` (a strict run is refused on this host).
    pub sandbox_mode: String,
    /// RFC 3339.
    pub started_at: String,
    /// The sha256 (`sha256:<hex>`) of the attestation the self-test signed with this node's
    /// receipt key (`DATA/private/selftest-attestation.json`; `agentjail receipt verify`
    /// checks it and says what it attests); None if it could not be written.
    pub attestation_sha256: Option<String>,
}

static STATUS: OnceLock<SelftestStatus> = OnceLock::new();

/// The file this process's self-test signed its attestation into, until published.
static SIGNED: OnceLock<std::path::PathBuf> = OnceLock::new();

/// Makes this process's self-test attestation the node's
/// (`DATA/private/selftest-attestation.json`), once the process holds the data directory;
/// an earlier start's is removed when this one has none, and so are the files of starts
/// that never got the directory.
pub(crate) fn publish_attestation(data_dir: &Path) {
    let private = data_dir.join("private");
    let node = private.join("selftest-attestation.json");
    match SIGNED.get() {
        Some(mine) => {
            if let Err(e) = std::fs::rename(mine, &node) {
                tracing::warn!(error = %e, "keeping the self-test's attestation failed");
            }
        }
        None => {
            let _ = std::fs::remove_file(&node);
        }
    }
    if let Ok(rd) = std::fs::read_dir(&private) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("selftest-attestation.") && n != "selftest-attestation.json" {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// The result of the start-up self-test, if one ran.
pub fn status() -> Option<SelftestStatus> {
    STATUS.get().cloned()
}

/// Runs `runner selftest --json --tier native` when `mode` asks for it, its attestation
/// signed with the node's receipt key into `DATA/private/selftest-attestation.json`.
pub(crate) fn at_startup(
    runner: &Path,
    mode: SelftestMode,
    data_dir: &Path,
) -> Result<(), ServerError> {
    let word = match mode {
        SelftestMode::Off => return Ok(()),
        SelftestMode::Warn => "warn",
        SelftestMode::Refuse => "refuse",
    };
    eprintln!(
        "agentjail serve: running `{} selftest` (server.selftest = \"{word}\") …",
        runner.display()
    );
    // Signed to a file of this process, made the node's attestation (`publish_attestation`)
    // only once this process holds the data directory: a second `serve` on a directory in
    // use never replaces the running node's.
    let private = data_dir.join("private");
    let attestation = private.join(format!("selftest-attestation.{}.json", std::process::id()));
    let out = Command::new(runner)
        .args(["selftest", "--json", "--tier", "native", "--receipt"])
        .arg(&attestation)
        .arg("--key")
        .arg(private.join("receipt-key.pem"))
        .stdin(Stdio::null())
        .output();
    let parsed = out
        .map_err(|e| format!("cannot run {}: {e}", runner.display()))
        .and_then(|o| {
            serde_json::from_slice::<serde_json::Value>(&o.stdout).map_err(|_| {
                let said = String::from_utf8_lossy(&o.stderr);
                let last = said
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("");
                format!(
                    "{} selftest printed no result (exit {:?}): {}",
                    runner.display(),
                    o.status.code(),
                    last.chars().take(300).collect::<String>()
                )
            })
        });
    let v = match parsed {
        Ok(v) => v,
        Err(e) if mode == SelftestMode::Refuse => {
            return Err(ServerError::Io(format!(
                "self-test could not run: {e}; refusing to start (server.selftest = \"refuse\")"
            )));
        }
        Err(e) => {
            tracing::warn!("self-test could not run: {e}");
            eprintln!("agentjail serve: warning: self-test could not run: {e}");
            return Ok(());
        }
    };
    let n = |k: &str| v["summary"][k].as_u64().unwrap_or(0);
    let failed_probes: Vec<String> = v["probes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|p| p["outcome"] == "fail")
                .filter_map(|p| p["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let st = SelftestStatus {
        mode: word.into(),
        passed: v["passed"] == true && failed_probes.is_empty(),
        probes_passed: n("passed"),
        probes_failed: n("failed"),
        probes_skipped: n("skipped"),
        failed_probes,
        sandbox_mode: v["mode"].as_str().unwrap_or("").into(),
        started_at: v["started_at"].as_str().unwrap_or("").into(),
        attestation_sha256: std::fs::read(&attestation)
            .ok()
            .map(|b| format!("sha256:{}", crate::config::sha256_hex(&b))),
    };
    if st.attestation_sha256.is_some() {
        let _ = SIGNED.set(attestation);
    }
    let line = format!(
        "self-test: {} passed, {} failed, {} skipped{}",
        st.probes_passed,
        st.probes_failed,
        st.probes_skipped,
        if st.failed_probes.is_empty() {
            String::new()
        } else {
            format!(" (failed: {})", st.failed_probes.join(", "))
        }
    );
    if !st.passed && mode == SelftestMode::Refuse {
        return Err(ServerError::Io(format!(
            "{line}; refusing to start (server.selftest = \"refuse\"; docs/selftest.md)"
        )));
    }
    if st.passed {
        tracing::info!("{line}");
        eprintln!("agentjail serve: {line}");
    } else {
        tracing::warn!("{line}");
        eprintln!("agentjail serve: warning: {line}");
    }
    let _ = STATUS.set(st);
    Ok(())
}

/// Publishes the result as gauges (after the metrics recorder is installed).
pub(crate) fn publish_metrics() {
    let Some(st) = STATUS.get() else {
        return;
    };
    metrics::describe_gauge!(
        "agentjail_selftest_passed",
        "1 when every probe of the start-up self-test passed"
    );
    metrics::describe_gauge!(
        "agentjail_selftest_probes",
        "Probes of the start-up self-test by outcome"
    );
    metrics::gauge!("agentjail_selftest_passed").set(if st.passed { 1.0 } else { 0.0 });
    for (outcome, n) in [
        ("pass", st.probes_passed),
        ("fail", st.probes_failed),
        ("skip", st.probes_skipped),
    ] {
        metrics::gauge!("agentjail_selftest_probes", "outcome" => outcome).set(n as f64);
    }
}
