//! Listing runs (`GET /v1/runs`): the caller's tenant's runs, newest first, filtered by status,
//! task and creation time, a page at a time with an opaque cursor; an operator lists every
//! tenant's (or one, `tenant=`). Each listed run is a summary (who, what, how it stands), never
//! its outputs: those are read one run at a time, by its request id.

use base64::Engine;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::deny;
use super::failure::Failure;
use super::inputs::ts;
use crate::app::AppState;
use crate::policy::{Caller, Refusal};
use crate::run_state::RunState;
use crate::storage::store::{RunFilter, RunListRow};

/// Most runs on one page; the default page is [`DEFAULT_PAGE`].
pub const MAX_PAGE: u32 = 100;
pub const DEFAULT_PAGE: u32 = 50;

/// The filters of `GET /v1/runs`.
#[derive(Debug, Default, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only runs with this status (`queued`, `running`, `ok`, `exit_nonzero`, …).
    pub status: Option<String>,
    /// Only runs of this task.
    pub task: Option<String>,
    /// Only runs created at or after this time (RFC 3339).
    pub created_after: Option<String>,
    /// Only runs created before this time (RFC 3339).
    pub created_before: Option<String>,
    /// Runs per page, 1-100 (default 50).
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Operators only: one tenant's runs (default: every tenant's).
    pub tenant: Option<String>,
}

/// A listed run.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunSummary {
    pub request_id: String,
    /// The run's tenant (the caller's, unless an operator listed every tenant's).
    pub tenant: String,
    pub task: String,
    pub actor: String,
    /// As in the run record.
    #[schema(value_type = String)]
    pub status: RunState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

/// One page of runs.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunList {
    pub runs: Vec<RunSummary>,
    /// Pass as `cursor` for the next page; absent on the last one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

fn bad(what: impl Into<String>) -> Refusal {
    Refusal::Malformed(what.into())
}

fn time(field: &str, v: &Option<String>) -> Result<Option<i64>, Refusal> {
    v.as_deref()
        .map(|s| {
            s.parse::<jiff::Timestamp>()
                .map(|t| t.as_second())
                .map_err(|_| bad(format!("`{field}` must be an RFC 3339 time")))
        })
        .transpose()
}

/// The cursor of the page after `last`: base64url of `[created_at, tenant, request_id]`.
fn cursor_of(last: &RunListRow) -> String {
    let v = serde_json::json!([last.created_at, last.tenant, last.request_id]);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
}

fn parse_cursor(c: &str) -> Result<(i64, String, String), Refusal> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(c)
        .map_err(|_| bad("`cursor` is not a cursor this service gave"))?;
    serde_json::from_slice::<(i64, String, String)>(&raw)
        .map_err(|_| bad("`cursor` is not a cursor this service gave"))
}

/// The filter of a query by `caller`, checked.
fn filter(caller: &Caller, q: &ListQuery) -> Result<RunFilter, Refusal> {
    let status = q
        .status
        .as_deref()
        .map(|s| {
            s.parse::<RunState>()
                .map_err(|_| bad("`status` is not a run status"))
        })
        .transpose()?;
    if let Some(t) = &q.task
        && (t.is_empty() || t.len() > 128 || !t.bytes().all(|b| b.is_ascii_graphic()))
    {
        return Err(bad("`task` is not a task name"));
    }
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(bad(format!("`limit` must be 1-{MAX_PAGE}")));
    }
    let tenant = match (&q.tenant, caller.operator) {
        (Some(_), false) => return Err(bad("only an operator may name a `tenant`")),
        (Some(t), true) => Some(t.clone()),
        (None, true) => None,
        (None, false) => Some(caller.tenant.clone()),
    };
    let after = q.cursor.as_deref().map(parse_cursor).transpose()?;
    // A cursor only continues a listing the caller may see.
    if let (Some((_, t, _)), false) = (&after, caller.operator)
        && *t != caller.tenant
    {
        return Err(bad("`cursor` is not a cursor this service gave"));
    }
    Ok(RunFilter {
        tenant,
        status,
        task: q.task.clone(),
        created_from: time("created_after", &q.created_after)?,
        created_to: time("created_before", &q.created_before)?,
        after,
        limit,
    })
}

/// Lists runs for `caller` (audited, `run_list`).
pub(crate) async fn list(
    state: &AppState,
    caller: &Caller,
    q: &ListQuery,
) -> Result<RunList, Failure> {
    let ev = caller.event("run_list");
    let f = match filter(caller, q) {
        Ok(f) => f,
        Err(r) => return Err(deny(state, caller, ev, r).await),
    };
    let limit = f.limit as usize;
    let rows = state.store().list_runs(f).await?;
    let next_cursor = (rows.len() == limit)
        .then(|| rows.last().map(cursor_of))
        .flatten();
    state.store().audit(ev).await;
    Ok(RunList {
        runs: rows
            .into_iter()
            .map(|r| RunSummary {
                request_id: r.request_id,
                tenant: r.tenant,
                task: r.task,
                actor: r.actor,
                status: r.status,
                reason: r.reason,
                created_at: ts(r.created_at),
                started_at: r.started_at.map(ts),
                finished_at: r.finished_at.map(ts),
            })
            .collect(),
        next_cursor,
    })
}
