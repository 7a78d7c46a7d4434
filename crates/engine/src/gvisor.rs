//! The gVisor tier: the same manifest, run on gVisor's user-space kernel (`runsc`) instead of
//! directly on the host kernel.
//!
//! From the same [`Plan`] as the native tier, this module writes an OCI runtime bundle
//! (`gvisor/bundle.rs`): a read-only root directory holding the plan's symlinks and curated `/etc`
//! files, read-only bind mounts for the system directories and inputs, tmpfs for `/tmp` and
//! `/work`, and `/output` as a bind of a host directory that is itself a size-bounded tmpfs in a
//! mount namespace private to this supervisor (so the sandbox cannot fill the host's disk, and the
//! tmpfs disappears with the supervisor). uid/gid 65534, no capabilities, no_new_privs, rlimits
//! (gVisor enforces RLIMIT_NPROC itself), `--network=none`, and the OCI memory and pids limits,
//! which runsc puts on the cgroup of its sandbox (the pids limit there also counts gVisor's own
//! threads, so it is set above the manifest's; the manifest's process limit is enforced by
//! RLIMIT_NPROC inside).
//!
//! runsc runs in a network namespace and a mount namespace private to this supervisor, with its
//! state root in a 0700 folder on a tmpfs only that mount namespace sees, so that its control
//! socket (an abstract unix socket, which has no permission check, or in newer runsc a socket
//! file in the state root) is unreachable from the host's namespaces and by other uids.
//!
//! The supervisor keeps the deadline (`runsc kill` then `delete --force`), passes stdout and
//! stderr through with the same bounds, and hands `/output` to the same untrusting collector.
//!
//! What does not carry over, and is said in the report's `isolation.degraded`: syscalls are
//! implemented by gVisor, so there is no seccomp listener to name refused ones; Landlock is
//! not used (the gofer mediates file access); network allowlists are refused on this tier;
//! OOM kills are seen only as a SIGKILL, without the cgroup's OOM counter.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentjail_manifest::ValidatedManifest;
use agentjail_manifest::report::{DenialKind, RunReport, Status};
use rustix::event::{PollFd, PollFlags, poll};

use crate::outcome::{Ended, Ending, Outcome, RunOptions, Stream, classify, fail};
use crate::plan::{Plan, RootImage};

mod bundle;
use bundle::{inline_dir, write_bundle};

/// Finds `runsc`: `$AGENTJAIL_RUNSC`, else on PATH.
pub fn runsc_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("AGENTJAIL_RUNSC") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("runsc"))
            .find(|p| p.is_file())
    })
}

/// The gVisor platform a run uses, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// `kvm`, `systrap` or `ptrace`: passed to runsc as `--platform`.
    pub name: &'static str,
    /// Why this one, e.g. `kvm not used: /dev/kvm is kvm_pvm, no VMX/SVM`.
    pub why: String,
}

impl Platform {
    /// `name (why)`, as the report and `agentjail check` show it.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.name, self.why)
    }
}

