//! `agentjail check`: which protections this host offers to this user, and whether a strict
//! run works. The last item is not inferred: it runs `/bin/true` in a strict sandbox.

use serde::Serialize;

use crate::cgroup;
pub use crate::delegation::Delegation;
use crate::sys::{self, Cloned};
use crate::userns::restrictions_line;
pub use crate::userns::{APPARMOR_FIX, UsernsRestriction, userns_hint_for, userns_restrictions};

/// One line of the check.
#[derive(Debug, Clone, Serialize)]
pub struct Item {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

/// The whole check.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub items: Vec<Item>,
    /// A strict run (no `--allow-degraded`) works here.
    pub strict_run_ok: bool,
    pub host_image: String,
    /// When a strict run is refused: what would make it work here, and what
    /// `--allow-degraded` costs instead; one sentence each.
    pub fixes: Vec<String>,
}

/// The end of the engine's refusal message, addressed to someone who has not run `check` yet.
const RUN_HINT: &str = "; hint: `agentjail check` explains";

/// The fix for an ordinary user without a cgroup, fitted to the host.
fn cgroup_fix(d: Delegation, uid: u32) -> String {
    const SYSTEMD_RUN: &str = "`systemd-run --user --scope -p Delegate=yes agentjail run …`";
    if d.systemd_run_works() {
        return format!(
            "fix: run agentjail in a cgroup delegated to you: {SYSTEMD_RUN} (systemd's user manager delegates memory, pids and cpu), or run it as root"
        );
    }
    let why = if !d.systemd {
        "PID 1 is not systemd (no user manager here to delegate one)".to_string()
    } else if !d.unified {
        "systemd delegates cgroups to users on cgroup v2 only, and this host mounts cgroup v1"
            .to_string()
    } else {
        format!(
            "no systemd user manager runs for uid {uid} (one starts with a login session, or at boot after an admin's `loginctl enable-linger`; then {SYSTEMD_RUN} works)"
        )
    };
    let how = if d.unified {
        format!(
            "cgroup v2 here: an admin makes /sys/fs/cgroup/agentjail-{uid} with memory, pids and cpu in /sys/fs/cgroup/cgroup.subtree_control, chowns it, its cgroup.procs and cgroup.subtree_control to uid {uid}, and moves the user's shell into it (`echo PID > /sys/fs/cgroup/agentjail-{uid}/cgroup.procs`)"
        )
    } else {
        format!(
            "cgroup v1 here: an admin makes a cgroup for uid {uid} in each of the memory, pids, cpu and cpuacct hierarchies (`mkdir /sys/fs/cgroup/H/agentjail-{uid} && chown -R {uid} /sys/fs/cgroup/H/agentjail-{uid}`), and agentjail runs from a shell moved into them (`echo $$ > /sys/fs/cgroup/H/agentjail-{uid}/tasks` for each H)"
        )
    };
    format!(
        "fix: this user holds no cgroup of its own, and {why}; an admin can delegate one: {how}; or run agentjail as root"
    )
}

/// How to get what a failed strict run lacked, from the items that failed.
fn fixes_for(items: &[Item], root: bool, delegation: Delegation, uid: u32) -> Vec<String> {
    let failed = |name: &str| items.iter().any(|i| i.name == name && !i.ok);
    let mut fixes = Vec::new();
    let mut costs = Vec::new();
    if failed("cgroups") {
        fixes.push(if root {
            "fix: mount cgroup v2 with the memory, pids and cpu controllers enabled (or cgroup v1 memory, pids and cpu hierarchies)".to_string()
        } else {
            cgroup_fix(delegation, uid)
        });
        costs.push("memory and processes bounded per process by rlimits only (RLIMIT_AS, RLIMIT_NPROC), not for the whole tree, and no CPU limit");
    }
    if failed("landlock") {
        fixes.push("fix: a kernel ≥ 5.13 with `landlock` among the active LSMs (`lsm=…,landlock` on the kernel command line)".to_string());
        costs.push("the file system bounded by the mount namespace alone, without Landlock");
    }
    if failed("user namespaces") {
        fixes.push(
            "fix: allow user namespaces for this user (see the `user namespaces` line above)"
                .to_string(),
        );
    }
    if costs.is_empty() {
        fixes.push("or: `agentjail run --allow-degraded …` runs with what is available and lists the rest in the report's isolation.degraded".to_string());
    } else {
        fixes.push(format!(
            "or: `agentjail run --allow-degraded …` runs anyway, with {} (the report's isolation.degraded lists it)",
            costs.join("; ")
        ));
    }
    fixes
}

