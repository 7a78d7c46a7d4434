//! Live sessions on the fleet (PostgreSQL; docs/api.md "Live sessions"): a live session's
//! resident interpreter runs on one executor, which holds the session while the
//! interpreter's run is in flight under its lease; the session's cells go there.
//!
//! - A replica reserves a live cell as any session cell (under the session's row lock) and
//!   queues its run marked with its session (`runs.live_cell_of`). While an interpreter of
//!   the session is in flight under an unexpired lease (`runs.interpreter_of`), only its
//!   executor claims the session's cells ([`crate::storage::pg::PgStore::claim_held`], with
//!   no run slot: the interpreter holds one); when none is, any executor with a free slot
//!   may ([`crate::storage::pg::PgStore::claim`]) and starts one.
//! - Starting one records the interpreter's run as claimed by this node under the session's
//!   row lock, only when no other interpreter of the session is in flight under an
//!   unexpired lease ([`crate::storage::pg::PgStore::insert_interpreter`]): never two live
//!   copies of a session. Its `/work` is the session's head as the database says when it
//!   starts (hashed again before anything runs), its run is renewed and fenced as any
//!   claimed run, and a runner whose renewals stop kills its sandbox before the lease ends
//!   (the lifeline), so an executor that is lost or cut off leaves no interpreter behind
//!   when another may start one.
//! - A lost executor: its interpreter's run ends `unknown` when its lease runs out (and its
//!   cell in progress, if any, too); the session's head stays at its last checkpoint and the
//!   next cell, on any executor, starts a new interpreter there (`interpreter: restarted`).
//! - The interpreter's idle end, a drain (SIGTERM) and `DELETE` (read by the lease renewal,
//!   as a run's cancel) end it; the first two checkpoint its workspace as on one node.

use std::time::Instant;

use super::checkpoints::CellJob;
use super::live::{self, Answer, Exec, Live};
use super::live_cell::{CellFacts, Ended, cell_end, ended};
use super::runner::{self, Job, Lease, RunIds};
use crate::app::AppState;
use crate::run_state::RunState;
use crate::storage::audit::Event;
use crate::storage::db::RunRow;
use crate::storage::pg::sessions::Interpreter;
use crate::storage::pg::{JobSpec, PgStore};
use crate::util::{now, random_hex};
use agentjail_engine::lifeline::boottime_ns;

/// A live session's cell this executor claimed: its run, spec and lease.
pub(crate) struct Claimed {
    pub run: RunRow,
    pub spec: JobSpec,
    pub args: Vec<String>,
    pub lease: Lease,
}

