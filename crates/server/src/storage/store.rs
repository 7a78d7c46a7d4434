//! The storage interface the service and the runner talk to: run records, input records, the
//! retention sweep and the audit log, as operations rather than SQL. Two implementations:
//! [`SqliteStore`] (the embedded database of [`crate::storage::db`] plus the hash-chained file of
//! [`crate::storage::audit`]; one process) and [`crate::storage::pg::PgStore`] (PostgreSQL, shared by several
//! replicas); policy and the transports do not know which is in use. Every operation is fallible and returns a boxed future
//! (a network database answers asynchronously); no SQLite type appears in a signature.
//!
//! Two guarantees are the store's, not its callers': [`Store::insert_run`] records a run at
//! most once per (tenant, request_id), atomically (a racing duplicate gets the other's
//! record); and [`Store::audit`] appends one record to a tamper-evident, ordered log.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::run_state::RunState;
use crate::storage::audit::{AuditError, AuditLog, Event};
use crate::storage::db::{
    self, Db, DbError, Finish, InputRow, Insert, RunFilter, RunListRow, RunRow,
};

/// A store operation in flight.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// A store failure (logged; never shown to clients).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed.
    #[error("database: {0}")]
    Database(String),
    /// The database cannot be reached now (connection lost, restarting): try again later
    /// (HTTP 503 with `Retry-After`).
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// Writing a file the operation needed (an input object) failed.
    #[error("storage: {0}")]
    Io(String),
    /// The audit log could not be written.
    #[error("audit: {0}")]
    Audit(String),
    /// A write of a claimed run was refused by its fencing token: the lease it held expired or
    /// was taken, or the run ended; nothing was written.
    #[error(
        "refused by fencing: fencing token {0} no longer holds a live lease on the run; nothing recorded"
    )]
    Fenced(i64),
}

impl From<DbError> for StoreError {
    fn from(e: DbError) -> Self {
        StoreError::Database(e.to_string())
    }
}

impl From<AuditError> for StoreError {
    fn from(e: AuditError) -> Self {
        StoreError::Audit(e.to_string())
    }
}

/// The end of a run, as recorded.
#[derive(Debug, Clone)]
pub struct FinishRun {
    pub job_id: String,
    pub status: RunState,
    pub reason: Option<String>,
    pub now: i64,
    pub report: Option<String>,
    pub receipt: Option<String>,
    pub artifact: Option<Vec<u8>>,
    pub artifact_sha256: Option<String>,
    /// `execution::streams::Streams` as JSON; None when the command never started.
    pub streams: Option<String>,
    /// The retained stdout and stderr logs, for a store shared by several nodes (PostgreSQL
    /// keeps them, so that any replica serves `GET /v1/runs/{id}/logs`); a store on this node
    /// alone reads them from the job folder instead and ignores these.
    pub logs: Option<(Vec<u8>, Vec<u8>)>,
    /// The run's live denials (`execution::denials`, the job folder's `denials.jsonl`), kept
    /// like `logs` and with them.
    pub denials: Option<Vec<u8>>,
}

impl FinishRun {
    /// The end, at `now`, of a run that left no report, receipt or artifact (it never started,
    /// or could not be run here).
    pub fn without_outputs(job_id: &str, status: RunState, reason: String, now: i64) -> FinishRun {
        FinishRun {
            job_id: job_id.to_string(),
            status,
            reason: Some(reason),
            now,
            report: None,
            receipt: None,
            artifact: None,
            artifact_sha256: None,
            streams: None,
            logs: None,
            denials: None,
        }
    }
}

/// A run found in flight at start-up (marked `unknown`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    pub tenant: String,
    pub request_id: String,
    pub task: String,
    pub job_id: String,
}

/// The reason of the `run_unknown` record of a run found in flight at start-up.
pub const UNKNOWN_AT_START_UP: &str = "found in flight at start-up; marked unknown, not re-run";

impl InFlight {
    /// The `run_unknown` audit record of this run's marking, for `reason`.
    pub fn unknown_event(&self, reason: String) -> Event {
        Event {
            event: "run_unknown",
            tenant: Some(self.tenant.clone()),
            task: Some(self.task.clone()),
            request_id: Some(self.request_id.clone()),
            job_id: Some(self.job_id.clone()),
            status: Some(RunState::Unknown.into()),
            reason: Some(reason),
            ..Default::default()
        }
    }
}

