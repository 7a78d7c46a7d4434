//! The proxy itself: accept loop, CONNECT tunnels, plain-HTTP forwarding, redirect checks.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use agentjail_manifest::EgressPolicy;

use crate::addr::canonical;
use crate::credential::{SMUGGLED, unambiguous_path};
use crate::decision::{Decision, Log, method_name, ms, now_ms, sanitize};
use crate::host::{Host, Target, TargetError, parse_authority, parse_host, redirect_target};
use crate::intercept::{HostTls, Interception, MaskedBody, SmuggleGuard, Without};
use crate::meter::{BoxError, Budget, Dir, Flow, Meter, MeteredBody, MeteredStream, reserve};
use crate::ownaddr::OwnAddrs;
use crate::policy::NEVER_CREDENTIALED_METHODS;
use crate::policy::{CompiledPolicy, PolicyError, compile_policy};
use crate::resolve::Resolve;
use crate::sni::{First, check_client_hello, read_client_hello};

/// The header that carries a refusal's reason to the client.
pub const DENIED_HEADER: &str = "x-agentjail-denied";

/// How much the gateway moves and for how long. Byte budgets are **run-wide**: they count
/// every connection of one gateway together, so opening more connections does not buy more
/// bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GatewayLimits {
    /// Bytes the sandbox may send to destinations in total (tunnel payload, plain-HTTP request
    /// heads and bodies).
    pub max_bytes_up: u64,
    /// Bytes the sandbox may receive from destinations in total.
    pub max_bytes_down: u64,
    /// Client connections open at the same time.
    pub max_concurrent_connections: usize,
    /// Client connections over the gateway's lifetime.
    pub max_total_connections: u64,
    /// Proxy requests (CONNECTs and forwarded requests) over the gateway's lifetime.
    pub max_requests: u64,
    /// Time allowed for the DNS lookup of a destination, and again for the TCP connect to it.
    pub connect_timeout: Duration,
    /// Lifetime of one client connection, tunnel included.
    pub max_connection_time: Duration,
    /// Largest request head (request line + headers) accepted from the sandbox, and largest
    /// response head accepted from a destination.
    pub max_header_bytes: usize,
}

impl Default for GatewayLimits {
    fn default() -> GatewayLimits {
        GatewayLimits {
            max_bytes_up: 64 << 20,
            max_bytes_down: 1 << 30,
            max_concurrent_connections: 32,
            max_total_connections: 1024,
            max_requests: 4096,
            connect_timeout: Duration::from_secs(10),
            max_connection_time: Duration::from_secs(300),
            max_header_bytes: 32 << 10,
        }
    }
}

pub(crate) struct Shared {
    policy: CompiledPolicy,
    limits: GatewayLimits,
    resolver: Arc<dyn Resolve>,
    log: Log,
    budget: Arc<Budget>,
    requests: AtomicU64,
    /// The credential flow, when the policy binds secrets to hosts.
    intercept: Option<Arc<Interception>>,
    /// The gateway host's own addresses, blocked like loopback.
    own: OwnAddrs,
}

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

type RespBody = BoxBody<Bytes, BoxError>;

fn full(text: String) -> RespBody {
    Full::new(Bytes::from(text))
        .map_err(|never| match never {})
        .boxed()
}

fn empty() -> RespBody {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}

/// A refusal answer: status, `X-Agentjail-Denied: <reason>` and a one-line text body.
fn refusal(status: StatusCode, reason: &str) -> Response<RespBody> {
    let reason = sanitize(reason, 300);
    let mut r = Response::new(full(format!("agentjail egress gateway: {reason}\n")));
    *r.status_mut() = status;
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&reason) {
        h.insert(HeaderName::from_static(DENIED_HEADER), v);
    }
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// A refused check: the status to answer with and why.
#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    reason: String,
    address: Option<IpAddr>,
}

impl Refusal {
    fn forbidden(reason: String) -> Refusal {
        Refusal {
            status: StatusCode::FORBIDDEN,
            reason,
            address: None,
        }
    }
}

struct Vetted {
    addrs: Vec<IpAddr>,
    reason: String,
}

/// Per client connection.
#[derive(Default)]
struct ConnCtx {
    timed_out: AtomicBool,
    tunnel: Mutex<Option<Job>>,
    /// Idle upstream connections of this client connection's forwarded requests, each with
    /// the destination it was vetted for. Never shared with another client connection.
    pool: Mutex<Vec<Pooled>>,
}

