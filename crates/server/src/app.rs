//! The service's shared state ([`AppState`]: configuration, store, admission counters,
//! metrics), its start-up errors, and small helpers every module uses. Depends on no
//! transport and no operation: [`crate::service`] opens it, everything else borrows it.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::sync::Semaphore;

use crate::config::{self, Config};
use crate::storage::audit::{self, Event};
use crate::storage::{db, store};

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

/// A task's output schema: its text (pretty JSON) and its content-addressed file.
#[derive(Debug, Clone)]
pub struct TaskSchema {
    pub text: String,
    pub file: PathBuf,
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
    /// Run slots: runs executing at once on this node (`--slots`, else `max_concurrent_runs`).
    pub run_slots: Arc<Semaphore>,
    /// How many run slots this node has (0: an API replica that executes nothing).
    pub slots: usize,
    /// The PostgreSQL queue, when the store is PostgreSQL: runs are enqueued there and
    /// executors claim them (crate::execution::fleet); None: SQLite, this node runs what it admits.
    pub queue: Option<crate::storage::pg::PgStore>,
    /// Runs admitted (queued or running); bounded by concurrency + queue.
    pub admitted: AtomicUsize,
    pub max_admitted: usize,
    pub metrics: PrometheusHandle,
    /// Compiled output schemas by task (validated at start-up), each with the file it was
    /// written to once at start-up (`DATA/schemas/<sha256>.json`), which runs name.
    pub schemas: std::collections::BTreeMap<String, TaskSchema>,
    /// Authentication failures not yet audited (aggregated records).
    pub auth_failures: AuthFailures,
    /// Followers of runs (`GET /v1/runs/{id}/events`) at once on this node, at most half of
    /// `server.max_connections`: each polls the store and holds a connection, so they are
    /// bounded and never take every connection from the other requests.
    pub followers: Arc<Semaphore>,
    /// The cancellation of each run executing or waiting for a slot on this node, by job id
    /// (`POST /v1/runs/{id}/cancel`; PostgreSQL: the lease renewal asks for it).
    pub cancels:
        std::sync::Mutex<std::collections::HashMap<String, tokio_util::sync::CancellationToken>>,
    /// The news of each run executing or waiting for a slot on this node, by job id: its
    /// followers wait for it instead of polling ([`crate::news`]).
    pub news: crate::news::Board,
    /// The live sandboxes of live sessions on this node ([`crate::live_slots`]).
    pub live: crate::live_slots::LiveSessions,
    /// This node's receipt key (`DATA/private/receipt-key.pem`): the runner signs runs with
    /// it, the service a live session's cells (crate::execution::live_cell).
    pub receipt_key: Arc<agentjail_verify::receipt::ReceiptKey>,
    /// Exclusive lock on the data directory, held for the life of the process.
    pub(crate) _lock: std::fs::File,
}

