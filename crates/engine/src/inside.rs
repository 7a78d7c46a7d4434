//! What runs inside the new namespaces: the sandbox's init (pid 1) and, cloned from it, the
//! payload that becomes the command.
//!
//! The init makes its network namespace, waits for its id maps ([`ToInit::Maps`]), builds the
//! host part of the root, then the rest from the plan ([`ToInit::Go`]), receives the run's
//! cgroups ([`ToInit::Cgroups`]; it stays outside them), says [`ToSupervisor::Ready`], then
//! clones the payload (into the cgroup with v2; sharing its memory until exec), serves the
//! seccomp listener (recording each refused syscall), reaps every process, and when the payload
//! ends kills whatever it left behind (double-forked daemons included) before reporting. It never
//! runs untrusted code, is not dumpable, and holds its own creds (uid 0 of the user namespace in
//! root mode, the caller's uid otherwise).
//!
//! The payload drops everything in kernel-required order — session, fds, securebits, bounding
//! set, ids, capabilities, rlimits, Landlock (with no_new_privs), seccomp last — and execs.
//!
//! The control messages and their framing are in `inside/control.rs`; building the root from
//! the plan (the interpreter of [`crate::plan::Op`]) is in `inside/root.rs`.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use rustix::event::{PollFd, PollFlags, poll};
use rustix::fs::{Mode, OFlags};

use crate::plan::{Access, Plan, SANDBOX_ID};
use crate::root_sys::Host;
use crate::seccomp;
use crate::step::{SetupError, Source, Step, StepResult};

/// Runs one set-up step of the init or the payload: its result, or a [`SetupError`] naming
/// it; marked for `AGENTJAIL_DEBUG_TIMING`.
fn step<T, E: Into<Source>>(s: Step, r: Result<T, E>) -> StepResult<T> {
    if timing::every_step() {
        timing::mark(&s.to_string());
    }
    crate::step::step(s, r)
}
use crate::sys;
use crate::timing;

mod control;
mod rlimits;
mod root;
pub use control::{Applied, FromPayload, ToInit, ToSupervisor, recv, recv_fds, send, send_fds};
use rlimits::apply_rlimits;
use root::{Made, apply, finish_root};

/// How the init was started.
pub struct InitArgs {
    /// Received from the supervisor with [`ToInit::Go`].
    pub plan: Plan,
    pub ctl: OwnedFd,
    pub stdout_w: Option<OwnedFd>,
    pub stderr_w: Option<OwnedFd>,
    /// Root mode: uid 0 inside maps to host root and the sandbox user to a separate uid.
    pub root_mode: bool,
    pub allow_degraded: bool,
    /// Learnt from the supervisor before the payload starts: whether cgroup limits are in
    /// place (decides the rlimit layer).
    pub cgroup_applied: bool,
    /// The run's cgroups as the supervisor handed them over: their name and the files the
    /// payload writes itself into (see [`join_cgroups`]).
    pub cgroup_name: Option<String>,
    pub cgroup_files: Vec<OwnedFd>,
    /// v2: the run's cgroup directory, into which the payload is cloned.
    pub cgroup_dir: Option<OwnedFd>,
    /// The caller's CPU set: the supervisor starts the init on other CPUs than its own, and
    /// the init restores this once it runs (before the command inherits its set).
    pub affinity: Option<rustix::thread::CpuSet>,
    /// The sealed memfd of the workspace checkpoint to restore ([`crate::workspace`]).
    pub restore: Option<OwnedFd>,
    /// The command's stdin when the caller gave one (a live session's control socket).
    pub stdin: Option<OwnedFd>,
}

/// Puts `/dev/null` on stdin (the init's own, then the command's).
fn stdin_from_dev_null() -> StepResult<()> {
    let null = step(
        Step::OpenDevNull,
        rustix::fs::open("/dev/null", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty()),
    )?;
    step(Step::RedirectStdin, sys::dup2(null.as_raw_fd(), 0))
}

/// Entry point of the sandbox's init. Never returns.
pub fn init_main(mut a: InitArgs) -> ! {
    let code = match init(&mut a) {
        Ok(()) => 0,
        Err(e) => {
            let (step, error) = e.into_pair();
            let _ = send(
                a.ctl.as_fd(),
                &ToSupervisor::SetupFailed { step, error },
                None,
            );
            1
        }
    };
    sys::exit_now(code)
}

