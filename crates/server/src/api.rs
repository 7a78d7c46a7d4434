//! The HTTP API: handlers, bearer authentication, RFC 9457 problem details and the OpenAPI
//! document (generated with utoipa from these handlers and types).

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
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::audit::Event;
use crate::config::{CodePolicy, is_name};
use crate::db::{self, InputRow, Insert, RunRow};
use crate::runner::{self, Admission, Job};
use crate::{AppState, now, random_hex};

/// Base of the problem `type` URIs.
pub const PROBLEM_BASE: &str = "https://agentjail.dev/problems/";

/// An RFC 9457 problem details object.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// Stable URI naming the kind of problem, e.g. `https://agentjail.dev/problems/unauthorized`.
    #[serde(rename = "type")]
    pub type_: String,
    pub title: String,
    pub status: u16,
    /// What went wrong, for a person; never internal detail.
    pub detail: String,
}

/// An error response: a problem, plus optional headers.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    slug: &'static str,
    title: &'static str,
    detail: String,
    retry_after: Option<u64>,
}

impl ApiError {
    fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            slug,
            title,
            detail: detail.into(),
            retry_after: None,
        }
    }
    fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Unauthorized",
            "a valid bearer token is required",
        )
    }
    fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid-request",
            "Invalid request",
            detail,
        )
    }
    fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "Forbidden by policy",
            detail,
        )
    }
    fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", "Not found", detail)
    }
    fn unprocessable(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "input-mismatch",
            "Inputs do not match the task",
            detail,
        )
    }
    fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal error",
            "the service could not complete the request; the details are in its log",
        )
    }
    /// The problem's slug (suffix of its `type` URI), e.g. `forbidden`.
    pub fn slug(&self) -> &'static str {
        self.slug
    }
    /// What went wrong, for a person (never internal detail).
    pub fn detail(&self) -> &str {
        &self.detail
    }
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }
    /// The problem body.
    pub fn problem(&self) -> Problem {
        Problem {
            type_: format!("{PROBLEM_BASE}{}", self.slug),
            title: self.title.into(),
            status: self.status.as_u16(),
            detail: self.detail.clone(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.problem()).unwrap_or_default();
        let mut r = (self.status, body).into_response();
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if self.status == StatusCode::UNAUTHORIZED {
            h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(s) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            h.insert(header::RETRY_AFTER, v);
        }
        r
    }
}

impl From<db::DbError> for ApiError {
    fn from(e: db::DbError) -> Self {
        tracing::error!(error = %e, "database error");
        ApiError::internal()
    }
}

/// The authenticated caller.
#[derive(Debug, Clone)]
pub struct Caller {
    pub actor: String,
    pub tenant: String,
    pub operator: bool,
}

impl Caller {
    pub(crate) fn event(&self, event: &'static str) -> Event {
        Event {
            event,
            actor: Some(self.actor.clone()),
            tenant: Some(self.tenant.clone()),
            ..Default::default()
        }
    }
}

/// Checks a bearer token against the configured token hashes (constant time, every actor). A
/// failure is counted and audited with `route` (never the token). Shared by the HTTP API, the
/// MCP endpoint and `agentjail mcp` over stdio.
pub(crate) async fn authenticate(
    state: &AppState,
    token: Option<&str>,
    route: String,
) -> Option<Caller> {
    let token = token.map(str::trim).filter(|t| !t.is_empty());
    let found = token.and_then(|t| state.inner.config.actor_for_token(t));
    match found {
        Some((name, a)) => Some(Caller {
            actor: name.to_string(),
            tenant: a.tenant.clone(),
            operator: a.operator,
        }),
        None => {
            metrics::counter!("agentjail_auth_failures_total").increment(1);
            // The route is logged without its query string; the token never is.
            let route = route.chars().take(200).collect::<String>();
            let window = Duration::from_secs(state.inner.config.server.auth_failure_audit_seconds);
            if let Some(ev) = state
                .inner
                .auth_failures
                .record(token.is_some(), route, window)
            {
                state.inner.audit.append(ev).await;
            }
            None
        }
    }
}

/// Authentication failures, audited in aggregate: at most one `auth_failure` record per
/// window, whose `reason` counts every failure since the previous record (none is lost: a
/// flusher writes what is pending once the window has passed). Anyone who can reach the port
/// can make failures, so one record each would let them grow the audit log without bound.
#[derive(Default)]
pub(crate) struct AuthFailures(std::sync::Mutex<PendingFailures>);

#[derive(Default)]
pub(crate) struct PendingFailures {
    missing: u64,
    unknown: u64,
    route: String,
    last_record: Option<std::time::Instant>,
}

impl AuthFailures {
    /// Counts one failure; returns the record to write when the window allows one.
    fn record(&self, had_token: bool, route: String, window: Duration) -> Option<Event> {
        let mut p = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if had_token {
            p.unknown += 1;
        } else {
            p.missing += 1;
        }
        p.route = route;
        Self::take_due(&mut p, window)
    }

    /// The pending failures as one record, if any are pending and the window has passed.
    pub(crate) fn flush(&self, window: Duration) -> Option<Event> {
        let mut p = self.0.lock().unwrap_or_else(|e| e.into_inner());
        Self::take_due(&mut p, window)
    }

