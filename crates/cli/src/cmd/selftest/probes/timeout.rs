//! The the deadline and leftover processes probes of `agentjail selftest` (see [`super`]).

use std::io::Read;
use std::time::{Duration, Instant};

use super::super::kit::{Env, Probe, Tier};
use super::common::*;

pub(super) const TIMEOUT: &[Probe] = &[
    Probe {
        id: "timeout.daemon_after_exit",
        layer: "pid namespace init kills the tree",
        attempt: "leave a double-forked, SIGTERM-ignoring daemon behind and exit 0",
        expect: "no process of the run outlives it",
    },
    Probe {
        id: "timeout.daemon_at_deadline",
        layer: "wall-clock deadline + tree kill",
        attempt: "a double-forked daemon and a SIGTERM-ignoring loop under --timeout 1",
        expect: "timeout (124); no process survives",
    },
    Probe {
        id: "timeout.stopped_child",
        layer: "tree kill with SIGKILL",
        attempt: "a SIGSTOPped child and a loop under --timeout 1",
        expect: "timeout (124); the stopped child is gone too",
    },
];

pub(super) fn any_process_named(marker: &str) -> bool {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return false;
    };
    rd.flatten().any(|e| {
        let mut s = String::new();
        std::fs::File::open(e.path().join("cmdline"))
            .and_then(|mut f| f.read_to_string(&mut s))
            .is_ok()
            && s.contains(marker)
    })
}

pub(super) fn timeout(env: &Env, tier: Tier) -> Verdicts {
    let survivors = |marker: &str| {
        // The kill is synchronous with the run's end; allow the kernel a moment to reap.
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(500) {
            if !any_process_named(marker) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        any_process_named(marker)
    };
    // (probe, marker, --timeout, the script given its marker, the exit code it must end with,
    // what a survivor means, what passing says).
    type Script = fn(&str) -> String;
    let cases: [(&'static str, &str, &str, Script, i32, &str, &str); 3] = [
        (
            "timeout.daemon_after_exit",
            "agentjail-daemon",
            "10",
            |m| {
                format!(
                    "trap '' TERM; (setsid sh -c 'trap \"\" TERM; exec -a {m} sleep 300' &) ; sleep 0.2; exit 0"
                )
            },
            0,
            "the daemon survived the run",
            "exit 0; the daemon is gone",
        ),
        (
            "timeout.daemon_at_deadline",
            "agentjail-loop",
            "1",
            |m| {
                format!(
                    "trap '' TERM; (setsid sh -c 'trap \"\" TERM; exec -a {m} sleep 300' &); while :; do :; done"
                )
            },
            124,
            "a process survived the timeout",
            "timeout; nothing survived",
        ),
        (
            "timeout.stopped_child",
            "agentjail-stopped",
            "1",
            |m| {
                format!(
                    "setsid sh -c 'exec -a {m} sleep 300' & P=$!; sleep 0.3; kill -STOP $P; while :; do :; done"
                )
            },
            124,
            "the stopped child survived the timeout",
            "timeout; the stopped child is gone",
        ),
    ];
    cases
        .into_iter()
        .map(|(id, prefix, seconds, script, want, survived, passed)| {
            let marker = env.unique(prefix);
            let o = env.run(
                tier,
                &s(&[
                    "--timeout",
                    seconds,
                    "--",
                    "/bin/sh",
                    "-c",
                    &script(&marker),
                ]),
            );
            let v = if o.code != want {
                // The first case ran to its end: its message says "the command".
                let what = if want == 0 {
                    "the command ended"
                } else {
                    "ended"
                };
                fail(format!("{what} {} (exit {})", o.status(), o.code))
            } else if survivors(&marker) {
                fail(survived)
            } else {
                pass(passed)
            };
            (id, v)
        })
        .collect()
}
