//! Signed run receipts: an in-toto Statement v1 about a run, in a DSSE envelope, signed with
//! Ed25519.
//!
//! * The statement's `subject` lists the output files by sha256; its `predicate`
//!   ([`RunPredicate`], type [`PREDICATE_TYPE`]) records what ran and under which protections.
//! * The statement is serialized canonically (RFC 8785, `serde_jcs`), base64-encoded into the
//!   envelope's `payload`, and signed over the DSSE pre-authentication encoding
//!   `"DSSEv1" SP len(type) SP type SP len(body) SP body` ([`pae`]).
//! * Keys are PKCS#8 PEM files, created on first use with mode 0600 in a 0700 folder
//!   ([`ReceiptKey::load_or_create`]); an existing key file readable by others, or not owned by
//!   the current user, is refused. The key id is the hex sha256 of the raw 32-byte public key
//!   (`receipt/key.rs`; the error and the type names are in `receipt/error.rs`; the envelope,
//!   subjects and artifacts every kind shares in `receipt/dsse.rs`; a live cell's receipt in
//!   `receipt/live_cell.rs`).
//!
//! [`verify`] checks the envelope's payload type, the signature (with a given public key, or
//! the local key), the statement and predicate types, and that every artifact given matches a
//! subject of the same name. See `docs/receipts.md` for the format and third-party checks.

use std::collections::BTreeMap;

use agentjail_manifest::Limits;
use agentjail_manifest::report::{
    Denial, Isolation, OutputError, OutputFile, RejectedFile, RunReport, Status, StreamReport,
};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE};
use ed25519_dalek::Signature;
use serde::{Deserialize, Serialize};

use crate::text::printable;

mod dsse;
mod error;
mod key;
mod live_cell;
pub use dsse::{Artifact, Envelope, EnvelopeSignature, StreamName, Subject, pae};
use dsse::{check_artifact, check_stream_report, signed_envelope};
pub use ed25519_dalek::VerifyingKey;
pub use error::{
    LIVE_CELL_PREDICATE_TYPE, PAYLOAD_TYPE, PREDICATE_TYPE, ReceiptError, SELFTEST_PREDICATE_TYPE,
    STATEMENT_TYPE,
};
use key::keyid_of;
pub use key::{ReceiptKey, default_key_path, parse_public_key_pem};
pub use live_cell::{
    LiveCellInterpreter, LiveCellPredicate, LiveCellStatement, VerifiedLiveCell, sign_live_cell,
};

/// Largest envelope accepted (a key file or PEM text: `key.rs`).
const MAX_ENVELOPE_BYTES: usize = 16 * 1024 * 1024;

/// An in-toto Statement v1 with the agentjail run predicate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Statement {
    #[serde(rename = "_type")]
    pub type_: String,
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: RunPredicate,
}

/// The digest of one input, by its mount point in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputDigest {
    pub mount: String,
    /// `sha256:<hex>`.
    pub sha256: String,
}

/// The predicate of an agentjail run attestation (`https://agentjail.dev/attestation/run/v1`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunPredicate {
    /// Version of agentjail that ran and signed.
    pub agentjail_version: String,
    pub request_id: Option<String>,
    /// `sha256:<hex>` of the canonical manifest.
    pub manifest_digest: Option<String>,
    /// Identity of the root filesystem image.
    pub image: Option<String>,
    /// True when `image` is a digest-pinned image from the content-addressed store (its
    /// content checked); false for the host image, which is identified but not pinned
    /// (absent in receipts of versions before it: false).
    #[serde(default)]
    pub image_pinned: bool,
    /// `sha256:` of the pinned image's SBOM (the report's `image_sbom`); absent for the host
    /// image and in receipts of versions before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_sbom: Option<String>,
    pub inputs: Vec<InputDigest>,
    pub limits: Limits,
    pub isolation: Isolation,
    pub status: Status,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub wall_ms: u64,
    pub cpu_ms: u64,
    pub peak_memory_bytes: u64,
    pub denials: Vec<Denial>,
    /// Entries of /output that were refused.
    #[serde(default)]
    pub output_rejected: Vec<RejectedFile>,
    /// Verification errors of the named output.
    #[serde(default)]
    pub output_errors: Vec<OutputError>,
    /// RFC 3339, UTC.
    pub started_at: String,
    /// The command's stdout as passed through: its byte count and the sha256 of what a log of
    /// it holds (absent in receipts of runs whose command never started, and of versions
    /// before 0.1.0's stream attestation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<StreamReport>,
    /// The command's stderr, likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<StreamReport>,
    /// The workspace (`/work`) before and after the run, by checkpoint digest (absent when the
    /// manifest has no `workspace`): a session's cells chain through them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceDigests>,
    /// The run as a cell of a session (the manifest's `session`, which its digest signs): the
    /// session's id, the cell's index and the previous cell's receipt digest, so that a
    /// session's receipts form a chain (absent for a run outside a session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<agentjail_manifest::session::Session>,
}

