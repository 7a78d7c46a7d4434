//! A live session's control channel, relayed by the supervisor (`RunOptions::stdin`), so that
//! what happens between two cells is decided outside the sandbox, not by the interpreter that
//! runs the cells' code in its own process (and which a cell can rewrite: `os.kill = …`).
//!
//! The service's connection stays here; the command's stdin is the other end of a socket pair.
//! Frames (4-byte big-endian length, then the body, as `agentjail serve` writes them) are
//! passed one request, one answer at a time. After each answer, and before it is passed on,
//! every process of the sandbox but its init and the interpreter is killed: the descendants
//! of the init, found through `/proc/<pid>/task/<tid>/children` (or, on a kernel without
//! that file, a scan of `/proc`), each signalled through a pidfd opened before it is checked
//! (still a process of the sandbox's pid namespace, whose parent is one of the sandbox's), so
//! a pid reused by a host process is never signalled. Processes that keep forking faster than
//! they are killed end the sandbox: the cell's answer is then never passed on (the service
//! reports the interpreter lost). Threads inside the interpreter are its state, not processes
//! of the sandbox: they are not stopped (docs/api.md, "Live sessions").
//!
//! A request `{"seq": N, "checkpoint": true}` (the service's `POST …/checkpoint`) is not
//! passed on: the relay sweeps, then collects `/work` through the descriptor the init handed
//! over ([`crate::workspace`]) with the same walk, refusals and bounds as at the run's end
//! ([`agentjail_verify::checkpoint::build`]: beneath the folder, no link followed, nothing
//! but regular files and folders opened), and answers one frame: a JSON line (`{"seq",
//! "sha256", "files", "bytes", "rejected"}`, or `{"seq", "error"}`) then the archive. The
//! interpreter is not stopped meanwhile; threads a cell left running may change `/work`
//! during the walk (what they wrote is in the checkpoint or not, whole files as read).

use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{Receiver, Sender};
use std::time::Duration;

use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};

/// Largest request (a cell's code and its JSON) passed to the interpreter.
const REQUEST_LIMIT: u32 = 64 * 1024 * 1024;
/// Largest answer passed back (the service refuses more: `ANSWER_LIMIT` of its live.rs).
const ANSWER_LIMIT: u32 = 16 * 1024 * 1024;
/// How long the relay waits for the command to start before it gives up on the run.
const START_LIMIT: Duration = Duration::from_secs(60);
/// Passes of the sweep before processes that outrun it end the sandbox.
const SWEEP_PASSES: u32 = 200;

/// The relay's ends the supervisor hands on: the command's stdin (for the init), and where the
/// payload's pid (in the sandbox's pid namespace) goes once it started.
pub(crate) struct Started {
    pub command_end: OwnedFd,
    pub payload: Sender<i32>,
    /// Where `/work`'s descriptor goes once the init handed it over (a checkpoint on request).
    pub work: Sender<OwnedFd>,
}

/// The workspace's bounds for a checkpoint on request (the plan's): content bytes, entries.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub max_bytes: u64,
    pub max_files: u64,
}

/// The sandbox's `/work`, for checkpoints on request.
struct Work {
    rx: Receiver<OwnedFd>,
    fd: Option<OwnedFd>,
    bounds: Option<Bounds>,
}

/// Starts the relay between `service` (the live control connection) and a new socket pair,
/// for the sandbox whose init is `init` (a pidfd).
pub(crate) fn start(
    service: &OwnedFd,
    init: &OwnedFd,
    bounds: Option<Bounds>,
) -> std::io::Result<Started> {
    let (ours, command_end) = UnixStream::pair()?;
    let service = UnixStream::from(service.try_clone()?);
    let init = init.try_clone()?;
    let init_pid = pid_of_pidfd(&init)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let (work_tx, work_rx) = std::sync::mpsc::channel();
    let mut work = Work {
        rx: work_rx,
        fd: None,
        bounds,
    };
    std::thread::Builder::new()
        .name("live-relay".into())
        .spawn(move || {
            // Anything but the service's own end of the channel ends the sandbox now.
            if relay(&service, ours, init_pid, &rx, &mut work).is_none() {
                let _ = pidfd_send_signal(&init, Signal::KILL);
            }
            // Whatever ended the relay ends the channel both ways, whoever else holds it.
            let _ = rustix::net::shutdown(&service, rustix::net::Shutdown::Both);
        })?;
    Ok(Started {
        command_end: command_end.into(),
        payload: tx,
        work: work_tx,
    })
}

