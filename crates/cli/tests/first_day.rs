//! The first day (issue 31): what a new user meets when they use the real `agentjail` binary in
//! a shell. No panic reaches them, and messages point at the fix.
//!
//! Closed streams: closing a pipe early is ordinary in shells (`agentjail check | head -1`,
//! `$(agentjail receipt pubkey)` in a script that exits). Every subcommand (enumerated from
//! `--help`, so a new one must be added here) is run with its stdout a pipe whose reader is
//! gone before anything is written, and again with its stderr such a pipe: no panic text, no
//! exit 101.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::{bin, tmp};

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Which of the binary's streams is a pipe whose reader has gone.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Closed {
    Stdout,
    Stderr,
}

/// What a run with a closed stream produced: its exit code (None: still running at the
/// deadline, then killed; a signal: -signal) and the other stream.
struct Seen {
    code: Option<i32>,
    other: String,
}

/// Runs `agentjail ARGS` in `dir` (HOME there too) with `closed` a pipe whose read end is
/// already closed, and the other stream captured. Waits up to `secs`, then kills it.
fn with_closed(dir: &Path, args: &[&str], closed: Closed, secs: u64) -> Seen {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut c = Command::new(bin());
    c.args(args)
        .current_dir(dir)
        .env("HOME", dir)
        .env("AGENTJAIL_TOKEN", "ajt_first_day")
        .env_remove("XDG_DATA_HOME")
        .env_remove("AGENTJAIL_IMAGE_STORE")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null());
    match closed {
        Closed::Stdout => c.stdout(writer).stderr(Stdio::piped()),
        Closed::Stderr => c.stderr(writer).stdout(Stdio::piped()),
    };
    let mut child = c.spawn().unwrap();
    let mut pipe = match closed {
        Closed::Stdout => Box::new(child.stderr.take().unwrap()) as Box<dyn Read + Send>,
        Closed::Stderr => Box::new(child.stdout.take().unwrap()),
    };
    // `c` (holding the write end) must not keep it open in this process.
    drop(c);
    let collect = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = pipe.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let deadline = Instant::now() + Duration::from_secs(secs);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    use std::os::unix::process::ExitStatusExt;
    let code = status.map(|s| s.code().unwrap_or_else(|| -s.signal().unwrap_or(0)));
    Seen {
        code,
        other: collect.join().unwrap(),
    }
}

/// The subcommands `agentjail [SUB] --help` lists (without `help`).
fn subcommands(prefix: &[&str]) -> Vec<String> {
    let mut args: Vec<&str> = prefix.to_vec();
    args.push("--help");
    let o = Command::new(bin()).args(&args).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut in_commands = false;
    let mut found = Vec::new();
    for l in text.lines() {
        if l.trim_end() == "Commands:" {
            in_commands = true;
            continue;
        }
        if in_commands {
            if !l.starts_with("  ") {
                break;
            }
            if let Some(name) = l.split_whitespace().next()
                && name != "help"
            {
                found.push(name.to_string());
            }
        }
    }
    found
}