/// The workspace checkpoints a run started from and left behind (`sha256:<hex>`, or null
/// for an empty start or when none was collected).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceDigests {
    pub before: Option<String>,
    pub after: Option<String>,
}

/// A receipt that verified.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifiedReceipt {
    pub statement: Statement,
    /// Key id of the key that verified it.
    pub keyid: String,
}

/// Builds the statement of a run: `report` for the predicate, `inputs` as `(mount, sha256:<hex>)`
/// pairs, `subjects` the output files that passed (their `sha256:<hex>` digests).
pub fn statement(
    report: &RunReport,
    inputs: &[(String, String)],
    subjects: &[OutputFile],
) -> Result<Statement, ReceiptError> {
    let mut subject = Vec::with_capacity(subjects.len());
    for f in subjects {
        let hex = f
            .sha256
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| ReceiptError::BadSubjectDigest {
                name: printable(&f.path, 200),
            })?;
        subject.push(Subject {
            name: f.path.clone(),
            digest: BTreeMap::from([("sha256".to_string(), hex.to_ascii_lowercase())]),
        });
    }
    Ok(Statement {
        type_: STATEMENT_TYPE.into(),
        subject,
        predicate_type: PREDICATE_TYPE.into(),
        predicate: RunPredicate {
            agentjail_version: env!("CARGO_PKG_VERSION").into(),
            request_id: report.request_id.clone(),
            manifest_digest: report.manifest_digest.clone(),
            image: report.image.clone(),
            image_pinned: report.image_pinned,
            image_sbom: report.image_sbom.clone(),
            inputs: inputs
                .iter()
                .map(|(mount, sha256)| InputDigest {
                    mount: mount.clone(),
                    sha256: sha256.clone(),
                })
                .collect(),
            limits: report.limits,
            isolation: report.isolation.clone(),
            status: report.status,
            exit_code: report.exit_code,
            signal: report.signal,
            wall_ms: report.wall_ms,
            cpu_ms: report.cpu_ms,
            peak_memory_bytes: report.peak_memory_bytes,
            denials: report.denials.clone(),
            output_rejected: report.output.rejected.clone(),
            output_errors: report.output.errors.clone(),
            started_at: report.started_at.clone(),
            stdout: report
                .stdout
                .sha256
                .is_some()
                .then(|| report.stdout.clone()),
            stderr: report
                .stderr
                .sha256
                .is_some()
                .then(|| report.stderr.clone()),
            workspace: report.workspace.as_ref().map(|w| WorkspaceDigests {
                before: w.restored_sha256.clone(),
                after: w.sha256.clone(),
            }),
            session: None,
        },
    })
}

/// Checks a log of one of the command's streams (its bytes' sha256, `log`) against the digest
/// a verified receipt's predicate carries for that stream.
pub fn check_stream(
    statement: &Statement,
    which: StreamName,
    log: &Artifact,
) -> Result<(), ReceiptError> {
    let s = match which {
        StreamName::Stdout => statement.predicate.stdout.as_ref(),
        StreamName::Stderr => statement.predicate.stderr.as_ref(),
    };
    check_stream_report(s, which, log)
}

/// Checks a workspace checkpoint file (its bytes' sha256, `checkpoint`) against the digest of
/// the workspace after the run that a verified receipt's predicate carries.
pub fn check_workspace(statement: &Statement, checkpoint: &Artifact) -> Result<(), ReceiptError> {
    let w = statement.predicate.workspace.as_ref();
    let signed = w
        .and_then(|w| w.after.as_deref())
        .ok_or(ReceiptError::NoWorkspaceDigest)?;
    if signed.strip_prefix("sha256:") != Some(checkpoint.sha256.as_str()) {
        return Err(ReceiptError::WorkspaceMismatch {
            name: printable(&checkpoint.name, 200),
            found: checkpoint.sha256.clone(),
            signed: signed.to_string(),
        });
    }
    Ok(())
}

/// Signs the statement of a run (see [`statement`]) into a DSSE envelope.
pub fn sign(
    key: &ReceiptKey,
    report: &RunReport,
    inputs: &[(String, String)],
    subjects: &[OutputFile],
) -> Result<Envelope, ReceiptError> {
    sign_statement(key, &statement(report, inputs, subjects)?)
}

