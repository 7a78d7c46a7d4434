//! The PostgreSQL store: the shared state of several `serve` replicas (docs/server.md,
//! "PostgreSQL"). Runs, inputs (their content as `bytea`), artifacts, reports, receipts and
//! the audit chain live in the database, so any replica answers any GET; the replica that
//! accepted a run executes it and first materialises its inputs from the database into its
//! own content-addressed object folder (`DATA/objects`, checked against their sha256).
//!
//! - Migrations are numbered in `schema_migrations` and applied at start-up in one transaction
//!   under `pg_advisory_xact_lock`, so replicas starting at once apply each exactly once.
//! - Execute-once: `(tenant, request_id)` is the primary key of `runs`; a new run is inserted
//!   with `ON CONFLICT DO NOTHING`, and the loser reads the winner's record.
//! - Each run records its `node_id`; a replica records the end of (and at start-up marks
//!   `unknown`) only its own runs.
//! - The audit trail: one hash chain per node (`audit_log.chain`, the record's `node`). A node
//!   appends to its own chain only, under that chain's advisory lock, inside the transaction
//!   of the write the record accounts for; no node ever waits on another's chain. Every node
//!   records the other chains' heads in its own chain every [`crate::execution::fleet::ANCHOR_EVERY`]
//!   (`audit_anchor`), so a chain cut short or rewritten below an anchored head is detected.
//!   Records are built by [`audit::chain_record`] as in the file log; [`export`] writes the
//!   JSONL that `agentjail audit verify FILE` checks ([`audit::verify_chains`]).
//! - Every session runs under [`SESSION_LIMITS`] (timeouts, keepalives).
//!
//! The password never appears in a URL (refused), a log line or an error: it comes from a
//! 0600 file or `PGPASSWORD`. TLS is not implemented: `sslmode=require` and `verify-*` are
//! refused rather than silently connecting in plaintext.
//!
//! Over 800 lines on purpose: one `PgStore`, whose `Store` implementation and fleet queue
//! (claims, leases, fencing, workers, gauges) share its private pool, node lock and audit
//! chain helpers; each query stays beside the code that binds its parameters and reads its
//! rows. The schema's migrations are apart, in `pg/migrations.rs`.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::{NoTls, Row};

use crate::run_state::RunState;
use crate::storage::audit::{self, AuditError, Event};
use crate::storage::db::{InputRow, Insert, RunFilter, RunListRow, RunRow};
use crate::storage::store::{
    FinishRun, InFlight, RetentionFiles, Store, StoreError, StoreFuture, Swept,
    UNKNOWN_AT_START_UP, WriteObject,
};

pub mod live_checkpoints;
mod migrations;
pub mod sessions;
use migrations::MIGRATIONS;

/// Advisory lock keys (arbitrary constants, fixed forever).
const MIGRATION_LOCK: i64 = 0x6167_6a6c_0001;
const OBJECTS_LOCK: i64 = 0x6167_6a6c_0003;

/// How many migrations this version knows (tests compare `schema_migrations` with it).
pub const SCHEMA_VERSION: usize = MIGRATIONS.len();

/// The connection settings, checked: no password in the URL, no TLS mode that would need TLS.
pub fn connect_config(
    url: &str,
    password: Option<Vec<u8>>,
) -> Result<tokio_postgres::Config, String> {
    // tokio-postgres does not know the verify-* modes; name them before its parser does.
    let lower = url.to_ascii_lowercase();
    if lower.contains("sslmode=verify") || lower.contains("sslmode=require") {
        return Err("the database URL asks for TLS (sslmode=require/verify-ca/verify-full), which agentjail does not support yet; refusing rather than connecting in plaintext (use sslmode=disable on a trusted network or a local socket, see docs/server.md)".into());
    }
    let mut c = tokio_postgres::Config::from_str(url).map_err(|_| {
        // The parser's message can quote the URL (and with it a password): never shown.
        "the database URL is not a valid PostgreSQL connection string (postgres://user@host:port/db)".to_string()
    })?;
    if c.get_password().is_some() {
        return Err("the database URL holds a password; remove it and put it in server.database_password_file (mode 0600) or the PGPASSWORD environment variable".into());
    }
    if c.get_ssl_mode() == SslMode::Require {
        return Err("the database URL requires TLS, which agentjail does not support yet".into());
    }
    // `prefer` would try TLS first and fall back; without TLS support say so plainly.
    c.ssl_mode(SslMode::Disable);
    if c.get_user().is_none() {
        return Err("the database URL names no user (postgres://USER@host:port/db)".into());
    }
    if let Some(p) = password {
        c.password(p);
    }
    c.connect_timeout(Duration::from_secs(5));
    c.application_name("agentjail");
    // This side notices a database host that is gone (keepalives; unacknowledged data).
    c.keepalives(true);
    c.keepalives_idle(Duration::from_secs(5));
    c.keepalives_interval(Duration::from_secs(2));
    c.keepalives_retries(3);
    c.tcp_user_timeout(Duration::from_secs(10));
    let options = match c.get_options() {
        Some(o) if !o.is_empty() => format!("{o} {SESSION_LIMITS}"),
        _ => SESSION_LIMITS.to_string(),
    };
    c.options(&options);
    Ok(c)
}

/// The limits every session of a node runs under (docs/deploy.md, "Clocks and timeouts"), so
/// that a node stopped, killed or cut off cannot hold what its session locked for long:
///
/// - `idle_in_transaction_session_timeout` 5 s: the server ends a session whose client stops
///   talking inside a transaction (a stopped process, a host cut off). Transactions here never
///   wait on their client between statements.
/// - `tcp_keepalives_*` and `tcp_user_timeout`: the server drops the connection of a host that
///   is gone (probes after 5 s idle, every 2 s, 3 lost: ~11 s; unacknowledged data: 10 s),
///   instead of keeping it, and its locks, for TCP's default of hours.
/// - `lock_timeout` 5 s: a statement waits at most that long for a lock (then the operation
///   fails as "unavailable": 503 with Retry-After, or retried by the executor's writes).
/// - `statement_timeout` 60 s: no statement of a node runs longer.
const SESSION_LIMITS: &str = "-c idle_in_transaction_session_timeout=5000 -c lock_timeout=5000 -c statement_timeout=60000 -c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=3 -c tcp_user_timeout=10000";

/// The password: `file` (must be 0600 or stricter; one line) or `PGPASSWORD`; None: neither.
pub fn read_password(file: Option<&Path>) -> Result<Option<Vec<u8>>, String> {
    use std::os::unix::fs::MetadataExt;
    let Some(f) = file else {
        return Ok(std::env::var_os("PGPASSWORD")
            .filter(|v| !v.is_empty())
            .map(std::os::unix::ffi::OsStringExt::into_vec));
    };
    let meta =
        std::fs::metadata(f).map_err(|e| format!("database password file {}: {e}", f.display()))?;
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "database password file {} is readable by others (mode {:o}); chmod 600 it",
            f.display(),
            meta.mode() & 0o777
        ));
    }
    let mut bytes =
        std::fs::read(f).map_err(|e| format!("database password file {}: {e}", f.display()))?;
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    if bytes.is_empty() {
        return Err(format!("database password file {} is empty", f.display()));
    }
    Ok(Some(bytes))
}

/// The database a configuration names, for logs: user, hosts, ports and database name,
/// never a password.
pub fn describe(c: &tokio_postgres::Config) -> String {
    let hosts: Vec<String> = c
        .get_hosts()
        .iter()
        .map(|h| match h {
            Host::Tcp(s) => s.clone(),
            Host::Unix(p) => p.display().to_string(),
        })
        .collect();
    let ports: Vec<String> = c.get_ports().iter().map(u16::to_string).collect();
    format!(
        "postgres://{}@{}:{}/{}",
        c.get_user().unwrap_or(""),
        hosts.join(","),
        ports.join(","),
        c.get_dbname().unwrap_or("")
    )
}

/// This node's id: the configured one, else the host name; checked.
pub fn node_id(configured: Option<&str>) -> Result<String, String> {
    let id = match configured {
        Some(n) => n.to_string(),
        None => rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned(),
    };
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(id)
    } else if configured.is_none() {
        Err("this host has no usable host name; set server.node_id (letters, digits, `.`, `_`, `-`; at most 64 bytes)".into())
    } else {
        Err("server.node_id must be letters, digits, `.`, `_`, `-`, 1 to 64 bytes".into())
    }
}

fn pg_err(e: tokio_postgres::Error) -> StoreError {
    // Connection-level failures (no SQLSTATE), connection exceptions (08…) and operator
    // intervention (57…: shutdown, restart) mean "try again later".
    // So are a lock not granted in time (55P03), a session ended for idling in a transaction
    // (25P03), a deadlock or serialization failure (40P01, 40001): nothing was written.
    match e.code().map(|c| c.code().to_string()) {
        None => StoreError::Unavailable(e.to_string()),
        Some(c)
            if c.starts_with("08")
                || c.starts_with("57")
                || matches!(c.as_str(), "55P03" | "25P03" | "40P01" | "40001") =>
        {
            StoreError::Unavailable(e.to_string())
        }
        Some(_) => StoreError::Database(e.to_string()),
    }
}

fn pool_err(e: deadpool_postgres::PoolError) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => pg_err(e),
        other => StoreError::Unavailable(format!("database pool: {other}")),
    }
}

/// Runs `f` to completion from blocking code (start-up, one-off commands): on the current
/// (multi-threaded) runtime if there is one, else on a runtime of its own.
pub(crate) fn block_on<F: Future>(f: F) -> Result<F::Output, String> {
    match tokio::runtime::Handle::try_current() {
        Ok(h) => Ok(tokio::task::block_in_place(|| h.block_on(f))),
        Err(_) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map(|rt| rt.block_on(f))
            .map_err(|e| format!("tokio runtime: {e}")),
    }
}

/// Builds a pool (lazy: no connection yet).
pub fn pool(c: tokio_postgres::Config, size: usize) -> Result<Pool, String> {
    let mgr = Manager::from_config(
        c,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(mgr)
        .max_size(size.max(2))
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(10)))
        .create_timeout(Some(Duration::from_secs(5)))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .build()
        .map_err(|e| format!("database pool: {e}"))
}

