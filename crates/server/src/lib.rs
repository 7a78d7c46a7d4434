//! # agentjail-server
//!
//! The orchestrator of SANDBOX-6 as an HTTP service (`agentjail serve`): an actor authenticates
//! with a bearer token, is bound to its tenant, names a configured task type, the input ids it
//! uploaded and (when the task allows it) model-proposed code; policy checks all of it, a
//! short-lived job is issued, a manifest is built from the task type alone (the request can never
//! name a host path, image, mount, limit or network destination), the job runs **once per
//! (tenant, request_id)** in a separate `agentjail run` process, and only verified output comes
//! back, with the signed receipt and the report. Every decision goes to a hash-chained audit log.
//!
//! The layers, each a folder or file (docs/ARCHITECTURE.md draws them; `ci/import-graph.py`
//! checks that a file refers only to its own layer and lower ones, and that no files refer to
//! each other in a cycle):
//! - [`doors`]: the front doors, [`api`](doors::api) (HTTP: handlers, problem details, OpenAPI), [`mcp`]
//!   (the MCP server over stdio and at `/mcp`) and [`worker_http`](doors::worker_http) (a worker's `/metrics`,
//!   `/healthz`, `/readyz`); each maps the service's results to its own transport.
//! - [`service`]: the operations the doors share (inputs, runs, reconcile, the task catalogue),
//!   knowing no transport.
//! - [`app`] (the shared state and the startup checks), [`images`] (task types on pinned
//!   images: the store, the start-up check, a probe run in a sandbox on the image),
//!   [`selftest`] (the startup self-test), [`node_facts`] (what the console's Health page
//!   shows of this node: `check`'s facts, its receipt key, its self-test) and [`dev_token`] (the token of `serve` without `--config`, kept in the data directory).
//! - [`execution`]: admission and slots, the runner process and its lifeline, leases and
//!   fencing ([`runner`](execution::runner)); the fleet executor
//!   ([`fleet`](execution::fleet)).
//! - [`policy`]: every decision, pure; typed refusals.
//! - [`storage`]: the [`store`](storage::store) interface, SQLite ([`db`](storage::db)), PostgreSQL ([`pg`]), the
//!   hash-chained audit log ([`audit`]).
//! - [`run_state`] (a run's states), [`util`] (randomness, the clock) and [`news`] (wake-ups
//!   for the followers of a run executing here): leaves anyone uses.
//!
//! No door depends on another's transport, and no module on this root, which composes the
//! router, `serve` and `worker`. Tested by unit tests here and by `crates/cli/tests/server.rs`
//! over real HTTP.

pub mod app;
pub mod dev_token;
pub mod doors;
pub mod execution;
pub mod images;
pub mod live_slots;
pub mod news;
pub mod node_facts;
pub mod policy;
pub mod run_state;
pub mod selftest;
pub mod service;
pub mod storage;
pub mod util;

// The paths other crates use (crates/cli: `mcp::serve_stdio_blocking`, `pg::verify`,
// `audit::verify`) and this root's own short names.
pub use doors::mcp;
use doors::{api, worker_http};
use execution::{fleet, runner};
pub use storage::{audit, pg};

/// The configuration and its schema: its own crate (`agentjail-config`), so that the parser
/// can be fuzzed without building the service.
pub use agentjail_config as config;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use app::Launch;
pub use app::{AppState, ServerError, default_data_dir};
pub use config::Config;

/// The HTTP application: the API ([`api`]), the MCP endpoint ([`mcp`], behind the same
/// bearer authentication) and the operator console ([`doors::console`], its own sessions),
/// composed here so that no transport depends on another.
pub async fn router(state: AppState) -> axum::Router {
    let mcp = mcp::http_router(&state).layer(axum::middleware::from_fn_with_state(
        state.clone(),
        api::auth,
    ));
    let more = mcp.merge(doors::console::router(&state));
    api::router_with(state, more).await
}

/// Options of `agentjail serve`; each overrides the configuration file.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// Configuration file (TOML or YAML). None: the built-in example with the dev token kept in
    /// `DATA/private/dev-token` ([`dev_token`]).
    pub config: Option<PathBuf>,
    /// Listen address (default: the config's, else 127.0.0.1:8787).
    pub listen: Option<SocketAddr>,
    /// Data directory (default: the config's, else `$XDG_DATA_HOME/agentjail/server`).
    pub data_dir: Option<PathBuf>,
    /// Run even where a protection cannot be applied.
    pub allow_degraded: bool,
    /// Shared PostgreSQL store URL (default: the config's `server.database`, else SQLite).
    pub database: Option<String>,
    /// Run slots of this node (default `max_concurrent_runs`); 0 (PostgreSQL only): an API
    /// replica that executes nothing.
    pub slots: Option<usize>,
}

