//! The embedded database (SQLite, WAL, one connection behind a mutex, used from
//! `spawn_blocking`). Migrations are numbered by `PRAGMA user_version`. Every multi-statement
//! change runs in a transaction, so a kill -9 at any point leaves either the old or the new state.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use rusqlite::{Connection, OptionalExtension, params};

use crate::run_state::RunState;

/// Schema migrations, applied in order; `user_version` is the number applied.
const MIGRATIONS: &[&str] = &[
    // 1: inputs and runs.
    "CREATE TABLE inputs (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        sha256 TEXT NOT NULL,
        name TEXT NOT NULL,
        media_type TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL
    );
    CREATE INDEX inputs_sha ON inputs(sha256);
    CREATE TABLE runs (
        tenant TEXT NOT NULL,
        request_id TEXT NOT NULL,
        body_sha256 TEXT NOT NULL,
        task TEXT NOT NULL,
        actor TEXT NOT NULL,
        job_id TEXT NOT NULL UNIQUE,
        job_expires_at INTEGER NOT NULL,
        status TEXT NOT NULL,
        reason TEXT,
        created_at INTEGER NOT NULL,
        started_at INTEGER,
        finished_at INTEGER,
        inputs TEXT NOT NULL,
        report TEXT,
        receipt TEXT,
        artifact BLOB,
        artifact_sha256 TEXT,
        outputs_expire_at INTEGER NOT NULL,
        logs_expire_at INTEGER NOT NULL,
        outputs_deleted INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (tenant, request_id)
    );
    CREATE INDEX runs_status ON runs(status);",
    // 2: a run's `args` (JSON array), so that a retry rebuilds the same manifest.
    "ALTER TABLE runs ADD COLUMN args TEXT NOT NULL DEFAULT '[]';",
    // 3: the digest of the run's manifest as the first attempt built it (`runner::manifest_digest`),
    // so that a retry that would build a different one is refused. NULL: recorded before.
    "ALTER TABLE runs ADD COLUMN manifest_digest TEXT;",
    // 4: what the record shows of the command's stdout and stderr (JSON,
    // `execution::streams::Streams`), written when the run ends; NULL before, or for a run
    // whose command never started, and again once retention deleted the outputs.
    "ALTER TABLE runs ADD COLUMN streams TEXT;
    CREATE INDEX runs_tenant_created ON runs(tenant, created_at);
    CREATE INDEX runs_created ON runs(created_at);",
    // 5: sessions and their cells (crate::storage::sessions).
    "CREATE TABLE sessions (
        session_id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        actor TEXT NOT NULL,
        request_id TEXT NOT NULL,
        body_sha256 TEXT NOT NULL,
        task TEXT NOT NULL,
        inputs TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL,
        closed_at INTEGER,
        head_sha256 TEXT,
        last_receipt_sha256 TEXT,
        cells INTEGER NOT NULL DEFAULT 0,
        forked_from TEXT,
        forked_cell INTEGER,
        UNIQUE (tenant, request_id)
    );
    CREATE TABLE session_cells (
        session_id TEXT NOT NULL REFERENCES sessions(session_id),
        cell INTEGER NOT NULL,
        request_id TEXT NOT NULL,
        body_sha256 TEXT NOT NULL,
        tenant TEXT NOT NULL,
        run_request_id TEXT NOT NULL,
        before_sha256 TEXT,
        after_sha256 TEXT,
        head_after TEXT,
        receipt_sha256 TEXT,
        chain_after TEXT,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (session_id, cell),
        UNIQUE (session_id, request_id)
    );",
    // 6: the cells a forked session inherits from its ancestors (counted toward the task's
    // `max_cells`: a fork never has more cells left than its source had).
    "ALTER TABLE sessions ADD COLUMN cells_before INTEGER NOT NULL DEFAULT 0;",
    // 7: how many of a session's most recent cells keep their checkpoints for a fork (the
    // task's `session.keep_checkpoints` when it was opened).
    "ALTER TABLE sessions ADD COLUMN keep_checkpoints INTEGER NOT NULL DEFAULT 8;",
];

