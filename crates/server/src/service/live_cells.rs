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
use crate::execution::live::{self, Answer, Slot};
use crate::execution::runner::{self, Admission, Job};
use crate::policy::{self, Caller};
use crate::run_state::RunState;
use crate::storage::db::RunRow;
use crate::storage::sessions::{self as store, CellEnd, SessionRow};
use crate::storage::store::FinishRun;
use crate::util::now;

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
    let s = c.session;
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
            }),
        };
        state.store().insert_run(row).await?;
        let generation = guard.next_generation();
        let idle = std::time::Duration::from_secs(c.settings.idle_seconds);
        match live::start(state, job, admission, idle, c.slot, generation).await {
            Ok(l) => guard.live = Some(l),
            Err(why) => {
                let reason = format!("interpreter: lost; it could not be started: {why}");
                let out = Ended::new(RunState::SetupError, reason);
                return finish(state, s, &c, out).await;
            }
        }
    } else {
        drop(admission);
    }
    let Some(l) = guard.live.as_mut() else {
        return Err(Failure::Internal);
    };
    let t0 = std::time::Instant::now();
    let answer = live::exec(l, &c.code, seconds).await;
    tracing::debug!(session_id = %s.session_id, cell = c.cell, exec_us = t0.elapsed().as_micros() as u64, "live cell executed");
    let out = match answer {
        Answer::Done {
            status,
            stdout,
            stderr,
            truncated,
        } => {
            let cut = if truncated {
                "; its output was cut at 1 MiB a stream"
            } else {
                ""
            };
            let (st, why) = match status.as_str() {
                "ok" => (RunState::Ok, format!("interpreter: {word}{cut}")),
                "interrupted" => (
                    RunState::Timeout,
                    format!(
                        "interpreter: kept; the cell reached its time limit ({seconds} s) and was interrupted (KeyboardInterrupt); its processes were killed{cut}"
                    ),
                ),
                _ => (
                    RunState::ExitNonzero,
                    format!(
                        "interpreter: {word}; the cell raised an exception (its traceback is in stderr){cut}"
                    ),
                ),
            };
            Ended {
                status: st,
                reason: why,
                stdout,
                stderr,
            }
        }
        Answer::Timeout => {
            if let Some(l) = guard.live.take() {
                live::end(l, true).await;
            }
            Ended::new(
                RunState::Timeout,
                format!(
                    "interpreter: lost; the cell did not return within {} s of its interrupt at the time limit ({seconds} s): the sandbox was killed, its state lost; the next cell starts a new one from the last checkpoint",
                    live::GRACE.as_secs()
                ),
            )
        }
        Answer::Lost => {
            let rid = guard.live.as_ref().map(|l| l.request_id.clone());
            if let Some(l) = guard.live.take() {
                // Its run ends by itself (recorded before this reads it).
                live::end(l, false).await;
            }
            // What ended the interpreter's run (its report: the memory limit, a signal …) is
            // this cell's end: it crossed it.
            let run = match rid {
                Some(r) => state
                    .store()
                    .get_run(&caller.tenant, &r)
                    .await
                    .ok()
                    .flatten(),
                None => None,
            };
            let (st, why) = match run {
                Some(r) if r.status == RunState::MemoryLimit => (
                    RunState::MemoryLimit,
                    "the session's memory limit was reached during this cell".to_owned(),
                ),
                Some(r) => (
                    RunState::Signaled,
                    format!(
                        "the interpreter's sandbox ended during this cell ({}{})",
                        r.status.as_str(),
                        r.reason.map(|x| format!(": {x}")).unwrap_or_default()
                    ),
                ),
                None => (RunState::Unknown, "the interpreter was lost".to_owned()),
            };
            Ended::new(
                st,
                format!(
                    "interpreter: lost; {why}; the next cell starts a new one from the last checkpoint"
                ),
            )
        }
    };
    finish(state, s, &c, out).await
}

/// A live cell's end.
struct Ended {
    status: RunState,
    reason: String,
    stdout: String,
    stderr: String,
}

impl Ended {
    fn new(status: RunState, reason: String) -> Ended {
        Ended {
            status,
            reason,
            stdout: String::new(),
            stderr: String::new(),
        }
    }
}

/// Records the cell's run (its streams through the job folder's logs, as a run's).
async fn finish(
    state: &AppState,
    s: &SessionRow,
    c: &LiveCell<'_>,
    out: Ended,
) -> Result<(), Failure> {
    let task = state
        .inner
        .config
        .tasks
        .get(&s.task)
        .ok_or(Failure::Internal)?;
    let dir = runner::job_dir(state, &c.run.job_id);
    let streams = {
        use crate::execution::streams::{job_folder, log_name, record_from_logs};
        // The answer is the interpreter's word, and the cell's code runs in the interpreter:
        // its streams are cut here at a run's bound whatever the driver was made to send.
        let cut = |s: &str| -> Vec<u8> {
            let b = s.as_bytes();
            b[..b.len().min(agentjail_engine::STREAM_LIMIT as usize)].to_vec()
        };
        let written = job_folder(&dir)
            .and_then(|()| std::fs::write(dir.join(log_name(true)), cut(&out.stdout)))
            .and_then(|()| std::fs::write(dir.join(log_name(false)), cut(&out.stderr)));
        if let Err(e) = written {
            tracing::error!(job_id = %c.run.job_id, error = %e, "writing a live cell's logs failed");
        }
        record_from_logs(&dir, task).and_then(|x| serde_json::to_string(&x).ok())
    };
    let f = FinishRun {
        job_id: c.run.job_id.clone(),
        status: out.status,
        reason: Some(out.reason),
        now: now(),
        report: None,
        receipt: None,
        artifact: None,
        artifact_sha256: None,
        streams,
        logs: None,
        denials: None,
    };
    let end = CellEnd {
        session_id: s.session_id.clone(),
        cell: c.cell,
        checkpoint: None,
        receipt_sha256: None,
        checkpoint_path: None,
        bytes: None,
        interpreter: false,
    };
    store::finish_cell(state.store(), f, end).await?;
    Ok(())
}
