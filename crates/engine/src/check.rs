//! `agentjail check`: which protections this host offers to this user, and whether a strict
//! run works. The last item is not inferred: it runs `/bin/true` in a strict sandbox.

use serde::Serialize;

use crate::cgroup;
use crate::sys::{self, Cloned};

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
}

fn read(p: &str) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

fn userns() -> Item {
    let mut hints = Vec::new();
    if read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        hints.push("sysctl kernel.unprivileged_userns_clone=0");
    }
    if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1") {
        hints.push("AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1)");
    }
    if read("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
        hints.push("sysctl user.max_user_namespaces=0");
    }
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
    match result {
        Ok(()) => Item {
            name: "user namespaces".into(),
            ok: true,
            detail: "can be created by this user".into(),
        },
        Err(e) => Item {
            name: "user namespaces".into(),
            ok: false,
            detail: format!(
                "clone(CLONE_NEWUSER) failed: {e}{}",
                if hints.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", hints.join("; "))
                }
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
    items.push(match crate::gvisor::available() {
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
    let strict = crate::probe_strict_run();
    items.push(Item {
        name: "mounts in userns".into(),
        ok: strict.is_ok(),
        detail: if strict.is_ok() {
            "tmpfs, proc and read-only bind mounts work in a new user namespace (no overlayfs is used)".into()
        } else {
            "not proved: the strict run below failed".into()
        },
    });
    items.push(Item {
        name: "strict run".into(),
        ok: strict.is_ok(),
        detail: match &strict {
            Ok(()) => "/bin/true ran with every protection applied".into(),
            Err(e) => e.clone(),
        },
    });
    Report {
        strict_run_ok: strict.is_ok(),
        items,
        host_image: crate::image::host_image_identity(),
    }
}
