//! Digest-pinned images, end to end with the real binary: an image assembled offline from the
//! host's python3 (its shared libraries and the stdlib modules the CSV example needs) and
//! packed as an OCI layout by the test; import, run the CSV example in it, tamper, verify,
//! and hostile archives.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use pyimage::PY;

mod common;
use common::{Out, agentjail, pyimage};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/csv-summary")
}

/// A root file system with python3, the libraries it links and the stdlib modules that the
/// CSV example loads, plus dash as /bin/sh. Built once per test process.
fn python_rootfs() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        // In cargo's scratch folder for this test target, not in /tmp: a static is never
        // dropped, so a temporary folder here was left in /tmp by every test process. Each
        // process starts it afresh.
        let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pyroot");
        // The modules the example loads, as the host's python3 sees them.
        let ex = examples();
        let script = format!(
            "import runpy, sys\nsys.argv = ['summarize.py', {csv:?}, {out:?}]\ntry:\n    runpy.run_path({py:?}, run_name='__main__')\nexcept SystemExit:\n    pass\n",
            csv = ex.join("report.csv").display().to_string(),
            out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pyroot-probe.json").display().to_string(),
            py = ex.join("summarize.py").display().to_string(),
        );
        pyimage::python_rootfs(&d, &script)
    })
}

/// Packs the python rootfs as a one-layer OCI layout in `dir`; returns the image digest.
fn python_layout(dir: &Path) -> String {
    pyimage::oci_layout(python_rootfs(), dir)
}