/// Shared handle to the database.
#[derive(Clone)]
pub struct Db(Arc<Mutex<Connection>>);

/// Database failure (logged, never shown to clients).
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("database lock poisoned")]
    Poisoned,
    #[error("database task failed: {0}")]
    Join(String),
}

/// One stored input.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct InputRow {
    pub id: String,
    pub sha256: String,
    pub name: String,
    pub media_type: String,
    pub bytes: u64,
    pub created_at: i64,
}

/// One run record.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    pub tenant: String,
    pub request_id: String,
    pub body_sha256: String,
    pub task: String,
    pub actor: String,
    pub job_id: String,
    pub job_expires_at: i64,
    pub status: RunState,
    pub reason: Option<String>,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    /// JSON array of `{input_id, sha256}`.
    pub inputs: String,
    pub report: Option<String>,
    pub receipt: Option<String>,
    pub artifact: Option<Vec<u8>>,
    pub artifact_sha256: Option<String>,
    pub outputs_expire_at: i64,
    pub logs_expire_at: i64,
    pub outputs_deleted: bool,
    /// JSON array of the request's `args` (the command's extra arguments).
    pub args: String,
    /// `runner::manifest_digest` of the first attempt (None: recorded by an older version).
    pub manifest_digest: Option<String>,
    /// What the record shows of the command's streams (JSON, `execution::streams::Streams`):
    /// written by the run's end only (an insert ignores it), read by [`get_run`].
    pub streams: Option<String>,
}

/// Which runs `GET /v1/runs` lists: newest first (`created_at`, then tenant and request id,
/// descending), at most `limit`, after the cursor `after` when given.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    /// One tenant's runs (None: every tenant's, for an operator).
    pub tenant: Option<String>,
    pub status: Option<RunState>,
    pub task: Option<String>,
    /// `created_at >= from`.
    pub created_from: Option<i64>,
    /// `created_at < to`.
    pub created_to: Option<i64>,
    /// The last run of the previous page: `(created_at, tenant, request_id)`.
    pub after: Option<(i64, String, String)>,
    pub limit: u32,
    /// One run only (a follower's poll: its state without its outputs).
    pub request_id: Option<String>,
    /// The actor listing, when not an operator: the runs of sessions' cells (request ids
    /// `ses_…`) of other actors are left out (a session and its cells are its owner's alone).
    pub viewer: Option<String>,
}

/// A run as listed: who, what, and how it stands; no outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunListRow {
    pub tenant: String,
    pub request_id: String,
    pub task: String,
    pub actor: String,
    pub status: RunState,
    pub reason: Option<String>,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub job_id: String,
}

/// The listing query of both stores (`?N` numbered parameters; PostgreSQL's `$N` are made
/// from them): tenant, status, task, from, to, the cursor's three parts, limit, request id. A NULL
/// parameter leaves its condition out.
pub const LIST_RUNS_SQL: &str = "SELECT tenant, request_id, task, actor, status, reason, created_at, started_at, finished_at, job_id FROM runs
     WHERE (?1 IS NULL OR tenant = ?1) AND (?10 IS NULL OR request_id = ?10) AND (?2 IS NULL OR status = ?2) AND (?3 IS NULL OR task = ?3)
       AND (?4 IS NULL OR created_at >= ?4) AND (?5 IS NULL OR created_at < ?5)
       AND (?6 IS NULL OR (created_at, tenant, request_id) < (?6, ?7, ?8))
       AND (?11 IS NULL OR actor = ?11 OR substr(request_id, 1, 4) <> 'ses_')
     ORDER BY created_at DESC, tenant DESC, request_id DESC LIMIT ?9";