/// Signs any statement: canonical JSON (RFC 8785), base64, Ed25519 over the PAE.
pub fn sign_statement(key: &ReceiptKey, statement: &Statement) -> Result<Envelope, ReceiptError> {
    signed_envelope(key, statement)
}

/// Base64 as DSSE allows it: standard or URL-safe alphabet, padded or not.
fn decode_b64(s: &str) -> Option<Vec<u8>> {
    let t = s.trim_end_matches('=');
    let padded = {
        let mut p = t.to_string();
        while !p.len().is_multiple_of(4) {
            p.push('=');
        }
        p
    };
    STANDARD
        .decode(&padded)
        .or_else(|_| URL_SAFE.decode(&padded))
        .ok()
}

/// The signer's public key: the PEM given, or the local key at [`default_key_path`].
fn verifying_key(pubkey_pem: Option<&str>) -> Result<VerifyingKey, ReceiptError> {
    match pubkey_pem {
        Some(pem) => parse_public_key_pem(pem),
        None => {
            let path = default_key_path();
            if !path.exists() {
                return Err(ReceiptError::NoKey { path });
            }
            Ok(ReceiptKey::load(&path)?.verifying_key())
        }
    }
}

/// Checks a receipt. `pubkey_pem` is the signer's public key; `None` uses the local key at
/// [`default_key_path`]. Every artifact must match a subject (see [`Artifact::name`]).
pub fn verify(
    envelope_json: &[u8],
    pubkey_pem: Option<&str>,
    artifacts: &[Artifact],
) -> Result<VerifiedReceipt, ReceiptError> {
    let key = verifying_key(pubkey_pem)?;
    verify_with_key(envelope_json, &key, artifacts)
}

/// [`verify`] with a parsed key.
pub fn verify_with_key(
    envelope_json: &[u8],
    key: &VerifyingKey,
    artifacts: &[Artifact],
) -> Result<VerifiedReceipt, ReceiptError> {
    let (body, keyid) = authentic_payload(envelope_json, key)?;
    verified_statement(raw_statement(&body)?, keyid, artifacts)
}

/// Checks an envelope's size, payload type and signature with `key`; returns the authentic
/// payload and the key id.
fn authentic_payload(
    envelope_json: &[u8],
    key: &VerifyingKey,
) -> Result<(Vec<u8>, String), ReceiptError> {
    if envelope_json.len() > MAX_ENVELOPE_BYTES {
        return Err(ReceiptError::BadEnvelope {
            reason: format!("larger than {MAX_ENVELOPE_BYTES} bytes"),
        });
    }
    let env: Envelope =
        serde_json::from_slice(envelope_json).map_err(|e| ReceiptError::BadEnvelope {
            reason: format!(
                "not valid envelope JSON (line {} column {})",
                e.line(),
                e.column()
            ),
        })?;
    if env.payload_type != PAYLOAD_TYPE {
        return Err(ReceiptError::WrongPayloadType {
            found: printable(&env.payload_type, 80),
        });
    }
    let body = decode_b64(&env.payload).ok_or_else(|| ReceiptError::BadEnvelope {
        reason: "payload is not base64".into(),
    })?;
    if env.signatures.is_empty() {
        return Err(ReceiptError::NoSignature);
    }
    let keyid = keyid_of(key);
    let message = pae(&env.payload_type, &body);
    let mut other_keyid: Option<String> = None;
    let mut verified = false;
    for s in &env.signatures {
        if !s.keyid.is_empty() && s.keyid != keyid {
            other_keyid.get_or_insert_with(|| printable(&s.keyid, 80));
            continue;
        }
        let Some(sig) = decode_b64(&s.sig).and_then(|b| Signature::from_slice(&b).ok()) else {
            continue;
        };
        if key.verify_strict(&message, &sig).is_ok() {
            verified = true;
            break;
        }
    }
    if !verified {
        let any_for_us = env
            .signatures
            .iter()
            .any(|s| s.keyid.is_empty() || s.keyid == keyid);
        return Err(match other_keyid {
            Some(found) if !any_for_us => ReceiptError::UnknownKeyId {
                found,
                expected: keyid,
            },
            _ => ReceiptError::SignatureInvalid { keyid },
        });
    }
    Ok((body, keyid))
}

