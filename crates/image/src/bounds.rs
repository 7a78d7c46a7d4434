//! What an import may refuse, and the bounds it is judged by: the crate's error and its
//! [`Limits`], the digest form ([`parse_digest`]) and the helpers that turn a failed file
//! operation into that error, in a module of their own so that the extractor
//! ([`crate::extract`]), the OCI layout reader (`oci.rs`) and the store (the crate root) share
//! them without referring to each other both ways.

use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use crate::fsops;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The input is unsafe, malformed or over a bound; nothing was added to the store.
    #[error("import refused: {0}")]
    Refused(String),
    #[error("{0}")]
    Io(String),
    #[error(
        "image {digest} is not in the store {store}; import it first (`agentjail image import PATH`)"
    )]
    NotFound { digest: String, store: String },
    #[error(
        "image {digest} in the store {store} no longer matches its record ({detail}); refusing to use it (`agentjail image verify {digest}` reports what changed)"
    )]
    Changed {
        digest: String,
        store: String,
        detail: String,
    },
    #[error("{0}")]
    BadDigest(String),
}

/// Bounds on what an import may contain. Judged on headers before data is read.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Entries over all archives (layers) of one image.
    pub max_entries: u64,
    /// Bytes of one file.
    pub max_file_bytes: u64,
    /// Bytes of all files.
    pub max_total_bytes: u64,
    /// Bytes of one archive stream after decompression (headers and padding included).
    pub max_archive_bytes: u64,
    /// Bytes of one compressed blob or input file.
    pub max_blob_bytes: u64,
    pub max_path_bytes: usize,
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entries: 500_000,
            max_file_bytes: 4 << 30,
            max_total_bytes: 16 << 30,
            max_archive_bytes: 20 << 30,
            max_blob_bytes: 16 << 30,
            max_path_bytes: 4096,
            max_depth: 128,
        }
    }
}

/// Checks the form `sha256:<64 lowercase hex>` and returns the hex part.
pub fn parse_digest(d: &str) -> Result<&str, ImageError> {
    let hex = d.strip_prefix("sha256:").ok_or_else(|| {
        ImageError::BadDigest(format!(
            "{d:?}: digests have the form sha256:<64 hex digits>"
        ))
    })?;
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(ImageError::BadDigest(format!(
            "{d:?}: digests have the form sha256:<64 lowercase hex digits>"
        )));
    }
    Ok(hex)
}

pub(crate) fn io_err(ctx: &str) -> impl Fn(std::io::Error) -> ImageError + '_ {
    move |e| ImageError::Io(format!("{ctx}: {e}"))
}

pub(crate) fn mkdir(p: &Path) -> Result<(), ImageError> {
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(p)
        .map_err(io_err(&p.display().to_string()))
}

pub(crate) fn open(p: &Path) -> Result<std::os::fd::OwnedFd, ImageError> {
    fsops::open_root(p).map_err(io_err(&p.display().to_string()))
}
