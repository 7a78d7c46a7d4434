//! Wake-ups for the followers of a run that executes on this node (issue #33): instead of
//! looking every `crate::service::POLL` for news, a follower of such a run waits until the
//! run's execution says something changed: its log files grew, a live denial was appended, it
//! was marked started, or its execution ended (the end is recorded before the news channel
//! closes, so a woken follower finds it). A follower of a run executing elsewhere (another node
//! of a PostgreSQL deployment) polls as before; so does one that started watching before this
//! node registered the run (it looks again at its next poll).
//!
//! A wake-up carries nothing but "look again": what a follower sends is always what it reads
//! from the store and the job folder, so a missed or extra wake-up costs a poll, never a chunk.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tokio::sync::watch;

/// The news channels of the runs executing (or waiting for a slot) on this node, by job id,
/// and one for the set of them: bumped when a run is registered here, marked started, or
/// ends (the console's live runs list, `/console/api/runs/events`).
pub struct Board {
    runs: Mutex<HashMap<String, watch::Sender<u64>>>,
    states: watch::Sender<u64>,
    /// Bumped with `states` by this node's own changes only (not by
    /// [`Board::changed_elsewhere`]): what this node tells the other nodes of a PostgreSQL
    /// deployment.
    local: watch::Sender<u64>,
}

impl Default for Board {
    fn default() -> Board {
        Board {
            runs: Mutex::default(),
            states: watch::channel(0).0,
            local: watch::channel(0).0,
        }
    }
}

/// What a run's execution holds to tell its followers something changed. Cloned into each
/// writer of the run (the log drains, the denials' writer); the channel closes, and every
/// follower wakes, when the registration and every clone are gone.
#[derive(Clone)]
pub struct Teller(watch::Sender<u64>);

impl Teller {
    /// Wakes the run's followers (they look again).
    pub fn tell(&self) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// A follower's end of a run's news.
pub struct Listener(watch::Receiver<u64>);

impl Listener {
    /// Waits until something changed since the last wait (or since [`Board::listen`]); false
    /// when the run's execution on this node is over (the channel closed): there will be no
    /// more news from here.
    pub async fn changed(&mut self) -> bool {
        self.0.changed().await.is_ok()
    }
}

impl Board {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<u64>>> {
        self.runs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers the run `job_id` as executing here.
    pub fn open(&self, job_id: &str) {
        let (tx, _) = watch::channel(0);
        self.map().insert(job_id.to_owned(), tx);
        self.bump_states();
    }

    /// Wakes the followers of `job_id`, which was just marked started, and the runs list's.
    pub fn started(&self, job_id: &str) {
        self.tell(job_id);
        self.bump_states();
    }

    /// A change to the set of runs executing here or to one's state ([`Board::open`],
    /// [`Board::started`], [`Board::close`]): each wait on the receiver returns once after one
    /// or more of them.
    pub fn states(&self) -> watch::Receiver<u64> {
        self.states.subscribe()
    }

    /// A run of another node of the deployment was registered or changed state (that node's
    /// notification through the PostgreSQL store): the runs list looks again too.
    pub fn changed_elsewhere(&self) {
        self.states.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// This node's own changes ([`Board::open`], [`Board::started`], [`Board::close`]), for
    /// telling the other nodes.
    pub fn local_changes(&self) -> watch::Receiver<u64> {
        self.local.subscribe()
    }

    fn bump_states(&self) {
        self.local.send_modify(|n| *n = n.wrapping_add(1));
        self.states.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The [`Teller`] of `job_id`, for a writer of the run; None if it does not execute here.
    pub fn teller(&self, job_id: &str) -> Option<Teller> {
        self.map().get(job_id).map(|tx| Teller(tx.clone()))
    }

    /// Wakes the followers of `job_id` if it executes here.
    pub fn tell(&self, job_id: &str) {
        if let Some(tx) = self.map().get(job_id) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Forgets the run `job_id` (its execution ended): once the tellers cloned from it are
    /// gone too, its followers learn there is no more news from here.
    pub fn close(&self, job_id: &str) {
        self.map().remove(job_id);
        self.bump_states();
    }

    /// The news of `job_id` if it executes here; None if not (the follower polls).
    pub fn listen(&self, job_id: &str) -> Option<Listener> {
        self.map().get(job_id).map(|tx| Listener(tx.subscribe()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_follower_wakes_on_news_and_when_the_run_is_over() {
        let board = Board::default();
        assert!(board.listen("j1").is_none());
        board.open("j1");
        let teller = board.teller("j1").expect("registered");
        let mut l = board.listen("j1").expect("registered");
        // Nothing yet: no wake-up.
        let idle = tokio::time::timeout(Duration::from_millis(50), l.changed()).await;
        assert!(idle.is_err(), "woke without news");
        // News told before the wait is not lost.
        teller.tell();
        board.tell("j1");
        assert!(l.changed().await);
        let idle = tokio::time::timeout(Duration::from_millis(50), l.changed()).await;
        assert!(idle.is_err(), "two tells before one look are one wake-up");
        // The end: the board forgets it, the last teller goes, the follower hears it.
        let clone = teller.clone();
        board.close("j1");
        drop(teller);
        assert!(board.listen("j1").is_none());
        clone.tell();
        assert!(l.changed().await);
        drop(clone);
        assert!(!l.changed().await, "the closed channel says so");
    }
}