    fn take_due(p: &mut PendingFailures, window: Duration) -> Option<Event> {
        let n = p.missing + p.unknown;
        if n == 0 || p.last_record.is_some_and(|t| t.elapsed() < window) {
            return None;
        }
        let ev = Event {
            event: "auth_failure",
            decision: Some("deny"),
            reason: Some(format!(
                "{n} authentication failure(s) since the previous record: {} missing bearer token, {} unknown bearer token",
                p.missing, p.unknown
            )),
            route: Some(std::mem::take(&mut p.route)),
            ..Default::default()
        };
        p.missing = 0;
        p.unknown = 0;
        p.last_record = Some(std::time::Instant::now());
        Some(ev)
    }
}

/// Writes pending authentication failures once their window has passed.
pub(crate) fn spawn_auth_failure_flusher(state: AppState) {
    tokio::spawn(async move {
        let window = Duration::from_secs(state.inner.config.server.auth_failure_audit_seconds);
        loop {
            tokio::time::sleep(window.min(Duration::from_secs(1))).await;
            if let Some(ev) = state.inner.auth_failures.flush(window) {
                state.inner.audit.append(ev).await;
            }
        }
    });
}

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
    match authenticate(&state, token, route).await {
        Some(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        None => ApiError::unauthorized().into_response(),
    }
}

pub(crate) async fn deny(
    state: &AppState,
    caller: &Caller,
    mut ev: Event,
    e: ApiError,
) -> ApiError {
    metrics::counter!("agentjail_denials_total", "reason" => e.slug).increment(1);
    ev.decision = Some("deny");
    ev.reason = Some(format!("{}: {}", e.slug, e.detail));
    if ev.actor.is_none() {
        ev.actor = Some(caller.actor.clone());
        ev.tenant = Some(caller.tenant.clone());
    }
    state.inner.audit.append(ev).await;
    e
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

/// A stored input.
#[derive(Debug, Serialize, ToSchema)]
pub struct InputCreated {
    /// Opaque id, valid for the caller's tenant only.
    pub input_id: String,
    /// `sha256:<hex>` of the content.
    pub sha256: String,
    pub bytes: u64,
    pub name: String,
    pub media_type: String,
    /// When the input is deleted (RFC 3339).
    pub expires_at: String,
}

fn valid_file_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn valid_media_type(s: &str) -> bool {
    let ok = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "!#$&-^_.+".contains(c))
    };
    s.len() <= 127
        && s.split_once('/')
            .map(|(a, b)| ok(a) && ok(b))
            .unwrap_or(false)
}

fn ts(secs: i64) -> String {
    jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_default()
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
            let e = ApiError::bad_request(
                "query parameters `name` and `media_type` are required (and nothing else)",
            );
            return Err(deny(&state, &caller, ev, e).await);
        }
    };
    if let Err(e) = check_upload_params(&q.name, &q.media_type) {
        return Err(deny(&state, &caller, ev, e).await);
    }
    let body = match body {
        Ok(b) => b,
        Err(r) => {
            let e = if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too-large",
                    "Payload too large",
                    format!(
                        "inputs are at most {} bytes",
                        state.inner.config.server.max_input_bytes
                    ),
                )
            } else {
                ApiError::bad_request("the body could not be read")
            };
            return Err(deny(&state, &caller, ev, e).await);
        }
    };
    let out = store_input(&state, &caller, q.name, q.media_type, body.to_vec()).await?;
    Ok((StatusCode::CREATED, Json(out)).into_response())
}

fn check_upload_params(name: &str, media_type: &str) -> Result<(), ApiError> {
    if !valid_file_name(name) {
        return Err(ApiError::bad_request(
            "`name` must be 1-128 of A-Z a-z 0-9 . _ - and not start with `.`; it is never a path",
        ));
    }
    if !valid_media_type(media_type) {
        return Err(ApiError::bad_request(
            "`media_type` must look like type/subtype",
        ));
    }
    Ok(())
}

/// Stores an upload for the caller's tenant (content-addressed), counts and audits it
/// (`input_upload`). Shared by `POST /v1/inputs` and the MCP tool `upload_input`; checks the
/// name, media type and `max_input_bytes` itself, so every front door gets the same policy.
pub(crate) async fn store_input(
    state: &AppState,
    caller: &Caller,
    name: String,
    media_type: String,
    body: Vec<u8>,
) -> Result<InputCreated, ApiError> {
    let ev = caller.event("input_upload");
    if let Err(e) = check_upload_params(&name, &media_type) {
        return Err(deny(state, caller, ev, e).await);
    }
    let max = state.inner.config.server.max_input_bytes;
    if body.len() as u64 > max {
        let e = ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too-large",
            "Payload too large",
            format!("inputs are at most {max} bytes"),
        );
        return Err(deny(state, caller, ev, e).await);
    }
    let sha = crate::config::sha256_hex(&body);
    let bytes = body.len() as u64;
    let id = format!("in_{}", random_hex(16).map_err(|_| ApiError::internal())?);
    let t = now();
    let expires = t + state.inner.config.server.input_retention_seconds as i64;
    let row = InputRow {
        id: id.clone(),
        sha256: sha.clone(),
        name: name.clone(),
        media_type: media_type.clone(),
        bytes: body.len() as u64,
        created_at: t,
    };
    let path = runner::object_path(state, &sha);
    let tenant = caller.tenant.clone();
    let objects = state.inner.data_dir.join("objects");
    state
        .inner
        .db
        .call(move |c| {
            // Under the database lock, so the retention sweep cannot delete the object between
            // the write and the insert.
            store_object(&objects, &path, &body).map_err(|e| {
                tracing::error!(error = %e, "storing an input failed");
                db::DbError::Join("store".into())
            })?;
            db::insert_input(c, &tenant, &row, expires)
        })
        .await?;
    metrics::counter!("agentjail_inputs_stored_total").increment(1);
    state
        .inner
        .audit
        .append(Event {
            input_id: Some(id.clone()),
            decision: Some("allow"),
            ..ev
        })
        .await;
    Ok(InputCreated {
        input_id: id,
        sha256: format!("sha256:{sha}"),
        bytes,
        name,
        media_type,
        expires_at: ts(expires),
    })
}