/// [`LIST_RUNS_SQL`] for one run of one tenant (a follower's poll, five times a second): the
/// same filters, but `tenant = ?1 AND request_id = ?10` as plain equalities, so that the
/// primary key finds the row. The general query's `?1 IS NULL OR …` cannot use an index (the
/// plan is made without the values): it walks the whole table in `created_at` order.
pub const LIST_ONE_RUN_SQL: &str = "SELECT tenant, request_id, task, actor, status, reason, created_at, started_at, finished_at, job_id FROM runs
     WHERE tenant = ?1 AND request_id = ?10 AND (?2 IS NULL OR status = ?2) AND (?3 IS NULL OR task = ?3)
       AND (?4 IS NULL OR created_at >= ?4) AND (?5 IS NULL OR created_at < ?5)
       AND (?6 IS NULL OR (created_at, tenant, request_id) < (?6, ?7, ?8))
       AND (?11 IS NULL OR actor = ?11 OR substr(request_id, 1, 4) <> 'ses_')
     LIMIT ?9";

/// The query for `f`: [`LIST_ONE_RUN_SQL`] when it names a tenant and a request id.
pub fn list_runs_sql(f: &RunFilter) -> &'static str {
    if f.tenant.is_some() && f.request_id.is_some() {
        LIST_ONE_RUN_SQL
    } else {
        LIST_RUNS_SQL
    }
}

/// Outcome of trying to record a new run.
pub enum Insert {
    Inserted,
    /// A run with this (tenant, request_id) exists.
    Exists(Box<RunRow>),
}

/// A run state is stored as its word (`queued`, `ok`, …); a word that names no state is a
/// conversion error, never a guess.
impl ToSql for RunState {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.as_str()))
    }
}

impl FromSql for RunState {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        value
            .as_str()?
            .parse()
            .map_err(|e| FromSqlError::Other(Box::new(e)))
    }
}

const RUN_COLS: &str = "tenant, request_id, body_sha256, task, actor, job_id, job_expires_at, status, reason, created_at, started_at, finished_at, inputs, report, receipt, artifact, artifact_sha256, outputs_expire_at, logs_expire_at, outputs_deleted, args, manifest_digest";

fn run_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunRow> {
    Ok(RunRow {
        tenant: r.get(0)?,
        request_id: r.get(1)?,
        body_sha256: r.get(2)?,
        task: r.get(3)?,
        actor: r.get(4)?,
        job_id: r.get(5)?,
        job_expires_at: r.get(6)?,
        status: r.get(7)?,
        reason: r.get(8)?,
        created_at: r.get(9)?,
        started_at: r.get(10)?,
        finished_at: r.get(11)?,
        inputs: r.get(12)?,
        report: r.get(13)?,
        receipt: r.get(14)?,
        artifact: r.get(15)?,
        artifact_sha256: r.get(16)?,
        outputs_expire_at: r.get(17)?,
        logs_expire_at: r.get(18)?,
        outputs_deleted: r.get::<_, i64>(19)? != 0,
        args: r.get(20)?,
        manifest_digest: r.get(21)?,
        // Only where the query selected it (`SELECT {RUN_COLS}, streams`).
        streams: r.get("streams").unwrap_or(None),
    })
}

