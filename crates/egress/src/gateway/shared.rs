//! What every connection of one gateway shares ([`Shared`]: the policy, the limits, the
//! run-wide budgets and the decision log) and what each keeps ([`ConnCtx`]: its pool of
//! upstream connections, the tunnel its CONNECT opened), the record of one allowed flow
//! ([`Pending`], written when it ends), and the refusal answer.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Response, StatusCode};
use serde::Serialize;
use tokio::net::TcpStream;

use crate::decision::{Decision, Log, ms, now_ms, sanitize};
use crate::host::{Host, Target};
use crate::intercept::{HostTls, Interception};
use crate::meter::{BoxError, Budget, Flow, Meter, reserve};
use crate::ownaddr::OwnAddrs;
use crate::policy::CompiledPolicy;
use crate::resolve::Resolve;

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
    pub(super) policy: CompiledPolicy,
    pub(super) limits: GatewayLimits,
    pub(super) resolver: Arc<dyn Resolve>,
    pub(super) log: Log,
    pub(super) budget: Arc<Budget>,
    pub(super) requests: AtomicU64,
    /// The credential flow, when the policy binds secrets to hosts.
    pub(super) intercept: Option<Arc<Interception>>,
    /// The gateway host's own addresses, blocked like loopback.
    pub(super) own: OwnAddrs,
}

pub(super) type RespBody = BoxBody<Bytes, BoxError>;

fn full(text: String) -> RespBody {
    Full::new(Bytes::from(text))
        .map_err(|never| match never {})
        .boxed()
}

pub(super) fn empty() -> RespBody {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}

/// A refusal answer: status, `X-Agentjail-Denied: <reason>` and a one-line text body.
pub(super) fn refusal(status: StatusCode, reason: &str) -> Response<RespBody> {
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

/// Per client connection.
#[derive(Default)]
pub(super) struct ConnCtx {
    pub(super) timed_out: AtomicBool,
    pub(super) tunnel: Mutex<Option<Job>>,
    /// Idle upstream connections of this client connection's forwarded requests, each with
    /// the destination it was vetted for. Never shared with another client connection.
    pub(super) pool: Mutex<Vec<Pooled>>,
}

/// Most idle upstream connections kept per client connection.
const POOL_PER_CLIENT: usize = 4;

pub(super) type Sender = hyper::client::conn::http1::SendRequest<BoxBody<Bytes, BoxError>>;

/// An upstream HTTP/1.1 connection and the destination it was opened to.
pub(super) struct Pooled {
    pub(super) host: Host,
    pub(super) port: u16,
    pub(super) addr: IpAddr,
    pub(super) sender: Sender,
    pub(super) _driver: AbortOnDrop,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl ConnCtx {
    /// An idle connection to exactly `t`'s host and port whose address is among `addrs` (the
    /// addresses just vetted for this request), ready for a request; `None` if there is none.
    pub(super) async fn checkout(&self, t: &Target, addrs: &[IpAddr]) -> Option<Pooled> {
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
pub(super) enum Job {
    /// Relay bytes to the destination (after the SNI check).
    Tunnel(TunnelJob),
    /// Terminate the sandbox's TLS for a credentialed host and forward its requests.
    Intercept(InterceptJob),
}

pub(super) struct InterceptJob {
    pub(super) on_upgrade: hyper::upgrade::OnUpgrade,
    pub(super) target: Target,
    pub(super) tls: Arc<HostTls>,
    /// How long the client has to send its ClientHello.
    pub(super) hello_timeout: Duration,
}

pub(super) struct TunnelJob {
    pub(super) on_upgrade: hyper::upgrade::OnUpgrade,
    /// The CONNECT target's host: the TLS server name must be this.
    pub(super) host: Host,
    /// How long the client has to send its ClientHello.
    pub(super) hello_timeout: Duration,
    pub(super) upstream: TcpStream,
    pub(super) meter: Meter,
    pub(super) pending: Arc<Pending>,
}

/// Aborts a spawned task when dropped.
pub(super) struct AbortOnDrop(pub(super) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An allowed flow whose decision is written when the last holder drops it, with the bytes
/// moved and the duration; plus a denial if a limit cut it short.
pub(super) struct Pending {
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
    pub(super) upstream: Mutex<Option<Pooled>>,
    /// The response body reached its end.
    complete: AtomicBool,
    /// The upstream connection may carry another request once this one is done: set only
    /// for a request without a body (the upstream may leave a body unread and take its bytes
    /// for the next request).
    pub(super) reusable: AtomicBool,
    /// Copies of a credential masked in the response body.
    pub(super) masked: Arc<AtomicU64>,
}

impl Pending {
    pub(super) fn new(
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
    pub(super) fn note(&self, n: String) {
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
    pub(super) fn refuse(&self, reason: String) {
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

/// Records what hyper refused on its own (it answers `431` or `400` itself): every refusal
/// leaves a denial. A client that merely went away, or an idle connection that timed out,
/// does not.
pub(super) fn record_conn_error(shared: &Shared, e: &hyper::Error) {
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

/// Counts one request against `max_requests`; past it, records the denial and returns the
/// `429` that closes the connection (the forward proxy and the terminated-TLS path alike).
pub(super) fn over_max_requests(
    shared: &Shared,
    d: &Decision,
    start: Instant,
) -> Option<Response<RespBody>> {
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

pub(super) fn base_decision(method: &str, started_ms: u64) -> Decision {
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
    pub(super) fn deny(
        &self,
        mut d: Decision,
        start: Instant,
        reason: &str,
        address: Option<IpAddr>,
    ) {
        d.allowed = false;
        d.reason = reason.to_owned();
        d.address = address;
        d.duration_ms = ms(start.elapsed());
        self.log.push(d);
    }
}