/// Passes frames until the service ends the channel (`Some`); `None` for anything else (a
/// frame too large, a broken channel, a sweep that failed, a command that never started), on
/// which the caller kills the sandbox.
fn relay(
    mut service: &UnixStream,
    mut command: UnixStream,
    init_pid: i32,
    payload: &Receiver<i32>,
    work: &mut Work,
) -> Option<()> {
    let mut interpreter: Option<i32> = None;
    loop {
        let Some(request) = read_frame(&mut service, REQUEST_LIMIT) else {
            // The service closed the channel: the interpreter reads its end and exits.
            let _ = command.shutdown(std::net::Shutdown::Write);
            return Some(());
        };
        if interpreter.is_none() {
            let found = payload
                .recv_timeout(START_LIMIT)
                .ok()
                .and_then(|ns_pid| child_with_ns_pid(init_pid, ns_pid));
            found?;
            interpreter = found;
        }
        let interpreter = interpreter?;
        if let Some(seq) = checkpoint_request(&request) {
            sweep(init_pid, interpreter).ok()?;
            write_frame(&mut service, &checkpoint(seq, work))?;
            continue;
        }
        write_frame(&mut command, &request)?;
        let answer = read_frame(&mut command, ANSWER_LIMIT)?;
        sweep(init_pid, interpreter).ok()?;
        write_frame(&mut service, &answer)?;
    }
}

/// The `seq` of a checkpoint request (`{"seq": N, "checkpoint": true}`); None for a cell.
fn checkpoint_request(request: &[u8]) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_slice(request).ok()?;
    if v.get("checkpoint").and_then(serde_json::Value::as_bool) != Some(true) {
        return None;
    }
    v.get("seq").and_then(serde_json::Value::as_u64)
}

/// The answer to checkpoint request `seq`: a JSON line, then the archive when one was made.
fn checkpoint(seq: u64, work: &mut Work) -> Vec<u8> {
    if work.fd.is_none() {
        work.fd = work.rx.try_recv().ok();
    }
    let made = match (&work.fd, work.bounds) {
        (Some(fd), Some(b)) => {
            let entries = usize::try_from(b.max_files).unwrap_or(usize::MAX);
            agentjail_verify::checkpoint::build(fd.as_fd(), b.max_bytes, entries)
                .map_err(|e| format!("the workspace could not be read: {e}"))
        }
        _ => Err("this sandbox has no workspace to collect".to_owned()),
    };
    let (head, archive) = match made {
        Ok(c) => match c.archive {
            Some(a) => (
                serde_json::json!({
                    "seq": seq,
                    "sha256": c.report.sha256,
                    "files": c.report.files,
                    "bytes": c.report.bytes,
                    "rejected": c.report.rejected.len() as u64 + c.report.rejected_dropped,
                }),
                a,
            ),
            None => {
                let why = c
                    .report
                    .rejected
                    .last()
                    .map(|r| r.reason.clone())
                    .unwrap_or_else(|| "the workspace is over its bounds".to_owned());
                (serde_json::json!({"seq": seq, "error": why}), Vec::new())
            }
        },
        Err(why) => (serde_json::json!({"seq": seq, "error": why}), Vec::new()),
    };
    let mut out = head.to_string().into_bytes();
    out.push(b'\n');
    out.extend_from_slice(&archive);
    out
}

fn read_frame(r: &mut impl Read, limit: u32) -> Option<Vec<u8>> {
    let mut head = [0u8; 4];
    r.read_exact(&mut head).ok()?;
    let n = u32::from_be_bytes(head);
    if n > limit {
        return None;
    }
    let mut body = vec![0u8; n as usize];
    r.read_exact(&mut body).ok()?;
    Some(body)
}

/// Writes one frame in one write where it fits (the reader wakes once, not for the header and
/// again for the body).
fn write_frame(w: &mut impl Write, body: &[u8]) -> Option<()> {
    let n = u32::try_from(body.len()).ok()?;
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&n.to_be_bytes());
    frame.extend_from_slice(body);
    w.write_all(&frame).ok()
}

/// The pid (in our pid namespace) of the process behind a pidfd (`Pid:` of its fdinfo).
fn pid_of_pidfd(fd: &OwnedFd) -> std::io::Result<i32> {
    use std::os::fd::AsRawFd;
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_fd().as_raw_fd()))?;
    info.lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|v| v.trim().parse().ok())
        .filter(|p: &i32| *p > 0)
        .ok_or_else(|| std::io::Error::other("the init's pidfd names no live process"))
}

/// What `/proc/<pid>/status` says of a process.
struct Status {
    ppid: i32,
    /// Its pid in each pid namespace, from ours down to its own.
    ns_pids: Vec<i32>,
    /// Its main thread is a zombie or dead (other threads may still run: see [`alive`]).
    gone: bool,
}

