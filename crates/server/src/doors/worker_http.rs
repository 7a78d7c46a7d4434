//! A worker's own HTTP endpoint (`agentjail worker --listen ADDR`, docs/deploy.md, "The
//! worker's endpoint"): `GET /metrics` (Prometheus text: the runs this worker executed, its
//! slots, its heartbeats, fenced writes, the cluster gauges), `GET /healthz` and
//! `GET /readyz`. Nothing else (404 problem+json). No authentication: it tells nothing about
//! any run's content; bind it to the pod's address for the kubelet and Prometheus only.
//!
//! - `/healthz`: 200 while this worker reaches the database (a `SELECT 1` answered within
//!   [`PING_TIMEOUT`]) and its own heartbeat (its row in `workers`) succeeded within the
//!   lease; else 503 with the reason in one line (problem+json). A worker whose heartbeat is
//!   older than the lease holds no valid lease any more: its runs were already killed.
//! - `/readyz`: the same, and 503 once the worker is draining (SIGTERM: it claims no more and
//!   finishes the runs it holds).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::app::AppState;
use crate::doors::problem::ApiError;
use crate::execution::fleet::NodeStatus;

/// How long `/healthz` waits for the database's answer.
pub const PING_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone)]
struct Probe {
    state: AppState,
    status: Arc<NodeStatus>,
}

/// The worker's router: `/metrics`, `/healthz`, `/readyz`; 404/405 problems otherwise.
pub fn router(state: AppState, status: Arc<NodeStatus>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .with_state(Probe { state, status })
}

/// Why this worker is not healthy, in one line; None: healthy.
async fn unhealthy(p: &Probe) -> Option<String> {
    match tokio::time::timeout(PING_TIMEOUT, p.state.store().ping()).await {
        Err(_) => {
            return Some(format!(
                "the database did not answer within {} s",
                PING_TIMEOUT.as_secs()
            ));
        }
        Ok(Err(e)) => {
            let e = e.to_string();
            let e = e.lines().next().unwrap_or_default();
            return Some(format!("the database is unreachable: {e}"));
        }
        Ok(Ok(())) => {}
    }
    let lease = Duration::from_secs(p.state.inner.config.server.lease_seconds);
    match p.status.heartbeat_age() {
        None => Some("this worker's heartbeat has not succeeded yet".into()),
        Some(age) if age > lease => Some(format!(
            "this worker's last successful heartbeat was {:.1} s ago, longer than the lease ({} s)",
            age.as_secs_f64(),
            lease.as_secs()
        )),
        Some(_) => None,
    }
}

fn unavailable(detail: String) -> Response {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "Service unavailable",
        detail,
    )
    .into_response()
}

fn ok(p: &Probe) -> Response {
    let body = serde_json::json!({
        "status": "ok",
        "slots": p.state.inner.slots,
        "slots_busy": p.status.busy(),
        "draining": p.status.draining(),
    });
    axum::Json(body).into_response()
}

async fn healthz(State(p): State<Probe>) -> Response {
    match unhealthy(&p).await {
        Some(why) => unavailable(why),
        None => ok(&p),
    }
}

async fn readyz(State(p): State<Probe>) -> Response {
    if p.status.draining() {
        return unavailable(format!(
            "draining: claiming no more runs, finishing the {} held",
            p.status.busy()
        ));
    }
    healthz(State(p)).await
}

async fn metrics(State(p): State<Probe>) -> Response {
    let mut r = p.state.inner.metrics.render().into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}
