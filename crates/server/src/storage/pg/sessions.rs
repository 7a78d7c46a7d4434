//! Sessions on the PostgreSQL store: the twins of crate::storage::sessions (the rows mean the
//! same; see there) on the tables of migration 6, shared by every replica and executor, and
//! the session checkpoints (`checkpoints`: content-addressed archives, any executor of the
//! fleet restores a cell's workspace from them).
//!
//! - A cell is reserved under the session's row lock (`SELECT … FOR UPDATE`): the checks
//!   (execute-once by the cell's request id, closed, expired, the previous cell ended, under
//!   `max_cells`) and the inserts of the cell and its queued run (with its spec, for the
//!   executor that claims it) commit together, so two replicas racing for one session's next
//!   cell serialise there and exactly one reserves it.
//! - A cell's end is fenced like a run's ([`PgStore::finish_fenced`]): its run's outcome, its
//!   checkpoint's bytes, the cell's record and the session's new head commit in one
//!   transaction, only while its executor still holds the lease. A lost executor's cell ends
//!   `unknown` by the lease sweep and moves nothing: the head stays at the last good
//!   checkpoint and the next cell (on any executor) starts there.

use tokio_postgres::Row;

use super::{PgStore, pg_err, read_committed};
use crate::storage::audit::Event;
use crate::storage::db::RunRow;
use crate::storage::sessions::{
    Begin, CellEnd, CellRow, NewCell, SessionRow, refusal, run_request_id,
};
use crate::storage::store::StoreError;

/// What [`PgStore::insert_interpreter`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interpreter {
    /// Recorded as claimed by this node: its fencing token, and the seconds left before its
    /// job id expires (the database's clock).
    Started { fence: i64, job_left: i64 },
    /// Another interpreter of the session is in flight under an unexpired lease.
    Held,
    /// The session's head is not the one the caller restored (an interpreter's end moved it).
    HeadMoved,
    /// The session is closed or gone.
    Closed,
}

const SESSION_COLS: &str = "session_id, tenant, actor, request_id, body_sha256, task, inputs, created_at, expires_at, closed_at, head_sha256, last_receipt_sha256, cells, forked_from, forked_cell, cells_before, keep_checkpoints";
const CELL_COLS: &str = "session_id, cell, request_id, body_sha256, tenant, run_request_id, before_sha256, after_sha256, head_after, receipt_sha256, chain_after, created_at";

fn count(r: &Row, i: usize) -> u64 {
    r.get::<_, i64>(i).max(0) as u64
}

fn session_from(r: &Row) -> SessionRow {
    SessionRow {
        session_id: r.get(0),
        tenant: r.get(1),
        actor: r.get(2),
        request_id: r.get(3),
        body_sha256: r.get(4),
        task: r.get(5),
        inputs: r.get(6),
        created_at: r.get(7),
        expires_at: r.get(8),
        closed_at: r.get(9),
        head_sha256: r.get(10),
        last_receipt_sha256: r.get(11),
        cells: count(r, 12),
        forked_from: r.get(13),
        forked_cell: r.get::<_, Option<i64>>(14).map(|c| c.max(0) as u64),
        cells_before: count(r, 15),
        keep_checkpoints: count(r, 16),
    }
}

fn cell_from(r: &Row) -> CellRow {
    CellRow {
        session_id: r.get(0),
        cell: count(r, 1),
        request_id: r.get(2),
        body_sha256: r.get(3),
        tenant: r.get(4),
        run_request_id: r.get(5),
        before_sha256: r.get(6),
        after_sha256: r.get(7),
        head_after: r.get(8),
        receipt_sha256: r.get(9),
        chain_after: r.get(10),
        created_at: r.get(11),
    }
}

/// What the queued run of a cell carries for the executor that claims it.
pub struct QueuedCell<'a> {
    /// The run's spec; its `session` gets the cell's index, the checkpoint it starts from
    /// and the previous receipt as the reservation reads them under the session's lock.
    pub spec: super::JobSpec,
    pub labels: &'a [String],
    /// The run's `run_accepted`, appended in the reservation's transaction.
    pub accepted: &'a Event,
}

