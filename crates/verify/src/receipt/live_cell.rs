//! The receipt of a live session's cell (predicate type [`LIVE_CELL_PREDICATE_TYPE`]).
//!
//! A live cell is executed in the session's resident interpreter, which is a run of its own
//! (with a run attestation naming its manifest: the boundary, limits and network); the cell
//! is not a run of the runner's, so the service that executed it signs its receipt, with the
//! same key and envelope. It says which code was sent to the interpreter (the subject
//! `code.py`), what the interpreter answered (status, the streams' digests: its word, as
//! untrusted as the cells' code, which runs in it and may have changed it), which
//! interpreter run it ran in and what became of it, and the previous cell's receipt digest:
//! a session's cells, live or not, form one chain. It is not a run's receipt: verifiers take
//! it only when asked to (`--live-cell`), since a file a run wrote could share its subject's
//! name. It does not say what `/work` held: a live cell's workspace is
//! checkpointed when its interpreter's run ends, and that run's receipt names it.

use std::collections::BTreeMap;

use agentjail_manifest::report::StreamReport;
use agentjail_manifest::session::Session;
use serde::{Deserialize, Serialize};

use super::dsse::{
    Artifact, Envelope, StreamName, Subject, check_artifact, check_stream_report, signed_envelope,
};
use super::error::{LIVE_CELL_PREDICATE_TYPE, ReceiptError, STATEMENT_TYPE};
use super::key::ReceiptKey;
use crate::text::printable;

/// An in-toto statement about a live cell: its subject is the cell's code (`code.py`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveCellStatement {
    #[serde(rename = "_type")]
    pub type_: String,
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: LiveCellPredicate,
}

/// What the service attests of a live cell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveCellPredicate {
    /// Version of agentjail that executed and signed.
    pub agentjail_version: String,
    /// The cell's run request id (`<session_id>-<cell>`).
    pub request_id: String,
    /// The session's id, the cell's index and the receipt digest of the latest earlier cell
    /// that has one (the chain of the session's cells).
    pub session: Session,
    /// The interpreter the cell ran in.
    pub interpreter: LiveCellInterpreter,
    /// The cell's status as recorded (`ok`, `exit_nonzero` for an exception, `timeout`,
    /// `memory_limit`, `cancelled`, `signaled`, `unknown`, `setup_error`).
    pub status: String,
    /// RFC 3339, UTC: when the cell was handed to the interpreter.
    pub started_at: String,
    pub wall_ms: u64,
    /// The cell's stdout as recorded (its first 1 MiB): byte count and sha256 of what a log of
    /// it holds. The interpreter's word, as untrusted as the cell's code.
    pub stdout: StreamReport,
    /// Its stderr, likewise.
    pub stderr: StreamReport,
    /// The checkpoint (`sha256:<hex>`) the interpreter restored when it started for this
    /// cell; else the session's head when the cell was reserved (a kept interpreter's
    /// `/work` is that plus what earlier cells did to it).
    pub session_head: Option<String>,
}

/// The resident interpreter of a live cell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveCellInterpreter {
    /// The request id of the interpreter's run (`<session_id>-live-<cell>`), whose run
    /// attestation names its manifest; None when none could be started for the cell.
    pub request_id: Option<String>,
    /// What became of it: `started`, `kept`, `restarted` or `lost` (this cell ended it).
    pub state: String,
}

/// A live cell's receipt that verified.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifiedLiveCell {
    pub statement: LiveCellStatement,
    pub keyid: String,
}

impl VerifiedLiveCell {
    /// Checks a log of the cell's stdout or stderr (its bytes' sha256) against the signed
    /// digest.
    pub fn check_stream(&self, which: StreamName, log: &Artifact) -> Result<(), ReceiptError> {
        let p = &self.statement.predicate;
        let s = match which {
            StreamName::Stdout => &p.stdout,
            StreamName::Stderr => &p.stderr,
        };
        check_stream_report(Some(s), which, log)
    }
}

/// Signs a live cell's receipt: subject `code.py` with the sha256 of the cell's code
/// (`code_sha256_hex`), the predicate `predicate`.
pub fn sign_live_cell(
    key: &ReceiptKey,
    code_sha256_hex: &str,
    predicate: LiveCellPredicate,
) -> Result<Envelope, ReceiptError> {
    let statement = LiveCellStatement {
        type_: STATEMENT_TYPE.into(),
        subject: vec![Subject {
            name: "code.py".into(),
            digest: BTreeMap::from([("sha256".to_string(), code_sha256_hex.to_ascii_lowercase())]),
        }],
        predicate_type: LIVE_CELL_PREDICATE_TYPE.into(),
        predicate,
    };
    signed_envelope(key, &statement)
}

/// A live cell's statement from an authentic payload (its predicate type checked by the
/// caller), with every artifact matched to its subject.
pub(super) fn verified(
    raw: serde_json::Value,
    keyid: String,
    artifacts: &[Artifact],
) -> Result<VerifiedLiveCell, ReceiptError> {
    let statement: LiveCellStatement =
        serde_json::from_value(raw).map_err(|e| ReceiptError::BadStatement {
            reason: printable(&e.to_string(), 200),
        })?;
    for a in artifacts {
        check_artifact(&statement.subject, a)?;
    }
    Ok(VerifiedLiveCell { statement, keyid })
}
