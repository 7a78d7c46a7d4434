//! The HTTP API: handlers, bearer authentication, RFC 9457 problem details and the OpenAPI
//! document (generated with utoipa from these handlers and types).
//!
//! Over 800 lines on purpose: each handler carries its own `#[utoipa::path]` contract, and the
//! OpenAPI document is built from exactly these handlers ([`openapi`], `complete_contract`), so
//! splitting them from the router that mounts them would let the contract and the routes
//! drift apart. Its unit tests are in `api/tests.rs`.

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::problem::one_line;
use crate::app::AppState;
#[cfg(test)]
use crate::policy::{
    valid_arg, valid_file_name, valid_input_id, valid_media_type, valid_request_id,
};
use crate::service::{self, Failure, Refusal, deny};
pub use crate::service::{
    ArtifactView, Caller, InputCreated, ListQuery, ReconcileAction, RunInput, RunList, RunRequest,
    RunSummary, RunView, TaskInputView, TaskView,
};
use crate::storage::db::RunRow;

pub use super::problem::{ApiError, PROBLEM_BASE, Problem};

/// Bounds a request's body before any handler reads it: a `Content-Length` above the route's
/// limit is refused with `413` at once (nothing is read), and the whole body must arrive
/// within `body_timeout_seconds` (else `408`, and the connection is closed).
pub(crate) async fn bound_body(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let s = &state.inner.config.server;
    let limit = if req.uri().path() == "/v1/inputs" {
        s.max_input_bytes
    } else {
        s.max_request_bytes
    };
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too-large",
            "Too large",
            format!("the body is larger than {limit} bytes"),
        )
        .into_response()
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        let mut r = too_large();
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return r;
    }
    let (parts, body) = req.into_parts();
    let timeout = Duration::from_secs(s.body_timeout_seconds);
    let max = usize::try_from(limit).unwrap_or(usize::MAX);
    let bytes = match tokio::time::timeout(timeout, axum::body::to_bytes(body, max)).await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => return too_large(),
        Err(_) => {
            let mut r = ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request-timeout",
                "Request timeout",
                format!(
                    "the body did not arrive within {} s",
                    s.body_timeout_seconds
                ),
            )
            .into_response();
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return r;
        }
    };
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}

/// Runs a state-changing request's handler to its end even if its client goes away: the
/// HTTP server drops a request's future when its connection closes, and a handler cut at an
/// `.await` could leave its write done but not what follows it (the audit record, or the
/// execution of a run just recorded `queued`, which nothing would then execute). The body
/// has been read by then ([`bound_body`] is outside this layer). Reads are not detached: a
/// read cut short has answered nothing.
///
/// Bounded: at most `max_connections` handlers are detached at once (connected or not), else
/// `503` with `Retry-After`; and a detached handler stops *waiting* for a run (`?wait=true`,
/// a replay of a run in flight) once its client is gone ([`service::CALLER_GONE`]).
async fn run_to_completion(
    State(detached): State<Arc<tokio::sync::Semaphore>>,
    req: Request,
    next: Next,
) -> Response {
    if req.method() == axum::http::Method::GET || req.method() == axum::http::Method::HEAD {
        return next.run(req).await;
    }
    let Ok(permit) = detached.try_acquire_owned() else {
        return ApiError::from(Failure::Unavailable).into_response();
    };
    let gone = tokio_util::sync::CancellationToken::new();
    // Dropped when this request's future is (its client went away) or when it ends.
    let _client = gone.clone().drop_guard();
    let handler = service::CALLER_GONE.scope(gone, next.run(req));
    let handled = tokio::spawn(async move {
        let r = handler.await;
        drop(permit);
        r
    });
    match handled.await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "a request's handler failed");
            ApiError::internal().into_response()
        }
    }
}

/// Bearer authentication layer: a request without a valid token gets `401` before any handler
/// (or MCP processing) runs; the caller is put into the request's extensions.
pub(crate) async fn auth(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let route = format!("{} {}", req.method(), req.uri().path());
    // Two credentials are ambiguous (which one would a proxy have checked?): refuse them.
    if req.headers().get_all(header::AUTHORIZATION).iter().count() > 1 {
        return ApiError::bad_request("more than one Authorization header").into_response();
    }
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        });
    match service::authenticate(&state, token, route).await {
        Some(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        None => ApiError::unauthorized().into_response(),
    }
}

