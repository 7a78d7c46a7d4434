//! Workspace checkpoints (issue #34, stage 1a): a run's `/work` collected after the command
//! ends, without trusting it, into a deterministic archive with a sha256; restored into the
//! next run's `/work` before its command starts, only when the archive matches the digest the
//! manifest gives and holds nothing but plain files and folders within the bounds.
//!
//! Every test runs the real `agentjail` binary. A probe inside prints a sentinel (`RAN-…`), so
//! that "refused before start" is proven by the sentinel's absence, not by an exit code alone.
//! Crafted archives are written by Python's `tarfile` on the host (it writes names the `tar`
//! crate refuses to write: `../escape`, absolute paths).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::tmp;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

/// One run: exit code, stdout, stderr, report.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    report: Value,
}

impl Run {
    fn dump(&self) -> String {
        format!(
            "exit {}\n--- stdout\n{}\n--- stderr\n{}\n--- report\n{:#}",
            self.code, self.stdout, self.stderr, self.report
        )
    }
    fn status(&self) -> &str {
        self.report["status"].as_str().unwrap_or("")
    }
    fn ws(&self) -> &Value {
        &self.report["workspace"]
    }
    fn sha(&self) -> String {
        self.ws()["sha256"].as_str().unwrap_or("").to_string()
    }
    fn rejected(&self, path: &str) -> Option<String> {
        self.ws()["rejected"].as_array().and_then(|a| {
            a.iter()
                .find(|r| r["path"] == path)
                .map(|r| r["reason"].as_str().unwrap_or("").to_string())
        })
    }
}

/// Runs the manifest `m` (written as `name.json` in `dir`) with `--report` and, when given,
/// `--workspace-out`.
fn run(dir: &Path, name: &str, m: &Value, out: Option<&Path>) -> Run {
    let manifest = dir.join(format!("{name}.json"));
    std::fs::write(&manifest, serde_json::to_vec_pretty(m).unwrap()).unwrap();
    let report = dir.join(format!("{name}.report.json"));
    let mut cmd = Command::new(common::bin());
    cmd.env_remove("XDG_DATA_HOME")
        .env_remove("AGENTJAIL_IMAGE_STORE")
        .arg("run")
        .arg("--manifest")
        .arg(&manifest)
        .arg("--report")
        .arg(&report);
    if let Some(o) = out {
        cmd.arg("--workspace-out").arg(o);
    }
    let o = cmd.output().expect("run agentjail");
    let report = std::fs::read(&report)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    Run {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        report,
    }
}

fn sh(script: &str, workspace: Value) -> Value {
    json!({"command": ["/bin/sh", "-c", script], "workspace": workspace})
}

fn file_sha(p: &Path) -> String {
    use sha2::Digest;
    let bytes = std::fs::read(p).unwrap();
    let hex: String = sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

/// Entries of a tar archive as `(type, name)`, listed by Python's tarfile.
fn tar_entries(p: &Path) -> Vec<(String, String)> {
    let o = Command::new("python3")
        .arg("-c")
        .arg(
            "import sys, tarfile\n\
             for m in tarfile.open(sys.argv[1]).getmembers():\n\
             \x20   print(m.type.decode() or '0', oct(m.mode), m.uid, m.gid, m.mtime, m.name)",
        )
        .arg(p)
        .output()
        .expect("python3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let mut it = l.splitn(6, ' ');
            let t = it.next().unwrap().to_string();
            let meta: Vec<&str> = it.by_ref().take(4).collect();
            // Normalized metadata: owner 0, mtime 0, mode 0644 or 0755.
            assert_eq!(&meta[1..], ["0", "0", "0"], "entry {l}");
            assert!(meta[0] == "0o644" || meta[0] == "0o755", "entry {l}");
            (t, it.next().unwrap_or("").to_string())
        })
        .collect()
}

