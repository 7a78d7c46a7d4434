//! The TypeScript client (`clients/typescript`, the `agentjail` npm package; issue #35) against
//! a real `agentjail serve` (SQLite, and once on PostgreSQL) that this test starts: `npm run build` (tsc, strict), then
//! its `node --test` suite (`clients/typescript/test`: the csv-summary example with offline
//! receipt verification, a failing run as a typed result, execute-once, cancel, pagination,
//! typed errors, 429 and its retry after `Retry-After` (on a second service of one run slot),
//! live events with resume by `Last-Event-ID` and across connections a loopback
//! proxy cuts, the one-request submit-and-follow, sessions and their receipt chain, and the
//! committed `src/models.ts` against what the pinned openapi-typescript makes of this
//! service's `/openapi.json`), the ```` ```js ```` blocks of docs/client-typescript.md run in
//! order as one module, and packaging: `npm pack` makes a tarball that installs offline into a
//! fresh folder (no runtime dependencies) where `import('agentjail')` works and a strict
//! TypeScript consumer (`test/consumer.ts`) type-checks. Needs `node` ≥ 20
//! and `npm`, and `clients/typescript/node_modules` (`npm ci`, which `.ci/run` runs: this test
//! fetches nothing). Without them the tests print SKIP and pass; under CI (`CI` set) they fail.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::serve::{
    Serve, actor, example_schema, python_code_task, summarize_csv_task, write_config,
};
use common::skip;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;

const ALICE: &str = "tok-alice-tsclient-4b9e17";
const OPS: &str = "tok-ops-tsclient-a2c640";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn client_dir() -> PathBuf {
    repo().join("clients/typescript")
}

