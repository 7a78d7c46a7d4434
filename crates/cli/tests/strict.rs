//! Strict mode on older kernels: the real `agentjail` binary, with the Landlock ABI capped by
//! the debug-only `AGENTJAIL_TEST_LANDLOCK_ABI` (the test binary is a debug build), runs probes
//! that attack every guarantee a strict run claims. A strict run must succeed on ABI 1–6 and
//! still refuse what it must; the report must name the rights applied and what covers the rest;
//! without Landlock (ABI 0) a strict run is refused.
//!
//! Sentinels: every probe ends with `PROBE-COMPLETE`; the write to `/proc/self/comm` (allowed by
//! the mounts, refused only by Landlock's file-system rights) proves Landlock was applied, and a
//! TCP connection inside the sandbox's own loopback (refused by Landlock from ABI 4 only) proves
//! the cap really took effect — so "refused by Landlock" cannot pass for "failed anyway".
//!
//! Also: user-namespace restrictions (AppArmor, Debian's sysctl) and the shipped AppArmor profile.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::{bin, is_root, skip, tmp};

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

const PY: &str = "/usr/bin/python3";
const CAP: &str = "AGENTJAIL_TEST_LANDLOCK_ABI";

/// The host kernel must offer at least ABI 6 for the cap to simulate every lower ABI.
fn kernel_abi() -> u32 {
    let o = Command::new(bin())
        .args(["check", "--json"])
        .env_remove(CAP)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let item = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "landlock")
        .cloned()
        .unwrap();
    let d = item["detail"].as_str().unwrap_or("");
    d.strip_prefix("ABI ")
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
    report: Value,
}

impl Out {
    fn probe(&self, name: &str) -> String {
        assert!(
            self.stdout.contains("PROBE-COMPLETE"),
            "probe did not complete\nstdout: {}\nstderr: {}\nreport: {}",
            self.stdout,
            self.stderr,
            self.report
        );
        let prefix = format!("RESULT {name} ");
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no result for {name} in {}", self.stdout))
            .to_string()
    }
}

/// Runs the probe body under `agentjail run` with the Landlock ABI capped at `abi`.
fn run_capped(work: &Path, abi: u32, body: &str, extra: &[&str]) -> Out {
    let src = format!(
        r#"import os, sys, socket, errno
def attempt(name, fn):
    try:
        fn()
        print("RESULT", name, "ok", flush=True)
    except OSError as e:
        print("RESULT", name, "errno=%d" % (e.errno or 0), flush=True)
{body}
print("PROBE-COMPLETE", flush=True)
"#
    );
    let n = std::fs::read_dir(work).unwrap().count();
    let probe = work.join(format!("probe-{n}.py"));
    std::fs::write(&probe, src).unwrap();
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o644)).unwrap();
    let report = work.join(format!("report-{n}.json"));
    let out = Command::new(bin())
        .env(CAP, abi.to_string())
        .arg("run")
        .arg("--report")
        .arg(&report)
        .args(extra)
        .arg("--ro")
        .arg(format!("{}:/input/probe.py", probe.display()))
        .args(["--", PY, "/input/probe.py"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let report = std::fs::read(&report)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        report,
    }
}