fn status(pid: i32) -> Option<Status> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mut s = Status {
        ppid: 0,
        ns_pids: Vec::new(),
        gone: false,
    };
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("State:") {
            s.gone = matches!(v.trim_start().chars().next(), Some('Z' | 'X'));
        } else if let Some(v) = line.strip_prefix("PPid:") {
            s.ppid = v.trim().parse().unwrap_or(0);
        } else if let Some(v) = line.strip_prefix("NSpid:") {
            s.ns_pids = v
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
        }
    }
    Some(s)
}

/// The process (or thread) is gone: its `/proc` entry is missing or went away mid-read.
fn vanished(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

/// The children of `pid` (every thread's), or none once it is gone. Any other failure to read
/// them is an error (the sweep then fails closed), never an empty list.
fn children(pid: i32) -> Result<Vec<i32>, ()> {
    let tasks = match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(t) => t,
        Err(e) if vanished(&e) => return Ok(Vec::new()),
        Err(_) => return Err(()),
    };
    let mut out = Vec::new();
    for t in tasks {
        let t = t.map_err(|_| ())?;
        match std::fs::read_to_string(t.path().join("children")) {
            Ok(list) => out.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            ),
            // A kernel without CONFIG_PROC_CHILDREN: every process's parent, from /proc.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && t.path().exists() => {
                return children_by_scan(pid);
            }
            Err(e) if vanished(&e) => {}
            Err(_) => return Err(()),
        }
    }
    Ok(out)
}

/// Whether any thread of `pid` still runs: a process whose main thread exited shows `Z` in
/// its status while its other threads go on. Unreadable counts as alive (it is signalled).
fn alive(pid: i32) -> bool {
    let tasks = match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(t) => t,
        Err(e) if vanished(&e) => return false,
        Err(_) => return true,
    };
    for t in tasks {
        let Ok(t) = t else { return true };
        match std::fs::read_to_string(t.path().join("stat")) {
            Ok(stat) => {
                let state = stat
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().next());
                if !matches!(state, Some("Z" | "X")) {
                    return true;
                }
            }
            Err(e) if vanished(&e) => {}
            Err(_) => return true,
        }
    }
    false
}

fn children_by_scan(pid: i32) -> Result<Vec<i32>, ()> {
    let procs = std::fs::read_dir("/proc").map_err(|_| ())?;
    Ok(procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| status(*p).is_some_and(|s| s.ppid == pid))
        .collect())
}

/// The child of the init whose pid in the sandbox's namespace is `ns_pid`: the interpreter.
fn child_with_ns_pid(init_pid: i32, ns_pid: i32) -> Option<i32> {
    children(init_pid)
        .ok()?
        .into_iter()
        .find(|c| status(*c).is_some_and(|s| s.ns_pids.last() == Some(&ns_pid) && !s.gone))
}

/// Kills every live process under the init but `interpreter`; `Err` if some outran
/// [`SWEEP_PASSES`] passes.
fn sweep(init_pid: i32, interpreter: i32) -> Result<(), ()> {
    let depth = status(init_pid).map(|s| s.ns_pids.len()).ok_or(())?;
    for pass in 0..SWEEP_PASSES {
        let mut sandbox: HashSet<i32> = HashSet::from([init_pid]);
        let mut queue = vec![init_pid];
        let mut killed = 0u32;
        while let Some(p) = queue.pop() {
            for c in children(p)? {
                if !sandbox.insert(c) {
                    continue;
                }
                queue.push(c);
                if c != interpreter && kill_if_ours(c, &sandbox, depth) {
                    killed += 1;
                }
            }
        }
        if killed == 0 {
            return Ok(());
        }
        // Give the killed a moment to become zombies (or be reaped) before looking again.
        std::thread::sleep(Duration::from_micros(200 * u64::from(pass.min(20) + 1)));
    }
    Err(())
}

/// Signals `pid` through a pidfd opened first, if it is, once opened, a process of the
/// sandbox (as deep in pid namespaces as the init, its parent one of the sandbox's) with a
/// thread still running. True if it was signalled.
fn kill_if_ours(pid: i32, sandbox: &HashSet<i32>, depth: usize) -> bool {
    let Some(p) = Pid::from_raw(pid) else {
        return false;
    };
    let Ok(fd) = pidfd_open(p, PidfdFlags::empty()) else {
        return false;
    };
    match status(pid) {
        Some(s) if s.ns_pids.len() == depth && sandbox.contains(&s.ppid) && alive(pid) => {
            pidfd_send_signal(&fd, Signal::KILL).is_ok()
        }
        _ => false,
    }
}