fn dump(what: &str, o: &Output) -> String {
    format!(
        "{what}: {}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// False (after `skip`, which fails under CI) when node, npm or the client's dev dependencies
/// are missing.
fn ready() -> bool {
    for tool in ["node", "npm"] {
        let ok = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            skip(&format!(
                "no `{tool}` on PATH (.ci/run installs npm with apt)"
            ));
            return false;
        }
    }
    if !client_dir().join("node_modules/.bin/tsc").exists() {
        skip(
            "clients/typescript/node_modules is missing: run `(cd clients/typescript && npm ci \
             --prefer-offline --no-audit --no-fund)` (.ci/run does)",
        );
        return false;
    }
    true
}

/// `npm run build` once for every test of this file (they run in parallel threads).
fn build() {
    static BUILT: Mutex<bool> = Mutex::new(false);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if *built {
        return;
    }
    let out = Command::new("npm")
        .args(["run", "build", "--silent"])
        .current_dir(client_dir())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", dump("npm run build", &out));
    *built = true;
}

/// The service's configuration: tenant `acme`, actors `alice` and `ops` (an operator), the
/// seed's `summarize_csv`, `py` (model-proposed Python, an `o.json` output, 60 s) and
/// `py_live` (the same in live sessions: a resident interpreter).
fn config() -> String {
    format!(
        "[server]\n\n[tenants.acme]\n{alice}{ops}{summarize}{py}{py_live}[tasks.py_live.session]\ninterpreter = \"python\"\n",
        alice = actor("alice", "acme", ALICE, false),
        ops = actor("ops", "acme", OPS, true),
        summarize = summarize_csv_task(
            "allowed_tenants = [\"acme\"]\nenv = { LANG = \"C.UTF-8\" }",
            100_000,
            &example_schema(),
            "seconds = 30",
        ),
        py = python_code_task(
            "py",
            "Model-proposed Python",
            "allowed_tenants = [\"acme\"]",
            60
        ),
        py_live = python_code_task(
            "py_live",
            "Model-proposed Python in live sessions",
            "allowed_tenants = [\"acme\"]",
            60
        ),
    )
}

/// The API reference is generated from the TSDoc comments (`npm run docs`: TypeDoc,
/// `clients/typescript/typedoc.json`) with warnings as errors: every exported class,
/// function, method, accessor, interface, type and constant of the hand-written modules has a
/// comment (the generated `models.ts` carries the OpenAPI document's descriptions).
#[test]
fn the_typescript_reference_is_generated_from_comments_that_cover_the_api() {
    if !ready() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let out = Command::new("npm")
        .args(["run", "-s", "docs", "--", "--out"])
        .arg(d.path())
        .current_dir(client_dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", dump("npm run docs", &out));
    for page in [
        "index.html",
        "classes/index.Client.html",
        "classes/index.Session.html",
    ] {
        assert!(d.path().join(page).is_file(), "the reference lacks {page}");
    }
}

#[test]
fn the_typescript_client_passes_its_tests_against_a_real_service() {
    if !ready() {
        return;
    }
    build();
    let dir = common::tmp();
    let cfg = write_config(dir.path(), &config());
    let data = dir.path().join("data");
    let serve = Serve::start(&cfg, &data, &[]);
    let vars = suite(dir.path(), &serve.base, &data, "sqlite");
    guide(dir.path(), &vars);
}

/// The same suite against the PostgreSQL topology: `serve` on a throwaway cluster (runs,
/// their output, denials, events, sessions and their checkpoints go through the database).
#[test]
fn the_typescript_client_passes_its_tests_on_postgres() {
    if !ready() {
        return;
    }
    let Some(pg) = common::pg::Pg::start() else {
        return;
    };
    build();
    let dir = common::tmp();
    let node_dir = dir.path().join("node");
    let (_node, base) = common::pg::Node::serve(
        &node_dir,
        &pg.url(),
        &config().replacen("[server]\n", "[server]\nnode_id = \"tsclient-a\"\n", 1),
    );
    suite(dir.path(), &base, &node_dir.join("data"), "postgres");
}

/// Runs the `node --test` suite against the service at `base` whose data folder is `data`
/// (`store`: `sqlite` or `postgres`, for the session tests), with a second, SQLite service of
/// one run slot (429); returns the suite's environment.
fn suite(dir: &Path, base: &str, data: &Path, store: &str) -> Vec<(&'static str, String)> {
    // A second service of one run slot and no queue: 429 while a run runs.
    let busy_dir = dir.join("busy");
    std::fs::create_dir_all(&busy_dir).unwrap();
    let busy_cfg = write_config(
        &busy_dir,
        &config().replacen(
            "[server]\n",
            "[server]\nmax_concurrent_runs = 1\nmax_queued_runs = 0\n",
            1,
        ),
    );
    let busy = Serve::start(&busy_cfg, &busy_dir.join("data"), &[]);
    let out = common::agentjail(&[
        "receipt",
        "pubkey",
        "--key",
        data.join("private/receipt-key.pem").to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{}", out.dump());
    let pubkey = dir.join("pubkey.pem");
    std::fs::write(&pubkey, &out.stdout).unwrap();
    let vars: Vec<(&'static str, String)> = vec![
        ("AGENTJAIL_URL", base.to_string()),
        ("AGENTJAIL_TOKEN", ALICE.into()),
        ("AGENTJAIL_OPS_TOKEN", OPS.into()),
        ("AGENTJAIL_PUBKEY", pubkey.to_str().unwrap().into()),
        (
            "AGENTJAIL_EXAMPLE",
            repo().join("examples/csv-summary").to_str().unwrap().into(),
        ),
        ("AGENTJAIL_BIN", common::bin_str()),
        ("AGENTJAIL_BUSY_URL", busy.base.clone()),
        ("TMPDIR", dir.to_str().unwrap().into()),
        ("AGENTJAIL_STORE", store.into()),
    ];

    // The suite: every test file, every test run and passed (none skipped).
    let mut files: Vec<PathBuf> = std::fs::read_dir(client_dir().join("test"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".test.mjs"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "test files: {files:?}");
    let out = Command::new("node")
        .arg("--test")
        .args(&files)
        .current_dir(client_dir())
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success(), "{}", dump("node --test", &out));
    assert!(text.contains("# fail 0"), "{text}");
    assert!(
        text.contains("# skipped 0"),
        "a client test skipped: {text}"
    );
    // The busy service is stopped here; the suite is done with it.
    drop(busy);
    vars
}

/// The guide's JavaScript blocks, run against the suite's service (`vars`).
fn guide(dir: &Path, vars: &[(&str, String)]) {
    // The guide's JavaScript blocks, in order, as one module importing the package by its
    // name (a `node_modules/agentjail` link to the client), from the checkout's folder.
    let page = std::fs::read_to_string(repo().join("docs/client-typescript.md")).unwrap();
    let code = js_blocks(&page);
    assert!(code.contains("new Client("), "no quick start in the guide");
    let guide = dir.join("guide");
    std::fs::create_dir_all(guide.join("node_modules")).unwrap();
    std::os::unix::fs::symlink(client_dir(), guide.join("node_modules/agentjail")).unwrap();
    std::fs::write(guide.join("guide.mjs"), &code).unwrap();
    let out = Command::new("node")
        .arg(guide.join("guide.mjs"))
        .current_dir(repo())
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        dump("docs/client-typescript.md", &out)
    );
}

/// The ```` ```js ```` blocks of a Markdown page, joined.
fn js_blocks(md: &str) -> String {
    let mut code = String::new();
    let mut inside = false;
    for line in md.lines() {
        if inside && line.trim_start().starts_with("```") {
            inside = false;
        } else if inside {
            code.push_str(line);
            code.push('\n');
        } else if line.trim() == "```js" {
            inside = true;
        }
    }
    code
}

#[test]
fn the_typescript_client_packs_into_a_tarball_that_installs_offline() {
    if !ready() {
        return;
    }
    // Its version is the service's.
    let manifest = std::fs::read_to_string(client_dir().join("package.json")).unwrap();
    let version = format!("\"version\": \"{}\"", env!("CARGO_PKG_VERSION"));
    assert!(manifest.contains(&version), "package.json lacks {version}");
    let index = std::fs::read_to_string(client_dir().join("src/index.ts")).unwrap();
    assert!(index.contains(&format!(
        "export const VERSION = \"{}\"",
        env!("CARGO_PKG_VERSION")
    )));
    build();
    let dir = common::tmp();
    let out = Command::new("npm")
        .args(["pack", "--silent", "--pack-destination"])
        .arg(dir.path())
        .current_dir(client_dir())
        .env("TMPDIR", dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", dump("npm pack", &out));
    let tarball = dir.path().join(String::from_utf8_lossy(&out.stdout).trim());
    assert!(tarball.is_file(), "{}", dump("npm pack", &out));

    // A fresh folder, offline: no runtime dependency, so no registry needed.
    let app = dir.path().join("app");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(
        app.join("package.json"),
        "{\"name\": \"app\", \"private\": true, \"type\": \"module\"}\n",
    )
    .unwrap();
    let out = Command::new("npm")
        .args([
            "install",
            "--offline",
            "--no-audit",
            "--no-fund",
            "--ignore-scripts",
        ])
        .arg(&tarball)
        .current_dir(&app)
        .env("TMPDIR", dir.path())
        .env("npm_config_cache", dir.path().join("npm-cache"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        dump("npm install TARBALL", &out)
    );
    let out = Command::new("node")
        .args([
            "--input-type=module",
            "-e",
            "const aj = await import('agentjail');\n\
             const node = await import('agentjail/node');\n\
             const url = await import.meta.resolve('agentjail');\n\
             if (!url.includes('/app/node_modules/agentjail/')) throw new Error(url);\n\
             if (typeof aj.Client !== 'function' || typeof aj.verify !== 'function' || typeof node.file !== 'function') throw new Error('exports');\n\
             console.log(aj.VERSION, url);",
        ])
        .current_dir(&app)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        dump("import('agentjail')", &out)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with(env!("CARGO_PKG_VERSION")));

    // Its types, as a strict TypeScript consumer of the installed package sees them
    // (test/consumer.ts: `await using` a session, typed records and events, typed errors).
    std::fs::copy(
        client_dir().join("test/consumer.ts"),
        app.join("consumer.ts"),
    )
    .unwrap();
    let out = Command::new(client_dir().join("node_modules/.bin/tsc"))
        .args([
            "--noEmit",
            "--strict",
            "--module",
            "nodenext",
            "--moduleResolution",
            "nodenext",
            "--target",
            "es2022",
            "--lib",
            "es2022,dom,esnext.disposable",
            "consumer.ts",
        ])
        .current_dir(&app)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", dump("tsc consumer.ts", &out));
}