fn init(a: &mut InitArgs) -> StepResult<()> {
    // If the supervisor dies, so does the sandbox (the pid namespace dies with its init).
    step(
        Step::SetParentDeathSignal,
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL)),
    )?;
    timing::mark("init: started");
    // The init never reads stdin. The runner's may be `agentjail serve`'s lifeline, the socket
    // its results go back on: the init, cloned with the runner's descriptors, lets go of it
    // before anything of the run happens (the command gets /dev/null in any case).
    stdin_from_dev_null()?;
    // The network namespace is made here rather than by the clone, so that its creation (the
    // costliest namespace, ~0.5 ms) overlaps the supervisor's work on the id maps and cgroups.
    // Created from inside the new user namespace, it belongs to it, as with the clone.
    step(
        Step::CreateNetworkNamespace,
        sys::unshare(libc::CLONE_NEWNET),
    )?;
    step(Step::BringLoopbackUp, sys::loopback_up())?;
    step(
        Step::SetHostName,
        rustix::system::sethostname(crate::plan::HOSTNAME.as_bytes()),
    )?;
    timing::mark("init: network namespace made");
    // Before the plan, a closed socket is the normal end of an init cloned for a run that
    // did not happen (refused, a dry run, another tier): leave quietly.
    match step(Step::WaitForIdMaps, recv::<ToInit>(a.ctl.as_fd()))? {
        Some((ToInit::Maps, _)) => {}
        None => sys::exit_now(0),
        _ => return Err(SetupError::new(Step::WaitForIdMaps, "unexpected message")),
    }
    // The supervisor moved us away from its CPU before it sent the maps: give back the
    // caller's CPUs now, so that the command may use all of them. (This fails only if the
    // caller's cpuset changed meanwhile; the run then keeps the smaller set rather than fail.)
    if let Some(all) = &a.affinity {
        let _ = rustix::thread::sched_setaffinity(None, all);
        timing::step_mark("restore the CPU set");
    }
    // Only now: the supervisor, unprivileged, could not have written the maps of a
    // non-dumpable process.
    step(
        Step::MakeInitNonDumpable,
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable),
    )?;
    // While the supervisor parses, validates and plans: the parts of the root that every run
    // on the host image has (see `plan::host_prefix`). Their outcome counts only if the plan
    // starts with them.
    timing::mark("init: building the root");
    let mut made = Made::default();
    let prefix = crate::plan::host_prefix();
    let started = start_root();
    // Built only on a started root (whose failure, if any, is reported first below).
    let early = started.is_ok().then(|| {
        prefix
            .iter()
            .try_for_each(|op| apply(&mut Host, op, &mut made))
    });
    timing::mark("init: host part of the root built");
    match step(Step::WaitForPlan, recv_fds::<ToInit>(a.ctl.as_fd()))? {
        Some((
            ToInit::Go {
                allow_degraded,
                stdin,
            },
            fds,
        )) if !fds.is_empty() => {
            a.allow_degraded = allow_degraded;
            let mut fds = fds.into_iter();
            if let Some(plan) = fds.next() {
                a.plan = step(Step::ReadPlan, read_plan(plan))?;
            }
            // Then the memfd of the copies (when some `Op::Copy`), then the checkpoint's.
            if a.plan
                .ops
                .iter()
                .any(|o| matches!(o, crate::plan::Op::Copy { .. }))
            {
                made.copies = fds.next();
            }
            if a.plan.workspace.as_ref().is_some_and(|w| w.restore) {
                a.restore = fds.next();
            }
            // Last, the command's stdin.
            if stdin {
                a.stdin = fds.next();
            }
        }
        None => sys::exit_now(0),
        _ => return Err(SetupError::new(Step::WaitForPlan, "unexpected message")),
    }
    // The staging root is the same for every plan: its failure is the run's (reported now
    // that the supervisor listens).
    started?;
    let rest = if a.plan.ops.starts_with(&prefix) {
        if let Some(built) = early {
            built?;
        }
        &a.plan.ops[prefix.len()..]
    } else {
        // Another image: start again on an empty new root.
        discard_root(&mut made)?;
        &a.plan.ops[..]
    };
    finish_root(&mut Host, rest, &mut made)?;
    timing::mark("init: root built");
    if let Some(port) = a.plan.proxy_port {
        // Created here, so it belongs to the sandbox's network namespace; served outside.
        let l = step(
            Step::ListenOnProxyPort,
            std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port)),
        )?;
        step(
            Step::HandOverProxySocket,
            send(a.ctl.as_fd(), &ToSupervisor::Listener, Some(l.as_fd())),
        )?;
    }
    let sigchld = step(Step::BlockSigchld, sys::sigchld_fd())?;

    let out = step(
        Step::OpenOutput,
        rustix::fs::open(
            "/output",
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        ),
    )?;
    receive_cgroups(a)?;
    crate::workspace::hand_over_work(a.plan.workspace.as_ref(), a.ctl.as_fd())?;
    step(
        Step::ReportReady,
        send(a.ctl.as_fd(), &ToSupervisor::Ready, Some(out.as_fd())),
    )?;
    drop(out);

    let (to_payload, from_payload) = step(
        Step::CreatePayloadSocket,
        rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        ),
    )?;
    let pid = {
        let args: &InitArgs = a;
        let sock = from_payload.as_fd();
        // v2: the payload is born in the run's cgroup (CLONE_INTO_CGROUP); where the kernel
        // refuses that, it moves itself in through `cgroup.procs` (see `join_cgroups`).
        let into = args.cgroup_dir.as_ref().and_then(|dir| {
            sys::spawn_into_cgroup(dir.as_fd(), &mut || payload_main(args, sock)).ok()
        });
        match into {
            Some(pid) => {
                timing::mark("init: command cloned into its cgroup (CLONE_INTO_CGROUP)");
                pid
            }
            None => step(
                Step::StartCommand,
                sys::spawn_sharing_memory(&mut || payload_main(args, sock)),
            )?,
        }
    };
    drop(from_payload);
    // The command has joined its cgroups (or failed and said so): the files are done with.
    a.cgroup_files.clear();
    a.cgroup_dir = None;
    // Our copies of the command's stdout/stderr must go, or the supervisor never sees EOF.
    drop(a.stdout_w.take());
    drop(a.stderr_w.take());

    // The payload sends what it applied with the seccomp listener, then either the socket
    // closes (exec succeeded: the fd was close-on-exec) or an error follows.
    let mut listener: Option<OwnedFd> = None;
    loop {
        match recv::<FromPayload>(to_payload.as_fd()) {
            Ok(Some((FromPayload::Applied(ap), fd))) => {
                listener = fd;
                let _ = send(a.ctl.as_fd(), &ToSupervisor::Applied(ap), None);
            }
            Ok(Some((FromPayload::ExecFailed { program, error }, _))) => {
                let m = ToSupervisor::ExecFailed { program, error };
                let _ = send(a.ctl.as_fd(), &m, None);
            }
            Ok(Some((FromPayload::SetupFailed { step, error }, _))) => {
                let m = ToSupervisor::SetupFailed { step, error };
                let _ = send(a.ctl.as_fd(), &m, None);
            }
            Ok(None) | Err(_) => break,
        }
    }
    drop(to_payload);
    timing::mark("init: command started");
    let _ = send(a.ctl.as_fd(), &ToSupervisor::Started { payload: pid }, None);

    let mut payload_status: Option<i32> = None;
    while payload_status.is_none() {
        let mut fds = vec![PollFd::new(&sigchld, PollFlags::IN)];
        if let Some(l) = &listener {
            fds.push(PollFd::new(l, PollFlags::IN));
        }
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            // Anything else would come back on every turn (e.g. EINVAL once RLIMIT_NOFILE is
            // below the number of fds): never spin, end the run.
            Err(e) => return Err(abandon("wait for the command (poll)", e)),
        }
        let listener_events = fds
            .get(1)
            .map(|f| f.revents())
            .unwrap_or(PollFlags::empty());
        let child_ready = !fds[0].revents().is_empty();
        drop(fds);
        if listener_events.contains(PollFlags::IN)
            && let Some(l) = &listener
        {
            serve_notification(l, a.ctl.as_fd())
                .map_err(|e| abandon("serve the seccomp listener", e))?;
        } else if listener_events.intersects(PollFlags::HUP | PollFlags::ERR) {
            // No process uses the filter any more (all of them exited). The hang-up stays
            // raised, so keep the listener out of the poll set from now on.
            listener = None;
        }
        if child_ready {
            let mut buf = [0u8; 128];
            loop {
                match rustix::io::read(&sigchld, &mut buf) {
                    Ok(n) if n > 0 => {}
                    Ok(_) | Err(rustix::io::Errno::AGAIN) => break,
                    Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(abandon("read SIGCHLD", e)),
                }
            }
            while let Some((p, st)) = sys::wait_any_nohang() {
                if p == pid {
                    payload_status = Some(st);
                }
            }
        }
    }
    timing::mark("init: command exited");
    // The command is over: nothing it started may outlive it.
    sys::kill_all_others();
    drop(listener);
    while sys::wait_any().is_some() {}
    let ru = sys::rusage_children();
    let cpu_us = (ru.ru_utime.tv_sec as u64 * 1_000_000 + ru.ru_utime.tv_usec as u64)
        + (ru.ru_stime.tv_sec as u64 * 1_000_000 + ru.ru_stime.tv_usec as u64);
    timing::mark("init: reaped all");
    let _ = send(
        a.ctl.as_fd(),
        &ToSupervisor::Exit {
            status: payload_status.unwrap_or(0),
            cpu_us,
            maxrss_kb: ru.ru_maxrss as u64,
        },
        None,
    );
    Ok(())
}

