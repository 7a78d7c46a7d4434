//! The transports: stdio (`agentjail mcp`, one configured actor; newline-delimited JSON-RPC
//! with bounded lines) and Streamable HTTP at `/mcp` (sessions bound to the authenticated
//! actor, bounded in number).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::catalogue::probe_runtimes;
use super::roots::InputRoot;
use super::server::*;
use crate::app::AppState;
use crate::service::{self, Caller};
use crate::storage::audit::Event;

/// Options of `agentjail mcp` (stdio).
#[derive(Debug, Clone, Default)]
pub struct McpOptions {
    /// Configuration file; None: the built-in example, whose `dev` actor then accepts the
    /// given token (local development only).
    pub config: Option<std::path::PathBuf>,
    pub data_dir: Option<std::path::PathBuf>,
    pub tenant: String,
    pub actor: String,
    /// The bearer token (from `--token-file` or `AGENTJAIL_TOKEN`; never an argument).
    pub token: String,
    pub allow_degraded: bool,
    /// Host directories from which `upload_input` may read a file by `path` (`--input-root`).
    pub input_roots: Vec<std::path::PathBuf>,
}

/// Runs the MCP server over stdio until the client closes it. Stdout carries only the
/// protocol; every log line goes to stderr.
pub fn serve_stdio_blocking(opts: McpOptions) -> Result<(), crate::app::ServerError> {
    use crate::app::ServerError;
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AGENTJAIL_LOG")
                // rmcp logs messages (with their content) at info and debug: keep it quiet.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn")),
        )
        .try_init();
    let mut config = match &opts.config {
        Some(p) => crate::config::Config::load(p)?,
        None => {
            let mut c = crate::config::Config::example()?;
            if let Some(a) = c.actors.get_mut("dev") {
                a.token_sha256 = crate::config::sha256_hex(opts.token.as_bytes());
            }
            c
        }
    };
    if let Some(d) = &opts.data_dir {
        config.server.data_dir = Some(d.clone());
    }
    let roots = opts
        .input_roots
        .iter()
        .map(|d| InputRoot::open(d).map_err(|e| ServerError::Io(format!("--input-root {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let crate::app::Launch {
        data_dir,
        runner,
        allow_degraded,
        rt,
    } = crate::app::Launch::resolve(&config, opts.allow_degraded, "mcp")?;
    // Before serving, so that tools/list does not wait for it.
    probe_runtimes(
        &config,
        &crate::images::Sandboxed {
            runner: runner.clone(),
            store: crate::images::store_dir(&config.server, &data_dir),
            allow_degraded,
        },
    );
    rt.block_on(async move {
        use rmcp::ServiceExt;
        let state = AppState::open(config, &data_dir, runner, allow_degraded)?;
        crate::execution::runner::spawn_sweeper(state.clone());
        // On PostgreSQL the runs this process accepts are queued; it executes them too.
        let _fleet = crate::execution::fleet::start(&state, Vec::new());
        let caller = service::authenticate(&state, Some(&opts.token), "mcp stdio".into())
            .await
            .ok_or_else(|| ServerError::Io("the token matches no configured actor".into()))?;
        if caller.actor != opts.actor || caller.tenant != opts.tenant {
            // Counted and audited like any authentication failure.
            metrics::counter!("agentjail_auth_failures_total").increment(1);
            state
                .store()
                .audit(Event {
                    event: "auth_failure",
                    decision: Some("deny"),
                    reason: Some("token belongs to another actor or tenant".into()),
                    route: Some("mcp stdio".into()),
                    ..Default::default()
                })
                .await;
            return Err(ServerError::Io(format!(
                "the token does not belong to actor `{}` of tenant `{}`",
                opts.actor, opts.tenant
            )));
        }
        tracing::info!(actor = %caller.actor, tenant = %caller.tenant, data_dir = %state.data_dir().display(), "agentjail mcp: serving over stdio");
        if !roots.is_empty() {
            let dirs: Vec<String> = roots.iter().map(|r| r.path.display().to_string()).collect();
            tracing::info!(roots = ?dirs, "agentjail mcp: inputs may be named by path below these directories");
        }
        let server = McpServer::for_caller(state.clone(), caller).with_input_roots(roots);
        let s = &state.inner.config.server;
        let max_line =
            (s.max_input_bytes as usize).saturating_mul(4) / 3 + s.max_request_bytes as usize;
        let (transport, writer) = framed_stdio(max_line);
        let running = server
            .serve(transport)
            .await
            .map_err(|e| ServerError::Io(format!("mcp: {e}")))?;
        let quit = running.waiting().await;
        // Let the last responses reach stdout.
        let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
        tracing::info!(?quit, "agentjail mcp: client closed the session");
        // Runs of calls still in flight were cancelled with the session; wait (bounded) until
        // they are recorded, so none is left `running` for the next start to mark `unknown`.
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while state
            .inner
            .admitted
            .load(std::sync::atomic::Ordering::Acquire)
            > 0
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    })
}

/// Stdio with framing errors answered: rmcp ignores a line that is not JSON and drops an
/// over-long one silently, so the client would wait until its own timeout. Here each stdin line
/// is read with a bound; a line over `max_line` bytes or one that is not JSON gets the JSON-RPC
/// parse error (-32700) on stdout, and only well-formed lines reach rmcp. Stdout carries rmcp's
/// messages and these errors, whole lines only.
pub(super) fn framed_stdio(
    max_line: usize,
) -> (
    (tokio::io::DuplexStream, tokio::io::DuplexStream),
    tokio::task::JoinHandle<()>,
) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let (mut to_rmcp, rmcp_in) = tokio::io::duplex(64 * 1024);
    let (rmcp_out, from_rmcp) = tokio::io::duplex(64 * 1024);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    let errors = tx.clone();
    // rmcp's stdio handles: non-blocking on Linux pipes, so a pending read never holds up the
    // runtime's shutdown (tokio's own stdin reads on a thread that cannot be cancelled).
    let (stdin, mut out) = rmcp::transport::stdio_pipes();
    tokio::spawn(async move {
        let mut r = BufReader::new(stdin);
        let mut line = Vec::new();
        let mut oversized = false;
        while let Ok(buf) = r.fill_buf().await {
            if buf.is_empty() {
                break;
            }
            let (chunk, end) = match buf.iter().position(|b| *b == b'\n') {
                Some(i) => (&buf[..=i], true),
                None => (buf, false),
            };
            let n = chunk.len();
            if !oversized {
                if line.len() + n > max_line.saturating_add(1) {
                    oversized = true;
                    line = Vec::new();
                } else {
                    line.extend_from_slice(chunk);
                }
            }
            r.consume(n);
            if !end {
                continue;
            }
            let bad = oversized || {
                let t = line.trim_ascii();
                !t.is_empty() && serde_json::from_slice::<serde::de::IgnoredAny>(t).is_err()
            };
            if bad {
                tracing::warn!(
                    oversized,
                    "mcp stdio: a line that is not a JSON message was answered with -32700"
                );
                let mut e = if oversized {
                    let mut v = parse_error();
                    v["error"]["message"] = json!(format!(
                        "Parse error: the line exceeds the limit of {max_line} bytes"
                    ));
                    v.to_string().into_bytes()
                } else {
                    parse_error().to_string().into_bytes()
                };
                e.push(b'\n');
                if errors.send(e).await.is_err() {
                    break;
                }
            } else if to_rmcp.write_all(&line).await.is_err() {
                break;
            }
            line.clear();
            oversized = false;
        }
        let _ = to_rmcp.shutdown().await;
    });
    tokio::spawn(async move {
        let mut lines = BufReader::new(from_rmcp);
        loop {
            let mut l = Vec::new();
            match lines.read_until(b'\n', &mut l).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if tx.send(l).await.is_err() {
                        break;
                    }
                }
            }
        }
    });
    let writer = tokio::spawn(async move {
        while let Some(l) = rx.recv().await {
            if out.write_all(&l).await.is_err() || out.flush().await.is_err() {
                break;
            }
        }
    });
    ((rmcp_in, rmcp_out), writer)
}

