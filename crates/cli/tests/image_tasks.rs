//! Task types on pinned images (issue #36, docs/images.md "Task types on pinned images"), with
//! the real binary: an image assembled from the host's python3 plus a marker file and a
//! `numpy` package that only the image has; `agentjail serve` runs a task there (the marker is
//! seen, a host-only file is not; the report and receipt name the digest), the MCP description's
//! runtime line is the image's interpreter's (probed in a sandbox on the image: it lists numpy,
//! which the host lacks, and lacks yaml, which the host has), and a missing or tampered image
//! refuses the start, naming the task.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};

mod common;
use common::pyimage::{self, PY};
use common::serve::{
    Api, Serve, actor, mcp_descriptions, python_code_task, runtime, runtime_packages, write_config,
};
use common::{Out, agentjail};

const ALICE: &str = "alice-token-image-tasks";
const MARKER: &str = "opt/agentjail-image-marker.txt";
const MARKER_TEXT: &str = "IMAGE-ONLY-7f3a";
/// A host file the image does not have.
const HOST_ONLY: &str = "/usr/bin/ldd";
/// A module of the runtime line's list that only the image has (the host lacks it).
const IMAGE_ONLY_MODULE: &str = "numpy";
/// One the host has and the image lacks.
const HOST_ONLY_MODULE: &str = "yaml";

fn host_python_has(module: &str) -> bool {
    Command::new(PY)
        .args(["-s", "-c", &format!("import {module}")])
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// The image's OCI layout (built once per test process): python3 with the modules the task's
/// code and the runtime probe load, the marker file, and a `numpy` package of its own.
fn layout() -> &'static (PathBuf, String) {
    static L: OnceLock<(PathBuf, String)> = OnceLock::new();
    L.get_or_init(|| {
        assert!(
            Path::new(HOST_ONLY).exists(),
            "the test needs {HOST_ONLY} on the host"
        );
        assert!(
            !host_python_has(IMAGE_ONLY_MODULE),
            "the test needs a host python without {IMAGE_ONLY_MODULE}"
        );
        assert!(
            host_python_has(HOST_ONLY_MODULE),
            "the test needs a host python with {HOST_ONLY_MODULE} (python3-yaml)"
        );
        let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("image-tasks");
        let root = pyimage::python_rootfs(&d.join("build"), "import json, os, sys, importlib.util");
        std::fs::create_dir_all(root.join("opt")).unwrap();
        std::fs::write(root.join(MARKER), MARKER_TEXT).unwrap();
        let o = Command::new(PY)
            .args(["-c", "import os; print(os.path.dirname(os.__file__))"])
            .output()
            .unwrap();
        let stdlib = String::from_utf8(o.stdout).unwrap();
        let pkg = root
            .join(stdlib.trim().trim_start_matches('/'))
            .join(IMAGE_ONLY_MODULE);
        std::fs::create_dir_all(&pkg).unwrap();
        std::fs::write(pkg.join("__init__.py"), "__version__ = 'image-only'\n").unwrap();
        assert!(!root.join(HOST_ONLY.trim_start_matches('/')).exists());
        let dir = d.join("layout");
        let _ = std::fs::remove_dir_all(&dir);
        let digest = pyimage::oci_layout(&root, &dir);
        (dir, digest)
    })
}