/// Applies the migrations not applied yet, in one transaction under an advisory lock.
pub async fn migrate(pool: &Pool) -> Result<usize, StoreError> {
    let mut c = pool.get().await.map_err(pool_err)?;
    let tx = c.transaction().await.map_err(pg_err)?;
    // Another node may be migrating (it holds the lock for as long as that takes).
    tx.batch_execute("SET LOCAL lock_timeout = '120s'; SET LOCAL statement_timeout = 0")
        .await
        .map_err(pg_err)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(pg_err)?;
    // The queue's statements use gen_random_uuid() (NEW_JOB_ID), core since PostgreSQL 13.
    let version: i32 = tx
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .map_err(pg_err)?
        .get(0);
    if version < 130_000 {
        return Err(StoreError::Database(format!(
            "PostgreSQL 13 or later is needed (the server's server_version_num is {version})"
        )));
    }
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
            version INTEGER PRIMARY KEY,
            applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )",
    )
    .await
    .map_err(pg_err)?;
    let have: i32 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            &[],
        )
        .await
        .map_err(pg_err)?
        .get(0);
    if have as usize > MIGRATIONS.len() {
        return Err(StoreError::Database(format!(
            "the database schema is version {have}, newer than this agentjail knows ({}); upgrade agentjail",
            MIGRATIONS.len()
        )));
    }
    let mut applied = 0;
    for (i, m) in MIGRATIONS.iter().enumerate().skip(have.max(0) as usize) {
        tx.batch_execute(m).await.map_err(pg_err)?;
        let v = (i + 1) as i32;
        tx.execute("INSERT INTO schema_migrations (version) VALUES ($1)", &[&v])
            .await
            .map_err(pg_err)?;
        applied += 1;
    }
    tx.commit().await.map_err(pg_err)?;
    Ok(applied)
}

/// The PostgreSQL store of one replica.
#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    node: String,
    /// The heads the last `audit_anchor` of this node named.
    anchored: Arc<std::sync::Mutex<Option<Vec<audit::Anchor>>>>,
    /// This replica's content-addressed object folder (`DATA/objects`).
    objects: PathBuf,
    /// See [`PgStore::runs_changed`] and [`PgStore::live_news`].
    heard: Arc<Heard>,
}

/// What this node's database session hears from the others, each a counter bumped per
/// notification.
#[derive(Default)]
struct Heard {
    /// `runs_changed`.
    runs: tokio::sync::watch::Sender<u64>,
    /// `live_cells`.
    live: tokio::sync::watch::Sender<u64>,
}

/// The notification channel by which the nodes tell each other of their runs' changes.
const RUNS_CHANGED: &str = "runs_changed";
/// The notification channel by which a live session's cell, queued or ended, is told at once
/// (the executor holding the session claims it, the replica waiting for it answers).
const LIVE_CELLS: &str = "live_cells";

/// SQL for a fresh job id, in the form of [`crate::util::random_hex`]'s (`job_` and 32 hex
/// digits, from PostgreSQL's `gen_random_uuid()`, a core function since PostgreSQL 13): a run
/// whose claim was given up before its start gets one when it goes back to the queue.
const NEW_JOB_ID: &str = "'job_' || replace(gen_random_uuid()::text, '-', '')";

const RUN_COLS: &str = "tenant, request_id, body_sha256, task, actor, job_id, job_expires_at, status, reason, created_at, started_at, finished_at, inputs, report, receipt, artifact, artifact_sha256, outputs_expire_at, logs_expire_at, outputs_deleted, args, manifest_digest";

fn run_from_row(r: &Row) -> Result<RunRow, StoreError> {
    let status: String = r.get(7);
    Ok(RunRow {
        tenant: r.get(0),
        request_id: r.get(1),
        body_sha256: r.get(2),
        task: r.get(3),
        actor: r.get(4),
        job_id: r.get(5),
        job_expires_at: r.get(6),
        status: status
            .parse::<RunState>()
            .map_err(|e| StoreError::Database(format!("runs.status: {e}")))?,
        reason: r.get(8),
        created_at: r.get(9),
        started_at: r.get(10),
        finished_at: r.get(11),
        inputs: r.get(12),
        report: r.get(13),
        receipt: r.get(14),
        artifact: r.get(15),
        artifact_sha256: r.get(16),
        outputs_expire_at: r.get(17),
        logs_expire_at: r.get(18),
        outputs_deleted: r.get(19),
        args: r.get(20),
        manifest_digest: r.get(21),
        // Only where the query selected it (`SELECT {RUN_COLS}, streams`).
        streams: r.try_get("streams").unwrap_or(None),
    })
}

fn input_from_row(r: &Row) -> InputRow {
    InputRow {
        id: r.get(0),
        sha256: r.get(1),
        name: r.get(2),
        media_type: r.get(3),
        bytes: r.get::<_, i64>(4).max(0) as u64,
        created_at: r.get(5),
    }
}

fn is_sha_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The advisory lock a live node holds on its id, for as long as its process lives:
/// `hashtextextended(NODE_LOCK_PREFIX || node, 0)`, session-level, on a connection of its own.
pub const NODE_LOCK_PREFIX: &str = "agentjail-node:";

