//! Escape tests: the real `agentjail` binary runs probes that attack each layer from inside and
//! print what happened; each test asserts the denial *and* that the host saw no effect.
//!
//! Sentinels: every probe ends with `PROBE-COMPLETE`, so a probe that crashed early cannot pass
//! for one that was refused; every refused syscall must also appear in the report's `denials`
//! (only the seccomp listener puts it there), so "refused by us" differs from "failed anyway".
//!
//! Runs as root (CI) and repeats the core probes as an unprivileged user (uid 65534 through
//! setpriv) where the machine allows it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const PY: &str = "/usr/bin/python3";

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_agentjail"))
}

/// A world-readable temporary folder (the sandbox user is an unprivileged host uid).
fn tmp() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("agentjail-test-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

fn write(dir: &Path, name: &str, content: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    p
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
    report: Value,
}

impl Out {
    fn status(&self) -> &str {
        self.report["status"].as_str().unwrap_or("")
    }
    fn denied(&self, kind: &str, needle: &str) -> bool {
        self.report["denials"]
            .as_array()
            .map(|a| {
                a.iter().any(|d| {
                    d["kind"] == kind && d["detail"].as_str().unwrap_or("").contains(needle)
                })
            })
            .unwrap_or(false)
    }
    /// The probe's result for `name`, e.g. "ok" or "errno=13".
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

/// `agentjail run --report <work>/report-N.json`, ready for more arguments.
fn aj(work: &Path) -> (Command, PathBuf) {
    let report = work.join(format!("report-{}.json", rand_suffix()));
    let mut cmd = Command::new(bin());
    cmd.arg("run").arg("--report").arg(&report);
    (cmd, report)
}

fn run_raw(mut cmd: Command, report: &Path) -> Out {
    let out = cmd.stdin(Stdio::null()).output().expect("agentjail runs");
    let report = std::fs::read(report)
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

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// `agentjail run [extra] --ro probe.py:/input/probe.py -- python3 /input/probe.py`.
fn run_probe(work: &Path, probe: &str, extra: &[&str]) -> Out {
    let p = write(
        work,
        &format!("probe-{}.py", rand_suffix()),
        &probe_source(probe),
    );
    let (mut cmd, report) = aj(work);
    cmd.args(extra);
    cmd.arg("--ro")
        .arg(format!("{}:/input/probe.py", p.display()));
    cmd.args(["--", PY, "/input/probe.py"]);
    run_raw(cmd, &report)
}

/// Wraps a probe body with helpers: `attempt(name, fn)` prints `RESULT name ok|errno=N`.
fn probe_source(body: &str) -> String {
    format!(
        r#"import os, sys, socket, ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, fn):
    try:
        r = fn()
        print("RESULT", name, "ok", flush=True)
        return r
    except OSError as e:
        print("RESULT", name, "errno=%d" % (e.errno or 0), flush=True)
def sys_call(name, nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    e = ctypes.get_errno()
    print("RESULT", name, "ok" if r >= 0 else "errno=%d" % e, flush=True)
{body}
print("PROBE-COMPLETE", flush=True)
"#
    )
}

/// Forks children that sleep until fork fails; prints `RESULT fork errno=N` and `KIDS n`.
const FORK_PROBE: &str = r#"
import time
kids = 0
for i in range(200):
    try:
        if os.fork() == 0:
            time.sleep(30); os._exit(0)
        kids += 1
    except OSError as e:
        print("RESULT fork errno=%d" % e.errno, flush=True)
        break
print("KIDS", kids, flush=True)
"#;

// ---------------------------------------------------------------------------------------------

#[test]
fn csv_summary_produces_the_verified_artifact() {
    let work = tmp();
    let ex = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/csv-summary");
    for f in [
        "manifest.yaml",
        "report.csv",
        "summarize.py",
        "summary.schema.json",
    ] {
        let p = work.path().join(f);
        std::fs::copy(ex.join(f), &p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let csv_before = std::fs::read(work.path().join("report.csv")).unwrap();
    let out_dir = work.path().join("out");
    let (mut cmd, report) = aj(work.path());
    cmd.args(["--manifest"])
        .arg(work.path().join("manifest.yaml"))
        .arg("--output-dir")
        .arg(&out_dir);
    let o = run_raw(cmd, &report);
    assert_eq!(o.code, 0, "{}\n{}", o.stderr, o.report);
    assert_eq!(o.status(), "ok");
    let summary: Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["rows"], 8);
    assert_eq!(summary["numeric"]["units"]["sum"], 50.0);
    assert_eq!(o.report["output"]["files"][0]["path"], "summary.json");
    assert_eq!(o.report["isolation"]["seccomp"], true);
    assert!(
        o.report["manifest_digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    // Only the artifact was delivered, and the input is untouched.
    assert_eq!(std::fs::read_dir(&out_dir).unwrap().count(), 1);
    assert_eq!(
        std::fs::read(work.path().join("report.csv")).unwrap(),
        csv_before
    );
}

#[test]
fn unrelated_host_files_cannot_be_read() {
    let work = tmp();
    let canary = write(work.path(), "canary.txt", "CANARY-SECRET-7731");
    std::fs::set_permissions(&canary, std::fs::Permissions::from_mode(0o644)).unwrap();
    let body = format!(
        r#"
attempt("canary", lambda: open("{c}").read())
attempt("shadow", lambda: open("/etc/shadow").read())
attempt("root_home", lambda: os.listdir("/root"))
attempt("home", lambda: os.listdir("/home"))
attempt("host_proc_1_root", lambda: os.listdir("/proc/1/root/root"))
attempt("sys", lambda: os.listdir("/sys"))
attempt("var", lambda: os.listdir("/var"))
attempt("ssh_keys", lambda: os.listdir("/etc/ssh"))
attempt("ssl_private", lambda: os.listdir("/etc/ssl/private"))
print("ETC", sorted(os.listdir("/etc")))
"#,
        c = canary.display()
    );
    let o = run_probe(work.path(), &body, &[]);
    for name in [
        "canary",
        "shadow",
        "root_home",
        "home",
        "host_proc_1_root",
        "sys",
        "var",
        "ssh_keys",
        "ssl_private",
    ] {
        assert!(
            o.probe(name).starts_with("errno="),
            "{name} was readable: {}",
            o.stdout
        );
    }
    assert!(!o.stdout.contains("CANARY-SECRET-7731"));
    // The curated /etc holds only what the sandbox needs.
    let etc = o.stdout.lines().find(|l| l.starts_with("ETC")).unwrap();
    assert!(
        !etc.contains("shadow") && !etc.contains("ssh") && !etc.contains("sudoers"),
        "{etc}"
    );
}

#[test]
fn path_traversal_from_input_and_output_reaches_nothing() {
    let work = tmp();
    let data = work.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    write(&data, "a.csv", "x,y\n1,2\n");
    write(work.path(), "secret.txt", "TRAVERSAL-SECRET-4411");
    let body = r#"
attempt("input_up", lambda: open("/input/data/../../secret.txt").read())
attempt("input_up_deep", lambda: open("/input/data/../../../../../../etc/shadow").read())
attempt("output_up", lambda: open("/output/../../../../etc/shadow").read())
attempt("input_sibling", lambda: open("/input/data/../secret.txt").read())
attempt("proc_root_up", lambda: open("/proc/self/root/../../secret.txt").read())
attempt("own_input", lambda: open("/input/data/a.csv").read())
"#;
    let o = run_probe(
        work.path(),
        body,
        &["--ro", &format!("{}:/input/data", data.display())],
    );
    for name in [
        "input_up",
        "input_up_deep",
        "output_up",
        "input_sibling",
        "proc_root_up",
    ] {
        assert_eq!(o.probe(name), "errno=2", "{name}: {}", o.stdout);
    }
    assert_eq!(o.probe("own_input"), "ok");
    assert!(!o.stdout.contains("TRAVERSAL-SECRET"));
}

#[test]
fn symlink_planted_in_output_is_refused_and_host_file_untouched() {
    let work = tmp();
    let target = write(work.path(), "host-target.txt", "ORIGINAL");
    let before = std::fs::metadata(&target).unwrap().modified().unwrap();
    let out_dir = work.path().join("out");
    let body = format!(
        r#"
os.symlink("{t}", "/output/summary.json")
attempt("write_through_link", lambda: open("/output/summary.json", "w").write("PWNED"))
os.symlink("/etc/passwd", "/output/passwd")
open("/output/fine.txt", "w").write("fine")
"#,
        t = target.display()
    );
    let mut extra = vec!["--output-dir".to_string(), out_dir.display().to_string()];
    extra.push("--timeout".into());
    extra.push("10".into());
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let o = run_probe(work.path(), &body, &extra);
    // Inside, the link points at a path that does not exist in the sandbox.
    assert!(o.probe("write_through_link").starts_with("errno="));
    assert_eq!(o.code, 65, "{}", o.report);
    assert_eq!(o.status(), "output_rejected");
    assert!(
        o.denied("output", "summary.json: symlink refused"),
        "{}",
        o.report
    );
    assert!(o.denied("output", "passwd: symlink refused"));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "ORIGINAL");
    assert_eq!(
        std::fs::metadata(&target).unwrap().modified().unwrap(),
        before
    );
    // Only what passed was delivered.
    let delivered: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(delivered, vec!["fine.txt".to_string()]);
    assert!(std::fs::symlink_metadata(out_dir.join("summary.json")).is_err());
}

#[test]
fn network_to_host_loopback_and_dns_fail() {
    let work = tmp();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let body = format!(
        r#"
def tcp():
    s = socket.create_connection(("127.0.0.1", {port}), timeout=3)
    s.sendall(b"LEAK")
attempt("tcp_host_loopback", tcp)
attempt("dns", lambda: socket.getaddrinfo("example.com", 80))
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"LEAK", ("127.0.0.1", {port}))
    s.settimeout(1)
    s.recvfrom(10)
attempt("udp_loopback", udp)
def raw():
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
attempt("raw_icmp", raw)
def bind_tcp():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
attempt("tcp_listen", bind_tcp)
print("IFACES", sorted(os.listdir("/proc/sys/net/ipv4/conf")) if os.path.exists("/proc/sys/net/ipv4/conf") else [])
"#
    );
    let o = run_probe(work.path(), &body, &[]);
    // Landlock refuses the connect (EACCES) before the empty loopback could refuse it.
    assert_eq!(o.probe("tcp_host_loopback"), "errno=13", "{}", o.stdout);
    // getaddrinfo fails (EAI_* codes are negative): there is no name server to ask.
    assert!(o.probe("dns").starts_with("errno="), "{}", o.stdout);
    assert!(o.probe("udp_loopback").starts_with("errno="));
    assert!(o.probe("raw_icmp").starts_with("errno="));
    assert_eq!(o.probe("tcp_listen"), "errno=13");
    // The host listener saw nothing.
    assert!(listener.accept().is_err());
    let ifaces = o.stdout.lines().find(|l| l.starts_with("IFACES")).unwrap();
    assert!(
        !ifaces.contains("eth") && !ifaces.contains("ens"),
        "{ifaces}"
    );
}

#[test]
fn infinite_loop_ends_at_the_deadline() {
    let work = tmp();
    let t = Instant::now();
    let (mut cmd, report) = aj(work.path());
    cmd.args(["--timeout", "1", "--", PY, "-c", "while True: pass"]);
    let o = run_raw(cmd, &report);
    assert_eq!(o.code, 124, "{}", o.report);
    assert_eq!(o.status(), "timeout");
    assert!(o.denied("limit", "time"));
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(o.report["cpu_ms"].as_u64().unwrap() > 300, "{}", o.report);
}

#[test]
fn sigterm_ignoring_and_double_forked_children_do_not_outlive_the_run() {
    let work = tmp();
    let marker = format!("agentjail-daemon-{}", rand_suffix());
    // A daemon that double-forks, ignores SIGTERM and sleeps; the command itself exits at once.
    let script = format!(
        "trap '' TERM; (setsid sh -c 'trap \"\" TERM; exec -a {marker} sleep 300' &) ; exit 0"
    );
    let (mut cmd, report) = aj(work.path());
    cmd.args(["--timeout", "10", "--", "/bin/sh", "-c", &script]);
    let o = run_raw(cmd, &report);
    assert_eq!(o.code, 0, "{} {}", o.stderr, o.report);
    std::thread::sleep(Duration::from_millis(200));
    assert!(!any_process_named(&marker), "the daemon survived the run");

    // The same under a timeout: the command itself ignores SIGTERM and loops.
    let marker2 = format!("agentjail-loop-{}", rand_suffix());
    let script = format!(
        "trap '' TERM; (setsid sh -c 'exec -a {marker2} sleep 300' &); while :; do :; done"
    );
    let (mut cmd, report) = aj(work.path());
    cmd.args(["--timeout", "1", "--", "/bin/sh", "-c", &script]);
    let o = run_raw(cmd, &report);
    assert_eq!(o.code, 124);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !any_process_named(&marker2),
        "a process survived the timeout"
    );
}

fn any_process_named(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().any(|e| {
        let Ok(e) = e else { return false };
        let mut s = String::new();
        std::fs::File::open(e.path().join("cmdline"))
            .and_then(|mut f| f.read_to_string(&mut s))
            .is_ok()
            && s.contains(marker)
    })
}

#[test]
fn fork_bomb_is_held_by_the_pids_limit_and_the_host_stays_responsive() {
    let work = tmp();
    let body = FORK_PROBE;
    let t = Instant::now();
    let handle = {
        let work = work.path().to_owned();
        std::thread::spawn(move || run_probe(&work, body, &["--pids", "8", "--timeout", "10"]))
    };
    // While it runs, the host can still start processes promptly.
    std::thread::sleep(Duration::from_millis(300));
    let h = Instant::now();
    assert!(Command::new("/bin/true").status().unwrap().success());
    assert!(h.elapsed() < Duration::from_secs(2));
    let o = handle.join().unwrap();
    assert_eq!(o.probe("fork"), "errno=11", "{}", o.stdout);
    let kids: u32 = o
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("KIDS "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(kids < 8, "{kids} children under a limit of 8");
    assert!(o.denied("limit", "pids"), "{}", o.report);
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "the children outlived the command"
    );
}

#[test]
fn memory_hog_ends_with_memory_limit() {
    let work = tmp();
    let (mut cmd, report) = aj(work.path());
    cmd.args([
        "--memory-mb",
        "64",
        "--timeout",
        "20",
        "--",
        PY,
        "-c",
        "b = []\nwhile True: b.append(bytearray(8 << 20))",
    ]);
    let o = run_raw(cmd, &report);
    assert_eq!(o.status(), "memory_limit", "{} {}", o.stderr, o.report);
    assert_eq!(o.code, 137);
    assert!(o.denied("limit", "memory"));
    let peak = o.report["peak_memory_bytes"].as_u64().unwrap();
    assert!((48 << 20..=64 << 20).contains(&peak), "peak {peak}");
}

#[test]
fn oversized_output_is_refused() {
    let work = tmp();
    let out_dir = work.path().join("out");
    let (mut cmd, report) = aj(work.path());
    cmd.args(["--output-max-mb", "1", "--output-dir"])
        .arg(&out_dir)
        .args([
            "--",
            "/bin/sh",
            "-c",
            "head -c 3000000 /dev/zero > /output/big.bin; exit 0",
        ]);
    let o = run_raw(cmd, &report);
    assert_eq!(o.code, 65, "{}", o.report);
    assert_eq!(o.status(), "output_rejected");
    assert!(o.denied("output", "limit"), "{}", o.report);
    assert!(!out_dir.join("big.bin").exists());
}

#[test]
fn inputs_are_read_only() {
    let work = tmp();
    let data = write(work.path(), "data.csv", "a,b\n1,2\n");
    let body = r#"
attempt("append", lambda: open("/input/data.csv", "a").write("x"))
attempt("truncate", lambda: os.truncate("/input/data.csv", 0))
attempt("unlink", lambda: os.unlink("/input/data.csv"))
attempt("chmod", lambda: os.chmod("/input/data.csv", 0o777))
attempt("create_in_input", lambda: open("/input/new.txt", "w"))
attempt("create_in_root", lambda: open("/evil", "w"))
attempt("write_usr", lambda: open("/usr/bin/evil", "w"))
attempt("write_etc", lambda: open("/etc/passwd", "a"))
attempt("write_work", lambda: open("/work/fine.txt", "w").write("ok"))
attempt("write_tmp", lambda: open("/tmp/fine.txt", "w").write("ok"))
"#;
    let o = run_probe(
        work.path(),
        body,
        &["--ro", &format!("{}:/input/data.csv", data.display())],
    );
    for name in [
        "append",
        "truncate",
        "unlink",
        "chmod",
        "create_in_input",
        "create_in_root",
        "write_usr",
        "write_etc",
    ] {
        assert!(o.probe(name).starts_with("errno="), "{name}: {}", o.stdout);
    }
    assert_eq!(o.probe("write_work"), "ok");
    assert_eq!(o.probe("write_tmp"), "ok");
    assert_eq!(std::fs::read_to_string(&data).unwrap(), "a,b\n1,2\n");
}

#[test]
fn the_callers_environment_does_not_leak_in() {
    let work = tmp();
    let body = r#"
print("ENV", sorted(os.environ.items()))
attempt("init_environ", lambda: open("/proc/1/environ").read())
"#;
    let p = write(work.path(), "probe.py", &probe_source(body));
    let (mut cmd, report) = aj(work.path());
    cmd.env("AGENTJAIL_TEST_SECRET", "hunter2-SECRET-9981")
        .args(["--env", "GIVEN=yes", "--ro"])
        .arg(format!("{}:/input/probe.py", p.display()))
        .args(["--", PY, "/input/probe.py"]);
    let o = run_raw(cmd, &report);
    assert!(!o.stdout.contains("hunter2-SECRET-9981"), "{}", o.stdout);
    assert!(o.probe("init_environ").starts_with("errno="));
    let env = o.stdout.lines().find(|l| l.starts_with("ENV")).unwrap();
    assert!(
        env.contains("('GIVEN', 'yes')") && env.contains("('HOME', '/work')"),
        "{env}"
    );
    assert!(
        !env.contains("AGENTJAIL_TEST_SECRET") && !env.contains("CARGO"),
        "{env}"
    );
    // Nor does it reach the report.
    assert!(!o.report.to_string().contains("hunter2"));
}

#[test]
fn dangerous_syscalls_are_refused_and_reported() {
    let work = tmp();
    // x86_64 numbers; the filter matches them by number, the report by name.
    let body = r#"
sys_call("ptrace", 101, 16, 1, 0, 0)          # PTRACE_ATTACH pid 1
sys_call("mount", 165, 0, 0, 0, 0, 0)
sys_call("umount2", 166, 0, 0)
sys_call("unshare", 272, 0x10000000)          # CLONE_NEWUSER
sys_call("setns", 308, 0, 0)
sys_call("keyctl", 250, 0, 0, 0)
sys_call("add_key", 248, 0, 0, 0, 0, 0)
sys_call("bpf", 321, 0, 0, 0)
sys_call("perf_event_open", 298, 0, 0, 0, 0, 0)
sys_call("userfaultfd", 323, 0)
sys_call("io_uring_setup", 425, 1, 0)
sys_call("pivot_root", 155, 0, 0)
sys_call("open_by_handle_at", 304, 0, 0, 0)
sys_call("kexec_load", 246, 0, 0, 0, 0)
sys_call("clone_newns", 56, 0x00020000 | 17, 0, 0, 0, 0)   # clone(CLONE_NEWNS|SIGCHLD)
import fcntl, termios
attempt("tiocsti", lambda: fcntl.ioctl(0, termios.TIOCSTI, b"x"))
sys_call("getpid", 39)
"#;
    let o = run_probe(work.path(), body, &[]);
    for (name, report) in [
        ("ptrace", "ptrace"),
        ("mount", "mount"),
        ("umount2", "umount2"),
        ("unshare", "unshare"),
        ("setns", "setns"),
        ("keyctl", "keyctl"),
        ("add_key", "add_key"),
        ("bpf", "bpf"),
        ("perf_event_open", "perf_event_open"),
        ("userfaultfd", "userfaultfd"),
        ("io_uring_setup", "io_uring_setup"),
        ("pivot_root", "pivot_root"),
        ("open_by_handle_at", "open_by_handle_at"),
        ("kexec_load", "kexec_load"),
        ("clone_newns", "clone(namespace flags)"),
        ("tiocsti", "ioctl(TIOCSTI)"),
    ] {
        assert_eq!(o.probe(name), "errno=1", "{name}: {}", o.stdout);
        assert!(
            o.denied("syscall", report),
            "{report} not in denials: {}",
            o.report
        );
    }
    // Control: an ordinary syscall works and is not reported.
    assert_eq!(o.probe("getpid"), "ok");
    assert!(!o.denied("syscall", "getpid"));
    assert_eq!(o.code, 0);
}

#[test]
fn no_file_descriptor_of_ours_leaks_in() {
    let work = tmp();
    let body = r#"
print("FDS", sorted(int(x) for x in os.listdir("/proc/self/fd")))
print("CAPS", [l.strip() for l in open("/proc/self/status") if l.startswith(("Cap", "NoNewPrivs", "Seccomp:"))])
print("IDS", os.getuid(), os.getgid(), os.getgroups())
"#;
    let p = write(work.path(), "probe.py", &probe_source(body));
    // Launch agentjail with an inheritable descriptor open (fd 7 on a host file).
    let launcher = "import os, subprocess, sys\nfd = os.open('/etc/hostname', os.O_RDONLY)\nos.dup2(fd, 7)\nos.set_inheritable(7, True)\nsys.exit(subprocess.run(sys.argv[1:], pass_fds=[7]).returncode)\n".to_string();
    let l = write(work.path(), "launch.py", &launcher);
    let report = work.path().join("fd-report.json");
    let mut cmd = Command::new(PY);
    cmd.arg(&l)
        .arg(bin())
        .args(["run", "--report"])
        .arg(&report)
        .arg("--ro")
        .arg(format!("{}:/input/probe.py", p.display()))
        .args(["--", PY, "/input/probe.py"]);
    let o = run_raw(cmd, &report);
    assert!(
        o.stdout.contains("PROBE-COMPLETE"),
        "{} {}",
        o.stdout,
        o.stderr
    );
    let fds = o.stdout.lines().find(|l| l.starts_with("FDS")).unwrap();
    // 0, 1, 2 and the descriptor listdir itself holds.
    assert_eq!(fds, "FDS [0, 1, 2, 3]");
    let caps = o.stdout.lines().find(|l| l.starts_with("CAPS")).unwrap();
    for c in [
        "CapInh:\\t0000000000000000",
        "CapPrm:\\t0000000000000000",
        "CapEff:\\t0000000000000000",
        "CapBnd:\\t0000000000000000",
        "CapAmb:\\t0000000000000000",
        "NoNewPrivs:\\t1",
        "Seccomp:\\t2",
    ] {
        assert!(caps.contains(c), "{c} missing in {caps}");
    }
    assert!(o.stdout.contains("IDS 65534 65534"), "{}", o.stdout);
}

#[test]
fn exit_codes_follow_the_command_and_the_contract() {
    let work = tmp();
    let run = |args: &[&str]| {
        let (mut cmd, report) = aj(work.path());
        cmd.args(args);
        run_raw(cmd, &report)
    };
    let o = run(&["--", "/bin/sh", "-c", "exit 3"]);
    assert_eq!((o.code, o.status()), (3, "exit_nonzero"));
    assert_eq!(o.report["exit_code"], 3);
    let o = run(&["--", "/bin/sh", "-c", "kill -SEGV $$"]);
    assert_eq!((o.code, o.status()), (128 + 11, "signaled"));
    assert_eq!(o.report["signal"], 11);
    // A program that does not exist: setup_error, 125, a report, one line on stderr.
    let o = run(&["--", "/no/such/program"]);
    assert_eq!((o.code, o.status()), (125, "setup_error"), "{}", o.stderr);
    assert!(
        o.report["error"]
            .as_str()
            .unwrap()
            .contains("/no/such/program")
    );
    assert_eq!(o.stderr.trim().lines().count(), 1, "{}", o.stderr);
    // Bad arguments: 125 with a one-line error, no panic.
    let o = run(&["--timeout", "0", "--", "true"]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("limits.seconds"), "{}", o.stderr);
    assert_eq!(o.status(), "setup_error");
    let o = run(&["--bogus-flag"]);
    assert_eq!(o.code, 125);
    assert!(!o.stderr.contains("panicked"));
    let o = run(&["--ro", "/nonexistent/file", "--", "true"]);
    assert_eq!(o.code, 125);
}

#[test]
fn stdout_is_bounded_and_the_report_says_so() {
    let work = tmp();
    let (mut cmd, report) = aj(work.path());
    cmd.args([
        "--",
        "/bin/sh",
        "-c",
        "head -c 3000000 /dev/zero | tr '\\0' a; echo done >&2",
    ]);
    let o = run_raw(cmd, &report);
    assert_eq!(o.code, 0, "{}", o.report);
    assert_eq!(o.stdout.len(), 1 << 20);
    assert_eq!(o.report["stdout"]["truncated"], true);
    assert_eq!(o.report["stdout"]["bytes"], 3_000_000);
    assert_eq!(o.report["stderr"]["truncated"], false);
    assert!(o.stderr.contains("done"));
}

#[test]
fn each_run_has_its_own_host_uid_sees_its_cgroup_as_root_and_the_cgroup_is_cleaned_up() {
    let work = tmp();
    let report = work.path().join("report.json");
    // The caller's umask is 077; the command still gets the usual 022, and the root's
    // directories their exact modes.
    let child = Command::new("/bin/sh")
        .arg("-c")
        .arg(r#"umask 077; exec "$0" "$@""#)
        .arg(bin())
        .args(["run", "--report"])
        .arg(&report)
        .args([
            "--",
            "/bin/sh",
            "-c",
            "cat /proc/self/cgroup; echo UMASK $(umask); stat -c 'MODE %a' /etc /dev",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agentjail runs");
    // `exec`: the supervisor is this very process, and its cgroups are named after its pid.
    let supervisor = child.id();
    let out = child.wait_with_output().expect("agentjail ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let uid = r["isolation"]["host_uid"].as_u64().unwrap();
    if rustix_is_root() {
        assert!(uid >= 1_000_000_000, "{uid}");
    }
    // The command sees its own cgroup as the root of every hierarchy: no host path shows.
    let cgroup_lines: Vec<&str> = stdout.lines().filter(|l| l.contains(':')).collect();
    assert!(!cgroup_lines.is_empty(), "{stdout}");
    for l in &cgroup_lines {
        assert!(l.ends_with(":/"), "{l} (in {stdout})");
    }
    assert!(stdout.contains("UMASK 0022"), "{stdout}");
    assert_eq!(stdout.matches("MODE 755").count(), 2, "{stdout}");
    // No cgroup of this finished run is left behind.
    if r["isolation"]["cgroup"].is_string() {
        let name = format!("agentjail-{supervisor}-");
        let leftovers: Vec<_> = [
            "/sys/fs/cgroup/memory",
            "/sys/fs/cgroup/pids",
            "/sys/fs/cgroup/cpuacct",
            "/sys/fs/cgroup",
        ]
        .iter()
        .flat_map(|d| walk_dirs(Path::new(d), 3))
        .filter(|p| {
            p.file_name()
                .map(|n| n.to_string_lossy().starts_with(&name))
                .unwrap_or(false)
        })
        .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}

fn rustix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

fn walk_dirs(d: &Path, depth: usize) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if depth == 0 {
        return out;
    }
    if let Ok(rd) = std::fs::read_dir(d) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                out.push(e.path());
                out.extend(walk_dirs(&e.path(), depth - 1));
            }
        }
    }
    out
}

// --- unprivileged user --------------------------------------------------------------------------

/// Copies the binary where uid 65534 can execute it and returns a Command running it as
/// that user, or None (with a note) when this machine cannot do that.
fn as_nobody(work: &Path) -> Option<(Command, PathBuf)> {
    if !rustix_is_root() {
        eprintln!("note: not root; unprivileged tests run as the current user instead");
        return Some((Command::new(bin()), work.to_owned()));
    }
    let writable = work.join("nobody");
    std::fs::create_dir_all(&writable).ok()?;
    std::os::unix::fs::chown(&writable, Some(65534), Some(65534)).ok()?;
    let b = work.join("agentjail");
    std::fs::copy(bin(), &b).ok()?;
    std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o755)).ok()?;
    if !Path::new("/usr/bin/setpriv").exists() {
        eprintln!("note: setpriv missing; skipping the unprivileged run");
        return None;
    }
    let mut c = Command::new("/usr/bin/setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--reset-env",
    ]);
    c.env("HOME", &writable);
    c.arg(b);
    Some((c, writable))
}

#[test]
fn unprivileged_user_strict_run_is_refused_without_cgroups_and_runs_degraded() {
    let work = tmp();
    let Some((mut cmd, wdir)) = as_nobody(work.path()) else {
        return;
    };
    let report = wdir.join("u1.json");
    cmd.args(["run", "--report"])
        .arg(&report)
        .args(["--", "/bin/true"]);
    let o = run_raw(cmd, &report);
    if o.code == 0 {
        // This host delegates cgroups to the user: a strict run works; nothing to refuse.
        assert_eq!(o.report["isolation"]["degraded"], serde_json::json!([]));
        return;
    }
    assert_eq!(o.code, 125, "{} {}", o.stderr, o.report);
    assert!(o.stderr.contains("--allow-degraded"), "{}", o.stderr);
    assert!(o.stderr.contains("cgroup"), "{}", o.stderr);

    // With --allow-degraded it runs, and says exactly what was not applied.
    let Some((mut cmd, wdir)) = as_nobody(work.path()) else {
        return;
    };
    let report = wdir.join("u2.json");
    let secret = write(work.path(), "root-only.txt", "ROOT-ONLY-SECRET");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let probe = write(
        work.path(),
        "probe.py",
        &probe_source(&format!(
            r#"
attempt("root_only", lambda: open("{s}").read())
attempt("shadow", lambda: open("/etc/shadow").read())
sys_call("ptrace", 101, 16, 1, 0, 0)
sys_call("unshare", 272, 0x10000000)
def tcp():
    socket.create_connection(("127.0.0.1", 9), timeout=2)
attempt("tcp", tcp)
attempt("write_input", lambda: open("/input/probe.py", "a"))
print("IDS", os.getuid(), os.getgid())
print("CAPS", [l.strip() for l in open("/proc/self/status") if l.startswith(("CapEff", "CapBnd", "NoNewPrivs"))])
"#,
            s = secret.display()
        )),
    );
    cmd.args(["run", "--allow-degraded", "--report"])
        .arg(&report)
        .arg("--ro")
        .arg(format!("{}:/input/probe.py", probe.display()))
        .args(["--", PY, "/input/probe.py"]);
    let o = run_raw(cmd, &report);
    assert_eq!(o.code, 0, "{} {} {}", o.stdout, o.stderr, o.report);
    assert!(o.probe("root_only").starts_with("errno="));
    assert!(o.probe("shadow").starts_with("errno="));
    assert_eq!(o.probe("ptrace"), "errno=1");
    assert_eq!(o.probe("unshare"), "errno=1");
    assert_eq!(o.probe("tcp"), "errno=13");
    assert!(o.probe("write_input").starts_with("errno="));
    assert!(o.stdout.contains("IDS 65534 65534"));
    assert!(
        o.stdout.contains("CapEff:\\t0000000000000000") && o.stdout.contains("NoNewPrivs:\\t1")
    );
    let iso = &o.report["isolation"];
    assert_eq!(iso["user_ns"], true);
    assert_eq!(iso["cgroup"], Value::Null);
    assert!(
        iso["degraded"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d.as_str().unwrap().contains("cgroup"))
    );
    assert!(
        iso["rlimits"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "nproc")
    );
    assert_eq!(o.report["accounting"], "rusage");
    assert!(o.denied("syscall", "ptrace") && o.denied("syscall", "unshare"));
}

#[test]
fn unprivileged_fork_bomb_and_memory_hog_are_held_by_rlimits() {
    let work = tmp();
    let Some((mut cmd, wdir)) = as_nobody(work.path()) else {
        return;
    };
    let report = wdir.join("u3.json");
    let probe = write(
        work.path(),
        "probe.py",
        &probe_source(&format!(
            "{FORK_PROBE}{}",
            r#"
def hog():
    b = []
    while True: b.append(bytearray(16 << 20))
try:
    hog()
except MemoryError:
    print("RESULT hog memoryerror", flush=True)
"#
        )),
    );
    cmd.args([
        "run",
        "--allow-degraded",
        "--pids",
        "6",
        "--memory-mb",
        "128",
        "--timeout",
        "10",
        "--report",
    ])
    .arg(&report)
    .arg("--ro")
    .arg(format!("{}:/input/probe.py", probe.display()))
    .args(["--", PY, "/input/probe.py"]);
    let o = run_raw(cmd, &report);
    assert_eq!(o.probe("fork"), "errno=11", "{} {}", o.stdout, o.stderr);
    let kids: u32 = o
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("KIDS "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(kids < 6, "{kids}");
    assert_eq!(o.probe("hog"), "memoryerror");
}

// --- the gVisor tier ----------------------------------------------------------------------------
// The same attacks against `--isolation gvisor`. Where a check cannot hold the same way under
// gVisor, the assertion says what holds instead (e.g. a refused connect is ECONNREFUSED from
// gVisor's empty network stack rather than Landlock's EACCES).

/// `--isolation gvisor` plus `extra`, or None (with a note) when runsc is unavailable here.
fn gvisor_flags<'a>(extra: &[&'a str]) -> Option<Vec<&'a str>> {
    let out = Command::new(bin())
        .args(["check", "--json"])
        .output()
        .ok()?;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    let ok = v["items"]
        .as_array()?
        .iter()
        .any(|i| i["name"] == "gvisor tier" && i["ok"] == true);
    if !ok {
        eprintln!("SKIP: the gvisor tier is not available here (apt-get install runsc; root)");
        return None;
    }
    let mut f = vec!["--isolation", "gvisor"];
    f.extend_from_slice(extra);
    Some(f)
}