/// `agentjail worker`: an executor of a PostgreSQL deployment, without the HTTP API.
#[derive(Debug, Clone, Default)]
pub struct WorkerOptions {
    /// Configuration file (the one `serve` uses: task types, data dir, database).
    pub config: Option<PathBuf>,
    /// Data directory (job folders, objects, the receipt key); one per worker process.
    pub data_dir: Option<PathBuf>,
    /// PostgreSQL URL (else the config's `server.database`; one of them is required).
    pub database: Option<String>,
    /// Runs executing at once (default `max_concurrent_runs`, else the CPUs); at least 1.
    pub slots: Option<usize>,
    /// The labels this worker has: it claims runs of task types whose labels it all has.
    pub labels: Vec<String>,
    /// This node's id (default the config's `server.node_id`, else the host name).
    pub node_id: Option<String>,
    /// Run even where a protection cannot be applied.
    pub allow_degraded: bool,
    /// Where to serve this worker's `/metrics`, `/healthz` and `/readyz`; None: no listener.
    pub listen: Option<SocketAddr>,
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AGENTJAIL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .try_init();
}

/// Runs a worker until SIGTERM/SIGINT: then it claims no more runs, waits for those it holds
/// and leaves the `workers` table (docs/deploy.md, "The fleet").
pub fn worker_blocking(opts: WorkerOptions) -> Result<(), ServerError> {
    init_tracing();
    let mut config = match &opts.config {
        Some(p) => Config::load(p)?,
        None => {
            return Err(ServerError::Io(
                "agentjail worker needs --config (the task types, keys and data directory the service uses)".into(),
            ));
        }
    };
    if let Some(d) = &opts.data_dir {
        config.server.data_dir = Some(d.clone());
    }
    if let Some(u) = &opts.database {
        config.server.database = Some(u.clone());
    }
    if let Some(n) = &opts.node_id {
        config.server.node_id = Some(n.clone());
    }
    if config.server.database.is_none() {
        return Err(ServerError::Io(
            "agentjail worker needs a PostgreSQL database (--database URL or server.database)"
                .into(),
        ));
    }
    if opts.slots == Some(0) {
        return Err(ServerError::Io(
            "--slots must be at least 1 for a worker".into(),
        ));
    }
    if let Some(l) = opts.labels.iter().find(|l| !config::is_name(l)) {
        return Err(ServerError::Io(format!(
            "--labels: {l:?} is not a label (1-64 of a-z 0-9 _ -)"
        )));
    }
    let Launch {
        data_dir,
        runner,
        allow_degraded,
        rt,
    } = Launch::resolve(&config, opts.allow_degraded, "worker")?;
    selftest::at_startup(&runner, config.server.selftest, &data_dir)?;
    node_facts::spawn_check(runner.clone());
    rt.block_on(async move {
        let state = AppState::open_with(config, &data_dir, runner, allow_degraded, opts.slots)?;
        runner::spawn_sweeper(state.clone());
        let Some(fleet::Started { stop, exec, status }) = fleet::start(&state, opts.labels.clone())
        else {
            return Err(ServerError::Io(
                "agentjail worker needs a PostgreSQL database".into(),
            ));
        };
        if let Some(addr) = opts.listen {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| ServerError::Io(format!("cannot listen on {addr}: {e}")))?;
            let local = listener
                .local_addr()
                .map_err(|e| ServerError::Io(e.to_string()))?;
            let app = worker_http::router(state.clone(), status.clone());
            let settings = state.inner.config.server.clone();
            // Served until the process exits, through the drain after SIGTERM (the probes
            // and the metrics stay readable while the held runs finish).
            tokio::spawn(async move {
                serve_bounded(listener, app, &settings, std::future::pending::<()>()).await;
            });
            eprintln!("agentjail worker: metrics and probes on http://{local}");
            tracing::info!(%local, "worker endpoint listening");
        }
        eprintln!(
            "agentjail worker: claiming runs with {} slot(s), labels [{}] (data in {})",
            state.inner.slots,
            opts.labels.join(","),
            state.data_dir().display()
        );
        shutdown_signal().await;
        tracing::info!("stopping: no more claims; finishing the runs held");
        status.set_draining();
        stop.cancel();
        if let Some(e) = exec {
            let _ = e.await;
        }
        tracing::info!("stopped");
        Ok(())
    })
}

/// The JSON Schema of the configuration.
pub fn config_schema() -> serde_json::Value {
    Config::json_schema()
}

/// The shipped example configuration.
pub fn example_config() -> &'static str {
    config::EXAMPLE_CONFIG
}

