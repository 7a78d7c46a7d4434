//! # agentjail-engine
//!
//! The Linux isolation engine: it turns a [`ValidatedManifest`] into an isolated process tree
//! and reports what happened. Every run gets new user, mount, pid, net (loopback only), ipc,
//! uts and cgroup namespaces; a root built from read-only binds of the host's system
//! directories, a curated `/etc`, a fresh `/proc`, a minimal `/dev`, bounded tmpfs for `/tmp`,
//! `/work` and `/output`, inputs bound read-only; an unprivileged uid with every capability
//! dropped; no_new_privs; Landlock limited to exactly those mounts and no TCP; a seccomp filter
//! whose refusals are reported; cgroup memory and pids limits plus rlimits; a wall-clock
//! deadline that kills the whole tree.
//!
//! Limitations: the kernel is shared (a kernel bug can break any of these layers); the host
//! image is identified, not content-pinned; cgroup v2 needs the `memory` and `pids`
//! controllers delegated to the caller's cgroup. What could not be applied is listed in the
//! report's `isolation.degraded`, and the run is refused unless the caller allowed that.
//!
//! Compatibility: Linux ≥ 5.13 on x86_64 (aarch64 compiles the same filter with its own
//! table); Landlock (any ABI) for a strict run — see [`landlock_policy`].
//!
//! Tested by the CLI's integration tests, which run the real binary and attack each layer from
//! inside (probes with sentinels), as root and as an unprivileged user.

pub mod cgroup;
pub mod check;
pub mod copies;
mod delegation;
pub mod gvisor;
pub mod image;
mod inside;
pub mod landlock_policy;
pub mod lifeline;
pub mod live;
mod live_relay;
mod outcome;
pub mod plan;
mod probe;
mod root_sys;
pub mod seccomp;
mod step;
pub mod supervisor;
mod sys;
pub mod term;
pub mod timing;
mod userns;
mod weaken;
pub mod workspace;

pub use agentjail_manifest::ValidatedManifest;

pub use live::LiveDenials;
pub use plan::RootImage;
pub use probe::{ProbeError, probe_run, probe_strict_run};
pub use supervisor::{
    Outcome, RunOptions, STREAM_LIMIT, Sink, discard_prespawned, prespawn, run, run_on,
};
