//! An init cloned ahead of its run ([`prespawn`]), and the clone itself ([`prespawn_now`],
//! which a run without a prespawned init calls too): the namespaces, the control channel and
//! output pipes, and the id maps written at once.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::inside::{self, InitArgs, ToInit};
use crate::outcome::kill_and_reap;
use crate::plan::{Plan, SANDBOX_ID};
use crate::step::{SetupError, Step, StepResult, step};
use crate::sys::{self, Cloned};

/// Base of the host uids that sandbox users map to in root mode (one per run: base + pid).
pub const HOST_UID_BASE: u32 = 1_000_000_000;

/// A sandbox init cloned ahead of its run: at the start of `agentjail run`
/// ([`prespawn`]), with its id maps written at once, so that it makes its network namespace
/// (the costliest part of start-up) and the host-image part of the root
/// (`plan::host_prefix`) while the caller parses and checks the request. It owns nothing of
/// the run yet and waits for its plan; if no run comes, it exits when this process does (its
/// control socket closes, and the parent-death signal is set).
pub struct Prespawned {
    pub(super) pidfd: OwnedFd,
    pub(super) ctl: OwnedFd,
    pub(super) out_r: OwnedFd,
    pub(super) err_r: OwnedFd,
    /// The host uid the sandbox's uid 0 maps to (the maps are written at the clone).
    pub(super) host_uid: u32,
}

/// The init [`prespawn`] made, with the mode it was made for.
static PRESPAWNED: std::sync::Mutex<Option<(bool, Prespawned)>> = std::sync::Mutex::new(None);

/// Clones a sandbox init now, for the next [`run_on`] of this process to use. Call it early,
/// from a single-threaded process; a failure here is not reported (the run clones its own
/// init and reports then).
pub fn prespawn() {
    let root_mode = rustix::process::geteuid().is_root();
    if let Ok(p) = prespawn_now(root_mode)
        && let Ok(mut slot) = PRESPAWNED.lock()
    {
        *slot = Some((root_mode, p));
    }
}

/// Kills and reaps an init that [`prespawn`] made and no run claimed (a refused request, a
/// dry run, the gVisor tier), so that it does not linger as a zombie under whoever adopts it.
pub fn discard_prespawned() {
    let p = PRESPAWNED.lock().ok().and_then(|mut slot| slot.take());
    if let Some((_, p)) = p {
        kill_and_reap(&p.pidfd);
    }
}

pub(super) fn take_prespawned(root_mode: bool) -> Option<Prespawned> {
    let (mode, p) = PRESPAWNED.lock().ok()?.take()?;
    if mode == root_mode {
        Some(p)
    } else {
        kill_and_reap(&p.pidfd);
        None
    }
}

pub(super) fn prespawn_now(root_mode: bool) -> StepResult<Prespawned> {
    if sys::thread_count().unwrap_or(1) > 1 {
        return Err(SetupError::new(
            Step::SingleThreaded,
            "internal: the engine must run in a single-threaded process",
        ));
    }
    let pair = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    );
    let pipes = (
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC),
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC),
    );
    let ((ctl_s, ctl_c), (out_r, out_w), (err_r, err_w)) = match (pair, pipes) {
        (Ok(p), (Ok(o), Ok(e))) => (p, o, e),
        (Err(e), _) | (_, (Err(e), _)) | (_, (_, Err(e))) => {
            return Err(SetupError::new(Step::CreateControlChannels, e));
        }
    };
    // The network and cgroup namespaces are not made here: the init makes the network one
    // first thing (so that its cost overlaps the supervisor's work) and the cgroup one once
    // it is in its cgroups (so that it sees them as its root).
    // The caller's CPUs, which the init gives back to itself (and so to the command) once it
    // runs elsewhere than this process (see below).
    let affinity = rustix::thread::sched_getaffinity(None).ok();
    let flags = (libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS) as u64;
    match sys::clone_sandbox(flags) {
        Err(e) => Err(SetupError::new(Step::CloneNamespaces, e)),
        Ok(Cloned::Child) => {
            drop((ctl_s, out_r, err_r));
            inside::init_main(InitArgs {
                plan: Plan::default(),
                ctl: ctl_c,
                stdout_w: Some(out_w),
                stderr_w: Some(err_w),
                root_mode,
                allow_degraded: false,
                cgroup_applied: false,
                cgroup_name: None,
                cgroup_files: Vec::new(),
                cgroup_dir: None,
                affinity,
                restore: None,
                stdin: None,
            })
        }
        Ok(Cloned::Parent { pid, pidfd }) => {
            crate::timing::mark("supervisor: init cloned");
            drop((ctl_c, out_w, err_w));
            // Start the init on another CPU than this one. Left to itself, the scheduler
            // often queues it behind this process, and the two run one after the other
            // although a CPU is idle; both have ~1 ms of work before the command can start.
            // The init restores the caller's CPU set once it has the maps (sent below), so
            // the command is not pinned.
            if let Some(all) = &affinity {
                let mut elsewhere = *all;
                elsewhere.unset(rustix::thread::sched_getcpu());
                if elsewhere.count() > 0 {
                    let _ = rustix::thread::sched_setaffinity(
                        rustix::process::Pid::from_raw(pid),
                        &elsewhere,
                    );
                }
            }
            // The id maps at once: with them, the init can start on the root while this
            // process parses and plans.
            let host_uid = if root_mode {
                HOST_UID_BASE + pid as u32
            } else {
                rustix::process::getuid().as_raw()
            };
            if let Err(e) = write_id_maps(pid, root_mode, host_uid)
                .and_then(|()| send_or_died(&ctl_s, &ToInit::Maps, &[]))
            {
                kill_and_reap(&pidfd);
                return Err(e);
            }
            crate::timing::mark("supervisor: id maps written");
            Ok(Prespawned {
                pidfd,
                ctl: ctl_s,
                out_r,
                err_r,
                host_uid,
            })
        }
    }
}

/// Writes the init's uid and gid maps.
fn write_id_maps(pid: i32, root_mode: bool, host_uid: u32) -> StepResult<()> {
    let proc = format!("/proc/{pid}");
    let write = |file: &'static str, content: String| {
        let r = std::fs::write(format!("{proc}/{file}"), &content);
        step(Step::WriteIdMap { file, content }, r)
    };
    if root_mode {
        // uid 0 inside is the init's own (host root, capabilities only in the new namespace);
        // the sandbox user is a host uid of its own, used by no one else.
        write("uid_map", format!("0 0 1\n{SANDBOX_ID} {host_uid} 1\n"))?;
        write("gid_map", format!("0 0 1\n{SANDBOX_ID} {host_uid} 1\n"))?;
    } else {
        let gid = rustix::process::getgid().as_raw();
        write("setgroups", "deny".into())?;
        write("uid_map", format!("{SANDBOX_ID} {host_uid} 1\n"))?;
        write("gid_map", format!("{SANDBOX_ID} {gid} 1\n"))?;
    }
    Ok(())
}

pub(super) fn send_or_died(ctl: &OwnedFd, msg: &ToInit, fds: &[BorrowedFd<'_>]) -> StepResult<()> {
    // The init reports its own failure first when it can; this is the fallback.
    inside::send_fds(ctl.as_fd(), msg, fds).map_err(|e| {
        SetupError::new(
            Step::SendToInit,
            format!("the sandbox init died during setup ({e})"),
        )
    })
}
