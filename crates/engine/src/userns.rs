//! Host settings that keep this user from making the sandbox's user namespaces, and the
//! one-line hint a refused set-up step gets (shared by `agentjail check` and the reports of
//! runs whose set-up the kernel refused).

/// A host setting that keeps this user from making the sandbox's user namespaces, with the
/// one-line fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsernsRestriction {
    /// The setting, e.g. `kernel.apparmor_restrict_unprivileged_userns=1`.
    pub setting: String,
    /// One line that lifts it for agentjail.
    pub fix: String,
}

/// Where the AppArmor profile is installed from (docs/isolation.md).
pub const APPARMOR_FIX: &str = "install agentjail's AppArmor profile: sudo install -m 644 deploy/apparmor/agentjail /etc/apparmor.d/agentjail && sudo apparmor_parser -r /etc/apparmor.d/agentjail (its path must be the binary's, /usr/local/bin/agentjail)";

/// The settings under `proc_sys` (normally `/proc/sys`) that restrict user namespaces for this
/// caller. `root`: the caller has CAP_SYS_ADMIN, which the AppArmor restriction and Debian's
/// `unprivileged_userns_clone` exempt; `max_user_namespaces=0` stops everyone.
pub fn userns_restrictions(proc_sys: &std::path::Path, root: bool) -> Vec<UsernsRestriction> {
    let get = |rel: &str| {
        std::fs::read_to_string(proc_sys.join(rel))
            .ok()
            .map(|s| s.trim().to_string())
    };
    let mut out = Vec::new();
    if !root && get("kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1") {
        out.push(UsernsRestriction {
            setting: "kernel.apparmor_restrict_unprivileged_userns=1 (AppArmor gives unconfined programs' user namespaces no capabilities, as Ubuntu >= 23.10 does)".into(),
            fix: APPARMOR_FIX.into(),
        });
    }
    if !root && get("kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        out.push(UsernsRestriction {
            setting: "kernel.unprivileged_userns_clone=0 (only root may create user namespaces)"
                .into(),
            fix: "sudo sysctl -w kernel.unprivileged_userns_clone=1 (or run agentjail as root)"
                .into(),
        });
    }
    if get("user/max_user_namespaces").as_deref() == Some("0") {
        out.push(UsernsRestriction {
            setting: "user.max_user_namespaces=0 (no user namespace may be created)".into(),
            fix: "sudo sysctl -w user.max_user_namespaces=10000".into(),
        });
    }
    out
}

/// One line naming each restriction and its fix, or None.
pub(crate) fn restrictions_line(r: &[UsernsRestriction]) -> Option<String> {
    if r.is_empty() {
        return None;
    }
    Some(
        r.iter()
            .map(|x| {
                format!(
                    "this host restricts user namespaces: {}; fix: {}",
                    x.setting, x.fix
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    )
}

/// For a run that could not start: when the failure is a refusal by the kernel (EPERM, EACCES,
/// ENOSPC) and this host restricts user namespaces for this caller, the line that says so
/// and how to fix it.
pub fn userns_hint_for(msg: &str) -> Option<String> {
    hint_for(
        msg,
        std::path::Path::new("/proc/sys"),
        rustix::process::geteuid().is_root(),
    )
}

pub(crate) fn hint_for(msg: &str, proc_sys: &std::path::Path, root: bool) -> Option<String> {
    let refused = [
        "Operation not permitted",
        "Permission denied",
        "No space left on device",
        "os error 1)",
        "os error 13)",
        "os error 28)",
    ]
    .iter()
    .any(|n| msg.contains(n));
    if !refused {
        return None;
    }
    restrictions_line(&userns_restrictions(proc_sys, root))
}