/// Writes a crafted archive with Python's tarfile: `script` gets `t` (the open archive) and
/// `add(name, data)`, `adddir(name)`.
fn craft(path: &Path, script: &str) -> String {
    let prelude = "import io, sys, tarfile\n\
        t = tarfile.open(sys.argv[1], 'w', format=tarfile.USTAR_FORMAT)\n\
        def add(name, data, kind=tarfile.REGTYPE, link=''):\n\
        \x20   i = tarfile.TarInfo(name); i.size = len(data) if kind == tarfile.REGTYPE else 0\n\
        \x20   i.type = kind; i.linkname = link; i.mode = 0o644\n\
        \x20   t.addfile(i, io.BytesIO(data) if kind == tarfile.REGTYPE else None)\n\
        def adddir(name):\n\
        \x20   i = tarfile.TarInfo(name); i.type = tarfile.DIRTYPE; i.mode = 0o755; t.addfile(i)\n";
    let o = Command::new("python3")
        .arg("-c")
        .arg(format!("{prelude}{script}\nt.close()\n"))
        .arg(path)
        .output()
        .expect("python3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    file_sha(path)
}

fn restore(path: &Path, sha: &str) -> Value {
    json!({"restore": path.to_str().unwrap(), "restore_sha256": sha, "collect": true})
}

const TREE: &str = "mkdir -p /work/sub/deep /work/empty && echo alpha-1 > /work/a.txt && \
    echo beta-2 > /work/sub/deep/b.txt && printf '#!/bin/sh\\necho exec-ok\\n' > /work/run.sh && \
    chmod 755 /work/run.sh && echo RAN-ONE";

/// (a) Run 1 leaves files and folders in /work; run 2 starts with exactly them (read, run,
/// changed and removed by the sandbox user), and the digests chain.
#[test]
fn a_checkpoint_restores_into_the_next_run_and_the_digests_chain() {
    let d = tmp();
    let ck1 = d.path().join("ck1.tar");
    let r1 = run(
        d.path(),
        "one",
        &sh(TREE, json!({"collect": true})),
        Some(&ck1),
    );
    assert_eq!(r1.status(), "ok", "{}", r1.dump());
    assert!(r1.stdout.contains("RAN-ONE"), "{}", r1.dump());
    let sha1 = r1.sha();
    assert!(sha1.starts_with("sha256:"), "{}", r1.dump());
    assert_eq!(file_sha(&ck1), sha1, "the report's digest is the file's");
    assert_eq!(r1.ws()["files"], 3, "{}", r1.dump());
    assert!(r1.ws()["restored_sha256"].is_null(), "{}", r1.dump());
    let mut names: Vec<String> = tar_entries(&ck1).into_iter().map(|e| e.1).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "a.txt",
            "empty",
            "run.sh",
            "sub",
            "sub/deep",
            "sub/deep/b.txt"
        ]
    );

    let ck2 = d.path().join("ck2.tar");
    let probe = "cat /work/a.txt /work/sub/deep/b.txt && /work/run.sh && test -d /work/empty && \
        echo EMPTY-DIR && echo more >> /work/a.txt && rm /work/sub/deep/b.txt && \
        echo new > /work/c.txt && echo RAN-TWO";
    let r2 = run(
        d.path(),
        "two",
        &sh(probe, restore(&ck1, &sha1)),
        Some(&ck2),
    );
    assert_eq!(r2.status(), "ok", "{}", r2.dump());
    for s in ["alpha-1", "beta-2", "exec-ok", "EMPTY-DIR", "RAN-TWO"] {
        assert!(r2.stdout.contains(s), "{s} missing: {}", r2.dump());
    }
    assert_eq!(r2.ws()["restored_sha256"], sha1, "{}", r2.dump());
    assert_ne!(r2.sha(), sha1, "the workspace changed");
    assert_eq!(file_sha(&ck2), r2.sha());
    let names: Vec<String> = tar_entries(&ck2).into_iter().map(|e| e.1).collect();
    assert!(names.contains(&"c.txt".to_string()), "{names:?}");
    assert!(!names.contains(&"sub/deep/b.txt".to_string()), "{names:?}");
}

