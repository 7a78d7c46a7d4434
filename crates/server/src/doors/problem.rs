//! RFC 9457 problem details: the error form of the HTTP API ([`super::api`], its sessions'
//! routes in [`super::sessions_api`]) and of a worker's endpoint ([`super::worker_http`]), and
//! the HTTP status of each refusal of the service.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::service::{Failure, Refusal};

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
    pub(crate) fn new(
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
    pub(crate) fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Unauthorized",
            "a valid bearer token is required",
        )
    }
    pub(crate) fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid-request",
            "Invalid request",
            detail,
        )
    }
    pub(crate) fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", "Not found", detail)
    }
    /// The answer of a router's `method_not_allowed_fallback` (problem+json, like every error).
    pub(crate) fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "Method not allowed",
            "this endpoint does not take this method",
        )
    }
    pub(crate) fn internal() -> Self {
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

/// The HTTP status and problem title of each refusal (the problem's `type` is its code).
fn http_status(r: &Refusal) -> (StatusCode, &'static str) {
    use Refusal::*;
    match r {
        BadRequestId
        | CodeRequired
        | CodeTooLarge { .. }
        | TooManyArgs { .. }
        | BadArg { .. }
        | BadInputId { .. }
        | BadFileName
        | BadMediaType
        | Malformed(_) => (StatusCode::BAD_REQUEST, "Invalid request"),
        UnknownTask => (StatusCode::NOT_FOUND, "Unknown task"),
        TaskNotPermitted
        | CodeNotAccepted
        | NotOperator
        | ListOtherTenant
        | NotYourRun
        | StreamNotShown { .. }
        | TaskGone
        | RetryWithNetwork => (StatusCode::FORBIDDEN, "Forbidden by policy"),
        NoSuchInput { .. } | NoSuchRun => (StatusCode::NOT_FOUND, "Not found"),
        InputCount { .. } | InputMediaType { .. } | InputTooLarge { .. } => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "Inputs do not match the task",
        ),
        RequestIdConflict => (StatusCode::CONFLICT, "request_id already used"),
        Overloaded => (StatusCode::TOO_MANY_REQUESTS, "Too many runs"),
        UploadTooLarge { .. } | RequestTooLarge { .. } => {
            (StatusCode::PAYLOAD_TOO_LARGE, "Payload too large")
        }
        OutputsExpired => (StatusCode::GONE, "Deleted by retention"),
        NoArtifact { .. } => (StatusCode::CONFLICT, "No verified artifact"),
        NoReceipt { .. } => (StatusCode::CONFLICT, "No receipt"),
        NoLog { .. } => (StatusCode::CONFLICT, "No log"),
        LogsExpired => (StatusCode::GONE, "Deleted by retention"),
        NotCancellable { .. } => (StatusCode::CONFLICT, "Not cancellable"),
        NotUnknown { .. }
        | ReconcileLost { .. }
        | InputExpired
        | CodeNotKept
        | NoManifestDigest => (StatusCode::CONFLICT, "Not reconcilable"),
        TaskChanged { .. } => (StatusCode::CONFLICT, "Task changed"),
        NotJson => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "Unsupported media type"),
        NoSuchSession | NoSuchCell => (StatusCode::NOT_FOUND, "Not found"),
        NotASessionTask => (StatusCode::FORBIDDEN, "Forbidden by policy"),
        CellInProgress { .. } => (StatusCode::CONFLICT, "A cell is in progress"),
        SessionClosed => (StatusCode::CONFLICT, "Session ended"),
        SessionExpired => (StatusCode::CONFLICT, "Session expired"),
        SessionFull { .. } => (StatusCode::CONFLICT, "Session cell limit"),
        CheckpointInvalid(_) => (StatusCode::CONFLICT, "Checkpoint refused"),
        CheckpointGone { .. } => (StatusCode::GONE, "Checkpoint deleted"),
        SessionsUnsupported => (StatusCode::NOT_IMPLEMENTED, "Not implemented"),
    }
}

impl From<Failure> for ApiError {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Internal => ApiError::internal(),
            Failure::Unavailable => ApiError {
                retry_after: Some(5),
                ..Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "Service unavailable",
                    "the service's database cannot be reached right now; retry later",
                )
            },
            Failure::Refused(r) => {
                let (status, title) = http_status(&r);
                ApiError {
                    status,
                    slug: r.code(),
                    title,
                    detail: r.detail(),
                    retry_after: r.retry_after(),
                }
            }
        }
    }
}

/// `s` on one line, at most 300 characters (a parser's message in a problem's detail).
pub(crate) fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ").chars().take(300).collect()
}