fn import(store: &Path, src: &Path, extra: &[&str]) -> Out {
    let mut args = vec![
        "image",
        "import",
        src.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    agentjail(&args)
}

/// The example manifest, pinned to `image`, in `dir` (with the example's files next to it).
fn pinned_example(dir: &Path, image: &str) -> PathBuf {
    for f in ["report.csv", "summarize.py", "summary.schema.json"] {
        std::fs::copy(examples().join(f), dir.join(f)).unwrap();
    }
    let text = std::fs::read_to_string(examples().join("manifest.yaml")).unwrap();
    let text = format!("image: {image}\n{text}");
    let m = dir.join("manifest.yaml");
    std::fs::write(&m, text).unwrap();
    m
}

fn run_manifest(dir: &Path, m: &Path, store: &Path, extra: &[&str]) -> (Out, Value) {
    let report = dir.join("report.json");
    let _ = std::fs::remove_file(&report);
    let mut args = vec![
        "run",
        "--manifest",
        m.to_str().unwrap(),
        "--image-store",
        store.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = agentjail(&args);
    let r = std::fs::read(&report)
        .map(|b| serde_json::from_slice(&b).unwrap())
        .unwrap_or(Value::Null);
    (out, r)
}

fn stored_images(store: &Path) -> usize {
    std::fs::read_dir(store.join("images"))
        .map(|r| r.count())
        .unwrap_or(0)
}

#[test]
fn the_csv_example_runs_in_a_pinned_image_and_report_and_receipt_name_it() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let layout = d.path().join("layout");
    let digest = python_layout(&layout);
    let out = import(&store, &layout, &[]);
    assert_eq!(out.code, 0, "{}", out.dump());
    assert_eq!(out.stdout.trim(), digest);

    let ls = agentjail(&["image", "ls", "--store", store.to_str().unwrap(), "--json"]);
    let v: Value = serde_json::from_str(&ls.stdout).unwrap();
    assert_eq!(v[0]["digest"], digest.as_str());
    assert_eq!(v[0]["kind"], "oci");

    let m = pinned_example(d.path(), &digest);
    let outdir = d.path().join("out");
    let receipt = d.path().join("receipt.json");
    let key = d.path().join("key.pem");
    let (out, report) = run_manifest(
        d.path(),
        &m,
        &store,
        &[
            "--output-dir",
            outdir.to_str().unwrap(),
            "--receipt",
            receipt.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ],
    );
    assert_eq!(out.code, 0, "{}\n{report:#}", out.dump());
    assert_eq!(report["status"], "ok");
    assert_eq!(report["image"], digest.as_str());
    assert_eq!(report["image_pinned"], true);
    assert!(report.get("image_note").is_none() || report["image_note"].is_null());
    let summary: Value =
        serde_json::from_slice(&std::fs::read(outdir.join("summary.json")).unwrap()).unwrap();
    assert!(summary["rows"].as_u64().unwrap() > 0);
    // The receipt's statement names the same digest.
    let env: Value = serde_json::from_slice(&std::fs::read(&receipt).unwrap()).unwrap();
    use base64::Engine;
    let payload = base64::engine::general_purpose::STANDARD
        .decode(env["payload"].as_str().unwrap())
        .unwrap();
    assert!(
        String::from_utf8_lossy(&payload).contains(&digest),
        "receipt lacks the image digest"
    );
    // Report and receipt name the image's SBOM: the digest of what `image show --sbom` prints.
    let sbom = agentjail(&[
        "image",
        "show",
        &digest,
        "--sbom",
        "--store",
        store.to_str().unwrap(),
    ]);
    assert_eq!(sbom.code, 0, "{}", sbom.dump());
    let sbom_sha = agentjail_manifest::sha256_digest(sbom.stdout.as_bytes());
    assert_eq!(report["image_sbom"], sbom_sha.as_str(), "{report:#}");
    let statement: Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(
        statement["predicate"]["image_sbom"],
        sbom_sha.as_str(),
        "{statement:#}"
    );

    // The root really is the image: host programs absent from it are not there, nor the
    // host's /etc pieces (the image has no /etc), which the init binds early for every run
    // on the host image and must have thrown away for this one.
    let host_only: Vec<&str> = [
        "/etc/ld.so.cache",
        "/etc/ssl/certs",
        "/etc/alternatives",
        "/etc/mime.types",
    ]
    .into_iter()
    .filter(|p| Path::new(p).exists())
    .collect();
    assert!(
        !host_only.is_empty(),
        "this host has none of the /etc pieces to check"
    );
    let host_only = host_only
        .iter()
        .map(|p| format!("'{p}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let probe = d.path().join("probe.yaml");
    std::fs::write(
        &probe,
        format!(
            "image: {digest}\ncommand: [\"/usr/bin/python3\", \"-c\", \"import os, sys; sys.exit(3 if os.path.exists('/usr/bin/ls') or not os.path.exists('/usr/bin/python3') else 4 if any(os.path.lexists(p) for p in [{host_only}]) else 0)\"]\n"
        ),
    )
    .unwrap();
    let (out, report) = run_manifest(d.path(), &probe, &store, &[]);
    assert_eq!(out.code, 0, "{}\n{report:#}", out.dump());
    // The plan binds the image's directories, nothing of the host's /usr.
    let dry = agentjail(&[
        "run",
        "--manifest",
        probe.to_str().unwrap(),
        "--image-store",
        store.to_str().unwrap(),
        "--dry-run",
    ]);
    assert_eq!(dry.code, 0, "{}", dry.dump());
    let plan: Value = serde_json::from_str(&dry.stdout).unwrap();
    let binds: Vec<String> = plan["ops"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["op"] == "bind_ro" && o["dest"].as_str().unwrap().starts_with("/usr"))
        .map(|o| o["src"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !binds.is_empty() && binds.iter().all(|s| s.starts_with(store.to_str().unwrap())),
        "{binds:?}"
    );

    // `image: …` and `image_digest: …` must agree.
    let both = d.path().join("both.yaml");
    std::fs::write(
        &both,
        format!(
            "image: {digest}\nimage_digest: sha256:{}\ncommand: [\"true\"]\n",
            "1".repeat(64)
        ),
    )
    .unwrap();
    let (out, _) = run_manifest(d.path(), &both, &store, &[]);
    assert_eq!(out.code, 125, "{}", out.dump());
    assert!(out.stderr.contains("image"), "{}", out.dump());
}

#[test]
fn a_tampered_store_refuses_the_run_and_verify_reports_the_change() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let layout = d.path().join("layout");
    let digest = python_layout(&layout);
    assert_eq!(import(&store, &layout, &[]).code, 0);
    let verify = agentjail(&[
        "image",
        "verify",
        &digest,
        "--store",
        store.to_str().unwrap(),
    ]);
    assert_eq!(verify.code, 0, "{}", verify.dump());

    // Someone edits the stored json module.
    let rootfs = store.join("images").join(&digest[7..]).join("rootfs");
    let victim = rootfs.join("usr/lib/python3.11/json/__init__.py");
    let mut text = std::fs::read_to_string(&victim).unwrap();
    text.push_str("\nimport os; os.system('echo pwned')\n");
    std::fs::write(&victim, text).unwrap();

    let m = pinned_example(d.path(), &digest);
    let outdir = d.path().join("out");
    let (out, report) = run_manifest(
        d.path(),
        &m,
        &store,
        &["--output-dir", outdir.to_str().unwrap()],
    );
    assert_eq!(out.code, 125, "{}", out.dump());
    assert!(out.stderr.contains("no longer matches"), "{}", out.dump());
    assert_eq!(report["status"], "setup_error");
    assert!(!outdir.join("summary.json").exists());

    let verify = agentjail(&[
        "image",
        "verify",
        &digest,
        "--store",
        store.to_str().unwrap(),
    ]);
    assert_eq!(verify.code, 1, "{}", verify.dump());
    assert!(
        verify
            .stdout
            .contains("changed: \"usr/lib/python3.11/json/__init__.py\""),
        "{}",
        verify.dump()
    );

    // Removing the image: the run is refused as unknown, never run on the host instead.
    let rm = agentjail(&["image", "rm", &digest, "--store", store.to_str().unwrap()]);
    assert_eq!(rm.code, 0, "{}", rm.dump());
    assert_eq!(stored_images(&store), 0);
    let (out, report) = run_manifest(d.path(), &m, &store, &[]);
    assert_eq!(out.code, 125, "{}", out.dump());
    assert!(out.stderr.contains("image store"), "{}", out.dump());
    assert_eq!(report["status"], "setup_error");
}

#[test]
fn unknown_digest_is_refused_and_the_host_image_is_reported_unpinned() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let m = d.path().join("m.yaml");
    std::fs::write(
        &m,
        format!("image: sha256:{}\ncommand: [\"true\"]\n", "ab".repeat(32)),
    )
    .unwrap();
    let (out, report) = run_manifest(d.path(), &m, &store, &[]);
    assert_eq!(out.code, 125, "{}", out.dump());
    assert!(
        out.stderr.contains("neither the host image"),
        "{}",
        out.dump()
    );
    assert_eq!(report["status"], "setup_error");

    let m = d.path().join("host.yaml");
    std::fs::write(&m, "command: [\"true\"]\n").unwrap();
    let (out, report) = run_manifest(d.path(), &m, &store, &[]);
    assert_eq!(out.code, 0, "{}", out.dump());
    assert_eq!(report["image_pinned"], false);
    assert!(report.get("image_sbom").is_none(), "{report:#}");
    assert!(
        report["image_note"]
            .as_str()
            .unwrap()
            .contains("unpinned host image")
    );
    assert!(report["image"].as_str().unwrap().starts_with("sha256:"));
}

// --- hostile archives through the binary ---------------------------------------------------

/// One raw ustar header block (names are written verbatim, `..` and `/` included).
fn header(name: &str, typeflag: u8, size: u64, link: &str) -> Vec<u8> {
    let mut h = vec![0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..107].copy_from_slice(b"0000644");
    h[108..115].copy_from_slice(b"0000000");
    h[116..123].copy_from_slice(b"0000000");
    let sz = format!("{size:011o}");
    if sz.len() == 11 {
        h[124..135].copy_from_slice(sz.as_bytes());
    } else {
        // base-256 for sizes over 8 GiB
        h[124] = 0x80;
        h[128..136].copy_from_slice(&size.to_be_bytes());
    }
    h[136..147].copy_from_slice(b"14540000000");
    h[156] = typeflag;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    h
}

fn file(name: &str, data: &[u8]) -> Vec<u8> {
    let mut v = header(name, b'0', data.len() as u64, "");
    v.extend_from_slice(data);
    v.resize(v.len().div_ceil(512) * 512, 0);
    v
}

fn end(mut v: Vec<u8>) -> Vec<u8> {
    v.extend_from_slice(&[0u8; 1024]);
    v
}

fn hostile(name: &str, tar: Vec<u8>, want: &str, extra: &[&str]) {
    let d = tempfile::tempdir().unwrap();
    let outside = d.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let store = d.path().join("store");
    let p = d.path().join("in.tar");
    std::fs::write(&p, &tar).unwrap();
    let out = import(&store, &p, extra);
    assert_eq!(out.code, 125, "{name}: {}", out.dump());
    assert!(
        out.stderr.contains("refused") && out.stderr.contains(want),
        "{name}: {}",
        out.dump()
    );
    // The same archive as the layer of an OCI layout.
    let layout = d.path().join("layout");
    agentjail_image::layout::write_oci_layout(
        &layout,
        &[agentjail_image::layout::gzip(&tar).unwrap()],
    )
    .unwrap();
    let out = import(&store, &layout, extra);
    assert_eq!(out.code, 125, "{name} (layer): {}", out.dump());
    assert!(out.stderr.contains(want), "{name} (layer): {}", out.dump());
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "{name}: wrote outside"
    );
    assert_eq!(stored_images(&store), 0);
    assert_eq!(
        std::fs::read_dir(store.join("tmp")).unwrap().count(),
        0,
        "{name}: staging left"
    );
}

#[test]
fn hostile_archives_are_refused_with_their_reason() {
    let d = tempfile::tempdir().unwrap();
    let o = d.path().join("x").display().to_string();
    hostile(
        "dotdot",
        end(file("../../outside/evil", b"x")),
        "`..` component",
        &[],
    );
    hostile(
        "absolute",
        end(file(&format!("{o}/evil"), b"x")),
        "absolute path",
        &[],
    );
    let mut t = header("link", b'2', 0, "../outside");
    t.extend(file("link/evil", b"x"));
    hostile(
        "symlink write-through",
        end(t),
        "symlink or not a directory",
        &[],
    );
    hostile(
        "hard link to /etc/shadow",
        end(header("shadow", b'1', 0, "/etc/shadow")),
        "absolute path",
        &[],
    );
    hostile(
        "hard link ahead",
        end(header("shadow", b'1', 0, "etc/shadow")),
        "not a regular file this import already extracted",
        &[],
    );
    // 10 GB declared, nothing behind it: refused on the header, at once.
    let start = std::time::Instant::now();
    hostile(
        "10 GB file",
        end(header("big", b'0', 10 << 30, "")),
        "larger than the bound",
        &[],
    );
    assert!(start.elapsed().as_secs() < 20);
    // A million tiny files, with the entry bound lowered for the test.
    let mut many = Vec::with_capacity(1_000_000 / 100 * 512);
    for i in 0..5_000 {
        many.extend(header(&format!("f{i}"), b'0', 0, ""));
    }
    hostile(
        "many files",
        end(many),
        "more than 1000 entries",
        &["--max-entries", "1000"],
    );
}

#[test]
fn wrong_digests_and_truncated_blobs_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let layout = d.path().join("layout");
    let tar = end(file("hello", b"hello"));
    agentjail_image::layout::write_oci_layout(
        &layout,
        &[agentjail_image::layout::gzip(&tar).unwrap()],
    )
    .unwrap();
    let blobs = layout.join("blobs/sha256");
    // The layer is the largest blob that is gzip.
    let layer = std::fs::read_dir(&blobs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| std::fs::read(p).unwrap().starts_with(&[0x1f, 0x8b]))
        .unwrap();
    let good = std::fs::read(&layer).unwrap();
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 1] ^= 1;
    std::fs::write(&layer, &bad).unwrap();
    let out = import(&store, &layout, &[]);
    assert_eq!(out.code, 125, "{}", out.dump());
    assert!(out.stderr.contains("wrong digest"), "{}", out.dump());
    std::fs::write(&layer, &good[..n / 2]).unwrap();
    let out = import(&store, &layout, &[]);
    assert_eq!(out.code, 125, "{}", out.dump());
    assert!(out.stderr.contains("truncated"), "{}", out.dump());
    assert_eq!(stored_images(&store), 0);
    std::fs::write(&layer, &good).unwrap();
    assert_eq!(import(&store, &layout, &[]).code, 0);
}