/// Reads the plan the supervisor wrote into a memfd.
fn read_plan(fd: OwnedFd) -> std::io::Result<Plan> {
    use std::io::{Read, Seek};
    let mut f = std::fs::File::from(fd);
    // The file description is the supervisor's, its offset past what it wrote.
    f.seek(std::io::SeekFrom::Start(0))?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    serde_json::from_slice(&bytes).map_err(std::io::Error::other)
}

/// Receives the run's cgroups from the supervisor (the files stay open for the payload).
fn receive_cgroups(a: &mut InitArgs) -> StepResult<()> {
    match step(Step::ReceiveCgroups, recv_fds::<ToInit>(a.ctl.as_fd()))? {
        Some((
            ToInit::Cgroups {
                applied,
                name,
                into_dir,
            },
            mut files,
        )) => {
            a.cgroup_applied = applied;
            a.cgroup_name = name;
            a.cgroup_dir = if into_dir { files.pop() } else { None };
            a.cgroup_files = files;
            Ok(())
        }
        _ => Err(SetupError::new(
            Step::ReceiveCgroups,
            "supervisor went away",
        )),
    }
}

/// The payload's first step: it moves itself into the run's cgroups (writing `0`, meaning the
/// writer, into each file the supervisor opened: v1 `tasks`, v2 `cgroup.procs`), checks that
/// the kernel shows it there, and refuses to go on otherwise; then it moves into a cgroup
/// namespace rooted there (the command sees its cgroup as `/`). Everything the command ever
/// starts is inside. The init stays outside, so that the cgroups are empty, and removable,
/// as soon as the init has reaped the command's last process.
fn join_cgroups(a: &InitArgs) -> StepResult<()> {
    let born_inside = a.cgroup_name.as_ref().is_some_and(|name| {
        std::fs::read_to_string("/proc/self/cgroup").is_ok_and(|t| crate::cgroup::lists(&t, name))
    });
    if !born_inside {
        for f in &a.cgroup_files {
            step(Step::JoinCgroups, rustix::io::write(f, b"0"))?;
        }
    }
    if let Some(name) = &a.cgroup_name {
        let text = step(
            Step::ReadOwnCgroup,
            std::fs::read_to_string("/proc/self/cgroup"),
        )?;
        if !crate::cgroup::lists(&text, name) {
            return Err(SetupError::new(
                Step::CheckCgroupJoined,
                format!("not in cgroup {name} after joining; refusing to run"),
            ));
        }
    }
    step(
        Step::CreateCgroupNamespace,
        sys::unshare(libc::CLONE_NEWCGROUP),
    )
}

