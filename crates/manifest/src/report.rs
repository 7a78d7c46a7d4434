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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DenialKind {
    Syscall,
    Filesystem,
    Network,
    Limit,
    Output,
}

/// Most distinct denials listed per kind; refusals past it are counted in
/// `RunReport::denials_dropped`. Every kind has its own room, so a flood of one kind (a payload
/// asking the egress gateway for thousands of hosts, or leaving thousands of symlinks in
/// /output) cannot push out another (the time limit, a refused syscall). 256 is more than the
/// distinct syscall names the filter reports, and keeps a report's denials under ~1 MiB in the
/// worst case (5 kinds × 256 × [`MAX_DETAIL`]), ~20 KB for a typical flood of network refusals.
pub const MAX_DENIALS_PER_KIND: usize = 256;
/// Longest `detail` kept, in bytes (longer ones are cut at a character boundary, with `…`).
pub const MAX_DETAIL: usize = 768;
/// Most entries listed in `output.rejected` (the collector examines up to 10 000 entries; the
/// rest of the refused ones are counted in `output.rejected_dropped`).
pub const MAX_REJECTED_LISTED: usize = 256;
/// Most allowed connections listed in `network.connections` (the rest are counted in
/// `network.dropped`).
pub const MAX_CONNECTIONS_LISTED: usize = 1024;

/// One refusal, with a reason a person can read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Denial {
    pub kind: DenialKind,
    pub detail: String,
    /// How many times this refusal happened (identical refusals are listed once). Omitted
    /// when 1.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    #[schemars(range(min = 1))]
    pub count: u64,
}

fn one() -> u64 {
    1
}

fn is_one(n: &u64) -> bool {
    *n == 1
}

fn is_zero(n: &u64) -> bool {
    *n == 0
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

/// The run's workspace (`/work`, manifest field `workspace`): the checkpoint it started from
/// and the one collected after the command ended (docs/report.md, "workspace").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WorkspaceReport {
    /// sha256 of the checkpoint restored into `/work` before the command started; null when
    /// the run started with an empty `/work`.
    pub restored_sha256: Option<String>,
    /// sha256 of the checkpoint collected after the command ended (`sha256:<hex>`); null when
    /// none was collected (not asked for, or refused whole: see `rejected`).
    pub sha256: Option<String>,
    /// Bytes of file content in the collected checkpoint.
    pub bytes: u64,
    /// Regular files in the collected checkpoint (folders not counted).
    pub files: u64,
    /// Entries of `/work` left out of the checkpoint, with the reason (symlinks, hard links,
    /// FIFOs, sockets, devices, unsafe names, mount points), or that refused the whole
    /// checkpoint (over `max_mb` or `max_files`). Paths are relative to `/work`.
    pub rejected: Vec<RejectedFile>,
    /// Refused entries not listed in `rejected` (at most 256 are); omitted when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rejected_dropped: u64,
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
    /// Refused entries not listed in `rejected` (at most 256 are); omitted when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rejected_dropped: u64,
    /// Verification errors of the named output (type or schema), empty when it passed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<OutputError>,
}

/// A stream of the command (stdout or stderr) as passed through.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StreamReport {
    /// Bytes the command wrote.
    pub bytes: u64,
    /// True when more than the pass-through bound was written and the rest was dropped.
    pub truncated: bool,
    /// `sha256:<hex>` of the bytes passed through (the first `min(bytes, 1 MiB)`, exactly as
    /// the command wrote them, before any terminal filter): what a log of the stream holds,
    /// so that the receipt, which carries it, attests the output an agent was shown. Absent
    /// when the command never started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
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
    /// Connections let through (refusals are in `denials` with kind `network`); at most 1024.
    pub connections: Vec<Connection>,
    /// Connections let through but not listed in `connections`; omitted when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropped: u64,
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
    /// The gVisor platform that ran the sandbox (`kvm`, `systrap` or `ptrace`) and why it was
    /// chosen, e.g. `ptrace (kvm not used: /dev/kvm is kvm_pvm, no VMX/SVM)`; null on the native
    /// tier.
    #[serde(default)]
    pub platform: Option<String>,
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
    /// For a pinned image: `sha256:` of its SBOM (CycloneDX, read from the image's dpkg and
    /// Python package records as the run found them; the bytes `agentjail image show DIGEST
    /// --sbom` prints). Absent for the host image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_sbom: Option<String>,
    /// A plain-words note about the root image, e.g. that the host image is not pinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_note: Option<String>,
    /// Inputs (their sandbox paths) that the sandbox user could not read on the host and that
    /// were given to the sandbox as a read-only copy in its memory instead of a bind mount: as
    /// root, the sandbox runs as an unprivileged uid of its own, to which only the permissions
    /// for others apply, and the file's own permissions stay as they are. Files of at most
    /// 8 MiB (32 MiB in all); a larger one, or a folder holding one, is refused instead
    /// (docs/isolation.md, "Inputs the sandbox user cannot read").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs_copied: Vec<String>,
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
    /// Every kind of refusal, identical ones merged (with a `count`); at most 256 distinct
    /// ones per kind.
    pub denials: Vec<Denial>,
    /// Refusals that happened but are not listed in `denials` (their kind already had 256
    /// distinct entries). 0 when every refusal is listed.
    #[serde(default)]
    pub denials_dropped: u64,
    /// Lookup of `denials` by kind and detail (not part of the report).
    #[serde(skip)]
    #[schemars(skip)]
    denial_index: DenialIndex,
    pub output: OutputReport,
    /// The workspace restored and collected (manifest field `workspace`); omitted when the
    /// manifest has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceReport>,
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
            image_sbom: None,
            image_note: None,
            inputs_copied: Vec::new(),
            error: Some(error),
            exit_code: None,
            signal: None,
            wall_ms: 0,
            cpu_ms: 0,
            peak_memory_bytes: 0,
            accounting: "none".into(),
            limits,
            denials: Vec::new(),
            denials_dropped: 0,
            denial_index: DenialIndex::default(),
            output: OutputReport::default(),
            workspace: None,
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

    /// Records one refusal: counted on the listed entry of the same kind and detail, or
    /// listed, or (its kind already lists [`MAX_DENIALS_PER_KIND`]) counted in
    /// `denials_dropped`. O(1) whatever the number of refusals before it.
    pub fn deny(&mut self, kind: DenialKind, detail: impl Into<String>) {
        self.deny_n(kind, detail, 1);
    }

    /// Records `n` identical refusals (see [`RunReport::deny`]).
    pub fn deny_n(&mut self, kind: DenialKind, detail: impl Into<String>, n: u64) {
        if n == 0 {
            return;
        }
        let detail = bounded_detail(detail.into());
        self.denial_index.sync(&self.denials);
        let key = (kind, detail);
        if let Some(&i) = self.denial_index.map.get(&key) {
            if let Some(d) = self.denials.get_mut(i) {
                d.count = d.count.saturating_add(n);
            }
            return;
        }
        let listed = self.denial_index.per_kind.entry(kind).or_insert(0);
        if *listed >= MAX_DENIALS_PER_KIND {
            self.denials_dropped = self.denials_dropped.saturating_add(n);
            return;
        }
        *listed += 1;
        let (kind, detail) = key;
        self.denial_index
            .map
            .insert((kind, detail.clone()), self.denials.len());
        self.denials.push(Denial {
            kind,
            detail,
            count: n,
        });
    }

    /// Total number of refusals: listed (with their counts) and dropped.
    pub fn denial_total(&self) -> u64 {
        self.denials
            .iter()
            .fold(self.denials_dropped, |t, d| t.saturating_add(d.count))
    }
}

