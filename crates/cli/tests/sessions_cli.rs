//! `agentjail session start|exec|ls|stop` (issue #34, docs/sessions-cli.md) through the real
//! binary: cells share `/work` (a file written by one is read by the next) and exit as `run`
//! does; a process of another uid that reaches the owner's socket (the directory's and the
//! socket's permissions weakened on purpose) is refused by the daemon's SO_PEERCRED check, and
//! its request does nothing; `stop` leaves no daemon process and no socket, and a cell of a
//! stopped session is refused with exit 125 and one line; every bad input is one line, 125.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::{Out, agentjail, skip};

use std::path::{Path, PathBuf};

/// A state directory whose daemon is stopped (`stop --all`) when the test ends, pass or fail.
struct State {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
}

impl State {
    fn new() -> State {
        let tmp = common::tmp();
        let dir = tmp.path().join("state");
        State { _tmp: tmp, dir }
    }

    fn run(&self, args: &[&str]) -> Out {
        let mut a: Vec<&str> = args.to_vec();
        a.extend(["--state-dir", self.dir.to_str().unwrap()]);
        agentjail(&a)
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("daemon.sock")
    }

    fn start(&self) -> String {
        let o = self.run(&["session", "start"]);
        assert_eq!(o.code, 0, "{}", o.dump());
        let id = o.stdout.trim().to_string();
        assert!(id.starts_with("ses_") && id.len() == 36, "{}", o.dump());
        id
    }

    /// The processes whose command line names this state directory (the daemon's does).
    fn daemons(&self) -> Vec<i32> {
        daemons_of(&self.dir)
    }
}

impl Drop for State {
    fn drop(&mut self) {
        let _ = self.run(&["session", "stop", "--all"]);
    }
}

fn daemons_of(dir: &Path) -> Vec<i32> {
    let needle = dir.to_str().unwrap();
    common::cmdlines(|c| c.contains("session daemon") && c.contains(needle))
        .into_iter()
        .map(|(p, _)| p)
        .collect()
}

fn one_line_error(o: &Out, needle: &str) {
    assert_eq!(o.code, 125, "{}", o.dump());
    let lines: Vec<&str> = o.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {}", o.dump());
    assert!(lines[0].starts_with("agentjail: error: "), "{}", o.dump());
    assert!(o.stderr.contains(needle), "{needle:?} in {}", o.dump());
    assert!(!o.stderr.contains("panicked"), "{}", o.dump());
}

#[test]
fn cells_share_work_and_stop_leaves_nothing_running() {
    let s = State::new();
    let id = s.start();
    // The directory is private; the socket is the owner's only.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&s.dir), 0o700);
    assert_eq!(mode(&s.socket()), 0o600);
    assert_eq!(s.daemons().len(), 1, "one daemon");

    let w = s.run(&[
        "session",
        "exec",
        &id,
        "-c",
        "open('/work/note', 'w').write('kept-between-cells'); print('wrote')",
    ]);
    assert_eq!(w.code, 0, "{}", w.dump());
    assert_eq!(w.stdout, "wrote\n");
    // A file as the cell's code; the cell's own exit status and streams come through.
    let f = s._tmp.path().join("cell.py");
    std::fs::write(
        &f,
        "import sys\nprint(open('/work/note').read())\nprint('to stderr', file=sys.stderr)\nsys.exit(3)\n",
    )
    .unwrap();
    let r = s.run(&["session", "exec", &id, f.to_str().unwrap()]);
    assert_eq!(r.code, 3, "{}", r.dump());
    assert_eq!(r.stdout, "kept-between-cells\n", "{}", r.dump());
    assert!(r.stderr.contains("to stderr"), "{}", r.dump());
    // A second session of the same daemon has its own /work.
    let other = s.start();
    assert_ne!(other, id);
    assert_eq!(s.daemons().len(), 1, "the daemon is reused");
    let o = s.run(&[
        "session",
        "exec",
        &other,
        "-c",
        "import os; print(os.path.exists('/work/note'))",
    ]);
    assert_eq!(o.stdout, "False\n", "{}", o.dump());
    let ls = s.run(&["session", "ls"]);
    assert!(
        ls.stdout.contains(&id) && ls.stdout.contains(&other),
        "{}",
        ls.dump()
    );

    // Stopping one: its cells are refused while the daemon serves the other.
    let st = s.run(&["session", "stop", &id]);
    assert_eq!(st.code, 0, "{}", st.dump());
    let gone = s.run(&["session", "exec", &id, "-c", "print(1)"]);
    one_line_error(&gone, "no such session");
    assert_eq!(s.daemons().len(), 1);
    // Stopping the last: no daemon, no socket; a cell is then refused, 125.
    let st = s.run(&["session", "stop", &other]);
    assert_eq!(st.code, 0, "{}", st.dump());
    assert!(!s.socket().exists(), "the socket is removed");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !s.daemons().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon is still running: {:?}",
            s.daemons()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The workspaces' checkpoints are gone with the sessions.
    let kept: Vec<_> = std::fs::read_dir(s.dir.join("data/checkpoints"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(kept.is_empty(), "checkpoints left: {kept:?}");
    let late = s.run(&["session", "exec", &other, "-c", "print(1)"]);
    one_line_error(&late, "no session daemon is running");
}

#[test]
fn another_uid_is_refused_by_peer_credentials() {
    if !common::is_root() {
        skip("needs root to act as a second uid (setpriv --reuid 65534)");
        return;
    }
    let s = State::new();
    let id = s.start();
    // Weakened on purpose: uid 65534 can now reach and write to the socket.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&s.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(s.socket(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let req = serde_json::json!({
        "op": "cell", "session_id": id,
        "code": "open('/work/intruder', 'w').write('x')"
    });
    // The daemon may answer and close before reading the request: a broken pipe on the
    // write is expected then, and the answer is still there to read.
    let client = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\ntry:\n    s.sendall(sys.argv[2].encode() + b'\\n')\nexcept BrokenPipeError:\n    pass\nprint(s.makefile().readline(), end='')\n";
    // The system's python3 (a user's pyenv shim under /root is not the second uid's to run).
    let o = common::nobody_running("/usr/bin/python3")
        .args(["-c", client])
        .arg(s.socket())
        .arg(req.to_string())
        .output()
        .expect("setpriv runs");
    let o = Out::from(o);
    assert_eq!(o.code, 0, "the second uid reached the socket: {}", o.dump());
    let answer: serde_json::Value =
        serde_json::from_str(o.stdout.trim()).unwrap_or_else(|_| panic!("{}", o.dump()));
    assert_eq!(answer["ok"], false, "{answer}");
    assert_eq!(answer["error"], "forbidden", "{answer}");
    assert!(
        answer["detail"]
            .as_str()
            .unwrap()
            .contains("the connection from uid 65534 was refused (SO_PEERCRED)"),
        "{answer}"
    );
    // Its request did nothing: the owner's session has no such file and no cell ran.
    let c = s.run(&[
        "session",
        "exec",
        &id,
        "-c",
        "import os; print(os.path.exists('/work/intruder'))",
    ]);
    assert_eq!(c.stdout, "False\n", "{}", c.dump());
    let ls = s.run(&["session", "ls"]);
    assert!(ls.stdout.contains("\t1 cell(s)"), "{}", ls.dump());
}