/// Reads one notification, records it, and answers with the refusal's errno (EPERM, or
/// EAFNOSUPPORT for a socket family). A notification whose caller is gone meanwhile (ENOENT)
/// or an interrupted read is no error; anything else is returned (the caller ends the run).
fn serve_notification(listener: &OwnedFd, ctl: BorrowedFd<'_>) -> std::io::Result<()> {
    let n = match sys::notif_recv(listener) {
        Ok(n) => n,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::EINTR)) => {
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let nr = n.nr as i64;
    let name = seccomp::syscall_name(nr, &n.args);
    let _ = send(ctl, &ToSupervisor::Denial { syscall: name }, None);
    match sys::notif_deny(listener, n.id, seccomp::refusal_errno(nr, &n.args)) {
        // The caller was killed before the answer: nothing to answer.
        Err(e) if e.raw_os_error() != Some(libc::ENOENT) => Err(e),
        _ => Ok(()),
    }
}

/// An unexpected error while the command runs: kills every process of the sandbox, reaps
/// them, and returns the error that ends the run as a setup/internal failure (the init then
/// exits; the supervisor reports `setup_error` naming the step).
fn abandon(what: &'static str, e: impl std::fmt::Display) -> SetupError {
    sys::kill_all_others();
    while sys::wait_any().is_some() {}
    SetupError::new(
        Step::EventLoop(what),
        format!("{e} (internal error; every process of the sandbox was killed)"),
    )
}

