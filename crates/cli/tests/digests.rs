//! Issue 18 item 3: what a receipt signs about a run's inputs is the inputs' true digest, or the
//! run fails. Each test runs the real `agentjail` binary with `--receipt` and reads the signed
//! statement back.
//!
//! - Two different input folders must never get the same digest (the old line format
//!   `D <name>\n` made a folder named `a\nD b` hash like the two folders `a` and `b`, and every
//!   invalid UTF-8 name hash like U+FFFD).
//! - An input that cannot be read when it is hashed fails the run: no receipt is written with
//!   the digest of nothing (the old code signed sha256("") for an input that had vanished).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;

mod common;
use common::{Out, agentjail};

/// Printed by the command once the host has taken its input away.
const SENTINEL: &str = "SENTINEL-INPUT-GONE";
/// Printed by the command when it starts.
const STARTED: &str = "SENTINEL-STARTED";

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn tmp() -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("tempdir");
    chmod(d.path(), 0o755);
    d
}

fn mkdir(p: &Path) {
    std::fs::create_dir_all(p).expect("mkdir");
    chmod(p, 0o755);
}

fn write(p: &Path, content: &[u8]) {
    std::fs::write(p, content).expect("write");
    chmod(p, 0o644);
}

/// Runs `/bin/true` over the input folder `tree` (mounted at /input/tree) with a receipt, and
/// returns the input digest the receipt signs.
fn signed_input_digest(tree: &Path) -> String {
    let d = tmp();
    let manifest = format!(
        "inputs: [{{source: {}, mount: /input/tree}}]\ncommand: [/bin/true]\nlimits: {{seconds: 20}}\n",
        tree.display()
    );
    let root = tree.parent().expect("parent");
    let st = run_signed(
        d.path(),
        "m.yaml",
        manifest.as_bytes(),
        &[OsStr::new("--source-root"), root.as_os_str()],
    );
    let inputs = st["predicate"]["inputs"]
        .as_array()
        .expect("inputs")
        .clone();
    assert_eq!(inputs.len(), 1, "{st:#}");
    assert_eq!(inputs[0]["mount"], "/input/tree", "{st:#}");
    let digest = inputs[0]["sha256"].as_str().expect("sha256").to_owned();
    assert!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "{digest}"
    );
    digest
}

/// Writes `manifest` to `dir/name`, runs it with a receipt signed by a new key in `dir` (and
/// `extra` arguments), requires exit 0, and returns the receipt's statement.
fn run_signed(dir: &Path, name: &str, manifest: &[u8], extra: &[&OsStr]) -> Value {
    let m = dir.join(name);
    write(&m, manifest);
    let receipt = dir.join("receipt.json");
    let key = dir.join("key.pem");
    let mut args = vec![
        OsStr::new("run"),
        OsStr::new("--manifest"),
        m.as_os_str(),
        OsStr::new("--receipt"),
        receipt.as_os_str(),
        OsStr::new("--key"),
        key.as_os_str(),
    ];
    args.extend_from_slice(extra);
    let out = agentjail(&args);
    assert_eq!(out.code, 0, "{}", out.dump());
    statement(&receipt)
}

fn statement(receipt: &Path) -> Value {
    let env: Value = serde_json::from_slice(&std::fs::read(receipt).expect("receipt")).unwrap();
    serde_json::from_slice(&STANDARD.decode(env["payload"].as_str().unwrap()).unwrap()).unwrap()
}

fn tree_root(parent: &Path, name: &str) -> PathBuf {
    let p = parent.join(name);
    mkdir(&p);
    p
}

#[test]
fn a_folder_named_with_a_newline_does_not_hash_like_two_folders() {
    let d = tmp();
    // Tree A: one empty folder named "a\nD b". Tree B: two empty folders, "a" and "b".
    let a = tree_root(d.path(), "A");
    mkdir(&a.join("a\nD b"));
    let b = tree_root(d.path(), "B");
    mkdir(&b.join("a"));
    mkdir(&b.join("b"));
    let (da, db) = (signed_input_digest(&a), signed_input_digest(&b));
    assert_ne!(
        da, db,
        "two different input trees got the same signed digest"
    );
}