/// (b) Equal trees give equal digests and equal bytes, whenever and in whatever order they
/// were made; a restored tree left alone is collected as the same checkpoint.
#[test]
fn b_equal_trees_give_equal_digests() {
    let d = tmp();
    let (c1, c2, c3) = (
        d.path().join("1.tar"),
        d.path().join("2.tar"),
        d.path().join("3.tar"),
    );
    let r1 = run(
        d.path(),
        "one",
        &sh(TREE, json!({"collect": true})),
        Some(&c1),
    );
    std::thread::sleep(std::time::Duration::from_millis(1100));
    // The same tree, made in another order.
    let other = "printf '#!/bin/sh\\necho exec-ok\\n' > /work/run.sh && mkdir /work/sub \
        /work/empty && mkdir /work/sub/deep && echo beta-2 > /work/sub/deep/b.txt && \
        echo alpha-1 > /work/a.txt && chmod 700 /work/run.sh && echo RAN-ONE";
    let r2 = run(
        d.path(),
        "two",
        &sh(other, json!({"collect": true})),
        Some(&c2),
    );
    assert_eq!(r1.status(), "ok", "{}", r1.dump());
    assert_eq!(r2.status(), "ok", "{}", r2.dump());
    assert_eq!(r1.sha(), r2.sha(), "{}\n{}", r1.dump(), r2.dump());
    assert_eq!(std::fs::read(&c1).unwrap(), std::fs::read(&c2).unwrap());
    let r3 = run(
        d.path(),
        "three",
        &sh("echo RAN-THREE", restore(&c1, &r1.sha())),
        Some(&c3),
    );
    assert_eq!(r3.status(), "ok", "{}", r3.dump());
    assert_eq!(r3.sha(), r1.sha(), "{}", r3.dump());
}

/// (c) A symlink to /etc/shadow, a FIFO and a hard link in /work are refused with reasons and
/// absent from the checkpoint; the next run has none of them.
#[test]
fn c_links_and_fifos_in_work_are_refused_and_absent() {
    let d = tmp();
    let ck = d.path().join("ck.tar");
    let script = "echo keep > /work/keep.txt && ln -s /etc/shadow /work/shadow-link && \
        mkfifo /work/fifo && echo data > /work/orig && ln /work/orig /work/hard && echo RAN-ONE";
    let r = run(
        d.path(),
        "one",
        &sh(script, json!({"collect": true})),
        Some(&ck),
    );
    assert!(r.stdout.contains("RAN-ONE"), "{}", r.dump());
    let sym = r.rejected("shadow-link").expect("symlink refused");
    assert!(sym.contains("symlink"), "{sym}");
    let fifo = r.rejected("fifo").expect("FIFO refused");
    assert!(fifo.contains("FIFO"), "{fifo}");
    let hard = r.rejected("hard").expect("hard link refused");
    assert!(hard.contains("hard link"), "{hard}");
    let sha = r.sha();
    assert!(sha.starts_with("sha256:"), "{}", r.dump());
    let names: Vec<String> = tar_entries(&ck).into_iter().map(|e| e.1).collect();
    assert!(names.contains(&"keep.txt".to_string()), "{names:?}");
    for n in ["shadow-link", "fifo", "hard"] {
        assert!(!names.contains(&n.to_string()), "{n} in {names:?}");
    }
    let probe = "cat /work/keep.txt; for n in shadow-link fifo hard; do \
        if [ -e /work/$n ] || [ -L /work/$n ]; then echo PRESENT-$n; fi; done; echo RAN-TWO";
    let r2 = run(d.path(), "two", &sh(probe, restore(&ck, &sha)), None);
    assert!(r2.stdout.contains("keep"), "{}", r2.dump());
    assert!(r2.stdout.contains("RAN-TWO"), "{}", r2.dump());
    assert!(!r2.stdout.contains("PRESENT"), "{}", r2.dump());
}

/// (d) A crafted archive given with its correct digest is refused before the command starts
/// when it holds `../escape`, an absolute path, a symlink, a hard link, a device, a duplicate
/// or a file over the bound: setup error, the reason in the report and on stderr, and the
/// sentinel never printed.
#[test]
fn d_crafted_archives_are_refused_before_start() {
    let d = tmp();
    let big = 2 * 1024 * 1024;
    let cases: Vec<(&str, String, &str)> = vec![
        ("dotdot", "add('../escape', b'x')".into(), ".."),
        (
            "dotdot-inner",
            "adddir('a')\nadd('a/../../escape', b'x')".into(),
            "..",
        ),
        (
            "absolute",
            "add('/tmp/escape-abs', b'x')".into(),
            "absolute",
        ),
        (
            "symlink",
            "add('link', b'', tarfile.SYMTYPE, '/etc/shadow')".into(),
            "symlink",
        ),
        (
            "hardlink",
            "add('f', b'x')\nadd('g', b'', tarfile.LNKTYPE, 'f')".into(),
            "hard link",
        ),
        ("fifo", "add('p', b'', tarfile.FIFOTYPE)".into(), "FIFO"),
        (
            "duplicate",
            "add('f', b'x')\nadd('f', b'y')".into(),
            "duplicate",
        ),
        ("oversized", format!("add('big', b'a' * {big})"), "limit"),
        ("no-parent", "add('missing/f', b'x')".into(), "folder"),
    ];
    for (name, script, why) in cases {
        let ck = d.path().join(format!("{name}.tar"));
        let sha = craft(&ck, &script);
        let mut ws = restore(&ck, &sha);
        ws["max_mb"] = json!(1);
        let r = run(d.path(), name, &sh("echo RAN-SENTINEL", ws), None);
        assert_eq!(r.code, 125, "{name}: {}", r.dump());
        assert_eq!(r.status(), "setup_error", "{name}: {}", r.dump());
        assert!(!r.stdout.contains("RAN-SENTINEL"), "{name}: {}", r.dump());
        let err = r.report["error"].as_str().unwrap_or("");
        assert!(
            err.contains("workspace") && err.contains(why),
            "{name}: wanted {why:?} in {err:?}"
        );
        assert!(r.stderr.contains(why), "{name}: {}", r.dump());
        assert!(!d.path().join("escape").exists());
        assert!(!Path::new("/tmp/escape-abs").exists());
    }
}