/// The files the retention sweep deletes, called by [`Store::sweep`] while the records it
/// changes are locked (so an upload cannot revive an object being deleted).
pub trait RetentionFiles: Send + Sync {
    /// Deletes the copies of a run's outputs in its job folder.
    fn drop_outputs(&self, job_id: &str);
    /// Deletes a job folder whose logs expired; true if one was deleted.
    fn drop_job(&self, job_id: &str) -> bool;
    /// Deletes an input object no input refers to any more; true if one was deleted.
    fn drop_object(&self, sha256: &str) -> bool;
    /// The stored session checkpoints: each one's hex digest and modification time (Unix
    /// seconds).
    fn checkpoints(&self) -> Vec<(String, i64)> {
        Vec::new()
    }
    /// Deletes the stored checkpoint `hex`; true if one was deleted.
    fn drop_checkpoint(&self, _hex: &str) -> bool {
        false
    }
}

/// What a sweep deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    pub outputs: usize,
    pub job_folders: usize,
    pub objects: usize,
    /// Session checkpoints no live session refers to any more.
    pub checkpoints: usize,
}

/// Writes an input's object (content-addressed) before its record is inserted.
pub type WriteObject = Box<dyn FnOnce() -> std::io::Result<()> + Send>;

/// The storage interface.
pub trait Store: Send + Sync {
    /// Records an uploaded input of `tenant` with its content `body`. A store that keeps
    /// content in files calls `write_object` (which stores `body` in this node's object
    /// folder) while the sweep cannot delete the object; a database store keeps `body` itself.
    fn put_input(
        &self,
        tenant: &str,
        row: InputRow,
        expires_at: i64,
        body: Arc<[u8]>,
        write_object: WriteObject,
    ) -> StoreFuture<'_, ()>;
    /// Before a run on this node: makes sure the objects `sha256s` are in this node's object
    /// folder (a shared store writes them there from the database, checked against their
    /// hash). The file store has them already.
    fn materialise(&self, sha256s: Vec<String>) -> StoreFuture<'_, ()> {
        let _ = sha256s;
        Box::pin(async { Ok(()) })
    }
    /// The records of `ids` in `tenant`, in order (None: no such input there).
    fn get_inputs(&self, tenant: &str, ids: &[String]) -> StoreFuture<'_, Vec<Option<InputRow>>>;
    /// The run `request_id` of `tenant`.
    fn get_run(&self, tenant: &str, request_id: &str) -> StoreFuture<'_, Option<RunRow>>;
    /// The runs `filter` selects, newest first.
    fn list_runs(&self, filter: RunFilter) -> StoreFuture<'_, Vec<RunListRow>>;
    /// The retained log of a run's stdout (`stdout`) or stderr, when the store keeps logs
    /// ([`FinishRun::logs`]); None when it does not (they are in the job folder of the node
    /// that ran it) or retention deleted them.
    fn run_log(&self, job_id: &str, stdout: bool) -> StoreFuture<'_, Option<Vec<u8>>> {
        let _ = (job_id, stdout);
        Box::pin(async { Ok(None) })
    }
    /// Up to `max` bytes of a run's log from `offset`, when the store keeps logs (PostgreSQL:
    /// also while the run goes on, as its executor appends them); None when it does not.
    fn run_log_since(
        &self,
        job_id: &str,
        stdout: bool,
        offset: u64,
        max: u64,
    ) -> StoreFuture<'_, Option<Vec<u8>>> {
        let _ = (job_id, stdout, offset, max);
        Box::pin(async { Ok(None) })
    }
    /// Up to `max` bytes of a run's live denials (`execution::denials`) from `offset`, when
    /// the store keeps logs ([`FinishRun::denials`]; PostgreSQL: also while the run goes on,
    /// as its executor appends them); None when it does not.
    fn run_denials_since(
        &self,
        job_id: &str,
        offset: u64,
        max: u64,
    ) -> StoreFuture<'_, Option<Vec<u8>>> {
        let _ = (job_id, offset, max);
        Box::pin(async { Ok(None) })
    }
    /// Whether [`FinishRun::logs`] is kept (a store shared by several nodes).
    /// The SQLite database behind this store, for what only the SQLite store has (sessions:
    /// crate::storage::sessions); None for PostgreSQL.
    fn sqlite(&self) -> Option<&Db> {
        None
    }

    fn keeps_logs(&self) -> bool {
        false
    }
    /// Records a new run unless one with its (tenant, request_id) exists, atomically.
    fn insert_run(&self, row: RunRow) -> StoreFuture<'_, Insert>;
    /// Marks a queued run as running; false if it was not queued any more.
    fn mark_running(&self, job_id: &str, now: i64) -> StoreFuture<'_, bool>;
    /// Records the end of a run (only from `queued`/`running`).
    fn finish_run(&self, f: FinishRun) -> StoreFuture<'_, ()>;
    /// Operator reconcile of an `unknown` run: retry with a new job `(job_id, expires_at)`,
    /// or abandon (None), with its audit `record`, so that no reconcile lands without it,
    /// whatever moment the process dies at (PostgreSQL: in the change's transaction; SQLite:
    /// the record first, once the run was found still `unknown`, then the change). False (and
    /// no record) if the run was not `unknown` any more; an error (and no change) if the
    /// record cannot be appended.
    fn reconcile(
        &self,
        tenant: &str,
        request_id: &str,
        retry: Option<(String, i64)>,
        now: i64,
        record: Event,
    ) -> StoreFuture<'_, bool>;
    /// Start-up (blocking): every run of this node left `queued` or `running` becomes
    /// `unknown` (a shared store: only the runs this node owned), each marking audited
    /// (`run_unknown`, [`UNKNOWN_AT_START_UP`]) so that no marking lacks its record whatever
    /// moment the process dies at (PostgreSQL: in the marking's transaction; SQLite: the
    /// records first). Also returns the job ids of claims this node held on runs it had not
    /// started (a shared store only): those runs went back to the queue under new job ids, and
    /// the folders prepared for the old ones are the caller's to remove.
    fn mark_in_flight_unknown(&self, now: i64) -> Result<(Vec<InFlight>, Vec<String>), StoreError>;
    /// Retention at `now`: clears expired outputs, lists expired job folders, deletes
    /// expired inputs no in-flight run refers to, and their orphaned objects.
    fn sweep(&self, now: i64, files: Arc<dyn RetentionFiles>) -> StoreFuture<'_, Swept>;
    /// Whether the store answers (health).
    fn ping(&self) -> StoreFuture<'_, ()>;
    /// Appends one audit record; a failure is logged and counted, never returned (the
    /// decision it records has been taken).
    fn audit(&self, ev: Event) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
    /// Appends one audit record, blocking (start-up).
    fn audit_blocking(&self, ev: &Event) -> Result<(), StoreError>;
}

