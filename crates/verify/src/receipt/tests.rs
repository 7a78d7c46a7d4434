//! The unit tests of [`super`] (signed run receipts): signing, verifying, key files.

use super::key::key_path_from;
use super::*;
use agentjail_manifest::report::{DenialKind, REPORT_SCHEMA};
use sha2::{Digest, Sha256};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

fn report() -> RunReport {
    let mut r = RunReport::setup_error(Limits::default(), String::new());
    r.schema = REPORT_SCHEMA.into();
    r.status = Status::Ok;
    r.error = None;
    r.request_id = Some("example-095".into());
    r.manifest_digest = Some(format!("sha256:{}", "ab".repeat(32)));
    r.image = Some(format!("sha256:{}", "cd".repeat(32)));
    r.exit_code = Some(0);
    r.wall_ms = 120;
    r.cpu_ms = 80;
    r.peak_memory_bytes = 12 << 20;
    r.started_at = "2026-11-29T08:00:00Z".into();
    r.isolation.kind = "native".into();
    r.isolation.user_ns = true;
    r.isolation.seccomp = true;
    r.deny(DenialKind::Network, "connect to 93.184.216.34:80 refused");
    r
}

const ARTIFACT: &[u8] = b"{\"rows\": 3}\n";

fn signed(key: &ReceiptKey) -> Envelope {
    let files = vec![OutputFile {
        path: "summary.json".into(),
        bytes: ARTIFACT.len() as u64,
        sha256: agentjail_manifest::sha256_digest(ARTIFACT),
    }];
    let inputs = vec![(
        "/input/report.csv".to_string(),
        agentjail_manifest::sha256_digest(b"a,b\n1,2\n"),
    )];
    sign(key, &report(), &inputs, &files).unwrap()
}

fn tamper_payload(env: &Envelope) -> Envelope {
    let mut body = STANDARD.decode(&env.payload).unwrap();
    // Change one digit of wall_ms, keeping valid JSON.
    let needle = b"\"wall_ms\":120";
    let pos = body
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap();
    body[pos + needle.len() - 3] = b'9';
    serde_json::from_slice::<serde_json::Value>(&body).unwrap();
    Envelope {
        payload: STANDARD.encode(&body),
        ..env.clone()
    }
}

#[test]
fn round_trip() {
    let key = ReceiptKey::generate().unwrap();
    let env = signed(&key);
    let json = env.to_json();
    let v = verify(
        json.as_bytes(),
        Some(&key.public_key_pem()),
        &[Artifact::from_bytes("summary.json", ARTIFACT)],
    )
    .unwrap();
    assert_eq!(v.keyid, key.keyid());
    assert_eq!(v.statement.subject[0].name, "summary.json");
    let p = &v.statement.predicate;
    assert_eq!(p.request_id.as_deref(), Some("example-095"));
    assert_eq!(p.status, Status::Ok);
    assert_eq!(p.inputs[0].mount, "/input/report.csv");
    assert_eq!(p.denials.len(), 1);
    assert_eq!(p.limits, Limits::default());

    // The payload is the canonical (JCS) form of the statement.
    let body = STANDARD.decode(&env.payload).unwrap();
    assert_eq!(body, serde_jcs::to_vec(&v.statement).unwrap());
    let raw: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(raw["_type"], STATEMENT_TYPE);
    assert_eq!(
        raw["subject"][0]["digest"]["sha256"],
        agentjail_manifest::hex(&Sha256::digest(ARTIFACT))
    );
    // No artifacts: signature and types only.
    verify(json.as_bytes(), Some(&key.public_key_pem()), &[]).unwrap();
    // Artifact named by path: matched by file name.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("summary.json");
    std::fs::write(&p, ARTIFACT).unwrap();
    verify(
        json.as_bytes(),
        Some(&key.public_key_pem()),
        &[Artifact::from_path(&p).unwrap()],
    )
    .unwrap();
}

#[test]
fn flipped_payload_byte_fails() {
    let key = ReceiptKey::generate().unwrap();
    let env = tamper_payload(&signed(&key));
    let err = verify(env.to_json().as_bytes(), Some(&key.public_key_pem()), &[]).unwrap_err();
    assert!(
        matches!(err, ReceiptError::SignatureInvalid { .. }),
        "{err}"
    );
}