/// Why the gVisor tier cannot run, or a step of its set-up failed: the words the report,
/// `agentjail check` and the self-test show.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GvisorError {
    #[error("AGENTJAIL_GVISOR_PLATFORM={0}: expected kvm, systrap or ptrace")]
    BadPlatformVar(String),
    #[error("runsc not found (Debian: apt-get install runsc)")]
    NoRunsc,
    #[error("the gvisor tier needs root here (runsc manages its sandbox's cgroups and mounts)")]
    NeedsRoot,
    /// `runsc --version` could not be run.
    #[error("{}: {source}", .runsc.display())]
    RunscVersion {
        runsc: PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The supervisor's private mount and network namespaces (see [`private_namespaces`]).
    #[error("unshare(CLONE_NEWNS | CLONE_NEWNET): {0}")]
    Unshare(#[source] Arc<std::io::Error>),
    #[error("make / private: {0}")]
    MakeRootPrivate(#[source] rustix::io::Errno),
    #[error("chmod 0700 {}: {source}", .dir.display())]
    Chmod {
        dir: PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },
    #[error("write {}: {source}", .path.display())]
    WriteInline {
        path: PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },
    #[error("mount tmpfs on {}: {source}", .dir.display())]
    MountTmpfs {
        dir: PathBuf,
        #[source]
        source: rustix::io::Errno,
    },
    /// A tmpfs option string with a NUL byte.
    #[error("{0}")]
    TmpfsOptions(#[source] std::ffi::NulError),
}

/// Why gVisor's KVM platform is not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum NoKvm {
    #[error("no /dev/kvm")]
    NoDevice,
    #[error("/dev/kvm cannot be opened: {0}")]
    CannotOpen(rustix::io::Errno),
    #[error("/dev/kvm is kvm_pvm (paravirtual KVM), no VMX/SVM")]
    Paravirtual,
    #[error("the CPU advertises no VMX/SVM")]
    NoVmxSvm,
}

/// Chooses the platform: `$AGENTJAIL_GVISOR_PLATFORM` (`kvm`, `systrap`, `ptrace`) if set;
/// otherwise KVM where it really works — /dev/kvm opens read-write, is the hardware KVM
/// module (not `kvm_pvm`, the paravirtual one that cannot run gVisor's guest: its KVM platform
/// spins at start-up there, measured in docs/performance.md) and the CPU advertises VMX or SVM
/// — else the fastest of runsc's own platforms that this runsc has (systrap from runsc 2023-06
/// on, ptrace before). `runsc_version` is `runsc --version`'s first line.
pub fn platform(runsc_version: &str) -> Result<Platform, GvisorError> {
    if let Some(v) = std::env::var_os("AGENTJAIL_GVISOR_PLATFORM") {
        let name = match v.to_str() {
            Some("kvm") => "kvm",
            Some("systrap") => "systrap",
            Some("ptrace") => "ptrace",
            _ => {
                return Err(GvisorError::BadPlatformVar(
                    v.to_string_lossy().into_owned(),
                ));
            }
        };
        return Ok(Platform {
            name,
            why: "chosen by AGENTJAIL_GVISOR_PLATFORM".into(),
        });
    }
    match kvm_usable() {
        Ok(()) => Ok(Platform {
            name: "kvm",
            why: "/dev/kvm works: hardware KVM with VMX/SVM".into(),
        }),
        Err(no_kvm) => {
            let name = if runsc_has_systrap(runsc_version) {
                "systrap"
            } else {
                "ptrace"
            };
            Ok(Platform {
                name,
                why: format!("kvm not used: {no_kvm}"),
            })
        }
    }
}

/// Whether gVisor's KVM platform can work here, or why not.
fn kvm_usable() -> Result<(), NoKvm> {
    let kvm = Path::new("/dev/kvm");
    if !kvm.exists() {
        return Err(NoKvm::NoDevice);
    }
    rustix::fs::open(
        kvm,
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(NoKvm::CannotOpen)?;
    if Path::new("/sys/module/kvm_pvm").exists()
        && !Path::new("/sys/module/kvm_intel").exists()
        && !Path::new("/sys/module/kvm_amd").exists()
    {
        return Err(NoKvm::Paravirtual);
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hw = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    if !hw {
        return Err(NoKvm::NoVmxSvm);
    }
    Ok(())
}

/// runsc gained the systrap platform (and made it its default) in mid-2023; Debian 12's
/// 20221219 does not have it. Version lines look like `runsc version release-20240729.0` or
/// `runsc version 0.0~20221219.0`.
fn runsc_has_systrap(version: &str) -> bool {
    version
        .split(|c: char| !c.is_ascii_digit())
        .filter(|d| d.len() == 8 && d.starts_with("20"))
        .filter_map(|d| d.parse::<u32>().ok())
        .any(|date| date >= 20_230_601)
}

/// Whether the tier can run here, with the reason when not.
pub fn available() -> Result<String, GvisorError> {
    let runsc = runsc_path().ok_or(GvisorError::NoRunsc)?;
    if !rustix::process::geteuid().is_root() {
        return Err(GvisorError::NeedsRoot);
    }
    let out = Command::new(&runsc)
        .arg("--version")
        .output()
        .map_err(|e| GvisorError::RunscVersion {
            runsc: runsc.clone(),
            source: Arc::new(e),
        })?;
    let v = String::from_utf8_lossy(&out.stdout);
    Ok(v.lines().next().unwrap_or("runsc").trim().to_string())
}

/// Runs a validated manifest under runsc.
pub fn run(
    vm: &ValidatedManifest,
    opts: &RunOptions,
    image: Option<String>,
    root: &RootImage,
) -> Outcome {
    let mut report = RunReport::setup_error(vm.manifest.limits, String::new());
    report.error = None;
    report.request_id = vm.manifest.request_id.clone();
    report.manifest_digest = Some(vm.digest.clone());
    report.image = image;
    report.isolation.kind = "gvisor".into();
    // The caller's lifeline (and lease): a lease that already ended starts nothing.
    let lifeline = match crate::lifeline::Watch::start(opts.lifeline.as_ref(), opts.lease.as_ref())
    {
        Ok(w) => w,
        Err(e) => return fail(report, e),
    };
    if !matches!(vm.manifest.network, agentjail_manifest::Network::Deny) {
        return fail(report, "manifest field `network`: allowlists are not available on the gvisor tier yet; use the native tier or `network: deny`".into());
    }
    let (runsc, platform) = match available().and_then(|v| platform(&v)) {
        Ok(p) => (runsc_path().unwrap_or_default(), p),
        Err(e) => return fail(report, format!("gvisor tier unavailable: {e}")),
    };
    report.isolation.platform = Some(platform.describe());
    sweep_stale_folders(&std::env::temp_dir());
    let work = match tempfile::Builder::new()
        .prefix(&format!("{BUNDLE_PREFIX}{}-", std::process::id()))
        .tempdir()
    {
        Ok(d) => d,
        Err(e) => return fail(report, format!("cannot create the bundle folder: {e}")),
    };
    let plan = Plan::for_root(vm, root);
    let id = format!(
        "agentjail-{}",
        work.path()
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("x")
            .trim_start_matches(BUNDLE_PREFIX)
    );
    let out_dir = work.path().join("output");
    let inline = match write_bundle(work.path(), &plan, &out_dir) {
        Ok(i) => i,
        Err(e) => return fail(report, format!("gvisor bundle: {e}")),
    };
    if let Err(e) = private_namespaces() {
        return fail(report, format!("gvisor control plane: {e}"));
    }
    if let Err(e) = private_inline_files(&inline_dir(work.path()), &inline) {
        return fail(report, format!("gvisor inline inputs: {e}"));
    }
    if let Err(e) = private_output_tmpfs(
        &out_dir,
        crate::plan::output_tmpfs_bytes(&vm.manifest.limits),
    ) {
        return fail(report, format!("gvisor /output: {e}"));
    }
    // runsc's state root (the container's state file, its locks and, with newer runsc, the
    // control socket as a file): inside a folder of its own, 0700, not inside the
    // world-readable bundle folder, and on a tmpfs mounted in the private mount namespace, so
    // that from the host's mount namespace the folder is empty (not even root there finds the
    // socket file by the path the state file names). runsc makes its root itself 0755, hence
    // the folder around it.
    let state_dir = match tempfile::Builder::new()
        .prefix(&format!("{STATE_PREFIX}{}-", std::process::id()))
        .tempdir()
    {
        Ok(d) => d,
        Err(e) => return fail(report, format!("cannot create runsc's state folder: {e}")),
    };
    if let Err(e) = private_state_tmpfs(state_dir.path()) {
        return fail(report, format!("runsc's state folder: {e}"));
    }
    let state = state_dir.path().join("runsc");

    let mut cmd = Command::new(&runsc);
    cmd.arg("--root")
        .arg(&state)
        .arg(format!("--platform={}", platform.name))
        .args(["--network=none", "--oci-seccomp", "run", "--bundle"])
        .arg(work.path().join("bundle"))
        .arg(&id)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    // If this runner is killed (SIGKILL: no chance to run `runsc kill`), `runsc run` dies
    // with it, and its sandbox and gofer with `runsc run` (attached mode).
    crate::sys::die_with_parent(&mut cmd);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return fail(report, format!("cannot start runsc: {e}")),
    };
    let start = Instant::now();
    let deadline = start + Duration::from_secs(vm.manifest.limits.seconds);
    let pidfd = rustix::process::Pid::from_raw(child.id() as i32)
        .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok());
    let mut out = Stream::new(child.stdout.take().map(OwnedFd::from), opts.stdout);
    let mut err = Stream::new(child.stderr.take().map(OwnedFd::from), opts.stderr);
    let mut timed_out = false;
    let mut orphaned: Option<String> = None;
    // The deadline, the lifeline and the lease are kept by a thread of their own (as on the
    // native tier), so that a relay write blocked on a paused reader cannot keep the sandbox
    // alive past any of them: `runsc kill`, then SIGKILL to runsc through its pidfd.
    let kill_pidfd = pidfd.as_ref().and_then(|p| p.try_clone().ok());
    let (runsc_k, state_k, id_k) = (runsc.clone(), state.clone(), id.clone());
    let watchdog = match crate::lifeline::Watchdog::start(lifeline, deadline, move || {
        let _ = Command::new(&runsc_k)
            .arg("--root")
            .arg(&state_k)
            .args(["kill", &id_k, "KILL"])
            .output();
        if let Some(p) = &kill_pidfd {
            let _ = rustix::process::pidfd_send_signal(p, rustix::process::Signal::KILL);
        }
    }) {
        Ok(w) => w,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return fail(report, format!("starting the run's watchdog: {e}"));
        }
    };
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if !timed_out && let Some(fired) = watchdog.fired() {
            // The caller is gone or its lease ended (its reason), or the deadline passed.
            timed_out = true;
            if let crate::lifeline::Fired::Caller(why) = fired {
                orphaned = Some(why);
            }
            let _ = child.kill();
        }
        let mut fds: Vec<PollFd<'_>> = Vec::new();
        if let Some(p) = &pidfd {
            fds.push(PollFd::new(p, PollFlags::IN));
        }
        for f in [&out.fd, &err.fd].into_iter().flatten() {
            fds.push(PollFd::new(f, PollFlags::IN));
        }
        let step = remaining
            .max(Duration::from_millis(10))
            .min(Duration::from_millis(if pidfd.is_some() {
                60_000
            } else {
                20
            }));
        let ts = rustix::time::Timespec {
            tv_sec: step.as_secs() as i64,
            tv_nsec: step.subsec_nanos() as i64,
        };
        let _ = poll(
            &mut fds,
            if timed_out {
                Some(&rustix::time::Timespec {
                    tv_sec: 0,
                    tv_nsec: 20_000_000,
                })
            } else {
                Some(&ts)
            },
        );
        drop(fds);
        out.pump();
        err.pump();
    }
    // Killed by the watchdog while the loop was past its check: the runsc process may have
    // exited before the loop saw why.
    if !timed_out && let Some(fired) = watchdog.fired() {
        timed_out = true;
        if let crate::lifeline::Fired::Caller(why) = fired {
            orphaned = Some(why);
        }
    }
    drop(watchdog);
    let status = child.wait().ok();
    let wall = start.elapsed();
    while out.pump() {}
    while err.pump() {}
    let _ = Command::new(&runsc)
        .arg("--root")
        .arg(&state)
        .args(["delete", "--force", &id])
        .output();
    // The tmpfs goes with this mount namespace; detached now so that the folder under it can
    // be removed.
    let _ = rustix::mount::unmount(state_dir.path(), rustix::mount::UnmountFlags::DETACH);

    report.wall_ms = wall.as_millis() as u64;
    report.stdout = out.report();
    report.stderr = err.report();
    report.accounting = "none".into();
    let iso = &mut report.isolation;
    iso.user_ns = false;
    iso.pid_ns = true;
    iso.net_ns = true;
    iso.mount_ns = true;
    iso.ipc_ns = true;
    iso.uts_ns = true;
    iso.no_new_privs = true;
    iso.capabilities_dropped = true;
    iso.seccomp = true;
    iso.cgroup = Some("runsc".into());
    iso.rlimits = vec![
        "nproc".into(),
        "nofile".into(),
        "core".into(),
        "cpu".into(),
        "fsize".into(),
    ];
    iso.degraded = vec![
        "gvisor: syscalls are implemented by gVisor's Sentry, which runs under its own seccomp filter; refused syscalls (including socket families outside AF_UNIX/AF_INET/AF_INET6, refused by the bundle's seccomp filter) are not reported by name".into(),
        "gvisor: Landlock is not used; file access is mediated by gVisor's gofer over the same read-only binds".into(),
        "gvisor: CPU time and peak memory are not reported; a memory-limit kill shows as SIGKILL".into(),
    ];
    let limits = vm.manifest.limits;
    if let Some(why) = orphaned {
        report.status = Status::SetupError;
        report.error = Some(why);
    } else {
        let ended = status.and_then(|s| s.code()).map(|c| match c {
            // runsc reports a container killed by signal N as 128+N.
            c if c > 128 && c < 128 + 65 => Ended::Signaled(c - 128),
            c => Ended::Exited(c),
        });
        classify(
            &mut report,
            &limits,
            Ending {
                timed_out,
                failure: None,
                ended,
                oom_killed: false,
                unknown_end: "runsc ended without an exit status",
            },
        );
        if !timed_out && report.signal == Some(libc::SIGKILL) {
            report.deny(
                DenialKind::Limit,
                format!("memory: the sandbox was killed (SIGKILL); with gVisor this is most likely the memory limit of {} MiB", limits.memory_mb),
            );
        }
    }
    let output_dir = rustix::fs::open(
        &out_dir,
        rustix::fs::OFlags::DIRECTORY
            | rustix::fs::OFlags::RDONLY
            | rustix::fs::OFlags::CLOEXEC
            | rustix::fs::OFlags::NOFOLLOW,
        rustix::fs::Mode::empty(),
    )
    .ok();
    let output_full = output_dir
        .as_ref()
        .and_then(|fd| rustix::fs::fstatfs(fd.as_fd()).ok())
        .map(|s| s.f_bavail == 0 || s.f_ffree == 0)
        .unwrap_or(false);
    // The bundle folder goes with `work`; the output tmpfs stays reachable through the fd.
    let _ = rustix::mount::unmount(&out_dir, rustix::mount::UnmountFlags::DETACH);
    Outcome {
        report,
        output_dir,
        work_dir: None,
        output_full,
        stdout: out.captured,
        stderr: err.captured,
        cleanup: Default::default(),
    }
}