impl PgStore {
    /// The session `id` (whoever owns it: the caller checks).
    pub async fn get_session(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        let c = self.client().await?;
        let r = c
            .query_opt(
                &format!("SELECT {SESSION_COLS} FROM sessions WHERE session_id = $1"),
                &[&id],
            )
            .await
            .map_err(pg_err)?;
        Ok(r.as_ref().map(session_from))
    }

    /// The id of the session `tenant` opened (or forked) with `request_id`.
    pub async fn session_for_request(
        &self,
        tenant: &str,
        request_id: &str,
    ) -> Result<Option<String>, StoreError> {
        let c = self.client().await?;
        let r = c
            .query_opt(
                "SELECT session_id FROM sessions WHERE tenant = $1 AND request_id = $2",
                &[&tenant, &request_id],
            )
            .await
            .map_err(pg_err)?;
        Ok(r.map(|r| r.get(0)))
    }

    /// Records a new session, or returns the one `tenant` already opened with that request id
    /// (Ok(Some)). A fork names the checkpoint it starts from (`start`): Err(()) when it is no
    /// longer stored; it is locked (`FOR SHARE`) until the session is recorded, so the sweep,
    /// which deletes it under a row lock, cannot delete it meanwhile.
    pub async fn open_session(
        &self,
        row: &SessionRow,
        start: Option<&str>,
    ) -> Result<Result<Option<SessionRow>, ()>, StoreError> {
        let mut c = self.client().await?;
        let tx = read_committed(&mut c).await?;
        if let Some(sha) = start {
            let kept = tx
                .query_opt(
                    "SELECT 1 FROM checkpoints WHERE sha256 = $1 FOR SHARE",
                    &[&sha],
                )
                .await
                .map_err(pg_err)?;
            if kept.is_none() {
                return Ok(Err(()));
            }
        }
        let n = tx
            .execute(
                &format!("INSERT INTO sessions ({SESSION_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
                 ON CONFLICT (tenant, request_id) DO NOTHING"),
                &[
                    &row.session_id, &row.tenant, &row.actor, &row.request_id, &row.body_sha256,
                    &row.task, &row.inputs, &row.created_at, &row.expires_at, &row.closed_at,
                    &row.head_sha256, &row.last_receipt_sha256, &(row.cells as i64),
                    &row.forked_from, &row.forked_cell.map(|c| c as i64),
                    &(row.cells_before as i64), &(row.keep_checkpoints as i64),
                ],
            )
            .await
            .map_err(pg_err)?;
        tx.commit().await.map_err(pg_err)?;
        if n == 1 {
            return Ok(Ok(None));
        }
        let existing = self
            .session_for_request(&row.tenant, &row.request_id)
            .await?;
        match existing {
            Some(id) => Ok(Ok(self.get_session(&id).await?)),
            None => Err(StoreError::Database(
                "a conflicting session vanished after its insert".into(),
            )),
        }
    }

    /// The cell of `session_id` whose request id is `request_id`.
    pub async fn get_cell_by_request(
        &self,
        session_id: &str,
        request_id: &str,
    ) -> Result<Option<CellRow>, StoreError> {
        let c = self.client().await?;
        let r = c
            .query_opt(
                &format!(
                    "SELECT {CELL_COLS} FROM session_cells WHERE session_id = $1 AND request_id = $2"
                ),
                &[&session_id, &request_id],
            )
            .await
            .map_err(pg_err)?;
        Ok(r.as_ref().map(cell_from))
    }

    /// The cell `cell` of `session_id`.
    pub async fn get_cell(
        &self,
        session_id: &str,
        cell: u64,
    ) -> Result<Option<CellRow>, StoreError> {
        let c = self.client().await?;
        let r = c
            .query_opt(
                &format!(
                    "SELECT {CELL_COLS} FROM session_cells WHERE session_id = $1 AND cell = $2"
                ),
                &[&session_id, &(cell as i64)],
            )
            .await
            .map_err(pg_err)?;
        Ok(r.as_ref().map(cell_from))
    }

    /// The cells of `session_id` after index `after` (None: from the first), at most `limit`.
    pub async fn list_cells(
        &self,
        session_id: &str,
        after: Option<u64>,
        limit: u32,
    ) -> Result<Vec<CellRow>, StoreError> {
        let after = after.map_or(-1, |a| a as i64);
        let c = self.client().await?;
        let rows = c
            .query(
                &format!("SELECT {CELL_COLS} FROM session_cells WHERE session_id = $1 AND cell > $2 ORDER BY cell LIMIT $3"),
                &[&session_id, &after, &i64::from(limit)],
            )
            .await
            .map_err(pg_err)?;
        Ok(rows.iter().map(cell_from).collect())
    }

    /// Reserves the session's next cell and enqueues its run (`queued`, with `q`'s spec and
    /// labels and its `run_accepted`), in one transaction under the session's row lock; or
    /// says why not. Execute-once first: a known request id answers its cell.
    pub async fn begin_cell(
        &self,
        n: NewCell,
        q: QueuedCell<'_>,
    ) -> Result<(Begin, Option<RunRow>), StoreError> {
        let mut c = self.client().await?;
        let tx = read_committed(&mut c).await?;
        let s = tx
            .query_opt(
                &format!("SELECT {SESSION_COLS} FROM sessions WHERE session_id = $1 FOR UPDATE"),
                &[&n.session_id],
            )
            .await
            .map_err(pg_err)?;
        let Some(s) = s.as_ref().map(session_from) else {
            return Ok((Begin::Missing, None));
        };
        let known = tx
            .query_opt(
                &format!(
                    "SELECT {CELL_COLS} FROM session_cells WHERE session_id = $1 AND request_id = $2"
                ),
                &[&n.session_id, &n.request_id],
            )
            .await
            .map_err(pg_err)?;
        if let Some(k) = known {
            return Ok((Begin::Exists(Box::new(cell_from(&k))), None));
        }
        let last = tx
            .query_opt(
                "SELECT r.status FROM session_cells s JOIN runs r ON r.tenant = s.tenant AND r.request_id = s.run_request_id
                 WHERE s.session_id = $1 ORDER BY s.cell DESC LIMIT 1",
                &[&n.session_id],
            )
            .await
            .map_err(pg_err)?;
        let status: Option<String> = last.map(|r| r.get(0));
        let busy = matches!(status.as_deref(), Some("queued" | "running"));
        if let Some(no) = refusal(&s, busy, &n) {
            return Ok((no, None));
        }
        let cell = s.cells;
        let mut run = n.run;
        run.request_id = run_request_id(&n.session_id, cell);
        let mut spec = q.spec;
        let live = spec.session.as_ref().is_some_and(|j| j.live);
        if let Some(j) = spec.session.as_mut() {
            j.cell = cell;
            j.restore = s.head_sha256.clone();
            j.previous_receipt_sha256 = s.last_receipt_sha256.clone();
        }
        let spec = serde_json::to_string(&spec)
            .map_err(|e| StoreError::Database(format!("encoding a cell's spec: {e}")))?;
        if self.insert_queued(&tx, &run, &spec, q.labels).await? != 1 {
            // The run's request id is the session's own: taken only by this cell.
            return Err(StoreError::Database(
                "a cell's run already exists for a cell not recorded".into(),
            ));
        }
        if live {
            // Routed to the executor whose interpreter holds the session (PgStore::claim).
            tx.execute(
                "UPDATE runs SET live_cell_of = $3 WHERE tenant = $1 AND request_id = $2",
                &[&run.tenant, &run.request_id, &n.session_id],
            )
            .await
            .map_err(pg_err)?;
        }
        super::append_audit_in(&tx, &self.node, q.accepted).await?;
        tx.execute(
            &format!("INSERT INTO session_cells ({CELL_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, NULL, $7, NULL, $8, $9)"),
            &[&n.session_id, &(cell as i64), &n.request_id, &n.body_sha256, &run.tenant, &run.request_id, &s.head_sha256, &s.last_receipt_sha256, &n.now],
        )
        .await
        .map_err(pg_err)?;
        tx.execute(
            "UPDATE sessions SET cells = cells + 1 WHERE session_id = $1",
            &[&n.session_id],
        )
        .await
        .map_err(pg_err)?;
        tx.commit().await.map_err(pg_err)?;
        Ok((
            Begin::Reserved {
                cell,
                before: s.head_sha256,
                previous_receipt: s.last_receipt_sha256,
            },
            Some(run),
        ))
    }

    /// Ends a session (no further cells); false when it was already ended.
    pub async fn close_session(&self, session_id: &str, now: i64) -> Result<bool, StoreError> {
        let c = self.client().await?;
        let n = c
            .execute(
                "UPDATE sessions SET closed_at = $2 WHERE session_id = $1 AND closed_at IS NULL",
                &[&session_id, &now],
            )
            .await
            .map_err(pg_err)?;
        Ok(n == 1)
    }

    /// The stored bytes of checkpoint `sha256` (None: not stored). The caller hashes them.
    pub async fn checkpoint_bytes(&self, sha256: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let c = self.client().await?;
        let r = c
            .query_opt(
                "SELECT bytes FROM checkpoints WHERE sha256 = $1",
                &[&sha256],
            )
            .await
            .map_err(pg_err)?;
        Ok(r.map(|r| r.get(0)))
    }

    /// Deletes the checkpoints nothing refers to any more (as
    /// crate::storage::checkpoint_refs says for SQLite), except those stored since the
    /// oldest cell in flight was created (one may be a checkpoint whose end is not recorded
    /// yet); the digests deleted.
    pub(super) async fn sweep_checkpoints(
        &self,
        c: &deadpool_postgres::Object,
        now: i64,
    ) -> Result<Vec<String>, StoreError> {
        let rows = c
            .query(
                "DELETE FROM checkpoints k
                 WHERE k.created_at < COALESCE((SELECT MIN(r.created_at) FROM session_cells c
                        JOIN runs r ON r.tenant = c.tenant AND r.request_id = c.run_request_id
                        WHERE r.status IN ('queued', 'running')), $1::bigint + 1)
                   AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.head_sha256 = k.sha256
                        AND s.closed_at IS NULL AND s.expires_at > $1)
                   AND NOT EXISTS (SELECT 1 FROM session_cells c JOIN sessions s ON s.session_id = c.session_id
                        WHERE c.head_after = k.sha256 AND s.closed_at IS NULL AND s.expires_at > $1
                        AND c.cell + s.keep_checkpoints >= s.cells)
                   AND NOT EXISTS (SELECT 1 FROM session_cells c
                        JOIN runs r ON r.tenant = c.tenant AND r.request_id = c.run_request_id
                        WHERE c.before_sha256 = k.sha256 AND r.status IN ('queued', 'running'))
                 RETURNING sha256",
                &[&now],
            )
            .await
            .map_err(pg_err)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Records the resident interpreter run `row` of live session `session_id` as claimed by
    /// this node (queued, owner this node, a new fencing token, the lease until the
    /// database's `clock_timestamp() + lease`), with its `run_accepted` record, unless the
    /// session is held already (another interpreter of it in flight under an unexpired
    /// lease), ended, or its head is not `head` any more (the one the caller restored). The
    /// earlier interpreters' rows are locked first, then the session's (the order of a fenced
    /// end: its run, then the session), so an interpreter whose end is committing is waited
    /// for, and its new head seen; two executors never both start one. Its spec is NULL: no
    /// executor claims it from the queue. The fence and the seconds left before the job id
    /// expires (the database's clock).
    pub async fn insert_interpreter(
        &self,
        session_id: &str,
        row: &RunRow,
        lease: std::time::Duration,
        accepted: &Event,
        head: Option<&str>,
    ) -> Result<Interpreter, StoreError> {
        let mut c = self.client().await?;
        let tx = read_committed(&mut c).await?;
        let held = tx
            .query(
                "SELECT lease_expires_at > clock_timestamp() FROM runs
                 WHERE interpreter_of = $1 AND status IN ('queued', 'running') FOR UPDATE",
                &[&session_id],
            )
            .await
            .map_err(pg_err)?;
        if held
            .iter()
            .any(|r| r.get::<_, Option<bool>>(0) == Some(true))
        {
            return Ok(Interpreter::Held);
        }
        let s = tx
            .query_opt(
                "SELECT closed_at IS NULL, head_sha256 FROM sessions WHERE session_id = $1 FOR UPDATE",
                &[&session_id],
            )
            .await
            .map_err(pg_err)?;
        match s {
            Some(r) if r.get::<_, bool>(0) => {
                if r.get::<_, Option<String>>(1).as_deref() != head {
                    return Ok(Interpreter::HeadMoved);
                }
            }
            _ => return Ok(Interpreter::Closed),
        }
        if self.insert_queued(&tx, row, "", &[]).await? != 1 {
            return Err(StoreError::Database(
                "an interpreter's run id was taken".into(),
            ));
        }
        let secs = lease.as_secs_f64();
        let r = tx
            .query_one(
                "UPDATE runs SET spec = NULL, interpreter_of = $3, owner = $4, node_id = $4, fence = nextval('run_fence'),
                    lease_expires_at = clock_timestamp() + make_interval(secs => $5)
                 WHERE tenant = $1 AND request_id = $2
                 RETURNING fence, job_expires_at - EXTRACT(EPOCH FROM clock_timestamp())::bigint",
                &[&row.tenant, &row.request_id, &session_id, &self.node, &secs],
            )
            .await
            .map_err(pg_err)?;
        super::append_audit_in(&tx, &self.node, accepted).await?;
        tx.commit().await.map_err(pg_err)?;
        Ok(Interpreter::Started {
            fence: r.get(0),
            job_left: r.get(1),
        })
    }

    /// Asks the executor holding live session `session_id`'s interpreter to end it (read by
    /// its lease renewal, as a run's cancel); whether one was in flight.
    pub async fn end_interpreter(&self, session_id: &str) -> Result<bool, StoreError> {
        let c = self.client().await?;
        let n = c
            .execute(
                "UPDATE runs SET cancel_requested = TRUE
                 WHERE interpreter_of = $1 AND status IN ('queued', 'running')",
                &[&session_id],
            )
            .await
            .map_err(pg_err)?;
        Ok(n > 0)
    }

    /// In the fenced end of a cell's run (after its run's row was updated): the checkpoint's
    /// bytes (stored unless present; a row whose bytes no longer hash to its name is repaired),
    /// the session's new head and receipt, and the cell's record.
    pub(super) async fn finish_cell_in(
        tx: &deadpool_postgres::Transaction<'_>,
        end: &CellEnd,
        now: i64,
    ) -> Result<(), StoreError> {
        let checkpoint = match (&end.checkpoint, &end.bytes) {
            (Some(sha), Some(bytes)) => {
                tx.execute(
                    "INSERT INTO checkpoints (sha256, bytes, created_at) VALUES ($1, $2, $3)
                     ON CONFLICT (sha256) DO UPDATE SET bytes = EXCLUDED.bytes, created_at = EXCLUDED.created_at",
                    &[sha, &&bytes[..], &now],
                )
                .await
                .map_err(pg_err)?;
                Some(sha.clone())
            }
            _ => None,
        };
        tx.execute(
            "UPDATE sessions SET head_sha256 = COALESCE($2, head_sha256), last_receipt_sha256 = COALESCE($3, last_receipt_sha256) WHERE session_id = $1",
            &[&end.session_id, &checkpoint, &end.chain_link()],
        )
        .await
        .map_err(pg_err)?;
        if end.interpreter {
            // A live session's interpreter: its cells were recorded as they answered.
            return Ok(());
        }
        tx.execute(
            "UPDATE session_cells SET after_sha256 = $3, receipt_sha256 = $4,
                head_after = (SELECT head_sha256 FROM sessions WHERE session_id = $1),
                chain_after = (SELECT last_receipt_sha256 FROM sessions WHERE session_id = $1)
             WHERE session_id = $1 AND cell = $2",
            &[
                &end.session_id,
                &(end.cell as i64),
                &checkpoint,
                &end.receipt_sha256,
            ],
        )
        .await
        .map_err(pg_err)?;
        Ok(())
    }
}