/// The attacks of every guarantee a strict run claims, against a host-side TCP listener and
/// abstract unix socket and a host file that was not given to the run.
fn attack_body(secret: &Path, tcp_port: u16, abstract_name: &str) -> String {
    format!(
        r#"
# file system: Landlock's fs rights are the only thing between the command and a write to the
# read-write /proc (sentinel that Landlock applied)
attempt("proc_write", lambda: open("/proc/self/comm", "w").write("x"))
attempt("host_file", lambda: open({secret:?}).read())
attempt("usr_write", lambda: open("/usr/agentjail-strict", "w"))
attempt("input_write", lambda: open("/input/probe.py", "a"))
attempt("etc_write", lambda: open("/etc/passwd", "a"))
# refer: a rename across directories where writing is allowed (ABI 1 refuses all of them)
os.makedirs("/work/a", exist_ok=True); os.makedirs("/work/b", exist_ok=True)
open("/work/a/f", "w").write("x")
attempt("rename_cross_dir", lambda: os.rename("/work/a/f", "/work/b/f"))
attempt("link_to_output", lambda: os.link("/work/b/f" if os.path.exists("/work/b/f") else "/work/a/f", "/output/f"))
# truncate outside the writable places (the probe's own read-only copy: harmless if it worked)
attempt("truncate_input", lambda: os.truncate("/input/probe.py", 0))
# network: the host's loopback (another namespace) and the sandbox's own loopback
def host_tcp():
    s = socket.socket(); s.settimeout(3); s.connect(("127.0.0.1", {tcp_port}))
attempt("host_tcp", host_tcp)
def own_tcp():
    l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(1)
    c = socket.socket(); c.settimeout(3); c.connect(l.getsockname())
attempt("own_tcp", own_tcp)
# abstract unix sockets: the host's (another network namespace) and one of our own
def host_abstract():
    s = socket.socket(socket.AF_UNIX); s.settimeout(3); s.connect("\0" + {abstract_name:?})
attempt("host_abstract", host_abstract)
def own_abstract():
    l = socket.socket(socket.AF_UNIX); l.bind("\0agentjail-own"); l.listen(1)
    c = socket.socket(socket.AF_UNIX); c.connect("\0agentjail-own")
attempt("own_abstract", own_abstract)
# device ioctls (Landlock ABI 5): crediting the entropy pool needs CAP_SYS_ADMIN; no tty
def rnd_credit():
    import fcntl, struct
    with open("/dev/urandom", "wb") as f:
        fcntl.ioctl(f, 0x40045201, struct.pack("i", 4096))  # RNDADDTOENTCNT
attempt("rnd_credit", rnd_credit)
attempt("dev_tty", lambda: open("/dev/tty", "wb"))
# signals: the init (pid 1) and a pid that cannot exist inside
import signal
attempt("signal_init", lambda: os.kill(1, signal.SIGTERM))
attempt("signal_outside", lambda: os.kill(4000000, 0))
"#
    )
}

/// Host-side targets for the probes; each records whether anything reached it.
struct Targets {
    _dir: tempfile::TempDir,
    secret: PathBuf,
    tcp: std::net::TcpListener,
    unix: std::os::unix::net::UnixListener,
    abstract_name: String,
}

