//! A session's workspace checkpoints on this node: stored content-addressed under
//! `DATA/checkpoints/<hex>` (written to a temporary file, fsync'd, renamed, the folder
//! fsync'd), named by the sha256 of their bytes, checked again before a cell restores one.
//!
//! A session's cell is a run whose manifest gets a `workspace` section (restore the session's
//! head checkpoint, collect the new one, within the task's `session` bounds) and a `session`
//! section (the receipt chain); the runner sends the collected checkpoint back over its
//! lifeline ([`agentjail_manifest::results::WORKSPACE`]), and [`accept`] keeps it only when it
//! is the checkpoint the report names.

use std::io::Write;
use std::path::{Path, PathBuf};

use agentjail_manifest::Manifest;
use agentjail_manifest::report::RunReport;
use agentjail_manifest::session::{Session, is_sha256_digest};
use agentjail_manifest::workspace::Workspace;

use crate::storage::session_store::Sessions;
use crate::storage::store::StoreError;

pub use crate::storage::sessions::CellJob;

impl CellJob {
    /// The most the runner's checkpoint frame may take.
    pub fn frame_limit(&self) -> u64 {
        agentjail_manifest::results::workspace_frame_limit(
            self.max_mb.saturating_mul(1024 * 1024),
            self.max_files,
        )
    }
}

/// The folder of the checkpoints.
pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("checkpoints")
}

/// The stored file of checkpoint `sha256` (`sha256:<hex>`), None for a malformed digest.
pub fn path(data_dir: &Path, sha256: &str) -> Option<PathBuf> {
    is_sha256_digest(sha256).then(|| dir(data_dir).join(&sha256["sha256:".len()..]))
}

/// The cell's manifest: `m` with its workspace restored from the session's head and
/// collected, and the cell's place in the session.
pub fn apply(m: &mut Manifest, data_dir: &Path, cell: &CellJob) {
    let restore = cell.restore.as_deref().and_then(|sha| path(data_dir, sha));
    m.workspace = Some(Workspace {
        restore: restore.map(|p| p.to_string_lossy().into_owned()),
        restore_sha256: cell.restore.clone(),
        collect: true,
        max_mb: cell.max_mb,
        max_files: cell.max_files,
    });
    m.session = Some(Session {
        id: cell.session_id.clone(),
        cell: cell.cell,
        previous_receipt_sha256: cell.previous_receipt_sha256.clone(),
    });
}

/// The digest by which the next cell's receipt names this one: `sha256:` over the RFC 8785
/// canonical JSON of the receipt (the DSSE envelope), so that it can be recomputed from the
/// receipt however it was serialised (`GET /v1/runs/{id}/receipt`, a cell's `receipt`).
pub fn receipt_digest(receipt: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(receipt).ok()?;
    let bytes = serde_jcs::to_vec(&v).ok()?;
    Some(format!("sha256:{}", crate::config::sha256_hex(&bytes)))
}

/// The stored checkpoints (files named by a 64-digit hex digest; temporary files are not):
/// each one's digest and modification time (Unix seconds).
pub fn stored(data_dir: &Path) -> Vec<(String, i64)> {
    let Ok(rd) = std::fs::read_dir(dir(data_dir)) else {
        return Vec::new();
    };
    rd.filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let hex = name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit());
            let mtime = e.metadata().ok()?.modified().ok()?;
            let secs = mtime.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs() as i64;
            hex.then_some((name, secs))
        })
        .collect()
}

