//! What an import may refuse, and the bounds it is judged by: the crate's error and its
//! [`Limits`], in a module of their own so that the extractor ([`crate::extract`]) and the
//! store (the crate root) share them without referring to each other both ways.

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