/// (e) A checkpoint changed after its digest was taken, or missing, is refused before start.
#[test]
fn e_tampered_or_missing_checkpoints_are_refused() {
    let d = tmp();
    let ck = d.path().join("ck.tar");
    let r = run(
        d.path(),
        "one",
        &sh(TREE, json!({"collect": true})),
        Some(&ck),
    );
    assert_eq!(r.status(), "ok", "{}", r.dump());
    let sha = r.sha();
    let mut bytes = std::fs::read(&ck).unwrap();
    let at = bytes
        .windows(7)
        .position(|w| w == b"alpha-1")
        .expect("content in the archive");
    bytes[at] = b'A';
    std::fs::write(&ck, &bytes).unwrap();
    let r2 = run(
        d.path(),
        "two",
        &sh("echo RAN-SENTINEL", restore(&ck, &sha)),
        None,
    );
    assert_eq!(r2.code, 125, "{}", r2.dump());
    assert!(!r2.stdout.contains("RAN-SENTINEL"), "{}", r2.dump());
    let err = r2.report["error"].as_str().unwrap_or("").to_string();
    assert!(err.contains("sha256") && err.contains(&sha), "{err}");

    let gone = d.path().join("gone.tar");
    let r3 = run(
        d.path(),
        "three",
        &sh("echo RAN-SENTINEL", restore(&gone, &sha)),
        None,
    );
    assert_eq!(r3.code, 125, "{}", r3.dump());
    assert!(!r3.stdout.contains("RAN-SENTINEL"), "{}", r3.dump());
    assert!(r3.stderr.contains("workspace.restore"), "{}", r3.dump());

    // A FIFO at the path is refused, never waited on.
    let fifo = d.path().join("fifo.tar");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let r4 = run(
        d.path(),
        "four",
        &sh("echo RAN-SENTINEL", restore(&fifo, &sha)),
        None,
    );
    assert_eq!(r4.code, 125, "{}", r4.dump());
    assert!(r4.stderr.contains("not a regular file"), "{}", r4.dump());
}