/// `agentjail run --image-store STORE --report R -- ARGV` pinned to `digest` (a manifest file
/// in `dir`); returns (out, report).
fn run_pinned(dir: &Path, store: &Path, digest: &str, argv: &[&str]) -> (Out, Value) {
    let m = dir.join("pinned.json");
    std::fs::write(
        &m,
        serde_json::to_vec(&serde_json::json!({"image": digest, "command": argv})).unwrap(),
    )
    .unwrap();
    run_manifest(dir, &m, store, &[])
}

/// Issue #12 item 5: a store writer replaces a binary of a pinned image and rewrites the
/// recorded fingerprint (and, for good measure, moves another image's tree under the pinned
/// digest). The run pinned to the digest must refuse, not execute the replacement.
#[test]
fn a_replaced_binary_with_a_rewritten_fingerprint_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let layout = d.path().join("layout");
    let digest = python_layout(&layout);
    assert_eq!(import(&store, &layout, &[]).code, 0);
    let entry = store.join("images").join(&digest[7..]);
    // Sentinel: the genuine image runs.
    let (out, report) = run_pinned(
        d.path(),
        &store,
        &digest,
        &[PY, "-c", "print('GENUINE-PY')"],
    );
    assert_eq!(out.code, 0, "{}\n{report}", out.dump());
    assert!(out.stdout.contains("GENUINE-PY"), "{}", out.dump());

    // The attack: python3 becomes a script, and image.json's fingerprint is recomputed the way
    // the store computes it.
    let py = entry.join("rootfs/usr/bin/python3");
    std::fs::remove_file(&py).unwrap();
    std::fs::write(&py, "#!/bin/sh\necho REPLACED-BINARY-RAN\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o755)).unwrap();
    let rec_path = entry.join("image.json");
    let mut rec: Value = serde_json::from_slice(&std::fs::read(&rec_path).unwrap()).unwrap();
    let unkeyed = agentjail_image::tree::walk(&entry.join("rootfs"), false)
        .unwrap()
        .fingerprint;
    rec["fingerprint"] = Value::String(unkeyed);
    std::fs::write(&rec_path, serde_json::to_vec_pretty(&rec).unwrap()).unwrap();

    let (out, report) = run_pinned(
        d.path(),
        &store,
        &digest,
        &[PY, "-c", "print('GENUINE-PY')"],
    );
    assert!(
        !out.stdout.contains("REPLACED-BINARY-RAN"),
        "{}",
        out.dump()
    );
    assert_eq!(out.code, 125, "{}\n{report}", out.dump());
    assert!(out.stderr.contains("no longer matches"), "{}", out.dump());
    assert_eq!(report["status"], "setup_error");

    // A keyed fingerprint copied from an intact image does not fit another digest either: the
    // intact image's entry renamed to the pinned digest's place (inodes and ctimes of its tree
    // unchanged by a rename), its record edited to name that digest.
    let other = d.path().join("other");
    std::fs::create_dir_all(other.join("bin")).unwrap();
    std::fs::copy("/bin/sh", other.join("bin/sh")).unwrap();
    std::fs::write(other.join("marker"), "other image\n").unwrap();
    let o = import(&store, &other, &[]);
    assert_eq!(o.code, 0, "{}", o.dump());
    let other_digest = o.stdout.trim().to_string();
    std::fs::remove_dir_all(&entry).unwrap();
    std::fs::rename(store.join("images").join(&other_digest[7..]), &entry).unwrap();
    let mut rec: Value = serde_json::from_slice(&std::fs::read(&rec_path).unwrap()).unwrap();
    rec["digest"] = Value::String(digest.clone());
    std::fs::write(&rec_path, serde_json::to_vec_pretty(&rec).unwrap()).unwrap();
    let (out, report) = run_pinned(
        d.path(),
        &store,
        &digest,
        &["/bin/sh", "-c", "echo MOVED-IMAGE-RAN"],
    );
    assert!(!out.stdout.contains("MOVED-IMAGE-RAN"), "{}", out.dump());
    assert_eq!(out.code, 125, "{}\n{report}", out.dump());
    assert_eq!(report["status"], "setup_error");
}

