//! Issue #15, item 8: the OpenAPI document is the contract. The test starts `agentjail serve`
//! (the built-in example configuration and its dev token), validates `/openapi.json` with
//! `openapi-spec-validator`, then fuzzes the running service from that document with
//! schemathesis (all checks, a bounded number of examples per operation, a per-request
//! timeout): no 5xx, every response conforms to the document, nothing hangs. Both tools come
//! from PyPI (`.ci/run` installs them); without them the test fails under `CI`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::skip;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

fn have(module: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

struct Kill(std::process::Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn openapi_document_is_valid_and_the_service_conforms_to_it() {
    for m in ["openapi_spec_validator", "schemathesis"] {
        if !have(m) {
            skip(&format!(
                "python module {m} is missing (.ci/run installs it from PyPI)"
            ));
            return;
        }
    }
    let dir = tempfile::Builder::new()
        .prefix("agentjail-openapi-test-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut child = Command::new(common::bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let _guard = Kill(child);
    let (mut token, mut base) = (None, None);
    let mut lines = BufReader::new(stderr).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(t) = line.split("export AGENTJAIL_TOKEN=").nth(1) {
            token = Some(t.trim().to_string());
        }
        if let Some(rest) = line.split("listening on ").nth(1) {
            base = Some(rest.split_whitespace().next().unwrap().to_string());
            break;
        }
    }
    std::thread::spawn(move || for _ in lines.map_while(Result::ok) {});
    let (token, base) = (token.expect("no dev token"), base.expect("never listened"));
    let doc = reqwest::blocking::get(format!("{base}/openapi.json"))
        .unwrap()
        .text()
        .unwrap();
    let path = dir.path().join("openapi.json");
    std::fs::write(&path, doc).unwrap();
    let out = Command::new("python3")
        .args(["-m", "openapi_spec_validator"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openapi-spec-validator: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Bounded: 25 examples per operation and phase, 30 s per request, 10 minutes in all.
    let out = Command::new("timeout")
        .arg("600")
        .args(["python3", "-m", "schemathesis.cli", "run"])
        .arg(&path)
        .args([
            "--url",
            &base,
            "-H",
            &format!("Authorization: Bearer {token}"),
        ])
        .args([
            "--checks",
            "all",
            "--max-examples",
            "25",
            "--request-timeout",
            "30",
        ])
        .args(["--generation-deterministic", "--no-color"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "schemathesis found failures:\n{text}");
}
