//! The manifest's `session` section: which session and which of its cells a run is, and the
//! receipt of the cell before it. Set by the service for a session's cells (docs/api.md,
//! "Sessions"); the receipt's predicate carries it (`predicate.session`), so that a session's
//! receipts form a chain a verifier can walk: each names the digest of the one before
//! (docs/receipts.md, "Sessions").

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{ManifestError, field};

/// A run as one cell of a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Session {
    /// The session's id: 1-128 of `A-Z a-z 0-9 _ -`.
    pub id: String,
    /// The cell's index in the session, from 0.
    pub cell: u64,
    /// `sha256:<64 lowercase hex>` of the receipt of the latest earlier cell that has one (the
    /// previous cell's, unless it never started): over the RFC 8785 canonical JSON of its DSSE
    /// envelope. Null for a session's first cell; a forked session's first cell names the
    /// receipt the session it was forked from had at that cell.
    #[serde(default)]
    pub previous_receipt_sha256: Option<String>,
}

/// Whether `s` is `sha256:` and 64 lowercase hex digits.
pub fn is_sha256_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Checks the `session` section's forms.
pub(crate) fn check(s: &Session) -> Result<(), ManifestError> {
    let ok_id = (1..=128).contains(&s.id.len())
        && s.id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !ok_id {
        return Err(field("session.id", "must be 1-128 of A-Z a-z 0-9 _ -"));
    }
    if let Some(d) = &s.previous_receipt_sha256
        && !is_sha256_digest(d)
    {
        return Err(field(
            "session.previous_receipt_sha256",
            "must be sha256:<64 lowercase hex>",
        ));
    }
    Ok(())
}
