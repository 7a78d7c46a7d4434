//! Third-party verification of receipts: the Python scripts shipped with the docs verify an
//! envelope written by this crate, and refuse tampered ones. Skipped (with a printed note) when
//! `python3` or its `cryptography` package (or `securesystemslib`, for the second test) is
//! missing. `AGENTJAIL_TEST_PYTHON` names another interpreter (e.g. a virtualenv's).
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

#[path = "../../cli/tests/common/skip.rs"]
mod skip;
use skip::skip;

use std::path::{Path, PathBuf};
use std::process::Command;

use agentjail_manifest::Limits;
use agentjail_manifest::report::{OutputFile, RunReport, Status};
use agentjail_verify::receipt::{ReceiptKey, sign};

fn python() -> String {
    std::env::var("AGENTJAIL_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn has_module(module: &str) -> bool {
    Command::new(python())
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(name)
}

const ARTIFACT: &[u8] = b"{\"rows\": 3, \"columns\": [\"a\", \"b\"]}\n";

/// Writes receipt.json, pubkey.pem and summary.json into `dir`.
fn write_receipt(dir: &Path) -> ReceiptKey {
    let key = ReceiptKey::load_or_create(&dir.join("key/receipt-key.pem")).unwrap();
    let mut report = RunReport::setup_error(Limits::default(), String::new());
    report.status = Status::Ok;
    report.error = None;
    report.exit_code = Some(0);
    report.request_id = Some("example-095".into());
    let files = [OutputFile {
        path: "summary.json".into(),
        bytes: ARTIFACT.len() as u64,
        sha256: agentjail_manifest::sha256_digest(ARTIFACT),
    }];
    let inputs = [(
        "/input/report.csv".to_string(),
        agentjail_manifest::sha256_digest(b"a,b\n"),
    )];
    let env = sign(&key, &report, &inputs, &files).unwrap();
    std::fs::write(dir.join("receipt.json"), env.to_json()).unwrap();
    std::fs::write(dir.join("pubkey.pem"), key.public_key_pem()).unwrap();
    std::fs::write(dir.join("summary.json"), ARTIFACT).unwrap();
    key
}

fn run(script_name: &str, args: &[&Path]) -> (bool, String) {
    let out = Command::new(python())
        .arg(script(script_name))
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn python_cryptography_verifies_receipts() {
    if !has_module("cryptography") {
        skip(&format!(
            "{} cannot import cryptography (.ci/run installs it)",
            python()
        ));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_receipt(d);
    let (receipt, pubkey, artifact) = (
        d.join("receipt.json"),
        d.join("pubkey.pem"),
        d.join("summary.json"),
    );

    let (ok, out) = run("receipt_verify.py", &[&receipt, &pubkey, &artifact]);
    assert!(ok, "{out}");
    assert!(
        out.contains("receipt verified: status=ok exit_code=0 subjects=summary.json"),
        "{out}"
    );

    // A changed byte in the artifact.
    let mut bad = ARTIFACT.to_vec();
    bad[2] ^= 1;
    std::fs::write(&artifact, &bad).unwrap();
    let (ok, out) = run("receipt_verify.py", &[&receipt, &pubkey, &artifact]);
    assert!(!ok && out.contains("does not match"), "{out}");
    std::fs::write(&artifact, ARTIFACT).unwrap();

    // A changed byte in the payload.
    let mut env: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&receipt).unwrap()).unwrap();
    let payload = env["payload"].as_str().unwrap().to_string();
    let i = payload.len() / 2;
    let flipped = if &payload[i..=i] == "A" { "B" } else { "A" };
    env["payload"] = format!("{}{}{}", &payload[..i], flipped, &payload[i + 1..]).into();
    let tampered = d.join("tampered.json");
    std::fs::write(&tampered, env.to_string()).unwrap();
    let (ok, out) = run("receipt_verify.py", &[&tampered, &pubkey]);
    assert!(!ok && out.contains("no signature verifies"), "{out}");

    // Another key.
    let other = tempfile::tempdir().unwrap();
    write_receipt(other.path());
    let (ok, out) = run(
        "receipt_verify.py",
        &[&receipt, &other.path().join("pubkey.pem")],
    );
    assert!(!ok && out.contains("no signature verifies"), "{out}");
}

#[test]
fn securesystemslib_dsse_verifies_receipts() {
    if !has_module("securesystemslib.dsse") {
        skip(&format!(
            "{} cannot import securesystemslib (.ci/run installs 'securesystemslib[crypto]')",
            python()
        ));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_receipt(d);
    let (ok, out) = run(
        "receipt_verify_sslib.py",
        &[&d.join("receipt.json"), &d.join("pubkey.pem")],
    );
    assert!(ok, "{out}");
    let other = tempfile::tempdir().unwrap();
    write_receipt(other.path());
    let (ok, out) = run(
        "receipt_verify_sslib.py",
        &[&d.join("receipt.json"), &other.path().join("pubkey.pem")],
    );
    assert!(!ok, "{out}");
}
