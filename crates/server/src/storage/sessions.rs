//! Sessions on the SQLite store: a session (its owner, task, inputs, lifetime, head
//! checkpoint) and its cells (each one a run of the `runs` table, with the workspace it started
//! from and the one it left). A cell is reserved with its run in one transaction (the checks
//! that cells are sequential, the session open and under its cell limit, and execute-once
//! by the cell's request id, under the database's write lock); the cell's end, its run's
//! outcome and the session's new head commit together ([`finish_cell`]), so a head never names
//! a checkpoint that was not verified and stored first.

use rusqlite::{Connection, OptionalExtension, params};

use super::db::{DbError, RunRow, finish_run, insert_run_in};
use super::store::{FinishRun, Store, StoreError};

// The tables (`sessions`, `session_cells`) are migration 5 of crate::storage::db.

/// One session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    pub session_id: String,
    pub tenant: String,
    pub actor: String,
    pub request_id: String,
    pub body_sha256: String,
    pub task: String,
    /// JSON array of the input ids, as the opening request named them.
    pub inputs: String,
    pub created_at: i64,
    pub expires_at: i64,
    pub closed_at: Option<i64>,
    /// The checkpoint the next cell starts from (None: an empty `/work`).
    pub head_sha256: Option<String>,
    /// The last cell's receipt digest (the next cell's `previous_receipt_sha256`).
    pub last_receipt_sha256: Option<String>,
    pub cells: u64,
    pub forked_from: Option<String>,
    pub forked_cell: Option<u64>,
    /// Cells run by the ancestors of a fork up to the cell it was forked at (0 for a session
    /// opened afresh): the session may run `max_cells - cells_before` cells.
    pub cells_before: u64,
    /// How many of its most recent cells keep their checkpoints for a fork.
    pub keep_checkpoints: u64,
}

impl SessionRow {
    /// Whether cell `cell`'s checkpoint is still kept for a fork (one of the most recent
    /// `keep_checkpoints` cells; older ones are deleted by the retention sweep).
    pub fn keeps(&self, cell: u64) -> bool {
        cell + self.keep_checkpoints >= self.cells
    }
}

/// One cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellRow {
    pub session_id: String,
    pub cell: u64,
    pub request_id: String,
    pub body_sha256: String,
    pub tenant: String,
    /// The request id of the cell's run (`<session_id>-<cell>`).
    pub run_request_id: String,
    pub before_sha256: Option<String>,
    /// The checkpoint the cell left, verified and stored (None: none was, and the head stayed).
    pub after_sha256: Option<String>,
    /// The session's head once the cell ended (a fork from this cell starts there).
    pub head_after: Option<String>,
    pub receipt_sha256: Option<String>,
    /// The session's last receipt digest once the cell ended (its own, or, for a cell without
    /// a receipt, the one before): what the next cell, or a fork from this one, names.
    pub chain_after: Option<String>,
    pub created_at: i64,
}

const SESSION_COLS: &str = "session_id, tenant, actor, request_id, body_sha256, task, inputs, created_at, expires_at, closed_at, head_sha256, last_receipt_sha256, cells, forked_from, forked_cell, cells_before, keep_checkpoints";
const CELL_COLS: &str = "session_id, cell, request_id, body_sha256, tenant, run_request_id, before_sha256, after_sha256, head_after, receipt_sha256, chain_after, created_at";

fn session_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SessionRow> {
    Ok(SessionRow {
        session_id: r.get(0)?,
        tenant: r.get(1)?,
        actor: r.get(2)?,
        request_id: r.get(3)?,
        body_sha256: r.get(4)?,
        task: r.get(5)?,
        inputs: r.get(6)?,
        created_at: r.get(7)?,
        expires_at: r.get(8)?,
        closed_at: r.get(9)?,
        head_sha256: r.get(10)?,
        last_receipt_sha256: r.get(11)?,
        cells: r.get::<_, i64>(12)?.max(0) as u64,
        forked_from: r.get(13)?,
        forked_cell: r.get::<_, Option<i64>>(14)?.map(|c| c.max(0) as u64),
        cells_before: r.get::<_, i64>(15)?.max(0) as u64,
        keep_checkpoints: r.get::<_, i64>(16)?.max(0) as u64,
    })
}