impl Db {
    /// Opens (creating) the database and applies migrations.
    pub fn open(path: &Path) -> Result<Db, DbError> {
        let mut c = Connection::open(path)?;
        c.busy_timeout(std::time::Duration::from_secs(10))?;
        c.pragma_update(None, "journal_mode", "WAL")?;
        c.pragma_update(None, "synchronous", "FULL")?;
        c.pragma_update(None, "foreign_keys", "ON")?;
        // The bundled SQLite has STAT4, with which a cached statement whose parameter meets an
        // indexed column is compiled again at its first step after each new binding (a query
        // plan may depend on the value): every follower's look, every run's lookup paid a
        // compilation. No plan here depends on a value (there is no ANALYZE): the query
        // planner's stability guarantee keeps each statement compiled once.
        c.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
            true,
        )?;
        let version: i64 = c.pragma_query_value(None, "user_version", |r| r.get(0))?;
        for (i, m) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
            let tx = c.transaction()?;
            tx.execute_batch(m)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)?;
            tx.commit()?;
        }
        Ok(Db(Arc::new(Mutex::new(c))))
    }

    /// Runs `f` with the connection on a blocking thread.
    pub async fn call<T, F>(&self, f: F) -> Result<T, DbError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, DbError> + Send + 'static,
    {
        let db = self.0.clone();
        tokio::task::spawn_blocking(move || {
            let mut c = db.lock().map_err(|_| DbError::Poisoned)?;
            f(&mut c)
        })
        .await
        .map_err(|e| DbError::Join(e.to_string()))?
    }

    /// Runs `f` with the connection on the current thread (start-up, tests).
    pub fn call_sync<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        let mut c = self.0.lock().map_err(|_| DbError::Poisoned)?;
        f(&mut c)
    }
}

/// Records an uploaded input.
pub fn insert_input(
    c: &Connection,
    tenant: &str,
    row: &InputRow,
    expires_at: i64,
) -> Result<(), DbError> {
    c.execute(
        "INSERT INTO inputs (id, tenant, sha256, name, media_type, bytes, created_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![row.id, tenant, row.sha256, row.name, row.media_type, row.bytes as i64, row.created_at, expires_at],
    )?;
    Ok(())
}

/// The input `id` if it belongs to `tenant`.
pub fn get_input(c: &Connection, tenant: &str, id: &str) -> Result<Option<InputRow>, DbError> {
    Ok(c.prepare_cached(
        "SELECT id, sha256, name, media_type, bytes, created_at FROM inputs WHERE id = ?1 AND tenant = ?2",
    )?
    .query_row(
        params![id, tenant],
        |r| {
            Ok(InputRow {
                id: r.get(0)?,
                sha256: r.get(1)?,
                name: r.get(2)?,
                media_type: r.get(3)?,
                bytes: r.get::<_, i64>(4)? as u64,
                created_at: r.get(5)?,
            })
        },
    )
    .optional()?)
}

/// Inserts a new run unless one with its (tenant, request_id) exists, atomically.
pub fn insert_run(c: &mut Connection, row: &RunRow) -> Result<Insert, DbError> {
    let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    if let Some(existing) = get_run_tx(&tx, &row.tenant, &row.request_id)? {
        return Ok(Insert::Exists(Box::new(existing)));
    }
    insert_run_in(&tx, row)?;
    tx.commit()?;
    Ok(Insert::Inserted)
}

/// Inserts a new run within the caller's transaction (a session's cell: with its cell row).
pub(crate) fn insert_run_in(tx: &Connection, row: &RunRow) -> Result<(), DbError> {
    tx.prepare_cached(
        &format!("INSERT INTO runs ({RUN_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22)"),
    )?
    .execute(params![
            row.tenant, row.request_id, row.body_sha256, row.task, row.actor, row.job_id,
            row.job_expires_at, row.status, row.reason, row.created_at, row.started_at,
            row.finished_at, row.inputs, row.report, row.receipt, row.artifact,
            row.artifact_sha256, row.outputs_expire_at, row.logs_expire_at, row.outputs_deleted as i64,
            row.args, row.manifest_digest
        ],
    )?;
    Ok(())
}

fn get_run_tx(c: &Connection, tenant: &str, request_id: &str) -> Result<Option<RunRow>, DbError> {
    // Cached: the statement is parsed once, not at every request (docs/performance.md, #15).
    Ok(c.prepare_cached(&format!(
        "SELECT {RUN_COLS}, streams FROM runs WHERE tenant = ?1 AND request_id = ?2"
    ))?
    .query_row(params![tenant, request_id], run_from_row)
    .optional()?)
}

