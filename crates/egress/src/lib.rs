//! # agentjail-egress: the egress gateway
//!
//! When a manifest allows network access, the sandbox still has no route anywhere: its network
//! namespace holds loopback alone. The only way out is a proxy endpoint on `127.0.0.1:PORT`
//! inside that namespace, whose listening socket is handed to the supervisor, which serves it
//! with this crate's [`Gateway`]. The gateway speaks
//!
//! * **HTTP CONNECT** (TLS only, tunnelled byte for byte with `splice(2)` without terminating it, once the
//!   ClientHello named the CONNECT target), and
//! * **plain HTTP forward proxying** (absolute-form `GET http://host:port/path`),
//!
//! and for every request it
//!
//! 1. parses and normalises the destination ([`host`]): UTS-46/IDNA, lowercase, one trailing
//!    dot stripped, every IPv4 spelling (`2130706433`, `0177.0.0.1`, `0x7f.1`, `127.1`) and
//!    bracketed IPv6 (including `[::ffff:127.0.0.1]`) parsed as an address, userinfo and
//!    other authority tricks refused;
//! 2. matches host and port against the allowlist ([`CompiledPolicy`]); IP literals match only
//!    rules that name that exact IP;
//! 3. resolves names itself ([`Resolve`]; [`HickoryResolver`] with the host's
//!    `/etc/resolv.conf` and `/etc/hosts` by default) and refuses when **any** returned address
//!    is not public unicast ([`addr::classify`]: loopback, RFC 1918, CGNAT, link-local and the
//!    metadata addresses, ULA, multicast, documentation, reserved, and IPv6 embeddings of
//!    those), unless an `allow_private` CIDR covers it;
//! 4. connects to the exact address it vetted (no second lookup, so no DNS rebinding);
//! 5. for CONNECT, tunnels only TLS whose ClientHello names the CONNECT target as server name
//!    (`sni_mismatch`, `sni_missing`, `sni_ech`, `not_tls` otherwise), and for plain HTTP
//!    checks every `Location` / `Content-Location` target the same way, on any status, and
//!    answers `403` instead of forwarding it; refuses absolute-form requests whose `Host`
//!    header names another destination (`400`) and responses framed by both
//!    `Content-Length` and `Transfer-Encoding` (`502`). The gateway host's own addresses are
//!    blocked like loopback;
//! 6. bounds bytes (run-wide), connections (concurrent and total), requests, connect time,
//!    connection lifetime and header size ([`GatewayLimits`]);
//! 7. records a [`Decision`] for every allowed or refused request: method, normalised host,
//!    port, address, reason, bytes, times. Never a payload, header value, path, query or
//!    credential.
//!
//! Refusals answer `403` (policy), `400` (malformed or mismatching request), `502`/`504`
//! (DNS or connect failure) or `503` (connection limits), with an `X-Agentjail-Denied: <reason>`
//! header and a one-line body; for CONNECT before any tunnel exists.
//!
//! ## Limitations
//!
//! * TLS is not terminated, except for hosts named in `network.credentials` ([`Interception`]:
//!   a per-run, name-constrained CA whose key is dropped once it signed the hosts' leaf
//!   certificates; the secret is added only on the listed paths). Elsewhere the server name
//!   is checked, what follows is not (a front that
//!   routes by the `Host` header inside TLS, DNS-over-HTTPS, uploads to an allowed host).
//!   An allowed host that is itself an open proxy, or that accepts uploads, is a channel the
//!   operator owns.
//! * The gateway speaks HTTP/1.1 to clients; no SOCKS5 (clients that only speak SOCKS need
//!   `ALL_PROXY=http://...` support or an HTTP proxy). Plain-HTTP upstream connections are
//!   pooled per client connection, keyed by the vetted (host, port, address).
//! * Byte counts for plain HTTP include an approximation of the heads.
//! * `allow_private` exceptions apply to the address connected to, not to an IPv4 address
//!   that an IPv6 address embeds.
//!
//! ## Testing
//!
//! Unit tests cover parsing, normalisation, matching, classification (table-driven and with
//! proptest) and redirect parsing without any network. The integration tests in
//! `tests/netns.rs` run the gateway, an upstream HTTP server, a small DNS server and the
//! clients on a thread that first moved into a **fresh network namespace with only loopback**
//! (`unshare(CLONE_NEWNET)`, needs root; they print a skip line otherwise), so no test traffic
//! can leave the machine.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

