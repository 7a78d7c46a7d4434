//! Cancelling a run (`POST /v1/runs/{request_id}/cancel`): a queued run never starts; a running
//! one is killed (its whole sandbox, on whichever node executes it) and ends `cancelled`
//! (`unknown` for a task with network access: something outside may have happened before the
//! kill), with what it printed so far kept. Idempotent: cancelling a cancelled run answers its
//! record; a run that ended otherwise is final (409). Only the actor that submitted the run,
//! or an operator, cancels it (another actor of its tenant reads it, but cannot stop it).
//!
//! On this node the run's own cancellation token is cancelled ([`crate::execution::runner::cancel_here`]). On
//! PostgreSQL a queued run no executor has claimed ends `cancelled` in the database at once;
//! a claimed one is flagged, and the executor holding it kills it at its next lease renewal
//! (at most a third of `lease_seconds` later).

use std::time::Duration;

use super::failure::Failure;
use super::runs::get_checked;
use crate::app::AppState;
use crate::policy::{Caller, Refusal};
use crate::run_state::RunState;
use crate::storage::db::RunRow;

/// How long a cancel waits for the run to end before it answers with the record as it stands
/// (still `running`: the client polls `GET /v1/runs/{request_id}`).
const WAIT: Duration = Duration::from_secs(15);

/// Cancels `request_id` of the caller's tenant (audited as `run_cancel`); the record after it.
pub(crate) async fn cancel(
    state: &AppState,
    caller: &Caller,
    request_id: &str,
) -> Result<RunRow, Failure> {
    let r = get_checked(state, caller, request_id, "run_cancel", |r| {
        if r.actor != caller.actor && !caller.operator {
            return Err(Refusal::NotYourRun);
        }
        match r.status {
            RunState::Queued | RunState::Running | RunState::Cancelled => Ok(()),
            s => Err(Refusal::NotCancellable { state: s }),
        }
    })
    .await?;
    if r.status == RunState::Cancelled {
        return Ok(r);
    }
    super::runs::stop(state, &r, "cancelled before the run started").await?;
    super::runs::wait_until(state, &r.tenant, &r.request_id, None, WAIT).await
}
