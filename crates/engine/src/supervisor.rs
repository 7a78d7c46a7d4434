//! The supervisor: the process that starts one sandbox (native tier) and watches it from
//! outside.
//!
//! In order: clone the init into new user, mount, pid, ipc and uts namespaces (ahead of the
//! run when [`prespawn`] was called) and write its id maps at once ([`ToInit::Maps`]); the init
//! then makes its own network namespace and the host part of its root. Plan the root and send
//! the plan ([`ToInit::Go`]); while the init builds the root, create the run's cgroup and hand
//! it over ([`ToInit::Cgroups`]; the init stays outside it, the payload is born in it or joins
//! it, then unshares a cgroup namespace). Serve the egress gateway on the socket the init made
//! inside ([`ToSupervisor::Listener`], allowlist runs only; `supervisor/gateway.rs`); take
//! the /output fd ([`ToSupervisor::Ready`]); then wait on the init's messages, the command's
//! output pipes and the init's pidfd until it ends, while a watchdog thread
//! ([`crate::lifeline::Watchdog`]) kills the init when the deadline passes or the caller's
//! lifeline or lease ends, whatever the loop is blocked on (SIGKILL to the init ends the whole
//! pid namespace, daemons included); read the cgroup's figures; classify the end
//! (`outcome::classify`, shared with the gVisor tier). The init is reaped and the cgroup
//! removed when the [`Outcome`]'s [`Cleanup`] is dropped.
//!
//! Must run in a single-threaded process (the CLI's main thread, or a helper process the
//! server spawns): user namespaces cannot be created from a multi-threaded one. The threads
//! it starts itself (the egress gateway's, the watchdog) start after the init is cloned and
//! are joined before the run returns.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use agentjail_manifest::ValidatedManifest;
use agentjail_manifest::report::{DenialKind, Isolation, RunReport};
use rustix::event::{PollFd, PollFlags, poll};

use crate::cgroup::{Cgroup, Stats};
use crate::inside::{self, Applied, ToInit, ToSupervisor};
use crate::live::LiveDenials;
pub use crate::outcome::{Cleanup, Outcome, RunOptions, STREAM_LIMIT, Sink};
use crate::outcome::{Ended, Ending, Stream, classify, fail, kill_and_reap, with_userns_hint};
use crate::plan::{Plan, RootImage};
use crate::step::{SetupError, Step, StepResult, step};

mod gateway;
mod prespawn;
use gateway::{record_network, start_gateway};
pub use prespawn::{HOST_UID_BASE, Prespawned, discard_prespawned, prespawn};
use prespawn::{prespawn_now, send_or_died, take_prespawned};

/// Most characters of a program name quoted in an error (the rest is cut, ending in `…`).
const PROGRAM_CHARS: usize = 1024;

fn base_report(vm: &ValidatedManifest) -> RunReport {
    let mut r = RunReport::setup_error(vm.manifest.limits, String::new());
    r.error = None;
    r.request_id = vm.manifest.request_id.clone();
    r.manifest_digest = Some(vm.digest.clone());
    r.isolation.kind = "native".into();
    r
}

/// Runs a validated manifest on the host image. Never panics; failures to start are reported
/// as `setup_error` with a one-line reason.
pub fn run(vm: &ValidatedManifest, opts: &RunOptions, image: Option<String>) -> Outcome {
    run_on(vm, opts, image, &RootImage::Host)
}