fn read(p: &str) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

fn userns() -> Item {
    let restrictions = userns_restrictions(
        std::path::Path::new("/proc/sys"),
        rustix::process::geteuid().is_root(),
    );
    let result = match sys::clone_sandbox(libc::CLONE_NEWUSER as u64) {
        Ok(Cloned::Child) => sys::exit_now(0),
        Ok(Cloned::Parent { pidfd, .. }) => {
            let _ = rustix::process::waitid(
                rustix::process::WaitId::PidFd(std::os::fd::AsFd::as_fd(&pidfd)),
                rustix::process::WaitIdOptions::EXITED,
            );
            Ok(())
        }
        Err(e) => Err(e),
    };
    // Under the AppArmor restriction the clone itself succeeds, but the namespace has no
    // capabilities (no mounts), so a restriction fails the item whatever the clone did.
    let line = restrictions_line(&restrictions);
    match (result, line) {
        (Ok(()), None) => Item {
            name: "user namespaces".into(),
            ok: true,
            detail: "can be created by this user".into(),
        },
        (Ok(()), Some(l)) => Item {
            name: "user namespaces".into(),
            ok: false,
            detail: l,
        },
        (Err(e), l) => Item {
            name: "user namespaces".into(),
            ok: false,
            detail: format!(
                "clone(CLONE_NEWUSER) failed: {e}{}",
                l.map(|l| format!("; {l}")).unwrap_or_default()
            ),
        },
    }
}

/// Landlock: the rights this kernel gives a run and what covers the rest; not ok only when a
/// strict run must be refused for it (Landlock absent).
fn landlock_item(abi: u32) -> Item {
    let (ok, detail) = crate::landlock_policy::describe(abi);
    Item {
        name: "landlock".into(),
        ok,
        detail,
    }
}

