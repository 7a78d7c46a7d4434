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
//! Modules: [`config`] (configuration and its schema), [`db`] (SQLite store), [`audit`]
//! (append-only log), [`api`] (HTTP handlers, problem details, OpenAPI), [`runner`] (jobs),
//! [`mcp`] (the MCP server over stdio and at `/mcp`, on the same code paths).
//! Tested by unit tests here and by `crates/cli/tests/server.rs` over real HTTP.

pub mod api;
pub mod audit;
pub mod config;
pub mod db;
pub mod mcp;
pub mod policy;
pub mod run_state;
pub mod runner;
pub mod selftest;
pub mod service;
pub mod store;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::sync::Semaphore;

pub use config::Config;

/// The HTTP application: the API ([`api`]) and the MCP endpoint ([`mcp`], behind the same
/// bearer authentication), composed here so that neither transport depends on the other.
pub async fn router(state: AppState) -> axum::Router {
    let mcp = mcp::http_router(&state).layer(axum::middleware::from_fn_with_state(
        state.clone(),
        api::auth,
    ));
    api::router_with(state, mcp).await
}

/// Options of `agentjail serve`; each overrides the configuration file.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// Configuration file (TOML or YAML). None: the built-in example with a fresh dev token.
    pub config: Option<PathBuf>,
    /// Listen address (default: the config's, else 127.0.0.1:8787).
    pub listen: Option<SocketAddr>,
    /// Data directory (default: the config's, else `$XDG_DATA_HOME/agentjail/server`).
    pub data_dir: Option<PathBuf>,
    /// Run even where a protection cannot be applied.
    pub allow_degraded: bool,
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("{0}")]
    Io(String),
    #[error("database: {0}")]
    Db(#[from] db::DbError),
    #[error(transparent)]
    Audit(#[from] audit::AuditError),
    #[error(transparent)]
    Store(#[from] store::StoreError),
}

/// The JSON Schema of the configuration.
pub fn config_schema() -> serde_json::Value {
    Config::json_schema()
}

/// The shipped example configuration.
pub fn example_config() -> &'static str {
    config::EXAMPLE_CONFIG
}

/// Everything the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub config: Config,
    pub data_dir: PathBuf,
    pub runner: PathBuf,
    pub allow_degraded: bool,
    /// The storage interface every operation goes through.
    pub store: Arc<dyn store::Store>,
    /// The SQLite handle behind `store`, for tests that inspect the records.
    #[cfg(test)]
    pub db: db::Db,
    pub run_slots: Semaphore,
    /// Runs admitted (queued or running); bounded by concurrency + queue.
    pub admitted: AtomicUsize,
    pub max_admitted: usize,
    pub metrics: PrometheusHandle,
    /// Compiled output schemas by task (validated at start-up).
    pub schemas: std::collections::BTreeMap<String, String>,
    /// Authentication failures not yet audited (aggregated records).
    pub auth_failures: service::AuthFailures,
    /// Exclusive lock on the data directory, held for the life of the process.
    _lock: std::fs::File,
}

impl AppState {
    /// The store.
    pub(crate) fn store(&self) -> &dyn store::Store {
        self.inner.store.as_ref()
    }