/// The run `request_id` of `tenant`.
pub fn get_run(c: &Connection, tenant: &str, request_id: &str) -> Result<Option<RunRow>, DbError> {
    get_run_tx(c, tenant, request_id)
}

/// The runs `f` selects (`GET /v1/runs`), newest first.
pub fn list_runs(c: &Connection, f: &RunFilter) -> Result<Vec<RunListRow>, DbError> {
    let (at, tenant, rid) = match &f.after {
        Some((a, t, r)) => (Some(*a), Some(t.as_str()), Some(r.as_str())),
        None => (None, None, None),
    };
    let mut st = c.prepare_cached(list_runs_sql(f))?;
    let rows = st.query_map(
        params![
            f.tenant,
            f.status,
            f.task,
            f.created_from,
            f.created_to,
            at,
            tenant,
            rid,
            f.limit,
            f.request_id,
            f.viewer
        ],
        |r| {
            Ok(RunListRow {
                tenant: r.get(0)?,
                request_id: r.get(1)?,
                task: r.get(2)?,
                actor: r.get(3)?,
                status: r.get(4)?,
                reason: r.get(5)?,
                created_at: r.get(6)?,
                started_at: r.get(7)?,
                finished_at: r.get(8)?,
                job_id: r.get(9)?,
            })
        },
    )?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

/// Marks a queued run as running; false if it was not queued any more.
///
/// This one commit is not fsync'd (`synchronous = NORMAL` for it; WAL mode keeps it atomic,
/// and the next commit's fsync makes it durable): `queued` and `running` both mean "in
/// flight", and a run found in either after a crash or power loss is marked `unknown` alike,
/// so losing the change costs nothing but `started_at`. It saves an fsync per run on the path
/// between a free run slot and the next run's start (docs/performance.md).
pub fn mark_running(c: &Connection, job_id: &str, now: i64) -> Result<bool, DbError> {
    c.pragma_update(None, "synchronous", "NORMAL")?;
    let n = c
        .prepare_cached(
            "UPDATE runs SET status = 'running', started_at = ?2 WHERE job_id = ?1 AND status = 'queued'",
        )
        .and_then(|mut st| st.execute(params![job_id, now]));
    // Restored whatever happened: every other commit stays fsync'd.
    c.pragma_update(None, "synchronous", "FULL")?;
    Ok(n? == 1)
}

/// What a finished run left.
pub struct Finish<'a> {
    pub job_id: &'a str,
    pub status: RunState,
    pub reason: Option<&'a str>,
    pub now: i64,
    pub report: Option<&'a str>,
    pub receipt: Option<&'a str>,
    pub artifact: Option<&'a [u8]>,
    pub artifact_sha256: Option<&'a str>,
    pub streams: Option<&'a str>,
}

/// Records the end of a run (only from `queued`/`running`: a finished record never changes).
pub fn finish_run(c: &Connection, f: &Finish<'_>) -> Result<(), DbError> {
    c.prepare_cached(
        "UPDATE runs SET status = ?2, reason = ?3, finished_at = ?4, report = ?5, receipt = ?6, artifact = ?7, artifact_sha256 = ?8, streams = ?9
         WHERE job_id = ?1 AND status IN ('queued', 'running')",
    )?
    .execute(params![f.job_id, f.status, f.reason, f.now, f.report, f.receipt, f.artifact, f.artifact_sha256, f.streams])?;
    Ok(())
}

/// The runs left `queued` or `running`: (tenant, request_id, task, job_id), by job id.
pub fn in_flight(c: &Connection) -> Result<Vec<(String, String, String, String)>, DbError> {
    let mut st = c.prepare(
        "SELECT tenant, request_id, task, job_id FROM runs WHERE status IN ('queued', 'running') ORDER BY job_id",
    )?;
    let it = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
    Ok(it.collect::<Result<Vec<_>, _>>()?)
}

