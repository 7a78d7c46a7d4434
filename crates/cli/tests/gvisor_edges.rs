//! The gVisor tier's edges, attacked from outside and from inside: runsc's control plane (the
//! sandbox's control socket and state), the socket families the payload may open, and which
//! gVisor platform ran.
//!
//! Every test needs root and runsc: with `CI` set, a missing prerequisite fails the test;
//! otherwise it prints `SKIP: …` and returns.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::{bin, is_root, skip, tmp};

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const PY: &str = "/usr/bin/python3";
/// A host uid that is neither root, nor the sandbox user (65534), nor any account here.
const OTHER_UID: u32 = 42_917;

/// runsc's path, or None (after `skip`) when the gVisor tier cannot run here.
fn runsc() -> Option<PathBuf> {
    if !is_root() {
        skip("the gvisor tier needs root");
        return None;
    }
    let found = std::env::var_os("AGENTJAIL_RUNSC")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                .map(|d| d.join("runsc"))
                .find(|p| p.is_file())
        });
    if found.is_none() {
        skip("runsc not found (apt-get install runsc)");
    }
    if !Path::new(PY).is_file() {
        skip("/usr/bin/python3 not found");
        return None;
    }
    found
}

/// The runsc processes (pid, argv) whose ancestry includes `ancestor`.
fn runsc_descendants(ancestor: u32) -> Vec<(u32, Vec<String>)> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let argv: Vec<String> = cmd
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if !argv.first().is_some_and(|a| a.contains("runsc")) {
            continue;
        }
        let mut p = pid;
        for _ in 0..16 {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
                break;
            };
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|s| s.parse::<u32>().ok())
                .unwrap_or(0);
            if ppid == ancestor {
                found.push((pid, argv.clone()));
                break;
            }
            if ppid <= 1 {
                break;
            }
            p = ppid;
        }
    }
    found
}

