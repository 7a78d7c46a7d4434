//! The run's workspace (manifest `workspace`, issue #34): the checkpoint to restore, read once
//! and checked (its sha256 against the manifest's, every entry against the bounds) before
//! anything starts; and the checkpoint collected from `/work` after the command ends, into
//! the report, the receipt (through the report) and `--workspace-out`.

use std::os::fd::BorrowedFd;

use agentjail_manifest::ValidatedManifest;
use agentjail_manifest::report::{DenialKind, RunReport, Status, WorkspaceReport};
use agentjail_verify::checkpoint;

/// Most bytes of tar headers and padding per entry: a header, a long name (up to 16 names
/// of 255 bytes) and the padding of its content.
const PER_ENTRY: u64 = 12 * 512;

/// The checkpoint to restore, when the manifest names one: read once, its sha256 compared with
/// `restore_sha256`, its entries checked; `Err` is the one-line reason the run is refused.
pub(super) fn read_restore(vm: &ValidatedManifest) -> Result<Option<Vec<u8>>, String> {
    let Some(w) = &vm.workspace else {
        return Ok(None);
    };
    let Some((path, want)) = &w.restore else {
        return Ok(None);
    };
    let shown = path.display();
    // Never blocking on a FIFO put at the path; only a regular file is read.
    let file = std::os::unix::fs::OpenOptionsExt::custom_flags(
        std::fs::OpenOptions::new().read(true),
        nonblock_flag(),
    )
    .open(path)
    .map_err(|e| format!("manifest field `workspace.restore`: {shown}: {e}"))?;
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return Err(format!(
            "manifest field `workspace.restore`: {shown} is not a regular file"
        ));
    }
    let bound = w
        .max_bytes
        .saturating_add(w.max_files.saturating_add(4).saturating_mul(PER_ENTRY));
    let (bytes, got) = checkpoint::read_bounded(file, bound)
        .map_err(|e| format!("manifest field `workspace.restore`: {shown}: {e}"))?;
    if &got != want {
        return Err(format!(
            "manifest field `workspace.restore`: {shown} has sha256 {got}, not the workspace.restore_sha256 {want}; refusing to run (the checkpoint changed or is not the one named)"
        ));
    }
    let max_files = usize::try_from(w.max_files).unwrap_or(usize::MAX);
    checkpoint::check(&bytes, w.max_bytes, max_files).map_err(|e| {
        format!("manifest field `workspace.restore`: {shown}: workspace checkpoint refused: {e}")
    })?;
    Ok(Some(bytes))
}

/// Collects `/work` (`fd`) into a checkpoint when the manifest asks for it and records it in
/// the report; returns the archive (for `--workspace-out`). A workspace over its bounds has no
/// checkpoint and ends an `ok` run `output_rejected`.
pub(super) fn collect(
    vm: &ValidatedManifest,
    report: &mut RunReport,
    fd: Option<BorrowedFd<'_>>,
) -> Option<Vec<u8>> {
    let w = vm.workspace.as_ref()?;
    if report.status == Status::SetupError {
        return None;
    }
    let mut ws = WorkspaceReport {
        restored_sha256: w.restore.as_ref().map(|(_, sha)| sha.clone()),
        ..WorkspaceReport::default()
    };
    let mut archive = None;
    if let (true, Some(fd)) = (w.collect, fd) {
        let max_files = usize::try_from(w.max_files).unwrap_or(usize::MAX);
        match checkpoint::build(fd, w.max_bytes, max_files) {
            Ok(c) => {
                ws = WorkspaceReport {
                    restored_sha256: ws.restored_sha256,
                    ..c.report
                };
                archive = c.archive;
            }
            Err(e) => ws.rejected.push(agentjail_manifest::report::RejectedFile {
                path: String::new(),
                reason: format!("collection failed: {e}"),
            }),
        }
        for r in &ws.rejected {
            let path = if r.path.is_empty() { "/work" } else { &r.path };
            report.deny(
                DenialKind::Output,
                format!("workspace {path}: {}", r.reason),
            );
        }
        if archive.is_none() && report.status == Status::Ok {
            report.status = Status::OutputRejected;
        }
    }
    report.workspace = Some(ws);
    archive
}

/// `O_NONBLOCK`, as the open flag bits.
fn nonblock_flag() -> i32 {
    rustix::fs::OFlags::NONBLOCK.bits() as i32
}
