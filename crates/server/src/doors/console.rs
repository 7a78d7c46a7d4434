//! The operator console at `/console`: a few static files embedded in the binary (plain ES
//! modules and CSS, no build step, nothing fetched from elsewhere) and the JSON routes they
//! call, under `/console/api/`, for operators only.
//!
//! Security (docs/console.md): an operator logs in with its API token (`POST /console/login`);
//! a tenant's token is refused (and audited). The login makes a server-side session, named by
//! a random id in a cookie `HttpOnly; SameSite=Strict; Path=/console` (`Secure` when the
//! request came over TLS, as a TLS-terminating proxy says with `X-Forwarded-Proto: https`),
//! with a bounded lifetime ([`SESSION_SECONDS`], idle [`IDLE_SECONDS`]). Every console route
//! but the static files and the login needs a live session; a bearer token is not accepted
//! there. Every state-changing request (`POST`) must carry the session's synchronizer token
//! (`X-CSRF-Token`) and come from this origin (`Origin` is this host, `Sec-Fetch-Site` is
//! `same-origin` when sent). Every console response carries a strict Content-Security-Policy,
//! `nosniff`, `no-store` and `frame-ancestors 'none'`. Actions go through the same service
//! functions as the API's and are audited like them; logins and logouts are audited too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{Next, from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::problem::ApiError;
use crate::app::AppState;
use crate::policy::Caller;
use crate::run_state::RunState;
use crate::service::{self, ListQuery, ReconcileAction};

/// A session's longest life, whatever its use.
pub const SESSION_SECONDS: u64 = 8 * 3600;
/// A session unused this long ends.
pub const IDLE_SECONDS: u64 = 30 * 60;
/// Most sessions held at once (the oldest goes first).
const MAX_SESSIONS: usize = 1024;
/// The session cookie's name.
pub const COOKIE: &str = "agentjail_console";
/// The Content-Security-Policy of every console response.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

const INDEX: &str = include_str!("console/index.html");
const APP_JS: &str = include_str!("console/app.js");
const STYLE: &str = include_str!("console/style.css");

/// A logged-in operator.
#[derive(Clone)]
struct Session {
    caller: Caller,
    csrf: String,
    created: Instant,
    used: Instant,
}

#[derive(Default)]
struct Sessions(Mutex<HashMap<String, Session>>);

impl Sessions {
    fn live(s: &Session, now: Instant) -> bool {
        now.duration_since(s.created) < Duration::from_secs(SESSION_SECONDS)
            && now.duration_since(s.used) < Duration::from_secs(IDLE_SECONDS)
    }

    fn insert(&self, id: String, s: Session) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        m.retain(|_, s| Self::live(s, now));
        while m.len() >= MAX_SESSIONS {
            let Some(oldest) = m
                .iter()
                .min_by_key(|(_, s)| s.created)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            m.remove(&oldest);
        }
        m.insert(id, s);
    }

    /// The live session `id`, touched; an expired one is removed.
    fn get(&self, id: &str) -> Option<Session> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match m.get_mut(id) {
            Some(s) if Self::live(s, now) => {
                s.used = now;
                Some(s.clone())
            }
            Some(_) => {
                m.remove(id);
                None
            }
            None => None,
        }
    }

    fn remove(&self, id: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }
}

/// Constant-time equality of two secrets.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn cookie_value(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

fn forbidden(detail: &str) -> Response {
    ApiError::new(StatusCode::FORBIDDEN, "forbidden", "Forbidden", detail).into_response()
}

fn no_session() -> Response {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "console-login",
        "Not logged in",
        "log in to the console with an operator's token",
    )
    .into_response()
}

/// Whether a state-changing request comes from this origin: `Sec-Fetch-Site` (when sent) is
/// `same-origin`, and `Origin` (when sent; a browser sends it on every POST) names this host.
fn same_origin(headers: &HeaderMap) -> bool {
    let site = headers
        .get("sec-fetch-site")
        .map(|v| v.as_bytes() == b"same-origin");
    if site == Some(false) {
        return false;
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        // A browser sends Origin with every POST; a request without either header is not
        // from a browser (a cross-site form cannot leave both out).
        return site == Some(true) || headers.get("sec-fetch-site").is_none();
    };
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let origin = origin.to_str().unwrap_or("");
    !host.is_empty()
        && origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            == Some(host)
}

