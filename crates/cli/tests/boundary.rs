//! Boundary tests (issue #12 items 1, 4 and 10): the real `agentjail` binary runs probes that
//! attack the edges of the native tier from inside — socket families outside the allowlist,
//! calls that retune or wedge the sandbox's init, and views of the host (the init's command
//! line, host activity through inotify).
//!
//! Sentinels as in escape.rs: every probe ends with `PROBE-COMPLETE`, and every refusal must
//! also be in the report's `denials` (only the seccomp listener puts it there), so "refused by
//! us" differs from "failed anyway".
//!
//! The probes use x86_64 syscall numbers.

#![cfg(target_arch = "x86_64")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::{bin, is_root, skip, tmp};

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

const PY: &str = "/usr/bin/python3";

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
    wall: Duration,
}

impl Out {
    fn status(&self) -> &str {
        self.report["status"].as_str().unwrap_or("")
    }
    /// Every `syscall` denial's detail.
    fn syscall_denials(&self) -> Vec<String> {
        self.report["denials"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|d| d["kind"] == "syscall")
                    .filter_map(|d| d["detail"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }
    fn denied(&self, detail: &str) -> bool {
        self.syscall_denials().iter().any(|d| d == detail)
    }
    fn complete(&self) {
        assert!(
            self.stdout.contains("PROBE-COMPLETE"),
            "probe did not complete\nstdout: {}\nstderr: {}\nreport: {}",
            self.stdout,
            self.stderr,
            self.report
        );
    }
    /// The probe's result for `name`, e.g. "ok" or "errno=13".
    fn probe(&self, name: &str) -> String {
        self.complete();
        let prefix = format!("RESULT {name} ");
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no result for {name} in {}", self.stdout))
            .to_string()
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

fn run_raw(mut cmd: Command, report: &Path) -> Out {
    let t = Instant::now();
    let out = cmd.stdin(Stdio::null()).output().expect("agentjail runs");
    let wall = t.elapsed();
    let report = std::fs::read(report)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        report,
        wall,
    }
}

/// Wraps a probe body with helpers: `attempt(name, fn)` prints `RESULT name ok|errno=N`,
/// `sys_call(name, nr, args…)` makes a raw syscall and prints the same.
fn probe_source(body: &str) -> String {
    format!(
        r#"import os, sys, socket, ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
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
    return r
{body}
print("PROBE-COMPLETE", flush=True)
"#
    )
}

/// `agentjail run [extra] --ro probe.py:/input/probe.py -- python3 /input/probe.py`, run by
/// `base` (the binary itself, or the binary through setpriv as another user).
fn run_probe_with(base: (Command, PathBuf), work: &Path, probe: &str, extra: &[&str]) -> Out {
    let (mut cmd, report_dir) = base;
    let p = write(
        work,
        &format!("probe-{}.py", rand_suffix()),
        &probe_source(probe),
    );
    let report = report_dir.join(format!("report-{}.json", rand_suffix()));
    cmd.arg("run").arg("--report").arg(&report);
    cmd.args(extra);
    cmd.arg("--ro")
        .arg(format!("{}:/input/probe.py", p.display()));
    cmd.args(["--", PY, "/input/probe.py"]);
    run_raw(cmd, &report)
}

fn run_probe(work: &Path, probe: &str, extra: &[&str]) -> Out {
    run_probe_with((Command::new(bin()), work.to_owned()), work, probe, extra)
}

/// The host pids of `pid`'s children.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Starts `agentjail run --report <r> [args]` with stdout piped, waits until the command
/// printed `READY`, and returns the process, the report path and the init's host pid (the
/// supervisor's only child).
fn start_until_ready(work: &Path, args: &[&str]) -> (std::process::Child, PathBuf, u32) {
    use std::io::BufRead;
    let report = work.join(format!("report-{}.json", rand_suffix()));
    let mut child = Command::new(bin())
        .arg("run")
        .arg("--report")
        .arg(&report)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.trim() == "READY" => break,
            Some(Ok(_)) => {}
            other => panic!("the command never printed READY: {other:?}"),
        }
    }
    // Keep draining the command's stdout so that it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    let kids = children(child.id());
    assert_eq!(kids.len(), 1, "the supervisor's children: {kids:?}");
    (child, report, kids[0])
}

/// Copies the binary where uid 65534 can execute it and returns a Command running it as
/// that user (through setpriv) and a folder that user may write, or None (after [`skip`]).
fn as_nobody(work: &Path) -> Option<(Command, PathBuf)> {
    if !is_root() {
        eprintln!("note: not root; the unprivileged run is this user's");
        return Some((Command::new(bin()), work.to_owned()));
    }
    if !Path::new("/usr/bin/setpriv").exists() {
        skip("/usr/bin/setpriv is missing (util-linux)");
        return None;
    }
    let writable = work.join("nobody");
    std::fs::create_dir_all(&writable).unwrap();
    std::os::unix::fs::chown(&writable, Some(65534), Some(65534)).unwrap();
    let b = work.join("agentjail");
    std::fs::copy(bin(), &b).unwrap();
    std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o755)).unwrap();
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

