//! Forking a session (`POST /v1/sessions/{id}/fork`, crate::service::sessions): a new session
//! of the same owner, task and inputs from a kept checkpoint of an open one, within its
//! source's limits (its `expires_at`, and the cells it had run toward `max_cells`).

use super::auth::deny;
use super::failure::Failure;
use super::sessions::{
    ForkRequest, SessionView, db, insert, owned, replay_open, run_of, settings, sha_of,
};
use crate::app::AppState;
use crate::execution::checkpoints;
use crate::policy::{self, Caller, Refusal};
use crate::storage::sessions::{self as store, SessionRow};
use crate::util::{now, random_hex};

/// `POST /v1/sessions/{id}/fork`: a new session of the same owner, task and inputs, starting
/// from the workspace the given cell (default: the last) left.
pub(crate) async fn fork(
    state: &AppState,
    caller: &Caller,
    id: &str,
    req: ForkRequest,
) -> Result<(SessionView, bool), Failure> {
    let mut ev = caller.event("session_fork");
    ev.session_id = Some(id.to_owned());
    let db = db(state, caller, &ev).await?;
    let s = owned(state, caller, &db, id, &ev).await?;
    if let Err(r) = policy::check_request_id(&req.request_id) {
        return Err(deny(state, caller, ev, r).await);
    }
    ev.request_id = Some(req.request_id.clone());
    ev.task = Some(s.task.clone());
    let body_sha = sha_of(&serde_json::json!({"fork": s.session_id, "cell": req.cell}));
    let existing = db
        .session_for_request(&caller.tenant, &req.request_id)
        .await?;
    if let Some(e) = existing {
        return replay_open(state, caller, &db, &e, &body_sha, ev).await;
    }
    // A fork continues its source: never from an ended one, and within its limits.
    if s.closed_at.is_some() {
        return Err(deny(state, caller, ev, Refusal::SessionClosed).await);
    }
    if now() >= s.expires_at {
        return Err(deny(state, caller, ev, Refusal::SessionExpired).await);
    }
    let Some(settings) = settings(state, &s.task).cloned() else {
        return Err(deny(state, caller, ev, Refusal::TaskGone).await);
    };
    let at = match req.cell {
        Some(n) => Some(n),
        None => s.cells.checked_sub(1),
    };
    let (head, receipt) = match at {
        None => (s.head_sha256.clone(), s.last_receipt_sha256.clone()),
        Some(n) => {
            let c = db.get_cell(&s.session_id, n).await?;
            let Some(c) = c else {
                return Err(deny(state, caller, ev, Refusal::NoSuchCell).await);
            };
            // Only the most recent cells keep their checkpoints while a session is open.
            if !s.keeps(n) {
                let keep = s.keep_checkpoints;
                return Err(
                    deny(state, caller, ev, Refusal::CheckpointGone { cell: n, keep }).await,
                );
            }
            let run = run_of(state, &c.tenant, &c.run_request_id).await?;
            if !run.status.is_terminal() {
                return Err(deny(state, caller, ev, Refusal::CellInProgress { cell: n }).await);
            }
            (c.head_after.clone(), c.chain_after.clone())
        }
    };
    let t = now();
    let row = SessionRow {
        session_id: format!(
            "{}{}",
            store::SESSION_ID_PREFIX,
            random_hex(16).map_err(|_| Failure::Internal)?
        ),
        tenant: caller.tenant.clone(),
        actor: caller.actor.clone(),
        request_id: req.request_id.clone(),
        body_sha256: body_sha.clone(),
        task: s.task.clone(),
        inputs: s.inputs.clone(),
        created_at: t,
        // The source's end, never later: forking does not extend a session's lifetime.
        expires_at: s.expires_at,
        closed_at: None,
        head_sha256: head,
        last_receipt_sha256: receipt,
        cells: 0,
        forked_from: Some(s.session_id.clone()),
        forked_cell: at,
        // The cells the source had run up to the forked one count toward the fork's limit.
        cells_before: s.cells_before + at.map_or(0, |n| n + 1),
        keep_checkpoints: settings.keep_checkpoints,
    };
    // The checkpoint it starts from must still be stored as the fork is recorded (a later
    // cell of the source may have moved it out of the kept ones, and a sweep deleted it).
    let start = row.head_sha256.clone().map(|h| {
        let gone = Refusal::CheckpointGone {
            cell: at.unwrap_or(0),
            keep: s.keep_checkpoints,
        };
        let file = checkpoints::path(&state.inner.data_dir, &h);
        (h, file, gone)
    });
    insert(state, caller, &db, row, &body_sha, ev, start).await
}
