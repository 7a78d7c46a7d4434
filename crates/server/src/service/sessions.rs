//! Sessions (issue #34, stage 1b): a policy-bound sequence of cells sharing a persistent
//! `/work`. A session is opened like a run is requested (`{request_id, task, inputs}`, the
//! same policy checks, execute-once on the tenant's request id) and is owned by its tenant
//! and actor: anyone else gets the same `not-found` as for a missing one. Each cell is a run in
//! its own right (the task's command with the cell's code), started from the session's head
//! checkpoint and collecting the next one (crate::execution::checkpoints); cells run one at a
//! time, once per (session, request id). On SQLite this node runs the cells; on PostgreSQL
//! (crate::storage::session_store) a cell is a run on the fleet's queue, claimed by any
//! executor, which restores the head checkpoint from the database.

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

use super::auth::deny;
use super::failure::Failure;
use super::inputs::ts;
use super::runs::{CALLER_GONE, RunView, new_run_row, view, wait_for, wait_until};
use crate::app::AppState;
use crate::execution::checkpoints::{self, CellJob};
use crate::execution::runner::{self, Admission, Job};
use crate::policy::{self, Caller, Refusal, RunRequest};
use crate::storage::audit::Event;
use crate::storage::db::RunRow;
use crate::storage::session_store::Sessions;
use crate::storage::sessions::{self as store, Begin, CellRow, NewCell, SessionRow};
use crate::util::{now, random_hex};

/// `POST /v1/sessions`: open a session of a code task.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// The caller's idempotency key (as a run's): a retry returns the same session.
    #[schema(
        pattern = r"^(?:[A-Za-z0-9._:-]*[A-Za-z0-9_:-][A-Za-z0-9._:-]*|\.{3,})$",
        min_length = 1,
        max_length = 128
    )]
    pub request_id: String,
    /// Task type name (a task with `code = "allowed"`).
    #[schema(pattern = r"^[a-z0-9_-]{1,64}$")]
    pub task: String,
    /// Input ids from `POST /v1/inputs`, in the task's input order, for every cell.
    #[serde(default)]
    #[schema(default = json!([]))]
    pub inputs: Vec<String>,
}

/// `POST /v1/sessions/{session_id}/cells`: run the next cell.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CellRequest {
    /// Idempotency key of the step within the session: a retry returns the recorded cell and
    /// runs nothing.
    #[schema(
        pattern = r"^(?:[A-Za-z0-9._:-]*[A-Za-z0-9_:-][A-Za-z0-9._:-]*|\.{3,})$",
        min_length = 1,
        max_length = 128
    )]
    pub request_id: String,
    /// The cell's code (the task's `code`).
    pub code: String,
}

/// `POST /v1/sessions/{session_id}/fork`: a new session from a checkpoint of this one.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// The new session's idempotency key (as for `POST /v1/sessions`).
    #[schema(
        pattern = r"^(?:[A-Za-z0-9._:-]*[A-Za-z0-9_:-][A-Za-z0-9._:-]*|\.{3,})$",
        min_length = 1,
        max_length = 128
    )]
    pub request_id: String,
    /// Start from the workspace as this cell (an index) left it; default: the session's head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cell: Option<u64>,
}

/// Where a forked session came from.
#[derive(Debug, Serialize, ToSchema)]
pub struct ForkedFrom {
    pub session_id: String,
    /// The cell whose checkpoint it started from (absent: the head of a session with no cell).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cell: Option<u64>,
}

/// A session.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionView {
    /// Unguessable (128 random bits).
    pub session_id: String,
    pub request_id: String,
    pub task: String,
    pub actor: String,
    /// `open`, `closed` (ended by `DELETE`) or `expired`.
    pub state: String,
    /// Cells run so far.
    pub cells: u64,
    /// Cells the session may run.
    pub max_cells: u64,
    /// The checkpoint the next cell starts from (`sha256:<hex>`); null for an empty `/work`.
    pub workspace_sha256: Option<String>,
    /// The receipt digest of the last cell that has a receipt: the next cell's receipt names it.
    pub last_receipt_sha256: Option<String>,
    /// The input ids every cell gets.
    pub inputs: Vec<String>,
    pub created_at: String,
    pub expires_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub closed_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkedFrom>,
}

