//! The type names a receipt carries, and the error that names each way a receipt could not be
//! made or did not verify (its messages quote those names, so they live together).

use std::path::PathBuf;

/// `_type` of an in-toto Statement v1.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// `predicateType` of an agentjail run attestation.
pub const PREDICATE_TYPE: &str = "https://agentjail.dev/attestation/run/v1";
/// `predicateType` of an `agentjail selftest` attestation: the predicate is the self-test's JSON
/// result (`agentjail.selftest/v1`), the subject the agentjail binary that was tested.
pub const SELFTEST_PREDICATE_TYPE: &str = "https://agentjail.dev/attestation/selftest/v1";
/// `predicateType` of a live session's cell (crate::receipt::live_cell): signed by the
/// service that executed the cell in the session's resident interpreter, whose own run has a
/// run attestation.
pub const LIVE_CELL_PREDICATE_TYPE: &str = "https://agentjail.dev/attestation/live-cell/v1";
/// DSSE `payloadType` of an in-toto statement.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";

/// Why a receipt could not be made or did not verify. Each message is one line.
#[derive(Debug, thiserror::Error)]
pub enum ReceiptError {
    #[error("receipt is not a DSSE envelope: {reason}")]
    BadEnvelope { reason: String },
    #[error("receipt payload type is `{found}`, expected `{PAYLOAD_TYPE}`")]
    WrongPayloadType { found: String },
    #[error("receipt has no signature")]
    NoSignature,
    #[error(
        "receipt signature is invalid for key {keyid} (the receipt or its signature was altered, or it was signed by another key)"
    )]
    SignatureInvalid { keyid: String },
    #[error("receipt was signed by key id {found}, not by the given key {expected}")]
    UnknownKeyId { found: String, expected: String },
    #[error("receipt statement type is `{found}`, expected `{STATEMENT_TYPE}`")]
    WrongStatementType { found: String },
    #[error("receipt predicate type is `{found}`, expected `{PREDICATE_TYPE}`")]
    WrongPredicateType { found: String },
    #[error("receipt payload is not an agentjail run statement: {reason}")]
    BadStatement { reason: String },
    #[error(
        "artifact {name} does not match the receipt: sha256 {actual}, the receipt says {expected}"
    )]
    ArtifactMismatch {
        name: String,
        expected: String,
        actual: String,
    },
    #[error("artifact {name} is not a subject of the receipt (subjects: {subjects})")]
    ArtifactNotSubject { name: String, subjects: String },
    #[error(
        "artifact {name} matches several subjects by file name; name it by its full subject path"
    )]
    ArtifactAmbiguous { name: String },
    #[error("cannot read artifact {}: {source}", .path.display())]
    ArtifactRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the receipt carries no digest of the command's {stream} (the command never started, or an older agentjail signed it)"
    )]
    NoStreamDigest { stream: &'static str },
    #[error(
        "{stream} log {name} does not match the receipt: sha256 {found}, the receipt says {signed}"
    )]
    StreamMismatch {
        stream: &'static str,
        name: String,
        found: String,
        signed: String,
    },
    #[error(
        "the receipt carries no digest of a collected workspace (the manifest had no `workspace` with `collect`, or none was collected)"
    )]
    NoWorkspaceDigest,
    #[error(
        "workspace checkpoint {name} does not match the receipt: sha256 {found}, the receipt says {signed}"
    )]
    WorkspaceMismatch {
        name: String,
        found: String,
        signed: String,
    },
    #[error("output file {name} has no sha256:<hex> digest")]
    BadSubjectDigest { name: String },
    #[error("key file {} has mode {mode:04o}; it must not be readable or writable by group or others (chmod 600)", .path.display())]
    KeyPermissions { path: PathBuf, mode: u32 },
    #[error("key file {} is owned by uid {owner}, not by the current user (uid {uid})", .path.display())]
    KeyOwner { path: PathBuf, owner: u32, uid: u32 },
    #[error("key file {} is not a regular file", .path.display())]
    KeyNotRegularFile { path: PathBuf },
    #[error("key file {}: {source}", .path.display())]
    KeyIo {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("key file {} is not a PKCS#8 PEM Ed25519 private key", .path.display())]
    KeyFormat { path: PathBuf },
    #[error("no public key given and no receipt key at {}; pass the signer's public key (agentjail receipt pubkey)", .path.display())]
    NoKey { path: PathBuf },
    #[error("public key is not an Ed25519 public key in PEM (\"BEGIN PUBLIC KEY\") form")]
    PublicKeyFormat,
    #[error("cannot get random bytes for a new key: {0}")]
    Random(String),
    #[error("cannot encode the receipt statement: {0}")]
    Encoding(String),
}