/// Starts the new root: a staging tmpfs pivoted into (the host's root moves below it), and
/// an empty tmpfs at /newroot on which [`apply`] builds.
fn start_root() -> StepResult<()> {
    use rustix::mount::*;
    step(
        Step::MakeRootPrivate,
        mount_change(
            "/",
            MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
        ),
    )?;
    step(
        Step::MountStagingTmpfs,
        mount(
            "agentjail",
            "/tmp",
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            Some(c"size=64k,nr_inodes=32,mode=0755"),
        ),
    )?;
    for d in ["/tmp/oldroot", "/tmp/newroot"] {
        step(Step::MkdirStaging(d), std::fs::create_dir(d))?;
    }
    step(
        Step::PivotToStaging,
        rustix::process::pivot_root("/tmp", "/tmp/oldroot"),
    )?;
    step(Step::ChdirStagingRoot, std::env::set_current_dir("/"))?;
    new_root_tmpfs()?;
    // Files and directories get exactly the modes asked for, whatever the caller's umask.
    rustix::process::umask(Mode::empty());
    Ok(())
}

fn new_root_tmpfs() -> StepResult<()> {
    use rustix::mount::*;
    step(
        Step::MountNewRootTmpfs,
        mount(
            "agentjail",
            "/newroot",
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            Some(c"size=1m,nr_inodes=4096,mode=0755"),
        ),
    )
}

/// Throws away what was built at /newroot (for a plan on another image, whether the host
/// part was built or failed half-way) and starts again on an empty tmpfs.
fn discard_root(made: &mut Made) -> StepResult<()> {
    let copies = made.copies.take();
    *made = Made::default();
    made.copies = copies;
    step(
        Step::DiscardHostRoot,
        rustix::mount::unmount("/newroot", rustix::mount::UnmountFlags::DETACH),
    )?;
    new_root_tmpfs()
}

/// The payload: drops everything and execs the command. Never returns.
/// The command's process until it execs: runs in the init's memory (see
/// `sys::spawn_sharing_memory`), so it only borrows the init's data and ends in exec or exit.
fn payload_main(a: &InitArgs, sock: BorrowedFd<'_>) -> ! {
    let program = a.plan.argv.first().cloned().unwrap_or_default();
    let msg = match payload(a, sock) {
        Ok(e) => FromPayload::ExecFailed { program, error: e },
        Err(e) => {
            let (step, error) = e.into_pair();
            FromPayload::SetupFailed { step, error }
        }
    };
    let _ = send(sock.as_fd(), &msg, None);
    sys::exit_now(127)
}