/// Takes `node`'s id lock on a connection of its own (outside the pool): Ok(Some(client)) holds
/// it (keep the client, and the task driving its connection, alive); Ok(None): a live session
/// holds it (a second process with this id); the description of that session when known.
async fn take_node_lock(
    config: &tokio_postgres::Config,
    node: &str,
    runs_changed: Arc<Heard>,
) -> Result<Result<tokio_postgres::Client, String>, StoreError> {
    let (client, mut conn) = config.connect(NoTls).await.map_err(pg_err)?;
    // The session also listens for `runs_changed` (sent by the other nodes, see
    // [`PgStore::tell_runs_changed`]): each notification bumps the watch channel the console's
    // live runs list follows.
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = futures_util::StreamExt::next(&mut messages).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let heard = if n.channel() == LIVE_CELLS {
                    &runs_changed.live
                } else {
                    &runs_changed.runs
                };
                heard.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {RUNS_CHANGED}; LISTEN {LIVE_CELLS}"))
        .await
        .map_err(pg_err)?;
    // A session of a process killed a moment ago ends as soon as the server reads its EOF:
    // asked again for up to 3 s before refusing.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        let got: bool = client
            .query_one(
                "SELECT pg_try_advisory_lock(hashtextextended($1 || $2, 0))",
                &[&NODE_LOCK_PREFIX, &node],
            )
            .await
            .map_err(pg_err)?
            .get(0);
        if got {
            // The connection's end is watched through the client (`is_closed`).
            return Ok(Ok(client));
        }
        if std::time::Instant::now() >= deadline {
            let holder = client
                .query_opt(
                    "SELECT coalesce(host(a.client_addr), 'a local socket') || ', connected since ' || date_trunc('second', a.backend_start)::text
                     FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                     WHERE l.locktype = 'advisory' AND l.granted
                     AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended($1 || $2, 0)",
                    &[&NODE_LOCK_PREFIX, &node],
                )
                .await
                .ok()
                .flatten()
                .map(|r| r.get::<_, String>(0))
                .unwrap_or_else(|| "a session of another process".into());
            return Ok(Err(holder));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Holds this node's id for as long as the process lives (see [`take_node_lock`]): when the
/// session is lost (a database restart), it is taken again; if another process took the id
/// meanwhile, that is logged as an error every time it is tried.
fn hold_node_lock(
    config: tokio_postgres::Config,
    node: String,
    client: tokio_postgres::Client,
    runs_changed: Arc<Heard>,
) {
    tokio::spawn(async move {
        let mut client = client;
        loop {
            // Poll the session: a closed client means the connection ended.
            while !client.is_closed() {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            tracing::warn!(node = %node, "the database session holding this node's id ended; taking the id again");
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                match take_node_lock(&config, &node, runs_changed.clone()).await {
                    Ok(Ok(c)) => {
                        client = c;
                        break;
                    }
                    Ok(Err(holder)) => {
                        tracing::error!(node = %node, %holder, "another process took this node's id while this one's database session was lost: two processes now use one node id; stop one and give each its own --node-id");
                    }
                    Err(e) => {
                        tracing::warn!(node = %node, error = %e, "taking this node's id again failed; retrying");
                    }
                }
            }
        }
    });
}

impl PgStore {
    /// Connects (checking the database answers), takes this node's id (refused while another
    /// live process holds it), applies migrations, and returns the store.
    pub async fn open(
        pool: Pool,
        config: &tokio_postgres::Config,
        node: String,
        objects: PathBuf,
    ) -> Result<PgStore, StoreError> {
        let runs_changed = Arc::new(Heard::default());
        match take_node_lock(config, &node, runs_changed.clone()).await? {
            Ok(client) => {
                hold_node_lock(config.clone(), node.clone(), client, runs_changed.clone())
            }
            Err(holder) => {
                return Err(StoreError::Database(format!(
                    "node id {node} is in use by a live node ({holder}); each `serve` and `worker` process needs its own: give this one another --node-id (or server.node_id; the default is the host name), or stop the other first"
                )));
            }
        }
        let applied = migrate(&pool).await?;
        if applied > 0 {
            tracing::info!(applied, "database migrations applied");
        }
        Ok(PgStore {
            pool,
            node,
            anchored: Arc::default(),
            objects,
            heard: runs_changed,
        })
    }

    /// Bumped when another node tells of a change to the runs it executes (a notification on
    /// this node's own database session, `LISTEN runs_changed`; its own are heard too); none
    /// arrive while that session is being re-established. For the console's live runs list.
    pub fn runs_changed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.heard.runs.subscribe()
    }

    /// Bumped when a node tells that a live session's cell was queued or ended
    /// ([`PgStore::tell_live_news`]; this node's own are heard too): the executors holding
    /// sessions claim their cells, and replicas waiting for a cell read it, at once instead of
    /// at their next poll. None arrive while the session is being re-established: the polls
    /// go on.
    pub fn live_news(&self) -> tokio::sync::watch::Receiver<u64> {
        self.heard.live.subscribe()
    }

    /// `NOTIFY live_cells`, in a statement of its own after the cell's transaction.
    pub async fn tell_live_news(&self) {
        let told = match self.client().await {
            Ok(c) => c
                .batch_execute(&format!("NOTIFY {LIVE_CELLS}"))
                .await
                .map_err(pg_err),
            Err(e) => Err(e),
        };
        if let Err(e) = told {
            tracing::debug!(error = %e, "telling of a live cell failed; the others find it at their next poll");
        }
    }

    /// Tells every node that this one registered, started or ended a run: `NOTIFY
    /// runs_changed` in a statement of its own, outside any run's transaction (a transaction
    /// that notifies takes a cluster-wide lock at commit, which run commits must not queue
    /// behind); the caller coalesces.
    pub async fn tell_runs_changed(&self) -> Result<(), StoreError> {
        let c = self.client().await?;
        c.batch_execute(&format!("NOTIFY {RUNS_CHANGED}"))
            .await
            .map_err(pg_err)
    }

    /// This replica's node id.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Runs `f` until it succeeds or fails other than "unavailable", for up to 2 minutes:
    /// the writes a run's executor makes (start, end, audit) outlive a database restart
    /// instead of being lost. Each must be idempotent (a commit whose answer was lost is
    /// retried).
    async fn persist<T, F, Fut>(&self, what: &'static str, mut f: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let mut wait = Duration::from_millis(100);
        loop {
            match f().await {
                Err(StoreError::Unavailable(e)) if std::time::Instant::now() < deadline => {
                    tracing::warn!(error = %e, what, "database unavailable; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
                r => return r,
            }
        }
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(pool_err)
    }

    async fn get_run_async(
        &self,
        tenant: &str,
        request_id: &str,
    ) -> Result<Option<RunRow>, StoreError> {
        let c = self.client().await?;
        let row = c
            .query_opt(
                &format!(
                    "SELECT {RUN_COLS}, streams FROM runs WHERE tenant = $1 AND request_id = $2"
                ),
                &[&tenant, &request_id],
            )
            .await
            .map_err(pg_err)?;
        row.as_ref().map(run_from_row).transpose()
    }

    async fn append_audit(&self, ev: &Event) -> Result<(), StoreError> {
        let mut c = self.client().await?;
        let tx = read_committed(&mut c).await?;
        append_audit_in(&tx, &self.node, ev).await?;
        tx.commit().await.map_err(pg_err)?;
        Ok(())
    }

    /// Appends an `audit_anchor` record to this node's chain naming the heads of every other
    /// chain, unless none moved since this node's last anchor; true: one was appended.
    pub async fn anchor(&self) -> Result<bool, StoreError> {
        let mut c = self.client().await?;
        let tx = read_committed(&mut c).await?;
        let heads: Vec<audit::Anchor> = tx
            .query(
                "SELECT chain, seq, hash FROM audit_heads WHERE chain <> $1 ORDER BY chain",
                &[&self.node],
            )
            .await
            .map_err(pg_err)?
            .iter()
            .map(|r| audit::Anchor {
                node: r.get(0),
                seq: r.get::<_, i64>(1).max(0) as u64,
                hash: r.get(2),
            })
            .collect();
        let mut last = self
            .anchored
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if heads.is_empty() || last.as_ref() == Some(&heads) {
            return Ok(false);
        }
        let ev = Event {
            event: "audit_anchor",
            anchors: Some(heads.clone()),
            ..Default::default()
        };
        append_audit_in(&tx, &self.node, &ev).await?;
        tx.commit().await.map_err(pg_err)?;
        last = Some(heads);
        *self.anchored.lock().unwrap_or_else(|e| e.into_inner()) = last;
        Ok(true)
    }

    async fn sweep_async(
        &self,
        now: i64,
        files: Arc<dyn RetentionFiles>,
    ) -> Result<Swept, StoreError> {
        let mut c = self.client().await?;
        // Outputs past their retention: cleared in the database by whichever replica gets
        // there first; each replica deletes the copies in its own job folders.
        let expired = c
            .query(
                "UPDATE runs SET artifact = NULL, receipt = NULL, report = NULL, streams = NULL, outputs_deleted = TRUE
                 WHERE NOT outputs_deleted AND finished_at IS NOT NULL AND outputs_expire_at <= $1
                 RETURNING job_id",
                &[&now],
            )
            .await
            .map_err(pg_err)?;
        let outputs = expired.len();
        for r in &expired {
            files.drop_outputs(&r.get::<_, String>(0));
        }
        let mine = c
            .query(
                "SELECT job_id FROM runs WHERE node_id = $1 AND outputs_deleted AND logs_expire_at > $2",
                &[&self.node, &now],
            )
            .await
            .map_err(pg_err)?;
        for r in &mine {
            files.drop_outputs(&r.get::<_, String>(0));
        }
        // Logs past their retention: cleared in the database (any replica), as each node's job
        // folders below.
        c.execute(
            "UPDATE runs SET stdout_log = NULL, stderr_log = NULL, denials_log = NULL
             WHERE logs_expire_at <= $1
             AND (stdout_log IS NOT NULL OR stderr_log IS NOT NULL OR denials_log IS NOT NULL)",
            &[&now],
        )
        .await
        .map_err(pg_err)?;
        let mut job_folders = 0;
        for r in c
            .query(
                "SELECT job_id FROM runs WHERE node_id = $1 AND finished_at IS NOT NULL AND logs_expire_at <= $2",
                &[&self.node, &now],
            )
            .await
            .map_err(pg_err)?
        {
            if files.drop_job(&r.get::<_, String>(0)) {
                job_folders += 1;
            }
        }
        // Inputs past their retention unless a queued or running run of their tenant refers to
        // them; then objects no input refers to. Under the objects lock, which an upload takes
        // too, so an upload cannot revive an object being deleted.
        let tx = c.transaction().await.map_err(pg_err)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&OBJECTS_LOCK])
            .await
            .map_err(pg_err)?;
        tx.execute(
            "DELETE FROM inputs WHERE expires_at <= $1 AND NOT EXISTS (SELECT 1 FROM runs
                WHERE runs.tenant = inputs.tenant AND runs.status IN ('queued', 'running')
                AND strpos(runs.inputs, '\"' || inputs.id || '\"') > 0)",
            &[&now],
        )
        .await
        .map_err(pg_err)?;
        let gone = tx
            .query(
                "DELETE FROM objects o WHERE NOT EXISTS (SELECT 1 FROM inputs i WHERE i.sha256 = o.sha256)
                 RETURNING sha256",
                &[],
            )
            .await
            .map_err(pg_err)?;
        tx.commit().await.map_err(pg_err)?;
        let objects = gone.len();
        for r in &gone {
            files.drop_object(&r.get::<_, String>(0));
        }
        // This replica's local copies of objects the database no longer holds (deleted by the
        // sweep of another replica).
        let live: std::collections::HashSet<String> = c
            .query("SELECT sha256 FROM objects", &[])
            .await
            .map_err(pg_err)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if let Ok(entries) = std::fs::read_dir(&self.objects) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if is_sha_hex(&name) && !live.contains(&name) {
                    files.drop_object(&name);
                }
            }
        }
        // Session checkpoints nothing refers to any more (any replica), then this node's
        // local copies of checkpoints the database no longer holds, unless written since the
        // oldest cell in flight began (a cell's checkpoint is written here before its end is
        // recorded).
        let checkpoints = self.sweep_checkpoints(&c, now).await?.len();
        let kept: std::collections::HashSet<String> = c
            .query("SELECT substr(sha256, 8) FROM checkpoints", &[])
            .await
            .map_err(pg_err)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let since: Option<i64> = c
            .query_one(
                "SELECT MIN(r.created_at) FROM session_cells c
                 JOIN runs r ON r.tenant = c.tenant AND r.request_id = c.run_request_id
                 WHERE r.status IN ('queued', 'running')",
                &[],
            )
            .await
            .map_err(pg_err)?
            .get(0);
        for (hex, mtime) in files.checkpoints() {
            if !kept.contains(&hex) && since.is_none_or(|t| mtime < t) {
                files.drop_checkpoint(&hex);
            }
        }
        Ok(Swept {
            outputs,
            job_folders,
            objects,
            checkpoints,
        })
    }

    /// Writes the objects `shas` into this replica's object folder unless present, from the
    /// database, each checked against its sha256 (temp file, fsync, rename; 0644 as uploads).
    async fn materialise_async(&self, shas: Vec<String>) -> Result<(), StoreError> {
        use std::io::Write;
        use std::os::unix::fs::PermissionsExt;
        for sha in shas {
            if !is_sha_hex(&sha) {
                return Err(StoreError::Io(format!("not an object name: {sha}")));
            }
            let path = self.objects.join(&sha);
            if path.exists() {
                continue;
            }
            let c = self.client().await?;
            let row = c
                .query_opt("SELECT content FROM objects WHERE sha256 = $1", &[&sha])
                .await
                .map_err(pg_err)?;
            let Some(row) = row else {
                return Err(StoreError::Io(format!(
                    "object {sha} is not in the database"
                )));
            };
            let content: Vec<u8> = row.get(0);
            if crate::config::sha256_hex(&content) != sha {
                return Err(StoreError::Io(format!(
                    "object {sha} in the database does not match its hash"
                )));
            }
            let dir = self.objects.clone();
            tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                let tmp = dir.join(format!(".tmp-{}", crate::util::random_hex(8)?));
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&tmp)?;
                f.write_all(&content)?;
                f.sync_all()?;
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
                std::fs::rename(&tmp, dir.join(&sha))
            })
            .await
            .map_err(|e| StoreError::Io(e.to_string()))?
            .map_err(|e| StoreError::Io(e.to_string()))?;
        }
        Ok(())
    }
}

