//! The documentation is executable: every ```` ```console ```` block of README.md and docs/*.md
//! is run, and what it shows is checked against what the commands print.
//!
//! - A `console` block is a transcript: lines starting with `$ ` are commands (a command goes on
//!   while its line ends with `\` or `|`), the lines after a command are its expected output
//!   (stdout and stderr together; a last line without a newline counts as a line), matched with snapbox: `[..]` matches any text within a line,
//!   `...` on a line of its own any number of lines. A command must exit 0 unless its last line
//!   ends with the comment `# exit status N`.
//! - All commands of a block run, in order, in one `bash` (variables carry over). **The blocks
//!   of one page run in order, in one folder that holds only what a user has after a clone**
//!   (a copy of the repository's tracked files, nothing the harness adds), with `HOME` a fresh,
//!   empty folder elsewhere (the receipt key, the image store and the service's data land
//!   there), and this build's `agentjail` first on `PATH`: a page must set up what its commands
//!   need in its own words, and a command that works only after another page's does not pass.
//!   As root, every block runs in a network namespace of its own with only loopback (the
//!   server quick start listens on 8787 without meeting anything else on this machine).
//! - A block marked `<!-- doc-test: twice -->` (on the line before its fence) runs a second
//!   time in the same folder: a quick start must survive being run again.
//! - A `sh` block is a list of commands with placeholders (`sha256:…`, a remote host, a
//!   `cargo build`): it must be marked `<!-- doc-test: skip: REASON -->` on the line before its
//!   fence, and is listed in this test's output as skipped, with its reason. An unmarked `sh`
//!   block fails the test, so no new command block escapes unnoticed; so does an unmarked
//!   `bash` or `shell` block, or a block without a language whose lines look like commands
//!   (`$ `, `sudo `, `agentjail `, `cargo `, `curl `…): a diagram is fenced as `text`.
//!
//! - A command named in the prose (inline code that starts like one) is run too: as part of a
//!   console block's command, or by `every_command_named_in_prose_is_run_or_says_why_not`
//!   (`PROSE_RUN`); otherwise it says why not: by its kind (placeholders such as `FILE` or `…`,
//!   a build, a package install, the test suite) or in `PROSE_SKIP`, both listed in the test's
//!   output. A new one without either fails the test, and so does an entry no page names.
//!
//! Needs bash, python3 (the examples) with the `cryptography` package (docs/receipts.md's
//! third-party verifier), curl and jq (the server quick start). Missing one is a
//! failure under CI (`CI` set) and a visible `SKIP` otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const MARK: &str = "<!-- doc-test:";

#[derive(Debug)]
struct Cmd {
    text: String,
    expected: String,
    status: i32,
    line: usize,
}

#[derive(Debug)]
struct Block {
    file: String,
    line: usize,
    cmds: Vec<Cmd>,
    twice: bool,
}