/// Writes `body` at `path` (0644) unless an object with this hash exists: temp file, fsync, rename.
fn store_object(dir: &std::path::Path, path: &std::path::Path, body: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    if path.exists() {
        return Ok(());
    }
    let mut tmp = tempfile_in(dir)?;
    tmp.1.write_all(body)?;
    tmp.1.sync_all()?;
    std::fs::set_permissions(&tmp.0, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp.0, path)?;
    Ok(())
}

fn tempfile_in(dir: &std::path::Path) -> std::io::Result<(std::path::PathBuf, std::fs::File)> {
    let name = format!(".tmp-{}", random_hex(8)?);
    let p = dir.join(name);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&p)?;
    Ok((p, f))
}

// ---------------------------------------------------------------------------------------------
// Runs

/// A run request. Unknown fields are refused: the request cannot name a host path, image,
/// mount, limit or network destination; those come from the task type.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// The caller's idempotency key: 1-128 of `A-Z a-z 0-9 . _ : -`. A request_id executes at most
    /// once per tenant.
    #[schema(
        pattern = r"^(?:[A-Za-z0-9._:-]*[A-Za-z0-9_:-][A-Za-z0-9._:-]*|\.{3,})$",
        min_length = 1,
        max_length = 128
    )]
    pub request_id: String,
    /// Task type name (see `GET /v1/tasks`).
    #[schema(pattern = r"^[a-z0-9_-]{1,64}$")]
    pub task: String,
    /// Input ids from `POST /v1/inputs`, in the task's input order.
    pub inputs: Vec<String>,
    /// Model-proposed code (tasks with `code: allowed` only; required there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Extra command arguments (only as many as the task's `max_args`; no paths).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
}

/// `?wait=false` makes `POST /v1/runs` return 202 at once.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RunParams {
    /// Wait for the run to finish (default true).
    pub wait: Option<bool>,
}

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
    pub status: String,
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
}

pub(crate) fn is_terminal(status: &str) -> bool {
    !matches!(status, "queued" | "running")
}

pub(crate) fn view(state: &AppState, r: &RunRow) -> RunView {
    let media_type = state
        .inner
        .config
        .tasks
        .get(&r.task)
        .map(|t| t.output.media_type.clone())
        .unwrap_or_else(|| "application/octet-stream".into());
    let artifact = match (&r.artifact, r.status.as_str()) {
        (Some(a), "ok") => {
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
    RunView {
        request_id: r.request_id.clone(),
        task: r.task.clone(),
        job_id: r.job_id.clone(),
        job_expires_at: ts(r.job_expires_at),
        status: r.status.clone(),
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
    }
}

fn run_response(state: &AppState, r: &RunRow) -> Response {
    let code = if is_terminal(&r.status) {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    let mut resp = (code, Json(view(state, r))).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/runs/{}", r.request_id)) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp
}

fn valid_request_id(s: &str) -> bool {
    // `.` and `..` would be path segments in `Location: /v1/runs/{request_id}`.
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))
}

fn valid_input_id(s: &str) -> bool {
    s.len() == 35
        && s.starts_with("in_")
        && s[3..]
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
}

fn valid_arg(s: &str) -> bool {
    s.len() <= 256 && !s.starts_with('/') && !s.contains("..") && !s.chars().any(|c| c.is_control())
}

/// Run a task once per (tenant, request_id): synchronous by default, `?wait=false` for 202.
#[utoipa::path(
    post,
    path = "/v1/runs",
    tag = "runs",
    params(RunParams),
    request_body(content = RunRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The run finished (any final status; see `status`), or a replay of the recorded run", body = RunView),
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
    params: Result<Query<RunParams>, QueryRejection>,
    body: Result<Json<RunRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let ev = caller.event("run_request");
    let wait = match params {
        Ok(Query(p)) => p.wait.unwrap_or(true),
        Err(_) => {
            let e = ApiError::bad_request("the only query parameter is `wait` (true or false)");
            return Err(deny(&state, &caller, ev, e).await);
        }
    };
    let req = match body {
        Ok(Json(r)) => r,
        Err(rej) => {
            let e = match &rej {
                JsonRejection::MissingJsonContentType(_) => ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "unsupported-media-type",
                    "Unsupported media type",
                    "send the request as application/json",
                ),
                JsonRejection::BytesRejection(b) if b.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                    ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "too-large",
                        "Payload too large",
                        format!(
                            "requests are at most {} bytes",
                            state.inner.config.server.max_request_bytes
                        ),
                    )
                }
                JsonRejection::JsonDataError(d) => ApiError::bad_request(one_line(&d.body_text())),
                _ => ApiError::bad_request("the body is not a JSON run request"),
            };
            return Err(deny(&state, &caller, ev, e).await);
        }
    };
    let r = submit_run(&state, &caller, req, wait, None).await?;
    Ok(run_response(&state, &r))
}

