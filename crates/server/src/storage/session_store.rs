//! Which store keeps the sessions: SQLite (crate::storage::sessions, one node) or PostgreSQL
//! (crate::storage::pg::sessions, shared by the replicas and executors of a fleet). The
//! service layer goes through [`Sessions`] for every session record, whatever the store.

use std::path::PathBuf;

use super::db::{Db, RunRow};
use super::pg::PgStore;
use super::pg::sessions::QueuedCell;
use super::sessions::{self as lite, Begin, CellRow, NewCell, SessionRow};
use super::store::StoreError;

/// The sessions' store.
#[derive(Clone)]
pub enum Sessions {
    Sqlite(Db),
    Pg(PgStore),
}

impl Sessions {
    /// The session `id` (whoever owns it: the caller checks).
    pub async fn get_session(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        match self {
            Sessions::Sqlite(db) => {
                let id = id.to_owned();
                Ok(db.call(move |c| lite::get_session(c, &id)).await?)
            }
            Sessions::Pg(pg) => pg.get_session(id).await,
        }
    }

    /// The id of the session `tenant` opened (or forked) with `request_id`.
    pub async fn session_for_request(
        &self,
        tenant: &str,
        request_id: &str,
    ) -> Result<Option<String>, StoreError> {
        match self {
            Sessions::Sqlite(db) => {
                let (t, r) = (tenant.to_owned(), request_id.to_owned());
                Ok(db
                    .call(move |c| lite::session_for_request(c, &t, &r))
                    .await?)
            }
            Sessions::Pg(pg) => pg.session_for_request(tenant, request_id).await,
        }
    }

    /// Records a new session, or returns the one its tenant already opened with its request
    /// id. A fork names the checkpoint it starts from (`start`: its digest, and its file on
    /// SQLite); Err(()) when that is no longer stored, checked where the retention sweep
    /// cannot delete it meanwhile.
    pub async fn open_session(
        &self,
        row: SessionRow,
        start: Option<(String, Option<PathBuf>)>,
    ) -> Result<Result<Option<SessionRow>, ()>, StoreError> {
        match self {
            Sessions::Sqlite(db) => {
                let file = start.map(|(_, f)| f);
                Ok(db
                    .call(move |c| match file {
                        Some(f) if !f.as_ref().is_some_and(|f| f.is_file()) => Ok(Err(())),
                        _ => lite::open_session(c, &row).map(Ok),
                    })
                    .await?)
            }
            Sessions::Pg(pg) => {
                pg.open_session(&row, start.as_ref().map(|s| s.0.as_str()))
                    .await
            }
        }
    }

    /// The cell of `session_id` whose request id is `request_id`.
    pub async fn get_cell_by_request(
        &self,
        session_id: &str,
        request_id: &str,
    ) -> Result<Option<CellRow>, StoreError> {
        match self {
            Sessions::Sqlite(db) => {
                let (s, r) = (session_id.to_owned(), request_id.to_owned());
                Ok(db
                    .call(move |c| lite::get_cell_by_request(c, &s, &r))
                    .await?)
            }
            Sessions::Pg(pg) => pg.get_cell_by_request(session_id, request_id).await,
        }
    }

    /// The cell `cell` of `session_id`.
    pub async fn get_cell(
        &self,
        session_id: &str,
        cell: u64,
    ) -> Result<Option<CellRow>, StoreError> {
        match self {
            Sessions::Sqlite(db) => {
                let s = session_id.to_owned();
                Ok(db.call(move |c| lite::get_cell(c, &s, cell)).await?)
            }
            Sessions::Pg(pg) => pg.get_cell(session_id, cell).await,
        }
    }

    /// The cells of `session_id` after index `after`, at most `limit`.
    pub async fn list_cells(
        &self,
        session_id: &str,
        after: Option<u64>,
        limit: u32,
    ) -> Result<Vec<CellRow>, StoreError> {
        match self {
            Sessions::Sqlite(db) => {
                let s = session_id.to_owned();
                Ok(db
                    .call(move |c| lite::list_cells(c, &s, after, limit))
                    .await?)
            }
            Sessions::Pg(pg) => pg.list_cells(session_id, after, limit).await,
        }
    }

    /// Reserves the session's next cell with its run, or says why not. On PostgreSQL the run
    /// is enqueued for the fleet with `queued` (its spec, labels and `run_accepted`); SQLite
    /// records it for this node to execute.
    pub async fn begin_cell(
        &self,
        n: NewCell,
        queued: Option<QueuedCell<'_>>,
    ) -> Result<(Begin, Option<RunRow>), StoreError> {
        match (self, queued) {
            (Sessions::Sqlite(db), _) => Ok(db.call(move |c| lite::begin_cell(c, n)).await?),
            (Sessions::Pg(pg), Some(q)) => pg.begin_cell(n, q).await,
            (Sessions::Pg(_), None) => Err(StoreError::Database(
                "a cell on PostgreSQL needs its queued run's spec".into(),
            )),
        }
    }

    /// Ends a session (no further cells); false when it was already ended.
    pub async fn close_session(&self, session_id: &str, now: i64) -> Result<bool, StoreError> {
        match self {
            Sessions::Sqlite(db) => {
                let s = session_id.to_owned();
                Ok(db.call(move |c| lite::close_session(c, &s, now)).await?)
            }
            Sessions::Pg(pg) => pg.close_session(session_id, now).await,
        }
    }
}