/// The headers of every console response.
async fn secure_headers(req: Request, next: Next) -> Response {
    let mut r = next.run(req).await;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("same-origin"),
    );
    r
}

/// The session check of `/console/api/*`: a live session (the cookie), and for a `POST` its
/// synchronizer token and this origin. Puts the operator's [`Caller`] and the session id into
/// the request.
async fn require_session(
    Extension(sessions): Extension<Arc<Sessions>>,
    mut req: Request,
    next: Next,
) -> Response {
    let Some(id) = cookie_value(req.headers()) else {
        return no_session();
    };
    let Some(s) = sessions.get(&id) else {
        return no_session();
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        if !same_origin(req.headers()) {
            return forbidden("a console action must come from the console's own origin");
        }
        let token = req
            .headers()
            .get("x-csrf-token")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !same(token, &s.csrf) {
            return forbidden("the console action has no valid CSRF token");
        }
    }
    req.extensions_mut().insert(s.caller.clone());
    req.extensions_mut().insert(SessionId(id));
    next.run(req).await
}

#[derive(Clone)]
struct SessionId(String);

fn asset(body: &'static str, ctype: &'static str) -> Response {
    let mut r = body.into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Login {
    token: String,
}

/// `POST /console/login`: an operator's token makes a session; anything else is refused.
async fn login(
    State(state): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    body: Option<Json<Login>>,
) -> Response {
    if !same_origin(&headers) {
        return forbidden("the console login must come from the console's own origin");
    }
    let Some(Json(body)) = body else {
        return ApiError::bad_request("expected {\"token\": \"...\"}").into_response();
    };
    let route = "POST /console/login".to_string();
    let Some(caller) = service::authenticate(&state, Some(&body.token), route).await else {
        return ApiError::unauthorized().into_response();
    };
    let mut ev = caller.event("console_login");
    ev.route = Some("POST /console/login".into());
    if !caller.operator {
        ev.decision = Some("deny");
        ev.reason = Some("not an operator".into());
        state.store().audit(ev).await;
        return forbidden("the console is for operators; this token is not an operator's");
    }
    let (Ok(id), Ok(csrf)) = (crate::util::random_hex(32), crate::util::random_hex(32)) else {
        return ApiError::internal().into_response();
    };
    ev.decision = Some("allow");
    state.store().audit(ev).await;
    let now = Instant::now();
    sessions.insert(
        id.clone(),
        Session {
            caller: caller.clone(),
            csrf: csrf.clone(),
            created: now,
            used: now,
        },
    );
    let tls = headers
        .get("x-forwarded-proto")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"));
    let cookie = format!(
        "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/console; Max-Age={SESSION_SECONDS}{}",
        if tls { "; Secure" } else { "" }
    );
    let mut r = Json(json!({"actor": caller.actor, "csrf": csrf})).into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// `GET /console/api/session`: who is logged in, and the session's CSRF token (readable by
/// this origin's script only: no cross-origin read is allowed).
async fn session_info(
    Extension(sessions): Extension<Arc<Sessions>>,
    Extension(SessionId(id)): Extension<SessionId>,
) -> Response {
    match sessions.get(&id) {
        Some(s) => Json(json!({"actor": s.caller.actor, "csrf": s.csrf})).into_response(),
        None => no_session(),
    }
}

async fn logout(
    State(state): State<AppState>,
    Extension(sessions): Extension<Arc<Sessions>>,
    Extension(SessionId(id)): Extension<SessionId>,
    Extension(caller): Extension<Caller>,
) -> Response {
    sessions.remove(&id);
    let mut ev = caller.event("console_logout");
    ev.route = Some("POST /console/api/logout".into());
    state.store().audit(ev).await;
    let mut r = StatusCode::NO_CONTENT.into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "agentjail_console=; HttpOnly; SameSite=Strict; Path=/console; Max-Age=0",
        ),
    );
    r
}

