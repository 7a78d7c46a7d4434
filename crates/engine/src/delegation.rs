//! Whether this host can give an ordinary user a cgroup of its own ([`Delegation`]): read by
//! `cgroup` for the hint of a refused cgroup and by `check` for the fix it proposes (which
//! re-exports it as `agentjail_engine::check::Delegation`). A leaf: host facts only, no other
//! module of the engine.

/// What a host offers for giving an ordinary user a cgroup of its own, so that the fix `check`
/// proposes is one that works there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delegation {
    /// systemd is PID 1 (`sd_booted()`: /run/systemd/system exists).
    pub systemd: bool,
    /// A systemd user manager runs for the uid (its private socket exists): `systemd-run
    /// --user` has someone to ask.
    pub user_manager: bool,
    /// cgroup v2 alone is mounted at /sys/fs/cgroup; else v1 or the hybrid layout, where
    /// systemd delegates nothing to users.
    pub unified: bool,
}

impl Delegation {
    pub fn probe(uid: u32) -> Delegation {
        use std::path::Path;
        Delegation {
            systemd: Path::new("/run/systemd/system").is_dir(),
            user_manager: Path::new(&format!("/run/user/{uid}/systemd/private")).exists(),
            unified: Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
        }
    }

    /// Whether `systemd-run --user --scope -p Delegate=yes` gives the user a cgroup here.
    pub fn systemd_run_works(self) -> bool {
        self.systemd && self.user_manager && self.unified
    }
}