/// Returns only on failure: `Ok(reason)` when exec failed, `Err` when a setup step did.
fn payload(a: &InitArgs, sock: BorrowedFd<'_>) -> StepResult<String> {
    join_cgroups(a)?;
    sys::reset_signals();
    sys::setsid();
    for (fd, to, name) in [(&a.stdout_w, 1, "stdout"), (&a.stderr_w, 2, "stderr")] {
        if let Some(fd) = fd {
            step(Step::RedirectOutput(name), sys::dup2(fd.as_raw_fd(), to))?;
        }
    }
    match &a.stdin {
        Some(fd) => step(Step::RedirectStdin, sys::dup2(fd.as_raw_fd(), 0))?,
        None => stdin_from_dev_null()?,
    }
    step(
        Step::ChdirCwd(a.plan.cwd.clone()),
        std::env::set_current_dir(&a.plan.cwd),
    )?;
    // The init built the root with umask 0; the command gets the usual one.
    rustix::process::umask(Mode::from_raw_mode(0o022));

    // Capabilities: lock the securebits and empty the bounding set while we still hold
    // CAP_SETPCAP, then change ids, then clear the remaining sets.
    step(Step::LockSecurebits, sys::lock_securebits())?;
    step(Step::DropBoundingSet, sys::drop_bounding_set())?;
    step(
        Step::ClearAmbientCapabilities,
        caps::clear(None, caps::CapSet::Ambient),
    )?;
    step(
        Step::BecomeSandboxUser,
        sys::become_user(SANDBOX_ID, SANDBOX_ID, a.root_mode),
    )?;
    for set in [
        caps::CapSet::Effective,
        caps::CapSet::Inheritable,
        caps::CapSet::Permitted,
    ] {
        step(Step::ClearCapabilities, caps::clear(None, set))?;
    }
    crate::workspace::restore_in_payload(a.plan.workspace.as_ref(), a.restore.as_ref())?;

    let mut applied = Applied {
        rlimits: apply_rlimits(&a.plan.limits, a.cgroup_applied, a.root_mode)?,
        ..Applied::default()
    };
    applied.landlock_abi = apply_landlock(a, &mut applied.degraded)?;
    step(Step::SetNoNewPrivs, rustix::thread::set_no_new_privs(true))?;

    let prog = step(Step::BuildSeccompFilter, seccomp::build_filter(true))?;
    let listener = match sys::seccomp_set_filter(
        &prog,
        libc::SECCOMP_FILTER_FLAG_NEW_LISTENER as u32,
    ) {
        Ok(l) => {
            applied.seccomp_notify = true;
            l
        }
        Err(e) if a.allow_degraded => {
            applied
                .degraded
                .push(format!("seccomp user notification unavailable ({e}): refused syscalls fail with EPERM but are not reported"));
            let prog = step(Step::BuildSeccompFilter, seccomp::build_filter(false))?;
            step(
                Step::InstallSeccompFilter,
                sys::seccomp_set_filter(&prog, 0),
            )?
        }
        Err(e) => return Err(SetupError::new(Step::InstallSeccompFilter, e)),
    };
    step(
        Step::ReportApplied,
        send(
            sock.as_fd(),
            &FromPayload::Applied(applied),
            listener.as_ref().map(|l| l.as_fd()),
        ),
    )?;
    drop(listener);
    step(Step::CloseInheritedFds, sys::cloexec_from(3))?;
    timing::mark("payload: protections applied");

    let argv: Vec<CString> = a
        .plan
        .argv
        .iter()
        .map(|s| CString::new(s.as_str()))
        .collect::<Result<_, _>>()
        .map_err(|e| SetupError::new(Step::Command, e))?;
    let envp: Vec<CString> = a
        .plan
        .env
        .iter()
        .map(|(k, v)| CString::new(format!("{k}={v}")))
        .collect::<Result<_, _>>()
        .map_err(|e| SetupError::new(Step::Env, e))?;
    let program = &a.plan.argv[0];
    let candidates: Vec<String> = if program.contains('/') {
        vec![program.clone()]
    } else {
        let path = a
            .plan
            .env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.as_str())
            .unwrap_or(crate::plan::DEFAULT_PATH);
        path.split(':')
            .filter(|d| !d.is_empty())
            .map(|d| format!("{d}/{program}"))
            .collect()
    };
    let mut first_err: Option<std::io::Error> = None;
    for c in candidates {
        let Ok(path) = CString::new(c) else { continue };
        let e = sys::execve(&path, &argv, &envp);
        let skip = matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR));
        if (first_err.is_none() || !skip)
            && first_err
                .as_ref()
                .map(|f| f.raw_os_error() == Some(libc::ENOENT))
                .unwrap_or(true)
        {
            first_err = Some(e);
        }
    }
    Ok(match first_err {
        Some(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            "not found in the sandbox (no such file, or not on PATH)".to_string()
        }
        Some(e) => e.to_string(),
        None => "not found".to_string(),
    })
}