#[test]
fn gvisor_tier_refuses_reads_writes_traversal_and_network() {
    let work = tmp();
    let Some(flags) = gvisor_flags(&[]) else {
        return;
    };
    let canary = write(work.path(), "canary.txt", "GVISOR-CANARY-1234");
    let data = write(work.path(), "data.csv", "a,b\n1,2\n");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let body = format!(
        r#"
attempt("canary", lambda: open("{c}").read())
attempt("shadow", lambda: open("/etc/shadow").read())
attempt("traversal", lambda: open("/input/data.csv/../../{name}").read())
attempt("write_input", lambda: open("/input/data.csv", "a").write("x"))
attempt("write_usr", lambda: open("/usr/bin/evil", "w"))
attempt("own_input", lambda: open("/input/data.csv").read())
attempt("tcp", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=3))
attempt("dns", lambda: socket.getaddrinfo("example.com", 80))
print("IDS", os.getuid(), os.getgid())
"#,
        c = canary.display(),
        name = canary.file_name().unwrap().to_string_lossy()
    );
    let ro = format!("{}:/input/data.csv", data.display());
    let mut f = flags.clone();
    f.extend_from_slice(&["--ro", &ro]);
    let o = run_probe(work.path(), &body, &f);
    assert_eq!(o.report["isolation"]["kind"], "gvisor", "{}", o.report);
    for name in [
        "canary",
        "shadow",
        "traversal",
        "write_input",
        "write_usr",
        "tcp",
        "dns",
    ] {
        assert!(o.probe(name).starts_with("errno="), "{name}: {}", o.stdout);
    }
    assert_eq!(o.probe("own_input"), "ok");
    assert!(o.stdout.contains("IDS 65534 65534"));
    assert!(!o.stdout.contains("GVISOR-CANARY"));
    assert!(listener.accept().is_err(), "the host listener was reached");
    assert_eq!(std::fs::read_to_string(&data).unwrap(), "a,b\n1,2\n");
    // What does not carry over is said, not hidden.
    assert!(
        !o.report["isolation"]["degraded"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

#[test]
fn gvisor_tier_refuses_output_symlinks_and_oversized_output() {
    let work = tmp();
    let Some(flags) = gvisor_flags(&[]) else {
        return;
    };
    let target = write(work.path(), "host-target.txt", "ORIGINAL");
    let out_dir = work.path().join("out");
    let body = format!(
        "os.symlink(\"{t}\", \"/output/summary.json\")\nopen(\"/output/fine.txt\", \"w\").write(\"fine\")\n",
        t = target.display()
    );
    let od = out_dir.display().to_string();
    let mut f = flags.clone();
    f.extend_from_slice(&["--output-dir", &od]);
    let o = run_probe(work.path(), &body, &f);
    assert_eq!(o.code, 65, "{}", o.report);
    assert!(
        o.denied("output", "summary.json: symlink refused"),
        "{}",
        o.report
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "ORIGINAL");
    assert!(out_dir.join("fine.txt").exists());
    assert!(std::fs::symlink_metadata(out_dir.join("summary.json")).is_err());

    let (mut cmd, report) = aj(work.path());
    cmd.args(&flags).args([
        "--output-max-mb",
        "1",
        "--",
        "/bin/sh",
        "-c",
        "head -c 3000000 /dev/zero > /output/big.bin; exit 0",
    ]);
    let o = run_raw(cmd, &report);
    assert_eq!(o.code, 65, "{}", o.report);
    assert!(o.denied("output", "limit"), "{}", o.report);
}

#[test]
fn gvisor_tier_bounds_time_processes_and_memory() {
    let work = tmp();
    let Some(flags) = gvisor_flags(&[]) else {
        return;
    };
    let t = Instant::now();
    let (mut cmd, report) = aj(work.path());
    cmd.args(&flags)
        .args(["--timeout", "2", "--", PY, "-c", "while True: pass"]);
    let o = run_raw(cmd, &report);
    assert_eq!((o.code, o.status()), (124, "timeout"), "{}", o.report);
    assert!(t.elapsed() < Duration::from_secs(10));

    let body = FORK_PROBE;
    let mut f = flags.clone();
    f.extend_from_slice(&["--pids", "8", "--timeout", "20"]);
    let o = run_probe(work.path(), body, &f);
    assert_eq!(o.probe("fork"), "errno=11", "{}", o.stdout);

    let (mut cmd, report) = aj(work.path());
    cmd.args(&flags).args([
        "--memory-mb",
        "128",
        "--timeout",
        "30",
        "--",
        PY,
        "-c",
        "b = []\nwhile True: b.append(bytearray(8 << 20))",
    ]);
    let o = run_raw(cmd, &report);
    assert_ne!(o.status(), "ok", "{}", o.report);
    assert_ne!(
        o.status(),
        "timeout",
        "the memory limit did not hold: {}",
        o.report
    );
}

#[test]
fn cgroups_of_killed_supervisors_are_reaped_by_the_next_run() {
    if !rustix_is_root() {
        eprintln!("SKIP: needs root to create cgroups");
        return;
    }
    // A supervisor killed with SIGKILL cannot remove its cgroup; the next run does.
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let Some(pids_path) = own.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let (_, c, p) = (it.next()?, it.next()?, it.next()?);
        (c.split(',').any(|x| x == "pids")).then(|| p.to_string())
    }) else {
        eprintln!("SKIP: no cgroup v1 pids hierarchy");
        return;
    };
    let parent = Path::new("/sys/fs/cgroup/pids").join(pids_path.trim_start_matches('/'));
    let mut dead = Command::new("/bin/true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let stale = parent.join(format!("agentjail-{dead_pid}-0"));
    if std::fs::create_dir(&stale).is_err() {
        eprintln!("SKIP: cannot create {}", stale.display());
        return;
    }
    let work = tmp();
    let (mut cmd, report) = aj(work.path());
    cmd.args(["--", "/bin/true"]);
    let o = run_raw(cmd, &report);
    assert_eq!(o.code, 0, "{}", o.report);
    assert!(!stale.exists(), "{} was left behind", stale.display());
}

/// The supervisor starts the sandbox's init on another CPU than its own (so that the two work
/// in parallel); the command must still get every CPU the caller may use, and the init too.
#[test]
fn the_command_may_use_every_cpu_of_the_caller() {
    let allowed = |status: &str| {
        status
            .lines()
            .find(|l| l.starts_with("Cpus_allowed_list:"))
            .map(|l| l.split_whitespace().nth(1).unwrap_or_default().to_string())
    };
    let ours = allowed(&std::fs::read_to_string("/proc/self/status").unwrap()).unwrap();
    let work = tmp();
    let (mut cmd, report) = aj(work.path());
    cmd.args([
        "--",
        "/bin/sh",
        "-c",
        "grep Cpus_allowed_list /proc/self/status /proc/1/status",
    ]);
    let o = run_raw(cmd, &report);
    assert_eq!(o.code, 0, "{} {}", o.stderr, o.report);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", o.stdout);
    for l in lines {
        let (_, status_line) = l.split_once(':').unwrap();
        assert_eq!(allowed(status_line).as_deref(), Some(ours.as_str()), "{l}");
    }
}
