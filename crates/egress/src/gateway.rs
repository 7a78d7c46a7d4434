//! The proxy itself: accept loop, CONNECT tunnels, plain-HTTP forwarding, redirect checks.
//!
//! This file holds the accept loop, each client connection and its CONNECTs (a tunnel
//! relayed after the SNI check, or TLS terminated for a credentialed host); forwarding one
//! request and checking its redirects is `gateway/forward.rs`, checking a destination and
//! connecting to it `gateway/vet.rs`, and what the connections share `gateway/shared.rs`.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hyper::header::{self, HeaderValue};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use agentjail_manifest::EgressPolicy;

use crate::decision::{Decision, Log, method_name, ms, now_ms, sanitize};
use crate::host::{Host, Target, parse_authority, parse_host};
use crate::intercept::{HostTls, Interception};
use crate::meter::{Budget, Dir, Flow, Meter, MeteredStream};
use crate::ownaddr::OwnAddrs;
use crate::policy::{CompiledPolicy, PolicyError, compile_policy};
use crate::resolve::Resolve;
use crate::sni::{First, check_client_hello, read_client_hello};

mod forward;
mod shared;
mod vet;
use forward::handle_forward;
use shared::{
    ConnCtx, InterceptJob, Job, Pending, RespBody, Shared, TunnelJob, base_decision, empty, lock,
    over_max_requests, record_conn_error, refusal,
};
pub use shared::{DENIED_HEADER, GatewayLimits};
use vet::{recorded_host, target_refusal_status};

/// The egress gateway. Build it with [`Gateway::new`], run it with [`Gateway::serve`].
pub struct Gateway {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("policy", &self.shared.policy)
            .field("limits", &self.shared.limits)
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// Compiles `policy` and prepares a gateway. Nothing is bound or spawned yet.
    pub fn new(
        policy: &EgressPolicy,
        limits: GatewayLimits,
        resolver: Arc<dyn Resolve>,
    ) -> Result<Gateway, PolicyError> {
        let policy = compile_policy(policy)?;
        Ok(Gateway::from_compiled(policy, limits, resolver))
    }

    /// Like [`Gateway::new`], with the credential flow of [`Interception::prepare`]: requests
    /// to credentialed hosts get their secrets, over TLS the gateway terminates.
    pub fn with_credentials(
        policy: &EgressPolicy,
        limits: GatewayLimits,
        resolver: Arc<dyn Resolve>,
        intercept: Option<Interception>,
    ) -> Result<Gateway, PolicyError> {
        let policy = compile_policy(policy)?;
        Ok(Gateway::build(policy, limits, resolver, intercept))
    }

    /// Like [`Gateway::new`] with an already compiled policy.
    pub fn from_compiled(
        policy: CompiledPolicy,
        limits: GatewayLimits,
        resolver: Arc<dyn Resolve>,
    ) -> Gateway {
        Gateway::build(policy, limits, resolver, None)
    }

    fn build(
        policy: CompiledPolicy,
        limits: GatewayLimits,
        resolver: Arc<dyn Resolve>,
        intercept: Option<Interception>,
    ) -> Gateway {
        Gateway {
            shared: Arc::new(Shared {
                policy,
                limits,
                resolver,
                log: Log::default(),
                budget: Arc::new(Budget::new(limits.max_bytes_up, limits.max_bytes_down)),
                requests: AtomicU64::new(0),
                intercept: intercept.map(Arc::new),
                own: OwnAddrs::new(),
            }),
        }
    }

    /// Tells `f` of each refusal as it is made, the first of each distinct method, host, port
    /// and reason, up to [`crate::MAX_REFUSALS`]: what [`Gateway::serve`] returns at the end,
    /// as it happens (the first observer set stays).
    pub fn observe_refusals(&self, f: crate::RefusalObserver) {
        self.shared.log.observe(f);
    }