/// The SQLite store: [`crate::storage::db`] and the audit file of [`crate::storage::audit`].
#[derive(Clone)]
pub struct SqliteStore {
    db: Db,
    audit: AuditLog,
}

impl SqliteStore {
    pub fn new(db: Db, audit: AuditLog) -> SqliteStore {
        SqliteStore { db, audit }
    }

    /// The SQLite handle (tests and start-up code that need SQL).
    pub fn db(&self) -> &Db {
        &self.db
    }
}

impl Store for SqliteStore {
    fn sqlite(&self) -> Option<&Db> {
        Some(&self.db)
    }

    fn put_input(
        &self,
        tenant: &str,
        row: InputRow,
        expires_at: i64,
        _body: Arc<[u8]>,
        write_object: WriteObject,
    ) -> StoreFuture<'_, ()> {
        let tenant = tenant.to_string();
        Box::pin(async move {
            self.db
                .call(move |c| {
                    // Under the database lock, so the retention sweep cannot delete the object
                    // between the write and the insert.
                    write_object().map_err(|e| {
                        tracing::error!(error = %e, "storing an input failed");
                        DbError::Join("store".into())
                    })?;
                    db::insert_input(c, &tenant, &row, expires_at)
                })
                .await?;
            Ok(())
        })
    }

    fn get_inputs(&self, tenant: &str, ids: &[String]) -> StoreFuture<'_, Vec<Option<InputRow>>> {
        let (tenant, ids) = (tenant.to_string(), ids.to_vec());
        Box::pin(async move {
            Ok(self
                .db
                .call(move |c| {
                    ids.iter()
                        .map(|id| db::get_input(c, &tenant, id))
                        .collect::<Result<Vec<_>, _>>()
                })
                .await?)
        })
    }

    fn get_run(&self, tenant: &str, request_id: &str) -> StoreFuture<'_, Option<RunRow>> {
        let (t, r) = (tenant.to_string(), request_id.to_string());
        Box::pin(async move { Ok(self.db.call(move |c| db::get_run(c, &t, &r)).await?) })
    }

    fn insert_run(&self, row: RunRow) -> StoreFuture<'_, Insert> {
        Box::pin(async move { Ok(self.db.call(move |c| db::insert_run(c, &row)).await?) })
    }

    fn list_runs(&self, filter: RunFilter) -> StoreFuture<'_, Vec<RunListRow>> {
        Box::pin(async move { Ok(self.db.call(move |c| db::list_runs(c, &filter)).await?) })
    }

    fn mark_running(&self, job_id: &str, now: i64) -> StoreFuture<'_, bool> {
        let id = job_id.to_string();
        Box::pin(async move { Ok(self.db.call(move |c| db::mark_running(c, &id, now)).await?) })
    }

    fn finish_run(&self, f: FinishRun) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            Ok(self
                .db
                .call(move |c| {
                    db::finish_run(
                        c,
                        &Finish {
                            job_id: &f.job_id,
                            status: f.status,
                            reason: f.reason.as_deref(),
                            now: f.now,
                            report: f.report.as_deref(),
                            receipt: f.receipt.as_deref(),
                            artifact: f.artifact.as_deref(),
                            artifact_sha256: f.artifact_sha256.as_deref(),
                            streams: f.streams.as_deref(),
                        },
                    )
                })
                .await?)
        })
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
        let audit = self.audit.clone();
        Box::pin(async move {
            // One call holds the connection throughout: nothing else in this process writes
            // between the check and the change, and no other process writes (the data
            // directory's lock). The record goes first (the log is a file beside the
            // database): a crash before the change's commit leaves the record and the run
            // still `unknown`, to be reconciled again, never a change without its record.
            let done = self
                .db
                .call(move |c| {
                    if !db::is_unknown(c, &t, &r)? {
                        return Ok(Ok(false));
                    }
                    if let Err(e) = audit.append_blocking(&record) {
                        return Ok(Err(e));
                    }
                    let retry = retry.as_ref().map(|(j, e)| (j.as_str(), *e));
                    db::reconcile(c, &t, &r, retry, now).map(Ok)
                })
                .await?;
            done.map_err(|e| {
                metrics::counter!("agentjail_audit_failures_total").increment(1);
                tracing::error!(error = %e, "audit append failed: the reconcile was not done");
                e.into()
            })
        })
    }

    fn mark_in_flight_unknown(&self, now: i64) -> Result<(Vec<InFlight>, Vec<String>), StoreError> {
        let to_inflight = |rows: Vec<(String, String, String, String)>| -> Vec<InFlight> {
            rows.into_iter()
                .map(|(tenant, request_id, task, job_id)| InFlight {
                    tenant,
                    request_id,
                    task,
                    job_id,
                })
                .collect()
        };
        // The records first (the log is a file beside the database): a crash before the
        // marking's commit leaves the runs in flight, and the next start-up finds, audits
        // and marks them again. Nothing else writes meanwhile (the data directory's lock).
        let found = to_inflight(self.db.call_sync(|c| db::in_flight(c))?);
        for run in &found {
            self.audit
                .append_blocking(&run.unknown_event(UNKNOWN_AT_START_UP.into()))?;
        }
        let marked = to_inflight(self.db.call_sync(|c| db::mark_in_flight_unknown(c, now))?);
        if marked != found {
            return Err(StoreError::Database(
                "the runs in flight changed while they were being marked unknown at start-up"
                    .into(),
            ));
        }
        Ok((marked, Vec::new()))
    }

    fn sweep(&self, now: i64, files: Arc<dyn RetentionFiles>) -> StoreFuture<'_, Swept> {
        Box::pin(async move {
            Ok(self
                .db
                .call(move |c| {
                    let expired = db::expire_outputs(c, now)?;
                    let outputs = expired.len();
                    for j in expired {
                        files.drop_outputs(&j);
                    }
                    let mut job_folders = 0;
                    for j in db::expired_log_jobs(c, now)? {
                        if files.drop_job(&j) {
                            job_folders += 1;
                        }
                    }
                    let mut objects = 0;
                    for sha in db::expire_inputs(c, now)? {
                        // Under the database lock: an upload cannot revive the object meanwhile.
                        if !db::object_referenced(c, &sha)? && files.drop_object(&sha) {
                            objects += 1;
                        }
                    }
                    // Under the database lock: no cell can begin from, nor a fork or a
                    // cell's end name, a checkpoint while the references are checked and the
                    // unreferenced files deleted.
                    let live = super::checkpoint_refs::live_checkpoints(c, now)?;
                    let since = super::checkpoint_refs::cells_in_flight_since(c)?;
                    let mut checkpoints = 0;
                    for (hex, mtime) in files.checkpoints() {
                        if !live.contains(&format!("sha256:{hex}"))
                            && since.is_none_or(|t| mtime < t)
                            && files.drop_checkpoint(&hex)
                        {
                            checkpoints += 1;
                        }
                    }
                    Ok(Swept {
                        outputs,
                        job_folders,
                        objects,
                        checkpoints,
                    })
                })
                .await?)
        })
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            self.db.call(|c| db::count_runs(c)).await?;
            Ok(())
        })
    }

    fn audit(&self, ev: Event) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(self.audit.append(ev))
    }

    fn audit_blocking(&self, ev: &Event) -> Result<(), StoreError> {
        Ok(self.audit.append_blocking(ev)?)
    }
}