/// The `/mcp` Streamable HTTP service for `agentjail serve`. [`crate::router`] puts it behind
/// the bearer-authentication layer (outermost), so the caller is known here.
pub(crate) fn http_router(state: &AppState) -> axum::Router<AppState> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
    let s = &state.inner.config.server;
    let hosts = s
        .mcp_allowed_hosts
        .clone()
        .unwrap_or_else(|| vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]);
    let mut origins = s.mcp_allowed_origins.clone();
    if s.mcp_allowed_hosts.is_none() {
        // A loopback server accepts loopback origins (any port), as the MCP spec's DNS-rebinding
        // guidance and the conformance suite's `dns-rebinding-protection` scenario require: a
        // page on a rebound foreign name carries that name as its Origin and is refused.
        for host in ["localhost", "127.0.0.1", "[::1]"] {
            for scheme in ["http", "https"] {
                origins.push(format!("{scheme}://{host}:*"));
            }
        }
    }
    // Room for an upload as base64 plus the JSON around it.
    let body = (s.max_input_bytes as usize).saturating_mul(4) / 3 + s.max_request_bytes as usize;
    let cfg = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_allowed_origins(origins)
        // Any other Origin header is refused: browsers on other sites cannot drive the
        // endpoint (and still need a bearer token).
        .enforce_origin_validation()
        .with_max_request_body_bytes(body);
    let i = &state.inner;
    probe_runtimes(
        &i.config,
        &crate::images::Sandboxed {
            runner: i.runner.clone(),
            store: crate::images::store_dir(&i.config.server, &i.data_dir),
            allow_degraded: i.allow_degraded,
        },
    );
    let st = state.clone();
    let manager = Arc::new(LocalSessionManager::default());
    let svc = StreamableHttpService::new(
        move || Ok(McpServer::for_http(st.clone())),
        manager.clone(),
        cfg,
    );
    let owners = Sessions {
        state: state.clone(),
        manager,
        max_body: body,
        owners: Arc::new(std::sync::Mutex::new(std::collections::HashMap::new())),
    };
    axum::Router::new()
        .route_service("/mcp", svc)
        // Inner layer: runs after authentication, so the caller is known.
        .layer(axum::middleware::from_fn_with_state(owners, bind_session))
}