    /// Opens the data directory (creating it), the database and the audit log, and reconciles
    /// runs left in flight by a previous process (they become `unknown`; never re-run).
    pub fn open(
        config: Config,
        data_dir: &Path,
        runner: PathBuf,
        allow_degraded: bool,
    ) -> Result<AppState, ServerError> {
        use std::os::unix::fs::PermissionsExt;
        let io = |what: &str, p: &Path, e: std::io::Error| {
            ServerError::Io(format!("{what} {}: {e}", p.display()))
        };
        for d in [
            data_dir.to_path_buf(),
            data_dir.join("objects"),
            data_dir.join("jobs"),
        ] {
            std::fs::create_dir_all(&d).map_err(|e| io("cannot create", &d, e))?;
            // The sandbox user (an unprivileged host uid in root mode) must traverse these.
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| io("cannot set permissions of", &d, e))?;
        }
        let data_dir = data_dir
            .canonicalize()
            .map_err(|e| io("cannot resolve", data_dir, e))?;
        warn_untraversable(&data_dir);
        // Code files wait here for their runs: traversable (the sandbox user reads its code
        // by its unguessable name) but not listable.
        let code = data_dir.join("code");
        std::fs::create_dir_all(&code).map_err(|e| io("cannot create", &code, e))?;
        std::fs::set_permissions(&code, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| io("cannot set permissions of", &code, e))?;
        let private = data_dir.join("private");
        std::fs::create_dir_all(&private).map_err(|e| io("cannot create", &private, e))?;
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io("cannot set permissions of", &private, e))?;
        // One process per data directory: start-up reconciliation marks every in-flight run
        // `unknown`, and the audit chain is kept in memory, so a second `serve` or `mcp` on the
        // same directory would corrupt both.
        let lock_path = private.join("lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io("cannot open", &lock_path, e))?;
        if lock.try_lock().is_err() {
            return Err(ServerError::Io(format!(
                "the data directory {} is in use by another agentjail serve or mcp process; use another --data-dir, or connect to that server's /mcp endpoint",
                data_dir.display()
            )));
        }
        // Create the receipt key now, so concurrent runs never race to create it.
        agentjail_verify::receipt::ReceiptKey::load_or_create(&private.join("receipt-key.pem"))
            .map_err(|e| ServerError::Io(format!("receipt key: {e}")))?;
        let db = db::Db::open(&private.join("agentjail.db"))?;
        let audit = audit::AuditLog::open(&private.join("audit.jsonl"))?;
        let mut schemas = std::collections::BTreeMap::new();
        for (name, t) in &config.tasks {
            if let Some(s) = &t.output.schema {
                let v = s.value().map_err(config::ConfigError)?;
                schemas.insert(
                    name.clone(),
                    serde_json::to_string_pretty(&v).unwrap_or_default(),
                );
            }
        }
        let concurrency = config.server.max_concurrent_runs.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
        });
        let state = AppState {
            inner: Arc::new(Inner {
                max_admitted: concurrency + config.server.max_queued_runs,
                config,
                data_dir,
                runner,
                allow_degraded,
                store: Arc::new(store::SqliteStore::new(db.clone(), audit)),
                #[cfg(test)]
                db,
                run_slots: Semaphore::new(concurrency),
                admitted: AtomicUsize::new(0),
                metrics: metrics_handle(),
                schemas,
                auth_failures: service::AuthFailures::default(),
                _lock: lock,
            }),
        };
        zero_metrics(&state.inner.config);
        runner::reconcile_at_startup(&state)?;
        Ok(state)
    }

    /// The data directory (canonical).
    pub fn data_dir(&self) -> &Path {
        &self.inner.data_dir
    }

    /// The audit log path.
    pub fn audit_path(&self) -> PathBuf {
        self.inner.data_dir.join("private").join("audit.jsonl")
    }
}

/// Logs a warning when some ancestor of the data directory cannot be traversed by other users
/// (the sandbox user could then not reach inputs in root mode).
fn warn_untraversable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for a in dir.ancestors().skip(1) {
        if let Ok(m) = std::fs::metadata(a)
            && m.permissions().mode() & 0o001 == 0
        {
            tracing::warn!(
                dir = %a.display(),
                "an ancestor of the data directory is not traversable by other users; sandboxed runs may not reach their inputs"
            );
            return;
        }
    }
}

/// The process-wide Prometheus recorder (installed once).
fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let buckets = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("agentjail_run_duration_seconds".into()),
                    &buckets,
                )
                .unwrap_or_else(|_| PrometheusBuilder::new());
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics will be empty");
            }
            describe_metrics();
            handle
        })
        .clone()
}

/// Creates every metric family at zero, so that dashboards and alerts see them from start-up
/// (a Prometheus family appears only once it has a series). Labelled families get the series
/// that exist from the start: each task's `ok` runs, each sandbox denial kind, and the
/// commonest policy denial.
fn zero_metrics(config: &Config) {
    for task in config.tasks.keys() {
        metrics::counter!("agentjail_runs_total", "task" => task.clone(), "status" => "ok")
            .increment(0);
    }
    metrics::counter!("agentjail_denials_total", "reason" => "forbidden").increment(0);
    for kind in ["syscall", "filesystem", "network", "limit", "output"] {
        metrics::counter!("agentjail_sandbox_denials_total", "kind" => kind).increment(0);
    }
    for name in [
        "agentjail_auth_failures_total",
        "agentjail_unknown_outcomes_total",
        "agentjail_inputs_stored_total",
        "agentjail_replays_total",
        "agentjail_overload_refusals_total",
        "agentjail_audit_failures_total",
        "agentjail_connections_refused_total",
        "agentjail_mcp_session_refusals_total",
    ] {
        metrics::counter!(name).increment(0);
    }
    metrics::gauge!("agentjail_runs_in_flight").increment(0.0);
}

fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "agentjail_connections_refused_total",
        "Client connections closed at once because max_connections were open"
    );
    describe_counter!("agentjail_runs_total", "Finished runs by task and status");
    describe_counter!("agentjail_denials_total", "Policy denials by reason");
    describe_counter!(
        "agentjail_sandbox_denials_total",
        "Denials reported by the sandbox, by kind"
    );
    describe_counter!(
        "agentjail_auth_failures_total",
        "Requests refused for authentication"
    );
    describe_counter!(
        "agentjail_unknown_outcomes_total",
        "Runs whose outcome became unknown"
    );
    describe_counter!("agentjail_inputs_stored_total", "Inputs uploaded");
    describe_counter!(
        "agentjail_replays_total",
        "Requests answered from the recorded run"
    );
    describe_counter!("agentjail_overload_refusals_total", "Runs refused with 429");
    describe_counter!(
        "agentjail_mcp_tool_calls_total",
        "MCP tool calls by tool and outcome (ok, error, denied, invalid, cancelled)"
    );
    describe_counter!(
        "agentjail_mcp_session_refusals_total",
        "MCP requests naming a session of another actor, refused with 404"
    );
    describe_gauge!("agentjail_runs_in_flight", "Runs executing now");
    describe_histogram!(
        "agentjail_run_duration_seconds",
        "Wall time of runs, subprocess included"
    );
}