fn cell_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<CellRow> {
    Ok(CellRow {
        session_id: r.get(0)?,
        cell: r.get::<_, i64>(1)?.max(0) as u64,
        request_id: r.get(2)?,
        body_sha256: r.get(3)?,
        tenant: r.get(4)?,
        run_request_id: r.get(5)?,
        before_sha256: r.get(6)?,
        after_sha256: r.get(7)?,
        head_after: r.get(8)?,
        receipt_sha256: r.get(9)?,
        chain_after: r.get(10)?,
        created_at: r.get(11)?,
    })
}

/// The session `id` (whoever owns it: the caller checks).
pub fn get_session(c: &Connection, id: &str) -> Result<Option<SessionRow>, DbError> {
    Ok(c.prepare_cached(&format!(
        "SELECT {SESSION_COLS} FROM sessions WHERE session_id = ?1"
    ))?
    .query_row(params![id], session_from_row)
    .optional()?)
}

/// The id of the session `tenant` opened (or forked) with `request_id`.
pub fn session_for_request(
    c: &Connection,
    tenant: &str,
    request_id: &str,
) -> Result<Option<String>, DbError> {
    Ok(
        c.prepare_cached("SELECT session_id FROM sessions WHERE tenant = ?1 AND request_id = ?2")?
            .query_row(params![tenant, request_id], |r| r.get(0))
            .optional()?,
    )
}

/// Records a new session, or returns the one `tenant` already opened with that request id.
pub fn open_session(c: &mut Connection, row: &SessionRow) -> Result<Option<SessionRow>, DbError> {
    let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let existing = tx
        .prepare_cached(&format!(
            "SELECT {SESSION_COLS} FROM sessions WHERE tenant = ?1 AND request_id = ?2"
        ))?
        .query_row(params![row.tenant, row.request_id], session_from_row)
        .optional()?;
    if existing.is_some() {
        return Ok(existing);
    }
    tx.execute(
        &format!("INSERT INTO sessions ({SESSION_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"),
        params![
            row.session_id, row.tenant, row.actor, row.request_id, row.body_sha256, row.task,
            row.inputs, row.created_at, row.expires_at, row.closed_at, row.head_sha256,
            row.last_receipt_sha256, row.cells as i64, row.forked_from,
            row.forked_cell.map(|c| c as i64), row.cells_before as i64,
            row.keep_checkpoints as i64
        ],
    )?;
    tx.commit()?;
    Ok(None)
}

/// The cell of `session_id` whose request id is `request_id`.
pub fn get_cell_by_request(
    c: &Connection,
    session_id: &str,
    request_id: &str,
) -> Result<Option<CellRow>, DbError> {
    Ok(c.prepare_cached(&format!(
        "SELECT {CELL_COLS} FROM session_cells WHERE session_id = ?1 AND request_id = ?2"
    ))?
    .query_row(params![session_id, request_id], cell_from_row)
    .optional()?)
}

/// The cell `cell` of `session_id`.
pub fn get_cell(c: &Connection, session_id: &str, cell: u64) -> Result<Option<CellRow>, DbError> {
    Ok(c.prepare_cached(&format!(
        "SELECT {CELL_COLS} FROM session_cells WHERE session_id = ?1 AND cell = ?2"
    ))?
    .query_row(params![session_id, cell as i64], cell_from_row)
    .optional()?)
}

/// The cells of `session_id` after index `after` (None: from the first), at most `limit`.
pub fn list_cells(
    c: &Connection,
    session_id: &str,
    after: Option<u64>,
    limit: u32,
) -> Result<Vec<CellRow>, DbError> {
    let after = after.map_or(-1, |a| a as i64);
    let mut st = c.prepare_cached(&format!(
        "SELECT {CELL_COLS} FROM session_cells WHERE session_id = ?1 AND cell > ?2 ORDER BY cell LIMIT ?3"
    ))?;
    let rows = st.query_map(params![session_id, after, limit], cell_from_row)?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

/// Whether the last cell of `session_id` is still queued or running.
fn busy(c: &Connection, session_id: &str) -> Result<bool, DbError> {
    let status: Option<String> = c
        .prepare_cached(
            "SELECT r.status FROM session_cells s JOIN runs r ON r.tenant = s.tenant AND r.request_id = s.run_request_id
             WHERE s.session_id = ?1 ORDER BY s.cell DESC LIMIT 1",
        )?
        .query_row(params![session_id], |r| r.get(0))
        .optional()?;
    Ok(matches!(status.as_deref(), Some("queued" | "running")))
}

/// Why a cell was not reserved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// Reserved: its index, its run's request id, the checkpoint it starts from and the
    /// previous cell's receipt digest.
    Reserved {
        cell: u64,
        before: Option<String>,
        previous_receipt: Option<String>,
    },
    /// The request id was already used in this session: its cell.
    Exists(Box<CellRow>),
    /// The previous cell has not ended.
    Busy,
    Closed,
    Expired,
    /// The session ran its `max_cells`.
    Full,
    /// The session is gone.
    Missing,
}