/// Checks that the stored checkpoint `sha256` is there and that its bytes still hash to its
/// name. The error is one line for the caller (no path).
pub fn verify_stored(data_dir: &Path, sha256: &str) -> Result<(), String> {
    let p = path(data_dir, sha256)
        .ok_or_else(|| "the session's checkpoint digest is malformed".to_string())?;
    // Hashed as it is read, a buffer at a time: a checkpoint can be a gigabyte, and every cell
    // request checks it (even one refused as busy), so no request holds a copy of it.
    let hashed = std::fs::File::open(&p).and_then(|mut f| {
        use sha2::{Digest, Sha256};
        use std::io::Read;
        let (mut h, mut buf) = (Sha256::new(), vec![0u8; 1 << 16]);
        loop {
            match f.read(&mut buf) {
                Ok(0) => return Ok(agentjail_manifest::hex(&h.finalize())),
                Ok(n) => h.update(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    });
    let hex = hashed.map_err(|e| {
        tracing::error!(path = %p.display(), error = %e, "reading a stored checkpoint failed");
        format!("the session's checkpoint {sha256} is missing from the store; refused, nothing ran")
    })?;
    let got = format!("sha256:{hex}");
    if got != sha256 {
        tracing::error!(path = %p.display(), expected = sha256, got = %got, "a stored checkpoint no longer matches its name");
        return Err(format!(
            "the session's checkpoint {sha256} no longer matches its stored bytes (tampered or corrupted); refused, nothing ran"
        ));
    }
    Ok(())
}

/// Stores `bytes` as checkpoint `sha256` (already checked to be their digest): a temporary
/// file in the folder, fsync'd, renamed to its name, the folder fsync'd. An existing file of
/// that name is replaced (same name, same bytes; a tampered one is repaired).
fn store(data_dir: &Path, sha256: &str, bytes: &[u8]) -> std::io::Result<()> {
    let d = dir(data_dir);
    std::fs::create_dir_all(&d)?;
    let target = path(data_dir, sha256).ok_or_else(|| std::io::Error::other("malformed digest"))?;
    let tmp = d.join(format!(
        ".tmp-{}",
        crate::util::random_hex(8).map_err(|_| std::io::Error::other("no randomness"))?
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &target)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    std::fs::File::open(&d)?.sync_all()
}

/// Stores `bytes`, already checked to hash to `sha256` (a live sandbox's checkpoint on
/// request), on a blocking thread; where it is stored, or None (logged).
pub async fn keep(data_dir: &Path, sha256: &str, bytes: Vec<u8>) -> Option<std::path::PathBuf> {
    let (d, sha) = (data_dir.to_owned(), sha256.to_owned());
    let stored =
        tokio::task::spawn_blocking(move || store(&d, &sha, &bytes).map(|()| path(&d, &sha)))
            .await
            .ok()?;
    match stored {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "storing a checkpoint failed");
            None
        }
    }
}

/// The checkpoint a cell's runner sent back, kept only when its bytes hash to the report's
/// `workspace.sha256` and are stored: its digest, or None (the head then stays where it was).
pub fn accept(
    data_dir: &Path,
    job_id: &str,
    report: &RunReport,
    bytes: Option<&[u8]>,
) -> Option<String> {
    let named = report.workspace.as_ref()?.sha256.clone()?;
    let Some(bytes) = bytes else {
        tracing::error!(
            job_id,
            "the runner reported a checkpoint but did not send it"
        );
        return None;
    };
    let got = format!("sha256:{}", crate::config::sha256_hex(bytes));
    if got != named {
        tracing::error!(job_id, reported = %named, got = %got, "the runner's checkpoint is not the one its report names; refused");
        return None;
    }
    match store(data_dir, &named, bytes) {
        Ok(()) => Some(named),
        Err(e) => {
            tracing::error!(job_id, error = %e, "storing a checkpoint failed");
            None
        }
    }
}

/// How a cell ended, for its session: the checkpoint it sent, kept only when it is the one
/// its report names ([`accept`], on a blocking thread: hashing and fsync), and its receipt's
/// digest ([`receipt_digest`]).
pub async fn cell_end(
    state: &crate::app::AppState,
    job_id: &str,
    cell: &CellJob,
    report: &Option<String>,
    receipt: &Option<String>,
    bytes: Option<Vec<u8>>,
) -> crate::storage::sessions::CellEnd {
    let report = report
        .as_deref()
        .and_then(|r| serde_json::from_str::<RunReport>(r).ok());
    let data = state.inner.data_dir.clone();
    let id = job_id.to_owned();
    let bytes: Option<std::sync::Arc<[u8]>> = bytes.map(Into::into);
    let sent = bytes.clone();
    let checkpoint = match report {
        Some(r) => tokio::task::spawn_blocking(move || accept(&data, &id, &r, sent.as_deref()))
            .await
            .ok()
            .flatten(),
        None => None,
    };
    let checkpoint_path = checkpoint
        .as_deref()
        .and_then(|c| path(&state.inner.data_dir, c));
    // A store shared by the fleet keeps the checkpoint's bytes itself.
    let keep = checkpoint
        .as_ref()
        .and(state.inner.queue.as_ref())
        .and(bytes);
    crate::storage::sessions::CellEnd {
        session_id: cell.session_id.clone(),
        cell: cell.cell,
        checkpoint,
        checkpoint_path,
        receipt_sha256: receipt.as_deref().and_then(receipt_digest),
        bytes: keep,
        interpreter: cell.interpreter,
    }
}

/// Whether the session of `cell` was ended (`DELETE`), read once the cell's execution is
/// registered: a close racing the cell's submission that could not cancel it yet (it was not
/// registered) still stops it before it starts.
pub async fn session_closed(state: &crate::app::AppState, cell: &CellJob) -> bool {
    let Some(sessions) = sessions(state) else {
        return false;
    };
    let s = sessions.get_session(&cell.session_id).await;
    matches!(s, Ok(Some(s)) if s.closed_at.is_some())
}

/// Where this node's sessions are kept: the PostgreSQL store of the fleet, else the SQLite
/// database; None for neither.
pub fn sessions(state: &crate::app::AppState) -> Option<Sessions> {
    if let Some(q) = &state.inner.queue {
        return Some(Sessions::Pg(q.clone()));
    }
    state.store().sqlite().map(|d| Sessions::Sqlite(d.clone()))
}

/// Checks that the checkpoint `sha256` is stored and that its bytes still hash to its name
/// (on PostgreSQL: its row in `checkpoints`; on SQLite: its file): Ok(Err(why)) when not.
pub async fn verify(
    state: &crate::app::AppState,
    sha256: &str,
) -> Result<Result<(), String>, StoreError> {
    let sha = sha256.to_owned();
    match &state.inner.queue {
        Some(q) => {
            let bytes = q.checkpoint_bytes(sha256).await?;
            Ok(
                tokio::task::spawn_blocking(move || check_bytes(&sha, bytes.as_deref()).map(drop))
                    .await
                    .unwrap_or_else(|_| Err("checking the checkpoint failed".into())),
            )
        }
        None => {
            let data = state.inner.data_dir.clone();
            Ok(
                tokio::task::spawn_blocking(move || verify_stored(&data, &sha))
                    .await
                    .unwrap_or_else(|_| Err("checking the checkpoint failed".into())),
            )
        }
    }
}

/// `bytes` (None: not stored) checked against their name `sha256`; the refusal otherwise.
fn check_bytes<'b>(sha256: &str, bytes: Option<&'b [u8]>) -> Result<&'b [u8], String> {
    if !is_sha256_digest(sha256) {
        return Err("the session's checkpoint digest is malformed".into());
    }
    let Some(bytes) = bytes else {
        tracing::error!(
            checkpoint = sha256,
            "a session's checkpoint is not in the store"
        );
        return Err(format!(
            "the session's checkpoint {sha256} is missing from the store; refused, nothing ran"
        ));
    };
    let got = format!("sha256:{}", crate::config::sha256_hex(bytes));
    if got != sha256 {
        tracing::error!(expected = sha256, got = %got, "a stored checkpoint no longer matches its name");
        return Err(format!(
            "the session's checkpoint {sha256} no longer matches its stored bytes (tampered or corrupted); refused, nothing ran"
        ));
    }
    Ok(bytes)
}

