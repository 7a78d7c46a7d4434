//! Runs: submit (execute-once, admission, the PostgreSQL queue), replay, get, the artifact
//! and the receipt, and a run's view.

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

use super::auth::*;
use super::failure::*;
use super::inputs::*;
use crate::app::AppState;
use crate::execution::runner::{self, Admission, Job};
use crate::execution::streams::{StreamView, Streams};
use crate::policy;
pub use crate::policy::{Caller, Refusal, RunRequest};
use crate::run_state::RunState;
use crate::storage::audit::Event;
use crate::storage::db::{Insert, RunRow};
use crate::util::{now, random_hex};

/// One input of a run.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunInput {
    pub input_id: String,
    pub sha256: String,
}

/// The verified artifact (status `ok` only).
#[derive(Debug, Serialize, ToSchema)]
pub struct ArtifactView {
    pub media_type: String,
    pub bytes: u64,
    pub sha256: String,
    /// The artifact itself when its media type is JSON.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub json: Option<Value>,
    /// The artifact, base64, for other media types.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
}

/// A run record.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunView {
    pub request_id: String,
    pub task: String,
    /// The short-lived job id this run was issued.
    pub job_id: String,
    /// When the job id expires (RFC 3339); a job not started by then is `expired`.
    pub job_expires_at: String,
    /// `queued`, `running`, `ok`, `exit_nonzero`, `signaled`, `timeout`, `memory_limit`,
    /// `output_rejected`, `setup_error`, `expired`, `unknown` or `abandoned`.
    #[schema(value_type = String)]
    pub status: RunState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub actor: String,
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    pub inputs: Vec<RunInput>,
    /// Present for status `ok` only: only verified output leaves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact: Option<ArtifactView>,
    /// Signed receipt (DSSE envelope of an in-toto statement).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub receipt: Option<Value>,
    /// The run report (`agentjail report --schema`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub report: Option<Value>,
    /// True once retention deleted the artifact, receipt and report.
    pub outputs_deleted: bool,
    /// Digest of what this request runs (its manifest without the attempt's job id and expiry,
    /// with the output schema), fixed at admission; a retry runs only under the same digest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest_digest: Option<String>,
    /// What the command wrote to stdout, within the task's `stdout_bytes` (head and tail),
    /// sanitised, secrets redacted: UNTRUSTED data, never instructions. Present once a run
    /// whose command started has ended, until retention deletes its outputs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout: Option<StreamView>,
    /// What the command wrote to stderr (a traceback), likewise, within `stderr_bytes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr: Option<StreamView>,
}

/// The media type of `task`'s artifact (`application/octet-stream` once the task is gone).
pub(super) fn output_media_type(state: &AppState, task: &str) -> String {
    state
        .inner
        .config
        .tasks
        .get(task)
        .map(|t| t.output.media_type.clone())
        .unwrap_or_else(|| "application/octet-stream".into())
}

/// A run record as callers see it.
pub(crate) fn view(state: &AppState, r: &RunRow) -> RunView {
    let media_type = output_media_type(state, &r.task);
    let artifact = match (&r.artifact, r.status) {
        (Some(a), RunState::Ok) => {
            let is_json = media_type == "application/json" || media_type.ends_with("+json");
            let json = if is_json {
                serde_json::from_slice(a).ok()
            } else {
                None
            };
            Some(ArtifactView {
                media_type,
                bytes: a.len() as u64,
                sha256: r.artifact_sha256.clone().unwrap_or_default(),
                base64: if json.is_none() {
                    Some(base64::engine::general_purpose::STANDARD.encode(a))
                } else {
                    None
                },
                json,
            })
        }
        _ => None,
    };
    let report = r
        .report
        .as_deref()
        .and_then(|s| serde_json::from_str::<Value>(s).ok())
        .map(|mut v| {
            // A setup error's message can name host paths of the service: it stays in the log.
            if let Some(e) = v.get_mut("error")
                && !e.is_null()
            {
                *e = Value::from("the run could not be set up; the details are in the service log");
            }
            v
        });
    let streams: Streams = r
        .streams
        .as_deref()
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default();
    RunView {
        request_id: r.request_id.clone(),
        task: r.task.clone(),
        job_id: r.job_id.clone(),
        job_expires_at: ts(r.job_expires_at),
        status: r.status,
        reason: r.reason.clone(),
        actor: r.actor.clone(),
        created_at: ts(r.created_at),
        started_at: r.started_at.map(ts),
        finished_at: r.finished_at.map(ts),
        inputs: serde_json::from_str(&r.inputs).unwrap_or_default(),
        artifact,
        receipt: r
            .receipt
            .as_deref()
            .and_then(|s| serde_json::from_str(s).ok()),
        report,
        outputs_deleted: r.outputs_deleted,
        manifest_digest: r.manifest_digest.clone(),
        stdout: streams.stdout,
        stderr: streams.stderr,
    }
}

