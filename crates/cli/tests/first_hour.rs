//! Failures explain themselves, on stderr, in one line (issue 17): the real `agentjail` binary
//! is driven into each failure a new user meets in the first hour, and the line it prints must
//! name the cause and the fix.
//!
//! Sentinels: a command that must not start prints `COMMAND-RAN` first, so "refused by
//! agentjail before the run" cannot be confused with "started and failed"; a command that must
//! run prints it too. Tests that need an ordinary user drop to uid 65534 with `setpriv` (as
//! root); without root or setpriv they fail under CI and print `SKIP` otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::serve::Serve;
use common::{bin, is_root, skip, tmp};

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn dump(&self) -> String {
        format!(
            "exit {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs the binary in `dir`, as uid 65534 when `nobody` (through setpriv), with `HOME` in
/// `dir` and the caller's data settings removed.
fn agentjail(dir: &Path, nobody: bool, args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut c = if nobody {
        common::as_nobody()
    } else {
        Command::new(bin())
    };
    c.args(args)
        .current_dir(dir)
        .env("HOME", dir)
        .env_remove("XDG_DATA_HOME")
        .env_remove("AGENTJAIL_IMAGE_STORE")
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn have_setpriv() -> bool {
    Command::new("setpriv")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// A folder uid 65534 may write (its HOME, its report).
fn nobody_dir() -> tempfile::TempDir {
    let d = tmp();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}

#[test]
fn rejected_output_prints_the_first_schema_error_and_how_many_more() {
    let d = tmp();
    let schema = d.path().join("summary.schema.json");
    std::fs::write(
        &schema,
        r#"{"type":"object","properties":{"rows":{"type":"integer"},"sum":{"type":"number"},"title":{"type":"string"}}}"#,
    )
    .unwrap();
    let o = agentjail(
        d.path(),
        false,
        &[
            "run",
            "--output",
            "/output/summary.json",
            "--output-schema",
            schema.to_str().unwrap(),
            "--report",
            "report.json",
            "--",
            "/usr/bin/python3",
            "-c",
            "import json; print('COMMAND-RAN'); json.dump({'rows': '8', 'sum': 'x', 'title': 3}, open('/output/summary.json', 'w'))",
        ],
        &[],
    );
    assert_eq!(o.code, 65, "{}", o.dump());
    assert!(o.stdout.contains("COMMAND-RAN"), "{}", o.dump());
    let lines: Vec<&str> = o.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {}", o.dump());
    assert!(
        lines[0].contains(
            "summary.json: /rows: expected integer, got string (and 2 more errors in output.errors)"
        ),
        "{}",
        o.dump()
    );
    // The report has all three.
    let r: Value =
        serde_json::from_slice(&std::fs::read(d.path().join("report.json")).unwrap()).unwrap();
    assert_eq!(r["output"]["errors"].as_array().unwrap().len(), 3, "{r}");
}

/// Issue #31 §4: as root the sandbox runs as an unprivileged uid of its own, to which only the
/// permissions for others apply. A file input it cannot read (a secret, mode 0600) was
/// refused with `chmod o+r FILE` as the fix, i.e. making the secret world-readable on the host.
/// Now such a file of at most 8 MiB is given to the sandbox as a read-only copy in memory: the
/// command reads it, cannot change it (a write is refused, shown by a sentinel), the host file
/// keeps its mode, and the report names the copy (`inputs_copied`). A larger one, and a folder
/// the sandbox user cannot read, are still refused before anything runs, naming the fix.
#[test]
fn an_input_the_sandbox_user_cannot_read_is_copied_or_refused_with_the_fix() {
    if !is_root() {
        skip("needs root (only root runs the sandbox as another uid)");
        return;
    }
    let d = tmp();
    let private = d.path().join("private");
    std::fs::create_dir(&private).unwrap();
    let file = private.join("data.csv");
    std::fs::write(&file, "a,b\n1,2\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let run = |ro: &str| {
        let _ = std::fs::remove_file(d.path().join("report.json"));
        agentjail(
            d.path(),
            false,
            &[
                "run",
                "--report",
                "report.json",
                "--ro",
                ro,
                "--",
                "/bin/sh",
                "-c",
                "echo COMMAND-RAN; cat /input/data.csv /input/private/data.csv 2>/dev/null; \
                 if (echo x >> /input/data.csv) 2>/dev/null; then echo WROTE-INPUT; else echo WRITE-REFUSED; fi; true",
            ],
            &[],
        )
    };
    let report = || -> Value {
        serde_json::from_slice(&std::fs::read(d.path().join("report.json")).unwrap()).unwrap()
    };
    let o = run("private/data.csv");
    assert_eq!(o.code, 0, "{}", o.dump());
    assert!(
        o.stdout.contains("COMMAND-RAN") && o.stdout.contains("1,2"),
        "{}",
        o.dump()
    );
    assert!(
        o.stdout.contains("WRITE-REFUSED") && !o.stdout.contains("WROTE-INPUT"),
        "{}",
        o.dump()
    );
    assert_eq!(report()["inputs_copied"], json!(["/input/data.csv"]));
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o7777,
        0o600,
        "the host file's mode changed"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "a,b\n1,2\n");
    // Control: readable by others, the file is bound as it is (no copy), though its folder is
    // 0700 (the bind is made with the init's privileges; the folders above do not matter).
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = run("private/data.csv");
    assert_eq!(o.code, 0, "{}", o.dump());
    assert!(o.stdout.contains("1,2"), "{}", o.dump());
    assert!(report().get("inputs_copied").is_none(), "{}", report());
    // Over the copy's bound: refused before the run, naming the bound and the fix.
    let big = private.join("big.bin");
    std::fs::write(&big, vec![b'x'; (8 << 20) + 1]).unwrap();
    std::fs::set_permissions(&big, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = run("private/big.bin");
    assert_eq!(o.code, 125, "{}", o.dump());
    assert!(!o.stdout.contains("COMMAND-RAN"), "{}", o.dump());
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.dump());
    assert!(
        o.stderr.contains("input /input/big.bin")
            && o.stderr.contains("(mode 0600)")
            && o.stderr.contains("larger than 8 MiB")
            && o.stderr.contains(&format!("chmod o+r {}", big.display())),
        "{}",
        o.dump()
    );
    std::fs::remove_file(&big).unwrap();
    // A folder input is checked with what it holds: not copied, refused with the fix.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = run("private");
    assert_eq!(o.code, 125, "{}", o.dump());
    assert!(
        !o.stdout.contains("COMMAND-RAN")
            && o.stderr
                .contains(&format!("fix: chmod o+rx {}", private.display())),
        "{}",
        o.dump()
    );
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = run("private");
    assert_eq!(o.code, 125, "{}", o.dump());
    assert!(
        o.stderr
            .contains(&format!("fix: chmod o+r {}", file.display())),
        "{}",
        o.dump()
    );
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = run("private");
    assert_eq!(o.code, 0, "{}", o.dump());
    assert!(o.stdout.contains("1,2"), "{}", o.dump());
}

/// The red team's race on the copy (issue #31 §4, found before it landed): a folder above a
/// file input swapped for a link (`renameat2(RENAME_EXCHANGE)` every ~0.3 ms) between the
/// manifest's check and the supervisor's open made root copy a 0600 file from outside the
/// manifest's folder into the sandbox (8 runs of 60 showed the secret). The copy is now opened
/// with `RESOLVE_NO_SYMLINKS` in every component: in 100 runs under the race, the payload never
/// sees the secret (its sentinel), whatever else each run does (the decoy, or a refusal).
#[test]
fn a_folder_swapped_for_a_link_never_gets_a_secret_copied() {
    if !is_root() {
        skip("needs root (only root copies inputs)");
        return;
    }
    let d = tmp();
    let base = d.path();
    let outside = base.join("outside");
    std::fs::create_dir(&outside).unwrap();
    let secret = outside.join("s.txt");
    std::fs::write(&secret, "TOPSECRET-outside\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let work = base.join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::create_dir(work.join("d")).unwrap();
    std::fs::write(work.join("d/s.txt"), "decoy\n").unwrap();
    std::fs::set_permissions(work.join("d/s.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink(&outside, work.join("alt")).unwrap();
    std::fs::write(
        work.join("m.yaml"),
        "inputs:\n  - source: d/s.txt\n    mount: /input/s.txt\nnetwork: deny\n\
         command: [\"/bin/sh\", \"-c\", \"case $(cat /input/s.txt) in TOPSECRET*) echo SENTINEL-LEAK;; decoy) echo SENTINEL-DECOY;; *) echo SENTINEL-OTHER;; esac\"]\n",
    )
    .unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (a, b) = (
        std::ffi::CString::new(work.join("d").to_str().unwrap()).unwrap(),
        std::ffi::CString::new(work.join("alt").to_str().unwrap()).unwrap(),
    );
    let mut tally = std::collections::BTreeMap::<String, usize>::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // SAFETY: two valid NUL-terminated paths; renameat2 only swaps two entries of
                // the test's own folder.
                unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
                std::thread::sleep(std::time::Duration::from_micros(300));
            }
        });
        for _ in 0..100 {
            let o = agentjail(&work, false, &["run", "--manifest", "m.yaml"], &[]);
            let what = ["SENTINEL-LEAK", "SENTINEL-DECOY", "SENTINEL-OTHER"]
                .into_iter()
                .find(|m| o.stdout.contains(m))
                .map(String::from)
                .unwrap_or_else(|| format!("refused ({})", o.code));
            *tally.entry(what).or_default() += 1;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    eprintln!("under the race: {tally:?}");
    assert!(!tally.contains_key("SENTINEL-LEAK"), "{tally:?}");
    assert!(
        tally.contains_key("SENTINEL-DECOY"),
        "the race left no run: {tally:?}"
    );
}

#[test]
fn a_degraded_run_says_what_was_not_applied_every_time() {
    if !is_root() || !have_setpriv() {
        skip("needs root and setpriv (to run as uid 65534 without delegated cgroups)");
        return;
    }
    let d = nobody_dir();
    let o = agentjail(
        d.path(),
        true,
        &[
            "run",
            "--allow-degraded",
            "--report",
            "report.json",
            "--",
            "/bin/echo",
            "COMMAND-RAN",
        ],
        &[],
    );
    let r: Value = serde_json::from_slice(&std::fs::read(d.path().join("report.json")).unwrap())
        .unwrap_or_else(|e| panic!("no report ({e}): {}", o.dump()));
    if r["isolation"]["cgroup"].is_string() {
        skip("uid 65534 gets a cgroup on this host: nothing is degraded");
        return;
    }
    assert_eq!(o.code, 0, "{}", o.dump());
    assert_eq!(o.stdout, "COMMAND-RAN\n", "{}", o.dump());
    assert_eq!(
        o.stderr,
        "agentjail: degraded: no cgroup (memory and pids bounded by rlimits only)\n",
        "{}",
        o.dump()
    );

    // As root, without Landlock (the debug build's cap): the line names it.
    let d = tmp();
    let o = agentjail(
        d.path(),
        false,
        &["run", "--allow-degraded", "--", "/bin/echo", "COMMAND-RAN"],
        &[("AGENTJAIL_TEST_LANDLOCK_ABI", "0")],
    );
    assert_eq!(o.code, 0, "{}", o.dump());
    assert_eq!(o.stdout, "COMMAND-RAN\n", "{}", o.dump());
    assert_eq!(
        o.stderr,
        "agentjail: degraded: no Landlock (file access bounded by the mount namespace only)\n",
        "{}",
        o.dump()
    );
}

#[test]
fn check_as_an_ordinary_user_blames_the_cgroup_and_prints_the_fix() {
    if !is_root() || !have_setpriv() {
        skip("needs root and setpriv (to run as uid 65534 without delegated cgroups)");
        return;
    }
    let d = nobody_dir();
    let o = agentjail(d.path(), true, &["check"], &[]);
    let line = |name: &str| {
        o.stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no `{name}` line: {}", o.dump()))
            .to_string()
    };
    if line("cgroups").contains(" ok ") {
        skip("uid 65534 gets a cgroup on this host");
        return;
    }
    assert_eq!(o.code, 1, "{}", o.dump());
    // The mounts work; the cgroup is what is missing.
    assert!(line("mounts in userns").contains(" ok "), "{}", o.dump());
    assert!(line("strict run").contains("cgroup"), "{}", o.dump());
    assert!(
        !o.stdout.contains("`agentjail check` explains"),
        "check tells the user to run check: {}",
        o.dump()
    );
    // The fix fits the host: `systemd-run --user` only where systemd is PID 1 (sd_booted), a
    // user manager runs for this uid and the cgroups are unified (v2); elsewhere, what an
    // admin must set up for this host's cgroup version.
    let host = Host::probe(65534);
    let fix = o
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("fix:"))
        .unwrap_or_else(|| panic!("no fix: {}", o.dump()))
        .to_string();
    if host.systemd && host.user_manager && host.unified {
        assert!(
            fix.contains("systemd-run --user --scope -p Delegate=yes agentjail run"),
            "{host:?}: {}",
            o.dump()
        );
    } else {
        // Named only where it works once the user logs in (a user manager is missing).
        if !host.systemd || !host.unified {
            assert!(!o.stdout.contains("systemd-run"), "{host:?}: {}", o.dump());
        }
        assert!(fix.contains("an admin"), "{host:?}: {}", o.dump());
        let (version, tool) = if host.unified {
            ("cgroup v2", "cgroup.subtree_control")
        } else {
            ("cgroup v1", "/tasks")
        };
        assert!(
            fix.contains(version) && fix.contains(tool),
            "{host:?}: {}",
            o.dump()
        );
        if !host.systemd {
            assert!(
                fix.contains("PID 1 is not systemd"),
                "{host:?}: {}",
                o.dump()
            );
        }
    }
    assert!(
        o.stdout.contains("--allow-degraded")
            && o.stdout.contains("rlimits only")
            && o.stdout.contains("no CPU limit"),
        "{}",
        o.dump()
    );
    let j = agentjail(d.path(), true, &["check", "--json"], &[]);
    let v: Value = serde_json::from_str(&j.stdout).unwrap();
    assert!(v["fixes"].as_array().is_some_and(|f| f.len() == 2), "{v}");
}

/// What a host offers for giving an ordinary user a cgroup, read here independently of
/// agentjail's own probe.
#[derive(Debug)]
struct Host {
    /// systemd is PID 1 (sd_booted(): /run/systemd/system exists).
    systemd: bool,
    /// A systemd user manager runs for the uid (its private socket exists).
    user_manager: bool,
    /// cgroup v2 alone is mounted at /sys/fs/cgroup (not v1, not the hybrid layout).
    unified: bool,
}

impl Host {
    fn probe(uid: u32) -> Host {
        Host {
            systemd: Path::new("/run/systemd/system").is_dir(),
            user_manager: Path::new(&format!("/run/user/{uid}/systemd/private")).exists(),
            unified: Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
        }
    }

    /// Whether `systemd-run --user --scope -p Delegate=yes` gives the uid a cgroup here.
    fn systemd_run_works(&self) -> bool {
        self.systemd && self.user_manager && self.unified
    }
}

#[test]
fn image_ls_on_an_empty_store_says_so() {
    let d = tmp();
    let store = d.path().join("store");
    let o = agentjail(
        d.path(),
        false,
        &["image", "ls", "--store", store.to_str().unwrap()],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.dump());
    assert!(o.stdout.starts_with("no images"), "{}", o.dump());
}

/// Starts `serve` (built-in example configuration) on an ephemeral port; returns it and the
/// dev token it printed.
fn start_serve(data_dir: &Path) -> (Serve, String) {
    let mut cmd = Command::new(bin());
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .env("AGENTJAIL_LOG", "info")
        .env_remove("XDG_DATA_HOME");
    let serve = Serve::spawn(cmd);
    let log = serve.log();
    let token = log
        .lines()
        .find_map(|l| l.split("export AGENTJAIL_TOKEN=").nth(1))
        .unwrap_or_else(|| panic!("no dev token printed:\n{log}"))
        .trim()
        .to_string();
    (serve, token)
}

#[test]
fn serve_as_root_under_a_private_folder_runs_without_a_false_alarm() {
    if !is_root() {
        skip("needs root (the false alarm was root's)");
        return;
    }
    let d = tempfile::Builder::new()
        .prefix("agentjail-firsthour-")
        .tempdir()
        .unwrap();
    // Like /root: the data directory's ancestor is 0700.
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let (mut serve, token) = start_serve(&d.path().join("data"));
    let base = serve.base.clone();
    let http = reqwest::blocking::Client::builder()
        .timeout(std::time::Duration::from_secs(120))
        .build()
        .unwrap();
    let up: Value = http
        .post(format!(
            "{base}/v1/inputs?name=data.csv&media_type=text/csv"
        ))
        .bearer_auth(&token)
        .body("a,b\n1,2\n3,4\n")
        .send()
        .unwrap()
        .json()
        .unwrap();
    let run: Value = http
        .post(format!("{base}/v1/runs"))
        .bearer_auth(&token)
        .json(&serde_json::json!({
            "request_id": "private-1",
            "task": "csv_line_count",
            "inputs": [up["input_id"]],
        }))
        .send()
        .unwrap()
        .json()
        .unwrap();
    serve.kill();
    let log = serve.log();
    // The run reached its input through the 0700 ancestor: the warning would be false.
    assert_eq!(run["status"], "ok", "{run}\n{log}");
    assert_eq!(run["artifact"]["json"]["lines"], 3, "{run}");
    assert!(
        !log.contains("not traversable"),
        "false alarm in the log:\n{log}"
    );
}

/// `serve` and `mcp` as a user who cannot run strict: they refuse to start, with the fix,
/// instead of answering every run with `setup_error`.
#[test]
fn serve_and_mcp_refuse_to_start_where_a_strict_run_is_refused_and_name_the_fix() {
    if !is_root() || !have_setpriv() {
        skip("needs root and setpriv (to run as uid 65534 without delegated cgroups)");
        return;
    }
    let d = nobody_dir();
    let probe = agentjail(d.path(), true, &["run", "--", "/bin/true"], &[]);
    if probe.code == 0 {
        skip("a strict run works for uid 65534 here");
        return;
    }
    // A refused run ran without nothing: no degraded line, only the refusal.
    assert_eq!(probe.stderr.lines().count(), 1, "{}", probe.dump());
    assert!(!probe.stderr.contains("degraded:"), "{}", probe.dump());
    for args in [
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            "data-serve",
        ][..],
        &[
            "mcp",
            "--tenant",
            "dev",
            "--actor",
            "dev",
            "--data-dir",
            "data-mcp",
        ][..],
    ] {
        let mut c = common::as_nobody()
            .args(args)
            .current_dir(d.path())
            .env("HOME", d.path())
            .env("AGENTJAIL_TOKEN", "ajt_0000")
            .env_remove("XDG_DATA_HOME")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let t = std::time::Instant::now();
        let status = loop {
            if let Some(s) = c.try_wait().unwrap() {
                break Some(s);
            }
            if t.elapsed() > std::time::Duration::from_secs(60) {
                let _ = c.kill();
                let _ = c.wait();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut c.stderr.take().unwrap(), &mut err).unwrap();
        let status = status.unwrap_or_else(|| panic!("{args:?} started anyway:\n{err}"));
        assert!(!status.success(), "{args:?}: {err}");
        // The fix `check` gives for this host (systemd-run only where it works).
        let fix = if Host::probe(65534).systemd_run_works() {
            "systemd-run --user --scope -p Delegate=yes"
        } else {
            "an admin"
        };
        assert!(
            err.contains("refusing to start")
                && err.contains("cgroup")
                && err.contains(fix)
                && err.contains("--allow-degraded"),
            "{args:?}:\n{err}"
        );
        assert!(!err.contains("listening on"), "{args:?}:\n{err}");
        // The reason is the refusal's, not a degraded line.
        assert!(
            err.contains("every run would end in setup_error (refusing to run without: cgroup"),
            "{args:?}:\n{err}"
        );
    }
}

#[test]
fn flag_built_runs_name_the_flag_the_user_typed() {
    let d = tmp();
    std::fs::write(d.path().join("s.json"), "{}").unwrap();
    for (args, want) in [
        (
            &[
                "run",
                "--ro",
                "missing.csv",
                "--",
                "/bin/echo",
                "COMMAND-RAN",
            ][..],
            "agentjail: error: --ro missing.csv: ",
        ),
        (
            &[
                "run",
                "--ro",
                "s.json:/etc/x",
                "--",
                "/bin/echo",
                "COMMAND-RAN",
            ][..],
            "agentjail: error: --ro s.json:/etc/x: /etc/x is outside /input and /work",
        ),
        (
            &["run", "--timeout", "0", "--", "/bin/echo", "COMMAND-RAN"][..],
            "agentjail: error: --timeout (limits.seconds): 0 is outside",
        ),
    ] {
        let o = agentjail(d.path(), false, args, &[]);
        assert_eq!(o.code, 125, "{args:?}: {}", o.dump());
        assert!(!o.stdout.contains("COMMAND-RAN"), "{}", o.dump());
        assert_eq!(o.stderr.lines().count(), 1, "{}", o.dump());
        assert!(o.stderr.starts_with(want), "{args:?}: {}", o.dump());
        assert!(!o.stderr.contains("manifest field"), "{}", o.dump());
    }
    // A manifest file's errors still name its fields.
    std::fs::write(
        d.path().join("m.yaml"),
        "inputs: [{source: missing.csv, mount: /input/m.csv}]\ncommand: [/bin/true]\n",
    )
    .unwrap();
    let o = agentjail(d.path(), false, &["run", "--manifest", "m.yaml"], &[]);
    assert_eq!(o.code, 125, "{}", o.dump());
    assert!(
        o.stderr.contains("manifest field `inputs[0].source`"),
        "{}",
        o.dump()
    );
}