/// Each subcommand doing its ordinary work (or refusing, as a user would meet it), quickly.
/// Several per subcommand where it prints on more than one path.
fn cases() -> Vec<Vec<&'static str>> {
    [
        &["--help"][..],
        &["--version"],
        &["help"],
        &["run", "--", "/bin/echo", "hi"],
        &["run", "--dry-run", "--", "/bin/echo", "hi"],
        &["run", "--no-such-flag", "--", "/bin/echo", "hi"],
        &["run", "--report", "r.json", "--", "/bin/sh", "-c", "exit 3"],
        &["image", "ls", "--store", "store"],
        &["image", "import", "rootfs", "--store", "store"],
        &["image", "verify", "--store", "store", "sha256:0000"],
        &["image", "rm", "--store", "store", "sha256:0000"],
        &["image", "show", "--store", "store", "sha256:0000"],
        &[
            "image",
            "outdated",
            "--store",
            "store",
            "sha256:0000",
            "--requirements",
            "missing.txt",
        ],
        &[
            "image",
            "build",
            "--store",
            "store",
            "--base",
            "sha256:0000",
            "--requirements",
            "missing.txt",
            "--index-url",
            "https://pypi.org/simple/",
        ],
        &[
            "image",
            "gc",
            "--config",
            "service.toml",
            "--store",
            "store",
            "--dry-run",
        ],
        &[
            "image",
            "gc",
            "--config",
            "missing.toml",
            "--store",
            "store",
        ],
        // A daemon starts with the first; the last case stops it (and every session).
        &["session", "start", "--state-dir", "sess"],
        &["session", "ls", "--state-dir", "sess"],
        &[
            "session",
            "exec",
            "--state-dir",
            "sess",
            "ses_00000000000000000000000000000000",
            "-c",
            "print(1)",
        ],
        &["session", "stop", "--state-dir", "sess", "--all"],
        &["manifest", "--schema"],
        &["manifest", "--print", "--", "/bin/echo", "hi"],
        &["check"],
        &["check", "--json"],
        &["demo"],
        &["receipt", "pubkey", "--key", "key.pem"],
        &[
            "receipt",
            "verify",
            "receipt.json",
            "--pubkey",
            "pub.pem",
            "--artifact",
            "out/hello.txt",
        ],
        &["receipt", "verify", "missing.json"],
        &["report", "--schema"],
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            "data-serve",
        ],
        &[
            "mcp",
            "--tenant",
            "dev",
            "--actor",
            "dev",
            "--data-dir",
            "data-mcp",
        ],
        &["worker"],
        &["selftest", "--list"],
        &["audit", "verify", "audit.jsonl"],
        &["audit", "export"],
        &["config", "--schema"],
        &["completions", "bash"],
    ]
    .iter()
    .map(|a| a.to_vec())
    .collect()
}

/// A folder with what the cases read: a root file system to import, an empty audit log, a
/// signing key with its public half, and a receipt of a run with its artifact.
fn scratch() -> tempfile::TempDir {
    let d = tmp();
    let p = d.path();
    std::fs::create_dir(p.join("rootfs")).unwrap();
    std::fs::write(p.join("rootfs/hello"), "hi\n").unwrap();
    std::fs::write(p.join("audit.jsonl"), "").unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/server/config.toml"),
        p.join("service.toml"),
    )
    .unwrap();
    let o = Command::new(bin())
        .current_dir(p)
        .env("HOME", p)
        .env_remove("XDG_DATA_HOME")
        .args([
            "run",
            "--output",
            "/output/hello.txt",
            "--output-dir",
            "out",
            "--receipt",
            "receipt.json",
            "--key",
            "key.pem",
            "--",
            "/bin/sh",
            "-c",
            "echo hi > /output/hello.txt",
        ])
        .output()
        .unwrap();
    assert!(
        o.status.success() && p.join("key.pem").exists(),
        "setting up the receipt: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = Command::new(bin())
        .current_dir(p)
        .args(["receipt", "pubkey", "--key", "key.pem"])
        .output()
        .unwrap();
    assert!(o.status.success());
    std::fs::write(p.join("pub.pem"), &o.stdout).unwrap();
    d
}

