//! The signals probes of `agentjail selftest` (see [`super`]).

use std::process::Command;

use super::super::kit::{Env, Probe, Tier};
use super::common::*;

pub(super) const SIGNAL: &[Probe] = &[
    Probe {
        id: "signal.outside",
        layer: "pid namespace + Landlock signal scoping",
        attempt: "SIGKILL a process of the host by its pid",
        expect: "ESRCH; the host process lives on",
    },
    Probe {
        id: "signal.init",
        layer: "pid namespace init semantics, credentials",
        attempt: "SIGKILL the sandbox's init",
        expect: "no effect: the run ends normally",
    },
];

pub(super) fn signal(env: &Env, tier: Tier) -> Verdicts {
    let mut victim = match Command::new("/bin/sleep").arg("60").spawn() {
        Ok(c) => c,
        Err(e) => return all(SIGNAL, fail(format!("setup: /bin/sleep: {e}"))),
    };
    let body = format!(
        "import signal\nattempt(\"kill_host\", lambda: os.kill({}, signal.SIGKILL))\nattempt(\"kill_init\", lambda: os.kill(1, signal.SIGKILL))\ntime.sleep(0.2)\n",
        victim.id()
    );
    let o = env.py(tier, &body, &[]);
    let alive = matches!(victim.try_wait(), Ok(None));
    let _ = victim.kill();
    let _ = victim.wait();
    if !o.complete() {
        return all(SIGNAL, fail(o.incomplete()));
    }
    let kh = res(&o, "kill_host");
    vec![
        (
            "signal.outside",
            if alive && kh.starts_with("errno=") {
                pass(format!("{kh}; the host process lives"))
            } else {
                fail(format!("kill: {kh}; host process alive: {alive}"))
            },
        ),
        (
            "signal.init",
            if o.status() == "ok" {
                pass(format!(
                    "kill(1): {}; the run ended ok",
                    res(&o, "kill_init")
                ))
            } else {
                fail(format!("the run ended {}", o.status()))
            },
        ),
    ]
}