/// The authentic payload as JSON with the in-toto statement type checked.
fn raw_statement(body: &[u8]) -> Result<serde_json::Value, ReceiptError> {
    let raw: serde_json::Value =
        serde_json::from_slice(body).map_err(|_| ReceiptError::BadStatement {
            reason: "payload is not JSON".into(),
        })?;
    let found_type = raw.get("_type").and_then(|v| v.as_str()).unwrap_or("");
    if found_type != STATEMENT_TYPE {
        return Err(ReceiptError::WrongStatementType {
            found: printable(found_type, 80),
        });
    }
    Ok(raw)
}

/// A run statement from an authentic payload, with every artifact matched to a subject.
fn verified_statement(
    raw: serde_json::Value,
    keyid: String,
    artifacts: &[Artifact],
) -> Result<VerifiedReceipt, ReceiptError> {
    let found_pred = raw
        .get("predicateType")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    if found_pred != PREDICATE_TYPE {
        return Err(ReceiptError::WrongPredicateType {
            found: printable(found_pred, 80),
        });
    }
    let statement: Statement =
        serde_json::from_value(raw).map_err(|e| ReceiptError::BadStatement {
            reason: printable(&e.to_string(), 200),
        })?;

    for a in artifacts {
        check_artifact(&statement.subject, a)?;
    }
    Ok(VerifiedReceipt { statement, keyid })
}

/// An in-toto statement whose predicate is an `agentjail selftest` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelftestStatement {
    #[serde(rename = "_type")]
    pub type_: String,
    /// The agentjail binary that was tested (name and sha256).
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    /// The self-test's JSON result (`agentjail.selftest/v1`).
    pub predicate: serde_json::Value,
}

/// A self-test attestation that verified.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifiedSelftest {
    pub statement: SelftestStatement,
    pub keyid: String,
}

/// A verified receipt of either kind.
#[derive(Debug, Clone, PartialEq)]
pub enum VerifiedAny {
    Run(Box<VerifiedReceipt>),
    Selftest(VerifiedSelftest),
    LiveCell(Box<VerifiedLiveCell>),
}

/// Signs a self-test result: subject `binary_name` with sha256 `binary_sha256_hex`, predicate
/// `result`, predicate type [`SELFTEST_PREDICATE_TYPE`]; the same envelope and key as run
/// receipts.
pub fn sign_selftest(
    key: &ReceiptKey,
    binary_name: &str,
    binary_sha256_hex: &str,
    result: serde_json::Value,
) -> Result<Envelope, ReceiptError> {
    let statement = SelftestStatement {
        type_: STATEMENT_TYPE.into(),
        subject: vec![Subject {
            name: binary_name.into(),
            digest: BTreeMap::from([(
                "sha256".to_string(),
                binary_sha256_hex.to_ascii_lowercase(),
            )]),
        }],
        predicate_type: SELFTEST_PREDICATE_TYPE.into(),
        predicate: result,
    };
    signed_envelope(key, &statement)
}

/// [`verify`] for run receipts and self-test attestations alike: the same envelope, signature
/// and statement checks; the predicate type decides which. Artifacts are matched against the
/// subjects of either (for a self-test, the tested binary).
pub fn verify_any(
    envelope_json: &[u8],
    pubkey_pem: Option<&str>,
    artifacts: &[Artifact],
) -> Result<VerifiedAny, ReceiptError> {
    verify_any_with_key(envelope_json, &verifying_key(pubkey_pem)?, artifacts)
}

/// [`verify_any`] with a parsed key.
pub fn verify_any_with_key(
    envelope_json: &[u8],
    key: &VerifyingKey,
    artifacts: &[Artifact],
) -> Result<VerifiedAny, ReceiptError> {
    let (body, keyid) = authentic_payload(envelope_json, key)?;
    let raw = raw_statement(&body)?;
    match raw.get("predicateType").and_then(|v| v.as_str()) {
        Some(SELFTEST_PREDICATE_TYPE) => {}
        Some(LIVE_CELL_PREDICATE_TYPE) => {
            return live_cell::verified(raw, keyid, artifacts)
                .map(|v| VerifiedAny::LiveCell(Box::new(v)));
        }
        _ => {
            return verified_statement(raw, keyid, artifacts)
                .map(|v| VerifiedAny::Run(Box::new(v)));
        }
    }
    let statement: SelftestStatement =
        serde_json::from_value(raw).map_err(|e| ReceiptError::BadStatement {
            reason: printable(&e.to_string(), 200),
        })?;
    if !statement.predicate.is_object() {
        return Err(ReceiptError::BadStatement {
            reason: "the self-test predicate is not an object".into(),
        });
    }
    for a in artifacts {
        check_artifact(&statement.subject, a)?;
    }
    Ok(VerifiedAny::Selftest(VerifiedSelftest { statement, keyid }))
}

#[cfg(test)]
mod tests;