/// The workspace a cell started from and the one it left.
#[derive(Debug, Serialize, ToSchema)]
pub struct CellWorkspace {
    /// The checkpoint restored into `/work` (null: empty).
    pub before: Option<String>,
    /// The checkpoint collected after the cell, verified and stored (null: none yet, or none
    /// was kept: the cell crossed the workspace bound, or ended without one; the session's
    /// head then stays at `before`).
    pub after: Option<String>,
}

/// A cell: its run's record (status, stdout, stderr, artifact, receipt, report: a run in its
/// own right, whose `request_id` is `<session_id>-<cell>`) and its place in the session.
#[derive(Debug, Serialize, ToSchema)]
pub struct CellView {
    pub session_id: String,
    /// The cell's index, from 0.
    pub cell: u64,
    /// The cell's own request id (execute-once within the session).
    pub cell_request_id: String,
    pub workspace: CellWorkspace,
    /// A live session's cell (`session.interpreter`): what became of the resident
    /// interpreter: `started` (the session's first), `kept` (its state survived),
    /// `restarted` (a fresh one from the last checkpoint: the earlier one ended idle, was
    /// lost or killed) or `lost` (this cell ended it). Absent for other sessions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interpreter: Option<String>,
    /// The run's record.
    #[serde(flatten)]
    pub run: RunView,
}

/// A page of a session's cells.
#[derive(Debug, Serialize, ToSchema)]
pub struct CellList {
    pub cells: Vec<CellView>,
    /// Pass as `cursor` for the next page; absent on the last one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// The sessions' store (SQLite, or the PostgreSQL store shared by a fleet), or the refusal
/// of a store without sessions.
pub(super) async fn db(state: &AppState, caller: &Caller, ev: &Event) -> Result<Sessions, Failure> {
    match checkpoints::sessions(state) {
        Some(s) => Ok(s),
        None => Err(deny(state, caller, ev.clone(), Refusal::SessionsUnsupported).await),
    }
}

pub(super) fn sha_of(v: &impl Serialize) -> String {
    let bytes = serde_jcs::to_vec(v).unwrap_or_default();
    crate::config::sha256_hex(&bytes)
}

pub(super) fn settings<'a>(
    state: &'a AppState,
    task: &str,
) -> Option<&'a crate::config::SessionSettings> {
    state.inner.config.tasks.get(task).map(|t| &t.session)
}

/// A session as callers see it.
pub(crate) fn session_view(state: &AppState, s: &SessionRow) -> SessionView {
    let state_name = if s.closed_at.is_some() {
        "closed"
    } else if now() >= s.expires_at {
        "expired"
    } else {
        "open"
    };
    SessionView {
        session_id: s.session_id.clone(),
        request_id: s.request_id.clone(),
        task: s.task.clone(),
        actor: s.actor.clone(),
        state: state_name.into(),
        cells: s.cells,
        max_cells: settings(state, &s.task)
            .map_or(0, |t| t.max_cells.saturating_sub(s.cells_before)),
        workspace_sha256: s.head_sha256.clone(),
        last_receipt_sha256: s.last_receipt_sha256.clone(),
        inputs: serde_json::from_str(&s.inputs).unwrap_or_default(),
        created_at: ts(s.created_at),
        expires_at: ts(s.expires_at),
        closed_at: s.closed_at.map(ts),
        forked_from: s.forked_from.clone().map(|id| ForkedFrom {
            session_id: id,
            cell: s.forked_cell,
        }),
    }
}

/// A cell as callers see it.
pub(crate) fn cell_view(state: &AppState, c: &CellRow, run: &RunRow) -> CellView {
    CellView {
        session_id: c.session_id.clone(),
        cell: c.cell,
        cell_request_id: c.request_id.clone(),
        workspace: CellWorkspace {
            before: c.before_sha256.clone(),
            after: c.after_sha256.clone(),
        },
        interpreter: settings(state, &run.task)
            .and_then(|t| t.interpreter)
            .and(run.reason.as_deref())
            .and_then(|r| r.strip_prefix("interpreter: "))
            .map(|r| r.split(';').next().unwrap_or(r).to_owned()),
        run: view(state, run),
    }
}

/// The session `id` if the caller owns it (its tenant and its actor); anything else is the
/// same `not-found` as a missing session.
pub(super) async fn owned(
    state: &AppState,
    caller: &Caller,
    db: &Sessions,
    id: &str,
    ev: &Event,
) -> Result<SessionRow, Failure> {
    let s = db.get_session(id).await?;
    match s {
        Some(s) if s.tenant == caller.tenant && s.actor == caller.actor => Ok(s),
        _ => Err(deny(state, caller, ev.clone(), Refusal::NoSuchSession).await),
    }
}