// ---------------------------------------------------------------------------------------------
// Inputs

/// Query parameters of an upload.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct InputParams {
    /// File name for people (1-128 of `A-Z a-z 0-9 . _ -`, not starting with `.`); never a path.
    #[param(pattern = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$")]
    pub name: String,
    /// Media type, e.g. `text/csv`; matched against the task's accepted types.
    #[param(
        pattern = r"^[A-Za-z0-9!#$&^_.+-]+/[A-Za-z0-9!#$&^_.+-]+$",
        max_length = 127
    )]
    pub media_type: String,
}

/// Upload an input object (raw body), stored content-addressed and owned by the caller's tenant.
#[utoipa::path(
    post,
    path = "/v1/inputs",
    tag = "inputs",
    params(InputParams),
    request_body(content = UploadBody, content_type = "application/octet-stream", description = "The raw content"),
    responses(
        (status = 201, description = "Stored", body = InputCreated),
        (status = 400, description = "Bad parameters", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Unauthenticated", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Larger than server.max_input_bytes", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
async fn create_input(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<InputParams>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let ev = caller.event("input_upload");
    let Query(q) = match query {
        Ok(q) => q,
        Err(_) => {
            let r = Refusal::Malformed(
                "query parameters `name` and `media_type` are required (and nothing else)".into(),
            );
            return Err(deny(&state, &caller, ev, r).await.into());
        }
    };
    if let Err(r) = crate::policy::check_upload_params(&q.name, &q.media_type) {
        return Err(deny(&state, &caller, ev, r).await.into());
    }
    let body = match body {
        Ok(b) => b,
        Err(rej) => {
            let r = if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
                Refusal::UploadTooLarge {
                    max: state.inner.config.server.max_input_bytes,
                }
            } else {
                Refusal::Malformed("the body could not be read".into())
            };
            return Err(deny(&state, &caller, ev, r).await.into());
        }
    };
    let out = service::upload(&state, &caller, q.name, q.media_type, body.to_vec()).await?;
    Ok((StatusCode::CREATED, Json(out)).into_response())
}

// ---------------------------------------------------------------------------------------------
// Runs

/// `?wait=false` makes `POST /v1/runs` return 202 at once.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RunParams {
    /// Wait for the run to finish (default true).
    pub wait: Option<bool>,
}

fn run_response(state: &AppState, r: &RunRow) -> Response {
    let code = if r.status.is_terminal() {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    let mut resp = (code, Json(service::view(state, r))).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/runs/{}", r.request_id)) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp
}

/// Run a task once per (tenant, request_id): synchronous by default, `?wait=false` for 202.
#[utoipa::path(
    post,
    path = "/v1/runs",
    tag = "runs",
    params(RunParams),
    request_body(content = RunRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The run finished (any final status; see `status`), or a replay of the recorded run; with `Accept: text/event-stream`, the run's events as `GET /v1/runs/{request_id}/events` sends them, from `queued` to `ended`", content(
            (RunView = "application/json"),
            (String = "text/event-stream"),
        )),
        (status = 202, description = "Accepted (`?wait=false`) or still running; poll `Location`", body = RunView),
        (status = 400, description = "Malformed request, unknown field, bad id or argument", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Unauthenticated", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The actor may not use this task, or the task refuses code", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown task, or an input id that is missing or not the tenant's", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The request_id was used with a different body", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than server.max_request_bytes", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Inputs do not match the task (count, media type, size)", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Run slots and queue are full; see Retry-After", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
async fn create_run(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    params: Result<Query<RunParams>, QueryRejection>,
    body: Result<Json<RunRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let ev = caller.event("run_request");
    let wait = match params {
        Ok(Query(p)) => p.wait.unwrap_or(true),
        Err(_) => {
            let r = Refusal::Malformed("the only query parameter is `wait` (true or false)".into());
            return Err(deny(&state, &caller, ev, r).await.into());
        }
    };
    let req = match body {
        Ok(Json(r)) => r,
        Err(rej) => {
            let r = match &rej {
                JsonRejection::MissingJsonContentType(_) => Refusal::NotJson,
                JsonRejection::BytesRejection(b) if b.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                    Refusal::RequestTooLarge {
                        max: state.inner.config.server.max_request_bytes,
                    }
                }
                JsonRejection::JsonDataError(d) => Refusal::Malformed(one_line(&d.body_text())),
                _ => Refusal::Malformed("the body is not a JSON run request".into()),
            };
            return Err(deny(&state, &caller, ev, r).await.into());
        }
    };
    // Submit and follow in one request: the events stream of `GET /v1/runs/{id}/events`.
    if wants_events(&headers) {
        let Ok(permit) = state.inner.followers.clone().try_acquire_owned() else {
            return Err(ApiError::from(Failure::Unavailable));
        };
        let r = service::submit(&state, &caller, req, false, None).await?;
        let follow = service::follow_submitted(&state, r)?;
        return Ok(event_stream(follow, permit));
    }
    let r = service::submit(&state, &caller, req, wait, None).await?;
    Ok(run_response(&state, &r))
}

