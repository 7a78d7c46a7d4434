//! The manifest's `workspace` section: the sandbox's `/work` as an explicit state that a run
//! may start from (a checkpoint, restored before the command starts) and leave behind (a new
//! checkpoint, collected after the command ends, without trusting it). The archive format, its
//! checks and the collection are the engine's and the CLI's (docs/manifest.md, "workspace").

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{ManifestError, field};
use crate::paths::{SourcePolicy, resolve_source};

/// Bytes of file content in a workspace, in MiB: at most this much (the checkpoint is held in
/// memory by the runner, and `/work` is a memory file system charged to the run).
pub const MAX_WORKSPACE_MB: u64 = 1_024;
/// Entries (files and folders together) of a workspace: at most this many, the bound of the
/// untrusting collector that walks `/work` (as it walks `/output`).
pub const MAX_WORKSPACE_FILES: u64 = 10_000;

/// The run's workspace (`/work`) as state: restored from a checkpoint before the command
/// starts, and collected into a new checkpoint after it ends. A checkpoint is a deterministic
/// tar archive of plain files and folders (no owners, mtime 0, modes 0644 or 0755), so equal
/// trees have equal sha256 digests. Not yet on the gVisor tier.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Workspace {
    /// A checkpoint file to restore into `/work` before the command starts: a path relative
    /// to the manifest's folder (or absolute), below an allowed source root, as
    /// `inputs[].source`. Needs `restore_sha256`. The file is read once; if its digest differs,
    /// or it holds anything but plain files and folders within `max_mb` and `max_files`
    /// (links, devices, `..`, absolute or duplicate names), the run is refused before it
    /// starts: never half-restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<String>,
    /// The sha256 the checkpoint at `restore` must have, `sha256:<64 lowercase hex>` (the
    /// `sha256` of the run report's `workspace` that made it). Required with `restore`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_sha256: Option<String>,
    /// Collect `/work` after the command ends (whatever its status, a timeout included) into a
    /// checkpoint: its digest goes into the report and the receipt, and `agentjail run
    /// --workspace-out FILE` writes it. Symlinks, hard links, FIFOs, sockets and devices are
    /// refused with a reason and left out; a workspace over `max_mb` or `max_files` is not
    /// checkpointed at all (the run ends `output_rejected`).
    #[serde(default)]
    pub collect: bool,
    /// Bytes of file content in the workspace, in MiB, restored or collected (default 64, at
    /// most 1024).
    #[serde(default = "Workspace::default_max_mb")]
    pub max_mb: u64,
    /// Entries of the workspace, files and folders together, restored or collected (default
    /// 10000, at most 10000).
    #[serde(default = "Workspace::default_max_files")]
    pub max_files: u64,
}

impl Workspace {
    fn default_max_mb() -> u64 {
        64
    }
    fn default_max_files() -> u64 {
        MAX_WORKSPACE_FILES
    }
    /// `max_mb` in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_mb.saturating_mul(1024 * 1024)
    }
}

/// A checked `workspace` section, with its checkpoint resolved on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedWorkspace {
    /// The checkpoint to restore (canonical host path) and the digest it must have.
    pub restore: Option<(PathBuf, String)>,
    pub collect: bool,
    pub max_bytes: u64,
    pub max_files: u64,
}

/// Checks the `workspace` section: the bounds, the digest's form, `restore` and
/// `restore_sha256` together, the checkpoint's path under `policy`, and the tier.
pub(crate) fn check(
    w: &Workspace,
    policy: &SourcePolicy,
    gvisor: bool,
) -> Result<ResolvedWorkspace, ManifestError> {
    if gvisor {
        return Err(field(
            "workspace",
            "not yet available on the gvisor tier (isolation: native only)",
        ));
    }
    if !(1..=MAX_WORKSPACE_MB).contains(&w.max_mb) {
        return Err(field(
            "workspace.max_mb",
            format!("{} is outside 1..={MAX_WORKSPACE_MB}", w.max_mb),
        ));
    }
    if !(1..=MAX_WORKSPACE_FILES).contains(&w.max_files) {
        return Err(field(
            "workspace.max_files",
            format!("{} is outside 1..={MAX_WORKSPACE_FILES}", w.max_files),
        ));
    }
    let restore = match (&w.restore, &w.restore_sha256) {
        (None, None) => None,
        (Some(_), None) => {
            return Err(field(
                "workspace.restore",
                "needs `restore_sha256`: a checkpoint is restored only with the digest it must have",
            ));
        }
        (None, Some(_)) => {
            return Err(field(
                "workspace.restore_sha256",
                "given without `restore` (the checkpoint file)",
            ));
        }
        (Some(path), Some(sha)) => {
            let hex = sha.strip_prefix("sha256:").unwrap_or("");
            if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                return Err(field(
                    "workspace.restore_sha256",
                    "must have the form sha256:<64 lowercase hex digits>",
                ));
            }
            let p = resolve_source(path, policy)
                .map_err(|r| field("workspace.restore", r.to_string()))?;
            Some((p, sha.clone()))
        }
    };
    Ok(ResolvedWorkspace {
        restore,
        collect: w.collect,
        max_bytes: w.max_bytes(),
        max_files: w.max_files,
    })
}