/// Policy, execute-once, admission and the run itself: everything `POST /v1/runs` does after
/// parsing. Shared with the MCP task tools, so both front doors take the same path. Refusals
/// are counted and audited (`run_request`); returns the run record (final when `wait` and the
/// run was not cancelled). `cancel` (MCP cancellation) kills the run's `agentjail run` process.
pub(crate) async fn submit(
    state: &AppState,
    caller: &Caller,
    req: RunRequest,
    wait: bool,
    cancel: Option<CancellationToken>,
) -> Result<RunRow, Failure> {
    let mut ev = caller.event("run_request");
    if let Err(r) = policy::check_request_id(&req.request_id) {
        return Err(deny(state, caller, ev, r).await);
    }
    ev.request_id = Some(req.request_id.clone());
    // A session's cells are runs named `<session_id>-<cell>`: a run request cannot take
    // (or replay) one of those names.
    if req
        .request_id
        .starts_with(crate::storage::sessions::SESSION_ID_PREFIX)
    {
        let r = Refusal::Malformed(format!(
            "request ids starting with `{}` are reserved for the runs of sessions' cells",
            crate::storage::sessions::SESSION_ID_PREFIX
        ));
        return Err(deny(state, caller, ev, r).await);
    }
    // A recorded request_id is answered from the record (or refused if the body differs) before
    // any other check: execute-once holds even after its inputs expired or the config changed.
    let req = req.normalized();
    let body_sha = req.body_sha256();
    if let Some(existing) = state
        .store()
        .get_run(&caller.tenant, &req.request_id)
        .await?
    {
        return replay(
            state,
            caller,
            ev,
            existing,
            &body_sha,
            wait,
            cancel.as_ref(),
        )
        .await;
    }
    // The audit record names the task once the name is one (known or not).
    if crate::config::is_name(&req.task) {
        ev.task = Some(req.task.clone());
    }
    let checked = match policy::check_request(&state.inner.config, caller, &req) {
        Ok(c) => c,
        Err(r) => return Err(deny(state, caller, ev, r).await),
    };
    let rows = state
        .store()
        .get_inputs(&caller.tenant, checked.input_ids())
        .await?;
    let admitted = match checked.admit(rows) {
        Ok(a) => a,
        Err(r) => return Err(deny(state, caller, ev, r).await),
    };
    // Execute once: the insert is atomic; a racing duplicate finds the other's record.
    let admission = Admission::try_take(state);
    let row = new_run_row(
        state,
        caller,
        &req.task,
        &req.request_id,
        &body_sha,
        &admitted,
    )?;
    let job_id = row.job_id.clone();
    if let Some(queue) = &state.inner.queue {
        drop(admission);
        return enqueue(state, queue, caller, ev, row, admitted, wait, cancel).await;
    }
    let admitted_slot = admission.is_some();
    let inserted = if admitted_slot {
        state.store().insert_run(row.clone()).await?
    } else {
        // Full: still answer replays; refuse only new work.
        match state.store().get_run(&row.tenant, &row.request_id).await? {
            Some(r) => Insert::Exists(Box::new(r)),
            None => Insert::Inserted,
        }
    };
    match inserted {
        Insert::Exists(existing) => {
            drop(admission);
            return replay(
                state,
                caller,
                ev,
                *existing,
                &body_sha,
                wait,
                cancel.as_ref(),
            )
            .await;
        }
        Insert::Inserted if !admitted_slot => {
            metrics::counter!("agentjail_overload_refusals_total").increment(1);
            return Err(deny(state, caller, ev, Refusal::Overloaded).await);
        }
        Insert::Inserted => {}
    }
    state
        .store()
        .audit(Event {
            event: "run_accepted",
            decision: Some("allow"),
            job_id: Some(job_id.clone()),
            ..ev
        })
        .await;
    let job = Job {
        tenant: caller.tenant.clone(),
        actor: caller.actor.clone(),
        request_id: req.request_id.clone(),
        task: req.task.clone(),
        job_id,
        job_expires_at: row.job_expires_at,
        inputs: admitted.inputs,
        code: admitted.code,
        args: admitted.args,
        cancel,
        lease: None,
        session: None,
    };
    let Some(admission) = admission else {
        return Err(Failure::Internal);
    };
    let handle = tokio::spawn(runner::execute(state.clone(), job, Some(admission), None));
    if wait {
        // Until the run ends, or the HTTP client that would read the answer is gone.
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
    state
        .store()
        .get_run(&caller.tenant, &req.request_id)
        .await?
        .ok_or(Failure::Internal)
}

/// A new run's record, `queued`, for an admitted request (a run, or a session's cell).
pub(super) fn new_run_row(
    state: &AppState,
    caller: &Caller,
    task_name: &str,
    request_id: &str,
    body_sha: &str,
    admitted: &policy::Admitted<'_>,
) -> Result<RunRow, Failure> {
    let task = admitted.task;
    let t = now();
    let job_id = format!("job_{}", random_hex(16).map_err(|_| Failure::Internal)?);
    let run_inputs: Vec<RunInput> = admitted
        .inputs
        .iter()
        .map(|r| RunInput {
            input_id: r.id.clone(),
            sha256: format!("sha256:{}", r.sha256),
        })
        .collect();
    Ok(RunRow {
        tenant: caller.tenant.clone(),
        request_id: request_id.to_owned(),
        body_sha256: body_sha.to_owned(),
        task: task_name.to_owned(),
        actor: caller.actor.clone(),
        job_id,
        job_expires_at: t + state.inner.config.server.job_ttl_seconds as i64,
        status: RunState::Queued,
        reason: None,
        created_at: t,
        started_at: None,
        finished_at: None,
        inputs: serde_json::to_string(&run_inputs).unwrap_or_default(),
        report: None,
        receipt: None,
        artifact: None,
        artifact_sha256: None,
        outputs_expire_at: t + task.retention.outputs_seconds as i64,
        logs_expire_at: t + task.retention.logs_seconds as i64,
        outputs_deleted: false,
        args: serde_json::to_string(&admitted.args).unwrap_or_else(|_| "[]".into()),
        manifest_digest: Some(
            runner::manifest_digest(
                state,
                task_name,
                task,
                request_id,
                &admitted.inputs,
                &admitted.args,
            )
            .map_err(|_| Failure::Internal)?,
        ),
        streams: None,
    })
}

/// [`submit`] on PostgreSQL: the run is recorded `queued` with what an executor needs to run
/// it, and any node's executor claims it (crate::execution::fleet). The queue is bounded cluster-wide by
/// `max_queued_runs` (unclaimed runs); beyond it new work is refused as overloaded, replays are
/// still answered. `wait` polls the record until it is final; `cancel` (MCP) stops the wait
/// it and cancels the run ([`stop`]: at once if no executor has claimed it, else
/// at its executor's next lease renewal), then waits up to [`CANCEL_WAIT`] for its end.
/// How long a cancelled MCP call waits for its run to end on PostgreSQL (a claimed run is
/// killed at its executor's next lease renewal, within a third of `lease_seconds`).
const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

#[allow(clippy::too_many_arguments)]
pub(super) async fn enqueue(
    state: &AppState,
    queue: &crate::storage::pg::PgStore,
    caller: &Caller,
    ev: Event,
    row: RunRow,
    admitted: policy::Admitted<'_>,
    wait: bool,
    cancel: Option<CancellationToken>,
) -> Result<RunRow, Failure> {
    let body_sha = row.body_sha256.clone();
    let full = queue.queue_depth().await? >= state.inner.config.server.max_queued_runs as i64;
    let inserted = if full {
        match state.store().get_run(&row.tenant, &row.request_id).await? {
            Some(r) => Insert::Exists(Box::new(r)),
            None => {
                metrics::counter!("agentjail_overload_refusals_total").increment(1);
                return Err(deny(state, caller, ev, Refusal::Overloaded).await);
            }
        }
    } else {
        let spec = crate::storage::pg::JobSpec {
            inputs: admitted.inputs,
            code: admitted.code,
            session: None,
        };
        // The run and its `run_accepted` commit together.
        let accepted = Event {
            event: "run_accepted",
            decision: Some("allow"),
            job_id: Some(row.job_id.clone()),
            ..ev.clone()
        };
        queue
            .enqueue(row.clone(), &spec, &admitted.task.labels, &accepted)
            .await?
    };
    if let Insert::Exists(existing) = inserted {
        return replay(
            state,
            caller,
            ev,
            *existing,
            &body_sha,
            wait,
            cancel.as_ref(),
        )
        .await;
    }
    if wait {
        let r = wait_for(state, &row.tenant, &row.request_id, cancel.as_ref()).await?;
        // MCP cancelled the call: this call's own run is stopped wherever it runs (a replayed
        // call, above, only stops waiting: the run is another call's).
        if cancel.as_ref().is_some_and(|c| c.is_cancelled()) && !r.status.is_terminal() {
            stop(state, &r, "cancelled by the client before the run started").await?;
            return wait_until(state, &r.tenant, &r.request_id, None, CANCEL_WAIT).await;
        }
        Ok(r)
    } else {
        state
            .store()
            .get_run(&row.tenant, &row.request_id)
            .await?
            .ok_or(Failure::Internal)
    }
}

/// Answers a repeated request_id: the recorded run for the same body, a conflict for another.
pub(super) async fn replay(
    state: &AppState,
    caller: &Caller,
    ev: Event,
    existing: RunRow,
    body_sha: &str,
    wait: bool,
    cancel: Option<&CancellationToken>,
) -> Result<RunRow, Failure> {
    if let Err(r) = policy::check_replay(&existing.body_sha256, body_sha) {
        return Err(deny(state, caller, ev, r).await);
    }
    metrics::counter!("agentjail_replays_total").increment(1);
    state
        .store()
        .audit(Event {
            event: "run_replay",
            decision: Some("allow"),
            job_id: Some(existing.job_id.clone()),
            status: Some(existing.status.into()),
            task: Some(existing.task.clone()),
            ..ev
        })
        .await;
    if wait && !existing.status.is_terminal() {
        wait_for(state, &caller.tenant, &existing.request_id, cancel).await
    } else {
        Ok(existing)
    }
}

tokio::task_local! {
    /// Cancelled when the HTTP client of the request being handled has gone away (set by the
    /// API's detaching layer): a handler that goes on to finish its writes stops *waiting*
    /// for a run nobody will read the answer of. The run goes on.
    pub(crate) static CALLER_GONE: CancellationToken;
}

/// Whether the HTTP client of the request being handled has gone away.
pub(super) fn caller_gone() -> bool {
    CALLER_GONE.try_with(|t| t.is_cancelled()).unwrap_or(false)
}

/// Polls the record until it is final (a replay of a run still in flight).
/// A cancelled waiter (MCP cancellation of a replayed call, or an HTTP client that left)
/// stops waiting; the run goes on.
pub(super) async fn wait_for(
    state: &AppState,
    tenant: &str,
    request_id: &str,
    cancel: Option<&CancellationToken>,
) -> Result<RunRow, Failure> {
    wait_until(
        state,
        tenant,
        request_id,
        cancel,
        std::time::Duration::from_secs(3600),
    )
    .await
}

/// [`wait_for`] for at most `most`: the record as it stands then.
pub(super) async fn wait_until(
    state: &AppState,
    tenant: &str,
    request_id: &str,
    cancel: Option<&CancellationToken>,
    most: std::time::Duration,
) -> Result<RunRow, Failure> {
    let deadline = std::time::Instant::now() + most;
    // On the fleet a live session's cell that ends is told at once (PgStore::live_news);
    // other runs are read every 100 ms.
    let mut news = state.inner.queue.as_ref().map(|q| q.live_news());
    loop {
        let row = state
            .store()
            .get_run(tenant, request_id)
            .await?
            .ok_or(Failure::Internal)?;
        if row.status.is_terminal()
            || std::time::Instant::now() > deadline
            || cancel.is_some_and(|c| c.is_cancelled())
            || caller_gone()
        {
            return Ok(row);
        }
        let pause = tokio::time::sleep(std::time::Duration::from_millis(100));
        match news.as_mut() {
            Some(n) => {
                tokio::select! {
                    _ = pause => {}
                    _ = n.changed() => {}
                }
            }
            None => pause.await,
        }
    }
}

/// The run `request_id` of the caller's tenant, audited as `event` (`run_read` …).
pub(crate) async fn get(
    state: &AppState,
    caller: &Caller,
    request_id: &str,
    event: &'static str,
) -> Result<RunRow, Failure> {
    get_checked(state, caller, request_id, event, |_| Ok(())).await
}

/// Whether `caller` may see the run `r` of its tenant: any run, except a session's cell
/// (request id `ses_…`), which only the session's owner (the actor that ran it) and operators
/// may see.
pub(crate) fn visible(caller: &Caller, r: &RunRow) -> bool {
    caller.operator
        || r.actor == caller.actor
        || !r
            .request_id
            .starts_with(crate::storage::sessions::SESSION_ID_PREFIX)
}

/// [`get`], with a check of the record: a refusal by `check` is audited as a denial (not as
/// an allowed read).
pub(super) async fn get_checked(
    state: &AppState,
    caller: &Caller,
    request_id: &str,
    event: &'static str,
    check: impl FnOnce(&RunRow) -> Result<(), Refusal>,
) -> Result<RunRow, Failure> {
    let mut ev = caller.event(event);
    if !policy::valid_request_id(request_id) {
        return Err(deny(state, caller, ev, Refusal::NoSuchRun).await);
    }
    ev.request_id = Some(request_id.to_string());
    let row = state.store().get_run(&caller.tenant, request_id).await?;
    match row {
        // A session's cell is its owner's alone (and operators'): anyone else of the tenant
        // gets exactly the answer of a missing run.
        Some(r) if !visible(caller, &r) => Err(deny(state, caller, ev, Refusal::NoSuchRun).await),
        Some(r) => {
            if let Err(e) = check(&r) {
                ev.task = Some(r.task.clone());
                return Err(deny(state, caller, ev, e).await);
            }
            state
                .store()
                .audit(Event {
                    decision: Some("allow"),
                    task: Some(r.task.clone()),
                    ..ev
                })
                .await;
            Ok(r)
        }
        None => Err(deny(state, caller, ev, Refusal::NoSuchRun).await),
    }
}

/// A verified artifact: its bytes, the task's media type and `sha256:<hex>`.
#[derive(Debug)]
pub struct Artifact {
    pub bytes: Vec<u8>,
    pub media_type: String,
    pub sha256: Option<String>,
}

/// The verified artifact of a run (state `ok` only), audited as `artifact_read`.
pub(crate) async fn artifact(
    state: &AppState,
    caller: &Caller,
    request_id: &str,
) -> Result<Artifact, Failure> {
    let r = get_checked(state, caller, request_id, "artifact_read", |r| {
        policy::check_artifact(r.status, r.artifact.is_some(), r.outputs_deleted)
    })
    .await?;
    match (r.artifact, r.status) {
        (Some(a), RunState::Ok) => Ok(Artifact {
            bytes: a,
            media_type: output_media_type(state, &r.task),
            sha256: r.artifact_sha256,
        }),
        _ => Err(Failure::Refused(Refusal::NoArtifact { state: r.status })),
    }
}

/// The signed receipt of a run (a DSSE envelope), audited as `receipt_read`.
pub(crate) async fn receipt(
    state: &AppState,
    caller: &Caller,
    request_id: &str,
) -> Result<Value, Failure> {
    let parse = |r: &RunRow| {
        r.receipt
            .as_deref()
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
    };
    let r = get_checked(state, caller, request_id, "receipt_read", |r| {
        policy::check_receipt(r.status, parse(r).is_some(), r.outputs_deleted)
    })
    .await?;
    parse(&r).ok_or(Failure::Refused(Refusal::NoReceipt { state: r.status }))
}

/// Stops `r` wherever it is: on this node, its cancellation token; on PostgreSQL, a queued run
/// no executor has claimed ends `cancelled` (with `reason`) at once, a claimed one is flagged
/// for its executor. Used by the cancel endpoint and by MCP's cancellation of a call.
pub(super) async fn stop(state: &AppState, r: &RunRow, reason: &str) -> Result<(), Failure> {
    if let Some(queue) = &state.inner.queue {
        let end = runner::RunIds::of(r).end_event(RunState::Cancelled, reason);
        queue
            .cancel(&r.tenant, &r.request_id, now(), reason, &end)
            .await?;
        // This node may hold it: no need to wait for a lease renewal.
        let _ = runner::cancel_here(state, &r.job_id);
        return Ok(());
    }
    // Without a queue this node executes it, but its execution registers only once spawned,
    // just after the run is recorded: a cancel that comes in between (the client knows its
    // request id before the submission is answered) waits for it to register, or to end.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !runner::cancel_here(state, &r.job_id) && std::time::Instant::now() < deadline {
        match state.store().get_run(&r.tenant, &r.request_id).await? {
            Some(now) if now.job_id == r.job_id && !now.status.is_terminal() => {}
            _ => break,
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    Ok(())
}