/// The session `id` as it stands (known to exist).
pub(super) async fn session_row(db: &Sessions, id: &str) -> Result<SessionRow, Failure> {
    db.get_session(id).await?.ok_or(Failure::Internal)
}

/// The record of `tenant`'s run `request_id`.
pub(super) async fn run_of(
    state: &AppState,
    tenant: &str,
    request_id: &str,
) -> Result<RunRow, Failure> {
    state
        .store()
        .get_run(tenant, request_id)
        .await?
        .ok_or(Failure::Internal)
}

/// Opens a session (`created`: false for a retry that found it).
pub(crate) async fn open(
    state: &AppState,
    caller: &Caller,
    req: SessionRequest,
) -> Result<(SessionView, bool), Failure> {
    let mut ev = caller.event("session_open");
    if let Err(r) = policy::check_request_id(&req.request_id) {
        return Err(deny(state, caller, ev, r).await);
    }
    ev.request_id = Some(req.request_id.clone());
    let db = db(state, caller, &ev).await?;
    let body_sha = sha_of(&serde_json::json!({"task": req.task, "inputs": req.inputs}));
    let existing = db
        .session_for_request(&caller.tenant, &req.request_id)
        .await?;
    if let Some(id) = existing {
        return replay_open(state, caller, &db, &id, &body_sha, ev).await;
    }
    if crate::config::is_name(&req.task) {
        ev.task = Some(req.task.clone());
    }
    let settings = match state.inner.config.tasks.get(&req.task) {
        Some(t) if t.code == crate::config::CodePolicy::Allowed && t.session.enabled => {
            t.session.clone()
        }
        Some(_) => return Err(deny(state, caller, ev, Refusal::NotASessionTask).await),
        None => return Err(deny(state, caller, ev, Refusal::UnknownTask).await),
    };
    // The same checks as a run request's (the actor may use the task; the inputs are the
    // tenant's and fit the task), with an empty cell's code.
    admit(
        state,
        caller,
        &ev,
        &req.request_id,
        &req.task,
        &req.inputs,
        String::new(),
    )
    .await?;
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
        task: req.task.clone(),
        inputs: serde_json::to_string(&req.inputs).map_err(|_| Failure::Internal)?,
        created_at: t,
        expires_at: t + settings.lifetime_seconds as i64,
        closed_at: None,
        head_sha256: None,
        last_receipt_sha256: None,
        cells: 0,
        forked_from: None,
        forked_cell: None,
        cells_before: 0,
        keep_checkpoints: settings.keep_checkpoints,
    };
    insert(state, caller, &db, row, &body_sha, ev, None).await
}

/// Records a new session (open or fork) and audits it; a racing duplicate's request id finds
/// the other's session. A fork names the checkpoint it starts from (`start`: its digest, its
/// file on SQLite) and the refusal if it is gone: it is checked where the retention sweep
/// cannot delete it meanwhile (SQLite: under the database's lock; PostgreSQL: its row
/// locked), so a fork never records a head already deleted.
pub(super) async fn insert(
    state: &AppState,
    caller: &Caller,
    db: &Sessions,
    row: SessionRow,
    body_sha: &str,
    ev: Event,
    start: Option<(String, Option<std::path::PathBuf>, Refusal)>,
) -> Result<(SessionView, bool), Failure> {
    // `session_open` or `session_fork`, as the caller's audit record names it.
    let event = ev.event;
    let (start, gone) = match start {
        Some((sha, f, g)) => (Some((sha, f)), Some(g)),
        None => (None, None),
    };
    let existing = db.open_session(row.clone(), start).await?;
    let existing = match (existing, gone) {
        (Ok(e), _) => e,
        (Err(()), Some(g)) => return Err(deny(state, caller, ev, g).await),
        (Err(()), None) => return Err(Failure::Internal),
    };
    if let Some(e) = existing {
        return replay_open(state, caller, db, &e.session_id, body_sha, ev).await;
    }
    metrics::counter!("agentjail_sessions_total", "event" => event).increment(1);
    state
        .store()
        .audit(Event {
            event,
            decision: Some("allow"),
            session_id: Some(row.session_id.clone()),
            task: Some(row.task.clone()),
            ..ev
        })
        .await;
    Ok((session_view(state, &row), true))
}

