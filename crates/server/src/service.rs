//! The service layer, shared by every front door: authenticate, upload, submit (with
//! execute-once and admission), get, read the artifact or receipt, reconcile, and the task
//! catalogue. It asks [`crate::policy`] for every decision, talks to the store and the audit
//! log, starts runs through [`crate::execution::runner`], and returns typed results or a
//! [`Failure`] (a policy [`Refusal`], or an internal error whose detail stays in the log). HTTP
//! ([`crate::doors::api`]) and MCP ([`crate::doors::mcp`]) map these to their own forms
//! (status + problem details; tool results and JSON-RPC errors); neither depends on the other,
//! and nothing here knows a transport.
//!
//! The parts, each a file under `service/`: [`failure`], [`startup`], [`auth`], [`inputs`],
//! [`runs`], [`sessions`] (and [`session_steps`]: where a cell request will land, with a step id
//! derived for a caller that gives none), [`listing`], [`logs`], [`events`], [`cancel`],
//! [`reconcile`] and [`catalogue`]. This file only names them and what the front doors use; none
//! of them uses it.

mod auth;
mod cancel;
mod catalogue;
pub(crate) mod events;
mod failure;
mod inputs;
mod listing;
mod live_cells;
mod logs;
mod reconcile;
mod runs;
mod session_admin;
mod session_fork;
mod session_steps;
mod sessions;
mod startup;

pub use crate::policy::{Caller, Refusal, RunRequest};
pub(crate) use auth::{authenticate, deny, spawn_auth_failure_flusher};
pub(crate) use cancel::cancel;
pub(crate) use catalogue::task_views;
pub use catalogue::{TaskInputView, TaskView};
pub(crate) use events::{Follow, Position, RunEvent, follow, follow_own_call, follow_submitted};
pub use failure::Failure;
pub use inputs::InputCreated;
pub(crate) use inputs::{ts, upload};
pub(crate) use listing::list;
pub use listing::{ListQuery, MAX_PAGE, RunList, RunSummary};
pub(crate) use logs::log;
pub use reconcile::ReconcileAction;
pub(crate) use reconcile::reconcile;
pub use runs::{Artifact, ArtifactView, RunInput, RunView};
pub(crate) use runs::{CALLER_GONE, artifact, get, receipt, submit, view};
pub(crate) use session_admin::{
    checkpoint as checkpoint_session, close as close_session, list_cells as list_session_cells,
};
pub(crate) use session_fork::fork as fork_session;
pub(crate) use session_steps::plan_cell as plan_session_cell;
pub use sessions::{
    CellList, CellRequest, CellView, CellWorkspace, ForkRequest, ForkedFrom, SessionRequest,
    SessionView,
};
pub(crate) use sessions::{cell as session_cell, get as get_session, open as open_session};