#[derive(Debug, Default)]
struct Parsed {
    run: Vec<Block>,
    skipped: Vec<(String, usize, String)>,
    unmarked: Vec<(String, usize)>,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn doc_files() -> Vec<PathBuf> {
    let root = repo();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The exit status a command's last line declares with `# exit status N` (0 otherwise).
fn declared_status(last_line: &str) -> i32 {
    let Some(i) = last_line.rfind("# exit status ") else {
        return 0;
    };
    last_line[i + "# exit status ".len()..]
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("bad `# exit status` in {last_line:?}"))
}

fn parse(name: &str, text: &str, out: &mut Parsed) {
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        let Some(info) = l.strip_prefix("```") else {
            i += 1;
            continue;
        };
        let info = info.trim().to_string();
        let start = i + 1;
        let mut end = start;
        while end < lines.len() && !lines[end].starts_with("```") {
            end += 1;
        }
        let body = &lines[start..end.min(lines.len())];
        let mark = (i > 0)
            .then(|| lines[i - 1].trim())
            .and_then(|p| p.strip_prefix(MARK))
            .and_then(|p| p.strip_suffix("-->"))
            .map(|p| p.trim().to_string());
        i = end + 1;
        let skip = mark.as_deref().and_then(|m| m.strip_prefix("skip:"));
        match (info.as_str(), skip) {
            ("console" | "sh" | "bash" | "shell", Some(reason)) => {
                out.skipped
                    .push((name.to_string(), start, reason.trim().to_string()))
            }
            ("console", None) => {
                let mut cmds: Vec<Cmd> = Vec::new();
                let mut k = 0;
                while k < body.len() {
                    let line = body[k];
                    if let Some(c) = line.strip_prefix("$ ") {
                        let cmd_line = start + k + 1;
                        let mut text = c.to_string();
                        let mut last = c.to_string();
                        while (last.trim_end().ends_with('\\') || last.trim_end().ends_with('|'))
                            && k + 1 < body.len()
                        {
                            k += 1;
                            last = body[k].to_string();
                            text.push('\n');
                            text.push_str(body[k]);
                        }
                        cmds.push(Cmd {
                            status: declared_status(&last),
                            text,
                            expected: String::new(),
                            line: cmd_line,
                        });
                    } else if let Some(c) = cmds.last_mut() {
                        c.expected.push_str(line);
                        c.expected.push('\n');
                    } else {
                        panic!(
                            "{name}:{}: a console block must start with a `$ ` command",
                            start + k + 1
                        );
                    }
                    k += 1;
                }
                out.run.push(Block {
                    file: name.to_string(),
                    line: start,
                    cmds,
                    twice: mark.as_deref() == Some("twice"),
                });
            }
            ("sh" | "bash" | "shell", None) => out.unmarked.push((name.to_string(), start)),
            ("", None) if body.iter().any(|l| looks_like_a_command(l)) => {
                out.unmarked.push((name.to_string(), start))
            }
            ("", Some(reason)) => {
                out.skipped
                    .push((name.to_string(), start, reason.trim().to_string()))
            }
            _ => {}
        }
    }
}

/// A line a reader would copy into a shell.
fn looks_like_a_command(line: &str) -> bool {
    const STARTS: [&str; 11] = [
        "$ ",
        "sudo ",
        "agentjail ",
        "cargo ",
        "curl ",
        "docker ",
        "kubectl ",
        "npx ",
        "pip ",
        "python3 ",
        "apt-get ",
    ];
    let l = line.trim_start();
    STARTS.iter().any(|s| l.starts_with(s))
}

fn have(tool: &str) -> bool {
    Command::new("bash")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn have_python_module(m: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {m}")])
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// What a user has after a clone: a copy of the repository's tracked files (as they are in
/// the work tree), in a folder the sandbox user can traverse (as root, runs use an
/// unprivileged host uid). Nothing else.
fn workdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::Builder::new()
        .prefix("agentjail-doctest-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = repo();
    let out = Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["ls-files", "-z"])
        .output()
        .expect("git ls-files (the documentation test copies the checkout)");
    assert!(
        out.status.success(),
        "git ls-files failed in {}",
        root.display()
    );
    for f in out.stdout.split(|b| *b == 0).filter(|f| !f.is_empty()) {
        let rel = Path::new(std::str::from_utf8(f).unwrap());
        let from = root.join(rel);
        // A file deleted in the work tree but not yet in the index is not there for a user.
        let Ok(meta) = std::fs::symlink_metadata(&from) else {
            continue;
        };
        let to = d.path().join(rel);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        if meta.file_type().is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from).unwrap(), &to).unwrap();
        } else {
            std::fs::copy(&from, &to).unwrap();
        }
    }
    // Folders as git makes them for a user whose umask is 022.
    fn open_up(p: &Path) {
        for e in std::fs::read_dir(p).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
                open_up(&e.path());
            }
        }
    }
    open_up(d.path());
    d
}

/// A fresh, empty home folder.
fn homedir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("agentjail-doctest-home-")
        .tempdir()
        .unwrap()
}