/// Starts the service and blocks until SIGINT/SIGTERM. Builds its own tokio runtime.
pub fn serve_blocking(opts: ServeOptions) -> Result<(), ServerError> {
    init_tracing();
    let dev = opts.config.is_none();
    let mut config = match &opts.config {
        Some(p) => Config::load(p)?,
        None => Config::example()?,
    };
    if let Some(l) = opts.listen {
        config.server.listen = Some(l);
    }
    if let Some(d) = &opts.data_dir {
        config.server.data_dir = Some(d.clone());
    }
    if let Some(u) = &opts.database {
        config.server.database = Some(u.clone());
    }
    let listen = config
        .server
        .listen
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8787)));
    let Launch {
        data_dir,
        runner,
        allow_degraded,
        rt,
    } = Launch::resolve(&config, opts.allow_degraded, "serve")?;
    selftest::at_startup(&runner, config.server.selftest, &data_dir)?;
    node_facts::spawn_check(runner.clone());
    // The dev token (no --config): kept in the data directory, reused at every start; shown
    // once the service listens, so that a service that does not start shows none.
    let dev_token = if dev {
        let (token, path) = dev_token::load_or_create(&data_dir)?;
        if let Some(a) = config.actors.get_mut("dev") {
            a.token_sha256 = config::sha256_hex(token.as_bytes());
        }
        Some((token, path))
    } else {
        None
    };
    rt.block_on(async move {
        let state = AppState::open_with(config, &data_dir, runner, allow_degraded, opts.slots)?;
        selftest::publish_metrics();
        runner::spawn_sweeper(state.clone());
        // On PostgreSQL: the lease sweeper, the cluster gauges and (with slots) the executor.
        let _fleet = fleet::start(&state, Vec::new());
        service::spawn_auth_failure_flusher(state.clone());
        let app = router(state.clone()).await;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| ServerError::Io(format!("cannot listen on {listen}: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| ServerError::Io(e.to_string()))?;
        if let Some((token, path)) = &dev_token {
            // Shown here only, for the person starting a local instance; never logged.
            eprintln!(
                "agentjail serve: no --config given; using the built-in example configuration.\nagentjail serve: dev token (actor `dev`, tenant `dev`), kept in {} and reused at every start (delete that file for a new one):\n\n    export AGENTJAIL_TOKEN={token}\n",
                path.display()
            );
        }
        eprintln!(
            "agentjail serve: listening on http://{local} (data in {})",
            state.data_dir().display()
        );
        tracing::info!(%local, "listening");
        serve_bounded(listener, app, &state.inner.config.server, shutdown_signal()).await;
        tracing::info!("stopped; runs still in flight will read `unknown` at the next start");
        Ok(())
    })
}

/// Serves HTTP/1.1 on `listener` with bounds on slow and abusive clients: at most
/// `max_connections` open connections (one beyond is closed at once), and
/// `header_timeout_seconds` to send a request's headers, which is also how long an idle
/// keep-alive connection stays open (hyper's header-read timer runs while it waits for the
/// next request). The body timeout and the up-front 413 are [`api::bound_body`]'s. A client
/// that reads nothing of an answer for `body_timeout_seconds` (a write that cannot progress)
/// is disconnected: a reader that never reads holds no connection slot for long
/// (`agentjail_http_write_stalls_total`). Stops accepting when `stop` completes.
async fn serve_bounded(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    s: &config::ServerSettings,
    stop: impl std::future::Future<Output = ()>,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let slots = Arc::new(Semaphore::new(s.max_connections));
    let header_timeout = Duration::from_secs(s.header_timeout_seconds);
    let write_stall = Duration::from_secs(s.body_timeout_seconds);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let (stream, _peer) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and the like: back off rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            metrics::counter!("agentjail_connections_refused_total").increment(1);
            drop(stream);
            continue;
        };
        let svc = hyper_util::service::TowerToHyperService::new(app.clone());
        // The write timer runs only while a write cannot progress, and restarts with each
        // byte written: a slow reader is served, one that stopped reading is cut off.
        let mut io = tokio_io_timeout::TimeoutStream::new(stream);
        io.set_write_timeout(Some(write_stall));
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .serve_connection(TokioIo::new(Box::pin(io)), svc);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await
                && write_stalled(&e)
            {
                metrics::counter!("agentjail_http_write_stalls_total").increment(1);
                tracing::info!(
                    "a client read nothing of its answer for the body timeout: disconnected"
                );
            }
            drop(permit);
        });
    }
    drop(listener);
    // Requests in progress may finish (a waiting run is killed with the process anyway).
    let _ = tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await;
}

/// Whether a connection ended because a write to its client could not progress in time.
fn write_stalled(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        cur = err.source();
    }
    false
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
