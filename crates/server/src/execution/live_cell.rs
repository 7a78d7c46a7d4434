//! A live cell's end, shared by the node that holds its session on SQLite
//! (crate::service's live cells) and the fleet's executor (crate::execution::live_fleet):
//! what the interpreter's answer comes to, and the cell's recorded end.

use super::live::{self, Answer, Slot};
use super::runner;
use crate::app::AppState;
use crate::run_state::RunState;
use crate::storage::sessions::CellEnd;
use crate::storage::store::FinishRun;
use crate::util::now;

/// What a live cell's `answer` comes to (`word`: what the interpreter did if the cell ran:
/// `started`, `kept` or `restarted`; `seconds`: the cell's limit). A timed-out or lost
/// interpreter is ended and taken from `guard`; what ended a lost one is read from its run.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn ended(
    state: &AppState,
    tenant: &str,
    task_name: &str,
    guard: &mut Slot,
    answer: Answer,
    word: &str,
    seconds: u64,
) -> Ended {
    match answer {
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
        Answer::Cancelled => {
            if let Some(l) = guard.live.take() {
                live::end(l, true).await;
            }
            let task = state.inner.config.tasks.get(task_name);
            let (st, why) = match task {
                Some(t) => runner::cancelled_outcome(t, true),
                None => (RunState::Cancelled, "cancelled while running".to_owned()),
            };
            Ended::new(
                st,
                format!(
                    "interpreter: lost; {why}: the cell's code runs in the interpreter, so its sandbox was killed and its state lost; the next cell starts a new one from the last checkpoint"
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
                Some(r) => state.store().get_run(tenant, &r).await.ok().flatten(),
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
    }
}

/// A live cell's end.
pub(crate) struct Ended {
    pub status: RunState,
    pub reason: String,
    pub stdout: String,
    pub stderr: String,
}

impl Ended {
    pub(crate) fn new(status: RunState, reason: String) -> Ended {
        Ended {
            status,
            reason,
            stdout: String::new(),
            stderr: String::new(),
        }
    }
}

/// A live cell's recorded end (its run's and the cell's): its streams written to its job
/// folder's logs and recorded as a run's. None: the task is gone from the configuration.
pub(crate) fn cell_end(
    state: &AppState,
    task: &str,
    job_id: &str,
    session_id: &str,
    cell: u64,
    out: Ended,
) -> Option<(FinishRun, CellEnd)> {
    let task = state.inner.config.tasks.get(task)?;
    let dir = runner::job_dir(state, job_id);
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
            tracing::error!(%job_id, error = %e, "writing a live cell's logs failed");
        }
        record_from_logs(&dir, task).and_then(|x| serde_json::to_string(&x).ok())
    };
    let f = FinishRun {
        job_id: job_id.to_owned(),
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
        session_id: session_id.to_owned(),
        cell,
        checkpoint: None,
        receipt_sha256: None,
        checkpoint_path: None,
        bytes: None,
        interpreter: false,
    };
    Some((f, end))
}