impl Store for PgStore {
    fn put_input(
        &self,
        tenant: &str,
        row: InputRow,
        expires_at: i64,
        body: Arc<[u8]>,
        _write_object: WriteObject,
    ) -> StoreFuture<'_, ()> {
        let tenant = tenant.to_string();
        Box::pin(async move {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(pg_err)?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&OBJECTS_LOCK])
                .await
                .map_err(pg_err)?;
            tx.execute(
                "INSERT INTO objects (sha256, content, created_at) VALUES ($1, $2, $3) ON CONFLICT (sha256) DO NOTHING",
                &[&row.sha256, &&body[..], &row.created_at],
            )
            .await
            .map_err(pg_err)?;
            tx.execute(
                "INSERT INTO inputs (id, tenant, sha256, name, media_type, bytes, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                &[&row.id, &tenant, &row.sha256, &row.name, &row.media_type, &(row.bytes as i64), &row.created_at, &expires_at],
            )
            .await
            .map_err(pg_err)?;
            tx.commit().await.map_err(pg_err)?;
            Ok(())
        })
    }

    fn get_inputs(&self, tenant: &str, ids: &[String]) -> StoreFuture<'_, Vec<Option<InputRow>>> {
        let (tenant, ids) = (tenant.to_string(), ids.to_vec());
        Box::pin(async move {
            let c = self.client().await?;
            let mut out = Vec::with_capacity(ids.len());
            for id in &ids {
                let r = c
                    .query_opt(
                        "SELECT id, sha256, name, media_type, bytes, created_at FROM inputs WHERE id = $1 AND tenant = $2",
                        &[id, &tenant],
                    )
                    .await
                    .map_err(pg_err)?;
                out.push(r.as_ref().map(input_from_row));
            }
            Ok(out)
        })
    }

    fn get_run(&self, tenant: &str, request_id: &str) -> StoreFuture<'_, Option<RunRow>> {
        let (t, r) = (tenant.to_string(), request_id.to_string());
        Box::pin(async move { self.get_run_async(&t, &r).await })
    }

    fn keeps_logs(&self) -> bool {
        true
    }

    fn run_log_since(
        &self,
        job_id: &str,
        stdout: bool,
        offset: u64,
        max: u64,
    ) -> StoreFuture<'_, Option<Vec<u8>>> {
        let job_id = job_id.to_string();
        Box::pin(async move {
            self.column_since(&job_id, log_column(stdout), offset, max)
                .await
                .map(Some)
        })
    }

    fn run_denials_since(
        &self,
        job_id: &str,
        offset: u64,
        max: u64,
    ) -> StoreFuture<'_, Option<Vec<u8>>> {
        let job_id = job_id.to_string();
        Box::pin(async move {
            self.column_since(&job_id, DENIALS_COLUMN, offset, max)
                .await
                .map(Some)
        })
    }

    fn run_log(&self, job_id: &str, stdout: bool) -> StoreFuture<'_, Option<Vec<u8>>> {
        let job_id = job_id.to_string();
        Box::pin(async move {
            let c = self.client().await?;
            let sql = format!("SELECT {} FROM runs WHERE job_id = $1", log_column(stdout));
            let row = c.query_opt(&sql, &[&job_id]).await.map_err(pg_err)?;
            Ok(row.and_then(|r| r.get::<_, Option<Vec<u8>>>(0)))
        })
    }

    fn list_runs(&self, f: RunFilter) -> StoreFuture<'_, Vec<RunListRow>> {
        Box::pin(async move {
            let c = self.client().await?;
            // The shared query with PostgreSQL's numbered parameters, each typed (a NULL
            // parameter has no type to infer).
            let sql = crate::storage::db::list_runs_sql(&f)
                .replace("?11", "$11::text")
                .replace("?10", "$10::text")
                .replace("?1", "$1::text")
                .replace("?2", "$2::text")
                .replace("?3", "$3::text")
                .replace("?4", "$4::bigint")
                .replace("?5", "$5::bigint")
                .replace("?6", "$6::bigint")
                .replace("?7", "$7::text")
                .replace("?8", "$8::text")
                .replace("?9", "$9::bigint");
            let status = f.status.map(|s| s.as_str());
            let (at, tenant, rid) = match &f.after {
                Some((a, t, r)) => (Some(*a), Some(t.clone()), Some(r.clone())),
                None => (None, None, None),
            };
            let limit = i64::from(f.limit);
            let rows = c
                .query(
                    &sql,
                    &[
                        &f.tenant,
                        &status,
                        &f.task,
                        &f.created_from,
                        &f.created_to,
                        &at,
                        &tenant,
                        &rid,
                        &limit,
                        &f.request_id,
                        &f.viewer,
                    ],
                )
                .await
                .map_err(pg_err)?;
            rows.iter()
                .map(|r| {
                    let status: String = r.get(4);
                    Ok(RunListRow {
                        tenant: r.get(0),
                        request_id: r.get(1),
                        task: r.get(2),
                        actor: r.get(3),
                        status: status
                            .parse::<RunState>()
                            .map_err(|e| StoreError::Database(format!("runs.status: {e}")))?,
                        reason: r.get(5),
                        created_at: r.get(6),
                        started_at: r.get(7),
                        finished_at: r.get(8),
                        job_id: r.get(9),
                    })
                })
                .collect()
        })
    }

    fn insert_run(&self, row: RunRow) -> StoreFuture<'_, Insert> {
        Box::pin(async move {
            let c = self.client().await?;
            let status = row.status.as_str();
            let n = c
                .execute(
                    &format!("INSERT INTO runs ({RUN_COLS}, node_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23)
                     ON CONFLICT (tenant, request_id) DO NOTHING"),
                    &[
                        &row.tenant, &row.request_id, &row.body_sha256, &row.task, &row.actor,
                        &row.job_id, &row.job_expires_at, &status, &row.reason, &row.created_at,
                        &row.started_at, &row.finished_at, &row.inputs, &row.report, &row.receipt,
                        &row.artifact, &row.artifact_sha256, &row.outputs_expire_at,
                        &row.logs_expire_at, &row.outputs_deleted, &row.args, &row.manifest_digest,
                        &self.node,
                    ],
                )
                .await
                .map_err(pg_err)?;
            drop(c);
            if n == 1 {
                return Ok(Insert::Inserted);
            }
            // The conflicting insert has committed (ON CONFLICT waited for it): read it.
            match self.get_run_async(&row.tenant, &row.request_id).await? {
                Some(existing) => Ok(Insert::Exists(Box::new(existing))),
                None => Err(StoreError::Database(
                    "a conflicting run vanished after its insert".into(),
                )),
            }
        })
    }

    fn mark_running(&self, job_id: &str, now: i64) -> StoreFuture<'_, bool> {
        let id = job_id.to_string();
        Box::pin(self.persist("mark_running", move || {
            let id = id.clone();
            async move {
                let c = self.client().await?;
                // Idempotent: a retry after a lost answer finds its own `started_at`.
                let n = c
                    .execute(
                        "UPDATE runs SET status = 'running', started_at = $2
                         WHERE job_id = $1 AND node_id = $3
                         AND (status = 'queued' OR (status = 'running' AND started_at = $2))",
                        &[&id, &now, &self.node],
                    )
                    .await
                    .map_err(pg_err)?;
                Ok(n == 1)
            }
        }))
    }

    fn finish_run(&self, f: FinishRun) -> StoreFuture<'_, ()> {
        Box::pin(self.persist("finish_run", move || {
            let f = f.clone();
            async move {
                let c = self.client().await?;
                let status = f.status.as_str();
                c.execute(
                    "UPDATE runs SET status = $2, reason = $3, finished_at = $4, report = $5, receipt = $6, artifact = $7, artifact_sha256 = $8, streams = $10, stdout_log = $11, stderr_log = $12, denials_log = $13
                     WHERE job_id = $1 AND status IN ('queued', 'running') AND node_id = $9",
                    &[&f.job_id, &status, &f.reason, &f.now, &f.report, &f.receipt, &f.artifact, &f.artifact_sha256, &self.node, &f.streams, &f.logs.as_ref().map(|l| &l.0), &f.logs.as_ref().map(|l| &l.1), &f.denials],
                )
                .await
                .map_err(pg_err)?;
                Ok(())
            }
        }))
    }

    fn reconcile(
        &self,
        tenant: &str,
        request_id: &str,
        retry: Option<(String, i64)>,
        now: i64,
        record: Event,
    ) -> StoreFuture<'_, bool> {
        let (t, r) = (tenant.to_string(), request_id.to_string());
        Box::pin(async move {
            let mut c = self.client().await?;
            let tx = read_committed(&mut c).await?;
            let n = match retry {
                // The replica that retries runs the new attempt: it becomes the run's node.
                Some((job_id, expires)) => tx
                    .execute(
                        "UPDATE runs SET status = 'queued', reason = NULL, job_id = $3, job_expires_at = EXTRACT(EPOCH FROM clock_timestamp())::bigint + $4, started_at = NULL, finished_at = NULL, report = NULL, receipt = NULL, artifact = NULL, artifact_sha256 = NULL, streams = NULL, stdout_log = NULL, stderr_log = NULL, denials_log = NULL, node_id = $5
                         WHERE tenant = $1 AND request_id = $2 AND status = 'unknown'",
                        &[&t, &r, &job_id, &(expires - crate::util::now()), &self.node],
                    )
                    .await
                    .map_err(pg_err)?,
                None => tx
                    .execute(
                        "UPDATE runs SET status = 'abandoned', reason = 'abandoned by an operator after an unknown outcome', finished_at = $3
                         WHERE tenant = $1 AND request_id = $2 AND status = 'unknown'",
                        &[&t, &r, &now],
                    )
                    .await
                    .map_err(pg_err)?,
            };
            // The change and its record commit together, or neither does.
            if n == 1 {
                append_audit_in(&tx, &self.node, &record).await?;
            }
            tx.commit().await.map_err(pg_err)?;
            Ok(n == 1)
        })
    }

    fn mark_in_flight_unknown(&self, now: i64) -> Result<(Vec<InFlight>, Vec<String>), StoreError> {
        block_on(async {
            let mut c = self.client().await?;
            let tx = read_committed(&mut c).await?;
            // Claimed by this node but never started (the runner gets its manifest only after
            // the `running` mark): back to the queue under a new job id, nothing of it ran. The
            // old ids are returned: their folders, prepared before the mark, are removed.
            let given_up = tx
                .query(
                    &format!(
                        "WITH given_up AS (
                            SELECT job_id FROM runs WHERE owner = $1 AND status = 'queued' FOR UPDATE)
                         UPDATE runs r SET owner = NULL, fence = NULL, lease_expires_at = NULL, job_id = {NEW_JOB_ID}
                         FROM given_up g WHERE r.job_id = g.job_id
                         RETURNING g.job_id"
                    ),
                    &[&self.node],
                )
                .await
                .map_err(pg_err)?
                .iter()
                .map(|r| r.get(0))
                .collect();
            // Running here, or admitted here before the queue existed (no spec): unknown.
            // Queued runs nobody claimed stay queued: any executor takes them.
            let rows = tx
                .query(
                    "UPDATE runs SET status = 'unknown', reason = 'the service stopped while the run was in flight; its outcome is unknown', finished_at = $1
                     WHERE node_id = $2 AND (status = 'running' OR (status = 'queued' AND spec IS NULL))
                     RETURNING tenant, request_id, task, job_id",
                    &[&now, &self.node],
                )
                .await
                .map_err(pg_err)?;
            let unknown: Vec<InFlight> = rows
                .iter()
                .map(|r| InFlight {
                    tenant: r.get(0),
                    request_id: r.get(1),
                    task: r.get(2),
                    job_id: r.get(3),
                })
                .collect();
            // Each marking's record commits with it.
            for run in &unknown {
                append_audit_in(&tx, &self.node, &run.unknown_event(UNKNOWN_AT_START_UP.into())).await?;
            }
            tx.commit().await.map_err(pg_err)?;
            Ok((unknown, given_up))
        })
        .map_err(StoreError::Io)?
    }

    fn sweep(&self, now: i64, files: Arc<dyn RetentionFiles>) -> StoreFuture<'_, Swept> {
        Box::pin(self.sweep_async(now, files))
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let c = self.client().await?;
            c.execute("SELECT 1", &[]).await.map_err(pg_err)?;
            Ok(())
        })
    }

    fn materialise(&self, sha256s: Vec<String>) -> StoreFuture<'_, ()> {
        Box::pin(self.materialise_async(sha256s))
    }

    fn audit(&self, ev: Event) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if let Err(e) = self.persist("audit", || self.append_audit(&ev)).await {
                metrics::counter!("agentjail_audit_failures_total").increment(1);
                tracing::error!(error = %e, "audit append failed");
            }
        })
    }

    fn audit_blocking(&self, ev: &Event) -> Result<(), StoreError> {
        block_on(self.persist("audit", || self.append_audit(ev))).map_err(StoreError::Io)?
    }
}

