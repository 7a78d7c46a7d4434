//! The Python client (`clients/python`, the `agentjail` package; issue #35) against a real
//! `agentjail serve` (SQLite) that this test starts: its pytest suite (`clients/python/tests`:
//! upload and the csv-summary example, a failing import as a typed result, a denial, execute-
//! once, live events with resume across a dropped connection, cancel, pagination, typed
//! errors, 429 and its retry (on a second service with one run slot), offline receipt
//! verification, the async client, sessions and cells with their receipt chain, the smolagents
//! executor driven by a scripted `CodeAgent`, the LangChain tool in a LangGraph graph driven by
//! a scripted chat model, the OpenAI Agents SDK tool driven by a scripted `Model`, and the generated models against this server's
//! `/openapi.json`), the ```` ```python ```` blocks of docs/client-python.md run in order, `mypy --strict` on the package, and packaging: `python3 -m build` makes a wheel and
//! an sdist, and the wheel installs into a fresh venv (no system site-packages) where
//! `import agentjail` works. The suite runs twice: on SQLite, and on PostgreSQL (a throwaway
//! cluster, as tests/postgres.rs starts one, where sessions work as on SQLite). Needs python3 with httpx, pytest, mypy, build and cryptography
//! (`.ci/run` installs them) and, for the venv, the package registry or pip's cache. Without
//! them the tests print SKIP and pass; under CI (`CI` set) they fail. The frameworks
//! (smolagents, langchain-core and langgraph, openai-agents; pinned by `.ci/run`) are needed
//! under CI; elsewhere, without one, its test and guide blocks are left out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::serve::{
    Serve, actor, csv_input, example_schema, json_output, python_code_task, summarize_csv_task,
    write_config,
};
use common::skip;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const ALICE: &str = "tok-alice-pyclient-8c31d2";
const OPS: &str = "tok-ops-pyclient-5e07b9";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn client_dir() -> PathBuf {
    repo().join("clients/python")
}