/// Copies the python rootfs into `dest` (a plain root file system directory).
fn copy_tree(src: &Path, dest: &Path) {
    let st = Command::new("cp")
        .arg("-a")
        .arg(src)
        .arg(dest)
        .status()
        .unwrap();
    assert!(st.success());
}

/// Issue #12 item 5: an image whose `etc`, or whose `etc/ssl`, is a symlink (here to the host's
/// own /etc) runs: those /etc pieces are skipped, as documented, instead of failing every run,
/// and nothing of the host's /etc/ssl appears.
#[test]
fn an_image_with_a_symlinked_etc_or_etc_ssl_runs() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    for (name, link, target) in [
        ("etc-link", "etc", "/etc"),
        ("ssl-link", "etc/ssl", "/etc/ssl"),
    ] {
        let root = d.path().join(name);
        copy_tree(python_rootfs(), &root);
        std::fs::create_dir_all(root.join(link).parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, root.join(link)).unwrap();
        let o = import(&store, &root, &[]);
        assert_eq!(o.code, 0, "{}", o.dump());
        let digest = o.stdout.trim().to_string();
        let (out, report) = run_pinned(
            d.path(),
            &store,
            &digest,
            &[
                "/bin/sh",
                "-c",
                "echo SYMLINKED-ETC-RAN; for f in /etc/ssl/certs/*; do echo CERT $f; done",
            ],
        );
        assert_eq!(out.code, 0, "{name}: {}\n{report}", out.dump());
        assert!(
            out.stdout.contains("SYMLINKED-ETC-RAN"),
            "{name}: {}",
            out.dump()
        );
        assert!(
            !out.stdout.contains(".pem"),
            "{name}: host certificates: {}",
            out.dump()
        );
        assert_eq!(report["image"], digest.as_str());
    }
}