/// A transaction at READ COMMITTED whatever the database's default: the audit chain's
/// append reads the head after taking its lock and must see the last committed record.
async fn read_committed(
    c: &mut deadpool_postgres::Object,
) -> Result<deadpool_postgres::Transaction<'_>, StoreError> {
    c.build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::ReadCommitted)
        .start()
        .await
        .map_err(pg_err)
}

/// Limits the statements that follow in `tx` to what is left of `deadline` less
/// [`MARK_MARGIN`]; [`StoreError::Fenced`] when nothing is left.
async fn within(
    tx: &deadpool_postgres::Transaction<'_>,
    deadline: std::time::Instant,
    fence: i64,
) -> Result<(), StoreError> {
    let ms = deadline
        .saturating_duration_since(std::time::Instant::now())
        .saturating_sub(MARK_MARGIN)
        .as_millis();
    if ms == 0 {
        return Err(StoreError::Fenced(fence));
    }
    tx.batch_execute(&format!("SET LOCAL statement_timeout = {ms}"))
        .await
        .map_err(pg_err)
}

/// How long before the executor's own end of a lease its `running` mark must have committed:
/// the runner then still gets its manifest before the executor would kill it.
pub const MARK_MARGIN: Duration = Duration::from_millis(1000);

/// The advisory lock key of `node`'s audit chain: `hashtextextended(AUDIT_LOCK_PREFIX ||
/// node, 0)`, computed by the database (a test can hold it the same way).
pub const AUDIT_LOCK_PREFIX: &str = "agentjail-audit-chain:";

/// Appends `ev` to `node`'s audit chain inside `tx` (READ COMMITTED, see [`read_committed`]):
/// takes that chain's advisory lock (held to the end of `tx`; only this node's own
/// transactions ever take it, so a node stopped or cut off mid-append holds up no other node),
/// reads the chain's head, inserts the next record (its `node` names the chain) and moves the
/// head in `audit_heads`. Committed with `tx`, so a record and the write it accounts for land
/// together or not at all.
async fn append_audit_in(
    tx: &deadpool_postgres::Transaction<'_>,
    node: &str,
    ev: &Event,
) -> Result<(), StoreError> {
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1 || $2, 0))",
        &[&AUDIT_LOCK_PREFIX, &node],
    )
    .await
    .map_err(pg_err)?;
    let head = tx
        .query_opt(
            "SELECT seq, hash FROM audit_log WHERE chain = $1 ORDER BY seq DESC LIMIT 1",
            &[&node],
        )
        .await
        .map_err(pg_err)?;
    let (seq, prev) = match head {
        Some(r) => (r.get::<_, i64>(0), r.get::<_, String>(1)),
        None => (0, audit::GENESIS.to_string()),
    };
    let next = seq + 1;
    let ev = Event {
        node: Some(node.to_string()),
        ..ev.clone()
    };
    let (line, hash) = audit::chain_record(&ev, next as u64, &prev)?;
    tx.execute(
        "INSERT INTO audit_log (chain, seq, hash, record) VALUES ($1, $2, $3, $4)",
        &[&node, &next, &hash, &line],
    )
    .await
    .map_err(pg_err)?;
    tx.execute(
        "INSERT INTO audit_heads (chain, seq, hash) VALUES ($1, $2, $3)
         ON CONFLICT (chain) DO UPDATE SET seq = EXCLUDED.seq, hash = EXCLUDED.hash",
        &[&node, &next, &hash],
    )
    .await
    .map_err(pg_err)?;
    Ok(())
}

/// Connects for a one-off command (`audit verify|export --database`).
async fn one_client(
    url: &str,
    password_file: Option<&Path>,
) -> Result<deadpool_postgres::Object, String> {
    let c = connect_config(url, read_password(password_file)?)?;
    let where_ = describe(&c);
    let p = pool(c, 2)?;
    let c = p
        .get()
        .await
        .map_err(|e| format!("cannot connect to {where_}: {}", pool_err(e)))?;
    // Reading a long chain may take longer than a node's statements may.
    c.batch_execute("SET statement_timeout = 0")
        .await
        .map_err(|e| format!("{where_}: {}", pg_err(e)))?;
    Ok(c)
}

/// The audit chain in the database, as the JSONL lines of the file log, in order.
async fn audit_lines(url: &str, password_file: Option<&Path>) -> Result<Vec<String>, String> {
    let c = one_client(url, password_file).await?;
    let rows = c
        .query("SELECT record FROM audit_log ORDER BY chain, seq", &[])
        .await
        .map_err(|e| format!("reading the audit chain: {}", pg_err(e)))?;
    Ok(rows.iter().map(|r| r.get::<_, String>(0)).collect())
}

/// Why [`verify`] failed.
#[derive(Debug)]
pub enum VerifyError {
    /// The chain could not be read (connection, password, permissions).
    Access(String),
    /// The chain is broken at the record named.
    Broken(String),
}

/// `agentjail audit verify --database`: verifies every node's chain in the database and the
/// cross-anchors between them ([`audit::verify_chains`]).
pub fn verify(url: &str, password_file: Option<&Path>) -> Result<audit::Verified, VerifyError> {
    let lines = block_on(audit_lines(url, password_file))
        .and_then(|r| r)
        .map_err(VerifyError::Access)?;
    audit::verify_chains(lines.into_iter().map(Ok::<_, AuditError>))
        .map_err(|e| VerifyError::Broken(format!("in the database: {e}")))
}

/// `agentjail audit export --database`: writes the chain as JSONL (the file log's format).
pub fn export(
    url: &str,
    password_file: Option<&Path>,
    out: &mut dyn std::io::Write,
) -> Result<u64, String> {
    let lines = block_on(audit_lines(url, password_file))??;
    let mut n = 0;
    for l in lines {
        out.write_all(l.as_bytes())
            .and_then(|()| out.write_all(b"\n"))
            .map_err(|e| format!("writing the export: {e}"))?;
        n += 1;
    }
    out.flush()
        .map_err(|e| format!("writing the export: {e}"))?;
    Ok(n)
}

// ---------------------------------------------------------------------------------------------
// The queue: claims, leases, fencing (docs/deploy.md, "Leases and fencing")

/// The column of a run's stored log of stdout (`stdout`) or stderr.
fn log_column(stdout: bool) -> &'static str {
    if stdout { "stdout_log" } else { "stderr_log" }
}

/// The column of a run's stored live denials (`execution::denials`).
const DENIALS_COLUMN: &str = "denials_log";

/// The interpreter run holding the live session of the queued cell `runs` (in a claim's
/// subquery): in flight under an unexpired lease.
const HELD: &str = "SELECT 1 FROM runs i WHERE i.interpreter_of = runs.live_cell_of
    AND i.status IN ('queued', 'running') AND i.lease_expires_at > clock_timestamp()";

/// What a cancel did ([`PgStore::cancel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancel {
    /// The run was in the queue, unclaimed: it is `cancelled` now and never starts.
    Ended,
    /// Claimed or running: its executor kills it at its next lease renewal.
    Requested,
    /// As `Requested`, by an earlier cancel.
    AlreadyRequested,
    /// It had ended already: nothing changed.
    Final,
}

/// What an executor needs to run a run it did not admit, stored with the run (`runs.spec`)
/// until it ends: its inputs' records and its code.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct JobSpec {
    pub inputs: Vec<InputRow>,
    pub code: Option<String>,
    /// A session's cell: its place in the session and the checkpoint it starts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<crate::storage::sessions::CellJob>,
}

/// A run this node claimed: its record, its spec and its fencing token.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub run: RunRow,
    pub spec: String,
    pub fence: i64,
    /// Seconds left before the job id expires, by the database's clock at the claim (the
    /// executor translates it into its own clock: no two hosts' wall clocks are compared).
    pub job_left: i64,
}

/// The most of a node's published facts (`workers.facts`, crate::node_facts) a reader takes:
/// a node's own are a few KiB.
pub const FACTS_LIMIT: usize = 64 * 1024;