/// Landlock: the payload may reach exactly the plan's mounts, with the plan's access, and no
/// TCP bind or connect, and may not signal or reach abstract sockets outside its domain — as far
/// as the kernel's ABI goes. What an older ABI lacks is covered by other layers
/// ([`crate::landlock_policy`]); only a kernel without Landlock refuses a strict run.
fn apply_landlock(a: &InitArgs, degraded: &mut Vec<String>) -> StepResult<Option<u32>> {
    use crate::landlock_policy::{self, WANTED_ABI};
    use landlock::{
        ABI, Access as _, AccessFs, AccessNet, CompatLevel, Compatible, LandlockStatus,
        PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
    };
    // The rights of ABI 6 at most (file system incl. refer, truncate and device ioctls, TCP
    // bind/connect, signal/abstract-socket scoping), and no more than the kernel offers (in
    // debug builds, the tests' cap may lower that).
    let kernel_abi = landlock_policy::effective_abi();
    let used = kernel_abi.min(WANTED_ABI);
    let refuse_or_degrade = |why: String, degraded: &mut Vec<String>| {
        if !a.allow_degraded {
            return Err(SetupError::new(
                Step::LandlockRefused,
                format!("{why}; refusing (use --allow-degraded to run anyway)"),
            ));
        }
        degraded.push(why);
        Ok(None)
    };
    if let Err(why) = landlock_policy::requirement(used) {
        return refuse_or_degrade(why.to_string(), degraded);
    }
    // `used` is 1..=6 here; the conversion exists for exactly this (a number the kernel gave).
    let abi = ABI::from(used as i32);
    let err = |e: landlock::RulesetError| SetupError::new(Step::Landlock, e);
    let all = AccessFs::from_all(abi);
    let read = AccessFs::from_read(abi) & !AccessFs::Execute;
    let read_exec = AccessFs::from_read(abi);
    let device = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev;
    let write = all & !(AccessFs::MakeChar | AccessFs::MakeBlock);
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .map_err(err)?;
    if used >= 4 {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(abi))
            .map_err(err)?;
    }
    if used >= 6 {
        ruleset = ruleset.scope(Scope::from_all(abi)).map_err(err)?;
    }
    let mut ruleset = ruleset.create().map_err(err)?;
    for (path, acc) in &a.plan.rules {
        let rights = match acc {
            Access::ReadExec => read_exec,
            Access::Read => read,
            Access::Device => device,
            Access::Write { exec: true } => write,
            Access::Write { exec: false } => write & !AccessFs::Execute,
            Access::ListOnly => AccessFs::ReadDir.into(),
        } & all; // a rule may carry only handled rights (no IoctlDev below ABI 5)
        let fd = step(Step::LandlockOpen(path.clone()), PathFd::new(path))?;
        // Rules on a file may only carry file rights. (Asked of the fd just opened: no second
        // path walk, and no window in which the path could name something else.)
        let is_dir = rustix::fs::fstat(std::os::fd::AsFd::as_fd(&fd))
            .map(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir())
            .unwrap_or(false);
        let rights = if is_dir {
            rights
        } else {
            rights & AccessFs::from_file(abi)
        };
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, rights))
            .map_err(err)?;
    }
    if let (Some(port), true) = (a.plan.proxy_port, used >= 4) {
        // The one TCP destination allowed: the gateway's proxy on the sandbox's loopback.
        ruleset = ruleset
            .add_rule(landlock::NetPort::new(port, AccessNet::ConnectTcp))
            .map_err(err)?;
    }
    let status = ruleset.restrict_self().map_err(err)?;
    // What the kernel really enforced: the rights of `used`, or fewer if it had less.
    let enforced = match status.landlock {
        LandlockStatus::Available { effective_abi, .. } => (effective_abi as u32).min(used),
        _ => 0,
    };
    match (status.ruleset, landlock_policy::requirement(enforced)) {
        (RulesetStatus::NotEnforced, _) => refuse_or_degrade(
            "landlock: the kernel enforced no rule (not available)".into(),
            degraded,
        ),
        (_, Err(why)) => refuse_or_degrade(why.to_string(), degraded),
        // Partially enforced only means that rights of ABIs above `enforced` were dropped;
        // each of those has its substitute (landlock_policy), and the report names them.
        (RulesetStatus::FullyEnforced | RulesetStatus::PartiallyEnforced, Ok(_)) => {
            Ok(Some(enforced))
        }
    }
}
