//! Where a cell request will land before it is made: its step id (the caller's, or one derived
//! from the code for a caller that gives none) and the run it is or will be. For a front door
//! whose client may retry a call without an idempotency key of its own (MCP): the derived step
//! id makes the retry of a cell a replay, and the run's request id lets the door follow the
//! cell's output live.

use super::failure::Failure;
use super::sessions::{db, owned};
use crate::app::AppState;
use crate::policy::Caller;
use crate::storage::sessions as store;

/// A cell request as it will be made.
#[derive(Debug, Clone)]
pub(crate) struct PlannedCell {
    /// The step id (request id within the session) to send.
    pub(crate) request_id: String,
    /// Whether it was derived from the code (no step id was given).
    pub(crate) derived: bool,
    /// The run of the cell the request names (its recorded cell, or the next one):
    /// `<session_id>-<cell>`.
    pub(crate) run_request_id: String,
    /// The session's task.
    pub(crate) task: String,
    /// Whether the step id names a recorded cell (the request will be a replay).
    pub(crate) recorded: bool,
}

/// The step id derived for `code` as the session's cell `n`.
fn derived(code: &str, n: u64) -> String {
    let h = crate::config::sha256_hex(code.as_bytes());
    format!("auto-{}-{n}", &h[..32])
}

/// Plans a cell of the caller's session `id` (not-found for anyone else's, the store's refusal
/// on PostgreSQL). Without a step id one is derived from the code and the cell's place: the
/// next cell's `auto-<sha256(code)[..32]>-<n>`, except that when the session's last cell was
/// the same code with its derived id, that id again, so that a call repeated without a step id
/// (a client's retry, even after the first one ran) replays that cell instead of running the
/// code a second time. Running the same code twice in a row therefore needs step ids.
pub(crate) async fn plan_cell(
    state: &AppState,
    caller: &Caller,
    id: &str,
    step_id: Option<&str>,
    code: &str,
) -> Result<PlannedCell, Failure> {
    let mut ev = caller.event("session_cell");
    ev.session_id = Some(id.to_owned());
    let db = db(state, caller, &ev).await?;
    let s = owned(state, caller, &db, id, &ev).await?;
    let sid = s.session_id.clone();
    let (request_id, derived_id) = match step_id {
        Some(r) => (r.to_owned(), false),
        None => {
            let mut r = derived(code, s.cells);
            if let Some(last) = s.cells.checked_sub(1) {
                let again = derived(code, last);
                let c = db.get_cell(&sid, last).await?;
                if c.is_some_and(|c| c.request_id == again) {
                    r = again;
                }
            }
            (r, true)
        }
    };
    let known = db.get_cell_by_request(&sid, &request_id).await?;
    let recorded = known.is_some();
    let cell = known.map_or(s.cells, |c| c.cell);
    Ok(PlannedCell {
        run_request_id: store::run_request_id(&sid, cell),
        request_id,
        derived: derived_id,
        task: s.task,
        recorded,
    })
}
