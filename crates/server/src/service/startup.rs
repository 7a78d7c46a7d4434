//! Start-up: opening the state (the store, SQLite or PostgreSQL, with start-up
//! reconciliation; the output schemas written once).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use tokio::sync::Semaphore;

use crate::app::{
    AppState, AuthFailures, Inner, ServerError, TaskSchema, metrics_handle, zero_metrics,
};
use crate::config::{self, Config};
use crate::execution::runner::{self};
use crate::storage::audit::{self};
use crate::storage::{db, store};

impl AppState {
    /// Opens the data directory (creating it), the database and the audit log, and reconciles
    /// runs left in flight by a previous process (they become `unknown`; never re-run).
    pub fn open(
        config: Config,
        data_dir: &Path,
        runner: PathBuf,
        allow_degraded: bool,
    ) -> Result<AppState, ServerError> {
        AppState::open_with(config, data_dir, runner, allow_degraded, None)
    }

    /// [`AppState::open`] with this node's run slots (`serve --slots`, `worker --slots`;
    /// default `max_concurrent_runs`); 0 (PostgreSQL only): this node executes nothing.
    pub fn open_with(
        config: Config,
        data_dir: &Path,
        runner: PathBuf,
        allow_degraded: bool,
        slots: Option<usize>,
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
        // No check of the data directory's ancestors: inputs and code are bound into the
        // sandbox by its init, with the init's privileges, so a 0700 ancestor (root's home)
        // does not keep the sandbox user from them; only their own modes matter.
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
        let receipt_key =
            agentjail_verify::receipt::ReceiptKey::load_or_create(&private.join("receipt-key.pem"))
                .map_err(|e| ServerError::Io(format!("receipt key: {e}")))?;
        crate::node_facts::load_key(&data_dir);
        crate::selftest::publish_attestation(&data_dir);
        let concurrency = slots
            .or(config.server.max_concurrent_runs)
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(2)
            });
        if concurrency == 0 && config.server.database.is_none() {
            return Err(ServerError::Io(
                "--slots 0 needs a shared PostgreSQL database (--database): without one nothing would run the runs this node accepts".into(),
            ));
        }
        // The store: PostgreSQL when the configuration names a database (shared by replicas),
        // else SQLite and the audit file in the private folder.
        let (store, sqlite, queue): (Arc<dyn store::Store>, Option<db::Db>, _) =
            match &config.server.database {
                Some(url) => {
                    let pg = open_pg(&config, url, &data_dir, concurrency)?;
                    (Arc::new(pg.clone()), None, Some(pg))
                }
                None => {
                    let db = db::Db::open(&private.join("agentjail.db"))?;
                    let audit = audit::AuditLog::open(&private.join("audit.jsonl"))?;
                    (
                        Arc::new(store::SqliteStore::new(db.clone(), audit)),
                        Some(db),
                        None,
                    )
                }
            };
        // Each output schema is written once, here, named by its content; runs name that file
        // (none is written per job). The runner (root, outside the sandbox) reads it.
        let schema_dir = data_dir.join("schemas");
        std::fs::create_dir_all(&schema_dir).map_err(|e| io("cannot create", &schema_dir, e))?;
        std::fs::set_permissions(&schema_dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io("cannot set permissions of", &schema_dir, e))?;
        let mut schemas = std::collections::BTreeMap::new();
        for (name, t) in &config.tasks {
            if let Some(s) = &t.output.schema {
                let v = s.value().map_err(config::ConfigError)?;
                let text = serde_json::to_string_pretty(&v).unwrap_or_default();
                let file = schema_dir.join(format!("{}.json", config::sha256_hex(text.as_bytes())));
                write_schema(&file, &text).map_err(|e| io("cannot write", &file, e))?;
                schemas.insert(name.clone(), TaskSchema { text, file });
            }
        }
        // Half the connections at most follow runs, so followers never starve the rest.
        let max_followers = (config.server.max_connections / 2).max(1);
        let state = AppState {
            inner: Arc::new(Inner {
                max_admitted: concurrency + config.server.max_queued_runs,
                config,
                data_dir,
                runner,
                allow_degraded,
                store,
                #[cfg(test)]
                db: sqlite
                    .ok_or_else(|| ServerError::Io("unit tests inspect SQLite only".into()))?,
                run_slots: Arc::new(Semaphore::new(concurrency)),
                slots: concurrency,
                queue,
                admitted: AtomicUsize::new(0),
                metrics: metrics_handle(),
                schemas,
                auth_failures: AuthFailures::default(),
                cancels: Default::default(),
                live: Default::default(),
                news: Default::default(),
                followers: Arc::new(Semaphore::new(max_followers)),
                receipt_key: Arc::new(receipt_key),
                _lock: lock,
            }),
        };
        #[cfg(not(test))]
        drop(sqlite);
        zero_metrics(&state.inner.config);
        if state.inner.queue.is_some() {
            crate::execution::fleet::zero_cluster_metrics();
        }
        runner::reconcile_at_startup(&state)?;
        Ok(state)
    }
}

/// Writes a content-addressed schema file atomically (0600): a temporary file beside it, then
/// renamed over it, so that a runner never reads a partial schema. Rewritten at every start, so
/// that a file changed on disk since is replaced by what its name says.
pub(super) fn write_schema(file: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = file.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(text.as_bytes())?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, file));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Opens the PostgreSQL store named by `url` (docs/server.md, "PostgreSQL"): the password
/// from the 0600 file or `PGPASSWORD`, this node's id, migrations applied.
pub(super) fn open_pg(
    config: &Config,
    url: &str,
    data_dir: &Path,
    concurrency: usize,
) -> Result<crate::storage::pg::PgStore, ServerError> {
    use crate::storage::pg;
    let s = &config.server;
    let node = pg::node_id(s.node_id.as_deref()).map_err(ServerError::Io)?;
    let password =
        pg::read_password(s.database_password_file.as_deref()).map_err(ServerError::Io)?;
    let c = pg::connect_config(url, password).map_err(ServerError::Io)?;
    let where_ = pg::describe(&c);
    // Every run holds a connection only per statement; requests and runs share the pool.
    let pool = pg::pool(c.clone(), concurrency * 2 + 8).map_err(ServerError::Io)?;
    let objects = data_dir.join("objects");
    let store = pg::block_on(pg::PgStore::open(pool, &c, node.clone(), objects))
        .map_err(ServerError::Io)?
        .map_err(|e| ServerError::Io(format!("database {where_}: {e}")))?;
    tracing::info!(database = %where_, node = %node, "store: PostgreSQL");
    Ok(store)
}