/// Start-up reconciliation: every run left `queued` or `running` becomes `unknown`. Returns
/// their (tenant, request_id, task, job_id), by job id.
pub fn mark_in_flight_unknown(
    c: &mut Connection,
    now: i64,
) -> Result<Vec<(String, String, String, String)>, DbError> {
    let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let rows = in_flight(&tx)?;
    tx.execute(
        "UPDATE runs SET status = 'unknown', reason = 'the service stopped while the run was in flight; its outcome is unknown', finished_at = ?1 WHERE status IN ('queued', 'running')",
        params![now],
    )?;
    tx.commit()?;
    Ok(rows)
}

/// Whether the run `request_id` of `tenant` is `unknown` (the only state reconciled).
pub fn is_unknown(c: &Connection, tenant: &str, request_id: &str) -> Result<bool, DbError> {
    let n: i64 = c.query_row(
        "SELECT COUNT(*) FROM runs WHERE tenant = ?1 AND request_id = ?2 AND status = 'unknown'",
        params![tenant, request_id],
        |r| r.get(0),
    )?;
    Ok(n == 1)
}

/// Operator reconcile: `unknown` → `queued` again (retry) with a new job, or → `abandoned`.
pub fn reconcile(
    c: &mut Connection,
    tenant: &str,
    request_id: &str,
    retry: Option<(&str, i64)>,
    now: i64,
) -> Result<bool, DbError> {
    let n = match retry {
        Some((job_id, expires)) => c.execute(
            "UPDATE runs SET status = 'queued', reason = NULL, job_id = ?3, job_expires_at = ?4, started_at = NULL, finished_at = NULL, report = NULL, receipt = NULL, artifact = NULL, artifact_sha256 = NULL
             WHERE tenant = ?1 AND request_id = ?2 AND status = 'unknown'",
            params![tenant, request_id, job_id, expires],
        )?,
        None => c.execute(
            "UPDATE runs SET status = 'abandoned', reason = 'abandoned by an operator after an unknown outcome', finished_at = ?3
             WHERE tenant = ?1 AND request_id = ?2 AND status = 'unknown'",
            params![tenant, request_id, now],
        )?,
    };
    Ok(n == 1)
}

/// Retention: clears outputs of runs past `outputs_expire_at`; returns their job ids (the
/// sweep deletes the copies in their job folders).
pub fn expire_outputs(c: &mut Connection, now: i64) -> Result<Vec<String>, DbError> {
    let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    const DUE: &str = "outputs_deleted = 0 AND finished_at IS NOT NULL AND outputs_expire_at <= ?1";
    let jobs = {
        let mut st = tx.prepare(&format!("SELECT job_id FROM runs WHERE {DUE}"))?;
        let it = st.query_map(params![now], |r| r.get(0))?;
        it.collect::<Result<Vec<String>, _>>()?
    };
    tx.execute(
        &format!("UPDATE runs SET artifact = NULL, receipt = NULL, report = NULL, streams = NULL, outputs_deleted = 1 WHERE {DUE}"),
        params![now],
    )?;
    tx.commit()?;
    Ok(jobs)
}

/// Job ids whose logs expired (the sweep deletes their folders).
pub fn expired_log_jobs(c: &Connection, now: i64) -> Result<Vec<String>, DbError> {
    let mut st = c.prepare(
        "SELECT job_id FROM runs WHERE finished_at IS NOT NULL AND logs_expire_at <= ?1",
    )?;
    let it = st.query_map(params![now], |r| r.get(0))?;
    Ok(it.collect::<Result<Vec<_>, _>>()?)
}