/// Runs python code as `uid` (0 = root, in the test's own — the host's — network namespace).
fn python_as(uid: u32, code: &str) -> String {
    let mut c = Command::new(PY);
    c.args(["-c", code]).stdin(Stdio::null());
    if uid != 0 {
        c.uid(uid).gid(uid); // std drops supplementary groups when root sets a uid
    }
    let o = c.output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Looks for the control socket by name and connects to it (runsc's control server speaks
/// SOCK_SEQPACKET); prints `LISTED yes|no` and `CONNECT ok|errno=N`, then `DONE`.
fn control_socket_probe(name: &str) -> String {
    format!(
        r#"import socket
try:
    listed = "{name}" in open("/proc/net/unix").read()
    print("LISTED", "yes" if listed else "no")
except OSError as e:
    print("LISTED errno=%d" % e.errno)
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    s.connect("\0{name}")
    print("CONNECT ok")
except OSError as e:
    print("CONNECT errno=%d" % e.errno)
print("DONE")
"#
    )
}

/// A running `agentjail run --isolation gvisor` whose payload writes /output/r.txt and sleeps.
struct SleepingRun {
    child: std::process::Child,
    report: PathBuf,
    out_dir: PathBuf,
    /// runsc's `--root` as runsc sees it (through /proc/PID/root: what root on the host can
    /// read, with or without the state folder in view) and the container id, read from
    /// runsc's own command line.
    state_root: PathBuf,
    /// runsc's `--root` as given, as the host's mount namespace sees it.
    host_state_root: PathBuf,
    id: String,
    runsc_pids: Vec<u32>,
}

fn start_sleeping_run(work: &Path, seconds: u32) -> SleepingRun {
    let report = work.join("report.json");
    let out_dir = work.join("delivered");
    let script = format!(
        "echo genuine > /output/r.txt; echo STARTED; sleep {seconds}; echo PAYLOAD-END; cat /output/r.txt"
    );
    let child = Command::new(bin())
        .args(["run", "--isolation", "gvisor", "--timeout", "120"])
        .arg("--report")
        .arg(&report)
        .arg("--output-dir")
        .arg(&out_dir)
        .args(["--", "/bin/sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = child;
    let t0 = Instant::now();
    loop {
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("runsc's sandbox never started");
        }
        let procs = runsc_descendants(child.id());
        let boot = procs.iter().find(|(_, a)| a.iter().any(|x| x == "boot"));
        let run = procs.iter().find(|(_, a)| a.iter().any(|x| x == "run"));
        if let (Some(_), Some((_, argv))) = (boot, run) {
            let root = argv
                .iter()
                .position(|a| a == "--root")
                .map(|i| PathBuf::from(&argv[i + 1]))
                .or_else(|| {
                    argv.iter()
                        .find_map(|a| a.strip_prefix("--root=").map(PathBuf::from))
                })
                .expect("runsc --root");
            let host_state_root = root.clone();
            let id = argv.last().unwrap().clone();
            // What runsc sees there (the supervisor may keep it out of the host's view).
            let root = PathBuf::from(format!(
                "/proc/{}/root{}",
                run.map(|(p, _)| *p).unwrap(),
                root.display()
            ));
            let has_state = std::fs::read_dir(&root)
                .map(|d| {
                    d.flatten()
                        .any(|e| e.file_name().to_string_lossy().ends_with(".state"))
                })
                .unwrap_or(false);
            if has_state {
                // Let the payload start (gVisor's boot takes ~0.2 s; be generous on a busy host).
                std::thread::sleep(Duration::from_secs(3));
                let runsc_pids = runsc_descendants(child.id())
                    .into_iter()
                    .map(|(p, _)| p)
                    .collect();
                return SleepingRun {
                    child,
                    report,
                    out_dir,
                    state_root: root,
                    host_state_root,
                    id,
                    runsc_pids,
                };
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl SleepingRun {
    fn finish(self) -> (Value, String, String) {
        let o = self.child.wait_with_output().unwrap();
        let report: Value = std::fs::read(&self.report)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null);
        let delivered = std::fs::read_to_string(self.out_dir.join("r.txt")).unwrap_or_default();
        (
            report,
            String::from_utf8_lossy(&o.stdout).into_owned(),
            delivered,
        )
    }
}

/// Copies the run's state files (what an attacker could read or reconstruct) into a folder of
/// the attacker's, owned by `uid`.
fn copy_state(from: &Path, to: &Path, uid: u32) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let name = e.file_name();
        if name.to_string_lossy().ends_with(".state") {
            std::fs::copy(e.path(), to.join(&name)).unwrap();
            std::os::unix::fs::chown(to.join(&name), Some(uid), Some(uid)).unwrap();
        }
    }
    std::os::unix::fs::chown(to, Some(uid), Some(uid)).unwrap();
}

/// `runsc --root <root> ARGS` as `uid`, under a timeout; returns (success, output).
fn runsc_as(runsc: &Path, uid: u32, root: &Path, args: &[&str]) -> (bool, String) {
    let mut c = Command::new("timeout");
    c.arg("20")
        .arg(runsc)
        .arg("--root")
        .arg(root)
        .args(args)
        .stdin(Stdio::null());
    if uid != 0 {
        c.uid(uid).gid(uid); // std drops supplementary groups when root sets a uid
    }
    let o = c.output().unwrap();
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// Issue #12 item 2: nothing of runsc's control plane is reachable from the host's network
/// namespace or by another uid. During a run whose payload sleeps, root in the host netns
/// (with a copy of the state file, but not the state folder) and another uid try to find and
/// connect to the control socket, `runsc exec` into the sandbox to replace /output, pause it
/// and signal it; the run must still deliver what its payload wrote.
#[test]
fn gvisor_control_plane_is_private() {
    let Some(runsc) = runsc() else {
        return;
    };
    let work = tmp();
    let run = start_sleeping_run(work.path(), 12);
    let sock = format!("runsc-sandbox.{}", run.id);

    // Root in the host's network namespace.
    let root_view = python_as(0, &control_socket_probe(&sock));
    // Another uid.
    let other_view = python_as(OTHER_UID, &control_socket_probe(&sock));

    // The state files are closed to other uids (by the host's path to them).
    let state_name = std::fs::read_dir(&run.state_root)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(".state"))
        .unwrap()
        .file_name();
    let state_file = run.host_state_root.join(state_name);
    let state_read = python_as(
        OTHER_UID,
        &format!(
            "try:\n    open({:?}).read()\n    print('STATE ok')\nexcept OSError as e:\n    print('STATE errno=%d' % e.errno)\n",
            state_file.display().to_string()
        ),
    );

    // runsc exec / pause / kill with a copied state file: as root and as the other uid.
    let evil_root = work.path().join("evil-root");
    copy_state(&run.state_root, &evil_root, 0);
    let forge = [
        "exec",
        "--user",
        "0:0",
        run.id.as_str(),
        "/bin/sh",
        "-c",
        "rm -f /output/r.txt; echo forged > /output/r.txt; echo EXEC-$((40 + 2))-RAN",
    ];
    let (exec_root_ok, exec_root_out) = runsc_as(&runsc, 0, &evil_root, &forge);
    let (pause_root_ok, pause_root_out) = runsc_as(&runsc, 0, &evil_root, &["pause", &run.id]);
    let (kill_root_ok, kill_root_out) = runsc_as(&runsc, 0, &evil_root, &["kill", &run.id, "KILL"]);
    let evil_other = work.path().join("evil-other");
    copy_state(&run.state_root, &evil_other, OTHER_UID);
    let (exec_other_ok, exec_other_out) = runsc_as(&runsc, OTHER_UID, &evil_other, &forge);
    let (kill_other_ok, _) = runsc_as(&runsc, OTHER_UID, &evil_other, &["kill", &run.id, "KILL"]);

    // Signals and ptrace straight at runsc's processes from the other uid.
    let mut signalled = Vec::new();
    for pid in &run.runsc_pids {
        let r = python_as(
            OTHER_UID,
            &format!(
                "import os\ntry:\n    os.kill({pid}, 0)\n    print('SIGNAL ok')\nexcept OSError as e:\n    print('SIGNAL errno=%d' % e.errno)\n"
            ),
        );
        let ptrace = python_as(
            OTHER_UID,
            &format!(
                "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nr = libc.ptrace(16, {pid}, 0, 0)\nprint('PTRACE', 'ok' if r == 0 else 'errno=%d' % ctypes.get_errno())\n"
            ),
        );
        signalled.push(format!("{pid}: {} {}", r.trim(), ptrace.trim()));
    }

    let (report, stdout, delivered) = run.finish();
    let ctx = format!(
        "root view: {root_view}\nother view: {other_view}\nexec as root: {exec_root_ok} {exec_root_out}\npause as root: {pause_root_ok} {pause_root_out}\nkill as root: {kill_root_ok} {kill_root_out}\nexec as other: {exec_other_ok} {exec_other_out}\nsignals: {signalled:?}\nstdout: {stdout}\nreport: {report}"
    );
    // Sentinels: the probes ran to the end, and the run was alive and genuine throughout.
    assert!(
        root_view.contains("DONE") && other_view.contains("DONE"),
        "{ctx}"
    );
    assert!(
        stdout.contains("STARTED") && stdout.contains("PAYLOAD-END"),
        "{ctx}"
    );
    assert!(
        root_view.contains("LISTED no") && other_view.contains("LISTED no"),
        "the control socket is visible in the host's network namespace\n{ctx}"
    );
    assert!(
        root_view.contains("CONNECT errno=") && other_view.contains("CONNECT errno="),
        "the control socket accepts connections from the host's network namespace\n{ctx}"
    );
    assert!(
        state_read.contains("STATE errno=13") || state_read.contains("STATE errno=2"),
        "another uid reads the state file: {state_read}\n{ctx}"
    );
    assert!(
        !exec_root_ok && !exec_root_out.contains("EXEC-42-RAN"),
        "{ctx}"
    );
    assert!(
        !exec_other_ok && !exec_other_out.contains("EXEC-42-RAN"),
        "{ctx}"
    );
    assert!(!pause_root_ok && !kill_root_ok && !kill_other_ok, "{ctx}");
    assert!(
        signalled
            .iter()
            .all(|s| s.contains("SIGNAL errno=1") && s.contains("PTRACE errno=")),
        "{ctx}"
    );
    // The run ended as its payload ended, with the payload's output delivered.
    assert_eq!(report["status"], "ok", "{ctx}");
    assert_eq!(delivered, "genuine\n", "{ctx}");
    assert!(stdout.trim_end().ends_with("genuine"), "{ctx}");
}

/// `agentjail run --isolation gvisor ARGS` with `env`; returns (exit code, stdout, report).
fn gvisor_run(work: &Path, env: &[(&str, &str)], args: &[&str]) -> (i32, String, Value) {
    let report = work.join(format!("report-{}.json", args.len() + env.len()));
    let _ = std::fs::remove_file(&report);
    let o = Command::new(bin())
        .args(["run", "--isolation", "gvisor", "--report"])
        .arg(&report)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let r = std::fs::read(&report)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    (
        o.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        r,
    )
}

/// A runner killed from outside (SIGKILL: the OOM killer, an operator) takes its gVisor
/// sandbox with it: `runsc run` and the sandbox and gofer it started must not go on running,
/// with no deadline left and no one to account for them (the service then records the run
/// `unknown`, and a retry must not meet the first attempt still alive).
#[test]
fn a_gvisor_sandbox_dies_with_its_runner() {
    if runsc().is_none() {
        return;
    }
    let work = tmp();
    let mut run = start_sleeping_run(work.path(), 60);
    assert!(!run.runsc_pids.is_empty());
    run.child.kill().unwrap(); // SIGKILL to the runner
    run.child.wait().unwrap();
    let alive = |pids: &[u32]| -> Vec<u32> {
        pids.iter()
            .copied()
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .ok()
                    .and_then(|s| {
                        s.rsplit_once(')')
                            .and_then(|(_, r)| r.split_whitespace().next().map(str::to_owned))
                    })
                    .is_some_and(|state| state != "Z")
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = alive(&run.runsc_pids);
        if left.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            for p in &left {
                let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
            }
            panic!("5 s after its runner was killed, runsc processes still run: {left:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The killed runner ran no destructor: its bundle and state folders stay until the next
    // gVisor run sweeps the folders of runners that are gone.
    let runner = run.child.id();
    let leftovers = || -> Vec<String> {
        std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| {
                n.starts_with(&format!("agentjail-gvisor-{runner}-"))
                    || n.starts_with(&format!("agentjail-runsc-state-{runner}-"))
            })
            .collect()
    };
    let (code, out, _) = gvisor_run(work.path(), &[], &["--", "/bin/true"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        leftovers(),
        Vec::<String>::new(),
        "the next run did not sweep them"
    );
}

/// Issue #12 item 3: the report and `agentjail check` say which gVisor platform ran; the
/// choice can be forced, and a bad choice is refused with one clear line.
#[test]
fn gvisor_platform_is_reported_and_can_be_chosen() {
    if runsc().is_none() {
        return;
    }
    let work = tmp();
    let check = Command::new(bin())
        .args(["check", "--json"])
        .output()
        .unwrap();
    let check: Value = serde_json::from_slice(&check.stdout).unwrap();
    let line = check["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "gvisor platform")
        .unwrap_or_else(|| panic!("no gvisor platform line in check: {check}"))
        .clone();
    let chosen = line["detail"].as_str().unwrap().to_string();
    let name = chosen.split(' ').next().unwrap().to_string();
    assert!(
        ["kvm", "systrap", "ptrace"].contains(&name.as_str()),
        "{chosen}"
    );

    let (code, out, report) = gvisor_run(work.path(), &[], &["--", "/bin/true"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(report["isolation"]["platform"], chosen.as_str(), "{report}");

    let (code, out, report) = gvisor_run(
        work.path(),
        &[("AGENTJAIL_GVISOR_PLATFORM", "ptrace")],
        &["--", "/bin/sh", "-c", "echo ON-PTRACE"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ON-PTRACE"), "{out}");
    assert_eq!(
        report["isolation"]["platform"], "ptrace (chosen by AGENTJAIL_GVISOR_PLATFORM)",
        "{report}"
    );

    let (code, out, report) = gvisor_run(
        work.path(),
        &[("AGENTJAIL_GVISOR_PLATFORM", "warp-drive")],
        &["--", "/bin/sh", "-c", "echo MUST-NOT-RUN"],
    );
    assert_ne!(code, 0, "{out}");
    assert!(!out.contains("MUST-NOT-RUN"), "{out}");
    assert!(
        out.contains("AGENTJAIL_GVISOR_PLATFORM=warp-drive"),
        "{out}"
    );
    assert_eq!(report["status"], "setup_error", "{report}");
}

/// Issue #12 item 1 (gVisor tier): only AF_UNIX, AF_INET and AF_INET6 sockets. Inside a gVisor
/// run, `socket` and `socketpair` with every other family number the kernel knows (and beyond)
/// must fail with EPERM — the errno of the bundle's seccomp filter. Without the filter, gVisor
/// itself opens AF_NETLINK sockets and answers families it does not implement (AF_VSOCK, …)
/// with EAFNOSUPPORT, so EPERM tells "refused by us" from "failed anyway".
#[test]
fn gvisor_socket_families_are_an_allowlist() {
    if runsc().is_none() {
        return;
    }
    let work = tmp();
    let probe = work.path().join("families.py");
    std::fs::write(
        &probe,
        r#"import socket, ctypes
libc = ctypes.CDLL(None, use_errno=True)
for fam in list(range(0, 47)) + [64, 255, 2**31 - 1, -1]:
    for call in ("socket", "socketpair"):
        ctypes.set_errno(0)
        if call == "socket":
            r = libc.socket(fam, socket.SOCK_DGRAM, 0)
        else:
            sv = (ctypes.c_int * 2)()
            r = libc.socketpair(fam, socket.SOCK_STREAM, 0, sv)
        e = ctypes.get_errno()
        print("RESULT %s %d %s" % (call, fam, "ok" if r >= 0 else "errno=%d" % e), flush=True)
print("PROBE-COMPLETE", flush=True)
"#,
    )
    .unwrap();
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o644)).unwrap();
    let ro = format!("{}:/input/families.py", probe.display());
    let (code, out, report) = gvisor_run(
        work.path(),
        &[],
        &["--ro", &ro, "--", PY, "/input/families.py"],
    );
    assert_eq!(code, 0, "{out}\n{report}");
    assert!(out.contains("PROBE-COMPLETE"), "{out}");
    let mut wrong = Vec::new();
    for line in out.lines().filter_map(|l| l.strip_prefix("RESULT ")) {
        let f: Vec<&str> = line.split(' ').collect();
        let (call, fam, result) = (f[0], f[1].parse::<i64>().unwrap(), f[2]);
        let allowed = [1, 2, 10].contains(&fam);
        let ok = match (allowed, call) {
            (true, "socket") => result == "ok",
            // socketpair exists for AF_UNIX only; gVisor answers inet families with
            // ESOCKTNOSUPPORT (Linux: EOPNOTSUPP) — anything but our EPERM.
            (true, _) => {
                fam == 1 && result == "ok"
                    || fam != 1 && (result == "errno=94" || result == "errno=95")
            }
            (false, _) => result == "errno=1",
        };
        if !ok {
            wrong.push(line.to_string());
        }
    }
    assert!(
        out.lines().filter(|l| l.starts_with("RESULT ")).count() == 2 * 51,
        "{out}"
    );
    assert!(wrong.is_empty(), "not as the allowlist says: {wrong:?}");
}

/// All regular files below `dir` (symlinks not followed) whose content holds `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return found;
    };
    for e in rd.flatten() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            found.extend(files_holding(&e.path(), needle));
        } else if t.is_file()
            && std::fs::read(e.path()).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle))
        {
            found.push(e.path());
        }
    }
    found
}

/// Inline inputs (the service's code, by value) and the task's env on the gVisor tier, where
/// runsc needs a bundle folder on the host: while the run executes, the bundle's `inline`
/// folder is empty from the host's mount namespace and no file on the host holds the code;
/// `config.json` (the env values) cannot be read by another uid; and a runner killed with
/// SIGKILL (the service's cancel, guard or lost lease) leaves no file with the code behind.
/// The controls: the payload reads its code whole, and the bundle is where runsc says.
#[test]
fn gvisor_inline_inputs_and_env_stay_off_the_hosts_disk_and_other_uids() {
    if runsc().is_none() {
        return;
    }
    let work = tmp();
    let mark = format!("zz-gvisor-inline-{}", std::process::id());
    let secret = format!("zz-gvisor-env-{}", std::process::id());
    let code = format!(
        "# {mark}\nimport time\nprint('READ', len(open('/input/code.py').read()), flush=True)\ntime.sleep(30)\n"
    );
    let manifest = serde_json::json!({
        "command": [PY, "/input/code.py"],
        "isolation": "gvisor",
        "env": {"API_KEY": secret},
        "limits": {"seconds": 60},
        "inline_inputs": [{"mount": "/input/code.py", "content": code}],
    });
    let m = work.path().join("m.json");
    std::fs::write(&m, manifest.to_string()).unwrap();
    let report = work.path().join("report.json");
    let mut child = Command::new(bin())
        .arg("run")
        .arg("--manifest")
        .arg(&m)
        .arg("--report")
        .arg(&report)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The bundle and the state root runsc was given, once the sandbox has booted.
    let t0 = Instant::now();
    let (bundle, state) = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "runsc's sandbox never started"
        );
        let procs = runsc_descendants(child.id());
        let booted = procs.iter().any(|(_, a)| a.iter().any(|x| x == "boot"));
        let arg = |name: &str| {
            procs.iter().find_map(|(_, a)| {
                a.iter()
                    .position(|x| x == name)
                    .map(|i| PathBuf::from(&a[i + 1]))
            })
        };
        if let (true, Some(b), Some(r)) = (booted, arg("--bundle"), arg("--root")) {
            break (b, r.parent().unwrap().to_owned());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_secs(3));
    // The runner's folder (`agentjail-gvisor-*` in its temp folder), and every folder of that
    // name there: where the code would be if it went to a host file.
    let run_dir = bundle.parent().unwrap().to_owned();
    let gvisor_dirs = || -> Vec<PathBuf> {
        std::fs::read_dir(run_dir.parent().unwrap())
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("agentjail-gvisor-")
            })
            .map(|e| e.path())
            .collect()
    };
    let holding = |needle: &str| -> Vec<PathBuf> {
        gvisor_dirs()
            .iter()
            .flat_map(|d| files_holding(d, needle.as_bytes()))
            .collect()
    };
    let inline_listed: Vec<_> = std::fs::read_dir(bundle.join("inline"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    let on_disk = holding(&mark);
    let config = bundle.join("config.json");
    let config_mode = std::fs::metadata(&config).unwrap().permissions().mode() & 0o777;
    let other_read = python_as(
        OTHER_UID,
        &format!(
            "try:\n    open({:?}).read()\n    print('CONFIG ok')\nexcept OSError as e:\n    print('CONFIG errno=%d' % e.errno)\n",
            config.display().to_string()
        ),
    );
    // The runner dies as the service kills it (SIGKILL: no destructor runs).
    child.kill().unwrap();
    let o = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    // runsc's processes go with their runner; give them a moment.
    let t1 = Instant::now();
    let left = loop {
        let left = holding(&mark);
        if left.is_empty() || t1.elapsed() > Duration::from_secs(10) {
            break left;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let ctx = format!(
        "bundle {}\nstdout: {stdout}\nstderr: {}",
        bundle.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    // Sentinels: the payload ran and read its code; the bundle is a real bundle.
    assert!(
        stdout.contains(&format!("READ {}", code.len())),
        "the payload did not read its code\n{ctx}"
    );
    assert!(
        holding(&secret).contains(&config),
        "the bundle is not where runsc was told\n{ctx}"
    );
    assert!(
        inline_listed.is_empty(),
        "the host sees the inline files: {inline_listed:?}\n{ctx}"
    );
    assert!(
        on_disk.is_empty(),
        "the code is on the host's disk during the run: {on_disk:?}\n{ctx}"
    );
    assert_eq!(config_mode, 0o600, "config.json holds the env\n{ctx}");
    assert!(
        other_read.contains("CONFIG errno=13"),
        "another uid reads config.json: {other_read}\n{ctx}"
    );
    assert!(
        left.is_empty(),
        "a killed runner left the code on disk: {left:?}\n{ctx}"
    );
    // What the killed runner could not remove (its bundle, with config.json, and its state
    // folder) goes at the next gVisor run's start.
    assert!(run_dir.is_dir() && state.is_dir(), "{ctx}");
    let (code, _, report) = gvisor_run(work.path(), &[], &["--", "/bin/true"]);
    assert_eq!(code, 0, "{report}");
    assert!(
        !run_dir.exists() && !state.exists(),
        "the killed runner's folders were not swept: {} {}",
        run_dir.display(),
        state.display()
    );
}