/// Most idle upstream connections kept per client connection.
const POOL_PER_CLIENT: usize = 4;

type Sender = hyper::client::conn::http1::SendRequest<BoxBody<Bytes, BoxError>>;

/// An upstream HTTP/1.1 connection and the destination it was opened to.
struct Pooled {
    host: Host,
    port: u16,
    addr: IpAddr,
    sender: Sender,
    _driver: AbortOnDrop,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl ConnCtx {
    /// An idle connection to exactly `t`'s host and port whose address is among `addrs` (the
    /// addresses just vetted for this request), ready for a request; `None` if there is none.
    async fn checkout(&self, t: &Target, addrs: &[IpAddr]) -> Option<Pooled> {
        loop {
            let mut p = {
                let mut g = lock(&self.pool);
                let i = g.iter().position(|p| {
                    p.host == t.host && p.port == t.port && addrs.contains(&p.addr)
                })?;
                g.swap_remove(i)
            };
            // Closed by the server or still busy: drop it and look further.
            if let Ok(Ok(())) =
                tokio::time::timeout(Duration::from_millis(50), p.sender.ready()).await
            {
                return Some(p);
            }
        }
    }

    fn checkin(&self, p: Pooled) {
        let mut g = lock(&self.pool);
        if g.len() >= POOL_PER_CLIENT {
            g.remove(0);
        }
        g.push(p);
    }
}

/// What a connection does after its CONNECT was answered.
enum Job {
    /// Relay bytes to the destination (after the SNI check).
    Tunnel(TunnelJob),
    /// Terminate the sandbox's TLS for a credentialed host and forward its requests.
    Intercept(InterceptJob),
}

struct InterceptJob {
    on_upgrade: hyper::upgrade::OnUpgrade,
    target: Target,
    tls: Arc<HostTls>,
    /// How long the client has to send its ClientHello.
    hello_timeout: Duration,
}

struct TunnelJob {
    on_upgrade: hyper::upgrade::OnUpgrade,
    /// The CONNECT target's host: the TLS server name must be this.
    host: Host,
    /// How long the client has to send its ClientHello.
    hello_timeout: Duration,
    upstream: TcpStream,
    meter: Meter,
    pending: Arc<Pending>,
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An allowed flow whose decision is written when the last holder drops it, with the bytes
/// moved and the duration; plus a denial if a limit cut it short.
struct Pending {
    shared: Arc<Shared>,
    ctx: Arc<ConnCtx>,
    flow: Arc<Flow>,
    base: Decision,
    start: Instant,
    note: Mutex<Option<String>>,
    /// Set when the gateway refused the flow after it was allowed (a tunnel's first bytes, a
    /// malformed or smuggling response, a failed upstream exchange): a denial is recorded.
    refused: Mutex<Option<String>>,
    /// The upstream connection of a forwarded request, returned to the client connection's
    /// pool when the response body ended cleanly.
    upstream: Mutex<Option<Pooled>>,
    /// The response body reached its end.
    complete: AtomicBool,
    /// The upstream connection may carry another request once this one is done: set only
    /// for a request without a body (the upstream may leave a body unread and take its bytes
    /// for the next request).
    reusable: AtomicBool,
    /// Copies of a credential masked in the response body.
    masked: Arc<AtomicU64>,
}

impl Pending {
    fn new(
        shared: Arc<Shared>,
        ctx: Arc<ConnCtx>,
        flow: Arc<Flow>,
        base: Decision,
        start: Instant,
    ) -> Pending {
        Pending {
            shared,
            ctx,
            flow,
            base,
            start,
            note: Mutex::new(None),
            refused: Mutex::new(None),
            upstream: Mutex::new(None),
            complete: AtomicBool::new(false),
            reusable: AtomicBool::new(false),
            masked: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Adds a note to the flow's decision (after any earlier one).
    fn note(&self, n: String) {
        let mut g = lock(&self.note);
        match g.as_mut() {
            Some(old) => {
                old.push_str("; ");
                old.push_str(&n);
            }
            None => *g = Some(n),
        }
    }

    /// Records a refusal of this flow (the first one counts).
    fn refuse(&self, reason: String) {
        if let Ok(mut g) = self.refused.lock() {
            g.get_or_insert(reason);
        }
    }
}

impl crate::meter::OnBodyError for Arc<Pending> {
    fn body_error(&self, what: &str, e: &BoxError) {
        self.refuse(sanitize(&format!("{what} failed: {e}"), 200));
    }

    fn body_end(&self) {
        self.complete.store(true, Ordering::SeqCst);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut d = self.base.clone();
        d.bytes_up = self.flow.up.load(Ordering::SeqCst);
        d.bytes_down = self.flow.down.load(Ordering::SeqCst);
        d.duration_ms = ms(self.start.elapsed());
        let masked = self.masked.load(Ordering::SeqCst);
        if masked > 0 {
            self.note(format!(
                "{masked} cop{} of a credential masked in the response body",
                if masked == 1 { "y" } else { "ies" }
            ));
        }
        let note = lock(&self.note).take();
        if let Some(n) = note {
            d.reason = format!("{}; {n}", d.reason);
        }
        let limit = match self.flow.exceeded() {
            Some("max_bytes_up") => Some(format!(
                "connection closed: max_bytes_up ({}) exceeded",
                self.shared.limits.max_bytes_up
            )),
            Some(_) => Some(format!(
                "connection closed: max_bytes_down ({}) exceeded",
                self.shared.limits.max_bytes_down
            )),
            None if self.ctx.timed_out.load(Ordering::SeqCst) => Some(format!(
                "connection closed: max_connection_time ({}s) exceeded",
                self.shared.limits.max_connection_time.as_secs()
            )),
            None => None,
        };
        let denial = limit.map(|reason| Decision {
            allowed: false,
            reason,
            ..d.clone()
        });
        let refused = match self.refused.lock() {
            Ok(mut g) => g.take(),
            Err(p) => p.into_inner().take(),
        };
        let upstream = lock(&self.upstream).take();
        if let Some(up) = upstream
            && refused.is_none()
            && denial.is_none()
            && self.complete.load(Ordering::SeqCst)
            && self.reusable.load(Ordering::SeqCst)
        {
            self.ctx.checkin(up);
        }
        if let Some(reason) = refused {
            let moved = d.bytes_up > 0 || d.bytes_down > 0;
            let r = Decision {
                allowed: false,
                reason,
                ..d.clone()
            };
            // Nothing moved: the flow never became a connection; only the refusal is recorded.
            if moved {
                self.shared.log.push(d);
            }
            self.shared.log.push(r);
        } else {
            self.shared.log.push(d);
        }
        if let Some(x) = denial {
            self.shared.log.push(x);
        }
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

/// Records what hyper refused on its own (it answers `431` or `400` itself): every refusal
/// leaves a denial. A client that merely went away, or an idle connection that timed out,
/// does not.
fn record_conn_error(shared: &Shared, e: &hyper::Error) {
    let reason = if e.is_parse_too_large() {
        format!(
            "request head too large (over max_header_bytes {}): answered 431",
            shared.limits.max_header_bytes.max(1024)
        )
    } else if e.is_parse() {
        format!(
            "malformed request: {}: answered 400",
            sanitize(&e.to_string(), 100)
        )
    } else {
        // Includes the header read timeout: hyper runs it on idle kept-alive connections too,
        // where closing is housekeeping, not a refusal.
        return;
    };
    shared.log.push(Decision {
        allowed: false,
        method: String::new(),
        host: String::new(),
        port: 0,
        address: None,
        reason,
        bytes_up: 0,
        bytes_down: 0,
        started_ms: now_ms(),
        duration_ms: 0,
        count: 1,
    });
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

/// Starts an HTTP/1.1 client connection on `io`, driven by a task of its own.
async fn client_handshake<T>(
    max_header_bytes: usize,
    io: T,
) -> Result<(Sender, AbortOnDrop), hyper::Error>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut client = hyper::client::conn::http1::Builder::new();
    client.max_header_size(max_header_bytes.max(1024));
    let (sender, conn) = client.handshake(TokioIo::new(io)).await?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok((sender, AbortOnDrop(driver)))
}

/// Counts one request against `max_requests`; past it, records the denial and returns the
/// `429` that closes the connection (the forward proxy and the terminated-TLS path alike).
fn over_max_requests(shared: &Shared, d: &Decision, start: Instant) -> Option<Response<RespBody>> {
    if reserve(&shared.requests, shared.limits.max_requests, 1) {
        return None;
    }
    let reason = format!("max_requests ({}) exceeded", shared.limits.max_requests);
    shared.deny(d.clone(), start, &reason, None);
    let mut r = refusal(StatusCode::TOO_MANY_REQUESTS, &reason);
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    Some(r)
}

fn base_decision(method: &str, started_ms: u64) -> Decision {
    Decision {
        allowed: false,
        method: method.to_owned(),
        host: String::new(),
        port: 0,
        address: None,
        reason: String::new(),
        bytes_up: 0,
        bytes_down: 0,
        started_ms,
        duration_ms: 0,
        count: 1,
    }
}

impl Shared {
    fn deny(&self, mut d: Decision, start: Instant, reason: &str, address: Option<IpAddr>) {
        d.allowed = false;
        d.reason = reason.to_owned();
        d.address = address;
        d.duration_ms = ms(start.elapsed());
        self.log.push(d);
    }

    /// Policy match, resolution, and the address check of every resolved address.
    async fn vet(&self, t: &Target) -> Result<Vetted, Refusal> {
        let rule = self
            .policy
            .match_target(t)
            .map_err(|e| Refusal::forbidden(e.to_string()))?;
        let raw = match &t.host {
            Host::Ip(ip) => vec![*ip],
            Host::Name(n) => {
                match tokio::time::timeout(self.limits.connect_timeout, self.resolver.resolve(n))
                    .await
                {
                    Err(_) => {
                        return Err(Refusal {
                            status: StatusCode::BAD_GATEWAY,
                            reason: format!("DNS lookup of {n} timed out"),
                            address: None,
                        });
                    }
                    Ok(Err(e)) => {
                        return Err(Refusal {
                            status: StatusCode::BAD_GATEWAY,
                            reason: sanitize(&e.to_string(), 200),
                            address: None,
                        });
                    }
                    Ok(Ok(a)) => a,
                }
            }
        };
        let mut addrs: Vec<IpAddr> = Vec::with_capacity(raw.len());
        for ip in raw.into_iter().map(canonical) {
            if !addrs.contains(&ip) {
                addrs.push(ip);
            }
        }
        if addrs.is_empty() {
            return Err(Refusal {
                status: StatusCode::BAD_GATEWAY,
                reason: format!("{} has no addresses", t.host),
                address: None,
            });
        }
        // The host's own addresses as of now (they can change while the gateway runs; the
        // cache is refreshed on every address event the kernel reports).
        let own = self.own.current();
        let mut note = None;
        for ip in &addrs {
            match self.policy.check_address_own(*ip, &own) {
                Ok(None) => {}
                Ok(Some(n)) => {
                    note.get_or_insert(n);
                }
                Err(r) => {
                    let reason = match &t.host {
                        Host::Name(n) => format!("{n} resolves to a blocked {r}"),
                        Host::Ip(_) => format!("blocked {r}"),
                    };
                    return Err(Refusal {
                        status: StatusCode::FORBIDDEN,
                        reason,
                        address: Some(*ip),
                    });
                }
            }
        }
        // IPv4 first: a sandbox host without IPv6 routes should not wait on AAAA answers.
        addrs.sort_by_key(|ip| !ip.is_ipv4());
        let reason = match note {
            None => format!("allowed by rule {rule}"),
            Some(n) => format!("allowed by rule {rule}; {n}"),
        };
        Ok(Vetted { addrs, reason })
    }

    /// Connects to the vetted addresses in order, within the connect timeout.
    /// Everything between a parsed destination and a connected upstream for a CONNECT (a
    /// forwarded request does the same steps itself, to reuse a pooled connection): the allowlist and address checks, the run's budgets, and a
    /// connection to one of the vetted addresses. Returns the stream, the address and the rule.
    async fn open(&self, t: &Target) -> Result<(TcpStream, IpAddr, String), Refusal> {
        let vetted = self.vet(t).await?;
        if let Some(what) = self.budget.exhausted() {
            return Err(Refusal::forbidden(format!("{what} budget already used up")));
        }
        let (upstream, addr) = self.connect(&vetted.addrs, t.port).await?;
        Ok((upstream, addr, vetted.reason))
    }

    async fn connect(&self, addrs: &[IpAddr], port: u16) -> Result<(TcpStream, IpAddr), Refusal> {
        let deadline = tokio::time::Instant::now() + self.limits.connect_timeout;
        let mut last = Refusal {
            status: StatusCode::BAD_GATEWAY,
            reason: "no address to connect to".into(),
            address: None,
        };
        for ip in addrs {
            let sa = SocketAddr::new(*ip, port);
            match tokio::time::timeout_at(deadline, TcpStream::connect(sa)).await {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Ok((s, *ip));
                }
                Ok(Err(e)) => {
                    last = Refusal {
                        status: StatusCode::BAD_GATEWAY,
                        reason: format!("connect to {sa} failed: {e}"),
                        address: Some(*ip),
                    };
                }
                Err(_) => {
                    return Err(Refusal {
                        status: StatusCode::GATEWAY_TIMEOUT,
                        reason: format!("connect to {sa} timed out"),
                        address: Some(*ip),
                    });
                }
            }
        }
        Err(last)
    }
}

/// Host text recorded for a destination that could not be parsed: never userinfo.
fn recorded_host(raw: &str, err: &TargetError) -> String {
    match err {
        TargetError::Userinfo => String::new(),
        _ => sanitize(raw, 255),
    }
}

fn target_refusal_status(err: &TargetError) -> StatusCode {
    match err {
        TargetError::Userinfo => StatusCode::FORBIDDEN,
        _ => StatusCode::BAD_REQUEST,
    }
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

/// Hop-by-hop headers (RFC 9110 section 7.6.1) and proxy credentials, never forwarded.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn strip_hop_by_hop(h: &mut HeaderMap) {
    let listed: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        h.remove(name);
    }
    for name in HOP_BY_HOP {
        h.remove(*name);
    }
}

fn head_bytes(h: &HeaderMap) -> u64 {
    h.iter()
        .map(|(k, v)| (k.as_str().len() + v.len() + 4) as u64)
        .sum()
}

async fn handle_forward(
    shared: Arc<Shared>,
    ctx: Arc<ConnCtx>,
    req: Request<hyper::body::Incoming>,
    mut d: Decision,
    start: Instant,
    tls: Option<Arc<HostTls>>,
) -> Response<RespBody> {
    let uri = req.uri().clone();
    let (scheme, default_port) = if tls.is_some() {
        ("https", 443)
    } else {
        ("http", 80)
    };
    let Some(authority) = uri.authority().map(|a| a.as_str().to_owned()) else {
        let reason = "not a proxy request";
        shared.deny(d, start, reason, None);
        return refusal(StatusCode::BAD_REQUEST, reason);
    };
    let target = match parse_authority(&authority, Some(default_port)) {
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
    if !uri
        .scheme_str()
        .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
    {
        let reason = "only http:// URLs are forwarded; use CONNECT for TLS";
        shared.deny(d, start, reason, None);
        return refusal(StatusCode::BAD_REQUEST, reason);
    }
    // The Host header, if present, must name the same destination as the URL.
    let hosts: Vec<&HeaderValue> = req.headers().get_all(header::HOST).iter().collect();
    let host_ok = match hosts.as_slice() {
        [] => true,
        [one] => one
            .to_str()
            .ok()
            .and_then(|s| parse_authority(s, Some(default_port)).ok())
            .is_some_and(|h| h == target),
        _ => false,
    };
    if !host_ok {
        let reason = "Host header does not match the request URL";
        shared.deny(d, start, reason, None);
        return refusal(StatusCode::BAD_REQUEST, reason);
    }
    // A credentialed host: a path servers could normalise differently is refused (a prefix
    // match on `/v1/../admin` means nothing), a body where the upstream may not read one is
    // refused (it could be taken for the next request on the connection), and the decision
    // names the credentials added.
    let has_body = !hyper::body::Body::is_end_stream(req.body());
    // The method as sent (the decision's `method` field folds unknown ones into OTHER; the
    // credential rules must not).
    let method = req.method().as_str().to_owned();
    let shown = sanitize(&method, 32);
    let mut add: Vec<&crate::intercept::Secret> = Vec::new();
    let mut without = None;
    if let Some(tls) = &tls {
        let path = uri.path();
        if has_body && BODILESS_METHODS.contains(&method.as_str()) {
            let reason = format!(
                "a request body on {shown} is refused for a credentialed host (rule: no body where the upstream may not read one)"
            );
            shared.deny(d, start, &reason, None);
            return refusal(StatusCode::BAD_REQUEST, &reason);
        }
        if !NEVER_CREDENTIALED_METHODS.contains(&method.as_str()) {
            (add, without) = tls.applicable(&method, target.port, path);
        }
        // Only a request that would carry the secret needs a path every server reads alike:
        // one without it carries nothing to misdirect.
        if !add.is_empty()
            && let Err(rule) = unambiguous_path(path)
        {
            let reason = format!(
                "path refused for a credentialed request (rule: unambiguous paths): {rule}"
            );
            shared.deny(d, start, &reason, None);
            return refusal(StatusCode::BAD_REQUEST, &reason);
        }
    }
    let added: Vec<String> = match &tls {
        Some(tls) => add.iter().map(|s| s.label(&tls.name)).collect(),
        None => Vec::new(),
    };
    // Text an upstream chose (a Location, a coding, an error) goes into refusals and the
    // report only with any copy of a credential masked.
    let redact = |text: &str| match &tls {
        Some(tls) => tls.needles.redact(text),
        None => text.to_owned(),
    };
    // Vetted for every request, pooled connection or not: a pooled connection is used only
    // for the same host and port and when its address is among the addresses vetted now.
    let vetted = match shared.vet(&target).await {
        Ok(v) => v,
        Err(r) => {
            shared.deny(d, start, &r.reason, r.address);
            return refusal(r.status, &r.reason);
        }
    };
    if let Some(what) = shared.budget.exhausted() {
        let reason = format!("{what} budget already used up");
        shared.deny(d, start, &reason, None);
        return refusal(StatusCode::FORBIDDEN, &reason);
    }
    // A request that gets a credential travels only on a connection of its own: never on
    // one that carried an earlier request.
    let reused = if added.is_empty() {
        ctx.checkout(&target, &vetted.addrs).await
    } else {
        None
    };
    let fresh = match reused {
        Some(_) => None,
        None => match shared.connect(&vetted.addrs, target.port).await {
            Ok(x) => Some(x),
            Err(r) => {
                shared.deny(d, start, &r.reason, r.address);
                return refusal(r.status, &r.reason);
            }
        },
    };
    let addr = match (&reused, &fresh) {
        (Some(p), _) => p.addr,
        (None, Some((_, a))) => *a,
        (None, None) => return refusal(StatusCode::BAD_GATEWAY, "no upstream connection"),
    };
    d.allowed = true;
    d.address = Some(addr);
    d.reason = match (&tls, added.is_empty()) {
        (None, _) => vetted.reason,
        (Some(_), true) => match without {
            Some(Without::Method) => {
                format!("{}; no credential for method {shown}", vetted.reason)
            }
            Some(Without::Path) | None if NEVER_CREDENTIALED_METHODS.contains(&method.as_str()) => {
                format!("{}; no credential for method {shown}", vetted.reason)
            }
            Some(Without::Path) | None => {
                format!("{}; no credential for this path", vetted.reason)
            }
        },
        (Some(_), false) => format!("{}; credential {} added", vetted.reason, added.join(", ")),
    };
    let flow = Arc::new(Flow::default());
    let meter = Meter {
        budget: shared.budget.clone(),
        flow: flow.clone(),
    };
    let pending = Arc::new(Pending::new(shared.clone(), ctx, flow, d.clone(), start));

    let mut up = match (reused, fresh) {
        (Some(p), _) => p,
        (None, Some((upstream, addr))) => {
            let max = shared.limits.max_header_bytes;
            let handshake = match (&tls, &shared.intercept) {
                (None, _) => client_handshake(max, upstream).await,
                (Some(tls), Some(i)) => {
                    let connector = tokio_rustls::TlsConnector::from(i.upstream.clone());
                    let name = match rustls::pki_types::ServerName::try_from(tls.name.clone()) {
                        Ok(n) => n,
                        Err(_) => {
                            let reason = format!("{} is not a valid TLS server name", tls.name);
                            pending.refuse(reason.clone());
                            return refusal(StatusCode::BAD_GATEWAY, &reason);
                        }
                    };
                    let connected = tokio::time::timeout(
                        shared.limits.connect_timeout,
                        connector.connect(name, upstream),
                    )
                    .await;
                    match connected {
                        Ok(Ok(s)) => client_handshake(max, s).await,
                        Ok(Err(e)) => {
                            let reason = tls.needles.redact(&format!(
                                "upstream TLS with {} failed: {}",
                                tls.name,
                                sanitize(&e.to_string(), 200)
                            ));
                            pending.refuse(reason.clone());
                            return refusal(StatusCode::BAD_GATEWAY, &reason);
                        }
                        Err(_) => {
                            let reason = format!("upstream TLS with {} timed out", tls.name);
                            pending.refuse(reason.clone());
                            return refusal(StatusCode::GATEWAY_TIMEOUT, &reason);
                        }
                    }
                }
                (Some(_), None) => {
                    let reason = "internal: a credentialed request without the credential flow";
                    pending.refuse(reason.into());
                    return refusal(StatusCode::BAD_GATEWAY, reason);
                }
            };
            let (sender, driver) = match handshake {
                Ok(x) => x,
                Err(e) => {
                    let reason = format!("upstream handshake failed: {e}");
                    pending.refuse(reason.clone());
                    return refusal(StatusCode::BAD_GATEWAY, &reason);
                }
            };
            Pooled {
                host: target.host.clone(),
                port: target.port,
                addr,
                sender,
                _driver: driver,
            }
        }
        (None, None) => return refusal(StatusCode::BAD_GATEWAY, "no upstream connection"),
    };

    let (mut parts, body) = req.into_parts();
    let origin_form = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .filter(|s| s.starts_with('/'))
        .unwrap_or("/")
        .to_owned();
    let Ok(path) = origin_form.parse::<Uri>() else {
        let reason = "request path could not be forwarded";
        pending.refuse(reason.into());
        return refusal(StatusCode::BAD_REQUEST, reason);
    };
    strip_hop_by_hop(&mut parts.headers);
    if let Some(tls) = &tls {
        // The sandbox cannot choose a credential's value: its own header of that name goes.
        crate::intercept::apply(tls, &add, &mut parts.headers);
        // An encoded body could not be scanned for an echoed secret.
        parts.headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
    }
    match HeaderValue::from_str(&authority) {
        Ok(v) => {
            parts.headers.insert(header::HOST, v);
        }
        Err(_) => {
            let reason = "request authority could not be forwarded";
            pending.refuse(reason.into());
            return refusal(StatusCode::BAD_REQUEST, reason);
        }
    }
    let head =
        (parts.method.as_str().len() + origin_form.len() + 12) as u64 + head_bytes(&parts.headers);
    if !meter.take(Dir::Up, head) {
        return refusal(StatusCode::FORBIDDEN, "max_bytes_up exceeded");
    }
    // A body to a credentialed host must not hold a request of its own (smuggled to an
    // upstream, or to the server behind a front proxy, that leaves it unread).
    let smuggled = Arc::new(AtomicBool::new(false));
    let body = match &tls {
        Some(_) => SmuggleGuard::new(body, smuggled.clone()).boxed(),
        None => body.map_err(BoxError::from).boxed(),
    };
    let body = MeteredBody {
        inner: body,
        meter: meter.clone(),
        dir: Dir::Up,
        _keep: (),
    };
    let mut out = Request::new(body.boxed());
    *out.method_mut() = parts.method.clone();
    *out.uri_mut() = path;
    *out.version_mut() = Version::HTTP_11;
    *out.headers_mut() = parts.headers;

    let resp = match up.sender.send_request(out).await {
        Ok(r) => r,
        Err(e) => {
            let (status, reason) = if smuggled.load(Ordering::SeqCst) {
                (StatusCode::BAD_REQUEST, SMUGGLED.to_owned())
            } else if meter.flow.exceeded().is_some() {
                (
                    StatusCode::BAD_GATEWAY,
                    "request body exceeded the byte budget".to_owned(),
                )
            } else {
                (
                    StatusCode::BAD_GATEWAY,
                    redact(&format!("upstream request failed: {e}")),
                )
            };
            pending.refuse(reason.clone());
            return refusal(status, &reason);
        }
    };

    // A response that frames its body twice is a smuggling attempt toward the client.
    if resp.headers().contains_key(header::CONTENT_LENGTH)
        && resp.headers().contains_key(header::TRANSFER_ENCODING)
    {
        let reason =
            format!("response from {target} has both Content-Length and Transfer-Encoding");
        pending.refuse(reason.clone());
        drop(resp);
        return refusal(StatusCode::BAD_GATEWAY, &reason);
    }

    // Location and Content-Location, on every status: the target must pass the same checks
    // before the client may follow it.
    if let Some((host, port, why, address)) =
        check_locations(&shared, &target, resp.headers()).await
    {
        let reason = redact(&format!("redirect from {target} refused: {why}"));
        let denial = Decision {
            allowed: false,
            method: d.method.clone(),
            host: redact(&host),
            port,
            address,
            reason: reason.clone(),
            bytes_up: 0,
            bytes_down: 0,
            started_ms: d.started_ms,
            duration_ms: ms(start.elapsed()),
            count: 1,
        };
        shared.log.push(denial);
        pending.note("redirect not forwarded".into());
        drop(resp);
        return refusal(StatusCode::FORBIDDEN, &reason);
    }

    // A credentialed host's body must be scannable for an echoed secret: no content or
    // transfer coding the gateway does not undo.
    if tls.is_some()
        && let Some(why) = encoded_body(resp.headers())
    {
        let reason = redact(&format!(
            "response from {target} refused: {why} (the body could not be scanned for an echoed credential)"
        ));
        pending.refuse(reason.clone());
        drop(resp);
        return refusal(StatusCode::BAD_GATEWAY, &reason);
    }

    *lock(&pending.upstream) = Some(up);
    pending.reusable.store(!has_body, Ordering::SeqCst);
    let (mut rparts, rbody) = resp.into_parts();
    strip_hop_by_hop(&mut rparts.headers);
    let rbody = match &tls {
        Some(tls) => {
            // The status line's reason phrase is the canonical one: the upstream's own text
            // could carry the secret.
            rparts.extensions.remove::<hyper::ext::ReasonPhrase>();
            let n = crate::intercept::redact_response(tls, &mut rparts.headers);
            if n > 0 {
                pending.note(format!(
                    "{n} response header(s) echoing a credential removed"
                ));
            }
            MaskedBody::new(rbody, tls, pending.masked.clone()).boxed()
        }
        None => rbody.map_err(BoxError::from).boxed(),
    };
    if !meter.take(Dir::Down, head_bytes(&rparts.headers) + 16) {
        return refusal(StatusCode::FORBIDDEN, "max_bytes_down exceeded");
    }
    let body = MeteredBody {
        inner: rbody,
        meter,
        dir: Dir::Down,
        _keep: pending,
    };
    Response::from_parts(rparts, body.boxed())
}

/// Methods whose request body an upstream may leave unread: a body on one of them, to a
/// credentialed host, is refused.
const BODILESS_METHODS: [&str; 6] = ["GET", "HEAD", "OPTIONS", "DELETE", "TRACE", "TRACK"];

/// Why a response body would arrive encoded (a content coding other than `identity`, or a
/// transfer coding other than `chunked`), or `None`.
fn encoded_body(h: &HeaderMap) -> Option<String> {
    let codings = |name: header::HeaderName, fine: &str| -> Option<String> {
        h.get_all(&name)
            .iter()
            .flat_map(|v| v.to_str().unwrap_or("?").split(','))
            .map(|c| c.trim().to_ascii_lowercase())
            .find(|c| !c.is_empty() && c != fine)
            .map(|c| format!("{name}: {}", sanitize(&c, 40)))
    };
    codings(header::CONTENT_ENCODING, "identity")
        .or_else(|| codings(header::TRANSFER_ENCODING, "chunked"))
}

/// Checks every `Location` and `Content-Location` header of a response from `target`: each
/// must be unique, parse, and stay on `target` or pass [`Shared::vet`]. Returns the refused
/// destination (host, port), why, and the address that caused it.
async fn check_locations(
    shared: &Shared,
    target: &Target,
    headers: &HeaderMap,
) -> Option<(String, u16, String, Option<IpAddr>)> {
    for name in [header::LOCATION, header::CONTENT_LOCATION] {
        let values: Vec<&HeaderValue> = headers.get_all(&name).iter().collect();
        if values.len() > 1 {
            return Some((String::new(), 0, format!("several {name} headers"), None));
        }
        let Some(loc) = values.first() else { continue };
        match redirect_target(loc.as_bytes()) {
            Ok(None) => {}
            Ok(Some(t)) if t == *target => {}
            Ok(Some(t)) => {
                if let Err(r) = shared.vet(&t).await {
                    return Some((
                        t.host.to_string(),
                        t.port,
                        format!("{name}: {}", r.reason),
                        r.address,
                    ));
                }
            }
            Err(reason) => return Some((String::new(), 0, format!("{name}: {reason}"), None)),
        }
    }
    None
}

#[cfg(test)]
mod tests;