/// Deletes expired inputs, except those a queued or running run of their tenant refers to
/// (pinned until the run ends); returns the sha256 of objects no input references any more.
pub fn expire_inputs(c: &mut Connection, now: i64) -> Result<Vec<String>, DbError> {
    // A run's `inputs` is a JSON array of {"input_id": …}; ids are `in_<hex>`, so the quoted
    // id occurs in it exactly when the run refers to the input.
    const DUE: &str = "expires_at <= ?1 AND NOT EXISTS (SELECT 1 FROM runs
        WHERE runs.tenant = inputs.tenant AND runs.status IN ('queued', 'running')
        AND instr(runs.inputs, '\"' || inputs.id || '\"') > 0)";
    let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let shas: Vec<String> = {
        let mut st = tx.prepare(&format!("SELECT DISTINCT sha256 FROM inputs WHERE {DUE}"))?;
        let it = st.query_map(params![now], |r| r.get(0))?;
        it.collect::<Result<Vec<_>, _>>()?
    };
    tx.execute(&format!("DELETE FROM inputs WHERE {DUE}"), params![now])?;
    let mut orphans = Vec::new();
    for s in shas {
        let n: i64 = tx.query_row(
            "SELECT COUNT(*) FROM inputs WHERE sha256 = ?1",
            params![s],
            |r| r.get(0),
        )?;
        if n == 0 {
            orphans.push(s);
        }
    }
    tx.commit()?;
    Ok(orphans)
}

/// Whether any input references the object `sha256` (a new upload may have revived it).
pub fn object_referenced(c: &Connection, sha256: &str) -> Result<bool, DbError> {
    let n: i64 = c.query_row(
        "SELECT COUNT(*) FROM inputs WHERE sha256 = ?1",
        params![sha256],
        |r| r.get(0),
    )?;
    Ok(n > 0)
}

/// Runs by status (for tests and health).
pub fn count_runs(c: &Connection) -> Result<i64, DbError> {
    Ok(c.query_row("SELECT COUNT(*) FROM runs", [], |r| r.get(0))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A follower's poll finds its run by the primary key, not by walking every run.
    #[test]
    fn one_run_is_found_by_its_key() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let db = Db::open(&dir.path().join("db.sqlite")).unwrap_or_else(|e| panic!("{e}"));
        let f = RunFilter {
            tenant: Some("acme".into()),
            request_id: Some("r1".into()),
            limit: 1,
            ..RunFilter::default()
        };
        let plan: Vec<String> = db
            .call_sync(|c| {
                let mut st = c.prepare(&format!("EXPLAIN QUERY PLAN {}", list_runs_sql(&f)))?;
                let rows = st.query_map(
                    params![
                        "acme",
                        None::<String>,
                        None::<String>,
                        None::<i64>,
                        None::<i64>,
                        None::<i64>,
                        None::<String>,
                        None::<String>,
                        1,
                        "r1",
                        None::<String>
                    ],
                    |r| r.get::<_, String>(3),
                )?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            plan.iter().any(
                |p| p.starts_with("SEARCH runs USING INDEX sqlite_autoindex_runs_")
                    && p.ends_with("(tenant=? AND request_id=?)")
            ),
            "{plan:?}"
        );
        assert!(!plan.iter().any(|p| p.starts_with("SCAN")), "{plan:?}");
        let general = RunFilter {
            tenant: Some("acme".into()),
            limit: 10,
            ..RunFilter::default()
        };
        assert_eq!(list_runs_sql(&general), LIST_RUNS_SQL);
    }

    /// A cached statement is compiled once, whatever values it is bound to next.
    #[test]
    fn a_cached_statement_is_not_compiled_again_for_new_values() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let db = Db::open(&dir.path().join("db.sqlite")).unwrap_or_else(|e| panic!("{e}"));
        let reprepared = db
            .call_sync(|c| {
                for i in 0..5 {
                    let f = RunFilter {
                        tenant: Some(format!("t{i}")),
                        request_id: Some(format!("r{i}")),
                        limit: 1,
                        ..RunFilter::default()
                    };
                    list_runs(c, &f)?;
                }
                let st = c.prepare_cached(LIST_ONE_RUN_SQL)?;
                Ok(st.get_status(rusqlite::StatementStatus::RePrepare))
            })
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(reprepared, 0, "compiled again for new values");
    }
}