/// Moves this supervisor (once per process) into a mount namespace and a network namespace of
/// its own, before runsc starts; every runsc process (`run`, the gofer, the sandbox, and the
/// supervisor's later `kill` and `delete`) inherits both.
///
/// The network namespace is what keeps runsc's control plane private: the sandbox's control
/// server listens on an *abstract* unix socket (`@runsc-sandbox.<id>`), which has no file
/// permissions and is reachable by every process in the same network namespace. In a network
/// namespace owned by this supervisor (created by root, so joining it needs CAP_SYS_ADMIN in the
/// host's user namespace), no other uid and no process of the host's network namespace can see
/// or connect to it: `runsc exec`, `pause`, `kill` from outside find nothing to talk to. The
/// supervisor itself needs no network on this tier (allowlists are refused above), and the
/// namespace holds only a loopback that stays down (`--network=none`).
///
/// The mount namespace (made private, recursively) holds /output's size-bounded tmpfs, so that
/// what the sandbox writes there is bounded and invisible outside.
fn private_namespaces() -> Result<(), GvisorError> {
    use rustix::mount::*;
    // Once per process; a failure is remembered, so a later run in the same process fails too.
    static DONE: std::sync::OnceLock<Result<(), GvisorError>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        crate::sys::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWNET)
            .map_err(|e| GvisorError::Unshare(Arc::new(e)))?;
        mount_change(
            "/",
            MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
        )
        .map_err(GvisorError::MakeRootPrivate)
    })
    .clone()
}