/// Runs the whole check.
pub fn check() -> Report {
    let mut items = vec![userns()];
    items.push(landlock_item(crate::landlock_policy::effective_abi()));
    let actions = read("/proc/sys/kernel/seccomp/actions_avail").unwrap_or_default();
    items.push(Item {
        name: "seccomp".into(),
        ok: actions.contains("user_notif"),
        detail: if actions.is_empty() {
            "not available".into()
        } else if actions.contains("user_notif") {
            "filters and user notification (refused syscalls are reported)".into()
        } else {
            "filters without user notification (refused syscalls cannot be reported)".into()
        },
    });
    let (v, detail) = cgroup::describe();
    items.push(Item {
        name: "cgroups".into(),
        ok: v.is_some(),
        detail,
    });
    items.push(Item {
        name: "user".into(),
        ok: true,
        detail: if rustix::process::geteuid().is_root() {
            "root: the sandbox user maps to a dedicated unprivileged host uid per run".into()
        } else {
            "unprivileged: the sandbox user maps to your own uid (single-uid user namespace)".into()
        },
    });
    let gvisor = crate::gvisor::available();
    let gvisor_version = gvisor.as_ref().ok().cloned();
    items.push(match gvisor {
        Ok(v) => Item {
            name: "gvisor tier".into(),
            ok: true,
            detail: format!(
                "available ({v}); `--isolation gvisor` runs on gVisor's user-space kernel"
            ),
        },
        Err(e) => Item {
            name: "gvisor tier".into(),
            ok: false,
            detail: format!("unavailable: {e} (optional; the native tier does not need it)"),
        },
    });
    if let Some(v) = &gvisor_version {
        items.push(match crate::gvisor::platform(v) {
            Ok(p) => Item {
                name: "gvisor platform".into(),
                ok: true,
                detail: p.describe(),
            },
            Err(e) => Item {
                name: "gvisor platform".into(),
                ok: false,
                detail: e.to_string(),
            },
        });
    }
    let strict = crate::probe::probe_strict_run();
    // A strict run refused before the sandbox was built (a missing cgroup, Landlock) says
    // nothing about mounts: a run that allows what is missing proves or disproves them.
    let refused_before_start = matches!(&strict, Err(crate::probe::ProbeError::Refused(_)));
    let mounts = match &strict {
        Ok(()) => Ok(()),
        Err(_) if refused_before_start => crate::probe::probe_run(true),
        Err(e) => Err(e.clone()),
    };
    const MOUNTS_OK: &str =
        "tmpfs, proc and read-only bind mounts work in a new user namespace (no overlayfs is used)";
    items.push(Item {
        name: "mounts in userns".into(),
        ok: mounts.is_ok(),
        detail: match (&strict, &mounts) {
            (Ok(()), _) => MOUNTS_OK.into(),
            (Err(_), Ok(())) => format!(
                "{MOUNTS_OK}; proved by a run with --allow-degraded (the strict run below was refused for another reason)"
            ),
            (Err(_), Err(e)) if refused_before_start => format!("failed: {e}"),
            (Err(_), Err(_)) => "not proved: the strict run below failed".into(),
        },
    });
    items.push(Item {
        name: "strict run".into(),
        ok: strict.is_ok(),
        detail: match &strict {
            Ok(()) => "/bin/true ran with every protection applied".into(),
            // This is `check`: no hint to run it.
            Err(e) => {
                let e = e.to_string();
                match e.find(RUN_HINT) {
                    Some(i) => e[..i].to_string(),
                    None => e,
                }
            }
        },
    });
    let fixes = if strict.is_ok() {
        Vec::new()
    } else {
        let uid = rustix::process::geteuid();
        fixes_for(
            &items,
            uid.is_root(),
            Delegation::probe(uid.as_raw()),
            uid.as_raw(),
        )
    };
    Report {
        strict_run_ok: strict.is_ok(),
        items,
        host_image: crate::image::host_image_identity(),
        fixes,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::userns::hint_for;

    /// A fake /proc/sys with the given settings.
    fn fake(settings: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (rel, v) in settings {
            let p = d.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, format!("{v}\n")).unwrap();
        }
        d
    }

    #[test]
    fn ubuntu_apparmor_restriction_is_detected_for_ordinary_users_only() {
        let d = fake(&[
            ("kernel/apparmor_restrict_unprivileged_userns", "1"),
            ("user/max_user_namespaces", "63000"),
        ]);
        let r = userns_restrictions(d.path(), false);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(
            r[0].setting
                .starts_with("kernel.apparmor_restrict_unprivileged_userns=1")
        );
        assert!(r[0].fix.contains("deploy/apparmor/agentjail"));
        assert!(r[0].fix.contains("apparmor_parser -r"));
        assert!(
            userns_restrictions(d.path(), true).is_empty(),
            "root is exempt"
        );
        // Set to 0, nothing is restricted.
        let d = fake(&[("kernel/apparmor_restrict_unprivileged_userns", "0")]);
        assert!(userns_restrictions(d.path(), false).is_empty());
    }

    #[test]
    fn debian_sysctl_and_max_user_namespaces_are_detected() {
        let d = fake(&[
            ("kernel/unprivileged_userns_clone", "0"),
            ("user/max_user_namespaces", "0"),
        ]);
        let r = userns_restrictions(d.path(), false);
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(r[0].fix.contains("kernel.unprivileged_userns_clone=1"));
        assert!(r[1].fix.contains("user.max_user_namespaces="));
        // max_user_namespaces=0 stops root too; the Debian sysctl does not.
        let r = userns_restrictions(d.path(), true);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0].setting.starts_with("user.max_user_namespaces=0"));
        // Permissive values and a kernel without these files: nothing.
        let d = fake(&[
            ("kernel/unprivileged_userns_clone", "1"),
            ("user/max_user_namespaces", "15000"),
        ]);
        assert!(userns_restrictions(d.path(), false).is_empty());
        assert!(userns_restrictions(&d.path().join("missing"), false).is_empty());
    }

    #[test]
    fn run_time_hint_names_the_restriction_only_for_kernel_refusals() {
        let d = fake(&[("kernel/apparmor_restrict_unprivileged_userns", "1")]);
        let eperm = "init: mount tmpfs /tmp: Operation not permitted (os error 1)";
        let h = hint_for(eperm, d.path(), false).unwrap();
        assert!(
            h.starts_with("this host restricts user namespaces: kernel.apparmor"),
            "{h}"
        );
        assert!(
            h.contains("fix: install agentjail's AppArmor profile"),
            "{h}"
        );
        assert!(!h.contains('\n'), "one line");
        let enospc = "cannot create the sandbox namespaces: No space left on device (os error 28)";
        assert!(hint_for(enospc, d.path(), false).is_some());
        // Another failure, root, or no restriction: no hint.
        assert!(hint_for("input /x: not found", d.path(), false).is_none());
        assert!(hint_for(eperm, d.path(), true).is_none());
        assert!(hint_for(eperm, fake(&[]).path(), false).is_none());
    }
}