/// Runs a block's commands in one bash; returns each command's (output, exit status).
fn run_block(b: &Block, dir: &Path, home: &Path, results: &Path) -> Vec<(String, i32)> {
    let mut script = String::from("exec </dev/null\n");
    if is_root() {
        script.push_str("ip link set lo up || exit 99\n");
    }
    for (n, c) in b.cmds.iter().enumerate() {
        let o = results.join(format!("{n}.out"));
        let r = results.join(format!("{n}.rc"));
        script.push_str(&format!(
            "{{ {}\n}} >'{}' 2>&1; echo $? >'{}'\n",
            c.text,
            o.display(),
            r.display()
        ));
    }
    // The binary under test (as tests/common's `bin()`: `AGENTJAIL_TEST_BIN` names another build).
    let bin_file = std::env::var_os("AGENTJAIL_TEST_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_agentjail").into());
    let bin = bin_file.parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = if is_root() {
        let mut c = Command::new("unshare");
        c.args(["--net", "--", "bash", "-c", &script]);
        c
    } else {
        let mut c = Command::new("bash");
        c.args(["-c", &script]);
        c
    };
    use std::os::unix::process::CommandExt;
    let status = cmd
        .current_dir(dir)
        .env("PATH", path)
        .env("HOME", home)
        .env_remove("XDG_DATA_HOME")
        .env_remove("AGENTJAIL_IMAGE_STORE")
        .env_remove("AGENTJAIL_TOKEN")
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .and_then(|mut c| {
            let pid = c.id();
            let s = c.wait();
            // Whatever the block left running in the background (a server) ends with it.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stderr(Stdio::null())
                .status();
            s
        })
        .unwrap();
    assert_ne!(
        status.code(),
        Some(99),
        "{}:{}: cannot bring up loopback in the test's network namespace",
        b.file,
        b.line
    );
    (0..b.cmds.len())
        .map(|n| {
            let out = std::fs::read_to_string(results.join(format!("{n}.out"))).unwrap_or_default();
            let rc = std::fs::read_to_string(results.join(format!("{n}.rc")))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(-1);
            (out, rc)
        })
        .collect()
}

/// Checks a block's results; returns one message per mismatch.
fn check(b: &Block, got: &[(String, i32)], round: &str) -> Vec<String> {
    let assert = snapbox::Assert::new().normalize_paths(false);
    let mut failures = Vec::new();
    for (c, (out, rc)) in b.cmds.iter().zip(got) {
        // A last line without its newline is shown as a line.
        let mut out = out.clone();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        let at = format!("{}:{}{round}: $ {}", b.file, c.line, c.text);
        if *rc != c.status {
            failures.push(format!(
                "{at}\n  exit status {rc}, documented {}\n  output:\n{out}",
                c.status
            ));
            continue;
        }
        if let Err(e) = assert.try_eq(
            Some(&"the command's output"),
            snapbox::Data::text(out.clone()),
            snapbox::Data::text(c.expected.clone()),
        ) {
            failures.push(format!("{at}\n{e}"));
        }
    }
    failures
}