/// Mounts a small tmpfs, mode 0700, on `dir` in the private mount namespace of
/// [`private_namespaces`] (the folder itself is made 0700 too).
fn private_state_tmpfs(dir: &Path) -> Result<(), GvisorError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| {
        GvisorError::Chmod {
            dir: dir.to_path_buf(),
            source: Arc::new(e),
        }
    })?;
    private_tmpfs(dir, "size=4m,nr_inodes=1024,mode=0700".into())
}

/// Mounts a tmpfs (nosuid, nodev, noexec) with `options` on `dir`, in the private mount
/// namespace of [`private_namespaces`].
fn private_tmpfs(dir: &Path, options: String) -> Result<(), GvisorError> {
    use rustix::mount::*;
    let data = std::ffi::CString::new(options).map_err(GvisorError::TmpfsOptions)?;
    mount(
        "tmpfs",
        dir,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        Some(data.as_c_str()),
    )
    .map_err(|source| GvisorError::MountTmpfs {
        dir: dir.to_path_buf(),
        source,
    })
}

/// The names of a run's bundle folder and runsc state folder in the temporary folder, each
/// followed by the runner's pid and `-`.
const BUNDLE_PREFIX: &str = "agentjail-gvisor-";
const STATE_PREFIX: &str = "agentjail-runsc-state-";

