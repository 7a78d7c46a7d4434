//! Library side of the `agentjail` binary: the run pipeline shared by the CLI and (later) the
//! orchestrator.

pub mod flags;
pub mod pipeline;