/// Runs a validated manifest on the given root image (`image` is the digest the report
/// records). The caller has checked a stored image against its record.
pub fn run_on(
    vm: &ValidatedManifest,
    opts: &RunOptions,
    image: Option<String>,
    root: &RootImage,
) -> Outcome {
    if vm.manifest.isolation == agentjail_manifest::Tier::Gvisor {
        return crate::gvisor::run(vm, opts, image, root);
    }
    let mut report = base_report(vm);
    report.image = image;
    crate::timing::init_from_env();
    crate::timing::mark("supervisor: start");
    // The caller's lifeline (and lease): a lease that already ended starts nothing.
    let lifeline = match crate::lifeline::Watch::start(opts.lifeline.as_ref(), opts.lease.as_ref())
    {
        Ok(w) => w,
        Err(e) => return fail(report, e),
    };
    let root_mode = rustix::process::geteuid().is_root();
    let limits = vm.manifest.limits;
    let mut degraded: Vec<String> = Vec::new();

    // Landlock: only its absence leaves a guarantee without a layer (landlock_policy); what an
    // older ABI lacks is covered by the namespaces, and the report says by which.
    if let Err(why) = crate::landlock_policy::requirement(crate::landlock_policy::effective_abi()) {
        degraded.push(why.to_string());
    }
    if !degraded.is_empty() && !opts.allow_degraded {
        return refuse(report, degraded);
    }

    crate::timing::mark("supervisor: plan");
    let mut plan = Plan::for_root(vm, root);
    // As root: a file input the sandbox user cannot read goes in as a read-only copy in memory.
    let copies = if root_mode {
        match crate::copies::unreadable_inputs(vm, &mut plan) {
            Ok(c) => c,
            Err(e) => return fail(report, e),
        }
    } else {
        None
    };
    if let Some(c) = &copies {
        report.inputs_copied = c.mounts.clone();
    }
    // Secrets bound to destinations: read here (the supervisor's own environment and files,
    // never the task's), with the run's CA whose certificate the sandbox trusts.
    let mut intercept = match &vm.manifest.network {
        agentjail_manifest::Network::Allow(p) => match agentjail_egress::Interception::prepare(p) {
            Ok(i) => i,
            Err(e) => return fail(report, format!("egress gateway: {e}")),
        },
        agentjail_manifest::Network::Deny => None,
    };
    if let Some(i) = &intercept {
        plan.add_ca_bundle(root, i.ca_pem());
    }

    let Prespawned {
        pidfd,
        ctl: ctl_s,
        out_r,
        err_r,
        host_uid,
    } = match take_prespawned(root_mode) {
        Some(p) => p,
        None => match prespawn_now(root_mode) {
            Ok(p) => p,
            Err(e) if e.step == Step::CloneNamespaces => {
                return fail(
                    report,
                    format!(
                        "{e}; hint: `agentjail check` tells whether user namespaces are allowed here"
                    ),
                );
            }
            Err(e) => return fail(report, e.to_string()),
        },
    };
    let abort = |report: RunReport, msg: String| {
        kill_and_reap(&pidfd);
        fail(report, msg)
    };

    // A live session's control channel passes through the relay (live_relay.rs), which
    // kills what each cell leaves behind from out here; the command gets the other end.
    let relay = match opts.stdin.as_deref() {
        Some(conn) => match crate::live_relay::start(
            conn,
            &pidfd,
            plan.workspace
                .as_ref()
                .filter(|w| w.collect)
                .map(|w| crate::live_relay::Bounds {
                    max_bytes: w.max_bytes,
                    max_files: w.max_files,
                }),
        ) {
            Ok(r) => Some(r),
            Err(e) => return abort(report, format!("the live session's relay: {e}")),
        },
        None => None,
    };
    if let Err(e) = plan_memfd(&plan).and_then(|memfd| {
        let restore = crate::workspace::restore_memfd(plan.workspace.as_ref(), opts)?;
        let fds = [
            Some(&memfd),
            copies.as_ref().map(|c| &c.fd),
            restore.as_ref(),
            relay.as_ref().map(|r| &r.command_end),
        ];
        send_or_died(
            &ctl_s,
            &ToInit::Go {
                allow_degraded: opts.allow_degraded,
                stdin: relay.is_some(),
            },
            &crate::workspace::present(&fds),
        )
    }) {
        let why = init_failure(&ctl_s, &mut report, e);
        return abort(report, why);
    }
    crate::timing::mark("supervisor: plan sent");

    // While the init builds the root: the cgroups. Only the command's processes join them
    // (the init stays outside), so pids.max is exactly `processes`.
    let cgroup = match Cgroup::create(
        limits.memory_bytes(),
        limits.processes,
        Some(limits.cpu_quota_us(crate::cgroup::CPU_PERIOD_US)),
    ) {
        Ok(cg) if !cg.cpu_limited => {
            degraded.push(format!(
                "cpu: no cpu controller for the run's cgroup ({}); limits.cpus ({}) is not applied, CPU time is bounded only by the wall-clock limit",
                cg.version.name(),
                limits.cpus
            ));
            if !opts.allow_degraded {
                kill_and_reap(&pidfd);
                drop(cg);
                return refuse(report, degraded);
            }
            Some(cg)
        }
        Ok(cg) => Some(cg),
        Err(reason) => {
            degraded.push(format!(
                "{reason}; memory and process limits fall back to rlimits (RLIMIT_AS, RLIMIT_NPROC), and limits.cpus is not applied"
            ));
            if !opts.allow_degraded {
                kill_and_reap(&pidfd);
                return refuse(report, degraded);
            }
            None
        }
    };
    if let Err(e) = hand_over_cgroups(cgroup.as_ref(), &ctl_s) {
        let why = init_failure(&ctl_s, &mut report, e);
        return abort(report, why);
    }
    crate::timing::mark("supervisor: cgroups handed over");
    report.isolation = Isolation {
        kind: "native".into(),
        user_ns: true,
        pid_ns: true,
        net_ns: true,
        mount_ns: true,
        ipc_ns: true,
        uts_ns: true,
        cgroup_ns: true,
        cgroup: cgroup.as_ref().map(|c| c.version.name().to_string()),
        host_uid: Some(host_uid),
        degraded,
        ..Isolation::default()
    };

    let start = Instant::now();
    let deadline = start + Duration::from_secs(limits.seconds);

    let mut out = Stream::new(Some(out_r), opts.stdout);
    let mut err = Stream::new(Some(err_r), opts.stderr);
    let (on_started, on_work) = match relay {
        Some(r) => (Some(r.payload), Some(r.work)),
        None => (None, None),
    };
    let mut st = State {
        on_started,
        on_work,
        ..State::default()
    };
    let mut gateway: Option<agentjail_egress::GatewayHandle> = None;
    let mut ctl_open = true;
    let mut timed_out = false;
    let mut init_done = false;
    // The deadline, the lifeline and the lease are kept by a thread of their own, so that a
    // relay write blocked on a paused reader cannot keep the payload alive past any of them.
    let watchdog = match pidfd.try_clone().and_then(|kill_fd| {
        crate::lifeline::Watchdog::start(lifeline, deadline, move || {
            let _ = rustix::process::pidfd_send_signal(&kill_fd, rustix::process::Signal::KILL);
        })
    }) {
        Ok(w) => w,
        Err(e) => {
            kill_and_reap(&pidfd);
            return fail(report, format!("starting the run's watchdog: {e}"));
        }
    };
    while !init_done {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let fired = watchdog.fired();
        match &fired {
            Some(crate::lifeline::Fired::Deadline) => timed_out = true,
            // The caller is gone, or its lease ended: nothing may outlive either (the init's
            // pid namespace died with it).
            Some(crate::lifeline::Fired::Caller(why)) => {
                st.setup_failed.get_or_insert(why.clone());
            }
            None => {}
        }
        let mut fds: Vec<PollFd<'_>> = vec![PollFd::new(&pidfd, PollFlags::IN)];
        let ctl_ix = if ctl_open {
            fds.push(PollFd::new(&ctl_s, PollFlags::IN));
            Some(fds.len() - 1)
        } else {
            None
        };
        let out_ix = out.fd.as_ref().map(|f| {
            fds.push(PollFd::new(f, PollFlags::IN));
            fds.len() - 1
        });
        let err_ix = err.fd.as_ref().map(|f| {
            fds.push(PollFd::new(f, PollFlags::IN));
            fds.len() - 1
        });
        // Until the watchdog fired, wake at the deadline (and shortly after, until it has).
        let wake = remaining.max(Duration::from_millis(10));
        let timeout = if fired.is_some() {
            None
        } else {
            Some(rustix::time::Timespec {
                tv_sec: wake.as_secs() as i64,
                tv_nsec: wake.subsec_nanos() as i64,
            })
        };
        if poll(&mut fds, timeout.as_ref()).is_err() {
            continue;
        }
        let ready = |ix: Option<usize>| ix.map(|i| !fds[i].revents().is_empty()).unwrap_or(false);
        let (init_ready, ctl_ready, out_ready, err_ready) = (
            !fds[0].revents().is_empty(),
            ready(ctl_ix),
            ready(out_ix),
            ready(err_ix),
        );
        drop(fds);
        if ctl_ready {
            ctl_open = st.take(&ctl_s, &mut report, opts.live_denials.as_deref());
        }
        if let Some(fd) = st.listener.take() {
            match start_gateway(vm, opts, fd, intercept.take()) {
                Ok(h) => gateway = Some(h),
                Err(e) => {
                    st.setup_failed.get_or_insert(e.to_string());
                    let _ =
                        rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
                }
            }
        }
        if out_ready {
            out.pump();
        }
        if err_ready {
            err.pump();
        }
        // The init reports only after it killed and reaped every other process of the
        // sandbox; its own exit (namespace teardown) need not delay the report.
        if init_ready || (st.exit.is_some() && !timed_out) {
            init_done = true;
        }
    }
    crate::timing::mark("supervisor: init done");
    let wall = start.elapsed();
    // What the watchdog did at the very end still counts: a kill for the caller always (the
    // sandbox was ended by us), the deadline unless the command had exited by itself.
    match watchdog.fired() {
        Some(crate::lifeline::Fired::Deadline) if st.exit.is_none() => timed_out = true,
        Some(crate::lifeline::Fired::Caller(why)) => {
            st.setup_failed.get_or_insert(why);
        }
        _ => {}
    }
    drop(watchdog);
    // Every process but the init is gone now: drain what is left.
    while ctl_open && has_data(ctl_s.as_fd()) {
        ctl_open = st.take(&ctl_s, &mut report, opts.live_denials.as_deref());
    }
    while out.pump() {}
    while err.pump() {}

    crate::timing::mark("supervisor: streams drained");
    if let Some(g) = gateway {
        record_network(&mut report, g.stop());
    }
    let stats = cgroup.as_ref().map(Cgroup::stats).unwrap_or_default();
    finish(
        &mut report,
        &st,
        &stats,
        timed_out,
        wall,
        &vm.manifest.limits,
    );
    report.stdout = out.report();
    report.stderr = err.report();
    let output_full = st
        .output
        .as_ref()
        .and_then(|fd| rustix::fs::fstatfs(fd).ok())
        .map(|s| s.f_bavail == 0 || s.f_ffree == 0)
        .unwrap_or(false);
    Outcome {
        report,
        output_dir: st.output.take(),
        work_dir: st.work.take(),
        output_full,
        stdout: out.captured,
        stderr: err.captured,
        cleanup: Cleanup {
            init: Some(pidfd),
            init_finished: st.exit.is_some() && !timed_out,
            cgroup,
        },
    }
}