/// A claim's row (`RETURNING {RUN_COLS}, spec, fence, job_expires_at - now`).
fn claimed_from(r: &Row) -> Result<Claimed, StoreError> {
    Ok(Claimed {
        run: run_from_row(r)?,
        spec: r.get(22),
        fence: r.get(23),
        job_left: r.get(24),
    })
}

/// A run whose lease expired while it ran (now `unknown`).
#[derive(Debug, Clone)]
pub struct Expired {
    pub run: InFlight,
    pub owner: String,
}

impl Expired {
    /// The `run_unknown` audit record of this marking.
    pub fn unknown_event(&self) -> Event {
        self.run.unknown_event(format!(
            "the lease of node {} expired while the run was running; marked unknown, not re-run",
            self.owner
        ))
    }
}

/// The cluster's gauges, read from the database.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClusterGauges {
    pub queue_depth: i64,
    pub oldest_queued_seconds: i64,
    pub live_workers: i64,
    pub expired_leases: i64,
}

impl PgStore {
    /// Records a new queued run with what an executor needs to run it (`spec`) and the labels
    /// an executor must have, unless one with its (tenant, request_id) exists (atomically, as
    /// [`Store::insert_run`]), with its `accepted` record (`run_accepted`) in the same
    /// transaction: a node killed in between leaves neither, never a run the chain does not
    /// account for. A conflict appends nothing.
    pub async fn enqueue(
        &self,
        row: RunRow,
        spec: &JobSpec,
        labels: &[String],
        accepted: &Event,
    ) -> Result<Insert, StoreError> {
        let spec = serde_json::to_string(spec)
            .map_err(|e| StoreError::Database(format!("encoding a run's spec: {e}")))?;
        let labels = labels.to_vec();
        let mut c = self.client().await?;
        let tx = read_committed(&mut c).await?;
        let n = self.insert_queued(&tx, &row, &spec, &labels).await?;
        if n == 1 {
            append_audit_in(&tx, &self.node, accepted).await?;
        }
        tx.commit().await.map_err(pg_err)?;
        drop(c);
        if n == 1 {
            return Ok(Insert::Inserted);
        }
        match self.get_run_async(&row.tenant, &row.request_id).await? {
            Some(existing) => Ok(Insert::Exists(Box::new(existing))),
            None => Err(StoreError::Database(
                "a conflicting run vanished after its insert".into(),
            )),
        }
    }