/// Default data directory: `$XDG_DATA_HOME/agentjail/server`, `~/.local/share/agentjail/server`,
/// else `./agentjail-data`.
pub fn default_data_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("agentjail").join("server");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(h).join(".local/share/agentjail/server");
    }
    PathBuf::from("agentjail-data")
}

/// Random bytes from the kernel, as lower-case hex.
pub(crate) fn random_hex(n: usize) -> Result<String, std::io::Error> {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(agentjail_manifest::hex(&buf))
}

/// Unix seconds now.
pub(crate) fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// What `serve` and `mcp` both derive from a configuration before they start: the data
/// directory, the `agentjail` binary that runs each job, the degraded-mode switch, and the
/// runtime.
pub(crate) struct Launch {
    pub(crate) data_dir: PathBuf,
    pub(crate) runner: PathBuf,
    pub(crate) allow_degraded: bool,
    pub(crate) rt: tokio::runtime::Runtime,
}

impl Launch {
    pub(crate) fn resolve(config: &Config, allow_degraded: bool) -> Result<Launch, ServerError> {
        let data_dir = config
            .server
            .data_dir
            .clone()
            .unwrap_or_else(default_data_dir);
        let runner = match &config.server.runner {
            Some(r) => r.clone(),
            None => std::env::current_exe()
                .map_err(|e| ServerError::Io(format!("cannot find the agentjail binary: {e}")))?,
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| ServerError::Io(format!("tokio runtime: {e}")))?;
        Ok(Launch {
            data_dir,
            runner,
            allow_degraded: allow_degraded || config.server.allow_degraded,
            rt,
        })
    }
}

/// Starts the service and blocks until SIGINT/SIGTERM. Builds its own tokio runtime.
pub fn serve_blocking(opts: ServeOptions) -> Result<(), ServerError> {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AGENTJAIL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .try_init();
    let mut config = match &opts.config {
        Some(p) => Config::load(p)?,
        None => {
            let mut c = Config::example()?;
            let token = format!(
                "ajt_{}",
                random_hex(32).map_err(|e| ServerError::Io(e.to_string()))?
            );
            if let Some(a) = c.actors.get_mut("dev") {
                a.token_sha256 = config::sha256_hex(token.as_bytes());
            }
            // Printed once, for the person starting a local instance; never logged afterwards.
            eprintln!(
                "agentjail serve: no --config given; using the built-in example configuration.\nagentjail serve: dev token (actor `dev`, tenant `dev`), valid until this process exits:\n\n    export AGENTJAIL_TOKEN={token}\n"
            );
            c
        }
    };
    if let Some(l) = opts.listen {
        config.server.listen = Some(l);
    }
    if let Some(d) = &opts.data_dir {
        config.server.data_dir = Some(d.clone());
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
    } = Launch::resolve(&config, opts.allow_degraded)?;
    selftest::at_startup(&runner, config.server.selftest)?;
    rt.block_on(async move {
        let state = AppState::open(config, &data_dir, runner, allow_degraded)?;
        selftest::publish_metrics();
        runner::spawn_sweeper(state.clone());
        service::spawn_auth_failure_flusher(state.clone());
        let app = router(state.clone()).await;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| ServerError::Io(format!("cannot listen on {listen}: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| ServerError::Io(e.to_string()))?;
        eprintln!(
            "agentjail serve: listening on http://{local} (data in {})",
            state.data_dir().display()
        );
        tracing::info!(%local, "listening");
        serve_bounded(listener, app, &state.inner.config.server).await;
        tracing::info!("stopped; runs still in flight will read `unknown` at the next start");
        Ok(())
    })
}

/// Serves HTTP/1.1 on `listener` with bounds on slow and abusive clients: at most
/// `max_connections` open connections (one beyond is closed at once), and
/// `header_timeout_seconds` to send a request's headers, which is also how long an idle
/// keep-alive connection stays open (hyper's header-read timer runs while it waits for the
/// next request). The body timeout and the up-front 413 are [`api::bound_body`]'s.
async fn serve_bounded(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    s: &config::ServerSettings,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let slots = Arc::new(Semaphore::new(s.max_connections));
    let header_timeout = Duration::from_secs(s.header_timeout_seconds);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut stop = std::pin::pin!(shutdown_signal());
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
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .serve_connection(TokioIo::new(stream), svc);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    // Requests in progress may finish (a waiting run is killed with the process anyway).
    let _ = tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await;
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
