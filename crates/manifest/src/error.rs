//! Why a manifest was refused: [`ManifestError`], one line that names the field.

use std::path::PathBuf;

/// Why a manifest was refused. Every message is one line that names the field.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest: {0}")]
    Syntax(String),
    #[error("manifest field `{field}`: {reason}")]
    Field { field: String, reason: String },
    #[error("manifest: cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub(crate) fn field(field: impl Into<String>, reason: impl Into<String>) -> ManifestError {
    ManifestError::Field {
        field: field.into(),
        reason: reason.into(),
    }
}
