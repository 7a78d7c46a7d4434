//! The sessions' routes (docs/api.md, "Sessions"), each with its `#[utoipa::path]` contract,
//! mounted by the API's router (`super::api`) with the runs' routes. The logic is in
//! `crate::service::sessions`.

use axum::Extension;
use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::problem::{ApiError, Problem, one_line};
use crate::app::AppState;
use crate::service::{
    self, Caller, CellList, CellRequest, CellView, ForkRequest, Refusal, SessionRequest,
    SessionView, deny,
};
use crate::storage::audit::Event;

/// The routes of this module.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(open_session))
        .routes(routes!(get_session, close_session))
        .routes(routes!(run_cell, list_cells))
        .routes(routes!(fork_session))
        .routes(routes!(checkpoint_session))
}

/// A JSON body, or its refusal (audited) as for `POST /v1/runs`.
async fn body<T>(
    state: &AppState,
    caller: &Caller,
    ev: Event,
    body: Result<Json<T>, JsonRejection>,
) -> Result<T, ApiError> {
    match body {
        Ok(Json(b)) => Ok(b),
        Err(rej) => {
            let r = match &rej {
                JsonRejection::MissingJsonContentType(_) => Refusal::NotJson,
                JsonRejection::BytesRejection(b) if b.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                    Refusal::RequestTooLarge {
                        max: state.inner.config.server.max_request_bytes,
                    }
                }
                JsonRejection::JsonDataError(d) => Refusal::Malformed(one_line(&d.body_text())),
                _ => Refusal::Malformed("the body is not the JSON this operation takes".into()),
            };
            Err(deny(state, caller, ev, r).await.into())
        }
    }
}