#[test]
fn the_documented_commands_work_as_written() {
    let mut missing: Vec<&str> = ["bash", "python3", "curl", "jq"]
        .into_iter()
        .filter(|t| !have(t))
        .collect();
    if is_root() {
        missing.extend(["unshare", "ip"].into_iter().filter(|t| !have(t)));
    }
    if !have_python_module("cryptography") {
        missing.push("the Python package cryptography");
    }
    if !missing.is_empty() {
        let msg = format!("the documentation tests need {}", missing.join(", "));
        assert!(
            std::env::var_os("CI").is_none(),
            "{msg} (CI must install them)"
        );
        eprintln!("SKIP: {msg}");
        return;
    }
    let mut parsed = Parsed::default();
    for f in doc_files() {
        let name = f.strip_prefix(repo()).unwrap_or(&f).display().to_string();
        parse(&name, &std::fs::read_to_string(&f).unwrap(), &mut parsed);
    }
    assert!(
        parsed.unmarked.is_empty(),
        "command blocks that are neither run (```console) nor marked `<!-- doc-test: skip: REASON -->`: {:?}",
        parsed.unmarked
    );
    assert!(
        parsed.run.len() >= 5,
        "too few console blocks found: {:?}",
        parsed.run
    );
    let mut failures = Vec::new();
    // One folder and one home per page, its blocks in order.
    let mut page: Option<(String, tempfile::TempDir, tempfile::TempDir)> = None;
    for b in &parsed.run {
        if page.as_ref().is_none_or(|(f, _, _)| *f != b.file) {
            page = Some((b.file.clone(), workdir(), homedir()));
        }
        let Some((_, dir, home)) = &page else {
            unreachable!()
        };
        let results = tempfile::tempdir().unwrap();
        let t = std::time::Instant::now();
        let got = run_block(b, dir.path(), home.path(), results.path());
        failures.extend(check(b, &got, ""));
        if b.twice {
            let results = tempfile::tempdir().unwrap();
            let got = run_block(b, dir.path(), home.path(), results.path());
            failures.extend(check(b, &got, " (second run)"));
        }
        eprintln!(
            "ran {}:{} ({} command(s){}, {} ms)",
            b.file,
            b.line,
            b.cmds.len(),
            if b.twice { ", twice" } else { "" },
            t.elapsed().as_millis()
        );
    }
    for (f, l, why) in &parsed.skipped {
        eprintln!("skipped {f}:{l}: {why}");
    }
    assert!(
        failures.is_empty(),
        "{} documented command(s) do not work as written:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn the_block_parser_reads_commands_outputs_and_marks() {
    let md = "x\n```console\n$ echo a \\\n  b   # exit status 3\na b\n$ true\n```\n<!-- doc-test: skip: remote host -->\n```sh\nssh x\n```\n```sh\nls\n```\n<!-- doc-test: twice -->\n```console\n$ printf 'x\\n' |\n  cat\nx\n```\n";
    let mut p = Parsed::default();
    parse("t.md", md, &mut p);
    assert_eq!(p.run.len(), 2);
    assert_eq!(p.run[0].cmds.len(), 2);
    assert_eq!(p.run[0].cmds[0].text, "echo a \\\n  b   # exit status 3");
    assert_eq!(p.run[0].cmds[0].status, 3);
    assert_eq!(p.run[0].cmds[0].expected, "a b\n");
    assert_eq!(p.run[0].cmds[1].expected, "");
    assert!(!p.run[0].twice);
    assert!(p.run[1].twice);
    assert_eq!(p.run[1].cmds[0].text, "printf 'x\\n' |\n  cat");
    assert_eq!(p.skipped, vec![("t.md".into(), 9, "remote host".into())]);
    assert_eq!(p.unmarked, vec![("t.md".into(), 12)]);
}

/// Inline code in the prose of README.md and docs/*.md that a reader would type as a command
/// (it starts like one, [`looks_like_a_command`]), with the file and the line of its paragraph.
fn prose_commands(name: &str, text: &str) -> Vec<(String, usize, String)> {
    let mut found = Vec::new();
    let mut in_fence = false;
    let mut para: Vec<(usize, &str)> = Vec::new();
    let mut flush = |para: &mut Vec<(usize, &str)>| {
        if let Some((line, _)) = para.first() {
            // A paragraph joined, so that a span wrapped over two lines is one span.
            let joined: Vec<&str> = para.iter().map(|(_, l)| l.trim()).collect();
            let joined = joined.join(" ");
            for (i, span) in joined.split('`').enumerate() {
                if i % 2 == 1 && !span.is_empty() && looks_like_a_command(span) {
                    found.push((name.to_string(), *line, span.trim().to_string()));
                }
            }
        }
        para.clear();
    };
    for (n, l) in text.lines().enumerate() {
        if l.starts_with("```") {
            flush(&mut para);
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        if l.trim().is_empty() {
            flush(&mut para);
        } else {
            para.push((n + 1, l));
        }
    }
    flush(&mut para);
    found
}

/// Commands named in prose that this test runs itself (exit 0), in a page's folder as the
/// console blocks are run.
const PROSE_RUN: &[&str] = &[
    "agentjail config --schema",
    "agentjail --version",
    "agentjail check | head -1",
    "agentjail run -- /bin/true",
    "agentjail demo",
    "agentjail run -- yes | head -1",
];

/// Commands named in prose that are not run here, each with the reason.
const PROSE_SKIP: &[(&str, &str)] = &[
    (
        "agentjail receipt verify --live-cell",
        "needs a live session's cell receipt: sessions_live.rs verifies one with and without the flag",
    ),
    (
        "agentjail image show D --sbom | sha256sum",
        "D stands for a stored image's digest; image.rs checks that show's SBOM digest is that of what --sbom prints",
    ),
    (
        "agentjail image build",
        "needs a package index and a stored base: crates/cli/tests/image_build.rs runs it against a local index in its own network namespace",
    ),
    (
        "agentjail 0.1.0",
        "what an old binary's --version printed, quoted (bench/fleet.sh's figures)",
    ),
    (
        "agentjail 0.1.0 (commit 047f2e4, 2026-12-03, x86_64-unknown-linux-gnu)",
        "what a binary's --version printed, quoted (bench/fleet.sh's figures)",
    ),
    (
        "agentjail mcp",
        "the subcommand's name; the host configurations above it launch it, and mcp.rs / mcp_ts.rs run it",
    ),
    (
        "agentjail worker",
        "the subcommand's name; a worker needs PostgreSQL (fleet.rs runs workers)",
    ),
    ("agentjail worker --listen", "needs PostgreSQL (fleet.rs)"),
    (
        "agentjail worker --listen 0.0.0.0:9464",
        "needs PostgreSQL (fleet.rs)",
    ),
    ("agentjail worker --slots 1", "needs PostgreSQL (fleet.rs)"),
    (
        "agentjail serve --slots 0",
        "needs PostgreSQL (fleet_topology.rs)",
    ),
    (
        "agentjail run --dry-run",
        "a flag named in prose, without the run it applies to",
    ),
    (
        "agentjail check --json",
        "its exit status depends on the host; first_hour.rs and first_day.rs check its output",
    ),
    (
        "agentjail selftest --json --tier native",
        "takes a minute or more; selftest_attestation.rs and .ci/run run it",
    ),
    (
        "agentjail image import py",
        "needs an OCI image layout (image.rs builds and imports one)",
    ),
    (
        "agentjail image verify",
        "needs an imported image (image.rs)",
    ),
    (
        "agentjail image rm",
        "needs an imported image (image.rs removes one)",
    ),
    (
        "agentjail run --isolation gvisor -- /bin/true",
        "needs runsc (gvisor_edges.rs)",
    ),
    (
        "python3 summarize.py",
        "a measurement's baseline outside the sandbox (bench/)",
    ),
    (
        "agentjail image import",
        "the subcommand's name; image.rs builds and imports images",
    ),
    (
        "agentjail worker --config /etc/agentjail/config.toml --listen 0.0.0.0:9464",
        "needs PostgreSQL (fleet.rs)",
    ),
    (
        "agentjail 0.1.0 (commit 09bca96, 2026-12-03, x86_64-unknown-linux-musl)",
        "what `agentjail --version` prints, not a command (release.rs checks it)",
    ),
    (
        "agentjail serve --config /etc/agentjail/config.toml --data-dir /var/lib/agentjail",
        "the Debian unit's ExecStart (ci/release/check.sh verifies the unit)",
    ),
    (
        "agentjail audit verify audit.jsonl",
        "verifies a PostgreSQL export (postgres.rs exports and verifies one)",
    ),
    (
        "npx @modelcontextprotocol/inspector",
        "the unpinned command docs/mcp.md warns against",
    ),
];

/// Why a command named in prose is not run here, by what it starts with; None: it must be
/// run or listed.
fn prose_skip_by_kind(cmd: &str) -> Option<&'static str> {
    const KINDS: &[(&[&str], &str)] = &[
        (
            &["cargo test"],
            "a test-suite command: .ci/run runs `cargo test --workspace`",
        ),
        (
            &[
                "cargo build",
                "cargo run",
                "cargo install",
                "cargo fuzz",
                "cargo +nightly",
            ],
            "builds agentjail: .ci/run builds it (ci/release the release build)",
        ),
        (
            &[
                "sudo ",
                "apt-get ",
                "apt ",
                "pip ",
                "python3 -m pip",
                "npm ci",
                "kubectl ",
                "systemctl ",
                "docker ",
            ],
            "changes the machine (packages, kernel settings, a cluster); .ci/run installs what the tests need",
        ),
    ];
    if cmd.contains('…')
        || cmd.contains("...")
        || (cmd.contains('<') && cmd.contains('>'))
        || cmd
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == '='))
            .any(|w| {
                w.len() >= 3
                    && !w.starts_with('$')
                    && !w.contains('=')
                    && w.chars().all(|c| c.is_ascii_uppercase() || c == '_')
            })
    {
        return Some("a synopsis with placeholders, not a command to type as is");
    }
    KINDS
        .iter()
        .find(|(starts, _)| starts.iter().any(|s| cmd.starts_with(s)))
        .map(|(_, why)| *why)
}