/// Issue #12 item 5: an image store reached through a symlinked path works for import, run
/// and verify.
#[test]
fn an_image_store_behind_a_symlink_works() {
    let d = tempfile::tempdir().unwrap();
    let real = d.path().join("real-store");
    std::fs::create_dir_all(&real).unwrap();
    let link = d.path().join("store-link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let layout = d.path().join("layout");
    let digest = python_layout(&layout);
    let o = import(&link, &layout, &[]);
    assert_eq!(o.code, 0, "{}", o.dump());
    let (out, report) = run_pinned(d.path(), &link, &digest, &[PY, "-c", "print('VIA-LINK')"]);
    assert_eq!(out.code, 0, "{}\n{report}", out.dump());
    assert!(out.stdout.contains("VIA-LINK"), "{}", out.dump());
    assert_eq!(report["image_pinned"], true);
    let v = agentjail(&[
        "image",
        "verify",
        &digest,
        "--store",
        link.to_str().unwrap(),
    ]);
    assert_eq!(v.code, 0, "{}", v.dump());
}

/// `image show`: the record and the packages the image's own records list, the SBOM's digest
/// that of the exact bytes `--sbom` prints (a CycloneDX document), the same in `--json`; and a
/// changed image is refused, naming the change, not described.
#[test]
fn image_show_lists_the_packages_and_prints_a_cyclonedx_sbom() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let src = d.path().join("rootfs");
    for (rel, text) in [
        ("etc/os-release", "ID=debian\n"),
        (
            "var/lib/dpkg/status",
            "Package: python3.11\nStatus: install ok installed\nArchitecture: amd64\nVersion: 3.11.2-6\n",
        ),
        (
            "usr/local/lib/python3.11/site-packages/pandas-2.2.3.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: pandas\nVersion: 2.2.3\n",
        ),
        // A name that carries a terminal escape: shown inert.
        (
            "usr/local/lib/python3.11/site-packages/x-1.dist-info/METADATA",
            "Name: x\u{1b}]0;pwned\u{7}\nVersion: 1\u{1b}[2J\n",
        ),
    ] {
        let p = src.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let imp = import(&store, &src, &[]);
    assert_eq!(imp.code, 0, "{}", imp.dump());
    let digest = imp.stdout.trim().to_owned();
    let show = |extra: &[&str]| {
        let mut a = vec!["image", "show", &digest, "--store", store.to_str().unwrap()];
        a.extend_from_slice(extra);
        agentjail(&a)
    };

    let sbom = show(&["--sbom"]);
    assert_eq!(sbom.code, 0, "{}", sbom.dump());
    let doc: Value = serde_json::from_str(&sbom.stdout).unwrap();
    assert_eq!(doc["bomFormat"], "CycloneDX", "{doc}");
    assert_eq!(doc["specVersion"], "1.5", "{doc}");
    let purls: Vec<&str> = doc["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["purl"].as_str().unwrap())
        .collect();
    assert_eq!(
        purls,
        [
            "pkg:deb/debian/python3.11@3.11.2-6?arch=amd64",
            "pkg:pypi/pandas@2.2.3",
            "pkg:pypi/x%1B%5D0%3Bpwned%07@1%1B%5B2J",
        ]
    );
    let sbom_sha = agentjail_manifest::sha256_digest(sbom.stdout.as_bytes());

    let text = show(&[]);
    assert_eq!(text.code, 0, "{}", text.dump());
    assert!(
        text.stdout.contains("packages: 1 Debian, 2 Python")
            && !text.stdout.contains('\u{1b}')
            && text.stdout.contains(&sbom_sha)
            && text.stdout.contains("pypi pandas 2.2.3"),
        "{}",
        text.dump()
    );
    let json = show(&["--json"]);
    assert_eq!(json.code, 0, "{}", json.dump());
    let v: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["sbom_sha256"], sbom_sha.as_str(), "{v}");
    assert_eq!(v["digest"], digest.as_str(), "{v}");
    assert_eq!(v["packages"][1]["name"], "pandas", "{v}");

    // A changed image: refused, not described.
    let stored = store.join("images").join(&digest[7..]).join("rootfs");
    std::fs::write(stored.join("var/lib/dpkg/status"), "Package: other\n").unwrap();
    let changed = show(&["--sbom"]);
    assert_ne!(changed.code, 0, "{}", changed.dump());
    assert!(changed.stdout.is_empty(), "{}", changed.dump());
    assert!(changed.stderr.contains("changed"), "{}", changed.dump());
}

/// `image outdated`: a lock file's pins against the image's Python distributions (read from
/// the checked image): a pin at another version is `changed`, one the image lacks `added`; a
/// line that is not an exact pin is not compared and says so; exit 1 unless the image matches.
#[test]
fn image_outdated_compares_a_lock_file_with_the_image() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let src = d.path().join("rootfs");
    let meta = src.join("usr/local/lib/python3.11/site-packages/pandas-2.2.3.dist-info/METADATA");
    std::fs::create_dir_all(meta.parent().unwrap()).unwrap();
    std::fs::write(
        &meta,
        "Metadata-Version: 2.1\nName: pandas\nVersion: 2.2.3\n",
    )
    .unwrap();
    let imp = import(&store, &src, &[]);
    assert_eq!(imp.code, 0, "{}", imp.dump());
    let digest = imp.stdout.trim().to_owned();
    let outdated = |lock: &str, extra: &[&str]| {
        let f = d.path().join("requirements.txt");
        std::fs::write(&f, lock).unwrap();
        let mut a = vec![
            "image",
            "outdated",
            &digest,
            "--requirements",
            f.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
        ];
        a.extend_from_slice(extra);
        agentjail(&a)
    };

    let same = outdated("pandas==2.2.3 \\\n    --hash=sha256:00\n", &[]);
    assert_eq!(same.code, 0, "{}", same.dump());
    assert!(
        same.stdout.contains("matches the lock file (1 pins)"),
        "{}",
        same.dump()
    );

    let moved = outdated("Pandas==2.3.0\nnumpy==2.1.0\nscipy>=1\n", &[]);
    assert_eq!(moved.code, 1, "{}", moved.dump());
    for want in [
        "changed  pandas 2.2.3 -> 2.3.0",
        "added    numpy 2.1.0",
        "not pinned (not compared): scipy>=1",
        "2 of 2 pins differ from the image; 1 line(s) not compared",
    ] {
        assert!(moved.stdout.contains(want), "{want}\n{}", moved.dump());
    }
    let json = outdated("pandas==2.3.0\n", &["--json"]);
    assert_eq!(json.code, 1, "{}", json.dump());
    let v: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["up_to_date"], false);
    assert_eq!(v["changes"][0]["change"], "changed");
    assert_eq!(v["changes"][0]["image"], "2.2.3");

    // No comparison possible: the tool's error status, not a verdict.
    let empty = outdated("# nothing\n", &[]);
    assert_eq!(empty.code, 125, "{}", empty.dump());
    assert!(empty.stderr.contains("no requirement"), "{}", empty.dump());
}