// --- item 1: socket families --------------------------------------------------------------------

/// The kernel's address families by number (include/linux/socket.h), as the report names them.
const FAMILIES: &[(u32, &str)] = &[
    (0, "AF_UNSPEC"),
    (1, "AF_UNIX"),
    (2, "AF_INET"),
    (3, "AF_AX25"),
    (4, "AF_IPX"),
    (5, "AF_APPLETALK"),
    (6, "AF_NETROM"),
    (7, "AF_BRIDGE"),
    (8, "AF_ATMPVC"),
    (9, "AF_X25"),
    (10, "AF_INET6"),
    (11, "AF_ROSE"),
    (12, "AF_DECnet"),
    (13, "AF_NETBEUI"),
    (14, "AF_SECURITY"),
    (15, "AF_KEY"),
    (16, "AF_NETLINK"),
    (17, "AF_PACKET"),
    (18, "AF_ASH"),
    (19, "AF_ECONET"),
    (20, "AF_ATMSVC"),
    (21, "AF_RDS"),
    (22, "AF_SNA"),
    (23, "AF_IRDA"),
    (24, "AF_PPPOX"),
    (25, "AF_WANPIPE"),
    (26, "AF_LLC"),
    (27, "AF_IB"),
    (28, "AF_MPLS"),
    (29, "AF_CAN"),
    (30, "AF_TIPC"),
    (31, "AF_BLUETOOTH"),
    (32, "AF_IUCV"),
    (33, "AF_RXRPC"),
    (34, "AF_ISDN"),
    (35, "AF_PHONET"),
    (36, "AF_IEEE802154"),
    (37, "AF_CAIF"),
    (38, "AF_ALG"),
    (39, "AF_NFC"),
    (40, "AF_VSOCK"),
    (41, "AF_KCM"),
    (42, "AF_QIPCRTR"),
    (43, "AF_SMC"),
    (44, "AF_XDP"),
    (45, "AF_MCTP"),
];

/// Every family number the kernel knows (AF_MAX is 46 on 6.x) and a few above it.
const LAST_FAMILY: u32 = 50;

fn family_name(f: u32) -> String {
    FAMILIES
        .iter()
        .find(|(n, _)| *n == f)
        .map(|(_, s)| s.to_string())
        .unwrap_or_else(|| format!("family {f}"))
}

