//! The gVisor tier: the same manifest, run on gVisor's user-space kernel (`runsc`) instead of
//! directly on the host kernel.
//!
//! From the same [`Plan`] as the native tier, this module writes an OCI runtime bundle: a
//! read-only root directory holding the plan's symlinks and curated `/etc` files, read-only bind
//! mounts for the system directories and inputs, tmpfs for `/tmp` and `/work`, and `/output` as
//! a bind of a host directory that is itself a size-bounded tmpfs in a mount namespace private
//! to this supervisor (so the sandbox cannot fill the host's disk, and the tmpfs disappears with
//! the supervisor). uid/gid 65534, no capabilities, no_new_privs, rlimits (gVisor enforces
//! RLIMIT_NPROC itself), `--network=none`, and the OCI memory and pids limits, which runsc puts
//! on the cgroup of its sandbox (the pids limit there also counts gVisor's own threads, so it
//! is set above the manifest's; the manifest's process limit is enforced by RLIMIT_NPROC inside).
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
use std::time::{Duration, Instant};

use agentjail_manifest::ValidatedManifest;
use agentjail_manifest::report::{DenialKind, RunReport, Status};
use rustix::event::{PollFd, PollFlags, poll};
use serde_json::json;

use crate::plan::{Op, Plan, RootImage, SANDBOX_ID};
use crate::supervisor::{Outcome, RunOptions, Stream, fail};

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