/// Whether a request asks for an events stream (`Accept: text/event-stream`).
fn wants_events(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            t.split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
        })
}

/// The runs of the caller's tenant (an operator: every tenant's), newest first, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/runs",
    tag = "runs",
    params(ListQuery),
    responses(
        (status = 200, description = "One page of runs", body = RunList),
        (status = 400, description = "A filter or cursor that is not valid", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Unauthenticated", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`tenant` names another tenant and the caller is not an operator", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
async fn list_runs(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<RunList>, ApiError> {
    let q = match query {
        Ok(Query(q)) => q,
        Err(e) => {
            let ev = caller.event("run_list");
            let r = Refusal::Malformed(one_line(&e.body_text()));
            return Err(deny(&state, &caller, ev, r).await.into());
        }
    };
    Ok(Json(service::list(&state, &caller, &q).await?))
}

/// The run record of the caller's tenant.
#[utoipa::path(
    get,
    path = "/v1/runs/{request_id}",
    tag = "runs",
    params(("request_id" = String, Path, description = "The request_id of the run")),
    responses(
        (status = 200, description = "Final", body = RunView),
        (status = 202, description = "Still queued or running", body = RunView),
        (status = 401, description = "Unauthenticated", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such run in the caller's tenant", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
async fn get_run(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(request_id): Path<String>,
) -> Result<Response, ApiError> {
    let r = service::get(&state, &caller, &request_id, "run_read").await?;
    Ok(run_response(&state, &r))
}

/// Cancels a run: a queued run never starts; a running one is killed, on whichever node runs
/// it, and ends `cancelled` (`unknown` for a task with network access). Idempotent.
#[utoipa::path(
    post,
    path = "/v1/runs/{request_id}/cancel",
    tag = "runs",
    params(("request_id" = String, Path, description = "The request_id of the run")),
    responses(
        (status = 200, description = "The run has ended (cancelled, or `unknown` for a task with network access)", body = RunView),
        (status = 202, description = "The cancel was requested and the run has not ended yet: poll it", body = RunView),
        (status = 401, description = "Unauthenticated", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such run in the caller's tenant", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The caller is neither the run's actor nor an operator", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The run had ended otherwise", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
async fn cancel_run(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(request_id): Path<String>,
) -> Result<Response, ApiError> {
    let r = service::cancel(&state, &caller, &request_id).await?;
    Ok(run_response(&state, &r))
}

/// Follows the run as it happens, as Server-Sent Events: `queued`, `started`, `stdout` and
/// `stderr` chunks (`{offset, bytes, text}`: the sandbox's bytes as text, the task's secrets
/// masked, made inert; UNTRUSTED), a `denial` (`{kind, detail}`, as the record's denials name
/// them) for each distinct refusal as it happens (the first 64; those known only at the end
/// are in the record), and `ended` with the final run record, the authority. Each event's id
/// is the follower's position (`PHASE.STDOUT.STDERR.DENIALS`); reconnect with `Last-Event-ID`
/// to resume without a chunk or denial lost or sent twice. Works on any replica of a
/// PostgreSQL deployment, wherever the run executes.
#[utoipa::path(
    get,
    path = "/v1/runs/{request_id}/events",
    tag = "runs",
    params(
        ("request_id" = String, Path, description = "The request_id of the run"),
        ("Last-Event-ID" = Option<String>, Header, description = "The id of the last event received, to resume after it"),
    ),
    responses(
        (status = 200, description = "The event stream; it ends after `ended`", content_type = "text/event-stream", body = String),
        (status = 401, description = "Unauthenticated", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such run in the caller's tenant", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
async fn run_events(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(request_id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(service::Position::parse);
    // Held for the stream's life: followers are bounded (each polls the store).
    let Ok(permit) = state.inner.followers.clone().try_acquire_owned() else {
        return Err(ApiError::from(Failure::Unavailable));
    };
    let follow = service::follow(&state, &caller, &request_id, resume).await?;
    Ok(event_stream(follow, permit))
}

/// A follower's events as Server-Sent Events, holding its follower permit until the end.
fn event_stream(follow: service::Follow, permit: tokio::sync::OwnedSemaphorePermit) -> Response {
    use axum::response::sse::{Event, KeepAlive, Sse};
    use service::RunEvent;
    let events = futures_util::stream::unfold((follow, permit), |(mut f, permit)| async move {
        let batch = f.next().await.unwrap_or_default();
        if batch.is_empty() {
            return None;
        }
        let events: Vec<Result<Event, std::convert::Infallible>> = batch
            .into_iter()
            .map(|(e, at)| {
                let ev = Event::default().id(at.id());
                Ok(match e {
                    RunEvent::Queued => ev.event("queued").data("{}"),
                    RunEvent::Started => ev.event("started").data("{}"),
                    RunEvent::Chunk {
                        stream,
                        offset,
                        bytes,
                        text,
                    } => ev.event(stream).data(
                        serde_json::json!({"offset": offset, "bytes": bytes, "text": text, "untrusted": true})
                            .to_string(),
                    ),
                    RunEvent::Denial { kind, detail } => ev
                        .event("denial")
                        .data(serde_json::json!({"kind": kind, "detail": detail, "untrusted": true}).to_string()),
                    RunEvent::Ended(v) => ev
                        .event("ended")
                        .data(serde_json::to_string(&*v).unwrap_or_default()),
                })
            })
            .collect();
        Some((futures_util::stream::iter(events), (f, permit)))
    });
    use futures_util::StreamExt;
    Sse::new(events.flatten())
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// Which stream's log.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogStream {
    Stdout,
    Stderr,
}

/// The query of `GET /v1/runs/{request_id}/logs`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LogParams {
    /// `stdout` or `stderr`.
    #[param(inline)]
    stream: LogStream,
}

/// The full retained log of the command's stdout or stderr (the first 1 MiB of the stream),
/// exactly as written but for the task's secrets, overwritten with `*` byte for byte (their
/// count in `x-agentjail-masked`): untrusted bytes, sent as an attachment. When nothing was
/// masked its sha256 (`x-agentjail-sha256`) is the run record's `stdout.sha256` /
/// `stderr.sha256` and the receipt's, so it can be verified (`agentjail receipt verify --stdout
/// FILE`); a masked log has no `x-agentjail-sha256`.
#[utoipa::path(
    get,
    path = "/v1/runs/{request_id}/logs",
    tag = "runs",
    params(("request_id" = String, Path, description = "The request_id of the run"), LogParams),
    responses(
        (status = 200, description = "The log", content_type = "application/octet-stream", body = UploadBody),
        (status = 400, description = "`stream` is not `stdout` or `stderr`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Unauthenticated", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The task shows none of this stream (`stdout_bytes` / `stderr_bytes` = 0)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such run", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The run has not ended, or its command never started", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "Deleted by retention", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
async fn get_log(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(request_id): Path<String>,
    params: Result<Query<LogParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let stream = match params {
        Ok(Query(p)) => p.stream,
        Err(_) => {
            let ev = caller.event("log_read");
            let r = Refusal::Malformed(
                "the only query parameter is `stream` (stdout or stderr)".into(),
            );
            return Err(deny(&state, &caller, ev, r).await.into());
        }
    };
    let log = service::log(
        &state,
        &caller,
        &request_id,
        matches!(stream, LogStream::Stdout),
    )
    .await?;
    let mut resp = attachment(log.bytes, "application/octet-stream", log.sha256.as_deref());
    if let Ok(v) = HeaderValue::from_str(&log.masked.to_string()) {
        resp.headers_mut().insert("x-agentjail-masked", v);
    }
    Ok(resp)
}

/// The verified artifact, with the task's media type (status `ok` only).
#[utoipa::path(
    get,
    path = "/v1/runs/{request_id}/artifact",
    tag = "runs",
    params(("request_id" = String, Path, description = "The request_id of the run")),
    responses(
        (status = 200, description = "The verified artifact", content_type = "application/octet-stream", body = UploadBody),
        (status = 401, description = "Unauthenticated", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such run", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The run has no verified artifact (status is not `ok`)", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "Deleted by retention", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
async fn get_artifact(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(request_id): Path<String>,
) -> Result<Response, ApiError> {
    let a = service::artifact(&state, &caller, &request_id).await?;
    Ok(attachment(a.bytes, &a.media_type, a.sha256.as_deref()))
}

/// Bytes the sandbox made, sent so that no client renders them: `media_type`, `nosniff`, as an
/// attachment, with their `x-agentjail-sha256` when given.
fn attachment(bytes: Vec<u8>, media_type: &str, sha256: Option<&str>) -> Response {
    let mut resp = bytes.into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(media_type)
            .unwrap_or(HeaderValue::from_static("application/octet-stream")),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static("attachment"),
    );
    if let Some(Ok(v)) = sha256.map(HeaderValue::from_str) {
        h.insert("x-agentjail-sha256", v);
    }
    resp
}

/// The signed receipt of the run (a DSSE envelope).
#[utoipa::path(
    get,
    path = "/v1/runs/{request_id}/receipt",
    tag = "runs",
    params(("request_id" = String, Path, description = "The request_id of the run")),
    responses(
        (status = 200, description = "The DSSE envelope", body = Object),
        (status = 401, description = "Unauthenticated", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such run", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The run has no receipt (not finished, or it never ran)", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "Deleted by retention", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
async fn get_receipt(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(request_id): Path<String>,
) -> Result<Response, ApiError> {
    let v = service::receipt(&state, &caller, &request_id).await?;
    Ok(Json(v).into_response())
}

/// An operator's decision about a run whose outcome is unknown.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileRequest {
    /// `retry` (tasks without network access only: nothing outside can have happened) or
    /// `abandon` (the record stays, with status `abandoned`).
    pub action: ReconcileAction,
}

/// Operator action on an `unknown` run: retry it (no-network tasks only) or abandon it.
#[utoipa::path(
    post,
    path = "/v1/runs/{request_id}/reconcile",
    tag = "runs",
    params(("request_id" = String, Path, description = "The request_id of the run")),
    request_body(content = ReconcileRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Abandoned, or retried to its end", body = RunView),
        (status = 400, description = "Malformed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Unauthenticated", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an operator, or retry of a task with network access", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such run", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The run's status is not `unknown`", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Run slots and queue are full", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
async fn reconcile_run(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(request_id): Path<String>,
    body: Result<Json<ReconcileRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let ev = caller.event("reconcile");
    let Ok(Json(body)) = body else {
        let r = Refusal::Malformed("expected {\"action\": \"retry\" | \"abandon\"}".into());
        return Err(deny(&state, &caller, ev, r).await.into());
    };
    let row = service::reconcile(&state, &caller, &request_id, body.action).await?;
    Ok(run_response(&state, &row))
}

// ---------------------------------------------------------------------------------------------
// Catalogue, health, metrics

/// The task catalogue (tasks the caller may use).
#[derive(Debug, Serialize, ToSchema)]
pub struct TaskList {
    pub tasks: Vec<TaskView>,
}

/// The tasks the caller may use, with input and output schemas.
#[utoipa::path(
    get,
    path = "/v1/tasks",
    tag = "tasks",
    responses(
        (status = 200, description = "The catalogue", body = TaskList),
        (status = 401, description = "Unauthenticated", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
async fn list_tasks(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Json<TaskList> {
    Json(TaskList {
        tasks: service::task_views(&state, &caller),
    })
}

/// Liveness and database health.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok`.
    pub status: String,
    pub runs_in_flight_or_queued: usize,
    /// The start-up self-test (`server.selftest`), when it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selftest: Option<crate::selftest::SelftestStatus>,
}

/// Health check (no authentication).
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "service",
    responses(
        (status = 200, description = "Healthy", body = Health),
        (status = 500, description = "The database is not usable", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn healthz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    state.store().ping().await.map_err(Failure::from)?;
    Ok(Json(Health {
        status: "ok".into(),
        runs_in_flight_or_queued: state
            .inner
            .admitted
            .load(std::sync::atomic::Ordering::Acquire),
        selftest: crate::selftest::status(),
    }))
}

/// Prometheus metrics in the text exposition format (no authentication; bind to loopback or
/// filter at the proxy).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "service",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain; version=0.0.4"))
)]
async fn metrics_handler(State(state): State<AppState>) -> Response {
    let body = state.inner.metrics.render();
    let mut r = body.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "agentjail orchestrator API",
        description = "Run typed tasks (optionally with model-proposed code) in the agentjail sandbox, once per request_id, and get back only verified output with a signed receipt. Errors are RFC 9457 problem details.",
    ),
    modifiers(&BearerScheme),
    components(schemas(Problem)),
    tags(
        (name = "inputs", description = "Input objects, owned by a tenant"),
        (name = "runs", description = "Runs, once per (tenant, request_id)"),
        (name = "sessions", description = "Sessions: cells sharing a persistent /work, owned by the actor that opened them"),
        (name = "tasks", description = "The task catalogue"),
        (name = "service", description = "Health and metrics"),
    )
)]
struct ApiDoc;

/// The OpenAPI document (3.1).
pub fn openapi() -> utoipa::openapi::OpenApi {
    build(None).1
}

fn build(state: Option<&AppState>) -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let (max_input, max_req) = state
        .map(|s| {
            (
                s.inner.config.server.max_input_bytes as usize,
                s.inner.config.server.max_request_bytes as usize,
            )
        })
        .unwrap_or((1 << 20, 1 << 20));
    let inputs = OpenApiRouter::new()
        .routes(routes!(create_input))
        .layer(DefaultBodyLimit::max(max_input));
    let runs = OpenApiRouter::new()
        .routes(routes!(create_run, list_runs))
        .routes(routes!(get_run))
        .routes(routes!(get_artifact))
        .routes(routes!(get_log))
        .routes(routes!(cancel_run))
        .routes(routes!(run_events))
        .routes(routes!(get_receipt))
        .routes(routes!(reconcile_run))
        .routes(routes!(list_tasks))
        .merge(super::sessions_api::routes())
        .layer(DefaultBodyLimit::max(max_req));
    let mut authed = inputs.merge(runs);
    if let Some(s) = state {
        // Outermost first: authentication, then the body's bounds, then the handler (run to
        // its end whatever the client does).
        authed = authed
            .layer(from_fn_with_state(
                Arc::new(tokio::sync::Semaphore::new(
                    s.inner.config.server.max_connections,
                )),
                run_to_completion,
            ))
            .layer(from_fn_with_state(s.clone(), bound_body))
            .layer(from_fn_with_state(s.clone(), auth));
    }
    let public = OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(metrics_handler));
    let (router, mut doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(authed)
        .merge(public)
        .split_for_parts();
    complete_contract(&mut doc);
    (router, doc)
}

/// The answers every operation can give, added to the document so that it is the whole
/// contract: `500` everywhere; `503` with `Retry-After` (the store cannot be reached) on every
/// operation but `/metrics` and `/v1/tasks`; for authenticated operations `400` (e.g. two `Authorization`
/// headers) and `401` with `WWW-Authenticate`; for operations with a body `408`, `413` and
/// (JSON bodies) `415`; the `Location` header of `202` and `Retry-After` of `429`.
fn complete_contract(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::schema::{ObjectBuilder, SchemaFormat, Type};
    use utoipa::openapi::{Content, Header, Ref, RefOr, ResponseBuilder};
    let problem = |desc: &str| {
        RefOr::T(
            ResponseBuilder::new()
                .description(desc)
                .content(
                    "application/problem+json",
                    Content::new(Some(Ref::from_schema_name("Problem"))),
                )
                .build(),
        )
    };
    let header = |desc: &str, int: bool| {
        let schema = if int {
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .format(Some(SchemaFormat::KnownFormat(
                    utoipa::openapi::KnownFormat::Int64,
                )))
                .build()
        } else {
            ObjectBuilder::new().schema_type(Type::String).build()
        };
        let mut h = Header::new(schema);
        h.description = Some(desc.into());
        RefOr::T(h)
    };
    for item in doc.paths.paths.values_mut() {
        for op in [item.get.as_mut(), item.post.as_mut(), item.delete.as_mut()]
            .into_iter()
            .flatten()
        {
            let authed = op.security.as_ref().is_some_and(|s| !s.is_empty());
            // An upload may be empty (an empty file is an input like any other).
            if let Some(RefOr::T(b)) = op.request_body.as_mut()
                && b.content.contains_key("application/octet-stream")
            {
                b.required = Some(utoipa::openapi::Required::False);
            }
            let body = op.request_body.as_ref().and_then(|b| match b {
                RefOr::T(b) => Some(b.content.keys().cloned().collect::<Vec<_>>()),
                RefOr::Ref(_) => None,
            });
            let from_memory = matches!(
                op.operation_id.as_deref(),
                Some("metrics_handler" | "list_tasks")
            );
            let r = &mut op.responses.responses;
            r.entry("500".into()).or_insert_with(|| {
                problem("Internal error; the detail is in the service log, not in the answer")
            });
            // Every operation but /metrics and the catalogue (both from memory) reads or writes
            // the store; on PostgreSQL an unreachable database is a 503 with Retry-After.
            if !from_memory {
                r.entry("503".into()).or_insert_with(|| {
                    problem("The store (the PostgreSQL database) cannot be reached right now; retry after Retry-After seconds")
                });
            }
            if authed {
                r.entry("400".into()).or_insert_with(|| {
                    problem("Malformed request (e.g. more than one Authorization header)")
                });
                r.entry("401".into())
                    .or_insert_with(|| problem("Unauthenticated"));
            }
            if let Some(types) = &body {
                r.entry("408".into()).or_insert_with(|| {
                    problem("The body did not arrive within server.body_timeout_seconds")
                });
                r.entry("413".into()).or_insert_with(|| {
                    problem("Body larger than the server's limit for this operation")
                });
                if types.iter().any(|t| t == "application/json") {
                    r.entry("415".into()).or_insert_with(|| {
                        problem("The body is not sent as Content-Type: application/json")
                    });
                }
            }
            for (code, name, desc, int) in [
                ("401", "WWW-Authenticate", "`Bearer`", false),
                (
                    "429",
                    "Retry-After",
                    "Seconds to wait before trying again",
                    true,
                ),
                (
                    "503",
                    "Retry-After",
                    "Seconds to wait before trying again",
                    true,
                ),
                (
                    "202",
                    "Location",
                    "Where to poll the run: /v1/runs/{request_id}",
                    false,
                ),
            ] {
                if let Some(RefOr::T(resp)) = r.get_mut(code) {
                    resp.headers.insert(name.into(), header(desc, int));
                }
            }
        }
    }
}

/// An upload's body: any bytes.
#[derive(ToSchema)]
#[schema(value_type = String, format = Binary)]
#[allow(dead_code)]
pub struct UploadBody(Vec<u8>);

/// The HTTP application over `state`, with `more` routes (the MCP endpoint) merged in before
/// the fallbacks; [`crate::router`] composes the two front doors.
pub async fn router_with(state: AppState, more: Router<AppState>) -> Router {
    let (r, doc) = build(Some(&state));
    let doc = Arc::new(doc.to_pretty_json().unwrap_or_default());
    r.route(
        "/openapi.json",
        axum::routing::get(move || {
            let doc = doc.clone();
            async move {
                let mut headers = HeaderMap::new();
                headers.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                (headers, (*doc).clone())
            }
        }),
    )
    .merge(more)
    .fallback(|| async { ApiError::not_found("no such endpoint") })
    .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
    .with_state(state)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