/// The JSON-RPC parse error (-32700), for input that is not JSON (or not a line within the limit).
pub(super) fn parse_error() -> Value {
    json!({"jsonrpc": "2.0", "id": null,
           "error": {"code": -32700, "message": "Parse error: the message is not valid JSON"}})
}

/// Upper bound on live HTTP sessions whose owner is remembered; a new session beyond it is
/// refused (503) rather than left unbound.
pub(super) const MAX_SESSIONS: usize = 10_000;

/// Which actor created each Streamable HTTP session (`Mcp-Session-Id`).
#[derive(Clone)]
pub(super) struct Sessions {
    state: AppState,
    max_body: usize,
    manager: Arc<rmcp::transport::streamable_http_server::session::local::LocalSessionManager>,
    owners: Arc<std::sync::Mutex<std::collections::HashMap<String, (String, String)>>>,
}

/// Binds each MCP session to the actor (bearer token identity) that created it. A request
/// naming a session that another actor created is answered exactly like one naming an unknown
/// session (404), so that a session id is never confirmed to someone else, and audited as
/// `mcp_session_refused` with the real caller. This covers POST (requests, responses and
/// notifications such as `notifications/cancelled`), GET (the event stream) and DELETE.
pub(super) async fn bind_session(
    axum::extract::State(s): axum::extract::State<Sessions>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    const HEADER: &str = "mcp-session-id";
    let Some(caller) = req.extensions().get::<Caller>().cloned() else {
        // Unreachable behind the authentication layer; refuse rather than guess.
        return (axum::http::StatusCode::UNAUTHORIZED, "not authenticated").into_response();
    };
    let method = req.method().clone();
    // A POST body that is not JSON gets the JSON-RPC parse error (-32700) with 400, not the
    // transport's 415 "fail to deserialize".
    let req = if method == axum::http::Method::POST {
        let (parts, body) = req.into_parts();
        let bytes = match axum::body::to_bytes(body, s.max_body).await {
            Ok(b) => b,
            Err(_) => {
                return (
                    axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                    "Payload Too Large: the request body exceeds the limit",
                )
                    .into_response();
            }
        };
        if serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_err() {
            return (
                axum::http::StatusCode::BAD_REQUEST,
                axum::Json(parse_error()),
            )
                .into_response();
        }
        axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes))
    } else {
        req
    };
    let route = format!("{method} /mcp");
    let audit = |event: &'static str, decision: Option<&'static str>, reason: &str| {
        let mut ev = caller.event(event);
        ev.route = Some(route.clone());
        ev.decision = decision;
        ev.reason = Some(reason.into());
        ev
    };
    let not_found = || {
        (
            axum::http::StatusCode::NOT_FOUND,
            "Not Found: Session not found",
        )
            .into_response()
    };
    let sid = match req.headers().get_all(HEADER).iter().count() {
        0 => None,
        1 => match req.headers().get(HEADER).and_then(|v| v.to_str().ok()) {
            Some(v) => Some(v.to_string()),
            None => return not_found(),
        },
        // Two session ids are ambiguous: refuse.
        _ => {
            return (
                axum::http::StatusCode::BAD_REQUEST,
                "Bad Request: more than one Mcp-Session-Id header",
            )
                .into_response();
        }
    };
    let Some(sid) = sid else {
        // No session yet: an `initialize` POST. Remember who created the session it opens.
        if s.owners.lock().map(|m| m.len()).unwrap_or(usize::MAX) >= MAX_SESSIONS {
            s.prune().await;
        }
        if s.owners.lock().map(|m| m.len()).unwrap_or(usize::MAX) >= MAX_SESSIONS {
            return (
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "Service Unavailable: too many MCP sessions",
            )
                .into_response();
        }
        let resp = next.run(req).await;
        if let Some(new) = resp.headers().get(HEADER).and_then(|v| v.to_str().ok()) {
            if let Ok(mut m) = s.owners.lock() {
                m.insert(
                    new.to_string(),
                    (caller.actor.clone(), caller.tenant.clone()),
                );
            }
            s.state
                .store()
                .audit(audit("mcp_session", Some("allow"), "opened"))
                .await;
        }
        return resp;
    };
    let owner = s.owners.lock().ok().and_then(|m| m.get(&sid).cloned());
    match owner {
        Some((actor, tenant)) if actor == caller.actor && tenant == caller.tenant => {}
        Some(_) => {
            metrics::counter!("agentjail_mcp_session_refusals_total").increment(1);
            tracing::warn!(actor = %caller.actor, tenant = %caller.tenant, %method, "MCP request for a session of another actor refused");
            s.state
                .store()
                .audit(audit(
                    "mcp_session_refused",
                    Some("deny"),
                    "the session belongs to another actor",
                ))
                .await;
            return not_found();
        }
        None => {
            // Unknown (or expired) to us: the same answer as the transport gives, audited too.
            s.state
                .store()
                .audit(audit(
                    "mcp_session_refused",
                    Some("deny"),
                    "unknown session",
                ))
                .await;
            return not_found();
        }
    }
    let delete = method == axum::http::Method::DELETE;
    let resp = next.run(req).await;
    if delete && resp.status().is_success() {
        if let Ok(mut m) = s.owners.lock() {
            m.remove(&sid);
        }
        s.state
            .store()
            .audit(audit("mcp_session", Some("allow"), "closed"))
            .await;
    }
    resp
}

impl Sessions {
    /// Forgets the owners of sessions the transport no longer has (expired or closed).
    async fn prune(&self) {
        use rmcp::transport::streamable_http_server::session::SessionManager;
        let ids: Vec<String> = match self.owners.lock() {
            Ok(m) => m.keys().cloned().collect(),
            Err(_) => return,
        };
        for id in ids {
            let sid: rmcp::transport::common::server_side_http::SessionId = id.as_str().into();
            if !self.manager.has_session(&sid).await.unwrap_or(false)
                && let Ok(mut m) = self.owners.lock()
            {
                m.remove(&id);
            }
        }
    }
}
