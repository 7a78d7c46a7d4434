//! # agentjail-engine
//!
//! The Linux isolation engine: it turns a [`ValidatedManifest`] into an isolated process tree
//! and reports what happened. Every run gets new user, mount, pid, net (loopback only), ipc,
//! uts and cgroup namespaces; a root built from read-only binds of the host's system
//! directories, a curated `/etc`, a fresh `/proc`, a minimal `/dev`, bounded tmpfs for `/tmp`,
//! `/work` and `/output`, inputs bound read-only; an unprivileged uid with every capability
//! dropped; no_new_privs; Landlock limited to exactly those mounts and no TCP; a seccomp filter
//! whose refusals are reported; cgroup memory and pids limits plus rlimits; a wall-clock
//! deadline that kills the whole tree.
//!
//! Limitations: the kernel is shared (a kernel bug can break any of these layers); the host
//! image is identified, not content-pinned; cgroup v2 needs the `memory` and `pids`
//! controllers delegated to the caller's cgroup. What could not be applied is listed in the
//! report's `isolation.degraded`, and the run is refused unless the caller allowed that.
//!
//! Compatibility: Linux ≥ 5.13 on x86_64 (aarch64 compiles the same filter with its own
//! table); Landlock (any ABI) for a strict run — see [`landlock_policy`].
//!
//! Tested by the CLI's integration tests, which run the real binary and attack each layer from
//! inside (probes with sentinels), as root and as an unprivileged user.

pub mod cgroup;
pub mod check;
pub mod copies;
mod delegation;
pub mod gvisor;
pub mod image;
mod inside;
pub mod landlock_policy;
pub mod lifeline;
mod outcome;
pub mod plan;
mod root_sys;
pub mod seccomp;
mod step;
pub mod supervisor;
mod sys;
pub mod term;
pub mod timing;
mod userns;
mod weaken;

pub use agentjail_manifest::ValidatedManifest;

pub use plan::RootImage;
pub use supervisor::{
    Outcome, RunOptions, STREAM_LIMIT, Sink, discard_prespawned, prespawn, run, run_on,
};

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
