//! `AGENTJAIL_DEBUG_TIMING=1`: the supervisor, the init and the payload print to stderr the
//! time of each phase and setup step (CLOCK_MONOTONIC in µs, then the time since that process's
//! previous mark); `=coarse` prints the phases only. A diagnostic for performance work.

use std::sync::OnceLock;
use std::time::Instant;

static START: OnceLock<Option<std::sync::Mutex<Instant>>> = OnceLock::new();
static EVERY_STEP: OnceLock<bool> = OnceLock::new();

/// Reads the switch; called in the supervisor before the clone. `=coarse` leaves out the
/// init's and the payload's individual setup steps (whose printing costs time itself).
pub fn init_from_env() {
    let v = std::env::var("AGENTJAIL_DEBUG_TIMING").ok();
    EVERY_STEP.get_or_init(|| v.as_deref().is_some_and(|v| v != "coarse"));
    START.get_or_init(|| v.map(|_| std::sync::Mutex::new(Instant::now())));
}

/// A mark for one setup step of the init or the payload.
pub fn step_mark(label: &str) {
    if every_step() {
        mark(label);
    }
}

/// Whether setup steps are marked (so that a label is only built when it is printed).
pub fn every_step() -> bool {
    EVERY_STEP.get().copied().unwrap_or(false)
}

pub fn mark(label: &str) {
    if let Some(Some(m)) = START.get()
        && let Ok(mut last) = m.lock()
    {
        let now = Instant::now();
        // CLOCK_MONOTONIC is shared by every pid namespace, so lines from the supervisor,
        // the init and the payload can be merged by this column.
        let mono = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        let abs_us = (mono.tv_sec % 1000) * 1_000_000 + mono.tv_nsec / 1000;
        // This process's own CPU time so far: on a busy or small machine the wall-clock
        // deltas include waiting for a CPU, this does not.
        let cpu = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        let cpu_us = cpu.tv_sec * 1_000_000 + cpu.tv_nsec / 1000;
        eprintln!(
            "agentjail-timing: {abs_us:>10} pid {} {:>7} us  cpu {cpu_us:>7} us  {label}",
            std::process::id(),
            (now - *last).as_micros()
        );
        *last = now;
    }
}