    /// Serves proxy clients accepted on `listener` until `shutdown` resolves, then closes every
    /// connection and returns the decision log (in the order decisions completed).
    ///
    /// Must be called inside a tokio runtime with the time and I/O drivers enabled.
    pub async fn serve(
        self,
        listener: std::net::TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> Vec<Decision> {
        let shared = self.shared;
        let listener = match listener
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(listener))
        {
            Ok(l) => l,
            Err(e) => {
                shared.log.push(Decision {
                    allowed: false,
                    method: String::new(),
                    host: String::new(),
                    port: 0,
                    address: None,
                    reason: format!("gateway could not use its listening socket: {e}"),
                    bytes_up: 0,
                    bytes_down: 0,
                    started_ms: now_ms(),
                    duration_ms: 0,
                    count: 1,
                });
                return shared.log.take();
            }
        };
        let limits = shared.limits;
        let slots = Arc::new(Semaphore::new(limits.max_concurrent_connections));
        let mut accepted: u64 = 0;
        let mut tasks = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                res = listener.accept() => match res {
                    Ok((stream, _peer)) => {
                        accepted = accepted.saturating_add(1);
                        let permit = if accepted > limits.max_total_connections {
                            Err(format!(
                                "max_total_connections ({}) exceeded",
                                limits.max_total_connections
                            ))
                        } else {
                            slots.clone().try_acquire_owned().map_err(|_| format!(
                                "max_concurrent_connections ({}) reached",
                                limits.max_concurrent_connections
                            ))
                        };
                        match permit {
                            Ok(permit) => {
                                tasks.spawn(serve_conn(shared.clone(), stream, permit));
                            }
                            Err(reason) => {
                            shared.log.push(Decision {
                                allowed: false,
                                method: String::new(),
                                host: String::new(),
                                port: 0,
                                address: None,
                                reason: reason.clone(),
                                bytes_up: 0,
                                bytes_down: 0,
                                started_ms: now_ms(),
                                duration_ms: 0,
                                count: 1,
                            });
                            tasks.spawn(reject_conn(stream, reason));
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "egress gateway accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
        drop(listener);
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        shared.log.take()
    }
}

/// Answers a connection we will not serve with a 503 and closes it.
async fn reject_conn(mut stream: TcpStream, reason: String) {
    let reason = sanitize(&reason, 200);
    let body = format!("agentjail egress gateway: {reason}\n");
    let msg = format!(
        "HTTP/1.1 503 Service Unavailable\r\n{DENIED_HEADER}: {reason}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = stream.write_all(msg.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

async fn serve_conn(
    shared: Arc<Shared>,
    stream: TcpStream,
    _permit: tokio::sync::OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    let limits = shared.limits;
    let deadline = tokio::time::Instant::now() + limits.max_connection_time;
    let ctx = Arc::new(ConnCtx::default());
    let timer = {
        let ctx = ctx.clone();
        async move {
            tokio::time::sleep_until(deadline).await;
            // Set before the connection's futures are dropped, so their decisions say why.
            ctx.timed_out.store(true, Ordering::SeqCst);
        }
    };
    tokio::pin!(timer);
    let svc = {
        let shared = shared.clone();
        let ctx = ctx.clone();
        service_fn(move |req| handle(shared.clone(), ctx.clone(), req))
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.max_connection_time.min(Duration::from_secs(30)))
        .max_header_size(limits.max_header_bytes.max(1024))
        .half_close(false);
    let conn = builder
        .serve_connection(TokioIo::new(stream), svc)
        .with_upgrades();
    tokio::select! {
        res = conn => {
            if let Err(e) = res {
                record_conn_error(&shared, &e);
            }
        }
        () = &mut timer => return,
    }
    let job = match ctx.tunnel.lock() {
        Ok(mut g) => g.take(),
        Err(p) => p.into_inner().take(),
    };
    match job {
        Some(Job::Tunnel(job)) => {
            tokio::select! {
                () = run_tunnel(job) => {}
                () = &mut timer => {}
            }
        }
        Some(Job::Intercept(job)) => {
            tokio::select! {
                () = run_intercept(shared.clone(), ctx.clone(), job) => {}
                () = &mut timer => {}
            }
        }
        None => {}
    }
}

/// Reads the client's first TLS flight and checks that its ClientHello names `host`. Returns
/// the bytes read (to be sent upstream), or `None` after recording why the tunnel ends.
async fn first_flight<R: tokio::io::AsyncRead + Unpin>(
    client: &mut R,
    host: &Host,
    hello_timeout: Duration,
    pending: &Pending,
) -> Option<Vec<u8>> {
    // Only TLS is tunnelled, and its server name must be the CONNECT target: no domain
    // fronting, no plain HTTP with another Host inside an allowed tunnel.
    match tokio::time::timeout(hello_timeout, read_client_hello(client)).await {
        Err(_) => {
            pending.refuse(format!(
                "not_tls: no TLS ClientHello within {}s",
                hello_timeout.as_secs()
            ));
            None
        }
        Ok(Err(r)) => {
            pending.refuse(r.to_string());
            None
        }
        Ok(Ok(First::Closed)) => {
            pending.note("client closed the tunnel before a TLS ClientHello".into());
            None
        }
        Ok(Ok(First::Hello { raw, hello })) => {
            if let Err(r) = check_client_hello(&hello, host) {
                pending.refuse(r.to_string());
                return None;
            }
            Some(raw)
        }
    }
}

async fn run_tunnel(job: TunnelJob) {
    let TunnelJob {
        on_upgrade,
        host,
        hello_timeout,
        upstream,
        meter,
        pending,
    } = job;
    let upgraded = match on_upgrade.await {
        Ok(u) => u,
        Err(_) => {
            pending.note("client went away before the tunnel started".into());
            return;
        }
    };
    // Both ends TCP sockets (the usual case): relay with splice(2), zero-copy.
    let upgraded = match upgraded.downcast::<TokioIo<TcpStream>>() {
        Ok(parts) => {
            let mut client = parts.io.into_inner();
            let mut reader =
                tokio::io::AsyncReadExt::chain(std::io::Cursor::new(parts.read_buf), &mut client);
            let Some(mut first) = first_flight(&mut reader, &host, hello_timeout, &pending).await
            else {
                return;
            };
            // Bytes hyper had read past the CONNECT head that the hello did not use.
            let (cursor, _) = reader.into_inner();
            let at = usize::try_from(cursor.position()).unwrap_or(usize::MAX);
            first.extend_from_slice(cursor.get_ref().get(at..).unwrap_or_default());
            if !meter.take(Dir::Up, first.len() as u64) {
                return;
            }
            let mut upstream = upstream;
            if upstream.write_all(&first).await.is_err() {
                return;
            }
            crate::splice::relay(&client, &upstream, &meter).await;
            drop(pending);
            return;
        }
        Err(u) => u,
    };
    let mut client = TokioIo::new(upgraded);
    let Some(first) = first_flight(&mut client, &host, hello_timeout, &pending).await else {
        return;
    };
    let mut upstream = MeteredStream {
        inner: upstream,
        meter,
    };
    if upstream.write_all(&first).await.is_err() {
        return;
    }
    let _ =
        tokio::io::copy_bidirectional_with_sizes(&mut client, &mut upstream, 64 << 10, 64 << 10)
            .await;
    drop(pending);
}

/// Serves a CONNECT to a credentialed host: terminates the sandbox's TLS with the run's leaf
/// certificate for that host (after checking the ClientHello names it) and forwards each HTTP
/// request inside, with the same checks as plain HTTP plus the credential rules.
async fn run_intercept(shared: Arc<Shared>, ctx: Arc<ConnCtx>, job: InterceptJob) {
    let InterceptJob {
        on_upgrade,
        target,
        tls,
        hello_timeout,
    } = job;
    let start = Instant::now();
    let deny = |reason: String| {
        let mut d = base_decision("CONNECT", now_ms());
        d.host = target.host.to_string();
        d.port = target.port;
        shared.deny(d, start, &reason, None);
    };
    let Ok(upgraded) = on_upgrade.await else {
        return;
    };
    let acceptor = tokio_rustls::LazyConfigAcceptor::new(
        rustls::server::Acceptor::default(),
        TokioIo::new(upgraded),
    );
    let hello = match tokio::time::timeout(hello_timeout, acceptor).await {
        Err(_) => {
            deny(format!(
                "not_tls: no TLS ClientHello within {}s",
                hello_timeout.as_secs()
            ));
            return;
        }
        Ok(Err(e)) => {
            deny(format!("not_tls: {}", sanitize(&e.to_string(), 200)));
            return;
        }
        Ok(Ok(h)) => h,
    };
    match hello.client_hello().server_name().map(parse_host) {
        Some(Ok(Host::Name(n))) if n == tls.name => {}
        Some(Ok(other)) => {
            deny(format!(
                "sni_mismatch: TLS server name {} is not the CONNECT target {}",
                sanitize(&other.to_string(), 255),
                tls.name
            ));
            return;
        }
        Some(Err(_)) => {
            deny(format!(
                "sni_mismatch: invalid TLS server name for {}",
                tls.name
            ));
            return;
        }
        None => {
            deny(format!(
                "sni_missing: TLS ClientHello without a server name for {}",
                tls.name
            ));
            return;
        }
    }
    let stream = match tokio::time::timeout(hello_timeout, hello.into_stream(tls.server.clone()))
        .await
    {
        Err(_) => {
            deny("TLS handshake with the sandbox timed out".into());
            return;
        }
        Ok(Err(e)) => {
            deny(format!(
                "TLS handshake with the sandbox failed (does the client trust the run's CA?): {}",
                sanitize(&e.to_string(), 200)
            ));
            return;
        }
        Ok(Ok(s)) => s,
    };
    // Upstream connections kept for plain-HTTP requests made before the CONNECT must never
    // carry a request meant for TLS (or its credential).
    lock(&ctx.pool).clear();
    let limits = shared.limits;
    let svc = {
        let shared = shared.clone();
        service_fn(move |req| {
            handle_inner(
                shared.clone(),
                ctx.clone(),
                target.clone(),
                tls.clone(),
                req,
            )
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.max_connection_time.min(Duration::from_secs(30)))
        .max_header_size(limits.max_header_bytes.max(1024))
        .half_close(false);
    if let Err(e) = builder.serve_connection(TokioIo::new(stream), svc).await {
        record_conn_error(&shared, &e);
    }
}

/// One request inside a terminated TLS connection to a credentialed host: origin-form (or
/// absolute-form naming the same destination), forwarded as `https://` to that host.
async fn handle_inner(
    shared: Arc<Shared>,
    ctx: Arc<ConnCtx>,
    target: Target,
    tls: Arc<HostTls>,
    mut req: Request<hyper::body::Incoming>,
) -> Result<Response<RespBody>, Infallible> {
    let start = Instant::now();
    let mut d = base_decision(&method_name(req.method()), now_ms());
    d.host = target.host.to_string();
    d.port = target.port;
    if let Some(r) = over_max_requests(&shared, &d, start) {
        return Ok(r);
    }
    if req.method() == hyper::Method::CONNECT {
        let reason = "CONNECT inside a tunnel is not forwarded";
        shared.deny(d, start, reason, None);
        return Ok(refusal(StatusCode::BAD_REQUEST, reason));
    }
    if let Some(a) = req.uri().authority()
        && parse_authority(a.as_str(), Some(443)).ok().as_ref() != Some(&target)
    {
        let reason = "request URL names another destination than the tunnel";
        shared.deny(d, start, reason, None);
        return Ok(refusal(StatusCode::BAD_REQUEST, reason));
    }
    let pq = req
        .uri()
        .path_and_query()
        .map(|pq| pq.as_str())
        .filter(|s| s.starts_with('/'))
        .unwrap_or("/")
        .to_owned();
    let url = if target.port == 443 {
        format!("https://{}{pq}", target.host)
    } else {
        format!("https://{target}{pq}")
    };
    match url.parse::<Uri>() {
        Ok(u) => *req.uri_mut() = u,
        Err(_) => {
            let reason = "request path could not be forwarded";
            shared.deny(d, start, reason, None);
            return Ok(refusal(StatusCode::BAD_REQUEST, reason));
        }
    }
    Ok(handle_forward(shared, ctx, req, d, start, Some(tls)).await)
}

async fn handle(
    shared: Arc<Shared>,
    ctx: Arc<ConnCtx>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<RespBody>, Infallible> {
    let start = Instant::now();
    let mut d = base_decision(&method_name(req.method()), now_ms());
    if let Some(r) = over_max_requests(&shared, &d, start) {
        return Ok(r);
    }
    if req.method() == hyper::Method::CONNECT {
        let mut resp = handle_connect(shared, ctx, req, d, start).await;
        if resp.status() != StatusCode::OK {
            // Whatever the client already sent after a refused CONNECT (often a TLS
            // ClientHello) must not be read as HTTP: close the connection.
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        return Ok(resp);
    }
    if req.uri().authority().is_none() {
        let reason = "not a proxy request: send an absolute http:// URL or use CONNECT";
        if let Some(h) = req
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            && let Ok(t) = parse_authority(h, Some(80))
        {
            d.host = t.host.to_string();
            d.port = t.port;
        }
        shared.deny(d, start, reason, None);
        return Ok(refusal(StatusCode::BAD_REQUEST, reason));
    }
    Ok(handle_forward(shared, ctx, req, d, start, None).await)
}

async fn handle_connect(
    shared: Arc<Shared>,
    ctx: Arc<ConnCtx>,
    mut req: Request<hyper::body::Incoming>,
    mut d: Decision,
    start: Instant,
) -> Response<RespBody> {
    let uri = req.uri();
    let authority = match (uri.scheme(), uri.authority(), uri.path_and_query()) {
        (None, Some(a), None) => a.as_str().to_owned(),
        (None, Some(a), Some(pq)) if pq.as_str().is_empty() || pq.as_str() == "/" => {
            a.as_str().to_owned()
        }
        _ => {
            let reason = "CONNECT needs a host:port target";
            shared.deny(d, start, reason, None);
            return refusal(StatusCode::BAD_REQUEST, reason);
        }
    };
    let target = match parse_authority(&authority, None) {
        Ok(t) => t,
        Err(e) => {
            d.host = recorded_host(&authority, &e);
            let reason = format!("refused destination: {e}");
            shared.deny(d, start, &reason, None);
            return refusal(target_refusal_status(&e), &reason);
        }
    };
    d.host = target.host.to_string();
    d.port = target.port;
    if let Some(tls) = shared
        .intercept
        .as_ref()
        .and_then(|i| i.for_target(&target))
    {
        // A credentialed host: vetted now (an early, readable refusal), and again for every
        // request inside, which is where connections are opened.
        let vetted = match shared.vet(&target).await {
            Ok(v) => v,
            Err(r) => {
                shared.deny(d, start, &r.reason, r.address);
                return refusal(r.status, &r.reason);
            }
        };
        d.allowed = true;
        d.reason = format!(
            "{}; TLS terminated by the gateway for credentials ({})",
            vetted.reason,
            tls.secrets
                .iter()
                .map(|s| s.label(&tls.name))
                .collect::<Vec<_>>()
                .join(", ")
        );
        d.duration_ms = ms(start.elapsed());
        shared.log.push(d);
        let job = InterceptJob {
            on_upgrade: hyper::upgrade::on(&mut req),
            target,
            tls,
            hello_timeout: shared.limits.connect_timeout,
        };
        *lock(&ctx.tunnel) = Some(Job::Intercept(job));
        return Response::new(empty());
    }
    let (upstream, addr, rule) = match shared.open(&target).await {
        Ok(x) => x,
        Err(r) => {
            shared.deny(d, start, &r.reason, r.address);
            return refusal(r.status, &r.reason);
        }
    };
    d.allowed = true;
    d.address = Some(addr);
    d.reason = rule;
    let flow = Arc::new(Flow::default());
    let pending = Arc::new(Pending::new(
        shared.clone(),
        ctx.clone(),
        flow.clone(),
        d,
        start,
    ));
    let job = TunnelJob {
        on_upgrade: hyper::upgrade::on(&mut req),
        host: target.host.clone(),
        hello_timeout: shared.limits.connect_timeout,
        upstream,
        meter: Meter {
            budget: shared.budget.clone(),
            flow,
        },
        pending,
    };
    *lock(&ctx.tunnel) = Some(Job::Tunnel(job));
    Response::new(empty())
}

#[cfg(test)]
mod tests;
