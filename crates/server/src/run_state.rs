//! The state of a run record, one enum instead of string literals. Its text form (serde, the
//! store's `status` column, the API's `status` field, audit records and metric labels) is the
//! snake_case word of each variant, exactly the strings the service always used.

use std::fmt;
use std::str::FromStr;

use agentjail_manifest::report::Status;
use serde::{Deserialize, Serialize};

/// Where a run is: `queued` and `running` are in flight; every other state is final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Admitted, waiting for a run slot.
    Queued,
    /// Its `agentjail run` process is running.
    Running,
    /// Finished; its output passed verification.
    Ok,
    /// The command exited with a non-zero code.
    ExitNonzero,
    /// The command was ended by a signal.
    Signaled,
    /// Killed at the task's time limit (network-free tasks; else `unknown`).
    Timeout,
    /// Killed by the memory limit.
    MemoryLimit,
    /// The command ran but its output failed verification.
    OutputRejected,
    /// The run could not be set up.
    SetupError,
    /// The job id expired before a run slot was free.
    Expired,
    /// The outcome is not known (the service stopped, a network task timed out or was
    /// cancelled while running); an operator reconciles it.
    Unknown,
    /// An operator abandoned an `unknown` run.
    Abandoned,
    /// Cancelled by the client (network-free tasks, or before it started).
    Cancelled,
}

/// Every state, in declaration order.
pub const ALL: [RunState; 13] = [
    RunState::Queued,
    RunState::Running,
    RunState::Ok,
    RunState::ExitNonzero,
    RunState::Signaled,
    RunState::Timeout,
    RunState::MemoryLimit,
    RunState::OutputRejected,
    RunState::SetupError,
    RunState::Expired,
    RunState::Unknown,
    RunState::Abandoned,
    RunState::Cancelled,
];

impl RunState {
    /// The state's word, as stored and shown.
    pub const fn as_str(self) -> &'static str {
        match self {
            RunState::Queued => "queued",
            RunState::Running => "running",
            RunState::Ok => "ok",
            RunState::ExitNonzero => "exit_nonzero",
            RunState::Signaled => "signaled",
            RunState::Timeout => "timeout",
            RunState::MemoryLimit => "memory_limit",
            RunState::OutputRejected => "output_rejected",
            RunState::SetupError => "setup_error",
            RunState::Expired => "expired",
            RunState::Unknown => "unknown",
            RunState::Abandoned => "abandoned",
            RunState::Cancelled => "cancelled",
        }
    }

    /// Whether the run is final (neither queued nor running).
    pub const fn is_terminal(self) -> bool {
        !matches!(self, RunState::Queued | RunState::Running)
    }

    /// The state a finished `agentjail run` reported.
    pub const fn from_report(s: Status) -> RunState {
        match s {
            Status::Ok => RunState::Ok,
            Status::ExitNonzero => RunState::ExitNonzero,
            Status::Signaled => RunState::Signaled,
            Status::Timeout => RunState::Timeout,
            Status::MemoryLimit => RunState::MemoryLimit,
            Status::OutputRejected => RunState::OutputRejected,
            Status::SetupError => RunState::SetupError,
        }
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A word that names no run state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a run state: {0:?}")]
pub struct UnknownState(pub String);

impl FromStr for RunState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<RunState, UnknownState> {
        ALL.into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownState(s.chars().take(64).collect()))
    }
}

impl PartialEq<&str> for RunState {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl From<RunState> for String {
    fn from(s: RunState) -> String {
        s.as_str().to_string()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// The words are the service's public vocabulary: they must never change.
    #[test]
    fn words_are_the_ones_the_service_always_used() {
        let words: Vec<&str> = ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            words,
            [
                "queued",
                "running",
                "ok",
                "exit_nonzero",
                "signaled",
                "timeout",
                "memory_limit",
                "output_rejected",
                "setup_error",
                "expired",
                "unknown",
                "abandoned",
                "cancelled"
            ]
        );
        for s in ALL {
            assert_eq!(s.as_str().parse::<RunState>().unwrap(), s);
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
            assert_eq!(
                serde_json::from_value::<RunState>(s.as_str().into()).unwrap(),
                s
            );
            assert_eq!(s.is_terminal(), !matches!(s.as_str(), "queued" | "running"));
        }
        assert!("Ok".parse::<RunState>().is_err());
        assert!("".parse::<RunState>().is_err());
    }

    #[test]
    fn report_statuses_map_to_the_same_words() {
        use Status::*;
        for s in [
            Ok,
            ExitNonzero,
            Signaled,
            Timeout,
            MemoryLimit,
            OutputRejected,
            SetupError,
        ] {
            assert_eq!(
                serde_json::to_value(s).unwrap(),
                RunState::from_report(s).as_str()
            );
        }
    }
}
