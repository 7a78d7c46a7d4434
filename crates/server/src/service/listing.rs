//! Listing runs (`GET /v1/runs`): the caller's tenant's runs, newest first, filtered by status,
//! task and creation time, a page at a time with an opaque cursor; an operator lists every
//! tenant's (or one, `tenant=`). Each listed run is a summary (who, what, how it stands), never
//! its outputs: those are read one run at a time, by its request id.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::deny;
use super::failure::Failure;
use super::inputs::ts;
use crate::app::AppState;
use crate::policy::{Caller, Refusal};
use crate::run_state::RunState;
use crate::storage::db::{RunFilter, RunListRow};

/// Most runs on one page; the default page is [`DEFAULT_PAGE`].
pub const MAX_PAGE: u32 = 100;
pub const DEFAULT_PAGE: u32 = 50;

/// The filters of `GET /v1/runs`.
#[derive(Debug, Default, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only runs with this status.
    #[param(
        pattern = "^(queued|running|ok|exit_nonzero|signaled|timeout|memory_limit|output_rejected|setup_error|expired|unknown|abandoned|cancelled)$"
    )]
    pub status: Option<String>,
    /// Only runs of this task.
    #[param(pattern = "^[a-z0-9_-]{1,64}$")]
    pub task: Option<String>,
    /// Only runs created at or after this time (RFC 3339).
    #[param(format = DateTime)]
    pub created_after: Option<String>,
    /// Only runs created before this time (RFC 3339).
    #[param(format = DateTime)]
    pub created_before: Option<String>,
    /// Runs per page (default 50).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page: a position in the listing's order (any
    /// position is harmless: the tenant filter still applies).
    #[param(pattern = "^[0-9]{1,18}\\.(?:[0-9a-f]{2}){1,64}\\.(?:[0-9a-f]{2}){1,128}$")]
    pub cursor: Option<String>,
    /// Every caller may name its own tenant; only an operator another (default for an
    /// operator: every tenant's runs).
    #[param(pattern = "^[a-z0-9_-]{1,64}$")]
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

/// The cursor of the page after `last`: `CREATED_AT.HEX(tenant).HEX(request_id)`.
fn cursor_of(last: &RunListRow) -> String {
    format!(
        "{}.{}.{}",
        last.created_at.max(0),
        agentjail_manifest::hex(last.tenant.as_bytes()),
        agentjail_manifest::hex(last.request_id.as_bytes())
    )
}

/// A position in the listing's order, from a cursor. Any well-formed position is accepted:
/// it only says where the page starts, and the tenant filter applies whatever it names.
fn parse_cursor(c: &str) -> Result<(i64, String, String), Refusal> {
    let bad_cursor = || bad("`cursor` is not a cursor this service gave");
    let unhex = |h: &str| -> Option<String> {
        if h.is_empty() || !h.len().is_multiple_of(2) {
            return None;
        }
        let bytes: Option<Vec<u8>> = (0..h.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
            .collect();
        Some(String::from_utf8_lossy(&bytes?).into_owned())
    };
    let mut parts = c.splitn(3, '.');
    let (Some(at), Some(t), Some(r)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad_cursor());
    };
    if at.is_empty() || at.len() > 18 || !at.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad_cursor());
    }
    let at = at.parse::<i64>().map_err(|_| bad_cursor())?;
    match (unhex(t), unhex(r)) {
        (Some(t), Some(r)) => Ok((at, t, r)),
        _ => Err(bad_cursor()),
    }
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
    // Names as the configuration has them: 1-64 of a-z 0-9 _ -.
    let name = agentjail_config::is_name;
    if q.task.as_deref().is_some_and(|t| !name(t)) {
        return Err(bad("`task` is not a task name (1-64 of a-z 0-9 _ -)"));
    }
    if q.tenant.as_deref().is_some_and(|t| !name(t)) {
        return Err(bad("`tenant` is not a tenant name (1-64 of a-z 0-9 _ -)"));
    }
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(bad(format!("`limit` must be 1-{MAX_PAGE}")));
    }
    let tenant = match (&q.tenant, caller.operator) {
        (Some(t), false) if *t != caller.tenant => return Err(Refusal::ListOtherTenant),
        (Some(t), _) => Some(t.clone()),
        (None, true) => None,
        (None, false) => Some(caller.tenant.clone()),
    };
    let after = q.cursor.as_deref().map(parse_cursor).transpose()?;
    Ok(RunFilter {
        tenant,
        status,
        task: q.task.clone(),
        created_from: time("created_after", &q.created_after)?,
        created_to: time("created_before", &q.created_before)?,
        after,
        limit,
        request_id: None,
        // Sessions' cells are their owner's (and operators') alone.
        viewer: (!caller.operator).then(|| caller.actor.clone()),
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