    /// In `tx`: inserts `row` as a queued run with its `spec` (JSON) and `labels` unless one
    /// with its (tenant, request_id) exists; the rows inserted (0 or 1).
    async fn insert_queued(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        row: &RunRow,
        spec: &str,
        labels: &[String],
    ) -> Result<u64, StoreError> {
        let status = row.status.as_str();
        let labels = labels.to_vec();
        tx.execute(
            // The job id's expiry: the time to live the replica gave it, from the
            // database's clock (executors compare it with that clock, never their own).
            &format!("INSERT INTO runs ({RUN_COLS}, node_id, spec, labels) VALUES ($1, $2, $3, $4, $5, $6, EXTRACT(EPOCH FROM clock_timestamp())::bigint + $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25)
             ON CONFLICT (tenant, request_id) DO NOTHING"),
            &[
                &row.tenant, &row.request_id, &row.body_sha256, &row.task, &row.actor,
                &row.job_id, &(row.job_expires_at - row.created_at), &status, &row.reason, &row.created_at,
                &row.started_at, &row.finished_at, &row.inputs, &row.report, &row.receipt,
                &row.artifact, &row.artifact_sha256, &row.outputs_expire_at,
                &row.logs_expire_at, &row.outputs_deleted, &row.args, &row.manifest_digest,
                &self.node, &spec, &labels,
            ],
        )
        .await
        .map_err(pg_err)
    }

    /// Runs waiting for an executor (queued, unclaimed).
    pub async fn queue_depth(&self) -> Result<i64, StoreError> {
        let c = self.client().await?;
        let r = c
            .query_one(
                "SELECT count(*) FROM runs WHERE status = 'queued' AND owner IS NULL",
                &[],
            )
            .await
            .map_err(pg_err)?;
        Ok(r.get(0))
    }

    /// Claims the oldest queued run whose labels this executor has (`FOR UPDATE SKIP LOCKED`:
    /// concurrent claimers never wait for, nor take, the same row): owner = this node, a new
    /// fencing token, the lease until the database's `clock_timestamp() + lease`. A live
    /// session's cell only when no interpreter holds its session.
    pub async fn claim(
        &self,
        labels: &[String],
        lease: Duration,
    ) -> Result<Option<Claimed>, StoreError> {
        let labels = labels.to_vec();
        let which = format!("labels <@ $3 AND (live_cell_of IS NULL OR NOT EXISTS ({HELD}))");
        self.claim_where(&which, lease, &[&labels]).await
    }

    /// Claims the oldest queued cell of a live session whose interpreter this node holds
    /// (its run in flight, owned here, under an unexpired lease): those cells go to this node
    /// only, and need no run slot (the interpreter holds one). As [`PgStore::claim`] otherwise.
    pub async fn claim_held(&self, lease: Duration) -> Result<Option<Claimed>, StoreError> {
        let which = format!("live_cell_of IS NOT NULL AND EXISTS ({HELD} AND i.owner = $1)");
        self.claim_where(&which, lease, &[]).await
    }

    /// The claim of [`PgStore::claim`] and [`PgStore::claim_held`]: the oldest queued,
    /// unclaimed run with a spec that matches `which` (`$1`: this node, `$2`: the lease's
    /// seconds, `$3…`: `more`).
    async fn claim_where(
        &self,
        which: &str,
        lease: Duration,
        more: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Option<Claimed>, StoreError> {
        let secs = lease.as_secs_f64();
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&self.node, &secs];
        params.extend_from_slice(more);
        let c = self.client().await?;
        let row = c
            .query_opt(
                &format!(
                    "UPDATE runs SET owner = $1, node_id = $1, fence = nextval('run_fence'),
                        lease_expires_at = clock_timestamp() + make_interval(secs => $2)
                     WHERE (tenant, request_id) = (
                        SELECT tenant, request_id FROM runs
                        WHERE status = 'queued' AND owner IS NULL AND spec IS NOT NULL AND {which}
                        ORDER BY created_at, job_id LIMIT 1 FOR UPDATE SKIP LOCKED)
                     AND status = 'queued' AND owner IS NULL
                     RETURNING {RUN_COLS}, spec, fence, job_expires_at - EXTRACT(EPOCH FROM clock_timestamp())::bigint"
                ),
                &params,
            )
            .await
            .map_err(pg_err)?;
        row.as_ref().map(claimed_from).transpose()
    }

    /// Gives back the claim `fence` of the queued run `job_id` (not started): unclaimed, for
    /// any executor.
    pub async fn give_back(&self, job_id: &str, fence: i64) -> Result<(), StoreError> {
        let c = self.client().await?;
        c.execute(
            "UPDATE runs SET owner = NULL, fence = NULL, lease_expires_at = NULL
             WHERE job_id = $1 AND fence = $2 AND status = 'queued'",
            &[&job_id, &fence],
        )
        .await
        .map_err(pg_err)?;
        Ok(())
    }

    /// Extends the lease of `job_id` held with `fence` to `clock_timestamp() + lease`; None:
    /// refused (the lease expired or was taken, or the run ended); otherwise whether a cancel
    /// of the run was requested (`POST /v1/runs/{id}/cancel` on any node).
    pub async fn heartbeat(
        &self,
        job_id: &str,
        fence: i64,
        lease: Duration,
    ) -> Result<Option<bool>, StoreError> {
        let secs = lease.as_secs_f64();
        let c = self.client().await?;
        let row = c
            .query_opt(
                "UPDATE runs SET lease_expires_at = clock_timestamp() + make_interval(secs => $3)
                 WHERE job_id = $1 AND fence = $2 AND status IN ('queued', 'running')
                 AND lease_expires_at > clock_timestamp()
                 RETURNING cancel_requested",
                &[&job_id, &fence, &secs],
            )
            .await
            .map_err(pg_err)?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Appends `bytes` to a running run's stored log of stdout (`stdout`) or stderr, if it
    /// holds exactly `at` bytes now (a retried append adds nothing twice) and the run is still
    /// in flight (its end writes the whole log). So followers on any node see its output live.
    pub async fn append_log(
        &self,
        job_id: &str,
        stdout: bool,
        at: u64,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        self.append_to(job_id, log_column(stdout), at, bytes).await
    }

    /// [`PgStore::append_log`] for the run's live denials (`execution::denials`).
    pub async fn append_denials(
        &self,
        job_id: &str,
        at: u64,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        self.append_to(job_id, DENIALS_COLUMN, at, bytes).await
    }

    async fn append_to(
        &self,
        job_id: &str,
        col: &str,
        at: u64,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        let c = self.client().await?;
        let sql = format!(
            "UPDATE runs SET {col} = COALESCE({col}, ''::bytea) || $3
             WHERE job_id = $1 AND octet_length(COALESCE({col}, ''::bytea)) = $2
             AND status IN ('queued', 'running')"
        );
        c.execute(&sql, &[&job_id, &(at as i32), &bytes])
            .await
            .map_err(pg_err)?;
        Ok(())
    }

    /// Up to `max` bytes of a run's stored `col` from `offset` (empty: nothing there).
    async fn column_since(
        &self,
        job_id: &str,
        col: &str,
        offset: u64,
        max: u64,
    ) -> Result<Vec<u8>, StoreError> {
        let c = self.client().await?;
        let sql = format!(
            "SELECT substring(COALESCE({col}, ''::bytea) FROM $2 FOR $3) FROM runs WHERE job_id = $1"
        );
        let (from, n) = (offset as i64 + 1, max as i64);
        let row = c
            .query_opt(&sql, &[&job_id, &(from as i32), &(n as i32)])
            .await
            .map_err(pg_err)?;
        Ok(row.map(|r| r.get::<_, Vec<u8>>(0)).unwrap_or_default())
    }

    /// A cancel of the run `request_id` of `tenant`, with its audit `record`: a run still in
    /// the queue, claimed by no executor, ends `cancelled` here and now ([`Cancel::Ended`]); a
    /// claimed or running one is flagged, and the executor holding it kills it at its next
    /// lease renewal ([`Cancel::Requested`]); [`Cancel::Final`] when it had ended already.
    pub async fn cancel(
        &self,
        tenant: &str,
        request_id: &str,
        now: i64,
        reason: &str,
        record: &Event,
    ) -> Result<Cancel, StoreError> {
        self.persist("cancel", || async move {
            let mut c = self.client().await?;
            let tx = read_committed(&mut c).await?;
            let ended = tx
                .execute(
                    "UPDATE runs SET status = 'cancelled', reason = $4, finished_at = $3, spec = NULL
                     WHERE tenant = $1 AND request_id = $2 AND status = 'queued' AND owner IS NULL",
                    &[&tenant, &request_id, &now, &reason],
                )
                .await
                .map_err(pg_err)?;
            let outcome = if ended == 1 {
                Cancel::Ended
            } else {
                let flagged = tx
                    .execute(
                        "UPDATE runs SET cancel_requested = TRUE
                         WHERE tenant = $1 AND request_id = $2 AND status IN ('queued', 'running')
                         AND NOT cancel_requested",
                        &[&tenant, &request_id],
                    )
                    .await
                    .map_err(pg_err)?;
                let in_flight = tx
                    .query_opt(
                        "SELECT 1 FROM runs WHERE tenant = $1 AND request_id = $2
                         AND status IN ('queued', 'running')",
                        &[&tenant, &request_id],
                    )
                    .await
                    .map_err(pg_err)?
                    .is_some();
                match (flagged, in_flight) {
                    (1, _) => Cancel::Requested,
                    // Requested before (or by this cancel's earlier attempt whose answer was
                    // lost): not recorded again.
                    (_, true) => Cancel::AlreadyRequested,
                    _ => Cancel::Final,
                }
            };
            if outcome == Cancel::Ended {
                append_audit_in(&tx, &self.node, record).await?;
            }
            tx.commit().await.map_err(pg_err)?;
            Ok(outcome)
        })
        .await
    }

    /// The fenced `running` mark and its `run_start` `record`, in one transaction: only while
    /// `fence` holds an unexpired lease on the run (the database's clock at the statement,
    /// `clock_timestamp()`), and only while the executor can still start the payload: every
    /// statement runs under a `statement_timeout` of what is left of `deadline` (the lease's
    /// end by the executor's own clock, when it kills the runner) less [`MARK_MARGIN`], so a
    /// mark held up in the database past that is cancelled and nothing is recorded
    /// ([`StoreError::Fenced`]: not started). A retry after a lost reply finds its own mark
    /// (same `started_at`) and appends nothing more.
    pub async fn mark_running_fenced(
        &self,
        job_id: &str,
        fence: i64,
        now: i64,
        deadline: impl Fn() -> std::time::Instant,
        record: &Event,
    ) -> Result<bool, StoreError> {
        let deadline = &deadline;
        self.persist("mark_running", || async move {
            let mut c = self.client().await?;
            let tx = read_committed(&mut c).await?;
            within(&tx, deadline(), fence).await?;
            let row = tx
                .query_opt(
                    "SELECT status = 'running' AND started_at = $3 FROM runs
                     WHERE job_id = $1 AND fence = $2 FOR UPDATE",
                    &[&job_id, &fence, &now],
                )
                .await
                .map_err(pg_err)?;
            match row.map(|r| r.get::<_, Option<bool>>(0)) {
                None => return Ok(false),
                // This very mark, committed by an attempt whose answer was lost.
                Some(Some(true)) => return Ok(true),
                Some(_) => {}
            }
            within(&tx, deadline(), fence).await?;
            let n = tx
                .execute(
                    "UPDATE runs SET status = 'running', started_at = $3
                     WHERE job_id = $1 AND fence = $2 AND lease_expires_at > clock_timestamp()
                     AND status = 'queued'",
                    &[&job_id, &fence, &now],
                )
                .await
                .map_err(pg_err)?;
            if n != 1 {
                return Ok(false);
            }
            within(&tx, deadline(), fence).await?;
            append_audit_in(&tx, &self.node, record).await?;
            within(&tx, deadline(), fence).await?;
            tx.commit().await.map_err(pg_err)?;
            Ok(true)
        })
        .await
    }

    /// The fenced end of a run: result, report, artifact and receipt in one statement, only
    /// while `fence` holds an unexpired lease on the run in flight; else
    /// [`StoreError::Fenced`] and nothing is written. `audit` (the run's `run_end`) is
    /// appended to the chain in the same transaction: a replica killed after the result
    /// committed cannot leave the chain without it, and a refused result audits nothing.
    pub async fn finish_fenced(
        &self,
        f: FinishRun,
        fence: i64,
        audit: Option<&Event>,
    ) -> Result<(), StoreError> {
        self.finish_fenced_cell(f, fence, audit, None).await
    }

    /// [`PgStore::finish_fenced`], and for a session's cell its end (`cell`: its checkpoint,
    /// the cell's record, the session's new head) in the same fenced transaction
    /// (crate::storage::pg::sessions).
    pub async fn finish_fenced_cell(
        &self,
        f: FinishRun,
        fence: i64,
        audit: Option<&Event>,
        cell: Option<&crate::storage::sessions::CellEnd>,
    ) -> Result<(), StoreError> {
        self.persist("finish_run", || {
            let f = f.clone();
            async move {
                let mut c = self.client().await?;
                let tx = read_committed(&mut c).await?;
                let status = f.status.as_str();
                let n = tx
                    .execute(
                        "UPDATE runs SET status = $2, reason = $3, finished_at = $4, report = $5, receipt = $6, artifact = $7, artifact_sha256 = $8, spec = NULL, streams = $10, stdout_log = $11, stderr_log = $12, denials_log = $13
                         WHERE job_id = $1 AND fence = $9 AND lease_expires_at > clock_timestamp() AND status IN ('queued', 'running')",
                        &[&f.job_id, &status, &f.reason, &f.now, &f.report, &f.receipt, &f.artifact, &f.artifact_sha256, &fence, &f.streams, &f.logs.as_ref().map(|l| &l.0), &f.logs.as_ref().map(|l| &l.1), &f.denials],
                    )
                    .await
                    .map_err(pg_err)?;
                if n != 1 {
                    // Refused, unless an earlier attempt of this same write committed and
                    // its answer was lost (`persist` retried): then the row holds exactly
                    // this end under this fence (its reason and artifact too: a lease sweep
                    // in the same second may have written the same status), and its record
                    // committed with it.
                    let done = tx
                        .query_opt(
                            "SELECT 1 FROM runs WHERE job_id = $1 AND fence = $2 AND status = $3 AND finished_at = $4
                                AND reason IS NOT DISTINCT FROM $5 AND artifact_sha256 IS NOT DISTINCT FROM $6",
                            &[&f.job_id, &fence, &status, &f.now, &f.reason, &f.artifact_sha256],
                        )
                        .await
                        .map_err(pg_err)?;
                    return match done {
                        Some(_) => Ok(()),
                        None => Err(StoreError::Fenced(fence)),
                    };
                }
                if let Some(end) = cell {
                    Self::finish_cell_in(&tx, end, f.now).await?;
                }
                if let Some(ev) = audit {
                    append_audit_in(&tx, &self.node, ev).await?;
                }
                tx.commit().await.map_err(pg_err)?;
                Ok(())
            }
        })
        .await
    }

    /// Operator retry of an `unknown` run on the queue: queued again, unclaimed, with a new job
    /// id and its spec, and its audit `record` in the same transaction; false (and no record)
    /// if it was not `unknown` any more.
    pub async fn requeue(
        &self,
        tenant: &str,
        request_id: &str,
        (job_id, expires): (String, i64),
        spec: &JobSpec,
        record: &Event,
    ) -> Result<bool, StoreError> {
        let spec = serde_json::to_string(spec)
            .map_err(|e| StoreError::Database(format!("encoding a run's spec: {e}")))?;
        let mut c = self.client().await?;
        let tx = read_committed(&mut c).await?;
        let n = tx
            .execute(
                "UPDATE runs SET status = 'queued', reason = NULL, job_id = $3, job_expires_at = EXTRACT(EPOCH FROM clock_timestamp())::bigint + $4, started_at = NULL, finished_at = NULL, report = NULL, receipt = NULL, artifact = NULL, artifact_sha256 = NULL, streams = NULL, stdout_log = NULL, stderr_log = NULL, denials_log = NULL,
                    owner = NULL, fence = NULL, lease_expires_at = NULL, spec = $5
                 WHERE tenant = $1 AND request_id = $2 AND status = 'unknown'",
                // A time to live from this replica's clock, an expiry by the database's.
                &[&tenant, &request_id, &job_id, &(expires - crate::util::now()), &spec],
            )
            .await
            .map_err(pg_err)?;
        if n == 1 {
            append_audit_in(&tx, &self.node, record).await?;
        }
        tx.commit().await.map_err(pg_err)?;
        Ok(n == 1)
    }

    /// Any node's sweep of expired leases, in one transaction: a run that was `running` becomes
    /// `unknown` (its executor is gone or cut off and has killed, or will kill, its sandbox; an
    /// operator reconciles it); a run claimed but never started goes back to the queue
    /// (nothing of it ran: the runner gets its manifest only after the fenced `running`
    /// mark) under a new job id, so that its next claim never meets a folder the given-up
    /// claim prepared. Counts both in `cluster_counters.expired_leases`. Each `unknown` marking
    /// is audited (`run_unknown`) in the same transaction.
    pub async fn expire_leases(&self, now: i64) -> Result<(Vec<Expired>, u64), StoreError> {
        let mut c = self.client().await?;
        let tx = read_committed(&mut c).await?;
        let rows = tx
            .query(
                "UPDATE runs SET status = 'unknown', finished_at = $1,
                    reason = 'the lease of its executor (node ' || owner || ') expired while it ran: the executor stopped renewing it (it was stopped, killed or cut off). Its runner kills the sandbox when renewals stop reaching it, before the lease ends by the executor host''s boot clock, so no payload of this run is still running; whether it finished is unknown: reconcile it'
                 WHERE (status = 'running' OR (status = 'queued' AND interpreter_of IS NOT NULL))
                 AND owner IS NOT NULL AND lease_expires_at < clock_timestamp()
                 RETURNING tenant, request_id, task, job_id, owner",
                &[&now],
            )
            .await
            .map_err(pg_err)?;
        let requeued = tx
            .execute(
                &format!(
                    "UPDATE runs SET owner = NULL, fence = NULL, lease_expires_at = NULL, job_id = {NEW_JOB_ID}
                     WHERE status = 'queued' AND owner IS NOT NULL AND lease_expires_at < clock_timestamp()
                     AND interpreter_of IS NULL"
                ),
                &[],
            )
            .await
            .map_err(pg_err)?;
        let total = rows.len() as i64 + requeued as i64;
        if total > 0 {
            tx.execute(
                "UPDATE cluster_counters SET value = value + $1 WHERE name = 'expired_leases'",
                &[&total],
            )
            .await
            .map_err(pg_err)?;
        }
        let expired: Vec<Expired> = rows
            .iter()
            .map(|r| Expired {
                run: InFlight {
                    tenant: r.get(0),
                    request_id: r.get(1),
                    task: r.get(2),
                    job_id: r.get(3),
                },
                owner: r.get(4),
            })
            .collect();
        // Each marking's record commits with it.
        for e in &expired {
            append_audit_in(&tx, &self.node, &e.unknown_event()).await?;
        }
        tx.commit().await.map_err(pg_err)?;
        Ok((expired, requeued))
    }

    /// Records this node as live (slots, labels, whether it is draining, heartbeat now);
    /// `first`: the process's first heartbeat, which also sets its start (a node id reused
    /// by a new process starts again).
    pub async fn worker_alive(
        &self,
        slots: usize,
        labels: &[String],
        draining: bool,
        first: bool,
        facts: &str,
    ) -> Result<(), StoreError> {
        let (slots, labels) = (slots as i32, labels.to_vec());
        let c = self.client().await?;
        c.execute(
            "INSERT INTO workers (node_id, slots, labels, draining, facts) VALUES ($1, $2, $3, $4, $6)
             ON CONFLICT (node_id) DO UPDATE
             SET slots = $2, labels = $3, draining = $4, heartbeat_at = now(), facts = $6,
                 started_at = CASE WHEN $5 THEN now() ELSE workers.started_at END",
            &[&self.node, &slots, &labels, &draining, &first, &facts],
        )
        .await
        .map_err(pg_err)?;
        Ok(())
    }

    /// Forgets the nodes whose last heartbeat is older than `age` and that hold no queued or
    /// running run (gone without a graceful stop: killed, scaled down); how many.
    pub async fn forget_gone_nodes(&self, age: Duration) -> Result<u64, StoreError> {
        let c = self.client().await?;
        c.execute(
            "DELETE FROM workers w WHERE w.heartbeat_at < now() - make_interval(secs => $1)
             AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.owner = w.node_id
                             AND r.status IN ('queued', 'running'))",
            &[&age.as_secs_f64()],
        )
        .await
        .map_err(pg_err)
    }

    /// Removes this executor from `workers` (a graceful stop).
    pub async fn worker_gone(&self) -> Result<(), StoreError> {
        let c = self.client().await?;
        c.execute("DELETE FROM workers WHERE node_id = $1", &[&self.node])
            .await
            .map_err(pg_err)?;
        Ok(())
    }

    /// Every node's audit chain in the database, as the file log's JSONL lines in chain
    /// order: what the operator console verifies (the check `agentjail audit verify
    /// --database` makes) and searches.
    pub async fn audit_chain(&self) -> Result<Vec<String>, StoreError> {
        let mut c = self.client().await?;
        // Reading a long chain may take longer than a node's statements may (as for
        // `audit verify --database`), for this transaction only.
        let tx = c.transaction().await.map_err(pg_err)?;
        tx.batch_execute("SET LOCAL statement_timeout = 0")
            .await
            .map_err(pg_err)?;
        let rows = tx
            .query("SELECT record FROM audit_log ORDER BY chain, seq", &[])
            .await
            .map_err(pg_err)?;
        tx.commit().await.map_err(pg_err)?;
        Ok(rows.iter().map(|r| r.get::<_, String>(0)).collect())
    }

    /// What the store knows of the fleet, for the operator console: each executor (slots,
    /// labels, start, last heartbeat, whether it is live: a heartbeat younger than `live`,
    /// whether it is draining, and the runs it holds) and the leases held (the 200 nearest
    /// their end).
    pub async fn fleet(&self, live: Duration) -> Result<serde_json::Value, StoreError> {
        let c = self.client().await?;
        let workers = c
            .query(
                "SELECT w.node_id, w.slots, w.labels,
                        EXTRACT(EPOCH FROM w.started_at)::bigint,
                        EXTRACT(EPOCH FROM w.heartbeat_at)::bigint,
                        w.heartbeat_at > now() - make_interval(secs => $1),
                        (SELECT count(*) FROM runs r WHERE r.owner = w.node_id
                            AND r.status IN ('queued', 'running')),
                        w.draining, w.facts
                 FROM workers w ORDER BY w.node_id",
                &[&live.as_secs_f64()],
            )
            .await
            .map_err(pg_err)?;
        let leases = c
            .query(
                "SELECT tenant, request_id, task, owner, status,
                        EXTRACT(EPOCH FROM lease_expires_at)::bigint
                 FROM runs WHERE owner IS NOT NULL AND status IN ('queued', 'running')
                 ORDER BY lease_expires_at LIMIT 200",
                &[],
            )
            .await
            .map_err(pg_err)?;
        // Times as Unix seconds.
        let ts = |s: Option<i64>| s;
        Ok(serde_json::json!({
            "node": self.node,
            "workers": workers.iter().map(|r| serde_json::json!({
                "node_id": r.get::<_, String>(0),
                "slots": r.get::<_, i32>(1),
                "labels": r.get::<_, Vec<String>>(2),
                "started_at": ts(r.get(3)),
                "heartbeat_at": ts(r.get(4)),
                "live": r.get::<_, bool>(5),
                "runs_held": r.get::<_, i64>(6),
                "draining": r.get::<_, bool>(7),
                // What the node published of itself (crate::node_facts): its word, shown as such.
                "facts": r.get::<_, Option<String>>(8)
                    .filter(|f| f.len() <= FACTS_LIMIT)
                    .and_then(|f| serde_json::from_str::<serde_json::Value>(&f).ok()),
            })).collect::<Vec<_>>(),
            "leases": leases.iter().map(|r| serde_json::json!({
                "tenant": r.get::<_, String>(0),
                "request_id": r.get::<_, String>(1),
                "task": r.get::<_, String>(2),
                "owner": r.get::<_, String>(3),
                "status": r.get::<_, String>(4),
                "lease_expires_at": ts(r.get(5)),
            })).collect::<Vec<_>>(),
        }))
    }

    /// The nodes that published receipt key `keyid` with their facts (crate::node_facts):
    /// each node id with the public key's PEM, as each recorded it.
    pub async fn receipt_keys(&self, keyid: &str) -> Result<Vec<(String, String)>, StoreError> {
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT node_id, facts FROM workers WHERE strpos(facts, $1) > 0",
                &[&keyid],
            )
            .await
            .map_err(pg_err)?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let facts: String = r.get(1);
                if facts.len() > FACTS_LIMIT {
                    return None;
                }
                let v: serde_json::Value = serde_json::from_str(&facts).ok()?;
                let k = &v["receipt_key"];
                (k["keyid"].as_str() == Some(keyid))
                    .then(|| Some((r.get(0), k["public_key_pem"].as_str()?.to_owned())))
                    .flatten()
            })
            .collect())
    }

    /// The cluster's gauges; a worker is live when its heartbeat is younger than `live`.
    pub async fn cluster_gauges(&self, live: Duration) -> Result<ClusterGauges, StoreError> {
        let secs = live.as_secs_f64();
        let c = self.client().await?;
        let r = c
            .query_one(
                "SELECT
                    (SELECT count(*) FROM runs WHERE status = 'queued' AND owner IS NULL),
                    (SELECT COALESCE(GREATEST(EXTRACT(EPOCH FROM now())::bigint - min(created_at), 0), 0)
                        FROM runs WHERE status = 'queued' AND owner IS NULL),
                    (SELECT count(*) FROM workers WHERE slots > 0 AND heartbeat_at > now() - make_interval(secs => $1)),
                    (SELECT COALESCE(max(value), 0) FROM cluster_counters WHERE name = 'expired_leases')",
                &[&secs],
            )
            .await
            .map_err(pg_err)?;
        Ok(ClusterGauges {
            queue_depth: r.get(0),
            oldest_queued_seconds: r.get(1),
            live_workers: r.get(2),
            expired_leases: r.get(3),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn urls_with_a_password_or_tls_are_refused_without_echoing_them() {
        let e = connect_config("postgres://u:hunter2@127.0.0.1:5/db", None).unwrap_err();
        assert!(e.contains("password") && !e.contains("hunter2"), "{e}");
        for mode in ["require", "verify-ca", "verify-full"] {
            let e = connect_config(&format!("postgres://u@h/db?sslmode={mode}"), None).unwrap_err();
            assert!(e.contains("TLS"), "{e}");
        }
        let e = connect_config("postgres://u:hunter2@[nope/db", None).unwrap_err();
        assert!(!e.contains("hunter2"), "{e}");
        let c = connect_config("postgres://u@127.0.0.1:5432/db", Some(b"pw".to_vec())).unwrap();
        assert_eq!(describe(&c), "postgres://u@127.0.0.1:5432/db");
        assert!(connect_config("postgres://127.0.0.1/db", None).is_err());
    }

    #[test]
    fn node_ids_are_checked() {
        assert_eq!(node_id(Some("a-1.b_2")).unwrap(), "a-1.b_2");
        assert!(node_id(Some("")).is_err());
        assert!(node_id(Some("a b")).is_err());
        assert!(node_id(Some(&"x".repeat(65))).is_err());
        assert!(node_id(None).is_ok());
    }
}
