//! Inputs: an upload stored content-addressed, its record kept.

use std::sync::Arc;

use serde::Serialize;
use utoipa::ToSchema;

use super::auth::*;
use super::failure::*;
use crate::app::AppState;
use crate::execution::runner::{self};
use crate::policy;
pub use crate::policy::Caller;
use crate::storage::audit::Event;
use crate::storage::db::InputRow;
use crate::util::{now, random_hex};

/// A stored input.
#[derive(Debug, Serialize, ToSchema)]
pub struct InputCreated {
    /// Opaque id, valid for the caller's tenant only.
    pub input_id: String,
    /// `sha256:<hex>` of the content.
    pub sha256: String,
    pub bytes: u64,
    pub name: String,
    pub media_type: String,
    /// When the input is deleted (RFC 3339).
    pub expires_at: String,
}

pub(crate) fn ts(secs: i64) -> String {
    jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Stores an upload for the caller's tenant (content-addressed), counts and audits it
/// (`input_upload`). Shared by `POST /v1/inputs` and the MCP tool `upload_input`; checks the
/// name, media type and `max_input_bytes` itself, so every front door gets the same policy.
pub(crate) async fn upload(
    state: &AppState,
    caller: &Caller,
    name: String,
    media_type: String,
    body: Vec<u8>,
) -> Result<InputCreated, Failure> {
    let ev = caller.event("input_upload");
    let max = state.inner.config.server.max_input_bytes;
    if let Err(r) = policy::check_upload(&name, &media_type, body.len() as u64, max) {
        return Err(deny(state, caller, ev, r).await);
    }
    let sha = crate::config::sha256_hex(&body);
    let bytes = body.len() as u64;
    let id = format!("in_{}", random_hex(16).map_err(|_| Failure::Internal)?);
    let t = now();
    let expires = t + state.inner.config.server.input_retention_seconds as i64;
    let row = InputRow {
        id: id.clone(),
        sha256: sha.clone(),
        name: name.clone(),
        media_type: media_type.clone(),
        bytes: body.len() as u64,
        created_at: t,
    };
    let path = runner::object_path(state, &sha);
    let objects = state.inner.data_dir.join("objects");
    let body: Arc<[u8]> = body.into();
    let content = body.clone();
    let write = Box::new(move || store_object(&objects, &path, &content));
    state
        .store()
        .put_input(&caller.tenant, row, expires, body, write)
        .await?;
    metrics::counter!("agentjail_inputs_stored_total").increment(1);
    state
        .store()
        .audit(Event {
            input_id: Some(id.clone()),
            decision: Some("allow"),
            ..ev
        })
        .await;
    Ok(InputCreated {
        input_id: id,
        sha256: format!("sha256:{sha}"),
        bytes,
        name,
        media_type,
        expires_at: ts(expires),
    })
}

/// Writes `body` at `path` (0644) unless an object with this hash exists: temp file, fsync, rename.
pub(super) fn store_object(
    dir: &std::path::Path,
    path: &std::path::Path,
    body: &[u8],
) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    if path.exists() {
        return Ok(());
    }
    let mut tmp = tempfile_in(dir)?;
    tmp.1.write_all(body)?;
    tmp.1.sync_all()?;
    std::fs::set_permissions(&tmp.0, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp.0, path)?;
    Ok(())
}

pub(super) fn tempfile_in(
    dir: &std::path::Path,
) -> std::io::Result<(std::path::PathBuf, std::fs::File)> {
    let name = format!(".tmp-{}", random_hex(8)?);
    let p = dir.join(name);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&p)?;
    Ok((p, f))
}
