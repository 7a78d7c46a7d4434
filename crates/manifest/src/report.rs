//! The run report (`agentjail.report/v1`): one JSON object per run that got past argument
//! parsing, including runs that failed to start. Field names are stable; new fields may be added.
//! The report never contains output content, environment values or stderr text: only paths,
//! sizes, digests, error locations and reasons.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Limits;

/// Schema tag of the report.
pub const REPORT_SCHEMA: &str = "agentjail.report/v1";

/// Outcome of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Exited 0 within its limits and its output passed verification.
    Ok,
    /// Exited with a non-zero code.
    ExitNonzero,
    /// Ended by a signal (other than a limit's kill).
    Signaled,
    /// Killed at the wall-clock deadline.
    Timeout,
    /// Killed by the memory limit.
    MemoryLimit,
    /// The command succeeded but its output failed verification.
    OutputRejected,
    /// agentjail could not set up or start the run (a missing program included).
    SetupError,
}

impl Status {
    /// The exit code of `agentjail run` for this status, given the command's own code/signal.
    pub fn exit_code(self, code: Option<i32>, signal: Option<i32>) -> i32 {
        match self {
            Status::Ok => 0,
            Status::ExitNonzero => code.unwrap_or(1),
            Status::Signaled | Status::MemoryLimit => 128 + signal.unwrap_or(9),
            Status::Timeout => 124,
            Status::OutputRejected => 65,
            Status::SetupError => 125,
        }
    }
}

/// What kind of thing was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DenialKind {
    Syscall,
    Filesystem,
    Network,
    Limit,
    Output,
}

/// One refusal, with a reason a person can read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Denial {
    pub kind: DenialKind,
    pub detail: String,
}

/// A file that passed collection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OutputFile {
    /// Path relative to /output.
    pub path: String,
    pub bytes: u64,
    /// `sha256:<hex>`.
    pub sha256: String,
}

/// A file (or other entry) under /output that was not passed on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RejectedFile {
    /// Path relative to /output, with unprintable characters escaped.
    pub path: String,
    pub reason: String,
}

/// One schema or type error of the verified artifact: where, and what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OutputError {
    /// JSON Pointer into the artifact (empty for the whole document).
    pub instance_path: String,
    /// The validator's message; it names the rule, never echoes the artifact's text.
    pub message: String,
}

/// What came out of /output.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OutputReport {
    pub files: Vec<OutputFile>,
    pub rejected: Vec<RejectedFile>,
    /// Verification errors of the named output (type or schema), empty when it passed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<OutputError>,
}

/// A stream of the command (stdout or stderr) as passed through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StreamReport {
    /// Bytes the command wrote.
    pub bytes: u64,
    /// True when more than the pass-through bound was written and the rest was dropped.
    pub truncated: bool,
}

/// One connection the egress gateway let through. Never payload, headers or credentials.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Connection {
    /// `CONNECT`, `GET`, ...
    pub method: String,
    /// Normalised destination host.
    pub host: String,
    pub port: u16,
    /// The vetted address the gateway connected to.
    pub address: Option<String>,
    /// The allowlist rule that matched.
    pub rule: String,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration_ms: u64,
}

/// The egress gateway's part of a run (present only with a network allowlist).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NetworkReport {
    /// The proxy endpoint inside the sandbox, e.g. `http://127.0.0.1:3128`.
    pub proxy: String,
    /// Connections let through (refusals are in `denials` with kind `network`).
    pub connections: Vec<Connection>,
}

