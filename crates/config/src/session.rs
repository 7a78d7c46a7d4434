//! A task's `session` table: its sessions' workspace bound, lifetime and number of cells.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A task's sessions (docs/api.md, "Sessions"): every cell of a session starts from the
/// session's last workspace checkpoint and leaves the next one.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionSettings {
    /// Whether the task may be opened as a session (default true; only tasks with
    /// `code = "allowed"` can be).
    #[serde(default = "d_true")]
    pub enabled: bool,
    /// Bytes of file content in a session's workspace, in MiB, for every checkpoint (default
    /// 64, 1-1024).
    #[serde(default = "d_session_mb")]
    pub max_mb: u64,
    /// Entries (files and folders) of a session's workspace (default 10000, 1-10000).
    #[serde(default = "d_session_files")]
    pub max_files: u64,
    /// Cells a session may run (default 1000, 1-100000).
    #[serde(default = "d_session_cells")]
    pub max_cells: u64,
    /// Seconds a session lives after it was opened (default 86400, 60-2592000); an expired
    /// session takes no more cells.
    #[serde(default = "d_day")]
    pub lifetime_seconds: u64,
    /// Cells of an open session whose checkpoints are kept for a fork: the most recent ones
    /// (default 8, 1-1000); older ones are deleted (a fork from one is `410 checkpoint-gone`),
    /// and all of a closed or expired session's by the retention sweep.
    #[serde(default = "d_keep")]
    pub keep_checkpoints: u64,
    /// A resident interpreter makes the task's sessions live (docs/api.md, "Live sessions"):
    /// the first cell starts one sandbox for the session, with the task's whole boundary,
    /// running the interpreter, and every cell is executed in it, its variables, imports and
    /// definitions kept between cells. Only for a task with `code = "allowed"` on the native
    /// tier whose command runs its code file with Python 3. Default none: each cell is a run of
    /// its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interpreter: Option<Interpreter>,
    /// Live sessions: seconds without a cell after which the live sandbox ends, its
    /// workspace checkpointed (default 300, 5-86400); the next cell starts a fresh one.
    #[serde(default = "d_idle")]
    pub idle_seconds: u64,
}

/// A resident interpreter of a live session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Interpreter {
    /// `python3` (the task's command runs the driver given as its code).
    Python,
}

fn d_idle() -> u64 {
    300
}

fn d_keep() -> u64 {
    8
}

fn d_true() -> bool {
    true
}
fn d_session_mb() -> u64 {
    64
}
fn d_session_files() -> u64 {
    10_000
}
fn d_session_cells() -> u64 {
    1_000
}

impl Default for SessionSettings {
    fn default() -> Self {
        SessionSettings {
            enabled: true,
            max_mb: d_session_mb(),
            max_files: d_session_files(),
            max_cells: d_session_cells(),
            lifetime_seconds: d_day(),
            keep_checkpoints: d_keep(),
            interpreter: None,
            idle_seconds: d_idle(),
        }
    }
}

fn d_day() -> u64 {
    86_400
}

impl SessionSettings {
    /// The bounds of each setting: the field (below the task) and why, on the first one out.
    pub(crate) fn check(&self) -> Result<(), (&'static str, &'static str)> {
        if !(1..=1024).contains(&self.max_mb) {
            return Err(("session.max_mb", "must be 1-1024"));
        }
        if !(1..=10_000).contains(&self.max_files) {
            return Err(("session.max_files", "must be 1-10000"));
        }
        if !(1..=100_000).contains(&self.max_cells) {
            return Err(("session.max_cells", "must be 1-100000"));
        }
        if !(60..=2_592_000).contains(&self.lifetime_seconds) {
            return Err(("session.lifetime_seconds", "must be 60-2592000"));
        }
        if !(5..=86_400).contains(&self.idle_seconds) {
            return Err(("session.idle_seconds", "must be 5-86400"));
        }
        if !(1..=1000).contains(&self.keep_checkpoints) {
            return Err(("session.keep_checkpoints", "must be 1-1000"));
        }
        Ok(())
    }
}