/// Policy, execute-once, admission and the run itself: everything `POST /v1/runs` does after
/// parsing. Shared with the MCP task tools, so both front doors take the same path. Denials are
/// counted and audited (`run_request`); returns the run record (final when `wait` and the run
/// was not cancelled). `cancel` (MCP cancellation) kills the run's `agentjail run` process.
pub(crate) async fn submit_run(
    state: &AppState,
    caller: &Caller,
    req: RunRequest,
    wait: bool,
    cancel: Option<CancellationToken>,
) -> Result<RunRow, ApiError> {
    let mut ev = caller.event("run_request");
    if !valid_request_id(&req.request_id) {
        let e = ApiError::bad_request(
            "`request_id` must be 1-128 of A-Z a-z 0-9 . _ : -, and not `.` or `..`",
        );
        return Err(deny(state, caller, ev, e).await);
    }
    ev.request_id = Some(req.request_id.clone());
    // A recorded request_id is answered from the record (or refused if the body differs) before
    // any other check: execute-once holds even after its inputs expired or the config changed.
    // `"args": []` is the same request as no `args`.
    let mut req = req;
    if req.args.as_ref().is_some_and(Vec::is_empty) {
        req.args = None;
    }
    let body_sha = crate::config::sha256_hex(&serde_jcs::to_vec(&req).unwrap_or_default());
    let (t0, r0) = (caller.tenant.clone(), req.request_id.clone());
    if let Some(existing) = state
        .inner
        .db
        .call(move |c| db::get_run(c, &t0, &r0))
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
    if !is_name(&req.task) {
        let e = ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown-task",
            "Unknown task",
            "no such task",
        );
        return Err(deny(state, caller, ev, e).await);
    }
    ev.task = Some(req.task.clone());
    let Some(task) = state.inner.config.tasks.get(&req.task) else {
        let e = ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown-task",
            "Unknown task",
            "no such task",
        );
        return Err(deny(state, caller, ev, e).await);
    };
    if !state
        .inner
        .config
        .may_use(&caller.actor, &caller.tenant, task)
    {
        let e = ApiError::forbidden("the actor may not use this task");
        return Err(deny(state, caller, ev, e).await);
    }
    match (task.code, &req.code) {
        (CodePolicy::Forbidden, Some(_)) => {
            let e = ApiError::forbidden("this task runs a fixed program and accepts no code");
            return Err(deny(state, caller, ev, e).await);
        }
        (CodePolicy::Allowed, None) => {
            let e = ApiError::bad_request("this task needs `code`");
            return Err(deny(state, caller, ev, e).await);
        }
        (CodePolicy::Allowed, Some(c)) if c.len() > task.max_code_bytes || c.contains('\0') => {
            let e = ApiError::bad_request(format!(
                "`code` must be at most {} bytes without NUL",
                task.max_code_bytes
            ));
            return Err(deny(state, caller, ev, e).await);
        }
        _ => {}
    }
    let args = req.args.clone().unwrap_or_default();
    if args.len() > task.max_args {
        let e = ApiError::bad_request(format!("this task takes at most {} args", task.max_args));
        return Err(deny(state, caller, ev, e).await);
    }
    if let Some(i) = args.iter().position(|a| !valid_arg(a)) {
        let e = ApiError::bad_request(format!(
            "args[{i}]: at most 256 characters, no control characters, not a path (no leading `/`, no `..`)"
        ));
        return Err(deny(state, caller, ev, e).await);
    }
    if req.inputs.len() != task.inputs.len() {
        let e = ApiError::unprocessable(format!(
            "this task takes exactly {} input(s)",
            task.inputs.len()
        ));
        return Err(deny(state, caller, ev, e).await);
    }
    if let Some(i) = req.inputs.iter().position(|id| !valid_input_id(id)) {
        let e = ApiError::bad_request(format!(
            "inputs[{i}]: not an input id (ids come from POST /v1/inputs)"
        ));
        return Err(deny(state, caller, ev, e).await);
    }
    let (tenant, ids) = (caller.tenant.clone(), req.inputs.clone());
    let rows = state
        .inner
        .db
        .call(move |c| {
            ids.iter()
                .map(|id| db::get_input(c, &tenant, id))
                .collect::<Result<Vec<_>, _>>()
        })
        .await?;
    let mut inputs = Vec::new();
    for (i, (row, slot)) in rows.into_iter().zip(&task.inputs).enumerate() {
        // Another tenant's id and a missing id get the same answer.
        let Some(row) = row else {
            let e = ApiError::not_found(format!("inputs[{i}]: no such input"));
            return Err(deny(state, caller, ev, e).await);
        };
        if !slot.media_types.contains(&row.media_type) {
            let e = ApiError::unprocessable(format!(
                "inputs[{i}]: media type {} is not one of {:?}",
                row.media_type, slot.media_types
            ));
            return Err(deny(state, caller, ev, e).await);
        }
        if row.bytes > slot.max_bytes {
            let e = ApiError::unprocessable(format!(
                "inputs[{i}]: larger than {} bytes",
                slot.max_bytes
            ));
            return Err(deny(state, caller, ev, e).await);
        }
        inputs.push(row);
    }

    // Execute once: the insert is atomic; a racing duplicate finds the other's record.
    let admission = Admission::try_take(state);
    let t = now();
    let job_id = format!("job_{}", random_hex(16).map_err(|_| ApiError::internal())?);
    let run_inputs: Vec<RunInput> = inputs
        .iter()
        .map(|r| RunInput {
            input_id: r.id.clone(),
            sha256: format!("sha256:{}", r.sha256),
        })
        .collect();
    let row = RunRow {
        tenant: caller.tenant.clone(),
        request_id: req.request_id.clone(),
        body_sha256: body_sha.clone(),
        task: req.task.clone(),
        actor: caller.actor.clone(),
        job_id: job_id.clone(),
        job_expires_at: t + state.inner.config.server.job_ttl_seconds as i64,
        status: "queued".into(),
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
        args: serde_json::to_string(&args).unwrap_or_else(|_| "[]".into()),
        manifest_digest: Some(runner::manifest_digest(
            state,
            &req.task,
            task,
            &req.request_id,
            &inputs,
            &args,
        )),
    };
    let admitted = admission.is_some();
    let to_insert = row.clone();
    let inserted = state
        .inner
        .db
        .call(move |c| {
            if admitted {
                db::insert_run(c, &to_insert)
            } else {
                // Full: still answer replays; refuse only new work.
                Ok(
                    match db::get_run(c, &to_insert.tenant, &to_insert.request_id)? {
                        Some(r) => Insert::Exists(Box::new(r)),
                        None => Insert::Inserted,
                    },
                )
            }
        })
        .await?;
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
        Insert::Inserted if !admitted => {
            metrics::counter!("agentjail_overload_refusals_total").increment(1);
            let mut e = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "overloaded",
                "Too many runs",
                "all run slots and the queue are full; retry later",
            );
            e.retry_after = Some(5);
            return Err(deny(state, caller, ev, e).await);
        }
        Insert::Inserted => {}
    }
    state
        .inner
        .audit
        .append(Event {
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
        inputs,
        code: req.code.clone(),
        args,
        cancel,
    };
    let Some(admission) = admission else {
        return Err(ApiError::internal());
    };
    let handle = tokio::spawn(runner::execute(state.clone(), job, admission));
    if wait {
        let _ = handle.await;
    }
    let (tenant, rid) = (caller.tenant.clone(), req.request_id.clone());
    state
        .inner
        .db
        .call(move |c| db::get_run(c, &tenant, &rid))
        .await?
        .ok_or_else(ApiError::internal)
}