/// Before a claimed cell runs on this executor: the checkpoint `sha256` read from the fleet's
/// store, hashed, and written to this node's checkpoint folder for the runner to restore (which
/// checks it again); the refusal when it is missing or no longer matches its name (nothing is
/// written, nothing runs).
pub async fn materialise(
    data_dir: &Path,
    queue: &crate::storage::pg::PgStore,
    sha256: &str,
) -> Result<(), String> {
    let bytes = queue.checkpoint_bytes(sha256).await.map_err(|e| {
        tracing::error!(error = %e, "reading a session's checkpoint from the database failed");
        format!(
            "the session's checkpoint {sha256} cannot be read from the store; refused, nothing ran"
        )
    })?;
    let (data, sha) = (data_dir.to_owned(), sha256.to_owned());
    tokio::task::spawn_blocking(move || {
        let b = check_bytes(&sha, bytes.as_deref())?;
        store(&data, &sha, b).map_err(|e| {
            tracing::error!(error = %e, "writing a session's checkpoint on this node failed");
            "the session's checkpoint cannot be written on its executor; refused, nothing ran"
                .to_string()
        })
    })
    .await
    .unwrap_or_else(|_| Err("restoring the checkpoint failed".into()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_stored_checkpoint_is_checked_against_its_name() {
        let d = tempfile::tempdir().unwrap();
        let bytes = b"not really a tar".to_vec();
        let sha = format!("sha256:{}", crate::config::sha256_hex(&bytes));
        super::store(d.path(), &sha, &bytes).unwrap();
        assert!(super::verify_stored(d.path(), &sha).is_ok());
        std::fs::write(super::path(d.path(), &sha).unwrap(), b"tampered").unwrap();
        let e = super::verify_stored(d.path(), &sha).unwrap_err();
        assert!(e.contains("no longer matches"), "{e}");
        let missing = format!("sha256:{}", "0".repeat(64));
        assert!(
            super::verify_stored(d.path(), &missing)
                .unwrap_err()
                .contains("missing")
        );
        assert!(super::path(d.path(), "sha256:../x").is_none());
    }

    #[test]
    fn only_the_checkpoint_the_report_names_is_kept() {
        use agentjail_manifest::report::{RunReport, WorkspaceReport};
        let d = tempfile::tempdir().unwrap();
        let bytes = b"the archive".to_vec();
        let sha = format!("sha256:{}", crate::config::sha256_hex(&bytes));
        let mut report = RunReport::setup_error(Default::default(), String::new());
        report.workspace = Some(WorkspaceReport {
            sha256: Some(sha.clone()),
            ..Default::default()
        });
        // Other bytes than those the report names: refused, nothing stored.
        assert_eq!(
            super::accept(d.path(), "j", &report, Some(&b"other"[..])),
            None
        );
        assert!(!super::path(d.path(), &sha).unwrap().exists());
        // Named but not sent: refused.
        assert_eq!(super::accept(d.path(), "j", &report, None), None);
        // The named bytes: stored under their digest.
        assert_eq!(
            super::accept(d.path(), "j", &report, Some(&bytes[..])),
            Some(sha.clone())
        );
        assert_eq!(
            std::fs::read(super::path(d.path(), &sha).unwrap()).unwrap(),
            bytes
        );
        // No checkpoint in the report: nothing kept, whatever was sent.
        report.workspace = None;
        assert_eq!(
            super::accept(d.path(), "j", &report, Some(&bytes[..])),
            None
        );
    }
}
