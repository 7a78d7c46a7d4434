//! A probe run: `/bin/true` through the whole engine ([`probe_run`], [`probe_strict_run`]),
//! which `check` uses to prove what it cannot infer, and why it failed ([`ProbeError`]). The
//! crate root re-exports all three (`agentjail_engine::probe_run`, …). It calls down into the
//! supervisor; only `check` and the crate root refer to it, never a module the supervisor uses.

use crate::supervisor::{self, RunOptions, Sink, run};

/// Why a probe run of `/bin/true` did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// The probe's own manifest did not validate (a bug of ours, or of this host's paths).
    #[error("{0}")]
    Manifest(String),
    /// Refused before the sandbox was built, for want of a protection (a missing cgroup,
    /// Landlock): the report's reason, `refusing to run without: …`.
    #[error("{0}")]
    Refused(String),
    /// The run started and failed: the report's reason, or its status.
    #[error("{0}")]
    Failed(String),
}

/// Runs `/bin/true` with every protection required; `Err` says why that is not possible here.
pub fn probe_strict_run() -> Result<(), ProbeError> {
    probe_run(false)
}

/// Runs `/bin/true`, with `allow_degraded` as `--allow-degraded` would; `Err` says why it failed.
pub fn probe_run(allow_degraded: bool) -> Result<(), ProbeError> {
    let vm = agentjail_manifest::Manifest::for_command(vec!["/bin/true".into()])
        .validate(
            &agentjail_manifest::SourcePolicy {
                base_dir: "/".into(),
                roots: None,
            },
            jiff::Timestamp::now(),
        )
        .map_err(|e| ProbeError::Manifest(e.to_string()))?;
    let opts = RunOptions {
        allow_degraded,
        stdout: Sink::Capture,
        stderr: Sink::Capture,
        egress_dns: Vec::new(),
        lifeline: None,
        lease: None,
        workspace_restore: None,
        live_denials: None,
        stdin: None,
    };
    let out = run(&vm, &opts, None);
    match out.report.status {
        agentjail_manifest::report::Status::Ok => Ok(()),
        s => match out.report.error {
            Some(e) if e.starts_with(supervisor::REFUSAL_PREFIX) => Err(ProbeError::Refused(e)),
            Some(e) => Err(ProbeError::Failed(e)),
            None => Err(ProbeError::Failed(format!(
                "/bin/true ended with status {s:?}"
            ))),
        },
    }
}