impl Targets {
    fn new() -> Self {
        use std::os::linux::net::SocketAddrExt;
        let dir = tmp();
        let secret = dir.path().join("host-secret");
        std::fs::write(&secret, "HOST-SECRET").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        tcp.set_nonblocking(true).unwrap();
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let abstract_name = format!(
            "agentjail-strict-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let addr =
            std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap();
        let unix = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
        unix.set_nonblocking(true).unwrap();
        Targets {
            _dir: dir,
            secret,
            tcp,
            unix,
            abstract_name,
        }
    }
    fn body(&self) -> String {
        attack_body(
            &self.secret,
            self.tcp.local_addr().unwrap().port(),
            &self.abstract_name,
        )
    }
    /// Nothing from inside reached the host's listeners.
    fn assert_untouched(&self) {
        assert!(
            self.tcp.accept().is_err(),
            "a connection reached the host's TCP listener"
        );
        assert!(
            self.unix.accept().is_err(),
            "a connection reached the host's abstract socket"
        );
        let mut s = String::new();
        std::fs::File::open(&self.secret)
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        assert_eq!(s, "HOST-SECRET");
    }
}

const EACCES: &str = "errno=13";

/// A strict run on every ABI from 1 to 6 succeeds, refuses every attack, and reports the rights
/// applied and what covers the rest.
#[test]
fn strict_run_on_every_landlock_abi_refuses_what_it_must() {
    if kernel_abi() < 6 {
        return skip("the host kernel has Landlock ABI < 6: lower ABIs cannot all be simulated");
    }
    let t = Targets::new();
    let work = tmp();
    for abi in 1..=6u32 {
        let o = run_capped(work.path(), abi, &t.body(), &[]);
        let ctx = format!(
            "ABI {abi}\nstdout: {}\nstderr: {}\nreport: {}",
            o.stdout, o.stderr, o.report
        );
        assert_eq!(o.code, 0, "a strict run must succeed: {ctx}");
        assert_eq!(o.report["status"], "ok", "{ctx}");
        let iso = &o.report["isolation"];
        assert_eq!(iso["landlock_abi"], abi, "{ctx}");
        assert_eq!(iso["degraded"], serde_json::json!([]), "{ctx}");
        // The rights the report names are exactly those of the ABI applied.
        let want: Vec<&str> =
            ["fs", "refer", "truncate", "tcp", "ioctl_dev", "scope"][..abi as usize].to_vec();
        assert_eq!(iso["landlock_rights"], serde_json::json!(want), "{ctx}");
        let subs = iso["landlock_substitutes"].as_array().unwrap();
        assert_eq!(subs.len(), 6 - abi as usize, "{ctx}");
        if abi < 4 {
            assert!(
                subs.iter().any(|s| s.as_str().unwrap().starts_with("tcp")
                    && s.as_str().unwrap().contains("network namespace")),
                "{ctx}"
            );
        }
        // Landlock applied (sentinel): /proc is mounted read-write, only Landlock refuses this.
        assert_eq!(o.probe("proc_write"), EACCES, "{ctx}");
        assert_eq!(o.probe("host_file"), "errno=2", "{ctx}");
        let erofs_or_eacces = |r: String| r == "errno=30" || r == EACCES;
        assert!(erofs_or_eacces(o.probe("usr_write")), "{ctx}");
        assert!(erofs_or_eacces(o.probe("input_write")), "{ctx}");
        assert!(erofs_or_eacces(o.probe("etc_write")), "{ctx}");
        assert!(erofs_or_eacces(o.probe("truncate_input")), "{ctx}");
        // Refer: ABI 1 refuses every cross-directory rename (EXDEV); from ABI 2 it is allowed
        // within /work. A link into /output crosses mounts either way.
        let want_rename = if abi < 2 { "errno=18" } else { "ok" };
        assert_eq!(o.probe("rename_cross_dir"), want_rename, "{ctx}");
        assert_eq!(o.probe("link_to_output"), "errno=18", "{ctx}");
        // Network: the host's loopback is another namespace (refused by the namespace, and
        // from ABI 4 by Landlock first); the cap is real: below 4 the own loopback works.
        let host_tcp = o.probe("host_tcp");
        if abi < 4 {
            assert_eq!(host_tcp, "errno=111", "{ctx}");
            assert_eq!(o.probe("own_tcp"), "ok", "{ctx}");
        } else {
            assert_eq!(host_tcp, EACCES, "{ctx}");
            assert_eq!(o.probe("own_tcp"), EACCES, "{ctx}");
        }
        // Device ioctls: no capability for the entropy pool, no controlling terminal.
        assert_eq!(o.probe("rnd_credit"), "errno=1", "{ctx}");
        assert_eq!(o.probe("dev_tty"), "errno=6", "{ctx}");
        // Abstract sockets: the host's is in another network namespace at every ABI.
        assert_eq!(o.probe("host_abstract"), "errno=111", "{ctx}");
        assert_eq!(o.probe("own_abstract"), "ok", "{ctx}");
        // Signals: the init is another user (root mode) and no outside pid can be named.
        assert_eq!(o.probe("signal_init"), "errno=1", "{ctx}");
        assert_eq!(o.probe("signal_outside"), "errno=3", "{ctx}");
        t.assert_untouched();
    }
}

/// Without Landlock a strict run is refused with the reason; `--allow-degraded` runs on the
/// mount namespace alone and says so — and the probe shows what that costs (/proc writable).
#[test]
fn without_landlock_strict_is_refused_and_degraded_says_what_is_missing() {
    if kernel_abi() < 1 {
        return skip("no Landlock on this host");
    }
    let t = Targets::new();
    let work = tmp();
    let o = run_capped(work.path(), 0, &t.body(), &[]);
    assert_eq!(o.code, 125, "stdout: {}\nstderr: {}", o.stdout, o.stderr);
    assert!(!o.stdout.contains("PROBE-COMPLETE"), "nothing may run");
    assert!(
        o.stderr.contains("landlock") && o.stderr.contains("lsm="),
        "the reason and the fix: {}",
        o.stderr
    );

    let o = run_capped(work.path(), 0, &t.body(), &["--allow-degraded"]);
    let ctx = format!(
        "stdout: {}\nstderr: {}\nreport: {}",
        o.stdout, o.stderr, o.report
    );
    assert_eq!(o.code, 0, "{ctx}");
    let iso = &o.report["isolation"];
    assert_eq!(iso["landlock_abi"], Value::Null, "{ctx}");
    assert_eq!(iso["landlock_rights"], serde_json::json!([]), "{ctx}");
    assert!(
        iso["degraded"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d.as_str().unwrap().contains("landlock")),
        "{ctx}"
    );
    // The proof that Landlock really was absent, and what the mount namespace still holds.
    assert_eq!(o.probe("proc_write"), "ok", "{ctx}");
    assert_eq!(o.probe("host_file"), "errno=2", "{ctx}");
    assert_eq!(o.probe("usr_write"), "errno=30", "{ctx}");
    assert_eq!(o.probe("rnd_credit"), "errno=1", "{ctx}");
    assert_eq!(o.probe("dev_tty"), "errno=6", "{ctx}");
    assert_eq!(o.probe("host_tcp"), "errno=111", "{ctx}");
    assert_eq!(o.probe("host_abstract"), "errno=111", "{ctx}");
    t.assert_untouched();
}

/// `agentjail check` names the rights applied and what covers the rest, and the strict run it
/// makes succeeds on a capped ABI.
#[test]
fn check_names_landlock_rights_and_substitutes() {
    if kernel_abi() < 6 {
        return skip("the host kernel has Landlock ABI < 6");
    }
    let o = Command::new(bin())
        .env(CAP, "2")
        .args(["check", "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let items = v["items"].as_array().unwrap();
    let ll = items.iter().find(|i| i["name"] == "landlock").unwrap();
    let d = ll["detail"].as_str().unwrap();
    assert_eq!(ll["ok"], true, "{v}");
    assert!(d.starts_with("ABI 2 applied: rights fs, refer;"), "{d}");
    assert!(d.contains("tcp (Landlock ABI 4): network namespace"), "{d}");
    assert!(d.contains("scope (Landlock ABI 6): pid namespace"), "{d}");
    let strict = items.iter().find(|i| i["name"] == "strict run").unwrap();
    assert_eq!(strict["ok"], true, "{v}");

    let o = Command::new(bin())
        .env(CAP, "0")
        .args(["check", "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["strict_run_ok"], false, "{v}");
    assert_eq!(o.status.code(), Some(1));
}

/// As an ordinary user the init shares the command's uid, so below ABI 6 (no signal scoping)
/// the command may signal it. The init must survive every such signal and report the run
/// correctly; with ABI 6 the same signals are refused (EPERM), the proof the cap is real.
#[test]
fn unprivileged_command_signalling_the_init_below_abi_6_changes_nothing() {
    if kernel_abi() < 6 {
        return skip("the host kernel has Landlock ABI < 6");
    }
    if !is_root() || !Path::new("/usr/bin/setpriv").exists() {
        return skip("needs root and setpriv to become an ordinary user");
    }
    let work = tmp();
    let b = work.path().join("agentjail");
    std::fs::copy(bin(), &b).unwrap();
    std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = work.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(65534), Some(65534)).unwrap();
    let probe = work.path().join("sig.py");
    std::fs::write(
        &probe,
        r#"import os, signal, time
for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
          signal.SIGALRM, signal.SIGPIPE, signal.SIGSTOP, signal.SIGKILL):
    try:
        os.kill(1, s); r = "ok"
    except OSError as e:
        r = "errno=%d" % e.errno
    print("RESULT", s.name, r, flush=True)
time.sleep(0.3)
print("PROBE-COMPLETE", flush=True)
os._exit(7)
"#,
    )
    .unwrap();
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o644)).unwrap();
    for abi in [4u32, 6] {
        let report = home.join(format!("r{abi}.json"));
        let out = Command::new("/usr/bin/setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .env("HOME", &home)
            .env(CAP, abi.to_string())
            .arg(&b)
            .args(["run", "--allow-degraded", "--report"])
            .arg(&report)
            .arg("--ro")
            .arg(format!("{}:/input/sig.py", probe.display()))
            .args(["--", PY, "/input/sig.py"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap_or_default())
            .unwrap_or(Value::Null);
        let ctx = format!(
            "ABI {abi}\nstdout: {stdout}\nstderr: {}\nreport: {r}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("PROBE-COMPLETE"), "{ctx}");
        assert_eq!(out.status.code(), Some(7), "{ctx}");
        assert_eq!(r["exit_code"], 7, "{ctx}");
        assert_eq!(r["isolation"]["landlock_abi"], abi, "{ctx}");
        assert!(
            !r["isolation"]["degraded"]
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d.as_str().unwrap().contains("landlock")),
            "{ctx}"
        );
        let want = if abi < 6 { "ok" } else { "errno=1" };
        for s in ["SIGCHLD", "SIGTERM", "SIGKILL"] {
            assert!(stdout.contains(&format!("RESULT {s} {want}")), "{s}: {ctx}");
        }
    }
}

// --- hosts that restrict user namespaces -------------------------------------------------------

/// `user.max_user_namespaces=0` (per user namespace, so it can be set for this test alone, in a
/// user namespace of its own): the run cannot create its namespaces, and the one-line error
/// names the setting and the fix. Ubuntu's AppArmor restriction and Debian's sysctl cannot be
/// set on this kernel; `check.rs`'s unit tests cover them with a fake /proc/sys.
#[test]
fn max_user_namespaces_zero_is_named_with_its_fix_at_run_time() {
    if !Path::new("/usr/bin/unshare").exists() {
        return skip("unshare (util-linux) missing");
    }
    let script = format!(
        "echo 0 > /proc/sys/user/max_user_namespaces || exit 99; exec {} run -- /bin/true",
        bin().display()
    );
    let out = Command::new("/usr/bin/unshare")
        .args(["--user", "--map-root-user", "/bin/sh", "-c", &script])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(99) {
        return skip("cannot lower max_user_namespaces in a user namespace here");
    }
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains("user.max_user_namespaces=0")
            && stderr.contains("fix: sudo sysctl -w user.max_user_namespaces="),
        "{stderr}"
    );

    // And `check` names it too, with the same fix.
    let script = format!(
        "echo 0 > /proc/sys/user/max_user_namespaces || exit 99; exec {} check --json",
        bin().display()
    );
    let out = Command::new("/usr/bin/unshare")
        .args(["--user", "--map-root-user", "/bin/sh", "-c", &script])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let item = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "user namespaces")
        .cloned()
        .unwrap();
    assert_eq!(item["ok"], false, "{v}");
    assert!(
        item["detail"]
            .as_str()
            .unwrap()
            .contains("fix: sudo sysctl -w user.max_user_namespaces="),
        "{v}"
    );
}

/// The shipped AppArmor profile parses (`apparmor_parser -Q -K`: parse only, nothing loaded).
/// Debian 12's parser (AppArmor 3.0) knows neither `abi/4.0` nor the `userns` rule, which
/// Ubuntu's (4.x) has; there the profile is parsed with those two lines swapped for their 3.0
/// form, and the full profile is parsed where a 4.x parser is installed.
#[test]
fn apparmor_profile_parses() {
    let parser = Path::new("/usr/sbin/apparmor_parser");
    if !parser.exists() {
        return skip("apparmor_parser missing (apt-get install apparmor)");
    }
    let profile = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/apparmor/agentjail");
    let text = std::fs::read_to_string(&profile).unwrap();
    // The lines that make it work on Ubuntu: unconfined, user namespaces, the binary's path.
    for needle in [
        "abi <abi/4.0>,",
        "profile agentjail /usr/local/bin/agentjail flags=(unconfined) {",
        "\n  userns,\n",
    ] {
        assert!(text.contains(needle), "profile lacks {needle:?}");
    }
    let dir = tmp();
    let parse = |content: &str| {
        let p = dir.path().join("profile");
        std::fs::write(&p, content).unwrap();
        let o = Command::new(parser)
            .args(["-Q", "-K"])
            .arg(&p)
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let has_abi4 = Path::new("/etc/apparmor.d/abi/4.0").exists();
    let checked = if has_abi4 {
        text.clone()
    } else {
        eprintln!("note: AppArmor < 4 parser: checking the profile in its 3.0 form");
        text.replace("abi <abi/4.0>,", "abi <abi/3.0>,")
            .replace("\n  userns,\n", "\n")
    };
    let (ok, err) = parse(&checked);
    assert!(ok, "the profile does not parse: {err}");
    // The check can fail: the same profile without its closing brace does not parse.
    let (ok, _) = parse(&checked.replacen("\n}", "\n", 1));
    assert!(!ok, "apparmor_parser accepted a broken profile");
}
