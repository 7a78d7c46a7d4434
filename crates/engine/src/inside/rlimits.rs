//! The payload's resource limits: a backstop under the cgroup's (or the only bound of a
//! degraded run without one).

use crate::step::{Step, StepResult, step};

/// Sets the payload's rlimits for the plan's `limits` (whether the cgroup's are in place, and
/// the mode); returns the names of those set.
pub(super) fn apply_rlimits(
    l: &agentjail_manifest::Limits,
    cgroup_applied: bool,
    root_mode: bool,
) -> StepResult<Vec<String>> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let lim = |cur: u64, max: u64| Rlimit {
        current: Some(cur),
        maximum: Some(max),
    };
    // A backstop one above the cgroup's limit, so that the cgroup (which counts and reports
    // refusals) is what stops a fork bomb when it exists. In unprivileged mode the init shares
    // the sandbox user's uid and counts toward NPROC too.
    let nproc = if cgroup_applied {
        l.processes + 1
    } else {
        l.processes
    } + if root_mode { 0 } else { 1 };
    let address_space = if cgroup_applied {
        (l.memory_bytes() * 4).max(1 << 30)
    } else {
        l.memory_bytes()
    };
    let nofile_max = getrlimit(Resource::Nofile)
        .maximum
        .unwrap_or(1024)
        .min(1024);
    let list: [(Resource, &str, Rlimit); 6] = [
        (Resource::Core, "core=0", lim(0, 0)),
        (Resource::Nproc, "nproc", lim(nproc, nproc)),
        (Resource::Cpu, "cpu", lim(l.seconds + 1, l.seconds + 2)),
        (
            Resource::Fsize,
            "fsize",
            lim(l.memory_bytes(), l.memory_bytes()),
        ),
        (Resource::Nofile, "nofile", lim(nofile_max, nofile_max)),
        (Resource::As, "as", lim(address_space, address_space)),
    ];
    let mut names = Vec::new();
    for (res, name, v) in list {
        step(Step::SetRlimit(name), setrlimit(res, v))?;
        names.push(name.trim_end_matches("=0").to_string());
    }
    Ok(names)
}