/// (f) A workspace over `max_files` or `max_mb` is not checkpointed at all (never a partial
/// state): the reason is listed, no digest, no file written, and the run ends
/// `output_rejected` (exit 65) although the command succeeded.
#[test]
fn f_a_workspace_over_its_bounds_is_refused_whole() {
    let d = tmp();
    for (name, ws, script, why) in [
        (
            "files",
            json!({"collect": true, "max_files": 5}),
            "for i in 1 2 3 4 5 6 7 8; do echo $i > /work/f$i; done; echo RAN-ONE",
            "more than 5",
        ),
        (
            "bytes",
            json!({"collect": true, "max_mb": 1}),
            "head -c 2000000 /dev/zero > /work/big; echo RAN-ONE",
            "limit",
        ),
    ] {
        let out = d.path().join(format!("{name}.tar"));
        let r = run(d.path(), name, &sh(script, ws), Some(&out));
        assert!(r.stdout.contains("RAN-ONE"), "{name}: {}", r.dump());
        assert_eq!(r.status(), "output_rejected", "{name}: {}", r.dump());
        assert_eq!(r.code, 65, "{name}: {}", r.dump());
        assert!(r.ws()["sha256"].is_null(), "{name}: {}", r.dump());
        let reasons = r.ws()["rejected"].to_string();
        assert!(reasons.contains(why), "{name}: {}", r.dump());
        assert!(!out.exists(), "{name}: nothing half-written");
    }
    // Bounds beyond the maxima are refused by validation.
    for ws in [
        json!({"collect": true, "max_mb": 0}),
        json!({"collect": true, "max_mb": 100000}),
        json!({"collect": true, "max_files": 1000000}),
        json!({"restore": "x.tar"}),
        json!({"restore_sha256": "sha256:00"}),
    ] {
        let r = run(d.path(), "bad", &sh("echo RAN-SENTINEL", ws.clone()), None);
        assert_eq!(r.code, 125, "{ws}: {}", r.dump());
        assert!(!r.stdout.contains("RAN-SENTINEL"), "{ws}: {}", r.dump());
        assert!(r.stderr.contains("workspace"), "{ws}: {}", r.dump());
    }
    // Not yet on the gVisor tier: refused by validation, not ignored.
    let mut m = sh("echo RAN-SENTINEL", json!({"collect": true}));
    m["isolation"] = json!("gvisor");
    let r = run(d.path(), "gvisor", &m, None);
    assert_eq!(r.code, 125, "{}", r.dump());
    assert!(
        r.stderr.contains("workspace") && r.stderr.contains("gvisor"),
        "{}",
        r.dump()
    );
    // --workspace-out without `collect` is refused before the run.
    let out = d.path().join("no-collect.tar");
    let r = run(
        d.path(),
        "nocollect",
        &sh("echo RAN-SENTINEL", json!({})),
        Some(&out),
    );
    assert_eq!(r.code, 125, "{}", r.dump());
    assert!(!r.stdout.contains("RAN-SENTINEL"), "{}", r.dump());
    assert!(r.stderr.contains("--workspace-out"), "{}", r.dump());
}

/// A cell that times out still has its workspace collected.
#[test]
fn a_timed_out_run_is_still_checkpointed() {
    let d = tmp();
    let ck = d.path().join("ck.tar");
    let mut m = sh(
        "echo partial > /work/progress.txt; echo RAN-ONE; sleep 30",
        json!({"collect": true}),
    );
    m["limits"] = json!({"seconds": 1});
    let r = run(d.path(), "one", &m, Some(&ck));
    assert_eq!(r.status(), "timeout", "{}", r.dump());
    assert!(r.sha().starts_with("sha256:"), "{}", r.dump());
    assert_eq!(file_sha(&ck), r.sha());
    let names: Vec<String> = tar_entries(&ck).into_iter().map(|e| e.1).collect();
    assert_eq!(names, ["progress.txt"]);
}