/// Answers a repeated request_id: the recorded run for the same body, 409 for a different one.
async fn replay(
    state: &AppState,
    caller: &Caller,
    ev: Event,
    existing: RunRow,
    body_sha: &str,
    wait: bool,
    cancel: Option<&CancellationToken>,
) -> Result<RunRow, ApiError> {
    if existing.body_sha256 != body_sha {
        let e = ApiError::new(
            StatusCode::CONFLICT,
            "request-id-conflict",
            "request_id already used",
            "this request_id was used with a different request; use a new request_id",
        );
        return Err(deny(state, caller, ev, e).await);
    }
    metrics::counter!("agentjail_replays_total").increment(1);
    state
        .inner
        .audit
        .append(Event {
            event: "run_replay",
            decision: Some("allow"),
            job_id: Some(existing.job_id.clone()),
            status: Some(existing.status.clone()),
            task: Some(existing.task.clone()),
            ..ev
        })
        .await;
    if wait && !is_terminal(&existing.status) {
        wait_for(state, &caller.tenant, &existing.request_id, cancel).await
    } else {
        Ok(existing)
    }
}

/// Polls the record until it is final (a replay of a run still in flight).
/// A cancelled waiter (MCP cancellation of a replayed call) stops waiting; the run goes on.
async fn wait_for(
    state: &AppState,
    tenant: &str,
    request_id: &str,
    cancel: Option<&CancellationToken>,
) -> Result<RunRow, ApiError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3600);
    loop {
        let (t, r) = (tenant.to_string(), request_id.to_string());
        let row = state
            .inner
            .db
            .call(move |c| db::get_run(c, &t, &r))
            .await?
            .ok_or_else(ApiError::internal)?;
        if is_terminal(&row.status)
            || std::time::Instant::now() > deadline
            || cancel.is_some_and(|c| c.is_cancelled())
        {
            return Ok(row);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ").chars().take(300).collect()
}

pub(crate) async fn load_run(
    state: &AppState,
    caller: &Caller,
    request_id: &str,
    event: &'static str,
) -> Result<RunRow, ApiError> {
    load_run_checked(state, caller, request_id, event, |_| Ok(())).await
}

/// [`load_run`], with a check of the record: a refusal by `check` is audited as a denial
/// (not as an allowed read).
async fn load_run_checked(
    state: &AppState,
    caller: &Caller,
    request_id: &str,
    event: &'static str,
    check: impl FnOnce(&RunRow) -> Result<(), ApiError>,
) -> Result<RunRow, ApiError> {
    let mut ev = caller.event(event);
    if !valid_request_id(request_id) {
        let e = ApiError::not_found("no such run");
        return Err(deny(state, caller, ev, e).await);
    }
    ev.request_id = Some(request_id.to_string());
    let (t, r) = (caller.tenant.clone(), request_id.to_string());
    let row = state.inner.db.call(move |c| db::get_run(c, &t, &r)).await?;
    match row {
        Some(r) => {
            if let Err(e) = check(&r) {
                ev.task = Some(r.task.clone());
                return Err(deny(state, caller, ev, e).await);
            }
            state
                .inner
                .audit
                .append(Event {
                    decision: Some("allow"),
                    task: Some(r.task.clone()),
                    ..ev
                })
                .await;
            Ok(r)
        }
        None => Err(deny(state, caller, ev, ApiError::not_found("no such run")).await),
    }
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
    let r = load_run(&state, &caller, &request_id, "run_read").await?;
    Ok(run_response(&state, &r))
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
    let r = load_run_checked(&state, &caller, &request_id, "artifact_read", |r| {
        if r.outputs_deleted {
            Err(gone())
        } else if r.artifact.is_none() || r.status != "ok" {
            Err(no_artifact(&r.status))
        } else {
            Ok(())
        }
    })
    .await?;
    match (&r.artifact, r.status.as_str()) {
        (Some(a), "ok") => {
            let mt = state
                .inner
                .config
                .tasks
                .get(&r.task)
                .map(|t| t.output.media_type.clone())
                .unwrap_or_else(|| "application/octet-stream".into());
            let mut resp = a.clone().into_response();
            let h = resp.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_str(&mt)
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
            if let Some(Ok(v)) = r.artifact_sha256.as_deref().map(HeaderValue::from_str) {
                h.insert("x-agentjail-sha256", v);
            }
            Ok(resp)
        }
        _ => Err(no_artifact(&r.status)),
    }
}

fn no_artifact(status: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "no-verified-artifact",
        "No verified artifact",
        format!(
            "the run's status is `{status}`; only a run with status `ok` has a verified artifact"
        ),
    )
}