fn has_data(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
        && fds[0].revents().contains(PollFlags::IN)
}

/// The plan as JSON in a memfd (any size; a socket message is bounded).
fn plan_memfd(plan: &Plan) -> StepResult<OwnedFd> {
    let json = step(Step::EncodePlan, serde_json::to_vec(plan))?;
    let fd = step(
        Step::CreatePlanMemfd,
        rustix::fs::memfd_create(c"agentjail-plan", rustix::fs::MemfdFlags::CLOEXEC),
    )?;
    let mut f = std::fs::File::from(fd);
    step(Step::WritePlan, std::io::Write::write_all(&mut f, &json))?;
    Ok(f.into())
}

/// How the reason of a run refused before it started begins (see [`refuse`]).
pub(crate) const REFUSAL_PREFIX: &str = "refusing to run without: ";

/// The outcome of a run refused before it started, for want of the protections named.
fn refuse(mut report: RunReport, degraded: Vec<String>) -> Outcome {
    let msg = format!(
        "{REFUSAL_PREFIX}{}; hint: `agentjail check` explains, --allow-degraded runs anyway",
        degraded.join("; ")
    );
    report.isolation.degraded = degraded;
    fail(report, msg)
}

/// Tells the init the run's cgroups, with the files (opened here, where they are visible, with
/// our credentials) through which the payload moves itself in: see `Cgroup::self_join_files`
/// and `inside::join_cgroups`, which checks the result before the command exists.
fn hand_over_cgroups(cg: Option<&Cgroup>, ctl: &OwnedFd) -> StepResult<()> {
    let Some(cg) = cg else {
        return send_or_died(
            ctl,
            &ToInit::Cgroups {
                applied: false,
                name: None,
                into_dir: false,
            },
            &[],
        );
    };
    let mut files = cg
        .self_join_files()
        .iter()
        .map(|p| {
            step(
                Step::OpenCgroupFile(p.clone()),
                rustix::fs::open(
                    p,
                    rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                ),
            )
        })
        .collect::<StepResult<Vec<OwnedFd>>>()?;
    // v2: the directory too, for the init to clone the payload into (CLONE_INTO_CGROUP).
    let dir = cg.clone_into_dir();
    let into_dir = match dir {
        Some(p) => {
            let fd = step(
                Step::OpenCgroupFile(p.to_path_buf()),
                rustix::fs::open(
                    p,
                    rustix::fs::OFlags::RDONLY
                        | rustix::fs::OFlags::DIRECTORY
                        | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                ),
            )?;
            files.push(fd);
            true
        }
        None => false,
    };
    let fds: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
    send_or_died(
        ctl,
        &ToInit::Cgroups {
            applied: true,
            name: Some(cg.name().to_string()),
            into_dir,
        },
        &fds,
    )
}

