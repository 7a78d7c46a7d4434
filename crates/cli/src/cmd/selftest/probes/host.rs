//! The host probes of `agentjail selftest` (see [`super`]).

use std::process::Command;

use super::super::kit::{Env, Probe, Tier, printable};
use super::common::*;

pub(super) const HOST: &[Probe] = &[Probe {
    id: "host.strict_run",
    layer: "all layers",
    attempt: "run /bin/true with every protection required (no --allow-degraded)",
    expect: "runs; nothing degraded",
}];

pub(super) fn host(env: &Env, _tier: Tier) -> Verdicts {
    let report = env.dir().join(format!("{}.json", env.unique("strict")));
    let mut cmd = Command::new(std::fs::read_link("/proc/self/exe").unwrap_or_default());
    cmd.arg("run")
        .arg("--report")
        .arg(&report)
        .args(["--", "/bin/true"]);
    let o = super::super::kit::run_command(cmd, &report);
    let degraded = o.report["isolation"]["degraded"]
        .as_array()
        .map(|a| a.len())
        .unwrap_or(0);
    let v = if o.code == 0 && o.status() == "ok" && degraded == 0 {
        pass(format!(
            "ran strictly: landlock ABI {}, seccomp notify {}, cgroup {}",
            o.report["isolation"]["landlock_abi"],
            o.report["isolation"]["seccomp_notify"],
            o.report["isolation"]["cgroup"]
        ))
    } else {
        let line = o
            .stderr
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        fail(format!(
            "a strict run is refused here (exit {}): {}",
            o.code,
            printable(line, 300)
        ))
    };
    vec![("host.strict_run", v)]
}
