//! A live session's cell (crate::execution::live): executed in the session's resident
//! interpreter, started by the first cell (or the first after the last one ended) from the
//! session's head checkpoint. The cell is recorded as a run of its own (status, stdout,
//! stderr; the reason names what became of the interpreter: `interpreter: started`, `kept`,
//! `restarted` or `lost`); its workspace is checkpointed when the interpreter's run ends
//! (idle, close, lost), not after each cell, so the cell's `workspace.after` is null.

use super::failure::Failure;
use super::runs::new_run_row;
use crate::app::AppState;
use crate::execution::checkpoints::CellJob;
use crate::execution::live::{self, Slot};
use crate::execution::live_cell::{CellFacts, Ended, cell_end, ended};
use crate::execution::runner::{Admission, Job};
use crate::policy::{self, Caller};
use crate::run_state::RunState;
use crate::storage::db::RunRow;
use crate::storage::sessions::{self as store, SessionRow};

/// Where a live cell starts: the session, the cell's reserved place and run.
pub(super) struct LiveCell<'a> {
    pub session: &'a SessionRow,
    pub settings: &'a crate::config::SessionSettings,
    pub cell: u64,
    pub before: Option<String>,
    pub previous_receipt: Option<String>,
    pub run: RunRow,
    pub code: String,
    /// The session's slot (its lock is held by the caller: `guard`).
    pub slot: &'a std::sync::Arc<tokio::sync::Mutex<Slot>>,
}

/// Executes the cell in the session's live sandbox (starting one when there is none) and
/// records its end. `guard` is the session's slot, locked by the caller for the cell's length.
pub(super) async fn execute(
    state: &AppState,
    caller: &Caller,
    admitted: policy::Admitted<'_>,
    admission: Admission,
    guard: &mut Slot,
    c: LiveCell<'_>,
) -> Result<(), Failure> {
    // `POST /v1/runs/{id}/cancel` of the cell reaches it here (kept until its end is recorded).
    let (cancel, _registered) = crate::execution::runner::register(state, &c.run.job_id);
    let s = c.session;
    let mut facts = CellFacts::now(&c.code, c.previous_receipt.clone(), c.before.clone());
    let seconds = admitted.task.limits.seconds;
    // A sandbox whose run ended (its runner lost) is gone with its state.
    if guard.live.as_ref().is_some_and(live::Live::ended) {
        guard.live = None;
    }
    let mut word = "kept";
    if guard.live.is_none() {
        word = if c.cell == 0 { "started" } else { "restarted" };
        let rid = format!("{}-live-{}", s.session_id, c.cell);
        let body = crate::config::sha256_hex(rid.as_bytes());
        let mut row = new_run_row(state, caller, &s.task, &rid, &body, &admitted)?;
        row.manifest_digest = None;
        let job = Job {
            tenant: caller.tenant.clone(),
            actor: caller.actor.clone(),
            request_id: rid.clone(),
            task: s.task.clone(),
            job_id: row.job_id.clone(),
            job_expires_at: row.job_expires_at,
            inputs: admitted.inputs.clone(),
            code: Some(live::PYTHON_DRIVER.to_owned()),
            args: admitted.args.clone(),
            cancel: None,
            lease: None,
            session: Some(CellJob {
                session_id: s.session_id.clone(),
                cell: c.cell,
                restore: c.before.clone(),
                previous_receipt_sha256: c.previous_receipt.clone(),
                max_mb: c.settings.max_mb,
                max_files: c.settings.max_files,
                interpreter: true,
                live: false,
            }),
        };
        state.store().insert_run(row).await?;
        let generation = guard.next_generation();
        let idle = std::time::Duration::from_secs(c.settings.idle_seconds);
        match live::start(
            state,
            job,
            live::Exec::Local(admission),
            idle,
            c.slot,
            generation,
        )
        .await
        {
            Ok(l) => guard.live = Some(l),
            Err(why) => {
                let reason = format!("interpreter: lost; it could not be started: {why}");
                let out = Ended::new(RunState::SetupError, reason);
                return finish(state, s, &c, out, facts).await;
            }
        }
    } else {
        drop(admission);
    }
    let Some(l) = guard.live.as_mut() else {
        return Err(Failure::Internal);
    };
    let t0 = std::time::Instant::now();
    facts.handed();
    let answer = live::exec_cancellable(l, &c.code, seconds, &cancel).await;
    tracing::debug!(session_id = %s.session_id, cell = c.cell, exec_us = t0.elapsed().as_micros() as u64, "live cell executed");
    let out = ended(state, &caller.tenant, &s.task, guard, answer, word, seconds).await;
    finish(state, s, &c, out, facts).await
}

/// Records the cell's run (its streams through the job folder's logs, as a run's).
async fn finish(
    state: &AppState,
    s: &SessionRow,
    c: &LiveCell<'_>,
    out: Ended,
    facts: CellFacts<'_>,
) -> Result<(), Failure> {
    let (f, end) = cell_end(
        state,
        &s.task,
        &c.run.job_id,
        &s.session_id,
        c.cell,
        out,
        facts,
    )
    .ok_or(Failure::Internal)?;
    store::finish_cell(state.store(), f, end).await?;
    Ok(())
}