/// Whether the tier can run here, with the reason when not.
pub fn available() -> Result<String, String> {
    let runsc = runsc_path().ok_or("runsc not found (Debian: apt-get install runsc)")?;
    if !rustix::process::geteuid().is_root() {
        return Err(
            "the gvisor tier needs root here (runsc manages its sandbox's cgroups and mounts)"
                .into(),
        );
    }
    let out = Command::new(&runsc)
        .arg("--version")
        .output()
        .map_err(|e| format!("{}: {e}", runsc.display()))?;
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
    if !matches!(vm.manifest.network, agentjail_manifest::Network::Deny) {
        return fail(report, "manifest field `network`: allowlists are not available on the gvisor tier yet; use the native tier or `network: deny`".into());
    }
    let runsc = match available() {
        Ok(_) => runsc_path().unwrap_or_default(),
        Err(e) => return fail(report, format!("gvisor tier unavailable: {e}")),
    };
    let work = match tempfile::Builder::new()
        .prefix("agentjail-gvisor-")
        .tempdir()
    {
        Ok(d) => d,
        Err(e) => return fail(report, format!("cannot create the bundle folder: {e}")),
    };
    let plan = Plan::for_root(vm, root);
    let id = format!(
        "agentjail-{}-{}",
        std::process::id(),
        work.path()
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("x")
            .trim_start_matches("agentjail-gvisor-")
    );
    let out_dir = work.path().join("output");
    if let Err(e) = write_bundle(work.path(), &plan, &out_dir) {
        return fail(report, format!("gvisor bundle: {e}"));
    }
    if let Err(e) = private_output_tmpfs(&out_dir, vm.manifest.limits.output_bytes()) {
        return fail(report, format!("gvisor /output: {e}"));
    }
    let state = work.path().join("state");
    let _ = std::fs::create_dir(&state);

    let mut child = match Command::new(&runsc)
        .arg("--root")
        .arg(&state)
        .args(["--network=none", "run", "--bundle"])
        .arg(work.path().join("bundle"))
        .arg(&id)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .spawn()
    {
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
    let mut orphaned = false;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        // The caller is gone (its lifeline hung up): kill the sandbox as at the deadline.
        if !orphaned && opts.lifeline.as_deref().is_some_and(hung_up) {
            orphaned = true;
            timed_out = true;
            let _ = Command::new(&runsc)
                .arg("--root")
                .arg(&state)
                .args(["kill", &id, "KILL"])
                .output();
            let _ = child.kill();
        }
        if remaining.is_zero() && !timed_out {
            timed_out = true;
            let _ = Command::new(&runsc)
                .arg("--root")
                .arg(&state)
                .args(["kill", &id, "KILL"])
                .output();
            let _ = child.kill();
        }
        let mut fds: Vec<PollFd<'_>> = Vec::new();
        if let Some(p) = &pidfd {
            fds.push(PollFd::new(p, PollFlags::IN));
        }
        for f in [&out.fd, &err.fd].into_iter().flatten() {
            fds.push(PollFd::new(f, PollFlags::IN));
        }
        if let Some(f) = opts.lifeline.as_deref().filter(|_| !orphaned) {
            fds.push(PollFd::new(f, PollFlags::IN));
        }
        let step = remaining.min(Duration::from_millis(if pidfd.is_some() {
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
    let status = child.wait().ok();
    let wall = start.elapsed();
    while out.pump() {}
    while err.pump() {}
    let _ = Command::new(&runsc)
        .arg("--root")
        .arg(&state)
        .args(["delete", "--force", &id])
        .output();

    report.wall_ms = wall.as_millis() as u64;
    report.stdout = out.report;
    report.stderr = err.report;
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
        "gvisor: syscalls are implemented by gVisor's Sentry, which runs under its own seccomp filter; refused syscalls are not reported by name".into(),
        "gvisor: Landlock is not used; file access is mediated by gVisor's gofer over the same read-only binds".into(),
        "gvisor: CPU time and peak memory are not reported; a memory-limit kill shows as SIGKILL".into(),
    ];
    let limits = vm.manifest.limits;
    if orphaned {
        report.status = Status::SetupError;
        report.error = Some("the caller (lifeline) is gone; the sandbox was killed".into());
    } else if timed_out {
        report.status = Status::Timeout;
        report.signal = Some(libc::SIGKILL);
        report.deny(
            DenialKind::Limit,
            format!(
                "time: wall-clock limit of {} s reached, every process killed",
                limits.seconds
            ),
        );
    } else {
        match status.and_then(|s| s.code()) {
            Some(0) => {
                report.status = Status::Ok;
                report.exit_code = Some(0);
            }
            // runsc reports a container killed by signal N as 128+N.
            Some(c) if c > 128 && c < 128 + 65 => {
                report.status = Status::Signaled;
                report.signal = Some(c - 128);
                if c - 128 == libc::SIGKILL {
                    report.deny(
                        DenialKind::Limit,
                        format!("memory: the sandbox was killed (SIGKILL); with gVisor this is most likely the memory limit of {} MiB", limits.memory_mb),
                    );
                }
            }
            Some(c) => {
                report.status = Status::ExitNonzero;
                report.exit_code = Some(c);
            }
            None => {
                report.status = Status::SetupError;
                report.error = Some("runsc ended without an exit status".into());
            }
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
        output_full,
        stdout: out.captured,
        stderr: err.captured,
        cleanup: Default::default(),
    }
}

/// Mounts a size-bounded tmpfs on `dir` in a mount namespace private to this process (created
/// on first use), so that what the sandbox writes to /output is bounded and invisible outside.
fn private_output_tmpfs(dir: &Path, bytes: u64) -> Result<(), String> {
    use rustix::mount::*;
    use std::sync::Once;
    static UNSHARED: Once = Once::new();
    let mut err = None;
    UNSHARED.call_once(|| {
        if let Err(e) = crate::sys::unshare(libc::CLONE_NEWNS) {
            err = Some(format!("unshare(CLONE_NEWNS): {e}"));
            return;
        }
        if let Err(e) = mount_change(
            "/",
            MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
        ) {
            err = Some(format!("make / private: {e}"));
        }
    });
    if let Some(e) = err {
        return Err(e);
    }
    let data = std::ffi::CString::new(format!("size={bytes},nr_inodes=16384,mode=0777"))
        .map_err(|e| e.to_string())?;
    mount(
        "tmpfs",
        dir,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        Some(data.as_c_str()),
    )
    .map_err(|e| format!("mount tmpfs on {}: {e}", dir.display()))
}

/// Writes `bundle/config.json` and `bundle/rootfs` for the plan.
fn write_bundle(work: &Path, plan: &Plan, out_dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let bundle = work.join("bundle");
    let rootfs = bundle.join("rootfs");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&rootfs)?;
    std::fs::DirBuilder::new().mode(0o755).create(out_dir)?;
    let at = |dest: &str| rootfs.join(dest.trim_start_matches('/'));
    let mkdirs = |p: &Path| {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(p)
    };
    let mut mounts = vec![json!({"destination": "/proc", "type": "proc", "source": "proc"})];
    for op in &plan.ops {
        match op {
            Op::BindRo { src, dest, dir } => {
                let p = at(dest);
                if *dir {
                    mkdirs(&p)?;
                } else {
                    if let Some(parent) = p.parent() {
                        mkdirs(parent)?;
                    }
                    std::fs::write(&p, b"")?;
                }
                mounts.push(json!({"destination": dest, "type": "bind", "source": src,
                                   "options": ["rbind", "ro", "nosuid", "nodev"]}));
            }
            Op::Symlink { target, dest } => {
                let p = at(dest);
                if let Some(parent) = p.parent() {
                    mkdirs(parent)?;
                }
                std::os::unix::fs::symlink(target, &p)?;
            }
            Op::File { dest, content } => {
                let p = at(dest);
                if let Some(parent) = p.parent() {
                    mkdirs(parent)?;
                }
                std::fs::write(&p, content)?;
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644))?;
            }
            Op::Tmpfs {
                dest, size_bytes, ..
            } if dest == "/output" => {
                let _ = size_bytes; // bounded by the host tmpfs under the bind
                mkdirs(&at(dest))?;
                mounts.push(
                    json!({"destination": "/output", "type": "bind", "source": out_dir,
                                   "options": ["rbind", "rw", "nosuid", "nodev", "noexec"]}),
                );
            }
            Op::Tmpfs { dest, .. } if dest == "/dev" => {}
            Op::Tmpfs {
                dest,
                size_bytes,
                exec,
                ..
            } => {
                mkdirs(&at(dest))?;
                let mut o = vec![
                    "nosuid".to_string(),
                    "nodev".into(),
                    "mode=1777".into(),
                    format!("size={size_bytes}"),
                ];
                if !exec {
                    o.push("noexec".into());
                }
                mounts.push(
                    json!({"destination": dest, "type": "tmpfs", "source": "tmpfs", "options": o}),
                );
            }
            // gVisor provides /proc and a minimal /dev of its own.
            Op::Proc { .. } | Op::Device { .. } => {}
        }
    }
    for d in ["input", "work", "tmp", "output", "proc", "dev"] {
        mkdirs(&at(d))?;
    }
    let l = plan.limits;
    let rl = |t: &str, v: u64| json!({"type": t, "hard": v, "soft": v});
    let config = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": SANDBOX_ID, "gid": SANDBOX_ID},
            "args": plan.argv,
            "env": plan.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
            "cwd": plan.cwd,
            "capabilities": {"bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []},
            "rlimits": [rl("RLIMIT_NPROC", l.processes), rl("RLIMIT_NOFILE", 1024), rl("RLIMIT_CORE", 0),
                        rl("RLIMIT_CPU", l.seconds + 1), rl("RLIMIT_FSIZE", l.memory_bytes())],
            "noNewPrivileges": true
        },
        "root": {"path": "rootfs", "readonly": true},
        "hostname": crate::plan::HOSTNAME,
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
            "resources": {
                "memory": {"limit": l.memory_bytes(), "swap": l.memory_bytes()},
                // gVisor's own threads count here too; the command's limit is RLIMIT_NPROC.
                "pids": {"limit": l.processes + 256}
            }
        }
    });
    let bytes = serde_json::to_vec_pretty(&config).map_err(std::io::Error::other)?;
    std::fs::write(bundle.join("config.json"), bytes)?;
    std::fs::set_permissions(work, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// The lifeline pipe hung up (or is readable: its writer never writes).
fn hung_up(fd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
}