/// `agentjail image import SRC --store STORE`, which must succeed; returns the digest.
fn import_path(store: &Path, src: &Path) -> String {
    let out = agentjail(&[
        "image",
        "import",
        src.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{}", out.dump());
    out.stdout.trim().to_string()
}

/// Imports the image into `store`; returns its digest.
fn import(store: &Path) -> String {
    let (dir, digest) = layout();
    assert_eq!(&import_path(store, dir), digest);
    digest.clone()
}

/// Tenant `acme`, actor `alice`, `py_image` (code on `image`) and `py_host` (code on the host
/// image); `extra` goes into `[server]`.
fn config(dir: &Path, image: &str, server: &str) -> PathBuf {
    let image_task = python_code_task(
        "py_image",
        "Python on a pinned image",
        &format!("allowed_actors = [\"alice\"]\nimage = \"{image}\""),
        20,
    );
    let host_task = python_code_task(
        "py_host",
        "Python on the host image",
        "allowed_actors = [\"alice\"]",
        20,
    );
    write_config(
        dir,
        &format!(
            "[server]\n{server}\n[tenants.acme]\n{}{image_task}{host_task}",
            actor("alice", "acme", ALICE, false)
        ),
    )
}

const PROBE_CODE: &str = r#"
import json, os
marker = '/opt/agentjail-image-marker.txt'
json.dump({
    "marker": open(marker).read() if os.path.exists(marker) else None,
    "host_only": os.path.exists(HOST_ONLY),
}, open('/output/o.json', 'w'))
"#;

fn run(api: &Api, task: &str, request_id: &str) -> Value {
    let code = PROBE_CODE.replace("HOST_ONLY", &format!("{HOST_ONLY:?}"));
    let r = api.run(
        ALICE,
        &json!({"task": task, "request_id": request_id, "inputs": [], "code": code}),
        "?wait=true",
    );
    let status = r.status().as_u16();
    let v: Value = r.json().unwrap();
    assert!(status < 300, "{status}: {v:#}");
    v
}

/// The predicate of a run record's signed receipt (the DSSE envelope's payload).
fn receipt_predicate(v: &Value) -> Value {
    use base64::Engine as _;
    let payload = base64::engine::general_purpose::STANDARD
        .decode(v["receipt"]["payload"].as_str().unwrap())
        .unwrap();
    let statement: Value = serde_json::from_slice(&payload).unwrap();
    statement["predicate"].clone()
}

#[test]
fn a_task_on_a_pinned_image_runs_there_and_its_report_and_receipt_name_the_image() {
    let d = common::tmp();
    let data = d.path().join("data");
    // The default store of a service: <data_dir>/images.
    let digest = import(&data.join("images"));
    let cfg = config(d.path(), &digest, "");
    let s = Serve::start(&cfg, &data, &[]);
    let api = Api::new(&s.base);

    let v = run(&api, "py_image", "on-image-1");
    assert_eq!(v["status"], "ok", "{v:#}\n{}", s.log());
    let out = &v["artifact"]["json"];
    assert_eq!(out["marker"], MARKER_TEXT, "{v:#}");
    assert_eq!(out["host_only"], false, "{v:#}");
    assert_eq!(v["report"]["image"], digest.as_str(), "{v:#}");
    assert_eq!(v["report"]["image_pinned"], true, "{v:#}");
    let receipt = receipt_predicate(&v);
    assert_eq!(receipt["image"], digest.as_str(), "{receipt:#}");
    assert_eq!(receipt["image_pinned"], true, "{receipt:#}");

    // The catalogue says which image each task runs on.
    let tasks: Value = api.get(ALICE, "/v1/tasks").json().unwrap();
    let view = |n: &str| {
        tasks["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == n)
            .unwrap()
            .clone()
    };
    assert_eq!(view("py_image")["image"], digest.as_str(), "{tasks:#}");
    assert!(view("py_host").get("image").is_none(), "{tasks:#}");

    // A session's cells run on the image too, their /work kept from cell to cell.
    let (st, ses) = api.send(
        reqwest::Method::POST,
        ALICE,
        "/v1/sessions",
        Some(json!({"request_id": "ses-1", "task": "py_image"})),
    );
    assert_eq!(st, 201, "{ses}");
    let sid = ses["session_id"].as_str().unwrap();
    let (st, c0) = api.cell_raw(
        ALICE,
        sid,
        "cell-0",
        "open('/work/w.txt', 'w').write('kept')",
        true,
    );
    assert_eq!((st, &c0["status"]), (200, &json!("ok")), "{c0:#}");
    let body = format!(
        "import os\nprint('M=' + open('/{MARKER}').read(), 'H=%s' % os.path.exists({HOST_ONLY:?}), 'W=' + open('/work/w.txt').read())"
    );
    let (st, c1) = api.cell_raw(ALICE, sid, "cell-1", &body, true);
    assert_eq!((st, &c1["status"]), (200, &json!("ok")), "{c1:#}");
    let printed = c1["stdout"]["head"].as_str().unwrap_or("").to_string()
        + c1["stdout"]["tail"].as_str().unwrap_or("");
    assert!(
        printed.contains(&format!("M={MARKER_TEXT} H=False W=kept")),
        "{c1:#}"
    );
    assert_eq!(c1["report"]["image"], digest.as_str(), "{c1:#}");

    let h = run(&api, "py_host", "on-host-1");
    assert_eq!(h["status"], "ok", "{h:#}");
    let out = &h["artifact"]["json"];
    assert_eq!(out["marker"], Value::Null, "{h:#}");
    assert_eq!(out["host_only"], true, "{h:#}");
    assert_eq!(h["report"]["image_pinned"], false, "{h:#}");
    assert_ne!(h["report"]["image"], digest.as_str(), "{h:#}");
    let receipt = receipt_predicate(&h);
    assert_eq!(receipt["image"], h["report"]["image"], "{receipt:#}");
    assert_eq!(receipt["image_pinned"], false, "{receipt:#}");
}

#[test]
fn the_mcp_runtime_line_is_probed_in_the_image_not_on_the_host() {
    let d = common::tmp();
    // An image store named by the configuration (server.image_store), outside the data dir.
    let store = d.path().join("store");
    let digest = import(&store);
    let cfg = config(
        d.path(),
        &digest,
        &format!("image_store = {:?}", store.to_str().unwrap()),
    );
    let tools = mcp_descriptions(&cfg, &d.path().join("data"), ALICE);
    let on_image = runtime(&tools["py_image"]);
    let on_host = runtime(&tools["py_host"]);
    eprintln!("image: {on_image}\nhost: {on_host}");
    let img = runtime_packages(on_image);
    let host = runtime_packages(on_host);
    assert!(
        img.contains(&IMAGE_ONLY_MODULE.to_string()),
        "the image's {IMAGE_ONLY_MODULE} is missing: {on_image}"
    );
    assert!(
        !img.contains(&HOST_ONLY_MODULE.to_string()),
        "the host's {HOST_ONLY_MODULE} is not in the image: {on_image}"
    );
    assert!(
        host.contains(&HOST_ONLY_MODULE.to_string())
            && !host.contains(&IMAGE_ONLY_MODULE.to_string()),
        "{on_host}"
    );
}

/// `agentjail serve` with `cfg` that must refuse to start: its exit and stderr (a serve still
/// running after 60 s is killed and fails the test).
fn serve_refused(cfg: &Path, data: &Path) -> Out {
    let mut child = Command::new(common::bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(cfg)
        .arg("--data-dir")
        .arg(data)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let o = Out::from(child.wait_with_output().unwrap());
            panic!("serve started instead of refusing:\n{}", o.dump());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Out::from(child.wait_with_output().unwrap())
}

#[test]
fn a_missing_or_tampered_image_refuses_the_start_naming_the_task() {
    let d = common::tmp();
    let data = d.path().join("data");
    let store = data.join("images");
    let digest = import(&store);

    // Missing: a digest the store does not hold.
    let other = format!("sha256:{}", "ab".repeat(32));
    let cfg = config(d.path(), &other, "");
    let out = serve_refused(&cfg, &data);
    assert_eq!(out.code, 125, "{}", out.dump());
    assert!(
        out.stderr.contains("task `py_image`") && out.stderr.contains(&other),
        "{}",
        out.dump()
    );
    assert!(
        out.stderr.contains("not in the image store"),
        "{}",
        out.dump()
    );

    // Intact: it starts.
    let cfg = config(d.path(), &digest, "");
    drop(Serve::start(&cfg, &data, &[]));

    // Tampered: one byte of a file in the stored image changed (same size).
    let hex = digest.strip_prefix("sha256:").unwrap();
    let marker = store.join("images").join(hex).join("rootfs").join(MARKER);
    let mut text = std::fs::read(&marker).unwrap();
    text[0] ^= 1;
    std::fs::write(&marker, text).unwrap();
    let out = serve_refused(&cfg, &data);
    assert_eq!(out.code, 125, "{}", out.dump());
    assert!(
        out.stderr.contains("task `py_image`")
            && out.stderr.contains(&digest)
            && out.stderr.contains("changed")
            && out.stderr.contains(MARKER),
        "{}",
        out.dump()
    );
}

/// Imports a directory holding one file `name` (a plain root file system); returns its digest.
fn import_tiny(d: &Path, store: &Path, name: &str) -> String {
    let dir = d.join(format!("tiny-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), name).unwrap();
    import_path(store, &dir)
}

fn stored(store: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(store.join("images"))
        .unwrap()
        .map(|e| format!("sha256:{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    v.sort();
    v
}

#[test]
fn gc_keeps_named_and_recently_used_images_and_removes_the_rest() {
    let d = common::tmp();
    let data = d.path().join("data");
    let store = data.join("images");
    let named = import(&store);
    let old = import_tiny(d.path(), &store, "old");
    let fresh = import_tiny(d.path(), &store, "fresh");
    // A run on `used` (the python rootfs imported as a plain directory) stamps it used now.
    let used = import_path(
        &store,
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("image-tasks/build/rootfs"),
    );
    let m = d.path().join("m.yaml");
    std::fs::write(
        &m,
        format!("image: {used}\ncommand: [\"{PY}\", \"-c\", \"print('ran')\"]\n"),
    )
    .unwrap();
    let r = agentjail(&[
        "run",
        "--manifest",
        m.to_str().unwrap(),
        "--image-store",
        store.to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.dump());
    // `old` was last used ten days ago.
    let hex = old.strip_prefix("sha256:").unwrap();
    let ten_days_ago = jiff::Timestamp::now()
        .checked_sub(jiff::SignedDuration::from_hours(240))
        .unwrap();
    std::fs::write(
        store.join("images").join(hex).join("used"),
        ten_days_ago.to_string(),
    )
    .unwrap();
    let cfg = config(
        d.path(),
        &named,
        &format!("data_dir = {:?}", data.to_str().unwrap()),
    );
    let cfg_s = cfg.to_str().unwrap();

    // ls: sizes, bases, ages, last use.
    let ls = agentjail(&["image", "ls", "--store", store.to_str().unwrap()]);
    assert_eq!(ls.code, 0, "{}", ls.dump());
    let line = |dg: &str| -> String {
        ls.stdout
            .lines()
            .find(|l| l.starts_with(dg))
            .unwrap_or_else(|| panic!("{dg} not listed: {}", ls.stdout))
            .to_string()
    };
    assert!(
        line(&named).contains("MiB") && line(&named).contains("base unknown"),
        "{}",
        ls.stdout
    );
    assert!(line(&old).contains("10d ago"), "{}", ls.stdout);
    assert!(line(&fresh).contains("never"), "{}", ls.stdout);
    let lsj = agentjail(&["image", "ls", "--json", "--store", store.to_str().unwrap()]);
    let v: Value = serde_json::from_str(&lsj.stdout).unwrap();
    let rec = |dg: &str| {
        v.as_array()
            .unwrap()
            .iter()
            .find(|r| r["digest"] == dg)
            .unwrap()
            .clone()
    };
    assert!(rec(&used)["last_used"].is_string(), "{v:#}");
    assert!(rec(&fresh)["last_used"].is_null(), "{v:#}");
    assert!(rec(&named)["age_seconds"].as_u64().unwrap() < 3600, "{v:#}");

    // Dry run: says what it would remove, removes nothing.
    let before = stored(&store);
    let g = agentjail(&[
        "image",
        "gc",
        "--config",
        cfg_s,
        "--keep-days",
        "1",
        "--dry-run",
    ]);
    assert_eq!(g.code, 0, "{}", g.dump());
    assert_eq!(
        g.stdout.trim(),
        format!("would remove {old} (rootfs-dir, 3 B, last used 10d ago)"),
        "{}",
        g.dump()
    );
    assert_eq!(stored(&store), before);

    // For real, the store taken from the configuration (DATA/images).
    let g = agentjail(&["image", "gc", "--config", cfg_s, "--keep-days", "1"]);
    assert_eq!(g.code, 0, "{}", g.dump());
    assert!(g.stdout.contains(&format!("removed {old}")), "{}", g.dump());
    let left = stored(&store);
    assert!(!left.contains(&old), "{left:?}");
    for k in [&named, &fresh, &used] {
        assert!(left.contains(k), "{k} was removed: {}", g.dump());
    }

    // No window: only what a task names stays.
    let g = agentjail(&["image", "gc", "--config", cfg_s, "--keep-days", "0"]);
    assert_eq!(g.code, 0, "{}", g.dump());
    assert_eq!(stored(&store), vec![named.clone()], "{}", g.dump());
    // And the service still starts on it.
    drop(Serve::start(&cfg, &data, &[]));
}
