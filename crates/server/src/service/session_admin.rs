//! A session's owner's other operations: its cells a page at a time, a checkpoint on request,
//! and its end (`DELETE`).

use super::auth::deny;
use super::failure::Failure;
use super::sessions::{
    CellList, SessionView, cell_view, db, owned, run_of, session_row, session_view, settings,
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

/// `POST /v1/sessions/{id}/checkpoint`: the session's workspace checkpointed now. A session
/// that is not live checkpoints after every cell: its head is already the last one. A live
/// session's interpreter keeps running: between cells (it takes its turn after a cell in
/// progress), the supervisor outside its sandbox collects `/work` with the same refusals and
/// bounds as at its end, and the checkpoint becomes the session's head and the one a fork
/// from its last cell starts from. With no interpreter up, the head is the last checkpoint.
pub(crate) async fn checkpoint(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<SessionView, Failure> {
    let mut ev = caller.event("session_checkpoint");
    ev.session_id = Some(id.to_owned());
    let db = db(state, caller, &ev).await?;
    let s = owned(state, caller, &db, id, &ev).await?;
    ev.task = Some(s.task.clone());
    if s.closed_at.is_some() {
        return Err(deny(state, caller, ev, Refusal::SessionClosed).await);
    }
    if now() >= s.expires_at {
        return Err(deny(state, caller, ev, Refusal::SessionExpired).await);
    }
    let Some(set) = settings(state, &s.task).cloned() else {
        return Err(deny(state, caller, ev, Refusal::TaskGone).await);
    };
    let mut took = None;
    if set.interpreter.is_some() {
        if let Some(q) = &state.inner.queue {
            match fleet_checkpoint(q, &s.session_id).await? {
                Ok(sha) => took = sha,
                Err(r) => return Err(deny(state, caller, ev, r).await),
            }
        } else if let Some(slot) = state.inner.live.get(&s.session_id) {
            let mut guard = slot.lock().await;
            match crate::execution::live::checkpoint_now(&mut guard, &set).await {
                None => {}
                Some(Ok(t)) => match keep_head(state, &s.session_id, &s.tenant, t).await? {
                    Some(sha) => took = Some(sha),
                    None => {
                        let r = Refusal::CheckpointInvalid(
                            "the session changed while its checkpoint was taken (it was closed, or its interpreter ended: its end's checkpoint is the head); nothing was recorded".into(),
                        );
                        return Err(deny(state, caller, ev, r).await);
                    }
                },
                Some(Err(why)) => {
                    return Err(deny(state, caller, ev, Refusal::CheckpointInvalid(why)).await);
                }
            }
        }
    }
    metrics::counter!("agentjail_sessions_total", "event" => "session_checkpoint").increment(1);
    let s = session_row(&db, &s.session_id).await?;
    state
        .store()
        .audit(Event {
            event: "session_checkpoint",
            decision: Some("allow"),
            reason: Some(match took {
                Some(sha) => format!("the live interpreter's /work: {sha}"),
                None => "the session's head is its last checkpoint".into(),
            }),
            ..ev
        })
        .await;
    Ok(session_view(state, &s))
}

/// How long a replica waits for the executor holding a live session to answer its
/// checkpoint ask (the collection's own bound, and some).
const FLEET_CHECKPOINT_WAIT: std::time::Duration = std::time::Duration::from_secs(150);

/// A live session's checkpoint on request on the fleet (crate::storage::pg::live_checkpoints):
/// asked through the session's row and answered by the executor whose interpreter holds it.
/// Ok(Some(digest)) taken; Ok(None) no interpreter holds the session (its head is the last
/// checkpoint); Err the refusal (none could be taken, or no answer in time).
async fn fleet_checkpoint(
    q: &crate::storage::pg::PgStore,
    sid: &str,
) -> Result<Result<Option<String>, Refusal>, Failure> {
    let Some(asked) = q.ask_checkpoint(sid).await? else {
        return Ok(Err(Refusal::SessionClosed));
    };
    q.tell_live_news().await;
    let mut news = q.live_news();
    let deadline = std::time::Instant::now() + FLEET_CHECKPOINT_WAIT;
    loop {
        let (answer, held) = q.checkpoint_answer(sid, asked).await?;
        if let Some(a) = answer {
            let v: serde_json::Value = serde_json::from_str(&a).unwrap_or_default();
            if let Some(sha) = v.get("sha256").and_then(|x| x.as_str()) {
                return Ok(Ok(Some(sha.to_owned())));
            }
            if v.get("none").is_some() {
                // Settled by another request that found no holder: the head stands.
                return Ok(Ok(None));
            }
            let why = v
                .get("error")
                .and_then(|x| x.as_str())
                .unwrap_or("the executor holding the session took no checkpoint");
            return Ok(Err(Refusal::CheckpointInvalid(why.to_owned())));
        }
        if !held {
            q.settle_checkpoint_ask(sid, asked).await?;
            return Ok(Ok(None));
        }
        if std::time::Instant::now() >= deadline {
            // No holder takes it later for nobody.
            q.settle_checkpoint_ask(sid, asked).await?;
            return Ok(Err(Refusal::CheckpointInvalid(format!(
                "the executor holding the session did not answer the checkpoint within {} s",
                FLEET_CHECKPOINT_WAIT.as_secs()
            ))));
        }
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
            _ = news.changed() => {}
        }
    }
}

/// Stores a live sandbox's checkpoint and makes it the session's head (SQLite), while the
/// interpreter's run `run` (tenant, request id) is in flight; None when it was not recorded.
async fn keep_head(
    state: &AppState,
    sid: &str,
    tenant: &str,
    t: crate::execution::live::Taken,
) -> Result<Option<String>, Failure> {
    let crate::execution::live::Taken { sha256, bytes, run } = t;
    let path = crate::execution::checkpoints::keep(&state.inner.data_dir, &sha256, bytes)
        .await
        .ok_or(Failure::Internal)?;
    let db = state.store().sqlite().ok_or(Failure::Internal)?.clone();
    let (id, sha) = (sid.to_owned(), sha256.clone());
    let tenant = tenant.to_owned();
    let set = db
        .call(move |c| store::set_live_head(c, &id, (&tenant, &run), &sha, &path))
        .await
        .map_err(|e| {
            tracing::error!(session_id = %sid, error = %e, "recording a checkpoint taken on request failed");
            Failure::Internal
        })?;
    if !set {
        tracing::warn!(session_id = %sid, "the session was closed or its interpreter ended while its checkpoint was taken; not its head");
        return Ok(None);
    }
    Ok(Some(sha256))
}