#[test]
fn flipped_signature_byte_fails() {
    let key = ReceiptKey::generate().unwrap();
    let mut env = signed(&key);
    let mut sig = STANDARD.decode(&env.signatures[0].sig).unwrap();
    sig[10] ^= 0x01;
    env.signatures[0].sig = STANDARD.encode(&sig);
    let err = verify(env.to_json().as_bytes(), Some(&key.public_key_pem()), &[]).unwrap_err();
    assert!(
        matches!(err, ReceiptError::SignatureInvalid { .. }),
        "{err}"
    );
}

#[test]
fn flipped_artifact_byte_fails_naming_the_artifact() {
    let key = ReceiptKey::generate().unwrap();
    let env = signed(&key);
    let mut bad = ARTIFACT.to_vec();
    bad[3] ^= 0x20;
    let err = verify(
        env.to_json().as_bytes(),
        Some(&key.public_key_pem()),
        &[Artifact::from_bytes("summary.json", &bad)],
    )
    .unwrap_err();
    assert!(
        matches!(err, ReceiptError::ArtifactMismatch { .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("artifact summary.json does not match")
    );

    let err = verify(
        env.to_json().as_bytes(),
        Some(&key.public_key_pem()),
        &[Artifact::from_bytes("other.json", ARTIFACT)],
    )
    .unwrap_err();
    assert!(
        matches!(err, ReceiptError::ArtifactNotSubject { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("subjects: summary.json"), "{err}");
}

#[test]
fn another_key_fails() {
    let key = ReceiptKey::generate().unwrap();
    let other = ReceiptKey::generate().unwrap();
    let env = signed(&key);
    let err = verify(env.to_json().as_bytes(), Some(&other.public_key_pem()), &[]).unwrap_err();
    assert!(matches!(err, ReceiptError::UnknownKeyId { .. }), "{err}");
    // Without the key id hint, the signature itself fails.
    let mut env = env;
    env.signatures[0].keyid.clear();
    let err = verify(env.to_json().as_bytes(), Some(&other.public_key_pem()), &[]).unwrap_err();
    assert!(
        matches!(err, ReceiptError::SignatureInvalid { .. }),
        "{err}"
    );
    // A forged key id claiming the other key does not help either.
    env.signatures[0].keyid = other.keyid();
    let err = verify(env.to_json().as_bytes(), Some(&other.public_key_pem()), &[]).unwrap_err();
    assert!(
        matches!(err, ReceiptError::SignatureInvalid { .. }),
        "{err}"
    );
}

#[test]
fn envelope_and_statement_checks() {
    let key = ReceiptKey::generate().unwrap();
    let pem = key.public_key_pem();
    let env = signed(&key);
    let err = verify(b"not json", Some(&pem), &[]).unwrap_err();
    assert!(matches!(err, ReceiptError::BadEnvelope { .. }), "{err}");

    let mut e = env.clone();
    e.payload_type = "text/plain".into();
    let err = verify(e.to_json().as_bytes(), Some(&pem), &[]).unwrap_err();
    assert!(
        matches!(err, ReceiptError::WrongPayloadType { .. }),
        "{err}"
    );

    let mut e = env.clone();
    e.signatures.clear();
    let err = verify(e.to_json().as_bytes(), Some(&pem), &[]).unwrap_err();
    assert!(matches!(err, ReceiptError::NoSignature), "{err}");

    let err = verify(env.to_json().as_bytes(), Some("garbage"), &[]).unwrap_err();
    assert!(matches!(err, ReceiptError::PublicKeyFormat), "{err}");

    // A correctly signed statement of another type is refused.
    let mut st = statement(&report(), &[], &[]).unwrap();
    st.predicate_type = "https://slsa.dev/provenance/v1".into();
    let e = sign_statement(&key, &st).unwrap();
    let err = verify(e.to_json().as_bytes(), Some(&pem), &[]).unwrap_err();
    assert!(
        matches!(err, ReceiptError::WrongPredicateType { .. }),
        "{err}"
    );
    let mut st = statement(&report(), &[], &[]).unwrap();
    st.type_ = "https://in-toto.io/Statement/v0.1".into();
    let e = sign_statement(&key, &st).unwrap();
    let err = verify(e.to_json().as_bytes(), Some(&pem), &[]).unwrap_err();
    assert!(
        matches!(err, ReceiptError::WrongStatementType { .. }),
        "{err}"
    );

    // URL-safe unpadded base64 is accepted, as DSSE allows.
    let mut e = env.clone();
    let body = STANDARD.decode(&e.payload).unwrap();
    e.payload = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&body);
    verify(e.to_json().as_bytes(), Some(&pem), &[]).unwrap();

    let bad = OutputFile {
        path: "x".into(),
        bytes: 1,
        sha256: "md5:00".into(),
    };
    assert!(matches!(
        sign(&key, &report(), &[], &[bad]),
        Err(ReceiptError::BadSubjectDigest { .. })
    ));
}

#[test]
fn default_key_location() {
    let p = |x: Option<&str>, h: Option<&str>| key_path_from(x.map(Into::into), h.map(Into::into));
    assert_eq!(
        p(Some("/x/data"), Some("/home/u")),
        PathBuf::from("/x/data/agentjail/receipt-key.pem")
    );
    assert_eq!(
        p(None, Some("/home/u")),
        PathBuf::from("/home/u/.local/share/agentjail/receipt-key.pem")
    );
    assert_eq!(
        p(Some("relative"), Some("/home/u")),
        PathBuf::from("/home/u/.local/share/agentjail/receipt-key.pem")
    );
    assert!(default_key_path().ends_with("agentjail/receipt-key.pem"));
}

#[test]
fn pae_matches_the_dsse_spec_example() {
    // From the DSSE protocol spec's test vector.
    assert_eq!(
        pae("http://example.com/HelloWorld", b"hello world"),
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
    );
}

#[test]
fn key_file_is_created_private_and_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data/agentjail/receipt-key.pem");
    let key = ReceiptKey::load_or_create(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let pmode = std::fs::metadata(path.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(pmode & 0o777, 0o700);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("-----BEGIN PRIVATE KEY-----"));
    let again = ReceiptKey::load_or_create(&path).unwrap();
    assert_eq!(again.keyid(), key.keyid());
    assert!(
        key.public_key_pem()
            .starts_with("-----BEGIN PUBLIC KEY-----")
    );
    assert_eq!(key.keyid().len(), 64);
}

#[test]
fn readable_or_foreign_key_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.pem");
    ReceiptKey::load_or_create(&path).unwrap();
    for mode in [0o644, 0o640, 0o604, 0o620] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let err = ReceiptKey::load_or_create(&path).unwrap_err();
        assert!(matches!(err, ReceiptError::KeyPermissions { .. }), "{err}");
        assert!(err.to_string().contains("chmod 600"), "{err}");
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    // A symlink in place of the key is refused.
    let link = dir.path().join("link.pem");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    let err = ReceiptKey::load_or_create(&link).unwrap_err();
    assert!(
        matches!(err, ReceiptError::KeyNotRegularFile { .. }),
        "{err}"
    );
    // Not a key.
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "hello").unwrap();
    std::fs::set_permissions(&junk, std::fs::Permissions::from_mode(0o600)).unwrap();
    let err = ReceiptKey::load(&junk).unwrap_err();
    assert!(matches!(err, ReceiptError::KeyFormat { .. }), "{err}");
}

#[test]
fn key_files_owned_by_someone_else_are_refused() {
    // Giving the file away needs root: without it this is a visible skip (a failure
    // under CI), never a pass that checked nothing.
    if !rustix::process::geteuid().is_root() {
        crate::test_skip::skip("giving a key file to another owner needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.pem");
    ReceiptKey::load_or_create(&path).unwrap();
    rustix::fs::chown(
        &path,
        Some(rustix::fs::Uid::from_raw(65534)),
        Some(rustix::fs::Gid::from_raw(65534)),
    )
    .unwrap();
    let err = ReceiptKey::load(&path).unwrap_err();
    assert!(matches!(err, ReceiptError::KeyOwner { .. }), "{err}");
}

#[test]
fn selftest_attestations_verify_as_such_and_never_as_run_receipts() {
    let key = ReceiptKey::generate().unwrap();
    let pem = key.public_key_pem();
    let result = serde_json::json!({"schema": "agentjail.selftest/v1", "passed": true});
    let env = sign_selftest(&key, "agentjail", &"ab".repeat(32), result.clone()).unwrap();
    let json = env.to_json();
    match verify_any(json.as_bytes(), Some(&pem), &[]).unwrap() {
        VerifiedAny::Selftest(v) => {
            assert_eq!(v.statement.predicate, result);
            assert_eq!(v.statement.predicate_type, SELFTEST_PREDICATE_TYPE);
            assert_eq!(v.keyid, key.keyid());
        }
        _ => panic!("verified as another kind"),
    }
    // The run-receipt check refuses it: a self-test is never taken for a run.
    let err = verify(json.as_bytes(), Some(&pem), &[]).unwrap_err();
    assert!(
        matches!(err, ReceiptError::WrongPredicateType { .. }),
        "{err}"
    );
    // The subject is the tested binary.
    let other = Artifact {
        name: "agentjail".into(),
        sha256: "cd".repeat(32),
    };
    let err = verify_any(json.as_bytes(), Some(&pem), &[other]).unwrap_err();
    assert!(
        matches!(err, ReceiptError::ArtifactMismatch { .. }),
        "{err}"
    );
    let same = Artifact {
        name: "agentjail".into(),
        sha256: "ab".repeat(32),
    };
    assert!(verify_any(json.as_bytes(), Some(&pem), &[same]).is_ok());
    // A run receipt still verifies through verify_any as a run.
    let run = sign(&key, &report(), &[], &[]).unwrap().to_json();
    assert!(matches!(
        verify_any(run.as_bytes(), Some(&pem), &[]).unwrap(),
        VerifiedAny::Run(_)
    ));
    // A tampered predicate fails the signature.
    let mut e: Envelope = serde_json::from_str(&json).unwrap();
    let mut body: serde_json::Value =
        serde_json::from_slice(&STANDARD.decode(&e.payload).unwrap()).unwrap();
    body["predicate"]["passed"] = false.into();
    e.payload = STANDARD.encode(serde_json::to_vec(&body).unwrap());
    let err = verify_any(e.to_json().as_bytes(), Some(&pem), &[]).unwrap_err();
    assert!(
        matches!(err, ReceiptError::SignatureInvalid { .. }),
        "{err}"
    );
}

#[test]
fn live_cell_receipts_verify_as_such_name_their_code_and_streams_and_are_never_runs() {
    let key = ReceiptKey::generate().unwrap();
    let pem = key.public_key_pem();
    let stream = |b: &[u8]| StreamReport {
        bytes: b.len() as u64,
        truncated: false,
        sha256: Some(format!(
            "sha256:{}",
            agentjail_manifest::hex(&Sha256::digest(b))
        )),
    };
    let code = b"print(6 * 7)\n";
    let predicate = LiveCellPredicate {
        agentjail_version: "0".into(),
        request_id: "ses_1-1".into(),
        session: agentjail_manifest::session::Session {
            id: "ses_1".into(),
            cell: 1,
            previous_receipt_sha256: Some(format!("sha256:{}", "ab".repeat(32))),
        },
        interpreter: LiveCellInterpreter {
            request_id: Some("ses_1-live-0".into()),
            state: "kept".into(),
        },
        status: "ok".into(),
        started_at: "2026-12-04T00:00:00Z".into(),
        wall_ms: 3,
        stdout: stream(b"42\n"),
        stderr: stream(b""),
        session_head: None,
    };
    let code_hex = agentjail_manifest::hex(&Sha256::digest(code));
    let json = sign_live_cell(&key, &code_hex, predicate.clone())
        .unwrap()
        .to_json();
    let v = match verify_any(
        json.as_bytes(),
        Some(&pem),
        &[Artifact::from_bytes("code.py", code)],
    )
    .unwrap()
    {
        VerifiedAny::LiveCell(v) => v,
        _ => panic!("verified as another kind"),
    };
    assert_eq!(v.statement.predicate, predicate);
    assert_eq!(v.statement.predicate_type, LIVE_CELL_PREDICATE_TYPE);
    v.check_stream(StreamName::Stdout, &Artifact::from_bytes("o", b"42\n"))
        .unwrap();
    let err = v
        .check_stream(StreamName::Stdout, &Artifact::from_bytes("o", b"43\n"))
        .unwrap_err();
    assert!(matches!(err, ReceiptError::StreamMismatch { .. }), "{err}");
    // Other code is not its subject's.
    let err = verify_any(
        json.as_bytes(),
        Some(&pem),
        &[Artifact::from_bytes("code.py", b"print(1)")],
    )
    .unwrap_err();
    assert!(
        matches!(err, ReceiptError::ArtifactMismatch { .. }),
        "{err}"
    );
    // Never a run receipt.
    let err = verify(json.as_bytes(), Some(&pem), &[]).unwrap_err();
    assert!(
        matches!(err, ReceiptError::WrongPredicateType { .. }),
        "{err}"
    );
    // A tampered status fails the signature.
    let mut e: Envelope = serde_json::from_str(&json).unwrap();
    let mut body: serde_json::Value =
        serde_json::from_slice(&STANDARD.decode(&e.payload).unwrap()).unwrap();
    body["predicate"]["status"] = "timeout".into();
    e.payload = STANDARD.encode(serde_json::to_vec(&body).unwrap());
    let err = verify_any(e.to_json().as_bytes(), Some(&pem), &[]).unwrap_err();
    assert!(
        matches!(err, ReceiptError::SignatureInvalid { .. }),
        "{err}"
    );
}