#[derive(Default)]
struct State {
    listener: Option<OwnedFd>,
    output: Option<OwnedFd>,
    work: Option<OwnedFd>,
    applied: Option<Applied>,
    started: bool,
    /// Where the payload's pid goes when it started (a live session's relay).
    on_started: Option<std::sync::mpsc::Sender<i32>>,
    /// Where a copy of `/work`'s descriptor goes (a live session's relay: checkpoints on
    /// request).
    on_work: Option<std::sync::mpsc::Sender<OwnedFd>>,
    exec_failed: Option<String>,
    setup_failed: Option<String>,
    exit: Option<(i32, u64, u64)>,
}

impl State {
    /// Handles one control message (a refused syscall goes to `live` too); false once closed.
    fn take(&mut self, ctl: &OwnedFd, report: &mut RunReport, live: Option<&LiveDenials>) -> bool {
        match inside::recv::<ToSupervisor>(ctl.as_fd()) {
            Ok(Some((msg, fd))) => {
                match msg {
                    ToSupervisor::Ready => self.output = fd,
                    ToSupervisor::Work => {
                        if let (Some(tx), Some(f)) = (self.on_work.take(), fd.as_ref())
                            && let Ok(copy) = f.try_clone()
                        {
                            let _ = tx.send(copy);
                        }
                        self.work = fd;
                    }
                    ToSupervisor::Listener => self.listener = fd,
                    ToSupervisor::Applied(a) => self.applied = Some(a),
                    ToSupervisor::Started { payload } => {
                        self.started = true;
                        if let Some(tx) = self.on_started.take() {
                            let _ = tx.send(payload);
                        }
                    }
                    ToSupervisor::ExecFailed { program, error } => {
                        self.exec_failed = Some(format!(
                            "cannot execute `{}`: {error}",
                            agentjail_manifest::text::printable(&program, PROGRAM_CHARS)
                        ))
                    }
                    ToSupervisor::SetupFailed { step, error } => {
                        self.setup_failed
                            .get_or_insert(format!("sandbox setup failed at `{step}`: {error}"));
                    }
                    ToSupervisor::Denial { syscall } => {
                        if let Some(l) = live {
                            l.offer(DenialKind::Syscall, &syscall);
                        }
                        report.deny(DenialKind::Syscall, syscall)
                    }
                    ToSupervisor::Exit {
                        status,
                        cpu_us,
                        maxrss_kb,
                    } => {
                        crate::timing::mark("supervisor: exit message");
                        self.exit = Some((status, cpu_us, maxrss_kb))
                    }
                }
                true
            }
            Ok(None) => false,
            // The init exited with a message of ours unread: the kernel then reports
            // ECONNRESET once, before the messages the init queued (its `SetupFailed` among
            // them), which the next read returns.
            Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => true,
            Err(_) => false,
        }
    }
}

