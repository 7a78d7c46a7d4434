//! Reconcile: what the operator decides for a run whose outcome is `unknown` (retry or
//! abandon).

use serde::Deserialize;
use utoipa::ToSchema;

use super::auth::*;
use super::failure::*;
use super::runs::*;
use crate::app::AppState;
use crate::execution::runner::{self, Admission, Job};
use crate::policy;
pub use crate::policy::{Caller, Refusal};
use crate::run_state::RunState;
use crate::storage::audit::Event;
use crate::storage::db::RunRow;
use crate::util::{now, random_hex};

/// Reconcile decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReconcileAction {
    Retry,
    Abandon,
}

/// An operator's decision on an `unknown` run: abandon it, or retry it (network-free tasks
/// with a fixed program only) and wait for its end. Returns the record afterwards.
/// The answer to a reconcile that found the run no longer `unknown` when it came to change it:
/// a concurrent reconcile decided first. The refusal names what that one did (read from the
/// run now) and is audited (`reconcile`, `deny`).
pub(super) async fn lost_reconcile(state: &AppState, caller: &Caller, request_id: &str) -> Failure {
    let mut ev = caller.event("reconcile");
    ev.request_id = Some(request_id.to_string());
    let decision = match state.store().get_run(&caller.tenant, request_id).await {
        Ok(Some(r)) => {
            ev.task = Some(r.task.clone());
            match r.status {
                RunState::Abandoned => "abandoned it".to_string(),
                s => format!("retried it as job {} (now `{s}`)", r.job_id),
            }
        }
        _ => "changed it".to_string(),
    };
    deny(state, caller, ev, Refusal::ReconcileLost { decision }).await
}

pub(crate) async fn reconcile(
    state: &AppState,
    caller: &Caller,
    request_id: &str,
    action: ReconcileAction,
) -> Result<RunRow, Failure> {
    let mut ev = caller.event("reconcile");
    let r = get(state, caller, request_id, "run_read").await?;
    ev.request_id = Some(r.request_id.clone());
    ev.task = Some(r.task.clone());
    if let Err(e) = policy::check_reconcile(caller, r.status) {
        return Err(deny(state, caller, ev, e).await);
    }
    let task = state.inner.config.tasks.get(&r.task).cloned();
    let (tenant, rid) = (caller.tenant.as_str(), r.request_id.as_str());
    if action == ReconcileAction::Abandon {
        // The change and its record land together (see `Store::reconcile`).
        let record = Event {
            decision: Some("allow"),
            reason: Some("abandon".into()),
            status: Some(RunState::Abandoned.into()),
            ..ev
        };
        if !state
            .store()
            .reconcile(tenant, rid, None, now(), record)
            .await?
        {
            return Err(lost_reconcile(state, caller, request_id).await);
        }
    } else {
        let task = match policy::check_retry(task.as_ref()) {
            Ok(t) => t,
            Err(e) => return Err(deny(state, caller, ev, e).await),
        };
        let inputs: Vec<RunInput> = serde_json::from_str(&r.inputs).unwrap_or_default();
        let ids: Vec<String> = inputs.iter().map(|i| i.input_id.clone()).collect();
        let rows = state.store().get_inputs(tenant, &ids).await?;
        let rows = match policy::check_retry_inputs(rows) {
            Ok(rows) => rows,
            Err(e) => return Err(deny(state, caller, ev, e).await),
        };
        // The same request again: its `args` as recorded (the rest comes from the task type).
        let Ok(args) = serde_json::from_str::<Vec<String>>(&r.args) else {
            return Err(Failure::Internal);
        };
        if let Err(e) = policy::check_retry_code(task) {
            return Err(deny(state, caller, ev, e).await);
        }
        // The same run, or none: the manifest rebuilt now must be the first attempt's.
        let rebuilt = runner::manifest_digest(state, &r.task, task, &r.request_id, &rows, &args)
            .map_err(|_| Failure::Internal)?;
        if let Err(e) = policy::check_retry_digest(&r.task, r.manifest_digest.as_deref(), &rebuilt)
        {
            return Err(deny(state, caller, ev, e).await);
        }
        let job_id = format!("job_{}", random_hex(16).map_err(|_| Failure::Internal)?);
        let expires = now() + state.inner.config.server.job_ttl_seconds as i64;
        let record = |ev: Event| Event {
            decision: Some("allow"),
            reason: Some("retry".into()),
            job_id: Some(job_id.clone()),
            ..ev
        };
        if let Some(queue) = &state.inner.queue {
            // On PostgreSQL the retry goes back on the queue (any executor claims it), its
            // record in the same transaction.
            let spec = crate::storage::pg::JobSpec {
                inputs: rows,
                code: None,
                session: None,
            };
            if !queue
                .requeue(tenant, rid, (job_id.clone(), expires), &spec, &record(ev))
                .await?
            {
                return Err(lost_reconcile(state, caller, request_id).await);
            }
            return state
                .store()
                .get_run(&caller.tenant, &r.request_id)
                .await?
                .ok_or(Failure::Internal);
        }
        let Some(admission) = Admission::try_take(state) else {
            return Err(deny(state, caller, ev, Refusal::Overloaded).await);
        };
        let ok = state
            .store()
            .reconcile(
                tenant,
                rid,
                Some((job_id.clone(), expires)),
                now(),
                record(ev),
            )
            .await?;
        if !ok {
            drop(admission);
            return Err(lost_reconcile(state, caller, request_id).await);
        }
        {
            let job = Job {
                tenant: caller.tenant.clone(),
                actor: r.actor.clone(),
                request_id: r.request_id.clone(),
                task: r.task.clone(),
                job_id,
                job_expires_at: expires,
                inputs: rows,
                code: None,
                args,
                cancel: None,
                lease: None,
                session: None,
            };
            let _ = tokio::spawn(runner::execute(state.clone(), job, Some(admission), None)).await;
        }
    }
    state
        .store()
        .get_run(&caller.tenant, &r.request_id)
        .await?
        .ok_or(Failure::Internal)
}