fn session_response(v: SessionView, created: bool) -> Response {
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let loc = format!("/v1/sessions/{}", v.session_id);
    let mut r = (code, Json(v)).into_response();
    if let Ok(v) = HeaderValue::from_str(&loc) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// Opens a session of a code task: `{request_id, task, inputs}`, checked as a run request is.
/// Once per (tenant, request_id): a retry returns the same session (200).
#[utoipa::path(
    post,
    path = "/v1/sessions",
    tag = "sessions",
    request_body(content = SessionRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Opened", body = SessionView),
        (status = 200, description = "A retry: the session this request_id opened", body = SessionView),
        (status = 400, description = "Malformed request, unknown field, bad id", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The actor may not use this task, or it cannot be opened as a session (no code, sessions off)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown task, or an input id that is missing or not the tenant's", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The request_id was used with a different body (or by another actor)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Inputs do not match the task", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "The service's store keeps no sessions (not answered by this version: SQLite and PostgreSQL both do)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
async fn open_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    req: Result<Json<SessionRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let req = body(&state, &caller, caller.event("session_open"), req).await?;
    let (v, created) = service::open_session(&state, &caller, req).await?;
    Ok(session_response(v, created))
}

/// The session, if the caller opened it (anyone else: the same 404 as a missing one).
#[utoipa::path(
    get,
    path = "/v1/sessions/{session_id}",
    tag = "sessions",
    params(("session_id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "The session", body = SessionView),
        (status = 404, description = "No such session of the caller's", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "The service's store keeps no sessions (not answered by this version: SQLite and PostgreSQL both do)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
async fn get_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<SessionView>, ApiError> {
    Ok(Json(service::get_session(&state, &caller, &id).await?))
}

/// Ends the session: it takes no more cells; a cell still queued or running is cancelled.
/// Idempotent.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{session_id}",
    tag = "sessions",
    params(("session_id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "Ended (now or before)", body = SessionView),
        (status = 404, description = "No such session of the caller's", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "The service's store keeps no sessions (not answered by this version: SQLite and PostgreSQL both do)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
async fn close_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<SessionView>, ApiError> {
    Ok(Json(service::close_session(&state, &caller, &id).await?))
}

/// Checkpoints the session's workspace now. A session that is not live already has one
/// after every cell (its head). A live session's interpreter keeps running: between cells,
/// `/work` is collected from outside its sandbox with the same refusals and bounds as at its
/// end, and becomes the session's head (and what a fork from its last cell starts from).
#[utoipa::path(
    post,
    path = "/v1/sessions/{session_id}/checkpoint",
    tag = "sessions",
    params(("session_id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "The session, its `workspace_sha256` the checkpoint", body = SessionView),
        (status = 404, description = "No such session of the caller's", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The session was ended (`session-closed`) or expired (`session-expired`), or no checkpoint could be taken (`checkpoint-invalid`: the workspace is over its bounds, or the live sandbox did not answer)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
async fn checkpoint_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<SessionView>, ApiError> {
    Ok(Json(
        service::checkpoint_session(&state, &caller, &id).await?,
    ))
}

fn cell_response(v: CellView) -> Response {
    let code = if v.run.status.is_terminal() {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    let loc = format!("/v1/runs/{}", v.run.request_id);
    let mut r = (code, Json(v)).into_response();
    if let Ok(v) = HeaderValue::from_str(&loc) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// Runs the session's next cell: the task's command with this code, started from the
/// session's workspace checkpoint, collecting the next one. Once per (session, request_id): a
/// retry returns the recorded cell and runs nothing. Cells run one at a time.
#[utoipa::path(
    post,
    path = "/v1/sessions/{session_id}/cells",
    tag = "sessions",
    params(("session_id" = String, Path, description = "The session's id"), CellParams),
    request_body(content = CellRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The cell finished (any final status; see `status`), or a replay of the recorded cell", body = CellView),
        (status = 202, description = "Accepted (`?wait=false`) or still running; poll `Location` (the cell's run)", body = CellView),
        (status = 400, description = "Malformed request, unknown field, bad id, code too large", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The actor may no longer use the task", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session of the caller's, or an input gone", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A cell is still queued or running (`cell-in-progress`), the session was ended (`session-closed`) or expired (`session-expired`), ran its cells (`session-cell-limit`), its checkpoint no longer matches its stored bytes (`checkpoint-invalid`), or the request_id was used with other code", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Inputs no longer match the task", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Run slots and queue are full; see Retry-After", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "The service's store keeps no sessions (not answered by this version: SQLite and PostgreSQL both do)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
async fn run_cell(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    params: Result<Query<CellParams>, QueryRejection>,
    req: Result<Json<CellRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let ev = caller.event("session_cell");
    let wait = match params {
        Ok(Query(p)) => p.wait.unwrap_or(true),
        Err(_) => {
            let r = Refusal::Malformed("the only query parameter is `wait` (true or false)".into());
            return Err(deny(&state, &caller, ev, r).await.into());
        }
    };
    let req = body(&state, &caller, ev, req).await?;
    let v = service::session_cell(&state, &caller, &id, req, wait, None).await?;
    Ok(cell_response(v))
}

/// `?wait=false` makes a cell's `POST` return 202 at once.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct CellParams {
    /// Wait for the cell to finish (default true).
    pub wait: Option<bool>,
}

/// A page of a session's cells.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct CellsQuery {
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Cells per page, 1-100 (default 50).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
}

/// The session's cells, in order, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/sessions/{session_id}/cells",
    tag = "sessions",
    params(("session_id" = String, Path, description = "The session's id"), CellsQuery),
    responses(
        (status = 200, description = "One page of cells", body = CellList),
        (status = 400, description = "A cursor or limit that is not valid", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session of the caller's", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "The service's store keeps no sessions (not answered by this version: SQLite and PostgreSQL both do)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
async fn list_cells(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    query: Result<Query<CellsQuery>, QueryRejection>,
) -> Result<Json<CellList>, ApiError> {
    let q = match query {
        Ok(Query(q)) => q,
        Err(e) => {
            let r = Refusal::Malformed(one_line(&e.body_text()));
            return Err(deny(&state, &caller, caller.event("session_read"), r)
                .await
                .into());
        }
    };
    Ok(Json(
        service::list_session_cells(&state, &caller, &id, q.cursor.as_deref(), q.limit).await?,
    ))
}

/// A new session of the same owner, task and inputs, starting from the workspace the given
/// cell left (default: the session's head). Once per (tenant, request_id).
#[utoipa::path(
    post,
    path = "/v1/sessions/{session_id}/fork",
    tag = "sessions",
    params(("session_id" = String, Path, description = "The session's id")),
    request_body(content = ForkRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "The new session", body = SessionView),
        (status = 200, description = "A retry: the session this request_id made", body = SessionView),
        (status = 400, description = "Malformed request, unknown field, bad id", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session of the caller's, or no such cell in it", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The cell is still running (`cell-in-progress`), the session was ended (`session-closed`) or expired (`session-expired`), or the request_id was used with a different body", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The cell's checkpoint is no longer kept: only the session's most recent `session.keep_checkpoints` cells keep theirs (`checkpoint-gone`)", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "The service's store keeps no sessions (not answered by this version: SQLite and PostgreSQL both do)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
async fn fork_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    req: Result<Json<ForkRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let req = body(&state, &caller, caller.event("session_fork"), req).await?;
    let (v, created) = service::fork_session(&state, &caller, &id, req).await?;
    Ok(session_response(v, created))
}