// The parsers and the policy stand alone: with `default-features = false` (no `gateway`
// feature) the crate is only them, without tokio, hyper, rustls or hickory (the fuzz targets
// build it that way, docs/fuzzing.md).
pub mod addr;
pub mod credential;
#[cfg(feature = "gateway")]
mod decision;
#[cfg(feature = "gateway")]
mod gateway;
pub mod host;
#[cfg(feature = "gateway")]
mod intercept;
#[cfg(feature = "gateway")]
mod meter;
#[cfg(feature = "gateway")]
mod ownaddr;
mod policy;
#[cfg(feature = "gateway")]
mod resolve;
#[cfg(feature = "gateway")]
mod sni;
#[cfg(feature = "gateway")]
mod splice;

#[cfg(feature = "gateway")]
use std::sync::Arc;
#[cfg(feature = "gateway")]
use std::thread::JoinHandle;

#[cfg(feature = "gateway")]
pub use decision::{Decision, LOG_FULL, MAX_ALLOWED, MAX_REFUSALS, RefusalObserver};
#[cfg(feature = "gateway")]
pub use gateway::{DENIED_HEADER, Gateway, GatewayLimits};
pub use host::redirect_target;
#[cfg(feature = "gateway")]
pub use intercept::{CredentialError, Interception, read_secret};
pub use policy::{BlockedAddress, CompiledPolicy, NotAllowed, PolicyError, compile_policy};
#[cfg(feature = "gateway")]
pub use resolve::{HickoryResolver, Resolve, ResolveError, ResolveFuture, StaticResolver};

#[cfg(feature = "gateway")]
/// Failure to start a gateway with [`spawn_gateway`].
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The policy does not compile.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The tokio runtime could not be built.
    #[error("egress gateway runtime: {0}")]
    Runtime(std::io::Error),
    /// The gateway thread could not be started.
    #[error("egress gateway thread: {0}")]
    Thread(std::io::Error),
}

#[cfg(feature = "gateway")]
/// A gateway running on its own thread (see [`spawn_gateway`]).
#[derive(Debug)]
pub struct GatewayHandle {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<Vec<Decision>>>,
}

#[cfg(feature = "gateway")]
impl GatewayHandle {
    /// Stops the gateway (closing every connection) and returns its decision log.
    pub fn stop(mut self) -> Vec<Decision> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(log)) => log,
            Some(Err(_)) | None => vec![Decision {
                allowed: false,
                method: String::new(),
                host: String::new(),
                port: 0,
                address: None,
                reason: "egress gateway thread failed; its decisions are lost".into(),
                bytes_up: 0,
                bytes_down: 0,
                started_ms: decision::now_ms(),
                duration_ms: 0,
                count: 1,
            }],
        }
    }
}

#[cfg(feature = "gateway")]
impl Drop for GatewayHandle {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

#[cfg(feature = "gateway")]
/// Starts a gateway on a thread of its own, with a single-threaded tokio runtime, serving
/// `listener` until [`GatewayHandle::stop`]. For synchronous callers such as the supervisor.
///
/// Outgoing connections are made from the network namespace of the calling thread.
pub fn spawn_gateway(
    policy: &agentjail_manifest::EgressPolicy,
    limits: GatewayLimits,
    resolver: Arc<dyn Resolve>,
    listener: std::net::TcpListener,
) -> Result<GatewayHandle, GatewayError> {
    spawn_gateway_with_credentials(policy, limits, resolver, listener, None, None)
}

#[cfg(feature = "gateway")]
/// [`spawn_gateway`] with the credential flow prepared by [`Interception::prepare`], and
/// `on_refusal` told of each distinct refusal as it is made ([`Gateway::observe_refusals`]).
pub fn spawn_gateway_with_credentials(
    policy: &agentjail_manifest::EgressPolicy,
    limits: GatewayLimits,
    resolver: Arc<dyn Resolve>,
    listener: std::net::TcpListener,
    intercept: Option<Interception>,
    on_refusal: Option<RefusalObserver>,
) -> Result<GatewayHandle, GatewayError> {
    let gateway = Gateway::with_credentials(policy, limits, resolver, intercept)?;
    if let Some(f) = on_refusal {
        gateway.observe_refusals(f);
    }
    // One thread: the gateway's work is I/O, and on a machine whose cores are shared with the
    // sandbox and the upstreams, tasks handing each other work across worker threads (the
    // client connection, the pooled upstream connection's driver, the relay) cost wake-ups
    // and cache misses per request or chunk. Measured in docs/performance.md.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .thread_name("agentjail-egress")
        .enable_all()
        .build()
        .map_err(GatewayError::Runtime)?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("agentjail-egress".into())
        .spawn(move || {
            let log = runtime.block_on(gateway.serve(listener, async move {
                let _ = rx.await;
            }));
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
            log
        })
        .map_err(GatewayError::Thread)?;
    Ok(GatewayHandle {
        stop: Some(tx),
        thread: Some(thread),
    })
}
