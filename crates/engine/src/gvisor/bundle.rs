//! The OCI runtime bundle of a gVisor run, written from the [`Plan`]: `bundle/rootfs` (the
//! plan's symlinks, curated files and mount points), `bundle/config.json` (the mounts, the
//! process with its user, rlimits and no capabilities, the namespaces, the cgroup limits and
//! the socket-family filter) and the folder of inline inputs.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::plan::{Op, Plan, SANDBOX_ID};

/// The bundle's folder of inline inputs: `bundle/inline` in the run's folder `work`.
pub(super) fn inline_dir(work: &Path) -> PathBuf {
    work.join("bundle").join("inline")
}

/// The socket families a sandboxed program may open: AF_UNIX, AF_INET and AF_INET6, as on the
/// native tier. Everything else (AF_NETLINK, AF_PACKET, AF_VSOCK, AF_ALG, …, and numbers beyond
/// the kernel's AF_MAX) is refused with EPERM by gVisor's Sentry, which enforces the bundle's
/// OCI seccomp filter itself (runsc `--oci-seccomp`), for `socket` and `socketpair` alike.
///
/// OCI seccomp rules compare one argument each, so the allowlist is written as a default of
/// "allow" with one refusal per family number that is not allowed, plus one for every number
/// above the highest the kernel knows. gVisor cannot notify anyone of a refusal, so they are not
/// in the report on this tier (docs/isolation.md).
fn socket_family_allowlist() -> serde_json::Value {
    const ALLOWED: [u64; 3] = [
        libc::AF_UNIX as u64,
        libc::AF_INET as u64,
        libc::AF_INET6 as u64,
    ];
    /// AF_MCTP, the highest family of Linux 6.x (AF_MAX - 1).
    const HIGHEST: u64 = 45;
    let mut rules = Vec::new();
    for family in (0..=HIGHEST).filter(|f| !ALLOWED.contains(f)) {
        rules.push(json!({
            "names": ["socket", "socketpair"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": libc::EPERM,
            "args": [{"index": 0, "value": family, "op": "SCMP_CMP_EQ"}]
        }));
    }
    rules.push(json!({
        "names": ["socket", "socketpair"],
        "action": "SCMP_ACT_ERRNO",
        "errnoRet": libc::EPERM,
        "args": [{"index": 0, "value": HIGHEST, "op": "SCMP_CMP_GT"}]
    }));
    json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"],
        "syscalls": rules
    })
}

/// Writes `bundle/config.json` (0600: it holds the task's env) and `bundle/rootfs` for the plan;
/// returns the inline inputs, each with the path of the file its bind names (below `bundle/inline`,
/// 0700), which [`private_inline_files`](super::private_inline_files) writes in the private mount
/// namespace.
pub(super) fn write_bundle<'p>(
    work: &Path,
    plan: &'p Plan,
    out_dir: &Path,
) -> std::io::Result<Vec<(PathBuf, &'p str)>> {
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
    let mut inline = Vec::new();
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
            Op::Copy { dest, .. } => {
                // Made by the native tier's supervisor only (crate::copies).
                return Err(std::io::Error::other(format!(
                    "input {dest}: a copied input on the gvisor tier"
                )));
            }
            Op::Inline { dest, content } => {
                // runsc's gofer serves binds from host paths, so under gVisor an inline input
                // is a file below the bundle's `inline` folder, bound read-only; the file is
                // written later, on a tmpfs only the runner's mount namespace sees.
                let dir = inline_dir(work);
                if inline.is_empty() {
                    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
                }
                let src = dir.join(inline.len().to_string());
                inline.push((src.clone(), content.as_str()));
                let p = at(dest);
                if let Some(parent) = p.parent() {
                    mkdirs(parent)?;
                }
                std::fs::write(&p, b"")?;
                mounts.push(json!({"destination": dest, "type": "bind", "source": src,
                                   "options": ["bind", "ro", "nosuid", "nodev"]}));
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
            "seccomp": socket_family_allowlist(),
            "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
            "resources": {
                "memory": {"limit": l.memory_bytes(), "swap": l.memory_bytes()},
                // gVisor's own threads count here too; the command's limit is RLIMIT_NPROC.
                "pids": {"limit": l.processes + 256},
                "cpu": {"quota": l.cpu_quota_us(100_000), "period": 100_000}
            }
        }
    });
    let bytes = serde_json::to_vec_pretty(&config).map_err(std::io::Error::other)?;
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(bundle.join("config.json"))?;
        std::io::Write::write_all(&mut f, &bytes)?;
    }
    std::fs::set_permissions(work, std::fs::Permissions::from_mode(0o755))?;
    Ok(inline)
}