/// Executes a claimed live cell in the session's interpreter on this node (starting one when
/// there is none, in `permit`'s run slot or one taken now) and records its end, fenced.
pub(crate) async fn run_cell(
    state: &AppState,
    queue: &PgStore,
    c: Claimed,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
) {
    let who = RunIds::of(&c.run);
    let (Some(cell), Some(task)) = (
        c.spec.session.clone(),
        state.inner.config.tasks.get(&c.run.task).cloned(),
    ) else {
        let why = "the executor that claimed the cell does not know its task type";
        runner::end_claim_as_setup_error(queue, c.lease.fence, who, why).await;
        return;
    };
    let start = Event {
        event: "run_start",
        actor: Some(c.run.actor.clone()),
        tenant: Some(c.run.tenant.clone()),
        task: Some(c.run.task.clone()),
        request_id: Some(c.run.request_id.clone()),
        job_id: Some(c.run.job_id.clone()),
        ..Default::default()
    };
    let lease = &c.lease;
    let slot = state.inner.live.slot(&cell.session_id);
    let mut guard = slot.lock().await;
    if guard.live.as_ref().is_some_and(Live::ended) {
        guard.live = None;
    }
    // A cell claimed as held whose interpreter ended meanwhile (its idle end) needs a run slot
    // for a new one: with none free here, the claim is given back for any executor.
    let permit = match permit {
        Some(p) => Some(p),
        None if guard.live.is_none() => match state.inner.run_slots.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                // No notification: while the session shows as held here no other node may
                // claim it, and this node finds it again at its next poll.
                if let Err(e) = queue.give_back(&c.run.job_id, lease.fence).await {
                    tracing::warn!(job_id = %c.run.job_id, error = %e, "giving back a live cell's claim failed; it ends unknown at its lease's end");
                }
                return;
            }
        },
        None => None,
    };
    match queue
        .mark_running_fenced(
            &c.run.job_id,
            lease.fence,
            now(),
            || lease.deadline(),
            &start,
        )
        .await
    {
        Ok(true) => {}
        Ok(false) | Err(_) => {
            tracing::warn!(job_id = %c.run.job_id, "a live cell's lease was lost before it started; not executed");
            return;
        }
    }
    // A cancel (on any node: read by the cell's lease renewal) reaches it here, until its end
    // is recorded.
    let (cancel, _registered) = runner::register(state, &c.run.job_id);
    state.inner.news.started(&c.run.job_id);
    let seconds = task.limits.seconds;
    let code = c.spec.code.clone().unwrap_or_default();
    let mut facts = CellFacts::now(
        &code,
        cell.previous_receipt_sha256.clone(),
        cell.restore.clone(),
    );
    let mut word = "kept";
    let out = 'out: {
        if guard.live.is_none() {
            word = if cell.cell == 0 {
                "started"
            } else {
                "restarted"
            };
            let generation = guard.next_generation();
            match start_interpreter(state, queue, &c, &cell, &task, permit, &slot, generation).await
            {
                Ok((l, restored)) => {
                    guard.live = Some(l);
                    // What it restored: the head as the database said when it started.
                    facts.session_head = restored;
                }
                Err(why) => {
                    let reason = format!("interpreter: lost; it could not be started: {why}");
                    break 'out Ended::new(RunState::SetupError, reason);
                }
            }
        } else {
            drop(permit);
        }
        let Some(l) = guard.live.as_mut() else {
            break 'out Ended::new(RunState::Unknown, "interpreter: lost".into());
        };
        facts.handed();
        let answer = tokio::select! {
            a = live::exec_cancellable(l, &code, seconds, &cancel) => Some(a),
            _ = lease.lost.cancelled() => None,
        };
        let answer = match answer {
            Some(a) => a,
            None => {
                // The cell's lease is gone (this node is cut off or was too slow): its
                // interpreter goes too; nothing of the cell can be recorded.
                if let Some(l) = guard.live.take() {
                    live::end(l, true).await;
                }
                Answer::Lost
            }
        };
        ended(
            state,
            &c.run.tenant,
            &c.run.task,
            &mut guard,
            answer,
            word,
            seconds,
        )
        .await
    };
    drop(guard);
    let (status, reason) = (out.status, out.reason.clone());
    let Some((f, end)) = cell_end(
        state,
        &c.run.task,
        &c.run.job_id,
        &cell.session_id,
        cell.cell,
        out,
        facts,
    ) else {
        return;
    };
    let ev = who.end_event(status, &reason);
    match queue
        .finish_fenced_cell(f, lease.fence, Some(&ev), Some(&end))
        .await
    {
        // The replica waiting for the cell answers at once.
        Ok(()) => queue.tell_live_news().await,
        Err(crate::storage::store::StoreError::Fenced(fence)) => {
            tracing::error!(job_id = %c.run.job_id, fence, "a live cell's end was refused by fencing (its lease expired or was taken); nothing recorded");
            metrics::counter!("agentjail_fenced_writes_total").increment(1);
        }
        Err(e) => {
            tracing::error!(job_id = %c.run.job_id, error = %e, "recording a live cell's end failed")
        }
    }
}

