//! A live session's checkpoint on request on the fleet (`POST /v1/sessions/{id}/checkpoint`,
//! docs/api.md "Live sessions"): the replica that takes the request asks through the session's
//! row (`checkpoint_asked`, a counter) and tells the others (`NOTIFY live_cells`); the
//! executor whose interpreter holds the session collects `/work` from its sandbox and answers
//! every ask up to the one it read (`checkpoint_done`, `checkpoint_result`), the checkpoint
//! made the session's head in the same transaction, only while its interpreter's run is in
//! flight on that node under an unexpired lease. When no interpreter holds the session, its
//! head is the last checkpoint and the replica answers with it.

use super::{PgStore, pg_err, read_committed};
use crate::storage::store::StoreError;

/// What an executor answers to a checkpoint ask.
pub enum Answer {
    /// The checkpoint (`sha256:<hex>`) and its bytes, checked to be that digest.
    Taken { sha256: String, bytes: Vec<u8> },
    /// None was taken: why, one line.
    Refused(String),
}

/// An ask a node holding the session should answer.
pub struct Asked {
    pub session_id: String,
    pub task: String,
    pub asked: i64,
}

impl PgStore {
    /// Records a checkpoint ask for the session: its number (answered once `checkpoint_done`
    /// reaches it); None when the session is gone or closed.
    pub async fn ask_checkpoint(&self, session_id: &str) -> Result<Option<i64>, StoreError> {
        let c = self.client().await?;
        let r = c
            .query_opt(
                "UPDATE sessions SET checkpoint_asked = checkpoint_asked + 1
                 WHERE session_id = $1 AND closed_at IS NULL RETURNING checkpoint_asked",
                &[&session_id],
            )
            .await
            .map_err(pg_err)?;
        Ok(r.map(|r| r.get(0)))
    }

    /// Where an ask stands: `Some(result)` once answered (the JSON the holder wrote), None
    /// while not; and whether an interpreter of the session is in flight under an unexpired
    /// lease (none: nothing will answer; the head is the last checkpoint).
    pub async fn checkpoint_answer(
        &self,
        session_id: &str,
        asked: i64,
    ) -> Result<(Option<String>, bool), StoreError> {
        let c = self.client().await?;
        let r = c
            .query_one(
                "SELECT s.checkpoint_done >= $2, s.checkpoint_result,
                        EXISTS (SELECT 1 FROM runs i WHERE i.interpreter_of = s.session_id
                                AND i.status IN ('queued', 'running')
                                AND i.lease_expires_at > clock_timestamp())
                 FROM sessions s WHERE s.session_id = $1",
                &[&session_id, &asked],
            )
            .await
            .map_err(pg_err)?;
        let done: bool = r.get(0);
        let result: Option<String> = r.get(1);
        Ok((
            if done {
                Some(result.unwrap_or_default())
            } else {
                None
            },
            r.get(2),
        ))
    }

    /// The unanswered asks of the sessions in `held` (those this node has a live slot for).
    pub async fn checkpoints_asked(&self, held: &[String]) -> Result<Vec<Asked>, StoreError> {
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT session_id, task, checkpoint_asked FROM sessions
                 WHERE session_id = ANY($1) AND checkpoint_asked > checkpoint_done
                   AND closed_at IS NULL",
                &[&held],
            )
            .await
            .map_err(pg_err)?;
        Ok(rows
            .iter()
            .map(|r| Asked {
                session_id: r.get(0),
                task: r.get(1),
                asked: r.get(2),
            })
            .collect())
    }

    /// Answers the session's asks up to `asked` with `answer`, in one transaction: a taken
    /// checkpoint is stored and made the session's head (and what a fork from its last cell
    /// starts from) only while this node's interpreter of the session is in flight under an
    /// unexpired lease; false when it was not (nothing written: the asks stay for the holder).
    pub async fn answer_checkpoint(
        &self,
        session_id: &str,
        asked: i64,
        answer: Answer,
        now: i64,
    ) -> Result<bool, StoreError> {
        let mut c = self.client().await?;
        let tx = read_committed(&mut c).await?;
        let holds: bool = tx
            .query_opt(
                "SELECT EXISTS (SELECT 1 FROM runs WHERE interpreter_of = $1 AND node_id = $2
                        AND status IN ('queued', 'running') AND lease_expires_at > clock_timestamp())
                 FROM sessions WHERE session_id = $1 AND closed_at IS NULL FOR UPDATE",
                &[&session_id, &self.node],
            )
            .await
            .map_err(pg_err)?
            .is_some_and(|r| r.get(0));
        if !holds {
            return Ok(false);
        }
        let result = match answer {
            Answer::Taken { sha256, bytes } => {
                tx.execute(
                    "INSERT INTO checkpoints (sha256, bytes, created_at) VALUES ($1, $2, $3)
                     ON CONFLICT (sha256) DO UPDATE SET bytes = EXCLUDED.bytes, created_at = EXCLUDED.created_at",
                    &[&sha256, &bytes, &now],
                )
                .await
                .map_err(pg_err)?;
                tx.execute(
                    "UPDATE sessions SET head_sha256 = $2 WHERE session_id = $1",
                    &[&session_id, &sha256],
                )
                .await
                .map_err(pg_err)?;
                // The last cell, once it ended: one a replica reserved meanwhile (queued, not
                // run yet) did not leave this workspace.
                tx.execute(
                    "UPDATE session_cells c SET head_after = $2 WHERE c.session_id = $1
                       AND c.cell = (SELECT cells - 1 FROM sessions WHERE session_id = $1)
                       AND EXISTS (SELECT 1 FROM runs r WHERE r.tenant = c.tenant
                                   AND r.request_id = c.run_request_id
                                   AND r.status NOT IN ('queued', 'running'))",
                    &[&session_id, &sha256],
                )
                .await
                .map_err(pg_err)?;
                serde_json::json!({ "sha256": sha256 })
            }
            Answer::Refused(why) => serde_json::json!({ "error": why }),
        };
        tx.execute(
            "UPDATE sessions SET checkpoint_done = GREATEST(checkpoint_done, $2),
                    checkpoint_result = $3 WHERE session_id = $1",
            &[&session_id, &asked, &result.to_string()],
        )
        .await
        .map_err(pg_err)?;
        tx.commit().await.map_err(pg_err)?;
        Ok(true)
    }
}

impl PgStore {
    /// Marks the session's asks up to `asked` as settled without a checkpoint (no interpreter
    /// held the session: its head is the last checkpoint; or no answer came in time), so that
    /// no later holder takes one nobody waits for. A waiter on an earlier ask reads `none`.
    pub async fn settle_checkpoint_ask(
        &self,
        session_id: &str,
        asked: i64,
    ) -> Result<(), StoreError> {
        let c = self.client().await?;
        c.execute(
            "UPDATE sessions SET checkpoint_done = $2, checkpoint_result = '{\"none\": true}'
             WHERE session_id = $1 AND checkpoint_done < $2",
            &[&session_id, &asked],
        )
        .await
        .map_err(pg_err)?;
        Ok(())
    }
}
