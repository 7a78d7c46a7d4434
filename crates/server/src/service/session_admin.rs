//! A session's owner's other operations: its cells a page at a time, and its end (`DELETE`).

use super::auth::deny;
use super::failure::Failure;
use super::sessions::{
    CellList, SessionView, cell_view, db, owned, run_of, session_row, session_view,
};
use crate::app::AppState;
use crate::policy::Caller;
use crate::policy::Refusal;
use crate::storage::audit::Event;
use crate::storage::sessions as store;
use crate::util::now;

/// `DELETE /v1/sessions/{id}`: ends the session (idempotent); a cell still queued or running
/// is cancelled through the runs' cancel path.
pub(crate) async fn close(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<SessionView, Failure> {
    let mut ev = caller.event("session_close");
    ev.session_id = Some(id.to_owned());
    let db = db(state, caller, &ev).await?;
    let s = owned(state, caller, &db, id, &ev).await?;
    let closed = db.close_session(&s.session_id, now()).await?;
    // A live session's sandbox is killed (its processes with it): here, or on PostgreSQL by
    // the executor that holds it, told through its lease renewal.
    if let Some(q) = &state.inner.queue {
        q.end_interpreter(&s.session_id).await?;
    }
    let fleet = state.inner.queue.is_some();
    crate::execution::live::close(state, &s.session_id, fleet).await;
    if closed {
        metrics::counter!("agentjail_sessions_total", "event" => "session_close").increment(1);
        state
            .store()
            .audit(Event {
                event: "session_close",
                decision: Some("allow"),
                task: Some(s.task.clone()),
                ..ev
            })
            .await;
    }
    // The session as closed: a cell that got in before the close counts (not the row read
    // before it), and its execution, if not yet registered, sees the close and never starts.
    let s = session_row(&db, &s.session_id).await?;
    if s.cells > 0 {
        let last = store::run_request_id(&s.session_id, s.cells - 1);
        if let Ok(r) = run_of(state, &s.tenant, &last).await
            && !r.status.is_terminal()
        {
            // Its end is recorded by its execution; the close stands whatever it says.
            let _ = super::cancel::cancel(state, caller, &last).await;
            return Ok(session_view(state, &session_row(&db, &s.session_id).await?));
        }
    }
    Ok(session_view(state, &s))
}

/// Most cells on one page.
const MAX_PAGE: u32 = 100;

/// `GET /v1/sessions/{id}/cells?cursor=&limit=`: the cells in order, a page at a time.
pub(crate) async fn list_cells(
    state: &AppState,
    caller: &Caller,
    id: &str,
    cursor: Option<&str>,
    limit: Option<u32>,
) -> Result<CellList, Failure> {
    let mut ev = caller.event("session_read");
    ev.session_id = Some(id.to_owned());
    let db = db(state, caller, &ev).await?;
    let s = owned(state, caller, &db, id, &ev).await?;
    let after = match cursor {
        None => None,
        Some(c) => match c.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                let r = Refusal::Malformed("`cursor` is not a cursor of this listing".into());
                return Err(deny(state, caller, ev, r).await);
            }
        },
    };
    let limit = limit.unwrap_or(50);
    if !(1..=MAX_PAGE).contains(&limit) {
        let r = Refusal::Malformed(format!("`limit` must be 1-{MAX_PAGE}"));
        return Err(deny(state, caller, ev, r).await);
    }
    let rows = db.list_cells(&s.session_id, after, limit + 1).await?;
    let more = rows.len() > limit as usize;
    let mut cells = Vec::new();
    for c in rows.iter().take(limit as usize) {
        let run = run_of(state, &c.tenant, &c.run_request_id).await?;
        cells.push(cell_view(state, c, &run));
    }
    let next_cursor = more
        .then(|| cells.last().map(|c| c.cell.to_string()))
        .flatten();
    Ok(CellList { cells, next_cursor })
}
