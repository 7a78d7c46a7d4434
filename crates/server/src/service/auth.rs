//! Authentication: a bearer token checked against the configured hashes, failures counted
//! and audited; a refusal audited and counted ([`deny`]).

use std::time::Duration;

use super::failure::*;
use crate::app::AppState;
pub use crate::policy::{Caller, Refusal};
use crate::storage::audit::Event;

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
                state.store().audit(ev).await;
            }
            None
        }
    }
}

/// Writes pending authentication failures once their window has passed.
pub(crate) fn spawn_auth_failure_flusher(state: AppState) {
    tokio::spawn(async move {
        let window = Duration::from_secs(state.inner.config.server.auth_failure_audit_seconds);
        loop {
            tokio::time::sleep(window.min(Duration::from_secs(1))).await;
            if let Some(ev) = state.inner.auth_failures.flush(window) {
                state.store().audit(ev).await;
            }
        }
    });
}

/// Records a refusal: counted by its code, audited as a denial (`reason` = `code: detail`).
pub(crate) async fn deny(state: &AppState, caller: &Caller, mut ev: Event, r: Refusal) -> Failure {
    metrics::counter!("agentjail_denials_total", "reason" => r.code()).increment(1);
    ev.decision = Some("deny");
    ev.reason = Some(r.to_string());
    if ev.actor.is_none() {
        ev.actor = Some(caller.actor.clone());
        ev.tenant = Some(caller.tenant.clone());
    }
    state.store().audit(ev).await;
    Failure::Refused(r)
}