/// What a new cell needs reserved.
pub struct NewCell {
    pub session_id: String,
    pub request_id: String,
    pub body_sha256: String,
    pub max_cells: u64,
    /// The index the caller built the run for (its request id and manifest digest): another
    /// one means a cell ended and another began meanwhile; refused as busy (try again).
    pub expected_cell: u64,
    pub now: i64,
    /// Its run, `request_id` filled in here with the cell's index.
    pub run: RunRow,
}

/// What a session's cell adds to its job (crate::execution::checkpoints); on PostgreSQL it
/// travels in the queued run's spec to whichever executor claims the cell.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CellJob {
    pub session_id: String,
    pub cell: u64,
    /// The checkpoint the cell starts from (`sha256:<hex>`), None for an empty `/work`.
    pub restore: Option<String>,
    /// The previous cell's receipt digest (`sha256:<hex>`).
    pub previous_receipt_sha256: Option<String>,
    pub max_mb: u64,
    pub max_files: u64,
    /// The run is a live session's resident interpreter (`execution::live`): its runner gets
    /// the control socket, and its end moves the session's head, not a cell's record. Never
    /// on a queued run's spec (the executor that holds the session starts it).
    #[serde(default)]
    pub interpreter: bool,
    /// A live session's cell on the fleet's queue: executed in the session's resident
    /// interpreter by the executor that holds it (crate::execution::live_fleet).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub live: bool,
}

/// How every session id starts (`ses_` and 32 hex digits); run request ids cannot.
pub const SESSION_ID_PREFIX: &str = "ses_";

/// The request id of cell `cell`'s run.
pub fn run_request_id(session_id: &str, cell: u64) -> String {
    format!("{session_id}-{cell}")
}

/// Why the session `s` (as locked for the reservation) takes no new cell `n`, its last cell
/// still in flight when `busy`; None: it takes cell `s.cells`. Both stores' reservations.
pub fn refusal(s: &SessionRow, busy: bool, n: &NewCell) -> Option<Begin> {
    if s.closed_at.is_some() {
        Some(Begin::Closed)
    } else if n.now >= s.expires_at {
        Some(Begin::Expired)
    } else if busy {
        Some(Begin::Busy)
    } else if s.cells >= n.max_cells {
        Some(Begin::Full)
    } else if s.cells != n.expected_cell {
        Some(Begin::Busy)
    } else {
        None
    }
}