/// Cuts a detail at [`MAX_DETAIL`] bytes (on a character boundary), as [`RunReport::deny`]
/// lists it.
pub fn bounded_detail(mut s: String) -> String {
    if s.len() > MAX_DETAIL {
        let mut end = MAX_DETAIL;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

/// Index of `RunReport::denials`: rebuilt when the list was changed other than through
/// [`RunReport::deny`] (a deserialized report, a list edited by hand).
#[derive(Debug, Clone, Default)]
struct DenialIndex {
    map: std::collections::HashMap<(DenialKind, String), usize>,
    per_kind: std::collections::HashMap<DenialKind, usize>,
}

impl PartialEq for DenialIndex {
    /// A cache of `denials`: reports are equal when their fields are.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl DenialIndex {
    fn sync(&mut self, denials: &[Denial]) {
        if self.map.len() == denials.len()
            && denials.last().is_none_or(|d| {
                self.map.get(&(d.kind, d.detail.clone())) == Some(&(denials.len() - 1))
            })
        {
            return;
        }
        self.map.clear();
        self.per_kind.clear();
        for (i, d) in denials.iter().enumerate() {
            self.map.entry((d.kind, d.detail.clone())).or_insert(i);
            *self.per_kind.entry(d.kind).or_insert(0) += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_denials_are_counted_and_each_kind_is_bounded() {
        let mut r = RunReport::setup_error(Limits::default(), String::new());
        for _ in 0..10 {
            r.deny(DenialKind::Syscall, "ptrace");
        }
        for i in 0..10_000 {
            r.deny(DenialKind::Network, format!("GET h{i}.test:80: forbidden"));
        }
        r.deny(DenialKind::Limit, "time: reached");
        assert_eq!(r.denials[0].count, 10);
        assert_eq!(
            r.denials
                .iter()
                .filter(|d| d.kind == DenialKind::Network)
                .count(),
            MAX_DENIALS_PER_KIND
        );
        assert!(r.denials.iter().any(|d| d.kind == DenialKind::Limit));
        assert_eq!(r.denials_dropped, 10_000 - MAX_DENIALS_PER_KIND as u64);
        assert_eq!(r.denial_total(), 10 + 10_000 + 1);
        // A repeat of a dropped one is dropped again; a repeat of a listed one is counted.
        r.deny(DenialKind::Network, "GET h9999.test:80: forbidden");
        r.deny_n(DenialKind::Network, "GET h0.test:80: forbidden", 5);
        assert_eq!(r.denials_dropped, 10_000 - MAX_DENIALS_PER_KIND as u64 + 1);
        assert_eq!(r.denials[1].count, 6);
        // A deserialized report keeps merging.
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"count\":10"));
        let mut back: RunReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
        back.deny(DenialKind::Syscall, "ptrace");
        assert_eq!(back.denials[0].count, 11);
        assert_eq!(back.denials.len(), r.denials.len());
        // Long details are cut.
        r.deny(DenialKind::Output, "é".repeat(1000));
        assert!(r.denials.last().unwrap().detail.len() <= MAX_DETAIL + '…'.len_utf8());
    }
}
