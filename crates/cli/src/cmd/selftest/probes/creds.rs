//! The credentials, descriptors, environment probes of `agentjail selftest` (see [`super`]).

use std::process::Command;

use super::super::kit::{Env, PY, Probe, Tier, Verdict, printable};
use super::common::*;

pub(super) const CREDS: &[Probe] = &[
    Probe {
        id: "creds.capabilities",
        layer: "capability drop, no_new_privs",
        attempt: "read its capability sets and no_new_privs",
        expect: "every set empty, NoNewPrivs 1",
    },
    Probe {
        id: "creds.seccomp",
        layer: "seccomp",
        attempt: "read its seccomp mode",
        expect: "2 (filter)",
    },
    Probe {
        id: "creds.ids",
        layer: "user namespace",
        attempt: "read its uid, gid and groups",
        expect: "65534 65534, no groups",
    },
    Probe {
        id: "fd.inherited",
        layer: "close-on-exec of everything above stderr",
        attempt: "use a descriptor the caller left open (fd 7)",
        expect: "only 0, 1, 2 exist",
    },
    Probe {
        id: "env.caller",
        layer: "environment built from the manifest only",
        attempt: "read a secret from the caller's environment",
        expect: "absent from the sandbox and the report; only HOME, PATH … and --env given",
    },
];

pub(super) const CREDS_PY: &str = r#"
print("FDS", sorted(int(x) for x in os.listdir("/proc/self/fd")), flush=True)
for l in open("/proc/self/status"):
    if l.startswith(("Cap", "NoNewPrivs", "Seccomp:")):
        print("STATUS", l.strip().replace("\t", " "), flush=True)
print("IDS", os.getuid(), os.getgid(), os.getgroups(), flush=True)
print("ENV", sorted(os.environ.items()), flush=True)
"#;

/// Starts a command with fd 7 open and inheritable (on the launcher's own file).
pub(super) const FD_LAUNCHER: &str = "import os, subprocess, sys\nfd = os.open(sys.argv[0], os.O_RDONLY)\nos.dup2(fd, 7)\nos.set_inheritable(7, True)\nsys.exit(subprocess.run(sys.argv[1:], pass_fds=[7]).returncode)\n";

pub(super) fn creds(env: &Env, tier: Tier) -> Verdicts {
    let secret = "hunter2-SELFTEST-SECRET-9981";
    let prepared = env.py_command(tier, CREDS_PY, &s(&["--env", "GIVEN=yes"]));
    let launcher = env.file("launch.py", FD_LAUNCHER.as_bytes(), 0o644);
    let ((inner, report), launcher) = match (prepared, launcher) {
        (Ok(c), Ok(l)) => (c, l),
        (Err(e), _) | (_, Err(e)) => return all(CREDS, fail(format!("setup: {e}"))),
    };
    let mut cmd = Command::new(PY);
    cmd.arg(&launcher)
        .arg(inner.get_program())
        .args(inner.get_args())
        .env("AGENTJAIL_SELFTEST_SECRET", secret);
    let o = super::super::kit::run_command(cmd, &report);
    if !o.complete() {
        return all(CREDS, fail(o.incomplete()));
    }
    let status: Vec<String> = o
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("STATUS "))
        .map(str::to_string)
        .collect();
    let has = |want: &str| status.iter().any(|l| l == want);
    let zero = "0000000000000000";
    let caps_ok = if tier == Tier::Gvisor {
        // gVisor's /proc/self/status shows no CapAmb or NoNewPrivs line: every set it shows.
        has(&format!("CapEff: {zero}"))
            && status
                .iter()
                .filter(|l| l.starts_with("Cap"))
                .all(|l| l.ends_with(zero))
    } else {
        ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]
            .iter()
            .all(|c| has(&format!("{c}: {zero}")))
            && has("NoNewPrivs: 1")
    };
    let fds = o.line("FDS ").unwrap_or_default();
    let ids = o.line("IDS ").unwrap_or_default();
    let envline = o.line("ENV ").unwrap_or_default();
    let env_ok = !o.stdout.contains(secret)
        && !envline.contains("AGENTJAIL_SELFTEST_SECRET")
        && !envline.contains("CARGO")
        && envline.contains("('GIVEN', 'yes')")
        && envline.contains("('HOME', '/work')")
        && !o.report.to_string().contains(secret);
    vec![
        (
            "creds.capabilities",
            if caps_ok {
                pass("all five capability sets empty; NoNewPrivs 1")
            } else {
                fail(status.join("; "))
            },
        ),
        (
            "creds.seccomp",
            if tier == Tier::Gvisor {
                Verdict::Skip(
                    "gVisor implements the syscalls itself; the native tier's filter does not apply"
                        .into(),
                )
            } else if has("Seccomp: 2") {
                pass("Seccomp: 2")
            } else {
                fail(
                    status
                        .iter()
                        .find(|l| l.starts_with("Seccomp:"))
                        .cloned()
                        .unwrap_or_else(|| "no Seccomp line".into()),
                )
            },
        ),
        (
            "creds.ids",
            if ids == "65534 65534 []" {
                pass("65534 65534, no groups")
            } else {
                fail(ids)
            },
        ),
        (
            "fd.inherited",
            // 0, 1, 2 and the descriptor listdir itself holds.
            if fds == "[0, 1, 2, 3]" {
                pass("fd 7 absent; only 0, 1, 2")
            } else {
                fail(format!("descriptors: {fds}"))
            },
        ),
        (
            "env.caller",
            if env_ok {
                pass("the secret is in neither the sandbox nor the report")
            } else {
                fail(format!("environment: {}", printable(&envline, 300)))
            },
        ),
    ]
}