/// A repeated opening request id: the same session for the same body and owner.
pub(super) async fn replay_open(
    state: &AppState,
    caller: &Caller,
    db: &Sessions,
    id: &str,
    body_sha: &str,
    ev: Event,
) -> Result<(SessionView, bool), Failure> {
    let s = session_row(db, id).await?;
    if s.actor != caller.actor || s.body_sha256 != body_sha {
        return Err(deny(state, caller, ev, Refusal::RequestIdConflict).await);
    }
    Ok((session_view(state, &s), false))
}

/// The run-request checks of a cell (or of an opening, with empty code).
async fn admit<'s>(
    state: &'s AppState,
    caller: &Caller,
    ev: &Event,
    request_id: &str,
    task: &str,
    inputs: &[String],
    code: String,
) -> Result<policy::Admitted<'s>, Failure> {
    let req = RunRequest {
        request_id: request_id.to_owned(),
        task: task.to_owned(),
        inputs: inputs.to_vec(),
        code: Some(code),
        args: None,
    };
    let checked = match policy::check_request(&state.inner.config, caller, &req) {
        Ok(c) => c,
        Err(r) => return Err(deny(state, caller, ev.clone(), r).await),
    };
    let rows = state
        .store()
        .get_inputs(&caller.tenant, checked.input_ids())
        .await?;
    match checked.admit(rows) {
        Ok(a) => Ok(a),
        Err(r) => Err(deny(state, caller, ev.clone(), r).await),
    }
}

