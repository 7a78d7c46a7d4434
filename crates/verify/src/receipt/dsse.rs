//! What every kind of receipt shares (runs', self-tests', live cells'): the DSSE envelope and
//! its pre-authentication encoding, the signing of a statement into one, the subjects and the
//! artifacts matched against them, and a stream log checked against its signed report.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use agentjail_manifest::report::StreamReport;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::{Signature, Signer};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::error::{PAYLOAD_TYPE, ReceiptError};
use super::key::ReceiptKey;
use crate::text::printable;

/// A DSSE envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// Base64 of the canonical statement.
    pub payload: String,
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    pub signatures: Vec<EnvelopeSignature>,
}

/// One DSSE signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvelopeSignature {
    /// Hex sha256 of the raw Ed25519 public key (a hint, not trusted for security).
    #[serde(default)]
    pub keyid: String,
    /// Base64 of the 64-byte Ed25519 signature over [`pae`].
    pub sig: String,
}

impl Envelope {
    /// The envelope as pretty JSON with a final newline, as written to a receipt file.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }
}

/// One subject: a file by name (path relative to /output) and digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subject {
    pub name: String,
    /// `{"sha256": "<hex>"}`.
    pub digest: BTreeMap<String, String>,
}

/// An artifact to check against a receipt's subjects: a name and its digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// The name to match: a subject's full name, or a file name matching one subject's last
    /// path component.
    pub name: String,
    /// Lowercase hex sha256.
    pub sha256: String,
}

impl Artifact {
    /// An artifact from bytes in memory.
    pub fn from_bytes(name: impl Into<String>, bytes: &[u8]) -> Artifact {
        Artifact {
            name: name.into(),
            sha256: agentjail_manifest::hex(&Sha256::digest(bytes)),
        }
    }

    /// An artifact read (streamed) from a file; its name is the file name.
    pub fn from_path(path: &Path) -> Result<Artifact, ReceiptError> {
        let err = |source| ReceiptError::ArtifactRead {
            path: path.to_owned(),
            source,
        };
        let mut f = File::open(path).map_err(err)?;
        let mut hasher = Sha256::new();
        crate::digest::hash_reader(&mut f, &mut hasher).map_err(err)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        Ok(Artifact {
            name,
            sha256: agentjail_manifest::hex(&hasher.finalize()),
        })
    }
}

/// DSSE pre-authentication encoding: `"DSSEv1" SP len(type) SP type SP len(body) SP body`.
pub fn pae(payload_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + payload_type.len() + 32);
    out.extend_from_slice(b"DSSEv1 ");
    out.extend_from_slice(payload_type.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload_type.as_bytes());
    out.push(b' ');
    out.extend_from_slice(body.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(body);
    out
}

/// Which stream of the command a log is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamName {
    Stdout,
    Stderr,
}

impl StreamName {
    pub fn as_str(self) -> &'static str {
        match self {
            StreamName::Stdout => "stdout",
            StreamName::Stderr => "stderr",
        }
    }
}

/// Checks a log (its bytes' sha256, `log`) against a stream's signed report `s`.
pub(super) fn check_stream_report(
    s: Option<&StreamReport>,
    which: StreamName,
    log: &Artifact,
) -> Result<(), ReceiptError> {
    let signed = s
        .and_then(|s| s.sha256.as_deref())
        .ok_or(ReceiptError::NoStreamDigest {
            stream: which.as_str(),
        })?;
    if signed.strip_prefix("sha256:") != Some(log.sha256.as_str()) {
        return Err(ReceiptError::StreamMismatch {
            stream: which.as_str(),
            name: printable(&log.name, 200),
            found: log.sha256.clone(),
            signed: signed.to_string(),
        });
    }
    Ok(())
}

/// Any statement (a run's, a self-test's, a live cell's) as canonical JSON (RFC 8785), in a
/// DSSE envelope signed with Ed25519 over the PAE.
pub(super) fn signed_envelope(
    key: &ReceiptKey,
    statement: &impl Serialize,
) -> Result<Envelope, ReceiptError> {
    let body = serde_jcs::to_vec(statement).map_err(|e| ReceiptError::Encoding(e.to_string()))?;
    let sig: Signature = key.key.sign(&pae(PAYLOAD_TYPE, &body));
    Ok(Envelope {
        payload: STANDARD.encode(&body),
        payload_type: PAYLOAD_TYPE.into(),
        signatures: vec![EnvelopeSignature {
            keyid: key.keyid(),
            sig: STANDARD.encode(sig.to_bytes()),
        }],
    })
}

pub(super) fn check_artifact(subjects: &[Subject], a: &Artifact) -> Result<(), ReceiptError> {
    let exact: Vec<&Subject> = subjects.iter().filter(|s| s.name == a.name).collect();
    let candidates = if exact.is_empty() {
        let base = a.name.rsplit('/').next().unwrap_or(&a.name);
        subjects
            .iter()
            .filter(|s| s.name.rsplit('/').next() == Some(base))
            .collect()
    } else {
        exact
    };
    let name = printable(&a.name, 200);
    match candidates.as_slice() {
        [] => Err(ReceiptError::ArtifactNotSubject {
            name,
            subjects: if subjects.is_empty() {
                "none".into()
            } else {
                subjects
                    .iter()
                    .map(|s| printable(&s.name, 80))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        }),
        [s] => {
            let expected = s.digest.get("sha256").cloned().unwrap_or_default();
            if expected.eq_ignore_ascii_case(&a.sha256) {
                Ok(())
            } else {
                Err(ReceiptError::ArtifactMismatch {
                    name,
                    expected: printable(&expected, 80),
                    actual: a.sha256.clone(),
                })
            }
        }
        _ => Err(ReceiptError::ArtifactAmbiguous { name }),
    }
}
