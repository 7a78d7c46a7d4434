//! The probes of `agentjail selftest`, grouped by the sandbox run(s) that check them. Each
//! probe's id, layer, attempt and expectation are listed once, in its group's table; the group's
//! function returns a verdict per id (an id without a verdict fails). docs/selftest.md describes
//! every probe.
//!
//! The families, each a file under `probes/`, in the order of the groups below: [`host`],
//! [`files`], [`proc`], [`syscalls`], [`creds`], [`net`], [`signals`], [`limits`], [`timeout`]
//! and [`output`]; what they share is in [`common`]. This file only lists the groups; no family
//! uses it or another family.

mod common;
mod creds;
mod files;
mod host;
mod limits;
mod net;
mod output;
mod proc;
mod signals;
mod syscalls;
mod timeout;

use super::kit::Group;
use common::{BOTH, NATIVE};
use creds::*;
use files::*;
use host::*;
use limits::*;
use net::*;
use output::*;
use proc::*;
use signals::*;
use syscalls::*;
use timeout::*;

pub static GROUPS: &[Group] = &[
    Group {
        name: "host",
        tiers: NATIVE,
        probes: HOST,
        run: host,
    },
    Group {
        name: "fs",
        tiers: BOTH,
        probes: FS,
        run: fs,
    },
    Group {
        name: "inputs",
        tiers: BOTH,
        probes: INPUTS,
        run: inputs,
    },
    Group {
        name: "vanish",
        tiers: BOTH,
        probes: VANISH,
        run: vanish,
    },
    Group {
        name: "proc",
        tiers: NATIVE,
        probes: PROC,
        run: proc_,
    },
    Group {
        name: "pid1",
        tiers: NATIVE,
        probes: PID1,
        run: pid1,
    },
    Group {
        name: "syscall",
        tiers: NATIVE,
        probes: SYSCALL,
        run: syscall,
    },
    Group {
        name: "creds",
        tiers: BOTH,
        probes: CREDS,
        run: creds,
    },
    Group {
        name: "net",
        tiers: BOTH,
        probes: NET,
        run: net,
    },
    Group {
        name: "signal",
        tiers: NATIVE,
        probes: SIGNAL,
        run: signal,
    },
    Group {
        name: "limits",
        tiers: BOTH,
        probes: LIMITS,
        run: limits,
    },
    Group {
        name: "exhaust",
        tiers: NATIVE,
        probes: EXHAUST,
        run: exhaust,
    },
    Group {
        name: "timeout",
        tiers: NATIVE,
        probes: TIMEOUT,
        run: timeout,
    },
    Group {
        name: "output",
        tiers: BOTH,
        probes: OUTPUT,
        run: output,
    },
    Group {
        name: "output-size",
        tiers: BOTH,
        probes: OUTPUT_SIZE,
        run: output_size,
    },
    Group {
        name: "output-race",
        tiers: NATIVE,
        probes: OUTPUT_RACE,
        run: output_race,
    },
];