/// Starts the session's interpreter on this node from the session's head as the database
/// says now (hashed again before anything runs), if no other executor holds the session.
#[allow(clippy::too_many_arguments)]
async fn start_interpreter(
    state: &AppState,
    queue: &PgStore,
    c: &Claimed,
    cell: &CellJob,
    task: &crate::config::Task,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    slot: &std::sync::Arc<tokio::sync::Mutex<live::Slot>>,
    generation: u64,
) -> Result<(Live, Option<String>), String> {
    let permit = permit.ok_or("no run slot")?;
    let sid = &cell.session_id;
    let t = now();
    let rid = format!("{sid}-live-{}", cell.cell);
    let job_id = format!(
        "job_{}",
        random_hex(16).map_err(|_| "no randomness".to_owned())?
    );
    let row = RunRow {
        request_id: rid.clone(),
        body_sha256: crate::config::sha256_hex(rid.as_bytes()),
        job_id: job_id.clone(),
        job_expires_at: t + state.inner.config.server.job_ttl_seconds as i64,
        status: RunState::Queued,
        reason: None,
        created_at: t,
        started_at: None,
        finished_at: None,
        report: None,
        receipt: None,
        artifact: None,
        artifact_sha256: None,
        outputs_deleted: false,
        manifest_digest: None,
        streams: None,
        ..c.run.clone()
    };
    let accepted = Event {
        event: "run_accepted",
        decision: Some("allow"),
        actor: Some(row.actor.clone()),
        tenant: Some(row.tenant.clone()),
        task: Some(row.task.clone()),
        request_id: Some(rid.clone()),
        job_id: Some(job_id.clone()),
        reason: Some(format!("the resident interpreter of session {sid}")),
        ..Default::default()
    };
    let lease = std::time::Duration::from_secs(state.inner.config.server.lease_seconds);
    // The head it starts from: read, restored and hashed here, and still the session's head
    // when the interpreter is recorded (else read again: an interpreter's end moved it).
    let mut tries = 0;
    let (s, fence, job_left, sent) = loop {
        tries += 1;
        let s = queue
            .get_session(sid)
            .await
            .map_err(|e| format!("the session cannot be read: {e}"))?
            .ok_or("the session is gone")?;
        if let Some(head) = s.head_sha256.as_deref() {
            super::checkpoints::materialise(&state.inner.data_dir, queue, head).await?;
        }
        let sent = (Instant::now(), boottime_ns());
        let done = queue
            .insert_interpreter(sid, &row, lease, &accepted, s.head_sha256.as_deref())
            .await
            .map_err(|e| format!("the interpreter's run cannot be recorded: {e}"))?;
        match done {
            Interpreter::Started { fence, job_left } => break (s, fence, job_left, sent),
            Interpreter::HeadMoved if tries < 3 => continue,
            Interpreter::HeadMoved => return Err("the session's head kept moving".into()),
            Interpreter::Held => {
                return Err("another executor holds the session's interpreter".into());
            }
            Interpreter::Closed => return Err("the session was closed".into()),
        }
    };
    let job = Job {
        tenant: row.tenant.clone(),
        actor: row.actor.clone(),
        request_id: rid,
        task: row.task.clone(),
        job_id,
        job_expires_at: now() + job_left,
        inputs: c.spec.inputs.clone(),
        code: Some(live::PYTHON_DRIVER.to_owned()),
        args: c.args.clone(),
        cancel: None,
        lease: None,
        session: Some(CellJob {
            session_id: sid.clone(),
            cell: cell.cell,
            restore: s.head_sha256.clone(),
            previous_receipt_sha256: s.last_receipt_sha256.clone(),
            max_mb: cell.max_mb,
            max_files: cell.max_files,
            interpreter: true,
            live: false,
        }),
    };
    let idle = std::time::Duration::from_secs(task.session.idle_seconds);
    let how = Exec::Leased {
        queue: queue.clone(),
        fence,
        claimed_at: sent,
        permit,
    };
    let who = (row.actor.clone(), row.tenant.clone(), row.task.clone());
    let (request_id, job_id) = (job.request_id.clone(), job.job_id.clone());
    match live::start(state, job, how, idle, slot, generation).await {
        Ok(l) => Ok((l, s.head_sha256)),
        Err(why) => {
            // Its run may not have started (or ended already: then this is refused by the
            // fencing): it does not hold the session until its lease runs out.
            let ids = RunIds {
                actor: &who.0,
                tenant: &who.1,
                task: &who.2,
                request_id: &request_id,
                job_id: &job_id,
            };
            runner::end_claim_as_setup_error(queue, fence, ids, &why).await;
            Err(why)
        }
    }
}

/// Answers a checkpoint ask for a session this node holds (crate::storage::pg::live_checkpoints):
/// between cells (it takes its turn on the session's slot), the supervisor collects `/work`
/// from the interpreter's sandbox, which keeps running; the checkpoint becomes the session's
/// head. Nothing is answered when this node no longer holds the session.
pub(crate) async fn answer_checkpoint(
    state: &AppState,
    queue: &PgStore,
    asked: crate::storage::pg::live_checkpoints::Asked,
) {
    use crate::storage::pg::live_checkpoints::Answer as Reply;
    let Some(slot) = state.inner.live.get(&asked.session_id) else {
        return;
    };
    let Some(set) = state
        .inner
        .config
        .tasks
        .get(&asked.task)
        .map(|t| t.session.clone())
    else {
        return;
    };
    let mut guard = slot.lock().await;
    let reply = match live::checkpoint_now(&mut guard, &set).await {
        None => return,
        Some(Ok(t)) => Reply::Taken {
            sha256: t.sha256,
            bytes: t.bytes,
        },
        Some(Err(why)) => Reply::Refused(why),
    };
    let sid = &asked.session_id;
    let recorded = match queue
        .answer_checkpoint(sid, asked.asked, reply, now())
        .await
    {
        Ok(r) => r,
        Err(e) => {
            // A checkpoint the database cannot take (too large a value, say): the ask is
            // answered with why, not collected again at every poll.
            tracing::error!(session_id = %sid, error = %e, "recording a checkpoint taken on request failed");
            let why = Reply::Refused(format!("the checkpoint could not be stored: {e}"));
            queue
                .answer_checkpoint(sid, asked.asked, why, now())
                .await
                .unwrap_or(false)
        }
    };
    drop(guard);
    if recorded {
        queue.tell_live_news().await;
    } else {
        // This node no longer holds the session (or cannot write): the ask stays for the
        // holder, and this node looks again no sooner than this.
        tracing::warn!(session_id = %sid, "a checkpoint ask was not answered here: this node no longer holds the session or the database refused");
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    }
}
