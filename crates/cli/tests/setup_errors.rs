//! A set-up failure inside the sandbox is reported with its own step, never as a generic
//! "init died". The failure provoked here is real: in a mount namespace where part of /proc is
//! covered (as container runtimes mask /proc), the kernel refuses a new proc mount to a user
//! namespace (EPERM), so the sandbox's init fails at `mount proc on /proc`. The init queues
//! that reason and exits while the supervisor may still be sending it the next message; both
//! orders must give the same report.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

#[test]
fn an_init_that_fails_early_is_reported_with_its_own_step_every_time() {
    if !common::is_root() {
        common::skip("needs root (a mount namespace with /proc partly covered)");
        return;
    }
    let dir = common::tmp();
    let mut wrong = Vec::new();
    // The race went the wrong way in about 3 of 20 runs on the old code.
    for i in 0..30 {
        let report = dir.path().join(format!("r{i}.json"));
        let script = format!(
            "mount -t tmpfs none /proc/acpi 2>/dev/null || mount --bind /dev/null /proc/sysrq-trigger || exit 99; exec {} run --report {} -- /bin/true",
            common::bin().display(),
            report.display()
        );
        let out = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script])
            .output()
            .expect("unshare runs");
        assert_ne!(out.status.code(), Some(99), "could not cover part of /proc");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let text = std::fs::read_to_string(&report).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(out.status.code(), Some(125), "run {i}: {stderr}");
        assert_eq!(v["status"], "setup_error", "run {i}: {text}");
        if !stderr.contains("sandbox setup failed at `mount proc on /proc`: mount(proc)") {
            wrong.push(stderr.trim().to_string());
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of 30 runs did not name the failed step:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