/// Every command that the prose of a page tells a reader to type is run: by a console block
/// (the span is part of one of their commands), or here ([`PROSE_RUN`]); or it says why not,
/// by its kind (a placeholder, a build, a package install, the test suite) or in
/// [`PROSE_SKIP`]. A new one fails this test until it is given one of these; an entry that
/// no page names any more fails it too.
#[test]
fn every_command_named_in_prose_is_run_or_says_why_not() {
    if !have("bash") {
        assert!(std::env::var_os("CI").is_none(), "CI must install bash");
        eprintln!("SKIP: needs bash");
        return;
    }
    let mut parsed = Parsed::default();
    let mut named = Vec::new();
    for f in doc_files() {
        let name = f.strip_prefix(repo()).unwrap_or(&f).display().to_string();
        let text = std::fs::read_to_string(&f).unwrap();
        parse(&name, &text, &mut parsed);
        named.extend(prose_commands(&name, &text));
    }
    let run_text: Vec<&str> = parsed
        .run
        .iter()
        .flat_map(|b| b.cmds.iter().map(|c| c.text.as_str()))
        .collect();
    let mut unexplained = Vec::new();
    let mut to_run: Vec<&str> = Vec::new();
    for (f, line, cmd) in &named {
        if run_text.iter().any(|t| t.contains(cmd.as_str())) {
            continue;
        }
        if let Some(r) = PROSE_RUN.iter().find(|r| **r == cmd) {
            if !to_run.contains(r) {
                to_run.push(r);
            }
            continue;
        }
        if let Some((_, why)) = PROSE_SKIP.iter().find(|(c, _)| c == cmd) {
            eprintln!("not run {f}:{line}: `{cmd}`: {why}");
            continue;
        }
        if let Some(why) = prose_skip_by_kind(cmd) {
            eprintln!("not run {f}:{line}: `{cmd}`: {why}");
            continue;
        }
        unexplained.push(format!("{f}:{line}: `{cmd}`"));
    }
    assert!(
        unexplained.is_empty(),
        "commands in the prose that no test runs and that give no reason (run them in PROSE_RUN, or give the reason in PROSE_SKIP, in crates/cli/tests/docs.rs):\n{}",
        unexplained.join("\n")
    );
    let stale: Vec<&str> = PROSE_RUN
        .iter()
        .copied()
        .chain(PROSE_SKIP.iter().map(|(c, _)| *c))
        .filter(|c| !named.iter().any(|(_, _, n)| n == c))
        .collect();
    assert!(stale.is_empty(), "no page names these any more: {stale:?}");
    // Run them, each as a console block of its own in a folder as a user has it.
    let dir = workdir();
    let home = homedir();
    let block = Block {
        file: "prose".into(),
        line: 0,
        cmds: to_run
            .iter()
            .map(|c| Cmd {
                text: c.to_string(),
                expected: "...\n".into(),
                status: 0,
                line: 0,
            })
            .collect(),
        twice: false,
    };
    let results = tempfile::tempdir().unwrap();
    let got = run_block(&block, dir.path(), home.path(), results.path());
    let failures = check(&block, &got, "");
    assert!(
        failures.is_empty(),
        "commands named in prose fail:\n\n{}",
        failures.join("\n\n")
    );
    for c in &to_run {
        eprintln!("ran (named in prose): `{c}`");
    }
}

/// The demo embeds this manifest: a fixed expiry would break `agentjail demo` (and every block
/// above that runs it) on that day.
#[test]
fn the_example_manifest_carries_no_expiry() {
    let m = agentjail_manifest::Manifest::load(&repo().join("examples/csv-summary/manifest.yaml"))
        .unwrap();
    assert_eq!(m.expires_at, None);
}