impl AppState {
    /// The store.
    pub(crate) fn store(&self) -> &dyn store::Store {
        self.inner.store.as_ref()
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

/// The process-wide Prometheus recorder (installed once).
pub(crate) fn metrics_handle() -> PrometheusHandle {
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
pub(crate) fn zero_metrics(config: &Config) {
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
        "agentjail_http_write_stalls_total",
        "agentjail_mcp_session_refusals_total",
        "agentjail_follower_looks_total",
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
    describe_counter!(
        "agentjail_http_write_stalls_total",
        "Client connections closed because the client read nothing of its answer for body_timeout_seconds"
    );
    describe_counter!(
        "agentjail_follower_looks_total",
        "Looks of run followers (SSE, MCP progress) at a run's state and logs"
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
    /// `command`: the subcommand starting (`serve`, `mcp`, `worker`), named in the fixes.
    pub(crate) fn resolve(
        config: &Config,
        allow_degraded: bool,
        command: &str,
    ) -> Result<Launch, ServerError> {
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
        let allow_degraded = allow_degraded || config.server.allow_degraded;
        runner_speaks_results(&runner)?;
        if !allow_degraded {
            strict_preflight(&runner, command)?;
        }
        crate::images::check_at_startup(
            config,
            &crate::images::store_dir(&config.server, &data_dir),
        )
        .map_err(ServerError::Io)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| ServerError::Io(format!("tokio runtime: {e}")))?;
        Ok(Launch {
            data_dir,
            runner,
            allow_degraded,
            rt,
        })
    }
}

/// Before `serve` or `mcp` accepts work: the runner (`server.runner`, by default this binary)
/// must take `run --lifeline --results-on-lifeline`, or every run would end `setup_error`. An
/// older agentjail refuses the flag; the service then refuses to start, saying so.
fn runner_speaks_results(runner: &Path) -> Result<(), ServerError> {
    use std::process::{Command, Stdio};
    let o = Command::new(runner)
        .args(["run", "--lifeline", "--results-on-lifeline", "--help"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| ServerError::Io(format!("cannot run {}: {e}", runner.display())))?;
    if o.status.success() {
        return Ok(());
    }
    Err(ServerError::Io(format!(
        "refusing to start: the runner {} does not take `run --results-on-lifeline` (an agentjail older than this service?); set server.runner to this build or remove it",
        runner.display()
    )))
}

/// Before `serve` or `mcp` accepts work: a strict run of `/bin/true` through the runner, as
/// every job will be run. When a strict run is refused here (an ordinary user without a
/// delegated cgroup, no Landlock), every run would come back `setup_error` and burn its
/// request id; the service refuses to start instead, with the reason and the fix (from
/// `agentjail check`), reworded for `command`: `check` addresses `agentjail run`, and the fix
/// for a service is to start the service (not a run) that way.
fn strict_preflight(runner: &Path, command: &str) -> Result<(), ServerError> {
    use std::process::{Command, Stdio};
    let o = Command::new(runner)
        .args(["run", "--", "/bin/true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .output()
        .map_err(|e| ServerError::Io(format!("cannot run {}: {e}", runner.display())))?;
    if o.status.success() {
        return Ok(());
    }
    let why = String::from_utf8_lossy(&o.stderr);
    let why = why.lines().next().unwrap_or("").trim();
    let why = why.strip_prefix("agentjail: ").unwrap_or(why);
    let why = why.strip_prefix("error: ").unwrap_or(why);
    let why = why
        .split("; hint: `agentjail check` explains")
        .next()
        .unwrap_or(why);
    let fixes = Command::new(runner)
        .args(["check", "--json"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
        .and_then(|v| {
            v["fixes"].as_array().map(|a| {
                a.iter()
                    .filter_map(|f| f.as_str())
                    .filter(|f| f.starts_with("fix:"))
                    .collect::<Vec<_>>()
                    .join("; ")
            })
        })
        .filter(|f| !f.is_empty())
        .map(|f| for_command(&f, command))
        .unwrap_or_else(|| "`agentjail check` says what this host lacks".into());
    Err(ServerError::Io(format!(
        "refusing to start: a strict sandbox run fails here, so every run would end in setup_error ({why}); {fixes}; to start anyway with what is available, `agentjail {command} --allow-degraded` (or server.allow_degraded; each run's report then lists what was not applied)"
    )))
}

/// `check`'s fixes, which address `agentjail run`, reworded for starting `agentjail COMMAND`
/// (a delegated cgroup or root works for the service as for a run: its runners inherit its
/// cgroup and its uid). For `serve` on a systemd host with cgroup v2, the Debian package's
/// unit is named too: it runs `serve` with `Delegate=yes` (packaging/debian/agentjail.service).
fn for_command(fixes: &str, command: &str) -> String {
    let mut f = fixes
        .replace("agentjail run …", &format!("agentjail {command} …"))
        .replace(
            "or run agentjail as root",
            &format!("or run `agentjail {command}` as root"),
        )
        .replace(
            "or run it as root",
            &format!("or run `agentjail {command}` as root"),
        );
    let d = agentjail_engine::check::Delegation::probe(rustix::process::geteuid().as_raw());
    if command == "serve" && d.systemd && d.unified && f.contains("as root") {
        f.push_str(
            ", or as the Debian package's agentjail.service (`systemctl enable --now agentjail`: user agentjail, Delegate=yes)",
        );
    }
    f
}

/// Authentication failures, audited in aggregate: at most one `auth_failure` record per
/// window, whose `reason` counts every failure since the previous record (none is lost: a
/// flusher writes what is pending once the window has passed). Anyone who can reach the port
/// can make failures, so one record each would let them grow the audit log without bound.
#[derive(Default)]
pub(crate) struct AuthFailures(std::sync::Mutex<PendingFailures>);

#[derive(Default)]
pub(crate) struct PendingFailures {
    missing: u64,
    unknown: u64,
    route: String,
    last_record: Option<std::time::Instant>,
}

impl AuthFailures {
    /// Counts one failure; returns the record to write when the window allows one.
    pub(crate) fn record(&self, had_token: bool, route: String, window: Duration) -> Option<Event> {
        let mut p = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if had_token {
            p.unknown += 1;
        } else {
            p.missing += 1;
        }
        p.route = route;
        Self::take_due(&mut p, window)
    }

    /// The pending failures as one record, if any are pending and the window has passed.
    pub(crate) fn flush(&self, window: Duration) -> Option<Event> {
        let mut p = self.0.lock().unwrap_or_else(|e| e.into_inner());
        Self::take_due(&mut p, window)
    }

    fn take_due(p: &mut PendingFailures, window: Duration) -> Option<Event> {
        let n = p.missing + p.unknown;
        if n == 0 || p.last_record.is_some_and(|t| t.elapsed() < window) {
            return None;
        }
        let ev = Event {
            event: "auth_failure",
            decision: Some("deny"),
            reason: Some(format!(
                "{n} authentication failure(s) since the previous record: {} missing bearer token, {} unknown bearer token",
                p.missing, p.unknown
            )),
            route: Some(std::mem::take(&mut p.route)),
            ..Default::default()
        };
        p.missing = 0;
        p.unknown = 0;
        p.last_record = Some(std::time::Instant::now());
        Some(ev)
    }
}
