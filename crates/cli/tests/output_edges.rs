//! Edges of what comes out of a run: the /output byte bound at its boundary (issue 12 item 7),
//! reports under a flood of refusals (item 8), and the caller's terminal (item 9).
//!
//! Every test runs the real `agentjail` binary with a probe inside the sandbox that prints a
//! sentinel (`WROTE …`, `FLOOD-DONE …`), so "refused by us" cannot pass for "failed anyway".
//! The terminal tests put agentjail on a real pty (`script` from util-linux) and look at the
//! bytes that reached it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::{bin, skip, tmp};

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const PY: &str = "/usr/bin/python3";
const MIB: u64 = 1024 * 1024;

struct Out {
    code: i32,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    report: Value,
    report_bytes: usize,
    elapsed: Duration,
}

impl Out {
    fn status(&self) -> &str {
        self.report["status"].as_str().unwrap_or("")
    }
    fn dump(&self) -> String {
        format!(
            "exit {}\n--- stdout\n{}\n--- stderr\n{}\n--- report\n{}",
            self.code,
            String::from_utf8_lossy(&self.stdout),
            String::from_utf8_lossy(&self.stderr),
            self.report
        )
    }
    fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    fn files(&self) -> Vec<(String, u64)> {
        self.report["output"]["files"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|f| {
                        (
                            f["path"].as_str().unwrap_or("").to_string(),
                            f["bytes"].as_u64().unwrap_or(0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
    fn rejected(&self, path: &str) -> Option<String> {
        self.report["output"]["rejected"].as_array().and_then(|a| {
            a.iter()
                .find(|r| r["path"] == path)
                .map(|r| r["reason"].as_str().unwrap_or("").to_string())
        })
    }
}

/// `agentjail run --report R --output-dir D ARGS… -- /bin/sh -c SCRIPT`.
fn run_sh(work: &Path, args: &[&str], script: &str) -> Out {
    run(work, args, &["/bin/sh", "-c", script])
}

fn run(work: &Path, args: &[&str], command: &[&str]) -> Out {
    let report = work.join("report.json");
    let out_dir = work.join("out");
    let _ = std::fs::remove_file(&report);
    let _ = std::fs::remove_dir_all(&out_dir);
    let mut cmd = Command::new(bin());
    cmd.arg("run")
        .arg("--report")
        .arg(&report)
        .arg("--output-dir")
        .arg(&out_dir)
        .args(args);
    if !command.is_empty() {
        cmd.arg("--").args(command);
    }
    let t = Instant::now();
    let o = cmd
        .env_remove("XDG_DATA_HOME")
        .env_remove("AGENTJAIL_IMAGE_STORE")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let elapsed = t.elapsed();
    let raw = std::fs::read(&report).unwrap_or_default();
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: o.stdout,
        stderr: o.stderr,
        report: serde_json::from_slice(&raw).unwrap_or(Value::Null),
        report_bytes: raw.len(),
        elapsed,
    }
}

// ---------------------------------------------------------------------------------------------
// Item 7: "at most N MiB" means at most N MiB of file bytes.
// ---------------------------------------------------------------------------------------------

#[test]
fn output_of_exactly_the_limit_passes() {
    let w = tmp();
    let o = run_sh(
        w.path(),
        &["--output-max-mb", "1"],
        "head -c 1048576 /dev/zero > /output/exact; echo WROTE $?",
    );
    assert!(o.stdout_str().contains("WROTE 0"), "{}", o.dump());
    assert_eq!(o.status(), "ok", "{}", o.dump());
    assert_eq!(o.code, 0);
    assert_eq!(o.files(), vec![("exact".to_string(), MIB)], "{}", o.dump());
    assert_eq!(
        std::fs::metadata(w.path().join("out/exact")).unwrap().len(),
        MIB
    );
}

#[test]
fn two_files_summing_to_just_under_the_limit_pass() {
    let w = tmp();
    let o = run_sh(
        w.path(),
        &["--output-max-mb", "1"],
        "head -c 524288 /dev/zero > /output/a && head -c 524287 /dev/zero > /output/b; echo WROTE $?",
    );
    assert!(o.stdout_str().contains("WROTE 0"), "{}", o.dump());
    assert_eq!(o.status(), "ok", "{}", o.dump());
    assert_eq!(
        o.files(),
        vec![("a".to_string(), 524_288), ("b".to_string(), 524_287)]
    );
}

#[test]
fn many_small_files_summing_to_the_limit_pass() {
    // 1024 files of 1 KiB: exactly 1 MiB of bytes, but 4 MiB of tmpfs pages.
    let w = tmp();
    let o = run_sh(
        w.path(),
        &["--output-max-mb", "1", "--timeout", "60"],
        "head -c 1024 /dev/zero > /tmp/k || exit 3; i=0; while [ $i -lt 1024 ]; do cp /tmp/k /output/f$i || exit 4; i=$((i+1)); done; echo WROTE $i",
    );
    assert!(o.stdout_str().contains("WROTE 1024"), "{}", o.dump());
    assert_eq!(o.status(), "ok", "{}", o.dump());
    let files = o.files();
    assert_eq!(files.len(), 1024);
    assert_eq!(files.iter().map(|f| f.1).sum::<u64>(), MIB);
}

#[test]
fn one_byte_over_the_limit_is_refused_by_the_collector() {
    let w = tmp();
    let o = run_sh(
        w.path(),
        &["--output-max-mb", "1"],
        "head -c 1048577 /dev/zero > /output/over; echo WROTE $?",
    );
    // The write itself succeeds (the tmpfs has headroom): the collector refuses the bytes.
    assert!(o.stdout_str().contains("WROTE 0"), "{}", o.dump());
    assert_eq!(o.status(), "output_rejected", "{}", o.dump());
    assert_eq!(o.code, 65);
    assert!(o.files().is_empty(), "{}", o.dump());
    let reason = o.rejected("over").unwrap_or_default();
    assert!(
        reason.contains("exceeds its limit of 1048576 bytes"),
        "{}",
        o.dump()
    );
    assert!(!w.path().join("out/over").exists());

    // Split over two files: the sum is bounded, not each file.
    let o = run_sh(
        w.path(),
        &["--output-max-mb", "1"],
        "head -c 524288 /dev/zero > /output/a && head -c 524289 /dev/zero > /output/b; echo WROTE $?",
    );
    assert!(o.stdout_str().contains("WROTE 0"), "{}", o.dump());
    assert_eq!(o.status(), "output_rejected", "{}", o.dump());
    assert!(o.rejected("b").is_some(), "{}", o.dump());
}

#[test]
fn headroom_is_bounded_and_filling_it_is_refused() {
    // The tmpfs is larger than the byte bound, but not unbounded: writing far past it fails in
    // the sandbox, and the run is refused.
    let w = tmp();
    let o = run_sh(
        w.path(),
        &["--output-max-mb", "1", "--memory-mb", "512"],
        "head -c 300000000 /dev/zero > /output/huge; echo WROTE $?; df -k /output | tail -1",
    );
    assert!(
        o.stdout_str().contains("WROTE 1"),
        "the write must hit the tmpfs's end: {}",
        o.dump()
    );
    assert_eq!(o.status(), "output_rejected", "{}", o.dump());
    assert!(o.files().is_empty());
}

#[test]
fn sparse_files_and_hard_links_are_still_refused() {
    let w = tmp();
    let o = run_sh(
        w.path(),
        &["--output-max-mb", "1"],
        "truncate -s 8M /output/sparse && head -c 10 /dev/zero > /output/a && ln /output/a /output/b; echo WROTE $?",
    );
    assert!(o.stdout_str().contains("WROTE 0"), "{}", o.dump());
    assert_eq!(o.status(), "output_rejected", "{}", o.dump());
    assert!(
        o.rejected("sparse")
            .unwrap_or_default()
            .contains("exceeds its limit of 1048576 bytes"),
        "{}",
        o.dump()
    );
    assert_eq!(o.rejected("a").as_deref(), Some("hard link refused"));
    assert_eq!(o.rejected("b").as_deref(), Some("hard link refused"));
    assert!(o.files().is_empty());
}

/// Whether `agentjail check` says the gVisor tier works here.
fn gvisor_available() -> bool {
    let Ok(out) = Command::new(bin()).args(["check", "--json"]).output() else {
        return false;
    };
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v["items"].as_array().is_some_and(|a| {
        a.iter()
            .any(|i| i["name"] == "gvisor tier" && i["ok"] == true)
    })
}

#[test]
fn gvisor_tier_passes_exactly_the_limit_and_refuses_one_byte_more() {
    if !gvisor_available() {
        skip("the gvisor tier is not available here (apt-get install runsc; root)");
        return;
    }
    let w = tmp();
    let o = run_sh(
        w.path(),
        &["--isolation", "gvisor", "--output-max-mb", "1"],
        "head -c 524288 /dev/zero > /output/a && head -c 524288 /dev/zero > /output/b; echo WROTE $?",
    );
    assert!(o.stdout_str().contains("WROTE 0"), "{}", o.dump());
    assert_eq!(o.status(), "ok", "{}", o.dump());
    assert_eq!(o.files().iter().map(|f| f.1).sum::<u64>(), MIB);
    let o = run_sh(
        w.path(),
        &["--isolation", "gvisor", "--output-max-mb", "1"],
        "head -c 1048577 /dev/zero > /output/over; echo WROTE $?",
    );
    assert!(o.stdout_str().contains("WROTE 0"), "{}", o.dump());
    assert_eq!(o.status(), "output_rejected", "{}", o.dump());
    assert!(
        o.rejected("over")
            .unwrap_or_default()
            .contains("exceeds its limit of 1048576 bytes"),
        "{}",
        o.dump()
    );
}

// ---------------------------------------------------------------------------------------------
// Item 8: reports stay bounded under a flood of refusals.
// ---------------------------------------------------------------------------------------------

/// Sum of `count` over the listed denials of `kind` (a denial without a count counts once).
fn counted(report: &Value, kind: &str) -> u64 {
    report["denials"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|d| d["kind"] == kind)
                .map(|d| d["count"].as_u64().unwrap_or(1))
                .sum()
        })
        .unwrap_or(0)
}

fn listed(report: &Value, kind: &str) -> usize {
    report["denials"]
        .as_array()
        .map(|a| a.iter().filter(|d| d["kind"] == kind).count())
        .unwrap_or(0)
}

const SYSCALL_FLOOD: &str = r#"
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
n = int(sys.argv[1])
refused = 0
for i in range(n):
    # ptrace(i, i, i, i): every call with different arguments, every one refused.
    if libc.syscall(101, i, i + 1, i + 2, i + 3) == -1 and ctypes.get_errno() == 1:
        refused += 1
print("FLOOD-DONE", refused, flush=True)
"#;

#[test]
fn a_flood_of_refused_syscalls_ends_with_a_bounded_counted_report() {
    let w = tmp();
    let n = 100_000u64;
    let o = run(
        w.path(),
        &["--timeout", "300"],
        &[PY, "-c", SYSCALL_FLOOD, &n.to_string()],
    );
    assert!(
        o.stdout_str().contains(&format!("FLOOD-DONE {n}")),
        "{}",
        o.dump()
    );
    assert_eq!(o.status(), "ok", "{}", o.dump());
    // One entry for ptrace, counting every refusal.
    assert_eq!(listed(&o.report, "syscall"), 1, "{}", o.report);
    assert_eq!(counted(&o.report, "syscall"), n, "{}", o.report);
    assert!(
        o.report_bytes < 64 * 1024,
        "report of {} bytes",
        o.report_bytes
    );
    let after = o
        .elapsed
        .saturating_sub(Duration::from_millis(o.report["wall_ms"].as_u64().unwrap()));
    eprintln!(
        "syscall flood: {n} refusals, run {:?}, after the command {after:?}, report {} bytes",
        o.elapsed, o.report_bytes
    );
    assert!(
        after < Duration::from_secs(20),
        "after-run work took {after:?}"
    );
}

const PROXY_FLOOD: &str = r#"
import socket, sys
n = int(sys.argv[1])
pat = b"HTTP/1.1 4"
answered = 0
i = 0
s = socket.create_connection(("127.0.0.1", 3128))
while i < n:
    batch = min(200, n - i)
    s.sendall(b"".join(b"GET http://h%d.flood.test/ HTTP/1.1\r\nHost: h%d.flood.test\r\n\r\n" % (j, j) for j in range(i, i + batch)))
    i += batch
    tail = b""
    want = answered + batch
    while answered < want:
        data = s.recv(1 << 16)
        if not data:
            print("CLOSED at", answered, flush=True)
            sys.exit(3)
        buf = tail + data
        answered += buf.count(pat)
        tail = buf[-(len(pat) - 1):]
print("FLOOD-DONE", answered, flush=True)
"#;

#[test]
fn a_flood_of_refused_proxy_requests_ends_with_a_bounded_counted_report() {
    let n = 20_000u64;
    let r = common::netns::in_netns(&[], move || {
        let w = tmp();
        let manifest = serde_json::json!({
            "command": [PY, "-c", PROXY_FLOOD, n.to_string()],
            "network": {"allow": [{"host": "allowed.test", "ports": [80]}]},
            "limits": {"seconds": 300, "network_connections": 10000},
        });
        let mpath = w.path().join("flood.json");
        std::fs::write(&mpath, manifest.to_string()).unwrap();
        let m = mpath.to_str().unwrap().to_string();
        let o = run(
            w.path(),
            &["--manifest", &m, "--egress-dns", "127.0.0.1:9"],
            &[],
        );
        assert!(
            o.stdout_str().contains(&format!("FLOOD-DONE {n}")),
            "{}",
            o.dump()
        );
        assert_eq!(o.status(), "ok", "{}", o.dump());
        let dropped = o.report["denials_dropped"].as_u64().unwrap_or(0);
        let listed_net = listed(&o.report, "network");
        assert!(
            (1..=256).contains(&listed_net),
            "{listed_net} network denials listed"
        );
        assert_eq!(
            counted(&o.report, "network") + dropped,
            n,
            "every refusal is counted, listed or dropped: {}",
            o.report["denials_dropped"]
        );
        assert!(dropped > 0);
        assert!(
            o.report_bytes < 256 * 1024,
            "report of {} bytes",
            o.report_bytes
        );
        let after = o
            .elapsed
            .saturating_sub(Duration::from_millis(o.report["wall_ms"].as_u64().unwrap()));
        eprintln!(
            "proxy flood: {n} refusals, run {:?}, after the command {after:?}, report {} bytes",
            o.elapsed, o.report_bytes
        );
        assert!(
            after < Duration::from_secs(20),
            "after-run work took {after:?}"
        );
    });
    let _ = r;
}

#[test]
fn later_kinds_of_denials_are_not_pushed_out_by_a_flood() {
    // A flood of output refusals (more distinct entries than the cap) must leave the syscall
    // refusal and the limit denial listed.
    let w = tmp();
    let o = run(
        w.path(),
        &["--timeout", "60"],
        &[
            PY,
            "-c",
            "import os, ctypes\nfor i in range(600): os.symlink('/etc/passwd', '/output/l%d' % i)\nctypes.CDLL(None).syscall(101, 0, 0, 0, 0)\nprint('FLOOD-DONE', flush=True)",
        ],
    );
    assert!(o.stdout_str().contains("FLOOD-DONE"), "{}", o.dump());
    assert_eq!(o.status(), "output_rejected", "{}", o.dump());
    assert_eq!(counted(&o.report, "syscall"), 1, "{}", o.report);
    assert!(listed(&o.report, "output") <= 256, "{}", o.report);
    let dropped = o.report["denials_dropped"].as_u64().unwrap_or(0);
    assert_eq!(counted(&o.report, "output") + dropped, 600, "{}", o.report);
    // The per-file list is bounded as well.
    let rejected = o.report["output"]["rejected"].as_array().unwrap().len();
    assert!(rejected <= 256, "{rejected} rejected entries listed");
}

// ---------------------------------------------------------------------------------------------
// Item 9: the caller's terminal is the caller's.
// ---------------------------------------------------------------------------------------------

/// What the sandbox writes: a window title, an OSC 52 clipboard write, a C1 CSI (as UTF-8 and
/// as a raw byte), a bidi override, a forged summary line, and a UTF-8 character split over two
/// writes (with a pause, so they reach agentjail as two reads).
const HOSTILE: &str = r"printf 'A\033]0;PWNED-TITLE\007B\n'; printf '\033]52;c;UFdORUQ=\007\n' >&2; printf 'C\302\2332J\233K\342\200\256D\n'; printf 'agentjail: run ended: ok\n' >&2; printf 'x\ragentjail: run ended: ok\n'; printf '\303'; sleep 0.3; printf '\251\tEND\n'; exit 3";

fn have_script() -> bool {
    Command::new("script")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Runs agentjail with stdout and stderr on a pty and returns every byte the pty showed.
fn on_pty(args: &[&str]) -> Vec<u8> {
    let mut line = shell_quote(bin().to_str().unwrap());
    for a in args {
        line.push(' ');
        line.push_str(&shell_quote(a));
    }
    let o = Command::new("script")
        .args(["-qfec", &line, "/dev/null"])
        .env_remove("XDG_DATA_HOME")
        .env_remove("AGENTJAIL_IMAGE_STORE")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    o.stdout
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

#[test]
fn control_sequences_from_the_sandbox_are_inert_on_a_terminal() {
    if !have_script() {
        skip("`script` (util-linux) is not installed");
        return;
    }
    let tty = on_pty(&["run", "--", "/bin/sh", "-c", HOSTILE]);
    let shown = String::from_utf8_lossy(&tty).into_owned();
    // Nothing of the sandbox's escape sequences reaches the terminal as such …
    for bad in [
        &b"\x1b]0;"[..],
        b"\x1b]52;",
        b"\x07",
        b"\xc2\x9b",
        b"\x9b",
        "\u{202e}".as_bytes(),
    ] {
        assert!(
            !contains(&tty, bad),
            "{bad:?} reached the terminal: {shown:?}"
        );
    }
    // … they are shown escaped, and text around them is kept.
    for shown_as in [
        r"A\x1b]0;PWNED-TITLE\x07B",
        r"\x1b]52;c;UFdORUQ=\x07",
        r"C\u{9b}2J\x9bK\u{202e}D",
    ] {
        assert!(shown.contains(shown_as), "{shown_as} not in {shown:?}");
    }
    // A UTF-8 character split across two reads arrives whole; tabs pass.
    assert!(shown.contains("é\tEND"), "{shown:?}");
    // The sandbox's imitation of our summary is marked as the sandbox's …
    assert!(
        shown.contains("[sandbox] agentjail: run ended: ok"),
        "{shown:?}"
    );
    assert!(
        shown.contains("x\r[sandbox] agentjail: run ended: ok"),
        "{shown:?}"
    );
    // … and no unmarked line on the terminal starts with it.
    for l in shown.split(['\n', '\r']) {
        assert!(
            !l.starts_with("agentjail:"),
            "forgeable line {l:?} in {shown:?}"
        );
    }
    // Our own line carries what the filtered sandbox cannot produce (an escape sequence),
    // exactly once, and says what really happened.
    assert_eq!(count(&tty, b"\x1b[7magentjail:\x1b[27m"), 1, "{shown:?}");
    assert!(
        shown.contains("\x1b[7magentjail:\x1b[27m run ended: exit_nonzero"),
        "{shown:?}"
    );
}

#[test]
fn what_reaches_the_terminal_byte_for_byte() {
    if !have_script() {
        skip("`script` (util-linux) is not installed");
        return;
    }
    // Red text, a bell, a window title; then our line, for `ok` too. The pty turns \n into \r\n.
    let tty = on_pty(&[
        "run",
        "--",
        "/bin/sh",
        "-c",
        r"printf 'a\033[31mb\007\n'; printf '\033]2;t\033\\\n' >&2",
    ]);
    let want: &[u8] =
        b"a\\x1b[31mb\\x07\r\n\\x1b]2;t\\x1b\\\r\n\x1b[7magentjail:\x1b[27m run ended: ok\r\n";
    assert_eq!(
        String::from_utf8_lossy(&tty),
        String::from_utf8_lossy(want),
        "bytes on the terminal"
    );
    assert_eq!(tty, want);
}

#[test]
fn our_summary_starts_on_its_own_line_on_a_terminal() {
    if !have_script() {
        skip("`script` (util-linux) is not installed");
        return;
    }
    // The sandbox leaves its last line open (and a carriage return) to glue our line to its text.
    let tty = on_pty(&[
        "run",
        "--",
        "/bin/sh",
        "-c",
        "printf 'FAKE: all good, ignore the rest --> '; printf 'X\r' >&2; exit 0",
    ]);
    let shown = String::from_utf8_lossy(&tty).into_owned();
    let ours = shown
        .find("\x1b[7magentjail:\x1b[27m run ended: ok")
        .unwrap_or_else(|| panic!("no summary in {shown:?}"));
    let before = &shown[..ours];
    assert!(before.ends_with('\n'), "our line is glued on: {shown:?}");
}

#[test]
fn raw_output_opts_out_on_a_terminal() {
    if !have_script() {
        skip("`script` (util-linux) is not installed");
        return;
    }
    let tty = on_pty(&[
        "run",
        "--raw-output",
        "--",
        "/bin/sh",
        "-c",
        r"printf 'A\033]0;T\007B\n'",
    ]);
    assert!(
        contains(&tty, b"A\x1b]0;T\x07B"),
        "{:?}",
        String::from_utf8_lossy(&tty)
    );
}

#[test]
fn output_to_a_pipe_stays_byte_exact() {
    let w = tmp();
    let o = run_sh(w.path(), &[], HOSTILE);
    assert_eq!(
        o.stdout,
        b"A\x1b]0;PWNED-TITLE\x07B\nC\xc2\x9b2J\x9bK\xe2\x80\xaeD\nx\ragentjail: run ended: ok\n\xc3\xa9\tEND\n"
            .to_vec(),
        "{}",
        o.dump()
    );
    assert!(
        o.stderr
            .starts_with(b"\x1b]52;c;UFdORUQ=\x07\nagentjail: run ended: ok\n"),
        "{}",
        o.dump()
    );
    assert_eq!(o.code, 3);
}

/// Delivery to a person: the output folder gets the mode `mkdir` gives under the caller's
/// umask and its files 0644, whether the staging folder itself becomes the output folder
/// (one file at the top level, a folder that does not exist yet) or the files are moved one by
/// one (a subfolder; an output folder that exists already, whose mode is left alone). No
/// staging folder is left beside it either way.
#[test]
fn delivered_output_gets_the_umask_mode_and_no_staging_folder_is_left() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let work = tmp();
    let out = work.path().join("out");
    let staging_left = || -> Vec<String> {
        std::fs::read_dir(work.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".agentjail-staging-"))
            .collect()
    };
    let run_umask = |umask: &str, script: &str| {
        let report = work.path().join("report.json");
        let o = Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("umask {umask}; exec \"$0\" \"$@\""))
            .arg(bin())
            .arg("run")
            .arg("--report")
            .arg(&report)
            .arg("--output-dir")
            .arg(&out)
            .args(["--", "/bin/sh", "-c", script])
            .env_remove("XDG_DATA_HOME")
            .env_remove("AGENTJAIL_IMAGE_STORE")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        assert_eq!(
            report["status"],
            "ok",
            "{report}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    // One file, a new folder: the staging folder is renamed into place.
    for (umask, want) in [("027", 0o750), ("022", 0o755), ("077", 0o700)] {
        let _ = std::fs::remove_dir_all(&out);
        run_umask(umask, "echo one > /output/a.txt");
        assert_eq!(mode(&out), want, "umask {umask}");
        assert_eq!(mode(&out.join("a.txt")), 0o644, "umask {umask}");
        assert_eq!(std::fs::read_to_string(out.join("a.txt")).unwrap(), "one\n");
        assert!(staging_left().is_empty(), "{:?}", staging_left());
    }
    // A subfolder: file by file, folders made under the umask.
    let _ = std::fs::remove_dir_all(&out);
    run_umask(
        "027",
        "mkdir /output/d && echo two > /output/d/b.txt && echo one > /output/a.txt",
    );
    assert_eq!(mode(&out), 0o750);
    assert_eq!(mode(&out.join("d")), 0o750);
    assert_eq!(mode(&out.join("d").join("b.txt")), 0o644);
    assert_eq!(mode(&out.join("a.txt")), 0o644);
    assert!(staging_left().is_empty(), "{:?}", staging_left());
    // An output folder that exists already: its mode is the owner's business.
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o711)).unwrap();
    run_umask("022", "echo one > /output/a.txt");
    assert_eq!(mode(&out), 0o711);
    assert_eq!(mode(&out.join("a.txt")), 0o644);
    assert!(staging_left().is_empty(), "{:?}", staging_left());
}

/// A reader that leaves early (`agentjail run -- yes | head -1`, issue #31's "noticed"): the
/// relay of the command's stdout met EPIPE and kept reading and dropping, so `yes` ran until
/// the timeout. Now the relay closes its end of the command's pipe, the command gets SIGPIPE
/// as it would without agentjail in between, and the run ends at once: the report says the
/// command died by signal 13, not `timeout`; agentjail exits 141 (128 + SIGPIPE) like the
/// command would have, and prints nothing on the closed stdout.
#[test]
fn a_reader_that_leaves_ends_the_command_with_sigpipe_not_the_timeout() {
    let w = tmp();
    let report = w.path().join("report.json");
    let script = format!(
        "{} run --report {} --timeout 60 -- /usr/bin/yes | head -1; echo \"codes ${{PIPESTATUS[0]}} ${{PIPESTATUS[1]}}\"",
        bin().display(),
        report.display()
    );
    let o = Command::new("/bin/bash")
        .args(["-c", &script])
        .current_dir(w.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stdout.starts_with("y\n"), "{stdout}\n{stderr}");
    assert!(stdout.contains("codes 141 0"), "{stdout}\n{stderr}");
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_ne!(r["status"], "timeout", "{r}");
    assert_eq!(r["signal"], 13, "{r}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A reader that pauses (`| (sleep 6; cat)`) held the relay's blocking write, and with it the
/// supervisor's loop and the kill at the deadline: the payload ran on past its limit until the
/// reader came back (red team, with a runner whose log pipe a paused worker stopped reading).
/// The deadline is kept by a watchdog thread now: with a 2 s limit and the reader away for 6
/// s, the payload (marked in its command line) is gone from /proc 4.5 s after the start, and
/// the report says `timeout`.
#[test]
fn a_paused_reader_does_not_keep_the_payload_past_its_deadline() {
    let w = tmp();
    let report = w.path().join("report.json");
    // The payload ends as `sleep 3<this test's pid>` (a unique command line, killed anyway).
    let sleeper = format!("sleep 3{}", std::process::id());
    let script = format!(
        "{} run --report {} --timeout 2 -- /bin/sh -c 'head -c 300000 /dev/zero; exec {sleeper}' | (sleep 6; cat > /dev/null)",
        bin().display(),
        report.display()
    );
    let started = Instant::now();
    let mut child = Command::new("/bin/bash")
        .args(["-c", &script])
        .current_dir(w.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let alive = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| {
                    let c = String::from_utf8_lossy(&c).replace('\0', " ");
                    // The payload itself, not the shell or agentjail naming it.
                    c.trim_end() == sleeper
                        || (c.starts_with("/bin/sh -c head") && c.contains(&sleeper))
                })
                .unwrap_or(false)
        })
    };
    std::thread::sleep(Duration::from_millis(4500).saturating_sub(started.elapsed()));
    let alive_at_4_5 = alive();
    let _ = child.wait();
    assert!(
        !alive_at_4_5,
        "the payload outlived its 2 s limit while the reader was paused"
    );
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["status"], "timeout", "{r}");
}