/// `GET /v1/sessions/{id}`.
pub(crate) async fn get(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<SessionView, Failure> {
    let ev = caller.event("session_read");
    let db = db(state, caller, &ev).await?;
    let s = owned(state, caller, &db, id, &ev).await?;
    Ok(session_view(state, &s))
}

/// Runs the session's next cell (or answers the recorded one for a known request id).
/// `cancel`, when given (an MCP call's), cancels the cell's run when it fires and ends the
/// wait; without it, an HTTP client's departure ([`CALLER_GONE`]) ends only the wait.
pub(crate) async fn cell(
    state: &AppState,
    caller: &Caller,
    id: &str,
    req: CellRequest,
    wait: bool,
    cancel: Option<CancellationToken>,
) -> Result<CellView, Failure> {
    loop {
        let once = cell_once(state, caller, id, req.clone(), wait, cancel.clone()).await?;
        if let Some(v) = once {
            return Ok(v);
        }
    }
}

/// [`cell`] once; None: a live session's cell on the fleet waited for the turn of the one in
/// progress, and asks again.
async fn cell_once(
    state: &AppState,
    caller: &Caller,
    id: &str,
    req: CellRequest,
    wait: bool,
    cancel: Option<CancellationToken>,
) -> Result<Option<CellView>, Failure> {
    let mut ev = caller.event("session_cell");
    ev.session_id = Some(id.to_owned());
    let db = db(state, caller, &ev).await?;
    let s = owned(state, caller, &db, id, &ev).await?;
    ev.task = Some(s.task.clone());
    if let Err(r) = policy::check_request_id(&req.request_id) {
        return Err(deny(state, caller, ev, r).await);
    }
    ev.request_id = Some(req.request_id.clone());
    let body_sha = sha_of(&serde_json::json!({"code": req.code}));
    let known = db
        .get_cell_by_request(&s.session_id, &req.request_id)
        .await?;
    if let Some(c) = known {
        return replay_cell(state, caller, c, &body_sha, ev, wait, cancel.as_ref())
            .await
            .map(Some);
    }
    if s.closed_at.is_some() {
        return Err(deny(state, caller, ev, Refusal::SessionClosed).await);
    }
    if now() >= s.expires_at {
        return Err(deny(state, caller, ev, Refusal::SessionExpired).await);
    }
    let Some(settings) = settings(state, &s.task).cloned() else {
        return Err(deny(state, caller, ev, Refusal::TaskGone).await);
    };
    let inputs: Vec<String> = serde_json::from_str(&s.inputs).unwrap_or_default();
    let run_id = store::run_request_id(&s.session_id, s.cells);
    let admitted = admit(
        state,
        caller,
        &ev,
        &run_id,
        &s.task,
        &inputs,
        req.code.clone(),
    )
    .await?;
    // The checkpoint the cell would restore must still be the one its name says: a tampered
    // or lost one is refused here, before anything runs (and the runner checks it again).
    if let Some(head) = s.head_sha256.as_deref()
        && let Err(why) = checkpoints::verify(state, head).await?
    {
        return Err(deny(state, caller, ev, Refusal::CheckpointInvalid(why)).await);
    }
    // On PostgreSQL the cell goes on the fleet's queue (bounded as runs are); on SQLite this
    // node runs it in one of its slots.
    let admission = match &state.inner.queue {
        Some(q) => {
            if q.queue_depth().await? >= state.inner.config.server.max_queued_runs as i64 {
                metrics::counter!("agentjail_overload_refusals_total").increment(1);
                return Err(deny(state, caller, ev, Refusal::Overloaded).await);
            }
            None
        }
        None => match Admission::try_take(state) {
            Some(a) => Some(a),
            None => {
                metrics::counter!("agentjail_overload_refusals_total").increment(1);
                return Err(deny(state, caller, ev, Refusal::Overloaded).await);
            }
        },
    };
    // A live session's cells, its idle end and its close take turns on its slot: on this
    // node, or on PostgreSQL on the executor that holds the session
    // (crate::execution::live_fleet).
    let fleet_live = settings.interpreter.is_some() && state.inner.queue.is_some();
    let live_slot = settings.interpreter.filter(|_| !fleet_live).map(|_| {
        state.inner.live.prune();
        state.inner.live.slot(&s.session_id)
    });
    let mut live_guard = match &live_slot {
        Some(sl) => Some(sl.clone().lock_owned().await),
        None => None,
    };
    let run = new_run_row(state, caller, &s.task, &run_id, &body_sha, &admitted)?;
    let cell_job = |cell: u64, restore: Option<String>, previous: Option<String>| CellJob {
        session_id: s.session_id.clone(),
        cell,
        restore,
        previous_receipt_sha256: previous,
        max_mb: settings.max_mb,
        max_files: settings.max_files,
        interpreter: false,
        live: fleet_live,
    };
    // The executor that claims the cell on PostgreSQL gets its place in the session from the
    // queued run's spec: the cell it reserves is `s.cells` from `s`'s head (or none at all).
    let spec = crate::storage::pg::JobSpec {
        inputs: admitted.inputs.clone(),
        code: admitted.code.clone(),
        session: Some(cell_job(
            s.cells,
            s.head_sha256.clone(),
            s.last_receipt_sha256.clone(),
        )),
    };
    let accepted = Event {
        event: "run_accepted",
        decision: Some("allow"),
        job_id: Some(run.job_id.clone()),
        request_id: Some(run_id.clone()),
        ..ev.clone()
    };
    let queued = state
        .inner
        .queue
        .as_ref()
        .map(|_| crate::storage::pg::sessions::QueuedCell {
            spec,
            labels: &admitted.task.labels,
            accepted: &accepted,
        });
    let n = NewCell {
        session_id: s.session_id.clone(),
        request_id: req.request_id.clone(),
        body_sha256: body_sha.clone(),
        max_cells: settings.max_cells.saturating_sub(s.cells_before),
        expected_cell: s.cells,
        now: now(),
        run,
    };
    let begun = db.begin_cell(n, queued).await?;
    let (cell, before, previous_receipt, run) = match begun {
        (
            Begin::Reserved {
                cell,
                before,
                previous_receipt,
            },
            Some(run),
        ) => (cell, before, previous_receipt, run),
        (Begin::Exists(c), _) => {
            drop(admission);
            return replay_cell(state, caller, *c, &body_sha, ev, wait, cancel.as_ref())
                .await
                .map(Some);
        }
        (Begin::Busy, _) if fleet_live => {
            // Cells of a live session take turns: this one waits for the one in progress,
            // then asks again (a concurrent request may have taken the next turn).
            drop(admission);
            drop(live_guard);
            if wait_turn(state, &db, &s.session_id, cancel.as_ref()).await? {
                return Ok(None);
            }
            let r = Refusal::CellInProgress {
                cell: s.cells.saturating_sub(1),
            };
            return Err(deny(state, caller, ev, r).await);
        }
        (b, _) => {
            let r = match b {
                Begin::Busy => Refusal::CellInProgress {
                    cell: s.cells.saturating_sub(1),
                },
                Begin::Closed => Refusal::SessionClosed,
                Begin::Expired => Refusal::SessionExpired,
                Begin::Full => Refusal::SessionFull {
                    max: settings.max_cells.saturating_sub(s.cells_before),
                },
                _ => Refusal::NoSuchSession,
            };
            return Err(deny(state, caller, ev, r).await);
        }
    };
    metrics::counter!("agentjail_session_cells_total").increment(1);
    state
        .store()
        .audit(Event {
            event: "session_cell",
            decision: Some("allow"),
            job_id: Some(run.job_id.clone()),
            reason: Some(format!("cell {cell}")),
            ..ev
        })
        .await;
    let Some(admission) = admission else {
        // PostgreSQL: an executor of the fleet claims the cell's run; a live session's holder
        // hears of it at once.
        if fleet_live && let Some(q) = &state.inner.queue {
            q.tell_live_news().await;
        }
        if wait {
            let r = wait_for(state, &caller.tenant, &run.request_id, cancel.as_ref()).await?;
            if cancel.as_ref().is_some_and(|c| c.is_cancelled()) && !r.status.is_terminal() {
                let _ = super::cancel::cancel(state, caller, &run.request_id).await;
            }
        }
        return cell_record(state, &db, &s.session_id, cell, &caller.tenant)
            .await
            .map(Some);
    };
    if let (Some(slot), Some(guard)) = (&live_slot, live_guard.as_mut()) {
        let c = super::live_cells::LiveCell {
            session: &s,
            settings: &settings,
            cell,
            before,
            previous_receipt,
            run,
            code: req.code,
            slot,
        };
        super::live_cells::execute(state, caller, admitted, admission, guard, c).await?;
        return cell_record(state, &db, &s.session_id, cell, &caller.tenant)
            .await
            .map(Some);
    }
    let job = Job {
        tenant: caller.tenant.clone(),
        actor: caller.actor.clone(),
        request_id: run.request_id.clone(),
        task: s.task.clone(),
        job_id: run.job_id.clone(),
        job_expires_at: run.job_expires_at,
        inputs: admitted.inputs,
        code: admitted.code,
        args: admitted.args,
        cancel,
        lease: None,
        session: Some(cell_job(cell, before, previous_receipt)),
    };
    let handle = tokio::spawn(runner::execute(state.clone(), job, Some(admission), None));
    if wait {
        match CALLER_GONE.try_with(CancellationToken::clone) {
            Ok(gone) => {
                tokio::select! {
                    _ = handle => {}
                    _ = gone.cancelled() => {}
                }
            }
            Err(_) => {
                let _ = handle.await;
            }
        }
    }
    cell_record(state, &db, &s.session_id, cell, &caller.tenant)
        .await
        .map(Some)
}

/// Waits until the last cell of session `sid` has ended (its turn is over): true; false when
/// it did not end within [`TURN_WAIT`], or the wait was cancelled (`cancel`, or the HTTP
/// caller left).
async fn wait_turn(
    state: &AppState,
    db: &Sessions,
    sid: &str,
    cancel: Option<&CancellationToken>,
) -> Result<bool, Failure> {
    let s = session_row(db, sid).await?;
    if s.cells == 0 {
        return Ok(true);
    }
    let last = store::run_request_id(sid, s.cells - 1);
    let r = wait_until(state, &s.tenant, &last, cancel, TURN_WAIT).await?;
    Ok(r.status.is_terminal())
}

/// The longest a live session's cell waits for the one in progress before `409
/// cell-in-progress`.
const TURN_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// The cell `cell` of session `sid` with its run's record.
async fn cell_record(
    state: &AppState,
    db: &Sessions,
    sid: &str,
    cell: u64,
    tenant: &str,
) -> Result<CellView, Failure> {
    let c = db.get_cell(sid, cell).await?.ok_or(Failure::Internal)?;
    let run = run_of(state, tenant, &c.run_request_id).await?;
    Ok(cell_view(state, &c, &run))
}

/// A repeated cell request id: the recorded cell for the same code, a conflict for another.
async fn replay_cell(
    state: &AppState,
    caller: &Caller,
    c: CellRow,
    body_sha: &str,
    ev: Event,
    wait: bool,
    cancel: Option<&CancellationToken>,
) -> Result<CellView, Failure> {
    if let Err(r) = policy::check_replay(&c.body_sha256, body_sha) {
        return Err(deny(state, caller, ev, r).await);
    }
    metrics::counter!("agentjail_replays_total").increment(1);
    state
        .store()
        .audit(Event {
            event: "session_cell_replay",
            decision: Some("allow"),
            reason: Some(format!("cell {}", c.cell)),
            ..ev
        })
        .await;
    let run = run_of(state, &c.tenant, &c.run_request_id).await?;
    let run = if wait && !run.status.is_terminal() {
        wait_for(state, &c.tenant, &c.run_request_id, cancel).await?
    } else {
        run
    };
    Ok(cell_view(state, &c, &run))
}