#[test]
fn every_subcommand_exits_quietly_when_its_stdout_or_stderr_is_closed() {
    // Every subcommand, nested ones too, has a case.
    let mut listed = Vec::new();
    for top in subcommands(&[]) {
        let nested = subcommands(&[top.as_str()]);
        if nested.is_empty() {
            listed.push(top);
        } else {
            listed.extend(nested.into_iter().map(|n| format!("{top} {n}")));
        }
    }
    assert!(listed.len() > 10, "subcommands from --help: {listed:?}");
    let cases = cases();
    for sub in &listed {
        let words: Vec<&str> = sub.split(' ').collect();
        assert!(
            cases.iter().any(|c| c.starts_with(&words)),
            "`agentjail {sub}` has no case here: add one"
        );
    }
    let d = scratch();
    let mut failures = Vec::new();
    for args in &cases {
        for closed in [Closed::Stdout, Closed::Stderr] {
            // A fresh output folder and report each time (a run refuses a non-empty one).
            let _ = std::fs::remove_file(d.path().join("r.json"));
            // `serve` runs until stopped: a panic would come at its start.
            let secs = if args[0] == "serve" { 10 } else { 60 };
            let s = with_closed(d.path(), args, closed, secs);
            let code = s.code;
            if code == Some(101) || s.other.contains("panicked") {
                failures.push(format!(
                    "agentjail {} with {closed:?} closed: exit {code:?}\n{}",
                    args.join(" "),
                    s.other
                ));
            }
            // Quiet: no error about the pipe, and no death by a signal.
            if closed == Closed::Stdout && s.other.contains("Broken pipe") {
                failures.push(format!(
                    "agentjail {} with stdout closed talks of it:\n{}",
                    args.join(" "),
                    s.other
                ));
            }
            if let Some(c) = code
                && c < 0
            {
                failures.push(format!(
                    "agentjail {} with {closed:?} closed: killed by signal {}",
                    args.join(" "),
                    -c
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Like coreutils: a command whose stdout reader left exits 141 (128 + SIGPIPE, what a shell
/// shows for `yes | head -1`); a lost stderr changes nothing.
#[test]
fn a_printing_command_whose_reader_left_exits_141_and_a_lost_stderr_changes_nothing() {
    let d = tmp();
    for args in [
        &["report", "--schema"][..],
        &["selftest", "--list"],
        &["check"],
        &["completions", "bash"],
    ] {
        let s = with_closed(d.path(), args, Closed::Stdout, 60);
        assert_eq!(s.code, Some(141), "{args:?}: {}", s.other);
        assert_eq!(s.other, "", "{args:?}");
    }
    let s = with_closed(d.path(), &["report", "--schema"], Closed::Stderr, 60);
    assert_eq!(s.code, Some(0));
    assert!(s.other.contains("\"$schema\""), "{}", s.other);
}

/// Runs `agentjail ARGS` in `dir` with `HOME` there and no data settings of the caller.
fn agentjail_in(dir: &Path, args: &[&str]) -> common::Out {
    Command::new(bin())
        .args(args)
        .current_dir(dir)
        .env("HOME", dir)
        .env_remove("XDG_DATA_HOME")
        .env_remove("AGENTJAIL_IMAGE_STORE")
        .stdin(Stdio::null())
        .output()
        .unwrap()
        .into()
}

/// Every file and folder below `dir`, for "nothing was created".
fn tree(dir: &Path) -> Vec<String> {
    let mut all = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            all.push(p.strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                todo.push(p);
            }
        }
    }
    all.sort();
    all
}

/// docs/api.md's `receipt pubkey --key PATH` with a path that did not exist created a new
/// private key there and printed its public half: the next verification failed. Reading a key
/// never creates one; `--create` does, on purpose.
#[test]
fn receipt_pubkey_never_creates_a_key_unless_told_to() {
    let d = tmp();
    let missing = d
        .path()
        .join("home/.local/share/agentjail/server/private/receipt-key.pem");
    for args in [
        &[
            "receipt",
            "pubkey",
            "--key",
            "home/.local/share/agentjail/server/private/receipt-key.pem",
        ][..],
        &["receipt", "pubkey"],
    ] {
        let o = agentjail_in(d.path(), args);
        assert_eq!(o.code, 125, "{args:?}: {}", o.dump());
        assert_eq!(o.stdout, "", "{args:?}: {}", o.dump());
        assert_eq!(o.stderr.lines().count(), 1, "{args:?}: {}", o.dump());
        let path = if args.len() > 2 {
            missing.clone()
        } else {
            d.path().join(".local/share/agentjail/receipt-key.pem")
        };
        assert!(
            o.stderr.starts_with("agentjail: error: no receipt key at ")
                && o.stderr.contains(&path.display().to_string())
                && o.stderr.contains("--create"),
            "{args:?}: {}",
            o.dump()
        );
        assert_eq!(
            tree(d.path()),
            Vec::<String>::new(),
            "{args:?} created files"
        );
    }
    // On purpose: created 0600 (folders 0700), printed; then read, the same key.
    let o = agentjail_in(
        d.path(),
        &["receipt", "pubkey", "--create", "--key", "keys/k.pem"],
    );
    assert_eq!(o.code, 0, "{}", o.dump());
    assert!(
        o.stdout.starts_with("-----BEGIN PUBLIC KEY-----"),
        "{}",
        o.dump()
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| {
        std::fs::metadata(d.path().join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!((mode("keys/k.pem"), mode("keys")), (0o600, 0o700));
    let again = agentjail_in(d.path(), &["receipt", "pubkey", "--key", "keys/k.pem"]);
    assert_eq!(
        (again.code, &again.stdout),
        (0, &o.stdout),
        "{}",
        again.dump()
    );
    // `--create` with a key already there reads it.
    let third = agentjail_in(
        d.path(),
        &["receipt", "pubkey", "--create", "--key", "keys/k.pem"],
    );
    assert_eq!(
        (third.code, &third.stdout),
        (0, &o.stdout),
        "{}",
        third.dump()
    );
}

/// The one line a run or refusal printed on stderr (its last line: the command's own output
/// comes first).
fn last_line(o: &common::Out) -> String {
    o.stderr.lines().last().unwrap_or_default().to_string()
}

/// A limit that ended the run is named by the flag that sets it (a manifest run: by its
/// field), with its value: the user sees what to change.
#[test]
fn a_limit_that_ended_the_run_is_named_by_its_flag() {
    let d = tmp();
    let o = agentjail_in(
        d.path(),
        &["run", "--timeout", "1", "--", "/bin/sleep", "5"],
    );
    assert_eq!(o.code, 124, "{}", o.dump());
    let l = last_line(&o);
    assert!(
        l.starts_with("agentjail: run ended: timeout") && l.contains("--timeout 1"),
        "{}",
        o.dump()
    );
    let o = agentjail_in(
        d.path(),
        &[
            "run",
            "--output-max-mb",
            "1",
            "--",
            "/bin/sh",
            "-c",
            "head -c 3000000 /dev/zero > /output/big",
        ],
    );
    assert_eq!(o.code, 65, "{}", o.dump());
    let l = last_line(&o);
    assert!(
        l.starts_with("agentjail: run ended: output_rejected") && l.contains("--output-max-mb 1"),
        "{}",
        o.dump()
    );
    // A manifest's run: the field, not a flag it did not use.
    std::fs::write(
        d.path().join("m.yaml"),
        "limits: {seconds: 1}\ncommand: [/bin/sleep, '5']\n",
    )
    .unwrap();
    let o = agentjail_in(d.path(), &["run", "--manifest", "m.yaml"]);
    assert_eq!(o.code, 124, "{}", o.dump());
    let l = last_line(&o);
    assert!(
        l.contains("limits.seconds: 1") && !l.contains("--timeout"),
        "{}",
        o.dump()
    );
}

/// clap's "did you mean" reaches the one-line usage error.
#[test]
fn a_mistyped_flag_or_subcommand_gets_did_you_mean() {
    let d = tmp();
    for (args, want) in [
        (
            &["run", "--timeuot", "3", "--", "/bin/echo", "COMMAND-RAN"][..],
            "--timeout",
        ),
        (&["imge", "ls"][..], "`image`"),
        (&["check", "--jsn"][..], "--json"),
        (&["receipt", "pubky"][..], "`pubkey`"),
    ] {
        let o = agentjail_in(d.path(), args);
        assert_eq!(o.code, 125, "{args:?}: {}", o.dump());
        assert!(!o.stdout.contains("COMMAND-RAN"), "{}", o.dump());
        assert_eq!(o.stderr.lines().count(), 1, "{args:?}: {}", o.dump());
        assert!(
            o.stderr.contains("did you mean") && o.stderr.contains(want),
            "{args:?}: {}",
            o.dump()
        );
    }
}

/// `agentjail run python3 -c …` (no `--`): the refusal shows the command line with it.
#[test]
fn a_forgotten_double_dash_gets_the_command_line_with_it() {
    let d = tmp();
    std::fs::write(d.path().join("x.csv"), "a\n").unwrap();
    for (args, want) in [
        (
            &["run", "/usr/bin/python3", "-c", "print('COMMAND-RAN')"][..],
            "agentjail run -- /usr/bin/python3 -c 'print('\\''COMMAND-RAN'\\'')'",
        ),
        (
            &[
                "run",
                "--ro",
                "x.csv",
                "--timeout",
                "5",
                "/bin/echo",
                "COMMAND-RAN",
            ][..],
            "agentjail run --ro x.csv --timeout 5 -- /bin/echo COMMAND-RAN",
        ),
    ] {
        let o = agentjail_in(d.path(), args);
        assert_eq!(o.code, 125, "{args:?}: {}", o.dump());
        assert!(!o.stdout.contains("COMMAND-RAN"), "{}", o.dump());
        assert_eq!(o.stderr.lines().count(), 1, "{args:?}: {}", o.dump());
        assert!(
            o.stderr.contains("after `--`") && o.stderr.contains(want),
            "{args:?}: want {want}\n{}",
            o.dump()
        );
    }
}

/// A run that ends `ok` with denials says so on a stderr that is not a terminal, in the words
/// a terminal gets, without the terminal's styling; a clean run stays silent.
#[test]
fn an_ok_run_with_denials_says_so_when_stderr_is_not_a_terminal() {
    let d = tmp();
    let o = agentjail_in(
        d.path(),
        &[
            "run",
            "--",
            "/usr/bin/python3",
            "-c",
            "import ctypes; print('COMMAND-RAN', ctypes.CDLL(None).syscall(165, 0, 0, 0, 0, 0))",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.dump());
    assert!(o.stdout.contains("COMMAND-RAN -1"), "{}", o.dump());
    assert_eq!(
        o.stderr,
        "agentjail: run ended: ok (1 denial(s); first: mount)\n",
        "{}",
        o.dump()
    );
    let o = agentjail_in(d.path(), &["run", "--", "/bin/echo", "COMMAND-RAN"]);
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{}", o.dump());
}

/// `check` and a run's report give the same Landlock ABI: the one applied. Where the kernel
/// offers a newer one, `check` says so, and why the newer rights are not asked for.
#[test]
fn check_and_run_reports_agree_on_the_landlock_abi() {
    let d = tmp();
    let o = agentjail_in(d.path(), &["run", "--report", "r.json", "--", "/bin/true"]);
    assert_eq!(o.code, 0, "{}", o.dump());
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.path().join("r.json")).unwrap()).unwrap();
    let abi = r["isolation"]["landlock_abi"]
        .as_u64()
        .expect("landlock applied");
    let c = agentjail_in(d.path(), &["check", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&c.stdout).unwrap();
    let item = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "landlock")
        .unwrap()["detail"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        item.starts_with(&format!("ABI {abi} applied")),
        "check: {item}; run report: landlock_abi {abi}"
    );
    // A newer kernel ABI is named, with why it changes nothing.
    if item.contains("the kernel offers ABI") {
        assert!(item.contains("no right agentjail uses"), "{item}");
    }
}

/// An `--isolation gvisor` run printed a long `degraded:` line every time, listing what the
/// tier does differently by design (gVisor's Sentry instead of a seccomp listener, its gofer
/// instead of Landlock). Nothing was missing: nothing is said on stderr; the report keeps the
/// tier's notes.
#[test]
fn a_gvisor_run_says_degraded_only_where_something_was_not_applied() {
    if !common::is_root() {
        common::skip("the gvisor tier needs root");
        return;
    }
    let runsc = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .any(|d| d.join("runsc").is_file());
    if !runsc {
        common::skip("runsc not found (apt-get install runsc)");
        return;
    }
    let d = tmp();
    let o = agentjail_in(
        d.path(),
        &[
            "run",
            "--isolation",
            "gvisor",
            "--report",
            "r.json",
            "--",
            "/bin/echo",
            "COMMAND-RAN",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.dump());
    assert_eq!(o.stdout, "COMMAND-RAN\n", "{}", o.dump());
    assert_eq!(o.stderr, "", "{}", o.dump());
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.path().join("r.json")).unwrap()).unwrap();
    assert!(
        r["isolation"]["degraded"].as_array().is_some_and(|a| a
            .iter()
            .any(|e| e.as_str().unwrap_or("").starts_with("gvisor:"))),
        "{r}"
    );
}

/// The supervisor outlives a reader that left (SIGPIPE's default action would have killed it
/// at the first relayed write) and writes its report; the command meets the closed pipe as it
/// would without agentjail in between: once a relayed write failed, the relay closes its end,
/// and the command's next write gets SIGPIPE (signal 13, exit 141), so that a command that
/// goes on writing does not run until the timeout (also output_edges.rs, `yes | head -1`).
#[test]
fn a_run_whose_stdout_reader_left_ends_as_the_command_would_and_writes_its_report() {
    let d = tmp();
    let s = with_closed(
        d.path(),
        &[
            "run",
            "--report",
            "r.json",
            "--",
            "/bin/sh",
            "-c",
            "while echo line; do :; done; exit 3",
        ],
        Closed::Stdout,
        60,
    );
    assert_eq!(s.code, Some(141), "{}", s.other);
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.path().join("r.json")).unwrap()).unwrap();
    assert_eq!(r["signal"], 13, "{r}");
    assert_ne!(r["status"], "ok", "{r}");
}

/// Runs `cmd` (a `serve` expected to refuse to start) until it exits (60 s at most: one that
/// started anyway is killed and fails the test); returns its exit code and stderr.
fn refused_start(mut cmd: Command) -> common::Out {
    let mut c = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = c.stderr.take().unwrap();
    let collect = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = c.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = c.kill();
            let _ = c.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = collect.join().unwrap();
    let status = status.unwrap_or_else(|| panic!("serve started anyway:\n{stderr}"));
    common::Out {
        code: status.code().unwrap_or(-1),
        stdout: String::new(),
        stderr,
    }
}

/// `agentjail serve` without --config (the dev token) on `data`, degraded allowed so that the
/// test runs as any user.
fn dev_serve(data: &Path) -> Command {
    let mut c = Command::new(bin());
    c.args([
        "serve",
        "--allow-degraded",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
    ])
    .arg(data)
    .env_remove("XDG_DATA_HOME")
    .env("AGENTJAIL_LOG", "info");
    c
}

/// Starts [`dev_serve`]; returns it and the one dev token its log shows.
fn start_dev_serve(data: &Path) -> (common::serve::Serve, String) {
    let s = common::serve::Serve::spawn(dev_serve(data));
    let log = s.log();
    let tokens: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split("export AGENTJAIL_TOKEN=").nth(1))
        .collect();
    assert_eq!(tokens.len(), 1, "one token line:\n{log}");
    let token = tokens[0].trim().to_string();
    assert_eq!(
        log.matches(&token).count(),
        1,
        "the token shown once:\n{log}"
    );
    (s, token)
}

/// The HTTP status of `GET /v1/tasks` with `token`.
fn tasks_status(base: &str, token: &str) -> u16 {
    common::serve::Api::new(base)
        .get(token, "/v1/tasks")
        .status()
        .as_u16()
}

/// Whether `text` holds a token (`ajt_` and a hex digit).
fn shows_a_token(text: &str) -> bool {
    text.split("ajt_")
        .skip(1)
        .any(|rest| rest.starts_with(|c: char| c.is_ascii_hexdigit()))
}

/// Every file below `dir` holding `needle`, for "the token is written nowhere else".
fn files_holding(dir: &Path, needle: &str) -> Vec<String> {
    tree(dir)
        .into_iter()
        .filter(|p| {
            std::fs::read(dir.join(p))
                .map(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

/// A saved MCP client configuration holds the dev token: `serve` without --config keeps it in
/// `DATA/private/dev-token` (0600, this user's) and shows the same one at every start, until
/// the operator deletes that file. A token file that others could have read, or that another
/// user owns or planted as a symlink, is refused (the service does not start and shows no
/// token), never reused or silently replaced.
#[test]
fn the_dev_token_survives_a_restart_until_its_file_is_deleted() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let d = tmp();
    let data = d.path().join("data");
    let file = data.join("private").join("dev-token");
    let (mut s, t1) = start_dev_serve(&data);
    assert_eq!(tasks_status(&s.base, &t1), 200);
    let log = s.log();
    assert!(
        log.contains(file.to_str().unwrap()),
        "names its file:\n{log}"
    );
    s.kill();
    let m = std::fs::symlink_metadata(&file).unwrap();
    assert!(m.is_file());
    assert_eq!(m.mode() & 0o777, 0o600, "mode {:o}", m.mode());
    assert_eq!(
        m.uid(),
        std::fs::metadata(d.path()).unwrap().uid(),
        "owned by the user running serve"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), t1);
    assert_eq!(files_holding(&data, &t1), ["private/dev-token"]);

    // A restart: the same token works.
    let (mut s, t2) = start_dev_serve(&data);
    assert_eq!(t2, t1, "a restart keeps the token");
    assert_eq!(tasks_status(&s.base, &t1), 200);
    s.kill();

    // Rotation: delete the file.
    std::fs::remove_file(&file).unwrap();
    let (mut s, t3) = start_dev_serve(&data);
    assert_ne!(t3, t1, "a deleted token file makes a new token");
    assert_eq!(tasks_status(&s.base, &t1), 401, "the old token is refused");
    assert_eq!(tasks_status(&s.base, &t3), 200);
    s.kill();
    assert_eq!(files_holding(&data, &t1), Vec::<String>::new());

    // Fail closed: readable by group or others, a symlink, another owner.
    let refused = |why: &str| {
        let o = refused_start(dev_serve(&data));
        assert_eq!(o.code, 125, "{why}: {}", o.dump());
        assert_eq!(o.stderr.lines().count(), 1, "{why}: one line: {}", o.dump());
        assert!(
            o.stderr.contains(file.to_str().unwrap()) && o.stderr.contains("delete it"),
            "{why}: names the file and the fix: {}",
            o.dump()
        );
        assert!(!shows_a_token(&o.stderr), "{why}: no token: {}", o.dump());
        assert!(!o.stderr.contains("listening"), "{why}: {}", o.dump());
    };
    for mode in [0o640, 0o604, 0o644] {
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
        refused(&format!("mode {mode:o}"));
        // Not rewritten: the operator decides (the token may have been read).
        assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), t3);
    }
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let elsewhere = d.path().join("planted");
    std::fs::write(&elsewhere, format!("{t1}\n")).unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::rename(&file, d.path().join("kept")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &file).unwrap();
    refused("a symlink");
    std::fs::remove_file(&file).unwrap();
    std::fs::write(&file, "not a token\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    refused("not a token");
    std::fs::rename(d.path().join("kept"), &file).unwrap();
    if common::is_root() {
        std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
        refused("owned by uid 65534");
    } else {
        common::skip("needs root to give the token file another owner");
    }
}

/// `serve` as a user for whom a strict run is refused: it does not start, so it shows no
/// token and keeps none, and the fix it names is one for `serve` (not `agentjail run`).
#[test]
fn serve_refused_as_an_ordinary_user_shows_no_token_and_names_a_fix_for_serve() {
    use std::os::unix::fs::PermissionsExt;
    if !common::is_root() || !Path::new("/usr/bin/setpriv").exists() {
        common::skip("needs root and /usr/bin/setpriv (to run as uid 65534)");
        return;
    }
    let d = tmp();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let as_nobody = |args: &[&str]| {
        let mut c = common::as_nobody();
        c.args(args)
            .current_dir(d.path())
            .env("HOME", d.path())
            .env_remove("XDG_DATA_HOME");
        c
    };
    let probe = refused_start(as_nobody(&["run", "--", "/bin/true"]));
    if probe.code == 0 {
        common::skip("a strict run works for uid 65534 here");
        return;
    }
    let o = refused_start(as_nobody(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        "data",
    ]));
    assert_eq!(o.code, 125, "{}", o.dump());
    assert_eq!(o.stderr.lines().count(), 1, "one line: {}", o.dump());
    assert!(!shows_a_token(&o.stderr), "no token: {}", o.dump());
    assert!(!o.stderr.contains("AGENTJAIL_TOKEN"), "{}", o.dump());
    assert!(
        !d.path().join("data/private/dev-token").exists(),
        "a refused start keeps no token"
    );
    assert!(
        !o.stderr
            .split("agentjail run")
            .skip(1)
            .any(|rest| !rest.starts_with('s')),
        "the fix is for serve, not `agentjail run`: {}",
        o.dump()
    );
    assert!(
        o.stderr.contains("refusing to start")
            && o.stderr.contains("run `agentjail serve` as root")
            && o.stderr.contains("agentjail serve --allow-degraded"),
        "{}",
        o.dump()
    );
}

/// A task without inputs is called without `"inputs": []`: an omitted `inputs` is the empty
/// list (the same request, for replay, as `"inputs": []`), and `/openapi.json` says it is
/// optional, as the MCP tool of such a task has no input property at all.
#[test]
fn a_run_of_a_task_without_inputs_needs_no_inputs_field() {
    use common::serve::{Api, Serve, actor, fixed_task, json_output, write_config};
    let d = tmp();
    let token = "ajt_no_inputs_token";
    let cfg = write_config(
        d.path(),
        &format!(
            "[server]\nallow_degraded = true\n[tenants.acme]\n{}{}{}",
            actor("alice", "acme", token, false),
            fixed_task(
                "hello",
                "Writes a fixed JSON object",
                r#"["/usr/bin/python3", "-c", "open('/output/o.json', 'w').write('{\"hello\": 1}')"]"#,
                r#"allowed_tenants = ["acme"]"#,
            ),
            json_output("hello", "o.json", 1000),
        ),
    );
    let s = Serve::start(&cfg, &d.path().join("data"), &[]);
    let api = Api::new(&s.base);
    let r = api.run(
        token,
        &serde_json::json!({"request_id": "no-inputs-1", "task": "hello"}),
        "",
    );
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().unwrap();
    assert_eq!(status, 200, "{body}\n{}", s.log());
    assert_eq!(body["status"], "ok", "{body}");
    assert_eq!(body["artifact"]["json"]["hello"], 1, "{body}");
    assert_eq!(body["inputs"], serde_json::json!([]), "{body}");
    // The same request with `"inputs": []` is a replay of it, not a conflict.
    let r = api.run(
        token,
        &serde_json::json!({"request_id": "no-inputs-1", "task": "hello", "inputs": []}),
        "",
    );
    assert_eq!(r.status().as_u16(), 200);
    let again: serde_json::Value = r.json().unwrap();
    assert_eq!(again["job_id"], body["job_id"], "{again}");
    // The contract says so.
    let doc: serde_json::Value = api.get(token, "/openapi.json").json().unwrap();
    let req = &doc["components"]["schemas"]["RunRequest"];
    let required: Vec<&str> = req["required"]
        .as_array()
        .unwrap_or_else(|| panic!("{req}"))
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(required.contains(&"task"), "{req}");
    assert!(!required.contains(&"inputs"), "{req}");
    assert_eq!(
        req["properties"]["inputs"]["default"],
        serde_json::json!([]),
        "{req}"
    );
    // And so does the task's own request schema in GET /v1/tasks.
    let tasks: serde_json::Value = api.get(token, "/v1/tasks").json().unwrap();
    let hello = tasks
        .as_array()
        .or_else(|| tasks["tasks"].as_array())
        .and_then(|a| a.iter().find(|t| t["name"] == "hello"))
        .unwrap_or_else(|| panic!("{tasks}"));
    let rs = &hello["request_schema"];
    assert_eq!(
        rs["required"],
        serde_json::json!(["request_id", "task"]),
        "{rs}"
    );
}