/// A message to the init could not be sent (`failed`): the init has most likely exited after
/// queuing why (`SetupFailed`, naming its step). That reason wins over the send error.
fn init_failure(ctl: &OwnedFd, report: &mut RunReport, failed: SetupError) -> String {
    let mut st = State::default();
    // Bounded: the init sends a handful of messages before it can fail.
    for _ in 0..16 {
        let mut fds = [PollFd::new(ctl, PollFlags::IN)];
        let wait = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 500_000_000,
        };
        if !matches!(poll(&mut fds, Some(&wait)), Ok(n) if n > 0) || !st.take(ctl, report, None) {
            break;
        }
        if let Some(why) = st.setup_failed.take() {
            return why;
        }
    }
    failed.to_string()
}

fn finish(
    r: &mut RunReport,
    st: &State,
    stats: &Stats,
    timed_out: bool,
    wall: Duration,
    limits: &agentjail_manifest::Limits,
) {
    r.wall_ms = wall.as_millis() as u64;
    if let Some(a) = &st.applied {
        r.isolation.landlock_abi = a.landlock_abi;
        if let Some(Ok(c)) = a.landlock_abi.map(crate::landlock_policy::requirement) {
            r.isolation.landlock_rights = c.rights;
            r.isolation.landlock_substitutes = c.substitutes;
        }
        r.isolation.seccomp = true;
        r.isolation.seccomp_notify = a.seccomp_notify;
        r.isolation.no_new_privs = true;
        r.isolation.capabilities_dropped = true;
        r.isolation.rlimits = a.rlimits.clone();
        for d in &a.degraded {
            // The supervisor may have named the same missing layer before the start.
            if !r.isolation.degraded.contains(d) {
                r.isolation.degraded.push(d.clone());
            }
        }
    }
    let (cpu_us, maxrss_kb) = st.exit.map(|(_, c, m)| (c, m)).unwrap_or((0, 0));
    if r.isolation.cgroup.is_some() {
        r.accounting = "cgroup".into();
        r.peak_memory_bytes = stats.peak_memory_bytes;
        r.cpu_ms = stats.cpu_ns.map(|n| n / 1_000_000).unwrap_or(cpu_us / 1000);
    } else {
        r.accounting = "rusage".into();
        r.peak_memory_bytes = maxrss_kb * 1024;
        r.cpu_ms = cpu_us / 1000;
    }
    if stats.pids_refused > 0 {
        r.deny(
            DenialKind::Limit,
            format!(
                "pids: fork refused {} time(s) at the limit of {} processes",
                stats.pids_refused, limits.processes
            ),
        );
    }
    if stats.oom_kills > 0 {
        r.deny(
            DenialKind::Limit,
            format!(
                "memory: limit of {} MiB reached, process killed",
                limits.memory_mb
            ),
        );
    }
    let ended = st.exit.and_then(|(status, _, _)| {
        if libc::WIFEXITED(status) {
            Some(Ended::Exited(libc::WEXITSTATUS(status)))
        } else if libc::WIFSIGNALED(status) {
            Some(Ended::Signaled(libc::WTERMSIG(status)))
        } else {
            None
        }
    });
    let failure = st
        .setup_failed
        .clone()
        .map(with_userns_hint)
        .or_else(|| st.exec_failed.clone());
    classify(
        r,
        limits,
        Ending {
            timed_out,
            failure,
            ended,
            oom_killed: stats.oom_kills > 0,
            unknown_end: "the sandbox ended before the command did (init died)",
        },
    );
}
