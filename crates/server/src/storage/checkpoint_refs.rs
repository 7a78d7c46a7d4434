//! What the retention sweep must not delete of the session checkpoint store
//! (`DATA/checkpoints`, crate::execution::checkpoints): the checkpoints a live session or a
//! cell in flight still refers to, read from the sessions' tables (crate::storage::sessions).

use rusqlite::{Connection, params};

use super::db::DbError;

/// The checkpoints something still refers to (`sha256:<hex>`): the head of every live (open,
/// unexpired) session and the checkpoints its most recent `keep_checkpoints` cells left (a
/// fork may start there), and the checkpoint any queued or running cell restores. The
/// retention sweep deletes every other stored checkpoint.
pub fn live_checkpoints(
    c: &Connection,
    now: i64,
) -> Result<std::collections::HashSet<String>, DbError> {
    let mut st = c.prepare(
        "SELECT head_sha256 FROM sessions
           WHERE closed_at IS NULL AND expires_at > ?1 AND head_sha256 IS NOT NULL
         UNION SELECT c.head_after FROM session_cells c JOIN sessions s ON s.session_id = c.session_id
           WHERE s.closed_at IS NULL AND s.expires_at > ?1 AND c.head_after IS NOT NULL
             AND c.cell + s.keep_checkpoints >= s.cells
         UNION SELECT c.before_sha256 FROM session_cells c
           JOIN runs r ON r.tenant = c.tenant AND r.request_id = c.run_request_id
           WHERE r.status IN ('queued', 'running') AND c.before_sha256 IS NOT NULL",
    )?;
    let it = st.query_map(params![now], |r| r.get::<_, String>(0))?;
    Ok(it.collect::<Result<_, _>>()?)
}

/// When the oldest queued or running cell was created (None: no cell in flight). A cell
/// stores its checkpoint before its end is recorded: a file written since then may be one
/// that no record names yet, and is not swept.
pub fn cells_in_flight_since(c: &Connection) -> Result<Option<i64>, DbError> {
    Ok(c.query_row(
        "SELECT MIN(r.created_at) FROM session_cells c
           JOIN runs r ON r.tenant = c.tenant AND r.request_id = c.run_request_id
           WHERE r.status IN ('queued', 'running')",
        [],
        |r| r.get(0),
    )?)
}