/// The Python modules of `needed` that `python3` cannot import.
fn missing_modules(needed: &[&str]) -> Vec<String> {
    needed
        .iter()
        .filter(|m| {
            !Command::new("python3")
                .args(["-c", &format!("import {m}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(|m| m.to_string())
        .collect()
}

/// False (after `skip`) when a module is missing.
fn have(needed: &[&str]) -> bool {
    let missing = missing_modules(needed);
    if missing.is_empty() {
        return true;
    }
    skip(&format!(
        "python3 cannot import {} (.ci/run installs them with pip)",
        missing.join(", ")
    ));
    false
}

/// `[tasks.agent]`: what an agent framework's executor runs its steps in (the smolagents
/// executor's test, and the sessions' tests): model-proposed Python with one CSV input at
/// `/input/data.csv`, an `o.json` output of at most 100 kB with no schema (the executor writes
/// the step's result there), and sessions of at most 50 cells and 8 MiB of `/work`.
fn agent_task() -> String {
    agent_task_named("agent", "")
}

/// `[tasks.agent_live]`: the same, with live sessions (a resident Python interpreter).
fn agent_live_task() -> String {
    agent_task_named("agent_live", "interpreter = \"python\"\n")
}

fn agent_task_named(name: &str, session: &str) -> String {
    format!(
        "\n[tasks.{name}]\ndescription = \"An agent's Python steps over one CSV\"\ncode = \"allowed\"\n\
         command = [\"/usr/bin/python3\", \"/input/code.py\"]\nallowed_tenants = [\"acme\"]\n\
         {}{}[tasks.{name}.limits]\nseconds = 60\n[tasks.{name}.session]\nmax_cells = 50\nmax_mb = 8\n{session}",
        csv_input(name, 100_000),
        json_output(name, "o.json", 100_000),
    )
}

/// The service's configuration; `server` is its `[server]` table's lines.
fn config(server: &str) -> String {
    format!(
        "[server]\n{server}\n[tenants.acme]\n{alice}{ops}{summarize}{py}{agent}",
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
        agent = agent_task()
            + &agent_live_task()
            + &python_code_task(
                "tiny",
                "Two cells a session",
                "allowed_tenants = [\"acme\"]",
                30
            )
            + "[tasks.tiny.session]\nmax_cells = 2\n",
    )
}

fn dump(what: &str, o: &Output) -> String {
    format!(
        "{what}: {}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The services the suite runs against, and what the Python side needs to reach them.
struct Env {
    _primary: Box<dyn std::any::Any>,
    _busy: Serve,
    vars: Vec<(String, String)>,
}

/// The environment of the suite against the service at `base` whose data folder is `data`
/// (`primary`: what keeps it running), with a second, SQLite service of one run slot and no
/// queue (429 while a run runs) for the rate-limit test.
fn env(dir: &Path, primary: Box<dyn std::any::Any>, base: &str, data: &Path, store: &str) -> Env {
    let busy_dir = dir.join("busy");
    std::fs::create_dir_all(&busy_dir).unwrap();
    let busy_cfg = write_config(
        &busy_dir,
        &config("max_concurrent_runs = 1\nmax_queued_runs = 0"),
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
    let vars = vec![
        ("AGENTJAIL_URL".into(), base.to_string()),
        ("AGENTJAIL_TOKEN".into(), ALICE.into()),
        ("AGENTJAIL_OPS_TOKEN".into(), OPS.into()),
        ("AGENTJAIL_PUBKEY".into(), pubkey.to_str().unwrap().into()),
        (
            "AGENTJAIL_EXAMPLE".into(),
            repo().join("examples/csv-summary").to_str().unwrap().into(),
        ),
        ("AGENTJAIL_VERSION".into(), env!("CARGO_PKG_VERSION").into()),
        ("AGENTJAIL_BIN".into(), common::bin_str()),
        ("AGENTJAIL_BUSY_URL".into(), busy.base.clone()),
        // `sqlite` or `postgres`.
        ("AGENTJAIL_STORE".into(), store.into()),
        (
            "PYTHONPATH".into(),
            client_dir().join("src").to_str().unwrap().into(),
        ),
        ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
    ];
    Env {
        _primary: primary,
        _busy: busy,
        vars,
    }
}

/// An agent framework the client integrates with (`agentjail.integrations`): the modules
/// `python3` must import for its test, that test's file, and the text that marks the guide's
/// blocks that use it.
struct Framework {
    modules: &'static [&'static str],
    test: &'static str,
    marker: &'static str,
}

/// The frameworks, each pinned by `.ci/run`.
const FRAMEWORKS: &[Framework] = &[
    Framework {
        modules: &["smolagents"],
        test: "tests/test_smolagents.py",
        marker: "smolagents",
    },
    Framework {
        modules: &["langchain_core", "langgraph"],
        test: "tests/test_langchain.py",
        marker: "agentjail.integrations.langchain",
    },
    Framework {
        modules: &["agents"],
        test: "tests/test_openai_agents.py",
        marker: "agentjail.integrations.openai_agents",
    },
];

/// The frameworks `python3` cannot import (their test and guide blocks are left out). Under
/// CI every one must import (`.ci/run` pins them): a missing one fails the test.
fn missing_frameworks() -> Vec<&'static Framework> {
    let missing: Vec<&Framework> = FRAMEWORKS
        .iter()
        .filter(|f| !missing_modules(f.modules).is_empty())
        .collect();
    for f in &missing {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 cannot import {} under CI (.ci/run installs it)",
            f.modules.join(", ")
        );
        skip(&format!(
            "python3 cannot import {}: {} and its guide blocks are left out",
            f.modules.join(", "),
            f.test
        ));
    }
    missing
}

/// Runs the client's pytest suite in `env`; every test must run and pass.
fn pytest(env: &Env, dir: &Path) {
    let mut args = vec!["-m", "pytest", "-q", "-p", "no:cacheprovider", "-ra"];
    let ignored: Vec<String> = missing_frameworks()
        .iter()
        .map(|f| format!("--ignore={}", f.test))
        .collect();
    args.extend(ignored.iter().map(String::as_str));
    args.push("tests");
    let out = Command::new("python3")
        .args(&args)
        .current_dir(client_dir())
        .envs(env.vars.iter().map(|(k, v)| (k, v)))
        .env("TMPDIR", dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    println!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(out.status.success(), "{}", dump("pytest", &out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("skipped"), "a client test skipped: {text}");
}

#[test]
fn the_python_client_passes_its_tests_against_a_real_service() {
    if !have(&["httpx", "pytest", "cryptography"]) {
        return;
    }
    let dir = common::tmp();
    let cfg = write_config(dir.path(), &config(""));
    let data = dir.path().join("data");
    let serve = Serve::start(&cfg, &data, &[]);
    let base = serve.base.clone();
    let env = env(dir.path(), Box::new(serve), &base, &data, "sqlite");
    pytest(&env, dir.path());

    // The guide's Python blocks, in order, as one program, from the checkout's folder.
    let page = std::fs::read_to_string(repo().join("docs/client-python.md")).unwrap();
    let left_out: Vec<&str> = missing_frameworks().iter().map(|f| f.marker).collect();
    let code = python_blocks(&page, &left_out);
    assert!(
        code.contains("agentjail.Client"),
        "no quick start in the guide"
    );
    let out = Command::new("python3")
        .args(["-c", &code])
        .current_dir(repo())
        .envs(env.vars.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        dump("docs/client-python.md", &out)
    );
}

/// The same suite against the PostgreSQL topology: `serve` on a throwaway cluster (runs,
/// their output, denials and events go through the database).
#[test]
fn the_python_client_passes_its_tests_on_postgres() {
    if !have(&["httpx", "pytest", "cryptography"]) {
        return;
    }
    let Some(pg) = common::pg::Pg::start() else {
        return;
    };
    let dir = common::tmp();
    let node_dir = dir.path().join("node");
    let (node, base) =
        common::pg::Node::serve(&node_dir, &pg.url(), &config("node_id = \"pyclient-a\""));
    let env = env(
        dir.path(),
        Box::new((node, pg)),
        &base,
        &node_dir.join("data"),
        "postgres",
    );
    pytest(&env, dir.path());
}

/// The ```` ```python ```` blocks of a Markdown page, joined, but for those that contain one
/// of `left_out` (a framework `python3` cannot import).
fn python_blocks(md: &str, left_out: &[&str]) -> String {
    let mut code = String::new();
    let mut block = String::new();
    let mut inside = false;
    for line in md.lines() {
        if inside && line.trim_start().starts_with("```") {
            inside = false;
            if !left_out.iter().any(|m| block.contains(m)) {
                code.push_str(&block);
            }
            block.clear();
        } else if inside {
            block.push_str(line);
            block.push('\n');
        } else if line.trim() == "```python" {
            inside = true;
        }
    }
    code
}

#[test]
fn the_python_client_is_mypy_strict_clean() {
    if !have(&["mypy", "httpx", "cryptography"]) {
        return;
    }
    let out = Command::new("python3")
        .args([
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "src/agentjail",
        ])
        .current_dir(client_dir())
        .env("MYPY_CACHE_DIR", "/dev/null")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", dump("mypy --strict", &out));
}

/// The API reference is generated from the docstrings (pdoc, `docs/client-python.md`
/// "Reference"), and every public class, function, method and property of the package and
/// its integrations has one: a name without a docstring fails here.
#[test]
fn the_python_reference_is_generated_from_docstrings_that_cover_the_api() {
    if !have(&["pdoc", "httpx", "cryptography"]) {
        return;
    }
    let script = r#"
import importlib, inspect, pkgutil, sys
import agentjail
mods = [agentjail] + [importlib.import_module(m.name)
        for m in pkgutil.walk_packages(agentjail.__path__, "agentjail.")
        if not m.name.rsplit(".", 1)[-1].startswith("_")]
missing, checked = [], 0
for mod in mods:
    names = getattr(mod, "__all__", None) or [
        n for n in dir(mod)
        if not n.startswith("_") and getattr(getattr(mod, n), "__module__", None) == mod.__name__]
    for n in names:
        o = getattr(mod, n)
        if not (inspect.isclass(o) or inspect.isfunction(o)):
            continue
        checked += 1
        if not (o.__doc__ or "").strip():
            missing.append(f"{mod.__name__}.{n}")
        if inspect.isclass(o):
            for mn, m in vars(o).items():
                f = m.fget if isinstance(m, property) else m
                if isinstance(f, (staticmethod, classmethod)):
                    f = f.__func__
                if mn.startswith("_") or not inspect.isfunction(f):
                    continue
                checked += 1
                if not (f.__doc__ or "").strip():
                    missing.append(f"{mod.__name__}.{n}.{mn}")
print(checked, "names checked")
if missing or checked < 100:
    sys.exit("without a docstring: " + ", ".join(missing))
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .env("PYTHONPATH", client_dir().join("src"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", dump("docstring coverage", &out));
    let d = tempfile::tempdir().unwrap();
    let out = Command::new("python3")
        .args(["-m", "pdoc", "--docformat", "restructuredtext", "-o"])
        .arg(d.path())
        .args(["agentjail", "agentjail.integrations"])
        .env("PYTHONPATH", client_dir().join("src"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", dump("pdoc", &out));
    let page = std::fs::read_to_string(d.path().join("agentjail.html")).unwrap();
    for name in ["Client", "AsyncClient", "verify", "Session"] {
        assert!(page.contains(name), "the reference lacks {name}");
    }
}

#[test]
fn the_python_client_builds_a_wheel_and_an_sdist_that_install() {
    if !have(&["build", "venv"]) {
        return;
    }
    // Its version is the service's.
    let pyproject = std::fs::read_to_string(client_dir().join("pyproject.toml")).unwrap();
    let version = format!("version = \"{}\"", env!("CARGO_PKG_VERSION"));
    assert!(
        pyproject.contains(&version),
        "pyproject.toml lacks {version}"
    );
    let init = std::fs::read_to_string(client_dir().join("src/agentjail/__init__.py")).unwrap();
    assert!(init.contains(&format!("__version__ = \"{}\"", env!("CARGO_PKG_VERSION"))));

    let dir = common::tmp();
    let dist = dir.path().join("dist");
    // A copy of the client's folder: the build writes nothing into the checkout.
    let src = dir.path().join("python");
    copy_dir(&client_dir(), &src);
    let out = Command::new("python3")
        .args(["-m", "build", "--outdir"])
        .arg(&dist)
        .arg(&src)
        .env("TMPDIR", dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", dump("python3 -m build", &out));
    let names: Vec<String> = std::fs::read_dir(&dist)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let wheel = names
        .iter()
        .find(|n| n.ends_with("-py3-none-any.whl"))
        .unwrap_or_else(|| panic!("no wheel in {names:?}"));
    assert!(
        names.iter().any(|n| n.ends_with(".tar.gz")),
        "no sdist in {names:?}"
    );

    let venv = dir.path().join("venv");
    let out = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", dump("python3 -m venv", &out));
    let out = Command::new(venv.join("bin/python"))
        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
        .arg(dist.join(wheel))
        .env("TMPDIR", dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        dump("pip install the wheel", &out)
    );
    // Imported from the venv (not the checkout, not the system's site-packages), typed.
    let out = Command::new(venv.join("bin/python"))
        .args([
            "-c",
            "import sys, os, agentjail, agentjail.models\n\
             assert not sys.flags.no_site\n\
             assert agentjail.__file__.startswith(sys.prefix), agentjail.__file__\n\
             assert os.path.exists(os.path.join(os.path.dirname(agentjail.__file__), 'py.typed'))\n\
             print(agentjail.__version__, agentjail.Client, agentjail.AsyncClient, agentjail.verify)",
        ])
        .current_dir(dir.path())
        .env_remove("PYTHONPATH")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", dump("import agentjail", &out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with(env!("CARGO_PKG_VERSION")));
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        let n = name.to_string_lossy();
        if n == "__pycache__" || n == ".mypy_cache" || n == "dist" || n.ends_with(".egg-info") {
            continue;
        }
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(&name));
        } else {
            std::fs::copy(e.path(), to.join(&name)).unwrap();
        }
    }
}