#[test]
fn bad_inputs_are_one_line_errors() {
    let s = State::new();
    // No daemon yet.
    one_line_error(
        &s.run(&["session", "exec", "ses_0", "-c", "print(1)"]),
        "no session daemon is running",
    );
    one_line_error(
        &s.run(&[
            "session",
            "start",
            "--config",
            "/nonexistent.toml",
            "--task",
            "x",
        ]),
        "--config /nonexistent.toml",
    );
    let id = s.start();
    one_line_error(
        &s.run(&["session", "exec", &id, "/nonexistent/cell.py"]),
        "cannot read the code from /nonexistent/cell.py",
    );
    one_line_error(&s.run(&["session", "exec", &id]), "no code");
    let unknown = format!("ses_{}", "0".repeat(32));
    one_line_error(
        &s.run(&["session", "exec", &unknown, "-c", "print(1)"]),
        "no such session",
    );
    one_line_error(&s.run(&["session", "stop", &unknown]), "no such session");
    // An unknown task of the built-in configuration.
    one_line_error(&s.run(&["session", "start", "--task", "nope"]), "nope");
    // Code from stdin.
    let mut c = std::process::Command::new(common::bin());
    c.args(["session", "exec", &id, "-", "--state-dir"])
        .arg(&s.dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"print(6 * 7)\n")
        .unwrap();
    let o = Out::from(child.wait_with_output().unwrap());
    assert_eq!((o.code, o.stdout.as_str()), (0, "42\n"), "{}", o.dump());
    let st = s.run(&["session", "stop", "--all"]);
    assert_eq!(st.code, 0, "{}", st.dump());
    assert!(!s.socket().exists());
}

/// A task of the user's configuration (`--config FILE --task NAME`), whose time limit makes a
/// cell exit 124 as `run` does; the running daemon refuses a session of another
/// configuration, in one line.
#[test]
fn a_task_of_a_configuration_file_and_one_daemon_per_configuration() {
    use common::serve::{actor, python_code_task, write_config};
    let s = State::new();
    let cfg = write_config(
        s._tmp.path(),
        &format!(
            "[tenants.acme]\n{}{}{}",
            actor("alice", "acme", "tok-alice-sessions-cli-4b1d", false),
            python_code_task("py", "Python", "allowed_actors = [\"alice\"]", 20),
            python_code_task("quick", "Python", "allowed_actors = [\"alice\"]", 1)
        ),
    );
    let o = s.run(&[
        "session",
        "start",
        "--config",
        cfg.to_str().unwrap(),
        "--task",
        "py",
    ]);
    assert_eq!(o.code, 0, "{}", o.dump());
    let id = o.stdout.trim().to_string();
    let c = s.run(&[
        "session",
        "exec",
        &id,
        "-c",
        "import json; print('from py'); json.dump({}, open('/output/o.json', 'w'))",
    ]);
    assert_eq!(
        (c.code, c.stdout.as_str()),
        (0, "from py\n"),
        "{}",
        c.dump()
    );
    // The time limit: 124, as `run`, with the cause on stderr.
    let quick = s.run(&[
        "session",
        "start",
        "--config",
        cfg.to_str().unwrap(),
        "--task",
        "quick",
    ]);
    assert_eq!(quick.code, 0, "{}", quick.dump());
    let q = quick.stdout.trim().to_string();
    let t = s.run(&["session", "exec", &q, "-c", "import time; time.sleep(30)"]);
    assert_eq!(t.code, 124, "{}", t.dump());
    assert!(t.stderr.contains(": timeout"), "{}", t.dump());
    one_line_error(&s.run(&["session", "start"]), "config-mismatch");
    let st = s.run(&["session", "stop", &q]);
    assert_eq!(st.code, 0, "{}", st.dump());
    let st = s.run(&["session", "stop", &id]);
    assert_eq!(st.code, 0, "{}", st.dump());
    assert!(!s.socket().exists());
}