/// Reserves the session's next cell and records its run (`queued`), in one transaction: or
/// says why not. Execute-once first: a known request id answers its cell whatever the state.
pub fn begin_cell(c: &mut Connection, n: NewCell) -> Result<(Begin, Option<RunRow>), DbError> {
    let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    if let Some(cell) = get_cell_by_request(&tx, &n.session_id, &n.request_id)? {
        return Ok((Begin::Exists(Box::new(cell)), None));
    }
    let Some(s) = get_session(&tx, &n.session_id)? else {
        return Ok((Begin::Missing, None));
    };
    if let Some(no) = refusal(&s, busy(&tx, &n.session_id)?, &n) {
        return Ok((no, None));
    }
    let cell = s.cells;
    let mut run = n.run;
    run.request_id = run_request_id(&n.session_id, cell);
    insert_run_in(&tx, &run)?;
    tx.execute(
        &format!("INSERT INTO session_cells ({CELL_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, NULL, ?7, NULL, ?8, ?9)"),
        params![n.session_id, cell as i64, n.request_id, n.body_sha256, run.tenant, run.request_id, s.head_sha256, s.last_receipt_sha256, n.now],
    )?;
    tx.execute(
        "UPDATE sessions SET cells = cells + 1 WHERE session_id = ?1",
        params![n.session_id],
    )?;
    tx.commit()?;
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
pub fn close_session(c: &Connection, session_id: &str, now: i64) -> Result<bool, DbError> {
    Ok(c.execute(
        "UPDATE sessions SET closed_at = ?2 WHERE session_id = ?1 AND closed_at IS NULL",
        params![session_id, now],
    )? == 1)
}

/// How a cell ended, for the session: the checkpoint it left (verified and stored) and its
/// receipt's digest.
#[derive(Debug, Clone)]
pub struct CellEnd {
    pub session_id: String,
    pub cell: u64,
    pub checkpoint: Option<String>,
    pub receipt_sha256: Option<String>,
    /// Where `checkpoint` is stored: checked under the database's lock as the end is recorded,
    /// so that a head never names a file the retention sweep deleted meanwhile.
    pub checkpoint_path: Option<std::path::PathBuf>,
    /// The checkpoint's bytes (already checked against `checkpoint`), for a store shared by
    /// several nodes, which keeps them itself (PostgreSQL's `checkpoints`).
    pub bytes: Option<std::sync::Arc<[u8]>>,
    /// A live session's interpreter run: it moves the session's head, and neither the chain
    /// of receipts (its cells' receipts chain, each naming the one before) nor a cell's
    /// record (its cells were recorded as they answered).
    pub interpreter: bool,
}

impl CellEnd {
    /// The receipt digest the session's chain moves to: none for an interpreter's run.
    pub fn chain_link(&self) -> Option<&str> {
        self.receipt_sha256.as_deref().filter(|_| !self.interpreter)
    }
}

fn finish_cell_sync(c: &mut Connection, f: &FinishRun, end: &CellEnd) -> Result<(), DbError> {
    let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    // The sweep deletes unreferenced checkpoints under this same lock: a checkpoint stored
    // before its cell's end is recorded, and swept meanwhile, is not made the head.
    let kept = end.checkpoint_path.as_ref().is_none_or(|p| p.is_file());
    let checkpoint = if kept { end.checkpoint.clone() } else { None };
    let end = &CellEnd {
        checkpoint,
        ..end.clone()
    };
    finish_run(
        &tx,
        &super::db::Finish {
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
    )?;
    tx.execute(
        "UPDATE sessions SET head_sha256 = COALESCE(?2, head_sha256), last_receipt_sha256 = COALESCE(?3, last_receipt_sha256) WHERE session_id = ?1",
        params![end.session_id, end.checkpoint, end.chain_link()],
    )?;
    if end.interpreter {
        tx.commit()?;
        return Ok(());
    }
    tx.execute(
        "UPDATE session_cells SET after_sha256 = ?3, receipt_sha256 = ?4,
            head_after = (SELECT head_sha256 FROM sessions WHERE session_id = ?1),
            chain_after = (SELECT last_receipt_sha256 FROM sessions WHERE session_id = ?1)
         WHERE session_id = ?1 AND cell = ?2",
        params![
            end.session_id,
            end.cell as i64,
            end.checkpoint,
            end.receipt_sha256
        ],
    )?;
    tx.commit()?;
    Ok(())
}

/// A live session's checkpoint taken on request (stored at `path`, checked under the
/// database's lock as the retention sweep deletes under it): the session's new head, and the
/// head its last cell left (what a fork from that cell starts from). Only while the
/// interpreter's run that took it (`tenant`, `run`) is in flight: once it ended, its end's
/// checkpoint is the newer head, never replaced by this older one. False when the session
/// was closed, the run ended, or the file is gone.
pub fn set_live_head(
    c: &mut Connection,
    session_id: &str,
    (tenant, run): (&str, &str),
    sha256: &str,
    path: &std::path::Path,
) -> Result<bool, DbError> {
    let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    if !path.is_file() {
        return Ok(false);
    }
    let n = tx.execute(
        "UPDATE sessions SET head_sha256 = ?2 WHERE session_id = ?1 AND closed_at IS NULL
           AND EXISTS (SELECT 1 FROM runs WHERE tenant = ?3 AND request_id = ?4
                       AND status IN ('queued', 'running'))",
        params![session_id, sha256, tenant, run],
    )?;
    if n == 1 {
        tx.execute(
            "UPDATE session_cells SET head_after = ?2 WHERE session_id = ?1
               AND cell = (SELECT cells - 1 FROM sessions WHERE session_id = ?1)",
            params![session_id, sha256],
        )?;
    }
    tx.commit()?;
    Ok(n == 1)
}

/// Records a cell's end: its run's outcome, the cell's checkpoint and receipt, and the
/// session's new head, in one transaction.
pub async fn finish_cell(store: &dyn Store, f: FinishRun, end: CellEnd) -> Result<(), StoreError> {
    let Some(db) = store.sqlite() else {
        return Err(StoreError::Database(
            "this is the SQLite store's cell end; PostgreSQL ends a cell in its fenced run end"
                .into(),
        ));
    };
    Ok(db.call(move |c| finish_cell_sync(c, &f, &end)).await?)
}