/// The operator, on a run of `tenant`: an operator lists every tenant's runs, but reads one
/// and reconciles it in its own tenant only (as the API: `operator` "may reconcile runs of its
/// tenant"); another tenant's is refused.
fn as_operator_of(caller: &Caller, tenant: &str) -> Result<Caller, ApiError> {
    if tenant != caller.tenant {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "Forbidden",
            "an operator reads and reconciles the runs of its own tenant only",
        ));
    }
    Ok(caller.clone())
}

async fn runs(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    Ok(Json(service::list(&state, &caller, &q).await?).into_response())
}

/// How long one live stream of the runs list lasts before the browser reconnects (and its
/// session is checked again).
const RUNS_EVENTS_FOR: Duration = Duration::from_secs(300);
/// At most one `changed` event in this time: a burst of runs reloads the list once.
const RUNS_EVENTS_EVERY: Duration = Duration::from_millis(500);

/// The runs list's live updates, as Server-Sent Events: `changed` (no data) when a run is
/// registered on this node, marked started or ends, at most one every 500 ms; the page then
/// reads the list again. It holds one of the followers' places (`503` when they are all
/// taken) and ends after 5 minutes (the browser reconnects, its session checked again). Runs
/// executing on other nodes of a fleet are not seen here: the page also reads the list every
/// 10 s while the stream is open.
async fn runs_events(State(state): State<AppState>) -> Result<Response, ApiError> {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let Ok(permit) = state.inner.followers.clone().try_acquire_owned() else {
        return Err(ApiError::from(service::Failure::Unavailable));
    };
    let until = tokio::time::Instant::now() + RUNS_EVENTS_FOR;
    let rx = state.inner.news.states();
    let events = futures_util::stream::unfold((rx, permit), move |(mut rx, permit)| async move {
        tokio::time::timeout_at(until, rx.changed())
            .await
            .ok()?
            .ok()?;
        tokio::time::sleep(RUNS_EVENTS_EVERY).await;
        rx.borrow_and_update();
        let ev = Event::default().event("changed").data("{}");
        Some((Ok::<_, std::convert::Infallible>(ev), (rx, permit)))
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// Whether a receipt verifies: with this node's key (`trust: "this node"`), or on PostgreSQL
/// with the key that the one node publishing the envelope's key id recorded in the shared
/// database (`trust: "database"`, `signer_node`: the database's word, not a key this node
/// holds: a writer of the database could have put both there). `verifies` null: it could not
/// be checked.
async fn receipt_check(state: &AppState, env: &str) -> Value {
    use agentjail_verify::receipt::{
        ReceiptError, ReceiptKey, VerifiedAny, VerifyingKey, parse_public_key_pem,
    };
    // A run's receipt, or a live session's cell's (which the service signs); never a
    // self-test attestation in a run's place.
    fn check(env: &[u8], key: &VerifyingKey) -> Result<(), ReceiptError> {
        match agentjail_verify::receipt::verify_any_with_key(env, key, &[])? {
            VerifiedAny::Run(_) | VerifiedAny::LiveCell(_) => Ok(()),
            VerifiedAny::Selftest(_) => Err(ReceiptError::BadStatement {
                reason: "a self-test attestation, not a run's receipt".into(),
            }),
        }
    }
    let key = state.inner.data_dir.join("private").join("receipt-key.pem");
    let own = match ReceiptKey::load(&key) {
        Ok(k) => check(env.as_bytes(), &k.verifying_key()),
        Err(e) => return json!({"verifies": null, "error": format!("this node's key: {e}")}),
    };
    let error = match own {
        Ok(_) => return json!({"verifies": true, "trust": "this node"}),
        Err(e) => e.to_string(),
    };
    let Some(q) = &state.inner.queue else {
        return json!({"verifies": false, "error": error});
    };
    // The key id the envelope names (a hint only: the signature decides).
    let keyid = serde_json::from_str::<Value>(env).ok().and_then(|v| {
        v["signatures"][0]["keyid"]
            .as_str()
            .filter(|k| k.len() == 64 && k.bytes().all(|b| b.is_ascii_hexdigit()))
            .map(str::to_owned)
    });
    let Some(keyid) = keyid else {
        return json!({"verifies": false, "error": error});
    };
    let nodes = match q.receipt_keys(&keyid).await {
        Ok(n) => n,
        Err(e) => {
            return json!({"verifies": null, "error": format!("{error}; the other nodes' keys could not be read: {e}")});
        }
    };
    match nodes.as_slice() {
        [] => {
            json!({"verifies": false, "error": format!("{error}; no node published key {keyid}")})
        }
        [(node, pem)] => match parse_public_key_pem(pem).and_then(|k| check(env.as_bytes(), &k)) {
            Ok(_) => json!({"verifies": true, "trust": "database", "signer_node": node}),
            Err(e) => {
                json!({"verifies": false, "error": format!("{error}; nor with the key node {node:?} published: {e}")})
            }
        },
        more => {
            json!({"verifies": false, "error": format!("{error}; {} nodes published key {keyid}: none is taken", more.len())})
        }
    }
}

/// One run as the console shows it: the API's record, and whether its receipt verifies with
/// this node's key or another node's.
async fn run(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((tenant, request_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let caller = as_operator_of(&caller, &tenant)?;
    let r = service::get(&state, &caller, &request_id, "run_read").await?;
    let receipt = match r.receipt.as_deref() {
        Some(env) => Some(receipt_check(&state, env).await),
        None => None,
    };
    let mut v = serde_json::to_value(service::view(&state, &r)).unwrap_or(Value::Null);
    v["tenant"] = json!(r.tenant);
    v["receipt_check"] = receipt.unwrap_or(Value::Null);
    Ok(Json(v).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReconcileBody {
    action: ReconcileAction,
}

async fn reconcile(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((tenant, request_id)): Path<(String, String)>,
    body: Option<Json<ReconcileBody>>,
) -> Result<Response, ApiError> {
    let caller = as_operator_of(&caller, &tenant)?;
    let Some(Json(body)) = body else {
        return Err(ApiError::bad_request(
            "expected {\"action\": \"retry\" | \"abandon\"}",
        ));
    };
    let row = service::reconcile(&state, &caller, &request_id, body.action).await?;
    Ok(Json(service::view(&state, &row)).into_response())
}

/// The `unknown` runs of the operator's tenant, each with what is known about it.
async fn decisions(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    let q = ListQuery {
        status: Some(RunState::Unknown.to_string()),
        limit: Some(service::MAX_PAGE),
        tenant: Some(caller.tenant.clone()),
        ..Default::default()
    };
    let list = service::list(&state, &caller, &q).await?;
    let mut out = Vec::new();
    for s in list.runs {
        let c = as_operator_of(&caller, &s.tenant)?;
        let Ok(r) = service::get(&state, &c, &s.request_id, "run_read").await else {
            continue;
        };
        let task = state.inner.config.tasks.get(&r.task);
        let report: Option<Value> = r
            .report
            .as_deref()
            .and_then(|t| serde_json::from_str(t).ok());
        out.push(json!({
            "tenant": r.tenant,
            "request_id": r.request_id,
            "task": r.task,
            "actor": r.actor,
            "reason": r.reason,
            "created_at": service::ts(r.created_at),
            "started_at": r.started_at.map(service::ts),
            "ended_at": r.finished_at.map(service::ts),
            "job_id": r.job_id,
            "network": task.map(|t| !matches!(t.network, agentjail_manifest::Network::Deny)),
            "connections": report.as_ref().and_then(|v| v.pointer("/network/connections")).cloned(),
            "retry_possible": crate::policy::check_retry(task).is_ok(),
        }));
    }
    Ok(Json(json!({"runs": out})).into_response())
}

/// The sandbox's denials in the most recent runs of the operator's tenant, newest first.
async fn denials(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    let q = ListQuery {
        limit: Some(service::MAX_PAGE),
        tenant: Some(caller.tenant.clone()),
        ..Default::default()
    };
    let list = service::list(&state, &caller, &q).await?;
    let scanned = list.runs.len();
    let mut out = Vec::new();
    for s in list.runs.into_iter().filter(|s| s.status.is_terminal()) {
        let Ok(Some(r)) = state.store().get_run(&s.tenant, &s.request_id).await else {
            continue;
        };
        let Some(report) = r
            .report
            .as_deref()
            .and_then(|t| serde_json::from_str::<Value>(t).ok())
        else {
            continue;
        };
        for d in report["denials"].as_array().into_iter().flatten() {
            out.push(json!({
                "tenant": r.tenant, "task": r.task, "request_id": r.request_id,
                "created_at": service::ts(r.created_at),
                "kind": d["kind"], "detail": d["detail"], "count": d["count"],
            }));
        }
    }
    Ok(Json(json!({"runs_scanned": scanned, "denials": out})).into_response())
}

/// The audit chain's state and its most recent records of the operator's tenant or of no
/// tenant (matching `q`, when given).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuditQuery {
    q: Option<String>,
}

async fn audit(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<AuditQuery>,
) -> Result<Response, ApiError> {
    let needle = q.q.unwrap_or_default().to_lowercase();
    let tenant = caller.tenant.to_string();
    // On PostgreSQL every node's chain is in the database; each is verified with the
    // cross-anchors between them, as `agentjail audit verify --database` does.
    if let Some(queue) = &state.inner.queue {
        let (verified, records) = pg_audit(queue, needle, tenant).await?;
        return Ok(
            Json(json!({"store": "postgresql", "verified": verified, "records": records}))
                .into_response(),
        );
    }
    let path = state.audit_path();
    let (verified, records) = tokio::task::spawn_blocking(move || {
        let verified = match crate::storage::audit::verify_file_chains(&path) {
            Ok(v) => json!({"ok": true, "records": v.records}),
            Err(e) => json!({"ok": false, "error": e.to_string()}),
        };
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let parsed = text
            .lines()
            .rev()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok());
        (verified, recent(parsed, &needle, &tenant))
    })
    .await
    .map_err(|_| ApiError::internal())?;
    Ok(Json(json!({"store": "file", "verified": verified, "records": records})).into_response())
}

/// How many of the newest records the Audit page searches on PostgreSQL (`agentjail audit
/// export --database` gives every one).
const AUDIT_SEARCHED: usize = 5000;

/// The Audit page on PostgreSQL: every view verifies the whole chain as it is now (a verdict
/// kept from an earlier read would miss a record changed since, which moves no head), one
/// view at a time per node (the others wait); nothing of the chain is kept between views.
async fn pg_audit(
    queue: &crate::storage::pg::PgStore,
    needle: String,
    tenant: String,
) -> Result<(Value, Vec<Value>), ApiError> {
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _turn = ONE_AT_A_TIME.lock().await;
    let lines = match queue.audit_chain().await {
        Ok(l) => l,
        Err(e) => {
            let v = json!({"ok": false, "error": format!("the chain cannot be read: {e}")});
            return Ok((v, Vec::new()));
        }
    };
    tokio::task::spawn_blocking(move || {
        let verified = match crate::storage::audit::verify_chains(
            lines
                .iter()
                .cloned()
                .map(Ok::<_, crate::storage::audit::AuditError>),
        ) {
            Ok(v) => json!({"ok": true, "records": v.records, "chains": v.chains.len()}),
            Err(e) => json!({"ok": false, "error": e.to_string()}),
        };
        let newest = newest_records(lines);
        let parsed = newest
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok());
        (verified, recent(parsed, &needle, &tenant))
    })
    .await
    .map_err(|_| ApiError::internal())
}

/// The newest [`AUDIT_SEARCHED`] of `lines`, newest first by the records' own time (only
/// `ts` is parsed; a record without one counts as oldest).
fn newest_records(lines: Vec<String>) -> Vec<String> {
    #[derive(Deserialize)]
    struct Ts {
        ts: Option<String>,
    }
    let mut order: Vec<(Option<jiff::Timestamp>, usize)> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let ts = serde_json::from_str::<Ts>(l)
                .ok()
                .and_then(|t| t.ts)
                .and_then(|t| t.parse::<jiff::Timestamp>().ok());
            (ts, i)
        })
        .collect();
    order.sort();
    let mut lines: Vec<Option<String>> = lines.into_iter().map(Some).collect();
    order
        .into_iter()
        .rev()
        .take(AUDIT_SEARCHED)
        .filter_map(|(_, i)| lines[i].take())
        .collect()
}

/// The first 200 of `newest_first` that match `needle` (lowercase; empty: all) and belong to
/// `tenant` or to no tenant (the service's own records).
fn recent(newest_first: impl Iterator<Item = Value>, needle: &str, tenant: &str) -> Vec<Value> {
    newest_first
        .filter(|r| needle.is_empty() || r.to_string().to_lowercase().contains(needle))
        .filter(|r| r.get("tenant").is_none_or(|t| t.as_str() == Some(tenant)))
        .take(200)
        .collect()
}

/// The fleet as the PostgreSQL store knows it (executors, their heartbeats and the runs they
/// hold, the leases); one node on SQLite.
async fn fleet(State(state): State<AppState>) -> Result<Response, ApiError> {
    let Some(queue) = &state.inner.queue else {
        return Ok(Json(json!({"store": "sqlite", "workers": [], "leases": []})).into_response());
    };
    let live = Duration::from_secs(state.inner.config.server.lease_seconds * 2);
    let mut v = queue.fleet(live).await.map_err(service::Failure::from)?;
    v["store"] = json!("postgresql");
    Ok(Json(v).into_response())
}

/// What `/healthz` says, and this node's self-test.
async fn health(State(state): State<AppState>) -> Result<Response, ApiError> {
    let db = state.store().ping().await.is_ok();
    let nodes = match &state.inner.queue {
        Some(q) => q
            .fleet(Duration::from_secs(state.inner.config.server.lease_seconds * 2))
            .await
            .ok()
            .and_then(|f| f.get("workers").cloned())
            .map(|ws| {
                ws.as_array()
                    .into_iter()
                    .flatten()
                    .map(|w| json!({"node_id": w["node_id"], "live": w["live"], "facts": w["facts"]}))
                    .collect::<Vec<_>>()
            }),
        None => None,
    };
    Ok(Json(json!({
        "store_ok": db,
        "store": if state.inner.queue.is_some() { "postgresql" } else { "sqlite" },
        "runs_in_flight_or_queued": state.inner.admitted.load(std::sync::atomic::Ordering::Acquire),
        "slots": state.inner.slots,
        "selftest": crate::selftest::status(),
        "version": env!("CARGO_PKG_VERSION"),
        // What `agentjail check` reports on this host (null until read, just after start-up).
        "isolation": crate::node_facts::check(),
        "receipt_key": crate::node_facts::key(),
        "node": state.inner.queue.as_ref().map(|q| q.node().to_owned()),
        // On PostgreSQL, what every node published of itself with its heartbeat.
        "nodes": nodes,
    }))
    .into_response())
}

/// The console's routes, to be merged into the server's router.
pub(crate) fn router(state: &AppState) -> Router<AppState> {
    let sessions = Arc::new(Sessions::default());
    let api = Router::new()
        .route("/console/api/session", get(session_info))
        .route("/console/api/logout", post(logout))
        .route("/console/api/runs", get(runs))
        .route("/console/api/runs/events", get(runs_events))
        .route("/console/api/runs/{tenant}/{request_id}", get(run))
        .route(
            "/console/api/runs/{tenant}/{request_id}/reconcile",
            post(reconcile),
        )
        .route("/console/api/decisions", get(decisions))
        .route("/console/api/denials", get(denials))
        .route("/console/api/audit", get(audit))
        .route("/console/api/fleet", get(fleet))
        .route("/console/api/health", get(health))
        .layer(from_fn(require_session));
    let mut r = Router::new();
    for (path, body, ctype) in [
        ("/console", INDEX, "text/html; charset=utf-8"),
        ("/console/", INDEX, "text/html; charset=utf-8"),
        ("/console/app.js", APP_JS, "text/javascript; charset=utf-8"),
        ("/console/style.css", STYLE, "text/css; charset=utf-8"),
    ] {
        r = r.route(path, get(move || async move { asset(body, ctype) }));
    }
    r.route("/console/login", post(login))
        .merge(api)
        .route(
            "/console/{*rest}",
            axum::routing::any(|| async { ApiError::not_found("no such console page") }),
        )
        .layer(Extension(sessions))
        .layer(DefaultBodyLimit::max(16 * 1024))
        .layer(from_fn_with_state(state.clone(), super::api::bound_body))
        .layer(from_fn(secure_headers))
}