#[test]
fn file_names_in_invalid_utf8_do_not_hash_alike() {
    let d = tmp();
    // Two trees, each one file with the same content, named \xff and \xfe: different names
    // (both invalid UTF-8, which the old format replaced by U+FFFD).
    let a = tree_root(d.path(), "A");
    write(&a.join(OsStr::from_bytes(b"\xff")), b"x");
    let c = tree_root(d.path(), "C");
    write(&c.join(OsStr::from_bytes(b"\xfe")), b"x");
    let (da, dc) = (signed_input_digest(&a), signed_input_digest(&c));
    assert_ne!(
        da, dc,
        "file names \\xff and \\xfe got the same signed digest"
    );
}

#[test]
fn an_input_that_vanishes_before_it_is_hashed_fails_the_run() {
    let d = tmp();
    let input = tree_root(d.path(), "in");
    write(&input.join("f"), b"data");
    let m = d.path().join("m.yaml");
    // The command says it started, waits until the host has removed the input (the bind
    // mount shows the removal), says so, and ends; the input is gone when the receipt is made.
    write(
        &m,
        format!(
            "inputs: [{{source: {}, mount: /input/in}}]\n\
             command: [/bin/sh, -c, 'echo {STARTED}; while [ -e /input/in/f ]; do sleep 0.05; done; echo {SENTINEL}']\n\
             limits: {{seconds: 60}}\n",
            input.display()
        )
        .as_bytes(),
    );
    let receipt = d.path().join("receipt.json");
    let key = d.path().join("key.pem");
    let report = d.path().join("report.json");
    let mut child = Command::new(common::bin())
        .args([
            OsStr::new("run"),
            OsStr::new("--manifest"),
            m.as_os_str(),
            OsStr::new("--receipt"),
            receipt.as_os_str(),
            OsStr::new("--key"),
            key.as_os_str(),
            OsStr::new("--report"),
            report.as_os_str(),
        ])
        .env_remove("XDG_DATA_HOME")
        .env_remove("AGENTJAIL_IMAGE_STORE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn agentjail");
    // Wait until the command runs (it prints STARTED), so that the input is taken away after
    // it was mounted and before the receipt is made.
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut first = String::new();
    stdout.read_line(&mut first).expect("read stdout");
    assert_eq!(first.trim(), STARTED, "the command did not start");
    std::fs::remove_dir_all(&input).expect("remove the input");
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).expect("read stdout");
    let o = child.wait_with_output().expect("wait");
    let out = Out {
        code: o.status.code().unwrap_or(-1),
        stdout: rest,
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    };
    assert!(
        out.stdout.contains(SENTINEL),
        "the command did not see its input go: {}",
        out.dump()
    );
    assert!(
        !receipt.exists(),
        "a receipt was signed for an input that could not be hashed: {:#}\n{}",
        statement(&receipt),
        out.dump()
    );
    assert_eq!(out.code, 125, "{}", out.dump());
    let last = out.stderr.lines().last().unwrap_or("");
    assert!(
        last.contains("/input/in"),
        "the failure names the input: {}",
        out.dump()
    );
}

/// An inline input (the service's code, by value) is signed like an input: its mount and the
/// sha256 of its content, the value `sha256sum` gives for a file of those bytes; a file input
/// of the same bytes beside it gets the same digest.
#[test]
fn an_inline_input_is_signed_by_the_digest_of_its_content() {
    let d = tmp();
    let content = "print('signed by value')\n";
    let file = d.path().join("same.py");
    write(&file, content.as_bytes());
    let manifest = serde_json::json!({
        "inputs": [{"source": file.display().to_string(), "mount": "/input/file.py"}],
        "inline_inputs": [{"mount": "/input/code.py", "content": content}],
        "command": ["/bin/true"],
        "limits": {"seconds": 20},
    });
    let st = run_signed(d.path(), "m.json", manifest.to_string().as_bytes(), &[]);
    let inputs = st["predicate"]["inputs"].as_array().expect("inputs");
    let digest_of = |mount: &str| {
        inputs
            .iter()
            .find(|i| i["mount"] == mount)
            .and_then(|i| i["sha256"].as_str())
            .unwrap_or_else(|| panic!("{mount} not signed: {st:#}"))
            .to_owned()
    };
    use sha2::Digest as _;
    let want = format!(
        "sha256:{}",
        sha2::Sha256::digest(content.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    assert_eq!(digest_of("/input/code.py"), want, "{st:#}");
    assert_eq!(digest_of("/input/file.py"), want, "{st:#}");
    assert_eq!(inputs.len(), 2, "{st:#}");
}