/// Removes the bundle and state folders of runners that are gone: a runner killed with
/// SIGKILL (the service's cancel, its guard time, a lost lease) runs no destructor, and its
/// bundle (the rootfs skeleton, `config.json` with the task's env, 0600) would stay. A folder
/// is removed only if it is a real folder of this user's whose name carries a pid that no
/// process has (`kill(pid, 0)` answers ESRCH); a live pid, even a reused one, keeps it.
fn sweep_stale_folders(tmp: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    let me = rustix::process::geteuid().as_raw();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| {
            n.strip_prefix(BUNDLE_PREFIX)
                .or_else(|| n.strip_prefix(STATE_PREFIX))
        }) else {
            continue;
        };
        let Some(pid) = rest
            .split_once('-')
            .and_then(|(p, _)| p.parse::<i32>().ok())
            .and_then(rustix::process::Pid::from_raw)
        else {
            continue;
        };
        let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if !meta.is_dir() || meta.uid() != me {
            continue;
        }
        if rustix::process::test_kill_process(pid) == Err(rustix::io::Errno::SRCH) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Writes the inline inputs into a tmpfs on `dir` (the bundle's `inline` folder, 0700) in the
/// private mount namespace of [`private_namespaces`], which runsc inherits: from the host's
/// mount namespace the folder is empty, nothing of the content reaches a disk, and the tmpfs
/// goes when the runner and runsc are gone, however they end (a killed runner leaves no
/// file behind). The files are 0644, so that the sandbox user reads them through the gofer.
fn private_inline_files(dir: &Path, files: &[(PathBuf, &str)]) -> Result<(), GvisorError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if files.is_empty() {
        return Ok(());
    }
    let page = rustix::param::page_size();
    let bytes: usize = files
        .iter()
        .map(|(_, c)| c.len().div_ceil(page) * page + page)
        .sum();
    private_tmpfs(
        dir,
        format!("size={bytes},nr_inodes={},mode=0700", files.len() + 1),
    )?;
    for (path, content) in files {
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(path)?;
            std::io::Write::write_all(&mut f, content.as_bytes())?;
            f.set_permissions(std::fs::Permissions::from_mode(0o644))
        };
        write().map_err(|e| GvisorError::WriteInline {
            path: path.clone(),
            source: Arc::new(e),
        })?;
    }
    Ok(())
}

/// Mounts a size-bounded tmpfs on `dir` (in the private mount namespace of
/// [`private_namespaces`]), so that what the sandbox writes to /output is bounded.
fn private_output_tmpfs(dir: &Path, bytes: u64) -> Result<(), GvisorError> {
    private_tmpfs(
        dir,
        format!(
            "size={bytes},nr_inodes={},mode=0777",
            crate::plan::OUTPUT_INODES
        ),
    )
}

#[cfg(test)]
mod tests;