/// The signed receipt names the workspace before and after.
#[test]
fn the_receipt_names_the_workspace_digests() {
    let d = tmp();
    let ck1 = d.path().join("ck1.tar");
    let r1 = run(
        d.path(),
        "one",
        &sh(TREE, json!({"collect": true})),
        Some(&ck1),
    );
    assert_eq!(r1.status(), "ok", "{}", r1.dump());
    let m = sh("echo x > /work/x; echo RAN-TWO", restore(&ck1, &r1.sha()));
    let manifest = d.path().join("two.json");
    std::fs::write(&manifest, serde_json::to_vec(&m).unwrap()).unwrap();
    let receipt: PathBuf = d.path().join("receipt.json");
    let ck2 = d.path().join("ck2.tar");
    let o = Command::new(common::bin())
        .env("XDG_DATA_HOME", d.path().join("data"))
        .env_remove("AGENTJAIL_IMAGE_STORE")
        .args(["run", "--manifest"])
        .arg(&manifest)
        .arg("--receipt")
        .arg(&receipt)
        .arg("--report")
        .arg(d.path().join("two.report.json"))
        .arg("--workspace-out")
        .arg(&ck2)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: Value =
        serde_json::from_slice(&std::fs::read(d.path().join("two.report.json")).unwrap()).unwrap();
    let env: Value = serde_json::from_slice(&std::fs::read(&receipt).unwrap()).unwrap();
    use base64::Engine;
    let payload = base64::engine::general_purpose::STANDARD
        .decode(env["payload"].as_str().unwrap())
        .unwrap();
    let st: Value = serde_json::from_slice(&payload).unwrap();
    let ws = &st["predicate"]["workspace"];
    assert_eq!(ws["before"], r1.sha(), "{st:#}");
    assert_eq!(ws["after"], report["workspace"]["sha256"], "{st:#}");
    assert!(ws["after"].as_str().unwrap().starts_with("sha256:"));

    // The receipt's public key, for both verifiers.
    let key = Command::new(common::bin())
        .env("XDG_DATA_HOME", d.path().join("data"))
        .args(["receipt", "pubkey"])
        .output()
        .unwrap();
    assert!(key.status.success());
    let pem = d.path().join("pub.pem");
    std::fs::write(&pem, &key.stdout).unwrap();
    let rust_verify = |ck: &Path| {
        Command::new(common::bin())
            .args(["receipt", "verify"])
            .arg(&receipt)
            .arg("--pubkey")
            .arg(&pem)
            .arg("--workspace")
            .arg(ck)
            .output()
            .unwrap()
    };
    let ok = rust_verify(&ck2);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("workspace checkpoint matches"));
    let bad = rust_verify(&ck1);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("does not match the receipt"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    // The third-party verifier does the same.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../verify/tests/receipt_verify.py");
    let verify = |ck: &Path| {
        Command::new("python3")
            .arg(&script)
            .arg(&receipt)
            .arg(&pem)
            .arg("--workspace")
            .arg(ck)
            .output()
            .unwrap()
    };
    let ok = verify(&ck2);
    if String::from_utf8_lossy(&ok.stderr).contains("No module named 'cryptography'") {
        common::skip("python3 without the cryptography package");
        return;
    }
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let bad = verify(&ck1);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("workspace checkpoint"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

/// As root, an input the sandbox user cannot read goes in as a copy in a memfd sent with the
/// plan, like the checkpoint: both arrive, each where it belongs.
#[test]
fn an_input_copy_and_a_restore_travel_together() {
    use std::os::unix::fs::PermissionsExt;
    let d = tmp();
    let ck = d.path().join("ck.tar");
    let r1 = run(
        d.path(),
        "one",
        &sh(TREE, json!({"collect": true})),
        Some(&ck),
    );
    assert_eq!(r1.status(), "ok", "{}", r1.dump());
    let secret = d.path().join("secret.txt");
    std::fs::write(&secret, "secret-7f3a\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut m = sh(
        "cat /input/secret.txt /work/a.txt && echo RAN-TWO",
        restore(&ck, &r1.sha()),
    );
    m["inputs"] = json!([{"source": "secret.txt", "mount": "/input/secret.txt"}]);
    let r2 = run(d.path(), "two", &m, None);
    assert_eq!(r2.status(), "ok", "{}", r2.dump());
    for s in ["secret-7f3a", "alpha-1", "RAN-TWO"] {
        assert!(r2.stdout.contains(s), "{s}: {}", r2.dump());
    }
    if common::is_root() {
        assert_eq!(r2.report["inputs_copied"], json!(["/input/secret.txt"]));
    }
    assert_eq!(r2.sha(), r1.sha(), "{}", r2.dump());
}

/// The restored files are in the run's memory: counted in its peak (with a cgroup), and a
/// checkpoint larger than the run's memory limit is refused before the command starts.
#[test]
fn a_restore_is_charged_to_the_run() {
    let d = tmp();
    let ck = d.path().join("ck.tar");
    let r1 = run(
        d.path(),
        "one",
        &sh(
            "head -c 24000000 /dev/urandom > /work/big && echo RAN-ONE",
            json!({"collect": true}),
        ),
        Some(&ck),
    );
    assert_eq!(r1.status(), "ok", "{}", r1.dump());
    let mut m = sh("echo RAN-TWO", restore(&ck, &r1.sha()));
    m["limits"] = json!({"memory_mb": 64});
    let r2 = run(d.path(), "two", &m, None);
    assert_eq!(r2.status(), "ok", "{}", r2.dump());
    if r2.report["accounting"] == "cgroup" {
        let peak = r2.report["peak_memory_bytes"].as_u64().unwrap();
        assert!(peak >= 24_000_000, "peak {peak}: {}", r2.dump());
    }
    m["limits"] = json!({"memory_mb": 16});
    let r3 = run(d.path(), "three", &m, None);
    assert_eq!(r3.status(), "setup_error", "{}", r3.dump());
    assert!(!r3.stdout.contains("RAN-TWO"), "{}", r3.dump());
    let err = r3.report["error"].as_str().unwrap_or("");
    assert!(err.contains("restore the workspace"), "{err}");
}