/// The protections actually applied to this run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Isolation {
    /// `native` (namespaces, Landlock, seccomp on the host kernel).
    pub kind: String,
    pub user_ns: bool,
    pub pid_ns: bool,
    pub net_ns: bool,
    pub mount_ns: bool,
    pub ipc_ns: bool,
    pub uts_ns: bool,
    pub cgroup_ns: bool,
    /// Landlock ABI whose rights were enforced (at most 6, the last ABI that adds a right
    /// agentjail uses; lower on older kernels), or null when Landlock was not applied.
    pub landlock_abi: Option<u32>,
    /// Landlock rights applied: `fs` (ABI 1), `refer` (2), `truncate` (3), `tcp` (4),
    /// `ioctl_dev` (5), `scope` (6: signals and abstract unix sockets).
    #[serde(default)]
    pub landlock_rights: Vec<String>,
    /// Each Landlock right this kernel lacks, with the layer that enforces its guarantee
    /// instead (docs/isolation.md, "Guarantees and the layers that enforce them").
    #[serde(default)]
    pub landlock_substitutes: Vec<String>,
    pub seccomp: bool,
    /// Denied syscalls are reported through seccomp user notification.
    pub seccomp_notify: bool,
    pub no_new_privs: bool,
    pub capabilities_dropped: bool,
    /// `v1`, `v2`, or null when no cgroup limits were applied.
    pub cgroup: Option<String>,
    /// rlimits applied as a second layer, e.g. `nproc`, `as`, `fsize`, `core`, `cpu`, `nofile`.
    pub rlimits: Vec<String>,
    /// Host uid the sandbox user maps to.
    pub host_uid: Option<u32>,
    /// Every protection that was not applied, with the reason. Non-empty only with
    /// `--allow-degraded`; otherwise the run is refused instead.
    pub degraded: Vec<String>,
}

/// The run report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "agentjail run report (agentjail.report/v1)")]
pub struct RunReport {
    /// Always `agentjail.report/v1`.
    pub schema: String,
    pub status: Status,
    /// The manifest's `request_id`, if any.
    pub request_id: Option<String>,
    /// sha256 of the canonical manifest, or null when the run failed before one existed.
    pub manifest_digest: Option<String>,
    /// Digest of the root filesystem image actually used: a digest-pinned image from the store,
    /// or the identity of the host image (`sha256:…` of the host image description).
    pub image: Option<String>,
    /// True when the root came from the content-addressed image store and passed its check;
    /// false for the host image, which is identified but not content-pinned.
    #[serde(default)]
    pub image_pinned: bool,
    /// A plain-words note about the root image, e.g. that the host image is not pinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_note: Option<String>,
    /// Why the run failed to start (status `setup_error` only). One line, no secrets.
    pub error: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Wall-clock time from the sandbox's start to the end of its last process.
    pub wall_ms: u64,
    /// CPU time of the whole tree (user + system).
    pub cpu_ms: u64,
    /// Peak memory of the whole tree (cgroup) or of its largest process (rusage fallback).
    pub peak_memory_bytes: u64,
    /// Where cpu and memory figures come from: `cgroup`, `rusage` or `none`.
    pub accounting: String,
    /// The effective limits.
    pub limits: Limits,
    pub denials: Vec<Denial>,
    pub output: OutputReport,
    pub stdout: StreamReport,
    pub stderr: StreamReport,
    /// The egress gateway's allowed connections; null when the network was denied.
    #[serde(default)]
    pub network: Option<NetworkReport>,
    pub isolation: Isolation,
    /// When the run started (RFC 3339, UTC).
    pub started_at: String,
}

impl RunReport {
    /// A report for a run that never started.
    pub fn setup_error(limits: Limits, error: String) -> RunReport {
        RunReport {
            schema: REPORT_SCHEMA.into(),
            status: Status::SetupError,
            request_id: None,
            manifest_digest: None,
            image: None,
            image_pinned: false,
            image_note: None,
            error: Some(error),
            exit_code: None,
            signal: None,
            wall_ms: 0,
            cpu_ms: 0,
            peak_memory_bytes: 0,
            accounting: "none".into(),
            limits,
            denials: Vec::new(),
            output: OutputReport::default(),
            stdout: StreamReport::default(),
            stderr: StreamReport::default(),
            network: None,
            isolation: Isolation::default(),
            started_at: jiff::Timestamp::now().to_string(),
        }
    }

    /// The JSON Schema of the report, generated from these types.
    pub fn json_schema() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(RunReport)).unwrap_or_default()
    }

    /// Adds a denial unless the same one is already listed.
    pub fn deny(&mut self, kind: DenialKind, detail: impl Into<String>) {
        let d = Denial {
            kind,
            detail: detail.into(),
        };
        if !self.denials.contains(&d) {
            self.denials.push(d);
        }
    }
}
