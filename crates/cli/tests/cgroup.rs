//! cgroup limits attacked from inside the sandbox with the real binary: the CPU limit
//! (`limits.cpus`, `--cpus`) against busy processes, its validation, its place in the report
//! and in `agentjail check`, and the per-run cgroups' removal.
//!
//! These run on the host's cgroups (this CI machine: cgroup v1 controllers). The cgroup v2
//! placements (root cgroup, session scope, `--scope` leaf, delegated and undelegated users)
//! are exercised on real pure-v2 kernels by the kernel matrix (ci/kernel-matrix, `.ci/run`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use serde_json::Value;

mod common;
use common::skip;
use common::{Out, agentjail};

/// Two busy processes for a fixed wall time, then `SPIN-DONE` (the sentinel: the payload ran to
/// its end rather than being stopped by something else).
const SPIN: &str = "end=$(( $(date +%s) + 4 )); \
    (while [ $(date +%s) -lt $end ]; do :; done) & \
    while [ $(date +%s) -lt $end ]; do :; done; wait; echo SPIN-DONE";

/// The host offers a cgroup CPU limit to this process (v1 `cpu` hierarchy or v2 controller).
fn cpu_controller() -> bool {
    let out = agentjail(&["check"]);
    out.stdout
        .lines()
        .any(|l| l.starts_with("cgroups") && l.contains("and the CPU limit"))
}

fn report(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).expect("report written")).expect("report JSON")
}

/// Runs SPIN under `--cpus N`; returns (cpu_ms / wall_ms, report, out).
fn spin(cpus: &str) -> (f64, Value, Out) {
    let d = tempfile::tempdir().unwrap();
    let rep = d.path().join("r.json");
    let out = agentjail(&[
        "run",
        "--report",
        rep.to_str().unwrap(),
        "--cpus",
        cpus,
        "--timeout",
        "30",
        "--",
        "/bin/sh",
        "-c",
        SPIN,
    ]);
    assert_eq!(out.code, 0, "{}", out.dump());
    assert!(out.stdout.contains("SPIN-DONE"), "{}", out.dump());
    let r = report(&rep);
    assert_eq!(r["accounting"], "cgroup", "{r}");
    let cpu = r["cpu_ms"].as_f64().unwrap();
    let wall = r["wall_ms"].as_f64().unwrap().max(1.0);
    (cpu / wall, r, out)
}

/// A payload of two busy processes under `--cpus 0.1` gets at most ~0.1 CPU-seconds per wall
/// second; under `--cpus 2` it gets more. The machine is shared (its load lowers both figures,
/// never raises the limited one), so the bound is checked with a margin and the unlimited run
/// only has to do clearly better.
#[test]
fn cpu_limit_bounds_busy_processes() {
    if !cpu_controller() {
        skip("no cgroup cpu controller for this user");
        return;
    }
    let (limited, r, _) = spin("0.1");
    assert_eq!(r["limits"]["cpus"].as_f64(), Some(0.1), "{r}");
    let (free, r2, _) = spin("2");
    assert_eq!(r2["limits"]["cpus"].as_f64(), Some(2.0), "{r2}");
    eprintln!("cpu per wall second: --cpus 0.1 → {limited:.3}, --cpus 2 → {free:.3}");
    assert!(
        limited <= 0.15,
        "--cpus 0.1 used {limited:.3} CPU-s per s: {r}"
    );
    assert!(
        free > 0.15 && free > limited * 1.4,
        "--cpus 2 used {free:.3} CPU-s per s, not clearly more than --cpus 0.1's {limited:.3}"
    );
}

/// The default (1 CPU) is in force, and reported, when nothing is asked for.
#[test]
fn default_cpu_limit_is_reported() {
    let d = tempfile::tempdir().unwrap();
    let rep = d.path().join("r.json");
    let out = agentjail(&[
        "run",
        "--allow-degraded",
        "--report",
        rep.to_str().unwrap(),
        "--",
        "/bin/true",
    ]);
    assert_eq!(out.code, 0, "{}", out.dump());
    assert_eq!(report(&rep)["limits"]["cpus"].as_f64(), Some(1.0));
}

/// Out-of-range CPU limits are refused with one line naming the field, before anything runs,
/// from the flag and from a manifest.
#[test]
fn cpu_limit_out_of_range_is_refused() {
    for bad in ["0", "0.001", "1025", "NaN", "-1"] {
        let flag = format!("--cpus={bad}");
        let out = agentjail(&["run", &flag, "--", "/bin/echo", "RAN-SENTINEL"]);
        assert_eq!(out.code, 125, "--cpus {bad}: {}", out.dump());
        assert!(!out.stdout.contains("RAN-SENTINEL"), "{}", out.dump());
        assert!(out.stderr.contains("limits.cpus"), "{}", out.dump());
        assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.dump());
    }
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m.yaml");
    std::fs::write(
        &m,
        "command: [/bin/echo, RAN-SENTINEL]\nlimits: { cpus: 5000 }\n",
    )
    .unwrap();
    let out = agentjail(&["run", "--manifest", m.to_str().unwrap()]);
    assert_eq!(out.code, 125, "{}", out.dump());
    assert!(out.stderr.contains("limits.cpus"), "{}", out.dump());
    assert!(!out.stdout.contains("RAN-SENTINEL"), "{}", out.dump());
}

/// A fractional limit in a manifest is applied and reported as given.
#[test]
fn manifest_cpu_limit_reaches_the_report() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m.yaml");
    std::fs::write(&m, "command: [/bin/true]\nlimits: { cpus: 0.25 }\n").unwrap();
    let rep = d.path().join("r.json");
    let out = agentjail(&[
        "run",
        "--allow-degraded",
        "--manifest",
        m.to_str().unwrap(),
        "--report",
        rep.to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{}", out.dump());
    assert_eq!(report(&rep)["limits"]["cpus"].as_f64(), Some(0.25));
}

/// Every per-run cgroup directory (memory, pids, cpuacct and now cpu) is gone after the run.
#[test]
fn per_run_cgroups_are_removed() {
    let child = Command::new(common::bin())
        .args(["run", "--cpus", "0.5", "--", "/bin/true"])
        .env_remove("XDG_DATA_HOME")
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let prefix = format!("agentjail-{pid}-");
    let mut left = Vec::new();
    for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        let Ok(rd) = std::fs::read_dir(root) else {
            continue;
        };
        for h in rd.flatten() {
            let walk = walk(&h.path(), 3);
            left.extend(walk.into_iter().filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.starts_with(&prefix) || n.starts_with("agentjail-supervisor")
                })
            }));
        }
    }
    assert!(left.is_empty(), "left behind: {left:?}");
}

fn walk(dir: &Path, depth: u32) -> Vec<std::path::PathBuf> {
    let mut v = Vec::new();
    if depth == 0 {
        return v;
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                v.push(e.path());
                v.extend(walk(&e.path(), depth - 1));
            }
        }
    }
    v
}

/// `check` names the CPU limit on the cgroups line.
#[test]
fn check_names_the_cpu_limit() {
    let out = agentjail(&["check"]);
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("cgroups"))
        .unwrap_or_default()
        .to_string();
    assert!(line.contains("CPU limit"), "{}", out.dump());
}
