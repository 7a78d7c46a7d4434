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
    word: &'static str,
    seconds: u64,
) -> Ended {
    let run = guard.live.as_ref().map(|l| l.request_id.clone());
    let mut e = ended_as(state, tenant, task_name, guard, answer, word, seconds).await;
    e.interpreter_run = run;
    e
}

async fn ended_as(
    state: &AppState,
    tenant: &str,
    task_name: &str,
    guard: &mut Slot,
    answer: Answer,
    word: &'static str,
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
            let interpreter = if status == "interrupted" {
                "kept"
            } else {
                word
            };
            Ended {
                status: st,
                reason: why,
                stdout,
                stderr,
                interpreter,
                interpreter_run: None,
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
    /// What became of the interpreter: `started`, `kept`, `restarted` or `lost`.
    pub interpreter: &'static str,
    /// The interpreter run's request id, when there was one.
    pub interpreter_run: Option<String>,
}

impl Ended {
    /// A cell whose interpreter is gone (`lost`).
    pub(crate) fn new(status: RunState, reason: String) -> Ended {
        Ended {
            status,
            reason,
            stdout: String::new(),
            stderr: String::new(),
            interpreter: "lost",
            interpreter_run: None,
        }
    }
}

/// What a live cell's receipt names besides its end: its code, its place in the session's
/// chain and when it was handed to the interpreter.
pub(crate) struct CellFacts<'a> {
    pub code: &'a str,
    pub previous_receipt: Option<String>,
    /// The session's head when the cell was reserved.
    pub session_head: Option<String>,
    /// RFC 3339, UTC.
    pub started_at: String,
    pub t0: std::time::Instant,
}

impl CellFacts<'_> {
    /// The facts of a cell starting now.
    pub(crate) fn now(
        code: &str,
        previous_receipt: Option<String>,
        session_head: Option<String>,
    ) -> CellFacts<'_> {
        CellFacts {
            code,
            previous_receipt,
            session_head,
            started_at: jiff::Timestamp::now().to_string(),
            t0: std::time::Instant::now(),
        }
    }

    /// The cell is handed to the interpreter now (after its start, if it started for it).
    pub(crate) fn handed(&mut self) {
        self.started_at = jiff::Timestamp::now().to_string();
        self.t0 = std::time::Instant::now();
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
    facts: CellFacts<'_>,
) -> Option<(FinishRun, CellEnd)> {
    let task = state.inner.config.tasks.get(task)?;
    let dir = runner::job_dir(state, job_id);
    // The answer is the interpreter's word, and the cell's code runs in the interpreter: its
    // streams are cut here at a run's bound whatever the driver was made to send.
    let cut = |s: &str| -> Vec<u8> {
        let b = s.as_bytes();
        b[..b.len().min(agentjail_engine::STREAM_LIMIT as usize)].to_vec()
    };
    let (stdout, stderr) = (cut(&out.stdout), cut(&out.stderr));
    // Each stream's count and digest, once: for its record and for the receipt.
    let report = |b: &[u8]| agentjail_manifest::report::StreamReport {
        bytes: b.len() as u64,
        truncated: b.len() as u64 >= agentjail_engine::STREAM_LIMIT,
        sha256: Some(format!("sha256:{}", crate::config::sha256_hex(b))),
    };
    let reports = (report(&stdout), report(&stderr));
    let streams = {
        use crate::execution::streams::{job_folder, log_name, record};
        let written = job_folder(&dir)
            .and_then(|()| std::fs::write(dir.join(log_name(true)), &stdout))
            .and_then(|()| std::fs::write(dir.join(log_name(false)), &stderr));
        match written {
            Ok(()) => serde_json::to_string(&record(&dir, task, &reports.0, &reports.1)).ok(),
            Err(e) => {
                tracing::error!(%job_id, error = %e, "writing a live cell's logs failed");
                None
            }
        }
    };
    let receipt = sign(state, session_id, cell, &out, &facts, reports);
    let receipt_sha256 = receipt
        .as_deref()
        .and_then(super::checkpoints::receipt_digest);
    let f = FinishRun {
        job_id: job_id.to_owned(),
        status: out.status,
        reason: Some(out.reason),
        now: now(),
        report: None,
        receipt,
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
        receipt_sha256,
        checkpoint_path: None,
        bytes: None,
        interpreter: false,
    };
    Some((f, end))
}

/// The cell's receipt (crate::receipt's live-cell predicate), signed with this node's key;
/// None (logged) when it cannot be made.
fn sign(
    state: &AppState,
    session_id: &str,
    cell: u64,
    out: &Ended,
    facts: &CellFacts<'_>,
    (stdout, stderr): (
        agentjail_manifest::report::StreamReport,
        agentjail_manifest::report::StreamReport,
    ),
) -> Option<String> {
    use agentjail_verify::receipt::{LiveCellInterpreter, LiveCellPredicate, sign_live_cell};
    let predicate = LiveCellPredicate {
        agentjail_version: env!("CARGO_PKG_VERSION").into(),
        request_id: crate::storage::sessions::run_request_id(session_id, cell),
        session: agentjail_manifest::session::Session {
            id: session_id.to_owned(),
            cell,
            previous_receipt_sha256: facts.previous_receipt.clone(),
        },
        interpreter: LiveCellInterpreter {
            request_id: out.interpreter_run.clone(),
            state: out.interpreter.to_owned(),
        },
        status: out.status.as_str().to_owned(),
        started_at: facts.started_at.clone(),
        wall_ms: facts.t0.elapsed().as_millis() as u64,
        stdout,
        stderr,
        session_head: facts.session_head.clone(),
    };
    let code = crate::config::sha256_hex(facts.code.as_bytes());
    match sign_live_cell(&state.inner.receipt_key, &code, predicate) {
        Ok(env) => Some(env.to_json()),
        Err(e) => {
            tracing::error!(%session_id, cell, error = %e, "signing a live cell's receipt failed; it is recorded without one");
            None
        }
    }
}