fn no_receipt(status: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "no-receipt",
        "No receipt",
        format!("the run's status is `{status}` and it has no receipt"),
    )
}

fn gone() -> ApiError {
    ApiError::new(
        StatusCode::GONE,
        "outputs-expired",
        "Deleted by retention",
        "the run's outputs were deleted by the task's retention",
    )
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
    let r = load_run_checked(&state, &caller, &request_id, "receipt_read", |r| {
        if r.outputs_deleted {
            Err(gone())
        } else if r
            .receipt
            .as_deref()
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
            .is_none()
        {
            Err(no_receipt(&r.status))
        } else {
            Ok(())
        }
    })
    .await?;
    match r
        .receipt
        .as_deref()
        .and_then(|s| serde_json::from_str::<Value>(s).ok())
    {
        Some(v) => Ok(Json(v).into_response()),
        None => Err(no_receipt(&r.status)),
    }
}

/// An operator's decision about a run whose outcome is unknown.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileRequest {
    /// `retry` (tasks without network access only: nothing outside can have happened) or
    /// `abandon` (the record stays, with status `abandoned`).
    pub action: ReconcileAction,
}

/// Reconcile decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReconcileAction {
    Retry,
    Abandon,
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
        (status = 409, description = "The run's status is not `unknown`, it cannot be retried, or its task type changed since the first attempt (the rebuilt manifest's digest differs)", body = Problem, content_type = "application/problem+json"),
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
    let mut ev = caller.event("reconcile");
    let Ok(Json(body)) = body else {
        let e = ApiError::bad_request("expected {\"action\": \"retry\" | \"abandon\"}");
        return Err(deny(&state, &caller, ev, e).await);
    };
    let r = load_run(&state, &caller, &request_id, "run_read").await?;
    ev.request_id = Some(r.request_id.clone());
    ev.task = Some(r.task.clone());
    if !caller.operator {
        let e = ApiError::forbidden("only an operator may reconcile runs");
        return Err(deny(&state, &caller, ev, e).await);
    }
    if r.status != "unknown" {
        let e = ApiError::new(
            StatusCode::CONFLICT,
            "not-reconcilable",
            "Not reconcilable",
            format!(
                "only runs with status `unknown` are reconciled; this one is `{}`",
                r.status
            ),
        );
        return Err(deny(&state, &caller, ev, e).await);
    }
    let task = state.inner.config.tasks.get(&r.task).cloned();
    let (tenant, rid) = (caller.tenant.clone(), r.request_id.clone());
    if body.action == ReconcileAction::Abandon {
        let t = now();
        state
            .inner
            .db
            .call(move |c| db::reconcile(c, &tenant, &rid, None, t))
            .await?;
        state
            .inner
            .audit
            .append(Event {
                decision: Some("allow"),
                reason: Some("abandon".into()),
                status: Some("abandoned".into()),
                ..ev
            })
            .await;
    } else {
        let Some(task) = task else {
            let e = ApiError::forbidden("the task no longer exists");
            return Err(deny(&state, &caller, ev, e).await);
        };
        if !matches!(task.network, agentjail_manifest::Network::Deny) {
            let e = ApiError::forbidden(
                "the task has network access: an external effect may have happened, so it cannot be retried; abandon it",
            );
            return Err(deny(&state, &caller, ev, e).await);
        }
        let inputs: Vec<RunInput> = serde_json::from_str(&r.inputs).unwrap_or_default();
        let (t2, ids) = (
            caller.tenant.clone(),
            inputs
                .iter()
                .map(|i| i.input_id.clone())
                .collect::<Vec<_>>(),
        );
        let rows = state
            .inner
            .db
            .call(move |c| {
                ids.iter()
                    .map(|id| db::get_input(c, &t2, id))
                    .collect::<Result<Vec<_>, _>>()
            })
            .await?;
        let Some(rows) = rows.into_iter().collect::<Option<Vec<_>>>() else {
            let e = ApiError::new(
                StatusCode::CONFLICT,
                "not-reconcilable",
                "Not reconcilable",
                "an input of the run was deleted by retention; abandon it",
            );
            return Err(deny(&state, &caller, ev, e).await);
        };
        // The same request again: its `args` as recorded (the rest comes from the task type).
        let Ok(args) = serde_json::from_str::<Vec<String>>(&r.args) else {
            return Err(ApiError::internal());
        };
        if task.code == CodePolicy::Allowed {
            // The code is not kept after a run; a retry needs the original job folder's copy.
            let e = ApiError::new(
                StatusCode::CONFLICT,
                "not-reconcilable",
                "Not reconcilable",
                "the run's code is not kept; abandon it and submit a new request_id",
            );
            return Err(deny(&state, &caller, ev, e).await);
        }
        // The same run, or none: the manifest rebuilt now must be the first attempt's.
        let rebuilt = runner::manifest_digest(&state, &r.task, &task, &r.request_id, &rows, &args);
        if r.manifest_digest.as_deref() != Some(rebuilt.as_str()) {
            let e = match &r.manifest_digest {
                Some(first) => ApiError::new(
                    StatusCode::CONFLICT,
                    "task-changed",
                    "Task changed",
                    format!(
                        "the task type `{}` changed since the first attempt: that attempt's manifest digest is {first}, a retry would build {rebuilt}; it would be a different run, so it is refused; abandon it and submit the request under a new request_id",
                        r.task
                    ),
                ),
                None => ApiError::new(
                    StatusCode::CONFLICT,
                    "not-reconcilable",
                    "Not reconcilable",
                    "the first attempt's manifest digest was not recorded (an older version recorded this run), so a retry cannot be shown to run the same manifest; abandon it",
                ),
            };
            return Err(deny(&state, &caller, ev, e).await);
        }
        let Some(admission) = Admission::try_take(&state) else {
            let mut e = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "overloaded",
                "Too many runs",
                "all run slots and the queue are full; retry later",
            );
            e.retry_after = Some(5);
            return Err(deny(&state, &caller, ev, e).await);
        };
        let job_id = format!("job_{}", random_hex(16).map_err(|_| ApiError::internal())?);
        let expires = now() + state.inner.config.server.job_ttl_seconds as i64;
        let (j2, t) = (job_id.clone(), now());
        let ok = state
            .inner
            .db
            .call(move |c| db::reconcile(c, &tenant, &rid, Some((&j2, expires)), t))
            .await?;
        if ok {
            state
                .inner
                .audit
                .append(Event {
                    decision: Some("allow"),
                    reason: Some("retry".into()),
                    job_id: Some(job_id.clone()),
                    ..ev
                })
                .await;
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
            };
            let _ = tokio::spawn(runner::execute(state.clone(), job, admission)).await;
        }
    }
    let (t, rid) = (caller.tenant.clone(), r.request_id.clone());
    let row = state
        .inner
        .db
        .call(move |c| db::get_run(c, &t, &rid))
        .await?
        .ok_or_else(ApiError::internal)?;
    Ok(run_response(&state, &row))
}

