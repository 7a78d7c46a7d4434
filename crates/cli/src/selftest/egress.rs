//! `agentjail selftest --egress`: attacks on the egress gateway (filled in below).

use super::Group;

pub static GROUPS: &[Group] = &[];