#[test]
fn socket_families_outside_the_allowlist_are_refused_and_reported() {
    let work = tmp();
    // Each family with the type it most likely supports (the filter looks at the family only;
    // the type decides whether a family the filter lets through really works).
    let body = format!(
        r#"
import socket as S
for f in range(0, {LAST_FAMILY} + 1):
    t = {{2: S.SOCK_DGRAM, 10: S.SOCK_DGRAM, 16: S.SOCK_RAW, 17: S.SOCK_RAW}}.get(f, S.SOCK_STREAM)
    sys_call("socket-%d" % f, 41, f, t | S.SOCK_CLOEXEC, 0)
    fds = (ctypes.c_int * 2)()
    sys_call("socketpair-%d" % f, 53, f, S.SOCK_STREAM | S.SOCK_CLOEXEC, 0, ctypes.addressof(fds))
# Netlink: route only. Audit (9), uevents (15) and sock_diag (4) are not.
for proto in (0, 4, 9, 15):
    sys_call("netlink-%d" % proto, 41, 16, S.SOCK_RAW | S.SOCK_CLOEXEC, proto)
# The kernel reads an int: garbage in the upper half must not slip vsock past the filter.
sys_call("vsock-upper-bits", 41, (1 << 32) | 40, S.SOCK_STREAM, 0)
# What glibc and Python do with the allowed families still works.
attempt("getaddrinfo-addrconfig", lambda: S.getaddrinfo("localhost", 80, 0, 0, 0, S.AI_ADDRCONFIG))
attempt("if_nameindex", lambda: print("IFACES", S.if_nameindex()))
attempt("socketpair-unix", lambda: S.socketpair())
def udp6():
    a = S.socket(S.AF_INET6, S.SOCK_DGRAM); a.bind(("::1", 0))
    b = S.socket(S.AF_INET6, S.SOCK_DGRAM); b.sendto(b"ping6", a.getsockname())
    assert a.recv(16) == b"ping6"
attempt("udp6", udp6)
"#
    );
    let o = run_probe(work.path(), &body, &[]);
    o.complete();
    let mut failures = Vec::new();
    for f in 0..=LAST_FAMILY {
        let name = family_name(f);
        let sock = o.probe(&format!("socket-{f}"));
        let pair = o.probe(&format!("socketpair-{f}"));
        let (sock_detail, pair_detail) = (format!("socket({name})"), format!("socketpair({name})"));
        match f {
            // AF_UNIX, AF_INET, AF_INET6, AF_NETLINK (route): created.
            1 | 2 | 10 | 16 => {
                if sock != "ok" {
                    failures.push(format!("{name}: socket {sock}, expected ok"));
                }
                if o.denied(&sock_detail) {
                    failures.push(format!("{name}: allowed family reported as denied"));
                }
                // socketpair: only AF_UNIX has one; the others fail in the kernel, unreported.
                let pair_ok = f == 1;
                if (pair == "ok") != pair_ok || o.denied(&pair_detail) {
                    failures.push(format!("{name}: socketpair {pair}"));
                }
            }
            _ => {
                // Refused by us: EAFNOSUPPORT *and* a denial naming the family.
                for (call, res, detail) in [
                    ("socket", &sock, &sock_detail),
                    ("socketpair", &pair, &pair_detail),
                ] {
                    if res != "errno=97" {
                        failures.push(format!("{call}({name}): {res}, expected errno=97"));
                    }
                    if !o.denied(detail) {
                        failures.push(format!("{detail} not in the report's denials"));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{}\nstdout: {}\ndenials: {:?}",
        failures.join("\n"),
        o.stdout,
        o.syscall_denials()
    );
    assert_eq!(o.probe("netlink-0"), "ok");
    for proto in [4, 9, 15] {
        assert_eq!(
            o.probe(&format!("netlink-{proto}")),
            "errno=93",
            "{}",
            o.stdout
        );
        assert!(
            o.denied(&format!("socket(AF_NETLINK, protocol {proto})")),
            "netlink protocol {proto}: {:?}",
            o.syscall_denials()
        );
    }
    assert_eq!(o.probe("vsock-upper-bits"), "errno=97");
    assert_eq!(o.probe("getaddrinfo-addrconfig"), "ok");
    assert_eq!(o.probe("if_nameindex"), "ok");
    assert!(o.stdout.contains("IFACES [(1, 'lo')]"), "{}", o.stdout);
    assert_eq!(o.probe("socketpair-unix"), "ok");
    assert_eq!(o.probe("udp6"), "ok");
    assert_eq!(o.code, 0, "{}", o.stderr);
}

// --- item 4: the init cannot be retuned or wedged -----------------------------------------------

/// Attacks on pid 1 (the init) and its uid; each must be refused with EPERM and reported; then
/// the command exits 7. Controls: the same calls on the caller itself work.
const RETUNE_PROBE: &str = r#"
import struct
zero = ctypes.create_string_buffer(16)              # struct rlimit {0, 0}
old = ctypes.create_string_buffer(16)
mask = ctypes.create_string_buffer(struct.pack("Q", sum(1 << c for c in os.sched_getaffinity(0) if c < 64)), 128)
param = ctypes.create_string_buffer(struct.pack("i", 0), 8)
attr = ctypes.create_string_buffer(struct.pack("IIQiI", 56, 5, 0, 0, 0) + bytes(32), 56)  # SCHED_IDLE
nodes = ctypes.create_string_buffer(struct.pack("Q", 1), 8)
# Controls first: on the caller itself (pid/who 0) these work.
sys_call("self-prlimit-read", 302, 0, 7, 0, ctypes.addressof(old))
sys_call("self-prlimit-write", 302, 0, 7, ctypes.addressof(old), 0)
sys_call("self-setpriority", 141, 0, 0, 1)
sys_call("self-sched_setaffinity", 203, 0, 128, ctypes.addressof(mask))
sys_call("self-ioprio_set", 251, 1, 0, (2 << 13) | 4)
# Reading another process's limits changes nothing: allowed (the kernel checks the ids).
sys_call("init-prlimit-read", 302, 1, 7, 0, ctypes.addressof(old))
# The attacks.
sys_call("setpriority-pid1", 141, 0, 1, 19)               # PRIO_PROCESS, pid 1
sys_call("setpriority-user", 141, 2, 0, 19)               # PRIO_USER, own uid (the init's, unprivileged)
sys_call("setpriority-pgrp", 141, 1, 1, 19)               # PRIO_PGRP 1
sys_call("sched_setaffinity-pid1", 203, 1, 128, ctypes.addressof(mask))
sys_call("sched_setscheduler-pid1", 144, 1, 5, ctypes.addressof(param))   # SCHED_IDLE
sys_call("sched_setparam-pid1", 142, 1, ctypes.addressof(param))
sys_call("sched_setattr-pid1", 314, 1, ctypes.addressof(attr), 0)
sys_call("ioprio_set-pid1", 251, 1, 1, (3 << 13))          # IOPRIO_WHO_PROCESS 1, idle class
sys_call("ioprio_set-user", 251, 3, 0, (3 << 13))          # IOPRIO_WHO_USER, own uid
sys_call("migrate_pages-pid1", 256, 1, 64, ctypes.addressof(nodes), ctypes.addressof(nodes))
sys_call("move_pages-pid1", 279, 1, 0, 0, 0, 0, 0)
pidfd = sys_call("pidfd_open-pid1", 434, 1, 0)
sys_call("process_madvise", 440, pidfd if pidfd >= 0 else 0, 0, 0, 21, 0)   # MADV_PAGEOUT
# Last: the call that wedged the init (its poll fails with EINVAL once RLIMIT_NOFILE is 0).
sys_call("prlimit-nofile-pid1", 302, 1, 7, ctypes.addressof(zero), 0)
print("PROBE-COMPLETE", flush=True)
sys.exit(7)
"#;

/// (probe result name, report detail) of every attack in [`RETUNE_PROBE`].
const RETUNE_ATTACKS: &[(&str, &str)] = &[
    ("setpriority-pid1", "setpriority(another process)"),
    ("setpriority-user", "setpriority(another process)"),
    ("setpriority-pgrp", "setpriority(another process)"),
    (
        "sched_setaffinity-pid1",
        "sched_setaffinity(another process)",
    ),
    (
        "sched_setscheduler-pid1",
        "sched_setscheduler(another process)",
    ),
    ("sched_setparam-pid1", "sched_setparam(another process)"),
    ("sched_setattr-pid1", "sched_setattr(another process)"),
    ("ioprio_set-pid1", "ioprio_set(another process)"),
    ("ioprio_set-user", "ioprio_set(another process)"),
    ("migrate_pages-pid1", "migrate_pages(another process)"),
    ("move_pages-pid1", "move_pages(another process)"),
    ("process_madvise", "process_madvise"),
    ("prlimit-nofile-pid1", "prlimit64(another process)"),
];

fn check_retune(o: &Out, who: &str) {
    assert!(
        o.stdout.contains("PROBE-COMPLETE"),
        "{who}: probe did not complete\nstdout: {}\nstderr: {}\nreport: {}",
        o.stdout,
        o.stderr,
        o.report
    );
    let mut failures = Vec::new();
    for (name, detail) in RETUNE_ATTACKS {
        let r = o.probe(name);
        if r != "errno=1" {
            failures.push(format!("{name}: {r}, expected errno=1"));
        }
        if !o.denied(detail) {
            failures.push(format!("{detail} not in the report's denials"));
        }
    }
    for control in [
        "self-prlimit-read",
        "self-prlimit-write",
        "self-setpriority",
        "self-sched_setaffinity",
        "self-ioprio_set",
    ] {
        if o.probe(control) != "ok" {
            failures.push(format!("{control}: {}", o.probe(control)));
        }
    }
    if who == "unprivileged" {
        // Same uid as the init: the kernel lets it read the init's limits, and so do we.
        if o.probe("init-prlimit-read") != "ok" {
            failures.push(format!(
                "init-prlimit-read: {}",
                o.probe("init-prlimit-read")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{who}:\n{}\nstdout: {}\ndenials: {:?}",
        failures.join("\n"),
        o.stdout,
        o.syscall_denials()
    );
    // The command's own end, promptly: not the deadline.
    assert_eq!(o.status(), "exit_nonzero", "{who}: {}", o.report);
    assert_eq!(o.report["exit_code"], 7, "{who}: {}", o.report);
    assert_eq!(o.code, 7, "{who}: {}", o.stderr);
    assert!(
        o.wall < Duration::from_secs(20),
        "{who}: the run took {:?}",
        o.wall
    );
}

#[test]
fn the_payload_cannot_retune_or_wedge_the_init_as_root() {
    let work = tmp();
    let o = run_probe(work.path(), RETUNE_PROBE, &["--timeout", "40"]);
    check_retune(&o, "root");
}

#[test]
fn the_payload_cannot_retune_or_wedge_the_init_as_an_ordinary_user() {
    let work = tmp();
    let Some(base) = as_nobody(work.path()) else {
        return;
    };
    let o = run_probe_with(
        base,
        work.path(),
        RETUNE_PROBE,
        &["--allow-degraded", "--timeout", "40"],
    );
    check_retune(&o, "unprivileged");
}

/// The init's own loop, attacked from the host (where the old attack still works: host root
/// may lower the init's RLIMIT_NOFILE): once poll fails, the run must end at once with a
/// clear internal error and no process of the sandbox left, not spin to the deadline.
#[test]
fn an_error_in_the_inits_loop_ends_the_run_at_once() {
    if !is_root() {
        skip("lowering another process's limits needs root");
        return;
    }
    if !Path::new("/usr/bin/prlimit").exists() {
        skip("/usr/bin/prlimit is missing (util-linux)");
        return;
    }
    let work = tmp();
    let t = Instant::now();
    // After READY the command waits until the host says (through an input it rewrites in
    // place) that the limit is lowered, then makes a refused syscall: the init wakes up to
    // serve it and polls again with RLIMIT_NOFILE 0 (EINVAL). Then the command would sleep on.
    let flag = write(work.path(), "flag", "wait");
    let script = "import socket, time\nprint('READY', flush=True)\n\
                  for _ in range(400):\n    \
                  if open('/input/flag').read() == 'go': break\n    time.sleep(0.05)\n\
                  try: socket.socket(40, 1)\nexcept OSError: pass\ntime.sleep(30)\n";
    let ro = format!("{}:/input/flag", flag.display());
    let (mut child, report, init) = start_until_ready(
        work.path(),
        &["--timeout", "60", "--ro", &ro, "--", PY, "-c", script],
    );
    let lowered = Command::new("/usr/bin/prlimit")
        .arg("--pid")
        .arg(init.to_string())
        .arg("--nofile=0:0")
        .status()
        .unwrap();
    assert!(lowered.success());
    std::fs::write(&flag, "go").unwrap();
    let status = child.wait().unwrap();
    let wall = t.elapsed();
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["status"], "setup_error", "{r}");
    let error = r["error"].as_str().unwrap_or_default();
    assert!(error.contains("event loop"), "{error}");
    assert_eq!(status.code(), Some(125));
    assert!(wall < Duration::from_secs(20), "the run took {wall:?}");
    // The refusal that woke the init was still recorded.
    assert!(r["denials"].to_string().contains("socket(AF_VSOCK)"), "{r}");
}

/// The CPU placement of the init, checked from the host now that the command cannot see the
/// init: the command and the init both get every CPU the caller may use.
#[test]
fn the_init_and_the_command_get_every_cpu_of_the_caller() {
    let allowed = |pid: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find(|l| l.starts_with("Cpus_allowed_list:"))
            .map(|l| l.split_whitespace().nth(1).unwrap_or_default().to_string())
            .unwrap()
    };
    let ours = allowed("self");
    let work = tmp();
    let script = "import os\nprint('READY', flush=True)\nimport time; time.sleep(2)\n\
                  print('CMD', sorted(os.sched_getaffinity(0)), flush=True)\n";
    let (mut child, _report, init) = start_until_ready(work.path(), &["--", PY, "-c", script]);
    let init_cpus = allowed(&init.to_string());
    let command = children(init);
    let command_cpus = command.first().map(|p| allowed(&p.to_string()));
    assert!(child.wait().unwrap().success());
    assert_eq!(init_cpus, ours, "the init's CPUs");
    assert_eq!(
        command_cpus.as_deref(),
        Some(ours.as_str()),
        "the command's CPUs"
    );
}

// --- item 10: less of the host in view ----------------------------------------------------------

#[test]
fn the_init_and_the_callers_command_line_are_invisible() {
    let work = tmp();
    let marker = format!("CALLER-SECRET-{}", rand_suffix());
    let body = format!(
        r#"
import subprocess, time
pids = sorted(int(x) for x in os.listdir("/proc") if x.isdigit())
print("PIDS", pids, flush=True)
print("RESULT pid1-listed", "yes" if 1 in pids else "no", flush=True)
attempt("stat-pid1", lambda: os.stat("/proc/1"))
attempt("cmdline-pid1", lambda: open("/proc/1/cmdline", "rb").read())
attempt("environ-pid1", lambda: open("/proc/1/environ", "rb").read())
attempt("status-pid1", lambda: open("/proc/1/status").read())
seen = []
for p in pids:
    try:
        if b"{marker}" in open("/proc/%d/cmdline" % p, "rb").read():
            seen.append(p)
    except OSError:
        pass
print("RESULT marker-seen", seen or "none", flush=True)
# The command still sees its own processes.
child = subprocess.Popen(["/bin/sleep", "5"])
time.sleep(0.2)
print("RESULT own-child", "visible" if os.path.exists("/proc/%d/cmdline" % child.pid) else "invisible", flush=True)
child.kill(); child.wait()
print("RESULT self", "visible" if os.path.exists("/proc/self/status") else "invisible", flush=True)
"#
    );
    let env = format!("X={marker}");
    for (who, base, degraded) in [
        (
            "root",
            Some((Command::new(bin()), work.path().to_owned())),
            false,
        ),
        ("unprivileged", as_nobody(work.path()), true),
    ] {
        let Some(base) = base else { continue };
        let mut extra = vec!["--env", env.as_str()];
        if degraded {
            extra.push("--allow-degraded");
        }
        let o = run_probe_with(base, work.path(), &body, &extra);
        assert_eq!(o.probe("pid1-listed"), "no", "{who}: {}", o.stdout);
        for p in ["stat-pid1", "cmdline-pid1", "environ-pid1", "status-pid1"] {
            assert_eq!(o.probe(p), "errno=2", "{who} {p}: {}", o.stdout);
        }
        assert_eq!(o.probe("marker-seen"), "none", "{who}: {}", o.stdout);
        assert_eq!(o.probe("own-child"), "visible", "{who}: {}", o.stdout);
        assert_eq!(o.probe("self"), "visible", "{who}");
        assert_eq!(o.code, 0, "{who}: {}", o.stderr);
    }
}

#[test]
fn inotify_is_refused_so_host_activity_on_the_system_binds_stays_unseen() {
    let work = tmp();
    // The host opens a file of its /usr (bound read-only into the sandbox) over and over while
    // the probe watches it.
    let target = "/usr/bin/true";
    if !Path::new(target).exists() {
        skip("/usr/bin/true is missing");
        return;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let toucher = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = std::fs::read(target);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let body = format!(
        r#"
import select
IN_OPEN, IN_ACCESS = 0x20, 0x1
sys_call("inotify_init", 253)
fd = libc.inotify_init1(0o2000000)
print("RESULT inotify_init1", "ok" if fd >= 0 else "errno=%d" % ctypes.get_errno(), flush=True)
if fd >= 0:
    wd = libc.inotify_add_watch(fd, b"{target}", IN_OPEN | IN_ACCESS)
    r, _, _ = select.select([fd], [], [], 8)
    print("RESULT host-activity", "seen" if r else "unseen", flush=True)
else:
    print("RESULT host-activity", "unseen", flush=True)
"#
    );
    let o = run_probe(work.path(), &body, &[]);
    stop.store(true, Ordering::Relaxed);
    toucher.join().unwrap();
    assert_eq!(o.probe("host-activity"), "unseen", "{}", o.stdout);
    assert_eq!(o.probe("inotify_init"), "errno=1", "{}", o.stdout);
    assert_eq!(o.probe("inotify_init1"), "errno=1", "{}", o.stdout);
    for d in ["inotify_init", "inotify_init1"] {
        assert!(o.denied(d), "{d} not reported: {:?}", o.syscall_denials());
    }
    assert_eq!(o.code, 0, "{}", o.stderr);
}

// --- inline inputs (#15): the request's code by value ---------------------------------------------

/// An inline input (the service passes a request's code so, never as a host file) is
/// read-only inside the sandbox wherever it is mounted, below the writable `/work` too, and
/// its staging file system cannot be reached. The probe is itself an inline input (its code
/// is on no host path it could be read from) and attacks both files; the controls: it reads
/// both contents back whole, and it can write `/work` beside them. As root, as an ordinary
/// user (the user namespace path), and on the gVisor tier (where the content is a file of the
/// run's bundle, bound read-only by runsc).
#[test]
fn inline_inputs_are_read_only_even_below_work_and_their_staging_is_unreachable() {
    let conf = "zz-inline-conf-91c2\n".repeat(1000);
    let body = format!(
        r#"
import hashlib
CONF = {conf:?}
for name, path in (("code", "/input/probe.py"), ("conf", "/work/conf.txt")):
    attempt(name + "-append", lambda: open(path, "a").write("x"))
    attempt(name + "-write", lambda: os.open(path, os.O_WRONLY))
    attempt(name + "-truncate", lambda: os.truncate(path, 0))
    attempt(name + "-chmod", lambda: os.chmod(path, 0o777))
    attempt(name + "-rename", lambda: os.rename(path, "/work/moved"))
    attempt(name + "-unlink", lambda: os.unlink(path))
    open("/work/other", "w").write("replacement")
    attempt(name + "-replace", lambda: os.rename("/work/other", path))
    attempt(name + "-symlink-over", lambda: os.symlink("/work/other", path))
print("RESULT code-read", "whole" if open("/input/probe.py").read() == open(__file__).read() and "PROBE-COMPLETE" in open("/input/probe.py").read() else "changed", flush=True)
print("RESULT conf-read", "whole" if open("/work/conf.txt").read() == CONF else "changed", flush=True)
attempt("work-writable", lambda: open("/work/fine.txt", "w").write("ok"))
staged = [p for p in os.listdir("/") if p.startswith("inline")]
print("RESULT staging-visible", ",".join(staged) or "none", flush=True)
"#
    );
    let source = probe_source(&body);
    for who in ["root", "user", "gvisor"] {
        let work = tmp();
        let base = if who != "user" {
            if !is_root() {
                skip("not root: the root-mode run needs root");
                return;
            }
            (Command::new(bin()), work.path().to_owned())
        } else {
            match as_nobody(work.path()) {
                Some(b) => b,
                None => return,
            }
        };
        let (mut cmd, dir) = base;
        let mut manifest = serde_json::json!({
            "command": [PY, "/input/probe.py"],
            "inline_inputs": [
                {"mount": "/input/probe.py", "content": source},
                {"mount": "/work/conf.txt", "content": conf},
            ],
        });
        if who == "gvisor" {
            if !Path::new("/usr/bin/runsc").exists() && !Path::new("/usr/local/bin/runsc").exists()
            {
                skip("runsc (gVisor) is not installed");
                return;
            }
            manifest["isolation"] = "gvisor".into();
        }
        let m = dir.join("inline.json");
        std::fs::write(&m, manifest.to_string()).unwrap();
        std::fs::set_permissions(&m, std::fs::Permissions::from_mode(0o644)).unwrap();
        let report = dir.join("report.json");
        cmd.arg("run")
            .arg("--manifest")
            .arg(&m)
            .arg("--report")
            .arg(&report);
        if who == "user" {
            cmd.arg("--allow-degraded");
        }
        let o = run_raw(cmd, &report);
        for name in ["code", "conf"] {
            for a in [
                "append",
                "write",
                "truncate",
                "chmod",
                "rename",
                "unlink",
                "replace",
                "symlink-over",
            ] {
                let r = o.probe(&format!("{name}-{a}"));
                assert!(
                    r.starts_with("errno="),
                    "{who}: {name}-{a} was {r}\n{}",
                    o.stdout
                );
            }
        }
        assert_eq!(o.probe("code-read"), "whole", "{who}: {}", o.stdout);
        assert_eq!(o.probe("conf-read"), "whole", "{who}: {}", o.stdout);
        assert_eq!(o.probe("work-writable"), "ok", "{who}: {}", o.stdout);
        assert_eq!(o.probe("staging-visible"), "none", "{who}: {}", o.stdout);
        assert_eq!(o.status(), "ok", "{who}: {}", o.report);
        assert_eq!(o.code, 0, "{who}: {}", o.stderr);
    }
}