// ---------------------------------------------------------------------------------------------
// Catalogue, health, metrics

/// One input of a task, as the catalogue shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct TaskInputView {
    pub mount: String,
    pub media_types: Vec<String>,
    pub max_bytes: u64,
}

/// A task type, as an agent needs it.
#[derive(Debug, Serialize, ToSchema)]
pub struct TaskView {
    pub name: String,
    pub description: String,
    /// Whether `code` is required (`allowed`) or refused (`forbidden`).
    pub code: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code_mount: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_code_bytes: Option<usize>,
    pub max_args: usize,
    pub inputs: Vec<TaskInputView>,
    pub output_path: String,
    pub output_media_type: String,
    pub output_max_bytes: u64,
    /// JSON Schema the artifact satisfies.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub output_schema: Option<Value>,
    /// `deny`, or the allowlist.
    #[schema(value_type = Value)]
    pub network: Value,
    #[schema(value_type = Object)]
    pub limits: Value,
    /// JSON Schema of a `POST /v1/runs` body for this task.
    #[schema(value_type = Object)]
    pub request_schema: Value,
}

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
        tasks: task_views(&state, &caller),
    })
}

/// The catalogue as the caller sees it: the tasks it may use, with their schemas. Shared by
/// `GET /v1/tasks` and the MCP tool list.
pub(crate) fn task_views(state: &AppState, caller: &Caller) -> Vec<TaskView> {
    let cfg = &state.inner.config;
    cfg
        .tasks
        .iter()
        .filter(|(_, t)| cfg.may_use(&caller.actor, &caller.tenant, t))
        .map(|(name, t)| {
            let allowed = t.code == CodePolicy::Allowed;
            let mut props = serde_json::json!({
                "request_id": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
                "task": {"const": name},
                "inputs": {"type": "array", "items": {"type": "string", "pattern": "^in_[0-9a-f]{32}$"},
                           "minItems": t.inputs.len(), "maxItems": t.inputs.len()},
            });
            let mut required = vec!["request_id", "task", "inputs"];
            if allowed {
                props["code"] = serde_json::json!({"type": "string", "maxLength": t.max_code_bytes});
                required.push("code");
            }
            if t.max_args > 0 {
                props["args"] = serde_json::json!({"type": "array", "maxItems": t.max_args, "items": {"type": "string", "maxLength": 256}});
            }
            TaskView {
                name: name.clone(),
                description: t.description.clone(),
                code: if allowed { "allowed" } else { "forbidden" }.into(),
                code_mount: allowed.then(|| t.code_mount.clone()),
                max_code_bytes: allowed.then_some(t.max_code_bytes),
                max_args: t.max_args,
                inputs: t
                    .inputs
                    .iter()
                    .map(|s| TaskInputView {
                        mount: s.mount.clone(),
                        media_types: s.media_types.clone(),
                        max_bytes: s.max_bytes,
                    })
                    .collect(),
                output_path: t.output.path.clone(),
                output_media_type: t.output.media_type.clone(),
                output_max_bytes: t.output.max_bytes,
                output_schema: t.output.schema.as_ref().and_then(|s| s.value().ok()),
                network: serde_json::to_value(&t.network).unwrap_or_default(),
                limits: serde_json::to_value(t.limits).unwrap_or_default(),
                request_schema: serde_json::json!({
                    "type": "object", "additionalProperties": false,
                    "required": required, "properties": props,
                }),
            }
        })
        .collect()
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
    state.inner.db.call(|c| db::count_runs(c)).await?;
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
        .routes(routes!(create_run))
        .routes(routes!(get_run))
        .routes(routes!(get_artifact))
        .routes(routes!(get_receipt))
        .routes(routes!(reconcile_run))
        .routes(routes!(list_tasks))
        .layer(DefaultBodyLimit::max(max_req));
    let mut authed = inputs.merge(runs);
    if let Some(s) = state {
        // Outermost first: authentication, then the body's bounds, then the handler.
        authed = authed
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
/// contract: `500` everywhere; for authenticated operations `400` (e.g. two `Authorization`
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
        for op in [item.get.as_mut(), item.post.as_mut()]
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
            let r = &mut op.responses.responses;
            r.entry("500".into()).or_insert_with(|| {
                problem("Internal error; the detail is in the service log, not in the answer")
            });
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

/// The HTTP application over `state`.
pub async fn router(state: AppState) -> Router {
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
    .merge(crate::mcp::http_router(&state))
    .fallback(|| async { ApiError::not_found("no such endpoint") })
    .method_not_allowed_fallback(|| async {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "Method not allowed",
            "this endpoint does not take this method",
        )
    })
    .with_state(state)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn request_fields_cannot_carry_paths() {
        assert!(valid_request_id("example-095"));
        assert!(valid_request_id("a.b_c:d-1"));
        for bad in ["", "../x", "a/b", "a b", "x\n", &"x".repeat(129)] {
            assert!(!valid_request_id(bad), "{bad:?}");
        }
        assert!(valid_input_id("in_0123456789abcdef0123456789abcdef"));
        for bad in [
            "/etc/passwd",
            "in_../../etc/passwd",
            "in_0123456789ABCDEF0123456789ABCDEF",
            "in_0",
        ] {
            assert!(!valid_input_id(bad), "{bad:?}");
        }
        assert!(valid_arg("--verbose") && valid_arg("x=1"));
        for bad in ["/etc/passwd", "../secret", "a\nb", "x/../../y"] {
            assert!(!valid_arg(bad), "{bad:?}");
        }
        assert!(valid_file_name("report.csv"));
        for bad in ["", ".hidden", "../x", "a/b", "a b"] {
            assert!(!valid_file_name(bad), "{bad:?}");
        }
        assert!(
            valid_media_type("text/csv") && !valid_media_type("text") && !valid_media_type("a/b/c")
        );
    }

    #[test]
    fn run_request_refuses_unknown_fields() {
        let ok = r#"{"request_id":"r","task":"t","inputs":[],"code":"x"}"#;
        assert!(serde_json::from_str::<RunRequest>(ok).is_ok());
        for extra in [
            r#""mounts":[]"#,
            r#""limits":{"seconds":1}"#,
            r#""network":"allow""#,
            r#""image_digest":"x""#,
            r#""source":"/etc""#,
        ] {
            let s = format!(r#"{{"request_id":"r","task":"t","inputs":[],{extra}}}"#);
            assert!(serde_json::from_str::<RunRequest>(&s).is_err(), "{extra}");
        }
    }

    #[test]
    fn problems_have_stable_types() {
        let p = ApiError::unauthorized().problem();
        assert_eq!(p.type_, "https://agentjail.dev/problems/unauthorized");
        assert_eq!(p.status, 401);
        let p = ApiError::internal().problem();
        assert!(!p.detail.contains('/'), "no internal detail: {}", p.detail);
    }

    #[test]
    fn openapi_is_3_1_with_every_path() {
        let doc = serde_json::to_value(openapi()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        for p in [
            "/v1/inputs",
            "/v1/runs",
            "/v1/runs/{request_id}",
            "/v1/tasks",
            "/healthz",
            "/metrics",
        ] {
            assert!(doc["paths"][p].is_object(), "{p}");
        }
        assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
    }
}
