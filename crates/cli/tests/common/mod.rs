//! Helpers shared by the integration tests that run the `agentjail` binary and look at its
//! exit code and output.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

/// Each test of `names` (a `fn(Env)` of the calling test file) on SQLite (its `start()`) and on
/// PostgreSQL (its `start_pg()`; None: PostgreSQL is missing, see [`skip`]), as the modules
/// `on_sqlite` and `on_postgresql` of that file.
#[allow(unused_macros)]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite {
            $(#[test] fn $name() { super::$name(super::start()) })*
        }
        mod on_postgresql {
            $(#[test] fn $name() {
                if let Some(e) = super::start_pg() { super::$name(e) }
            })*
        }
    };
}

pub mod netns;
pub mod pg;
pub mod pyimage;
pub mod pyindex;
pub mod serve;
mod skip;
#[allow(unused_imports)]
pub use skip::skip;

/// What one invocation of the binary produced.
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// Everything, for an assertion message.
    pub fn dump(&self) -> String {
        format!(
            "exit {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `agentjail ARGS` with the caller's data-directory and image-store settings removed, so
/// a developer's own key or store cannot leak into a test.
pub fn agentjail<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Out {
    let o = Command::new(bin())
        .args(args)
        .env_remove("XDG_DATA_HOME")
        .env_remove("AGENTJAIL_IMAGE_STORE")
        .output()
        .expect("run agentjail");
    Out::from(o)
}

impl From<std::process::Output> for Out {
    fn from(o: std::process::Output) -> Out {
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// The binary under test: this build's `agentjail`, or the build that `AGENTJAIL_TEST_BIN`
/// names (an absolute path; `.ci/run` runs the CLI's tests again against the musl build).
pub fn bin() -> std::path::PathBuf {
    match std::env::var_os("AGENTJAIL_TEST_BIN") {
        Some(p) => {
            let p = std::path::PathBuf::from(p);
            assert!(
                p.is_absolute() && p.is_file(),
                "AGENTJAIL_TEST_BIN={} is not an absolute path to a file",
                p.display()
            );
            p
        }
        None => std::path::PathBuf::from(env!("CARGO_BIN_EXE_agentjail")),
    }
}

/// [`bin`] as a string, for argument lists.
pub fn bin_str() -> String {
    bin().to_str().expect("a UTF-8 path").to_owned()
}

/// A world-readable temporary folder (the sandbox user is an unprivileged host uid), removed
/// when dropped.
pub fn tmp() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::Builder::new()
        .prefix("agentjail-test-")
        .tempdir()
        .expect("create a temporary folder");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755))
        .expect("make the temporary folder world-readable");
    d
}

/// Whether this test process runs as root (its effective uid, read from /proc: no libc or
/// unsafe in the tests).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// `agentjail` run as uid and gid 65534 with no supplementary groups (`setpriv`, util-linux):
/// the ordinary user of the unprivileged tests.
pub fn as_nobody() -> std::process::Command {
    nobody_running(bin())
}

/// `program` run as uid and gid 65534 with no supplementary groups (`setpriv`, util-linux).
pub fn nobody_running(program: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
    let mut c = std::process::Command::new("setpriv");
    c.args([
        "--reuid",
        "65534",
        "--regid",
        "65534",
        "--clear-groups",
        "--",
    ])
    .arg(program);
    c
}

/// The payload processes of the `sleeper` task carrying `marker`.
pub fn payloads(marker: &str) -> Vec<i32> {
    payload_cmdlines(marker)
        .into_iter()
        .map(|(p, _)| p)
        .collect()
}

/// The payload processes of the `sleeper` task carrying `marker`, with their command lines
/// (which hold the run's argument). Every test host is a network namespace of this machine's
/// one pid namespace, so this sees every host's processes.
pub fn payload_cmdlines(marker: &str) -> Vec<(i32, String)> {
    cmdlines(|c| c.starts_with("/usr/bin/python3") && c.contains(marker))
}

/// The processes (of this machine's one pid namespace) whose command line, its arguments
/// joined by spaces, satisfies `pick`, with that line.
pub fn cmdlines(pick: impl Fn(&str) -> bool) -> Vec<(i32, String)> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        if pick(&cmdline) {
            found.push((pid, cmdline));
        }
    }
    found
}

/// Waits up to `secs` seconds until exactly `n` payload processes of `marker` exist.
pub fn wait_payloads(marker: &str, n: usize, secs: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while payloads(marker).len() != n {
        assert!(
            std::time::Instant::now() < deadline,
            "expected {n} payload process(es) of {marker}, found {:?}",
            payloads(marker)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Runs a client scenario (`cmd`: a Python or Node script of the tests) and returns the JSON
/// object of its last `RESULT {…}` line; fails, with both streams, when it fails or prints none.
pub fn result_of(mut cmd: std::process::Command, what: &str) -> serde_json::Value {
    let out = cmd.output().expect("the scenario starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{what} failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("{what}: no RESULT line\n{stdout}\n{stderr}"));
    serde_json::from_str(line).expect("the RESULT line is JSON")
}
